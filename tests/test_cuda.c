/* test_cuda.c: every CUDA op against its CPU twin on random inputs, and the
 * shipped model on the GPU against the golden logits and the CPU's greedy
 * tokens. Each test skips, saying so, where no CUDA device is usable; a
 * build without CUDA (make CUDA=0) checks that it says so instead. */
#include <criterion/criterion.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "attn/attn.h"
#include "kernels/cuda.h"
#include "kernels/half.h"
#include "kernels/matmul.h"
#include "kernels/ops.h"
#include "kv/polar4.h"
#include "model/gpu.h"
#include "model/model.h"
#include "sample/sampler.h"
#define TEST_SEED 0xC0DAC0DAull
#include "tests/util.h"

/* What the GPU path refuses is decided from the config and the scheme,
 * on any machine: Qwen3.5's hybrid, head dims other than 128 and 256, and
 * the compressed schemes but q8, q4, q4h, tbq, lm3 and polar4 (so far;
 * q4, q4h, lm3 and polar4 at head dim 128 only), and a K/V pair of two
 * schemes. */
Test(cuda, what_the_gpu_refuses) {
    static const struct {
        const char *model, *kv, *says;
    } cases[] = {
        {"models/qwen3-kjv-mtp", "f16", NULL},
        {"models/qwen3-kjv-mtp", "f32", NULL},
        {"models/qwen3-kjv-mtp", "q8", NULL},
        {"models/qwen3-kjv-mtp", "q8/f16", "K and V in different schemes"},
        {"models/qwen3-kjv-mtp", "tbq4", NULL},
        {"models/qwen3-kjv-mtp", "tbq2", NULL},
        {"models/qwen3-kjv-mtp", "q4", NULL},
        {"models/qwen3-kjv-mtp", "q4h", NULL},
        {"models/qwen3-kjv-mtp", "lm3", NULL},
        {"models/qwen3-kjv-mtp", "polar4", NULL},
        {"models/qwen3-kjv-mtp", "polar4/tbq4", "K and V in different schemes"},
        {"models/qwen3-kjv-mtp", "kivi2", "KV scheme kivi2 has no CUDA kernel yet"},
        {"models/qwen3-kjv-mtp", "kivi4", "KV scheme kivi4 has no CUDA kernel yet"},
        {"models/qwen35-kjv-mtp", "f16", "Gated DeltaNet"},
        {"tests/data/fixtures/tiny", "f16", "head_dim 32"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        ModelSource src;
        Config c;
        KVSpec spec;
        char err[512] = "";
        cr_assert_eq(source_open(&src, cases[i].model, err, sizeof err), 0, "%s", err);
        cr_assert_eq(source_config(&src, &c, err, sizeof err), 0, "%s", err);
        cr_assert_eq(kv_spec_parse(cases[i].kv, &spec, err, sizeof err), 0, "%s", err);
        const int rc = gpu_supports(&c, &spec, err, sizeof err);
        if (cases[i].says) cr_expect(rc == -1 && strstr(err, cases[i].says), "%s -kv %s: %s", cases[i].model,
                                     cases[i].kv, err);
        else cr_expect_eq(rc, 0, "%s -kv %s: %s", cases[i].model, cases[i].kv, err);
        source_free(&src);
    }
}

#ifndef USE_CUDA

Test(cuda, a_build_without_cuda_says_so) {
    CudaInfo info;
    char err[256] = "";
    cr_expect_null(cuda_built());
    cr_expect_eq(cuda_device_count(), 0);
    cr_expect_eq(cuda_open(&info, err, sizeof err), -1);
    cr_expect(strstr(err, "built without CUDA"), "%s", err);
}

#else

/* bench_cuda --computed (no GPU needed): the unified-memory machines'
 * decode bound, 28 rows (2 shapes x 2 weights x a context-0 row and 3
 * schemes at 4K and 32K); GB10's and GH200's copy columns the bytes a
 * token reads over 232 and 3400 GB/s, GH200's map column below its copy
 * one (the weights over C2C), and two rows' bytes as worked out by hand
 * from the shapes. */
Test(cuda, computed_unified_table) {
    const char *dir = getenv("TOOLS_DIR") ? getenv("TOOLS_DIR") : "build";
    char cmd[512], line[512];
    snprintf(cmd, sizeof cmd, "%s/bench_cuda --computed", dir);
    FILE *p = popen(cmd, "r");
    cr_assert(p, "cannot run %s", cmd);
    int rows = 0, seen = 0;
    while (fgets(line, sizeof line, p)) {
        char shape[16], w[16], kv[16];
        int ctx;
        double gb, gb10, copy, map;
        if (sscanf(line, "| %15s | %15s | %15s | %d | %lf | %lf | %lf | %lf |", shape, w, kv, &ctx, &gb, &gb10, &copy,
                   &map) != 8)
            continue;
        rows++;
        /* within the printed digits: tok/s to 0.1, and GB to 0.001, which
         * moves bw / GB by up to bw / GB x 0.0005 / GB */
        cr_expect(fabs(gb10 - 232 / gb) <= 0.05 + 232 / gb * 5e-4 / gb &&
                      fabs(copy - 3400 / gb) <= 0.05 + 3400 / gb * 5e-4 / gb,
                  "%s", line);
        cr_expect(map < copy && map > 0, "%s", line);
        /* 0.6B, bf16, no cache: 28 layers of (2048 + 2 x 1024 + 2048 + 3 x 3072) x 1024 weights, and the
         * 151936 x 1024 lm_head, 2 bytes each = 1.192 GB */
        if (!strcmp(shape, "0.6B") && !strcmp(w, "bf16") && ctx == 0) {
            seen++;
            cr_expect(fabs(gb - 1.192) < 1e-3 && fabs(map - 375 / 1.192) < 0.2, "%s", line);
        }
        /* 8B, q8 weights, tbq4 at 32K: 8.514 GB of weights, then 36 layers x 8 heads x 2 x 32768 positions x
         * 66 bytes per 128 values */
        if (!strcmp(shape, "8B") && !strcmp(w, "q8") && !strcmp(kv, "tbq4") && ctx == 32768) {
            seen++;
            cr_expect(fabs(gb - (8.514 + 36.0 * 8 * 2 * 32768 * 66 / 1e9)) < 2e-3, "%s", line);
        }
    }
    cr_expect_eq(pclose(p), 0, "%s failed", cmd);
    cr_expect_eq(rows, 28, "%d rows", rows);
    cr_expect_eq(seen, 2, "the two rows worked out by hand");
}

static void need_gpu(void) {
    if (cuda_device_count() == 0) cr_skip_test("no CUDA device here (cudaGetDeviceCount reports none or no driver)");
    CudaInfo info;
    char err[256];
    cr_assert_eq(cuda_open(&info, err, sizeof err), 0, "%s", err);
}

/* Device copies of host arrays, and back; every failure ends the test. */
static void *up(const void *h, size_t bytes) {
    char err[256];
    void *d = cuda_alloc(bytes, "test data", err, sizeof err);
    cr_assert(d, "%s", err);
    if (h) cr_assert_eq(cuda_upload(d, h, bytes, "test data", err, sizeof err), 0, "%s", err);
    else cuda_memset(d, 0xff, bytes); /* NaN-filled: an element never written shows */
    return d;
}
static void down(void *h, const void *d, size_t bytes) {
    char err[256];
    cr_assert_eq(cuda_sync("test", err, sizeof err), 0, "%s", err);
    cr_assert_eq(cuda_download(h, d, bytes, "test data", err, sizeof err), 0, "%s", err);
}

/* polar4's rotation of cache layer 0, R then Rᵀ, on the device (as
 * model/gpu.c uploads them); NULL for the other formats. */
static float rot_m[2 * 128 * 128];
static float *rot_up(int fmt) {
    if (fmt != CUDA_KV_POLAR4) return NULL;
    cr_assert_eq(polar4_rotation(128, 0, rot_m, rot_m + 128 * 128), 0);
    return up(rot_m, sizeof rot_m);
}

/* rows x [rows, 128] times R (rot_up's), in place: y[j] = Σ_i x[i] R[i][j]
 * summed in order, as kv/polar4.c's rot_rows. */
static void rot_rows_host(float *x, int rows) {
    for (int r = 0; r < rows; r++, x += 128) {
        float t[128] = {0};
        for (int i = 0; i < 128; i++)
            for (int j = 0; j < 128; j++) t[j] += x[i] * rot_m[i * 128 + j];
        memcpy(x, t, sizeof t);
    }
}

/* max |a - b| over max |b| (relative to the reference's scale). */
static double rel_err(const float *a, const float *b, size_t n) {
    double d = 0, m = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(a[i]) != isnan(b[i])) return INFINITY;
        d = fmax(d, fabs((double)a[i] - b[i]));
        m = fmax(m, fabs((double)b[i]));
    }
    return m > 0 ? d / m : d;
}

/* W [rows, cols] random in dtype (host bytes) and its Weight. */
static void *rand_weight(Weight *w, DType t, int rows, int cols) {
    const size_t n = (size_t)rows * cols;
    void *h = malloc(n * dtype_size(t));
    for (size_t i = 0; i < n; i++) {
        float x = grand() * 0.1f;
        if (t == DT_F32) ((float *)h)[i] = x;
        else if (t == DT_F16) ((uint16_t *)h)[i] = f32_to_f16(x);
        else ((uint16_t *)h)[i] = f32_to_bf16(x);
    }
    *w = (Weight){h, NULL, t, rows, cols};
    return h;
}

/* W [rows, cols] random as q8 blocks (weight_quantize_q8 of random f32):
 * w the CPU's (weight_free), the bytes returned the device's layout of
 * the same (kernels/cuda.h: the codes, then the scales). */
static void *rand_q8(Weight *w, int rows, int cols) {
    Weight f;
    void *hf = rand_weight(&f, DT_F32, rows, cols);
    cr_assert_eq(weight_quantize_q8(&f, w), 0);
    free(hf);
    const size_t n = (size_t)rows * cols;
    char *h = malloc(cuda_weight_bytes(CUDA_Q8, rows, cols));
    memcpy(h, w->data, n);
    memcpy(h + n, w->scale, n / 32 * sizeof(float));
    return h;
}

