/* ops.c: the element-wise and per-row operations of a Qwen3 layer (see
 * ops.h): RMSNorm, RoPE, SwiGLU, the pieces of attention's softmax, argmax.
 *
 * Data flow: kernels/, the bottom layer (run.c -> model -> attn -> kv ->
 * kernels): model/ calls rmsnorm, rope and swiglu between its matmuls and
 * find_nonfinite on its outputs, attn/ calls max_from and exp_sub_sum per
 * chunk of scores, sample/ (for speculative/ too) and eval/ call argmax on
 * logits [V]. Everything works on f32 rows, in place where ops.h says so.
 *
 * Sums run in double where a long reduction feeds a normalisation
 * (RMSNorm over 1024..5120 values), so the result does not drift with the
 * length of the row.
 *
 * exp on AVX-512 (exp16): e^x = 2^k e^r with k = round(x log2 e) and
 * r = x - k ln 2 in two parts (Cody-Waite: ln 2 = C1 + C2, C1 exact in a
 * few bits, so k C1 is exact); e^r on |r| <= ln2/2 by Cephes expf's degree-7
 * polynomial; 2^k applied with vscalefps, which also gives inf at the top.
 * Within 2 ulp of libm's expf on [-87.33, 88], NaN, inf and 0 where libm
 * gives them, and 0 where libm's result would be subnormal (tested).
 * AVX2 (exp8) and aarch64 (exp4, 4 NEON lanes) run the same steps, with
 * 2^k applied as two exact power-of-two products, so all three give the
 * same bits; other CPUs run the plain C versions (the _ref functions).
 */
#include "kernels/ops.h"
#include "kernels/matmul.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

void rmsnorm(float *y, const float *x, const float *w, int n, float eps) {
    /* eight independent chains of partial sums: one serial chain of double
     * adds waits out every add's latency (docs/kernel-notes.md#rmsnorm-chains) */
    double part[8] = {0}, ss = 0;
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) part[k] += (double)x[i + k] * x[i + k];
    for (; i < n; i++) ss += (double)x[i] * x[i];
    for (int k = 0; k < 8; k++) ss += part[k];
    float inv = (float)(1.0 / sqrt(ss / n + eps));
    for (int i = 0; i < n; i++) y[i] = w[i] * (x[i] * inv);
}

void rope(float *x, const float *cs, const float *sn, int d) {
    int h = d / 2;
    for (int i = 0; i < h; i++) {
        float a = x[i], b = x[i + h];
        x[i] = a * cs[i] - b * sn[i];
        x[i + h] = b * cs[i] + a * sn[i];
    }
}

void swiglu_ref(float *a, const float *b, int n) {
    for (int i = 0; i < n; i++) a[i] = a[i] / (1.0f + expf(-a[i])) * b[i];
}

void silu_ref(float *a, int n) {
    for (int i = 0; i < n; i++) a[i] = a[i] / (1.0f + expf(-a[i]));
}

float max_from_ref(const float *x, int n, float m) {
    for (int i = 0; i < n; i++) m = x[i] > m ? x[i] : m;
    return m;
}

long find_nonfinite(const float *x, long n) {
    /* the exponent field all ones is NaN or Inf; an OR over a block keeps
     * the common all-finite case one vectorised pass */
    const long B = 1024;
    for (long i0 = 0; i0 < n; i0 += B) {
        const long e = n - i0 < B ? n - i0 : B;
        uint32_t any = 0;
        for (long i = 0; i < e; i++) {
            uint32_t u;
            memcpy(&u, x + i0 + i, 4);
            any |= (uint32_t)((u & 0x7F800000u) == 0x7F800000u);
        }
        if (!any) continue;
        for (long i = 0; i < e; i++)
            if (!isfinite(x[i0 + i])) return i0 + i;
    }
    return -1;
}

int argmax_ref(const float *x, int n) {
    int best = -1;
    for (int i = 0; i < n; i++)
        if (x[i] == x[i] && (best < 0 || x[i] > x[best])) best = i;
    return best < 0 ? 0 : best;
}

float exp_sub_sum_ref(float *x, int n, float m) {
    float sum = 0;
    for (int i = 0; i < n; i++) sum += (x[i] = expf(x[i] - m));
    return sum;
}

#if defined(__x86_64__)
#include <immintrin.h>

/* ---- AVX2: exp16's steps on 8 lanes --------------------------------------- */
#define AVX2 __attribute__((target("avx2,fma"))) static inline

/* exp16's steps (below); NaN stays NaN (min/max return their second
 * operand, x, for one), and 2^k is applied as two exact products
 * 2^(k - k/2) 2^(k/2) (k is in [-150, 128], each half a normal scale),
 * which rounds once, as vscalefps does; below -87.33 the result is 0, as
 * there. */
