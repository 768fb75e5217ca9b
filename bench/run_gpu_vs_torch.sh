#!/usr/bin/env bash
# Trainyard's CUDA kernels and training steps side by side with PyTorch, in one run on one GPU.
#
# Usage: bench/run_gpu_vs_torch.sh [--part all|kernels|train] [--reps N] [--kernel-warmup W]
#          [--steps S] [--warmup W] [--compile model|regional|none] [--peak-tflops X]
#          [--timeout-s N] [--budget-s N]
#
# kernels: trainyard-bench-gpu-kernels and bench/torch_gpu_kernels.py (N timed reps after W);
# train:   trainyard-bench-gpu-train (also with --atomic-dq and --fp8) and bench/torch_gpu_train.py for
#          GPT-2 124M (16 x 1024 tokens) and Llama 1B (4 x 2048), S timed steps after W
#          (PyTorch compiled as --compile).
# Prints Markdown tables; ratio = PyTorch time / Trainyard time (above 1: Trainyard is faster),
# with the issue's goals marked. Every program's raw output goes to stderr. Each program is
# stopped after --timeout-s seconds (default 300), and none starts or runs past --budget-s
# seconds from the start of this script (default: no limit), so the tables always get printed;
# a program that fails, times out or is skipped is reported and the others still run (exit
# status 1 at the end).
# Binaries: $TRAINYARD_BIN_DIR (default build/bench under the repository root), run with
# LD_LIBRARY_PATH=$TRAINYARD_LD_LIBRARY_PATH when that is set (a bundle's libraries, kept away
# from Python's own); Python: $PYTHON (default python3, which must have torch with CUDA).
set -uo pipefail

PART=all
REPS=30
KERNEL_WARMUP=5
STEPS=10
WARMUP=3
COMPILE=model
PEAK=""
TIMEOUT_S=300
BUDGET_S=0
ARGS=("$@")

usage() { sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; }
die() { echo "run_gpu_vs_torch: $*" >&2; exit 2; }
need_int() { [[ "$2" =~ ^[0-9]+$ ]] || die "$1 needs a non-negative integer, got '$2'"; }

while [[ $# -gt 0 ]]; do
  [[ "$1" == -h || "$1" == --help ]] && { usage; exit 0; }
  [[ $# -ge 2 ]] || die "$1 needs a value (see --help)"
  case "$1" in
    --part) [[ "$2" =~ ^(all|kernels|train)$ ]] || die "--part is all, kernels or train"; PART=$2 ;;
    --reps) need_int "$1" "$2"; REPS=$2 ;;
    --kernel-warmup) need_int "$1" "$2"; KERNEL_WARMUP=$2 ;;
    --steps) need_int "$1" "$2"; STEPS=$2 ;;
    --warmup) need_int "$1" "$2"; WARMUP=$2 ;;
    --compile) [[ "$2" =~ ^(model|regional|none)$ ]] || die "--compile is model, regional or none"
      COMPILE=$2 ;;
    --peak-tflops) [[ "$2" =~ ^[0-9]+(\.[0-9]+)?$ ]] || die "--peak-tflops needs a number"
      PEAK=$2 ;;
    --timeout-s) need_int "$1" "$2"; TIMEOUT_S=$2 ;;
    --budget-s) need_int "$1" "$2"; BUDGET_S=$2 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
  shift 2
done
[[ "$REPS" -ge 1 && "$STEPS" -ge 1 ]] || die "--reps and --steps must be at least 1"

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN_DIR="${TRAINYARD_BIN_DIR:-$ROOT/build/bench}"
PY="${PYTHON:-python3}"
HERE="$ROOT/bench"
for b in trainyard-bench-gpu-kernels trainyard-bench-gpu-train; do
  [[ -x "$BIN_DIR/$b" ]] || die "$BIN_DIR/$b not found or not executable
  build it with: cmake --build build --target $b   (or set TRAINYARD_BIN_DIR)"
done
"$PY" -c 'import torch' 2>/dev/null || die "$PY cannot import torch (set PYTHON)"

WORK="$(mktemp -d "${TMPDIR:-/tmp}/trainyard-gpu-vs-torch.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
FAILED=0
PEAK_ARGS=()
[[ -n "$PEAK" ]] && PEAK_ARGS=(--peak-tflops "$PEAK")

