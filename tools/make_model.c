/* make_model.c: writes a random-weight Qwen3 or Qwen3.5 checkpoint of a
 * released shape, in Hugging Face layout, deterministically from a seed. The
 * benchmarks run on it: speed depends on the shapes and dtypes, not on the
 * values.
 *
 * Data flow: outside the engine and linked to none of it: it writes the
 * files that model/source.c, format/safetensors.c and tokenizer/ read, in
 * the safetensors format (https://github.com/huggingface/safetensors):
 *
 *   | u64 LE header length N | N bytes of JSON header | bf16 (and f32) tensor data |
 *
 *   build/make_model --shape 0.6b|1.7b|4b|8b|14b|32b|tiny|qwen3.5-0.8b|qwen3.5-tiny
 *                    [--mtp] [--seed N] [--layers N] [--max-shard-mb N] [--tokenizer DIR] --out DIR
 *
 * DIR gets config.json (the real config of that shape, key for key),
 * generation_config.json, the full Qwen3 tokenizer (tokenizer.json gunzipped
 * from DIR_TOK/tokenizer.json.gz through `gzip -dc`, tokenizer_config.json
 * copied; DIR_TOK defaults to tests/data/tokenizer/full, so run it from the
 * repo root), and the weights: one model.safetensors, or shards of at most
 * --max-shard-mb (default 4000, about what Hugging Face writes) plus
 * model.safetensors.index.json once the weights exceed that. --layers
 * overrides the layer count of any shape.
 *
 * Qwen3 shapes are shared/specs/qwen3.md's table; "tiny" is ours (2 layers,
 * hidden 256, 4/2 heads x 128, ffn 768, full vocabulary) for quick checks.
 * --mtp adds num_nextn_predict_layers: 1 and the MTP module in the layout
 * model/model.c load_mtp() reads: mtp.fc.weight [H, 2H],
 * mtp.pre_fc_norm_embedding.weight, mtp.pre_fc_norm_hidden.weight,
 * mtp.norm.weight [H], and mtp.layers.0.* named like a decoder layer.
 *
 * Qwen3.5 shapes (the hybrid, shared/specs/qwen35.md) write the multimodal
 * class's config (model_type qwen3_5, the text model's keys in text_config,
 * layer_types [GDN, GDN, GDN, full] repeated) and its tensor names
 * ("Checkpoint tensors": prefix model.language_model., Gated DeltaNet
 * linear_attn.* with conv1d [conv_dim, 1, K], A_log and linear_attn.norm in
 * F32 as in the files seen, gated q_proj [2 nH hd, H]), but no vision tower
 * (neither its config nor its model.visual.* tensors: the engine reads
 * neither). qwen3.5-0.8b is the "Released sizes" row: 24 layers, hidden
 * 1024, ffn 3584, 8/2 heads x 256, Hk = Hv = 16 of dk = dv = 128, conv
 * width 4, vocab 248320, tied, theta 1e7, partial rotary 0.25;
 * "qwen3.5-tiny" is ours (4 layers, the last full, hidden 256, 4/2 heads x
 * 256, Hk 2, Hv 4, ffn 768, full vocabulary). --mtp sets
 * mtp_num_hidden_layers to 1 (else 0) and adds the 15 mtp.* tensors, its
 * layer a gated full-attention one. No Qwen3.5 tokenizer is available here,
 * so these get the Qwen3 one too (its ids, below 151936, all fit the 248320
 * rows), and the config's end-of-text ids are Qwen3's, the tokenizer's.
 *
 * Values: matrices ~ N(0, 0.02^2) (the initializer_range), plain RMSNorm
 * weights (Qwen3's, Qwen3.5's gated linear_attn.norm) 1 + N(0, 0.02^2),
 * Qwen3.5's zero-centred norm weights w of (1 + w) and dt_bias N(0, 0.02^2),
 * its conv taps N(0, 0.29^2) (the spread of torch's default uniform
 * +-1/sqrt(K) at K = 4) and A_log = log(uniform(1, 16)) as Hugging Face
 * initialises it, so that the decay exp(-exp(A_log) softplus(.)) stays in
 * (0, 1) and the forward stays finite. bf16 values are rounded with
 * round-to-nearest-even. The normal deviate is the sum of four 16-bit
 * uniforms taken from one xorshift64* output, centred and scaled (Irwin-Hall
 * n = 4: unit variance, tails cut at 3.46 sigma), which is several times
 * faster than Box-Muller and plenty for weights whose values do not matter.
 * Each tensor has its own generator, seeded from --seed (default 1) and the
 * tensor's name, so a tensor's values do not depend on the others: the
 * --mtp model has the same main weights as the plain one with the same
 * seed, and sharding changes no value. Tied shapes write no lm_head.weight.
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define VOCAB 151936    /* Qwen3 */
#define VOCAB35 248320  /* Qwen3.5 */
#define LIN_DIM 128     /* Qwen3.5's dk = dv */
#define CONV_K 4        /* Qwen3.5's conv width */
#define BOS_ID 151643
#define EOS_ID 151645

