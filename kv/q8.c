/* q8.c: llama.cpp's q8_0 as a KV scheme: blocks of 32 values, one fp16
 * scale and 32 signed bytes each, stored in tiles of 16 positions laid out
 * for the integer dot products that read them.
 *
 * Data flow (attn/ -> kv_score / kv_accum -> here -> kernels/quant32.h,
 * kv/pairs16.h): kv_stream_append quantizes one K or V vector into d/32 blocks
 * and writes them into its tile; attention scores and sums straight from
 * the tiles (q8_score, q8_accum), never widening a cached vector into a
 * float buffer: with AVX-512 VNNI as integer dot products over whole tiles,
 * else in floats over whole tiles with AVX-512 or AVX2 (all below; AVX2
 * scores and sums in integers too, at d = 128); on
 * aarch64 the same with sdot (dotprod) or in NEON floats; else plain C
 * through the accessors (always, on other CPUs). Appends are vectorized on
 * AVX-512, AVX2 and NEON, to the same bytes.
 *
 *   tile (16 positions, 17·d bytes): | scales | codes |
 *   scales: fp16 [d/32 blocks][16 positions]          d bytes
 *   K codes: [d/4 quads][16 positions][4 int8]         16·d bytes
 *            one 64-byte line = 4 values of all 16 positions, the operand
 *            vpdpbusd multiplies by 4 query bytes: 16 positions' dots at once
 *   V codes: [8 pairs][d values][2 int8]               16·d bytes
 *            positions 2i and 2i+1 byte by byte, so that 32 bytes widened to
 *            int16 are the word pairs vpdpwssd multiplies by 2 weights
 *
 * Rows of blocks (ggml's order) make scores add up lanes of each position
 * after its dot products, and sums gather every block's scale: in tiles both
 * go, and at long context the cache reads faster than a row layout's
 * (docs/kernel-notes.md#q8-tiles). The bytes are q8_0's, 8.5 bits a value.
 *
 * Rule (ggml quantize_row_q8_0_ref): d = max|x| / 127, q = roundf(x / d)
 * with the float d (before its fp16 rounding), 0 for an all-zero block
 * (and for one so small that 1 / d overflows);
 * x̂ = q · fp16(d).
 */
#include "kernels/half.h"
#include "kernels/matmul.h"
#include "kernels/quant32.h"
#include "kv/kv.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define QK 32
#define TT 16 /* positions per tile */

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

static size_t tile_bytes(const KVStream *s) { return (size_t)17 * s->d; }
static size_t n_tiles(const KVStream *s) { return ((size_t)s->cap + TT - 1) / TT; }

/* On a 64-byte line, as the kernels' 64-byte loads of a line each want
 * (malloc's large blocks sit 16 bytes into a page: every load split in two).
 * The integer kernels read whole tiles, unwritten positions of the last
 * one included, and drop what those give: their score lanes are not
 * stored, their weights and scales are masked to 0 (on AVX2 the products,
 * after) before they are summed. */
static int q8_init(KVStream *s, char *err, size_t errlen) {
    s->data = aligned_alloc(64, (n_tiles(s) * tile_bytes(s) + 63) & ~(size_t)63);
    if (!s->data) { snprintf(err, errlen, "q8: out of memory for %d positions", s->cap); return -1; }
    return 0;
}

static void q8_free(KVStream *s) { free(s->data); }

static const uint8_t *tile(const KVStream *s, int t) { return s->data + (size_t)(t / TT) * tile_bytes(s); }

/* Where position t's code j and block k's scale sit in its tile. */
static size_t code_at(const KVStream *s, int t, int j) {
    const int r = t % TT;
    if (s->role == 0) return (size_t)s->d + (size_t)(j / 4) * 4 * TT + 4 * r + j % 4;
    return (size_t)s->d + (size_t)(r / 2) * 2 * s->d + 2 * j + r % 2;
}
static size_t scale_off(int t, int k) { return 2 * ((size_t)k * TT + t % TT); }
static float scale_at(const KVStream *s, int t, int k) {
    uint16_t h;
    memcpy(&h, tile(s, t) + scale_off(t, k), 2);
    return f16_to_f32(h);
}

/* One block, exactly as ggml: scale from the float amax, codes from 1/d. */
static void append_ref(KVStream *s, const float *x) {
    uint8_t *tl = s->data + (size_t)(s->len / TT) * tile_bytes(s);
    for (int k = 0; k < s->d / QK; k++) {
        const float *xb = x + k * QK;
        float amax = 0;
        for (int j = 0; j < QK; j++) amax = fmaxf(amax, fabsf(xb[j]));
        const float d = amax / 127, id = d > 1.0f / FLT_MAX ? 1.0f / d : 0.0f; /* codes 0 where 1 / d overflows */
        const uint16_t h = f32_to_f16(d);
        memcpy(tl + scale_off(s->len, k), &h, 2);
        for (int j = 0; j < QK; j++) tl[code_at(s, s->len, k * QK + j)] = (uint8_t)(int8_t)roundf(xb[j] * id);
    }
}

/* Positions are independent, so dropping some is only bookkeeping. */
static void q8_truncate(KVStream *s, int n) { (void)s; (void)n; }

static void q8_dequant(const KVStream *s, int t, float *out) {
    const uint8_t *tl = tile(s, t);
    for (int j = 0; j < s->d; j++) out[j] = (int8_t)tl[code_at(s, t, j)] * scale_at(s, t, j / QK);
}

/* Plain C fast path: per block sum_j q_j·code_j, then one multiply by d. */
static void score_c(const KVStream *s, const float *q, int nq, int t0, int t1, float *out, int ldo) {
    for (int t = t0; t < t1; t++) {
        const uint8_t *tl = tile(s, t);
        for (int i = 0; i < nq; i++) {
            const float *qi = q + (size_t)i * s->d;
            float acc = 0;
            for (int k = 0; k < s->d / QK; k++) {
                float dot = 0;
                for (int j = k * QK; j < (k + 1) * QK; j++) dot += qi[j] * (int8_t)tl[code_at(s, t, j)];
                acc += dot * scale_at(s, t, k);
            }
            out[(size_t)i * ldo + (t - t0)] = acc;
        }
    }
}

static void accum_c(const KVStream *s, const float *p, int ldp, int nq, int t0, int t1, float *acc) {
    for (int t = t0; t < t1; t++) {
        const uint8_t *tl = tile(s, t);
        for (int k = 0; k < s->d / QK; k++) {
            const float d = scale_at(s, t, k);
            for (int i = 0; i < nq; i++) {
                const float w = p[(size_t)i * ldp + (t - t0)] * d;
                float *ai = acc + (size_t)i * s->d;
                for (int j = k * QK; j < (k + 1) * QK; j++) ai[j] += w * (int8_t)tl[code_at(s, t, j)];
            }
        }
    }
}

/* ---- the integer scores in plain C (their kernels: integer tiles, below) -- */

/* One head's query in q8_0 blocks, as the integer score reads it. */
typedef struct {
    int8_t c[128];
    float dq[4];      /* block scales d_q, 0 for an all-zero block */
    int32_t bias[4];  /* accumulator starts, -128 Σ c of a block */
} Q8Query;

/* 0, or -1 when q has a non-finite value (the float path takes it). */
static int q8_query_ref(const float *q, Q8Query *o) {
    for (int j = 0; j < 128; j++)
        if (!isfinite(q[j])) return -1;
    for (int b = 0; b < 4; b++) o->dq[b] = quantize32_ref(q + QK * b, o->c + QK * b, &o->bias[b]);
    return 0;
}

