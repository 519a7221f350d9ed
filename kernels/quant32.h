/* quant32.h: q8_0 rounding of 32 floats for integer dot products, shared
 * by the drafter's DT_Q8I matmul (activations) and q8's KV scores
 * (queries): one definition, so both round alike. With AVX2 also the
 * helpers of kv/'s integer scores: the max-abs check, int32 lane sums and
 * the byte orders that vpshufb-decoded 4- and 2-bit codes come in.
 *
 *   d = max|x| / 127 (returned), q[j] = x[j] · (1 / d) rounded to nearest
 *   even (all 0 when 1 / d is not finite: d = 0, or d so small that
 *   1 / d overflows), *bias = -128 Σ q
 *
 * Nearest even, not ggml's half away from zero: lrintf and vcvtps2dq are
 * one instruction each, where roundf is a libm call.
 *
 * The bias is what a u8 operand carrying +128 (vpdpbusd multiplies u8 by
 * s8) adds to the integer dot, so an accumulator started at it cancels it.
 * quantize32_512 gives the same numbers as quantize32_ref for finite x:
 * the max and the sum are exact in any order, the scale is the same
 * scalar arithmetic, and vcvtps2dq rounds as lrintf does by default;
 * quantize32_avx2 likewise (x86-64 only; elsewhere quantize32_ref is the
 * one version).
 */
#ifndef KERNELS_QUANT32_H
#define KERNELS_QUANT32_H

#include <float.h>
#include <math.h>
#include <stdint.h>

static inline float quantize32_ref(const float *x, int8_t *q, int32_t *bias) {
    float amax = 0;
    for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[j]));
    const float d = amax / 127.0f, id = d > 1.0f / FLT_MAX ? 1.0f / d : 0.0f;
    int32_t sum = 0;
    for (int j = 0; j < 32; j++) sum += q[j] = (int8_t)lrintf(x[j] * id);
    *bias = -128 * sum;
    return d;
}

#if defined(__x86_64__)
#include <immintrin.h>

__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq"), always_inline)) static inline float
quantize32_512(const float *x, int8_t *q, int32_t *bias) {
    const __m512 lo = _mm512_loadu_ps(x), hi = _mm512_loadu_ps(x + 16);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(lo), _mm512_abs_ps(hi)));
    const float d = amax / 127.0f, id = d > 1.0f / FLT_MAX ? 1.0f / d : 0.0f;
    const __m512 vid = _mm512_set1_ps(id);
    const __m512i ql = _mm512_cvtps_epi32(_mm512_mul_ps(lo, vid)), qh = _mm512_cvtps_epi32(_mm512_mul_ps(hi, vid));
    _mm_storeu_si128((__m128i *)q, _mm512_cvtepi32_epi8(ql));
    _mm_storeu_si128((__m128i *)(q + 16), _mm512_cvtepi32_epi8(qh));
    /* unsigned: a NaN activation (garbage either way) must not overflow */
    *bias = (int32_t)(0u - 128u * (uint32_t)_mm512_reduce_add_epi32(_mm512_add_epi32(ql, qh)));
    return d;
}
/* max|x[0..n)| (n a multiple of 8) into *mx: 0, or -1 when a value is
 * NaN or ±inf (they compare unordered or above FLT_MAX). The max is exact,
 * so it is the scalar loop's in any order. */
__attribute__((target("avx2"), always_inline)) static inline int absmax_avx2(const float *x, int n, float *mx) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 m = _mm256_setzero_ps(), bad = _mm256_setzero_ps();
    for (int j = 0; j < n; j += 8) {
        const __m256 a = _mm256_andnot_ps(sign, _mm256_loadu_ps(x + j));
        bad = _mm256_or_ps(bad, _mm256_cmp_ps(a, _mm256_set1_ps(FLT_MAX), _CMP_NLE_UQ));
        m = _mm256_max_ps(m, a);
    }
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    *mx = _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
    return _mm256_movemask_ps(bad) ? -1 : 0;
}

/* The sum of 8 int32 lanes. */
__attribute__((target("avx2"), always_inline)) static inline int32_t hsum_i32_avx2(__m256i v) {
    const __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    const __m128i s2 = _mm_add_epi32(s4, _mm_unpackhi_epi64(s4, s4));
    return _mm_cvtsi128_si32(_mm_add_epi32(s2, _mm_shuffle_epi32(s2, 1)));
}

