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
 * adds 4 products per lane. Two blocks fill a
 * register (lanes 0-7 and 8-15); the accumulator starts at -128 Σ q of
 * each block, which takes the +128 back off, and each lane's integer sum is
 * scaled by its block's d_k · d_q. Per position that is about 14
 * instructions shared by the heads (loads, sign flips, the scale vectors)
 * plus 9 per head, where widening the codes to floats takes 32 plus 8 FMAs
 * per head: scores of 2 heads went from 12.4 to 8.8 ns per position. The
 * rounding of q adds at most about 3e-3 ‖q‖‖k‖ on random data
 * (score_err); q8_score_int is the same arithmetic in plain C.
 *
 *   lanes of the two registers a position fills, per head:
 *   | blk 0: 8 lanes of 4 products | blk 1 | | blk 2 | blk 3 |
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

/* The score from the lane sums, in the order the kernel takes them: lanes
 * scaled, then summed in the tree hsum4_512 uses. */
static float lanes_to_score(const int32_t *a, const int32_t *b, const float *dk, const float *dq) {
    float v[32];
    for (int l = 0; l < 16; l++) {
        v[l] = (float)a[l] * (dk[l / 8] * dq[l / 8]);
        v[16 + l] = (float)b[l] * (dk[2 + l / 8] * dq[2 + l / 8]);
    }
    /* hsum4_512 on (a + b): lanes l and l+16 first, then the tree */
    float w[16];
    for (int l = 0; l < 16; l++) w[l] = v[l] + v[16 + l];
    float p[8]; /* pairs (l, l+2) within each 4-lane group, as unpack lo/hi add */
    for (int g = 0; g < 4; g++) p[2 * g] = w[4 * g] + w[4 * g + 2], p[2 * g + 1] = w[4 * g + 1] + w[4 * g + 3];
    float r[4]; /* then the two halves of each group */
    for (int g = 0; g < 4; g++) r[g] = p[2 * g] + p[2 * g + 1];
    return (r[0] + r[2]) + (r[1] + r[3]);
}

static int q8_score_int(const KVStream *s, const float *q, int nq, int t0, int t1, float *out, int ldo) {
    if (s->d != 128) return -1;
    for (int i = 0; i < nq; i++) {
        Q8Query o;
        if (q8_query_ref(q + (size_t)i * 128, &o)) return -1;
        for (int t = t0; t < t1; t++) {
            const BlockQ8 *blk = row(s, t);
            int32_t a[2][16];
            float dk[4];
            memcpy(a, o.bias, sizeof a);
            for (int b = 0; b < 4; b++) {
                dk[b] = f16_to_f32(blk[b].d);
                for (int j = 0; j < QK; j++) a[b / 2][8 * (b % 2) + j / 4] += (blk[b].q[j] + 128) * o.c[QK * b + j];
            }
            out[(size_t)i * ldo + (t - t0)] = lanes_to_score(a[0], a[1], dk, o.dq);
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

/* Lanes 0-7 hold x, lanes 8-15 y (two fp16 block scales as floats). */
VNNI_INLINE __m512 scale_pair(uint16_t x, uint16_t y) {
    return _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(_mm_set1_epi16((short)x)),
                                                   _mm_set1_epi16((short)y), 1));
}

/* Positions [t0, t1) for NQ <= 4 prepared heads, four positions a step. */
VNNI_INLINE void score_int_body(const KVStream *s, const int NQ, const Q8Query *o, int t0, int t1, float *out,
                                int ldo) {
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    __m512i c[4][2], bias[4][2];
    __m512 dq[4][2];
    for (int i = 0; i < NQ; i++)
        for (int h = 0; h < 2; h++) {
            c[i][h] = _mm512_loadu_si512(o[i].c + 64 * h);
            bias[i][h] = _mm512_loadu_si512(o[i].bias[h]);
            dq[i][h] = _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_set1_ps(o[i].dq[2 * h])),
                                          _mm256_set1_ps(o[i].dq[2 * h + 1]), 1);
        }
    for (int t = t0; t < t1; t += 4) {
        const int R = t1 - t < 4 ? t1 - t : 4;
        __m512 tot[4][4];
        for (int r = 0; r < 4; r++) {
            if (r >= R) {
                for (int i = 0; i < NQ; i++) tot[r][i] = _mm512_setzero_ps();
                continue;
            }
            const BlockQ8 *b = row(s, t + r);
            tile_prefetch(s, row_bytes(s), t + r);
            __m512i k[2];
            __m512 dk[2];
            for (int h = 0; h < 2; h++) {
                k[h] = _mm512_xor_si512(flip, _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256(
                                                                     (const __m256i *)b[2 * h].q)),
                                                                 _mm256_loadu_si256((const __m256i *)b[2 * h + 1].q), 1));
                dk[h] = scale_pair(b[2 * h].d, b[2 * h + 1].d);
            }
            for (int i = 0; i < NQ; i++) {
                const __m512 a0 = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(bias[i][0], k[0], c[i][0])),
                             a1 = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(bias[i][1], k[1], c[i][1]));
                tot[r][i] = _mm512_add_ps(_mm512_mul_ps(a0, _mm512_mul_ps(dk[0], dq[i][0])),
                                          _mm512_mul_ps(a1, _mm512_mul_ps(dk[1], dq[i][1])));
            }
        }
        for (int i = 0; i < NQ; i++) {
            float v[4];
            _mm_storeu_ps(v, hsum4_512(tot[0][i], tot[1][i], tot[2][i], tot[3][i]));
            for (int r = 0; r < R; r++) out[(size_t)i * ldo + (t + r - t0)] = v[r];
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
