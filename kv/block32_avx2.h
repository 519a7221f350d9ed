/* block32_avx2.h: the AVX2 float scores of a llama.cpp block scheme
 * (q4_0), included by kv/q4.c (q8_0, in tiles, has its own: kv/q8.c;
 * q4.c sums values itself).
 *
 * Data flow: attn_group -> kv_score / kv_accum -> q4.c, on AVX2 machines
 * without AVX-512 (those take kv/tile512.h). A position is d/32 blocks of
 * 32 codes and an fp16 scale, wherever the scheme keeps them:
 *
 *   q4_0: | fp16 d | 16 B of nibbles | per block, rows of blocks
 *
 * The scheme passes LOAD(s, t, k, v), which turns block k of position t
 * into 4 x 8 floats (elements 0-7, 8-15, 16-23, 24-31) before the scale
 * and returns the scale; each block is loaded once per position and feeds
 * every head. Scores: acc_i += d · (q_i[block] ⊙ codes), then one
 * horizontal sum per head; up to B32_HEADS heads per pass (their
 * accumulators, 4 code vectors and the scale fit 16 registers).
 */
#ifndef KV_BLOCK32_AVX2_H
#define KV_BLOCK32_AVX2_H

#if defined(__x86_64__) /* x86 kernels: the includer's x86 region uses them, other CPUs never */

#include "kv/kv.h"

#include <immintrin.h>

#define B32_HEADS 8
#define B32_AVX2 __attribute__((target("avx2,fma,f16c"), always_inline)) static inline

typedef float (*B32Load)(const KVStream *s, int t, int k, __m256 v[4]);

B32_AVX2 float b32_hsum(__m256 v) {
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    x = _mm_add_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
}

/* Scores [t0, t1) for nh heads (a constant in each inlined copy). */
B32_AVX2 void b32_score_heads(const KVStream *s, B32Load load, const float *qh, const int nh, int t0, int t1,
                              float *out, int ldo) {
    const int nb = s->d / 32;
    for (int t = t0; t < t1; t++) {
        __m256 acc[B32_HEADS];
        for (int i = 0; i < nh; i++) acc[i] = _mm256_setzero_ps();
        for (int k = 0; k < nb; k++) {
            __m256 c[4];
            const __m256 d = _mm256_set1_ps(load(s, t, k, c));
            for (int i = 0; i < nh; i++) {
                const float *qi = qh + (size_t)i * s->d + k * 32;
                __m256 dot = _mm256_mul_ps(_mm256_loadu_ps(qi), c[0]);
                dot = _mm256_fmadd_ps(_mm256_loadu_ps(qi + 8), c[1], dot);
                dot = _mm256_fmadd_ps(_mm256_loadu_ps(qi + 16), c[2], dot);
                dot = _mm256_fmadd_ps(_mm256_loadu_ps(qi + 24), c[3], dot);
                acc[i] = _mm256_fmadd_ps(d, dot, acc[i]);
            }
        }
        for (int i = 0; i < nh; i++) out[(size_t)i * ldo + (t - t0)] = b32_hsum(acc[i]);
    }
}

/* kv_score: heads in tiles of up to B32_HEADS, each size its own copy. */
B32_AVX2 void b32_score(const KVStream *s, B32Load load, const float *q, int nq, int t0, int t1, float *out,
                        int ldo) {
    for (int h0 = 0; h0 < nq; h0 += B32_HEADS) {
        const float *qh = q + (size_t)h0 * s->d;
        float *o = out + (size_t)h0 * ldo;
        switch (nq - h0 < B32_HEADS ? nq - h0 : B32_HEADS) {
        case 1: b32_score_heads(s, load, qh, 1, t0, t1, o, ldo); break;
        case 2: b32_score_heads(s, load, qh, 2, t0, t1, o, ldo); break;
        case 3: b32_score_heads(s, load, qh, 3, t0, t1, o, ldo); break;
        case 4: b32_score_heads(s, load, qh, 4, t0, t1, o, ldo); break;
        case 5: b32_score_heads(s, load, qh, 5, t0, t1, o, ldo); break;
        case 6: b32_score_heads(s, load, qh, 6, t0, t1, o, ldo); break;
        case 7: b32_score_heads(s, load, qh, 7, t0, t1, o, ldo); break;
        default: b32_score_heads(s, load, qh, 8, t0, t1, o, ldo); break;
        }
    }
}

/* The scheme file's AVX2 entry point, score_avx2, over its block loader. */
#define BLOCK32_AVX2_KERNELS(LOAD)                                                                                   \
    __attribute__((target("avx2,fma,f16c"))) static void score_avx2(const KVStream *s, const float *q, int nq,       \
                                                                    int t0, int t1, float *out, int ldo) {           \
        b32_score(s, LOAD, q, nq, t0, t1, out, ldo);                                                                 \
    }

#endif /* __x86_64__ */

#endif
