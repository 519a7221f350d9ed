/* test_cli.c: the scriptable interface as the README documents it, run
 * through the real binary ($RUN_BIN): tokenize, logits, ppl, generate,
 * chat, the stats line, seeds and thread-count independence. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/util.h"

static const char *bin(void) { return getenv("RUN_BIN") ? getenv("RUN_BIN") : "./run"; }

/* Runs `./run args`, returns exit code; stdout and stderr into malloc'd strings. */
static int run(const char *args, char **out, char **err) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s %s >/tmp/run_cli_out.$PPID 2>/tmp/run_cli_err.$PPID </dev/null", bin(), args);
    int st = system(cmd);
    char *bufs[2] = {NULL, NULL};
    const char *names[2] = {"out", "err"};
    for (int i = 0; i < 2; i++) {
        char path[128];
        /* system() runs sh -c, whose $PPID is this process */
        snprintf(path, sizeof path, "/tmp/run_cli_%s.%d", names[i], (int)getpid());
        FILE *f = fopen(path, "rb");
        cr_assert(f, "no output file %s", path);
        fseek(f, 0, SEEK_END);
        long n = ftell(f);
        fseek(f, 0, SEEK_SET);
        bufs[i] = malloc((size_t)n + 1);
        cr_assert_eq(fread(bufs[i], 1, (size_t)n, f), (size_t)n);
        bufs[i][n] = 0;
        fclose(f);
        remove(path);
    }
    *out = bufs[0];
    *err = bufs[1];
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* The last stderr line must be the stats line with all five fields. */
static void expect_stats(const char *err) {
    const char *s = strstr(err, "stats: prefill_tokens=");
    cr_expect(s != NULL, "no stats line: %s", err);
    if (!s) return;
    cr_expect(strstr(s, " prefill_tps=") && strstr(s, " decode_tokens=") && strstr(s, " decode_tps=") &&
                  strstr(s, " kv_bytes="),
              "incomplete stats line: %s", s);
    const char *nl = strchr(s, '\n');
    cr_expect(nl && nl[1] == 0, "stats is not the last stderr line: %s", err);
}

Test(cli, tokenize_matches_golden_ids) {
    const char *prompts[] = {"hello", "sentence", "paragraph"};
    for (int i = 0; i < 3; i++) {
        char args[512], path[256], *out, *err;
        snprintf(args, sizeof args, "tests/data/fixtures/tiny -m tokenize -f tests/data/golden/tiny/%s/prompt.txt",
                 prompts[i]);
        cr_assert_eq(run(args, &out, &err), 0, "%s", err);
        snprintf(path, sizeof path, "tests/data/golden/tiny/%s/tokens.txt", prompts[i]);
        char *want = slurp(path, NULL);
        want[strcspn(want, "\n")] = 0;
        out[strcspn(out, "\n")] = 0;
        cr_expect_str_eq(out, want, "%s", prompts[i]);
        cr_expect(!strstr(err, "stats:"), "tokenize runs no model: no stats line: %s", err);
        free(want);
        free(out);
        free(err);
    }
}

Test(cli, logits_file_matches_golden) {
    char *out, *err;
    cr_assert_eq(run("tests/data/fixtures/small -m logits -kv f32 -f tests/data/golden/small/sentence/prompt.txt "
                     "-o /tmp/run_cli_logits.f32",
                     &out, &err),
                 0, "%s", err);
    FILE *a = fopen("/tmp/run_cli_logits.f32", "rb"), *b = fopen("tests/data/golden/small/sentence/logits.f32", "rb");
    cr_assert(a && b);
    size_t n = 0;
    float x, y, worst = 0;
    while (fread(&y, 4, 1, b) == 1) {
        cr_assert_eq(fread(&x, 4, 1, a), 1, "logits file too short at %zu", n);
        worst = fmaxf(worst, fabsf(x - y));
        n++;
    }
    cr_expect_eq(fread(&x, 4, 1, a), 0, "logits file too long");
    cr_expect_eq(n, 42 * 4160);
    cr_expect(worst <= 1e-4f, "max-abs %g", worst);
    fclose(a);
    fclose(b);
    remove("/tmp/run_cli_logits.f32");
    expect_stats(err);
    free(out);
    free(err);
}