Test(cuda, matmul_matches_matmul_ref) {
    need_gpu();
    const DType types[] = {DT_BF16, DT_F16, DT_F32, DT_Q8};
    const int codes[] = {CUDA_BF16, CUDA_F16, CUDA_F32, CUDA_Q8};
    const int ns[] = {1, 2, 3, 5, 8, 9, 70, 130};
    /* 320 x 1024 and 64 x 96 take the tensor cores' tiles in bf16; the
     * others the f32 ones; q8 every shape of 32-column blocks (200 x 160:
     * rows off the tiles) on its own tensor-core kernel */
    const int shapes[][2] = {{300, 1032}, {64, 8}, {1000, 2048}, {320, 1024}, {64, 96}, {200, 160}};
    for (int t = 0; t < 4; t++)
        for (int s = 0; s < 6; s++)
            for (int k = 0; k < 8; k++) {
                const int rows = shapes[s][0], cols = shapes[s][1], n = ns[k];
                if (types[t] == DT_Q8 && cols % 32) continue;
                Weight w;
                void *hw = types[t] == DT_Q8 ? rand_q8(&w, rows, cols) : rand_weight(&w, types[t], rows, cols);
                float *x = malloc((size_t)n * cols * 4), *y = malloc((size_t)n * rows * 4),
                      *want = malloc((size_t)n * rows * 4), *y0 = malloc((size_t)n * rows * 4);
                fill(x, n * cols);
                fill(y0, n * rows);
                matmul_ref(want, x, &w, n);
                void *dw = up(hw, cuda_weight_bytes(codes[t], rows, cols));
                float *dx = up(x, (size_t)n * cols * 4), *dy = up(NULL, (size_t)n * rows * 4);
                cuda_matmul(dy, dx, dw, codes[t], rows, cols, n, 0);
                down(y, dy, (size_t)n * rows * 4);
                double e = rel_err(y, want, (size_t)n * rows);
                cr_expect(e <= 1e-5, "dtype %d, %d x %d, n %d: relative error %g", t, rows, cols, n, e);
                /* the residual form: the same sums added to what y held */
                for (size_t i = 0; i < (size_t)n * rows; i++) want[i] = y0[i] + y[i];
                cuda_upload(dy, y0, (size_t)n * rows * 4, "y", (char[64]){0}, 64);
                cuda_matmul(dy, dx, dw, codes[t], rows, cols, n, 1);
                down(y, dy, (size_t)n * rows * 4);
                cr_expect(memcmp(y, want, (size_t)n * rows * 4) == 0, "dtype %d, %d x %d, n %d: y += x W^T differs "
                          "from y + (x W^T)", t, rows, cols, n);
                cuda_free(dw), cuda_free(dx), cuda_free(dy);
                free(hw), free(x), free(y), free(want), free(y0);
                if (types[t] == DT_Q8) weight_free(&w);
            }
}

/* The decode matmul's fused forms give the bits of the kernels they fuse:
 * every dtype, 1 to 8 tokens, one warp per row (8192 rows) and eight (512). */
Test(cuda, matvec_fusions_equal_their_parts) {
    need_gpu();
    const DType types[] = {DT_BF16, DT_F16, DT_F32, DT_Q8};
    const int codes[] = {CUDA_BF16, CUDA_F16, CUDA_F32, CUDA_Q8}, halves[] = {256, 4096}, ns[] = {1, 3, 8};
    const int H = 256;
    for (int t = 0; t < 4; t++)
        for (int k = 0; k < 2; k++)
            for (int c = 0; c < 3; c++) {
                const int I = halves[k], n = ns[c];
                Weight w;
                void *hw = types[t] == DT_Q8 ? rand_q8(&w, 2 * I, H) : rand_weight(&w, types[t], 2 * I, H);
                float *x = malloc(n * H * 4), *nw = malloc(H * 4), *a = malloc(n * 2 * I * 4),
                      *b = malloc(n * 2 * I * 4);
                fill(x, n * H), fill(nw, H);
                void *dw = up(hw, cuda_weight_bytes(codes[t], 2 * I, H));
                float *dx = up(x, n * H * 4), *dnw = up(nw, H * 4), *dxb = up(NULL, n * H * 4),
                      *dgu = up(NULL, n * 2 * I * 4), *dy1 = up(NULL, n * 2 * I * 4), *dy2 = up(NULL, n * 2 * I * 4);
                cuda_rmsnorm(dxb, H, dx, H, dnw, n, H, 1e-6f);
                cuda_matmul(dy1, dxb, dw, codes[t], 2 * I, H, n, 0);
                cuda_matvec(dy2, dx, 1, dnw, 1e-6f, dw, codes[t], 2 * I, H, n, 0, 0);
                down(a, dy1, n * 2 * I * 4), down(b, dy2, n * 2 * I * 4);
                cr_expect(memcmp(a, b, n * 2 * I * 4) == 0, "dtype %d, %d rows, n %d: rmsnorm inside the matmul "
                          "differs from rmsnorm then matmul", t, 2 * I, n);
                cuda_matmul(dgu, dxb, dw, codes[t], 2 * I, H, n, 0);
                cuda_swiglu(dy1, dgu, n, I);
                cuda_matvec(dy2, dx, 1, dnw, 1e-6f, dw, codes[t], 2 * I, H, n, 1, 0);
                down(a, dy1, n * I * 4), down(b, dy2, n * I * 4);
                cr_expect(memcmp(a, b, n * I * 4) == 0, "dtype %d, %d rows, n %d: rmsnorm + matmul + swiglu in one "
                          "pass differs from the three", t, 2 * I, n);
                cuda_free(dw), cuda_free(dx), cuda_free(dnw), cuda_free(dxb), cuda_free(dgu), cuda_free(dy1);
                cuda_free(dy2);
                free(hw), free(x), free(nw), free(a), free(b);
                if (types[t] == DT_Q8) weight_free(&w);
            }
}

/* A device buffer holding bytes at 8 bytes past its start (so 8 bytes
 * past a 256-byte boundary, the alignment that takes the 8-byte loads). */
static char *up_at8(const void *h, size_t bytes) {
    char err[256], *d = up(NULL, bytes + 8);
    cr_assert_eq(cuda_upload(d + 8, h, bytes, "test data", err, sizeof err), 0, "%s", err);
    return d;
}

/* cuda_matmul_run over parts of a matrix, each in its own buffer 8 bytes
 * off (how model/gpu.c reads a checkpoint where it is mapped, -wmem map),
 * gives one launch's bits over the whole: stacked parts of 512 + 1024 rows
 * (the whole takes 4 warps a row, a 512-row matrix alone 8) and 96 + 32
 * (the whole on the tensor cores, the parts' last tiles short), plain and
 * with the RMSNorm inside; and the same rows as gate (even) and up (odd)
 * tensors, a pair: decode's one pass ending in the SwiGLU, prefill's two
 * launches into alternate columns. bf16, f16 and f32; 1, 5 and 100 tokens. */
Test(cuda, matmul_parts_give_the_wholes_bits) {
    need_gpu();
    const DType types[] = {DT_BF16, DT_F16, DT_F32};
    const int codes[] = {CUDA_BF16, CUDA_F16, CUDA_F32}, ns[] = {1, 5, 100}, C = 1024;
    const int splits[2][2] = {{512, 1024}, {96, 32}};
    for (int t = 0; t < 3; t++)
        for (int sp = 0; sp < 2; sp++)
            for (int k = 0; k < 3; k++) {
                const int R = splits[sp][0] + splits[sp][1], I = R / 2, n = ns[k], dt = codes[t];
                const size_t es = dtype_size(types[t]), row = (size_t)C * es, out = (size_t)n * R * 4;
                Weight w;
                char *hw = rand_weight(&w, types[t], R, C), *hg = malloc((size_t)I * row), *hu = malloc((size_t)I * row);
                float *x = malloc((size_t)n * C * 4), *nw = malloc(C * 4), *a = malloc(out), *b = malloc(out);
                cr_assert(hg && hu && x && nw && a && b);
                fill(x, n * C), fill(nw, C);
                for (int i = 0; i < I; i++) {
                    memcpy(hg + (size_t)i * row, hw + (size_t)(2 * i) * row, row);
                    memcpy(hu + (size_t)i * row, hw + (size_t)(2 * i + 1) * row, row);
                }
                char *dw = up(hw, (size_t)R * row), *dp[2], *dg = up_at8(hg, (size_t)I * row),
                     *du = up_at8(hu, (size_t)I * row);
                dp[0] = up_at8(hw, (size_t)splits[sp][0] * row);
                dp[1] = up_at8(hw + (size_t)splits[sp][0] * row, (size_t)splits[sp][1] * row);
                float *dx = up(x, (size_t)n * C * 4), *dnw = up(nw, C * 4), *dy1 = up(NULL, out), *dy2 = up(NULL, out);
                for (int xm = 0; xm <= (n <= CUDA_MATVEC_MAX); xm++) {
                    if (xm) cuda_matvec(dy1, dx, 1, dnw, 1e-6f, dw, dt, R, C, n, 0, 0);
                    else cuda_matmul(dy1, dx, dw, dt, R, C, n, 0);
                    CudaMatmul c = {.x = dx, .ld = (size_t)C, .dtype = dt, .cols = C, .n = n, .ldy = R, .ys = 1,
                                    .shape_rows = R, .narrow = 1, .xmode = xm, .nw = dnw, .eps = 1e-6f};
                    for (int p = 0, r0 = 0; p < 2; r0 += splits[sp][p++]) {
                        c.w = dp[p] + 8, c.rows = splits[sp][p], c.y = dy2 + r0;
                        cuda_matmul_run(&c);
                    }
                    down(a, dy1, out), down(b, dy2, out);
                    cr_expect(memcmp(a, b, out) == 0, "dtype %d, %d + %d rows, n %d%s: the parts differ from the "
                              "whole", t, splits[sp][0], splits[sp][1], n, xm ? ", RMSNorm inside" : "");
                }
                CudaMatmul c = {.x = dx, .ld = (size_t)C, .dtype = dt, .cols = C, .n = n, .shape_rows = R,
                                .narrow = 1};
                size_t bytes = out;
                if (n <= CUDA_MATVEC_MAX) {
                    cuda_matvec(dy1, dx, 1, dnw, 1e-6f, dw, dt, R, C, n, 1, 0);
                    c.y = dy2, c.w = dg + 8, c.w2 = du + 8, c.rows = c.ldy = I, c.ys = 1, c.pair = 1;
                    c.xmode = 1, c.nw = dnw, c.eps = 1e-6f;
                    cuda_matmul_run(&c);
                    bytes = (size_t)n * I * 4;
                } else {
                    cuda_matmul(dy1, dx, dw, dt, R, C, n, 0);
                    c.rows = I, c.ldy = R, c.ys = 2;
                    c.y = dy2, c.w = dg + 8;
                    cuda_matmul_run(&c);
                    c.y = dy2 + 1, c.w = du + 8;
                    cuda_matmul_run(&c);
                }
                down(a, dy1, bytes), down(b, dy2, bytes);
                cr_expect(memcmp(a, b, bytes) == 0, "dtype %d, gate and up of %d rows, n %d: the pair differs from "
                          "the interleaved matrix", t, I, n);
                cuda_free(dw), cuda_free(dp[0]), cuda_free(dp[1]), cuda_free(dg), cuda_free(du), cuda_free(dx);
                cuda_free(dnw), cuda_free(dy1), cuda_free(dy2);
                free(hw), free(hg), free(hu), free(x), free(nw), free(a), free(b);
            }
}

