/* lowbit.c: code packing, block encode/decode and the AVX2 / AVX-512
 * score and accumulate kernels of the packed low-bit KV schemes (layouts in
 * lowbit.h), with integer (AVX-512 VNNI) ones for d = 128 in one block at
 * the end (tbq, polar4, lm3): 4-bit codes on VNNI, 3- and 2-bit codes
 * where the CPU also has VBMI. AVX2 scores and sums 4- and 2-bit codes
 * in integers too (tbq4, polar4, tbq2), and scores 3-bit ones (tbq3).
 * aarch64 has NEON decoding and, with dotprod, the integer scores of
 * tbq4/3/2 and polar4 (the last block).
 * The plain C path is kv.c's reference over lb_dequant (the only one on
 * other CPUs).
 *
 * Data flow: attn/ -> kv_score / kv_accum -> the scheme's table (tbq2/3/4,
 * polar4, lm3, q4h point at lb_kv_score / lb_kv_accum) -> here; the index
 * schemes' appends come in through lb_encode (Lloyd-Max codes,
 * kv/lloydmax.h), q4h writes its q4_0 blocks itself. A stored vector,
 * vec_bytes per position:
 *
 *   | scale (fp16 or fp32) | codes of n values | scale | codes | ...   nb blocks
 *
 * References: the public TBQ4_0 / turbo llama.cpp forks for the 2/3/4-bit
 * index packing, llama.cpp's q4_0 for LB_Q4_0 (spec kv_schemes.md).
 *
 * AVX2 decodes 8 codes with a 32-bit broadcast of the bytes holding them, a
 * per-lane variable shift that moves code k to the bottom of lane k, and
 * vpermps, which looks each lane up in an 8-entry codebook held in a
 * register using only the lane's low 3 bits (so nothing needs masking).
 * 4-bit codes need two 8-entry halves and a blend on bit 3, which is why on
 * AVX-512 machines they take a 16-lane path instead (see below); q4_0
 * nibbles are integers and are converted. Decoded values feed one FMA per
 * query head, so a group of up to 4 heads shares every decode (8, a
 * prefill block's, for the scores of one-block vectors: score_oct_body);
 * wider groups are split. Block scales are applied once per block (score)
 * or folded into the softmax weights (accumulate). At d = 128, score +
 * accumulate over 4-bit codes cost less than f16's on AVX-512 and about
 * as much on AVX2 (docs/kernel-notes.md#lowbit-cost).
 */
#include "kv/lowbit.h"
#include "kernels/half.h"
#include "kernels/matmul.h"
#include "kv/lloydmax.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Index kinds store kind bits per value; q4_0 16 bytes per 32. */
void lb_fmt(LbFmt *f, int kind, int n, int nb, int hdr, int renorm, float cb_scale) {
    memset(f, 0, sizeof *f);
    f->kind = kind;
    f->n = n;
    f->nb = nb;
    f->hdr = hdr;
    f->renorm = renorm;
    f->blk_bytes = hdr + (kind == LB_Q4_0 ? 16 : n * kind / 8);
    f->vec_bytes = nb * f->blk_bytes;
    if (kind == LB_Q4_0) return;
    lm_codebook(kind, cb_scale, f->cb, f->mid);
    const int k = 1 << kind;
    float m = 0;
    for (int i = 0; i < k; i++) m = fmaxf(m, fabsf(f->cb[i]));
    f->cb8_s = 127.0f / m;
    for (int i = 0; i < 64; i++) f->cb8[i] = (uint8_t)(lrintf(f->cb[i & (k - 1)] * f->cb8_s) + 128);
    f->cb16_s = 1023.0f / m;
    f->cb16_d = m / 1023.0f;
    for (int i = 0; i < 32; i++) f->cb16[i] = (int16_t)lrintf(f->cb[i & (k - 1)] * f->cb16_s);
    f->sq_d = m * m / 16383.0f;
    for (int i = 0; i < 16; i++) {
        const float c = f->cb[i & (k - 1)];
        const int q = (int)lrintf(c * c / (m * m) * 16383.0f);
        f->sq_lo[i] = (uint8_t)(q & 63);
        f->sq_hi[i] = (uint8_t)(q >> 6);
    }
}

int lb_code(const uint8_t *qs, int bits, int j) {
    if (bits == 4) return (qs[j >> 1] >> ((j & 1) * 4)) & 15;
    if (bits == 2) return (qs[j >> 2] >> ((j & 3) * 2)) & 3;
    const uint8_t *w = qs + 3 * (j / 8); /* the 24-bit word of j's group of 8 */
    uint32_t v = (uint32_t)w[0] | (uint32_t)w[1] << 8 | (uint32_t)w[2] << 16;
    return (int)(v >> (3 * (j % 8))) & 7;
}

/* lm_nearest's indices of y[0..j) for the largest j its SIMD path takes
 * (defined with the kernels below, 0 where none runs); returns j. */
static int nearest_fast(const float *mid, int k, const float *y, int n, int *idx);

float lb_encode(const LbFmt *f, const float *y, uint8_t *qs) {
    const int bits = f->kind, k = 1 << bits;
    float nn = 0;
    int idx[KV_MAX_DIM];
    const int j0 = nearest_fast(f->mid, k, y, f->n, idx);
    for (int j = j0; j < f->n; j++) idx[j] = lm_nearest(f->mid, k, y[j]);
    for (int j = 0; j < f->n; j++) nn += f->cb[idx[j]] * f->cb[idx[j]];
    /* n is a multiple of 8: whole bytes for every width */
    if (bits == 4)
        for (int j = 0; j < f->n; j += 2) qs[j >> 1] = (uint8_t)(idx[j] | idx[j + 1] << 4);
    else if (bits == 2)
        for (int j = 0; j < f->n; j += 4)
            qs[j >> 2] = (uint8_t)(idx[j] | idx[j + 1] << 2 | idx[j + 2] << 4 | idx[j + 3] << 6);
    else
        /* 8 codes of 3 bits, a little-endian 24-bit word: code c at bit 3c */
        for (int j = 0; j < f->n; j += 8) {
            uint32_t w = 0;
            for (int c = 0; c < 8; c++) w |= (uint32_t)idx[j + c] << (3 * c);
            qs[3 * (j / 8)] = (uint8_t)w, qs[3 * (j / 8) + 1] = (uint8_t)(w >> 8), qs[3 * (j / 8) + 2] = (uint8_t)(w >> 16);
        }
    return sqrtf(nn);
}

/* The value a block's header stores (fp16 or fp32). */
static float header(const uint8_t *blk, int hdr) {
    if (hdr == 4) {
        float g;
        memcpy(&g, blk, 4);
        return g;
    }
    uint16_t h;
    memcpy(&h, blk, 2);
    return f16_to_f32(h);
}

void lb_dequant(const LbFmt *f, const uint8_t *vec, float *out) {
    for (int b = 0; b < f->nb; b++, vec += f->blk_bytes, out += f->n) {
        const uint8_t *qs = vec + f->hdr;
        float s = header(vec, f->hdr);
        if (f->kind == LB_Q4_0) {
            for (int j = 0; j < 16; j++) {
                out[j] = (float)((qs[j] & 15) - 8) * s;
                out[j + 16] = (float)((qs[j] >> 4) - 8) * s;
            }
            continue;
        }
        for (int j = 0; j < f->n; j++) out[j] = f->cb[lb_code(qs, f->kind, j)];
        if (f->renorm) {
            /* polar4: ŷ/‖ŷ‖ · γ */
            float nn = 0;
            for (int j = 0; j < f->n; j++) nn += out[j] * out[j];
            s /= sqrtf(nn);
        }
        for (int j = 0; j < f->n; j++) out[j] *= s;
    }
}

/* ---- the integer scores in plain C (their kernels: VNNI scores, below) -- */

/* One head's query as the integer score reads it. */
typedef struct {
    int8_t qe[64], qo[64];
    int32_t bias; /* 128 Σ q8: what the codebook's +128 adds */
    float inv;    /* 1 / (q_s · cb8_s), 0 for an all-zero query */
} LbQ8;

/* The scale both query paths use: lim / max|q| (127 for bytes, 16383 for
 * lm3's words); -1 for a non-finite query (the float path takes it), 0 for
 * an all-zero one. */
static float q_scale(const float *q, float lim) {
    float m = 0;
    for (int j = 0; j < 128; j++) {
        if (!isfinite(q[j])) return -1;
        m = fmaxf(m, fabsf(q[j]));
    }
    return m > lim / FLT_MAX ? lim / m : 0; /* a query so small that lim / m overflows scores 0 */
}

static void q8_finish(LbQ8 *o, float s, float cb8_s, int32_t sum) {
    o->bias = 128 * sum;
    o->inv = s > 0 ? 1.0f / (s * cb8_s) : 0;
}

static void q8_prep_ref(const float *q, float s, float cb8_s, LbQ8 *o) {
    int32_t sum = 0;
    for (int b = 0; b < 64; b++) {
        o->qe[b] = (int8_t)lrintf(q[2 * b] * s);
        o->qo[b] = (int8_t)lrintf(q[2 * b + 1] * s);
        sum += o->qe[b] + o->qo[b];
    }
    q8_finish(o, s, cb8_s, sum);
}

/* Integer sum of one position's codes against one query (value j's code
 * times query value j: qe holds the even ones, qo the odd). */
static int32_t i8_dot_ref(const uint8_t *cb8, int bits, const uint8_t *qs, const LbQ8 *o) {
    int32_t a = 0;
    for (int j = 0; j < 128; j++) a += cb8[lb_code(qs, bits, j)] * (j & 1 ? o->qo[j / 2] : o->qe[j / 2]);
    return a;
}

/* The integer paths read d = 128 in one block (which of them a CPU runs:
 * int_codes, with the kernels below). */
static int int_shape(const KVStream *s) {
    const LbFmt *f = s->aux;
    return f->kind != LB_Q4_0 && f->nb == 1 && f->n == 128 && s->d == 128;
}

/* Byte scores: tbq (fp16 scale) and polar4 (fp32 scale, renorm over
 * 4-bit codes). */
static int i8_path(const KVStream *s) {
    const LbFmt *f = s->aux;
    return int_shape(s) && (f->renorm ? f->kind == LB_IDX4 : f->hdr == 2);
}

/* Word scores: lm3 (fp32 scale, 3-bit codes, no rotation). Rounding its
 * unrotated queries to 8 bits moved the shipped model's logits by up to
 * 1.8% of the largest, so they go to 14 bits (16383 / max|q|) against the
 * 10-bit cb16: 128 · 16383 · 1023 keeps every sum below 2^31. Its
 * score_err (5e-4) is the tests' worst (2.4e-4) with room, not a bound: a
 * key of nothing but the smallest centroid, whose 10-bit rounding is
 * 0.4%, could reach about 4e-3 of ‖q‖‖k‖. */
static int w16_path(const KVStream *s) {
    const LbFmt *f = s->aux;
    return int_shape(s) && f->kind == LB_IDX3 && f->hdr == 4 && !f->renorm;
}

/* One head's query as the word scores read it, in value order. */
typedef struct {
    int16_t q[128];
    float inv; /* 1 / (q_s · cb16_s), 0 for an all-zero query */
} LbQ16;

static void q16_prep_ref(const float *q, float s, float cb16_s, LbQ16 *o) {
    for (int j = 0; j < 128; j++) o->q[j] = (int16_t)lrintf(q[j] * s);
    o->inv = s > 0 ? 1.0f / (s * cb16_s) : 0;
}

static int32_t w16_dot_ref(const int16_t *cb16, const uint8_t *qs, const LbQ16 *o) {
    int32_t a = 0;
    for (int j = 0; j < 128; j++) a += cb16[lb_code(qs, 3, j)] * o->q[j];
    return a;
}

/* polar4's Σ sq14[idx] over a block's 128 4-bit codes: exact, below 2^22. */
static int32_t norm2_i(const LbFmt *f, const uint8_t *qs) {
    int32_t a = 0;
    for (int j = 0; j < 128; j++) {
        const int c = lb_code(qs, 4, j);
        a += f->sq_lo[c] + 64 * f->sq_hi[c];
    }
    return a;
}

/* A block's scale as the integer scores apply it: the stored one, or for
 * polar4 γ / ‖cb[idx]‖ with the norm from norm2_i. */
static float i8_scale(const LbFmt *f, const uint8_t *blk) {
    const float g = header(blk, f->hdr);
    return f->renorm ? g / sqrtf((float)norm2_i(f, blk + f->hdr) * f->sq_d) : g;
}

int lb_score_int_ref(const KVStream *s, const float *q, int nq, int t0, int t1, float *out, int ldo) {
    const LbFmt *f = s->aux;
    const int w16 = w16_path(s);
    if (!i8_path(s) && !w16) return -1;
    for (int i = 0; i < nq; i++)
        if (q_scale(q + (size_t)i * 128, 127.0f) < 0) return -1;
    for (int i = 0; w16 && i < nq; i++) {
        LbQ16 o;
        q16_prep_ref(q + (size_t)i * 128, q_scale(q + (size_t)i * 128, 16383.0f), f->cb16_s, &o);
        for (int t = t0; t < t1; t++) {
            const uint8_t *blk = s->data + (size_t)t * (size_t)f->vec_bytes;
            out[(size_t)i * ldo + (t - t0)] = (float)w16_dot_ref(f->cb16, blk + f->hdr, &o) * header(blk, f->hdr) * o.inv;
        }
    }
    for (int i = 0; !w16 && i < nq; i++) {
        LbQ8 o;
        q8_prep_ref(q + (size_t)i * 128, q_scale(q + (size_t)i * 128, 127.0f), f->cb8_s, &o);
        for (int t = t0; t < t1; t++) {
            const uint8_t *blk = s->data + (size_t)t * (size_t)f->vec_bytes;
            out[(size_t)i * ldo + (t - t0)] = (float)(i8_dot_ref(f->cb8, f->kind, blk + f->hdr, &o) - o.bias) * i8_scale(f, blk) * o.inv;
        }
    }
    return 0;
}

/* ---- stream glue --------------------------------------------------------- */

int lb_stream_init(KVStream *s, const LbFmt *f, size_t aux_bytes, char *err, size_t errlen) {
    s->data = malloc((size_t)s->cap * (size_t)f->vec_bytes);
    s->aux = calloc(1, aux_bytes);
    if (!s->data || !s->aux) {
        free(s->data);
        free(s->aux);
        s->data = NULL;
        s->aux = NULL;
        snprintf(err, errlen, "%s: out of memory for %d positions", s->scheme->name, s->cap);
        return -1;
    }
    memcpy(s->aux, f, sizeof *f);
    return 0;
}

uint8_t *lb_slot(KVStream *s) {
    const LbFmt *f = s->aux;
    return s->data + (size_t)s->len * (size_t)f->vec_bytes;
}

int lb_no_opts(const KVOpts *o, const char *scheme, char *err, size_t errlen) {
    if (!o->group && !o->residual) return 0;
    snprintf(err, errlen, "%s: takes no options (found g/r)", scheme);
    return -1;
}

void lb_kv_free(KVStream *s) {
    free(s->data);
    free(s->aux);
}

/* Vectors are independent: nothing beyond len is ever read. */
void lb_kv_truncate(KVStream *s, int n) {
    (void)s;
    (void)n;
}

