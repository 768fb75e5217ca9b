#!/usr/bin/env bash
# Prints the Debian packages that ship the shared libraries the given binaries load (as ldd
# resolves them), one per line; fails naming any library no package owns. The Containerfile's
# runtime stage installs exactly these.
#
# Usage: deploy/container/runtime-packages.sh BINARY...
set -euo pipefail
[[ $# -ge 1 ]] || { echo "usage: $0 BINARY..." >&2; exit 2; }

owner() {  # the package owning a library path; Debian 12 lists some under /lib, some /usr/lib
  local real candidate
  real=$(readlink -f "$1")
  for candidate in "$real" "${real#/usr}" "/usr$real" "$1"; do
    dpkg-query -S "$candidate" 2>/dev/null | head -n 1 | cut -d: -f1 && return 0
  done
  return 1
}

libs=$(for b in "$@"; do ldd "$b"; done | awk '$3 ~ /^\// { print $3 }' | sort -u)
missing=0 packages=()
for lib in $libs; do
  if package=$(owner "$lib"); then
    packages+=("$package")
  else
    echo "runtime-packages: no package owns $lib" >&2
    missing=1
  fi
done
printf '%s\n' "${packages[@]}" | sort -u
exit "$missing"
