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
 * times its scale rounded once, as matmul_ref's widening. A8: W's rows
 * are only 8-byte aligned (a checkpoint read where it is mapped), so the
 * same bytes come in 8-byte loads. */
template <int DT, int A8>
__device__ __forceinline__ void load8(const void *W, const float *sc, size_t at, float w[8]) {
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
    } else if (DT == CUDA_F32 && A8) {
        const float2 *f = (const float2 *)((const float *)W + at);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const float2 a = __ldcs(f + i);
            w[2 * i] = a.x, w[2 * i + 1] = a.y;
        }
    } else if (DT == CUDA_F32) {
        const float4 a = __ldcs((const float4 *)((const float *)W + at));
        const float4 b = __ldcs((const float4 *)((const float *)W + at) + 1);
        w[0] = a.x, w[1] = a.y, w[2] = a.z, w[3] = a.w, w[4] = b.x, w[5] = b.y, w[6] = b.z, w[7] = b.w;
    } else {
        /* streamed once per token: evict-first, so x keeps its place in the caches */
        uint4 u;
        if (A8) {
            const uint2 a = __ldcs((const uint2 *)((const uint16_t *)W + at));
            const uint2 b = __ldcs((const uint2 *)((const uint16_t *)W + at) + 1);
            u = make_uint4(a.x, a.y, b.x, b.y);
        } else u = __ldcs((const uint4 *)((const uint16_t *)W + at));
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

/* What the kernels below take (cuda_matmul_run fills it in): row r of W
 * starts at element r ld of w, a pair's up row at r ld of w2; a q8
 * weight's scale is sc[e / 32] for the weight at element e of w (sc2 for
 * w2); output (token t, row r) is y[t ldy + r ys]. A whole matrix has
 * ld = cols, ldy = rows, ys = 1; the rest is for its parts (cuda.h). */
struct MM {
    float *y;
    const float *x, *nw;
    const void *w, *w2;
    const float *sc, *sc2;
    size_t ld;
    float eps;
    int rows, cols, n, ks, add, ldy, ys;
};

/* Block of 8 warps, ks warps per output row (each a slice of the
 * columns: more warps in flight for matrices of few rows), NT >= n rows of
 * x. XM: x as it is, or RMSNormed with nw on the fly (each block first
 * finds each row's 1 / rms exactly as rmsnorm_kernel does, same order, so
 * the products are those of cuda_rmsnorm then the plain matmul). PAIR:
 * output i is silu(gate) * up of the sums of gate row i (w) and up row i
 * (w2), as cuda_swiglu computes it. A8: 8-byte loads (load8). */
template <int DT, int NT, int XM, int PAIR, int A8>
__global__ void __launch_bounds__(32 * GEMV_WARPS) gemv_kernel(MM a) {
    __shared__ double sh[32];
    __shared__ float inv[NT], red[GEMV_WARPS][2 * NT];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, ks = a.ks, cols = a.cols, n = a.n;
    const int r = blockIdx.x * (GEMV_WARPS / ks) + warp / ks, slice = warp % ks;
    /* row r's first weight, in w and (a pair's up row) in w2 */
    const size_t base = (size_t)r * a.ld;
    /* the first stretch of this warp's row into L2 while the kernel before
     * finishes (pdl_wait) and the norm is found */
    if (r < a.rows)
        for (int p = 0; p <= PAIR; p++)
            for (int c = (slice * 32 + lane) * 8, i = 0; c < cols && i < 4; c += 256 * ks, i++) {
                const char *at = (const char *)(p ? a.w2 : a.w) + (base + c) * wsize<DT>();
                asm volatile("prefetch.global.L2 [%0];" ::"l"(at));
            }
    pdl_wait();
    if (XM) {
        for (int t = 0; t < n; t++) {
            double ss = 0;
            const float *xt = a.x + (size_t)t * cols;
            for (int j = threadIdx.x; j < cols; j += blockDim.x) ss += (double)xt[j] * xt[j];
            ss = block_sum_d(ss, sh);
            if (threadIdx.x == 0) inv[t] = (float)(1.0 / sqrt(ss / cols + (double)a.eps));
        }
        __syncthreads();
    }
    float acc[PAIR + 1][NT];
#pragma unroll
    for (int p = 0; p <= PAIR; p++)
#pragma unroll
        for (int t = 0; t < NT; t++) acc[p][t] = 0;
    if (r < a.rows) {
#pragma unroll 4
        for (int c = (slice * 32 + lane) * 8; c < cols; c += 256 * ks) {
            float w[PAIR + 1][8];
            load8<DT, A8>(a.w, a.sc, base + c, w[0]);
            if (PAIR) load8<DT, A8>(a.w2, a.sc2, base + c, w[PAIR]);
#pragma unroll
            for (int t = 0; t < NT; t++)
                if (t < n) {
                    const float4 x0 = *(const float4 *)(a.x + (size_t)t * cols + c);
                    const float4 x1 = *(const float4 *)(a.x + (size_t)t * cols + c + 4);
                    float v[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
                    if (XM) {
                        const float4 g0 = *(const float4 *)(a.nw + c), g1 = *(const float4 *)(a.nw + c + 4);
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
    if (r >= a.rows || slice || lane) return;
#pragma unroll
    for (int t = 0; t < NT; t++)
        if (t < n) {
            float s = acc[0][t];
            if (PAIR) s = __fmul_rn(__fdiv_rn(s, __fadd_rn(1.0f, expf(-s))), acc[PAIR][t]);
            float *o = a.y + (size_t)t * a.ldy + (size_t)r * a.ys;
            *o = a.add ? __fadd_rn(*o, s) : s;
        }
}

/* Tiles of 64 tokens x 64 rows of W, 16 columns per stage; thread (tx,
 * ty) of 16 x 16 owns rows r0 + 4 tx .. + 3 of tokens t0 + 4 ty .. + 3.
 * Shared rows are padded by one word against bank conflicts. */
template <int DT> __global__ void gemm_kernel(MM a) {
    __shared__ float xs[16][64 + 1], ws[16][64 + 1];
    const int t0 = blockIdx.y * 64, r0 = blockIdx.x * 64, rows = a.rows, cols = a.cols, n = a.n;
    const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
    float acc[4][4] = {};
    for (int k0 = 0; k0 < cols; k0 += 16) {
        for (int e = threadIdx.x; e < 64 * 16; e += 256) {
            const int i = e >> 4, kk = e & 15, k = k0 + kk;
            xs[kk][i] = t0 + i < n && k < cols ? a.x[(size_t)(t0 + i) * cols + k] : 0.0f;
            ws[kk][i] = r0 + i < rows && k < cols ? weight_at(a.w, DT, (size_t)(r0 + i) * a.ld + k) : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < 16; kk++) {
            float u[4], v[4];
#pragma unroll
            for (int i = 0; i < 4; i++) u[i] = xs[kk][ty * 4 + i], v[i] = ws[kk][tx * 4 + i];
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++) acc[i][j] = fmaf(u[i], v[j], acc[i][j]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int t = t0 + ty * 4 + i, r = r0 + tx * 4 + j;
            if (t < n && r < rows) {
                float *o = a.y + (size_t)t * a.ldy + (size_t)r * a.ys;
                *o = a.add ? __fadd_rn(*o, acc[i][j]) : acc[i][j];
            }
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
 * n and W rows past rows (a part of a matrix, whose last tile it need not
 * fill) are zeros, and their outputs are not stored: each output's sum
 * only ever meets its own row and token. A8: W in 8-byte loads. */
template <int A8> __global__ void __launch_bounds__(128) gemm_bf16x3_kernel(MM a) {
    using namespace nvcuda;
    const float *x = a.x;
    const uint16_t *W = (const uint16_t *)a.w;
    const int rows = a.rows, cols = a.cols, n = a.n;
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
            const uint16_t *src = W + (size_t)(r0 + rr) * a.ld + k0 + c;
            uint4 u = make_uint4(0, 0, 0, 0);
            if (r0 + rr < rows && A8) {
                const uint2 lo = __ldcs((const uint2 *)src), hi = __ldcs((const uint2 *)src + 1);
                u = make_uint4(lo.x, lo.y, hi.x, hi.y);
            } else if (r0 + rr < rows) u = __ldcs((const uint4 *)src);
            *(uint4 *)&Bs[rr][c] = u;
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
        if (t < n && r < rows) {
            const float v = Cs[warp][e / 32][e % 32];
            float *o = a.y + (size_t)t * a.ldy + (size_t)r * a.ys;
            *o = a.add ? __fadd_rn(*o, v) : v;
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
__global__ void __launch_bounds__(128) gemm_q8_kernel(MM a) {
    __shared__ __align__(16) __nv_bfloat16 As[3][TC_BM][TC_LD];
    __shared__ __align__(16) __nv_bfloat16 Bs[TC_BN][TC_LD];
    __shared__ float ds[TC_BN];
    const float *x = a.x, *sc = a.sc;
    const int8_t *W = (const int8_t *)a.w;
    const int rows = a.rows, cols = a.cols, n = a.n;
    const int t0 = blockIdx.y * TC_BM, r0 = blockIdx.x * TC_BN;
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
            if (r0 + rr < rows) u = __ldcs((const uint4 *)(W + (size_t)(r0 + rr) * a.ld + k0 + c));
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
                ds[threadIdx.x] = r0 + threadIdx.x < rows ? sc[((size_t)(r0 + threadIdx.x) * a.ld + k0) / 32] : 0.0f;
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
                    float *o = a.y + (size_t)tok * a.ldy + (size_t)r * a.ys;
                    *o = a.add ? __fadd_rn(*o, acc[i][j][h]) : acc[i][j][h];
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

template <int DT, int NT, int A8> static void gemv_nt(const CudaMatmul *m, MM a) {
    /* as for the whole matrix's rows, so that a part's sums are the whole's */
    a.ks = warps_per_row(m->shape_rows);
    const int rpb = GEMV_WARPS / a.ks;
    const dim3 g((a.rows + rpb - 1) / rpb), b(32 * GEMV_WARPS);
    if (m->xmode && m->pair) pdl_launch(gemv_kernel<DT, NT, 1, 1, A8>, g, b, a);
    else if (m->xmode) pdl_launch(gemv_kernel<DT, NT, 1, 0, A8>, g, b, a);
    else if (m->pair) pdl_launch(gemv_kernel<DT, NT, 0, 1, A8>, g, b, a);
    else pdl_launch(gemv_kernel<DT, NT, 0, 0, A8>, g, b, a);
}

template <int DT, int A8> static void gemv(const CudaMatmul *m, const MM &a) {
    if (m->n == 1) gemv_nt<DT, 1, A8>(m, a);
    else if (m->n == 2) gemv_nt<DT, 2, A8>(m, a);
    else if (m->n <= 4) gemv_nt<DT, 4, A8>(m, a);
    else gemv_nt<DT, 8, A8>(m, a);
}

/* 8-byte loads where the rows ask for them; q8 codes come 8 bytes a
 * lane anyway */
template <int DT> static void gemv_aligned(const CudaMatmul *m, const MM &a) {
    if (m->narrow) gemv<DT, DT != CUDA_Q8>(m, a);
    else gemv<DT, 0>(m, a);
}

extern "C" void cuda_matmul_run(const CudaMatmul *m) {
    /* the pair and the RMSNorm are the decode kernel's; q8's scales are
     * found from a whole matrix's rows */
    if ((m->n > CUDA_MATVEC_MAX && (m->pair || m->xmode)) ||
        (m->dtype == CUDA_Q8 && (m->narrow || m->ld != (size_t)(m->pair ? 2 : 1) * m->cols ||
                                 m->shape_rows != (m->pair ? 2 : 1) * m->rows))) {
        cuda_refuse("matmul (a launch its kernels do not take)");
        return;
    }
    MM a = {};
    a.y = m->y, a.x = m->x, a.nw = m->nw, a.w = m->w, a.w2 = m->w2, a.ld = m->ld, a.eps = m->eps;
    a.rows = m->rows, a.cols = m->cols, a.n = m->n, a.add = m->add, a.ldy = m->ldy, a.ys = m->ys;
    if (m->dtype == CUDA_Q8) {
        /* a whole matrix's codes, then its scales (a pair: gate and up
         * rows interleaved, w2 the first up row) */
        a.sc = (const float *)((const int8_t *)m->w + (size_t)(m->pair ? 2 : 1) * m->rows * m->cols);
        a.sc2 = a.sc + m->cols / 32;
    }
    if (m->n <= CUDA_MATVEC_MAX) {
        if (m->dtype == CUDA_BF16) gemv_aligned<CUDA_BF16>(m, a);
        else if (m->dtype == CUDA_Q8) gemv_aligned<CUDA_Q8>(m, a);
        else if (m->dtype == CUDA_F16) gemv_aligned<CUDA_F16>(m, a);
        else gemv_aligned<CUDA_F32>(m, a);
        cuda_note("matmul (gemv)");
        return;
    }
    const dim3 g((m->rows + 63) / 64, (m->n + 63) / 64);
    if (m->dtype == CUDA_Q8) {
        gemm_q8_kernel<<<g, 128, 0, g_stream>>>(a);
        cuda_note("matmul (q8, tensor cores)");
        return;
    }
    /* the kernel the whole matrix's shape takes */
    if (m->dtype == CUDA_BF16 && m->shape_rows % TC_BN == 0 && m->cols % TC_BK == 0) {
        if (m->narrow) gemm_bf16x3_kernel<1><<<g, 128, 0, g_stream>>>(a);
        else gemm_bf16x3_kernel<0><<<g, 128, 0, g_stream>>>(a);
        cuda_note("matmul (tensor cores)");
        return;
    }
    if (m->dtype == CUDA_BF16) gemm_kernel<CUDA_BF16><<<g, 256, 0, g_stream>>>(a);
    else if (m->dtype == CUDA_F16) gemm_kernel<CUDA_F16><<<g, 256, 0, g_stream>>>(a);
    else gemm_kernel<CUDA_F32><<<g, 256, 0, g_stream>>>(a);
    cuda_note("matmul (tiled)");
}

extern "C" void cuda_matvec(float *d_y, const float *d_x, int xmode, const float *d_nw, float eps, const void *d_W,
                            int dtype, int rows, int cols, int n, int pair, int add) {
    CudaMatmul m = {};
    const int out = pair ? rows / 2 : rows;
    m.y = d_y, m.x = d_x, m.xmode = xmode, m.nw = d_nw, m.eps = eps, m.w = d_W, m.dtype = dtype;
    m.rows = out, m.cols = cols, m.n = n, m.pair = pair, m.add = add, m.ldy = out, m.ys = 1, m.shape_rows = rows;
    /* a pair's rows interleave: gate i at 2i, up i at 2i + 1 */
    m.ld = pair ? 2 * (size_t)cols : (size_t)cols;
    if (pair) m.w2 = (const char *)d_W + (size_t)cols * cuda_dtype_bytes(dtype);
    cuda_matmul_run(&m);
}

extern "C" void cuda_matmul(float *d_y, const float *d_x, const void *d_W, int dtype, int rows, int cols, int n,
                            int add) {
    if (n <= CUDA_MATVEC_MAX) {
        cuda_matvec(d_y, d_x, 0, NULL, 0, d_W, dtype, rows, cols, n, 0, add);
        return;
    }
    CudaMatmul m = {};
    m.y = d_y, m.x = d_x, m.w = d_W, m.dtype = dtype, m.rows = rows, m.cols = cols, m.n = n, m.add = add;
    m.ld = (size_t)cols, m.ldy = rows, m.ys = 1, m.shape_rows = rows;
    cuda_matmul_run(&m);
}