/* [sum(a), sum(b), sum(c), sum(d)] of 8 int32 lanes each. */
__attribute__((target("avx2"), always_inline)) static inline __m128i hsum4_i32_avx2(__m256i a, __m256i b, __m256i c,
                                                                                   __m256i d) {
    const __m256i ab = _mm256_add_epi32(_mm256_unpacklo_epi32(a, b), _mm256_unpackhi_epi32(a, b));
    const __m256i cd = _mm256_add_epi32(_mm256_unpacklo_epi32(c, d), _mm256_unpackhi_epi32(c, d));
    const __m256i s = _mm256_add_epi32(_mm256_unpacklo_epi64(ab, cd), _mm256_unpackhi_epi64(ab, cd));
    return _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
}

/* Bytes of 64 values v[0], v[1] (32 each, in order) as vpshufb-decoded
 * 4-bit codes give them, low and high nibble of byte b holding values 2b
 * and 2b + 1: v[0] = the 32 even values, v[1] = the 32 odd ones. */
__attribute__((target("avx2"), always_inline)) static inline void split2_avx2(__m256i v[2]) {
    /* per 128-bit lane even bytes to its low half, odd to its high half,
     * then the lanes' halves in order: 16 even values, 16 odd */
    const __m256i split = _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15, 0, 2, 4, 6, 8, 10, 12,
                                           14, 1, 3, 5, 7, 9, 11, 13, 15);
    const __m256i w0 = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(v[0], split), 0xd8), /* 0 2 1 3 */
        w1 = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(v[1], split), 0xd8);
    v[0] = _mm256_permute2x128_si256(w0, w1, 0x20);
    v[1] = _mm256_permute2x128_si256(w0, w1, 0x31);
}

/* Bytes of 128 values v[0..3] (32 each, in order) as 2-bit codes give
 * them, bits 2k..2k+1 of byte b holding value 4b + k: v[k] = values 4b + k,
 * b = 0..31. */
__attribute__((target("avx2"), always_inline)) static inline void split4_avx2(__m256i v[4]) {
    /* per lane bytes 4b' + k to dword k; then dword k of both lanes to
     * qword k; then the four registers' qwords k make v[k] */
    const __m256i split = _mm256_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15, 0, 4, 8, 12, 1, 5, 9,
                                           13, 2, 6, 10, 14, 3, 7, 11, 15);
    const __m256i pair = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int k = 0; k < 4; k++) v[k] = _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(v[k], split), pair);
    const __m256i l01 = _mm256_unpacklo_epi64(v[0], v[1]), h01 = _mm256_unpackhi_epi64(v[0], v[1]),
                  l23 = _mm256_unpacklo_epi64(v[2], v[3]), h23 = _mm256_unpackhi_epi64(v[2], v[3]);
    v[0] = _mm256_permute2x128_si256(l01, l23, 0x20);
    v[1] = _mm256_permute2x128_si256(h01, h23, 0x20);
    v[2] = _mm256_permute2x128_si256(l01, l23, 0x31);
    v[3] = _mm256_permute2x128_si256(h01, h23, 0x31);
}

/* x[0..31] · s rounded to nearest even, as bytes in order (the caller
 * keeps |x · s| <= 127), and their sum added to *sum's lanes: what the
 * AVX2 integer scores (kv/) make of their queries. */
__attribute__((target("avx2"), always_inline)) static inline __m256i round32_avx2(const float *x, __m256 s, __m256i *sum) {
    __m256i v[4];
    for (int k = 0; k < 4; k++) v[k] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 8 * k), s));
    *sum = _mm256_add_epi32(*sum, _mm256_add_epi32(_mm256_add_epi32(v[0], v[1]), _mm256_add_epi32(v[2], v[3])));
    /* the packs work per 128-bit lane: dwords come out in the order 0 4 1 5 2 6 3 7 */
    const __m256i b = _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3]));
    return _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* quantize32_ref with 8 lanes: the same numbers for finite x. */
__attribute__((target("avx2"), always_inline)) static inline float quantize32_avx2(const float *x, int8_t *q,
                                                                                 int32_t *bias) {
    float amax;
    absmax_avx2(x, 32, &amax);
    const float d = amax / 127.0f, id = d > 1.0f / FLT_MAX ? 1.0f / d : 0.0f;
    __m256i sum = _mm256_setzero_si256();
    _mm256_storeu_si256((__m256i *)q, round32_avx2(x, _mm256_set1_ps(id), &sum));
    *bias = -128 * hsum_i32_avx2(sum);
    return d;
}
#endif /* __x86_64__ */

#endif
