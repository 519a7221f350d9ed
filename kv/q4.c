/* q4.c: llama.cpp's q4_0 as a KV scheme: blocks of 32 values, one fp16
 * scale and 32 four-bit codes each.
 *
 * Data flow: kv_stream_append quantizes one K or V vector into d/32 blocks;
 * attention scores and sums straight from the nibbles (q4_kv_score,
 * q4_kv_accum, kv/q4.h: q4h shares them),
 * never widening a cached vector into a float buffer: integer scores at
 * d = 128 on AVX-512 VNNI and AVX2 (llama.cpp's q4_0 · q8_0), AVX-512
 * tiles (kv/tile512.h) where the CPU has them, else AVX2 or plain C below; on
 * aarch64 integer scores with sdot (dotprod) and NEON floats (plain C on
 * other CPUs).
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

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* One block, exactly as ggml, including the truncating (int8_t) cast; the
 * value is clamped to [0, 15] before it, which changes nothing ggml
 * defines (x / d + 8.5 lies in [0.5, 16.5]) and gives a block whose
 * largest |x| is below 2^-125 (1 / d is then infinite) defined codes
 * where the cast of an infinity would not be (a NaN gives 0). */
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
        const int8_t lo = (int8_t)fminf(fmaxf(x[j] * id + 8.5f, 0.0f), 15.0f),
                     hi = (int8_t)fminf(fmaxf(x[j + QK / 2] * id + 8.5f, 0.0f), 15.0f);
        b->qs[j] = (uint8_t)(lo | hi << 4);
    }
}

/* The SIMD quantizers' scale, once they have the largest |x| (exact in any
 * order): its first holder's sign, as quantize_block's loop takes it; b->d
 * gets d, the return is 1 / d (0 for an all-zero block). */
static inline float block_scale(BlockQ4 *b, const float *x, float amax) {
    float max = 0;
    for (int j = 0; amax > 0 && j < QK; j++)
        if (fabsf(x[j]) == amax) {
            max = x[j];
            break;
        }
    const float d = max / -8;
    b->d = f32_to_f16(d);
    return d ? 1.0f / d : 0.0f;
}

/* quantize_block in 8 lanes (AVX2) or 4 (NEON; below): the same bytes. */
static void quantize_block_fast(BlockQ4 *b, const float *x);

void q4_quantize_row(const float *x, int d, uint8_t *row) {
    BlockQ4 *b = (BlockQ4 *)row;
    for (int k = 0; k < d / QK; k++) quantize_block_fast(b + k, x + k * QK);
}

static void q4_append(KVStream *s, const float *x) { q4_quantize_row(x, s->d, s->data + (size_t)s->len * row_bytes(s)); }

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

/* ---- integer scores (avx512vnni, d = 128) --------------------------------
 * llama.cpp's q4_0 · q8_0 dot: each block's 32 query values rounded to
 * bytes at 127 / max|q| over the block (qd = its inverse), the codes taken
 * as unsigned nibbles against them by vpdpbusd and the 8 · Σ q8 that the
 * nibbles' offset adds taken off per block. A block's sum I_k is an exact
 * integer; the float steps per position are
 *   f_k = (float)(I_k - B_k) · (d_k · qd_k),   score = (f_0 + f_2) + (f_1 + f_3)
 * in this order in both the kernel and q4_score_int, which it matches bit
 * for bit. Rounding q to bytes per block of 32 adds at most about 1e-3 of
 * ‖q‖‖k‖ on the tests' data (KVScheme.score_err). */

/* One head's query as the integer score reads it: for block k, lo[16k + j]
 * = q8 of value 32k + j and hi[16k + j] of value 32k + 16 + j (the
 * nibbles' order), B[k] = 8 Σ q8 over the block, qd[k] its scale's inverse. */
typedef struct {
    int8_t lo[64], hi[64];
    int32_t B[4];
    float qd[4];
} Q4Q8;

/* -1 for a non-finite query (the float path takes it). */
static int q8_prep_c(const float *q, Q4Q8 *o) {
    for (int k = 0; k < 4; k++) {
        float m = 0;
        for (int j = 0; j < QK; j++) {
            if (!isfinite(q[32 * k + j])) return -1;
            m = fmaxf(m, fabsf(q[32 * k + j]));
        }
        const float sc = m > 127.0f / FLT_MAX ? 127.0f / m : 0; /* 0 where 127 / m would overflow */
        int32_t sum = 0;
        for (int j = 0; j < 16; j++) {
            o->lo[16 * k + j] = (int8_t)lrintf(q[32 * k + j] * sc);
            o->hi[16 * k + j] = (int8_t)lrintf(q[32 * k + 16 + j] * sc);
            sum += o->lo[16 * k + j] + o->hi[16 * k + j];
        }
        o->B[k] = 8 * sum;
        o->qd[k] = sc > 0 ? 1.0f / sc : 0;
    }
    return 0;
}

