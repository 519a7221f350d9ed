/* polar4.c: PolarQuant-style 4-bit KV blocks with a dense random rotation,
 * after the TurboQuant Ascend NPU design (Qwen3-14B), with packed indices.
 *
 * Data flow: append normalises each 128-value block, rotates it by a dense
 * Haar-orthogonal matrix R shared by every stream of the layer, and stores
 * 4-bit Lloyd-Max indices plus the fp32 norm; attention multiplies the query
 * by R and the output by Rᵀ once per head and scores / sums in the rotated
 * domain with the kv/lowbit.h kernels (renormalising each block).
 *
 *   block: | fp32 γ | qs[64]: qs[j/2] = idx[j] | idx[j+1] << 4 |   68 B per 128, 4.25 bits
 *   γ = √(‖x‖² + ε), y = (x/γ)·R, idx_j = nearest(y_j, c/√n)
 *   ŷ = c[idx], ŷ ← γ · ŷ/‖ŷ‖, x̂ = ŷ·Rᵀ
 *
 * R per layer: G[n][n] of N(0,1) from splitmix64 seeded 42 + 1000·layer,
 * each pair of uniforms u = ((z >> 11) + 0.5)·2^-53 giving two Box-Muller
 * values √(-2 ln u1)·(cos, sin)(2π u2), filled row-major; R = Q of G = QR.
 * Q comes from modified Gram-Schmidt in double with a second
 * orthogonalisation pass; its R factor has a positive diagonal, so Q is
 * already the spec's Householder Q with columns sign-fixed by sign(diag R).
 * Blocks are n = 128 values (d = 32, 64: n = d, one n×n matrix), ε = 1e-12
 * (only keeps x = 0 finite). Spec kv_schemes.md, row polar4.
 */
#include "kv/polar4.h"

#include "kernels/matmul.h"
#include "kv/hadamard.h"
#include "kv/lowbit.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One layer's R, shared by its streams through a refcount. */
typedef struct Rot {
    int layer, n, refs;
    float *m;  /* m[i*n + j] = R[i][j] */
    float *mt; /* its transpose, mt[j*n + i] = R[i][j], so both directions stream rows */
    struct Rot *next;
} Rot;

static Rot *rot_cache;

typedef struct {
    LbFmt f; /* first: lb_kv_* read the aux as an LbFmt */
    Rot *rot;
} PolarAux;

static uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static double unif(uint64_t *s) { return ((double)(splitmix64(s) >> 11) + 0.5) * 0x1.0p-53; }

/* Fills m[n*n] with the layer's Haar rotation and, unless NULL, mt with
 * its transpose; -1 when out of memory. */
int polar4_rotation(int n, int layer, float *m, float *mt) {
    double *q = malloc(sizeof(double) * (size_t)n * (size_t)n); /* q[j*n + i] = column j, row i */
    if (!q) return -1;
    uint64_t st = 42 + 1000 * (uint64_t)layer;
    for (int k = 0; k < n * n; k += 2) {
        double r = sqrt(-2 * log(unif(&st))), a = 6.283185307179586 * unif(&st);
        q[(k % n) * n + k / n] = r * cos(a);
        q[((k + 1) % n) * n + (k + 1) / n] = r * sin(a);
    }
    for (int j = 0; j < n; j++) {
        double *v = q + (size_t)j * n, nn = 0;
        for (int pass = 0; pass < 2; pass++)
            for (int k = 0; k < j; k++) {
                const double *u = q + (size_t)k * n;
                double r = 0;
                for (int i = 0; i < n; i++) r += u[i] * v[i];
                for (int i = 0; i < n; i++) v[i] -= r * u[i];
            }
        for (int i = 0; i < n; i++) nn += v[i] * v[i];
        for (int i = 0; i < n; i++) v[i] /= sqrt(nn);
    }
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) m[i * n + j] = (float)q[(size_t)j * n + i];
    for (int i = 0; mt && i < n; i++)
        for (int j = 0; j < n; j++) mt[j * n + i] = m[i * n + j];
    free(q);
    return 0;
}

