#!/bin/sh
# bench_spec.sh: decode speed of MTP speculative decoding, -spec 0..4, as a
# markdown table per model, from the `stats:` line ./run prints.
#
#   tools/bench_spec.sh [MODEL_DIR ...]       (run from the repo root)
#
# Default models: models/qwen3-kjv-mtp (the shipped model, when present: the
# gain side, with a trained MTP head) and bench/qwen3-0.6b-mtp (a random
# 0.6B-shaped model from `make bench`: its MTP head drafts ~never get
# accepted, so this measures what drafting and verifying cost). Each run is
# greedy (-t 0) with the tbq4 KV cache, 128 generated tokens (fewer if the
# model emits end-of-text), `-spec 0` being plain decoding; rounds run every
# setting once each, and each setting's best decode tok/s is reported: a
# run of 128 tokens on the small model lasts a twentieth of a second, and
# other load on the machine shows in single runs, so models under 100 MB
# get SMALL_REPS rounds (default 9), larger ones REPS (default 3).
# RUN_BIN picks the binary (default build/run), THREADS the thread count
# (default: all cores).
set -eu
RUN=${RUN_BIN:-build/run}
THREADS=${THREADS:-$(nproc)}
REPS=${REPS:-3}
SMALL_REPS=${SMALL_REPS:-9}
PROMPT="In the beginning God created the heaven and the earth. And the earth was without form, and void;"
[ $# -gt 0 ] || set -- models/qwen3-kjv-mtp bench/qwen3-0.6b-mtp
# field NAME: the value of NAME=... in $stats (spec_accept only appears when drafting is on)
field() { echo "$stats" | tr ' ' '\n' | sed -n "s/^$1=//p"; }
for dir in "$@"; do
    if [ ! -d "$dir" ]; then
        echo "(no $dir: skipped)"
        echo
        continue
    fi
    # the checkpoint's size in MB decides the number of rounds
    mb=$(du -mc "$dir"/*.safetensors | tail -1 | cut -f1)
    reps=$REPS
    [ "$mb" -ge 100 ] || reps=$SMALL_REPS
    echo "## Speculative decoding with the MTP head: $dir"
    echo
    echo "greedy, -kv tbq4, -n 128, $THREADS threads, best of $reps runs"
    echo
    echo "| -spec | decoded tokens | decode tok/s | vs -spec 0 | draft acceptance |"
    echo "|---:|---:|---:|---:|---:|"
    # rounds over all settings, so that a slow spell on the machine hits
    # every -spec value rather than one; best_N / stats_N keep each one's best
    for n in 0 1 2 3 4; do eval "best_$n=0 stats_$n="; done
    for r in $(seq "$reps"); do
        for n in 0 1 2 3 4; do
            stats=$("$RUN" "$dir" -i "$PROMPT" -n 128 -t 0 -kv tbq4 -T "$THREADS" -spec "$n" 2>&1 >/dev/null |
                grep '^stats:') || continue
            t=$(field decode_tps)
            eval "b=\$best_$n"
            if awk -v a="$t" -v b="$b" 'BEGIN { exit !(a > b) }'; then eval "best_$n=\$t stats_$n=\$stats"; fi
        done
    done
    base=
    for n in 0 1 2 3 4; do
        eval "tps=\$best_$n stats=\$stats_$n"
        [ -n "$stats" ] || { echo "| $n | run failed | | | |"; continue; }
        base=${base:-$tps}
        acc=$(field spec_accept)
        echo "| $n | $(field decode_tokens) | $tps | $(awk -v a="$tps" -v b="$base" 'BEGIN { if (b > 0) printf "%.2fx", a / b; else printf "-" }') | ${acc:--} |"
    done
    echo
done
