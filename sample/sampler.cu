/* sampler.cu: the GPU twin of sampler.c's sampler_sample, so that a decode
 * step on the GPU sends only the token id back over the bus, not the 150K
 * logits of its last row.
 *
 * Data flow: model/gpu.c's forward leaves the last row's logits [V] in
 * device memory; model_sample makes a SampleDraw (sampler_draw: the
 * filters, the coin from the host's generator, the penalty window's
 * distinct tokens) and gpu_sample hands it to cuda_sample, which writes
 * the chosen id there.
 *
 * One block of 1024 threads walks the logits (L2-resident) a few times:
 *
 *   penalties -> max (temperature 0: the first maximum, done) -> softmax
 *   -> keep the tokens with key >= T -> renormalise -> draw with the coin
 *
 * sampler_dist keeps a prefix of the tokens sorted by probability, ties by
 * id: top-k's k, top-p's shortest prefix holding top_p of the candidates'
 * mass, min-p's tokens at least min_p times the most probable one. Every
 * such prefix is the set of tokens whose key
 *
 *   key = |30 bits of the f32 probability (<= 1)|18 bits: 2^18 - 1 - id|
 *
 * is at least some T (keys are distinct, larger is earlier), so the
 * vocabulary is never sorted. Top-k's T is found by a radix descent over
 * the keys, 12 bits a step (4096 bins in shared memory), counting tokens.
 * A top-k of at most 1024 then leaves few enough candidates to sort in
 * shared memory (bitonic, one per thread), and top-p and min-p cut that
 * list as sampler_dist does. Without one, top-p descends the same way by
 * summed masses, 50-bit fixed-point integers, so that their atomic sums do
 * not depend on the order threads add them. The draw then walks the kept
 * tokens in id order as sampler_sample does: each thread a contiguous
 * chunk, the chunks' sums scanned.
 *
 * The CPU sums probabilities (in f64) in one order and this in another,
 * and the expf differ by an ulp: the same coin picks the same token
 * unless it lands within rounding of a boundary between two
 * (tests/test_cuda.c bounds how close).
 */
#include <limits.h>
#include <stdint.h>

#include "kernels/cuda.h"
#include "kernels/cuda_common.cuh"

#define SMP_THREADS 1024
#define SMP_ID_BITS 18
#define SMP_DIGIT 12                      /* bits per radix step: 4096 bins, 4 per thread */
#define SMP_BINS (1 << SMP_DIGIT)
#define SMP_FX 1125899906842624.0 /* 2^50: the fixed point of masses */

/* 48 bits: a probability (at most 1) has its top two bits clear */
__device__ __forceinline__ uint64_t smp_key(float p, int i) {
    return ((uint64_t)(__float_as_uint(p) & 0x3fffffffu) << SMP_ID_BITS) | (uint64_t)((1 << SMP_ID_BITS) - 1 - i);
}

__device__ __forceinline__ uint64_t smp_fx(float p) { return (uint64_t)((double)p * SMP_FX); }

struct SmpShared {
    unsigned long long bins[SMP_BINS];
    unsigned long long u[32];
    double d[32];
    float f[32];
    int i[32];
    unsigned long long key, rem;
    double mass;
    int hit, found, n, keep;
};

/* Inclusive scan of v over the block in thread order. */
__device__ uint64_t block_scan_u64(uint64_t v, SmpShared &sh) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    for (int o = 1; o < 32; o <<= 1) {
        const uint64_t t = __shfl_up_sync(0xffffffffu, v, o);
        if (lane >= o) v += t;
    }
    __syncthreads();
    if (lane == 31) sh.u[w] = v;
    __syncthreads();
    uint64_t before = 0;
    for (int k = 0; k < w; k++) before += sh.u[k];
    return v + before;
}

__device__ uint64_t block_sum_u64(uint64_t v, SmpShared &sh) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) sh.u[threadIdx.x >> 5] = v;
    __syncthreads();
    uint64_t t = 0;
    for (int k = 0; k < 32; k++) t += sh.u[k];
    return t;
}

#define SMP_AHEAD 8 /* loads a thread has in flight */

/* f(i, src[i]) for this thread's elements i = tid + 1024 j, SMP_AHEAD
 * loads issued before their uses: one block reading 150K values waits on
 * latency, not bandwidth. */