/* Streams are set up from one thread today; the critical section keeps the
 * cache safe if that changes. */
static Rot *rot_get(int layer, int n) {
    Rot *r;
#pragma omp critical(kv_polar4_rot)
    {
        for (r = rot_cache; r && (r->layer != layer || r->n != n); r = r->next) {}
        if (r) r->refs++;
        else if ((r = calloc(1, sizeof *r)) && (r->m = malloc(sizeof(float) * (size_t)n * (size_t)n)) &&
                 (r->mt = malloc(sizeof(float) * (size_t)n * (size_t)n)) &&
                 polar4_rotation(n, layer, r->m, r->mt) == 0) {
            r->layer = layer;
            r->n = n;
            r->refs = 1;
            r->next = rot_cache;
            rot_cache = r;
        } else if (r) {
            free(r->m);
            free(r->mt);
            free(r);
            r = NULL;
        }
    }
    return r;
}

static void rot_put(Rot *r) {
#pragma omp critical(kv_polar4_rot)
    {
        if (--r->refs == 0) {
            Rot **pp = &rot_cache;
            while (*pp != r) pp = &(*pp)->next;
            *pp = r->next;
            free(r->m);
            free(r->mt);
            free(r);
        }
    }
}

static double polar4_bits(int d, const KVOpts *o) {
    (void)o;
    int n = had_block(d) ? had_block(d) : 128;
    return (4 + n / 2) * 8.0 / n;
}

/* Same block rule as the Hadamard schemes: 32, 64 or a multiple of 128. */
static int polar4_check(int d, const KVOpts *o, char *err, size_t errlen) {
    if (lb_no_opts(o, "polar4", err, errlen)) return -1;
    return had_check(d, "polar4", err, errlen);
}

static int polar4_init(KVStream *s, char *err, size_t errlen) {
    LbFmt f;
    const int n = had_block(s->d);
    lb_fmt(&f, LB_IDX4, n, s->d / n, 4, 1, 1.0f / sqrtf((float)n));
    if (lb_stream_init(s, &f, sizeof(PolarAux), err, errlen)) return -1;
    PolarAux *a = s->aux;
    if (!(a->rot = rot_get(s->layer, n))) {
        lb_kv_free(s);
        s->data = NULL;
        s->aux = NULL;
        snprintf(err, errlen, "polar4: out of memory for the layer %d rotation", s->layer);
        return -1;
    }
    return 0;
}

static void polar4_free(KVStream *s) {
    PolarAux *a = s->aux;
    if (a && a->rot) rot_put(a->rot);
    lb_kv_free(s);
}

/* t[j] = Σ_i a[i]·m[i·n + j] for one block, summed over i in order: each
 * row of m scales into t, so the loop runs along rows (vectorised). The
 * AVX-512 and AVX2 twins do the same multiplies and adds per element (no
 * FMA), so every kernel level gives the plain C bits. */
#if defined(__x86_64__)
#include <immintrin.h>
__attribute__((target("avx512f"))) static void rot_rows512(const float *a, const float *m, int n, float *t) {
    for (int j = 0; j < n; j += 16) {
        __m512 s = _mm512_setzero_ps();
        for (int i = 0; i < n; i++)
            s = _mm512_add_ps(s, _mm512_mul_ps(_mm512_set1_ps(a[i]), _mm512_loadu_ps(m + (size_t)i * n + j)));
        _mm512_storeu_ps(t + j, s);
    }
}

