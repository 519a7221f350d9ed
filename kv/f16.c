/* f16.c: IEEE half precision, llama.cpp's default KV type.
 *
 * Data flow: attn/ -> kv_score / kv_accum (kv.c) -> f16_score / f16_accum
 * here -> kv/tile512.h's AVX-512 loops, the AVX2 tiles below, or
 * kernels/vec.c; append narrows each K or V vector x [d] with
 * vec_f32_to_f16.
 *
 *   stream: | f16 x[d] | f16 x[d] | ...   2·d bytes per position
 *
 * Narrowing rounds to nearest even (kernels/half.h, IEEE 754 binary16);
 * scores and the value sum widen each half in registers (F16C), never into
 * a float buffer: AVX-512 tiles (kv/tile512.h) or AVX2 ones (below) where
 * the CPU has them, else kernels/vec.c (always, on other CPUs than x86-64).
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

/* ---- AVX2 (F16C): tiles in 8 lanes ----
 *
 *   score:  R positions x NH heads, 4 x 2 or 2 x 4 (8 sums, one widened
 *           key vector, NH query vectors: 13 of the 16 registers); each
 *           dot is one 8-lane fma chain over d in steps of 8, then
 *           hsum4_256's tree, whatever tile it falls in
 *   accum:  acc_i += p_i,t v_t with NH heads x W values in registers over
 *           the whole position range: 4 x 16, 2 x 32 or 1 x 64; each value
 *           is the fma chain over t in order that vec_axpy_f16 runs
 *
 * so a widened key or value vector feeds 2 to 4 FMAs, where a dot or an
 * axpy per position and head widened it once per FMA, and the sums of acc
 * stay in registers instead of going through memory every position. */
#define F16_AVX2 __attribute__((target("avx2,fma,f16c"), always_inline)) static inline

F16_AVX2 __m256 ld8h(const uint16_t *h) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)h)); }

/* R positions from t x NH heads: out[i * ldo + t - t0]. */
F16_AVX2 void score_tile256(const KVStream *s, const float *q, int t, int t0, const int R, const int NH, float *out,
                            int ldo) {
    const int d = s->d;
    __m256 acc[4][4];
    for (int r = 0; r < R; r++)
        for (int i = 0; i < NH; i++) acc[r][i] = _mm256_setzero_ps();
    for (int j = 0; j < d; j += 8) {
        __m256 qv[4];
        for (int i = 0; i < NH; i++) qv[i] = _mm256_loadu_ps(q + (size_t)i * d + j);
        for (int r = 0; r < R; r++) {
            const __m256 k = ld8h(row(s, t + r) + j);
            for (int i = 0; i < NH; i++) acc[r][i] = _mm256_fmadd_ps(k, qv[i], acc[r][i]);
        }
    }
    const __m256 z = _mm256_setzero_ps();
    for (int r = 0; r < R; r++) {
        float v[4];
        _mm_storeu_ps(v, hsum4_256(acc[r][0], NH > 1 ? acc[r][1] : z, NH > 2 ? acc[r][2] : z, NH > 3 ? acc[r][3] : z));
        for (int i = 0; i < NH; i++) out[(size_t)i * ldo + (t + r - t0)] = v[i];
    }
}

/* NH heads over [t0, t1), R positions a tile (the rest one by one); each
 * tile's rows prefetched TILE_AHEAD positions ahead, as tile512.h does. */
F16_AVX2 void score_heads256(const KVStream *s, const float *q, const int NH, const int R, int t0, int t1, float *out,
                             int ldo) {
    const size_t rb = (size_t)s->d * 2;
    int t = t0;
    for (; t + R <= t1; t += R) {
        for (int r = 0; r < R; r++)
            for (size_t b = 0; b < rb; b += 64)
                _mm_prefetch((const char *)row(s, t + r + TILE_AHEAD) + b, _MM_HINT_T0);
        score_tile256(s, q, t, t0, R, NH, out, ldo);
    }
    for (; t < t1; t++) score_tile256(s, q, t, t0, 1, NH, out, ldo);
}

/* kv_score for d % 8 == 0: heads four at a time (two positions a tile),
 * then the rest together: three (two positions a tile), two or one (four). */