int q4_score_int(const KVStream *s, const float *q, int nq, int t0, int t1, float *out, int ldo) {
    if (s->d != 128) return -1;
    Q4Q8 o;
    for (int i = 0; i < nq; i++)
        if (q8_prep_c(q + (size_t)i * 128, &o)) return -1;
    for (int i = 0; i < nq; i++) {
        q8_prep_c(q + (size_t)i * 128, &o);
        for (int t = t0; t < t1; t++) {
            const BlockQ4 *b = row(s, t);
            float f[4];
            for (int k = 0; k < 4; k++) {
                int32_t I = 0;
                for (int j = 0; j < 16; j++)
                    I += (b[k].qs[j] & 15) * o.lo[16 * k + j] + (b[k].qs[j] >> 4) * o.hi[16 * k + j];
                f[k] = (float)(I - o.B[k]) * (f16_to_f32(b[k].d) * o.qd[k]);
            }
            out[(size_t)i * ldo + (t - t0)] = (f[0] + f[2]) + (f[1] + f[3]);
        }
    }
    return 0;
}

#if defined(__x86_64__)
#include "kernels/quant32.h"
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

#define VNNI_INLINE __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c"), always_inline)) static inline

/* q8_prep_c in 16 lanes, block by block (max is exact; vcvtps2dq rounds
 * to nearest even as lrintf does). */
VNNI_INLINE int q8_prep16(const float *q, Q4Q8 *o) {
    for (int k = 0; k < 4; k++) {
        const __m512 a = _mm512_loadu_ps(q + 32 * k), b = _mm512_loadu_ps(q + 32 * k + 16);
        if (_mm512_fpclass_ps_mask(a, 0x99) | _mm512_fpclass_ps_mask(b, 0x99)) return -1; /* NaN, ±inf */
        const float m = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
        const float sc = m > 127.0f / FLT_MAX ? 127.0f / m : 0;
        const __m512i ia = _mm512_cvtps_epi32(_mm512_mul_ps(a, _mm512_set1_ps(sc))),
                      ib = _mm512_cvtps_epi32(_mm512_mul_ps(b, _mm512_set1_ps(sc)));
        _mm_storeu_si128((__m128i *)(o->lo + 16 * k), _mm512_cvtepi32_epi8(ia));
        _mm_storeu_si128((__m128i *)(o->hi + 16 * k), _mm512_cvtepi32_epi8(ib));
        o->B[k] = 8 * _mm512_reduce_add_epi32(_mm512_add_epi32(ia, ib));
        o->qd[k] = sc > 0 ? 1.0f / sc : 0;
    }
    return 0;
}

/* Scores of [t0, t1) for NQ <= 4 prepared heads, four positions a step:
 * each position's 64 code bytes (block k in 128-bit lane k) against the
 * head's bytes, two vpdpbusd; the four positions' lanes summed within
 * each block (lane k of the result holds block k of positions r = 0..3),
 * then the float steps of q4_score_int as 16-lane vectors. */
