/* attn.cu: causal GQA attention on the GPU over f32, f16, q8, q4, q4h,
 * tbq4/3/2, lm3 and polar4 caches in device memory, read in place: the
 * twin of attn_group_ref (attn/attn.c).
 *
 * Data flow: model/gpu.c stores each token's k and v in the layer's caches
 * (cuda_qk_rope_store, then kv/tbq.cu, kv/q4.cu, kv/lm3.cu or
 * kv/polar4.cu for the coded formats), then calls cuda_attention for the n
 * new tokens.
 *
 *   kc, vc [nkv streams]    cache of one layer: f32 or f16 rows [cap, hd],
 *                           q8 tiles of 16 positions, or the CPU's coded
 *                           rows (kernels/cuda.h)
 *   q      [n, ldq]         roped queries, heads [nh, hd] first in a row
 *   out    [n, nh, hd]
 *   part   [n, nh, splits, hd] partial sums, then [n, nh, splits, 2] (m, l)
 *
 * Split-K flash-decoding (Dao et al., "Flash-Decoding for long-context
 * inference", 2023): block (kv head, split, chunk of tokens) serves every
 * query row of its kv head for up to 16 / gqa tokens (8 / gqa at head dim
 * 256; a decode step's gqa rows take a variant sized for 4, or for 2 over
 * a coded cache), so each
 * cached row is loaded once per block and used by all of them. The last
 * split to finish merges them (below), where a split with no position has
 * m = -inf, l = 0 and adds nothing.
 * Split lengths are computed in the kernel from the length in device
 * memory, so a captured graph serves every position. f32 throughout, as
 * on the CPU.
 *
 * q8 (kv/q8.c's tiles, the CPU's bytes) is dequantized in registers,
 * never into a buffer: for the keys lane l takes the 64-byte line of quad
 * l (4 values of each of a tile's 16 positions) and its block's scales,
 * so one round of loads is a whole tile; each lane's 16 partial scores
 * (times the scale) are summed over the warp by halving exchanges (8, 4,
 * 2, 1, 1 shuffles), which leave position p's score in lanes 2p and
 * 2p + 1. For the values lane l takes its hd / 32 dims of each position
 * pair (the V tile's layout) and weighs each position by p times its scale.
 *
 * The coded formats (one row of codes per position: tbq, lm3 and polar4's
 * Lloyd-Max indices, q4 and q4h's nibbles) are staged 32 rows at a time
 * into shared memory by asynchronous copies, a run ahead. Lane k scores
 * position k on its own (its codes as words in registers, each value
 * decoded once for every query row: no shuffles; tbq4 at head dim 128 in
 * integers, its codebook bytes against 8-bit queries by dp4a, the
 * arithmetic of the CPU's VNNI kernels), then each lane sums its hd / 32
 * dims of every position. Rotated formats (tbq, q4h, polar4) rotate the
 * queries in once per block (polar4's come rotated from its store,
 * kv/polar4.cu: a dense rotation is a matrix every block would read) and
 * the outputs back once, never a cached row: scores and sums happen in
 * the rotated domain (kv/tbq.cuh). polar4's scale is γ / ‖cb[idx]‖ of the
 * block: the lane that scores a position sums its codes' squares beside
 * the dot products, and the lane that folds a position's value scale into
 * its weight sums them over the value row.
 */
#include <math.h>
#include <string.h>

#include "kernels/cuda.h"
#include "kernels/cuda_common.cuh"
#include "kv/tbq.cuh"

#define AT_WARPS 4 /* warps per block, each walking its own run of positions */
#define AT_SMALL 4 /* query rows of the decode variant */

/* Query rows a block of the large variant serves, by head dim. */
static __host__ __device__ constexpr int at_rows(int hd) { return hd == 128 ? 16 : 8; }

/* N cached values of a row from element d, as f32: 8 to 32 bytes of f16,
 * 16 to 64 of f32. */
template <bool F16, int N> __device__ __forceinline__ void row_load(const char *row, int d, float *o) {
    if (F16 && N == 4) {
        const uint2 u = *(const uint2 *)((const __half *)row + d);
        o[0] = f16_f32(u.x & 0xffff), o[1] = f16_f32(u.x >> 16);
        o[2] = f16_f32(u.y & 0xffff), o[3] = f16_f32(u.y >> 16);
    } else if (F16) {
#pragma unroll
        for (int c = 0; c < N / 8; c++) {
            const uint4 u = *((const uint4 *)((const __half *)row + d) + c);
            const uint32_t p[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
            for (int i = 0; i < 4; i++)
                o[8 * c + 2 * i] = f16_f32(p[i] & 0xffff), o[8 * c + 2 * i + 1] = f16_f32(p[i] >> 16);
        }
    } else {
#pragma unroll
        for (int c = 0; c < N / 4; c++) {
            const float4 a = *((const float4 *)((const float *)row + d) + c);
            o[4 * c] = a.x, o[4 * c + 1] = a.y, o[4 * c + 2] = a.z, o[4 * c + 3] = a.w;
        }
    }
}

/* A q8 K tile's 16 partial scores per lane summed over the warp: 16 values
 * halve at each exchange, so position p's sum ends in lanes 2p, 2p + 1. */
__device__ __forceinline__ float q8_warp_sums(float (&v)[16], int lane) {
#pragma unroll
    for (int w = 8; w >= 1; w >>= 1) {
        const bool up = lane & (2 * w); /* this lane keeps the upper half */
#pragma unroll
        for (int i = 0; i < w; i++) {
            const float send = up ? v[i] : v[i + w], keep = up ? v[i + w] : v[i];
            v[i] = keep + __shfl_xor_sync(0xffffffffu, send, 2 * w);
        }
    }
    return v[0] + __shfl_xor_sync(0xffffffffu, v[0], 1);
}

/* A q8 tile's scales for one 32-value block, 16 positions, as f32. */
__device__ __forceinline__ void q8_scales(const uint8_t *tile, int block, float (&sc)[16]) {
    const uint4 *p = (const uint4 *)(tile + 32 * block);
#pragma unroll
    for (int c = 0; c < 2; c++) {
        const uint4 u = p[c];
        const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int i = 0; i < 4; i++)
            sc[8 * c + 2 * i] = f16_f32(w[i] & 0xffff), sc[8 * c + 2 * i + 1] = f16_f32(w[i] >> 16);
    }
}

