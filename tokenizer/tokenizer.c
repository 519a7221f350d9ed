/* tokenizer.c: Qwen2/Qwen3 byte-level BPE (see tokenizer.h for the pipeline).
 *
 * Data flow: beside the main chain (run.c -> model -> attn -> kv ->
 * kernels): run.c turns prompt text into ids here (tok_encode) for
 * model_forward, and sampled ids back into UTF-8 (tok_stream_put);
 * tokenizer/unicode.c supplies NFC and the code point classes.
 *
 * Load: tokenizer.json -> format/json.h tree -> every vocab key turned from
 * its GPT-2 byte-level spelling ("Ġthe") into raw bytes (" the") in one byte
 * arena; a hash from raw bytes to id; a hash from (left id, right id) to merge
 * rank and merged id. Encode works on raw bytes throughout, so the byte-level
 * mapping is applied once per vocab entry at load instead of per input byte.
 * Follows Hugging Face tokenizers: added_vocabulary.rs (leftmost-longest split),
 * normalizers NFC, pre_tokenizers Split with the Qwen2 regex (as Oniguruma
 * evaluates it), models/bpe/word.rs (merge loop: lowest rank, then leftmost).
 */
#include "tokenizer/tokenizer.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "format/file.h"
#include "format/json.h"
#include "format/quote.h"
#include "tokenizer/unicode.h"

/* The two pre-tokenizer regexes this file implements (tokenizer.json
 * spelling): Qwen2/Qwen3's, and Qwen3.5's, which adds \p{M} to the letters
 * of the second alternative and to the excluded set of the fourth (llama.cpp's
 * pre-type qwen35). */
static const char QWEN2_REGEX[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
    "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char QWEN35_REGEX[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}"
    "| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

/* ---------------------------------------------------------------- errors */

/* Formats one error line into err (when given) and returns -1, so that error
 * paths read "return fail(...)". */
static int fail(char *err, size_t errlen, const char *fmt, ...) {
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return -1;
}

/* What was found instead of the expected value, for error lines. buf:
 * QUOTE_BUF bytes (strings are quoted, format/quote.h). */
static const char *found(const Json *v, char *buf) {
    if (!v) return "nothing";
    if (v->type == JSON_NUMBER) { snprintf(buf, QUOTE_BUF, "%.15g", v->number); return buf; }
    if (v->type == JSON_STRING) return quote(v->str, v->len, buf, QUOTE_BUF);
    return json_type_name(v->type);
}

/* ------------------------------------------------- GPT-2 byte-level alphabet */

/* Bytes 0x21-0x7E, 0xA1-0xAC and 0xAE-0xFF stand for themselves; the other 68
 * bytes, in increasing order, become U+0100 .. U+0143 (space -> U+0120 'Ġ'). */
static int byte_is_self(unsigned b) { return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b != 0xAD); }

/* Byte a byte-level code point stands for, or -1 outside the alphabet. */
static int cp_to_byte(uint32_t cp) {
    if (cp < 256) return byte_is_self(cp) ? (int)cp : -1;
    if (cp >= 256 + 68) return -1;
    unsigned k = cp - 256; /* k-th byte (in increasing order) that is not itself */
    if (k < 33) return (int)k;                  /* 0x00 .. 0x20 */
    if (k < 67) return (int)(0x7F + (k - 33));  /* 0x7F .. 0xA0 */
    return 0xAD;
}

/* Turns a byte-level string s[0 .. n) into the raw bytes it spells, in out
 * (n bytes suffice: every alphabet character is at least one UTF-8 byte).
 * Returns the raw length, or -1 when s holds a character outside the
 * alphabet; then *bad is that code point. */
static long bl_decode(const char *s, size_t n, char *out, uint32_t *bad) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0, o = 0;
    while (i < n) {
        uint32_t cp;
        i += uni_decode(u + i, n - i, &cp);
        int b = cp_to_byte(cp);
        if (b < 0) { *bad = cp; return -1; }
        out[o++] = (char)b;
    }
    return (long)o;
}

/* ----------------------------------------------------------------- hashes */

/* splitmix64 finaliser: every input bit reaches every output bit. */
static uint64_t mix64(uint64_t x) {
    x ^= x >> 30;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 27;
    x *= 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* Hash of a byte string: 8-byte words folded through mix64, seeded by the length. */
static uint64_t hash_bytes(const char *p, size_t n) {
    uint64_t h = mix64(0x9E3779B97F4A7C15ull + n);
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = mix64(h ^ w);
        p += 8;
        n -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, p, n);
    return mix64(h ^ w);
}

/* Hash of a merge pair: both ids packed into one 64-bit word. */
static uint32_t hash_pair(int32_t a, int32_t b) {
    return (uint32_t)mix64(((uint64_t)(uint32_t)a << 32) | (uint32_t)b);
}

/* Smallest power of two >= 2 * n, so open addressing stays at most half full. */
static uint32_t table_size(size_t n) {
    uint32_t s = 16;
    while (s < 2 * n) s *= 2;
    return s;
}

/* Id of the vocab token whose raw bytes are p[0 .. n), or -1. Linear probing
 * over a table at most half full: an empty slot (-1) ends the search. */
