/* bench_attn.c: one decode step of attention over a filled KV cache, per
 * scheme, at several context lengths and thread counts: the attention part
 * of a token alone, without the matmuls around it; with --tokens 4, one
 * prefill block instead (the last 4 positions' queries at once, as
 * model/ runs a prompt: attn_block).
 *
 * Data flow: outside the engine, in model/'s place: it fills kv/ streams
 * directly (kv_stream_append) and calls attn_group, which runs
 * attn -> kv -> kernels as a forward pass does.
 *
 * Shape: Qwen3-0.6B's attention (16 query heads, 8 kv heads, head_dim 128).
 * Each kv head's K and V streams hold `ctx` random positions; one step is,
 * layer after layer, attn_group for every kv head (2 query heads each),
 * parallel over kv heads as model/ does it. Reports the time per step and
 * the KV bytes read per second (every stored byte of K and V is read once
 * per step). With one layer (the default) the caches are small enough to
 * sit in a large L3 (whose speed a shared host's other tenants move a
 * lot: docs/kernel-notes.md#attention-from-l3); with --layers 28, 0.6B's
 * depth, they come from DRAM as they do in the model (3.8 GB for f16 at
 * 32K).
 *
 *   ./build/bench_attn [--layers L] [--tokens T] [--split] [--kv f16,q8,...] [ctx ...]
 *
 * (defaults: 1 layer, every registered scheme, 1024 8192 32768; f16 is
 * timed first whatever its place in --kv, for the "vs f16" column).
 * --split times the two halves of the step apart instead, on one thread:
 * kv_score over one kv head's keys and kv_accum over its values for its
 * 2 x T queries, nanoseconds per cached position, the fastest of 50 calls
 * (the scheme's kernels from cache, not the memory system).
 */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "attn/attn.h"
#include "kernels/matmul.h"

#define NQ 16
#define NKV 8
#define HD 128

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static unsigned long long rng = 0x853c49e6748fea9bULL;
static float gauss(void) {
    double u[2];
    for (int i = 0; i < 2; i++) {
        rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
        u[i] = ((rng >> 11) + 0.5) / 9007199254740992.0;
    }
    return (float)(sqrt(-2 * log(u[0])) * cos(6.283185307179586 * u[1]));
}

/* Seconds per step over nl layers: the best of several timed repetitions,
 * after a warm-up. */
static double time_step(KVStream *k, KVStream *v, int nl, int nt, const float *q, float *out, float *scr,
                        int threads) {
    size_t per = attn_scratch_floats(NQ / NKV * nt, HD);
    double best = 1e9;
    for (int rep = 0; rep < 6; rep++) {
        double t0 = now();
        for (int l = 0; l < nl; l++) {
#pragma omp parallel for num_threads(threads) schedule(static)
            for (int h = 0; h < NKV; h++)
                attn_block(&k[l * NKV + h], &v[l * NKV + h], q + h * (NQ / NKV) * HD, NQ / NKV, nt, NQ * HD,
                           1.0f / sqrtf(HD), out + h * (NQ / NKV) * HD, scr + (size_t)omp_get_thread_num() * per);
        }
        double dt = now() - t0;
        if (rep > 0 && dt < best) best = dt;
    }
    return best;
}

/* --split: nanoseconds per position of kv_score over k's ctx positions and
 * of kv_accum over v's for nq queries (weights like a softmax's), the
 * fastest of 50 calls each. */
