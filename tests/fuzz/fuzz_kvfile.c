/* fuzz_kvfile.c: libFuzzer harness for kv/kvfile.c.
 *
 * Data flow: arbitrary bytes -> kvfile_parse, the checks kvfile_read runs
 * on a chat session (--session) or a spilled prefix chunk (--cache-dir)
 * read from disk, where anyone who can write the folder can put anything.
 * Half the inputs (the low bit of their last byte) have their check
 * recomputed first, as a file made by a writer with other sizes would
 * have it, so that mutations reach the size and range checks behind it.
 * Beyond "no crash, no leak, no undefined behaviour" (ASan + UBSan):
 *   - failure: one non-empty line in err naming the file, nothing handed out;
 *   - success: t0 <= t1, the parts fit max_parts, the header, tokens and
 *     parts add up to the input's size, and the tokens and parts handed
 *     out are the input's bytes at their places; spec NUL-terminated.
 * Built and run by `make fuzz` / `make fuzz-run` (tests/fuzz/run.sh).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv/kvfile.h"

#define FIXED 112 /* the header before its part sizes (kvfile.h) */

static void die(const char *what) {
    fprintf(stderr, "fuzz_kvfile: property failed: %s\n", what);
    abort();
}

/* Writes the check the header's sizes call for, when they fit the input. */
static void fix_check(uint8_t *b, size_t n) {
    uint32_t np, t0, t1;
    if (n < FIXED) return;
    memcpy(&np, b + 12, 4), memcpy(&t0, b + 88, 4), memcpy(&t1, b + 92, 4);
    if (np > KVFILE_MAX_PARTS || t1 < t0 || t1 - t0 > KVFILE_MAX_TOKENS) return;
    const size_t head = FIXED + 8 * (size_t)np, nt = (size_t)(t1 - t0) * 4;
    if (n < head + 8 + nt) return;
    uint64_t check = kv_hash64(b, head, 1);
    check = kv_hash64(b + head + 8, nt, check);
    size_t off = head + 8 + nt;
    for (uint32_t i = 0; i < np; i++) {
        uint64_t s;
        memcpy(&s, b + FIXED + 8 * i, 8);
        if (s > n - off) return;
        check = kv_hash64(b + off, (size_t)s, check);
        off += (size_t)s;
    }
    memcpy(b + head, &check, 8);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    uint8_t *b = malloc(size + 1);
    memcpy(b, data, size);
    if (size && data[size - 1] & 1) fix_check(b, size);
    for (int max = 1; max <= KVFILE_MAX_PARTS; max += KVFILE_MAX_PARTS - 1) {
        KVFileHead h;
        int *tok = (int *)1, np = -1;
        void *parts[KVFILE_MAX_PARTS];
        size_t sizes[KVFILE_MAX_PARTS];
        char err[512] = "";
        if (kvfile_parse(b, size, "f.kvc", &h, &tok, max, parts, sizes, &np, err, sizeof err)) {
            if (!err[0] || strpbrk(err, "\r\n") || strncmp(err, "f.kvc: ", 7)) die("error is not one line naming the file");
            if (tok || np) die("a refusal handed out tokens or parts");
            for (int i = 0; i < max; i++)
                if (parts[i]) die("a refusal handed out a part");
            continue;
        }
        if (h.t0 < 0 || h.t1 < h.t0 || np < 0 || np > max || memchr(h.spec, 0, sizeof h.spec) == NULL)
            die("a header out of range");
        size_t off = FIXED + 8 * (size_t)np + 8, nt = (size_t)(h.t1 - h.t0) * 4;
        if (off + nt > size || memcmp(tok, b + off, nt)) die("tokens are not the input's");
        off += nt;
        for (int i = 0; i < np; i++) {
            if (sizes[i] > size - off || memcmp(parts[i], b + off, sizes[i])) die("a part is not the input's");
            off += sizes[i];
            free(parts[i]);
        }
        if (off != size) die("the parts do not add up to the input");
        free(tok);
    }
    free(b);
    return 0;
}
