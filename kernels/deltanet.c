/* deltanet.c: the gated delta rule (deltanet.h) in plain C, AVX-512, AVX2
 * and NEON.
 *
 * Work per token and value head: u = alpha S^T k over the old S, then
 * S <- alpha S + k delta^T and o = S^T q over the new one, about 5 dk dv
 * flops against dk dv floats of state read and written. In decode the
 * state comes from memory (1 MiB per layer for Qwen3.5-0.8B), in prefill
 * it stays in cache across the batch's tokens, where the work is the
 * limit: hence a column tile whose rows stay in L1 for all the tokens,
 * and several independent sums per pass so the FMAs overlap. AVX-512 and
 * NEON make two passes over the tile per token; AVX2 one, the update
 * pass also summing the next token's u.
 *
 * The reference scales S by alpha in the first pass (Hugging Face's order:
 * S <- alpha S, then u = S^T k); the SIMD versions fold alpha into u
 * and into the update, which saves a store of S per token and rounds
 * differently: tests/test_deltanet.c holds both to a float64 recurrence,
 * and every SIMD level to one scalar twin of the folded order, bit for
 * bit. The result of either never depends on how many tokens share a call.
 */
#include "kernels/deltanet.h"
#include "kernels/matmul.h"

void deltanet_cols_ref(float *S, const DeltaRule *a, int e0, int e1) {
    const int dk = a->dk, dv = a->dv;
    float u[1024];  /* e1 - e0 <= dv <= KV_MAX_DIM * 2 */
    for (int t = 0; t < a->n; t++) {
        const float *q = a->q + (size_t)t * a->ld_qk, *k = a->k + (size_t)t * a->ld_qk, *v = a->v + (size_t)t * a->ld_v;
        const float alpha = a->alpha[(size_t)t * a->ld_ab], beta = a->beta[(size_t)t * a->ld_ab];
        float *o = a->o + (size_t)t * a->ld_o;
        /* S <- alpha S and u = S^T k in one pass */
        for (int e = e0; e < e1; e++) u[e - e0] = 0;
        for (int i = 0; i < dk; i++) {
            float *row = S + (size_t)i * dv;
            for (int e = e0; e < e1; e++) row[e] *= alpha, u[e - e0] += row[e] * k[i];
        }
        /* delta = beta (v - u); S += k delta^T and o = S^T q in one pass */
        for (int e = e0; e < e1; e++) u[e - e0] = beta * (v[e] - u[e - e0]), o[e] = 0;
        for (int i = 0; i < dk; i++) {
            float *row = S + (size_t)i * dv;
            for (int e = e0; e < e1; e++) row[e] += k[i] * u[e - e0], o[e] += row[e] * q[i];
        }
    }
}

#if defined(__x86_64__)
#include <immintrin.h>

/* NB blocks of 16 columns from e0, all tokens. Each pass keeps two partial
 * sums per block (even and odd rows of S), 2 NB chains of FMAs in flight. */
