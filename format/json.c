/* json.c: recursive-descent JSON parser (see json.h for the contract).
 *
 * Data flow: beside the main chain (run.c -> model -> attn -> kv ->
 * kernels): text from format/file.c -> json_parse -> a tree of Json nodes
 * that model/config.c, tokenizer/ and format/safetensors.c walk; json_write_str
 * writes strings back (safetensors headers). Follows RFC 8259. */
#include "format/json.h"
#include "format/file.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define JSON_MAX_DEPTH 256

typedef struct {
    const char *s;
    size_t n, i;
    char *err;
    size_t errlen;
    int failed;
} Parser;

static void fail(Parser *p, const char *what) {
    if (!p->failed && p->err) snprintf(p->err, p->errlen, "%s at byte %zu", what, p->i);
    p->failed = 1;
}

static void skip_ws(Parser *p) {
    while (p->i < p->n) {
        char c = p->s[p->i];
        if (c == ' ' || c == '\t' || c == '\n' || c == '\r') p->i++;
        else break;
    }
}

static int hex4(Parser *p, unsigned *out) {
    if (p->n - p->i < 4) { fail(p, "truncated \\u escape"); return 0; }
    unsigned v = 0;
    for (int k = 0; k < 4; k++) {
        char c = p->s[p->i + k];
        v <<= 4;
        if (c >= '0' && c <= '9') v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f') v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') v |= (unsigned)(c - 'A' + 10);
        else { fail(p, "bad hex digit in \\u escape"); return 0; }
    }
    p->i += 4;
    *out = v;
    return 1;
}

static size_t put_utf8(char *o, unsigned cp) {
    if (cp < 0x80) { o[0] = (char)cp; return 1; }
    if (cp < 0x800) { o[0] = (char)(0xC0 | (cp >> 6)); o[1] = (char)(0x80 | (cp & 0x3F)); return 2; }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12)); o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F)); return 3;
    }
    o[0] = (char)(0xF0 | (cp >> 18)); o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F)); o[3] = (char)(0x80 | (cp & 0x3F)); return 4;
}

/* Parses a string starting at the opening quote. The decoded form is never
 * longer than the escaped source, so one allocation of the source span suffices. */
static char *parse_string(Parser *p, size_t *len) {
    p->i++; /* opening quote */
    size_t start = p->i, end = start;
    while (end < p->n && p->s[end] != '"') {
        if (p->s[end] == '\\') end++;
        end++;
    }
    if (end >= p->n) { fail(p, "unterminated string"); return NULL; }
    char *out = malloc(end - start + 1);
    if (!out) { fail(p, "out of memory"); return NULL; }
    size_t o = 0;
    while (p->i < end) {
        unsigned char c = (unsigned char)p->s[p->i];
        if (c < 0x20) { fail(p, "control character in string"); free(out); return NULL; }
        if (c != '\\') { out[o++] = (char)c; p->i++; continue; }
        p->i++;
        char e = p->s[p->i++];
        switch (e) {
        case '"': out[o++] = '"'; break;
        case '\\': out[o++] = '\\'; break;
        case '/': out[o++] = '/'; break;
        case 'b': out[o++] = '\b'; break;
        case 'f': out[o++] = '\f'; break;
        case 'n': out[o++] = '\n'; break;
        case 'r': out[o++] = '\r'; break;
        case 't': out[o++] = '\t'; break;
        case 'u': {
            unsigned cp;
            if (!hex4(p, &cp)) { free(out); return NULL; }
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                unsigned lo;
                if (p->i + 2 <= end && p->s[p->i] == '\\' && p->s[p->i + 1] == 'u') {
                    p->i += 2;
                    if (!hex4(p, &lo)) { free(out); return NULL; }
                    if (lo < 0xDC00 || lo > 0xDFFF) { fail(p, "unpaired surrogate"); free(out); return NULL; }
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                } else { fail(p, "unpaired surrogate"); free(out); return NULL; }
            } else if (cp >= 0xDC00 && cp <= 0xDFFF) { fail(p, "unpaired surrogate"); free(out); return NULL; }
            /* a \u escape of up to 6 source bytes yields at most 4 output bytes */
            o += put_utf8(out + o, cp);
            break;
        }
        default: fail(p, "bad escape in string"); free(out); return NULL;
        }
    }
    p->i = end + 1;
    out[o] = 0;
    *len = o;
    return out;
}

