/* bench_cuda.c: the speed of -dev cuda (make bench-cuda), on random
 * weights built on the GPU from the Qwen3-0.6B and Qwen3-8B shapes (no
 * checkpoint needed).
 *
 * Per shape: decode tok/s at 0, 4K and 32K cached positions (f16 cache,
 * the cache filled with random rows rather than prefilled; then a q8
 * cache), with the step
 * captured as a CUDA graph and launched kernel by kernel; the fraction of
 * the HBM roofline (weights + cache bytes read per token over the time,
 * against this run's device-to-device copy bandwidth); prefill tok/s of
 * 512 and 4096 tokens from an empty cache, with the GEMMs' TFLOP/s
 * (2 x matmul weights per token); GPU memory used; each op of a
 * decode step alone, in microseconds, at 0 and 32K positions; and decode
 * over each KV scheme the GPU takes at 4K, 32K and 128K positions, with
 * the cache bytes a token reads and the bandwidth that reading reached
 * (those bytes over the step's time beyond a step at context 0); then
 * decode and prefill of each shape with -wq q8's weights; then decode of
 * the 0.6B shape with its weights read where they lie in host memory, as
 * -wmem map reads a checkpoint (over PCIe on a discrete GPU: slow, and
 * reported, not tuned), against the same weights copied.
 *
 *   build/bench_cuda [--shape 0.6b|8b|all] [--steps N] [--schemes | --q8 | --map]
 *   build/bench_cuda --computed
 *
 * --schemes: only the table over the KV schemes; --q8: only -wq q8's;
 * --map: only -wmem map's.
 * --computed: no GPU needed; the decode bound on the unified-memory
 * machines none of these runs had (GB10, GH200) from their bandwidths:
 * bytes a token reads over the memory each comes from.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda.h"
#include "model/gpu.h"

/* The longest context the scheme table measures. */
#define LONG_CTX 131072

static Config shape(const char *name) {
    Config c;
    memset(&c, 0, sizeof c);
    c.arch = ARCH_QWEN3;
    c.vocab_size = 151936;
    c.head_dim = c.rot_dim = 128;
    c.n_kv_heads = 8;
    c.eps = 1e-6;
    c.rope_theta = 1e6;
    c.max_pos = LONG_CTX + 64;
    if (!strcmp(name, "0.6b")) {
        c.hidden = 1024, c.n_layers = 28, c.n_heads = 16, c.ffn = 3072, c.tie_embeddings = 1;
    } else {
        c.hidden = 4096, c.n_layers = 36, c.n_heads = 32, c.ffn = 12288, c.tie_embeddings = 0;
    }
    return c;
}

/* Weights one decode step reads: every matrix once, the lm_head included. */
static double step_weight_bytes(const Config *c) {
    const double H = c->hidden, qd = (double)c->n_heads * c->head_dim, kvd = (double)c->n_kv_heads * c->head_dim;
    const double per = qd * H + 2 * kvd * H + H * qd + 3.0 * c->ffn * H;
    return 2 * (per * c->n_layers + (double)c->vocab_size * H);
}

/* err is empty when a forward's hidden states went non-finite (bad >= 0) */
static void die(const char *what, const char *err) {
    fprintf(stderr, "bench_cuda: %s: %s\n", what, err[0] ? err : "non-finite hidden states");
    exit(1);
}

/* Seconds per decode step at ctx cached positions, over steps steps
 * (each rolled back, so every step sees ctx positions); logits NULL: the
 * step without bringing them back. */
static double decode_s(GpuModel *g, KVCache *kv, int ctx, int steps, float *logits) {
    char err[512] = "";
    if (gpu_kv_fill_random(kv, ctx, 7, err, sizeof err)) die("cache", err);
    int tok = 42, bad;
    for (int w = 0; w < 3; w++) {
        if (gpu_forward(g, kv, &tok, 1, logits, 0, NULL, &bad, err, sizeof err) || bad >= 0) die("decode", err);
        kv_cache_truncate(kv, ctx);
    }
    double best = 1e9;
    for (int r = 0; r < 3; r++) {
        cuda_timer_start();
        for (int i = 0; i < steps; i++) {
            if (gpu_forward(g, kv, &tok, 1, logits, 0, NULL, &bad, err, sizeof err) || bad >= 0) die("decode", err);
            if (kv_cache_truncate(kv, ctx)) die("decode", "rollback refused");
        }
        const double t = cuda_timer_stop() / steps;
        best = t < best ? t : best;
    }
    return best;
}

