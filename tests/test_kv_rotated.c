/* test_kv_rotated.c: what the rotated and Lloyd-Max KV schemes must do
 * beyond the registry-wide properties of test_kv.c: the Hadamard rotation
 * and its sign vectors, distortion against the Lloyd-Max figures of the spec
 * (kv_schemes.md), byte layouts checked on hand-made inputs, polar4's
 * per-layer rotation, the two-block d = 256 case, refused head dims, and the
 * plain C / AVX2 / AVX-512 kernels agreeing with each other.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/matmul.h"
#include "kv/hadamard.h"
#include "kv/kv.h"
#include "kv/lloydmax.h"
#include "kv/lowbit.h"

#define TEST_SEED 0x2545F4914F6CDD1DULL
#include "tests/util.h"

static void unit(float *x, int n) {
    double ss = 0;
    fill(x, n);
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    for (int i = 0; i < n; i++) x[i] = (float)(x[i] / sqrt(ss));
}

static void open_stream(KVStream *s, const char *name, int d, int cap, int layer) {
    const KVScheme *sc = kv_find(name);
    KVOpts o = {0, 0};
    char err[256];
    cr_assert(sc, "scheme %s not registered", name);
    cr_assert_eq(kv_stream_init(s, sc, &o, d, cap, layer, 0, err, sizeof err), 0, "%s: %s", name, err);
}

static const int rot_dims[] = {32, 64, 128, 256};

/* R e_i is column i of R: the columns must be orthonormal, the inverse must
 * undo the rotation, and the unsigned H/√n must be its own inverse. */
Test(kv_rotated, fwht_orthonormal_and_inverse) {
    float h4[4] = {1, 2, 3, 4};
    had_fwht(h4, 4);
    cr_expect(h4[0] == 10 && h4[1] == -2 && h4[2] == -4 && h4[3] == 0, "H4 (1,2,3,4) = (%g,%g,%g,%g)", h4[0], h4[1],
              h4[2], h4[3]);
    for (size_t di = 0; di < sizeof rot_dims / sizeof rot_dims[0]; di++) {
        const int d = rot_dims[di];
        float *r = calloc((size_t)d * d, sizeof(float)), *p = calloc((size_t)d * d, sizeof(float));
        for (int i = 0; i < d; i++) {
            r[i * d + i] = 1;
            p[i * d + i] = 1;
            had_rotate(r + i * d, r + i * d, d); /* in place: y == x is allowed */
            had_plain(p + i * d, p + i * d, d);
        }
        double worst = 0, worst_p = 0;
        for (int i = 0; i < d; i++)
            for (int j = 0; j < d; j++) {
                double a = 0, b = 0;
                for (int k = 0; k < d; k++) {
                    a += (double)r[i * d + k] * r[j * d + k];
                    b += (double)p[i * d + k] * p[j * d + k];
                }
                worst = fmax(worst, fabs(a - (i == j)));
                worst_p = fmax(worst_p, fabs(b - (i == j)));
            }
        cr_expect(worst < 1e-5, "d=%d: |R^T R - I| = %g", d, worst);
        cr_expect(worst_p < 1e-5, "d=%d: unsigned |H^T H - I| = %g", d, worst_p);
        float x[256], y[256], z[256];
        fill(x, d);
        had_rotate(x, y, d);
        had_unrotate(y, z, d);
        for (int j = 0; j < d; j++)
            cr_expect(fabsf(z[j] - x[j]) < 1e-5f, "d=%d inverse j=%d: %g vs %g", d, j, z[j], x[j]);
        had_plain(x, y, d);
        had_plain(y, z, d);
        for (int j = 0; j < d; j++) cr_expect(fabsf(z[j] - x[j]) < 1e-5f, "d=%d H/√n twice j=%d", d, j);
        free(r);
        free(p);
    }
}

/* The SIMD blocks (AVX-512 and AVX2 at n = 128, NEON at every n) do had_fwht's adds
 * in its pairs: the same bits as the plain C block, signs and scale too. */
