/* fuzz_config.c: libFuzzer harness for model/config.c.
 *
 * Data flow: the input is a config.json's text -> json_parse ->
 * config_parse, then config_parse_generation on the same tree (as if it
 * were also the generation_config.json) into a copy of the Config, the way
 * model loading reads the two files one after the other.
 * Properties, from config.h and what model_load relies on:
 *   - failure: one non-empty line in err;
 *   - config_parse success: every size >= 1 (and within its cap), heads
 *     divisible by KV heads, head_dim even in 2..KV_MAX_DIM, max_pos >= 1,
 *     eps in (0, 1], rope_theta > 1 and finite, rope_factor >= 1, a known
 *     rope type (yarn: original length >= 1, betas and attention factor
 *     positive and finite), at most CFG_MAX_EOS distinct, non-negative eos ids;
 *   - config_parse_generation success: temperature in [0, 100], top_p in
 *     (0, 1], min_p in [0, 1], top_k >= 0, and the Config unchanged except
 *     for eos ids appended after the ones it had.
 * Built and run by `make fuzz` / `make fuzz-run` (tests/fuzz/run.sh).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/json.h"
#include "kv/kv.h"
#include "model/config.h"

static void die(const char *what) {
    fprintf(stderr, "fuzz_config: property failed: %s\n", what);
    abort();
}

static void check_err(const char *err) {
    if (!err[0] || strpbrk(err, "\r\n")) {
        fprintf(stderr, "err: %s\n", err);
        die("error is not one non-empty line");
    }
}

static void check_eos(const Config *c) {
    if (c->n_eos < 0 || c->n_eos > CFG_MAX_EOS) die("n_eos out of 0..CFG_MAX_EOS");
    for (int i = 0; i < c->n_eos; i++) {
        if (c->eos_ids[i] < 0) die("negative eos id");
        for (int k = 0; k < i; k++)
            if (c->eos_ids[k] == c->eos_ids[i]) die("eos id listed twice");
    }
}

static void check_config(const Config *c) {
    if (c->vocab_size < 1 || c->hidden < 1 || c->n_layers < 1 || c->n_heads < 1 || c->n_kv_heads < 1 ||
        c->ffn < 1)
        die("a size below 1");
    if (c->vocab_size > 1 << 24 || c->hidden > 1 << 16 || c->n_layers > 1024 || c->n_heads > 1024 ||
        c->n_kv_heads > 1024 || c->ffn > 1 << 20)
        die("a size above its cap");
    if (c->n_heads % c->n_kv_heads != 0) die("n_heads not a multiple of n_kv_heads");
    if (c->head_dim % 2 != 0 || c->head_dim < 2 || c->head_dim > KV_MAX_DIM) die("head_dim not even in 2..KV_MAX_DIM");
    if (c->max_pos < 1) die("max_pos < 1");
    if (!(c->eps > 0 && c->eps <= 1)) die("eps outside (0, 1]");
    if (!(c->rope_theta > 1) || !isfinite(c->rope_theta)) die("rope_theta not > 1 and finite");
    if (!(c->rope_factor >= 1) || !isfinite(c->rope_factor)) die("rope_factor not >= 1 and finite");
    if (c->rope_type != ROPE_DEFAULT && c->rope_type != ROPE_LINEAR && c->rope_type != ROPE_YARN)
        die("unknown rope type");
    if (c->rope_type == ROPE_DEFAULT && c->rope_factor != 1) die("default rope with a factor");
    if (c->rope_type == ROPE_YARN &&
        (c->rope_orig_max_pos < 1 || !(c->yarn_beta_fast > 0) || !(c->yarn_beta_slow > 0) ||
         !(c->yarn_attn_factor > 0) || !isfinite(c->yarn_attn_factor) || !isfinite(c->yarn_beta_fast) ||
         !isfinite(c->yarn_beta_slow)))
        die("yarn parameters out of range");
    if (c->mtp_layers < 0 || c->mtp_layers > 16) die("mtp_layers out of 0..16");
    if (c->bos_id < -1) die("bos_id below -1");
    if (c->tie_embeddings != 0 && c->tie_embeddings != 1) die("tie_embeddings not 0 or 1");
    check_eos(c);
}

static int same_double(double x, double y) { return memcmp(&x, &y, sizeof x) == 0; }

static void check_generation(const Config *before, const Config *after, const GenDefaults *g) {
    if (g->present != 1) die("present not set");
    if (g->do_sample != 0 && g->do_sample != 1) die("do_sample not 0 or 1");
    if (!(g->temperature >= 0 && g->temperature <= 100)) die("temperature outside [0, 100]");
    if (!(g->top_p > 0 && g->top_p <= 1)) die("top_p outside (0, 1]");
    if (!(g->min_p >= 0 && g->min_p <= 1)) die("min_p outside [0, 1]");
    if (g->top_k < 0) die("top_k < 0");
    /* only the eos list may change, and only by growing at its end */
    const Config *a = after, *b = before;
    if (a->n_eos < b->n_eos || memcmp(a->eos_ids, b->eos_ids, (size_t)b->n_eos * sizeof *b->eos_ids) != 0)
        die("eos ids lost or reordered");
    check_eos(after);
    /* field by field: a struct copy need not copy padding, so no memcmp of the whole */
    if (a->vocab_size != b->vocab_size || a->hidden != b->hidden || a->n_layers != b->n_layers ||
        a->n_heads != b->n_heads || a->n_kv_heads != b->n_kv_heads || a->head_dim != b->head_dim ||
        a->ffn != b->ffn || a->max_pos != b->max_pos || !same_double(a->eps, b->eps) ||
        !same_double(a->rope_theta, b->rope_theta) || a->rope_type != b->rope_type ||
        !same_double(a->rope_factor, b->rope_factor) || a->rope_orig_max_pos != b->rope_orig_max_pos ||
        !same_double(a->yarn_beta_fast, b->yarn_beta_fast) || !same_double(a->yarn_beta_slow, b->yarn_beta_slow) ||
        !same_double(a->yarn_attn_factor, b->yarn_attn_factor) || a->yarn_truncate != b->yarn_truncate ||
        a->tie_embeddings != b->tie_embeddings || a->mtp_layers != b->mtp_layers || a->bos_id != b->bos_id)
        die("config_parse_generation changed more than the eos ids");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[512] = "";
    Json *j = json_parse((const char *)data, size, err, sizeof err);
    if (!j) return 0; /* fuzz_json.c checks the parser */
    Config c;
    GenDefaults g;
    if (config_parse(&c, j, "config.json", err, sizeof err) == 0) check_config(&c);
    else check_err(err);
    /* the copy starts as config_parse left it, success or not */
    Config c2 = c;
    err[0] = 0;
    if (config_parse_generation(&c2, &g, j, "generation_config.json", err, sizeof err) == 0)
        check_generation(&c, &c2, &g);
    else
        check_err(err);
    json_free(j);
    return 0;
}