static int vocab_lookup(const Tokenizer *t, const char *p, size_t n) {
    for (uint32_t i = (uint32_t)hash_bytes(p, n) & t->vocab_mask;; i = (i + 1) & t->vocab_mask) {
        int32_t id = t->vocab_slots[i];
        if (id < 0) return -1;
        const TokPiece *pc = &t->pieces[id];
        if (pc->len == n && memcmp(t->bytes + pc->off, p, n) == 0) return id;
    }
}

/* Inserts id (whose piece is already in the arena); returns 0, or the id
 * already holding the same bytes + 1 (a duplicate key). */
static int vocab_insert(Tokenizer *t, int32_t id) {
    const TokPiece *pc = &t->pieces[id];
    const char *p = t->bytes + pc->off;
    for (uint32_t i = (uint32_t)hash_bytes(p, pc->len) & t->vocab_mask;; i = (i + 1) & t->vocab_mask) {
        int32_t o = t->vocab_slots[i];
        if (o < 0) { t->vocab_slots[i] = id; return 0; }
        if (t->pieces[o].len == pc->len && memcmp(t->bytes + t->pieces[o].off, p, pc->len) == 0) return o + 1;
    }
}

/* The merge of the adjacent symbols (a, b), or NULL when they never merge. */
static const TokMerge *merge_lookup(const Tokenizer *t, int32_t a, int32_t b) {
    for (uint32_t i = hash_pair(a, b) & t->merge_mask;; i = (i + 1) & t->merge_mask) {
        const TokMerge *m = &t->merges[i];
        if (m->rank < 0) return NULL;
        if (m->left == a && m->right == b) return m;
    }
}

/* A pair listed twice keeps its last rank, as Hugging Face's HashMap collect does. */
static void merge_insert(Tokenizer *t, int32_t a, int32_t b, int32_t rank, int32_t id) {
    for (uint32_t i = hash_pair(a, b) & t->merge_mask;; i = (i + 1) & t->merge_mask) {
        TokMerge *m = &t->merges[i];
        if (m->rank < 0 || (m->left == a && m->right == b)) {
            *m = (TokMerge){a, b, rank, id};
            return;
        }
    }
}

/* ------------------------------------------------------------------ load */

/* Reads an integer id in [0, TOK_MAX_ID) from v; -1 when v is anything else. */
static long read_id(const Json *v) {
    /* range first: converting an out-of-range double to long is undefined */
    if (!v || v->type != JSON_NUMBER || v->number < 0 || v->number >= TOK_MAX_ID) return -1;
    long id = (long)v->number;
    return (double)id == v->number ? id : -1;
}

/* Checks the normalizer and pre-tokenizer are the Qwen2 ones this file implements. */
static int check_pipeline(Tokenizer *t, const Json *root, const char *path, char *err, size_t errlen) {
    char b1[QUOTE_BUF];
    /* normalizer: absent/null means none, NFC is the Qwen one, anything else
     * would silently change ids, so it is refused */
    const Json *norm = json_get(root, "normalizer");
    if (norm && norm->type != JSON_NULL) {
        const char *ty = json_get_str(norm, "type");
        if (!ty || strcmp(ty, "NFC") != 0)
            return fail(err, errlen, "%s: normalizer: expected null or {\"type\": \"NFC\"}, found type %s", path,
                        found(json_get(norm, "type"), b1));
        t->nfc = 1;
    }
    /* pre_tokenizer: the Split alone, or a Sequence of it and ByteLevel steps */
    const Json *pre = json_get(root, "pre_tokenizer"), *list = NULL;
    const char *pty = json_get_str(pre, "type");
    if (pty && !strcmp(pty, "Sequence")) {
        list = json_get(pre, "pretokenizers");
        if (!list || list->type != JSON_ARRAY)
            return fail(err, errlen, "%s: pre_tokenizer.pretokenizers: expected an array, found %s", path,
                        found(list, b1));
    }
    /* every step must be the Qwen2 Split or a ByteLevel without its own GPT-2
     * regex: a Llama-3 style regex (digits in threes) would tokenise wrongly */
    size_t n = list ? list->len : 1;
    int have_split = 0;
    for (size_t i = 0; i < n; i++) {
        const Json *p = list ? json_at(list, i) : pre;
        const char *ty = json_get_str(p, "type");
        const char *re = json_get_str(json_get(p, "pattern"), "Regex");
        const char *beh = json_get_str(p, "behavior");
        int use_regex = 0;
        json_get_bool(p, "use_regex", &use_regex);
        if (ty && !strcmp(ty, "ByteLevel") && !use_regex) continue;
        int q35 = re && !strcmp(re, QWEN35_REGEX);
        if (ty && !strcmp(ty, "Split") && re && (q35 || !strcmp(re, QWEN2_REGEX)) && (!beh || !strcmp(beh, "Isolated"))) {
            t->marks = q35;
            have_split = 1;
            continue;
        }
        /* the error names the step's type and, for a known type, what did not fit */
        const char *why = "";
        if (ty && !strcmp(ty, "Split")) why = " with another regex or behavior";
        else if (use_regex) why = " with use_regex";
        return fail(err, errlen, "%s: pre_tokenizer: expected the Qwen2 regex Split (Isolated) and ByteLevel "
                    "(use_regex false), found %s%s", path, found(ty ? json_get(p, "type") : p, b1), why);
    }
    if (!have_split)
        return fail(err, errlen, "%s: pre_tokenizer: expected the Qwen2 regex Split, found %s", path,
                    pre && pre->type != JSON_NULL ? "none" : "nothing");
    return 0;
}