Test(cuda, row_ops_match_the_c_ones) {
    need_gpu();
    const int n = 7, H = 1000;
    float *x = malloc(n * H * 4), *w = malloc(H * 4), *gu = malloc(2 * n * H * 4), *want = malloc(n * H * 4),
          *got = malloc(n * H * 4);
    fill(x, n * H), fill(w, H), fill(gu, 2 * n * H);
    float *dx = up(x, n * H * 4), *dw = up(w, H * 4), *dgu = up(gu, 2 * n * H * 4), *dy = up(NULL, n * H * 4);
    /* rmsnorm: the same double sum, so at most a last-bit difference */
    for (int i = 0; i < n; i++) rmsnorm(want + i * H, x + i * H, w, H, 1e-6f);
    cuda_rmsnorm(dy, H, dx, H, dw, n, H, 1e-6f);
    down(got, dy, n * H * 4);
    cr_expect(rel_err(got, want, n * H) <= 1e-6, "rmsnorm: %g", rel_err(got, want, n * H));
    /* swiglu on interleaved gate, up: expf on both sides, each within 2 ulp */
    for (int i = 0; i < n * H; i++) {
        float g = gu[2 * i], u = gu[2 * i + 1];
        swiglu_ref(&g, &u, 1);
        want[i] = g;
    }
    cuda_swiglu(dy, dgu, n, H);
    down(got, dy, n * H * 4);
    cr_expect(rel_err(got, want, n * H) <= 1e-6, "swiglu: %g", rel_err(got, want, n * H));
    /* the finiteness check: the first row with a NaN or an infinity */
    int first = 0, *dfirst = up(NULL, sizeof first);
    cuda_find_nonfinite(dfirst, dx, n, H);
    down(&first, dfirst, sizeof first);
    cr_expect_eq(first, INT_MAX, "all finite, yet row %d was named", first);
    x[5 * H + 2] = NAN;
    x[3 * H + H - 1] = INFINITY;
    cuda_upload(dx, x, n * H * 4, "x", (char[64]){0}, 64);
    cuda_find_nonfinite(dfirst, dx, n, H);
    down(&first, dfirst, sizeof first);
    cr_expect_eq(first, 3, "an infinity in row 3 and a NaN in row 5: found row %d", first);
    cuda_free(dx), cuda_free(dw), cuda_free(dgu), cuda_free(dy), cuda_free(dfirst);
    free(x), free(w), free(gu), free(want), free(got);
}

Test(cuda, embedding_rows_are_exact) {
    need_gpu();
    const int V = 50, H = 264, toks[] = {3, 49, 0, 3};
    Weight w;
    void *hw = rand_weight(&w, DT_BF16, V, H);
    float want[4 * 264], got[4 * 264];
    for (int i = 0; i < 4; i++) weight_row(&w, toks[i], want + i * H);
    void *dw = up(hw, (size_t)V * H * 2);
    int *dt = up(toks, sizeof toks);
    float *dx = up(NULL, sizeof got);
    cuda_embed(dx, dw, CUDA_BF16, dt, 4, H);
    down(got, dx, sizeof got);
    cr_expect(memcmp(got, want, sizeof got) == 0, "embedding rows differ");
    cuda_free(dw), cuda_free(dt), cuda_free(dx);
    free(hw);
}

/* q/k norm + RoPE + store: q in place and the cache rows against rmsnorm
 * then rope on the CPU (f32 cache: to rounding; f16: the rounded bits;
 * q8: kv/q8.c's blocks of the same keys and values, byte for byte). */
Test(cuda, qk_rope_store_matches_rmsnorm_and_rope) {
    need_gpu();
    /* one q|k|v matmul's rows [n, (nh + 2 nkv) hd], as the model has them */
    enum { n = 3, nh = 4, nkv = 2, hd = 128, ld = (nh + 2 * nkv) * hd };
    const int rot = 128, cap = 40, pos = 21, half = rot / 2;
    float gk[n][nkv][hd]; /* the GPU's keys, from the f32 pass, for the q8 pass's CPU quantizer */
    float qkv[n * ld], qn[hd], kn[hd];
    fill(qkv, n * ld), fill(qn, hd), fill(kn, hd);
    for (int fmt = 0; fmt <= CUDA_KV_POLAR4; fmt++) {
        const int f16 = fmt == CUDA_KV_F16;
        float *cs = malloc((size_t)cap * half * 4), *sn = malloc((size_t)cap * half * 4);
        for (int p = 0; p < cap; p++)
            for (int j = 0; j < half; j++) {
                double a = p * pow(1e6, -2.0 * j / rot);
                cs[p * half + j] = (float)cos(a), sn[p * half + j] = (float)sin(a);
            }
        const size_t sb = cuda_kv_stream_bytes(fmt, hd, cap), cbytes = nkv * sb;
        float *dq = up(qkv, sizeof qkv), *dqn = up(qn, sizeof qn), *dkn = up(kn, sizeof kn),
              *dcs = up(cs, (size_t)cap * half * 4), *dsn = up(sn, (size_t)cap * half * 4);
        void *dkc = up(NULL, cbytes), *dvc = up(NULL, cbytes);
        int *dpos = up(&pos, sizeof pos);
        cuda_qk_rope_store(dq, dq + nh * hd, dq + (nh + nkv) * hd, ld, dqn, dkn, dcs, dsn, dkc, dvc, fmt, dpos, n, nh,
                           nkv, hd, rot, cap, 1e-6f);
        float gq[n * ld];
        char *kc = malloc(cbytes), *vc = malloc(cbytes);
        down(gq, dq, sizeof gq);
        down(kc, dkc, cbytes), down(vc, dvc, cbytes);
        if (fmt >= CUDA_KV_TBQ2)
            /* tbq, q4, q4h, lm3, polar4: the roped keys stay in the q|k|v rows for
             * their store, as the f32 pass stored them */
            for (int i = 0; i < n; i++)
                for (int h = 0; h < nkv; h++)
                    cr_expect(memcmp(gq + i * ld + (nh + h) * hd, gk[i][h], sizeof gk[i][h]) == 0,
                              "format %d: token %d key head %d not left roped in place", fmt, i, h);
        if (fmt == CUDA_KV_Q8) {
            /* the CPU's q8 append of the same keys (the f32 pass's) and values: the same blocks */
            KVSpec spec;
            char err[256];
            cr_assert_eq(kv_spec_parse("q8", &spec, err, sizeof err), 0, "%s", err);
            for (int h = 0; h < nkv; h++)
                for (int role = 0; role < 2; role++) {
                    KVStream cs8, gs8;
                    cr_assert_eq(kv_stream_init(&cs8, spec.k, &spec.ko, hd, cap, 0, role, err, sizeof err), 0, "%s",
                                 err);
                    gs8 = cs8;
                    gs8.data = (uint8_t *)(role ? vc : kc) + h * sb;
                    for (int t = 0; t < pos + n; t++) {
                        float x[hd], a[hd], b[hd];
                        for (int j = 0; j < hd; j++)
                            x[j] = t < pos ? 0
                                   : role  ? qkv[(t - pos) * ld + (nh + nkv + h) * hd + j]
                                           : gk[t - pos][h][j];
                        kv_stream_append(&cs8, x);
                        if (t < pos) continue;
                        spec.k->dequant(&cs8, t, a), spec.k->dequant(&gs8, t, b);
                        cr_expect(memcmp(a, b, sizeof a) == 0, "q8 %s at token %d head %d: the GPU's block differs",
                                  role ? "value" : "key", t - pos, h);
                    }
                    kv_stream_free(&cs8);
                }
        }
        for (int i = 0; i < n && fmt < CUDA_KV_Q8; i++) {
            for (int h = 0; h < nh + nkv; h++) {
                float x[128];
                const float *src = qkv + i * ld + h * hd; /* queries, then keys */
                rmsnorm(x, src, h < nh ? qn : kn, hd, 1e-6f);
                rope(x, cs + (pos + i) * half, sn + (pos + i) * half, rot);
                for (int j = 0; j < hd; j++) {
                    float g;
                    if (h < nh) g = gq[i * ld + h * hd + j];
                    else {
                        size_t at = ((size_t)(h - nh) * cap + pos + i) * hd + j;
                        g = f16 ? f16_to_f32(((uint16_t *)kc)[at]) : ((float *)kc)[at];
                        if (!f16) gk[i][h - nh][j] = g;
                        if (f16) x[j] = f16_to_f32(f32_to_f16(x[j]));
                    }
                    cr_expect(fabsf(g - x[j]) <= 1e-6f * (1 + fabsf(x[j])), "f16 %d token %d head %d dim %d: %g vs %g",
                              f16, i, h, j, g, x[j]);
                }
            }
            for (int h = 0; h < nkv; h++)
                for (int j = 0; j < hd; j++) {
                    size_t at = ((size_t)h * cap + pos + i) * hd + j;
                    float want = qkv[i * ld + (nh + nkv + h) * hd + j];
                    float g = f16 ? f16_to_f32(((uint16_t *)vc)[at]) : ((float *)vc)[at];
                    if (f16) want = f16_to_f32(f32_to_f16(want));
                    cr_expect(g == want, "value stored at token %d head %d dim %d", i, h, j);
                }
        }
        cuda_free(dq), cuda_free(dqn), cuda_free(dkn), cuda_free(dcs), cuda_free(dsn);
        cuda_free(dkc), cuda_free(dvc), cuda_free(dpos);
        free(cs), free(sn), free(kc), free(vc);
    }
}