typedef struct {
    const char *name;
    int layers, hidden, heads, kv_heads, head_dim, ffn, tie;
    /* Qwen3.5: layer i is full attention when (i + 1) % full_every == 0,
     * else Gated DeltaNet with lin_k / lin_v heads; full_every 0: Qwen3 */
    int full_every, lin_k_heads, lin_v_heads;
} Shape;

static const Shape shapes[] = {
    {"0.6b", 28, 1024, 16, 8, 128, 3072, 1, 0, 0, 0},  {"1.7b", 28, 2048, 16, 8, 128, 6144, 1, 0, 0, 0},
    {"4b", 36, 2560, 32, 8, 128, 9728, 1, 0, 0, 0},    {"8b", 36, 4096, 32, 8, 128, 12288, 0, 0, 0, 0},
    {"14b", 40, 5120, 40, 8, 128, 17408, 0, 0, 0, 0},  {"32b", 64, 5120, 64, 8, 128, 25600, 0, 0, 0, 0},
    {"tiny", 2, 256, 4, 2, 128, 768, 1, 0, 0, 0},
    {"qwen3.5-0.8b", 24, 1024, 8, 2, 256, 3584, 1, 4, 16, 16},
    {"qwen3.5-tiny", 4, 256, 4, 2, 256, 768, 1, 4, 2, 4},
};

/* How a tensor's values are drawn (see the header). */
typedef enum {
    V_MATRIX, /* N(0, 0.02^2): matrices, zero-centred norm weights, dt_bias */
    V_NORM,   /* 1 + N(0, 0.02^2): plain RMSNorm weights */
    V_CONV,   /* N(0, 0.29^2): conv taps */
    V_A_LOG,  /* log(uniform(1, 16)) */
} Init;