/* An added token while sorting: its content and id. */
typedef struct { const char *p; size_t len; int32_t id; } AddedSort;

/* Longest content first; ties by bytes, so duplicates end up side by side. */
static int cmp_added(const void *a, const void *b) {
    const AddedSort *x = a, *y = b;
    if (x->len != y->len) return x->len > y->len ? -1 : 1;
    return memcmp(x->p, y->p, x->len);
}

/* Fills pieces, arena and hashes from the vocab and added tokens. */
static int load_tokens(Tokenizer *t, const Json *vocab, const Json *added, const char *path, char *err, size_t errlen) {
    char b1[QUOTE_BUF], b2[QUOTE_BUF];
    /* pass 1: validate ids and size everything; ids are unique and below
     * TOK_MAX_ID, so more entries than that cannot all be valid */
    long max_id = -1;
    size_t arena = 0, n_added = added ? added->len : 0;
    if (vocab->len > TOK_MAX_ID)
        return fail(err, errlen, "%s: model.vocab: expected at most %d entries, found %zu", path, TOK_MAX_ID,
                    vocab->len);
    for (size_t i = 0; i < vocab->len; i++) {
        long id = read_id(&vocab->items[i]);
        if (id < 0)
            return fail(err, errlen, "%s: model.vocab[%s]: expected an integer id in [0, %d), found %s", path,
                        quote(vocab->keys[i], vocab->key_lens[i], b1, sizeof b1), TOK_MAX_ID,
                        found(&vocab->items[i], b2));
        if (vocab->key_lens[i] == 0)
            return fail(err, errlen, "%s: model.vocab: expected non-empty keys, found \"\"", path);
        if (id > max_id) max_id = id;
        arena += vocab->key_lens[i];
    }
    for (size_t i = 0; i < n_added; i++) {
        const Json *a = &added->items[i];
        long id = read_id(json_get(a, "id"));
        const Json *c = json_get(a, "content");
        if (id < 0)
            return fail(err, errlen, "%s: added_tokens[%zu].id: expected an integer id in [0, %d), found %s", path, i,
                        TOK_MAX_ID, found(json_get(a, "id"), b1));
        if (!c || c->type != JSON_STRING || c->len == 0)
            return fail(err, errlen, "%s: added_tokens[%zu].content: expected a non-empty string, found %s", path, i,
                        found(c, b1));
        if (id > max_id) max_id = id;
        arena += c->len;
    }
    if (max_id < 0) return fail(err, errlen, "%s: model.vocab: expected at least one entry, found none", path);
    /* TokPiece offsets are 32-bit */
    if (arena >= UINT32_MAX) return fail(err, errlen, "%s: model.vocab: expected under 4 GiB of tokens", path);

    /* pieces: [n_ids] dense by id (holes stay len 0); bytes: [arena] every
     * token's raw bytes; vocab_slots: 2x the vocab, -1 (0xFF bytes) = empty */
    t->n_ids = (int)max_id + 1;
    t->vocab_mask = table_size(vocab->len) - 1;
    t->pieces = calloc((size_t)t->n_ids, sizeof *t->pieces);
    t->bytes = malloc(arena + 1);
    t->vocab_slots = malloc(((size_t)t->vocab_mask + 1) * sizeof *t->vocab_slots);
    t->added = malloc((n_added + 1) * sizeof *t->added);
    if (!t->pieces || !t->bytes || !t->vocab_slots || !t->added) return fail(err, errlen, "%s: out of memory", path);
    memset(t->vocab_slots, 0xFF, ((size_t)t->vocab_mask + 1) * sizeof *t->vocab_slots);

    /* pass 2: vocab keys -> raw bytes in the arena, indexed by id and by bytes */
    size_t off = 0;
    for (size_t i = 0; i < vocab->len; i++) {
        int32_t id = (int32_t)vocab->items[i].number;
        uint32_t bad = 0;
        long n = bl_decode(vocab->keys[i], vocab->key_lens[i], t->bytes + off, &bad);
        if (n < 0)
            return fail(err, errlen, "%s: model.vocab[%s]: expected GPT-2 byte-level characters, found U+%04X", path,
                        quote(vocab->keys[i], vocab->key_lens[i], b1, sizeof b1), (unsigned)bad);
        if (t->pieces[id].len)
            return fail(err, errlen, "%s: model.vocab[%s]: expected a unique id, found %d, already used", path,
                        quote(vocab->keys[i], vocab->key_lens[i], b1, sizeof b1), (int)id);
        t->pieces[id] = (TokPiece){(uint32_t)off, (uint32_t)n};
        off += (size_t)n;
        if (vocab_insert(t, id))
            return fail(err, errlen, "%s: model.vocab: expected unique keys, found %s twice", path,
                        quote(vocab->keys[i], vocab->key_lens[i], b1, sizeof b1));
        if ((size_t)n > t->max_piece) t->max_piece = (size_t)n;
    }
    /* BPE starts from one symbol per byte, so all 256 must exist */
    for (int b = 0; b < 256; b++) {
        char c = (char)b;
        t->byte_id[b] = vocab_lookup(t, &c, 1);
        if (t->byte_id[b] < 0)
            return fail(err, errlen, "%s: model.vocab: expected a token for every byte, found none for byte 0x%02X",
                        path, b);
    }

    /* added tokens: content as is; an id shared with the vocab must spell the same bytes */
    for (size_t i = 0; i < n_added; i++) {
        const Json *a = &added->items[i];
        int32_t id = (int32_t)read_id(json_get(a, "id"));
        const Json *c = json_get(a, "content");
        TokPiece *pc = &t->pieces[id];
        if (pc->len && (pc->len != c->len || memcmp(t->bytes + pc->off, c->str, c->len) != 0))
            return fail(err, errlen,
                        "%s: added_tokens[%zu]: expected id %d to be free or to spell %s, found it used by %s", path, i,
                        (int)id, quote(c->str, c->len, b1, sizeof b1),
                        quote(t->bytes + pc->off, pc->len, b2, sizeof b2));
        if (!pc->len) { /* not in the vocab: its content joins the arena */
            memcpy(t->bytes + off, c->str, c->len);
            *pc = (TokPiece){(uint32_t)off, (uint32_t)c->len};
            off += c->len;
        }
        /* encode only tries the added tokens at bytes that can start one */
        t->added[t->n_added++] = id;
        t->added_first[(unsigned char)c->str[0] >> 3] |= (uint8_t)(1u << ((unsigned char)c->str[0] & 7));
        if (c->len > t->max_piece) t->max_piece = c->len;
    }
    /* longest first, so the first hit at a position is the longest one;
     * two tokens with one content would make the match ambiguous */
    AddedSort *srt = malloc(((size_t)t->n_added + 1) * sizeof *srt);
    if (!srt) return fail(err, errlen, "%s: out of memory", path);
    for (int i = 0; i < t->n_added; i++) {
        const TokPiece *pc = &t->pieces[t->added[i]];
        srt[i] = (AddedSort){t->bytes + pc->off, pc->len, t->added[i]};
    }
    qsort(srt, (size_t)t->n_added, sizeof *srt, cmp_added);
    int rc = 0;
    for (int i = 0; i < t->n_added; i++) {
        t->added[i] = srt[i].id;
        if (i > 0 && rc == 0 && cmp_added(&srt[i - 1], &srt[i]) == 0)
            rc = fail(err, errlen, "%s: added_tokens: expected unique contents, found %s twice", path,
                      quote(srt[i].p, srt[i].len, b1, sizeof b1));
    }
    free(srt);
    return rc;
}

