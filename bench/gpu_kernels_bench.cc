// Times Trainyard's CUDA kernels at the shapes of a GPT-2 124M (16 × 1024 tokens) and a Llama 1B
// (4 × 2048 tokens) training step, and prints a fixed-width table; with --json, each row is
// followed by its JSON line. bench/torch_gpu_kernels.py prints the same rows for PyTorch and
// bench/run_gpu_vs_torch.sh puts the two side by side.
//
//   trainyard-bench-gpu-kernels [--warmup 5] [--reps 30] [--model gpt2-124m|llama-1b|attn-d128]
//                               [--only SUBSTRING] [--json]
//
// Exit status: 0 when every case ran, 1 when one failed (its row says why), 2 on bad flags or
// without a usable GPU.
#include <cuda_runtime_api.h>

#include <cstdio>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "bench/device_peaks.h"
#include "bench/gpu_bench_util.h"
#include "bench/gpu_kernel_cases.h"
#include "common/device_probe.h"
#include "kernels/cuda/gemm.h"

namespace {

constexpr char kUsage[] =
    "usage: trainyard-bench-gpu-kernels [--warmup W] [--reps N] [--model NAME] "
    "[--only SUBSTRING] [--json]\n";

int Fail(const std::string& message, int code) {
  std::fprintf(stderr, "trainyard-bench-gpu-kernels: %s\n", message.c_str());
  if (code == 2) std::fputs(kUsage, stderr);
  return code;
}

struct Flags {
  int warmup = 5;
  int reps = 30;
  std::string model;  // empty: both
  std::string only;   // empty: every case
  bool json = false;
};

// Empty on success, otherwise what is wrong.
std::string ParseFlags(int argc, char** argv, Flags* flags) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--json") {
      flags->json = true;
      continue;
    }
    if (arg != "--model" && arg != "--only" && arg != "--warmup" && arg != "--reps") {
      return "unknown flag " + arg;
    }
    if (i + 1 >= argc) return arg + " needs a value";
    const std::string value = argv[++i];
    if (arg == "--model") {
      flags->model = value;
    } else if (arg == "--only") {
      flags->only = value;
    } else {
      int* target = arg == "--warmup" ? &flags->warmup : &flags->reps;
      if (!absl::SimpleAtoi(value, target) || *target < 0) return "bad value for " + arg;
    }
  }
  if (flags->reps < 1) return "--reps must be at least 1";
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  using namespace trainyard;
  Flags flags;
  if (std::string error = ParseFlags(argc, argv, &flags); !error.empty()) return Fail(error, 2);
  const DeviceInfo device = SystemDeviceProbe().Probe();
  if (device.count == 0) {
    return Fail("no usable CUDA device (" + device.why_none + "); this benchmark needs a GPU", 2);
  }
  bool model_known = flags.model.empty();
  for (const bench::BenchModel& m : bench::BenchModels()) model_known |= m.name == flags.model;
  if (!model_known) return Fail("unknown --model " + flags.model, 2);

  cudaStream_t stream = nullptr;
  if (cudaStreamCreate(&stream) != cudaSuccess) return Fail("cannot create a CUDA stream", 1);
  auto gemm = kernels::cuda::Gemm::Create();
  if (!gemm.ok()) return Fail(std::string(gemm.status().message()), 1);
  auto timer = bench::EventTimer::Create(flags.warmup, flags.reps);
  if (!timer.ok()) return Fail(std::string(timer.status().message()), 1);
  const bench::CaseContext ctx{.stream = stream, .timer = &*timer, .gemm = gemm->get()};

  std::printf("# device: %s (sm_%d); median of %d reps after %d warm-up, L2 flushed before each\n",
              device.name.c_str(), device.sm, flags.reps, flags.warmup);
  // "of peak": compute-bound rows against the dense bf16 peak, memory-bound ones against the
  // memory's bandwidth.
  const double peak_tflops = bench::PeakTflops(device.name).value_or(0.0);
  const double peak_bytes = bench::PeakBytesPerSecond().value_or(0.0);
  std::printf(
      "# peaks: %s bf16 TFLOP/s, %s GB/s memory\n",
      peak_tflops > 0 ? absl::StrCat(peak_tflops).c_str() : "unknown",
      peak_bytes > 0 ? absl::StrCat(static_cast<int64_t>(peak_bytes / 1e9)).c_str() : "unknown");
  bench::PrintTableHeader();
  std::vector<bench::Row> rows;
  for (const bench::BenchModel& model : bench::BenchModels()) {
    if (!flags.model.empty() && model.name != flags.model) continue;
    for (const bench::Case& c : bench::CasesFor(model)) {
      bench::Row row{.model = model.name, .kernel = c.kernel};
      if (!flags.only.empty() && !absl::StrContains(bench::RowKey(row), flags.only)) continue;
      if (absl::Status status = c.run(ctx, &row); !status.ok()) {
        row.error = status.ToString();
        // A failed launch can leave a sticky error; later cases report their own.
        cudaStreamSynchronize(stream);
        cudaGetLastError();
      }
      bench::SetOfPeak(&row, peak_tflops, peak_bytes);
      bench::PrintTableRow(row);
      // Each row's JSON right after it, so that a run stopped early still reports what it did.
      if (flags.json) bench::PrintJsonRow("trainyard", row);
      std::fflush(stdout);
      rows.push_back(row);
    }
  }
  gemm->reset();
  cudaStreamDestroy(stream);
  for (const bench::Row& row : rows) {
    if (!row.error.empty()) return 1;
  }
  return 0;
}