__attribute__((target("avx2,fma,f16c"))) static void score256(const KVStream *s, const float *q, int nq, int t0,
                                                                int t1, float *out, int ldo) {
    for (int i0 = 0; i0 < nq; i0 += 4) {
        const float *qh = q + (size_t)i0 * s->d;
        float *o = out + (size_t)i0 * ldo;
        switch (nq - i0 < 4 ? nq - i0 : 4) {
        case 1: score_heads256(s, qh, 1, 4, t0, t1, o, ldo); break;
        case 2: score_heads256(s, qh, 2, 4, t0, t1, o, ldo); break;
        case 3: score_heads256(s, qh, 3, 2, t0, t1, o, ldo); break;
        default: score_heads256(s, qh, 4, 2, t0, t1, o, ldo); break;
        }
    }
}

/* NH heads' values j0..j0+W-1 held in registers over positions [t0, t1). */
F16_AVX2 void accum_tile256(const KVStream *s, const float *p, int ldp, const int NH, const int W, int j0, int t0,
                            int t1, float *acc) {
    const int d = s->d;
    __m256 a[4][8];
    for (int i = 0; i < NH; i++)
        for (int v = 0; v < W / 8; v++) a[i][v] = _mm256_loadu_ps(acc + (size_t)i * d + j0 + 8 * v);
    for (int t = t0; t < t1; t++) {
        __m256 pv[4];
        /* the first pass over the rows brings them in, TILE_AHEAD ahead */
        if (j0 == 0)
            for (size_t b = 0; b < (size_t)d * 2; b += 64)
                _mm_prefetch((const char *)row(s, t + TILE_AHEAD) + b, _MM_HINT_T0);
        for (int i = 0; i < NH; i++) pv[i] = _mm256_broadcast_ss(p + (size_t)i * ldp + (t - t0));
        for (int v = 0; v < W / 8; v++) {
            const __m256 x = ld8h(row(s, t) + j0 + 8 * v);
            for (int i = 0; i < NH; i++) a[i][v] = _mm256_fmadd_ps(pv[i], x, a[i][v]);
        }
    }
    for (int i = 0; i < NH; i++)
        for (int v = 0; v < W / 8; v++) _mm256_storeu_ps(acc + (size_t)i * d + j0 + 8 * v, a[i][v]);
}

/* kv_accum for d % 64 == 0: heads four at a time, 16 values at a time,
 * then two (32 values) or one (64). */
__attribute__((target("avx2,fma,f16c"))) static void accum256(const KVStream *s, const float *p, int ldp, int nq,
                                                                int t0, int t1, float *acc) {
    const int d = s->d;
    int i0 = 0;
    for (; i0 + 4 <= nq; i0 += 4)
        for (int j0 = 0; j0 < d; j0 += 16)
            accum_tile256(s, p + (size_t)i0 * ldp, ldp, 4, 16, j0, t0, t1, acc + (size_t)i0 * d);
    for (; i0 + 2 <= nq; i0 += 2)
        for (int j0 = 0; j0 < d; j0 += 32)
            accum_tile256(s, p + (size_t)i0 * ldp, ldp, 2, 32, j0, t0, t1, acc + (size_t)i0 * d);
    for (; i0 < nq; i0++)
        for (int j0 = 0; j0 < d; j0 += 64)
            accum_tile256(s, p + (size_t)i0 * ldp, ldp, 1, 64, j0, t0, t1, acc + (size_t)i0 * d);
}

/* AVX-512 tiles (kv/tile512.h) or the AVX2 ones above where the CPU and d
 * allow; else the vec loops. */
static void f16_score(const KVStream *s, const float *q, int nq, int t0, int t1, float *out, int ldo) {
    if (kernels_level() >= 2 && s->d % 32 == 0) score512(s, q, nq, t0, t1, out, ldo);
    else if (kernels_level() == 1 && s->d % 8 == 0) score256(s, q, nq, t0, t1, out, ldo);
    else score_vec(s, q, nq, t0, t1, out, ldo);
}

static void f16_accum(const KVStream *s, const float *p, int ldp, int nq, int t0, int t1, float *acc) {
    if (kernels_level() >= 2 && s->d % 128 == 0) accum512(s, p, ldp, nq, t0, t1, acc);
    else if (kernels_level() == 1 && s->d % 64 == 0) accum256(s, p, ldp, nq, t0, t1, acc);
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