/* Reads model.merges: "left right" strings or ["left", "right"] pairs, rank = index. */
static int load_merges(Tokenizer *t, const Json *merges, const char *path, char *err, size_t errlen) {
    char b1[QUOTE_BUF], b2[QUOTE_BUF];
    if (merges->len > TOK_MAX_ID)
        return fail(err, errlen, "%s: model.merges: expected at most %d entries, found %zu", path, TOK_MAX_ID,
                    merges->len);
    /* merges: [2x the merge count] slots, rank -1 = empty */
    t->merge_mask = table_size(merges->len) - 1;
    t->merges = malloc(((size_t)t->merge_mask + 1) * sizeof *t->merges);
    if (!t->merges) return fail(err, errlen, "%s: out of memory", path);
    for (size_t i = 0; i <= t->merge_mask; i++) t->merges[i].rank = -1;
    char *buf = NULL; /* raw bytes of left then right, back to back */
    size_t cap = 0;
    int rc = 0;
    for (size_t i = 0; i < merges->len && rc == 0; i++) {
        const Json *m = &merges->items[i];
        const char *parts[2];
        size_t lens[2];
        if (m->type == JSON_STRING) {
            /* byte-level symbols never hold a raw space (it is 'Ġ'), so the one
             * space separates the halves; Hugging Face also wants exactly one */
            const char *sp = memchr(m->str, ' ', m->len);
            parts[0] = m->str;
            lens[0] = sp ? (size_t)(sp - m->str) : 0;
            parts[1] = sp ? sp + 1 : "";
            lens[1] = sp ? m->len - lens[0] - 1 : 0;
            if (!sp || memchr(parts[1], ' ', lens[1]) || !lens[0] || !lens[1]) {
                rc = fail(err, errlen, "%s: model.merges[%zu]: expected \"left right\", found %s", path, i,
                          found(m, b1));
                break;
            }
        } else if (m->type == JSON_ARRAY && m->len == 2 && m->items[0].type == JSON_STRING &&
                   m->items[1].type == JSON_STRING && m->items[0].len && m->items[1].len) {
            parts[0] = m->items[0].str;
            lens[0] = m->items[0].len;
            parts[1] = m->items[1].str;
            lens[1] = m->items[1].len;
        } else {
            rc = fail(err, errlen, "%s: model.merges[%zu]: expected \"left right\" or [\"left\", \"right\"], found %s",
                      path, i, m->type == JSON_ARRAY ? "another array" : found(m, b1));
            break;
        }
        /* buf: [lens[0] + lens[1]] raw bytes, never longer than their spelling */
        if (lens[0] + lens[1] > cap) {
            cap = 2 * (lens[0] + lens[1]);
            char *nb = realloc(buf, cap);
            if (!nb) { rc = fail(err, errlen, "%s: out of memory", path); break; }
            buf = nb;
        }
        /* both halves decode back to back, which also spells the merged token */
        long raw[2];
        uint32_t bad = 0;
        raw[0] = bl_decode(parts[0], lens[0], buf, &bad);
        raw[1] = raw[0] < 0 ? -1 : bl_decode(parts[1], lens[1], buf + raw[0], &bad);
        int ids[3] = {0, 0, 0};
        if (raw[1] >= 0) {
            ids[0] = vocab_lookup(t, buf, (size_t)raw[0]);
            ids[1] = vocab_lookup(t, buf + raw[0], (size_t)raw[1]);
            ids[2] = vocab_lookup(t, buf, (size_t)(raw[0] + raw[1]));
        }
        if (raw[1] < 0)
            rc = fail(err, errlen, "%s: model.merges[%zu] (%s %s): expected GPT-2 byte-level characters, found U+%04X",
                      path, i, quote(parts[0], lens[0], b1, sizeof b1), quote(parts[1], lens[1], b2, sizeof b2), (unsigned)bad);
        for (int k = 0; k < 3 && rc == 0; k++) {
            if (ids[k] >= 0) continue;
            rc = fail(err, errlen, "%s: model.merges[%zu] (%s %s): expected its %s in model.vocab, found none", path, i,
                      quote(parts[0], lens[0], b1, sizeof b1), quote(parts[1], lens[1], b2, sizeof b2),
                      k == 0 ? "left part" : k == 1 ? "right part" : "merged token");
        }
        if (rc == 0) merge_insert(t, ids[0], ids[1], (int32_t)i, ids[2]);
    }
    free(buf);
    return rc;
}

