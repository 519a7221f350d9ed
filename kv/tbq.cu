/* tbq.cu: the GPU twin of tbq_append (kv/tbq_common.c): each token's key
 * and value rows rotated, normalised and coded into tbq2/3/4 blocks in a
 * cache in device memory, byte for byte what the CPU's append writes for
 * the same rows.
 *
 * Data flow: model/gpu.c runs cuda_qk_rope_store (which leaves the roped
 * keys in place in the q|k|v rows when the cache is tbq), then
 * cuda_tbq_store, then the attention (attn/attn.cu), which reads the
 * blocks in the rotated domain. Per block of 128 values (kv/tbq.cuh):
 *
 *   ‖x‖ = sqrt of the double sum of squares, in order (as the CPU)
 *   y = s2 ⊙ H(s1 ⊙ x) / √128 · (1 / ‖x‖)
 *   idx_j = #{m : y_j > mid_m},   d = fp16(‖x‖ / sqrt(Σ_j cb[idx_j]²))
 *   | fp16 d | codes |
 *
 * Every rounding is the C's: products and sums one at a time (__fmul_rn,
 * __fadd_rn, which nvcc cannot contract into an fma the C does not do),
 * the two sequential sums in the C's order on one thread (128 terms: a
 * store is a small part of a step), divisions and square roots correctly
 * rounded, fp16 to nearest even.
 *
 * Reference: TurboQuant (arXiv 2504.19874) without the QJL stage, in the
 * TBQ4_0 / turbo layout (spec kv_schemes.md), as kv/tbq_common.c.
 */
#include <cuda_fp16.h>
#include <math.h>
#include <string.h>

#include "kernels/cuda.h"
#include "kernels/cuda_common.cuh"
#include "kv/tbq.cuh"

extern "C" {
#include "kv/hadamard.h"
#include "kv/lloydmax.h"
}

void tbq_cuda_tab(int bits, TbqTab *t) {
    memset(t, 0, sizeof *t);
    lm_codebook(bits, 1.0f / sqrtf(128.0f), t->cb, t->mid);
    for (int i = 0; i < 128; i++) {
        if (had_sign(1, i) < 0) t->s1[i / 32] |= 1u << (i % 32);
        if (had_sign(2, i) < 0) t->s2[i / 32] |= 1u << (i % 32);
    }
    t->hinv = 1.0f / sqrtf(128.0f);
    if (bits == 4) {
        /* lb_fmt's cb8 and cb8_s (kv/lowbit.c), less the +128 */
        float m = 0;
        for (int i = 0; i < 16; i++) m = fmaxf(m, fabsf(t->cb[i]));
        t->cb8_s = 127.0f / m;
        for (int i = 0; i < 16; i++)
            t->cb8[i / 4] |= (uint32_t)(uint8_t)(int8_t)lrintf(t->cb[i] * t->cb8_s) << (8 * (i % 4));
    }
}

/* Block (token i, kv head h, role) of hd threads, thread t on element t of
 * the key (role 0, roped in place by cuda_qk_rope_store) or the value. */
template <int B>
__global__ void tbq_store_kernel(const float *k, const float *v, int ld, uint8_t *kc, uint8_t *vc, const int *d_pos,
                                 int hd, int cap, TbqTab tab) {
    constexpr int BB = 2 + 16 * B; /* bytes per 128-value block */
    __shared__ float x[512], y[512];
    __shared__ uint8_t idx[512];
    __shared__ float nrm[4];
    pdl_wait();
    const int i = blockIdx.x, h = blockIdx.y, role = blockIdx.z, t = threadIdx.x;
    const int pos = *d_pos + i, b = t >> 7, j = t & 127;
    x[t] = y[t] = (role ? v : k)[(size_t)i * ld + (size_t)h * hd + t];
    __syncthreads();
    /* the block's norm: the C's double sum in order (the product of two
     * floats is exact in double) */
    if (j == 0) {
        double ss = 0;
        for (int e = 0; e < 128; e++) ss = __dadd_rn(ss, __dmul_rn((double)x[t + e], (double)x[t + e]));
        nrm[b] = __double2float_rn(__dsqrt_rn(ss));
    }
    tbq_rotate_rows(y, hd, tab.s1, tab.s2, tab.hinv); /* its barriers publish nrm too */
    const float norm = nrm[b], inv = norm > 1e-10f ? __fdiv_rn(1.0f, norm) : 0.0f;
    const float u = __fmul_rn(y[t], inv);
    int c = 0;
#pragma unroll
    for (int m = 0; m < (1 << B) - 1; m++) c += u > tab.mid[m];
    idx[t] = (uint8_t)c;
    __syncthreads();
    const size_t vb = (size_t)(hd / 128) * BB;
    uint8_t *blk = (role ? vc : kc) + kv_stream_bytes(CUDA_KV_TBQ2 + B - 2, hd, cap) * h + (size_t)pos * vb + b * BB;
    if (j == 0) {
        /* lb_encode's ‖cb[idx]‖: the float sum in order */
        float nn = 0;
        for (int e = 0; e < 128; e++) nn = __fadd_rn(nn, __fmul_rn(tab.cb[idx[t + e]], tab.cb[idx[t + e]]));
        *(__half *)blk = __float2half_rn(__fdiv_rn(norm, __fsqrt_rn(nn)));
    }
    /* thread 8g packs codes 8g .. 8g + 7 (B bytes, code e at bit B e) */
    if ((j & 7) == 0) {
        uint32_t w = 0;
#pragma unroll
        for (int e = 0; e < 8; e++) w |= (uint32_t)idx[t + e] << (B * e);
#pragma unroll
        for (int e = 0; e < B; e++) blk[2 + (j / 8) * B + e] = (uint8_t)(w >> (8 * e));
    }
}

extern "C" void cuda_tbq_store(const float *d_k, const float *d_v, int ld, void *d_kc, void *d_vc, int fmt,
                               const int *d_pos, int n, int nkv, int hd, int cap) {
    const int bits = code_bits_of(fmt);
    TbqTab tab;
    tbq_cuda_tab(bits, &tab);
    const dim3 g(n, nkv, 2), blk(hd);
    uint8_t *kc = (uint8_t *)d_kc, *vc = (uint8_t *)d_vc;
    if (bits == 2) pdl_launch(tbq_store_kernel<2>, g, blk, d_k, d_v, ld, kc, vc, d_pos, hd, cap, tab);
    else if (bits == 3) pdl_launch(tbq_store_kernel<3>, g, blk, d_k, d_v, ld, kc, vc, d_pos, hd, cap, tab);
    else pdl_launch(tbq_store_kernel<4>, g, blk, d_k, d_v, ld, kc, vc, d_pos, hd, cap, tab);
    cuda_note("tbq KV store");
}
