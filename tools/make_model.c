/* make_model.c: writes a random-weight Qwen3 checkpoint of a released shape,
 * in Hugging Face layout, deterministically from a seed. The benchmarks run
 * on it: speed depends on the shapes and dtypes, not on the values.
 *
 * Data flow: outside the engine and linked to none of it: it writes the
 * files that model/source.c, format/safetensors.c and tokenizer/ read, in
 * the safetensors format (https://github.com/huggingface/safetensors):
 *
 *   | u64 LE header length N | N bytes of JSON header | bf16 tensor data |
 *
 *   build/make_model --shape 0.6b|1.7b|4b|8b|14b|32b|tiny [--mtp] [--seed N]
 *                    [--layers N] [--max-shard-mb N] [--tokenizer DIR] --out DIR
 *
 * DIR gets config.json (the real Qwen3 config of that shape, key for key;
 * --mtp adds num_nextn_predict_layers: 1), generation_config.json, the full
 * Qwen3 tokenizer (tokenizer.json gunzipped from DIR_TOK/tokenizer.json.gz
 * through `gzip -dc`, tokenizer_config.json copied; DIR_TOK defaults to
 * tests/data/tokenizer/full, so run it from the repo root), and bf16 weights:
 * one model.safetensors, or shards of at most --max-shard-mb (default 4000,
 * about what Hugging Face writes) plus model.safetensors.index.json once the
 * weights exceed that. Shapes are shared/specs/qwen3.md's table; "tiny" is
 * ours (2 layers, hidden 256, 4/2 heads x 128, ffn 768, full vocabulary) for
 * quick checks. --layers overrides the layer count of any shape.
 *
 * Values: matrices ~ N(0, 0.02^2) (the Qwen3 initializer_range), RMSNorm
 * weights 1 + N(0, 0.02^2), rounded to bf16 with round-to-nearest-even. The
 * normal deviate is the sum of four 16-bit uniforms taken from one xorshift64*
 * output, centred and scaled (Irwin-Hall n = 4: unit variance, tails cut at
 * 3.46 sigma), which is several times faster than Box-Muller and plenty for
 * weights whose values do not matter. Each tensor has its own generator,
 * seeded from --seed (default 1) and the tensor's name, so a tensor's values
 * do not depend on the others: the --mtp model has the same main weights as
 * the plain one with the same seed, and sharding changes no value.
 *
 * --mtp adds the MTP module in the layout model/model.c load_mtp() reads:
 * mtp.fc.weight [H, 2H], mtp.pre_fc_norm_embedding.weight,
 * mtp.pre_fc_norm_hidden.weight, mtp.norm.weight [H], and mtp.layers.0.*
 * named like a decoder layer. Tied shapes write no lm_head.weight.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define VOCAB 151936
#define HEAD_DIM 128
#define BOS_ID 151643
#define EOS_ID 151645

typedef struct {
    const char *name;
    int layers, hidden, heads, kv_heads, ffn, tie;
} Shape;

static const Shape shapes[] = {
    {"0.6b", 28, 1024, 16, 8, 3072, 1},  {"1.7b", 28, 2048, 16, 8, 6144, 1},  {"4b", 36, 2560, 32, 8, 9728, 1},
    {"8b", 36, 4096, 32, 8, 12288, 0},   {"14b", 40, 5120, 40, 8, 17408, 0}, {"32b", 64, 5120, 64, 8, 25600, 0},
    {"tiny", 2, 256, 4, 2, 768, 1},
};

typedef struct {
    char name[96];
    int64_t rows, cols; /* cols = 0: a vector [rows] */
    int norm;           /* RMSNorm weight: 1 + noise instead of noise */
    int shard;
    uint64_t offset;    /* within its shard's data section */
} Tensor;

typedef struct {
    Tensor *t;
    int n, cap;
} Plan;

