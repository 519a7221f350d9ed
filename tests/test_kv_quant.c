/* test_kv_quant.c: scheme-specific tests for q8, q4 and KIVI, beyond the
 * registry-wide properties of test_kv.c: ggml block layouts byte for byte,
 * KIVI's flush boundaries, options, constant input, rollback across a
 * window flush, and the factored score / accumulate against the reference
 * on both kernel paths (plain C and AVX2).
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/half.h"
#include "kernels/matmul.h"
#include "kv/kv.h"

#define TEST_SEED 0x9E3779B97F4A7C15ULL
#include "tests/util.h"

/* Opens a stream from a -kv spec string ("kivi2:g16:r64"), role 0 = K, 1 = V. */
static void open_spec(KVStream *s, const char *spec, int d, int cap, int role) {
    KVSpec sp;
    char err[256];
    cr_assert_eq(kv_spec_parse(spec, &sp, err, sizeof err), 0, "%s", err);
    cr_assert_eq(kv_stream_init(s, sp.k, &sp.ko, d, cap, 0, role, err, sizeof err), 0, "%s: %s", spec, err);
}

static uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }

/* ---- q8 / q4: ggml blocks (q8's in tiles of 16 positions) ---- */

/* Code j of position t in a q8 tile at d = 64, as kv/q8.c draws it: after
 * 64 bytes of scales, K keeps 4 values of all 16 positions per 64-byte
 * line, V interleaves positions 2i and 2i+1 byte by byte. */
static int8_t q8_code(const KVStream *s, int t, int j) {
    return (int8_t)(s->role == 0 ? s->data[64 + (j / 4) * 64 + 4 * t + j % 4] : s->data[64 + (t / 2) * 128 + 2 * j + t % 2]);
}

Test(kv_quant, q8_block_layout) {
    /* block 0: amax 127 gives d = 1 exactly, so codes are roundf(x), ties away from 0;
     * block 1: all zero gives d = 0 and zero codes, no NaN; position 1
     * holds -x, so that both of a V pair's bytes are seen */
    float x[2][64] = {{0}};
    const float v[8] = {127, -127, 0.5f, -0.5f, 2.49f, -63.5f, 1.5f, 100.2f};
    const int8_t want[8] = {127, -127, 1, -1, 2, -64, 2, 100};
    for (int j = 0; j < 8; j++) x[0][3 * j + 1] = v[j], x[1][3 * j + 1] = -v[j];
    for (int role = 0; role < 2; role++) {
        KVStream s;
        open_spec(&s, "q8", 64, 2, role);
        kv_stream_append(&s, x[0]);
        kv_stream_append(&s, x[1]);
        /* scales: fp16 [block][16 positions] */
        for (int t = 0; t < 2; t++) {
            cr_assert_eq(rd16(s.data + 2 * t), 0x3C00, "role %d t=%d d: %04x, expected fp16 1.0", role, t,
                         rd16(s.data + 2 * t));
            cr_expect_eq(rd16(s.data + 32 + 2 * t), 0, "all-zero block must have d = 0");
        }
        for (int t = 0; t < 2; t++)
            for (int j = 0; j < 64; j++) {
                const int8_t e = j % 3 == 1 && j / 3 < 8 ? want[j / 3] : 0;
                cr_expect_eq(q8_code(&s, t, j), t ? -e : e, "role %d t=%d q[%d] = %d, expected %d", role, t, j,
                             q8_code(&s, t, j), t ? -e : e);
            }
        float y[64];
        for (int t = 0; t < 2; t++) {
            s.scheme->dequant(&s, t, y);
            for (int j = 0; j < 64; j++) cr_expect(!isnan(y[j]) && y[j] == (j < 32 ? q8_code(&s, t, j) : 0));
        }
        kv_stream_free(&s);
    }
}

/* ggml q4_0 with the largest-|x| element negative: d = m / -8 > 0, so m
 * itself maps to code 0 and the positive side saturates at code 15. */
