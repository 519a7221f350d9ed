/* run.c: the command line and the generation loops, nothing else.
 *
 *   ./run [MODEL_DIR] [options]        (see usage() or README.md)
 *
 * Reads a Hugging Face Qwen3 snapshot (model/), tokenizes (tokenizer/),
 * runs the forward pass over a KV cache in the chosen scheme (kv/), samples
 * (sample/), and prints text on stdout, progress and one closing `stats:`
 * line on stderr. Exit codes: 0 ok, 1 runtime error, 2 usage error.
 */
#include <errno.h>
#include <math.h>
#include <omp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "eval/compare.h"
#include "format/file.h"
#include "model/model.h"
#include "sample/sampler.h"
#include "spec/spec.h"
#include "tokenizer/chat.h"
#include "tokenizer/tokenizer.h"

/* The model run with no MODEL_DIR, relative to the executable's directory. */
#define DEFAULT_MODEL "models/qwen3-kjv-mtp"
#define DEFAULT_PROMPT "In the beginning"

typedef struct {
    const char *model, *prompt, *prompt_file, *mode, *system, *kv, *out;
    int n, top_k, ctx, threads, think, spec; /* spec: -1 = default */
    int wq_q8, draft_q8;  /* -wq, -wq-draft: 1 = q8 */
    int act_bf16;         /* -act: 1 = bf16 */
    float temp, top_p, min_p;
    unsigned long long seed;
    int set_temp, set_top_p, set_top_k, set_min_p, set_seed, set_n, set_kv;
} Args;

typedef struct {
    double prefill_s, decode_s;
    long prefill_tokens, decode_tokens;
    size_t kv_bytes;
    int has_spec;
    double spec_accept;   /* accepted / drafted */
} Stats;