/* One line on stderr and exit with code (1: could not do it, 2: bad arguments). */
__attribute__((format(printf, 2, 3), noreturn)) static void fail(int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "make_model: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    exit(code);
}
#define die(...) fail(1, __VA_ARGS__)

static void add(Plan *p, const char *prefix, const char *name, int64_t rows, int64_t cols, int norm) {
    if (p->n == p->cap) {
        p->cap = p->cap ? 2 * p->cap : 256;
        p->t = realloc(p->t, (size_t)p->cap * sizeof(Tensor));
        if (!p->t) die("out of memory");
    }
    Tensor *t = &p->t[p->n++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s%s", prefix, name);
    t->rows = rows, t->cols = cols, t->norm = norm;
}

static uint64_t numel(const Tensor *t) { return (uint64_t)t->rows * (uint64_t)(t->cols ? t->cols : 1); }

static void add_layer(Plan *p, const Shape *s, const char *prefix) {
    int64_t H = s->hidden, qd = (int64_t)s->heads * HEAD_DIM, kvd = (int64_t)s->kv_heads * HEAD_DIM;
    add(p, prefix, "input_layernorm.weight", H, 0, 1);
    add(p, prefix, "self_attn.q_proj.weight", qd, H, 0);
    add(p, prefix, "self_attn.k_proj.weight", kvd, H, 0);
    add(p, prefix, "self_attn.v_proj.weight", kvd, H, 0);
    add(p, prefix, "self_attn.q_norm.weight", HEAD_DIM, 0, 1);
    add(p, prefix, "self_attn.k_norm.weight", HEAD_DIM, 0, 1);
    add(p, prefix, "self_attn.o_proj.weight", H, qd, 0);
    add(p, prefix, "post_attention_layernorm.weight", H, 0, 1);
    add(p, prefix, "mlp.gate_proj.weight", s->ffn, H, 0);
    add(p, prefix, "mlp.up_proj.weight", s->ffn, H, 0);
    add(p, prefix, "mlp.down_proj.weight", H, s->ffn, 0);
}

static void make_plan(Plan *p, const Shape *s, int mtp) {
    char prefix[64];
    add(p, "", "model.embed_tokens.weight", VOCAB, s->hidden, 0);
    for (int l = 0; l < s->layers; l++) {
        snprintf(prefix, sizeof prefix, "model.layers.%d.", l);
        add_layer(p, s, prefix);
    }
    add(p, "", "model.norm.weight", s->hidden, 0, 1);
    if (!s->tie) add(p, "", "lm_head.weight", VOCAB, s->hidden, 0);
    if (mtp) {
        add(p, "", "mtp.fc.weight", s->hidden, 2 * (int64_t)s->hidden, 0);
        add(p, "", "mtp.pre_fc_norm_embedding.weight", s->hidden, 0, 1);
        add(p, "", "mtp.pre_fc_norm_hidden.weight", s->hidden, 0, 1);
        add_layer(p, s, "mtp.layers.0.");
        add(p, "", "mtp.norm.weight", s->hidden, 0, 1);
    }
}

/* ---- random numbers ---- */

static uint64_t splitmix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ULL;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
}

static uint64_t fnv1a(const char *s) {
    uint64_t h = 1469598103934665603ULL;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ULL;
    return h;
}

/* xorshift64* (Vigna): the state must never be 0, which splitmix64 of a
 * hash makes astronomically unlikely; | 1 makes it impossible. */
static inline uint64_t next(uint64_t *s) {
    *s ^= *s >> 12, *s ^= *s << 25, *s ^= *s >> 27;
    return *s * 0x2545F4914F6CDD1DULL;
}

/* A unit-variance deviate: Irwin-Hall sum of four 16-bit uniforms. */
static inline float gauss(uint64_t *s) {
    uint64_t r = next(s);
    uint32_t sum = (uint32_t)(r & 0xFFFF) + (uint32_t)((r >> 16) & 0xFFFF) + (uint32_t)((r >> 32) & 0xFFFF) +
                   (uint32_t)(r >> 48);
    /* each uniform has mean 32767.5 and variance (65536^2 - 1) / 12 */
    return ((float)sum - 131070.0f) * (1.0f / 37837.23f);
}