void lb_kv_dequant(const KVStream *s, int t, float *out) {
    const LbFmt *f = s->aux;
    lb_dequant(f, s->data + (size_t)t * (size_t)f->vec_bytes, out);
}

size_t lb_kv_bytes(const KVStream *s) {
    const LbFmt *f = s->aux;
    return (size_t)s->cap * (size_t)f->vec_bytes;
}

size_t lb_kv_span(const KVStream *s, int t) {
    const LbFmt *f = s->aux;
    return (size_t)t * (size_t)f->vec_bytes;
}

#if defined(__x86_64__)
#include "kernels/hsum.h"
#include "kernels/quant32.h"
#include "kv/pairs16.h"

#include <immintrin.h>

/* lm_nearest for 16 values at a time: one compare per midpoint, counted
 * in the lanes (the same strict v > mid, so the same indices). */
__attribute__((target("avx512f"))) static void nearest16(const float *mid, int k, const float *y, int *idx) {
    __m512 v = _mm512_loadu_ps(y);
    __m512i c = _mm512_setzero_si512();
    const __m512i one = _mm512_set1_epi32(1);
    for (int m = 0; m < k - 1; m++)
        c = _mm512_mask_add_epi32(c, _mm512_cmp_ps_mask(v, _mm512_set1_ps(mid[m]), _CMP_GT_OQ), c, one);
    _mm512_storeu_si512(idx, c);
}

/* nearest16 on 8 lanes: an all-ones compare subtracted adds 1. */
__attribute__((target("avx2"))) static void nearest8(const float *mid, int k, const float *y, int *idx) {
    const __m256 v = _mm256_loadu_ps(y);
    __m256i c = _mm256_setzero_si256();
    for (int m = 0; m < k - 1; m++)
        c = _mm256_sub_epi32(c, _mm256_castps_si256(_mm256_cmp_ps(v, _mm256_set1_ps(mid[m]), _CMP_GT_OQ)));
    _mm256_storeu_si256((__m256i *)idx, c);
}

static int nearest_fast(const float *mid, int k, const float *y, int n, int *idx) {
    int j0 = 0;
    if (kernels_level() >= 2)
        for (; j0 + 16 <= n; j0 += 16) nearest16(mid, k, y + j0, idx + j0);
    else if (kernels_level() == 1)
        for (; j0 + 8 <= n; j0 += 8) nearest8(mid, k, y + j0, idx + j0);
    return j0;
}

/* ---- AVX2 kernels -------------------------------------------------------- */

/* Plain always_inline: they need only SSE, so every x86 level below may
 * inline them. */
#define PREFETCH __attribute__((always_inline)) static inline

/* Positions [t, t + n) of a stream of vb-byte vectors, fetched ahead of
 * use into L1, and the same LB_FAR positions on from DRAM into L2: the K
 * and V streams alternate every attention chunk, and without the near ones
 * the 4-bit kernels wait on memory at long context. Always inline like
 * the kernels it serves: as a plain static inline, GCC 12 emits none of
 * its prefetches (no prefetcht0 in this file's object). Both distances pay
 * at long context (docs/kernel-notes.md#lowbit-prefetch). */
#define LB_AHEAD 32
#define LB_FAR P16_FAR /* pairs16.h's far distance (512 positions), tuned with it */

/* The near half alone: what the 3- and 2-bit integer scores take, whose
 * far prefetches cost more than they saved (docs/kernel-notes.md#tbq-vbmi). */
PREFETCH void lb_prefetch_near(const uint8_t *data, int vb, int t, int n) {
    const char *p = (const char *)data + (size_t)t * (size_t)vb;
    for (size_t b = 0; b < (size_t)n * (size_t)vb; b += 64) _mm_prefetch(p + b, _MM_HINT_T0);
}

PREFETCH void lb_prefetch(const uint8_t *data, int vb, int t, int n) {
    const char *p = (const char *)data + (size_t)t * (size_t)vb;
    lb_prefetch_near(data, vb, t, n);
    for (size_t b = 0; b < (size_t)n * (size_t)vb; b += 64) _mm_prefetch(p + (size_t)LB_FAR * vb + b, _MM_HINT_T1);
}

#define AVX2 __attribute__((target("avx2,fma,f16c")))
#define AVX2_INLINE __attribute__((target("avx2,fma,f16c"), always_inline)) static inline

/* Per-call decode constants: codebook halves and the lane shifts. */
typedef struct {
    __m256 lo, hi;
    __m256i sh;
} Dec;

AVX2_INLINE Dec dec_init(const LbFmt *f, const int kind) {
    Dec z = {_mm256_loadu_ps(f->cb), _mm256_loadu_ps(f->cb + 8), _mm256_setzero_si256()};
    if (kind == LB_IDX4) z.sh = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
    /* 3-bit groups are loaded from one byte early (see dec8), hence the +8 */
    if (kind == LB_IDX3) z.sh = _mm256_setr_epi32(8, 11, 14, 17, 20, 23, 26, 29);
    if (kind == LB_IDX2) {
        /* entries 4..7 repeat 0..3, so bit 2 (the next code's) is ignored */
        z.lo = _mm256_setr_ps(f->cb[0], f->cb[1], f->cb[2], f->cb[3], f->cb[0], f->cb[1], f->cb[2], f->cb[3]);
        z.sh = _mm256_setr_epi32(16, 18, 20, 22, 24, 26, 28, 30);
    }
    return z;
}

/* Values 8g..8g+7 of a block whose codes start at qs, unscaled. The 32-bit
 * loads for 3 and 2 bits end at the group's last byte and so start up to 2
 * bytes before qs, inside the block's own header: never past the vector. */
AVX2_INLINE __m256 dec8(const int kind, const Dec *z, const uint8_t *qs, int g) {
    if (kind == LB_Q4_0) {
        /* group g: nibble g >> 1 of bytes 8(g & 1) .. +7, as (q - 8) */
        __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(qs + 8 * (g & 1))));
        b = g & 2 ? _mm256_srli_epi32(b, 4) : _mm256_and_si256(b, _mm256_set1_epi32(15));
        return _mm256_cvtepi32_ps(_mm256_sub_epi32(b, _mm256_set1_epi32(8)));
    }
    const uint8_t *at = kind == LB_IDX4 ? qs + 4 * g : kind == LB_IDX3 ? qs + 3 * g - 1 : qs + 2 * g - 2;
    __m256i idx = _mm256_srlv_epi32(_mm256_broadcastd_epi32(_mm_loadu_si32(at)), z->sh);
    __m256 c = _mm256_permutevar8x32_ps(z->lo, idx);
    if (kind == LB_IDX4)
        c = _mm256_blendv_ps(c, _mm256_permutevar8x32_ps(z->hi, idx), _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28)));
    return c;
}

AVX2_INLINE float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* The stored scale; F16C for the fp16 one. */
AVX2_INLINE float header_avx2(const uint8_t *blk, int hdr) {
    if (hdr == 4) {
        float g;
        memcpy(&g, blk, 4);
        return g;
    }
    uint16_t h;
    memcpy(&h, blk, 2);
    return _cvtsh_ss(h);
}

/* ‖cb[idx]‖² of one block's codes (polar4's norm correction). */
AVX2_INLINE float code_norm2(const int kind, const Dec *z, const uint8_t *qs, int ng) {
    __m256 a = _mm256_setzero_ps(), b = _mm256_setzero_ps();
    for (int g = 0; g < ng; g += 2) {
        __m256 k0 = dec8(kind, z, qs, g), k1 = dec8(kind, z, qs, g + 1);
        a = _mm256_fmadd_ps(k0, k0, a);
        b = _mm256_fmadd_ps(k1, k1, b);
    }
    return hsum(_mm256_add_ps(a, b));
}

/* out[i][t - t0] = q_i · v_t for NQ <= 4 heads; q [NQ][d] with row stride d.
 * Two accumulators per head over alternate groups hide FMA latency; each
 * block's sum is scaled once, one horizontal sum per head and position. */
AVX2_INLINE void score_body(const LbFmt *f, const int kind, const int NQ, const int renorm, const uint8_t *data,
                            int d, const float *q, int t0, int t1, float *out, int ldo) {
    const Dec z = dec_init(f, kind);
    const int n = kind == LB_Q4_0 ? 32 : f->n;
    for (int t = t0; t < t1; t++) {
        const uint8_t *blk = data + (size_t)t * (size_t)f->vec_bytes;
        __m256 tot[4];
        for (int i = 0; i < NQ; i++) tot[i] = _mm256_setzero_ps();
        for (int b = 0; b < f->nb; b++, blk += f->blk_bytes) {
            const uint8_t *qs = blk + f->hdr;
            const float *qb = q + (size_t)b * n;
            __m256 a0[4], a1[4], n0 = _mm256_setzero_ps(), n1 = _mm256_setzero_ps();
            for (int i = 0; i < NQ; i++) a0[i] = a1[i] = _mm256_setzero_ps();
            for (int g = 0; g < n / 8; g += 2) {
                __m256 k0 = dec8(kind, &z, qs, g), k1 = dec8(kind, &z, qs, g + 1);
                for (int i = 0; i < NQ; i++) {
                    a0[i] = _mm256_fmadd_ps(_mm256_loadu_ps(qb + (size_t)i * d + 8 * g), k0, a0[i]);
                    a1[i] = _mm256_fmadd_ps(_mm256_loadu_ps(qb + (size_t)i * d + 8 * g + 8), k1, a1[i]);
                }
                if (renorm) {
                    n0 = _mm256_fmadd_ps(k0, k0, n0);
                    n1 = _mm256_fmadd_ps(k1, k1, n1);
                }
            }
            float s = header_avx2(blk, f->hdr);
            if (renorm) s /= sqrtf(hsum(_mm256_add_ps(n0, n1)));
            const __m256 sv = _mm256_set1_ps(s);
            for (int i = 0; i < NQ; i++) tot[i] = _mm256_fmadd_ps(sv, _mm256_add_ps(a0[i], a1[i]), tot[i]);
        }
        for (int i = 0; i < NQ; i++) out[(size_t)i * ldo + (t - t0)] = hsum(tot[i]);
    }
}

/* score_body for a vector of one block (nb = 1) without renorm, NQ <= 8
 * heads at once (KV_MAX_NQ: prefill's whole block): each decoded group of
 * 8 codes feeds one FMA chain per head, so decoding (shifts and vpermps,
 * which share an FMA port) costs an eighth of an FMA's port time where
 * all 8 come; fewer heads take RP = 2 or 4 positions a step, so that
 * decode's two heads still run 8 chains. Sums go through hsum4_256 trees
 * (four heads of a position, or four positions of a head: the same tree
 * per lane) and are multiplied by the block scale. A head's chain over a
 * position is the same for any NQ and any RP. */
AVX2_INLINE void score_oct_body(const LbFmt *f, const int kind, const int NQ, const uint8_t *data, int d,
                                const float *q, int t0, int t1, float *out, int ldo) {
    const Dec z = dec_init(f, kind);
    const int RP = NQ <= 2 ? 4 : NQ <= 4 ? 2 : 1;
    const size_t vb = (size_t)f->vec_bytes;
    const __m256 zero = _mm256_setzero_ps();
    for (int t = t0; t < t1; t += RP) {
        const int R = t1 - t < RP ? t1 - t : RP;
        /* positions past R repeat the last one: decoded, not stored */
        const uint8_t *b[4];
        for (int r = 0; r < RP; r++) b[r] = data + (size_t)(t + (r < R ? r : R - 1)) * vb;
        __m256 a[8]; /* position r, head i: a[r * NQ + i] */
        for (int j = 0; j < RP * NQ; j++) a[j] = zero;
        for (int g = 0; g < f->n / 8; g++)
            for (int r = 0; r < RP; r++) {
                const __m256 k = dec8(kind, &z, b[r] + f->hdr, g);
                for (int i = 0; i < NQ; i++)
                    a[r * NQ + i] = _mm256_fmadd_ps(_mm256_loadu_ps(q + (size_t)i * d + 8 * g), k, a[r * NQ + i]);
            }
        float v[4];
        if (RP == 4) {
            /* a head's four positions a tree, times their four scales */
            const __m128 sc = _mm_setr_ps(header_avx2(b[0], f->hdr), header_avx2(b[1], f->hdr),
                                          header_avx2(b[2], f->hdr), header_avx2(b[3], f->hdr));
            for (int i = 0; i < NQ; i++) {
                _mm_storeu_ps(v, _mm_mul_ps(hsum4_256(a[i], a[NQ + i], a[2 * NQ + i], a[3 * NQ + i]), sc));
                for (int r = 0; r < R; r++) out[(size_t)i * ldo + (t + r - t0)] = v[r];
            }
            continue;
        }
        for (int r = 0; r < R; r++) {
            const __m256 *ar = a + r * NQ;
            const __m128 sc = _mm_set1_ps(header_avx2(b[r], f->hdr));
            for (int i0 = 0; i0 < NQ; i0 += 4) {
                const __m128 h = hsum4_256(ar[i0], i0 + 1 < NQ ? ar[i0 + 1] : zero, i0 + 2 < NQ ? ar[i0 + 2] : zero,
                                           i0 + 3 < NQ ? ar[i0 + 3] : zero);
                _mm_storeu_ps(v, _mm_mul_ps(h, sc));
                for (int i = i0; i < NQ && i < i0 + 4; i++) out[(size_t)i * ldo + (t + r - t0)] = v[i - i0];
            }
        }
    }
}

enum { TILE = 64 }; /* positions per accumulate tile: TILE · 66 B of codes stay in L1 */

/* acc[i][d] += sum_t p[i][t - t0] v_t for NQ <= 4 heads. Positions go in
 * tiles: the softmax weights times each position's block scale go to w
 * first, then each chunk of G groups (8G values) keeps its NQ·G partial sums
 * in registers over the whole tile. */
AVX2_INLINE void accum_body(const LbFmt *f, const int kind, const int NQ, const int G, const int renorm,
                            const uint8_t *data, int d, const float *p, int ldp, int t0, int t1, float *acc) {
    const Dec z = dec_init(f, kind);
    const int n = kind == LB_Q4_0 ? 32 : f->n, vb = f->vec_bytes;
    float w[4][TILE];
    for (int b = 0; b < f->nb; b++)
        for (int ta = t0; ta < t1; ta += TILE) {
            const int tn = t1 - ta < TILE ? t1 - ta : TILE;
            const uint8_t *base = data + (size_t)ta * (size_t)vb + (size_t)b * (size_t)f->blk_bytes;
            for (int t = 0; t < tn; t++) {
                const uint8_t *blk = base + (size_t)t * (size_t)vb;
                float s = header_avx2(blk, f->hdr);
                if (renorm) s /= sqrtf(code_norm2(kind, &z, blk + f->hdr, n / 8));
                for (int i = 0; i < NQ; i++) w[i][t] = p[(size_t)i * ldp + (size_t)(ta - t0 + t)] * s;
            }
            for (int c = 0; c < n / 8; c += G) {
                float *ab = acc + (size_t)b * n + 8 * c;
                __m256 a[4][4];
                for (int i = 0; i < NQ; i++)
                    for (int k = 0; k < G; k++) a[i][k] = _mm256_loadu_ps(ab + (size_t)i * d + 8 * k);
                for (int t = 0; t < tn; t++) {
                    const uint8_t *qs = base + (size_t)t * (size_t)vb + f->hdr;
                    __m256 wv[4];
                    for (int i = 0; i < NQ; i++) wv[i] = _mm256_set1_ps(w[i][t]);
                    for (int k = 0; k < G; k++) {
                        const __m256 v = dec8(kind, &z, qs, c + k);
                        for (int i = 0; i < NQ; i++) a[i][k] = _mm256_fmadd_ps(wv[i], v, a[i][k]);
                    }
                }
                for (int i = 0; i < NQ; i++)
                    for (int k = 0; k < G; k++) _mm256_storeu_ps(ab + (size_t)i * d + 8 * k, a[i][k]);
            }
        }
}

