/* test_spec.c: speculative decoding is exact. Greedy output with -spec 1..4
 * equals -spec 0 token for token, for several KV schemes (KIVI with a short
 * window, so verification rollbacks cross its flushes), and the sampling
 * rule reproduces the target distribution. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "speculative/speculative.h"

static char *run_out(const char *args) {
    const char *bin = getenv("RUN_BIN") ? getenv("RUN_BIN") : "./run";
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s %s 2>/dev/null </dev/null", bin, args);
    FILE *p = popen(cmd, "r");
    cr_assert(p, "popen failed");
    size_t cap = 1 << 16, n = 0, r;
    char *b = malloc(cap);
    while ((r = fread(b + n, 1, cap - 1 - n, p)) > 0) n += r;
    b[n] = 0;
    cr_assert_eq(pclose(p), 0, "%s failed", cmd);
    return b;
}

/* extra: more flags for every run (weight types) */
static void check_exact(const char *model, const char *kv, const char *extra, int n) {
    char args[512];
    snprintf(args, sizeof args, "%s -i 'In the beginning God' -n %d -t 0 -kv %s %s -spec 0", model, n, kv, extra);
    char *want = run_out(args);
    for (int s = 1; s <= 4; s++) {
        snprintf(args, sizeof args, "%s -i 'In the beginning God' -n %d -t 0 -kv %s %s -spec %d", model, n, kv, extra,
                 s);
        char *got = run_out(args);
        cr_expect_str_eq(got, want, "%s -kv %s %s -spec %d differs from -spec 0", model, kv, extra, s);
        free(got);
    }
    free(want);
}

/* Drafts from q8 copies of the MTP weights (the default), from the stored
 * ones, with the main model itself in q8, and with bf16 matmul inputs
 * (where the CPU has AVX-512 BF16: verification batches of 2-5 tokens take
 * other tiles than a single token does, with the same bits). */
Test(spec, greedy_exact_small_fixture) {
    const char *schemes[] = {"f32", "f16", "q8", "tbq4", "kivi2:g32:r32", "kivi4:g16:r64"};
    for (size_t i = 0; i < sizeof schemes / sizeof schemes[0]; i++)
        check_exact("tests/data/fixtures/small", schemes[i], "", 256);
    check_exact("tests/data/fixtures/small", "f16", "-wq-draft stored", 256);
    check_exact("tests/data/fixtures/small", "tbq4", "-wq q8", 256);
    if (matmul_has_dpanels()) {
        check_exact("tests/data/fixtures/small", "f16", "-act bf16", 256);
        check_exact("tests/data/fixtures/small", "q8", "-act bf16 -wq-draft stored", 256);
    }
}

/* Draft d ~ q, then the rule: the emitted token must follow p exactly.
 * 200k draws, chi-square against p with 7 degrees of freedom. */
Test(spec, rejection_rule_reproduces_target) {
    const int V = 8, N = 200000;
    const float p[8] = {0.30f, 0.20f, 0.15f, 0.10f, 0.10f, 0.08f, 0.05f, 0.02f};
    const float q[8] = {0.05f, 0.10f, 0.40f, 0.05f, 0.20f, 0.10f, 0.05f, 0.05f};
    Sampler smp;
    cr_assert_eq(sampler_init(&smp, V, 1, 0, 1, 0, 42), 0);
    long count[8] = {0}, acc_n = 0;
    for (int it = 0; it < N; it++) {
        float r = sampler_uniform(&smp), c = 0;
        int d = V - 1;
        for (int i = 0; i < V; i++) {
            c += q[i];
            if (r < c) { d = i; break; }
        }
        int acc, y = spec_verify_token(&smp, p, q, d, V, &acc);
        count[y]++;
        acc_n += acc;
    }
    double chi2 = 0;
    for (int i = 0; i < V; i++) chi2 += pow(count[i] - N * p[i], 2) / (N * p[i]);
    /* 99.9% quantile of chi-square(7) is 24.3 */
    cr_expect(chi2 < 24.3, "chi-square %g: emitted distribution differs from p", chi2);
    /* acceptance rate = sum min(p, q) = 0.60 */
    cr_expect(fabs((double)acc_n / N - 0.60) < 0.01, "acceptance %g, expected 0.60", (double)acc_n / N);
    sampler_free(&smp);
}

/* The same test must catch a wrong rule: a 1% shift of mass in the output
 * (emitting d on rejection 1 time in 50) is detected at this sample size. */
Test(spec, chi_square_has_power_for_a_one_percent_error) {
    const int V = 8, N = 200000;
    const float p[8] = {0.30f, 0.20f, 0.15f, 0.10f, 0.10f, 0.08f, 0.05f, 0.02f};
    const float q[8] = {0.05f, 0.10f, 0.40f, 0.05f, 0.20f, 0.10f, 0.05f, 0.05f};
    Sampler smp;
    cr_assert_eq(sampler_init(&smp, V, 1, 0, 1, 0, 43), 0);
    long count[8] = {0};
    for (int it = 0; it < N; it++) {
        float r = sampler_uniform(&smp), c = 0;
        int d = V - 1;
        for (int i = 0; i < V; i++) {
            c += q[i];
            if (r < c) { d = i; break; }
        }
        int acc, y = spec_verify_token(&smp, p, q, d, V, &acc);
        if (!acc && sampler_uniform(&smp) < 0.02f) y = d;
        count[y]++;
    }
    double chi2 = 0;
    for (int i = 0; i < V; i++) chi2 += pow(count[i] - N * p[i], 2) / (N * p[i]);
    cr_expect(chi2 > 24.3, "a biased rule went unnoticed (chi-square %g)", chi2);
    sampler_free(&smp);
}

Test(spec, no_mtp_head_continues_without_speculation) {
    const char *bin = getenv("RUN_BIN") ? getenv("RUN_BIN") : "./run";
    char cmd[512];
    snprintf(cmd, sizeof cmd, "%s tests/data/fixtures/tiny -i hi -n 4 -t 0 -spec 3 2>&1 >/dev/null | grep -c 'has no MTP head'",
             bin);
    FILE *p = popen(cmd, "r");
    int n = 0;
    cr_assert_eq(fscanf(p, "%d", &n), 1);
    pclose(p);
    cr_expect_eq(n, 1);
}