static double prefill_s(GpuModel *g, KVCache *kv, int n, float *logits) {
    char err[512] = "";
    int *toks = malloc((size_t)n * sizeof(int)), bad;
    for (int i = 0; i < n; i++) toks[i] = (i * 7919) % 151936;
    double best = 1e9;
    for (int r = 0; r < 2; r++) {
        kv_cache_truncate(kv, 0);
        cuda_timer_start();
        if (gpu_forward(g, kv, toks, n, logits, 0, NULL, &bad, err, sizeof err) || bad >= 0) die("prefill", err);
        const double t = cuda_timer_stop();
        best = t < best ? t : best;
    }
    free(toks);
    return best;
}

/* A prefill GEMM alone: 4096 tokens through a bf16 or q8 (dt) [rows,
 * cols] matrix (the tensor-core paths), in TFLOP/s. */
static void gemm_alone(int dt, int rows, int cols, int n) {
    char err[512];
    void *w = cuda_alloc(cuda_weight_bytes(dt, rows, cols), "GEMM weights", err, sizeof err);
    float *x = cuda_alloc((size_t)n * cols * 4, "GEMM input", err, sizeof err);
    float *y = cuda_alloc((size_t)n * rows * 4, "GEMM output", err, sizeof err);
    if (!w || !x || !y) die("GEMM", err);
    if (dt == CUDA_Q8) cuda_fill_random_q8(w, rows, cols, 3, 0.05f);
    else cuda_fill_random(w, (size_t)rows * cols, 3, 0.05f);
    /* f32 inputs from random bf16 pairs: finite values in [-1, 1] */
    cuda_fill_random(x, (size_t)n * cols * 2, 4, 1.0f);
    cuda_matmul(y, x, w, dt, rows, cols, n, 0);
    double best = 1e9;
    for (int r = 0; r < 3; r++) {
        cuda_timer_start();
        cuda_matmul(y, x, w, dt, rows, cols, n, 0);
        const double t = cuda_timer_stop();
        best = t < best ? t : best;
    }
    if (cuda_sync("GEMM", err, sizeof err)) die("GEMM", err);
    printf("GEMM alone, %d tokens x [%d, %d] %s (x split in three): %.1f TFLOP/s\n", n, rows, cols,
           dt == CUDA_Q8 ? "q8" : "bf16", 2.0 * n * rows * cols / best / 1e12);
    cuda_free(w), cuda_free(x), cuda_free(y);
}

/* Prefill of 512 and 4096 tokens from an empty cache, with the matmuls'
 * TFLOP/s (2 x the matrices' weights but the lm_head's, per token), then
 * one gate|up GEMM of weights dt alone. */
static void prefill_table(GpuModel *g, KVCache *kv, const Config *c, int dt, float *logits) {
    const double flops = 2 * (step_weight_bytes(c) / 2 - (double)c->vocab_size * c->hidden);
    printf("| prefill tokens | tok/s | matmul TFLOP/s over the whole prefill |\n|---|---|---|\n");
    const int ns[] = {512, 4096};
    for (int i = 0; i < 2; i++) {
        const double t = prefill_s(g, kv, ns[i], logits);
        printf("| %d | %.0f | %.1f |\n", ns[i], ns[i] / t, flops * ns[i] / t / 1e12);
        fflush(stdout);
    }
    gemm_alone(dt, c->ffn * 2, c->hidden, 4096);
}

/* Decode over each scheme's cache at 4K, 32K and 128K positions (one
 * cache at a time, made for 128K), against f16 at the same context. */