Test(kv_quant, q4_block_layout_negative_max) {
    KVStream s;
    open_spec(&s, "q4", 32, 1, 0);
    float x[32] = {0};
    x[5] = -8;    /* max |x|, negative: d = 1 */
    x[0] = 7;     /* 15.5 -> 15 */
    x[1] = 7.6f;  /* 16.1 -> 16 -> min 15 */
    x[2] = 3.2f;  /* 11.7 -> 11 */
    x[3] = -0.4f; /* 8.1 -> 8 */
    x[4] = -0.6f; /* 7.9 -> 7 (the cast truncates) */
    x[16] = -7.9f; /* 0.6 -> 0, high nibble of qs[0] */
    x[21] = 1;    /* 9.5 -> 9, high nibble of qs[5] */
    x[31] = -3;   /* 5.5 -> 5, high nibble of qs[15] */
    kv_stream_append(&s, x);
    const uint8_t want[16] = {0x0F, 0x8F, 0x8B, 0x88, 0x87, 0x90, 0x88, 0x88,
                              0x88, 0x88, 0x88, 0x88, 0x88, 0x88, 0x88, 0x58};
    cr_expect_eq(rd16(s.data), 0x3C00, "q4 d: %04x, expected fp16 1.0", rd16(s.data));
    for (int j = 0; j < 16; j++) cr_expect_eq(s.data[2 + j], want[j], "qs[%d] = %02x, expected %02x", j, s.data[2 + j], want[j]);
    float y[32];
    s.scheme->dequant(&s, 0, y);
    cr_expect_eq(y[5], -8.0f, "the extreme value is exact");
    cr_expect_eq(y[1], 7.0f, "saturated at code 15: (15 - 8) * 1");
    cr_expect_eq(y[16], -8.0f);
    kv_stream_free(&s);
}

Test(kv_quant, q4_block_layout_positive_max_and_tie) {
    KVStream s;
    open_spec(&s, "q4", 64, 1, 0);
    float x[64] = {0};
    x[0] = 16;   /* max |x| positive: d = -2, x = 16 -> code 0 */
    x[1] = -14;  /* 7 + 8.5 -> 15 */
    x[2] = 1;    /* -0.5 + 8.5 = 8 */
    x[32] = 3;   /* block 1: tie |3| = |-3|, the first wins: d = -0.375 */
    x[33] = -3;
    kv_stream_append(&s, x);
    cr_expect_eq(rd16(s.data), 0xC000, "d = -2: %04x", rd16(s.data));
    cr_expect_eq(s.data[2], 0x80);
    cr_expect_eq(s.data[3], 0x8F);
    cr_expect_eq(s.data[4], 0x88);
    cr_expect_eq(rd16(s.data + 18), f32_to_f16(-0.375f), "tie: %04x", rd16(s.data + 18));
    float y[64];
    s.scheme->dequant(&s, 0, y);
    cr_expect_eq(y[0], 16.0f);
    cr_expect_eq(y[1], -14.0f);
    cr_expect_eq(y[32], 3.0f);
    kv_stream_free(&s);
}

/* q4's blocks byte for byte on every level the CPU has against plain C's,
 * on the inputs the SIMD quantizers must treat as quantize_block does:
 * NaNs (skipped by the largest |x|, code 0 after the clamp), infinities
 * (1 / d = 0, so inf * 0 = NaN -> code 0), subnormal blocks (1 / d
 * infinite), an all-zero block, a tie in |x| with both signs, and codes
 * on both clamps. */
