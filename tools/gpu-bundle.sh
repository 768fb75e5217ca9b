#!/usr/bin/env bash
# Builds the GPU test programs (every CTest test labelled gpu) and the two GPU benchmarks
# (Release, sm_90), and packs them with the shared libraries they load, the PyTorch peers and
# the session runner into one folder, to carry to a machine that has a GPU, its driver, the CUDA
# runtime and PyTorch, but none of this project's build dependencies.
#
# Usage: tools/gpu-bundle.sh OUT_DIR [BUNDLER]
#   BUNDLER   a program called as `BUNDLER OUT_DIR BINARY...` that copies each binary into
#             OUT_DIR/bin and the shared libraries it loads (but the C runtime, the GPU driver
#             and CUDA's own libraries) into OUT_DIR/lib; default $TRAINYARD_GPU_BUNDLER, else
#             tools/bundle-libs.sh (ldd-based).
# Environment: BUILD_DIR (default build-gpu in the repository), JOBS (default 2),
#   TRAINYARD_BUILD_LOCK (when set, a file every build step holds with flock),
#   MAX_BUNDLE_MIB (default 64: a larger bundle is an error).
# OUT_DIR is created, or replaced when it holds an earlier bundle; any other existing non-empty
# folder is refused. Layout: bin/ (tests and benchmarks, stripped) and lib/ (files over 1 MiB
# xz-compressed in both), bench/ (the drivers, the PyTorch peers, gpu_session.sh), gpu_tests.list,
# BUNDLE_INFO.
# On the GPU machine: OUT_DIR/bench/gpu_session.sh (outputs in $OUT, see that script).
set -euo pipefail

die() { echo "gpu-bundle: $*" >&2; exit 2; }
[[ $# -ge 1 && $# -le 2 && "$1" != -h && "$1" != --help ]] ||
  { sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
OUT_DIR=$1
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUNDLER="${2:-${TRAINYARD_GPU_BUNDLER:-$ROOT/tools/bundle-libs.sh}}"
[[ -x "$BUNDLER" ]] || die "bundler '$BUNDLER' is not an executable file"
BUILD="${BUILD_DIR:-$ROOT/build-gpu}"
[[ "$BUILD" = /* ]] || BUILD="$PWD/$BUILD"
JOBS="${JOBS:-2}"
MAX_MIB="${MAX_BUNDLE_MIB:-64}"
MARKER=".trainyard-gpu-bundle"

locked() {
  if [[ -n "${TRAINYARD_BUILD_LOCK:-}" ]]; then
    flock "$TRAINYARD_BUILD_LOCK" "$@"
  else
    "$@"
  fi
}

if [[ -e "$OUT_DIR" && ! -f "$OUT_DIR/$MARKER" && -n "$(ls -A "$OUT_DIR" 2>/dev/null)" ]]; then
  die "$OUT_DIR exists and is not an earlier bundle; choose an empty or new folder"
fi

echo "gpu-bundle: configuring $BUILD (Release, CUDA architecture 90)" >&2
locked cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DTRAINYARD_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90 >/dev/null
mapfile -t TESTS < <(ctest --test-dir "$BUILD" -L gpu -N | sed -n 's/^ *Test *#[0-9]*: *//p')
[[ ${#TESTS[@]} -gt 0 ]] || die "CTest lists no test labelled gpu in $BUILD (is TRAINYARD_CUDA on?)"
BENCHES=(trainyard-bench-gpu-kernels trainyard-bench-gpu-train)
echo "gpu-bundle: building ${#TESTS[@]} GPU tests and ${#BENCHES[@]} benchmarks" >&2
locked cmake --build "$BUILD" --target "${TESTS[@]}" "${BENCHES[@]}" -j "$JOBS"

# A test's binary has the test's name (tests/CMakeLists.txt: trainyard_add_test).
BINARIES=()
for t in "${TESTS[@]}"; do
  b="$(find "$BUILD/tests" -type f -name "$t" -perm -u+x | head -n 1)"
  [[ -n "$b" ]] || die "no binary for test $t under $BUILD/tests"
  BINARIES+=("$b")
done
for b in "${BENCHES[@]}"; do BINARIES+=("$BUILD/bench/$b"); done

rm -rf "$OUT_DIR"
mkdir -p "$OUT_DIR/bench"
touch "$OUT_DIR/$MARKER"
"$BUNDLER" "$OUT_DIR" "${BINARIES[@]}" >&2
# Symbols are not needed to run; the device code lives in data sections and is kept.
strip --strip-unneeded "$OUT_DIR"/bin/*
# Libraries and programs over 1 MiB travel xz-compressed (OpenBLAS, for the CPU reference the
# tests compare with, is 36 MiB; each test that links the kernels carries all their device code,
# and the programs alone came to 53 MiB of a 64 MiB carry); gpu_session.sh unpacks them.
find "$OUT_DIR/lib" "$OUT_DIR/bin" -type f -size +1M -exec xz -9 -T "$JOBS" {} \;
for f in run_gpu_vs_torch.sh torch_gpu_kernels.py torch_gpu_train.py timeline_report.py \
  gpu_session.sh; do
  install -m 0755 "$ROOT/bench/$f" "$OUT_DIR/bench/$f"
done
printf '%s\n' "${TESTS[@]}" >"$OUT_DIR/gpu_tests.list"
{
  echo "commit: $(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)$(
    git -C "$ROOT" diff --quiet HEAD 2>/dev/null || echo ' (with uncommitted changes)')"
  echo "built: $(date -u '+%Y-%m-%d %H:%M:%S UTC'), $(nvcc --version 2>/dev/null | tail -n 1)"
  echo "tests: ${TESTS[*]}"
} >"$OUT_DIR/BUNDLE_INFO"

KIB="$(du -sk "$OUT_DIR" | cut -f1)"
echo "gpu-bundle: $OUT_DIR holds $((KIB / 1024)) MiB ($(du -sh "$OUT_DIR" | cut -f1))" >&2
if [[ $KIB -gt $((MAX_MIB * 1024)) ]]; then
  echo "gpu-bundle: larger than ${MAX_MIB} MiB" >&2
  exit 1
fi
