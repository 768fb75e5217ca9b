#!/usr/bin/env bash
# Data-parallel training throughput: Trainyard DP=2 (Gloo, local launcher) against PyTorch
# DistributedDataParallel (gloo backend) on the same model, global batch and threads per rank.
#
# Usage: bench/run_ddp_vs_torch.sh [--steps N] [--rounds R]
# The worker binary is $TRAINYARD_WORKER_BIN (default build/worker/trainyard-worker). Prints a
# Markdown table; per engine the median over rounds of each run's median step time.
set -euo pipefail
PY=/usr/bin/python3
STEPS=30
ROUNDS=3
ARGS=("$@")
while [[ $# -gt 0 ]]; do
  case "$1" in
    --steps) STEPS=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    *) echo "run_ddp_vs_torch: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="${TRAINYARD_WORKER_BIN:-$ROOT/build/worker/trainyard-worker}"
[[ -x "$BIN" ]] || { echo "run_ddp_vs_torch: worker binary not found: $BIN (build first)" >&2; exit 2; }
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
RESULTS="$WORK/results.tsv"
: >"$RESULTS"

# label preset layers width heads ffn max_seq global_batch seq
CONFIGS=(
  "tiny gpt2-debug 2 64 4 256 64 16 64"
  "small gpt2-small-cpu 4 256 8 1024 256 8 256"
)
for cfg in "${CONFIGS[@]}"; do
  read -r label preset layers width heads ffn max_seq batch seq <<<"$cfg"
  spec="$WORK/$label.yaml"
  cat >"$spec" <<YAML
name: ddp-bench-$label
model:
  preset: $preset
data:
  source: markov
  markov: {order: 1, vocab: 32, train_tokens: 200000, val_tokens: 4096, seed: 3}
training:
  steps: $STEPS
  batch: $batch
  seq_len: $seq
  warmup_steps: 1
  eval_every: 0
  log_every: 1000000
  threads: 1
parallelism: {dp: 2, tp: 1, pp: 1, zero: 0}
resources: {nodes: 1, devices_per_node: 2, kind: cpu}
YAML
  torch_cfg="{\"family\": \"gpt2\", \"layers\": $layers, \"width\": $width, \"heads\": $heads, \"kv_heads\": $heads, \"ffn_hidden\": $ffn, \"vocab\": 256, \"max_seq\": $max_seq, \"tied_embeddings\": true}"
  for ((r = 0; r < ROUNDS; r++)); do
    line="$("$BIN" --standalone "$spec" | grep '^done:')"
    ms="$(sed -E 's/.*median step ([0-9.]+) ms.*/\1/' <<<"$line")"
    echo "  trainyard: $line" >&2
    printf '%s\ttrainyard\t%s\t%s\n' "$label" "$ms" "$((batch * seq))" >>"$RESULTS"
    json="$("$PY" "$ROOT/bench/torch_ddp_train.py" --config "$torch_cfg" --world 2 --batch "$batch" \
      --seq "$seq" --steps "$STEPS" --threads 1)"
    echo "  pytorch: $json" >&2
    ms="$("$PY" -c 'import json,sys; print(json.loads(sys.argv[1])["median_step_ms"])' "$json")"
    printf '%s\tpytorch\t%s\t%s\n' "$label" "$ms" "$((batch * seq))" >>"$RESULTS"
  done
done

"$PY" - "$RESULTS" "$(date -u '+%Y-%m-%d %H:%M:%S UTC')" "$(nproc)" \
  "$(grep -m1 -i '^model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')" \
  "$("$PY" -c 'import torch; print(torch.__version__)')" "$STEPS" "$ROUNDS" \
  "bench/run_ddp_vs_torch.sh${ARGS[*]+ ${ARGS[*]}}" <<'PYEOF'
import statistics, sys
path, date, nproc, cpu, torch_version, steps, rounds, command = sys.argv[1:]
rows = {}
for line in open(path):
    label, engine, ms, tokens = line.split("\t")
    rows.setdefault(label, {"tokens": int(tokens)}).setdefault(engine, []).append(float(ms))
print("## Trainyard DP=2 vs PyTorch DDP (gloo): training throughput")
print()
print("- date: %s; nproc: %s; CPU: %s; torch: %s" % (date, nproc, cpu, torch_version))
print("- 2 ranks x 1 thread each; timed steps per run: %s; rounds: %s" % (steps, rounds))
print("- command: `%s`" % command)
print()
print("| config | global tokens/step | trainyard tok/s | pytorch DDP tok/s | ratio | trainyard median ms | pytorch median ms |")
print("|---|---:|---:|---:|---:|---:|---:|")
for label, r in rows.items():
    ty, pt = statistics.median(r["trainyard"]), statistics.median(r["pytorch"])
    print("| %s | %d | %.0f | %.0f | %.2fx | %.2f | %.2f |" % (
        label, r["tokens"], r["tokens"] / ty * 1e3, r["tokens"] / pt * 1e3, pt / ty, ty, pt))
print()
print("ratio = trainyard tok/s / pytorch tok/s. Trainyard's step time is rank 0's median over")
print("the run (its first step included); PyTorch's excludes 3 warmup steps.")
PYEOF
