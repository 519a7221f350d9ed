/* tile512.h: AVX-512 attention loops for the KV schemes whose cached values
 * widen to floats 32 at a time (f16, q4), included by those schemes'
 * files.
 *
 * Data flow: attn_group -> kv_score / kv_accum -> scheme -> these loops; the
 * scheme passes its widening function W(s, t, j, &lo, &hi), which returns
 * values j..j+31 of position t as dequantized floats (a constant pointer
 * into always_inline loops, which GCC inlines at -O2 and up, so the loops
 * compile once per scheme with the widening in registers; 32 at a time so
 * that q4 converts one block scale per call).
 *
 *   score:  out[i][t] = q_i . k_t      tiles of 4 positions x up to 4 heads:
 *           each widened key vector feeds every head, 16-lane partial
 *           sums, then four horizontal sums at once
 *   accum:  acc_i += p_i,t v_t         2 heads x 128 values (or 4 x 64)
 *           kept in 16 registers across the whole position range, so acc
 *           is read and written once per call instead of once per position
 *
 * Each dot product and each accumulator sees its terms in the same order
 * whatever tile it falls in, so results do not depend on the range split.
 */
#ifndef KV_TILE512_H
#define KV_TILE512_H

#if defined(__x86_64__) /* x86 kernels: the includer's x86 region uses them, other CPUs never */

#include "kernels/hsum.h"
#include "kv/kv.h"

#include <immintrin.h>

#define TILE512 __attribute__((target("avx512f,avx512dq,f16c"), always_inline)) static inline

/* Values j..j+31 of position t as two vectors, lo = j..j+15, hi = the rest. */
typedef void (*Widen32)(const KVStream *s, int t, int j, __m512 *lo, __m512 *hi);

/* Positions are rows of rb bytes from s->data. The loops prefetch the row
 * TILE_AHEAD positions ahead: the K and V streams alternate every chunk of
 * 128 positions, which the hardware prefetcher alone does not follow well
 * enough to keep a thread near the bandwidth of a plain read
 * (docs/kernel-notes.md#tile512-prefetch). */
#define TILE_AHEAD 16

TILE512 void tile_prefetch(const KVStream *s, size_t rb, int t) {
    const char *r = (const char *)s->data + (size_t)(t + TILE_AHEAD) * rb;
    for (size_t b = 0; b < rb; b += 64) _mm_prefetch(r + b, _MM_HINT_T0);
}

/* R positions from t x NH heads: out[i * ldo + t - t0]. */
TILE512 void tile_score(const KVStream *s, Widen32 w, const float *q, int t, int t0, const int R, const int NH,
                        float *out, int ldo) {
    const int d = s->d;
    __m512 acc[4][4];
    for (int r = 0; r < R; r++)
        for (int i = 0; i < NH; i++) acc[r][i] = _mm512_setzero_ps();
    for (int j = 0; j < d; j += 32) {
        __m512 ql[4], qh[4];
        for (int i = 0; i < NH; i++) {
            ql[i] = _mm512_loadu_ps(q + (size_t)i * d + j);
            qh[i] = _mm512_loadu_ps(q + (size_t)i * d + j + 16);
        }
        for (int r = 0; r < R; r++) {
            __m512 lo, hi;
            w(s, t + r, j, &lo, &hi);
            for (int i = 0; i < NH; i++) {
                acc[r][i] = _mm512_fmadd_ps(lo, ql[i], acc[r][i]);
                acc[r][i] = _mm512_fmadd_ps(hi, qh[i], acc[r][i]);
            }
        }
    }
    const __m512 z = _mm512_setzero_ps();
    for (int i = 0; i < NH; i++) {
        float v[4];
        _mm_storeu_ps(v, hsum4_512(acc[0][i], R > 1 ? acc[1][i] : z, R > 2 ? acc[2][i] : z, R > 3 ? acc[3][i] : z));
        for (int r = 0; r < R; r++) out[(size_t)i * ldo + (t + r - t0)] = v[r];
    }
}

TILE512 void tile_score_heads(const KVStream *s, Widen32 w, size_t rb, const float *q, const int NH, int t0, int t1,
                              float *out, int ldo) {
    int t = t0;
    for (; t + 4 <= t1; t += 4) {
        for (int r = 0; r < 4; r++) tile_prefetch(s, rb, t + r);
        tile_score(s, w, q, t, t0, 4, NH, out, ldo);
    }
    for (; t < t1; t++) tile_score(s, w, q, t, t0, 1, NH, out, ldo);
}

