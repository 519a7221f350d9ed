/* kv.c: scheme registry, "-kv" parsing, stream and cache bookkeeping, and
 * the reference score/accumulate path that every fast path is tested against.
 *
 * Sits between attn/ (which calls kv_score / kv_accum) and the per-scheme
 * files kv/<scheme>.c (which fill in a KVScheme). Adding a scheme means one
 * file plus one line in kv_schemes[] below. The cache is a KVStream per
 * layer, kv head and role (kv.h draws it); each stream's bytes belong to
 * its scheme. The table follows ggml's type traits: dequant is the
 * mandatory reference, score / accum optional fast paths.
 */
#include "kv/kv.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern const KVScheme kv_f32, kv_f16;
extern const KVScheme kv_q8, kv_q4;
extern const KVScheme kv_q4h, kv_tbq4, kv_tbq3, kv_tbq2, kv_polar4, kv_lm3;
extern const KVScheme kv_kivi2, kv_kivi4;

const KVScheme *const kv_schemes[] = {
    &kv_f32,
    &kv_f16,
    &kv_q8,
    &kv_q4,
    &kv_q4h,
    &kv_tbq4,
    &kv_tbq3,
    &kv_tbq2,
    &kv_polar4,
    &kv_lm3,
    &kv_kivi2,
    &kv_kivi4,
};
const int kv_n_schemes = (int)(sizeof kv_schemes / sizeof kv_schemes[0]);

const KVScheme *kv_find(const char *name) {
    for (int i = 0; i < kv_n_schemes; i++)
        if (strcmp(kv_schemes[i]->name, name) == 0) return kv_schemes[i];
    return NULL;
}

/* One "name[:gN][:rN]" item of a -kv spec. */
static int parse_one(const char *s, size_t n, const KVScheme **sc, KVOpts *o, char *err, size_t errlen) {
    char buf[64];
    if (n == 0 || n >= sizeof buf) {
        snprintf(err, errlen, "-kv: expected a scheme name, found '%.*s'", (int)(n < 60 ? n : 60), s);
        return -1;
    }
    memcpy(buf, s, n);
    buf[n] = 0;
    memset(o, 0, sizeof *o);
    char *save = NULL, *tok = strtok_r(buf, ":", &save);
    /* llama.cpp's names for the same formats (--cache-type-k q8_0) */
    static const char *const alias[][2] = {{"q8_0", "q8"}, {"q4_0", "q4"}};
    for (size_t i = 0; tok && i < sizeof alias / sizeof *alias; i++)
        if (strcmp(tok, alias[i][0]) == 0) tok = (char *)alias[i][1];
    *sc = tok ? kv_find(tok) : NULL;
    if (!*sc) {
        char names[512] = "";
        for (int i = 0; i < kv_n_schemes; i++) {
            strncat(names, kv_schemes[i]->name, sizeof names - strlen(names) - 1);
            if (i + 1 < kv_n_schemes) strncat(names, " ", sizeof names - strlen(names) - 1);
        }
        snprintf(err, errlen, "-kv: unknown scheme '%s' (expected one of: %s)", tok ? tok : "", names);
        return -1;
    }
    while ((tok = strtok_r(NULL, ":", &save))) {
        char *end;
        long v = strtol(tok + 1, &end, 10);
        if ((tok[0] != 'g' && tok[0] != 'r') || *end || end == tok + 1 || v < 1 || v > 65536) {
            snprintf(err, errlen, "-kv %s: expected option gN or rN (N in 1..65536), found '%s'", (*sc)->name, tok);
            return -1;
        }
        if (tok[0] == 'g') o->group = (int)v;
        else o->residual = (int)v;
    }
    return 0;
}

/* "name" uses one scheme for K and V; "kname/vname" one each. */
int kv_spec_parse(const char *s, KVSpec *spec, char *err, size_t errlen) {
    /* "k/v": a comma is what separates specs in a list (-m compare) */
    const char *slash = strchr(s, '/');
    if (strchr(s, ',')) {
        snprintf(err, errlen, "-kv: expected SCHEME or KSCHEME/VSCHEME, found '%s' (a comma separates schemes to "
                 "compare)", s);
        return -1;
    }
    if (!slash) {
        if (parse_one(s, strlen(s), &spec->k, &spec->ko, err, errlen)) return -1;
        spec->v = spec->k;
        spec->vo = spec->ko;
        return 0;
    }
    if (strchr(slash + 1, '/')) {
        snprintf(err, errlen, "-kv: expected SCHEME or KSCHEME/VSCHEME, found '%s'", s);
        return -1;
    }
    if (parse_one(s, (size_t)(slash - s), &spec->k, &spec->ko, err, errlen)) return -1;
    return parse_one(slash + 1, strlen(slash + 1), &spec->v, &spec->vo, err, errlen);
}

