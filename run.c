/* run.c: the command line and the generation loops, nothing else.
 *
 *   ./run [MODEL] [options]        (see usage() or README.md)
 *
 * Opens a model (a Hugging Face Qwen3 folder or a single-file model:
 * model/source.h), tokenizes (tokenizer/), runs the forward pass over a KV
 * cache in the chosen scheme (model/, kv/), samples (sample/), and prints
 * text on stdout; progress, a human summary and one machine-readable
 * `stats:` line go to stderr. Exit codes: 0 ok, 1 runtime error, 2 usage
 * error, 130 interrupted (Ctrl-C).
 *
 * main() is a list of steps: parse the options, open the model and its
 * tokenizer, read the text, then one function per mode.
 */
#include <errno.h>
#include <math.h>
#include <omp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "eval/compare.h"
#include "format/file.h"
#include "format/quote.h"
#include "kernels/cuda.h"
#include "kv/kvfile.h"
#include "model/gpu.h"
#include "model/model.h"
#include "sample/sampler.h"
#include "speculative/speculative.h"
#include "tokenizer/chat.h"
#include "tokenizer/tokenizer.h"
#ifdef USE_SERVE
#include "serve/serve.h"
#endif

/* Texts (-f, a chat message) longer than this are refused: 64 MiB is over
 * 10 M tokens, past any context. */
#define MAX_TEXT_BYTES (64u << 20)

/* Prompt tokens per forward call: progress shows between them. */
#define PREFILL_SLICE 512

/* The model run with no MODEL, relative to the executable's directory. */
#define DEFAULT_MODEL "models/qwen3-kjv-mtp"
#define DEFAULT_PROMPT "In the beginning"
#ifndef RUN_VERSION
#define RUN_VERSION "unknown"
#endif

/* ------------------------------------------------------------- options */

typedef struct {
    const char *model, *prompt, *prompt_file, *mode, *system, *kv, *ctk, *ctv, *out, *dev, *host;
    const char *wmem;     /* -wmem: auto, map or copy (NULL: auto) */
    const char *api_key;  /* serve: --api-key, else $RUN_API_KEY */
    const char *session;  /* chat: --session, the conversation's file */
    int n, top_k, ctx, threads, think, spec; /* n: -1 = no limit; spec: -1 = default */
    int wq_q8, draft_q8;  /* -wq, -wq-draft: 1 = q8 */
    int act_bf16;         /* -act: 1 = bf16 */
    int show_pieces;      /* tokenize: one token per line with its text */
    float temp, top_p, min_p;
    float repeat, frequency, presence; /* penalties over the last repeat_n tokens */
    int repeat_n;
    int port, parallel, queue, kv_mb; /* serve */
    int cache_mb, cache_chunk;        /* serve's prefix cache: -1 and 0 when not given */
    const char *cache_dir;
    unsigned long long seed;
    /* which options were given (the rest fall back to generation_config.json or defaults) */
    int set_temp, set_top_p, set_top_k, set_min_p, set_seed, set_n, set_kv;
} Args;

/* What an option's value is. */
typedef enum { OPT_STR, OPT_INT, OPT_FLOAT, OPT_SEED, OPT_CHOICE, OPT_BOOL } OptKind;

/* One option: up to three spellings (run's, then llama.cpp's), where its
 * value goes in Args, and what the value may be. */
typedef struct {
    const char *names[3];
    OptKind kind;
    size_t at, set;       /* offsetof the value, and of its set_ flag (0: none) */
    double lo, hi;        /* OPT_INT, OPT_FLOAT range */
    const char *expect;   /* what the error line says was expected */
} Option;

#define AT(f) offsetof(Args, f)
static const Option options[] = {
    {{"--model"}, OPT_STR, AT(model), 0, 0, 0, "a model folder or file"},
    {{"-m", "--mode"}, OPT_STR, AT(mode), 0, 0, 0, "a mode"},
    {{"-i", "--prompt"}, OPT_STR, AT(prompt), 0, 0, 0, "a text"},
    {{"-f", "--file"}, OPT_STR, AT(prompt_file), 0, 0, 0, "a file"},
    {{"-y", "--system-prompt"}, OPT_STR, AT(system), 0, 0, 0, "a text"},
    {{"--session"}, OPT_STR, AT(session), 0, 0, 0, "a file"},
    {{"-kv"}, OPT_STR, AT(kv), AT(set_kv), 0, 0, "a KV scheme"},
    {{"-ctk", "--cache-type-k"}, OPT_STR, AT(ctk), 0, 0, 0, "a KV scheme"},
    {{"-ctv", "--cache-type-v"}, OPT_STR, AT(ctv), 0, 0, 0, "a KV scheme"},
    {{"-o", "--output"}, OPT_STR, AT(out), 0, 0, 0, "a file"},
    {{"-n", "--n-predict"}, OPT_INT, AT(n), AT(set_n), -1, 1 << 30, "a token count >= 0, or -1 for no limit"},
    {{"-c", "--ctx-size"}, OPT_INT, AT(ctx), 0, 1, 1 << 24, "a context length >= 1"},
    {{"-T", "--threads"}, OPT_INT, AT(threads), 0, 1, 1024, "a thread count in 1..1024"},
    {{"-k", "--top-k"}, OPT_INT, AT(top_k), AT(set_top_k), 0, 1 << 30, "an integer >= 0"},
    {{"-spec", "--draft"}, OPT_INT, AT(spec), 0, 0, SPEC_MAX, "a draft count in 0..16"},
    {{"-think"}, OPT_INT, AT(think), 0, 0, 1, "0 or 1"},
    {{"--repeat-last-n"}, OPT_INT, AT(repeat_n), 0, 0, 1 << 20, "a window of tokens >= 0"},
    {{"-t", "--temp"}, OPT_FLOAT, AT(temp), AT(set_temp), 0, 100, "a temperature in [0, 100]"},
    {{"-p", "--top-p"}, OPT_FLOAT, AT(top_p), AT(set_top_p), 1e-9, 1, "top-p in (0, 1]"},
    {{"-mp", "--min-p"}, OPT_FLOAT, AT(min_p), AT(set_min_p), 0, 1, "min-p in [0, 1]"},
    {{"--repeat-penalty"}, OPT_FLOAT, AT(repeat), 0, 1e-3, 100, "a penalty in [0.001, 100] (1 = off)"},
    {{"--frequency-penalty"}, OPT_FLOAT, AT(frequency), 0, 0, 100, "a penalty in [0, 100] (0 = off)"},
    {{"--presence-penalty"}, OPT_FLOAT, AT(presence), 0, 0, 100, "a penalty in [0, 100] (0 = off)"},
    {{"-s", "--seed"}, OPT_SEED, AT(seed), AT(set_seed), 0, 0, "a seed >= 0"},
    {{"-wq"}, OPT_CHOICE, AT(wq_q8), 0, 0, 0, "stored or q8"},
    {{"-wq-draft"}, OPT_CHOICE, AT(draft_q8), 0, 0, 0, "stored or q8"},
    {{"-act"}, OPT_CHOICE, AT(act_bf16), 0, 0, 0, "f32 or bf16"},
    {{"-dev", "--device"}, OPT_STR, AT(dev), 0, 0, 0, "cpu, cuda or auto"},
    {{"-wmem"}, OPT_STR, AT(wmem), 0, 0, 0, "auto, map or copy"},
    {{"--show-pieces"}, OPT_BOOL, AT(show_pieces), 0, 0, 0, NULL},
    {{"--host"}, OPT_STR, AT(host), 0, 0, 0, "an address"},
    {{"--port"}, OPT_INT, AT(port), 0, 0, 65535, "a port in 0..65535"},
    {{"-np", "--parallel"}, OPT_INT, AT(parallel), 0, 1, 256, "a sequence count in 1..256"},
    {{"--queue"}, OPT_INT, AT(queue), 0, 0, 1 << 20, "a request count >= 0"},
    {{"--kv-mb"}, OPT_INT, AT(kv_mb), 0, 1, 1 << 30, "megabytes >= 1"},
    {{"--api-key"}, OPT_STR, AT(api_key), 0, 0, 0, "a key"},
    {{"--cache-mb"}, OPT_INT, AT(cache_mb), 0, 0, 1 << 30, "megabytes >= 0"},
    {{"--cache-chunk"}, OPT_INT, AT(cache_chunk), 0, 16, 65536, "positions in 16..65536, a multiple of 16"},
    {{"--cache-dir"}, OPT_STR, AT(cache_dir), 0, 0, 0, "a folder"},
};

static const char *const modes[] = {"generate", "chat", "tokenize", "detokenize", "logits", "ppl",
                                    "compare",  "kvstats", "pack",
#ifdef USE_SERVE
                                    "serve"
#endif
};

static void usage(FILE *f) {
    fprintf(f,
            "usage: ./run [MODEL] [options]\n"
            "  MODEL            a Hugging Face Qwen3 or Qwen3.5 folder (config.json, *.safetensors,\n"
            "                   tokenizer.json), a .safetensors file in one, or a single-file model (-m\n"
            "                   pack); anywhere among the options, or as --model MODEL; default:\n"
            "                   " DEFAULT_MODEL " beside ./run\n"
            "  -m MODE          generate (default) | chat | tokenize | detokenize | logits | ppl | compare |\n"
#ifdef USE_SERVE
            "                   kvstats | pack | serve                                     (--mode)\n"
#else
            "                   kvstats | pack                                             (--mode)\n"
#endif
            "  -i TEXT          prompt; chat: the first message; detokenize: token ids     (--prompt)\n"
            "  -f FILE          the same from a file (a pipe or /dev/stdin works)          (--file)\n"
            "  -n N             tokens to generate, -1 = until the end of text (default 256; chat: per\n"
            "                   reply; compare: greedy tokens per scheme, 64)              (--n-predict)\n"
            "  -c N             context length (default 4096, ppl 512; capped by the model) (--ctx-size)\n"
            "  -t T             temperature, 0 = greedy                                    (--temp)\n"
            "  -k K             top-k, 0 = off                                             (--top-k)\n"
            "  -p P             top-p                                                      (--top-p)\n"
            "  -mp P            min-p, 0 = off                                             (--min-p)\n"
            "                   sampling defaults: generation_config.json, else 0.8, 40, 0.95, 0.05\n"
            "  --repeat-penalty R, --frequency-penalty F, --presence-penalty P, --repeat-last-n N\n"
            "                   llama.cpp's penalties over the last N tokens (default 64; off: 1, 0, 0)\n"
            "  -s SEED          random seed (default: from the clock, printed)             (--seed)\n"
            "  -T N             threads (default: all cores)                               (--threads)\n"
            "  -kv SCHEME       KV cache storage: a scheme for K and V, or K/V (default f16)\n"
            "  -ctk S, -ctv S   the K or the V scheme alone; llama.cpp's names f16, q8_0, q4_0 work too\n"
            "                   (--cache-type-k, --cache-type-v). A comma separates schemes to compare:\n"
            "                   -m compare -kv f16,q8,q8/q4 (default: every scheme, every one the GPU\n"
            "                   takes under -dev cuda); elsewhere it is an error\n"
            "  -y TEXT          system prompt (chat)                                       (--system-prompt)\n"
            "  -think 0|1       chat: let the model think (default 1)\n"
            "  --session FILE   chat: its KV cache and turns are read from FILE when it exists, and\n"
            "                   written there when the chat ends: the chat continues across runs\n"
            "  -spec N          speculative decoding with the model's MTP head, N drafts per step\n"
            "                   (default 3 when the model has one; 0 = off)                (--draft)\n"
            "  -wq TYPE         matmul weights: stored (default) | q8 (converted at load to q8_0 blocks:\n"
            "                   9/16 of bf16's bytes); compare: the f32 reference keeps the stored ones\n"
            "  -act TYPE        matmul inputs: f32 (default, exact) | bf16 (rounded for AVX-512 BF16's\n"
            "                   vdpbf16ps or Arm's bfmlalb/t, like llama.cpp's bf16 path: prefill about\n"
            "                   2x on AMD Zen 4, logits move by about 0.5%%; a bf16 model read into\n"
            "                   memory needed)\n"
            "  -wq-draft TYPE   the MTP drafter's weights: q8 (default) | stored; greedy output is the same\n"
            "  -dev DEVICE      cpu | cuda (the whole forward, the cache and sampling on GPU 0; -kv\n"
            "                   f32, f16, q8, q4, q4h, tbq4/3/2, lm3 or polar4; -wq stored or q8;\n"
            "                   every mode but serve: kvstats and compare -wq q8 not yet run on a GPU) |\n"
            "                   auto (default: cuda when this binary has it, a GPU is there and the\n"
            "                   run is one it takes, else cpu) (--device)\n"
            "  -wmem MODE       on the GPU, where it reads the weight matrices: map (where the checkpoint\n"
            "                   is mapped: no device copy, the same logits as copy; read over PCIe on a\n"
            "                   discrete card, so slow there) | copy (uploaded once into device memory) |\n"
            "                   auto (default: map on a GPU that shares the system's memory, GB10 or\n"
            "                   Thor; copy elsewhere, GH200's HBM included)\n"
            "  -o FILE          logits: float32 [tokens, vocab]; compare: .svg, .csv or .json; pack: the\n"
            "                   single file                                                (--output)\n"
            "  --show-pieces    tokenize: one token per line, id and text\n"
#ifdef USE_SERVE
            "  serve: an OpenAI-compatible HTTP server (POST /v1/chat/completions, /v1/completions;\n"
            "  GET /v1/models, /health, /metrics; docs/serve.md), every request's sequence in one batched\n"
            "  forward per step, on the CPU; -c is each sequence's context, -n its max_tokens when a\n"
            "  request gives none, -kv its scheme when a request's \"kv\" names none\n"
            "  --host ADDR      address to listen on (default 127.0.0.1)\n"
            "  --port N         port (default 8080; 0: any free one, named on stderr)\n"
            "  -np N            sequences computed at once (default 4)                     (--parallel)\n"
            "  --queue N        requests waiting for a sequence at most, past it 503 (default 64)\n"
            "  --kv-mb N        megabytes all sequences' caches may take (default: -np caches of -c\n"
            "                   positions in the -kv scheme)\n"
            "  --api-key KEY    /v1/ requests must carry Authorization: Bearer KEY, else 401; /health\n"
            "                   and /metrics stay open (default: $RUN_API_KEY, else no key)\n"
            "  --cache-mb N     megabytes of prompt KV kept for exact prefix reuse (default 1024, 0 = off)\n"
            "  --cache-chunk N  positions per reused chunk, a multiple of 16 (default 64; hybrid 256)\n"
            "  --cache-dir DIR  chunks leaving memory, and all at exit, are written to DIR and read back\n"
            "                   from it, across restarts (default: none)\n"
#endif
            "  -h, --help       this help;  --version  the version, the kernels this CPU runs and the\n"
            "                   CUDA architectures compiled in\n"
            "KV schemes (bits per value at head_dim 128):\n");
    KVOpts o = {0, 0};
    for (int i = 0; i < kv_n_schemes; i++)
        fprintf(f, "  %-8s %6.3f  %s\n", kv_schemes[i]->name, kv_schemes[i]->bits(128, &o), kv_schemes[i]->desc);
    fprintf(f, "environment: RUN_ISA=ref|avx2|avx512|avx512vnni (x86-64) or ref|neon|dotprod (aarch64)\n"
               "  forces a lower kernel level; RUN_MMAP=1 reads the weights where the files are mapped\n"
               "  instead of copying them into memory in huge pages\n"
               "  (where the AVX-512 kernels get bf16 relaid in 32-row panels, their faster layout);\n"
               "  RUN_CUDA_GRAPHS=0 launches a GPU step's kernels one by one instead of as a CUDA graph;\n"
               "  RUN_CUDA_PDL=0 launches them without programmatic dependent launch (Hopper and later)\n");
    fprintf(f, "exit codes: 0 ok, 1 runtime error, 2 usage error, 130 interrupted\n");
}

