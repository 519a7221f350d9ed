/* hsum.h: horizontal sums of AVX-512 and AVX vectors, four at a time.
 *
 * Used where many dot products end at once (matmul tiles, attention score
 * tiles): one shuffle tree for four vectors costs about what one
 * _mm512_reduce_add_ps costs for a single vector. Each output's tree only
 * involves its own vector's lanes, in a fixed order, so a sum does not
 * depend on which vectors sit beside it (zeros included). x86-64 only:
 * elsewhere this header is empty.
 */
#ifndef KERNELS_HSUM_H
#define KERNELS_HSUM_H

#if defined(__x86_64__)
#include <immintrin.h>

/* [sum(a), sum(b), sum(c), sum(d)] */
__attribute__((target("avx512f,avx512dq"), always_inline)) static inline __m128 hsum4_512(__m512 a, __m512 b,
                                                                                        __m512 c, __m512 d) {
    __m512 ab = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
    __m512 cd = _mm512_add_ps(_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d));
    __m512d abd = _mm512_castps_pd(ab), cdd = _mm512_castps_pd(cd);
    __m512 s = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(abd, cdd)),
                             _mm512_castpd_ps(_mm512_unpackhi_pd(abd, cdd)));
    __m256 h = _mm256_add_ps(_mm512_castps512_ps256(s), _mm512_extractf32x8_ps(s, 1));
    return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

/* The same tree over 32-bit integer lanes: [sum(a), sum(b), sum(c), sum(d)]
 * (integer sums are exact, so any order gives them). */
__attribute__((target("avx512f,avx512dq"), always_inline)) static inline __m128i hsum4_512i(__m512i a, __m512i b,
                                                                                          __m512i c, __m512i d) {
    __m512i ab = _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
    __m512i cd = _mm512_add_epi32(_mm512_unpacklo_epi32(c, d), _mm512_unpackhi_epi32(c, d));
    __m512i s = _mm512_add_epi32(_mm512_unpacklo_epi64(ab, cd), _mm512_unpackhi_epi64(ab, cd));
    __m256i h = _mm256_add_epi32(_mm512_castsi512_si256(s), _mm512_extracti32x8_epi32(s, 1));
    return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}
/* The same tree for 8-lane vectors (AVX): [sum(a), sum(b), sum(c), sum(d)]. */
__attribute__((target("avx"), always_inline)) static inline __m128 hsum4_256(__m256 a, __m256 b, __m256 c, __m256 d) {
    __m256 ab = _mm256_add_ps(_mm256_unpacklo_ps(a, b), _mm256_unpackhi_ps(a, b));
    __m256 cd = _mm256_add_ps(_mm256_unpacklo_ps(c, d), _mm256_unpackhi_ps(c, d));
    __m256d abd = _mm256_castps_pd(ab), cdd = _mm256_castps_pd(cd);
    __m256 s = _mm256_add_ps(_mm256_castpd_ps(_mm256_unpacklo_pd(abd, cdd)),
                             _mm256_castpd_ps(_mm256_unpackhi_pd(abd, cdd)));
    return _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
}
#endif /* __x86_64__ */

#endif
