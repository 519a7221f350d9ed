/* util.h: helpers the test files share, included after <criterion/criterion.h>.
 *
 * Deterministic random numbers (xorshift64 + Box-Muller): a file that uses
 * them defines TEST_SEED before including this, so that each file keeps
 * its own stream (and the numbers its expectations were measured on).
 * Files: token ids as whitespace-separated text, raw little-endian f32,
 * a whole file as NUL-terminated bytes.
 */
#ifndef TESTS_UTIL_H
#define TESTS_UTIL_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef TEST_SEED
static unsigned long long rng_state = TEST_SEED;
static inline double urand(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return ((rng_state >> 11) + 0.5) / 9007199254740992.0;
}
static inline float grand(void) { return (float)(sqrt(-2 * log(urand())) * cos(6.283185307179586 * urand())); }
static inline void fill(float *x, int n) {
    for (int i = 0; i < n; i++) x[i] = grand();
}
#endif

/* Every kernel level of both architectures, each one's lowest first; a
 * loop over them skips the ones kernels_set_isa refuses on this CPU. */
static const char *const all_isas[] = {"ref", "avx2", "avx512", "avx512vnni", "neon", "dotprod"};
#define N_ISAS ((int)(sizeof all_isas / sizeof all_isas[0]))

#ifdef KV_H
/* The float level below the one running when that one has integer kernels
 * (avx512vnni: avx512, dotprod: neon, avx2: ref), else NULL. Needs
 * kernels/matmul.h. */
static inline const char *float_level(void) {
    const char *i = kernels_isa();
    return !strcmp(i, "avx512vnni") ? "avx512" : !strcmp(i, "dotprod") ? "neon" : !strcmp(i, "avx2") ? "ref" : NULL;
}

/* Whether s scores in integers at the level running (KVStream.score_err
 * applies, and accum_err on x86-64): at avx512vnni every scheme with a
 * score_int twin but the 3- and 2-bit ones without VBMI (kv/lowbit.c) and
 * KIVI; at dotprod q8, q4, q4h, tbq4, tbq3, tbq2 and polar4, at avx2 those
 * and KIVI (tbq3's sums in floats: int_sums); at head dim 128 only,
 * nowhere else. */
static inline int int_path(const KVStream *s) {
    const char *n = s->scheme->name;
    const int avx2 = !strcmp(kernels_isa(), "avx2"), kivi = !strncmp(n, "kivi", 4);
    if (!strcmp(kernels_isa(), "dotprod") || avx2)
        return s->d == 128 && (!strcmp(n, "q8") || !strcmp(n, "q4") || !strcmp(n, "q4h") || !strcmp(n, "tbq4") ||
                               !strcmp(n, "tbq3") || !strcmp(n, "tbq2") || !strcmp(n, "polar4") || (avx2 && kivi));
    if (strcmp(kernels_isa(), "avx512vnni") || kivi || s->d != 128) return 0;
    return kernels_has_vbmi() || (strcmp(n, "tbq3") && strcmp(n, "tbq2") && strcmp(n, "lm3"));
}

/* Whether kv_score on s takes an integer path (q8's and KIVI's score K
 * streams only). */
static inline int int_scores(const KVStream *s) {
    const char *n = s->scheme->name;
    return s->scheme->score_err && int_path(s) && (s->role == 0 || (strcmp(n, "q8") && strncmp(n, "kivi", 4)));
}

/* Whether kv_accum on s sums in integers: avx512vnni, and avx2 for q8,
 * tbq4, tbq2 and polar4; aarch64 sums in floats; q8's integer sums take V
 * streams only. */
static inline int int_sums(const KVStream *s) {
    const char *n = s->scheme->name;
    const int avx2 = !strcmp(kernels_isa(), "avx2") &&
                     (!strcmp(n, "q8") || !strcmp(n, "tbq4") || !strcmp(n, "tbq2") || !strcmp(n, "polar4"));
    return s->scheme->accum_err && int_path(s) && (!strcmp(kernels_isa(), "avx512vnni") || avx2) &&
           (strcmp(n, "q8") || s->role == 1);
}

/* What an integer score path may add to float rounding: score_err times
 * ‖q‖·‖k_t‖ at the level that has one. */
static inline float int_err(const KVStream *s, const float *q, int t) {
    if (!int_scores(s)) return 0;
    float y[KV_MAX_DIM];
    double qq = 0, kk = 0;
    s->scheme->dequant(s, t, y);
    for (int j = 0; j < s->d; j++) qq += (double)q[j] * q[j], kk += (double)y[j] * y[j];
    return s->scheme->score_err * (float)sqrt(qq * kk);
}

/* What an integer accumulate path may add to float rounding: accum_err
 * times Σ_t |p_t · v_t[j]| over [t0, t1), at the level that has one. */
static inline float int_accum_err(const KVStream *s, const float *p, int t0, int t1, int j) {
    if (!int_sums(s)) return 0;
    float y[KV_MAX_DIM];
    double mag = 0;
    for (int t = t0; t < t1; t++) {
        s->scheme->dequant(s, t, y);
        mag += fabs((double)p[t - t0] * y[j]);
    }
    return s->scheme->accum_err * (float)mag;
}
#endif

