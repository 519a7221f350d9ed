/* test_load.c: hostile checkpoints. Each case copies the tiny fixture into a
 * temporary directory, breaks one thing, runs the real binary ($RUN_BIN) and
 * expects exit code 1 with one stderr line naming what is wrong. A seeded
 * fuzzer then mutates safetensors headers and config files at random and
 * loads them in-process: any outcome but a crash is fine (make test-asan
 * runs this under AddressSanitizer and UBSan). */
#include <criterion/criterion.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "format/json.h"
#include "model/model.h"
#include "tests/util.h"

static char tmp[256];

static void setup(void) {
    snprintf(tmp, sizeof tmp, "/tmp/run_test_load_XXXXXX");
    cr_assert(mkdtemp(tmp), "mkdtemp failed");
}

static void teardown(void) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    cr_expect_eq(system(cmd), 0);
}

static void sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void sh(const char *fmt, ...) {
    char cmd[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    cr_assert_eq(system(cmd), 0, "command failed: %s", cmd);
}

/* Copies a fixture to tmp/m and returns that path. */
static const char *copy_fixture(const char *name) {
    static char dir[300];
    snprintf(dir, sizeof dir, "%s/m", tmp);
    sh("cp -r tests/data/fixtures/%s '%s' && chmod -R u+w '%s'", name, dir, dir);
    return dir;
}

static void spit(const char *path, const void *b, size_t n) {
    FILE *f = fopen(path, "wb");
    cr_assert(f);
    cr_assert_eq(fwrite(b, 1, n, f), n);
    fclose(f);
}

/* Replaces the first occurrence of `from` with `to` in a text file. */
static void replace_in(const char *path, const char *from, const char *to) {
    size_t n;
    char *b = slurp(path, &n), *p = strstr(b, from);
    cr_assert(p, "'%s' not found in %s", from, path);
    FILE *f = fopen(path, "wb");
    fwrite(b, 1, (size_t)(p - b), f);
    fputs(to, f);
    fputs(p + strlen(from), f);
    fclose(f);
    free(b);
}

/* Rewrites a safetensors header with `from` replaced by `to`; offsets are
 * relative to the data section, so a longer or shorter header stays valid. */
static void patch_header(const char *path, const char *from, const char *to) {
    size_t n;
    unsigned char *b = (unsigned char *)slurp(path, &n);
    unsigned long long h = 0;
    for (int i = 7; i >= 0; i--) h = (h << 8) | b[i];
    char *hdr = strndup((char *)b + 8, h), *p = strstr(hdr, from);
    cr_assert(p, "'%s' not in header of %s", from, path);
    size_t nh = h - strlen(from) + strlen(to);
    unsigned char *o = malloc(8 + nh + (n - 8 - h));
    for (int i = 0; i < 8; i++) o[i] = (unsigned char)(nh >> (8 * i));
    memcpy(o + 8, hdr, (size_t)(p - hdr));
    memcpy(o + 8 + (p - hdr), to, strlen(to));
    memcpy(o + 8 + (p - hdr) + strlen(to), p + strlen(from), h - (size_t)(p - hdr) - strlen(from));
    memcpy(o + 8 + nh, b + 8 + h, n - 8 - h);
    spit(path, o, 8 + nh + (n - 8 - h));
    free(o);
    free(hdr);
    free(b);
}

/* Every run of the binary ends within this many seconds (timeout(1) exits
 * 124, which fails the test), so a hang on a hostile file is a failure,
 * not a stuck suite; generous for the sanitizer build. */
#define RUN_TIMEOUT 60

/* Runs the binary with args (redirections included); its exit code. */
static int run_status(const char *args) {
    const char *bin = getenv("RUN_BIN") ? getenv("RUN_BIN") : "./run";
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "timeout -k 5 %d %s %s </dev/null", RUN_TIMEOUT, bin, args);
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Runs the binary; expects exit code `code` and one stderr line starting
 * with "error: " that holds the given fragments. */
static void expect_fail(int code, const char *args, const char *frag1, const char *frag2) {
    const char *bin = getenv("RUN_BIN") ? getenv("RUN_BIN") : "./run";
    char cmd[2048], errpath[320];
    snprintf(errpath, sizeof errpath, "%s/stderr.txt", tmp);
    snprintf(cmd, sizeof cmd, "timeout -k 5 %d %s %s >/dev/null 2>'%s' </dev/null", RUN_TIMEOUT, bin, args, errpath);
    int st = system(cmd);
    size_t n;
    char *err = slurp(errpath, &n);
    cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == code, "%s: expected exit %d, got status %d; stderr: %s", args, code,
              st, err);
    /* exactly one error line; info lines (model, sampling, stats) may surround it */
    int lines = 0;
    const char *line = NULL;
    for (char *q = err; q && *q; q = strchr(q, '\n') ? strchr(q, '\n') + 1 : NULL)
        if (strncmp(q, "error: ", 7) == 0) { lines++; line = q; }
    cr_expect(lines == 1, "%s: expected one 'error:' line, found %d: %s", args, lines, err);
    if (!line) line = err;
    char *nl = strchr(line, '\n');
    if (nl) *nl = 0;
    cr_expect(strstr(line, frag1) != NULL, "%s: error line lacks '%s': %s", args, frag1, line);
    if (frag2) cr_expect(strstr(line, frag2) != NULL, "%s: error line lacks '%s': %s", args, frag2, line);
    free(err);
}