static int q8_score_int(const KVStream *s, const float *q, int nq, int t0, int t1, float *out, int ldo) {
    if (s->d != 128 || s->role != 0) return -1;
    for (int i = 0; i < nq; i++) {
        Q8Query o;
        if (q8_query_ref(q + (size_t)i * 128, &o)) return -1;
        for (int t = t0; t < t1; t++) {
            const uint8_t *tl = tile(s, t);
            float f[4];
            for (int b = 0; b < 4; b++) {
                int32_t dot = 0; /* exact: |dot| <= 32 * 128 * 127 */
                for (int j = QK * b; j < QK * (b + 1); j++) dot += (int8_t)tl[code_at(s, t, j)] * o.c[j];
                f[b] = (float)dot * (scale_at(s, t, b) * o.dq[b]);
            }
            out[(size_t)i * ldo + (t - t0)] = (f[0] + f[1]) + (f[2] + f[3]);
        }
    }
    return 0;
}

#if defined(__x86_64__)
#include "kv/pairs16.h"

#include <immintrin.h>

/* append_ref in 16 lanes, the same bytes: the max ignores NaN lanes as
 * fmaxf does (vmaxps returns its second operand when the first is NaN),
 * the scale is the same scalar arithmetic, and roundf's half away from
 * zero is trunc plus one step away from zero where the dropped fraction is
 * at least 1/2 (exact: x · id and its fraction are floats below 2^23).
 * K codes go 4 bytes to a quad's line, V codes to every other byte of the
 * pair's 64 (a masked store). */
__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,f16c"))) static void append512(KVStream *s, const float *x) {
    const int r = s->len % TT;
    uint8_t *tl = s->data + (size_t)(s->len / TT) * tile_bytes(s);
    const __m512 half = _mm512_set1_ps(0.5f), one = _mm512_set1_ps(1.0f);
    for (int k = 0; k < s->d / QK; k++) {
        const __m512 lo = _mm512_loadu_ps(x + k * QK), hi = _mm512_loadu_ps(x + k * QK + 16);
        const float amax = _mm512_reduce_max_ps(
            _mm512_max_ps(_mm512_abs_ps(hi), _mm512_max_ps(_mm512_abs_ps(lo), _mm512_setzero_ps())));
        const float d = amax / 127, id = d > 1.0f / FLT_MAX ? 1.0f / d : 0.0f; /* codes 0 where 1 / d overflows */
        const uint16_t h = f32_to_f16(d);
        memcpy(tl + scale_off(s->len, k), &h, 2);
        __m512i c[2];
        for (int u = 0; u < 2; u++) {
            const __m512 v = _mm512_mul_ps(u ? hi : lo, _mm512_set1_ps(id));
            const __m512 t = _mm512_roundscale_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
            const __mmask16 up = _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_sub_ps(v, t)), half, _CMP_GE_OQ);
            /* one step away from zero: ±1 with v's sign */
            const __m512 step = _mm512_or_ps(one, _mm512_and_ps(v, _mm512_set1_ps(-0.0f)));
            c[u] = _mm512_cvttps_epi32(_mm512_mask_add_ps(t, up, t, step));
        }
        const __m256i codes = _mm256_set_m128i(_mm512_cvtepi32_epi8(c[1]), _mm512_cvtepi32_epi8(c[0]));
        if (s->role == 0) {
            int32_t quad[8];
            _mm256_storeu_si256((__m256i *)quad, codes);
            for (int i = 0; i < 8; i++) memcpy(tl + code_at(s, s->len, k * QK + 4 * i), &quad[i], 4);
        } else {
            const __m512i w = _mm512_sll_epi16(_mm512_cvtepu8_epi16(codes), _mm_cvtsi32_si128(8 * (r % 2)));
            _mm512_mask_storeu_epi8(tl + code_at(s, s->len, k * QK) - r % 2, 0x5555555555555555ULL << (r % 2), w);
        }
    }
}

/* append512 in 8 lanes, the same bytes: vmaxps with the running max
 * second skips NaN lanes as fmaxf does, the rounding is append512's, and
 * each code is its int32's low byte, as vpmovdb (and the plain C cast, on
 * x86) leaves it, not a saturated one. */
__attribute__((target("avx2,f16c"))) static void append_avx2(KVStream *s, const float *x) {
    uint8_t *tl = s->data + (size_t)(s->len / TT) * tile_bytes(s);
    const __m256 half = _mm256_set1_ps(0.5f), one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
    const __m256i low = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 4, 8, 12, -1,
                                         -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
    for (int k = 0; k < s->d / QK; k++) {
        __m256 m = _mm256_setzero_ps();
        for (int u = 0; u < 4; u++) m = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x + k * QK + 8 * u)), m);
        __m128 h4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        h4 = _mm_max_ps(h4, _mm_movehl_ps(h4, h4));
        const float amax = _mm_cvtss_f32(_mm_max_ss(h4, _mm_movehdup_ps(h4)));
        const float d = amax / 127, id = d > 1.0f / FLT_MAX ? 1.0f / d : 0.0f; /* codes 0 where 1 / d overflows */
        const uint16_t h = f32_to_f16(d);
        memcpy(tl + scale_off(s->len, k), &h, 2);
        int8_t c[QK];
        for (int u = 0; u < 4; u++) {
            const __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + k * QK + 8 * u), _mm256_set1_ps(id));
            const __m256 t = _mm256_round_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
            /* one step away from zero where the dropped fraction is at least 1/2 */
            const __m256 up = _mm256_cmp_ps(_mm256_andnot_ps(sign, _mm256_sub_ps(v, t)), half, _CMP_GE_OQ);
            const __m256 step = _mm256_and_ps(up, _mm256_or_ps(one, _mm256_and_ps(v, sign)));
            const __m256i b = _mm256_shuffle_epi8(_mm256_cvttps_epi32(_mm256_add_ps(t, step)), low);
            const int32_t lo = _mm256_cvtsi256_si32(b), hi = _mm256_extract_epi32(b, 4);
            memcpy(c + 8 * u, &lo, 4);
            memcpy(c + 8 * u + 4, &hi, 4);
        }
        for (int j = 0; j < QK; j++) tl[code_at(s, s->len, k * QK + j)] = (uint8_t)c[j];
    }
}

/* 16 lanes where the CPU has AVX-512, 8 with AVX2: plain C makes a libm
 * call (roundf) per value, several times slower, which shows when a long
 * prompt fills the cache (docs/kernel-notes.md#q8-append). */
static void q8_append(KVStream *s, const float *x) {
    if (kernels_level() >= 2) append512(s, x);
    else if (kernels_level() == 1) append_avx2(s, x);
    else append_ref(s, x);
}

#define AVX2_INLINE __attribute__((target("avx2,f16c"), always_inline)) static inline

/* scale_at with F16C, inline: the plain C conversion, called out of line
 * once per block, is a large share of a float path's time
 * (docs/kernel-notes.md#q8-float-tiles). */
AVX2_INLINE float scale16c(const KVStream *s, int t, int k) {
    uint16_t h;
    memcpy(&h, tile(s, t) + scale_off(t, k), 2);
    return _cvtsh_ss(h);
}

/* Lanes of the tile starting at ta that fall in [t0, t1). */
static inline __mmask16 in_range(int ta, int t0, int t1) {
    const int lo = t0 > ta ? t0 - ta : 0, hi = t1 - ta < TT ? t1 - ta : TT;
    return (__mmask16)(((1u << hi) - 1) & ~((1u << lo) - 1));
}

/* Scores of a tile's 16 positions into out: the lanes in range, moved
 * down to the front where the tile starts before t0. */
__attribute__((target("avx512f"), always_inline)) static inline void store_lanes(float *out, __mmask16 m, __m512 v) {
    if (m == 0xffff) _mm512_storeu_ps(out, v);
    else _mm512_mask_storeu_ps(out, (__mmask16)((1u << __builtin_popcount(m)) - 1), _mm512_maskz_compress_ps(m, v));
}

