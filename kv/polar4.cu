/* polar4.cu: the GPU twin of polar4's append (kv/polar4.c): each token's
 * key and value rows normalised, rotated by the layer's dense rotation R
 * and coded as 4-bit Lloyd-Max indices behind their fp32 norm, byte for
 * byte what the CPU writes for the same rows.
 *
 * Data flow: model/gpu.c runs cuda_qk_rope_store (which leaves the roped
 * keys in place in the q|k|v rows when the cache is polar4), then
 * cuda_polar4_store, which also rotates the queries by R in place (once
 * per token and kv head, for all the heads of its group), then the
 * attention (attn/attn.cu), which reads the codes in place and rotates the
 * output back by Rᵀ. One vector per position, the positions rounded up to
 * 32 (head dim 128 on the GPU):
 *
 *   | fp32 γ | qs[64]: qs[j/2] = idx[j] | idx[j+1] << 4 |   68 B
 *   γ = √(double Σ x² in order + 1e-12), y = (x / γ)·R, idx_j = #{m : y_j > mid_m}
 *
 * The codebook is tbq4's (kv/tbq.cuh's table: c / √128); R comes from
 * polar4_rotation (kv/polar4.h). Spec kv_schemes.md, row polar4.
 */
#include "kernels/cuda.h"
#include "kernels/cuda_common.cuh"
#include "kv/tbq.cuh"

/* Block (token i, kv head h, role) of 128 threads, thread t on element t
 * of the key (role 0, roped in place) or the value (1); role 2 rotates the
 * gqa query heads of kv head h in place. */
__global__ void polar4_store_kernel(float *q, const float *k, const float *v, int ld, uint8_t *kc, uint8_t *vc,
                                    const int *d_pos, int gqa, int cap, TbqTab tab) {
    __shared__ float x[16 * 128];
    __shared__ uint8_t idx[128];
    __shared__ float gam;
    pdl_wait();
    const int i = blockIdx.x, h = blockIdx.y, role = blockIdx.z, t = threadIdx.x;
    if (role == 2) {
        /* rows [gqa, 128]: one read of R serves the whole group */
        float *qh = q + (size_t)i * ld + (size_t)h * gqa * 128;
        for (int e = t; e < gqa * 128; e += 128) x[e] = qh[e];
        polar_rotate_rows<16>(x, gqa, tab.rm);
        for (int e = t; e < gqa * 128; e += 128) qh[e] = x[e];
        return;
    }
    const int pos = *d_pos + i;
    x[t] = (role ? v : k)[(size_t)i * ld + (size_t)h * 128 + t];
    __syncthreads();
    uint8_t *vec = (role ? vc : kc) + kv_stream_bytes(CUDA_KV_POLAR4, 128, cap) * h + (size_t)pos * 68;
    if (t == 0) {
        /* the C's double sum in order (the product of two floats is exact in double) */
        double ss = 0;
        for (int e = 0; e < 128; e++) ss = __dadd_rn(ss, __dmul_rn((double)x[e], (double)x[e]));
        gam = __double2float_rn(__dsqrt_rn(__dadd_rn(ss, 1e-12)));
        *(float *)vec = gam;
    }
    __syncthreads();
    x[t] = __fdiv_rn(x[t], gam);
    polar_rotate_rows<1>(x, 1, tab.rm); /* its barriers publish x */
    int c = 0;
#pragma unroll
    for (int m = 0; m < 15; m++) c += x[t] > tab.mid[m];
    idx[t] = (uint8_t)c;
    __syncthreads();
    if (t % 2 == 0) vec[4 + t / 2] = (uint8_t)(idx[t] | idx[t + 1] << 4);
}

extern "C" void cuda_polar4_store(float *d_q, int nh, const float *d_k, const float *d_v, int ld, void *d_kc,
                                  void *d_vc, const float *d_rot, const int *d_pos, int n, int nkv, int hd, int cap) {
    (void)hd; /* 128: model/gpu.c refuses polar4 at other head dims */
    TbqTab tab;
    tbq_cuda_tab(4, &tab);
    tab.rm = d_rot;
    pdl_launch(polar4_store_kernel, dim3(n, nkv, d_q ? 3 : 2), dim3(128), d_q, d_k, d_v, ld, (uint8_t *)d_kc,
               (uint8_t *)d_vc, d_pos, nh / nkv, cap, tab);
    cuda_note("polar4 KV store");
}
