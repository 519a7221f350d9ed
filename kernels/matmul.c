/* matmul.c: the projection kernel (see matmul.h), plain C reference plus
 * AVX2 and AVX-512 versions (x86-64) and a NEON one (aarch64) chosen at
 * run time.
 *
 * Data flow: kernels/ is the bottom layer (run.c -> model -> attn -> kv ->
 * kernels); model/ calls matmul / matmul_multi for every projection,
 * y [n, out] = x [n, in] W^T, and relays or quantizes the weights once at
 * load (weight_to_panels, weight_to_dpanels, weight_quantize_q8/_q8i).
 * Layouts (drawn in full in matmul.h):
 *
 *   bf16, f16, f32  | W[o][0..in) | per row o, as in the checkpoint
 *   DT_Q8           | int8 q[in] | per row, and | f32 d | per 32 columns
 *   DT_Q8I          | 16 rows x |code + 128 (u8) x 4 columns| | per 4 columns, per 16-row tile
 *   DT_BF16P        | k: |row 0|row 16|row 1|row 17| .. |row 15|row 31| | per column k, 32-row panel
 *   DT_BF16D        | m: |row 0: col 2m|col 2m+1| .. |row 15| | per column pair m, 16-row panel
 *
 * References: llama.cpp/ggml's q8_0 (quantize_row_q8_0_ref) for DT_Q8 and
 * DT_Q8I; Intel's pseudo-code of vdpbf16ps for DT_BF16D (bf16_dot2).
 *
 * bf16 weights in memory of the loader's own are relaid at load into 32-row
 * panels (DT_BF16P, weight_to_panels) where a SIMD path runs (AVX-512,
 * AVX2, NEON): there lanes are rows, one fma chain per output over the
 * columns in order (panel512, half256, quarter_neon below), the
 * reference's bits on each; with -act bf16 into 16-row panels of column
 * pairs for vdpbf16ps instead (DT_BF16D, weight_to_dpanels, dpanel512).
 * Everything else (f16, f32, q8, bf16 read from the file mapping) is
 * row-major and takes the tiles described next.
 *
 * Row-major fast paths tile R output rows x T tokens: each weight vector
 * loaded once feeds T tokens, each x vector feeds R rows. Per dot product the order is
 * fixed: one vector accumulator over W-wide chunks of the row (32 columns
 * per step on AVX-512, 8 on AVX2), a fixed horizontal reduction, then a
 * scalar tail. Tiles only change which dots run side by side, never the
 * order inside one, which is what makes batching invisible.
 * Weights are widened to f32 in registers (bf16: shift left 16 or mask the
 * high half, exact; f16: vcvtph2ps; q8: code times its block's scale);
 * activations stay f32 throughout.
 * Only with -act bf16 (DT_BF16D, dpanel512 below) do the activations
 * become bf16, for AVX-512 BF16's vdpbf16ps: 32 products an instruction
 * where an f32 FMA does 16, and bits the plain C reference gives exactly
 * (bf16_dot2). Exact f32 activations cannot use it with profit: split
 * into two bf16 halves they take two of them per 32 products, as many as
 * the FMAs.
 *
 * aarch64 runs the AVX2 path's row-major tiles and the panels in NEON,
 * DT_BF16D with BF16's bfmlalt/bfmlalb and DT_Q8I with I8MM's usdot, each
 * the x86 kernel's arithmetic (below); other CPUs run matmul_ref (and
 * kernels_isa() is "ref" there).
 */
#include "kernels/matmul.h"
#include "kernels/flush.h"
#include "kernels/quant32.h"
#include "kernels/half.h"

#include <float.h>
#include <math.h>
#include <omp.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The levels, best last; kernels_level() is the index. On x86-64
 * ISA_VNNI is AVX-512 plus its 8-bit dot product (vpdpbusd), which the
 * integer kernels (DT_Q8I drafts, q8 and tbq attention) need. On aarch64
 * ISA_NEON is Advanced SIMD, which every aarch64 CPU has, and ISA_DOTPROD
 * adds its 8-bit dot product (sdot/udot, Armv8.2's FEAT_DotProd: Neoverse
 * N1 and V2, the Cortex-X cores of GB10). */
#if defined(__x86_64__)
typedef enum { ISA_REF, ISA_AVX2, ISA_AVX512, ISA_VNNI } Isa;
static const char *const isa_names[] = {"ref", "avx2", "avx512", "avx512vnni"};
#define ISA_EXPECTED "ref, avx2, avx512 or avx512vnni"
#elif defined(__aarch64__)
typedef enum { ISA_REF, ISA_NEON, ISA_DOTPROD } Isa;
static const char *const isa_names[] = {"ref", "neon", "dotprod"};
#define ISA_EXPECTED "ref, neon or dotprod"
#else
typedef enum { ISA_REF } Isa;
static const char *const isa_names[] = {"ref"};
#define ISA_EXPECTED "ref"
#endif
#define ISA_COUNT ((int)(sizeof isa_names / sizeof isa_names[0]))
/* The chosen ISA, -1 until first use. Attention's threads read it too, so
 * it is read and written atomically (two first uses just agree). */
static int g_isa = -1;

/* What the CPU has: isa_detect, the best level; cpu_has_bf16, AVX-512 BF16
 * (vcvtne2ps2bf16, vdpbf16ps), which the DT_BF16D kernel needs besides
 * ISA_AVX512. The SIMD kernels are compiled for x86-64 and aarch64 only:
 * on other CPUs the plain C reference is the one level. */
#if defined(__x86_64__)
static Isa isa_detect(void) {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("fma") &&
        __builtin_cpu_supports("f16c"))
        return __builtin_cpu_supports("avx512vnni") ? ISA_VNNI : ISA_AVX512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"))
        return ISA_AVX2;
    return ISA_REF;
}

/* -1 until first asked, then kept as g_isa is. */
static int g_bf16 = -1;
static int cpu_has_bf16(void) {
    int v = __atomic_load_n(&g_bf16, __ATOMIC_RELAXED);
    if (v < 0) {
        __builtin_cpu_init();
        v = __builtin_cpu_supports("avx512bf16") != 0;
        __atomic_store_n(&g_bf16, v, __ATOMIC_RELAXED);
    }
    return v;
}

/* -1 until first asked, then kept as g_bf16 is. */
static int g_vbmi = -1;
static int cpu_has_vbmi(void) {
    int v = __atomic_load_n(&g_vbmi, __ATOMIC_RELAXED);
    if (v < 0) {
        __builtin_cpu_init();
        v = __builtin_cpu_supports("avx512vbmi") != 0;
        __atomic_store_n(&g_vbmi, v, __ATOMIC_RELAXED);
    }
    return v;
}

const char *kernels_built(void) { return "x86-64 AVX2/AVX-512 and plain C"; }
#elif defined(__aarch64__)
#if defined(__linux__)
#include <sys/auxv.h>
#endif
/* The kernel's feature bits (Linux's arch/arm64 hwcap.h; glibc's
 * <bits/hwcap.h> has them too, but not every libc does). */
#define RUN_HWCAP_ASIMD (1UL << 1)
#define RUN_HWCAP_ASIMDDP (1UL << 20)
#define RUN_HWCAP2_I8MM (1UL << 13)
#define RUN_HWCAP2_BF16 (1UL << 14)
static Isa isa_detect(void) {
#if defined(__linux__)
    const unsigned long hw = getauxval(AT_HWCAP);
    if (!(hw & RUN_HWCAP_ASIMD)) return ISA_REF;
    return hw & RUN_HWCAP_ASIMDDP ? ISA_DOTPROD : ISA_NEON;
#else
    return ISA_NEON; /* Advanced SIMD is part of every aarch64 CPU */
#endif
}

/* Armv8.6's two extensions beside the levels, as AVX-512 BF16 is on x86:
 * BF16 (bfmlalb/bfmlalt, the DT_BF16D kernel: -act bf16) and I8MM (usdot,
 * the DT_Q8I kernel). Neoverse N2 and V2 (Grace) and GB10's cores have
 * both. The HWCAP2 word is read once, kept as g_bf16 is on x86. */
static long g_hwcap2 = -1;
static unsigned long hwcap2(void) {
    long v = __atomic_load_n(&g_hwcap2, __ATOMIC_RELAXED);
    if (v < 0) {
#if defined(__linux__)
        v = (long)(getauxval(AT_HWCAP2) & (RUN_HWCAP2_I8MM | RUN_HWCAP2_BF16));
#else
        v = 0;
#endif
        __atomic_store_n(&g_hwcap2, v, __ATOMIC_RELAXED);
    }
    return (unsigned long)v;
}
static int cpu_has_bf16(void) { return (hwcap2() & RUN_HWCAP2_BF16) != 0; }
static int cpu_has_i8mm(void) { return (hwcap2() & RUN_HWCAP2_I8MM) != 0; }

const char *kernels_built(void) { return "aarch64 NEON/dotprod/i8mm/bf16 and plain C"; }
#else
static Isa isa_detect(void) { return ISA_REF; }

const char *kernels_built(void) { return "plain C"; }
#endif

/* The level a name gives on this build, or -1 (the other architecture's
 * names, or none). */
static int isa_index(const char *name) {
    for (int i = 0; i < ISA_COUNT; i++)
        if (strcmp(name, isa_names[i]) == 0) return i;
    return -1;
}

static Isa isa(void) {
    int v = __atomic_load_n(&g_isa, __ATOMIC_RELAXED);
    if (v < 0) {
        const int best = (int)isa_detect();
        const char *env = getenv("RUN_ISA");
        const int want = env ? isa_index(env) : -1;
        v = want >= 0 && want <= best ? want : best;
        __atomic_store_n(&g_isa, v, __ATOMIC_RELAXED);
    }
    return (Isa)v;
}

const char *kernels_isa(void) { return isa_names[isa()]; }

int kernels_level(void) { return (int)isa(); }

#if defined(__x86_64__)
int kernels_has_vbmi(void) { return isa() == ISA_VNNI && cpu_has_vbmi(); }
#else
int kernels_has_vbmi(void) { return 0; }
#endif

const char *kernels_extensions(void) {
#if defined(__x86_64__)
    static const char *const s[] = {"", "avx512bf16", "avx512vbmi", "avx512bf16, avx512vbmi"};
    return s[matmul_has_dpanels() | kernels_has_vbmi() << 1];
#elif defined(__aarch64__)
    static const char *const s[] = {"", "bf16", "i8mm", "bf16, i8mm"};
    return s[matmul_has_dpanels() | matmul_has_q8i() << 1];
#else
    return "";
#endif
}

int kernels_check_env(char *err, size_t errlen) {
    /* every architecture's names, to tell a foreign one from a typo */
    static const char *const any[] = {"ref", "avx2", "avx512", "avx512vnni", "neon", "dotprod"};
    const char *env = getenv("RUN_ISA");
    if (!env) return 0;
    const int at = isa_index(env);
    if (at >= 0 && at <= (int)isa_detect()) return 0;
    for (size_t i = 0; i < sizeof any / sizeof any[0]; i++)
        if (strcmp(env, any[i]) == 0) {
            if (at >= 0) snprintf(err, errlen, "RUN_ISA=%s: this CPU runs %s at most", env, isa_names[isa_detect()]);
            else
                snprintf(err, errlen, "RUN_ISA=%s: a level of another architecture (this one has %s)", env,
                         ISA_EXPECTED);
            return -1;
        }
    snprintf(err, errlen, "RUN_ISA: expected " ISA_EXPECTED ", found '%.40s'", env);
    return -1;
}

int kernels_set_isa(const char *name) {
    const int want = isa_index(name);
    if (want < 0 || want > (int)isa_detect()) return -1;
    __atomic_store_n(&g_isa, want, __ATOMIC_RELAXED);
    return 0;
}

/* Which of the relaid layouts have their fast kernels here (matmul.h). */
#if defined(__x86_64__)
int matmul_has_q8i(void) { return isa() == ISA_VNNI; }

int matmul_has_panels(void) { return isa() >= ISA_AVX2; }

int matmul_has_dpanels(void) { return isa() >= ISA_AVX512 && cpu_has_bf16(); }
#elif defined(__aarch64__)
/* DT_Q8I's usdot is I8MM's, which no CPU has without the dot product */
int matmul_has_q8i(void) { return isa() >= ISA_DOTPROD && cpu_has_i8mm(); }

int matmul_has_panels(void) { return isa() >= ISA_NEON; }

int matmul_has_dpanels(void) { return isa() >= ISA_NEON && cpu_has_bf16(); }
#else
/* the relaid layouts' kernels are x86 and NEON ones */
int matmul_has_q8i(void) { return 0; }

int matmul_has_panels(void) { return 0; }

int matmul_has_dpanels(void) { return 0; }
#endif

/* Where row r (mod 32) of a DT_BF16P panel sits in each column's 64-byte
 * word: half-word 2r for rows 0-15 (the lanes' low halves), 2(r - 16) + 1
 * for rows 16-31 (their high halves). */
static inline int panel_slot(int r) { return r < 16 ? 2 * r : 2 * r - 31; }

