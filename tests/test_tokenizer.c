/* test_tokenizer.c: Criterion tests for tokenizer/ (BPE, Unicode tables, NFC, chat).
 *
 * Ground truth: tests/data/tokenizer/cases_*.json (ids from @lenml/tokenizers,
 * a port of Hugging Face tokenizers, with the full Qwen3 tokenizer and with the
 * fixtures' reduced 4096-token one), the golden prompts' token ids, and, when
 * the system has it, the Unicode NormalizationTest.txt. Hostile tokenizer.json
 * files are written to temp dirs. Run from the repo root (paths are relative).
 */
#define _POSIX_C_SOURCE 200809L

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "format/json.h"
#include "tokenizer/chat.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

#define DATA "tests/data/tokenizer"

static const char QWEN2_REGEX[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
    "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

/* Monotonic clock in milliseconds, for the logged timings. */
static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

/* Whole file as a malloc'd, NUL-terminated buffer of *len bytes. */
static char *read_all(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "cannot open %s", path);
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    for (size_t r; (r = fread(buf + n, 1, cap - n, f)) > 0;) {
        n += r;
        if (n == cap) buf = realloc(buf, cap *= 2);
    }
    fclose(f);
    buf[n] = 0;
    *len = n;
    return buf;
}

/* Writes text to dir/name, for hand-made tokenizer files. */
static void write_file(const char *dir, const char *name, const char *text) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f);
    fputs(text, f);
    fclose(f);
}

/* Removes a temp dir made by load_full / init_spec, with the files they write. */
static void remove_dir(const char *dir) {
    const char *names[] = {"tokenizer.json", "tokenizer_config.json"};
    char path[512];
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        remove(path);
    }
    rmdir(dir);
}

/* Gunzips the committed full Qwen3 tokenizer into a temp dir and loads it;
 * returns the tok_init time in ms (the gunzip is not counted). */
static double load_full(Tokenizer *t) {
    char dir[] = "/tmp/run_tok_full_XXXXXX", cmd[512], err[512];
    cr_assert_not_null(mkdtemp(dir));
    snprintf(cmd, sizeof cmd, "gzip -dc " DATA "/full/tokenizer.json.gz > %s/tokenizer.json && cp " DATA
             "/full/tokenizer_config.json %s/", dir, dir);
    cr_assert_eq(system(cmd), 0, "cannot unpack the full tokenizer");
    double t0 = now_ms();
    int rc = tok_init(t, dir, err, sizeof err);
    double ms = now_ms() - t0;
    remove_dir(dir);
    cr_assert_eq(rc, 0, "%s", err);
    return ms;
}

/* The fixtures' tokenizer: 4096 tokens + 26 added ones at 4096 .. 4121. */
static void load_reduced(Tokenizer *t) {
    char err[512];
    cr_assert_eq(tok_init(t, DATA "/reduced", err, sizeof err), 0, "%s", err);
}

/* Concatenated pieces of ids[0 .. n) as a malloc'd string of *len bytes. */
static char *decode_all(const Tokenizer *t, const int *ids, int n, size_t *len) {
    size_t cap = 16, o = 0;
    char *out = malloc(cap);
    for (int i = 0; i < n; i++) {
        size_t l;
        const char *p = tok_piece(t, ids[i], &l);
        cr_assert_not_null(p, "id %d has no piece", ids[i]);
        while (o + l + 1 > cap) out = realloc(out, cap *= 2);
        memcpy(out + o, p, l);
        o += l;
    }
    out[o] = 0;
    *len = o;
    return out;
}

/* Encodes every case of a cases_*.json and compares with its "lenml" ids;
 * also checks decode(encode(text)) == NFC(text). Returns the number that match. */
static int check_cases(const Tokenizer *t, const char *path) {
    char err[256];
    Json *root = json_parse_file(path, 1u << 30, err, sizeof err);
    cr_assert_not_null(root, "%s", err);
    const Json *cases = json_get(root, "cases");
    cr_assert(cases && cases->type == JSON_ARRAY);
    int good = 0;
    for (size_t i = 0; i < cases->len; i++) {
        const Json *c = json_at(cases, i), *text = json_get(c, "text"), *want = json_get(c, "lenml");
        const char *name = json_get_str(c, "name");
        int cap = (int)(3 * text->len + 1), *ids = malloc(sizeof(int) * (size_t)cap);
        int n = tok_encode(t, text->str, text->len, ids, cap);
        int same = n == (int)want->len;
        for (int k = 0; same && k < n; k++) same = ids[k] == (int)json_at(want, (size_t)k)->number;
        if (same) good++;
        else cr_log_error("%s: case %s: got %d ids, want %zu", path, name, n, want->len);

        size_t dl, nl;
        char *dec = decode_all(t, ids, n, &dl), *nfc = uni_nfc(text->str, text->len, &nl);
        cr_expect(dl == nl && memcmp(dec, nfc, nl) == 0, "%s: case %s does not round-trip", path, name);
        free(dec);
        free(nfc);
        free(ids);
    }
    int total = (int)cases->len;
    json_free(root);
    cr_log_info("%s: %d/%d cases match", path, good, total);
    return good;
}

/* ------------------------------------------------------------ exact ids */

