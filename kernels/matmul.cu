/* matmul.cu: the GPU twin of kernels/matmul.c's matmul_ref,
 * y [n, rows] = x [n, cols] W^T, W [rows, cols] in its stored dtype
 * (bf16, f16, f32) or as q8 blocks (-wq q8; kernels/cuda.h) in device
 * memory, x and y f32; or y += x W^T, the residual add that follows
 * o_proj and down_proj done as each sum is stored (the CPU adds the same
 * sum to the same value).
 *
 * Decode and verification (n <= 8) are bound by reading W once: a warp
 * (or a few, for matrices of few rows) per row of W, each lane 8 weights
 * of it per step (16 bytes of bf16 or f16, 32 of f32, 8 q8 codes and their
 * block's scale) against the same columns of every row
 * of x (which stays in L1/L2), the n sums in registers and a shuffle tree
 * at the end. cuda_matvec also takes the RMSNorm before q|k|v and
 * gate|up, and the SwiGLU after gate|up, into the same pass, which saves
 * a decode step two thirds of its small launches.
 *
 * Prefill (n > 8) of bf16 weights runs on the tensor cores (WMMA, bf16
 * inputs, f32 sums) without giving up f32 inputs: each x is split into
 * three bf16 parts, x = hi + mid + lo exactly (8 + 8 + 8 bits of
 * mantissa), and W is multiplied by each, products of bf16 being exact in
 * f32 (the "bf16x3" of Henry, Tang and Heinecke, "Leveraging the bfloat16
 * Artificial Intelligence Datatype For Higher-Precision Computations",
 * 2019). q8 weights (-wq q8, CUDA_Q8) take the same split of x against
 * their integer codes, a q8 block's sum at a time, then its scale
 * (gemm_q8_kernel). Other dtypes, and shapes off the 64 x 64 x 32 tiles,
 * go through f32 tiles staged in shared memory, each thread a 4 x 4 block
 * of outputs.
 *
 * The widening is exact, but the sums are f32 fmas in another order than
 * the C reference's multiply-adds, so results agree to rounding, not to
 * the bit.
 */
#include <cuda_bf16.h>
#include <mma.h>

#include "kernels/cuda.h"
#include "kernels/cuda_common.cuh"

#define GEMV_WARPS 8

/* Bytes of one weight of dtype DT (a q8 code; its scale aside). */
template <int DT> __device__ constexpr int wsize() { return DT == CUDA_F32 ? 4 : DT == CUDA_Q8 ? 1 : 2; }

/* 8 consecutive weights from W (16 bytes of bf16/f16, 32 of f32, 8 q8
 * codes and their block's scale from sc) as f32: a q8 weight is its code
 * times its scale rounded once, as matmul_ref's widening. */
