/* test_usage.c: the first hour with ./run, through the real binary
 * ($RUN_BIN): where the model may be named and in what form (a folder, a
 * .safetensors file in one, a single-file model), the option names
 * llama.cpp users type, what a comma means, the penalties, tokenize both
 * ways, chat past a full context, Ctrl-C, and the stats lines. */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kernels/cuda.h"
#include "tests/util.h"

static const char *bin(void) { return getenv("RUN_BIN") ? getenv("RUN_BIN") : "./run"; }

/* Runs `sh -c "<prefix> $RUN_BIN <args>"` under a timeout (a hang fails);
 * stdin from /dev/null unless args redirect it. Returns the exit code;
 * stdout and stderr into malloc'd strings. */
static int run(char **out, char **err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int run(char **out, char **err, const char *fmt, ...) {
    char args[4096], cmd[8192], po[64], pe[64];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    snprintf(po, sizeof po, "/tmp/run_usage_out.%d", (int)getpid());
    snprintf(pe, sizeof pe, "/tmp/run_usage_err.%d", (int)getpid());
    snprintf(cmd, sizeof cmd, "timeout -k 5 60 %s </dev/null %s >%s 2>%s", bin(), args, po, pe);
    int st = system(cmd);
    *out = slurp(po, NULL);
    *err = slurp(pe, NULL);
    remove(po);
    remove(pe);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static int count(const char *s, const char *what) {
    int n = 0;
    for (const char *p = s; (p = strstr(p, what)); p += strlen(what)) n++;
    return n;
}

#define TINY "tests/data/fixtures/tiny"

/* The single-file model runs exactly like its folder: the same logits,
 * bit for bit; the model may come anywhere, or after --model; a
 * .safetensors file in a snapshot stands for its folder. */
Test(usage, single_file_model_runs_like_its_folder) {
    char *o, *e, tmp[] = "/tmp/run_usage_XXXXXX";
    cr_assert(mkdtemp(tmp));
    cr_assert_eq(run(&o, &e, "%s -m pack -o %s/tiny.bin", TINY, tmp), 0, "%s", e);
    cr_expect(strstr(e, "wrote") && strstr(e, "tiny.bin"), "%s", e);
    free(o), free(e);
    /* the folder; the packed file after the options; a .safetensors file after --model */
    cr_assert_eq(run(&o, &e, "%s -m logits -i 'In the beginning God' -o %s/a.f32", TINY, tmp), 0, "%s", e);
    free(o), free(e);
    cr_assert_eq(run(&o, &e, "-m logits -i 'In the beginning God' -o %s/b.f32 %s/tiny.bin", tmp, tmp), 0, "%s", e);
    free(o), free(e);
    cr_assert_eq(run(&o, &e, "-m logits --model %s/model.safetensors -i 'In the beginning God' -o %s/c.f32", TINY, tmp),
                 0, "%s", e);
    free(o), free(e);
    char cmp[512];
    snprintf(cmp, sizeof cmp, "cmp -s %s/a.f32 %s/b.f32 && cmp -s %s/a.f32 %s/c.f32", tmp, tmp, tmp, tmp);
    cr_expect_eq(system(cmp), 0, "the three forms' logits differ");
    /* its tokenizer came along */
    char *o2, *e2;
    cr_assert_eq(run(&o, &e, "%s/tiny.bin -m tokenize -i 'hello <|im_end|>'", tmp), 0, "%s", e);
    cr_assert_eq(run(&o2, &e2, "%s -m tokenize -i 'hello <|im_end|>'", TINY), 0, "%s", e2);
    cr_expect_str_eq(o, o2);
    free(o), free(e), free(o2), free(e2);
    cr_expect_eq(run(&o, &e, "README.md -i hi"), 1);
    cr_expect(strstr(e, "README.md: expected a model folder, a .safetensors file in one, or a single-file model"),
              "%s", e);
    free(o), free(e);
    cr_expect_eq(run(&o, &e, "%s %s -i hi", TINY, TINY), 2);
    cr_expect(strstr(e, "expected one model"), "%s", e);
    free(o), free(e);
    /* what cannot load is not packed: a folder without config.json */
    char sh[512];
    snprintf(sh, sizeof sh, "mkdir %s/nocfg && cp %s/model.safetensors %s/tokenizer.json %s/nocfg/", tmp, TINY, TINY, tmp);
    cr_assert_eq(system(sh), 0);
    cr_expect_eq(run(&o, &e, "%s/nocfg -m pack -o %s/nocfg.bin", tmp, tmp), 1);
    cr_expect(strstr(e, "nocfg/config.json: missing"), "%s", e);
    free(o), free(e);
    char rm[300];
    snprintf(rm, sizeof rm, "rm -rf %s", tmp);
    cr_expect_eq(system(rm), 0);
}

/* llama.cpp's long names mean the same as run's short ones. */
Test(usage, llama_cpp_option_names) {
    char *o1, *e1, *o2, *e2;
    cr_assert_eq(run(&o1, &e1, "%s -i 'Hello there' -n 8 -t 0.7 -k 20 -p 0.9 -mp 0.1 -s 5 -T 1 -c 64 -kv q8/q4", TINY),
                 0, "%s", e1);
    cr_assert_eq(run(&o2, &e2, "--model %s --prompt 'Hello there' --n-predict 8 --temp 0.7 --top-k 20 --top-p 0.9 "
                     "--min-p 0.1 --seed 5 --threads 1 --ctx-size 64 -ctk q8_0 --cache-type-v q4_0", TINY),
                 0, "%s", e2);
    cr_expect_str_eq(o1, o2);
    cr_expect(strstr(e2, "kv q8/q4, context 64, 1 threads"), "%s", e2);
    free(o1), free(e1), free(o2), free(e2);
    cr_assert_eq(run(&o1, &e1, "--version"), 0);
    cr_expect(strstr(o1, "run ") && strstr(o1, "kernels"), "%s", o1);
    free(o1), free(e1);
    cr_assert_eq(run(&o1, &e1, "--help"), 0);
    cr_expect(strstr(o1, "--n-predict") && strstr(o1, "--cache-type-k") && strstr(o1, "A comma separates"), "%s", o1);
    free(o1), free(e1);
}

/* Unknown options, options without their value and values out of range
 * name the option and what it expects, exit 2; a comma means a list
 * (compare) and nothing else. */
/* This machine's kernel level names, and one of another architecture's. */
#if defined(__aarch64__)
#define ISA_LEVELS "ref, neon or dotprod"
#define ISA_FOREIGN "avx2"
#elif defined(__x86_64__)
#define ISA_LEVELS "ref, avx2, avx512 or avx512vnni"
#define ISA_FOREIGN "neon"
#else
#define ISA_LEVELS "ref"
#define ISA_FOREIGN "avx2"
#endif

Test(usage, option_errors_say_what_was_expected) {
    struct { const char *args, *frag; } cases[] = {
        {"--nope 3", "unknown option '--nope'"},
        {"-i hi -n", "-n: missing its value (a token count >= 0, or -1 for no limit)"},
        {"-i hi --temp 200", "--temp: expected a temperature in [0, 100], found '200'"},
        {"-i hi --top-p 0", "--top-p: expected top-p in (0, 1]"},
        {"-i hi -n -2", "-n: expected a token count"},
        {"-i hi --repeat-penalty 0", "--repeat-penalty: expected"},
        {"-i hi -kv q8,q4", "a comma separates schemes to compare"},
        {"-i hi -ctk q5_1", "unknown scheme 'q5_1'"},
        {"-m compare -i hi -o x.png", "-o x.png"},
        {"-m pack", "-m pack needs -o FILE"},
        {"-wq q4 -i hi", "-wq: expected stored or q8, found 'q4'"},
        {"-i hi -ctk q8/q4", "-ctk: expected one scheme, found 'q8/q4'"},
        {"-m compare -i hi -kv ,", "expected schemes to compare"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char *o, *e;
        cr_expect_eq(run(&o, &e, "%s %s", TINY, cases[i].args), 2, "%s: %s", cases[i].args, e);
        cr_expect(strstr(e, cases[i].frag) && count(e, "error: ") == 1, "%s: %s", cases[i].args, e);
        free(o), free(e);
    }
    char *e, cmd[512];
    snprintf(cmd, sizeof cmd, "RUN_ISA=avx1024 %s -i hi -n 1 2>/tmp/run_usage_isa.%d", bin(), (int)getpid());
    int st = system(cmd);
    cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 2, "an unknown RUN_ISA is a usage error");
    snprintf(cmd, sizeof cmd, "/tmp/run_usage_isa.%d", (int)getpid());
    e = slurp(cmd, NULL);
    cr_expect(strstr(e, "RUN_ISA: expected " ISA_LEVELS ", found 'avx1024'"), "%s", e);
    free(e);
    remove(cmd);
    /* the other architecture's level names say so */
    snprintf(cmd, sizeof cmd, "RUN_ISA=%s %s -i hi -n 1 2>/tmp/run_usage_isa.%d", ISA_FOREIGN, bin(), (int)getpid());
    st = system(cmd);
    cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 2, "another architecture's RUN_ISA is a usage error");
    snprintf(cmd, sizeof cmd, "/tmp/run_usage_isa.%d", (int)getpid());
    e = slurp(cmd, NULL);
    cr_expect(strstr(e, "RUN_ISA=" ISA_FOREIGN ": a level of another architecture") && count(e, "error: ") == 1, "%s",
              e);
    free(e);
    remove(cmd);
}

/* The repeat penalty changes what greedy decoding picks; at 1 (off) it
 * changes nothing; penalties turn speculative decoding off, saying why. */
Test(usage, penalties) {
    char *o1, *e1, *o2, *e2, *o3, *e3;
    cr_assert_eq(run(&o1, &e1, "-i 'And God said' -n 40 -t 0"), 0, "%s", e1);
    cr_assert_eq(run(&o2, &e2, "-i 'And God said' -n 40 -t 0 --repeat-penalty 1"), 0, "%s", e2);
    cr_assert_eq(run(&o3, &e3, "-i 'And God said' -n 40 -t 0 --repeat-penalty 1.5 --presence-penalty 0.5"), 0, "%s",
                 e3);
    cr_expect_str_eq(o1, o2, "a penalty of 1 is off");
    cr_expect(strcmp(o1, o3) != 0, "the penalty changed nothing: %s", o3);
    cr_expect(strstr(e3, "penalties over 64 tokens: repeat 1.50") && strstr(e3, "speculative decoding off"), "%s", e3);
    free(o1), free(e1), free(o2), free(e2), free(o3), free(e3);
}

/* Pieces next to ids, and ids back to the text. */
Test(usage, tokenize_both_ways) {
    char *o, *e, *o2, *e2;
    cr_assert_eq(run(&o, &e, "-m tokenize -i 'In the beginning'"), 0, "%s", e);
    cr_expect(!strstr(e, "stats:"), "no stats line after tokenize: %s", e);
    cr_assert_eq(run(&o2, &e2, "-m detokenize -i '%.*s'", (int)strcspn(o, "\n"), o), 0, "%s", e2);
    cr_expect_str_eq(o2, "In the beginning");
    free(o), free(e), free(o2), free(e2);
    cr_assert_eq(run(&o, &e, "-m tokenize -i ' the\nend' --show-pieces"), 0, "%s", e);
    cr_expect(strstr(o, "\t\" the\"\n") && strstr(o, "\"\\x0A\""), "%s", o);
    free(o), free(e);
    cr_expect_eq(run(&o, &e, "-m detokenize -i '1 2 999999'"), 1);
    cr_expect(strstr(e, "item 2: expected a token id in 0..") && !*o, "nothing printed before the error: %s %s", o, e);
    free(o), free(e);
}

/* ppl needs two tokens; a text file feeds chat's first message; -n 0
 * runs the prompt and generates nothing. */
Test(usage, ppl_and_chat_inputs) {
    char *o, *e;
    cr_expect_eq(run(&o, &e, "-m ppl -i 'In'"), 1);
    cr_expect(strstr(e, "-m ppl needs at least 2 tokens to score, found 1") && !strstr(o, "ppl 1.0"), "%s", e);
    free(o), free(e);
    cr_assert_eq(run(&o, &e, "-i 'And God said' -n 0"), 0, "%s", e);
    cr_expect_str_eq(o, "And God said\n");
    cr_expect(strstr(e, "prefill_tokens=4") && strstr(e, "decode_tokens=0"), "%s", e);
    free(o), free(e);
    cr_assert_eq(system("printf 'And God said' > /tmp/run_usage_first.txt"), 0);
    cr_assert_eq(run(&o, &e, "-m chat -f /tmp/run_usage_first.txt -n 4 -t 0 -think 0"), 0, "%s", e);
    cr_expect(strstr(e, "prefill_tokens=") && o[0] && o[0] != '\n', "a reply to the file: %s", o);
    remove("/tmp/run_usage_first.txt");
    free(o), free(e);
}

/* A chat goes on when its context is full: the oldest turns are dropped
 * and said so; a message of over 64 KB stays one message. */
Test(usage, chat_survives_a_full_context) {
    char *o, *e;
    cr_assert_eq(system("printf 'And God said\\nLet there be light\\nAnd there was\\nAnd the evening\\n' > "
                        "/tmp/run_usage_chat.txt"), 0);
    cr_assert_eq(run(&o, &e, "-m chat -c 96 -n 30 -t 0 -think 0 -i 'In the beginning' < /tmp/run_usage_chat.txt"), 0,
                 "%s", e);
    cr_expect(count(e, "[context full: dropped the oldest") >= 2, "%s", e);
    cr_expect(!strstr(e, "error"), "%s", e);
    free(o), free(e);
    /* 70,000 bytes on one line: one turn, too long for the context */
    FILE *f = fopen("/tmp/run_usage_chat.txt", "w");
    for (int i = 0; i < 10000; i++) fputs("Selah. ", f);
    fputs("\nAmen\n", f);
    fclose(f);
    cr_assert_eq(run(&o, &e, "-m chat -n 4 -t 0 -think 0 < /tmp/run_usage_chat.txt"), 1, "refused: exit 1; %s", e);
    cr_expect_eq(count(e, "does not fit the context"), 1, "one message, refused once: %s", e);
    cr_expect_eq(count(o, "\n"), 1, "then the next line answered: %s", o);
    free(o), free(e);
    remove("/tmp/run_usage_chat.txt");
}

/* Ctrl-C stops generation where it is: the text so far, the stats, exit
 * 130. (RUN_ISA=ref keeps the shipped model slow enough to interrupt.) */
Test(usage, ctrl_c_stops_with_stats) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "RUN_ISA=ref exec %s -n -1 -c 512 -spec 0 -t 0 >/tmp/run_usage_int.out "
             "2>/tmp/run_usage_int.err", bin());
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        setpgid(0, 0);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    usleep(700 * 1000);
    kill(-pid, SIGINT);
    int st;
    waitpid(pid, &st, 0);
    char *e = slurp("/tmp/run_usage_int.err", NULL), *o = slurp("/tmp/run_usage_int.out", NULL);
    cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 130, "exit %d: %s", WIFEXITED(st) ? WEXITSTATUS(st) : -1, e);
    cr_expect(strstr(e, "stats: prefill_tokens=4") && strstr(o, "In the beginning"), "%s", e);
    free(e), free(o);
    remove("/tmp/run_usage_int.out");
    remove("/tmp/run_usage_int.err");
}

