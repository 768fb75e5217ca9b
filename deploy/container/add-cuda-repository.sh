#!/bin/sh
# Adds NVIDIA's CUDA package repository for Debian 12 (x86-64) through its cuda-keyring package,
# then refreshes the package lists. Used by the Containerfile's CUDA=1 variant.
set -eu
apt-get update -qq
apt-get install -y -qq --no-install-recommends ca-certificates wget
wget -q -O /tmp/cuda-keyring.deb \
  https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/cuda-keyring_1.1-1_all.deb
dpkg -i /tmp/cuda-keyring.deb
rm -f /tmp/cuda-keyring.deb
apt-get update -qq
