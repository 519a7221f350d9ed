/* lloydmax.h: the Lloyd-Max scalar codebooks of the rotated KV schemes.
 *
 * Data flow: tbq2/3/4, polar4 and lm3 quantize each coordinate of a unit
 * (rotated) vector to the nearest centroid of an MSE-optimal codebook for
 * N(0,1), scaled by 1/√n for blocks of n coordinates (a coordinate of a
 * random unit vector has variance 1/n). Indices count upwards from the most
 * negative centroid, as in the public TBQ / turbo tables:
 *
 *   4 bits: idx 0 = -2.7326/√n  ...  idx 7 = -0.1284/√n | idx 8 = +0.1284/√n ... idx 15 = +2.7326/√n
 *
 * Centroids from the spec (kv_schemes.md, Codebooks); decision boundaries are
 * the midpoints, so the nearest centroid is the count of midpoints below v.
 */
#ifndef KV_LLOYDMAX_H
#define KV_LLOYDMAX_H

/* N(0,1) centroids for 2, 3 or 4 bits, ascending, 2^bits entries. */
const float *lm_centroids(int bits);
/* cb[2^bits] = centroids · scale; mid[2^bits - 1] = midpoints of cb. */
void lm_codebook(int bits, float scale, float *cb, float *mid);

/* Nearest centroid of a codebook with k entries and midpoints mid[k-1]
 * (ties go to the lower index). */
static inline int lm_nearest(const float *mid, int k, float v) {
    int i = 0;
    for (int m = 0; m < k - 1; m++) i += v > mid[m];
    return i;
}

#endif
