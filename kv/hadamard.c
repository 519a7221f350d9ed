/* hadamard.c: blockwise fast Walsh-Hadamard rotations (see hadamard.h).
 *
 * Data flow: tbq2/3/4 (kv/tbq_common.c) and q4h rotate each appended K/V
 * vector x [d] here, and their to_domain / from_domain rotate a query head
 * in and an output head back once per attention call; blocks of n = 128
 * (or d when d is 32 or 64):
 *
 *   | block 0: x[0..n) | block 1: x[n..2n) | ...   each y = s2 ⊙ H(s1 ⊙ x)/√n
 *
 * Signs and order follow the public TBQ4_0 / turbo4 llama.cpp forks (spec
 * kv_schemes.md, rotation section).
 *
 * A rotation runs once per appended vector and once per query / output head,
 * never per cached token; still, with a small model decoding a few tokens
 * per forward, the plain C butterfly is a visible share of a tbq4 forward
 * (docs/kernel-notes.md#hadamard). So 128-point blocks take an AVX-512 path
 * where the CPU has it: the block as 8 vectors of 16, stages h = 16, 32, 64
 * between vectors and h = 1..8 inside each with a lane shuffle (AVX2: 16
 * vectors of 8, h = 1..4 inside). It does the same adds in the same pairs
 * as had_fwht, so its results are bit-identical to the plain C block
 * (tested). aarch64 has the same in NEON for every
 * block size (4-lane vectors, stages 1 and 2 inside them); other CPUs run
 * the plain C block.
 */
#include "kv/hadamard.h"
#include "kernels/matmul.h"
#include "kv/kv.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* sign[i] = bit (i % 32) of mask[i / 32] ? -1 : +1 (spec, rotation section). */
static const uint32_t s1_mask[4] = {0xE46A0359u, 0x42F85949u, 0xA4C63BBBu, 0x49F250A9u};
static const uint32_t s2_mask[4] = {0x16ACEE90u, 0x3F628FDCu, 0xB7A5357Au, 0xBEA56562u};

int had_block(int d) {
    if (d == 32 || d == 64) return d;
    if (d >= HAD_MAX_BLOCK && d % HAD_MAX_BLOCK == 0 && d <= KV_MAX_DIM) return HAD_MAX_BLOCK;
    return 0;
}

int had_check(int d, const char *scheme, char *err, size_t errlen) {
    if (had_block(d)) return 0;
    snprintf(err, errlen, "%s: head_dim %d not supported (expected 32, 64 or a multiple of 128 up to %d)", scheme, d,
             KV_MAX_DIM);
    return -1;
}

int had_sign(int which, int i) {
    const uint32_t *m = which == 1 ? s1_mask : s2_mask;
    return (m[i / 32] >> (i % 32)) & 1 ? -1 : 1;
}

/* Sylvester order: stage h pairs (a, b) = (x[j], x[j+h]) -> (a+b, a-b). */
void had_fwht(float *x, int n) {
    for (int h = 1; h < n; h *= 2)
        for (int i = 0; i < n; i += 2 * h)
            for (int j = i; j < i + h; j++) {
                float a = x[j], b = x[j + h];
                x[j] = a + b;
                x[j + h] = a - b;
            }
}

/* One block: y = post ⊙ H(pre ⊙ x)/√n, with pre/post = 0 meaning no signs. */
static void block_ref(const float *x, float *y, int n, int pre, int post) {
    float t[HAD_MAX_BLOCK];
    const float inv = 1.0f / sqrtf((float)n);
    for (int j = 0; j < n; j++) t[j] = pre ? (float)had_sign(pre, j) * x[j] : x[j];
    had_fwht(t, n);
    for (int j = 0; j < n; j++) y[j] = (post ? (float)had_sign(post, j) : 1.0f) * t[j] * inv;
}

#if defined(__x86_64__)
#include <immintrin.h>

#define AVX512 __attribute__((target("avx512f,avx512dq"))) static

/* Lanes 16v..16v+15 of sign vector which as a mask of the negative ones
 * (which = 0: none). */
static inline __mmask16 sign_mask(int which, int v) {
    if (!which) return 0;
    const uint32_t *m = which == 1 ? s1_mask : s2_mask;
    return (__mmask16)(m[v / 2] >> (16 * (v % 2)));
}

/* block_ref for n = 128. Stage h pairs lane j with lane j ^ h: lanes with
 * bit h clear get a + b, the others a - b, where a is the lower lane. */