TestSuite(load, .init = setup, .fini = teardown);

Test(load, missing_directory) {
    expect_fail(1, "/nonexistent/model -i hi", "/nonexistent/model", NULL);
}

Test(load, missing_weights) {
    const char *d = copy_fixture("tiny");
    sh("rm '%s/model.safetensors'", d);
    char a[512];
    snprintf(a, sizeof a, "%s -i hi", d);
    expect_fail(1, a, "expected model.safetensors or model.safetensors.index.json", NULL);
}

Test(load, malformed_config) {
    const char *d = copy_fixture("tiny");
    char p[512], a[512];
    snprintf(p, sizeof p, "%s/config.json", d);
    replace_in(p, "\"hidden_size\": 64,", "\"hidden_size\": 64");
    snprintf(a, sizeof a, "%s -i hi", d);
    expect_fail(1, a, "config.json: malformed JSON", "byte");
}

Test(load, missing_config_key) {
    const char *d = copy_fixture("tiny");
    char p[512], a[512];
    snprintf(p, sizeof p, "%s/config.json", d);
    replace_in(p, "\"num_hidden_layers\": 2,", "");
    snprintf(a, sizeof a, "%s -i hi", d);
    expect_fail(1, a, "missing field 'num_hidden_layers'", NULL);
}

Test(load, wrong_config_type) {
    const char *d = copy_fixture("tiny");
    char p[512], a[512];
    snprintf(p, sizeof p, "%s/config.json", d);
    replace_in(p, "\"num_attention_heads\": 4", "\"num_attention_heads\": \"4\"");
    snprintf(a, sizeof a, "%s -i hi", d);
    expect_fail(1, a, "'num_attention_heads'", "string");
}

Test(load, unknown_architecture) {
    const char *d = copy_fixture("tiny");
    char p[512], a[512];
    snprintf(p, sizeof p, "%s/config.json", d);
    replace_in(p, "Qwen3ForCausalLM", "LlamaForCausalLM");
    snprintf(a, sizeof a, "%s -i hi", d);
    expect_fail(1, a, "expected Qwen3ForCausalLM", "LlamaForCausalLM");
}

Test(load, header_length_beyond_file) {
    const char *d = copy_fixture("tiny");
    char p[512], a[512];
    snprintf(p, sizeof p, "%s/model.safetensors", d);
    size_t n;
    unsigned char *b = (unsigned char *)slurp(p, &n);
    b[5] = 0x7f;
    spit(p, b, n);
    free(b);
    snprintf(a, sizeof a, "%s -i hi", d);
    expect_fail(1, a, "model.safetensors: header length", "exceeds the file");
}