AVX2 __m256 exp8(__m256 x) {
    x = _mm256_max_ps(_mm256_set1_ps(-104.0f), _mm256_min_ps(_mm256_set1_ps(89.0f), x));
    const __m256 k = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(k, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    const __m256i ki = _mm256_cvtps_epi32(k), k1 = _mm256_srai_epi32(ki, 1), k2 = _mm256_sub_epi32(ki, k1);
    const __m256i bias = _mm256_set1_epi32(127);
    const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(k1, bias), 23)),
                 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(k2, bias), 23));
    p = _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
    return _mm256_andnot_ps(_mm256_cmp_ps(x, _mm256_set1_ps(-87.33f), _CMP_LT_OQ), p);
}

AVX2 int exp8_run(float *y, const float *x, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, exp8(_mm256_loadu_ps(x + i)));
    return i;
}

AVX2 void swiglu8(float *a, const float *b, int n) {
    const __m256 one = _mm256_set1_ps(1.0f);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 g = _mm256_loadu_ps(a + i), e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), g));
        _mm256_storeu_ps(a + i, _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(one, e)), _mm256_loadu_ps(b + i)));
    }
    swiglu_ref(a + i, b + i, n - i);
}

AVX2 void silu8(float *a, int n) {
    const __m256 one = _mm256_set1_ps(1.0f);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 g = _mm256_loadu_ps(a + i), e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), g));
        _mm256_storeu_ps(a + i, _mm256_div_ps(g, _mm256_add_ps(one, e)));
    }
    silu_ref(a + i, n - i);
}

/* max_from16 on 8 lanes: x first, so a NaN in x leaves acc and a NaN
 * start stays, as in the loop */
AVX2 float max_from8(const float *x, int n, float m) {
    __m256 acc = _mm256_set1_ps(m);
    int i = 0;
    for (; i + 8 <= n; i += 8) acc = _mm256_max_ps(_mm256_loadu_ps(x + i), acc);
    float v[8];
    _mm256_storeu_ps(v, acc);
    return max_from_ref(x + i, n - i, max_from_ref(v + 1, 7, v[0]));
}

AVX2 int argmax8(const float *x, int n) {
    const float m = max_from8(x, n, -INFINITY);
    const __m256 mv = _mm256_set1_ps(m);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        const int eq = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), mv, _CMP_EQ_OQ));
        if (eq) return i + __builtin_ctz((unsigned)eq);
    }
    for (; i < n; i++)
        if (x[i] == m) return i;
    return 0;
}

/* 8 lanes of partial sums, reduced in a fixed tree, then the tail. */
AVX2 float exp_sub_sum8(float *x, int n, float m) {
    __m256 acc = _mm256_setzero_ps();
    const __m256 mv = _mm256_set1_ps(m);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), mv));
        _mm256_storeu_ps(x + i, e);
        acc = _mm256_add_ps(acc, e);
    }
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h) + exp_sub_sum_ref(x + i, n - i, m);
}

/* ---- AVX-512 -------------------------------------------------------------- */
#define AVX512 __attribute__((target("avx512f"))) static inline

AVX512 __m512 exp16(__m512 x) {
    /* x second: min/max return their second operand for a NaN, so NaN
     * stays NaN; above 89 the result overflows to inf, below -104 to 0 */
    x = _mm512_max_ps(_mm512_set1_ps(-104.0f), _mm512_min_ps(_mm512_set1_ps(89.0f), x));
    __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(k, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(k, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    /* below -87.33 (e^x under 1.19e-38, near FLT_MIN) the result is 0, not
     * subnormal: every subnormal result, and every FMA that later takes one
     * as input, costs a microcode assist, which slows attention whose scores
     * spread over more than 87 several times over (see attn_block;
     * docs/kernel-notes.md#subnormals) */
    const __mmask16 normal = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.33f), _CMP_NLT_UQ);
    return _mm512_maskz_scalef_ps(normal, p, k);
}

/* The whole 16-lane part of x; returns how many it did. */
AVX512 int exp16_run(float *y, const float *x, int n) {
    int i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, exp16(_mm512_loadu_ps(x + i)));
    return i;
}

void exp16_array(float *y, const float *x, int n) {
    int i = kernels_level() >= 2 ? exp16_run(y, x, n) : kernels_level() == 1 ? exp8_run(y, x, n) : 0;
    for (; i < n; i++) y[i] = expf(x[i]);
}

