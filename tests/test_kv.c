/* test_kv.c: the properties every KV scheme must have, run over the whole
 * registry. A new scheme adds one line to `expect` below and gets them all:
 * round-trip error, fast score/accumulate vs the dequantize reference,
 * attention vs f32 attention, exact storage size, truncate/append
 * equivalence, and prefill-vs-decode independence of attention output
 * (a query's numbers do not depend on the queries sharing its call).
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "attn/attn.h"
#include "kernels/matmul.h"
#include "kv/kv.h"

#define TEST_SEED 88172645463325252ULL
#include "tests/util.h"

/* The floating-point control register attention sets and restores:
 * MXCSR on x86-64, FPCR on aarch64 (0 elsewhere). */
#if defined(__x86_64__)
#include <immintrin.h>
static uint64_t fp_control(void) { return _mm_getcsr(); }
#elif defined(__aarch64__)
static uint64_t fp_control(void) {
    uint64_t r;
    __asm__ __volatile__("mrs %0, fpcr" : "=r"(r));
    return r;
}
#else
static uint64_t fp_control(void) { return 0; }
#endif

/* Per scheme: max relative L2 round-trip error on Gaussian vectors, max
 * relative error of attention output vs f32 attention, and bytes one stored
 * vector of d = 128 takes (amortised over cap positions). */
typedef struct {
    const char *name;
    double rt_err, attn_err, bytes128;
} Expect;

static const Expect expect[] = {
    {"f32", 0, 1e-5, 512},
    {"f16", 1e-3, 2e-3, 256},
    {"q8", 7e-3, 1.06e-2, 136},   /* measured 0.00537 / 0.00812 (max over d), x1.3 */
    {"q4", 0.113, 0.171, 72},      /* measured 0.0863 / 0.131 */
    {"q4h", 0.112, 0.172, 72},     /* measured 0.0862 / 0.132 */
    {"tbq4", 0.125, 0.186, 66},    /* measured 0.0962 / 0.143 */
    {"tbq3", 0.241, 0.340, 50},    /* measured 0.185 / 0.261 */
    {"tbq2", 0.449, 0.742, 34},    /* measured 0.346 / 0.571 */
    {"polar4", 0.124, 0.174, 68},  /* measured 0.0956 / 0.134 */
    {"lm3", 0.241, 0.413, 52},     /* measured 0.185 / 0.318; 4 + 3·128/8 */
    /* kivi: 4096 x (4·128/32 + 128·b/8) quantized + (128 + 64) x 128 x 4 f32 ring,
     * over 4096 positions: 48 + 24 = 72 (kivi2), 80 + 24 = 104 (kivi4) bytes */
    {"kivi2", 0.475, 0.93, 72},    /* measured 0.365 / 0.713 */
    {"kivi4", 0.0965, 0.136, 104}, /* measured 0.0742 / 0.104 */
};

static const Expect *find_expect(const char *name) {
    for (size_t i = 0; i < sizeof expect / sizeof expect[0]; i++)
        if (strcmp(expect[i].name, name) == 0) return &expect[i];
    return NULL;
}


static const int dims[] = {32, 64, 128, 256};

/* Opens a stream (role 0 = K, 1 = V) if the scheme serves head dim d; 0 when it refuses. */
static int open_stream_as(KVStream *s, const KVScheme *sc, int d, int cap, int role) {
    KVOpts o = {0, 0};
    char err[256];
    if (sc->check(d, &o, err, sizeof err)) {
        cr_expect(strlen(err) > 0, "%s d=%d refused without a message", sc->name, d);
        return 0;
    }
    cr_assert_eq(kv_stream_init(s, sc, &o, d, cap, 0, role, err, sizeof err), 0, "%s: %s", sc->name, err);
    return 1;
}

static int open_stream(KVStream *s, const KVScheme *sc, int d, int cap) { return open_stream_as(s, sc, d, cap, 0); }

Test(kv, every_scheme_has_expectations) {
    for (int i = 0; i < kv_n_schemes; i++)
        cr_expect(find_expect(kv_schemes[i]->name) != NULL, "scheme %s has no line in test_kv.c", kv_schemes[i]->name);
}

Test(kv, round_trip_error) {
    for (int si = 0; si < kv_n_schemes; si++)
        for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++) {
            const KVScheme *sc = kv_schemes[si];
            const Expect *e = find_expect(sc->name);
            int d = dims[di], n = 300;
            KVStream s;
            if (!e || !open_stream(&s, sc, d, n)) continue;
            float *x = malloc(sizeof(float) * n * d), y[KV_MAX_DIM];
            fill(x, n * d);
            for (int t = 0; t < n; t++) kv_stream_append(&s, x + t * d);
            double num = 0, den = 0;
            for (int t = 0; t < n; t++) {
                kv_stream_get(&s, t, y);
                for (int j = 0; j < d; j++) {
                    num += (y[j] - x[t * d + j]) * (y[j] - x[t * d + j]);
                    den += x[t * d + j] * x[t * d + j];
                }
            }
            cr_expect(sqrt(num / den) <= e->rt_err, "%s d=%d: round-trip rel err %g > %g", sc->name, d,
                      sqrt(num / den), e->rt_err);
            kv_stream_free(&s);
            free(x);
        }
}

