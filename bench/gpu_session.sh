#!/usr/bin/env bash
# One GPU session from a bundle made by tools/gpu-bundle.sh: the GPU tests, then the benchmarks
# side by side with PyTorch, within a fixed time (about 8.5 minutes by default).
#
# Usage (on the GPU machine): BUNDLE/bench/gpu_session.sh
# Writes to $OUT (default BUNDLE/out):
#   session.txt         nvidia-smi, versions, how long each phase took
#   gpu_tests.txt       every GPU test binary's output, then a pass/fail summary
#   gpu_bench.txt       the side-by-side tables (Markdown)
#   gpu_bench_raw.txt   every benchmark program's own output
#   timeline.md         per-kernel account of both presets' steps, Trainyard beside PyTorch (and
#                       Trainyard's Llama step with FP8 linear layers)
#   timelines.tar.xz    the raw timelines it was made from (bench/timeline_report.py reads them)
# Environment (seconds; defaults in brackets): TESTS_BUDGET_S [150] for all tests together,
# KERNELS_BUDGET_S [140], TRAIN_BUDGET_S [220], TIMELINE_BUDGET_S [160]; REPS [20], KERNEL_WARMUP [3], STEPS [10],
# WARMUP [3], COMPILE [regional] (PyTorch's torch.compile mode, see bench/torch_gpu_train.py:
# whole-model compilation of two models does not fit the time), PEAK_TFLOPS [from the device];
# PYTHON [python3]; CUDA_HOME [/usr/local/cuda]; PARTS [tests kernels train timeline]: which run
# (a session split over two leases runs some in each); ONLY_TESTS [all]: test names to run.
# Exit status: 0 when every test passed and every benchmark ran, 1 otherwise.
set -uo pipefail

BUNDLE="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${OUT:-$BUNDLE/out}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
PARTS=" ${PARTS:-tests kernels train timeline} "
TESTS_BUDGET_S="${TESTS_BUDGET_S:-150}"
KERNELS_BUDGET_S="${KERNELS_BUDGET_S:-140}"
TRAIN_BUDGET_S="${TRAIN_BUDGET_S:-220}"
TIMELINE_BUDGET_S="${TIMELINE_BUDGET_S:-160}"