Test(tok_full, lenml_cases_and_load_time) {
    Tokenizer t;
    double ms = load_full(&t);
    /* timing is reported, never asserted (the suite also runs under ASan) */
    cr_log_info("full Qwen3 tokenizer (151,669 tokens): tok_init %.1f ms", ms);
    cr_assert_eq(tok_vocab_size(&t), 151669);
    cr_assert_eq(check_cases(&t, DATA "/cases_full.json"), 26);
    tok_free(&t);
}

Test(tok_reduced, lenml_cases) {
    Tokenizer t;
    load_reduced(&t);
    cr_assert_eq(tok_vocab_size(&t), 4122);
    cr_assert_eq(check_cases(&t, DATA "/cases_reduced4096.json"), 26);
    tok_free(&t);
}

Test(tok_reduced, golden_prompts) {
    Tokenizer t;
    load_reduced(&t);
    const char *names[] = {"hello", "sentence", "paragraph"};
    for (int p = 0; p < 3; p++) {
        char path[256];
        size_t n, tn;
        snprintf(path, sizeof path, DATA "/prompts/%s.txt", names[p]);
        char *text = read_all(path, &n);
        snprintf(path, sizeof path, DATA "/prompts/%s.tokens.txt", names[p]);
        char *tokens = read_all(path, &tn);
        /* tokens.txt: one line of space-separated ids */
        int ids[4096], n_ids = tok_encode(&t, text, n, ids, 4096), k = 0;
        char *s = tokens, *end;
        for (long v; (v = strtol(s, &end, 10)), end != s; s = end, k++) {
            cr_assert_lt(k, n_ids, "%s: fewer ids than tokens.txt", names[p]);
            cr_assert_eq(ids[k], v, "%s: id %d: got %d want %ld", names[p], k, ids[k], v);
        }
        cr_assert_eq(k, n_ids, "%s: %d ids, tokens.txt has %d", names[p], n_ids, k);
        free(text);
        free(tokens);
    }
    tok_free(&t);
}

/* Pre-tokenizer edge cases, checked through the full vocab: each expected
 * piece is a tokenizer.json key, so the ids spell out where the regex split. */
Test(tok_full, pretokenizer_splits) {
    Tokenizer t;
    load_full(&t);
    static const struct { const char *text, *pieces[6]; } cases[] = {
        {"a   b", {"a", "ĠĠ", "Ġb"}},               /* \s+(?!\S) leaves one space for " b" */
        {"a   ", {"a", "ĠĠĠ"}},                     /* at the end it takes all of them */
        {"a \n b", {"a", "ĠĊ", "Ġb"}},               /* \s*[\r\n]+ stops after the newline */
        {"2025", {"2", "0", "2", "5"}},             /* one digit per pre-token */
        {"x!!\n\ny", {"x", "!!ĊĊ", "y"}},           /* punctuation run takes trailing newlines */
        {"you'RE", {"you", "'RE"}},                 /* case-insensitive contraction */
        {"\tx", {"ĉx"}},                            /* any non-letter may lead a word */
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int ids[16], n = tok_encode(&t, cases[c].text, strlen(cases[c].text), ids, 16), k = 0;
        for (; k < 6 && cases[c].pieces[k]; k++) {
            int want = tok_find(&t, cases[c].pieces[k]);
            cr_assert_geq(want, 0, "no token %s", cases[c].pieces[k]);
            cr_assert_lt(k, n, "%s: too few ids", cases[c].text);
            cr_assert_eq(ids[k], want, "%s: id %d is %d, want %s = %d", cases[c].text, k, ids[k], cases[c].pieces[k],
                         want);
        }
        cr_assert_eq(n, k, "%s: %d ids, want %d", cases[c].text, n, k);
    }
    tok_free(&t);
}

Test(tok_full, lookups_and_config) {
    Tokenizer t;
    load_full(&t);
    cr_assert_eq(tok_find(&t, "<|endoftext|>"), 151643);
    cr_assert_eq(tok_find(&t, "<|im_start|>"), 151644);
    cr_assert_eq(tok_find(&t, "<|im_end|>"), 151645);
    cr_assert_eq(tok_find(&t, "<think>"), 151667);
    cr_assert_eq(tok_find(&t, "</think>"), 151668);
    cr_assert_eq(tok_find(&t, "Ġ"), 220);
    cr_assert_eq(tok_find(&t, "no such token at all"), -1);
    cr_assert_eq(t.eos_id, 151645);
    cr_assert_eq(t.pad_id, 151643);
    size_t len;
    const char *p = tok_piece(&t, 220, &len);
    cr_assert(p && len == 1 && p[0] == ' ');
    p = tok_piece(&t, 151667, &len);
    cr_assert(p && len == 7 && !memcmp(p, "<think>", 7));
    cr_assert_null(tok_piece(&t, 151669, &len));
    cr_assert_null(tok_piece(&t, -1, &len));
    cr_assert_geq(tok_max_piece(&t), 16);
    tok_free(&t);
}

/* Reports encode throughput on ~2 MiB of English prose with numbers. */
Test(tok_full, encode_speed) {
    Tokenizer t;
    load_full(&t);
    size_t n;
    char *para = read_all(DATA "/prompts/paragraph.txt", &n);
    size_t total = 2u << 20, o = 0;
    char *text = malloc(total + n);
    while (o < total) {
        memcpy(text + o, para, n);
        o += n;
    }
    int *ids = malloc(sizeof(int) * o);
    double t0 = now_ms();
    int count = tok_encode(&t, text, o, ids, (int)o);
    double ms = now_ms() - t0;
    cr_assert_gt(count, 0);
    cr_log_info("encode: %zu bytes -> %d ids in %.1f ms (%.1f MB/s)", o, count, ms, o / ms / 1e3);
    free(ids);
    free(text);
    free(para);
    tok_free(&t);
}

