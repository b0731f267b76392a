#!/usr/bin/env bash
# The work queue's cost on one machine: the same tune (search, votes, module) run
# locally and then through a Redis server on loopback with one `anyshape worker`, each
# from an empty kernel cache and no tuning database; prints trials per hour of both and
# the queue's overhead per job (the client's wait beyond the worker's building and
# measuring). Results in benchmarks/results/queue/ (both logs and a summary).
# ANYSHAPE_QUEUE_WORKLOAD, ANYSHAPE_QUEUE_RANGE and ANYSHAPE_QUEUE_TRIALS change the tune.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cargo build --release -p anyshape
bin=$PWD/target/release/anyshape
workload=${ANYSHAPE_QUEUE_WORKLOAD:-dense(M=16*T,N=768,K=768)+bias+gelu}
range=${ANYSHAPE_QUEUE_RANGE:-T=1..32}
trials=${ANYSHAPE_QUEUE_TRIALS:-96}
out=benchmarks/results/queue
run=$(mktemp -d)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --dir "$run" >/dev/null &
server=$!
worker=
trap 'kill $server ${worker:-} 2>/dev/null; rm -rf "$run"' EXIT
url=redis://127.0.0.1:$port
mkdir -p "$out"
tune() { # name, extra args...
  local name=$1; shift
  "$bin" tune -w "$workload" --range "$range" --trials "$trials" --quiet --no-db \
    --records "$run/$name.jsonl" --cache-dir "$run/$name-cache" --out "$run/$name.module" "$@" \
    > "$run/$name.log" 2>&1
  sed "s#$run/#<run dir>/#g" "$run/$name.log" > "$out/$name.log"
}
tune local
"$bin" worker --queue "$url" --name worker --cache-dir "$run/worker-cache" 2> "$run/worker.log" &
worker=$!
tune queue --queue "$url"
rate() { # log -> trials per hour
  sed -n 's/^trials \([0-9]*\) .*wall \([0-9.]*\) s.*/\1 \2/p' "$1" | awk '{printf "%.0f trials per hour (%d trials in %.1f s)", $1 / $2 * 3600, $1, $2}'
}
{
  echo "# The work queue on one machine: $(date -u +%Y-%m-%d)"
  echo
  echo "Machine: $("$bin" target | sed -n 's/.*"name": "\(.*\)".*/\1/p'), $(nproc) cores. Tune: \`$workload\` over $range, --trials $trials, each from an empty kernel cache, no tuning database, one after the other."
  echo
  echo "- local: $(rate "$run/local.log")"
  echo "- through Redis on loopback, one worker: $(rate "$run/queue.log")"
  echo "- $(grep '^work queue' "$run/queue.log" | sed "s#$url#(loopback)#")"
} | tee "$out/README.md"
