// Whole training steps on the CUDA backend (bf16 activations, fp32 master weights): the
// training loop of a real job (data → forward/backward → clip → AdamW) on a shard of random
// tokens, and the model FLOPs utilisation it reaches. bench/torch_gpu_train.py is the PyTorch
// peer; bench/run_gpu_vs_torch.sh runs the two side by side.
//
//   trainyard-bench-gpu-train --preset gpt2-124m --seq 1024 --batch 16 [--micro-batch 16]
//                             [--steps 10] [--warmup 3] [--peak-tflops X] [--recompute]
//                             [--atomic-dq] [--fp8] [--timeline FILE]
//   (--atomic-dq: attention's query gradient summed with atomics, FlashAttention-2's way,
//   instead of the deterministic pass; --fp8: the linear layers' GEMMs in FP8 with per-tensor
//   current scaling, sm_89 and later; see CudaBackendOptions)
//   trainyard-bench-gpu-train --cpu --preset gpt2-debug --peak-tflops 1   (checks the harness
//                                                     itself on the CPU backend, without a GPU)
//
// Prints a summary, then one JSON line. Model FLOPs per token follow PaLM (appendix B):
// 6·N + 12·L·H·Q·T, with N every trainable parameter, embeddings included (a tied embedding
// counted once). That is nanoGPT's estimate_mfu, except that nanoGPT leaves out the position
// table (0.8M parameters for GPT-2 124M, under 1% of N). Lookup tables do no matmul, so the
// JSON also gives mfu_matmul_params, with N less the position table and an untied input
// embedding (for Llama 1B, 263M of its 1.50B parameters). MFU is against the device's dense
// bf16 peak: H100 SXM (HBM3) 989 TFLOP/s, H100 PCIe 756, H100 NVL 835, H200 989; other devices
// need --peak-tflops.
//
// --timeline FILE records every kernel, copy and fill of the measured steps with CUPTI and
// writes them as JSON (bench/timeline_report.py sets them beside PyTorch's); recording costs
// some speed, so the step times of such a run are not the benchmark's.
#include <stdlib.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "bench/device_peaks.h"
#include "common/device_probe.h"
#include "common/status.h"
#ifdef TRAINYARD_HAVE_CUPTI
#include "bench/gpu_timeline.h"
#endif
#include "config/spec.h"
#include "worker/cuda_backend.h"
#include "worker/data/bin_shards.h"
#include "worker/trainer.h"

namespace {

using trainyard::config::ModelConfig;

int Fail(const std::string& message, int code = 2) {
  std::fprintf(stderr, "trainyard-bench-gpu-train: %s\n", message.c_str());
  if (code == 2) {
    std::fputs(
        "usage: trainyard-bench-gpu-train --preset NAME [--seq T] [--batch B] [--micro-batch M] "
        "[--steps S] [--warmup W] [--peak-tflops X] [--recompute] [--atomic-dq] [--fp8] [--cpu] "
        "[--timeline FILE]\n",
        stderr);
  }
  return code;
}

struct Flags {
  std::string preset = "gpt2-124m";
  int seq = 0;    // 0: the preset's max_seq
  int batch = 0;  // 0: 16 for GPT-2 presets, 4 for Llama ones
  int micro_batch = 0;
  int steps = 10;
  int warmup = 3;
  double peak_tflops = 0.0;  // 0: from the device name
  bool recompute = false;
  bool cpu = false;        // the CPU backend: exercises this program where there is no GPU
  bool atomic_dq = false;  // attention's dQ summed with atomics (CudaBackendOptions)
  bool fp8 = false;        // FP8 linear layers (CudaBackendOptions::fp8_linear)
  std::string timeline;    // where the CUPTI records of the measured steps go; none when empty
};

std::string ParseFlags(int argc, char** argv, Flags* f) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--recompute" || arg == "--cpu" || arg == "--atomic-dq" || arg == "--fp8") {
      (arg == "--cpu"         ? f->cpu
       : arg == "--recompute" ? f->recompute
       : arg == "--fp8"       ? f->fp8
                              : f->atomic_dq) = true;
      continue;
    }
    if (i + 1 >= argc) return arg + " needs a value";
    const std::string value = argv[++i];
    int* target = arg == "--seq"           ? &f->seq
                  : arg == "--batch"       ? &f->batch
                  : arg == "--micro-batch" ? &f->micro_batch
                  : arg == "--steps"       ? &f->steps
                  : arg == "--warmup"      ? &f->warmup
                                           : nullptr;
    if (arg == "--preset") {
      f->preset = value;
    } else if (arg == "--timeline") {
      f->timeline = value;
    } else if (arg == "--peak-tflops") {
      if (!absl::SimpleAtod(value, &f->peak_tflops) || !(f->peak_tflops > 0)) {
        return "bad value for --peak-tflops";
      }
    } else if (target == nullptr) {
      return "unknown flag " + arg;
    } else if (!absl::SimpleAtoi(value, target) || *target < 0) {
      return "bad value for " + arg;
    }
  }
  if (f->steps < 1) return "--steps must be at least 1";
