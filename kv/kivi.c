/* kivi.c: KIVI (Liu et al. 2024, arXiv 2402.02750; reference code
 * jy-yuan/KIVI), 2- or 4-bit asymmetric quantization with keys grouped per
 * channel over G tokens, values grouped per token over G channels, and the
 * newest tokens kept in full precision.
 *
 * Data flow: kv_stream_append writes each vector into a float ring; a K
 * stream (s->role 0) quantizes its window R tokens at a time, a V stream
 * (role 1) quantizes the token that falls out of its R-token FIFO.
 * Attention reads [quantized | window] through kivi_score (K, zero point
 * factored out per group) and kivi_accum (V, zero point summed per group):
 * AVX-512 kernels for head dims 128 and 256 (V: groups of 16 channels or
 * a multiple), else AVX2 (K scores in integers at head dim 128), else
 * plain C; NEON ones on aarch64. The quantizers run 8 groups a step on
 * AVX2 (4 on NEON), to plain C's bytes.
 *
 * Per group: s = (max - min) / (2^b - 1), z = min, both fp16;
 * code = round(clamp((x - z) / s, 0, 2^b - 1)) with the fp16 s and z
 * (code 0 when s = 0, so constant input comes back as z, exactly when it is
 * an fp16 value); x̂ = code·s + z.
 * A row packs d codes little-endian, code c at bit c·b: b = 4, even c in the
 * low nibble of byte c/2; b = 2, byte c/4 holds c..c+3 at bits 0,2,4,6.
 *
 *   K block (G tokens): | fp16 s[d] | fp16 z[d] | row tok 0 | ... | row tok G-1 |
 *   V token:            | fp16 s[d/G] | fp16 z[d/G] | row |
 *   ring (f32, both):   | x[d] slot 0 | ... | x[d] slot RING-1 |, token t in slot t % RING
 *
 * Both layouts take 4d/G + d·b/8 bytes per position; storage is sized for
 * cap positions. Quantized counts follow from len alone:
 *   K: the first len - len % R tokens (the window flushes all R at once),
 *   V: the first max(0, len - R) tokens (oldest out when the FIFO hits R + 1).
 * The ring holds the last RING = min(cap, R + KV_MAX_ROLLBACK) tokens in
 * f32: the R-token window plus a 64-token shadow, enough for any rollback to
 * n >= len - 64 to find its new window in full precision (K: from
 * n - n % R >= len - 64 - R + 1; V: from n - R). Truncation is therefore
 * bookkeeping, and re-appended tokens are requantized from the same floats,
 * bit for bit. The shadow costs 64·d·4 bytes per stream (32 KiB at d = 128)
 * and is counted in bytes(), with the window.
 */
#include "kernels/half.h"
#include "kernels/matmul.h"
#include "kernels/vec.h"
#include "kv/kv.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KIVI_G 32  /* default group length (paper: 32) */
#define KIVI_R 128 /* default residual window (paper: 128) */
/* Context over which bits() amortises the f32 ring, so that the table's
 * number equals bytes()/cap at cap = 4096. */
#define KIVI_BITS_CTX 4096
/* Query heads handled per pass over the cache (scratch on the stack). */
#define HEADS 8

typedef struct {
    int b;        /* bits per code: 2 or 4 */
    int G, R;     /* group length, residual window */
    int ring_n;   /* slots in the ring */
    size_t row;   /* bytes of one packed row of d codes */
    size_t unit;  /* bytes of one K block (G tokens) or one V token */
    float *ring;  /* [ring_n][d] full-precision tokens */
} Kivi;

static int group_of(const KVOpts *o) { return o->group ? o->group : KIVI_G; }
static int resid_of(const KVOpts *o) { return o->residual ? o->residual : KIVI_R; }

static double bits_for(int b, int d, const KVOpts *o) {
    int G = group_of(o), R = resid_of(o);
    (void)d;
    return b + 32.0 / G + 32.0 * (R + KV_MAX_ROLLBACK) / KIVI_BITS_CTX;
}
static double kivi2_bits(int d, const KVOpts *o) { return bits_for(2, d, o); }
static double kivi4_bits(int d, const KVOpts *o) { return bits_for(4, d, o); }

static int kivi_check(int d, const KVOpts *o, char *err, size_t errlen) {
    int G = group_of(o), R = resid_of(o);
    if (G > R || R % G) {
        snprintf(err, errlen, "kivi: residual R must be a multiple of group G (G <= R), found g%d:r%d", G, R);
        return -1;
    }
    if (d % G) {
        snprintf(err, errlen, "kivi: head_dim must be a multiple of group G for per-token V groups, found d=%d g%d", d,
                 G);
        return -1;
    }
    return 0;
}

static void kivi_free(KVStream *s) {
    Kivi *k = s->aux;
    if (k) free(k->ring);
    free(k);
    free(s->data);
}

/* Storage units for cap positions: K blocks of G tokens, or V tokens. */
static size_t n_units(const KVStream *s, int G) {
    return s->role == 0 ? (size_t)(s->cap + G - 1) / G : (size_t)s->cap;
}

static int init_bits(KVStream *s, int b, char *err, size_t errlen) {
    Kivi *k = calloc(1, sizeof *k);
    if (!k) { snprintf(err, errlen, "kivi: out of memory"); return -1; }
    k->b = b;
    k->G = group_of(&s->opts);
    k->R = resid_of(&s->opts);
    k->ring_n = s->cap < k->R + KV_MAX_ROLLBACK ? s->cap : k->R + KV_MAX_ROLLBACK;
    k->row = ((size_t)s->d * b + 7) / 8;
    /* K: scales and zeros per channel, then G rows; V: per group, then one row */
    k->unit = s->role == 0 ? 4 * (size_t)s->d + (size_t)k->G * k->row : 4 * (size_t)(s->d / k->G) + k->row;
    s->aux = k;
    s->data = calloc(n_units(s, k->G), k->unit);
    k->ring = malloc((size_t)k->ring_n * s->d * sizeof(float));
    if (!s->data || !k->ring) {
        snprintf(err, errlen, "kivi: out of memory for %d positions", s->cap);
        kivi_free(s);
        s->aux = NULL;
        s->data = NULL;
        return -1;
    }
    return 0;
}
static int kivi2_init(KVStream *s, char *err, size_t errlen) { return init_bits(s, 2, err, errlen); }
static int kivi4_init(KVStream *s, char *err, size_t errlen) { return init_bits(s, 4, err, errlen); }

static size_t kivi_bytes(const KVStream *s) {
    const Kivi *k = s->aux;
    return n_units(s, k->G) * k->unit + (size_t)k->ring_n * s->d * sizeof(float);
}

/* Positions held quantized when len are stored (the rest are in the ring). */
static int n_quant(const KVStream *s, int len) {
    const Kivi *k = s->aux;
    if (s->role == 0) return len - len % k->R;
    return len > k->R ? len - k->R : 0;
}

static float *slot(const KVStream *s, int t) {
    const Kivi *k = s->aux;
    return k->ring + (size_t)(t % k->ring_n) * s->d;
}

/* fp16 fields may sit at odd offsets (odd row lengths), so they are read bytewise. */
static float ld16(const uint8_t *p, int i) {
    uint16_t h;
    memcpy(&h, p + 2 * i, 2);
    return f16_to_f32(h);
}

static int get_code(const uint8_t *row, int c, int b) { return row[c * b / 8] >> (c * b % 8) & ((1 << b) - 1); }
static void put_code(uint8_t *row, int c, int b, int q) { row[c * b / 8] |= (uint8_t)(q << (c * b % 8)); }

/* One group of n values: fp16 scale and zero into *sh, *zh, codes into q[n],
 * computed with the fp16 values that dequantization will use. The loops'
 * tests are written as the SIMD quantizers' min, max and clamp
 * instructions compare (x86's vminps a, b is a < b ? a : b), so that those
 * give these bytes for any input: a code whose (x - z) / s is NaN (an
 * infinity over an infinite scale) is 0. */
static void quant_group(const float *v, int n, int b, uint16_t *sh, uint16_t *zh, uint8_t *q) {
    const float top = (float)((1 << b) - 1);
    float mn = v[0], mx = v[0];
    for (int i = 1; i < n; i++) {
        mn = v[i] < mn ? v[i] : mn;
        mx = v[i] > mx ? v[i] : mx;
    }
    *sh = f32_to_f16((mx - mn) / top);
    *zh = f32_to_f16(mn);
    float s = f16_to_f32(*sh), z = f16_to_f32(*zh);
    for (int i = 0; i < n; i++) {
        /* s = 0 (constant group, or a range below fp16's reach): all codes 0, x̂ = z */
        float u = s > 0 ? (v[i] - z) / s : 0;
        u = u > 0 ? u : 0;
        u = u < top ? u : top;
        q[i] = (uint8_t)(u + 0.5f);
    }
}

/* Channel c of the key block at blk (G tokens from tb): one group. */
static void key_channel(KVStream *s, uint8_t *blk, int tb, int c) {
    const Kivi *k = s->aux;
    const int d = s->d;
    float g[KV_MAX_DIM]; /* G <= d <= KV_MAX_DIM, by kivi_check */
    uint8_t q[KV_MAX_DIM];
    uint16_t sh, zh;
    for (int i = 0; i < k->G; i++) g[i] = slot(s, tb + i)[c];
    quant_group(g, k->G, k->b, &sh, &zh, q);
    memcpy(blk + 2 * (size_t)c, &sh, 2);
    memcpy(blk + 2 * (size_t)(d + c), &zh, 2);
    for (int i = 0; i < k->G; i++) put_code(blk + 4 * (size_t)d + (size_t)i * k->row, c, k->b, q[i]);
}

/* Group g of value token t (unit u, its row zeroed): G channels. */
static void value_group(KVStream *s, uint8_t *u, const float *x, int g) {
    const Kivi *k = s->aux;
    const int ng = s->d / k->G;
    uint8_t q[KV_MAX_DIM];
    uint16_t sh, zh;
    quant_group(x + g * k->G, k->G, k->b, &sh, &zh, q);
    memcpy(u + 2 * (size_t)g, &sh, 2);
    memcpy(u + 2 * (size_t)(ng + g), &zh, 2);
    for (int j = 0; j < k->G; j++) put_code(u + 4 * (size_t)ng, g * k->G + j, k->b, q[j]);
}

/* Quantizes the window tokens [t0, t0 + R) into R/G key blocks; per block
 * and channel c, one group = channel c of the block's G tokens. */
