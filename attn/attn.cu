/* attn.cu: causal GQA attention on the GPU over f32 and f16 caches in
 * device memory, read in place: the twin of attn_group_ref (attn/attn.c).
 *
 * Data flow: model/gpu.c stores each token's k and v in the layer's caches
 * (cuda_qk_rope_store), then calls cuda_attention for the n new tokens.
 *
 *   kc, vc [nkv, cap, hd]   cache of one layer, f32 or f16 rows
 *   q      [n, nh, hd]      roped queries; out the same shape
 *   part   [n, nh, splits, hd] partial sums, then [n, nh, splits, 2] (m, l)
 *
 * Split-K flash-decoding (Dao et al., "Flash-Decoding for long-context
 * inference", 2023): block (kv head, split, chunk of tokens) walks its
 * split's positions in tiles of 128 with an online softmax for every query
 * row it serves, i.e. all gqa heads of its kv head for up to 16 / gqa
 * tokens, so each cached row is loaded once per block and used by all of
 * them. A combine pass per (token, head) merges the splits:
 *   M = max m_j,  out = sum_j e^(m_j - M) acc_j / sum_j e^(m_j - M) l_j
 * where a split with no position has m = -inf, l = 0 and adds nothing.
 * Split lengths are computed in the kernel from the length in device
 * memory, so a captured graph serves every position.
 *
 * Per tile: thread t scores position tile + t against every row (queries
 * from shared memory, pre-scaled), the warps turn scores into exponentials
 * row by row, then thread t accumulates dims t (and t + 128) of every row
 * over the tile's values, f32 throughout as on the CPU.
 */
#include <math.h>

#include "kernels/cuda.h"
#include "kernels/cuda_common.cuh"

#define AT_TILE 128 /* positions per tile = threads per block */
#define AT_MAXR 16  /* query rows per block */

/* 8 cached values from row at element d, as f32. */
template <bool F16> __device__ __forceinline__ void row8(const void *row, int d, float o[8]) {
    if (F16) {
        const uint4 u = *(const uint4 *)((const __half *)row + d);
        const uint32_t p[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int i = 0; i < 4; i++) o[2 * i] = f16_f32(p[i] & 0xffff), o[2 * i + 1] = f16_f32(p[i] >> 16);
    } else {
        const float4 a = *(const float4 *)((const float *)row + d), b = *((const float4 *)((const float *)row + d) + 1);
        o[0] = a.x, o[1] = a.y, o[2] = a.z, o[3] = a.w, o[4] = b.x, o[5] = b.y, o[6] = b.z, o[7] = b.w;
    }
}

template <bool F16> __device__ __forceinline__ float at1(const void *row, int d) {
    return F16 ? __half2float(((const __half *)row)[d]) : ((const float *)row)[d];
}

