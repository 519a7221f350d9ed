/* speculative.h: speculative decoding with the model's MTP head.
 *
 * Data flow: run.c prefills the main model (keeping its hidden states) and
 * hands them to spec_prefill, which fills the MTP cache for every prompt
 * position; then each spec_step drafts N tokens with the MTP layer (reused
 * recursively: its own output state and drafted token feed the next step,
 * position + 1), verifies them with one batched main-model forward of N + 1
 * tokens, keeps the agreeing prefix (greedy) or applies the Leviathan/Chen
 * rejection rule (sampling), truncates both caches past what was kept, and
 * rewrites the MTP rows written from draft states with the main model's.
 *
 * Positions (shared/specs/qwen3.md): MTP row p consumes (h_p, t_{p+1}) at
 * RoPE position p and drafts t_{p+2}. P = main cache length, x = the last
 * sampled token (not yet in the cache); the MTP cache holds rows [0, M)
 * with M <= P and the main hidden states of positions [M, P) wait in pend.
 */
#ifndef SPECULATIVE_H
#define SPECULATIVE_H

#include <stdio.h>

#include "model/model.h"
#include "sample/sampler.h"

/* Deepest draft accepted by -spec (rollback must stay within KV_MAX_ROLLBACK). */
#define SPEC_MAX 16

typedef struct {
    Model *m;
    KVCache *kv, *mkv;
    Sampler *smp;
    int n_draft;
    int n_pend;       /* P - M */
    float *pend;      /* [SPEC_MAX + 2, H] hidden states of positions M..P-1 */
    float *hid;       /* [SPEC_MAX + 1, H] verify hidden states */
    float *lg;        /* [SPEC_MAX + 1, V] verify logits */
    float *q;         /* [SPEC_MAX, V] draft distributions (sampling) */
    float *mlg;       /* [V] MTP logits */
    float *hm;        /* [H] MTP state of the last draft row */
    int rows_tok[SPEC_MAX + 2]; /* tokens for catch-up rows */
    /* A recurrent state (Gated DeltaNet layers: kv->state) cannot be
     * truncated like a KV cache: snap holds it from before the last verify
     * pass, which began at position snap_pos, and journal that pass's
     * recurrence inputs (Model.journal), of which the first n_rec tokens
     * may still be replayed */
    float *snap;      /* [kv->state_floats], NULL for attention-only models */
    float *journal;   /* [model_journal_floats(m, SPEC_MAX + 1)] */
    int snap_pos, n_rec;
    /* counters: accepted[j] = drafts accepted at depth j + 1 */
    long accepted[SPEC_MAX], drafted, steps, emitted;
} Spec;

int spec_init(Spec *s, Model *m, KVCache *kv, KVCache *mkv, Sampler *smp, int n_draft, char *err, size_t errlen);
void spec_free(Spec *s);
/* After the main model consumed tokens[0..n) (hidden [n, H] its post-norm
 * states): writes every MTP row whose next token is now known. */
int spec_prefill(Spec *s, const float *hidden, const int *tokens, int n, char *err, size_t errlen);
/* One draft-verify round starting from x. Writes the tokens it produces
 * (accepted drafts, then the main model's own token) to out[], at most
 * n_draft + 1, and returns how many; the last one is the next x. -1 on error. */
int spec_step(Spec *s, int x, int *out, char *err, size_t errlen);
/* Drops cached positions >= p (p > the cache length minus the last step's
 * output), so the caches hold what plain decoding would have at a stop. */
int spec_rewind(Spec *s, int p);
/* The rejection rule for one draft: p and q are the target and draft
 * distributions [V], d ~ q the draft. Returns d when accepted, else a
 * sample of normalize(max(0, p - q)); *accepted says which. */
int spec_verify_token(Sampler *smp, const float *p, const float *q, int d, int V, int *accepted);
/* Empties both caches (a chat that feeds its turns again); the counters
 * stay. */
void spec_reset(Spec *s);
/* Drafts accepted so far, all depths. */
long spec_accepted(const Spec *s);
void spec_print_stats(const Spec *s, FILE *f);

#endif
