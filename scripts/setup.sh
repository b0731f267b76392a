#!/usr/bin/env bash
# Installs what anyshape needs beyond the Rust toolchain on a Debian machine:
# a C compiler with OpenMP (gcc and its libgomp). Idempotent; quiet when all is there.
set -euo pipefail
need=()
command -v cc >/dev/null 2>&1 || need+=(gcc)
if command -v cc >/dev/null 2>&1 && ! echo 'int main(void){return 0;}' | cc -fopenmp -x c - -o /dev/null 2>/dev/null; then
  need+=(libgomp1 gcc)
fi
if [ ${#need[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq "${need[@]}"
fi
