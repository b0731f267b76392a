#!/usr/bin/env bash
# Exports the full-size models (BERT-base, GPT-2 small, ViT-base; random weights) with
# PyTorch's two ONNX exporters into models/full/ (not in git: ~2.5 GB), with
# onnxruntime's outputs for the test cases as .npz — see models/README.md.
# Needs ~5 GB for a Python venv (.venv-export/) holding torch and its NVIDIA
# libraries from PyPI (the Linux wheel is a CUDA build; no GPU is used).
# Usage: scripts/export-models.sh [model ...]   (default: bert_base gpt2_small vit_base)
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${ANYSHAPE_EXPORT_VENV:-.venv-export}
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import torch, transformers, onnxruntime' 2>/dev/null; then
  echo "export-models: installing torch, transformers, onnxruntime into $venv (once, ~5 GB)"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q -r models/requirements.txt
  "$venv/bin/pip" install -q --no-deps $(grep -v '^#' models/requirements-nodeps.txt)
fi
models=("$@")
[ ${#models[@]} -gt 0 ] || models=(bert_base gpt2_small vit_base)
"$venv/bin/python" models/export.py --out models/full "${models[@]}"
