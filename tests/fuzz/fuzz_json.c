/* fuzz_json.c: libFuzzer harness for format/json.c.
 *
 * Data flow: arbitrary bytes -> json_parse. Every loader's first step is
 * this parser, so it sees hostile text first. Beyond "no crash, no leak,
 * no undefined behaviour" (ASan + UBSan) it checks what json.h promises:
 *   - a failure leaves one non-empty line in err;
 *   - a success is a tree that survives a round trip: serialised back to
 *     JSON text (by the small writer below, numbers as "%.17g", which names
 *     every double exactly) and parsed again, it gives an equal tree: same
 *     types and order, numbers bit for bit, strings and keys byte for byte
 *     with their lengths (embedded NULs included) and NUL-terminated;
 *   - json_get finds each key at its last occurrence, json_at each item;
 *   - it accepts exactly the texts an independent recogniser of RFC 8259's
 *     grammar below accepts, with json.c's own rules on top: nesting up to
 *     256 deep, numbers of at most 63 characters that are finite doubles,
 *     no unpaired surrogate escapes, bytes >= 0x80 in strings taken as
 *     they are (json.h: "strict", "RFC 8259").
 * Built and run by `make fuzz` / `make fuzz-run` (tests/fuzz/run.sh).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/json.h"

/* Growable output buffer of the writer. */
typedef struct {
    char *p;
    size_t n, cap;
} Buf;

static void buf_put(Buf *b, const void *s, size_t n) {
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n) cap *= 2;
        b->p = realloc(b->p, cap);
        if (!b->p) abort();
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
}

/* A JSON string literal: '"', '\' and control bytes escaped, every other
 * byte as it is (the parser takes bytes that are not UTF-8 verbatim, so the
 * writer must give them back verbatim too). */
static void write_str(Buf *b, const char *s, size_t n) {
    buf_put(b, "\"", 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        char esc[8];
        if (c == '"' || c == '\\') {
            esc[0] = '\\', esc[1] = (char)c;
            buf_put(b, esc, 2);
        } else if (c < 0x20) {
            snprintf(esc, sizeof esc, "\\u%04x", c);
            buf_put(b, esc, 6);
        } else {
            buf_put(b, &s[i], 1);
        }
    }
    buf_put(b, "\"", 1);
}

static void write_json(Buf *b, const Json *j) {
    char num[64];
    switch (j->type) {
    case JSON_NULL: buf_put(b, "null", 4); break;
    case JSON_BOOL: j->boolean ? buf_put(b, "true", 4) : buf_put(b, "false", 5); break;
    case JSON_NUMBER: buf_put(b, num, (size_t)snprintf(num, sizeof num, "%.17g", j->number)); break;
    case JSON_STRING: write_str(b, j->str, j->len); break;
    case JSON_ARRAY:
    case JSON_OBJECT:
        buf_put(b, j->type == JSON_ARRAY ? "[" : "{", 1);
        for (size_t i = 0; i < j->len; i++) {
            if (i) buf_put(b, ",", 1);
            if (j->type == JSON_OBJECT) {
                write_str(b, j->keys[i], j->key_lens[i]);
                buf_put(b, ":", 1);
            }
            write_json(b, &j->items[i]);
        }
        buf_put(b, j->type == JSON_ARRAY ? "]" : "}", 1);
        break;
    }
}

/* Stops the run with a message libFuzzer shows next to the input. */
static void die(const char *what) {
    fprintf(stderr, "fuzz_json: property failed: %s\n", what);
    abort();
}

/* Checks what a parsed node promises on its own, then its children. */
static void check_node(const Json *j) {
    if (j->type == JSON_STRING && (!j->str || j->str[j->len] != 0)) die("string not NUL-terminated at len");
    if (j->type != JSON_ARRAY && j->type != JSON_OBJECT) return;
    for (size_t i = 0; i < j->len; i++) {
        if (json_at(j, i) != (j->type == JSON_ARRAY ? &j->items[i] : NULL)) die("json_at");
        check_node(&j->items[i]);
        if (j->type != JSON_OBJECT) continue;
        if (j->keys[i][j->key_lens[i]] != 0) die("key not NUL-terminated at its length");
        /* json_get compares up to the first NUL: only keys without one can be found by it */
        if (strlen(j->keys[i]) != j->key_lens[i]) continue;
        const Json *got = json_get(j, j->keys[i]);
        size_t last = j->len - 1;
        while (j->key_lens[last] != j->key_lens[i] || memcmp(j->keys[last], j->keys[i], j->key_lens[i]) != 0)
            last--;
        if (got != &j->items[last]) die("json_get does not find the last member with the key");
    }
    if (json_at(j, j->len) != NULL) die("json_at past the end");
}

static void same_tree(const Json *a, const Json *b) {
    if (a->type != b->type) die("type changed");
    switch (a->type) {
    case JSON_NULL: break;
    case JSON_BOOL:
        if (a->boolean != b->boolean) die("bool changed");
        break;
    case JSON_NUMBER:
        if (memcmp(&a->number, &b->number, sizeof a->number) != 0) die("number changed");
        break;
    case JSON_STRING:
        if (a->len != b->len || memcmp(a->str, b->str, a->len) != 0) die("string changed");
        break;
    case JSON_ARRAY:
    case JSON_OBJECT:
        if (a->len != b->len) die("element count changed");
        for (size_t i = 0; i < a->len; i++) {
            if (a->type == JSON_OBJECT &&
                (a->key_lens[i] != b->key_lens[i] || memcmp(a->keys[i], b->keys[i], a->key_lens[i]) != 0))
                die("key changed");
            same_tree(&a->items[i], &b->items[i]);
        }
        break;
    }
}

