/* speculative.c: MTP drafting, batched verification and rollback (see speculative.h).
 * Verification follows Leviathan et al. 2023 (arXiv 2211.17192) and Chen et
 * al. 2023 (arXiv 2302.01318); greedy is its temperature-0 limit, where the
 * output equals plain greedy decoding token for token because a batched
 * forward gives each position exactly the logits a single step would. */
#include "speculative/speculative.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int spec_init(Spec *s, Model *m, KVCache *kv, KVCache *mkv, Sampler *smp, int n_draft, char *err, size_t errlen) {
    memset(s, 0, sizeof *s);
    const size_t H = (size_t)m->cfg.hidden, V = (size_t)m->cfg.vocab_size;
    if (n_draft < 1 || n_draft > SPEC_MAX) {
        snprintf(err, errlen, "-spec: expected 0..%d drafts, found %d", SPEC_MAX, n_draft);
        return -1;
    }
    s->m = m, s->kv = kv, s->mkv = mkv, s->smp = smp, s->n_draft = n_draft;
    /* sized for this run's drafts, not SPEC_MAX's: a verify pass has
     * n_draft + 1 rows, and a 250K vocabulary makes each row of logits 1 MB */
    const size_t N = (size_t)n_draft;
    s->pend = malloc((N + 2) * H * sizeof(float));
    s->hid = malloc((N + 2) * H * sizeof(float));
    s->lg = malloc((N + 1) * V * sizeof(float));
    s->q = malloc(N * V * sizeof(float));
    s->mlg = malloc(V * sizeof(float));
    s->hm = malloc(H * sizeof(float));
    if (kv->state) {
        s->snap = malloc(kv->state_floats * sizeof(float));
        s->journal = malloc(model_journal_floats(m, n_draft + 1) * sizeof(float));
    }
    if (!s->pend || !s->hid || !s->lg || !s->q || !s->mlg || !s->hm || (kv->state && (!s->snap || !s->journal))) {
        spec_free(s);
        snprintf(err, errlen, "speculative decoding: out of memory");
        return -1;
    }
    return 0;
}

void spec_free(Spec *s) {
    free(s->pend), free(s->hid), free(s->lg), free(s->q), free(s->mlg), free(s->hm), free(s->snap);
    free(s->journal);
    memset(s, 0, sizeof *s);
}

int spec_prefill(Spec *s, const float *hidden, const int *tokens, int n, char *err, size_t errlen) {
    const int H = s->m->cfg.hidden;
    s->n_rec = 0; /* the cache moved on: no verify pass to rewind into */
    /* the pending rows now know their last token: tokens[0] */
    if (s->n_pend > 0) {
        s->rows_tok[s->n_pend - 1] = tokens[0];
        if (model_mtp_forward(s->m, s->mkv, s->pend, s->rows_tok, s->n_pend, NULL, 0, NULL, err, errlen)) return -1;
    }
    /* prompt rows p consume (h_p, t_{p+1}); the last one waits for the next token */
    if (n > 1 && model_mtp_forward(s->m, s->mkv, hidden, tokens + 1, n - 1, NULL, 0, NULL, err, errlen)) return -1;
    memcpy(s->pend, hidden + (size_t)(n - 1) * H, (size_t)H * sizeof(float));
    s->n_pend = 1;
    return 0;
}

/* Draws from a distribution [V] with the sampler's generator. */
static int draw(Sampler *smp, const float *prob, int V) {
    const float r = sampler_uniform(smp);
    double c = 0; /* f64, as sampler_sample's */
    int last = 0;
    for (int i = 0; i < V; i++) {
        if (prob[i] <= 0) continue;
        c += prob[i];
        last = i;
        if (r < c) return i;
    }
    return last;
}

int spec_verify_token(Sampler *smp, const float *p, const float *q, int d, int V, int *accepted) {
    float u = sampler_uniform(smp);
    if (q[d] > 0 && u * q[d] < p[d]) {
        *accepted = 1;
        return d;
    }
    *accepted = 0;
    /* the residual max(0, p - q), normalised, corrects for q's excess mass */
    double sum = 0;
    for (int i = 0; i < V; i++) sum += p[i] > q[i] ? p[i] - q[i] : 0;
    if (sum <= 0) return draw(smp, p, V);
    const double r = sampler_uniform(smp) * sum;
    double c = 0;
    int last = d;
    for (int i = 0; i < V; i++) {
        float w = p[i] > q[i] ? p[i] - q[i] : 0;
        if (w <= 0) continue;
        c += w;
        last = i;
        if (r < c) return i;
    }
    return last;
}

/* Takes the main cache back to position p within the last verify pass.
 * KV caches truncate (what the pass appended for the kept tokens is what
 * plain decoding appends: batching never changes it). A recurrent state is
 * restored from its snapshot and the kept tokens' recurrence replayed from
 * the pass's journal: no weight is read again, and the state's bits are
 * those plain decoding leaves (model_state_replay). */
static int rewind_to(Spec *s, int p, char *err, size_t errlen) {
    if (s->snap && (p < s->snap_pos || p > s->snap_pos + s->n_rec)) {
        snprintf(err, errlen, "rewind to %d: outside the last verify pass from %d", p, s->snap_pos);
        return -1;
    }
    if (kv_cache_truncate(s->kv, p)) {
        snprintf(err, errlen, "rewind to %d failed", p);
        return -1;
    }
    if (s->snap) model_state_replay(s->m, s->kv, s->snap, s->journal, s->n_draft + 1, p - s->snap_pos);
    return 0;
}

