/* matmul.h: y = x W^T with weights used in place from the mmap'd checkpoint.
 *
 * Data flow: model/ calls matmul for every projection (q, k, v, o, gate, up,
 * down, lm_head), for one token (decode) or a batch (prefill, verification).
 *
 *   x [n, in] f32 row-major      W [out, in] as stored (bf16 | f16 | f32),
 *                                bf16 relaid in panels at load (DT_BF16D,
 *                                for -act bf16, rounds x to bf16), or q8
 *                                blocks made at load (-wq q8; the drafter's
 *                                DT_Q8I also quantizes x)
 *   y [n, out] f32:  y[i][o] = sum_j x[i][j] * W[o][j]
 *
 * Every y[i][o] is one dot product accumulated in the same order whatever n
 * is and whatever tile it lands in, so a position's result does not depend
 * on how the prompt was batched, nor on the thread count.
 * matmul_ref is the plain C reference; matmul picks the fastest path the CPU
 * supports at run time (AVX-512, AVX2+FMA, NEON on aarch64, or the
 * reference).
 */
#ifndef MATMUL_H
#define MATMUL_H

#include <stddef.h>
#include <stdint.h>

/* DT_Q8: llama.cpp's q8_0 rule with f32 scales, made at load from a stored
 * matrix (weight_quantize_q8), cols a multiple of 32:
 *   data:  | int8 q[cols] | per row          w = q * scale
 *   scale: | f32 d[cols / 32] | per row      d = max|w| / 127 per 32 columns */
/* DT_Q8I: the same codes and scales, laid out for integer dot products
 * (AVX-512 VNNI's vpdpbusd, aarch64 I8MM's usdot) against activations
 * quantized by the same rule per token;
 * for the MTP drafter, whose numbers verification makes harmless. rows a
 * multiple of 16; each tile of 16 rows is one run of 64-byte groups:
 *   data:  | 16 rows x |code + 128 (u8) x 4 columns| | per 4 columns, per tile
 *   scale: | 16 rows x f32 d | per 32 columns, per tile
 * y = sum over blocks b of (d_w,b * d_x,b) * (sum_j q_w,j q_x,j). */
/* DT_BF16P: bf16 relaid at load in panels of 32 rows (weight_to_panels),
 * for the AVX-512, AVX2 and NEON paths; panel p is one 64-byte word per
 * column k, whose 16 lanes of bf16 pairs hold rows 32p + l (low half) and
 * 32p + l + 16 (high half):
 *   data:  | k = 0: |row 0|row 16|row 1|row 17| .. |row 15|row 31| | k = 1: .. | per panel
 * Every y[i][o] over it is one fma chain over k = 0, 1, .. in order. */
/* DT_BF16D: bf16 relaid at load in panels of 16 rows for AVX-512 BF16's
 * vdpbf16ps (weight_to_dpanels, -act bf16); panel p is one 64-byte word per
 * column pair m, whose 16 lanes are rows 16p + l, each the pair of that row:
 *   data:  | m = 0: |row 0: col 0|col 1|row 1: col 0|col 1| .. |row 15| | m = 1: .. | per panel
 * matmul rounds x to bf16 (f32_to_bf16) and every y[i][o] is the chain the
 * instruction runs over m = 0, 1, .. in order: the odd column's product,
 * then the even one's, each an fma whose subnormal inputs and result are
 * zero (bf16_dot2). */
typedef enum { DT_F32, DT_F16, DT_BF16, DT_BF16P, DT_BF16D, DT_Q8, DT_Q8I } DType;

static inline size_t dtype_size(DType t) { return t == DT_F32 ? 4 : t >= DT_Q8 ? 1 : 2; }

/* A weight matrix [rows, cols] in place in memory (the mmap), or owned
 * (DT_Q8 and DT_Q8I, freed by weight_free). */
typedef struct {
    const void *data;
    const float *scale; /* DT_Q8: [rows, cols / 32]; DT_Q8I: [rows / 16, cols / 32, 16] */
    DType dtype;
    int rows, cols;
} Weight;

/* dst = src quantized to DT_Q8 (8.0 + 1.0 bits per weight). 0 ok; -1 when
 * cols is not a multiple of 32, rows is not positive or memory runs out;
 * -2 when src holds a NaN or an infinity (no code stands for them); dst
 * untouched unless 0. */
int weight_quantize_q8(const Weight *src, Weight *dst);
/* dst = src as DT_Q8I (the codes weight_quantize_q8 makes, relaid). 0 ok;
 * -1 when rows is not a positive multiple of 16, cols not a multiple of 32,
 * or memory runs out; -2 on a NaN or an infinity; dst untouched unless 0. */
