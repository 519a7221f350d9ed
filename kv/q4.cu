/* q4.cu: the GPU twin of the q4_0 appends of kv/q4.c and kv/q4h.c: each
 * token's key and value rows cut into blocks of 32 and coded as ggml's
 * quantize_row_q4_0_ref codes them, byte for byte, after an unsigned
 * Hadamard rotation of each 128 values for q4h.
 *
 * Data flow: model/gpu.c runs cuda_qk_rope_store (which leaves the roped
 * keys in place in the q|k|v rows when the cache is q4 or q4h), then
 * cuda_q4_store, then the attention (attn/attn.cu), which reads the
 * nibbles in place (q4h in the rotated domain). A stream is the CPU's,
 * one row of hd / 32 blocks per position, positions rounded up to 32:
 *
 *   block: | fp16 d | qs[16]: value j low nibble of qs[j], j + 16 high |   18 B per 32
 *   m = the value of largest |x| (the first on ties), d = m / -8,
 *   code = min(15, (int8)(x · (1/d) + 8.5))
 *
 * As the C: the products and the sum rounded one at a time, the division
 * correctly rounded, the conversion to an integer truncating, fp16 to
 * nearest even; q4h's rotation is kv/hadamard.c's butterflies (kv/tbq.cuh).
 * Spec kv_schemes.md, rows q4 and q4h.
 */
#include <cuda_fp16.h>
#include <math.h>

#include "kernels/cuda.h"
#include "kernels/cuda_common.cuh"
#include "kv/tbq.cuh"

/* Block (token i, kv head h, role) of hd threads, thread t on element t of
 * the key (role 0, roped in place) or the value; thread 32 b codes block b
 * on its own (32 values: the C's first-maximum scan, in order). */
__global__ void q4_store_kernel(const float *k, const float *v, int ld, uint8_t *kc, uint8_t *vc, const int *d_pos,
                                int hd, int cap, int fmt, float hinv) {
    __shared__ float x[512];
    const uint32_t none[4] = {0, 0, 0, 0};
    pdl_wait();
    const int i = blockIdx.x, h = blockIdx.y, role = blockIdx.z, t = threadIdx.x;
    const int pos = *d_pos + i;
    x[t] = (role ? v : k)[(size_t)i * ld + (size_t)h * hd + t];
    __syncthreads();
    /* q4h: H x / √128 per 128 values (no signs; its own inverse) */
    if (fmt == CUDA_KV_Q4H) tbq_rotate_rows(x, hd, none, none, hinv);
    if (t % 32) return;
    const float *xb = x + t;
    float amax = 0, m = 0;
    for (int j = 0; j < 32; j++)
        if (amax < fabsf(xb[j])) amax = fabsf(xb[j]), m = xb[j];
    const float d = __fdiv_rn(m, -8.0f), id = d != 0.0f ? __fdiv_rn(1.0f, d) : 0.0f;
    uint8_t *blk = (role ? vc : kc) + kv_stream_bytes(fmt, hd, cap) * h + (size_t)pos * (hd / 32) * 18 + t / 32 * 18;
    *(__half *)blk = __float2half_rn(d);
    for (int j = 0; j < 16; j++) {
        const int a = __float2int_rz(__fadd_rn(__fmul_rn(xb[j], id), 8.5f));
        const int b = __float2int_rz(__fadd_rn(__fmul_rn(xb[j + 16], id), 8.5f));
        blk[2 + j] = (uint8_t)((a < 15 ? a : 15) | (b < 15 ? b : 15) << 4);
    }
}

extern "C" void cuda_q4_store(const float *d_k, const float *d_v, int ld, void *d_kc, void *d_vc, int fmt,
                              const int *d_pos, int n, int nkv, int hd, int cap) {
    pdl_launch(q4_store_kernel, dim3(n, nkv, 2), dim3(hd), d_k, d_v, ld, (uint8_t *)d_kc, (uint8_t *)d_vc, d_pos, hd,
               cap, fmt, 1.0f / sqrtf(128.0f));
    cuda_note("q4 KV store");
}
