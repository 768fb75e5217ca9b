#!/usr/bin/env bash
# Installs the dependencies and builds Trainyard into ./build (Release). Extra arguments go to
# CMake's configure step, e.g. -DTRAINYARD_CUDA=OFF.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "$@"
cmake --build build -j"$(nproc)"