static int usage_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "error: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, " (see ./run -h)\n");
    va_end(ap);
    return 2;
}

/* Numbers on the command line are digits only: strtol and strtof would
 * also take leading blanks, a sign, "nan" or hex, so " -1" could slip past
 * a range check. Only -n takes a negative number, -1. */
static int is_number(const char *s) {
    if (!(*s >= '0' && *s <= '9') && !(*s == '.' && s[1] >= '0' && s[1] <= '9')) return 0;
    for (; *s; s++)
        if (!((*s >= '0' && *s <= '9') || *s == '.' || *s == 'e' || *s == 'E' || *s == '-' || *s == '+')) return 0;
    return 1;
}

/* Stores v as option o's value; 0 ok, else the usage error's exit code. */
static int set_option(Args *a, const Option *o, const char *name, const char *v) {
    char *p = (char *)a + o->at, *end;
    errno = 0;
    if (o->kind == OPT_STR) *(const char **)p = v;
    else if (o->kind == OPT_INT) {
        long l = -1;
        int ok = strcmp(v, "-1") == 0 || (is_number(v) && (l = strtol(v, &end, 10), !errno && !*end));
        if (!ok || l < o->lo || l > o->hi) return usage_error("%s: expected %s, found '%s'", name, o->expect, v);
        *(int *)p = (int)l;
    } else if (o->kind == OPT_FLOAT) {
        float x = NAN;
        int ok = is_number(v) && (x = strtof(v, &end), !errno && !*end);
        if (!ok || !(x >= o->lo && x <= o->hi)) return usage_error("%s: expected %s, found '%s'", name, o->expect, v);
        *(float *)p = x;
    } else if (o->kind == OPT_SEED) {
        unsigned long long s = 0;
        int ok = is_number(v) && (s = strtoull(v, &end, 10), !errno && !*end);
        if (!ok) return usage_error("%s: expected %s, found '%s'", name, o->expect, v);
        *(unsigned long long *)p = s;
    } else {
        /* choices: the first of each pair is 0, the second 1 */
        const char *zero = o->at == AT(act_bf16) ? "f32" : "stored", *one = o->at == AT(act_bf16) ? "bf16" : "q8";
        if (strcmp(v, zero) && strcmp(v, one)) return usage_error("%s: expected %s, found '%s'", name, o->expect, v);
        *(int *)p = strcmp(v, one) == 0;
    }
    if (o->set) *(int *)((char *)a + o->set) = 1;
    return 0;
}

static const Option *find_option(const char *name) {
    for (size_t i = 0; i < sizeof options / sizeof *options; i++)
        for (int k = 0; k < 3 && options[i].names[k]; k++)
            if (strcmp(options[i].names[k], name) == 0) return &options[i];
    return NULL;
}

/* Checks what the options mean together; 0 or the usage error's code. */
static int check_args(Args *a) {
    int ok = 0;
    for (size_t k = 0; k < sizeof modes / sizeof *modes; k++) ok |= strcmp(a->mode, modes[k]) == 0;
#ifdef USE_SERVE
    if (!ok)
        return usage_error("-m: expected generate, chat, tokenize, detokenize, logits, ppl, compare, kvstats, pack "
                           "or serve, found '%s'", a->mode);
#else
    if (!ok && !strcmp(a->mode, "serve"))
        return usage_error("-m serve: this ./run was built without libmicrohttpd (apt-get install "
                           "libmicrohttpd-dev, then make)");
    if (!ok)
        return usage_error("-m: expected generate, chat, tokenize, detokenize, logits, ppl, compare, kvstats or "
                           "pack, found '%s'", a->mode);
#endif
    const int serve = !strcmp(a->mode, "serve");
    if (serve && (a->prompt || a->prompt_file))
        return usage_error("-m serve takes its prompts from requests: not -i or -f");
    if (serve && a->spec > 0)
        return usage_error("-m serve: -spec %d: the server does not draft (yet); drop -spec", a->spec);
    if (!serve && (a->host || a->port >= 0 || a->parallel || a->queue >= 0 || a->kv_mb || a->api_key ||
                   a->cache_mb >= 0 || a->cache_chunk || a->cache_dir))
        return usage_error("--host, --port, -np, --queue, --kv-mb, --api-key and --cache-* are for -m serve");
    if (a->cache_chunk % 16) return usage_error("--cache-chunk: expected a multiple of 16, found %d", a->cache_chunk);
    if (a->cache_mb == 0 && a->cache_dir) return usage_error("--cache-dir: the prefix cache is off (--cache-mb 0)");
    /* the environment keeps the key out of the process list; an empty or
     * unsendable key is refused rather than taken as no key or as one no
     * client can send, and the key itself is never printed */
    const char *key_from = a->api_key ? "--api-key" : "RUN_API_KEY";
    if (serve && !a->api_key) a->api_key = getenv("RUN_API_KEY");
    if (a->api_key && !a->api_key[0]) return usage_error("%s: expected a key, found an empty one", key_from);
    for (const char *k = a->api_key; k && *k; k++)
        if ((unsigned char)*k < 0x21 || (unsigned char)*k > 0x7e)
            return usage_error("%s: expected printable ASCII without spaces, as a header carries it", key_from);
    const int compare = !strcmp(a->mode, "compare");
    if (a->prompt && a->prompt_file) return usage_error("give the text with -i or -f, not both");
    int scores = compare || !strcmp(a->mode, "logits") || !strcmp(a->mode, "ppl") || !strcmp(a->mode, "kvstats") ||
                 !strcmp(a->mode, "detokenize");
    if (scores && !a->prompt && !a->prompt_file) return usage_error("-m %s needs a text (-f FILE or -i TEXT)", a->mode);
    if ((!strcmp(a->mode, "logits") || !strcmp(a->mode, "pack")) && !a->out)
        return usage_error("-m %s needs -o FILE", a->mode);
    char e[600];
    if (compare && a->out && compare_format(a->out, e, sizeof e) < 0) return usage_error("-o %s", e);
    if (a->act_bf16 && a->wq_q8) return usage_error("-act bf16 runs on bf16 weights as stored: not with -wq q8");
    if (!compare && a->kv && strchr(a->kv, ','))
        return usage_error("-kv %s: a comma separates schemes to compare (-m compare); one cache takes one scheme, "
                           "or a K/V pair written K/V", a->kv);
    if (compare && (a->ctk || a->ctv)) return usage_error("-m compare: give its schemes with -kv a,b,...");
    if (a->dev && strcmp(a->dev, "cpu") && strcmp(a->dev, "cuda") && strcmp(a->dev, "auto"))
        return usage_error("-dev: expected cpu, cuda or auto, found '%s'", a->dev);
    if (a->wmem && strcmp(a->wmem, "auto") && strcmp(a->wmem, "map") && strcmp(a->wmem, "copy"))
        return usage_error("-wmem: expected auto, map or copy, found '%s'", a->wmem);
    if (a->wmem && strcmp(a->wmem, "auto") && a->dev && !strcmp(a->dev, "cpu"))
        return usage_error("-wmem %s: where the GPU reads the weights, but -dev cpu runs on the CPU", a->wmem);
    if (a->wmem && !strcmp(a->wmem, "map") && a->wq_q8)
        return usage_error("-wmem map reads the checkpoint's matrices where they are mapped; -wq q8 makes new ones "
                           "at load (use -wmem copy)");
    if (a->session && strcmp(a->mode, "chat"))
        return usage_error("--session: expected -m chat (a session is a chat's), found -m %s", a->mode);
    return 0;
}

/* 0 ok, 1 help or version printed, 2 usage error (message printed). */
static int parse_args(int argc, char **argv, Args *a) {
    memset(a, 0, sizeof *a);
    a->mode = "generate";
    a->n = 256;
    a->think = 1;
    a->spec = -1;
    a->draft_q8 = 1;
    a->repeat = 1;
    a->repeat_n = 64;
    a->port = a->queue = a->cache_mb = -1;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) { usage(stdout); return 1; }
        if (!strcmp(f, "--version")) {
            printf("run %s: CPU kernels %s%s%s (%s); ", RUN_VERSION, kernels_isa(), *kernels_extensions() ? " with " : "",
                   kernels_extensions(), kernels_built());
            if (cuda_built()) printf("CUDA for %s, %d device(s) here\n", cuda_built(), cuda_device_count());
            else printf("CUDA not compiled in\n");
            return 1;
        }
        /* a word that is not an option is the model, wherever it comes */
        if (f[0] != '-' || !f[1]) {
            if (a->model) return usage_error("expected one model, found '%s' and '%s'", a->model, f);
            a->model = f;
            continue;
        }
        const Option *o = find_option(f);
        if (!o) return usage_error("unknown option '%s'", f);
        if (o->kind == OPT_BOOL) { *(int *)((char *)a + o->at) = 1; continue; }
        if (i + 1 >= argc) return usage_error("%s: missing its value (%s)", f, o->expect);
        if (o->at == AT(model) && a->model) return usage_error("expected one model, found '%s' and '%s'", a->model,
                                                               argv[i + 1]);
        int rc = set_option(a, o, f, argv[++i]);
        if (rc) return rc;
    }
    return check_args(a);
}