/* f32 -> bf16, round to nearest even (no NaN can occur here). */
static inline uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7FFF + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

/* ---- writing ---- */

#define BUF_ELEMS (8u << 20) /* 16 MB of bf16 per fwrite */

static FILE *open_out(const char *dir, const char *name, char *path, size_t n) {
    snprintf(path, n, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f) die("cannot write %s: %s", path, strerror(errno));
    return f;
}

static void close_out(FILE *f, const char *path) {
    if (ferror(f) | fclose(f)) die("error writing %s", path);
}

static void write_tensor(FILE *f, const Tensor *t, uint64_t seed, uint16_t *buf) {
    uint64_t st = splitmix64(seed ^ fnv1a(t->name)) | 1, n = numel(t);
    const float sigma = 0.02f, base = t->norm ? 1.0f : 0.0f;
    for (uint64_t done = 0; done < n;) {
        size_t k = n - done < BUF_ELEMS ? (size_t)(n - done) : BUF_ELEMS;
        for (size_t i = 0; i < k; i++) buf[i] = to_bf16(base + sigma * gauss(&st));
        if (fwrite(buf, 2, k, f) != k) die("short write of %s", t->name);
        done += k;
    }
}

/* One safetensors file holding the tensors of shard sh: header (JSON padded
 * with spaces to a multiple of 8, as the reference writer does), then data. */