/* ---- float tiles (AVX-512) ------------------------------------------------
 * Without VNNI, or for a head dim other than 128, the same tiles in floats,
 * a lane per position as in the integer kernels. Scores: byte j of each of
 * a K line's 16 dwords, sign-extended by two shifts, is value 4g + j of the
 * 16 positions, times the query's value broadcast; a block's 32 values sum
 * apart and then take the 16 positions' scales (one load). Sums: a V pair's
 * 16 values widened to int16 are dwords | even position | odd position |,
 * split by shifts into two vectors of 16 values, each times its position's
 * weight p_t · d_t. Faster than the same loops on rows of blocks, and far
 * faster than reading tiles through a gather per block
 * (docs/kernel-notes.md#q8-float-tiles). */
#define F512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c"), always_inline)) static inline

/* Scores [t0, t1) of a K stream for NQ <= 4 heads, a tile at a time. */
F512 void score_tiles_f(const KVStream *s, const int NQ, const float *q, int t0, int t1, float *out, int ldo) {
    const int d = s->d;
    for (int ta = t0 - t0 % TT; ta < t1; ta += TT) {
        const uint8_t *tl = tile(s, ta);
        /* a light prefetch two tiles on (untuned, as are the sums' below:
         * these paths serve CPUs without VNNI, and were not tuned on one) */
        _mm_prefetch((const char *)tl + 2 * tile_bytes(s), _MM_HINT_T0);
        __m512 acc[4];
        for (int i = 0; i < NQ; i++) acc[i] = _mm512_setzero_ps();
        for (int b = 0; b < d / QK; b++) {
            __m512 blk[4];
            for (int i = 0; i < NQ; i++) blk[i] = _mm512_setzero_ps();
            for (int g = 8 * b; g < 8 * b + 8; g++) {
                const __m512i line = _mm512_loadu_si512(tl + d + 64 * g);
#pragma GCC unroll 4
                for (int j = 0; j < 4; j++) {
                    const __m512 v = _mm512_cvtepi32_ps(_mm512_srai_epi32(_mm512_slli_epi32(line, 24 - 8 * j), 24));
                    for (int i = 0; i < NQ; i++)
                        blk[i] = _mm512_fmadd_ps(_mm512_set1_ps(q[(size_t)i * d + 4 * g + j]), v, blk[i]);
                }
            }
            const __m512 dk = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(tl + 32 * b)));
            for (int i = 0; i < NQ; i++) acc[i] = _mm512_fmadd_ps(blk[i], dk, acc[i]);
        }
        const __mmask16 m = in_range(ta, t0, t1);
        const int first = ta > t0 ? ta - t0 : 0;
        for (int i = 0; i < NQ; i++) store_lanes(out + (size_t)i * ldo + first, m, acc[i]);
    }
}

__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c"))) static void
score_f512(const KVStream *s, const float *q, int nq, int t0, int t1, float *out, int ldo) {
    for (int i0 = 0; i0 < nq; i0 += 4) {
        const float *qi = q + (size_t)i0 * s->d;
        float *oi = out + (size_t)i0 * ldo;
        switch (nq - i0 < 4 ? nq - i0 : 4) {
        case 1: score_tiles_f(s, 1, qi, t0, t1, oi, ldo); break;
        case 2: score_tiles_f(s, 2, qi, t0, t1, oi, ldo); break;
        case 3: score_tiles_f(s, 3, qi, t0, t1, oi, ldo); break;
        default: score_tiles_f(s, 4, qi, t0, t1, oi, ldo); break;
        }
    }
}

/* acc_i += Σ_t p_i,t v_t over [t0, t1) of a V stream, NH <= 2 heads, values
 * j0..j0+127 of each kept in registers over the whole range. A tile's
 * weights p_t · d_t,b come first, 16 positions a vector (positions outside
 * [t0, t1) masked to 0 before any product: an unwritten scale may be NaN). */
F512 void accum_tiles_f(const KVStream *s, const float *p, int ldp, const int NH, int j0, int t0, int t1,
                        float *acc) {
    const int d = s->d;
    __m512 a[2][8];
    for (int i = 0; i < NH; i++)
        for (int c = 0; c < 8; c++) a[i][c] = _mm512_loadu_ps(acc + (size_t)i * d + j0 + 16 * c);
    for (int ta = t0 - t0 % TT; ta < t1; ta += TT) {
        const uint8_t *tl = tile(s, ta);
        const __mmask16 m = in_range(ta, t0, t1);
        const int first = ta > t0 ? ta - t0 : 0;
        float w[2][4][TT] __attribute__((aligned(64)));
        for (int i = 0; i < NH; i++) {
            const float *pi = p + (size_t)i * ldp + first;
            const __m512 pv = m == 0xffff ? _mm512_loadu_ps(pi) : _mm512_maskz_expandloadu_ps(m, pi);
            for (int b = 0; b < 4; b++) {
                const __m256i h = _mm256_loadu_si256((const __m256i *)(tl + 2 * TT * (j0 / QK + b)));
                const __m512 dv = _mm512_maskz_cvtph_ps(m, h);
                _mm512_store_ps(w[i][b], _mm512_mul_ps(pv, dv));
            }
        }
        for (int r = 0; r < TT; r += 2) {
            const uint8_t *pr = tl + d + (size_t)(r / 2) * 2 * d + 2 * j0;
            _mm_prefetch((const char *)pr + 2 * tile_bytes(s), _MM_HINT_T0);
            _mm_prefetch((const char *)pr + 2 * tile_bytes(s) + 64, _MM_HINT_T0);
#pragma GCC unroll 8
            for (int c = 0; c < 8; c++) {
                const __m512i x = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(pr + 32 * c)));
                const __m512 e = _mm512_cvtepi32_ps(_mm512_srai_epi32(_mm512_slli_epi32(x, 16), 16)),
                             o = _mm512_cvtepi32_ps(_mm512_srai_epi32(x, 16));
                for (int i = 0; i < NH; i++)
                    a[i][c] = _mm512_fmadd_ps(_mm512_set1_ps(w[i][c / 2][r + 1]), o,
                                              _mm512_fmadd_ps(_mm512_set1_ps(w[i][c / 2][r]), e, a[i][c]));
            }
        }
    }
    for (int i = 0; i < NH; i++)
        for (int c = 0; c < 8; c++) _mm512_storeu_ps(acc + (size_t)i * d + j0 + 16 * c, a[i][c]);
}

__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c"))) static void
accum_f512(const KVStream *s, const float *p, int ldp, int nq, int t0, int t1, float *acc) {
    for (int i0 = 0; i0 < nq; i0 += 2)
        for (int j0 = 0; j0 < s->d; j0 += 128) {
            const float *pi = p + (size_t)i0 * ldp;
            float *ai = acc + (size_t)i0 * s->d;
            if (nq - i0 >= 2) accum_tiles_f(s, pi, ldp, 2, j0, t0, t1, ai);
            else accum_tiles_f(s, pi, ldp, 1, j0, t0, t1, ai);
        }
}

/* ---- float tiles (AVX2) ---------------------------------------------------
 * The same loops in 8 lanes: a K line is two halves of 8 positions; a V
 * pair's 16 bytes widen to 8 dwords | even | odd |, and the sums go
 * straight into acc (16 registers hold too little to keep it), every head's
 * from one decode. Here the scores' shifts make the tiles slightly slower
 * than rows of blocks, still well ahead of gathers
 * (docs/kernel-notes.md#q8-float-tiles). */
#define F256 __attribute__((target("avx2,fma,f16c"), always_inline)) static inline