__attribute__((target("avx512f"), always_inline)) static inline void tile16(float *S, const DeltaRule *a, int e0,
                                                                            const int NB) {
    const int dk = a->dk, dv = a->dv;
    for (int t = 0; t < a->n; t++) {
        const float *q = a->q + (size_t)t * a->ld_qk, *k = a->k + (size_t)t * a->ld_qk;
        const float *v = a->v + (size_t)t * a->ld_v + e0;
        const __m512 va = _mm512_set1_ps(a->alpha[(size_t)t * a->ld_ab]);
        const __m512 vb = _mm512_set1_ps(a->beta[(size_t)t * a->ld_ab]);
        __m512 s0[4], s1[4], d[4];
        for (int b = 0; b < NB; b++) s0[b] = s1[b] = _mm512_setzero_ps();
        /* u = S^T k over the old S */
        int i = 0;
        for (; i + 1 < dk; i += 2) {
            const float *r0 = S + (size_t)i * dv + e0, *r1 = r0 + dv;
            const __m512 k0 = _mm512_set1_ps(k[i]), k1 = _mm512_set1_ps(k[i + 1]);
            for (int b = 0; b < NB; b++) {
                s0[b] = _mm512_fmadd_ps(_mm512_loadu_ps(r0 + 16 * b), k0, s0[b]);
                s1[b] = _mm512_fmadd_ps(_mm512_loadu_ps(r1 + 16 * b), k1, s1[b]);
            }
        }
        if (i < dk) {
            const float *r0 = S + (size_t)i * dv + e0;
            for (int b = 0; b < NB; b++)
                s0[b] = _mm512_fmadd_ps(_mm512_loadu_ps(r0 + 16 * b), _mm512_set1_ps(k[i]), s0[b]);
        }
        /* delta = beta (v - alpha u) */
        for (int b = 0; b < NB; b++) {
            const __m512 u = _mm512_mul_ps(va, _mm512_add_ps(s0[b], s1[b]));
            d[b] = _mm512_mul_ps(vb, _mm512_sub_ps(_mm512_loadu_ps(v + 16 * b), u));
            s0[b] = s1[b] = _mm512_setzero_ps();
        }
        /* S <- alpha S + k delta^T, o = S^T q over the new S */
        for (i = 0; i < dk; i++) {
            float *r = S + (size_t)i * dv + e0;
            const __m512 kb = _mm512_set1_ps(k[i]), qb = _mm512_set1_ps(q[i]);
            for (int b = 0; b < NB; b++) {
                const __m512 x = _mm512_fmadd_ps(_mm512_loadu_ps(r + 16 * b), va, _mm512_mul_ps(kb, d[b]));
                _mm512_storeu_ps(r + 16 * b, x);
                if (i & 1) s1[b] = _mm512_fmadd_ps(x, qb, s1[b]);
                else s0[b] = _mm512_fmadd_ps(x, qb, s0[b]);
            }
        }
        float *o = a->o + (size_t)t * a->ld_o + e0;
        for (int b = 0; b < NB; b++) _mm512_storeu_ps(o + 16 * b, _mm512_add_ps(s0[b], s1[b]));
    }
}

/* Tiles of 64 columns (32 KB of S at dk = 128: L1-resident between the passes), then what is left. */
__attribute__((target("avx512f"))) static void deltanet_cols16(float *S, const DeltaRule *a, int e0, int e1) {
    for (; e1 - e0 >= 64; e0 += 64) tile16(S, a, e0, 4);
    switch ((e1 - e0) / 16) {
    case 3: tile16(S, a, e0, 3); break;
    case 2: tile16(S, a, e0, 2); break;
    case 1: tile16(S, a, e0, 1); break;
    default: break;
    }
}

/* The same recurrence in AVX2 over NB blocks of 8 columns from e0, in one
 * pass over S per token where tile16 takes two: the pass that writes
 * token t's S also sums token t+1's u = S^T k_{t+1} from the rows it has
 * just written, into even and odd sums in the same row order as a pass of
 * its own, so the bits are tile16's. Only the first token's u takes a pass
 * of its own (decode, one token a call, makes two), and the last token's
 * next-u sums run over its own k and are dropped: a second copy of the
 * loop without them, in a helper taking the sums by pointer, measured
 * slower in prefill (docs/kernel-notes.md#delta-rule-on-avx2). NB is at
 * most 2: d and the four sums take 5 NB of the 16 registers, the
 * broadcasts the rest. */