/* Every scheme stores the same on every instruction set: a SIMD append
 * (q8's, q4's) must give the bytes of its plain C twin, which the layout
 * tests pin to ggml's rule. Read back through dequant, bit for bit,
 * positions with ties at half a step (x · id = k + 1/2 for d = 1), an
 * all-zero block, blocks whose largest |x| comes twice with both signs
 * (q4 takes the first one's sign), and for q4 and q8 blocks of
 * subnormals (whose 1 / d is infinite: q4's quantize_block clamps before
 * its cast, q8 gives such blocks codes 0) included. */
Test(kv, append_same_on_every_isa) {
    for (int si = 0; si < kv_n_schemes; si++)
        for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++)
            for (int role = 0; role < 2; role++) {
                const KVScheme *sc = kv_schemes[si];
                const int d = dims[di], n = 40;
                float *x = malloc(sizeof(float) * n * d);
                fill(x, n * d);
                for (int j = 0; j < d; j++) {
                    x[j] = j % 32 == 0 ? 127.0f : (float)(j % 64) - 31.5f;
                    x[d + j] = j < 32 ? 0.0f : x[d + j];
                    x[2 * d + j] = j % 32 == 5 ? -9.0f : j % 32 == 20 ? 9.0f : x[2 * d + j] / 4;
                    x[3 * d + j] = j % 32 == 3 ? 9.0f : j % 32 == 30 ? -9.0f : x[3 * d + j] / 4;
                    if (!strcmp(sc->name, "q4") || !strcmp(sc->name, "q8")) x[4 * d + j] *= 1e-39f;
                }
                KVStream a, b;
                cr_assert_eq(kernels_set_isa("ref"), 0);
                if (!open_stream_as(&a, sc, d, n, role)) {
                    free(x);
                    continue;
                }
                for (int t = 0; t < n; t++) kv_stream_append(&a, x + t * d);
                for (int k = 1; k < N_ISAS; k++) {
                    if (kernels_set_isa(all_isas[k])) continue;
                    open_stream_as(&b, sc, d, n, role);
                    for (int t = 0; t < n; t++) kv_stream_append(&b, x + t * d);
                    float ya[KV_MAX_DIM], yb[KV_MAX_DIM];
                    for (int t = 0; t < n; t++) {
                        sc->dequant(&a, t, ya);
                        sc->dequant(&b, t, yb);
                        cr_expect(memcmp(ya, yb, sizeof(float) * d) == 0, "%s d=%d role %d on %s: position %d differs",
                                  sc->name, d, role, all_isas[k], t);
                    }
                    kv_stream_free(&b);
                }
                kv_stream_free(&a);
                free(x);
            }
}

static void fast_paths_check(void);

/* Every scheme's score and accumulate against the reference read path, on
 * each instruction set this CPU has (plain C, AVX2 and AVX-512 paths differ). */
Test(kv, fast_paths_match_reference) {
    for (int k = 0; k < N_ISAS; k++) {
        if (kernels_set_isa(all_isas[k])) continue;
        fast_paths_check();
    }
}

/* 1, 2 and 3 heads: groups of up to two take their own kernels; scores of
 * positions 6..332, 327 of them, so four-position steps leave a remainder.
 * K and V streams both: a scheme may store them differently (q8's integer
 * kernels read only their own role's layout). */
static void fast_paths_check(void) {
    for (int si = 0; si < kv_n_schemes; si++)
        for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++)
            for (int nq = 1; nq <= 3; nq++)
                for (int role = 0; role < 2; role++) {
                    const KVScheme *sc = kv_schemes[si];
                    int d = dims[di], n = 333;
                    KVStream s;
                    if (!open_stream_as(&s, sc, d, n, role)) continue;
                    float *x = malloc(sizeof(float) * n * d), q[3 * KV_MAX_DIM], qd[3 * KV_MAX_DIM];
                    fill(x, n * d);
                    fill(q, nq * d);
                    for (int t = 0; t < n; t++) kv_stream_append(&s, x + t * d);
                    for (int i = 0; i < nq; i++) kv_to_domain(&s, q + i * d, qd + i * d);
                    float *a = malloc(sizeof(float) * nq * n), *b = malloc(sizeof(float) * nq * n);
                    kv_score(&s, qd, nq, 6, n, a, n);
                    kv_score_ref(&s, qd, nq, 6, n, b, n);
                    for (int i = 0; i < nq; i++)
                        for (int t = 0; t < n - 6; t++)
                            cr_expect(fabsf(a[i * n + t] - b[i * n + t]) <=
                                          1e-5f * (1 + fabsf(b[i * n + t])) * sqrtf((float)d) +
                                              int_err(&s, qd + i * d, t + 6),
                                      "%s %s role %d d=%d nq=%d score t=%d: %g vs %g", kernels_isa(), sc->name, role, d,
                                      nq, t + 6, a[i * n + t], b[i * n + t]);
                    float accf[3 * KV_MAX_DIM] = {0}, accr[3 * KV_MAX_DIM] = {0};
                    for (int i = 0; i < nq * n; i++) a[i] = (float)urand();
                    kv_accum(&s, a, n, nq, 2, n - 1, accf);
                    kv_accum_ref(&s, a, n, nq, 2, n - 1, accr);
                    /* float rounding of terms as large as Σ |p_t| max|v_t|: a
                     * scheme may sum zero points apart from codes (KIVI's V: s Σ
                     * p·code + z Σ p), two large sums that cancel */
                    double big[3] = {0};
                    for (int t = 2; t < n - 1; t++) {
                        float y[KV_MAX_DIM], m = 0;
                        sc->dequant(&s, t, y);
                        for (int j = 0; j < d; j++) m = fmaxf(m, fabsf(y[j]));
                        for (int i = 0; i < nq; i++) big[i] += fabsf(a[i * n + t - 2]) * m;
                    }
                    for (int j = 0; j < nq * d; j++) {
                        const float tol = 1e-5f * (fabsf(accr[j]) + 1) * 10 + 1e-6f * (float)big[j / d] +
                                          int_accum_err(&s, a + (j / d) * n, 2, n - 1, j % d);
                        cr_expect(fabsf(accf[j] - accr[j]) <= tol, "%s %s role %d d=%d nq=%d accum j=%d: %g vs %g",
                                  kernels_isa(), sc->name, role, d, nq, j, accf[j], accr[j]);
                    }
                    kv_stream_free(&s);
                    free(x);
                    free(a);
                    free(b);
                }
}

