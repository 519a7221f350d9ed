#!/bin/sh
# bench_serve.sh: what continuous batching buys. Starts ./run MODEL -m serve
# with -np N and sends N streams at once (greedy, the same prompt, -n tokens
# each), for N in CLIENTS; prints the aggregate generated tokens per second
# (usage counts over wall time) and each stream's own rate.
#   sh tools/bench_serve.sh MODEL [tokens] [clients] [extra server options]
#   sh tools/bench_serve.sh bench/qwen3-0.6b 64 "1 2 4 8" "-T 2 -kv tbq4"
# Needs curl. The model's own -c bounds each stream (the random-weight
# bench models of make bench accept any text).
set -eu
model=$1
tokens=${2:-64}
clients=${3:-"1 2 4 8"}
extra=${4:-}
run=${RUN_BIN:-./run}
tmp=$(mktemp -d)
pid=
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$tmp"' EXIT INT TERM
echo "model $model, $tokens tokens a stream, server options: -np N $extra"
echo "clients  aggregate tok/s  per stream tok/s  wall s"
for n in $clients; do
    # shellcheck disable=SC2086
    $run "$model" -m serve --port 0 -np "$n" $extra 2>"$tmp/err" &
    pid=$!
    port=
    for _ in $(seq 600); do
        port=$(sed -n 's/.*listening on http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$tmp/err")
        [ -n "$port" ] && break
        sleep 0.1
    done
    [ -n "$port" ] || { cat "$tmp/err"; exit 1; }
    body="{\"prompt\":\"In the beginning God created the heaven and the earth.\",\"max_tokens\":$tokens,\"temperature\":0}"
    # one warm-up request, so that page faults and thread start-up do not count
    curl -s "http://127.0.0.1:$port/v1/completions" -d "$body" >/dev/null
    t0=$(date +%s.%N)
    pids=
    for i in $(seq "$n"); do
        curl -s "http://127.0.0.1:$port/v1/completions" -d "$body" >"$tmp/out$i" &
        pids="$pids $!"
    done
    # shellcheck disable=SC2086
    wait $pids
    t1=$(date +%s.%N)
    total=0
    for i in $(seq "$n"); do
        c=$(sed -n 's/.*"completion_tokens":\([0-9]*\).*/\1/p' "$tmp/out$i")
        total=$((total + ${c:-0}))
    done
    awk -v n="$n" -v t="$total" -v a="$t0" -v b="$t1" \
        'BEGIN { w = b - a; printf "%7d  %15.1f  %16.1f  %6.2f\n", n, t / w, t / w / n, w }'
    kill "$pid"
    wait "$pid" 2>/dev/null || true
    pid=
done