__attribute__((target("avx2,fma"), always_inline)) static inline void tile8(float *S, const DeltaRule *a, int e0,
                                                                            const int NB) {
    const int dk = a->dk, dv = a->dv;
    if (a->n < 1) return;
    __m256 u0[2], u1[2], o0[2], o1[2], d[2];
    /* token 0's u over S as it comes in */
    for (int b = 0; b < NB; b++) u0[b] = u1[b] = _mm256_setzero_ps();
    int i = 0;
    for (; i + 1 < dk; i += 2) {
        const float *r0 = S + (size_t)i * dv + e0, *r1 = r0 + dv;
        const __m256 k0 = _mm256_broadcast_ss(a->k + i), k1 = _mm256_broadcast_ss(a->k + i + 1);
        for (int b = 0; b < NB; b++) {
            u0[b] = _mm256_fmadd_ps(_mm256_loadu_ps(r0 + 8 * b), k0, u0[b]);
            u1[b] = _mm256_fmadd_ps(_mm256_loadu_ps(r1 + 8 * b), k1, u1[b]);
        }
    }
    if (i < dk)
        for (int b = 0; b < NB; b++)
            u0[b] = _mm256_fmadd_ps(_mm256_loadu_ps(S + (size_t)i * dv + e0 + 8 * b), _mm256_broadcast_ss(a->k + i), u0[b]);
    for (int t = 0; t < a->n; t++) {
        const float *q = a->q + (size_t)t * a->ld_qk, *k = a->k + (size_t)t * a->ld_qk;
        const float *v = a->v + (size_t)t * a->ld_v + e0;
        /* the next token's k, or this one's when there is none (its sums are then dropped) */
        const float *kn = t + 1 < a->n ? k + a->ld_qk : k;
        const __m256 va = _mm256_set1_ps(a->alpha[(size_t)t * a->ld_ab]);
        const __m256 vb = _mm256_set1_ps(a->beta[(size_t)t * a->ld_ab]);
        /* delta = beta (v - alpha u) */
        for (int b = 0; b < NB; b++) {
            const __m256 u = _mm256_mul_ps(va, _mm256_add_ps(u0[b], u1[b]));
            d[b] = _mm256_mul_ps(vb, _mm256_sub_ps(_mm256_loadu_ps(v + 8 * b), u));
            o0[b] = o1[b] = u0[b] = u1[b] = _mm256_setzero_ps();
        }
        /* S <- alpha S + k delta^T; o = S^T q and the next u = S^T kn over the new S */
        for (i = 0; i + 1 < dk; i += 2) {
            float *r0 = S + (size_t)i * dv + e0, *r1 = r0 + dv;
            const __m256 k0 = _mm256_broadcast_ss(k + i), k1 = _mm256_broadcast_ss(k + i + 1);
            const __m256 q0 = _mm256_broadcast_ss(q + i), q1 = _mm256_broadcast_ss(q + i + 1);
            const __m256 n0 = _mm256_broadcast_ss(kn + i), n1 = _mm256_broadcast_ss(kn + i + 1);
            for (int b = 0; b < NB; b++) {
                const __m256 x0 = _mm256_fmadd_ps(_mm256_loadu_ps(r0 + 8 * b), va, _mm256_mul_ps(k0, d[b]));
                _mm256_storeu_ps(r0 + 8 * b, x0);
                o0[b] = _mm256_fmadd_ps(x0, q0, o0[b]);
                u0[b] = _mm256_fmadd_ps(x0, n0, u0[b]);
                const __m256 x1 = _mm256_fmadd_ps(_mm256_loadu_ps(r1 + 8 * b), va, _mm256_mul_ps(k1, d[b]));
                _mm256_storeu_ps(r1 + 8 * b, x1);
                o1[b] = _mm256_fmadd_ps(x1, q1, o1[b]);
                u1[b] = _mm256_fmadd_ps(x1, n1, u1[b]);
            }
        }
        if (i < dk) {
            float *r = S + (size_t)i * dv + e0;
            const __m256 kb = _mm256_broadcast_ss(k + i), qb = _mm256_broadcast_ss(q + i), nb = _mm256_broadcast_ss(kn + i);
            for (int b = 0; b < NB; b++) {
                const __m256 x = _mm256_fmadd_ps(_mm256_loadu_ps(r + 8 * b), va, _mm256_mul_ps(kb, d[b]));
                _mm256_storeu_ps(r + 8 * b, x);
                o0[b] = _mm256_fmadd_ps(x, qb, o0[b]);
                u0[b] = _mm256_fmadd_ps(x, nb, u0[b]);
            }
        }
        float *o = a->o + (size_t)t * a->ld_o + e0;
        for (int b = 0; b < NB; b++) _mm256_storeu_ps(o + 8 * b, _mm256_add_ps(o0[b], o1[b]));
    }
}

/* Tiles of 16 columns (8 KB of S at dk = 128), then one of 8. */
__attribute__((target("avx2,fma"))) static void deltanet_cols8(float *S, const DeltaRule *a, int e0, int e1) {
    for (; e1 - e0 >= 16; e0 += 16) tile8(S, a, e0, 2);
    if (e1 > e0) tile8(S, a, e0, 1);
}

