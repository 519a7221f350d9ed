/* test_shipped.c: the two shipped models, the default Qwen3
 * (models/qwen3-kjv-mtp) and the Qwen3.5 hybrid (models/qwen35-kjv-mtp),
 * against golden logits from an independent float64 numpy forward pass
 * (tools/ref_forward.py, see tests/data/golden/<model>/README.md). Main and
 * MTP logits, exact speculative decoding, and the MTP head's acceptance. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model/model.h"
#include "tests/util.h"

/* Each shipped model and the folder of its golden data. */
static const struct {
    const char *dir, *golden;
} shipped[] = {
    {"models/qwen3-kjv-mtp", "tests/data/golden/qwen3-kjv-mtp"},
    {"models/qwen35-kjv-mtp", "tests/data/golden/qwen35-kjv-mtp"},
};
#define N_SHIPPED (int)(sizeof shipped / sizeof shipped[0])

Test(shipped, loads_with_mtp_head) {
    for (int s = 0; s < N_SHIPPED; s++) {
        Model m;
        char err[512];
        cr_assert_eq(model_load(&m, shipped[s].dir, 0, err, sizeof err), 0, "%s", err);
        cr_expect(m.has_mtp, "%s should carry its MTP module", shipped[s].dir);
        cr_expect(m.cfg.n_heads >= 2 * m.cfg.n_kv_heads, "GQA with >= 2 q heads per kv head");
        cr_expect(m.cfg.tie_embeddings);
        if (s == 0) cr_expect(m.cfg.arch != ARCH_QWEN35 && m.cfg.head_dim == 128, "%s: Qwen3", shipped[s].dir);
        /* the hybrid: four Gated DeltaNet layers with Hv != Hk, two gated full-attention layers of head_dim 256 */
        if (s == 1)
            cr_expect(m.cfg.arch == ARCH_QWEN35 && m.cfg.n_gdn == 4 && m.cfg.head_dim == 256 && m.cfg.attn_gate &&
                      m.cfg.lin_v_heads == 2 * m.cfg.lin_k_heads && m.cfg.zero_centred, "%s: Qwen3.5", shipped[s].dir);
        model_free(&m);
    }
}

/* Shipped model s with f32 main (and, if mkv, MTP) caches of 512 positions,
 * and its golden passage's token ids [1024]; returns their count. */
static int open_golden(int s, Model *m, KVCache *kv, KVCache *mkv, int *ids) {
    KVSpec spec;
    char err[512], path[256];
    cr_assert_eq(model_load(m, shipped[s].dir, 0, err, sizeof err), 0, "%s", err);
    cr_assert_eq(kv_spec_parse("f32", &spec, err, sizeof err), 0, "%s", err);
    cr_assert_eq(model_kv_init(m, kv, &spec, 512, 0, err, sizeof err), 0, "%s", err);
    if (mkv) cr_assert_eq(model_kv_init(m, mkv, &spec, 512, 1, err, sizeof err), 0, "%s", err);
    snprintf(path, sizeof path, "%s/tokens.txt", shipped[s].golden);
    int n = read_tokens(path, ids, 1024);
    cr_assert(n >= 2 && n <= 512, "%s: %d tokens", path, n);
    return n;
}

/* The whole golden passage as one forward call, f32 KV: every position's
 * logits within 1e-4 of the float64 reference. */
Test(shipped, golden_main_logits) {
    for (int s = 0; s < N_SHIPPED; s++) {
        Model m;
        KVCache kv;
        char err[512], path[256];
        int ids[1024];
        int n = open_golden(s, &m, &kv, NULL, ids);
        const int V = m.cfg.vocab_size;
        snprintf(path, sizeof path, "%s/logits.f32", shipped[s].golden);
        float *want = read_f32(path, (size_t)n * V);
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
        cr_expect_eq(bad, 0, "%s: %d of %d positions off by more than 1e-4; worst %g at position %d", shipped[s].dir,
                     bad, n, worst, worst_at);
        free(want);
        free(got);
        kv_cache_free(&kv);
        model_free(&m);
    }
}

/* The MTP head over the same passage: row p from (h_p, t_{p+1}) at MTP
 * position p, all rows as one batch after the main forward, f32 KV. */
Test(shipped, golden_mtp_logits) {
    for (int s = 0; s < N_SHIPPED; s++) {
        Model m;
        KVCache kv, mkv;
        char err[512], path[256];
        int ids[1024];
        int n = open_golden(s, &m, &kv, &mkv, ids);
        const int V = m.cfg.vocab_size, H = m.cfg.hidden;
        snprintf(path, sizeof path, "%s/mtp_logits.f32", shipped[s].golden);
        float *want = read_f32(path, (size_t)(n - 1) * V);
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
        cr_expect(worst <= 1e-4, "%s: MTP logits max-abs %g at row %d", shipped[s].dir, worst, worst_at);
        free(want), free(hidden), free(got);
        kv_cache_free(&kv);
        kv_cache_free(&mkv);
        model_free(&m);
    }
}

/* Speculative decoding is exact on the trained models, where drafts are
 * mostly accepted: greedy -spec N equals -spec 0 over 256 tokens (the
 * hybrid rolls its recurrent state back on every rejection), and the MTP
 * head's drafts are accepted often enough to pay (spec_accept on stderr). */
Test(shipped, greedy_spec_exact) {
    const char *bin = getenv("RUN_BIN") ? getenv("RUN_BIN") : "./run";
    static const struct {
        int model;
        const char *scheme;
        int max_spec;
    } runs[] = {{0, "f32", 4},  {0, "f16", 4}, {0, "q8", 4}, {0, "tbq4", 4},
                {0, "kivi2:g32:r32", 4}, {1, "f32", 3}, {1, "tbq4", 3}, {1, "kivi2:g32:r32", 3}};
    char errf[64];
    snprintf(errf, sizeof errf, "/tmp/run_shipped_err.%d", (int)getpid());
    for (size_t k = 0; k < sizeof runs / sizeof runs[0]; k++) {
        char *outs[5] = {0};
        for (int s = 0; s <= runs[k].max_spec; s++) {
            char cmd[512];
            snprintf(cmd, sizeof cmd, "%s %s -i 'And the LORD spake unto Moses' -n 256 -t 0 -kv %s -spec %d 2>%s", bin,
                     shipped[runs[k].model].dir, runs[k].scheme, s, errf);
            FILE *p = popen(cmd, "r");
            cr_assert(p);
            outs[s] = calloc(1, 1 << 16);
            size_t len = fread(outs[s], 1, (1 << 16) - 1, p);
            cr_assert_eq(pclose(p), 0, "%s failed", cmd);
            cr_assert(len > 100, "%s: short output", cmd);
            if (s > 0)
                cr_expect_str_eq(outs[s], outs[0], "%s -kv %s: -spec %d differs from -spec 0",
                                 shipped[runs[k].model].dir, runs[k].scheme, s);
            if (s == 3) {
                char *e = slurp(errf, NULL), *a = e ? strstr(e, "spec_accept=") : NULL;
                double acc = a ? atof(a + strlen("spec_accept=")) : -1;
                cr_expect(acc >= 0.4, "%s -kv %s -spec 3: spec_accept %g, expected at least 0.4",
                          shipped[runs[k].model].dir, runs[k].scheme, acc);
                free(e);
            }
        }
        for (int s = 0; s <= runs[k].max_spec; s++) free(outs[s]);
    }
    remove(errf);
}