/* ------------------------------------------------------- robustness */

/* cap is honoured exactly: enough room works, one id short fails. */
Test(tok_reduced, cap_and_empty) {
    Tokenizer t;
    load_reduced(&t);
    int ids[8];
    cr_assert_eq(tok_encode(&t, "", 0, ids, 0), 0);
    cr_assert_eq(tok_encode(&t, "Hello", 5, ids, 3), 3);
    cr_assert_eq(tok_encode(&t, "Hello", 5, ids, 2), -1);
    tok_free(&t);
}

/* Random bytes (invalid UTF-8, combining marks, CJK, emoji) never crash and
 * decode back to their NFC form, byte for byte. */
Test(tok_reduced, random_bytes_round_trip) {
    Tokenizer t;
    load_reduced(&t);
    static const char *atoms[] = {
        "a", "Z", " ", "  ", "\n", "\r\n", "\t", "'s", "'LL", "7", "!", "e", "\xCC\x81", "\xCC\xA3",
        "\xEA\xB0\x80", "\xE1\x84\x80", "\xE1\x85\xA1", "\xE6\x97\xA5", "\xF0\x9F\x98\x80", "\xC3\xA9",
        "\xFF", "\x80", "\xC3", "\xE2\x82", "\xED\xA0\x80", "\xF4\x90\x80\x80", "\xC2\xA0", "\xE3\x80\x80",
        "\xC5\xBF", "\0",
    };
    /* 3000 strings of up to 39 atoms (<= 4 bytes each), fixed seed */
    srand(12345);
    char text[256];
    int ids[1024];
    for (int iter = 0; iter < 3000; iter++) {
        size_t n = 0;
        for (int k = rand() % 40; k > 0; k--) {
            const char *a = atoms[rand() % (int)(sizeof atoms / sizeof atoms[0])];
            size_t l = a[0] ? strlen(a) : 1;
            memcpy(text + n, a, l);
            n += l;
        }
        int count = tok_encode(&t, text, n, ids, 1024);
        cr_assert_geq(count, 0);
        size_t dl, nl;
        char *dec = decode_all(&t, ids, count, &dl), *nfc = uni_nfc(text, n, &nl);
        cr_assert(dl == nl && memcmp(dec, nfc, nl) == 0, "iteration %d does not round-trip", iter);
        free(dec);
        free(nfc);
    }
    tok_free(&t);
}

/* Inputs that would be quadratic in a naive BPE or NFC must stay fast. */
Test(tok_reduced, long_runs, .timeout = 60) {
    Tokenizer t;
    load_reduced(&t);
    size_t n = 1 << 20;
    char *text = malloc(n);
    int *ids = malloc(sizeof(int) * 3 * n);
    const char *fills[] = {" ", "=", "a"};
    /* one pre-token of 1 MiB each (spaces at the end of text, a punctuation
     * run, a letter run): BPE must be O(n log n) on them */
    for (int f = 0; f < 3; f++) {
        memset(text, fills[f][0], n);
        double t0 = now_ms();
        int count = tok_encode(&t, text, n, ids, (int)(3 * n));
        cr_assert_gt(count, 0);
        cr_log_info("1 MiB of '%s': %d ids in %.0f ms", fills[f], count, now_ms() - t0);
    }
    /* a starter then 300k combining marks in alternating classes 230 / 220 */
    text[0] = 'a';
    size_t o = 1;
    while (o + 4 <= n) {
        memcpy(text + o, "\xCC\x81\xCC\xA3", 4);
        o += 4;
    }
    int count = tok_encode(&t, text, o, ids, (int)(3 * n));
    cr_assert_gt(count, 0);
    free(text);
    free(ids);
    tok_free(&t);
}

/* ------------------------------------------------------------- stream */

/* 1 when s[0 .. n) is whole, valid UTF-8 characters. */
static int whole_utf8(const char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        i += uni_decode((const unsigned char *)s + i, n - i, &cp);
        if (cp >= UNI_RAW_BYTE) return 0;
    }
    return 1;
}

Test(tok_stream, never_splits_characters) {
    Tokenizer t;
    load_reduced(&t);
    const char *text = "日本語 😀👍🏽🇯🇵 café Привет 안녕";
    int ids[256], n = tok_encode(&t, text, strlen(text), ids, 256);
    cr_assert_gt(n, 0);
    /* whole tokens from the encoder: every chunk printed is whole characters */
    TokStream s = {0};
    char out[1024], buf[256];
    size_t o = 0;
    for (int i = 0; i < n; i++) {
        size_t w = tok_stream_put(&t, &s, ids[i], buf, sizeof buf);
        cr_assert(whole_utf8(buf, w), "token %d emitted part of a character", i);
        memcpy(out + o, buf, w);
        o += w;
    }
    cr_assert_eq(tok_stream_flush(&s, buf, sizeof buf), 0);
    cr_assert(o == strlen(text) && !memcmp(out, text, o));

    /* byte symbols one at a time: nothing until the character is complete */
    const unsigned char emoji[] = {0xF0, 0x9F, 0x98, 0x80};
    for (int k = 0; k < 4; k++) {
        size_t w = tok_stream_put(&t, &s, t.byte_id[emoji[k]], buf, sizeof buf);
        cr_assert_eq(w, k < 3 ? 0u : 4u);
    }
    cr_assert(!memcmp(buf, emoji, 4));
    tok_free(&t);
}

