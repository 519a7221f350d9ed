/* tbq4.c: 4-bit TurboQuant KV blocks. Each 128 values of a head are
 * rotated by the signed Hadamard transform, their unit direction is
 * quantized to 4-bit Lloyd-Max indices and one norm-corrected fp16 scale is
 * kept; attention scores and sums in the rotated domain (tbq_common.h),
 * with AVX-512 VNNI as integer dot products (lowbit.c).
 *
 * Data flow: as every tbq scheme: appends through tbq_common.c (rotate,
 * normalise, code), attention through kv/lowbit.c's kernels (and
 * kv/pairs16.h's integer sums).
 *
 *   | fp16 d | qs[64]: qs[j/2] = idx[j] | idx[j+1] << 4 |   66 B per 128 values, 4.125 bits
 *
 * Byte-compatible with TBQ4_0 / turbo4_0 of the public llama.cpp forks
 * (Indras-Mirror/llama.cpp-mtp, spiritbuun), spec kv_schemes.md row tbq4.
 */
#include "kv/lowbit.h"
#include "kv/tbq_common.h"

static double tbq4_bits(int d, const KVOpts *o) { (void)o; return tbq_bits(4, d); }
static int tbq4_check(int d, const KVOpts *o, char *err, size_t errlen) {
    return tbq_check("tbq4", d, o, err, errlen);
}
static int tbq4_init(KVStream *s, char *err, size_t errlen) { return tbq_init(s, 4, err, errlen); }

const KVScheme kv_tbq4 = {
    .name = "tbq4", .desc = "4-bit Lloyd-Max after a Hadamard rotation (66 B / 128)",
    .bits = tbq4_bits, .check = tbq4_check, .init = tbq4_init, .free = lb_kv_free,
    .append = tbq_append, .truncate = lb_kv_truncate, .dequant = lb_kv_dequant,
    .to_domain = tbq_to_domain, .from_domain = tbq_from_domain,
    .score = lb_kv_score, .accum = lb_kv_accum, .bytes = lb_kv_bytes, .span = lb_kv_span, .score_err = 5e-3f,
    .score_int = lb_score_int_ref, .accum_err = 2e-3f,
};