/* One specialised body per (kind, heads, renorm): the loops over heads and
 * groups unroll and the partial sums live in registers. */
#define BY_NQ(BODY, ...)                                                                                            \
    switch (nq) {                                                                                                   \
    case 1: BODY(__VA_ARGS__, 1); break;                                                                            \
    case 2: BODY(__VA_ARGS__, 2); break;                                                                            \
    case 3: BODY(__VA_ARGS__, 3); break;                                                                            \
    default: BODY(__VA_ARGS__, 4); break;                                                                           \
    }

AVX2 static void score_avx2(const LbFmt *f, const uint8_t *data, int d, const float *q, int nq, int t0, int t1,
                            float *out, int ldo) {
#define SCORE(K, R, N) score_body(f, K, N, R, data, d, q, t0, t1, out, ldo)
    if (f->nb == 1 && !f->renorm) {
#define OCT(K)                                                                                                      \
    switch (nq) {                                                                                                   \
    case 1: score_oct_body(f, K, 1, data, d, q, t0, t1, out, ldo); break;                                           \
    case 2: score_oct_body(f, K, 2, data, d, q, t0, t1, out, ldo); break;                                           \
    case 3: score_oct_body(f, K, 3, data, d, q, t0, t1, out, ldo); break;                                           \
    case 4: score_oct_body(f, K, 4, data, d, q, t0, t1, out, ldo); break;                                           \
    case 5: score_oct_body(f, K, 5, data, d, q, t0, t1, out, ldo); break;                                           \
    case 6: score_oct_body(f, K, 6, data, d, q, t0, t1, out, ldo); break;                                           \
    case 7: score_oct_body(f, K, 7, data, d, q, t0, t1, out, ldo); break;                                           \
    default: score_oct_body(f, K, 8, data, d, q, t0, t1, out, ldo); break;                                          \
    }
        switch (f->kind) {
        case LB_IDX2: OCT(LB_IDX2); break;
        case LB_IDX3: OCT(LB_IDX3); break;
        case LB_IDX4: OCT(LB_IDX4); break;
        default: OCT(LB_Q4_0); break;
        }
#undef OCT
        return;
    }
    switch (f->kind) {
    case LB_IDX2: BY_NQ(SCORE, LB_IDX2, 0); break;
    case LB_IDX3: BY_NQ(SCORE, LB_IDX3, 0); break;
    case LB_IDX4:
        if (f->renorm) BY_NQ(SCORE, LB_IDX4, 1) else BY_NQ(SCORE, LB_IDX4, 0);
        break;
    default: BY_NQ(SCORE, LB_Q4_0, 0); break;
    }
#undef SCORE
}

/* Up to two heads take 4 groups (32 values) per chunk, more heads 2, so
 * NQ·G <= 8 accumulators stay in registers. */
AVX2 static void accum_avx2(const LbFmt *f, const uint8_t *data, int d, const float *p, int ldp, int nq, int t0,
                            int t1, float *acc) {
#define ACCUM(K, R, N) accum_body(f, K, N, (N) <= 2 ? 4 : 2, R, data, d, p, ldp, t0, t1, acc)
    switch (f->kind) {
    case LB_IDX2: BY_NQ(ACCUM, LB_IDX2, 0); break;
    case LB_IDX3: BY_NQ(ACCUM, LB_IDX3, 0); break;
    case LB_IDX4:
        if (f->renorm) BY_NQ(ACCUM, LB_IDX4, 1) else BY_NQ(ACCUM, LB_IDX4, 0);
        break;
    default: BY_NQ(ACCUM, LB_Q4_0, 0); break;
    }
#undef ACCUM
}

/* ---- AVX2 integer scores for 4-, 3- and 2-bit codes ----------------------
 * d = 128, tbq4, tbq3, tbq2 and polar4: lb_score_int_ref's arithmetic with
 * 256-bit integers. vpshufb looks 32 codes up at once in the 16-byte
 * codebook with its bytes signed (cb8 - 128, so the sum needs no bias
 * term), held in both lanes. vpmaddubsw multiplies unsigned by signed
 * bytes, so the query's signs move onto the codebook bytes (vpsignb) and
 * its magnitudes stay unsigned: two products of at most 127 · 127 each
 * fit its int16 pair sum, which vpmaddwd widens to int32 before any
 * further addition. Every sum is exact, so the integer equals the twin's
 * Σ cb8[idx]·q - bias.
 * A position's codes come apart in four 32-byte chunks of code indices, and
 * the query is laid out once per call in the same order (q8_prep_avx2):
 *   4-bit: | even values 0-62 | odd 1-63 | even 64-126 | odd 65-127 |
 *          (low and high nibbles of code bytes 0-31, then of 32-63)
 *   3-bit: chunk k holds values 32k .. 32k + 31, each 16 of them
 *          transposed 4 x 4: byte 4d + e of a 16-byte lane is value 4e + d
 *          (unpack3, below)
 *   2-bit: | values 4b | 4b + 1 | 4b + 2 | 4b + 3 |, b = 0..31
 *          (bits 0-1, 2-3, 4-5, 6-7 of the 32 code bytes) */

/* One head's query as this path reads it, in its codes' chunk order:
 * magnitudes and signs apart. */
typedef struct {
    uint8_t a[128]; /* |q| */
    int8_t sg[128]; /* q: its signs for vpsignb */
} LbQ8Avx2;

/* A block's stored scale bits: fp16 (tbq) or fp32 (polar4). */
static inline uint16_t rd16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return h;
}

static inline float rd32f(const uint8_t *p) {
    float g;
    memcpy(&g, p, 4);
    return g;
}

/* q·cb over 32 byte pairs in 8 int32 lanes: |q| times cb with q's sign. */
AVX2_INLINE __m256i dot32_i8(__m256i cb, const uint8_t *aq, const int8_t *sq) {
    const __m256i p = _mm256_maddubs_epi16(_mm256_loadu_si256((const __m256i *)aq),
                                           _mm256_sign_epi8(cb, _mm256_loadu_si256((const __m256i *)sq)));
    return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}

/* Σ sq14[idx] of one block's 128 codes (low nibbles l0, l1, high h0, h1):
 * four 6-bit sq_lo bytes add up in a byte, vpsadbw sums bytes exactly. */
AVX2_INLINE __m256i norm2_avx2(__m256i l0, __m256i h0, __m256i l1, __m256i h1, __m256i sql, __m256i sqh) {
    const __m256i z = _mm256_setzero_si256();
    const __m256i lo = _mm256_add_epi8(_mm256_add_epi8(_mm256_shuffle_epi8(sql, l0), _mm256_shuffle_epi8(sql, h0)),
                                       _mm256_add_epi8(_mm256_shuffle_epi8(sql, l1), _mm256_shuffle_epi8(sql, h1)));
    const __m256i hi = _mm256_add_epi64(
        _mm256_add_epi64(_mm256_sad_epu8(_mm256_shuffle_epi8(sqh, l0), z), _mm256_sad_epu8(_mm256_shuffle_epi8(sqh, h0), z)),
        _mm256_add_epi64(_mm256_sad_epu8(_mm256_shuffle_epi8(sqh, l1), z), _mm256_sad_epu8(_mm256_shuffle_epi8(sqh, h1), z)));
    /* 64-bit lanes below 2^22: their low dwords carry the sums */
    return _mm256_add_epi64(_mm256_sad_epu8(lo, z), _mm256_slli_epi64(hi, 6));
}

/* 3-bit codes (a group of 8 in 3 bytes, code c at bit 3c) as bytes, 32 a
 * step, without VBMI's bit gathers. Chunk k (values 32k .. 32k + 31) is
 * code bytes 12k .. 12k + 11, read as 16 bytes broadcast to both lanes
 * (from byte 0 for k = 0, from 12k - 4 after it: no read leaves the row).
 * Lane L takes values 16L + c, bytes 6L .. 6L + 5. Codes c and c + 8 sit
 * at the same bit offset s, 3 bytes apart, so a dword holding the two
 * 16-bit windows that contain them takes one shift for both: path A
 * (codes d and d + 8 of dword d) shifts right by s, leaving them in bytes
 * 0 and 2; path B (codes 4 + d and 12 + d) shifts left by 8 - s, into
 * bytes 1 and 3. A byte blend and a mask then leave code 4e + d in byte
 * 4d + e, which the query's bytes copy (q8_prep_avx2). */
typedef struct {
    __m256i ga[2], gb[2]; /* vpshufb gathers of the windows, for k = 0 and k > 0 */
    __m256i sa, sb;       /* each dword's shift */
} Unpack3;

/* The gathers: byte e of dword d in lane L takes byte 6L + 3c / 8 + (e & 1)
 * of the chunk for code c = d + 8 (e >> 1) (path A) or 4 + d + 8 (e >> 1)
 * (B); byte 12 holds none of lane 1's codes (its last, at the lane's bits
 * 45-47, tops byte 11) and reads as zero (0x80, still so plus 4). From
 * 12k - 4 every index is 4 more. The shifts: 3c mod 8 to the right for
 * A, 8 minus that to the left for B. */
AVX2_INLINE void unpack3_init(Unpack3 *u) {
    u->ga[0] = _mm256_setr_epi8(0, 1, 3, 4, 0, 1, 3, 4, 0, 1, 3, 4, 1, 2, 4, 5, 6, 7, 9, 10, 6, 7, 9, 10, 6, 7, 9, 10,
                                7, 8, 10, 11);
    u->gb[0] = _mm256_setr_epi8(1, 2, 4, 5, 1, 2, 4, 5, 2, 3, 5, 6, 2, 3, 5, 6, 7, 8, 10, 11, 7, 8, 10, 11, 8, 9, 11,
                                (char)0x80, 8, 9, 11, (char)0x80);
    u->ga[1] = _mm256_add_epi8(u->ga[0], _mm256_set1_epi8(4));
    u->gb[1] = _mm256_add_epi8(u->gb[0], _mm256_set1_epi8(4));
    u->sa = _mm256_setr_epi32(0, 3, 6, 1, 0, 3, 6, 1);
    u->sb = _mm256_setr_epi32(4, 1, 6, 3, 4, 1, 6, 3);
}

/* Chunk k of a row's 3-bit codes as 32 code bytes (unpack3's order). */
AVX2_INLINE __m256i unpack3(const uint8_t *qs, int k, const Unpack3 *u) {
    const int w = k > 0;
    const __m256i v = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(qs + (w ? 12 * k - 4 : 0))));
    const __m256i a = _mm256_srlv_epi32(_mm256_shuffle_epi8(v, u->ga[w]), u->sa);
    const __m256i b = _mm256_sllv_epi32(_mm256_shuffle_epi8(v, u->gb[w]), u->sb);
    return _mm256_and_si256(_mm256_blendv_epi8(a, b, _mm256_set1_epi16((short)0x8000)), _mm256_set1_epi8(7));
}

/* One position's four chunks of signed codebook bytes (B = 4, 3 or 2 bits;
 * the 16-entry table repeats a 3-bit codebook), and for polar4 (RN) its
 * Σ sq14[idx]. */
AVX2_INLINE void chunks_i8(const int B, const int RN, const uint8_t *qs, __m256i tbl, __m256i sql, __m256i sqh,
                           const Unpack3 *u3, __m256i x[4], __m256i *nrm) {
    if (B == 3) {
        for (int k = 0; k < 4; k++) x[k] = _mm256_shuffle_epi8(tbl, unpack3(qs, k, u3));
        return;
    }
    const __m256i v0 = _mm256_loadu_si256((const __m256i *)qs);
    if (B == 2) {
        const __m256i m3 = _mm256_set1_epi8(3);
        /* a 16-bit shift moves the next byte's bits into the top of each
         * byte, above the two the mask keeps */
        for (int k = 0; k < 4; k++)
            x[k] = _mm256_shuffle_epi8(tbl, _mm256_and_si256(_mm256_srli_epi16(v0, 2 * k), m3));
        return;
    }
    const __m256i m4 = _mm256_set1_epi8(15), v1 = _mm256_loadu_si256((const __m256i *)(qs + 32));
    const __m256i l0 = _mm256_and_si256(v0, m4), h0 = _mm256_and_si256(_mm256_srli_epi16(v0, 4), m4),
                  l1 = _mm256_and_si256(v1, m4), h1 = _mm256_and_si256(_mm256_srli_epi16(v1, 4), m4);
    x[0] = _mm256_shuffle_epi8(tbl, l0);
    x[1] = _mm256_shuffle_epi8(tbl, h0);
    x[2] = _mm256_shuffle_epi8(tbl, l1);
    x[3] = _mm256_shuffle_epi8(tbl, h1);
    if (RN) *nrm = norm2_avx2(l0, h0, l1, h1, sql, sqh);
}

/* Positions [t0, t1) for NQ <= 4 prepared queries, four at a time: one
 * hsum tree per head for the four, then lb_score_int_ref's float steps in
 * its order. RN: polar4's γ / ‖cb[idx]‖ with the integer norms. */
AVX2_INLINE void score_i8_avx2_body(const LbFmt *f, const int B, const int NQ, const int RN, const uint8_t *data,
                                    const LbQ8Avx2 *o, const float *inv, int t0, int t1, float *out, int ldo) {
    int8_t cbs[16];
    for (int i = 0; i < 16; i++) cbs[i] = (int8_t)(f->cb8[i] - 128);
    const __m256i tbl = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)cbs)),
                  sql = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)f->sq_lo)),
                  sqh = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)f->sq_hi));
    const size_t vb = (size_t)f->vec_bytes;
    Unpack3 u3;
    if (B == 3) unpack3_init(&u3);
    for (int t = t0; t < t1; t += 4) {
        const int R = t1 - t < 4 ? t1 - t : 4;
        __m256i acc[4][4], nrm[4];
        lb_prefetch(data, f->vec_bytes, t + LB_AHEAD, 4);
        for (int r = 0; r < 4; r++) {
            nrm[r] = _mm256_set1_epi64x(1); /* any nonzero norm: a lane past R is not stored */
            if (r >= R) {
                for (int i = 0; i < NQ; i++) acc[r][i] = _mm256_setzero_si256();
                continue;
            }
            __m256i x[4];
            chunks_i8(B, RN, data + (size_t)(t + r) * vb + f->hdr, tbl, sql, sqh, &u3, x, &nrm[r]);
            for (int i = 0; i < NQ; i++)
                acc[r][i] = _mm256_add_epi32(
                    _mm256_add_epi32(dot32_i8(x[0], o[i].a, o[i].sg), dot32_i8(x[1], o[i].a + 32, o[i].sg + 32)),
                    _mm256_add_epi32(dot32_i8(x[2], o[i].a + 64, o[i].sg + 64),
                                     dot32_i8(x[3], o[i].a + 96, o[i].sg + 96)));
        }
        /* the four scales loaded straight into lanes (positions past R
         * read position t: not stored), not through a float array, whose
         * four scalar stores would stall the vector load reading them */
        const uint8_t *b0 = data + (size_t)t * vb, *b1 = b0 + (R > 1 ? vb : 0), *b2 = b0 + (R > 2 ? 2 * vb : 0),
                      *b3 = b0 + (R > 3 ? 3 * vb : 0);
        __m128 sv = f->hdr == 2 ? _mm_cvtph_ps(_mm_setr_epi16((short)rd16(b0), (short)rd16(b1), (short)rd16(b2),
                                                              (short)rd16(b3), 0, 0, 0, 0))
                                : _mm_setr_ps(rd32f(b0), rd32f(b1), rd32f(b2), rd32f(b3));
        if (RN) {
            /* each norm sits in dword lanes 0, 2, 4, 6; the rest are zero */
            const __m128 n2 = _mm_cvtepi32_ps(hsum4_i32_avx2(nrm[0], nrm[1], nrm[2], nrm[3]));
            sv = _mm_div_ps(sv, _mm_sqrt_ps(_mm_mul_ps(n2, _mm_set1_ps(f->sq_d))));
        }
        for (int i = 0; i < NQ; i++) {
            float s4[4];
            const __m128 dot = _mm_cvtepi32_ps(hsum4_i32_avx2(acc[0][i], acc[1][i], acc[2][i], acc[3][i]));
            _mm_storeu_ps(s4, _mm_mul_ps(_mm_mul_ps(dot, sv), _mm_set1_ps(inv[i])));
            for (int r = 0; r < R; r++) out[(size_t)i * ldo + (t - t0) + r] = s4[r];
        }
    }
}

