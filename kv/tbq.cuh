/* tbq.cuh: what the GPU side of tbq2/3/4 shares between its append
 * (kv/tbq.cu) and attention (attn/attn.cu): the codebook and sign tables,
 * the signed Hadamard rotation of rows held in shared memory, and the
 * unpacking of a block's codes from registers. lm3 (kv/lm3.cu) stores the
 * same 3-bit codes of one 128-value vector, unrotated, behind an fp32
 * norm; q4h (kv/q4.cu) rotates with the unsigned transform; polar4
 * (kv/polar4.cu) stores tbq4's codebook after a dense rotation, behind an
 * fp32 norm.
 *
 * Data flow: model/gpu.c stores each token's k and v through
 * cuda_tbq_store (rotate, normalise, code: the twin of tbq_append), and
 * the attention kernel scores and sums the stored blocks in the rotated
 * domain, rotating the queries in and the outputs back once per row.
 * A stream is the CPU's (kv/tbq_common.h), one vector per position:
 *
 *   | fp16 d | qs: 128 codes of b bits | (x hd / 128)   2 + 16 b bytes a block
 *
 * with its positions rounded up to 32 in memory (a warp stages 32
 * positions at a time as 16-byte words: 32 (2 + 16 b) is a multiple of 16).
 * Code j of a block is bits [b j, b j + b) of its code bytes read as one
 * little-endian bit string, for 2, 3 and 4 bits alike (kv/lowbit.h).
 */
#ifndef KV_TBQ_CUH
#define KV_TBQ_CUH

#include <stdint.h>

#include "kernels/cuda.h"

/* The tables a tbq kernel takes by value: the block's codebook (N(0,1)
 * Lloyd-Max centroids over √128) and its midpoints, the sign vectors s1
 * and s2 as bit masks (bit i set: entry i is -1), and 1/√128 as the CPU
 * rounds it; for polar4 the layer's rotation R and its transpose in device
 * memory ([128, 128] each, row-major). */
typedef struct {
    float cb[16], mid[15];
    uint32_t s1[4], s2[4];
    float hinv;
    const float *rm, *rmt;
    /* 4-bit codes' integer scores (attn/attn.cu): the codebook as bytes,
     * cb8[i] = lrintf(cb[i] · cb8_s) with cb8_s = 127 / max|cb| (kv/lowbit.c's
     * cb8 less its +128), four to a word, little-endian */
    uint32_t cb8[4];
    float cb8_s;
} TbqTab;

/* Fills t for b-bit codes (host; kv/tbq.cu, from kv/lloydmax.c and
 * kv/hadamard.c, so that both devices use one table; cb8 for b = 4). */
void tbq_cuda_tab(int bits, TbqTab *t);

/* Bits per code of a Lloyd-Max index format (tbq2/3/4, lm3, polar4), 0 for the
 * others; and the bytes of its scale before each 128 codes. */
static __host__ __device__ constexpr int code_bits_of(int fmt) {
    return fmt >= CUDA_KV_TBQ2 && fmt <= CUDA_KV_TBQ4 ? fmt - CUDA_KV_TBQ2 + 2
           : fmt == CUDA_KV_LM3                       ? 3
           : fmt == CUDA_KV_POLAR4                    ? 4
                                                      : 0;
}
static __host__ __device__ constexpr int code_hdr_of(int fmt) {
    return fmt == CUDA_KV_LM3 || fmt == CUDA_KV_POLAR4 ? 4 : 2;
}

/* x = ±x by bit i of a 128-entry sign mask: a flip of the sign bit, which
 * is what the CPU's product by -1.0f gives (zeros included). */
__device__ __forceinline__ float tbq_sign(const uint32_t *m, int i, float x) {
    return __uint_as_float(__float_as_uint(x) ^ (((m[(i >> 5) & 3] >> (i & 31)) & 1u) << 31));
}

/* rows x [rows, hd] in shared memory, every 128 values a block, rotated in
 * place by the whole thread block: y = post ⊙ H(pre ⊙ x) / √128, the
 * Sylvester butterflies in had_fwht's pairs (a + b, a - b) stage by stage,
 * so the bits are the CPU's (kv/hadamard.c). Every thread must call it;
 * it waits for what any of them wrote to x before. */