/* The whole file, NUL-terminated (malloc'd); *n its length when n is not NULL. */
static inline char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    cr_assert(f, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)len + 1);
    cr_assert(b);
    cr_assert_eq(fread(b, 1, (size_t)len, f), (size_t)len, "%s: short read", path);
    b[len] = 0;
    fclose(f);
    if (n) *n = (size_t)len;
    return b;
}

/* -m kvstats' table in out: its rows (layer, K cos, K rel err, V cos,
 * V rel err, attention output rel err) into r[max][6]; returns how many. */
static inline int kvstats_rows(const char *out, double (*r)[6], int max) {
    int n = 0;
    for (const char *p = strstr(out, "|---:|"); p && (p = strchr(p, '\n')) && n < max; p++) {
        if (sscanf(p, "\n| %lf | %lf | %lf | %lf | %lf | %lf |", &r[n][0], &r[n][1], &r[n][2], &r[n][3], &r[n][4],
                   &r[n][5]) != 6)
            break;
        n++;
    }
    return n;
}

/* Up to cap token ids from a text file. */
static inline int read_tokens(const char *path, int *ids, int cap) {
    FILE *f = fopen(path, "r");
    cr_assert(f, "cannot open %s", path);
    int n = 0;
    while (n < cap && fscanf(f, "%d", &ids[n]) == 1) n++;
    fclose(f);
    return n;
}

/* Exactly count floats: a shorter or longer file fails the test. */
static inline float *read_f32(const char *path, size_t count) {
    FILE *f = fopen(path, "rb");
    cr_assert(f, "cannot open %s", path);
    float *x = malloc(count * sizeof(float));
    cr_assert(x);
    cr_assert_eq(fread(x, sizeof(float), count, f), count, "%s: short read", path);
    char extra;
    cr_assert_eq(fread(&extra, 1, 1, f), 0, "%s: longer than %zu floats", path, count);
    fclose(f);
    return x;
}

#ifdef MODEL_H
/* model_forward_batch against model_forward alone, on m with caches of ctx
 * positions in a[0]'s scheme: three sequences start at tokens ids + off[i]
 * with pre[i] tokens already fed, then step together through two batches
 * of step[r][i] tokens; each one's logits, cache length and recurrent state
 * (a hybrid's) must be the bits the same tokens give it alone. a [3] (a[0]
 * opened by the caller, the rest here) are left open, at their lengths,
 * for the caller's further checks; lengths[i] gets each one's. */
static inline void check_batch_vs_alone(Model *m, KVCache *a, int ctx, const int *ids, const int *off, const int *pre,
                                        const int step[2][3], const char *what, int *lengths) {
    KVCache b[3];
    char err[512];
    KVSpec spec = a[0].spec;
    for (int i = 0; i < 3; i++) {
        if (i) cr_assert_eq(model_kv_init(m, &a[i], &spec, ctx, 0, err, sizeof err), 0, "%s", err);
        cr_assert_eq(model_kv_init(m, &b[i], &spec, ctx, 0, err, sizeof err), 0, "%s", err);
        if (!pre[i]) continue;
        cr_assert_eq(model_forward(m, &a[i], ids + off[i], pre[i], NULL, 0, NULL, err, sizeof err), 0, "%s", err);
        cr_assert_eq(model_forward(m, &b[i], ids + off[i], pre[i], NULL, 0, NULL, err, sizeof err), 0, "%s", err);
    }
    const int V = m->cfg.vocab_size;
    float *la = malloc((size_t)3 * V * sizeof(float)), *lb = malloc((size_t)V * sizeof(float));
    for (int i = 0; i < 3; i++) lengths[i] = pre[i];
    for (int r = 0; r < 2; r++) {
        /* the first batch's logits rows in sequence order (written in place),
         * the second's reversed (written through a buffer) */
        ModelSeq seqs[3];
        for (int i = 0; i < 3; i++)
            seqs[i] = (ModelSeq){.kv = &a[i], .tokens = ids + off[i] + lengths[i], .n = step[r][i],
                                 .logits = la + (size_t)(r ? 2 - i : i) * V};
        cr_assert_eq(model_forward_batch(m, seqs, 3, err, sizeof err), 0, "%s", err);
        for (int i = 0; i < 3; i++) {
            cr_assert_eq(model_forward(m, &b[i], seqs[i].tokens, seqs[i].n, lb, 0, NULL, err, sizeof err), 0, "%s",
                         err);
            lengths[i] += step[r][i];
            cr_expect_eq(kv_cache_len(&a[i]), lengths[i], "%s: batch %d, sequence %d: length", what, r, i);
            cr_expect_eq(memcmp(seqs[i].logits, lb, (size_t)V * sizeof(float)), 0,
                         "%s: batch %d, sequence %d: logits differ from a run alone", what, r, i);
            if (kv_cache_state_bytes(&a[i]))
                cr_expect_eq(memcmp(a[i].state, b[i].state, kv_cache_state_bytes(&a[i])), 0,
                             "%s: batch %d, sequence %d: state differs from a run alone", what, r, i);
        }
    }
    free(la), free(lb);
    for (int i = 0; i < 3; i++) kv_cache_free(&b[i]);
}
#endif

#endif