/* Asynchronous 16-byte copies into shared memory (sm_80 and later): a
 * lane's copies are in once cp_async_wait<n> leaves at most n of its
 * committed groups pending; a __syncwarp then shows them to the warp. */
__device__ __forceinline__ void cp_async16(void *dst, const void *src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"((unsigned)__cvta_generic_to_shared(dst)),
                 "l"(src));
}
__device__ __forceinline__ void cp_async_commit(void) { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void cp_async_wait(void) {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/* A warp's copy of cnt coded rows from position base of a stream into st,
 * as one group: 32 rows are a whole number of 16-byte words from a
 * 16-byte boundary (kv/tbq.cuh), and a shorter run's last word stays
 * inside the stream (its positions are rounded up to 32). */
template <int VB>
__device__ __forceinline__ void stage_rows(uint8_t *st, const void *stream, int base, int cnt, int lane) {
    const uint8_t *src = (const uint8_t *)stream + (size_t)base * VB;
    for (int e = lane; e < (cnt * VB + 15) / 16; e += 32) cp_async16(st + 16 * e, src + 16 * e);
    cp_async_commit();
}

/* NW little-endian words of code bytes from c (shared memory, 2-byte
 * aligned: coded rows are): aligned loads and a funnel shift, reading up
 * to 4 bytes past the last word (the staging's pad covers the last row). */
template <int NW> __device__ __forceinline__ void code_words(const uint8_t *c, uint32_t (&w)[NW]) {
    const int a = (int)((uintptr_t)c & 3);
    const uint32_t *w0 = (const uint32_t *)(c - a);
    uint32_t prev = w0[0];
#pragma unroll
    for (int i = 0; i < NW; i++) {
        const uint32_t nx = w0[i + 1];
        w[i] = __funnelshift_r(prev, nx, 8 * a);
        prev = nx;
    }
}

/* A coded block's scale: fp16 (tbq) or fp32 (lm3, polar4), its row aligned for it. */
template <int HB> __device__ __forceinline__ float code_scale(const uint8_t *blk) {
    if constexpr (HB == 4) return *(const float *)blk;
    else return f16_f32(*(const uint16_t *)blk);
}

/* NB bits of a block's codes from bit bit0 (a multiple of NB), read from
 * shared memory: 16-bit loads where NB is a multiple of 16 (the offsets
 * are then even), a byte where it is 8, else byte by byte. */
template <int NB> __device__ __forceinline__ uint32_t tbq_codes_at(const uint8_t *c, int bit0) {
    if constexpr (NB % 16 == 0) {
        const uint16_t *p = (const uint16_t *)(c + bit0 / 8);
        uint32_t v = p[0];
        if constexpr (NB == 32) v |= (uint32_t)p[1] << 16;
        return v;
    } else if constexpr (NB == 8) {
        return c[bit0 / 8];
    } else {
        return tbq_bits_at(c, bit0, NB);
    }
}

/* Block (kv head, split, chunk of qb tokens), rows r < R = gqa * tokens:
 * row r is token i0 + r / gqa, query head h * gqa + r % gqa. The split's
 * positions are cut into one run per warp; each warp walks its run 32
 * positions at a time with its own online softmax (no block barrier in
 * the loop): a half-warp scores one key row at a time (each lane 1/16 of
 * it, partial sums meeting by shuffles, lane k keeping position k's
 * score; over a coded cache lane k scores position k alone), then the
 * warp sums value rows (each lane 1/32 of the dims). At the end the
 * warps' (m, l, acc) merge into the split's. */
template <int HD, int FMT, int MAXR>
__global__ void __launch_bounds__(32 * AT_WARPS) attn_split_kernel(float *out, float *part, int *count, const float *q,
                                                                   int ldq, const void *kc, const void *vc,
                                                                   const int *d_pos, int n, int nh, int nkv, int cap,
                                                                   float scale, int splits, int qb, TbqTab tab) {
    constexpr int DPL = HD / 16; /* key dims per lane */
    constexpr int DL = HD / 32;  /* value dims per lane */
    /* key row pairs a warp loads before it scores them: fewer where the
     * rows or the sums take the registers */
    constexpr int LOOK = MAXR > AT_SMALL || HD > 128 ? 2 : 4;
    constexpr int VLOOK = MAXR > AT_SMALL && HD > 128 ? 4 : 8; /* value rows likewise */
    /* the index formats (tbq, lm3, polar4): bits per code, scale bytes,
     * bytes per 128-value block; q4 and q4h: rows of hd / 32 blocks of 18
     * bytes. Both families are staged (STG: each warp's 32 positions' keys
     * and their values, 16 bytes over for the last row's unaligned word
     * loads), tbq, q4h and polar4 attended in a rotated domain (ROT) */
    constexpr int TB = code_bits_of(FMT), HB = code_hdr_of(FMT), BB = HB + 16 * TB;
    constexpr bool Q4F = FMT == CUDA_KV_Q4 || FMT == CUDA_KV_Q4H, STG = TB || Q4F;
    constexpr bool ROT = (TB && FMT != CUDA_KV_LM3) || FMT == CUDA_KV_Q4H;
    constexpr bool POL = FMT == CUDA_KV_POLAR4; /* dense rotation; scale γ / ‖cb[idx]‖ */
    static_assert(!POL || 32 * AT_WARPS == 128, "polar_rotate_rows takes one thread per column of R");
    /* tbq4 at head dim 128 scores in integers, as the CPU's VNNI kernels */
    constexpr bool I8 = FMT == CUDA_KV_TBQ4 && HD == 128;
    constexpr int VB = Q4F ? HD / 32 * 18 : HD / 128 * BB, STW = STG ? 32 * VB + 16 : 0;
    constexpr int MAIN = MAXR * HD + AT_WARPS * MAXR * 32 + AT_WARPS * 2 * STW / 4, MERGE = AT_WARPS * MAXR * HD;
    constexpr bool ALL = MAXR == AT_SMALL && FMT <= CUDA_KV_F16; /* the coded formats' rows cost arithmetic */
    /* the loop's queries, probabilities and staged rows, then the warps'
     * sums to merge */
    __shared__ __align__(16) float sm[MAIN > MERGE ? MAIN : MERGE];
    __shared__ float wm[AT_WARPS][MAXR], wl[AT_WARPS][MAXR];
    __shared__ float cbs[16]; /* the index formats' codebook */
    __shared__ __align__(16) int qi8[I8 ? MAXR * 32 : 4]; /* I8: each row's queries as bytes, 4 a word */
    __shared__ float qinv[MAXR];                          /* I8: 1 / (the row's byte scale · cb8_s) */
    float *qs = sm, *ps = sm + MAXR * HD;
    uint8_t *kst = (uint8_t *)(sm + MAXR * HD + AT_WARPS * MAXR * 32) + (threadIdx.x >> 5) * 2 * STW, *vst = kst + STW;
    pdl_wait(); /* the position, the queries and the rows just stored */
    const int h = blockIdx.x, sp = blockIdx.y, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int hw = lane >> 4, hl = lane & 15;
    const int gqa = nh / nkv, pos0 = *d_pos, i0 = blockIdx.z * qb;
    const int nt = n - i0 < qb ? n - i0 : qb, R = gqa * nt;
    const int L = pos0 + i0 + nt; /* positions the chunk's last token sees */
    int per = (L + splits - 1) / splits;
    per = (per + 32 * AT_WARPS - 1) / (32 * AT_WARPS) * (32 * AT_WARPS);
    const int j0 = sp * per, j1 = j0 + per < L ? j0 + per : L;
    float *pacc = part, *pml = part + (size_t)n * nh * splits * HD;
    if (j0 >= j1) {
        /* an empty split (fewer positions than splits x 128): m = -inf,
         * l = 0, which the merge below skips without reading its sums */
        if (tid < R) {
            const size_t at = ((size_t)(i0 + tid / gqa) * nh + h * gqa + tid % gqa) * splits + sp;
            pml[2 * at] = -INFINITY, pml[2 * at + 1] = 0;
        }
    } else {
        /* The decode variant over f32 and f16 works every one of its MAXR
         * rows, rows past R on zero queries (never stored): unguarded, the
         * compiler interleaves the rows' shuffle chains, which otherwise
         * wait on each other, and a short context's step is those chains. */
        for (int e = tid; e < (ALL ? MAXR : R) * HD; e += 32 * AT_WARPS) {
            const int r = e / HD, d = e % HD;
            const float x = r < R ? q[(size_t)(i0 + r / gqa) * ldq + (size_t)(h * gqa + r % gqa) * HD + d] : 0.0f;
            qs[e] = ROT && !POL ? x : x * scale;
        }
        if (TB && tid < 16) cbs[tid] = tab.cb[tid];
        __syncthreads();
        if constexpr (ROT && !POL) {
            /* into the keys' domain, then scaled (kv_to_domain_scaled's order;
             * q4h's rotation has no signs: its table's masks are zero) */
            tbq_rotate_rows(qs, R * HD, tab.s1, tab.s2, tab.hinv);
            for (int e = tid; e < R * HD; e += 32 * AT_WARPS) qs[e] *= scale;
            __syncthreads();
        }
        if constexpr (I8) {
            /* each row rounded to bytes by 127 / max|q| (kv/lowbit.c's
             * q8_prep_ref and q_scale, in their order; a row too small for
             * that scale scores 0), a warp a row, lane l on values 4l .. 4l + 3 */
            for (int r = warp; r < R; r += AT_WARPS) {
                const float4 x = *(const float4 *)(qs + r * HD + 4 * lane);
                const float m = warp_max(fmaxf(fmaxf(fabsf(x.x), fabsf(x.y)), fmaxf(fabsf(x.z), fabsf(x.w))));
                const float s = m > 127.0f / 3.40282347e38f ? __fdiv_rn(127.0f, m) : 0.0f;
                const int b0 = __float2int_rn(__fmul_rn(x.x, s)), b1 = __float2int_rn(__fmul_rn(x.y, s));
                const int b2 = __float2int_rn(__fmul_rn(x.z, s)), b3 = __float2int_rn(__fmul_rn(x.w, s));
                qi8[r * 32 + lane] = (b0 & 0xff) | (b1 & 0xff) << 8 | (b2 & 0xff) << 16 | (int)((unsigned)b3 << 24);
                if (lane == 0) qinv[r] = s > 0 ? __fdiv_rn(1.0f, __fmul_rn(s, tab.cb8_s)) : 0.0f;
            }
            __syncthreads();
        }
        constexpr bool F16 = FMT == CUDA_KV_F16;
        const size_t row_bytes = (size_t)HD * (F16 ? 2 : 4);
        const char *K = (const char *)kc + kv_stream_bytes(FMT, HD, cap) * h;
        const char *V = (const char *)vc + kv_stream_bytes(FMT, HD, cap) * h;
        const int wj0 = j0 + warp * (per / AT_WARPS), wj1 = wj0 + per / AT_WARPS < j1 ? wj0 + per / AT_WARPS : j1;
        float m[MAXR], l[MAXR], acc[MAXR][DL];
#pragma unroll
        for (int r = 0; r < MAXR; r++) {
            m[r] = -INFINITY, l[r] = 0;
#pragma unroll
            for (int e = 0; e < DL; e++) acc[r][e] = 0;
        }
        /* the coded formats stage rows with asynchronous copies, one step
         * ahead: the first keys now, each run's values before its keys are
         * scored and the next run's keys before its values are summed */
        if (STG && wj0 < wj1) stage_rows<VB>(kst, K, wj0, wj1 - wj0 < 32 ? wj1 - wj0 : 32, lane);
        for (int base = wj0; base < wj1; base += 32) {
            const int cnt = wj1 - base < 32 ? wj1 - base : 32;
            float mine[MAXR]; /* this lane's position's score, per row */
#pragma unroll
            for (int r = 0; r < MAXR; r++) mine[r] = 0;
            /* tbq, lm3 and polar4 at head dim 128 (one block): this lane's
             * position's value scale (polar4's over ‖cb[idx]‖), which its
             * softmax weight takes (0 past cnt) */
            float fold = 1.0f;
            if constexpr (STG) {
                stage_rows<VB>(vst, V, base, cnt, lane);
                cp_async_wait<1>(); /* this run's keys are in (its values may not be) */
                __syncwarp();
            }
            if constexpr (Q4F) {
                /* lane k scores position k: each block's 16 code bytes as
                 * words in registers, a nibble c made c - 8 exactly as the
                 * low bits of 2^23 + c, less 2^23 + 8 */
#pragma unroll
                for (int b = 0; b < HD / 32; b++) {
                    const uint8_t *blk = kst + lane * VB + b * 18;
                    const float d = f16_f32(*(const uint16_t *)blk);
                    uint32_t w[4];
                    code_words(blk + 2, w);
                    float dot[MAXR];
#pragma unroll
                    for (int r = 0; r < MAXR; r++) dot[r] = 0;
#pragma unroll
                    for (int j = 0; j < 16; j += 4) {
                        float lo[4], hi[4]; /* values j + e and j + 16 + e */
#pragma unroll
                        for (int e = 0; e < 4; e++) {
                            lo[e] = __uint_as_float(0x4B000000u | ((w[j / 4] >> (8 * e)) & 15)) - 8388616.0f;
                            hi[e] = __uint_as_float(0x4B000000u | ((w[j / 4] >> (8 * e + 4)) & 15)) - 8388616.0f;
                        }
#pragma unroll
                        for (int r = 0; r < MAXR; r++)
                            if (r < R) {
                                const float4 qa = *(const float4 *)(qs + r * HD + b * 32 + j);
                                const float4 qb = *(const float4 *)(qs + r * HD + b * 32 + 16 + j);
                                dot[r] = fmaf(qa.x, lo[0], dot[r]), dot[r] = fmaf(qa.y, lo[1], dot[r]);
                                dot[r] = fmaf(qa.z, lo[2], dot[r]), dot[r] = fmaf(qa.w, lo[3], dot[r]);
                                dot[r] = fmaf(qb.x, hi[0], dot[r]), dot[r] = fmaf(qb.y, hi[1], dot[r]);
                                dot[r] = fmaf(qb.z, hi[2], dot[r]), dot[r] = fmaf(qb.w, hi[3], dot[r]);
                            }
                    }
#pragma unroll
                    for (int r = 0; r < MAXR; r++) mine[r] = b ? fmaf(d, dot[r], mine[r]) : d * dot[r];
                }
            }
            if constexpr (TB > 0) {
                /* lane k scores position k: its codes as words in registers,
                 * each value looked up once for all rows */
                constexpr int NW = 4 * TB; /* code words per block */
#pragma unroll
                for (int b = 0; b < HD / 128; b++) {
                    const uint8_t *blk = kst + lane * VB + b * BB;
                    float d = code_scale<HB>(blk), n2 = 0; /* n2: polar4's ‖cb[idx]‖² */
                    uint32_t w[NW];
                    code_words(blk + HB, w);
                    if constexpr (I8) {
                        /* 16 codes a step: their codebook bytes (cb8_bytes) against
                         * 16 query bytes a row, by dp4a; then the integer dot
                         * times the scale times the row's 1 / (byte scales), as
                         * lb_score_int_ref rounds them */
                        int dot8[MAXR];
#pragma unroll
                        for (int r = 0; r < MAXR; r++) dot8[r] = 0;
#pragma unroll
                        for (int c = 0; c < NW; c += 2) {
                            const uint32_t cw[4] = {cb8_bytes(w[c], tab.cb8), cb8_bytes(w[c] >> 16, tab.cb8),
                                                    cb8_bytes(w[c + 1], tab.cb8), cb8_bytes(w[c + 1] >> 16, tab.cb8)};
#pragma unroll
                            for (int r = 0; r < MAXR; r++)
                                if (r < R) {
                                    const int4 qq = *(const int4 *)(qi8 + r * 32 + 2 * c);
                                    dot8[r] = __dp4a((int)cw[0], qq.x, dot8[r]);
                                    dot8[r] = __dp4a((int)cw[1], qq.y, dot8[r]);
                                    dot8[r] = __dp4a((int)cw[2], qq.z, dot8[r]);
                                    dot8[r] = __dp4a((int)cw[3], qq.w, dot8[r]);
                                }
                        }
#pragma unroll
                        for (int r = 0; r < MAXR; r++)
                            if (r < R) mine[r] = __fmul_rn(__fmul_rn(__int2float_rn(dot8[r]), d), qinv[r]);
                    } else {
                        float dot[MAXR];
#pragma unroll
                        for (int r = 0; r < MAXR; r++) dot[r] = 0;
#pragma unroll
                        for (int j = 0; j < 128; j += 4) {
                            float kv[4];
#pragma unroll
                            for (int e = 0; e < 4; e++) {
                                kv[e] = *(const float *)((const char *)cbs + tbq_code4<TB, NW>(w, j + e));
                                if (POL) n2 = fmaf(kv[e], kv[e], n2);
                            }
#pragma unroll
                            for (int r = 0; r < MAXR; r++)
                                if (r < R) {
                                    const float4 qq = *(const float4 *)(qs + r * HD + b * 128 + j);
                                    dot[r] = fmaf(qq.x, kv[0], dot[r]), dot[r] = fmaf(qq.y, kv[1], dot[r]);
                                    dot[r] = fmaf(qq.z, kv[2], dot[r]), dot[r] = fmaf(qq.w, kv[3], dot[r]);
                                }
                        }
                        if (POL) d /= sqrtf(n2);
#pragma unroll
                        for (int r = 0; r < MAXR; r++) mine[r] = b ? fmaf(d, dot[r], mine[r]) : d * dot[r];
                    }
                }
            }
            if constexpr (STG) {
                /* the keys are read: the next run's on their way (an empty
                 * group past the last, so that the count of groups stays
                 * one step ahead), and this run's values in */
                __syncwarp();
                const int nb = base + 32, ncnt = wj1 - nb < 32 ? wj1 - nb : 32;
                if (ncnt > 0) stage_rows<VB>(kst, K, nb, ncnt, lane);
                else cp_async_commit();
                cp_async_wait<1>();
                __syncwarp();
                if (TB && HD == 128) fold = lane < cnt ? code_scale<HB>(vst + lane * VB) : 0.0f;
                if (POL && lane < cnt) {
                    /* the value block's ‖cb[idx]‖, over its 16 code words */
                    const uint32_t *cw = (const uint32_t *)(vst + lane * VB + HB); /* 68-byte rows: aligned */
                    float n2 = 0;
#pragma unroll
                    for (int i = 0; i < 16; i++) {
                        const uint32_t wd = cw[i];
#pragma unroll
                        for (int e = 0; e < 8; e++) {
                            const float c = cbs[(wd >> (4 * e)) & 15];
                            n2 = fmaf(c, c, n2);
                        }
                    }
                    fold /= sqrtf(n2);
                }
            } else if constexpr (FMT == CUDA_KV_Q8) {
                /* tile by tile: lane l's quads l (and l + 32) and their blocks' scales */
                constexpr int QPL = HD / 128;
                float first[MAXR]; /* the first tile's sums, until the second's are made */
#pragma unroll
                for (int r = 0; r < MAXR; r++) first[r] = 0;
                /* a tile with no position (past cnt) scores zeros, never read */
#pragma unroll
                for (int tt = 0; tt < 2; tt++) {
                    uint4 code[QPL][4];
                    float sc[QPL][16];
                    const bool have = tt * 16 < cnt;
                    const uint8_t *tile = (const uint8_t *)K + (size_t)((base + 16 * tt) / 16) * 17 * HD;
#pragma unroll
                    for (int u = 0; u < QPL; u++) {
                        const int quad = lane + 32 * u;
#pragma unroll
                        for (int c = 0; c < 4; c++)
                            code[u][c] = have ? ((const uint4 *)(tile + HD + 64 * quad))[c] : make_uint4(0, 0, 0, 0);
                        if (have) q8_scales(tile, quad / 8, sc[u]);
                        else
#pragma unroll
                            for (int p = 0; p < 16; p++) sc[u][p] = 0;
                    }
#pragma unroll
                    for (int r = 0; r < MAXR; r++)
                        if (ALL || r < R) {
                            float v[16];
#pragma unroll
                            for (int p = 0; p < 16; p++) v[p] = 0;
#pragma unroll
                            for (int u = 0; u < QPL; u++) {
                                const float4 qq = *(const float4 *)(qs + r * HD + 4 * (lane + 32 * u));
#pragma unroll
                                for (int c = 0; c < 4; c++) {
                                    const uint32_t w4[4] = {code[u][c].x, code[u][c].y, code[u][c].z, code[u][c].w};
#pragma unroll
                                    for (int e = 0; e < 4; e++) {
                                        const uint32_t wd = w4[e]; /* position 4c + e's 4 codes */
                                        float t = qq.x * (float)(int8_t)(wd & 0xff);
                                        t = fmaf(qq.y, (float)(int8_t)((wd >> 8) & 0xff), t);
                                        t = fmaf(qq.z, (float)(int8_t)((wd >> 16) & 0xff), t);
                                        t = fmaf(qq.w, (float)(int8_t)(wd >> 24), t);
                                        v[4 * c + e] = fmaf(t, sc[u][4 * c + e], v[4 * c + e]);
                                    }
                                }
                            }
                            const float sum = q8_warp_sums(v, lane);
                            if (tt == 0) first[r] = sum;
                            else {
                                /* lane k keeps position k's: tile k / 16, from lane 2 (k % 16) */
                                const float a = __shfl_sync(0xffffffffu, first[r], (2 * lane) & 31);
                                const float b = __shfl_sync(0xffffffffu, sum, (2 * lane) & 31);
                                mine[r] = lane < 16 ? a : b;
                            }
                        }
                }
            } else
            for (int k0 = 0; k0 < 16; k0 += LOOK) {
                float kr[LOOK][DPL];
#pragma unroll
                for (int u = 0; u < LOOK; u++) {
                    const int jj = 2 * (k0 + u) + hw;
                    if (jj < cnt) row_load<F16, DPL>(K + (size_t)(base + jj) * row_bytes, hl * DPL, kr[u]);
                    else
#pragma unroll
                        for (int e = 0; e < DPL; e++) kr[u][e] = 0;
                }
#pragma unroll
                for (int u = 0; u < LOOK; u++)
#pragma unroll
                    for (int r = 0; r < MAXR; r++)
                        if (ALL || r < R) {
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
                            /* position 2 (k0 + u) + h sits in half-warp h; lane k keeps position k's */
                            const float o = __shfl_sync(0xffffffffu, t, (lane & 1) << 4);
                            if ((lane >> 1) == k0 + u) mine[r] = o;
                        }
            }
            const int j = base + lane;
#pragma unroll
            for (int r = 0; r < MAXR; r++)
                if (ALL || r < R) {
                    const float sc = lane < cnt && j <= pos0 + i0 + r / gqa ? mine[r] : -INFINITY;
                    const float mnew = fmaxf(m[r], warp_max(sc));
                    float p = 0, alpha = 1;
                    if (mnew != -INFINITY) {
                        alpha = m[r] == -INFINITY ? 0 : expf(m[r] - mnew);
                        p = sc == -INFINITY ? 0 : expf(sc - mnew);
                    }
                    l[r] = l[r] * alpha + warp_sum(p);
                    m[r] = mnew;
#pragma unroll
                    for (int e = 0; e < DL; e++) acc[r][e] *= alpha;
                    ps[(warp * MAXR + r) * 32 + lane] = TB && HD == 128 ? __fmul_rn(p, fold) : p;
                }
            __syncwarp();
            if constexpr (Q4F) {
                /* lane l's DL dims of each position: in block l DL / 32, the
                 * low nibbles of DL bytes from (l DL % 32) when that is below
                 * 16, else their high nibbles from 16 less; weighed by p times
                 * the block's scale */
                const int bq = lane * DL / 32, j0 = lane * DL % 32, bo = 2 + (j0 & 15), ns = j0 >= 16 ? 4 : 0;
                for (int u = 0; u < cnt; u++) {
                    const uint8_t *blk = vst + u * VB + bq * 18;
                    const float d = f16_f32(*(const uint16_t *)blk);
                    const uint16_t *c16 = (const uint16_t *)(blk + bo); /* even: rows and blocks are */
                    uint32_t cw[DL / 4];
#pragma unroll
                    for (int i = 0; i < DL / 4; i++) cw[i] = c16[2 * i] | (uint32_t)c16[2 * i + 1] << 16;
                    float vv[DL];
#pragma unroll
                    for (int e = 0; e < DL; e++)
                        vv[e] = __uint_as_float(0x4B000000u | ((cw[e / 4] >> (8 * (e % 4) + ns)) & 15)) - 8388616.0f;
#pragma unroll
                    for (int r = 0; r < MAXR; r++)
                        if (r < R) {
                            const float w = __fmul_rn(ps[(warp * MAXR + r) * 32 + u], d);
#pragma unroll
                            for (int e = 0; e < DL; e++) acc[r][e] = fmaf(w, vv[e], acc[r][e]);
                        }
                }
            } else if constexpr (TB > 0) {
                /* lane l's DL dims of each position, weighed by p times its
                 * block's scale (at head dim 128 already in ps) */
                const int b = lane * DL / 128, jl = lane * DL % 128;
                for (int u = 0; u < cnt; u++) {
                    const uint8_t *blk = vst + u * VB + b * BB;
                    const float d = HD == 128 ? 1.0f : code_scale<HB>(blk);
                    const uint32_t cw = tbq_codes_at<TB * DL>(blk + HB, TB * jl);
                    float vv[DL];
#pragma unroll
                    for (int e = 0; e < DL; e++)
                        vv[e] = *(const float *)((const char *)cbs + ((e ? cw >> (TB * e - 2) : cw << 2) &
                                                                      (((1u << TB) - 1) << 2)));
#pragma unroll
                    for (int r = 0; r < MAXR; r++)
                        if (r < R) {
                            const float w = HD == 128 ? ps[(warp * MAXR + r) * 32 + u]
                                                      : __fmul_rn(ps[(warp * MAXR + r) * 32 + u], d);
#pragma unroll
                            for (int e = 0; e < DL; e++) acc[r][e] = fmaf(w, vv[e], acc[r][e]);
                        }
                }
            } else if constexpr (FMT == CUDA_KV_Q8) {
                /* lane l's DL dims of each position pair, weighed by p times the position's scale */
                for (int tt = 0; tt < 2 && tt * 16 < cnt; tt++) {
                    const uint8_t *tile = (const uint8_t *)V + (size_t)((base + 16 * tt) / 16) * 17 * HD;
                    float sc[16];
                    q8_scales(tile, lane * DL / 32, sc);
                    uint32_t cw[8][DL / 2];
#pragma unroll
                    for (int i = 0; i < 8; i++) {
                        const uint32_t *src = (const uint32_t *)(tile + HD + i * 2 * HD + 2 * lane * DL);
#pragma unroll
                        for (int c = 0; c < DL / 2; c++) cw[i][c] = src[c];
                    }
#pragma unroll
                    for (int r = 0; r < MAXR; r++)
                        if (ALL || r < R) {
                            const float *pr = ps + (warp * MAXR + r) * 32 + 16 * tt;
#pragma unroll
                            for (int i = 0; i < 8; i++) {
                                /* positions past cnt weigh 0, their scales unread */
                                const int p0 = 2 * i, p1 = 2 * i + 1;
                                const float w0 = 16 * tt + p0 < cnt ? __fmul_rn(pr[p0], sc[p0]) : 0.0f;
                                const float w1 = 16 * tt + p1 < cnt ? __fmul_rn(pr[p1], sc[p1]) : 0.0f;
#pragma unroll
                                for (int c = 0; c < DL / 2; c++) {
                                    /* dims 2c and 2c + 1: bytes (pos 2i, pos 2i+1) of each */
                                    const uint32_t wd = cw[i][c];
                                    acc[r][2 * c] = fmaf(w0, (float)(int8_t)(wd & 0xff), acc[r][2 * c]);
                                    acc[r][2 * c] = fmaf(w1, (float)(int8_t)((wd >> 8) & 0xff), acc[r][2 * c]);
                                    acc[r][2 * c + 1] = fmaf(w0, (float)(int8_t)((wd >> 16) & 0xff), acc[r][2 * c + 1]);
                                    acc[r][2 * c + 1] = fmaf(w1, (float)(int8_t)(wd >> 24), acc[r][2 * c + 1]);
                                }
                            }
                        }
                }
            } else
            for (int v0 = 0; v0 < cnt; v0 += VLOOK) {
                float vr[VLOOK][DL];
#pragma unroll
                for (int u = 0; u < VLOOK; u++) {
                    if (v0 + u < cnt) row_load<F16, DL>(V + (size_t)(base + v0 + u) * row_bytes, lane * DL, vr[u]);
                    else
#pragma unroll
                        for (int e = 0; e < DL; e++) vr[u][e] = 0;
                }
#pragma unroll
                for (int u = 0; u < VLOOK; u++)
#pragma unroll
                    for (int r = 0; r < MAXR; r++)
                        if ((ALL || r < R) && v0 + u < cnt) {
                            const float p = ps[(warp * MAXR + r) * 32 + v0 + u];
#pragma unroll
                            for (int e = 0; e < DL; e++) acc[r][e] = fmaf(p, vr[u][e], acc[r][e]);
                        }
            }
            __syncwarp();
        }
        pdl_release(); /* the cache is read: the next matmul may start on its weights */
        __syncthreads(); /* qs and ps are done with: the merge reuses sm */
        float *wacc = sm;
#pragma unroll
        for (int r = 0; r < MAXR; r++)
            if (r < R) {
#pragma unroll
                for (int e = 0; e < DL; e++) wacc[(warp * MAXR + r) * HD + lane * DL + e] = acc[r][e];
                if (lane == 0) wm[warp][r] = m[r], wl[warp][r] = l[r];
            }
        __syncthreads();
        for (int e = tid; e < R * HD; e += 32 * AT_WARPS) {
            const int r = e / HD, d = e % HD;
            float M = -INFINITY;
#pragma unroll
            for (int w = 0; w < AT_WARPS; w++) M = fmaxf(M, wm[w][r]);
            float num = 0, den = 0;
#pragma unroll
            for (int w = 0; w < AT_WARPS; w++)
                if (wm[w][r] != -INFINITY) {
                    const float c = expf(wm[w][r] - M);
                    num = fmaf(c, wacc[(w * MAXR + r) * HD + d], num);
                    den = fmaf(c, wl[w][r], den);
                }
            const size_t row = (size_t)(i0 + r / gqa) * nh + h * gqa + r % gqa, at = row * splits + sp;
            /* one split: this is the answer */
            /* a rotated format's, over warp 0's sums of the same (row,
             * dim), which no other thread reads: rotated back below */
            if (ROT && splits == 1) wacc[r * HD + d] = num / den;
            else if (splits == 1) out[row * HD + d] = num / den;
            else {
                pacc[at * HD + d] = num;
                if (d == 0) pml[2 * at] = M, pml[2 * at + 1] = den;
            }
        }
        if (ROT && splits == 1) {
            /* back from the values' domain (kv_from_domain_scaled) */
            __syncthreads();
            if constexpr (POL) polar_rotate_rows<MAXR>(sm, R, tab.rmt);
            else tbq_rotate_rows(sm, R * HD, tab.s2, tab.s1, tab.hinv);
            for (int e = tid; e < R * HD; e += 32 * AT_WARPS) {
                const int r = e / HD;
                out[((size_t)(i0 + r / gqa) * nh + h * gqa + r % gqa) * HD + e % HD] = sm[e];
            }
        }
    }
    if (splits == 1) return;
    /* The last of the splits of this (kv head, chunk) to finish merges
     * them all (the counter is left at zero for the next launch), which
     * saves a launch and its wait:
     *   M = max m_j,  out = sum_j e^(m_j - M) acc_j / sum_j e^(m_j - M) l_j */
    __shared__ int last;
    __shared__ float wsp[256], red[AT_WARPS];
    int *counter = count + blockIdx.z * nkv + h;
    __threadfence(); /* this block's partials are visible before it counts itself */
    __syncthreads();
    if (tid == 0) {
        last = atomicAdd(counter, 1) == splits - 1;
        if (last) *counter = 0;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    /* the other blocks' partials, read past L1 (__ldcg): this SM's L1 may
     * hold none of them, but never trust it to */
    for (int r = 0; r < R; r++) {
        const size_t row = (size_t)(i0 + r / gqa) * nh + h * gqa + r % gqa, at = row * splits;
        float M = -INFINITY;
        for (int j = tid; j < splits; j += 32 * AT_WARPS) M = fmaxf(M, __ldcg(pml + 2 * (at + j)));
        M = warp_max(M);
        if (lane == 0) red[warp] = M;
        __syncthreads();
        M = red[0];
#pragma unroll
        for (int w = 1; w < AT_WARPS; w++) M = fmaxf(M, red[w]);
        float den = 0;
        for (int j = tid; j < splits; j += 32 * AT_WARPS) {
            const float mj = __ldcg(pml + 2 * (at + j));
            wsp[j] = mj == -INFINITY ? 0 : expf(mj - M);
            den = fmaf(wsp[j], __ldcg(pml + 2 * (at + j) + 1), den);
        }
        den = warp_sum(den);
        __syncthreads(); /* red[] was read for M by every thread */
        if (lane == 0) red[warp] = den;
        __syncthreads();
        den = 0;
#pragma unroll
        for (int w = 0; w < AT_WARPS; w++) den += red[w];
        for (int d = tid; d < HD; d += 32 * AT_WARPS) {
            float num = 0;
#pragma unroll 8
            for (int j = 0; j < splits; j++)
                if (wsp[j] != 0) num = fmaf(wsp[j], __ldcg(pacc + (at + j) * HD + d), num); /* empty: never written */
            if (ROT) sm[r * HD + d] = num / den; /* rotated back below, all rows at once */
            else out[row * HD + d] = num / den;
        }
        __syncthreads(); /* wsp and red are rewritten for the next row */
    }
    if (ROT) {
        /* back from the values' domain */
        if constexpr (POL) polar_rotate_rows<MAXR>(sm, R, tab.rmt);
        else tbq_rotate_rows(sm, R * HD, tab.s2, tab.s1, tab.hinv);
        for (int e = tid; e < R * HD; e += 32 * AT_WARPS) {
            const int r = e / HD;
            out[((size_t)(i0 + r / gqa) * nh + h * gqa + r % gqa) * HD + e % HD] = sm[e];
        }
    }
}

extern "C" size_t cuda_attn_part_floats(int n, int nh, int hd, int splits) {
    return (size_t)n * nh * splits * (hd + 2);
}

/* Tokens per block: all n when their rows fit the decode variant, else as
 * many as fill the large one's rows. */
static int tokens_per_block(int n, int nh, int nkv, int hd) {
    const int gqa = nh / nkv;
    if (gqa * n <= AT_SMALL) return n;
    return gqa >= at_rows(hd) ? 1 : at_rows(hd) / gqa;
}

extern "C" int cuda_attn_splits(int n, int nh, int nkv, int hd, int cap, int sm_count) {
    const int qb = tokens_per_block(n, nh, nkv, hd), chunks = (n + qb - 1) / qb;
    /* four blocks per SM (about what fits at once; 8 and 16 were slower
     * for every scheme, docs/cuda.md); no split shorter than a block's 128
     * positions; at most 256 */
    int s = (4 * sm_count + nkv * chunks - 1) / (nkv * chunks);
    const int most = (cap + 32 * AT_WARPS - 1) / (32 * AT_WARPS);
    s = s > most ? most : s;
    s = s > 256 ? 256 : s;
    return s < 1 ? 1 : s;
}

template <int HD, int FMT>
static void launch(dim3 g, float *out, float *part, int *count, const float *q, int ldq, const void *kc,
                   const void *vc, const float *rot, const int *pos, int n, int nh, int nkv, int cap, float scale,
                   int splits, int qb) {
    TbqTab tab;
    memset(&tab, 0, sizeof tab);
    if (code_bits_of(FMT)) tbq_cuda_tab(code_bits_of(FMT), &tab);
    if (FMT == CUDA_KV_Q4H) tab.hinv = 1.0f / sqrtf(128.0f); /* H / √128, no signs */
    if (FMT == CUDA_KV_POLAR4 && rot) tab.rm = rot, tab.rmt = rot + 128 * 128;
    if (FMT >= CUDA_KV_TBQ2 && qb * (nh / nkv) <= 2)
        pdl_launch(attn_split_kernel<HD, FMT, 2>, g, dim3(32 * AT_WARPS), out, part, count, q, ldq, kc, vc, pos, n, nh,
                   nkv, cap, scale, splits, qb, tab);
    else if (qb * (nh / nkv) <= AT_SMALL)
        pdl_launch(attn_split_kernel<HD, FMT, AT_SMALL>, g, dim3(32 * AT_WARPS), out, part, count, q, ldq, kc, vc, pos,
                   n, nh, nkv, cap, scale, splits, qb, tab);
    else
        pdl_launch(attn_split_kernel<HD, FMT, at_rows(HD)>, g, dim3(32 * AT_WARPS), out, part, count, q, ldq, kc, vc,
                   pos, n, nh, nkv, cap, scale, splits, qb, tab);
}

/* launch for the format: q4, q4h, lm3 and polar4 at head dim 128 only
 * (kernels/cuda.h; model/gpu.c refuses them elsewhere). */
template <int HD, typename... A> static void launch_fmt(int fmt, A... a) {
    switch (fmt) {
    case CUDA_KV_F16: launch<HD, CUDA_KV_F16>(a...); break;
    case CUDA_KV_Q8: launch<HD, CUDA_KV_Q8>(a...); break;
    case CUDA_KV_TBQ2: launch<HD, CUDA_KV_TBQ2>(a...); break;
    case CUDA_KV_TBQ3: launch<HD, CUDA_KV_TBQ3>(a...); break;
    case CUDA_KV_TBQ4: launch<HD, CUDA_KV_TBQ4>(a...); break;
    default:
        if constexpr (HD == 128) {
            if (fmt == CUDA_KV_Q4) return launch<HD, CUDA_KV_Q4>(a...);
            if (fmt == CUDA_KV_Q4H) return launch<HD, CUDA_KV_Q4H>(a...);
            if (fmt == CUDA_KV_LM3) return launch<HD, CUDA_KV_LM3>(a...);
            if (fmt == CUDA_KV_POLAR4) return launch<HD, CUDA_KV_POLAR4>(a...);
        }
        launch<HD, CUDA_KV_F32>(a...);
    }
}

extern "C" void cuda_attention(float *d_out, const float *d_q, int ldq, const void *d_kc, const void *d_vc, int fmt,
                               const float *d_rot, const int *d_pos, int n, int nh, int nkv, int hd, int cap, float scale, float *d_part,
                               int *d_count, int splits) {
    const int qb = tokens_per_block(n, nh, nkv, hd);
    const dim3 g(nkv, splits, (n + qb - 1) / qb);
#define ARGS g, d_out, d_part, d_count, d_q, ldq, d_kc, d_vc, d_rot, d_pos, n, nh, nkv, cap, scale, splits, qb
    if (hd == 128) launch_fmt<128>(fmt, ARGS);
    else launch_fmt<256>(fmt, ARGS);
#undef ARGS
    cuda_note("attention");
}
