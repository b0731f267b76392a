#!/usr/bin/env bash
# Installs what anyshape needs beyond the Rust toolchain on a Debian machine: a C
# compiler with OpenMP (gcc and its libgomp), Python's venv (the project's .venv: the
# Python package's tests, onnxruntime for the race), and the vendor libraries `anyshape bench`
# compares against (oneDNN, OpenBLAS; the bench skips a missing one with a warning)
# and a font for its plots, and Redis (the work queue's server, which the tests start on
# loopback; none runs as a service).
# Idempotent; quiet when all is there.
set -euo pipefail
need=()
command -v cc >/dev/null 2>&1 || need+=(gcc)
if command -v cc >/dev/null 2>&1 && ! echo 'int main(void){return 0;}' | cc -fopenmp -x c - -o /dev/null 2>/dev/null; then
  need+=(libgomp1 gcc)
fi
for pkg in python3-venv libdnnl-dev libopenblas-dev libopenblas0-openmp fonts-dejavu-core redis-server; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq "${need[@]}" || {
    # The vendor libraries are optional: without them only the benchmark loses baselines.
    echo "setup: could not install ${need[*]}; continuing (gcc is required, python3-venv for the Python tests, the rest optional)" >&2
    command -v cc >/dev/null 2>&1
  }
fi
