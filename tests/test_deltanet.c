/* test_deltanet.c: the gated delta rule kernel (kernels/deltanet.c) against
 * a float64 recurrence written from the formula, its dispatched version
 * against its plain C reference, and the property the model relies on:
 * the state and outputs do not depend on how the tokens are batched or how
 * the columns are split. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/deltanet.h"
#include "kernels/matmul.h"
#define TEST_SEED 0x5eed0d17a2ULL
#include "tests/util.h"

enum { DK = 64, DV = 80, NT = 37 }; /* dv not a multiple of 64: a 64-wide tile and a 16-wide one */

typedef struct {
    float q[NT][DK], k[NT][DK], v[NT][DV], alpha[NT], beta[NT];
} Inputs;

static void make_inputs(Inputs *in) {
    for (int t = 0; t < NT; t++) {
        double nq = 0, nk = 0;
        for (int i = 0; i < DK; i++) in->q[t][i] = grand(), in->k[t][i] = grand();
        for (int i = 0; i < DK; i++) nq += in->q[t][i] * in->q[t][i], nk += in->k[t][i] * in->k[t][i];
        for (int i = 0; i < DK; i++) in->q[t][i] /= (float)sqrt(nq * DK), in->k[t][i] /= (float)sqrt(nk);
        for (int e = 0; e < DV; e++) in->v[t][e] = grand();
        in->alpha[t] = (float)(0.5 + 0.5 * urand()), in->beta[t] = (float)urand();
    }
}

/* tokens [t0, t0 + n) of in, outputs into o [NT][DV] */
static DeltaRule rule(const Inputs *in, float (*o)[DV], int t0, int n) {
    return (DeltaRule){.q = in->q[t0], .k = in->k[t0], .v = in->v[t0], .alpha = in->alpha + t0, .beta = in->beta + t0,
                       .o = o[t0], .ld_qk = DK, .ld_v = DV, .ld_ab = 1, .ld_o = DV, .n = n, .dk = DK, .dv = DV};
}

/* Both versions against the float64 recurrence S <- alpha S; u = S^T k;
 * S += k (beta (v - u))^T; o = S^T q, from a random start state. */
Test(deltanet, matches_the_recurrence) {
    static Inputs in;
    make_inputs(&in);
    static float S0[DK * DV];
    static double Sd[DK * DV], od[NT][DV];
    for (int i = 0; i < DK * DV; i++) S0[i] = 0.3f * grand(), Sd[i] = S0[i];
    for (int t = 0; t < NT; t++) {
        double u[DV] = {0};
        for (int i = 0; i < DK * DV; i++) Sd[i] *= in.alpha[t];
        for (int i = 0; i < DK; i++)
            for (int e = 0; e < DV; e++) u[e] += Sd[i * DV + e] * in.k[t][i];
        for (int i = 0; i < DK; i++)
            for (int e = 0; e < DV; e++) Sd[i * DV + e] += in.k[t][i] * in.beta[t] * (in.v[t][e] - u[e]);
        for (int e = 0; e < DV; e++) {
            od[t][e] = 0;
            for (int i = 0; i < DK; i++) od[t][e] += Sd[i * DV + e] * in.q[t][i];
        }
    }
    for (int version = 0; version < 2; version++) {
        static float S[DK * DV], o[NT][DV];
        memcpy(S, S0, sizeof S);
        DeltaRule a = rule(&in, o, 0, NT);
        (version ? deltanet_cols : deltanet_cols_ref)(S, &a, 0, DV);
        double worst = 0, worst_s = 0;
        for (int t = 0; t < NT; t++)
            for (int e = 0; e < DV; e++) worst = fmax(worst, fabs(o[t][e] - od[t][e]));
        for (int i = 0; i < DK * DV; i++) worst_s = fmax(worst_s, fabs(S[i] - Sd[i]));
        cr_expect(worst < 1e-6 && worst_s < 1e-6, "%s (%s): output off by %g, state by %g",
                  version ? "deltanet_cols" : "deltanet_cols_ref", kernels_isa(), worst, worst_s);
    }
}