Test(kv_quant, q4_bytes_same_on_every_isa) {
    enum { NB = 8 };
    static float x[NB][32];
    for (int b = 0; b < NB; b++)
        for (int j = 0; j < 32; j++) x[b][j] = (float)(grand() * 3);
    x[0][3] = NAN, x[0][20] = -NAN, x[0][27] = NAN, x[0][28] = NAN; /* NaNs in the last 8 too */
    x[1][7] = INFINITY;
    x[2][9] = -INFINITY, x[2][30] = NAN;
    for (int j = 0; j < 32; j++) x[3][j] *= 1e-39f, x[4][j] = 0, x[5][j] = (float)(j % 17) - 8;
    x[6][2] = 9, x[6][25] = -9;
    x[7][0] = -1e30f, x[7][31] = 1e30f;
    const char *isa = kernels_isa();
    uint8_t want[NB * 18];
    for (int k = 0; k < N_ISAS; k++) {
        if (kernels_set_isa(all_isas[k])) continue;
        KVStream s;
        open_spec(&s, "q4", 32 * NB, 1, 1);
        kv_stream_append(&s, x[0]);
        if (k == 0) memcpy(want, s.data, sizeof want);
        else
            for (int b = 0; b < NB; b++)
                cr_expect(!memcmp(s.data + 18 * b, want + 18 * b, 18), "%s: block %d differs from plain C's", all_isas[k], b);
        kv_stream_free(&s);
    }
    cr_assert_eq(kernels_set_isa(isa), 0);
}

Test(kv_quant, block_schemes_refuse_odd_dims) {
    KVOpts o = {0, 0};
    char err[256] = "";
    for (int k = 0; k < 2; k++) {
        const KVScheme *sc = kv_find(k ? "q4" : "q8");
        cr_assert(sc);
        err[0] = 0;
        cr_expect_eq(sc->check(48, &o, err, sizeof err), -1);
        cr_expect(strstr(err, "multiple of 32") && !strchr(err, '\n'), "%s", err);
        KVOpts g = {32, 0};
        cr_expect_eq(sc->check(64, &g, err, sizeof err), -1, "%s takes no options", sc->name);
    }
}

/* ---- KIVI ---- */

/* The spec's group quantizer written out independently: fp16 s and z,
 * codes from them, round to nearest; out[i] = x̂ of v[i*stride]. */
static void ref_group(const float *v, int n, int stride, int b, float *out, int ostride) {
    const float top = (float)((1 << b) - 1);
    float mn = v[0], mx = v[0];
    for (int i = 0; i < n; i++) {
        mn = fminf(mn, v[i * stride]);
        mx = fmaxf(mx, v[i * stride]);
    }
    float s = f16_to_f32(f32_to_f16((mx - mn) / top)), z = f16_to_f32(f32_to_f16(mn));
    for (int i = 0; i < n; i++) {
        float u = s > 0 ? (v[i * stride] - z) / s : 0;
        u = u < 0 ? 0 : u > top ? top : u;
        out[i * ostride] = (float)(int)(u + 0.5f) * s + z;
    }
}

/* What a KIVI stream of len tokens x[len][d] must hold: K quantizes the
 * first len - len % R tokens per channel in G-token groups, V all but the
 * last R per token in G-channel groups; the rest is x itself. */
static void ref_state(const float *x, int len, int d, int b, int G, int R, int role, float *out) {
    memcpy(out, x, sizeof(float) * len * d);
    if (role == 0) {
        for (int t = 0; t < len - len % R; t += G)
            for (int c = 0; c < d; c++) ref_group(x + t * d + c, G, d, b, out + t * d + c, d);
    } else {
        for (int t = 0; t < len - R; t++)
            for (int c = 0; c < d; c += G) ref_group(x + t * d + c, G, 1, b, out + t * d + c, 1);
    }
}

/* Every position of s against ref_state, bitwise; returns how many of them
 * came back exactly as x (that is, are in the full-precision window). */
