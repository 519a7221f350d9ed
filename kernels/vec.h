/* vec.h: the short vector primitives attention's inner loops are made of.
 *
 * Data flow: kv/ schemes call these on one cached vector at a time (head_dim
 * values, 32..256) while attn/ walks the positions. Each has a plain C
 * reference (_ref) that the tests compare the dispatched version against;
 * the dispatched version follows kernels_isa() (see matmul.h).
 */
#ifndef VEC_H
#define VEC_H

#include <stdint.h>

float vec_dot_f32_ref(const float *a, const float *b, int n);
float vec_dot_f16_ref(const uint16_t *a, const float *b, int n);
void vec_axpy_f32_ref(float *y, float a, const float *x, int n);   /* y += a x */
void vec_axpy_f16_ref(float *y, float a, const uint16_t *x, int n);
void vec_f32_to_f16_ref(uint16_t *out, const float *x, int n);

float vec_dot_f32(const float *a, const float *b, int n);
float vec_dot_f16(const uint16_t *a, const float *b, int n);
void vec_axpy_f32(float *y, float a, const float *x, int n);
void vec_axpy_f16(float *y, float a, const uint16_t *x, int n);
void vec_f32_to_f16(uint16_t *out, const float *x, int n);

#endif