static void scheme_table(GpuModel *g, int steps, double bw, double wbytes) {
    static const char *const names[] = {"f16", "q8", "q4", "q4h", "tbq4", "polar4", "tbq3", "lm3", "tbq2"};
    const int ctxs[] = {4096, 32768, LONG_CTX};
    char err[512];
    double f16[3] = {0, 0, 0};
    printf("| KV scheme | cache bytes / position | tok/s at 4K / 32K / 128K | vs f16 at 4K / 32K / 128K "
           "| roofline at 128K | cache read at 128K, GB/s |\n|---|---|---|---|---|---|\n");
    for (int s = 0; s < (int)(sizeof names / sizeof *names); s++) {
        KVCache kv;
        KVSpec spec = {kv_find(names[s]), kv_find(names[s]), {0, 0}, {0, 0}};
        if (gpu_kv_init(g, &kv, &spec, LONG_CTX + 64, 0, err, sizeof err)) die(names[s], err);
        const double per_pos = (double)kv.dev_bytes / (LONG_CTX + 64); /* K and V, every layer */
        const double t0 = decode_s(g, &kv, 0, steps, NULL);
        double t[3];
        for (int i = 0; i < 3; i++) {
            t[i] = decode_s(g, &kv, ctxs[i], steps, NULL);
            if (s == 0) f16[i] = t[i];
        }
        const double read = per_pos * LONG_CTX;
        printf("| %s | %.0f | %.1f / %.1f / %.1f | %.2f / %.2f / %.2f | %.2f | %.0f |\n", names[s], per_pos, 1 / t[0],
               1 / t[1], 1 / t[2], f16[0] / t[0], f16[1] / t[1], f16[2] / t[2], (wbytes + read) / (bw * 1e9) / t[2],
               read / (t[2] - t0) / 1e9);
        fflush(stdout);
        kv_cache_free(&kv);
    }
}