/* NS x 8 columns from j, each column's sum in the reference's order */
__attribute__((target("avx2"), always_inline)) static inline void rot_cols256(const float *a, const float *m, int n,
                                                                              float *t, int j, const int NS) {
    __m256 s[8];
    for (int k = 0; k < NS; k++) s[k] = _mm256_setzero_ps();
    for (int i = 0; i < n; i++) {
        const __m256 ai = _mm256_set1_ps(a[i]);
        for (int k = 0; k < NS; k++)
            s[k] = _mm256_add_ps(s[k], _mm256_mul_ps(ai, _mm256_loadu_ps(m + (size_t)i * n + j + 8 * k)));
    }
    for (int k = 0; k < NS; k++) _mm256_storeu_ps(t + j + 8 * k, s[k]);
}

/* 64 columns a pass (32 when n is 32): eight sums in flight hide the
 * add's latency, which four did not (docs/kernel-notes.md#avx2-appends) */
__attribute__((target("avx2"))) static void rot_rows256(const float *a, const float *m, int n, float *t) {
    if (n == 32) rot_cols256(a, m, n, t, 0, 4);
    else
        for (int j = 0; j < n; j += 64) rot_cols256(a, m, n, t, j, 8);
}
#endif

static void rot_rows(const float *a, const float *m, int n, float *t) {
#if defined(__x86_64__)
    if (kernels_level() >= 2) { /* n is 32, 64 or 128 */
        rot_rows512(a, m, n, t);
        return;
    }
    if (kernels_level() == 1) {
        rot_rows256(a, m, n, t);
        return;
    }
#endif
    memset(t, 0, sizeof(float) * (size_t)n);
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) t[j] += a[i] * m[i * n + j];
}

/* y = x·R per block: y[j] = Σ_i x[i] R[i][j]. */
static void polar4_to_domain(const KVStream *s, const float *x, float *y) {
    const Rot *r = ((const PolarAux *)s->aux)->rot;
    float t[HAD_MAX_BLOCK];
    for (int b = 0; b < s->d; b += r->n) {
        rot_rows(x + b, r->m, r->n, t);
        memcpy(y + b, t, sizeof(float) * (size_t)r->n);
    }
}

/* x = y·Rᵀ per block: x[i] = Σ_j y[j] R[i][j], the rows of Rᵀ. */
static void polar4_from_domain(const KVStream *s, const float *y, float *x) {
    const Rot *r = ((const PolarAux *)s->aux)->rot;
    float t[HAD_MAX_BLOCK];
    for (int b = 0; b < s->d; b += r->n) {
        rot_rows(y + b, r->mt, r->n, t);
        memcpy(x + b, t, sizeof(float) * (size_t)r->n);
    }
}

static void polar4_append(KVStream *s, const float *x) {
    const LbFmt *f = s->aux;
    uint8_t *blk = lb_slot(s);
    float u[KV_MAX_DIM], y[KV_MAX_DIM];
    for (int b = 0; b < f->nb; b++) {
        const float *xb = x + b * f->n;
        double ss = 0;
        for (int j = 0; j < f->n; j++) ss += (double)xb[j] * xb[j];
        float g = (float)sqrt(ss + 1e-12);
        for (int j = 0; j < f->n; j++) u[b * f->n + j] = xb[j] / g;
        memcpy(blk + (size_t)b * f->blk_bytes, &g, 4);
    }
    polar4_to_domain(s, u, y);
    for (int b = 0; b < f->nb; b++) lb_encode(f, y + b * f->n, blk + (size_t)b * f->blk_bytes + 4);
}

const KVScheme kv_polar4 = {
    .name = "polar4", .desc = "4-bit Lloyd-Max after a dense per-layer rotation (68 B / 128)",
    .bits = polar4_bits, .check = polar4_check, .init = polar4_init, .free = polar4_free,
    .append = polar4_append, .truncate = lb_kv_truncate, .dequant = lb_kv_dequant,
    .to_domain = polar4_to_domain, .from_domain = polar4_from_domain,
    .score = lb_kv_score, .accum = lb_kv_accum, .bytes = lb_kv_bytes, .span = lb_kv_span, .score_err = 5e-3f,
    .score_int = lb_score_int_ref, .accum_err = 2e-3f,
};