/* tokenizer_config.json's eos_token / pad_token: a string, {"content": ...} or null. */
static int config_token(Tokenizer *t, const Json *cfg, const char *key, int *out, const char *path, char *err,
                        size_t errlen) {
    char b1[QUOTE_BUF];
    const Json *v = json_get(cfg, key);
    if (v && v->type == JSON_OBJECT) v = json_get(v, "content");
    if (!v || v->type == JSON_NULL) return 0;
    if (v->type != JSON_STRING)
        return fail(err, errlen, "%s: %s: expected a token string, found %s", path, key, found(v, b1));
    *out = tok_find(t, v->str);
    if (*out < 0)
        return fail(err, errlen, "%s: %s: expected a token of tokenizer.json, found %s", path, key, found(v, b1));
    return 0;
}

/* tokenizer.json's tree into t. Order: the top-level shapes, the pipeline,
 * then tokens (vocab + added, which merges refer to) and merges. */
static int load_json(Tokenizer *t, const Json *root, const char *path, char *err, size_t errlen) {
    char b1[QUOTE_BUF];
    const Json *model = json_get(root, "model");
    const Json *vocab = json_get(model, "vocab"), *merges = json_get(model, "merges");
    const Json *added = json_get(root, "added_tokens");
    const char *mtype = json_get_str(model, "type");
    if (!model || model->type != JSON_OBJECT)
        return fail(err, errlen, "%s: model: expected an object, found %s", path,
                    root->type == JSON_OBJECT ? found(model, b1) : "no top-level object");
    if (json_get(model, "type") && (!mtype || strcmp(mtype, "BPE") != 0))
        return fail(err, errlen, "%s: model.type: expected \"BPE\", found %s", path, found(json_get(model, "type"), b1));
    if (!vocab || vocab->type != JSON_OBJECT)
        return fail(err, errlen, "%s: model.vocab: expected an object, found %s", path, found(vocab, b1));
    if (!merges || merges->type != JSON_ARRAY)
        return fail(err, errlen, "%s: model.merges: expected an array, found %s", path, found(merges, b1));
    if (added && added->type != JSON_ARRAY && added->type != JSON_NULL)
        return fail(err, errlen, "%s: added_tokens: expected an array, found %s", path, found(added, b1));
    if (check_pipeline(t, root, path, err, errlen) ||
        load_tokens(t, vocab, added && added->type == JSON_ARRAY ? added : NULL, path, err, errlen) ||
        load_merges(t, merges, path, err, errlen))
        return -1;
    const Json *ign = json_get(model, "ignore_merges");
    if (ign && ign->type != JSON_NULL && !json_get_bool(model, "ignore_merges", &t->ignore_merges))
        return fail(err, errlen, "%s: model.ignore_merges: expected true or false, found %s", path, found(ign, b1));
    return 0;
}

/* Parses n bytes of JSON named path; NULL with one line in err. */
static Json *parse(const char *text, size_t n, const char *path, char *err, size_t errlen) {
    char perr[200];
    Json *j = json_parse(text, n, perr, sizeof perr);
    if (!j) fail(err, errlen, "%s: malformed JSON: %s", path, perr);
    return j;
}

int tok_load(Tokenizer *t, const char *json, size_t n, const char *path, const char *cfg, size_t cfg_n,
             const char *cfg_path, char *err, size_t errlen) {
    memset(t, 0, sizeof *t);
    t->eos_id = t->pad_id = -1;
    Json *root = parse(json, n, path, err, errlen);
    int rc = root ? load_json(t, root, path, err, errlen) : -1;
    /* the tree goes before the config's is made: peak memory is one tree */
    json_free(root);
    if (rc == 0 && cfg) {
        Json *c = parse(cfg, cfg_n, cfg_path, err, errlen);
        rc = c ? 0 : -1;
        if (rc == 0) rc = config_token(t, c, "eos_token", &t->eos_id, cfg_path, err, errlen);
        if (rc == 0) rc = config_token(t, c, "pad_token", &t->pad_id, cfg_path, err, errlen);
        json_free(c);
    }
    if (rc) tok_free(t);
    return rc;
}