/* attn_group_ref with the scores of the scheme's integer twin (score_int,
 * the CPU's VNNI arithmetic in plain C) over the scaled queries in the
 * keys' domain: what the GPU computes over a tbq4 cache at head dim 128. */
static void attn_int_ref(const KVStream *k, const KVStream *v, const float *q, int nq, float scale, float *out) {
    const int d = k->d, len = k->len;
    float *s = malloc((size_t)len * sizeof(float)), qd[256], x[256];
    for (int i = 0; i < nq; i++) {
        kv_to_domain_scaled(k, q + (size_t)i * d, scale, qd);
        cr_assert_eq(k->scheme->score_int(k, qd, 1, 0, len, s, len), 0, "%s: no integer scores", k->scheme->name);
        float mx = -INFINITY, sum = 0;
        for (int t = 0; t < len; t++) mx = s[t] > mx ? s[t] : mx;
        for (int t = 0; t < len; t++) sum += (s[t] = expf(s[t] - mx));
        float *oi = out + (size_t)i * d;
        memset(oi, 0, (size_t)d * sizeof(float));
        for (int t = 0; t < len; t++) {
            kv_stream_get(v, t, x);
            for (int j = 0; j < d; j++) oi[j] += s[t] / sum * x[j];
        }
    }
    free(s);
}

/* Attention of n new tokens after pos cached ones, against attn_group_ref
 * (attn_int_ref for tbq4 at head dim 128) token by token over CPU streams
 * holding the same rows. */
static void check_attention(const char *scheme, int hd, int nkv, int gqa, int pos, int n, int splits) {
    const int nh = nkv * gqa, cap = pos + n + 5, L = pos + n;
    const int fmt = gpu_kv_fmt(scheme), f16 = fmt == CUDA_KV_F16;
    cr_assert_geq(fmt, 0, "no CUDA format for %s", scheme);
    char err[256];
    KVSpec spec;
    cr_assert_eq(kv_spec_parse(scheme, &spec, err, sizeof err), 0, "%s", err);
    float *K = malloc((size_t)L * nkv * hd * 4), *Vv = malloc((size_t)L * nkv * hd * 4);
    float *q = malloc((size_t)n * nh * hd * 4), *want = malloc((size_t)n * nh * hd * 4),
          *got = malloc((size_t)n * nh * hd * 4);
    /* head-distinct, non-zero rows; keys scaled so the softmax is not flat */
    for (size_t i = 0; i < (size_t)L * nkv * hd; i++) K[i] = grand() * 0.3f, Vv[i] = grand();
    fill(q, n * nh * hd);
    const size_t sb = cuda_kv_stream_bytes(fmt, hd, cap), cbytes = nkv * sb;
    char *kc = calloc(1, cbytes), *vc = calloc(1, cbytes);
    for (int h = 0; h < nkv; h++) {
        KVStream ks, vs;
        cr_assert_eq(kv_stream_init(&ks, spec.k, &spec.ko, hd, cap, 0, 0, err, sizeof err), 0, "%s", err);
        cr_assert_eq(kv_stream_init(&vs, spec.v, &spec.vo, hd, cap, 0, 1, err, sizeof err), 0, "%s", err);
        for (int t = 0; t < L; t++) {
            const float *kr = K + ((size_t)t * nkv + h) * hd, *vr = Vv + ((size_t)t * nkv + h) * hd;
            kv_stream_append(&ks, kr);
            kv_stream_append(&vs, vr);
            for (int j = 0; j < hd && fmt < CUDA_KV_Q8; j++) {
                size_t at = ((size_t)h * cap + t) * hd + j;
                if (f16) ((uint16_t *)kc)[at] = f32_to_f16(kr[j]), ((uint16_t *)vc)[at] = f32_to_f16(vr[j]);
                else ((float *)kc)[at] = kr[j], ((float *)vc)[at] = vr[j];
            }
            if (t >= pos) {
                const size_t at = ((size_t)(t - pos) * nh + h * gqa) * hd;
                const float sc = 1.0f / sqrtf((float)hd);
                if (fmt == CUDA_KV_TBQ4 && hd == 128) attn_int_ref(&ks, &vs, q + at, gqa, sc, want + at);
                else cr_assert_eq(attn_group_ref(&ks, &vs, q + at, gqa, sc, want + at), 0);
            }
        }
        /* q8 and tbq: the CPU's bytes are the GPU's (tbq's stream holds
         * more positions on the GPU, rounded up to 32) */
        if (fmt >= CUDA_KV_Q8) {
            const size_t cb = fmt == CUDA_KV_Q8 ? sb : ks.scheme->span(&ks, cap);
            memcpy(kc + h * sb, ks.data, cb), memcpy(vc + h * sb, vs.data, cb);
        }
        kv_stream_free(&ks), kv_stream_free(&vs);
    }
    CudaInfo info;
    cr_assert_eq(cuda_open(&info, err, sizeof err), 0, "%s", err);
    /* 0: as the model picks them; else forced (256 is the most, mostly empty at a short context) */
    if (!splits) splits = cuda_attn_splits(n, nh, nkv, hd, cap, info.sm_count);
    void *dkc = up(kc, cbytes), *dvc = up(vc, cbytes);
    float *dq = up(q, (size_t)n * nh * hd * 4), *dout = up(NULL, (size_t)n * nh * hd * 4);
    float *dpart = up(NULL, cuda_attn_part_floats(n, nh, hd, splits) * 4);
    int *dcount = up(NULL, (size_t)n * nkv * sizeof(int));
    cuda_memset(dcount, 0, (size_t)n * nkv * sizeof(int));
    int *dpos = up(&pos, sizeof pos);
    float *drot = rot_up(fmt);
    if (drot) {
        /* polar4 attends queries rotated by its store */
        float *qr = malloc((size_t)n * nh * hd * 4);
        memcpy(qr, q, (size_t)n * nh * hd * 4);
        rot_rows_host(qr, n * nh);
        cr_assert_eq(cuda_upload(dq, qr, (size_t)n * nh * hd * 4, "test data", err, sizeof err), 0, "%s", err);
        free(qr);
    }
    cuda_attention(dout, dq, nh * hd, dkc, dvc, fmt, drot, dpos, n, nh, nkv, hd, cap, 1.0f / sqrtf((float)hd), dpart,
                   dcount, splits);
    down(got, dout, (size_t)n * nh * hd * 4);
    /* again over the same scratch: its split counters were left at zero */
    float *again = malloc((size_t)n * nh * hd * 4);
    cuda_attention(dout, dq, nh * hd, dkc, dvc, fmt, drot, dpos, n, nh, nkv, hd, cap, 1.0f / sqrtf((float)hd), dpart,
                   dcount, splits);
    down(again, dout, (size_t)n * nh * hd * 4);
    cr_expect(memcmp(got, again, (size_t)n * nh * hd * 4) == 0, "a second call over the same scratch differs");
    free(again);
    /* per (token, head): error over the output's norm */
    for (int r = 0; r < n * nh; r++) {
        double d = 0, w = 0;
        for (int j = 0; j < hd; j++) {
            double e = (double)got[r * hd + j] - want[r * hd + j];
            d += e * e, w += (double)want[r * hd + j] * want[r * hd + j];
        }
        cr_expect(sqrt(d / w) <= 1e-5, "%s hd %d nkv %d gqa %d pos %d n %d: token %d head %d: relative error %g",
                  scheme, hd, nkv, gqa, pos, n, r / nh, r % nh, sqrt(d / w));
    }
    cuda_free(dkc), cuda_free(dvc), cuda_free(dq), cuda_free(dout), cuda_free(dpart), cuda_free(dcount);
    cuda_free(dpos), cuda_free(drot);
    free(K), free(Vv), free(q), free(want), free(got), free(kc), free(vc);
}

Test(cuda, attention_matches_attn_group_ref) {
    need_gpu();
    const char *schemes[] = {"f32", "f16", "q8", "tbq4", "tbq3", "tbq2", "q4", "q4h", "lm3", "polar4"};
    /* decode (both variants), verification, prefill chunks, a context of
     * one position, lengths off the 32-position runs */
    const int cases[][4] = {/* gqa, pos, n, nkv */ {1, 0, 1, 2},   {2, 1000, 1, 8}, {4, 333, 1, 8}, {6, 129, 3, 2},
                            {2, 300, 5, 2},   {4, 50, 37, 2},  {2, 0, 70, 1},   {8, 4095, 1, 4},
                            {2, 5000, 4, 8},  {16, 77, 2, 1}};
    for (int s = 0; s < 10; s++)
        for (int hd = 128; hd <= (s < 6 ? 256 : 128); hd *= 2) /* q4, q4h, lm3, polar4: 128 only */
            for (size_t c = 0; c < sizeof cases / sizeof *cases; c++)
                if (cases[c][0] <= (hd == 128 ? 16 : 8))
                    check_attention(schemes[s], hd, cases[c][3], cases[c][0], cases[c][1], cases[c][2], 0);
    check_attention("f16", 128, 8, 2, 300, 1, 256);
    check_attention("f16", 128, 2, 4, 40000, 1, 256);
    check_attention("f32", 256, 2, 2, 700, 3, 256);
    check_attention("q8", 128, 2, 4, 40000, 1, 256);
    check_attention("tbq4", 128, 2, 4, 40000, 1, 256);
    check_attention("tbq3", 256, 2, 2, 700, 3, 256);
    check_attention("q4h", 128, 2, 4, 40000, 1, 256);
    check_attention("polar4", 128, 2, 4, 40000, 1, 256);
}

/* kv/tbq.cu, kv/q4.cu, kv/lm3.cu and kv/polar4.cu against the CPU's
 * appends: the same rows give the same bytes, for tbq's 2, 3 and 4 bits at
 * head dims 128 and 256 (two blocks) and q4, q4h, lm3, polar4 at 128, with
 * a zero row and rows a thousand times larger and smaller than the rest. */