Test(load, offsets_out_of_range) {
    const char *d = copy_fixture("tiny");
    char p[512], a[512];
    snprintf(p, sizeof p, "%s/model.safetensors", d);
    patch_header(p, "\"data_offsets\":[0,532480]", "\"data_offsets\":[99999999,100532480]");
    snprintf(a, sizeof a, "%s -i hi", d);
    expect_fail(1, a, "model.embed_tokens.weight", "outside the data section");
}

Test(load, overlapping_tensors) {
    const char *d = copy_fixture("tiny");
    char p[512], a[512];
    snprintf(p, sizeof p, "%s/model.safetensors", d);
    patch_header(p, "\"data_offsets\":[532480,532608]", "\"data_offsets\":[128,256]");
    snprintf(a, sizeof a, "%s -i hi", d);
    expect_fail(1, a, "overlap", "model.layers.0.input_layernorm.weight");
}

Test(load, unsupported_dtype) {
    const char *d = copy_fixture("tiny");
    char p[512], a[512];
    snprintf(p, sizeof p, "%s/model.safetensors", d);
    /* same byte count: 64 bf16 values = 128 int8 values, shape [128] would not match; keep shape, use I16 */
    patch_header(p, "\"model.layers.0.input_layernorm.weight\":{\"dtype\":\"BF16\"",
                 "\"model.layers.0.input_layernorm.weight\":{\"dtype\":\"I16\"");
    snprintf(a, sizeof a, "%s -i hi", d);
    expect_fail(1, a, "dtype I16 not supported", "input_layernorm");
}

/* -act bf16 names the first matrix it cannot run on bf16 inputs (here one
 * stored as F16: same bytes, other dtype), where the CPU has the
 * instruction; elsewhere it names the instruction. */
Test(load, bf16_inputs_need_bf16_matrices) {
    const char *d = copy_fixture("tiny");
    char p[512], a[512];
    snprintf(p, sizeof p, "%s/model.safetensors", d);
    /* the header keeps its length, so every tensor keeps its alignment */
    patch_header(p, "\"model.layers.1.self_attn.q_proj.weight\":{\"dtype\":\"BF16\"",
                 "\"model.layers.1.self_attn.q_proj.weight\":{\"dtype\": \"F16\"");
    snprintf(a, sizeof a, "%s -i hi -n 2 >/dev/null 2>&1", d);
    cr_expect_eq(run_status(a), 0, "an F16 matrix among BF16 ones loads with f32 inputs");
    snprintf(a, sizeof a, "%s -i hi -n 2 -act bf16", d);
    if (matmul_has_dpanels()) expect_fail(1, a, "bf16 activations: model.layers.1.self_attn.q_proj.weight is F16, expected BF16", NULL);
    else expect_fail(1, a, "need AVX-512 BF16", NULL);
}

Test(load, shape_mismatch) {
    const char *d = copy_fixture("tiny");
    char p[512], a[512];
    snprintf(p, sizeof p, "%s/config.json", d);
    replace_in(p, "\"intermediate_size\": 128", "\"intermediate_size\": 96");
    snprintf(a, sizeof a, "%s -i hi", d);
    expect_fail(1, a, "expected shape [96, 64]", "found [128, 64]");
}

/* A key given twice in config.json means its last value, as transformers
 * reads it (Python's json): the first order loads, the second is refused
 * by the tensor shapes of the value that counts. */
Test(load, repeated_config_keys_take_the_last) {
    const char *d = copy_fixture("tiny");
    char p[512], a[512];
    snprintf(p, sizeof p, "%s/config.json", d);
    replace_in(p, "\"intermediate_size\": 128", "\"intermediate_size\": 96, \"intermediate_size\": 128");
    snprintf(a, sizeof a, "%s -i hi -n 1 >/dev/null 2>&1", d);
    cr_expect_eq(run_status(a), 0, "the last intermediate_size (128) is the fixture's");
    replace_in(p, "\"intermediate_size\": 96, \"intermediate_size\": 128", "\"intermediate_size\": 128, \"intermediate_size\": 96");
    snprintf(a, sizeof a, "%s -i hi", d);
    expect_fail(1, a, "expected shape [96, 64]", "found [128, 64]");
}