Test(kv_rotated, rotation_same_bits_on_every_isa) {
    for (size_t di = 0; di < sizeof rot_dims / sizeof rot_dims[0]; di++) {
        const int d = rot_dims[di];
        float x[256], want[3][256], got[256];
        fill(x, d);
        x[1] = -0.0f, x[2] = 1e-40f;
        cr_assert_eq(kernels_set_isa("ref"), 0);
        had_rotate(x, want[0], d);
        had_unrotate(x, want[1], d);
        had_plain(x, want[2], d);
        for (int k = 1; k < N_ISAS; k++) {
            if (kernels_set_isa(all_isas[k])) continue;
            for (int f = 0; f < 3; f++) {
                memcpy(got, x, sizeof(float) * d);
                if (f == 0) had_rotate(got, got, d);
                else if (f == 1) had_unrotate(got, got, d);
                else had_plain(got, got, d);
                cr_expect(memcmp(got, want[f], sizeof(float) * d) == 0, "%s d=%d transform %d differs", all_isas[k], d,
                          f);
            }
        }
        kernels_set_isa("ref");
    }
}

/* First values listed in the spec, and R e_0 = s1[0] · s2 / √n (H e_0 is all ones). */
Test(kv_rotated, sign_vectors) {
    const int s1[8] = {-1, +1, +1, -1, -1, +1, -1, +1}, s2[8] = {+1, +1, +1, +1, -1, +1, +1, -1};
    for (int i = 0; i < 8; i++) {
        cr_expect_eq(had_sign(1, i), s1[i], "s1[%d]", i);
        cr_expect_eq(had_sign(2, i), s2[i], "s2[%d]", i);
    }
    float e[128] = {1}, y[128];
    had_rotate(e, y, 128);
    for (int i = 0; i < 128; i++)
        cr_expect(fabsf(y[i] - (float)(had_sign(1, 0) * had_sign(2, i)) / sqrtf(128)) < 1e-6f, "R e0 [%d] = %g", i,
                  y[i]);
}

/* E‖x - x̂‖² over random unit vectors (d·MSE per coordinate) through the
 * schemes as stored: rotation, nearest centroid, norm correction, fp16 d.
 * Spec Lloyd-Max figures 0.0095 / 0.0345 / 0.1175 (measured 0.0092 / 0.0338
 * / 0.1190 with 4000 vectors). */
Test(kv_rotated, distortion_matches_lloyd_max) {
    const char *names[] = {"tbq4", "tbq3", "tbq2"};
    const double want[] = {0.0095, 0.0345, 0.1175};
    const int d = 128, n = 4000;
    for (int si = 0; si < 3; si++) {
        KVStream s;
        open_stream(&s, names[si], d, n, 0);
        float *x = malloc(sizeof(float) * n * d), y[128];
        for (int t = 0; t < n; t++) {
            unit(x + t * d, d);
            kv_stream_append(&s, x + t * d);
        }
        double e = 0;
        for (int t = 0; t < n; t++) {
            kv_stream_get(&s, t, y);
            for (int j = 0; j < d; j++) e += (double)(y[j] - x[t * d + j]) * (y[j] - x[t * d + j]);
        }
        e /= n;
        cr_expect(fabs(e / want[si] - 1) < 0.05, "%s: distortion %.5f, expected %.4f within 5%%", names[si], e,
                  want[si]);
        kv_stream_free(&s);
        free(x);
    }
}

/* ManthanQuant reports cosine 0.983 (measured 0.983 at d = 128 and 256). */
Test(kv_rotated, lm3_cosine) {
    for (int d = 128; d <= 256; d *= 2) {
        const int n = 2000;
        KVStream s;
        open_stream(&s, "lm3", d, n, 0);
        float x[256], y[256];
        double sum = 0;
        for (int t = 0; t < n; t++) {
            fill(x, d);
            kv_stream_append(&s, x);
            kv_stream_get(&s, t, y);
            double xy = 0, xx = 0, yy = 0;
            for (int j = 0; j < d; j++) {
                xy += (double)x[j] * y[j];
                xx += (double)x[j] * x[j];
                yy += (double)y[j] * y[j];
            }
            sum += xy / sqrt(xx * yy);
        }
        cr_expect(sum / n >= 0.98, "lm3 d=%d: mean cosine %.4f < 0.98", d, sum / n);
        kv_stream_free(&s);
    }
}

/* Hand-checkable tbq4 block: x = Rᵀ(2·c[idx]/√128) with idx_j = j for j < 16,
 * then 4 and 11 (±0.9424) alternating, so that ‖c[idx]/√128‖ is near 1 and
 * the unit direction quantizes back to the same indices. Expect d = 2.0
 * (fp16 0x4000) first, then qs[j/2] = idx[j] | idx[j+1] << 4. */