Test(cuda, coded_stores_match_the_cpu_appends) {
    need_gpu();
    enum { n = 5, nkv = 3 };
    const int pos = 37, cap = 45;
    for (int hd = 128; hd <= 256; hd *= 2) {
        const int ld = 3 * nkv * hd; /* rows of q|k|v, k and v at nkv hd and 2 nkv hd */
        float *rows = malloc((size_t)n * ld * 4);
        fill(rows, n * ld);
        for (int i = 0; i < n; i++)
            for (int j = 0; j < 2 * nkv * hd; j++) {
                float *x = rows + (size_t)i * ld + nkv * hd + j;
                /* token 1's first key head zero, token 2's scaled up a thousandfold, token 3's down */
                if (i == 1 && j < hd) *x = 0;
                if (i == 2) *x *= 1000;
                if (i == 3) *x *= 1e-3f;
            }
        for (int fmt = CUDA_KV_TBQ2; fmt <= (hd == 128 ? CUDA_KV_POLAR4 : CUDA_KV_TBQ4); fmt++) {
            static const char *const names[] = {"tbq2", "tbq3", "tbq4", "q4", "q4h", "lm3", "polar4"};
            const char *scheme = names[fmt - CUDA_KV_TBQ2];
            const size_t sb = cuda_kv_stream_bytes(fmt, hd, cap);
            float *drows = up(rows, (size_t)n * ld * 4);
            int *dpos = up(&pos, sizeof pos);
            void *dkc = up(NULL, nkv * sb), *dvc = up(NULL, nkv * sb);
            float *dk = drows + nkv * hd, *dv = drows + 2 * nkv * hd, *drot = rot_up(fmt);
            if (fmt == CUDA_KV_POLAR4) cuda_polar4_store(NULL, 0, dk, dv, ld, dkc, dvc, drot, dpos, n, nkv, hd, cap);
            else if (fmt == CUDA_KV_LM3) cuda_lm3_store(dk, dv, ld, dkc, dvc, dpos, n, nkv, hd, cap);
            else if (fmt >= CUDA_KV_Q4) cuda_q4_store(dk, dv, ld, dkc, dvc, fmt, dpos, n, nkv, hd, cap);
            else cuda_tbq_store(dk, dv, ld, dkc, dvc, fmt, dpos, n, nkv, hd, cap);
            uint8_t *kc = malloc(nkv * sb), *vc = malloc(nkv * sb);
            down(kc, dkc, nkv * sb), down(vc, dvc, nkv * sb);
            KVSpec spec;
            char err[256];
            cr_assert_eq(kv_spec_parse(scheme, &spec, err, sizeof err), 0, "%s", err);
            for (int h = 0; h < nkv; h++)
                for (int role = 0; role < 2; role++) {
                    KVStream s;
                    cr_assert_eq(kv_stream_init(&s, spec.k, &spec.ko, hd, cap, 0, role, err, sizeof err), 0, "%s", err);
                    const size_t vb = s.scheme->span(&s, 1);
                    float zero[256] = {0};
                    for (int t = 0; t < pos + n; t++)
                        kv_stream_append(&s, t < pos ? zero
                                                     : rows + (size_t)(t - pos) * ld + (1 + role) * nkv * hd + h * hd);
                    for (int i = 0; i < n; i++) {
                        const uint8_t *g = (role ? vc : kc) + h * sb + (pos + i) * vb, *c = s.data + (pos + i) * vb;
                        cr_expect(memcmp(g, c, vb) == 0, "%s hd %d %s head %d token %d: the GPU's block differs "
                                  "(scale %04x vs %04x)", scheme, hd, role ? "value" : "key", h, i,
                                  g[0] | g[1] << 8, c[0] | c[1] << 8);
                    }
                    kv_stream_free(&s);
                }
            cuda_free(drows), cuda_free(dpos), cuda_free(dkc), cuda_free(dvc), cuda_free(drot);
            free(kc), free(vc);
        }
        free(rows);
    }
}

/* polar4's store rotates each kv head's group of queries in place, bit
 * for bit as rot_rows (kv/polar4.c) rotates them, and leaves the keys and
 * values as they were: groups of 1 to 16 query heads. */
Test(cuda, polar4_store_rotates_every_query_head) {
    need_gpu();
    enum { n = 3, nkv = 2, hd = 128 };
    const int pos = 5, cap = 40, gqas[] = {1, 2, 5, 16};
    float *drot = rot_up(CUDA_KV_POLAR4);
    const size_t sb = cuda_kv_stream_bytes(CUDA_KV_POLAR4, hd, cap);
    for (size_t g = 0; g < sizeof gqas / sizeof *gqas; g++) {
        const int nh = nkv * gqas[g], ld = (nh + 2 * nkv) * hd;
        float *rows = malloc((size_t)n * ld * 4), *got = malloc((size_t)n * ld * 4);
        fill(rows, n * ld);
        float *drows = up(rows, (size_t)n * ld * 4);
        int *dpos = up(&pos, sizeof pos);
        void *dkc = up(NULL, nkv * sb), *dvc = up(NULL, nkv * sb);
        cuda_polar4_store(drows, nh, drows + nh * hd, drows + (nh + nkv) * hd, ld, dkc, dvc, drot, dpos, n, nkv, hd,
                          cap);
        down(got, drows, (size_t)n * ld * 4);
        for (int i = 0; i < n; i++) {
            rot_rows_host(rows + (size_t)i * ld, nh);
            cr_expect(memcmp(got + (size_t)i * ld, rows + (size_t)i * ld, (size_t)ld * 4) == 0,
                      "gqa %d: token %d's row is not rot_rows' queries and the keys and values as they were",
                      gqas[g], i);
        }
        cuda_free(drows), cuda_free(dpos), cuda_free(dkc), cuda_free(dvc);
        free(rows), free(got);
    }
    cuda_free(drot);
}

/* sampler.cu against sampler_sample: the same filters and coins pick the
 * same token, unless the coin lies within 1e-5 of the boundary between
 * the two picks (the running sums are added in another order), and keep
 * the same number of tokens. Random logits with a spread like a model's,
 * a few tied maxima, and penalties on a window holding the likeliest
 * tokens. */
Test(cuda, sampling_matches_sampler_sample) {
    need_gpu();
    static const struct {
        float t, p, minp;
        int k, pen;
    } cases[] = {
        {0, 1, 0, 0, 0},   {0, 1, 0, 0, 1},       {0.7f, 1, 0, 0, 0},     {1, 1, 0, 40, 0},
        {1, 0.9f, 0, 0, 0}, {1, 1, 0.05f, 0, 0},  {1.3f, 0.95f, 0.02f, 50, 0}, {0.8f, 0.9f, 0, 40, 1},
        {1, 1e-9f, 0, 0, 0}, {1, 1, 0, 1, 0},     {2, 1, 0, 200000, 0},   {0.5f, 0.5f, 0.5f, 3, 1},
        {1, 0.9f, 0.02f, 5000, 0}, /* a top-k past the sort's 1024, then top-p's mass descent */
    };
    const int V = 151936, trials = 60;
    float *lg = malloc((size_t)V * sizeof(float));
    for (int i = 0; i < V; i++) lg[i] = 4 * (urand() + urand() + urand() - 1.5f);
    for (int i = 0; i < 8; i++) lg[1000 + 7919 * i] = 9; /* tied maxima, then a spread below */
    for (int i = 0; i < 50; i++) lg[50000 + i] = 8 - 0.05f * i;
    float *dl = up(NULL, (size_t)V * 4), *dprob = up(NULL, (size_t)V * 4);
    int *dout = up(NULL, 2 * sizeof(int)), *dpen = up(NULL, 2 * 64 * sizeof(int));
    double *cum = malloc((size_t)V * sizeof(double));
    int mismatched = 0;
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        Sampler a, b;
        cr_assert_eq(sampler_init(&a, V, cases[c].t, cases[c].k, cases[c].p, cases[c].minp, 11 + c), 0);
        cr_assert_eq(sampler_init(&b, V, cases[c].t, cases[c].k, cases[c].p, cases[c].minp, 11 + c), 0);
        if (cases[c].pen) {
            cr_assert_eq(sampler_set_penalties(&a, 64, 1.3f, 0.2f, 0.1f), 0);
            cr_assert_eq(sampler_set_penalties(&b, 64, 1.3f, 0.2f, 0.1f), 0);
            for (int i = 0; i < 80; i++) {
                const int id = i % 3 ? 1000 + 7919 * (i % 8) : 50000 + i % 20;
                sampler_accept(&a, id), sampler_accept(&b, id);
            }
        }
        for (int r = 0; r < trials; r++) {
            const int want = sampler_sample(&a, lg);
            SampleDraw d;
            sampler_draw(&b, &d);
            cr_assert(d.n_pen <= 64);
            char err[256];
            cr_assert_eq(cuda_upload(dl, lg, (size_t)V * 4, "logits", err, sizeof err), 0, "%s", err);
            if (d.n_pen)
                cr_assert_eq(cuda_upload(dpen, d.pen, 2 * (size_t)d.n_pen * sizeof(int), "pen", err, sizeof err), 0);
            cuda_sample(dout, dl, V, dprob, dpen, d.n_pen, d.temperature, d.top_k, d.top_p, d.min_p, d.coin, d.repeat,
                        d.frequency, d.presence);
            int got[2];
            down(got, dout, sizeof got);
            if (cases[c].t <= 0) {
                cr_expect_eq(got[0], want, "case %zu: greedy %d, the CPU %d", c, got[0], want);
                continue;
            }
            int kept = 0;
            double run = 0;
            for (int i = 0; i < V; i++) kept += a.prob[i] > 0, cum[i] = run += a.prob[i];
            cr_expect_eq(got[1], kept, "case %zu trial %d: %d tokens kept, the CPU %d", c, r, got[1], kept);
            if (got[0] == want) continue;
            /* a pick either side of a boundary the coin all but touches */
            const int lo = got[0] < want ? got[0] : want, hi = got[0] < want ? want : got[0];
            cr_expect(lo >= 0 && hi < V && fabs(d.coin - cum[lo]) < 1e-5 && fabs(d.coin - cum[hi - 1]) < 1e-5,
                      "case %zu trial %d: coin %.9f picked %d, the CPU %d", c, r, d.coin, got[0], want);
            mismatched++;
        }
        sampler_free(&a), sampler_free(&b);
    }
    cr_expect_leq(mismatched, 2, "%d picks differ from the CPU's", mismatched);
    cuda_free(dl), cuda_free(dprob), cuda_free(dout), cuda_free(dpen);
    free(lg), free(cum);
}

/* Weights or a cache the GPU cannot hold: one line naming what and how
 * much was free, and nothing left allocated. */
