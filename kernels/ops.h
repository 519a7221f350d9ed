/* ops.h: the element-wise and per-row operations of a Qwen3 layer.
 *
 * Data flow: model/ applies these between the matmuls: RMSNorm before each
 * block and on every q/k head, RoPE on q and k, SwiGLU between the MLP's
 * projections, softmax for sampling. All f32, all in place where marked.
 * They are cheap next to the matmuls, so each is one plain loop the
 * compiler vectorises; there is no separate reference version.
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
/* x[n] = softmax(x) in place */
void softmax(float *x, int n);

#endif
