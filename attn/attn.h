/* attn.h: causal attention of one query position against one kv head's
 * cached positions, reading K and V only through the kv/ scheme table.
 *
 * Data flow: model/ appends k, v for position t to the streams, then calls
 * attn_group for the nq query heads that share that kv head (GQA), over all
 * stored positions [0, len); prefill appends a few positions, then calls
 * attn_block for all of them. A position's output is the same bits either
 * way, so it never depends on how the prompt was batched.
 *
 *   q   [nq, d]  query heads of the group, original domain, after RoPE
 *   out [nq, d]  attention output, original domain
 */
#ifndef ATTN_H
#define ATTN_H

#include "kv/kv.h"

/* Positions scored per online-softmax step. */
#define ATTN_CHUNK 128

/* Tokens attn_block takes at once in prefill for nq query heads per kv
 * head: as many as keep the queries within KV_MAX_NQ (Qwen3-0.6B's 2 heads:
 * 4 tokens, whose 8 queries then read each chunk of K and V once). */
static inline int attn_block_tokens(int nq) { return nq < KV_MAX_NQ ? KV_MAX_NQ / nq : 1; }

/* Floats of scratch attn_group needs for nq heads of dimension d
 * (attn_block: nq * ntok heads). */
size_t attn_scratch_floats(int nq, int d);
void attn_group(const KVStream *k, const KVStream *v, const float *q, int nq, float scale, float *out,
                float *scratch);
/* attn_group for the last ntok positions of the streams at once: token j's
 * nq query heads are q + j * ld [nq, d], its output out + j * ld, and it
 * attends to positions [0, len - ntok + j], getting the same bits as
 * attn_group called right after its own append, with nq * ntok <=
 * KV_MAX_NQ. For a windowed scheme (KVScheme.windowed), ntok <=
 * KV_MAX_ROLLBACK: each token reads the positions past the settled ones
 * from a copy of the stream at its own length. */
void attn_block(const KVStream *k, const KVStream *v, const float *q, int nq, int ntok, size_t ld, float scale,
                float *out, float *scratch);
/* The same result computed the plain way (f32 dequantize, full softmax):
 * what tests hold attn_group to. 0 ok, -1 out of memory (out untouched). */
int attn_group_ref(const KVStream *k, const KVStream *v, const float *q, int nq, float scale, float *out);

#endif