Test(cuda, out_of_memory_names_what_and_leaves_nothing) {
    need_gpu();
    size_t free0, total, now;
    cuda_mem(&free0, &total);
    Config c;
    memset(&c, 0, sizeof c);
    c.arch = ARCH_QWEN3, c.vocab_size = 1000, c.head_dim = c.rot_dim = 128, c.eps = 1e-6, c.rope_theta = 1e6;
    c.tie_embeddings = 1;
    /* about 1.9 GB of bf16 weights a layer, twice what the card holds */
    c.hidden = 8192, c.n_heads = 64, c.n_kv_heads = 8, c.ffn = 32768, c.max_pos = 4096;
    c.n_layers = (int)(2 * total / 1.9e9) + 1;
    GpuModel *g = NULL;
    char err[512] = "";
    cr_expect_eq(gpu_model_random(&g, &c, 0, 1, err, sizeof err), -1, "%d layers of 1.9 GB fit?", c.n_layers);
    cr_expect(strstr(err, "out of GPU memory for the weights:") && strstr(err, "GB free"), "%s", err);
    cr_expect_null(g);
    cuda_mem(&now, &total);
    cr_expect(now + (64 << 20) >= free0, "%.2f GB free before, %.2f GB after", free0 / 1e9, now / 1e9);
    /* a model that fits, and a cache of a million positions that does not:
     * 40 layers x 8 kv heads x 1 GB of f32 K and V each */
    c.hidden = 1024, c.n_heads = 16, c.ffn = 3072, c.n_layers = 40, c.max_pos = 1 << 20;
    cuda_mem(&free0, &total);
    cr_assert_eq(gpu_model_random(&g, &c, 0, 1, err, sizeof err), 0, "%s", err);
    KVCache kv;
    KVSpec spec;
    cr_assert_eq(kv_spec_parse("f32", &spec, err, sizeof err), 0, "%s", err);
    cr_expect_eq(gpu_kv_init(g, &kv, &spec, 1 << 20, 0, err, sizeof err), -1);
    cr_expect(strstr(err, "out of GPU memory for a KV cache of 1048576 positions (-c):"), "%s", err);
    gpu_model_free(g);
    cuda_mem(&now, &total);
    cr_expect(now + (64 << 20) >= free0, "%.2f GB free before, %.2f GB after", free0 / 1e9, now / 1e9);
}

/* The shipped model on the GPU, f32 cache, against the float64 golden logits. */
static int open_shipped(Model *m, KVCache *kv, KVCache *mkv, const char *scheme, int *ids) {
    KVSpec spec;
    char err[512];
    cr_assert_eq(model_load(m, "models/qwen3-kjv-mtp", MODEL_MAPPED, err, sizeof err), 0, "%s", err);
    cr_assert_eq(model_to_gpu(m, GPU_WMEM_AUTO, err, sizeof err), 0, "%s", err);
    cr_assert_eq(kv_spec_parse(scheme, &spec, err, sizeof err), 0, "%s", err);
    cr_assert_eq(model_kv_init(m, kv, &spec, 512, 0, err, sizeof err), 0, "%s", err);
    if (mkv) cr_assert_eq(model_kv_init(m, mkv, &spec, 512, 1, err, sizeof err), 0, "%s", err);
    return read_tokens("tests/data/golden/qwen3-kjv-mtp/tokens.txt", ids, 1024);
}

static double max_abs(const float *a, const float *b, size_t n, size_t *at) {
    double w = 0;
    for (size_t i = 0; i < n; i++) {
        double d = isnan(a[i]) ? INFINITY : fabs((double)a[i] - b[i]);
        if (d > w) w = d, *at = i;
    }
    return w;
}

Test(cuda, shipped_model_matches_golden_logits) {
    need_gpu();
    Model m;
    KVCache kv, mkv;
    int ids[1024];
    char err[512];
    const int n = open_shipped(&m, &kv, &mkv, "f32", ids), V = m.cfg.vocab_size, H = m.cfg.hidden;
    float *want = read_f32("tests/data/golden/qwen3-kjv-mtp/logits.f32", (size_t)n * V);
    float *mwant = read_f32("tests/data/golden/qwen3-kjv-mtp/mtp_logits.f32", (size_t)(n - 1) * V);
    float *got = malloc((size_t)n * V * 4), *hidden = malloc((size_t)n * H * 4), *step = malloc((size_t)V * 4);
    /* one prefill of the whole passage */
    cr_assert_eq(model_forward(&m, &kv, ids, n, got, 1, hidden, err, sizeof err), 0, "%s", err);
    size_t at = 0;
    double e = max_abs(got, want, (size_t)n * V, &at);
    cr_expect(e <= 1e-4, "prefill: max-abs %g at position %zu", e, at / V);
    cr_assert_eq(model_mtp_forward(&m, &mkv, hidden, ids + 1, n - 1, got, 1, NULL, err, sizeof err), 0, "%s", err);
    e = max_abs(got, mwant, (size_t)(n - 1) * V, &at);
    cr_expect(e <= 1e-4, "MTP head: max-abs %g at row %zu", e, at / V);
    /* the same passage token by token (graphs of one token) */
    kv_cache_truncate(&kv, 0);
    double worst = 0;
    for (int i = 0; i < n; i++) {
        cr_assert_eq(model_forward(&m, &kv, ids + i, 1, step, 0, NULL, err, sizeof err), 0, "%s", err);
        worst = fmax(worst, max_abs(step, want + (size_t)i * V, V, &at));
    }
    cr_expect(worst <= 1e-4, "decode step by step: max-abs %g", worst);
    /* past 128 and 256 positions, decode takes more splits (a graph per
     * count): the passage repeated to 500 tokens, one prefill against
     * step-by-step decode */
    enum { LONG = 500 };
    int *rep = malloc(LONG * sizeof(int));
    float *all = malloc((size_t)LONG * V * 4);
    for (int i = 0; i < LONG; i++) rep[i] = ids[i % n];
    kv_cache_truncate(&kv, 0);
    cr_assert_eq(model_forward(&m, &kv, rep, LONG, all, 1, NULL, err, sizeof err), 0, "%s", err);
    kv_cache_truncate(&kv, 0);
    worst = 0;
    int worst_at = 0;
    for (int i = 0; i < LONG; i++) {
        cr_assert_eq(model_forward(&m, &kv, rep + i, 1, step, 0, NULL, err, sizeof err), 0, "%s", err);
        const double e1 = max_abs(step, all + (size_t)i * V, V, &at);
        if (e1 > worst) worst = e1, worst_at = i;
    }
    cr_expect(worst <= 1e-4, "500 positions, prefill against decode: max-abs %g at position %d", worst, worst_at);
    free(rep), free(all);
    free(want), free(mwant), free(got), free(hidden), free(step);
    kv_cache_free(&kv), kv_cache_free(&mkv);
    model_free(&m);
}

/* -wq q8 on the GPU: the blocks model_quantize made, uploaded as they
 * are, against the CPU over the same blocks; a prefill (the q8
 * tensor-core matmul) and step by step (the decode matmul). Only the
 * order of the sums differs: prefill sums a block then scales it,
 * decode chains the products of scaled codes as the CPU does, in
 * another order. */
Test(cuda, q8_weights_match_the_cpu, .timeout = 120) {
    need_gpu();
    Model cm, gm, *ms[2] = {&cm, &gm};
    KVCache ck, gk, *ks[2] = {&ck, &gk};
    KVSpec spec;
    int ids[1024];
    char err[512];
    cr_assert_eq(kv_spec_parse("f32", &spec, err, sizeof err), 0, "%s", err);
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(model_load(ms[i], "models/qwen3-kjv-mtp", MODEL_MAPPED, err, sizeof err), 0, "%s", err);
        cr_assert_eq(model_quantize(ms[i], MODEL_MAIN, err, sizeof err), 0, "%s", err);
        if (i) cr_assert_eq(model_to_gpu(ms[i], GPU_WMEM_AUTO, err, sizeof err), 0, "%s", err);
        cr_assert_eq(model_kv_init(ms[i], ks[i], &spec, 512, 0, err, sizeof err), 0, "%s", err);
    }
    const int n = read_tokens("tests/data/golden/qwen3-kjv-mtp/tokens.txt", ids, 1024), V = cm.cfg.vocab_size;
    const size_t N = (size_t)n * V;
    float *c = malloc(N * 4), *g = malloc(N * 4), *step = malloc((size_t)V * 4);
    cr_assert_eq(model_forward(&cm, &ck, ids, n, c, 1, NULL, err, sizeof err), 0, "%s", err);
    cr_assert_eq(model_forward(&gm, &gk, ids, n, g, 1, NULL, err, sizeof err), 0, "%s", err);
    size_t at = 0;
    const double e = max_abs(g, c, N, &at);
    cr_expect(e <= 1e-3, "prefill: max-abs %g at position %zu", e, at / V);
    kv_cache_truncate(&gk, 0);
    double worst = 0;
    for (int i = 0; i < n; i++) {
        cr_assert_eq(model_forward(&gm, &gk, ids + i, 1, step, 0, NULL, err, sizeof err), 0, "%s", err);
        worst = fmax(worst, max_abs(step, c + (size_t)i * V, V, &at));
    }
    cr_expect(worst <= 1e-3, "decode step by step: max-abs %g", worst);
    fprintf(stderr, "q8 weights: GPU against CPU logits over %d positions, max-abs %g (prefill), %g (decode)\n", n, e,
            worst);
    free(c), free(g), free(step);
    kv_cache_free(&ck), kv_cache_free(&gk);
    model_free(&cm), model_free(&gm);
}

/* The shipped model's folder at dir, its model.safetensors with pad more
 * bytes of header (spaces after the JSON, as writers pad it), which moves
 * every tensor pad bytes on. */
static const char *const shipped_files[] = {"config.json", "generation_config.json", "tokenizer.json",
                                            "tokenizer_config.json", "model.safetensors"};
