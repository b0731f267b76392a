#!/usr/bin/env bash
# On a machine with an NVIDIA GPU and CUDA 12 (driver and NVRTC): the GPU test suite —
# the generated CUDA kernels compiled by NVRTC and checked on the device for every T in
# 1..=128 and past it (ignored by a plain `cargo test`) — plus the same kernels under
# CPU emulation. Without a GPU it fails, saying why.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cargo test --release -p anyshape-measure --test gpu --test cuda_emulated -- --include-ignored --nocapture