/* Prefill's attention blocks (attn_block) rest on KV_MAX_NQ: a query's
 * scores and sums are the same bits whoever shares the call, up to that
 * many queries, on every ISA, for K and V streams; and a block of 4 tokens
 * attended at once gives what attn_group gave each right after its own
 * append, KIVI's float window (quantized at 128 and after) included. */
Test(kv, queries_do_not_depend_on_their_neighbours) {
    for (int k = 0; k < N_ISAS; k++) {
        if (kernels_set_isa(all_isas[k])) continue;
        for (int si = 0; si < kv_n_schemes; si++)
            for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++)
                for (int role = 0; role < 2; role++) {
                    const KVScheme *sc = kv_schemes[si];
                    const int d = dims[di], n = 300, nq = KV_MAX_NQ;
                    KVStream s;
                    if (!open_stream_as(&s, sc, d, n, role)) continue;
                    float *x = malloc(sizeof(float) * n * d), *q = malloc(sizeof(float) * nq * d),
                          *p = malloc(sizeof(float) * nq * 128), *all = malloc(sizeof(float) * nq * KV_MAX_DIM),
                          *two = malloc(sizeof(float) * nq * KV_MAX_DIM);
                    fill(x, n * d);
                    for (int t = 0; t < n; t++) kv_stream_append(&s, x + t * d);
                    for (int i = 0; i < nq; i++) kv_to_domain(&s, x + (i * 37 % n) * d, q + i * d);
                    kv_score(&s, q, nq, 128, 256, all, 128);
                    for (int i = 0; i < nq; i += 2) kv_score(&s, q + i * d, 2, 128, 256, two + i * 128, 128);
                    cr_expect(memcmp(all, two, sizeof(float) * nq * 128) == 0, "%s %s role %d d=%d: scores of %d queries differ",
                              kernels_isa(), sc->name, role, d, nq);
                    for (int i = 0; i < nq * 128; i++) p[i] = urand() < 0.2 ? 0 : (float)urand();
                    memset(all, 0, sizeof(float) * nq * d), memset(two, 0, sizeof(float) * nq * d);
                    kv_accum(&s, p, 128, nq, 128, 256, all);
                    for (int i = 0; i < nq; i += 2) kv_accum(&s, p + i * 128, 128, 2, 128, 256, two + i * d);
                    cr_expect(memcmp(all, two, sizeof(float) * nq * d) == 0, "%s %s role %d d=%d: sums of %d queries differ",
                              kernels_isa(), sc->name, role, d, nq);
                    kv_stream_free(&s);
                    free(x), free(q), free(p), free(all), free(two);
                }
        for (int si = 0; si < kv_n_schemes; si++) {
            const KVScheme *sc = kv_schemes[si];
            /* KIVI: past 260 positions some blocks read below the settled
             * positions, shared by all their tokens */
            const int d = 128, n = sc->windowed ? 300 : 203, nq = 2, b = KV_MAX_NQ / nq;
            KVStream k1, v1, k2, v2;
            if (!open_stream_as(&k1, sc, d, n, 0)) continue;
            cr_assert(open_stream_as(&v1, sc, d, n, 1) && open_stream_as(&k2, sc, d, n, 0) && open_stream_as(&v2, sc, d, n, 1));
            float *kx = malloc(sizeof(float) * n * d), *vx = malloc(sizeof(float) * n * d), *q = malloc(sizeof(float) * n * nq * d),
                  *o1 = malloc(sizeof(float) * n * nq * d), *o2 = malloc(sizeof(float) * n * nq * d),
                  *scr = malloc(sizeof(float) * attn_scratch_floats(nq * b, d));
            fill(kx, n * d), fill(vx, n * d), fill(q, n * nq * d);
            for (int i = 0; i < n; i++) {
                kv_stream_append(&k1, kx + i * d), kv_stream_append(&v1, vx + i * d);
                attn_group(&k1, &v1, q + i * nq * d, nq, 0.09f, o1 + i * nq * d, scr);
            }
            for (int i0 = 0; i0 < n; i0 += b) {
                const int m = n - i0 < b ? n - i0 : b;
                for (int i = i0; i < i0 + m; i++) kv_stream_append(&k2, kx + i * d), kv_stream_append(&v2, vx + i * d);
                attn_block(&k2, &v2, q + i0 * nq * d, nq, m, (size_t)nq * d, 0.09f, o2 + i0 * nq * d, scr);
            }
            cr_expect(memcmp(o1, o2, sizeof(float) * n * nq * d) == 0, "%s %s: attn_block differs from attn_group",
                      kernels_isa(), sc->name);
            kv_stream_free(&k1), kv_stream_free(&v1), kv_stream_free(&k2), kv_stream_free(&v2);
            free(kx), free(vx), free(q), free(o1), free(o2), free(scr);
        }
    }
}