Test(kv_rotated, tbq4_block_bytes) {
    const float *c = lm_centroids(4);
    uint8_t idx[128], want[66] = {0x00, 0x40, 0x10, 0x32, 0x54, 0x76, 0x98, 0xBA, 0xDC, 0xFE};
    float y[128], x[128], back[128];
    for (int j = 0; j < 128; j++) {
        idx[j] = (uint8_t)(j < 16 ? j : j % 2 ? 11 : 4);
        y[j] = 2 * c[idx[j]] / sqrtf(128);
    }
    for (int k = 10; k < 66; k++) want[k] = 0xB4;
    had_unrotate(y, x, 128);
    KVStream s;
    open_stream(&s, "tbq4", 128, 4, 0);
    kv_stream_append(&s, x);
    for (int k = 0; k < 66; k++)
        cr_expect_eq(s.data[k], want[k], "byte %d: 0x%02x, expected 0x%02x", k, s.data[k], want[k]);
    s.scheme->dequant(&s, 0, back);
    for (int j = 0; j < 128; j++) cr_expect(fabsf(back[j] - y[j]) < 1e-6f, "dequant j=%d: %g vs %g", j, back[j], y[j]);
    kv_stream_free(&s);
}

/* Hand-checkable q4h block (d = 32, one Hadamard block): rotated values
 * (k - 8)/2 with k = 0 first, so max |y| = 4 is negative, d = -4/-8 = 0.5
 * (fp16 0x3800) and q_j = k_j; byte j = k_j | k_{j+16} << 4. */
Test(kv_rotated, q4h_block_bytes) {
    int k[32];
    float y[32], x[32], back[32];
    for (int j = 0; j < 32; j++) {
        k[j] = j ? (j * 7) % 16 : 0;
        y[j] = (float)(k[j] - 8) / 2;
    }
    had_plain(y, x, 32);
    KVStream s;
    open_stream(&s, "q4h", 32, 2, 0);
    kv_stream_append(&s, x);
    cr_expect(s.data[0] == 0x00 && s.data[1] == 0x38, "d bytes %02x %02x", s.data[0], s.data[1]);
    for (int j = 0; j < 16; j++)
        cr_expect_eq(s.data[2 + j], (uint8_t)(k[j] | k[j + 16] << 4), "qs[%d] = 0x%02x", j, s.data[2 + j]);
    s.scheme->dequant(&s, 0, back);
    for (int j = 0; j < 32; j++) cr_expect_eq(back[j], y[j], "dequant j=%d: %g vs %g", j, back[j], y[j]);
    kv_stream_free(&s);
}

/* polar4's dense rotation both ways (rot_rows: AVX-512 and AVX2 twins of
 * the plain C loop, multiplies and adds apart): the same bits on every
 * level, for blocks of 32, 64 and 128 and two blocks of 128. */
Test(kv_rotated, polar4_rotation_same_bits_on_every_isa) {
    static const int ds[] = {32, 64, 128, 256};
    for (int di = 0; di < 4; di++) {
        const int d = ds[di];
        KVStream s;
        float x[256], want[2][256], got[256];
        fill(x, d);
        x[1] = -0.0f, x[2] = 1e-40f;
        cr_assert_eq(kernels_set_isa("ref"), 0);
        open_stream(&s, "polar4", d, 4, 1);
        kv_to_domain(&s, x, want[0]);
        kv_from_domain(&s, x, want[1]);
        for (int k = 1; k < N_ISAS; k++) {
            if (kernels_set_isa(all_isas[k])) continue;
            kv_to_domain(&s, x, got);
            cr_expect(memcmp(got, want[0], sizeof(float) * d) == 0, "%s d=%d: to_domain differs", all_isas[k], d);
            kv_from_domain(&s, x, got);
            cr_expect(memcmp(got, want[1], sizeof(float) * d) == 0, "%s d=%d: from_domain differs", all_isas[k], d);
        }
        kernels_set_isa("ref");
        kv_stream_free(&s);
    }
}

/* Rows of R from to_domain(e_i) (y = x·R): orthonormal, the same for two
 * streams of one layer and after everything was freed, different per layer. */
