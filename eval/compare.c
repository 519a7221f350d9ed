/* compare.c: scheme comparison rows and their table, and per-layer kvstats
 * (see compare.h; the rows' files are compare_out.c's). Metrics follow the
 * habits of the KV-quantization literature and llama.cpp's perplexity tool:
 * perplexity, mean KL divergence against the unquantized model's
 * distribution, same-top-1 rate, plus greedy agreement and decode speed at
 * the measured context. */
#include "eval/compare.h"
#include "attn/attn.h"
#include "kernels/ops.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Positions per lockstep chunk: every scheme holds one [B, V] logits block. */
#define CMP_BATCH 16

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* logp[V] = log softmax(x), in double for stable KL sums. */
static void log_softmax(const float *x, int V, double *logp) {
    float mx = x[0];
    for (int i = 1; i < V; i++) mx = x[i] > mx ? x[i] : mx;
    double s = 0;
    for (int i = 0; i < V; i++) s += exp((double)x[i] - mx);
    double lse = log(s) + mx;
    for (int i = 0; i < V; i++) logp[i] = x[i] - lse;
}

int compare_run(Model *ref, Model *m, const char *m_weights, const KVSpec *specs, int n, const int *ids, int n_ids,
                int ctx, int n_gen, CompareRow *rows, CompareProgress progress, void *pctx, char *err, size_t errlen) {
    const int V = m->cfg.vocab_size, d = m->cfg.head_dim;
    int L = n_ids < ctx - n_gen ? n_ids : ctx - n_gen;
    if (L < 2) {
        snprintf(err, errlen, "compare: need at least 2 text tokens within the context (%d tokens, -c %d, -n %d)", n_ids,
                 ctx, n_gen);
        return -1;
    }
    KVCache *kv = calloc((size_t)n, sizeof(KVCache));
    float *lg = malloc((size_t)n * CMP_BATCH * V * sizeof(float));
    double *lref = malloc((size_t)V * sizeof(double)), *lq = malloc((size_t)V * sizeof(double));
    double *nll = calloc((size_t)n, sizeof(double)), *kl = calloc((size_t)n, sizeof(double));
    long *same = calloc((size_t)n, sizeof(long));
    int *ref_gen = malloc((size_t)(n_gen + 1) * sizeof(int)), rc = -1;
    if (!kv || !lg || !lref || !lq || !nll || !kl || !same || !ref_gen) {
        snprintf(err, errlen, "compare: out of memory");
        goto done;
    }
    /* each cache with the model that runs it (on the GPU a cache belongs
     * to its model's buffers) */
    for (int i = 0; i < n; i++)
        if (model_kv_init(i ? m : ref, &kv[i], &specs[i], ctx, 0, err, errlen)) goto done;
    /* text: every scheme sees the same chunk, scored against the reference */
    for (int off = 0; off < L; off += CMP_BATCH) {
        int nb = L - off < CMP_BATCH ? L - off : CMP_BATCH;
        for (int i = 0; i < n; i++)
            if (model_forward(i ? m : ref, &kv[i], ids + off, nb, lg + (size_t)i * CMP_BATCH * V, 1, NULL, err, errlen))
                goto done;
        for (int t = 0; t < nb; t++) {
            log_softmax(lg + (size_t)t * V, V, lref);
            int top_ref = argmax(lg + (size_t)t * V, V), next = off + t + 1 < L ? ids[off + t + 1] : -1;
            for (int i = 0; i < n; i++) {
                const float *row = lg + ((size_t)i * CMP_BATCH + t) * V;
                log_softmax(row, V, lq);
                double k = 0;
                for (int j = 0; j < V; j++) k += exp(lref[j]) * (lref[j] - lq[j]);
                kl[i] += k;
                same[i] += argmax(row, V) == top_ref;
                if (next >= 0) nll[i] -= lq[next];
            }
        }
        if (progress) progress(pctx, (long)(off + nb) * n, (long)(L + n_gen) * n);
    }
    /* greedy continuation from each scheme's own last logits, timed */
    for (int i = 0; i < n; i++) {
        const float *last = lg + ((size_t)i * CMP_BATCH + (size_t)((L - 1) % CMP_BATCH)) * V;
        int tok = argmax(last, V), agree = 0, diverged = 0;
        double t0 = now();
        for (int g = 0; g < n_gen; g++) {
            if (i == 0) ref_gen[g] = tok;
            else if (!diverged && tok == ref_gen[g]) agree++;
            else diverged = 1;
            float *out = lg + (size_t)i * CMP_BATCH * V;
            if (model_forward(i ? m : ref, &kv[i], &tok, 1, out, 0, NULL, err, errlen)) goto done;
            tok = argmax(out, V);
        }
        double dt = now() - t0;
        if (progress) progress(pctx, (long)L * n + (long)(i + 1) * n_gen, (long)(L + n_gen) * n);
        CompareRow *r = &rows[i];
        memset(r, 0, sizeof *r);
        kv_spec_name(&specs[i], r->name, sizeof r->name);
        r->weights = i && m != ref ? m_weights : "stored";
        /* bits from what the streams really hold at this context (KIVI's
         * float window weighs more in a short one); a GPU cache's schemes
         * (no window there) hold their nominal bits */
        if (kv[i].dev) {
            r->k_bits = specs[i].k->bits(d, &specs[i].ko), r->v_bits = specs[i].v->bits(d, &specs[i].vo);
        } else {
            KVStream *ks = kv_k(&kv[i], 0, 0), *vs = kv_v(&kv[i], 0, 0);
            r->k_bits = 8.0 * ks->scheme->bytes(ks) / ((double)ctx * d);
            r->v_bits = 8.0 * vs->scheme->bytes(vs) / ((double)ctx * d);
        }
        r->bytes_per_token = (double)kv_cache_bytes(&kv[i]) / ctx;
        r->ppl = exp(nll[i] / (L - 1));
        r->kl = kl[i] / L;
        r->top1 = (double)same[i] / L;
        /* no greedy tokens (-n 0): nothing measured, NaN (printed "-", null in JSON) */
        r->greedy = !n_gen ? NAN : i == 0 ? 1.0 : (double)agree / n_gen;
        r->decode_tps = !n_gen ? NAN : dt > 0 ? n_gen / dt : 0;
    }
    /* f16's footprint, for the ratio column, from the model's shape */
    double f16 = 2.0 * kv[0].n_layers * m->cfg.n_kv_heads * d * 2;
    for (int i = 0; i < n; i++) {
        rows[i].ratio_f16 = f16 / rows[i].bytes_per_token;
        rows[i].dppl_pct = 100 * (rows[i].ppl / rows[0].ppl - 1);
    }
    rc = 0;
done:
    for (int i = 0; kv && i < n; i++)
        if (kv[i].k || kv[i].dev) kv_cache_free(&kv[i]);
    free(kv), free(lg), free(lref), free(lq), free(nll), free(kl), free(same), free(ref_gen);
    return rc;
}

