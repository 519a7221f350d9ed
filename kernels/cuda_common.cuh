/* cuda_common.cuh: what the .cu files share: the stream every launcher
 * runs on, the launch-error note, programmatic dependent launch, weight
 * element loads widened to f32 exactly as the CPU widens them (bf16: the 16
 * bits shifted up; f16: the hardware conversion, exact), a KV stream's
 * size, and warp and block sums. */
#ifndef CUDA_COMMON_CUH
#define CUDA_COMMON_CUH

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "kernels/cuda.h"

extern cudaStream_t g_stream;
/* Records the first failed launch with the op's name (kernels/cuda.cu). */
void cuda_note(const char *op);
/* Records op's launch as refused (a caller broke a launcher's contract),
 * for cuda_sync to report as cudaErrorInvalidValue. */
void cuda_refuse(const char *op);

/* Programmatic dependent launch (compute capability 9.0 and up, on unless
 * RUN_CUDA_PDL=0): a kernel launched by pdl_launch may be scheduled while
 * the one before it still runs, from the moment every block of that one
 * has called pdl_release (or exited). It must call pdl_wait, which returns
 * once the one before has finished and its writes are visible, before it
 * reads or writes anything but constant weights: what comes before the
 * wait (a matmul's first weights into L2) overlaps the previous kernel's
 * tail and the launch. Without it both are no-ops and launches are plain. */
extern int g_pdl;
/* Whether the loaded kernels hold griddepcontrol (compiled for 9.0 or
 * later: a newer GPU running PTX of 8.0 would launch them as dependents
 * that never wait); kernels/ops.cu asks its embedding kernel. */
int cuda_pdl_compiled(void);
__device__ __forceinline__ void pdl_wait(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_release(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
template <typename... P, typename... A> static void pdl_launch(void (*k)(P...), dim3 grid, dim3 block, A... a) {
    cudaLaunchAttribute at;
    at.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid, cfg.blockDim = block, cfg.dynamicSmemBytes = 0, cfg.stream = g_stream;
    cfg.attrs = &at, cfg.numAttrs = g_pdl ? 1 : 0;
    cudaLaunchKernelEx(&cfg, k, (P)a...);
}

__device__ __forceinline__ float bf16_f32(uint16_t b) { return __uint_as_float((uint32_t)b << 16); }
__device__ __forceinline__ float f16_f32(uint16_t h) { return __half2float(__ushort_as_half(h)); }

/* Element j of a weight row of dtype (CUDA_F32, CUDA_F16, CUDA_BF16). */
__device__ __forceinline__ float weight_at(const void *W, int dtype, size_t j) {
    if (dtype == 0) return ((const float *)W)[j];
    uint16_t u = ((const uint16_t *)W)[j];
    return dtype == 1 ? f16_f32(u) : bf16_f32(u);
}

/* Bytes of one KV stream of cap positions in format fmt (kernels/cuda.h):
 * q8 in tiles of 16 positions, 17 hd bytes each; tbq (b bits) 2 + 16 b
 * bytes per 128 values, q4 / q4h 18 per 32, lm3 4 + 3 hd / 8 per vector
 * and polar4 4 + 64 per 128 values, for cap rounded up to 32 positions. */
__host__ __device__ __forceinline__ size_t kv_stream_bytes(int fmt, int hd, int cap) {
    if (fmt == CUDA_KV_Q8) return (size_t)(cap + 15) / 16 * 17 * hd;
    if (fmt == CUDA_KV_LM3) return (size_t)(cap + 31) / 32 * 32 * (4 + 3 * hd / 8);
    if (fmt == CUDA_KV_POLAR4) return (size_t)(cap + 31) / 32 * 32 * (hd / 128) * 68;
    if (fmt >= CUDA_KV_Q4) return (size_t)(cap + 31) / 32 * 32 * (hd / 32) * 18;
    if (fmt >= CUDA_KV_TBQ2) return (size_t)(cap + 31) / 32 * 32 * (hd / 128) * (2 + 16 * (fmt - CUDA_KV_TBQ2 + 2));
    return (size_t)cap * hd * (fmt == CUDA_KV_F16 ? 2 : 4);
}

/* Sum over a warp, every lane getting it. */
__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ double warp_sum_d(double v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Sum of v over the block (blockDim.x a multiple of 32, at most 1024),
 * every thread getting it; sh holds 32 doubles. */
__device__ __forceinline__ double block_sum_d(double v, double *sh) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    v = warp_sum_d(v);
    __syncthreads(); /* sh may still be read from a previous call */
    if (lane == 0) sh[w] = v;
    __syncthreads();
    double t = 0;
    for (int i = 0; i < (int)(blockDim.x >> 5); i++) t += sh[i];
    return t;
}

#endif
