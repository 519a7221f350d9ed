/* matmul.cu: the GPU twin of kernels/matmul.c's matmul_ref,
 * y [n, rows] = x [n, cols] W^T, W [rows, cols] in its stored dtype
 * (bf16, f16, f32) in device memory, x and y f32.
 *
 * Decode and verification (n <= 8) are bound by reading W once: one warp
 * per row of W, each lane 16 bytes of it per step (8 bf16 or f16, 4 f32)
 * against the same columns of every row of x (which stays in L1/L2), the
 * n sums in registers and a shuffle tree at the end. Prefill (n > 8) goes
 * through 64 x 64 output tiles staged in shared memory 16 columns at a
 * time, each thread a 4 x 4 block of outputs.
 *
 * Every product is the C reference's (the widening is exact); the order of
 * the f32 sums differs, so results agree to rounding, not to the bit.
 */
#include "kernels/cuda.h"
#include "kernels/cuda_common.cuh"

#define GEMV_WARPS 8
#define GEMV_MAX_N 8

/* 8 consecutive weights from W (16 bytes of bf16/f16, 32 of f32) as f32. */
template <int DT> __device__ __forceinline__ void load8(const void *W, size_t at, float w[8]) {
    if (DT == CUDA_F32) {
        const float4 a = __ldcs((const float4 *)((const float *)W + at));
        const float4 b = __ldcs((const float4 *)((const float *)W + at) + 1);
        w[0] = a.x, w[1] = a.y, w[2] = a.z, w[3] = a.w, w[4] = b.x, w[5] = b.y, w[6] = b.z, w[7] = b.w;
    } else {
        /* streamed once per token: evict-first, so x keeps its place in the caches */
        const uint4 u = __ldcs((const uint4 *)((const uint16_t *)W + at));
        const uint32_t p[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            if (DT == CUDA_BF16) {
                w[2 * i] = __uint_as_float(p[i] << 16);
                w[2 * i + 1] = __uint_as_float(p[i] & 0xffff0000u);
            } else {
                w[2 * i] = f16_f32((uint16_t)(p[i] & 0xffff));
                w[2 * i + 1] = f16_f32((uint16_t)(p[i] >> 16));
            }
        }
    }
}

template <int DT, int NT> __global__ void gemv_kernel(float *y, const float *x, const void *W, int rows, int cols) {
    const int lane = threadIdx.x & 31;
    const int r = blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5);
    if (r >= rows) return;
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = 0;
    const size_t base = (size_t)r * cols;
#pragma unroll 4
    for (int c = lane * 8; c < cols; c += 256) {
        float w[8];
        load8<DT>(W, base + c, w);
#pragma unroll
        for (int t = 0; t < NT; t++) {
            const float4 a = *(const float4 *)(x + (size_t)t * cols + c);
            const float4 b = *(const float4 *)(x + (size_t)t * cols + c + 4);
            float s = acc[t];
            s = fmaf(a.x, w[0], s), s = fmaf(a.y, w[1], s), s = fmaf(a.z, w[2], s), s = fmaf(a.w, w[3], s);
            s = fmaf(b.x, w[4], s), s = fmaf(b.y, w[5], s), s = fmaf(b.z, w[6], s), s = fmaf(b.w, w[7], s);
            acc[t] = s;
        }
    }
#pragma unroll
    for (int t = 0; t < NT; t++) {
        const float s = warp_sum(acc[t]);
        if (lane == 0) y[(size_t)t * rows + r] = s;
    }
}

/* Tiles of 64 tokens x 64 rows of W, 16 columns per stage; thread (tx,
 * ty) of 16 x 16 owns rows r0 + 4 tx .. + 3 of tokens t0 + 4 ty .. + 3.
 * Shared rows are padded by one word against bank conflicts. */
template <int DT> __global__ void gemm_kernel(float *y, const float *x, const void *W, int rows, int cols, int n) {
    __shared__ float xs[16][64 + 1], ws[16][64 + 1];
    const int t0 = blockIdx.y * 64, r0 = blockIdx.x * 64;
    const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
    float acc[4][4] = {};
    for (int k0 = 0; k0 < cols; k0 += 16) {
        for (int e = threadIdx.x; e < 64 * 16; e += 256) {
            const int a = e >> 4, kk = e & 15, k = k0 + kk;
            xs[kk][a] = t0 + a < n && k < cols ? x[(size_t)(t0 + a) * cols + k] : 0.0f;
            ws[kk][a] = r0 + a < rows && k < cols ? weight_at(W, DT, (size_t)(r0 + a) * cols + k) : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < 16; kk++) {
            float a[4], b[4];
#pragma unroll
            for (int i = 0; i < 4; i++) a[i] = xs[kk][ty * 4 + i], b[i] = ws[kk][tx * 4 + i];
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int t = t0 + ty * 4 + i, r = r0 + tx * 4 + j;
            if (t < n && r < rows) y[(size_t)t * rows + r] = acc[i][j];
        }
}

template <int DT> static void gemv(float *y, const float *x, const void *W, int rows, int cols, int n) {
    const dim3 g((rows + GEMV_WARPS - 1) / GEMV_WARPS), b(32 * GEMV_WARPS);
    switch (n) {
    case 1: gemv_kernel<DT, 1><<<g, b, 0, g_stream>>>(y, x, W, rows, cols); break;
    case 2: gemv_kernel<DT, 2><<<g, b, 0, g_stream>>>(y, x, W, rows, cols); break;
    case 3: gemv_kernel<DT, 3><<<g, b, 0, g_stream>>>(y, x, W, rows, cols); break;
    case 4: gemv_kernel<DT, 4><<<g, b, 0, g_stream>>>(y, x, W, rows, cols); break;
    case 5: gemv_kernel<DT, 5><<<g, b, 0, g_stream>>>(y, x, W, rows, cols); break;
    case 6: gemv_kernel<DT, 6><<<g, b, 0, g_stream>>>(y, x, W, rows, cols); break;
    case 7: gemv_kernel<DT, 7><<<g, b, 0, g_stream>>>(y, x, W, rows, cols); break;
    default: gemv_kernel<DT, 8><<<g, b, 0, g_stream>>>(y, x, W, rows, cols); break;
    }
}

extern "C" void cuda_matmul(float *d_y, const float *d_x, const void *d_W, int dtype, int rows, int cols, int n) {
    if (n <= GEMV_MAX_N) {
        if (dtype == CUDA_BF16) gemv<CUDA_BF16>(d_y, d_x, d_W, rows, cols, n);
        else if (dtype == CUDA_F16) gemv<CUDA_F16>(d_y, d_x, d_W, rows, cols, n);
        else gemv<CUDA_F32>(d_y, d_x, d_W, rows, cols, n);
        cuda_note("matmul (gemv)");
        return;
    }
    const dim3 g((rows + 63) / 64, (n + 63) / 64);
    if (dtype == CUDA_BF16) gemm_kernel<CUDA_BF16><<<g, 256, 0, g_stream>>>(d_y, d_x, d_W, rows, cols, n);
    else if (dtype == CUDA_F16) gemm_kernel<CUDA_F16><<<g, 256, 0, g_stream>>>(d_y, d_x, d_W, rows, cols, n);
    else gemm_kernel<CUDA_F32><<<g, 256, 0, g_stream>>>(d_y, d_x, d_W, rows, cols, n);
    cuda_note("matmul (tiled)");
}
