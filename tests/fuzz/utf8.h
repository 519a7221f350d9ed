/* utf8.h: a UTF-8 validity check of the harnesses' own (static, included
 * by each harness that needs it), so that what they check the library's
 * output against shares no code with the library's quote.c.
 *
 * Data flow: error lines (fuzz_tokenizer_load.c) and metadata values
 * (fuzz_safetensors.c) -> fz_is_utf8. Follows Unicode table 3-7: no
 * overlong forms, no surrogates, nothing past U+10FFFF.
 */
#ifndef FUZZ_UTF8_H
#define FUZZ_UTF8_H

#include <stddef.h>

static int fz_is_utf8(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        unsigned c = u[i], lo = 0x80, hi = 0xBF;
        size_t len;
        if (c < 0x80) {
            i++;
            continue;
        }
        if (c >= 0xC2 && c <= 0xDF) len = 2;
        else if (c >= 0xE0 && c <= 0xEF) len = 3, lo = c == 0xE0 ? 0xA0 : lo, hi = c == 0xED ? 0x9F : hi;
        else if (c >= 0xF0 && c <= 0xF4) len = 4, lo = c == 0xF0 ? 0x90 : lo, hi = c == 0xF4 ? 0x8F : hi;
        else return 0;
        if (n - i < len || u[i + 1] < lo || u[i + 1] > hi) return 0;
        for (size_t k = 2; k < len; k++)
            if ((u[i + k] & 0xC0) != 0x80) return 0;
        i += len;
    }
    return 1;
}

#endif
