/* matmul.c: the projection kernel (see matmul.h), plain C reference plus
 * AVX2 and AVX-512 versions chosen at run time.
 *
 * Fast paths tile R output rows x T tokens: each weight vector loaded once
 * feeds T tokens, each x vector feeds R rows. Per dot product the order is
 * fixed: one vector accumulator over in/W-wide chunks, a fixed horizontal
 * reduction, then a scalar tail. Tiles only change which dots run side by
 * side, never the order inside one, which is what makes batching invisible.
 * Weights are widened to f32 in registers (bf16: shift left 16, exact;
 * f16: vcvtph2ps); activations stay f32 throughout.
 */
#include "kernels/matmul.h"
#include "kernels/half.h"

#include <immintrin.h>
#include <stdlib.h>
#include <string.h>

typedef enum { ISA_REF, ISA_AVX2, ISA_AVX512 } Isa;
static int g_isa = -1;

static Isa isa_detect(void) {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl"))
        return ISA_AVX512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"))
        return ISA_AVX2;
    return ISA_REF;
}

static Isa isa(void) {
    if (g_isa < 0) {
        Isa best = isa_detect();
        const char *env = getenv("RUN_ISA");
        g_isa = (int)best;
        if (env && strcmp(env, "ref") == 0) g_isa = ISA_REF;
        else if (env && strcmp(env, "avx2") == 0 && best >= ISA_AVX2) g_isa = ISA_AVX2;
        else if (env && strcmp(env, "avx512") == 0 && best >= ISA_AVX512) g_isa = ISA_AVX512;
    }
    return (Isa)g_isa;
}

const char *kernels_isa(void) {
    static const char *names[] = {"ref", "avx2", "avx512"};
    return names[isa()];
}

int kernels_level(void) { return (int)isa(); }

int kernels_set_isa(const char *name) {
    Isa want = strcmp(name, "avx512") == 0    ? ISA_AVX512
               : strcmp(name, "avx2") == 0      ? ISA_AVX2
                                                : ISA_REF;
    if (want > isa_detect() || (strcmp(name, "ref") && want == ISA_REF)) return -1;
    g_isa = (int)want;
    return 0;
}

static inline float wval(const Weight *w, size_t idx) {
    switch (w->dtype) {
    case DT_F32: return ((const float *)w->data)[idx];
    case DT_F16: return f16_to_f32(((const uint16_t *)w->data)[idx]);
    default: return bf16_to_f32(((const uint16_t *)w->data)[idx]);
    }
}

void weight_row(const Weight *w, int r, float *out) {
    size_t base = (size_t)r * (size_t)w->cols;
    for (int j = 0; j < w->cols; j++) out[j] = wval(w, base + (size_t)j);
}

void matmul_ref(float *y, const float *x, const Weight *w, int n) {
    const int in = w->cols, out = w->rows;
#pragma omp parallel for schedule(static)
    for (int o = 0; o < out; o++)
        for (int i = 0; i < n; i++) {
            const float *xi = x + (size_t)i * in;
            size_t base = (size_t)o * in;
            float acc = 0;
            for (int j = 0; j < in; j++) acc += xi[j] * wval(w, base + (size_t)j);
            y[(size_t)i * out + o] = acc;
        }
}

/* The loop every fast path shares. Threads take chunks of 64 output rows;
 * inside, tokens go in blocks of 64, so a chunk's weights and a block's
 * activations stay in L2 while tiles of 4 rows x T tokens sweep them, with
 * smaller tiles for the remainders. TILE(o, i, R, T) is an inlined tile. */
#define BLOCKED_LOOP(out, n, T, TILE)                                          \
    _Pragma("omp parallel for schedule(static)")                              \
    for (int oc = 0; oc < ((out) + 63) / 64; oc++) {                           \
        int o1 = oc * 64 + 64 < (out) ? oc * 64 + 64 : (out);                  \
        for (int ib = 0; ib < (n); ib += 64) {                                 \
            int i1 = ib + 64 < (n) ? ib + 64 : (n), o = oc * 64;               \
            for (; o + 4 <= o1; o += 4) {                                      \
                int i = ib;                                                    \
                for (; i + (T) <= i1; i += (T)) TILE(o, i, 4, (T));            \
                for (; i < i1; i++) TILE(o, i, 4, 1);                          \
            }                                                                  \
            for (; o < o1; o++) {                                              \
                int i = ib;                                                    \
                for (; i + (T) <= i1; i += (T)) TILE(o, i, 1, (T));            \
                for (; i < i1; i++) TILE(o, i, 1, 1);                          \
            }                                                                  \
        }                                                                      \
    }