/* Integer scores (avx2, avx512vnni, dotprod): each scheme's kernel equals its
 * plain C twin score_int bit for bit (exact integer sums, the same float
 * steps), for 1..6 heads and ranges off the 4-position steps; the twin
 * stays within score_err of the float reference, on Gaussian queries and
 * on queries with a few large components, as real ones have; a query with
 * a NaN or an infinity takes the float path. Integer sums (accum_err) stay
 * within their allowance of the float reference on softmax-like weights. */
/* Σ_c |q_c · k_t[c]|: the scale of a score's float rounding. */
static float score_mag(const KVStream *s, const float *q, int t) {
    float y[KV_MAX_DIM], m = 0;
    s->scheme->dequant(s, t, y);
    for (int c = 0; c < s->d; c++) m += fabsf(q[c] * y[c]);
    return m;
}

/* A score of the float path at level fl against the one at the level
 * running: the same bits below avx2 (the level below's kernels), close to
 * plain C's at avx2 (its float path is its own), equal where both overflow. */
static int float_path_score(const char *fl, float a, float b, float mag) {
    if (isnan(a) || isnan(b)) return isnan(a) && isnan(b);
    return a == b || (!strcmp(fl, "ref") && fabsf(a - b) <= 1e-5f * (1 + mag));
}

