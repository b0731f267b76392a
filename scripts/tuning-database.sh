#!/usr/bin/env bash
# The tuning database warm from another model (issue "Compile in a minute"): from an
# empty kernel cache and an empty tuning database, RoBERTa-base is compiled (sequence
# 1..512, --trials 64: its trials land in the database), then BERT-base — the same layer
# sizes — with new records, timed, then raced against onnxruntime and OpenVINO.
# Results in benchmarks/results/tuning-database/ (compile logs without their round
# lines, both tuning logs, the race).
# ANYSHAPE_MODEL_TRIALS (default 64) sets the trials per task; ANYSHAPE_PYTHON the
# Python with onnxruntime and openvino (default: the project's .venv).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
for m in roberta_base bert_base; do
  [ -f "models/full/$m.ts.onnx" ] || scripts/export-models.sh "$m"
done
cargo build --release -p anyshape
if [ -n "${ANYSHAPE_PYTHON:-}" ]; then
  python=$ANYSHAPE_PYTHON
else
  scripts/venv.sh numpy onnxruntime openvino
  python=.venv/bin/python
fi
trials=${ANYSHAPE_MODEL_TRIALS:-64}
out=benchmarks/results/tuning-database
run=$(mktemp -d)
trap 'rm -rf "$run"' EXIT
mkdir -p "$out"
bin=target/release/anyshape
compile() { # model, records
  local start end
  start=$(date +%s.%N)
  $bin compile "models/full/$1.ts.onnx" --dim batch=1 --dim sequence=1..512 --trials "$trials" \
    --records "$run/$1.records" --cache-dir "$run/cache" --out "$run/$1.module" > "$run/$1.log" 2>&1
  end=$(date +%s.%N)
  grep -v '^round' "$run/$1.log" | sed "s#$run/#<run dir>/#g" > "$out/$1-compile.log"
  echo "wall: $(echo "$end - $start" | bc) s" | tee -a "$out/$1-compile.log"
  sed "s#$run/#<run dir>/#g" "$run/$1.module/tuning.json" > "$out/$1-tuning.json"
}
compile roberta_base   # from an empty database and kernel cache
compile bert_base      # the database warm from RoBERTa-base
$bin bench --model "$run/bert_base.module" --compare --python "$python" --threads 2 \
  --dim batch=1 --dim sequence=1,8,16,32,64,128,256,384,512 --rounds 5 --seconds 0.2 \
  --out-dir "$run/race"
for f in model.md model.csv; do
  sed "s#$run/#<run dir>/#g" "$run/race/$f" > "$out/$f"
done
sed "s#$run/##g" "$run/race/model-latency.svg" > "$out/model-latency.svg" # no markup in SVG text