/* -wq q8: the logits move by the weights' rounding (random weights here, so
 * every logit is a sum of equally large terms), not more, and the flag is
 * checked. */
Test(cli, q8_weights_stay_close_to_stored) {
    char *out, *err;
    cr_assert_eq(run("tests/data/fixtures/small -m logits -kv f32 -wq q8 -f tests/data/golden/small/sentence/prompt.txt "
                     "-o /tmp/run_cli_q8.f32",
                     &out, &err),
                 0, "%s", err);
    FILE *a = fopen("/tmp/run_cli_q8.f32", "rb"), *b = fopen("tests/data/golden/small/sentence/logits.f32", "rb");
    cr_assert(a && b);
    static float x[4160], y[4160];
    float worst = 0;
    int rows = 0, same_top = 0;
    while (fread(y, sizeof y, 1, b) == 1) {
        cr_assert_eq(fread(x, sizeof x, 1, a), 1, "logits file too short at row %d", rows);
        int ax = 0, ay = 0;
        for (int i = 0; i < 4160; i++) {
            worst = fmaxf(worst, fabsf(x[i] - y[i]));
            ax = x[i] > x[ax] ? i : ax;
            ay = y[i] > y[ay] ? i : ay;
        }
        same_top += ax == ay, rows++;
    }
    cr_expect_eq(rows, 42);
    /* measured: max-abs 0.104 of logits up to 3.6, 39 of 42 argmaxes kept */
    cr_expect(worst > 1e-3f && worst < 0.25f, "max-abs %g", worst);
    cr_expect(same_top >= 36, "argmax kept in %d of %d rows", same_top, rows);
    fclose(a);
    fclose(b);
    remove("/tmp/run_cli_q8.f32");
    free(out);
    free(err);
    cr_expect_eq(run("tests/data/fixtures/small -wq q4", &out, &err), 2);
    cr_expect(strstr(err, "-wq: expected stored or q8, found 'q4'") != NULL, "%s", err);
    free(out);
    free(err);
    cr_expect_eq(run("tests/data/fixtures/small -wq-draft f16", &out, &err), 2);
    cr_expect(strstr(err, "-wq-draft: expected stored or q8") != NULL, "%s", err);
    free(out);
    free(err);
}

/* Cell k (0 = the scheme's name) of the table row that starts with prefix,
 * as a number; NAN when the row is missing. */
static double cell(const char *out, const char *prefix, int k) {
    const char *r = strstr(out, prefix);
    if (!r) return NAN;
    for (int bars = 0; bars <= k; r++)
        if (*r == '|') bars++;
        else if (*r == '\n' || !*r) return NAN;
    return strtod(r, NULL);
}

/* -m compare -n 0 measures no greedy tokens: its greedy and speed columns
 * say "-", not 0.0% (which would read as every token differing). */
Test(cli, compare_without_greedy_tokens) {
    char *out, *err;
    cr_assert_eq(run("tests/data/fixtures/tiny -m compare -i 'a few words to score' -n 0 -kv f16", &out, &err), 0, "%s",
                 err);
    cr_expect(strstr(out, "| f32 | stored |") && strstr(out, "| f16 | stored |"), "%s", out);
    const char *f16 = strstr(out, "| f16 | stored |");
    const char *end = f16 ? strchr(f16, '\n') : NULL;
    cr_expect(end && end - 9 >= f16 && !strncmp(end - 9, "| - | - |", 9), "greedy and speed not '-': %s", out);
    free(out), free(err);
}

/* -m kvstats: a row per cache layer (a hybrid's full-attention layers);
 * f32 stores every vector as it is (cosine 1, no error anywhere), q8 and
 * tbq4 within their rounding: errors above zero and in the order of
 * their bits (measured on the shipped model: q8 about 0.005, tbq4 0.09). */
