/* lloydmax.c: Lloyd-Max N(0,1) codebooks (see lloydmax.h).
 *
 * Data flow: lb_fmt (kv/lowbit.c) scales a table here to its block size
 * when a tbq, polar4 or lm3 stream opens; lb_encode then codes each value
 * as its nearest centroid, and the kernels decode through the same table:
 *
 *   c4: -2.7326 .. -0.1284 | +0.1284 .. +2.7326   (16 ascending, idx 0..15)
 *
 * The positive halves are the spec's tables (kv_schemes.md, Codebooks); the
 * negative halves mirror them. Not the "TheTom-4" 4-bit table nor the Indras
 * TBQ3 one, which the spec measured at 2.1x and +45% error.
 */
#include "kv/lloydmax.h"

static const float c2[4] = {-1.5104f, -0.4528f, 0.4528f, 1.5104f};
static const float c3[8] = {-2.1520f, -1.3440f, -0.7560f, -0.2451f, 0.2451f, 0.7560f, 1.3440f, 2.1520f};
static const float c4[16] = {-2.7326f, -2.0690f, -1.6181f, -1.2562f, -0.9424f, -0.6568f, -0.3881f, -0.1284f,
                             0.1284f,  0.3881f,  0.6568f,  0.9424f,  1.2562f,  1.6181f,  2.0690f,  2.7326f};

const float *lm_centroids(int bits) { return bits == 2 ? c2 : bits == 3 ? c3 : c4; }

void lm_codebook(int bits, float scale, float *cb, float *mid) {
    const float *c = lm_centroids(bits);
    const int k = 1 << bits;
    for (int i = 0; i < k; i++) cb[i] = c[i] * scale;
    for (int i = 0; i + 1 < k; i++) mid[i] = 0.5f * (cb[i] + cb[i + 1]);
}