/* Element idx of w as f32; a q8 element is its code times its block's
 * scale (one rounding), exactly what the SIMD paths widen it to. */
static inline float wval(const Weight *w, size_t idx) {
    switch (w->dtype) {
    case DT_F32: return ((const float *)w->data)[idx];
    case DT_F16: return f16_to_f32(((const uint16_t *)w->data)[idx]);
    case DT_Q8: return (float)((const int8_t *)w->data)[idx] * w->scale[idx / 32];
    case DT_Q8I: {
        const size_t o = idx / (size_t)w->cols, j = idx % (size_t)w->cols, tile = o / 16, r = o % 16;
        const uint8_t c = ((const uint8_t *)w->data)[tile * 16 * w->cols + (j / 4) * 64 + r * 4 + j % 4];
        return (float)(c - 128) * w->scale[(tile * (w->cols / 32) + j / 32) * 16 + r];
    }
    case DT_BF16P: {
        const size_t o = idx / (size_t)w->cols, j = idx % (size_t)w->cols, r = o % 32;
        return bf16_to_f32(((const uint16_t *)w->data)[((o / 32) * w->cols + j) * 32 + panel_slot((int)r)]);
    }
    case DT_BF16D: {
        /* panel o / 16, word j / 2, lane o % 16, half j % 2 */
        const size_t o = idx / (size_t)w->cols, j = idx % (size_t)w->cols;
        return bf16_to_f32(((const uint16_t *)w->data)[((o / 16) * (w->cols / 2) + j / 2) * 32 + (o % 16) * 2 + j % 2]);
    }
    default: return bf16_to_f32(((const uint16_t *)w->data)[idx]);
    }
}

int weight_quantize_q8(const Weight *src, Weight *dst) {
    const int rows = src->rows, cols = src->cols;
    if (cols % 32 || rows <= 0) return -1;
    const size_t n = (size_t)rows * cols, nb = n / 32;
    /* one allocation: codes, then the scales on a 64-byte boundary */
    const size_t codes = (n + 63) & ~(size_t)63;
    int8_t *q = aligned_alloc(64, ((codes + nb * sizeof(float)) + 63) & ~(size_t)63);
    if (!q) return -1;
    float *d = (float *)(q + codes);
    int bad = 0;
#pragma omp parallel for schedule(static) reduction(| : bad)
    for (size_t b = 0; b < nb; b++) {
        float v[32], amax = 0;
        for (int j = 0; j < 32; j++) {
            v[j] = wval(src, b * 32 + j);
            amax = fmaxf(amax, fabsf(v[j]));
            bad |= !isfinite(v[j]);
        }
        /* ggml quantize_row_q8_0_ref: q = round(w / d) via the reciprocal;
         * a NaN or an infinity has no code (converting it to int8 is
         * undefined), so its block is left for the caller to refuse; a
         * block so small that 1 / d overflows gets codes 0 (as quant32.h) */
        const float s = amax / 127.0f, id = s > 1.0f / FLT_MAX && isfinite(s) ? 1.0f / s : 0.0f;
        d[b] = s;
        for (int j = 0; j < 32; j++) q[b * 32 + j] = isfinite(v[j]) ? (int8_t)roundf(v[j] * id) : 0;
    }
    if (bad) {
        free(q);
        return -2;
    }
    *dst = (Weight){.data = q, .scale = d, .dtype = DT_Q8, .rows = rows, .cols = cols};
    return 0;
}

/* One row of DT_Q8I per loop step: q8 codes as weight_quantize_q8 makes
 * them, stored at their place in the 16-row tile (see matmul.h). */
int weight_quantize_q8i(const Weight *src, Weight *dst) {
    const int rows = src->rows, cols = src->cols, nb = cols / 32;
    Weight q;
    if (rows <= 0 || rows % 16) return -1;
    const int rc = weight_quantize_q8(src, &q);
    if (rc) return rc;
    const size_t n = (size_t)rows * cols, codes = (n + 63) & ~(size_t)63;
    uint8_t *c = aligned_alloc(64, ((codes + n / 32 * sizeof(float)) + 63) & ~(size_t)63);
    if (!c) {
        weight_free(&q);
        return -1;
    }
    float *d = (float *)(c + codes);
#pragma omp parallel for schedule(static)
    for (int o = 0; o < rows; o++) {
        const size_t tile = (size_t)o / 16, r = (size_t)o % 16;
        const int8_t *src_q = (const int8_t *)q.data + (size_t)o * cols;
        uint8_t *t = c + tile * 16 * cols;
        for (int j = 0; j < cols; j++) t[(size_t)(j / 4) * 64 + r * 4 + j % 4] = (uint8_t)(src_q[j] + 128);
        for (int b = 0; b < nb; b++) d[(tile * nb + b) * 16 + r] = q.scale[(size_t)o * nb + b];
    }
    weight_free(&q);
    *dst = (Weight){.data = c, .scale = d, .dtype = DT_Q8I, .rows = rows, .cols = cols};
    return 0;
}

void weight_free(Weight *w) {
    if (w->dtype == DT_Q8 || w->dtype == DT_Q8I) free((void *)w->data);
    memset(w, 0, sizeof *w);
}

int weight_to_panels(Weight *w) {
    const int rows = w->rows, cols = w->cols, threads = omp_get_max_threads();
    if (w->dtype != DT_BF16 || rows <= 0 || rows % 32 || cols <= 0) return -1;
    /* each panel's 32 rows are copied out to a buffer of the thread's,
     * then written back column by column */
    uint16_t *d = (uint16_t *)w->data, *buf = malloc((size_t)threads * 32 * cols * sizeof(uint16_t));
    if (!buf) return -1;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int p = 0; p < rows / 32; p++) {
        uint16_t *panel = d + (size_t)p * 32 * cols, *src = buf + (size_t)omp_get_thread_num() * 32 * cols;
        memcpy(src, panel, (size_t)32 * cols * sizeof(uint16_t));
        for (int j = 0; j < cols; j++)
            for (int r = 0; r < 32; r++) panel[(size_t)j * 32 + panel_slot(r)] = src[(size_t)r * cols + j];
    }
    free(buf);
    w->dtype = DT_BF16P;
    return 0;
}

int weight_to_dpanels(Weight *w) {
    const int rows = w->rows, cols = w->cols, threads = omp_get_max_threads();
    /* the pairs are moved as 32-bit words */
    if (w->dtype != DT_BF16 || rows <= 0 || rows % 16 || cols <= 0 || cols % 2 || (uintptr_t)w->data % 4) return -1;
    /* as weight_to_panels: a panel's 16 rows out to a buffer, then back
     * one column pair (a 32-bit word per row) at a time */
    uint32_t *d = (uint32_t *)w->data, *buf = malloc((size_t)threads * 16 * cols * sizeof(uint16_t));
    if (!buf) return -1;
    const int pairs = cols / 2;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int p = 0; p < rows / 16; p++) {
        uint32_t *panel = d + (size_t)p * 16 * pairs, *src = buf + (size_t)omp_get_thread_num() * 16 * pairs;
        memcpy(src, panel, (size_t)16 * pairs * sizeof(uint32_t));
        for (int m = 0; m < pairs; m++)
            for (int r = 0; r < 16; r++) panel[(size_t)m * 16 + r] = src[(size_t)r * pairs + m];
    }
    free(buf);
    w->dtype = DT_BF16D;
    return 0;
}

void weight_row(const Weight *w, int r, float *out) {
    if (w->dtype == DT_BF16P) {
        /* row r is one half-word of every 64-byte word of its panel */
        const uint16_t *p = (const uint16_t *)w->data + (size_t)(r / 32) * 32 * w->cols + panel_slot(r % 32);
        for (int j = 0; j < w->cols; j++) out[j] = bf16_to_f32(p[(size_t)j * 32]);
        return;
    }
    size_t base = (size_t)r * (size_t)w->cols;
    for (int j = 0; j < w->cols; j++) out[j] = wval(w, base + (size_t)j);
}

/* ftz(v): v, or a zero of its sign where it is subnormal, as vdpbf16ps
 * treats its inputs and each result. */
static inline float ftz(float v) { return fabsf(v) < FLT_MIN ? copysignf(0.0f, v) : v; }

/* One lane of vdpbf16ps: acc plus the pair (x0, x1) . (w0, w1), x rounded
 * to bf16 first; the odd product, then the even one, each one fma (the
 * products of two bf16 are exact in f32), subnormals as zero throughout.
 * (Intel's pseudo-code for the instruction; how it was checked against a
 * CPU: docs/kernel-notes.md#vdpbf16ps-bits.) */
static inline float bf16_dot2(float acc, float x0, float x1, float w0, float w1) {
    acc = ftz(fmaf(bf16_to_f32(f32_to_bf16(x1)), ftz(w1), acc));
    return ftz(fmaf(bf16_to_f32(f32_to_bf16(x0)), ftz(w0), acc));
}

/* The DT_Q8I reference: per block an exact integer dot, then one fma with
 * the product of the two scales, blocks in order, which is what every lane
 * of the VNNI kernel does. */
static void matmul_q8i_ref(float *y, const float *x, const Weight *w, int n) {
    const int in = w->cols, out = w->rows, nb = in / 32;
    const uint8_t *c = w->data;
#pragma omp parallel for schedule(static)
    for (int o = 0; o < out; o++)
        for (int i = 0; i < n; i++) {
            const uint8_t *t = c + (size_t)(o / 16) * 16 * in;
            float acc = 0;
            for (int b = 0; b < nb; b++) {
                int8_t q[32];
                int32_t dot;
                const float dx = quantize32_ref(x + (size_t)i * in + b * 32, q, &dot);
                for (int j = 0; j < 32; j++) dot += t[(size_t)(b * 8 + j / 4) * 64 + (o % 16) * 4 + j % 4] * q[j];
                acc = fmaf((float)dot, w->scale[((size_t)(o / 16) * nb + b) * 16 + o % 16] * dx, acc);
            }
            y[(size_t)i * out + o] = acc;
        }
}

void matmul_ref(float *y, const float *x, const Weight *w, int n) {
    const int in = w->cols, out = w->rows;
    if (w->dtype == DT_Q8I) {
        matmul_q8i_ref(y, x, w, n);
        return;
    }
#pragma omp parallel for schedule(static)
    for (int o = 0; o < out; o++)
        for (int i = 0; i < n; i++) {
            const float *xi = x + (size_t)i * in;
            size_t base = (size_t)o * in;
            float acc = 0;
            /* panels: the fma chain their kernel runs, to the bit */
            if (w->dtype == DT_BF16P)
                for (int j = 0; j < in; j++) acc = fmaf(xi[j], wval(w, base + (size_t)j), acc);
            else if (w->dtype == DT_BF16D)
                for (int j = 0; j < in; j += 2)
                    acc = bf16_dot2(acc, xi[j], xi[j + 1], wval(w, base + (size_t)j), wval(w, base + (size_t)j + 1));
            else
                for (int j = 0; j < in; j++) acc += xi[j] * wval(w, base + (size_t)j);
            y[(size_t)i * out + o] = acc;
        }
}

/* The loop the AVX2 and NEON paths use. Threads take chunks of 64 output rows;
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

#if defined(__x86_64__) || defined(__aarch64__)
/* A per-thread working buffer of x (the SIMD paths' below), grown as
 * needed and kept, 64-byte aligned; NULL when memory runs out. */
typedef struct {
    float *buf;
    size_t cap;
} Buf64;

static float *buf_get(Buf64 *b, size_t floats) {
    if (floats > b->cap) {
        size_t bytes = (floats * sizeof(float) + 63) & ~(size_t)63;
        float *p = aligned_alloc(64, bytes);
        if (!p) return NULL;
        free(b->buf);
        b->buf = p, b->cap = floats;
    }
    return b->buf;
}
#endif

#if defined(__x86_64__)
#include "kernels/hsum.h"

#include <immintrin.h>

/* ---- AVX-512: 32 columns per step, tiles of up to 4 rows x 4 tokens ----
 *
 * One step takes 32 weights of a row as two 16-lane f32 vectors lo, hi and
 * does acc = fma(lo, x_lo, acc); acc = fma(hi, x_hi, acc). For bf16 the
 * 64-byte load is 16 lanes of |w[2l+1]|w[2l]| pairs, widened as
 * lo = lane << 16 (the even columns) and hi = the lane with its low word
 * zeroed (the odd ones). x must then come in the same order, so bf16
 * matmuls first split every 32-column block of x into |16 even|16 odd|
 * (split_rows); f16, f32 and q8 weights widen in column order and use x
 * as it is.
 * The tail (cols % 32) is summed in plain C after the horizontal reduction. */
#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c"), always_inline)) static inline