int tok_init(Tokenizer *t, const char *dir, char *err, size_t errlen) {
    memset(t, 0, sizeof *t);
    t->eos_id = t->pad_id = -1;
    char path[4096], cpath[4096];
    if ((size_t)snprintf(path, sizeof path, "%s/tokenizer.json", dir) >= sizeof path ||
        (size_t)snprintf(cpath, sizeof cpath, "%s/tokenizer_config.json", dir) >= sizeof cpath)
        return fail(err, errlen, "%s: expected a shorter directory name", dir);
    size_t n, cn = 0;
    char *json = file_read(path, TOK_MAX_JSON, &n, err, errlen), *cfg = NULL;
    if (!json) return -1;
    /* tokenizer_config.json is optional; when present it must be well formed */
    struct stat st;
    if (stat(cpath, &st) == 0 || errno != ENOENT) {
        cfg = file_read(cpath, TOK_MAX_CONFIG, &cn, err, errlen);
        if (!cfg) { free(json); return -1; }
    }
    int rc = tok_load(t, json, n, path, cfg, cn, cpath, err, errlen);
    free(json);
    free(cfg);
    return rc;
}

void tok_free(Tokenizer *t) {
    free(t->pieces);
    free(t->bytes);
    free(t->vocab_slots);
    free(t->merges);
    free(t->added);
    memset(t, 0, sizeof *t);
    t->eos_id = t->pad_id = -1;
}

/* ---------------------------------------------------------------- encode */

/* Min-heap entry of the merge loop: lowest rank first, then leftmost. */
typedef struct { int32_t rank, pos; } HeapItem;

/* Per-call state of tok_encode: the output and scratch arrays grown on demand
 * (the Tokenizer itself stays read-only, so threads may share it). */
typedef struct {
    const Tokenizer *t;
    int *ids;
    int cap, n, failed;
    uint32_t *cps;    /* [cp_cap] code points of the segment being pre-tokenised */
    uint8_t *flags;   /* [cp_cap] their uni_flags */
    size_t *offs;     /* [cp_cap + 1] byte offset of each */
    size_t cp_cap;
    int32_t *sym, *prev, *next; /* [sym_cap] BPE symbols as a linked list; sym -1 = merged away */
    HeapItem *heap;             /* [3 * sym_cap]: n - 1 initial pairs + at most 2 per merge */
    size_t sym_cap, nheap;
} Enc;

/* Appends one id; running out of room fails the whole encode (returns -1). */
static void emit(Enc *e, int id) {
    if (e->n >= e->cap) { e->failed = 1; return; }
    e->ids[e->n++] = id;
}

static int heap_less(HeapItem a, HeapItem b) { return a.rank < b.rank || (a.rank == b.rank && a.pos < b.pos); }

/* Binary min-heap in e->heap[0 .. nheap): sift the new item up. */
static void heap_push(Enc *e, int32_t rank, int32_t pos) {
    size_t i = e->nheap++;
    HeapItem it = {rank, pos};
    while (i > 0 && heap_less(it, e->heap[(i - 1) / 2])) {
        e->heap[i] = e->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    e->heap[i] = it;
}

/* Removes the minimum: the last item sifts down from the root. */
static HeapItem heap_pop(Enc *e) {
    HeapItem top = e->heap[0], last = e->heap[--e->nheap];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= e->nheap) break;
        if (c + 1 < e->nheap && heap_less(e->heap[c + 1], e->heap[c])) c++;
        if (!heap_less(e->heap[c], last)) break;
        e->heap[i] = e->heap[c];
        i = c;
    }
    e->heap[i] = last;
    return top;
}

/* Queues the pair starting at symbol pos if the merges know it. */
static void push_pair(Enc *e, int32_t pos) {
    int32_t nx = e->next[pos];
    if (nx < 0) return;
    const TokMerge *m = merge_lookup(e->t, e->sym[pos], e->sym[nx]);
    if (m) heap_push(e, m->rank, pos);
}

/* realloc that keeps *p valid on failure (it is freed at the end of tok_encode). */
static int grow(void **p, size_t count, size_t size) {
    void *np = realloc(*p, count * size);
    if (!np) return 0;
    *p = np;
    return 1;
}

/* BPE of one pre-token's bytes p[0 .. n): start from one symbol per byte and
 * apply the lowest-ranked merge present until none applies (word.rs merge_all). */
static void bpe(Enc *e, const char *p, size_t n) {
    const Tokenizer *t = e->t;
    if (n == 1) { emit(e, t->byte_id[(unsigned char)p[0]]); return; }
    if (t->ignore_merges) {
        int id = vocab_lookup(t, p, n);
        if (id >= 0) { emit(e, id); return; }
    }
    /* scratch is reused across pre-tokens and grows geometrically */
    if (n > e->sym_cap) {
        size_t c = n * 2;
        if (!grow((void **)&e->sym, c, sizeof *e->sym) || !grow((void **)&e->prev, c, sizeof *e->prev) ||
            !grow((void **)&e->next, c, sizeof *e->next) || !grow((void **)&e->heap, 3 * c, sizeof *e->heap)) {
            e->failed = 1;
            return;
        }
        e->sym_cap = c;
    }
    for (size_t k = 0; k < n; k++) {
        e->sym[k] = t->byte_id[(unsigned char)p[k]];
        e->prev[k] = (int32_t)k - 1;
        e->next[k] = k + 1 < n ? (int32_t)k + 1 : -1;
    }
    /* symbols form a doubly linked list over the bytes; a merge keeps the
     * left slot, unlinks the right one and queues the two new neighbour pairs.
     * Entries go stale instead of being removed: they are checked on pop. */
    e->nheap = 0;
    for (size_t k = 0; k + 1 < n; k++) push_pair(e, (int32_t)k);
    while (e->nheap) {
        HeapItem top = heap_pop(e);
        int32_t pos = top.pos, nx = e->next[pos];
        /* stale entries: the left symbol was merged away or has changed */
        if (e->sym[pos] < 0 || nx < 0) continue;
        const TokMerge *m = merge_lookup(t, e->sym[pos], e->sym[nx]);
        if (!m || m->rank != top.rank) continue;
        e->sym[pos] = m->id;
        e->sym[nx] = -1;
        e->next[pos] = e->next[nx];
        if (e->next[nx] >= 0) e->prev[e->next[nx]] = pos;
        if (e->prev[pos] >= 0) push_pair(e, e->prev[pos]);
        push_pair(e, pos);
    }
    /* symbol 0 is never merged away (merges keep the left slot) */
    for (int32_t k = 0; k >= 0; k = e->next[k]) emit(e, e->sym[k]);
}

