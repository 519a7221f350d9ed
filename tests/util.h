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

#ifdef KV_H
/* The integer kernel level's allowances (KVScheme.score_err, accum_err);
 * 0 at other levels, for float schemes, and where a scheme's integer
 * paths are not taken: 3- and 2-bit codes need VBMI besides VNNI
 * (kv/lowbit.c). Needs kernels/matmul.h. */
static inline int int_path(const KVStream *s) {
    const char *n = s->scheme->name;
    if (!kernels_has_vbmi() && (!strcmp(n, "tbq3") || !strcmp(n, "tbq2"))) return 0;
    return kernels_level() >= 3;
}

/* What an integer score path may add to float rounding: score_err times
 * ‖q‖·‖k_t‖ at the level that has one. */
static inline float int_err(const KVStream *s, const float *q, int t) {
    if (!s->scheme->score_err || !int_path(s)) return 0;
    float y[KV_MAX_DIM];
    double qq = 0, kk = 0;
    s->scheme->dequant(s, t, y);
    for (int j = 0; j < s->d; j++) qq += (double)q[j] * q[j], kk += (double)y[j] * y[j];
    return s->scheme->score_err * (float)sqrt(qq * kk);
}

/* What an integer accumulate path may add to float rounding: accum_err
 * times Σ_t |p_t · v_t[j]| over [t0, t1), at the level that has one. */
static inline float int_accum_err(const KVStream *s, const float *p, int t0, int t1, int j) {
    if (!s->scheme->accum_err || !int_path(s)) return 0;
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

#endif