Test(cli, kvstats_rows_follow_the_scheme) {
    static const struct {
        const char *model, *kv;
        int layers;
        double lo, hi;
    } cases[] = {
        {"models/qwen3-kjv-mtp", "f32", 6, 0, 0},
        {"models/qwen3-kjv-mtp", "q8", 6, 1e-3, 0.02},
        {"models/qwen3-kjv-mtp", "tbq4", 6, 0.03, 0.2},
        {"models/qwen35-kjv-mtp", "tbq4", 2, 0.03, 0.2},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char args[512], *out, *err;
        snprintf(args, sizeof args, "%s -m kvstats -kv %s -dev cpu -i 'In the beginning God created the heaven and the earth.'",
                 cases[i].model, cases[i].kv);
        cr_assert_eq(run(args, &out, &err), 0, "%s: %s", args, err);
        double r[16][6];
        const int n = kvstats_rows(out, r, 16);
        cr_expect_eq(n, cases[i].layers, "%s: %d rows: %s", args, n, out);
        static const int errs[] = {2, 4, 5}; /* the K, V and output error columns */
        for (int l = 0; l < n; l++) {
            for (int k = 0; k < 3; k++) {
                const double e = r[l][errs[k]];
                cr_expect(e >= cases[i].lo && e <= cases[i].hi, "%s: layer %g column %d: %g not in [%g, %g]", args,
                          r[l][0], errs[k], e, cases[i].lo, cases[i].hi);
            }
            if (cases[i].hi == 0) cr_expect(r[l][1] == 1 && r[l][3] == 1, "%s: f32 cosines below 1", args);
        }
        free(out), free(err);
    }
}

/* -m compare: rows name their weights; with -wq q8 the f32 reference keeps
 * the stored weights and f32 on q8 weights shows the weights' cost alone. */
Test(cli, compare_rows_name_their_weights) {
    const char *args = "tests/data/fixtures/small -m compare -f tests/data/golden/small/sentence/prompt.txt -n 4 -kv f16,tbq4";
    char cmd[1024], *out, *err, *out_q8;
    cr_assert_eq(run(args, &out, &err), 0, "%s", err);
    free(err);
    snprintf(cmd, sizeof cmd, "%s -wq q8", args);
    cr_assert_eq(run(cmd, &out_q8, &err), 0, "%s", err);
    free(err);
    /* columns: scheme, weights, K bits, V bits, bytes, vs f16, ppl, dppl, KL, top-1 */
    cr_expect_eq(cell(out, "| f32 | stored |", 8), 0);
    cr_expect_eq(cell(out, "| f32 | stored |", 9), 100);
    cr_expect(cell(out, "| f16 | stored |", 8) < 1e-4, "%s", out);
    cr_expect(cell(out, "| tbq4 | stored |", 8) > cell(out, "| f16 | stored |", 8), "%s", out);
    cr_expect(strstr(out, "| q8 |") == NULL, "%s", out);
    const char *rows[] = {"| f32 | stored |", "| f32 | q8 |", "| f16 | q8 |", "| tbq4 | q8 |"};
    const char *prev = out_q8;
    for (int i = 0; i < 4; i++) {
        const char *r = strstr(out_q8, rows[i]);
        cr_expect(r && r > prev, "row %s missing or out of order:\n%s", rows[i], out_q8);
        prev = r ? r : prev;
    }
    /* the same reference either way; q8 weights move the logits a little
     * (measured KL 0.00016 nats, ppl -0.08%) */
    cr_expect_eq(cell(out_q8, "| f32 | stored |", 6), cell(out, "| f32 | stored |", 6));
    double kl = cell(out_q8, "| f32 | q8 |", 8);
    cr_expect(kl > 0 && kl < 0.01, "KL of q8 weights %g", kl);
    free(out);
    free(out_q8);
    /* 64 schemes and the reference do not fit the table: a usage error */
    int len = snprintf(cmd, sizeof cmd, "%s -kv f16", args);
    for (int i = 1; i < 64; i++) len += snprintf(cmd + len, sizeof cmd - (size_t)len, ",f16");
    cr_expect_eq(run(cmd, &out, &err), 2);
    cr_expect(strstr(err, "-kv: expected at most 63 schemes to compare") != NULL, "%s", err);
    free(out);
    free(err);
}

