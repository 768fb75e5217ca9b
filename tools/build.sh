#!/usr/bin/env bash
# Installs the dependencies and builds Trainyard into ./build (Release): everything, tests
# included. Extra arguments go to CMake's configure step, e.g. -DTRAINYARD_CUDA=OFF.
#
# Usage: tools/build.sh [--binaries] [CMAKE_ARGS...]
#   --binaries   only what the daemon needs: the build's packages, and the four binaries
#                (trainyard-server, trainyard-agent, trainyard-worker, trainyard), without the
#                tests and benchmarks (tools/demo.sh)
#
# Without -DTRAINYARD_CUDA=..., CUDA follows the machine (ON where a toolkit is found), not a
# choice an earlier configure of ./build left in its cache.
set -euo pipefail
cd "$(dirname "$0")/.."
binaries=0
if [ "${1:-}" = "--binaries" ]; then
  binaries=1
  shift
fi
cuda_default=()
[[ " $* " == *" -DTRAINYARD_CUDA="* ]] || cuda_default=(-UTRAINYARD_CUDA)
if ((binaries)); then
  bash tools/setup.sh --build-only
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DTRAINYARD_TESTS=OFF \
    "${cuda_default[@]}" "$@"
  cmake --build build -j"$(nproc)" --target trainyard-server trainyard-agent trainyard-worker \
    trainyard
  exit 0
fi
bash tools/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DTRAINYARD_TESTS=ON "${cuda_default[@]}" "$@"
cmake --build build -j"$(nproc)"