static void flush_keys(KVStream *s, int t0) {
    const Kivi *k = s->aux;
    for (int tb = t0; tb < t0 + k->R; tb += k->G) {
        uint8_t *blk = s->data + (size_t)(tb / k->G) * k->unit;
        memset(blk + 4 * (size_t)s->d, 0, (size_t)k->G * k->row);
        for (int c = 0; c < s->d; c++) key_channel(s, blk, tb, c);
    }
}

/* Quantizes value token t from its ring slot: d/G groups of G channels. */
static void quant_value(KVStream *s, int t) {
    const Kivi *k = s->aux;
    const int ng = s->d / k->G;
    uint8_t *u = s->data + (size_t)t * k->unit;
    memset(u + 4 * (size_t)ng, 0, k->row);
    for (int g = 0; g < ng; g++) value_group(s, u, slot(s, t), g);
}

/* flush_keys and quant_value in SIMD where a level has them (below): the
 * same bytes. */
static void flush_keys_fast(KVStream *s, int t0);
static void quant_value_fast(KVStream *s, int t);

/* Token t = len goes into the ring; a K window that now holds R tokens is
 * flushed whole, a V FIFO that now holds R + 1 quantizes its oldest. */
static void kivi_append(KVStream *s, const float *x) {
    const Kivi *k = s->aux;
    const int t = s->len;
    memcpy(slot(s, t), x, (size_t)s->d * sizeof(float));
    if (s->role == 0) {
        if ((t + 1) % k->R == 0) flush_keys_fast(s, t + 1 - k->R);
    } else if (t >= k->R) {
        quant_value_fast(s, t - k->R);
    }
}

/* The ring still holds every token the shorter stream keeps in full
 * precision (see the header), and what is quantized follows from len. */
static void kivi_truncate(KVStream *s, int n) { (void)s; (void)n; }

/* Saved form of positions [t0, t1): the quantized units that came in
 * between (K blocks or V tokens, counted from the lengths alone), then
 * the floats of the last min(t1 - t0, R + KV_MAX_ROLLBACK) positions,
 * what a ring at t1 holds that the ring at t0 did not:
 *   | units [n_quant(t0), n_quant(t1)) | f32 x[d] per position, oldest first |
 * A stream at t0 that loads it has its window, its shadow for rollback
 * and its quantized blocks as the saving stream had them at t1. */
static size_t unit_index(const KVStream *s, int t) {
    const Kivi *k = s->aux;
    return s->role == 0 ? (size_t)(t / k->G) : (size_t)t;
}
static int ring_from(const KVStream *s, int t0, int t1) {
    const Kivi *k = s->aux;
    return t1 - t0 > k->R + KV_MAX_ROLLBACK ? t1 - k->R - KV_MAX_ROLLBACK : t0;
}
static size_t kivi_save_bytes(const KVStream *s, int t0, int t1) {
    const Kivi *k = s->aux;
    size_t units = unit_index(s, n_quant(s, t1)) - unit_index(s, n_quant(s, t0));
    return units * k->unit + (size_t)(t1 - ring_from(s, t0, t1)) * s->d * sizeof(float);
}
static void kivi_save(const KVStream *s, int t0, uint8_t *out) {
    const Kivi *k = s->aux;
    size_t u0 = unit_index(s, n_quant(s, t0)), u1 = unit_index(s, n_quant(s, s->len));
    memcpy(out, s->data + u0 * k->unit, (u1 - u0) * k->unit);
    out += (u1 - u0) * k->unit;
    for (int t = ring_from(s, t0, s->len); t < s->len; t++, out += (size_t)s->d * sizeof(float))
        memcpy(out, slot(s, t), (size_t)s->d * sizeof(float));
}
static void kivi_load(KVStream *s, int len, const uint8_t *in) {
    const Kivi *k = s->aux;
    size_t u0 = unit_index(s, n_quant(s, s->len)), u1 = unit_index(s, n_quant(s, len));
    memcpy(s->data + u0 * k->unit, in, (u1 - u0) * k->unit);
    in += (u1 - u0) * k->unit;
    for (int t = ring_from(s, s->len, len); t < len; t++, in += (size_t)s->d * sizeof(float))
        memcpy(slot(s, t), in, (size_t)s->d * sizeof(float));
}

/* Quantized positions never change again (later appends quantize only
 * newer ones), so what was quantized at length n is settled. */
static int kivi_settled(const KVStream *s, int n) { return n_quant(s, n); }

static void kivi_dequant(const KVStream *s, int t, float *out) {
    const Kivi *k = s->aux;
    const int d = s->d;
    if (t >= n_quant(s, s->len)) {
        memcpy(out, slot(s, t), (size_t)d * sizeof(float));
    } else if (s->role == 0) {
        const uint8_t *blk = s->data + (size_t)(t / k->G) * k->unit;
        const uint8_t *row = blk + 4 * (size_t)d + (size_t)(t % k->G) * k->row;
        for (int c = 0; c < d; c++) out[c] = get_code(row, c, k->b) * ld16(blk, c) + ld16(blk, d + c);
    } else {
        const int ng = d / k->G;
        const uint8_t *u = s->data + (size_t)t * k->unit, *row = u + 4 * (size_t)ng;
        for (int c = 0; c < d; c++) out[c] = get_code(row, c, k->b) * ld16(u, c / k->G) + ld16(u, ng + c / k->G);
    }
}

/* Per key block, for nh heads: qs_i[c] = q_i[c]·s_c and bias_i = Σ_c q_i[c]·z_c,
 * so a token's score is qs_i · code_t + bias_i. */
static void prep_block(const KVStream *s, const uint8_t *blk, const float *q, int nh, float (*qs)[KV_MAX_DIM],
                       float *bias) {
    const int d = s->d;
    float sc[KV_MAX_DIM], z[KV_MAX_DIM];
    for (int c = 0; c < d; c++) {
        sc[c] = ld16(blk, c);
        z[c] = ld16(blk, d + c);
    }
    for (int i = 0; i < nh; i++) {
        const float *qi = q + (size_t)i * d;
        float b = 0;
        for (int c = 0; c < d; c++) {
            qs[i][c] = qi[c] * sc[c];
            b += qi[c] * z[c];
        }
        bias[i] = b;
    }
}

/* Window positions [t0, t1) of either role: plain f32 dots. */
static void score_window(const KVStream *s, const float *q, int nq, int t0, int t1, float *out, int ldo, int base) {
    for (int t = t0; t < t1; t++)
        for (int i = 0; i < nq; i++) out[(size_t)i * ldo + (t - base)] = vec_dot_f32(q + (size_t)i * s->d, slot(s, t), s->d);
}

static void accum_window(const KVStream *s, const float *p, int ldp, int nq, int t0, int t1, float *acc, int base) {
    for (int t = t0; t < t1; t++)
        for (int i = 0; i < nq; i++)
            vec_axpy_f32(acc + (size_t)i * s->d, p[(size_t)i * ldp + (t - base)], slot(s, t), s->d);
}

/* Plain C K score: blocks of G quantized tokens, each block's qs/bias
 * prepared once for up to HEADS heads, then the window. */
static void score_keys_c(const KVStream *s, const float *q, int nq, int t0, int t1, float *out, int ldo) {
    const Kivi *k = s->aux;
    const int d = s->d, nqt = n_quant(s, s->len), tq = t1 < nqt ? t1 : nqt;
    float qs[HEADS][KV_MAX_DIM], bias[HEADS];
    for (int h0 = 0; h0 < nq; h0 += HEADS) {
        const int nh = nq - h0 < HEADS ? nq - h0 : HEADS;
        for (int t = t0; t < tq;) {
            const int bi = t / k->G, te = (bi + 1) * k->G < tq ? (bi + 1) * k->G : tq;
            const uint8_t *blk = s->data + (size_t)bi * k->unit, *rows = blk + 4 * (size_t)d;
            prep_block(s, blk, q + (size_t)h0 * d, nh, qs, bias);
            for (; t < te; t++) {
                const uint8_t *row = rows + (size_t)(t - bi * k->G) * k->row;
                for (int i = 0; i < nh; i++) {
                    float a = 0;
                    for (int c = 0; c < d; c++) a += qs[i][c] * get_code(row, c, k->b);
                    out[(size_t)(h0 + i) * ldo + (t - t0)] = a + bias[i];
                }
            }
        }
    }
    score_window(s, q, nq, t0 > tq ? t0 : tq, t1, out, ldo, t0);
}

/* ---- integer K scores (d = 128) -------------------------------------------
 * Per key block and head the scaled query qs = q·s is rounded to 16-bit
 * words at σ = 32767 / max|qs|, so a quantized position's score is one
 * fused multiply-add, (Σ_c qs16[c]·code[c]) · (max|qs| / 32767) + bias,
 * over an exact integer dot (128 · 15 · 32767 < 2^31); the window keeps
 * its f32 dots. Words, not bytes: KIVI's codes are unsigned, so an 8-bit
 * query's rounding error adds up over codes 0..2^b - 1 rather than around
 * zero, and with an outlier channel setting max|qs| it reached twice
 * score_err of ‖q‖‖k‖. The error follows (max|qs| / 65534) · Σ code, that
 * is ‖k - z‖ rather than ‖k‖, so score_err (5e-4) is the tests' worst
 * (7.1e-5) with room, not a bound: a key near 0 inside a wide group could
 * pass it.
 * The bias Σ q·z is summed as the AVX2 kernel sums it (8 lanes of fused
 * multiply-adds, then its hsum tree: (l0+l4 + l2+l6) + (l1+l5 + l3+l7)),
 * so kivi_score_int is that kernel's plain C twin to the bit. */
typedef struct {
    int16_t q[128]; /* qs16, in channel order (the twin) or code order (AVX2) */
    float inv;      /* max|qs| / 32767 */
    float bias;     /* Σ q·z */
} KiviQ16;

/* Head q's qs16, scale and bias for the key block at blk: 0, or -1 where
 * q·s or q·z is not finite (the float path takes the call). */
static int kq_prep_ref(const uint8_t *blk, const float *q, KiviQ16 *o) {
    float qs[128], l[8] = {0}, m = 0;
    for (int c = 0; c < 128; c++) {
        qs[c] = q[c] * ld16(blk, c);
        l[c % 8] = fmaf(q[c], ld16(blk, 128 + c), l[c % 8]);
        if (!isfinite(qs[c])) return -1;
        m = fmaxf(m, fabsf(qs[c]));
    }
    const float sigma = m > 32767.0f / FLT_MAX ? 32767.0f / m : 0;
    for (int c = 0; c < 128; c++) o->q[c] = (int16_t)lrintf(qs[c] * sigma);
    o->inv = m / 32767.0f;
    o->bias = ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
    return isfinite(o->bias) ? 0 : -1;
}