# The libraries the bundler copied (the large ones arrive xz-compressed: unpacked here, with
# Python's lzma, which every Python has), then CUDA's, then NCCL from PyTorch's wheel: for our
# binaries only (Python keeps its own libstdc++ and friends).
UNPACKED="$(mktemp -d "${TMPDIR:-/tmp}/trainyard-gpu-libs.XXXXXX")"
TIMELINES=""  # the timeline part's records, removed on any exit as the libraries are
trap 'rm -rf "$UNPACKED" ${TIMELINES:+"$TIMELINES"}' EXIT
unpack() {  # packed.xz destination; nothing is left at the destination when it fails
  "$PY" -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' \
    "$1" "$2" || { echo "cannot unpack $1" >&2; rm -f "$2"; }
}
for packed in "$BUNDLE"/lib/*.xz; do
  [[ -f "$packed" ]] && unpack "$packed" "$UNPACKED/$(basename "$packed" .xz)"
done
# The programs, the large ones unpacked beside the small ones.
BIN="$UNPACKED/bin"
mkdir -p "$BIN"
for program in "$BUNDLE"/bin/*; do
  [[ -f "$program" ]] || continue
  case "$program" in
    *.xz) unpack "$program" "$BIN/$(basename "$program" .xz)" ;;
    *) cp "$program" "$BIN/" ;;
  esac
done
chmod +x "$BIN"/* 2>/dev/null
# NCCL's folder inside PyTorch's nvidia-nccl wheel, wherever this version of it puts it.
NCCL_LIB="$("$PY" - 2>/dev/null <<'PYEOF' || true
import glob, os, site
dirs = []
try:
    import nvidia.nccl as nccl
    dirs += [os.path.join(p, "lib") for p in getattr(nccl, "__path__", [])]
except ImportError:
    pass
for sp in site.getsitepackages():
    dirs += [os.path.dirname(f) for f in
             glob.glob(os.path.join(sp, "nvidia", "**", "libnccl.so*"), recursive=True)]
print(next((d for d in dirs if glob.glob(os.path.join(d, "libnccl.so*"))), ""))
PYEOF
)"
LIBS="$BUNDLE/lib:$UNPACKED:${CUDA_HOME:-/usr/local/cuda}/lib64${NCCL_LIB:+:$NCCL_LIB}"
export TRAINYARD_LD_LIBRARY_PATH="$LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export TRAINYARD_BIN_DIR="$BIN"
export PYTHON="$PY"

SESSION="$OUT/session.txt"
{
  echo "# GPU session $(date -u '+%Y-%m-%d %H:%M:%S UTC') from $(basename "$BUNDLE")"
  cat "$BUNDLE/BUNDLE_INFO" 2>/dev/null
  nvidia-smi 2>&1 || echo "nvidia-smi failed"
  "$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "device", torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)' 2>&1
  echo "LD_LIBRARY_PATH for our binaries: $TRAINYARD_LD_LIBRARY_PATH"
} >"$SESSION"
cat "$SESSION"

# ---- GPU tests ------------------------------------------------------------------------------
TESTS_LOG="$OUT/gpu_tests.txt"
: >"$TESTS_LOG"
passed=() failed=() skipped=() not_run=()
work="$(mktemp -d "${TMPDIR:-/tmp}/trainyard-gpu-tests.XXXXXX")"
start=$SECONDS
while read -r test; do
  [[ -n "$test" && "$PARTS" == *" tests "* ]] || continue
  [[ -z "${ONLY_TESTS:-}" || " $ONLY_TESTS " == *" $test "* ]] || continue
  left=$((TESTS_BUDGET_S - (SECONDS - start)))
  if [[ $left -lt 5 ]]; then
    not_run+=("$test")
    continue
  fi
  t0=$SECONDS rc=0
  (cd "$work" && LD_LIBRARY_PATH="$TRAINYARD_LD_LIBRARY_PATH" \
    timeout --kill-after=5 "$left" "$BIN/$test" --gtest_color=no) >"$work/log" 2>&1 || rc=$?
  { echo "===== $test (at most ${left}s)"; cat "$work/log"
    echo "===== $test: exit $rc after $((SECONDS - t0))s"; } >>"$TESTS_LOG"
  if [[ $rc -ne 0 ]]; then
    failed+=("$test (exit $rc$([[ $rc -eq 124 || $rc -eq 137 ]] && echo ', timed out'))")
  elif grep -q '^\[  SKIPPED \]' "$work/log"; then
    skipped+=("$test")  # passed, but some of its tests skipped (no device?)
  else
    passed+=("$test")
  fi
done <"$BUNDLE/gpu_tests.list"
rm -rf "$work"
{
  echo
  echo "===== summary: ${#passed[@]} passed, ${#skipped[@]} passed with skips, ${#failed[@]} failed, ${#not_run[@]} not run (budget ${TESTS_BUDGET_S}s, used $((SECONDS - start))s)"
  for t in ${passed[@]+"${passed[@]}"}; do echo "PASS  $t"; done
  for t in ${skipped[@]+"${skipped[@]}"}; do echo "SKIP  $t (some tests skipped)"; done
  for t in ${failed[@]+"${failed[@]}"}; do echo "FAIL  $t"; done
  for t in ${not_run[@]+"${not_run[@]}"}; do echo "NOT RUN  $t (out of time)"; done
} | tee -a "$TESTS_LOG" | tee -a "$SESSION"

# ---- Benchmarks -----------------------------------------------------------------------------
BENCH="$OUT/gpu_bench.txt" RAW="$OUT/gpu_bench_raw.txt"
: >"$BENCH"
: >"$RAW"
peak=()
[[ -n "${PEAK_TFLOPS:-}" ]] && peak=(--peak-tflops "$PEAK_TFLOPS")
bench_status=0
t0=$SECONDS
if [[ "$PARTS" == *" kernels "* ]]; then
  "$BUNDLE/bench/run_gpu_vs_torch.sh" --part kernels --reps "${REPS:-20}" \
    --kernel-warmup "${KERNEL_WARMUP:-3}" --budget-s "$KERNELS_BUDGET_S" ${peak[@]+"${peak[@]}"} \
    >>"$BENCH" 2>>"$RAW" || bench_status=1
fi
echo "kernels benchmark: $((SECONDS - t0))s" >>"$SESSION"
t0=$SECONDS
if [[ "$PARTS" == *" train "* ]]; then
  "$BUNDLE/bench/run_gpu_vs_torch.sh" --part train --steps "${STEPS:-10}" --warmup "${WARMUP:-3}" \
    --compile "${COMPILE:-regional}" --budget-s "$TRAIN_BUDGET_S" ${peak[@]+"${peak[@]}"} \
    >>"$BENCH" 2>>"$RAW" || bench_status=1
fi
echo "training benchmark: $((SECONDS - t0))s" >>"$SESSION"

# ---- Per-kernel timelines (3 recorded steps after 3 warm-up, each engine, both presets) -----
t0=$SECONDS
if [[ "$PARTS" == *" timeline "* ]]; then
  TIMELINES="$(mktemp -d "${TMPDIR:-/tmp}/trainyard-timeline.XXXXXX")"
  tl=$TIMELINES
  # Last, Trainyard alone with its linear layers in FP8 (the report sets it beside the two
  # bf16 runs of its preset): where the quantization's time goes.
  for entry in "gpt2-124m 1024 16" "llama-1b 2048 4" "llama-1b 2048 4 fp8"; do
    read -r preset seq batch variant <<<"$entry"
    args=(--preset "$preset" --seq "$seq" --batch "$batch" --steps 3 --warmup 3
          ${peak[@]+"${peak[@]}"})
    left=$((TIMELINE_BUDGET_S - (SECONDS - t0)))
    ((left > 0)) || break  # (timeout 0 would mean no limit)
    LD_LIBRARY_PATH="$TRAINYARD_LD_LIBRARY_PATH" timeout "$left" \
      "$BIN/trainyard-bench-gpu-train" "${args[@]}" ${variant:+"--$variant"} \
      --timeline "$tl/trainyard-${variant:+$variant-}$preset.json" >>"$RAW" 2>&1 || bench_status=1
    [[ -z "$variant" ]] || continue  # a variant runs beside the preset's PyTorch run above
    left=$((TIMELINE_BUDGET_S - (SECONDS - t0)))
    ((left > 0)) || break
    timeout "$left" "$PY" "$BUNDLE/bench/torch_gpu_train.py" "${args[@]}" \
      --compile "${COMPILE:-regional}" --timeline "$tl/pytorch-$preset.json" >>"$RAW" 2>&1 ||
      bench_status=1
  done
  "$PY" "$BUNDLE/bench/timeline_report.py" "$tl"/*.json >"$OUT/timeline.md" 2>>"$RAW" ||
    bench_status=1
  tar -C "$tl" -cJf "$OUT/timelines.tar.xz" . 2>>"$RAW"
  rm -rf "$tl"
fi
echo "timelines: $((SECONDS - t0))s; whole session: ${SECONDS}s" >>"$SESSION"
cat "$BENCH"
tail -n 2 "$SESSION"

[[ ${#failed[@]} -eq 0 && ${#not_run[@]} -eq 0 && $bench_status -eq 0 ]]