AVX512 void ld32(const void *p, const float *sc, size_t idx, DType dt, __m512 *lo, __m512 *hi) {
    if (dt == DT_Q8) {
        const int8_t *q = (const int8_t *)p + idx;
        const __m512 d = _mm512_set1_ps(sc[idx / 32]);
        *lo = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)q))), d);
        *hi = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(q + 16)))), d);
    } else if (dt == DT_F32) {
        *lo = _mm512_loadu_ps((const float *)p + idx);
        *hi = _mm512_loadu_ps((const float *)p + idx + 16);
    } else if (dt == DT_F16) {
        *lo = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)p + idx)));
        *hi = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)p + idx + 16)));
    } else {
        /* hi is a zero-masked load of the odd words: no ALU work, so one
         * shift and two FMAs per 64 bytes instead of a shift, an and and two
         * FMAs. Decode streams weights with only a few cycles per line to
         * spare, so one more instruction per line shows in its speed
         * (docs/kernel-notes.md#bf16-widening). */
        const uint16_t *q = (const uint16_t *)p + idx;
        *lo = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_loadu_si512(q), 16));
        *hi = _mm512_castsi512_ps(_mm512_maskz_loadu_epi16(0xAAAAAAAAu, q));
    }
}

/* How far ahead of the tile being read to prefetch its weights (any
 * distance from 1 to 3 KiB does as well). The hardware prefetcher alone
 * does not keep enough misses in flight for R rows read side by side. Into
 * L2 (T1): the tile reaches them a few hundred cycles later, and T0 does no
 * better (docs/kernel-notes.md#row-major-prefetch-distance). */
#define PREFETCH_BYTES 2048

/* The same for panels at up to 6 tokens (decode, verification), whose
 * 64-byte words stream in one run per panel: 1 KiB ahead keeps them at the
 * speed of a plain read loop, where 2 KiB falls behind it. No prefetch at
 * all leaves it to the CPU's own prefetcher, which on some CPUs falls far
 * behind (docs/kernel-notes.md#panel-prefetch-distance). */
#define PANEL_PREFETCH 1024

/* R rows from o, T tokens from i: y[i+t][o+r] for r < R, t < T, over the
 * columns [j0, j1) of the vector part. Row o's weights are read as dt from
 * wd + (o - ob) * cols (w->data and 0, or a packed chunk); the tail reads w
 * itself. xs is x in the order ld32 widens (split for bf16); x serves the
 * tail. When pf, the R rows' worth of bytes after the tile are prefetched
 * as it goes: the first pass over a chunk's rows streams them from memory.
 * A tile that stops short of the last column leaves its accumulators in
 * part [64 rows][TILE_T tokens] (row o at (o - ob) * TILE_T), and one that
 * starts past 0 takes them from there: the same vector sums, continued, so
 * the column blocks of a wide row add up in the same order as one pass.
 * Up to 4 tokens, each step loads the T tokens' x first and widens the R
 * rows one by one; 5-token tiles (packed chunks, see chunk512) load the R
 * rows first and stream the tokens' x past them, since 20 sums, 8 weight
 * vectors and 2 of x fill 30 of the 32 registers where x first would
 * need 38. Either way every sum gets the same FMAs in the same order. */
#define TILE_T 5
AVX512 void tile512(float *y, const float *xs, const float *x, const Weight *w, const void *wd, int ob, int o, int i,
                    const int R, const int T, DType dt, const int pf, int j0, int j1, __m512 *part) {
    const int in = w->cols, out = w->rows, vec = in & ~31;
    const size_t es = dtype_size(dt);
    const char *next = (const char *)wd + (size_t)(o - ob + R) * in * es + PREFETCH_BYTES;
    __m512 acc[4][TILE_T];
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) acc[r][t] = j0 ? part[(o - ob + r) * TILE_T + t] : _mm512_setzero_ps();
    for (int j = j0; j < j1; j += 32) {
        if (pf)
            for (size_t b = 0; b < R * 32 * es; b += 64) _mm_prefetch(next + (size_t)j * R * es + b, _MM_HINT_T1);
        if (T == TILE_T) {
            __m512 lo[4], hi[4];
            for (int r = 0; r < R; r++) ld32(wd, w->scale, (size_t)(o - ob + r) * in + j, dt, &lo[r], &hi[r]);
            for (int t = 0; t < T; t++) {
                const __m512 xl = _mm512_loadu_ps(xs + (size_t)(i + t) * in + j),
                             xh = _mm512_loadu_ps(xs + (size_t)(i + t) * in + j + 16);
                for (int r = 0; r < R; r++) {
                    acc[r][t] = _mm512_fmadd_ps(lo[r], xl, acc[r][t]);
                    acc[r][t] = _mm512_fmadd_ps(hi[r], xh, acc[r][t]);
                }
            }
            continue;
        }
        __m512 xl[4], xh[4];
        for (int t = 0; t < T; t++) {
            xl[t] = _mm512_loadu_ps(xs + (size_t)(i + t) * in + j);
            xh[t] = _mm512_loadu_ps(xs + (size_t)(i + t) * in + j + 16);
        }
        for (int r = 0; r < R; r++) {
            __m512 lo, hi;
            ld32(wd, w->scale, (size_t)(o - ob + r) * in + j, dt, &lo, &hi);
            for (int t = 0; t < T; t++) {
                acc[r][t] = _mm512_fmadd_ps(lo, xl[t], acc[r][t]);
                acc[r][t] = _mm512_fmadd_ps(hi, xh[t], acc[r][t]);
            }
        }
    }
    if (j1 < vec) {
        for (int r = 0; r < R; r++)
            for (int t = 0; t < T; t++) part[(o - ob + r) * TILE_T + t] = acc[r][t];
        return;
    }
    /* horizontal sums four at a time, in (r, t) order */
    float sums[4 * TILE_T + 3];
    const __m512 z = _mm512_setzero_ps();
    for (int k = 0; k < R * T; k += 4) {
        __m512 v[4];
        for (int q = 0; q < 4; q++) v[q] = k + q < R * T ? acc[(k + q) / T][(k + q) % T] : z;
        _mm_storeu_ps(sums + k, hsum4_512(v[0], v[1], v[2], v[3]));
    }
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) {
            float s = sums[r * T + t];
            const float *xi = x + (size_t)(i + t) * in;
            for (int j = vec; j < in; j++) s += xi[j] * wval(w, (size_t)(o + r) * in + j);
            y[(size_t)(i + t) * out + o + r] = s;
        }
}

/* T tokens at i over rows [o0, o1), columns [j0, j1): 4-row tiles, then
 * single rows. */
AVX512 void rows512(float *y, const float *xs, const float *x, const Weight *w, const void *wd, int ob, int o0, int o1,
                    int i, const int T, DType dt, const int pf, int j0, int j1, __m512 *part) {
    int o = o0;
    for (; o + 4 <= o1; o += 4) tile512(y, xs, x, w, wd, ob, o, i, 4, T, dt, pf, j0, j1, part);
    for (; o < o1; o++) tile512(y, xs, x, w, wd, ob, o, i, 1, T, dt, pf, j0, j1, part);
}

/* Tokens [i, i + T) with T < 5 not a constant: the same, dispatched. */
AVX512 void rows512_t(float *y, const float *xs, const float *x, const Weight *w, const void *wd, int ob, int o0,
                      int o1, int i, int T, DType dt, const int pf, int j0, int j1, __m512 *part) {
    switch (T) {
    case 4: rows512(y, xs, x, w, wd, ob, o0, o1, i, 4, dt, pf, j0, j1, part); break;
    case 3: rows512(y, xs, x, w, wd, ob, o0, o1, i, 3, dt, pf, j0, j1, part); break;
    case 2: rows512(y, xs, x, w, wd, ob, o0, o1, i, 2, dt, pf, j0, j1, part); break;
    default: rows512(y, xs, x, w, wd, ob, o0, o1, i, 1, dt, pf, j0, j1, part); break;
    }
}

/* All n tokens over rows [o0, o1) of w as stored, in 4-token tiles, the
 * last 1-3 tokens in one smaller tile; the first tile prefetches (it reads
 * from memory). */
AVX512 void tokens512(float *y, const float *xs, const float *x, const Weight *w, int o0, int o1, int n, DType dt) {
    const int vec = w->cols & ~31;
    int i = 0;
    for (; i + 4 <= n; i += 4) {
        /* pf as a constant in each call, so that the tile loops fold it */
        if (i == 0) rows512(y, xs, x, w, w->data, 0, o0, o1, i, 4, dt, 1, 0, vec, NULL);
        else rows512(y, xs, x, w, w->data, 0, o0, o1, i, 4, dt, 0, 0, vec, NULL);
    }
    if (i < n) rows512_t(y, xs, x, w, w->data, 0, o0, o1, i, n - i, dt, i == 0, 0, vec, NULL);
}

/* Batches of at least this many tokens widen each bf16 chunk once into f32
 * (packed) instead of once per 4-token tile: the widening is a quarter of
 * a tile's vector instructions, on the same two ports as its FMAs
 * (docs/kernel-notes.md#packed-chunks). */
#define PACK_MIN 16

/* Packed chunks wider than this are multiplied one block of this many
 * columns at a time: a tile's x is TILE_T x cols floats, and above L1's
 * 48 KB it would come from L2 again for every 4 rows; at 1024 columns,
 * smaller blocks gain nothing over one pass. TILE_T = 5 tokens is the
 * widest 4-row tile whose sums and operands fit the 32 registers (see
 * tile512); wider or narrower tiles are slower
 * (docs/kernel-notes.md#column-blocks-and-5-token-tiles). */
#define KBLOCK 1024

/* One chunk of 64 output rows [o0, o1) for all n tokens: a TILE_T-token
 * tile of x stays in L1 while the chunk's rows (in L2 after the first tile)
 * stream past. (Keeping 4 rows for all n tokens and streaming the tokens
 * past them instead is slower, the more so the more tokens:
 * docs/kernel-notes.md#chunk-order.)
 * pack [64 * cols] is this thread's buffer for a widened bf16 chunk: its
 * rows hold the lo, hi vectors ld32 makes, so the f32 tiles over it do the
 * same FMAs on the same values as the bf16 tiles would. */
AVX512 void chunk512(float *y, const float *xs, const float *x, const Weight *w, int o0, int o1, int n, DType dt,
                     float *pack) {
    const int in = w->cols, vec = in & ~31;
    if ((dt != DT_BF16 && dt != DT_Q8) || n < PACK_MIN || !pack) {
        tokens512(y, xs, x, w, o0, o1, n, dt);
        return;
    }
    for (int o = o0; o < o1; o++)
        for (int j = 0; j < vec; j += 32) {
            __m512 lo, hi;
            ld32(w->data, w->scale, (size_t)o * in + j, dt, &lo, &hi);
            _mm512_storeu_ps(pack + (size_t)(o - o0) * in + j, lo);
            _mm512_storeu_ps(pack + (size_t)(o - o0) * in + j + 16, hi);
        }
    /* TILE_T tokens at a time, each tile over the chunk's rows one block
     * of columns after the other, its sums parked in part in between (one
     * block, and part unused, up to KBLOCK columns) */
    __m512 part[64 * TILE_T];
    for (int i = 0; i < n; i += TILE_T) {
        int j0 = 0;
        do {
            const int j1 = j0 + KBLOCK < vec ? j0 + KBLOCK : vec;
            if (n - i >= TILE_T) rows512(y, xs, x, w, pack, o0, o0, o1, i, TILE_T, DT_F32, i == 0, j0, j1, part);
            else rows512_t(y, xs, x, w, pack, o0, o0, o1, i, n - i, DT_F32, i == 0, j0, j1, part);
            j0 = j1;
        } while (j0 < vec);
    }
}

/* ---- DT_BF16P: lanes are rows (see matmul.h) ----
 *
 * One 64-byte word of a panel is column k of its 32 rows: lo = lane << 16
 * is rows 0-15, hi = the lane's high half (a masked load, no ALU work) rows
 * 16-31, and x[i][k] broadcast once feeds both. So the tiles need no
 * horizontal sums (a lane's sum is y[i][o], stored as it is), no split x
 * and no f32 copy of the weights per batch, which the row-major tiles pay
 * for; prefill and decode both run faster on panels
 * (docs/kernel-notes.md#bf16-panels). Past 6 tokens, the next chunk is
 * prefetched while this one is in cache (see chunk_pf).
 * A tile is P panels x T tokens, P * 2 * T sums: 1 x 1 for one token,
 * 2 x 6 (24 sums, 4 weight vectors) for up to 6, 1 x 12 past that (the
 * fastest of the shapes tried, docs/kernel-notes.md#bf16-panels). Every
 * sum is the same fma chain over k in order, whatever the tile. */
#define PANEL_T 12

/* Panels [p0, p0 + P) x tokens [i, i + T), all columns. x comes in
 * blocks of PANEL_K columns: token i + t's x[k] is
 * xb[(k / PANEL_K) * bs + t * PANEL_K + k % PANEL_K] (see block_rows; x
 * itself for one token), so the T broadcasts of a step are one pointer plus
 * constant offsets. (With each token's row at a stride known only at run
 * time, the compiler ran out of registers and reloaded the rows' offsets
 * every step.) Each step also prefetches a line from pf, advancing
 * 64 >> sh bytes a step (a 64-byte word of the panel): PANEL_PREFETCH or
 * PREFETCH_BYTES ahead while the panels stream from memory, a share of the
 * next chunk's panels while this one is in cache (sh PF_SHIFT: a new line
 * every 8 steps), or the line being read (no branch in the loop). */
