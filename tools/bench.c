/* bench.c: end-to-end speed of the engine on one model directory, next to
 * the machine's own memory bandwidth measured in the same run, as markdown.
 *
 * Data flow: outside the engine, in run.c's place: it loads the model
 * (model_load, model_quantize), fills kv/ caches directly and times
 * model_forward, which runs the whole chain model -> attn -> kv -> kernels.
 * The roofline it reports is bytes read per token against the measured
 * read bandwidth (Williams, Waterman and Patterson, 2009).
 *
 *   build/bench MODEL_DIR [--threads 1,2] [--ctx 4096,16384,32768] [--depth 16384] [--kv f16,q8,q4,tbq4]
 *               [--vs DIR]
 *
 * (`make bench` runs it on a random-weight Qwen3-0.6B from tools/make_model.c,
 * then on a Qwen3.5-0.8B-shaped hybrid: --threads 2 --ctx 4096 --kv f16
 * --vs bench/qwen3-0.6b.) A Qwen3.5 hybrid counts its Gated DeltaNet
 * layers' projections among the weights, KV only in its full-attention
 * layers, and its recurrent state in every decode roofline.
 * Sections, each for every thread count:
 *   1. read bandwidth: the sum of a 1 GiB float array in 2 MB pages (AVX-512
 *      or AVX2 loads, OpenMP over the threads), best of 5 passes;
 *   1b. arithmetic peak: GFLOP/s of the FMA instruction the matmul kernels
 *      issue, each thread running 12 independent chains (and vdpbf16ps
 *      beside it where the CPU has AVX-512 BF16), best of 3;
 *   2. prefill: one model_forward of 512 token ids (f16 KV), best of 5 runs,
 *      in tok/s and GFLOP/s, FLOPs = 2 x decoder matmul params x tokens
 *      + 2 x full-attention layers x q heads x head_dim x n(n+1) for causal
 *      attention (q.k and p.v, 2 FLOPs per multiply-add; lm_head runs for
 *      the last token only and is not counted) + for a hybrid the delta rule,
 *      6 x Gated DeltaNet layers x Hv x dk x dv x n (prefill_flops), and
 *      that as a share of the FMA peak (the higher of 1b's and a second
 *      measurement after the runs);
 *   2b. where the CPU has AVX-512 BF16: the same with bf16 matmul inputs
 *      (-act bf16: model_load with MODEL_ACT_BF16, vdpbf16ps), as a share
 *      of vdpbf16ps's peak (the higher of 1b's and one after the runs),
 *      and its speed against f32 inputs;
 *   2c. with --vs DIR: DIR's prefill, its runs taken in turn with section
 *      2's, and both as tok/s x GFLOP per token (the GFLOP/s each turns into
 *      tokens: the shapes need different FLOPs per token), DIR's as 1.00x;
 *   3. decode at short context: a 16-token prompt, then 128 single-token
 *      forwards (f16 KV), each feeding back the argmax, best of 3 runs,
 *      with one pass of section 1's read loop every 16 tokens (off the
 *      clock) for a roofline against the bandwidth of the same seconds
 *      (the median of the passes);
 *   4. decode at long context: the cache of every layer and kv head filled
 *      directly with kv_stream_append (random vectors with the magnitudes of
 *      this model's k and v: the work does not depend on the values) to
 *      each --ctx (4K, 16K and 32K), for every --kv scheme at once (about
 *      14 GB at 32K for all eleven compressed ones and f16), then passes of
 *      1 untimed + 32 timed decode steps (16 above 8K positions) taken
 *      scheme after scheme, best of 5 passes each; the cache is truncated
 *      back after each pass. "fill s" is the time the appends took (most
 *      threads): what storing that many positions costs in each scheme;
 *   4b. at each --ctx that is also a --depth (16K): a 512-token prefill
 *      after the filled cache, per scheme, at the most threads, best of 2
 *      (depth_prefill);
 *   5. section 3 again after converting the matmul weights to q8 blocks
 *      (model_quantize, what -wq q8 does), beside the stored-weights speed;
 *   6. for a hybrid: the delta rule alone (model_delta_rule, one layer's
 *      recurrence), per layer-token with the state from memory as in
 *      decode, in cache, and over a prefill chunk, in µs, GB/s of state
 *      read and written, GFLOP/s, and its share of sections 3's and 2's time.
 * Decode rows give the roofline ratio: bytes moved per token x tok/s divided
 * by the measured bandwidth at that thread count (section 1's, and for
 * sections 3 and 5 also the passes between tokens), where bytes per token =
 * every matmul weight incl. lm_head in its dtype (a tied model reads
 * its embedding matrix once per token as lm_head) + the KV cache, the
 * scheme's bytes per vector x mean positions x full-attention layers x kv
 * heads x 2 (K, V) + a hybrid's recurrent state (S and the conv windows,
 * f32), read and written once a token. 1.0 means decode streams memory as
 * fast as a plain read loop does.
 *
 * Thread counts: model_load sizes per-thread attention scratch from
 * omp_get_max_threads(), and a forward run with more threads than that
 * writes past it. So the model is loaded once per thread count, after
 * omp_set_num_threads(t), and every forward of that copy runs with t threads
 * (each load reads the weights into memory of its own, as ./run does:
 * model_load without MODEL_MAPPED, 1.2 GB for the 0.6B shape).
 */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "kernels/ops.h"
#include "model/model.h"

#define MAX_LIST 16
#define BW_FLOATS ((size_t)1 << 28) /* 1 GiB */
#define PREFILL 512
#define PROMPT 16
#define DECODE 128
#define DECODE_REPS 3
/* Prefill runs a few seconds, short enough that a burst of a shared
 * host's other tenants can cover each of two runs: best of 5
 * (docs/kernel-notes.md#bench-repetitions). */
#define PREFILL_REPS 5
/* Passes per scheme at long context, best kept: with fewer, a burst of a
 * shared host's other tenants can cover all of a scheme's passes
 * (docs/kernel-notes.md#bench-repetitions). */
#define LONG_REPS 5
/* Prefill at depth: a few seconds to a minute per run; best of 2, taken in
 * turn with the other schemes' like the decode passes. */
#define DEPTH_REPS 2
#define POOL 4096 /* random k/v vectors cycled through when filling caches */

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void fail(const char *what, const char *err) {
    fprintf(stderr, "bench: %s: %s\n", what, err);
    exit(1);
}

static unsigned long long rng = 0x9E3779B97F4A7C15ULL;
static unsigned long long next_u64(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return rng;
}
static float gauss(void) {
    double u1 = ((next_u64() >> 11) + 0.5) / 9007199254740992.0, u2 = ((next_u64() >> 11) + 0.5) / 9007199254740992.0;
    return (float)(sqrt(-2 * log(u1)) * cos(6.283185307179586 * u2));
}

/* ---- memory bandwidth ---- */

#if defined(__x86_64__)
#include <immintrin.h>

