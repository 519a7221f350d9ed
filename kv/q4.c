/* q4.c: llama.cpp's q4_0 as a KV scheme: blocks of 32 values, one fp16
 * scale and 32 four-bit codes each.
 *
 * Data flow: kv_stream_append quantizes one K or V vector into d/32 blocks;
 * attention scores and sums straight from the nibbles (q4_kv_score,
 * q4_kv_accum, kv/q4.h: q4h shares them),
 * never widening a cached vector into a float buffer: AVX-512 tiles
 * (kv/tile512.h) where the CPU has them, else AVX2 or plain C below (plain
 * C on other CPUs than x86-64).
 *
 *   block:  | fp16 d | uint8 qs[16] |        18 bytes per 32 values (4.5 bits)
 *   qs[j] = code[j] | code[j+16] << 4        (element j low nibble, j+16 high)
 *   stream: | block 0 .. block d/32-1 | ...  one row of d/32 blocks per position
 *
 * Rule (ggml quantize_row_q4_0_ref): m = the element of largest |x| with its
 * sign (first one on ties), d = m / -8, code = min(15, (int8)(x/d + 8.5))
 * with the float d, x̂ = (code - 8) · fp16(d). The -8 maps m itself to code 0,
 * so the extreme value is exact and the other side gets 7 steps.
 */
#include "kernels/half.h"
#include "kernels/matmul.h"
#include "kv/q4.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#define QK 32

typedef struct {
    uint16_t d;        /* fp16 scale */
    uint8_t qs[QK / 2]; /* two codes per byte */
} BlockQ4;
_Static_assert(sizeof(BlockQ4) == 18, "q4_0 block must be 18 bytes, as in ggml");

static double q4_bits(int d, const KVOpts *o) { (void)d; (void)o; return 4.5; }

static int q4_check(int d, const KVOpts *o, char *err, size_t errlen) {
    if (o->group || o->residual) {
        snprintf(err, errlen, "q4: takes no options (found g/r)");
        return -1;
    }
    if (d % QK) {
        snprintf(err, errlen, "q4: head_dim must be a multiple of %d, found %d", QK, d);
        return -1;
    }
    return 0;
}

static size_t row_bytes(const KVStream *s) { return (size_t)(s->d / QK) * sizeof(BlockQ4); }

static int q4_init(KVStream *s, char *err, size_t errlen) {
    s->data = malloc((size_t)s->cap * row_bytes(s));
    if (!s->data) { snprintf(err, errlen, "q4: out of memory for %d positions", s->cap); return -1; }
    return 0;
}

static void q4_free(KVStream *s) { free(s->data); }

static const BlockQ4 *row(const KVStream *s, int t) {
    return (const BlockQ4 *)(s->data + (size_t)t * row_bytes(s));
}

/* One block, exactly as ggml, including the truncating (int8_t) cast. */
static void quantize_block(BlockQ4 *b, const float *x) {
    float amax = 0, max = 0;
    for (int j = 0; j < QK; j++)
        if (amax < fabsf(x[j])) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    float d = max / -8, id = d ? 1.0f / d : 0.0f;
    b->d = f32_to_f16(d);
    for (int j = 0; j < QK / 2; j++) {
        int8_t lo = (int8_t)(x[j] * id + 8.5f), hi = (int8_t)(x[j + QK / 2] * id + 8.5f);
        lo = lo < 15 ? lo : 15;
        hi = hi < 15 ? hi : 15;
        b->qs[j] = (uint8_t)(lo | hi << 4);
    }
}

static void q4_append(KVStream *s, const float *x) {
    BlockQ4 *b = (BlockQ4 *)(s->data + (size_t)s->len * row_bytes(s));
    for (int k = 0; k < s->d / QK; k++) quantize_block(b + k, x + k * QK);
}

/* Rows are independent, so dropping positions is only bookkeeping. */
static void q4_truncate(KVStream *s, int n) { (void)s; (void)n; }

/* Code of element j of a block, already centred: -8..7. */
static int code(const BlockQ4 *b, int j) {
    return (j < QK / 2 ? b->qs[j] & 15 : b->qs[j - QK / 2] >> 4) - 8;
}

static void q4_dequant(const KVStream *s, int t, float *out) {
    const BlockQ4 *b = row(s, t);
    for (int k = 0; k < s->d / QK; k++) {
        float d = f16_to_f32(b[k].d);
        for (int j = 0; j < QK; j++) out[k * QK + j] = code(&b[k], j) * d;
    }
}

/* Plain C fast path: per block sum_j q_j·(code_j - 8), then one multiply by d. */
static void score_c(const KVStream *s, const float *q, int nq, int t0, int t1, float *out, int ldo) {
    const int nb = s->d / QK;
    for (int t = t0; t < t1; t++) {
        const BlockQ4 *b = row(s, t);
        for (int i = 0; i < nq; i++) {
            const float *qi = q + (size_t)i * s->d;
            float acc = 0;
            for (int k = 0; k < nb; k++) {
                float dot = 0;
                for (int j = 0; j < QK; j++) dot += qi[k * QK + j] * code(&b[k], j);
                acc += dot * f16_to_f32(b[k].d);
            }
            out[(size_t)i * ldo + (t - t0)] = acc;
        }
    }
}

