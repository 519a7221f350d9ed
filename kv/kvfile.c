/* kvfile.c: saved runs of KV positions on disk (kvfile.h draws the format). */
#include "kv/kvfile.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char MAGIC[8] = {'R', 'U', 'N', 'K', 'V', 'C', 0, 0};
/* magic, version, parts, model, spec, t0, t1, key: then part sizes and the check */
#define FIXED (8 + 4 + 4 + 8 + 64 + 4 + 4 + 16)

/* murmur3's finalizer: every input bit moves every output bit */
static uint64_t mix(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    return x ^ x >> 33;
}

uint64_t kv_hash64(const void *p, size_t n, uint64_t seed) {
    const uint8_t *b = p;
    uint64_t h = mix(seed ^ (uint64_t)n * 0x9E3779B97F4A7C15ULL), w;
    for (; n >= 8; n -= 8, b += 8) {
        memcpy(&w, b, 8);
        h = mix(h ^ w) + 0x9E3779B97F4A7C15ULL;
    }
    w = 0;
    memcpy(&w, b, n);
    return mix(h ^ w ^ (uint64_t)n << 56);
}

static uint8_t *put(uint8_t *o, const void *v, size_t n) { return (uint8_t *)memcpy(o, v, n) + n; }

/* The header without its check; returns its length. */
static size_t head_bytes(uint8_t *o, const KVFileHead *h, int n_parts, const size_t *sizes) {
    uint8_t *p = o;
    uint32_t ver = KVFILE_VERSION, np = (uint32_t)n_parts, t0 = (uint32_t)h->t0, t1 = (uint32_t)h->t1;
    char spec[64] = {0};
    snprintf(spec, sizeof spec, "%s", h->spec);
    p = put(p, MAGIC, 8), p = put(p, &ver, 4), p = put(p, &np, 4), p = put(p, &h->model, 8);
    p = put(p, spec, 64), p = put(p, &t0, 4), p = put(p, &t1, 4), p = put(p, h->key, 16);
    for (int i = 0; i < n_parts; i++) {
        uint64_t s = sizes[i];
        p = put(p, &s, 8);
    }
    return (size_t)(p - o);
}

static int write_all(int fd, const void *p, size_t n) {
    const uint8_t *b = p;
    while (n) {
        ssize_t w = write(fd, b, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        b += w, n -= (size_t)w;
    }
    return 0;
}

int kvfile_write(const char *path, const KVFileHead *h, const int *tokens, int n_parts, const void *const *parts,
                 const size_t *sizes, char *err, size_t errlen) {
    uint8_t head[FIXED + 8 * KVFILE_MAX_PARTS + 8];
    if (n_parts < 0 || n_parts > KVFILE_MAX_PARTS || h->t1 < h->t0 || h->t1 - h->t0 > KVFILE_MAX_TOKENS) {
        snprintf(err, errlen, "%s: expected at most %d parts and %d tokens, found %d and %d", path, KVFILE_MAX_PARTS,
                 KVFILE_MAX_TOKENS, n_parts, h->t1 - h->t0);
        return -1;
    }
    size_t hn = head_bytes(head, h, n_parts, sizes), nt = (size_t)(h->t1 - h->t0) * sizeof(int32_t);
    uint64_t check = kv_hash64(head, hn, 1);
    check = kv_hash64(tokens, nt, check);
    for (int i = 0; i < n_parts; i++) check = kv_hash64(parts[i], sizes[i], check);
    memcpy(head + hn, &check, 8);
    /* a name of our own beside the file: writers of the same file do not
     * meet, and rename makes the new one appear whole */
    static int seq;
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d.%d", path, (int)getpid(), __atomic_fetch_add(&seq, 1, __ATOMIC_RELAXED));
    /* 0600: a session or a prompt's chunk is its writer's to read */
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
        snprintf(err, errlen, "%s: cannot write: %s", path, strerror(errno));
        return -1;
    }
    int bad = write_all(fd, head, hn + 8) || write_all(fd, tokens, nt);
    for (int i = 0; i < n_parts && !bad; i++) bad = write_all(fd, parts[i], sizes[i]);
    int e = bad ? errno : 0;
    if (!bad && fsync(fd)) bad = 1, e = errno;
    if (close(fd) && !bad) bad = 1, e = errno;
    if (!bad && rename(tmp, path)) bad = 1, e = errno;
    if (bad) {
        unlink(tmp);
        snprintf(err, errlen, "%s: cannot write: %s (the file as it was is kept)", path, e ? strerror(e) : "short write");
        return -1;
    }
    return 0;
}

static int read_all(int fd, void *p, size_t n) {
    uint8_t *b = p;
    while (n) {
        ssize_t r = read(fd, b, n);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        b += r, n -= (size_t)r;
    }
    return 0;
}