/* A .safetensors file stands for its folder, so one the folder's model
 * does not read is refused rather than left unread; a single file of -m
 * pack that lost its config.json says so, naming the file. */
Test(load, named_files_are_the_ones_read) {
    const char *d = copy_fixture("tiny");
    char a[1024];
    sh("cp '%s/model.safetensors' '%s/other.safetensors'", d, d);
    snprintf(a, sizeof a, "%s/other.safetensors -i hi", d);
    expect_fail(1, a, "other.safetensors: expected one of its folder's checkpoint files", "name the folder");
    snprintf(a, sizeof a, "%s/model.safetensors -i hi -n 1 >/dev/null 2>&1", d);
    cr_expect_eq(run_status(a), 0, "the folder's own file loads");
    char packed[400];
    snprintf(packed, sizeof packed, "%s/tiny.bin", tmp);
    snprintf(a, sizeof a, "%s -m pack -o '%s' >/dev/null 2>&1", d, packed);
    cr_assert_eq(run_status(a), 0);
    /* the metadata key renamed in place: same length, the offsets stay valid */
    patch_header(packed, "\"config.json\"", "\"config.jsoX\"");
    snprintf(a, sizeof a, "'%s' -i hi", packed);
    expect_fail(1, a, "tiny.bin: a single-file model: expected config.json in its metadata", NULL);
}

/* Fewer layers in config.json than the checkpoint holds runs the first
 * ones (a truncated model, as transformers loads it) and says so. */
Test(load, layers_past_the_config_are_named) {
    const char *d = copy_fixture("tiny");
    char p[512], a[1024], ep[400];
    snprintf(p, sizeof p, "%s/config.json", d);
    replace_in(p, "\"num_hidden_layers\": 2", "\"num_hidden_layers\": 1");
    snprintf(ep, sizeof ep, "%s/stderr.txt", tmp);
    snprintf(a, sizeof a, "%s -i hi -n 1 >/dev/null 2>'%s'", d, ep);
    cr_expect_eq(run_status(a), 0);
    char *err = slurp(ep, NULL);
    cr_expect(strstr(err, "warning: ") && strstr(err, "the checkpoint holds 2 layers, config.json's num_hidden_layers "
                                                     "runs the first 1"), "%s", err);
    free(err);
}

/* Chat needs the template's special tokens; without them it stops at the
 * start, naming the token, rather than spelling the markers in pieces. */
Test(load, chat_needs_its_special_tokens) {
    const char *d = copy_fixture("tiny");
    char p[512], a[1024];
    snprintf(p, sizeof p, "%s/tokenizer.json", d);
    replace_in(p, "\"content\": \"<|im_start|>\"", "\"content\": \"<|im_strat|>\"");
    snprintf(a, sizeof a, "%s -m chat -i hi -n 1", d);
    expect_fail(1, a, "chat: ", "expected the special token <|im_start|> in the tokenizer");
    snprintf(a, sizeof a, "%s -i hi -n 1 >/dev/null 2>&1", d);
    cr_expect_eq(run_status(a), 0, "plain generation does not need them");
}

Test(load, vocab_smaller_than_tokenizer) {
    const char *d = copy_fixture("tiny");
    char p[512], a[512];
    snprintf(p, sizeof p, "%s/config.json", d);
    replace_in(p, "\"vocab_size\": 4160", "\"vocab_size\": 4000");
    snprintf(a, sizeof a, "%s -i hi", d);
    expect_fail(1, a, "vocab_size 4000 in config.json is smaller than the tokenizer's", NULL);
}

Test(load, truncated_shard) {
    const char *d = copy_fixture("small");
    sh("truncate -s 3000000 '%s/model-00002-of-00002.safetensors'", d);
    char a[512];
    snprintf(a, sizeof a, "%s -i hi", d);
    expect_fail(1, a, "model-00002-of-00002.safetensors", "truncated");
}

Test(load, index_names_missing_shard) {
    const char *d = copy_fixture("small");
    sh("rm '%s/model-00002-of-00002.safetensors'", d);
    char a[512];
    snprintf(a, sizeof a, "%s -i hi", d);
    expect_fail(1, a, "model.safetensors.index.json", "\"model-00002-of-00002.safetensors\", which is missing");
}