/* Scores [t0, t1) of a K stream for NQ <= 2 heads. */
F256 void score_tiles_a2(const KVStream *s, const int NQ, const float *q, int t0, int t1, float *out, int ldo) {
    const int d = s->d;
    for (int ta = t0 - t0 % TT; ta < t1; ta += TT) {
        const uint8_t *tl = tile(s, ta);
        _mm_prefetch((const char *)tl + 2 * tile_bytes(s), _MM_HINT_T0);
        __m256 acc[2][2]; /* [head][positions 0-7, 8-15] */
        for (int i = 0; i < NQ; i++) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
        for (int b = 0; b < d / QK; b++) {
            __m256 blk[2][2];
            for (int i = 0; i < NQ; i++) blk[i][0] = blk[i][1] = _mm256_setzero_ps();
            for (int g = 8 * b; g < 8 * b + 8; g++)
                for (int h = 0; h < 2; h++) {
                    const __m256i line = _mm256_loadu_si256((const __m256i *)(tl + d + 64 * g + 32 * h));
#pragma GCC unroll 4
                    for (int j = 0; j < 4; j++) {
                        const __m256 v = _mm256_cvtepi32_ps(_mm256_srai_epi32(_mm256_slli_epi32(line, 24 - 8 * j), 24));
                        for (int i = 0; i < NQ; i++)
                            blk[i][h] = _mm256_fmadd_ps(_mm256_set1_ps(q[(size_t)i * d + 4 * g + j]), v, blk[i][h]);
                    }
                }
            for (int h = 0; h < 2; h++) {
                const __m256 dk = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(tl + 32 * b + 16 * h)));
                for (int i = 0; i < NQ; i++) acc[i][h] = _mm256_fmadd_ps(blk[i][h], dk, acc[i][h]);
            }
        }
        const int lo = t0 > ta ? t0 - ta : 0, hi = t1 - ta < TT ? t1 - ta : TT;
        for (int i = 0; i < NQ; i++) {
            float r[TT];
            _mm256_storeu_ps(r, acc[i][0]);
            _mm256_storeu_ps(r + 8, acc[i][1]);
            for (int k = lo; k < hi; k++) out[(size_t)i * ldo + (ta + k - t0)] = r[k];
        }
    }
}

__attribute__((target("avx2,fma,f16c"))) static void score_a2(const KVStream *s, const float *q, int nq, int t0, int t1,
                                                             float *out, int ldo) {
    for (int i0 = 0; i0 < nq; i0 += 2) {
        const float *qi = q + (size_t)i0 * s->d;
        float *oi = out + (size_t)i0 * ldo;
        if (nq - i0 >= 2) score_tiles_a2(s, 2, qi, t0, t1, oi, ldo);
        else score_tiles_a2(s, 1, qi, t0, t1, oi, ldo);
    }
}

/* acc_i += Σ_t p_i,t v_t over [t0, t1) of a V stream, nq <= 8 heads (the
 * caller takes plain C past that). */
__attribute__((target("avx2,fma,f16c"))) static void accum_a2(const KVStream *s, const float *p, int ldp, int nq,
                                                             int t0, int t1, float *acc) {
    const int d = s->d;
    for (int t = t0 & ~1; t < t1; t += 2) {
        const uint8_t *pr = tile(s, t) + d + (size_t)(t % TT / 2) * 2 * d;
        _mm_prefetch((const char *)pr + 2 * tile_bytes(s), _MM_HINT_T0);
        for (int b = 0; b < d / QK; b++) {
            /* the pair's weights p · d per head, 0 outside [t0, t1) (never
             * the scale of an unwritten position: 0 times a NaN is NaN) */
            __m256 w0[8], w1[8];
            for (int i = 0; i < nq; i++) {
                w0[i] = _mm256_set1_ps(t >= t0 ? p[(size_t)i * ldp + (t - t0)] * scale16c(s, t, b) : 0);
                w1[i] = _mm256_set1_ps(t + 1 < t1 ? p[(size_t)i * ldp + (t + 1 - t0)] * scale16c(s, t + 1, b) : 0);
            }
            for (int k = 0; k < 4; k++) {
                const __m256i x = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(pr + 2 * (QK * b + 8 * k))));
                const __m256 e = _mm256_cvtepi32_ps(_mm256_srai_epi32(_mm256_slli_epi32(x, 16), 16)),
                             o = _mm256_cvtepi32_ps(_mm256_srai_epi32(x, 16));
                for (int i = 0; i < nq; i++) {
                    float *ai = acc + (size_t)i * d + QK * b + 8 * k;
                    _mm256_storeu_ps(ai, _mm256_fmadd_ps(w1[i], o, _mm256_fmadd_ps(w0[i], e, _mm256_loadu_ps(ai))));
                }
            }
        }
    }
}

/* ---- integer tiles (AVX-512 VNNI, d = 128) --------------------------------
 * Scores are llama.cpp's q8_0 x q8_0 dot product: each query is rounded to
 * q8_0 blocks once per call (kernels/quant32.h, as the drafter rounds its
 * activations). A K tile's line g holds values 4g..4g+3 of its 16
 * positions; the codes go to u8 by flipping their sign bit (k + 128), and
 * vpdpbusd with the query's 4 bytes g broadcast adds the 4 products of each
 * position into its lane. Each block's 8 lines go into their own
 * accumulator, started at -128 Σ q of the block (which takes the +128 back
 * off), so a tile ends as 4 registers of exact block dots, lane = position:
 *
 *   score(t) = (f0 + f1) + (f2 + f3),   f_b = dot_b · (d_k,b · d_q,b)
 *
 * with the 16 d_k of block b one 32-byte load. The rounding of q adds at
 * most about 3e-3 ‖q‖‖k‖ on random data (score_err); q8_score_int (above)
 * is the same arithmetic in plain C. */

#define VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")))
#define VNNI_INLINE __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c"), always_inline)) static inline

/* q8_query_ref in 16 lanes: the same codes and scales (quant32.h). */
VNNI_INLINE int q8_query(const float *q, Q8Query *o) {
    __mmask16 bad = 0;
    for (int j = 0; j < 128; j += 16) bad |= _mm512_fpclass_ps_mask(_mm512_loadu_ps(q + j), 0x99); /* NaN, ±inf */
    if (bad) return -1;
    for (int b = 0; b < 4; b++) o->dq[b] = quantize32_512(q + QK * b, o->c + QK * b, &o->bias[b]);
    return 0;
}

/* A tile's bytes at d = 128, the only head dim these kernels take (a
 * constant, so that offsets unroll). */
#define TILE128 (17 * 128)

/* Prefetches at two distances, one call per step of 2 positions' work,
 * eighth r of a tile (272 bytes from 272r):
 *   far:  the tile AHEAD tiles on, from DRAM into L2, 10 lines every other
 *         step (from byte 544 · r/2 they reach into the next quarter, so
 *         the four calls cover all 34 lines);
 *   near: the next tile, from L2 into L1, 5 lines every step.
 * Every line needs its own far prefetch (one per 128 bytes leaves half the
 * lines to demand misses), but each holds a fill buffer until its line
 * arrives: 17 at a tile's start stall the loop, and 10 every other step
 * run faster than 5 every step. Without the near ones the loop stalls at
 * the first load of each step, waiting on L2. Any distance from 8 to 32
 * tiles does as well as 16 (docs/kernel-notes.md#q8-prefetch). */
#define AHEAD 16
VNNI_INLINE void tile_ahead(const KVStream *s, int t, int r) {
    const char *far = (const char *)s->data + (size_t)(t / TT + AHEAD) * TILE128 + TILE128 / 8 * r;
    const char *near = (const char *)s->data + (size_t)(t / TT + 1) * TILE128 + TILE128 / 8 * r;
    if (r % 2 == 0)
        for (int b = 0; b < 640; b += 64) _mm_prefetch(far + b, _MM_HINT_T1);
    for (int b = 0; b < 320; b += 64) _mm_prefetch(near + b, _MM_HINT_T0);
}