/* q_scale and q8_prep_ref in 8 lanes (max is exact, vcvtps2dq rounds as
 * lrintf does): the same bytes, in the chunk order of B-bit codes (above);
 * -1 for a non-finite query. */
AVX2_INLINE int q8_prep_avx2(const int B, const float *q, float cb8_s, LbQ8Avx2 *o, float *inv) {
    float mx;
    if (absmax_avx2(q, 128, &mx)) return -1;
    const float s = mx > 127.0f / FLT_MAX ? 127.0f / mx : 0;
    __m256i sum = _mm256_setzero_si256(), v[4];
    for (int k = 0; k < 4; k++) v[k] = round32_avx2(q + 32 * k, _mm256_set1_ps(s), &sum);
    if (B == 4) {
        split2_avx2(v);
        split2_avx2(v + 2);
    } else if (B == 2) {
        split4_avx2(v);
    } else {
        /* each 16 values transposed 4 x 4 (unpack3) */
        const __m256i tr = _mm256_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15, 0, 4, 8, 12, 1, 5, 9,
                                            13, 2, 6, 10, 14, 3, 7, 11, 15);
        for (int k = 0; k < 4; k++) v[k] = _mm256_shuffle_epi8(v[k], tr);
    }
    for (int c = 0; c < 4; c++) {
        _mm256_storeu_si256((__m256i *)(o->sg + 32 * c), v[c]);
        _mm256_storeu_si256((__m256i *)(o->a + 32 * c), _mm256_abs_epi8(v[c]));
    }
    *inv = s > 0 ? 1.0f / (s * cb8_s) : 0;
    return 0;
}

/* 0, or -1 when a query is not finite (the caller takes the float path). */
AVX2 static int score_i8_avx2(const LbFmt *f, const uint8_t *data, const float *q, int nq, int t0, int t1,
                              float *out, int ldo) {
    LbQ8Avx2 o[4];
    float inv[4];
    for (int i = 0; i < nq; i++)
        if (q8_prep_avx2(f->kind, q + (size_t)i * 128, f->cb8_s, &o[i], &inv[i])) return -1;
#define SCORE_I8(NQ)                                                                                                \
    f->kind == LB_IDX2   ? score_i8_avx2_body(f, 2, NQ, 0, data, o, inv, t0, t1, out, ldo)                          \
    : f->kind == LB_IDX3 ? score_i8_avx2_body(f, 3, NQ, 0, data, o, inv, t0, t1, out, ldo)                          \
    : f->renorm          ? score_i8_avx2_body(f, 4, NQ, 1, data, o, inv, t0, t1, out, ldo)                          \
                         : score_i8_avx2_body(f, 4, NQ, 0, data, o, inv, t0, t1, out, ldo)
    switch (nq) {
    case 1: SCORE_I8(1); break;
    case 2: SCORE_I8(2); break;
    case 3: SCORE_I8(3); break;
    default: SCORE_I8(4); break;
    }
#undef SCORE_I8
    return 0;
}

/* ---- AVX2 integer sums for 4- and 2-bit codes -----------------------------
 * d = 128, tbq4, tbq2 and polar4: pairs16.h's arithmetic in 256-bit
 * registers. Per span of up to P16_SPAN positions and per head, the weights
 * p_t · scale_t · cb16_d are rounded to int16 at 32767 / max|w|, and
 * vpmaddwd adds x_t[j]·w_t + x_u[j]·w_u over a pair of positions (t, u)
 * into lane j's int32 sum, x the 10-bit codebook cb16 (1023 · 32767 ·
 * P16_SPAN stays below 2^31). A pair decodes as: code bytes of t and u
 * interleaved (vpunpck*bw), codes apart (nibbles, or 2-bit fields), each
 * looked up twice by vpshufb (cb16's low and high bytes), the two results
 * interleaved again: word pairs (x_t[j], x_u[j]), one value per dword lane.
 * The span's sums go to floats once, times max|w| / 32767; what the
 * rounding adds is accum_err, as on AVX-512 VNNI, whose sums these are not
 * bit for bit (other spans' float additions).
 *
 *   4-bit, quarter c = 2h + e: code bytes 32h + b, b in {0-7, 16-23}
 *   (e = 0) or {8-15, 24-31} (e = 1), low and high nibbles;
 *   2-bit, quarter c = 2e + k': code bytes b as above, fields 2k' and
 *   2k' + 1;
 *   each in 4 sum vectors (2 codes, each in two unpack halves):
 *   lb_sum_value says which value a lane holds */

/* Value of lane l of sum vector k (k = 4c + 2n + m: quarter c, code n of
 * the quarter's two, unpack half m) for B-bit codes. */
static int lb_sum_value(int B, int k, int l) {
    const int c = k / 4, n = k / 2 % 2, m = k % 2, e = B == 4 ? c % 2 : c / 2;
    const int b = 8 * e + (l < 4 ? 4 * m + l : 16 + 4 * m + l - 4);
    return B == 4 ? 2 * (32 * (c / 2) + b) + n : 4 * b + 2 * (c % 2) + n;
}

/* One span for NQ <= 4 heads (weights wq[i][0..np)), quarter by quarter,
 * adding the span's sums as floats into S[i][k][l] (sum vector k, lane l).
 * Up to two heads take a quarter's two codes of a pair in one pass (8
 * sums), more heads one code a pass, so that the sums stay 8 registers. */
AVX2_INLINE void lb_span16_avx2(const int B, const uint8_t *data, int vb, int hdr, const int NQ, int t0, int n,
                                const int16_t (*wq)[P16_SPAN], const float *inv, __m256i tlo, __m256i thi,
                                float (*S)[16][8]) {
    const __m256i mask = _mm256_set1_epi8(B == 4 ? 15 : 3);
    const int np = (n + 1) & ~1, HS = NQ <= 2 ? 2 : 1;
    for (int c = 0; c < 4; c++)
        for (int h0 = 0; h0 < 2; h0 += HS) {
            const int off = B == 4 ? 32 * (c / 2) : 0, e = B == 4 ? c % 2 : c / 2, sh = B == 4 ? 0 : 4 * (c % 2);
            __m256i a[4][4];
            for (int i = 0; i < NQ; i++)
                for (int k = 0; k < 2 * HS; k++) a[i][k] = _mm256_setzero_si256();
            for (int t = 0; t < np; t += 2) {
                const uint8_t *qt = data + (size_t)(t0 + t) * (size_t)vb + hdr + off;
                /* an odd span's last pair repeats t, whose weight pads to 0 */
                const uint8_t *qu = t + 1 < n ? qt + vb : qt;
                if (c == 0 && h0 == 0) lb_prefetch(data, vb, t0 + t + LB_AHEAD, 2);
                const __m256i ct = _mm256_loadu_si256((const __m256i *)qt);
                const __m256i cu = _mm256_loadu_si256((const __m256i *)qu);
                const __m256i pr = e ? _mm256_unpackhi_epi8(ct, cu) : _mm256_unpacklo_epi8(ct, cu);
                __m256i x[4];
                for (int h = 0; h < HS; h++) {
                    const __m256i ix = _mm256_and_si256(_mm256_srli_epi16(pr, sh + (h0 + h) * B), mask);
                    const __m256i lo = _mm256_shuffle_epi8(tlo, ix), hi = _mm256_shuffle_epi8(thi, ix);
                    x[2 * h] = _mm256_unpacklo_epi8(lo, hi);
                    x[2 * h + 1] = _mm256_unpackhi_epi8(lo, hi);
                }
                for (int i = 0; i < NQ; i++) {
                    int32_t pair;
                    memcpy(&pair, &wq[i][t], 4);
                    const __m256i w = _mm256_set1_epi32(pair);
                    for (int k = 0; k < 2 * HS; k++) a[i][k] = _mm256_add_epi32(a[i][k], _mm256_madd_epi16(x[k], w));
                }
            }
            for (int i = 0; i < NQ; i++)
                for (int k = 0; k < 2 * HS; k++) {
                    float *sk = S[i][4 * c + 2 * h0 + k];
                    _mm256_storeu_ps(sk, _mm256_add_ps(_mm256_loadu_ps(sk), _mm256_mul_ps(_mm256_cvtepi32_ps(a[i][k]),
                                                                                          _mm256_set1_ps(inv[i]))));
                }
        }
}

/* acc += Σ p v in integers for nq <= KV_MAX_NQ heads, added only once all
 * of it is summed: 0, or -1 with acc untouched (the float path takes the
 * call: a weight that is not finite). */
AVX2 static int accum_i16_avx2(const KVStream *s, const float *p, int ldp, int nq, int t0, int t1, float *acc) {
    const LbFmt *f = s->aux;
    if (nq > KV_MAX_NQ) return -1;
    uint8_t lo[16], hi[16];
    for (int i = 0; i < 16; i++) lo[i] = (uint8_t)(f->cb16[i] & 0xff), hi[i] = (uint8_t)((uint16_t)f->cb16[i] >> 8);
    const __m256i tlo = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)lo)),
                  thi = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)hi)),
                  sql = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)f->sq_lo)),
                  sqh = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)f->sq_hi)), m4 = _mm256_set1_epi8(15);
    float S[KV_MAX_NQ][16][8];
    memset(S, 0, sizeof(float) * 16 * 8 * (size_t)nq);
    for (int ta = t0; ta < t1; ta += P16_SPAN) {
        const int n = t1 - ta < P16_SPAN ? t1 - ta : P16_SPAN, np = (n + 1) & ~1;
        /* the positions' scales over the codebook's, polar4's over ‖cb[idx]‖
         * as score_i8_avx2 takes it */
        float sc[P16_SPAN + 16];
        for (int t = 0; t < n; t++) {
            const uint8_t *blk = s->data + (size_t)(ta + t) * (size_t)f->vec_bytes;
            float g = header_avx2(blk, f->hdr);
            if (f->renorm) {
                const __m256i v0 = _mm256_loadu_si256((const __m256i *)(blk + f->hdr)),
                              v1 = _mm256_loadu_si256((const __m256i *)(blk + f->hdr + 32));
                const __m256i nn = norm2_avx2(_mm256_and_si256(v0, m4), _mm256_and_si256(_mm256_srli_epi16(v0, 4), m4),
                                              _mm256_and_si256(v1, m4), _mm256_and_si256(_mm256_srli_epi16(v1, 4), m4),
                                              sql, sqh);
                const __m128i q = _mm_add_epi32(_mm256_castsi256_si128(nn), _mm256_extracti128_si256(nn, 1));
                g /= sqrtf((float)_mm_cvtsi128_si32(_mm_add_epi32(q, _mm_unpackhi_epi64(q, q))) * f->sq_d);
            }
            sc[t] = g * f->cb16_d;
        }
        for (int i0 = 0; i0 < nq; i0 += 4) {
            const int NH = nq - i0 < 4 ? nq - i0 : 4;
            float wf[1][P16_SPAN], inv[4];
            int16_t wq[4][P16_SPAN];
            for (int i = 0; i < NH; i++) {
                const float *pi = p + (size_t)(i0 + i) * ldp + (ta - t0);
                for (int t = 0; t < P16_SPAN; t++) wf[0][t] = t < n ? pi[t] * sc[t] : 0;
                if (p16_round_avx2((const float (*)[P16_SPAN])wf, 1, np, &wq[i], &inv[i])) return -1;
            }
#define SPAN(B, N) lb_span16_avx2(B, s->data, f->vec_bytes, f->hdr, N, ta, n, wq, inv, tlo, thi, S + i0)
#define SPANS(B)                                                                                                    \
    switch (NH) {                                                                                                   \
    case 1: SPAN(B, 1); break;                                                                                      \
    case 2: SPAN(B, 2); break;                                                                                      \
    case 3: SPAN(B, 3); break;                                                                                      \
    default: SPAN(B, 4); break;                                                                                     \
    }
            if (f->kind == LB_IDX2) SPANS(2) else SPANS(4)
#undef SPANS
#undef SPAN
        }
    }
    for (int i = 0; i < nq; i++)
        for (int k = 0; k < 16; k++)
            for (int l = 0; l < 8; l++)
                acc[(size_t)i * 128 + lb_sum_value(f->kind == LB_IDX2 ? 2 : 4, k, l)] += S[i][k][l];
    return 0;
}

/* ---- AVX-512 kernels for 4-bit codes --------------------------------------
 * A 16-entry codebook fits one zmm register and vpermps looks 16 lanes up at
 * once using their low 4 bits, so 16 codes decode in two instructions: a
 * 64-bit broadcast of their 8 bytes and a shift of each 64-bit lane m by 4m,
 * which leaves code m at the bottom of dword lane 2m and code m + 8 at the
 * bottom of lane 2m + 1. Values come out in the order 0, 8, 1, 9, ..., 7, 15
 * of their 16-group; the queries (score) and the partial sums (accumulate)
 * are permuted to match once per call instead of per position. */

#define AVX512 __attribute__((target("avx512f,avx512vl,avx512dq,avx2,fma,f16c")))
#define AVX512_INLINE __attribute__((target("avx512f,avx512vl,avx512dq,avx2,fma,f16c"), always_inline)) static inline

/* Lane l of a decoded 16-group holds value perm16[l] of the group, and
 * value m sits in lane unperm16[m]. */
static const int32_t perm16[16] = {0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15};
static const int32_t unperm16[16] = {0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15};

/* Values 16h..16h+15 of a block's 4-bit codes, in PERM16 order, unscaled. */
AVX512_INLINE __m512 dec16(__m512 cb, __m512i sh, const uint8_t *qs, int h) {
    uint64_t w;
    memcpy(&w, qs + 8 * h, 8);
    return _mm512_permutexvar_ps(_mm512_srlv_epi64(_mm512_set1_epi64((long long)w), sh), cb);
}