/* kv_score for d % 32 == 0: heads four at a time. */
TILE512 void tile_score_all(const KVStream *s, Widen32 w, size_t rb, const float *q, int nq, int t0, int t1,
                            float *out, int ldo) {
    for (int i0 = 0; i0 < nq; i0 += 4) {
        const float *qh = q + (size_t)i0 * s->d;
        float *o = out + (size_t)i0 * ldo;
        switch (nq - i0 < 4 ? nq - i0 : 4) {
        case 1: tile_score_heads(s, w, rb, qh, 1, t0, t1, o, ldo); break;
        case 2: tile_score_heads(s, w, rb, qh, 2, t0, t1, o, ldo); break;
        case 3: tile_score_heads(s, w, rb, qh, 3, t0, t1, o, ldo); break;
        default: tile_score_heads(s, w, rb, qh, 4, t0, t1, o, ldo); break;
        }
    }
}

/* NH heads' values j0..j0+W-1 held in registers over positions [t0, t1):
 * 2 heads x 128 values, or 4 heads x 64, whose widened values each feed
 * twice the FMAs (prefill's blocks of queries). Each sum is the same fma
 * chain over t either way. */
TILE512 void tile_accum(const KVStream *s, Widen32 w, size_t rb, const float *p, int ldp, const int NH, const int W,
                        int j0, int t0, int t1, float *acc) {
    const int d = s->d;
    __m512 a[4][8];
    for (int i = 0; i < NH; i++)
        for (int v = 0; v < W / 16; v++) a[i][v] = _mm512_loadu_ps(acc + (size_t)i * d + j0 + 16 * v);
    for (int t = t0; t < t1; t++) {
        __m512 pv[4];
        if (j0 == 0) tile_prefetch(s, rb, t);
        for (int i = 0; i < NH; i++) pv[i] = _mm512_set1_ps(p[(size_t)i * ldp + (t - t0)]);
        for (int v = 0; v < W / 16; v += 2) {
            __m512 lo, hi;
            w(s, t, j0 + 16 * v, &lo, &hi);
            for (int i = 0; i < NH; i++) {
                a[i][v] = _mm512_fmadd_ps(pv[i], lo, a[i][v]);
                a[i][v + 1] = _mm512_fmadd_ps(pv[i], hi, a[i][v + 1]);
            }
        }
    }
    for (int i = 0; i < NH; i++)
        for (int v = 0; v < W / 16; v++) _mm512_storeu_ps(acc + (size_t)i * d + j0 + 16 * v, a[i][v]);
}

/* kv_accum for d % 128 == 0: heads four at a time, 64 values at a time,
 * then the rest two (or one) at a time, 128 values at a time. */
TILE512 void tile_accum_all(const KVStream *s, Widen32 w, size_t rb, const float *p, int ldp, int nq, int t0, int t1,
                            float *acc) {
    int i0 = 0;
    for (; i0 + 4 <= nq; i0 += 4)
        for (int j0 = 0; j0 < s->d; j0 += 64)
            tile_accum(s, w, rb, p + (size_t)i0 * ldp, ldp, 4, 64, j0, t0, t1, acc + (size_t)i0 * s->d);
    for (; i0 < nq; i0 += 2)
        for (int j0 = 0; j0 < s->d; j0 += 128) {
            const float *ph = p + (size_t)i0 * ldp;
            float *ah = acc + (size_t)i0 * s->d;
            if (nq - i0 >= 2) tile_accum(s, w, rb, ph, ldp, 2, 128, j0, t0, t1, ah);
            else tile_accum(s, w, rb, ph, ldp, 1, 128, j0, t0, t1, ah);
        }
}

/* The two entry points a scheme's file needs, score512 and accum512, over
 * its widening function W and row size RB (an expression in s). */
#define TILE512_KERNELS(W, RB)                                                                                      \
    __attribute__((target("avx512f,avx512dq,f16c"))) static void score512(const KVStream *s, const float *q, int nq, \
                                                                          int t0, int t1, float *out, int ldo) {    \
        tile_score_all(s, W, RB, q, nq, t0, t1, out, ldo);                                                           \
    }                                                                                                                \
    __attribute__((target("avx512f,avx512dq,f16c"))) static void accum512(const KVStream *s, const float *p, int ldp, \
                                                                          int nq, int t0, int t1, float *acc) {     \
        tile_accum_all(s, W, RB, p, ldp, nq, t0, t1, acc);                                                           \
    }

#endif /* __x86_64__ */

#endif