Test(kv_rotated, polar4_rotation) {
    const int d = 128;
    float *m[3];
    KVStream a, b, c;
    open_stream(&a, "polar4", d, 4, 3);
    open_stream(&b, "polar4", d, 4, 3);
    open_stream(&c, "polar4", d, 4, 4);
    const KVStream *str[3] = {&a, &b, &c};
    for (int k = 0; k < 3; k++) {
        m[k] = calloc((size_t)d * d, sizeof(float));
        for (int i = 0; i < d; i++) {
            float e[128] = {0};
            e[i] = 1;
            kv_to_domain(str[k], e, m[k] + i * d);
        }
    }
    double worst = 0;
    for (int i = 0; i < d; i++)
        for (int j = 0; j < d; j++) {
            double r = 0, s = 0;
            for (int k = 0; k < d; k++) {
                r += (double)m[0][i * d + k] * m[0][j * d + k];
                s += (double)m[0][k * d + i] * m[0][k * d + j];
            }
            worst = fmax(worst, fmax(fabs(r - (i == j)), fabs(s - (i == j))));
        }
    cr_expect(worst < 1e-5, "|R Rᵀ - I|, |Rᵀ R - I| = %g", worst);
    cr_expect(memcmp(m[0], m[1], sizeof(float) * d * d) == 0, "two layer-3 streams disagree");
    cr_expect(memcmp(m[0], m[2], sizeof(float) * d * d) != 0, "layers 3 and 4 share a rotation");
    float x[128], y[128], z[128];
    fill(x, d);
    kv_to_domain(&a, x, y);
    kv_from_domain(&a, y, z);
    for (int j = 0; j < d; j++) cr_expect(fabsf(z[j] - x[j]) < 1e-5f, "from(to(x)) j=%d", j);
    kv_stream_free(&a);
    kv_stream_free(&b);
    kv_stream_free(&c);
    open_stream(&a, "polar4", d, 4, 3);
    for (int i = 0; i < d; i++) {
        float e[128] = {0}, r[128];
        e[i] = 1;
        kv_to_domain(&a, e, r);
        cr_expect(memcmp(r, m[0] + i * d, sizeof r) == 0, "layer 3 rotation changed after regeneration (row %d)", i);
    }
    kv_stream_free(&a);
    for (int k = 0; k < 3; k++) free(m[k]);
}

/* d = 256 is two independent 128-blocks, each byte-identical to a d = 128
 * vector, each with its own scale (the halves differ 100x in norm). */
Test(kv_rotated, two_blocks_at_d256) {
    const char *names[] = {"tbq4", "tbq3", "tbq2", "polar4", "q4h"};
    for (int si = 0; si < 5; si++) {
        KVStream w, h;
        open_stream(&w, names[si], 256, 2, 0);
        open_stream(&h, names[si], 128, 4, 0);
        float x[256], y[256];
        fill(x, 256);
        for (int j = 128; j < 256; j++) x[j] *= 100;
        kv_stream_append(&w, x);
        kv_stream_append(&h, x);
        kv_stream_append(&h, x + 128);
        size_t half = w.scheme->bytes(&w) / 4;
        cr_expect_eq(half, h.scheme->bytes(&h) / 4, "%s: d=256 vector is not two d=128 vectors", names[si]);
        cr_expect(memcmp(w.data, h.data, 2 * half) == 0, "%s: blocks differ from the d=128 encoding", names[si]);
        kv_stream_get(&w, 0, y);
        for (int b = 0; b < 2; b++) {
            double num = 0, den = 0;
            for (int j = 128 * b; j < 128 * (b + 1); j++) {
                num += (double)(y[j] - x[j]) * (y[j] - x[j]);
                den += (double)x[j] * x[j];
            }
            cr_expect(sqrt(num / den) < 0.4, "%s: block %d rel err %g", names[si], b, sqrt(num / den));
        }
        kv_stream_free(&w);
        kv_stream_free(&h);
    }
}

