/* q8.c: llama.cpp's q8_0 as a KV scheme: blocks of 32 values, one fp16
 * scale and 32 signed bytes each.
 *
 * Data flow: kv_stream_append quantizes one K or V vector into d/32 blocks;
 * attention scores and sums straight from the blocks (q8_score, q8_accum),
 * never widening a cached vector into a float buffer: with AVX-512 VNNI
 * as integer dot products (scores below, sums in kv/pairs16.h), else
 * AVX-512 tiles (kv/tile512.h), else AVX2 or plain C below.
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
#include "kernels/quant32.h"
#include "kv/block32_avx2.h"
#include "kv/kv.h"
#include "kv/pairs16.h"
#include "kv/tile512.h"

#include <immintrin.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* ---- integer scores (AVX-512 VNNI) ----------------------------------------
 * Where the CPU has VNNI and d = 128, scores are llama.cpp's q8_0 x q8_0
 * dot product: each query is rounded to q8_0 blocks once per call
 * (kernels/quant32.h, as the drafter rounds its activations), the cached
 * codes are moved to u8 by flipping their sign bit (k + 128) and vpdpbusd
 * adds 4 products per lane. Two blocks fill a register (lanes 0-7 and
 * 8-15); the accumulator starts at -128 Σ q of each block, which takes the
 * +128 back off. For four positions at a time the 8 registers of lane sums
 * are then added in integers down to one register of 16 exact block dots
 * (position r, block b), which is converted and scaled once by a vector of
 * d_k · d_q (the 16 d_k fetched by one gather), and each position's four
 * scaled blocks are summed as (b0 + b2) + (b1 + b3). Scaling every lane
 * before summing took a scale vector per position built from scalars, two
 * conversions and three multiplies per head and position: scores of 2 heads
 * went from 7.9 to 6.2 ns per position (L3-resident, 1 thread); inside the
 * model at 32K, where the cache streams from memory, q8 decode did not
 * change (1.48x f16 both, alternating in one process). The rounding of q adds at most about 3e-3 ‖q‖‖k‖ on random data
 * (score_err); q8_score_int is the same arithmetic in plain C.
 *
 *   lanes of the two registers a position fills, per head:
 *   | blk 0: 8 lanes of 4 products | blk 1 | | blk 2 | blk 3 |
 *   after the integer sums, lane 4c + w of the four positions' register:
 *   position 2(c / 2) + w / 2, block c % 2 + 2(w % 2)
 */

/* One head's query in q8_0 blocks, as the integer score reads it. */
typedef struct {
    int8_t c[128];
    float dq[4];         /* block scales d_q, 0 for an all-zero block */
    int32_t bias[2][16]; /* accumulator starts: -128 Σ c of a block in its first lane */
} Q8Query;

/* 0, or -1 when q has a non-finite value (the float path takes it). */
static int q8_query_ref(const float *q, Q8Query *o) {
    for (int j = 0; j < 128; j++)
        if (!isfinite(q[j])) return -1;
    memset(o->bias, 0, sizeof o->bias);
    for (int b = 0; b < 4; b++) o->dq[b] = quantize32_ref(q + QK * b, o->c + QK * b, &o->bias[b / 2][8 * (b % 2)]);
    return 0;
}

static int q8_score_int(const KVStream *s, const float *q, int nq, int t0, int t1, float *out, int ldo) {
    if (s->d != 128) return -1;
    for (int i = 0; i < nq; i++) {
        Q8Query o;
        if (q8_query_ref(q + (size_t)i * 128, &o)) return -1;
        for (int t = t0; t < t1; t++) {
            const BlockQ8 *blk = row(s, t);
            float f[4];
            for (int b = 0; b < 4; b++) {
                int32_t dot = 0; /* exact: |dot| <= 32 * 128 * 127 */
                for (int j = 0; j < QK; j++) dot += blk[b].q[j] * o.c[QK * b + j];
                f[b] = (float)dot * (f16_to_f32(blk[b].d) * o.dq[b]);
            }
            out[(size_t)i * ldo + (t - t0)] = (f[0] + f[2]) + (f[1] + f[3]);
        }
    }
    return 0;
}

#define VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")))
#define VNNI_INLINE __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c"), always_inline)) static inline

