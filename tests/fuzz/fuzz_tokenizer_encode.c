/* fuzz_tokenizer_encode.c: libFuzzer harness for tok_encode and the
 * Unicode code under it (tokenizer/tokenizer.c, tokenizer/unicode.c).
 *
 * Data flow: the shipped model's tokenizer (models/qwen3-kjv-mtp, or the
 * directory in $FUZZ_TOKENIZER_DIR) is loaded once; each input is prompt
 * text, any bytes, -> tok_encode with cap 3n + 16 (tokenizer.h: 3n always
 * suffices). Properties:
 *   - the encode succeeds, and the ids spell the text back, part by part
 *     (tok_check.h): each added token as its own id, the text between them
 *     exactly, or as uni_nfc makes it since this tokenizer is NFC; invalid
 *     UTF-8 bytes stay as they are; the stream decoder agrees;
 *   - unicode.h's promises on the same text: uni_is_nfc_quick(s) means
 *     uni_nfc(s) == s; NFC is idempotent and grows text at most
 *     UNI_NFC_MAX_GROWTH times.
 * Built and run by `make fuzz` / `make fuzz-run` (tests/fuzz/run.sh), from
 * the repository root, or from anywhere: the default directory is found
 * next to the binary (build-fuzz/../models/qwen3-kjv-mtp).
 */
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/fuzz/tok_check.h"

static const char HARNESS[] = "fuzz_tokenizer_encode";
static Tokenizer tok;
static Json *tok_json;   /* the tokenizer.json tree the added tokens point into */
static TcAdded *added;
static int n_added;

/* The model directory: $FUZZ_TOKENIZER_DIR, else models/qwen3-kjv-mtp in the
 * repository the binary was built in (its parent directory's parent). */
static void model_dir(char *out, size_t n) {
    const char *env = getenv("FUZZ_TOKENIZER_DIR");
    if (env && *env) {
        snprintf(out, n, "%s", env);
        return;
    }
    char exe[PATH_MAX];
    ssize_t l = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (l > 0) {
        exe[l] = 0;
        for (int up = 0; up < 2; up++) {
            char *slash = strrchr(exe, '/');
            if (slash) *slash = 0;
        }
        snprintf(out, n, "%s/models/qwen3-kjv-mtp", exe);
        if (access(out, R_OK) == 0) return;
    }
    snprintf(out, n, "models/qwen3-kjv-mtp");
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    char dir[PATH_MAX + 64], path[PATH_MAX + 128], err[512];
    model_dir(dir, sizeof dir);
    if (tok_init(&tok, dir, err, sizeof err) != 0) {
        fprintf(stderr, "%s: %s (set FUZZ_TOKENIZER_DIR to a model directory)\n", HARNESS, err);
        exit(1);
    }
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    tok_json = json_parse_file(path, TOK_MAX_JSON, err, sizeof err);
    if (!tok_json) {
        fprintf(stderr, "%s: %s\n", HARNESS, err);
        exit(1);
    }
    added = tc_added(tok_json, &n_added);
    return 0;
}

/* unicode.h's promises about NFC on text[0 .. n). */
static void check_nfc(const char *text, size_t n) {
    size_t m, m2;
    char *a = uni_nfc(text, n, &m);
    if (!a) abort();
    if (m > UNI_NFC_MAX_GROWTH * n || a[m] != 0) tc_die(HARNESS, "uni_nfc grew too much or lacks its NUL", text, n);
    if (uni_is_nfc_quick(text, n) && (m != n || memcmp(a, text, n) != 0))
        tc_die(HARNESS, "uni_is_nfc_quick says NFC but uni_nfc changes the text", text, n);
    char *b = uni_nfc(a, m, &m2);
    if (!b) abort();
    if (m2 != m || memcmp(a, b, m) != 0) tc_die(HARNESS, "uni_nfc is not idempotent", text, n);
    free(a);
    free(b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *text = (const char *)data;
    check_nfc(text, size);
    tc_roundtrip(HARNESS, &tok, added, n_added, text, size);
    return 0;
}
