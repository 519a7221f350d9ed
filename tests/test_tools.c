/* test_tools.c: the benchmark tools (tools/make_model.c, bench.c,
 * bench_attn.c) through their built binaries in $TOOLS_DIR: make_model
 * writes the same bytes for the same seed, a checkpoint that ./run
 * ($RUN_BIN) loads, and shards without changing a value, and a Qwen3.5
 * hybrid with its MTP head that ./run loads and decodes from; each tool
 * refuses bad arguments with one line on stderr and exit code 2. Speed
 * itself is only measured (make bench), never asserted. */
#include <criterion/criterion.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static const char *tools(void) { return getenv("TOOLS_DIR") ? getenv("TOOLS_DIR") : "build"; }
static const char *run_bin(void) { return getenv("RUN_BIN") ? getenv("RUN_BIN") : "./run"; }

/* Exit code of a shell command line built like printf. */
__attribute__((format(printf, 1, 2))) static int sh(const char *fmt, ...) {
    char cmd[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* The whole of a small text file (at most 4 KB). */
static void slurp(const char *path, char *buf, size_t n) {
    FILE *f = fopen(path, "rb");
    size_t k = f ? fread(buf, 1, n - 1, f) : 0;
    buf[k] = 0;
    if (f) fclose(f);
}

/* tiny is make_model's quick shape: 2 layers, hidden 256, the full vocabulary
 * (about 80 MB of bf16, 78 of them the embedding). Seeds 7, 7 again, 8, and
 * 7 in shards of at most 1 MB (the embedding alone in the first: 6 files). */
Test(tools, make_model_is_deterministic_and_loads, .timeout = 300) {
    const char *d = "/tmp/run_tools_mm";
    const int pid = (int)getpid();
    const char *mm[4] = {"--seed 7", "--seed 7", "--seed 8", "--seed 7 --max-shard-mb 1"};
    for (int i = 0; i < 4; i++)
        cr_assert_eq(sh("rm -rf %s%d.%d && %s/make_model --shape tiny %s --out %s%d.%d >/dev/null", d, i, pid, tools(),
                        mm[i], d, i, pid),
                     0, "make_model %s failed", mm[i]);
    cr_expect_eq(sh("cmp -s %s0.%d/model.safetensors %s1.%d/model.safetensors", d, pid, d, pid), 0,
                 "the same seed wrote different weights");
    cr_expect_eq(sh("cmp -s %s0.%d/config.json %s1.%d/config.json", d, pid, d, pid), 0, "config.json differs");
    cr_expect_neq(sh("cmp -s %s0.%d/model.safetensors %s2.%d/model.safetensors", d, pid, d, pid), 0,
                  "seeds 7 and 8 wrote the same weights");
    cr_expect_eq(sh("test -f %s3.%d/model.safetensors.index.json && test -f %s3.%d/model-00006-of-00006.safetensors", d,
                    pid, d, pid),
                 0, "1 MB shards: expected an index and 6 shards");
    /* the unsharded and sharded checkpoints give the same logits to the bit */
    for (int i = 0; i < 4; i += 3)
        cr_assert_eq(sh("%s %s%d.%d -m logits -f tests/data/golden/tiny/hello/prompt.txt -o %s%d.%d.f32 "
                        ">/dev/null 2>%s%d.%d.err",
                        run_bin(), d, i, pid, d, i, pid, d, i, pid),
                     0, "./run on make_model's checkpoint %d failed", i);
    cr_expect_eq(sh("test -s %s0.%d.f32 && cmp -s %s0.%d.f32 %s3.%d.f32", d, pid, d, pid, d, pid), 0,
                 "sharding changed the logits");
    sh("rm -rf %s[0-3].%d %s[0-3].%d.f32 %s[0-3].%d.err", d, pid, d, pid, d, pid);
}

/* qwen3.5-tiny: 4 layers (3 Gated DeltaNet, 1 gated full attention), the
 * Qwen3.5 vocabulary (about 140 MB with MTP): it loads, gives finite
 * logits (run checks), and decodes with and without drafts alike. */
Test(tools, make_model_writes_a_loadable_hybrid, .timeout = 300) {
    const int pid = (int)getpid();
    const char *d = "/tmp/run_tools_q35";
    cr_assert_eq(sh("rm -rf %s.%d && %s/make_model --shape qwen3.5-tiny --mtp --out %s.%d >/dev/null", d, pid, tools(),
                    d, pid),
                 0, "make_model --shape qwen3.5-tiny failed");
    cr_expect_eq(sh("grep -q '\"model_type\": \"qwen3_5\"' %s.%d/config.json && grep -q 'text_config' %s.%d/config.json",
                    d, pid, d, pid),
                 0, "config.json: expected Qwen3.5's nested layout");
    for (int spec = 0; spec < 3; spec += 2)
        cr_expect_eq(sh("%s %s.%d -i 'In the beginning' -n 8 -t 0 -spec %d > %s.%d.%d.txt 2>/dev/null", run_bin(), d, pid,
                        spec, d, pid, spec),
                     0, "./run -spec %d on the hybrid failed", spec);
    cr_expect_eq(sh("test -s %s.%d.0.txt && cmp -s %s.%d.0.txt %s.%d.2.txt", d, pid, d, pid, d, pid), 0,
                 "greedy output with drafts differs from plain decoding");
    sh("rm -rf %s.%d %s.%d.[02].txt", d, pid, d, pid);
}

/* Each case: the arguments, the exit code expected and a piece of the one
 * line on stderr. */
Test(tools, bad_arguments_exit_2_with_one_line) {
    const struct {
        const char *tool, *args, *says;
    } cases[] = {
        {"make_model", "", "usage: make_model"},
        {"make_model", "--shape 3b --out /tmp/run_tools_never", "--shape: expected 0.6b"},
        {"make_model", "--shape tiny --seed x7 --out /tmp/run_tools_never", "--seed: expected a whole number"},
        {"make_model", "--shape tiny --layers 0 --out /tmp/run_tools_never", "--layers: expected a whole number"},
        {"make_model", "--shape tiny --max-shard-mb -5 --out /tmp/run_tools_never", "--max-shard-mb: expected"},
        {"make_model", "--shape qwen3.5-tiny --layers 3 --out /tmp/run_tools_never", "--layers: expected at least 4"},
        {"bench", "", "usage: bench"},
        {"bench", "bench/none --threads 0", "usage: bench"},
        {"bench", "bench/none --kv a,b,c,d,e,f,g,h,i,j,k,l,m,n,o,p,q", "--kv: expected at most"},
        {"bench", "bench/none --kv f16,zzz", "unknown scheme 'zzz'"},
        {"bench", "bench/none --kv ,", "expected at least one scheme"},
        {"bench", "bench/none --vs", "usage: bench"},
        {"bench_attn", "--layers 0", "usage: bench_attn"},
        {"bench_attn", "8192 x", "usage: bench_attn"},
        {"bench_attn", "8192abc", "usage: bench_attn"},
        {"bench_attn", "--layers 3x 1024", "usage: bench_attn"},
        {"bench_attn", "--kv q8,nope 1024", "--kv: no scheme 'nope'"},
        {"bench_attn", "--tokens 5 1024", "usage: bench_attn"},
        {"bench_attn", "--tokens 4 2", "ctx 2: expected at least --tokens (4)"},
        {"bench_serve", "", "usage: bench_serve"},
        {"bench_serve", "m --tokens", "usage: bench_serve"},
        {"bench_serve", "m --tokens 0", "--tokens: expected a whole number >= 1, found '0'"},
        {"bench_serve", "m --users 1,x", "--users: expected user counts in 1..256"},
        {"bench_serve", "m --speed 3", "usage: bench_serve"},
    };
    const int pid = (int)getpid();
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int rc = sh("%s/%s %s >/dev/null 2>/tmp/run_tools_err.%d", tools(), cases[i].tool, cases[i].args, pid);
        char path[64], err[4096];
        snprintf(path, sizeof path, "/tmp/run_tools_err.%d", pid);
        slurp(path, err, sizeof err);
        cr_expect_eq(rc, 2, "%s %s: exit %d, expected 2 (%s)", cases[i].tool, cases[i].args, rc, err);
        cr_expect(strstr(err, cases[i].says) != NULL, "%s %s: stderr '%s' lacks '%s'", cases[i].tool, cases[i].args,
                  err, cases[i].says);
        const char *nl = strchr(err, '\n');
        cr_expect(nl && (nl[1] == 0 || strncmp(cases[i].says, "usage", 5) == 0), "%s %s: more than one line: '%s'",
                  cases[i].tool, cases[i].args, err);
        remove(path);
    }
    cr_expect_neq(access("/tmp/run_tools_never", F_OK), 0, "make_model created its --out before refusing");
}

/* bench_serve on the shipped model, briefly: both tables, every row, and
 * the warm prompt finding the document's chunks in the cache. */
Test(tools, bench_serve_runs) {
    if (sh("%s -h | grep -q ' | serve'", run_bin())) cr_skip_test("this ./run was built without libmicrohttpd");
    const int pid = (int)getpid();
    int rc = sh("RUN_BIN=%s %s/bench_serve models/qwen3-kjv-mtp --users 1,3 --tokens 4 --prefix 200 --threads 1 "
                ">/tmp/run_bench_serve.%d 2>&1", run_bin(), tools(), pid);
    char path[64], out[4096];
    snprintf(path, sizeof path, "/tmp/run_bench_serve.%d", pid);
    slurp(path, out, sizeof out);
    cr_assert_eq(rc, 0, "%s", out);
    cr_expect(strstr(out, "\nf16        1 ") && strstr(out, "\nf16        3 ") && strstr(out, "\ntbq4       3 "), "%s", out);
    int prompt = 0, cached = 0;
    const char *t = strstr(out, "\nkv     prompt");
    t = t ? strstr(t, "\ntbq4 ") : NULL;
    cr_assert(t && sscanf(t, "\ntbq4 %d %d", &prompt, &cached) == 2, "%s", out);
    cr_expect(prompt >= 200 && cached >= 128 && cached < prompt, "%s", out);
    cr_expect(strstr(out, "tbq4 holds") != NULL, "%s", out);
    remove(path);
}

/* bench_attn's --split on a short cache: a row per scheme, both halves
 * timed (positive and finite). */
Test(tools, bench_attn_split_runs) {
    const int pid = (int)getpid();
    int rc = sh("%s/bench_attn --split --kv tbq3,f16 --tokens 2 64 >/tmp/run_bench_attn.%d 2>&1", tools(), pid);
    char path[64], out[4096];
    snprintf(path, sizeof path, "/tmp/run_bench_attn.%d", pid);
    slurp(path, out, sizeof out);
    cr_assert_eq(rc, 0, "%s", out);
    cr_expect(strstr(out, "| scheme | ctx | queries | score ns/position | accumulate ns/position |"), "%s", out);
    const char *names[] = {"f16", "tbq3"};
    for (int i = 0; i < 2; i++) {
        char want[32];
        snprintf(want, sizeof want, "\n| %s | 64 | 4 | ", names[i]);
        const char *r = strstr(out, want);
        double s = 0, a = 0;
        cr_assert(r && sscanf(r + strlen(want), "%lf | %lf |", &s, &a) == 2, "%s row: %s", names[i], out);
        cr_expect(s > 0 && a > 0 && s < 1e6 && a < 1e6, "%s: %g %g", names[i], s, a);
    }
    remove(path);
}