AVX512 void block128(const float *x, float *y, int pre, int post) {
    /* signs flip by xor with -0.0f, exactly what -1.0f * x does (zeros too) */
    const __m512 neg = _mm512_set1_ps(-0.0f), inv = _mm512_set1_ps(1.0f / sqrtf(128.0f));
    /* lanes with bit h of their index set, for h = 1, 2, 4, 8 */
    const __mmask16 hi[4] = {0xAAAA, 0xCCCC, 0xF0F0, 0xFF00};
    __m512 v[8];
    for (int i = 0; i < 8; i++) {
        v[i] = _mm512_loadu_ps(x + 16 * i);
        v[i] = _mm512_mask_xor_ps(v[i], sign_mask(pre, i), v[i], neg);
        for (int s = 0; s < 4; s++) {
            __m512 sw = s == 0   ? _mm512_permute_ps(v[i], 0xB1)
                        : s == 1 ? _mm512_permute_ps(v[i], 0x4E)
                        : s == 2 ? _mm512_shuffle_f32x4(v[i], v[i], 0xB1)
                                 : _mm512_shuffle_f32x4(v[i], v[i], 0x4E);
            /* lower lane: v + sw = a + b; upper lane: sw - v = a - b */
            v[i] = _mm512_mask_sub_ps(_mm512_add_ps(v[i], sw), hi[s], sw, v[i]);
        }
    }
    for (int h = 1; h < 8; h *= 2)
        for (int i = 0; i < 8; i += 2 * h)
            for (int j = i; j < i + h; j++) {
                __m512 a = v[j], b = v[j + h];
                v[j] = _mm512_add_ps(a, b);
                v[j + h] = _mm512_sub_ps(a, b);
            }
    for (int i = 0; i < 8; i++) {
        __m512 t = _mm512_mask_xor_ps(v[i], sign_mask(post, i), v[i], neg);
        _mm512_storeu_ps(y + 16 * i, _mm512_mul_ps(t, inv));
    }
}

/* Lanes 8v..8v+7 of sign vector which as -0.0f where negative, 0 elsewhere
 * (which = 0: none): the mask's byte broadcast, each lane testing its bit. */
__attribute__((target("avx2"))) static inline __m256 sign_bits8(int which, int v) {
    if (!which) return _mm256_setzero_ps();
    const uint32_t *m = which == 1 ? s1_mask : s2_mask;
    const __m256i bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    const __m256i b = _mm256_and_si256(_mm256_set1_epi32((int)((m[v / 4] >> (8 * (v % 4))) & 0xFF)), bit);
    return _mm256_and_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(b, bit)), _mm256_set1_ps(-0.0f));
}

/* block128 on 8 lanes, the same bits: stages 1, 2 and 4 inside each of
 * the 16 vectors (the lanes swapped by permute_ps or across the 128-bit
 * halves; lanes with bit h set take sw - v = a - b), then stages 8..64
 * between vectors, in the reference's stage order. */
__attribute__((target("avx2"))) static void block128_avx2(const float *x, float *y, int pre, int post) {
    const __m256 inv = _mm256_set1_ps(1.0f / sqrtf(128.0f));
    __m256 v[16];
    for (int i = 0; i < 16; i++) {
        v[i] = _mm256_xor_ps(_mm256_loadu_ps(x + 8 * i), sign_bits8(pre, i));
        __m256 sw = _mm256_permute_ps(v[i], 0xB1);
        v[i] = _mm256_blend_ps(_mm256_add_ps(v[i], sw), _mm256_sub_ps(sw, v[i]), 0xAA);
        sw = _mm256_permute_ps(v[i], 0x4E);
        v[i] = _mm256_blend_ps(_mm256_add_ps(v[i], sw), _mm256_sub_ps(sw, v[i]), 0xCC);
        sw = _mm256_permute2f128_ps(v[i], v[i], 0x01);
        v[i] = _mm256_blend_ps(_mm256_add_ps(v[i], sw), _mm256_sub_ps(sw, v[i]), 0xF0);
    }
    for (int h = 1; h < 16; h *= 2)
        for (int i = 0; i < 16; i += 2 * h)
            for (int j = i; j < i + h; j++) {
                const __m256 a = v[j], b = v[j + h];
                v[j] = _mm256_add_ps(a, b);
                v[j + h] = _mm256_sub_ps(a, b);
            }
    for (int i = 0; i < 16; i++)
        _mm256_storeu_ps(y + 8 * i, _mm256_mul_ps(_mm256_xor_ps(v[i], sign_bits8(post, i)), inv));
}

