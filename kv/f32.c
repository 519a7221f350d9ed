/* f32.c: the reference KV scheme, one float per value, nothing lost.
 * Every other scheme is measured against it.
 *
 * Data flow: attn/ -> kv_score / kv_accum (kv.c) -> f32_score / f32_accum
 * here -> kernels/vec.c's dot and axpy, one cached vector and head at a
 * time; append copies x [d] as it is.
 *
 *   stream: | f32 x[d] | f32 x[d] | ...   4·d bytes per position
 *
 * The simplest implementation of kv.h's table: read it first.
 */
#include "kernels/vec.h"
#include "kv/kv.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static double f32_bits(int d, const KVOpts *o) { (void)d; (void)o; return 32; }

static int f32_check(int d, const KVOpts *o, char *err, size_t errlen) {
    if (o->group || o->residual) {
        snprintf(err, errlen, "f32: takes no options (found g/r)");
        return -1;
    }
    (void)d;
    return 0;
}

static int f32_init(KVStream *s, char *err, size_t errlen) {
    s->data = malloc((size_t)s->cap * s->d * sizeof(float));
    if (!s->data) { snprintf(err, errlen, "f32: out of memory for %d positions", s->cap); return -1; }
    return 0;
}

static void f32_free(KVStream *s) { free(s->data); }

static const float *row(const KVStream *s, int t) { return (const float *)s->data + (size_t)t * s->d; }

static void f32_append(KVStream *s, const float *x) {
    memcpy((float *)s->data + (size_t)s->len * s->d, x, (size_t)s->d * sizeof(float));
}

/* Nothing beyond len is ever read, so truncation is only bookkeeping. */
static void f32_truncate(KVStream *s, int n) { (void)s; (void)n; }

static void f32_dequant(const KVStream *s, int t, float *out) { memcpy(out, row(s, t), (size_t)s->d * sizeof(float)); }

static void f32_score(const KVStream *s, const float *q, int nq, int t0, int t1, float *out, int ldo) {
    for (int t = t0; t < t1; t++)
        for (int i = 0; i < nq; i++) out[(size_t)i * ldo + (t - t0)] = vec_dot_f32(q + (size_t)i * s->d, row(s, t), s->d);
}

static void f32_accum(const KVStream *s, const float *p, int ldp, int nq, int t0, int t1, float *acc) {
    for (int t = t0; t < t1; t++)
        for (int i = 0; i < nq; i++) vec_axpy_f32(acc + (size_t)i * s->d, p[(size_t)i * ldp + (t - t0)], row(s, t), s->d);
}

static size_t f32_bytes(const KVStream *s) { return (size_t)s->cap * s->d * sizeof(float); }
static size_t f32_span(const KVStream *s, int t) { return (size_t)t * s->d * sizeof(float); }

const KVScheme kv_f32 = {
    .name = "f32", .desc = "float32, the reference",
    .bits = f32_bits, .check = f32_check, .init = f32_init, .free = f32_free,
    .append = f32_append, .truncate = f32_truncate, .dequant = f32_dequant,
    .score = f32_score, .accum = f32_accum, .bytes = f32_bytes, .span = f32_span,
};