void deltanet_cols(float *S, const DeltaRule *a, int e0, int e1) {
    if (kernels_level() >= 2 && (e1 - e0) % 16 == 0) deltanet_cols16(S, a, e0, e1);
    else if (kernels_level() >= 1 && (e1 - e0) % 8 == 0) deltanet_cols8(S, a, e0, e1);
    else deltanet_cols_ref(S, a, e0, e1);
}
#elif defined(__aarch64__)
#include <arm_neon.h>

/* tile16's passes in NEON: NV vectors of 4 columns from e0 (up to 32
 * columns: the two sums and delta take 3 NV of the 32 registers), alpha
 * folded likewise, even and odd rows of S summed apart. */
static inline __attribute__((always_inline)) void tile4(float *S, const DeltaRule *a, int e0, const int NV) {
    const int dk = a->dk, dv = a->dv;
    for (int t = 0; t < a->n; t++) {
        const float *q = a->q + (size_t)t * a->ld_qk, *k = a->k + (size_t)t * a->ld_qk;
        const float *v = a->v + (size_t)t * a->ld_v + e0;
        const float alpha = a->alpha[(size_t)t * a->ld_ab], beta = a->beta[(size_t)t * a->ld_ab];
        float32x4_t s0[8], s1[8], d[8];
        for (int b = 0; b < NV; b++) s0[b] = s1[b] = vdupq_n_f32(0);
        /* u = S^T k over the old S */
        int i = 0;
        for (; i + 1 < dk; i += 2) {
            const float *r0 = S + (size_t)i * dv + e0, *r1 = r0 + dv;
            for (int b = 0; b < NV; b++) {
                s0[b] = vfmaq_n_f32(s0[b], vld1q_f32(r0 + 4 * b), k[i]);
                s1[b] = vfmaq_n_f32(s1[b], vld1q_f32(r1 + 4 * b), k[i + 1]);
            }
        }
        if (i < dk)
            for (int b = 0; b < NV; b++) s0[b] = vfmaq_n_f32(s0[b], vld1q_f32(S + (size_t)i * dv + e0 + 4 * b), k[i]);
        /* delta = beta (v - alpha u) */
        for (int b = 0; b < NV; b++) {
            const float32x4_t u = vmulq_n_f32(vaddq_f32(s0[b], s1[b]), alpha);
            d[b] = vmulq_n_f32(vsubq_f32(vld1q_f32(v + 4 * b), u), beta);
            s0[b] = s1[b] = vdupq_n_f32(0);
        }
        /* S <- alpha S + k delta^T, o = S^T q over the new S */
        for (i = 0; i < dk; i++) {
            float *r = S + (size_t)i * dv + e0;
            for (int b = 0; b < NV; b++) {
                const float32x4_t x = vfmaq_n_f32(vmulq_n_f32(d[b], k[i]), vld1q_f32(r + 4 * b), alpha);
                vst1q_f32(r + 4 * b, x);
                if (i & 1) s1[b] = vfmaq_n_f32(s1[b], x, q[i]);
                else s0[b] = vfmaq_n_f32(s0[b], x, q[i]);
            }
        }
        float *o = a->o + (size_t)t * a->ld_o + e0;
        for (int b = 0; b < NV; b++) vst1q_f32(o + 4 * b, vaddq_f32(s0[b], s1[b]));
    }
}

/* Tiles of 32 columns, then one of what is left (a multiple of 4). */
static void deltanet_cols4(float *S, const DeltaRule *a, int e0, int e1) {
    for (; e1 - e0 >= 32; e0 += 32) tile4(S, a, e0, 8);
    switch ((e1 - e0) / 4) {
    case 7: tile4(S, a, e0, 7); break;
    case 6: tile4(S, a, e0, 6); break;
    case 5: tile4(S, a, e0, 5); break;
    case 4: tile4(S, a, e0, 4); break;
    case 3: tile4(S, a, e0, 3); break;
    case 2: tile4(S, a, e0, 2); break;
    case 1: tile4(S, a, e0, 1); break;
    default: break;
    }
}

void deltanet_cols(float *S, const DeltaRule *a, int e0, int e1) {
    if (kernels_level() > 0 && (e1 - e0) % 4 == 0) deltanet_cols4(S, a, e0, e1);
    else deltanet_cols_ref(S, a, e0, e1);
}
#else
void deltanet_cols(float *S, const DeltaRule *a, int e0, int e1) { deltanet_cols_ref(S, a, e0, e1); }
#endif