static void padded_copy(const char *dir, int pad) {
    for (int i = 0; i < 5; i++) {
        char from[256], to[512];
        snprintf(from, sizeof from, "models/qwen3-kjv-mtp/%s", shipped_files[i]);
        snprintf(to, sizeof to, "%s/%s", dir, shipped_files[i]);
        size_t n = 0;
        unsigned char *b = (unsigned char *)slurp(from, &n);
        cr_assert(b && n > 8, "reading %s", from);
        FILE *f = fopen(to, "wb");
        cr_assert(f, "writing %s", to);
        if (i < 4) fwrite(b, 1, n, f);
        else {
            uint64_t h = 0;
            for (int k = 0; k < 8; k++) h |= (uint64_t)b[k] << (8 * k);
            cr_assert(h <= n - 8, "%s: header length %llu", from, (unsigned long long)h);
            const uint64_t h2 = h + (uint64_t)pad;
            unsigned char len[8];
            for (int k = 0; k < 8; k++) len[k] = (unsigned char)(h2 >> (8 * k));
            fwrite(len, 1, 8, f);
            fwrite(b + 8, 1, h, f);
            for (int k = 0; k < pad; k++) fputc(' ', f);
            fwrite(b + 8 + h, 1, n - 8 - h, f);
        }
        cr_assert_eq(fclose(f), 0, "writing %s", to);
        free(b);
    }
}

/* -wmem map gives copy's bits: the same kernels over the same bytes, q, k
 * and v as three launches into one output, gate and up from two tensors.
 * The shipped model's tensors lie 8 bytes past 16-byte boundaries (its
 * header's length), so they take the 8-byte loads; the same file with 8
 * more bytes of header puts them on 16-byte boundaries. Each against the
 * copy: one prefill (the prefill matmuls, logits and hidden states), the
 * MTP head over it, and step-by-step decode (the fused decode matmuls, in
 * graphs). */
Test(cuda, mapped_weights_give_the_copys_bits, .timeout = 120) {
    need_gpu();
    char dir[] = "/tmp/run-wmem-XXXXXX", err[512];
    CudaInfo info;
    cr_assert_eq(cuda_open(&info, err, sizeof err), 0, "%s", err);
    if (!info.pageable && !info.ro_register) {
        /* then map is refused, in one line */
        Model m;
        cr_assert_eq(model_load(&m, "models/qwen3-kjv-mtp", MODEL_MAPPED, err, sizeof err), 0, "%s", err);
        cr_expect(model_to_gpu(&m, GPU_WMEM_MAP, err, sizeof err) && strstr(err, "-wmem map: this GPU reads neither"),
                  "%s", err);
        model_free(&m);
        cr_skip_test("this GPU reads neither pageable memory nor registered read-only mappings");
    }
    cr_assert(mkdtemp(dir), "mkdtemp");
    padded_copy(dir, 8);
    const char *paths[3] = {"models/qwen3-kjv-mtp", "models/qwen3-kjv-mtp", dir};
    const int modes[3] = {GPU_WMEM_COPY, GPU_WMEM_MAP, GPU_WMEM_MAP};
    Model m[3];
    KVCache kv[3], mkv[3];
    KVSpec spec;
    int ids[1024];
    cr_assert_eq(kv_spec_parse("f32", &spec, err, sizeof err), 0, "%s", err);
    const int n = read_tokens("tests/data/golden/qwen3-kjv-mtp/tokens.txt", ids, 1024);
    float *out[3][4];
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(model_load(&m[i], paths[i], MODEL_MAPPED, err, sizeof err), 0, "%s", err);
        cr_assert_eq(model_to_gpu(&m[i], modes[i], err, sizeof err), 0, "%s: %s", paths[i], err);
        const size_t V = (size_t)m[i].cfg.vocab_size, H = (size_t)m[i].cfg.hidden;
        cr_expect_eq(gpu_model_mapped_bytes(m[i].gpu) > 0, modes[i] == GPU_WMEM_MAP, "%s: %zu bytes mapped",
                     paths[i], gpu_model_mapped_bytes(m[i].gpu));
        cr_assert_eq(model_kv_init(&m[i], &kv[i], &spec, 512, 0, err, sizeof err), 0, "%s", err);
        cr_assert_eq(model_kv_init(&m[i], &mkv[i], &spec, 512, 1, err, sizeof err), 0, "%s", err);
        float *logits = malloc((size_t)n * V * 4), *hidden = malloc((size_t)n * H * 4);
        float *mtp = malloc((size_t)n * V * 4), *steps = malloc((size_t)n * V * 4);
        cr_assert(logits && hidden && mtp && steps);
        cr_assert_eq(model_forward(&m[i], &kv[i], ids, n, logits, 1, hidden, err, sizeof err), 0, "%s", err);
        cr_assert_eq(model_mtp_forward(&m[i], &mkv[i], hidden, ids + 1, n - 1, mtp, 1, NULL, err, sizeof err), 0,
                     "%s", err);
        kv_cache_truncate(&kv[i], 0);
        for (int t = 0; t < n; t++)
            cr_assert_eq(model_forward(&m[i], &kv[i], ids + t, 1, steps + (size_t)t * V, 0, NULL, err, sizeof err), 0,
                         "%s", err);
        out[i][0] = logits, out[i][1] = hidden, out[i][2] = mtp, out[i][3] = steps;
    }
    const size_t V = (size_t)m[0].cfg.vocab_size, H = (size_t)m[0].cfg.hidden;
    const size_t bytes[4] = {(size_t)n * V * 4, (size_t)n * H * 4, (size_t)(n - 1) * V * 4, (size_t)n * V * 4};
    static const char *const what[4] = {"prefill logits", "hidden states", "MTP logits", "decode logits"};
    for (int i = 1; i < 3; i++)
        for (int k = 0; k < 4; k++)
            cr_expect_eq(memcmp(out[i][k], out[0][k], bytes[k]), 0, "-wmem map (%s) against copy: %s differ",
                         i == 1 ? "8-byte aligned" : "16-byte aligned", what[k]);
    for (int i = 0; i < 3; i++) {
        for (int k = 0; k < 4; k++) free(out[i][k]);
        kv_cache_free(&kv[i]), kv_cache_free(&mkv[i]);
        model_free(&m[i]);
    }
    for (int i = 0; i < 5; i++) {
        char p[512];
        snprintf(p, sizeof p, "%s/%s", dir, shipped_files[i]);
        unlink(p);
    }
    rmdir(dir);
}

/* Greedy text from ./run, its stderr checked: -dev cuda with and without
 * speculation and graphs, and the CPU, agree on the shipped model. */
static char *run_text(const char *env, const char *args, int gpu, int spec) {
    const char *bin = getenv("RUN_BIN") ? getenv("RUN_BIN") : "./run";
    char cmd[1024], pe[64];
    snprintf(pe, sizeof pe, "/tmp/run_cuda_err.%d", (int)getpid());
    snprintf(cmd, sizeof cmd, "%s %s models/qwen3-kjv-mtp -t 0 -n 64 -i 'And God said' %s 2>%s", env, bin, args, pe);
    FILE *p = popen(cmd, "r");
    cr_assert(p, "cannot run %s", cmd);
    char *out = calloc(1, 1 << 16);
    size_t got = fread(out, 1, (1 << 16) - 1, p);
    out[got] = 0;
    const int rc = pclose(p);
    char *err = slurp(pe, NULL);
    remove(pe);
    cr_assert_eq(rc, 0, "%s failed: %s", cmd, err);
    cr_expect(strstr(err, gpu ? " device=cuda " : " device=cpu "), "%s: %s", cmd, err);
    cr_expect(!spec || strstr(err, "spec_accept="), "%s: no speculation: %s", cmd, err);
    cr_expect(strlen(out) > strlen("And God said") + 16, "%s: no text", cmd);
    free(err);
    return out;
}

/* ./run's table from -m compare (more options in extra): per row, its ppl
 * and top-1 (%), found by "scheme weights" (its first two columns) in
 * names; 0 rows on failure. */
static int compare_rows(const char *dev, const char *extra, const char *names[], int n, double *ppl, double *top1) {
    const char *bin = getenv("RUN_BIN") ? getenv("RUN_BIN") : "./run";
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s models/qwen3-kjv-mtp -dev %s -m compare -kv f16,q8,tbq4 -f tools/data/heldout.txt "
             "-c 400 -n 8 %s 2>/dev/null", bin, dev, extra);
    FILE *p = popen(cmd, "r");
    cr_assert(p, "cannot run %s", cmd);
    char line[1024];
    int found = 0;
    while (fgets(line, sizeof line, p))
        for (int i = 0; i < n; i++) {
            char name[32], weights[32], row[72];
            double f[10];
            /* | name | weights | K bits | V bits | bytes | vs f16 | ppl | dppl | KL | top-1% | ... */
            if (sscanf(line, "| %31s | %31s | %lf | %lf | %lf | %lfx | %lf | %lf | %lf | %lf%%", name, weights, &f[0],
                       &f[1], &f[2], &f[3], &f[4], &f[5], &f[6], &f[7]) != 10)
                continue;
            snprintf(row, sizeof row, "%s %s", name, weights);
            if (!strcmp(row, names[i])) ppl[i] = f[4], top1[i] = f[7], found++;
        }
    cr_expect_eq(pclose(p), 0, "%s failed", cmd);
    return found;
}

/* The two tables' quality columns against each other: ppl within rounding
 * of the logits (q8's and tbq4's CPU scores use 8-bit queries, their GPU
 * ones f32: a little more, rows coded from 2 on), top-1 within a position
 * in a hundred. */
static void compare_tables(const char *extra, const char *names[], int n) {
    double cp[8], ct[8], gp[8], gt[8];
    cr_assert_eq(compare_rows("cpu", extra, names, n, cp, ct), n, "the CPU's table %s", extra);
    cr_assert_eq(compare_rows("cuda", extra, names, n, gp, gt), n, "the GPU's table %s", extra);
    for (int i = 0; i < n; i++) {
        cr_expect(fabs(gp[i] / cp[i] - 1) < (i >= 2 ? 2e-3 : 2e-4), "%s %s: ppl %.4f on the GPU, %.4f on the CPU",
                  names[i], extra, gp[i], cp[i]);
        cr_expect(fabs(gt[i] - ct[i]) <= 1.0, "%s %s: top-1 %.1f%% on the GPU, %.1f%% on the CPU", names[i], extra, gt[i],
                  ct[i]);
    }
}

/* -m compare on the GPU: the CPU's table. */
Test(cuda, compare_matches_the_cpu, .timeout = 120) {
    need_gpu();
    const char *names[] = {"f32 stored", "f16 stored", "q8 stored", "tbq4 stored"};
    compare_tables("", names, 4);
}

/* -m compare -wq q8 on the GPU: the stored-weights reference a second
 * model there, the rows on q8 weights; the CPU's table (q8 weights on both
 * devices: q8_weights_match_the_cpu). */