/* One call over all tokens, one call per token, and the columns in three
 * ranges: the same bits, for the reference and the dispatched version
 * (which is what prefill, decode and verification each call). */
Test(deltanet, batching_and_column_splits_give_the_same_bits) {
    static Inputs in;
    make_inputs(&in);
    for (int version = 0; version < 2; version++) {
        void (*f)(float *, const DeltaRule *, int, int) = version ? deltanet_cols : deltanet_cols_ref;
        static float Sa[DK * DV], Sb[DK * DV], oa[NT][DV], ob[NT][DV];
        for (int i = 0; i < DK * DV; i++) Sa[i] = Sb[i] = 0.1f * grand();
        DeltaRule a = rule(&in, oa, 0, NT);
        f(Sa, &a, 0, DV);
        for (int t = 0; t < NT; t++) {
            DeltaRule b = rule(&in, ob, t, 1);
            f(Sb, &b, 0, 16);
            f(Sb, &b, 16, 64);
            f(Sb, &b, 64, DV);
        }
        cr_expect(!memcmp(Sa, Sb, sizeof Sa), "%d: state differs", version);
        cr_expect(!memcmp(oa, ob, sizeof oa), "%d: outputs differ", version);
    }
}

/* The SIMD order in scalar C, column by column over the first dk rows of
 * the inputs: u's sums over even and odd rows of S apart, alpha folded
 * into u and into the update, o's sums split the same way; fmaf where the
 * kernels fuse. */
static void folded_twin(float *S, const Inputs *in, float (*o)[DV], int dk) {
    for (int t = 0; t < NT; t++)
        for (int e = 0; e < DV; e++) {
            const float *k = in->k[t], *q = in->q[t];
            float s[2] = {0, 0};
            for (int i = 0; i < dk; i++) s[i & 1] = fmaf(S[i * DV + e], k[i], s[i & 1]);
            const float d = in->beta[t] * (in->v[t][e] - in->alpha[t] * (s[0] + s[1]));
            s[0] = s[1] = 0;
            for (int i = 0; i < dk; i++) {
                S[i * DV + e] = fmaf(S[i * DV + e], in->alpha[t], k[i] * d);
                s[i & 1] = fmaf(S[i * DV + e], q[i], s[i & 1]);
            }
            o[t][e] = s[0] + s[1];
        }
}

/* Every SIMD level the CPU has gives its twin's bits (so the same bits as
 * each other: AVX-512 makes two passes over S per token, AVX2 one), at an
 * even and an odd dk, over columns [0, 72) then [72, 80) (a 16-wide tile
 * and an 8-wide one on AVX2; 8-wide ranges on AVX-512 take the AVX2 tile). */
Test(deltanet, simd_levels_give_the_folded_twins_bits) {
    static const char *simd[] = {"avx512", "avx2", "neon"};
    static Inputs in;
    make_inputs(&in);
    int levels = 0;
    for (int dk = DK - 1; dk <= DK; dk++) {
        static float S0[DK * DV], St[DK * DV], ot[NT][DV];
        for (int i = 0; i < DK * DV; i++) S0[i] = St[i] = 0.3f * grand();
        folded_twin(St, &in, ot, dk);
        for (int k = 0; k < 3; k++) {
            if (kernels_set_isa(simd[k])) continue;
            static float S[DK * DV], o[NT][DV];
            memcpy(S, S0, sizeof S);
            DeltaRule a = rule(&in, o, 0, NT);
            a.dk = dk;
            deltanet_cols(S, &a, 0, 72);
            deltanet_cols(S, &a, 72, DV);
            cr_expect(!memcmp(S, St, sizeof S), "%s dk=%d: state differs from the twin's", simd[k], dk);
            cr_expect(!memcmp(o, ot, sizeof o), "%s dk=%d: outputs differ from the twin's", simd[k], dk);
            levels++;
        }
    }
    if (!levels) cr_skip_test("no SIMD level on this CPU");
}
