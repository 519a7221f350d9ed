/* vec.c: dot / axpy over f32 and f16 vectors (see vec.h), and f32 -> f16
 * narrowing.
 *
 * Data flow: kernels/, the bottom layer (run.c -> model -> attn -> kv ->
 * kernels): the kv/ schemes that keep floats or halves (f32, KIVI's float
 * window, and f16 where the CPU or the head dim rules out its AVX-512 and
 * AVX2 tiles) call these once per cached vector and query head, x [d]
 * against q [d], d = head_dim; f16 narrows each appended vector with
 * vec_f32_to_f16.
 *
 * The AVX2 versions (8 lanes, F16C for halves) serve both AVX2 and AVX-512
 * machines: vectors here are one head long, too short for 16 lanes to pay
 * for their tails. f16 follows IEEE 754 binary16, narrowing rounds to
 * nearest even as kernels/half.h does; each _ref is the plain C the tests
 * hold the dispatched version to. aarch64 has NEON versions of the same
 * shape; other CPUs run the _ref versions. */
#include "kernels/vec.h"
#include "kernels/half.h"
#include "kernels/matmul.h"

float vec_dot_f32_ref(const float *a, const float *b, int n) {
    float s = 0;
    for (int i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

float vec_dot_f16_ref(const uint16_t *a, const float *b, int n) {
    float s = 0;
    for (int i = 0; i < n; i++) s += f16_to_f32(a[i]) * b[i];
    return s;
}

void vec_axpy_f32_ref(float *y, float a, const float *x, int n) {
    for (int i = 0; i < n; i++) y[i] += a * x[i];
}

void vec_axpy_f16_ref(float *y, float a, const uint16_t *x, int n) {
    for (int i = 0; i < n; i++) y[i] += a * f16_to_f32(x[i]);
}

void vec_f32_to_f16_ref(uint16_t *out, const float *x, int n) {
    for (int i = 0; i < n; i++) out[i] = f32_to_f16(x[i]);
}

#if defined(__x86_64__)
#include <immintrin.h>

#define AVX2 __attribute__((target("avx2,fma,f16c")))

AVX2 static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Two accumulators hide FMA latency; tails run scalar. */
AVX2 static float dot_f32_simd(const float *a, const float *b, int n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
    }
    for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    float s = hsum(_mm256_add_ps(s0, s1));
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

AVX2 static float dot_f16_simd(const uint16_t *a, const float *b, int n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(a + i))), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(a + i + 8))),
                             _mm256_loadu_ps(b + i + 8), s1);
    }
    for (; i + 8 <= n; i += 8)
        s0 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(a + i))), _mm256_loadu_ps(b + i), s0);
    float s = hsum(_mm256_add_ps(s0, s1));
    for (; i < n; i++) s += f16_to_f32(a[i]) * b[i];
    return s;
}

AVX2 static void axpy_f32_simd(float *y, float a, const float *x, int n) {
    __m256 av = _mm256_set1_ps(a);
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += a * x[i];
}

AVX2 static void axpy_f16_simd(float *y, float a, const uint16_t *x, int n) {
    __m256 av = _mm256_set1_ps(a);
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i))),
                                                _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += a * f16_to_f32(x[i]);
}

/* Round-to-nearest-even (imm 0), the same rounding as f32_to_f16. */
AVX2 static void f32_to_f16_simd(uint16_t *out, const float *x, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(out + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) out[i] = f32_to_f16(x[i]);
}

#elif defined(__aarch64__)
#include <arm_neon.h>

/* NEON: the AVX2 versions' shape in 4-lane registers (two accumulators
 * over 8 values a step, one more 4-value step, the tail in plain C); f16
 * widens with fcvtl and narrows with fcvtn, which rounds to nearest even
 * (FPCR's default mode). */
static inline float32x4_t ld4h(const uint16_t *p) { return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p))); }