/* Blocks are independent; t[] inside block_ref makes y == x safe, and
 * block128 and block128_avx2 read their block before writing it. */
static void blocks(const float *x, float *y, int d, int pre, int post) {
    const int n = had_block(d), level = n == 128 ? kernels_level() : 0;
    for (int b = 0; b < d; b += n) {
        if (level >= 2) block128(x + b, y + b, pre, post);
        else if (level == 1) block128_avx2(x + b, y + b, pre, post);
        else block_ref(x + b, y + b, n, pre, post);
    }
}
#elif defined(__aarch64__)
#include <arm_neon.h>

/* Lanes 4v..4v+3 of sign vector which as a mask of the negative ones'
 * sign bits (which = 0: none). */
static inline uint32x4_t sign_bits(int which, int v) {
    static const uint32_t bit[4] = {1, 2, 4, 8};
    if (!which) return vdupq_n_u32(0);
    const uint32_t *m = which == 1 ? s1_mask : s2_mask, nib = (m[v / 8] >> (4 * (v % 8))) & 15;
    return vandq_u32(vtstq_u32(vdupq_n_u32(nib), vld1q_u32(bit)), vdupq_n_u32(0x80000000u));
}

/* block_ref for n = 32, 64 or 128 as n / 4 vectors of 4: stages h = 1, 2
 * inside each vector (lane j pairs with lane j ^ h: the lower lane gets
 * a + b, the upper a - b), h = 4 .. n / 2 between vectors. The same adds
 * in the same pairs as had_fwht, so the same bits. */
static void block_neon(const float *x, float *y, int n, int pre, int post) {
    static const uint32_t up1[4] = {0, ~0u, 0, ~0u}, up2[4] = {0, 0, ~0u, ~0u};
    const uint32x4_t hi1 = vld1q_u32(up1), hi2 = vld1q_u32(up2);
    const float inv = 1.0f / sqrtf((float)n);
    const int nv = n / 4;
    float32x4_t v[HAD_MAX_BLOCK / 4];
    for (int i = 0; i < nv; i++) {
        /* a sign flip is an xor of the sign bit, what -1.0f * x does */
        const uint32x4_t u = veorq_u32(vreinterpretq_u32_f32(vld1q_f32(x + 4 * i)), sign_bits(pre, i));
        float32x4_t t = vreinterpretq_f32_u32(u);
        float32x4_t sw = vrev64q_f32(t);
        t = vbslq_f32(hi1, vsubq_f32(sw, t), vaddq_f32(t, sw));
        sw = vextq_f32(t, t, 2);
        v[i] = vbslq_f32(hi2, vsubq_f32(sw, t), vaddq_f32(t, sw));
    }
    for (int h = 1; h < nv; h *= 2)
        for (int i = 0; i < nv; i += 2 * h)
            for (int j = i; j < i + h; j++) {
                const float32x4_t a = v[j], b = v[j + h];
                v[j] = vaddq_f32(a, b);
                v[j + h] = vsubq_f32(a, b);
            }
    for (int i = 0; i < nv; i++) {
        const float32x4_t t = vreinterpretq_f32_u32(veorq_u32(vreinterpretq_u32_f32(v[i]), sign_bits(post, i)));
        vst1q_f32(y + 4 * i, vmulq_n_f32(t, inv));
    }
}

static void blocks(const float *x, float *y, int d, int pre, int post) {
    const int n = had_block(d), fast = kernels_level() > 0;
    for (int b = 0; b < d; b += n) {
        if (fast) block_neon(x + b, y + b, n, pre, post);
        else block_ref(x + b, y + b, n, pre, post);
    }
}
#else
static void blocks(const float *x, float *y, int d, int pre, int post) {
    const int n = had_block(d);
    for (int b = 0; b < d; b += n) block_ref(x + b, y + b, n, pre, post);
}
#endif /* __x86_64__, __aarch64__ */

void had_rotate(const float *x, float *y, int d) { blocks(x, y, d, 1, 2); }
void had_unrotate(const float *y, float *x, int d) { blocks(y, x, d, 2, 1); }
void had_plain(const float *x, float *y, int d) { blocks(x, y, d, 0, 0); }