Test(load, missing_tensor) {
    const char *d = copy_fixture("tiny");
    char p[512], a[512];
    snprintf(p, sizeof p, "%s/model.safetensors", d);
    patch_header(p, "model.layers.1.mlp.up_proj.weight", "model.layers.1.mlp.up_prij.weight");
    snprintf(a, sizeof a, "%s -i hi", d);
    expect_fail(1, a, "missing tensor 'model.layers.1.mlp.up_proj.weight'", NULL);
}

Test(load, malformed_tokenizer) {
    const char *d = copy_fixture("tiny");
    char a[512];
    sh("head -c 1000 tests/data/fixtures/tiny/tokenizer.json > '%s/tokenizer.json'", d);
    snprintf(a, sizeof a, "%s -i hi", d);
    expect_fail(1, a, "tokenizer.json", NULL);
}

/* The hint names what limits the context: -c below the model's positions,
 * else max_position_embeddings, which -c cannot pass. */
Test(load, prompt_longer_than_context) {
    expect_fail(1, "tests/data/fixtures/tiny -c 5 -n 4 -i 'a prompt that is longer than five tokens for sure'",
                "does not fit the context of 5", "raise -c");
    const char *d = copy_fixture("tiny");
    char p[512], a[1024];
    snprintf(p, sizeof p, "%s/config.json", d);
    replace_in(p, "\"max_position_embeddings\": ", "\"max_position_embeddings\": 5, \"x\": ");
    snprintf(a, sizeof a, "%s -n 4 -i 'a prompt that is longer than five tokens for sure'", d);
    expect_fail(1, a, "does not fit the context of 5", "the model's max_position_embeddings");
    snprintf(a, sizeof a, "%s -m logits -o %s/l.bin -i 'a prompt that is longer than five tokens for sure'", d, tmp);
    expect_fail(1, a, "does not fit the context of 5", "the model's max_position_embeddings");
}

Test(load, usage_errors_exit_2) {
    expect_fail(2, "tests/data/fixtures/tiny -n -3", "-n", NULL);
    expect_fail(2, "tests/data/fixtures/tiny -kv nope", "unknown scheme 'nope'", NULL);
    expect_fail(2, "tests/data/fixtures/tiny -m nope", "-m", NULL);
    expect_fail(2, "tests/data/fixtures/tiny -zz 1", "unknown option '-zz'", NULL);
    expect_fail(2, "tests/data/fixtures/tiny -m logits -i hi", "-o", NULL);
}

/* Random byte and token mutations of headers and configs; model_load must
 * return (0 or -1), never crash, hang or read out of bounds. */
Test(load, fuzz_headers_and_configs) {
    const char *d = copy_fixture("tiny");
    char p[512], c[512], err[512];
    snprintf(p, sizeof p, "%s/model.safetensors", d);
    snprintf(c, sizeof c, "%s/config.json", d);
    size_t n, cn;
    unsigned char *orig = (unsigned char *)slurp(p, &n);
    char *corig = slurp(c, &cn);
    unsigned long long h = 0;
    for (int i = 7; i >= 0; i--) h = (h << 8) | orig[i];
    unsigned long long r = 12345;
    int loaded = 0, failed = 0;
    for (int it = 0; it < 300; it++) {
        unsigned char *b = malloc(n);
        memcpy(b, orig, n);
        char *cb = strdup(corig);
        int k = 1 + (int)(it % 4);
        for (int j = 0; j < k; j++) {
            r = r * 6364136223846793005ULL + 1442695040888963407ULL;
            size_t at = (size_t)(r >> 33);
            const char pool[] = "{}[]\",:0123456789-eE. \\u";
            if (it % 3 == 0) cb[at % cn] = pool[(r >> 20) % (sizeof pool - 1)];
            else b[at % (8 + h)] = (it % 3 == 1) ? (unsigned char)pool[(r >> 20) % (sizeof pool - 1)] : (unsigned char)(r >> 24);
        }
        spit(p, b, n);
        spit(c, cb, cn);
        Model m;
        if (model_load(&m, d, 0, err, sizeof err) == 0) {
            loaded++;
            model_free(&m);
        } else {
            failed++;
            cr_expect(strlen(err) > 0 && strchr(err, '\n') == NULL, "fuzz %d: empty or multi-line error '%s'", it, err);
        }
        free(b);
        free(cb);
    }
    cr_expect(failed > 100, "fuzzing should break most loads (loaded %d, failed %d)", loaded, failed);
    free(orig);
    free(corig);
}

