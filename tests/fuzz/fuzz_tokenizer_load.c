/* fuzz_tokenizer_load.c: libFuzzer harness for tok_load (tokenizer/tokenizer.c).
 *
 * Data flow: the input is tokenizer.json's text, optionally followed by a
 * 0xFF byte and tokenizer_config.json's text (0xFF never occurs in UTF-8,
 * so the seeds' JSON never holds it; no 0xFF: no config file) -> tok_load,
 * as tok_init does with the two files. Properties:
 *   - failure: one non-empty line of valid UTF-8 in err (error lines quote
 *     strings from the file, format/quote.h);
 *   - success: every byte encodes alone to one id spelling that byte; fixed
 *     texts (ASCII, NFC UTF-8, invalid UTF-8, and text around each of the
 *     first added tokens) round-trip through tok_encode as tok_check.h
 *     describes; tok_find finds each added token by its content; eos and
 *     pad ids, when set, have pieces.
 * Built and run by `make fuzz` / `make fuzz-run` (tests/fuzz/run.sh).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/fuzz/tok_check.h"
#include "tests/fuzz/utf8.h"

static const char HARNESS[] = "fuzz_tokenizer_load";

/* Texts every loaded tokenizer must round-trip, all already in NFC. */
static const char *const TEXTS[] = {
    "Hello, world! It's 2024; don't   stop.\n\n  x",
    "na\xc3\xafve caf\xc3\xa9 \xe2\x80\x94 \xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e \xf0\x9f\x98\x80 \xea\xb0\x81\r\n\t1",
    "bad \xff\xc3( \xed\xa0\x80 bytes \xe2\x82",
    "<|im_start|>user\nhi<|im_end|>\n<think>\n\n</think>",
};

static void check_loaded(const Tokenizer *t, const char *json, size_t n) {
    Json *root = json_parse(json, n, NULL, 0);
    if (!root) tc_die(HARNESS, "tok_load accepted JSON that json_parse refuses", json, n);
    int na;
    TcAdded *a = tc_added(root, &na);
    /* every byte alone: one id that spells it (a one-byte added token or the byte's token) */
    for (int b = 0; b < 256; b++) {
        char c = (char)b;
        int ids[3], cnt = tok_encode(t, &c, 1, ids, 3);
        size_t len;
        const char *p = cnt == 1 ? tok_piece(t, ids[0], &len) : NULL;
        if (!p || len != 1 || *p != c) tc_die(HARNESS, "a single byte does not encode to its own token", &c, 1);
    }
    for (size_t i = 0; i < sizeof TEXTS / sizeof TEXTS[0]; i++)
        tc_roundtrip(HARNESS, t, a, na, TEXTS[i], strlen(TEXTS[i]));
    /* the first few added tokens inside text, and found by content */
    for (int k = 0; k < na && k < 4; k++) {
        size_t m = a[k].len;
        char *s = malloc(m + 8);
        if (!s) abort();
        memcpy(s, "ab ", 3);
        memcpy(s + 3, a[k].p, m);
        memcpy(s + 3 + m, "\xc3\xa9 z", 4);
        tc_roundtrip(HARNESS, t, a, na, s, m + 7);
        /* tok_find takes a C string: only contents without a NUL */
        if (strlen(a[k].p) == m && tok_find(t, a[k].p) != a[k].id)
            tc_die(HARNESS, "tok_find does not find an added token by its content", a[k].p, m);
        free(s);
    }
    size_t len;
    if ((t->eos_id >= 0 && !tok_piece(t, t->eos_id, &len)) || (t->pad_id >= 0 && !tok_piece(t, t->pad_id, &len)))
        tc_die(HARNESS, "eos or pad id without a piece", json, n);
    free(a);
    json_free(root);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *json = (const char *)data, *cfg = NULL;
    const uint8_t *sep = memchr(data, 0xFF, size);
    size_t n = size, cfg_n = 0;
    if (sep) {
        n = (size_t)(sep - data);
        cfg = (const char *)sep + 1;
        cfg_n = size - n - 1;
    }
    Tokenizer t;
    char err[512] = "";
    if (tok_load(&t, json, n, "tokenizer.json", cfg, cfg_n, "tokenizer_config.json", err, sizeof err) != 0) {
        if (!err[0] || strpbrk(err, "\r\n") || !fz_is_utf8(err, strlen(err))) {
            fprintf(stderr, "err: %s\n", err);
            tc_die(HARNESS, "error is not one non-empty line of UTF-8", err, strlen(err));
        }
        return 0;
    }
    check_loaded(&t, json, n);
    tok_free(&t);
    return 0;
}