/* ---------------------------------------------------------- utilities */

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Ctrl-C: the loops check this and stop where they are. */
static volatile sig_atomic_t g_interrupted;
static void on_sigint(int sig) {
    (void)sig;
    g_interrupted = 1;
}

/* No SA_RESTART: a read waiting at the chat prompt returns EINTR. */
static void catch_sigint(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sigaction(SIGINT, &sa, NULL);
}

/* Progress of long work on stderr: one line rewritten in place, shown only
 * on a terminal and once the work has run 2 s. */
typedef struct {
    const char *what;
    long total;
    double t0;
    int shown;
} Progress;

static void progress_start(Progress *p, const char *what, long total) {
    *p = (Progress){what, total, now(), 0};
}

static void progress_show(Progress *p, long done) {
    double dt = now() - p->t0;
    if (dt < 2 || !isatty(2)) return;
    double rate = done / dt, left = rate > 0 ? (p->total - done) / rate : 0;
    fprintf(stderr, "\r%s: %ld/%ld tokens, %.1f tok/s, %.0f s left   ", p->what, done, p->total, rate, left);
    p->shown = 1;
}

static void progress_end(Progress *p) {
    if (p->shown) fprintf(stderr, "\r%*s\r", 70, "");
}

/* A token list that grows. */
typedef struct {
    int *v;
    int n, cap;
} Ids;

static int ids_push(Ids *l, const int *x, int n) {
    if (n == 0) return 0; /* x may be an empty list's NULL */
    if (l->n + n > l->cap) {
        int cap = (l->n + n) * 2 + 16;
        int *v = realloc(l->v, (size_t)cap * sizeof(int));
        if (!v) return -1;
        l->v = v, l->cap = cap;
    }
    memcpy(l->v + l->n, x, (size_t)n * sizeof(int));
    l->n += n;
    return 0;
}

/* Encodes text into ids (replacing what they held); -1 with a message.
 * (Texts are at most 64 MiB, so 3 ids a byte fit an int.) */
static int encode(const Tokenizer *tok, const char *text, size_t len, Ids *out) {
    const int cap = (int)(3 * len + 16);
    if (cap > out->cap) {
        int *v = realloc(out->v, (size_t)cap * sizeof(int));
        if (!v) { fprintf(stderr, "error: out of memory for the prompt's tokens\n"); return -1; }
        out->v = v, out->cap = cap;
    }
    out->n = tok_encode(tok, text, len, out->v, cap);
    if (out->n < 0) { fprintf(stderr, "error: the tokenizer failed on the prompt (out of memory)\n"); return -1; }
    return 0;
}

/* The default model sits next to the executable, wherever it is run from. */
static const char *default_model(char *buf, size_t n) {
    char exe[4096];
    ssize_t l = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (l <= 0) return DEFAULT_MODEL;
    exe[l] = 0;
    char *slash = strrchr(exe, '/');
    if (slash) *slash = 0;
    snprintf(buf, n, "%s/%s", exe, DEFAULT_MODEL);
    /* a binary copied elsewhere (build/run) finds the model one level up */
    struct stat st;
    if (stat(buf, &st) != 0) snprintf(buf, n, "%s/../%s", exe, DEFAULT_MODEL);
    return buf;
}

/* ------------------------------------------------------------- session */

typedef struct {
    double prefill_s, decode_s;
    long prefill_tokens, decode_tokens;
    int has_spec;
    double spec_accept;   /* accepted / drafted */
    double spec_per_step; /* tokens emitted per verify step (main forward) */
} Stats;

/* Everything a mode works with, filled by main's steps. */
typedef struct {
    Args a;
    ModelSource src;
    Tokenizer tok;
    Config cfg;            /* config.json, read before the weights (the vocabulary check) */
    GenDefaults gd;        /* generation_config.json */
    Model m;
    int have_model;
    KVSpec spec;           /* the cache's scheme (compare: the f32 reference) */
    KVSpec specs[64];      /* compare: f32, then the schemes to compare */
    int n_specs;
    char *text;            /* -i, -f or the default prompt; NULL in chat without -i/-f */
    size_t text_len;
    Ids ids;               /* its tokens */
    int ctx;               /* context length */
    Stats st;
} Run;

/* The bytes an amount of memory takes, for people: "1.2 MB". */
static void human_bytes(double b, char *out, size_t n) {
    const char *u[] = {"B", "KB", "MB", "GB", "TB"};
    int k = 0;
    while (b >= 1000 && k < 4) b /= 1000, k++;
    snprintf(out, n, k ? "%.1f %s" : "%.0f %s", b, u[k]);
}