static void bench_shape(const char *name, int steps, double bw, int schemes_only) {
    char err[512];
    Config c = shape(name);
    size_t free0 = 0, total = 0, free1 = 0;
    cuda_mem(&free0, &total);
    GpuModel *g;
    if (gpu_model_random(&g, &c, 0, 1, err, sizeof err)) die(name, err);
    if (schemes_only) {
        printf("\n%s shape: decode over each KV scheme\n", name);
        scheme_table(g, steps, bw, step_weight_bytes(&c));
        gpu_model_free(g);
        return;
    }
    KVCache kv;
    KVSpec spec = {kv_find("f16"), kv_find("f16"), {0, 0}, {0, 0}};
    const int cap = 32768 + 64;
    if (gpu_kv_init(g, &kv, &spec, cap, 0, err, sizeof err)) die(name, err);
    cuda_mem(&free1, &total);
    float *logits = malloc((size_t)c.vocab_size * sizeof(float));
    const double wbytes = step_weight_bytes(&c);
    const double kv_pos = (double)c.n_layers * c.n_kv_heads * c.head_dim * 2 * 2; /* K and V, f16 */
    printf("\n%s shape: %d layers, hidden %d, heads %d/%d, ffn %d; weights %.2f GB, GPU memory used %.2f GB "
           "(weights, scratch, %d-position f16 cache)\n",
           name, c.n_layers, c.hidden, c.n_heads, c.n_kv_heads, c.ffn, gpu_model_bytes(g) / 1e9,
           (double)(free0 - free1) / 1e9, cap);
    printf("| context | tok/s (graph) | ms/token | roofline | tok/s (no graph) | ms/token without the logits copy |\n"
           "|---|---|---|---|---|---|\n");
    const int ctxs[] = {0, 4096, 32768};
    for (int i = 0; i < 3; i++) {
        gpu_model_set_graphs(g, 1);
        const double t = decode_s(g, &kv, ctxs[i], steps, logits);
        const double tn = decode_s(g, &kv, ctxs[i], steps, NULL);
        gpu_model_set_graphs(g, 0);
        const double t0 = decode_s(g, &kv, ctxs[i], steps, logits);
        const double floor = (wbytes + kv_pos * ctxs[i]) / (bw * 1e9);
        printf("| %d | %.1f | %.3f | %.2f | %.1f | %.3f |\n", ctxs[i], 1 / t, t * 1e3, floor / t, 1 / t0, tn * 1e3);
        fflush(stdout);
    }
    gpu_model_set_graphs(g, 1);
    {
        /* the same steps launched without programmatic dependent launch
         * (a cache of their own: graphs keep how they were captured) */
        const int pdl = cuda_set_pdl(0);
        KVCache k2;
        if (gpu_kv_init(g, &k2, &spec, cap, 0, err, sizeof err)) die(name, err);
        printf("| context | without PDL: tok/s (graph) | tok/s (no graph) |\n|---|---|---|\n");
        for (int i = 0; i < 3; i++) {
            const double t = decode_s(g, &k2, ctxs[i], steps, logits);
            gpu_model_set_graphs(g, 0);
            const double t0 = decode_s(g, &k2, ctxs[i], steps, logits);
            gpu_model_set_graphs(g, 1);
            printf("| %d | %.1f | %.1f |\n", ctxs[i], 1 / t, 1 / t0);
            fflush(stdout);
        }
        kv_cache_free(&k2);
        cuda_set_pdl(pdl);
    }
    {
        /* the same steps over a q8 cache: 17/16 bytes a value, scored from its tiles */
        KVCache k8;
        KVSpec q8 = {kv_find("q8"), kv_find("q8"), {0, 0}, {0, 0}};
        if (gpu_kv_init(g, &k8, &q8, cap, 0, err, sizeof err)) die(name, err);
        printf("| context | q8 cache: tok/s (graph) | roofline |\n|---|---|---|\n");
        for (int i = 0; i < 3; i++) {
            const double t = decode_s(g, &k8, ctxs[i], steps, NULL);
            const double floor = (wbytes + kv_pos * 17 / 32 * ctxs[i]) / (bw * 1e9);
            printf("| %d | %.1f | %.2f |\n", ctxs[i], 1 / t, floor / t);
            fflush(stdout);
        }
        kv_cache_free(&k8);
    }
    /* drawing the next token where the logits are (sample/sampler.cu) */
    {
        int tok = 42, bad, pick;
        kv_cache_truncate(&kv, 0);
        if (gpu_forward(g, &kv, &tok, 1, NULL, 0, NULL, &bad, err, sizeof err) || bad >= 0) die("decode", err);
        static const SampleDraw draws[] = {{0, 1, 0, 0.5f, 0, 1, 0, 0, 0, NULL},
                                           {0.8f, 1, 0, 0.5f, 0, 1, 0, 0, 0, NULL},
                                           {0.8f, 0.95f, 0.05f, 0.5f, 40, 1, 0, 0, 0, NULL},
                                           {0.8f, 0.95f, 0, 0.5f, 0, 1, 0, 0, 0, NULL}};
        static const char *const names[] = {"greedy", "temperature 0.8",
                                            "temperature 0.8, top-k 40, top-p 0.95, min-p 0.05",
                                            "temperature 0.8, top-p 0.95 (no top-k)"};
        printf("| sampling on the GPU | us (with the id's copy back) |\n|---|---|\n");
        for (int i = 0; i < 4; i++) {
            cuda_timer_start();
            for (int r = 0; r < 100; r++)
                if (gpu_sample(g, &draws[i], &pick, err, sizeof err)) die("sampling", err);
            printf("| %s | %.1f |\n", names[i], cuda_timer_stop() / 100 * 1e6);
        }
    }
    /* where a step's time goes: each op of one layer alone */
    for (int i = 0; i < 3; i += 2) {
        printf("| op at context %d | us |\n|---|---|\n", ctxs[i]);
        if (gpu_kv_fill_random(&kv, ctxs[i], 7, err, sizeof err) || gpu_profile(g, &kv, 200, stdout, err, sizeof err))
            die("profile", err);
    }
    prefill_table(g, &kv, &c, CUDA_BF16, logits);
    free(logits);
    kv_cache_free(&kv);
    scheme_table(g, steps, bw, wbytes);
    gpu_model_free(g);
}

/* The same shape with -wq q8's weights (every matrix but the embedding
 * in q8 blocks, 1.125 bytes a weight): decode over an f16 cache and
 * prefill, as above. */