#ifndef TRAINYARD_HAVE_CUPTI
  if (!f->timeline.empty()) return "--timeline needs CUPTI, which this build was made without";
#endif
  if (!f->timeline.empty() && f->cpu) return "--timeline records the GPU; it has no --cpu form";
  if (f->atomic_dq && f->cpu) return "--atomic-dq chooses a GPU kernel; it has no --cpu form";
  if (f->fp8 && f->cpu) return "--fp8 chooses the GPU's FP8 GEMMs; it has no --cpu form";
  return "";
}

// A temporary directory holding one llm.c shard of uniformly random tokens, removed on
// destruction. Tokens are uint16, so a vocabulary over 65536 only sees its first 65536 ids;
// the model still computes every logit, so the work per step is unchanged.
class RandomShard {
 public:
  static std::optional<RandomShard> Create(int64_t tokens, int64_t vocab, uint64_t seed) {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern =
        std::string(tmp != nullptr && *tmp ? tmp : "/tmp") + "/trainyard-gpu-train.XXXXXX";
    if (mkdtemp(pattern.data()) == nullptr) return std::nullopt;
    RandomShard shard(pattern);
    std::vector<int32_t> header(trainyard::worker::kBinShardHeaderInts, 0);
    header[0] = trainyard::worker::kBinShardMagic;
    header[1] = trainyard::worker::kBinShardVersion;
    header[2] = static_cast<int32_t>(tokens);
    const uint64_t bound = static_cast<uint64_t>(std::min<int64_t>(vocab, 65536));
    std::vector<uint16_t> body(tokens);
    uint64_t state = seed;
    for (uint16_t& token : body) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      token = static_cast<uint16_t>((state >> 33) % bound);
    }
    std::ofstream out(shard.path(), std::ios::binary);
    out.write(reinterpret_cast<const char*>(header.data()), header.size() * sizeof(int32_t));
    out.write(reinterpret_cast<const char*>(body.data()), body.size() * sizeof(uint16_t));
    if (!out.good()) return std::nullopt;
    return shard;
  }
  RandomShard(RandomShard&& other) noexcept : dir_(std::move(other.dir_)) { other.dir_.clear(); }
  RandomShard(const RandomShard&) = delete;
  ~RandomShard() {
    std::error_code ignored;
    if (!dir_.empty()) std::filesystem::remove_all(dir_, ignored);
  }
  std::string path() const { return dir_ + "/train.bin"; }

 private:
  explicit RandomShard(std::string dir) : dir_(std::move(dir)) {}
  std::string dir_;
};

