/* fuzz_safetensors.c: libFuzzer harness for format/safetensors.c.
 *
 * Data flow: the input is a whole .safetensors file. It is written to a
 * memory file (memfd_create) and opened by path, /proc/self/fd/N, with
 * st_open_file, the same path model loading takes per checkpoint file, then
 * moved into anonymous memory (st_to_memory) as model_load does.
 * Properties checked, from safetensors.h, against the input bytes and the
 * header as this harness reads it itself (json_parse, fuzzed on its own by
 * fuzz_json.c):
 *   - failure: one non-empty line in err;
 *   - success: each tensor's dtype is known and nbytes == product(shape) x
 *     the dtype's size; its data is the data section's bytes at the
 *     header's data_offsets: either in place in the file's bytes, or, when
 *     those are not aligned to the element size, in one of the store's
 *     copies, which are aligned; st_find finds every tensor by its name;
 *     the tensors' byte ranges never overlap and tile the data section
 *     (sum of sizes == its size); the same after st_to_memory;
 *     st_metadata gives each "__metadata__" string (the last, for a key
 *     listed twice);
 *   - st_write of the opened store, with that metadata, to a scratch
 *     directory: refused (one line) exactly when a value is not UTF-8,
 *     else a file st_open_file takes back with the same tensors (dtype,
 *     shape, bytes), none of them needing an aligned copy, and the same
 *     metadata plus "format": "pt".
 * Built and run by `make fuzz` / `make fuzz-run` (tests/fuzz/run.sh).
 */
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "format/json.h"
#include "format/safetensors.h"
#include "tests/fuzz/utf8.h"

static int memfd = -1;
static char memfd_path[64];
static char out_dir[PATH_MAX]; /* st_write's scratch directory (it writes path.tmp, then renames) */
static char out_path[PATH_MAX + 32];

