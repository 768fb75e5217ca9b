#!/usr/bin/env bash
# Installs every Debian package Trainyard builds, tests or benchmarks with, and the npm packages
# the Kubernetes manifest test validates with. Idempotent and non-interactive: what is already
# present is left alone. Run as root on Debian 12.
#
# Usage: tools/setup.sh [--build-only]
#   --build-only   only what building needs (the container image's build stage uses this)
set -euo pipefail
cd "$(dirname "$0")/.."

build_only=0
case "${1:-}" in
  "") ;;
  --build-only) build_only=1 ;;
  *) echo "usage: tools/setup.sh [--build-only]" >&2; exit 2 ;;
esac

packages=(
  build-essential cmake ninja-build pkg-config git
  libabsl-dev
  libprotobuf-dev protobuf-compiler
  libgrpc++-dev protobuf-compiler-grpc
  libyaml-cpp-dev
  prometheus-cpp-dev
  openssl
  libgtest-dev libgmock-dev googletest
  libgloo-dev
  libopenblas-dev libopenblas-openmp-dev
  libsqlite3-dev
  libssl-dev
  libxxhash-dev
  libre2-dev
  zlib1g-dev libzstd-dev
  python3
)
if ((!build_only)); then
  packages+=(
    prometheus iproute2 clang libclang-rt-14-dev
    python3-numpy python3-torch python3-regex  # the oracles
    valgrind                             # the coordinator's instruction-count check
    slurmctld slurmd slurm-client munge  # the Slurm deployment test
    nodejs                               # the Kubernetes manifest test
  )
  # Machines that already have kubectl or npm from elsewhere keep theirs.
  command -v kubectl >/dev/null || packages+=(kubernetes-client)
  command -v npm >/dev/null || packages+=(npm)
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done

sudo_cmd=""
[ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
if ((${#missing[@]})); then
  export DEBIAN_FRONTEND=noninteractive
  $sudo_cmd apt-get update -qq
  $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
# The Debian packages enable these daemons as system services; the tests start their own.
if ((!build_only)) && command -v systemctl >/dev/null && [ -d /run/systemd/system ]; then
  $sudo_cmd systemctl disable --now slurmctld slurmd munge >/dev/null 2>&1 || true
fi

# The Kubernetes schema validator's npm packages, pinned by tests/deploy/kube/package-lock.json,
# installed into tests/deploy/kube/node_modules (nothing is fetched when the test runs).
if ((!build_only)); then
  kube=tests/deploy/kube
  if ! cmp -s "$kube/package-lock.json" "$kube/node_modules/.installed-lock.json" 2>/dev/null; then
    npm ci --prefix "$kube" --no-audit --no-fund --loglevel=error
    cp "$kube/package-lock.json" "$kube/node_modules/.installed-lock.json"
  fi
fi