TRAINYARD_ENV=(env)
[[ -n "${TRAINYARD_LD_LIBRARY_PATH:-}" ]] &&
  TRAINYARD_ENV=(env LD_LIBRARY_PATH="$TRAINYARD_LD_LIBRARY_PATH")

# run NAME OUTFILE CMD... : runs one program under the timeout (shortened to what is left of the
# budget), its output to OUTFILE and stderr.
run() {
  local name=$1 out=$2
  shift 2
  : >"$out"
  local limit=$TIMEOUT_S
  if [[ $BUDGET_S -gt 0 ]]; then
    local left=$((BUDGET_S - SECONDS))
    if [[ $left -lt 10 ]]; then
      echo "run_gpu_vs_torch: $name not run: the ${BUDGET_S}s budget is spent" >&2
      FAILED=1
      return
    fi
    [[ $left -lt $limit ]] && limit=$left
  fi
  echo "== $name: $*" >&2
  local start=$SECONDS rc=0
  timeout --kill-after=10 "$limit" "$@" >"$out" 2>"$WORK/err" || rc=$?
  cat "$out" "$WORK/err" >&2
  if [[ $rc -ne 0 ]]; then
    FAILED=1
    if [[ $rc -eq 124 || $rc -eq 137 ]]; then
      echo "run_gpu_vs_torch: $name timed out after ${limit}s" >&2
    else
      echo "run_gpu_vs_torch: $name exited with status $rc" >&2
    fi
  fi
  echo "   ($name: $((SECONDS - start)) s)" >&2
}

echo "## Trainyard CUDA vs PyTorch"
echo
echo "- date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
echo "- GPU: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -n1 || echo unknown)"
echo "- torch: $("$PY" -c 'import torch; print(torch.__version__, "CUDA", torch.version.cuda)')"
echo "- command: bench/run_gpu_vs_torch.sh${ARGS[@]+$(printf ' %q' "${ARGS[@]}")}"

if [[ "$PART" != train ]]; then
  run "trainyard kernels" "$WORK/k_ty" "${TRAINYARD_ENV[@]}" \
    "$BIN_DIR/trainyard-bench-gpu-kernels" --json \
    --reps "$REPS" --warmup "$KERNEL_WARMUP"
  run "pytorch kernels" "$WORK/k_pt" "$PY" "$HERE/torch_gpu_kernels.py" --json \
    --reps "$REPS" --warmup "$KERNEL_WARMUP"
  "$PY" - "$WORK/k_ty" "$WORK/k_pt" "$REPS" "$KERNEL_WARMUP" <<'PYEOF' || FAILED=1
import json
import sys

def rows(path):
    out = {}
    for line in open(path, encoding="utf-8", errors="replace"):
        if line.startswith("{"):
            try:
                r = json.loads(line)
            except ValueError:
                continue
            out[r["case"]] = r
    return out

ty, pt = rows(sys.argv[1]), rows(sys.argv[2])
print()
print("### Kernels (median of %s reps after %s warm-up, L2 flushed before each)" % tuple(sys.argv[3:5]))
print()
print("| case | shape | trainyard ms | pytorch ms | trainyard | pytorch | of peak (ty / pt) "
      "| ratio | goal |")
print("|---|---|---:|---:|---:|---:|---:|---:|---|")

def achieved(r):
    if "error" in r:
        return "error"
    return "%.1f TFLOP/s" % r["tflops"] if "tflops" in r else "%.0f GB/s" % r["gbps"]

def rate(r):
    return r.get("tflops", r.get("gbps", 0.0))

def of_peak(a, b):
    # Trainyard's rows carry their fraction of the device's peak for the row's kind (dense bf16
    # FLOP/s, or memory bandwidth); PyTorch's rate is held against the same peak.
    if not a.get("of_peak") or not rate(a):
        return ""
    peak = rate(a) / a["of_peak"]
    return "%.0f%% / %.0f%%" % (100 * a["of_peak"], 100 * rate(b) / peak)