/* ---- hostile folders: each class of bad input gets one error line, exit 1 ---- */

/* A folder whose file `name` is replaced by a special file: each is refused
 * before it is read (a FIFO no longer blocks the load; /dev/zero no longer
 * streams forever). The socket is made by a child that binds it. */
Test(load, special_files_are_refused_not_read) {
    struct { const char *fixture, *file, *make, *kind; } cases[] = {
        {"tiny", "tokenizer.json", "mkfifo", "a FIFO"},
        {"tiny", "config.json", "mkdir", "a directory"},
        {"tiny", "model.safetensors", "ln -s /dev/zero", "a character device"},
        {"tiny", "generation_config.json", "mkfifo", "a FIFO"},
        {"tiny", "tokenizer_config.json", "python3 -c 'import socket,sys; socket.socket(socket.AF_UNIX).bind(sys.argv[1])'",
         "a socket"},
        {"small", "model-00002-of-00002.safetensors", "mkfifo", "a FIFO"},
        {"small", "model.safetensors.index.json", "ln -s /dev/urandom", "a character device"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const char *d = copy_fixture(cases[i].fixture);
        char a[512];
        sh("rm -f '%s/%s' && %s '%s/%s'", d, cases[i].file, cases[i].make, d, cases[i].file);
        snprintf(a, sizeof a, "%s -i hi -n 2", d);
        char frag[256];
        snprintf(frag, sizeof frag, "%s: expected a regular file, found %s", cases[i].file, cases[i].kind);
        expect_fail(1, a, frag, NULL);
        sh("rm -rf '%s'", d);
    }
}

/* JSON files have size caps: a config of 5 MB is refused before parsing. */
Test(load, json_files_have_size_caps) {
    const char *d = copy_fixture("tiny");
    char a[512];
    sh("truncate -s 5M '%s/config.json'", d);
    snprintf(a, sizeof a, "%s -i hi", d);
    expect_fail(1, a, "config.json: expected at most 4 MiB, found 5242880 bytes", NULL);
}

/* -f reads pipes and devices too, up to a cap. */
Test(load, prompt_files_may_be_pipes_within_a_cap) {
    const char *bin = getenv("RUN_BIN") ? getenv("RUN_BIN") : "./run";
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "bash -c \"printf 'In the beginning' | timeout 60 %s tests/data/fixtures/tiny -m tokenize "
             "-f /dev/stdin\" > '%s/ids.txt' 2>/dev/null", bin, tmp);
    cr_expect_eq(system(cmd), 0, "a pipe as -f");
    size_t n;
    char ids[300];
    snprintf(ids, sizeof ids, "%s/ids.txt", tmp);
    char *out = slurp(ids, &n);
    cr_expect(n > 2 && out[0] >= '0' && out[0] <= '9', "ids printed: %s", out);
    free(out);
    expect_fail(1, "tests/data/fixtures/tiny -f /dev/zero", "-f /dev/zero: expected at most 64 MiB, found more", NULL);
    expect_fail(1, "tests/data/fixtures/tiny -f tests", "-f tests: expected a file, found a directory", NULL);
}

/* Strings in error lines are bounded and printable: an eos_token of 5000
 * continuation bytes (which overflowed a 200-byte buffer) and a vocab key
 * of them are quoted, cut and escaped. */