static int kivi_score_int(const KVStream *s, const float *q, int nq, int t0, int t1, float *out, int ldo) {
    const Kivi *k = s->aux;
    const int nqt = n_quant(s, s->len), tq = t1 < nqt ? t1 : nqt;
    if (s->role != 0 || s->d != 128) return -1;
    for (int i = 0; i < nq; i++) {
        KiviQ16 o = {{0}, 0, 0};
        for (int t = t0; t < tq; t++) {
            const int bi = t / k->G;
            const uint8_t *blk = s->data + (size_t)bi * k->unit, *row = blk + 512 + (size_t)(t - bi * k->G) * k->row;
            if ((t == t0 || t % k->G == 0) && kq_prep_ref(blk, q + (size_t)i * 128, &o)) return -1;
            int32_t dot = 0;
            for (int c = 0; c < 128; c++) dot += o.q[c] * get_code(row, c, k->b);
            out[(size_t)i * ldo + (t - t0)] = fmaf((float)dot, o.inv, o.bias);
        }
    }
    score_window(s, q, nq, t0 > tq ? t0 : tq, t1, out, ldo, t0);
    return 0;
}

/* acc[c] += zs[g] for every channel c of group g (a loop per group: c / G
 * per channel was an integer division each, as slow as the sums). */
static void add_zero_sums(float *acc, const float *zs, int d, int G) {
    for (int g = 0; g < d / G; g++)
        for (int c = g * G; c < (g + 1) * G; c++) acc[c] += zs[g];
}

/* Plain C V accumulate: per token and group, acc_i += (p_i·s_g)·code, while
 * Σ_t p_i·z_g collects per head and group and is added once at the end. */
static void accum_values_c(const KVStream *s, const float *p, int ldp, int nq, int t0, int t1, float *acc) {
    const Kivi *k = s->aux;
    const int d = s->d, G = k->G, ng = d / G, nqt = n_quant(s, s->len), tq = t1 < nqt ? t1 : nqt;
    float zs[HEADS][KV_MAX_DIM];
    for (int h0 = 0; h0 < nq; h0 += HEADS) {
        const int nh = nq - h0 < HEADS ? nq - h0 : HEADS;
        for (int i = 0; i < nh; i++) memset(zs[i], 0, (size_t)ng * sizeof(float));
        for (int t = t0; t < tq; t++) {
            const uint8_t *u = s->data + (size_t)t * k->unit, *row = u + 4 * (size_t)ng;
            for (int g = 0; g < ng; g++) {
                const float sg = ld16(u, g), zg = ld16(u, ng + g);
                for (int i = 0; i < nh; i++) {
                    const float w = p[(size_t)(h0 + i) * ldp + (t - t0)], ws = w * sg;
                    float *ai = acc + (size_t)(h0 + i) * d;
                    zs[i][g] += w * zg;
                    for (int c = g * G; c < (g + 1) * G; c++) ai[c] += ws * get_code(row, c, k->b);
                }
            }
        }
        for (int i = 0; i < nh; i++) add_zero_sums(acc + (size_t)(h0 + i) * d, zs[i], d, G);
    }
    accum_window(s, p, ldp, nq, t0 > tq ? t0 : tq, t1, acc, t0);
}

#if defined(__x86_64__)
#include <immintrin.h>

#include "kernels/hsum.h"
#include "kernels/quant32.h"

#define AVX2 __attribute__((target("avx2,fma,f16c")))

AVX2 static inline float hsum(__m256 v) {
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    x = _mm_add_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
}

/* 8 codes as floats from their b bytes at p (a row at channel c, c % 8 == 0,
 * starts at byte c·b/8): one little-endian word, broadcast, shifted by
 * 0, b, .., 7b, masked. */
AVX2 static inline __m256 unpack8(const uint8_t *p, int b, __m256i sh, __m256i mask) {
    uint32_t w = 0;
    if (b == 4) memcpy(&w, p, 4);
    else memcpy(&w, p, 2);
    return _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)w), sh), mask));
}

AVX2 static inline __m256i shifts(int b) { return _mm256_setr_epi32(0, b, 2 * b, 3 * b, 4 * b, 5 * b, 6 * b, 7 * b); }

/* The 8-code chunks j (even) and j + 1 of b = 2 from their 4 bytes at p:
 * one broadcast, the second chunk's lanes shifted 16 further (shifts(2)
 * and that plus 16 in sh[0], sh[1]), and vpermps, which reads a lane's low
 * 3 bits only, looks each code up as a float in lut = 0 1 2 3 0 1 2 3 (so
 * the next code's bit 2 needs no mask): the floats unpack8 converts. */
AVX2 static inline void unpack16(const uint8_t *p, const __m256i sh[2], __m256 lut, __m256 cf[2]) {
    uint32_t w;
    memcpy(&w, p, 4);
    const __m256i v = _mm256_set1_epi32((int)w);
    cf[0] = _mm256_permutevar8x32_ps(lut, _mm256_srlv_epi32(v, sh[0]));
    cf[1] = _mm256_permutevar8x32_ps(lut, _mm256_srlv_epi32(v, sh[1]));
}

/* ---- quantizers -------------------------------------------------------------
 * quant_group for 8 groups at once, one per lane. A key block's groups are
 * channels c..c+7 over its G tokens, so each lane takes its min and max in
 * the loop's order with the loop's tests (vminps v, m is v < m ? v : m),
 * giving its values for any input; a lane whose min or range is NaN goes
 * to plain C, as F16C keeps a NaN's payload that f32_to_f16 drops. A value
 * token's groups are G consecutive channels, 8 lanes a step, met in
 * another order than the loop's, which matters for two things only: a NaN
 * (the loop skips it unless it comes first) and which zero a tie of -0
 * and +0 keeps as the min; a group holding a NaN or whose min is 0 goes to
 * plain C. (A tie of zeros as the max changes nothing: the max enters
 * only through max - min, the same for either zero when min is not 0.) */

/* Codes of 8 values x with fp16 scales sc and zeros z: quant_group's
 * second loop, test for test (vmaxps u, 0 is u > 0 ? u : 0). */
AVX2 static inline __m256i codes8(__m256 x, __m256 sc, __m256 z, __m256 top) {
    const __m256 zero = _mm256_setzero_ps();
    __m256 u = _mm256_and_ps(_mm256_cmp_ps(sc, zero, _CMP_GT_OQ), _mm256_div_ps(_mm256_sub_ps(x, z), sc));
    u = _mm256_min_ps(_mm256_max_ps(u, zero), top);
    return _mm256_cvttps_epi32(_mm256_add_ps(u, _mm256_set1_ps(0.5f)));
}

/* The codes of channels c..c+7 (c % 8 == 0, lane j = channel c + j) into
 * their b bytes of row: each lane shifted to bit j·b, the lanes or-ed. */
AVX2 static inline void put8(uint8_t *row, int c, int b, __m256i q) {
    const __m256i v = _mm256_sllv_epi32(q, shifts(b));
    __m128i x = _mm_or_si128(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    x = _mm_or_si128(x, _mm_shuffle_epi32(x, 0x4E));
    x = _mm_or_si128(x, _mm_shuffle_epi32(x, 0xB1));
    const uint32_t w = (uint32_t)_mm_cvtsi128_si32(x);
    memcpy(row + c * b / 8, &w, (size_t)b);
}

/* flush_keys (d % 8 == 0): per block, channels 8 at a time. */
AVX2 static void flush_keys_avx2(KVStream *s, int t0) {
    const Kivi *k = s->aux;
    const int d = s->d, G = k->G, b = k->b;
    const __m256 top = _mm256_set1_ps((float)((1 << b) - 1));
    const float *x[KV_MAX_DIM]; /* the block's tokens in the ring */
    for (int tb = t0; tb < t0 + k->R; tb += G) {
        uint8_t *blk = s->data + (size_t)(tb / G) * k->unit, *rows = blk + 4 * (size_t)d;
        memset(rows, 0, (size_t)G * k->row);
        for (int i = 0; i < G; i++) x[i] = slot(s, tb + i);
        for (int c = 0; c < d; c += 8) {
            __m256 mn = _mm256_loadu_ps(x[0] + c), mx = mn;
            for (int i = 1; i < G; i++) {
                const __m256 v = _mm256_loadu_ps(x[i] + c);
                mn = _mm256_min_ps(v, mn);
                mx = _mm256_max_ps(v, mx);
            }
            const __m256 range = _mm256_div_ps(_mm256_sub_ps(mx, mn), top);
            if (_mm256_movemask_ps(_mm256_cmp_ps(range, mn, _CMP_UNORD_Q))) {
                for (int j = c; j < c + 8; j++) key_channel(s, blk, tb, j);
                continue;
            }
            const __m128i sh = _mm256_cvtps_ph(range, _MM_FROUND_TO_NEAREST_INT),
                          zh = _mm256_cvtps_ph(mn, _MM_FROUND_TO_NEAREST_INT);
            _mm_storeu_si128((__m128i *)(blk + 2 * (size_t)c), sh);
            _mm_storeu_si128((__m128i *)(blk + 2 * (size_t)(d + c)), zh);
            const __m256 sc = _mm256_cvtph_ps(sh), z = _mm256_cvtph_ps(zh);
            for (int i = 0; i < G; i++)
                put8(rows + (size_t)i * k->row, c, b, codes8(_mm256_loadu_ps(x[i] + c), sc, z, top));
        }
    }
}

AVX2 static inline float hmin(__m256 v) {
    __m128 x = _mm_min_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_min_ps(x, _mm_movehl_ps(x, x));
    return _mm_cvtss_f32(_mm_min_ss(x, _mm_movehdup_ps(x)));
}

AVX2 static inline float hmax(__m256 v) {
    __m128 x = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_max_ps(x, _mm_movehl_ps(x, x));
    return _mm_cvtss_f32(_mm_max_ss(x, _mm_movehdup_ps(x)));
}

/* quant_value (G % 8 == 0): per group, min and max 8 lanes a step. */
AVX2 static void quant_value_avx2(KVStream *s, int t) {
    const Kivi *k = s->aux;
    const int G = k->G, ng = s->d / G, b = k->b;
    const float topf = (float)((1 << b) - 1);
    const __m256 top = _mm256_set1_ps(topf);
    uint8_t *u = s->data + (size_t)t * k->unit, *row = u + 4 * (size_t)ng;
    const float *x = slot(s, t);
    memset(row, 0, k->row);
    for (int g = 0; g < ng; g++) {
        const float *v = x + (size_t)g * G;
        __m256 mn = _mm256_loadu_ps(v), mx = mn, nan = _mm256_cmp_ps(mn, mn, _CMP_UNORD_Q);
        for (int c = 8; c < G; c += 8) {
            const __m256 w = _mm256_loadu_ps(v + c);
            mn = _mm256_min_ps(w, mn);
            mx = _mm256_max_ps(w, mx);
            nan = _mm256_or_ps(nan, _mm256_cmp_ps(w, w, _CMP_UNORD_Q));
        }
        const float lo = hmin(mn), hi = hmax(mx);
        if (_mm256_movemask_ps(nan) || lo == 0) {
            value_group(s, u, x, g);
            continue;
        }
        const uint16_t sh = f32_to_f16((hi - lo) / topf), zh = f32_to_f16(lo);
        memcpy(u + 2 * (size_t)g, &sh, 2);
        memcpy(u + 2 * (size_t)(ng + g), &zh, 2);
        const __m256 sc = _mm256_set1_ps(f16_to_f32(sh)), z = _mm256_set1_ps(f16_to_f32(zh));
        for (int c = 0; c < G; c += 8) put8(row, g * G + c, b, codes8(_mm256_loadu_ps(v + c), sc, z, top));
    }
}

static void flush_keys_fast(KVStream *s, int t0) {
    if (kernels_level() > 0 && s->d % 8 == 0) flush_keys_avx2(s, t0);
    else flush_keys(s, t0);
}

static void quant_value_fast(KVStream *s, int t) {
    const Kivi *k = s->aux;
    if (kernels_level() > 0 && k->G % 8 == 0) quant_value_avx2(s, t);
    else quant_value(s, t);
}

/* ld16 through F16C. */
AVX2 static inline float ld16_f16c(const uint8_t *p, int i) {
    uint16_t h;
    memcpy(&h, p + 2 * i, 2);
    return _cvtsh_ss(h);
}

/* prep_block through F16C (d % 8 == 0): 8 scales and zeros widened a step. */
AVX2 static void prep_block_avx2(const KVStream *s, const uint8_t *blk, const float *q, int nh,
                                 float (*qs)[KV_MAX_DIM], float *bias) {
    const int d = s->d;
    for (int i = 0; i < nh; i++) {
        const float *qi = q + (size_t)i * d;
        __m256 bz = _mm256_setzero_ps();
        for (int c = 0; c < d; c += 8) {
            __m256 sc = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + 2 * (size_t)c)));
            __m256 z = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + 2 * (size_t)(d + c))));
            __m256 qv = _mm256_loadu_ps(qi + c);
            _mm256_storeu_ps(qs[i] + c, _mm256_mul_ps(qv, sc));
            bz = _mm256_fmadd_ps(qv, z, bz);
        }
        bias[i] = hsum(bz);
    }
}