int weight_quantize_q8i(const Weight *src, Weight *dst);
/* Whether DT_Q8I has its fast kernel here (kernels_isa() is avx512vnni,
 * or dotprod on a CPU with I8MM); without it DT_Q8I runs the plain C
 * reference, same results for finite activations. */
int matmul_has_q8i(void);
/* Relays a row-major DT_BF16 w as DT_BF16P in place (its bytes must be
 * writable). 0 ok; -1 when w is not DT_BF16, rows is not a positive
 * multiple of 32, or memory for one panel's rows runs out, w untouched. */
int weight_to_panels(Weight *w);
/* Whether matmul has its fast kernel for DT_BF16P here (AVX-512, AVX2 or
 * NEON); without it DT_BF16P runs the plain C reference. */
int matmul_has_panels(void);
/* Relays a row-major DT_BF16 w as DT_BF16D in place (its bytes must be
 * writable). 0 ok; -1 when w is not DT_BF16, rows is not a positive
 * multiple of 16, cols not a positive even number, the data not on a
 * 4-byte boundary, or memory for one panel's rows runs out, w untouched. */
int weight_to_dpanels(Weight *w);
/* Whether matmul has its fast kernel for DT_BF16D here (AVX-512 and the
 * CPU's AVX-512 BF16, or NEON and Armv8.6's BF16); without it DT_BF16D
 * runs the plain C reference, the same bits, far slower. */
int matmul_has_dpanels(void);
/* Frees what weight_quantize_q8 / _q8i allocated; mapped weights are left alone. */
void weight_free(Weight *w);

void matmul_ref(float *y, const float *x, const Weight *w, int n);
void matmul(float *y, const float *x, const Weight *w, int n);
/* y[k] = x w[k]^T for k < count, all w[k] with the same cols: one pass with
 * one thread team instead of count (q/k/v, gate/up). Each y[k] is exactly
 * what matmul(y[k], x, w[k], n) gives. */
#define MATMUL_MAX_MULTI 4
void matmul_multi(float *const *y, const Weight *const *w, int count, const float *x, int n);
/* Grows the calling thread's working buffers for batches of up to n rows of
 * up to cols columns (model_load does this for its batch), so that later
 * calls never allocate: without them the AVX-512 path would fall back to
 * AVX2, whose results differ in rounding. 0 ok, -1 out of memory. */
int matmul_reserve(int n, int cols);
/* Frees the calling thread's working buffers: a thread that ran matmuls
 * and is about to exit (a server's engine) calls it, or they leak. */
void matmul_thread_free(void);
/* Reads row r of w into out[cols] as f32 (embedding lookup). */
void weight_row(const Weight *w, int r, float *out);

/* Which implementation matmul, the vec_* and the KV kernels use: on
 * x86-64 "avx512vnni" (AVX-512 with its 8-bit dot product, for the integer
 * kernels), "avx512", "avx2" or "ref"; on aarch64 "dotprod" (NEON with
 * sdot, likewise), "neon" or "ref"; "ref" on other CPUs, which have only
 * the plain C kernels. Chosen once from the CPU's features; the
 * environment variable RUN_ISA (one of these names) forces a lower one.
 * f32 activations never go through vdpbf16ps: split into two bf16 halves to
 * keep f32 accuracy, they need two instructions per 32 products, no fewer
 * than the FMAs over widened bf16 weights (measurements:
 * docs/kernel-notes.md#bf16-split-activations). */
const char *kernels_isa(void);
/* The kernels this build holds, for --version: "x86-64 AVX2/AVX-512 and
 * plain C", "aarch64 NEON/dotprod and plain C", or "plain C" on other
 * CPUs. */
const char *kernels_built(void);
/* The same choice as a number: 0 ref, 1 avx2, 2 avx512, 3 avx512vnni on
 * x86-64; 0 ref, 1 neon, 2 dotprod on aarch64. */
int kernels_level(void);
/* 1 when kernels_level() is 3 and the CPU also has AVX-512 VBMI (vpermb,
 * vpmultishiftqb: Ice Lake, Zen 4 and later), which the 2- and 3-bit
 * integer attention kernels (kv/lowbit.c) need to unpack their codes. */
int kernels_has_vbmi(void);
/* The extensions beside the level that the kernels use here, for
 * --version: "avx512bf16" (DT_BF16D) and "avx512vbmi" (2- and 3-bit codes)
 * on x86-64, "bf16" (DT_BF16D) and "i8mm" (DT_Q8I) on aarch64, joined by
 * ", "; "" for none. */
const char *kernels_extensions(void);
/* Forces the ISA by name; returns 0, or -1 if the CPU lacks it (tests). */
int kernels_set_isa(const char *name);
/* Checks RUN_ISA, when set, names a level this CPU has: 0, or -1 with one
 * line in err (the CLI's usage error; the kernels themselves ignore what
 * they cannot use). */
int kernels_check_env(char *err, size_t errlen);

#endif
