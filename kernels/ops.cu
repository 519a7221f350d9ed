/* ops.cu: the GPU twins of kernels/ops.c's row operations, plus the
 * embedding lookup and the q/k norm + RoPE + cache store of a layer.
 *
 * Data flow (model/gpu.c, per layer): rmsnorm -> matmul q|k|v ->
 * cuda_qk_rope_store (q in place, k and v into the cache) -> attention ->
 * matmul o + residual -> rmsnorm -> matmul gate|up -> swiglu -> matmul
 * down + residual; after the last layer, the check for NaN and infinity.
 * Each block works on one row (or one head of one token).
 *
 * The arithmetic is the C reference's, operation for operation: sums of
 * squares in double, products and differences rounded one at a time
 * (__fmul_rn / __fsub_rn, so nvcc cannot contract them into an fma that
 * the C, compiled without contraction, does not do). What may differ is
 * the order of the double sum (a last-bit effect after rounding to f32)
 * and expf (CUDA's and libm's each within 2 ulp).
 */
#include <float.h>
#include <limits.h>
#include <math.h>

#include "kernels/cuda.h"
#include "kernels/cuda_common.cuh"

__global__ void embed_kernel(float *x, const void *E, int dtype, const int *tokens, int H) {
    pdl_wait();
    const size_t row = (size_t)tokens[blockIdx.x] * H;
    for (int j = threadIdx.x; j < H; j += blockDim.x) x[(size_t)blockIdx.x * H + j] = weight_at(E, dtype, row + j);
}

int cuda_pdl_compiled(void) {
    cudaFuncAttributes a;
    return cudaFuncGetAttributes(&a, embed_kernel) == cudaSuccess && a.ptxVersion >= 90;
}

extern "C" void cuda_embed(float *d_x, const void *d_E, int dtype, const int *d_tokens, int n, int H) {
    pdl_launch(embed_kernel, dim3(n), dim3(256), d_x, d_E, dtype, d_tokens, H);
    cuda_note("embedding lookup");
}

/* One block per row: y = w * (x * inv), inv = 1 / sqrt(mean(x^2) + eps). */
__global__ void rmsnorm_kernel(float *y, int ldy, const float *x, int ldx, const float *w, int H, float eps) {
    __shared__ double sh[32];
    pdl_wait();
    const float *xr = x + (size_t)blockIdx.x * ldx;
    float *yr = y + (size_t)blockIdx.x * ldy;
    double ss = 0;
    for (int j = threadIdx.x; j < H; j += blockDim.x) ss += (double)xr[j] * xr[j];
    ss = block_sum_d(ss, sh);
    const float inv = (float)(1.0 / sqrt(ss / H + (double)eps));
    __syncthreads(); /* every thread has read x before y (which may be x) is written */
    for (int j = threadIdx.x; j < H; j += blockDim.x) yr[j] = __fmul_rn(w[j], __fmul_rn(xr[j], inv));
}

extern "C" void cuda_rmsnorm(float *d_y, int ldy, const float *d_x, int ldx, const float *d_w, int n, int H,
                             float eps) {
    pdl_launch(rmsnorm_kernel, dim3(n), dim3(256), d_y, ldy, d_x, ldx, d_w, H, eps);
    cuda_note("rmsnorm");
}

extern "C" size_t cuda_kv_stream_bytes(int fmt, int hd, int cap) { return kv_stream_bytes(fmt, hd, cap); }

/* Thread t's value x of a vector into q8 tiles at position pos, as
 * kv/q8.c's append_ref: its warp is the 32-value block t / 32, the scale
 * d = amax / 127 from the f32 amax (stored as fp16), code roundf(x / d)
 * through the f32 1 / d; V (role 1) codes pair positions byte by byte. */
