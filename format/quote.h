/* quote.h: strings from hostile files, made safe to print in an error line
 * (and the UTF-8 check the writers of JSON need).
 *
 * Data flow: a loader that names a key, a token or a tensor from the file
 * it rejects passes the string through quote() into a buffer of its own.
 * The result is always one line of valid UTF-8 that fits the buffer:
 *
 *   "model.layers.0\x0Aq_proj" ...  control bytes, '"', '\' and bytes that
 *                                   are not UTF-8 become \xNN, C1 controls
 *                                   (U+0080..U+009F) \u00NN
 *   "ĠĠĠĠĠĠĠĠĠĠĠĠĠĠĠĠĠĠĠĠĠ..."      cut at a character boundary, marked ...
 *
 * The cut is by output bytes, so no input (a run of continuation bytes, a
 * million escapes) can write past the buffer.
 */
#ifndef QUOTE_H
#define QUOTE_H

#include <stddef.h>

/* At most this many bytes of quoted text before the cut (buffers of
 * QUOTE_BUF bytes always hold it whole, quotes and "..." included). */
#define QUOTE_TEXT 64
#define QUOTE_BUF (QUOTE_TEXT + 8)

/* s[0 .. n) quoted into buf (size bytes; at least 8, QUOTE_BUF to get all
 * QUOTE_TEXT bytes). Returns buf. */
const char *quote(const char *s, size_t n, char *buf, size_t size);
/* The same for a NUL-terminated string (NULL quotes as "(null)" unquoted). */
const char *quote_str(const char *s, char *buf, size_t size);
/* Whether s[0 .. n) is valid UTF-8 (Unicode table 3-7). */
int utf8_valid(const char *s, size_t n);
/* Bytes of the longest prefix of s[n] that is valid UTF-8 (n when all is). */
size_t utf8_valid_prefix(const char *s, size_t n);

#endif