template <int HD, bool F16>
__global__ void __launch_bounds__(AT_TILE) attn_split_kernel(float *part, const float *q, const void *kc,
                                                             const void *vc, const int *d_pos, int n, int nh, int nkv,
                                                             int cap, float scale, int splits, int qb) {
    constexpr int U = HD / AT_TILE; /* dims per thread in the accumulation */
    __shared__ __align__(16) float qs[AT_MAXR * HD];
    __shared__ float S[AT_MAXR * AT_TILE];
    __shared__ float m_s[AT_MAXR], l_s[AT_MAXR], al_s[AT_MAXR];
    const int h = blockIdx.x, sp = blockIdx.y, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int gqa = nh / nkv, pos0 = *d_pos, i0 = blockIdx.z * qb;
    const int nt = n - i0 < qb ? n - i0 : qb, R = gqa * nt;
    const int L = pos0 + i0 + nt; /* positions the chunk's last token sees */
    int per = (L + splits - 1) / splits;
    per = (per + AT_TILE - 1) / AT_TILE * AT_TILE;
    const int j0 = sp * per, j1 = j0 + per < L ? j0 + per : L;
    /* row r = token i0 + r / gqa, query head h * gqa + r % gqa */
    for (int e = tid; e < R * HD; e += AT_TILE) {
        const int r = e / HD, d = e % HD;
        qs[e] = q[((size_t)(i0 + r / gqa) * nh + h * gqa + r % gqa) * HD + d] * scale;
    }
    if (tid < AT_MAXR) m_s[tid] = -INFINITY, l_s[tid] = 0, al_s[tid] = 1;
    float acc[AT_MAXR][U];
#pragma unroll
    for (int r = 0; r < AT_MAXR; r++)
#pragma unroll
        for (int u = 0; u < U; u++) acc[r][u] = 0;
    const size_t row_bytes = (size_t)HD * (F16 ? 2 : 4);
    const char *K = (const char *)kc + (size_t)h * cap * row_bytes, *V = (const char *)vc + (size_t)h * cap * row_bytes;
    __syncthreads();
    for (int tile = j0; tile < j1; tile += AT_TILE) {
        const int j = tile + tid;
        float s[AT_MAXR];
#pragma unroll
        for (int r = 0; r < AT_MAXR; r++) s[r] = 0;
        if (j < j1) {
            const void *row = K + (size_t)j * row_bytes;
            for (int d = 0; d < HD; d += 8) {
                float k[8];
                row8<F16>(row, d, k);
#pragma unroll
                for (int r = 0; r < AT_MAXR; r++)
                    if (r < R) {
                        const float4 a = *(const float4 *)(qs + r * HD + d), b = *(const float4 *)(qs + r * HD + d + 4);
                        float t = s[r];
                        t = fmaf(a.x, k[0], t), t = fmaf(a.y, k[1], t), t = fmaf(a.z, k[2], t), t = fmaf(a.w, k[3], t);
                        t = fmaf(b.x, k[4], t), t = fmaf(b.y, k[5], t), t = fmaf(b.z, k[6], t), t = fmaf(b.w, k[7], t);
                        s[r] = t;
                    }
            }
        }
#pragma unroll
        for (int r = 0; r < AT_MAXR; r++)
            if (r < R) S[r * AT_TILE + tid] = j < j1 && j <= pos0 + i0 + r / gqa ? s[r] : -INFINITY;
        __syncthreads();
        /* online softmax, one warp per row */
        for (int r = warp; r < R; r += AT_TILE / 32) {
            float v[AT_TILE / 32], mx = -INFINITY;
#pragma unroll
            for (int k = 0; k < AT_TILE / 32; k++) v[k] = S[r * AT_TILE + lane + 32 * k], mx = fmaxf(mx, v[k]);
            mx = warp_max(mx);
            const float mold = m_s[r], mnew = fmaxf(mold, mx);
            float sum = 0, alpha = 1;
            if (mnew != -INFINITY) {
                alpha = mold == -INFINITY ? 0 : expf(mold - mnew);
#pragma unroll
                for (int k = 0; k < AT_TILE / 32; k++) {
                    v[k] = v[k] == -INFINITY ? 0 : expf(v[k] - mnew);
                    sum += v[k];
                }
            } else {
#pragma unroll
                for (int k = 0; k < AT_TILE / 32; k++) v[k] = 0;
            }
#pragma unroll
            for (int k = 0; k < AT_TILE / 32; k++) S[r * AT_TILE + lane + 32 * k] = v[k];
            sum = warp_sum(sum);
            if (lane == 0) m_s[r] = mnew, l_s[r] = l_s[r] * alpha + sum, al_s[r] = alpha;
        }
        __syncthreads();
#pragma unroll
        for (int r = 0; r < AT_MAXR; r++)
            if (r < R)
#pragma unroll
                for (int u = 0; u < U; u++) acc[r][u] *= al_s[r];
        const int cnt = j1 - tile < AT_TILE ? j1 - tile : AT_TILE;
        for (int jj = 0; jj < cnt; jj++) {
            const void *row = V + (size_t)(tile + jj) * row_bytes;
            float vv[U];
#pragma unroll
            for (int u = 0; u < U; u++) vv[u] = at1<F16>(row, tid + AT_TILE * u);
#pragma unroll
            for (int r = 0; r < AT_MAXR; r++)
                if (r < R) {
                    const float p = S[r * AT_TILE + jj];
#pragma unroll
                    for (int u = 0; u < U; u++) acc[r][u] = fmaf(p, vv[u], acc[r][u]);
                }
        }
        __syncthreads();
    }
    float *pacc = part, *pml = part + (size_t)n * nh * splits * HD;
#pragma unroll
    for (int r = 0; r < AT_MAXR; r++)
        if (r < R) {
            const size_t at = ((size_t)(i0 + r / gqa) * nh + h * gqa + r % gqa) * splits + sp;
#pragma unroll
            for (int u = 0; u < U; u++) pacc[at * HD + tid + AT_TILE * u] = acc[r][u];
            if (tid == 0) pml[2 * at] = m_s[r], pml[2 * at + 1] = l_s[r];
        }
}