static void write_shard(const char *dir, const char *fname, const Plan *p, int sh, uint64_t seed, uint16_t *buf) {
    size_t cap = 4096 + (size_t)p->n * 192, len = 0;
    char *h = malloc(cap), path[4200];
    if (!h) die("out of memory");
    len += (size_t)snprintf(h + len, cap - len, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (int i = 0; i < p->n; i++) {
        const Tensor *t = &p->t[i];
        if (t->shard != sh) continue;
        char shape[64];
        if (t->cols) snprintf(shape, sizeof shape, "%lld,%lld", (long long)t->rows, (long long)t->cols);
        else snprintf(shape, sizeof shape, "%lld", (long long)t->rows);
        len += (size_t)snprintf(h + len, cap - len, ",\"%s\":{\"dtype\":\"BF16\",\"shape\":[%s],\"data_offsets\":[%llu,%llu]}",
                                t->name, shape, (unsigned long long)t->offset,
                                (unsigned long long)(t->offset + 2 * numel(t)));
    }
    h[len++] = '}';
    while (len % 8) h[len++] = ' ';
    FILE *f = open_out(dir, fname, path, sizeof path);
    setvbuf(f, NULL, _IOFBF, 1 << 22);
    uint64_t hl = len; /* little-endian u64: x86-64 is little-endian */
    if (fwrite(&hl, 8, 1, f) != 1 || fwrite(h, 1, len, f) != len) die("short write of %s", path);
    for (int i = 0; i < p->n; i++)
        if (p->t[i].shard == sh) write_tensor(f, &p->t[i], seed, buf);
    close_out(f, path);
    free(h);
}

static void write_config(const char *dir, const Shape *s, int mtp) {
    char path[4200];
    FILE *f = open_out(dir, "config.json", path, sizeof path);
    fprintf(f,
            "{\n  \"architectures\": [\n    \"Qwen3ForCausalLM\"\n  ],\n  \"attention_bias\": false,\n"
            "  \"attention_dropout\": 0.0,\n  \"bos_token_id\": %d,\n  \"eos_token_id\": %d,\n  \"head_dim\": %d,\n"
            "  \"hidden_act\": \"silu\",\n  \"hidden_size\": %d,\n  \"initializer_range\": 0.02,\n"
            "  \"intermediate_size\": %d,\n  \"max_position_embeddings\": 40960,\n  \"max_window_layers\": %d,\n"
            "  \"model_type\": \"qwen3\",\n  \"num_attention_heads\": %d,\n  \"num_hidden_layers\": %d,\n"
            "  \"num_key_value_heads\": %d,\n",
            BOS_ID, EOS_ID, HEAD_DIM, s->hidden, s->ffn, s->layers, s->heads, s->layers, s->kv_heads);
    if (mtp) fprintf(f, "  \"num_nextn_predict_layers\": 1,\n");
    fprintf(f,
            "  \"rms_norm_eps\": 1e-06,\n  \"rope_scaling\": null,\n  \"rope_theta\": 1000000,\n"
            "  \"sliding_window\": null,\n  \"tie_word_embeddings\": %s,\n  \"torch_dtype\": \"bfloat16\",\n"
            "  \"transformers_version\": \"4.51.0\",\n  \"use_cache\": true,\n  \"use_sliding_window\": false,\n"
            "  \"vocab_size\": %d\n}\n",
            s->tie ? "true" : "false", VOCAB);
    close_out(f, path);
    f = open_out(dir, "generation_config.json", path, sizeof path);
    fprintf(f,
            "{\n  \"bos_token_id\": %d,\n  \"do_sample\": true,\n  \"eos_token_id\": [\n    %d,\n    %d\n  ],\n"
            "  \"pad_token_id\": %d,\n  \"temperature\": 0.6,\n  \"top_k\": 20,\n  \"top_p\": 0.95,\n"
            "  \"transformers_version\": \"4.51.0\"\n}\n",
            BOS_ID, EOS_ID, BOS_ID, BOS_ID);
    close_out(f, path);
}

/* Copies src (or, gz set, the output of gzip -dc src) to dir/name. */
static void copy_file(const char *src, const char *dir, const char *name, int gz) {
    char path[4200], cmd[8600], *q = cmd;
    FILE *in;
    if (gz) {
        /* single-quote the path for the shell: ' becomes '\'' */
        q += sprintf(q, "gzip -dc '");
        for (const char *c = src; *c; c++) q += *c == '\'' ? sprintf(q, "'\\''") : sprintf(q, "%c", *c);
        sprintf(q, "'");
        in = popen(cmd, "r");
    } else in = fopen(src, "rb");
    if (!in) die("cannot read %s: %s", src, strerror(errno));
    FILE *out = open_out(dir, name, path, sizeof path);
    char buf[1 << 16];
    size_t n, total = 0;
    while ((n = fread(buf, 1, sizeof buf, in)) > 0) {
        if (fwrite(buf, 1, n, out) != n) die("short write of %s", path);
        total += n;
    }
    int bad = gz ? pclose(in) != 0 : (ferror(in) | fclose(in));
    if (bad || total == 0) die("cannot read %s%s", src, gz ? " (gzip -dc failed)" : "");
    close_out(out, path);
}

static void usage(void) {
    fprintf(stderr, "usage: make_model --shape 0.6b|1.7b|4b|8b|14b|32b|tiny [--mtp] [--seed N] [--layers N]\n"
                    "                  [--max-shard-mb N] [--tokenizer DIR] --out DIR\n");
    exit(2);
}

/* The decimal number v of flag f, within [lo, hi]; exits 2 otherwise. */
static uint64_t number(const char *f, const char *v, uint64_t lo, uint64_t hi) {
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    if (end == v || *end || errno || v[0] == '-' || x < lo || x > hi)
        fail(2, "%s: expected a whole number from %llu to %llu, found '%s'", f, (unsigned long long)lo,
             (unsigned long long)hi, v);
    return x;
}

int main(int argc, char **argv) {
    const char *shape = NULL, *out = NULL, *tokdir = "tests/data/tokenizer/full";
    uint64_t seed = 1, max_shard = 4000ull * 1000 * 1000;
    int mtp = 0, layers = 0;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(f, "--mtp") == 0) { mtp = 1; continue; }
        if (!v) usage();
        i++;
        if (strcmp(f, "--shape") == 0) shape = v;
        else if (strcmp(f, "--out") == 0) out = v;
        else if (strcmp(f, "--tokenizer") == 0) tokdir = v;
        else if (strcmp(f, "--seed") == 0) seed = number(f, v, 0, UINT64_MAX);
        else if (strcmp(f, "--layers") == 0) layers = (int)number(f, v, 1, 1000);
        else if (strcmp(f, "--max-shard-mb") == 0) max_shard = number(f, v, 1, 1000000) * 1000 * 1000;
        else usage();
    }
    if (!shape || !out) usage();
    Shape s = {0};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        if (strcmp(shapes[i].name, shape) == 0) s = shapes[i];
    if (!s.name) fail(2, "--shape: expected 0.6b, 1.7b, 4b, 8b, 14b, 32b or tiny, found '%s'", shape);
    if (layers) s.layers = layers;
    if (mkdir(out, 0755) && errno != EEXIST) die("cannot create %s: %s", out, strerror(errno));
    /* a missing tokenizer should fail before gigabytes of weights are written */
    char tok_gz[4200], tok_cfg[4200];
    snprintf(tok_gz, sizeof tok_gz, "%s/tokenizer.json.gz", tokdir);
    snprintf(tok_cfg, sizeof tok_cfg, "%s/tokenizer_config.json", tokdir);
    if (access(tok_gz, R_OK) || access(tok_cfg, R_OK)) die("cannot read %s and %s", tok_gz, tok_cfg);

    /* shards: fill each up to max_shard bytes, in tensor order */
    Plan p = {0};
    make_plan(&p, &s, mtp);
    int n_shards = 1;
    uint64_t used = 0, total = 0;
    for (int i = 0; i < p.n; i++) {
        uint64_t b = 2 * numel(&p.t[i]);
        if (used > 0 && used + b > max_shard) n_shards++, used = 0;
        p.t[i].shard = n_shards - 1;
        p.t[i].offset = used;
        used += b, total += b;
    }
    uint16_t *buf = malloc(BUF_ELEMS * sizeof(uint16_t));
    if (!buf) die("out of memory");
    char fname[64], path[4200];
    for (int sh = 0; sh < n_shards; sh++) {
        if (n_shards == 1) snprintf(fname, sizeof fname, "model.safetensors");
        else snprintf(fname, sizeof fname, "model-%05d-of-%05d.safetensors", sh + 1, n_shards);
        write_shard(out, fname, &p, sh, seed, buf);
    }
    if (n_shards > 1) {
        FILE *f = open_out(out, "model.safetensors.index.json", path, sizeof path);
        fprintf(f, "{\n  \"metadata\": {\n    \"total_size\": %llu\n  },\n  \"weight_map\": {", (unsigned long long)total);
        for (int i = 0; i < p.n; i++)
            fprintf(f, "%s\n    \"%s\": \"model-%05d-of-%05d.safetensors\"", i ? "," : "", p.t[i].name,
                    p.t[i].shard + 1, n_shards);
        fprintf(f, "\n  }\n}\n");
        close_out(f, path);
    }
    write_config(out, &s, mtp);
    copy_file(tok_gz, out, "tokenizer.json", 1);
    copy_file(tok_cfg, out, "tokenizer_config.json", 0);
    printf("wrote %s: Qwen3-%s shape, %d layers%s, %d tensors, %.2f GB bf16 in %d file%s, seed %llu\n", out, s.name,
           s.layers, mtp ? " + MTP" : "", p.n, total / 1e9, n_shards, n_shards > 1 ? "s" : "",
           (unsigned long long)seed);
    free(buf);
    free(p.t);
    return 0;
}