VNNI_INLINE void score_i8_body(const KVStream *s, const int NQ, const Q4Q8 *o, int t0, int t1, float *out, int ldo) {
    const size_t rb = row_bytes(s);
    const __m512i m4 = _mm512_set1_epi8(15);
    /* gather offsets of the scales: lane 4k + r = block k of position r */
    const __m512i at = _mm512_add_epi32(_mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3),
                                                           _mm512_set1_epi32((int)rb)),
                                        _mm512_setr_epi32(0, 0, 0, 0, 18, 18, 18, 18, 36, 36, 36, 36, 54, 54, 54, 54));
    __m512i ql[4], qh[4], bias[4];
    __m512 qd[4];
    for (int i = 0; i < NQ; i++) {
        ql[i] = _mm512_loadu_si512(o[i].lo);
        qh[i] = _mm512_loadu_si512(o[i].hi);
        bias[i] = _mm512_setr_epi32(o[i].B[0], o[i].B[0], o[i].B[0], o[i].B[0], o[i].B[1], o[i].B[1], o[i].B[1], o[i].B[1],
                                    o[i].B[2], o[i].B[2], o[i].B[2], o[i].B[2], o[i].B[3], o[i].B[3], o[i].B[3], o[i].B[3]);
        qd[i] = _mm512_setr_ps(o[i].qd[0], o[i].qd[0], o[i].qd[0], o[i].qd[0], o[i].qd[1], o[i].qd[1], o[i].qd[1], o[i].qd[1],
                               o[i].qd[2], o[i].qd[2], o[i].qd[2], o[i].qd[2], o[i].qd[3], o[i].qd[3], o[i].qd[3], o[i].qd[3]);
    }
    for (int t = t0; t < t1; t += 4) {
        const int R = t1 - t < 4 ? t1 - t : 4;
        const __mmask16 keep = (__mmask16)(0x1111 * ((1u << R) - 1));
        const uint8_t *base = s->data + (size_t)t * rb;
        for (int r = 0; r < 4; r++) _mm_prefetch((const char *)base + (size_t)(16 + r) * rb, _MM_HINT_T0);
        __m512i acc[4][4];
        for (int r = 0; r < 4; r++) {
            if (r >= R) {
                for (int i = 0; i < NQ; i++) acc[r][i] = _mm512_setzero_si512();
                continue;
            }
            const uint8_t *qs = base + (size_t)r * rb + 2;
            __m512i v = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)qs));
            v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(qs + 18)), 1);
            v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(qs + 36)), 2);
            v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(qs + 54)), 3);
            const __m512i lo = _mm512_and_si512(v, m4), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
            for (int i = 0; i < NQ; i++)
                acc[r][i] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, ql[i]), hi, qh[i]);
        }
        const __m512 d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(
            _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), keep, at, (const void *)base, 1)));
        for (int i = 0; i < NQ; i++) {
            /* lane 4k + r: block k of position r (hsum4_512i before its cross-lane adds) */
            const __m512i ab = _mm512_add_epi32(_mm512_unpacklo_epi32(acc[0][i], acc[1][i]), _mm512_unpackhi_epi32(acc[0][i], acc[1][i])),
                          cd = _mm512_add_epi32(_mm512_unpacklo_epi32(acc[2][i], acc[3][i]), _mm512_unpackhi_epi32(acc[2][i], acc[3][i]));
            const __m512i I = _mm512_sub_epi32(_mm512_add_epi32(_mm512_unpacklo_epi64(ab, cd), _mm512_unpackhi_epi64(ab, cd)), bias[i]);
            const __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(I), _mm512_mul_ps(d, qd[i]));
            const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(f), _mm512_extractf32x8_ps(f, 1));
            const __m128 sc = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
            _mm_mask_storeu_ps(out + (size_t)i * ldo + (t - t0), (__mmask8)((1u << R) - 1), sc);
        }
    }
}

/* 0, or -1 when a query is not finite (the caller takes the float path). */
__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c"))) static int
score_i8(const KVStream *s, const float *q, int nq, int t0, int t1, float *out, int ldo) {
    Q4Q8 o[4];
    for (int i = 0; i < nq; i++)
        if (q8_prep16(q + (size_t)i * 128, &o[i])) return -1;
    switch (nq) {
    case 1: score_i8_body(s, 1, o, t0, t1, out, ldo); break;
    case 2: score_i8_body(s, 2, o, t0, t1, out, ldo); break;
    case 3: score_i8_body(s, 3, o, t0, t1, out, ldo); break;
    default: score_i8_body(s, 4, o, t0, t1, out, ldo); break;
    }
    return 0;
}

/* The same integer scores on AVX2 (d = 128): vpmaddubsw takes the nibbles
 * as unsigned bytes against the query's signed ones, and its int16 pair
 * sums (at most 2 · 15 · 127) add once more (low and high nibbles) before
 * vpmaddwd widens them, so every sum is exact. Two blocks share a register (block 2h in the low
 * lane, 2h + 1 in the high); a position's 8 lane sums fold to its four
 * I_k, two positions interleaved per vector, then q4_score_int's float
 * steps in its order: lane pairs (f_0, f_2) and (f_1, f_3) add first, by
 * vhaddps, then the two halves. */
#define AVX2_INLINE __attribute__((target("avx2,fma,f16c"), always_inline)) static inline

/* One position's 8 int32 lanes per block pair: lanes 0-3 block 2h, 4-7
 * block 2h + 1 (h = 0, 1). */
AVX2_INLINE void dot_q4_avx2(const uint8_t *row, const Q4Q8 *o, const int NQ, __m256i (*a)[2]) {
    const __m256i m4 = _mm256_set1_epi8(15), one = _mm256_set1_epi16(1);
    for (int h = 0; h < 2; h++) {
        const uint8_t *qs = row + 36 * h + 2;
        const __m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)qs)),
                                                  _mm_loadu_si128((const __m128i *)(qs + 18)), 1);
        const __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
        for (int i = 0; i < NQ; i++) {
            const __m256i p =
                _mm256_add_epi16(_mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)(o[i].lo + 32 * h))),
                                 _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(o[i].hi + 32 * h))));
            a[i][h] = _mm256_madd_epi16(p, one);
        }
    }
}

/* Block scales of positions r and r + 1 in the lanes of a folded pair:
 * low lane (r: d_0, d_2; r + 1: d_0, d_2), high lane the same of d_1, d_3. */