__device__ __forceinline__ void tbq_rotate_rows(float *x, int count, const uint32_t *pre, const uint32_t *post,
                                                float hinv) {
    const int tid = threadIdx.x, nt = blockDim.x;
    __syncthreads();
    for (int e = tid; e < count; e += nt) x[e] = tbq_sign(pre, e & 127, x[e]);
    __syncthreads();
    for (int h = 1; h < 128; h *= 2) {
        /* pair k of the row set: its lower element has bit h clear, and a
         * pair never leaves its 128-block (h <= 64) */
        for (int k = tid; k < count / 2; k += nt) {
            const int j = (k / h) * 2 * h + k % h;
            const float a = x[j], b = x[j + h];
            x[j] = __fadd_rn(a, b);
            x[j + h] = __fsub_rn(a, b);
        }
        __syncthreads();
    }
    for (int e = tid; e < count; e += nt) x[e] = __fmul_rn(tbq_sign(post, e & 127, x[e]), hinv);
    __syncthreads();
}

/* rows x [rows, 128] in shared memory times M [128, 128] in device memory,
 * in place: y[r][j] = Σ_i x[r][i] M[i][j], every product
 * and sum rounded alone in the order of i, as polar4's rot_rows (kv/polar4.c)
 * makes them, so the bits are the CPU's. Thread j of a block of 128 makes
 * column j of every row (rows <= MAXR); every thread must call it, and it
 * waits for what any of them wrote to x before. */
template <int MAXR>
__device__ __forceinline__ void polar_rotate_rows(float *x, int rows, const float *__restrict__ M) {
    const int j = threadIdx.x;
    float acc[MAXR];
#pragma unroll
    for (int r = 0; r < MAXR; r++) acc[r] = 0;
    __syncthreads();
#pragma unroll 16
    for (int i = 0; i < 128; i++) {
        const float m = __ldg(M + i * 128 + j); /* 16 loads in flight: M comes from L2 */
#pragma unroll
        for (int r = 0; r < MAXR; r++)
            if (r < rows) acc[r] = __fadd_rn(acc[r], __fmul_rn(x[r * 128 + i], m));
    }
    __syncthreads();
#pragma unroll
    for (int r = 0; r < MAXR; r++)
        if (r < rows) x[r * 128 + j] = acc[r];
    __syncthreads();
}

/* The codebook bytes of the four 4-bit codes in g's low 16 bits (code n at
 * bits 4n), byte n for code n: two byte permutes pick each code's byte
 * among entries 0-7 and 8-15 by its low 3 bits, a third keeps the one its
 * bit 3 names. */
__device__ __forceinline__ uint32_t cb8_bytes(uint32_t g, const uint32_t (&t)[4]) {
    const uint32_t sel = g & 0x7777u;
    const uint32_t lo = __byte_perm(t[0], t[1], sel), hi = __byte_perm(t[2], t[3], sel);
    return __byte_perm(lo, hi, 0x3210u | ((g >> 1) & 0x4444u));
}

/* Code j (a compile-time constant once unrolled) of a block whose code
 * bytes are the little-endian words w, bits [B j, B j + B), times 4: its
 * byte offset in a table of floats (one shift and one mask, the multiply
 * folded into the shift). */
template <int B, int NW> __device__ __forceinline__ int tbq_code4(const uint32_t (&w)[NW], int j) {
    const int bit = B * j, wi = bit >> 5, sh = bit & 31;
    const uint32_t v = sh + B > 32 ? __funnelshift_r(w[wi], w[wi + 1], sh) << 2
                       : sh >= 2   ? w[wi] >> (sh - 2)
                                   : w[wi] << (2 - sh);
    return (int)(v & (((1u << B) - 1) << 2));
}

/* nb bits from bit bit0 of the bytes at p (shared memory, any alignment),
 * nb <= 32: byte loads, at most 5. */
__device__ __forceinline__ uint32_t tbq_bits_at(const uint8_t *p, int bit0, int nb) {
    const uint8_t *b = p + (bit0 >> 3);
    const int sh = bit0 & 7, nbytes = (sh + nb + 7) >> 3;
    uint64_t v = 0;
    for (int i = 0; i < nbytes; i++) v |= (uint64_t)b[i] << (8 * i);
    return (uint32_t)(v >> sh) & (nb == 32 ? 0xffffffffu : (1u << nb) - 1);
}

#endif