/* Quantized key positions [t0, t1) for nh heads, the window excluded.
 * Inlined with nh and b constants (see score_keys_avx2), so the
 * accumulators stay in registers: each row is unpacked 8 codes at a time
 * (16 from one load for b = 2), each chunk feeding every head's qs
 * (scratch [HEADS][KV_MAX_DIM]). out is indexed from base. */
AVX2 static inline __attribute__((always_inline)) void score_heads(const KVStream *s, const float *qh, int nh,
                                                                    const int b, int t0, int t1, float *out, int ldo,
                                                                    int base, float (*qs)[KV_MAX_DIM]) {
    const Kivi *k = s->aux;
    const int d = s->d;
    const __m256i sh = shifts(b), mask = _mm256_set1_epi32((1 << b) - 1);
    const __m256i sh2[2] = {sh, _mm256_add_epi32(sh, _mm256_set1_epi32(16))};
    const __m256 lut = _mm256_setr_ps(0, 1, 2, 3, 0, 1, 2, 3);
    float bias[HEADS];
    for (int t = t0; t < t1;) {
        const int bi = t / k->G, te = (bi + 1) * k->G < t1 ? (bi + 1) * k->G : t1;
        const uint8_t *blk = s->data + (size_t)bi * k->unit, *rows = blk + 4 * (size_t)d;
        prep_block_avx2(s, blk, qh, nh, qs, bias);
        for (; t < te; t++) {
            const uint8_t *row = rows + (size_t)(t - bi * k->G) * k->row;
            __m256 acc[HEADS];
            for (int i = 0; i < nh; i++) acc[i] = _mm256_setzero_ps();
            const uint8_t *pc = row;
            for (int c = 0; c < d;) {
                __m256 cf[2];
                const int two = b == 2 && c + 8 < d;
                if (two) unpack16(pc, sh2, lut, cf);
                else cf[0] = unpack8(pc, b, sh, mask);
                for (int h = 0; h <= two; h++, c += 8, pc += b)
                    for (int i = 0; i < nh; i++) acc[i] = _mm256_fmadd_ps(_mm256_loadu_ps(qs[i] + c), cf[h], acc[i]);
            }
            for (int i = 0; i < nh; i++) out[(size_t)i * ldo + (t - base)] = hsum(acc[i]) + bias[i];
        }
    }
}

/* AVX2 K score (d % 8 == 0): heads in tiles of up to HEADS, each tile size
 * a separate inlined copy; then the window. */
AVX2 static void score_keys_avx2(const KVStream *s, const float *q, int nq, int t0, int t1, float *out, int ldo) {
    const Kivi *k = s->aux;
    const int nqt = n_quant(s, s->len), tq = t1 < nqt ? t1 : nqt;
    float qs[HEADS][KV_MAX_DIM];
    for (int h0 = 0; h0 < nq && t0 < tq; h0 += HEADS) {
        const float *qh = q + (size_t)h0 * s->d;
        float *o = out + (size_t)h0 * ldo;
#define SCORE(NH)                                                                                                  \
    k->b == 2 ? score_heads(s, qh, NH, 2, t0, tq, o, ldo, t0, qs) : score_heads(s, qh, NH, 4, t0, tq, o, ldo, t0, qs)
        switch (nq - h0 < HEADS ? nq - h0 : HEADS) {
        case 1: SCORE(1); break;
        case 2: SCORE(2); break;
        case 3: SCORE(3); break;
        case 4: SCORE(4); break;
        case 5: SCORE(5); break;
        case 6: SCORE(6); break;
        case 7: SCORE(7); break;
        default: SCORE(8); break;
        }
#undef SCORE
    }
    score_window(s, q, nq, t0 > tq ? t0 : tq, t1, out, ldo, t0);
}

/* kivi_score_int's arithmetic with 256-bit integers (d = 128, K streams).
 * A row's codes come apart as bytes (b = 2: bits 2k..2k+1 of the 32 row
 * bytes, channels 4j + k; b = 4: low and high nibbles of bytes 0-31, then
 * of 32-63) and widen to words against zero (vpunpck*bw); per block and
 * head qs16 is laid out in that order once, its low and high bytes apart
 * through the same byte shuffles (kernels/quant32.h: split4_avx2,
 * split2_avx2) and joined by the same unpacks. vpmaddwd then multiplies
 * and adds word pairs exactly. Positions four at a time share one hsum
 * tree per head. */
AVX2 static inline int kq_prep_avx2(const KVStream *s, const uint8_t *blk, const float *q, KiviQ16 *o) {
    const Kivi *k = s->aux;
    float qs[1][KV_MAX_DIM], m;
    prep_block_avx2(s, blk, q, 1, qs, &o->bias);
    if (absmax_avx2(qs[0], 128, &m) || !isfinite(o->bias)) return -1;
    const __m256 sigma = _mm256_set1_ps(m > 32767.0f / FLT_MAX ? 32767.0f / m : 0);
    const __m256i ff = _mm256_set1_epi16(0xff), order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    __m256i lo[4], hi[4];
    for (int j = 0; j < 4; j++) {
        __m256i v[4];
        for (int i = 0; i < 4; i++) v[i] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(qs[0] + 32 * j + 8 * i), sigma));
        /* |v| <= 32767: the packs are exact; per 128-bit lane they leave
         * dwords in the order 0 4 1 5 2 6 3 7, which order undoes */
        const __m256i w0 = _mm256_packs_epi32(v[0], v[1]), w1 = _mm256_packs_epi32(v[2], v[3]);
        lo[j] = _mm256_permutevar8x32_epi32(_mm256_packus_epi16(_mm256_and_si256(w0, ff), _mm256_and_si256(w1, ff)), order);
        hi[j] = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(_mm256_srai_epi16(w0, 8), _mm256_srai_epi16(w1, 8)), order);
    }
    if (k->b == 2) {
        split4_avx2(lo);
        split4_avx2(hi);
    } else {
        split2_avx2(lo);
        split2_avx2(lo + 2);
        split2_avx2(hi);
        split2_avx2(hi + 2);
    }
    for (int j = 0; j < 4; j++) {
        _mm256_storeu_si256((__m256i *)(o->q + 32 * j), _mm256_unpacklo_epi8(lo[j], hi[j]));
        _mm256_storeu_si256((__m256i *)(o->q + 32 * j + 16), _mm256_unpackhi_epi8(lo[j], hi[j]));
    }
    o->inv = m / 32767.0f;
    return 0;
}

/* One row's 128 codes as eight vectors of words, in qs16's order. */
AVX2 static inline __attribute__((always_inline)) void kq_codes(const int b, const uint8_t *row, __m256i x[8]) {
    const __m256i v0 = _mm256_loadu_si256((const __m256i *)row), z = _mm256_setzero_si256();
    __m256i c[4];
    if (b == 2) {
        /* a 16-bit shift moves the next byte's bits into the top of each
         * byte, above the two the mask keeps */
        for (int j = 0; j < 4; j++) c[j] = _mm256_and_si256(_mm256_srli_epi16(v0, 2 * j), _mm256_set1_epi8(3));
    } else {
        const __m256i m4 = _mm256_set1_epi8(15), v1 = _mm256_loadu_si256((const __m256i *)(row + 32));
        c[0] = _mm256_and_si256(v0, m4);
        c[1] = _mm256_and_si256(_mm256_srli_epi16(v0, 4), m4);
        c[2] = _mm256_and_si256(v1, m4);
        c[3] = _mm256_and_si256(_mm256_srli_epi16(v1, 4), m4);
    }
    for (int j = 0; j < 4; j++) {
        x[2 * j] = _mm256_unpacklo_epi8(c[j], z);
        x[2 * j + 1] = _mm256_unpackhi_epi8(c[j], z);
    }
}

/* Quantized positions [t0, t1) for NH <= 4 heads (q[NH][128]), b bits;
 * out indexed from t0. 0, or -1 for the float path. */