static int parse_value(Parser *p, Json *v, int depth);

static int grow(Parser *p, Json **items, char ***keys, size_t **klens, size_t *cap, size_t need) {
    if (need <= *cap) return 1;
    size_t nc = *cap ? *cap * 2 : 4;
    Json *ni = realloc(*items, nc * sizeof(Json));
    if (!ni) { fail(p, "out of memory"); return 0; }
    *items = ni;
    if (keys) {
        char **nk = realloc(*keys, nc * sizeof(char *));
        if (!nk) { fail(p, "out of memory"); return 0; }
        *keys = nk;
        size_t *nl = realloc(*klens, nc * sizeof(size_t));
        if (!nl) { fail(p, "out of memory"); return 0; }
        *klens = nl;
    }
    *cap = nc;
    return 1;
}

static void free_children(Json *j);

static int parse_container(Parser *p, Json *v, int depth, int is_obj) {
    char close = is_obj ? '}' : ']';
    v->type = is_obj ? JSON_OBJECT : JSON_ARRAY;
    p->i++;
    size_t cap = 0;
    skip_ws(p);
    if (p->i < p->n && p->s[p->i] == close) { p->i++; return 1; }
    for (;;) {
        if (!grow(p, &v->items, is_obj ? &v->keys : NULL, is_obj ? &v->key_lens : NULL, &cap, v->len + 1))
            return 0;
        skip_ws(p);
        if (is_obj) {
            if (p->i >= p->n || p->s[p->i] != '"') { fail(p, "expected string key"); return 0; }
            size_t kl;
            char *k = parse_string(p, &kl);
            if (!k) return 0;
            v->keys[v->len] = k;
            v->key_lens[v->len] = kl;
            skip_ws(p);
            if (p->i >= p->n || p->s[p->i] != ':') { free(k); fail(p, "expected ':'"); return 0; }
            p->i++;
        }
        memset(&v->items[v->len], 0, sizeof(Json));
        if (!parse_value(p, &v->items[v->len], depth + 1)) {
            free_children(&v->items[v->len]);
            if (is_obj) free(v->keys[v->len]);
            return 0;
        }
        v->len++;
        skip_ws(p);
        if (p->i >= p->n) { fail(p, "unexpected end of input"); return 0; }
        if (p->s[p->i] == ',') { p->i++; continue; }
        if (p->s[p->i] == close) { p->i++; return 1; }
        fail(p, is_obj ? "expected ',' or '}'" : "expected ',' or ']'");
        return 0;
    }
}

/* Digits at p->i onward; how many. */
static size_t digits(Parser *p) {
    size_t k = 0;
    while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9') p->i++, k++;
    return k;
}

/* RFC 8259's grammar, checked before strtod (which would also take "01",
 * "1." or ".5"): -? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)? */
static int parse_number(Parser *p, Json *v) {
    size_t st = p->i;
    if (p->i < p->n && p->s[p->i] == '-') p->i++;
    size_t lead = p->i, nd = digits(p);
    if (nd == 0 || (nd > 1 && p->s[lead] == '0')) { p->i = st; fail(p, "bad number"); return 0; }
    if (p->i < p->n && p->s[p->i] == '.') {
        p->i++;
        if (!digits(p)) { p->i = st; fail(p, "bad number"); return 0; }
    }
    if (p->i < p->n && (p->s[p->i] == 'e' || p->s[p->i] == 'E')) {
        p->i++;
        if (p->i < p->n && (p->s[p->i] == '+' || p->s[p->i] == '-')) p->i++;
        if (!digits(p)) { p->i = st; fail(p, "bad number"); return 0; }
    }
    char buf[64];
    size_t l = p->i - st;
    if (l >= sizeof buf) { fail(p, "number too long"); return 0; }
    memcpy(buf, p->s + st, l);
    buf[l] = 0;
    char *endp;
    errno = 0;
    double d = strtod(buf, &endp);
    if (*endp != 0 || !isfinite(d)) { p->i = st; fail(p, "bad number"); return 0; }
    v->type = JSON_NUMBER;
    v->number = d;
    return 1;
}

static int parse_lit(Parser *p, const char *lit) {
    size_t l = strlen(lit);
    if (p->n - p->i < l || memcmp(p->s + p->i, lit, l) != 0) { fail(p, "unexpected token"); return 0; }
    p->i += l;
    return 1;
}