static int expect_state(const KVStream *s, const float *x, int b, int G, int R, const char *what) {
    const int d = s->d, len = s->len;
    float *want = malloc(sizeof(float) * len * d), y[KV_MAX_DIM];
    int exact = 0;
    ref_state(x, len, d, b, G, R, s->role, want);
    for (int t = 0; t < len; t++) {
        s->scheme->dequant(s, t, y);
        cr_expect(memcmp(y, want + t * d, sizeof(float) * d) == 0, "%s role %d len %d: t=%d differs from the spec",
                  what, s->role, len, t);
        exact += memcmp(y, x + t * d, sizeof(float) * d) == 0;
    }
    free(want);
    return exact;
}

Test(kv_quant, kivi_flush_boundaries) {
    const int d = 64, Ls[] = {100, 127, 128, 129, 255, 256, 300, 700};
    for (int b = 2; b <= 4; b += 2)
        for (size_t li = 0; li < sizeof Ls / sizeof Ls[0]; li++) {
            const int L = Ls[li];
            float *x = malloc(sizeof(float) * L * d);
            fill(x, L * d);
            for (int role = 0; role < 2; role++) {
                KVStream s;
                open_spec(&s, b == 2 ? "kivi2" : "kivi4", d, L, role);
                for (int t = 0; t < L; t++) kv_stream_append(&s, x + t * d);
                int exact = expect_state(&s, x, b, 32, 128, s.scheme->name);
                /* Gaussian data: a quantized token is never exact, a window token always */
                int window = role == 0 ? L % 128 : (L < 128 ? L : 128);
                cr_expect_eq(exact, window, "%s role %d L=%d: %d exact positions, expected %d", s.scheme->name, role,
                             L, exact, window);
                kv_stream_free(&s);
            }
            free(x);
        }
}

Test(kv_quant, kivi_options_parsed) {
    KVSpec sp;
    char err[256], name[64];
    cr_assert_eq(kv_spec_parse("kivi2:g16:r64", &sp, err, sizeof err), 0, "%s", err);
    cr_expect_eq(sp.ko.group, 16);
    cr_expect_eq(sp.ko.residual, 64);
    kv_spec_name(&sp, name, sizeof name);
    cr_expect_str_eq(name, "kivi2:g16:r64");
    const int d = 64, L = 200;
    float *x = malloc(sizeof(float) * L * d);
    fill(x, L * d);
    for (int role = 0; role < 2; role++) {
        KVStream s;
        open_spec(&s, "kivi2:g16:r64", d, 256, role);
        /* K: 16 blocks of (4·64 + 16·16) bytes; ring min(256, 64 + 64) x 64 x 4; V: the same total */
        cr_expect_eq(s.scheme->bytes(&s), (size_t)16 * 512 + 128 * 64 * 4, "role %d: %zu bytes", role,
                     s.scheme->bytes(&s));
        for (int t = 0; t < L; t++) {
            kv_stream_append(&s, x + t * d);
            if (t == 62 || t == 63 || t == 64 || t == L - 1) expect_state(&s, x, 2, 16, 64, "g16:r64");
        }
        kv_stream_free(&s);
    }
    free(x);
    /* refusals, each one line */
    const char *bad[] = {"kivi4:g48:r64", "kivi2:g64:r32", "kivi2:g24:r48"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cr_assert_eq(kv_spec_parse(bad[i], &sp, err, sizeof err), 0, "%s", err);
        err[0] = 0;
        cr_expect_eq(sp.k->check(64, &sp.ko, err, sizeof err), -1, "%s accepted for d=64", bad[i]);
        cr_expect(strlen(err) > 0 && !strchr(err, '\n'), "%s: '%s'", bad[i], err);
    }
    KVOpts o = {0, 0};
    cr_expect_eq(kv_find("kivi2")->check(48, &o, err, sizeof err), -1, "d=48 with G=32");
    cr_expect(strstr(err, "multiple of group") != NULL, "%s", err);
}

/* Constant groups have s = 0: codes 0, x̂ = z, exact for an fp16 value and
 * never NaN; a non-fp16 constant comes back as its fp16 rounding. */
