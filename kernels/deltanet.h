/* deltanet.h: the gated delta rule, the recurrence of a Gated DeltaNet layer
 * (Qwen3.5; shared/specs/qwen35.md, Yang et al. arXiv 2412.06464).
 *
 * Data flow: model/ projects and convolves a GDN layer's input, L2-normalises
 * q and k, turns the b and a projections into beta and alpha, then calls
 * this once per value head and block of state columns; the output o goes
 * on to the gated RMSNorm and out_proj. Per token t, for one value head
 * whose state is S [dk, dv] (f32, row-major, kept in the KV cache):
 *
 *   S <- alpha_t S;   u = S^T k_t;   S <- S + k_t (beta_t (v_t - u))^T;   o_t = S^T q_t
 *
 * Column e of S only ever meets column e of v, u and o, so the columns are
 * independent: a call may take any range [e0, e1) of them, which is how
 * the model splits a head across threads and keeps the part of S it works
 * on in L1 for every token of a batch. Tokens run strictly in order, one at
 * a time: prefill, decode and speculative verification give the same bits.
 */
#ifndef DELTANET_H
#define DELTANET_H
#include <stddef.h>

/* One value head's inputs for n tokens; row t of each at t * its stride. */
typedef struct {
    const float *q, *k;        /* [n][ld_qk] the key head's normalised q (times dk^-1/2) and k, dk each */
    const float *v;            /* [n][ld_v] the head's value, dv */
    const float *alpha, *beta; /* [n][ld_ab] decay in (0, 1] and write strength */
    float *o;                  /* [n][ld_o] output, dv (only columns [e0, e1) written) */
    size_t ld_qk, ld_v, ld_ab, ld_o;
    int n, dk, dv;
} DeltaRule;

/* Runs the recurrence on columns [e0, e1) of S [dk, dv], in place. */
void deltanet_cols(float *S, const DeltaRule *a, int e0, int e1);
void deltanet_cols_ref(float *S, const DeltaRule *a, int e0, int e1);
#endif
