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
#include "kernels/ops.h"
#include "model/gpu.h"
#include "model/model.h"
#define TEST_SEED 0xC0DAC0DAull
#include "tests/util.h"

/* What the GPU path refuses is decided from the config and the scheme,
 * on any machine: Qwen3.5's hybrid, head dims other than 128 and 256, and
 * the compressed schemes (so far). */
Test(cuda, what_the_gpu_refuses) {
    static const struct {
        const char *model, *kv, *says;
    } cases[] = {
        {"models/qwen3-kjv-mtp", "f16", NULL},
        {"models/qwen3-kjv-mtp", "f32", NULL},
        {"models/qwen3-kjv-mtp", "tbq4", "KV scheme tbq4 has no CUDA kernel yet"},
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

Test(cuda, matmul_matches_matmul_ref) {
    need_gpu();
    const DType types[] = {DT_BF16, DT_F16, DT_F32};
    const int codes[] = {CUDA_BF16, CUDA_F16, CUDA_F32};
    const int ns[] = {1, 2, 3, 5, 8, 9, 70, 130};
    /* 320 x 1024 and 64 x 96 take the tensor cores' tiles in bf16; the others the f32 ones */
    const int shapes[][2] = {{300, 1032}, {64, 8}, {1000, 2048}, {320, 1024}, {64, 96}};
    for (int t = 0; t < 3; t++)
        for (int s = 0; s < 5; s++)
            for (int k = 0; k < 8; k++) {
                const int rows = shapes[s][0], cols = shapes[s][1], n = ns[k];
                Weight w;
                void *hw = rand_weight(&w, types[t], rows, cols);
                float *x = malloc((size_t)n * cols * 4), *y = malloc((size_t)n * rows * 4),
                      *want = malloc((size_t)n * rows * 4), *y0 = malloc((size_t)n * rows * 4);
                fill(x, n * cols);
                fill(y0, n * rows);
                matmul_ref(want, x, &w, n);
                void *dw = up(hw, (size_t)rows * cols * dtype_size(types[t]));
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
            }
}

/* The decode matmul's fused forms give the bits of the kernels they fuse:
 * every dtype, 1 to 8 tokens, one warp per row (8192 rows) and eight (512). */
Test(cuda, matvec_fusions_equal_their_parts) {
    need_gpu();
    const DType types[] = {DT_BF16, DT_F16, DT_F32};
    const int codes[] = {CUDA_BF16, CUDA_F16, CUDA_F32}, halves[] = {256, 4096}, ns[] = {1, 3, 8};
    const int H = 256;
    for (int t = 0; t < 3; t++)
        for (int k = 0; k < 2; k++)
            for (int c = 0; c < 3; c++) {
                const int I = halves[k], n = ns[c];
                Weight w;
                void *hw = rand_weight(&w, types[t], 2 * I, H);
                float *x = malloc(n * H * 4), *nw = malloc(H * 4), *a = malloc(n * 2 * I * 4),
                      *b = malloc(n * 2 * I * 4);
                fill(x, n * H), fill(nw, H);
                void *dw = up(hw, (size_t)2 * I * H * dtype_size(types[t]));
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
 * then rope on the CPU (f32 cache: to rounding; f16: the rounded bits). */
Test(cuda, qk_rope_store_matches_rmsnorm_and_rope) {
    need_gpu();
    /* one q|k|v matmul's rows [n, (nh + 2 nkv) hd], as the model has them */
    enum { n = 3, nh = 4, nkv = 2, hd = 128, ld = (nh + 2 * nkv) * hd };
    const int rot = 128, cap = 40, pos = 21, half = rot / 2;
    for (int f16 = 0; f16 < 2; f16++) {
        float qkv[n * ld], qn[hd], kn[hd];
        float *cs = malloc((size_t)cap * half * 4), *sn = malloc((size_t)cap * half * 4);
        fill(qkv, n * ld), fill(qn, hd), fill(kn, hd);
        for (int p = 0; p < cap; p++)
            for (int j = 0; j < half; j++) {
                double a = p * pow(1e6, -2.0 * j / rot);
                cs[p * half + j] = (float)cos(a), sn[p * half + j] = (float)sin(a);
            }
        const size_t cbytes = (size_t)nkv * cap * hd * (f16 ? 2 : 4);
        float *dq = up(qkv, sizeof qkv), *dqn = up(qn, sizeof qn), *dkn = up(kn, sizeof kn),
              *dcs = up(cs, (size_t)cap * half * 4), *dsn = up(sn, (size_t)cap * half * 4);
        void *dkc = up(NULL, cbytes), *dvc = up(NULL, cbytes);
        int *dpos = up(&pos, sizeof pos);
        cuda_qk_rope_store(dq, dq + nh * hd, dq + (nh + nkv) * hd, ld, dqn, dkn, dcs, dsn, dkc, dvc, f16, dpos, n, nh,
                           nkv, hd, rot, cap, 1e-6f);
        float gq[n * ld];
        char *kc = malloc(cbytes), *vc = malloc(cbytes);
        down(gq, dq, sizeof gq);
        down(kc, dkc, cbytes), down(vc, dvc, cbytes);
        for (int i = 0; i < n; i++) {
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

/* Attention of n new tokens after pos cached ones, against attn_group_ref
 * token by token over CPU streams holding the same rows. */
static void check_attention(const char *scheme, int hd, int nkv, int gqa, int pos, int n, int splits) {
    const int nh = nkv * gqa, cap = pos + n + 5, L = pos + n;
    const int f16 = !strcmp(scheme, "f16");
    char err[256];
    KVSpec spec;
    cr_assert_eq(kv_spec_parse(scheme, &spec, err, sizeof err), 0, "%s", err);
    float *K = malloc((size_t)L * nkv * hd * 4), *Vv = malloc((size_t)L * nkv * hd * 4);
    float *q = malloc((size_t)n * nh * hd * 4), *want = malloc((size_t)n * nh * hd * 4),
          *got = malloc((size_t)n * nh * hd * 4);
    /* head-distinct, non-zero rows; keys scaled so the softmax is not flat */
    for (size_t i = 0; i < (size_t)L * nkv * hd; i++) K[i] = grand() * 0.3f, Vv[i] = grand();
    fill(q, n * nh * hd);
    const size_t es = f16 ? 2 : 4, cbytes = (size_t)nkv * cap * hd * es;
    char *kc = calloc(1, cbytes), *vc = calloc(1, cbytes);
    for (int h = 0; h < nkv; h++) {
        KVStream ks, vs;
        cr_assert_eq(kv_stream_init(&ks, spec.k, &spec.ko, hd, cap, 0, 0, err, sizeof err), 0, "%s", err);
        cr_assert_eq(kv_stream_init(&vs, spec.v, &spec.vo, hd, cap, 0, 1, err, sizeof err), 0, "%s", err);
        for (int t = 0; t < L; t++) {
            const float *kr = K + ((size_t)t * nkv + h) * hd, *vr = Vv + ((size_t)t * nkv + h) * hd;
            kv_stream_append(&ks, kr);
            kv_stream_append(&vs, vr);
            for (int j = 0; j < hd; j++) {
                size_t at = ((size_t)h * cap + t) * hd + j;
                if (f16) ((uint16_t *)kc)[at] = f32_to_f16(kr[j]), ((uint16_t *)vc)[at] = f32_to_f16(vr[j]);
                else ((float *)kc)[at] = kr[j], ((float *)vc)[at] = vr[j];
            }
            if (t >= pos) {
                const size_t at = ((size_t)(t - pos) * nh + h * gqa) * hd;
                attn_group_ref(&ks, &vs, q + at, gqa, 1.0f / sqrtf((float)hd), want + at);
            }
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
    cuda_attention(dout, dq, nh * hd, dkc, dvc, f16, dpos, n, nh, nkv, hd, cap, 1.0f / sqrtf((float)hd), dpart,
                   dcount, splits);
    down(got, dout, (size_t)n * nh * hd * 4);
    /* again over the same scratch: its split counters were left at zero */
    float *again = malloc((size_t)n * nh * hd * 4);
    cuda_attention(dout, dq, nh * hd, dkc, dvc, f16, dpos, n, nh, nkv, hd, cap, 1.0f / sqrtf((float)hd), dpart,
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
    cuda_free(dpos);
    free(K), free(Vv), free(q), free(want), free(got), free(kc), free(vc);
}

Test(cuda, attention_matches_attn_group_ref) {
    need_gpu();
    const char *schemes[] = {"f32", "f16"};
    /* decode (both variants), verification, prefill chunks, a context of
     * one position, lengths off the 32-position runs */
    const int cases[][4] = {/* gqa, pos, n, nkv */ {1, 0, 1, 2},   {2, 1000, 1, 8}, {4, 333, 1, 8}, {6, 129, 3, 2},
                            {2, 300, 5, 2},   {4, 50, 37, 2},  {2, 0, 70, 1},   {8, 4095, 1, 4},
                            {2, 5000, 4, 8},  {16, 77, 2, 1}};
    for (int s = 0; s < 2; s++)
        for (int hd = 128; hd <= 256; hd *= 2)
            for (size_t c = 0; c < sizeof cases / sizeof *cases; c++)
                if (cases[c][0] <= (hd == 128 ? 16 : 8))
                    check_attention(schemes[s], hd, cases[c][3], cases[c][0], cases[c][1], cases[c][2], 0);
    check_attention("f16", 128, 8, 2, 300, 1, 256);
    check_attention("f16", 128, 2, 4, 40000, 1, 256);
    check_attention("f32", 256, 2, 2, 700, 3, 256);
}

/* The shipped model on the GPU, f32 cache, against the float64 golden logits. */
static int open_shipped(Model *m, KVCache *kv, KVCache *mkv, const char *scheme, int *ids) {
    KVSpec spec;
    char err[512];
    cr_assert_eq(model_load(m, "models/qwen3-kjv-mtp", MODEL_MAPPED, err, sizeof err), 0, "%s", err);
    cr_assert_eq(model_to_gpu(m, err, sizeof err), 0, "%s", err);
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

Test(cuda, greedy_tokens_match_the_cpu_and_speculation, .timeout = 120) {
    need_gpu();
    char *cpu = run_text("", "-dev cpu -kv f32 -spec 0", 0, 0), *gpu = run_text("", "-dev cuda -kv f32 -spec 0", 1, 0),
         *spec = run_text("", "-dev cuda -kv f32 -spec 3", 1, 1),
         *plain = run_text("RUN_CUDA_GRAPHS=0", "-dev cuda -kv f32 -spec 3", 1, 1),
         *f16 = run_text("", "-dev cuda -kv f16 -spec 0", 1, 0),
         *f16spec = run_text("", "-dev cuda -kv f16 -spec 3", 1, 1);
    cr_expect_str_eq(gpu, cpu, "GPU greedy text differs from the CPU's");
    cr_expect_str_eq(spec, gpu, "GPU -spec 3 differs from -spec 0");
    cr_expect_str_eq(plain, spec, "GPU without graphs differs from with them");
    cr_expect_str_eq(f16spec, f16, "GPU -kv f16: -spec 3 differs from -spec 0");
    free(cpu), free(gpu), free(spec), free(plain), free(f16), free(f16spec);
}

#endif