Test(load, long_strings_in_errors_are_cut_and_escaped) {
    const char *d = copy_fixture("tiny");
    char p[512], a[512], *junk = malloc(5001);
    memset(junk, 0x80, 5000);
    junk[5000] = 0;
    snprintf(p, sizeof p, "%s/tokenizer_config.json", d);
    replace_in(p, "\"eos_token\": \"<|im_end|>\"", "\"eos_token\": \"");
    replace_in(p, "\"eos_token\": \"", "\"eos_token\": \"@@@\"");
    replace_in(p, "@@@", junk);
    snprintf(a, sizeof a, "%s -i hi", d);
    expect_fail(1, a, "tokenizer_config.json: eos_token: expected a token of tokenizer.json, found \"\\x80\\x80", "...\"");
    char errpath[320];
    snprintf(errpath, sizeof errpath, "%s/stderr.txt", tmp);
    size_t n;
    char *err = slurp(errpath, &n);
    cr_expect(n < 400, "error line of %zu bytes", n);
    free(err);

    sh("cp tests/data/fixtures/tiny/tokenizer_config.json '%s'", p);
    snprintf(p, sizeof p, "%s/tokenizer.json", d);
    char key[5100];
    snprintf(key, sizeof key, "\"vocab\": {\"%s\": 4159, ", junk);
    replace_in(p, "\"vocab\": {", key);
    expect_fail(1, a, "tokenizer.json: model.vocab[\"\\x80\\x80", "expected GPT-2 byte-level characters");
    free(junk);
}

/* Sets element idx of tensor name in a safetensors file to the raw bits
 * (bf16 or f32, as the tensor is stored). */
static void poke(const char *path, const char *name, size_t idx, unsigned bits) {
    size_t n;
    unsigned char *b = (unsigned char *)slurp(path, &n);
    unsigned long long h = 0;
    for (int i = 7; i >= 0; i--) h = (h << 8) | b[i];
    char err[256];
    Json *j = json_parse((char *)b + 8, h, err, sizeof err);
    cr_assert(j, "%s", err);
    const Json *t = json_get(j, name);
    cr_assert(t, "no tensor %s", name);
    int f32 = strcmp(json_get_str(t, "dtype"), "F32") == 0;
    size_t off = 8 + h + (size_t)json_at(json_get(t, "data_offsets"), 0)->number + idx * (f32 ? 4 : 2);
    unsigned v = f32 ? bits << 16 : bits;
    for (int i = 0; i < (f32 ? 4 : 2); i++) b[off + i] = (unsigned char)(v >> (8 * i));
    spit(path, b, n);
    json_free(j);
    free(b);
}

/* A NaN or an infinity in the weights ends every mode with an error naming
 * the tensor, instead of printing token 0 (or "ppl nan") and exiting 0. */
Test(load, non_finite_weights_are_named) {
    const char *d = copy_fixture("tiny");
    char p[512], a[1024];
    snprintf(p, sizeof p, "%s/model.safetensors", d);
    poke(p, "model.layers.0.mlp.down_proj.weight", 5, 0x7FC0);
    const char *modes[] = {"-i hi -n 4", "-m ppl -i 'some words to score'", "-m logits -i hi -o /dev/null",
                           "-m compare -kv f16 -i hi -n 2"};
    for (int i = 0; i < 4; i++) {
        snprintf(a, sizeof a, "%s %s", d, modes[i]);
        expect_fail(1, a, "non-finite values at position 0: tensor \"model.layers.0.mlp.down_proj.weight\"",
                    "holds a NaN or an infinity");
    }
    /* a failed -m logits leaves the file it was to write as it was, and no partial one beside it */
    sh("printf keep > '%s/old.bin'", d);
    snprintf(a, sizeof a, "%s -m logits -i hi -o %s/old.bin", d, d);
    expect_fail(1, a, "non-finite values at position 0", NULL);
    char path[600];
    snprintf(path, sizeof path, "%s/old.bin", d);
    char *kept = slurp(path, NULL);
    cr_expect_str_eq(kept, "keep", "a failed -m logits changed its -o file");
    free(kept);
    sh("test -z \"$(ls '%s' | grep old.bin.tmp)\"", d); /* no partial logits file left behind */
    snprintf(a, sizeof a, "%s -i hi -n 4 -wq q8", d);
    expect_fail(1, a, "q8 weights: model.layers.0.mlp.down_proj.weight holds a NaN or an infinity", NULL);
    /* an infinity in an embedding row the prompt looks up (tied: the lm_head too) */
    sh("cp tests/data/fixtures/tiny/model.safetensors '%s'", p);
    poke(p, "model.embed_tokens.weight", 64 * 4096 + 3, 0x7F80);
    snprintf(a, sizeof a, "%s -i '<|endoftext|>' -n 2 -wq-draft stored", d);
    expect_fail(1, a, "tensor \"model.embed_tokens.weight\"", "holds a NaN or an infinity");
    /* norms are read whole at load, and checked there */
    sh("cp tests/data/fixtures/tiny/model.safetensors '%s'", p);
    poke(p, "model.layers.1.post_attention_layernorm.weight", 7, 0xFF80);
    snprintf(a, sizeof a, "%s -i hi", d);
    expect_fail(1, a, "tensor 'model.layers.1.post_attention_layernorm.weight': element 7 is infinite", NULL);
}