Test(kv_quant, kivi_constant_input_exact) {
    const int d = 128, L = 300;
    float x[KV_MAX_DIM], y[KV_MAX_DIM];
    for (int b = 2; b <= 4; b += 2)
        for (int role = 0; role < 2; role++) {
            KVStream s, u;
            open_spec(&s, b == 2 ? "kivi2" : "kivi4", d, L, role);
            open_spec(&u, b == 2 ? "kivi2" : "kivi4", d, L, role);
            /* s: 0.375 everywhere; u: one constant per channel (K groups constant, V groups not) */
            for (int t = 0; t < L; t++) {
                for (int c = 0; c < d; c++) x[c] = 0.375f;
                kv_stream_append(&s, x);
                for (int c = 0; c < d; c++) x[c] = (c % 7) * 0.25f - 1;
                kv_stream_append(&u, x);
            }
            for (int t = 0; t < L; t++) {
                s.scheme->dequant(&s, t, y);
                for (int c = 0; c < d; c++) cr_expect(y[c] == 0.375f, "b=%d role %d t=%d c=%d: %g", b, role, t, c, y[c]);
                if (role == 0) {
                    u.scheme->dequant(&u, t, y);
                    for (int c = 0; c < d; c++) cr_expect(y[c] == (c % 7) * 0.25f - 1, "per-channel constant t=%d", t);
                }
            }
            kv_stream_free(&s);
            kv_stream_free(&u);
            open_spec(&s, b == 2 ? "kivi2" : "kivi4", d, L, role);
            for (int c = 0; c < d; c++) x[c] = 0.1f;
            for (int t = 0; t < L; t++) kv_stream_append(&s, x);
            s.scheme->dequant(&s, 0, y);
            cr_expect(y[0] == f16_to_f32(f32_to_f16(0.1f)), "0.1 -> %.9g", y[0]);
            kv_stream_free(&s);
        }
}

/* Appends x[0..n1) then junk, truncates to n0, appends x[n0..n2): the state
 * must equal a stream that only ever saw x[0..n2), and equal the spec. */
static void rollback_case(const char *spec, int b, int G, int R, int role, int n0, int junk, int n2) {
    const int d = 64, cap = n2 + junk + 8;
    float *x = malloc(sizeof(float) * cap * d), *j = malloc(sizeof(float) * junk * d);
    fill(x, cap * d);
    fill(j, junk * d);
    KVStream a, f;
    open_spec(&a, spec, d, cap, role);
    open_spec(&f, spec, d, cap, role);
    for (int t = 0; t < n0; t++) kv_stream_append(&a, x + t * d);
    for (int t = 0; t < junk; t++) kv_stream_append(&a, j + t * d);
    cr_assert_eq(kv_stream_truncate(&a, n0), 0, "%s: truncate %d -> %d refused", spec, n0 + junk, n0);
    /* right after the rollback the shorter stream is already what the spec says */
    expect_state(&a, x, b, G, R, spec);
    for (int t = n0; t < n2; t++) kv_stream_append(&a, x + t * d);
    for (int t = 0; t < n2; t++) kv_stream_append(&f, x + t * d);
    float ya[KV_MAX_DIM], yf[KV_MAX_DIM];
    for (int t = 0; t < n2; t++) {
        a.scheme->dequant(&a, t, ya);
        f.scheme->dequant(&f, t, yf);
        cr_expect(memcmp(ya, yf, sizeof(float) * d) == 0, "%s role %d: %d+%d -> %d -> %d differs at t=%d", spec, role,
                  n0, junk, n0, n2, t);
    }
    expect_state(&a, x, b, G, R, spec);
    kv_stream_free(&a);
    kv_stream_free(&f);
    free(x);
    free(j);
}