trainyard::config::JobSpec BenchSpec(const ModelConfig& model, const Flags& f,
                                     const std::string& data_path) {
  trainyard::config::JobSpec spec;
  spec.name = "gpu-train-bench";
  spec.model = model;
  spec.model.recompute = f.recompute;
  spec.data.source = "bin";
  spec.data.path = data_path;
  spec.data.val_fraction = 0.05;
  spec.resources.kind = trainyard::config::DeviceKind::kGpu;
  auto& t = spec.training;
  t.steps = f.warmup + f.steps;
  t.batch = f.batch;
  t.micro_batch = f.micro_batch;
  t.seq_len = f.seq;
  t.seed = 1;
  t.lr = 3e-4;
  t.warmup_steps = 0;
  t.schedule = "constant";
  t.weight_decay = 0.1;
  t.grad_clip = 1.0;
  t.eval_every = 0;
  t.log_every = t.steps;
  return spec;
}

// Parameters that are looked up rather than multiplied: the position table, and the token
// embedding when the LM head does not share it.
int64_t LookupOnlyParameters(const ModelConfig& c) {
  int64_t n = 0;
  if (c.family == trainyard::config::ModelFamily::kGpt2) n += int64_t{c.max_seq} * c.width;
  if (!c.tied_embeddings) n += int64_t{c.vocab} * c.width;
  return n;
}

// Trains; with --timeline, records the steps after the warm-up and writes their records.
absl::StatusOr<trainyard::worker::TrainResult> RunSteps(const trainyard::config::JobSpec& spec,
                                                        trainyard::worker::Backend& backend,
                                                        const Flags& f) {
  if (f.timeline.empty()) return trainyard::worker::Train(spec, backend, {.progress = &std::cerr});
#ifdef TRAINYARD_HAVE_CUPTI
  TY_ASSIGN_OR_RETURN(auto timeline, trainyard::bench::KernelTimeline::Start());
  trainyard::worker::TrainOptions options{.progress = &std::cerr};
  options.on_step = [&](const trainyard::worker::StepReport& report) {
    if (report.step >= f.warmup) timeline->Mark();  // the end of a step is the next's start
    return absl::OkStatus();
  };
  TY_ASSIGN_OR_RETURN(auto result, trainyard::worker::Train(spec, backend, options));
  // The variant in the engine's name, so that the report sets it beside the plain run.
  const std::string engine = std::string("trainyard") + (f.fp8 ? " fp8" : "") +
                             (f.atomic_dq ? " atomic-dq" : "") + (f.recompute ? " recompute" : "");
  TY_ASSIGN_OR_RETURN(const std::string json, timeline->Finish(engine, f.preset));
  std::ofstream out(f.timeline, std::ios::trunc);
  out << json;
  if (!out.good()) return absl::UnavailableError("cannot write " + f.timeline);
  std::fprintf(stderr, "timeline of %d steps written to %s\n", timeline->marks() - 1,
               f.timeline.c_str());
  return result;
#else
  return absl::FailedPreconditionError("--timeline needs CUPTI");
#endif
}

}  // namespace