Test(tok_stream, invalid_bytes_and_flush) {
    Tokenizer t;
    load_reduced(&t);
    TokStream s = {0};
    char buf[64];
    /* a lead byte followed by a non-continuation byte can never complete: both pass */
    cr_assert_eq(tok_stream_put(&t, &s, t.byte_id[0xE4], buf, sizeof buf), 0);
    cr_assert_eq(tok_stream_put(&t, &s, t.byte_id['a'], buf, sizeof buf), 2);
    cr_assert(!memcmp(buf, "\xE4" "a", 2));
    /* bytes that cannot start a character go straight out */
    cr_assert_eq(tok_stream_put(&t, &s, t.byte_id[0xFF], buf, sizeof buf), 1);
    cr_assert_eq(tok_stream_put(&t, &s, t.byte_id[0xE0], buf, sizeof buf), 0);
    cr_assert_eq(tok_stream_put(&t, &s, t.byte_id[0x80], buf, sizeof buf), 2); /* E0 80 is an overlong start */
    /* an unfinished character at the end comes out of flush as is */
    cr_assert_eq(tok_stream_put(&t, &s, t.byte_id[0xF0], buf, sizeof buf), 0);
    cr_assert_eq(tok_stream_put(&t, &s, t.byte_id[0x9F], buf, sizeof buf), 0);
    cr_assert_eq(tok_stream_flush(&s, buf, 1), (size_t)-1);
    cr_assert_eq(tok_stream_flush(&s, buf, sizeof buf), 2);
    cr_assert(!memcmp(buf, "\xF0\x9F", 2));
    /* no room: nothing written, state kept; unknown ids write nothing */
    int hello = tok_find(&t, "Ġthe"); /* 4 bytes */
    cr_assert_geq(hello, 0);
    cr_assert_eq(tok_stream_put(&t, &s, hello, buf, 2), (size_t)-1);
    cr_assert_eq(s.npend, 0);
    cr_assert_eq(tok_stream_put(&t, &s, 999999, buf, sizeof buf), 0);
    cr_assert_eq(tok_stream_put(&t, &s, tok_find(&t, "<|im_end|>"), buf, sizeof buf), 10);
    tok_free(&t);
}

/* ------------------------------------------------ hand-made tokenizers */

/* UTF-8 of the GPT-2 byte-level character for byte b, JSON-escaped. */
static const char *bl_json(unsigned b, char *out) {
    unsigned cp = b;
    if (!((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b != 0xAD)))
        cp = 256 + (b <= 0x20 ? b : b <= 0xA0 ? 33 + b - 0x7F : 67);
    if (cp == '"' || cp == '\\') sprintf(out, "\\%c", cp);
    else if (cp < 0x80) sprintf(out, "%c", cp);
    else sprintf(out, "%c%c", 0xC0 | (cp >> 6), 0x80 | (cp & 0x3F));
    return out;
}

/* A tokenizer.json to write: NULL fields take the default of a small valid
 * one (256 byte symbols, "ab" = 256, "abc" = 257, merges "a b" and ["ab", "c"],
 * added tokens <|x|> = 258 and <|x|>y = 259); "" leaves the member out. */
typedef struct {
    const char *raw;         /* the whole file instead */
    const char *vocab_extra; /* appended inside model.vocab */
    const char *merges;      /* the model.merges value */
    const char *added;       /* the added_tokens value */
    const char *normalizer;  /* the normalizer value */
    const char *regex;       /* the Split pattern, unescaped */
    const char *model_type;  /* the model.type value */
    int drop_byte;           /* byte + 1 whose symbol is left out, 0 for none */
    const char *config;      /* tokenizer_config.json text, NULL for no file */
} Spec;

/* Renders s as tokenizer.json (and tokenizer_config.json) in dir. */
static void write_spec(const char *dir, const Spec *s) {
    if (s->config) write_file(dir, "tokenizer_config.json", s->config);
    if (s->raw) { write_file(dir, "tokenizer.json", s->raw); return; }
    size_t cap = 1 << 16, o = 0;
    char *j = malloc(cap), b[8];
    /* the regex goes into a JSON string: escape backslashes and quotes */
    const char *re = s->regex ? s->regex : QWEN2_REGEX;
    char esc[512];
    size_t e = 0;
    for (; *re; re++) {
        if (*re == '\\' || *re == '"') esc[e++] = '\\';
        esc[e++] = *re;
    }
    esc[e] = 0;
    o += (size_t)snprintf(j + o, cap - o,
                          "{\"version\": \"1.0\", \"added_tokens\": %s, \"normalizer\": %s,\n"
                          "\"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", "
                          "\"pattern\": {\"Regex\": \"%s\"}, \"behavior\": \"Isolated\", \"invert\": false}, "
                          "{\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": false}]},\n"
                          "\"model\": {\"type\": %s, \"vocab\": {",
                          s->added ? s->added
                                   : "[{\"id\": 258, \"content\": \"<|x|>\", \"special\": true}, "
                                     "{\"id\": 259, \"content\": \"<|x|>y\", \"special\": false}]",
                          s->normalizer ? s->normalizer : "{\"type\": \"NFC\"}", esc,
                          s->model_type ? s->model_type : "\"BPE\"");
    /* the 256 byte symbols first (ids 0 .. 255), comma-separated */
    for (unsigned i = 0; i < 256; i++)
        if (i + 1 != (unsigned)s->drop_byte)
            o += (size_t)snprintf(j + o, cap - o, "%s\"%s\": %u", o && j[o - 1] == '{' ? "" : ", ", bl_json(i, b), i);
    o += (size_t)snprintf(j + o, cap - o, "%s}", s->vocab_extra ? s->vocab_extra : ", \"ab\": 256, \"abc\": 257");
    const char *merges = s->merges ? s->merges : "[\"a b\", [\"ab\", \"c\"]]";
    if (*merges) o += (size_t)snprintf(j + o, cap - o, ", \"merges\": %s", merges);
    snprintf(j + o, cap - o, "}}\n");
    write_file(dir, "tokenizer.json", j);
    free(j);
}