/* Scores [t0, t1) for NQ <= 4 prepared heads, a tile at a time. */
VNNI_INLINE void score_tiles(const KVStream *s, const int NQ, const Q8Query *o, int t0, int t1, float *out, int ldo) {
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    for (int ta = t0 - t0 % TT; ta < t1; ta += TT) {
        const uint8_t *tl = tile(s, ta);
        __m512i a[4][4];
        for (int i = 0; i < NQ; i++)
            for (int b = 0; b < 4; b++) a[i][b] = _mm512_set1_epi32(o[i].bias[b]);
        /* line g = 8b + r of block b; the four blocks in turn, so that
         * 4 · NQ accumulators are in flight (vpdpbusd takes 5 cycles) */
#pragma GCC unroll 8
        for (int r = 0; r < 8; r++) {
            tile_ahead(s, ta, r);
#pragma GCC unroll 4
            for (int b = 0; b < 4; b++) {
                const __m512i k = _mm512_xor_si512(flip, _mm512_loadu_si512(tl + 128 + 64 * (8 * b + r)));
                for (int i = 0; i < NQ; i++) {
                    int32_t c4; /* the query's 4 codes of line 8b + r */
                    memcpy(&c4, o[i].c + 4 * (8 * b + r), 4);
                    a[i][b] = _mm512_dpbusd_epi32(a[i][b], k, _mm512_set1_epi32(c4));
                }
            }
        }
        /* lane = position ta + lane; edge tiles keep the lanes in range,
         * moved down to the front */
        const __mmask16 m = in_range(ta, t0, t1);
        const int first = ta > t0 ? ta - t0 : 0;
        for (int i = 0; i < NQ; i++) {
            __m512 f[4];
            for (int b = 0; b < 4; b++) {
                const __m512 dk = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(tl + 32 * b)));
                f[b] = _mm512_mul_ps(_mm512_cvtepi32_ps(a[i][b]), _mm512_mul_ps(dk, _mm512_set1_ps(o[i].dq[b])));
            }
            const __m512 sc = _mm512_add_ps(_mm512_add_ps(f[0], f[1]), _mm512_add_ps(f[2], f[3]));
            store_lanes(out + (size_t)i * ldo + first, m, sc);
        }
    }
}

/* 0, or -1 when this call is not the integer path's (d, a V stream's
 * layout, non-finite q). */
VNNI static int score_int(const KVStream *s, const float *q, int nq, int t0, int t1, float *out, int ldo) {
    if (s->d != 128 || s->role != 0) return -1;
    for (int i0 = 0; i0 < nq; i0 += 4) {
        const int m = nq - i0 < 4 ? nq - i0 : 4;
        Q8Query o[4];
        for (int i = 0; i < m; i++)
            if (q8_query(q + (size_t)(i0 + i) * 128, &o[i])) return -1;
        float *oi = out + (size_t)i0 * ldo;
        switch (m) {
        case 1: score_tiles(s, 1, o, t0, t1, oi, ldo); break;
        case 2: score_tiles(s, 2, o, t0, t1, oi, ldo); break;
        case 3: score_tiles(s, 3, o, t0, t1, oi, ldo); break;
        default: score_tiles(s, 4, o, t0, t1, oi, ldo); break;
        }
    }
    return 0;
}

/* The same integer scores on AVX2, half a tile (8 positions) per register:
 * vpmaddubsw multiplies unsigned by signed bytes, so the query's 4 codes
 * of a line go in as magnitudes and their signs move onto the cached codes
 * (vpsignb); two products of at most 127 · 127 fit its int16 pair sum,
 * which vpmaddwd widens at once. Every sum is exact (no +128, no bias), so
 * each block's dot is q8_score_int's, and its float steps follow in its
 * order. Each line is fetched AHEAD tiles on into L2 and one tile on into
 * L1 as it is read. */
/* f_b = dot_b · (d_k,b · d_q,b) of block b for NQ heads, lane = position
 * (h: the tile's half). */
AVX2_INLINE void block_f_avx2(const uint8_t *tl, int b, const int NQ, const Q8Query *o, const uint8_t (*aq)[128],
                              __m256 (*f)[2]) {
    const __m256i one = _mm256_set1_epi16(1);
    __m256i a[4][2];
    for (int i = 0; i < NQ; i++) a[i][0] = a[i][1] = _mm256_setzero_si256();
    for (int r = 0; r < 8; r++) {
        const uint8_t *line = tl + 128 + 64 * (8 * b + r);
        _mm_prefetch((const char *)line + (size_t)AHEAD * TILE128, _MM_HINT_T1);
        _mm_prefetch((const char *)line + TILE128, _MM_HINT_T0);
        const __m256i k0 = _mm256_loadu_si256((const __m256i *)line), k1 = _mm256_loadu_si256((const __m256i *)(line + 32));
        for (int i = 0; i < NQ; i++) {
            int32_t c4, m4; /* the query's 4 codes of line 8b + r, and their magnitudes */
            memcpy(&c4, o[i].c + 4 * (8 * b + r), 4);
            memcpy(&m4, aq[i] + 4 * (8 * b + r), 4);
            const __m256i c = _mm256_set1_epi32(c4), m = _mm256_set1_epi32(m4);
            a[i][0] = _mm256_add_epi32(a[i][0], _mm256_madd_epi16(_mm256_maddubs_epi16(m, _mm256_sign_epi8(k0, c)), one));
            a[i][1] = _mm256_add_epi32(a[i][1], _mm256_madd_epi16(_mm256_maddubs_epi16(m, _mm256_sign_epi8(k1, c)), one));
        }
    }
    const __m256 dk[2] = {_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(tl + 32 * b))),
                          _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(tl + 32 * b + 16)))};
    for (int i = 0; i < NQ; i++)
        for (int h = 0; h < 2; h++)
            f[i][h] = _mm256_mul_ps(_mm256_cvtepi32_ps(a[i][h]), _mm256_mul_ps(dk[h], _mm256_set1_ps(o[i].dq[b])));
}

AVX2_INLINE void score_tiles_avx2(const KVStream *s, const int NQ, const Q8Query *o, const uint8_t (*aq)[128],
                                  int t0, int t1, float *out, int ldo) {
    for (int ta = t0 - t0 % TT; ta < t1; ta += TT) {
        const uint8_t *tl = tile(s, ta);
        for (int u = 0; u < 128; u += 64) {
            _mm_prefetch((const char *)tl + (size_t)AHEAD * TILE128 + u, _MM_HINT_T1);
            _mm_prefetch((const char *)tl + TILE128 + u, _MM_HINT_T0);
        }
        /* (f_0 + f_1) + (f_2 + f_3) */
        __m256 fa[4][2], fb[4][2], s01[4][2];
        block_f_avx2(tl, 0, NQ, o, aq, fa);
        block_f_avx2(tl, 1, NQ, o, aq, fb);
        for (int i = 0; i < NQ; i++)
            for (int h = 0; h < 2; h++) s01[i][h] = _mm256_add_ps(fa[i][h], fb[i][h]);
        block_f_avx2(tl, 2, NQ, o, aq, fa);
        block_f_avx2(tl, 3, NQ, o, aq, fb);
        for (int i = 0; i < NQ; i++) {
            float sc[TT];
            for (int h = 0; h < 2; h++) _mm256_storeu_ps(sc + 8 * h, _mm256_add_ps(s01[i][h], _mm256_add_ps(fa[i][h], fb[i][h])));
            for (int l = 0; l < TT; l++)
                if (ta + l >= t0 && ta + l < t1) out[(size_t)i * ldo + (ta + l - t0)] = sc[l];
        }
    }
}

/* q8_query_ref in 8 lanes (quant32.h), and the codes' magnitudes. */
AVX2_INLINE int q8_query_avx2(const float *q, Q8Query *o, uint8_t *aq) {
    float mx;
    if (absmax_avx2(q, 128, &mx)) return -1; /* NaN or ±inf */
    for (int b = 0; b < 4; b++) {
        o->dq[b] = quantize32_avx2(q + QK * b, o->c + QK * b, &o->bias[b]);
        _mm256_storeu_si256((__m256i *)(aq + QK * b), _mm256_abs_epi8(_mm256_loadu_si256((const __m256i *)(o->c + QK * b))));
    }
    return 0;
}

