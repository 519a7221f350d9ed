/* lowbit.h: packed low-bit KV vectors, read in place by score/accumulate.
 *
 * Data flow: a scheme (tbq2/3/4, polar4, lm3, q4h) turns an appended vector
 * into codes in its own domain and writes one stored vector per position;
 * attention then calls the kernels here, which decode 8 codes at a time in
 * registers and use them for all query heads of the group, so a cached
 * position's bytes are read once per call and never widened into a buffer.
 *
 * A stored vector is nb blocks of n values, each block a scale then codes:
 *
 *   | scale (fp16 or fp32) | codes of n values | scale | codes | ...   nb blocks
 *
 *   LB_IDX2/3/4  codes = Lloyd-Max indices, value = scale · cb[idx]
 *                (renorm: scale = stored / ‖cb[idx]‖ over the block)
 *     4 bits  qs[j/2] = idx[j] | idx[j+1] << 4
 *     3 bits  8 indices per 24-bit little-endian word, index k at bits 3k..3k+2
 *     2 bits  4 per byte, index k at bits 2k..2k+1
 *   LB_Q4_0      llama.cpp q4_0: n = 32, fp16 d, qs[16], value j in the low
 *                nibble of qs[j], j+16 in the high one; value = (q − 8) · d
 */
#ifndef KV_LOWBIT_H
#define KV_LOWBIT_H

#include <stddef.h>
#include <stdint.h>

#include "kv/kv.h"

typedef enum { LB_IDX2 = 2, LB_IDX3 = 3, LB_IDX4 = 4, LB_Q4_0 = 8 } LbKind;

/* How one stream's vectors are laid out; kept in the stream's aux (schemes
 * with more state put an LbFmt first in their aux struct). */
typedef struct {
    int kind;      /* LbKind */
    int n;         /* values per block (32 for LB_Q4_0) */
    int nb;        /* blocks per vector: d = n · nb */
    int hdr;       /* bytes of scale before each block's codes: 2 = fp16, 4 = fp32 */
    int renorm;    /* 1: effective scale = stored scale / ‖cb[idx]‖ (polar4) */
    int blk_bytes; /* hdr + code bytes */
    int vec_bytes; /* nb · blk_bytes, the stride between positions */
    float cb[16];  /* codebook, already scaled to the block */
    float mid[15]; /* its decision boundaries */
    /* Index codebooks as the VNNI scores read them: cb8[i] = round(cb[i] ·
     * cb8_s) + 128, cb8_s = 127 / max|cb|, repeating every 2^kind entries
     * (vpermb's 6-bit lookups, lowbit.c) */
    uint8_t cb8[64];
    float cb8_s;
    /* and as the integer sums read them: cb16[i] = round(cb[i] · cb16_s),
     * cb16_s = 1023 / max|cb| (cb16_d = its inverse), repeating likewise */
    int16_t cb16[32];
    float cb16_s, cb16_d;
    /* and their squares, for polar4's norm ‖cb[idx]‖² in the integer paths:
     * sq14[i] = round(cb[i]² · 16383 / max cb²) = sq_lo[i] + 64 · sq_hi[i]
     * (6 + 8 bits, so vpdpbusd sums each half with weights 1 and 64);
     * ‖cb[idx]‖² ≈ Σ sq14[idx] · sq_d, sq_d = max cb² / 16383 */
    uint8_t sq_lo[16], sq_hi[16];
    float sq_d;
} LbFmt;

/* Fills f; cb_scale multiplies the N(0,1) Lloyd-Max table (unused for q4_0). */
void lb_fmt(LbFmt *f, int kind, int n, int nb, int hdr, int renorm, float cb_scale);
/* Index j of a block's packed codes, for 2, 3 or 4 bits. */
int lb_code(const uint8_t *qs, int bits, int j);
/* Quantizes y[n] to the nearest centroids, writes the packed codes to qs and
 * returns ‖cb[idx]‖ (what the norm correction divides by). */
float lb_encode(const LbFmt *f, const float *y, uint8_t *qs);
/* One stored vector back to floats in the scheme's domain, out[n · nb]. */
void lb_dequant(const LbFmt *f, const uint8_t *vec, float *out);

/* KVScheme glue for streams whose data is cap · vec_bytes and whose aux
 * starts with an LbFmt. lb_stream_init allocates both (aux_bytes >=
 * sizeof(LbFmt), zeroed beyond the copy of f). */
int lb_stream_init(KVStream *s, const LbFmt *f, size_t aux_bytes, char *err, size_t errlen);
/* Where append writes position s->len. */
uint8_t *lb_slot(KVStream *s);
/* 0 when no g/r option is set; else -1 and a line naming the scheme. */
int lb_no_opts(const KVOpts *o, const char *scheme, char *err, size_t errlen);
void lb_kv_free(KVStream *s);
void lb_kv_truncate(KVStream *s, int n);
void lb_kv_dequant(const KVStream *s, int t, float *out);
/* Fast paths (AVX2 when kernels_level() > 0, else the kv.c reference). */
void lb_kv_score(const KVStream *s, const float *q, int nq, int t0, int t1, float *out, int ldo);
void lb_kv_accum(const KVStream *s, const float *p, int ldp, int nq, int t0, int t1, float *acc);
size_t lb_kv_bytes(const KVStream *s);
size_t lb_kv_span(const KVStream *s, int t);

/* The integer scores lb_kv_score gives at kernels_level() >= 3, in plain C
 * with the same rounding: 0, or -1 when the stream or the queries do not
 * take that path. It needs d = 128 in one block and finite queries, and
 * 4-bit codes, or 3 and 2 bits when the kernels run at avx512vnni on a CPU
 * with VBMI (kernels_has_vbmi()); tbq (fp16 scale) and polar4 (fp32 γ and
 * its renorm, whose ‖cb[idx]‖² is then the integer Σ sq14[idx] above)
 * score queries rounded to bytes, lm3 (fp32 norm, 3 bits) to 14-bit words.
 * Tests hold the VNNI kernels to it bit for bit. */
int lb_score_int_ref(const KVStream *s, const float *q, int nq, int t0, int t1, float *out, int ldo);

#endif
