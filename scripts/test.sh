#!/usr/bin/env bash
# The tests: Rust (every crate, including the C API's example compiled and run by
# crates/anyshape-capi/tests/c_example.rs, `bench --model` racing onnxruntime and
# OpenVINO from the project's .venv, and ONNX's operator conformance cases made by
# scripts/onnx-node-tests.py; onnx is pinned because the list of expected passes names
# its cases), the API docs (warnings as errors) and Python (the package built from
# python/ into .venv, then its pytest suite). What .ci/run calls.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/venv.sh numpy onnx==1.23.2 onnxruntime openvino pytest ./python
rm -rf target/onnx-node-tests
.venv/bin/python scripts/onnx-node-tests.py target/onnx-node-tests
# The manifest reader alone, with only its own dependencies' features (as the C
# library is built), then everything.
cargo test --release -p anyshape-abi --lib
ANYSHAPE_TEST_PYTHON="$PWD/.venv/bin/python" \
  ANYSHAPE_CONFORMANCE_DIR="$PWD/target/onnx-node-tests" \
  cargo test --release --workspace
# The API docs build with no warning (a broken link, a private item named in a public doc).
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps
.venv/bin/python -m pytest -q python/tests