/* -act bf16: the logits stay within bf16 rounding of the inputs of the
 * golden ones; compare shows its cost beside the f32 reference; what it
 * cannot run on is refused, with one line naming why. */
Test(cli, bf16_inputs_stay_close_and_refuse_what_they_cannot_run) {
    char *out, *err;
    char cmd[1024];
    int rc = run("tests/data/fixtures/small -m logits -kv f32 -act bf16 -f tests/data/golden/small/sentence/prompt.txt "
                 "-o /tmp/run_cli_act.f32",
                 &out, &err);
    if (rc == 1 && strstr(err, "need AVX-512 BF16")) {
        /* a CPU without the instruction: refused, as run -h says */
        free(out), free(err);
        cr_skip_test("no AVX-512 BF16 here");
    }
    cr_assert_eq(rc, 0, "%s", err);
    cr_expect(strstr(err, "matmul inputs: bf16") != NULL, "%s", err);
    free(out), free(err);
    FILE *a = fopen("/tmp/run_cli_act.f32", "rb"), *b = fopen("tests/data/golden/small/sentence/logits.f32", "rb");
    cr_assert(a && b);
    static float x[4160], y[4160];
    float worst = 0;
    int rows = 0;
    while (fread(y, sizeof y, 1, b) == 1) {
        cr_assert_eq(fread(x, sizeof x, 1, a), 1, "logits file too short at row %d", rows);
        for (int i = 0; i < 4160; i++) worst = fmaxf(worst, fabsf(x[i] - y[i]));
        rows++;
    }
    /* measured: max-abs 0.026 (model/golden_with_bf16_activations) */
    cr_expect(worst > 1e-3f && worst < 0.06f, "max-abs %g", worst);
    fclose(a), fclose(b);
    remove("/tmp/run_cli_act.f32");
    cr_assert_eq(run("tests/data/fixtures/small -m compare -f tests/data/golden/small/sentence/prompt.txt -n 4 -kv f16 "
                     "-act bf16",
                     &out, &err),
                 0, "%s", err);
    cr_expect(strstr(out, "| f32 | stored |") && strstr(out, "| f32 | act bf16 |") && strstr(out, "| f16 | act bf16 |"),
              "%s", out);
    double kl = cell(out, "| f32 | act bf16 |", 8);
    cr_expect(kl > 0 && kl < 0.01, "KL of bf16 inputs %g", kl);
    free(out), free(err);
    cr_expect_eq(run("tests/data/fixtures/small -act f16", &out, &err), 2);
    cr_expect(strstr(err, "-act: expected f32 or bf16, found 'f16'") != NULL, "%s", err);
    free(out), free(err);
    cr_expect_eq(run("tests/data/fixtures/small -act bf16 -wq q8", &out, &err), 2);
    cr_expect(strstr(err, "not with -wq q8") != NULL, "%s", err);
    free(out), free(err);
    /* the same binary on a lower kernel level, and from the file mapping */
    snprintf(cmd, sizeof cmd, "RUN_ISA=avx2 %s tests/data/fixtures/small -act bf16 -n 2 >/dev/null 2>/tmp/run_cli_act.err", bin());
    cr_expect_eq(WEXITSTATUS(system(cmd)), 1);
    char *e = slurp("/tmp/run_cli_act.err", NULL);
    cr_expect(strstr(e, "need AVX-512 BF16 (vdpbf16ps), which this CPU at kernel level avx2 lacks") != NULL, "%s", e);
    free(e);
    snprintf(cmd, sizeof cmd, "RUN_MMAP=1 %s tests/data/fixtures/small -act bf16 -n 2 >/dev/null 2>/tmp/run_cli_act.err", bin());
    cr_expect_eq(WEXITSTATUS(system(cmd)), 1);
    e = slurp("/tmp/run_cli_act.err", NULL);
    cr_expect(strstr(e, "must be read into memory") != NULL, "%s", e);
    free(e);
    remove("/tmp/run_cli_act.err");
}