__device__ void q8_store(uint8_t *tiles, int hd, int pos, int t, float x, int role) {
    const float amax = warp_max(fabsf(x));
    const float d = __fdiv_rn(amax, 127.0f), id = d > 1.0f / 3.40282347e38f ? __fdiv_rn(1.0f, d) : 0.0f;
    uint8_t *tl = tiles + (size_t)(pos / 16) * 17 * hd;
    const int r = pos % 16, k = t / 32;
    if ((t & 31) == 0) {
        const __half h = __float2half_rn(d);
        *(__half *)(tl + 2 * (k * 16 + r)) = h;
    }
    const size_t at = role == 0 ? (size_t)(t / 4) * 64 + 4 * r + t % 4 : (size_t)(r / 2) * 2 * hd + 2 * t + r % 2;
    tl[hd + at] = (uint8_t)(int8_t)roundf(__fmul_rn(x, id));
}

/* Block (token i, head h) of hd threads, thread t on element t. Heads
 * h < nh are queries (normed, roped, written back in place); the others
 * are kv head h - nh: its key normed and roped, then key and value stored
 * in the caches at slot pos + i. */
__global__ void qk_rope_store_kernel(float *q, float *k, const float *v, int ld, const float *qn,
                                     const float *kn, const float *cs, const float *sn, void *kc, void *vc, int fmt,
                                     const int *d_pos, int nh, int nkv, int hd, int rot, int cap, float eps) {
    __shared__ double sh[32];
    __shared__ float buf[512];
    pdl_wait();
    const int i = blockIdx.x, h = blockIdx.y, t = threadIdx.x, half = rot / 2;
    const int pos = *d_pos + i, is_q = h < nh, kh = h - nh;
    const float *src = is_q ? q + (size_t)i * ld + (size_t)h * hd : k + (size_t)i * ld + (size_t)kh * hd;
    const float x = src[t];
    const double ss = block_sum_d((double)x * x, sh);
    const float inv = (float)(1.0 / sqrt(ss / hd + (double)eps));
    buf[t] = __fmul_rn((is_q ? qn : kn)[t], __fmul_rn(x, inv));
    __syncthreads();
    float y = buf[t];
    if (t < rot) {
        const int j = t < half ? t : t - half;
        const float c = cs[(size_t)pos * half + j], s = sn[(size_t)pos * half + j];
        const float a = buf[j], b = buf[j + half];
        y = t < half ? __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s)) : __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s));
    }
    if (is_q || fmt >= CUDA_KV_TBQ2) {
        /* queries, and keys a coded store (kv/tbq.cu, kv/q4.cu, kv/lm3.cu) codes next, in place */
        (is_q ? q : k)[(size_t)i * ld + (size_t)(is_q ? h : kh) * hd + t] = y;
        return;
    }
    const float vv = v[(size_t)i * ld + (size_t)kh * hd + t];
    if (fmt == CUDA_KV_Q8) {
        const size_t stream = kv_stream_bytes(CUDA_KV_Q8, hd, cap) * kh;
        q8_store((uint8_t *)kc + stream, hd, pos, t, y, 0);
        q8_store((uint8_t *)vc + stream, hd, pos, t, vv, 1);
        return;
    }
    const size_t slot = ((size_t)kh * cap + pos) * hd + t;
    if (fmt == CUDA_KV_F16) {
        ((__half *)kc)[slot] = __float2half_rn(y);
        ((__half *)vc)[slot] = __float2half_rn(vv);
    } else {
        ((float *)kc)[slot] = y;
        ((float *)vc)[slot] = vv;
    }
}

extern "C" void cuda_qk_rope_store(float *d_q, float *d_k, const float *d_v, int ld, const float *d_qn,
                                   const float *d_kn, const float *d_cs, const float *d_sn, void *d_kc, void *d_vc,
                                   int fmt, const int *d_pos, int n, int nh, int nkv, int hd, int rot, int cap,
                                   float eps) {
    pdl_launch(qk_rope_store_kernel, dim3(n, nh + nkv), dim3(hd), d_q, d_k, d_v, ld, d_qn, d_kn, d_cs, d_sn, d_kc,
               d_vc, fmt, d_pos, nh, nkv, hd, rot, cap, eps);
    cuda_note("q/k norm + RoPE + KV store");
}

