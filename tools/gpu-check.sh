#!/bin/sh
# gpu-check.sh: the CUDA path's tests and benchmark on a machine with an
# NVIDIA GPU, in a few minutes, writing its logs to OUT (default gpu-check/).
#
#   make gpu-build                      # here: build-gpu/{run,test_plain,bench_cuda}
#   OUT=dir sh tools/gpu-check.sh       # there: from the repo root
#
# It builds nothing it finds ready in BUILD (default build-gpu): the GPU
# machine may have no Criterion, so the tests run on the plain runner
# (tests/runner), which takes the same test files. If the binaries do not
# start there (other system libraries), it builds them with make first.
# Steps: the device; the CUDA tests (tests/test_cuda.c: every op against
# its CPU twin, the shipped model against golden logits and the CPU's
# greedy tokens); the CLI on the GPU; the benchmark (tools/bench_cuda.c),
# -wmem map's part of it first; with NCU=1, a profile of the decode
# attention (below). The tests, the CLI and the bench stop at 180, 60 a
# command and 60 + 200 seconds.
# Exit status: that of the tests.
OUT=${OUT:-gpu-check}
BUILD=${BUILD:-build-gpu}
mkdir -p "$OUT"
log() { echo "$*" | tee -a "$OUT/summary.txt"; }

nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv > "$OUT/device.txt" 2>&1
log "device: $(tail -n 1 "$OUT/device.txt")"
if ! "$BUILD/run" --version > /dev/null 2>&1 || ! "$BUILD/test_plain" --list > /dev/null 2>&1; then
    log "binaries in $BUILD do not start here: building"
    if ! make -j"$(nproc)" gpu-build GPU_BUILD="$BUILD" CUDA_ARCHS="${CUDA_ARCHS:-90}" > "$OUT/build.txt" 2>&1; then
        log "build failed"
        tail -20 "$OUT/build.txt"
        exit 1
    fi
fi
log "$("$BUILD/run" --version)"

RUN_BIN=$BUILD/run TOOLS_DIR=$BUILD timeout 180 "$BUILD/test_plain" --verbose > "$OUT/tests.txt" 2>&1
rc=$?
log "tests: $(grep Synthesis "$OUT/tests.txt") (exit $rc)"
grep -E "^\[FAIL\]|^\[----\]" "$OUT/tests.txt" | head -40 | tee -a "$OUT/summary.txt"