AVX512 void swiglu16(float *a, const float *b, int n) {
    const __m512 one = _mm512_set1_ps(1.0f);
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 g = _mm512_loadu_ps(a + i);
        __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), g));
        _mm512_storeu_ps(a + i, _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(one, e)), _mm512_loadu_ps(b + i)));
    }
    swiglu_ref(a + i, b + i, n - i);
}

void swiglu(float *a, const float *b, int n) {
    if (kernels_level() >= 2) swiglu16(a, b, n);
    else if (kernels_level() == 1) swiglu8(a, b, n);
    else swiglu_ref(a, b, n);
}

AVX512 void silu16(float *a, int n) {
    const __m512 one = _mm512_set1_ps(1.0f);
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 g = _mm512_loadu_ps(a + i), e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), g));
        _mm512_storeu_ps(a + i, _mm512_div_ps(g, _mm512_add_ps(one, e)));
    }
    silu_ref(a + i, n - i);
}

void silu(float *a, int n) {
    if (kernels_level() >= 2) silu16(a, n);
    else if (kernels_level() == 1) silu8(a, n);
    else silu_ref(a, n);
}

/* 16 running maxima, then the largest of them: the same value as the
 * sequential loop (max is exact; NaNs are skipped by both). */
AVX512 float max_from16(const float *x, int n, float m) {
    __m512 acc = _mm512_set1_ps(m);
    int i = 0;
    for (; i + 16 <= n; i += 16) acc = _mm512_max_ps(_mm512_loadu_ps(x + i), acc);
    return max_from_ref(x + i, n - i, _mm512_reduce_max_ps(acc));
}

float max_from(const float *x, int n, float m) {
    return kernels_level() >= 2   ? max_from16(x, n, m)
           : kernels_level() == 1 ? max_from8(x, n, m)
                                  : max_from_ref(x, n, m);
}

/* The largest value (max_from16), then the first lane equal to it: two
 * passes of 16 lanes in place of the scalar loop's compare-and-branch per
 * entry, which speculative decoding pays several times per cycle
 * (docs/kernel-notes.md#argmax). */
AVX512 int argmax16(const float *x, int n) {
    const float m = max_from16(x, n, -INFINITY);
    const __m512 mv = _mm512_set1_ps(m);
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        const __mmask16 eq = _mm512_cmp_ps_mask(_mm512_loadu_ps(x + i), mv, _CMP_EQ_OQ);
        if (eq) return i + __builtin_ctz(eq);
    }
    for (; i < n; i++)
        if (x[i] == m) return i;
    return 0;
}

int argmax(const float *x, int n) {
    return kernels_level() >= 2 ? argmax16(x, n) : kernels_level() == 1 ? argmax8(x, n) : argmax_ref(x, n);
}

/* 16 lanes of partial sums, reduced in a fixed tree, then the tail. */
AVX512 float exp_sub_sum16(float *x, int n, float m) {
    __m512 acc = _mm512_setzero_ps();
    const __m512 mv = _mm512_set1_ps(m);
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(x + i), mv));
        _mm512_storeu_ps(x + i, e);
        acc = _mm512_add_ps(acc, e);
    }
    return _mm512_reduce_add_ps(acc) + exp_sub_sum_ref(x + i, n - i, m);
}

float exp_sub_sum(float *x, int n, float m) {
    return kernels_level() >= 2   ? exp_sub_sum16(x, n, m)
           : kernels_level() == 1 ? exp_sub_sum8(x, n, m)
                                  : exp_sub_sum_ref(x, n, m);
}
#elif defined(__aarch64__)
#include <arm_neon.h>

/* exp16's steps on 4 lanes. NaN: fmin/fmax return it, so it stays NaN.
 * 2^k is applied as two exact power-of-two products 2^(k - k/2) 2^(k/2)
 * (k is in [-150, 128], each half a normal scale), which rounds once, as
 * vscalefps does; below -87.33 the result is 0, as there. */
static inline float32x4_t exp4(float32x4_t x) {
    x = vmaxq_f32(vdupq_n_f32(-104.0f), vminq_f32(vdupq_n_f32(89.0f), x));
    const float32x4_t k = vrndnq_f32(vmulq_n_f32(x, 1.44269504088896341f));
    float32x4_t r = vfmsq_f32(x, k, vdupq_n_f32(0.693359375f));
    r = vfmsq_f32(r, k, vdupq_n_f32(-2.12194440e-4f));
    float32x4_t p = vdupq_n_f32(1.9875691500e-4f);
    p = vfmaq_f32(vdupq_n_f32(1.3981999507e-3f), p, r);
    p = vfmaq_f32(vdupq_n_f32(8.3334519073e-3f), p, r);
    p = vfmaq_f32(vdupq_n_f32(4.1665795894e-2f), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.6666665459e-1f), p, r);
    p = vfmaq_f32(vdupq_n_f32(5.0000001201e-1f), p, r);
    p = vfmaq_f32(vaddq_f32(r, vdupq_n_f32(1.0f)), p, vmulq_f32(r, r));
    const int32x4_t ki = vcvtq_s32_f32(k), k1 = vshrq_n_s32(ki, 1), k2 = vsubq_s32(ki, k1);
    const float32x4_t s1 = vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(k1, vdupq_n_s32(127)), 23)),
                      s2 = vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(k2, vdupq_n_s32(127)), 23));
    p = vmulq_f32(vmulq_f32(p, s1), s2);
    return vbslq_f32(vcltq_f32(x, vdupq_n_f32(-87.33f)), vdupq_n_f32(0), p);
}

