/* q4.h: the q4_0 quantizer, score and accumulate kernels of kv/q4.c,
 * which q4h (kv/q4h.c) shares: both store rows of d / 32 q4_0 blocks per position,
 * q4h after a Hadamard rotation (its queries arrive rotated).
 *
 *   row: | fp16 d | qs[16] | × d / 32      (kv/q4.c's header has the rule)
 *
 * Same contract as KVScheme.score / .accum (kv/kv.h), for any stream
 * whose data is such rows, cap · d / 32 · 18 bytes.
 */
#ifndef KV_Q4_H
#define KV_Q4_H

#include "kv/kv.h"

/* One position's row of d / 32 blocks (d % 32 == 0), with the SIMD
 * quantizer where the CPU has one: the bytes of ggml's rule either way. */
void q4_quantize_row(const float *x, int d, uint8_t *row);
void q4_kv_score(const KVStream *s, const float *q, int nq, int t0, int t1, float *out, int ldo);
void q4_kv_accum(const KVStream *s, const float *p, int ldp, int nq, int t0, int t1, float *acc);
/* KVScheme.score_int: the integer scores q4_kv_score gives at avx512vnni
 * and dotprod (d = 128, finite queries; else -1), in plain C with the same
 * rounding. */
int q4_score_int(const KVStream *s, const float *q, int nq, int t0, int t1, float *out, int ldo);

#endif