#define PANEL_K 1024
AVX512 void panel512(float *y, const float *xb, size_t bs, const Weight *w, int p0, const int P, int i, const int T,
                     const char *pf, int sh) {
    const int in = w->cols, out = w->rows;
    const uint16_t *wp = (const uint16_t *)w->data + (size_t)p0 * 32 * in;
    __m512 acc[2][2][PANEL_T];
    for (int p = 0; p < P; p++)
        for (int t = 0; t < T; t++) acc[p][0][t] = acc[p][1][t] = _mm512_setzero_ps();
    for (int k0 = 0; k0 < in; k0 += PANEL_K) {
        const float *xk = xb + (size_t)(k0 / PANEL_K) * bs;
        const int kn = in - k0 < PANEL_K ? in - k0 : PANEL_K;
        /* unrolled 4 steps: less loop overhead per FMA, the sums unchanged
         * (docs/kernel-notes.md#panel-unroll) */
#pragma GCC unroll 4
        for (int kk = 0; kk < kn; kk++) {
            const size_t k = (size_t)k0 + kk;
            __m512 lo[2], hi[2];
            for (int p = 0; p < P; p++) {
                const uint16_t *q = wp + ((size_t)p * in + k) * 32;
                _mm_prefetch(pf + ((((size_t)p * in + k) * 64) >> sh), _MM_HINT_T1);
                lo[p] = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_loadu_si512(q), 16));
                hi[p] = _mm512_castsi512_ps(_mm512_maskz_loadu_epi16(0xAAAAAAAAu, q));
            }
            for (int t = 0; t < T; t++) {
                const __m512 x = _mm512_set1_ps(xk[t * PANEL_K + kk]);
                for (int p = 0; p < P; p++) {
                    acc[p][0][t] = _mm512_fmadd_ps(lo[p], x, acc[p][0][t]);
                    acc[p][1][t] = _mm512_fmadd_ps(hi[p], x, acc[p][1][t]);
                }
            }
        }
    }
    for (int p = 0; p < P; p++)
        for (int t = 0; t < T; t++) {
            float *yo = y + (size_t)(i + t) * out + (size_t)(p0 + p) * 32;
            _mm512_storeu_ps(yo, acc[p][0][t]);
            _mm512_storeu_ps(yo + 16, acc[p][1][t]);
        }
}

/* panel512 with P and T as constants (P 2: T up to 6). */
AVX512 void panel512_t(float *y, const float *xb, size_t bs, const Weight *w, int p0, int P, int i, int T,
                       const char *pf, int sh) {
#define PT(p, t) case (p) * 16 + (t): panel512(y, xb, bs, w, p0, p, i, t, pf, sh); break;
    switch (P * 16 + T) {
        PT(1, 1) PT(1, 2) PT(1, 3) PT(1, 4) PT(1, 5) PT(1, 6) PT(1, 7) PT(1, 8) PT(1, 9) PT(1, 10) PT(1, 11) PT(1, 12)
        PT(2, 1) PT(2, 2) PT(2, 3) PT(2, 4) PT(2, 5) PT(2, 6)
    default: break;
    }
#undef PT
}

/* Column blocks of x [n, in] per PANEL_T-token tile (a copy of each row's
 * pieces, no transposing):
 *   xb: | tile 0: | block 0: | token 0: PANEL_K floats | .. | token 11 | | block 1 .. | | tile 1 .. |
 * so a tile's block b starts at b * PANEL_T * PANEL_K (bs) and token t's
 * piece of it at t * PANEL_K; the last block of a row may be short. */
static size_t xb_tile_floats(int in) { return (size_t)((in + PANEL_K - 1) / PANEL_K) * PANEL_T * PANEL_K; }
static void block_rows(float *xb, const float *x, int i0, int i1, int in) {
    for (int i = i0; i < i1; i++)
        for (int k0 = 0; k0 < in; k0 += PANEL_K)
            memcpy(xb + (size_t)(i / PANEL_T) * xb_tile_floats(in) + (size_t)(k0 / PANEL_K) * PANEL_T * PANEL_K +
                       (size_t)(i % PANEL_T) * PANEL_K,
                   x + (size_t)i * in + k0, (size_t)(in - k0 < PANEL_K ? in - k0 : PANEL_K) * sizeof(float));
}

/* One chunk, rows [o0, o1) (1 or 2 panels), for all n tokens (xb: x in
 * blocks, unless n is 1). One token takes the panels one at a time, up to
 * 6 both go side by side; past that each token tile of up to PANEL_T
 * takes the panels one by one (they stay in L2 after the first tile), and
 * tiles 1 to PF_SPREAD each prefetch one PF_SPREAD-th of the chunk after
 * this one when it is in the same matrix: this thread's likely next (see
 * runs_next). Spread over 8 tiles rather than fetched all during the
 * second: a burst of one chunk's panels in one tile's time leaves both
 * threads waiting on memory (docs/kernel-notes.md#spread-prefetch). Fewer
 * tiles than PF_SPREAD + 1 take the whole chunk in tile 1. */
#define PF_SHIFT 3
#define PF_SPREAD (1 << PF_SHIFT)

/* That plan for the chunk of rows [o0, o1) of w (bf16 panels of either
 * layout, cols * 2 bytes a row) at n > 6 tokens: tile 0 streams the chunk
 * from memory, PREFETCH_BYTES ahead; tiles 1 to spread each fetch their
 * share of the next chunk when it is in the same matrix; later tiles point
 * at the line they read. */
typedef struct {
    const char *wd, *nx; /* this chunk's bytes, the next one's (or NULL) */
    int spread, sh;
    size_t share;        /* bytes of the next chunk per tile 1..spread */
} ChunkPf;

static ChunkPf chunk_pf(const Weight *w, int o0, int o1, int n) {
    const size_t bytes = (size_t)(o1 - o0) * w->cols * 2;
    const int tiles = (n + PANEL_T - 1) / PANEL_T, spread = tiles > PF_SPREAD ? PF_SPREAD : 1;
    const char *wd = (const char *)w->data + (size_t)o0 * w->cols * 2;
    return (ChunkPf){wd, o1 + (o1 - o0) <= w->rows ? wd + bytes : NULL, spread, spread == PF_SPREAD ? PF_SHIFT : 0,
                     bytes / spread};
}

/* Where token tile `tile` prefetches from while it reads the panels at byte
 * at of the chunk, and in *sh how fast that pointer advances (see panel512). */
static inline const char *chunk_pf_at(const ChunkPf *c, int tile, size_t at, int *sh) {
    const int ahead = c->nx && tile >= 1 && tile <= c->spread;
    *sh = ahead ? c->sh : 0;
    return tile == 0 ? c->wd + at + PREFETCH_BYTES : ahead ? c->nx + (size_t)(tile - 1) * c->share + (at >> c->sh) : c->wd + at;
}
AVX512 void panels512(float *y, const float *x, const float *xb, const Weight *w, int o0, int o1, int n) {
    const int in = w->cols, np = (o1 - o0) / 32;
    const size_t bs = PANEL_T * PANEL_K;
    const char *wd = (const char *)w->data + (size_t)o0 * in * 2;
    if (n == 1) {
        /* one token: a panel at a time, a single stream from memory,
         * slightly faster than both side by side; with more tokens the pair
         * side by side is faster (below; docs/kernel-notes.md#one-token-panels) */
        for (int p = 0; p < np; p++)
            panel512_t(y, x, PANEL_K, w, o0 / 32 + p, 1, 0, 1, wd + (size_t)p * in * 64 + PANEL_PREFETCH, 0);
        return;
    }
    if (n <= 6) {
        panel512_t(y, xb, bs, w, o0 / 32, np, 0, n, wd + PANEL_PREFETCH, 0);
        return;
    }
    const ChunkPf c = chunk_pf(w, o0, o1, n);
    for (int i = 0, tile = 0; i < n; i += PANEL_T, tile++) {
        const int T = n - i < PANEL_T ? n - i : PANEL_T;
        for (int p = 0, sh; p < np; p++) {
            const char *pf = chunk_pf_at(&c, tile, (size_t)p * in * 64, &sh);
            panel512_t(y, xb + (size_t)tile * xb_tile_floats(in), bs, w, o0 / 32 + p, 1, i, T, pf, sh);
        }
    }
}

/* ---- DT_BF16D: vdpbf16ps on bf16 activations (-act bf16, see matmul.h) ----
 *
 * One 64-byte word of a panel is a column pair of its 16 rows in the order
 * vdpbf16ps takes them: with the pair (x[i][2m], x[i][2m+1]) broadcast as
 * one 32-bit word, one instruction adds both products to each of the 16
 * rows' sums. That is 32 products an instruction where an f32 FMA does 16,
 * with no widening of the weights; the activations pay for it, rounded to
 * bf16 once per matmul (bf16_rows). Tiles as for DT_BF16P: P panels x T
 * tokens, 4 x 6 up to 6 tokens (a whole 64-row chunk side by side), 2 x 12
 * past that, 24 sums either way. x comes in blocks of DPANEL_K columns per
 * PANEL_T-token tile (a tile's block is 12 x 2 KB), so the T broadcasts of
 * a step are one pointer plus constant offsets; pf and sh prefetch as in
 * panel512. Each sum is the instruction's chain over m in order, whatever
 * the tile: the reference's bf16_dot2, to the bit. */
#define DPANEL_K 1024
#define DPANEL_W (DPANEL_K / 2) /* 32-bit words (bf16 pairs) of a token's block */
#define BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16"), always_inline)) static inline
#define BF16_FN __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16"))) static

BF16 void dpanel512(float *y, const uint32_t *xb, const Weight *w, int p0, const int P, int i, const int T,
                    const char *pf, int sh) {
    const int pairs = w->cols / 2, out = w->rows;
    const size_t bs = (size_t)PANEL_T * DPANEL_W;
    const uint32_t *wp = (const uint32_t *)w->data + (size_t)p0 * 16 * pairs;
    __m512 acc[4][PANEL_T];
    for (int p = 0; p < P; p++)
        for (int t = 0; t < T; t++) acc[p][t] = _mm512_setzero_ps();
    for (int m0 = 0; m0 < pairs; m0 += DPANEL_W) {
        const uint32_t *xk = xb + (size_t)(m0 / DPANEL_W) * bs;
        const int mn = pairs - m0 < DPANEL_W ? pairs - m0 : DPANEL_W;
#pragma GCC unroll 4
        for (int mm = 0; mm < mn; mm++) {
            const size_t m = (size_t)m0 + mm;
            __m512bh wv[4];
            for (int p = 0; p < P; p++) {
                _mm_prefetch(pf + ((((size_t)p * pairs + m) * 64) >> sh), _MM_HINT_T1);
                wv[p] = (__m512bh)_mm512_loadu_si512(wp + ((size_t)p * pairs + m) * 16);
            }
            for (int t = 0; t < T; t++) {
                const __m512bh xv = (__m512bh)_mm512_set1_epi32((int)xk[t * DPANEL_W + mm]);
                for (int p = 0; p < P; p++) acc[p][t] = _mm512_dpbf16_ps(acc[p][t], wv[p], xv);
            }
        }
    }
    for (int p = 0; p < P; p++)
        for (int t = 0; t < T; t++) _mm512_storeu_ps(y + (size_t)(i + t) * out + (size_t)(p0 + p) * 16, acc[p][t]);
}

/* dpanel512 with P and T as constants (P 3 and 4: T up to 6). */
BF16 void dpanel512_t(float *y, const uint32_t *xb, const Weight *w, int p0, int P, int i, int T, const char *pf,
                      int sh) {
#define DT(p, t) case (p) * 16 + (t): dpanel512(y, xb, w, p0, p, i, t, pf, sh); break;
    switch (P * 16 + T) {
        DT(1, 1) DT(1, 2) DT(1, 3) DT(1, 4) DT(1, 5) DT(1, 6) DT(1, 7) DT(1, 8) DT(1, 9) DT(1, 10) DT(1, 11) DT(1, 12)
        DT(2, 1) DT(2, 2) DT(2, 3) DT(2, 4) DT(2, 5) DT(2, 6) DT(2, 7) DT(2, 8) DT(2, 9) DT(2, 10) DT(2, 11) DT(2, 12)
        DT(3, 1) DT(3, 2) DT(3, 3) DT(3, 4) DT(3, 5) DT(3, 6)
        DT(4, 1) DT(4, 2) DT(4, 3) DT(4, 4) DT(4, 5) DT(4, 6)
    default: break;
    }
#undef DT
}

/* 32-bit words of one PANEL_T-token tile of x in bf16 blocks:
 *   xh: | tile 0: | block 0: | token 0: DPANEL_K bf16 | .. | token 11 | | block 1 .. | | tile 1 .. |
 * the last block of a row may be short. */
static size_t xh_tile_words(int in) { return (size_t)((in + DPANEL_K - 1) / DPANEL_K) * PANEL_T * DPANEL_W; }

/* Rows [i0, i1) of x [., in] (in even) rounded to bf16 into their blocks
 * of xh, a pair of columns per 32-bit word (the even one low):
 * vcvtne2ps2bf16 32 columns at a time, f32_to_bf16 (the same bits) for a
 * block's last few. */
