#!/usr/bin/env bash
# The project's own Python environment, `.venv/` at the repository root (ignored by
# git): created where missing, then the packages given installed into it (quietly; pip
# skips what is there). Prints nothing else. Used by the main job (onnxruntime, the
# peer it races) and the test command (the anyshape package and pytest).
#   scripts/venv.sh numpy onnxruntime
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv || {
    echo "venv: cannot create .venv with python3 -m venv; on Debian: apt-get install python3-venv (scripts/setup.sh does)" >&2
    exit 1
  }
  .venv/bin/python -m pip install -q --upgrade pip
fi
if [ $# -gt 0 ]; then
  .venv/bin/python -m pip install -q "$@"
fi