static int parse_value(Parser *p, Json *v, int depth) {
    if (depth > JSON_MAX_DEPTH) { fail(p, "nesting too deep"); return 0; }
    skip_ws(p);
    if (p->i >= p->n) { fail(p, "unexpected end of input"); return 0; }
    char c = p->s[p->i];
    switch (c) {
    case '{': return parse_container(p, v, depth, 1);
    case '[': return parse_container(p, v, depth, 0);
    case '"':
        v->type = JSON_STRING;
        v->str = parse_string(p, &v->len);
        return v->str != NULL;
    case 't': v->type = JSON_BOOL; v->boolean = 1; return parse_lit(p, "true");
    case 'f': v->type = JSON_BOOL; v->boolean = 0; return parse_lit(p, "false");
    case 'n': v->type = JSON_NULL; return parse_lit(p, "null");
    default: return parse_number(p, v);
    }
}

static void free_children(Json *j) {
    if (j->type == JSON_STRING) free(j->str);
    if (j->type == JSON_ARRAY || j->type == JSON_OBJECT) {
        for (size_t i = 0; i < j->len; i++) {
            free_children(&j->items[i]);
            if (j->keys) free(j->keys[i]);
        }
        free(j->items);
        free(j->keys);
        free(j->key_lens);
    }
}

Json *json_parse(const char *text, size_t n, char *err, size_t errlen) {
    Parser p = {text, n, 0, err, errlen, 0};
    Json *root = calloc(1, sizeof(Json));
    if (!root) { fail(&p, "out of memory"); return NULL; }
    if (parse_value(&p, root, 0)) {
        skip_ws(&p);
        if (p.i == n) return root;
        fail(&p, "trailing characters after JSON value");
    }
    free_children(root);
    free(root);
    return NULL;
}

Json *json_parse_file(const char *path, size_t max, char *err, size_t errlen) {
    size_t len;
    char *buf = file_read(path, max, &len, err, errlen);
    if (!buf) return NULL;
    char perr[200];
    Json *j = json_parse(buf, len, perr, sizeof perr);
    free(buf);
    if (!j) snprintf(err, errlen, "%s: malformed JSON: %s", path, perr);
    return j;
}

void json_free(Json *j) {
    if (!j) return;
    free_children(j);
    free(j);
}

const Json *json_get(const Json *o, const char *key) {
    if (!o || o->type != JSON_OBJECT) return NULL;
    /* the last of repeated keys, as Python's json (and so transformers'
     * config loading) and serde's maps take it */
    size_t kl = strlen(key);
    for (size_t i = o->len; i-- > 0;)
        if (o->key_lens[i] == kl && memcmp(o->keys[i], key, kl) == 0) return &o->items[i];
    return NULL;
}

const Json *json_at(const Json *a, size_t i) {
    if (!a || a->type != JSON_ARRAY || i >= a->len) return NULL;
    return &a->items[i];
}

int json_get_int(const Json *o, const char *key, long lo, long hi, long *out) {
    const Json *v = json_get(o, key);
    if (!v || v->type != JSON_NUMBER) return 0;
    /* (double)LONG_MAX rounds up to 2^63: keep the cast below defined */
    if (v->number != floor(v->number) || v->number < -0x1p62 || v->number > 0x1p62 || v->number < (double)lo ||
        v->number > (double)hi)
        return 0;
    *out = (long)v->number;
    return 1;
}

int json_get_num(const Json *o, const char *key, double *out) {
    const Json *v = json_get(o, key);
    if (!v || v->type != JSON_NUMBER) return 0;
    *out = v->number;
    return 1;
}

int json_get_bool(const Json *o, const char *key, int *out) {
    const Json *v = json_get(o, key);
    if (!v || v->type != JSON_BOOL) return 0;
    *out = v->boolean;
    return 1;
}

const char *json_get_str(const Json *o, const char *key) {
    const Json *v = json_get(o, key);
    return v && v->type == JSON_STRING ? v->str : NULL;
}

void json_write_str(FILE *f, const char *s, size_t n) {
    fputc('"', f);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c == '\n') fputs("\\n", f);
        else if (c < 0x20) fprintf(f, "\\u%04x", c);
        else fputc(c, f);
    }
    fputc('"', f);
}

const char *json_type_name(JsonType t) {
    static const char *names[] = {"null", "bool", "number", "string", "array", "object"};
    return names[t];
}
