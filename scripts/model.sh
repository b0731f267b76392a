#!/usr/bin/env bash
# The main job: compile a dynamic-shape model that the repository ships (tiny BERT,
# exported by PyTorch, models/) for every sequence length 1..128 — each of its tasks
# tuned briefly over the whole range — then run it on recorded inputs in the range and
# past it (batch 3 is past the batch range), checked against onnxruntime's recorded outputs,
# and race it against onnxruntime and OpenVINO (2 threads; OpenVINO at FP32 and at its
# default precision, BF16 where the CPU has it), installed from PyPI into the project's
# own .venv (scripts/venv.sh), and show how long the module takes to load beside their
# session creation.
# ANYSHAPE_MODEL_TRIALS (default 16) sets the trials per task (0: untuned, seconds).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/venv.sh numpy onnxruntime openvino
cargo build --release -p anyshape
bin=target/release/anyshape
trials=${ANYSHAPE_MODEL_TRIALS:-16}
out=benchmarks/results/bert_tiny
mkdir -p "$out"
$bin compile models/bert_tiny.ts.onnx --dim batch=1 --dim sequence=1..128 \
  --trials "$trials" --records "$out/records" --resume --out "$out/bert.module" 2>&1 | tee "$out/compile.log"
for case in s1 s37 s128 b3s17; do
  echo "== $case"
  $bin run --module "$out/bert.module" --inputs "models/bert_tiny.ts.$case.npz" --seconds 1
done
# Side by side with onnxruntime and OpenVINO (2 threads) on the same .onnx, interleaved,
# outputs cross-checked.
$bin bench --model "$out/bert.module" --compare --dim batch=1 --dim sequence=1,8,32,64,128 \
  --rounds 3 --seconds 0.2 --python .venv/bin/python --out-dir "$out"
# Start-up: a fresh process to "ready to run", anyshape beside onnxruntime.
scripts/venv.sh ./python
.venv/bin/python scripts/load-time.py --module "$out/bert.module" --onnx models/bert_tiny.ts.onnx \
  --inputs models/bert_tiny.ts.s37.npz --repeat 3