static void bench_q8_weights(const char *name, int steps, double bw) {
    char err[512];
    Config c = shape(name);
    GpuModel *g;
    if (gpu_model_random(&g, &c, 1, 1, err, sizeof err)) die(name, err);
    KVCache kv;
    KVSpec spec = {kv_find("f16"), kv_find("f16"), {0, 0}, {0, 0}};
    if (gpu_kv_init(g, &kv, &spec, 32768 + 64, 0, err, sizeof err)) die(name, err);
    float *logits = malloc((size_t)c.vocab_size * sizeof(float));
    const double wbytes = step_weight_bytes(&c) / 2 * 1.125;
    const double kv_pos = (double)c.n_layers * c.n_kv_heads * c.head_dim * 2 * 2;
    printf("\n%s shape, -wq q8 weights (%.2f GB), f16 cache\n| context | tok/s (graph) | roofline |\n|---|---|---|\n",
           name, gpu_model_bytes(g) / 1e9);
    const int ctxs[] = {0, 4096, 32768};
    for (int i = 0; i < 3; i++) {
        const double t = decode_s(g, &kv, ctxs[i], steps, logits);
        printf("| %d | %.1f | %.2f |\n", ctxs[i], 1 / t, (wbytes + kv_pos * ctxs[i]) / (bw * 1e9) / t);
        fflush(stdout);
    }
    prefill_table(g, &kv, &c, CUDA_Q8, logits);
    free(logits);
    kv_cache_free(&kv);
    gpu_model_free(g);
}

/* Decode at 0 and 4K positions (f16 cache) with the weights copied, then
 * read in host memory (gpu_model_to_host, as -wmem map), and the weights'
 * bytes a step reads over its time (at 4K the cache's reads, from device
 * memory, are in that time too); a tenth of the steps for map. */
static void bench_map(const char *name, int steps, const CudaInfo *info) {
    char err[512];
    Config c = shape(name);
    GpuModel *g;
    if (gpu_model_random(&g, &c, 0, 1, err, sizeof err)) die(name, err);
    KVSpec spec = {kv_find("f16"), kv_find("f16"), {0, 0}, {0, 0}};
    const int ctxs[] = {0, 4096}, msteps = steps / 10 > 3 ? steps / 10 : 3;
    const double wbytes = step_weight_bytes(&c);
    double t[2][2];
    for (int m = 0; m < 2; m++) {
        /* a cache of its own each: its graphs keep the weights' addresses */
        KVCache kv;
        if (m && gpu_model_to_host(g, err, sizeof err)) die("weights to host memory", err);
        if (gpu_kv_init(g, &kv, &spec, 4096 + 64, 0, err, sizeof err)) die(name, err);
        for (int i = 0; i < 2; i++) t[m][i] = decode_s(g, &kv, ctxs[i], m ? msteps : steps, NULL);
        kv_cache_free(&kv);
    }
    printf("\n%s shape, weights (%.2f GB) read where they lie in host memory (-wmem map: %s) against copied\n"
           "| context | copy: tok/s | map: tok/s | map: weights read at GB/s |\n|---|---|---|---|\n",
           name, gpu_model_mapped_bytes(g) / 1e9,
           info->pageable ? "the GPU reads pageable memory, at the mapping's own addresses"
                          : "the mapping registered read-only");
    for (int i = 0; i < 2; i++)
        printf("| %d | %.1f | %.1f | %.1f |\n", ctxs[i], 1 / t[0][i], 1 / t[1][i], wbytes / t[1][i] / 1e9);
    fflush(stdout);
    gpu_model_free(g);
}

/* Bandwidths the computed table divides by, as measured elsewhere
 * (../shared/specs/cuda.md, section 1): GB10's LPDDR5x by a saturating
 * read kernel (231-234 GB/s of 273 nominal, antirez/ds4), GH200's HBM3 by
 * STREAM on its GPU (3.4 TB/s of 4.0) and its NVLink-C2C by host-to-device
 * copies (375 GB/s; arXiv 2408.11556). */
#define GB10_GBS 232.0
#define GH200_HBM_GBS 3400.0
#define GH200_C2C_GBS 375.0

/* Decode's upper bound per shape, weights (stored bf16 or -wq q8), KV
 * scheme and context: on GB10 weights and cache share one LPDDR5x, so
 * reading the weights where they are mapped and from a copy cost the
 * same (the copy only doubles their memory); on GH200 a copy reads them
 * from HBM, the mapping from Grace's memory over C2C, the cache being in
 * HBM either way. */
