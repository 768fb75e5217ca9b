#!/usr/bin/env bash
# Installs every Debian package Trainyard builds, tests or benchmarks with. Idempotent and
# non-interactive: packages already present are left alone. Run as root on Debian 12.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git
  libabsl-dev
  libprotobuf-dev protobuf-compiler
  libgrpc++-dev protobuf-compiler-grpc
  libyaml-cpp-dev
  prometheus-cpp-dev prometheus
  openssl iproute2
  libgtest-dev libgmock-dev googletest
  libgloo-dev
  libopenblas-dev libopenblas-openmp-dev
  libsqlite3-dev
  clang
  libxxhash-dev
  python3 python3-numpy python3-torch
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done

if ((${#missing[@]})); then
  export DEBIAN_FRONTEND=noninteractive
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
