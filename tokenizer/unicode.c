/* unicode.c: UTF-8 decoding, code point classes and NFC (see unicode.h).
 *
 * Sits between tokenizer.c and the generated tables in unicode_tables.h.
 * NFC follows UAX #15: full canonical decomposition (Hangul arithmetically,
 * Unicode ch. 3.12), canonical ordering of non-starters by combining class,
 * then canonical composition of primary composites with the blocking rule.
 */
#include "tokenizer/unicode.h"

#include <stdlib.h>
#include <string.h>

#include "tokenizer/unicode_tables.h"

_Static_assert(UNI_NFC_GROWTH <= UNI_NFC_MAX_GROWTH, "regenerated tables grow NFC text more than unicode.h promises");

/* Hangul syllable arithmetic (Unicode ch. 3.12): S = SBASE + (L*VCOUNT + V)*TCOUNT + T */
enum {
    SBASE = 0xAC00, LBASE = 0x1100, VBASE = 0x1161, TBASE = 0x11A7,
    LCOUNT = 19, VCOUNT = 21, TCOUNT = 28, NCOUNT = VCOUNT * TCOUNT, SCOUNT = LCOUNT * NCOUNT,
};

size_t uni_decode(const unsigned char *s, size_t n, uint32_t *cp) {
    unsigned b = s[0];
    if (b < 0x80) { *cp = b; return 1; }
    /* table 3-7: lead byte -> length and the allowed range of the second byte,
     * which is what rules out overlongs, surrogates and code points > U+10FFFF */
    size_t len;
    unsigned lo = 0x80, hi = 0xBF;
    if (b >= 0xC2 && b <= 0xDF) len = 2;
    else if (b >= 0xE0 && b <= 0xEF) {
        len = 3;
        if (b == 0xE0) lo = 0xA0;
        if (b == 0xED) hi = 0x9F;
    } else if (b >= 0xF0 && b <= 0xF4) {
        len = 4;
        if (b == 0xF0) lo = 0x90;
        if (b == 0xF4) hi = 0x8F;
    } else {
        *cp = UNI_RAW_BYTE + b;
        return 1;
    }
    /* truncated, or a bad second byte: only the lead byte is given up on, so
     * the bytes after it get their own chance (they may start a character) */
    if (n < len || s[1] < lo || s[1] > hi) { *cp = UNI_RAW_BYTE + b; return 1; }
    uint32_t v = b & (0x7F >> len); /* payload bits of the lead byte */
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) { *cp = UNI_RAW_BYTE + b; return 1; }
        v = (v << 6) | (s[i] & 0x3F);
    }
    *cp = v;
    return len;
}

/* Standard UTF-8 by length class; pseudo code points give back their byte. */
size_t uni_encode(uint32_t cp, char *out) {
    if (cp >= UNI_RAW_BYTE) { out[0] = (char)(cp - UNI_RAW_BYTE); return 1; }
    if (cp < 0x80) { out[0] = (char)cp; return 1; }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Value of the range holding cp in a sorted, disjoint range table; 0 if none. */
static unsigned range_value(const UniRange *r, size_t n, uint32_t cp) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (cp < r[mid].lo) hi = mid;
        else if (cp > r[mid].hi) lo = mid + 1;
        else return r[mid].value;
    }
    return 0;
}

#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

unsigned uni_flags(uint32_t cp) {
    /* ASCII is most of the text in practice: answer it without a search */
    if (cp < 0x80) {
        if ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z') return UNI_L;
        if (cp >= '0' && cp <= '9') return UNI_N;
        return (cp == ' ' || (cp >= 0x09 && cp <= 0x0D)) ? UNI_WS : 0;
    }
    return range_value(uni_flag_ranges, COUNT(uni_flag_ranges), cp);
}

unsigned uni_ccc(uint32_t cp) {
    if (cp < 0x300) return 0; /* the first non-starter is U+0300 */
    return range_value(uni_ccc_ranges, COUNT(uni_ccc_ranges), cp);
}

/* UAX #15 quick check, simplified: "yes" when no code point is NFC_QC No/Maybe
 * and none is a non-starter (so no reordering can be needed either). */
int uni_is_nfc_quick(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        if (u[i] < 0x80) { i++; continue; }
        uint32_t cp;
        i += uni_decode(u + i, n - i, &cp);
        if (uni_flags(cp) & UNI_NFC) return 0;
    }
    return 1;
}