static void check_integer_level(const char *il) {
    cr_assert_eq(kernels_set_isa(il), 0);
    const char *fl = float_level();
    const int d = 128, n = 203;
    int checked = 0;
    for (int si = 0; si < kv_n_schemes; si++) {
        const KVScheme *sc = kv_schemes[si];
        KVStream s;
        if (!sc->score_int || !open_stream(&s, sc, d, n)) continue;
        cr_expect(sc->score_err > 0, "%s: score_int without score_err", sc->name);
        /* each level has integer kernels for some of the twins' schemes
         * only (3- and 2-bit codes unpack with VBMI on AVX-512, which some
         * VNNI CPUs lack) */
        if (!int_path(&s)) {
            kv_stream_free(&s);
            continue;
        }
        float *x = malloc(sizeof(float) * n * d), q[6 * 128], qd[6 * 128], a[6 * 203], b[6 * 203], r[6 * 203];
        fill(x, n * d);
        for (int t = 0; t < n; t++) kv_stream_append(&s, x + t * d);
        float worst = 0;
        /* pass 2: edge queries, held to the twin alone (a query too small
         * for 127 / max|q| scores 0 by definition): all zero, subnormal,
         * one value at ±FLT_MAX's scale, ties at half a step */
        for (int pass = 0; pass < 3; pass++) {
            fill(q, 6 * d);
            if (pass == 1)
                for (int i = 0; i < 6; i++) q[i * d + 7 * i + 3] = 40.0f;
            if (pass == 2)
                for (int j = 0; j < d; j++) {
                    q[j] = 0;
                    q[d + j] *= 1e-39f;
                    q[2 * d + j] = j == 9 ? -3e38f : q[2 * d + j];
                    q[3 * d + j] = j == 0 ? 127.0f : (float)(j % 7 - 3) * 0.5f; /* scale 1: x · 1 = k + 1/2 */
                }
            for (int i = 0; i < 6; i++) kv_to_domain(&s, q + i * d, qd + i * d);
            /* ranges [5, n - 2 - tail): 196 - tail positions, so the last
             * four-position step holds 4, 3, 2 or 1 of them */
            for (int m = 1; m <= 6; m++)
                for (int tail = 0; tail < 4; tail++) {
                    const int t1 = n - 2 - tail;
                    kv_score(&s, qd, m, 5, t1, a, n);
                    const int rc = sc->score_int(&s, qd, m, 5, t1, b, n);
                    /* KIVI's q·s and q·z overflow for a value at FLT_MAX's
                     * scale: its twin refuses and the float path takes it */
                    if (rc && pass == 2 && !strncmp(sc->name, "kivi", 4)) {
                        cr_assert_eq(kernels_set_isa(fl), 0);
                        kv_score(&s, qd, m, 5, t1, b, n);
                        cr_assert_eq(kernels_set_isa(il), 0);
                        for (int i = 0; i < m; i++)
                            for (int t = 0; t < t1 - 5; t++)
                                cr_expect(float_path_score(fl, a[i * n + t], b[i * n + t], score_mag(&s, qd + i * d, t + 5)),
                                          "%s pass 2 nq=%d head %d t=%d: %.9g vs the float path's %.9g", sc->name, m, i,
                                          t + 5, a[i * n + t], b[i * n + t]);
                        continue;
                    }
                    cr_assert_eq(rc, 0, "%s pass %d: d=128 has integer scores", sc->name, pass);
                    kv_score_ref(&s, qd, m, 5, t1, r, n);
                    for (int i = 0; i < m; i++)
                        for (int t = 0; t < t1 - 5; t++) {
                            cr_expect(a[i * n + t] == b[i * n + t],
                                      "%s pass %d nq=%d head %d t=%d of [5, %d): %.9g vs twin %.9g", sc->name, pass, m,
                                      i, t + 5, t1, a[i * n + t], b[i * n + t]);
                            if (pass == 2) continue;
                            const float e = int_err(&s, qd + i * d, t + 5);
                            cr_expect(fabsf(b[i * n + t] - r[i * n + t]) <= e, "%s pass %d t=%d: %g vs float %g",
                                      sc->name, pass, t + 5, b[i * n + t], r[i * n + t]);
                            worst = fmaxf(worst, fabsf(b[i * n + t] - r[i * n + t]) / e * sc->score_err);
                        }
                }
        }
        cr_log_info("%s integer scores: worst error %.2e of |q||k| (score_err %.0e)", sc->name, worst, sc->score_err);
        if (sc->accum_err) {
            /* softmax-like weights: a few near 1, most far smaller, on a V
             * stream (the role attention sums over) */
            KVStream v;
            open_stream_as(&v, sc, d, n, 1);
            for (int t = 0; t < n; t++) kv_stream_append(&v, x + t * d);
            float p[3 * 203], af[3 * 128] = {0}, ar[3 * 128] = {0}, wa = 0;
            for (int i = 0; i < 3 * n; i++) p[i] = expf(3 * grand() - 9);
            kv_accum(&v, p, n, 3, 1, n, af);
            kv_accum_ref(&v, p, n, 3, 1, n, ar);
            for (int j = 0; j < 3 * d; j++) {
                const float e = int_accum_err(&v, p + (j / d) * n, 1, n, j % d);
                cr_expect(fabsf(af[j] - ar[j]) <= 1e-5f * (fabsf(ar[j]) + 1) * 10 + e, "%s accum j=%d: %g vs %g",
                          sc->name, j, af[j], ar[j]);
                if (e > 0) wa = fmaxf(wa, fabsf(af[j] - ar[j]) / e * sc->accum_err);
            }
            /* where sums are floats there is no allowance to report */
            if (wa > 0)
                cr_log_info("%s integer accumulate: worst error %.2e of sum |p v| (accum_err %.0e)", sc->name, wa,
                            sc->accum_err);
            kv_stream_free(&v);
        }
        qd[17] = NAN;
        cr_expect_eq(sc->score_int(&s, qd, 1, 0, n, b, n), -1, "%s: a NaN query has no integer score", sc->name);
        kv_score(&s, qd, 2, 0, n, a, n);
        cr_assert_eq(kernels_set_isa(fl), 0);
        kv_score(&s, qd, 2, 0, n, b, n);
        cr_assert_eq(kernels_set_isa(il), 0);
        for (int t = 0; t < n; t++)
            cr_expect(float_path_score(fl, a[n + t], b[n + t], score_mag(&s, qd + d, t)),
                      "%s at %s: a group with a NaN query takes the float path (t=%d: %.9g vs %.9g)", sc->name, il, t,
                      a[n + t], b[n + t]);
        kv_stream_free(&s);
        free(x);
        checked++;
    }
    cr_expect(checked >= 2, "%s: at least two schemes have integer scores", il);
}

Test(kv, integer_scores_match_their_twin) {
    const char *isa = kernels_isa();
    static const char *const levels[] = {"avx2", "avx512vnni", "dotprod"};
    for (int k = 0; k < 3; k++)
        if (!kernels_set_isa(levels[k])) check_integer_level(levels[k]);
    cr_assert_eq(kernels_set_isa(isa), 0);
}