static inline short rd16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return (short)h;
}

/* (loaded straight into lanes: a vector load of scalar stores would stall) */
AVX2_INLINE __m256 scales_q4_avx2(const uint8_t *r0, const uint8_t *r1) {
    return _mm256_cvtph_ps(_mm_setr_epi16(rd16(r0), rd16(r0 + 36), rd16(r1), rd16(r1 + 36), rd16(r0 + 18), rd16(r0 + 54),
                                          rd16(r1 + 18), rd16(r1 + 54)));
}

AVX2_INLINE void score_i8_avx2_body(const KVStream *s, const int NQ, const Q4Q8 *o, int t0, int t1, float *out,
                                    int ldo) {
    const size_t rb = row_bytes(s);
    __m256i bias[4];
    __m256 qd[4];
    for (int i = 0; i < NQ; i++) {
        bias[i] = _mm256_setr_epi32(o[i].B[0], o[i].B[2], o[i].B[0], o[i].B[2], o[i].B[1], o[i].B[3], o[i].B[1], o[i].B[3]);
        qd[i] = _mm256_setr_ps(o[i].qd[0], o[i].qd[2], o[i].qd[0], o[i].qd[2], o[i].qd[1], o[i].qd[3], o[i].qd[1], o[i].qd[3]);
    }
    for (int t = t0; t < t1; t += 4) {
        const int R = t1 - t < 4 ? t1 - t : 4;
        const uint8_t *base = s->data + (size_t)t * rb;
        for (int r = 0; r < 4; r++) _mm_prefetch((const char *)base + (size_t)(16 + r) * rb, _MM_HINT_T0);
        /* x[r][i]: position r's 8 block partial sums, lanes (I_0, I_0, I_2, I_2 | I_1, I_1, I_3, I_3) */
        __m256i x[4][4];
        for (int r = 0; r < 4; r++) {
            if (r >= R) {
                for (int i = 0; i < NQ; i++) x[r][i] = _mm256_setzero_si256();
                continue;
            }
            __m256i a[4][2];
            dot_q4_avx2(base + (size_t)r * rb, o, NQ, a);
            for (int i = 0; i < NQ; i++) x[r][i] = _mm256_hadd_epi32(a[i][0], a[i][1]);
        }
        /* rows past R read position t as a stand-in: their lanes are not stored */
        const uint8_t *rr[4];
        for (int r = 0; r < 4; r++) rr[r] = base + (size_t)(r < R ? r : 0) * rb;
        const __m256 d01 = scales_q4_avx2(rr[0], rr[1]), d23 = scales_q4_avx2(rr[2], rr[3]);
        for (int i = 0; i < NQ; i++) {
            const __m256i I01 = _mm256_hadd_epi32(x[0][i], x[1][i]), I23 = _mm256_hadd_epi32(x[2][i], x[3][i]);
            const __m256 f01 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(I01, bias[i])), _mm256_mul_ps(d01, qd[i])),
                         f23 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(I23, bias[i])), _mm256_mul_ps(d23, qd[i]));
            /* low lane: f_0 + f_2 of positions 0-3, high lane: f_1 + f_3 */
            const __m256 h = _mm256_hadd_ps(f01, f23);
            float sc[4];
            _mm_storeu_ps(sc, _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1)));
            for (int r = 0; r < R; r++) out[(size_t)i * ldo + (t - t0) + r] = sc[r];
        }
    }
}

/* q8_prep_c in 8 lanes, block by block (max is exact; vcvtps2dq rounds as
 * lrintf does): the same bytes, whose order in a block is already its
 * lo[16k..] then hi[16k..]. */
AVX2_INLINE int q8_prep_avx2(const float *q, Q4Q8 *o) {
    for (int k = 0; k < 4; k++) {
        float mx;
        if (absmax_avx2(q + 32 * k, QK, &mx)) return -1;
        const float sc = mx > 127.0f / FLT_MAX ? 127.0f / mx : 0;
        __m256i sum = _mm256_setzero_si256();
        const __m256i b = round32_avx2(q + 32 * k, _mm256_set1_ps(sc), &sum);
        _mm_storeu_si128((__m128i *)(o->lo + 16 * k), _mm256_castsi256_si128(b));
        _mm_storeu_si128((__m128i *)(o->hi + 16 * k), _mm256_extracti128_si256(b, 1));
        o->B[k] = 8 * hsum_i32_avx2(sum);
        o->qd[k] = sc > 0 ? 1.0f / sc : 0;
    }
    return 0;
}

