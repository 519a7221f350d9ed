/* config.c: config.json / generation_config.json -> Config (see config.h).
 * Key names follow Hugging Face transformers' Qwen3Config, with the newer
 * `rope_parameters` spelling accepted next to `rope_theta`/`rope_scaling`.
 *
 * Every field is either absent (or null), which takes transformers' default,
 * or present with a value the model can use; a present value that is of the
 * wrong type or impossible (max_position_embeddings 0, a bool that is a
 * string) is an error naming the field, never replaced by the default.
 *
 * Data flow: model/source.c parses the files (format/json.c) and hands the
 * trees here; model_load then checks every tensor's shape and sizes every
 * buffer from the Config. */
#include "model/config.h"
#include "format/json.h"
#include "format/quote.h"
#include "kv/kv.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* What a field held, for error lines: its number or its JSON type. */
static const char *found(const Json *f, char *buf, size_t n) {
    char q[QUOTE_BUF];
    if (f->type == JSON_NUMBER) snprintf(buf, n, "%.17g", f->number);
    else if (f->type == JSON_STRING) snprintf(buf, n, "the string %s", quote(f->str, f->len, q, sizeof q));
    else snprintf(buf, n, "%s %s", f->type == JSON_ARRAY || f->type == JSON_OBJECT ? "an" : "a",
                  json_type_name(f->type));
    return buf;
}

/* The field key of object j (named where + key in errors), or NULL when it
 * is absent or null. */
static const Json *field(const Json *j, const char *key) {
    const Json *f = json_get(j, key);
    return f && f->type != JSON_NULL ? f : NULL;
}

/* An integer field in [lo, hi] into *out; absent or null leaves *out when
 * !required. 0 ok, -1 with err naming the field. */
static int get_int(const Json *j, const char *path, const char *where, const char *key, long lo, long hi,
                   int required, int *out, char *err, size_t errlen) {
    const Json *f = field(j, key);
    long v;
    char b[2 * QUOTE_BUF];
    if (!f && !required) return 0;
    if (!f) { snprintf(err, errlen, "%s: missing field '%s%s'", path, where, key); return -1; }
    if (!json_get_int(j, key, lo, hi, &v)) {
        snprintf(err, errlen, "%s: field '%s%s': expected an integer in %ld..%ld, found %s", path, where, key, lo, hi,
                 found(f, b, sizeof b));
        return -1;
    }
    *out = (int)v;
    return 0;
}

/* A number field in [lo, hi] (optional: absent or null leaves *out). */
static int get_num(const Json *j, const char *path, const char *where, const char *key, double lo, double hi,
                   double *out, char *err, size_t errlen) {
    const Json *f = field(j, key);
    char b[2 * QUOTE_BUF];
    if (!f) return 0;
    if (f->type != JSON_NUMBER || !(f->number >= lo && f->number <= hi)) {
        snprintf(err, errlen, "%s: field '%s%s': expected a number in [%g, %g], found %s", path, where, key, lo, hi,
                 found(f, b, sizeof b));
        return -1;
    }
    *out = f->number;
    return 0;
}

/* A true/false field (optional: absent or null leaves *out). */
static int get_bool(const Json *j, const char *path, const char *where, const char *key, int *out, char *err,
                    size_t errlen) {
    const Json *f = field(j, key);
    char b[2 * QUOTE_BUF];
    if (!f) return 0;
    if (f->type != JSON_BOOL) {
        snprintf(err, errlen, "%s: field '%s%s': expected true or false, found %s", path, where, key,
                 found(f, b, sizeof b));
        return -1;
    }
    *out = f->boolean;
    return 0;
}

static void add_eos(Config *c, long id) {
    for (int i = 0; i < c->n_eos; i++)
        if (c->eos_ids[i] == id) return;
    if (c->n_eos < CFG_MAX_EOS) c->eos_ids[c->n_eos++] = (int)id;
}

/* eos_token_id is an int or a list of ints. */
static int read_eos(Config *c, const Json *j, const char *path, char *err, size_t errlen) {
    const Json *e = field(j, "eos_token_id");
    if (!e) return 0;
    size_t n = e->type == JSON_ARRAY ? e->len : 1;
    for (size_t i = 0; i < n; i++) {
        const Json *v = e->type == JSON_ARRAY ? json_at(e, i) : e;
        if (v->type != JSON_NUMBER || v->number < 0 || v->number > 1e9 || v->number != (double)(long)v->number) {
            snprintf(err, errlen, "%s: field 'eos_token_id': expected a token id or a list of them", path);
            return -1;
        }
        add_eos(c, (long)v->number);
    }
    return 0;
}

