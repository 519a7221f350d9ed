/* test_kernels.c: every fast kernel against its plain C reference, on every
 * instruction set this CPU has; and the property the forward pass relies on:
 * a row's matmul result is bit-identical whatever the batch around it.
 * (Criterion runs each test in its own process, so kernels_set_isa does not
 * leak between tests.) */
#include <criterion/criterion.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#if defined(__aarch64__)
#include <sys/auxv.h>
#endif

#include "kernels/half.h"
#include "kernels/matmul.h"
#include "kernels/ops.h"
#include "kernels/vec.h"

static const char *isas[] = {"ref", "avx2", "avx512", "avx512vnni", "neon", "dotprod"};
#define NISA (sizeof isas / sizeof isas[0])

static unsigned long long st = 0x243F6A8885A308D3ULL;
static float frand(void) {
    st ^= st << 13, st ^= st >> 7, st ^= st << 17;
    return (float)((st >> 11) * (1.0 / 9007199254740992.0)) * 2 - 1;
}

/* A [rows, cols] weight in dtype dt with values in [-1, 1]; q8 is made from
 * f32 values by weight_quantize_q8 (cols a multiple of 32). */
static Weight make_weight(DType dt, int rows, int cols, void **mem) {
    size_t n = (size_t)rows * cols;
    if (dt == DT_Q8 || dt == DT_Q8I) {
        Weight f = make_weight(DT_F32, rows, cols, mem), q;
        cr_assert_eq(dt == DT_Q8 ? weight_quantize_q8(&f, &q) : weight_quantize_q8i(&f, &q), 0);
        free(*mem);
        *mem = (void *)q.data;
        return q;
    }
    *mem = malloc(n * dtype_size(dt));
    for (size_t i = 0; i < n; i++) {
        float v = frand();
        if (dt == DT_F32) ((float *)*mem)[i] = v;
        else if (dt == DT_F16) ((uint16_t *)*mem)[i] = f32_to_f16(v);
        else {
            uint32_t u;
            memcpy(&u, &v, 4);
            ((uint16_t *)*mem)[i] = (uint16_t)((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
        }
    }
    return (Weight){.data = *mem, .dtype = dt, .rows = rows, .cols = cols};
}

Test(kernels, matmul_matches_reference_on_every_isa) {
    const DType dts[] = {DT_F32, DT_F16, DT_BF16, DT_Q8};
    const int shapes[][3] = {{1, 37, 64}, {5, 70, 96}, {9, 64, 200}, {130, 33, 256}, {20, 9, 2112}};
    for (size_t si = 0; si < 5; si++)
        for (int di = 0; di < 4; di++) {
            int n = shapes[si][0], out = shapes[si][1], in = shapes[si][2];
            if (dts[di] == DT_Q8 && in % 32) continue;
            void *mem;
            Weight w = make_weight(dts[di], out, in, &mem);
            float *x = malloc(sizeof(float) * n * in), *ref = malloc(sizeof(float) * n * out),
                  *got = malloc(sizeof(float) * n * out);
            for (int i = 0; i < n * in; i++) x[i] = frand();
            matmul_ref(ref, x, &w, n);
            for (size_t k = 1; k < NISA; k++) {
                if (kernels_set_isa(isas[k])) continue;
                matmul(got, x, &w, n);
                for (int i = 0; i < n * out; i++)
                    cr_expect(fabsf(got[i] - ref[i]) <= 2e-5f * sqrtf((float)in),
                              "%s dtype %d shape %dx%dx%d at %d: %g vs %g", isas[k], di, n, out, in, i, got[i], ref[i]);
            }
            kernels_set_isa("ref");
            free(x), free(ref), free(got), free(mem);
        }
}

/* Shapes: a column tail (in % 32), rows in 4-row tiles plus single rows,
 * and a row wider than the L1-sized tiles (in = 2100). 19 tokens = four
 * 4-token tiles plus a 3-token one, over bf16 chunks widened once (packed,
 * from 16 tokens on); each row is compared with itself alone and inside
 * batches of 2 and 3 (the remainder tiles, widening as they go). */
Test(kernels, matmul_rows_do_not_depend_on_batch) {
    const DType dts[] = {DT_F32, DT_F16, DT_BF16, DT_Q8};
    const int n = 19, shapes[][2] = {{45, 128}, {70, 100}, {9, 2100}, {9, 2112}};
    for (size_t k = 0; k < NISA; k++) {
        if (kernels_set_isa(isas[k])) continue;
        for (int si = 0; si < 4; si++)
            for (int di = 0; di < 4; di++) {
                const int out = shapes[si][0], in = shapes[si][1];
                if (dts[di] == DT_Q8 && in % 32) continue;
                void *mem;
                Weight w = make_weight(dts[di], out, in, &mem);
                float *x = malloc(sizeof(float) * n * in), *all = malloc(sizeof(float) * n * out),
                      *few = malloc(sizeof(float) * 3 * out);
                for (int i = 0; i < n * in; i++) x[i] = frand();
                matmul(all, x, &w, n);
                for (int i = 0; i < n; i++)
                    for (int b = 1; b <= 3 && i + b <= n; b++) {
                        matmul(few, x + (size_t)i * in, &w, b);
                        cr_expect(memcmp(few, all + (size_t)i * out, sizeof(float) * out) == 0,
                                  "%s dtype %d shape %dx%d: row %d changes in a batch of %d", isas[k], di, out, in,
                                  i, b);
                    }
                free(x), free(all), free(few), free(mem);
            }
    }
}

Test(kernels, vec_ops_match_reference) {
    for (size_t k = 0; k < NISA; k++) {
        if (kernels_set_isa(isas[k])) continue;
        for (int n = 1; n < 300; n += 37) {
            float a[300], b[300], y1[300], y2[300];
            uint16_t h[300], h2[300];
            for (int i = 0; i < n; i++) a[i] = frand() * 100, b[i] = frand(), y1[i] = y2[i] = frand();
            vec_f32_to_f16(h, a, n);
            vec_f32_to_f16_ref(h2, a, n);
            cr_expect(memcmp(h, h2, sizeof(uint16_t) * n) == 0, "%s f32_to_f16 n=%d", isas[k], n);
            float d1 = vec_dot_f32(a, b, n), d2 = vec_dot_f32_ref(a, b, n);
            cr_expect(fabsf(d1 - d2) <= 1e-4f * (1 + fabsf(d2)) * 10, "%s dot_f32 n=%d: %g vs %g", isas[k], n, d1, d2);
            d1 = vec_dot_f16(h, b, n), d2 = vec_dot_f16_ref(h, b, n);
            cr_expect(fabsf(d1 - d2) <= 1e-4f * (1 + fabsf(d2)) * 10, "%s dot_f16 n=%d: %g vs %g", isas[k], n, d1, d2);
            vec_axpy_f32(y1, 0.3f, a, n);
            vec_axpy_f32_ref(y2, 0.3f, a, n);
            for (int i = 0; i < n; i++) cr_expect(fabsf(y1[i] - y2[i]) <= 1e-5f * (1 + fabsf(y2[i])), "%s axpy_f32", isas[k]);
            vec_axpy_f16(y1, -0.7f, h, n);
            vec_axpy_f16_ref(y2, -0.7f, h, n);
            for (int i = 0; i < n; i++) cr_expect(fabsf(y1[i] - y2[i]) <= 1e-5f * (1 + fabsf(y2[i])), "%s axpy_f16", isas[k]);
        }
    }
}

Test(kernels, half_conversions_round_trip) {
    /* every f16 value widens and narrows back to itself (NaNs stay NaN) */
    for (uint32_t h = 0; h < 65536; h++) {
        float f = f16_to_f32((uint16_t)h);
        if (isnan(f)) continue;
        cr_expect_eq(f32_to_f16(f), h, "f16 %04x -> %g -> %04x", h, f, f32_to_f16(f));
    }
    cr_expect_eq(f32_to_f16(65520.0f), 0x7C00, "overflow rounds to inf");
    cr_expect_eq(f32_to_f16(1e-8f), 0, "underflow to zero");
    cr_expect_eq(bf16_to_f32(0x3F80), 1.0f);
}

/* The SIMD exp (AVX-512's exp16, AVX2's exp8, NEON's exp4) within 2 ulp of
 * libm's expf over its whole useful range (results that are subnormal or
 * zero in libm only need to be tiny, and are never subnormal themselves:
 * see exp16), the same bits on every SIMD level, and swiglu / exp_sub_sum /
 * max_from against their plain references, at every level the CPU has. */
enum { EXP_N = 200000 };

/* One level's checks; returns its exp of the grid (the caller frees),
 * which must equal first's, the grid's exp at the first level checked. */
static float *check_exp(const char *isa, const float *first) {
    enum { N = EXP_N };
    float *x = malloc(sizeof(float) * N), *y = malloc(sizeof(float) * N);
    for (int i = 0; i < N; i++) x[i] = -103.9f + (88.6f + 103.9f) * i / (N - 1);
    exp16_array(y, x, N);
    for (int i = 0; i < N; i++) {
        float r = expf(x[i]);
        cr_expect(fpclassify(y[i]) != FP_SUBNORMAL, "exp(%g) = %g is subnormal", x[i], y[i]);
        if (r < 1.2e-38f) {
            cr_expect(y[i] < 1.2e-38f, "exp(%g): %g vs %g", x[i], y[i], r);
            continue;
        }
        int32_t a, b;
        memcpy(&a, &r, 4), memcpy(&b, &y[i], 4);
        cr_expect(abs(a - b) <= 2, "%s exp(%g): %g vs libm %g (%d ulp)", isa, x[i], y[i], r, abs(a - b));
    }
    if (first) cr_expect(memcmp(y, first, sizeof(float) * N) == 0, "%s exp differs from the first level's", isa);
    /* the ends: NaN stays NaN, overflow is inf, underflow 0 */
    float sp[16] = {NAN, INFINITY, -INFINITY, 88.8f, 100.0f, -200.0f, 0.0f, -0.0f, 1.0f}, ep[16];
    exp16_array(ep, sp, 16);
    cr_expect(isnan(ep[0]), "exp(NaN) = %g", ep[0]);
    cr_expect(isinf(ep[1]) && isinf(ep[4]) && ep[1] > 0, "exp(inf) = %g, exp(100) = %g", ep[1], ep[4]);
    cr_expect(ep[3] == expf(88.8f), "exp(88.8) = %g vs %g", ep[3], expf(88.8f));
    cr_expect(ep[2] == 0 && ep[5] == 0, "exp(-inf) = %g, exp(-200) = %g", ep[2], ep[5]);
    cr_expect(ep[6] == 1 && ep[7] == 1 && ep[8] == expf(1.0f), "exp(0) = %g, exp(1) = %g", ep[6], ep[8]);
    float a[300], a2[300], b[300], s1[300], s2[300];
    for (int n = 1; n < 300; n += 23) {
        for (int i = 0; i < n; i++) a[i] = a2[i] = 8 * frand(), b[i] = frand(), s1[i] = s2[i] = 10 * frand();
        swiglu(a, b, n);
        swiglu_ref(a2, b, n);
        for (int i = 0; i < n; i++)
            cr_expect(fabsf(a[i] - a2[i]) <= 1e-6f * (1 + fabsf(a2[i])), "swiglu n=%d i=%d: %g vs %g", n, i, a[i], a2[i]);
        for (int i = 0; i < n; i++) a[i] = a2[i] = 16 * frand() - 8;
        silu(a, n);
        silu_ref(a2, n);
        for (int i = 0; i < n; i++)
            cr_expect(fabsf(a[i] - a2[i]) <= 1e-6f * (1 + fabsf(a2[i])), "silu n=%d i=%d: %g vs %g", n, i, a[i], a2[i]);
        cr_expect(max_from(s1, n, -1.0f) == max_from_ref(s2, n, -1.0f), "max_from n=%d", n);
        cr_expect(max_from(s1, n, 20.0f) == 20.0f, "max_from n=%d keeps a larger start", n);
        cr_expect(isnan(max_from(s1, n, NAN)), "max_from n=%d keeps a NaN start, as the loop does", n);
        float e1 = exp_sub_sum(s1, n, 3.0f), e2 = exp_sub_sum_ref(s2, n, 3.0f);
        cr_expect(fabsf(e1 - e2) <= 1e-5f * e2, "exp_sub_sum n=%d: %g vs %g", n, e1, e2);
        for (int i = 0; i < n; i++)
            cr_expect(fabsf(s1[i] - s2[i]) <= 3e-7f * s2[i], "exp_sub_sum n=%d i=%d: %g vs %g", n, i, s1[i], s2[i]);
    }
    free(x);
    return y;
}

Test(kernels, exp_matches_libm) {
    static const char *simd[] = {"avx512", "avx2", "neon"}; /* the plain paths are libm itself */
    float *first = NULL;
    for (int k = 0; k < 3; k++) {
        if (kernels_set_isa(simd[k])) continue;
        float *y = check_exp(simd[k], first);
        if (first) free(y);
        else first = y;
    }
    free(first);
}

/* argmax: the first of equal maxima, NaNs skipped (0 when all are NaN),
 * the same index as the reference at every length and position. */
Test(kernels, argmax_matches_reference) {
    static float x[4200];
    for (size_t k = 0; k < NISA; k++) {
        if (kernels_set_isa(isas[k])) continue;
        for (int n = 1; n <= 4200; n += n < 40 ? 1 : 397) {
            for (int i = 0; i < n; i++) x[i] = frand();
            cr_expect_eq(argmax(x, n), argmax_ref(x, n), "%s n=%d", isas[k], n);
            const int at = n / 3, tie = n - 1;
            x[at] = 5, x[tie] = 5; /* ties keep the first */
            cr_expect_eq(argmax(x, n), at, "%s n=%d tie", isas[k], n);
            x[0] = NAN; /* a NaN, even first, is never the maximum */
            if (at > 0) cr_expect_eq(argmax(x, n), at, "%s n=%d NaN first", isas[k], n);
            for (int i = 0; i < n; i++) x[i] = i % 5 ? NAN : -INFINITY;
            cr_expect_eq(argmax(x, n), argmax_ref(x, n), "%s n=%d NaN and -inf", isas[k], n);
            cr_expect_eq(argmax_ref(x, n), 0, "n=%d: -inf at 0", n);
            for (int i = 0; i < n; i++) x[i] = NAN;
            cr_expect_eq(argmax(x, n), 0, "%s n=%d all NaN", isas[k], n);
        }
    }
}

/* matmul_multi over three matrices of rows[m] x in and dtype dts[m] (bf16
 * relaid in panels when panels) against each one's own matmul, on the
 * current ISA, for n tokens. */
static void check_multi(const int *rows, const DType *dts, int panels, int n, int in, const char *isa) {
    void *mem[3];
    Weight w[3];
    const Weight *wp[3];
    float *x = malloc(sizeof(float) * n * in), *y[3], *ref[3];
    for (int i = 0; i < n * in; i++) x[i] = frand();
    if (panels) cr_assert_eq(matmul_reserve(n, in), 0);
    for (int m = 0; m < 3; m++) {
        w[m] = make_weight(dts[m], rows[m], in, &mem[m]);
        if (panels) cr_assert_eq(weight_to_panels(&w[m]), 0);
        wp[m] = &w[m];
        y[m] = malloc(sizeof(float) * n * rows[m]);
        ref[m] = malloc(sizeof(float) * n * rows[m]);
        matmul(ref[m], x, &w[m], n);
    }
    matmul_multi(y, wp, 3, x, n);
    for (int m = 0; m < 3; m++) {
        cr_expect(memcmp(y[m], ref[m], sizeof(float) * n * rows[m]) == 0, "%s n=%d in=%d%s: projection %d differs", isa,
                  n, in, panels ? " (panels)" : "", m);
        free(y[m]), free(ref[m]), free(mem[m]);
    }
    free(x);
}

/* matmul_multi: one pass over several projections of the same x gives each
 * exactly what its own matmul gives, with mixed row counts and dtypes and a
 * column tail, for a single token and for a batch that packs bf16 chunks;
 * and for three matrices relaid in panels (q, k and v's case: one team over
 * their 64-row chunks laid end to end, 32-row last chunks included). */
Test(kernels, matmul_multi_equals_separate_matmuls) {
    const int rows[3] = {70, 33, 130}, prows[3] = {64, 32, 96};
    const DType bf16[3] = {DT_BF16, DT_BF16, DT_BF16};
    for (size_t k = 0; k < NISA; k++) {
        if (kernels_set_isa(isas[k])) continue;
        /* with a column tail, then q8 in the mix (whole 32-column blocks) */
        for (int c = 0; c < 4; c++) {
            const int n = c % 2 ? 20 : 1, in = c < 2 ? 100 : 128;
            const DType dts[3] = {DT_BF16, in % 32 ? DT_F16 : DT_Q8, DT_F32};
            check_multi(rows, dts, 0, n, in, isas[k]);
        }
        for (int n = 1; n <= 20; n += 19) check_multi(prows, bf16, 1, n, 100, isas[k]);
    }
}

/* Threads share a projection's 64-row chunks through runs they steal from
 * one another (kernels/matmul.c): whatever the team size, every row is
 * computed exactly once and by the same code, so the output is the one
 * thread's bit for bit, and no row keeps the NaN written before. Team sizes
 * beyond the cores force the interleavings; 70 is more teams than runs
 * (RUNS_MAX 64), 3 and 8 more than some matrices have chunks. Also the
 * drafter's DT_Q8I matrices, which share the same split. */
Test(kernels, matmul_threads_compute_every_row_once) {
    const int rows[] = {1, 65, 1008}, threads[] = {3, 8, 70}, in = 96;
    for (size_t k = 2; k < NISA; k++) {
        if (kernels_set_isa(isas[k])) continue;
        for (int ri = 0; ri < 3; ri++)
            for (int n = 1; n <= 17; n += 16) {
                void *mem;
                Weight w = make_weight(DT_BF16, rows[ri], in, &mem), q = {0};
                const int q8i = matmul_has_q8i() && rows[ri] % 16 == 0;
                if (q8i) cr_assert_eq(weight_quantize_q8i(&w, &q), 0);
                float *x = malloc(sizeof(float) * n * in), *one = malloc(sizeof(float) * n * rows[ri]),
                      *got = malloc(sizeof(float) * n * rows[ri]);
                for (int i = 0; i < n * in; i++) x[i] = frand();
                for (int v = 0; v < 1 + q8i; v++) {
                    const Weight *wv = v ? &q : &w;
                    omp_set_num_threads(1);
                    cr_assert_eq(matmul_reserve(n, in), 0);
                    matmul(one, x, wv, n);
                    for (int ti = 0; ti < 3; ti++) {
                        omp_set_num_threads(threads[ti]);
                        cr_assert_eq(matmul_reserve(n, in), 0);
                        for (int i = 0; i < n * rows[ri]; i++) got[i] = NAN;
                        matmul(got, x, wv, n);
                        cr_expect(memcmp(got, one, sizeof(float) * n * rows[ri]) == 0,
                                  "%s %s rows %d n %d: %d threads differ from one", isas[k], v ? "q8i" : "bf16",
                                  rows[ri], n, threads[ti]);
                    }
                }
                if (q8i) weight_free(&q);
                free(x), free(one), free(got), free(mem);
            }
    }
}

/* What both panel layouts must hold, for matrices of shapes[k] = {rows,
 * cols} relaid by to into dt: every weight kept (weight_row, the values
 * quantize reads); on every ISA matmul gives the reference's bits (so rows
 * do not depend on the batch) for 1 to 100 tokens, at 1 and 3 threads; and
 * the results within tol * sqrt(cols) of the row-major matmul's. */
static void check_panels(int (*to)(Weight *), DType dt, const int (*shapes)[2], int nshapes, float tol) {
    const int ns[] = {1, 2, 3, 4, 5, 6, 7, 11, 12, 13, 14, 40, 100};
    const int NS = sizeof ns / sizeof ns[0], NMAX = 100;
    for (int si = 0; si < nshapes; si++) {
        const int out = shapes[si][0], in = shapes[si][1];
        void *mem, *memp;
        Weight b = make_weight(DT_BF16, out, in, &mem), p = b;
        memp = malloc((size_t)out * in * 2);
        memcpy(memp, mem, (size_t)out * in * 2);
        p.data = memp;
        cr_assert_eq(to(&p), 0);
        cr_assert_eq(p.dtype, dt);
        float *rb = malloc(sizeof(float) * in), *rp = malloc(sizeof(float) * in);
        for (int o = 0; o < out; o++) {
            weight_row(&b, o, rb), weight_row(&p, o, rp);
            cr_expect(memcmp(rb, rp, sizeof(float) * in) == 0, "%dx%d: row %d of the panels differs", out, in, o);
        }
        free(rb), free(rp);
        float *x = malloc(sizeof(float) * NMAX * in), *ref = malloc(sizeof(float) * NMAX * out),
              *got = malloc(sizeof(float) * NMAX * out), *got2 = malloc(sizeof(float) * NMAX * out);
        for (int i = 0; i < NMAX * in; i++) x[i] = frand();
        for (size_t k = 0; k < NISA; k++) {
            if (kernels_set_isa(isas[k])) continue;
            for (int ni = 0; ni < NS; ni++) {
                const int n = ns[ni];
                kernels_set_isa("ref");
                matmul_ref(ref, x, &p, n);
                kernels_set_isa(isas[k]);
                for (int t = 1; t <= 3; t += 2) {
                    omp_set_num_threads(t);
                    cr_assert_eq(matmul_reserve(n, in), 0);
                    for (int i = 0; i < n * out; i++) got[i] = NAN;
                    matmul(got, x, &p, n);
                    cr_expect(memcmp(got, ref, sizeof(float) * n * out) == 0,
                              "%s (dtype %d, vdpbf16ps %s) %dx%d, %d tokens, %d threads: not the reference's bits",
                              isas[k], (int)dt, matmul_has_dpanels() ? "on" : "off", out, in, n, t);
                    /* in one team after a matrix of its first panel's rows alone (a
                     * matrix of its own in this layout): each output as alone */
                    Weight head = p;
                    head.rows = dt == DT_BF16P ? 32 : 16;
                    const Weight *pair[2] = {&head, &p};
                    float *ys[2] = {got2, got};
                    for (int i = 0; i < n * out; i++) got[i] = got2[i] = NAN;
                    matmul_multi(ys, pair, 2, x, n);
                    int same = !memcmp(got, ref, sizeof(float) * n * out);
                    for (int i = 0; i < n; i++)
                        same &= !memcmp(got2 + (size_t)i * head.rows, ref + (size_t)i * out, sizeof(float) * head.rows);
                    cr_expect(same, "%s (dtype %d) %dx%d, %d tokens, %d threads: matmul_multi not the reference's bits",
                              isas[k], (int)dt, out, in, n, t);
                }
            }
        }
        kernels_set_isa("ref");
        matmul_ref(ref, x, &p, 40);
        matmul_ref(got, x, &b, 40);
        for (int i = 0; i < 40 * out; i++)
            cr_expect(fabsf(got[i] - ref[i]) <= tol * sqrtf((float)in), "%dx%d at %d: %g vs %g", out, in, i, ref[i], got[i]);
        free(x), free(ref), free(got), free(got2), free(mem), free(memp);
    }
}

/* DT_BF16P (bf16 relaid in 32-row panels), as check_panels says, for
 * batches that take the AVX-512 tiles (1 x 1, 2 x 6 and 1 x 12 panels x
 * tokens), the AVX2 ones (4 x 1, 2 x 2 and 1 x 1..6 half-panels) and the
 * NEON ones (4 x 1, 4 x 2 and 2 x 1..5 quarters), chunks of one and two
 * panels, the next-chunk prefetch
 * (192 rows), within float rounding of the row-major matmul; what
 * weight_to_panels cannot lay out stays as it is. */
Test(kernels, panels_match_reference_to_the_bit) {
    /* 1024 columns: x used in place of its blocks; 100 tokens: 9 tiles, the
     * next chunk prefetched in eighths */
    const int shapes[][2] = {{32, 1}, {96, 100}, {192, 1030}, {64, 2112}, {128, 1024}};
    check_panels(weight_to_panels, DT_BF16P, shapes, 5, 2e-5f);
    void *mem;
    Weight w = make_weight(DT_BF16, 48, 64, &mem), f;
    cr_expect_eq(weight_to_panels(&w), -1);
    cr_expect_eq(w.dtype, DT_BF16);
    free(mem);
    f = make_weight(DT_F32, 64, 64, &mem);
    cr_expect_eq(weight_to_panels(&f), -1);
    cr_expect_eq(f.dtype, DT_F32);
    free(mem);
}

/* DT_BF16D (-act bf16: bf16 in 16-row panels of column pairs, x rounded to
 * bf16 for vdpbf16ps), as check_panels says (the reference being
 * bf16_dot2's chain: the CPU's instruction, to the bit), for batches that
 * take the 4 x 6 and 2 x 12 tiles and their remainders, chunks of 1 to 4
 * panels, x in several blocks with a short last one, within bf16 rounding
 * of x (2^-9 relative) of the f32 matmul; x's subnormals, infinities and
 * exact ties round as the instruction does; what weight_to_dpanels cannot
 * lay out stays as it is. */
Test(kernels, dpanels_match_reference_to_the_bit) {
    const int shapes[][2] = {{16, 2}, {48, 100}, {208, 1030}, {64, 2112}, {128, 1024}};
    check_panels(weight_to_dpanels, DT_BF16D, shapes, 5, 4e-3f);
    /* x rounded as the instruction rounds and its subnormals: one token
     * per case, each of whose outputs the case decides. Column 7's weights
     * are 2 and row 0's weights in columns 4 and 5 (the two halves of a
     * pair) are subnormal. */
    {
        void *mem;
        Weight w = make_weight(DT_BF16, 16, 64, &mem);
        for (int r = 0; r < 16; r++) ((uint16_t *)mem)[r * 64 + 7] = 0x4000;
        ((uint16_t *)mem)[4] = 0x8005, ((uint16_t *)mem)[5] = 0x0003;
        cr_assert_eq(weight_to_dpanels(&w), 0);
        enum { NT = 4 };
        float x[NT * 64], ref[NT * 16], got[NT * 16];
        const uint32_t tie_down = 0x3F808000u, tie_up = 0x3F818000u, sub = 0x807FFFFFu, inf = 0x7F800000u;
        for (int i = 0; i < NT * 64; i++) x[i] = i < 64 ? 0 : frand();
        /* token 0: only a subnormal that rounding alone would make -FLT_MIN */
        memcpy(&x[7], &sub, 4);
        /* token 1: ties, each a bf16 ulp (2^-7) apart from the wrong way */
        memcpy(&x[64 + 3], &tie_down, 4), memcpy(&x[64 + 9], &tie_up, 4);
        /* token 2: an infinity stays one */
        memcpy(&x[128 + 47], &inf, 4);
        /* token 3: only columns 4 and 5, against row 0's subnormal weights */
        for (int j = 0; j < 64; j++) x[192 + j] = j == 4 || j == 5 ? 1e30f : 0;
        kernels_set_isa("ref");
        matmul_ref(ref, x, &w, NT);
        for (int o = 0; o < 16; o++) {
            cr_expect(ref[o] == 0, "row %d: a subnormal input counted (%g)", o, ref[o]);
            cr_expect(isinf(ref[32 + o]), "row %d: the infinity was lost (%g)", o, ref[32 + o]);
        }
        cr_expect(ref[48] == 0, "a subnormal weight counted (%g)", ref[48]);
        x[192 + 5] = 0;
        matmul_ref(got, x, &w, NT);
        cr_expect(got[48] == 0, "the even column's subnormal weight counted (%g)", got[48]);
        x[192 + 5] = 1e30f;
        for (size_t k = 0; k < NISA; k++) {
            if (kernels_set_isa(isas[k])) continue;
            cr_assert_eq(matmul_reserve(NT, 64), 0);
            matmul(got, x, &w, NT);
            cr_expect(memcmp(got, ref, sizeof got) == 0, "%s: special values not as the reference", isas[k]);
        }
        /* the ties rounded the other way change token 1's outputs */
        const uint32_t tie_down_wrong = 0x3F810000u;
        memcpy(&x[64 + 3], &tie_down_wrong, 4);
        kernels_set_isa("ref");
        matmul_ref(got, x, &w, NT);
        cr_expect(memcmp(got + 16, ref + 16, 16 * sizeof(float)) != 0, "a tie's rounding does not reach the outputs");
        free(mem);
    }
    cr_expect_eq(f32_to_bf16(1.00390625f), 0x3F80, "a tie rounds to even (down)");
    cr_expect_eq(f32_to_bf16(1.01171875f), 0x3F82, "a tie rounds to even (up)");
    cr_expect_eq(f32_to_bf16(1e-40f), 0x0000, "a subnormal becomes zero");
    cr_expect_eq(f32_to_bf16(-1e-40f), 0x8000, "a negative subnormal becomes -0");
    /* what it cannot lay out stays as it is */
    void *mem;
    Weight w = make_weight(DT_BF16, 24, 64, &mem), f;
    cr_expect_eq(weight_to_dpanels(&w), -1);
    cr_expect_eq(w.dtype, DT_BF16);
    free(mem);
    w = make_weight(DT_BF16, 16, 63, &mem);
    cr_expect_eq(weight_to_dpanels(&w), -1);
    free(mem);
    /* data 2 bytes past a 4-byte boundary: the pairs are 32-bit words */
    w = make_weight(DT_BF16, 16, 66, &mem);
    w.data = (const uint16_t *)mem + 1, w.cols = 64;
    cr_expect_eq(weight_to_dpanels(&w), -1);
    cr_expect_eq(w.dtype, DT_BF16);
    free(mem);
    f = make_weight(DT_F32, 64, 64, &mem);
    cr_expect_eq(weight_to_dpanels(&f), -1);
    cr_expect_eq(f.dtype, DT_F32);
    free(mem);
}

/* DT_Q8I (the drafter's integer dots): the VNNI kernel gives exactly the
 * reference's numbers, alone, in a batch of 1 to 9 tokens and inside
 * matmul_multi; they hold the same weights as q8 (weight_row) and stay
 * within the activations' q8 rounding of the float q8 matmul; shapes it
 * cannot hold are refused. */
Test(kernels, q8i_matches_reference_and_q8) {
    const int shapes[][2] = {{16, 32}, {48, 96}, {144, 256}, {4160, 256}, {32, 1024}};
    for (int si = 0; si < 5; si++) {
        const int out = shapes[si][0], in = shapes[si][1], n = 9;
        /* scales that differ by row and by block, so a mixed-up index shows */
        void *memf;
        Weight f = make_weight(DT_F32, out, in, &memf), w, w8;
        for (int o = 0; o < out; o++)
            for (int j = 0; j < in; j++) ((float *)memf)[(size_t)o * in + j] *= 1 + o % 16 + (j / 32) % 3;
        cr_assert_eq(weight_quantize_q8i(&f, &w), 0);
        cr_assert_eq(weight_quantize_q8(&f, &w8), 0);
        free(memf);
        void *mem = (void *)w.data, *mem8 = (void *)w8.data;
        float *x = malloc(sizeof(float) * n * in), *ref = malloc(sizeof(float) * n * out),
              *got = malloc(sizeof(float) * n * out), *f8 = malloc(sizeof(float) * n * out);
        float *r8 = malloc(sizeof(float) * in), *ri = malloc(sizeof(float) * in);
        for (int o = 0; o < out; o += 7) {
            weight_row(&w8, o, r8);
            weight_row(&w, o, ri);
            cr_expect(memcmp(r8, ri, sizeof(float) * in) == 0, "%dx%d: row %d differs from q8", out, in, o);
        }
        for (int i = 0; i < n * in; i++) x[i] = frand();
        x[3] = 0; /* a block with a zero, and a token of zeros */
        for (int j = 0; j < in; j++) x[in + j] = 0;
        kernels_set_isa("ref");
        matmul_ref(ref, x, &w, n);
        matmul_ref(f8, x, &w8, n);
        double err = 0, mag = 0;
        for (int i = 0; i < n * out; i++) err = fmax(err, fabsf(ref[i] - f8[i])), mag = fmax(mag, fabsf(f8[i]));
        /* x within half a step of 1/127 of its block's max: about 0.5% of a dot's magnitude */
        cr_expect(err > 0 && err < 0.02 * mag, "%dx%d: q8i vs q8 max-abs %g of %g", out, in, err, mag);
        for (int j = 0; j < out; j++) cr_expect_eq(ref[(size_t)out + j], 0, "an all-zero x row gives 0");
        /* independently, in double: q8 codes and scales times x quantized by
         * the same rule (rounded to nearest even) */
        const int nb = in / 32;
        double worst = 0;
        for (int i = 0; i < n; i++)
            for (int o = 0; o < out; o++) {
                double e = 0;
                for (int b = 0; b < nb; b++) {
                    const float *xb = x + (size_t)i * in + b * 32;
                    float amax = 0;
                    for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(xb[j]));
                    const float dx = amax / 127.0f, id = dx > 0 ? 1.0f / dx : 0.0f;
                    long dot = 0;
                    for (int j = 0; j < 32; j++)
                        dot += (long)((const int8_t *)w8.data)[(size_t)o * in + b * 32 + j] * lrintf(xb[j] * id);
                    e += (double)(w8.scale[(size_t)o * nb + b] * dx) * dot;
                }
                worst = fmax(worst, fabs(ref[(size_t)i * out + o] - e) / (1 + fabs(e)));
            }
        cr_expect(worst < 1e-5, "%dx%d: reference vs the double-precision sum: %g", out, in, worst);
        for (size_t k = 1; k < NISA; k++) {
            if (kernels_set_isa(isas[k])) continue;
            for (int b = 1; b <= n; b++) {
                matmul(got, x, &w, b);
                cr_expect(memcmp(got, ref, sizeof(float) * b * out) == 0, "%s %dx%d, %d tokens: differs from reference",
                          isas[k], out, in, b);
            }
            /* after a matrix of its first tile's 16 rows alone (one of its own) */
            Weight head = w;
            head.rows = 16;
            const Weight *pair[2] = {&head, &w};
            float *ys[2] = {f8, got};
            matmul_multi(ys, pair, 2, x, n);
            int same = !memcmp(got, ref, sizeof(float) * n * out);
            for (int i = 0; i < n; i++) same &= !memcmp(f8 + (size_t)i * 16, ref + (size_t)i * out, sizeof(float) * 16);
            cr_expect(same, "%s %dx%d: matmul_multi differs", isas[k], out, in);
        }
#if defined(__aarch64__)
        /* usdot is I8MM's (HWCAP2 bit 13), used from dotprod up */
        if (!kernels_set_isa("neon")) cr_expect(!matmul_has_q8i(), "RUN_ISA=neon keeps the q8i kernel");
        if (!kernels_set_isa("dotprod"))
            cr_expect_eq(matmul_has_q8i(), (int)(getauxval(AT_HWCAP2) >> 13 & 1), "the q8i kernel without I8MM, or not with it");
#else
        if (!kernels_set_isa("avx512")) cr_expect(!matmul_has_q8i(), "RUN_ISA=avx512 keeps the q8i kernel");
        const int vnni = !kernels_set_isa("avx512vnni");
        cr_expect_eq(matmul_has_q8i(), vnni);
#endif
        free(x), free(ref), free(got), free(f8), free(r8), free(ri), free(mem), free(mem8);
    }
    void *mem;
    Weight f = make_weight(DT_F32, 24, 64, &mem), q;
    cr_expect_eq(weight_quantize_q8i(&f, &q), -1, "24 rows are not whole 16-row tiles");
    f.rows = 16, f.cols = 48;
    cr_expect_eq(weight_quantize_q8i(&f, &q), -1, "48 columns are not whole blocks");
    free(mem);
}

/* ggml's q8_0 rule: each 32-column block's largest magnitude becomes +-127,
 * every value is within half a step of its code times the scale, and widths
 * that are not whole blocks are refused. */
Test(kernels, q8_weights_follow_the_q8_0_rule) {
    void *mem;
    Weight f = make_weight(DT_F32, 3, 96, &mem), q;
    ((float *)mem)[5] = 0; /* a block may hold zeros */
    for (int j = 64; j < 96; j++) ((float *)mem)[j] = 0; /* and be all zero */
    cr_assert_eq(weight_quantize_q8(&f, &q), 0);
    const float *w = mem;
    const int8_t *c = q.data;
    for (int b = 0; b < 9; b++) {
        float amax = 0;
        int cmax = 0;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(w[b * 32 + j]));
        cr_expect_eq(q.scale[b], amax / 127.0f, "block %d scale", b);
        for (int j = 0; j < 32; j++) {
            int i = b * 32 + j;
            cr_expect(fabsf(w[i] - c[i] * q.scale[b]) <= 0.5f * q.scale[b] * 1.0001f, "value %d: %g vs %d x %g", i,
                      w[i], c[i], q.scale[b]);
            cmax = abs(c[i]) > cmax ? abs(c[i]) : cmax;
        }
        cr_expect_eq(cmax, amax > 0 ? 127 : 0, "block %d: largest code %d", b, cmax);
    }
    weight_free(&q);
    cr_expect_eq(q.data, NULL);
    Weight odd = f, dst = {0};
    odd.cols = 48, odd.rows = 2;
    cr_expect_eq(weight_quantize_q8(&odd, &dst), -1, "48 columns are not whole blocks");
    cr_expect_eq(dst.data, NULL);
    free(mem);
}
