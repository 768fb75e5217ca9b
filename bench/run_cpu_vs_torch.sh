#!/usr/bin/env bash
# CPU training throughput: Trainyard's CPU engine against PyTorch on the same models.
#
# Usage: bench/run_cpu_vs_torch.sh [--threads K] [--steps N] [--warmup W] [--rounds R]
#                                  [--only TEXT]
#
# For each configuration (gpt2-debug "tiny", gpt2-small-cpu "small", llama-debug "llama tiny",
# and llama-debug over 2048 positions with full causal attention, with a sliding window of 256
# and with documents of 256 tokens packed into the sequence) runs the engine's benchmark binary and bench/torch_cpu_train.py alternately, R rounds
# each, and prints a Markdown table (per engine: the median over rounds of each run's median step
# time). --only runs the configurations whose label contains TEXT.
# The engine binary is $TRAINYARD_BENCH_BIN, default build/bench/trainyard-bench-cpu under the
# repository root. Both programs print one JSON line:
#   {"engine": ..., "tokens_per_s": ..., "median_step_ms": ..., "steps": N, ...}
set -euo pipefail

PY=/usr/bin/python3
THREADS=1
STEPS=20
WARMUP=3
ROUNDS=1
ONLY=
ARGS=("$@")

usage() { sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; }
die() { echo "run_cpu_vs_torch: $*" >&2; exit 2; }
need_int() { [[ "$2" =~ ^[1-9][0-9]*$ ]] || die "$1 needs a positive integer, got '$2'"; }