/* Draft token from MTP logits: argmax, or a draw from the filtered
 * distribution, which is kept as q for verification. */
static int pick_draft(Spec *s, const float *logits, float *q) {
    const int V = s->m->cfg.vocab_size;
    if (s->smp->temperature <= 0) return sampler_argmax(logits, V);
    sampler_dist(s->smp, logits);
    memcpy(q, s->smp->prob, (size_t)V * sizeof(float));
    return draw(s->smp, q, V);
}

int spec_step(Spec *s, int x, int *out, char *err, size_t errlen) {
    Model *m = s->m;
    const int H = m->cfg.hidden, V = m->cfg.vocab_size, P = kv_cache_len(s->kv), greedy = s->smp->temperature <= 0;
    /* fewer drafts near the end of the context: verification needs N + 1 slots */
    int N = s->n_draft;
    if (P + N + 1 > s->kv->cap) N = s->kv->cap - P - 1;
    if (N < 1) {
        snprintf(err, errlen, "context full");
        return -1;
    }
    /* catch up: pending rows M..P-1, the last one with x; it drafts d1 */
    s->rows_tok[s->n_pend - 1] = x;
    if (model_mtp_forward(m, s->mkv, s->pend, s->rows_tok, s->n_pend, s->mlg, 0, s->hid, err, errlen)) return -1;
    int toks[SPEC_MAX + 1];
    toks[0] = x;
    memcpy(s->hm, s->hid + (size_t)(s->n_pend - 1) * H, (size_t)H * sizeof(float));
    toks[1] = pick_draft(s, s->mlg, s->q);
    /* recursive drafts: (hm, d_j) at the next MTP position drafts d_{j+1} */
    for (int j = 1; j < N; j++) {
        if (model_mtp_forward(m, s->mkv, s->hm, &toks[j], 1, s->mlg, 0, s->hm, err, errlen)) return -1;
        toks[j + 1] = pick_draft(s, s->mlg, s->q + (size_t)j * V);
    }
    /* verify x, d1..dN in one batch: row j predicts the token after toks[j] */
    if (s->snap) {
        memcpy(s->snap, s->kv->state, s->kv->state_floats * sizeof(float));
        s->snap_pos = P;
        s->n_rec = N + 1;
        m->journal = s->journal, m->journal_cap = s->n_draft + 1;
    }
    int rc = model_forward(m, s->kv, toks, N + 1, s->lg, 1, s->hid, err, errlen);
    m->journal = NULL, m->journal_cap = 0;
    if (rc) {
        s->n_rec = 0; /* a pass that failed half-way left no journal to replay */
        return -1;
    }
    int k = 0, y = -1;
    for (; k < N; k++) {
        const float *row = s->lg + (size_t)k * V;
        if (greedy) {
            y = sampler_argmax(row, V);
            if (y != toks[k + 1]) break;
        } else {
            int acc;
            sampler_dist(s->smp, row);
            y = spec_verify_token(s->smp, s->smp->prob, s->q + (size_t)k * V, toks[k + 1], V, &acc);
            if (!acc) break;
        }
        out[k] = toks[k + 1];
        s->accepted[k]++;
    }
    if (k == N) y = greedy ? sampler_argmax(s->lg + (size_t)N * V, V) : sampler_sample(s->smp, s->lg + (size_t)N * V);
    out[k] = y;
    /* a later rewind may replay only what was accepted */
    if (s->n_rec > k + 1) s->n_rec = k + 1;
    /* keep x, d1..dk in the main cache; MTP rows from draft states go, and
     * h_P..h_{P+k} wait to be rewritten from the main model's states */
    if (k < N && rewind_to(s, P + k + 1, err, errlen)) return -1;
    kv_cache_truncate(s->mkv, P);
    memcpy(s->pend, s->hid, (size_t)(k + 1) * H * sizeof(float));
    memcpy(s->rows_tok, toks + 1, (size_t)k * sizeof(int));
    s->n_pend = k + 1;
    s->steps++;
    s->drafted += N;
    s->emitted += k + 1;
    return k + 1;
}

int spec_rewind(Spec *s, int p) {
    char err[256];
    int P = kv_cache_len(s->kv), M = kv_cache_len(s->mkv);
    if (p > P || p - M < 1 || (p < P && rewind_to(s, p, err, sizeof err))) return -1;
    s->n_pend = p - M;
    return 0;
}

void spec_reset(Spec *s) {
    kv_cache_truncate(s->kv, 0);
    kv_cache_truncate(s->mkv, 0);
    s->n_pend = 0;
    s->n_rec = 0;
}

long spec_accepted(const Spec *s) {
    long a = 0;
    for (int j = 0; j < SPEC_MAX; j++) a += s->accepted[j];
    return a;
}

void spec_print_stats(const Spec *s, FILE *f) {
    long acc = 0;
    fprintf(f, "spec: %d drafts, %ld verify steps; acceptance by depth:", s->n_draft, s->steps);
    for (int j = 0; j < s->n_draft; j++) {
        fprintf(f, " %.3f", s->steps ? (double)s->accepted[j] / s->steps : 0.0);
        acc += s->accepted[j];
    }
    fprintf(f, "; mean accepted length %.3f; tokens per main forward %.3f\n", s->steps ? (double)acc / s->steps : 0.0,
            s->steps ? (double)s->emitted / s->steps : 0.0);
}