/* Appends the full canonical decomposition of cp to out; returns how many
 * code points it wrote (1..UNI_MAX_DECOMP). */
static size_t decompose(uint32_t cp, uint32_t *out) {
    if (cp >= SBASE && cp < SBASE + SCOUNT) {
        uint32_t s = cp - SBASE, t = s % TCOUNT;
        out[0] = LBASE + s / NCOUNT;
        out[1] = VBASE + (s % NCOUNT) / TCOUNT;
        if (t == 0) return 2;
        out[2] = TBASE + t;
        return 3;
    }
    /* U+00C0 is the first code point with a canonical decomposition */
    if (cp >= 0xC0 && cp < UNI_RAW_BYTE) {
        size_t lo = 0, hi = COUNT(uni_decomps);
        while (lo < hi) {
            size_t mid = lo + (hi - lo) / 2;
            if (cp < uni_decomps[mid].cp) hi = mid;
            else if (cp > uni_decomps[mid].cp) lo = mid + 1;
            else {
                const UniDecomp *d = &uni_decomps[mid];
                for (size_t k = 0; k < d->len; k++) out[k] = uni_decomp_pool[d->off + k];
                return d->len;
            }
        }
    }
    out[0] = cp;
    return 1;
}

/* Primary composite of the pair (a, b), or 0 when they do not compose. */
static uint32_t compose(uint32_t a, uint32_t b) {
    /* Hangul: leading consonant + vowel -> LV syllable; LV + trailing consonant -> LVT */
    if (a >= LBASE && a < LBASE + LCOUNT && b >= VBASE && b < VBASE + VCOUNT)
        return SBASE + ((a - LBASE) * VCOUNT + (b - VBASE)) * TCOUNT;
    if (a >= SBASE && a < SBASE + SCOUNT && (a - SBASE) % TCOUNT == 0 && b > TBASE && b < TBASE + TCOUNT)
        return a + (b - TBASE);
    /* binary search on the (first, second) pair, ordered first-major */
    size_t lo = 0, hi = COUNT(uni_comps);
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        const UniComp *c = &uni_comps[mid];
        if (a < c->first || (a == c->first && b < c->second)) hi = mid;
        else if (a > c->first || b > c->second) lo = mid + 1;
        else return c->composite;
    }
    return 0;
}

/* Scratch for nfc_chunk, grown on demand: decomposed code points, their
 * classes, and the same again as the output side of the counting sort. */
typedef struct {
    uint32_t *cps, *tmp_cps;
    unsigned char *cls, *tmp_cls;
    size_t cap;
} NfcBuf;

/* Stable sort of a run of non-starters by combining class: insertion sort for
 * the usual short runs, counting sort for long ones (no quadratic blow-up on
 * hostile input). */
static void sort_run(NfcBuf *b, size_t lo, size_t hi) {
    if (hi - lo <= 32) {
        for (size_t i = lo + 1; i < hi; i++) {
            uint32_t cp = b->cps[i];
            unsigned char c = b->cls[i];
            size_t at = i;
            for (; at > lo && b->cls[at - 1] > c; at--) {
                b->cps[at] = b->cps[at - 1];
                b->cls[at] = b->cls[at - 1];
            }
            b->cps[at] = cp;
            b->cls[at] = c;
        }
        return;
    }
    /* start[c]: where class c begins in the sorted run (counts, then prefix sums) */
    size_t start[257] = {0};
    for (size_t i = lo; i < hi; i++) start[b->cls[i] + 1]++;
    for (int c = 0; c < 256; c++) start[c + 1] += start[c];
    for (size_t i = lo; i < hi; i++) {
        size_t at = lo + start[b->cls[i]]++;
        b->tmp_cps[at] = b->cps[i];
        b->tmp_cls[at] = b->cls[i];
    }
    for (size_t i = lo; i < hi; i++) {
        b->cps[i] = b->tmp_cps[i];
        b->cls[i] = b->tmp_cls[i];
    }
}

/* NFC of s[0 .. n), a chunk that starts at a boundary (see uni_nfc), written
 * to out; returns the bytes written, or (size_t)-1 when out of memory. */
