/* config.c: config.json / generation_config.json -> Config (see config.h).
 * Key names follow Hugging Face transformers' Qwen3Config, with the newer
 * `rope_parameters` spelling accepted next to `rope_theta`/`rope_scaling`. */
#include "model/config.h"
#include "format/json.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

/* Reads a required positive integer field or reports which one is wrong. */
static int req_int(const Json *j, const char *path, const char *key, long hi, int *out, char *err, size_t errlen) {
    long v;
    const Json *f = json_get(j, key);
    if (!f) { snprintf(err, errlen, "%s: missing field '%s'", path, key); return -1; }
    if (!json_get_int(j, key, 1, hi, &v)) {
        snprintf(err, errlen, "%s: field '%s': expected an integer in 1..%ld, found %s%s", path, key, hi,
                 f->type == JSON_NUMBER ? "" : "a ", f->type == JSON_NUMBER ? "an out-of-range number" : json_type_name(f->type));
        return -1;
    }
    *out = (int)v;
    return 0;
}

static void add_eos(Config *c, long id) {
    for (int i = 0; i < c->n_eos; i++)
        if (c->eos_ids[i] == id) return;
    if (c->n_eos < CFG_MAX_EOS) c->eos_ids[c->n_eos++] = (int)id;
}

/* eos_token_id is an int or a list of ints. */
static int read_eos(Config *c, const Json *j, const char *path, char *err, size_t errlen) {
    const Json *e = json_get(j, "eos_token_id");
    if (!e || e->type == JSON_NULL) return 0;
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
    const Json *params = json_get(j, "rope_parameters");
    const Json *scaling = json_get(j, "rope_scaling");
    if (scaling && scaling->type == JSON_NULL) scaling = NULL;
    if (!json_get_num(j, "rope_theta", &c->rope_theta) && !json_get_num(params, "rope_theta", &c->rope_theta)) {
        snprintf(err, errlen, "%s: missing field 'rope_theta' (or rope_parameters.rope_theta)", path);
        return -1;
    }
    if (!(c->rope_theta > 1)) {
        snprintf(err, errlen, "%s: field 'rope_theta': expected a number > 1, found %g", path, c->rope_theta);
        return -1;
    }
    /* rope_parameters carries the scaling too in newer configs */
    const Json *sc = scaling ? scaling : params;
    const char *type = json_get_str(sc, "rope_type");
    if (!type) type = json_get_str(sc, "type");
    c->rope_type = ROPE_DEFAULT;
    c->rope_factor = 1;
    if (!type || strcmp(type, "default") == 0) return 0;
    if (!json_get_num(sc, "factor", &c->rope_factor) || !(c->rope_factor >= 1)) {
        snprintf(err, errlen, "%s: rope scaling '%s': expected a numeric 'factor' >= 1", path, type);
        return -1;
    }
    if (strcmp(type, "linear") == 0) { c->rope_type = ROPE_LINEAR; return 0; }
    if (strcmp(type, "yarn") != 0) {
        snprintf(err, errlen, "%s: rope scaling: expected rope_type default, linear or yarn, found '%s'", path, type);
        return -1;
    }
    c->rope_type = ROPE_YARN;
    long omp;
    c->rope_orig_max_pos = json_get_int(sc, "original_max_position_embeddings", 1, 1L << 30, &omp) ? (int)omp : c->max_pos;
    c->yarn_beta_fast = 32;
    c->yarn_beta_slow = 1;
    json_get_num(sc, "beta_fast", &c->yarn_beta_fast);
    json_get_num(sc, "beta_slow", &c->yarn_beta_slow);
    c->yarn_truncate = 1;
    json_get_bool(sc, "truncate", &c->yarn_truncate);
    /* attention_factor, else transformers' get_mscale: 0.1 ln(factor) + 1 (or the mscale ratio) */
    double mscale = 0, mscale_all = 0;
    json_get_num(sc, "mscale", &mscale);
    json_get_num(sc, "mscale_all_dim", &mscale_all);
    if (!json_get_num(sc, "attention_factor", &c->yarn_attn_factor)) {
        double f = c->rope_factor;
        if (mscale != 0 && mscale_all != 0)
            c->yarn_attn_factor = (f <= 1 ? 1 : 0.1 * mscale * log(f) + 1) / (f <= 1 ? 1 : 0.1 * mscale_all * log(f) + 1);
        else
            c->yarn_attn_factor = f <= 1 ? 1 : 0.1 * log(f) + 1;
    }
    return 0;
}

