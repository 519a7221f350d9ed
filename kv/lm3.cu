/* lm3.cu: the GPU twin of lm3's append (kv/lm3.c): each token's key and
 * value rows coded as 3-bit Lloyd-Max indices of x / ‖x‖ behind their fp32
 * norm, byte for byte what the CPU writes for the same rows.
 *
 * Data flow: model/gpu.c runs cuda_qk_rope_store (which leaves the roped
 * keys in place in the q|k|v rows when the cache is lm3), then
 * cuda_lm3_store, then the attention (attn/attn.cu), which reads the codes
 * in place with no domain change. One vector per position, the positions
 * rounded up to 32 (head dim 128 on the GPU):
 *
 *   | fp32 r | 8 indices per 24-bit LE word, index k at bits 3k |   52 B
 *   r = sqrt of the double sum of squares, in order; idx_j = #{m : x_j / r > mid_m}
 *
 * The codebook is tbq3's at 128 values (kv/tbq.cuh's table: c / √128).
 * Follows atcuality2021/manthanquant (spec kv_schemes.md, row lm3).
 */
#include "kernels/cuda.h"
#include "kernels/cuda_common.cuh"
#include "kv/tbq.cuh"

/* Block (token i, kv head h, role) of hd threads, thread t on element t of
 * the key (role 0, roped in place) or the value. */
__global__ void lm3_store_kernel(const float *k, const float *v, int ld, uint8_t *kc, uint8_t *vc, const int *d_pos,
                                 int hd, int cap, TbqTab tab) {
    __shared__ float x[512];
    __shared__ uint8_t idx[512];
    __shared__ float nrm;
    pdl_wait();
    const int i = blockIdx.x, h = blockIdx.y, role = blockIdx.z, t = threadIdx.x;
    const int pos = *d_pos + i;
    x[t] = (role ? v : k)[(size_t)i * ld + (size_t)h * hd + t];
    __syncthreads();
    uint8_t *vec = (role ? vc : kc) + kv_stream_bytes(CUDA_KV_LM3, hd, cap) * h + (size_t)pos * (4 + 3 * hd / 8);
    if (t == 0) {
        /* the C's double sum in order (the product of two floats is exact in double) */
        double ss = 0;
        for (int e = 0; e < hd; e++) ss = __dadd_rn(ss, __dmul_rn((double)x[e], (double)x[e]));
        nrm = __double2float_rn(__dsqrt_rn(ss));
        *(float *)vec = nrm;
    }
    __syncthreads();
    const float inv = nrm > 1e-10f ? __fdiv_rn(1.0f, nrm) : 0.0f, u = __fmul_rn(x[t], inv);
    int c = 0;
#pragma unroll
    for (int m = 0; m < 7; m++) c += u > tab.mid[m];
    idx[t] = (uint8_t)c;
    __syncthreads();
    if (t % 8) return;
    uint32_t w = 0;
#pragma unroll
    for (int e = 0; e < 8; e++) w |= (uint32_t)idx[t + e] << (3 * e);
#pragma unroll
    for (int e = 0; e < 3; e++) vec[4 + 3 * (t / 8) + e] = (uint8_t)(w >> (8 * e));
}

extern "C" void cuda_lm3_store(const float *d_k, const float *d_v, int ld, void *d_kc, void *d_vc, const int *d_pos,
                               int n, int nkv, int hd, int cap) {
    TbqTab tab;
    tbq_cuda_tab(3, &tab);
    pdl_launch(lm3_store_kernel, dim3(n, nkv, 2), dim3(hd), d_k, d_v, ld, (uint8_t *)d_kc, (uint8_t *)d_vc, d_pos, hd,
               cap, tab);
    cuda_note("lm3 KV store");
}
