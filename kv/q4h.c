/* q4h.c: llama.cpp q4_0 applied after an unsigned Hadamard rotation, the way
 * upstream llama.cpp now stores every quantized KV type (PR #21038).
 *
 * Data flow: append rotates each 128-value block by H/√n (no sign vectors;
 * n = d for d = 32, 64), then quantizes the rotation in q4_0 blocks of 32;
 * attention rotates the query and the output once (H/√n is its own inverse)
 * and scores / sums the nibbles in place with q4's kernels (kv/q4.h: the
 * rows are the same blocks).
 *
 *   q4_0 block: | fp16 d | qs[16]: value j low nibble of qs[j], j+16 high |   18 B per 32, 4.5 bits
 *   d = (the signed value of max |x|) / -8, q = min(15, (int8)(x/d + 8.5)), x̂ = (q - 8) · d
 *
 * Only the rotation is q4h's own: the block quantizer and the read kernels
 * are kv/q4.c's (kv/q4.h; spec kv_schemes.md, rows q4 and q4h), whose
 * rule is ggml's quantize_row_q4_0_ref (kv/lowbit.c's generic q4_0 read
 * path took 1.6x q4's time at 16K: docs/speed.md).
 */
#include "kv/hadamard.h"
#include "kv/lowbit.h"
#include "kv/q4.h"

static double q4h_bits(int d, const KVOpts *o) { (void)d; (void)o; return 4.5; }

static int q4h_check(int d, const KVOpts *o, char *err, size_t errlen) {
    if (lb_no_opts(o, "q4h", err, errlen)) return -1;
    return had_check(d, "q4h", err, errlen);
}

static int q4h_init(KVStream *s, char *err, size_t errlen) {
    LbFmt f;
    lb_fmt(&f, LB_Q4_0, 32, s->d / 32, 2, 0, 0);
    return lb_stream_init(s, &f, sizeof f, err, errlen);
}

/* Rotate, then q4's quantizer (SIMD where the CPU has it), so q4h's rows
 * are q4's rows of the rotated vector, byte for byte. */
static void q4h_append(KVStream *s, const float *x) {
    float y[KV_MAX_DIM];
    had_plain(x, y, s->d);
    q4_quantize_row(y, s->d, lb_slot(s));
}

static void q4h_domain(const KVStream *s, const float *x, float *y) { had_plain(x, y, s->d); }

const KVScheme kv_q4h = {
    .name = "q4h", .desc = "q4_0 after a Hadamard rotation (llama.cpp PR #21038)",
    .bits = q4h_bits, .check = q4h_check, .init = q4h_init, .free = lb_kv_free,
    .append = q4h_append, .truncate = lb_kv_truncate, .dequant = lb_kv_dequant,
    .to_domain = q4h_domain, .from_domain = q4h_domain,
    .score = q4_kv_score, .accum = q4_kv_accum, .bytes = lb_kv_bytes, .span = lb_kv_span,
    .score_err = 5e-3f, .score_int = q4_score_int,
};