Test(kv_quant, kivi_rollback_across_flush) {
    for (int role = 0; role < 2; role++) {
        /* len 130 -> 127: the flushed block 0..127 comes back into the window */
        rollback_case("kivi2", 2, 32, 128, role, 127, 3, 260);
        rollback_case("kivi4", 4, 32, 128, role, 127, 3, 260);
        /* the deepest rollback, across the flush at 256 and the V FIFO's edge */
        rollback_case("kivi2", 2, 32, 128, role, 200, KV_MAX_ROLLBACK, 400);
        rollback_case("kivi2", 2, 32, 128, role, 255, 1, 300);
        rollback_case("kivi2", 2, 32, 128, role, 256, KV_MAX_ROLLBACK, 300);
        /* R < 64: one rollback spans several flushes */
        rollback_case("kivi2:g16:r16", 2, 16, 16, role, 36, KV_MAX_ROLLBACK, 150);
        rollback_case("kivi4:g8:r32", 4, 8, 32, role, 100, 50, 250);
        /* reset */
        rollback_case("kivi2", 2, 32, 128, role, 0, 60, 200);
    }
    KVStream s;
    float x[64] = {0};
    open_spec(&s, "kivi2", 64, 300, 0);
    for (int t = 0; t < 200; t++) kv_stream_append(&s, x);
    cr_expect_eq(kv_stream_truncate(&s, 200 - KV_MAX_ROLLBACK - 1), -1, "deeper than KV_MAX_ROLLBACK");
    kv_stream_free(&s);
}

/* The fast paths (zero point factored per group; codes against q·s) against
 * the dequantize reference, relative to the size of the terms summed. */
static void fast_vs_ref(const char *spec, int role, int d, int L, int nq) {
    KVStream s;
    open_spec(&s, spec, d, L, role);
    float *x = malloc(sizeof(float) * L * d), *q = malloc(sizeof(float) * nq * d);
    fill(x, L * d);
    /* an offset per channel, so that zero points are far from 0 */
    for (int t = 0; t < L; t++)
        for (int c = 0; c < d; c++) x[t * d + c] += (float)(c % 5) - 2;
    fill(q, nq * d);
    for (int t = 0; t < L; t++) kv_stream_append(&s, x + t * d);
    const int t0 = 3, t1 = L - 2, n = t1 - t0;
    float *a = malloc(sizeof(float) * nq * n), *r = malloc(sizeof(float) * nq * n), y[KV_MAX_DIM];
    kv_score(&s, q, nq, t0, t1, a, n);
    /* an integer path is held to its plain C twin to the bit */
    const int iscore = int_scores(&s);
    if (iscore) cr_assert_eq(s.scheme->score_int(&s, q, nq, t0, t1, r, n), 0, "%s: integer scores", spec);
    for (int i = 0; i < nq; i++)
        for (int t = t0; iscore && t < t1; t++)
            cr_expect(a[i * n + t - t0] == r[i * n + t - t0], "%s role %d d=%d %s score i=%d t=%d: %.9g vs twin %.9g",
                      spec, role, d, kernels_isa(), i, t, a[i * n + t - t0], r[i * n + t - t0]);
    /* then the twin, or the float path, against plain C's floats (with
     * the integer path's allowance) */
    if (iscore) memcpy(a, r, sizeof(float) * nq * n);
    kv_score_ref(&s, q, nq, t0, t1, r, n);
    for (int i = 0; i < nq; i++)
        for (int t = t0; t < t1; t++) {
            s.scheme->dequant(&s, t, y);
            double mag = 0;
            for (int c = 0; c < d; c++) mag += fabs(q[i * d + c] * y[c]);
            cr_expect(fabs(a[i * n + t - t0] - r[i * n + t - t0]) <= 1e-5 * mag + int_err(&s, q + i * d, t),
                      "%s role %d d=%d %s score i=%d t=%d: %g vs %g",
                      spec, role, d, kernels_isa(), i, t, a[i * n + t - t0], r[i * n + t - t0]);
        }
    float *p = malloc(sizeof(float) * nq * n), *af = calloc((size_t)nq * d, sizeof(float)),
          *ar = calloc((size_t)nq * d, sizeof(float)), *mag = calloc((size_t)nq * d, sizeof(float));
    for (int i = 0; i < nq * n; i++) p[i] = (float)urand();
    kv_accum(&s, p, n, nq, t0, t1, af);
    kv_accum_ref(&s, p, n, nq, t0, t1, ar);
    for (int t = t0; t < t1; t++) {
        s.scheme->dequant(&s, t, y);
        for (int i = 0; i < nq; i++)
            for (int c = 0; c < d; c++) mag[i * d + c] += fabsf(p[i * n + t - t0] * y[c]);
    }
    /* integer sums within accum_err of Σ |p v| (int_accum_err's measure) */
    const float ae = int_sums(&s) ? s.scheme->accum_err : 0;
    for (int j = 0; j < nq * d; j++)
        cr_expect(fabsf(af[j] - ar[j]) <= (1e-5f + ae) * mag[j], "%s role %d d=%d %s accum j=%d: %g vs %g", spec, role,
                  d, kernels_isa(), j, af[j], ar[j]);
    kv_stream_free(&s);
    free(x);
    free(q);
    free(a);
    free(r);
    free(p);
    free(af);
    free(ar);
    free(mag);
}