/* The seed is printed and changes between runs in the same second; from
 * another directory the shipped model is found beside the binary; no
 * stats line with nothing in it. */
Test(usage, seeds_paths_and_stats) {
    char *o1, *e1, *o2, *e2;
    cr_assert_eq(run(&o1, &e1, "-n 2"), 0, "%s", e1);
    cr_assert_eq(run(&o2, &e2, "-n 2"), 0, "%s", e2);
    unsigned long long s1 = 0, s2 = 0;
    const char *p1 = strstr(e1, " seed "), *p2 = strstr(e2, " seed ");
    cr_assert(p1 && p2, "%s", e1);
    sscanf(p1, " seed %llu", &s1);
    sscanf(p2, " seed %llu", &s2);
    cr_expect(s1 != s2, "two runs, one seed %llu", s1);
    cr_expect(strstr(e1, "prompt 4 tok at") && strstr(e1, "generated 1 tok at") && strstr(e1, "KV "), "%s", e1);
    free(o1), free(e1), free(o2), free(e2);
    char cmd[1024], cwd[512];
    cr_assert(getcwd(cwd, sizeof cwd));
    snprintf(cmd, sizeof cmd, "cd /tmp && %s%s%s -n 2 -t 0 >/dev/null 2>&1", bin()[0] == '/' ? "" : cwd,
             bin()[0] == '/' ? "" : "/", bin());
    cr_expect_eq(system(cmd), 0, "the shipped model from /tmp");
    cr_expect_eq(run(&o1, &e1, "-m compare -kv f16 -i 'In the beginning God' -n 2"), 0, "%s", e1);
    cr_expect(!strstr(e1, "stats:"), "compare prints its table, not a zeroed stats line: %s", e1);
    free(o1), free(e1);
    cr_expect_eq(run(&o1, &e1, "-i '' -n 2"), 1);
    cr_expect(!strstr(e1, "stats:"), "no stats line after an error: %s", e1);
    free(o1), free(e1);
}

