#!/usr/bin/env bash
# The main job: installs what the daemon needs and builds its binaries (not the tests), starts
# the coordinator (the embedded default: loopback, a local agent with this machine's CPU slots,
# its state in a fresh scratch directory), submits the tiny example, watches it train to the
# end, shows the last lines of its log, and stops the coordinator. Exits with the job's outcome
# (0 succeeded, 1 failed, 4 cancelled). Arguments go to CMake's configure step. The tiny job
# trains on CPU ranks, so the CUDA backend is built only where a GPU is visible (nvidia-smi lists
# one); -DTRAINYARD_CUDA=ON or OFF decides instead.
set -euo pipefail
cd "$(dirname "$0")/.."
cuda=()
if [[ " $* " != *" -DTRAINYARD_CUDA="* ]]; then
  if nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then cuda=(-DTRAINYARD_CUDA=ON); else cuda=(-DTRAINYARD_CUDA=OFF); fi
fi
bash tools/build.sh --binaries "${cuda[@]}" "$@"

scratch=$(mktemp -d "${TMPDIR:-/tmp}/trainyard-demo.XXXXXX")
server_pid=""
stop_server() {
  if [ -n "$server_pid" ] && kill -0 "$server_pid" 2>/dev/null; then
    kill -TERM "$server_pid"
    wait "$server_pid" || true
  fi
  rm -rf "$scratch"
}
trap stop_server EXIT

build/server/trainyard-server --state-dir "$scratch/state" 2>"$scratch/server.log" &
server_pid=$!
for _ in $(seq 1 300); do
  [ -s "$scratch/state/server.addr" ] && break
  if ! kill -0 "$server_pid" 2>/dev/null; then
    cat "$scratch/server.log" >&2
    exit 1
  fi
  sleep 0.1
done
export TRAINYARD_SERVER TRAINYARD_TOKEN_FILE="$scratch/state/admin.token"
TRAINYARD_SERVER=$(cat "$scratch/state/server.addr")
echo "coordinator at $TRAINYARD_SERVER"

cli=build/tools/cli/trainyard
job=$("$cli" submit config/examples/tiny.yaml)
echo "submitted $job"
outcome=0
"$cli" watch "$job" || outcome=$?
"$cli" logs "$job" --rank 0 --tail 3
exit "$outcome"