void exp16_array(float *y, const float *x, int n) {
    int i = 0;
    if (kernels_level() > 0)
        for (; i + 4 <= n; i += 4) vst1q_f32(y + i, exp4(vld1q_f32(x + i)));
    for (; i < n; i++) y[i] = expf(x[i]);
}

void swiglu(float *a, const float *b, int n) {
    int i = 0;
    if (kernels_level() > 0)
        for (; i + 4 <= n; i += 4) {
            const float32x4_t g = vld1q_f32(a + i), e = exp4(vnegq_f32(g));
            vst1q_f32(a + i, vmulq_f32(vdivq_f32(g, vaddq_f32(vdupq_n_f32(1.0f), e)), vld1q_f32(b + i)));
        }
    swiglu_ref(a + i, b + i, n - i);
}

void silu(float *a, int n) {
    int i = 0;
    if (kernels_level() > 0)
        for (; i + 4 <= n; i += 4) {
            const float32x4_t g = vld1q_f32(a + i), e = exp4(vnegq_f32(g));
            vst1q_f32(a + i, vdivq_f32(g, vaddq_f32(vdupq_n_f32(1.0f), e)));
        }
    silu_ref(a + i, n - i);
}

/* 4 running maxima (fmaxnm skips NaNs in x as the loop does), then the
 * largest of them: max is exact, so the same value as the sequential loop. */
static float max_from4(const float *x, int n, float m) {
    if (m != m) return m; /* a NaN start stays, as in the loop (fmaxnm would drop it) */
    float32x4_t acc = vdupq_n_f32(m);
    int i = 0;
    for (; i + 4 <= n; i += 4) acc = vmaxnmq_f32(acc, vld1q_f32(x + i));
    return max_from_ref(x + i, n - i, vmaxnmvq_f32(acc));
}

float max_from(const float *x, int n, float m) {
    return kernels_level() > 0 ? max_from4(x, n, m) : max_from_ref(x, n, m);
}

/* The largest value, then the first entry equal to it (argmax16's two
 * passes). */
static int argmax4(const float *x, int n) {
    const float m = max_from4(x, n, -INFINITY);
    const float32x4_t mv = vdupq_n_f32(m);
    int i = 0;
    for (; i + 4 <= n; i += 4)
        if (vmaxvq_u32(vceqq_f32(vld1q_f32(x + i), mv))) break;
    for (; i < n; i++)
        if (x[i] == m) return i;
    return 0;
}

int argmax(const float *x, int n) { return kernels_level() > 0 ? argmax4(x, n) : argmax_ref(x, n); }

/* 4 lanes of partial sums, reduced in a fixed order, then the tail. */
static float exp_sub_sum4(float *x, int n, float m) {
    float32x4_t acc = vdupq_n_f32(0);
    int i = 0;
    for (; i + 4 <= n; i += 4) {
        const float32x4_t e = exp4(vsubq_f32(vld1q_f32(x + i), vdupq_n_f32(m)));
        vst1q_f32(x + i, e);
        acc = vaddq_f32(acc, e);
    }
    return vaddvq_f32(acc) + exp_sub_sum_ref(x + i, n - i, m);
}

float exp_sub_sum(float *x, int n, float m) {
    return kernels_level() > 0 ? exp_sub_sum4(x, n, m) : exp_sub_sum_ref(x, n, m);
}
#else
void exp16_array(float *y, const float *x, int n) {
    for (int i = 0; i < n; i++) y[i] = expf(x[i]);
}
void swiglu(float *a, const float *b, int n) { swiglu_ref(a, b, n); }
void silu(float *a, int n) { silu_ref(a, n); }
float max_from(const float *x, int n, float m) { return max_from_ref(x, n, m); }
int argmax(const float *x, int n) { return argmax_ref(x, n); }
float exp_sub_sum(float *x, int n, float m) { return exp_sub_sum_ref(x, n, m); }
#endif /* __x86_64__, __aarch64__ */
