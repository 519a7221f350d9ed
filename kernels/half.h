/* half.h: scalar conversions between float and the 16-bit formats that
 * checkpoints (bf16, f16) and KV caches (f16 scales, f16 values) store.
 *
 * bf16 is the top half of an IEEE float, so widening is a shift and exact.
 * f16 follows IEEE 754 binary16 with round-to-nearest-even on narrowing,
 * subnormals and inf/nan handled, matching F16C's vcvtps2ph(imm=0).
 */
#ifndef HALF_H
#define HALF_H

#include <stdint.h>
#include <string.h>

static inline float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* f32 -> bf16 as AVX-512 BF16's vcvtneps2bf16 rounds: to nearest even,
 * NaN kept (made quiet), subnormal inputs to a zero of their sign. */
static inline uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7FFFFFFF) > 0x7F800000) return (uint16_t)(u >> 16 | 0x40);
    if ((u & 0x7F800000) == 0) return (uint16_t)(u >> 16 & 0x8000);
    return (uint16_t)((u + 0x7FFF + (u >> 16 & 1)) >> 16);
}

static inline float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1F, man = h & 0x3FF, u;
    if (exp == 0x1F) u = sign | 0x7F800000 | (man << 13);         /* inf / nan */
    else if (exp != 0) u = sign | ((exp + 112) << 23) | (man << 13); /* normal: rebias 15 -> 127 */
    else if (man == 0) u = sign;                                   /* +-0 */
    else {                                                         /* subnormal: normalise */
        int e = -1;
        do { man <<= 1; e++; } while (!(man & 0x400));
        u = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3FF) << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000;
    int32_t exp = (int32_t)((u >> 23) & 0xFF);
    uint32_t man = u & 0x7FFFFF;
    if (exp == 0xFF) return (uint16_t)(sign | 0x7C00 | (man ? 0x200 : 0)); /* inf / nan */
    int32_t e = exp - 127 + 15;
    if (e >= 0x1F) return (uint16_t)(sign | 0x7C00);                   /* overflow -> inf */
    if (e <= 0) {                                                      /* subnormal or zero */
        if (e < -10) return (uint16_t)sign;
        man |= 0x800000;
        uint32_t shift = (uint32_t)(14 - e);
        uint32_t half = man >> shift, rem = man & ((1u << shift) - 1), mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1))) half++;
        return (uint16_t)(sign | half);
    }
    uint32_t half = sign | ((uint32_t)e << 10) | (man >> 13), rem = man & 0x1FFF;
    if (rem > 0x1000 || (rem == 0x1000 && (half & 1))) half++;         /* carries into exp correctly */
    return (uint16_t)half;
}

#endif