Test(cli, ppl_last_line) {
    char *out, *err;
    cr_assert_eq(run("tests/data/fixtures/tiny -m ppl -kv f32 -c 100 -f tests/data/golden/tiny/paragraph/prompt.txt",
                     &out, &err),
                 0, "%s", err);
    double ppl;
    int n;
    const char *last = strstr(out, "ppl ");
    cr_assert(last, "%s", out);
    cr_assert_eq(sscanf(last, "ppl %lf tokens %d", &ppl, &n), 2, "%s", out);
    /* 334 tokens in windows of 100: 99 + 99 + 99 + 33 scored */
    cr_expect_eq(n, 330);
    /* random weights with small logits: close to uniform over 4160 */
    cr_expect(ppl > 1000 && ppl < 20000, "ppl %g", ppl);
    cr_expect(strstr(err, "window 4/4") != NULL, "%s", err);
    expect_stats(err);
    free(out);
    free(err);
}

/* Greedy generation is deterministic; sampling with a seed reproduces; and the
 * thread count does not change the text. */
Test(cli, generate_deterministic) {
    char *o1, *o2, *o3, *e1, *e2, *e3;
    cr_assert_eq(run("tests/data/fixtures/small -i 'Hello there' -n 24 -t 0 -T 1", &o1, &e1), 0, "%s", e1);
    cr_assert_eq(run("tests/data/fixtures/small -i 'Hello there' -n 24 -t 0 -T 2", &o2, &e2), 0, "%s", e2);
    cr_expect_str_eq(o1, o2);
    cr_expect(strncmp(o1, "Hello there", 11) == 0, "prompt not echoed: %s", o1);
    cr_expect(strlen(o1) > 11, "nothing generated");
    expect_stats(e1);
    cr_expect(strstr(e1, "decode_tokens=23") != NULL, "%s", e1);
    free(o1), free(o2), free(e1), free(e2);
    cr_assert_eq(run("tests/data/fixtures/small -i 'Hello there' -n 24 -t 1 -s 7", &o1, &e1), 0, "%s", e1);
    cr_assert_eq(run("tests/data/fixtures/small -i 'Hello there' -n 24 -t 1 -s 7", &o2, &e2), 0, "%s", e2);
    cr_assert_eq(run("tests/data/fixtures/small -i 'Hello there' -n 24 -t 1 -s 8", &o3, &e3), 0, "%s", e3);
    cr_expect_str_eq(o1, o2);
    cr_expect(strcmp(o1, o3) != 0, "different seeds gave the same text: %s", o1);
    free(o1), free(o2), free(o3), free(e1), free(e2), free(e3);
}

Test(cli, context_overflow_ends_generation) {
    char *out, *err;
    cr_assert_eq(run("tests/data/fixtures/tiny -i 'Hello there' -n 50 -t 0 -c 12", &out, &err), 0, "%s", err);
    cr_expect(strstr(err, "context full at 12 tokens") != NULL, "%s", err);
    expect_stats(err);
    free(out);
    free(err);
}

/* Two turns: the second must reuse the cache, so prefill counts only its own
 * tokens (the template text closing turn one and opening turn two). */