static int read_rope(Config *c, const Json *j, const char *path, char *err, size_t errlen) {
    const Json *params = field(j, "rope_parameters"), *scaling = field(j, "rope_scaling");
    char b[2 * QUOTE_BUF];
    const Json *th = field(j, "rope_theta") ? field(j, "rope_theta") : field(params, "rope_theta");
    if (!th) {
        snprintf(err, errlen, "%s: missing field 'rope_theta' (or rope_parameters.rope_theta)", path);
        return -1;
    }
    if (th->type != JSON_NUMBER || !(th->number > 1 && th->number <= 1e12)) {
        snprintf(err, errlen, "%s: field '%srope_theta': expected a number in (1, 1e12], found %s", path,
                 field(j, "rope_theta") ? "" : "rope_parameters.", found(th, b, sizeof b));
        return -1;
    }
    c->rope_theta = th->number;
    /* rope_parameters carries the scaling too in newer configs */
    const Json *sc = scaling ? scaling : params;
    const char *where = scaling ? "rope_scaling." : "rope_parameters.";
    if (sc && sc->type != JSON_OBJECT) {
        snprintf(err, errlen, "%s: field '%.*s': expected an object or null, found %s", path, (int)strlen(where) - 1,
                 where, found(sc, b, sizeof b));
        return -1;
    }
    const Json *tf = field(sc, "rope_type") ? field(sc, "rope_type") : field(sc, "type");
    c->rope_type = ROPE_DEFAULT;
    c->rope_factor = 1;
    if (tf && tf->type != JSON_STRING) {
        snprintf(err, errlen, "%s: field '%srope_type': expected a string, found %s", path, where,
                 found(tf, b, sizeof b));
        return -1;
    }
    const char *type = tf ? tf->str : NULL;
    if (!type || strcmp(type, "default") == 0) return 0;
    if (!field(sc, "factor")) {
        snprintf(err, errlen, "%s: rope scaling %s: missing field '%sfactor'", path, quote_str(type, b, sizeof b),
                 where);
        return -1;
    }
    if (get_num(sc, path, where, "factor", 1, 1e6, &c->rope_factor, err, errlen)) return -1;
    if (strcmp(type, "linear") == 0) { c->rope_type = ROPE_LINEAR; return 0; }
    if (strcmp(type, "yarn") != 0) {
        snprintf(err, errlen, "%s: field '%srope_type': expected default, linear or yarn, found %s", path, where,
                 quote_str(type, b, sizeof b));
        return -1;
    }
    c->rope_type = ROPE_YARN;
    c->rope_orig_max_pos = c->max_pos;
    c->yarn_beta_fast = 32;
    c->yarn_beta_slow = 1;
    c->yarn_truncate = 1;
    double mscale = 0, mscale_all = 0, attn = 0;
    if (get_int(sc, path, where, "original_max_position_embeddings", 1, 1L << 30, 0, &c->rope_orig_max_pos, err,
                errlen) ||
        get_num(sc, path, where, "beta_fast", 1e-6, 1e6, &c->yarn_beta_fast, err, errlen) ||
        get_num(sc, path, where, "beta_slow", 1e-6, 1e6, &c->yarn_beta_slow, err, errlen) ||
        get_bool(sc, path, where, "truncate", &c->yarn_truncate, err, errlen) ||
        get_num(sc, path, where, "mscale", 0, 1e6, &mscale, err, errlen) ||
        get_num(sc, path, where, "mscale_all_dim", 0, 1e6, &mscale_all, err, errlen) ||
        get_num(sc, path, where, "attention_factor", 1e-6, 1e6, &attn, err, errlen))
        return -1;
    /* attention_factor, else transformers' get_mscale: 0.1 ln(factor) + 1 (or the mscale ratio) */
    double f = c->rope_factor;
    if (attn > 0) c->yarn_attn_factor = attn;
    else if (mscale != 0 && mscale_all != 0)
        c->yarn_attn_factor = (f <= 1 ? 1 : 0.1 * mscale * log(f) + 1) / (f <= 1 ? 1 : 0.1 * mscale_all * log(f) + 1);
    else
        c->yarn_attn_factor = f <= 1 ? 1 : 0.1 * log(f) + 1;
    return 0;
}

/* Which layers are Gated DeltaNet: "layer_types" when present (trusted
 * over the interval rule: re-architected configs break the pattern), else
 * every full_attention_interval-th layer is full attention. */
