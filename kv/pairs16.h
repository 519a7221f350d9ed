/* pairs16.h: the accumulate half of attention (acc_i += Σ_t p_i,t v_t) as
 * 16-bit integer dot products over pairs of positions, for the schemes
 * whose cached values are small integers times a float scale, stored a
 * position per row (tbq's codebooks rounded to 10 bits), on CPUs with
 * AVX-512 VNNI. q8, whose tiles hold pairs already interleaved, has its own
 * loop (kv/q8.c) and shares the weights' rounding, p16_round.
 *
 * Data flow: kv_accum -> scheme's accumulate -> p16_accum. The scheme
 * supplies two always_inline functions: D(s, t, u, x) decodes positions t
 * and u (the pair; u = t for an odd span's last) into four groups of 32
 * values as two registers of interleaved int16 pairs each (lane order
 * below), rb is the bytes between positions, and S(s, t, g, k) gives group
 * g's float scales at positions t..t+15 (lanes outside mask k zero: never
 * read). Per span of up to P16_SPAN positions:
 *
 *   w[i][g][t] = p_i,t · S(t, g), rounded to int16 at 32767 / max|w| (per head)
 *   position pairs (t, t+1) interleaved word by word:  | x_t[j] | x_t+1[j] |
 *   vpdpwssd adds x_t[j]·w_t + x_t+1[j]·w_t+1 into lane j's int32 sum
 *   at the end of the span: lanes to floats, times max|w| / 32767, into acc
 *
 * Per pair tbq4 spends 4 widenings, 4 interleaves and 8 lookups, and 16
 * vpdpwssd for 2 heads, where the float path widens 128 values to floats
 * (16 instructions) and issues 8 FMAs per position and head. The weights'
 * rounding is relative to the span's largest weight (2^-16 of it), far
 * below the cached values' own error; with values up to 1023, lane sums
 * stay below 2^31 (1023 · 32767 · P16_SPAN).
 *
 *   lanes of one group's two accumulators, j = the value within the group:
 *   lo: j = 0-3, 8-11, 16-19, 24-27     hi: j = 4-7, 12-15, 20-23, 28-31
 */
#ifndef KV_PAIRS16_H
#define KV_PAIRS16_H

#if defined(__x86_64__) /* x86 kernels: the includer's x86 region uses them, other CPUs never */

#include "kernels/quant32.h"
#include "kv/kv.h"

#include <float.h>
#include <immintrin.h>
#include <math.h>
#include <string.h>

#define PAIRS16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c"), always_inline)) static inline

#define P16_SPAN 64 /* positions per integer span (even) */
#define P16_FAR 512 /* positions ahead that rows are fetched into L2 */

/* a += x · w in word pairs (vpdpwssd), in place. GCC 12 compiles the
 * intrinsic in a loop as a copy of each accumulator, the product into the
 * copy and a copy back (two register moves per product, and spills once
 * the copies outgrow the registers); the asm names the accumulator as both
 * input and output, so it stays where it is. */
PAIRS16 __m512i p16_dpwssd(__m512i a, __m512i x, __m512i w) {
    __asm__("vpdpwssd %2, %1, %0" : "+v"(a) : "v"(x), "v"(w));
    return a;
}

/* x[g][0] and x[g][1]: group g's lo and hi lanes (below) of positions t, u. */
typedef void (*Dec16)(const KVStream *s, int t, int u, __m512i x[4][2]);
/* Group g's scales at positions t..t+15 as floats, lanes outside mask k 0. */
typedef __m512 (*Scale16)(const KVStream *s, int t, int g, __mmask16 k);

/* A group's lo/hi lanes back in order: values 0-15 to v0, 16-31 to v1. */
PAIRS16 void p16_unpack(__m512 lo, __m512 hi, __m512 *v0, __m512 *v1) {
    const __m512i i0 = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23),
                  i1 = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
    *v0 = _mm512_permutex2var_ps(lo, i0, hi);
    *v1 = _mm512_permutex2var_ps(lo, i1, hi);
}

