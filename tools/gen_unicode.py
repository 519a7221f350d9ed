#!/usr/bin/env python3
"""gen_unicode.py: writes tokenizer/unicode_tables.h from the Unicode Character Database.

Data flow: UCD text files (Debian's unicode-data package, /usr/share/unicode)
-> this script -> tokenizer/unicode_tables.h (committed) -> tokenizer/unicode.c,
which answers the two questions the Qwen2 tokenizer asks of a code point:
  * its class for the pre-tokenizer regex: \\p{L} (gc L*), \\p{N} (gc N*),
    \\s (White_Space, which is what Oniguruma and Rust regex use for \\s);
  * how NFC treats it: canonical combining class, full canonical decomposition,
    primary composites (canonical pairs minus Full_Composition_Exclusion).
Hangul syllables are left out of the decomposition / composition tables; the
C code handles them arithmetically (Unicode ch. 3.12).

Usage: python3 tools/gen_unicode.py [UCD_DIR] [OUT]
defaults: /usr/share/unicode tokenizer/unicode_tables.h
"""
import os
import re
import sys

UCD = sys.argv[1] if len(sys.argv) > 1 else "/usr/share/unicode"
OUT = sys.argv[2] if len(sys.argv) > 2 else "tokenizer/unicode_tables.h"
MAX_CP = 0x10FFFF

# flag bits, mirrored by UNI_* in unicode.h
F_L, F_N, F_WS, F_NFC, F_M = 1, 2, 4, 8, 16


def lines(name):
    """Yields the data fields of a UCD file, comments and blanks stripped."""
    with open(os.path.join(UCD, name), encoding="utf-8") as f:
        for ln in f:
            ln = ln.split("#", 1)[0].strip()
            if ln:
                yield [x.strip() for x in ln.split(";")]


def cp_range(field):
    """'0041' or '0041..005A' -> (lo, hi)."""
    if ".." in field:
        lo, hi = field.split("..")
        return int(lo, 16), int(hi, 16)
    return int(field, 16), int(field, 16)


def ucd_version():
    with open(os.path.join(UCD, "DerivedNormalizationProps.txt"), encoding="utf-8") as f:
        m = re.match(r"# DerivedNormalizationProps-([0-9.]+)\.txt", f.readline())
    if not m:
        sys.exit("cannot read the Unicode version from DerivedNormalizationProps.txt")
    return m.group(1)


def read_unicode_data():
    """Returns (gc, ccc, decomp): dicts by code point. UnicodeData.txt lists big
    blocks (CJK, Hangul, ...) as a '<..., First>' / '<..., Last>' pair of lines."""
    gc, ccc, decomp = {}, {}, {}
    first = None
    for f in lines("UnicodeData.txt"):
        cp, name, cat, cls, dec = int(f[0], 16), f[1], f[2], int(f[3]), f[5]
        if name.endswith(", First>"):
            first = cp
            continue
        lo = first if name.endswith(", Last>") else cp
        first = None
        for c in range(lo, cp + 1):
            gc[c] = cat
            if cls:
                ccc[c] = cls
        if dec and not dec.startswith("<"):
            decomp[cp] = [int(x, 16) for x in dec.split()]
    return gc, ccc, decomp


def read_prop(name, prop, value=None):
    """Set of code points having property prop (optionally with the given value)."""
    out = set()
    for f in lines(name):
        if f[1] != prop or (value is not None and (len(f) < 3 or f[2] != value)):
            continue
        lo, hi = cp_range(f[0])
        out.update(range(lo, hi + 1))
    return out


def full_decomp(cp, decomp):
    """Recursive canonical decomposition (NFD of one code point)."""
    if cp not in decomp:
        return [cp]
    out = []
    for c in decomp[cp]:
        out.extend(full_decomp(c, decomp))
    return out


def ranges(value_of):
    """Run-length encodes value_of(cp) over all code points; drops zero runs.
    Returns [(lo, hi, value)]. One pass over all 1.1M code points is fast enough."""
    out, start, cur = [], 0, value_of(0)
    for cp in range(1, MAX_CP + 2):
        v = value_of(cp) if cp <= MAX_CP else None
        if v != cur:
            if cur:
                out.append((start, cp - 1, cur))
            start, cur = cp, v
    return out