static void computed_table(void) {
    static const char *const schemes[] = {"f16", "q8", "tbq4"};
    const int ctxs[] = {0, 4096, 32768};
    printf("Computed, not measured: tok/s = 1 / (weight bytes / their memory's bandwidth + KV bytes / HBM's or "
           "LPDDR5x's);\nGB10 %.0f GB/s, GH200 HBM3 %.0f GB/s and C2C %.0f GB/s\n\n",
           GB10_GBS, GH200_HBM_GBS, GH200_C2C_GBS);
    printf("| shape | weights | KV | context | GB / token (weights + KV) | GB10, map or copy | GH200, copy | "
           "GH200, map |\n|---|---|---|---:|---:|---:|---:|---:|\n");
    for (int sh = 0; sh < 2; sh++) {
        const Config c = shape(sh ? "8b" : "0.6b");
        for (int q8 = 0; q8 < 2; q8++) {
            /* -wq q8: a byte and an f32 scale per 32 weights */
            const double w = step_weight_bytes(&c) / 2 * (q8 ? 1.125 : 2) / 1e9;
            /* at context 0 no cache is read: one row, whatever the scheme */
            for (int k = 0; k < 3; k++)
                for (int i = k ? 1 : 0; i < 3; i++) {
                    const double bits = kv_find(schemes[k])->bits(c.head_dim, &(KVOpts){0, 0});
                    const double kv = (double)ctxs[i] * c.n_layers * c.n_kv_heads * 2 * c.head_dim * bits / 8 / 1e9;
                    printf("| %s | %s | %s | %d | %.3f | %.1f | %.1f | %.1f |\n", sh ? "8B" : "0.6B", q8 ? "q8" : "bf16",
                           i ? schemes[k] : "-", ctxs[i], w + kv, GB10_GBS / (w + kv), GH200_HBM_GBS / (w + kv),
                           1 / (w / GH200_C2C_GBS + kv / GH200_HBM_GBS));
                }
        }
    }
}

int main(int argc, char **argv) {
    const char *which = "all";
    int steps = 50, schemes_only = 0, q8_only = 0, map_only = 0;
    if (argc == 2 && !strcmp(argv[1], "--computed")) {
        computed_table();
        return 0;
    }
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--shape") && i + 1 < argc) which = argv[++i];
        else if (!strcmp(argv[i], "--steps") && i + 1 < argc) steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--schemes")) schemes_only = 1;
        else if (!strcmp(argv[i], "--q8")) q8_only = 1;
        else if (!strcmp(argv[i], "--map")) map_only = 1;
        else {
            fprintf(stderr, "usage: bench_cuda [--shape 0.6b|8b|all] [--steps N] [--schemes | --q8 | --map], or "
                            "--computed\n");
            return 2;
        }
    }
    if (steps < 1 || steps > 100000 || (strcmp(which, "all") && strcmp(which, "0.6b") && strcmp(which, "8b"))) {
        fprintf(stderr, "bench_cuda: expected --shape 0.6b|8b|all and --steps 1..100000\n");
        return 2;
    }
    CudaInfo info;
    char err[512];
    if (cuda_open(&info, err, sizeof err)) die("device", err);
    const double bw = cuda_copy_gbps((size_t)1 << 30);
    printf("device: %s, sm_%d%d, %d SMs, %.1f GB; device-to-device copy %.0f GB/s (read + write)\n", info.name,
           info.cc_major, info.cc_minor, info.sm_count, info.mem_total / 1e9, bw);
    const int six = !strcmp(which, "all") || !strcmp(which, "0.6b");
    const int eight = !strcmp(which, "all") || !strcmp(which, "8b");
    const int all = !schemes_only && !q8_only && !map_only;
    if (six && (all || schemes_only)) bench_shape("0.6b", steps, bw, schemes_only);
    if (eight && (all || schemes_only)) bench_shape("8b", steps, bw, schemes_only);
    if (six && (all || q8_only)) bench_q8_weights("0.6b", steps, bw);
    if (eight && (all || q8_only)) bench_q8_weights("8b", steps, bw);
    if (six && (all || map_only)) bench_map("0.6b", steps, &info);
    return 0;
}