/* 0, or -1 as score_int. */
__attribute__((target("avx2,fma,f16c"))) static int score_int_avx2(const KVStream *s, const float *q, int nq, int t0,
                                                                   int t1, float *out, int ldo) {
    if (s->d != 128 || s->role != 0) return -1;
    for (int i0 = 0; i0 < nq; i0 += 4) {
        const int m = nq - i0 < 4 ? nq - i0 : 4;
        Q8Query o[4];
        uint8_t aq[4][128];
        for (int i = 0; i < m; i++)
            if (q8_query_avx2(q + (size_t)(i0 + i) * 128, &o[i], aq[i])) return -1;
        float *oi = out + (size_t)i0 * ldo;
        switch (m) {
        case 1: score_tiles_avx2(s, 1, o, aq, t0, t1, oi, ldo); break;
        case 2: score_tiles_avx2(s, 2, o, aq, t0, t1, oi, ldo); break;
        case 3: score_tiles_avx2(s, 3, o, aq, t0, t1, oi, ldo); break;
        default: score_tiles_avx2(s, 4, o, aq, t0, t1, oi, ldo); break;
        }
    }
    return 0;
}

static void q8_score(const KVStream *s, const float *q, int nq, int t0, int t1, float *out, int ldo) {
    if (kernels_level() >= 3 && !score_int(s, q, nq, t0, t1, out, ldo)) return;
    if (kernels_level() == 1 && !score_int_avx2(s, q, nq, t0, t1, out, ldo)) return;
    /* the float tiles read K's layout; a V stream (tests score one) takes plain C */
    if (kernels_level() >= 2 && s->role == 0) score_f512(s, q, nq, t0, t1, out, ldo);
    else if (kernels_level() > 0 && s->role == 0) score_a2(s, q, nq, t0, t1, out, ldo);
    else score_c(s, q, nq, t0, t1, out, ldo);
}

/* Sums acc_i += Σ_t p_i,t v_t over V tiles, as pairs16.h's integer spans
 * (weights p · d rounded to int16 per span, see there) but with no
 * shuffles: spans start on a tile, each pair's 32 bytes of a 16-value
 * piece widen straight to the word pairs vpdpwssd takes, lane j = value j
 * of the piece, and a tile's 16 scales of a block are one load. Positions
 * of the span's tiles outside [t0, t1) get weight 0. NH <= 2 heads:
 * sum[i][c] gets values 16c..16c+15. -1 when a weight is not finite. */
VNNI_INLINE int accum_tiles(const KVStream *s, const float *p, int ldp, const int NH, int t0, int t1,
                            __m512 (*sum)[8]) {
    for (int ta = t0 - t0 % TT; ta < t1; ta += P16_SPAN) {
        const int n = t1 - ta < P16_SPAN ? t1 - ta : P16_SPAN, np = (n + TT - 1) / TT * TT;
        float wf[2][4][P16_SPAN] __attribute__((aligned(64)));
        int16_t wq[2][4][P16_SPAN] __attribute__((aligned(64)));
        float inv[2];
        for (int u = 0; u < np; u += TT) {
            /* weights in range; an edge tile's lanes read only p's own entries */
            const __mmask16 m = in_range(ta + u, t0, t1);
            const int first = ta + u > t0 ? ta + u - t0 : 0;
            const uint8_t *tl = tile(s, ta + u);
            for (int i = 0; i < NH; i++) {
                const float *pi = p + (size_t)i * ldp + first;
                const __m512 w = m == 0xffff ? _mm512_loadu_ps(pi) : _mm512_maskz_expandloadu_ps(m, pi);
                for (int g = 0; g < 4; g++) {
                    const __m512 d = _mm512_maskz_cvtph_ps(m, _mm256_loadu_si256((const __m256i *)(tl + 32 * g)));
                    _mm512_store_ps(wf[i][g] + u, _mm512_mul_ps(w, d));
                }
            }
        }
        for (int i = 0; i < NH; i++)
            if (p16_round((const float (*)[P16_SPAN])wf[i], 4, np, wq[i], &inv[i])) return -1;
        __m512i a[2][8];
        for (int i = 0; i < NH; i++)
            for (int c = 0; c < 8; c++) a[i][c] = _mm512_setzero_si512();
        for (int u0 = 0; u0 < np; u0 += TT) {
            const uint8_t *tl = tile(s, ta + u0);
            for (int u = u0; u < u0 + TT; u += 2) {
                const uint8_t *pr = tl + 128 + (u - u0) / 2 * 256;
                tile_ahead(s, ta + u0, (u - u0) / 2);
#pragma GCC unroll 8
                for (int c = 0; c < 8; c++) {
                    const __m512i x = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(pr + 32 * c)));
                    for (int i = 0; i < NH; i++) {
                        int32_t pair;
                        memcpy(&pair, &wq[i][c / 2][u], 4);
                        a[i][c] = p16_dpwssd(a[i][c], x, _mm512_set1_epi32(pair));
                    }
                }
            }
        }
        for (int i = 0; i < NH; i++)
            for (int c = 0; c < 8; c++)
                sum[i][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a[i][c]), _mm512_set1_ps(inv[i]), sum[i][c]);
    }
    return 0;
}

/* acc += Σ p v in integers, two heads at a time, added only once all of it
 * is summed: 0, or -1 with acc untouched (the float path takes the call). */
VNNI static int accum_int(const KVStream *s, const float *p, int ldp, int nq, int t0, int t1, float *acc) {
    if (s->d != 128 || s->role != 1 || nq > 8) return -1;
    __m512 sum[8][8];
    for (int i = 0; i < nq; i++)
        for (int c = 0; c < 8; c++) sum[i][c] = _mm512_setzero_ps();
    for (int i0 = 0; i0 < nq; i0 += 2) {
        const float *pi = p + (size_t)i0 * ldp;
        if (nq - i0 >= 2 ? accum_tiles(s, pi, ldp, 2, t0, t1, sum + i0) : accum_tiles(s, pi, ldp, 1, t0, t1, sum + i0))
            return -1;
    }
    for (int i = 0; i < nq; i++)
        for (int c = 0; c < 8; c++) {
            float *a = acc + (size_t)i * 128 + 16 * c;
            _mm512_storeu_ps(a, _mm512_add_ps(_mm512_loadu_ps(a), sum[i][c]));
        }
    return 0;
}

/* The same integer sums on AVX2: a V pair's 16 bytes (8 values of both
 * positions) widen to int16 word pairs, and vpmaddwd adds x_t·w_t +
 * x_u·w_u into each value's int32 lane; a span's weights are rounded as
 * on VNNI (p16_round's rule, one scale per head over the span's four
 * blocks). Block b's 32 values go in a pass of their own, so one weight
 * pair serves a step and two heads' 8 sums stay in registers. */