/* Four independent accumulators keep enough loads in flight to saturate
 * memory rather than the add latency. n is a multiple of 64. */
__attribute__((target("avx512f"))) static float sum_avx512(const float *a, size_t n) {
    __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    for (size_t i = 0; i < n; i += 64) {
        s0 = _mm512_add_ps(s0, _mm512_load_ps(a + i));
        s1 = _mm512_add_ps(s1, _mm512_load_ps(a + i + 16));
        s2 = _mm512_add_ps(s2, _mm512_load_ps(a + i + 32));
        s3 = _mm512_add_ps(s3, _mm512_load_ps(a + i + 48));
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
}

__attribute__((target("avx2"))) static float sum_avx2(const float *a, size_t n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    for (size_t i = 0; i < n; i += 32) {
        s0 = _mm256_add_ps(s0, _mm256_load_ps(a + i));
        s1 = _mm256_add_ps(s1, _mm256_load_ps(a + i + 8));
        s2 = _mm256_add_ps(s2, _mm256_load_ps(a + i + 16));
        s3 = _mm256_add_ps(s3, _mm256_load_ps(a + i + 24));
    }
    float t[8];
    _mm256_storeu_ps(t, _mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
    return t[0] + t[1] + t[2] + t[3] + t[4] + t[5] + t[6] + t[7];
}

#elif defined(__aarch64__)
#include <arm_neon.h>

/* The same four accumulators in 128-bit registers. */
static float sum_neon(const float *a, size_t n) {
    float32x4_t s0 = vdupq_n_f32(0), s1 = s0, s2 = s0, s3 = s0;
    for (size_t i = 0; i < n; i += 16) {
        s0 = vaddq_f32(s0, vld1q_f32(a + i));
        s1 = vaddq_f32(s1, vld1q_f32(a + i + 4));
        s2 = vaddq_f32(s2, vld1q_f32(a + i + 8));
        s3 = vaddq_f32(s3, vld1q_f32(a + i + 12));
    }
    return vaddvq_f32(vaddq_f32(vaddq_f32(s0, s1), vaddq_f32(s2, s3)));
}
#endif

static float sum_plain(const float *a, size_t n) {
    float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (size_t i = 0; i < n; i += 4) s0 += a[i], s1 += a[i + 1], s2 += a[i + 2], s3 += a[i + 3];
    return s0 + s1 + s2 + s3;
}

/* Reads the first n floats of a (a multiple of 16384) with t threads. */
static void read_floats(const float *a, size_t n, int t) {
#if defined(__x86_64__)
    float (*sum)(const float *, size_t) = __builtin_cpu_supports("avx512f") ? sum_avx512
                                          : __builtin_cpu_supports("avx2") ? sum_avx2 : sum_plain;
#elif defined(__aarch64__)
    float (*sum)(const float *, size_t) = kernels_level() > 0 ? sum_neon : sum_plain;
#else
    float (*sum)(const float *, size_t) = sum_plain;
#endif
    static volatile float sink; /* keeps the sums from being optimised away */
    float s = 0;
    /* contiguous 64 KiB blocks per thread, as a static schedule gives */
#pragma omp parallel for num_threads(t) schedule(static) reduction(+ : s)
    for (size_t b = 0; b < n / 16384; b++) s += sum(a + b * 16384, 16384);
    sink = sink + s;
}

/* Read GB/s of one pass over the whole array with t threads. */
static double bw_pass(const float *a, int t) {
    double t0 = now();
    read_floats(a, BW_FLOATS, t);
    return BW_FLOATS * sizeof(float) / (now() - t0) / 1e9;
}

/* Best of 5 passes. */
static double bandwidth(const float *a, int t) {
    double best = 0;
    for (int rep = 0; rep < 5; rep++) {
        double g = bw_pass(a, t);
        best = g > best ? g : best;
    }
    return best;
}

/* ---- arithmetic peak ---- */

/* 12 independent accumulator chains of one instruction, enough to cover
 * its latency on both FMA ports; FLOPs per instruction: 16 lanes x 2 for
 * vfmadd (8 x 2 on AVX2), 16 lanes x 2 pairs x 2 for vdpbf16ps. */
#define CHAINS(M) M(0) M(1) M(2) M(3) M(4) M(5) M(6) M(7) M(8) M(9) M(10) M(11)
#if defined(__x86_64__)
#define DECL(i) __m512 a##i = _mm512_set1_ps(1e-3f * i);
#define SUM12 (a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7 + a8 + a9 + a10 + a11)
__attribute__((target("avx512f"), noinline)) static float fma512_loop(long iters) {
    CHAINS(DECL)
    const __m512 b = _mm512_set1_ps(0.999f), c = _mm512_set1_ps(1e-3f);
#define STEP(i) a##i = _mm512_fmadd_ps(a##i, b, c);
    for (long k = 0; k < iters; k++) { CHAINS(STEP) }
#undef STEP
    return _mm512_reduce_add_ps(SUM12);
}
__attribute__((target("avx512f,avx512bf16"), noinline)) static float dpbf16_loop(long iters) {
    CHAINS(DECL)
    const __m512bh b = (__m512bh)_mm512_set1_epi16(0x3F80), c = (__m512bh)_mm512_set1_epi16(0x3A83);
#define STEP(i) a##i = _mm512_dpbf16_ps(a##i, b, c);
    for (long k = 0; k < iters; k++) { CHAINS(STEP) }
#undef STEP
    return _mm512_reduce_add_ps(SUM12);
}
#undef DECL
#undef SUM12
#define DECL(i) __m256 a##i = _mm256_set1_ps(1e-3f * i);
__attribute__((target("avx2,fma"), noinline)) static float fma256_loop(long iters) {
    CHAINS(DECL)
    const __m256 b = _mm256_set1_ps(0.999f), c = _mm256_set1_ps(1e-3f);
#define STEP(i) a##i = _mm256_fmadd_ps(a##i, b, c);
    for (long k = 0; k < iters; k++) { CHAINS(STEP) }
#undef STEP
    __m256 s = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7 + a8 + a9 + a10 + a11;
    float t[8];
    _mm256_storeu_ps(t, s);
    return t[0] + t[1] + t[2] + t[3] + t[4] + t[5] + t[6] + t[7];
}
#undef DECL
#elif defined(__aarch64__)
/* NEON fmla on 4 lanes, what the aarch64 matmul kernels issue */
#define DECL(i) float32x4_t a##i = vdupq_n_f32(1e-3f * i);
__attribute__((noinline)) static float fma128_loop(long iters) {
    CHAINS(DECL)
    const float32x4_t b = vdupq_n_f32(0.999f), c = vdupq_n_f32(1e-3f);
#define STEP(i) a##i = vfmaq_f32(c, a##i, b);
    for (long k = 0; k < iters; k++) { CHAINS(STEP) }
#undef STEP
    const float32x4_t s = vaddq_f32(vaddq_f32(vaddq_f32(vaddq_f32(a0, a1), vaddq_f32(a2, a3)),
                                              vaddq_f32(vaddq_f32(a4, a5), vaddq_f32(a6, a7))),
                                    vaddq_f32(vaddq_f32(a8, a9), vaddq_f32(a10, a11)));
    return vaddvq_f32(s);
}
#undef DECL
#else
/* other CPUs: scalar fmaf chains, what the plain C kernels can reach at best */
#define DECL(i) float a##i = 1e-3f * i;
__attribute__((noinline)) static float fma_scalar_loop(long iters) {
    CHAINS(DECL)
#define STEP(i) a##i = fmaf(a##i, 0.999f, 1e-3f);
    for (long k = 0; k < iters; k++) { CHAINS(STEP) }
#undef STEP
    return a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7 + a8 + a9 + a10 + a11;
}
#undef DECL
#endif
#if defined(__x86_64__)
#define PEAK_NAME (kernels_level() >= 2 ? "FMA-512" : "FMA-256")
#define PEAK_INSN (kernels_level() >= 2 ? "AVX-512 vfmadd231ps" : "AVX2 vfmadd231ps")
#elif defined(__aarch64__)
#define PEAK_NAME "FMA-128"
#define PEAK_INSN "NEON fmla"
#else
#define PEAK_NAME "scalar FMA"
#define PEAK_INSN "fmaf"
#endif

/* GFLOP/s of kind (0: the FMA the matmul kernels use, 1: vdpbf16ps) with t
 * threads each running its own chains, best of 3 runs of ~0.25 s. */
static double peak(int kind, int t) {
    const int wide = kernels_level() >= 2;
    const long iters = 20000000;
#if defined(__x86_64__)
    const double flops_per = kind ? 64 : wide ? 32 : 16;
#elif defined(__aarch64__)
    const double flops_per = 8;
    (void)wide, (void)kind;
#else
    const double flops_per = 2;
    (void)wide, (void)kind;
#endif
    double best = 0;
    volatile float sink = 0;
    for (int rep = 0; rep < 3; rep++) {
        double t0 = now();
        float s = 0;
#pragma omp parallel num_threads(t) reduction(+ : s)
#if defined(__x86_64__)
        s += kind ? dpbf16_loop(iters) : wide ? fma512_loop(iters) : fma256_loop(iters);
#elif defined(__aarch64__)
        s += fma128_loop(iters);
#else
        s += fma_scalar_loop(iters);
#endif
        double g = (double)iters * 12 * flops_per * t / (now() - t0) / 1e9;
        sink = sink + s;
        best = g > best ? g : best;
    }
    return best;
}

/* ---- model helpers ---- */

/* q8 adds one f32 scale per 32 weights */
static double weight_bytes(const Weight *w) {
    return (double)w->rows * w->cols * (dtype_size(w->dtype) + (w->dtype >= DT_Q8 ? 4.0 / 32 : 0));
}

/* Matmul weight bytes of the decoder layers (params when bytes = 0): each
 * layer's attention or Gated DeltaNet projections, and its MLP. */
static double layers_size(const Model *m, int bytes) {
    double s = 0;
    for (int l = 0; l < m->cfg.n_layers; l++) {
        const Layer *L = &m->layers[l];
        const Weight *attn[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->wg, &L->wu, &L->wd};
        const Weight *gdn[] = {&L->w_qkv, &L->w_z, &L->w_b, &L->w_a, &L->w_out, &L->wg, &L->wu, &L->wd};
        const Weight *const *w = L->gdn ? gdn : attn;
        for (int i = 0; i < (L->gdn ? 8 : 7); i++) s += bytes ? weight_bytes(w[i]) : (double)w[i]->rows * w[i]->cols;
    }
    return s;
}

/* K and V bytes per cached position: only full-attention layers cache them. */
static double kv_bytes_per_position(const Model *m, const KVSpec *sp) {
    const Config *c = &m->cfg;
    double k = sp->k->bits(c->head_dim, &sp->ko) * c->head_dim / 8, v = sp->v->bits(c->head_dim, &sp->vo) * c->head_dim / 8;
    return (k + v) * (c->n_layers - c->n_gdn) * c->n_kv_heads;
}

/* Bytes of recurrent state a decode step moves: every Gated DeltaNet
 * layer's S [Hv, dk, dv] and conv window [K-1, conv_dim], f32, read and
 * written once per token (0 for Qwen3). */
static double state_bytes_per_token(const Model *m) { return 2.0 * (double)m->state_floats * sizeof(float); }

/* FLOPs of one n-token prefill from an empty cache, 2 per multiply-add:
 * the decoder matmuls (2 x params x n), causal attention in the full layers
 * (q.k and p.v over hd: 2 x Lfull x nH x hd x n(n+1)), and the delta rule
 * in the Gated DeltaNet layers (u = S^T k, S += k delta^T and o = S^T q,
 * three multiply-adds per state element: 6 x Lgdn x Hv x dk x dv x n).
 * Not counted: lm_head (run for the last token only), norms, RoPE, the
 * conv, the gates, and the decay that scales S (one multiply per element). */
static double prefill_flops(const Model *m, int n, double *matmuls, double *attn, double *rule) {
    const Config *c = &m->cfg;
    *matmuls = 2 * layers_size(m, 0) * n;
    *attn = 2.0 * (c->n_layers - c->n_gdn) * c->n_heads * c->head_dim * n * (n + 1.0);
    *rule = 6.0 * c->n_gdn * c->lin_v_heads * c->lin_k_dim * c->lin_v_dim * n;
    return *matmuls + *attn + *rule;
}

/* Ids below this are ordinary tokens: the special ones (bos, end of text,
 * and above them Qwen3.5's image and video placeholders, which a forward
 * refuses) start at the lowest of bos and the eos ids. */
static int ordinary_ids(const Config *c) {
    int v = c->vocab_size;
    if (c->bos_id > 0 && c->bos_id < v) v = c->bos_id;
    for (int i = 0; i < c->n_eos; i++)
        if (c->eos_ids[i] > 0 && c->eos_ids[i] < v) v = c->eos_ids[i];
    return v;
}

static void forward(Model *m, KVCache *kv, const int *tok, int n, float *logits) {
    char err[512];
    if (model_forward(m, kv, tok, n, logits, 0, NULL, err, sizeof err)) fail("model_forward", err);
}

/* Best tok/s of DECODE_REPS runs: a PROMPT-token prompt, then DECODE
 * single-token forwards, each feeding back the argmax. Every BW_EVERY
 * tokens the clock stops for one pass of the read loop over a (t threads,
 * as decode runs), and *bw_near gets the median of the best run's passes:
 * the bandwidth the host gave while that run decoded. (Section 1's best of
 * 5 passes, taken minutes earlier in 0.2 s, can meet a quieter host than
 * a run of several seconds, and the roofline moves with the difference.
 * The median, since a single pass can read far less than the others while
 * the tokens around it barely slow: docs/kernel-notes.md#bench-bandwidth.) */
#define BW_EVERY 16
#define BW_PASSES ((DECODE + BW_EVERY - 1) / BW_EVERY)
static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}
static double decode_tps(Model *m, KVCache *kv, const int *tok, float *logits, const float *a, int t,
                         double *bw_near) {
    double tps = 0;
    for (int rep = 0; rep < DECODE_REPS; rep++) {
        kv_cache_truncate(kv, 0);
        forward(m, kv, tok, PROMPT, logits);
        double busy = 0, bw[BW_PASSES];
        int passes = 0;
        for (int s = 0; s < DECODE; s += BW_EVERY) {
            double t0 = now();
            for (int k = s; k < s + BW_EVERY && k < DECODE; k++) {
                int x = argmax(logits, ordinary_ids(&m->cfg));
                forward(m, kv, &x, 1, logits);
            }
            busy += now() - t0;
            bw[passes++] = bw_pass(a, t);
        }
        double r = DECODE / busy;
        if (r > tps) {
            qsort(bw, (size_t)passes, sizeof bw[0], cmp_double);
            tps = r, *bw_near = passes % 2 ? bw[passes / 2] : (bw[passes / 2 - 1] + bw[passes / 2]) / 2;
        }
    }
    return tps;
}

static void kv_open(Model *m, KVCache *kv, const char *scheme, int ctx, KVSpec *sp) {
    char err[512];
    if (kv_spec_parse(scheme, sp, err, sizeof err) || model_kv_init(m, kv, sp, ctx, 0, err, sizeof err))
        fail(scheme, err);
}

/* Appends n positions of random k (unit RMS, as after k_norm with weights
 * near 1) and v (RMS vscale) to every stream of kv, in parallel over streams. */
static void kv_fill(KVCache *kv, int n, const float *kpool, const float *vpool, int threads) {
    int ns = kv->n_layers * kv->n_kv, d = kv->d;
#pragma omp parallel for num_threads(threads) schedule(dynamic)
    for (int s = 0; s < 2 * ns; s++) {
        KVStream *st = s < ns ? &kv->k[s] : &kv->v[s - ns];
        const float *pool = s < ns ? kpool : vpool;
        /* offset per stream so that no two streams hold the same sequence */
        for (int t = 0; t < n; t++) kv_stream_append(st, pool + (size_t)((t + s * 997) % POOL) * d);
    }
}

/* Section 4b: one model_forward of PREFILL tokens after ctx cached
 * positions, per scheme, at the largest thread count (best of DEPTH_REPS,
 * the schemes in turn), the cache emptied and filled again after each
 * (truncation reaches back KV_MAX_ROLLBACK positions, not 512). Attention
 * reads every cached position once per block of tokens (attn_block), so
 * at depth it outweighs the matmuls; "KV MB per token" is what one token
 * would read alone: the scheme's bytes per vector x ctx x layers x kv
 * heads x 2. */
static void depth_prefill(Model *models, int nt, const int *threads, KVCache *kvs, const KVSpec *sps,
                          const char *const *names, int ns, int ctx, const int *tok, float *logits, int f16,
                          const float *kpool, const float *vpool) {
    int most = 0;
    for (int i = 1; i < nt; i++) most = threads[i] > threads[most] ? i : most;
    Model *m = &models[most];
    double tps[MAX_LIST] = {0};
    omp_set_num_threads(threads[most]);
    for (int rep = 0; rep < DEPTH_REPS; rep++)
        for (int k = 0; k < ns; k++) {
            const double t0 = now();
            forward(m, &kvs[k], tok, PREFILL, logits);
            const double r = PREFILL / (now() - t0);
            tps[k] = r > tps[k] ? r : tps[k];
            if (rep + 1 == DEPTH_REPS) continue;
            if (kv_cache_truncate(&kvs[k], 0)) fail(names[k], "emptying the cache failed");
            kv_fill(&kvs[k], ctx, kpool, vpool, threads[most]);
        }
    printf("\n### Prefill at depth: %d tokens in one model_forward after %d cached positions, %d threads "
           "(best of %d)\n\n| ctx | kv | tok/s | vs f16 | KV MB per token |\n|---:|---|---:|---:|---:|\n",
           PREFILL, ctx, threads[most], DEPTH_REPS);
    for (int k = 0; k < ns; k++) {
        char vs[32] = "-";
        if (f16 >= 0) snprintf(vs, sizeof vs, "%.2fx", tps[k] / tps[f16]);
        printf("| %d | %s | %.1f | %s | %.1f |\n", ctx, names[k], tps[k], vs,
               kv_bytes_per_position(m, &sps[k]) * ctx / 1e6);
    }
    fflush(stdout);
}

/* ---- the delta rule alone ---- */

#define RULE_TOKENS 256                  /* tokens per call in the prefill case: one forward chunk */
#define RULE_REPS 5
#define RULE_HOT 64                      /* calls per pass with the state in cache */
#define EVICT_FLOATS ((size_t)64 << 20)  /* 256 MB read before each step from memory */

/* Section 6: model_delta_rule, the Gated DeltaNet recurrence, alone on
 * random inputs (its time does not depend on the values), for one token
 * with each layer's state coming from memory as in decode (256 MB read
 * before each step, off the clock, as 1.5 GB of weights pass between two
 * steps of a layer), one token with the state in cache, and a chunk of
 * RULE_TOKENS tokens as prefill runs it. decode_tps and prefill_s are
 * sections 3's and 2's, for the share of the model's time. */
static void delta_rule_section(Model *models, const int *threads, int nt, const float *a, const double *fpeak,
                               const double *decode_tps, const double *prefill_s) {
    const Config *c = &models[0].cfg;
    const int hv = c->lin_v_heads, vd = hv * c->lin_v_dim, conv_dim = 2 * c->lin_k_heads * c->lin_k_dim + vd;
    const size_t per = (size_t)hv * c->lin_k_dim * c->lin_v_dim; /* S floats per layer */
    /* per layer-token: S read and written once, three multiply-adds per element */
    const double bytes = 2.0 * per * sizeof(float), flops = 6.0 * per;
    float *mix = malloc((size_t)RULE_TOKENS * conv_dim * sizeof(float)), *z = malloc((size_t)RULE_TOKENS * vd * sizeof(float));
    float *y = malloc((size_t)RULE_TOKENS * vd * sizeof(float)), *gb = malloc((size_t)RULE_TOKENS * hv * sizeof(float));
    float *ga = malloc((size_t)RULE_TOKENS * hv * sizeof(float)), *S = calloc((size_t)c->n_gdn * per, sizeof(float));
    int *gl = malloc((size_t)c->n_gdn * sizeof(int)), ng = 0;
    if (!mix || !z || !y || !gb || !ga || !S || !gl) fail("delta rule", "out of memory");
    for (size_t i = 0; i < (size_t)RULE_TOKENS * conv_dim; i++) mix[i] = gauss();
    for (size_t i = 0; i < (size_t)RULE_TOKENS * vd; i++) z[i] = gauss();
    for (size_t i = 0; i < (size_t)RULE_TOKENS * hv; i++) gb[i] = gauss(), ga[i] = gauss();
    for (int l = 0; l < c->n_layers; l++)
        if (c->gdn[l]) gl[ng++] = l;
    printf("\n## The delta rule alone (model_delta_rule: one Gated DeltaNet layer's recurrence, %d value heads of\n"
           "S [%d, %d] f32, best of %d)\n\n"
           "per layer-token: S read and written once (%.2f MB), 6 x Hv x dk x dv = %.2f MFLOP. \"decode, from memory\":\n"
           "one token per call, the %d layers' states in turn, %d MB read (off the clock) before each step as the\n"
           "weights stream between two steps of a layer; \"decode, in cache\": one layer's step %d times; \"prefill\":\n"
           "%d tokens per call (one forward chunk). The last column: x %d layers against section 3's time per\n"
           "token or section 2's prefill\n\n"
           "| threads | case | µs per layer-token | state GB/s | GFLOP/s | of FMA peak | x %d layers, of the model's time |\n"
           "|---:|---|---:|---:|---:|---:|---|\n",
           hv, c->lin_k_dim, c->lin_v_dim, RULE_REPS, bytes / 1e6, flops / 1e6, ng,
           (int)(EVICT_FLOATS * sizeof(float) >> 20), RULE_HOT, RULE_TOKENS, ng, ng);
    for (int i = 0; i < nt; i++) {
        omp_set_num_threads(threads[i]);
        Model *m = &models[i];
        const Layer *L0 = &m->layers[gl[0]];
        /* warm-up: touches every state page once */
        for (int g = 0; g < ng; g++) model_delta_rule(m, &m->layers[gl[g]], S + g * per, mix, gb, ga, z, y, 1);
        double cold = 1e30, hot = 1e30, pre = 1e30;
        for (int rep = 0; rep < RULE_REPS; rep++) {
            double busy = 0;
            for (int g = 0; g < ng; g++) {
                read_floats(a, EVICT_FLOATS, threads[i]);
                const double t0 = now();
                model_delta_rule(m, &m->layers[gl[g]], S + g * per, mix, gb, ga, z, y, 1);
                busy += now() - t0;
            }
            cold = busy / ng < cold ? busy / ng : cold;
            double t0 = now();
            for (int k = 0; k < RULE_HOT; k++) model_delta_rule(m, L0, S, mix, gb, ga, z, y, 1);
            const double h = (now() - t0) / RULE_HOT;
            hot = h < hot ? h : hot;
            t0 = now();
            model_delta_rule(m, L0, S, mix, gb, ga, z, y, RULE_TOKENS);
            const double p = (now() - t0) / RULE_TOKENS;
            pre = p < pre ? p : pre;
        }
        const char *name[] = {"decode, from memory", "decode, in cache", "prefill"};
        const double sec[] = {cold, hot, pre};
        for (int k = 0; k < 3; k++) {
            printf("| %d | %s | %.1f | %.1f | %.1f | ", threads[i], name[k], sec[k] * 1e6, bytes / sec[k] / 1e9,
                   flops / sec[k] / 1e9);
            if (fpeak[i] > 0) printf("%.0f%% | ", 100 * flops / sec[k] / 1e9 / fpeak[i]);
            else printf("- | ");
            if (k == 0)
                printf("%.2f of %.1f ms a token (%.0f%%) |\n", ng * sec[k] * 1e3, 1e3 / decode_tps[i],
                       100 * ng * sec[k] * decode_tps[i]);
            else if (k == 2)
                printf("%.2f of %.2f s for %d tokens (%.0f%%) |\n", ng * sec[k] * PREFILL, prefill_s[i], PREFILL,
                       100 * ng * sec[k] * PREFILL / prefill_s[i]);
            else printf("- |\n");
        }
        fflush(stdout);
    }
    free(mix), free(z), free(y), free(gb), free(ga), free(S), free(gl);
}

static int parse_list(const char *s, int *out) {
    int n = 0;
    for (char *end; *s; s = *end ? end + 1 : end) {
        if (n == MAX_LIST) return -1;
        out[n] = (int)strtol(s, &end, 10);
        if (end == s || out[n] <= 0 || (*end && *end != ',')) return -1;
        n++;
    }
    return n;
}

static void cpu_name(char *out, size_t n) {
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[512];
    snprintf(out, n, "unknown CPU");
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, "model name", 10) == 0) {
            char *v = strchr(line, ':');
            if (v) snprintf(out, n, "%s", v + 2 + strspn(v + 2, " "));
            out[strcspn(out, "\n")] = 0;
            break;
        }
    if (f) fclose(f);
}