static float dot_f32_simd(const float *a, const float *b, int n) {
    float32x4_t s0 = vdupq_n_f32(0), s1 = vdupq_n_f32(0);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        s0 = vfmaq_f32(s0, vld1q_f32(a + i), vld1q_f32(b + i));
        s1 = vfmaq_f32(s1, vld1q_f32(a + i + 4), vld1q_f32(b + i + 4));
    }
    for (; i + 4 <= n; i += 4) s0 = vfmaq_f32(s0, vld1q_f32(a + i), vld1q_f32(b + i));
    float s = vaddvq_f32(vaddq_f32(s0, s1));
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

static float dot_f16_simd(const uint16_t *a, const float *b, int n) {
    float32x4_t s0 = vdupq_n_f32(0), s1 = vdupq_n_f32(0);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        s0 = vfmaq_f32(s0, ld4h(a + i), vld1q_f32(b + i));
        s1 = vfmaq_f32(s1, ld4h(a + i + 4), vld1q_f32(b + i + 4));
    }
    for (; i + 4 <= n; i += 4) s0 = vfmaq_f32(s0, ld4h(a + i), vld1q_f32(b + i));
    float s = vaddvq_f32(vaddq_f32(s0, s1));
    for (; i < n; i++) s += f16_to_f32(a[i]) * b[i];
    return s;
}

static void axpy_f32_simd(float *y, float a, const float *x, int n) {
    int i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(y + i, vfmaq_n_f32(vld1q_f32(y + i), vld1q_f32(x + i), a));
    for (; i < n; i++) y[i] += a * x[i];
}

static void axpy_f16_simd(float *y, float a, const uint16_t *x, int n) {
    int i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(y + i, vfmaq_n_f32(vld1q_f32(y + i), ld4h(x + i), a));
    for (; i < n; i++) y[i] += a * f16_to_f32(x[i]);
}

static void f32_to_f16_simd(uint16_t *out, const float *x, int n) {
    int i = 0;
    for (; i + 4 <= n; i += 4) vst1_u16(out + i, vreinterpret_u16_f16(vcvt_f16_f32(vld1q_f32(x + i))));
    for (; i < n; i++) out[i] = f32_to_f16(x[i]);
}

#endif

#if defined(__x86_64__) || defined(__aarch64__)
/* The SIMD versions above (AVX2 or NEON) at any level but ref. */
static int fast(void) { return kernels_level() > 0; }

float vec_dot_f32(const float *a, const float *b, int n) {
    return fast() ? dot_f32_simd(a, b, n) : vec_dot_f32_ref(a, b, n);
}
float vec_dot_f16(const uint16_t *a, const float *b, int n) {
    return fast() ? dot_f16_simd(a, b, n) : vec_dot_f16_ref(a, b, n);
}
void vec_axpy_f32(float *y, float a, const float *x, int n) {
    if (fast()) axpy_f32_simd(y, a, x, n);
    else vec_axpy_f32_ref(y, a, x, n);
}
void vec_axpy_f16(float *y, float a, const uint16_t *x, int n) {
    if (fast()) axpy_f16_simd(y, a, x, n);
    else vec_axpy_f16_ref(y, a, x, n);
}
void vec_f32_to_f16(uint16_t *out, const float *x, int n) {
    if (fast()) f32_to_f16_simd(out, x, n);
    else vec_f32_to_f16_ref(out, x, n);
}
#else
float vec_dot_f32(const float *a, const float *b, int n) { return vec_dot_f32_ref(a, b, n); }
float vec_dot_f16(const uint16_t *a, const float *b, int n) { return vec_dot_f16_ref(a, b, n); }
void vec_axpy_f32(float *y, float a, const float *x, int n) { vec_axpy_f32_ref(y, a, x, n); }
void vec_axpy_f16(float *y, float a, const uint16_t *x, int n) { vec_axpy_f16_ref(y, a, x, n); }
void vec_f32_to_f16(uint16_t *out, const float *x, int n) { vec_f32_to_f16_ref(out, x, n); }
#endif