BF16_FN void bf16_rows(uint32_t *xh, const float *x, int i0, int i1, int in) {
    for (int i = i0; i < i1; i++)
        for (int k0 = 0; k0 < in; k0 += DPANEL_K) {
            const float *src = x + (size_t)i * in + k0;
            uint32_t *dst = xh + (size_t)(i / PANEL_T) * xh_tile_words(in) + (size_t)(k0 / DPANEL_K) * PANEL_T * DPANEL_W +
                            (size_t)(i % PANEL_T) * DPANEL_W;
            const int len = in - k0 < DPANEL_K ? in - k0 : DPANEL_K;
            int j = 0;
            for (; j + 32 <= len; j += 32)
                _mm512_storeu_si512(dst + j / 2, (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(src + j + 16),
                                                                             _mm512_loadu_ps(src + j)));
            for (; j < len; j += 2) dst[j / 2] = f32_to_bf16(src[j]) | (uint32_t)f32_to_bf16(src[j + 1]) << 16;
        }
}

/* One chunk, rows [o0, o1) (1 to 4 panels), for all n tokens of xh. Up to
 * 6 tokens all its panels go side by side (one token included: -act bf16
 * is for prefill, and this path's decode was not tuned apart from
 * DT_BF16P's); past that each token tile takes them two by two, and tiles
 * 1 to PF_SPREAD prefetch the next chunk in shares, as panels512 does. */
BF16_FN void dpanels512(float *y, const uint32_t *xh, const Weight *w, int o0, int o1, int n) {
    const int pairs = w->cols / 2, np = (o1 - o0) / 16;
    const char *wd = (const char *)w->data + (size_t)o0 * w->cols * 2;
    if (n <= 6) {
        dpanel512_t(y, xh, w, o0 / 16, np, 0, n, wd + PANEL_PREFETCH, 0);
        return;
    }
    const ChunkPf c = chunk_pf(w, o0, o1, n);
    for (int i = 0, tile = 0; i < n; i += PANEL_T, tile++) {
        const int T = n - i < PANEL_T ? n - i : PANEL_T;
        for (int p = 0, sh; p < np; p += 2) {
            const char *pf = chunk_pf_at(&c, tile, (size_t)p * pairs * 64, &sh);
            dpanel512_t(y, xh + (size_t)tile * xh_tile_words(w->cols), w, o0 / 16 + p, np - p < 2 ? 1 : 2, i, T, pf, sh);
        }
    }
}

/* Per-calling-thread buffers, grown as needed and kept (the forward pass
 * calls matmul hundreds of times a token), 64-byte aligned so that every
 * 16-float load sits in one cache line (with malloc's 16-byte alignment
 * they all straddle two, docs/kernel-notes.md#64-byte-buffers):
 *   split: x [n, in] with every 32-column block reordered |16 even|16 odd|,
 *          the order ld32 widens bf16 pairs in (columns past the last
 *          block are left out: the tail reads x);
 *   pack:  [threads, 64, in] widened bf16 chunks, one per team thread;
 *   q8i:   x quantized for DT_Q8I: [n, in] codes, then [n, in / 32] scales
 *          and as many biases;
 *   xb:    x in column blocks per 12-token tile for DT_BF16P (block_rows);
 *   xh:    x rounded to bf16, in blocks per 12-token tile for DT_BF16D
 *          (bf16_rows). */
static _Thread_local Buf64 split_buf, pack_buf, q8i_buf, xb_buf, xh_buf;

/* Rows [i0, i1) of x [., in] into xs in split order (see Buf64). */
static void split_rows(float *xs, const float *x, int i0, int i1, int in) {
    const int vec = in & ~31;
    for (int i = i0; i < i1; i++) {
        const float *src = x + (size_t)i * in;
        float *dst = xs + (size_t)i * in;
        for (int j = 0; j < vec; j += 32)
            for (int l = 0; l < 16; l++) dst[j + l] = src[j + 2 * l], dst[j + 16 + l] = src[j + 2 * l + 1];
    }
}

/* Floats of q8i_buf for n rows of cols: the codes rounded up to whole
 * 64-byte lines, then one scale and one bias per 32 columns. */
static size_t q8i_floats(int n, int cols) { return ((size_t)n * cols + 63) / 64 * 16 + 2 * (size_t)n * (cols / 32); }

/* Chunks of 64 output rows of count matrices laid end to end: first[k] is
 * matrix k's first chunk, first[count] the total; chunk_of gives chunk c's
 * matrix and its rows [*o0, *o1). */
static void chunk_starts(int *first, const Weight *const *w, int count) {
    first[0] = 0;
    for (int k = 0; k < count; k++) first[k + 1] = first[k] + (w[k]->rows + 63) / 64;
}
static int chunk_of(const int *first, const Weight *const *w, int c, int *o0, int *o1) {
    int k = 0;
    while (c >= first[k + 1]) k++;
    *o0 = (c - first[k]) * 64;
    *o1 = *o0 + 64 < w[k]->rows ? *o0 + 64 : w[k]->rows;
    return k;
}

/* Work split for one team: chunks [0, total) are cut into one contiguous
 * run per thread, and each thread takes chunks from the front of its own
 * run, then from the back of the others'. A thread thus streams contiguous
 * weights as with a static split, and the one the memory serves faster
 * finishes the other's tail instead of waiting at the join. A run is
 * |hi 32|lo 32| in one atomic word, so an owner and a thief never both get
 * a chunk; each word has a cache line to itself, or every take would
 * evict the other threads' copies. (OpenMP's guided schedule gives one
 * thread half of all chunks in its first grab, and the threads finish
 * further apart: docs/kernel-notes.md#work-split.) */
#define RUNS_MAX 64

typedef struct {
    _Alignas(64) _Atomic uint64_t w;
} Run;

/* Cuts [0, total) into one run per thread (at most RUNS_MAX); returns how
 * many runs. */
static int runs_init(Run *run, int threads, int total) {
    const int nruns = threads < RUNS_MAX ? threads : RUNS_MAX;
    for (int r = 0; r < nruns; r++) {
        uint64_t lo = (uint64_t)total * r / nruns, hi = (uint64_t)total * (r + 1) / nruns;
        atomic_init(&run[r].w, hi << 32 | lo);
    }
    return nruns;
}

/* The next chunk for thread me, or -1 when every run is empty. */
static int runs_next(Run *run, int nruns, int me) {
    for (int k = 0; k < nruns; k++) {
        _Atomic uint64_t *r = &run[(me + k) % nruns].w;
        uint64_t cur = atomic_load_explicit(r, memory_order_relaxed), nxt;
        uint32_t lo, hi;
        do {
            lo = (uint32_t)cur, hi = (uint32_t)(cur >> 32);
            if (lo >= hi) break;
            nxt = k == 0 ? (uint64_t)hi << 32 | (lo + 1) : (uint64_t)(hi - 1) << 32 | lo;
        } while (!atomic_compare_exchange_weak_explicit(r, &cur, nxt, memory_order_relaxed, memory_order_relaxed));
        if (lo < hi) return k == 0 ? (int)lo : (int)hi - 1;
    }
    return -1;
}

/* Floats of xb_buf for n tokens of cols: whole PANEL_T-token tiles of
 * whole blocks (block_rows). */
static size_t xb_floats(int n, int cols) { return (size_t)((n + PANEL_T - 1) / PANEL_T) * xb_tile_floats(cols); }
/* The same for xh_buf (bf16_rows), in 32-bit words. */
static size_t xh_floats(int n, int cols) { return (size_t)((n + PANEL_T - 1) / PANEL_T) * xh_tile_words(cols); }

void matmul_thread_free(void) {
    Buf64 *all[] = {&split_buf, &pack_buf, &q8i_buf, &xb_buf, &xh_buf};
    for (int i = 0; i < 5; i++) {
        free(all[i]->buf);
        *all[i] = (Buf64){NULL, 0};
    }
}

int matmul_reserve(int n, int cols) {
    if (!buf_get(&split_buf, (size_t)n * cols)) return -1;
    if (!buf_get(&q8i_buf, q8i_floats(n, cols))) return -1;
    if (n >= PACK_MIN && !buf_get(&pack_buf, (size_t)omp_get_max_threads() * 64 * cols)) return -1;
    if (n > 1 && !buf_get(&xb_buf, xb_floats(n, cols))) return -1;
    if (matmul_has_dpanels() && !buf_get(&xh_buf, xh_floats(n, cols))) return -1;
    return 0;
}

/* All count projections in one thread team: x is split once, then threads
 * take chunks of 64 rows from the matrices laid end to end, so q, k and v
 * (or gate and up) cost one fork and one join. Chunks are handed out by
 * runs_next (a fully dynamic split, chunk by chunk, is slower than a
 * static one: the threads no longer stream contiguous memory). */
__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c"))) static int
matmul512(float *const *y, const Weight *const *w, int count, const float *x, int n) {
    const int in = w[0]->cols;
    int first[MATMUL_MAX_MULTI + 1], split = 0, blocks = 0, half = 0;
    chunk_starts(first, w, count);
    /* x of exactly PANEL_K columns is already in its blocks (tiles of
     * PANEL_T rows of PANEL_K): no copy */
    for (int k = 0; k < count; k++) {
        split |= w[k]->dtype == DT_BF16, blocks |= w[k]->dtype == DT_BF16P && n > 1 && in != PANEL_K;
        half |= w[k]->dtype == DT_BF16D;
    }
    float *xs = split ? buf_get(&split_buf, (size_t)n * in) : NULL;
    float *xb = blocks ? buf_get(&xb_buf, xb_floats(n, in)) : NULL;
    uint32_t *xh = half ? (uint32_t *)buf_get(&xh_buf, xh_floats(n, in)) : NULL;
    if ((split && !xs) || (blocks && !xb) || (half && !xh)) return -1;
    /* no pack buffer (out of memory) only means tiles widen as they go */
    const int threads = omp_get_max_threads();
    int widen = split;
    for (int k = 0; k < count; k++) widen |= w[k]->dtype == DT_Q8;
    float *pack = widen && n >= PACK_MIN ? buf_get(&pack_buf, (size_t)threads * 64 * in) : NULL;
    /* a few rows are split (or blocked) before the team starts, saving it a barrier */
    const int split_alone = (size_t)n * in <= 16384;
    if (split && split_alone) split_rows(xs, x, 0, n, in);
    if (blocks && split_alone) block_rows(xb, x, 0, n, in);
    if (half && split_alone) bf16_rows(xh, x, 0, n, in);
    Run run[RUNS_MAX];
    const int nruns = runs_init(run, threads, first[count]);
#pragma omp parallel num_threads(threads)
    {
        const int me = omp_get_thread_num();
        float *mine = pack ? pack + (size_t)me * 64 * in : NULL;
        if ((split || blocks || half) && !split_alone) {
#pragma omp for schedule(static)
            for (int i = 0; i < n; i++) {
                if (split) split_rows(xs, x, i, i + 1, in);
                if (blocks) block_rows(xb, x, i, i + 1, in);
                if (half) bf16_rows(xh, x, i, i + 1, in);
            }
        }
        for (int c; (c = runs_next(run, nruns, me % nruns)) >= 0;) {
            int o0, o1;
            const int k = chunk_of(first, w, c, &o0, &o1);
            const Weight *wk = w[k];
            switch (wk->dtype) {
            case DT_F32: chunk512(y[k], x, x, wk, o0, o1, n, DT_F32, NULL); break;
            case DT_F16: chunk512(y[k], x, x, wk, o0, o1, n, DT_F16, NULL); break;
            case DT_Q8: chunk512(y[k], x, x, wk, o0, o1, n, DT_Q8, mine); break;
            case DT_BF16P: panels512(y[k], x, blocks ? xb : x, wk, o0, o1, n); break;
            case DT_BF16D: dpanels512(y[k], xh, wk, o0, o1, n); break;
            default: chunk512(y[k], xs, x, wk, o0, o1, n, DT_BF16, mine); break;
            }
        }
    }
    return 0;
}

/* ---- DT_Q8I: integer dot products, 16 rows per vector (AVX-512 VNNI) ----
 *
 * Lanes are rows: one 64-byte load is 4 columns of a tile's 16 rows, and
 * vpdpbusd adds each row's 4 (code + 128) x (activation code) products
 * into its lane, the activation's 4 codes broadcast. After a block's 8
 * loads each lane holds its row's block dot (the bias lane start takes off
 * the +128), converted and scaled by d_w (16 rows, one load) times d_x:
 * about 11 vector instructions per 512 multiply-adds, where widening q8 to
 * f32 takes 160, so drafts stop being bound by arithmetic. */
#define VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,fma"), always_inline)) static inline

/* Rows [o, o + 16) for T tokens from i: qx [n, in] codes, dx and bias
 * [n, in / 32] per block. pf: prefetch the tile's bytes ahead (the first
 * token group reads them from memory). */
