#!/usr/bin/env bash
# A full-size model end to end against its peers: exported with PyTorch (once, by
# scripts/export-models.sh), compiled (default: sequence 1..512 at batch 1), then raced in one
# run against onnxruntime, OpenVINO (FP32 and its default precision; 2 threads) and tract
# at sequence 1, 8, ..., 512.
# Usage: scripts/bench-model.sh [bert_base.ts | bert_base.dynamo | gpt2_small.ts | ...]
# ANYSHAPE_MODEL_TRIALS (default 0: default micro-kernels) sets the tuning trials per
# task (results in benchmarks/results/<model>/trials<N>/);
# ANYSHAPE_MODEL_DIMS sets the compiled domain (default "batch=1 sequence=1..512"),
# ANYSHAPE_BENCH_DIMS the raced instances (default "batch=1
# sequence=1,8,16,32,64,128,256,384,512"), ANYSHAPE_TUNE_VALUES compile's --tune-values;
# ANYSHAPE_MODEL_EQUAL=1 gives every task the same trials instead of scheduling them
# (results in .../trials<N>-equal/); ANYSHAPE_PYTHON the Python with onnxruntime and
# openvino (default: the project's .venv, where scripts/venv.sh installs them).
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:-bert_base.ts}
scripts/setup.sh
[ -f "models/full/$model.onnx" ] || scripts/export-models.sh "${model%%.*}"
cargo build --release -p anyshape --features tract
bin=target/release/anyshape
trials=${ANYSHAPE_MODEL_TRIALS:-0}
extra=()
out=benchmarks/results/$model/trials$trials
if [ -n "${ANYSHAPE_MODEL_EQUAL:-}" ]; then extra=(--equal-shares); out=$out-equal; fi
mkdir -p "$out"
if [ -n "${ANYSHAPE_PYTHON:-}" ]; then
  python=$ANYSHAPE_PYTHON
else
  scripts/venv.sh numpy onnxruntime openvino
  python=.venv/bin/python
fi
start=$(date +%s.%N)
dims=()
for d in ${ANYSHAPE_MODEL_DIMS:-batch=1 sequence=1..512}; do dims+=(--dim "$d"); done
bench_dims=()
for d in ${ANYSHAPE_BENCH_DIMS:-batch=1 sequence=1,8,16,32,64,128,256,384,512}; do
  bench_dims+=(--dim "$d")
done
[ -n "${ANYSHAPE_TUNE_VALUES:-}" ] && extra+=(--tune-values "$ANYSHAPE_TUNE_VALUES")
$bin compile "models/full/$model.onnx" "${dims[@]}" --trials "$trials" "${extra[@]}" \
  --records "$out/records" --resume --out "$out/model.module" 2>&1 | tee "$out/compile.log"
end=$(date +%s.%N)
# The tuning log (the model's expected latency after each slice against tuning time,
# where the time went, the families' model quality), kept beside the reports.
if [ -f "$out/model.module/tuning.json" ]; then cp "$out/model.module/tuning.json" "$out/"; fi
{
  echo "compile: $(echo "$end - $start" | bc) s (--trials $trials)"
  echo "module size: $(du -sh "$out/model.module" | cut -f1) (of which the plan: $(du -sh "$out/model.module/plan.bin" | cut -f1))"
} | tee "$out/compile-summary.txt"
$bin bench --model "$out/model.module" --compare --python "$python" --threads 2 \
  "${bench_dims[@]}" --rounds 5 --seconds 0.2 \
  --out-dir "$out"