Test(cli, chat_keeps_cache_between_turns) {
    char *out, *err;
    cr_assert_eq(system("printf 'And then?\\n' > /tmp/run_cli_chat.txt"), 0);
    char cmd[512];
    snprintf(cmd, sizeof cmd,
             "%s tests/data/fixtures/small -m chat -i 'Hi' -y 'Be brief' -n 5 -t 0 -think 0 </tmp/run_cli_chat.txt "
             ">/tmp/run_cli_chat.out 2>/tmp/run_cli_chat.err",
             bin());
    cr_assert_eq(system(cmd), 0);
    out = slurp("/tmp/run_cli_chat.out", NULL);
    err = slurp("/tmp/run_cli_chat.err", NULL);
    int nl = 0;
    for (char *p = out; *p; p++) nl += *p == '\n';
    cr_expect_eq(nl, 2, "expected two replies: %s", out);
    /* turn 1: <|im_start|>system\nBe brief<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n
     * turn 2: <|im_end|>\n<|im_start|>user\nAnd then?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n */
    long pre;
    const char *s = strstr(err, "prefill_tokens=");
    cr_assert(s, "%s", err);
    cr_assert_eq(sscanf(s, "prefill_tokens=%ld", &pre), 1);
    char *o2, *e2;
    cr_assert_eq(run("tests/data/fixtures/small -m tokenize -i '<|im_start|>system\nBe brief<|im_end|>\n<|im_start|>user\n"
                     "Hi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n<|im_end|>\n<|im_start|>user\nAnd "
                     "then?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n'",
                     &o2, &e2),
                 0, "%s", e2);
    int n = 1;
    for (char *p = o2; *p && *p != '\n'; p++) n += *p == ' ';
    cr_expect_eq(pre, n, "prefill %ld tokens, the two turns' template has %d", pre, n);
    expect_stats(err);
    free(out), free(err), free(o2), free(e2);
    remove("/tmp/run_cli_chat.txt");
    remove("/tmp/run_cli_chat.out");
    remove("/tmp/run_cli_chat.err");
}

Test(cli, help_lists_schemes_and_modes) {
    char *out, *err;
    cr_assert_eq(run("-h", &out, &err), 0);
    cr_expect(strstr(out, "-m MODE") && strstr(out, "f16") && strstr(out, "-kv SCHEME"), "%s", out);
    free(out);
    free(err);
}

/* Threads split work by output rows and kv heads, never inside one sum, so
 * -T 1 and -T 2 give the same logits (the issue allows 1e-5). */
Test(cli, thread_count_does_not_change_logits) {
    char *out, *err;
    const char *paths[2] = {"/tmp/run_cli_t1.f32", "/tmp/run_cli_t2.f32"};
    for (int t = 0; t < 2; t++) {
        char args[512];
        snprintf(args, sizeof args,
                 "tests/data/fixtures/small -m logits -kv q8 -T %d -f tests/data/golden/small/paragraph/prompt.txt -o %s",
                 t + 1, paths[t]);
        cr_assert_eq(run(args, &out, &err), 0, "%s", err);
        free(out);
        free(err);
    }
    FILE *a = fopen(paths[0], "rb"), *b = fopen(paths[1], "rb");
    cr_assert(a && b);
    float x, y, worst = 0;
    long n = 0;
    while (fread(&x, 4, 1, a) == 1 && fread(&y, 4, 1, b) == 1) worst = fmaxf(worst, fabsf(x - y)), n++;
    cr_expect_eq(n, 334L * 4160);
    cr_expect(worst <= 1e-5f, "-T 1 vs -T 2 max-abs %g", worst);
    fclose(a), fclose(b);
    remove(paths[0]), remove(paths[1]);
}

/* The stats line's model_bytes: the matrices as the forward reads them.
 * The shipped model (bf16, tied embedding; hidden 256, 6 layers of
 * 983,040 weights, vocab 4160, an MTP layer and its 131,072-weight fc):
 * (1,064,960 + 6 x 983,040 + 983,040 + 131,072) x 2 bytes = 16,154,624.
 * With -wq q8 the layers and a q8 lm_head of its own take 1.125 bytes a
 * weight (a scale per 32), the embedding and, at -spec 0, the MTP module
 * stay bf16: 2,129,920 + 6,635,520 + 1,198,080 + 2,228,224 = 12,191,744. */
Test(cli, stats_model_bytes_are_the_weights_read) {
    static const struct {
        const char *args, *want;
    } cases[] = {
        {"models/qwen3-kjv-mtp -dev cpu -n 1 -t 0 -spec 0", " model_bytes=16154624\n"},
        {"models/qwen3-kjv-mtp -dev cpu -n 1 -t 0 -spec 0 -wq q8", " model_bytes=12191744\n"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char *out, *err;
        cr_assert_eq(run(cases[i].args, &out, &err), 0, "%s: %s", cases[i].args, err);
        expect_stats(err);
        cr_expect(strstr(err, cases[i].want), "%s: expected%s in %s", cases[i].args, cases[i].want, err);
        free(out), free(err);
    }
}