/* The element sizes of the format's dtypes (safetensors' Dtype enum). */
static size_t dtype_size(const char *dt) {
    static const struct { const char *name; size_t size; } table[] = {
        {"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8}, {"I32", 4}, {"I16", 2}, {"I8", 1},
        {"U64", 8}, {"U32", 4}, {"U16", 2}, {"U8", 1}, {"BOOL", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1},
    };
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
        if (strcmp(table[i].name, dt) == 0) return table[i].size;
    return 0;
}

static void die(const char *what, const char *name) {
    fprintf(stderr, "fuzz_safetensors: property failed: %s (at %s)\n", what, name ? name : "-");
    abort();
}

static void remove_out_dir(void) {
    unlink(out_path);
    rmdir(out_dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    memfd = memfd_create("fuzz.safetensors", 0);
    if (memfd < 0) {
        perror("memfd_create");
        exit(1);
    }
    snprintf(memfd_path, sizeof memfd_path, "/proc/self/fd/%d", memfd);
    /* $TMPDIR (run.sh points it at its scratch directory, which it deletes
     * even after a crash skipped atexit), else memory-backed /dev/shm: one
     * file is written per input */
    const char *base = getenv("TMPDIR");
    if (!base || !*base) base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    if ((size_t)snprintf(out_dir, sizeof out_dir, "%s/fuzz_safetensors.XXXXXX", base) >= sizeof out_dir ||
        !mkdtemp(out_dir)) {
        perror("mkdtemp");
        exit(1);
    }
    snprintf(out_path, sizeof out_path, "%s/out.safetensors", out_dir);
    atexit(remove_out_dir);
    return 0;
}

/* A tensor's [begin, end) in the data section, from the header. */
typedef struct { size_t begin, end; } Range;

static int cmp_range(const void *a, const void *b) {
    const Range *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin;
}

/* Checks every tensor of ts against the header h of the file in
 * data[0 .. size), whose data section starts at byte off. */
static void check_store(const TensorStore *ts, const Json *h, const uint8_t *data, size_t size, size_t off) {
    if (ts->n_files != 1) die("expected one file", NULL);
    const uint8_t *map = ts->files[0].map;
    if (ts->files[0].size != size || memcmp(map, data, size) != 0) die("the file's bytes differ from the input", NULL);
    int n_entries = 0;
    for (size_t i = 0; i < h->len; i++) n_entries += strcmp(h->keys[i], "__metadata__") != 0;
    if (ts->n_tensors != n_entries) die("tensor count differs from the header's entries", NULL);
    Range *r = malloc(((size_t)ts->n_tensors + 1) * sizeof *r);
    if (!r) abort();
    size_t total = 0;
    for (int i = 0; i < ts->n_tensors; i++) {
        const STensor *t = &ts->tensors[i];
        size_t es = dtype_size(t->dtype);
        if (!es) die("unknown dtype accepted", t->name);
        if (t->file != 0 || t->ndim < 0 || t->ndim > ST_MAX_DIMS) die("file or ndim out of range", t->name);
        /* an accepted shape's product fits the file, so overflow here is a failure too */
        size_t nb = es;
        for (int d = 0; d < t->ndim; d++)
            if (t->shape[d] < 0 || __builtin_mul_overflow(nb, (size_t)t->shape[d], &nb))
                die("dim negative or shape overflowing", t->name);
        if (nb != t->nbytes) die("nbytes != product(shape) * dtype size", t->name);
        if (st_find(ts, t->name) != t) die("st_find does not find the tensor by its name", t->name);
        const Json *e = json_get(h, t->name);
        const Json *offs = json_get(e, "data_offsets");
        if (!offs || json_at(offs, 0) == NULL || json_at(offs, 1) == NULL) die("tensor not in the header", t->name);
        size_t b = (size_t)json_at(offs, 0)->number, en = (size_t)json_at(offs, 1)->number;
        if (en - b != t->nbytes || en > size - off) die("nbytes disagrees with data_offsets", t->name);
        r[i] = (Range){b, en};
        total += t->nbytes;
        /* where the bytes are: in place, or in one aligned copy */
        const uint8_t *p = t->data, *want = data + off + b;
        if (t->nbytes && (uintptr_t)p % es != 0) die("data not aligned to the element size", t->name);
        int in_copy = 0;
        for (int c = 0; c < ts->n_copies; c++) in_copy |= p == ts->copies[c];
        int in_file = p >= map + off && p <= map + size && (size_t)(map + size - p) >= t->nbytes;
        int in_mem = st_in_copy(ts, p, t->nbytes);
        if (!in_copy && !in_file && !in_mem) die("data outside the data section and the copies", t->name);
        if (in_file && p != map + off + b) die("data not at its data_offsets", t->name);
        if (memcmp(p, want, t->nbytes) != 0) die("data differs from the file's bytes at data_offsets", t->name);
    }
    /* sorted by begin, each range starts where the one before ended */
    qsort(r, (size_t)ts->n_tensors, sizeof *r, cmp_range);
    for (int i = 1; i < ts->n_tensors; i++)
        if (r[i].begin < r[i - 1].end) die("two tensors overlap", NULL);
    if (total != size - off) die("tensors do not cover the data section", NULL);
    if (st_find(ts, "__metadata__") != NULL) die("__metadata__ found as a tensor", NULL);
    free(r);
}

/* The header's metadata a caller can pass to st_write: entries whose key
 * is a C string (no NUL inside), other than "format", which st_write
 * writes itself. Fills keys/vals/lens (room for m->len); returns the count. */
static int meta_entries(const Json *m, const char **keys, const char **vals, size_t *lens) {
    int n = 0;
    for (size_t i = 0; m && i < m->len; i++) {
        if (strlen(m->keys[i]) != m->key_lens[i] || strcmp(m->keys[i], "format") == 0) continue;
        keys[n] = m->keys[i], vals[n] = m->items[i].str, lens[n] = m->items[i].len;
        n++;
    }
    return n;
}

/* st_metadata(ts, keys[i]) is the value of the last entry with that key. */
static void check_meta(const TensorStore *ts, const char **keys, const char **vals, const size_t *lens, int n) {
    for (int i = 0; i < n; i++) {
        int last = n - 1;
        while (strcmp(keys[last], keys[i]) != 0) last--;
        size_t len = 0;
        const char *v = st_metadata(ts, keys[i], &len);
        if (!v || len != lens[last] || memcmp(v, vals[last], len) != 0 || v[len] != 0)
            die("st_metadata does not give the header's value", keys[i]);
    }
}

/* st_write's round trip (see the top). */
static void check_write(const TensorStore *ts, const char **keys, const char **vals, const size_t *lens, int n) {
    char err[512] = "";
    int utf8 = 1;
    for (int i = 0; i < n; i++) utf8 &= fz_is_utf8(vals[i], lens[i]);
    int rc = st_write(out_path, ts, keys, vals, lens, n, err, sizeof err);
    if (!utf8 || rc != 0) {
        const char *why = utf8 ? "st_write failed"
                          : rc == 0 ? "st_write took a value that is not UTF-8"
                          : !err[0] || strpbrk(err, "\r\n") ? "st_write's error is not one non-empty line"
                          : NULL;
        if (why) {
            fprintf(stderr, "err: %s\n", err);
            die(why, NULL);
        }
        return;
    }
    TensorStore w;
    if (st_open_file(&w, out_path, err, sizeof err) != 0) {
        fprintf(stderr, "err: %s\n", err);
        die("st_open_file refuses what st_write wrote", NULL);
    }
    if (w.n_tensors != ts->n_tensors) die("st_write changed the tensor count", NULL);
    if (w.n_copies != 0) die("st_write left a tensor unaligned to its element size", NULL);
    for (int i = 0; i < ts->n_tensors; i++) {
        const STensor *t = &ts->tensors[i], *u = st_find(&w, t->name);
        if (!u || strcmp(u->dtype, t->dtype) != 0 || u->ndim != t->ndim || u->nbytes != t->nbytes ||
            memcmp(u->shape, t->shape, (size_t)t->ndim * sizeof *t->shape) != 0 ||
            memcmp(u->data, t->data, t->nbytes) != 0)
            die("st_write changed a tensor", t->name);
    }
    size_t len = 0;
    const char *fmt = st_metadata(&w, "format", &len);
    if (!fmt || len != 2 || memcmp(fmt, "pt", 2) != 0) die("st_write's file lacks format: pt", NULL);
    check_meta(&w, keys, vals, lens, n);
    st_close(&w);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (ftruncate(memfd, 0) != 0 || pwrite(memfd, data, size, 0) != (ssize_t)size) abort();
    TensorStore ts;
    char err[512] = "";
    if (st_open_file(&ts, memfd_path, err, sizeof err) != 0) {
        if (!err[0] || strpbrk(err, "\r\n")) {
            fprintf(stderr, "err: %s\n", err);
            die("error is not one non-empty line", NULL);
        }
        return 0;
    }
    /* the header as this harness reads it: u64 length, then JSON */
    if (size < 8) die("opened a file shorter than its header length", NULL);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | data[i];
    if (hlen > size - 8) die("opened a file whose header length exceeds it", NULL);
    Json *h = json_parse((const char *)data + 8, (size_t)hlen, NULL, 0);
    if (!h || h->type != JSON_OBJECT) die("opened a file whose header is not a JSON object", NULL);
    check_store(&ts, h, data, size, 8 + (size_t)hlen);
    /* the same tensors after the copy into anonymous memory */
    st_to_memory(&ts);
    check_store(&ts, h, data, size, 8 + (size_t)hlen);
    if (st_copies_writable(&ts, 1) != 0 || st_copies_writable(&ts, 0) != 0) die("st_copies_writable failed", NULL);
    const Json *m = json_get(h, "__metadata__");
    size_t nm = m ? m->len : 0;
    const char **keys = malloc((nm + 1) * sizeof *keys), **vals = malloc((nm + 1) * sizeof *vals);
    size_t *lens = malloc((nm + 1) * sizeof *lens);
    if (!keys || !vals || !lens) abort();
    int n = meta_entries(m, keys, vals, lens);
    check_meta(&ts, keys, vals, lens, n);
    check_write(&ts, keys, vals, lens, n);
    free(keys), free(vals), free(lens);
    json_free(h);
    st_close(&ts);
    return 0;
}