/* 0, or -1 when a query is not finite (the caller takes the float path). */
AVX2 static int score_i8_avx2(const KVStream *s, const float *q, int nq, int t0, int t1, float *out, int ldo) {
    Q4Q8 o[4];
    for (int i = 0; i < nq; i++)
        if (q8_prep_avx2(q + (size_t)i * 128, &o[i])) return -1;
    switch (nq) {
    case 1: score_i8_avx2_body(s, 1, o, t0, t1, out, ldo); break;
    case 2: score_i8_avx2_body(s, 2, o, t0, t1, out, ldo); break;
    case 3: score_i8_avx2_body(s, 3, o, t0, t1, out, ldo); break;
    default: score_i8_avx2_body(s, 4, o, t0, t1, out, ldo); break;
    }
    return 0;
}

/* AVX2 value sums: acc_i[32k + j] += (p_i,t · d_t,k) · (code_j - 8), the
 * products and fma chains over t in order that accum_c runs, with the
 * sums held in registers over a run of positions instead of going through
 * memory every position. Heads four at a time take half a block (16
 * values: the low or the high nibbles) a pass, 8 accumulators; two or one
 * a whole block. The weights p · d of Q4_TT positions are computed ahead
 * of their passes (w[t][i][k]), so a pass broadcasts them from L1. */
#define Q4_TT 32

/* Values 16h .. 16h + 15 of a block (its nibbles' low or high halves) as
 * two vectors of code - 8. */
AVX2_INLINE void half_q4_avx2(const uint8_t *qs, int h, __m256 v[2]) {
    const __m128i raw = _mm_loadu_si128((const __m128i *)qs);
    const __m128i nib = _mm_and_si128(h ? _mm_srli_epi16(raw, 4) : raw, _mm_set1_epi8(15));
    const __m128i c = _mm_sub_epi8(nib, _mm_set1_epi8(8));
    v[0] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(c));
    v[1] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(c, 8)));
}

/* NH heads x halves [h0, h0 + NHF) of block k over the n positions from
 * ta, whose weights are ready in w; pf: this pass fetches the rows ahead. */
AVX2_INLINE void accum_tile_q4(const KVStream *s, const float (*w)[4][KV_MAX_DIM / QK], const int NH, const int NHF,
                               int k, int h0, int ta, int n, int pf, float *acc) {
    const size_t rb = row_bytes(s);
    float *ab = acc + (size_t)k * QK + 16 * (size_t)h0;
    __m256 a[4][4];
    for (int i = 0; i < NH; i++)
        for (int v = 0; v < 2 * NHF; v++) a[i][v] = _mm256_loadu_ps(ab + (size_t)i * s->d + 8 * v);
    for (int t = 0; t < n; t++) {
        const uint8_t *r = s->data + (size_t)(ta + t) * rb;
        if (pf)
            for (size_t b = 0; b < rb; b += 64) _mm_prefetch((const char *)r + 16 * rb + b, _MM_HINT_T0);
        __m256 wv[4];
        for (int i = 0; i < NH; i++) wv[i] = _mm256_broadcast_ss(&w[t][i][k]);
        for (int hf = 0; hf < NHF; hf++) {
            __m256 x[2];
            half_q4_avx2(r + (size_t)k * sizeof(BlockQ4) + 2, h0 + hf, x);
            for (int i = 0; i < NH; i++) {
                a[i][2 * hf] = _mm256_fmadd_ps(wv[i], x[0], a[i][2 * hf]);
                a[i][2 * hf + 1] = _mm256_fmadd_ps(wv[i], x[1], a[i][2 * hf + 1]);
            }
        }
    }
    for (int i = 0; i < NH; i++)
        for (int v = 0; v < 2 * NHF; v++) _mm256_storeu_ps(ab + (size_t)i * s->d + 8 * v, a[i][v]);
}

/* NH heads (4: half blocks; 2 or 1: whole ones) over [t0, t1). */
AVX2_INLINE void accum_heads_q4(const KVStream *s, const float *p, int ldp, const int NH, int t0, int t1, int pf,
                                float *acc) {
    const int nb = s->d / QK, NHF = NH > 2 ? 1 : 2;
    float w[Q4_TT][4][KV_MAX_DIM / QK];
    for (int ta = t0; ta < t1; ta += Q4_TT) {
        const int n = t1 - ta < Q4_TT ? t1 - ta : Q4_TT;
        for (int t = 0; t < n; t++) {
            const BlockQ4 *b = row(s, ta + t);
            int k = 0;
            /* four blocks' scales a vector, loaded straight into lanes */
            for (; k + 4 <= nb; k += 4) {
                const __m128 d = _mm_cvtph_ps(_mm_setr_epi16((short)b[k].d, (short)b[k + 1].d, (short)b[k + 2].d,
                                                             (short)b[k + 3].d, 0, 0, 0, 0));
                for (int i = 0; i < NH; i++)
                    _mm_storeu_ps(&w[t][i][k], _mm_mul_ps(_mm_set1_ps(p[(size_t)i * ldp + (ta + t - t0)]), d));
            }
            for (; k < nb; k++) {
                const float d = _cvtsh_ss(b[k].d);
                for (int i = 0; i < NH; i++) w[t][i][k] = p[(size_t)i * ldp + (ta + t - t0)] * d;
            }
        }
        for (int k = 0; k < nb; k++)
            for (int h0 = 0; h0 < 2; h0 += NHF)
                accum_tile_q4(s, (const float (*)[4][KV_MAX_DIM / QK])w, NH, NHF, k, h0, ta, n, pf && k == 0 && h0 == 0,
                              acc);
    }
}