static void time_split(const KVStream *k, const KVStream *v, int ctx, int nq, const float *q, double *score_ns,
                       double *accum_ns) {
    float *sc = malloc(sizeof(float) * (size_t)nq * ctx), *p = malloc(sizeof(float) * (size_t)nq * ctx);
    float acc[4 * NQ / NKV * HD];
    if (!sc || !p) {
        fprintf(stderr, "bench_attn: --split: out of memory for %d positions' scores\n", ctx);
        exit(1);
    }
    for (size_t i = 0; i < (size_t)nq * ctx; i++) p[i] = fabsf(gauss()) / (float)ctx;
    double bs = 1e9, ba = 1e9;
    for (int rep = 0; rep < 51; rep++) {
        const double t0 = now();
        kv_score(k, q, nq, 0, ctx, sc, ctx);
        const double t1 = now();
        memset(acc, 0, sizeof(float) * (size_t)nq * HD);
        const double t2 = now();
        kv_accum(v, p, ctx, nq, 0, ctx, acc);
        const double t3 = now();
        if (rep > 0) bs = t1 - t0 < bs ? t1 - t0 : bs, ba = t3 - t2 < ba ? t3 - t2 : ba;
    }
    *score_ns = bs / ctx * 1e9, *accum_ns = ba / ctx * 1e9;
    free(sc), free(p);
}

/* A whole decimal number in [lo, hi], or -1. */
static int whole(const char *v, int lo, int hi) {
    char *end;
    long x = strtol(v, &end, 10);
    return end == v || *end || x < lo || x > hi ? -1 : (int)x;
}

static int usage(void) {
    fprintf(stderr, "usage: bench_attn [--layers 1-256] [--tokens 1-4] [--split] [--kv SCHEME,...] [ctx 1-1048576 ...]\n");
    return 2;
}

