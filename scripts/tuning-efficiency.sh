#!/usr/bin/env bash
# Tuning efficiency (FamilySeer Fig. 7): a full-size model compiled twice with the same
# budget, each with a kernel cache of its own (so neither finds the other's builds):
# independent per-task tuning with equal shares (--equal-shares --no-families) into
# benchmarks/results/<model>/trials<N>-independent/, then the task scheduler with
# families (the default) by scripts/bench-model.sh into .../trials<N>/ (which also races
# it against onnxruntime and tract); then `anyshape bench --tuning-against` compares the
# two tuning curves into .../tuning<N>/ (tuning.md, tuning.csv, tuning-curve.svg); each
# compile's tuning log is kept as tuning.json beside its reports.
# Usage: scripts/tuning-efficiency.sh [bert_base.ts | gpt2_small.ts | ...]
# ANYSHAPE_MODEL_TRIALS (default 64) trials per task; ANYSHAPE_MODEL_DIMS,
# ANYSHAPE_BENCH_DIMS, ANYSHAPE_TUNE_VALUES and ANYSHAPE_PYTHON as for bench-model.sh.
# Both compiles resume from their records: delete the two result directories first for
# fresh figures.
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:-bert_base.ts}
scripts/setup.sh
[ -f "models/full/$model.onnx" ] || scripts/export-models.sh "${model%%.*}"
cargo build --release -p anyshape --features tract
bin=target/release/anyshape
export ANYSHAPE_MODEL_TRIALS=${ANYSHAPE_MODEL_TRIALS:-64}
trials=$ANYSHAPE_MODEL_TRIALS
results=benchmarks/results/$model
ind=$results/trials$trials-independent
mkdir -p "$ind"
dims=()
for d in ${ANYSHAPE_MODEL_DIMS:-batch=1 sequence=1..512}; do dims+=(--dim "$d"); done
extra=()
[ -n "${ANYSHAPE_TUNE_VALUES:-}" ] && extra+=(--tune-values "$ANYSHAPE_TUNE_VALUES")
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
ANYSHAPE_CACHE="$scratch/cache-independent" $bin compile "models/full/$model.onnx" "${dims[@]}" \
  --trials "$trials" "${extra[@]}" --equal-shares --no-families --records "$ind/records" \
  --resume --out "$ind/model.module" 2>&1 | tee "$ind/compile.log"
cp "$ind/model.module/tuning.json" "$ind/"
ANYSHAPE_CACHE="$scratch/cache-families" scripts/bench-model.sh "$model"
$bin bench --model "$results/trials$trials/model.module" --tuning-against "$ind/model.module" \
  --out-dir "$results/tuning$trials"