AVX512_INLINE float code_norm2_512(__m512 cb, __m512i sh, const uint8_t *qs, int nh) {
    __m512 a = _mm512_setzero_ps();
    for (int h = 0; h < nh; h++) {
        __m512 k = dec16(cb, sh, qs, h);
        a = _mm512_fmadd_ps(k, k, a);
    }
    return _mm512_reduce_add_ps(a);
}

/* Position t's scores for NQ heads as 16-lane partial sums tot[NQ], each
 * score being scale * the sum of its lanes. */
AVX512_INLINE void score16_pos(const LbFmt *f, const int NQ, const int renorm, const uint8_t *blk, __m512 cb,
                               __m512i sh, float (*qp)[KV_MAX_DIM], __m512 *tot, float *scale) {
    const int n = f->n;
    for (int i = 0; i < NQ; i++) tot[i] = _mm512_setzero_ps();
    for (int b = 0; b < f->nb; b++, blk += f->blk_bytes) {
        const uint8_t *qs = blk + f->hdr;
        __m512 a0[4], a1[4], n0 = _mm512_setzero_ps(), n1 = _mm512_setzero_ps();
        for (int i = 0; i < NQ; i++) a0[i] = a1[i] = _mm512_setzero_ps();
        for (int h = 0; h < n / 16; h += 2) {
            __m512 k0 = dec16(cb, sh, qs, h), k1 = dec16(cb, sh, qs, h + 1);
            for (int i = 0; i < NQ; i++) {
                a0[i] = _mm512_fmadd_ps(_mm512_loadu_ps(qp[i] + b * n + 16 * h), k0, a0[i]);
                a1[i] = _mm512_fmadd_ps(_mm512_loadu_ps(qp[i] + b * n + 16 * h + 16), k1, a1[i]);
            }
            if (renorm) {
                n0 = _mm512_fmadd_ps(k0, k0, n0);
                n1 = _mm512_fmadd_ps(k1, k1, n1);
            }
        }
        float sc = header_avx2(blk, f->hdr);
        if (renorm) sc /= sqrtf(_mm512_reduce_add_ps(_mm512_add_ps(n0, n1)));
        if (f->nb == 1) {
            /* one block: its scale is applied to the finished sums */
            for (int i = 0; i < NQ; i++) tot[i] = _mm512_add_ps(a0[i], a1[i]);
            *scale = sc;
            return;
        }
        const __m512 sv = _mm512_set1_ps(sc);
        for (int i = 0; i < NQ; i++) tot[i] = _mm512_fmadd_ps(sv, _mm512_add_ps(a0[i], a1[i]), tot[i]);
    }
    *scale = 1.0f;
}

/* Four positions' scores from registers: one hsum tree per head. */
AVX512_INLINE void score16_store4(const int NQ, __m512 (*tot)[2], const float *sc, int R, float *out, int ldo) {
    for (int i = 0; i < NQ; i++) {
        float v[4];
        _mm_storeu_ps(v, hsum4_512(tot[0][i], tot[1][i], tot[2][i], tot[3][i]));
        for (int r = 0; r < R; r++) out[(size_t)i * ldo + r] = v[r] * sc[r];
    }
}

/* One position's unscaled dots with NQ <= 2 register-resident queries. */
AVX512_INLINE void score16_dot(const int NQ, const uint8_t *qs, __m512 (*qv)[8], __m512 cb, __m512i sh, __m512 *tot) {
    for (int i = 0; i < NQ; i++) tot[i] = _mm512_setzero_ps();
    for (int h = 0; h < 8; h++) {
        const __m512 k = dec16(cb, sh, qs, h);
        for (int i = 0; i < NQ; i++) tot[i] = _mm512_fmadd_ps(qv[i][h], k, tot[i]);
    }
}

/* score16_body's case for one 128-value block per position (d = 128) and
 * up to two heads (the GQA groups of Qwen3-0.6B, 1.7B and the shipped
 * model): the queries stay in 16 registers instead of being reloaded for
 * every FMA (load ports were the limit), each position's dot is one chain
 * of 8 FMAs per head, and the four positions of a step give the core
 * independent chains to overlap. Its summation order differs from
 * score16_pos's; which one a head gets depends only on the group size and
 * how lb_kv_score splits it, never on positions or batching. */
AVX512_INLINE void score16_one(const LbFmt *f, const int NQ, const uint8_t *data, float (*qp)[KV_MAX_DIM], int t0,
                               int t1, float *out, int ldo, __m512 cb, __m512i sh) {
    const size_t vb = (size_t)f->vec_bytes;
    __m512 qv[2][8], tot[4][2];
    for (int i = 0; i < NQ; i++)
        for (int h = 0; h < 8; h++) qv[i][h] = _mm512_loadu_ps(qp[i] + 16 * h);
    float sc[4] = {0, 0, 0, 0};
    int t = t0;
    /* whole steps of four: straight-line code, so the sums never leave
     * registers */
    for (; t + 4 <= t1; t += 4) {
        lb_prefetch(data, f->vec_bytes, t + LB_AHEAD, 4);
        for (int r = 0; r < 4; r++) {
            const uint8_t *blk = data + (size_t)(t + r) * vb;
            score16_dot(NQ, blk + f->hdr, qv, cb, sh, tot[r]);
            sc[r] = header_avx2(blk, f->hdr);
        }
        score16_store4(NQ, tot, sc, 4, out + (t - t0), ldo);
    }
    if (t < t1) {
        const int R = t1 - t;
        for (int r = 0; r < 4; r++) {
            if (r < R) {
                const uint8_t *blk = data + (size_t)(t + r) * vb;
                score16_dot(NQ, blk + f->hdr, qv, cb, sh, tot[r]);
                sc[r] = header_avx2(blk, f->hdr);
            } else {
                for (int i = 0; i < NQ; i++) tot[r][i] = _mm512_setzero_ps();
            }
        }
        score16_store4(NQ, tot, sc, R, out + (t - t0), ldo);
    }
}

/* score_body for 4-bit codes, 16 values per step; positions four at a time
 * so that their horizontal sums share one shuffle tree per head (a
 * reduction per position is a large share of the function's time:
 * docs/kernel-notes.md#lowbit-score-reduction). */
AVX512_INLINE void score16_body(const LbFmt *f, const int NQ, const int renorm, const uint8_t *data, int d,
                                const float *q, int t0, int t1, float *out, int ldo) {
    const __m512 cb = _mm512_loadu_ps(f->cb), z = _mm512_setzero_ps();
    const __m512i sh = _mm512_setr_epi64(0, 4, 8, 12, 16, 20, 24, 28), perm = _mm512_loadu_si512(perm16);
    float qp[4][KV_MAX_DIM];
    for (int i = 0; i < NQ; i++)
        for (int j = 0; j < d; j += 16)
            _mm512_storeu_ps(qp[i] + j, _mm512_permutexvar_ps(perm, _mm512_loadu_ps(q + (size_t)i * d + j)));
    if (f->nb == 1 && f->n == 128 && !renorm && NQ <= 2) {
        score16_one(f, NQ, data, qp, t0, t1, out, ldo, cb, sh);
        return;
    }
    for (int t = t0; t < t1; t += 4) {
        const int R = t1 - t < 4 ? t1 - t : 4;
        __m512 tot[4][4];
        float sc[4];
        lb_prefetch(data, f->vec_bytes, t + LB_AHEAD, 4);
        for (int r = 0; r < 4; r++) {
            if (r < R)
                score16_pos(f, NQ, renorm, data + (size_t)(t + r) * (size_t)f->vec_bytes, cb, sh, qp, tot[r], &sc[r]);
            else
                for (int i = 0; i < NQ; i++) tot[r][i] = z;
        }
        for (int i = 0; i < NQ; i++) {
            float v[4];
            _mm_storeu_ps(v, hsum4_512(tot[0][i], tot[1][i], tot[2][i], tot[3][i]));
            for (int r = 0; r < R; r++) out[(size_t)i * ldo + (t + r - t0)] = v[r] * sc[r];
        }
    }
}

/* accum_body for 4-bit codes: chunks of G 16-groups, partial sums permuted
 * on load and back on store. */
AVX512_INLINE void accum16_body(const LbFmt *f, const int NQ, const int G, const int renorm, const uint8_t *data,
                                int d, const float *p, int ldp, int t0, int t1, float *acc) {
    const __m512 cb = _mm512_loadu_ps(f->cb);
    const __m512i sh = _mm512_setr_epi64(0, 4, 8, 12, 16, 20, 24, 28), perm = _mm512_loadu_si512(perm16),
                  unperm = _mm512_loadu_si512(unperm16);
    const int n = f->n, vb = f->vec_bytes;
    float w[4][TILE];
    for (int b = 0; b < f->nb; b++)
        for (int ta = t0; ta < t1; ta += TILE) {
            const int tn = t1 - ta < TILE ? t1 - ta : TILE;
            const uint8_t *base = data + (size_t)ta * (size_t)vb + (size_t)b * (size_t)f->blk_bytes;
            for (int t = 0; t < tn; t++) {
                const uint8_t *blk = base + (size_t)t * (size_t)vb;
                if (b == 0) lb_prefetch(data, vb, ta + t + LB_AHEAD, 1);
                float s = header_avx2(blk, f->hdr);
                if (renorm) s /= sqrtf(code_norm2_512(cb, sh, blk + f->hdr, n / 16));
                for (int i = 0; i < NQ; i++) w[i][t] = p[(size_t)i * ldp + (size_t)(ta - t0 + t)] * s;
            }
            for (int c = 0; c < n / 16; c += G) {
                float *ab = acc + (size_t)b * n + 16 * c;
                __m512 a[4][4];
                for (int i = 0; i < NQ; i++)
                    for (int k = 0; k < G; k++)
                        a[i][k] = _mm512_permutexvar_ps(perm, _mm512_loadu_ps(ab + (size_t)i * d + 16 * k));
                for (int t = 0; t < tn; t++) {
                    const uint8_t *qs = base + (size_t)t * (size_t)vb + f->hdr;
                    __m512 wv[4];
                    for (int i = 0; i < NQ; i++) wv[i] = _mm512_set1_ps(w[i][t]);
                    for (int k = 0; k < G; k++) {
                        const __m512 v = dec16(cb, sh, qs, c + k);
                        for (int i = 0; i < NQ; i++) a[i][k] = _mm512_fmadd_ps(wv[i], v, a[i][k]);
                    }
                }
                for (int i = 0; i < NQ; i++)
                    for (int k = 0; k < G; k++)
                        _mm512_storeu_ps(ab + (size_t)i * d + 16 * k, _mm512_permutexvar_ps(unperm, a[i][k]));
            }
        }
}

/* accum16_body's case for one 128-value block per position and up to two
 * heads: all 16 partial sums stay in registers over the whole range (the
 * tiled body keeps them in memory across its chunks), in the same order
 * of additions, so the results are identical. */
AVX512_INLINE void accum16_one(const LbFmt *f, const int NQ, const uint8_t *data, const float *p, int ldp, int t0,
                               int t1, float *acc) {
    const __m512 cb = _mm512_loadu_ps(f->cb);
    const __m512i sh = _mm512_setr_epi64(0, 4, 8, 12, 16, 20, 24, 28), perm = _mm512_loadu_si512(perm16),
                  unperm = _mm512_loadu_si512(unperm16);
    const size_t vb = (size_t)f->vec_bytes;
    __m512 a[2][8];
    for (int i = 0; i < NQ; i++)
        for (int h = 0; h < 8; h++) a[i][h] = _mm512_permutexvar_ps(perm, _mm512_loadu_ps(acc + 128 * i + 16 * h));
    for (int t = t0; t < t1; t++) {
        const uint8_t *blk = data + (size_t)t * vb, *qs = blk + f->hdr;
        if (((t - t0) & 3) == 0) lb_prefetch(data, f->vec_bytes, t + LB_AHEAD, 4);
        const float s = header_avx2(blk, f->hdr);
        __m512 w[2];
        for (int i = 0; i < NQ; i++) w[i] = _mm512_set1_ps(p[(size_t)i * ldp + (size_t)(t - t0)] * s);
        for (int h = 0; h < 8; h++) {
            const __m512 v = dec16(cb, sh, qs, h);
            for (int i = 0; i < NQ; i++) a[i][h] = _mm512_fmadd_ps(w[i], v, a[i][h]);
        }
    }
    for (int i = 0; i < NQ; i++)
        for (int h = 0; h < 8; h++) _mm512_storeu_ps(acc + 128 * i + 16 * h, _mm512_permutexvar_ps(unperm, a[i][h]));
}

AVX512 static void score_avx512(const LbFmt *f, const uint8_t *data, int d, const float *q, int nq, int t0, int t1,
                                float *out, int ldo) {
#define SCORE(R, N) score16_body(f, N, R, data, d, q, t0, t1, out, ldo)
    if (f->renorm) BY_NQ(SCORE, 1) else BY_NQ(SCORE, 0);
#undef SCORE
}

/* Four 16-groups per chunk for up to two heads when the block has them. */
AVX512 static void accum_avx512(const LbFmt *f, const uint8_t *data, int d, const float *p, int ldp, int nq, int t0,
                                int t1, float *acc) {
#define ACCUM(R, N) accum16_body(f, N, (N) <= 2 && f->n >= 64 ? 4 : 2, R, data, d, p, ldp, t0, t1, acc)
    if (f->nb == 1 && f->n == 128 && d == 128 && !f->renorm && nq <= 2) {
        if (nq == 1)
            accum16_one(f, 1, data, p, ldp, t0, t1, acc);
        else
            accum16_one(f, 2, data, p, ldp, t0, t1, acc);
    } else if (f->renorm) BY_NQ(ACCUM, 1) else BY_NQ(ACCUM, 0);
#undef ACCUM
}

/* ---- AVX-512 VNNI scores for 4-bit codebooks ------------------------------
 * Where the CPU has VNNI, tbq4's and polar4's scores (d = 128 in one block,
 * the Qwen3 shape) are integer dot products, as llama.cpp's CPU path takes q·k over
 * its quantized caches: each query is rounded to int8 once per call (absmax
 * to 127), the codebook to u8 (cb8), vpshufb looks 64 codes up in one
 * instruction (a 16-byte table per 128-bit lane) and vpdpbusd adds 4
 * products per lane. A position costs 5 instructions of decode plus 2 per
 * head, where the float path spends 16 plus 8 per head, so the score half
 * of tbq4 attention takes markedly less time, rounding the queries included
 * (docs/kernel-notes.md#tbq4-integer-scores).
 *
 *   codes   byte b = idx[2b] | idx[2b+1] << 4   (low nibbles: even values)
 *   query   qe[b] = q8[2b], qo[b] = q8[2b+1]    (the same split, int8)
 *   score   (Σ cb8[idx]·q8 − 128 Σ q8) · d_t / (q_s · cb8_s)
 *
 * The price is q and the codebook rounded to 8 bits: at most about 3e-3 of
 * ‖q‖‖k‖ on random data (KVScheme.score_err), beside the 4-bit codes' own
 * error of about 1e-2 ‖q‖‖k‖ RMS. The sums are exact integers below 2^24,
 * so any order gives the same float; lb_score_int_ref (above) is the same
 * arithmetic in plain C. */

#define VNNI_FN __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")))
#define VNNI_INLINE __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c"), always_inline)) static inline

/* q8_prep_ref in 16 lanes: the same products and the same rounding
 * (vcvtps2dq rounds to nearest even, as lrintf does by default). */
