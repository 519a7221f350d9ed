/* flush.h: subnormals flushed to zero, inputs and results, while a kernel
 * runs, for the arithmetic that must match one that flushes them itself
 * (vdpbf16ps's DAZ/FTZ; attention on every CPU alike).
 *
 * MXCSR's FTZ and DAZ on x86-64, FPCR.FZ on aarch64 (both at once there);
 * elsewhere nothing changes. The state is the calling thread's:
 * flush_on returns it as it was, for flush_off to put back. */
#ifndef FLUSH_H
#define FLUSH_H

#include <stdint.h>

#if defined(__x86_64__)
#include <immintrin.h>
static inline uint64_t flush_on(void) {
    const unsigned csr = _mm_getcsr();
    _mm_setcsr(csr | 0x8040);
    return csr;
}
static inline void flush_off(uint64_t csr) { _mm_setcsr((unsigned)csr); }
#elif defined(__aarch64__)
static inline uint64_t flush_on(void) {
    uint64_t fpcr;
    __asm__ __volatile__("mrs %0, fpcr" : "=r"(fpcr));
    __asm__ __volatile__("msr fpcr, %0" : : "r"(fpcr | (UINT64_C(1) << 24)));
    return fpcr;
}
static inline void flush_off(uint64_t fpcr) { __asm__ __volatile__("msr fpcr, %0" : : "r"(fpcr)); }
#else
static inline uint64_t flush_on(void) { return 0; }
static inline void flush_off(uint64_t state) { (void)state; }
#endif

#endif
