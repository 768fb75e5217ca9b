#!/usr/bin/env bash
# Coordinator under load: runs trainyard-bench-coordinator (1,000 simulated agents heartbeating
# at 1 Hz, 10,000 simulated ranks reporting progress at 1 Hz, by default in one batch per agent
# as the agents' progress relays send them, from one process, against a real trainyard-server on
# loopback) and writes a Markdown report with the machine and the command.
#
# Usage: bench/run_coordinator_load.sh [--out FILE] [-- BENCH_FLAGS...]
#   BENCH_FLAGS go to the benchmark: --agents N --slots S --ranks-per-job R --seconds T
#   --progress relay|direct
# The binary is $TRAINYARD_BENCH_COORDINATOR_BIN (default build/bench/trainyard-bench-coordinator).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="${TRAINYARD_BENCH_COORDINATOR_BIN:-$ROOT/build/bench/trainyard-bench-coordinator}"
OUT=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --out) OUT=$2; shift 2 ;;
    --) shift; break ;;
    *) echo "run_coordinator_load: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
[[ -x "$BIN" ]] || { echo "run_coordinator_load: benchmark not found: $BIN (build first)" >&2; exit 2; }
psi() { [[ -r /proc/pressure/cpu ]] && head -1 /proc/pressure/cpu | cut -d' ' -f2-4 || echo "n/a"; }
LOAD_BEFORE="$(cut -d' ' -f1-3 /proc/loadavg)"
PSI_BEFORE="$(psi)"
TABLE="$("$BIN" "$@")"
LOAD_AFTER="$(cut -d' ' -f1-3 /proc/loadavg)"
PSI_AFTER="$(psi)"
REPORT="## Coordinator under load

- date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')
- nproc: $(nproc); CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')
- load average (1/5/15 min) before: $LOAD_BEFORE; after: $LOAD_AFTER
- CPU pressure (share of time some task waited for a CPU) before: $PSI_BEFORE; after: $PSI_AFTER
- command: \`bench/run_coordinator_load.sh${*:+ -- $*}\`
- goal: progress report p99 < 50 ms with the coordinator under one core

$TABLE

Latencies are client-side (request sent to reply received) and include the load generator's own
scheduling delays: the load process and the coordinator share the machine's cores."
if [[ -n "$OUT" ]]; then
  printf '%s\n' "$REPORT" >"$OUT"
fi
printf '%s\n' "$REPORT"
