/* tbq_common.h: what tbq2, tbq3 and tbq4 share (TurboQuant-style KV blocks).
 *
 * Data flow: append rotates a K/V vector with the signed Hadamard transform
 * (kv/hadamard.h), quantizes each 128-value block of the unit direction to
 * Lloyd-Max indices (kv/lloydmax.h) and stores one fp16 norm-corrected
 * scale per block; attention scores and sums in the rotated domain through
 * the kernels of kv/lowbit.h, rotating only the query and the output.
 *
 *   block: | fp16 d | qs: 128 indices of b bits |   2 + 16·b bytes
 *   u = x/‖x‖ (0 if ‖x‖ <= 1e-10), y = R u, idx_j = nearest(y_j, c/√n),
 *   d = ‖x‖/‖c[idx]‖, x̂ = Rᵀ(d · c[idx]/√n)     (so ‖x̂‖ = ‖x‖ up to fp16)
 *
 * d = 256 is two independent blocks; d = 32, 64 one block of n = d. As in
 * TBQ4_0, d overflows fp16 for block norms above about 65504.
 *
 * Reference: TurboQuant (arXiv 2504.19874) without the QJL stage, in the
 * TBQ4_0 / turbo layout of the public llama.cpp forks (spec kv_schemes.md).
 */
#ifndef KV_TBQ_COMMON_H
#define KV_TBQ_COMMON_H

#include "kv/kv.h"

/* Bits per value of a b-bit tbq stream of head dim d (scale included). */
double tbq_bits(int b, int d);
int tbq_check(const char *scheme, int d, const KVOpts *o, char *err, size_t errlen);
int tbq_init(KVStream *s, int b, char *err, size_t errlen);
void tbq_append(KVStream *s, const float *x);
void tbq_to_domain(const KVStream *s, const float *x, float *y);
void tbq_from_domain(const KVStream *s, const float *y, float *x);

#endif