static void print_load(const char *when) {
    double l[3] = {0, 0, 0};
    FILE *f = fopen("/proc/loadavg", "r");
    if (f && fscanf(f, "%lf %lf %lf", &l[0], &l[1], &l[2]) == 3)
        printf("load average %s: %.2f %.2f %.2f (1/5/15 min; > 0 means other work shares the cores)\n", when, l[0],
               l[1], l[2]);
    if (f) fclose(f);
}

static int usage(void) {
    fprintf(stderr, "usage: bench MODEL_DIR [--threads 1,2] [--ctx 4096,16384,32768] [--depth 16384] [--kv LIST] "
                    "[--vs DIR]\n");
    return 2;
}

int main(int argc, char **argv) {
    int threads[MAX_LIST] = {1, 2}, nt = 2, ctxs[MAX_LIST] = {4096, 16384, 32768}, nc = 3, depths[MAX_LIST] = {16384},
        nd = 1;
    const char *dir = NULL, *kv_list = "f16,q8,q4,tbq4", *vs_dir = NULL;
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : "";
        if (strcmp(argv[i], "--threads") == 0) nt = parse_list(v, threads), i++;
        else if (strcmp(argv[i], "--ctx") == 0) nc = parse_list(v, ctxs), i++;
        else if (strcmp(argv[i], "--kv") == 0) kv_list = v, i++;
        else if (strcmp(argv[i], "--depth") == 0) nd = parse_list(v, depths), i++;
        else if (strcmp(argv[i], "--vs") == 0 && *v) vs_dir = v, i++;
        else if (argv[i][0] != '-' && !dir) dir = argv[i];
        else return usage();
        if (nt < 1 || nc < 1 || nd < 1) return usage();
    }
    if (!dir) return usage();
    /* the schemes split and checked once, now, not when section 4 reaches
     * them minutes later */
    if (strlen(kv_list) >= 256) {
        fprintf(stderr, "bench: --kv: expected under 256 characters, found %zu\n", strlen(kv_list));
        return 2;
    }
    char kv_buf[256], bad[512];
    const char *kv_names[MAX_LIST];
    int nkv = 0;
    snprintf(kv_buf, sizeof kv_buf, "%s", kv_list);
    for (char *save, *name = strtok_r(kv_buf, ",", &save); name; name = strtok_r(NULL, ",", &save)) {
        if (nkv == MAX_LIST) {
            fprintf(stderr, "bench: --kv: expected at most %d schemes\n", MAX_LIST);
            return 2;
        }
        kv_names[nkv++] = name;
    }
    if (nkv == 0) {
        fprintf(stderr, "bench: --kv: expected at least one scheme, found '%s'\n", kv_list);
        return 2;
    }
    for (int k = 0; k < nkv; k++) {
        KVSpec spec;
        if (kv_spec_parse(kv_names[k], &spec, bad, sizeof bad)) {
            fprintf(stderr, "bench: %s\n", bad);
            return 2;
        }
    }
    int maxt = 1;
    for (int i = 0; i < nt; i++) maxt = threads[i] > maxt ? threads[i] : maxt;

    char cpu[256], err[512];
    cpu_name(cpu, sizeof cpu);
    /* the wait policy decides how multi-threaded decode copes with other
     * load on the cores (libgomp's default spins a while before it sleeps,
     * and beside another job that is many times slower than passive:
     * docs/kernel-notes.md#omp-wait-policy), so runs name it */
    const char *wait = getenv("OMP_WAIT_POLICY");
    printf("# bench %s\n\n%s, %d logical CPUs; kernels %s; OMP_WAIT_POLICY %s\n", dir, cpu, omp_get_num_procs(),
           kernels_isa(), wait ? wait : "unset");
    print_load("at start");

    Model models[MAX_LIST], vs_models[MAX_LIST];
    for (int i = 0; i < nt; i++) {
        omp_set_num_threads(threads[i]);
        if (model_load(&models[i], dir, 0, err, sizeof err)) fail(dir, err);
        if (vs_dir && model_load(&vs_models[i], vs_dir, 0, err, sizeof err)) fail(vs_dir, err);
    }
    Model *m = &models[0];
    const Config *c = &m->cfg;
    const double wbytes = layers_size(m, 1) + weight_bytes(&m->lm_head), params = layers_size(m, 0);
    const double sbytes = state_bytes_per_token(m);
    printf("model: %d layers, hidden %d, heads %d/%d x %d, ffn %d, vocab %d, %s; %.3f G decoder matmul params, "
           "%.3f GB of weights read per decoded token (matmuls + lm_head)\n",
           c->n_layers, c->hidden, c->n_heads, c->n_kv_heads, c->head_dim, c->ffn, c->vocab_size,
           c->tie_embeddings ? "tied embeddings" : "untied lm_head", params / 1e9, wbytes / 1e9);
    if (c->n_gdn)
        printf("hybrid: %d Gated DeltaNet layers (%d/%d heads x %d/%d, conv %d) and %d full-attention layers (the only "
               "ones with a KV cache); %.1f MB of recurrent state (f32), read and written per decoded token\n",
               c->n_gdn, c->lin_k_heads, c->lin_v_heads, c->lin_k_dim, c->lin_v_dim, c->conv_k, c->n_layers - c->n_gdn,
               sbytes / 2 / 1e6);
    printf("\n");

    /* 1. bandwidth; first touch in parallel spreads the pages like the reads.
     * In 2 MB pages where the kernel grants them, as model_load puts the
     * weights: with 4 KB pages the read loop would pay TLB misses the
     * weights do not, and the roofline would credit decode with them. */
    float *a = aligned_alloc((size_t)2 << 20, BW_FLOATS * sizeof(float));
    if (!a) fail("bandwidth", "out of memory for 1 GiB");
    madvise(a, BW_FLOATS * sizeof(float), MADV_HUGEPAGE);
