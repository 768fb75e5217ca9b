#!/usr/bin/env bash
# The main job: installs, builds, and trains the tiny example model on generated data, printing
# a progress line every few steps.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/build.sh
exec build/worker/trainyard-worker --standalone config/examples/tiny.yaml