static size_t nfc_chunk(NfcBuf *b, const unsigned char *s, size_t n, char *out) {
    /* one input byte yields at most one code point before decomposition */
    if (n * UNI_MAX_DECOMP > b->cap) {
        size_t cap = 2 * n * UNI_MAX_DECOMP;
        uint32_t *c1 = realloc(b->cps, cap * sizeof *c1);
        if (c1) b->cps = c1;
        uint32_t *c2 = realloc(b->tmp_cps, cap * sizeof *c2);
        if (c2) b->tmp_cps = c2;
        unsigned char *k1 = realloc(b->cls, cap);
        if (k1) b->cls = k1;
        unsigned char *k2 = realloc(b->tmp_cls, cap);
        if (k2) b->tmp_cls = k2;
        if (!c1 || !c2 || !k1 || !k2) return (size_t)-1;
        b->cap = cap;
    }
    /* 1. full canonical decomposition, 2. canonical ordering of each run of non-starters */
    /* run: start of the current run of non-starters in cps[0 .. m) */
    size_t m = 0, run = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp, d[UNI_MAX_DECOMP];
        i += uni_decode(s + i, n - i, &cp);
        size_t k = decompose(cp, d);
        for (size_t j = 0; j < k; j++) {
            unsigned c = uni_ccc(d[j]);
            if (c == 0) {
                sort_run(b, run, m);
                run = m + 1;
            }
            b->cps[m] = d[j];
            b->cls[m++] = (unsigned char)c;
        }
    }
    sort_run(b, run, m);

    /* 3. compose: a code point joins the last starter when nothing between
     * them blocks it (no intervening code point of class 0 or >= its own) */
    size_t w = 0, starter = 0;
    int have_starter = 0;
    unsigned last = 0; /* class of the last code point kept; 0 right after the starter */
    for (size_t i = 0; i < m; i++) {
        uint32_t cp = b->cps[i];
        unsigned c = b->cls[i];
        if (have_starter && (w == starter + 1 || last < c)) {
            uint32_t comp = compose(b->cps[starter], cp);
            if (comp) { b->cps[starter] = comp; continue; }
        }
        if (c == 0) { starter = w; have_starter = 1; }
        last = c;
        b->cps[w++] = cp;
    }
    /* out has room: NFC never outgrows NFD, which UNI_NFC_MAX_GROWTH bounds */
    size_t o = 0;
    for (size_t i = 0; i < w; i++) o += uni_encode(b->cps[i], out + o);
    return o;
}

char *uni_nfc(const char *s, size_t n, size_t *out_len) {
    const unsigned char *u = (const unsigned char *)s;
    char *out = malloc(n * UNI_NFC_MAX_GROWTH + 1);
    if (!out) return NULL;
    /* A code point without UNI_NFC (NFC_QC Yes, class 0) never combines with
     * what precedes it, so text splits before each one into chunks that
     * normalise independently (UAX #15 sec. 9). Runs of such code points are
     * copied as they are; only a chunk holding a flagged code point, from the
     * last unflagged one before it to the next unflagged one, goes through
     * nfc_chunk. copied: input consumed so far; boundary: start of the last
     * unflagged code point seen. */
    NfcBuf b = {0};
    size_t o = 0, copied = 0, boundary = 0, i = 0;
    while (i < n) {
        uint32_t cp;
        size_t len = uni_decode(u + i, n - i, &cp);
        if (!(uni_flags(cp) & UNI_NFC)) {
            boundary = i;
            i += len;
            continue;
        }
        /* the chunk runs on to the next unflagged code point */
        size_t end = i + len;
        while (end < n) {
            size_t l = uni_decode(u + end, n - end, &cp);
            if (!(uni_flags(cp) & UNI_NFC)) break;
            end += l;
        }
        /* the untouched stretch before the chunk goes out as is */
        memcpy(out + o, s + copied, boundary - copied);
        o += boundary - copied;
        size_t w = nfc_chunk(&b, u + boundary, end - boundary, out + o);
        if (w == (size_t)-1) {
            free(out);
            out = NULL;
            break;
        }
        o += w;
        copied = boundary = i = end;
    }
    if (out) {
        memcpy(out + o, s + copied, n - copied);
        o += n - copied;
        out[o] = 0;
        *out_len = o;
    }
    free(b.cps);
    free(b.tmp_cps);
    free(b.cls);
    free(b.tmp_cls);
    return out;
}

const char *uni_version(void) { return UNI_TABLES_VERSION; }