AVX2 static void accum_avx2(const KVStream *s, const float *p, int ldp, int nq, int t0, int t1, float *acc) {
    for (int i0 = 0; i0 < nq;) {
        const float *pi = p + (size_t)i0 * ldp;
        float *ai = acc + (size_t)i0 * s->d;
        const int left = nq - i0;
        if (left >= 4) accum_heads_q4(s, pi, ldp, 4, t0, t1, i0 == 0, ai);
        else if (left >= 2) accum_heads_q4(s, pi, ldp, 2, t0, t1, i0 == 0, ai);
        else accum_heads_q4(s, pi, ldp, 1, t0, t1, i0 == 0, ai);
        i0 += left >= 4 ? 4 : left >= 2 ? 2 : 1;
    }
}

/* Heads in groups of at most 4 (5 -> 3 + 2), so a head's scores never
 * depend on how many share the call; a group with a non-finite query takes
 * the float path. */
void q4_kv_score(const KVStream *s, const float *q, int nq, int t0, int t1, float *out, int ldo) {
    if (kernels_level() >= 3 && s->d == 128) {
        for (int i0 = 0, left = (nq + 3) / 4; i0 < nq; left--) {
            const int m = (nq - i0 + left - 1) / left;
            const float *qi = q + (size_t)i0 * 128;
            float *oi = out + (size_t)i0 * ldo;
            if (score_i8(s, qi, m, t0, t1, oi, ldo)) score512(s, qi, m, t0, t1, oi, ldo);
            i0 += m;
        }
    } else if (kernels_level() >= 2) score512(s, q, nq, t0, t1, out, ldo);
    else if (kernels_level() == 1 && s->d == 128) {
        for (int i0 = 0, left = (nq + 3) / 4; i0 < nq; left--) {
            const int m = (nq - i0 + left - 1) / left;
            const float *qi = q + (size_t)i0 * 128;
            float *oi = out + (size_t)i0 * ldo;
            if (score_i8_avx2(s, qi, m, t0, t1, oi, ldo)) score_avx2(s, qi, m, t0, t1, oi, ldo);
            i0 += m;
        }
    } else if (kernels_level() > 0) score_avx2(s, q, nq, t0, t1, out, ldo);
    else score_c(s, q, nq, t0, t1, out, ldo);
}

/* quantize_block in 8 lanes: the largest |x| is exact in any order (max_ps
 * returns its second operand when the first is NaN, so a NaN is skipped as
 * the comparison skips it); its first holder, the scale, the clamp (max
 * with 0 first, which turns a NaN into 0 as fmaxf does) and the truncating
 * conversion then follow quantize_block: the same bytes. */
__attribute__((target("avx2,fma"))) static void quantize_block_avx2(BlockQ4 *b, const float *x) {
    __m256 m = _mm256_setzero_ps();
    for (int j = 0; j < QK; j += 8) m = _mm256_max_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.0f), _mm256_loadu_ps(x + j)), m);
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    const float amax = _mm_cvtss_f32(_mm_max_ss(h, _mm_shuffle_ps(h, h, 1)));
    const float id = block_scale(b, x, amax);
    /* codes of elements 8g..8g+7 as int32, then 16-bit rows 0-15 (low
     * nibbles) and 16-31 (high), packs_epi32 interleaving 128-bit lanes */
    __m256i c[4];
    for (int g = 0; g < 4; g++) {
        const __m256 y = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(x + 8 * g), _mm256_set1_ps(id)), _mm256_set1_ps(8.5f));
        c[g] = _mm256_cvttps_epi32(_mm256_min_ps(_mm256_max_ps(y, _mm256_setzero_ps()), _mm256_set1_ps(15.0f)));
    }
    const __m256i lo = _mm256_permute4x64_epi64(_mm256_packs_epi32(c[0], c[1]), 0xD8),
                  hi = _mm256_permute4x64_epi64(_mm256_packs_epi32(c[2], c[3]), 0xD8),
                  v = _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4));
    _mm_storeu_si128((__m128i *)b->qs,
                     _mm_packus_epi16(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1)));
}