int config_load(Config *c, const char *dir, char *err, size_t errlen) {
    char path[4096];
    memset(c, 0, sizeof *c);
    snprintf(path, sizeof path, "%s/config.json", dir);
    Json *j = json_parse_file(path, err, errlen);
    if (!j) return -1;
    int rc = -1;
    if (j->type != JSON_OBJECT) {
        snprintf(err, errlen, "%s: expected a JSON object, found %s", path, json_type_name(j->type));
        goto done;
    }
    /* Qwen3 dense only: the hybrid Qwen3.5/Next layers are a different model. */
    const Json *arch = json_at(json_get(j, "architectures"), 0);
    const char *mt = json_get_str(j, "model_type");
    int ok_arch = arch && arch->type == JSON_STRING && strcmp(arch->str, "Qwen3ForCausalLM") == 0;
    if (!ok_arch && !(arch == NULL && mt && strcmp(mt, "qwen3") == 0)) {
        snprintf(err, errlen, "%s: architecture: expected Qwen3ForCausalLM (model_type qwen3), found %s", path,
                 arch && arch->type == JSON_STRING ? arch->str : mt ? mt : "none");
        goto done;
    }
    if (req_int(j, path, "vocab_size", 1 << 24, &c->vocab_size, err, errlen) ||
        req_int(j, path, "hidden_size", 1 << 16, &c->hidden, err, errlen) ||
        req_int(j, path, "num_hidden_layers", 1024, &c->n_layers, err, errlen) ||
        req_int(j, path, "num_attention_heads", 1024, &c->n_heads, err, errlen) ||
        req_int(j, path, "intermediate_size", 1 << 20, &c->ffn, err, errlen))
        goto done;
    if (json_get(j, "num_key_value_heads")) {
        if (req_int(j, path, "num_key_value_heads", 1024, &c->n_kv_heads, err, errlen)) goto done;
    } else
        c->n_kv_heads = c->n_heads;
    if (json_get(j, "head_dim")) {
        if (req_int(j, path, "head_dim", 1024, &c->head_dim, err, errlen)) goto done;
    } else
        c->head_dim = c->hidden / c->n_heads;
    if (c->n_heads % c->n_kv_heads != 0) {
        snprintf(err, errlen, "%s: num_attention_heads %d is not a multiple of num_key_value_heads %d", path,
                 c->n_heads, c->n_kv_heads);
        goto done;
    }
    if (c->head_dim % 2 != 0) {
        snprintf(err, errlen, "%s: head_dim: expected an even number (RoPE pairs), found %d", path, c->head_dim);
        goto done;
    }
    long v;
    c->max_pos = json_get_int(j, "max_position_embeddings", 1, 1L << 30, &v) ? (int)v : 40960;
    c->eps = 1e-6;
    if (json_get(j, "rms_norm_eps") && (!json_get_num(j, "rms_norm_eps", &c->eps) || !(c->eps > 0) || c->eps > 1)) {
        snprintf(err, errlen, "%s: field 'rms_norm_eps': expected a number in (0, 1]", path);
        goto done;
    }
    if (read_rope(c, j, path, err, errlen)) goto done;
    c->tie_embeddings = 0;
    json_get_bool(j, "tie_word_embeddings", &c->tie_embeddings);
    c->mtp_layers = 0;
    if (json_get_int(j, "num_nextn_predict_layers", 0, 16, &v) || json_get_int(j, "mtp_num_hidden_layers", 0, 16, &v))
        c->mtp_layers = (int)v;
    c->bos_id = json_get_int(j, "bos_token_id", 0, 1L << 30, &v) ? (int)v : -1;
    if (read_eos(c, j, path, err, errlen)) goto done;
    rc = 0;
done:
    json_free(j);
    return rc;
}

int config_load_generation(Config *c, GenDefaults *g, const char *dir, char *err, size_t errlen) {
    char path[4096];
    struct stat st;
    memset(g, 0, sizeof *g);
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    if (stat(path, &st) != 0) return 0;
    Json *j = json_parse_file(path, err, errlen);
    if (!j) return -1;
    int rc = -1;
    long v;
    if (j->type != JSON_OBJECT) {
        snprintf(err, errlen, "%s: expected a JSON object, found %s", path, json_type_name(j->type));
        goto done;
    }
    g->present = 1;
    g->temperature = 1;
    g->top_p = 1;
    json_get_bool(j, "do_sample", &g->do_sample);
    json_get_num(j, "temperature", &g->temperature);
    json_get_num(j, "top_p", &g->top_p);
    json_get_num(j, "min_p", &g->min_p);
    if (json_get_int(j, "top_k", 0, 1L << 30, &v)) g->top_k = (int)v;
    if (g->temperature < 0 || g->top_p <= 0 || g->top_p > 1 || g->min_p < 0 || g->min_p > 1) {
        snprintf(err, errlen, "%s: sampling defaults out of range (temperature >= 0, top_p in (0,1], min_p in [0,1])", path);
        goto done;
    }
    if (read_eos(c, j, path, err, errlen)) goto done;
    rc = 0;
done:
    json_free(j);
    return rc;
}