/* ---- AVX-512: 16 lanes, tiles of 4 rows x 4 tokens ---- */
#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,fma,f16c"), always_inline)) static inline

AVX512 __m512 ld16(const void *p, size_t idx, DType dt) {
    if (dt == DT_F32) return _mm512_loadu_ps((const float *)p + idx);
    __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)p + idx));
    if (dt == DT_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* R rows starting at o, T tokens starting at i. */
AVX512 void tile512(float *y, const float *x, const Weight *w, int o, int i, const int R, const int T,
                    DType dt) {
    const int in = w->cols, out = w->rows, vec = in & ~15;
    __m512 acc[4][4];
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) acc[r][t] = _mm512_setzero_ps();
    for (int j = 0; j < vec; j += 16) {
        __m512 xv[4];
        for (int t = 0; t < T; t++) xv[t] = _mm512_loadu_ps(x + (size_t)(i + t) * in + j);
        for (int r = 0; r < R; r++) {
            __m512 wv = ld16(w->data, (size_t)(o + r) * in + j, dt);
            for (int t = 0; t < T; t++) acc[r][t] = _mm512_fmadd_ps(wv, xv[t], acc[r][t]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) {
            float s = _mm512_reduce_add_ps(acc[r][t]);
            const float *xi = x + (size_t)(i + t) * in;
            for (int j = vec; j < in; j++) s += xi[j] * wval(w, (size_t)(o + r) * in + j);
            y[(size_t)(i + t) * out + o + r] = s;
        }
}

AVX512 void matmul512_dt(float *y, const float *x, const Weight *w, int n, DType dt) {
#define TILE512(o, i, R, T) tile512(y, x, w, o, i, R, T, dt)
    BLOCKED_LOOP(w->rows, n, 4, TILE512)
#undef TILE512
}

__attribute__((target("avx512f,avx512bw,avx512vl,fma,f16c"))) static void matmul512(float *y, const float *x,
                                                                                    const Weight *w, int n) {
    switch (w->dtype) {
    case DT_F32: matmul512_dt(y, x, w, n, DT_F32); break;
    case DT_F16: matmul512_dt(y, x, w, n, DT_F16); break;
    default: matmul512_dt(y, x, w, n, DT_BF16); break;
    }
}

/* ---- AVX2: 8 lanes, tiles of 4 rows x 2 tokens (16 ymm registers) ---- */
#define AVX2 __attribute__((target("avx2,fma,f16c"), always_inline)) static inline

AVX2 __m256 ld8(const void *p, size_t idx, DType dt) {
    if (dt == DT_F32) return _mm256_loadu_ps((const float *)p + idx);
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)p + idx));
    if (dt == DT_F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

AVX2 float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

AVX2 void tile256(float *y, const float *x, const Weight *w, int o, int i, const int R, const int T, DType dt) {
    const int in = w->cols, out = w->rows, vec = in & ~7;
    __m256 acc[4][2];
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) acc[r][t] = _mm256_setzero_ps();
    for (int j = 0; j < vec; j += 8) {
        __m256 xv[2];
        for (int t = 0; t < T; t++) xv[t] = _mm256_loadu_ps(x + (size_t)(i + t) * in + j);
        for (int r = 0; r < R; r++) {
            __m256 wv = ld8(w->data, (size_t)(o + r) * in + j, dt);
            for (int t = 0; t < T; t++) acc[r][t] = _mm256_fmadd_ps(wv, xv[t], acc[r][t]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) {
            float s = hsum8(acc[r][t]);
            const float *xi = x + (size_t)(i + t) * in;
            for (int j = vec; j < in; j++) s += xi[j] * wval(w, (size_t)(o + r) * in + j);
            y[(size_t)(i + t) * out + o + r] = s;
        }
}

AVX2 void matmul256_dt(float *y, const float *x, const Weight *w, int n, DType dt) {
#define TILE256(o, i, R, T) tile256(y, x, w, o, i, R, T, dt)
    BLOCKED_LOOP(w->rows, n, 2, TILE256)
#undef TILE256
}

__attribute__((target("avx2,fma,f16c"))) static void matmul256(float *y, const float *x, const Weight *w, int n) {
    switch (w->dtype) {
    case DT_F32: matmul256_dt(y, x, w, n, DT_F32); break;
    case DT_F16: matmul256_dt(y, x, w, n, DT_F16); break;
    default: matmul256_dt(y, x, w, n, DT_BF16); break;
    }
}

void matmul(float *y, const float *x, const Weight *w, int n) {
    switch (isa()) {
    case ISA_AVX512: matmul512(y, x, w, n); break;
    case ISA_AVX2: matmul256(y, x, w, n); break;
    default: matmul_ref(y, x, w, n); break;
    }
}