/* Writes spec to a temp dir and runs tok_init; returns its result, err filled. */
static int init_spec(Tokenizer *t, const Spec *s, char *err, size_t errlen) {
    char dir[] = "/tmp/run_tok_spec_XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    write_spec(dir, s);
    int rc = tok_init(t, dir, err, errlen);
    remove_dir(dir);
    return rc;
}

Test(tok_small, valid_hand_made) {
    Tokenizer t;
    char err[512];
    Spec s = {.config = "{\"eos_token\": {\"content\": \"<|x|>\"}, \"pad_token\": null}"};
    cr_assert_eq(init_spec(&t, &s, err, sizeof err), 0, "%s", err);
    cr_assert_eq(tok_vocab_size(&t), 260);
    cr_assert_eq(t.eos_id, 258);
    cr_assert_eq(t.pad_id, -1);
    int ids[16];
    cr_assert_eq(tok_encode(&t, "abcab", 5, ids, 16), 2);
    cr_assert(ids[0] == 257 && ids[1] == 256);
    /* leftmost, then longest added token; text around them is split apart */
    const char *x = "ab<|x|>yab<|x|>";
    cr_assert_eq(tok_encode(&t, x, strlen(x), ids, 16), 4);
    cr_assert(ids[0] == 256 && ids[1] == 259 && ids[2] == 256 && ids[3] == 258);
    cr_assert_eq(tok_find(&t, "<|x|>"), 258);
    cr_assert_eq(tok_find(&t, "ab"), 256);
    cr_assert_eq(tok_find(&t, "Ġ"), ' ');
    cr_assert_eq(tok_find(&t, "zz"), -1);
    tok_free(&t);
}

/* ignore_merges: a pre-token found whole in the vocab skips BPE ("bc" has no merge). */
Test(tok_small, ignore_merges) {
    Tokenizer t;
    char err[512];
    int ids[8];
    Spec s = {.vocab_extra = ", \"ab\": 256, \"abc\": 257, \"bc\": 260"};
    cr_assert_eq(init_spec(&t, &s, err, sizeof err), 0, "%s", err);
    cr_assert_eq(tok_encode(&t, "bc", 2, ids, 8), 2);
    tok_free(&t);
    s.model_type = "\"BPE\", \"ignore_merges\": true";
    cr_assert_eq(init_spec(&t, &s, err, sizeof err), 0, "%s", err);
    cr_assert_eq(tok_encode(&t, "bc", 2, ids, 8), 1);
    cr_assert_eq(ids[0], 260);
    tok_free(&t);
}

/* Each broken file must fail with one line naming the file, the field, what
 * was expected and what was found; never crash (run the suite under ASan). */