/* Head dims the block structure cannot serve are refused with one line. */
Test(kv_rotated, refused_head_dim) {
    const char *names[] = {"q4h", "tbq4", "tbq3", "tbq2", "polar4", "lm3"};
    for (int si = 0; si < 6; si++) {
        const KVScheme *sc = kv_find(names[si]);
        KVOpts o = {0, 0};
        char err[256] = "";
        KVStream s;
        int d = strcmp(names[si], "lm3") == 0 ? 100 : 96;
        cr_expect_eq(sc->check(d, &o, err, sizeof err), -1, "%s accepted d=%d", names[si], d);
        cr_expect(strlen(err) > 0 && !strchr(err, '\n') && strstr(err, names[si]) &&
                      strstr(err, d == 96 ? "96" : "100"),
                  "%s: message '%s'", names[si], err);
        cr_expect_eq(kv_stream_init(&s, sc, &o, d, 8, 0, 0, err, sizeof err), -1, "%s: init accepted d=%d", names[si],
                     d);
        cr_expect_eq(sc->check(128, &o, err, sizeof err), 0, "%s refused d=128: %s", names[si], err);
    }
}

/* One position summed with weight 1 into zeros is its decoded vector
 * exactly (1 · v + 0 rounds to v): where a level decodes the codes itself
 * (the plain C reference, NEON's table look-ups), the bits of dequant. */
Test(kv_rotated, decoding_levels_give_dequant_bits) {
    const char *names[] = {"tbq4", "tbq3", "tbq2", "polar4", "lm3"};
    const char *levels[] = {"ref", "neon", "dotprod"};
    for (int si = 0; si < 5; si++)
        for (size_t di = 0; di < sizeof rot_dims / sizeof rot_dims[0]; di++) {
            const int d = rot_dims[di], n = 20;
            KVStream s;
            open_stream(&s, names[si], d, n, 1);
            float x[256], want[256], got[256], one = 1;
            for (int t = 0; t < n; t++) {
                fill(x, d);
                kv_stream_append(&s, x);
            }
            for (int k = 0; k < 3; k++) {
                if (kernels_set_isa(levels[k])) continue;
                for (int t = 0; t < n; t++) {
                    s.scheme->dequant(&s, t, want);
                    memset(got, 0, sizeof got);
                    kv_accum(&s, &one, 1, 1, t, t + 1, got);
                    cr_expect(memcmp(got, want, sizeof(float) * d) == 0, "%s d=%d %s position %d differs", names[si], d,
                              levels[k], t);
                }
            }
            kernels_set_isa("ref");
            kv_stream_free(&s);
        }
}

/* The same stream through every kernel level this CPU has against the plain
 * C path: 1..6 heads (groups of up to 4 are split), ranges off the tiles. */
Test(kv_rotated, kernel_levels_agree) {
    const char *names[] = {"q4h", "tbq4", "tbq3", "tbq2", "polar4", "lm3"};
    for (int si = 0; si < 6; si++)
        for (size_t di = 0; di < sizeof rot_dims / sizeof rot_dims[0]; di++) {
            const int d = rot_dims[di], n = 150;
            KVStream s;
            open_stream(&s, names[si], d, n, 1);
            float *x = malloc(sizeof(float) * n * d), q[6 * 256], p[6 * 150], s0[6 * 150], s1[6 * 150];
            float a0[6 * 256], a1[6 * 256];
            fill(x, n * d);
            fill(q, 6 * d);
            for (int i = 0; i < 6 * n; i++) p[i] = (float)urand();
            for (int t = 0; t < n; t++) kv_stream_append(&s, x + t * d);
            for (int m = 1; m <= 6; m++) {
                cr_assert_eq(kernels_set_isa("ref"), 0);
                memset(a0, 0, sizeof a0);
                kv_score(&s, q, m, 3, n - 1, s0, n);
                kv_accum(&s, p, n, m, 1, n - 2, a0);
                for (int k = 1; k < N_ISAS; k++) {
                    if (kernels_set_isa(all_isas[k])) continue;
                    memset(a1, 0, sizeof a1);
                    kv_score(&s, q, m, 3, n - 1, s1, n);
                    kv_accum(&s, p, n, m, 1, n - 2, a1);
                    for (int i = 0; i < m; i++) {
                        for (int t = 0; t < n - 4; t++) {
                            float a = s1[i * n + t], b = s0[i * n + t];
                            cr_expect(fabsf(a - b) <= 1e-5f * (1 + fabsf(b)) * sqrtf((float)d) +
                                                          int_err(&s, q + i * d, t + 3),
                                      "%s %s d=%d nq=%d score t=%d: %g vs %g", names[si], all_isas[k], d, m, t + 3,
                                      a, b);
                        }
                        for (int j = 0; j < d; j++) {
                            float a = a1[i * d + j], b = a0[i * d + j];
                            cr_expect(fabsf(a - b) <= 1e-4f * (1 + fabsf(b)) + int_accum_err(&s, p + i * n, 1, n - 2, j),
                                      "%s %s d=%d nq=%d accum j=%d: %g vs %g",
                                      names[si], all_isas[k], d, m, j, a, b);
                        }
                    }
                }
            }
            kv_stream_free(&s);
            free(x);
        }
}

