#!/usr/bin/env bash
# The tests: Rust (every crate, including the C API's example compiled and run by
# crates/anyshape-capi/tests/c_example.rs) and Python (the package built from python/
# into .venv, then its pytest suite). What .ci/run calls.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cargo test --release --workspace
scripts/venv.sh ./python pytest
.venv/bin/python -m pytest -q python/tests