Test(kv, attention_close_to_f32) {
    const KVScheme *f32 = kv_find("f32");
    cr_assert(f32);
    for (int si = 0; si < kv_n_schemes; si++)
        for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++) {
            const KVScheme *sc = kv_schemes[si];
            const Expect *e = find_expect(sc->name);
            int d = dims[di], n = 500, nq = 2;
            KVStream k, v, k0, v0;
            if (!e || !open_stream(&k, sc, d, n)) continue;
            open_stream_as(&v, sc, d, n, 1);
            open_stream(&k0, f32, d, n);
            open_stream_as(&v0, f32, d, n, 1);
            float x[KV_MAX_DIM], q[2 * KV_MAX_DIM], o[2 * KV_MAX_DIM], o0[2 * KV_MAX_DIM];
            for (int t = 0; t < n; t++) {
                fill(x, d);
                kv_stream_append(&k, x);
                kv_stream_append(&k0, x);
                fill(x, d);
                kv_stream_append(&v, x);
                kv_stream_append(&v0, x);
            }
            fill(q, nq * d);
            float *scratch = malloc(sizeof(float) * attn_scratch_floats(nq, d));
            float scale = 1.0f / sqrtf((float)d);
            attn_group(&k, &v, q, nq, scale, o, scratch);
            attn_group(&k0, &v0, q, nq, scale, o0, scratch);
            double num = 0, den = 0;
            for (int j = 0; j < nq * d; j++) {
                num += (o[j] - o0[j]) * (o[j] - o0[j]);
                den += o0[j] * o0[j];
            }
            cr_expect(sqrt(num / den) <= e->attn_err, "%s d=%d: attention rel err %g > %g", sc->name, d,
                      sqrt(num / den), e->attn_err);
            /* the online-softmax path against the plain one on the same cache,
             * with float scores and sums: integer scores are held to their own
             * plain C twin and integer sums to accum_err
             * (integer_scores_match_their_twin, above), and their rounding of
             * q or p moves this output by about 1e-3 */
            const char *isa = kernels_isa();
            if ((int_path(&k) || int_path(&v)) && float_level()) {
                cr_assert_eq(kernels_set_isa(float_level()), 0);
                attn_group(&k, &v, q, nq, scale, o, scratch);
                cr_assert_eq(kernels_set_isa(isa), 0);
            }
            cr_assert_eq(attn_group_ref(&k, &v, q, nq, scale, o0), 0);
            for (int j = 0; j < nq * d; j++)
                cr_expect(fabsf(o[j] - o0[j]) <= 1e-5f * (1 + fabsf(o0[j])), "%s d=%d attn vs ref j=%d: %g vs %g",
                          sc->name, d, j, o[j], o0[j]);
            free(scratch);
            kv_stream_free(&k);
            kv_stream_free(&v);
            kv_stream_free(&k0);
            kv_stream_free(&v0);
        }
}

/* Scores spread over about 180 (queries 30x), so that most weights fall
 * below FLT_MIN: attention flushes those to zero (see attn_group) and must
 * still match the plain path, which keeps them, and must hand the caller's
 * MXCSR (FPCR on aarch64) back unchanged. Float scores and sums, as above; the
 * tolerance is 10x the one above because the scores' rounding is 30x
 * larger too (f32 differs by 1.2e-5). */
Test(kv, attention_with_spread_scores) {
    const int d = 128, n = 300, nq = 2;
    const char *isa = kernels_isa();
    for (int si = 0; si < kv_n_schemes; si++) {
        const KVScheme *sc = kv_schemes[si];
        KVStream k, v;
        if (!open_stream(&k, sc, d, n)) continue;
        open_stream_as(&v, sc, d, n, 1);
        float x[KV_MAX_DIM], q[2 * KV_MAX_DIM], o[2 * KV_MAX_DIM], o0[2 * KV_MAX_DIM];
        for (int t = 0; t < n; t++) {
            fill(x, d);
            kv_stream_append(&k, x);
            fill(x, d);
            kv_stream_append(&v, x);
        }
        fill(q, nq * d);
        for (int j = 0; j < nq * d; j++) q[j] *= 30;
        float *scratch = malloc(sizeof(float) * attn_scratch_floats(nq, d));
        if ((int_path(&k) || int_path(&v)) && float_level()) cr_assert_eq(kernels_set_isa(float_level()), 0);
        const uint64_t csr = fp_control();
        attn_group(&k, &v, q, nq, 1.0f / sqrtf((float)d), o, scratch);
        cr_expect_eq(fp_control(), csr, "%s: MXCSR/FPCR %#llx after attention, %#llx before", sc->name,
                     (unsigned long long)fp_control(), (unsigned long long)csr);
        cr_assert_eq(kernels_set_isa(isa), 0);
        cr_assert_eq(attn_group_ref(&k, &v, q, nq, 1.0f / sqrtf((float)d), o0), 0);
        for (int j = 0; j < nq * d; j++)
            cr_expect(fabsf(o[j] - o0[j]) <= 1e-4f * (1 + fabsf(o0[j])), "%s attn vs ref j=%d: %g vs %g", sc->name, j,
                      o[j], o0[j]);
        free(scratch);
        kv_stream_free(&k);
        kv_stream_free(&v);
    }
}