AVX2_INLINE int accum_tiles_avx2(const KVStream *s, const float *p, int ldp, const int NH, int t0, int t1,
                                 __m256 (*sum)[16]) {
    for (int ta = t0 - t0 % TT; ta < t1; ta += P16_SPAN) {
        const int n = t1 - ta < P16_SPAN ? t1 - ta : P16_SPAN, np = (n + TT - 1) / TT * TT;
        float wf[2][4][P16_SPAN];
        int16_t wq[2][4][P16_SPAN];
        float inv[2];
        for (int i = 0; i < NH; i++) {
            /* weights in range, 0 elsewhere, times each block's scales
             * (a tile's 16 of block g are one 32-byte row) */
            float pw[P16_SPAN];
            for (int u = 0; u < np; u++) pw[u] = ta + u >= t0 && ta + u < t1 ? p[(size_t)i * ldp + (ta + u - t0)] : 0;
            for (int u = 0; u < np; u += 8) {
                const uint8_t *sr = tile(s, ta + u) + 2 * (u % TT);
                /* positions past len have no scale yet (any bits): their lanes are zeroed, not multiplied */
                const __m256 pv = _mm256_loadu_ps(pw + u), live = _mm256_cmp_ps(pv, _mm256_setzero_ps(), _CMP_NEQ_UQ);
                for (int g = 0; g < 4; g++)
                    _mm256_storeu_ps(wf[i][g] + u, _mm256_and_ps(live, _mm256_mul_ps(pv, _mm256_cvtph_ps(_mm_loadu_si128(
                                                                                       (const __m128i *)(sr + 32 * g))))));
            }
            if (p16_round_avx2((const float (*)[P16_SPAN])wf[i], 4, np, wq[i], &inv[i])) return -1;
        }
        for (int b = 0; b < 4; b++) {
            __m256i a[2][4];
            for (int i = 0; i < NH; i++)
                for (int k = 0; k < 4; k++) a[i][k] = _mm256_setzero_si256();
            for (int u0 = 0; u0 < np; u0 += TT) {
                const uint8_t *tl = tile(s, ta + u0);
                for (int u = u0; u < u0 + TT; u += 2) {
                    /* pair (u, u + 1)'s 2 · 32 bytes of block b */
                    const uint8_t *pr = tl + 128 + (u - u0) / 2 * 256 + 64 * b;
                    if (b == 0) {
                        _mm_prefetch((const char *)pr + (size_t)AHEAD * TILE128, _MM_HINT_T1);
                        _mm_prefetch((const char *)pr + (size_t)AHEAD * TILE128 + 64, _MM_HINT_T1);
                        _mm_prefetch((const char *)pr + (size_t)AHEAD * TILE128 + 128, _MM_HINT_T1);
                        _mm_prefetch((const char *)pr + (size_t)AHEAD * TILE128 + 192, _MM_HINT_T1);
                    }
                    __m256i w[2];
                    for (int i = 0; i < NH; i++) {
                        int32_t pair;
                        memcpy(&pair, &wq[i][b][u], 4);
                        w[i] = _mm256_set1_epi32(pair);
                    }
                    for (int k = 0; k < 4; k++) {
                        const __m256i x = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(pr + 16 * k)));
                        for (int i = 0; i < NH; i++) a[i][k] = _mm256_add_epi32(a[i][k], _mm256_madd_epi16(x, w[i]));
                    }
                }
            }
            /* lane l of a[i][k]: value 32b + 8k + l */
            for (int i = 0; i < NH; i++)
                for (int k = 0; k < 4; k++)
                    sum[i][4 * b + k] = _mm256_add_ps(sum[i][4 * b + k],
                                                      _mm256_mul_ps(_mm256_cvtepi32_ps(a[i][k]), _mm256_set1_ps(inv[i])));
        }
    }
    return 0;
}

/* acc += Σ p v in integers, two heads at a time, added only once all of it
 * is summed: 0, or -1 with acc untouched (the float path takes the call). */
__attribute__((target("avx2,fma,f16c"))) static int accum_int_avx2(const KVStream *s, const float *p, int ldp, int nq,
                                                                   int t0, int t1, float *acc) {
    if (s->d != 128 || s->role != 1 || nq > 8) return -1;
    __m256 sum[8][16];
    for (int i = 0; i < nq; i++)
        for (int c = 0; c < 16; c++) sum[i][c] = _mm256_setzero_ps();
    for (int i0 = 0; i0 < nq; i0 += 2) {
        const float *pi = p + (size_t)i0 * ldp;
        if (nq - i0 >= 2 ? accum_tiles_avx2(s, pi, ldp, 2, t0, t1, sum + i0)
                         : accum_tiles_avx2(s, pi, ldp, 1, t0, t1, sum + i0))
            return -1;
    }
    for (int i = 0; i < nq; i++)
        for (int c = 0; c < 16; c++) {
            float *a = acc + (size_t)i * 128 + 8 * c;
            _mm256_storeu_ps(a, _mm256_add_ps(_mm256_loadu_ps(a), sum[i][c]));
        }
    return 0;
}

static void q8_accum(const KVStream *s, const float *p, int ldp, int nq, int t0, int t1, float *acc) {
    if (kernels_level() >= 3 && !accum_int(s, p, ldp, nq, t0, t1, acc)) return;
    if (kernels_level() == 1 && !accum_int_avx2(s, p, ldp, nq, t0, t1, acc)) return;
    if (kernels_level() >= 2 && s->role == 1 && s->d % 128 == 0) accum_f512(s, p, ldp, nq, t0, t1, acc);
    else if (kernels_level() > 0 && s->role == 1 && nq <= 8) accum_a2(s, p, ldp, nq, t0, t1, acc);
    else accum_c(s, p, ldp, nq, t0, t1, acc);
}
#elif defined(__aarch64__)
#include <arm_neon.h>

/* ---- aarch64: the same tiles in NEON ---------------------------------------
 * Scores at dotprod and d = 128 are q8_score_int's arithmetic: a K line's
 * 64 bytes are 4 vectors of 4 positions' 4 codes, and sdot with the
 * query's 4 codes of that line in every dword adds each position's 4
 * products into its lane (int8 by int8, so no +128 and no bias); each
 * block's 8 lines sum apart, exact, then take the same float steps.
 * Otherwise in floats, lane = position as well: ld4 splits a K line into
 * its 4 codes of all 16 positions, each widened and multiplied by the
 * query's value; a block's 32 values sum apart, then take the scale, as
 * score_c does. Sums walk a V pair's values 16 bytes at a time (8 values
 * of both positions, interleaved) with ld2, one position after the other,
 * as accum_c does. */

/* Where tile ta's lane l (position ta + l) goes: scores in [t0, t1) only. */
static inline void store4(float *out, int ta, int l, int t0, int t1, float32x4_t v) {
    const int t = ta + l;
    if (t >= t0 && t + 4 <= t1) {
        vst1q_f32(out + (t - t0), v);
        return;
    }
    float f[4];
    vst1q_f32(f, v);
    for (int k = 0; k < 4; k++)
        if (t + k >= t0 && t + k < t1) out[t + k - t0] = f[k];
}

/* Block b's 16 fp16 scales, as 4 vectors of 4 positions. */
static inline void scales16(const uint8_t *tl, int b, float32x4_t dk[4]) {
    const uint16_t *h = (const uint16_t *)(tl + 32 * b);
    for (int g = 0; g < 4; g++) dk[g] = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(h + 4 * g)));
}

__attribute__((target("arch=armv8.2-a+dotprod"))) static int score_sdot(const KVStream *s, const float *q, int nq,
                                                                         int t0, int t1, float *out, int ldo) {
    if (s->d != 128 || s->role != 0) return -1;
    for (int i = 0; i < nq; i++) {
        Q8Query o;
        if (q8_query_ref(q + (size_t)i * 128, &o)) return -1;
        for (int ta = t0 - t0 % TT; ta < t1; ta += TT) {
            const uint8_t *tl = tile(s, ta);
            float32x4_t f[4][4];
            for (int b = 0; b < 4; b++) {
                int32x4_t a[4] = {vdupq_n_s32(0), vdupq_n_s32(0), vdupq_n_s32(0), vdupq_n_s32(0)};
                for (int r = 0; r < 8; r++) {
                    const int8_t *line = (const int8_t *)tl + 128 + 64 * (8 * b + r);
                    int32_t c4;
                    memcpy(&c4, o.c + 4 * (8 * b + r), 4);
                    const int8x16_t qv = vreinterpretq_s8_s32(vdupq_n_s32(c4));
                    for (int g = 0; g < 4; g++) a[g] = vdotq_s32(a[g], vld1q_s8(line + 16 * g), qv);
                }
                float32x4_t dk[4];
                scales16(tl, b, dk);
                for (int g = 0; g < 4; g++) f[b][g] = vmulq_f32(vcvtq_f32_s32(a[g]), vmulq_n_f32(dk[g], o.dq[b]));
            }
            for (int g = 0; g < 4; g++)
                store4(out + (size_t)i * ldo, ta, 4 * g, t0, t1,
                       vaddq_f32(vaddq_f32(f[0][g], f[1][g]), vaddq_f32(f[2][g], f[3][g])));
        }
    }
    return 0;
}