static int read_layer_types(Config *c, const Json *t, const char *path, const char *w, char *err, size_t errlen) {
    char b[2 * QUOTE_BUF];
    const Json *lt = field(t, "layer_types");
    if (lt && (lt->type != JSON_ARRAY || lt->len != (size_t)c->n_layers)) {
        snprintf(err, errlen, "%s: field '%slayer_types': expected a list of %d layer types (num_hidden_layers), "
                 "found %s", path, w, c->n_layers, lt->type == JSON_ARRAY ? "another length" : found(lt, b, sizeof b));
        return -1;
    }
    int every = 4;
    if (!lt && get_int(t, path, w, "full_attention_interval", 1, 1024, 0, &every, err, errlen)) return -1;
    c->n_gdn = 0;
    for (int i = 0; i < c->n_layers; i++) {
        const Json *e = lt ? json_at(lt, (size_t)i) : NULL;
        if (e && (e->type != JSON_STRING || (strcmp(e->str, "linear_attention") && strcmp(e->str, "full_attention")))) {
            snprintf(err, errlen, "%s: field '%slayer_types[%d]': expected linear_attention or full_attention, found "
                     "%s", path, w, i, found(e, b, sizeof b));
            return -1;
        }
        c->gdn[i] = e ? strcmp(e->str, "linear_attention") == 0 : (i + 1) % every != 0;
        c->n_gdn += c->gdn[i];
    }
    if (c->n_gdn == c->n_layers) {
        snprintf(err, errlen, "%s: field '%slayer_types': expected at least one full_attention layer, found none",
                 path, w);
        return -1;
    }
    return 0;
}

/* The Gated DeltaNet and gated-attention keys of a Qwen3.5 text config t. */
static int read_qwen35(Config *c, const Json *t, const char *path, const char *w, char *err, size_t errlen) {
    char b[2 * QUOTE_BUF];
    static const char *moe[] = {"num_experts", "num_experts_per_tok", "moe_intermediate_size"};
    for (int i = 0; i < 3; i++)
        if (field(t, moe[i])) {
            snprintf(err, errlen, "%s: field '%s%s': mixture-of-experts models are not supported yet (dense Qwen3.5 "
                     "only)", path, w, moe[i]);
            return -1;
        }
    int dedicated = 0;
    if (get_bool(t, path, w, "mtp_use_dedicated_embeddings", &dedicated, err, errlen)) return -1;
    if (dedicated) {
        snprintf(err, errlen, "%s: field '%smtp_use_dedicated_embeddings': expected false (no checkpoint with its "
                 "tensors is known), found true", path, w);
        return -1;
    }
    c->zero_centred = 1;
    c->attn_gate = 1;
    if (get_bool(t, path, w, "attn_output_gate", &c->attn_gate, err, errlen) ||
        read_layer_types(c, t, path, w, err, errlen))
        return -1;
    if (c->n_gdn &&
        (get_int(t, path, w, "linear_num_key_heads", 1, 1024, 1, &c->lin_k_heads, err, errlen) ||
         get_int(t, path, w, "linear_num_value_heads", 1, 1024, 1, &c->lin_v_heads, err, errlen) ||
         get_int(t, path, w, "linear_key_head_dim", 1, 1024, 1, &c->lin_k_dim, err, errlen) ||
         get_int(t, path, w, "linear_value_head_dim", 1, 1024, 1, &c->lin_v_dim, err, errlen) ||
         get_int(t, path, w, "linear_conv_kernel_dim", 1, 64, 1, &c->conv_k, err, errlen)))
        return -1;
    if (c->n_gdn && c->lin_v_heads % c->lin_k_heads) {
        snprintf(err, errlen, "%s: linear_num_value_heads %d is not a multiple of linear_num_key_heads %d", path,
                 c->lin_v_heads, c->lin_k_heads);
        return -1;
    }
    const Json *ssm = field(t, "mamba_ssm_dtype");
    if (ssm && (ssm->type != JSON_STRING || strcmp(ssm->str, "float32"))) {
        snprintf(err, errlen, "%s: field '%smamba_ssm_dtype': expected \"float32\" (the state is kept in f32), found %s",
                 path, w, found(ssm, b, sizeof b));
        return -1;
    }
    /* partial RoPE: rope_parameters', rope_scaling's (older saves) or the
     * text config's partial_rotary_factor, else transformers' Qwen3.5
     * default, a quarter of each head */
    double part = 0.25;
    const Json *rp = field(t, "rope_parameters"), *rs = field(t, "rope_scaling");
    if (get_num(t, path, w, "partial_rotary_factor", 1e-3, 1, &part, err, errlen) ||
        get_num(rs, path, "rope_scaling.", "partial_rotary_factor", 1e-3, 1, &part, err, errlen) ||
        get_num(rp, path, "rope_parameters.", "partial_rotary_factor", 1e-3, 1, &part, err, errlen))
        return -1;
    c->rot_dim = (int)(c->head_dim * part + 0.5);
    if (c->rot_dim < 2 || c->rot_dim % 2 || fabs(c->rot_dim - c->head_dim * part) > 1e-6) {
        snprintf(err, errlen, "%s: partial_rotary_factor %g of head_dim %d: expected an even number of dims", path,
                 part, c->head_dim);
        return -1;
    }
    return 0;
}