/* q8_query_ref in 16 lanes: the same codes and scales (quant32.h). */
VNNI_INLINE int q8_query(const float *q, Q8Query *o) {
    __mmask16 bad = 0;
    for (int j = 0; j < 128; j += 16) bad |= _mm512_fpclass_ps_mask(_mm512_loadu_ps(q + j), 0x99); /* NaN, ±inf */
    if (bad) return -1;
    memset(o->bias, 0, sizeof o->bias);
    for (int b = 0; b < 4; b++) o->dq[b] = quantize32_512(q + QK * b, o->c + QK * b, &o->bias[b / 2][8 * (b % 2)]);
    return 0;
}

/* A position's bytes at d = 128, the only head dim these kernels take (a
 * constant, so that the prefetch and gather offsets unroll). */
#define ROW128 (4 * sizeof(BlockQ8))

/* d_k of positions t..t+R-1 in the lane order above, as floats: one gather
 * of the dword at each block's start (its low half is the fp16 scale). */
VNNI_INLINE __m512 scales4(const KVStream *s, int t, int R) {
    const __m512i pos = _mm512_setr_epi32(0, 0, 1, 1, 0, 0, 1, 1, 2, 2, 3, 3, 2, 2, 3, 3),
                  blk = _mm512_setr_epi32(0, 2, 0, 2, 1, 3, 1, 3, 0, 2, 0, 2, 1, 3, 1, 3);
    const __m512i at = _mm512_add_epi32(_mm512_mullo_epi32(pos, _mm512_set1_epi32(ROW128)),
                                        _mm512_mullo_epi32(blk, _mm512_set1_epi32(sizeof(BlockQ8))));
    const __mmask16 k = _mm512_cmplt_epi32_mask(pos, _mm512_set1_epi32(R)); /* positions past t1 unread */
    const __m512i h = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), k, at, (const void *)row(s, t), 1);
    return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(h));
}

/* Positions [t0, t1) for NQ <= 4 prepared heads, four positions a step. */
VNNI_INLINE void score_int_body(const KVStream *s, const int NQ, const Q8Query *o, int t0, int t1, float *out,
                                int ldo) {
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    /* lanes 0, 2, 8, 10 hold the four positions' scores at the end */
    const __m512i pick = _mm512_setr_epi32(0, 2, 8, 10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
    __m512i c[4][2], bias[4][2];
    __m512 dq[4];
    for (int i = 0; i < NQ; i++) {
        for (int h = 0; h < 2; h++) {
            c[i][h] = _mm512_loadu_si512(o[i].c + 64 * h);
            bias[i][h] = _mm512_loadu_si512(o[i].bias[h]);
        }
        /* block c % 2 + 2 (w % 2) of lane 4c + w */
        const float *d = o[i].dq;
        dq[i] = _mm512_setr_ps(d[0], d[2], d[0], d[2], d[1], d[3], d[1], d[3], d[0], d[2], d[0], d[2], d[1], d[3], d[1],
                               d[3]);
    }
    for (int t = t0; t < t1; t += 4) {
        const int R = t1 - t < 4 ? t1 - t : 4;
        __m512i k[4][2];
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) {
            if (r >= R) {
                k[r][0] = k[r][1] = _mm512_setzero_si512();
                continue;
            }
            const BlockQ8 *b = row(s, t + r);
            tile_prefetch(s, ROW128, t + r);
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++) {
                const __m256i x = _mm256_loadu_si256((const __m256i *)b[2 * h].q),
                              y = _mm256_loadu_si256((const __m256i *)b[2 * h + 1].q);
                k[r][h] = _mm512_xor_si512(flip, _mm512_inserti64x4(_mm512_castsi256_si512(x), y, 1));
            }
        }
        const __m512 dk = scales4(s, t, R);
        for (int i = 0; i < NQ; i++) {
            /* per position: the two registers' lanes interleaved and added
             * (each 128-bit chunk then holds two partial sums of a block of
             * each); positions paired the same way; chunks of a block added */
            __m512i u[4];
            for (int r = 0; r < 4; r++) {
                const __m512i a = _mm512_dpbusd_epi32(bias[i][0], k[r][0], c[i][0]),
                              b = _mm512_dpbusd_epi32(bias[i][1], k[r][1], c[i][1]);
                u[r] = _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
            }
            const __m512i v01 = _mm512_add_epi32(_mm512_unpacklo_epi64(u[0], u[1]), _mm512_unpackhi_epi64(u[0], u[1])),
                          v23 = _mm512_add_epi32(_mm512_unpacklo_epi64(u[2], u[3]), _mm512_unpackhi_epi64(u[2], u[3]));
            const __m512i w =
                _mm512_add_epi32(_mm512_shuffle_i32x4(v01, v23, 0x88), _mm512_shuffle_i32x4(v01, v23, 0xDD));
            /* scaled blocks, then (b0 + b2) in lane pairs, + (b1 + b3) from the next chunk */
            const __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(w), _mm512_mul_ps(dk, dq[i]));
            const __m512 g = _mm512_add_ps(f, _mm512_permute_ps(f, 0xB1));
            const __m512 e = _mm512_add_ps(g, _mm512_shuffle_f32x4(g, g, 0xB1));
            _mm_mask_storeu_ps(out + (size_t)i * ldo + (t - t0), (__mmask8)((1u << R) - 1),
                               _mm512_castps512_ps128(_mm512_permutexvar_ps(pick, e)));
        }
    }
}

