/* q8.c: llama.cpp's q8_0 as a KV scheme: blocks of 32 values, one fp16
 * scale and 32 signed bytes each.
 *
 * Data flow: kv_stream_append quantizes one K or V vector into d/32 blocks;
 * attention scores and sums straight from the blocks (q8_score, q8_accum),
 * never widening a cached vector into a float buffer: AVX-512 tiles
 * (kv/tile512.h) where the CPU has them, else AVX2 or plain C below.
 *
 *   block:  | fp16 d | int8 q[32] |          34 bytes per 32 values (8.5 bits)
 *   stream: | block 0 .. block d/32-1 | ...  one row of d/32 blocks per position
 *
 * Rule (ggml quantize_row_q8_0_ref): d = max|x| / 127, q = roundf(x / d)
 * with the float d (before its fp16 rounding), 0 for an all-zero block;
 * x̂ = q · fp16(d).
 */
#include "kernels/half.h"
#include "kernels/matmul.h"
#include "kv/block32_avx2.h"
#include "kv/kv.h"
#include "kv/tile512.h"

#include <immintrin.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#define QK 32

typedef struct {
    uint16_t d;    /* fp16 scale */
    int8_t q[QK];  /* x / d, rounded */
} BlockQ8;
_Static_assert(sizeof(BlockQ8) == 34, "q8_0 block must be 34 bytes, as in ggml");

static double q8_bits(int d, const KVOpts *o) { (void)d; (void)o; return 8.5; }

static int q8_check(int d, const KVOpts *o, char *err, size_t errlen) {
    if (o->group || o->residual) {
        snprintf(err, errlen, "q8: takes no options (found g/r)");
        return -1;
    }
    if (d % QK) {
        snprintf(err, errlen, "q8: head_dim must be a multiple of %d, found %d", QK, d);
        return -1;
    }
    return 0;
}

static size_t row_bytes(const KVStream *s) { return (size_t)(s->d / QK) * sizeof(BlockQ8); }

static int q8_init(KVStream *s, char *err, size_t errlen) {
    s->data = malloc((size_t)s->cap * row_bytes(s));
    if (!s->data) { snprintf(err, errlen, "q8: out of memory for %d positions", s->cap); return -1; }
    return 0;
}

static void q8_free(KVStream *s) { free(s->data); }

static const BlockQ8 *row(const KVStream *s, int t) {
    return (const BlockQ8 *)(s->data + (size_t)t * row_bytes(s));
}

/* One block, exactly as ggml: scale from the float amax, codes from 1/d. */
static void quantize_block(BlockQ8 *b, const float *x) {
    float amax = 0;
    for (int j = 0; j < QK; j++) amax = fmaxf(amax, fabsf(x[j]));
    float d = amax / 127, id = d ? 1.0f / d : 0.0f;
    b->d = f32_to_f16(d);
    for (int j = 0; j < QK; j++) b->q[j] = (int8_t)roundf(x[j] * id);
}

static void q8_append(KVStream *s, const float *x) {
    BlockQ8 *b = (BlockQ8 *)(s->data + (size_t)s->len * row_bytes(s));
    for (int k = 0; k < s->d / QK; k++) quantize_block(b + k, x + k * QK);
}

/* Rows are independent, so dropping positions is only bookkeeping. */
static void q8_truncate(KVStream *s, int n) { (void)s; (void)n; }

static void q8_dequant(const KVStream *s, int t, float *out) {
    const BlockQ8 *b = row(s, t);
    for (int k = 0; k < s->d / QK; k++) {
        float d = f16_to_f32(b[k].d);
        for (int j = 0; j < QK; j++) out[k * QK + j] = b[k].q[j] * d;
    }
}

/* Plain C fast path: per block sum_j q_j·code_j, then one multiply by d. */
static void score_c(const KVStream *s, const float *q, int nq, int t0, int t1, float *out, int ldo) {
    const int nb = s->d / QK;
    for (int t = t0; t < t1; t++) {
        const BlockQ8 *b = row(s, t);
        for (int i = 0; i < nq; i++) {
            const float *qi = q + (size_t)i * s->d;
            float acc = 0;
            for (int k = 0; k < nb; k++) {
                float dot = 0;
                for (int j = 0; j < QK; j++) dot += qi[k * QK + j] * b[k].q[j];
                acc += dot * f16_to_f32(b[k].d);
            }
            out[(size_t)i * ldo + (t - t0)] = acc;
        }
    }
}

static void accum_c(const KVStream *s, const float *p, int ldp, int nq, int t0, int t1, float *acc) {
    const int nb = s->d / QK;
    for (int t = t0; t < t1; t++) {
        const BlockQ8 *b = row(s, t);
        for (int k = 0; k < nb; k++) {
            float d = f16_to_f32(b[k].d);
            for (int i = 0; i < nq; i++) {
                float w = p[(size_t)i * ldp + (t - t0)] * d;
                float *ai = acc + (size_t)i * s->d + k * QK;
                for (int j = 0; j < QK; j++) ai[j] += w * b[k].q[j];
            }
        }
    }
}

#define AVX2 __attribute__((target("avx2,fma,f16c")))

/* 32 int8 codes -> 4 x 8 floats (elements 0-7, 8-15, 16-23, 24-31). */
AVX2 static inline void widen32(const uint8_t *c, __m256 v[4]) {
    for (int k = 0; k < 4; k++)
        v[k] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(c + 8 * k))));
}

BLOCK32_AVX2_KERNELS(widen32, sizeof(BlockQ8))

/* Block j / 32 of position t: codes times the scale, exactly the
 * dequantized floats. */
TILE512 void block512(const KVStream *s, int t, int j, __m512 *lo, __m512 *hi) {
    const BlockQ8 *b = row(s, t) + j / QK;
    const __m512 d = _mm512_cvtph_ps(_mm256_set1_epi16((short)b->d));
    *lo = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)b->q))));
    *hi = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(b->q + 16)))));
}

TILE512_KERNELS(block512, row_bytes(s))

static void q8_score(const KVStream *s, const float *q, int nq, int t0, int t1, float *out, int ldo) {
    if (kernels_level() >= 2) score512(s, q, nq, t0, t1, out, ldo);
    else if (kernels_level() > 0) score_avx2(s, q, nq, t0, t1, out, ldo);
    else score_c(s, q, nq, t0, t1, out, ldo);
}

static void q8_accum(const KVStream *s, const float *p, int ldp, int nq, int t0, int t1, float *acc) {
    if (kernels_level() >= 2 && s->d % 128 == 0) accum512(s, p, ldp, nq, t0, t1, acc);
    else if (kernels_level() > 0) accum_avx2(s, p, ldp, nq, t0, t1, acc);
    else accum_c(s, p, ldp, nq, t0, t1, acc);
}

static size_t q8_bytes(const KVStream *s) { return (size_t)s->cap * row_bytes(s); }

const KVScheme kv_q8 = {
    .name = "q8", .desc = "llama.cpp q8_0: fp16 scale + 32 int8 (8.5 bits)",
    .bits = q8_bits, .check = q8_check, .init = q8_init, .free = q8_free,
    .append = q8_append, .truncate = q8_truncate, .dequant = q8_dequant,
    .score = q8_score, .accum = q8_accum, .bytes = q8_bytes,
};
