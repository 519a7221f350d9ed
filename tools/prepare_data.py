#!/usr/bin/env python3
"""prepare_data.py: the King James Bible as clean plain text, split into a
training set and a fixed held-out set, and tokenized with `run` itself.

Source: the Debian packages `bible-kjv-text` (the compressed KJV text, public
domain) and `bible-kjv` (the `bible` program that decompresses it):

    apt-get install -y bible-kjv bible-kjv-text

`bible -f gen1:1-rev22:21` prints one verse per line, each preceded by its
reference ("Ge1:1 In the beginning God created ..."). Cleaning:
  * the reference is stripped; the verse text is kept as is (it is already
    plain ASCII: letters, punctuation, a few parentheses; no markup);
  * each verse becomes one line; chapters are separated by one blank line;
    no book or chapter headings are emitted.

Split (fixed, no randomness): the 1,189 chapters are numbered 0..1188 in canon
order; chapter c is held out when c % 50 == 25 (24 chapters spread over the
whole Bible, about 2% of the text, starting with Genesis 26). Training never
sees them.

Outputs:
  tools/data/heldout.txt        the held-out chapters (committed: it is small and
                                is the text the shipped model's quality is
                                measured on; this script rewrites it identically)
  OUT/train.txt                 the training chapters (regenerated, not committed)
  OUT/train.ids, OUT/heldout.ids  token ids, one line, space separated, from
                                `./run TOKDIR -m tokenize -f FILE`
OUT defaults to build/kjv (ignored by git; `make clean` removes it).

Usage (from the repo root, after `make`):
    /usr/bin/python3 tools/prepare_data.py [--out build/kjv] [--run ./run]
"""
import argparse
import os
import re
import subprocess
import sys

HELDOUT_EVERY, HELDOUT_AT = 50, 25
REF = re.compile(r"^([1-3]?[A-Za-z]+)(\d+):(\d+) (.*)$")
TOKDIR = "tests/data/fixtures/tiny"  # the reduced Qwen3 tokenizer the model ships with


def read_verses():
    """(book, chapter, verse, text) for every verse, in canon order."""
    out = subprocess.run(["bible", "-f", "gen1:1-rev22:21"], stdin=subprocess.DEVNULL,
                         capture_output=True, text=True, check=True).stdout
    verses = []
    for line in out.splitlines():
        if not line.strip():
            continue
        m = REF.match(line)
        if not m:
            sys.exit(f"prepare_data: unexpected line from bible: {line!r}")
        text = " ".join(m.group(4).split())
        verses.append((m.group(1), int(m.group(2)), int(m.group(3)), text))
    return verses


def chapters(verses):
    """Groups verses into chapters: a list of (name, [verse texts])."""
    chs, key = [], None
    for book, ch, _, text in verses:
        if (book, ch) != key:
            key = (book, ch)
            chs.append((f"{book}{ch}", []))
        chs[-1][1].append(text)
    return chs


def tokenize(run, path):
    out = subprocess.run([run, TOKDIR, "-m", "tokenize", "-f", path], capture_output=True, text=True, check=True)
    ids = out.stdout.split()
    return ids


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="build/kjv")
    ap.add_argument("--heldout", default="tools/data/heldout.txt")
    ap.add_argument("--run", default="./run")
    args = ap.parse_args()

    verses = read_verses()
    chs = chapters(verses)
    if len(verses) != 31102 or len(chs) != 1189:
        sys.exit(f"prepare_data: expected 31102 verses in 1189 chapters, found {len(verses)} in {len(chs)}")
    train, held, held_names = [], [], []
    for c, (name, texts) in enumerate(chs):
        block = "\n".join(texts) + "\n"
        if c % HELDOUT_EVERY == HELDOUT_AT:
            held.append(block)
            held_names.append(name)
        else:
            train.append(block)
    os.makedirs(args.out, exist_ok=True)
    os.makedirs(os.path.dirname(args.heldout), exist_ok=True)
    files = {os.path.join(args.out, "train.txt"): "\n".join(train), args.heldout: "\n".join(held)}
    for path, text in files.items():
        with open(path, "w", encoding="ascii", newline="\n") as f:
            f.write(text)
    for name, path in (("train", os.path.join(args.out, "train.txt")), ("heldout", args.heldout)):
        ids = tokenize(args.run, path)
        with open(os.path.join(args.out, f"{name}.ids"), "w") as f:
            f.write(" ".join(ids) + "\n")
        print(f"{name}: {os.path.getsize(path)} bytes, {len(ids)} tokens -> {path}")
    print(f"held-out chapters ({len(held_names)}): {' '.join(held_names)}")


if __name__ == "__main__":
    main()