/* Block (token, head) of hd threads: merges the splits' partial softmaxes. */
__global__ void attn_combine_kernel(float *out, const float *part, int n, int nh, int hd, int splits) {
    const size_t row = blockIdx.x, d = threadIdx.x;
    const float *pacc = part + row * splits * hd, *pml = part + (size_t)n * nh * splits * hd + row * splits * 2;
    float M = -INFINITY;
    for (int s = 0; s < splits; s++) M = fmaxf(M, pml[2 * s]);
    float num = 0, den = 0;
    for (int s = 0; s < splits; s++) {
        const float m = pml[2 * s];
        if (m == -INFINITY) continue;
        const float w = expf(m - M);
        num = fmaf(w, pacc[(size_t)s * hd + d], num);
        den = fmaf(w, pml[2 * s + 1], den);
    }
    out[row * hd + d] = num / den;
}

extern "C" size_t cuda_attn_part_floats(int n, int nh, int hd, int splits) {
    return (size_t)n * nh * splits * (hd + 2);
}

static int tokens_per_block(int nh, int nkv) {
    const int gqa = nh / nkv;
    return gqa >= AT_MAXR ? 1 : AT_MAXR / gqa;
}

extern "C" int cuda_attn_splits(int n, int nh, int nkv, int cap, int sm_count) {
    const int qb = tokens_per_block(nh, nkv), chunks = (n + qb - 1) / qb;
    /* two blocks per SM, no split shorter than a tile, at most 64 */
    int s = (2 * sm_count + nkv * chunks - 1) / (nkv * chunks);
    const int most = (cap + AT_TILE - 1) / AT_TILE;
    s = s > most ? most : s;
    s = s > 64 ? 64 : s;
    return s < 1 ? 1 : s;
}

extern "C" void cuda_attention(float *d_out, const float *d_q, const void *d_kc, const void *d_vc, int f16,
                               const int *d_pos, int n, int nh, int nkv, int hd, int cap, float scale, float *d_part,
                               int splits) {
    const int qb = tokens_per_block(nh, nkv);
    const dim3 g(nkv, splits, (n + qb - 1) / qb);
#define LAUNCH(HD, F)                                                                                                  \
    attn_split_kernel<HD, F><<<g, AT_TILE, 0, g_stream>>>(d_part, d_q, d_kc, d_vc, d_pos, n, nh, nkv, cap, scale,     \
                                                         splits, qb)
    if (hd == 128 && f16) LAUNCH(128, true);
    else if (hd == 128) LAUNCH(128, false);
    else if (f16) LAUNCH(256, true);
    else LAUNCH(256, false);
#undef LAUNCH
    cuda_note("attention (splits)");
    attn_combine_kernel<<<n * nh, hd, 0, g_stream>>>(d_out, d_part, n, nh, hd, splits);
    cuda_note("attention (combine)");
}
