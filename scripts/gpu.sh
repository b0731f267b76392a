#!/usr/bin/env bash
# On a machine with an NVIDIA GPU and CUDA 12 or 13 (driver, NVRTC, cuBLAS): the GPU test suite
# (the generated CUDA kernels and cuBLAS, compiled by NVRTC, run in isolated workers and
# checked against the reference for every T in 1..=128 and past it; ignored by a plain
# `cargo test`), the same kernels under CPU emulation, then the GPU benchmark: joint
# tuning of dense, batch_matmul_nt and batch_matmul_nn over T in 1..128, every T through
# the dispatcher against cuBLAS, and the Fig. 5 case. Reports go to
# benchmarks/results/gpu-*/ (report.md, results.csv, records.jsonl).
# Without a GPU it fails, saying why. `scripts/gpu.sh test` runs the tests only.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cargo test --release -p anyshape --test gpu -- --include-ignored --nocapture
cargo test --release -p anyshape-measure --test cuda_emulated -- --nocapture
[ "${1:-}" = test ] && exit 0
cargo build --release -p anyshape
trials=${ANYSHAPE_GPU_TRIALS:-256}
for spec in "dense:dense(M=16*T,N=2304,K=768)" \
            "bmm_nt:batch_matmul_nt(B=192,M=T,N=T,K=64)" \
            "bmm_nn:batch_matmul_nn(B=192,M=T,N=64,K=T)"; do
  name=${spec%%:*}
  out=benchmarks/results/gpu-$name
  mkdir -p "$out"
  target/release/anyshape gpu -w "${spec#*:}" --range T=1..128 --trials "$trials" \
    --records "$out/records.jsonl" --out-dir "$out" --resume --quiet 2>&1 | tee "$out/run.log"
done