template <typename F> __device__ __forceinline__ void smp_each(const float *src, int V, F f) {
    int i = threadIdx.x;
    for (; i + (SMP_AHEAD - 1) * SMP_THREADS < V; i += SMP_AHEAD * SMP_THREADS) {
        float v[SMP_AHEAD];
#pragma unroll
        for (int j = 0; j < SMP_AHEAD; j++) v[j] = src[i + j * SMP_THREADS];
#pragma unroll
        for (int j = 0; j < SMP_AHEAD; j++) f(i + j * SMP_THREADS, v[j]);
    }
    for (; i < V; i += SMP_THREADS) f(i, src[i]);
}

/* f(i) for i in [i0, i1) in order, the values g(i) loaded SMP_AHEAD at a
 * time; f returns nonzero to stop. */
template <typename G, typename F> __device__ __forceinline__ void smp_run(int i0, int i1, G g, F f) {
    for (int i = i0; i < i1; i += SMP_AHEAD) {
        float v[SMP_AHEAD];
#pragma unroll
        for (int j = 0; j < SMP_AHEAD; j++) v[j] = i + j < i1 ? g(i + j) : 0.0f;
#pragma unroll
        for (int j = 0; j < SMP_AHEAD; j++)
            if (i + j < i1 && f(i + j, v[j])) return;
    }
}

/* The key K with (count or mass of keys > K) < need <= (that of keys >= K):
 * the need-th largest key (by_mass 0), or where the mass from the top
 * first reaches need (by_mass 1). 0 (every key) when the total is short.
 * The first step's 12 bits are a probability's exponent and 5 bits of
 * its mantissa, so a vocabulary spreads over many bins and few threads
 * add to the same one at once. */
template <int BY_MASS> __device__ uint64_t smp_descend(const float *prob, int V, uint64_t need, SmpShared &sh) {
    unsigned *count = (unsigned *)sh.bins; /* counts fit 32 bits, whose atomics are the fast ones */
    uint64_t prefix = 0;
    for (int shift = 48 - SMP_DIGIT; shift >= 0; shift -= SMP_DIGIT) {
        for (int b = threadIdx.x; b < SMP_BINS; b += SMP_THREADS)
            if (BY_MASS) sh.bins[b] = 0;
            else count[b] = 0;
        if (threadIdx.x == 0) sh.found = 0;
        __syncthreads();
        const uint64_t high = ~0ull << (shift + SMP_DIGIT);
        smp_each(prob, V, [&](int i, float p) {
            const uint64_t k = smp_key(p, i);
            if ((k & high) != prefix) return;
            const int b = (k >> shift) & (SMP_BINS - 1);
            if (BY_MASS) atomicAdd(&sh.bins[b], (unsigned long long)smp_fx(p));
            else atomicAdd(&count[b], 1u);
        });
        __syncthreads();
        /* bins from the top down: thread t holds bins 4095 - 4t .. 4092 - 4t */
        const int b0 = SMP_BINS - 1 - 4 * threadIdx.x;
        uint64_t v[4], own = 0;
#pragma unroll
        for (int j = 0; j < 4; j++) own += v[j] = BY_MASS ? sh.bins[b0 - j] : count[b0 - j];
        uint64_t run = block_scan_u64(own, sh) - own;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            if (run < need && run + v[j] >= need) {
                sh.key = prefix | ((uint64_t)(b0 - j) << shift);
                sh.rem = need - run;
                sh.found = 1;
            }
            run += v[j];
        }
        __syncthreads();
        if (!sh.found) return 0;
        prefix = sh.key, need = sh.rem;
        __syncthreads();
    }
    return prefix;
}

/* Inclusive scan of v (f64) over the block in thread order. */
__device__ double block_scan_d(double v, SmpShared &sh) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    for (int o = 1; o < 32; o <<= 1) {
        const double t = __shfl_up_sync(0xffffffffu, v, o);
        if (lane >= o) v += t;
    }
    __syncthreads();
    if (lane == 31) sh.d[w] = v;
    __syncthreads();
    double before = 0;
    for (int k = 0; k < w; k++) before += sh.d[k];
    return v + before;
}

/* Top-k of at most 1024 with top-p and min-p after it, as sampler_dist:
 * the k candidates (keys >= Tk) sorted in shared memory (bitonic, one per
 * thread), their mass and its prefix in that order, then the shortest
 * prefix top-p keeps and the tokens at least min-p of the first. Sets the
 * threshold key and the kept mass. */