/* The reference recogniser: RFC 8259's grammar (section 2-7) written out
 * directly, sharing no code with json.c. Rec walks s[0 .. n). */
typedef struct {
    const unsigned char *s;
    size_t n, i;
} Rec;

static int rec_peek(const Rec *r) { return r->i < r->n ? r->s[r->i] : -1; }

static int rec_digit(const Rec *r) { return r->i < r->n && r->s[r->i] >= '0' && r->s[r->i] <= '9'; }

static void rec_ws(Rec *r) {
    while (rec_peek(r) == ' ' || rec_peek(r) == '\t' || rec_peek(r) == '\n' || rec_peek(r) == '\r') r->i++;
}

static int rec_hex4(Rec *r, unsigned *v) {
    *v = 0;
    for (int k = 0; k < 4; k++, r->i++) {
        int c = rec_peek(r);
        if (c >= '0' && c <= '9') *v = *v << 4 | (unsigned)(c - '0');
        else if ((c | 0x20) >= 'a' && (c | 0x20) <= 'f') *v = *v << 4 | (unsigned)((c | 0x20) - 'a' + 10);
        else return 0;
    }
    return 1;
}

static int rec_string(Rec *r) {
    r->i++; /* the opening quote */
    for (;;) {
        int c = rec_peek(r);
        r->i++;
        if (c < 0x20) return 0; /* the end (-1) or a control character */
        if (c == '"') return 1;
        if (c != '\\') continue;
        c = rec_peek(r);
        r->i++;
        if (c == '"' || c == '\\' || c == '/' || c == 'b' || c == 'f' || c == 'n' || c == 'r' || c == 't') continue;
        unsigned v;
        if (c != 'u' || !rec_hex4(r, &v) || (v >= 0xDC00 && v <= 0xDFFF)) return 0;
        if (v < 0xD800 || v > 0xDBFF) continue;
        /* a high surrogate: json.c wants its low half right after it */
        if (rec_peek(r) != '\\') return 0;
        r->i++;
        if (rec_peek(r) != 'u') return 0;
        r->i++;
        if (!rec_hex4(r, &v) || v < 0xDC00 || v > 0xDFFF) return 0;
    }
}

/* number = [ minus ] int [ frac ] [ exp ] */
static int rec_number(Rec *r) {
    size_t start = r->i;
    if (rec_peek(r) == '-') r->i++;
    if (!rec_digit(r)) return 0;
    if (rec_peek(r) == '0') r->i++;
    else
        while (rec_digit(r)) r->i++;
    if (rec_peek(r) == '.') {
        r->i++;
        if (!rec_digit(r)) return 0;
        while (rec_digit(r)) r->i++;
    }
    if (rec_peek(r) == 'e' || rec_peek(r) == 'E') {
        r->i++;
        if (rec_peek(r) == '+' || rec_peek(r) == '-') r->i++;
        if (!rec_digit(r)) return 0;
        while (rec_digit(r)) r->i++;
    }
    /* json.c's limits: 63 characters, and a value a double can hold */
    char buf[64];
    size_t l = r->i - start;
    if (l >= sizeof buf) return 0;
    memcpy(buf, r->s + start, l);
    buf[l] = 0;
    return isfinite(strtod(buf, NULL));
}

static int rec_lit(Rec *r, const char *lit) {
    size_t l = strlen(lit);
    if (r->n - r->i < l || memcmp(r->s + r->i, lit, l) != 0) return 0;
    r->i += l;
    return 1;
}

static int rec_value(Rec *r, int depth) {
    if (depth > 256) return 0; /* json.c's JSON_MAX_DEPTH */
    rec_ws(r);
    int c = rec_peek(r);
    if (c == '"') return rec_string(r);
    if (c == 't') return rec_lit(r, "true");
    if (c == 'f') return rec_lit(r, "false");
    if (c == 'n') return rec_lit(r, "null");
    if (c != '[' && c != '{') return rec_number(r);
    int close = c == '[' ? ']' : '}';
    r->i++;
    rec_ws(r);
    if (rec_peek(r) == close) return r->i++, 1;
    for (;;) {
        rec_ws(r);
        if (close == '}') {
            if (rec_peek(r) != '"' || !rec_string(r)) return 0;
            rec_ws(r);
            if (rec_peek(r) != ':') return 0;
            r->i++;
        }
        if (!rec_value(r, depth + 1)) return 0;
        rec_ws(r);
        c = rec_peek(r);
        r->i++;
        if (c == close) return 1;
        if (c != ',') return 0;
    }
}

static int rec_accepts(const uint8_t *s, size_t n) {
    Rec r = {s, n, 0};
    if (!rec_value(&r, 0)) return 0;
    rec_ws(&r);
    return r.i == n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[256] = "";
    Json *j = json_parse((const char *)data, size, err, sizeof err);
    if (!j != !rec_accepts(data, size)) {
        fprintf(stderr, "json_parse: %s\n", j ? "accepted" : err);
        die(j ? "json_parse accepts a text the grammar refuses" : "json_parse refuses a text the grammar accepts");
    }
    if (!j) {
        if (!err[0] || strpbrk(err, "\r\n")) die("error is not one non-empty line");
        return 0;
    }
    check_node(j);
    Buf b = {0};
    write_json(&b, j);
    char err2[256] = "";
    Json *k = json_parse(b.p, b.n, err2, sizeof err2);
    if (!k) {
        fprintf(stderr, "reparse failed: %s\ntext: %.*s\n", err2, (int)(b.n < 2000 ? b.n : 2000), b.p);
        die("the serialised tree does not parse");
    }
    same_tree(j, k);
    json_free(k);
    json_free(j);
    free(b.p);
    return 0;
}