/* Which model family j describes; *t is the object holding its text
 * keys (text_config when present) and *w their prefix in messages. */
static int read_arch(Config *c, const Json *j, const Json **t, const char **w, const char *path, char *err,
                     size_t errlen) {
    char b[2 * QUOTE_BUF];
    const Json *arch = json_at(field(j, "architectures"), 0);
    const char *mt = json_get_str(j, "model_type"), *an = arch && arch->type == JSON_STRING ? arch->str : NULL;
    *t = j, *w = "";
    if ((an && !strcmp(an, "Qwen3ForCausalLM")) || (!an && mt && !strcmp(mt, "qwen3"))) {
        c->arch = ARCH_QWEN3;
        return 0;
    }
    int q35 = (an && (!strcmp(an, "Qwen3_5ForConditionalGeneration") || !strcmp(an, "Qwen3_5ForCausalLM"))) ||
              (!an && mt && (!strcmp(mt, "qwen3_5") || !strcmp(mt, "qwen3_5_text")));
    if (q35) {
        c->arch = ARCH_QWEN35;
        const Json *tc = field(j, "text_config");
        if (tc && tc->type != JSON_OBJECT) {
            snprintf(err, errlen, "%s: field 'text_config': expected an object, found %s", path, found(tc, b, sizeof b));
            return -1;
        }
        if (tc) *t = tc, *w = "text_config.";
        return 0;
    }
    const char *what = (an && strstr(an, "Moe")) || (mt && strstr(mt, "moe")) ? " (mixture-of-experts models are "
                       "not supported yet)" : (mt && !strcmp(mt, "qwen3_next")) ? " (Qwen3-Next packs its layers "
                       "differently: not supported yet)" : "";
    snprintf(err, errlen, "%s: architecture: expected Qwen3ForCausalLM (model_type qwen3) or "
             "Qwen3_5ForConditionalGeneration (qwen3_5), found %s%s", path,
             an ? quote_str(an, b, sizeof b) : mt ? quote_str(mt, b, sizeof b) : "none", what);
    return -1;
}

/* The MTP head's layer count, under either name checkpoints use
 * (num_nextn_predict_layers, mtp_num_hidden_layers): 0 or 1, the one
 * layer model/ runs; both given must agree. */
static int read_mtp(Config *c, const Json *t, const char *path, const char *w, char *err, size_t errlen) {
    int a = -1, b = -1;
    if (get_int(t, path, w, "num_nextn_predict_layers", 0, 1, 0, &a, err, errlen) ||
        get_int(t, path, w, "mtp_num_hidden_layers", 0, 1, 0, &b, err, errlen))
        return -1;
    if (a >= 0 && b >= 0 && a != b) {
        snprintf(err, errlen, "%s: fields '%snum_nextn_predict_layers' (%d) and '%smtp_num_hidden_layers' (%d): "
                 "expected the same MTP layer count", path, w, a, w, b);
        return -1;
    }
    c->mtp_layers = b >= 0 ? b : a >= 0 ? a : 0;
    return 0;
}

