#!/usr/bin/env bash
# The tests: Rust (every crate, including the C API's example compiled and run by
# crates/anyshape-capi/tests/c_example.rs, and `bench --model` racing onnxruntime and
# OpenVINO from the project's .venv) and Python (the package built from python/ into
# .venv, then its pytest suite). What .ci/run calls.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/venv.sh numpy onnxruntime openvino pytest ./python
ANYSHAPE_TEST_PYTHON="$PWD/.venv/bin/python" cargo test --release --workspace
.venv/bin/python -m pytest -q python/tests