status = 0
for case in list(ty) + [c for c in pt if c not in ty]:
    # The attention variants' rows (atomic dQ sums, 16 query rows per warp, soft-capped scores:
    # SDPA has no cap, so that row shows the cap's cost) and the experts' GEMMs one by one do the
    # work of the plain ones: the same PyTorch row is the peer.
    peer = case.replace(" atomic-dq", "").replace(" warp-rows16", "").replace(" one-by-one", "")
    peer = peer.replace(" softcap", "")
    a, b = ty.get(case), pt.get(case, pt.get(peer))
    if "-ld128 " in case and a is not None and b is None and "error" not in a:
        # A layout PyTorch's matmul does not offer (padded output rows): Trainyard's own figure.
        print("| %s | %s | %.4f | | %s | | %s | | Trainyard only |"
              % (case, a["shape"], a["median_ms"], achieved(a),
                 "%.0f%%" % (100 * a["of_peak"]) if a.get("of_peak") else ""))
        continue
    if a is None or b is None or "error" in a or "error" in b:
        why = [("%s: %s" % (n, r.get("error", "")) if r else "%s: missing" % n)
               for n, r in (("trainyard", a), ("pytorch", b)) if not r or "error" in r]
        print("| %s | %s | | | | | | | %s |" % (case, (a or b).get("shape", ""), "; ".join(why)))
        status = 1
        continue
    if abs(a["flop"] - b["flop"]) > 1e-6 * max(a["flop"], 1) or \
            abs(a["bytes"] - b["bytes"]) > 1e-6 * max(a["bytes"], 1):
        sys.stderr.write("run_gpu_vs_torch: %s: the two engines count different work "
                         "(flop %s vs %s, bytes %s vs %s)\n"
                         % (case, a["flop"], b["flop"], a["bytes"], b["bytes"]))
        status = 1
    ratio = b["median_ms"] / a["median_ms"]
    goal = ""
    if case.endswith("/attention fwd+bwd") or case.endswith("/attention fwd+bwd atomic-dq"):
        goal = "goal >= 1.0x: %s" % ("met" if ratio >= 1.0 else "NOT met")
    print("| %s | %s | %.4f | %.4f | %s | %s | %s | %.2fx | %s |"
          % (case, a["shape"], a["median_ms"], b["median_ms"], achieved(a), achieved(b),
             of_peak(a, b), ratio, goal))
gqa = sorted({r.get("gqa") for r in pt.values() if r.get("gqa")})
print()
print("ratio = pytorch ms / trainyard ms (above 1: Trainyard is faster). of peak = the rate "
      "over the device's dense bf16 peak (TFLOP/s rows) or memory bandwidth (GB/s rows): how "
      "far each engine is from the row's floor. PyTorch GQA: %s." % (", ".join(gqa) or "n/a"))
sys.exit(status)
PYEOF
fi

if [[ "$PART" != kernels ]]; then
  # preset | seq | batch
  CONFIGS=("gpt2-124m|1024|16" "llama-1b|2048|4")
  : >"$WORK/train.tsv"
  for entry in "${CONFIGS[@]}"; do
    IFS='|' read -r preset seq batch <<<"$entry"
    common=(--preset "$preset" --seq "$seq" --batch "$batch" --micro-batch "$batch"
            --steps "$STEPS" --warmup "$WARMUP" ${PEAK_ARGS[@]+"${PEAK_ARGS[@]}"})
    run "trainyard $preset" "$WORK/t_ty" "${TRAINYARD_ENV[@]}" \
      "$BIN_DIR/trainyard-bench-gpu-train" "${common[@]}"
    run "pytorch $preset" "$WORK/t_pt" "$PY" "$HERE/torch_gpu_train.py" "${common[@]}" \
      --compile "$COMPILE"
    # The same step with attention's dQ summed by atomics, beside the same PyTorch run.
    run "trainyard $preset atomic-dq" "$WORK/t_tya" "${TRAINYARD_ENV[@]}" \
      "$BIN_DIR/trainyard-bench-gpu-train" "${common[@]}" --atomic-dq
    # And with the linear layers in FP8 (beside the same bf16 PyTorch run; its final loss beside
    # the bf16 run's in the JSON).
    run "trainyard $preset fp8" "$WORK/t_tyf" "${TRAINYARD_ENV[@]}" \
      "$BIN_DIR/trainyard-bench-gpu-train" "${common[@]}" --fp8
    # row | engine | the run whose JSON line it is
    for line in "$preset|ty|ty" "$preset|pt|pt" "$preset atomic-dq|ty|tya" \
        "$preset atomic-dq|pt|pt" "$preset fp8|ty|tyf" "$preset fp8|pt|pt"; do
      IFS="|" read -r row engine from <<<"$line"
      json="$(grep '^{' "$WORK/t_$from" | tail -n 1)"
      [[ -n "$json" ]] || json='{}'
      printf '%s\t%s\t%s\n' "$row" "$engine" "$json" >>"$WORK/train.tsv"
    done
  done
  "$PY" - "$WORK/train.tsv" "$STEPS" "$WARMUP" "$COMPILE" <<'PYEOF' || FAILED=1
