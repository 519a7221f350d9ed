/* tok_check.h: the encode round trip both tokenizer harnesses check
 * (fuzz_tokenizer_load.c on fuzzed tokenizers, fuzz_tokenizer_encode.c on
 * fuzzed text), included by each; static functions only.
 *
 * Data flow: text -> tok_encode -> ids -> tok_piece bytes, compared with
 * what tokenizer.h says the ids must spell, computed here independently:
 * the text is split on added tokens, leftmost then longest, as found in
 * the raw text (the contents come from the tokenizer.json tree itself, not
 * from the Tokenizer); each stretch between them is NFC-normalised when the
 * tokenizer has the NFC normalizer (uni_nfc; bytes that are not UTF-8 stay
 * as they are) and kept as it is otherwise; each added token is its own id.
 * So the check is per part: the ids of a stretch spell exactly its expected
 * bytes (no id crosses into an added token), each added token is exactly its
 * id. Then the streaming decoder (tok_stream_put + tok_stream_flush) must
 * give back the same bytes as the pieces. Follows tokenizer.h's pipeline
 * note and its note on invalid UTF-8.
 */
#ifndef TOK_CHECK_H
#define TOK_CHECK_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/json.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

/* One added token as tokenizer.json lists it. */
typedef struct {
    const char *p;
    size_t len;
    int id;
} TcAdded;

static void tc_die(const char *harness, const char *what, const char *text, size_t n) {
    fprintf(stderr, "%s: property failed: %s\ninput (%zu bytes): ", harness, what, n);
    for (size_t i = 0; i < n && i < 400; i++) fprintf(stderr, "\\x%02x", (unsigned char)text[i]);
    fprintf(stderr, "\n");
    abort();
}

/* The added tokens of a parsed tokenizer.json (pointers into root), for a
 * tree tok_load accepted: contents are non-empty strings, ids integers.
 * Returns a malloc'd array of *n entries. */
static TcAdded *tc_added(const Json *root, int *n) {
    const Json *added = json_get(root, "added_tokens");
    size_t count = added && added->type == JSON_ARRAY ? added->len : 0;
    TcAdded *a = malloc((count + 1) * sizeof *a);
    if (!a) abort();
    for (size_t i = 0; i < count; i++) {
        const Json *c = json_get(json_at(added, i), "content"), *id = json_get(json_at(added, i), "id");
        a[i] = (TcAdded){c->str, c->len, (int)id->number};
    }
    *n = (int)count;
    return a;
}

/* The longest added token at s[0 .. n), or -1. The first byte is compared
 * before memcmp: libFuzzer traces every memcmp, which made this loop most of
 * the run time. */
static int tc_added_at(const TcAdded *a, int na, const char *s, size_t n) {
    int best = -1;
    for (int k = 0; k < na; k++)
        if (a[k].len <= n && a[k].p[0] == s[0] && memcmp(a[k].p, s, a[k].len) == 0 &&
            (best < 0 || a[k].len > a[best].len))
            best = k;
    return best;
}

/* Consumes ids from *k while their pieces spell exactly want[0 .. n). */
static void tc_expect_bytes(const char *harness, const Tokenizer *t, const int *ids, int nid, int *k,
                            const char *want, size_t n, const char *text, size_t tn) {
    size_t at = 0;
    while (at < n) {
        size_t len = 0;
        const char *p = *k < nid ? tok_piece(t, ids[*k], &len) : NULL;
        if (!p) tc_die(harness, "ids end early or an id has no piece", text, tn);
        if (len > n - at || memcmp(p, want + at, len) != 0)
            tc_die(harness, "the pieces do not spell the (normalised) text", text, tn);
        at += len;
        (*k)++;
    }
}

/* Encodes text[0 .. n) and checks the round trip described at the top. */
static void tc_roundtrip(const char *harness, const Tokenizer *t, const TcAdded *a, int na, const char *text,
                         size_t n) {
    int cap = (int)(3 * n + 16);
    int *ids = malloc((size_t)cap * sizeof *ids);
    if (!ids) abort();
    int nid = tok_encode(t, text, n, ids, cap);
    if (nid < 0) tc_die(harness, "tok_encode failed with cap 3n + 16", text, n);
    int k = 0;
    size_t seg = 0, i = 0;
    for (;;) {
        int hit = i < n ? tc_added_at(a, na, text + i, n - i) : -1;
        if (i < n && hit < 0) {
            i++;
            continue;
        }
        /* the stretch [seg, i) before the added token (or the end) */
        if (i > seg) {
            size_t m = i - seg;
            char *norm = t->nfc ? uni_nfc(text + seg, m, &m) : NULL;
            if (t->nfc && !norm) abort();
            tc_expect_bytes(harness, t, ids, nid, &k, norm ? norm : text + seg, m, text, n);
            free(norm);
        }
        if (i >= n) break;
        if (k >= nid || ids[k] != a[hit].id) tc_die(harness, "an added token is not its own id", text, n);
        tc_expect_bytes(harness, t, ids, nid, &k, a[hit].p, a[hit].len, text, n);
        i += a[hit].len;
        seg = i;
    }
    if (k != nid) tc_die(harness, "ids left over after the text", text, n);
    /* the streaming decoder gives back the pieces' bytes, in order */
    size_t room = tok_max_piece(t) + 8, total = 0, got = 0;
    for (int j = 0; j < nid; j++) {
        size_t len;
        if (tok_piece(t, ids[j], &len)) total += len;
    }
    char *all = malloc(total + 1), *out = malloc(room), *dec = malloc(total + 1);
    if (!all || !out || !dec) abort();
    total = 0;
    TokStream st = {0};
    for (int j = 0; j < nid; j++) {
        size_t len, w = tok_stream_put(t, &st, ids[j], out, room);
        const char *p = tok_piece(t, ids[j], &len);
        memcpy(all + total, p, len);
        total += len;
        if (w == (size_t)-1 || got + w > total) tc_die(harness, "tok_stream_put wrote more than the pieces", text, n);
        memcpy(dec + got, out, w);
        got += w;
    }
    size_t w = tok_stream_flush(&st, out, room);
    if (w == (size_t)-1 || got + w != total) tc_die(harness, "the stream decoder lost or added bytes", text, n);
    memcpy(dec + got, out, w);
    if (memcmp(dec, all, total) != 0) tc_die(harness, "the stream decoder changed the bytes", text, n);
    free(all);
    free(out);
    free(dec);
    free(ids);
}

#endif
