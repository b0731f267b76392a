#!/usr/bin/env bash
# On a machine with an NVIDIA GPU and CUDA 12 or 13 (driver, NVRTC, cuBLAS): the GPU test
# suite (the generated CUDA kernels and cuBLAS, compiled by NVRTC, run in isolated
# workers and checked against the reference for every T in 1..=128 and past it; ignored
# by a plain `cargo test`), the same kernels under CPU emulation, then the GPU benchmark:
# joint tuning of dense, batch_matmul_nt and batch_matmul_nn over T in 1..128, every T
# through the dispatcher against cuBLAS, and the Fig. 5 case. Reports go to
# benchmarks/results/gpu-*/ (report.md, results.csv, records.jsonl, run.log).
# Without a GPU it fails, saying why. `scripts/gpu.sh test` runs the tests only,
# `scripts/gpu.sh bench` the benchmark only.
#
# A GPU machine without Rust: build here (`scripts/gpu.sh build DIR` puts the stripped
# `anyshape` and the GPU test there), copy DIR over, and run there with
# ANYSHAPE_GPU_BIN=DIR (the emulation test is skipped). ANYSHAPE_GPU_TRIALS (256) sets
# the trials, ANYSHAPE_GPU_OUT (benchmarks/results) where the reports go.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = build ]; then
  dir=${2:?usage: scripts/gpu.sh build DIR}
  mkdir -p "$dir"
  cargo build --release -p anyshape
  test=$(cargo test --release -p anyshape --test gpu --no-run --message-format=json \
    | sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -1)
  strip -o "$dir/anyshape" target/release/anyshape
  strip -o "$dir/gpu-test" "$test"
  exit 0
fi
bin=${ANYSHAPE_GPU_BIN:-}
if [ -z "$bin" ]; then
  scripts/setup.sh
  if [ "${1:-}" != bench ]; then
    cargo test --release -p anyshape --test gpu -- --include-ignored --nocapture
    cargo test --release -p anyshape-measure --test cuda_emulated -- --nocapture
  fi
  cargo build --release -p anyshape
  anyshape=target/release/anyshape
else
  bin=$(realpath "$bin")
  anyshape=$bin/anyshape
  if [ "${1:-}" != bench ]; then
    ANYSHAPE_WORKER=$anyshape "$bin/gpu-test" --include-ignored --nocapture
  fi
fi
[ "${1:-}" = test ] && exit 0
trials=${ANYSHAPE_GPU_TRIALS:-256}
results=${ANYSHAPE_GPU_OUT:-benchmarks/results}
for spec in "dense:dense(M=16*T,N=2304,K=768)" \
            "bmm_nt:batch_matmul_nt(B=192,M=T,N=T,K=64)" \
            "bmm_nn:batch_matmul_nn(B=192,M=T,N=64,K=T)"; do
  name=${spec%%:*}
  out=$results/gpu-$name
  mkdir -p "$out"
  "$anyshape" gpu -w "${spec#*:}" --range T=1..128 --trials "$trials" \
    --records "$out/records.jsonl" --out-dir "$out" --resume --quiet 2>&1 | tee "$out/run.log"
done