/* After generating: one line for people, then the `stats:` line scripts read. */
static void print_stats(const Run *r, const KVCache *kv) {
    const Stats *s = &r->st;
    double ptps = s->prefill_s > 0 ? s->prefill_tokens / s->prefill_s : 0;
    double dtps = s->decode_s > 0 ? s->decode_tokens / s->decode_s : 0;
    size_t kvb = kv && (kv->k || kv->dev) ? kv_cache_bytes(kv) : 0, stb = kv ? kv_cache_state_bytes(kv) : 0;
    char hb[32], hs[32], name[128];
    human_bytes((double)kvb, hb, sizeof hb);
    human_bytes((double)stb, hs, sizeof hs);
    kv_spec_name(&r->spec, name, sizeof name);
    fprintf(stderr, "prompt %ld tok at %.1f tok/s", s->prefill_tokens, ptps);
    if (s->decode_tokens) fprintf(stderr, ", generated %ld tok at %.1f tok/s", s->decode_tokens, dtps);
    if (kvb) fprintf(stderr, ", KV %s (%s)", hb, name);
    /* a hybrid model's recurrent state: f32, the same size at any context */
    if (stb) fprintf(stderr, " + state %s (f32)", hs);
    fprintf(stderr, "\nstats: prefill_tokens=%ld prefill_tps=%.2f decode_tokens=%ld decode_tps=%.2f kv_bytes=%zu",
            s->prefill_tokens, ptps, s->decode_tokens, dtps, kvb);
    if (stb) fprintf(stderr, " state_bytes=%zu", stb);
    if (s->has_spec) fprintf(stderr, " spec_accept=%.4f spec_tokens_per_step=%.3f", s->spec_accept, s->spec_per_step);
    /* where it ran: the device, its memory, and what the weights take there */
    const GpuModel *g = r->m.gpu;
    const double mem = g ? (double)gpu_model_mem(g) : (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
    fprintf(stderr, " device=%s device_mem_bytes=%.0f model_bytes=%zu", g ? "cuda" : "cpu", mem,
            g ? gpu_model_bytes(g) : model_weight_bytes(&r->m));
    /* on the GPU, what it reads where the checkpoint is mapped (-wmem) */
    if (g) fprintf(stderr, " mapped_bytes=%zu", gpu_model_mapped_bytes(g));
    fprintf(stderr, "\n");
}

/* ---------------------------------------------------------- generation */

typedef struct {
    Model *m;
    KVCache *kv;
    Tokenizer *tok;
    Sampler *smp;
    Stats *st;
    Spec *spec;         /* NULL: plain decoding */
    float *logits;      /* [V] logits of the last position */
    float *hidden;      /* [PREFILL_SLICE, H] prefill hidden states, for the MTP head */
    int stops[CFG_MAX_EOS + 1], n_stops;
    Ids *reply;         /* NULL, or collects the emitted tokens */
} Gen;

static int is_stop(const Gen *g, int id) {
    for (int i = 0; i < g->n_stops; i++)
        if (g->stops[i] == id) return 1;
    return 0;
}

/* Prints one token, never half a UTF-8 character, and records it. */
static void emit(Gen *g, TokStream *ts, char *buf, size_t cap, int id) {
    size_t w = tok_stream_put(g->tok, ts, id, buf, cap);
    if (w != (size_t)-1) fwrite(buf, 1, w, stdout);
    fflush(stdout);
    sampler_accept(g->smp, id);
    if (g->reply) ids_push(g->reply, &id, 1);
}

/* The next token from the last forward's last row: on the GPU drawn where
 * the logits are (only the id comes back), else from g->logits. */
static int next_token(Gen *g, int *x, char *err, size_t errlen) {
    if (model_samples_on_device(g->m)) return model_sample(g->m, g->smp, x, err, errlen);
    *x = sampler_sample(g->smp, g->logits);
    return 0;
}

/* Feeds ids[0..n) in slices of PREFILL_SLICE, so a long prompt shows
 * progress and the MTP head's hidden states need a slice's room (neither
 * the logits nor the drafter's rows depend on how the prompt is sliced).
 * 0, 1 on error (printed), or 130 when interrupted between slices (the
 * caches then hold the slices fed). */
static int prefill(Gen *g, const int *ids, int n, char *err, size_t errlen) {
    Progress p;
    progress_start(&p, "prompt", n);
    double t0 = now();
    int rc = 0, off = 0;
    /* logits come back only for the CPU's sampler */
    float *lg = model_samples_on_device(g->m) ? NULL : g->logits;
    while (off < n && !rc) {
        int k = n - off < PREFILL_SLICE ? n - off : PREFILL_SLICE;
        if (model_forward(g->m, g->kv, ids + off, k, lg, 0, g->spec ? g->hidden : NULL, err, errlen) ||
            (g->spec && spec_prefill(g->spec, g->hidden, ids + off, k, err, errlen))) {
            fprintf(stderr, "%serror: %s\n", p.shown ? "\n" : "", err);
            rc = 1;
            break;
        }
        for (int i = 0; i < k; i++) sampler_accept(g->smp, ids[off + i]);
        off += k;
        progress_show(&p, off);
        if (g_interrupted && off < n) rc = 130;
    }
    progress_end(&p);
    g->st->prefill_s += now() - t0;
    g->st->prefill_tokens += off;
    return rc;
}

/* Feeds ids (prefill), then samples up to n tokens (n < 0: no limit; 0:
 * the prompt only),
 * printing them. The caches end as plain decoding leaves them: every
 * emitted token but the last one fed. Returns 0 ok (a full context only
 * ends the reply), 1 on error, 130 when interrupted. */
static int generate(Gen *g, const int *ids, int n_ids, int n) {
    char err[1024];
    const int used = kv_cache_len(g->kv);
    if (used + n_ids > g->kv->cap) {
        fprintf(stderr, "error: prompt of %d tokens does not fit the context of %d", n_ids, g->kv->cap);
        if (used) fprintf(stderr, " (%d already used)", used);
        /* -c beyond the model's positions is capped to them */
        if (g->kv->cap < g->m->cfg.max_pos) fprintf(stderr, "; raise -c\n");
        else fprintf(stderr, ", the model's max_position_embeddings\n");
        return 1;
    }
    int rc = prefill(g, ids, n_ids, err, sizeof err);
    if (rc || n == 0) return rc;
    TokStream ts = {0};
    size_t bufcap = tok_max_piece(g->tok) + 16;
    char *buf = malloc(bufcap);
    if (!buf) { fprintf(stderr, "error: out of memory\n"); return 1; }
    int out[SPEC_MAX + 1], x, count = 0;
    if (next_token(g, &x, err, sizeof err)) {
        fprintf(stderr, "error: %s\n", err);
        free(buf);
        return 1;
    }
    double t0 = now();
    /* x: the next token to print, not yet in the cache */
    while (!is_stop(g, x)) {
        emit(g, &ts, buf, bufcap, x);
        if (++count == n || g_interrupted) break;
        int P = kv_cache_len(g->kv);
        if (P >= g->kv->cap) {
            fprintf(stderr, "%s[context full at %d tokens: stopping]\n", isatty(2) ? "\n" : "", g->kv->cap);
            break;
        }
        if (!g->spec || P + 2 > g->kv->cap) {
            float *lg = model_samples_on_device(g->m) ? NULL : g->logits;
            if (model_forward(g->m, g->kv, &x, 1, lg, 0, NULL, err, sizeof err) || next_token(g, &x, err, sizeof err)) {
                rc = 1;
                break;
            }
            g->st->decode_tokens++;
            continue;
        }
        int got = spec_step(g->spec, x, out, err, sizeof err);
        if (got < 0) { rc = 1; break; }
        /* accepted drafts sit in the cache at P+1..; a stop among them rewinds it */
        int stop = 0;
        for (int i = 0; i + 1 < got && !stop; i++) {
            g->st->decode_tokens++;
            if (is_stop(g, out[i])) stop = 1;
            else {
                emit(g, &ts, buf, bufcap, out[i]);
                stop = ++count == n;
            }
            if (stop) spec_rewind(g->spec, P + i + 1);
        }
        if (stop) break;
        g->st->decode_tokens++;
        x = out[got - 1];
    }
    if (rc) fprintf(stderr, "%serror: %s\n", isatty(2) ? "\n" : "", err);
    size_t w = tok_stream_flush(&ts, buf, bufcap);
    if (w != (size_t)-1) fwrite(buf, 1, w, stdout);
    fflush(stdout);
    free(buf);
    g->st->decode_s += now() - t0;
    return rc ? rc : g_interrupted ? 130 : 0;
}

/* --------------------------------------------------------------- modes */

/* A token's bytes in quotes, whole: characters as they are, control bytes,
 * '"', '\\' and bytes that are not UTF-8 on their own as \xNN (a piece may
 * hold half a character), so spaces and newlines stay visible. */
static void print_piece(const char *p, size_t len) {
    putchar('"');
    for (size_t i = 0; i < len;) {
        size_t k = 1;
        while (k <= 4 && i + k <= len && !utf8_valid(p + i, k)) k++;
        unsigned char c = (unsigned char)p[i];
        if (k > 4 || i + k > len || c < 0x20 || c == '"' || c == '\\' || c == 0x7F) {
            printf("\\x%02X", c);
            i++;
        } else {
            fwrite(p + i, 1, k, stdout);
            i += k;
        }
    }
    putchar('"');
}

static int run_tokenize(Run *r) {
    for (int i = 0; i < r->ids.n; i++) {
        if (!r->a.show_pieces) {
            printf(i ? " %d" : "%d", r->ids.v[i]);
            continue;
        }
        size_t len;
        const char *p = tok_piece(&r->tok, r->ids.v[i], &len);
        printf("%d\t", r->ids.v[i]);
        print_piece(p, len);
        printf("\n");
    }
    if (!r->a.show_pieces) printf("\n");
    return 0;
}

/* Token ids (separated by blanks or commas) back to text; every id is
 * checked before any text is printed. */
static int run_detokenize(Run *r) {
    const char *s = r->text;
    Ids ids = {0};
    for (int k = 0;; k++) {
        while (*s == ' ' || *s == '\t' || *s == '\n' || *s == '\r' || *s == ',') s++;
        if (!*s) break;
        char *end = (char *)s;
        errno = 0;
        long id = *s >= '0' && *s <= '9' ? strtol(s, &end, 10) : -1;
        size_t len;
        if (id < 0 || id > INT32_MAX || errno || !strchr(" \t\n\r,", *end) || !tok_piece(&r->tok, (int)id, &len)) {
            fprintf(stderr, "error: detokenize: item %d: expected a token id in 0..%d, found '%.*s'\n", k,
                    tok_vocab_size(&r->tok) - 1, (int)strcspn(s, " \t\n\r,"), s);
            free(ids.v);
            return 1;
        }
        int i = (int)id;
        if (ids_push(&ids, &i, 1)) { fprintf(stderr, "error: out of memory\n"); free(ids.v); return 1; }
        s = end;
    }
    /* the stream decoder joins pieces that split a UTF-8 character */
    TokStream ts = {0};
    size_t cap = tok_max_piece(&r->tok) + 16, w;
    char *buf = malloc(cap);
    if (!buf) fprintf(stderr, "error: out of memory\n");
    for (int i = 0; buf && i < ids.n; i++)
        if ((w = tok_stream_put(&r->tok, &ts, ids.v[i], buf, cap)) != (size_t)-1) fwrite(buf, 1, w, stdout);
    if (buf && (w = tok_stream_flush(&ts, buf, cap)) != (size_t)-1) fwrite(buf, 1, w, stdout);
    const int rc = buf ? 0 : 1;
    free(ids.v);
    free(buf);
    return rc;
}

/* One file with config, tokenizer and weights (model/source.h). */
static int run_pack(Run *r) {
    static const char *const names[] = SOURCE_FILES;
    const int n_names = (int)(sizeof names / sizeof *names);
    const char *keys[8], *vals[8];
    size_t lens[8];
    char *texts[8] = {0}, err[1024];
    int n = 0, rc = 1;
    TensorStore ts = {0};
    double t0 = now();
    /* what is packed must load: the tokenizer (main read it) and the config */
    if (source_config(&r->src, &r->cfg, err, sizeof err)) goto done;
    for (int i = 0; i < n_names; i++) {
        int absent;
        size_t len;
        texts[i] = source_read(&r->src, names[i], TOK_MAX_JSON, &len, &absent, err, sizeof err);
        if (!texts[i] && !absent) goto done;
        if (texts[i]) keys[n] = names[i], vals[n] = texts[i], lens[n++] = len;
    }
    if (source_tensors(&r->src, &ts, err, sizeof err) || st_write(r->a.out, &ts, keys, vals, lens, n, err, sizeof err))
        goto done;
    size_t bytes = 0;
    for (int i = 0; i < ts.n_tensors; i++) bytes += ts.tensors[i].nbytes;
    char hb[32];
    human_bytes((double)bytes, hb, sizeof hb);
    fprintf(stderr, "wrote %s: %d tensors (%s) and %d JSON files, in %.1f s\n", r->a.out, ts.n_tensors, hb, n,
            now() - t0);
    rc = 0;
done:
    if (rc) fprintf(stderr, "error: %s\n", err);
    for (int i = 0; i < n_names; i++) free(texts[i]);
    st_close(&ts);
    return rc;
}

/* Perplexity over non-overlapping windows of ctx tokens; each window starts
 * from an empty cache and scores every token after its first. */
static int run_ppl(Run *r, KVCache *kv) {
    const int V = r->m.cfg.vocab_size, B = 64, n = r->ids.n;
    const int *ids = r->ids.v;
    if (n < 2 || kv->cap < 2) {
        if (n < 2) fprintf(stderr, "error: -m ppl needs at least 2 tokens to score, found %d\n", n);
        else fprintf(stderr, "error: -m ppl needs windows of at least 2 tokens (-c), found %d\n", kv->cap);
        return 1;
    }
    float *lg = malloc((size_t)B * V * sizeof(float));
    if (!lg) { fprintf(stderr, "error: out of memory\n"); return 1; }
    char err[1024];
    double nll = 0, t0 = now();
    long count = 0;
    int nwin = (n + kv->cap - 1) / kv->cap;
    Progress p;
    progress_start(&p, "ppl", n);
    for (int w = 0, start = 0; start < n - 1 && !g_interrupted; w++, start += kv->cap) {
        int len = n - start < kv->cap ? n - start : kv->cap;
        kv_cache_truncate(kv, 0);
        for (int off = 0; off < len && !g_interrupted; off += B) {
            int nb = len - off < B ? len - off : B;
            if (model_forward(&r->m, kv, ids + start + off, nb, lg, 1, NULL, err, sizeof err)) {
                progress_end(&p);
                fprintf(stderr, "error: %s\n", err);
                free(lg);
                return 1;
            }
            for (int i = 0; i < nb && off + i + 1 < len; i++) {
                const float *row = lg + (size_t)i * V;
                float mx = row[0];
                for (int j = 1; j < V; j++) mx = row[j] > mx ? row[j] : mx;
                double sum = 0;
                for (int j = 0; j < V; j++) sum += exp((double)row[j] - mx);
                nll += log(sum) + mx - row[ids[start + off + i + 1]];
                count++;
            }
            progress_show(&p, start + off + nb);
        }
        progress_end(&p);
        if (nwin > 1) fprintf(stderr, "window %d/%d: %d tokens, ppl so far %.4f\n", w + 1, nwin, len,
                              exp(nll / (count ? count : 1)));
        r->st.prefill_tokens += len;
    }
    r->st.prefill_s = now() - t0;
    free(lg);
    if (g_interrupted) fprintf(stderr, "[interrupted: ppl over the first %ld tokens]\n", count);
    printf("ppl %.4f tokens %ld\n", exp(nll / (count ? count : 1)), count);
    return g_interrupted ? 130 : 0;
}

static int run_logits(Run *r, KVCache *kv) {
    const int V = r->m.cfg.vocab_size, B = 64, n = r->ids.n;
    /* a regular file is written beside itself and renamed at the end, so
     * that an error leaves neither a partial file nor a clobbered old one;
     * a pipe or a device is written as it is */
    struct stat sb;
    const int direct = stat(r->a.out, &sb) == 0 && !S_ISREG(sb.st_mode);
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", r->a.out, (int)getpid());
    const char *path = direct ? r->a.out : tmp;
    FILE *f = fopen(path, "wb");
    if (!f) { fprintf(stderr, "error: -o %s: cannot write: %s\n", path, strerror(errno)); return 1; }
    float *lg = malloc((size_t)B * V * sizeof(float));
    char err[1024];
    double t0 = now();
    int rc = lg ? 0 : 1;
    if (!lg) fprintf(stderr, "error: out of memory\n");
    for (int off = 0; off < n && rc == 0 && !g_interrupted; off += B) {
        int nb = n - off < B ? n - off : B;
        if (model_forward(&r->m, kv, r->ids.v + off, nb, lg, 1, NULL, err, sizeof err)) {
            fprintf(stderr, "error: %s\n", err);
            rc = 1;
        } else if (fwrite(lg, sizeof(float), (size_t)nb * V, f) != (size_t)nb * V) {
            fprintf(stderr, "error: -o %s: write failed\n", r->a.out);
            rc = 1;
        }
    }
    if (fclose(f) != 0 && rc == 0) { fprintf(stderr, "error: -o %s: write failed\n", r->a.out); rc = 1; }
    if (!direct && rc == 0 && rename(tmp, r->a.out)) {
        fprintf(stderr, "error: -o %s: cannot write: %s\n", r->a.out, strerror(errno));
        rc = 1;
    }
    if (!direct && rc) remove(tmp);
    r->st.prefill_s = now() - t0;
    r->st.prefill_tokens = n;
    free(lg);
    if (rc == 0 && g_interrupted) {
        fprintf(stderr, "[interrupted: %s holds the logits of the first positions only]\n", r->a.out);
        return 130;
    }
    if (rc == 0) fprintf(stderr, "wrote %d x %d logits to %s\n", n, V, r->a.out);
    return rc;
}

static int dev_is_cuda(const Run *r) { return r->a.dev && !strcmp(r->a.dev, "cuda"); }

/* -wmem as model_to_gpu takes it (model/gpu.h). */
static int wmem_mode(const Run *r) {
    const char *w = r->a.wmem;
    return !w || !strcmp(w, "auto") ? GPU_WMEM_AUTO : !strcmp(w, "map") ? GPU_WMEM_MAP : GPU_WMEM_COPY;
}

static void compare_progress(void *p, long done, long total) {
    ((Progress *)p)->total = total;
    progress_show(p, done);
}

static int run_compare(Run *r) {
    char err[1024];
    CompareRow rows[64];
    /* the reference keeps the stored weights and f32 inputs: a second load
     * of the same files when m was converted or relaid for bf16 inputs, in
     * memory (bf16 in panels), so that its numbers are those of the same
     * run without -wq or -act; on the GPU a second model there, its
     * weights as stored (mapped, as open_model loads for the GPU) */
    Model ref;
    const int two = r->a.wq_q8 || r->a.act_bf16;
    int n_gen = r->a.set_n && r->a.n >= 0 ? r->a.n : 64;
    if (two && model_load_source(&ref, &r->src, r->m.gpu ? MODEL_MAPPED : 0, err, sizeof err)) {
        fprintf(stderr, "error: %s\n", err);
        return 1;
    }
    if (two && r->m.gpu && model_to_gpu(&ref, wmem_mode(r), err, sizeof err)) {
        if (dev_is_cuda(r)) {
            fprintf(stderr, "error: the stored-weights reference on the GPU: %s\n", err);
            model_free(&ref);
            return 1;
        }
        /* auto: both models on the CPU (the reference reads its mapping) */
        fprintf(stderr, "note: running on the CPU: the stored-weights reference: %s\n", err);
        model_drop_gpu(&r->m);
    }
    const char *what = r->a.wq_q8 ? "q8" : "act bf16";
    int rc = 0;
    Progress p;
    progress_start(&p, "compare", 0);
    int bad = compare_run(two ? &ref : &r->m, &r->m, what, r->specs, r->n_specs, r->ids.v, r->ids.n, r->ctx, n_gen,
                          rows, compare_progress, &p, err, sizeof err);
    progress_end(&p);
    if (bad ||
        (r->a.out && compare_write(r->a.out, rows, r->n_specs, r->src.path, err, sizeof err))) {
        fprintf(stderr, "error: %s\n", err);
        rc = 1;
    } else {
        int scored = r->ids.n < r->ctx - n_gen ? r->ids.n : r->ctx - n_gen;
        compare_print(stdout, rows, r->n_specs, r->src.path, scored);
        if (r->a.out) fprintf(stderr, "wrote %s\n", r->a.out);
    }
    if (two) model_free(&ref);
    return rc;
}

/* The sampler from the options, else generation_config.json, else
 * llama.cpp's defaults; prints what it chose. */
static void sampling_defaults(const Run *r, float *temp, int *top_k, float *top_p, float *min_p) {
    const Args *a = &r->a;
    const GenDefaults *gd = &r->gd;
    *temp = a->set_temp ? a->temp : gd->present ? (gd->do_sample ? (float)gd->temperature : 0) : 0.8f;
    *top_p = a->set_top_p ? a->top_p : gd->present ? (float)gd->top_p : 0.95f;
    *top_k = a->set_top_k ? a->top_k : gd->present ? gd->top_k : 40;
    *min_p = a->set_min_p ? a->min_p : gd->present ? (float)gd->min_p : 0.05f;
}

static int sampler_open(Run *r, Sampler *smp) {
    const Args *a = &r->a;
    float temp, top_p, min_p;
    int top_k;
    sampling_defaults(r, &temp, &top_k, &top_p, &min_p);
    unsigned long long seed = a->seed;
    if (!a->set_seed) {
        /* nanoseconds and the process id: two runs in one second differ */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        seed = (unsigned long long)ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec;
        seed ^= (unsigned long long)getpid() << 40;
    }
    fprintf(stderr, "sampling: temperature %.2f top-k %d top-p %.2f min-p %.2f seed %llu", temp, top_k, top_p, min_p,
            seed);
    if (a->repeat_n > 0 && (a->repeat != 1 || a->frequency != 0 || a->presence != 0))
        fprintf(stderr, "; penalties over %d tokens: repeat %.2f frequency %.2f presence %.2f", a->repeat_n,
                a->repeat, a->frequency, a->presence);
    fprintf(stderr, "\n");
    if (sampler_init(smp, r->m.cfg.vocab_size, temp, top_k, top_p, min_p, seed) ||
        sampler_set_penalties(smp, a->repeat_n, a->repeat, a->frequency, a->presence)) {
        fprintf(stderr, "error: out of memory for the sampler\n");
        return 1;
    }
    return 0;
}

#ifdef USE_SERVE
/* -m serve: the server's defaults from the options, then serve/ until
 * Ctrl-C or SIGTERM. */
static int run_serve(Run *r) {
    const Args *a = &r->a;
    char err[1024] = "", name[256], kvname[128];
    /* the model's name: its folder's or file's, without the path */
    snprintf(name, sizeof name, "%s", r->src.path);
    size_t nl = strlen(name);
    while (nl > 1 && name[nl - 1] == '/') name[--nl] = 0;
    const char *base = strrchr(name, '/') ? strrchr(name, '/') + 1 : name;
    kv_spec_name(&r->spec, kvname, sizeof kvname);
    ServeOpts o = {.host = a->host ? a->host : "127.0.0.1", .port = a->port >= 0 ? a->port : 8080,
                   .parallel = a->parallel ? a->parallel : 4, .queue = a->queue >= 0 ? a->queue : 64, .ctx = r->ctx,
                   .n_predict = a->n, .spec = r->spec, .spec_name = kvname, .think = a->think, .model_name = base,
                   .repeat = a->repeat, .last_n = a->repeat_n, .frequency = a->frequency, .presence = a->presence,
                   .has_seed = a->set_seed, .seed = a->seed, .api_key = a->api_key, .stop = &g_interrupted,
                   .cache_bytes = (a->cache_mb >= 0 ? a->cache_mb : 1024) * 1e6, .cache_dir = a->cache_dir,
                   /* a hybrid's chunk carries its recurrent state, megabytes whatever the chunk's length */
                   .cache_chunk = a->cache_chunk ? a->cache_chunk : r->m.cfg.n_gdn ? 256 : 64};
    sampling_defaults(r, &o.temperature, &o.top_k, &o.top_p, &o.min_p);
    o.budget = a->kv_mb ? a->kv_mb * 1e6 : o.parallel * model_cache_bytes(&r->m, &r->spec, r->ctx);
    catch_sigint();
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sigaction(SIGTERM, &sa, NULL);
    sa.sa_handler = SIG_IGN;
    sigaction(SIGPIPE, &sa, NULL);
    if (serve_run(&o, &r->m, &r->tok, err, sizeof err)) {
        fprintf(stderr, "error: %s\n", err);
        return 1;
    }
    return 0;
}
#endif

/* The MTP drafter, when the model has one and -spec asks for it. */
static int spec_open(Run *r, Gen *g, KVCache *mkv, Spec *sp) {
    char err[1024];
    Model *m = &r->m;
    int n_draft = r->a.spec < 0 ? (m->has_mtp ? 3 : 0) : r->a.spec;
    if (m->mtp_absent) {
        fprintf(stderr, "warning: %s: config.json announces an MTP head, but the checkpoint has no mtp.* tensors: no "
                        "speculative decoding\n", r->src.path);
        return 0;
    }
    if (n_draft > 0 && !m->has_mtp) {
        fprintf(stderr, "warning: -spec %d: %s has no MTP head; decoding without speculation\n", n_draft,
                r->src.path);
        return 0;
    }
    if (n_draft > 0 && sampler_penalizes(g->smp)) {
        fprintf(stderr, "speculative decoding off: penalties make each token's distribution depend on the drafts "
                        "before it\n");
        return 0;
    }
    if (n_draft == 0) return 0;
    g->hidden = malloc((size_t)PREFILL_SLICE * m->cfg.hidden * sizeof(float));
    /* the GPU keeps the drafter's weights as stored: DT_Q8I is laid out for
     * the CPU's VNNI kernel */
    const int q8 = r->a.draft_q8 && !m->gpu;
    if (!g->hidden || (q8 && model_quantize(m, MODEL_DRAFT, err, sizeof err)) ||
        model_kv_init(m, mkv, &r->spec, r->ctx, 1, err, sizeof err) ||
        spec_init(sp, m, g->kv, mkv, g->smp, n_draft, err, sizeof err)) {
        fprintf(stderr, "error: %s\n", g->hidden ? err : "out of memory");
        return 1;
    }
    g->spec = sp;
    fprintf(stderr, "speculative decoding: %d MTP drafts per step, drafter weights %s\n", n_draft,
            q8 ? "q8" : r->a.wq_q8 ? "as stored, output matrix q8 (-wq)" : "as stored");
    return 0;
}

/* A chat: what the cache holds, turn by turn, so that turns can be
 * dropped from the front when the context fills and the rest fed again. */
typedef struct {
    Ids sys;              /* the system block's tokens */
    Ids *turns;           /* [n_turns] a turn's user block, its reply and the close */
    int n_turns;
    Ids close;            /* "<|im_end|>\n": ends a reply in the cache */
    int stale;            /* the cache holds less than the turns say (Ctrl-C in a prompt): feed again */
} Chat;

/* One line from stdin (any length), NULL at the end or on Ctrl-C. */
static char *read_line(char **line, size_t *cap, size_t *len) {
    ssize_t n = getline(line, cap, stdin);
    if (n < 0) return NULL;
    if (n > 0 && (*line)[n - 1] == '\n') (*line)[--n] = 0;
    *len = (size_t)n;
    return *line;
}

/* The tokens to feed before a reply to the user block u: the system
 * block and u into an empty cache, else the close of the last reply and u.
 * When those and room for a reply do not fit (or the cache is stale), the
 * oldest turns that no longer fit are dropped and the rest fed again from
 * an empty cache. 0 ok; 1 u alone does not fit or holds what the model
 * cannot take (refused, said why); -1 out of memory. */
static int chat_feed(Run *r, Gen *g, Chat *c, const Ids *u, Ids *feed) {
    const int cap = g->kv->cap, reserve = r->a.n > 0 && r->a.n < cap / 2 ? r->a.n : cap / 4;
    const int len = kv_cache_len(g->kv);
    char err[256];
    feed->n = 0;
    if (model_check_input(&r->m, u->v, u->n, err, sizeof err)) {
        fprintf(stderr, "error: this message: %s\n", err);
        return 1;
    }
    if (!c->stale && len + (len ? c->close.n : c->sys.n) + u->n + reserve <= cap)
        return len ? ids_push(feed, c->close.v, c->close.n) || ids_push(feed, u->v, u->n)
                   : ids_push(feed, c->sys.v, c->sys.n) || ids_push(feed, u->v, u->n);
    if (c->sys.n + u->n + reserve > cap) {
        fprintf(stderr, "error: this message of %d tokens (with the system prompt and room for a reply) does not "
                        "fit the context of %d; raise -c\n", u->n, cap);
        return 1;
    }
    /* the newest turns that fit with the system block and u */
    int drop = c->n_turns, need = c->sys.n + u->n + reserve;
    for (int i = c->n_turns - 1; i >= 0 && need + c->turns[i].n <= cap; i--) need += c->turns[i].n, drop = i;
    if (drop) fprintf(stderr, "[context full: dropped the oldest %d of %d turns]\n", drop, c->n_turns);
    for (int i = 0; i < drop; i++) free(c->turns[i].v);
    memmove(c->turns, c->turns + drop, (size_t)(c->n_turns - drop) * sizeof *c->turns);
    c->n_turns -= drop;
    kv_cache_truncate(g->kv, 0);
    if (g->spec) spec_reset(g->spec);
    c->stale = 0;
    int bad = ids_push(feed, c->sys.v, c->sys.n);
    for (int i = 0; i < c->n_turns; i++) bad |= ids_push(feed, c->turns[i].v, c->turns[i].n);
    return bad || ids_push(feed, u->v, u->n) ? -1 : 0;
}

/* Records the turn just generated as the cache holds it: u, the reply's
 * tokens that were fed (a reply cut by -n, a full context or Ctrl-C
 * leaves its last token unfed), and the close the next turn feeds. A
 * prompt cut short by Ctrl-C is not a turn: the cache is marked stale. */
static int chat_record(Gen *g, Chat *c, const Ids *u, const Ids *feed, const Ids *reply, int before) {
    int held = kv_cache_len(g->kv) - before - feed->n;
    if (held < 0) {
        c->stale = 1;
        return 0;
    }
    held = held > reply->n ? reply->n : held;
    Ids turn = {0};
    Ids *nt = realloc(c->turns, (size_t)(c->n_turns + 1) * sizeof *c->turns);
    if (nt) c->turns = nt;
    if (!nt || ids_push(&turn, u->v, u->n) || ids_push(&turn, reply->v, held) ||
        ids_push(&turn, c->close.v, c->close.n)) {
        free(turn.v);
        return -1;
    }
    c->turns[c->n_turns++] = turn;
    return 0;
}

/* --session FILE: a chat in a saved-cache file (kv/kvfile.h), its parts in
 * this order; a part of 0 bytes is one the chat had none of (no drafter,
 * no penalties). The file's tokens are the cache's, [0, its length). */
enum { SESSION_KV, SESSION_CHAT, SESSION_MTP, SESSION_PEND, SESSION_WINDOW, SESSION_PARTS };
/* SESSION_CHAT is int32 words: stale, the system block's token count, the
 * turn count, the sampler's generator (8 bytes); each turn's count; then
 * the tokens of the system block and of every turn, the last close
 * included (the cache holds them all but that close). SESSION_MTP is the
 * drafter's cache; SESSION_PEND its row count M and the n_pend rows it has
 * still to write (speculative.h): M, n_pend, rows_tok [n_pend], then pend
 * [n_pend, H] floats. SESSION_WINDOW the penalties' window, oldest first. */
#define SESSION_HEAD 5

static int *ids_copy(int *to, const int *v, int n) {
    if (n) memcpy(to, v, (size_t)n * sizeof *to); /* v may be an empty list's NULL */
    return to + n;
}

/* Writes the chat to --session FILE, atomically (kvfile_write): 0 ok, 1
 * said why, the file as it was kept. */
static int session_save(Run *r, Gen *g, Chat *c) {
    const char *path = r->a.session;
    int total = c->sys.n;
    for (int i = 0; i < c->n_turns; i++) total += c->turns[i].n;
    /* a stale cache (a prompt cut by Ctrl-C), or one that holds other than
     * the turns, is saved empty: the next message feeds the turns again,
     * as it would have in this process */
    if (c->stale || kv_cache_len(g->kv) != total - (c->n_turns ? c->close.n : 0)) {
        c->stale = 1;
        kv_cache_truncate(g->kv, 0);
    }
    const int len = kv_cache_len(g->kv), H = r->m.cfg.hidden;
    const Spec *sp = c->stale ? NULL : g->spec;
    const Sampler *smp = g->smp;
    const int win = (int)(smp->n_seen < smp->last_n ? smp->n_seen : smp->last_n);
    size_t n[SESSION_PARTS] = {kv_cache_save_bytes(g->kv, 0, len),
                               (size_t)(SESSION_HEAD + c->n_turns + total) * sizeof(int),
                               sp ? kv_cache_save_bytes(sp->mkv, 0, kv_cache_len(sp->mkv)) : 0,
                               sp ? (2 + (size_t)sp->n_pend) * sizeof(int) + (size_t)sp->n_pend * H * sizeof(float) : 0,
                               (size_t)win * sizeof(int)};
    void *part[SESSION_PARTS];
    char err[1024] = "out of memory";
    int bad = 0;
    /* a byte more, so that an empty part is a pointer all the same */
    for (int i = 0; i < SESSION_PARTS; i++) bad |= !(part[i] = malloc(n[i] + 1));
    int *w = part[SESSION_CHAT], *tokens = bad ? NULL : w + SESSION_HEAD + c->n_turns;
    if (!bad) {
        w[0] = c->stale, w[1] = c->sys.n, w[2] = c->n_turns;
        memcpy(w + 3, &smp->rng, sizeof smp->rng);
        int *t = ids_copy(tokens, c->sys.v, c->sys.n);
        for (int i = 0; i < c->n_turns; i++)
            w[SESSION_HEAD + i] = c->turns[i].n, t = ids_copy(t, c->turns[i].v, c->turns[i].n);
        for (int i = 0; i < win; i++)
            ((int *)part[SESSION_WINDOW])[i] = smp->hist[(smp->n_seen - win + i) % smp->last_n];
        bad = kv_cache_save(g->kv, 0, part[SESSION_KV], n[SESSION_KV], err, sizeof err) ||
              (sp && kv_cache_save(sp->mkv, 0, part[SESSION_MTP], n[SESSION_MTP], err, sizeof err));
    }
    if (!bad && sp) {
        int *p = part[SESSION_PEND];
        p[0] = kv_cache_len(sp->mkv), p[1] = sp->n_pend;
        memcpy(ids_copy(p + 2, sp->rows_tok, sp->n_pend), sp->pend, (size_t)sp->n_pend * H * sizeof(float));
    }
    KVFileHead h = {.model = model_identity(&r->m), .t0 = 0, .t1 = len};
    kv_spec_name(&r->spec, h.spec, sizeof h.spec);
    if (bad) fprintf(stderr, "error: --session %s: not written: %s (the file as it was is kept)\n", path, err);
    else if ((bad = kvfile_write(path, &h, tokens, SESSION_PARTS, (const void *const *)part, n, err, sizeof err)))
        fprintf(stderr, "error: --session %s\n", err);
    else fprintf(stderr, "session: %s: %d positions, %d turn%s saved\n", path, len, c->n_turns,
                 c->n_turns == 1 ? "" : "s");
    for (int i = 0; i < SESSION_PARTS; i++) free(part[i]);
    return bad;
}

/* Checks SESSION_CHAT (bytes of w) against the cache's tokens [t1] and
 * this run's tokenizer and -y, and takes its turns into c: 0, -1 with why. */
static int session_turns(const Run *r, Chat *c, const int *w, size_t bytes, const int *tok, int t1, char *why,
                         size_t whylen) {
    const size_t words = bytes / sizeof(int);
    uint64_t rng = 0;
    long total = 0;
    int ok = bytes % sizeof(int) == 0 && words >= SESSION_HEAD && (w[0] == 0 || w[0] == 1) && w[1] >= 0 &&
             w[2] >= 0 && (size_t)w[2] <= words - SESSION_HEAD;
    for (int i = 0; ok && i < w[2]; i++) total += w[SESSION_HEAD + i], ok = w[SESSION_HEAD + i] > 0;
    if (ok) memcpy(&rng, w + 3, sizeof rng);
    /* the words left are the tokens: those of the cache, then the last close */
    const long all = ok ? (long)w[1] + total : 0, held = all - (ok && w[2] ? c->close.n : 0);
    const int *t = w + SESSION_HEAD + (ok ? w[2] : 0);
    ok = ok && rng && words == SESSION_HEAD + (size_t)w[2] + (size_t)all && held >= 0 && (w[0] ? !t1 : held == t1) &&
         (t1 == 0 || !memcmp(t, tok, (size_t)t1 * sizeof *t)) &&
         (!w[2] || !memcmp(t + held, c->close.v, (size_t)c->close.n * sizeof *t));
    if (!ok) {
        snprintf(why, whylen, "expected turns that add up to its %d cached positions, found a record that does not",
                 t1);
        return -1;
    }
    /* (no model_check_input: replies may hold what a message may not) */
    for (long i = 0; i < all; i++)
        if (t[i] < 0 || t[i] >= r->m.cfg.vocab_size) {
            snprintf(why, whylen, "token %ld: expected an id below %d, found %d", i, r->m.cfg.vocab_size, t[i]);
            return -1;
        }
    /* without -y the session's system prompt goes on; a -y must be its own */
    if (r->a.system && (w[1] != c->sys.n || (w[1] && memcmp(t, c->sys.v, (size_t)w[1] * sizeof *t)))) {
        snprintf(why, whylen, "expected a session made with this -y system prompt, found one made with another "
                              "(drop -y to go on with the session's)");
        return -1;
    }
    c->sys.n = 0;
    c->turns = calloc((size_t)w[2] + 1, sizeof *c->turns);
    int bad = !c->turns || ids_push(&c->sys, t, w[1]);
    t += w[1];
    for (int i = 0; !bad && i < w[2]; t += w[SESSION_HEAD + i], i++)
        bad = ids_push(&c->turns[c->n_turns++], t, w[SESSION_HEAD + i]);
    c->stale = w[0];
    if (bad) snprintf(why, whylen, "out of memory for its turns");
    return bad ? -1 : 0;
}

/* Takes the drafter's cache and pending rows (SESSION_MTP, SESSION_PEND)
 * into sp, for a main cache of t1 positions: its drafts are then the ones
 * this process would have made. 0 ok; 1 when this run's drafter cannot
 * take them (saved without drafting, or more pending rows than this -spec
 * holds); -1 with why. The rows may end before t1: a reply that reached
 * the end of the context decoded its last tokens without drafts (the
 * next turn then starts the caches again). */
static int session_drafter(const Run *r, Spec *sp, void *const *part, const size_t *n, int t1, char *why,
                           size_t whylen) {
    const int *p = part[SESSION_PEND];
    const size_t row = sizeof(int) + (size_t)r->m.cfg.hidden * sizeof(float);
    if (!n[SESSION_PEND]) return 1;
    if (n[SESSION_PEND] < 2 * sizeof(int) || p[1] < 1 || p[1] > SPEC_MAX + 2 || p[0] < 0 || p[0] > t1 - p[1] ||
        n[SESSION_PEND] != 2 * sizeof(int) + (size_t)p[1] * row) {
        snprintf(why, whylen, "expected the drafter's rows to end by its %d cached positions, found a record that "
                              "does not", t1);
        return -1;
    }
    /* the rows' tokens feed the drafter (the last row's is written later) */
    for (int i = 0; i + 1 < p[1]; i++)
        if (p[2 + i] < 0 || p[2 + i] >= r->m.cfg.vocab_size) {
            snprintf(why, whylen, "drafter row %d: expected a token id below %d, found %d", i, r->m.cfg.vocab_size,
                     p[2 + i]);
            return -1;
        }
    /* pend holds n_draft + 2 rows */
    if (p[1] > sp->n_draft + 2) return 1;
    char err[512];
    if (kv_cache_load(sp->mkv, p[0], part[SESSION_MTP], n[SESSION_MTP], err, sizeof err)) {
        snprintf(why, whylen, "the drafter's cache: %s", err);
        return -1;
    }
    memcpy(sp->rows_tok, p + 2, (size_t)p[1] * sizeof(int));
    memcpy(sp->pend, p + 2 + p[1], (size_t)p[1] * (row - sizeof(int)));
    sp->n_pend = p[1];
    return 0;
}

/* Reads --session FILE, when there is one, into the empty caches, the
 * drafter, the sampler and c (whose system block and close are this
 * run's), so that the chat goes on as if this process had made it: 0 ok,
 * 1 said why (the file left as it is). */
static int session_load(Run *r, Gen *g, Chat *c) {
    const char *path = r->a.session;
    struct stat st;
    if (stat(path, &st)) {
        const int e = errno;
        if (e == ENOENT) fprintf(stderr, "session: %s: none yet, a new chat (written there when it ends)\n", path);
        else fprintf(stderr, "error: --session %s: cannot read: %s\n", path, strerror(e));
        return e != ENOENT;
    }
    /* a folder or a pipe would be read as a truncated file, or block */
    if (!S_ISREG(st.st_mode)) {
        fprintf(stderr, "error: --session %s: expected a file, found %s\n", path,
                S_ISDIR(st.st_mode) ? "a folder" : "something else");
        return 1;
    }
    KVFileHead h;
    int *tok = NULL, np = 0, rc = 1;
    void *part[SESSION_PARTS];
    size_t n[SESSION_PARTS];
    char err[1024], why[1024] = "", name[64];
    if (kvfile_read(path, &h, &tok, SESSION_PARTS, part, n, &np, err, sizeof err)) {
        fprintf(stderr, "error: --session %s\n", err);
        return 1;
    }
    kv_spec_name(&r->spec, name, sizeof name);
    if (h.model != model_identity(&r->m))
        snprintf(why, sizeof why, "expected a session of %s as this run loads it (its weights, -wq, -act, this CPU's "
                 "kernel level), found another model's", r->src.path);
    else if (np != SESSION_PARTS || h.t0 || h.key[0] || h.key[1])
        snprintf(why, sizeof why, "expected a chat session (%d parts from position 0), found another saved cache",
                 SESSION_PARTS);
    else if (strcmp(h.spec, name))
        snprintf(why, sizeof why, "expected a -kv %s cache, found %s (run with -kv %s, or name another file)", name,
                 h.spec, h.spec);
    else if (h.t1 > g->kv->cap)
        snprintf(why, sizeof why, "expected at most the %d positions of -c %d, found %d (raise -c)", g->kv->cap,
                 g->kv->cap, h.t1);
    else if (!session_turns(r, c, part[SESSION_CHAT], n[SESSION_CHAT], tok, h.t1, why, sizeof why)) {
        if (kv_cache_load(g->kv, h.t1, part[SESSION_KV], n[SESSION_KV], err, sizeof err))
            snprintf(why, sizeof why, "%s", err);
        else if (n[SESSION_WINDOW] % sizeof(int))
            snprintf(why, sizeof why, "expected a window of whole tokens, found %zu bytes", n[SESSION_WINDOW]);
        else {
            rc = 0;
            const int *w = part[SESSION_WINDOW];
            for (size_t i = 0; !rc && i < n[SESSION_WINDOW] / sizeof(int); i++)
                if (w[i] < 0 || w[i] >= r->m.cfg.vocab_size) {
                    snprintf(why, sizeof why, "the penalties' window, token %zu: expected an id below %d, found %d", i,
                             r->m.cfg.vocab_size, w[i]);
                    rc = 1;
                }
        }
    }
    const int d = rc || !g->spec || !h.t1 ? 0 : session_drafter(r, g->spec, part, n, h.t1, why, sizeof why);
    if (d < 0) rc = 1;
    else if (d > 0) {
        /* the drafts would have no rows to start from; verification keeps
         * greedy output what it is, drafts or none */
        fprintf(stderr, "note: --session %s holds no drafter state -spec %d can take (saved without drafts, or with "
                        "more): speculative decoding off for this chat\n", path, g->spec->n_draft);
        spec_free(g->spec);
        g->spec = NULL;
    }
    if (rc) fprintf(stderr, "error: --session %s: %s\n", path, why);
    else {
        /* the generator goes on unless -s starts a new one; the penalties'
         * window is the saved one, else the cache's last tokens */
        if (!r->a.set_seed) memcpy(&g->smp->rng, (const int *)part[SESSION_CHAT] + 3, sizeof g->smp->rng);
        const int *win = n[SESSION_WINDOW] ? part[SESSION_WINDOW] : tok;
        const size_t nw = n[SESSION_WINDOW] ? n[SESSION_WINDOW] / sizeof(int) : (size_t)h.t1;
        for (size_t i = 0; i < nw; i++) sampler_accept(g->smp, win[i]);
        fprintf(stderr, "session: %s: %d positions, %d turn%s restored\n", path, h.t1, c->n_turns,
                c->n_turns == 1 ? "" : "s");
    }
    free(tok);
    for (int i = 0; i < SESSION_PARTS; i++) free(part[i]);
    return rc;
}

/* Interactive (or scripted) chat: the first user message is -i or -f, the
 * rest are stdin lines. The cache is kept between turns: each turn feeds
 * only the text that closes the last reply and opens the next one. Ctrl-C
 * ends a reply and returns to the prompt; at the prompt it ends the chat.
 * A message that cannot fit is refused and the chat goes on; the exit code
 * then says so (1). Empty messages are skipped. */
static int run_chat(Run *r, Gen *g) {
    Chat c = {0};
    Ids u = {0}, feed = {0}, reply = {0};
    char *line = NULL, *sys = chat_system(r->a.system);
    size_t cap = 0, n = r->text_len;
    const char *user = r->text;
    int rc = 0, refused = 0, fed = 0, tty = isatty(0);
    g->reply = &reply;
    const char *missing = chat_missing_token(g->tok);
    if (missing) {
        fprintf(stderr, "error: chat: %s: expected the special token %s in the tokenizer (the chat template's "
                "turns), found none: use -m generate\n", r->src.path, missing);
        rc = 1;
    }
    if (rc == 0 &&
        (!sys || encode(g->tok, sys, strlen(sys), &c.sys) || encode(g->tok, CHAT_CLOSE, strlen(CHAT_CLOSE), &c.close))) {
        if (!sys) fprintf(stderr, "error: out of memory in the chat\n");
        rc = 1;
    }
    if (rc == 0 && r->a.session) rc = session_load(r, g, &c);
    while (rc == 0) {
        if (!user) {
            if (tty) fprintf(stderr, "> ");
            g_interrupted = 0;
            if (!(user = read_line(&line, &cap, &n))) break;
        }
        if (n > MAX_TEXT_BYTES) {
            fprintf(stderr, "error: a message of %zu bytes: expected at most 64 MiB\n", n);
            refused++, user = NULL;
            continue;
        }
        /* Qwen3.5's generation prompt opens the think block itself */
        char *text = !n ? NULL : r->m.cfg.arch == ARCH_QWEN35 ? chat_user_open_think(user, r->a.think)
                                                              : chat_user(user, r->a.think);
        user = NULL;
        if (!n) continue;
        int f = !text || encode(g->tok, text, strlen(text), &u) ? -1 : chat_feed(r, g, &c, &u, &feed);
        free(text);
        if (f > 0) { refused++; continue; }
        reply.n = 0;
        const int before = f ? 0 : kv_cache_len(g->kv);
        if (f == 0 && generate(g, feed.v, feed.n, r->a.n) == 1) rc = 1;
        if (f == 0) printf("\n"), fflush(stdout);
        fed |= f == 0;
        if (f < 0 || chat_record(g, &c, &u, &feed, &reply, before)) {
            fprintf(stderr, "error: out of memory in the chat\n");
            rc = 1;
        }
    }
    /* written once, at the end (Ctrl-C at the prompt and the end of input
     * come here): each write is the whole cache, flushed to the disk. A
     * chat that ended on an error, or fed nothing, leaves the file as it was */
    if (rc == 0 && fed && r->a.session && session_save(r, g, &c)) rc = 1;
    else if (rc == 1 && fed && r->a.session)
        fprintf(stderr, "--session %s: not written, the chat ended on an error (the file as it was is kept)\n",
                r->a.session);
    if (rc == 0 && g_interrupted) rc = 130;
    if (rc == 0 && refused) rc = 1;
    for (int i = 0; i < c.n_turns; i++) free(c.turns[i].v);
    free(c.turns), free(c.sys.v), free(c.close.v), free(u.v), free(feed.v), free(reply.v), free(line), free(sys);
    g->reply = NULL;
    return rc;
}

/* generate and chat: sampler, drafter, then the loop. */
static int run_generate(Run *r, KVCache *kv) {
    Sampler smp = {0};
    KVCache mkv = {0};
    Spec sp;
    Gen g = {.m = &r->m, .kv = kv, .tok = &r->tok, .smp = &smp, .st = &r->st};
    for (int i = 0; i < r->m.cfg.n_eos; i++) g.stops[g.n_stops++] = r->m.cfg.eos_ids[i];
    const int chat = strcmp(r->a.mode, "chat") == 0;
    if (chat) {
        int im_end = tok_find(&r->tok, "<|im_end|>");
        if (im_end >= 0) g.stops[g.n_stops++] = im_end;
    }
    g.logits = malloc((size_t)r->m.cfg.vocab_size * sizeof(float));
    int rc = !g.logits || sampler_open(r, &smp) || spec_open(r, &g, &mkv, &sp);
    if (!g.logits) fprintf(stderr, "error: out of memory\n");
    catch_sigint();
    if (rc == 0 && chat) rc = run_chat(r, &g);
    else if (rc == 0) {
        fwrite(r->text, 1, r->text_len, stdout);
        rc = generate(&g, r->ids.v, r->ids.n, r->a.n);
        printf("\n");
        fflush(stdout);
    }
    if (g.spec) {
        spec_print_stats(g.spec, stderr);
        r->st.spec_accept = g.spec->drafted ? (double)spec_accepted(g.spec) / g.spec->drafted : 0;
        r->st.spec_per_step = g.spec->steps ? (double)g.spec->emitted / g.spec->steps : 0;
        r->st.has_spec = 1;
        spec_free(g.spec);
    }
    if (rc != 1 && (r->st.prefill_tokens || r->st.decode_tokens)) print_stats(r, kv);
    if (mkv.k || mkv.dev) kv_cache_free(&mkv);
    free(g.hidden);
    sampler_free(&smp);
    free(g.logits);
    return rc;
}

/* --------------------------------------------------------------- steps */

/* The model's tokenizer, from its folder or its single file. */
static int open_tokenizer(Run *r) {
    char err[1024], path[4200], cpath[4200];
    size_t n = 0, cn = 0;
    int absent, cabsent;
    char *json = source_read(&r->src, "tokenizer.json", TOK_MAX_JSON, &n, &absent, err, sizeof err), *cfg = NULL;
    if (!json && absent)
        snprintf(err, sizeof err, "%s%s: no tokenizer.json (every model has one)", r->src.dir ? r->src.dir : r->src.path,
                 r->src.dir ? "/" : "");
    if (json) cfg = source_read(&r->src, "tokenizer_config.json", TOK_MAX_CONFIG, &cn, &cabsent, err, sizeof err);
    int rc = !json || (!cfg && !cabsent);
    if (!rc) {
        snprintf(path, sizeof path, r->src.dir ? "%s/tokenizer.json" : "%s[tokenizer.json]", r->src.path);
        snprintf(cpath, sizeof cpath, r->src.dir ? "%s/tokenizer_config.json" : "%s[tokenizer_config.json]",
                 r->src.path);
        rc = tok_load(&r->tok, json, n, path, cfg, cn, cpath, err, sizeof err) != 0;
    }
    if (rc) fprintf(stderr, "error: %s\n", err);
    free(json);
    free(cfg);
    return rc;
}

/* The text to work on: -i, -f, or the default prompt (none in chat), and
 * its tokens. */
static int read_text(Run *r) {
    if (r->a.prompt_file) {
        char err[1024];
        r->text = file_read_any(r->a.prompt_file, MAX_TEXT_BYTES, &r->text_len, err, sizeof err);
        if (!r->text) { fprintf(stderr, "error: -f %s\n", err); return 1; }
    } else if (r->a.prompt || (strcmp(r->a.mode, "chat") != 0 && strcmp(r->a.mode, "serve") != 0)) {
        const char *p = r->a.prompt ? r->a.prompt : DEFAULT_PROMPT;
        r->text = strdup(p);
        r->text_len = strlen(p);
        if (!r->text) { fprintf(stderr, "error: out of memory\n"); return 1; }
    }
    if (!strcmp(r->a.mode, "chat") || !strcmp(r->a.mode, "detokenize") || !r->text) return 0;
    return encode(&r->tok, r->text, r->text_len, &r->ids) ? 1 : 0;
}

/* The KV scheme(s) from -kv, -ctk and -ctv; -1 with err. */
static int parse_schemes(Run *r, char *err, size_t errlen) {
    const Args *a = &r->a;
    if (!strcmp(a->mode, "compare")) {
        const int other = a->wq_q8 || a->act_bf16;
        kv_spec_parse("f32", &r->specs[0], err, errlen);
        r->n_specs = 1;
        /* with other weights, f32 comes again as the first scheme: the weights' cost alone */
        if (other) r->specs[r->n_specs++] = r->specs[0];
        if (!a->kv) {
            /* every scheme; under -dev cuda, every one the GPU takes */
            const int gpu = a->dev && !strcmp(a->dev, "cuda");
            for (int i = 0; i < kv_n_schemes; i++) {
                char e[256];
                if (!strcmp(kv_schemes[i]->name, "f32")) continue;
                if (kv_spec_parse(kv_schemes[i]->name, &r->specs[r->n_specs], err, errlen)) return -1;
                if (!gpu || !gpu_supports_kv(&r->specs[r->n_specs], e, sizeof e)) r->n_specs++;
            }
        } else {
            char buf[1024];
            snprintf(buf, sizeof buf, "%s", a->kv);
            char *save = NULL;
            for (char *it = strtok_r(buf, ",", &save); it; it = strtok_r(NULL, ",", &save)) {
                if (r->n_specs >= 64) {
                    snprintf(err, errlen, "-kv: expected at most 63 schemes to compare, found more");
                    return -1;
                }
                KVSpec *s = &r->specs[r->n_specs];
                if (kv_spec_parse(it, s, err, errlen)) return -1;
                if (!(s->k == r->specs[0].k && s->v == r->specs[0].v)) r->n_specs++;
            }
        }
        if (r->n_specs == 1 + other) {
            snprintf(err, errlen, "-kv %s: expected schemes to compare besides the f32 reference", a->kv);
            return -1;
        }
        r->spec = r->specs[0];
        return 0;
    }
    if (kv_spec_parse(a->kv ? a->kv : "f16", &r->spec, err, errlen)) return -1;
    /* -ctk and -ctv name one scheme each, replacing that half of -kv's */
    const char *half[2] = {a->ctk, a->ctv}, *name[2] = {"-ctk", "-ctv"};
    for (int i = 0; i < 2; i++) {
        KVSpec s;
        char e[512];
        if (!half[i]) continue;
        if (strchr(half[i], '/') || kv_spec_parse(half[i], &s, e, sizeof e)) {
            /* kv_spec_parse's lines start with "-kv": name the option given */
            snprintf(err, errlen, "%s: expected one scheme, found '%s'%s%s", name[i], half[i],
                     strchr(half[i], '/') ? "" : ": ", strchr(half[i], '/') ? "" : e + (strncmp(e, "-kv", 3) ? 0 : 5));
            return -1;
        }
        if (i == 0) r->spec.k = s.k, r->spec.ko = s.ko;
        else r->spec.v = s.v, r->spec.vo = s.vo;
    }
    return 0;
}

/* Whether the run's options ask for what the GPU path does not take: 0,
 * or 1 with a line in err (the usage error of -dev cuda; auto takes the
 * CPU then). What the model's config rules out is gpu_supports'. */
static int gpu_refuses_options(const Run *r, char *err, size_t errlen) {
    const Args *a = &r->a;
    if (!strcmp(a->mode, "serve"))
        snprintf(err, errlen, "-dev cuda: -m %s runs on the CPU only (so far; use -dev cpu)", a->mode);
    else if (a->session)
        snprintf(err, errlen, "-dev cuda: --session: a cache on the GPU cannot be saved yet (use -dev cpu)");
    else if (a->act_bf16) snprintf(err, errlen, "-dev cuda: -act bf16 is the CPU's bf16 dot product mode (use -act f32 or "
                                   "-dev cpu)");
    else {
        /* compare: every scheme it lists; kvstats: none (the GPU holds its
         * f32 cache, the CPU quantizes and attends the scheme's) */
        const int n = !strcmp(a->mode, "compare") ? r->n_specs : !strcmp(a->mode, "kvstats") ? 0 : 1;
        for (int i = 0; i < n; i++)
            if (gpu_supports_kv(n > 1 ? &r->specs[i] : &r->spec, err, errlen)) return 1;
        return 0;
    }
    return 1;
}

/* -dev: 1 when the forward goes to the GPU, else 0; -1 with err when
 * -dev cuda asks for what cannot run there (auto takes the CPU then). */
static int choose_device(const Run *r, char *err, size_t errlen) {
    const char *dev = r->a.dev ? r->a.dev : "auto";
    if (!strcmp(dev, "cpu")) return 0;
    char why[600] = "";
    CudaInfo info;
    if (!cuda_built() || !cuda_device_count()) cuda_open(&info, why, sizeof why);
    else if (!gpu_refuses_options(r, why, sizeof why)) {
        /* compare: every scheme it lists, against this config (a head dim
         * rules some out); kvstats: the config alone, as above */
        const int kvstats = !strcmp(r->a.mode, "kvstats"), n = !strcmp(r->a.mode, "compare") ? r->n_specs : 1;
        for (int i = 0; i < n && !why[0]; i++)
            gpu_supports(&r->cfg, kvstats ? NULL : n > 1 ? &r->specs[i] : &r->spec, why, sizeof why);
    }
    if (!why[0]) return 1;
    if (!dev_is_cuda(r)) return 0;
    snprintf(err, errlen, "%s", why);
    return -1;
}

/* config.json, the vocabulary check, the device, the weights (-wq, -act)
 * and generation_config.json. */
static int open_model(Run *r) {
    char err[1024];
    /* the vocabulary check comes first: a mismatched tokenizer would also
     * show up as an embedding shape error, which names the wrong culprit */
    if (source_config(&r->src, &r->cfg, err, sizeof err)) goto fail;
    if (tok_vocab_size(&r->tok) > r->cfg.vocab_size) {
        snprintf(err, sizeof err, "%s: vocab_size %d in config.json is smaller than the tokenizer's %d tokens",
                 r->src.path, r->cfg.vocab_size, tok_vocab_size(&r->tok));
        goto fail;
    }
    const int gpu = choose_device(r, err, sizeof err);
    if (gpu < 0) goto fail;
    if (!gpu && r->a.wmem && strcmp(r->a.wmem, "auto"))
        fprintf(stderr, "note: -wmem %s: the run is on the CPU, where it does not apply\n", r->a.wmem);
    /* weights read into memory (faster decode) unless RUN_MMAP=1, or -wq q8
     * converts them anyway (a copy would only leave the originals
     * resident), or the GPU takes them as stored, straight from the mapping */
    const char *keep = getenv("RUN_MMAP");
    const int mapped = gpu || r->a.wq_q8 || (keep && strcmp(keep, "1") == 0);
    if (model_load_source(&r->m, &r->src, (mapped ? MODEL_MAPPED : 0) | (r->a.act_bf16 ? MODEL_ACT_BF16 : 0), err,
                          sizeof err))
        goto fail;
    r->have_model = 1;
    if (r->m.layers_stored > r->cfg.n_layers)
        fprintf(stderr, "warning: %s: the checkpoint holds %d layers, config.json's num_hidden_layers runs the first "
                "%d\n", r->src.path, r->m.layers_stored, r->cfg.n_layers);
    /* -wq q8 first: the GPU takes the q8 blocks as they are */
    if (r->a.wq_q8) {
        double t0 = now();
        if (model_quantize(&r->m, MODEL_MAIN, err, sizeof err)) goto fail;
        fprintf(stderr, "weights: q8, converted in %.2f s\n", now() - t0);
    }
    if (gpu) {
        double t0 = now();
        if (model_to_gpu(&r->m, wmem_mode(r), err, sizeof err)) {
            /* auto: where the GPU cannot take the model (its memory, say),
             * the CPU still can; but -wmem map asked for the GPU's way */
            if (dev_is_cuda(r) || wmem_mode(r) == GPU_WMEM_MAP) goto fail;
            fprintf(stderr, "note: running on the CPU: %s\n", err);
        } else {
            char hb[32], hm[32];
            human_bytes((double)gpu_model_bytes(r->m.gpu), hb, sizeof hb);
            human_bytes((double)gpu_model_mapped_bytes(r->m.gpu), hm, sizeof hm);
            if (gpu_model_mapped_bytes(r->m.gpu))
                fprintf(stderr, "device: %s, weights %s read where mapped (-wmem map), %s copied, in %.2f s\n",
                        gpu_model_device(r->m.gpu), hm, hb, now() - t0);
            else
                fprintf(stderr, "device: %s, weights %s uploaded in %.2f s\n", gpu_model_device(r->m.gpu), hb,
                        now() - t0);
        }
    }
    if (source_generation(&r->src, &r->m.cfg, &r->gd, err, sizeof err)) goto fail;
    return 0;
fail:
    fprintf(stderr, "error: %s\n", err);
    return 1;
}

/* The context: -c, else per mode, never past the model's positions. */
static int choose_context(Run *r) {
    const char *mode = r->a.mode;
    int is_ppl = !strcmp(mode, "ppl"), per_text = !strcmp(mode, "logits") || !strcmp(mode, "kvstats");
    int n_gen = r->a.set_n && r->a.n >= 0 ? r->a.n : 64;
    int ctx = r->a.ctx ? r->a.ctx : is_ppl ? 512 : per_text ? (r->ids.n > 0 ? r->ids.n : 1)
                                  : !strcmp(mode, "compare") ? r->ids.n + n_gen : 4096;
    if (ctx > r->m.cfg.max_pos) {
        if (r->a.ctx)
            fprintf(stderr, "warning: -c %d is above the model's %d positions (max_position_embeddings): using %d\n",
                    ctx, r->m.cfg.max_pos, r->m.cfg.max_pos);
        ctx = r->m.cfg.max_pos;
    }
    r->ctx = ctx;
    if (per_text && r->ids.n > ctx) {
        fprintf(stderr, "error: prompt of %d tokens does not fit the context of %d (%s)\n", r->ids.n, ctx,
                ctx < r->m.cfg.max_pos ? "raise -c" : "the model's max_position_embeddings");
        return 1;
    }
    if (r->ids.n == 0 && strcmp(mode, "chat") != 0 && strcmp(mode, "serve") != 0) {
        fprintf(stderr, "error: the prompt is empty: nothing to %s\n", mode);
        return 1;
    }
    char err[256];
    if (model_check_input(&r->m, r->ids.v, r->ids.n, err, sizeof err)) {
        fprintf(stderr, "error: the prompt: %s\n", err);
        return 1;
    }
    return 0;
}

/* The cache, after checking it fits in memory: an absurd -c gets a line
 * about memory, not an allocation failure. */
static int open_cache(Run *r, KVCache *kv) {
    char err[1024];
    const double need = model_cache_bytes(&r->m, &r->spec, r->ctx);
    const double have = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
    if (have > 0 && need > have && !r->m.gpu) {
        char hn[32], hh[32];
        human_bytes(need, hn, sizeof hn);
        human_bytes(have, hh, sizeof hh);
        fprintf(stderr, "error: a context of %d positions needs %s of KV cache, more than this machine's %s of "
                        "memory (lower -c, or pick a smaller -kv scheme)\n", r->ctx, hn, hh);
        return 1;
    }
    int rc = model_kv_init(&r->m, kv, &r->spec, r->ctx, 0, err, sizeof err);
    /* auto: a cache the GPU has no room for goes to the CPU, and the model with it */
    if (rc && r->m.gpu && !dev_is_cuda(r)) {
        fprintf(stderr, "note: running on the CPU: %s\n", err);
        model_drop_gpu(&r->m);
        rc = model_kv_init(&r->m, kv, &r->spec, r->ctx, 0, err, sizeof err);
    }
    if (rc) {
        fprintf(stderr, "error: %s\n", err);
        return 1;
    }
    return 0;
}

static void print_model_line(const Run *r) {
    char kvname[128];
    const Config *c = &r->m.cfg;
    kv_spec_name(&r->spec, kvname, sizeof kvname);
    fprintf(stderr, "model %s: %d layers, hidden %d, heads %d/%d x %d, vocab %d%s; kv %s, context %d, %d threads, %s\n",
            r->src.path, c->n_layers, c->hidden, c->n_heads, c->n_kv_heads, c->head_dim, c->vocab_size,
            r->m.has_mtp ? ", MTP head" : "", kvname, r->ctx, omp_get_max_threads(),
            r->m.gpu ? "CUDA" : kernels_isa());
#if defined(__aarch64__)
    if (r->a.act_bf16) fprintf(stderr, "matmul inputs: bf16 (bfmlalt, bfmlalb)\n");
#else
    if (r->a.act_bf16) fprintf(stderr, "matmul inputs: bf16 (vdpbf16ps)\n");
#endif
}

/* The modes that need the weights and a cache. */
static int run_model_mode(Run *r) {
    const char *mode = r->a.mode;
    KVCache kv = {0};
    const int cache = strcmp(mode, "compare") && strcmp(mode, "kvstats") && strcmp(mode, "serve");
    if (open_model(r) || choose_context(r) || (cache && open_cache(r, &kv))) return 1;
    print_model_line(r);
    int rc = 0;
    if (!strcmp(mode, "compare")) rc = run_compare(r);
#ifdef USE_SERVE
    else if (!strcmp(mode, "serve")) rc = run_serve(r);
#endif
    else if (!strcmp(mode, "kvstats")) {
        char err[1024];
        if (kvstats_run(&r->m, &r->spec, r->ids.v, r->ids.n, stdout, err, sizeof err)) {
            fprintf(stderr, "error: %s\n", err);
            rc = 1;
        }
    } else if (!strcmp(mode, "ppl") || !strcmp(mode, "logits")) {
        catch_sigint();
        rc = !strcmp(mode, "ppl") ? run_ppl(r, &kv) : run_logits(r, &kv);
        if (rc != 1) print_stats(r, &kv);
    } else rc = run_generate(r, &kv);
    kv_cache_free(&kv);
    return rc;
}

int main(int argc, char **argv) {
    Run r;
    memset(&r, 0, sizeof r);
    int rc = parse_args(argc, argv, &r.a);
    if (rc) return rc == 1 ? 0 : 2;
    char err[1024], model_buf[4200];
    if (kernels_check_env(err, sizeof err)) return usage_error("%s", err);
    if (parse_schemes(&r, err, sizeof err)) return usage_error("%s", err);
    if (r.a.dev && !strcmp(r.a.dev, "cuda") && gpu_refuses_options(&r, err, sizeof err))
        return usage_error("%s", err);
    if (r.a.threads) omp_set_num_threads(r.a.threads);
    const char *path = r.a.model ? r.a.model : default_model(model_buf, sizeof model_buf);
    if (source_open(&r.src, path, err, sizeof err)) {
        fprintf(stderr, "error: %s\n", err);
        return 1;
    }
    const char *mode = r.a.mode;
    if (open_tokenizer(&r)) rc = 1;
    else if (!strcmp(mode, "pack")) rc = run_pack(&r);
    else if (read_text(&r)) rc = 1;
    else if (!strcmp(mode, "tokenize")) rc = run_tokenize(&r);
    else if (!strcmp(mode, "detokenize")) rc = run_detokenize(&r);
    else rc = run_model_mode(&r);
    if (r.have_model) model_free(&r.m);
    free(r.ids.v);
    free(r.text);
    tok_free(&r.tok);
    source_free(&r.src);
    return rc;
}
