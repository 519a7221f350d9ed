/* tbq_common.c: rotation, norm correction and stream set-up shared by
 * tbq2/3/4 (format and rule in tbq_common.h).
 *
 * Data flow: kv_stream_append -> tbq_append here: x [d] rotated by
 * kv/hadamard.c, each block of n = 128 normalised, coded by lb_encode
 * (kv/lowbit.c) and given its norm-corrected scale; attention then reads the
 * blocks through kv/lowbit.c's kernels in the rotated domain (tbq_to_domain
 * and tbq_from_domain rotate the query and the output once per call).
 *
 *   block: | fp16 d | qs: n indices of b bits |   2 + n·b/8 bytes, d = ‖x‖/‖c[idx]‖
 *
 * Reference: TurboQuant (arXiv 2504.19874) without the QJL stage, in the
 * TBQ4_0 / turbo layout of the public llama.cpp forks (spec kv_schemes.md).
 */
#include "kv/tbq_common.h"
#include "kernels/half.h"
#include "kv/hadamard.h"
#include "kv/lowbit.h"

#include <math.h>
#include <string.h>

double tbq_bits(int b, int d) {
    int n = had_block(d) ? had_block(d) : 128;
    return (2 + n * b / 8) * 8.0 / n;
}

int tbq_check(const char *scheme, int d, const KVOpts *o, char *err, size_t errlen) {
    if (lb_no_opts(o, scheme, err, errlen)) return -1;
    return had_check(d, scheme, err, errlen);
}

/* Codebook scaled by 1/√n: a coordinate of a rotated unit vector has variance 1/n. */
int tbq_init(KVStream *s, int b, char *err, size_t errlen) {
    LbFmt f;
    const int n = had_block(s->d);
    lb_fmt(&f, b, n, s->d / n, 2, 0, 1.0f / sqrtf((float)n));
    return lb_stream_init(s, &f, sizeof f, err, errlen);
}

/* R(x/‖x‖) = (R x)/‖x‖: rotate once, then normalise each block. */
void tbq_append(KVStream *s, const float *x) {
    const LbFmt *f = s->aux;
    uint8_t *blk = lb_slot(s);
    float y[KV_MAX_DIM];
    had_rotate(x, y, s->d);
    for (int b = 0; b < f->nb; b++, blk += f->blk_bytes) {
        const float *xb = x + b * f->n;
        float *yb = y + b * f->n;
        double ss = 0;
        for (int j = 0; j < f->n; j++) ss += (double)xb[j] * xb[j];
        float norm = (float)sqrt(ss), inv = norm > 1e-10f ? 1.0f / norm : 0.0f;
        for (int j = 0; j < f->n; j++) yb[j] *= inv;
        /* ‖c[idx]‖ > 0: no centroid is zero */
        uint16_t d = f32_to_f16(norm / lb_encode(f, yb, blk + 2));
        memcpy(blk, &d, 2);
    }
}

void tbq_to_domain(const KVStream *s, const float *x, float *y) { had_rotate(x, y, s->d); }
void tbq_from_domain(const KVStream *s, const float *y, float *x) { had_unrotate(y, x, s->d); }