Test(tok_small, hostile_files) {
    static char deep[20001];
    memset(deep, '[', 20000);
    static const struct { Spec spec; const char *expect;
    } cases[] = {
        {{.raw = "{\"model\": {\"vocab\": {"}, "malformed JSON"},
        {{.raw = ""}, "malformed JSON"},
        {{.raw = deep}, "malformed JSON"},
        {{.raw = "[]"}, "model: expected an object"},
        {{.raw = "{\"model\": {\"merges\": []}}"}, "model.vocab: expected an object, found nothing"},
        {{.merges = ""}, "model.merges: expected an array, found nothing"},
        {{.merges = "{}"}, "model.merges: expected an array, found object"},
        {{.merges = "[\"xy z\"]"}, "expected its left part in model.vocab"},
        {{.merges = "[\"a xy\"]"}, "expected its right part in model.vocab"},
        {{.merges = "[\"a b\", \"b c\"]"}, "merges[1] (\"b\" \"c\"): expected its merged token"},
        {{.merges = "[\"abc\"]"}, "model.merges[0]: expected \"left right\""},
        {{.merges = "[\"a b c\"]"}, "model.merges[0]: expected \"left right\""},
        {{.merges = "[[1, 2]]"}, "model.merges[0]: expected"},
        {{.merges = "[[\"a\"]]"}, "model.merges[0]: expected"},
        {{.vocab_extra = ", \"ab\": 256, \"abc\": 256"}, "expected a unique id, found 256"},
        {{.vocab_extra = ", \"ab\": 256, \"ab\": 300, \"abc\": 257"}, "expected unique keys, found \"ab\" twice"},
        {{.vocab_extra = ", \"ab\": -1"}, "model.vocab[\"ab\"]: expected an integer id"},
        {{.vocab_extra = ", \"ab\": 1.5"}, "found 1.5"},
        {{.vocab_extra = ", \"ab\": 1e300"}, "found 1e+300"},
        {{.vocab_extra = ", \"ab\": 16777216"}, "expected an integer id in [0, 16777216)"},
        {{.vocab_extra = ", \"ab\": \"7\""}, "found \"7\""},
        {{.vocab_extra = ", \"\": 256"}, "expected non-empty keys"},
        {{.vocab_extra = ", \"\\u2581x\": 256"}, "expected GPT-2 byte-level characters, found U+2581"},
        {{.vocab_extra = ", \"a\\nb\": 256"}, "model.vocab[\"a\\x0Ab\"]"},
        {{.drop_byte = 'q' + 1}, "found none for byte 0x71"},
        {{.added = "[{\"id\": 5, \"content\": \"<|x|>\"}]"}, "expected id 5 to be free or to spell \"<|x|>\""},
        {{.added = "[{\"id\": 300, \"content\": \"\"}]"}, "added_tokens[0].content: expected a non-empty string"},
        {{.added = "[{\"id\": 1e12, \"content\": \"<y>\"}]"}, "added_tokens[0].id: expected an integer id"},
        {{.added = "[{\"content\": \"<y>\"}]"},
         "added_tokens[0].id: expected an integer id in [0, 16777216), found nothing"},
        {{.added = "[{\"id\": 300, \"content\": \"<y>\"}, {\"id\": 301, \"content\": \"<y>\"}]"},
         "found \"<y>\" twice"},
        {{.added = "{}"}, "added_tokens: expected an array"},
        {{.regex = "\\p{L}+"}, "pre_tokenizer: expected the Qwen2 regex Split"},
        {{.normalizer = "{\"type\": \"NFKC\"}"}, "normalizer: expected null or"},
        {{.model_type = "\"WordPiece\""}, "model.type: expected \"BPE\""},
        {{.model_type = "\"BPE\", \"ignore_merges\": 1"}, "model.ignore_merges: expected true or false, found 1"},
        {{.config = "{"}, "tokenizer_config.json: malformed JSON"},
        {{.config = "{\"eos_token\": \"<nope>\"}"}, "eos_token: expected a token of tokenizer.json, found \"<nope>\""},
        {{.config = "{\"pad_token\": 7}"}, "pad_token: expected a token string, found 7"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        Tokenizer t;
        char err[512] = "";
        cr_assert_eq(init_spec(&t, &cases[c].spec, err, sizeof err), -1, "case %zu loaded", c);
        cr_expect_not_null(strstr(err, cases[c].expect), "case %zu: error \"%s\" lacks \"%s\"", c, err,
                           cases[c].expect);
        cr_expect_null(strchr(err, '\n'), "case %zu: error spans lines", c);
        cr_expect_not_null(strstr(err, "tokenizer"), "case %zu: error \"%s\" names no file", c, err);
        tok_free(&t);
    }
    Tokenizer t;
    char err[512];
    cr_assert_eq(tok_init(&t, "/nonexistent/dir", err, sizeof err), -1);
    cr_assert_not_null(strstr(err, "/nonexistent/dir/tokenizer.json: cannot open"), "%s", err);
}

/* ------------------------------------------------------------ unicode */

/* The first code point of a UTF-8 string literal. */
static uint32_t cp_of(const char *s) {
    uint32_t cp;
    uni_decode((const unsigned char *)s, strlen(s), &cp);
    return cp;
}

/* Classes the regex relies on, including the non-ASCII ones. */
Test(tok_unicode, flags) {
    cr_assert_eq(uni_flags('A'), UNI_L);
    cr_assert_eq(uni_flags('7'), UNI_N);
    cr_assert_eq(uni_flags('\n'), UNI_WS);
    cr_assert_eq(uni_flags('-'), 0);
    cr_assert_eq(uni_flags(cp_of("é")), UNI_L);
    cr_assert_eq(uni_flags(cp_of("日")), UNI_L);
    cr_assert_eq(uni_flags(cp_of("٣")), UNI_N);    /* ARABIC-INDIC DIGIT THREE */
    cr_assert_eq(uni_flags(cp_of("Ⅻ")), UNI_N);    /* Nl; its decomposition is only a compatibility one */
    cr_assert_eq(uni_flags(0xA0), UNI_WS);
    cr_assert_eq(uni_flags(0x3000), UNI_WS);
    cr_assert_eq(uni_flags(0x85), UNI_WS);
    cr_assert_eq(uni_flags(0x200B), 0);            /* ZERO WIDTH SPACE is not White_Space */
    cr_assert_eq(uni_flags(0x0301), UNI_NFC | UNI_M);  /* Mn, a non-starter */
    cr_assert_eq(uni_flags(0x094D), UNI_NFC | UNI_M);  /* DEVANAGARI SIGN VIRAMA: Mn */
    cr_assert_eq(uni_flags(0x093E), UNI_M);            /* DEVANAGARI VOWEL SIGN AA: Mc, a starter */
    cr_assert_eq(uni_flags(0x20DD), UNI_M);            /* COMBINING ENCLOSING CIRCLE: Me, class 0 */
    cr_assert_eq(uni_flags(UNI_RAW_BYTE + 0xFF), 0);
    cr_assert_eq(uni_ccc(0x0301), 230);
    cr_assert_eq(uni_ccc(0x0323), 220);
    cr_assert_eq(uni_ccc('a'), 0);
    cr_assert_str_eq(uni_version(), "15.0.0");
}

/* Well-formed UTF-8 per table 3-7; every ill-formed lead byte stands alone. */
Test(tok_unicode, utf8_decode) {
    static const struct { const char *s; size_t len; uint32_t cp; } cases[] = {
        {"A", 1, 'A'}, {"\xC3\xA9", 2, 0xE9}, {"\xE2\x82\xAC", 3, 0x20AC}, {"\xF0\x9F\x98\x80", 4, 0x1F600},
        {"\xC0\x80", 1, UNI_RAW_BYTE + 0xC0},     /* overlong */
        {"\xE0\x80\x80", 1, UNI_RAW_BYTE + 0xE0}, /* overlong */
        {"\xED\xA0\x80", 1, UNI_RAW_BYTE + 0xED}, /* surrogate */
        {"\xF4\x90\x80\x80", 1, UNI_RAW_BYTE + 0xF4}, /* above U+10FFFF */
        {"\xE2\x82", 1, UNI_RAW_BYTE + 0xE2},     /* truncated */
        {"\x80", 1, UNI_RAW_BYTE + 0x80},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        uint32_t cp;
        size_t l = uni_decode((const unsigned char *)cases[c].s, strlen(cases[c].s), &cp);
        cr_assert(l == cases[c].len && cp == cases[c].cp, "case %zu: len %zu cp %X", c, l, cp);
        char out[4];
        if (l == 1) cr_assert(uni_encode(cp, out) == 1 && out[0] == cases[c].s[0]);
    }
}

/* One example per NFC rule; the full conformance file is the next test. */
Test(tok_unicode, nfc_examples) {
    static const struct { const char *in, *out;
    } cases[] = {
        {"cafe\xCC\x81", "caf\xC3\xA9"},                          /* e + acute -> é */
        {"\xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA8", "\xEA\xB0\x81"}, /* Hangul L V T -> 각 */
        {"\xEA\xB0\x80\xE1\x86\xA8", "\xEA\xB0\x81"},             /* LV + T -> LVT */
        {"\xE0\xA5\x98", "\xE0\xA4\x95\xE0\xA4\xBC"},             /* U+0958 is excluded from composition */
        {"\xE2\x84\xAB", "\xC3\x85"},                             /* ANGSTROM SIGN -> Å (singleton) */
        {"q\xCC\x87\xCC\xA3", "q\xCC\xA3\xCC\x87"},               /* reorder: dot below (220) before dot above (230) */
        {"a\xCC\xA3\xCC\x82", "\xE1\xBA\xAD"},                    /* a + dot below + circumflex -> ậ */
        {"\xCC\x81"
         "a",
         "\xCC\x81"
         "a"},                             /* leading mark stays */
        {"e\xCC\x81\xFF", "\xC3\xA9\xFF"}, /* invalid byte kept */
        {"plain ascii", "plain ascii"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        size_t n;
        char *o = uni_nfc(cases[c].in, strlen(cases[c].in), &n);
        cr_assert(o && n == strlen(cases[c].out) && !memcmp(o, cases[c].out, n), "case %zu", c);
        /* the quick check may say "not sure" for NFC text, never "sure" for other text */
        if (strcmp(cases[c].in, cases[c].out))
            cr_assert_eq(uni_is_nfc_quick(cases[c].in, strlen(cases[c].in)), 0, "case %zu", c);
        free(o);
    }
    cr_assert_eq(uni_is_nfc_quick("cafe\xCC\x81", 6), 0);
    cr_assert_eq(uni_is_nfc_quick("caf\xC3\xA9", 5), 1);
}

/* The conformance file of the UCD, when the system has it (Debian: unicode-data). */
Test(tok_unicode, normalization_test_file) {
    const char *path = "/usr/share/unicode/NormalizationTest.txt.bz2";
    if (access(path, R_OK) != 0) cr_skip_test("%s not installed", path);
    FILE *f = popen("bzip2 -dc /usr/share/unicode/NormalizationTest.txt.bz2 2>/dev/null", "r");
    cr_assert_not_null(f);
    char line[1024], cols[5][128];
    size_t lens[5];
    int lines = 0, bad = 0;
    while (fgets(line, sizeof line, f)) {
        if (lines == 0 && strstr(line, "NormalizationTest-") && !strstr(line, uni_version())) {
            pclose(f);
            cr_skip_test("the installed NormalizationTest is not Unicode %s", uni_version());
        }
        if (line[0] == '#' || line[0] == '@' || line[0] == '\n') continue;
        /* c1;c2;c3;c4;c5; of space-separated hex code points; NFC(c1..c3) = c2, NFC(c4, c5) = c4 */
        const char *p = line;
        for (int k = 0; k < 5; k++) {
            lens[k] = 0;
            while (*p && *p != ';') {
                char *end;
                unsigned long cp = strtoul(p, &end, 16);
                lens[k] += uni_encode((uint32_t)cp, cols[k] + lens[k]);
                p = end;
                while (*p == ' ') p++;
            }
            if (*p) p++;
        }
        static const int want[5] = {1, 1, 1, 3, 3};
        for (int k = 0; k < 5; k++) {
            size_t n;
            char *o = uni_nfc(cols[k], lens[k], &n);
            if (n != lens[want[k]] || memcmp(o, cols[want[k]], n)) bad++;
            free(o);
        }
        lines++;
    }
    pclose(f);
    cr_log_info("NormalizationTest: %d lines, %d mismatches", lines, bad);
    cr_assert_gt(lines, 10000);
    cr_assert_eq(bad, 0);
}

/* --------------------------------------------------------------- chat */

/* The exact strings of the Qwen3 template, with and without system / thinking. */
Test(tok_chat, template_text) {
    char *a = chat_first_turn("You are helpful.", "What is 2+2?", 0);
    cr_assert_str_eq(a, "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
                        "<|im_start|>assistant\n<think>\n\n</think>\n\n");
    free(a);
    a = chat_first_turn(NULL, "hi", 1);
    cr_assert_str_eq(a, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
    free(a);
    a = chat_first_turn("", "hi", 1);
    cr_assert_str_eq(a, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
    free(a);
    a = chat_next_turn("and 3+3?", 0);
    cr_assert_str_eq(
        a, "<|im_end|>\n<|im_start|>user\nand 3+3?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
    free(a);
    a = chat_next_turn("more", 1);
    cr_assert_str_eq(a, "<|im_end|>\n<|im_start|>user\nmore<|im_end|>\n<|im_start|>assistant\n");
    free(a);
    /* Qwen3.5 opens the think block in the prompt; off, the same as Qwen3 */
    a = chat_user_open_think("Hello", 1);
    cr_assert_str_eq(a, "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n<think>\n");
    free(a);
    a = chat_user_open_think("Hello", 0);
    cr_assert_str_eq(a, "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
    free(a);
}

/* The rendered first turn + the reply "4" + the follow-up's closing <|im_end|>
 * is the golden chat_full case; its ids must come out the same. */
Test(tok_chat, matches_golden_chat_case) {
    Tokenizer t;
    load_reduced(&t);
    char *first = chat_first_turn("You are helpful.", "What is 2+2?", 0);
    char *next = chat_next_turn("x", 0);
    char text[512];
    snprintf(text, sizeof text, "%s4%.*s", first, 10, next); /* "<|im_end|>" */
    char err[256];
    Json *root = json_parse_file(DATA "/cases_reduced4096.json", 1u << 30, err, sizeof err);
    cr_assert_not_null(root, "%s", err);
    const Json *cases = json_get(root, "cases"), *want = NULL;
    for (size_t i = 0; i < cases->len; i++)
        if (!strcmp(json_get_str(json_at(cases, i), "name"), "chat_full")) {
            cr_assert_str_eq(json_get_str(json_at(cases, i), "text"), text);
            want = json_get(json_at(cases, i), "lenml");
        }
    cr_assert_not_null(want);
    int ids[64], n = tok_encode(&t, text, strlen(text), ids, 64);
    cr_assert_eq(n, (int)want->len);
    for (int k = 0; k < n; k++) cr_assert_eq(ids[k], (int)json_at(want, (size_t)k)->number);
    json_free(root);
    free(first);
    free(next);
    tok_free(&t);
}

/* Qwen3.5's split regex keeps combining marks (\p{M}) with the letters
 * before them, where Qwen2's splits them off as punctuation. x + U+0301
 * (no precomposed form, so NFC keeps it) is bytes 78 CC 81: with merges
 * "x Ì" and "xÌ ģ" it is one token when x and the mark share a pre-token,
 * three byte tokens when they do not. */
Test(tok_small, qwen35_regex_keeps_marks_with_letters) {
    static const char q35[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}"
                              "| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
    Spec s = {.vocab_extra = ", \"ab\": 256, \"abc\": 257, \"x\xc3\x8c\": 300, \"x\xc3\x8c\xc4\xa3\": 301",
              .merges = "[\"a b\", [\"ab\", \"c\"], \"x \xc3\x8c\", \"x\xc3\x8c \xc4\xa3\"]"};
    const char *text = "x\xcc\x81", *text2 = "ax\xcc\x81!";
    int ids[16];
    char err[512];
    Tokenizer t;
    /* Qwen2/Qwen3: "x" | U+0301 */
    cr_assert_eq(init_spec(&t, &s, err, sizeof err), 0, "%s", err);
    cr_expect_eq(t.marks, 0);
    cr_assert_eq(tok_encode(&t, text, strlen(text), ids, 16), 3);
    cr_expect(ids[0] == 'x' && ids[1] == 0xCC && ids[2] == 0x81, "%d %d %d", ids[0], ids[1], ids[2]);
    tok_free(&t);
    /* Qwen3.5: one pre-token, merged whole; the mark ends the letter run, "!" is its own */
    s.regex = q35;
    cr_assert_eq(init_spec(&t, &s, err, sizeof err), 0, "%s", err);
    cr_expect_eq(t.marks, 1);
    cr_assert_eq(tok_encode(&t, text, strlen(text), ids, 16), 1);
    cr_expect_eq(ids[0], 301);
    cr_assert_eq(tok_encode(&t, text2, strlen(text2), ids, 16), 3);
    cr_expect(ids[0] == 'a' && ids[1] == 301 && ids[2] == '!', "\"ax\u0301\" then \"!\": ids %d %d %d", ids[0],
              ids[1], ids[2]);
    tok_free(&t);
}