/* Config values the model cannot have are errors naming the field, not
 * replaced by a default. */
Test(load, impossible_config_values_name_their_field) {
    struct { const char *from, *to, *frag; } cases[] = {
        {"\"max_position_embeddings\": 40960", "\"max_position_embeddings\": 0", "field 'max_position_embeddings'"},
        {"\"max_position_embeddings\": 40960", "\"max_position_embeddings\": -5", "found -5"},
        {"\"max_position_embeddings\": 40960", "\"max_position_embeddings\": 1.5", "found 1.5"},
        {"\"tie_word_embeddings\": true", "\"tie_word_embeddings\": \"yes\"", "'tie_word_embeddings': expected true or false"},
        {"\"bos_token_id\": 4096", "\"bos_token_id\": -1", "field 'bos_token_id'"},
        {"\"rope_theta\": 1000000", "\"rope_theta\": 0.5", "field 'rope_theta': expected a number in (1, 1e12], found 0.5"},
        {"\"head_dim\": 32", "\"head_dim\": 31", "head_dim: expected an even number"},
        {"\"rms_norm_eps\": 1e-06", "\"rms_norm_eps\": -1", "'rms_norm_eps'"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const char *d = copy_fixture("tiny");
        char p[512], a[512];
        snprintf(p, sizeof p, "%s/config.json", d);
        replace_in(p, cases[i].from, cases[i].to);
        snprintf(a, sizeof a, "%s -i hi", d);
        expect_fail(1, a, "config.json: ", cases[i].frag);
        sh("rm -rf '%s'", d);
    }
}

/* An explicit -c above the model's positions is capped, with a warning,
 * like the default. */
Test(load, context_above_the_model_is_capped) {
    const char *d = copy_fixture("tiny");
    char p[512], a[1024];
    snprintf(p, sizeof p, "%s/config.json", d);
    replace_in(p, "\"max_position_embeddings\": 40960", "\"max_position_embeddings\": 64");
    snprintf(a, sizeof a, "%s -i hi -n 2 -c 100000 -t 0 >/dev/null 2>'%s/err.txt'", d, tmp);
    cr_expect_eq(run_status(a), 0);
    size_t n;
    char ep[320];
    snprintf(ep, sizeof ep, "%s/err.txt", tmp);
    char *err = slurp(ep, &n);
    cr_expect(strstr(err, "warning: -c 100000 is above the model's 64 positions"), "%s", err);
    cr_expect(strstr(err, "context 64,"), "%s", err);
    free(err);
}

/* Numbers parse strictly: no blanks, signs, hex or nan slip through. */
Test(load, numeric_flags_parse_strictly) {
    const char *bad[][2] = {{"-s", "' -1'"}, {"-s", "-1"}, {"-s", "+5"}, {"-n", "' 5'"}, {"-c", "0x40"},
                            {"-t", "nan"},   {"-t", "' 0.5'"}, {"-p", "inf"}, {"-T", "2x"}, {"-k", "''"}};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char a[256];
        snprintf(a, sizeof a, "tests/data/fixtures/tiny -i hi %s %s", bad[i][0], bad[i][1]);
        expect_fail(2, a, bad[i][0], "expected");
    }
}
