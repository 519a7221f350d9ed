/* model.c: loading a Qwen3 checkpoint and its forward pass (see model.h).
 *
 * Data flow: run.c -> model -> attn -> kv -> kernels. run.c (and speculative/,
 * eval/) call model_forward; tensors come from format/safetensors.c through
 * model/source.c, the matmuls and row ops from kernels/, attention from
 * attn/ over the kv/ cache; model_forward_batch (a server's continuous
 * batching) runs several sequences' rows through the same forward, each a
 * segment (Seg) over its own cache. One decoder layer (layer_forward), n
 * tokens:
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
#include "model/gpu.h"
#include "attn/attn.h"
#include "format/quote.h"
#include "kernels/deltanet.h"
#include "kernels/ops.h"
#include "kv/kvfile.h"

#include <limits.h>
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

/* t's shape as "[a, b, ...]", for error lines. */
static void shape_text(const STensor *t, char *out, size_t n) {
    size_t l = (size_t)snprintf(out, n, "[");
    for (int i = 0; i < t->ndim && l < n; i++)
        l += (size_t)snprintf(out + l, n - l, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    if (l < n) snprintf(out + l, n - l, "]");
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
        char found[96];
        shape_text(t, found, sizeof found);
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

/* n floats of f32, BF16 or F16 tensor t widened to f32 and checked to be
 * finite: small tensors read whole at load (a NaN in a norm would turn every
 * later activation into NaN). */
static int widen_checked(const Model *m, const STensor *t, const char *name, int n, float **out, char *err,
                         size_t errlen) {
    Weight w = {.data = t->data, .rows = 1, .cols = n};
    if (dtype_of(m, t, &w.dtype, err, errlen)) return -1;
    *out = malloc((size_t)n * sizeof(float));
    if (!*out) { snprintf(err, errlen, "out of memory"); return -1; }
    weight_row(&w, 0, *out);
    long bad = find_nonfinite(*out, n);
    if (bad >= 0) {
        snprintf(err, errlen, "%s: tensor '%s': element %ld is %s, expected finite numbers", tensor_file(m, t), name,
                 bad, isnan((*out)[bad]) ? "NaN" : "infinite");
        return -1;
    }
    return 0;
}

/* A vector [n] as f32; plus1 folds a zero-centred norm's 1 + w in once. */
static int load_vector(const Model *m, const char *name, int n, int plus1, float **out, char *err, size_t errlen) {
    const STensor *t = find_checked(m, name, n, 0, err, errlen);
    if (!t || widen_checked(m, t, name, n, out, err, errlen)) return -1;
    for (int i = 0; plus1 && i < n; i++) (*out)[i] += 1;
    return 0;
}

/* The conv taps [conv_dim, K] of a Gated DeltaNet layer: stored [conv_dim,
 * 1, K] (Hugging Face) or [conv_dim, K, 1] (MLX), the same bytes either way. */
static int load_conv(const Model *m, const char *name, int ch, int k, float **out, char *err, size_t errlen) {
    const STensor *t = st_find(&m->ts, name);
    if (!t) {
        snprintf(err, errlen, "%s: missing tensor '%s'", m->ts.files[0].path, name);
        return -1;
    }
    if (t->ndim != 3 || t->shape[0] != ch || !((t->shape[1] == 1 && t->shape[2] == k) ||
                                                (t->shape[1] == k && t->shape[2] == 1))) {
        char found[96];
        shape_text(t, found, sizeof found);
        snprintf(err, errlen, "%s: tensor '%s': expected shape [%d, 1, %d] (or MLX's [%d, %d, 1]) from config.json, "
                 "found %s", tensor_file(m, t), name, ch, k, ch, k, found);
        return -1;
    }
    return widen_checked(m, t, name, ch * k, out, err, errlen);
}

/* Gated attention (Qwen3.5) or plain (Qwen3): q_proj has twice the rows when gated. */
static int load_attn(const Model *m, Layer *L, const char *prefix, char *err, size_t errlen) {
    const Config *c = &m->cfg;
    int H = c->hidden, hd = c->head_dim, qd = c->n_heads * hd, kvd = c->n_kv_heads * hd, zc = c->zero_centred;
    char name[256];
#define NAME(s) (snprintf(name, sizeof name, "%s%s", prefix, s), name)
    return load_vector(m, NAME("self_attn.q_norm.weight"), hd, zc, &L->q_norm, err, errlen) ||
                   load_vector(m, NAME("self_attn.k_norm.weight"), hd, zc, &L->k_norm, err, errlen) ||
                   load_matrix(m, NAME("self_attn.q_proj.weight"), qd * (c->attn_gate ? 2 : 1), H, &L->wq, err,
                               errlen) ||
                   load_matrix(m, NAME("self_attn.k_proj.weight"), kvd, H, &L->wk, err, errlen) ||
                   load_matrix(m, NAME("self_attn.v_proj.weight"), kvd, H, &L->wv, err, errlen) ||
                   load_matrix(m, NAME("self_attn.o_proj.weight"), H, qd, &L->wo, err, errlen)
               ? -1
               : 0;
}

/* A Gated DeltaNet layer (shared/specs/qwen35.md): its projections, conv
 * taps, decay and gate parameters, and the gated norm's plain weight. */
static int load_gdn(const Model *m, Layer *L, const char *prefix, char *err, size_t errlen) {
    const Config *c = &m->cfg;
    const int H = c->hidden, hv = c->lin_v_heads, vd = hv * c->lin_v_dim;
    const int conv_dim = 2 * c->lin_k_heads * c->lin_k_dim + vd;
    char name[256];
    float *a_log = NULL;
    L->gdn = 1;
    int rc = load_matrix(m, NAME("linear_attn.in_proj_qkv.weight"), conv_dim, H, &L->w_qkv, err, errlen) ||
             load_matrix(m, NAME("linear_attn.in_proj_z.weight"), vd, H, &L->w_z, err, errlen) ||
             load_matrix(m, NAME("linear_attn.in_proj_b.weight"), hv, H, &L->w_b, err, errlen) ||
             load_matrix(m, NAME("linear_attn.in_proj_a.weight"), hv, H, &L->w_a, err, errlen) ||
             load_matrix(m, NAME("linear_attn.out_proj.weight"), H, vd, &L->w_out, err, errlen) ||
             load_conv(m, NAME("linear_attn.conv1d.weight"), conv_dim, c->conv_k, &L->conv, err, errlen) ||
             load_vector(m, NAME("linear_attn.dt_bias"), hv, 0, &L->dt_bias, err, errlen) ||
             load_vector(m, NAME("linear_attn.A_log"), hv, 0, &a_log, err, errlen) ||
             load_vector(m, NAME("linear_attn.norm.weight"), c->lin_v_dim, 0, &L->gnorm, err, errlen);
    /* the decay rate is -exp(A_log): kept that way, as the step uses it */
    if (!rc) {
        for (int j = 0; j < hv; j++) a_log[j] = -expf(a_log[j]);
        L->a_neg = a_log;
    } else
        free(a_log);
    return rc ? -1 : 0;
}

static int load_layer(const Model *m, Layer *L, const char *prefix, int gdn, char *err, size_t errlen) {
    const Config *c = &m->cfg;
    int H = c->hidden, zc = c->zero_centred;
    char name[256];
    if (load_vector(m, NAME("input_layernorm.weight"), H, zc, &L->in_norm, err, errlen) ||
        load_vector(m, NAME("post_attention_layernorm.weight"), H, zc, &L->post_norm, err, errlen) ||
        (gdn ? load_gdn(m, L, prefix, err, errlen) : load_attn(m, L, prefix, err, errlen)) ||
        load_matrix(m, NAME("mlp.gate_proj.weight"), c->ffn, H, &L->wg, err, errlen) ||
        load_matrix(m, NAME("mlp.up_proj.weight"), c->ffn, H, &L->wu, err, errlen) ||
        load_matrix(m, NAME("mlp.down_proj.weight"), H, c->ffn, &L->wd, err, errlen))
        return -1;
#undef NAME
    return 0;
}

/* A layer's matrices in a fixed order with their checkpoint names (after
 * the layer's prefix): what relayout, q8 conversion and freeing walk.
 * Returns the count (at most LAYER_MAX_MATRICES). */
#define LAYER_MAX_MATRICES 8
static int layer_matrices(Layer *L, Weight **w, const char **names) {
    static const char *attn[] = {"self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                                 "self_attn.o_proj.weight"};
    static const char *gdn[] = {"linear_attn.in_proj_qkv.weight", "linear_attn.in_proj_z.weight",
                                "linear_attn.in_proj_b.weight", "linear_attn.in_proj_a.weight",
                                "linear_attn.out_proj.weight"};
    static const char *mlp[] = {"mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"};
    Weight *wa[] = {&L->wq, &L->wk, &L->wv, &L->wo}, *wl[] = {&L->w_qkv, &L->w_z, &L->w_b, &L->w_a, &L->w_out};
    Weight *wm[] = {&L->wg, &L->wu, &L->wd};
    int n = 0;
    for (int i = 0; i < (L->gdn ? 5 : 4); i++, n++) w[n] = L->gdn ? wl[i] : wa[i], names[n] = L->gdn ? gdn[i] : attn[i];
    for (int i = 0; i < 3; i++, n++) w[n] = wm[i], names[n] = mlp[i];
    return n;
}

static void free_layer(Layer *L) {
    Weight *w[LAYER_MAX_MATRICES];
    const char *names[LAYER_MAX_MATRICES];
    for (int i = layer_matrices(L, w, names); i-- > 0;) weight_free(w[i]);
    free(L->in_norm), free(L->post_norm), free(L->q_norm), free(L->k_norm);
    free(L->conv), free(L->dt_bias), free(L->a_neg), free(L->gnorm);
}

/* RoPE frequencies theta^(-2i/d), rescaled for linear or YaRN scaling
 * (transformers' _compute_yarn_parameters). */
static void rope_init(Model *m) {
    const Config *c = &m->cfg;
    /* partial RoPE (Qwen3.5) rotates the first rot_dim dims as a head of that size */
    int half = c->rot_dim / 2, d = c->rot_dim;
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
    size_t kvd = (size_t)c->n_kv_heads * c->head_dim, I = (size_t)c->ffn, half = (size_t)c->rot_dim / 2;
    size_t vd = (size_t)c->lin_v_heads * c->lin_v_dim, conv_dim = 2 * (size_t)c->lin_k_heads * c->lin_k_dim + vd;
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
    int bad = (m->has_mtp && !s->cat);
    if (c->attn_gate) {
        s->qg = floats64(cap * 2 * qd);
        s->gate = floats64(cap * qd);
        bad |= !s->qg || !s->gate;
    }
    if (c->n_gdn) {
        s->mix = floats64(cap * conv_dim);
        s->z = floats64(cap * vd);
        s->gb = floats64(cap * (size_t)c->lin_v_heads);
        s->ga = floats64(cap * (size_t)c->lin_v_heads);
        s->y = floats64(cap * vd);
        bad |= !s->mix || !s->z || !s->gb || !s->ga || !s->y;
    }
    /* the widest input any projection here takes: hidden, attention out,
     * ffn, the Gated DeltaNet output, or the MTP head's concatenation */
    size_t wide = H > qd ? H : qd;
    wide = I > wide ? I : wide;
    wide = vd > wide ? vd : wide;
    if (m->has_mtp) wide = 2 * H > wide ? 2 * H : wide;
    s->wide = (int)wide;
    if (bad || !s->x || !s->xb || !s->q || !s->k || !s->v || !s->att || !s->hb || !s->hb2 || !s->rope_cs ||
        !s->rope_sn || !s->attn_scratch || matmul_reserve((int)cap, (int)wide)) {
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
    free(s->qg), free(s->gate);
    free(s->mix), free(s->z), free(s->gb), free(s->ga), free(s->y);
}

/* The MTP module: its norms follow the model's convention (Qwen3's shipped
 * model stores plain weights, Qwen3.5 zero-centred ones) and its layer is a
 * full-attention layer (gated in Qwen3.5). A checkpoint whose config
 * announces the head but that carries no mtp.* tensor at all (converted
 * uploads strip them) loads without it: m->mtp_absent says so. */
static int load_mtp(Model *m, char *err, size_t errlen) {
    int H = m->cfg.hidden, zc = m->cfg.zero_centred;
    int any = 0;
    for (int i = 0; i < m->ts.n_tensors && !any; i++) any = strncmp(m->ts.tensors[i].name, "mtp.", 4) == 0;
    if (!any) {
        m->mtp_absent = 1;
        return 0;
    }
    if (load_matrix(m, "mtp.fc.weight", H, 2 * H, &m->mtp_fc, err, errlen) ||
        load_vector(m, "mtp.pre_fc_norm_embedding.weight", H, zc, &m->mtp_norm_emb, err, errlen) ||
        load_vector(m, "mtp.pre_fc_norm_hidden.weight", H, zc, &m->mtp_norm_hid, err, errlen) ||
        load_vector(m, "mtp.norm.weight", H, zc, &m->mtp_norm, err, errlen) ||
        load_layer(m, &m->mtp_layer, "mtp.layers.0.", 0, err, errlen))
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

/* Every bf16 matrix into panels, the layout the SIMD kernels read best
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
    char what[128];
    int why = relay(m, &m->embed, to), rc = 0;
    /* an untied embedding is only looked up, in any layout */
    if (act_bf16 && why && m->cfg.tie_embeddings) {
        snprintf(what, sizeof what, "%sembed_tokens.weight", m->prefix);
        relay_error(&m->embed, why, what, err, errlen);
        rc = -1;
    }
    if (m->lm_head.data == m->embed.data) m->lm_head = m->embed;
    else if ((why = relay(m, &m->lm_head, to)) && act_bf16 && !rc) {
        relay_error(&m->lm_head, why, "lm_head", err, errlen);
        rc = -1;
    }
    for (int l = 0; l < m->cfg.n_layers + m->has_mtp && !rc; l++) {
        Layer *L = l < m->cfg.n_layers ? &m->layers[l] : &m->mtp_layer;
        Weight *w[LAYER_MAX_MATRICES];
        const char *names[LAYER_MAX_MATRICES];
        const int nw = layer_matrices(L, w, names);
        for (int i = 0; i < nw && !rc; i++)
            if ((why = relay(m, w[i], to)) && act_bf16) {
                if (l < m->cfg.n_layers) snprintf(what, sizeof what, "%slayers.%d.%s", m->prefix, l, names[i]);
                else snprintf(what, sizeof what, "mtp.layers.0.%s", names[i]);
                relay_error(w[i], why, what, err, errlen);
                rc = -1;
            }
    }
    if (m->has_mtp && !rc && (why = relay(m, &m->mtp_fc, to)) && act_bf16) {
        relay_error(&m->mtp_fc, why, "mtp.fc.weight", err, errlen);
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
            snprintf(err, errlen, "bf16 activations: need %s, which this CPU at kernel level %s lacks",
#if defined(__aarch64__)
                     "BF16 (bfmlalb, bfmlalt)",
#else
                     "AVX-512 BF16 (vdpbf16ps)",
#endif
                     kernels_isa());
            goto fail;
        }
    }
    if (!(flags & MODEL_MAPPED)) st_to_memory(&m->ts);
    int H = c->hidden, V = c->vocab_size;
    m->layers = calloc((size_t)c->n_layers, sizeof(Layer));
    m->inv_freq = malloc((size_t)(c->rot_dim / 2) * sizeof(double));
    m->kv_slot = malloc((size_t)c->n_layers * sizeof(int));
    if (!m->layers || !m->inv_freq || !m->kv_slot) { snprintf(err, errlen, "out of memory"); goto fail; }
    /* Qwen3.5's multimodal checkpoints keep the text decoder under
     * model.language_model. (their vision tower, model.visual., is not read) */
    const char *lm = "model.language_model.";
    snprintf(m->prefix, sizeof m->prefix, "%s", c->arch == ARCH_QWEN35 && st_find(&m->ts, "model.language_model."
                                                  "embed_tokens.weight") ? lm : "model.");
    char name[128];
    snprintf(name, sizeof name, "%sembed_tokens.weight", m->prefix);
    if (load_matrix(m, name, V, H, &m->embed, err, errlen)) goto fail;
    snprintf(name, sizeof name, "%snorm.weight", m->prefix);
    if (load_vector(m, name, H, c->zero_centred, &m->final_norm, err, errlen)) goto fail;
    /* A tied checkpoint may still ship lm_head.weight: the embedding wins. */
    if (c->tie_embeddings) m->lm_head = m->embed;
    else if (load_matrix(m, "lm_head.weight", V, H, &m->lm_head, err, errlen)) goto fail;
    /* full layers take the KV cache's layers in order; Gated DeltaNet
     * layers each take S [Hv, dk, dv] then the conv's last inputs
     * [K-1, conv_dim] of the sequence's state */
    const size_t conv_dim = 2 * (size_t)c->lin_k_heads * c->lin_k_dim + (size_t)c->lin_v_heads * c->lin_v_dim;
    for (int l = 0, full = 0; l < c->n_layers; l++) {
        m->kv_slot[l] = c->gdn[l] ? -1 : full++;
        char prefix[96];
        snprintf(prefix, sizeof prefix, "%slayers.%d.", m->prefix, l);
        if (load_layer(m, &m->layers[l], prefix, c->gdn[l], err, errlen)) goto fail;
    }
    /* a checkpoint may hold more layers than config.json runs (a truncated
     * model): they are not read, as transformers leaves unused weights,
     * and the CLI says so */
    const size_t pl = strlen(m->prefix);
    m->layers_stored = c->n_layers;
    for (int i = 0; i < m->ts.n_tensors; i++) {
        const char *nm = m->ts.tensors[i].name;
        char *end;
        if (strncmp(nm, m->prefix, pl) || strncmp(nm + pl, "layers.", 7)) continue;
        const long l = strtol(nm + pl + 7, &end, 10);
        if (end != nm + pl + 7 && *end == '.' && l >= m->layers_stored && l < INT_MAX) m->layers_stored = (int)l + 1;
    }
    m->state_floats = (size_t)c->n_gdn * ((size_t)c->lin_v_heads * c->lin_k_dim * c->lin_v_dim +
                                          (size_t)(c->conv_k - 1) * conv_dim);
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
    Weight *w[LAYER_MAX_MATRICES];
    const char *names[LAYER_MAX_MATRICES];
    const int nw = layer_matrices(L, w, names);
    for (int i = 0; i < nw; i++) {
        char name[160];
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
        char head[128];
        if (m->cfg.tie_embeddings) snprintf(head, sizeof head, "%sembed_tokens.weight (the drafts' lm_head)", m->prefix);
        else snprintf(head, sizeof head, "lm_head.weight (the drafts')");
        return quantize(&m->mtp_fc, 1, "mtp.fc.weight", err, errlen) ||
                       quantize_layer(&m->mtp_layer, 1, "mtp.layers.0.", err, errlen) ||
                       quantize(&m->mtp_head, 1, head, err, errlen)
                   ? -1
                   : 0;
    }
    for (int l = 0; l < m->cfg.n_layers; l++) {
        char prefix[96];
        snprintf(prefix, sizeof prefix, "%slayers.%d.", m->prefix, l);
        if (quantize_layer(&m->layers[l], 0, prefix, err, errlen)) return -1;
    }
    /* drafts that shared lm_head share its copy */
    const int shared = m->mtp_head.data == m->lm_head.data;
    char head[128];
    if (m->cfg.tie_embeddings) snprintf(head, sizeof head, "%sembed_tokens.weight (as lm_head)", m->prefix);
    else snprintf(head, sizeof head, "lm_head.weight");
    if (quantize(&m->lm_head, 0, head, err, errlen)) return -1;
    if (shared) m->mtp_head = m->lm_head;
    return 0;
}

/* One matrix: its elements, and q8's f32 scale per 32 of them. */
static size_t matrix_bytes(const Weight *w) {
    const size_t n = (size_t)w->rows * w->cols;
    return n * dtype_size(w->dtype) + (w->dtype == DT_Q8 || w->dtype == DT_Q8I ? n / 32 * sizeof(float) : 0);
}

static size_t layer_bytes(const Layer *L) {
    Weight *w[LAYER_MAX_MATRICES];
    const char *names[LAYER_MAX_MATRICES];
    size_t b = 0;
    /* layer_matrices only lists the layer's own matrices; nothing is written */
    for (int i = layer_matrices((Layer *)L, w, names); i-- > 0;) b += matrix_bytes(w[i]);
    return b;
}

size_t model_weight_bytes(const Model *m) {
    size_t b = matrix_bytes(&m->embed);
    if (m->lm_head.data != m->embed.data) b += matrix_bytes(&m->lm_head);
    for (int l = 0; l < m->cfg.n_layers; l++) b += layer_bytes(&m->layers[l]);
    if (m->has_mtp) {
        b += matrix_bytes(&m->mtp_fc) + layer_bytes(&m->mtp_layer);
        if (m->mtp_head.data != m->lm_head.data && m->mtp_head.data != m->embed.data) b += matrix_bytes(&m->mtp_head);
    }
    return b;
}

int model_to_gpu(Model *m, int wmem, char *err, size_t errlen) {
    return gpu_model_open(&m->gpu, m, wmem, err, errlen);
}

int model_samples_on_device(const Model *m) { return m->gpu && gpu_can_sample(m->gpu); }

int model_sample(Model *m, Sampler *s, int *token, char *err, size_t errlen) {
    if (!model_samples_on_device(m)) {
        snprintf(err, errlen, "model_sample: this model's logits are sampled on the CPU (sampler_sample)");
        return -1;
    }
    /* the coin is drawn here, as sampler_sample would; a draw that then
     * fails ends the run, so the generator's state no longer matters */
    SampleDraw d;
    sampler_draw(s, &d);
    return gpu_sample(m->gpu, &d, token, err, errlen);
}

void model_drop_gpu(Model *m) {
    gpu_model_free(m->gpu);
    m->gpu = NULL;
}

void model_free(Model *m) {
    gpu_model_free(m->gpu);
    if (m->mtp_head.data != m->lm_head.data) weight_free(&m->mtp_head);
    weight_free(&m->lm_head);
    weight_free(&m->mtp_fc);
    if (m->layers)
        for (int l = 0; l < m->cfg.n_layers; l++) free_layer(&m->layers[l]);
    free(m->layers);
    free(m->kv_slot);
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

double model_cache_bytes(const Model *m, const KVSpec *spec, int ctx) {
    const Config *c = &m->cfg;
    const double per_pos = (double)(c->n_layers - c->n_gdn) * c->n_kv_heads *
                           (spec->k->bits(c->head_dim, &spec->ko) + spec->v->bits(c->head_dim, &spec->vo)) *
                           c->head_dim / 8;
    return per_pos * ctx + (double)m->state_floats * sizeof(float);
}

int model_kv_init(const Model *m, KVCache *kv, const KVSpec *spec, int ctx, int mtp, char *err, size_t errlen) {
    const Config *c = &m->cfg;
    if (m->gpu) return gpu_kv_init(m->gpu, kv, spec, ctx, mtp, err, errlen);
    if (kv_cache_init(kv, spec, mtp ? 1 : c->n_layers - c->n_gdn, c->n_kv_heads, c->head_dim, ctx, err, errlen))
        return -1;
    if (mtp || !m->state_floats) return 0;
    kv->state = calloc(m->state_floats, sizeof(float));
    if (!kv->state) {
        snprintf(err, errlen, "out of memory for the Gated DeltaNet state (%zu bytes)", m->state_floats * 4);
        kv_cache_free(kv);
        return -1;
    }
    kv->state_floats = m->state_floats;
    return 0;
}

int model_trace_q(Model *m, float *host, char *err, size_t errlen) {
    if (m->gpu) return gpu_trace_q(m->gpu, host, m->s.cap, err, errlen);
    m->trace_q = host;
    return 0;
}

int model_kv_read(const KVCache *kv, int layer, int head, int t0, int n, float *k, float *v, char *err, size_t errlen) {
    if (kv->dev) return gpu_kv_read_f32(kv, layer, head, t0, n, k, v, err, errlen);
    if (strcmp(kv->spec.k->name, "f32") || strcmp(kv->spec.v->name, "f32") || t0 < 0 || n < 0 ||
        t0 + n > kv_cache_len(kv)) {
        snprintf(err, errlen, "model_kv_read: positions [%d, %d) of an f32 cache of %d", t0, t0 + n, kv_cache_len(kv));
        return -1;
    }
    for (int t = 0; t < n; t++) {
        kv_stream_get(kv_k((KVCache *)kv, layer, head), t0 + t, k + (size_t)t * kv->d);
        kv_stream_get(kv_v((KVCache *)kv, layer, head), t0 + t, v + (size_t)t * kv->d);
    }
    return 0;
}

/* ---- forward ---- */

/* One sequence's part of a forward: its tokens are rows [row, row + n) of
 * the scratch, at positions pos.. of its cache kv. The segments of a
 * forward lie in order, back to back from row 0. Row-wise work (matmuls,
 * norms, the MLP) runs on all their rows at once; what carries a
 * sequence's history (attention over its cache, the Gated DeltaNet conv
 * and recurrence over its state) runs per segment. */
typedef struct {
    KVCache *kv;
    const int *tokens;  /* [n] */
    int row, n, pos;
    int last_logits;    /* 1: the logits of its last row are wanted */
    /* the current Gated DeltaNet layer's part of kv->state (S then the conv
     * window) and of the journal, set per layer by forward_chunk; else NULL */
    float *state, *jr;
} Seg;

/* The rows segs [nseg] cover together. */
static int seg_rows(const Seg *segs, int nseg) { return segs[nseg - 1].row + segs[nseg - 1].n; }

/* cos/sin tables [rows, rot_dim/2], each row at its own sequence's
 * position; angles in double so that long contexts do not lose the phase. */
static void rope_tables(Model *m, const Seg *segs, int nseg) {
    const int half = m->cfg.rot_dim / 2;
    for (int g = 0; g < nseg; g++)
        for (int i = 0; i < segs[g].n; i++) {
            const size_t r = (size_t)(segs[g].row + i) * half;
            for (int j = 0; j < half; j++) {
                double a = (double)(segs[g].pos + i) * m->inv_freq[j];
                m->s.rope_cs[r + j] = (float)cos(a) * m->rope_mscale;
                m->s.rope_sn[r + j] = (float)sin(a) * m->rope_mscale;
            }
        }
}

/* Row loops over fewer elements than this run on one thread: waking the
 * team costs microseconds, about what normalising a few rows costs
 * (docs/kernel-notes.md#row-loop-threads). */
#define PAR_MIN 32768
/* the GDN conv: channels per block, and the widest kernel it takes */
#define CONV_CH 64
#define CONV_MAX_K 64

/* Attention on the normed xb [n, H] (n: the rows of all segments); its
 * output [n, H] replaces xb. Each segment's K and V go to layer cl of its
 * own cache, and its rows attend over that cache only. Gated (Qwen3.5):
 * q_proj gives each head [query | gate], and the head's output is
 * multiplied by sigmoid(gate) before o_proj. RoPE turns the first rot_dim
 * dims of each head (all of them in Qwen3, a quarter in Qwen3.5). */
static void attn_forward(Model *m, const Layer *L, const Seg *segs, int nseg, int cl) {
    const Config *c = &m->cfg;
    Scratch *s = &m->s;
    const int n = seg_rows(segs, nseg);
    const int hd = c->head_dim, nh = c->n_heads, nkv = c->n_kv_heads, grp = nh / nkv;
    const int qd = nh * hd, kvd = nkv * hd, half = c->rot_dim / 2;
    const float eps = (float)c->eps, scale = 1.0f / sqrtf((float)hd);
    float *qkv[] = {c->attn_gate ? s->qg : s->q, s->k, s->v};
    const Weight *wqkv[] = {&L->wq, &L->wk, &L->wv};
    matmul_multi(qkv, wqkv, 3, s->xb, n);
    /* per-head q/k RMSNorm, then RoPE at each token's position; a gated
     * q_proj's rows [n, nH, 2, hd] split into queries and gates first */
#pragma omp parallel for schedule(static) if (n * (qd + kvd) >= PAR_MIN)
    for (int i = 0; i < n; i++) {
        const float *cs = s->rope_cs + (size_t)i * half, *sn = s->rope_sn + (size_t)i * half;
        for (int h = 0; h < nh; h++) {
            float *q = s->q + (size_t)i * qd + (size_t)h * hd;
            if (c->attn_gate) {
                const float *src = s->qg + (size_t)i * 2 * qd + (size_t)h * 2 * hd;
                memcpy(q, src, (size_t)hd * sizeof(float));
                memcpy(s->gate + (size_t)i * qd + (size_t)h * hd, src + hd, (size_t)hd * sizeof(float));
            }
            rmsnorm(q, q, L->q_norm, hd, eps);
            rope(q, cs, sn, c->rot_dim);
        }
        for (int h = 0; h < nkv; h++) {
            float *k = s->k + (size_t)i * kvd + (size_t)h * hd;
            rmsnorm(k, k, L->k_norm, hd, eps);
            rope(k, cs, sn, c->rot_dim);
        }
    }
    if (m->trace_q && L != &m->mtp_layer)
        memcpy(m->trace_q + (size_t)cl * s->cap * qd, s->q, (size_t)n * qd * sizeof(float));
    /* Each (segment, kv head) pair is an independent stream: one thread
     * appends a few of the segment's positions and attends from all of them
     * at once (attn_block), with the same bits as decode appending and
     * attending one by one. Blocks start at the segment's first row, as they
     * would in a forward of that sequence alone. */
    const int blk = attn_block_tokens(grp);
    size_t per = attn_scratch_floats(grp * blk, hd);
    /* scratch was sized for s->threads at load: never run more; segments
     * differ in length, so pairs are handed out as threads come free */
#pragma omp parallel for schedule(dynamic) num_threads(s->threads)
    for (int p = 0; p < nseg * nkv; p++) {
        const Seg *g = &segs[p / nkv];
        const int h = p % nkv, end = g->row + g->n;
        float *scr = s->attn_scratch + (size_t)omp_get_thread_num() * per;
        KVStream *ks = kv_k(g->kv, cl, h), *vs = kv_v(g->kv, cl, h);
        for (int i0 = g->row; i0 < end; i0 += blk) {
            const int b = end - i0 < blk ? end - i0 : blk;
            for (int i = i0; i < i0 + b; i++) {
                kv_stream_append(ks, s->k + (size_t)i * kvd + (size_t)h * hd);
                kv_stream_append(vs, s->v + (size_t)i * kvd + (size_t)h * hd);
            }
            size_t qo = (size_t)i0 * qd + (size_t)h * grp * hd;
            attn_block(ks, vs, s->q + qo, grp, b, qd, scale, s->att + qo, scr);
        }
    }
    if (c->attn_gate) {
#pragma omp parallel for schedule(static) if (n * qd >= PAR_MIN)
        for (size_t j = 0; j < (size_t)n * qd; j++) s->att[j] *= 1.0f / (1.0f + expf(-s->gate[j]));
    }
    matmul(s->xb, s->att, &L->wo, n);
}

/* softplus as torch computes it: x itself past 20, where log1p(e^x) = x in f32. */
static float softplus(float x) { return x > 20 ? x : log1pf(expf(x)); }

/* A Gated DeltaNet layer's inputs to the recurrence, per token, in place:
 * q and k of every key head in mix [n, conv_dim] L2-normed (q times
 * dk^-1/2), gb -> beta and ga -> alpha [n, Hv]. */
static void delta_prep(const Model *m, const Layer *L, float *mix, float *gb, float *ga, int n) {
    const Config *c = &m->cfg;
    const int hk = c->lin_k_heads, hv = c->lin_v_heads, dk = c->lin_k_dim;
    const int conv_dim = 2 * hk * dk + hv * c->lin_v_dim;
    const float qscale = 1.0f / sqrtf((float)dk);
#pragma omp parallel for schedule(static) if (n * conv_dim >= PAR_MIN)
    for (int t = 0; t < n; t++) {
        float *cv = mix + (size_t)t * conv_dim;
        /* L2 norm: a sum with 1e-6 inside, as Hugging Face's l2norm */
        for (int h = 0; h < hk; h++) {
            float *q = cv + (size_t)h * dk, *k = cv + (size_t)(hk + h) * dk, sq = 0, sk = 0;
            for (int i = 0; i < dk; i++) sq += q[i] * q[i], sk += k[i] * k[i];
            const float fq = qscale / sqrtf(sq + 1e-6f), fk = 1.0f / sqrtf(sk + 1e-6f);
            for (int i = 0; i < dk; i++) q[i] *= fq, k[i] *= fk;
        }
        for (int j = 0; j < hv; j++) {
            float *b = gb + (size_t)t * hv + j, *a = ga + (size_t)t * hv + j;
            *b = 1.0f / (1.0f + expf(-*b));
            *a = expf(L->a_neg[j] * softplus(*a + L->dt_bias[j]));
        }
    }
}

/* The recurrence on S0 [Hv, dk, dv] for n tokens whose prepared q | k | v
 * rows are qkv [n][ld] and alpha, beta [n][ld_ab] (value head j at + j):
 * kernels/deltanet.c on every (value head, 64-column tile of its state) in
 * parallel, each tile taking the n tokens in order. y [n, Hv*dv] gets o. */
static void delta_run(const Model *m, float *S0, const float *qkv, size_t ld, const float *alpha, const float *beta,
                      size_t ld_ab, float *y, int n) {
    const Config *c = &m->cfg;
    const int hk = c->lin_k_heads, hv = c->lin_v_heads, dk = c->lin_k_dim, dv = c->lin_v_dim;
    const int r = hv / hk, tiles = (dv + 63) / 64;
    /* value head j reads key head j / r */
#pragma omp parallel for schedule(static) collapse(2)
    for (int j = 0; j < hv; j++)
        for (int tile = 0; tile < tiles; tile++) {
            const int h = j / r, e0 = tile * 64, e1 = e0 + 64 < dv ? e0 + 64 : dv;
            DeltaRule a = {.q = qkv + (size_t)h * dk, .k = qkv + (size_t)(hk + h) * dk,
                           .v = qkv + 2 * (size_t)hk * dk + (size_t)j * dv, .alpha = alpha + j, .beta = beta + j,
                           .o = y + (size_t)j * dv, .ld_qk = ld, .ld_v = ld, .ld_ab = ld_ab, .ld_o = (size_t)hv * dv,
                           .n = n, .dk = dk, .dv = dv};
            deltanet_cols(S0 + (size_t)j * dk * dv, &a, e0, e1);
        }
}

/* The gated RMSNorm over each head of y [n, Hv*dv], in place: plain
 * weight, times silu(z). */
static void gated_norm(const Model *m, const Layer *L, float *y, const float *z0, int n) {
    const Config *c = &m->cfg;
    const int hv = c->lin_v_heads, dv = c->lin_v_dim;
    const float eps = (float)c->eps;
#pragma omp parallel for schedule(static) if (n * hv * dv >= PAR_MIN)
    for (int tj = 0; tj < n * hv; tj++) {
        float *o = y + (size_t)tj * dv, ss = 0;
        const float *z = z0 + (size_t)tj * dv;
        float g[1024]; /* dv <= 1024 (config.c): silu(z) * the normed o, then back into o */
        for (int e = 0; e < dv; e++) ss += o[e] * o[e];
        const float inv = 1.0f / sqrtf(ss / dv + eps);
        for (int e = 0; e < dv; e++) o[e] = L->gnorm[e] * (o[e] * inv), g[e] = z[e];
        swiglu(g, o, dv);
        memcpy(o, g, (size_t)dv * sizeof(float));
    }
}

void model_delta_rule(const Model *m, const Layer *L, float *S0, float *mix, float *gb, float *ga, const float *z0,
                      float *y, int n) {
    const Config *c = &m->cfg;
    delta_prep(m, L, mix, gb, ga, n);
    delta_run(m, S0, mix, 2 * (size_t)c->lin_k_heads * c->lin_k_dim + (size_t)c->lin_v_heads * c->lin_v_dim, ga, gb,
              c->lin_v_heads, y, n);
    gated_norm(m, L, y, z0, n);
}

/* A journal record per token and Gated DeltaNet layer: | pre-conv m
 * [conv_dim] | prepared q | k | v [conv_dim] | alpha [Hv] | beta [Hv] |. */
static size_t journal_rec(const Config *c) {
    return 2 * (2 * (size_t)c->lin_k_heads * c->lin_k_dim + (size_t)c->lin_v_heads * c->lin_v_dim) +
           2 * (size_t)c->lin_v_heads;
}

size_t model_journal_floats(const Model *m, int n) { return (size_t)m->cfg.n_gdn * n * journal_rec(&m->cfg); }

/* The causal depthwise conv of a Gated DeltaNet layer over one sequence's
 * rows mix [n, conv_dim], which become silu(conv) in place; win [K-1,
 * conv_dim] is the window of that sequence's last K-1 inputs, carried from
 * its previous call and advanced here. Blocks of CONV_CH channels, last
 * token first, so that the inputs a token reads (its own and the K-1
 * before it, from the window where t - j < 0) are still there; the
 * window's next value is taken before anything is overwritten. Tap K-1
 * multiplies the current input, the sum runs from the oldest input to it. */
static void gdn_conv(const Model *m, const Layer *L, float *win, float *mix, int n) {
    const Config *c = &m->cfg;
    const int K = c->conv_k, conv_dim = 2 * c->lin_k_heads * c->lin_k_dim + c->lin_v_heads * c->lin_v_dim;
#pragma omp parallel for schedule(static) if (n * conv_dim >= PAR_MIN)
    for (int c0 = 0; c0 < conv_dim; c0 += CONV_CH) {
        const int w = conv_dim - c0 < CONV_CH ? conv_dim - c0 : CONV_CH;
        float tap[CONV_MAX_K][CONV_CH], old[CONV_MAX_K][CONV_CH];
        for (int j = 0; j < K; j++)
            for (int ch = 0; ch < w; ch++) tap[j][ch] = L->conv[(size_t)(c0 + ch) * K + j];
        for (int j = 0; j < K - 1; j++) memcpy(old[j], win + (size_t)j * conv_dim + c0, (size_t)w * sizeof(float));
        for (int j = 0; j < K - 1; j++) {
            const int tau = n - (K - 1) + j; /* the input that becomes window row j */
            memcpy(win + (size_t)j * conv_dim + c0, tau >= 0 ? mix + (size_t)tau * conv_dim + c0 : old[j + n],
                   (size_t)w * sizeof(float));
        }
        for (int t = n - 1; t >= 0; t--) {
            float *x = mix + (size_t)t * conv_dim + c0, acc[CONV_CH];
            for (int ch = 0; ch < w; ch++) acc[ch] = 0;
            for (int j = 0; j < K; j++) {
                const int tau = t - (K - 1) + j;
                const float *in = tau >= 0 ? mix + (size_t)tau * conv_dim + c0 : old[tau + K - 1];
                for (int ch = 0; ch < w; ch++) acc[ch] += tap[j][ch] * in[ch];
            }
            memcpy(x, acc, (size_t)w * sizeof(float));
            silu(x, w);
        }
    }
}

/* Gated DeltaNet (shared/specs/qwen35.md) on the normed xb [n, H] (n: the
 * rows of all segments); its output [n, H] replaces xb. Each segment's
 * state: the layer's S [Hv, dk, dv] then the conv's last K-1 inputs [K-1,
 * conv_dim], carried from its previous call. Tokens go through the conv
 * and the recurrence one at a time in order, so prefill, decode and
 * verification give the same bits (the chunked form of the rule would
 * not): the projections, the per-token preparation and the output are
 * batched over all rows, the conv and the recurrence run per segment over
 * its own state, the recurrence in parallel over value heads, each head's
 * state its own. Per token t and value head j, reading key head
 * h = j / (Hv / Hk):
 *   c = silu(conv(m)),  q, k, v = split(c),  q, k L2-normed (q * dk^-1/2)
 *   beta = sigmoid(b_j),  alpha = exp(-exp(A_log_j) softplus(a_j + dt_bias_j))
 *   S <- alpha S;  u = S^T k;  S <- S + k (beta (v - u))^T;  o = S^T q
 *   y_j = gnorm * o / rms(o) * silu(z_j)
 * following Hugging Face's torch_recurrent_gated_delta_rule. */
static void gdn_forward(Model *m, const Layer *L, const Seg *segs, int nseg) {
    const Config *c = &m->cfg;
    Scratch *s = &m->s;
    const int hk = c->lin_k_heads, hv = c->lin_v_heads, dk = c->lin_k_dim, dv = c->lin_v_dim;
    const int conv_dim = 2 * hk * dk + hv * dv, n = seg_rows(segs, nseg);
    float *out[] = {s->mix, s->z, s->gb, s->ga};
    const Weight *w[] = {&L->w_qkv, &L->w_z, &L->w_b, &L->w_a};
    matmul_multi(out, w, 4, s->xb, n);
    /* journal record t of a segment (model_forward's only one): pre-conv m
     * here, the prepared q | k | v, alpha, beta after delta_prep */
    const size_t rec = journal_rec(c);
    for (int g = 0; g < nseg; g++) {
        float *mix = s->mix + (size_t)segs[g].row * conv_dim;
        for (int t = 0; segs[g].jr && t < segs[g].n; t++)
            memcpy(segs[g].jr + t * rec, mix + (size_t)t * conv_dim, conv_dim * sizeof(float));
        gdn_conv(m, L, segs[g].state + (size_t)hv * dk * dv, mix, segs[g].n);
    }
    delta_prep(m, L, s->mix, s->gb, s->ga, n);
    for (int g = 0; g < nseg; g++) {
        const size_t r0 = (size_t)segs[g].row;
        float *mix = s->mix + r0 * conv_dim, *ga = s->ga + r0 * hv, *gb = s->gb + r0 * hv;
        for (int t = 0; segs[g].jr && t < segs[g].n; t++) {
            float *r = segs[g].jr + t * rec + conv_dim;
            memcpy(r, mix + (size_t)t * conv_dim, conv_dim * sizeof(float));
            memcpy(r + conv_dim, ga + (size_t)t * hv, hv * sizeof(float));
            memcpy(r + conv_dim + hv, gb + (size_t)t * hv, hv * sizeof(float));
        }
        delta_run(m, segs[g].state, mix, conv_dim, ga, gb, hv, s->y + r0 * hv * dv, segs[g].n);
    }
    gated_norm(m, L, s->y, s->z, n);
    matmul(s->xb, s->y, &L->w_out, n);
}

/* One decoder layer on x [n, H] in place (n: the rows of all segments):
 * pre-norm, the mixer (attention over layer cl of each segment's cache, or
 * Gated DeltaNet over each segment's state), residual, pre-norm, SwiGLU
 * MLP, residual. */
static void layer_forward(Model *m, const Layer *L, const Seg *segs, int nseg, int cl) {
    const Config *c = &m->cfg;
    Scratch *s = &m->s;
    const int H = c->hidden, n = seg_rows(segs, nseg);
    const float eps = (float)c->eps;
#pragma omp parallel for schedule(static) if (n * H >= PAR_MIN)
    for (int i = 0; i < n; i++) rmsnorm(s->xb + (size_t)i * H, s->x + (size_t)i * H, L->in_norm, H, eps);
    if (L->gdn) gdn_forward(m, L, segs, nseg);
    else attn_forward(m, L, segs, nseg, cl);
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

/* One forward of the rows segs [nseg] cover (at most s.cap in all):
 * embeddings, the layers, the final norm. hidden: NULL or [n, H] the
 * post-norm states of all rows. logits: NULL; [n, V] every row's when
 * all_logits; else [k, V] those of the last rows of the k segments with
 * last_logits, in segment order, from one lm_head matmul. Returns the
 * first row whose hidden state or logits are not all finite, or -1. */
static int forward_chunk(Model *m, Seg *segs, int nseg, float *logits, int all_logits, float *hidden) {
    const Config *c = &m->cfg;
    Scratch *s = &m->s;
    const int H = c->hidden, V = c->vocab_size, n = seg_rows(segs, nseg);
    for (int g = 0; g < nseg; g++)
        for (int i = 0; i < segs[g].n; i++)
            weight_row(&m->embed, segs[g].tokens[i], s->x + (size_t)(segs[g].row + i) * H);
    rope_tables(m, segs, nseg);
    /* state: each Gated DeltaNet layer's part of a sequence's state, in
     * order; likewise its block of the journal when one is kept */
    const size_t per = c->n_gdn ? m->state_floats / (size_t)c->n_gdn : 0;
    const size_t jper = (size_t)m->journal_cap * journal_rec(c);
    for (int l = 0, gl = 0; l < c->n_layers; l++) {
        const Layer *L = &m->layers[l];
        for (int g = 0; g < nseg; g++) {
            segs[g].state = L->gdn ? segs[g].kv->state + per * (size_t)gl : NULL;
            segs[g].jr = L->gdn && m->journal ? m->journal + jper * gl : NULL;
        }
        gl += L->gdn;
        layer_forward(m, L, segs, nseg, m->kv_slot[l]);
    }
    for (int i = 0; i < n; i++) rmsnorm(s->xb + (size_t)i * H, s->x + (size_t)i * H, m->final_norm, H, (float)c->eps);
    if (hidden) memcpy(hidden, s->xb, (size_t)n * H * sizeof(float));
    /* checking costs a read of the outputs, next to a read of all weights */
    int bad = bad_row(s->xb, n, H);
    if (logits && all_logits) {
        matmul(logits, s->xb, &m->lm_head, n);
        if (bad < 0) bad = bad_row(logits, n, V);
    } else if (logits) {
        /* x is free after the final norm: the wanted last rows go there
         * [k, H], so that lm_head's weights are read once for all */
        int k = 0;
        for (int g = 0; g < nseg; g++)
            if (segs[g].last_logits)
                memcpy(s->x + (size_t)k++ * H, s->xb + (size_t)(segs[g].row + segs[g].n - 1) * H, H * sizeof(float));
        matmul(logits, s->x, &m->lm_head, k);
        /* logits row j is the last row of the j-th segment that wants them */
        const int j = bad < 0 ? bad_row(logits, k, V) : -1;
        for (int g = 0, w = 0; j >= 0 && g < nseg; g++)
            if (segs[g].last_logits && w++ == j) bad = segs[g].row + segs[g].n - 1;
    }
    return bad;
}

/* What model_forward refuses in one sequence's tokens [n] over cache kv,
 * checked before anything runs: 0, or -1 with one line in err. */
static int seq_check(const Model *m, const KVCache *kv, const int *tokens, int n, char *err, size_t errlen) {
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
    if (kv->state_floats != m->state_floats) {
        snprintf(err, errlen, "model_forward: the cache holds %zu floats of recurrent state, the model needs %zu "
                 "(open it with model_kv_init)", kv->state_floats, m->state_floats);
        return -1;
    }
    if (m->journal && (n > m->journal_cap || n > m->s.cap)) {
        snprintf(err, errlen, "model_forward: %d tokens, but the journal holds %d", n,
                 m->journal_cap < m->s.cap ? m->journal_cap : m->s.cap);
        return -1;
    }
    if (!m->gpu != !kv->dev) {
        snprintf(err, errlen, "model_forward: the cache was opened for the %s, the model runs on the %s (open it with "
                 "model_kv_init)", kv->dev ? "GPU" : "CPU", m->gpu ? "GPU" : "CPU");
        return -1;
    }
    return 0;
}

int model_forward(Model *m, KVCache *kv, const int *tokens, int n, float *logits, int all_logits, float *hidden,
                  char *err, size_t errlen) {
    const Config *c = &m->cfg;
    int pos = kv_cache_len(kv);
    if (seq_check(m, kv, tokens, n, err, errlen)) return -1;
    if (m->gpu) {
        int bad;
        if (gpu_forward(m->gpu, kv, tokens, n, logits, all_logits, hidden, &bad, err, errlen)) return -1;
        if (bad < 0 && logits && all_logits) bad = bad_row(logits, n, c->vocab_size);
        else if (bad < 0 && logits && bad_row(logits, 1, c->vocab_size) == 0) bad = n - 1;
        if (bad >= 0) {
            nonfinite_error(m, "model", pos + bad, err, errlen);
            return -1;
        }
        return 0;
    }
    /* one segment per chunk of at most s.cap tokens; logits of the last
     * row only come from the last chunk */
    for (int off = 0; off < n; off += m->s.cap) {
        int nb = n - off < m->s.cap ? n - off : m->s.cap, last = off + nb == n;
        float *lg = logits && (all_logits || last) ? logits + (all_logits ? (size_t)off * c->vocab_size : 0) : NULL;
        Seg seg = {.kv = kv, .tokens = tokens + off, .n = nb, .pos = pos + off, .last_logits = lg && !all_logits};
        int bad = forward_chunk(m, &seg, 1, lg, all_logits, hidden ? hidden + (size_t)off * c->hidden : NULL);
        if (bad >= 0) {
            nonfinite_error(m, "model", pos + off + bad, err, errlen);
            return -1;
        }
    }
    return 0;
}

int model_thread_init(const Model *m) { return matmul_reserve(m->s.cap, m->s.wide); }

void model_thread_free(void) { matmul_thread_free(); }

int model_batch_rows(const Model *m) { return m->s.cap; }

uint64_t model_identity(const Model *m) {
#if defined(__aarch64__)
    /* aarch64's levels round apart from x86-64's of the same number */
    const uint64_t level = 16 + (uint64_t)kernels_level();
#else
    const uint64_t level = (uint64_t)kernels_level();
#endif
    uint64_t h = kv_hash64(&m->cfg, sizeof m->cfg, level << 32 | KV_FORMAT);
    for (int i = 0; i < m->ts.n_tensors; i++) {
        const STensor *t = &m->ts.tensors[i];
        h = kv_hash64(t->name, strlen(t->name), h);
        h = kv_hash64(t->dtype, sizeof t->dtype, h);
        h = kv_hash64(t->shape, (size_t)t->ndim * sizeof *t->shape, h);
        /* 64 bytes at 16 places spread over the tensor: a fine-tune that
         * moved any part of it, all but surely (hashing every byte would
         * read the whole model at each start) */
        for (size_t k = 0; k < 16; k++) {
            const size_t at = t->nbytes > 64 ? (t->nbytes - 64) / 15 * k : 0;
            h = kv_hash64((const uint8_t *)t->data + at, t->nbytes < 64 ? t->nbytes : 64, h);
        }
    }
    /* converted weights (-wq q8, -act bf16) round differently */
    const Weight *const w[] = {&m->lm_head, &m->embed};
    for (size_t i = 0; i < sizeof w / sizeof *w; i++) h = kv_hash64(&w[i]->dtype, sizeof w[i]->dtype, h);
    for (int l = 0; l < m->cfg.n_layers; l++) {
        const Layer *L = &m->layers[l];
        const DType d[] = {L->wq.dtype, L->wk.dtype, L->wv.dtype, L->wo.dtype, L->w_qkv.dtype, L->w_z.dtype,
                           L->w_out.dtype, L->wg.dtype, L->wu.dtype, L->wd.dtype};
        h = kv_hash64(d, sizeof d, h);
    }
    return h;
}

int model_forward_batch(Model *m, ModelSeq *seqs, int nseq, char *err, size_t errlen) {
    const int V = m->cfg.vocab_size;
    char why[512];
    if (nseq < 1) {
        snprintf(err, errlen, "model_forward_batch: expected at least one sequence, found %d", nseq);
        return -1;
    }
    if (nseq > 1 && m->gpu) {
        snprintf(err, errlen, "model_forward_batch: %d sequences, but on the GPU the forward takes one", nseq);
        return -1;
    }
    /* the journal's layout holds one sequence's rows */
    if (nseq > 1 && m->journal) {
        snprintf(err, errlen, "model_forward_batch: %d sequences, but a journal (speculative verification) is kept, "
                 "which records one", nseq);
        return -1;
    }
    /* every check before anything runs, so that a refused batch leaves
     * every cache as it was */
    int rows = 0, k = 0;
    for (int i = 0; i < nseq; i++) seqs[i].failed = 0;
    for (int i = 0; i < nseq; i++) {
        if (seq_check(m, seqs[i].kv, seqs[i].tokens, seqs[i].n, why, sizeof why)) {
            snprintf(err, errlen, "sequence %d: %s", i, why);
            return -1;
        }
        for (int j = 0; j < i; j++)
            if (seqs[j].kv == seqs[i].kv) {
                snprintf(err, errlen, "sequence %d: the same cache as sequence %d", i, j);
                return -1;
            }
        rows += seqs[i].n;
        if (rows > m->s.cap) {
            snprintf(err, errlen, "sequence %d: %d rows so far, more than the %d a batch takes (model_batch_rows)", i,
                     rows, m->s.cap);
            return -1;
        }
        k += seqs[i].logits != NULL;
    }
    /* one sequence is model_forward's own case (the GPU's too) */
    if (nseq == 1) {
        if (!model_forward(m, seqs[0].kv, seqs[0].tokens, seqs[0].n, seqs[0].logits, 0, NULL, why, sizeof why))
            return 0;
        snprintf(err, errlen, "sequence 0: %s", why);
        return -1;
    }
    /* at most s.cap rows of at least one each: nseq <= MODEL_BATCH */
    Seg segs[MODEL_BATCH];
    /* the logits [k, V] come from one lm_head matmul: straight into the
     * callers' rows when those lie back to back in order (the server's do),
     * else into a buffer that is copied out */
    float *first = NULL;
    int packed = 1;
    for (int i = 0, j = 0; i < nseq; i++)
        if (seqs[i].logits) {
            if (!first) first = seqs[i].logits;
            packed &= seqs[i].logits == first + (size_t)j++ * V;
        }
    float *lg = !k ? NULL : packed ? first : malloc((size_t)k * V * sizeof(float));
    if (k && !lg) {
        snprintf(err, errlen, "model_forward_batch: out of memory for %d rows of logits", k);
        return -1;
    }
    /* the sequences' rows back to back, in their order */
    for (int i = 0, row = 0; i < nseq; i++) {
        segs[i] = (Seg){.kv = seqs[i].kv, .tokens = seqs[i].tokens, .row = row, .n = seqs[i].n,
                        .pos = kv_cache_len(seqs[i].kv), .last_logits = seqs[i].logits != NULL};
        row += seqs[i].n;
    }
    int bad = forward_chunk(m, segs, nseq, lg, 0, NULL);
    /* lg [k, V] in sequence order, to the sequences that asked; when some
     * row was not finite, each sequence's rows (post-norm states in xb, and
     * its logits) are looked at on their own, since the others' are good */
    int bad_seq = -1;
    for (int i = 0, j = 0; i < nseq; i++) {
        seqs[i].failed = 0;
        const float *li = seqs[i].logits ? lg + (size_t)j++ * V : NULL;
        if (li && !packed) memcpy(seqs[i].logits, li, (size_t)V * sizeof(float));
        if (bad < 0) continue;
        int r = bad_row(m->s.xb + (size_t)segs[i].row * m->cfg.hidden, segs[i].n, m->cfg.hidden);
        if (r < 0 && li && bad_row(li, 1, V) == 0) r = segs[i].n - 1;
        if (r < 0) continue;
        seqs[i].failed = 1;
        if (bad_seq < 0) {
            char what[32];
            snprintf(what, sizeof what, "sequence %d", i);
            nonfinite_error(m, what, segs[i].pos + r, err, errlen);
            bad_seq = i;
        }
    }
    if (!packed) free(lg);
    return bad_seq < 0 ? 0 : -1;
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
    if (!m->gpu != !mkv->dev) {
        snprintf(err, errlen, "model_mtp_forward: the cache was opened for the %s, the model runs on the %s (open it "
                 "with model_kv_init)", mkv->dev ? "GPU" : "CPU", m->gpu ? "GPU" : "CPU");
        return -1;
    }
    if (m->gpu) {
        int bad;
        if (gpu_mtp_forward(m->gpu, mkv, hidden, tokens, n, logits, all_logits, hm, &bad, err, errlen)) return -1;
        if (bad < 0 && logits && all_logits) bad = bad_row(logits, n, V);
        else if (bad < 0 && logits && bad_row(logits, 1, V) == 0) bad = n - 1;
        if (bad >= 0) {
            nonfinite_error(m, "MTP head", pos + bad, err, errlen);
            return -1;
        }
        return 0;
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
        const Seg seg = {.kv = mkv, .n = nb, .pos = pos + off};
        rope_tables(m, &seg, 1);
        layer_forward(m, &m->mtp_layer, &seg, 1, 0);
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

int model_check_input(const Model *m, const int *tokens, int n, char *err, size_t errlen) {
    const Config *c = &m->cfg;
    for (int i = 0; i < n; i++)
        if (tokens[i] >= 0 && (tokens[i] == c->media_ids[0] || tokens[i] == c->media_ids[1])) {
            const char *what = tokens[i] == c->media_ids[0] ? "image" : "video";
            snprintf(err, errlen, "token id %d at position %d is the %s placeholder (%s_token_id): images and video "
                     "are not supported, only text", tokens[i], i, what, what);
            return -1;
        }
    return 0;
}

void model_state_replay(Model *m, KVCache *kv, const float *snapshot, const float *journal, int cap, int n) {
    const Config *c = &m->cfg;
    const int hk = c->lin_k_heads, hv = c->lin_v_heads, dk = c->lin_k_dim, dv = c->lin_v_dim, K = c->conv_k;
    const size_t conv_dim = 2 * (size_t)hk * dk + (size_t)hv * dv, rec = journal_rec(c);
    const size_t per = c->n_gdn ? m->state_floats / (size_t)c->n_gdn : 0;
    memcpy(kv->state, snapshot, m->state_floats * sizeof(float));
    for (int g = 0; g < c->n_gdn && n > 0; g++) {
        float *S0 = kv->state + per * g, *win = S0 + (size_t)hv * dk * dv;
        const float *jr = journal + (size_t)cap * rec * g;
        /* the same kernel on the same inputs as the recorded pass: the same
         * state after its first n tokens (outputs land in scratch, unused) */
        delta_run(m, S0, jr + conv_dim, rec, jr + 2 * conv_dim, jr + 2 * conv_dim + hv, rec, m->s.y, n);
        /* the conv window: the last K-1 of [window | m_0 .. m_{n-1}]; rows
         * are written in ascending order, so row j + n of the old window is
         * still there when row j takes it */
        for (int j = 0; j < K - 1; j++) {
            const int tau = n - (K - 1) + j;
            memcpy(win + (size_t)j * conv_dim, tau >= 0 ? jr + (size_t)tau * rec : win + (size_t)(j + n) * conv_dim,
                    conv_dim * sizeof(float));
        }
    }
}