typedef struct {
    char name[96];
    int64_t dim[3];     /* [dim0] (dim1 = 0), [dim0, dim1] (dim2 = 0) or three dims */
    Init init;
    int f32;            /* stored F32, else BF16 */
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

/* Appends tensor prefix+name of shape [d0] (d1 = 0), [d0, d1] (d2 = 0) or
 * [d0, d1, d2], BF16; the caller may set f32 on the result. */
static Tensor *add(Plan *p, const char *prefix, const char *name, Init init, int64_t d0, int64_t d1, int64_t d2) {
    if (p->n == p->cap) {
        p->cap = p->cap ? 2 * p->cap : 256;
        p->t = realloc(p->t, (size_t)p->cap * sizeof(Tensor));
        if (!p->t) die("out of memory");
    }
    Tensor *t = &p->t[p->n++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s%s", prefix, name);
    t->dim[0] = d0, t->dim[1] = d1, t->dim[2] = d2, t->init = init;
    return t;
}

static uint64_t numel(const Tensor *t) {
    uint64_t n = 1;
    for (int i = 0; i < 3 && t->dim[i]; i++) n *= (uint64_t)t->dim[i];
    return n;
}

static uint64_t nbytes(const Tensor *t) { return numel(t) * (t->f32 ? 4 : 2); }

/* A decoder layer: attention (Qwen3's, or Qwen3.5's gated one with q_proj
 * [query | gate] per head) or, gdn set, Qwen3.5's Gated DeltaNet, then the
 * MLP. Qwen3.5's norms are zero-centred, stored near 0, except the gated
 * linear_attn.norm. */
static void add_layer(Plan *p, const Shape *s, const char *prefix, int gdn) {
    const int q35 = s->full_every > 0;
    const Init zc = q35 ? V_MATRIX : V_NORM;
    const int64_t H = s->hidden, hd = s->head_dim, qd = (int64_t)s->heads * hd, kvd = (int64_t)s->kv_heads * hd;
    add(p, prefix, "input_layernorm.weight", zc, H, 0, 0);
    if (gdn) {
        const int64_t hv = s->lin_v_heads, vd = hv * LIN_DIM, conv = 2 * (int64_t)s->lin_k_heads * LIN_DIM + vd;
        add(p, prefix, "linear_attn.in_proj_qkv.weight", V_MATRIX, conv, H, 0);
        add(p, prefix, "linear_attn.in_proj_z.weight", V_MATRIX, vd, H, 0);
        add(p, prefix, "linear_attn.in_proj_b.weight", V_MATRIX, hv, H, 0);
        add(p, prefix, "linear_attn.in_proj_a.weight", V_MATRIX, hv, H, 0);
        add(p, prefix, "linear_attn.conv1d.weight", V_CONV, conv, 1, CONV_K);
        add(p, prefix, "linear_attn.dt_bias", V_MATRIX, hv, 0, 0);
        add(p, prefix, "linear_attn.A_log", V_A_LOG, hv, 0, 0)->f32 = 1;
        add(p, prefix, "linear_attn.norm.weight", V_NORM, LIN_DIM, 0, 0)->f32 = 1;
        add(p, prefix, "linear_attn.out_proj.weight", V_MATRIX, H, vd, 0);
    } else {
        add(p, prefix, "self_attn.q_proj.weight", V_MATRIX, q35 ? 2 * qd : qd, H, 0);
        add(p, prefix, "self_attn.k_proj.weight", V_MATRIX, kvd, H, 0);
        add(p, prefix, "self_attn.v_proj.weight", V_MATRIX, kvd, H, 0);
        add(p, prefix, "self_attn.q_norm.weight", zc, hd, 0, 0);
        add(p, prefix, "self_attn.k_norm.weight", zc, hd, 0, 0);
        add(p, prefix, "self_attn.o_proj.weight", V_MATRIX, H, qd, 0);
    }
    add(p, prefix, "post_attention_layernorm.weight", zc, H, 0, 0);
    add(p, prefix, "mlp.gate_proj.weight", V_MATRIX, s->ffn, H, 0);
    add(p, prefix, "mlp.up_proj.weight", V_MATRIX, s->ffn, H, 0);
    add(p, prefix, "mlp.down_proj.weight", V_MATRIX, H, s->ffn, 0);
}

static int is_gdn(const Shape *s, int l) { return s->full_every && (l + 1) % s->full_every != 0; }

static void make_plan(Plan *p, const Shape *s, int mtp) {
    const int q35 = s->full_every > 0;
    const Init zc = q35 ? V_MATRIX : V_NORM;
    const char *model = q35 ? "model.language_model." : "model.";
    const int64_t H = s->hidden, V = q35 ? VOCAB35 : VOCAB;
    char prefix[64];
    add(p, model, "embed_tokens.weight", V_MATRIX, V, H, 0);
    for (int l = 0; l < s->layers; l++) {
        snprintf(prefix, sizeof prefix, "%slayers.%d.", model, l);
        add_layer(p, s, prefix, is_gdn(s, l));
    }
    add(p, model, "norm.weight", zc, H, 0, 0);
    if (!s->tie) add(p, "", "lm_head.weight", V_MATRIX, V, H, 0);
    if (mtp) {
        add(p, "", "mtp.fc.weight", V_MATRIX, H, 2 * H, 0);
        add(p, "", "mtp.pre_fc_norm_embedding.weight", zc, H, 0, 0);
        add(p, "", "mtp.pre_fc_norm_hidden.weight", zc, H, 0, 0);
        add_layer(p, s, "mtp.layers.0.", 0);
        add(p, "", "mtp.norm.weight", zc, H, 0, 0);
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

/* A uniform deviate in [0, 1) from the top 24 bits. */
static inline float uniform(uint64_t *s) { return (float)(next(s) >> 40) * (1.0f / 16777216.0f); }

static void write_tensor(FILE *f, const Tensor *t, uint64_t seed, uint16_t *buf) {
    uint64_t st = splitmix64(seed ^ fnv1a(t->name)) | 1, n = numel(t);
    const float sigma = t->init == V_CONV ? 0.29f : 0.02f, base = t->init == V_NORM ? 1.0f : 0.0f;
    /* buf holds BUF_ELEMS bf16 values or half as many f32 ones */
    const size_t es = t->f32 ? 4 : 2, per = BUF_ELEMS * 2 / es;
    float *f32 = (float *)buf;
    for (uint64_t done = 0; done < n;) {
        size_t k = n - done < per ? (size_t)(n - done) : per;
        for (size_t i = 0; i < k; i++) {
            const float x = t->init == V_A_LOG ? logf(1.0f + 15.0f * uniform(&st)) : base + sigma * gauss(&st);
            if (t->f32) f32[i] = x;
            else buf[i] = to_bf16(x);
        }
        if (fwrite(buf, es, k, f) != k) die("short write of %s", t->name);
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
        char shape[80];
        size_t sl = (size_t)snprintf(shape, sizeof shape, "%lld", (long long)t->dim[0]);
        for (int d = 1; d < 3 && t->dim[d]; d++)
            sl += (size_t)snprintf(shape + sl, sizeof shape - sl, ",%lld", (long long)t->dim[d]);
        len += (size_t)snprintf(h + len, cap - len, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[%s],\"data_offsets\":[%llu,%llu]}",
                                t->name, t->f32 ? "F32" : "BF16", shape, (unsigned long long)t->offset,
                                (unsigned long long)(t->offset + nbytes(t)));
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

/* Qwen3.5's config.json: the multimodal class's, the text model's keys in
 * text_config (as the released files have them, less vision_config), with
 * Qwen3's end-of-text id, the tokenizer's. */
static void write_config35(FILE *f, const Shape *s, int mtp) {
    fprintf(f,
            "{\n  \"architectures\": [\n    \"Qwen3_5ForConditionalGeneration\"\n  ],\n  \"image_token_id\": 248056,\n"
            "  \"model_type\": \"qwen3_5\",\n  \"text_config\": {\n    \"attention_bias\": false,\n"
            "    \"attention_dropout\": 0.0,\n    \"attn_output_gate\": true,\n    \"dtype\": \"bfloat16\",\n"
            "    \"eos_token_id\": %d,\n    \"full_attention_interval\": %d,\n    \"head_dim\": %d,\n"
            "    \"hidden_act\": \"silu\",\n    \"hidden_size\": %d,\n    \"initializer_range\": 0.02,\n"
            "    \"intermediate_size\": %d,\n    \"layer_types\": [",
            BOS_ID, s->full_every, s->head_dim, s->hidden, s->ffn);
    for (int l = 0; l < s->layers; l++)
        fprintf(f, "%s\n      \"%s\"", l ? "," : "", is_gdn(s, l) ? "linear_attention" : "full_attention");
    fprintf(f,
            "\n    ],\n    \"linear_conv_kernel_dim\": %d,\n    \"linear_key_head_dim\": %d,\n"
            "    \"linear_num_key_heads\": %d,\n    \"linear_num_value_heads\": %d,\n    \"linear_value_head_dim\": %d,\n"
            "    \"max_position_embeddings\": 262144,\n    \"mlp_only_layers\": [],\n    \"model_type\": \"qwen3_5_text\",\n"
            "    \"mtp_num_hidden_layers\": %d,\n    \"mtp_use_dedicated_embeddings\": false,\n"
            "    \"num_attention_heads\": %d,\n    \"num_hidden_layers\": %d,\n    \"num_key_value_heads\": %d,\n"
            "    \"rms_norm_eps\": 1e-06,\n    \"tie_word_embeddings\": %s,\n    \"use_cache\": true,\n"
            "    \"vocab_size\": %d,\n    \"mamba_ssm_dtype\": \"float32\",\n    \"rope_parameters\": {\n"
            "      \"mrope_interleaved\": true,\n      \"mrope_section\": [\n        11,\n        11,\n        10\n      ],\n"
            "      \"rope_type\": \"default\",\n      \"rope_theta\": 10000000,\n      \"partial_rotary_factor\": 0.25\n"
            "    }\n  },\n  \"tie_word_embeddings\": %s,\n  \"transformers_version\": \"4.57.0.dev0\",\n"
            "  \"video_token_id\": 248057,\n  \"vision_end_token_id\": 248054,\n  \"vision_start_token_id\": 248053\n}\n",
            CONV_K, LIN_DIM, s->lin_k_heads, s->lin_v_heads, LIN_DIM, mtp, s->heads, s->layers, s->kv_heads,
            s->tie ? "true" : "false", VOCAB35, s->tie ? "true" : "false");
}

static void write_config(const char *dir, const Shape *s, int mtp) {
    char path[4200];
    FILE *f = open_out(dir, "config.json", path, sizeof path);
    if (s->full_every) write_config35(f, s, mtp);
    else {
        fprintf(f,
                "{\n  \"architectures\": [\n    \"Qwen3ForCausalLM\"\n  ],\n  \"attention_bias\": false,\n"
                "  \"attention_dropout\": 0.0,\n  \"bos_token_id\": %d,\n  \"eos_token_id\": %d,\n  \"head_dim\": %d,\n"
                "  \"hidden_act\": \"silu\",\n  \"hidden_size\": %d,\n  \"initializer_range\": 0.02,\n"
                "  \"intermediate_size\": %d,\n  \"max_position_embeddings\": 40960,\n  \"max_window_layers\": %d,\n"
                "  \"model_type\": \"qwen3\",\n  \"num_attention_heads\": %d,\n  \"num_hidden_layers\": %d,\n"
                "  \"num_key_value_heads\": %d,\n",
                BOS_ID, EOS_ID, s->head_dim, s->hidden, s->ffn, s->layers, s->heads, s->layers, s->kv_heads);
        if (mtp) fprintf(f, "  \"num_nextn_predict_layers\": 1,\n");
        fprintf(f,
                "  \"rms_norm_eps\": 1e-06,\n  \"rope_scaling\": null,\n  \"rope_theta\": 1000000,\n"
                "  \"sliding_window\": null,\n  \"tie_word_embeddings\": %s,\n  \"torch_dtype\": \"bfloat16\",\n"
                "  \"transformers_version\": \"4.51.0\",\n  \"use_cache\": true,\n  \"use_sliding_window\": false,\n"
                "  \"vocab_size\": %d\n}\n",
                s->tie ? "true" : "false", VOCAB);
    }
    close_out(f, path);
    /* Qwen3.5 has no BOS */
    f = open_out(dir, "generation_config.json", path, sizeof path);
    if (!s->full_every) fprintf(f, "{\n  \"bos_token_id\": %d,\n", BOS_ID);
    else fprintf(f, "{\n");
    fprintf(f,
            "  \"do_sample\": true,\n  \"eos_token_id\": [\n    %d,\n    %d\n  ],\n"
            "  \"pad_token_id\": %d,\n  \"temperature\": 0.6,\n  \"top_k\": 20,\n  \"top_p\": 0.95,\n"
            "  \"transformers_version\": \"%s\"\n}\n",
            EOS_ID, BOS_ID, BOS_ID, s->full_every ? "4.57.0.dev0" : "4.51.0");
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
    fprintf(stderr, "usage: make_model --shape 0.6b|1.7b|4b|8b|14b|32b|tiny|qwen3.5-0.8b|qwen3.5-tiny [--mtp]\n"
                    "                  [--seed N] [--layers N] [--max-shard-mb N] [--tokenizer DIR] --out DIR\n");
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
    if (!s.name)
        fail(2, "--shape: expected 0.6b, 1.7b, 4b, 8b, 14b, 32b, tiny, qwen3.5-0.8b or qwen3.5-tiny, found '%s'", shape);
    /* the engine needs a full-attention layer, the full_every-th */
    if (layers && layers < s.full_every)
        fail(2, "--layers: expected at least %d for %s (its first full-attention layer), found %d", s.full_every,
             s.name, layers);
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
        uint64_t b = nbytes(&p.t[i]);
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
    /* "Qwen3-0.6b", "Qwen3.5-0.8b" */
    const int q35 = s.full_every > 0;
    printf("wrote %s: Qwen3%s-%s shape, %d layers%s, %d tensors, %.2f GB bf16 in %d file%s, seed %llu\n", out,
           q35 ? ".5" : "", s.name + (q35 ? strlen("qwen3.5-") : 0), s.layers, mtp ? " + MTP" : "", p.n, total / 1e9,
           n_shards, n_shards > 1 ? "s" : "", (unsigned long long)seed);
    free(buf);
    free(p.t);
    return 0;
}