int config_parse(Config *c, const Json *j, const char *path, char *err, size_t errlen) {
    char b[2 * QUOTE_BUF];
    memset(c, 0, sizeof *c);
    if (j->type != JSON_OBJECT) {
        snprintf(err, errlen, "%s: expected a JSON object, found %s", path, found(j, b, sizeof b));
        return -1;
    }
    const Json *t;
    const char *w;
    if (read_arch(c, j, &t, &w, path, err, errlen)) return -1;
    const int q35 = c->arch == ARCH_QWEN35;
    if (get_int(t, path, w, "vocab_size", 1, 1 << 24, 1, &c->vocab_size, err, errlen) ||
        get_int(t, path, w, "hidden_size", 1, 1 << 16, 1, &c->hidden, err, errlen) ||
        get_int(t, path, w, "num_hidden_layers", 1, CFG_MAX_LAYERS, 1, &c->n_layers, err, errlen) ||
        get_int(t, path, w, "num_attention_heads", 1, 1024, 1, &c->n_heads, err, errlen) ||
        get_int(t, path, w, "intermediate_size", 1, 1 << 20, 1, &c->ffn, err, errlen))
        return -1;
    c->n_kv_heads = c->n_heads;
    if (get_int(t, path, w, "num_key_value_heads", 1, 1024, 0, &c->n_kv_heads, err, errlen)) return -1;
    /* Qwen3.5's heads are not hidden / heads wide: never inferred there */
    c->head_dim = c->hidden / c->n_heads;
    if (get_int(t, path, w, "head_dim", 1, 1024, q35, &c->head_dim, err, errlen)) return -1;
    c->rot_dim = c->head_dim;
    if (c->n_heads % c->n_kv_heads != 0) {
        snprintf(err, errlen, "%s: num_attention_heads %d is not a multiple of num_key_value_heads %d", path,
                 c->n_heads, c->n_kv_heads);
        return -1;
    }
    /* RoPE rotates pairs; the KV cache takes heads up to KV_MAX_DIM */
    if (c->head_dim % 2 != 0 || c->head_dim < 2 || c->head_dim > KV_MAX_DIM) {
        snprintf(err, errlen, "%s: head_dim: expected an even number in 2..%d, found %d%s", path, KV_MAX_DIM,
                 c->head_dim, field(t, "head_dim") ? "" : " (hidden_size / num_attention_heads)");
        return -1;
    }
    /* transformers' Qwen3Config default */
    c->max_pos = 32768;
    if (get_int(t, path, w, "max_position_embeddings", 1, 1L << 30, 0, &c->max_pos, err, errlen)) return -1;
    c->eps = 1e-6;
    if (field(t, "rms_norm_eps") && (!json_get_num(t, "rms_norm_eps", &c->eps) || !(c->eps > 0) || c->eps > 1)) {
        snprintf(err, errlen, "%s: field '%srms_norm_eps': expected a number in (0, 1], found %s", path, w,
                 found(field(t, "rms_norm_eps"), b, sizeof b));
        return -1;
    }
    if (read_rope(c, t, path, err, errlen)) return -1;
    c->tie_embeddings = 0;
    c->mtp_layers = 0;
    c->bos_id = -1;
    c->media_ids[0] = c->media_ids[1] = -1;
    if (get_bool(t, path, w, "tie_word_embeddings", &c->tie_embeddings, err, errlen) ||
        get_int(t, path, w, "bos_token_id", 0, 1 << 30, 0, &c->bos_id, err, errlen) || read_mtp(c, t, path, w, err, errlen))
        return -1;
    /* Qwen3.5 may say tie_word_embeddings at the top only; text_config wins */
    if (q35 && t != j && !field(t, "tie_word_embeddings") &&
        get_bool(j, path, "", "tie_word_embeddings", &c->tie_embeddings, err, errlen))
        return -1;
    if (q35 && read_qwen35(c, t, path, w, err, errlen)) return -1;
    /* the multimodal config keeps the placeholder ids at the top level */
    if (q35 && (get_int(j, path, "", "image_token_id", 0, 1 << 30, 0, &c->media_ids[0], err, errlen) ||
                get_int(j, path, "", "video_token_id", 0, 1 << 30, 0, &c->media_ids[1], err, errlen)))
        return -1;
    return read_eos(c, t, path, err, errlen) || (t != j && read_eos(c, j, path, err, errlen)) ? -1 : 0;
}

int config_parse_generation(Config *c, GenDefaults *g, const Json *j, const char *path, char *err, size_t errlen) {
    char b[2 * QUOTE_BUF];
    memset(g, 0, sizeof *g);
    if (j->type != JSON_OBJECT) {
        snprintf(err, errlen, "%s: expected a JSON object, found %s", path, found(j, b, sizeof b));
        return -1;
    }
    g->present = 1;
    g->temperature = 1;
    g->top_p = 1;
    if (get_bool(j, path, "", "do_sample", &g->do_sample, err, errlen) ||
        get_num(j, path, "", "temperature", 0, 100, &g->temperature, err, errlen) ||
        get_num(j, path, "", "top_p", 0, 1, &g->top_p, err, errlen) ||
        get_num(j, path, "", "min_p", 0, 1, &g->min_p, err, errlen) ||
        get_int(j, path, "", "top_k", 0, 1 << 30, 0, &g->top_k, err, errlen))
        return -1;
    if (g->top_p <= 0) {
        snprintf(err, errlen, "%s: field 'top_p': expected a number in (0, 1], found 0", path);
        return -1;
    }
    return read_eos(c, j, path, err, errlen);
}
