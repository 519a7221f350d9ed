#!/bin/sh
# run.sh: a bounded libFuzzer run of every harness in $FUZZ_BUILD (default
# build-fuzz, made by `make fuzz`); `make fuzz-run` and .ci/run call it.
#
# Data flow: tests/fuzz/corpus/<harness>/ (in git, read only here) seeds
# each run; the inputs a run finds go to a scratch directory that is deleted
# at the end, so CI never writes into the git corpus. Each harness runs for
# $FUZZ_SECONDS (default 60), $FUZZ_JOBS at a time (default: the number of
# cores), under the sanitizers it was built with. Any crash, leak, timeout
# (10 s an input), memory blow-up (2 GB) or failed property stops that
# harness; its input is kept in $FUZZ_BUILD/artifacts/<harness>/ (copy it
# into the corpus as regress-<what> once understood) and the script exits 1.
# Logs: $FUZZ_BUILD/logs/<harness>.log.
set -eu
cd "$(dirname "$0")/../.."
build=${FUZZ_BUILD:-build-fuzz}
secs=${FUZZ_SECONDS:-60}
jobs=${FUZZ_JOBS:-$(nproc)}
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT INT TERM
mkdir -p "$build/logs"
# UBSan aborts (built with -fno-sanitize-recover); print where it happened
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1}

# one harness: $1 its binary; exit status 0 when it found nothing
run_one() {
    name=$(basename "$1")
    art="$build/artifacts/$name"
    rm -rf "$art" # what is there is from this run only
    mkdir -p "$scratch/$name" "$art"
    dict=tests/fuzz/$name.dict
    [ -f "$dict" ] && dict="-dict=$dict" || dict=
    # the first directory receives new inputs; the git corpus only seeds.
    # TMPDIR: files a harness writes (fuzz_safetensors) go where the trap cleans
    TMPDIR="$scratch" "$1" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
        -artifact_prefix="$art/" $dict "$scratch/$name" "tests/fuzz/corpus/$name" \
        >"$build/logs/$name.log" 2>&1
}

bins=$(ls "$build"/fuzz_* 2>/dev/null || true)
[ -n "$bins" ] || { echo "run.sh: no harnesses in $build (make fuzz)" >&2; exit 1; }
failed=
running=0
pids=
for bin in $bins; do
    run_one "$bin" &
    pids="$pids $!:$(basename "$bin")"
    running=$((running + 1))
    [ "$running" -lt "$jobs" ] && continue
    # a full batch: wait for all of it before starting the next
    for p in $pids; do wait "${p%%:*}" || failed="$failed ${p#*:}"; done
    pids=
    running=0
done
for p in $pids; do wait "${p%%:*}" || failed="$failed ${p#*:}"; done

# one summary line per harness: inputs run, coverage and corpus at the
# end (libFuzzer's last status line), average speed
for bin in $bins; do
    name=$(basename "$bin")
    log="$build/logs/$name.log"
    grep -qE '^#[0-9]+' "$log" || { printf '%-24s stopped before its first status line\n' "$name"; continue; }
    grep -E '^#[0-9]+' "$log" | tail -n 1 | awk -v name="$name" \
        -v speed="$(grep average_exec_per_sec "$log" | awk '{print $2}')" \
        '{ for (i = 1; i < NF; i++) f[$i] = $(i + 1)
           printf "%-24s runs: %-9s cov: %-5s ft: %-5s corp: %-14s exec/s: %s\n", name, substr($1, 2),
                  f["cov:"], f["ft:"], f["corp:"], speed }'
done
if [ -n "$failed" ]; then
    for name in $failed; do
        echo "== $name failed (log: $build/logs/$name.log):" >&2
        # the report's first lines (what and where), then where the input went
        awk '/ERROR:|property failed|runtime error|ALARM|out-of-memory|deadly signal/ { p = 1 }
             p && n < 14 { print; n++ }' "$build/logs/$name.log" >&2
        grep -m 1 'Test unit written' "$build/logs/$name.log" >&2 || true
    done
    exit 1
fi
