/* attn.h: causal attention of one query position against one kv head's
 * cached positions, reading K and V only through the kv/ scheme table.
 *
 * Data flow: model/ appends k, v for position t to the streams, then calls
 * attn_group for the nq query heads that share that kv head (GQA), over all
 * stored positions [0, len). Prefill and decode both come through here, one
 * query position at a time, so a position's output never depends on how the
 * prompt was batched.
 *
 *   q   [nq, d]  query heads of the group, original domain, after RoPE
 *   out [nq, d]  attention output, original domain
 */
#ifndef ATTN_H
#define ATTN_H

#include "kv/kv.h"

/* Positions scored per online-softmax step. */
#define ATTN_CHUNK 128

/* Floats of scratch attn_group needs for nq heads of dimension d. */
size_t attn_scratch_floats(int nq, int d);
void attn_group(const KVStream *k, const KVStream *v, const float *q, int nq, float scale, float *out,
                float *scratch);
/* The same result computed the plain way (f32 dequantize, full softmax):
 * what tests hold attn_group to. */
void attn_group_ref(const KVStream *k, const KVStream *v, const float *q, int nq, float scale, float *out);

#endif
