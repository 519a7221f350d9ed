/* unicode.h: the Unicode facts the Qwen2/Qwen3 tokenizer needs.
 *
 * Data flow: tokenizer.c hands raw UTF-8 text here twice: uni_nfc turns it
 * into Normalization Form C (the tokenizer.json "NFC" normalizer), then the
 * pre-tokenizer walks it with uni_decode + uni_flags to classify each code
 * point as a letter (\p{L}), a number (\p{N}) or white space (\s).
 * Tables come from tools/gen_unicode.py (Unicode version: uni_version()).
 *
 * Invalid UTF-8 never stops anything: each byte that does not start a valid,
 * shortest-form sequence decodes to the pseudo code point UNI_RAW_BYTE + byte.
 * It has no flags (the regex sees it as punctuation), combining class 0 and no
 * decomposition, and uni_encode writes the original byte back, so text survives
 * a decode / encode round trip byte for byte. Follows UAX #15 (normalisation)
 * and Unicode ch. 3.9 table 3-7 (well-formed UTF-8).
 */
#ifndef UNICODE_H
#define UNICODE_H

#include <stddef.h>
#include <stdint.h>

/* uni_flags bits */
enum {
    UNI_L = 1,    /* General_Category L* (Lu Ll Lt Lm Lo) */
    UNI_N = 2,    /* General_Category N* (Nd Nl No) */
    UNI_WS = 4,   /* White_Space property: what \s means in Oniguruma and Rust regex */
    UNI_NFC = 8,  /* NFC_QC is No/Maybe or combining class != 0: NFC may change the text here */
    UNI_M = 16,   /* General_Category M* (Mn Mc Me): Qwen3.5's split regex keeps marks with letters */
};

/* NFC output is at most this many times as long as its UTF-8 input (a Hangul
 * syllable grows 3 -> 9 bytes in NFD; unicode.c checks the generated tables agree) */
#define UNI_NFC_MAX_GROWTH 3

/* first of the 256 pseudo code points standing for invalid UTF-8 bytes */
#define UNI_RAW_BYTE 0x110000u

/* Decodes one code point from s[0 .. n), n >= 1. Returns its byte length
 * (1..4) and stores it in *cp; an invalid byte gives UNI_RAW_BYTE + byte, length 1. */
size_t uni_decode(const unsigned char *s, size_t n, uint32_t *cp);
/* Writes cp as UTF-8 (a pseudo code point as its raw byte); returns 1..4. */
size_t uni_encode(uint32_t cp, char *out);
/* UNI_* bits of cp. */
unsigned uni_flags(uint32_t cp);
/* Canonical combining class of cp (0 for starters and pseudo code points). */
unsigned uni_ccc(uint32_t cp);

/* 1 when NFC(s) == s for sure (no code point carries UNI_NFC), else 0. */
int uni_is_nfc_quick(const char *s, size_t n);
/* NFC of s[0 .. n) as a malloc'd, NUL-terminated buffer of *out_len bytes
 * (*out_len <= UNI_NFC_MAX_GROWTH * n); NULL when out of memory. */
char *uni_nfc(const char *s, size_t n, size_t *out_len);

/* Version of the Unicode Character Database the tables were generated from. */
const char *uni_version(void);

#endif