/* -dev: what the GPU path does not take is a usage error under -dev cuda
 * (before any model is read), as are a -wmem value or pairing that cannot
 * be; the CPU says so in stats, and a machine or a build without a GPU
 * gets one line and exit 1. */
Test(usage, device_option) {
    char *o, *e;
    cr_expect_eq(run(&o, &e, "-dev bogus -n 1"), 2);
    cr_expect(strstr(e, "-dev: expected cpu, cuda or auto, found 'bogus'"), "%s", e);
    free(o), free(e);
    static const struct {
        const char *args, *says;
    } refused[] = {
        {"-dev cuda -kv kivi4 -n 1", "KV scheme kivi4 has no CUDA kernel yet"},
        {"-dev cuda -ctk f16 -ctv f32 -n 1", "K and V in different schemes (f16/f32)"},
        {"-dev cuda -m compare -kv f16,kivi2 -i x", "KV scheme kivi2 has no CUDA kernel yet"},
        {"-dev cuda -act bf16 -n 1", "-act bf16 is the CPU's"},
        /* -wmem: its values, and what it cannot go with */
        {"-wmem bogus -n 1", "-wmem: expected auto, map or copy, found 'bogus'"},
        {"-dev cpu -wmem map -n 1", "-wmem map: where the GPU reads the weights, but -dev cpu"},
        {"-dev cpu -wmem copy -n 1", "-wmem copy: where the GPU reads the weights, but -dev cpu"},
        {"-wmem map -wq q8 -n 1", "-wq q8 makes new ones at load (use -wmem copy)"},
    };
    for (size_t i = 0; i < sizeof refused / sizeof *refused; i++) {
        cr_expect_eq(run(&o, &e, "%s", refused[i].args), 2, "%s", refused[i].args);
        cr_expect(strstr(e, refused[i].says), "%s: %s", refused[i].args, e);
        free(o), free(e);
    }
    cr_expect_eq(run(&o, &e, "-dev cpu -n 4 -t 0"), 0);
    cr_expect(strstr(e, " device=cpu "), "%s", e);
    free(o), free(e);
    cr_expect_eq(run(&o, &e, "-dev cpu -wmem auto -n 2 -t 0"), 0, "%s", e);
    free(o), free(e);
    cr_expect_eq(run(&o, &e, "--version"), 0);
    cr_expect(strstr(o, cuda_built() ? "CUDA for sm_" : "CUDA not compiled in"), "%s", o);
    free(o), free(e);
    if (cuda_device_count() == 0) {
        cr_expect_eq(run(&o, &e, "-dev cuda -n 1"), 1);
        cr_expect(strstr(e, cuda_built() ? "no usable CUDA device" : "built without CUDA"), "%s", e);
        free(o), free(e);
        /* auto takes the CPU, and says which device in stats */
        cr_expect_eq(run(&o, &e, "-n 4 -t 0"), 0);
        cr_expect(strstr(e, " device=cpu "), "%s", e);
        free(o), free(e);
        /* -wmem given where the run goes to the CPU: a note, and the run */
        cr_expect_eq(run(&o, &e, "-wmem map -n 2 -t 0"), 0);
        cr_expect(strstr(e, "note: -wmem map: the run is on the CPU"), "%s", e);
        free(o), free(e);
    }
}