/* [\r\n] in the regex: only these two, not the other line breaks */
static int is_crlf(uint32_t c) { return c == '\r' || c == '\n'; }

/* (?i:) for the contraction letters: ASCII case, plus U+017F LONG S, whose
 * case folding is 's' (Oniguruma and JavaScript /iu both match it). */
static uint32_t fold(uint32_t c) {
    if (c >= 'A' && c <= 'Z') return c + 32;
    return c == 0x17F ? 's' : c;
}

/* End (exclusive) of the pre-token starting at code point i of cp[0 .. m):
 *   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}
 *   | ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
 * tried in that order, each with the backtracking a regex engine would do.
 * With marks (Qwen3.5), \p{L}+ is [\p{L}\p{M}]+ and the punctuation run
 * excludes \p{M} too. */
static size_t pretok_end(const uint32_t *cp, const uint8_t *fl, size_t m, size_t i, int marks) {
    const unsigned let = marks ? UNI_L | UNI_M : UNI_L;
    uint32_t c = cp[i];
    /* contractions: the apostrophe is ASCII only; 's|'t|'m|'d need one letter */
    if (c == '\'' && i + 1 < m) {
        uint32_t a = fold(cp[i + 1]), b = i + 2 < m ? fold(cp[i + 2]) : 0;
        if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
        if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return i + 3;
    }
    /* letters, optionally led by one character that is not CR/LF/letter/number */
    size_t j = i;
    if (!(fl[i] & (UNI_L | UNI_N)) && !is_crlf(c) && i + 1 < m && (fl[i + 1] & let)) j = i + 1;
    if (fl[j] & let) {
        while (j < m && (fl[j] & let)) j++;
        return j;
    }
    if (fl[i] & UNI_N) return i + 1; /* \p{N}: digits one by one, unlike Llama 3 */
    /* punctuation run, optionally led by one ASCII space, then any CR/LF */
    const unsigned word = UNI_WS | UNI_N | let;
    j = c == ' ' ? i + 1 : i;
    if (j < m && !(fl[j] & word)) {
        while (j < m && !(fl[j] & word)) j++;
        while (j < m && is_crlf(cp[j])) j++;
        return j;
    }
    /* only white space is left here: find its run [i, end) and its last CR/LF */
    size_t end = i, nl = m;
    for (; end < m && (fl[end] & UNI_WS); end++)
        if (is_crlf(cp[end])) nl = end;
    if (nl < m) return nl + 1;                 /* \s*[\r\n]+ stops after the last CR/LF */
    if (end == m || end - i == 1) return end;  /* \s+(?!\S) at the end, or \s+ alone */
    return end - 1;                            /* \s+(?!\S) leaves one space for the next word */
}

/* NFC, pre-tokenise and BPE the text between two added tokens. */
static void encode_segment(Enc *e, const char *s, size_t n) {
    if (n == 0 || e->failed) return;
    /* most text is already NFC: a normalised copy is made only when the quick check fails */
    char *norm = NULL;
    if (e->t->nfc && !uni_is_nfc_quick(s, n)) {
        norm = uni_nfc(s, n, &n);
        if (!norm) { e->failed = 1; return; }
        s = norm;
    }
    /* a code point takes at least one byte, so n slots suffice */
    if (n > e->cp_cap) {
        if (!grow((void **)&e->cps, n, sizeof *e->cps) || !grow((void **)&e->flags, n, sizeof *e->flags) ||
            !grow((void **)&e->offs, n + 1, sizeof *e->offs)) {
            e->failed = 1;
            free(norm);
            return;
        }
        e->cp_cap = n;
    }
    /* cps/flags/offs: [m] code points with classes and byte offsets, so the
     * matcher can look ahead and back up without re-decoding */
    size_t m = 0;
    for (size_t i = 0; i < n; m++) {
        e->offs[m] = i;
        i += uni_decode((const unsigned char *)s + i, n - i, &e->cps[m]);
        e->flags[m] = (uint8_t)uni_flags(e->cps[m]);
    }
    e->offs[m] = n;
    for (size_t i = 0; i < m && !e->failed;) {
        size_t j = pretok_end(e->cps, e->flags, m, i, e->t->marks);
        bpe(e, s + e->offs[i], e->offs[j] - e->offs[i]);
        i = j;
    }
    free(norm);
}

