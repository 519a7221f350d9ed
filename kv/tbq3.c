/* tbq3.c: 3-bit TurboQuant KV blocks: the tbq4 rule (tbq_common.h) with
 * the spec's 3-bit Lloyd-Max table.
 *
 * Data flow: as every tbq scheme: appends through tbq_common.c (rotate,
 * normalise, code), attention through kv/lowbit.c's kernels.
 *
 *   | fp16 d | qs[48]: 8 indices per 24-bit LE word, index k at bits 3k..3k+2 |   50 B per 128, 3.125 bits
 *
 * The layout of the public TBQ3_0, with a correct codebook in place of the
 * Indras one (+45% error), spec kv_schemes.md row tbq3.
 */
#include "kv/lowbit.h"
#include "kv/tbq_common.h"

static double tbq3_bits(int d, const KVOpts *o) { (void)o; return tbq_bits(3, d); }
static int tbq3_check(int d, const KVOpts *o, char *err, size_t errlen) {
    return tbq_check("tbq3", d, o, err, errlen);
}
static int tbq3_init(KVStream *s, char *err, size_t errlen) { return tbq_init(s, 3, err, errlen); }

const KVScheme kv_tbq3 = {
    .name = "tbq3", .desc = "3-bit Lloyd-Max after a Hadamard rotation (50 B / 128)",
    .bits = tbq3_bits, .check = tbq3_check, .init = tbq3_init, .free = lb_kv_free,
    .append = tbq_append, .truncate = lb_kv_truncate, .dequant = lb_kv_dequant,
    .to_domain = tbq_to_domain, .from_domain = tbq_from_domain,
    .score = lb_kv_score, .accum = lb_kv_accum, .bytes = lb_kv_bytes, .span = lb_kv_span, .score_err = 5e-3f,
    .score_int = lb_score_int_ref, .accum_err = 3e-3f,
};
