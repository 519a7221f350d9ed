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
 * The block code is written out here (spec kv_schemes.md, rows q4 and q4h)
 * rather than shared with kv/q4.c, so that each append reads on its own;
 * the read kernels are shared (kv/lowbit.c's generic q4_0 path took 1.6x
 * q4's time at 16K: docs/speed.md).
 */
#include "kernels/half.h"
#include "kv/hadamard.h"
#include "kv/lowbit.h"
#include "kv/q4.h"

#include <math.h>
#include <string.h>

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

/* llama.cpp quantize_row_q4_0_ref: the largest magnitude maps to code 0, so
 * the scale keeps its sign; the inverse uses the unrounded d. */
static void q4_0_block(const float *x, uint8_t *blk) {
    float amax = 0, max = 0;
    for (int j = 0; j < 32; j++)
        if (amax < fabsf(x[j])) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    const float d = max / -8, id = d != 0 ? 1.0f / d : 0.0f;
    uint16_t h = f32_to_f16(d);
    memcpy(blk, &h, 2);
    for (int j = 0; j < 16; j++) {
        int8_t a = (int8_t)(x[j] * id + 8.5f), b = (int8_t)(x[j + 16] * id + 8.5f);
        blk[2 + j] = (uint8_t)((a < 15 ? a : 15) | (b < 15 ? b : 15) << 4);
    }
}

static void q4h_append(KVStream *s, const float *x) {
    float y[KV_MAX_DIM];
    uint8_t *blk = lb_slot(s);
    had_plain(x, y, s->d);
    for (int j = 0; j < s->d; j += 32, blk += 18) q4_0_block(y + j, blk);
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
