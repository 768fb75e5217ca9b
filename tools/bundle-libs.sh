#!/usr/bin/env bash
# The default bundler of tools/gpu-bundle.sh: copies each binary into OUT_DIR/bin and every shared
# library it loads (as ldd resolves them here) into OUT_DIR/lib, except the C runtime (glibc's
# own libraries and the dynamic loader), the GPU driver and CUDA's own libraries (the CUDA
# runtime, cuBLAS/cuBLASLt, NCCL and the like), which the GPU machine provides.
#
# Usage: tools/bundle-libs.sh OUT_DIR BINARY...
set -euo pipefail

die() { echo "bundle-libs: $*" >&2; exit 2; }
[[ $# -ge 2 ]] || die "usage: $0 OUT_DIR BINARY..."
OUT_DIR=$1
shift
mkdir -p "$OUT_DIR/bin" "$OUT_DIR/lib"

# Sonames left to the machine the bundle runs on.
provided() {
  case "$1" in
    linux-vdso.so* | ld-linux*.so* | libc.so* | libm.so* | libpthread.so* | libdl.so* | \
      librt.so* | libresolv.so* | libutil.so* | libmvec.so*) return 0 ;;
    libcuda.so* | libnvidia-*.so* | libcudart.so* | libcublas.so* | libcublasLt.so* | \
      libnccl.so* | libnvrtc*.so* | libnvJitLink.so* | libcurand.so* | libcusparse.so* | \
      libcufft.so* | libcusolver.so* | libnvToolsExt.so*) return 0 ;;
  esac
  return 1
}

declare -A copied=()
for binary in "$@"; do
  [[ -f "$binary" && -x "$binary" ]] || die "'$binary' is not an executable file"
  install -m 0755 "$binary" "$OUT_DIR/bin/"
  # ldd prints "soname => /path (addr)" for each library it resolved and "soname => not found"
  # for one it did not.
  while read -r soname arrow path _; do
    [[ "$arrow" == "=>" ]] || continue
    provided "$soname" && continue
    [[ "$path" == /* ]] || die "$binary: $soname is not found here"
    [[ -n "${copied[$soname]:-}" ]] && continue
    cp -L "$path" "$OUT_DIR/lib/$soname"
    chmod 0644 "$OUT_DIR/lib/$soname"
    copied[$soname]=1
  done < <(ldd "$binary")
done
echo "bundle-libs: ${#} binaries, ${#copied[@]} libraries into $OUT_DIR" >&2