static void one_name(const KVScheme *sc, const KVOpts *o, char *out, size_t n) {
    int w = snprintf(out, n, "%s", sc->name);
    if (o->group && w >= 0 && (size_t)w < n) w += snprintf(out + w, n - (size_t)w, ":g%d", o->group);
    if (o->residual && w >= 0 && (size_t)w < n) snprintf(out + w, n - (size_t)w, ":r%d", o->residual);
}

void kv_spec_name(const KVSpec *spec, char *out, size_t n) {
    char a[64], b[64];
    one_name(spec->k, &spec->ko, a, sizeof a);
    one_name(spec->v, &spec->vo, b, sizeof b);
    if (strcmp(a, b) == 0) snprintf(out, n, "%s", a);
    else snprintf(out, n, "%s/%s", a, b);
}

int kv_stream_init(KVStream *s, const KVScheme *sc, const KVOpts *o, int d, int cap, int layer, int role,
                   char *err, size_t errlen) {
    memset(s, 0, sizeof *s);
    if (d < 1 || d > KV_MAX_DIM || cap < 1) {
        snprintf(err, errlen, "%s: expected head_dim in 1..%d and capacity >= 1, found %d and %d", sc->name,
                 KV_MAX_DIM, d, cap);
        return -1;
    }
    if (sc->check(d, o, err, errlen)) return -1;
    s->scheme = sc;
    s->opts = *o;
    s->d = d;
    s->cap = cap;
    s->layer = layer;
    s->role = role;
    return sc->init(s, err, errlen);
}

void kv_stream_free(KVStream *s) {
    if (s->scheme) s->scheme->free(s);
    memset(s, 0, sizeof *s);
}

/* The scheme writes position s->len; the count is kept here, once. */
void kv_stream_append(KVStream *s, const float *x) {
    s->scheme->append(s, x);
    s->len++;
}

/* Rollback (speculative decoding) goes back at most KV_MAX_ROLLBACK
 * positions, which is all a windowed scheme keeps floats for; 0 empties. */
int kv_stream_truncate(KVStream *s, int n) {
    if (n < 0 || n > s->len || (n != 0 && n < s->len - KV_MAX_ROLLBACK)) return -1;
    s->scheme->truncate(s, n);
    s->len = n;
    return 0;
}

/* A span scheme's saved positions are a byte range of its data; the
 * others count and write their own form. */
size_t kv_stream_save_bytes(const KVStream *s, int t0, int t1) {
    const KVScheme *sc = s->scheme;
    return sc->span ? sc->span(s, t1) - sc->span(s, t0) : sc->save_bytes(s, t0, t1);
}

void kv_stream_save(const KVStream *s, int t0, uint8_t *out) {
    const KVScheme *sc = s->scheme;
    if (sc->span) memcpy(out, s->data + sc->span(s, t0), sc->span(s, s->len) - sc->span(s, t0));
    else sc->save(s, t0, out);
}

int kv_stream_load(KVStream *s, int len, const uint8_t *in) {
    const KVScheme *sc = s->scheme;
    if (len < s->len || len > s->cap || s->len % KV_SAVE_ALIGN) return -1;
    if (sc->span) memcpy(s->data + sc->span(s, s->len), in, sc->span(s, len) - sc->span(s, s->len));
    else sc->load(s, len, in);
    s->len = len;
    return 0;
}

void kv_to_domain(const KVStream *s, const float *x, float *y) {
    if (s->scheme->to_domain) s->scheme->to_domain(s, x, y);
    else if (y != x) memcpy(y, x, (size_t)s->d * sizeof(float));
}

void kv_from_domain(const KVStream *s, const float *y, float *x) {
    if (s->scheme->from_domain) s->scheme->from_domain(s, y, x);
    else if (y != x) memcpy(x, y, (size_t)s->d * sizeof(float));
}

/* Rotation first, then the product, as kv.h promises: the same bits as
 * kv_to_domain followed by a multiply. */
void kv_to_domain_scaled(const KVStream *s, const float *x, float a, float *y) {
    if (s->scheme->to_domain) {
        s->scheme->to_domain(s, x, y);
        for (int j = 0; j < s->d; j++) y[j] *= a;
    } else {
        for (int j = 0; j < s->d; j++) y[j] = x[j] * a;
    }
}