AVX2 static inline __attribute__((always_inline)) int score_w16_heads(const KVStream *s, const float *q, const int NH,
                                                                      const int b, int t0, int t1, float *out,
                                                                      int ldo) {
    const Kivi *k = s->aux;
    KiviQ16 o[4];
    for (int t = t0; t < t1;) {
        const int bi = t / k->G, te = (bi + 1) * k->G < t1 ? (bi + 1) * k->G : t1;
        const uint8_t *blk = s->data + (size_t)bi * k->unit, *rows = blk + 512;
        for (int i = 0; i < NH; i++)
            if (kq_prep_avx2(s, blk, q + (size_t)i * 128, &o[i])) return -1;
        for (int R; t < te; t += R) {
            R = te - t < 4 ? te - t : 4;
            __m256i acc[4][4];
            for (int r = 0; r < 4; r++) {
                if (r >= R) {
                    for (int i = 0; i < NH; i++) acc[r][i] = _mm256_setzero_si256();
                    continue;
                }
                __m256i x[8];
                kq_codes(b, rows + (size_t)(t + r - bi * k->G) * k->row, x);
                for (int i = 0; i < NH; i++) {
                    const __m256i *qi = (const __m256i *)o[i].q;
                    __m256i a = _mm256_madd_epi16(x[0], _mm256_loadu_si256(qi));
                    for (int j = 1; j < 8; j++) a = _mm256_add_epi32(a, _mm256_madd_epi16(x[j], _mm256_loadu_si256(qi + j)));
                    acc[r][i] = a;
                }
            }
            for (int i = 0; i < NH; i++) {
                float s4[4];
                const __m128 dot = _mm_cvtepi32_ps(hsum4_i32_avx2(acc[0][i], acc[1][i], acc[2][i], acc[3][i]));
                _mm_storeu_ps(s4, _mm_fmadd_ps(dot, _mm_set1_ps(o[i].inv), _mm_set1_ps(o[i].bias)));
                for (int r = 0; r < R; r++) out[(size_t)i * ldo + (t - t0) + r] = s4[r];
            }
        }
    }
    return 0;
}

/* AVX2 integer K score (d = 128): heads in passes of up to 4, then the
 * window. 0, or -1 when a query meets a block whose q·s or q·z is not
 * finite (the float path takes the whole call). */
AVX2 static int score_keys_w16_avx2(const KVStream *s, const float *q, int nq, int t0, int t1, float *out, int ldo) {
    const Kivi *k = s->aux;
    const int nqt = n_quant(s, s->len), tq = t1 < nqt ? t1 : nqt;
    for (int h0 = 0; h0 < nq && t0 < tq; h0 += 4) {
        const float *qh = q + (size_t)h0 * 128;
        float *oh = out + (size_t)h0 * ldo;
        int rc;
#define SCORE(NH)                                                                                                  \
    rc = k->b == 2 ? score_w16_heads(s, qh, NH, 2, t0, tq, oh, ldo) : score_w16_heads(s, qh, NH, 4, t0, tq, oh, ldo)
        switch (nq - h0 < 4 ? nq - h0 : 4) {
        case 1: SCORE(1); break;
        case 2: SCORE(2); break;
        case 3: SCORE(3); break;
        default: SCORE(4); break;
        }
#undef SCORE
        if (rc) return -1;
    }
    score_window(s, q, nq, t0 > tq ? t0 : tq, t1, out, ldo, t0);
    return 0;
}

/* Positions whose weights accum_heads computes ahead of their passes. */
#define KT 32

/* Quantized value positions [t0, t1) for NH <= 4 heads, b bits, the window
 * excluded; inlined with NH, b and NC constant (see accum_values_avx2). Per
 * tile of KT positions the weights p_i·s_g are computed first, and
 * Σ_t p_i·z_g added to zs[i][g] (four groups a vector where ng % 4 == 0:
 * the scales and zeros are fp16 arrays at the unit's head); then the
 * channels go in passes of NC 8-code chunks (G a multiple of 8·NC), whose
 * NH · NC partial sums stay in registers over the tile (its rows in L1),
 * each chunk unpacked once for all NH heads and each weight a broadcast
 * from L1 (docs/kernel-notes.md#kivi-weights). Each sum takes the
 * positions in order, so a head's result does not depend on NH. */
AVX2 static inline __attribute__((always_inline)) void accum_heads(const KVStream *s, const float *p, int ldp,
                                                                    const int NH, const int b, const int NC, int t0,
                                                                    int t1, float *acc, float (*zs)[KV_MAX_DIM]) {
    const Kivi *k = s->aux;
    const int d = s->d, G = k->G, ng = d / G;
    const size_t unit = k->unit;
    const __m256i sh = shifts(b), mask = _mm256_set1_epi32((1 << b) - 1);
    const __m256i sh2[2] = {sh, _mm256_add_epi32(sh, _mm256_set1_epi32(16))};
    const __m256 lut = _mm256_setr_ps(0, 1, 2, 3, 0, 1, 2, 3);
    float W[4][KT][KV_MAX_DIM / 8]; /* [head][position][group]: G >= 8 */
    for (int ta = t0; ta < t1; ta += KT) {
        const int n = t1 - ta < KT ? t1 - ta : KT;
        for (int t = 0; t < n; t++) {
            const uint8_t *u = s->data + (size_t)(ta + t) * unit;
            int g = 0;
            /* four groups' scales and zeros widened once for all heads (the
             * stores below could alias u for the compiler, so it would not
             * hoist them) */
            for (; ng % 4 == 0 && g < ng; g += 4) {
                const __m128 sg = _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)(u + 2 * (size_t)g))),
                             zg = _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)(u + 2 * (size_t)(ng + g))));
                for (int i = 0; i < NH; i++) {
                    const __m128 wv = _mm_set1_ps(p[(size_t)i * ldp + (ta + t - t0)]);
                    _mm_storeu_ps(&W[i][t][g], _mm_mul_ps(wv, sg));
                    _mm_storeu_ps(&zs[i][g], _mm_add_ps(_mm_loadu_ps(&zs[i][g]), _mm_mul_ps(wv, zg)));
                }
            }
            for (; g < ng; g++)
                for (int i = 0; i < NH; i++) {
                    const float w = p[(size_t)i * ldp + (ta + t - t0)];
                    W[i][t][g] = w * ld16_f16c(u, g);
                    zs[i][g] += w * ld16_f16c(u, ng + g);
                }
        }
        for (int c0 = 0; c0 < d; c0 += 8 * NC) {
            const int g = c0 / G;
            __m256 a[4][4];
            for (int i = 0; i < NH; i++)
                for (int j = 0; j < NC; j++) a[i][j] = _mm256_loadu_ps(acc + (size_t)i * d + c0 + 8 * j);
            for (int t = 0; t < n; t++) {
                const uint8_t *pc = s->data + (size_t)(ta + t) * unit + 4 * (size_t)ng + (size_t)c0 * b / 8;
                __m256 ws[4];
                for (int i = 0; i < NH; i++) ws[i] = _mm256_broadcast_ss(&W[i][t][g]);
                /* b = 2: chunks in pairs from one load (NC is 1 or even) */
                for (int j = 0; j < NC; j += b == 2 && NC > 1 ? 2 : 1) {
                    __m256 cf[2];
                    if (b == 2 && NC > 1) {
                        unpack16(pc + j * b, sh2, lut, cf);
                        for (int i = 0; i < NH; i++) {
                            a[i][j] = _mm256_fmadd_ps(ws[i], cf[0], a[i][j]);
                            a[i][j + 1] = _mm256_fmadd_ps(ws[i], cf[1], a[i][j + 1]);
                        }
                    } else {
                        cf[0] = unpack8(pc + j * b, b, sh, mask);
                        for (int i = 0; i < NH; i++) a[i][j] = _mm256_fmadd_ps(ws[i], cf[0], a[i][j]);
                    }
                }
            }
            for (int i = 0; i < NH; i++)
                for (int j = 0; j < NC; j++) _mm256_storeu_ps(acc + (size_t)i * d + c0 + 8 * j, a[i][j]);
        }
    }
}

/* AVX2 V accumulate (G % 8 == 0): heads in tiles of up to 4, the
 * per-group zero sums added once per tile; then the window. */
AVX2 static void accum_values_avx2(const KVStream *s, const float *p, int ldp, int nq, int t0, int t1, float *acc) {
    const Kivi *k = s->aux;
    const int d = s->d, G = k->G, ng = d / G, nqt = n_quant(s, s->len), tq = t1 < nqt ? t1 : nqt;
    float zs[4][KV_MAX_DIM];
    for (int h0 = 0; h0 < nq && t0 < tq; h0 += 4) {
        const int nh = nq - h0 < 4 ? nq - h0 : 4;
        const float *ph = p + (size_t)h0 * ldp;
        float *ah = acc + (size_t)h0 * d;
        for (int i = 0; i < nh; i++) memset(zs[i], 0, (size_t)ng * sizeof(float));
        /* passes of 32 channels for one or two heads, 16 for more, where
         * the groups divide into them, else of 8 */
#define PASSES(NH, B, NC)                                                                                          \
    G % (8 * NC) ? accum_heads(s, ph, ldp, NH, B, 1, t0, tq, ah, zs) : accum_heads(s, ph, ldp, NH, B, NC, t0, tq, ah, zs)
#define ACCUM(NH, NC) k->b == 2 ? PASSES(NH, 2, NC) : PASSES(NH, 4, NC)
        switch (nh) {
        case 1: ACCUM(1, 4); break;
        case 2: ACCUM(2, 4); break;
        case 3: ACCUM(3, 2); break;
        default: ACCUM(4, 2); break;
        }
#undef ACCUM
#undef PASSES
        for (int i = 0; i < nh; i++) add_zero_sums(ah + (size_t)i * d, zs[i], d, G);
    }
    accum_window(s, p, ldp, nq, t0 > tq ? t0 : tq, t1, acc, t0);
}

/* ---- AVX-512: d = 128 or 256 -------------------------------------------------
 * Where kernels_level() >= 2, streams of head dim D = 128 (Qwen3) or 256
 * (Qwen3.5) decode 16 codes per step in two instructions: the chunk's 2b
 * bytes are broadcast, every lane is shifted to its own code, and vpermps,
 * which reads only the low 4 bits of an index, turns them into floats
 * through a 16-entry table, so no mask and no conversion
 * (docs/kernel-notes.md#kivi-decode):
 *   b = 2: dword lane l shifted by 2l, table l & 3       (lanes in code order)
 *   b = 4: qword lane m shifted by 4m, table l; code m lands in dword 2m and
 *          code m + 8 in dword 2m + 1: order 0, 8, 1, 9, .., 7, 15 (perm16)
 * For b = 4 the scaled queries (score) and the partial sums (accumulate) are
 * permuted to match once per block and once per call.
 * Heads go in passes of 256 / D (V; K at D = 256) or up to four (K at
 * D = 128), whose per-head vectors stay in registers or, for K's third and
 * fourth heads, in L1:
 *   K: per block, qs_i = q_i·s (D/16 vectors) and bias_i; positions four at
 *      a time, each chunk feeding every head's FMA chains, and the four
 *      positions' horizontal sums share one hsum4_512 tree per head;
 *   V: D/16 partial sums per head over the whole call; per tile of
 *      positions the weights p_i·s_g are computed first, then each chunk
 *      takes an FMA per head with its group's weight broadcast, and
 *      Σ_t p_i·z_g, summed per group in one vector per head, is added at
 *      the end.
 * A head's arithmetic is the same in every pass, alone or paired, so its
 * results do not depend on the other queries of the call. */

