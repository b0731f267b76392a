#!/bin/bash
# The issue-5 comparison, from scratch, as run for benchmarks/results/compare-*:
# joint tuning of each workload (512 trials, measured votes), then `bench --compare`
# against the vendor libraries, per-shape, Nimble-style and bucketing (3 rounds), then
# `bench --dispatch-loss`. A fresh kernel
# cache, so every tuning time includes every compile. ~90 minutes on 2 cores.
# Usage: benchmarks/results/run-compare.sh [WORK_DIR [WORKLOAD...]]   (from the repository
# root; WORKLOAD is dense, bmm_nt or bmm_nn, all three by default: ~30 minutes each)
set -u
A=${ANYSHAPE:-$PWD/target/release/anyshape}
W=${1:-/tmp/anyshape-compare}
mkdir -p "$W" && cd "$W" || exit 1
export ANYSHAPE_CACHE=$W/cache
S="--samples T=5,24,43,62,81,100,119,128 --per-shape-trials 64 --bucket 16 --seconds 0.1"
W_dense="dense(M=16*T,N=2304,K=768)"
W_bmm_nt="batch_matmul_nt(B=192,M=T,N=T,K=64)"
W_bmm_nn="batch_matmul_nn(B=192,M=T,N=64,K=T)"
names=(dense bmm_nt bmm_nn)
[ $# -gt 1 ] && names=("${@:2}")
for n in "${names[@]}"; do
  case $n in dense | bmm_nt | bmm_nn) ;; *) echo "error: unknown workload $n (dense, bmm_nt, bmm_nn)" >&2; exit 2 ;; esac
  v=W_$n; w=${!v}
  echo "=== $n tune $(date +%T)"
  $A tune -w "$w" --range T=1..128 --trials 512 --records $n.jsonl --resume --out $n.module --quiet > $n-tune.log 2>&1
  echo "=== $n compare $(date +%T)"
  $A bench --module $n.module --compare $S --out-dir results/compare-$n --quiet > $n-compare.log 2>&1
  echo "=== $n dispatch loss $(date +%T)"
  $A bench --module $n.module --dispatch-loss --seconds 0.1 --csv results/compare-$n/dispatch-loss.csv \
    > results/compare-$n/dispatch-loss.log 2>&1
done
echo "=== finished $(date +%T)"
