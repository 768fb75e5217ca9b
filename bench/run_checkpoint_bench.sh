#!/usr/bin/env bash
# Checkpoint cost: Trainyard's asynchronous checkpoints against torch.save, same model, same
# machine, same directory.
#
# Usage: bench/run_checkpoint_bench.sh [--presets gpt2-small-cpu,gpt2-124m] [--steps N]
#                                      [--every K] [--rounds R] [--dir PARENT] [--out FILE]
#
# For each preset runs checkpoint_bench (one rank, then dp 2 ZeRO-1: training-blocked time per
# save, write throughput against the disk's own fsync'd bandwidth measured in PARENT, restore
# time, median of --rounds cold and warm restores) and bench/torch_checkpoint_peer.py (torch.save /
# torch.load of model + AdamW state, median of --rounds rounds), then
# writes a Markdown report (default bench/results/checkpoint.md) with the machine, the command,
# the table, the three goals met or missed, and the raw output. Both programs write only under
# fresh mkdtemp directories in PARENT (default /tmp) and remove them. Run it on an idle machine.
# The binary is $TRAINYARD_CHECKPOINT_BENCH_BIN, default build/bench/checkpoint_bench.
set -euo pipefail

PY=/usr/bin/python3
PRESETS=gpt2-small-cpu,gpt2-124m
STEPS=8
EVERY=2
ROUNDS=3
PARENT="${TMPDIR:-/tmp}"
ARGS=("$@")
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="$ROOT/bench/results/checkpoint.md"

usage() { sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; }
die() { echo "run_checkpoint_bench: $*" >&2; exit 2; }
need_int() { [[ "$2" =~ ^[1-9][0-9]*$ ]] || die "$1 needs a positive integer, got '$2'"; }

while [[ $# -gt 0 ]]; do
  case "$1" in
    --presets) [[ $# -ge 2 ]] || die "--presets needs a value"; PRESETS=$2; shift 2 ;;
    --steps) [[ $# -ge 2 ]] || die "--steps needs a value"; need_int "$1" "$2"; STEPS=$2; shift 2 ;;
    --every) [[ $# -ge 2 ]] || die "--every needs a value"; need_int "$1" "$2"; EVERY=$2; shift 2 ;;
    --rounds) [[ $# -ge 2 ]] || die "--rounds needs a value"; need_int "$1" "$2"; ROUNDS=$2; shift 2 ;;
    --dir) [[ $# -ge 2 ]] || die "--dir needs a value"; PARENT=$2; shift 2 ;;
    --out) [[ $# -ge 2 ]] || die "--out needs a value"; OUT=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done

BIN="${TRAINYARD_CHECKPOINT_BENCH_BIN:-$ROOT/build/bench/checkpoint_bench}"
[[ -x "$BIN" ]] || die "benchmark binary not found: $BIN
  build it with: cmake --build build --target checkpoint_bench"
[[ -x "$PY" ]] || die "$PY not found (the peer needs Debian's python3 with python3-torch)"
TORCH_VERSION="$("$PY" -c 'import torch; print(torch.__version__)')" ||
  die "$PY cannot import torch (install python3-torch)"
[[ -d "$PARENT" && -w "$PARENT" ]] || die "--dir $PARENT is not a writable directory"
PARENT="$(cd "$PARENT" && pwd)"
THREADS="$(nproc)"
SELF="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"
COMMAND="${SELF#"$ROOT"/}${ARGS[@]+$(printf ' %q' "${ARGS[@]}")}"

# preset | batch per rank | seq | disk reference MiB (the checkpoint's size) | the same model for
# PyTorch (tests/oracle/torch_model.py)
CONFIGS=(
  'gpt2-small-cpu|4|256|38|{"family":"gpt2","layers":4,"width":256,"heads":8,"vocab":256,"max_seq":256}'
  'gpt2-124m|1|1024|1425|{"family":"gpt2","layers":12,"width":768,"heads":12,"vocab":50257,"max_seq":1024}'
)

WORK="$(mktemp -d "${TMPDIR:-/tmp}/trainyard-checkpoint-driver.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
RESULTS="$WORK/results.jsonl"
RAW="$WORK/raw.txt"
: >"$RESULTS"
: >"$RAW"

# run LOGNAME CMD...: runs one program, keeps its output for the report and its JSON lines.
run() {
  local name=$1
  shift
  # The command as run, with the checkout's own path left out (the report is committed).
  echo "\$$(printf ' %q' "$@")" | sed "s|$ROOT/||g" >>"$RAW"
  sync
  if ! "$@" >"$WORK/$name.out" 2>"$WORK/$name.err"; then
    echo "run_checkpoint_bench: $name failed:" >&2
    tail -n 20 "$WORK/$name.err" >&2
    exit 1
  fi
  cat "$WORK/$name.out" >>"$RAW"
  grep -v '^checkpoint_bench: ' "$WORK/$name.err" >>"$RAW" || true
  grep '^{' "$WORK/$name.out" >>"$RESULTS" || die "$name printed no JSON line"
  grep -v '^{' "$WORK/$name.out" | grep . >&2 || true
}

IFS=',' read -r -a WANTED <<<"$PRESETS"
for preset in "${WANTED[@]}"; do
  found=0
  for entry in "${CONFIGS[@]}"; do
    IFS='|' read -r name batch seq disk_mib torch_cfg <<<"$entry"
    [[ "$name" == "$preset" ]] || continue
    found=1
    echo "== $name: batch $batch per rank, seq $seq, $STEPS steps, a save every $EVERY" >&2
    run "trainyard-$name" "$BIN" --preset "$name" --batch "$batch" --seq "$seq" --steps "$STEPS" \
      --every "$EVERY" --ranks 1,2 --dir "$PARENT" --threads "$THREADS" --disk-mib "$disk_mib" \
      --restore-rounds "$ROUNDS"
    run "pytorch-$name" env OMP_NUM_THREADS="$THREADS" "$PY" "$ROOT/bench/torch_checkpoint_peer.py" \
      --config "$torch_cfg" --batch "$batch" --seq "$seq" --dir "$PARENT" --rounds "$ROUNDS" \
      --threads "$THREADS" --label "$name"
  done
  [[ $found == 1 ]] || die "no configuration for preset '$preset' (known: gpt2-small-cpu, gpt2-124m)"
done

CPU_MODEL="$(lscpu | sed -n 's/^Model name: *//p' | head -n 1)"
CORES="$(lscpu | sed -n 's/^CPU(s): *//p' | head -n 1) CPUs ($(nproc) usable)"
DISK="$(df -T "$PARENT" | tail -n 1 | awk '{printf "%s, %s, mounted at %s", $1, $2, $7}')"
DEV="$(df "$PARENT" | tail -n 1 | awk '{print $1}')"
ROTA="$(lsblk -dno ROTA "$DEV" 2>/dev/null | head -n 1 | tr -d ' ' || true)"
# What the kernel says of the medium (a virtual disk often reports ROTA=1 whatever backs it).
[[ -z "$ROTA" ]] || DISK="$DISK (lsblk ROTA=$ROTA)"

mkdir -p "$(dirname "$OUT")"
"$PY" "$ROOT/bench/checkpoint_report.py" "$RESULTS" "$RAW" \
  "$(date -u '+%Y-%m-%d %H:%M:%S UTC')" "$CPU_MODEL" "$CORES" "$DISK" "$PARENT" \
  "$TORCH_VERSION" "$COMMAND" "$STEPS" "$EVERY" "$ROUNDS" "$THREADS" >"$OUT"
echo "run_checkpoint_bench: wrote $OUT" >&2
cat "$OUT"
