// Times full training steps of the CPU engine (zero grads, forward, loss, backward, clip, AdamW)
// on random tokens, and prints one JSON line. bench/run_cpu_vs_torch.sh runs it side by side with
// the PyTorch peer.
//
//   trainyard-bench-cpu --preset gpt2-debug --batch 8 --seq 64 --steps 20 --warmup 3 --threads 2
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
#include "worker/model.h"
#include "worker/optimizer.h"

namespace {

int Fail(const std::string& message) {
  std::fprintf(stderr, "trainyard-bench-cpu: %s\nusage: trainyard-bench-cpu --preset NAME "
               "--batch B --seq T --steps N --warmup W --threads K [--recompute]\n",
               message.c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace trainyard;
  std::string preset = "gpt2-debug";
  int batch = 8, seq = 64, steps = 20, warmup = 3, threads = 0;
  bool recompute = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--recompute") {
      recompute = true;
      continue;
    }
    if (i + 1 >= argc) return Fail(arg + " needs a value");
    const std::string value = argv[++i];
    int* target = arg == "--batch"     ? &batch
                  : arg == "--seq"     ? &seq
                  : arg == "--steps"   ? &steps
                  : arg == "--warmup"  ? &warmup
                  : arg == "--threads" ? &threads
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
  if (seq > config->max_seq) return Fail("--seq exceeds the preset's max_seq");
  if (steps < 1 || batch < 1) return Fail("--steps and --batch must be positive");

  auto backend = worker::MakeCpuBackend(threads);
  auto model_or = worker::Model::Create(*config, backend.get());
  if (!model_or.ok()) return Fail(std::string(model_or.status().message()));
  worker::Model& model = **model_or;
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
  std::printf("{\"engine\":\"trainyard\",\"tokens_per_s\":%.1f,\"median_step_ms\":%.3f,"
              "\"steps\":%d,\"params\":%lld}\n",
              tokens / (median / 1e3), median, steps, static_cast<long long>(model.num_params()));
  return 0;
}