def main():
    version = ucd_version()
    gc, ccc, decomp = read_unicode_data()
    white = read_prop("PropList.txt", "White_Space")
    fce = read_prop("DerivedNormalizationProps.txt", "Full_Composition_Exclusion")
    qc_not_yes = read_prop("DerivedNormalizationProps.txt", "NFC_QC", "N") | \
        read_prop("DerivedNormalizationProps.txt", "NFC_QC", "M")

    # Full_Composition_Exclusion must equal the table exclusions plus singletons
    # plus non-starter decompositions (UAX #15); check the files agree.
    table_excl = set()
    for f in lines("CompositionExclusions.txt"):
        lo, hi = cp_range(f[0])
        table_excl.update(range(lo, hi + 1))
    derived = table_excl | {c for c, d in decomp.items()
                            if len(d) == 1 or ccc.get(c, 0) or ccc.get(d[0], 0)}
    if derived != fce:
        sys.exit("Full_Composition_Exclusion disagrees with CompositionExclusions.txt")

    def flags(cp):
        g = gc.get(cp, "Cn")
        v = 0
        if g[0] == "L":
            v |= F_L
        if g[0] == "N":
            v |= F_N
        if g[0] == "M":
            v |= F_M
        if cp in white:
            v |= F_WS
        # "may change under NFC": the quick check answers No/Maybe, or the code
        # point is a non-starter whose position canonical ordering may change
        if cp in qc_not_yes or ccc.get(cp, 0):
            v |= F_NFC
        return v

    # unicode.c skips table searches below these two code points
    if min(decomp) < 0xC0 or min(ccc) < 0x300:
        sys.exit("unicode.c assumes no decomposition below U+00C0 and no non-starter below U+0300")

    flag_ranges = ranges(flags)
    ccc_ranges = ranges(lambda cp: ccc.get(cp, 0))

    # every decomposition is stored fully expanded, so NFC needs one lookup per
    # code point; slices of one shared pool keep the table entries fixed-size
    decomps, pool = [], []
    for cp in sorted(decomp):
        d = full_decomp(cp, decomp)
        decomps.append((cp, len(pool), len(d)))
        pool.extend(d)
    max_decomp = max(n for _, _, n in decomps)
    if len(pool) >= 1 << 16:
        sys.exit("decomposition pool no longer fits the uint16_t offsets")
    # how much NFC can grow UTF-8 text: NFC(s) is never longer than NFD(s), and
    # NFD works code point by code point, so the worst single code point decides
    u8 = lambda cps: sum(len(chr(c).encode("utf-8")) for c in cps)
    growth = max(-(-u8(full_decomp(c, decomp)) // u8([c])) for c in decomp)

    # primary composites: the two-code-point canonical decompositions that
    # are not excluded; singletons and excluded ones never recompose
    comps = sorted((d[0], d[1], c) for c, d in decomp.items() if len(d) == 2 and c not in fce)
    for a, b, c in comps:
        assert a < (1 << 21) and b < (1 << 21)

    # the header: every table sorted by code point (pairs: by first, then second)
    out = []
    w = out.append
    w("/* unicode_tables.h: GENERATED by tools/gen_unicode.py, do not edit.")
    w(" *")
    w(" * Unicode %s, from the Unicode Character Database files UnicodeData.txt," % version)
    w(" * PropList.txt (White_Space), DerivedNormalizationProps.txt (NFC_QC,")
    w(" * Full_Composition_Exclusion) and CompositionExclusions.txt (cross-checked).")
    w(" * Included only by tokenizer/unicode.c; all tables are sorted for binary search.")
    w(" */")
    w("#ifndef UNICODE_TABLES_H")
    w("#define UNICODE_TABLES_H")
    w("")
    w("#include <stdint.h>")
    w("")
    w("/* shapes: a run of code points sharing one value; a decomposition slice; a pair */")
    w("typedef struct { uint32_t lo, hi; uint8_t value; } UniRange;")
    w("typedef struct { uint32_t cp; uint16_t off; uint8_t len; } UniDecomp;")
    w("typedef struct { uint32_t first, second, composite; } UniComp;")
    w("")
    w('#define UNI_TABLES_VERSION "%s"' % version)
    w("/* longest full canonical decomposition of one code point (Hangul: 3) */")
    w("#define UNI_MAX_DECOMP %d" % max(max_decomp, 3))
    w("/* NFC output is at most this many times as long as its UTF-8 input (Hangul: 3 bytes -> 9 bytes) */")
    w("#define UNI_NFC_GROWTH %d" % max(growth, 3))
    w("")
    w("/* [lo, hi] -> UNI_L | UNI_N | UNI_WS | UNI_NFC | UNI_M bits; absent ranges have none */")
    w("static const UniRange uni_flag_ranges[%d] = {" % len(flag_ranges))
    for lo, hi, v in flag_ranges:
        w("    {0x%05X, 0x%05X, %d}," % (lo, hi, v))
    w("};")
    w("")
    w("/* [lo, hi] -> canonical combining class; absent ranges have class 0 */")
    w("static const UniRange uni_ccc_ranges[%d] = {" % len(ccc_ranges))
    for lo, hi, v in ccc_ranges:
        w("    {0x%05X, 0x%05X, %d}," % (lo, hi, v))
    w("};")
    w("")
    w("/* code point -> its full canonical decomposition, uni_decomp_pool[off .. off+len) */")
    w("static const UniDecomp uni_decomps[%d] = {" % len(decomps))
    for cp, off, n in decomps:
        w("    {0x%05X, %d, %d}," % (cp, off, n))
    w("};")
    w("")
    w("static const uint32_t uni_decomp_pool[%d] = {" % len(pool))
    for i in range(0, len(pool), 8):
        w("    " + " ".join("0x%05X," % c for c in pool[i:i + 8]))
    w("};")
    w("")
    w("/* (first, second) -> primary composite, sorted by (first, second) */")
    w("static const UniComp uni_comps[%d] = {" % len(comps))
    for a, b, c in comps:
        w("    {0x%05X, 0x%05X, 0x%05X}," % (a, b, c))
    w("};")
    w("")
    w("#endif")
    with open(OUT, "w", encoding="utf-8") as f:
        f.write("\n".join(out) + "\n")
    print("%s: Unicode %s, %d flag ranges, %d ccc ranges, %d decompositions (pool %d), %d compositions"
          % (OUT, version, len(flag_ranges), len(ccc_ranges), len(decomps), len(pool), len(comps)))


if __name__ == "__main__":
    main()