VNNI_INLINE void q8_prep(const float *q, float s, float cb8_s, LbQ8 *o) {
    const __m512 sv = _mm512_set1_ps(s);
    const __m512i ev = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30),
                  od = _mm512_add_epi32(ev, _mm512_set1_epi32(1));
    __m512i sum = _mm512_setzero_si512();
    for (int k = 0; k < 4; k++) {
        const __m512i a = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(q + 32 * k), sv)),
                      b = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(q + 32 * k + 16), sv));
        const __m512i e = _mm512_permutex2var_epi32(a, ev, b), d = _mm512_permutex2var_epi32(a, od, b);
        _mm_storeu_si128((__m128i *)(o->qe + 16 * k), _mm512_cvtepi32_epi8(e));
        _mm_storeu_si128((__m128i *)(o->qo + 16 * k), _mm512_cvtepi32_epi8(d));
        sum = _mm512_add_epi32(sum, _mm512_add_epi32(e, d));
    }
    q8_finish(o, s, cb8_s, _mm512_reduce_add_epi32(sum));
}

/* Four positions' integer sums acc[r][i] (positions past R zero) to
 * scores: one hsum tree per head, one conversion, then the scaling as
 * 4-lane vectors (the float operations of lb_score_int_ref, in its order);
 * out[i·ldo + r] for r < R. */
VNNI_INLINE void score4_finish(const int NQ, __m512i (*acc)[4], const float *sc, int R, const LbQ8 *o, float *out,
                               int ldo) {
    const __m128 sv = _mm_loadu_ps(sc);
    const __mmask8 keep = (__mmask8)((1u << R) - 1);
    for (int i = 0; i < NQ; i++) {
        const __m128 dot = _mm_cvtepi32_ps(hsum4_512i(acc[0][i], acc[1][i], acc[2][i], acc[3][i]));
        const __m128 s = _mm_mul_ps(_mm_mul_ps(_mm_sub_ps(dot, _mm_set1_ps((float)o[i].bias)), sv),
                                    _mm_set1_ps(o[i].inv));
        _mm_mask_storeu_ps(out + (size_t)i * ldo, keep, s);
    }
}

/* Σ sq14[idx] of one block's 128 4-bit codes (low nibbles il, high ih) in
 * 16 int32 lanes: each half of the squares looked up and summed by
 * vpdpbusd with weights 1 (sq_lo) and 64 (sq_hi). */
VNNI_INLINE __m512i norm2_lanes(__m512i il, __m512i ih, __m512i sql, __m512i sqh) {
    const __m512i one = _mm512_set1_epi8(1), w64 = _mm512_set1_epi8(64);
    __m512i a = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_shuffle_epi8(sql, il), one);
    a = _mm512_dpbusd_epi32(a, _mm512_shuffle_epi8(sql, ih), one);
    a = _mm512_dpbusd_epi32(a, _mm512_shuffle_epi8(sqh, il), w64);
    return _mm512_dpbusd_epi32(a, _mm512_shuffle_epi8(sqh, ih), w64);
}

VNNI_INLINE __m512i sq_table(const uint8_t *t) { return _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)t)); }

/* Scores of positions [t0, t1) for NQ <= 4 prepared queries, four
 * positions at a time: their integer lane sums share one hsum tree per
 * head, then one conversion and the scaling as 4-lane vectors (the same
 * float operations, in the same order, as lb_score_int_ref's). RN: polar4,
 * whose scale γ / ‖cb[idx]‖ takes its integer norms through a fifth tree. */
VNNI_INLINE void score_i8_body(const LbFmt *f, const int NQ, const int RN, const uint8_t *data, const LbQ8 *o,
                               int t0, int t1, float *out, int ldo) {
    const __m512i tbl = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)f->cb8)), m4 = _mm512_set1_epi8(15),
                  sql = sq_table(f->sq_lo), sqh = sq_table(f->sq_hi);
    const size_t vb = (size_t)f->vec_bytes;
    __m512i qe[4], qo[4];
    for (int i = 0; i < NQ; i++) qe[i] = _mm512_loadu_si512(o[i].qe), qo[i] = _mm512_loadu_si512(o[i].qo);
    for (int t = t0; t < t1; t += 4) {
        const int R = t1 - t < 4 ? t1 - t : 4;
        __m512i acc[4][4], nrm[4];
        float sc[4] = {0, 0, 0, 0};
        lb_prefetch(data, f->vec_bytes, t + LB_AHEAD, 4);
        for (int r = 0; r < 4; r++) {
            if (r >= R) {
                for (int i = 0; i < NQ; i++) acc[r][i] = _mm512_setzero_si512();
                nrm[r] = _mm512_set1_epi32(1); /* any nonzero norm: the lane is not stored */
                continue;
            }
            const uint8_t *blk = data + (size_t)(t + r) * vb;
            const __m512i v = _mm512_loadu_si512(blk + f->hdr);
            const __m512i il = _mm512_and_si512(v, m4), ih = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
            const __m512i lo = _mm512_shuffle_epi8(tbl, il), hi = _mm512_shuffle_epi8(tbl, ih);
            for (int i = 0; i < NQ; i++)
                acc[r][i] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, qe[i]), hi, qo[i]);
            if (RN) nrm[r] = norm2_lanes(il, ih, sql, sqh);
            sc[r] = header_avx2(blk, f->hdr);
        }
        if (RN) {
            const __m128 n2 = _mm_cvtepi32_ps(hsum4_512i(nrm[0], nrm[1], nrm[2], nrm[3]));
            _mm_storeu_ps(sc, _mm_div_ps(_mm_loadu_ps(sc), _mm_sqrt_ps(_mm_mul_ps(n2, _mm_set1_ps(f->sq_d)))));
        }
        score4_finish(NQ, acc, sc, R, o, out + (t - t0), ldo);
    }
}

/* q_scale in 16 lanes (max is exact, so the same scale). */
VNNI_INLINE float q_scale16(const float *q, float lim) {
    __m512 m = _mm512_setzero_ps();
    __mmask16 bad = 0;
    for (int j = 0; j < 128; j += 16) {
        const __m512 x = _mm512_loadu_ps(q + j);
        bad |= _mm512_fpclass_ps_mask(x, 0x99); /* NaN or ±inf */
        m = _mm512_max_ps(m, _mm512_abs_ps(x));
    }
    if (bad) return -1;
    const float mx = _mm512_reduce_max_ps(m);
    return mx > lim / FLT_MAX ? lim / mx : 0;
}

/* 0, or -1 when a query is not finite (the caller takes the float path). */
VNNI_FN static int score_i8(const LbFmt *f, const uint8_t *data, const float *q, int nq, int t0, int t1, float *out,
                            int ldo) {
    LbQ8 o[4];
    for (int i = 0; i < nq; i++) {
        const float s = q_scale16(q + (size_t)i * 128, 127.0f);
        if (s < 0) return -1;
        q8_prep(q + (size_t)i * 128, s, f->cb8_s, &o[i]);
    }
#define SCORE_I8(NQ) f->renorm ? score_i8_body(f, NQ, 1, data, o, t0, t1, out, ldo) : score_i8_body(f, NQ, 0, data, o, t0, t1, out, ldo)
    switch (nq) {
    case 1: SCORE_I8(1); break;
    case 2: SCORE_I8(2); break;
    case 3: SCORE_I8(3); break;
    default: SCORE_I8(4); break;
    }
#undef SCORE_I8
    return 0;
}

/* The accumulate half on VNNI for the same streams: pairs16.h's 16-bit
 * sums, with the codebook at 10 bits (cb16: 1023 · 32767 · P16_SPAN stays
 * below 2^31), looked up 32 codes at a time by vpermw. Decoded groups are
 * even values 0-62, even 64-126, odd 1-63, odd 65-127; the sums are
 * interleaved back at the end. The codebook's rounding (at most 0.15% of
 * the smallest centroid) and the weights' add up to about 1e-3 of
 * Σ |p v| (KVScheme.accum_err). */
PAIRS16 void tbq_dec16(const KVStream *s, int t, int u, __m512i x[4][2]) {
    const LbFmt *f = s->aux;
    const uint8_t *qt = s->data + (size_t)t * (size_t)f->vec_bytes + f->hdr,
                  *qu = s->data + (size_t)u * (size_t)f->vec_bytes + f->hdr;
    const __m512i tbl = _mm512_loadu_si512(f->cb16);
    for (int h = 0; h < 2; h++) {
        /* the two positions' code bytes, widened and interleaved once,
         * then looked up for the low (even) and high (odd) nibbles: 2
         * interleaves per 32 bytes where interleaving the looked-up values
         * takes 4 (the same sums; docs/kernel-notes.md#tbq4-integer-sums) */
        const __m512i a = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(qt + 32 * h))),
                      b = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(qu + 32 * h)));
        const __m512i lo = _mm512_unpacklo_epi16(a, b), hi = _mm512_unpackhi_epi16(a, b);
        x[h][0] = _mm512_permutexvar_epi16(lo, tbl);
        x[h][1] = _mm512_permutexvar_epi16(hi, tbl);
        x[2 + h][0] = _mm512_permutexvar_epi16(_mm512_srli_epi16(lo, 4), tbl);
        x[2 + h][1] = _mm512_permutexvar_epi16(_mm512_srli_epi16(hi, 4), tbl);
    }
}

/* 16 positions' scales over the codebook's: the headers in one gather
 * (fp16 for tbq, fp32 for lm3 and polar4), polar4's divided by its norms
 * ‖cb[idx]‖ taken as score_i8 takes them. */
PAIRS16 __m512 lb_scale16(const KVStream *s, int t, int g, __mmask16 k) {
    (void)g;
    const LbFmt *f = s->aux;
    const uint8_t *base = s->data + (size_t)t * (size_t)f->vec_bytes;
    const __m512i at = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                          _mm512_set1_epi32(f->vec_bytes));
    const __m512i h = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), k, at, (const void *)base, 1);
    __m512 sc = f->hdr == 2 ? _mm512_cvtph_ps(_mm512_cvtepi32_epi16(h)) : _mm512_castsi512_ps(h);
    if (f->renorm) {
        const __m512i m4 = _mm512_set1_epi8(15), sql = sq_table(f->sq_lo), sqh = sq_table(f->sq_hi);
        __m128i n2[4];
        for (int q = 0; q < 4; q++) {
            __m512i a[4];
            for (int r = 0; r < 4; r++) {
                if (!(k >> (4 * q + r) & 1)) {
                    a[r] = _mm512_set1_epi32(1); /* masked off below */
                    continue;
                }
                const __m512i v = _mm512_loadu_si512(base + (size_t)(4 * q + r) * (size_t)f->vec_bytes + f->hdr);
                a[r] = norm2_lanes(_mm512_and_si512(v, m4), _mm512_and_si512(_mm512_srli_epi16(v, 4), m4), sql, sqh);
            }
            n2[q] = hsum4_512i(a[0], a[1], a[2], a[3]);
        }
        const __m512i all = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set_m128i(n2[1], n2[0])),
                                               _mm256_set_m128i(n2[3], n2[2]), 1);
        sc = _mm512_maskz_div_ps(k, sc, _mm512_sqrt_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(all), _mm512_set1_ps(f->sq_d))));
    }
    return _mm512_mul_ps(sc, _mm512_set1_ps(f->cb16_d));
}

/* acc += Σ p v in integers, added only once all of it is summed: 0, or
 * -1 with acc untouched (the float path takes the call). */
__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c"))) static int
accum_i16(const KVStream *s, const float *p, int ldp, int nq, int t0, int t1, float *acc) {
    const LbFmt *f = s->aux;
    const __m512i lo = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23),
                  hi = _mm512_add_epi32(lo, _mm512_set1_epi32(8));
    __m512 sum[8][4][2];
    if (p16_accum(s, tbq_dec16, lb_scale16, 1, (size_t)f->vec_bytes, p, ldp, nq, t0, t1, sum)) return -1;
    /* even group e and odd group e + 2 hold values 64e + 2j and 64e + 2j + 1 */
    for (int i = 0; i < nq; i++)
        for (int e = 0; e < 2; e++)
            for (int h = 0; h < 2; h++) {
                float *a = acc + (size_t)i * 128 + 64 * e + 32 * h;
                const __m512 ev = sum[i][e][h], od = sum[i][e + 2][h];
                _mm512_storeu_ps(a, _mm512_add_ps(_mm512_loadu_ps(a), _mm512_permutex2var_ps(ev, lo, od)));
                _mm512_storeu_ps(a + 16, _mm512_add_ps(_mm512_loadu_ps(a + 16), _mm512_permutex2var_ps(ev, hi, od)));
            }
    return 0;
}

/* ---- AVX-512 VBMI: the same integer scores and sums for 3- and 2-bit codes
 * tbq3 and tbq2 (and lm3's sums; its word scores follow) take the integer
 * paths above with their codes unpacked by
 * two VBMI instructions: vpermb gathers each 8-code word (b bytes) into a
 * 64-bit lane, vpmultishiftqb moves code k's bits to the bottom of byte k
 * (with the next codes' bits above them), and the lookups ignore those:
 * vpermb reads 6 index bits, so a 64-entry copy of the b-bit codebook
 * (tbl[i] = cb8[i mod 2^b]) needs no mask, and vpermw reads 5 (cb16 repeats
 * likewise). A position costs 6 instructions of decode for its scores and
 * 11 for its share of a pair's sums; the scores come out in value order,
 * so the query, prepared as for tbq4 (even and odd values apart), is put
 * back in order once per call (docs/kernel-notes.md#tbq-vbmi). tbq3's
 * 10-bit codebook rounds its smallest centroid by up to 0.4%, hence its
 * accum_err of 3e-3 where tbq4 and tbq2 have 2e-3.
 *
 *   word w (values 8w..8w+7):  b bytes at b·w, code k at bits b·k..b·k+b-1
 *   score lanes   qword q of register r = word 8r + q, byte k = code k
 *   sum lanes     qword q of group g = word 4g + q/2 of positions t and u,
 *                 words (t, u) of two codes each, in pairs16.h's lo/hi order
 */
#define VBMI_FN __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx512vbmi,avx2,fma,f16c")))
#define VBMI_INLINE                                                                                                    \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx512vbmi,avx2,fma,f16c"), always_inline))   \
    static inline

/* Score lanes: qword q gets bytes b·w .. b·w + 2 of word w = 8r + q (a
 * 2-bit word's third byte is the next word's, unused). */
#define VB_W(b, w) (b) * (w), (b) * (w) + 1, (b) * (w) + 2, 0, 0, 0, 0, 0
#define VB_R(b, r)                                                                                                     \
    VB_W(b, 8 * (r)), VB_W(b, 8 * (r) + 1), VB_W(b, 8 * (r) + 2), VB_W(b, 8 * (r) + 3), VB_W(b, 8 * (r) + 4),          \
        VB_W(b, 8 * (r) + 5), VB_W(b, 8 * (r) + 6), VB_W(b, 8 * (r) + 7)
/* Byte k of every qword shifted by b·k. */
#define VB_SH(b) 0, (b), 2 * (b), 3 * (b), 4 * (b), 5 * (b), 6 * (b), 7 * (b)
static const uint8_t vb_gather[2][2][64] = {{{VB_R(2, 0)}, {VB_R(2, 1)}}, {{VB_R(3, 0)}, {VB_R(3, 1)}}};
static const uint8_t vb_shift[2][64] = {{VB_SH(2), VB_SH(2), VB_SH(2), VB_SH(2), VB_SH(2), VB_SH(2), VB_SH(2), VB_SH(2)},
                                        {VB_SH(3), VB_SH(3), VB_SH(3), VB_SH(3), VB_SH(3), VB_SH(3), VB_SH(3), VB_SH(3)}};

