/* file.c: bounded reads of regular files (see file.h for why).
 *
 * Data flow: beside the main chain (run.c -> model -> attn -> kv ->
 * kernels): every loader (model/source.c for the JSON files,
 * format/safetensors.c for checkpoints) and run.c's -f prompts read their
 * files here. No format of its own; open(2) with O_NONBLOCK and fstat(2)
 * on the open descriptor, as POSIX defines them. */
#include "format/file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

const char *file_kind(unsigned mode) {
    if (S_ISREG(mode)) return "a regular file";
    if (S_ISDIR(mode)) return "a directory";
    if (S_ISFIFO(mode)) return "a FIFO";
    if (S_ISCHR(mode)) return "a character device";
    if (S_ISBLK(mode)) return "a block device";
    if (S_ISSOCK(mode)) return "a socket";
    return "a special file";
}

/* Sizes in error lines: "3 MiB" reads better than 3145728 for caps. */
static void human(size_t n, char *buf, size_t len) {
    if (n >= (1u << 20) && n % (1u << 20) == 0) snprintf(buf, len, "%zu MiB", n >> 20);
    else snprintf(buf, len, "%zu bytes", n);
}

int file_open_regular(const char *path, size_t max, size_t *size, char *err, size_t errlen) {
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        struct stat st;
        /* opening a socket fails with ENXIO: name what it is instead */
        if (stat(path, &st) == 0 && !S_ISREG(st.st_mode))
            snprintf(err, errlen, "%s: expected a regular file, found %s", path, file_kind(st.st_mode));
        else
            snprintf(err, errlen, "%s: cannot open: %s", path, strerror(e));
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        snprintf(err, errlen, "%s: cannot stat: %s", path, strerror(errno));
        close(fd);
        return -1;
    }
    if (!S_ISREG(st.st_mode)) {
        snprintf(err, errlen, "%s: expected a regular file, found %s", path, file_kind(st.st_mode));
        close(fd);
        return -1;
    }
    if (st.st_size < 0 || (unsigned long long)st.st_size > max) {
        char cap[32];
        human(max, cap, sizeof cap);
        snprintf(err, errlen, "%s: expected at most %s, found %lld bytes", path, cap, (long long)st.st_size);
        close(fd);
        return -1;
    }
    /* regular files never block; the flag only mattered for open() */
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    *size = (size_t)st.st_size;
    return fd;
}

/* Reads fd to its end into a NUL-terminated buffer of at most max bytes
 * (hint: the expected size, 0 when unknown). */
static char *read_fd(int fd, const char *path, size_t max, size_t hint, size_t *len, char *err, size_t errlen) {
    size_t cap = hint ? hint + 1 : 65536, n = 0;
    if (cap > max + 1) cap = max + 1;
    char *buf = malloc(cap + 1);
    if (!buf) { snprintf(err, errlen, "%s: out of memory", path); return NULL; }
    for (;;) {
        if (n == cap) {
            /* one byte past max is read to tell "exactly max" from "more" */
            if (n > max) break;
            size_t nc = cap * 2 > max + 1 ? max + 1 : cap * 2;
            char *nb = realloc(buf, nc + 1);
            if (!nb) { free(buf); snprintf(err, errlen, "%s: out of memory", path); return NULL; }
            buf = nb;
            cap = nc;
        }
        ssize_t r = read(fd, buf + n, cap - n);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            snprintf(err, errlen, "%s: read failed: %s", path, strerror(errno));
            free(buf);
            return NULL;
        }
        if (r == 0) break;
        n += (size_t)r;
    }
    if (n > max) {
        char c[32];
        human(max, c, sizeof c);
        snprintf(err, errlen, "%s: expected at most %s, found more", path, c);
        free(buf);
        return NULL;
    }
    buf[n] = 0;
    *len = n;
    return buf;
}

char *file_read(const char *path, size_t max, size_t *len, char *err, size_t errlen) {
    size_t size;
    int fd = file_open_regular(path, max, &size, err, errlen);
    if (fd < 0) return NULL;
    /* the size may change under us: read to the end, still bounded by max */
    char *buf = read_fd(fd, path, max, size, len, err, errlen);
    close(fd);
    return buf;
}

char *file_read_any(const char *path, size_t max, size_t *len, char *err, size_t errlen) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) { snprintf(err, errlen, "%s: cannot open: %s", path, strerror(errno)); return NULL; }
    struct stat st;
    if (fstat(fd, &st) == 0 && S_ISDIR(st.st_mode)) {
        snprintf(err, errlen, "%s: expected a file, found a directory", path);
        close(fd);
        return NULL;
    }
    char *buf = read_fd(fd, path, max, S_ISREG(st.st_mode) ? (size_t)st.st_size : 0, len, err, errlen);
    close(fd);
    return buf;
}