int main(int argc, char** argv) {
  using namespace trainyard;
  Flags f;
  if (std::string error = ParseFlags(argc, argv, &f); !error.empty()) return Fail(error);
  auto preset = config::Preset(f.preset);
  if (!preset.ok()) return Fail(std::string(preset.status().message()));
  const ModelConfig& mc = *preset;
  if (f.seq == 0) f.seq = mc.max_seq;
  if (f.batch == 0) f.batch = mc.family == config::ModelFamily::kGpt2 ? 16 : 4;
  if (f.micro_batch == 0) f.micro_batch = f.batch;

  DeviceInfo device;
  if (f.cpu) {
    device.name = "cpu";
  } else {
    device = SystemDeviceProbe().Probe();
    if (device.count == 0) {
      return Fail("no usable CUDA device (" + device.why_none + "); this benchmark needs a GPU");
    }
  }
  const std::optional<double> known_peak = bench::PeakTflops(device.name);
  const double peak = f.peak_tflops > 0 ? f.peak_tflops : known_peak.value_or(0.0);
  if (!(peak > 0)) {
    return Fail("no known bf16 peak for '" + device.name + "': pass --peak-tflops");
  }

  const int64_t tokens_per_step = int64_t{f.batch} * f.seq;
  auto shard =
      RandomShard::Create(std::max<int64_t>(int64_t{1} << 21, 40 * int64_t{f.seq}), mc.vocab, 7);
  if (!shard) return Fail("cannot write the token shard to a temporary directory", 1);
  const config::JobSpec spec = BenchSpec(mc, f, shard->path());
  if (absl::Status s = config::ValidateJobSpec(spec); !s.ok()) {
    return Fail(std::string(s.message()));
  }
  absl::StatusOr<std::unique_ptr<worker::Backend>> backend =
      f.cpu ? absl::StatusOr<std::unique_ptr<worker::Backend>>(worker::MakeCpuBackend(0))
            : worker::MakeCudaBackend({.device = 0,
                                       .act_dtype = DType::kBF16,
                                       .atomic_attention_dq = f.atomic_dq,
                                       .fp8_linear = f.fp8});
  if (!backend.ok()) return Fail(std::string(backend.status().message()), 1);
  auto result = RunSteps(spec, **backend, f);
  if (!result.ok()) return Fail(result.status().ToString(), 1);

  std::vector<double> times(result->step_seconds.begin() + f.warmup, result->step_seconds.end());
  std::sort(times.begin(), times.end());
  const double median_s = times[times.size() / 2];
  double mean_s = 0.0;
  for (double t : times) mean_s += t / times.size();
  const double tokens_per_s = tokens_per_step / median_s;
  const int64_t n = result->parameters;
  const double attention_flop = 12.0 * mc.layers * mc.heads * mc.head_dim() * f.seq;
  const double flop_per_token = 6.0 * n + attention_flop;
  const double matmul_flop_per_token = 6.0 * (n - LookupOnlyParameters(mc)) + attention_flop;
  const double achieved_tflops = flop_per_token * tokens_per_s / 1e12;
  const double mfu = achieved_tflops / peak;
  const double mfu_matmul = matmul_flop_per_token * tokens_per_s / 1e12 / peak;

  std::printf("%s on %s: batch %d (micro %d) x seq %d = %lld tokens/step, %lld parameters\n",
              f.preset.c_str(), device.name.c_str(), f.batch, f.micro_batch, f.seq,
              static_cast<long long>(tokens_per_step), static_cast<long long>(n));
  std::printf("median step %.2f ms over %d steps (after %d warm-up) | %.0f tokens/s\n",
              1e3 * median_s, f.steps, f.warmup, tokens_per_s);
  std::printf("%.3f GFLOP/token (6N + 12LHQT) | %.1f TFLOP/s | MFU %.1f%% of %.0f TFLOP/s\n",
              flop_per_token / 1e9, achieved_tflops, 100 * mfu, peak);
  std::printf(
      "{\"engine\":\"trainyard\",\"preset\":\"%s\",\"device\":\"%s\",\"batch\":%d,"
      "\"micro_batch\":%d,\"seq\":%d,\"steps\":%d,\"warmup\":%d,\"params\":%lld,"
      "\"tokens_per_step\":%lld,\"median_step_ms\":%.3f,\"mean_step_ms\":%.3f,"
      "\"tokens_per_s\":%.1f,\"flop_per_token\":%.6g,\"achieved_tflops\":%.2f,"
      "\"peak_tflops\":%.1f,\"mfu\":%.4f,\"mfu_matmul_params\":%.4f,\"final_loss\":%.4f}\n",
      f.preset.c_str(), device.name.c_str(), f.batch, f.micro_batch, f.seq, f.steps, f.warmup,
      static_cast<long long>(n), static_cast<long long>(tokens_per_step), 1e3 * median_s,
      1e3 * mean_s, tokens_per_s, flop_per_token, achieved_tflops, peak, mfu, mfu_matmul,
      result->train_losses.back());
  return 0;
}