void compare_print(FILE *f, const CompareRow *r, int n, const char *model, int n_ids) {
    fprintf(f, "model %s, %d text tokens; KL, top-1 and greedy against f32 on the stored weights\n", model, n_ids);
    fprintf(f, "| scheme | weights | K bits | V bits | KV bytes/token | vs f16 | ppl | dppl %% | KL | top-1 | greedy "
               "| decode tok/s |\n");
    fprintf(f, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (int i = 0; i < n; i++) {
        /* the greedy columns read "-" when no greedy tokens were asked for */
        char greedy[16] = "-", tps[16] = "-";
        if (!isnan(r[i].greedy)) snprintf(greedy, sizeof greedy, "%.1f%%", 100 * r[i].greedy);
        if (!isnan(r[i].decode_tps)) snprintf(tps, sizeof tps, "%.1f", r[i].decode_tps);
        fprintf(f, "| %s | %s | %.3g | %.3g | %.0f | %.2fx | %.4f | %+.2f | %.5f | %.1f%% | %s | %s |\n", r[i].name,
                r[i].weights, r[i].k_bits, r[i].v_bits, r[i].bytes_per_token, r[i].ratio_f16, r[i].ppl, r[i].dppl_pct,
                r[i].kl, 100 * r[i].top1, greedy, tps);
    }
}

/* Sums for one layer: squared errors and norms, cosine sums and counts. */
typedef struct {
    double k_err, k_norm, k_cos, v_err, v_norm, v_cos, o_err, o_norm;
    long nvec, nout;
} LayerStats;

static void vec_stats(const float *x, const float *y, int d, double *err, double *norm, double *cos) {
    double e = 0, xx = 0, yy = 0, xy = 0;
    for (int j = 0; j < d; j++) {
        e += (double)(x[j] - y[j]) * (x[j] - y[j]);
        xx += (double)x[j] * x[j], yy += (double)y[j] * y[j], xy += (double)x[j] * y[j];
    }
    *err += e, *norm += xx;
    *cos += xx > 0 && yy > 0 ? xy / sqrt(xx * yy) : 1;
}

int kvstats_run(Model *m, const KVSpec *spec, const int *ids, int n_ids, FILE *f, char *err, size_t errlen) {
    const Config *c = &m->cfg;
    /* the cache's layers: every layer, or a hybrid model's full-attention ones */
    const int nl = c->n_layers - c->n_gdn, nkv = c->n_kv_heads, d = c->head_dim, grp = c->n_heads / nkv;
    const int qd = c->n_heads * d, B = m->s.cap;
    KVSpec f32spec;
    KVCache ref = {0}, mine = {0}, sch = {0};
    LayerStats *ls = calloc((size_t)nl, sizeof(LayerStats));
    float *trace = malloc((size_t)nl * B * qd * sizeof(float)), *scr = malloc(attn_scratch_floats(grp, d) * sizeof(float));
    float *o1 = malloc((size_t)grp * d * sizeof(float)), *o2 = malloc((size_t)grp * d * sizeof(float));
    float *kb = malloc((size_t)B * d * sizeof(float)), *vb = malloc((size_t)B * d * sizeof(float));
    float y[KV_MAX_DIM];
    int rc = -1;
    if (!ls || !trace || !scr || !o1 || !o2 || !kb || !vb) { snprintf(err, errlen, "kvstats: out of memory"); goto done; }
    kv_spec_parse("f32", &f32spec, err, errlen);
    /* ref: the model's own f32 cache (on the GPU when the model is);
     * mine/sch: f32 and scheme copies on the CPU, grown one position at a
     * time so each query sees exactly its causal prefix. On the GPU the
     * forward and its cache are the GPU's; the scheme's vectors are the CPU
     * quantizer's, which are the GPU's bytes (docs/cuda.md). */
    if (model_kv_init(m, &ref, &f32spec, n_ids, 0, err, errlen) ||
        kv_cache_init(&mine, &f32spec, nl, nkv, d, n_ids, err, errlen) ||
        kv_cache_init(&sch, spec, nl, nkv, d, n_ids, err, errlen) || model_trace_q(m, trace, err, errlen))
        goto done;
    for (int off = 0; off < n_ids; off += B) {
        int nb = n_ids - off < B ? n_ids - off : B;
        if (model_forward(m, &ref, ids + off, nb, NULL, 0, NULL, err, errlen)) goto done;
        for (int l = 0; l < nl; l++)
            for (int h = 0; h < nkv; h++) {
                if (model_kv_read(&ref, l, h, off, nb, kb, vb, err, errlen)) goto done;
                for (int t = off; t < off + nb; t++) {
                    LayerStats *s = &ls[l];
                    const float *x = kb + (size_t)(t - off) * d;
                    kv_stream_append(kv_k(&mine, l, h), x);
                    kv_stream_append(kv_k(&sch, l, h), x);
                    kv_stream_get(kv_k(&sch, l, h), t, y);
                    vec_stats(x, y, d, &s->k_err, &s->k_norm, &s->k_cos);
                    x = vb + (size_t)(t - off) * d;
                    kv_stream_append(kv_v(&mine, l, h), x);
                    kv_stream_append(kv_v(&sch, l, h), x);
                    kv_stream_get(kv_v(&sch, l, h), t, y);
                    vec_stats(x, y, d, &s->v_err, &s->v_norm, &s->v_cos);
                    s->nvec++;
                    const float *q = trace + ((size_t)l * B + (t - off)) * qd + (size_t)h * grp * d;
                    float scale = 1.0f / sqrtf((float)d);
                    attn_group(kv_k(&mine, l, h), kv_v(&mine, l, h), q, grp, scale, o1, scr);
                    attn_group(kv_k(&sch, l, h), kv_v(&sch, l, h), q, grp, scale, o2, scr);
                    double cs = 0;
                    vec_stats(o1, o2, grp * d, &s->o_err, &s->o_norm, &cs);
                    s->nout++;
                }
            }
    }
    char name[64];
    kv_spec_name(spec, name, sizeof name);
    fprintf(f, "kvstats %s over %d tokens (errors relative: sqrt(sum |x - x^|^2 / sum |x|^2))\n", name, n_ids);
    fprintf(f, "| layer | K cos | K rel err | V cos | V rel err | attn out rel err |\n|---:|---:|---:|---:|---:|---:|\n");
    for (int l = 0, layer = 0; l < nl; l++, layer++) {
        LayerStats *s = &ls[l];
        while (m->kv_slot[layer] != l) layer++; /* the model's number for cache layer l */
        fprintf(f, "| %d | %.5f | %.4f | %.5f | %.4f | %.4f |\n", layer, s->k_cos / s->nvec,
                sqrt(s->k_err / s->k_norm), s->v_cos / s->nvec, sqrt(s->v_err / s->v_norm), sqrt(s->o_err / s->o_norm));
    }
    rc = 0;
done:
    model_trace_q(m, NULL, err, errlen);
    if (ref.k || ref.dev) kv_cache_free(&ref);
    if (mine.k) kv_cache_free(&mine);
    if (sch.k) kv_cache_free(&sch);
    free(ls), free(trace), free(scr), free(o1), free(o2), free(kb), free(vb);
    return rc;
}