/* The product first (in place in y), then the rotation back. */
void kv_from_domain_scaled(const KVStream *s, float *y, float a, float *x) {
    if (s->scheme->from_domain) {
        for (int j = 0; j < s->d; j++) y[j] *= a;
        s->scheme->from_domain(s, y, x);
    } else {
        for (int j = 0; j < s->d; j++) x[j] = y[j] * a;
    }
}

void kv_stream_get(const KVStream *s, int t, float *out) {
    float tmp[KV_MAX_DIM];
    s->scheme->dequant(s, t, tmp);
    kv_from_domain(s, tmp, out);
}

/* Reference score: dequantize each position, then a plain dot product. */
void kv_score_ref(const KVStream *s, const float *q, int nq, int t0, int t1, float *out, int ldo) {
    float k[KV_MAX_DIM];
    for (int t = t0; t < t1; t++) {
        s->scheme->dequant(s, t, k);
        for (int i = 0; i < nq; i++) {
            const float *qi = q + (size_t)i * s->d;
            float acc = 0;
            for (int j = 0; j < s->d; j++) acc += qi[j] * k[j];
            out[(size_t)i * ldo + (t - t0)] = acc;
        }
    }
}

void kv_accum_ref(const KVStream *s, const float *p, int ldp, int nq, int t0, int t1, float *acc) {
    float v[KV_MAX_DIM];
    for (int t = t0; t < t1; t++) {
        s->scheme->dequant(s, t, v);
        for (int i = 0; i < nq; i++) {
            float w = p[(size_t)i * ldp + (t - t0)];
            float *ai = acc + (size_t)i * s->d;
            for (int j = 0; j < s->d; j++) ai[j] += w * v[j];
        }
    }
}

void kv_score(const KVStream *s, const float *q, int nq, int t0, int t1, float *out, int ldo) {
    if (s->scheme->score) s->scheme->score(s, q, nq, t0, t1, out, ldo);
    else kv_score_ref(s, q, nq, t0, t1, out, ldo);
}

void kv_accum(const KVStream *s, const float *p, int ldp, int nq, int t0, int t1, float *acc) {
    if (s->scheme->accum) s->scheme->accum(s, p, ldp, nq, t0, t1, acc);
    else kv_accum_ref(s, p, ldp, nq, t0, t1, acc);
}

/* Two streams per layer and kv head, each sized for cap positions up
 * front: nothing allocates while the model runs. */
int kv_cache_init(KVCache *c, const KVSpec *spec, int n_layers, int n_kv, int d, int cap,
                  char *err, size_t errlen) {
    memset(c, 0, sizeof *c);
    c->spec = *spec;
    c->n_layers = n_layers;
    c->n_kv = n_kv;
    c->d = d;
    c->cap = cap;
    size_t ns = (size_t)n_layers * (size_t)n_kv;
    c->k = calloc(ns, sizeof(KVStream));
    c->v = calloc(ns, sizeof(KVStream));
    if (!c->k || !c->v) {
        snprintf(err, errlen, "kv cache: out of memory for %zu streams", 2 * ns);
        kv_cache_free(c);
        return -1;
    }
    for (int l = 0; l < n_layers; l++)
        for (int h = 0; h < n_kv; h++) {
            char e[200];
            if (kv_stream_init(kv_k(c, l, h), spec->k, &spec->ko, d, cap, l, 0, e, sizeof e) ||
                kv_stream_init(kv_v(c, l, h), spec->v, &spec->vo, d, cap, l, 1, e, sizeof e)) {
                snprintf(err, errlen, "kv cache (%d positions): %s", cap, e);
                kv_cache_free(c);
                return -1;
            }
        }
    return 0;
}

void kv_cache_free(KVCache *c) {
    if (c->dev) c->dev_free(c->dev);
    size_t ns = (size_t)c->n_layers * (size_t)c->n_kv;
    for (size_t i = 0; i < ns; i++) {
        if (c->k) kv_stream_free(&c->k[i]);
        if (c->v) kv_stream_free(&c->v[i]);
    }
    free(c->k);
    free(c->v);
    free(c->state);
    memset(c, 0, sizeof *c);
}

/* Every stream holds the same positions: the first one speaks for all. */
int kv_cache_len(const KVCache *c) { return c->dev ? c->dev_len : c->k ? c->k[0].len : 0; }