__global__ void swiglu_kernel(float *out, const float *gu, size_t count) {
    for (size_t j = blockIdx.x * (size_t)blockDim.x + threadIdx.x; j < count; j += (size_t)gridDim.x * blockDim.x) {
        const float a = gu[2 * j], b = gu[2 * j + 1]; /* row j / I, gate and up (j % I) side by side */
        out[j] = __fmul_rn(__fdiv_rn(a, __fadd_rn(1.0f, expf(-a))), b);
    }
}

static int grid_for(size_t count) {
    size_t g = (count + 255) / 256;
    return g > 4096 ? 4096 : g < 1 ? 1 : (int)g;
}

extern "C" void cuda_swiglu(float *d_out, const float *d_gu, int n, int I) {
    const size_t count = (size_t)n * I;
    swiglu_kernel<<<grid_for(count), 256, 0, g_stream>>>(d_out, d_gu, count);
    cuda_note("swiglu");
}

/* splitmix64 of (seed, index): bf16 of a uniform value in [-scale, scale]. */
__global__ void fill_random_kernel(uint16_t *w, size_t count, unsigned long long seed, float scale) {
    for (size_t j = blockIdx.x * (size_t)blockDim.x + threadIdx.x; j < count; j += (size_t)gridDim.x * blockDim.x) {
        unsigned long long z = seed * 0x9E3779B97F4A7C15ull + j + 1;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        const float u = (float)(z >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f;
        w[j] = (uint16_t)(__float_as_uint(u * scale) >> 16);
    }
}

extern "C" void cuda_fill_random(void *d_w, size_t count, unsigned long long seed, float scale) {
    fill_random_kernel<<<grid_for(count), 256, 0, g_stream>>>((uint16_t *)d_w, count, seed, scale);
    cuda_note("random weights");
}

__global__ void fill_random_q8_kernel(int8_t *q, float *d, size_t count, unsigned long long seed, float scale) {
    for (size_t j = blockIdx.x * (size_t)blockDim.x + threadIdx.x; j < count; j += (size_t)gridDim.x * blockDim.x) {
        unsigned long long z = seed * 0x9E3779B97F4A7C15ull + j + 1;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        q[j] = (int8_t)((int)((z >> 32) % 255) - 127);
        if (j % 32 == 0) d[j / 32] = scale / 127;
    }
}

extern "C" void cuda_fill_random_q8(void *d_w, int rows, int cols, unsigned long long seed, float scale) {
    const size_t count = (size_t)rows * cols;
    fill_random_q8_kernel<<<grid_for(count), 256, 0, g_stream>>>((int8_t *)d_w, (float *)((int8_t *)d_w + count),
                                                                 count, seed, scale);
    cuda_note("random q8 weights");
}

__global__ void fill_ones_kernel(float *x, size_t count) {
    for (size_t j = blockIdx.x * (size_t)blockDim.x + threadIdx.x; j < count; j += (size_t)gridDim.x * blockDim.x)
        x[j] = 1.0f;
}

extern "C" void cuda_fill_ones(float *d_x, size_t count) {
    fill_ones_kernel<<<grid_for(count), 256, 0, g_stream>>>(d_x, count);
    cuda_note("fill");
}

/* One block: each thread the lowest row of its elements that is NaN or
 * infinite (the exponent all ones, as find_nonfinite tests), then the
 * block's lowest. */
__global__ void find_nonfinite_kernel(int *out, const float *x, int n, int width) {
    __shared__ int low[1024];
    int mine = INT_MAX;
    const size_t count = (size_t)n * width;
    for (size_t j = threadIdx.x; j < count; j += blockDim.x)
        if ((__float_as_uint(x[j]) & 0x7F800000u) == 0x7F800000u) {
            mine = (int)(j / width);
            break; /* later elements of this thread lie in later rows */
        }
    low[threadIdx.x] = mine;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s) low[threadIdx.x] = min(low[threadIdx.x], low[threadIdx.x + s]);
        __syncthreads();
    }
    if (threadIdx.x == 0) *out = low[0];
}

extern "C" void cuda_find_nonfinite(int *d_out, const float *d_x, int n, int width) {
    find_nonfinite_kernel<<<1, 1024, 0, g_stream>>>(d_out, d_x, n, width);
    cuda_note("finiteness check");
}