Test(kv, bytes_per_vector) {
    for (int si = 0; si < kv_n_schemes; si++) {
        const KVScheme *sc = kv_schemes[si];
        const Expect *e = find_expect(sc->name);
        KVStream s;
        int cap = 4096;
        if (!e || !open_stream(&s, sc, 128, cap)) continue;
        double per = (double)sc->bytes(&s) / cap;
        cr_expect(fabs(per - e->bytes128) < 1e-9, "%s: %g bytes per vector, expected %g", sc->name, per, e->bytes128);
        KVOpts o = {0, 0};
        cr_expect(fabs(sc->bits(128, &o) - e->bytes128 * 8 / 128) < 0.01, "%s: bits %g vs bytes %g", sc->name,
                  sc->bits(128, &o), e->bytes128);
        kv_stream_free(&s);
    }
}

/* Append n1, truncate to n0, append the rest of a second sequence: every
 * stored position must equal the cache that never saw the removed ones. */
Test(kv, truncate_then_append_equals_fresh) {
    const int n0s[] = {0, 1, 31, 32, 33, 127, 128, 129, 200, 255, 256, 257};
    for (int si = 0; si < kv_n_schemes; si++)
        for (size_t ni = 0; ni < sizeof n0s / sizeof n0s[0]; ni++) {
            const KVScheme *sc = kv_schemes[si];
            int d = 64, n0 = n0s[ni], extra = 1 + (int)(ni * 7) % KV_MAX_ROLLBACK, total = n0 + 150;
            KVStream a, b;
            if (!open_stream(&a, sc, d, total + extra) || !open_stream(&b, sc, d, total + extra)) continue;
            float *x = malloc(sizeof(float) * (total + extra) * d), *junk = malloc(sizeof(float) * extra * d);
            fill(x, (total + extra) * d);
            fill(junk, extra * d);
            for (int t = 0; t < n0; t++) kv_stream_append(&a, x + t * d);
            for (int t = 0; t < extra; t++) kv_stream_append(&a, junk + t * d);
            cr_assert_eq(kv_stream_truncate(&a, n0), 0, "%s: truncate %d -> %d refused", sc->name, n0 + extra, n0);
            for (int t = n0; t < total; t++) kv_stream_append(&a, x + t * d);
            for (int t = 0; t < total; t++) kv_stream_append(&b, x + t * d);
            float ya[KV_MAX_DIM], yb[KV_MAX_DIM];
            for (int t = 0; t < total; t++) {
                sc->dequant(&a, t, ya);
                sc->dequant(&b, t, yb);
                cr_expect(memcmp(ya, yb, sizeof(float) * d) == 0, "%s: n0=%d extra=%d differs at t=%d", sc->name, n0,
                          extra, t);
            }
            kv_stream_free(&a);
            kv_stream_free(&b);
            free(x);
            free(junk);
        }
}

/* A stream built by loading saved runs of positions, taken from another
 * stream as it grew, is that stream: every read, and every read after
 * more appends and a rollback, to the bit, and so is what it saves in
 * turn. Runs of 16 to 300 positions; KIVI also with a window (r32) much
 * shorter than a run and the loading stream's capacity below the ring's. */
static void check_save_load(const KVScheme *sc, const KVOpts *o, int d, int role, const int *ends, int nend,
                            int cap_b) {
    /* a whole number of q8 tiles at the end, so that no unwritten position
     * is part of the saved forms compared below */
    const int total = (ends[nend - 1] + 90 + 15) / 16 * 16;
    KVStream a, b;
    char err[256];
    cr_assert_eq(kv_stream_init(&a, sc, o, d, total, 3, role, err, sizeof err), 0, "%s: %s", sc->name, err);
    cr_assert_eq(kv_stream_init(&b, sc, o, d, cap_b, 3, role, err, sizeof err), 0, "%s: %s", sc->name, err);
    float *x = malloc(sizeof(float) * total * d);
    fill(x, total * d);
    for (int i = 0, t0 = 0; i < nend; t0 = ends[i++]) {
        while (a.len < ends[i]) kv_stream_append(&a, x + (size_t)a.len * d);
        size_t n = kv_stream_save_bytes(&a, t0, ends[i]);
        uint8_t *blob = malloc(n + 1);
        kv_stream_save(&a, t0, blob);
        cr_assert_eq(kv_stream_load(&b, ends[i], blob), 0, "%s: load [%d, %d) refused", sc->name, t0, ends[i]);
        free(blob);
    }
    cr_assert_eq(b.len, a.len);
    /* then both roll back as deep as they may (the ring's shadow), grow
     * alike, roll back again and grow to the end */
    int back = a.len < KV_MAX_ROLLBACK ? a.len : KV_MAX_ROLLBACK;
    cr_assert_eq(kv_stream_truncate(&a, a.len - back), 0);
    cr_assert_eq(kv_stream_truncate(&b, b.len - back), 0);
    for (int t = a.len; t < total - 40; t++) {
        kv_stream_append(&a, x + (size_t)t * d);
        kv_stream_append(&b, x + (size_t)t * d);
    }
    cr_assert_eq(kv_stream_truncate(&a, a.len - 30), 0);
    cr_assert_eq(kv_stream_truncate(&b, b.len - 30), 0);
    for (int t = a.len; t < total; t++) {
        kv_stream_append(&a, x + (size_t)t * d);
        kv_stream_append(&b, x + (size_t)t * d);
    }
    float ya[KV_MAX_DIM], yb[KV_MAX_DIM];
    for (int t = 0; t < total; t++) {
        sc->dequant(&a, t, ya);
        sc->dequant(&b, t, yb);
        cr_expect(memcmp(ya, yb, sizeof(float) * d) == 0, "%s role %d d=%d: position %d differs after loads ending %d",
                  sc->name, role, d, t, ends[nend - 1]);
    }
    size_t n = kv_stream_save_bytes(&a, 0, total);
    cr_expect_eq(n, kv_stream_save_bytes(&b, 0, total));
    uint8_t *sa = malloc(n + 1), *sb = malloc(n + 1);
    kv_stream_save(&a, 0, sa);
    kv_stream_save(&b, 0, sb);
    cr_expect(memcmp(sa, sb, n) == 0, "%s role %d d=%d: saved forms differ", sc->name, role, d);
    free(sa);
    free(sb);
    free(x);
    kv_stream_free(&a);
    kv_stream_free(&b);
}