/* Each case on the plain C path and on every level the CPU has; nq = 11
 * crosses the 8-head tile. */
static void fast_vs_ref_all_isas(const char *spec, int role, int d, int L, int nq) {
    const char *isa = kernels_isa();
    for (int k = 0; k < N_ISAS; k++)
        if (kernels_set_isa(all_isas[k]) == 0) fast_vs_ref(spec, role, d, L, nq);
    cr_assert_eq(kernels_set_isa(isa), 0);
}

Test(kv_quant, kivi_factored_matches_reference) {
    const char *specs[] = {"kivi2", "kivi4", "kivi2:g16:r64", "kivi4:g8:r32", "kivi2:g4:r8"};
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++)
        for (int role = 0; role < 2; role++) {
            fast_vs_ref_all_isas(specs[i], role, 128, 333, 3);
            fast_vs_ref_all_isas(specs[i], role, 64, 300, 11);
        }
    fast_vs_ref_all_isas("kivi2:g4:r8", 0, 12, 100, 2);
    fast_vs_ref_all_isas("kivi4:g4:r8", 1, 12, 100, 2);
    /* Qwen3.5's head dim, with the narrowest groups the AVX-512 sums take */
    for (int role = 0; role < 2; role++) {
        fast_vs_ref_all_isas("kivi2:g16:r64", role, 256, 200, 5);
        fast_vs_ref_all_isas("kivi4", role, 256, 200, 5);
    }
}

/* The stored bytes of a KIVI stream of d = 64 holding L positions (the
 * quantized units: K blocks of G tokens, V tokens), from the layout in
 * kv/kivi.c's header. */
static size_t kivi_data_bytes(int d, int b, int G, int L, int role) {
    const size_t row = (size_t)d * b / 8;
    return role == 0 ? (size_t)(L / G) * (4 * (size_t)d + (size_t)G * row) : (size_t)L * (4 * (size_t)d / G + row);
}

/* KIVI's and q4h's quantizers, byte for byte, on every level the CPU has
 * against plain C's. Beside Gaussian data, groups the SIMD quantizers must
 * treat as the loop does (kv/kivi.c says why each): NaNs first and later
 * in a group, one with a payload (F16C keeps it, f32_to_f16 does not); a
 * lone infinity (an infinite scale, so the infinity's (x - z) / s is NaN);
 * a group of +inf alone (range inf - inf, NaN); magnitudes past fp16 (a
 * zero of -inf); subnormals, constant groups and ranges below fp16's (s =
 * 0); non-negative groups with -0 and +0 side by side, in both orders (a
 * tie of zeros as the min). The K stream gets them in every fourth
 * channel (its groups run over tokens), the V stream in every fourth
 * token (its groups run over channels), each from its own data. */
