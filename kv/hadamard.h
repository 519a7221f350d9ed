/* hadamard.h: the fast Walsh-Hadamard rotations the rotated KV schemes use.
 *
 * Data flow: tbq2/3/4 rotate each appended K/V vector into the Hadamard
 * domain before quantizing, and attention rotates a query once per head
 * (to_domain) and the output back once per head (from_domain); the per-token
 * score/accumulate loops never transform anything. q4h uses the unsigned
 * variant. A head of d values is cut into blocks of n and each is rotated on
 * its own:
 *
 *   d = 256:  | block 0: x[0..127] | block 1: x[128..255] |   n = 128
 *   d = 128:  | block 0 |                                      n = 128
 *   d = 64, 32:  one block, n = d, the first n signs
 *
 *   signed:   y = s2 ⊙ H(s1 ⊙ x)/√n,   x = s1 ⊙ H(s2 ⊙ y)/√n
 *   unsigned: y = H x/√n (symmetric and orthonormal, so its own inverse)
 *
 * H is the unnormalised Sylvester matrix; s1, s2 the ±1 "seed 42" vectors of
 * the public TBQ4_0 / turbo4 llama.cpp forks (spec kv_schemes.md, rotation
 * section). Every function accepts y == x.
 */
#ifndef KV_HADAMARD_H
#define KV_HADAMARD_H

#include <stddef.h>

/* Longest block; the sign vectors have this many entries. */
#define HAD_MAX_BLOCK 128

/* Block length for head dim d: 128 when d is a multiple of 128, d when d is
 * 32 or 64, and 0 for any other d (refused). */
int had_block(int d);
/* 0 when had_block(d) > 0; else -1 and one line naming the scheme in err. */
int had_check(int d, const char *scheme, char *err, size_t errlen);
/* Entry i (< HAD_MAX_BLOCK) of sign vector s1 (which = 1) or s2 (which = 2). */
int had_sign(int which, int i);
/* In-place unnormalised Walsh-Hadamard transform of x[n], n a power of two. */
void had_fwht(float *x, int n);
/* Signed rotation of x[d] block by block, and its inverse. */
void had_rotate(const float *x, float *y, int d);
void had_unrotate(const float *y, float *x, int d);
/* Unsigned H/√n of x[d] block by block (self-inverse). */
void had_plain(const float *x, float *y, int d);

#endif
