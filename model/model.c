/* model.c: loading a Qwen3 checkpoint and its forward pass (see model.h).
 *
 * Data flow: run.c -> model -> attn -> kv -> kernels. run.c (and speculative/,
 * eval/) call model_forward; tensors come from format/safetensors.c through
 * model/source.c, the matmuls and row ops from kernels/, attention from
 * attn/ over the kv/ cache. One decoder layer (layer_forward), n tokens:
 *
 *   x [n, H] -> RMSNorm -> q [n, nH*hd], k, v [n, nKV*hd] -> per-head RMSNorm,
 *   RoPE -> attention -> o_proj -> + x -> RMSNorm -> gate, up [n, I] ->
 *   SwiGLU -> down -> + x
 *
 * Follows the Hugging Face transformers Qwen3 modelling code, summarised in
 * shared/specs/qwen3.md: pre-norm decoder layers, q/k RMSNorm per head before
 * NeoX RoPE, GQA, SwiGLU MLP, final RMSNorm, tied or untied lm_head.
 */
#include "model/model.h"
#include "attn/attn.h"
#include "format/quote.h"
#include "kernels/ops.h"

#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Tokens per forward chunk: bounds scratch memory (about 80 KB a token on
 * 0.6B with the matmul buffers); long prompts loop. 256 tokens: each
 * matmul's weights stream from memory once per chunk, so larger chunks
 * read them fewer times (measurements: docs/kernel-notes.md#chunk-size). */
#define MODEL_BATCH 256

/* ---- loading ---- */

static const char *tensor_file(const Model *m, const STensor *t) { return m->ts.files[t->file].path; }

static int dtype_of(const Model *m, const STensor *t, DType *dt, char *err, size_t errlen) {
    if (strcmp(t->dtype, "BF16") == 0) *dt = DT_BF16;
    else if (strcmp(t->dtype, "F16") == 0) *dt = DT_F16;
    else if (strcmp(t->dtype, "F32") == 0) *dt = DT_F32;
    else {
        snprintf(err, errlen, "%s: tensor '%s': dtype %s not supported (expected BF16, F16 or F32)",
                 tensor_file(m, t), t->name, t->dtype);
        return -1;
    }
    return 0;
}

/* Finds name and checks it is [rows, cols] (cols = 0: a vector [rows]). */
static const STensor *find_checked(const Model *m, const char *name, int rows, int cols, char *err, size_t errlen) {
    const STensor *t = st_find(&m->ts, name);
    if (!t) {
        snprintf(err, errlen, "%s: missing tensor '%s'", m->ts.files[0].path, name);
        return NULL;
    }
    int ndim = cols ? 2 : 1;
    if (t->ndim != ndim || t->shape[0] != rows || (cols && t->shape[1] != cols)) {
        char found[96] = "[";
        for (int i = 0; i < t->ndim; i++) {
            size_t l = strlen(found);
            snprintf(found + l, sizeof found - l, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
        }
        strncat(found, "]", sizeof found - strlen(found) - 1);
        if (cols)
            snprintf(err, errlen, "%s: tensor '%s': expected shape [%d, %d] from config.json, found %s",
                     tensor_file(m, t), name, rows, cols, found);
        else
            snprintf(err, errlen, "%s: tensor '%s': expected shape [%d] from config.json, found %s", tensor_file(m, t),
                     name, rows, found);
        return NULL;
    }
    return t;
}

static int load_matrix(const Model *m, const char *name, int rows, int cols, Weight *w, char *err, size_t errlen) {
    const STensor *t = find_checked(m, name, rows, cols, err, errlen);
    if (!t || dtype_of(m, t, &w->dtype, err, errlen)) return -1;
    w->data = t->data;
    w->rows = rows;
    w->cols = cols;
    return 0;
}

/* Norm weights are tiny: widen them to f32 once. */
static int load_vector(const Model *m, const char *name, int n, float **out, char *err, size_t errlen) {
    Weight w;
    const STensor *t = find_checked(m, name, n, 0, err, errlen);
    if (!t || dtype_of(m, t, &w.dtype, err, errlen)) return -1;
    w.data = t->data;
    w.rows = 1;
    w.cols = n;
    *out = malloc((size_t)n * sizeof(float));
    if (!*out) { snprintf(err, errlen, "out of memory"); return -1; }
    weight_row(&w, 0, *out);
    /* read whole here anyway, so checked here: a NaN in a norm turns every
     * later activation into NaN */
    long bad = find_nonfinite(*out, n);
    if (bad >= 0) {
        snprintf(err, errlen, "%s: tensor '%s': element %ld is %s, expected finite numbers", tensor_file(m, t), name,
                 bad, isnan((*out)[bad]) ? "NaN" : "infinite");
        return -1;
    }
    return 0;
}

static int load_layer(const Model *m, Layer *L, const char *prefix, char *err, size_t errlen) {
    const Config *c = &m->cfg;
    int H = c->hidden, hd = c->head_dim, qd = c->n_heads * hd, kvd = c->n_kv_heads * hd;
    char name[256];
#define NAME(s) (snprintf(name, sizeof name, "%s%s", prefix, s), name)
    if (load_vector(m, NAME("input_layernorm.weight"), H, &L->in_norm, err, errlen) ||
        load_vector(m, NAME("post_attention_layernorm.weight"), H, &L->post_norm, err, errlen) ||
        load_vector(m, NAME("self_attn.q_norm.weight"), hd, &L->q_norm, err, errlen) ||
        load_vector(m, NAME("self_attn.k_norm.weight"), hd, &L->k_norm, err, errlen) ||
        load_matrix(m, NAME("self_attn.q_proj.weight"), qd, H, &L->wq, err, errlen) ||
        load_matrix(m, NAME("self_attn.k_proj.weight"), kvd, H, &L->wk, err, errlen) ||
        load_matrix(m, NAME("self_attn.v_proj.weight"), kvd, H, &L->wv, err, errlen) ||
        load_matrix(m, NAME("self_attn.o_proj.weight"), H, qd, &L->wo, err, errlen) ||
        load_matrix(m, NAME("mlp.gate_proj.weight"), c->ffn, H, &L->wg, err, errlen) ||
        load_matrix(m, NAME("mlp.up_proj.weight"), c->ffn, H, &L->wu, err, errlen) ||
        load_matrix(m, NAME("mlp.down_proj.weight"), H, c->ffn, &L->wd, err, errlen))
        return -1;
#undef NAME
    return 0;
}

static void free_layer(Layer *L) {
    free(L->in_norm);
    free(L->post_norm);
    free(L->q_norm);
    free(L->k_norm);
    Weight *w[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->wg, &L->wu, &L->wd};
    for (int i = 0; i < 7; i++) weight_free(w[i]);
}

/* RoPE frequencies theta^(-2i/d), rescaled for linear or YaRN scaling
 * (transformers' _compute_yarn_parameters). */
static void rope_init(Model *m) {
    const Config *c = &m->cfg;
    int half = c->head_dim / 2, d = c->head_dim;
    m->rope_mscale = 1;
    for (int i = 0; i < half; i++) m->inv_freq[i] = pow(c->rope_theta, -2.0 * i / d);
    if (c->rope_type == ROPE_LINEAR)
        for (int i = 0; i < half; i++) m->inv_freq[i] /= c->rope_factor;
    if (c->rope_type != ROPE_YARN) return;
    /* dims whose wavelength fits the original context keep their frequency
     * (extrapolation), long ones are interpolated by factor, a linear ramp between */
    double lo = d * log(c->rope_orig_max_pos / (c->yarn_beta_fast * 2 * M_PI)) / (2 * log(c->rope_theta));
    double hi = d * log(c->rope_orig_max_pos / (c->yarn_beta_slow * 2 * M_PI)) / (2 * log(c->rope_theta));
    if (c->yarn_truncate) { lo = floor(lo); hi = ceil(hi); }
    if (lo < 0) lo = 0;
    if (hi > d - 1) hi = d - 1;
    if (lo == hi) hi += 0.001;
    for (int i = 0; i < half; i++) {
        double ramp = (i - lo) / (hi - lo);
        ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
        double extrap = 1 - ramp;
        m->inv_freq[i] = m->inv_freq[i] / c->rope_factor * (1 - extrap) + m->inv_freq[i] * extrap;
    }
    m->rope_mscale = (float)c->yarn_attn_factor;
}

/* n floats on a 64-byte boundary, so that the kernels' 16-float loads of
 * activation rows whose length is a multiple of 16 never straddle two
 * cache lines. */
static float *floats64(size_t n) { return aligned_alloc(64, (n * sizeof(float) + 63) & ~(size_t)63); }

static int scratch_init(Model *m, char *err, size_t errlen) {
    const Config *c = &m->cfg;
    Scratch *s = &m->s;
    size_t cap = MODEL_BATCH, H = (size_t)c->hidden, qd = (size_t)c->n_heads * c->head_dim;
    size_t kvd = (size_t)c->n_kv_heads * c->head_dim, I = (size_t)c->ffn, half = (size_t)c->head_dim / 2;
    s->cap = MODEL_BATCH;
    s->threads = omp_get_max_threads();
    s->x = floats64(cap * H);
    s->xb = floats64(cap * H);
    s->q = floats64(cap * qd);
    s->k = floats64(cap * kvd);
    s->v = floats64(cap * kvd);
    s->att = floats64(cap * qd);
    s->hb = floats64(cap * I);
    s->hb2 = floats64(cap * I);
    s->rope_cs = floats64(cap * half);
    s->rope_sn = floats64(cap * half);
    const int grp = c->n_heads / c->n_kv_heads;
    s->attn_scratch = floats64((size_t)s->threads * attn_scratch_floats(grp * attn_block_tokens(grp), c->head_dim));
    if (m->has_mtp) s->cat = floats64(cap * 2 * H);
    /* the widest input any projection here takes: hidden, attention out,
     * ffn, or the MTP head's concatenation */
    size_t wide = H > qd ? H : qd;
    wide = I > wide ? I : wide;
    if (m->has_mtp) wide = 2 * H > wide ? 2 * H : wide;
    if ((m->has_mtp && !s->cat) || !s->x || !s->xb || !s->q || !s->k || !s->v || !s->att || !s->hb || !s->hb2 || !s->rope_cs || !s->rope_sn ||
        !s->attn_scratch || matmul_reserve((int)cap, (int)wide)) {
        snprintf(err, errlen, "out of memory for activations");
        return -1;
    }
    return 0;
}

static void scratch_free(Scratch *s) {
    free(s->x);
    free(s->xb);
    free(s->q);
    free(s->k);
    free(s->v);
    free(s->att);
    free(s->hb);
    free(s->hb2);
    free(s->rope_cs);
    free(s->rope_sn);
    free(s->attn_scratch);
    free(s->cat);
}

/* The MTP norms are used as stored, y = x^ * w: Qwen3 dense checkpoints (the
 * only family this loader accepts, the shipped model and the fixtures
 * included) store plain weights. Qwen3.5/Next store zero-centred ones,
 * y = x^ * (1 + w); supporting them means adding 1 to the three MTP norm
 * vectors here, and nowhere else. */
static int load_mtp(Model *m, char *err, size_t errlen) {
    int H = m->cfg.hidden;
    if (m->cfg.mtp_layers != 1) {
        snprintf(err, errlen, "config.json: expected 0 or 1 MTP layers, found %d", m->cfg.mtp_layers);
        return -1;
    }
    if (load_matrix(m, "mtp.fc.weight", H, 2 * H, &m->mtp_fc, err, errlen) ||
        load_vector(m, "mtp.pre_fc_norm_embedding.weight", H, &m->mtp_norm_emb, err, errlen) ||
        load_vector(m, "mtp.pre_fc_norm_hidden.weight", H, &m->mtp_norm_hid, err, errlen) ||
        load_vector(m, "mtp.norm.weight", H, &m->mtp_norm, err, errlen) ||
        load_layer(m, &m->mtp_layer, "mtp.layers.0.", err, errlen))
        return -1;
    m->has_mtp = 1;
    return 0;
}

/* Relays w with to (weight_to_panels or weight_to_dpanels) when it is bf16
 * in the loader's copy of its file. 0 done; else why it stays as stored:
 * 1 not bf16, 2 not in that copy (a file mapping, or a tensor the loader
 * moved apart for its alignment), 3 refused by to (its shape, alignment or
 * memory). Every kernel also reads it as stored, except that DT_BF16D's
 * bf16 activations have no other layout. */
static int relay(Model *m, Weight *w, int (*to)(Weight *)) {
    if (w->dtype != DT_BF16) return 1;
    if (!st_in_copy(&m->ts, w->data, (size_t)w->rows * w->cols * 2)) return 2;
    return to(w) ? 3 : 0;
}

/* One line in err on why matrix what could not be relaid for bf16 inputs. */
static void relay_error(const Weight *w, int why, const char *what, char *err, size_t errlen) {
    if (why == 1)
        snprintf(err, errlen, "bf16 activations: %s is %s, expected BF16", what, w->dtype == DT_F32 ? "F32" : "F16");
    else if (why == 2)
        snprintf(err, errlen, "bf16 activations: %s is not in the loader's copy of the checkpoint (made only when the "
                 "files fit in half the memory; tensors at odd offsets are kept apart), so it cannot be relaid", what);
    else
        snprintf(err, errlen, "bf16 activations: %s [%d, %d] could not be relaid: expected rows a multiple of 16, an "
                 "even number of columns and data on a 4-byte boundary (or memory ran out)", what, w->rows, w->cols);
}

/* Every bf16 matrix into panels, the layout the AVX-512 kernel reads best
 * (kernels/matmul.h; docs/kernel-notes.md#bf16-panels);
 * with act_bf16 into DT_BF16D instead, and then every matrix a matmul
 * reads must take it (-1 with err naming the first that cannot). A tied
 * lm_head follows the embedding, whose lookups then read panels too. */
static int to_panels(Model *m, int act_bf16, char *err, size_t errlen) {
    int (*to)(Weight *) = act_bf16 ? weight_to_dpanels : weight_to_panels;
    /* copies it cannot write stay as they are, and read-only */
    if (st_copies_writable(&m->ts, 1)) {
        st_copies_writable(&m->ts, 0);
        if (!act_bf16) return 0;
        snprintf(err, errlen, "bf16 activations: the weights' memory could not be made writable to relay them");
        return -1;
    }
    static const char *names[] = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
    char what[64];
    int why = relay(m, &m->embed, to), rc = 0;
    /* an untied embedding is only looked up, in any layout */
    if (act_bf16 && why && m->cfg.tie_embeddings) {
        relay_error(&m->embed, why, "model.embed_tokens", err, errlen);
        rc = -1;
    }
    if (m->lm_head.data == m->embed.data) m->lm_head = m->embed;
    else if ((why = relay(m, &m->lm_head, to)) && act_bf16 && !rc) {
        relay_error(&m->lm_head, why, "lm_head", err, errlen);
        rc = -1;
    }
    for (int l = 0; l < m->cfg.n_layers + m->has_mtp && !rc; l++) {
        Layer *L = l < m->cfg.n_layers ? &m->layers[l] : &m->mtp_layer;
        Weight *w[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->wg, &L->wu, &L->wd};
        for (int i = 0; i < 7 && !rc; i++)
            if ((why = relay(m, w[i], to)) && act_bf16) {
                if (l < m->cfg.n_layers) snprintf(what, sizeof what, "model.layers.%d.%s", l, names[i]);
                else snprintf(what, sizeof what, "mtp.layers.0.%s", names[i]);
                relay_error(w[i], why, what, err, errlen);
                rc = -1;
            }
    }
    if (m->has_mtp && !rc && (why = relay(m, &m->mtp_fc, to)) && act_bf16) {
        relay_error(&m->mtp_fc, why, "mtp.fc", err, errlen);
        rc = -1;
    }
    st_copies_writable(&m->ts, 0);
    return rc;
}

int model_load(Model *m, const char *path, int flags, char *err, size_t errlen) {
    ModelSource src;
    if (source_open(&src, path, err, errlen)) return -1;
    int rc = model_load_source(m, &src, flags, err, errlen);
    source_free(&src);
    return rc;
}

int model_load_source(Model *m, const ModelSource *src, int flags, char *err, size_t errlen) {
    memset(m, 0, sizeof *m);
    if (source_config(src, &m->cfg, err, errlen) || source_tensors(src, &m->ts, err, errlen)) return -1;
    const Config *c = &m->cfg;
    if (flags & MODEL_ACT_BF16) {
        if (flags & MODEL_MAPPED) {
            snprintf(err, errlen, "bf16 activations: the weights must be read into memory to be relaid (not mapped)");
            goto fail;
        }
        if (!matmul_has_dpanels()) {
            snprintf(err, errlen, "bf16 activations: need AVX-512 BF16 (vdpbf16ps), which this CPU at kernel level %s lacks",
                     kernels_isa());
            goto fail;
        }
    }
    if (!(flags & MODEL_MAPPED)) st_to_memory(&m->ts);
    int H = c->hidden, V = c->vocab_size;
    m->layers = calloc((size_t)c->n_layers, sizeof(Layer));
    m->inv_freq = malloc((size_t)(c->head_dim / 2) * sizeof(double));
    if (!m->layers || !m->inv_freq) { snprintf(err, errlen, "out of memory"); goto fail; }
    if (load_matrix(m, "model.embed_tokens.weight", V, H, &m->embed, err, errlen) ||
        load_vector(m, "model.norm.weight", H, &m->final_norm, err, errlen))
        goto fail;
    /* A tied checkpoint may still ship lm_head.weight: the embedding wins. */
    if (c->tie_embeddings) m->lm_head = m->embed;
    else if (load_matrix(m, "lm_head.weight", V, H, &m->lm_head, err, errlen)) goto fail;
    for (int l = 0; l < c->n_layers; l++) {
        char prefix[64];
        snprintf(prefix, sizeof prefix, "model.layers.%d.", l);
        if (load_layer(m, &m->layers[l], prefix, err, errlen)) goto fail;
    }
    if (c->mtp_layers > 0 && load_mtp(m, err, errlen)) goto fail;
    /* MODEL_ACT_BF16 was refused above where panels have no kernel */
    if (matmul_has_panels() && to_panels(m, flags & MODEL_ACT_BF16, err, errlen)) goto fail;
    m->mtp_head = m->lm_head;
    rope_init(m);
    if (scratch_init(m, err, errlen)) goto fail;
    return 0;
fail:
    model_free(m);
    return -1;
}

/* w in place of its q8 copy; the stored matrix stays mapped. A width that
 * is not whole 32-column blocks (no Qwen3 shape has one) stays as stored.
 * Drafts take DT_Q8I where its integer kernel runs (rows in 16-row tiles),
 * else plain q8. A matrix already q8 (shared with lm_head) is kept. */
static int quantize(Weight *w, int draft, const char *name, char *err, size_t errlen) {
    Weight q;
    if (w->dtype == DT_Q8 || w->dtype == DT_Q8I || w->cols % 32) return 0;
    const int q8i = draft && matmul_has_q8i() && w->rows % 16 == 0;
    const int rc = q8i ? weight_quantize_q8i(w, &q) : weight_quantize_q8(w, &q);
    if (rc == -2) {
        snprintf(err, errlen, "q8 weights: %s holds a NaN or an infinity, expected finite numbers", name);
        return -1;
    }
    if (rc) {
        snprintf(err, errlen, "q8 weights: out of memory for a copy of %s [%d, %d]", name, w->rows, w->cols);
        return -1;
    }
    *w = q;
    return 0;
}

static int quantize_layer(Layer *L, int draft, const char *prefix, char *err, size_t errlen) {
    static const char *names[] = {"self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                                  "self_attn.o_proj.weight", "mlp.gate_proj.weight",    "mlp.up_proj.weight",
                                  "mlp.down_proj.weight"};
    Weight *w[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->wg, &L->wu, &L->wd};
    for (int i = 0; i < 7; i++) {
        char name[96];
        snprintf(name, sizeof name, "%s%s", prefix, names[i]);
        if (quantize(w[i], draft, name, err, errlen)) return -1;
    }
    return 0;
}

int model_quantize(Model *m, int part, char *err, size_t errlen) {
    if (part != MODEL_MAIN && part != MODEL_DRAFT) {
        snprintf(err, errlen, "model_quantize: expected MODEL_MAIN or MODEL_DRAFT, found %d", part);
        return -1;
    }
    if (part == MODEL_DRAFT) {
        if (!m->has_mtp) return 0;
        const char *head = m->cfg.tie_embeddings ? "model.embed_tokens.weight (the drafts' lm_head)"
                                                 : "lm_head.weight (the drafts')";
        return quantize(&m->mtp_fc, 1, "mtp.fc.weight", err, errlen) ||
                       quantize_layer(&m->mtp_layer, 1, "mtp.layers.0.", err, errlen) ||
                       quantize(&m->mtp_head, 1, head, err, errlen)
                   ? -1
                   : 0;
    }
    for (int l = 0; l < m->cfg.n_layers; l++) {
        char prefix[32];
        snprintf(prefix, sizeof prefix, "model.layers.%d.", l);
        if (quantize_layer(&m->layers[l], 0, prefix, err, errlen)) return -1;
    }
    /* drafts that shared lm_head share its copy */
    const int shared = m->mtp_head.data == m->lm_head.data;
    if (quantize(&m->lm_head, 0, m->cfg.tie_embeddings ? "model.embed_tokens.weight (as lm_head)" : "lm_head.weight",
                 err, errlen))
        return -1;
    if (shared) m->mtp_head = m->lm_head;
    return 0;
}

void model_free(Model *m) {
    if (m->mtp_head.data != m->lm_head.data) weight_free(&m->mtp_head);
    weight_free(&m->lm_head);
    weight_free(&m->mtp_fc);
    if (m->layers)
        for (int l = 0; l < m->cfg.n_layers; l++) free_layer(&m->layers[l]);
    free(m->layers);
    free(m->final_norm);
    free(m->inv_freq);
    free(m->mtp_norm_emb);
    free(m->mtp_norm_hid);
    free(m->mtp_norm);
    free_layer(&m->mtp_layer);
    scratch_free(&m->s);
    st_close(&m->ts);
    memset(m, 0, sizeof *m);
}

int model_kv_init(const Model *m, KVCache *kv, const KVSpec *spec, int ctx, int mtp, char *err, size_t errlen) {
    const Config *c = &m->cfg;
    return kv_cache_init(kv, spec, mtp ? 1 : c->n_layers, c->n_kv_heads, c->head_dim, ctx, err, errlen);
}

/* ---- forward ---- */

/* cos/sin tables for positions pos..pos+n-1; angles in double so that long
 * contexts do not lose the phase. */
static void rope_tables(Model *m, int pos, int n) {
    int half = m->cfg.head_dim / 2;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < half; j++) {
            double a = (double)(pos + i) * m->inv_freq[j];
            m->s.rope_cs[i * half + j] = (float)cos(a) * m->rope_mscale;
            m->s.rope_sn[i * half + j] = (float)sin(a) * m->rope_mscale;
        }
}

/* Row loops over fewer elements than this run on one thread: waking the
 * team costs microseconds, about what normalising a few rows costs
 * (docs/kernel-notes.md#row-loop-threads). */
#define PAR_MIN 32768

/* One decoder layer on x [n, H] in place; its K/V go to layer cl of kv. */
static void layer_forward(Model *m, const Layer *L, KVCache *kv, int cl, int n) {
    const Config *c = &m->cfg;
    Scratch *s = &m->s;
    const int H = c->hidden, hd = c->head_dim, nh = c->n_heads, nkv = c->n_kv_heads, grp = nh / nkv;
    const int qd = nh * hd, kvd = nkv * hd, half = hd / 2;
    const float eps = (float)c->eps, scale = 1.0f / sqrtf((float)hd);

#pragma omp parallel for schedule(static) if (n * H >= PAR_MIN)
    for (int i = 0; i < n; i++) rmsnorm(s->xb + (size_t)i * H, s->x + (size_t)i * H, L->in_norm, H, eps);
    float *qkv[] = {s->q, s->k, s->v};
    const Weight *wqkv[] = {&L->wq, &L->wk, &L->wv};
    matmul_multi(qkv, wqkv, 3, s->xb, n);
    /* per-head q/k RMSNorm, then RoPE at each token's position */
#pragma omp parallel for schedule(static) if (n * (qd + kvd) >= PAR_MIN)
    for (int i = 0; i < n; i++) {
        const float *cs = s->rope_cs + (size_t)i * half, *sn = s->rope_sn + (size_t)i * half;
        for (int h = 0; h < nh; h++) {
            float *q = s->q + (size_t)i * qd + (size_t)h * hd;
            rmsnorm(q, q, L->q_norm, hd, eps);
            rope(q, cs, sn, hd);
        }
        for (int h = 0; h < nkv; h++) {
            float *k = s->k + (size_t)i * kvd + (size_t)h * hd;
            rmsnorm(k, k, L->k_norm, hd, eps);
            rope(k, cs, sn, hd);
        }
    }
    if (m->trace_q && L != &m->mtp_layer)
        memcpy(m->trace_q + (size_t)cl * s->cap * qd, s->q, (size_t)n * qd * sizeof(float));
    /* Each kv head is an independent stream: one thread appends a few
     * positions and attends from all of them at once (attn_block), with the
     * same bits as decode appending and attending one by one; a windowed
     * scheme, whose appends change earlier positions, goes one by one. */
    const int blk = attn_block_tokens(grp);
    size_t per = attn_scratch_floats(grp * blk, hd);
    /* scratch was sized for s->threads at load: never run more */
#pragma omp parallel for schedule(static) num_threads(s->threads)
    for (int h = 0; h < nkv; h++) {
        float *scr = s->attn_scratch + (size_t)omp_get_thread_num() * per;
        KVStream *ks = kv_k(kv, cl, h), *vs = kv_v(kv, cl, h);
        const int block = ks->scheme->windowed || vs->scheme->windowed ? 1 : blk;
        for (int i0 = 0; i0 < n; i0 += block) {
            const int b = n - i0 < block ? n - i0 : block;
            for (int i = i0; i < i0 + b; i++) {
                kv_stream_append(ks, s->k + (size_t)i * kvd + (size_t)h * hd);
                kv_stream_append(vs, s->v + (size_t)i * kvd + (size_t)h * hd);
            }
            size_t qo = (size_t)i0 * qd + (size_t)h * grp * hd;
            attn_block(ks, vs, s->q + qo, grp, b, qd, scale, s->att + qo, scr);
        }
    }
    matmul(s->xb, s->att, &L->wo, n);
    /* residual, then the MLP's pre-norm, row by row */
#pragma omp parallel for schedule(static) if (n * H >= PAR_MIN)
    for (int i = 0; i < n; i++) {
        float *x = s->x + (size_t)i * H, *xb = s->xb + (size_t)i * H;
        for (int j = 0; j < H; j++) x[j] += xb[j];
        rmsnorm(xb, x, L->post_norm, H, eps);
    }
    float *gu[] = {s->hb, s->hb2};
    const Weight *wgu[] = {&L->wg, &L->wu};
    matmul_multi(gu, wgu, 2, s->xb, n);
    /* swiglu's exp makes it worth threads sooner than the other row loops */
#pragma omp parallel for schedule(static) if (n * c->ffn >= PAR_MIN / 8)
    for (int i = 0; i < n; i++) swiglu(s->hb + (size_t)i * c->ffn, s->hb2 + (size_t)i * c->ffn, c->ffn);
    matmul(s->xb, s->hb, &L->wd, n);
#pragma omp parallel for schedule(static) if (n * H >= PAR_MIN)
    for (size_t j = 0; j < (size_t)n * H; j++) s->x[j] += s->xb[j];
}

/* The first of rows [n, width] holding a NaN or an infinity, or -1. */
static int bad_row(const float *x, int n, int width) {
    long i = find_nonfinite(x, (long)n * width);
    return i < 0 ? -1 : (int)(i / width);
}

/* After non-finite outputs at position pos: names the first tensor of the
 * checkpoint that holds a NaN or an infinity (relaid matrices keep their
 * values, only their order changes), else says the activations overflowed.
 * Scanning every tensor costs a pass over the weights, paid only here. */
static void nonfinite_error(const Model *m, const char *what, int pos, char *err, size_t errlen) {
    for (int i = 0; i < m->ts.n_tensors; i++) {
        const STensor *t = &m->ts.tensors[i];
        int f32 = strcmp(t->dtype, "F32") == 0, bf16 = strcmp(t->dtype, "BF16") == 0;
        if (!f32 && !bf16 && strcmp(t->dtype, "F16") != 0) continue;
        /* NaN and infinity: the exponent field all ones */
        const uint32_t mask = f32 ? 0x7F800000u : bf16 ? 0x7F80u : 0x7C00u;
        size_t n = t->nbytes / (f32 ? 4 : 2);
        for (size_t k = 0; k < n; k++) {
            uint32_t u = 0;
            memcpy(&u, (const char *)t->data + k * (f32 ? 4 : 2), f32 ? 4 : 2);
            if ((u & mask) == mask) {
                char q[QUOTE_BUF];
                snprintf(err, errlen, "%s: non-finite values at position %d: tensor %s of %s holds a NaN or an "
                         "infinity", what, pos, quote_str(t->name, q, sizeof q), m->ts.files[t->file].path);
                return;
            }
        }
    }
    snprintf(err, errlen, "%s: non-finite values at position %d, though every weight is finite (the activations "
             "overflowed)", what, pos);
}

/* One chunk of at most MODEL_BATCH tokens at positions pos..pos+n-1.
 * Returns the first row whose hidden state or logits are not all finite,
 * or -1. */
static int forward_chunk(Model *m, KVCache *kv, const int *tokens, int n, int pos, float *logits, int all_logits,
                         float *hidden) {
    const Config *c = &m->cfg;
    Scratch *s = &m->s;
    const int H = c->hidden;
    for (int i = 0; i < n; i++) weight_row(&m->embed, tokens[i], s->x + (size_t)i * H);
    rope_tables(m, pos, n);
    for (int l = 0; l < c->n_layers; l++) layer_forward(m, &m->layers[l], kv, l, n);
    for (int i = 0; i < n; i++) rmsnorm(s->xb + (size_t)i * H, s->x + (size_t)i * H, m->final_norm, H, (float)c->eps);
    if (hidden) memcpy(hidden, s->xb, (size_t)n * H * sizeof(float));
    if (logits && all_logits) matmul(logits, s->xb, &m->lm_head, n);
    else if (logits) matmul(logits, s->xb + (size_t)(n - 1) * H, &m->lm_head, 1);
    /* checking costs a read of the outputs, next to a read of all weights */
    int bad = bad_row(s->xb, n, H);
    if (bad < 0 && logits && all_logits) bad = bad_row(logits, n, c->vocab_size);
    else if (bad < 0 && logits && bad_row(logits, 1, c->vocab_size) == 0) bad = n - 1;
    return bad;
}

int model_forward(Model *m, KVCache *kv, const int *tokens, int n, float *logits, int all_logits, float *hidden,
                  char *err, size_t errlen) {
    const Config *c = &m->cfg;
    int pos = kv_cache_len(kv);
    if (n < 1) { snprintf(err, errlen, "model_forward: expected at least one token"); return -1; }
    if (pos + n > kv->cap) {
        snprintf(err, errlen, "context full: %d cached + %d new tokens exceed the context of %d (raise -c)", pos, n,
                 kv->cap);
        return -1;
    }
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= c->vocab_size) {
            snprintf(err, errlen, "token id %d at position %d: expected 0..%d", tokens[i], pos + i, c->vocab_size - 1);
            return -1;
        }
    for (int off = 0; off < n; off += m->s.cap) {
        int nb = n - off < m->s.cap ? n - off : m->s.cap, last = off + nb == n;
        float *lg = logits && (all_logits || last) ? logits + (all_logits ? (size_t)off * c->vocab_size : 0) : NULL;
        int bad = forward_chunk(m, kv, tokens + off, nb, pos + off, lg, all_logits,
                                hidden ? hidden + (size_t)off * c->hidden : NULL);
        if (bad >= 0) {
            nonfinite_error(m, "model", pos + off + bad, err, errlen);
            return -1;
        }
    }
    return 0;
}

