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
 * Per tile of 128 positions: each half-warp scores one position at a time
 * against every row (a lane holds 1/16 of the key row, so loads are
 * coalesced; queries pre-scaled in shared memory), the warps turn scores
 * into exponentials row by row, then thread t accumulates dims t (and
 * t + 128) of every row over the tile's values, f32 throughout as on the
 * CPU.
 */
#include <math.h>

#include "kernels/cuda.h"
#include "kernels/cuda_common.cuh"

#define AT_TILE 128 /* positions per tile = threads per block */
#define AT_MAXR 16  /* query rows per block */

/* DPL cached values of a row from element d, as f32: 16 or 32 bytes of
 * f16, 32 or 64 of f32. */
template <bool F16, int DPL> __device__ __forceinline__ void row_load(const char *row, int d, float *o) {
    if (F16) {
#pragma unroll
        for (int c = 0; c < DPL / 8; c++) {
            const uint4 u = *((const uint4 *)((const __half *)row + d) + c);
            const uint32_t p[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
            for (int i = 0; i < 4; i++)
                o[8 * c + 2 * i] = f16_f32(p[i] & 0xffff), o[8 * c + 2 * i + 1] = f16_f32(p[i] >> 16);
        }
    } else {
#pragma unroll
        for (int c = 0; c < DPL / 4; c++) {
            const float4 a = *((const float4 *)((const float *)row + d) + c);
            o[4 * c] = a.x, o[4 * c + 1] = a.y, o[4 * c + 2] = a.z, o[4 * c + 3] = a.w;
        }
    }
}

template <bool F16> __device__ __forceinline__ float at1(const char *row, int d) {
    return F16 ? __half2float(((const __half *)row)[d]) : ((const float *)row)[d];
}

template <int HD, bool F16>
__global__ void __launch_bounds__(AT_TILE) attn_split_kernel(float *part, const float *q, int ldq, const void *kc,
                                                             const void *vc, const int *d_pos, int n, int nh, int nkv,
                                                             int cap, float scale, int splits, int qb) {
    constexpr int U = HD / AT_TILE;        /* dims per thread when summing values */
    constexpr int DPL = HD / 16;           /* dims per lane when scoring: a half-warp holds a row */
    constexpr int PPW = AT_TILE / 4;       /* positions per warp per tile */
    constexpr int UNR = HD == 128 ? 4 : 2; /* row pairs loaded before they are used */
    __shared__ __align__(16) float qs[AT_MAXR * HD];
    __shared__ float S[AT_MAXR * AT_TILE];
    __shared__ float m_s[AT_MAXR], l_s[AT_MAXR], al_s[AT_MAXR];
    const int h = blockIdx.x, sp = blockIdx.y, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int hw = lane >> 4, hl = lane & 15;
    const int gqa = nh / nkv, pos0 = *d_pos, i0 = blockIdx.z * qb;
    const int nt = n - i0 < qb ? n - i0 : qb, R = gqa * nt;
    const int L = pos0 + i0 + nt; /* positions the chunk's last token sees */
    int per = (L + splits - 1) / splits;
    per = (per + AT_TILE - 1) / AT_TILE * AT_TILE;
    const int j0 = sp * per, j1 = j0 + per < L ? j0 + per : L;
    float *pacc = part, *pml = part + (size_t)n * nh * splits * HD;
    /* row r = token i0 + r / gqa, query head h * gqa + r % gqa */
    if (j0 >= j1) {
        /* an empty split (a short context): m = -inf, l = 0, which the
         * combine skips without reading its sums */
        if (tid < R) {
            const size_t at = ((size_t)(i0 + tid / gqa) * nh + h * gqa + tid % gqa) * splits + sp;
            pml[2 * at] = -INFINITY, pml[2 * at + 1] = 0;
        }
        return;
    }
    for (int e = tid; e < R * HD; e += AT_TILE) {
        const int r = e / HD, d = e % HD;
        qs[e] = q[(size_t)(i0 + r / gqa) * ldq + (size_t)(h * gqa + r % gqa) * HD + d] * scale;
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
        /* scores: warp w takes the tile's positions w * 32 .., two at a
         * time, one per half-warp, each lane DPL dims of the row; the
         * half-warp's partial sums meet by shuffles */
        for (int k0 = 0; k0 < PPW; k0 += 2 * UNR) {
            float kr[UNR][DPL];
#pragma unroll
            for (int u = 0; u < UNR; u++) {
                const int j = tile + warp * PPW + k0 + 2 * u + hw;
                if (j < j1) row_load<F16, DPL>(K + (size_t)j * row_bytes, hl * DPL, kr[u]);
                else
#pragma unroll
                    for (int e = 0; e < DPL; e++) kr[u][e] = 0;
            }
#pragma unroll
            for (int u = 0; u < UNR; u++) {
                const int jl = warp * PPW + k0 + 2 * u + hw, j = tile + jl;
#pragma unroll
                for (int r = 0; r < AT_MAXR; r++)
                    if (r < R) {
                        const float *qq = qs + r * HD + hl * DPL;
                        float t = 0;
#pragma unroll
                        for (int e = 0; e < DPL; e += 4) {
                            const float4 a = *(const float4 *)(qq + e);
                            t = fmaf(a.x, kr[u][e], t), t = fmaf(a.y, kr[u][e + 1], t);
                            t = fmaf(a.z, kr[u][e + 2], t), t = fmaf(a.w, kr[u][e + 3], t);
                        }
                        t += __shfl_xor_sync(0xffffffffu, t, 8);
                        t += __shfl_xor_sync(0xffffffffu, t, 4);
                        t += __shfl_xor_sync(0xffffffffu, t, 2);
                        t += __shfl_xor_sync(0xffffffffu, t, 1);
                        if (hl == 0) S[r * AT_TILE + jl] = j < j1 && j <= pos0 + i0 + r / gqa ? t : -INFINITY;
                    }
            }
        }
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
        /* values: thread t sums dims t (and t + 128) of every row */
#pragma unroll
        for (int r = 0; r < AT_MAXR; r++)
            if (r < R)
#pragma unroll
                for (int u = 0; u < U; u++) acc[r][u] *= al_s[r];
        const int cnt = j1 - tile < AT_TILE ? j1 - tile : AT_TILE;
        for (int jj = 0; jj < cnt; jj++) {
            const char *row = V + (size_t)(tile + jj) * row_bytes;
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
    /* eight blocks per SM, so that enough loads are in flight; no split
     * shorter than a tile; at most 256 */
    int s = (8 * sm_count + nkv * chunks - 1) / (nkv * chunks);
    const int most = (cap + AT_TILE - 1) / AT_TILE;
    s = s > most ? most : s;
    s = s > 256 ? 256 : s;
    return s < 1 ? 1 : s;
}

extern "C" void cuda_attention(float *d_out, const float *d_q, int ldq, const void *d_kc, const void *d_vc, int f16,
                               const int *d_pos, int n, int nh, int nkv, int hd, int cap, float scale, float *d_part,
                               int splits) {
    const int qb = tokens_per_block(nh, nkv);
    const dim3 g(nkv, splits, (n + qb - 1) / qb);
#define LAUNCH(HD, F)                                                                                                  \
    attn_split_kernel<HD, F><<<g, AT_TILE, 0, g_stream>>>(d_part, d_q, ldq, d_kc, d_vc, d_pos, n, nh, nkv, cap,       \
                                                         scale, splits, qb)
    if (hd == 128 && f16) LAUNCH(128, true);
    else if (hd == 128) LAUNCH(128, false);
    else if (f16) LAUNCH(256, true);
    else LAUNCH(256, false);
#undef LAUNCH
    cuda_note("attention (splits)");
    attn_combine_kernel<<<n * nh, hd, 0, g_stream>>>(d_out, d_part, n, nh, hd, splits);
    cuda_note("attention (combine)");
}