/* score_c with a lane per position: per block, 8 lines of ld4. */
static void score_neon(const KVStream *s, const float *q, int nq, int t0, int t1, float *out, int ldo) {
    const int nb = s->d / QK;
    for (int i = 0; i < nq; i++) {
        const float *qi = q + (size_t)i * s->d;
        for (int ta = t0 - t0 % TT; ta < t1; ta += TT) {
            const uint8_t *tl = tile(s, ta);
            float32x4_t acc[4] = {vdupq_n_f32(0), vdupq_n_f32(0), vdupq_n_f32(0), vdupq_n_f32(0)};
            for (int b = 0; b < nb; b++) {
                float32x4_t dot[4] = {vdupq_n_f32(0), vdupq_n_f32(0), vdupq_n_f32(0), vdupq_n_f32(0)};
                for (int r = 0; r < 8; r++) {
                    /* c.val[j]: code 4(8b + r) + j of the 16 positions */
                    const int8x16x4_t c = vld4q_s8((const int8_t *)tl + s->d + 64 * (8 * b + r));
                    for (int j = 0; j < 4; j++) {
                        const float qj = qi[QK * b + 4 * r + j];
                        const int16x8_t lo = vmovl_s8(vget_low_s8(c.val[j])), hi = vmovl_high_s8(c.val[j]);
                        dot[0] = vfmaq_n_f32(dot[0], vcvtq_f32_s32(vmovl_s16(vget_low_s16(lo))), qj);
                        dot[1] = vfmaq_n_f32(dot[1], vcvtq_f32_s32(vmovl_high_s16(lo)), qj);
                        dot[2] = vfmaq_n_f32(dot[2], vcvtq_f32_s32(vmovl_s16(vget_low_s16(hi))), qj);
                        dot[3] = vfmaq_n_f32(dot[3], vcvtq_f32_s32(vmovl_high_s16(hi)), qj);
                    }
                }
                float32x4_t dk[4];
                scales16(tl, b, dk);
                for (int g = 0; g < 4; g++) acc[g] = vfmaq_f32(acc[g], dot[g], dk[g]);
            }
            for (int g = 0; g < 4; g++) store4(out + (size_t)i * ldo, ta, 4 * g, t0, t1, acc[g]);
        }
    }
}

/* accum_c over a V tile's pairs: 8 values of a position per step. */
static void accum_neon(const KVStream *s, const float *p, int ldp, int nq, int t0, int t1, float *acc) {
    for (int t = t0; t < t1; t++) {
        const uint8_t *tl = tile(s, t);
        const int8_t *pr = (const int8_t *)tl + s->d + (size_t)(t % TT / 2) * 2 * s->d;
        for (int k = 0; k < s->d / QK; k++) {
            const float d = scale_at(s, t, k);
            for (int i = 0; i < nq; i++) {
                const float w = p[(size_t)i * ldp + (t - t0)] * d;
                float *ai = acc + (size_t)i * s->d;
                for (int j = k * QK; j < (k + 1) * QK; j += 8) {
                    const int16x8_t v = vmovl_s8(vld2_s8(pr + 2 * j).val[t % 2]);
                    vst1q_f32(ai + j, vfmaq_n_f32(vld1q_f32(ai + j), vcvtq_f32_s32(vmovl_s16(vget_low_s16(v))), w));
                    vst1q_f32(ai + j + 4, vfmaq_n_f32(vld1q_f32(ai + j + 4), vcvtq_f32_s32(vmovl_high_s16(v)), w));
                }
            }
        }
    }
}

/* append_ref in 4 lanes, the same bytes: the max is exact and skips NaN
 * lanes as fmaxf does (fmaxnm), the scale is the same scalar arithmetic,
 * and fcvtas rounds half away from zero, as roundf. */
static void append_neon(KVStream *s, const float *x) {
    uint8_t *tl = s->data + (size_t)(s->len / TT) * tile_bytes(s);
    for (int k = 0; k < s->d / QK; k++) {
        const float *xb = x + k * QK;
        float32x4_t m = vdupq_n_f32(0);
        for (int j = 0; j < QK; j += 4) m = vmaxnmq_f32(m, vabsq_f32(vld1q_f32(xb + j)));
        const float d = vmaxnmvq_f32(m) / 127, id = d > 1.0f / FLT_MAX ? 1.0f / d : 0.0f;
        const uint16_t h = f32_to_f16(d);
        memcpy(tl + scale_off(s->len, k), &h, 2);
        int8_t q[QK];
        for (int j = 0; j < QK; j += 8) {
            const int32x4_t a = vcvtaq_s32_f32(vmulq_n_f32(vld1q_f32(xb + j), id)),
                            b = vcvtaq_s32_f32(vmulq_n_f32(vld1q_f32(xb + j + 4), id));
            vst1_s8(q + j, vmovn_s16(vcombine_s16(vmovn_s32(a), vmovn_s32(b))));
        }
        /* K: 4 codes to a quad's line; V: every other byte of the pair's row */
        for (int j = 0; j < QK; j += s->role == 0 ? 4 : 1)
            memcpy(tl + code_at(s, s->len, k * QK + j), q + j, s->role == 0 ? 4 : 1);
    }
}

static void q8_append(KVStream *s, const float *x) {
    if (kernels_level() > 0) append_neon(s, x);
    else append_ref(s, x);
}

/* Integer scores where they apply; a call with a non-finite query takes
 * the float path whole, as on x86 (its outputs are not finite anyway). */
static void q8_score(const KVStream *s, const float *q, int nq, int t0, int t1, float *out, int ldo) {
    if (kernels_level() >= 2 && !score_sdot(s, q, nq, t0, t1, out, ldo)) return;
    if (kernels_level() > 0 && s->role == 0) score_neon(s, q, nq, t0, t1, out, ldo);
    else score_c(s, q, nq, t0, t1, out, ldo);
}

static void q8_accum(const KVStream *s, const float *p, int ldp, int nq, int t0, int t1, float *acc) {
    if (kernels_level() > 0 && s->role == 1) accum_neon(s, p, ldp, nq, t0, t1, acc);
    else accum_c(s, p, ldp, nq, t0, t1, acc);
}
#else
/* Other CPUs: plain C throughout. */
static void q8_append(KVStream *s, const float *x) { append_ref(s, x); }

static void q8_score(const KVStream *s, const float *q, int nq, int t0, int t1, float *out, int ldo) {
    score_c(s, q, nq, t0, t1, out, ldo);
}

static void q8_accum(const KVStream *s, const float *p, int ldp, int nq, int t0, int t1, float *acc) {
    accum_c(s, p, ldp, nq, t0, t1, acc);
}
#endif /* __x86_64__, __aarch64__ */

static size_t q8_bytes(const KVStream *s) { return n_tiles(s) * tile_bytes(s); }
/* Whole tiles: a partly filled last one is saved with its unwritten
 * positions, which nothing reads and the next appends overwrite. */
static size_t q8_span(const KVStream *s, int t) { return (size_t)((t + TT - 1) / TT) * tile_bytes(s); }

const KVScheme kv_q8 = {
    .name = "q8", .desc = "llama.cpp q8_0: fp16 scale + 32 int8 (8.5 bits)",
    .bits = q8_bits, .check = q8_check, .init = q8_init, .free = q8_free,
    .append = q8_append, .truncate = q8_truncate, .dequant = q8_dequant,
    .score = q8_score, .accum = q8_accum, .bytes = q8_bytes, .span = q8_span,
    .score_err = 5e-3f, .score_int = q8_score_int, .accum_err = 2e-3f,
};
