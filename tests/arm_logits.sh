#!/bin/sh
# arm_logits.sh: every KV scheme's logits on another CPU (aarch64 under
# emulation) against this machine's, on the shipped model (docs/arm.md).
#
#   sh tests/arm_logits.sh NATIVE_RUN 'EMULATED_RUN' OUTDIR [SCHEMES]
#
# NATIVE_RUN is this machine's ./run, EMULATED_RUN the command that runs
# the other build (e.g. "timeout -s KILL 600 qemu-aarch64 build-aarch64/run").
# For each scheme, the logits of a held-out passage (-m logits):
#   - with the plain C kernels on both sides (RUN_ISA=ref), must be the
#     same bits: the same C arithmetic on both machines;
#   - with the default kernels on both sides (NEON there, AVX2 or AVX-512
#     here), must be within TOL (default 2e-4) times the largest |logit|
#     of each other, since their SIMD sums round differently, or
#     TOL_INT (2e-2) for the schemes in INT_SCHEMES (q8 q4 q4h tbq4 tbq3
#     tbq2 polar4 lm3: on AVX-512 VNNI, with VBMI for tbq3, tbq2 and lm3,
#     their scores are integer dot products over queries rounded to 8 bits,
#     lm3's to 14; on aarch64's dotprod level and x86's avx2 q8, q4, q4h, tbq4
#     and polar4 score the same way), and pick the same top token at no fewer than MIN_TOP1
#     (0.95) of the positions.
# Prints one line per scheme; exits 1 if any scheme fails.
set -u
native=$1 emu=$2 out=$3
schemes=${4:-"f32 f16 q8 q4 q4h tbq4 tbq3 tbq2 polar4 lm3 kivi2 kivi4"}
min_top1=${MIN_TOP1:-0.95} vocab=${VOCAB:-4160} int_schemes=${INT_SCHEMES:-"q8 q4 q4h tbq4 tbq3 tbq2 polar4 lm3"}
model=models/qwen3-kjv-mtp
mkdir -p "$out"
prompt=$out/logits-prompt.txt
head -c 160 tools/data/heldout.txt > "$prompt"
fail=0
for s in $schemes; do
    a=$out/logits-$s-aarch64.f32 ar=$out/logits-$s-aarch64-ref.f32 r=$out/logits-$s-ref.f32 n=$out/logits-$s-native.f32
    if ! $emu $model -m logits -f "$prompt" -kv "$s" -o "$a" 2>"$out/logits-$s.err" ||
        ! RUN_ISA=ref $emu $model -m logits -f "$prompt" -kv "$s" -o "$ar" 2>>"$out/logits-$s.err"; then
        echo "$s: the emulated run failed: $(tail -n 3 "$out/logits-$s.err")"
        fail=1
        continue
    fi
    RUN_ISA=ref $native $model -m logits -f "$prompt" -kv "$s" -o "$r" 2>/dev/null &&
        $native $model -m logits -f "$prompt" -kv "$s" -o "$n" 2>/dev/null || { echo "$s: native run failed"; fail=1; continue; }
    if cmp -s "$ar" "$r"; then same=yes; else same=no; fail=1; fi
    tol=${TOL:-2e-4}
    case " $int_schemes " in *" $s "*) tol=${TOL_INT:-2e-2} ;; esac
    # one float a line, side by side: largest difference, largest magnitude,
    # and the rows (positions) whose first largest entry agrees
    od -An -v -w4 -f "$a" > "$out/a.txt" && od -An -v -w4 -f "$n" > "$out/n.txt"
    verdict=$(paste "$out/a.txt" "$out/n.txt" | awk -v V="$vocab" -v tol="$tol" -v mt="$min_top1" '
        { d = $1 - $2; if (d < 0) d = -d; if (d > dmax) dmax = d
          m = $1 < 0 ? -$1 : $1; if (m > scale) scale = m
          j = (NR - 1) % V
          if (j == 0 || $1 > ba) { ba = $1; ia = j }
          if (j == 0 || $2 > bn) { bn = $2; in_ = j }
          if (j == V - 1) { rows++; agree += ia == in_ } }
        END { ok = rows > 0 && dmax <= tol * scale && agree >= mt * rows
              printf "%s max|diff| %.3g of max|logit| %.3g (tolerance %g of it), top-1 %d/%d", ok ? "ok" : "FAIL",
                     dmax, scale, tol, agree, rows }')
    case $verdict in ok*) ;; *) fail=1 ;; esac
    echo "$s: plain C, same bits as here: $same; SIMD vs SIMD here: $verdict"
done
rm -f "$out/a.txt" "$out/n.txt"
exit $fail
