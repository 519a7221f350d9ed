/* ops.h: the element-wise and per-row operations of a Qwen3 layer.
 *
 * Data flow: model/ applies these between the matmuls: RMSNorm before each
 * block and on every q/k head, RoPE on q and k, SwiGLU between the MLP's
 * projections, argmax for greedy sampling, attention's exponentials, and
 * the check for NaN and infinity on the outputs. All
 * f32, all in place where marked. Most are cheap next to the matmuls and
 * stay one plain loop the compiler vectorises. The two that call exp per
 * element (swiglu, exp_sub_sum) have AVX-512, AVX2 and NEON paths with
 * their own exp next to a plain C reference (_ref, libm expf) they are
 * tested against:
 * libm's expf is a call per element, and with it exp is a visible share of
 * a small model's forward and of long-context attention
 * (docs/kernel-notes.md#exp).
 */
#ifndef OPS_H
#define OPS_H

/* y[n] = w[n] * x / sqrt(mean(x^2) + eps)   (y may alias x) */
void rmsnorm(float *y, const float *x, const float *w, int n, float eps);
/* NeoX RoPE on one head x[d] in place: pairs (i, i + d/2) rotated by the
 * angle with cosine cs[i] and sine sn[i], i < d/2. */
void rope(float *x, const float *cs, const float *sn, int d);
/* a[n] = silu(a) * b */
void swiglu(float *a, const float *b, int n);
void swiglu_ref(float *a, const float *b, int n);
/* a[n] = silu(a) = a / (1 + exp(-a)) (Gated DeltaNet's conv output) */
void silu(float *a, int n);
void silu_ref(float *a, int n);
/* The largest of m and x[0..n) (attention's running maximum). */
float max_from(const float *x, int n, float m);
float max_from_ref(const float *x, int n, float m);
/* Index of the first largest value of x[0..n), NaNs skipped; 0 when every
 * value is NaN (greedy decoding and draft verification, once per row). */
int argmax(const float *x, int n);
int argmax_ref(const float *x, int n);
/* x[i] = exp(x[i] - m) for i < n; returns their sum (softmax numerators). */
float exp_sub_sum(float *x, int n, float m);
float exp_sub_sum_ref(float *x, int n, float m);
/* y[n] = exp(x) (for tests of the SIMD exp against libm) */
void exp16_array(float *y, const float *x, int n);
/* Index of the first NaN or infinity in x[0..n), or -1 when all are
 * finite: the model checks its outputs with it, so that bad weights end
 * the run with an error instead of printing token 0 forever. */
long find_nonfinite(const float *x, long n);

#endif
