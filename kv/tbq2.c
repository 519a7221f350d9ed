/* tbq2.c: 2-bit TurboQuant KV blocks: the tbq4 rule (tbq_common.h) with
 * the spec's 2-bit Lloyd-Max table.
 *
 * Data flow: as every tbq scheme: appends through tbq_common.c (rotate,
 * normalise, code), attention through kv/lowbit.c's kernels.
 *
 *   | fp16 d | qs[32]: 4 indices per byte, index k at bits 2k..2k+1 |   34 B per 128, 2.125 bits
 *
 * turbo2 of the public llama.cpp forks, spec kv_schemes.md row tbq2.
 */
#include "kv/lowbit.h"
#include "kv/tbq_common.h"

static double tbq2_bits(int d, const KVOpts *o) { (void)o; return tbq_bits(2, d); }
static int tbq2_check(int d, const KVOpts *o, char *err, size_t errlen) {
    return tbq_check("tbq2", d, o, err, errlen);
}
static int tbq2_init(KVStream *s, char *err, size_t errlen) { return tbq_init(s, 2, err, errlen); }

const KVScheme kv_tbq2 = {
    .name = "tbq2", .desc = "2-bit Lloyd-Max after a Hadamard rotation (34 B / 128)",
    .bits = tbq2_bits, .check = tbq2_check, .init = tbq2_init, .free = lb_kv_free,
    .append = tbq_append, .truncate = lb_kv_truncate, .dequant = lb_kv_dequant,
    .to_domain = tbq_to_domain, .from_domain = tbq_from_domain,
    .score = lb_kv_score, .accum = lb_kv_accum, .bytes = lb_kv_bytes, .span = lb_kv_span, .score_err = 5e-3f,
    .score_int = lb_score_int_ref, .accum_err = 2e-3f,
};