#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))
#define AVX512_INLINE __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c"), always_inline)) static inline

/* Positions fetched ahead of use into L1: the K and V streams alternate
 * every attention chunk, which the hardware prefetcher follows poorly.
 * Further prefetches into L2, as lowbit.c adds, made it slower here
 * (docs/kernel-notes.md#kivi-prefetch). */
#define AHEAD 64

/* Lane l of a decoded 4-bit chunk holds code perm16[l]; code m sits in lane unperm16[m]. */
static const int32_t perm16[16] = {0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15};
static const int32_t unperm16[16] = {0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15};

/* The lines of positions [t, t + n) of a stream of bpp bytes per position
 * (K: unit / G, exact at block starts), AHEAD positions on. Always inline:
 * GCC drops the prefetches of a plain static inline (see lowbit.c). */
AVX512_INLINE void prefetch_ahead(const uint8_t *data, size_t bpp, int t, int n) {
    const char *p = (const char *)data + (size_t)(t + AHEAD) * bpp;
    for (size_t o = 0; o < (size_t)n * bpp; o += 64) _mm_prefetch(p + o, _MM_HINT_T0);
}

AVX512_INLINE __m512i dec_shifts(const int b) {
    return b == 2 ? _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30)
                  : _mm512_setr_epi64(0, 4, 8, 12, 16, 20, 24, 28);
}

AVX512_INLINE __m512 dec_table(const int b) {
    return b == 2 ? _mm512_setr_ps(0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3)
                  : _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
}

/* The 16 codes of the 2b bytes at p as floats, in the order above. */
AVX512_INLINE __m512 dec16(const uint8_t *p, const int b, __m512i sh, __m512 tab) {
    __m512i x;
    if (b == 2) {
        uint32_t w;
        memcpy(&w, p, 4);
        x = _mm512_srlv_epi32(_mm512_set1_epi32((int)w), sh);
    } else {
        uint64_t w;
        memcpy(&w, p, 8);
        x = _mm512_srlv_epi64(_mm512_set1_epi64((long long)w), sh);
    }
    return _mm512_permutexvar_ps(x, tab);
}

/* Four positions' key rows at rows (row bytes apart) for NH heads of D
 * dims, b bits: out[i·ldo + r] = qs_i · codes_r + bias_i. Straight-line
 * code, so the sums never leave registers; the four positions' horizontal
 * sums share one hsum4_512 tree per head. */
AVX512_INLINE void score4(const uint8_t *rows, size_t row, const int D, const int NH, const int b, __m512 (*qs)[16],
                          const float *bias, __m512i sh, __m512 tab, float *out, int ldo) {
    __m512 tot[4][4], odd[4];
    for (int r = 0; r < 4; r++) {
        /* even and odd chunks in two chains, for twice the FMAs in flight
         * (docs/kernel-notes.md#kivi-score-chains) */
        const uint8_t *pc = rows + (size_t)r * row;
        for (int i = 0; i < NH; i++) tot[r][i] = odd[i] = _mm512_setzero_ps();
        for (int j = 0; j < D / 16; j += 2, pc += 4 * b) {
            const __m512 c0 = dec16(pc, b, sh, tab), c1 = dec16(pc + 2 * b, b, sh, tab);
            for (int i = 0; i < NH; i++) {
                tot[r][i] = _mm512_fmadd_ps(qs[i][j], c0, tot[r][i]);
                odd[i] = _mm512_fmadd_ps(qs[i][j + 1], c1, odd[i]);
            }
        }
        for (int i = 0; i < NH; i++) tot[r][i] = _mm512_add_ps(tot[r][i], odd[i]);
    }
    for (int i = 0; i < NH; i++)
        _mm_storeu_ps(out + (size_t)i * ldo,
                      _mm_add_ps(hsum4_512(tot[0][i], tot[1][i], tot[2][i], tot[3][i]), _mm_set1_ps(bias[i])));
}

/* Quantized key positions [t0, t1) for NH heads of D dims (NH·D <= 512),
 * b bits; out indexed from t0. Inlined with D, NH and b constants. */
AVX512_INLINE void score_pass(const KVStream *s, const float *q, const int D, const int NH, const int b, int t0, int t1,
                              float *out, int ldo) {
    const Kivi *k = s->aux;
    const int G = k->G;
    const __m512i sh = dec_shifts(b), perm = _mm512_loadu_si512(perm16);
    const __m512 tab = dec_table(b);
    __m512 qs[4][16];
    float bias[4], part[4 * 4];
    uint8_t pad[4 * 256 / 2]; /* four rows of up to 256 4-bit codes */
    for (int t = t0; t < t1;) {
        const int bi = t / G, te = (bi + 1) * G < t1 ? (bi + 1) * G : t1;
        const uint8_t *blk = s->data + (size_t)bi * k->unit, *rows = blk + 4 * (size_t)D;
        /* the block's qs_i (decode order) and bias_i = Σ_c q_i[c]·z_c */
        __m512 bz[4];
        for (int i = 0; i < NH; i++) bz[i] = _mm512_setzero_ps();
        for (int j = 0; j < D / 16; j++) {
            const uint8_t *hs = blk + 32 * (size_t)j, *hz = hs + 2 * (size_t)D;
            const __m512 sc = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)hs)),
                         z = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)hz));
            for (int i = 0; i < NH; i++) {
                const __m512 qv = _mm512_loadu_ps(q + (size_t)i * D + 16 * j), m = _mm512_mul_ps(qv, sc);
                qs[i][j] = b == 4 ? _mm512_permutexvar_ps(perm, m) : m;
                bz[i] = _mm512_fmadd_ps(qv, z, bz[i]);
            }
        }
        for (int i = 0; i < NH; i++) bias[i] = _mm512_reduce_add_ps(bz[i]);
        /* steps of four positions; the last step of a block or of the
         * range may be short: it reads its rows padded with zero codes and
         * writes to part, so that a single inlined score4 serves every step */
        for (; t < te; t += 4) {
            const int n = te - t < 4 ? te - t : 4;
            const uint8_t *r4 = rows + (size_t)(t - bi * G) * k->row;
            float *o = out + (t - t0);
            int lo = ldo;
            prefetch_ahead(s->data, k->unit / (size_t)G, t, 4);
            if (n < 4) {
                memset(pad, 0, 4 * k->row);
                memcpy(pad, r4, (size_t)n * k->row);
                r4 = pad, o = part, lo = 4;
            }
            score4(r4, k->row, D, NH, b, qs, bias, sh, tab, o, lo);
            if (n < 4)
                for (int i = 0; i < NH; i++)
                    for (int r = 0; r < n; r++) out[(size_t)i * ldo + (t + r - t0)] = part[4 * i + r];
        }
        t = te;
    }
}

/* AVX-512 K score (d = 128 or 256): passes of four heads (d = 128, where
 * the call has them: prefill's 8 queries take two passes over the codes,
 * not four; the qs they hold past the registers are FMA memory operands),
 * two or one, each shape a separately inlined copy; then the window. */
AVX512 static void score_keys_avx512(const KVStream *s, const float *q, int nq, int t0, int t1, float *out, int ldo) {
    const int d = s->d, b = ((const Kivi *)s->aux)->b, nqt = n_quant(s, s->len), tq = t1 < nqt ? t1 : nqt;
    for (int h = 0, nh; h < nq && t0 < tq; h += nh) {
        const float *qh = q + (size_t)h * d;
        float *o = out + (size_t)h * ldo;
        nh = d == 256 ? 1 : nq - h >= 4 ? 4 : nq - h >= 2 ? 2 : 1;
        if (d == 256) {
            if (b == 2) score_pass(s, qh, 256, 1, 2, t0, tq, o, ldo);
            else score_pass(s, qh, 256, 1, 4, t0, tq, o, ldo);
        } else if (nh == 1) {
            if (b == 2) score_pass(s, qh, 128, 1, 2, t0, tq, o, ldo);
            else score_pass(s, qh, 128, 1, 4, t0, tq, o, ldo);
        } else if (nh == 2) {
            if (b == 2) score_pass(s, qh, 128, 2, 2, t0, tq, o, ldo);
            else score_pass(s, qh, 128, 2, 4, t0, tq, o, ldo);
        } else {
            if (b == 2) score_pass(s, qh, 128, 4, 2, t0, tq, o, ldo);
            else score_pass(s, qh, 128, 4, 4, t0, tq, o, ldo);
        }
    }
    score_window(s, q, nq, t0 > tq ? t0 : tq, t1, out, ldo, t0);
}

/* Positions whose weights accum_pass computes ahead of their sums. */
#define VTILE 64

/* Quantized value positions [t0, t1) for NH heads of D dims (NH·D <= 256),
 * b bits, groups of G = 16·2^k channels (G | D, so a chunk lies in one
 * group); p indexed from t0. Inlined with D, NH, b and W constants, W the
 * span of channels one stored weight covers: 16 for G = 16, else 32, so
 * that the two chunks of a span share one broadcast.
 * Per tile of VTILE positions, a first pass stores the weights p_i·s_g,
 * one per span, and sums p_i·z_g per group; a second pass decodes and
 * accumulates, its weights broadcast from stores long done (read back at
 * once, they wait on store forwarding: docs/kernel-notes.md#kivi-weights). */