/* Sum lanes: word w's bytes of position t (table a) then of u (table b,
 * +64); for group g, qwords 2m and 2m + 1 both hold word 4g + m. */
#define VP_W2(w) 2 * (w), 2 * (w) + 1, 64 + 2 * (w), 65 + 2 * (w), 0, 0, 0, 0
#define VP_W3(w) 3 * (w), 3 * (w) + 1, 3 * (w) + 2, 64 + 3 * (w), 65 + 3 * (w), 66 + 3 * (w), 0, 0
#define VP_G(W, g) W(4 * (g)), W(4 * (g)), W(4 * (g) + 1), W(4 * (g) + 1), W(4 * (g) + 2), W(4 * (g) + 2), W(4 * (g) + 3), W(4 * (g) + 3)
static const uint8_t vp_gather[2][4][64] = {{{VP_G(VP_W2, 0)}, {VP_G(VP_W2, 1)}, {VP_G(VP_W2, 2)}, {VP_G(VP_W2, 3)}},
                                            {{VP_G(VP_W3, 0)}, {VP_G(VP_W3, 1)}, {VP_G(VP_W3, 2)}, {VP_G(VP_W3, 3)}}};
/* A qword holding codes c, c + 1 of t (at bit 0) and u (at bit 8b): words
 * t_c, u_c, t_c+1, u_c+1 from its low bytes (the high ones are not read).
 * lo lanes take codes 0, 1 (even qwords) and 2, 3 (odd), hi 4, 5 and 6, 7. */
#define VP_C(b, c) (b) * (c), 0, 8 * (b) + (b) * (c), 0, (b) * ((c) + 1), 0, 8 * (b) + (b) * ((c) + 1), 0
#define VP_SH(b, c) VP_C(b, c), VP_C(b, (c) + 2), VP_C(b, c), VP_C(b, (c) + 2), VP_C(b, c), VP_C(b, (c) + 2), VP_C(b, c), VP_C(b, (c) + 2)
static const uint8_t vp_shift[2][2][64] = {{{VP_SH(2, 0)}, {VP_SH(2, 4)}}, {{VP_SH(3, 0)}, {VP_SH(3, 4)}}};

/* A position's 16 · b code bytes, masked so the last position reads nothing past them. */
VBMI_INLINE __m512i vb_load(const uint8_t *qs, const int B) {
    return _mm512_maskz_loadu_epi8(B == 3 ? 0xffffffffffffULL : 0xffffffffULL, qs);
}

/* score_i8_body for B-bit codes: 2 · 3 instructions of decode and 2
 * vpdpbusd per head and position, four positions per hsum tree. */
VBMI_INLINE void score_vb_body(const LbFmt *f, const int B, const int NQ, const uint8_t *data, const LbQ8 *o, int t0,
                               int t1, float *out, int ldo) {
    const __m512i tbl = _mm512_loadu_si512(f->cb8), sh = _mm512_loadu_si512(vb_shift[B - 2]),
                  g0 = _mm512_loadu_si512(vb_gather[B - 2][0]), g1 = _mm512_loadu_si512(vb_gather[B - 2][1]);
    const size_t vb = (size_t)f->vec_bytes;
    /* the queries back in value order: unpacking qe and qo byte by byte
     * gives 128-bit lanes of values 32l..32l+15 (lo) and 32l+16..32l+31
     * (hi), which two qword permutes put in order, 0-63 and 64-127 */
    const __m512i p0 = _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11), p1 = _mm512_setr_epi64(4, 5, 12, 13, 6, 7, 14, 15);
    __m512i q0[4], q1[4];
    for (int i = 0; i < NQ; i++) {
        const __m512i e = _mm512_loadu_si512(o[i].qe), d = _mm512_loadu_si512(o[i].qo);
        const __m512i lo = _mm512_unpacklo_epi8(e, d), hi = _mm512_unpackhi_epi8(e, d);
        q0[i] = _mm512_permutex2var_epi64(lo, p0, hi);
        q1[i] = _mm512_permutex2var_epi64(lo, p1, hi);
    }
    for (int t = t0; t < t1; t += 4) {
        const int R = t1 - t < 4 ? t1 - t : 4;
        __m512i acc[4][4];
        float sc[4] = {0, 0, 0, 0};
        lb_prefetch_near(data, f->vec_bytes, t + LB_AHEAD, 4);
        for (int r = 0; r < 4; r++) {
            if (r >= R) {
                for (int i = 0; i < NQ; i++) acc[r][i] = _mm512_setzero_si512();
                continue;
            }
            const uint8_t *blk = data + (size_t)(t + r) * vb;
            const __m512i v = vb_load(blk + f->hdr, B);
            const __m512i lo = _mm512_permutexvar_epi8(_mm512_multishift_epi64_epi8(sh, _mm512_permutexvar_epi8(g0, v)), tbl),
                          hi = _mm512_permutexvar_epi8(_mm512_multishift_epi64_epi8(sh, _mm512_permutexvar_epi8(g1, v)), tbl);
            for (int i = 0; i < NQ; i++)
                acc[r][i] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, q0[i]), hi, q1[i]);
            sc[r] = header_avx2(blk, f->hdr);
        }
        score4_finish(NQ, acc, sc, R, o, out + (t - t0), ldo);
    }
}

VBMI_INLINE void score_vb_heads(const LbFmt *f, const int B, const uint8_t *data, const LbQ8 *o, int nq, int t0,
                                int t1, float *out, int ldo) {
    switch (nq) {
    case 1: score_vb_body(f, B, 1, data, o, t0, t1, out, ldo); break;
    case 2: score_vb_body(f, B, 2, data, o, t0, t1, out, ldo); break;
    case 3: score_vb_body(f, B, 3, data, o, t0, t1, out, ldo); break;
    default: score_vb_body(f, B, 4, data, o, t0, t1, out, ldo); break;
    }
}

/* score_i8 for 3- and 2-bit codes. */
VBMI_FN static int score_vb(const LbFmt *f, const uint8_t *data, const float *q, int nq, int t0, int t1, float *out,
                            int ldo) {
    LbQ8 o[4];
    for (int i = 0; i < nq; i++) {
        const float s = q_scale16(q + (size_t)i * 128, 127.0f);
        if (s < 0) return -1;
        q8_prep(q + (size_t)i * 128, s, f->cb8_s, &o[i]);
    }
    if (f->kind == LB_IDX3) score_vb_heads(f, 3, data, o, nq, t0, t1, out, ldo);
    else score_vb_heads(f, 2, data, o, nq, t0, t1, out, ldo);
    return 0;
}

/* lm3's word scores (w16_path): a position's 3-bit codes unpacked as for
 * tbq3's scores, widened to words and looked up in cb16 by vpermw (which
 * reads 5 index bits; cb16 repeats every 8), then 4 vpdpwssd per head
 * against the query's 14-bit words in value order. The same integer sums
 * and float steps as lb_score_int_ref. */
VBMI_INLINE void score_w16_body(const LbFmt *f, const int NQ, const uint8_t *data, const LbQ16 *o, int t0, int t1,
                                float *out, int ldo) {
    const __m512i tbl = _mm512_loadu_si512(f->cb16), sh = _mm512_loadu_si512(vb_shift[1]),
                  g0 = _mm512_loadu_si512(vb_gather[1][0]), g1 = _mm512_loadu_si512(vb_gather[1][1]);
    const size_t vb = (size_t)f->vec_bytes;
    __m512i q[4][4];
    LbQ8 fin[4]; /* score4_finish's scaling: no codebook offset here */
    for (int i = 0; i < NQ; i++) {
        for (int k = 0; k < 4; k++) q[i][k] = _mm512_loadu_si512(o[i].q + 32 * k);
        fin[i].bias = 0;
        fin[i].inv = o[i].inv;
    }
    for (int t = t0; t < t1; t += 4) {
        const int R = t1 - t < 4 ? t1 - t : 4;
        __m512i acc[4][4];
        float sc[4] = {0, 0, 0, 0};
        lb_prefetch_near(data, f->vec_bytes, t + LB_AHEAD, 4);
        for (int r = 0; r < 4; r++) {
            if (r >= R) {
                for (int i = 0; i < NQ; i++) acc[r][i] = _mm512_setzero_si512();
                continue;
            }
            const uint8_t *blk = data + (size_t)(t + r) * vb;
            const __m512i v = vb_load(blk + f->hdr, 3);
            const __m512i c0 = _mm512_multishift_epi64_epi8(sh, _mm512_permutexvar_epi8(g0, v)),
                          c1 = _mm512_multishift_epi64_epi8(sh, _mm512_permutexvar_epi8(g1, v));
            const __m512i x0 = _mm512_permutexvar_epi16(_mm512_cvtepu8_epi16(_mm512_castsi512_si256(c0)), tbl),
                          x1 = _mm512_permutexvar_epi16(_mm512_cvtepu8_epi16(_mm512_extracti64x4_epi64(c0, 1)), tbl),
                          x2 = _mm512_permutexvar_epi16(_mm512_cvtepu8_epi16(_mm512_castsi512_si256(c1)), tbl),
                          x3 = _mm512_permutexvar_epi16(_mm512_cvtepu8_epi16(_mm512_extracti64x4_epi64(c1, 1)), tbl);
            for (int i = 0; i < NQ; i++) {
                __m512i a = _mm512_dpwssd_epi32(_mm512_setzero_si512(), x0, q[i][0]);
                a = _mm512_dpwssd_epi32(a, x1, q[i][1]);
                a = _mm512_dpwssd_epi32(a, x2, q[i][2]);
                acc[r][i] = _mm512_dpwssd_epi32(a, x3, q[i][3]);
            }
            sc[r] = header_avx2(blk, f->hdr);
        }
        score4_finish(NQ, acc, sc, R, fin, out + (t - t0), ldo);
    }
}

/* q16_prep_ref in 16 lanes: the same products, rounded to nearest even. */
VBMI_INLINE void q16_prep(const float *q, float s, float cb16_s, LbQ16 *o) {
    const __m512 sv = _mm512_set1_ps(s);
    for (int j = 0; j < 128; j += 16)
        _mm256_storeu_si256((__m256i *)(o->q + j), _mm512_cvtepi32_epi16(_mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(q + j), sv))));
    o->inv = s > 0 ? 1.0f / (s * cb16_s) : 0;
}

/* 0, or -1 when a query is not finite (the caller takes the float path). */
VBMI_FN static int score_w16(const LbFmt *f, const uint8_t *data, const float *q, int nq, int t0, int t1, float *out,
                             int ldo) {
    LbQ16 o[4];
    for (int i = 0; i < nq; i++) {
        const float s = q_scale16(q + (size_t)i * 128, 16383.0f);
        if (s < 0) return -1;
        q16_prep(q + (size_t)i * 128, s, f->cb16_s, &o[i]);
    }
    switch (nq) {
    case 1: score_w16_body(f, 1, data, o, t0, t1, out, ldo); break;
    case 2: score_w16_body(f, 2, data, o, t0, t1, out, ldo); break;
    case 3: score_w16_body(f, 3, data, o, t0, t1, out, ldo); break;
    default: score_w16_body(f, 4, data, o, t0, t1, out, ldo); break;
    }
    return 0;
}

/* pairs16.h's decoder for positions t and u, 3- or 2-bit codes: per group
 * one vpermt2b, then per half a vpmultishiftqb and a vpermw lookup. */
VBMI_INLINE void vb_dec16(const KVStream *s, const int B, int t, int u, __m512i x[4][2]) {
    const LbFmt *f = s->aux;
    const __m512i a = vb_load(s->data + (size_t)t * (size_t)f->vec_bytes + f->hdr, B),
                  b = vb_load(s->data + (size_t)u * (size_t)f->vec_bytes + f->hdr, B);
    const __m512i tbl = _mm512_loadu_si512(f->cb16), slo = _mm512_loadu_si512(vp_shift[B - 2][0]),
                  shi = _mm512_loadu_si512(vp_shift[B - 2][1]);
    for (int g = 0; g < 4; g++) {
        const __m512i w = _mm512_permutex2var_epi8(a, _mm512_loadu_si512(vp_gather[B - 2][g]), b);
        x[g][0] = _mm512_permutexvar_epi16(_mm512_multishift_epi64_epi8(slo, w), tbl);
        x[g][1] = _mm512_permutexvar_epi16(_mm512_multishift_epi64_epi8(shi, w), tbl);
    }
}
VBMI_INLINE void vb_dec16_3(const KVStream *s, int t, int u, __m512i x[4][2]) { vb_dec16(s, 3, t, u, x); }
VBMI_INLINE void vb_dec16_2(const KVStream *s, int t, int u, __m512i x[4][2]) { vb_dec16(s, 2, t, u, x); }

/* accum_i16 for 3- and 2-bit codes: groups come out in value order. */
VBMI_FN static int accum_vb(const KVStream *s, const float *p, int ldp, int nq, int t0, int t1, float *acc) {
    const LbFmt *f = s->aux;
    __m512 sum[8][4][2];
    if (f->kind == LB_IDX3 ? p16_accum(s, vb_dec16_3, lb_scale16, 1, (size_t)f->vec_bytes, p, ldp, nq, t0, t1, sum)
                           : p16_accum(s, vb_dec16_2, lb_scale16, 1, (size_t)f->vec_bytes, p, ldp, nq, t0, t1, sum))
        return -1;
    for (int i = 0; i < nq; i++)
        for (int g = 0; g < 4; g++)
            for (int h = 0; h < 2; h++) {
                float *a = acc + (size_t)i * 128 + 32 * g + 16 * h;
                _mm512_storeu_ps(a, _mm512_add_ps(_mm512_loadu_ps(a), sum[i][g][h]));
            }
    return 0;
}

/* Integer sums: all of them, lm3 included (its weights are rounded, not
 * its queries: the same 1e-3 of Σ |p v| as tbq3's). */
static int i16_path(const KVStream *s) {
    const LbFmt *f = s->aux;
    return int_shape(s) && (!f->renorm || f->kind == LB_IDX4);
}

/* Whether the running level unpacks f's codes for its integer scores
 * (sums = 0) or sums: AVX-512 VNNI 4-bit codes, and 3- and 2-bit ones where
 * the CPU has VBMI (some VNNI CPUs lack it); AVX2 4- and 2-bit codes
 * (shifts and masks), and 3-bit ones for the scores (unpack3: for the sums
 * it would cost about what the float decode does). */
static int int_codes(const LbFmt *f, int sums) {
    if (kernels_level() >= 3) return f->kind == LB_IDX4 || kernels_has_vbmi();
    return kernels_level() == 1 && (f->kind != LB_IDX3 || !sums);
}

/* Heads go in groups of at most 4 (5 -> 3 + 2, 8 -> 4 + 4), or 2 where the
 * float AVX-512 path would give up to two heads score16_one, whose sums run
 * in another order than score16_pos's, or 8 where score_oct_body takes
 * them all: so a head's scores never depend on how many heads share the
 * call (KV_MAX_NQ, which prefill's attention blocks rely on). */