int kv_cache_truncate(KVCache *c, int n) {
    if (c->dev) {
        /* f32 and f16 rows past n are simply written again */
        if (n < 0 || n > c->dev_len || (n != 0 && n < c->dev_len - KV_MAX_ROLLBACK)) return -1;
        c->dev_len = n;
        return 0;
    }
    size_t ns = (size_t)c->n_layers * (size_t)c->n_kv;
    if (ns == 0 || n < 0 || n > c->k[0].len || (n != 0 && n < c->k[0].len - KV_MAX_ROLLBACK)) return -1;
    for (size_t i = 0; i < ns; i++) {
        kv_stream_truncate(&c->k[i], n);
        kv_stream_truncate(&c->v[i], n);
    }
    if (n == 0 && c->state) memset(c->state, 0, c->state_floats * sizeof(float));
    return 0;
}

size_t kv_cache_state_bytes(const KVCache *c) { return c->state_floats * sizeof(float); }

size_t kv_cache_bytes(const KVCache *c) {
    if (c->dev) return c->dev_bytes;
    size_t ns = (size_t)c->n_layers * (size_t)c->n_kv, b = 0;
    for (size_t i = 0; i < ns; i++) b += c->k[i].scheme->bytes(&c->k[i]) + c->v[i].scheme->bytes(&c->v[i]);
    return b;
}

size_t kv_cache_save_bytes(const KVCache *c, int t0, int t1) {
    size_t ns = (size_t)c->n_layers * (size_t)c->n_kv, b = c->state_floats * sizeof(float);
    for (size_t i = 0; i < ns; i++) b += kv_stream_save_bytes(&c->k[i], t0, t1) + kv_stream_save_bytes(&c->v[i], t0, t1);
    return b;
}

/* The blob is the streams in cache order, then the state: both sides
 * compute every part's size from (t0, len), so no sizes are stored. */
int kv_cache_save(const KVCache *c, int t0, uint8_t *out, size_t n, char *err, size_t errlen) {
    const int len = kv_cache_len(c);
    if (c->dev || !c->k || t0 < 0 || t0 > len || t0 % KV_SAVE_ALIGN) {
        snprintf(err, errlen, "kv save: expected a CPU cache and an aligned start in [0, %d], found %s and %d", len,
                 c->dev ? "a GPU cache" : "a CPU cache", t0);
        return -1;
    }
    if (n != kv_cache_save_bytes(c, t0, len)) {
        snprintf(err, errlen, "kv save: expected a buffer of %zu bytes, found %zu", kv_cache_save_bytes(c, t0, len), n);
        return -1;
    }
    size_t ns = (size_t)c->n_layers * (size_t)c->n_kv;
    for (size_t i = 0; i < ns; i++) {
        kv_stream_save(&c->k[i], t0, out);
        out += kv_stream_save_bytes(&c->k[i], t0, len);
        kv_stream_save(&c->v[i], t0, out);
        out += kv_stream_save_bytes(&c->v[i], t0, len);
    }
    if (c->state) memcpy(out, c->state, c->state_floats * sizeof(float));
    return 0;
}

int kv_cache_load(KVCache *c, int len, const uint8_t *in, size_t n, char *err, size_t errlen) {
    const int t0 = kv_cache_len(c);
    if (c->dev || !c->k || len < t0 || len > c->cap || t0 % KV_SAVE_ALIGN) {
        snprintf(err, errlen, "kv load: expected a CPU cache at an aligned length and an end in [%d, %d], found %s at "
                 "%d and %d", t0, c->cap, c->dev ? "a GPU cache" : "a CPU cache", t0, len);
        return -1;
    }
    if (n != kv_cache_save_bytes(c, t0, len)) {
        snprintf(err, errlen, "kv load: expected %zu bytes for positions [%d, %d), found %zu",
                 kv_cache_save_bytes(c, t0, len), t0, len, n);
        return -1;
    }
    /* every check is done: the loads below cannot fail */
    size_t ns = (size_t)c->n_layers * (size_t)c->n_kv;
    for (size_t i = 0; i < ns; i++) {
        size_t kb = kv_stream_save_bytes(&c->k[i], t0, len), vb = kv_stream_save_bytes(&c->v[i], t0, len);
        kv_stream_load(&c->k[i], len, in);
        kv_stream_load(&c->v[i], len, in + kb);
        in += kb + vb;
    }
    if (c->state) memcpy(c->state, in, c->state_floats * sizeof(float));
    return 0;
}
