/* quant32.h: q8_0 rounding of 32 floats for integer dot products, shared
 * by the drafter's DT_Q8I matmul (activations) and q8's KV scores
 * (queries): one definition, so both round alike.
 *
 *   d = max|x| / 127 (returned), q[j] = x[j] · (1 / d) rounded to nearest
 *   even (all 0 when d = 0), *bias = -128 Σ q
 *
 * Nearest even, not ggml's half away from zero: lrintf and vcvtps2dq are
 * one instruction each, where roundf is a libm call.
 *
 * The bias is what a u8 operand carrying +128 (vpdpbusd multiplies u8 by
 * s8) adds to the integer dot, so an accumulator started at it cancels it.
 * quantize32_512 gives the same numbers as quantize32_ref for finite x:
 * the max and the sum are exact in any order, the scale is the same
 * scalar arithmetic, and vcvtps2dq rounds as lrintf does by default
 * (x86-64 only; elsewhere quantize32_ref is the one version).
 */
#ifndef KERNELS_QUANT32_H
#define KERNELS_QUANT32_H

#include <math.h>
#include <stdint.h>

static inline float quantize32_ref(const float *x, int8_t *q, int32_t *bias) {
    float amax = 0;
    for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[j]));
    const float d = amax / 127.0f, id = d > 0 ? 1.0f / d : 0.0f;
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
    const float d = amax / 127.0f, id = d > 0 ? 1.0f / d : 0.0f;
    const __m512 vid = _mm512_set1_ps(id);
    const __m512i ql = _mm512_cvtps_epi32(_mm512_mul_ps(lo, vid)), qh = _mm512_cvtps_epi32(_mm512_mul_ps(hi, vid));
    _mm_storeu_si128((__m128i *)q, _mm512_cvtepi32_epi8(ql));
    _mm_storeu_si128((__m128i *)(q + 16), _mm512_cvtepi32_epi8(qh));
    /* unsigned: a NaN activation (garbage either way) must not overflow */
    *bias = (int32_t)(0u - 128u * (uint32_t)_mm512_reduce_add_epi32(_mm512_add_epi32(ql, qh)));
    return d;
}
#endif /* __x86_64__ */

#endif