VNNI void q8i_tile(float *y, const int8_t *qx, const float *dx, const int32_t *bias, const Weight *w, int o, int i,
                   const int T, const int pf) {
    const int in = w->cols, nb = in / 32;
    const uint8_t *wp = (const uint8_t *)w->data + (size_t)o * in;
    const float *sp = w->scale + (size_t)o * nb;
    __m512 acc[4];
    for (int t = 0; t < T; t++) acc[t] = _mm512_setzero_ps();
    for (int b = 0; b < nb; b++) {
        __m512i ia[4];
        for (int t = 0; t < T; t++) ia[t] = _mm512_set1_epi32(bias[(size_t)(i + t) * nb + b]);
        for (int g = 0; g < 8; g++) {
            const uint8_t *p = wp + ((size_t)b * 8 + g) * 64;
            if (pf) _mm_prefetch((const char *)p + PREFETCH_BYTES, _MM_HINT_T1);
            const __m512i wv = _mm512_loadu_si512(p);
            for (int t = 0; t < T; t++) {
                int32_t x4;
                memcpy(&x4, qx + (size_t)(i + t) * in + b * 32 + g * 4, 4);
                ia[t] = _mm512_dpbusd_epi32(ia[t], wv, _mm512_set1_epi32(x4));
            }
        }
        const __m512 dw = _mm512_loadu_ps(sp + (size_t)b * 16);
        for (int t = 0; t < T; t++)
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ia[t]),
                                     _mm512_mul_ps(dw, _mm512_set1_ps(dx[(size_t)(i + t) * nb + b])), acc[t]);
    }
    for (int t = 0; t < T; t++) _mm512_storeu_ps(y + (size_t)(i + t) * w->rows + o, acc[t]);
}

/* Rows [o0, o1) (whole tiles) for all n tokens, 4 tokens at a time. */
VNNI void q8i_rows(float *y, const int8_t *qx, const float *dx, const int32_t *bias, const Weight *w, int o0, int o1,
                   int n) {
    for (int o = o0; o < o1; o += 16) {
        int i = 0;
        for (; i + 4 <= n; i += 4) q8i_tile(y, qx, dx, bias, w, o, i, 4, i == 0);
        switch (n - i) {
        case 3: q8i_tile(y, qx, dx, bias, w, o, i, 3, i == 0); break;
        case 2: q8i_tile(y, qx, dx, bias, w, o, i, 2, i == 0); break;
        case 1: q8i_tile(y, qx, dx, bias, w, o, i, 1, i == 0); break;
        }
    }
}

/* As matmul512 for count DT_Q8I matrices: x quantized once, then chunks of
 * 64 rows from the matrices laid end to end. -1: no buffer (out of memory). */
__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,fma"))) static int
matmul_q8i(float *const *y, const Weight *const *w, int count, const float *x, int n) {
    const int in = w[0]->cols, nb = in / 32;
    int first[MATMUL_MAX_MULTI + 1];
    chunk_starts(first, w, count);
    /* [n * in] codes, then [n * nb] scales and [n * nb] biases */
    const size_t code_floats = q8i_floats(n, in) - 2 * (size_t)n * nb;
    float *buf = buf_get(&q8i_buf, q8i_floats(n, in));
    if (!buf) return -1;
    int8_t *qx = (int8_t *)buf;
    float *dx = buf + code_floats;
    int32_t *bias = (int32_t *)(dx + (size_t)n * nb);
    for (size_t b = 0; b < (size_t)n * nb; b++) dx[b] = quantize32_512(x + b * 32, qx + b * 32, &bias[b]);
    const int threads = omp_get_max_threads();
    Run run[RUNS_MAX];
    const int nruns = runs_init(run, threads, first[count]);
#pragma omp parallel num_threads(threads)
    {
        const int me = omp_get_thread_num() % nruns;
        for (int c; (c = runs_next(run, nruns, me)) >= 0;) {
            int o0, o1;
            const int k = chunk_of(first, w, c, &o0, &o1);
            q8i_rows(y[k], qx, dx, bias, w[k], o0, o1, n);
        }
    }
    return 0;
}

/* ---- AVX2: 8 lanes, tiles of 4 rows x 2 tokens (16 ymm registers) ---- */
#define AVX2 __attribute__((target("avx2,fma,f16c"), always_inline)) static inline

AVX2 __m256 ld8(const void *p, const float *sc, size_t idx, DType dt) {
    if (dt == DT_F32) return _mm256_loadu_ps((const float *)p + idx);
    if (dt == DT_Q8)
        return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)((const int8_t *)p + idx)))),
                             _mm256_set1_ps(sc[idx / 32]));
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

/* As tile512, with the first token's tiles prefetching the weights ahead
 * (they stream from memory; the other tokens find them in cache). */
AVX2 void tile256(float *y, const float *x, const Weight *w, int o, int i, const int R, const int T, DType dt) {
    const int in = w->cols, out = w->rows, vec = in & ~7;
    const size_t es = dtype_size(dt);
    const char *next = (const char *)w->data + (size_t)(o + R) * in * es + PREFETCH_BYTES;
    __m256 acc[4][2];
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) acc[r][t] = _mm256_setzero_ps();
    for (int j = 0; j < vec; j += 8) {
        __m256 xv[2];
        if (i == 0)
            for (size_t b = 0; b < R * 8 * es; b += 64) _mm_prefetch(next + (size_t)j * R * es + b, _MM_HINT_T1);
        for (int t = 0; t < T; t++) xv[t] = _mm256_loadu_ps(x + (size_t)(i + t) * in + j);
        for (int r = 0; r < R; r++) {
            __m256 wv = ld8(w->data, w->scale, (size_t)(o + r) * in + j, dt);
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
    case DT_Q8: matmul256_dt(y, x, w, n, DT_Q8); break;
    default: matmul256_dt(y, x, w, n, DT_BF16); break;
    }
}

/* ---- DT_BF16P on AVX2: lanes are rows, as panel512 ----
 *
 * Column k of a 32-row panel is 64 bytes; its first 32 are 8 lanes of
 * |row l|row l+16| pairs (l = 0..7), its last 32 the same for l = 8..15.
 * So one half (32 bytes, 16 rows) widens to lo = lane << 16 (8 rows) and
 * hi = lane & 0xffff0000 (the 8 rows 16 further), and x[i][k] broadcast
 * once feeds both: no horizontal sums, no widened copy of the weights, and
 * every y[i][o] is the fma chain over k in order that matmul_ref runs for
 * DT_BF16P, so the bits are the reference's (and the AVX-512 path's) for
 * any batch. A tile is U halves x T tokens, 2 U T sums; with the two
 * widened halves and the broadcasts (which the compiler keeps for all U
 * halves) at most 15 registers: 4 x 1 (one token: both panels of a
 * chunk), 2 x 2, and 1 x T up to 6, which does 12 FMAs per 32-byte load
 * and two widenings. (2 x 3 would need 17 and spilled a sum.) */
#define HALF_T 6

/* Halves [h0, h0 + U) of w (half h: panel h / 2, bytes 32 (h % 2) of each
 * column's 64) x tokens [i, i + T), all columns; x in blocks as for
 * panel512 (xb, bs). pf and sh: the prefetch stream of panel512, one line
 * a step per panel, panel h / 2 at ((h / 2 - h0 / 2) * in + k) * 64 >> sh. */
AVX2 void half256(float *y, const float *xb, size_t bs, const Weight *w, int h0, const int U, int i, const int T,
                  const char *pf, int sh) {
    const int in = w->cols, out = w->rows;
    const uint16_t *wd = (const uint16_t *)w->data;
    const __m256i keep_hi = _mm256_set1_epi32((int)0xffff0000u);
    __m256 acc[4][2][HALF_T];
    for (int u = 0; u < U; u++)
        for (int t = 0; t < T; t++) acc[u][0][t] = acc[u][1][t] = _mm256_setzero_ps();
    for (int k0 = 0; k0 < in; k0 += PANEL_K) {
        const float *xk = xb + (size_t)(k0 / PANEL_K) * bs;
        const int kn = in - k0 < PANEL_K ? in - k0 : PANEL_K;
#pragma GCC unroll 4
        for (int kk = 0; kk < kn; kk++) {
            const size_t k = (size_t)k0 + kk;
            for (int u = 0; u < U; u++) {
                const int h = h0 + u;
                if (u == 0 || h % 2 == 0)
                    _mm_prefetch(pf + ((((size_t)(h / 2 - h0 / 2) * in + k) * 64) >> sh), _MM_HINT_T1);
                const __m256i v = _mm256_loadu_si256((const __m256i *)(wd + ((size_t)(h / 2) * in + k) * 32 + h % 2 * 16));
                const __m256 lo = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)),
                             hi = _mm256_castsi256_ps(_mm256_and_si256(v, keep_hi));
                for (int t = 0; t < T; t++) {
                    const __m256 xv = _mm256_broadcast_ss(xk + t * PANEL_K + kk);
                    acc[u][0][t] = _mm256_fmadd_ps(lo, xv, acc[u][0][t]);
                    acc[u][1][t] = _mm256_fmadd_ps(hi, xv, acc[u][1][t]);
                }
            }
        }
    }
    /* lo lanes are rows 32 (h / 2) + 8 (h % 2) + 0..7, hi lanes those + 16 */
    for (int u = 0; u < U; u++)
        for (int t = 0; t < T; t++) {
            const int h = h0 + u;
            float *yo = y + (size_t)(i + t) * out + (size_t)(h / 2) * 32 + h % 2 * 8;
            _mm256_storeu_ps(yo, acc[u][0][t]);
            _mm256_storeu_ps(yo + 16, acc[u][1][t]);
        }
}

/* half256 with U and T as constants (the shapes above and their remainders). */
AVX2 void half256_t(float *y, const float *xb, size_t bs, const Weight *w, int h0, int U, int i, int T, const char *pf,
                    int sh) {
#define HT(u, t) case (u) * 16 + (t): half256(y, xb, bs, w, h0, u, i, t, pf, sh); break;
    switch (U * 16 + T) {
        HT(1, 1) HT(1, 2) HT(1, 3) HT(1, 4) HT(1, 5) HT(1, 6) HT(2, 1) HT(2, 2) HT(4, 1)
    default: break;
    }
#undef HT
}

/* One chunk, rows [o0, o1) (1 or 2 panels), for all n tokens (xb: x in
 * blocks, unless n is 1). One token takes the chunk's halves side by side
 * (8 sums, 8 fma chains in flight); 2 tokens a panel at a time; 3 to 6 a
 * half at a time; past that each HALF_T-token tile takes the halves one
 * by one, the chunk in L2 after the first, and the first tile of each
 * PANEL_T block prefetches as chunk_pf plans (panels512). */
AVX2 void panels256(float *y, const float *x, const float *xb, const Weight *w, int o0, int o1, int n) {
    const int in = w->cols, nh = (o1 - o0) / 16, h0 = o0 / 16;
    const size_t bs = PANEL_T * PANEL_K;
    const char *wd = (const char *)w->data + (size_t)o0 * in * 2;
    if (n == 1) {
        half256_t(y, x, PANEL_K, w, h0, nh, 0, 1, wd + PANEL_PREFETCH, 0);
        return;
    }
    if (n == 2) {
        for (int h = 0; h < nh; h += 2)
            half256_t(y, xb, bs, w, h0 + h, 2, 0, n, wd + (size_t)h / 2 * in * 64 + PANEL_PREFETCH, 0);
        return;
    }
    if (n <= HALF_T) {
        for (int h = 0; h < nh; h++)
            half256_t(y, xb, bs, w, h0 + h, 1, 0, n, wd + (size_t)h / 2 * in * 64 + PANEL_PREFETCH, 0);
        return;
    }
    const ChunkPf c = chunk_pf(w, o0, o1, n);
    for (int i = 0; i < n; i += HALF_T) {
        const int T = n - i < HALF_T ? n - i : HALF_T, tile = i / PANEL_T;
        const float *xt = xb + (size_t)tile * xb_tile_floats(in) + (size_t)(i % PANEL_T) * PANEL_K;
        for (int h = 0, sh = 0; h < nh; h++) {
            const size_t at = (size_t)h / 2 * in * 64;
            /* the second half-tile of a PANEL_T block reads its own lines */
            const char *pf = i % PANEL_T == 0 ? chunk_pf_at(&c, tile, at, &sh) : wd + at;
            half256_t(y, xt, bs, w, h0 + h, 1, i, T, pf, sh);
        }
    }
}

/* matmul for count DT_BF16P matrices of one width in one thread team, as
 * matmul512 runs them (chunks of 64 rows from runs_next). -1: no buffer
 * for x in blocks (out of memory). */
