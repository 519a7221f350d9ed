/* lm3.c: ManthanQuant, 3-bit Lloyd-Max KV vectors with no rotation.
 *
 * Data flow: append stores the vector's norm and the 3-bit N(0,1) Lloyd-Max
 * index of each coordinate of x·√d/‖x‖; attention scores and sums the codes
 * in place with the kv/lowbit.h kernels (no domain change).
 *
 *   vector: | fp32 r | qs[3d/8]: 8 indices per 24-bit LE word, index k at bits 3k..3k+2 |
 *           4 + 3d/8 bytes (52 B at d = 128, 100 B at d = 256), 3 + 32/d bits
 *   r = ‖x‖, u = x·√d/r, idx_j = nearest(u_j, c), x̂ = (r/√d)·c[idx]
 *
 * Computed as y = x/r against the codebook c/√d, the same rule. d must be a
 * multiple of 32 (the kernels read codes 8 at a time in pairs of groups
 * within 32-value chunks); r <= 1e-10 stores zeros. Follows
 * atcuality2021/manthanquant (spec kv_schemes.md, row lm3).
 */
#include "kv/lowbit.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static double lm3_bits(int d, const KVOpts *o) { (void)o; return 3 + 32.0 / d; }

static int lm3_check(int d, const KVOpts *o, char *err, size_t errlen) {
    if (lb_no_opts(o, "lm3", err, errlen)) return -1;
    if (d % 32 == 0) return 0;
    snprintf(err, errlen, "lm3: head_dim %d not supported (expected a multiple of 32)", d);
    return -1;
}

static int lm3_init(KVStream *s, char *err, size_t errlen) {
    LbFmt f;
    lb_fmt(&f, LB_IDX3, s->d, 1, 4, 0, 1.0f / sqrtf((float)s->d));
    return lb_stream_init(s, &f, sizeof f, err, errlen);
}

static void lm3_append(KVStream *s, const float *x) {
    uint8_t *v = lb_slot(s);
    float y[KV_MAX_DIM];
    double ss = 0;
    for (int j = 0; j < s->d; j++) ss += (double)x[j] * x[j];
    float r = (float)sqrt(ss), inv = r > 1e-10f ? 1.0f / r : 0.0f;
    for (int j = 0; j < s->d; j++) y[j] = x[j] * inv;
    memcpy(v, &r, 4);
    lb_encode(s->aux, y, v + 4);
}

const KVScheme kv_lm3 = {
    .name = "lm3", .desc = "3-bit Lloyd-Max of x/|x|, no rotation (ManthanQuant)",
    .bits = lm3_bits, .check = lm3_check, .init = lm3_init, .free = lb_kv_free,
    .append = lm3_append, .truncate = lb_kv_truncate, .dequant = lb_kv_dequant,
    .score = lb_kv_score, .accum = lb_kv_accum, .bytes = lb_kv_bytes, .span = lb_kv_span, .score_err = 5e-4f,
    .score_int = lb_score_int_ref, .accum_err = 3e-3f,
};
