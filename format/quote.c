/* quote.c: bounded, printable quoting for error lines (see quote.h).
 *
 * Data flow: beside the main chain: a loader that names a key, a token or
 * a tensor from a file it rejects passes it through quote() into its own
 * buffer before printing:
 *
 *   "model.layers.0\x0Aq_proj"    control bytes, '"', '\' and non-UTF-8 as \xNN
 *
 * UTF-8 validity follows the Unicode standard's table 3-7 (ch. 3.9). */
#include "format/quote.h"

#include <stdio.h>
#include <string.h>

/* Length of the valid UTF-8 character at u[0 .. n), or 0 when it is not
 * one (Unicode table 3-7: no overlongs, no surrogates, nothing past U+10FFFF). */
static size_t utf8_len(const unsigned char *u, size_t n) {
    unsigned c = u[0], lo = 0x80, hi = 0xBF;
    size_t len;
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) len = 2;
    else if (c >= 0xE0 && c <= 0xEF) len = 3, lo = c == 0xE0 ? 0xA0 : lo, hi = c == 0xED ? 0x9F : hi;
    else if (c >= 0xF0 && c <= 0xF4) len = 4, lo = c == 0xF0 ? 0x90 : lo, hi = c == 0xF4 ? 0x8F : hi;
    else return 0;
    if (n < len || u[1] < lo || u[1] > hi) return 0;
    for (size_t i = 2; i < len; i++)
        if ((u[i] & 0xC0) != 0x80) return 0;
    return len;
}

const char *quote(const char *s, size_t n, char *buf, size_t size) {
    static const char hex[] = "0123456789ABCDEF";
    if (size < 8) {
        if (size) buf[0] = 0;
        return buf;
    }
    /* room for the closing quote, "..." and the NUL after the text */
    size_t limit = size - 5 < QUOTE_TEXT + 1 ? size - 5 : QUOTE_TEXT + 1, o = 0;
    const unsigned char *u = (const unsigned char *)s;
    buf[o++] = '"';
    for (size_t i = 0; i < n;) {
        size_t len = utf8_len(u + i, n - i);
        /* C1 controls (U+0080..U+009F) are escapes to a terminal too */
        int c1 = len == 2 && u[i] == 0xC2 && u[i + 1] < 0xA0;
        int esc = len == 0 || u[i] < 0x20 || u[i] == '"' || u[i] == '\\' || u[i] == 0x7F;
        size_t need = esc ? 4 : c1 ? 6 : len;
        if (o + need > limit) {
            memcpy(buf + o, "...", 3);
            o += 3;
            break;
        }
        if (esc) {
            buf[o++] = '\\', buf[o++] = 'x', buf[o++] = hex[u[i] >> 4], buf[o++] = hex[u[i] & 15];
            i++;
        } else if (c1) {
            memcpy(buf + o, "\\u00", 4);
            buf[o + 4] = hex[u[i + 1] >> 4], buf[o + 5] = hex[u[i + 1] & 15];
            o += 6, i += 2;
        } else {
            memcpy(buf + o, u + i, len);
            o += len, i += len;
        }
    }
    buf[o++] = '"';
    buf[o] = 0;
    return buf;
}

size_t utf8_valid_prefix(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0, len;
    while (i < n && (len = utf8_len(u + i, n - i))) i += len;
    return i;
}

int utf8_valid(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0, len; i < n; i += len)
        if (!(len = utf8_len(u + i, n - i))) return 0;
    return 1;
}

const char *quote_str(const char *s, char *buf, size_t size) {
    if (!s) {
        snprintf(buf, size, "(null)");
        return buf;
    }
    return quote(s, strlen(s), buf, size);
}