int main(int argc, char **argv) {
    int ctxs[8] = {1024, 8192, 32768}, nctx = 0, nl = 1, nt = 1, split = 0;
    /* the schemes to time, f16 first (the others are compared with it) */
    const KVScheme *list[64];
    int nsc = 0;
    for (int i = 0; i < kv_n_schemes && nsc < 64; i++) list[nsc++] = kv_schemes[i];
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--layers") == 0 && i + 1 < argc) nl = whole(argv[++i], 1, 256);
        else if (strcmp(argv[i], "--tokens") == 0 && i + 1 < argc) nt = whole(argv[++i], 1, 4);
        else if (strcmp(argv[i], "--split") == 0) split = 1;
        else if (strcmp(argv[i], "--kv") == 0 && i + 1 < argc) {
            char names[256];
            snprintf(names, sizeof names, "%s", argv[++i]);
            nsc = 0;
            for (char *save, *n = strtok_r(names, ",", &save); n; n = strtok_r(NULL, ",", &save)) {
                const KVScheme *sc = kv_find(n);
                if (!sc) {
                    fprintf(stderr, "bench_attn: --kv: no scheme '%s' (see ./run -h)\n", n);
                    return 2;
                }
                if (nsc == 64) return usage();
                list[nsc++] = sc;
            }
            for (int j = 1; j < nsc; j++)
                if (strcmp(list[j]->name, "f16") == 0) {
                    const KVScheme *t = list[0];
                    list[0] = list[j], list[j] = t;
                }
        } else if (nctx < 8) ctxs[nctx++] = whole(argv[i], 1, 1 << 20);
        else return usage();
        if (nl < 1 || nt < 1 || nsc < 1 || (nctx && (ctxs[nctx - 1] < 1 || ctxs[nctx - 1] > (1 << 20))))
            return usage();
    }
    if (!nctx) nctx = 3;
    /* a block of nt tokens needs nt cached positions: they are its own */
    for (int i = 0; i < nctx; i++)
        if (ctxs[i] < nt) {
            fprintf(stderr, "bench_attn: ctx %d: expected at least --tokens (%d), the block's own positions\n",
                    ctxs[i], nt);
            return 2;
        }
    int maxctx = 0;
    for (int i = 0; i < nctx; i++) maxctx = ctxs[i] > maxctx ? ctxs[i] : maxctx;
    /* the same random K, V and q for every scheme */
    float *kx = malloc(sizeof(float) * (size_t)maxctx * HD), *vx = malloc(sizeof(float) * (size_t)maxctx * HD);
    float q[4 * NQ * HD], out[4 * NQ * HD]; /* [nt, NQ, HD] */
    for (size_t i = 0; i < (size_t)maxctx * HD; i++) kx[i] = gauss(), vx[i] = gauss();
    for (int i = 0; i < 4 * NQ * HD; i++) q[i] = gauss();
    /* per-thread scratch on 64-byte lines, as model/ allocates it: from
     * malloc's 16-byte alignment, two threads' scratch shared a line */
    float *scr = aligned_alloc(64, sizeof(float) * attn_scratch_floats(NQ / NKV * nt, HD) * 64);
    const int ns = nl * NKV;
    KVStream *k = calloc((size_t)ns, sizeof *k), *v = calloc((size_t)ns, sizeof *v);
    printf("attention %s, Qwen3-0.6B shape (%d q heads, %d kv heads, head_dim %d), %d layer%s, kernels %s\n",
           nt > 1 ? "prefill block" : "decode step", NQ, NKV, HD, nl, nl > 1 ? "s" : "", kernels_isa());
    if (nt > 1) printf("(%d tokens at once, the last %d positions of each ctx)\n", nt, nt);
    if (split)
        printf("| scheme | ctx | queries | score ns/position | accumulate ns/position |\n|---|---:|---:|---:|---:|\n");
    else
        printf("| scheme | ctx | threads | ms/step | KV MB read | GB/s | vs f16 |\n|---|---:|---:|---:|---:|---:|---:|\n");
    for (int c = 0; c < nctx; c++) {
        int ctx = ctxs[c];
        double f16_t[3] = {0, 0, 0};
        for (int si = 0; si < nsc; si++) {
            const KVScheme *sc = list[si];
            KVOpts o = {0, 0};
            char err[256];
            int made = 0;
            for (; made < ns; made++) {
                if (kv_stream_init(&k[made], sc, &o, HD, ctx, made / NKV, 0, err, sizeof err)) break;
                if (kv_stream_init(&v[made], sc, &o, HD, ctx, made / NKV, 1, err, sizeof err)) {
                    kv_stream_free(&k[made]);
                    break;
                }
            }
            if (made < ns) {
                for (int h = 0; h < made; h++) kv_stream_free(&k[h]), kv_stream_free(&v[h]);
                printf("| %s | %d | - | %s |\n", sc->name, ctx, err);
                continue;
            }
            /* streams share the data, offset so they are not identical */
#pragma omp parallel for schedule(dynamic)
            for (int h = 0; h < ns; h++)
                for (int t = 0; t < ctx; t++) {
                    kv_stream_append(&k[h], kx + (size_t)((t + h * 997) % maxctx) * HD);
                    kv_stream_append(&v[h], vx + (size_t)((t + h * 991) % maxctx) * HD);
                }
            double bytes = 0;
            for (int h = 0; h < ns; h++) bytes += (double)sc->bytes(&k[h]) + sc->bytes(&v[h]);
            if (split) {
                double st, at;
                time_split(&k[0], &v[0], ctx, NQ / NKV * nt, q, &st, &at);
                printf("| %s | %d | %d | %.2f | %.2f |\n", sc->name, ctx, NQ / NKV * nt, st, at);
                fflush(stdout);
            }
            for (int threads = 1; !split && threads <= 2; threads++) {
                double t = time_step(k, v, nl, nt, q, out, scr, threads);
                if (strcmp(sc->name, "f16") == 0) f16_t[threads] = t;
                printf("| %s | %d | %d | %.3f | %.1f | %.2f | %s", sc->name, ctx, threads, t * 1e3, bytes / 1e6,
                       bytes / t / 1e9, f16_t[threads] > 0 ? "" : "- |\n");
                if (f16_t[threads] > 0) printf("%.2fx |\n", f16_t[threads] / t);
                fflush(stdout);
            }
            for (int h = 0; h < ns; h++) kv_stream_free(&k[h]), kv_stream_free(&v[h]);
        }
    }
    free(k), free(v), free(kx), free(vx), free(scr);
    return 0;
}