static void quantize_block_fast(BlockQ4 *b, const float *x) {
    if (kernels_level() > 0) quantize_block_avx2(b, x);
    else quantize_block(b, x);
}

void q4_kv_accum(const KVStream *s, const float *p, int ldp, int nq, int t0, int t1, float *acc) {
    if (kernels_level() >= 2 && s->d % 128 == 0) accum512(s, p, ldp, nq, t0, t1, acc);
    else if (kernels_level() > 0) accum_avx2(s, p, ldp, nq, t0, t1, acc);
    else accum_c(s, p, ldp, nq, t0, t1, acc);
}
#elif defined(__aarch64__)
#include <arm_neon.h>

/* ---- aarch64 ----------------------------------------------------------------
 * dotprod, d = 128: q4_score_int's arithmetic, a block's 16 bytes split into
 * low and high nibbles (unsigned, 0..15, so signed bytes too) and each
 * multiplied by its 16 query bytes with sdot; then the same float steps.
 * NEON: score_c and accum_c with a block's 32 codes widened to 8 vectors
 * of 4 floats (value j of a block: the low nibble of byte j, j + 16 the
 * high one), each block's dot summed apart and then scaled, as there. */
__attribute__((target("arch=armv8.2-a+dotprod"))) static int score_sdot(const KVStream *s, const float *q, int nq,
                                                                         int t0, int t1, float *out, int ldo) {
    if (s->d != 128) return -1;
    for (int i = 0; i < nq; i++) {
        Q4Q8 o;
        if (q8_prep_c(q + (size_t)i * 128, &o)) return -1;
    }
    for (int i = 0; i < nq; i++) {
        Q4Q8 o;
        q8_prep_c(q + (size_t)i * 128, &o);
        for (int t = t0; t < t1; t++) {
            const BlockQ4 *b = row(s, t);
            float f[4];
            for (int k = 0; k < 4; k++) {
                const uint8x16_t c = vld1q_u8(b[k].qs);
                int32x4_t a = vdotq_s32(vdupq_n_s32(0), vreinterpretq_s8_u8(vandq_u8(c, vdupq_n_u8(15))),
                                        vld1q_s8(o.lo + 16 * k));
                a = vdotq_s32(a, vreinterpretq_s8_u8(vshrq_n_u8(c, 4)), vld1q_s8(o.hi + 16 * k));
                f[k] = (float)(vaddvq_s32(a) - o.B[k]) * (f16_to_f32(b[k].d) * o.qd[k]);
            }
            out[(size_t)i * ldo + (t - t0)] = (f[0] + f[2]) + (f[1] + f[3]);
        }
    }
    return 0;
}

/* A block's 32 codes, centred (-8..7), as floats v[0..8) in value order. */
static inline void widen_block(const BlockQ4 *b, float32x4_t v[8]) {
    const uint8x16_t c = vld1q_u8(b->qs);
    const int8x16_t lo = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(c, vdupq_n_u8(15))), vdupq_n_s8(8)),
                    hi = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(c, 4)), vdupq_n_s8(8));
    const int8x16_t h[2] = {lo, hi};
    for (int g = 0; g < 2; g++) {
        const int16x8_t w0 = vmovl_s8(vget_low_s8(h[g])), w1 = vmovl_high_s8(h[g]);
        v[4 * g] = vcvtq_f32_s32(vmovl_s16(vget_low_s16(w0)));
        v[4 * g + 1] = vcvtq_f32_s32(vmovl_high_s16(w0));
        v[4 * g + 2] = vcvtq_f32_s32(vmovl_s16(vget_low_s16(w1)));
        v[4 * g + 3] = vcvtq_f32_s32(vmovl_high_s16(w1));
    }
}

static void score_neon(const KVStream *s, const float *q, int nq, int t0, int t1, float *out, int ldo) {
    const int nb = s->d / QK;
    for (int t = t0; t < t1; t++) {
        const BlockQ4 *b = row(s, t);
        float acc[KV_MAX_NQ] = {0};
        for (int k = 0; k < nb; k++) {
            float32x4_t v[8];
            widen_block(&b[k], v);
            const float d = f16_to_f32(b[k].d);
            for (int i = 0; i < nq; i++) {
                const float *qk = q + (size_t)i * s->d + k * QK;
                float32x4_t a0 = vmulq_f32(v[0], vld1q_f32(qk)), a1 = vmulq_f32(v[1], vld1q_f32(qk + 4));
                for (int g = 2; g < 8; g += 2) {
                    a0 = vfmaq_f32(a0, v[g], vld1q_f32(qk + 4 * g));
                    a1 = vfmaq_f32(a1, v[g + 1], vld1q_f32(qk + 4 * g + 4));
                }
                acc[i] += vaddvq_f32(vaddq_f32(a0, a1)) * d;
            }
        }
        for (int i = 0; i < nq; i++) out[(size_t)i * ldo + (t - t0)] = acc[i];
    }
}

