#!/usr/bin/env bash
# The hot path in about a minute: a handful of contraction shapes (small, mid and large
# M of the operator benchmarks, and a model's packed weights) run through `anyshape run`
# with the sketch's default micro-kernel (or ANYSHAPE_HOT_MK), symbolic kernels, checked
# against the reference once; each shape's best of ANYSHAPE_HOT_ROUNDS (default 3)
# rounds, as GFLOP/s and % of the FMA peak measured first in the same run.
# With another build's binary as $1 (e.g. a copy of target/release/anyshape from before
# a change), both run interleaved round by round and the ratio this/other is printed:
# an A/B of a kernel change on a noisy machine.
# Usage: scripts/hot-path.sh [OTHER_ANYSHAPE_BINARY]
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p anyshape >&2
this=target/release/anyshape
other=${1:-}
[ -z "$other" ] || [ -x "$other" ] || { echo "error: $other is not an executable" >&2; exit 2; }
rounds=${ANYSHAPE_HOT_ROUNDS:-3}
mk=()
[ -n "${ANYSHAPE_HOT_MK:-}" ] && mk=(--micro-kernel "$ANYSHAPE_HOT_MK")
shapes=(
  "dense(M=16,N=2304,K=768)"
  "dense(M=1024,N=2304,K=768)"
  "batch_matmul_nt(B=192,M=1,N=1,K=64)"
  "batch_matmul_nt(B=192,M=64,N=64,K=64)"
  "batch_matmul_nn(B=192,M=64,N=64,K=64)"
  "dense_packed(M=8,N=3072,K=768,P=16)+bias+gelu"
  "dense_packed(M=128,N=3072,K=768,P=16)+bias+gelu"
)
peak=$($this peak | awk '/thread\(s\)/ {p = $(NF-1)} END {print p}')
echo "machine: $(lscpu | sed -n 's/^Model name: *//p' | head -1), FMA peak measured now: $peak GFLOP/s"
gflops() { # binary workload -> GFLOP/s at the minimum latency
  "$1" run -w "$2" --mode symbolic --seconds 0.2 "${mk[@]}" |
    awk '/^throughput/ {print $2}'
}
for w in "${shapes[@]}"; do
  "$this" run -w "$w" --mode symbolic --seconds 0.01 --check "${mk[@]}" | grep -q "^check *ok" ||
    { echo "error: $w does not match the reference" >&2; exit 1; }
done
printf '%-50s %10s %7s' workload GFLOP/s "% peak"
[ -n "$other" ] && printf ' %10s %8s' "other" "ratio"
echo
for w in "${shapes[@]}"; do
  a=0 b=0
  for _ in $(seq "$rounds"); do
    a=$(echo "$a $(gflops "$this" "$w")" | awk '{print ($2 > $1) ? $2 : $1}')
    [ -n "$other" ] && b=$(echo "$b $(gflops "$other" "$w")" | awk '{print ($2 > $1) ? $2 : $1}')
  done
  printf '%-50s %10.1f %6.1f%%' "$w" "$a" "$(echo "$a $peak" | awk '{print 100 * $1 / $2}')"
  [ -n "$other" ] && printf ' %10.1f %7.3fx' "$b" "$(echo "$a $b" | awk '{print $1 / $2}')"
  echo
done
