/* polar4.h: what polar4's GPU twin (kv/polar4.cu, through model/gpu.c)
 * takes from kv/polar4.c: the layer's dense rotation, so that both devices
 * code and attend with the same matrix.
 *
 *   m [n, n]   m[i n + j] = R[i][j]; append: y = x·R, attention: q·R, out·Rᵀ
 *   mt [n, n]  its transpose, so that both directions stream rows
 */
#ifndef KV_POLAR4_H
#define KV_POLAR4_H

/* Fills m with the rotation of cache layer `layer` for blocks of n values
 * (32, 64 or 128), as polar4's streams of that layer use it, and mt (unless
 * NULL) with its transpose, mt[j n + i] = m[i n + j]; -1 when out of memory. */
int polar4_rotation(int n, int layer, float *m, float *mt);

#endif