Test(kv, save_then_load_equals_appended) {
    static const int ends1[] = {16, 48, 64, 320, 333};
    static const int ends2[] = {256, 512, 517};
    static const int ends3[] = {16, 48, 64}; /* both streams' capacity (160) below KIVI's ring of R + 64 */
    for (int si = 0; si < kv_n_schemes; si++) {
        const KVScheme *sc = kv_schemes[si];
        KVOpts o = {0, 0}, small = {16, 32};
        char err[256];
        cr_expect(sc->span || (sc->save_bytes && sc->save && sc->load), "%s: no saved form", sc->name);
        for (int role = 0; role < 2; role++)
            for (int d = 64; d <= 128; d += 64) {
                if (sc->check(d, &o, err, sizeof err)) continue;
                check_save_load(sc, &o, d, role, ends1, 5, 432);
                check_save_load(sc, &o, d, role, ends2, 3, 2000);
                check_save_load(sc, &o, d, role, ends3, 3, 160);
                if (sc->windowed && !sc->check(d, &small, err, sizeof err)) {
                    check_save_load(sc, &small, d, role, ends1, 5, 432);
                    check_save_load(sc, &small, d, role, ends2, 3, 608);
                }
            }
    }
}

/* Refusals move nothing: a load past the capacity, onto an unaligned
 * length, or shorter than the stream. */
Test(kv, load_refuses_what_cannot_fit) {
    KVStream a, b;
    open_stream(&a, kv_find("q8"), 32, 64);
    open_stream(&b, kv_find("q8"), 32, 40);
    float x[32] = {1};
    for (int t = 0; t < 48; t++) kv_stream_append(&a, x);
    uint8_t blob[64 * 17 * 32 / 16];
    kv_stream_save(&a, 0, blob);
    cr_expect_eq(kv_stream_load(&b, 48, blob), -1);
    cr_expect_eq(b.len, 0);
    kv_stream_append(&b, x);
    cr_expect_eq(kv_stream_load(&b, 16, blob), -1);
    cr_expect_eq(b.len, 1);
    kv_stream_free(&a);
    kv_stream_free(&b);
}

Test(kv, truncate_refuses_deep_rollback) {
    KVStream s;
    open_stream(&s, kv_find("f32"), 32, 200);
    float x[32] = {0};
    for (int t = 0; t < 150; t++) kv_stream_append(&s, x);
    cr_expect_eq(kv_stream_truncate(&s, 150 - KV_MAX_ROLLBACK - 1), -1);
    cr_expect_eq(kv_stream_truncate(&s, 151), -1);
    cr_expect_eq(kv_stream_truncate(&s, 0), 0);
    kv_stream_free(&s);
}

Test(kv, spec_parse) {
    KVSpec sp;
    char err[256], name[64];
    cr_assert_eq(kv_spec_parse("f16", &sp, err, sizeof err), 0, "%s", err);
    cr_expect_eq(sp.k, kv_find("f16"));
    cr_expect_eq(sp.v, kv_find("f16"));
    cr_assert_eq(kv_spec_parse("f32/f16", &sp, err, sizeof err), 0, "%s", err);
    kv_spec_name(&sp, name, sizeof name);
    cr_expect_str_eq(name, "f32/f16");
    cr_assert_eq(kv_spec_parse("q8_0/q4_0", &sp, err, sizeof err), 0, "%s", err);
    cr_expect(sp.k == kv_find("q8") && sp.v == kv_find("q4"), "llama.cpp's names");
    cr_expect_eq(kv_spec_parse("nope", &sp, err, sizeof err), -1);
    cr_expect(strstr(err, "unknown scheme 'nope'") != NULL, "%s", err);
    cr_expect_eq(kv_spec_parse("f16/", &sp, err, sizeof err), -1);
    cr_expect_eq(kv_spec_parse("f16/f16/f16", &sp, err, sizeof err), -1);
    cr_expect_eq(kv_spec_parse("f32,f16", &sp, err, sizeof err), -1, "a comma separates list items");
    cr_expect(strstr(err, "comma") != NULL, "%s", err);
    cr_expect_eq(kv_spec_parse("f16:x3", &sp, err, sizeof err), -1);
}