/* 0, or -1 when this call is not the integer path's (d, non-finite q). */
VNNI static int score_int(const KVStream *s, const float *q, int nq, int t0, int t1, float *out, int ldo) {
    if (s->d != 128) return -1;
    for (int i0 = 0; i0 < nq; i0 += 4) {
        const int m = nq - i0 < 4 ? nq - i0 : 4;
        Q8Query o[4];
        for (int i = 0; i < m; i++)
            if (q8_query(q + (size_t)(i0 + i) * 128, &o[i])) return -1;
        float *oi = out + (size_t)i0 * ldo;
        switch (m) {
        case 1: score_int_body(s, 1, o, t0, t1, oi, ldo); break;
        case 2: score_int_body(s, 2, o, t0, t1, oi, ldo); break;
        case 3: score_int_body(s, 3, o, t0, t1, oi, ldo); break;
        default: score_int_body(s, 4, o, t0, t1, oi, ldo); break;
        }
    }
    return 0;
}

static void q8_score(const KVStream *s, const float *q, int nq, int t0, int t1, float *out, int ldo) {
    if (kernels_level() >= 3 && !score_int(s, q, nq, t0, t1, out, ldo)) return;
    if (kernels_level() >= 2) score512(s, q, nq, t0, t1, out, ldo);
    else if (kernels_level() > 0) score_avx2(s, q, nq, t0, t1, out, ldo);
    else score_c(s, q, nq, t0, t1, out, ldo);
}

/* Position t as pairs16.h reads it: block g's 32 codes as int16, and its
 * scale. */
PAIRS16 void dec16(const KVStream *s, int t, __m512i x[4]) {
    const BlockQ8 *b = row(s, t);
    for (int g = 0; g < 4; g++) x[g] = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)b[g].q));
}

/* 16 positions' fp16 scales of block g in one gather (a dword from each
 * block's start, its low half the scale), as floats. */
PAIRS16 __m512 scale16(const KVStream *s, int t, int g, __mmask16 k) {
    const __m512i at = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                          _mm512_set1_epi32((int)row_bytes(s)));
    const __m512i h = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), k, at, (const void *)(row(s, t) + g), 1);
    return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(h));
}

/* acc += Σ p v in integers (pairs16.h), added only once all of it is
 * summed: 0, or -1 with acc untouched (the float path takes the call). */
VNNI static int accum_int(const KVStream *s, const float *p, int ldp, int nq, int t0, int t1, float *acc) {
    __m512 sum[8][4][2];
    if (s->d != 128 || p16_accum(s, dec16, scale16, 0, row_bytes(s), p, ldp, nq, t0, t1, sum)) return -1;
    for (int i = 0; i < nq; i++)
        for (int g = 0; g < 4; g++)
            for (int h = 0; h < 2; h++) {
                float *a = acc + (size_t)i * 128 + 32 * g + 16 * h;
                _mm512_storeu_ps(a, _mm512_add_ps(_mm512_loadu_ps(a), sum[i][g][h]));
            }
    return 0;
}

static void q8_accum(const KVStream *s, const float *p, int ldp, int nq, int t0, int t1, float *acc) {
    if (kernels_level() >= 3 && !accum_int(s, p, ldp, nq, t0, t1, acc)) return;
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
    .score_err = 5e-3f, .score_int = q8_score_int, .accum_err = 2e-3f,
};