/* Id of the longest added token starting at s[0 .. n), or -1; *len its length. */
static int added_at(const Tokenizer *t, const char *s, size_t n, size_t *len) {
    for (int k = 0; k < t->n_added; k++) {
        const TokPiece *pc = &t->pieces[t->added[k]];
        if (pc->len <= n && memcmp(t->bytes + pc->off, s, pc->len) == 0) {
            *len = pc->len;
            return t->added[k];
        }
    }
    return -1;
}

int tok_encode(const Tokenizer *t, const char *text, size_t n, int *ids, int cap) {
    if (n == 0) return 0; /* also keeps NULL text with n == 0 away from pointer arithmetic */
    Enc e = {.t = t, .ids = ids, .cap = cap};
    /* leftmost-longest split on added tokens, on the raw text; only bytes that
     * start one are tried. Each stretch between them is its own segment, as in
     * Hugging Face: NFC and the regex never see across an added token. */
    size_t seg = 0, i = 0;
    while (i < n && !e.failed) {
        unsigned char b = (unsigned char)text[i];
        size_t len = 0;
        int id = (t->added_first[b >> 3] >> (b & 7)) & 1 ? added_at(t, text + i, n - i, &len) : -1;
        if (id < 0) { i++; continue; }
        encode_segment(&e, text + seg, i - seg);
        emit(&e, id);
        i += len;
        seg = i;
    }
    encode_segment(&e, text + seg, n - seg);
    free(e.cps);
    free(e.flags);
    free(e.offs);
    free(e.sym);
    free(e.prev);
    free(e.next);
    free(e.heap);
    return e.failed ? -1 : e.n;
}

/* ---------------------------------------------------------------- lookup */

const char *tok_piece(const Tokenizer *t, int id, size_t *len) {
    if (id < 0 || id >= t->n_ids || t->pieces[id].len == 0) return NULL;
    *len = t->pieces[id].len;
    return t->bytes + t->pieces[id].off;
}

int tok_vocab_size(const Tokenizer *t) { return t->n_ids; }

size_t tok_max_piece(const Tokenizer *t) { return t->max_piece; }

int tok_find(const Tokenizer *t, const char *token_text) {
    /* added tokens by content first, then the vocab by its tokenizer.json key */
    if (!t->vocab_slots) return -1; /* not loaded */
    size_t n = strlen(token_text);
    for (int k = 0; k < t->n_added; k++) {
        const TokPiece *pc = &t->pieces[t->added[k]];
        if (pc->len == n && memcmp(t->bytes + pc->off, token_text, n) == 0) return t->added[k];
    }
    char *raw = malloc(n + 1);
    if (!raw) return -1;
    uint32_t bad = 0;
    long r = bl_decode(token_text, n, raw, &bad);
    int id = r > 0 ? vocab_lookup(t, raw, (size_t)r) : -1;
    free(raw);
    return id;
}

/* ---------------------------------------------------------------- stream */

/* How many more bytes the UTF-8 prefix b[0 .. k) needs to become one
 * character: > 0 when it is a valid but incomplete prefix, else 0 (complete,
 * or invalid and so never worth waiting for). Follows table 3-7 like uni_decode. */
static size_t utf8_missing(const unsigned char *b, size_t k) {
    unsigned c = b[0], lo = 0x80, hi = 0xBF;
    size_t len;
    if (c >= 0xC2 && c <= 0xDF) len = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else {
        return 0;
    }
    if (k >= len) return 0;
    if (k >= 2 && (b[1] < lo || b[1] > hi)) return 0;
    for (size_t i = 2; i < k; i++)
        if ((b[i] & 0xC0) != 0x80) return 0;
    return len - k;
}

size_t tok_stream_put(const Tokenizer *t, TokStream *s, int id, char *out, size_t cap) {
    size_t len;
    const char *p = tok_piece(t, id, &len);
    if (!p) return 0;
    /* the bytes to print are pend ++ p; look at their last (up to 3) bytes */
    size_t total = (size_t)s->npend + len;
    unsigned char tail[3];
    size_t nt = total < 3 ? total : 3;
    for (size_t k = 0; k < nt; k++) {
        size_t at = total - nt + k;
        tail[k] = at < (size_t)s->npend ? s->pend[at] : (unsigned char)p[at - (size_t)s->npend];
    }
    /* hold back from the last byte that is not a continuation byte, if what
     * follows it is a valid start that is still missing bytes */
    size_t hold = 0;
    for (size_t k = nt; k-- > 0;) {
        if ((tail[k] & 0xC0) == 0x80) continue;
        if (utf8_missing(tail + k, nt - k)) hold = nt - k;
        break;
    }
    /* write pend ++ p minus the held tail, then keep that tail (<= 3 bytes) */
    size_t w = total - hold;
    if (w > cap) return (size_t)-1;
    size_t from_pend = w < (size_t)s->npend ? w : (size_t)s->npend;
    if (w) {
        memcpy(out, s->pend, from_pend);
        memcpy(out + from_pend, p, w - from_pend);
    }
    memcpy(s->pend, tail + nt - hold, hold);
    s->npend = (int)hold;
    return w;
}

size_t tok_stream_flush(TokStream *s, char *out, size_t cap) {
    size_t n = (size_t)s->npend;
    if (n > cap) return (size_t)-1;
    if (n) memcpy(out, s->pend, n);
    s->npend = 0;
    return n;
}