static void usage(FILE *f) {
    fprintf(f,
            "usage: ./run [MODEL_DIR] [options]\n"
            "  MODEL_DIR        a Hugging Face Qwen3 snapshot (config.json, *.safetensors, tokenizer.json);\n"
            "                   default: the model shipped in the repo (" DEFAULT_MODEL ")\n"
            "  -m MODE          generate (default) | chat | tokenize | logits | ppl | compare | kvstats\n"
            "  -i TEXT          prompt (generate, tokenize), first user message (chat)\n"
            "  -f FILE          read the prompt / text from FILE\n"
            "  -n N             tokens to generate (default 256; chat: per reply)\n"
            "  -t T             temperature, 0 = greedy (default: generation_config.json, else 0.8)\n"
            "  -p P             top-p (default: generation_config.json, else 0.95)\n"
            "  -k K             top-k, 0 = off (default: generation_config.json, else 40)\n"
            "  -mp P            min-p, 0 = off (default: generation_config.json, else 0.05)\n"
            "  -s SEED          random seed (default: time)\n"
            "  -c N             context length in tokens (default 4096, capped by the model; ppl: window, 512)\n"
            "  -T N             threads (default: OpenMP's, usually all cores)\n"
            "  -kv SCHEME       KV cache storage: one scheme for K and V, or K,V (default f16);\n"
            "                   compare: a list a,b,... (K/V pairs as k/v), default every scheme\n"
            "  -y TEXT          system prompt (chat)\n"
            "  -think 0|1       chat: let the model think (default 1)\n"
            "  -spec N          speculative decoding with the model's MTP head, N drafts per step\n"
            "                   (default 3 when the model has one; 0 = off)\n"
            "  -wq TYPE         matmul weights: stored (as in the checkpoint, default) | q8 (converted\n"
            "                   at load to q8_0 blocks with f32 scales: 9/16 of bf16's bytes);\n"
            "                   compare: the schemes run on q8, the f32 reference on the stored ones\n"
            "  -act TYPE        matmul inputs: f32 (default, exact) | bf16 (rounded to bf16 for AVX-512 BF16's\n"
            "                   vdpbf16ps, like llama.cpp's bf16 path; logits move by about 0.5%%): prefill\n"
            "                   about 2x where vdpbf16ps has twice the FMA rate (AMD Zen 4; make bench shows\n"
            "                   both peaks); needs a bf16 checkpoint read into memory and that instruction;\n"
            "                   compare: the schemes run on bf16 inputs, the f32 reference on f32 ones\n"
            "  -wq-draft TYPE   the MTP drafter's weights: q8 (default; with AVX-512 VNNI its activations\n"
            "                   are quantized to q8 too, for integer dot products) | stored; greedy output\n"
            "                   is the same either way, sampled output keeps the main model's distribution\n"
            "  -o FILE          output file (logits: float32 [n_tokens, vocab]; compare: SVG plot)\n"
            "  -h               this help\n"
            "KV schemes (bits per value at head_dim 128):\n");
    KVOpts o = {0, 0};
    for (int i = 0; i < kv_n_schemes; i++)
        fprintf(f, "  %-8s %6.3f  %s\n", kv_schemes[i]->name, kv_schemes[i]->bits(128, &o), kv_schemes[i]->desc);
    fprintf(f, "environment: RUN_ISA=avx512|avx2|ref forces a lower kernel level; RUN_MMAP=1 reads the weights\n"
               "  where the files are mapped instead of copying them into memory in huge pages (where\n"
               "  the AVX-512 kernels get bf16 relaid in 32-row panels, their faster layout)\n");
    fprintf(f, "exit codes: 0 ok, 1 runtime error, 2 usage error\n");
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
 * a check of the first character. Every numeric flag is >= 0. */
static int is_number(const char *s) {
    if (!(*s >= '0' && *s <= '9') && !(*s == '.' && s[1] >= '0' && s[1] <= '9')) return 0;
    for (; *s; s++)
        if (!((*s >= '0' && *s <= '9') || *s == '.' || *s == 'e' || *s == 'E' || *s == '-' || *s == '+')) return 0;
    return 1;
}

static int parse_int(const char *s, long lo, long hi, long *out) {
    char *end;
    if (!is_number(s)) return -1;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

static int parse_float(const char *s, float lo, float hi, float *out) {
    char *end;
    if (!is_number(s)) return -1;
    errno = 0;
    float v = strtof(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi)) return -1;
    *out = v;
    return 0;
}

/* 0 ok, 1 help printed, 2 usage error (message printed). */
static int parse_args(int argc, char **argv, Args *a) {
    memset(a, 0, sizeof *a);
    a->mode = "generate";
    a->kv = "f16";
    a->n = 256;
    a->think = 1;
    a->spec = -1;
    a->draft_q8 = 1;
    int i = 1;
    if (i < argc && argv[i][0] != '-') a->model = argv[i++];
    for (; i < argc; i++) {
        const char *f = argv[i];
        if (strcmp(f, "-h") == 0 || strcmp(f, "--help") == 0) { usage(stdout); return 1; }
        if (f[0] != '-' || i + 1 >= argc) return usage_error("expected a flag with a value, found '%s'", f);
        const char *v = argv[++i];
        long l;
        if (strcmp(f, "-i") == 0) a->prompt = v;
        else if (strcmp(f, "-f") == 0) a->prompt_file = v;
        else if (strcmp(f, "-m") == 0) a->mode = v;
        else if (strcmp(f, "-y") == 0) a->system = v;
        else if (strcmp(f, "-kv") == 0) a->kv = v, a->set_kv = 1;
        else if (strcmp(f, "-o") == 0) a->out = v;
        else if (strcmp(f, "-n") == 0) {
            if (parse_int(v, 0, 1 << 30, &l)) return usage_error("-n: expected a count >= 0, found '%s'", v);
            a->n = (int)l;
            a->set_n = 1;
        } else if (strcmp(f, "-k") == 0) {
            if (parse_int(v, 0, 1 << 30, &l)) return usage_error("-k: expected an integer >= 0, found '%s'", v);
            a->top_k = (int)l;
            a->set_top_k = 1;
        } else if (strcmp(f, "-c") == 0) {
            if (parse_int(v, 1, 1 << 24, &l)) return usage_error("-c: expected a context length >= 1, found '%s'", v);
            a->ctx = (int)l;
        } else if (strcmp(f, "-T") == 0) {
            if (parse_int(v, 1, 1024, &l)) return usage_error("-T: expected a thread count in 1..1024, found '%s'", v);
            a->threads = (int)l;
        } else if (strcmp(f, "-spec") == 0) {
            if (parse_int(v, 0, SPEC_MAX, &l)) return usage_error("-spec: expected a draft count in 0..%d, found '%s'", SPEC_MAX, v);
            a->spec = (int)l;
        } else if (strcmp(f, "-wq") == 0 || strcmp(f, "-wq-draft") == 0) {
            int q8 = strcmp(v, "q8") == 0;
            if (!q8 && strcmp(v, "stored") != 0) return usage_error("%s: expected stored or q8, found '%s'", f, v);
            if (strcmp(f, "-wq-draft") == 0) a->draft_q8 = q8;
            else a->wq_q8 = q8;
        } else if (strcmp(f, "-act") == 0) {
            if (strcmp(v, "bf16") && strcmp(v, "f32")) return usage_error("-act: expected f32 or bf16, found '%s'", v);
            a->act_bf16 = strcmp(v, "bf16") == 0;
        } else if (strcmp(f, "-think") == 0) {
            if (parse_int(v, 0, 1, &l)) return usage_error("-think: expected 0 or 1, found '%s'", v);
            a->think = (int)l;
        } else if (strcmp(f, "-s") == 0) {
            char *end;
            errno = 0;
            a->seed = strtoull(v, &end, 10);
            if (errno || end == v || *end || !is_number(v)) return usage_error("-s: expected a seed >= 0, found '%s'", v);
            a->set_seed = 1;
        } else if (strcmp(f, "-t") == 0) {
            if (parse_float(v, 0, 100, &a->temp)) return usage_error("-t: expected a temperature in [0, 100], found '%s'", v);
            a->set_temp = 1;
        } else if (strcmp(f, "-p") == 0) {
            if (parse_float(v, 0, 1, &a->top_p) || a->top_p <= 0) return usage_error("-p: expected top-p in (0, 1], found '%s'", v);
            a->set_top_p = 1;
        } else if (strcmp(f, "-mp") == 0) {
            if (parse_float(v, 0, 1, &a->min_p)) return usage_error("-mp: expected min-p in [0, 1], found '%s'", v);
            a->set_min_p = 1;
        } else
            return usage_error("unknown flag '%s'", f);
    }
    const char *modes[] = {"generate", "chat", "tokenize", "logits", "ppl", "compare", "kvstats"};
    int ok = 0;
    for (size_t k = 0; k < sizeof modes / sizeof modes[0]; k++) ok |= strcmp(a->mode, modes[k]) == 0;
    if (!ok) return usage_error("-m: expected generate, chat, tokenize, logits, ppl, compare or kvstats, found '%s'", a->mode);
    if (a->prompt && a->prompt_file) return usage_error("give the prompt with -i or -f, not both");
    int scores = !strcmp(a->mode, "logits") || !strcmp(a->mode, "ppl") || !strcmp(a->mode, "compare") ||
                 !strcmp(a->mode, "kvstats");
    if (scores && !a->prompt && !a->prompt_file)
        return usage_error("-m %s needs a text (-f FILE or -i TEXT)", a->mode);
    if (!strcmp(a->mode, "logits") && !a->out) return usage_error("-m logits needs -o FILE");
    if (a->act_bf16 && a->wq_q8) return usage_error("-act bf16 runs on bf16 weights as stored: not with -wq q8");
    return 0;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* A prompt file may be a pipe or /dev/stdin, so any readable file is taken,
 * up to this size: 64 MiB of text is over 10 M tokens, past any context. */
#define MAX_PROMPT_BYTES (64u << 20)

/* Reads a whole prompt file; NULL with a message on stderr. */
static char *read_file(const char *path, size_t *len) {
    char err[600];
    char *buf = file_read_any(path, MAX_PROMPT_BYTES, len, err, sizeof err);
    if (!buf) fprintf(stderr, "error: -f %s\n", err);
    return buf;
}

/* -m compare's list: f32 (the reference) first, then the given specs, or
 * every registered scheme. With other weights (-wq) the reference keeps the
 * stored ones and f32 comes again as the first scheme: the weights' cost alone. */
static int parse_compare_list(const char *list, int other_weights, KVSpec *specs, int *n, char *err, size_t errlen) {
    kv_spec_parse("f32", &specs[0], err, errlen);
    *n = 1;
    if (other_weights) specs[(*n)++] = specs[0];
    if (!list) {
        for (int i = 0; i < kv_n_schemes; i++)
            if (strcmp(kv_schemes[i]->name, "f32") != 0 && kv_spec_parse(kv_schemes[i]->name, &specs[(*n)++], err, errlen))
                return -1;
        return 0;
    }
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", list);
    char *save = NULL;
    for (char *item = strtok_r(buf, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        if (*n >= 64) { snprintf(err, errlen, "-kv: too many schemes to compare (64 rows at most, the f32 reference included)"); return -1; }
        if (kv_spec_parse(item, &specs[*n], err, errlen)) return -1;
        if (!(specs[*n].k == specs[0].k && specs[*n].v == specs[0].v)) (*n)++;
    }
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

static void print_stats(const Stats *s) {
    fprintf(stderr, "stats: prefill_tokens=%ld prefill_tps=%.2f decode_tokens=%ld decode_tps=%.2f kv_bytes=%zu",
            s->prefill_tokens, s->prefill_s > 0 ? s->prefill_tokens / s->prefill_s : 0.0, s->decode_tokens,
            s->decode_s > 0 ? s->decode_tokens / s->decode_s : 0.0, s->kv_bytes);
    if (s->has_spec) fprintf(stderr, " spec_accept=%.4f", s->spec_accept);
    fprintf(stderr, "\n");
}

/* Encodes text; returns ids (malloc'd) and their count, NULL on failure. */
static int *encode(const Tokenizer *tok, const char *text, size_t len, int *n) {
    int cap = (int)(3 * len + 16);
    int *ids = malloc((size_t)cap * sizeof(int));
    *n = ids ? tok_encode(tok, text, len, ids, cap) : -1;
    if (*n < 0) { free(ids); fprintf(stderr, "error: tokenizer failed on the prompt\n"); return NULL; }
    return ids;
}

typedef struct {
    Model *m;
    KVCache *kv;
    Tokenizer *tok;
    Sampler *smp;
    Stats *st;
    Spec *spec;         /* NULL: plain decoding */
    float *logits;      /* [V] logits of the last position */
    float *hidden;      /* [ctx, H] prefill hidden states, for the MTP head */
    int stops[CFG_MAX_EOS + 1], n_stops;
} Gen;

static int is_stop(const Gen *g, int id) {
    for (int i = 0; i < g->n_stops; i++)
        if (g->stops[i] == id) return 1;
    return 0;
}

/* Prints one token, never half a UTF-8 character. */
static void emit(Gen *g, TokStream *ts, char *buf, size_t cap, int id) {
    size_t w = tok_stream_put(g->tok, ts, id, buf, cap);
    if (w != (size_t)-1) fwrite(buf, 1, w, stdout);
    fflush(stdout);
}

/* Feeds ids (prefill), then samples up to n tokens, printing them. The
 * caches end as plain decoding leaves them: every emitted token but the
 * last one fed. Returns 0 ok (a full context only ends the reply), 1 on error. */
static int generate(Gen *g, const int *ids, int n_ids, int n) {
    char err[512];
    if (kv_cache_len(g->kv) + n_ids > g->kv->cap) {
        fprintf(stderr, "error: prompt of %d tokens does not fit the context of %d (%d already used; raise -c)\n",
                n_ids, g->kv->cap, kv_cache_len(g->kv));
        return 1;
    }
    double t0 = now();
    if (model_forward(g->m, g->kv, ids, n_ids, g->logits, 0, g->spec ? g->hidden : NULL, err, sizeof err) ||
        (g->spec && spec_prefill(g->spec, g->hidden, ids, n_ids, err, sizeof err))) {
        fprintf(stderr, "error: %s\n", err);
        return 1;
    }
    g->st->prefill_s += now() - t0;
    g->st->prefill_tokens += n_ids;
    TokStream ts = {0};
    size_t bufcap = tok_max_piece(g->tok) + 16;
    char *buf = malloc(bufcap);
    int out[SPEC_MAX + 1], x = sampler_sample(g->smp, g->logits), count = 0, rc = 0;
    t0 = now();
    /* x: the next token to print, not yet in the cache */
    while (!is_stop(g, x)) {
        emit(g, &ts, buf, bufcap, x);
        if (++count == n) break;
        int P = kv_cache_len(g->kv);
        if (P >= g->kv->cap) {
            fprintf(stderr, "\n[context full at %d tokens: stopping]\n", g->kv->cap);
            break;
        }
        if (!g->spec || P + 2 > g->kv->cap) {
            if (model_forward(g->m, g->kv, &x, 1, g->logits, 0, NULL, err, sizeof err)) { rc = 1; break; }
            g->st->decode_tokens++;
            x = sampler_sample(g->smp, g->logits);
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
    if (rc) fprintf(stderr, "error: %s\n", err);
    size_t w = tok_stream_flush(&ts, buf, bufcap);
    if (w != (size_t)-1) fwrite(buf, 1, w, stdout);
    fflush(stdout);
    free(buf);
    g->st->decode_s += now() - t0;
    return rc;
}

/* Perplexity over non-overlapping windows of ctx tokens; each window starts
 * from an empty cache and scores every token after its first. */
static int run_ppl(Model *m, KVCache *kv, const int *ids, int n, Stats *st) {
    const int V = m->cfg.vocab_size, B = 64;
    float *lg = malloc((size_t)B * V * sizeof(float));
    char err[512];
    double nll = 0;
    long count = 0;
    int nwin = (n + kv->cap - 1) / kv->cap;
    for (int w = 0, start = 0; start < n - 1; w++, start += kv->cap) {
        int len = n - start < kv->cap ? n - start : kv->cap;
        kv_cache_truncate(kv, 0);
        double t0 = now();
        for (int off = 0; off < len; off += B) {
            int nb = len - off < B ? len - off : B;
            if (model_forward(m, kv, ids + start + off, nb, lg, 1, NULL, err, sizeof err)) {
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
        }
        st->prefill_s += now() - t0;
        st->prefill_tokens += len;
        fprintf(stderr, "window %d/%d: %d tokens, ppl so far %.4f\n", w + 1, nwin, len, exp(nll / (count ? count : 1)));
    }
    free(lg);
    printf("ppl %.4f tokens %ld\n", exp(nll / (count ? count : 1)), count);
    return 0;
}

static int run_logits(Model *m, KVCache *kv, const int *ids, int n, const char *out, Stats *st) {
    const int V = m->cfg.vocab_size, B = 64;
    FILE *f = fopen(out, "wb");
    if (!f) { fprintf(stderr, "error: %s: cannot write: %s\n", out, strerror(errno)); return 1; }
    float *lg = malloc((size_t)B * V * sizeof(float));
    char err[512];
    double t0 = now();
    int rc = 0;
    for (int off = 0; off < n && rc == 0; off += B) {
        int nb = n - off < B ? n - off : B;
        if (model_forward(m, kv, ids + off, nb, lg, 1, NULL, err, sizeof err)) {
            fprintf(stderr, "error: %s\n", err);
            rc = 1;
        } else if (fwrite(lg, sizeof(float), (size_t)nb * V, f) != (size_t)nb * V) {
            fprintf(stderr, "error: %s: write failed\n", out);
            rc = 1;
        }
    }
    if (fclose(f) != 0 && rc == 0) { fprintf(stderr, "error: %s: write failed\n", out); rc = 1; }
    st->prefill_s = now() - t0;
    st->prefill_tokens = n;
    free(lg);
    if (rc == 0) fprintf(stderr, "wrote %d x %d logits to %s\n", n, V, out);
    return rc;
}

/* Interactive (or scripted) chat: the first user message is -i, the rest are
 * stdin lines. The KV cache is kept between turns: each turn feeds only the
 * text that closes the last reply and opens the next one. */
static int run_chat(Gen *g, const Args *a) {
    char line[65536];
    const char *user = a->prompt;
    int turn = 0, rc = 0;
    int tty = isatty(0);
    for (;;) {
        if (!user) {
            if (tty) fprintf(stderr, "> ");
            if (!fgets(line, sizeof line, stdin)) break;
            line[strcspn(line, "\n")] = 0;
            user = line;
        }
        char *text = turn == 0 ? chat_first_turn(a->system, user, a->think) : chat_next_turn(user, a->think);
        if (!text) { fprintf(stderr, "error: out of memory\n"); return 1; }
        int n;
        int *ids = encode(g->tok, text, strlen(text), &n);
        free(text);
        if (!ids) return 1;
        rc = generate(g, ids, n, a->n);
        free(ids);
        printf("\n");
        fflush(stdout);
        if (rc) break;
        user = NULL;
        turn++;
    }
    return rc;
}

int main(int argc, char **argv) {
    Args a;
    int rc = parse_args(argc, argv, &a);
    if (rc) return rc == 1 ? 0 : 2;
    if (a.threads) omp_set_num_threads(a.threads);
    char model_buf[4200], err[4600];
    const char *dir = a.model ? a.model : default_model(model_buf, sizeof model_buf);
    KVSpec spec, specs[64];
    int n_specs = 0, is_compare = strcmp(a.mode, "compare") == 0;
    const int other = a.wq_q8 || a.act_bf16; /* compare: matmuls other than the reference's */
    if (is_compare && parse_compare_list(a.set_kv ? a.kv : NULL, other, specs, &n_specs, err, sizeof err))
        return usage_error("%s", err);
    if (!is_compare && kv_spec_parse(a.kv, &spec, err, sizeof err)) return usage_error("%s", err);
    if (is_compare) spec = specs[0];

    Stats st = {0};
    Tokenizer tok;
    if (tok_init(&tok, dir, err, sizeof err)) {
        fprintf(stderr, "error: %s\n", err);
        return 1;
    }
    /* the text to work on: -i, -f, or the default prompt */
    char *text = NULL;
    size_t text_len = 0;
    if (a.prompt_file) {
        text = read_file(a.prompt_file, &text_len);
        if (!text) { tok_free(&tok); return 1; }
    } else if (strcmp(a.mode, "chat") != 0) {
        const char *p = a.prompt ? a.prompt : DEFAULT_PROMPT;
        text = strdup(p);
        text_len = strlen(p);
    }
    int n_ids = 0, *ids = NULL;
    if (text) {
        ids = encode(&tok, text, text_len, &n_ids);
        if (!ids) { free(text); tok_free(&tok); return 1; }
    }
    if (strcmp(a.mode, "tokenize") == 0) {
        for (int i = 0; i < n_ids; i++) printf(i ? " %d" : "%d", ids[i]);
        printf("\n");
        print_stats(&st);
        free(ids);
        free(text);
        tok_free(&tok);
        return 0;
    }

    /* the vocabulary check comes first: a mismatched tokenizer would also
     * show up as an embedding shape error, which names the wrong culprit */
    Model m;
    GenDefaults gd;
    Config cfg;
    int bad = config_load(&cfg, dir, err, sizeof err) != 0;
    if (!bad && tok_vocab_size(&tok) > cfg.vocab_size) {
        snprintf(err, sizeof err, "%s/config.json: vocab_size %d is smaller than the tokenizer's %d tokens", dir,
                 cfg.vocab_size, tok_vocab_size(&tok));
        bad = 1;
    }
    /* weights read into memory (faster decode) unless RUN_MMAP=1, or -wq q8
     * converts them anyway (a copy would only leave the originals resident) */
    const char *keep = getenv("RUN_MMAP");
    const int mapped = a.wq_q8 || (keep && strcmp(keep, "1") == 0);
    if (!bad && model_load(&m, dir, (mapped ? MODEL_MAPPED : 0) | (a.act_bf16 ? MODEL_ACT_BF16 : 0), err, sizeof err))
        bad = 1;
    if (!bad && a.wq_q8) {
        double t0 = now();
        if (model_quantize(&m, MODEL_MAIN, err, sizeof err)) {
            model_free(&m);
            bad = 1;
        } else {
            fprintf(stderr, "weights: q8, converted in %.2f s\n", now() - t0);
        }
    }
    if (!bad && config_load_generation(&m.cfg, &gd, dir, err, sizeof err)) {
        model_free(&m);
        bad = 1;
    }
    if (bad) {
        fprintf(stderr, "error: %s\n", err);
        free(ids);
        free(text);
        tok_free(&tok);
        return 1;
    }
    rc = 0;
    int is_ppl = strcmp(a.mode, "ppl") == 0, is_logits = strcmp(a.mode, "logits") == 0;
    int is_kvstats = strcmp(a.mode, "kvstats") == 0;
    int n_gen = a.set_n ? a.n : 64;
    int ctx = a.ctx ? a.ctx : is_ppl ? 512 : is_logits || is_kvstats ? (n_ids > 0 ? n_ids : 1)
                            : is_compare ? n_ids + n_gen : 4096;
    /* no mode runs past the positions the model was trained for */
    if (ctx > m.cfg.max_pos) {
        if (a.ctx)
            fprintf(stderr, "warning: -c %d is above the model's %d positions (max_position_embeddings): using %d\n",
                    ctx, m.cfg.max_pos, m.cfg.max_pos);
        ctx = m.cfg.max_pos;
    }
    if (rc == 0 && (is_logits || is_kvstats) && n_ids > ctx) {
        fprintf(stderr, "error: prompt of %d tokens does not fit the context of %d (raise -c)\n", n_ids, ctx);
        rc = 1;
    }
    if (rc == 0 && n_ids == 0 && strcmp(a.mode, "chat") != 0) {
        fprintf(stderr, "error: the prompt is empty: nothing to %s\n", a.mode);
        rc = 1;
    }
    KVCache kv = {0};
    if (rc == 0 && !is_compare && !is_kvstats && model_kv_init(&m, &kv, &spec, ctx, 0, err, sizeof err)) {
        fprintf(stderr, "error: %s\n", err);
        rc = 1;
    }
    if (rc == 0) {
        char kvname[128];
        kv_spec_name(&spec, kvname, sizeof kvname);
        fprintf(stderr, "model %s: %d layers, hidden %d, heads %d/%d x %d, vocab %d%s; kv %s, context %d, %d threads, %s\n",
                dir, m.cfg.n_layers, m.cfg.hidden, m.cfg.n_heads, m.cfg.n_kv_heads, m.cfg.head_dim, m.cfg.vocab_size,
                m.has_mtp ? ", MTP head" : "", kvname, ctx, omp_get_max_threads(), kernels_isa());
        if (a.act_bf16) fprintf(stderr, "matmul inputs: bf16 (vdpbf16ps)\n");
    }
    if (rc == 0 && is_compare) {
        CompareRow rows[64];
        /* the reference keeps the stored weights and f32 inputs: a second
         * load of the same files when m was converted or relaid for bf16
         * inputs, in memory (bf16 in panels), so that its numbers are those
         * of the same run without -wq or -act */
        Model ref;
        int two = a.wq_q8 || a.act_bf16;
        if (two && model_load(&ref, dir, 0, err, sizeof err)) {
            fprintf(stderr, "error: %s\n", err);
            rc = 1;
            two = 0;
        }
        const char *what = a.wq_q8 ? "q8" : "act bf16";
        if (rc == 0 && (compare_run(two ? &ref : &m, &m, what, specs, n_specs, ids, n_ids, ctx, n_gen, rows, err,
                                    sizeof err) ||
                        (a.out && compare_svg(a.out, rows, n_specs, dir, err, sizeof err)))) {
            fprintf(stderr, "error: %s\n", err);
            rc = 1;
        } else if (rc == 0) {
            compare_print(stdout, rows, n_specs, dir, n_ids < ctx - n_gen ? n_ids : ctx - n_gen);
            if (a.out) fprintf(stderr, "wrote %s\n", a.out);
        }
        if (two) model_free(&ref);
    } else if (rc == 0 && is_kvstats) {
        if (kvstats_run(&m, &spec, ids, n_ids, stdout, err, sizeof err)) {
            fprintf(stderr, "error: %s\n", err);
            rc = 1;
        }
    } else if (rc == 0 && is_ppl) rc = run_ppl(&m, &kv, ids, n_ids, &st);
    else if (rc == 0 && is_logits) rc = run_logits(&m, &kv, ids, n_ids, a.out, &st);
    else if (rc == 0) {
        /* sampling: flags, else generation_config.json, else llama.cpp's defaults */
        float temp = a.set_temp ? a.temp : gd.present ? (gd.do_sample ? (float)gd.temperature : 0) : 0.8f;
        float top_p = a.set_top_p ? a.top_p : gd.present ? (float)gd.top_p : 0.95f;
        int top_k = a.set_top_k ? a.top_k : gd.present ? gd.top_k : 40;
        float min_p = a.set_min_p ? a.min_p : gd.present ? (float)gd.min_p : 0.05f;
        unsigned long long seed = a.set_seed ? a.seed : (unsigned long long)time(NULL);
        fprintf(stderr, "sampling: temperature %.2f top-k %d top-p %.2f min-p %.2f seed %llu\n", temp, top_k, top_p,
                min_p, seed);
        Sampler smp;
        float *logits = malloc((size_t)m.cfg.vocab_size * sizeof(float));
        Gen g = {&m, &kv, &tok, &smp, &st, NULL, logits, NULL, {0}, 0};
        for (int i = 0; i < m.cfg.n_eos; i++) g.stops[g.n_stops++] = m.cfg.eos_ids[i];
        int n_draft = a.spec < 0 ? (m.has_mtp ? 3 : 0) : a.spec;
        if (n_draft > 0 && !m.has_mtp) {
            fprintf(stderr, "-spec %d: %s has no MTP head; decoding without speculation\n", n_draft, dir);
            n_draft = 0;
        }
        KVCache mkv = {0};
        Spec spec_state;
        if (sampler_init(&smp, m.cfg.vocab_size, temp, top_k, top_p, min_p, seed) || !logits) {
            fprintf(stderr, "error: out of memory\n");
            rc = 1;
        } else if (n_draft > 0) {
            g.hidden = malloc((size_t)ctx * m.cfg.hidden * sizeof(float));
            if (!g.hidden || (a.draft_q8 && model_quantize(&m, MODEL_DRAFT, err, sizeof err)) ||
                model_kv_init(&m, &mkv, &spec, ctx, 1, err, sizeof err) ||
                spec_init(&spec_state, &m, &kv, &mkv, &smp, n_draft, err, sizeof err)) {
                fprintf(stderr, "error: %s\n", g.hidden ? err : "out of memory");
                rc = 1;
            } else {
                g.spec = &spec_state;
                fprintf(stderr, "speculative decoding: %d MTP drafts per step, drafter weights %s\n", n_draft,
                        a.draft_q8 ? "q8" : a.wq_q8 ? "as stored, output matrix q8 (-wq)" : "as stored");
            }
        }
        if (rc == 0 && strcmp(a.mode, "chat") == 0) {
            int im_end = tok_find(&tok, "<|im_end|>");
            if (im_end >= 0) g.stops[g.n_stops++] = im_end;
            rc = run_chat(&g, &a);
        } else if (rc == 0) {
            fwrite(text, 1, text_len, stdout);
            rc = generate(&g, ids, n_ids, a.n);
            printf("\n");
            fflush(stdout);
        }
        if (g.spec) {
            spec_print_stats(g.spec, stderr);
            st.spec_accept = g.spec->drafted ? (double)spec_accepted(g.spec) / g.spec->drafted : 0;
            st.has_spec = 1;
            spec_free(g.spec);
        }
        if (mkv.k) kv_cache_free(&mkv);
        free(g.hidden);
        sampler_free(&smp);
        free(logits);
    }
    st.kv_bytes = kv.k ? kv_cache_bytes(&kv) : 0;
    print_stats(&st);
    kv_cache_free(&kv);
    model_free(&m);
    free(ids);
    free(text);
    tok_free(&tok);
    return rc;
}