/* Checks a whole file's bytes and copies its tokens and parts out. */
int kvfile_parse(const uint8_t *b, size_t size, const char *name, KVFileHead *h, int **tokens, int max_parts,
                 void **parts, size_t *sizes, int *n_parts, char *err, size_t errlen) {
    *tokens = NULL;
    *n_parts = 0;
    for (int i = 0; i < max_parts; i++) parts[i] = NULL;
    uint32_t ver = 0, np = 0, t0 = 0, t1 = 0;
    const char *why = NULL;
    if (size < FIXED) why = "shorter than a header";
    else if (memcmp(b, MAGIC, 8)) why = "not a saved KV cache (no RUNKVC magic)";
    if (!why) {
        memcpy(&ver, b + 8, 4), memcpy(&np, b + 12, 4);
        memcpy(&t0, b + 88, 4), memcpy(&t1, b + 92, 4);
        if (ver != KVFILE_VERSION) why = "a version this build does not read";
        else if (np > (uint32_t)max_parts || np > KVFILE_MAX_PARTS) why = "more parts than expected";
        else if (t1 < t0 || t1 - t0 > KVFILE_MAX_TOKENS || t1 > 1u << 30) why = "a token range out of bounds";
        else if (size < FIXED + 8 * (size_t)np + 8) why = "truncated in its header";
    }
    /* the sizes the header claims must add up to the file's, without overflow */
    const size_t head = FIXED + 8 * (size_t)np, nt = (size_t)(t1 - t0) * sizeof(int32_t);
    if (!why) {
        size_t total = head + 8 + nt;
        for (uint32_t i = 0; i < np && !why; i++) {
            uint64_t s;
            memcpy(&s, b + FIXED + 8 * i, 8);
            if (s > size || total + s > size) why = "truncated (its parts end past the file)";
            else sizes[i] = (size_t)s, total += (size_t)s;
        }
        if (!why && total != size) why = "of the wrong size for what its header says";
    }
    if (!why) {
        uint64_t check = kv_hash64(b, head, 1), want;
        check = kv_hash64(b + head + 8, nt, check);
        size_t off = head + 8 + nt;
        for (uint32_t i = 0; i < np; off += sizes[i++]) check = kv_hash64(b + off, sizes[i], check);
        memcpy(&want, b + head, 8);
        if (check != want) why = "damaged (its check does not match its bytes)";
    }
    int *tok = NULL;
    if (!why && !(tok = malloc(nt + 1))) why = "out of memory";
    if (!why) memcpy(tok, b + head + 8, nt);
    size_t off = head + 8 + nt;
    for (uint32_t i = 0; !why && i < np; off += sizes[i++])
        if ((parts[i] = malloc(sizes[i] + 1))) memcpy(parts[i], b + off, sizes[i]);
        else why = "out of memory";
    if (why) {
        snprintf(err, errlen, "%s: %s", name, why);
        free(tok);
        for (int i = 0; i < max_parts; i++) free(parts[i]), parts[i] = NULL;
        return -1;
    }
    memcpy(&h->model, b + 16, 8);
    memcpy(h->spec, b + 24, 64);
    h->spec[63] = 0;
    h->t0 = (int)t0, h->t1 = (int)t1;
    memcpy(h->key, b + 96, 16);
    *tokens = tok;
    *n_parts = (int)np;
    return 0;
}

int kvfile_read(const char *path, KVFileHead *h, int **tokens, int max_parts, void **parts, size_t *sizes,
                int *n_parts, char *err, size_t errlen) {
    *tokens = NULL;
    *n_parts = 0;
    for (int i = 0; i < max_parts; i++) parts[i] = NULL;
    /* O_NONBLOCK: a FIFO put where a file should be must not hang the reader */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    struct stat st;
    if (fd < 0 || fstat(fd, &st)) {
        snprintf(err, errlen, "%s: cannot read: %s", path, strerror(errno));
        if (fd >= 0) close(fd);
        return -1;
    }
    /* the whole file, then the checks on its bytes */
    const size_t size = (size_t)st.st_size;
    uint8_t *b = S_ISREG(st.st_mode) ? malloc(size + 1) : NULL;
    const int bad = !b || read_all(fd, b, size);
    close(fd);
    if (bad) {
        snprintf(err, errlen, "%s: %s", path, !S_ISREG(st.st_mode) ? "not a file" : b ? "unreadable" : "out of memory");
        free(b);
        return -1;
    }
    const int rc = kvfile_parse(b, size, path, h, tokens, max_parts, parts, sizes, n_parts, err, errlen);
    free(b);
    return rc;
}
