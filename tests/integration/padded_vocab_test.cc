// The LM head padded to a multiple of 128 inside the chunked cross-entropy (as the CUDA backend
// runs it) is invisible: on the CPU backend, a run with the padding has the losses, gradient
// norms, evaluations, parameters and checkpoint of a run without it, and its activation memory is
// the planner's to the byte.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "common/filesystem.h"
#include "gtest/gtest.h"
#include "planner/memory_model.h"
#include "planner/rank_shape.h"
#include "tests/integration/test_env.h"
#include "worker/backend.h"
#include "worker/trainer.h"

namespace trainyard::worker {
namespace {

constexpr int64_t kPad = 128;

config::JobSpec Job(config::ModelFamily family, const std::string& checkpoints) {
  config::JobSpec spec;
  spec.name = "padded-vocab";
  spec.model = *config::Preset(family == config::ModelFamily::kGpt2 ? "gpt2-debug" : "llama-debug");
  spec.model.vocab = 200;  // padded to 256
  spec.model.max_seq = 32;
  spec.data.source = "markov";
  spec.data.markov.vocab = 200;
  spec.data.markov.train_tokens = 1 << 15;
  spec.data.markov.val_tokens = 1 << 12;
  spec.training.steps = 6;
  spec.training.batch = 8;
  spec.training.micro_batch = 4;  // two micro-batches: the head's gradient accumulates
  spec.training.seq_len = 32;
  spec.training.eval_every = 3;
  spec.training.eval_batches = 2;
  spec.checkpoint.dir = checkpoints;
  spec.checkpoint.every_steps = 3;
  spec.fault_tolerance.memory_every_steps = 0;
  return spec;
}

struct TrainedRun {
  absl::StatusOr<TrainResult> result;
  std::vector<float> params;
};

TrainedRun TrainWith(const config::JobSpec& spec, int64_t multiple) {
  auto backend = MakeCpuBackend(1, multiple);
  TrainedRun run;
  TrainOptions options;
  options.final_parameters = &run.params;
  run.result = Train(spec, *backend, options);
  return run;
}

double RelativeError(double got, double want) {
  return std::abs(got - want) / std::max(std::abs(want), 1e-12);
}

// The tensor shards of a checkpoint directory, by step and file name, with their sizes (the
// directory names also carry the job's signature, the manifests timings).
std::map<std::string, uintmax_t> Shards(const std::filesystem::path& dir) {
  std::map<std::string, uintmax_t> files;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (entry.is_regular_file() && name.starts_with("shard-")) {
      const std::string step = entry.path().parent_path().filename().string();
      files[step.substr(0, step.find('-', 5)) + "/" + name] = entry.file_size();
    }
  }
  return files;
}

class PaddedVocab : public ::testing::TestWithParam<config::ModelFamily> {};

TEST_P(PaddedVocab, TrainsAsTheUnpaddedModelDoes) {
  const std::filesystem::path scratch = testenv::MakeScratchDir("padded-vocab");
  const config::JobSpec plain = Job(GetParam(), (scratch / "plain").string());
  const config::JobSpec padded = Job(GetParam(), (scratch / "padded").string());
  const TrainedRun a = TrainWith(plain, 1), b = TrainWith(padded, kPad);
  ASSERT_TRUE(a.result.ok()) << a.result.status();
  ASSERT_TRUE(b.result.ok()) << b.result.status();

  ASSERT_EQ(a.result->train_losses.size(), b.result->train_losses.size());
  for (size_t i = 0; i < a.result->train_losses.size(); ++i) {
    EXPECT_LE(RelativeError(b.result->train_losses[i], a.result->train_losses[i]), 1e-6)
        << "step " << i + 1;
    EXPECT_LE(RelativeError(b.result->grad_norms[i], a.result->grad_norms[i]), 1e-6)
        << "step " << i + 1;
  }
  ASSERT_EQ(a.result->evals.size(), b.result->evals.size());
  for (size_t i = 0; i < a.result->evals.size(); ++i) {
    EXPECT_LE(RelativeError(b.result->evals[i].loss, a.result->evals[i].loss), 1e-6);
  }
  // The parameters the optimizer trained, the head's and the embedding's among them.
  ASSERT_EQ(a.params.size(), b.params.size());
  double worst = 0.0;
  for (size_t i = 0; i < a.params.size(); ++i) {
    worst = std::max(worst, std::abs(double{b.params[i]} - a.params[i]));
  }
  // AdamW's normalised update turns rounding in tiny gradients into parameter differences well
  // above it: 1e-5 against 6 steps at learning rate 3e-3.
  EXPECT_LE(worst, 1e-5);
  EXPECT_EQ(a.result->parameters, b.result->parameters);

  // The checkpoints hold the logical vocabulary: the same shards at the same sizes.
  const auto shards = Shards(scratch / "plain");
  EXPECT_EQ(shards.size(), 2u);
  EXPECT_EQ(shards, Shards(scratch / "padded"));

  // The padding's memory (the head's two fp32 copies and the wider logits) is the planner's.
  const planner::RankShape shape = planner::ShapeOf(padded, padded.parallelism, 0);
  const planner::BackendShape backend{
      .act_bytes = 4, .max_logits_chunk = int64_t{1} << 20, .logits_vocab_multiple = kPad};
  EXPECT_EQ(planner::PaddedHeadVocab(shape, backend), 256);
  EXPECT_EQ(b.result->memory.activations, planner::PredictRankMemory(shape, backend).activations);
  EXPECT_EQ(b.result->memory.activations - a.result->memory.activations,
            planner::PaddedHeadBytes(shape, backend) +
                (256 - 200) * int64_t{padded.training.micro_batch} * padded.training.seq_len * 4);

  // A checkpoint of the padded run resumes in an unpadded one.
  config::JobSpec resumed = plain;
  resumed.checkpoint.dir = (scratch / "resumed").string();
  resumed.checkpoint.resume_from = (scratch / "padded").string();
  resumed.training.steps = 8;
  const TrainedRun c = TrainWith(resumed, 1);
  ASSERT_TRUE(c.result.ok()) << c.result.status();
  EXPECT_EQ(c.result->first_step, 6);
}

INSTANTIATE_TEST_SUITE_P(Families, PaddedVocab,
                         ::testing::Values(config::ModelFamily::kGpt2, config::ModelFamily::kLlama),
                         [](const auto& info) { return config::FamilyName(info.param); });

}  // namespace
}  // namespace trainyard::worker