AVX512_INLINE void accum_pass(const KVStream *s, const float *p, int ldp, const int D, const int NH, const int b,
                              const int W, int t0, int t1, float *acc) {
    const Kivi *k = s->aux;
    const int G = k->G, ng = D / G, nw = D / W;
    const __mmask16 gm = (__mmask16)((1u << ng) - 1);
    const __m512i sh = dec_shifts(b), perm = _mm512_loadu_si512(perm16), unperm = _mm512_loadu_si512(unperm16);
    const __m512 tab = dec_table(b);
    /* lane l of a span vector takes group l·W/G (W <= G, powers of two) */
    const __m512i span = _mm512_srlv_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                           _mm512_set1_epi32(__builtin_ctz((unsigned)(G / W))));
    /* a: acc in decode order; zs_i lane g = Σ_t p_i·z_g; wt: per position
     * and head, the nw weights (each store writes 16 lanes, the next one
     * overwriting the surplus, hence 16 floats of slack; NH·nw <= 16) */
    __m512 a[2][16], zs[2];
    float wt[VTILE * 16 + 16];
    for (int i = 0; i < NH; i++) {
        for (int j = 0; j < D / 16; j++) {
            const __m512 x = _mm512_loadu_ps(acc + (size_t)i * D + 16 * j);
            a[i][j] = b == 4 ? _mm512_permutexvar_ps(perm, x) : x;
        }
        zs[i] = _mm512_setzero_ps();
    }
    for (int ta = t0; ta < t1; ta += VTILE) {
        const int tn = t1 - ta < VTILE ? t1 - ta : VTILE;
        const uint8_t *base = s->data + (size_t)ta * k->unit;
        for (int t = 0; t < tn; t++) {
            const uint8_t *u = base + (size_t)t * k->unit;
            const __m512 sw = _mm512_permutexvar_ps(span, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(gm, u))),
                         zg = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(gm, u + 2 * (size_t)ng));
            for (int i = 0; i < NH; i++) {
                const __m512 w = _mm512_set1_ps(p[(size_t)i * ldp + (ta - t0 + t)]);
                _mm512_storeu_ps(wt + (t * NH + i) * nw, _mm512_mul_ps(w, sw));
                zs[i] = _mm512_fmadd_ps(w, zg, zs[i]);
            }
        }
        for (int t = 0; t < tn; t++) {
            const uint8_t *pc = base + (size_t)t * k->unit + 4 * (size_t)ng;
            const float *wp = wt + t * NH * nw;
            if ((t & 3) == 0) prefetch_ahead(s->data, k->unit, ta + t, 4);
            /* the chunks of a span load the same weight: one broadcast */
            for (int j = 0; j < D / 16; j++, pc += 2 * b) {
                const __m512 c = dec16(pc, b, sh, tab);
                for (int i = 0; i < NH; i++)
                    a[i][j] = _mm512_fmadd_ps(_mm512_set1_ps(wp[i * nw + 16 * j / W]), c, a[i][j]);
            }
        }
    }
    /* each chunk's group's zero sum, then back to channel order */
    float z[2][16];
    for (int i = 0; i < NH; i++) {
        _mm512_storeu_ps(z[i], zs[i]);
        for (int j = 0; j < D / 16; j++) {
            const __m512 x = _mm512_add_ps(a[i][j], _mm512_set1_ps(z[i][16 * j / G]));
            _mm512_storeu_ps(acc + (size_t)i * D + 16 * j, b == 4 ? _mm512_permutexvar_ps(unperm, x) : x);
        }
    }
}

/* accum_pass with its span W a constant. */
AVX512_INLINE void accum_spans(const KVStream *s, const float *p, int ldp, const int D, const int NH, const int b,
                               int t0, int t1, float *acc) {
    if (((const Kivi *)s->aux)->G == 16) accum_pass(s, p, ldp, D, NH, b, 16, t0, t1, acc);
    else accum_pass(s, p, ldp, D, NH, b, 32, t0, t1, acc);
}

/* AVX-512 V accumulate (d = 128 or 256, G % 16 == 0): passes as in
 * score_keys_avx512, each shape a separately inlined copy; then the window. */
AVX512 static void accum_values_avx512(const KVStream *s, const float *p, int ldp, int nq, int t0, int t1, float *acc) {
    const int d = s->d, b = ((const Kivi *)s->aux)->b, nqt = n_quant(s, s->len), tq = t1 < nqt ? t1 : nqt;
    for (int h = 0; h < nq && t0 < tq; h += 256 / d) {
        const float *ph = p + (size_t)h * ldp;
        float *ah = acc + (size_t)h * d;
        if (d == 256) {
            if (b == 2) accum_spans(s, ph, ldp, 256, 1, 2, t0, tq, ah);
            else accum_spans(s, ph, ldp, 256, 1, 4, t0, tq, ah);
        } else if (nq - h == 1) {
            if (b == 2) accum_spans(s, ph, ldp, 128, 1, 2, t0, tq, ah);
            else accum_spans(s, ph, ldp, 128, 1, 4, t0, tq, ah);
        } else {
            if (b == 2) accum_spans(s, ph, ldp, 128, 2, 2, t0, tq, ah);
            else accum_spans(s, ph, ldp, 128, 2, 4, t0, tq, ah);
        }
    }
    accum_window(s, p, ldp, nq, t0 > tq ? t0 : tq, t1, acc, t0);
}

/* Keys have the factored fast path; a V stream is scored by the reference. */
static void kivi_score(const KVStream *s, const float *q, int nq, int t0, int t1, float *out, int ldo) {
    if (s->role != 0) kv_score_ref(s, q, nq, t0, t1, out, ldo);
    else if (kernels_level() >= 2 && (s->d == 128 || s->d == 256)) score_keys_avx512(s, q, nq, t0, t1, out, ldo);
    else if (kernels_level() == 1 && s->d == 128 && !score_keys_w16_avx2(s, q, nq, t0, t1, out, ldo)) return;
    else if (kernels_level() > 0 && s->d % 8 == 0) score_keys_avx2(s, q, nq, t0, t1, out, ldo);
    else score_keys_c(s, q, nq, t0, t1, out, ldo);
}

/* Values have the factored fast path; a K stream is summed by the reference. */
static void kivi_accum(const KVStream *s, const float *p, int ldp, int nq, int t0, int t1, float *acc) {
    const Kivi *k = s->aux;
    if (s->role != 1) kv_accum_ref(s, p, ldp, nq, t0, t1, acc);
    else if (kernels_level() >= 2 && (s->d == 128 || s->d == 256) && k->G % 16 == 0)
        accum_values_avx512(s, p, ldp, nq, t0, t1, acc);
    else if (kernels_level() > 0 && k->G % 8 == 0) accum_values_avx2(s, p, ldp, nq, t0, t1, acc);
    else accum_values_c(s, p, ldp, nq, t0, t1, acc);
}
#elif defined(__aarch64__)
#include <arm_neon.h>

/* ---- NEON: the AVX2 paths in 4-lane vectors (d % 8 == 0, G % 8 == 0) -----
 * 8 codes a step from their b bytes: the little-endian word broadcast,
 * each lane shifted right to its own code (ushl by a negative count) and
 * masked, as two vectors of 4 (codes c..c+3 and c+4..c+7). A key row's dot
 * keeps one accumulator per half, added once at the end. */
static inline void unpack8n(const uint8_t *p, int b, const int32x4_t sh[2], uint32x4_t mask, float32x4_t v[2]) {
    uint32_t w = 0;
    memcpy(&w, p, (size_t)b); /* 8 codes of b bits: b bytes */
    const uint32x4_t x = vdupq_n_u32(w);
    v[0] = vcvtq_f32_u32(vandq_u32(vshlq_u32(x, sh[0]), mask));
    v[1] = vcvtq_f32_u32(vandq_u32(vshlq_u32(x, sh[1]), mask));
}

static inline void shifts_n(int b, int32x4_t sh[2]) {
    const int32_t s[8] = {0, -b, -2 * b, -3 * b, -4 * b, -5 * b, -6 * b, -7 * b};
    sh[0] = vld1q_s32(s);
    sh[1] = vld1q_s32(s + 4);
}

/* ---- quantizers: the AVX2 ones (above) in 4 lanes, d % 4 == 0, G % 4 == 0.
 * vminq_f32 orders -0 below +0 and passes NaNs on, unlike the loop's test,
 * so keys take the test itself (vbsl on vclt); values stay on vminq /
 * vmaxq, as the groups that could tell (a NaN, a min of 0) go to plain C. */
static inline float32x4_t min4(float32x4_t v, float32x4_t m) { return vbslq_f32(vcltq_f32(v, m), v, m); }
static inline float32x4_t max4(float32x4_t v, float32x4_t m) { return vbslq_f32(vcgtq_f32(v, m), v, m); }

/* quant_group's second loop for 4 values. */
static inline uint32x4_t codes4(float32x4_t x, float32x4_t sc, float32x4_t z, float32x4_t top) {
    const float32x4_t zero = vdupq_n_f32(0);
    float32x4_t u = vdivq_f32(vsubq_f32(x, z), sc);
    u = vreinterpretq_f32_u32(vandq_u32(vcgtq_f32(sc, zero), vreinterpretq_u32_f32(u)));
    u = max4(u, zero);
    u = min4(u, top);
    return vcvtq_u32_f32(vaddq_f32(u, vdupq_n_f32(0.5f)));
}

/* The codes of channels c..c+3 (c % 4 == 0) into their b / 2 bytes of row:
 * lane j shifted to bit j·b, the lanes summed (their bits are disjoint). */
static inline void put4(uint8_t *row, int c, int b, uint32x4_t q) {
    const int32_t sh[4] = {0, b, 2 * b, 3 * b};
    const uint32_t w = vaddvq_u32(vshlq_u32(q, vld1q_s32(sh)));
    memcpy(row + c * b / 8, &w, (size_t)b / 2);
}

static void flush_keys_neon(KVStream *s, int t0) {
    const Kivi *k = s->aux;
    const int d = s->d, G = k->G, b = k->b;
    const float32x4_t top = vdupq_n_f32((float)((1 << b) - 1));
    const float *x[KV_MAX_DIM]; /* the block's tokens in the ring */
    for (int tb = t0; tb < t0 + k->R; tb += G) {
        uint8_t *blk = s->data + (size_t)(tb / G) * k->unit, *rows = blk + 4 * (size_t)d;
        memset(rows, 0, (size_t)G * k->row);
        for (int i = 0; i < G; i++) x[i] = slot(s, tb + i);
        for (int c = 0; c < d; c += 4) {
            float32x4_t mn = vld1q_f32(x[0] + c), mx = mn;
            for (int i = 1; i < G; i++) {
                const float32x4_t v = vld1q_f32(x[i] + c);
                mn = min4(v, mn);
                mx = max4(v, mx);
            }
            const float32x4_t range = vdivq_f32(vsubq_f32(mx, mn), top);
            if (vminvq_u32(vandq_u32(vceqq_f32(range, range), vceqq_f32(mn, mn))) == 0) {
                for (int j = c; j < c + 4; j++) key_channel(s, blk, tb, j);
                continue;
            }
            const float16x4_t sh = vcvt_f16_f32(range), zh = vcvt_f16_f32(mn);
            /* bytewise: a block starts at an odd offset when G and a row's bytes are odd */
            vst1_u8(blk + 2 * (size_t)c, vreinterpret_u8_f16(sh));
            vst1_u8(blk + 2 * (size_t)(d + c), vreinterpret_u8_f16(zh));
            const float32x4_t sc = vcvt_f32_f16(sh), z = vcvt_f32_f16(zh);
            for (int i = 0; i < G; i++) put4(rows + (size_t)i * k->row, c, b, codes4(vld1q_f32(x[i] + c), sc, z, top));
        }
    }
}

