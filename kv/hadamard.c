/* hadamard.c: blockwise fast Walsh-Hadamard rotations (see hadamard.h).
 *
 * Plain C on purpose: a rotation runs once per appended vector and once per
 * query / output head, never per cached token, and a 128-point butterfly is
 * 448 adds that the compiler vectorizes anyway.
 */
#include "kv/hadamard.h"
#include "kv/kv.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* sign[i] = bit (i % 32) of mask[i / 32] ? -1 : +1 (spec, rotation section). */
static const uint32_t s1_mask[4] = {0xE46A0359u, 0x42F85949u, 0xA4C63BBBu, 0x49F250A9u};
static const uint32_t s2_mask[4] = {0x16ACEE90u, 0x3F628FDCu, 0xB7A5357Au, 0xBEA56562u};

int had_block(int d) {
    if (d == 32 || d == 64) return d;
    if (d >= HAD_MAX_BLOCK && d % HAD_MAX_BLOCK == 0 && d <= KV_MAX_DIM) return HAD_MAX_BLOCK;
    return 0;
}

int had_check(int d, const char *scheme, char *err, size_t errlen) {
    if (had_block(d)) return 0;
    snprintf(err, errlen, "%s: head_dim %d not supported (expected 32, 64 or a multiple of 128 up to %d)", scheme, d,
             KV_MAX_DIM);
    return -1;
}

int had_sign(int which, int i) {
    const uint32_t *m = which == 1 ? s1_mask : s2_mask;
    return (m[i / 32] >> (i % 32)) & 1 ? -1 : 1;
}

/* Sylvester order: stage h pairs (a, b) = (x[j], x[j+h]) -> (a+b, a-b). */
void had_fwht(float *x, int n) {
    for (int h = 1; h < n; h *= 2)
        for (int i = 0; i < n; i += 2 * h)
            for (int j = i; j < i + h; j++) {
                float a = x[j], b = x[j + h];
                x[j] = a + b;
                x[j + h] = a - b;
            }
}

/* One block: y = post ⊙ H(pre ⊙ x)/√n, with pre/post = 0 meaning no signs. */
static void block(const float *x, float *y, int n, int pre, int post) {
    float t[HAD_MAX_BLOCK];
    const float inv = 1.0f / sqrtf((float)n);
    for (int j = 0; j < n; j++) t[j] = pre ? (float)had_sign(pre, j) * x[j] : x[j];
    had_fwht(t, n);
    for (int j = 0; j < n; j++) y[j] = (post ? (float)had_sign(post, j) : 1.0f) * t[j] * inv;
}

/* Blocks are independent; t[] inside block() makes y == x safe. */
static void blocks(const float *x, float *y, int d, int pre, int post) {
    const int n = had_block(d);
    for (int b = 0; b < d; b += n) block(x + b, y + b, n, pre, post);
}

void had_rotate(const float *x, float *y, int d) { blocks(x, y, d, 1, 2); }
void had_unrotate(const float *y, float *x, int d) { blocks(y, x, d, 2, 1); }
void had_plain(const float *x, float *y, int d) { blocks(x, y, d, 0, 0); }
