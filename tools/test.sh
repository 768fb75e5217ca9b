#!/usr/bin/env bash
# Installs, builds and runs every test except the GPU ones (those need a device: ctest -L gpu).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/build.sh
cd build
ctest -LE gpu --output-on-failure -j"$(nproc)" --timeout 900