/* One head's float weights wf[g][0..np) (np rounded up to 16) rounded to
 * int16 at 32767 / max|w| into wq: 0 with *inv = max|w| / 32767 (all 0
 * when max|w| is 0 or so small that 32767 / max|w| overflows: such
 * weights add nothing a float could hold), or -1 when a weight is not
 * finite. */
PAIRS16 int p16_round(const float (*wf)[P16_SPAN], int ng, int np, int16_t (*wq)[P16_SPAN], float *inv) {
    __m512 m = _mm512_setzero_ps();
    __mmask16 bad = 0;
    for (int g = 0; g < ng; g++)
        for (int t = 0; t < np; t += 16) {
            const __m512 w = _mm512_load_ps(wf[g] + t);
            bad |= _mm512_fpclass_ps_mask(w, 0x99); /* NaN, ±inf */
            m = _mm512_max_ps(m, _mm512_abs_ps(w));
        }
    if (bad) return -1;
    const float mx = _mm512_reduce_max_ps(m);
    const __m512 sc = _mm512_set1_ps(mx > 32767.0f / FLT_MAX ? 32767.0f / mx : 0);
    *inv = mx > 0 ? mx / 32767.0f : 0;
    for (int g = 0; g < ng; g++)
        for (int t = 0; t < np; t += 16)
            _mm256_store_si256((__m256i *)(wq[g] + t),
                               _mm512_cvtsepi32_epi16(_mm512_cvtps_epi32(_mm512_mul_ps(_mm512_load_ps(wf[g] + t), sc))));
    return 0;
}

/* p16_round on AVX2 (q8's and tbq4/polar4's integer sums there, kv/q8.c
 * and kv/lowbit.c): the same weights, 8 lanes at a time; wf's entries
 * from np up to the next multiple of 16 are read and must be finite. */
__attribute__((target("avx2"), always_inline)) static inline int
p16_round_avx2(const float (*wf)[P16_SPAN], int ng, int np, int16_t (*wq)[P16_SPAN], float *inv) {
    float mx = 0;
    for (int g = 0; g < ng; g++) {
        float m;
        if (absmax_avx2(wf[g], (np + 7) & ~7, &m)) return -1;
        mx = fmaxf(mx, m);
    }
    const __m256 sc = _mm256_set1_ps(mx > 32767.0f / FLT_MAX ? 32767.0f / mx : 0);
    *inv = mx > 0 ? mx / 32767.0f : 0;
    for (int g = 0; g < ng; g++)
        for (int t = 0; t < np; t += 16) {
            const __m256i a = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(wf[g] + t), sc)),
                          b = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(wf[g] + t + 8), sc));
            /* packs works per 128-bit lane: qwords come out 0 2 1 3 */
            _mm256_storeu_si256((__m256i *)(wq[g] + t), _mm256_permute4x64_epi64(_mm256_packs_epi32(a, b), 0xd8));
        }
    return 0;
}

/* One span [t0, t0 + n), n <= P16_SPAN, for NH <= 2 heads, with the
 * span's group scales sf (S's, taken once for all heads). Returns -1
 * (nothing added) when a weight is not finite: the caller takes the float
 * path. out(i, g, v0, v1) receives group g's 32 sums of head i. */
