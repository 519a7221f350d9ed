/* f16.c: IEEE half precision, llama.cpp's default KV type.
 *
 * Data flow: attn/ -> kv_score / kv_accum (kv.c) -> f16_score / f16_accum
 * here -> kv/tile512.h's AVX-512 loops, or kernels/vec.c; append narrows
 * each K or V vector x [d] with vec_f32_to_f16.
 *
 *   stream: | f16 x[d] | f16 x[d] | ...   2·d bytes per position
 *
 * Narrowing rounds to nearest even (kernels/half.h, IEEE 754 binary16);
 * scores and the value sum widen each half in registers (F16C), never into
 * a float buffer: AVX-512 tiles (kv/tile512.h) where the CPU has them,
 * else kernels/vec.c (always, on other CPUs than x86-64).
 */
#include "kernels/vec.h"
#include "kernels/half.h"
#include "kernels/matmul.h"
#include "kv/kv.h"

#include <stdio.h>
#include <stdlib.h>

static double f16_bits(int d, const KVOpts *o) { (void)d; (void)o; return 16; }

static int f16_check(int d, const KVOpts *o, char *err, size_t errlen) {
    if (o->group || o->residual) {
        snprintf(err, errlen, "f16: takes no options (found g/r)");
        return -1;
    }
    (void)d;
    return 0;
}

/* On a 64-byte line: malloc's large blocks sit 16 bytes into a page, which
 * splits half of the 32-byte loads across two lines
 * (docs/kernel-notes.md#f16-alignment). */
static int f16_init(KVStream *s, char *err, size_t errlen) {
    s->data = aligned_alloc(64, ((size_t)s->cap * s->d * sizeof(uint16_t) + 63) & ~(size_t)63);
    if (!s->data) { snprintf(err, errlen, "f16: out of memory for %d positions", s->cap); return -1; }
    return 0;
}

static void f16_free(KVStream *s) { free(s->data); }

static const uint16_t *row(const KVStream *s, int t) { return (const uint16_t *)s->data + (size_t)t * s->d; }

static void f16_append(KVStream *s, const float *x) {
    vec_f32_to_f16((uint16_t *)s->data + (size_t)s->len * s->d, x, s->d);
}

static void f16_truncate(KVStream *s, int n) { (void)s; (void)n; }

static void f16_dequant(const KVStream *s, int t, float *out) {
    const uint16_t *h = row(s, t);
    for (int j = 0; j < s->d; j++) out[j] = f16_to_f32(h[j]);
}

/* One dot or axpy per position and head (kernels/vec.c, AVX2 or plain C). */
static void score_vec(const KVStream *s, const float *q, int nq, int t0, int t1, float *out, int ldo) {
    for (int t = t0; t < t1; t++)
        for (int i = 0; i < nq; i++) out[(size_t)i * ldo + (t - t0)] = vec_dot_f16(row(s, t), q + (size_t)i * s->d, s->d);
}

static void accum_vec(const KVStream *s, const float *p, int ldp, int nq, int t0, int t1, float *acc) {
    for (int t = t0; t < t1; t++)
        for (int i = 0; i < nq; i++) vec_axpy_f16(acc + (size_t)i * s->d, p[(size_t)i * ldp + (t - t0)], row(s, t), s->d);
}

#if defined(__x86_64__)
#include "kv/tile512.h"

TILE512 void widen32(const KVStream *s, int t, int j, __m512 *lo, __m512 *hi) {
    *lo = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(row(s, t) + j)));
    *hi = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(row(s, t) + j + 16)));
}

TILE512_KERNELS(widen32, (size_t)s->d * 2)

/* AVX-512 tiles (kv/tile512.h) where the CPU and d allow; else the vec
 * loops. */
static void f16_score(const KVStream *s, const float *q, int nq, int t0, int t1, float *out, int ldo) {
    if (kernels_level() >= 2 && s->d % 32 == 0) score512(s, q, nq, t0, t1, out, ldo);
    else score_vec(s, q, nq, t0, t1, out, ldo);
}

static void f16_accum(const KVStream *s, const float *p, int ldp, int nq, int t0, int t1, float *acc) {
    if (kernels_level() >= 2 && s->d % 128 == 0) accum512(s, p, ldp, nq, t0, t1, acc);
    else accum_vec(s, p, ldp, nq, t0, t1, acc);
}
#else
static void f16_score(const KVStream *s, const float *q, int nq, int t0, int t1, float *out, int ldo) {
    score_vec(s, q, nq, t0, t1, out, ldo);
}

static void f16_accum(const KVStream *s, const float *p, int ldp, int nq, int t0, int t1, float *acc) {
    accum_vec(s, p, ldp, nq, t0, t1, acc);
}
#endif /* __x86_64__ */

static size_t f16_bytes(const KVStream *s) { return (size_t)s->cap * s->d * sizeof(uint16_t); }
static size_t f16_span(const KVStream *s, int t) { return (size_t)t * s->d * sizeof(uint16_t); }

const KVScheme kv_f16 = {
    .name = "f16", .desc = "IEEE half (llama.cpp default)",
    .bits = f16_bits, .check = f16_check, .init = f16_init, .free = f16_free,
    .append = f16_append, .truncate = f16_truncate, .dequant = f16_dequant,
    .score = f16_score, .accum = f16_accum, .bytes = f16_bytes, .span = f16_span,
};