enum { QB_D = 64, QB_L = 160, QB_CASES = 16 };

/* Case cs at position pos (0..7) of a group's run of 8 values, else g. */
static float quant_case(int cs, int pos, float g) {
    float special[] = {NAN, -NAN, INFINITY, -INFINITY, 1e5f, -7e4f, 1e-40f, -3e-39f, 0};
    const uint32_t payload = 0x7fa01234u; /* a signalling NaN with a payload */
    memcpy(&special[8], &payload, 4);
    if (cs < 9) return pos == (cs * 3) % 8 ? special[cs] : g;
    if (cs == 9) return 0.375f;  /* constant */
    if (cs == 10) return g * 1e-6f; /* range below fp16's */
    if (cs == 15) return INFINITY;
    /* 11, 13: -0 then +0; 12, 14: +0 then -0; at positions 1 and 5, which
     * a lane-wise min meets in other orders than the loop, or 1 and 2 (one
     * group even at G = 4) */
    const int second = cs < 13 ? 5 : 2;
    return pos == 1 || pos == second ? ((pos == 1) == (cs % 2 == 1) ? -0.0f : 0.0f) : fabsf(g);
}

Test(kv_quant, quantizer_bytes_same_on_every_isa) {
    enum { D = QB_D, L = QB_L };
    const char *specs[] = {"kivi2:g8:r32", "kivi4:g16:r32", "kivi2:g4:r8", "kivi4", "q4h"};
    static float x[2][L][D]; /* [role][token][channel] */
    for (int r = 0; r < 2; r++)
        for (int t = 0; t < L; t++)
            for (int c = 0; c < D; c++) {
                const float g = (float)grand();
                if (r == 0) x[0][t][c] = c % 4 == 1 ? quant_case((c / 4 + t / 32) % QB_CASES, t % 8, g) : g;
                else x[1][t][c] = t % 4 == 2 ? quant_case((t / 4 + c / 8) % QB_CASES, c % 8, g) : g;
            }
    const char *isa = kernels_isa();
    for (size_t si = 0; si < sizeof specs / sizeof specs[0]; si++)
        for (int role = 0; role < 2; role++) {
            uint8_t *want = NULL;
            size_t n = 0;
            for (int k = 0; k < N_ISAS; k++) {
                if (kernels_set_isa(all_isas[k])) continue;
                KVStream s;
                open_spec(&s, specs[si], D, L, role);
                for (int t = 0; t < L; t++) kv_stream_append(&s, x[role][t]);
                if (!want) {
                    KVSpec sp;
                    char err[256];
                    cr_assert_eq(kv_spec_parse(specs[si], &sp, err, sizeof err), 0);
                    const int kivi = !strncmp(specs[si], "kivi", 4), G = sp.ko.group ? sp.ko.group : 32;
                    n = kivi ? kivi_data_bytes(D, specs[si][4] == '2' ? 2 : 4, G, L, role) : (size_t)L * D / 32 * 18;
                    want = malloc(n);
                    memcpy(want, s.data, n);
                } else {
                    size_t at = 0;
                    while (at < n && s.data[at] == want[at]) at++;
                    cr_expect_eq(at, n, "%s role %d on %s: byte %zu of %zu differs from plain C's", specs[si], role,
                                 all_isas[k], at, n);
                }
                kv_stream_free(&s);
            }
            free(want);
        }
    cr_assert_eq(kernels_set_isa(isa), 0);
}

Test(kv_quant, block_fast_paths_match_reference) {
    const char *specs[] = {"q8", "q4"};
    for (size_t i = 0; i < 2; i++) {
        fast_vs_ref_all_isas(specs[i], 0, 128, 300, 11);
        fast_vs_ref_all_isas(specs[i], 1, 32, 70, 1);
        fast_vs_ref_all_isas(specs[i], 0, 256, 50, 8);
    }
}