PAIRS16 int p16_span(const KVStream *s, Dec16 D, const float (*sf)[P16_SPAN], const int G1, size_t rb, const float *p,
                     int ldp, const int NH, int t0, int n, __m512 (*out)[4][2]) {
    /* per head the weights as floats and as int16 at one scale; a zero
     * weight pads an odd span */
    const int np = (n + 1) & ~1, ng = G1 ? 1 : 4;
    float wf[4][P16_SPAN] __attribute__((aligned(64)));
    int16_t wq[2][4][P16_SPAN] __attribute__((aligned(64)));
    float inv[2];
    for (int i = 0; i < NH; i++) {
        for (int g = 0; g < ng; g++)
            for (int t = 0; t < np; t += 16) {
                const __mmask16 k = n - t >= 16 ? 0xffff : (__mmask16)((1u << (n - t)) - 1);
                _mm512_store_ps(wf[g] + t, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, p + (size_t)i * ldp + t), _mm512_load_ps(sf[g] + t)));
            }
        if (p16_round((const float (*)[P16_SPAN])wf, ng, np, wq[i], &inv[i])) return -1;
    }
    __m512i a[2][4][2];
    for (int i = 0; i < NH; i++)
        for (int g = 0; g < 4; g++) a[i][g][0] = a[i][g][1] = _mm512_setzero_si512();
    for (int t = 0; t < np; t += 2) {
        /* the next span's two rows, which its scales pass reads first,
         * into L1, and the two P16_FAR on from DRAM into L2 */
        const char *ahead = (const char *)s->data + (size_t)(t0 + P16_SPAN + t) * rb;
        for (size_t b = 0; b < 2 * rb; b += 64) _mm_prefetch(ahead + b, _MM_HINT_T0);
        for (size_t b = 0; b < 2 * rb; b += 64) _mm_prefetch(ahead + (P16_FAR - P16_SPAN) * rb + b, _MM_HINT_T1);
        __m512i x[4][2];
        D(s, t0 + t, t0 + (t + 1 < n ? t + 1 : t), x);
        for (int g = 0; g < 4; g++) {
            const __m512i lo = x[g][0], hi = x[g][1];
            for (int i = 0; i < NH; i++) {
                int32_t pair;
                memcpy(&pair, &wq[i][G1 ? 0 : g][t], 4);
                const __m512i w = _mm512_set1_epi32(pair);
                a[i][g][0] = p16_dpwssd(a[i][g][0], lo, w);
                a[i][g][1] = p16_dpwssd(a[i][g][1], hi, w);
            }
        }
    }
    for (int i = 0; i < NH; i++) {
        const __m512 iv = _mm512_set1_ps(inv[i]);
        for (int g = 0; g < 4; g++)
            p16_unpack(_mm512_mul_ps(_mm512_cvtepi32_ps(a[i][g][0]), iv), _mm512_mul_ps(_mm512_cvtepi32_ps(a[i][g][1]), iv),
                       &out[i][g][0], &out[i][g][1]);
    }
    return 0;
}

/* Whole range [t0, t1) for nq <= 8 heads, span by span, two heads at a
 * time: sum[i][g][h] gets values 16h..16h+15 of head i's group g. Returns
 * -1 when a weight is not finite (sum is then incomplete: the caller adds
 * nothing and takes the float path). */
PAIRS16 int p16_accum(const KVStream *s, Dec16 D, Scale16 S, const int G1, size_t rb, const float *p, int ldp, int nq,
                      int t0, int t1, __m512 (*sum)[4][2]) {
    if (nq > 8) return -1;
    for (int i = 0; i < nq; i++)
        for (int g = 0; g < 4; g++) sum[i][g][0] = sum[i][g][1] = _mm512_setzero_ps();
    for (int ta = t0; ta < t1; ta += P16_SPAN) {
        const int n = t1 - ta < P16_SPAN ? t1 - ta : P16_SPAN, ng = G1 ? 1 : 4;
        /* the group scales once per span, for every pair of heads */
        float sf[4][P16_SPAN] __attribute__((aligned(64)));
        for (int t = 0; t < n; t += 16) {
            const __mmask16 k = n - t >= 16 ? 0xffff : (__mmask16)((1u << (n - t)) - 1);
            for (int g = 0; g < ng; g++) _mm512_store_ps(sf[g] + t, S(s, ta + t, g, k));
        }
        for (int i0 = 0; i0 < nq; i0 += 2) {
            __m512 v[2][4][2];
            const float *pi = p + (size_t)i0 * ldp + (ta - t0);
            const int two = nq - i0 >= 2;
            const float (*sc)[P16_SPAN] = (const float (*)[P16_SPAN])sf;
            if (two ? p16_span(s, D, sc, G1, rb, pi, ldp, 2, ta, n, v) : p16_span(s, D, sc, G1, rb, pi, ldp, 1, ta, n, v))
                return -1;
            for (int i = 0; i < 1 + two; i++)
                for (int g = 0; g < 4; g++)
                    for (int h = 0; h < 2; h++) sum[i0 + i][g][h] = _mm512_add_ps(sum[i0 + i][g][h], v[i][g][h]);
        }
    }
    return 0;
}

#endif /* __x86_64__ */

#endif
