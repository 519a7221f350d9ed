/* test_shipped.c: the shipped default model (models/qwen3-kjv-mtp) against
 * golden logits from an independent float64 numpy forward pass
 * (tools/ref_forward.py, see tests/data/golden/qwen3-kjv-mtp/README.md).
 * Main and MTP logits, and exact speculative decoding on it. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "model/model.h"
#include "tests/util.h"

#define SHIPPED_DIR "models/qwen3-kjv-mtp"
#define GOLDEN_DIR "tests/data/golden/qwen3-kjv-mtp"

Test(shipped, loads_with_mtp_head) {
    Model m;
    char err[512];
    cr_assert_eq(model_load(&m, SHIPPED_DIR, 0, err, sizeof err), 0, "%s", err);
    cr_expect(m.has_mtp, "the shipped model should carry its MTP module");
    cr_expect_eq(m.cfg.head_dim, 128);
    cr_expect(m.cfg.n_heads >= 2 * m.cfg.n_kv_heads, "GQA with >= 2 q heads per kv head");
    cr_expect(m.cfg.tie_embeddings);
    model_free(&m);
}

/* The shipped model with f32 main (and, if mkv, MTP) caches of 512
 * positions, and the golden passage's token ids [1024]; returns their count. */
static int open_golden(Model *m, KVCache *kv, KVCache *mkv, int *ids) {
    KVSpec spec;
    char err[512];
    cr_assert_eq(model_load(m, SHIPPED_DIR, 0, err, sizeof err), 0, "%s", err);
    cr_assert_eq(kv_spec_parse("f32", &spec, err, sizeof err), 0, "%s", err);
    cr_assert_eq(model_kv_init(m, kv, &spec, 512, 0, err, sizeof err), 0, "%s", err);
    if (mkv) cr_assert_eq(model_kv_init(m, mkv, &spec, 512, 1, err, sizeof err), 0, "%s", err);
    int n = read_tokens(GOLDEN_DIR "/tokens.txt", ids, 1024);
    cr_assert(n >= 2 && n <= 512, "tokens.txt: %d tokens", n);
    return n;
}

/* The whole golden passage as one forward call, f32 KV: every position's
 * logits within 1e-4 of the float64 reference. */
Test(shipped, golden_main_logits) {
    Model m;
    KVCache kv;
    char err[512];
    int ids[1024];
    int n = open_golden(&m, &kv, NULL, ids);
    const int V = m.cfg.vocab_size;
    float *want = read_f32(GOLDEN_DIR "/logits.f32", (size_t)n * V);
    float *got = malloc((size_t)n * V * sizeof(float));
    cr_assert(got);
    cr_assert_eq(model_forward(&m, &kv, ids, n, got, 1, NULL, err, sizeof err), 0, "%s", err);
    double worst = 0;
    int worst_at = 0, bad = 0;
    for (int i = 0; i < n; i++) {
        double row = 0;
        for (int j = 0; j < V; j++) row = fmax(row, fabs((double)got[(size_t)i * V + j] - want[(size_t)i * V + j]));
        if (row > 1e-4) bad++;
        if (row > worst) { worst = row; worst_at = i; }
    }
    cr_expect_eq(bad, 0, "%d of %d positions off by more than 1e-4; worst %g at position %d", bad, n, worst, worst_at);
    free(want);
    free(got);
    kv_cache_free(&kv);
    model_free(&m);
}

/* The MTP head over the same passage: row p from (h_p, t_{p+1}) at MTP
 * position p, all rows as one batch after the main forward, f32 KV. */
Test(shipped, golden_mtp_logits) {
    Model m;
    KVCache kv, mkv;
    char err[512];
    int ids[1024];
    int n = open_golden(&m, &kv, &mkv, ids);
    const int V = m.cfg.vocab_size, H = m.cfg.hidden;
    float *want = read_f32(GOLDEN_DIR "/mtp_logits.f32", (size_t)(n - 1) * V);
    float *hidden = malloc((size_t)n * H * sizeof(float)), *got = malloc((size_t)(n - 1) * V * sizeof(float));
    cr_assert(hidden && got);
    cr_assert_eq(model_forward(&m, &kv, ids, n, NULL, 0, hidden, err, sizeof err), 0, "%s", err);
    cr_assert_eq(model_mtp_forward(&m, &mkv, hidden, ids + 1, n - 1, got, 1, NULL, err, sizeof err), 0, "%s", err);
    double worst = 0;
    int worst_at = 0;
    for (size_t i = 0; i < (size_t)(n - 1) * V; i++) {
        double d = fabs((double)got[i] - want[i]);
        if (d > worst) { worst = d; worst_at = (int)(i / V); }
    }
    cr_expect(worst <= 1e-4, "MTP logits max-abs %g at row %d", worst, worst_at);
    free(want), free(hidden), free(got);
    kv_cache_free(&kv);
    kv_cache_free(&mkv);
    model_free(&m);
}

/* Speculative decoding is exact on the trained model, where drafts are
 * mostly accepted: greedy -spec 1..4 equals -spec 0 over 256 tokens. */
Test(shipped, greedy_spec_exact) {
    const char *bin = getenv("RUN_BIN") ? getenv("RUN_BIN") : "./run";
    const char *schemes[] = {"f32", "f16", "q8", "tbq4", "kivi2:g32:r32"};
    for (size_t k = 0; k < sizeof schemes / sizeof schemes[0]; k++) {
        char *outs[5];
        for (int s = 0; s <= 4; s++) {
            char cmd[512];
            snprintf(cmd, sizeof cmd, "%s " SHIPPED_DIR " -i 'And the LORD spake unto Moses' -n 256 -t 0 -kv %s -spec %d 2>/dev/null",
                     bin, schemes[k], s);
            FILE *p = popen(cmd, "r");
            cr_assert(p);
            outs[s] = calloc(1, 1 << 16);
            size_t len = fread(outs[s], 1, (1 << 16) - 1, p);
            cr_assert_eq(pclose(p), 0, "%s failed", cmd);
            cr_assert(len > 100, "%s: short output", cmd);
            if (s > 0) cr_expect_str_eq(outs[s], outs[0], "-kv %s: -spec %d differs from -spec 0", schemes[k], s);
        }
        for (int s = 0; s <= 4; s++) free(outs[s]);
    }
}