__device__ void smp_small(const float *prob, int V, int k, uint64_t Tk, float top_p, float min_p, uint64_t *T,
                          double *kept, SmpShared &sh) {
    unsigned long long *cand = sh.bins;
    const int tid = threadIdx.x;
    if (tid == 0) sh.n = 0;
    cand[tid] = 0;
    __syncthreads();
    smp_each(prob, V, [&](int i, float p) {
        const uint64_t key = smp_key(p, i);
        if (key >= Tk) cand[atomicAdd(&sh.n, 1)] = key;
    });
    __syncthreads();
    for (int size = 2; size <= SMP_THREADS; size <<= 1)
        for (int j = size >> 1; j > 0; j >>= 1) {
            const int o = tid ^ j;
            if (o > tid) {
                const uint64_t a = cand[tid], b = cand[o];
                /* descending overall: the last merge has (tid & size) == 0 everywhere */
                if ((tid & size) == 0 ? a < b : a > b) cand[tid] = b, cand[o] = a;
            }
            __syncthreads();
        }
    const int m = k < V ? k : V;
    const uint64_t mine = cand[tid];
    const float p = tid < m ? __uint_as_float((uint32_t)(mine >> SMP_ID_BITS)) : 0.0f;
    const double incl = block_scan_d(p, sh);
    if (tid == SMP_THREADS - 1) sh.mass = incl;
    if (tid == 0) sh.keep = m;
    __syncthreads();
    const double mass = sh.mass;
    /* top-p: the first candidate whose running share reaches top_p ends the prefix */
    if (top_p < 1 && tid < m && incl / mass >= top_p) atomicMin(&sh.keep, tid + 1);
    /* min-p: from the second on, the first below min_p times the first ends it */
    const float floor_p = __fmul_rn(min_p, __uint_as_float((uint32_t)(cand[0] >> SMP_ID_BITS)));
    if (min_p > 0 && tid >= 1 && tid < m && p < floor_p) atomicMin(&sh.keep, tid);
    __syncthreads();
    const int keep = sh.keep;
    if (tid == keep - 1) sh.mass = incl;
    __syncthreads();
    *T = cand[keep - 1];
    *kept = sh.mass;
    __syncthreads();
}

/* out[0] the token, out[1] how many tokens had a non-zero chance. prob
 * [V] is scratch. pen [2 n_pen]: distinct tokens, then their counts. */
