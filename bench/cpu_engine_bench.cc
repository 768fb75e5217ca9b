// Times full training steps of the CPU engine (zero grads, forward, loss, backward, clip, AdamW)
// on random tokens, and prints one JSON line. bench/run_cpu_vs_torch.sh runs it side by side with
// the PyTorch peer.
//
//   trainyard-bench-cpu --preset gpt2-debug --batch 8 --seq 64 --steps 20 --warmup 3 --threads 2
//   trainyard-bench-cpu --preset llama-debug --max-seq 2048 --window 256 --batch 1 --seq 2048 ...
//   trainyard-bench-cpu --threads 2 --gemm-peak     (the machine's SGEMM GFLOP/s, for scale)
// --max-seq and --window set the preset's model.max_seq and model.sliding_window; --documents D
// packs each sequence with documents of D tokens (model.document_token 0 begins each; the other
// tokens are drawn from the rest of the vocabulary).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "config/model_config.h"
#include "worker/backend.h"
#include "worker/local_model.h"
#include "worker/optimizer.h"

namespace {

int Fail(const std::string& message) {
  std::fprintf(stderr,
               "trainyard-bench-cpu: %s\nusage: trainyard-bench-cpu --preset NAME "
               "--batch B --seq T --steps N --warmup W --threads K [--max-seq S] [--window W] "
               "[--documents D] [--recompute]\n",
               message.c_str());
  return 2;
}

// The machine's practical fp32 ceiling: the median GFLOP/s of a 2048³ OpenBLAS SGEMM.
int GemmPeak(int threads) {
  auto backend = trainyard::worker::MakeCpuBackend(threads);
  const int64_t n = 2048;
  std::vector<float> host(n * n, 0.5f), b(n * n, 0.25f);
  auto a = backend->AllocAct(n * n), c = backend->AllocAct(n * n);
  backend->CopyActFromHost(a.data(), host.data(), n * n);
  std::vector<double> gflops;
  for (int rep = 0; rep < 5; ++rep) {
    const auto start = std::chrono::steady_clock::now();
    backend->Linear(c.data(), a.data(), b.data(), nullptr, n, n, n);
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    gflops.push_back(2.0 * n * n * n / s / 1e9);
  }
  std::sort(gflops.begin(), gflops.end());
  std::printf("{\"sgemm_2048_gflops\":%.1f}\n", gflops[gflops.size() / 2]);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace trainyard;
  std::string preset = "gpt2-debug";
  int batch = 8, seq = 64, steps = 20, warmup = 3, threads = 0, max_seq = 0, window = 0,
      documents = 0;
  bool recompute = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--recompute") {
      recompute = true;
      continue;
    }
    if (arg == "--gemm-peak") return GemmPeak(threads);
    if (i + 1 >= argc) return Fail(arg + " needs a value");
    const std::string value = argv[++i];
    int* target = arg == "--batch"       ? &batch
                  : arg == "--seq"       ? &seq
                  : arg == "--steps"     ? &steps
                  : arg == "--warmup"    ? &warmup
                  : arg == "--threads"   ? &threads
                  : arg == "--max-seq"   ? &max_seq
                  : arg == "--window"    ? &window
                  : arg == "--documents" ? &documents
                                         : nullptr;
    if (arg == "--preset") {
      preset = value;
    } else if (target == nullptr || !absl::SimpleAtoi(value, target) || *target < 0) {
      return Fail("bad flag " + arg + " " + value);
    }
  }
  auto config = config::Preset(preset);
  if (!config.ok()) return Fail(std::string(config.status().message()));
  config->recompute = recompute;
  if (max_seq > 0) config->max_seq = max_seq;
  config->sliding_window = window;
  if (documents > 0) config->document_token = 0;
  if (absl::Status valid = config::ValidateModelConfig(*config, "model"); !valid.ok()) {
    return Fail(std::string(valid.message()));
  }
  if (seq > config->max_seq) return Fail("--seq exceeds the model's max_seq");
  if (steps < 1 || batch < 1) return Fail("--steps and --batch must be positive");

  auto backend = worker::MakeCpuBackend(threads);
  auto model_or = worker::LocalModel::Create(*config, backend.get());
  if (!model_or.ok()) return Fail(std::string(model_or.status().message()));
  worker::LocalModel& model = **model_or;
  model.InitParameters(1);
  worker::OptimizerConfig opt_config;
  opt_config.lr = 1e-4;
  opt_config.total_steps = warmup + steps;
  worker::AdamW optimizer(opt_config, model.layout(), backend.get());

  const int64_t tokens = int64_t{batch} * seq;
  std::vector<int32_t> inputs(tokens), targets(tokens);
  std::mt19937 rng(7);
  std::vector<double> times_ms;
  for (int step = 0; step < warmup + steps; ++step) {
    for (int64_t i = 0; i < tokens; ++i) {
      inputs[i] = static_cast<int32_t>(rng() % config->vocab);
      targets[i] = static_cast<int32_t>(rng() % config->vocab);
      if (documents > 0) {
        inputs[i] = i % seq % documents == 0 ? 0 : 1 + inputs[i] % (config->vocab - 1);
      }
    }
    const auto start = std::chrono::steady_clock::now();
    model.ZeroGradients();
    auto loss = model.ForwardBackward(inputs.data(), targets.data(), batch, seq, 1.0f / tokens);
    if (!loss.ok()) return Fail(std::string(loss.status().message()));
    optimizer.ClipGradients(model.grads());
    optimizer.Step(model.params(), model.grads(), step);
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    if (step >= warmup) times_ms.push_back(ms);
  }
  std::sort(times_ms.begin(), times_ms.end());
  const double median = times_ms[times_ms.size() / 2];
  // PaLM's count: 6 FLOPs per matmul parameter per token (forward and backward), plus the
  // attention score and value products, 12 · layers · seq · width per token (with a sliding
  // window, ModelConfig::AttendedSpan in place of seq; with documents of D tokens, of D).
  const int64_t span = documents > 0 ? std::min(documents, seq) : seq;
  const config::ModelConfig& c = *config;
  const int64_t attn = int64_t{c.heads} * c.head_dim();
  const int64_t fc = c.family == config::ModelFamily::kGpt2 ? c.ffn_hidden : 2 * c.ffn_hidden;
  const int64_t matmul_params = c.layers * (int64_t{c.qkv_width()} * c.width + c.width * attn +
                                            fc * c.width + int64_t{c.width} * c.ffn_hidden) +
                                int64_t{c.vocab} * c.width;
  const double flop_per_step =
      static_cast<double>(tokens) *
      (6.0 * matmul_params + 12.0 * c.layers * c.AttendedSpan(span) * c.width);
  std::printf(
      "{\"engine\":\"trainyard\",\"tokens_per_s\":%.1f,\"median_step_ms\":%.3f,"
      "\"steps\":%d,\"params\":%lld,\"gflop_per_step\":%.4f}\n",
      tokens / (median / 1e3), median, steps, static_cast<long long>(model.num_params()),
      flop_per_step / 1e9);
  return 0;
}