__attribute__((target("avx2,fma,f16c"))) static int matmul256p(float *const *y, const Weight *const *w, int count,
                                                                  const float *x, int n) {
    const int in = w[0]->cols, blocks = n > 1 && in != PANEL_K;
    int first[MATMUL_MAX_MULTI + 1];
    chunk_starts(first, w, count);
    float *xb = blocks ? buf_get(&xb_buf, xb_floats(n, in)) : NULL;
    if (blocks && !xb) return -1;
    const int threads = omp_get_max_threads(), alone = (size_t)n * in <= 16384;
    if (blocks && alone) block_rows(xb, x, 0, n, in);
    Run run[RUNS_MAX];
    const int nruns = runs_init(run, threads, first[count]);
#pragma omp parallel num_threads(threads)
    {
        const int me = omp_get_thread_num() % nruns;
        if (blocks && !alone) {
#pragma omp for schedule(static)
            for (int i = 0; i < n; i++) block_rows(xb, x, i, i + 1, in);
        }
        for (int c; (c = runs_next(run, nruns, me)) >= 0;) {
            int o0, o1;
            const int k = chunk_of(first, w, c, &o0, &o1);
            panels256(y[k], x, blocks ? xb : x, w[k], o0, o1, n);
        }
    }
    return 0;
}

void matmul_multi(float *const *y, const Weight *const *w, int count, const float *x, int n) {
    int q8i = 0;
    for (int k = 0; k < count; k++) q8i += w[k]->dtype == DT_Q8I;
    if (q8i) {
        /* all DT_Q8I in one team (the drafter's q/k/v, gate/up), else one by one */
        if (q8i == count && count <= MATMUL_MAX_MULTI && matmul_has_q8i() && !matmul_q8i(y, w, count, x, n)) return;
        for (int k = 0; k < count; k++) {
            if (w[k]->dtype != DT_Q8I) matmul_multi(&y[k], &w[k], 1, x, n);
            else if (!matmul_has_q8i() || matmul_q8i(&y[k], &w[k], 1, x, n)) matmul_q8i_ref(y[k], x, w[k], n);
        }
        return;
    }
    /* DT_BF16D without its instructions: the reference, matrix by matrix */
    int dp = 1;
    for (int k = 0; k < count; k++) dp &= w[k]->dtype != DT_BF16D || matmul_has_dpanels();
    if (isa() >= ISA_AVX512 && dp) {
        int k = 0;
        for (; k < count; k += MATMUL_MAX_MULTI) {
            int c = count - k < MATMUL_MAX_MULTI ? count - k : MATMUL_MAX_MULTI;
            if (matmul512(y + k, w + k, c, x, n)) break;
        }
        if (k >= count) return;
        /* out of memory for split x (a caller that did not matmul_reserve):
         * the AVX2 path below is correct, with other rounding */
        y += k, w += k, count -= k;
    }
    /* AVX2: panels in one team when all are (q, k, v; gate, up), else one
     * by one; DT_BF16D, and panels without a buffer for x, in plain C */
    int panels = 0;
    for (int k = 0; k < count; k++) panels += w[k]->dtype == DT_BF16P;
    if (isa() >= ISA_AVX2 && count > 0 && panels == count && count <= MATMUL_MAX_MULTI && !matmul256p(y, w, count, x, n))
        return;
    for (int k = 0; k < count; k++) {
        if (isa() < ISA_AVX2 || w[k]->dtype == DT_BF16D) matmul_ref(y[k], x, w[k], n);
        else if (w[k]->dtype != DT_BF16P) matmul256(y[k], x, w[k], n);
        else if (matmul256p(&y[k], &w[k], 1, x, n)) matmul_ref(y[k], x, w[k], n);
    }
}

#elif defined(__aarch64__)
#include <arm_neon.h>

/* ---- NEON: 4 lanes, tiles of 4 rows x 2 tokens ----
 *
 * The AVX2 path's loop and tiles in 128-bit registers. One step takes 8
 * columns of a row as two f32 vectors w0 (columns j..j+3) and w1
 * (j+4..j+7), and each dot product keeps two accumulators, a0 += w0 x0 and
 * a1 += w1 x1: a 4 x 2 tile is 16 sums plus 4 vectors of x, and one token
 * (decode) still has 8 fma chains in flight. A dot's order is fixed
 * whatever the tile: the two chains over the columns in steps of 8, then
 * vaddvq(a0 + a1), then the tail (cols % 8) in plain C. Weights widen
 * exactly: bf16 by a 16-bit left shift, f16 by fcvtl, q8 as code times
 * scale (one rounding, as wval). */
#define NEON static inline __attribute__((always_inline))

NEON void ld8n(const void *p, const float *sc, size_t idx, DType dt, float32x4_t *w0, float32x4_t *w1) {
    if (dt == DT_F32) {
        *w0 = vld1q_f32((const float *)p + idx);
        *w1 = vld1q_f32((const float *)p + idx + 4);
    } else if (dt == DT_Q8) {
        const int16x8_t q = vmovl_s8(vld1_s8((const int8_t *)p + idx));
        const float d = sc[idx / 32];
        *w0 = vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(q))), d);
        *w1 = vmulq_n_f32(vcvtq_f32_s32(vmovl_high_s16(q)), d);
    } else if (dt == DT_F16) {
        const float16x8_t h = vreinterpretq_f16_u16(vld1q_u16((const uint16_t *)p + idx));
        *w0 = vcvt_f32_f16(vget_low_f16(h));
        *w1 = vcvt_high_f32_f16(h);
    } else {
        const uint16x8_t h = vld1q_u16((const uint16_t *)p + idx);
        *w0 = vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(h), 16));
        *w1 = vreinterpretq_f32_u32(vshll_high_n_u16(h, 16));
    }
}

/* R rows from o x T tokens from i, all columns (see above). */
NEON void tile_neon(float *y, const float *x, const Weight *w, int o, int i, const int R, const int T, DType dt) {
    const int in = w->cols, out = w->rows, vec = in & ~7;
    float32x4_t a0[4][2], a1[4][2];
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) a0[r][t] = a1[r][t] = vdupq_n_f32(0);
    for (int j = 0; j < vec; j += 8) {
        float32x4_t x0[2], x1[2];
        for (int t = 0; t < T; t++) {
            x0[t] = vld1q_f32(x + (size_t)(i + t) * in + j);
            x1[t] = vld1q_f32(x + (size_t)(i + t) * in + j + 4);
        }
        for (int r = 0; r < R; r++) {
            float32x4_t w0, w1;
            ld8n(w->data, w->scale, (size_t)(o + r) * in + j, dt, &w0, &w1);
            for (int t = 0; t < T; t++) {
                a0[r][t] = vfmaq_f32(a0[r][t], w0, x0[t]);
                a1[r][t] = vfmaq_f32(a1[r][t], w1, x1[t]);
            }
        }
    }
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) {
            float s = vaddvq_f32(vaddq_f32(a0[r][t], a1[r][t]));
            const float *xi = x + (size_t)(i + t) * in;
            for (int j = vec; j < in; j++) s += xi[j] * wval(w, (size_t)(o + r) * in + j);
            y[(size_t)(i + t) * out + o + r] = s;
        }
}

static void matmul_neon_dt(float *y, const float *x, const Weight *w, int n, DType dt) {
#define TILE_NEON(o, i, R, T) tile_neon(y, x, w, o, i, R, T, dt)
    BLOCKED_LOOP(w->rows, n, 2, TILE_NEON)
#undef TILE_NEON
}

/* ---- DT_BF16P on NEON: lanes are rows, as half256 ----
 *
 * Column k's 64 bytes are four 16-byte quarters; quarter q is 4 lanes of
 * |row 4q+l|row 4q+l+16| pairs (l = 0..3), which widen to lo = lane << 16
 * (rows 4q..4q+3) and hi = lane & 0xffff0000 (rows 4q+16..4q+19); x[i][k]
 * multiplies both (fmla by element). Every y[i][o] is the fma chain over k
 * in order that matmul_ref runs for DT_BF16P: the x86 paths' bits. A tile
 * is Q quarters x T tokens, 2 Q T sums: 4 x 1 and 4 x 2 (a whole panel)
 * up to 2 tokens, 2 x 5 past that (20 sums, two widened quarters and five
 * x: 27 of the 32 registers, 20 FMAs per 32 bytes and four widenings;
 * 4 x 3 needs 33, the compiler loading all four quarters first).
 * Not yet timed on ARM hardware (docs/kernel-notes.md#bf16-panels-on-neon). */
#define QUARTER_T 5

/* Quarters [q0, q0 + Q) of w (quarter q: panel q / 4, bytes 16 (q % 4) of
 * each column's 64) x tokens [i, i + T), all columns. */
NEON void quarter_neon(float *y, const float *x, const Weight *w, int q0, const int Q, int i, const int T) {
    const int in = w->cols, out = w->rows;
    const uint16_t *wd = (const uint16_t *)w->data;
    const uint32x4_t keep_hi = vdupq_n_u32(0xffff0000u);
    float32x4_t acc[4][2][QUARTER_T];
    /* every q and t loop unrolled, so that acc lives in registers: GCC
     * stops peeling nested loops at 16 copies and left acc in memory */
#pragma GCC unroll 4
    for (int q = 0; q < Q; q++)
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) acc[q][0][t] = acc[q][1][t] = vdupq_n_f32(0);
    for (int k = 0; k < in; k++) {
        float xk[QUARTER_T];
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) xk[t] = x[(size_t)(i + t) * in + k];
#pragma GCC unroll 4
        for (int q = 0; q < Q; q++) {
            const int qq = q0 + q;
            const uint32x4_t v = vld1q_u32((const uint32_t *)(wd + ((size_t)(qq / 4) * in + k) * 32 + qq % 4 * 8));
            const float32x4_t lo = vreinterpretq_f32_u32(vshlq_n_u32(v, 16)),
                              hi = vreinterpretq_f32_u32(vandq_u32(v, keep_hi));
#pragma GCC unroll 8
            for (int t = 0; t < T; t++) {
                acc[q][0][t] = vfmaq_n_f32(acc[q][0][t], lo, xk[t]);
                acc[q][1][t] = vfmaq_n_f32(acc[q][1][t], hi, xk[t]);
            }
        }
    }
    /* lo lanes are rows 32 (q / 4) + 4 (q % 4) + 0..3, hi lanes those + 16 */
#pragma GCC unroll 4
    for (int q = 0; q < Q; q++)
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) {
            const int qq = q0 + q;
            float *yo = y + (size_t)(i + t) * out + (size_t)(qq / 4) * 32 + qq % 4 * 4;
            vst1q_f32(yo, acc[q][0][t]);
            vst1q_f32(yo + 16, acc[q][1][t]);
        }
}

/* quarter_neon with Q and T as constants. */
static void quarter_neon_t(float *y, const float *x, const Weight *w, int q0, int Q, int i, int T) {
#define QT(q, t) case (q) * 16 + (t): quarter_neon(y, x, w, q0, q, i, t); break;
    switch (Q * 16 + T) {
        QT(4, 1) QT(4, 2) QT(2, 1) QT(2, 2) QT(2, 3) QT(2, 4) QT(2, 5)
    default: break;
    }
#undef QT
}

/* Panel p of w, all tokens: up to 2 tokens its four quarters side by
 * side, past that two quarters at a time for each QUARTER_T-token tile
 * (the panel in cache after the first). */
static void panel_neon(float *y, const float *x, const Weight *w, int p, int n) {
    if (n <= 2) {
        quarter_neon_t(y, x, w, 4 * p, 4, 0, n);
        return;
    }
    for (int i = 0; i < n; i += QUARTER_T)
        for (int q = 0; q < 4; q += 2) quarter_neon_t(y, x, w, 4 * p + q, 2, i, n - i < QUARTER_T ? n - i : QUARTER_T);
}

/* Which of count matrices unit g of a joint loop falls in, from first[k],
 * the first unit of matrix k (first[count] = all units): the loop over
 * every matrix's panels or tiles that matmul_multi gives one team. */
static int unit_owner(const int *first, int count, int g) {
    int k = 0;
    while (k + 1 < count && g >= first[k + 1]) k++;
    return k;
}

/* DT_BF16P, count matrices: threads take panels of all of them in one
 * team (q, k, v; gate, up). */
static void panels_neon(float *const *y, const Weight *const *w, int count, const float *x, int n) {
    int first[MATMUL_MAX_MULTI + 1] = {0};
    for (int k = 0; k < count; k++) first[k + 1] = first[k] + w[k]->rows / 32;
#pragma omp parallel for schedule(static)
    for (int g = 0; g < first[count]; g++) {
        const int k = unit_owner(first, count, g);
        panel_neon(y[k], x, w[k], g - first[k], n);
    }
}

/* x prepared for DT_BF16D or DT_Q8I (a Buf64, as the x86 paths keep
 * theirs: matmul_reserve grows it ahead, matmul_thread_free frees it):
 *   DT_BF16D: x rounded to bf16, [n, in / 2] pairs (the even column low)
 *   DT_Q8I:   x quantized, [n, in] codes, then [n, in / 32] scales and as
 *             many biases (quantize32_ref)
 * Without it (out of memory) both take the reference: the same bits. */
static _Thread_local Buf64 xq_buf;

/* Floats of xq_buf for n rows of in columns: the larger of the two uses
 * (the codes rounded up to whole 16-byte words). */
static size_t xq_floats(int n, int in) {
    const size_t half = (size_t)n * in / 2, q8 = ((size_t)n * in + 15) / 16 * 4 + 2 * (size_t)n * (in / 32);
    return half > q8 ? half : q8;
}

void matmul_thread_free(void) {
    free(xq_buf.buf);
    xq_buf = (Buf64){NULL, 0};
}