{
    for dev in cpu cuda; do
        echo "== -dev $dev, greedy, -kv f32, -spec 0 and 3"
        for s in 0 3; do timeout 60 "$BUILD/run" -dev $dev -kv f32 -t 0 -n 64 -spec $s -i "And God said"; done
    done
    echo "== ppl on the held-out text, cpu then cuda (f32 cache)"
    for dev in cpu cuda; do
        timeout 60 "$BUILD/run" -dev $dev -m ppl -kv f32 -f tools/data/heldout.txt 2>&1 | tail -n 3
    done
    echo "== -dev cuda -kv q8, greedy, -spec 0 and 3; sampled (seed 7) on both devices"
    for s in 0 3; do timeout 60 "$BUILD/run" -dev cuda -kv q8 -t 0 -n 64 -spec $s -i "And God said"; done
    for dev in cpu cuda; do timeout 60 "$BUILD/run" -dev $dev -kv f32 -t 0.8 -k 40 -p 0.95 -s 7 -n 64 -i "And God said"; done
    echo "== tbq4, q4h and polar4, greedy, cpu then cuda -spec 0 and 3; ppl cpu then cuda"
    for kv in tbq4 q4h polar4; do
        timeout 60 "$BUILD/run" -dev cpu -kv $kv -t 0 -n 64 -spec 0 -i "And God said"
        for s in 0 3; do timeout 60 "$BUILD/run" -dev cuda -kv $kv -t 0 -n 64 -spec $s -i "And God said"; done
        for dev in cpu cuda; do
            timeout 60 "$BUILD/run" -dev $dev -m ppl -kv $kv -f tools/data/heldout.txt 2>&1 | tail -n 3
        done
    done
    echo "== -wq q8 weights, greedy: cpu, then cuda -spec 0 and 3; ppl cpu then cuda"
    timeout 60 "$BUILD/run" -dev cpu -wq q8 -kv f32 -t 0 -n 64 -spec 0 -i "And God said"
    for s in 0 3; do timeout 60 "$BUILD/run" -dev cuda -wq q8 -kv f32 -t 0 -n 64 -spec $s -i "And God said"; done
    for dev in cpu cuda; do
        timeout 60 "$BUILD/run" -dev $dev -wq q8 -m ppl -kv f32 -f tools/data/heldout.txt 2>&1 | tail -n 3
    done
    echo "== -m kvstats -kv q8 (about 400 tokens), cpu then cuda; -m compare -wq q8, cpu then cuda"
    for dev in cpu cuda; do
        timeout 60 "$BUILD/run" -dev $dev -m kvstats -kv q8 -i "$(head -c 1200 tools/data/heldout.txt)"
    done
    for dev in cpu cuda; do
        timeout 60 "$BUILD/run" -dev $dev -m compare -wq q8 -kv f16,q8,tbq4 -f tools/data/heldout.txt -c 400 -n 8
    done
    echo "== -wmem map against copy (the weights read where the checkpoint is mapped): greedy -spec 0 and 3, ppl"
    for w in copy map; do
        for s in 0 3; do timeout 60 "$BUILD/run" -dev cuda -wmem $w -kv f32 -t 0 -n 64 -spec $s -i "And God said"; done
        timeout 60 "$BUILD/run" -dev cuda -wmem $w -m ppl -kv f32 -f tools/data/heldout.txt 2>&1 | tail -n 3
    done
    echo "== refusals (usage errors: exit 2)"
    timeout 30 "$BUILD/run" -dev cuda -kv kivi2 -n 4; echo "exit $?"
    echo "== auto"
    timeout 60 "$BUILD/run" -n 16 -t 0
} > "$OUT/cli.txt" 2>&1
speeds=$(grep 'device=' "$OUT/cli.txt" | sed 's/.*\(decode_tps=[0-9.]*\).*\(device=[a-z]*\).*/\1 \2/' | tr '\n' ';')
log "cli: $(grep -c '^stats:' "$OUT/cli.txt") stats lines; $speeds"

# -wmem map's decode first (seconds): the whole bench may run into its limit
timeout 60 "$BUILD/bench_cuda" --map > "$OUT/bench-map.txt" 2>&1
log "bench --map: exit $?"
cat "$OUT/bench-map.txt" | tee -a "$OUT/summary.txt"
timeout 200 "$BUILD/bench_cuda" > "$OUT/bench.txt" 2>&1
log "bench: exit $?"
cat "$OUT/bench.txt" | tee -a "$OUT/summary.txt"

# With NCU=1: Nsight Compute's view of one decode attention launch at 128K
# positions of the 0.6B shape, for f16, tbq4 and polar4 (the scheme
# table's fourth context: each kernel instance serves one scheme there,
# and at --steps 1 the first three contexts take 3 x 6 steps x 28 layers
# of its launches).
if [ "${NCU:-0}" = 1 ]; then
    for k in f16:_Z17attn_split_kernelILi128ELi1ELi4E tbq4:_Z17attn_split_kernelILi128ELi5ELi2E \
             polar4:_Z17attn_split_kernelILi128ELi9ELi2E; do
        timeout 120 ncu --clock-control none --kernel-name-base mangled -k "regex:${k#*:}" --launch-skip 504 \
            --launch-count 1 --section SpeedOfLight --section ComputeWorkloadAnalysis \
            --section MemoryWorkloadAnalysis --section WarpStateStats --section InstructionStats \
            --section Occupancy --section LaunchStats --section SchedulerStats \
            "$BUILD/bench_cuda" --shape 0.6b --schemes --steps 1 > "$OUT/ncu-${k%%:*}.txt" 2>&1
        log "ncu ${k%%:*}: exit $?"
    done
fi

exit $rc