while [[ $# -gt 0 ]]; do
  case "$1" in
    --threads) [[ $# -ge 2 ]] || die "--threads needs a value"; need_int "$1" "$2"; THREADS=$2; shift 2 ;;
    --steps) [[ $# -ge 2 ]] || die "--steps needs a value"; need_int "$1" "$2"; STEPS=$2; shift 2 ;;
    --warmup) [[ $# -ge 2 ]] || die "--warmup needs a value"
      [[ "$2" =~ ^[0-9]+$ ]] || die "--warmup needs a non-negative integer, got '$2'"
      WARMUP=$2; shift 2 ;;
    --rounds) [[ $# -ge 2 ]] || die "--rounds needs a value"; need_int "$1" "$2"; ROUNDS=$2; shift 2 ;;
    --only) [[ $# -ge 2 ]] || die "--only needs a value"; ONLY=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="${TRAINYARD_BENCH_BIN:-$ROOT/build/bench/trainyard-bench-cpu}"
if [[ "$BIN" != /* && "$BIN" == */* ]]; then BIN="$PWD/$BIN"; fi
TORCH_PEER="$ROOT/bench/torch_cpu_train.py"

# The command as typed, with the script path made relative to the repository root.
SELF="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"
COMMAND="${SELF#"$ROOT"/}${ARGS[@]+$(printf ' %q' "${ARGS[@]}")}"
if [[ -n "${TRAINYARD_BENCH_BIN:-}" ]]; then
  COMMAND="TRAINYARD_BENCH_BIN=$(printf '%q' "$TRAINYARD_BENCH_BIN") $COMMAND"
fi

[[ -x "$PY" ]] || die "$PY not found (the benchmark needs Debian's python3 with python3-torch)"
if [[ ! -f "$BIN" || ! -x "$BIN" ]]; then
  die "Trainyard benchmark binary not found or not executable: $BIN
  build it with: cmake --build build --target trainyard-bench-cpu
  or point TRAINYARD_BENCH_BIN at it"
fi
TORCH_VERSION="$("$PY" -c 'import torch; print(torch.__version__)')" ||
  die "$PY cannot import torch (install python3-torch)"

# label | trainyard preset | torch config (the same model) | batch | seq | engine flags | peer flags
CONFIGS=(
  'tiny (gpt2-debug)|gpt2-debug|{"family":"gpt2","layers":2,"width":64,"heads":4,"kv_heads":4,"ffn_hidden":256,"vocab":256,"max_seq":64,"tied_embeddings":true,"norm_eps":1e-5}|8|64'
  'small (gpt2-small-cpu)|gpt2-small-cpu|{"family":"gpt2","layers":4,"width":256,"heads":8,"kv_heads":8,"ffn_hidden":1024,"vocab":256,"max_seq":256,"tied_embeddings":true,"norm_eps":1e-5}|4|256'
  'llama tiny (llama-debug)|llama-debug|{"family":"llama","layers":2,"width":64,"heads":4,"kv_heads":2,"ffn_hidden":128,"vocab":256,"max_seq":64,"tied_embeddings":false,"norm_eps":1e-5,"rope_theta":10000.0}|8|64'
  'llama 2k, full causal|llama-debug|{"family":"llama","layers":2,"width":64,"heads":4,"kv_heads":2,"ffn_hidden":128,"vocab":256,"max_seq":2048,"tied_embeddings":false,"norm_eps":1e-5,"rope_theta":10000.0}|1|2048|--max-seq 2048'
  'llama 2k, window 256|llama-debug|{"family":"llama","layers":2,"width":64,"heads":4,"kv_heads":2,"ffn_hidden":128,"vocab":256,"max_seq":2048,"tied_embeddings":false,"norm_eps":1e-5,"rope_theta":10000.0,"sliding_window":256}|1|2048|--max-seq 2048 --window 256'
  'llama 2k, documents of 256|llama-debug|{"family":"llama","layers":2,"width":64,"heads":4,"kv_heads":2,"ffn_hidden":128,"vocab":256,"max_seq":2048,"tied_embeddings":false,"norm_eps":1e-5,"rope_theta":10000.0}|1|2048|--max-seq 2048 --documents 256|--documents 256'
)

WORK="$(mktemp -d "${TMPDIR:-/tmp}/trainyard-cpu-vs-torch.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
RESULTS="$WORK/results.tsv"
: >"$RESULTS"

# run_engine LABEL ENGINE CMD... : runs one benchmark, appends "label<TAB>engine<TAB>json".
run_engine() {
  local label=$1 engine=$2
  shift 2
  local out="$WORK/out" err="$WORK/err"
  if ! "$@" >"$out" 2>"$err"; then
    echo "run_cpu_vs_torch: $engine failed on '$label':" >&2
    { printf ' '; printf ' %q' "$@"; echo; } >&2
    tail -n 20 "$err" >&2
    exit 1
  fi
  local json
  json="$(grep '^{' "$out" | tail -n 1 || true)"
  [[ -n "$json" ]] || { echo "run_cpu_vs_torch: $engine printed no JSON line on '$label'" >&2;
                        cat "$out" "$err" >&2; exit 1; }
  printf '%s\t%s\t%s\n' "$label" "$engine" "$json" >>"$RESULTS"
  echo "  $engine: $json" >&2
}

for entry in "${CONFIGS[@]}"; do
  IFS='|' read -r label preset torch_cfg batch seq flags peer <<<"$entry"
  [[ -z "$ONLY" || "$label" == *"$ONLY"* ]] || continue
  read -r -a engine_flags <<<"$flags"
  read -r -a peer_flags <<<"$peer"
  echo "== $label: batch $batch, seq $seq, $STEPS steps, $THREADS thread(s)" >&2
  for ((round = 1; round <= ROUNDS; round++)); do
    run_engine "$label" trainyard env OMP_NUM_THREADS="$THREADS" OPENBLAS_NUM_THREADS="$THREADS" \
      "$BIN" --preset "$preset" --batch "$batch" --seq "$seq" --steps "$STEPS" \
      --warmup "$WARMUP" --threads "$THREADS" ${engine_flags[@]+"${engine_flags[@]}"}
    run_engine "$label" pytorch env OMP_NUM_THREADS="$THREADS" \
      "$PY" "$TORCH_PEER" --config "$torch_cfg" --batch "$batch" --seq "$seq" --steps "$STEPS" \
      --warmup "$WARMUP" --threads "$THREADS" ${peer_flags[@]+"${peer_flags[@]}"}
  done
done

CPU_MODEL="$(grep -m1 -i '^model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2- | sed 's/^ *//' || true)"
[[ -n "$CPU_MODEL" ]] || CPU_MODEL="$(lscpu 2>/dev/null | grep -m1 'Model name' | cut -d: -f2- | sed 's/^ *//' || true)"
[[ -n "$CPU_MODEL" ]] || CPU_MODEL=unknown

GEMM_PEAK="$("$BIN" --threads "$THREADS" --gemm-peak | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["sgemm_2048_gflops"])')"

"$PY" - "$RESULTS" "$(date -u '+%Y-%m-%d %H:%M:%S UTC')" "$(nproc)" "$CPU_MODEL" \
  "$TORCH_VERSION" "$THREADS" "$STEPS" "$WARMUP" "$ROUNDS" "$COMMAND" "$GEMM_PEAK" <<'PYEOF'
import json
import statistics
import sys

path, date, nproc, cpu, torch_version, threads, steps, warmup, rounds, command, peak = sys.argv[1:]
rows = {}
for line in open(path, encoding="utf-8"):
    label, engine, text = line.rstrip("\n").split("\t", 2)
    rows.setdefault(label, {}).setdefault(engine, []).append(json.loads(text))

print("## Trainyard CPU engine vs PyTorch: training throughput")
print()
print("- date: %s" % date)
print("- nproc: %s" % nproc)
print("- CPU: %s" % cpu)
print("- torch: %s" % torch_version)
print("- threads: %s; timed steps: %s (after %s warmup); rounds: %s" % (threads, steps, warmup, rounds))
print("- command: `%s`" % command)
print("- ceiling: OpenBLAS SGEMM 2048^3 on %s threads reaches %s GFLOP/s here" % (threads, peak))
print()
print("| config | params | tokens/step | trainyard tok/s | pytorch tok/s | ratio "
      "| trainyard median ms | pytorch median ms | model GFLOP/step | trainyard GFLOP/s |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
status = 0
for label, engines in rows.items():
    torch_runs, ty_runs = engines["pytorch"], engines["trainyard"]
    params = torch_runs[0]["params"]
    tokens = torch_runs[0]["tokens_per_step"]
    ty_params = ty_runs[0].get("params")
    if ty_params is not None and int(ty_params) != int(params):
        sys.stderr.write("run_cpu_vs_torch: %s: trainyard reports %s parameters, pytorch %s: "
                         "the two engines are not running the same model\n"
                         % (label, ty_params, params))
        status = 1
    ty_ms = statistics.median(r["median_step_ms"] for r in ty_runs)
    pt_ms = statistics.median(r["median_step_ms"] for r in torch_runs)
    ty_tps = tokens / (ty_ms / 1e3)
    pt_tps = tokens / (pt_ms / 1e3)
    gflop = ty_runs[0].get("gflop_per_step", float("nan"))
    print("| %s | %s | %d | %.0f | %.0f | %.2fx | %.2f | %.2f | %.3f | %.1f |"
          % (label, format(params, ","), tokens, ty_tps, pt_tps, ty_tps / pt_tps, ty_ms, pt_ms,
             gflop, gflop / (ty_ms / 1e3)))
print()
print("ratio = trainyard tok/s / pytorch tok/s (above 1: Trainyard is faster).")
print("model GFLOP/step = tokens x (6 x matmul parameters + 12 x layers x seq x width), PaLM's count")
print("(with a sliding window W, twice the mean keys a query sees in place of seq; with documents")
print("of D tokens, D);")
print("GFLOP/s is that over the median step time; compare it with the SGEMM ceiling above.")
sys.exit(status)
PYEOF