static void quant_value_neon(KVStream *s, int t) {
    const Kivi *k = s->aux;
    const int G = k->G, ng = s->d / G, b = k->b;
    const float topf = (float)((1 << b) - 1);
    const float32x4_t top = vdupq_n_f32(topf);
    uint8_t *u = s->data + (size_t)t * k->unit, *row = u + 4 * (size_t)ng;
    const float *x = slot(s, t);
    memset(row, 0, k->row);
    for (int g = 0; g < ng; g++) {
        const float *v = x + (size_t)g * G;
        float32x4_t mn = vld1q_f32(v), mx = mn;
        uint32x4_t ok = vceqq_f32(mn, mn);
        for (int c = 4; c < G; c += 4) {
            const float32x4_t w = vld1q_f32(v + c);
            mn = vminq_f32(w, mn);
            mx = vmaxq_f32(w, mx);
            ok = vandq_u32(ok, vceqq_f32(w, w));
        }
        const float lo = vminvq_f32(mn), hi = vmaxvq_f32(mx);
        if (vminvq_u32(ok) == 0 || lo == 0) {
            value_group(s, u, x, g);
            continue;
        }
        const uint16_t sh = f32_to_f16((hi - lo) / topf), zh = f32_to_f16(lo);
        memcpy(u + 2 * (size_t)g, &sh, 2);
        memcpy(u + 2 * (size_t)(ng + g), &zh, 2);
        const float32x4_t sc = vdupq_n_f32(f16_to_f32(sh)), z = vdupq_n_f32(f16_to_f32(zh));
        for (int c = 0; c < G; c += 4) put4(row, g * G + c, b, codes4(vld1q_f32(v + c), sc, z, top));
    }
}

static void flush_keys_fast(KVStream *s, int t0) {
    if (kernels_level() > 0 && s->d % 4 == 0) flush_keys_neon(s, t0);
    else flush_keys(s, t0);
}

static void quant_value_fast(KVStream *s, int t) {
    const Kivi *k = s->aux;
    if (kernels_level() > 0 && k->G % 4 == 0) quant_value_neon(s, t);
    else quant_value(s, t);
}

/* prep_block with the scales and zeros widened 4 at a time. */
static void prep_block_neon(const KVStream *s, const uint8_t *blk, const float *q, int nh, float (*qs)[KV_MAX_DIM],
                            float *bias) {
    const int d = s->d;
    const uint16_t *sc = (const uint16_t *)blk, *z = sc + d;
    for (int i = 0; i < nh; i++) {
        const float *qi = q + (size_t)i * d;
        float32x4_t bz = vdupq_n_f32(0);
        for (int c = 0; c < d; c += 4) {
            const float32x4_t qv = vld1q_f32(qi + c);
            vst1q_f32(qs[i] + c, vmulq_f32(qv, vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(sc + c)))));
            bz = vfmaq_f32(bz, qv, vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(z + c))));
        }
        bias[i] = vaddvq_f32(bz);
    }
}

static void score_keys_neon(const KVStream *s, const float *q, int nq, int t0, int t1, float *out, int ldo) {
    const Kivi *k = s->aux;
    const int d = s->d, b = k->b, nqt = n_quant(s, s->len), tq = t1 < nqt ? t1 : nqt;
    int32x4_t sh[2];
    shifts_n(b, sh);
    const uint32x4_t mask = vdupq_n_u32((1u << b) - 1);
    float qs[HEADS][KV_MAX_DIM], bias[HEADS];
    for (int h0 = 0; h0 < nq && t0 < tq; h0 += HEADS) {
        const int nh = nq - h0 < HEADS ? nq - h0 : HEADS;
        for (int t = t0; t < tq;) {
            const int bi = t / k->G, te = (bi + 1) * k->G < tq ? (bi + 1) * k->G : tq;
            const uint8_t *blk = s->data + (size_t)bi * k->unit, *rows = blk + 4 * (size_t)d;
            prep_block_neon(s, blk, q + (size_t)h0 * d, nh, qs, bias);
            for (; t < te; t++) {
                const uint8_t *pc = rows + (size_t)(t - bi * k->G) * k->row;
                float32x4_t a0[HEADS], a1[HEADS];
                for (int i = 0; i < nh; i++) a0[i] = a1[i] = vdupq_n_f32(0);
                for (int c = 0; c < d; c += 8, pc += b) {
                    float32x4_t cf[2];
                    unpack8n(pc, b, sh, mask, cf);
                    for (int i = 0; i < nh; i++) {
                        a0[i] = vfmaq_f32(a0[i], vld1q_f32(qs[i] + c), cf[0]);
                        a1[i] = vfmaq_f32(a1[i], vld1q_f32(qs[i] + c + 4), cf[1]);
                    }
                }
                for (int i = 0; i < nh; i++)
                    out[(size_t)(h0 + i) * ldo + (t - t0)] = vaddvq_f32(vaddq_f32(a0[i], a1[i])) + bias[i];
            }
        }
    }
    score_window(s, q, nq, t0 > tq ? t0 : tq, t1, out, ldo, t0);
}

/* accum_values_c with each 8-code chunk unpacked once for every head. */
static void accum_values_neon(const KVStream *s, const float *p, int ldp, int nq, int t0, int t1, float *acc) {
    const Kivi *k = s->aux;
    const int d = s->d, G = k->G, ng = d / G, b = k->b, nqt = n_quant(s, s->len), tq = t1 < nqt ? t1 : nqt;
    int32x4_t sh[2];
    shifts_n(b, sh);
    const uint32x4_t mask = vdupq_n_u32((1u << b) - 1);
    float zs[HEADS][KV_MAX_DIM];
    for (int h0 = 0; h0 < nq && t0 < tq; h0 += HEADS) {
        const int nh = nq - h0 < HEADS ? nq - h0 : HEADS;
        for (int i = 0; i < nh; i++) memset(zs[i], 0, (size_t)ng * sizeof(float));
        for (int t = t0; t < tq; t++) {
            const uint8_t *u = s->data + (size_t)t * k->unit, *row = u + 4 * (size_t)ng;
            for (int g = 0; g < ng; g++) {
                const float sg = ld16(u, g), zg = ld16(u, ng + g);
                float ws[HEADS];
                for (int i = 0; i < nh; i++) {
                    const float w = p[(size_t)(h0 + i) * ldp + (t - t0)];
                    ws[i] = w * sg;
                    zs[i][g] += w * zg;
                }
                const uint8_t *pc = row + (size_t)g * G * b / 8;
                for (int c = g * G; c < (g + 1) * G; c += 8, pc += b) {
                    float32x4_t cf[2];
                    unpack8n(pc, b, sh, mask, cf);
                    for (int i = 0; i < nh; i++) {
                        float *ai = acc + (size_t)(h0 + i) * d + c;
                        vst1q_f32(ai, vfmaq_n_f32(vld1q_f32(ai), cf[0], ws[i]));
                        vst1q_f32(ai + 4, vfmaq_n_f32(vld1q_f32(ai + 4), cf[1], ws[i]));
                    }
                }
            }
        }
        for (int i = 0; i < nh; i++) add_zero_sums(acc + (size_t)(h0 + i) * d, zs[i], d, G);
    }
    accum_window(s, p, ldp, nq, t0 > tq ? t0 : tq, t1, acc, t0);
}

static void kivi_score(const KVStream *s, const float *q, int nq, int t0, int t1, float *out, int ldo) {
    if (s->role != 0) kv_score_ref(s, q, nq, t0, t1, out, ldo);
    else if (kernels_level() > 0 && s->d % 8 == 0) score_keys_neon(s, q, nq, t0, t1, out, ldo);
    else score_keys_c(s, q, nq, t0, t1, out, ldo);
}

static void kivi_accum(const KVStream *s, const float *p, int ldp, int nq, int t0, int t1, float *acc) {
    const Kivi *k = s->aux;
    if (s->role != 1) kv_accum_ref(s, p, ldp, nq, t0, t1, acc);
    else if (kernels_level() > 0 && k->G % 8 == 0) accum_values_neon(s, p, ldp, nq, t0, t1, acc);
    else accum_values_c(s, p, ldp, nq, t0, t1, acc);
}
#else
/* Other CPUs: the same, in plain C. */
static void flush_keys_fast(KVStream *s, int t0) { flush_keys(s, t0); }
static void quant_value_fast(KVStream *s, int t) { quant_value(s, t); }

static void kivi_score(const KVStream *s, const float *q, int nq, int t0, int t1, float *out, int ldo) {
    if (s->role != 0) kv_score_ref(s, q, nq, t0, t1, out, ldo);
    else score_keys_c(s, q, nq, t0, t1, out, ldo);
}

static void kivi_accum(const KVStream *s, const float *p, int ldp, int nq, int t0, int t1, float *acc) {
    if (s->role != 1) kv_accum_ref(s, p, ldp, nq, t0, t1, acc);
    else accum_values_c(s, p, ldp, nq, t0, t1, acc);
}
#endif /* __x86_64__, __aarch64__ */

const KVScheme kv_kivi2 = {
    .name = "kivi2", .desc = "KIVI 2-bit: K per channel, V per token, f32 window (g32:r128)",
    .bits = kivi2_bits, .check = kivi_check, .init = kivi2_init, .free = kivi_free,
    .append = kivi_append, .truncate = kivi_truncate, .dequant = kivi_dequant,
    .score = kivi_score, .accum = kivi_accum, .bytes = kivi_bytes, .windowed = 1, .settled = kivi_settled,
    .save_bytes = kivi_save_bytes, .save = kivi_save, .load = kivi_load, .score_err = 5e-4f, .score_int = kivi_score_int,
};

const KVScheme kv_kivi4 = {
    .name = "kivi4", .desc = "KIVI 4-bit: K per channel, V per token, f32 window (g32:r128)",
    .bits = kivi4_bits, .check = kivi_check, .init = kivi4_init, .free = kivi_free,
    .append = kivi_append, .truncate = kivi_truncate, .dequant = kivi_dequant,
    .score = kivi_score, .accum = kivi_accum, .bytes = kivi_bytes, .windowed = 1, .settled = kivi_settled,
    .save_bytes = kivi_save_bytes, .save = kivi_save, .load = kivi_load, .score_err = 5e-4f, .score_int = kivi_score_int,
};