Test(cuda, compare_with_q8_weights_matches_the_cpu, .timeout = 120) {
    need_gpu();
    const char *names[] = {"f32 stored", "f32 q8", "q8 q8", "tbq4 q8"};
    compare_tables("-wq q8", names, 4);
}

/* -m kvstats on the GPU: the forward and its f32 cache there, the
 * scheme's vectors made by the CPU's quantizer (the GPU's bytes) and
 * attended by the CPU: the CPU's table within what the two devices'
 * keys and values differ by (their last bits, which may move a value to
 * the neighbouring code: a few in 10^4 of the printed errors). */
Test(cuda, kvstats_matches_the_cpu, .timeout = 120) {
    need_gpu();
    const char *bin = getenv("RUN_BIN") ? getenv("RUN_BIN") : "./run";
    static const char *const kvs[] = {"f32", "q8", "tbq4"};
    for (int k = 0; k < 3; k++) {
        double r[2][8][6];
        int n[2];
        for (int g = 0; g < 2; g++) {
            char cmd[1024];
            /* about 400 tokens of the held-out text */
            snprintf(cmd, sizeof cmd, "%s models/qwen3-kjv-mtp -dev %s -m kvstats -kv %s -i \"$(head -c 1200 "
                     "tools/data/heldout.txt)\" 2>&1", bin, g ? "cuda" : "cpu", kvs[k]);
            FILE *p = popen(cmd, "r");
            cr_assert(p, "cannot run %s", cmd);
            char *out = calloc(1, 1 << 16);
            out[fread(out, 1, (1 << 16) - 1, p)] = 0;
            cr_assert_eq(pclose(p), 0, "%s failed: %s", cmd, out);
            /* the model line names the device: "..., 2 threads, CUDA" or the CPU's kernels */
            cr_expect(!!strstr(out, " threads, CUDA\n") == g, "%s: %s", cmd, out);
            n[g] = kvstats_rows(out, r[g], 8);
            free(out);
        }
        cr_assert(n[0] == 6 && n[1] == 6, "-kv %s: %d rows on the CPU, %d on the GPU", kvs[k], n[0], n[1]);
        for (int l = 0; l < 6; l++)
            for (int c = 1; c < 6; c++)
                cr_expect(fabs(r[1][l][c] - r[0][l][c]) <= 2e-3, "-kv %s layer %d column %d: %g on the GPU, %g on the CPU",
                          kvs[k], l, c, r[1][l][c], r[0][l][c]);
    }
}

/* The shipped model over coded caches: the GPU's logits against the CPU's
 * for one prefill of the golden passage, the CPU scoring in f32, not with
 * the 8-bit queries of its VNNI kernels; but for tbq4, whose keys the GPU
 * scores with those 8-bit queries too: where the CPU has VNNI it runs at
 * that level for tbq4 (where its value sums round the weights to 16 bits,
 * which the GPU's do not), elsewhere its float scores meet the GPU's
 * integer ones. The kernels are exact on the same bytes (the tests above); but the two devices' keys and values
 * differ in their last bits (their matmuls add in other orders), so a
 * value within rounding of a code boundary may take the neighbouring code,
 * and a flipped code moves the logits by a step of the scheme's own grid
 * (docs/cuda.md, Correctness). So the bound is relative to what the scheme
 * does to the logits anyway: at most a fifth of its own error against an
 * f32 cache, or 1e-3 where that is larger. */
Test(cuda, coded_cache_logits_match_the_cpu, .timeout = 120) {
    need_gpu();
    static const char *const isa[] = {"ref", "avx2", "avx512", "avx512vnni"};
    const int level = kernels_level();
    const char *schemes[] = {"f32", "tbq4", "tbq3", "tbq2", "q4", "q4h", "lm3", "polar4"};
    float *ref = NULL;
    for (int s = 0; s < 8; s++) {
        Model cm, gm;
        KVCache ck, gk;
        KVSpec spec;
        int ids[1024];
        char err[512];
        if (level > 2) kernels_set_isa(strcmp(schemes[s], "tbq4") ? "avx512" : "avx512vnni");
        const int n = open_shipped(&gm, &gk, NULL, schemes[s], ids), V = gm.cfg.vocab_size;
        const size_t N = (size_t)n * V;
        cr_assert_eq(model_load(&cm, "models/qwen3-kjv-mtp", MODEL_MAPPED, err, sizeof err), 0, "%s", err);
        cr_assert_eq(kv_spec_parse(schemes[s], &spec, err, sizeof err), 0, "%s", err);
        cr_assert_eq(model_kv_init(&cm, &ck, &spec, 512, 0, err, sizeof err), 0, "%s", err);
        float *g = malloc(N * 4), *c = malloc(N * 4);
        cr_assert_eq(model_forward(&gm, &gk, ids, n, g, 1, NULL, err, sizeof err), 0, "%s", err);
        cr_assert_eq(model_forward(&cm, &ck, ids, n, c, 1, NULL, err, sizeof err), 0, "%s", err);
        size_t at = 0, at0 = 0;
        const double e = max_abs(g, c, N, &at), own = s ? max_abs(c, ref, N, &at0) : 0;
        double mean = 0;
        for (size_t i = 0; i < N; i++) mean += fabs((double)g[i] - c[i]) / N;
        fprintf(stderr, "%s: GPU against CPU logits, max-abs %g at position %zu of %d (mean-abs %g); the scheme "
                "against f32 on the CPU, max-abs %g\n", schemes[s], e, at / V, n, mean, own);
        const double bound = fmax(1e-3, 0.2 * own);
        cr_expect(e <= bound, "%s: max-abs %g at position %zu (bound %g)", schemes[s], e, at / V, bound);
        free(g);
        if (s) free(c);
        else ref = c;
        kv_cache_free(&ck), kv_cache_free(&gk);
        model_free(&cm), model_free(&gm);
    }
    free(ref);
    kernels_set_isa(isa[level]);
}

Test(cuda, greedy_tokens_match_the_cpu_and_speculation, .timeout = 120) {
    need_gpu();
    char *cpu = run_text("", "-dev cpu -kv f32 -spec 0", 0, 0), *gpu = run_text("", "-dev cuda -kv f32 -spec 0", 1, 0),
         *spec = run_text("", "-dev cuda -kv f32 -spec 3", 1, 1),
         *plain = run_text("RUN_CUDA_GRAPHS=0", "-dev cuda -kv f32 -spec 3", 1, 1),
         *nopdl = run_text("RUN_CUDA_PDL=0", "-dev cuda -kv f32 -spec 3", 1, 1),
         *f16 = run_text("", "-dev cuda -kv f16 -spec 0", 1, 0),
         *f16spec = run_text("", "-dev cuda -kv f16 -spec 3", 1, 1),
         *q8 = run_text("", "-dev cuda -kv q8 -spec 0", 1, 0), *q8spec = run_text("", "-dev cuda -kv q8 -spec 3", 1, 1),
         *tbq4 = run_text("", "-dev cuda -kv tbq4 -spec 0", 1, 0),
         *tbq4spec = run_text("", "-dev cuda -kv tbq4 -spec 3", 1, 1),
         *tbq2 = run_text("", "-dev cuda -kv tbq2 -spec 0", 1, 0),
         *tbq2spec = run_text("", "-dev cuda -kv tbq2 -spec 3", 1, 1),
         *q4h = run_text("", "-dev cuda -kv q4h -spec 0", 1, 0),
         *q4hspec = run_text("", "-dev cuda -kv q4h -spec 3", 1, 1),
         *polar4 = run_text("", "-dev cuda -kv polar4 -spec 0", 1, 0),
         *polar4spec = run_text("", "-dev cuda -kv polar4 -spec 3", 1, 1),
         *cpu_t = run_text("", "-dev cpu -kv f32 -spec 0 -t 0.8 -k 40 -p 0.95 -s 7 --repeat-penalty 1.1", 0, 0),
         *gpu_t = run_text("", "-dev cuda -kv f32 -spec 0 -t 0.8 -k 40 -p 0.95 -s 7 --repeat-penalty 1.1", 1, 0),
         *cpu_w8 = run_text("", "-dev cpu -wq q8 -kv f32 -spec 0", 0, 0),
         *gpu_w8 = run_text("", "-dev cuda -wq q8 -kv f32 -spec 0", 1, 0),
         *gpu_w8spec = run_text("", "-dev cuda -wq q8 -kv f32 -spec 3", 1, 1);
    cr_expect_str_eq(gpu, cpu, "GPU greedy text differs from the CPU's");
    cr_expect_str_eq(spec, gpu, "GPU -spec 3 differs from -spec 0");
    cr_expect_str_eq(plain, spec, "GPU without graphs differs from with them");
    cr_expect_str_eq(nopdl, spec, "GPU without programmatic dependent launch differs from with it");
    cr_expect_str_eq(f16spec, f16, "GPU -kv f16: -spec 3 differs from -spec 0");
    cr_expect_str_eq(q8spec, q8, "GPU -kv q8: -spec 3 differs from -spec 0");
    cr_expect_str_eq(tbq4spec, tbq4, "GPU -kv tbq4: -spec 3 differs from -spec 0");
    cr_expect_str_eq(tbq2spec, tbq2, "GPU -kv tbq2: -spec 3 differs from -spec 0");
    cr_expect_str_eq(q4hspec, q4h, "GPU -kv q4h: -spec 3 differs from -spec 0");
    cr_expect_str_eq(polar4spec, polar4, "GPU -kv polar4: -spec 3 differs from -spec 0");
    /* the same seed draws the same text: the coin falls near a boundary
     * between two tokens' shares (1e-5 wide, to rounding) rarely */
    cr_expect_str_eq(gpu_t, cpu_t, "GPU sampled text (seed 7) differs from the CPU's");
    cr_expect_str_eq(gpu_w8, cpu_w8, "GPU -wq q8 greedy text differs from the CPU's");
    cr_expect_str_eq(gpu_w8spec, gpu_w8, "GPU -wq q8: -spec 3 differs from -spec 0");
    free(cpu), free(gpu), free(spec), free(plain), free(nopdl), free(f16), free(f16spec), free(q8), free(q8spec);
    free(cpu_t), free(gpu_t), free(tbq4), free(tbq4spec), free(tbq2), free(tbq2spec), free(q4h), free(q4hspec);
    free(polar4), free(polar4spec), free(cpu_w8), free(gpu_w8), free(gpu_w8spec);
}

#endif