template <int DT> __device__ __forceinline__ void load8(const void *W, const float *sc, size_t at, float w[8]) {
    if (DT == CUDA_Q8) {
        /* the 8 codes lie in one block of 32: at is a multiple of 8; 8
         * bytes a lane, which measured faster than 16 (docs/cuda.md) */
        const uint2 u = __ldcs((const uint2 *)((const int8_t *)W + at));
        const float d = __ldg(sc + (at >> 5));
#pragma unroll
        for (int i = 0; i < 4; i++) {
            w[i] = __fmul_rn((float)(int8_t)(u.x >> (8 * i)), d);
            w[4 + i] = __fmul_rn((float)(int8_t)(u.y >> (8 * i)), d);
        }
    } else if (DT == CUDA_F32) {
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

/* Block of 8 warps, ks warps per output row (each a slice of the
 * columns: more warps in flight for matrices of few rows), NT >= n rows of
 * x. XM: x as it is, or RMSNormed with nw on the fly (each block first
 * finds each row's 1 / rms exactly as rmsnorm_kernel does, same order, so
 * the products are those of cuda_rmsnorm then the plain matmul). PAIR: W's
 * rows interleave gate and up (2i, 2i + 1); output i is silu(gate) * up of
 * their two sums, as cuda_swiglu computes it. */
template <int DT, int NT, int XM, int PAIR>
__global__ void __launch_bounds__(32 * GEMV_WARPS) gemv_kernel(float *y, const float *x, const float *nw, float eps,
                                                             const void *W, int rows, int cols, int n, int ks,
                                                             int add) {
    __shared__ double sh[32];
    __shared__ float inv[NT], red[GEMV_WARPS][2 * NT];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int r = blockIdx.x * (GEMV_WARPS / ks) + warp / ks, slice = warp % ks;
    /* q8: the scales follow the codes of all of W's rows */
    const float *sc = DT == CUDA_Q8 ? (const float *)((const int8_t *)W + (size_t)(PAIR ? 2 * rows : rows) * cols)
                                    : nullptr;
    /* the first stretch of this warp's row into L2 while the kernel before
     * finishes (pdl_wait) and the norm is found */
    if (r < rows)
        for (int p = 0; p <= PAIR; p++)
            for (int c = (slice * 32 + lane) * 8, i = 0; c < cols && i < 4; c += 256 * ks, i++) {
                const size_t at = ((size_t)((PAIR ? 2 * r : r) + p) * cols + c) * wsize<DT>();
                asm volatile("prefetch.global.L2 [%0];" ::"l"((const char *)W + at));
            }
    pdl_wait();
    if (XM) {
        for (int t = 0; t < n; t++) {
            double ss = 0;
            const float *xt = x + (size_t)t * cols;
            for (int j = threadIdx.x; j < cols; j += blockDim.x) ss += (double)xt[j] * xt[j];
            ss = block_sum_d(ss, sh);
            if (threadIdx.x == 0) inv[t] = (float)(1.0 / sqrt(ss / cols + (double)eps));
        }
        __syncthreads();
    }
    float acc[PAIR + 1][NT];
#pragma unroll
    for (int p = 0; p <= PAIR; p++)
#pragma unroll
        for (int t = 0; t < NT; t++) acc[p][t] = 0;
    if (r < rows) {
        const size_t base = (size_t)(PAIR ? 2 * r : r) * cols;
#pragma unroll 4
        for (int c = (slice * 32 + lane) * 8; c < cols; c += 256 * ks) {
            float w[PAIR + 1][8];
            load8<DT>(W, sc, base + c, w[0]);
            if (PAIR) load8<DT>(W, sc, base + cols + c, w[PAIR]);
#pragma unroll
            for (int t = 0; t < NT; t++)
                if (t < n) {
                    const float4 a = *(const float4 *)(x + (size_t)t * cols + c);
                    const float4 b = *(const float4 *)(x + (size_t)t * cols + c + 4);
                    float v[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
                    if (XM) {
                        const float4 g0 = *(const float4 *)(nw + c), g1 = *(const float4 *)(nw + c + 4);
                        const float g[8] = {g0.x, g0.y, g0.z, g0.w, g1.x, g1.y, g1.z, g1.w};
#pragma unroll
                        for (int e = 0; e < 8; e++) v[e] = __fmul_rn(g[e], __fmul_rn(v[e], inv[t]));
                    }
#pragma unroll
                    for (int p = 0; p <= PAIR; p++) {
                        float s = acc[p][t];
#pragma unroll
                        for (int e = 0; e < 8; e++) s = fmaf(v[e], w[p][e], s);
                        acc[p][t] = s;
                    }
                }
        }
    }
    pdl_release(); /* W is read: the next kernel may start on its own weights */
    /* the warp's sums, then the row's slices in order */
#pragma unroll
    for (int p = 0; p <= PAIR; p++)
#pragma unroll
        for (int t = 0; t < NT; t++) acc[p][t] = warp_sum(acc[p][t]);
    if (ks > 1) {
        if (lane == 0)
#pragma unroll
            for (int p = 0; p <= PAIR; p++)
#pragma unroll
                for (int t = 0; t < NT; t++) red[warp][p * NT + t] = acc[p][t];
        __syncthreads();
        if (slice == 0)
#pragma unroll
            for (int p = 0; p <= PAIR; p++)
#pragma unroll
                for (int t = 0; t < NT; t++) {
                    float s = red[warp][p * NT + t];
                    for (int k = 1; k < ks; k++) s += red[warp + k][p * NT + t];
                    acc[p][t] = s;
                }
    }
    if (r >= rows || slice || lane) return;
#pragma unroll
    for (int t = 0; t < NT; t++)
        if (t < n) {
            float s = acc[0][t];
            if (PAIR) s = __fmul_rn(__fdiv_rn(s, __fadd_rn(1.0f, expf(-s))), acc[PAIR][t]);
            y[(size_t)t * rows + r] = add ? __fadd_rn(y[(size_t)t * rows + r], s) : s;
        }
}

/* Tiles of 64 tokens x 64 rows of W, 16 columns per stage; thread (tx,
 * ty) of 16 x 16 owns rows r0 + 4 tx .. + 3 of tokens t0 + 4 ty .. + 3.
 * Shared rows are padded by one word against bank conflicts. */
template <int DT>
__global__ void gemm_kernel(float *y, const float *x, const void *W, int rows, int cols, int n, int add) {
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
            if (t < n && r < rows)
                y[(size_t)t * rows + r] = add ? __fadd_rn(y[(size_t)t * rows + r], acc[i][j]) : acc[i][j];
        }
}

#define TC_BM 64  /* tokens per block */
#define TC_BN 64  /* rows of W per block */
#define TC_BK 32  /* columns per stage */
#define TC_LD 40  /* bf16 per shared row: 32 + 16 bytes against bank conflicts */
#define TC_CLD 36 /* floats per row of a warp's staged outputs */

/* 64 rows of x from t0 by TC_BK columns from k0 split into three bf16
 * parts, x = As[0] + As[1] + As[2] exactly; rows past n are zeros. */
__device__ __forceinline__ void stage_x3(__nv_bfloat16 (*As)[TC_BM][TC_LD], const float *x, int t0, int k0, int n,
                                         int cols) {
    for (int e = threadIdx.x; e < TC_BM * TC_BK / 4; e += blockDim.x) {
        const int tt = e / (TC_BK / 4), c = (e % (TC_BK / 4)) * 4;
        float4 v = make_float4(0, 0, 0, 0);
        if (t0 + tt < n) v = *(const float4 *)(x + (size_t)(t0 + tt) * cols + k0 + c);
        const float f[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            /* each subtraction is exact: the parts sum to f */
            const __nv_bfloat16 hi = __float2bfloat16_rn(f[i]);
            const float r1 = f[i] - __bfloat162float(hi);
            const __nv_bfloat16 mid = __float2bfloat16_rn(r1);
            As[0][tt][c + i] = hi;
            As[1][tt][c + i] = mid;
            As[2][tt][c + i] = __float2bfloat16_rn(r1 - __bfloat162float(mid));
        }
    }
}

/* Block of 4 warps: warp (wm, wn) owns tokens t0 + 32 wm .. and rows
 * r0 + 32 wn .. as 2 x 2 fragments of 16 x 16. Per stage the block splits
 * 64 x 32 of x into As[0..2] and copies 64 x 32 of W into Bs; x rows past
 * n are zeros and their outputs are not stored. */
__global__ void __launch_bounds__(128) gemm_bf16x3_kernel(float *y, const float *x, const uint16_t *W, int rows,
                                                          int cols, int n, int add) {
    using namespace nvcuda;
    __shared__ __align__(32) __nv_bfloat16 As[3][TC_BM][TC_LD];
    __shared__ __align__(32) __nv_bfloat16 Bs[TC_BN][TC_LD];
    __shared__ __align__(32) float Cs[4][32][TC_CLD];
    const int t0 = blockIdx.y * TC_BM, r0 = blockIdx.x * TC_BN;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, wm = warp >> 1, wn = warp & 1;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][2];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 2; j++) wmma::fill_fragment(acc[i][j], 0.0f);
    for (int k0 = 0; k0 < cols; k0 += TC_BK) {
        stage_x3(As, x, t0, k0, n, cols);
        for (int e = threadIdx.x; e < TC_BN * TC_BK / 8; e += 128) {
            const int rr = e / (TC_BK / 8), c = (e % (TC_BK / 8)) * 8;
            *(uint4 *)&Bs[rr][c] = __ldcs((const uint4 *)(W + (size_t)(r0 + rr) * cols + k0 + c));
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < TC_BK; kk += 16) {
            /* B = W^T: column j of B is row j of W, so Bs read col-major */
            wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> b[2];
#pragma unroll
            for (int j = 0; j < 2; j++) wmma::load_matrix_sync(b[j], &Bs[wn * 32 + j * 16][kk], TC_LD);
#pragma unroll
            for (int p = 0; p < 3; p++)
#pragma unroll
                for (int i = 0; i < 2; i++) {
                    wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a;
                    wmma::load_matrix_sync(a, &As[p][wm * 32 + i * 16][kk], TC_LD);
#pragma unroll
                    for (int j = 0; j < 2; j++) wmma::mma_sync(acc[i][j], a, b[j], acc[i][j]);
                }
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 2; j++)
            wmma::store_matrix_sync(&Cs[warp][i * 16][j * 16], acc[i][j], TC_CLD, wmma::mem_row_major);
    __syncwarp();
    for (int e = lane; e < 32 * 32; e += 32) {
        const int t = t0 + wm * 32 + e / 32, r = r0 + wn * 32 + e % 32;
        if (t < n) {
            const float v = Cs[warp][e / 32][e % 32];
            y[(size_t)t * rows + r] = add ? __fadd_rn(y[(size_t)t * rows + r], v) : v;
        }
    }
}

/* One m16n8k16 product on the tensor cores, bf16 in, f32 sums: c += a b.
 * Fragments as the PTX ISA lays them out (g = lane / 4, t = lane % 4):
 * a0..a3 hold A's (row g, cols 2t, 2t + 1), (g + 8, 2t ..), (g, 2t + 8 ..),
 * (g + 8, 2t + 8 ..); b0, b1 B's (rows 2t, 2t + 1 | 2t + 8, 2t + 9; col g);
 * c0..c3 C's (g, 2t), (g, 2t + 1), (g + 8, 2t), (g + 8, 2t + 1). */
__device__ __forceinline__ void mma_bf16(float c[4], const uint32_t a[4], const uint32_t b[2]) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

/* Prefill over q8 weights (-wq q8) on the tensor cores. A stage is one
 * q8 block: 32 columns, where every row of W has one scale. A code is an
 * integer of 8 bits, exact in bf16, and x is split as in the bf16x3
 * kernel, so each stage's sum over its 32 columns, sum_j x_j q_j, is the
 * exact products' f32 sum; it is then scaled by the row's d and added:
 *   y[t][r] = sum over blocks b of d[r][b] * (sum_{j in b} x[t][j] q[r][j])
 * Tiles of 64 tokens x 64 rows as gemm_bf16x3_kernel's, by mma.sync, whose
 * accumulator layout (unlike WMMA's) says which row each sum belongs to.
 * Any rows and n; cols a multiple of 32. */
__global__ void __launch_bounds__(128) gemm_q8_kernel(float *y, const float *x, const int8_t *W, int rows, int cols,
                                                      int n, int add) {
    __shared__ __align__(16) __nv_bfloat16 As[3][TC_BM][TC_LD];
    __shared__ __align__(16) __nv_bfloat16 Bs[TC_BN][TC_LD];
    __shared__ float ds[TC_BN];
    const float *sc = (const float *)(W + (size_t)rows * cols);
    const int t0 = blockIdx.y * TC_BM, r0 = blockIdx.x * TC_BN, nb = cols / 32;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, wm = warp >> 1, wn = warp & 1;
    const int g = lane >> 2, t = lane & 3;
    /* warp (wm, wn): tokens t0 + 32 wm + 16 i .., rows r0 + 32 wn + 8 j .. */
    float acc[2][4][4] = {};
    static_assert(TC_BK == 32, "a stage is one q8 block");
    for (int k0 = 0; k0 < cols; k0 += TC_BK) {
        stage_x3(As, x, t0, k0, n, cols);
        {
            /* 64 rows of 32 codes: 16 per thread, widened to bf16 pairs */
            const int rr = threadIdx.x >> 1, c = (threadIdx.x & 1) * 16;
            uint4 u = make_uint4(0, 0, 0, 0);
            if (r0 + rr < rows) u = __ldcs((const uint4 *)(W + (size_t)(r0 + rr) * cols + k0 + c));
            const uint32_t p[4] = {u.x, u.y, u.z, u.w};
            uint32_t o[8];
#pragma unroll
            for (int i = 0; i < 8; i++) {
                const uint32_t lo = __float_as_uint((float)(int8_t)(p[i / 2] >> (16 * (i & 1))));
                const uint32_t hi = __float_as_uint((float)(int8_t)(p[i / 2] >> (16 * (i & 1) + 8)));
                o[i] = (lo >> 16) | (hi & 0xffff0000u);
            }
            *(uint4 *)&Bs[rr][c] = make_uint4(o[0], o[1], o[2], o[3]);
            *(uint4 *)&Bs[rr][c + 8] = make_uint4(o[4], o[5], o[6], o[7]);
            if (threadIdx.x < TC_BN)
                ds[threadIdx.x] = r0 + threadIdx.x < rows ? sc[(size_t)(r0 + threadIdx.x) * nb + k0 / 32] : 0.0f;
        }
        __syncthreads();
        float s[2][4][4] = {};
#pragma unroll
        for (int kk = 0; kk < 32; kk += 16) {
            uint32_t b[4][2];
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const __nv_bfloat16 *br = &Bs[wn * 32 + j * 8 + g][kk + 2 * t];
                b[j][0] = *(const uint32_t *)br, b[j][1] = *(const uint32_t *)(br + 8);
            }
#pragma unroll
            for (int p = 0; p < 3; p++)
#pragma unroll
                for (int i = 0; i < 2; i++) {
                    const __nv_bfloat16 *ar = &As[p][wm * 32 + i * 16 + g][kk + 2 * t];
                    const uint32_t a[4] = {*(const uint32_t *)ar, *(const uint32_t *)(ar + 8 * TC_LD),
                                           *(const uint32_t *)(ar + 8), *(const uint32_t *)(ar + 8 * TC_LD + 8)};
#pragma unroll
                    for (int j = 0; j < 4; j++) mma_bf16(s[i][j], a, b[j]);
                }
        }
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const float d0 = ds[wn * 32 + j * 8 + 2 * t], d1 = ds[wn * 32 + j * 8 + 2 * t + 1];
#pragma unroll
            for (int i = 0; i < 2; i++) {
                acc[i][j][0] = fmaf(s[i][j][0], d0, acc[i][j][0]);
                acc[i][j][1] = fmaf(s[i][j][1], d1, acc[i][j][1]);
                acc[i][j][2] = fmaf(s[i][j][2], d0, acc[i][j][2]);
                acc[i][j][3] = fmaf(s[i][j][3], d1, acc[i][j][3]);
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int h = 0; h < 4; h++) {
                const int tok = t0 + wm * 32 + i * 16 + g + (h >> 1) * 8, r = r0 + wn * 32 + j * 8 + 2 * t + (h & 1);
                if (tok < n && r < rows) {
                    float *o = y + (size_t)tok * rows + r;
                    *o = add ? __fadd_rn(*o, acc[i][j][h]) : acc[i][j][h];
                }
            }
}

/* Warps per output row: enough warps over the GPU (4096) for short
 * matrices, at most 8. */
static int warps_per_row(int rows) {
    int ks = 1;
    while (ks < GEMV_WARPS && rows * ks < 4096) ks *= 2;
    return ks;
}

template <int DT, int NT>
static void gemv_nt(float *y, const float *x, int xmode, const float *nw, float eps, const void *W, int rows, int cols,
                    int n, int pair, int add) {
    /* as for W's own rows, so that a pair's sums are those of the plain matmul */
    const int ks = warps_per_row(pair ? 2 * rows : rows), rpb = GEMV_WARPS / ks;
    const dim3 g((rows + rpb - 1) / rpb), b(32 * GEMV_WARPS);
    if (xmode && pair) pdl_launch(gemv_kernel<DT, NT, 1, 1>, g, b, y, x, nw, eps, W, rows, cols, n, ks, add);
    else if (xmode) pdl_launch(gemv_kernel<DT, NT, 1, 0>, g, b, y, x, nw, eps, W, rows, cols, n, ks, add);
    else if (pair) pdl_launch(gemv_kernel<DT, NT, 0, 1>, g, b, y, x, nw, eps, W, rows, cols, n, ks, add);
    else pdl_launch(gemv_kernel<DT, NT, 0, 0>, g, b, y, x, nw, eps, W, rows, cols, n, ks, add);
}

template <int DT>
static void gemv(float *y, const float *x, int xmode, const float *nw, float eps, const void *W, int rows, int cols,
                 int n, int pair, int add) {
    if (n == 1) gemv_nt<DT, 1>(y, x, xmode, nw, eps, W, rows, cols, n, pair, add);
    else if (n == 2) gemv_nt<DT, 2>(y, x, xmode, nw, eps, W, rows, cols, n, pair, add);
    else if (n <= 4) gemv_nt<DT, 4>(y, x, xmode, nw, eps, W, rows, cols, n, pair, add);
    else gemv_nt<DT, 8>(y, x, xmode, nw, eps, W, rows, cols, n, pair, add);
}

extern "C" void cuda_matvec(float *d_y, const float *d_x, int xmode, const float *d_nw, float eps, const void *d_W,
                            int dtype, int rows, int cols, int n, int pair, int add) {
    const int out = pair ? rows / 2 : rows;
    if (dtype == CUDA_BF16) gemv<CUDA_BF16>(d_y, d_x, xmode, d_nw, eps, d_W, out, cols, n, pair, add);
    else if (dtype == CUDA_Q8) gemv<CUDA_Q8>(d_y, d_x, xmode, d_nw, eps, d_W, out, cols, n, pair, add);
    else if (dtype == CUDA_F16) gemv<CUDA_F16>(d_y, d_x, xmode, d_nw, eps, d_W, out, cols, n, pair, add);
    else gemv<CUDA_F32>(d_y, d_x, xmode, d_nw, eps, d_W, out, cols, n, pair, add);
    cuda_note("matmul (gemv)");
}

extern "C" void cuda_matmul(float *d_y, const float *d_x, const void *d_W, int dtype, int rows, int cols, int n,
                            int add) {
    if (n <= CUDA_MATVEC_MAX) {
        cuda_matvec(d_y, d_x, 0, NULL, 0, d_W, dtype, rows, cols, n, 0, add);
        return;
    }
    const dim3 g((rows + 63) / 64, (n + 63) / 64);
    if (dtype == CUDA_Q8) {
        gemm_q8_kernel<<<g, 128, 0, g_stream>>>(d_y, d_x, (const int8_t *)d_W, rows, cols, n, add);
        cuda_note("matmul (q8, tensor cores)");
        return;
    }
    if (dtype == CUDA_BF16 && rows % TC_BN == 0 && cols % TC_BK == 0) {
        gemm_bf16x3_kernel<<<g, 128, 0, g_stream>>>(d_y, d_x, (const uint16_t *)d_W, rows, cols, n, add);
        cuda_note("matmul (tensor cores)");
        return;
    }
    if (dtype == CUDA_BF16) gemm_kernel<CUDA_BF16><<<g, 256, 0, g_stream>>>(d_y, d_x, d_W, rows, cols, n, add);
    else if (dtype == CUDA_F16) gemm_kernel<CUDA_F16><<<g, 256, 0, g_stream>>>(d_y, d_x, d_W, rows, cols, n, add);
    else gemm_kernel<CUDA_F32><<<g, 256, 0, g_stream>>>(d_y, d_x, d_W, rows, cols, n, add);
    cuda_note("matmul (tiled)");
}