/* The AVX-512 Hadamard block and code search against plain C: the same
 * rotations and the same stored bytes, bit for bit (they do the same float
 * operations in the same order), for every rotated scheme and head dim. */
Test(kv_rotated, fast_rotation_and_encode_are_bit_exact) {
    if (kernels_set_isa("avx512")) return; /* nothing to compare on this CPU */
    const char *names[] = {"q4h", "tbq4", "tbq3", "tbq2", "polar4", "lm3"};
    float x[256], r[2][3][256];
    for (size_t di = 0; di < sizeof rot_dims / sizeof rot_dims[0]; di++) {
        const int d = rot_dims[di];
        fill(x, d);
        memset(r, 0, sizeof r);
        for (int k = 0; k < 2; k++) {
            cr_assert_eq(kernels_set_isa(k ? "avx512" : "ref"), 0);
            had_rotate(x, r[k][0], d);
            had_unrotate(x, r[k][1], d);
            had_plain(x, r[k][2], d);
        }
        cr_expect(memcmp(r[0], r[1], sizeof r[0]) == 0, "d=%d: AVX-512 rotations differ from plain C", d);
        for (int si = 0; si < 6; si++) {
            const int n = 40;
            KVStream s[2];
            float *v = malloc(sizeof(float) * n * d);
            fill(v, n * d);
            for (int k = 0; k < 2; k++) {
                cr_assert_eq(kernels_set_isa(k ? "avx512" : "ref"), 0);
                open_stream(&s[k], names[si], d, n, 1);
                for (int t = 0; t < n; t++) kv_stream_append(&s[k], v + (size_t)t * d);
            }
            cr_assert_eq(kernels_set_isa("ref"), 0);
            for (int t = 0; t < n; t++) {
                float a[256], b[256];
                s[0].scheme->dequant(&s[0], t, a);
                s[1].scheme->dequant(&s[1], t, b);
                cr_expect(memcmp(a, b, sizeof(float) * d) == 0, "%s d=%d t=%d: AVX-512 append stored another vector",
                          names[si], d, t);
            }
            kv_stream_free(&s[0]), kv_stream_free(&s[1]);
            free(v);
        }
    }
}

/* lb_encode's packing pinned to bytes written out by hand: the values are
 * the centroids themselves, codes 0, 1, 2, ... in order, so 4 bits give
 * 0x10 0x32 ... (low nibble first), 2 bits 0xE4 (code j at bit 2j), 3 bits
 * 0x88 0xC6 0xFA per eight codes (a little-endian 24-bit word, code k at
 * bit 3k); every byte is written, and the returned norm is ||cb[idx]||. */
Test(kv_rotated, lowbit_packing_known_bytes) {
    static const uint8_t b3[3] = {0x88, 0xC6, 0xFA};
    for (int kind = LB_IDX2; kind <= LB_IDX4; kind++) {
        LbFmt f;
        lb_fmt(&f, kind, 32, 1, 2, 0, 1.0f);
        const int k = 1 << kind, nbytes = 32 * kind / 8;
        float y[32];
        double nn = 0;
        for (int j = 0; j < 32; j++) y[j] = f.cb[j % k], nn += (double)y[j] * y[j];
        uint8_t qs[16];
        memset(qs, 0x5A, sizeof qs);
        const float norm = lb_encode(&f, y, qs);
        for (int i = 0; i < nbytes; i++) {
            const uint8_t want = kind == LB_IDX4 ? (uint8_t)((2 * i) % 16 | ((2 * i + 1) % 16) << 4)
                                 : kind == LB_IDX2 ? 0xE4
                                                   : b3[i % 3];
            cr_expect_eq(qs[i], want, "%d bits: byte %d = %02x, expected %02x", kind, i, qs[i], want);
        }
        cr_expect(fabs(norm - sqrt(nn)) <= 1e-6 * sqrt(nn), "%d bits: norm %g, expected %g", kind, norm, sqrt(nn));
    }
}