int model_mtp_forward(Model *m, KVCache *mkv, const float *hidden, const int *tokens, int n, float *logits,
                      int all_logits, float *hm, char *err, size_t errlen) {
    const Config *c = &m->cfg;
    Scratch *s = &m->s;
    const int H = c->hidden, V = c->vocab_size;
    const float eps = (float)c->eps;
    int pos = kv_cache_len(mkv);
    if (!m->has_mtp) { snprintf(err, errlen, "the model has no MTP head"); return -1; }
    if (n < 1 || pos + n > mkv->cap) {
        snprintf(err, errlen, "MTP context full: %d cached + %d new rows exceed %d", pos, n, mkv->cap);
        return -1;
    }
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= V) {
            snprintf(err, errlen, "MTP token id %d: expected 0..%d", tokens[i], V - 1);
            return -1;
        }
    for (int off = 0; off < n; off += s->cap) {
        int nb = n - off < s->cap ? n - off : s->cap;
        /* concat(norm(embedding of the next token), norm(hidden)): embedding half first */
        for (int i = 0; i < nb; i++) {
            float *cat = s->cat + (size_t)i * 2 * H;
            weight_row(&m->embed, tokens[off + i], cat);
            rmsnorm(cat, cat, m->mtp_norm_emb, H, eps);
            rmsnorm(cat + H, hidden + (size_t)(off + i) * H, m->mtp_norm_hid, H, eps);
        }
        matmul(s->x, s->cat, &m->mtp_fc, nb);
        rope_tables(m, pos + off, nb);
        layer_forward(m, &m->mtp_layer, mkv, 0, nb);
        for (int i = 0; i < nb; i++) rmsnorm(s->xb + (size_t)i * H, s->x + (size_t)i * H, m->mtp_norm, H, eps);
        if (hm) memcpy(hm + (size_t)off * H, s->xb, (size_t)nb * H * sizeof(float));
        if (logits && all_logits) matmul(logits + (size_t)off * V, s->xb, &m->mtp_head, nb);
        else if (logits && off + nb == n) matmul(logits, s->xb + (size_t)(nb - 1) * H, &m->mtp_head, 1);
        /* drafts from NaN would only be rejected, but the head is broken: say so */
        int bad = bad_row(s->xb, nb, H);
        if (bad < 0 && logits && all_logits) bad = bad_row(logits + (size_t)off * V, nb, V);
        else if (bad < 0 && logits && off + nb == n && bad_row(logits, 1, V) == 0) bad = nb - 1;
        if (bad >= 0) {
            nonfinite_error(m, "MTP head", pos + off + bad, err, errlen);
            return -1;
        }
    }
    return 0;
}