#pragma omp parallel for num_threads(maxt) schedule(static)
    for (size_t i = 0; i < BW_FLOATS; i++) a[i] = 1.0f;
    double bw[MAX_LIST];
    printf("## Memory read bandwidth (sum of a 1 GiB float array in 2 MB pages, best of 5)\n\n| threads | GB/s |\n|---:|---:|\n");
    for (int i = 0; i < nt; i++) {
        bw[i] = bandwidth(a, threads[i]);
        printf("| %d | %.1f |\n", threads[i], bw[i]);
        fflush(stdout);
    }

    /* 1b. arithmetic peak of the instruction the matmul kernels use */
    double fpeak[MAX_LIST] = {0}, dpeak[MAX_LIST] = {0};
    const int has_bf16 = matmul_has_dpanels();
    if (kernels_level() >= 1) {
        printf("\n## Arithmetic peak (12 independent chains per thread, best of 3)\n\n"
               "%s is what the matmul kernels issue (bf16 weights widened to f32 in registers)%s\n\n"
               "| threads | %s GFLOP/s |%s\n|---:|---:|%s\n",
               PEAK_INSN,
               has_bf16 ? "; vdpbf16ps is what they issue for bf16 inputs (-act bf16, section 2b)" : "",
               PEAK_NAME, has_bf16 ? " vdpbf16ps GFLOP/s |" : "",
               has_bf16 ? "---:|" : "");
        for (int i = 0; i < nt; i++) {
            fpeak[i] = peak(0, threads[i]);
            printf("| %d | %.1f |", threads[i], fpeak[i]);
            if (has_bf16) printf(" %.1f |", dpeak[i] = peak(1, threads[i]));
            printf("\n");
            fflush(stdout);
        }
    }

    /* token ids: random ordinary tokens (of both models with --vs) */
    int vmax = ordinary_ids(c), tok[PREFILL];
    if (vs_dir && ordinary_ids(&vs_models[0].cfg) < vmax) vmax = ordinary_ids(&vs_models[0].cfg);
    for (int i = 0; i < PREFILL; i++) tok[i] = (int)(next_u64() % (unsigned long long)vmax);
    float *logits = malloc((size_t)c->vocab_size * sizeof(float));
    KVCache kv;
    KVSpec sp;
    kv_open(m, &kv, "f16", PREFILL, &sp);
    /* warm-up: one token reads every weight once, so page faults on the
     * mmap are not timed below (threads as m was loaded with: see above) */
    omp_set_num_threads(threads[0]);
    forward(m, &kv, tok, 1, logits);

    /* 2. prefill (and --vs's model, its runs taken in turn with these, so
     * that the host's load falls on both alike) */
    double mm_flops, attn_flops, rule_flops;
    const double flops = prefill_flops(m, PREFILL, &mm_flops, &attn_flops, &rule_flops);
    printf("\n## Prefill, %d tokens in one model_forward, f16 KV (best of %d)\n\n", PREFILL, PREFILL_REPS);
    if (c->n_gdn)
        printf("GFLOP per run = 2 x %.3f G params x %d + attention 2 x Lfull x nH x hd x n(n+1) + delta rule 6 x Lgdn x "
               "Hv x dk x dv x n\n= %.1f + %.1f + %.1f = %.1f\n\n",
               params / 1e9, PREFILL, mm_flops / 1e9, attn_flops / 1e9, rule_flops / 1e9, flops / 1e9);
    else
        printf("GFLOP per run = 2 x %.3f G params x %d + attention 2 x L x nH x hd x n(n+1) = %.1f + %.1f = %.1f\n\n",
               params / 1e9, PREFILL, mm_flops / 1e9, attn_flops / 1e9, flops / 1e9);
    printf("| threads | s | tok/s | GFLOP/s | FMA peak GFLOP/s | of FMA peak |\n|---:|---:|---:|---:|---:|---:|\n");
    double prefill_s[MAX_LIST], vs_s[MAX_LIST];
    KVCache vs_kv;
    KVSpec vs_sp;
    if (vs_dir) {
        kv_open(&vs_models[0], &vs_kv, "f16", PREFILL, &vs_sp);
        omp_set_num_threads(threads[0]);
        forward(&vs_models[0], &vs_kv, tok, 1, logits);
    }
    for (int i = 0; i < nt; i++) {
        omp_set_num_threads(threads[i]);
        double best = 1e30;
        vs_s[i] = 1e30;
        for (int rep = 0; rep < PREFILL_REPS; rep++) {
            kv_cache_truncate(&kv, 0);
            double t0 = now();
            forward(&models[i], &kv, tok, PREFILL, logits);
            double dt = now() - t0;
            best = dt < best ? dt : best;
            if (!vs_dir) continue;
            kv_cache_truncate(&vs_kv, 0);
            t0 = now();
            forward(&vs_models[i], &vs_kv, tok, PREFILL, logits);
            dt = now() - t0;
            vs_s[i] = dt < vs_s[i] ? dt : vs_s[i];
        }
        prefill_s[i] = best;
        /* the peak again: the higher of this and section 1b's is the peak,
         * so that a busy moment on the host during either does not pass
         * for the machine's limit (docs/kernel-notes.md#bench-repetitions) */
        if (fpeak[i] > 0) {
            const double again = peak(0, threads[i]);
            fpeak[i] = again > fpeak[i] ? again : fpeak[i];
        }
        printf("| %d | %.2f | %.1f | %.1f | ", threads[i], best, PREFILL / best, flops / best / 1e9);
        if (fpeak[i] > 0) printf("%.1f | %.0f%% |\n", fpeak[i], 100 * flops / best / 1e9 / fpeak[i]);
        else printf("- | - |\n");
        fflush(stdout);
    }
    /* 2b. prefill with bf16 inputs, on a second load of the checkpoint
     * relaid for them (one thread count at a time: 1.2 GB each) */
    if (has_bf16) {
        printf("\n## Prefill with bf16 matmul inputs (-act bf16: vdpbf16ps), as above\n\n"
               "| threads | s | tok/s | GFLOP/s | vs f32 inputs | vdpbf16ps peak GFLOP/s | of vdpbf16ps peak |\n"
               "|---:|---:|---:|---:|---:|---:|---:|\n");
        for (int i = 0; i < nt; i++) {
            Model mb;
            omp_set_num_threads(threads[i]);
            /* a checkpoint it cannot relay (too big to copy, not bf16)
             * skips the section, not the rest of the run */
            if (model_load(&mb, dir, MODEL_ACT_BF16, err, sizeof err)) {
                printf("(skipped: %s)\n", err);
                break;
            }
            /* warm-up, as for the first load */
            kv_cache_truncate(&kv, 0);
            forward(&mb, &kv, tok, 1, logits);
            double best = 1e30;
            for (int rep = 0; rep < PREFILL_REPS; rep++) {
                kv_cache_truncate(&kv, 0);
                double t0 = now();
                forward(&mb, &kv, tok, PREFILL, logits);
                double dt = now() - t0;
                best = dt < best ? dt : best;
            }
            model_free(&mb);
            const double again = peak(1, threads[i]);
            dpeak[i] = again > dpeak[i] ? again : dpeak[i];
            printf("| %d | %.2f | %.1f | %.1f | %.2fx | %.1f | %.0f%% |\n", threads[i], best, PREFILL / best,
                   flops / best / 1e9, prefill_s[i] / best, dpeak[i], 100 * flops / best / 1e9 / dpeak[i]);
            fflush(stdout);
        }
    }

    /* 2c. against --vs: the two shapes need different FLOPs per token, so
     * they compare by tok/s x GFLOP per token, the GFLOP/s each turns into
     * tokens */
    if (vs_dir) {
        double vmm, vattn, vrule;
        const double vflops = prefill_flops(&vs_models[0], PREFILL, &vmm, &vattn, &vrule);
        printf("\n## Prefill per FLOP against %s (its runs taken in turn with the ones above)\n\n"
               "GFLOP per token = the FLOPs of the %d-token run above / %d\n\n"
               "| model | threads | GFLOP per token | tok/s | tok/s x GFLOP per token (GFLOP/s) | vs %s |\n"
               "|---|---:|---:|---:|---:|---:|\n", vs_dir, PREFILL, PREFILL, vs_dir);
        for (int i = 0; i < nt; i++) {
            printf("| %s | %d | %.3f | %.1f | %.1f | %.2fx |\n", dir, threads[i], flops / PREFILL / 1e9,
                   PREFILL / prefill_s[i], flops / prefill_s[i] / 1e9, vs_s[i] / prefill_s[i] * flops / vflops);
            printf("| %s | %d | %.3f | %.1f | %.1f | 1.00x |\n", vs_dir, threads[i], vflops / PREFILL / 1e9,
                   PREFILL / vs_s[i], vflops / vs_s[i] / 1e9);
        }
        fflush(stdout);
        kv_cache_free(&vs_kv);
        for (int i = 0; i < nt; i++) model_free(&vs_models[i]);
    }

    /* 3. decode at short context */
    const double kvpos_f16 = kv_bytes_per_position(m, &sp);
    const double short_bytes = wbytes + sbytes + kvpos_f16 * (PROMPT + (DECODE + 1) / 2.0);
    /* the recurrent state's term, for a hybrid */
    char state_txt[96] = "";
    if (c->n_gdn) snprintf(state_txt, sizeof state_txt, " + %.3f GB of recurrent state (read + written)", sbytes / 1e9);
    printf("\n## Decode, %d tokens after a %d-token prompt, f16 KV (best of %d)\n\n"
           "bytes per token = %.3f GB weights%s + f16 KV at the mean %.0f positions = %.3f GB; roofline against\n"
           "the bandwidth above, and against the median of the read passes taken between the run's tokens\n"
           "(one every %d, off the clock)\n\n"
           "| threads | tok/s | ms/token | roofline | read GB/s between tokens | roofline, same |\n"
           "|---:|---:|---:|---:|---:|---:|\n",
           DECODE, PROMPT, DECODE_REPS, wbytes / 1e9, state_txt, PROMPT + (DECODE + 1) / 2.0, short_bytes / 1e9,
           BW_EVERY);
    double stored_tps[MAX_LIST];
    for (int i = 0; i < nt; i++) {
        omp_set_num_threads(threads[i]);
        double near = 0, tps = stored_tps[i] = decode_tps(&models[i], &kv, tok, logits, a, threads[i], &near);
        printf("| %d | %.2f | %.1f | %.2f | %.1f | %.2f |\n", threads[i], tps, 1e3 / tps, short_bytes * tps / 1e9 / bw[i],
               near, short_bytes * tps / 1e9 / near);
        fflush(stdout);
    }

    kv_cache_free(&kv);

    /* 4. decode at long context, per KV scheme */
    float *kpool = malloc((size_t)POOL * c->head_dim * sizeof(float)), *vpool = malloc((size_t)POOL * c->head_dim * sizeof(float));
    /* v = Wv RMSNorm(x): unit-RMS input times N(0, 0.02^2) weights over hidden inputs */
    const float vscale = 0.02f * sqrtf((float)c->hidden);
    for (size_t i = 0; i < (size_t)POOL * c->head_dim; i++) kpool[i] = gauss(), vpool[i] = vscale * gauss();
    printf("\n## Decode at long context: cache filled to CTX positions, then 1 + N single-token steps (best of %d\n"
           "passes, each scheme's taken in turn with the others')\n\n"
           "KV GB/token = the scheme's bytes per vector x mean positions x %d layers x %d kv heads x 2; "
           "roofline adds %.3f GB of weights%s\n",
           LONG_REPS, c->n_layers - c->n_gdn, c->n_kv_heads, wbytes / 1e9, state_txt);
    /* the header again after a depth table */
    const char *long_head = "\n| ctx | kv | threads | tok/s | vs f16 | KV GB/token | roofline | fill s |\n"
                            "|---:|---|---:|---:|---:|---:|---:|---:|\n";
    int head_due = 1;
    for (int ci = 0; ci < nc; ci++) {
        const int ctx = ctxs[ci], steps = ctx <= 8192 ? 32 : 16;
        int deep = 0;
        for (int j = 0; j < nd; j++) deep |= depths[j] == ctx;
        /* room for the decode steps, or for a prefill after ctx */
        const int room = deep && PREFILL > steps + 1 ? PREFILL : steps + 1;
        /* every scheme's cache filled first, then the passes taken in turn
         * (scheme by scheme, each thread count), so that a change of load
         * on the host during the section falls on every scheme alike */
        KVCache kvs[MAX_LIST];
        KVSpec sps[MAX_LIST];
        const char *const *names = kv_names;
        double fill_s[MAX_LIST], tps[MAX_LIST][MAX_LIST] = {{0}};
        const int ns = nkv;
        for (int k = 0; k < ns; k++) {
            kv_open(m, &kvs[k], names[k], ctx + room, &sps[k]);
            double t0 = now();
            kv_fill(&kvs[k], ctx, kpool, vpool, maxt);
            fill_s[k] = now() - t0;
        }
        for (int rep = 0; rep < LONG_REPS; rep++)
            for (int k = 0; k < ns; k++)
                for (int i = 0; i < nt; i++) {
                    omp_set_num_threads(threads[i]);
                    int x = tok[0];
                    forward(&models[i], &kvs[k], &x, 1, logits);
                    const double t0 = now();
                    for (int st = 0; st < steps; st++) {
                        x = argmax(logits, ordinary_ids(c));
                        forward(&models[i], &kvs[k], &x, 1, logits);
                    }
                    const double r = steps / (now() - t0);
                    tps[k][i] = r > tps[k][i] ? r : tps[k][i];
                    if (kv_cache_truncate(&kvs[k], ctx)) fail(names[k], "truncate back to the filled context failed");
                }
        int f16 = -1;
        for (int k = 0; k < ns; k++)
            if (strcmp(names[k], "f16") == 0) f16 = k;
        if (head_due) printf("%s", long_head);
        head_due = deep;
        for (int k = 0; k < ns; k++) {
            const double kvb = kv_bytes_per_position(m, &sps[k]) * (ctx + 1 + (steps + 1) / 2.0);
            for (int i = 0; i < nt; i++) {
                char vs[32] = "-";
                if (f16 >= 0) snprintf(vs, sizeof vs, "%.2fx", tps[k][i] / tps[f16][i]);
                printf("| %d | %s | %d | %.2f | %s | %.3f | %.2f | ", ctx, names[k], threads[i], tps[k][i], vs, kvb / 1e9,
                       (wbytes + sbytes + kvb) * tps[k][i] / 1e9 / bw[i]);
                if (i == 0) printf("%.1f |\n", fill_s[k]);
                else printf(" |\n");
            }
        }
        fflush(stdout);
        if (deep) depth_prefill(models, nt, threads, kvs, sps, names, ns, ctx, tok, logits, f16, kpool, vpool);
        for (int k = 0; k < ns; k++) kv_cache_free(&kvs[k]);
    }
    /* 5. short-context decode again with the matmul weights converted to
     * q8 (-wq q8); last, since it changes the loaded models */
    kv_open(m, &kv, "f16", PREFILL, &sp);
    for (int i = 0; i < nt; i++) {
        char err[512];
        double t0 = now();
        omp_set_num_threads(threads[i]);
        if (model_quantize(&models[i], MODEL_MAIN, err, sizeof err)) fail("-wq q8", err);
        const double convert_s = now() - t0;
        const double qbytes = layers_size(&models[i], 1) + weight_bytes(&models[i].lm_head) + sbytes +
                              kvpos_f16 * (PROMPT + (DECODE + 1) / 2.0);
        if (i == 0)
            printf("\n## Decode with q8 weights (-wq q8), as in the short-context table\n\n"
                   "bytes per token = %.3f GB (8 bits + an f32 scale per 32 weights, and the KV%s); \"convert s\" is\n"
                   "the conversion at load with that many threads\n\n"
                   "| threads | convert s | tok/s | ms/token | vs stored weights | roofline | roofline, reads between tokens |\n"
                   "|---:|---:|---:|---:|---:|---:|---:|\n",
                   qbytes / 1e9, c->n_gdn ? " and the state" : "");
        double near = 0, tps = decode_tps(&models[i], &kv, tok, logits, a, threads[i], &near);
        printf("| %d | %.2f | %.2f | %.1f | %.2fx | %.2f | %.2f |\n", threads[i], convert_s, tps, 1e3 / tps,
               tps / stored_tps[i], qbytes * tps / 1e9 / bw[i], qbytes * tps / 1e9 / near);
        fflush(stdout);
    }
    kv_cache_free(&kv);
    /* 6. the delta rule alone */
    if (c->n_gdn) delta_rule_section(models, threads, nt, a, fpeak, stored_tps, prefill_s);
    printf("\n");
    print_load("at end");
    free(kpool), free(vpool), free(logits), free(a);
    for (int i = 0; i < nt; i++) model_free(&models[i]);
    return 0;
}
