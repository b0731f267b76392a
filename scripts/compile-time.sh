#!/usr/bin/env bash
# How long a compile takes and what it buys (issue "Compile in a minute"): BERT-base
# (TorchScript export) for sequence 1..512, each compile from an empty kernel cache and
# an empty tuning database, at several trial budgets, each raced against onnxruntime and
# OpenVINO (2 threads, minima of 3 interleaved rounds); the trust-region search at the
# largest budget; RoBERTa-base (the same layer sizes) compiled from empty and BERT-base
# then compiled with its database; the tuning curves on one plot (the previous
# anyshape's compile too, where ANYSHAPE_OLD_BIN names its binary).
# Results in benchmarks/results/compile-time/ (README.md, compile logs without their
# round lines, tuning logs, races, tuning-curve.svg).
# ANYSHAPE_COMPILE_TRIALS (default "4 8 16 32 64") sets the budgets; ANYSHAPE_PYTHON the
# Python with onnxruntime and openvino (default: the project's .venv).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
for m in bert_base roberta_base; do
  [ -f "models/full/$m.ts.onnx" ] || scripts/export-models.sh "$m"
done
cargo build --release -p anyshape
if [ -n "${ANYSHAPE_PYTHON:-}" ]; then
  python=$ANYSHAPE_PYTHON
else
  scripts/venv.sh numpy onnxruntime openvino
  python=.venv/bin/python
fi
bin=$PWD/target/release/anyshape
budgets=(${ANYSHAPE_COMPILE_TRIALS:-4 8 16 32 64})
largest=${budgets[${#budgets[@]}-1]}
out=benchmarks/results/compile-time
run=$(mktemp -d)
trap 'rm -rf "$run"' EXIT
mkdir -p "$out"
summary=()
compile() { # name, binary, model, cache, trials, extra...
  local name=$1 b=$2 model=$3 cache=$4 trials=$5 start end
  shift 5
  start=$(date +%s.%N)
  "$b" compile "models/full/$model.ts.onnx" --dim batch=1 --dim sequence=1..512 --trials "$trials" \
    --records "$run/$name.records" --cache-dir "$run/$cache" --out "$run/$name" "$@" > "$run/$name.log" 2>&1
  end=$(date +%s.%N)
  local wall
  wall=$(echo "$end - $start" | bc)
  grep -v '^round' "$run/$name.log" | sed "s#$run/#<run dir>/#g" > "$out/$name-compile.log"
  echo "wall: $wall s" >> "$out/$name-compile.log"
  [ -f "$run/$name/tuning.json" ] && sed "s#$run/#<run dir>/#g" "$run/$name/tuning.json" > "$out/$name-tuning.json"
  echo "$wall"
}
race() { # name
  "$bin" bench --model "$run/$1" --compare --python "$python" --threads 2 \
    --dim batch=1 --dim sequence=1,8,16,32,64,128,256,384,512 --rounds 3 --seconds 0.2 \
    --out-dir "$run/race-$1" > /dev/null 2>&1
  sed "s#$run/#<run dir>/#g" "$run/race-$1/model.md" > "$out/race-$1.md"
  grep '^- anyshape vs' "$run/race-$1/model.md" | sed 's/^- anyshape vs //; s/\*\*//g; s/; paired.*//; s/ over 9 instances//' |
    paste -sd '#' | sed 's/#/ · /g'
}
row() { # name, what, wall
  local r
  r=$(race "$1")
  summary+=("| $2 | $(printf '%.1f' "$3") | $r |")
}
for t in "${budgets[@]}"; do
  wall=$(compile "bert-t$t" "$bin" bert_base "cache-t$t" "$t")
  row "bert-t$t" "BERT-base, --trials $t, empty database" "$wall"
done
wall=$(compile "bert-t$largest-trust-region" "$bin" bert_base cache-tr "$largest" --search trust-region)
row "bert-t$largest-trust-region" "BERT-base, --trials $largest --search trust-region, empty database" "$wall"
curves=("$run/bert-t$largest-trust-region")
if [ -n "${ANYSHAPE_OLD_BIN:-}" ]; then
  wall=$(compile "bert-t$largest-old" "$ANYSHAPE_OLD_BIN" bert_base cache-old "$largest")
  row "bert-t$largest-old" "BERT-base, --trials $largest, empty database, previous anyshape ($("$ANYSHAPE_OLD_BIN" --version))" "$wall"
  baseline="$run/bert-t$largest-old"
else
  baseline="${curves[0]}"
  curves=()
fi
wall=$(compile roberta "$bin" roberta_base cache-warm "$largest")
summary+=("| RoBERTa-base, --trials $largest, empty database (warms the next) | $(printf '%.1f' "$wall") | - |")
wall=$(compile bert-warm "$bin" bert_base cache-warm "$largest")
row bert-warm "BERT-base, --trials $largest, database warm from RoBERTa-base" "$wall"
args=()
for c in "${curves[@]}"; do args+=(--tuning-against "$c"); done
"$bin" bench --model "$run/bert-t$largest" --tuning-against "$baseline" "${args[@]}" \
  --out-dir "$run/curves" > /dev/null
for f in tuning.md tuning.csv; do
  sed "s#$run/#<run dir>/#g" "$run/curves/$f" > "$out/$f"
done
sed "s#$run/##g" "$run/curves/tuning-curve.svg" > "$out/tuning-curve.svg" # no markup in SVG text
{
  echo "# Compile time against speed: BERT-base, sequence 1..512"
  echo
  echo "Machine: $("$bin" target | sed -n 's/.*"name": "\(.*\)".*/\1/p'), $(nproc) cores; $(date -u +%Y-%m-%d). Each compile from an empty kernel cache and tuning database unless said; wall time of the whole \`anyshape compile\` (import, search, votes, modules, plan). Each module raced at sequence 1, 8, ..., 512 (minima of 3 interleaved rounds, 2 threads; the races' own files beside this one)."
  echo
  echo "| compile | wall s | speedup (geomean over the 9 lengths) |"
  echo "|---|---:|---|"
  printf '%s\n' "${summary[@]}"
  echo
  echo "Tuning curves (expected model latency against tuning time): tuning-curve.svg, tuning.md."
} | tee "$out/README.md"