static void accum_c(const KVStream *s, const float *p, int ldp, int nq, int t0, int t1, float *acc) {
    const int nb = s->d / QK;
    for (int t = t0; t < t1; t++) {
        const BlockQ4 *b = row(s, t);
        for (int k = 0; k < nb; k++) {
            float d = f16_to_f32(b[k].d);
            for (int i = 0; i < nq; i++) {
                float w = p[(size_t)i * ldp + (t - t0)] * d;
                float *ai = acc + (size_t)i * s->d + k * QK;
                for (int j = 0; j < QK; j++) ai[j] += w * code(&b[k], j);
            }
        }
    }
}

#if defined(__x86_64__)
#include "kv/block32_avx2.h"
#include "kv/tile512.h"

#include <immintrin.h>

#define AVX2 __attribute__((target("avx2,fma,f16c")))

/* 16 packed bytes -> 4 x 8 floats of code - 8 (elements 0-7, 8-15, 16-23, 24-31):
 * low nibbles are elements 0-15, high nibbles 16-31. */
AVX2 static inline void widen32(const uint8_t *qs, __m256 v[4]) {
    const __m128i m = _mm_set1_epi8(15), eight = _mm_set1_epi8(8);
    __m128i raw = _mm_loadu_si128((const __m128i *)qs);
    __m128i lo = _mm_sub_epi8(_mm_and_si128(raw, m), eight);
    __m128i hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(raw, 4), m), eight);
    v[0] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo));
    v[1] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8)));
    v[2] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi));
    v[3] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8)));
}

/* block32_avx2.h's view: block k of position t widened, and its scale. */
AVX2 static inline float load32(const KVStream *s, int t, int k, __m256 v[4]) {
    const BlockQ4 *b = row(s, t) + k;
    widen32(b->qs, v);
    return _cvtsh_ss(b->d);
}

BLOCK32_AVX2_KERNELS(load32)

/* Block j / 32 of position t: (code - 8) times the scale, exactly the
 * dequantized floats; low nibbles are elements 0-15, high ones 16-31. */
TILE512 void block512(const KVStream *s, int t, int j, __m512 *lo, __m512 *hi) {
    const BlockQ4 *b = row(s, t) + j / QK;
    const __m512 d = _mm512_cvtph_ps(_mm256_set1_epi16((short)b->d));
    const __m512i c = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)b->qs)), eight = _mm512_set1_epi32(8);
    const __m512i nib = _mm512_set1_epi32(15);
    *lo = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_and_si512(c, nib), eight)), d);
    *hi = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_srli_epi32(c, 4), eight)), d);
}

TILE512_KERNELS(block512, row_bytes(s))

void q4_kv_score(const KVStream *s, const float *q, int nq, int t0, int t1, float *out, int ldo) {
    if (kernels_level() >= 2) score512(s, q, nq, t0, t1, out, ldo);
    else if (kernels_level() > 0) score_avx2(s, q, nq, t0, t1, out, ldo);
    else score_c(s, q, nq, t0, t1, out, ldo);
}

void q4_kv_accum(const KVStream *s, const float *p, int ldp, int nq, int t0, int t1, float *acc) {
    if (kernels_level() >= 2 && s->d % 128 == 0) accum512(s, p, ldp, nq, t0, t1, acc);
    else if (kernels_level() > 0) accum_avx2(s, p, ldp, nq, t0, t1, acc);
    else accum_c(s, p, ldp, nq, t0, t1, acc);
}
#else
void q4_kv_score(const KVStream *s, const float *q, int nq, int t0, int t1, float *out, int ldo) {
    score_c(s, q, nq, t0, t1, out, ldo);
}

void q4_kv_accum(const KVStream *s, const float *p, int ldp, int nq, int t0, int t1, float *acc) {
    accum_c(s, p, ldp, nq, t0, t1, acc);
}
#endif /* __x86_64__ */

static size_t q4_bytes(const KVStream *s) { return (size_t)s->cap * row_bytes(s); }
static size_t q4_span(const KVStream *s, int t) { return (size_t)t * row_bytes(s); }

const KVScheme kv_q4 = {
    .name = "q4", .desc = "llama.cpp q4_0: fp16 scale + 32 nibbles (4.5 bits)",
    .bits = q4_bits, .check = q4_check, .init = q4_init, .free = q4_free,
    .append = q4_append, .truncate = q4_truncate, .dequant = q4_dequant,
    .score = q4_kv_score, .accum = q4_kv_accum, .bytes = q4_bytes, .span = q4_span,
};