import json
import sys

path, steps, warmup, compile_mode = sys.argv[1:]
runs = {}
for line in open(path, encoding="utf-8"):
    preset, engine, text = line.rstrip("\n").split("\t", 2)
    try:
        runs.setdefault(preset, {})[engine] = json.loads(text)
    except ValueError:
        runs.setdefault(preset, {})[engine] = {}
print()
print("### Training step (median of %s steps after %s warm-up; PyTorch torch.compile mode %s)"
      % (steps, warmup, compile_mode))
print()
print("| preset | params | tokens/step | trainyard tok/s | pytorch tok/s | ratio | goal "
      "| trainyard MFU | pytorch MFU | MFU goal | trainyard ms | pytorch ms |")
print("|---|---:|---:|---:|---:|---:|---|---:|---:|---|---:|---:|")
status = 0
for preset, r in runs.items():
    a, b = r.get("ty", {}), r.get("pt", {})
    if "tokens_per_s" not in a or "tokens_per_s" not in b:
        missing = [n for n, x in (("trainyard", a), ("pytorch", b)) if "tokens_per_s" not in x]
        print("| %s | | | | | | %s: failed or not run (see the log) | | | | | |"
              % (preset, " and ".join(missing)))
        status = 1
        continue
    if a["params"] != b["params"]:
        sys.stderr.write("run_gpu_vs_torch: %s: trainyard has %d parameters, pytorch %d: not the "
                         "same model\n" % (preset, a["params"], b["params"]))
        status = 1
    ratio = a["tokens_per_s"] / b["tokens_per_s"]
    goal = "goal >= 1.1x: %s" % ("met" if ratio >= 1.1 else "NOT met")
    mfu_goal = ""
    if preset == "gpt2-124m":
        mfu_goal = ">= 50%%: %s" % ("met" if a["mfu"] >= 0.5 else "NOT met")
    print("| %s | %s | %d | %.0f | %.0f | %.2fx | %s | %.1f%% | %.1f%% | %s | %.2f | %.2f |"
          % (preset, format(a["params"], ","), a["tokens_per_step"], a["tokens_per_s"],
             b["tokens_per_s"], ratio, goal, 100 * a["mfu"], 100 * b["mfu"], mfu_goal,
             a["median_step_ms"], b["median_step_ms"]))
print()
print("ratio = trainyard tok/s / pytorch tok/s. MFU = (6N + 12·L·H·Q·T) FLOPs per token x tok/s "
      "over the dense bf16 peak (%s TFLOP/s), N = every parameter, embeddings included (PaLM; "
      "nanoGPT's estimate_mfu). Counting only multiplied parameters (no position table, no "
      "untied input embedding): %s."
      % (next(iter(runs.values())).get("ty", {}).get("peak_tflops", "?"),
         "; ".join("%s trainyard %.1f%% / pytorch %.1f%%"
                   % (p, 100 * r["ty"]["mfu_matmul_params"], 100 * r["pt"]["mfu_matmul_params"])
                   for p, r in runs.items()
                   if "mfu_matmul_params" in r.get("ty", {}) and
                   "mfu_matmul_params" in r.get("pt", {})) or "n/a"))
fp8 = ["%s %.4f (bf16 %.4f)" % (p, r["ty"]["final_loss"], runs[p[:-4]]["ty"]["final_loss"])
       for p, r in runs.items() if p.endswith(" fp8") and "final_loss" in r.get("ty", {})
       and "final_loss" in runs.get(p[:-4], {}).get("ty", {})]
if fp8:
    print("FP8 rows: the linear layers' GEMMs in FP8, MFU still against the bf16 peak; the last "
          "step's training loss on the same random tokens: %s." % "; ".join(fp8))
sys.exit(status)
PYEOF
fi
exit $FAILED