static void accum_neon(const KVStream *s, const float *p, int ldp, int nq, int t0, int t1, float *acc) {
    const int nb = s->d / QK;
    for (int t = t0; t < t1; t++) {
        const BlockQ4 *b = row(s, t);
        for (int k = 0; k < nb; k++) {
            float32x4_t v[8];
            widen_block(&b[k], v);
            const float d = f16_to_f32(b[k].d);
            for (int i = 0; i < nq; i++) {
                const float w = p[(size_t)i * ldp + (t - t0)] * d;
                float *ai = acc + (size_t)i * s->d + k * QK;
                for (int g = 0; g < 8; g++) vst1q_f32(ai + 4 * g, vfmaq_n_f32(vld1q_f32(ai + 4 * g), v[g], w));
            }
        }
    }
}

/* The largest |x| is exact in any order (fmaxnm skips NaNs as the
 * comparison does); its first holder, the scale, the clamp (fmaxnm and
 * fminnm, as fmaxf and fminf) and the truncating conversion (fcvtzs, as
 * the cast) then follow quantize_block. */
static void quantize_block_fast(BlockQ4 *b, const float *x) {
    if (kernels_level() == 0) {
        quantize_block(b, x);
        return;
    }
    float32x4_t m = vdupq_n_f32(0);
    for (int j = 0; j < QK; j += 4) m = vmaxnmq_f32(m, vabsq_f32(vld1q_f32(x + j)));
    const float amax = vmaxnmvq_f32(m);
    const float id = block_scale(b, x, amax);
    uint8x16_t c[2];
    for (int h = 0; h < 2; h++) {
        int32x4_t v[4];
        for (int g = 0; g < 4; g++) {
            const float32x4_t y = vaddq_f32(vmulq_n_f32(vld1q_f32(x + 16 * h + 4 * g), id), vdupq_n_f32(8.5f));
            v[g] = vcvtq_s32_f32(vminnmq_f32(vmaxnmq_f32(y, vdupq_n_f32(0)), vdupq_n_f32(15)));
        }
        const int16x8_t lo = vcombine_s16(vmovn_s32(v[0]), vmovn_s32(v[1])),
                        hi = vcombine_s16(vmovn_s32(v[2]), vmovn_s32(v[3]));
        c[h] = vreinterpretq_u8_s8(vcombine_s8(vmovn_s16(lo), vmovn_s16(hi)));
    }
    vst1q_u8(b->qs, vorrq_u8(c[0], vshlq_n_u8(c[1], 4)));
}

/* Integer scores where they apply; a call with a non-finite query takes
 * the float path whole, as on x86 (its outputs are not finite anyway). */
void q4_kv_score(const KVStream *s, const float *q, int nq, int t0, int t1, float *out, int ldo) {
    if (kernels_level() >= 2 && !score_sdot(s, q, nq, t0, t1, out, ldo)) return;
    if (kernels_level() > 0 && nq <= KV_MAX_NQ) score_neon(s, q, nq, t0, t1, out, ldo);
    else score_c(s, q, nq, t0, t1, out, ldo);
}

void q4_kv_accum(const KVStream *s, const float *p, int ldp, int nq, int t0, int t1, float *acc) {
    if (kernels_level() > 0) accum_neon(s, p, ldp, nq, t0, t1, acc);
    else accum_c(s, p, ldp, nq, t0, t1, acc);
}
#else
static void quantize_block_fast(BlockQ4 *b, const float *x) { quantize_block(b, x); }

void q4_kv_score(const KVStream *s, const float *q, int nq, int t0, int t1, float *out, int ldo) {
    score_c(s, q, nq, t0, t1, out, ldo);
}

void q4_kv_accum(const KVStream *s, const float *p, int ldp, int nq, int t0, int t1, float *acc) {
    accum_c(s, p, ldp, nq, t0, t1, acc);
}
#endif /* __x86_64__, __aarch64__ */

static size_t q4_bytes(const KVStream *s) { return (size_t)s->cap * row_bytes(s); }
static size_t q4_span(const KVStream *s, int t) { return (size_t)t * row_bytes(s); }

const KVScheme kv_q4 = {
    .name = "q4", .desc = "llama.cpp q4_0: fp16 scale + 32 nibbles (4.5 bits)",
    .bits = q4_bits, .check = q4_check, .init = q4_init, .free = q4_free,
    .append = q4_append, .truncate = q4_truncate, .dequant = q4_dequant,
    .score = q4_kv_score, .accum = q4_kv_accum, .bytes = q4_bytes, .span = q4_span, .score_err = 5e-3f,
    .score_int = q4_score_int,
};