__global__ void __launch_bounds__(SMP_THREADS) sample_kernel(int *out, float *__restrict__ logits, int V,
                                                             float *__restrict__ prob, const int *pen, int n_pen,
                                                             float temperature, int top_k, float top_p, float min_p,
                                                             float coin, float repeat, float frequency,
                                                             float presence) {
    __shared__ SmpShared sh;
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
    /* llama.cpp's penalties, as sampler.c's penalize */
    for (int j = tid; j < n_pen; j += SMP_THREADS) {
        float l = logits[pen[j]];
        l = l > 0 ? __fdiv_rn(l, repeat) : __fmul_rn(l, repeat);
        logits[pen[j]] = __fsub_rn(__fsub_rn(l, __fmul_rn((float)pen[n_pen + j], frequency)), presence);
    }
    __syncthreads();
    /* the first maximum, NaNs skipped (argmax_ref) */
    float best = 0;
    int at = -1;
    smp_each(logits, V, [&](int i, float l) {
        if (l == l && (at < 0 || l > best)) best = l, at = i;
    });
    for (int o = 16; o > 0; o >>= 1) {
        const float b2 = __shfl_xor_sync(0xffffffffu, best, o);
        const int a2 = __shfl_xor_sync(0xffffffffu, at, o);
        if (a2 >= 0 && (at < 0 || b2 > best || (b2 == best && a2 < at))) best = b2, at = a2;
    }
    if (lane == 0) sh.f[w] = best, sh.i[w] = at;
    __syncthreads();
    best = 0, at = -1;
    for (int k = 0; k < 32; k++)
        if (sh.i[k] >= 0 && (at < 0 || sh.f[k] > best || (sh.f[k] == best && sh.i[k] < at)))
            best = sh.f[k], at = sh.i[k];
    if (temperature <= 0) {
        if (tid == 0) out[0] = at < 0 ? 0 : at, out[1] = 1;
        return;
    }
    /* softmax as sampler_dist: f32 exponentials, their sum in f64 */
    const float mx = at < 0 ? logits[0] : best;
    double s = 0;
    smp_each(logits, V, [&](int i, float l) {
        const float e = expf(__fdiv_rn(__fsub_rn(l, mx), temperature));
        prob[i] = e;
        s += e;
    });
    const double sum = block_sum_d(s, sh.d);
    /* sampler_dist divides in f64; a product by the f64 inverse rounds to the same f32 but where
     * the quotient lies within 2^-52 of a tie between two floats */
    const double inv = 1.0 / sum;
    smp_each(prob, V, [&](int i, float e) { prob[i] = (float)((double)e * inv); });
    __syncthreads();
    const int filtered = top_k > 0 || top_p < 1 || min_p > 0;
    uint64_t T = 0;
    double kept = 1;
    const uint64_t Tk = filtered && top_k > 0 && top_k < V ? smp_descend<0>(prob, V, (uint64_t)top_k, sh) : 0;
    if (filtered && top_k > 0 && min(top_k, V) <= SMP_THREADS)
        smp_small(prob, V, top_k, Tk, top_p, min_p, &T, &kept, sh);
    else if (filtered) {
        /* no top-k, or a large one: top-p by the mass of the keys from the top */
        uint64_t Tp = 0;
        if (top_p < 1) {
            uint64_t m = 0;
            smp_each(prob, V, [&](int i, float p) {
                if (smp_key(p, i) >= Tk) m += smp_fx(p);
            });
            const double need = ceil((double)top_p * (double)block_sum_u64(m, sh));
            Tp = smp_descend<1>(prob, V, need < 1 ? 1 : (uint64_t)need, sh);
        }
        /* min-p against the most probable token, which is always kept */
        const float pmax = (float)(1.0 / sum);
        const uint64_t top = smp_key(pmax, at < 0 ? 0 : at);
        const uint32_t floor_bits = __float_as_uint(__fmul_rn(min_p, pmax)) & 0x3fffffffu;
        const uint64_t Tm = min_p > 0 ? (uint64_t)floor_bits << SMP_ID_BITS : 0;
        T = Tk > Tp ? Tk : Tp;
        T = T > Tm ? T : Tm;
        T = T < top ? T : top;
        double k = 0;
        smp_each(prob, V, [&](int i, float p) {
            if (smp_key(p, i) >= T) k += p;
        });
        kept = block_sum_d(k, sh.d);
    }
    /* The draw, in id order as sampler_sample's, with its f64 running sum:
     * thread t owns the ids [t C, (t + 1) C); its chunk's sum, the sums'
     * scan over the block, then the chunk that holds the coin walks on. */
    const int C = (V + SMP_THREADS - 1) / SMP_THREADS, i0 = min(V, tid * C), i1 = min(V, i0 + C);
    auto chance = [&](int i) -> float {
        const float p = prob[i];
        return !filtered ? p : smp_key(p, i) >= T ? (float)((double)p / kept) : 0.0f;
    };
    double c = 0;
    int nz = 0, last = -1;
    smp_run(i0, i1, chance, [&](int i, float p) {
        if (p > 0) c += p, nz++, last = i;
        return 0;
    });
    double incl = c;
    for (int o = 1; o < 32; o <<= 1) {
        const double t = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += t;
    }
    __syncthreads();
    if (lane == 31) sh.d[w] = incl;
    if (tid == 0) sh.hit = INT_MAX;
    __syncthreads();
    double run = incl - c;
    for (int k = 0; k < w; k++) run += sh.d[k];
    /* a chunk that ends past the coin looks for the first token whose
     * running sum passes it (one that rounding started past the coin
     * answers with its first token; the smallest answer wins) */
    if ((double)coin < run + c)
        smp_run(i0, i1, chance, [&](int i, float p) {
            if (p <= 0) return 0;
            run += p;
            if ((double)coin >= run) return 0;
            atomicMin(&sh.hit, i);
            return 1;
        });
    const uint64_t nkept = block_sum_u64((uint64_t)nz, sh);
    /* rounding left the coin past the total: the last token with a chance */
    int lastall = last;
    for (int o = 16; o > 0; o >>= 1) lastall = max(lastall, __shfl_xor_sync(0xffffffffu, lastall, o));
    if (lane == 0) sh.i[w] = lastall;
    __syncthreads();
    if (tid == 0) {
        int l = -1;
        for (int k = 0; k < 32; k++) l = max(l, sh.i[k]);
        out[0] = sh.hit != INT_MAX ? sh.hit : l < 0 ? 0 : l;
        out[1] = (int)nkept;
    }
}

extern "C" void cuda_sample(int *d_out, float *d_logits, int V, float *d_prob, const int *d_pen, int n_pen,
                            float temperature, int top_k, float top_p, float min_p, float coin, float repeat,
                            float frequency, float presence) {
    sample_kernel<<<1, SMP_THREADS, 0, g_stream>>>(d_out, d_logits, V, d_prob, d_pen, n_pen, temperature, top_k,
                                                  top_p, min_p, coin, repeat, frequency, presence);
    cuda_note("sampling");
}