void lb_kv_score(const KVStream *s, const float *q, int nq, int t0, int t1, float *out, int ldo) {
    const LbFmt *f = s->aux;
    const int wide = kernels_level() > 1 && f->kind == LB_IDX4;
    if (kernels_level() == 0) {
        kv_score_ref(s, q, nq, t0, t1, out, ldo);
        return;
    }
    /* without an integer score here, score_oct_body takes all 8 heads */
    const int int_score = (kernels_level() >= 3 && (i8_path(s) || w16_path(s)) && int_codes(f, 0)) ||
                          (kernels_level() == 1 && i8_path(s) && int_codes(f, 0));
    const int one = wide && !(kernels_level() >= 3 && i8_path(s)) && f->nb == 1 && f->n == 128 && !f->renorm,
              oct = !wide && !int_score && f->nb == 1 && !f->renorm, most = one ? 2 : oct ? 8 : 4;
    for (int i0 = 0, left = (nq + most - 1) / most; i0 < nq; left--) {
        int m = (nq - i0 + left - 1) / left;
        const float *qi = q + (size_t)i0 * s->d;
        float *oi = out + (size_t)i0 * ldo;
        if (kernels_level() >= 3 && i8_path(s) && int_codes(f, 0) &&
            !(f->kind == LB_IDX4 ? score_i8(f, s->data, qi, m, t0, t1, oi, ldo)
                                 : score_vb(f, s->data, qi, m, t0, t1, oi, ldo))) {
            i0 += m;
            continue;
        }
        if (kernels_level() == 1 && i8_path(s) && int_codes(f, 0) && !score_i8_avx2(f, s->data, qi, m, t0, t1, oi, ldo)) {
            i0 += m;
            continue;
        }
        if (kernels_level() >= 3 && w16_path(s) && int_codes(f, 0) && !score_w16(f, s->data, qi, m, t0, t1, oi, ldo)) {
            i0 += m;
            continue;
        }
        if (wide) score_avx512(f, s->data, s->d, qi, m, t0, t1, oi, ldo);
        else score_avx2(f, s->data, s->d, qi, m, t0, t1, oi, ldo);
        i0 += m;
    }
}

void lb_kv_accum(const KVStream *s, const float *p, int ldp, int nq, int t0, int t1, float *acc) {
    const LbFmt *f = s->aux;
    if (kernels_level() == 1 && i16_path(s) && int_codes(f, 1) && !accum_i16_avx2(s, p, ldp, nq, t0, t1, acc))
        return;
    if (kernels_level() >= 3 && i16_path(s) && int_codes(f, 1) &&
        !(f->kind == LB_IDX4 ? accum_i16(s, p, ldp, nq, t0, t1, acc) : accum_vb(s, p, ldp, nq, t0, t1, acc)))
        return;
    const int wide = kernels_level() > 1 && f->kind == LB_IDX4;
    if (kernels_level() == 0) {
        kv_accum_ref(s, p, ldp, nq, t0, t1, acc);
        return;
    }
    for (int i0 = 0, left = (nq + 3) / 4; i0 < nq; left--) {
        int m = (nq - i0 + left - 1) / left;
        if (wide) accum_avx512(f, s->data, s->d, p + (size_t)i0 * ldp, ldp, m, t0, t1, acc + (size_t)i0 * s->d);
        else accum_avx2(f, s->data, s->d, p + (size_t)i0 * ldp, ldp, m, t0, t1, acc + (size_t)i0 * s->d);
        i0 += m;
    }
}
#elif defined(__aarch64__)
#include "kernels/vec.h"

#include <arm_neon.h>

/* ---- aarch64 ----------------------------------------------------------------
 * NEON: a position is decoded once into floats on the stack (codes
 * unpacked to a byte each, then table look-ups: byte k of the 16 f32
 * centroids is one 16-byte table, so 4 tbl give the 4 bytes of 16 values
 * and st4 lays them down as floats), then dotted with or added to each
 * head with the NEON vec ops.
 * dotprod, d = 128, tbq4/3/2 and polar4: lb_score_int_ref's integer
 * scores, with the codebook bytes signed (cb8 - 128, so the sum needs no
 * bias) looked up by tbl and multiplied by the query's bytes with sdot. */
/* lm_nearest 4 values at a time, as nearest16: the strict v > mid counted
 * in the lanes (an all-ones compare subtracted adds 1). */
static int nearest_fast(const float *mid, int k, const float *y, int n, int *idx) {
    if (kernels_level() == 0) return 0;
    int j0 = 0;
    for (; j0 + 4 <= n; j0 += 4) {
        const float32x4_t v = vld1q_f32(y + j0);
        uint32x4_t c = vdupq_n_u32(0);
        for (int m = 0; m < k - 1; m++) c = vsubq_u32(c, vcgtq_f32(v, vdupq_n_f32(mid[m])));
        vst1q_s32(idx + j0, vreinterpretq_s32_u32(c));
    }
    return j0;
}

/* The 4-bit codebook as 4 tables of 16 bytes, byte k of each centroid in
 * table k: what dequant_neon looks codes up in. */
typedef struct {
    uint8x16_t b[4];
} CbTables;

static void cb_tables(const LbFmt *f, CbTables *t) {
    for (int k = 0; k < 4; k++) {
        uint8_t b[16];
        for (int i = 0; i < 16; i++) {
            uint32_t u;
            memcpy(&u, &f->cb[i], 4);
            b[i] = (uint8_t)(u >> (8 * k));
        }
        t->b[k] = vld1q_u8(b);
    }
}

/* Codes j..j+31 of a block's packed codes qs as one index byte each. */
static inline void codes32(const uint8_t *qs, int bits, int j, uint8x16_t idx[2]) {
    if (bits == 4) {
        /* 16 bytes: values j + 2i in the low nibbles, j + 2i + 1 in the high */
        const uint8x16_t c = vld1q_u8(qs + j / 2);
        const uint8x16x2_t z = vzipq_u8(vandq_u8(c, vdupq_n_u8(15)), vshrq_n_u8(c, 4));
        idx[0] = z.val[0], idx[1] = z.val[1];
        return;
    }
    if (bits == 2) {
        /* 8 bytes: value j + 4i + k at bits 2k of byte i; st4 interleaves */
        uint8_t v[32];
        const uint8x8_t c = vld1_u8(qs + j / 4), m = vdup_n_u8(3);
        const uint8x8x4_t q = {{vand_u8(c, m), vand_u8(vshr_n_u8(c, 2), m), vand_u8(vshr_n_u8(c, 4), m),
                                vshr_n_u8(c, 6)}};
        vst4_u8(v, q);
        idx[0] = vld1q_u8(v), idx[1] = vld1q_u8(v + 16);
        return;
    }
    /* 12 bytes, four 24-bit words of 8 codes (code i of word g at bit 3i),
     * read as exactly 12 (a block's last 12 end its row). Per word a
     * vector of 8 16-bit lanes: lane i gathers the two bytes holding code
     * i (tbl; byte 12, past the words, reads 0), a negative ushl moves the
     * code to bit 0, and narrowing keeps the low byte, the next codes'
     * bits above it masked off. */
    static const uint8_t gather[4][16] = {{0, 1, 0, 1, 0, 1, 1, 2, 1, 2, 1, 2, 2, 3, 2, 3},
                                          {3, 4, 3, 4, 3, 4, 4, 5, 4, 5, 4, 5, 5, 6, 5, 6},
                                          {6, 7, 6, 7, 6, 7, 7, 8, 7, 8, 7, 8, 8, 9, 8, 9},
                                          {9, 10, 9, 10, 9, 10, 10, 11, 10, 11, 10, 11, 11, 12, 11, 12}};
    static const int16_t shift[8] = {0, -3, -6, -1, -4, -7, -2, -5};
    uint64_t lo;
    uint32_t hi;
    memcpy(&lo, qs + 3 * (j / 8), 8);
    memcpy(&hi, qs + 3 * (j / 8) + 8, 4);
    const uint8x16_t w = vcombine_u8(vcreate_u8(lo), vcreate_u8(hi));
    const int16x8_t sh = vld1q_s16(shift);
    uint8x8_t c[4];
    for (int g = 0; g < 4; g++)
        c[g] = vmovn_u16(vshlq_u16(vreinterpretq_u16_u8(vqtbl1q_u8(w, vld1q_u8(gather[g]))), sh));
    idx[0] = vandq_u8(vcombine_u8(c[0], c[1]), vdupq_n_u8(7));
    idx[1] = vandq_u8(vcombine_u8(c[2], c[3]), vdupq_n_u8(7));
}

/* lb_dequant, the same values: cb[idx] · s, one rounding each, with
 * polar4's norm summed over the decoded centroids in value order, as
 * there. t: cb_tables(f). Index kinds only, n a multiple of 32. */
static void dequant_neon(const LbFmt *f, const CbTables *t, const uint8_t *vec, float *out) {
    if (f->kind == LB_Q4_0 || f->n % 32) {
        lb_dequant(f, vec, out);
        return;
    }
    for (int b = 0; b < f->nb; b++, vec += f->blk_bytes, out += f->n) {
        float s = header(vec, f->hdr);
        for (int j = 0; j < f->n; j += 32) {
            uint8x16_t idx[2];
            codes32(vec + f->hdr, f->kind, j, idx);
            for (int h = 0; h < 2; h++) {
                const uint8x16x4_t v = {{vqtbl1q_u8(t->b[0], idx[h]), vqtbl1q_u8(t->b[1], idx[h]),
                                         vqtbl1q_u8(t->b[2], idx[h]), vqtbl1q_u8(t->b[3], idx[h])}};
                vst4q_u8((uint8_t *)(out + j + 16 * h), v);
            }
        }
        if (f->renorm) {
            float nn = 0;
            for (int j = 0; j < f->n; j++) nn += out[j] * out[j];
            s /= sqrtf(nn);
        }
        for (int j = 0; j < f->n; j += 4) vst1q_f32(out + j, vmulq_n_f32(vld1q_f32(out + j), s));
    }
}

/* lb_score_int_ref's byte scores (i8_path streams): per position the
 * exact Σ (cb8[idx_j] - 128) q_j, then its float steps in its order.
 * 4-bit codes are looked up as they lie (even and odd values apart, the
 * query's qe and qo); 3- and 2-bit ones through codes32, in value order. */
__attribute__((target("arch=armv8.2-a+dotprod"))) static int score_sdot(const KVStream *s, const float *q, int nq,
                                                                         int t0, int t1, float *out, int ldo) {
    const LbFmt *f = s->aux;
    if (!i8_path(s) || nq > KV_MAX_NQ) return -1;
    const int b4 = f->kind == LB_IDX4;
    LbQ8 o[KV_MAX_NQ];
    int8_t qv[KV_MAX_NQ][128]; /* 3 and 2 bits: each query's bytes in value order */
    for (int i = 0; i < nq; i++) {
        const float sc = q_scale(q + (size_t)i * 128, 127.0f);
        if (sc < 0) return -1;
        q8_prep_ref(q + (size_t)i * 128, sc, f->cb8_s, &o[i]);
        for (int b = 0; !b4 && b < 64; b++) qv[i][2 * b] = o[i].qe[b], qv[i][2 * b + 1] = o[i].qo[b];
    }
    int8_t cbs[16];
    for (int i = 0; i < 16; i++) cbs[i] = (int8_t)(f->cb8[i] - 128);
    const int8x16_t tab = vld1q_s8(cbs);
    for (int t = t0; t < t1; t++) {
        const uint8_t *blk = s->data + (size_t)t * (size_t)f->vec_bytes;
        /* 4 bits: x[2c], x[2c + 1] the centroid bytes of values 32c + 2i and
         * 32c + 2i + 1; else x[k] those of values 16k .. 16k + 15 */
        int8x16_t x[8];
        for (int c = 0; c < 4; c++) {
            uint8x16_t idx[2];
            if (b4) {
                const uint8x16_t b = vld1q_u8(blk + f->hdr + 16 * c);
                idx[0] = vandq_u8(b, vdupq_n_u8(15)), idx[1] = vshrq_n_u8(b, 4);
            } else
                codes32(blk + f->hdr, f->kind, 32 * c, idx);
            x[2 * c] = vqtbl1q_s8(tab, idx[0]), x[2 * c + 1] = vqtbl1q_s8(tab, idx[1]);
        }
        const float scale = i8_scale(f, blk);
        for (int i = 0; i < nq; i++) {
            int32x4_t a = vdupq_n_s32(0);
            for (int c = 0; c < 4; c++) {
                a = vdotq_s32(a, x[2 * c], vld1q_s8(b4 ? o[i].qe + 16 * c : qv[i] + 32 * c));
                a = vdotq_s32(a, x[2 * c + 1], vld1q_s8(b4 ? o[i].qo + 16 * c : qv[i] + 32 * c + 16));
            }
            out[(size_t)i * ldo + (t - t0)] = (float)vaddvq_s32(a) * scale * o[i].inv;
        }
    }
    return 0;
}

/* NEON floats: each position decoded once for all nq heads. */
static void score_neon(const KVStream *s, const float *q, int nq, int t0, int t1, float *out, int ldo) {
    const LbFmt *f = s->aux;
    float k[KV_MAX_DIM];
    CbTables tab;
    cb_tables(f, &tab);
    for (int t = t0; t < t1; t++) {
        dequant_neon(f, &tab, s->data + (size_t)t * (size_t)f->vec_bytes, k);
        for (int i = 0; i < nq; i++) out[(size_t)i * ldo + (t - t0)] = vec_dot_f32(q + (size_t)i * s->d, k, s->d);
    }
}

/* Integer scores where they apply; a call with a non-finite query takes
 * the float path whole, as on x86 (its outputs are not finite anyway). */
void lb_kv_score(const KVStream *s, const float *q, int nq, int t0, int t1, float *out, int ldo) {
    if (kernels_level() == 0) kv_score_ref(s, q, nq, t0, t1, out, ldo);
    else if (kernels_level() < 2 || score_sdot(s, q, nq, t0, t1, out, ldo)) score_neon(s, q, nq, t0, t1, out, ldo);
}

void lb_kv_accum(const KVStream *s, const float *p, int ldp, int nq, int t0, int t1, float *acc) {
    const LbFmt *f = s->aux;
    if (kernels_level() == 0) {
        kv_accum_ref(s, p, ldp, nq, t0, t1, acc);
        return;
    }
    float v[KV_MAX_DIM];
    CbTables tab;
    cb_tables(f, &tab);
    for (int t = t0; t < t1; t++) {
        dequant_neon(f, &tab, s->data + (size_t)t * (size_t)f->vec_bytes, v);
        for (int i = 0; i < nq; i++) vec_axpy_f32(acc + (size_t)i * s->d, p[(size_t)i * ldp + (t - t0)], v, s->d);
    }
}
#else
/* Other CPUs: lm_nearest and kv.c's reference over lb_dequant. */
static int nearest_fast(const float *mid, int k, const float *y, int n, int *idx) {
    (void)mid, (void)k, (void)y, (void)n, (void)idx;
    return 0;
}

void lb_kv_score(const KVStream *s, const float *q, int nq, int t0, int t1, float *out, int ldo) {
    kv_score_ref(s, q, nq, t0, t1, out, ldo);
}

void lb_kv_accum(const KVStream *s, const float *p, int ldp, int nq, int t0, int t1, float *acc) {
    kv_accum_ref(s, p, ldp, nq, t0, t1, acc);
}
#endif /* __x86_64__, __aarch64__ */
