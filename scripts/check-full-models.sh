#!/usr/bin/env bash
# Compiles every full-size export in models/full/ (scripts/export-models.sh makes them)
# and runs each recorded case through the module, failing where an output differs
# from onnxruntime's by more than 1e-4 (max |error| / max |onnxruntime|).
# Text models: sequence 1..512, batch 1 (cases up to sequence 600 and batch 3 run past
# the range); ViT: height and width 160..384, batch 1.
# ANYSHAPE_MODEL_TRIALS (default 0: default micro-kernels) sets the tuning trials.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p anyshape
bin=target/release/anyshape
out=${ANYSHAPE_CHECK_DIR:-target/full-models}
mkdir -p "$out"
shopt -s nullglob
models=(models/full/*.onnx)
[ ${#models[@]} -gt 0 ] || { echo "no models in models/full/: run scripts/export-models.sh first" >&2; exit 1; }
for onnx in "${models[@]}"; do
  name=$(basename "$onnx" .onnx)
  case "$name" in
    vit*) dims=(--dim batch=1 --dim height=160..384 --dim width=160..384) ;;
    *) dims=(--dim batch=1 --dim sequence=1..512) ;;
  esac
  echo "== $name: compile ${dims[*]}"
  /usr/bin/time -f "compile: %e s wall, %M KiB max RSS" \
    $bin compile "$onnx" "${dims[@]}" --trials "${ANYSHAPE_MODEL_TRIALS:-0}" --out "$out/$name.module" | tail -1
  du -sh "$out/$name.module" | sed 's/^/module size: /'
  for case in models/full/"$name".*.npz; do
    echo "-- $(basename "$case")"
    $bin run --module "$out/$name.module" --inputs "$case" --seconds 0 | grep -E '^(check|model) '
  done
done
echo "all cases match onnxruntime within 1e-4"
