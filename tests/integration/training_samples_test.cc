// Samples while training (training.sample_every, worker/sampling.h). On every mesh kind — data
// parallel with ZeRO-3, tensor parallel with sequence parallelism, pipelines of 1F1B and of the
// interleaved schedule, context parallel and a dp × tp × pp mix — rank 0 prints a sample at every
// sample_every steps and at the last, and the last one is exactly what generation from the run's
// final parameters (put together independently of the gather) chooses: greedily, and drawn at a
// temperature with top-k from the same seed. Both model families, dense and mixture-of-experts
// (with expert parallelism).
//
// Ranks run as threads of this process (rank_threads.h).
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/escaping.h"
#include "gtest/gtest.h"
#include "tests/integration/global_params.h"
#include "tests/integration/mesh_cases.h"
#include "tests/integration/rank_threads.h"
#include "tests/integration/tokenizer_files.h"
#include "worker/backend.h"
#include "worker/generate.h"
#include "worker/sampling.h"
#include "worker/trainer.h"

namespace trainyard::worker {
namespace {

using config::ModelFamily;
using testenv::MeshCase;

const MeshCase kMeshes[] = {
    {.name = "dp2_zero3", .dp = 2, .zero = 3},
    {.name = "tp2_sp", .tp = 2, .sequence_parallel = true},
    {.name = "pp2", .pp = 2},
    {.name = "pp2_interleaved",
     .pp = 2,
     .schedule = testenv::kInterleaved,
     .virtual_stages = 2,
     .layers = 4},
    {.name = "cp2", .cp = 2},
    {.name = "dp2_tp2_pp2_zero1", .dp = 2, .tp = 2, .pp = 2, .zero = 1},
    // Mixture of experts: experts split over two data-parallel ranks (their ZeRO-3 shards over
    // the ranks holding the same experts), and with tp, pp and the selection bias.
    {.name = "moe_dp4_ep2_zero3", .dp = 4, .zero = 3, .experts = 4, .ep = 2},
    {.name = "moe_dp2_ep2_tp2_pp2",
     .dp = 2,
     .tp = 2,
     .pp = 2,
     .experts = 4,
     .bias_balance = true,
     .ep = 2},
};

struct Draw {
  const char* name;
  double temperature;
  int top_k;
  double top_p;
};
const Draw kDraws[] = {{"greedy", 0.0, 0, 1.0}, {"temperature", 0.9, 8, 0.9}};

config::JobSpec Job(ModelFamily family, const MeshCase& mesh, const Draw& draw) {
  config::JobSpec spec = testenv::DebugJob(family, mesh, /*max_seq=*/40);
  spec.name = "samples";
  spec.training.sample_every = 2;
  spec.training.sample_tokens = 20;
  spec.training.sample_temperature = draw.temperature;
  spec.training.sample_top_k = draw.top_k;
  spec.training.sample_top_p = draw.top_p;
  return spec;
}

// What generation from the run's final parameters chooses, those put back together from every
// rank's own parameters (global_params.h), not by the gather under test.
std::vector<int32_t> Expected(const config::JobSpec& spec, const testenv::RankRun& run,
                              const SamplePoint& sample) {
  const testenv::GlobalTensors global = testenv::GatherGlobalParams(spec, run);
  const ParameterLayout layout(spec.model);
  std::vector<float> whole(layout.total());
  for (const ParamTensor& t : layout.tensors()) {
    const std::vector<float>& values = global.at(t.name);
    std::copy(values.begin(), values.end(), whole.begin() + t.offset);
  }
  std::unique_ptr<Backend> backend = MakeCpuBackend(1);
  absl::StatusOr<std::unique_ptr<Generator>> generator =
      Generator::Create(spec.model, backend.get(), whole.data());
  EXPECT_TRUE(generator.ok()) << generator.status();
  if (!generator.ok()) return {};
  absl::StatusOr<std::vector<int32_t>> tokens =
      (*generator)->Generate(sample.prompt, SampleOptionsAt(spec.training, sample.step));
  EXPECT_TRUE(tokens.ok()) << tokens.status();
  return tokens.ok() ? *tokens : std::vector<int32_t>{};
}

class TrainingSamples : public ::testing::TestWithParam<std::tuple<ModelFamily, MeshCase, Draw>> {};

TEST_P(TrainingSamples, RankZeroSamplesTheModelAsItStands) {
  const auto [family, mesh, draw] = GetParam();
  const config::JobSpec spec = Job(family, mesh, draw);
  const testenv::RankRun run = testenv::RunRanks(spec);
  for (size_t r = 0; r < run.results.size(); ++r) {
    ASSERT_TRUE(run.results[r].ok()) << "rank " << r << ": " << run.results[r].status();
    if (r > 0) {
      EXPECT_TRUE(run.results[r]->samples.empty()) << "rank " << r;
    }
  }
  const std::vector<SamplePoint>& samples = run.results[0]->samples;
  ASSERT_EQ(samples.size(), 3u);  // steps 2, 4 and the last
  EXPECT_EQ(samples[0].step, 2);
  EXPECT_EQ(samples[1].step, 4);
  EXPECT_EQ(samples[2].step, 5);
  for (const SamplePoint& s : samples) {
    EXPECT_EQ(s.prompt.size(), size_t{config::kDefaultSamplePromptTokens});
    EXPECT_EQ(s.tokens.size(), size_t(spec.training.sample_tokens));
    EXPECT_EQ(s.prompt, samples[0].prompt) << "the default prompt is the validation split's start";
  }
  EXPECT_EQ(samples[2].tokens, Expected(spec, run, samples[2]));
}

INSTANTIATE_TEST_SUITE_P(
    Meshes, TrainingSamples,
    ::testing::Combine(::testing::Values(ModelFamily::kGpt2, ModelFamily::kLlama),
                       ::testing::ValuesIn(kMeshes), ::testing::ValuesIn(kDraws)),
    [](const auto& info) {
      return std::string(std::get<0>(info.param) == ModelFamily::kGpt2 ? "gpt2_" : "llama_") +
             std::get<1>(info.param).name + "_" + std::get<2>(info.param).name;
    });

// training.sample_tokenizer: the text prompt goes through it and the samples print through it.
// With a tokenizer that reverses the bytes, the prompt "hi" is ids 255 − 'h', 255 − 'i', and the
// run samples what the same prompt given as those ids samples.
TEST(TrainingSamplesThroughATokenizer, TheTextPromptIsTokenizedAndTheSamplesDecoded) {
  const std::filesystem::path dir = testenv::MakeScratchDir("sample_tokenizer");
  const std::string tokenizer = (dir / "tokenizer.json").string();
  std::ofstream(tokenizer) << testenv::ReversedBytesTokenizer();
  config::JobSpec text = Job(ModelFamily::kGpt2, MeshCase{.name = "dp2", .dp = 2}, kDraws[1]);
  text.model.vocab = 256;
  text.training.sample_prompt = "hi";
  text.training.sample_tokenizer = tokenizer;
  config::JobSpec ids = text;
  ids.training.sample_prompt.clear();
  ids.training.sample_tokenizer.clear();
  ids.training.sample_prompt_tokens = {255 - 'h', 255 - 'i'};

  const testenv::RankRun by_text = testenv::RunRanks(text);
  const testenv::RankRun by_ids = testenv::RunRanks(ids);
  ASSERT_TRUE(by_text.results[0].ok()) << by_text.results[0].status();
  ASSERT_TRUE(by_ids.results[0].ok()) << by_ids.results[0].status();
  const std::vector<SamplePoint>& samples = by_text.results[0]->samples;
  ASSERT_EQ(samples.size(), 3u);
  for (size_t i = 0; i < samples.size(); ++i) {
    EXPECT_EQ(samples[i].prompt, ids.training.sample_prompt_tokens);
    EXPECT_EQ(samples[i].tokens, by_ids.results[0]->samples[i].tokens) << "sample " << i;
  }
  auto loaded = data::Tokenizer::Parse(testenv::ReversedBytesTokenizer(), "tokenizer.json");
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  std::string continuation;
  for (int32_t id : samples[2].tokens) continuation += static_cast<char>(255 - id);
  EXPECT_EQ(SampleLine(5, samples[2].prompt, samples[2].tokens, 256, loaded->get()),
            absl::StrCat("sample step 5 | \"hi\" → \"", absl::CEscape(continuation), "\""));

  // A tokenizer with ids beyond the vocabulary, and a prompt too long for max_seq once tokenized,
  // stop every rank before training, naming the field.
  std::ofstream(dir / "big.json") << testenv::ReversedBytesTokenizer(/*added=*/1);
  config::JobSpec big = text;
  big.training.sample_tokenizer = (dir / "big.json").string();
  config::JobSpec long_prompt = text;
  long_prompt.training.sample_prompt = std::string(30, 'x');  // 30 tokens + 20 > max_seq 40
  const std::pair<const config::JobSpec*, std::string> refused[] = {
      {&big, "training.sample_tokenizer: " + big.training.sample_tokenizer +
                 " has ids up to 256, beyond model.vocab 256"},
      {&long_prompt,
       "training.sample_tokens: a prompt of 30 tokens (sample_prompt through "
       "sample_tokenizer) and 20 new ones exceed model.max_seq 40"}};
  for (const auto& [spec, message] : refused) {
    const testenv::RankRun run = testenv::RunRanks(*spec);
    for (const auto& result : run.results) {
      ASSERT_FALSE(result.ok());
      EXPECT_EQ(result.status().message(), message);
    }
  }
  std::filesystem::remove_all(dir);
}

TEST(SampleLine, ByteLevelModelsReadAsEscapedTextOthersAsIds) {
  EXPECT_EQ(SampleLine(7, {'h', 'i'}, {' ', 'y', 'o', '\n'}, 256),
            "sample step 7 | \"hi\" → \" yo\\n\"");
  EXPECT_EQ(SampleLine(7, {1, 2}, {3, 40}, 64), "sample step 7 | 1 2 → 3 40");
}

}  // namespace
}  // namespace trainyard::worker