int matmul_reserve(int n, int cols) {
    if (!matmul_has_dpanels() && !matmul_has_q8i()) return 0;
    return buf_get(&xq_buf, xq_floats(n, cols)) ? 0 : -1;
}

/* ---- DT_BF16D with BF16: bfmlalt then bfmlalb (-act bf16) ----
 *
 * A column pair m's 64 bytes are four 16-byte quarters of 4 rows' pairs
 * (quarter q: rows 16p + 4q .. 16p + 4q + 3); with x's pair broadcast as
 * one 32-bit word, bfmlalt adds each row's odd product into its lane and
 * bfmlalb then its even one, each a fused multiply-add of the widened
 * bf16 values: bf16_dot2's chain over m, the reference's bits. vdpbf16ps
 * flushes subnormal inputs and results by itself; here FPCR.FZ does
 * (flush_on around the loop), with one difference: FZ judges a result
 * tiny before rounding (Arm's FPRound), the reference's ftz after it, so
 * a sum that rounds up to exactly FLT_MIN in magnitude is 0 here. Tiles:
 * 4 panels x 1 token (16 chains in flight for decode), 2 x 2..3, 1 x 4..6
 * (at most 24 sums), each tile's weights read once per token tile.
 * Not yet timed on ARM hardware. */
#define BF16N static inline __attribute__((target("arch=armv8.2-a+bf16"), always_inline))
#define DPANEL_NT 6

/* Panels [p0, p0 + P) x tokens [i, i + T) of xh [n, cols / 2]. */
BF16N void dpanel_neon(float *y, const uint32_t *xh, const Weight *w, int p0, const int P, int i, const int T) {
    const int pairs = w->cols / 2, out = w->rows;
    const uint32_t *wp = (const uint32_t *)w->data + (size_t)p0 * 16 * pairs;
    float32x4_t acc[4][4][DPANEL_NT];
#pragma GCC unroll 4
    for (int p = 0; p < P; p++)
#pragma GCC unroll 4
        for (int q = 0; q < 4; q++)
#pragma GCC unroll 8
            for (int t = 0; t < T; t++) acc[p][q][t] = vdupq_n_f32(0);
    for (int m = 0; m < pairs; m++) {
        bfloat16x8_t xv[DPANEL_NT];
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) xv[t] = vreinterpretq_bf16_u32(vdupq_n_u32(xh[(size_t)(i + t) * pairs + m]));
#pragma GCC unroll 4
        for (int p = 0; p < P; p++)
#pragma GCC unroll 4
            for (int q = 0; q < 4; q++) {
                const bfloat16x8_t wv = vreinterpretq_bf16_u32(vld1q_u32(wp + ((size_t)p * pairs + m) * 16 + 4 * q));
#pragma GCC unroll 8
                for (int t = 0; t < T; t++)
                    acc[p][q][t] = vbfmlalbq_f32(vbfmlaltq_f32(acc[p][q][t], wv, xv[t]), wv, xv[t]);
            }
    }
#pragma GCC unroll 4
    for (int p = 0; p < P; p++)
#pragma GCC unroll 4
        for (int q = 0; q < 4; q++)
#pragma GCC unroll 8
            for (int t = 0; t < T; t++) vst1q_f32(y + (size_t)(i + t) * out + (size_t)(p0 + p) * 16 + 4 * q, acc[p][q][t]);
}

/* dpanel_neon with P and T as constants. */
static __attribute__((target("arch=armv8.2-a+bf16"))) void dpanel_neon_t(float *y, const uint32_t *xh, const Weight *w,
                                                                          int p0, int P, int i, int T) {
#define DP(p, t) case (p) * 16 + (t): dpanel_neon(y, xh, w, p0, p, i, t); break;
    switch (P * 16 + T) {
        DP(1, 1) DP(2, 1) DP(3, 1) DP(4, 1) DP(1, 2) DP(2, 2) DP(1, 3) DP(2, 3) DP(1, 4) DP(1, 5) DP(1, 6)
    default: break;
    }
#undef DP
}

/* DT_BF16D, count matrices of the same cols: x rounded to bf16 once
 * (f32_to_bf16, which flushes its subnormals as vcvtne2ps2bf16 does), then
 * threads take groups of 4 panels (64 rows) of all of them, each group all
 * tokens in tiles of up to DPANEL_NT. -1: no buffer. */
static int dpanels_neon(float *const *y, const Weight *const *w, int count, const float *x, int n) {
    const int pairs = w[0]->cols / 2;
    uint32_t *xh = (uint32_t *)buf_get(&xq_buf, (size_t)n * pairs);
    if (!xh) return -1;
    int first[MATMUL_MAX_MULTI + 1] = {0};
    for (int k = 0; k < count; k++) first[k + 1] = first[k] + (w[k]->rows / 16 + 3) / 4;
#pragma omp parallel
    {
        const uint64_t fp = flush_on();
#pragma omp for schedule(static)
        for (int i = 0; i < n; i++)
            for (int m = 0; m < pairs; m++) {
                const float *xi = x + (size_t)i * w[0]->cols + 2 * m;
                xh[(size_t)i * pairs + m] = f32_to_bf16(xi[0]) | (uint32_t)f32_to_bf16(xi[1]) << 16;
            }
#pragma omp for schedule(static)
        for (int g = 0; g < first[count]; g++) {
            const int k = unit_owner(first, count, g), np = w[k]->rows / 16, p0 = 4 * (g - first[k]);
            const int pn = np - p0 < 4 ? np - p0 : 4;
            for (int i = 0; i < n; i += DPANEL_NT) {
                const int T = n - i < DPANEL_NT ? n - i : DPANEL_NT, step = T == 1 ? 4 : T <= 3 ? 2 : 1;
                for (int p = 0; p < pn; p += step)
                    dpanel_neon_t(y[k], xh, w[k], p0 + p, pn - p < step ? pn - p : step, i, T);
            }
        }
        flush_off(fp);
    }
    return 0;
}

/* ---- DT_Q8I with I8MM: usdot, vpdpbusd's twin ----
 *
 * A 64-byte group is 4 columns of a tile's 16 rows, as four 16-byte
 * quarters of 4 rows; usdot (unsigned by signed bytes, as vpdpbusd) adds
 * each row's 4 (code + 128) x (activation code) products into its lane,
 * the activation's 4 codes in every lane. Each block's sums start at its
 * bias (-128 x the sum of the activation's codes), so after the block's 8
 * groups a lane holds its row's exact block dot, which takes one fma with
 * d_w d_x: matmul_q8i_ref's arithmetic, its bits. Tiles of 16 rows x up
 * to 2 tokens (16 sums and 4 quarters in registers).
 * Not yet timed on ARM hardware. */
#define I8MM static inline __attribute__((target("arch=armv8.2-a+i8mm"), always_inline))

/* Rows [o, o + 16) x tokens [i, i + T): qx [n, in] codes, dx and bias
 * [n, in / 32] per block. */
I8MM void q8i_tile_neon(float *y, const int8_t *qx, const float *dx, const int32_t *bias, const Weight *w, int o,
                        int i, const int T) {
    const int in = w->cols, nb = in / 32;
    const uint8_t *wp = (const uint8_t *)w->data + (size_t)o * in;
    const float *sp = w->scale + (size_t)o * nb;
    float32x4_t acc[2][4];
    for (int t = 0; t < T; t++)
        for (int q = 0; q < 4; q++) acc[t][q] = vdupq_n_f32(0);
    for (int b = 0; b < nb; b++) {
        int32x4_t ia[2][4];
        for (int t = 0; t < T; t++)
            for (int q = 0; q < 4; q++) ia[t][q] = vdupq_n_s32(bias[(size_t)(i + t) * nb + b]);
        for (int g = 0; g < 8; g++) {
            const uint8_t *p = wp + ((size_t)b * 8 + g) * 64;
            uint8x16_t wv[4];
            for (int q = 0; q < 4; q++) wv[q] = vld1q_u8(p + 16 * q);
            for (int t = 0; t < T; t++) {
                int32_t x4;
                memcpy(&x4, qx + (size_t)(i + t) * in + b * 32 + g * 4, 4);
                const int8x16_t xv = vreinterpretq_s8_s32(vdupq_n_s32(x4));
                for (int q = 0; q < 4; q++) ia[t][q] = vusdotq_s32(ia[t][q], wv[q], xv);
            }
        }
        for (int q = 0; q < 4; q++) {
            const float32x4_t dw = vld1q_f32(sp + (size_t)b * 16 + 4 * q);
            for (int t = 0; t < T; t++)
                acc[t][q] = vfmaq_f32(acc[t][q], vcvtq_f32_s32(ia[t][q]), vmulq_n_f32(dw, dx[(size_t)(i + t) * nb + b]));
        }
    }
    for (int t = 0; t < T; t++)
        for (int q = 0; q < 4; q++) vst1q_f32(y + (size_t)(i + t) * w->rows + o + 4 * q, acc[t][q]);
}

/* DT_Q8I, count matrices of the same cols: x quantized once
 * (quantize32_ref, the reference's rounding), then threads take 16-row
 * tiles of all of them, each all tokens two at a time. -1: no buffer. */
static __attribute__((target("arch=armv8.2-a+i8mm"))) int q8i_neon(float *const *y, const Weight *const *w, int count,
                                                                   const float *x, int n) {
    const int in = w[0]->cols, nb = in / 32;
    float *buf = buf_get(&xq_buf, xq_floats(n, in));
    if (!buf) return -1;
    int8_t *qx = (int8_t *)buf;
    float *dx = buf + ((size_t)n * in + 15) / 16 * 4;
    int32_t *bias = (int32_t *)(dx + (size_t)n * nb);
    for (size_t b = 0; b < (size_t)n * nb; b++) dx[b] = quantize32_ref(x + b * 32, qx + b * 32, &bias[b]);
    int first[MATMUL_MAX_MULTI + 1] = {0};
    for (int k = 0; k < count; k++) first[k + 1] = first[k] + w[k]->rows / 16;
#pragma omp parallel for schedule(static)
    for (int g = 0; g < first[count]; g++) {
        const int k = unit_owner(first, count, g), o = 16 * (g - first[k]);
        int i = 0;
        for (; i + 2 <= n; i += 2) q8i_tile_neon(y[k], qx, dx, bias, w[k], o, i, 2);
        if (i < n) q8i_tile_neon(y[k], qx, dx, bias, w[k], o, i, 1);
    }
    return 0;
}

/* Matrices of one fast dtype in one team, their x prepared once (q, k, v;
 * gate, up); else one matrix after the other. DT_BF16D without BF16 and
 * DT_Q8I without I8MM (or without a buffer for x) take the reference. */
void matmul_multi(float *const *y, const Weight *const *w, int count, const float *x, int n) {
    int same = count > 0 && count <= MATMUL_MAX_MULTI;
    for (int k = 1; k < count; k++) same &= w[k]->dtype == w[0]->dtype;
    if (same && count > 1) {
        const DType dt = w[0]->dtype;
        if (dt == DT_BF16P && isa() >= ISA_NEON) {
            panels_neon(y, w, count, x, n);
            return;
        }
        if (dt == DT_BF16D && matmul_has_dpanels() && !dpanels_neon(y, w, count, x, n)) return;
        if (dt == DT_Q8I && matmul_has_q8i() && !q8i_neon(y, w, count, x, n)) return;
    }
    for (int k = 0; k < count; k++) {
        const DType dt = w[k]->dtype;
        if (dt == DT_BF16D) {
            if (!matmul_has_dpanels() || dpanels_neon(&y[k], &w[k], 1, x, n)) matmul_ref(y[k], x, w[k], n);
        } else if (dt == DT_Q8I) {
            if (!matmul_has_q8i() || q8i_neon(&y[k], &w[k], 1, x, n)) matmul_ref(y[k], x, w[k], n);
        } else if (isa() < ISA_NEON) matmul_ref(y[k], x, w[k], n);
        else if (dt == DT_BF16P) panels_neon(&y[k], &w[k], 1, x, n);
        else if (dt == DT_F32) matmul_neon_dt(y[k], x, w[k], n, DT_F32);
        else if (dt == DT_F16) matmul_neon_dt(y[k], x, w[k], n, DT_F16);
        else if (dt == DT_Q8) matmul_neon_dt(y[k], x, w[k], n, DT_Q8);
        else matmul_neon_dt(y[k], x, w[k], n, DT_BF16);
    }
}

#else
/* Other CPUs: the plain C reference, one matrix after the other. */
void matmul_multi(float *const *y, const Weight *const *w, int count, const float *x, int n) {
    for (int k = 0; k < count; k++) matmul_ref(y[k], x, w[k], n);
}
#endif /* __x86_64__, __aarch64__ */

#if !defined(__x86_64__) && !defined(__aarch64__)
/* Only the x86 and aarch64 paths keep per-thread buffers. */
void matmul_thread_free(void) {}

int matmul_reserve(int n, int cols) {
    (void)n, (void)cols;
    return 0;
}
#endif

void matmul(float *y, const float *x, const Weight *w, int n) { matmul_multi(&y, &w, 1, x, n); }
