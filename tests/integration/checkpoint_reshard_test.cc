// Resharding: a checkpoint written under one mesh loads under every other — data parallelism with
// ZeRO 1 and 3, tensor, pipeline, sequence and context parallelism (cp 4, and cp 2 with ZeRO-3
// sharded over the cp ranks), another micro-batch and every pipeline schedule (interleaved 1F1B:
// two chunks per rank), and a mixture-of-experts model with and without expert and context
// parallelism — for both model families. After
// loading, the gathered parameters equal the writer's exactly; training on continues within 1e-5
// relative of the single-process run's losses (the reassociation bound of
// parallel_equivalence_test); and on the writer's own mesh it continues bit for bit.
//
// Ranks run as threads of this process (rank_threads.h), each with its own Gloo context.
#include <cmath>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "config/mesh.h"
#include "gtest/gtest.h"
#include "tests/integration/global_params.h"
#include "tests/integration/mesh_cases.h"
#include "tests/integration/rank_threads.h"
#include "worker/shape/parameters.h"
#include "worker/shape/stages.h"
#include "worker/shape/tensor_slices.h"
#include "worker/trainer.h"

namespace trainyard::worker {
namespace {

using testenv::kInterleaved;
using testenv::kZeroBubble;
using testenv::MeshCase;

const MeshCase kMeshes[] = {
    {.name = "dp1"},
    {.name = "dp2_zero1", .dp = 2, .zero = 1},
    {.name = "dp2_zero3", .dp = 2, .zero = 3},
    {.name = "tp2", .tp = 2},
    {.name = "pp2", .pp = 2},
    {.name = "tp2_pp2_sp", .tp = 2, .pp = 2, .sequence_parallel = true},
    {.name = "dp1_micro4", .micro_batch = 4},
    {.name = "pp2_zero_bubble", .pp = 2, .schedule = kZeroBubble},
    {.name = "pp2_interleaved", .pp = 2, .schedule = kInterleaved, .virtual_stages = 2},
    {.name = "cp4", .cp = 4},
    {.name = "cp2_zero3", .cp = 2, .zero = 3},
};

// A mixture-of-experts model (four experts, top-2, one shared) written and read with and without
// expert parallelism: the experts of a layer on one rank or split over 2 or 4, and with context
// parallelism (each expert's ZeRO-3 shards over its data- and context-parallel ranks).
const MeshCase kMoeMeshes[] = {
    {.name = "moe_dp1", .experts = 4},
    {.name = "moe_dp2_ep2_zero1", .dp = 2, .zero = 1, .experts = 4, .ep = 2},
    {.name = "moe_dp4_ep2_zero3", .dp = 4, .zero = 3, .experts = 4, .ep = 2},
    {.name = "moe_dp4_ep4", .dp = 4, .experts = 4, .ep = 4},
    {.name = "moe_tp2_pp2", .tp = 2, .pp = 2, .experts = 4},
    {.name = "moe_dp2_cp2_ep2_zero3", .dp = 2, .cp = 2, .zero = 3, .experts = 4, .ep = 2},
};

// A llama model with latent attention written and read with its heads split by tensor
// parallelism (the latents' projections whole on every rank), over pipeline stages, and with
// context parallelism and ZeRO-3.
const MeshCase kLatentMeshes[] = {
    {.name = "latent_dp1", .latent = true},
    {.name = "latent_tp2_pp2_sp", .tp = 2, .pp = 2, .sequence_parallel = true, .latent = true},
    {.name = "latent_cp2_zero3", .cp = 2, .zero = 3, .latent = true},
};

constexpr int64_t kSavedStep = 3;
constexpr int64_t kSteps = 5;

config::JobSpec Job(config::ModelFamily family, const MeshCase& mesh) {
  config::JobSpec spec;
  spec.name = "reshard";
  spec.model = *config::Preset(family == config::ModelFamily::kGpt2 ? "gpt2-debug" : "llama-debug");
  spec.model.vocab = 64;
  spec.model.max_seq = 16;
  spec.model.layers = 4;  // pp 2 interleaved: two one-layer chunks on each rank
  spec.data.markov.vocab = 64;
  spec.data.markov.train_tokens = 1 << 14;
  spec.data.markov.val_tokens = 1 << 10;
  spec.training.steps = kSteps;
  spec.training.batch = 8;
  spec.training.micro_batch = 2;
  spec.training.seq_len = 16;
  spec.training.lr = 1e-2;
  spec.training.warmup_steps = 2;
  spec.training.eval_every = 0;
  spec.training.grad_clip = 0.5;
  testenv::ApplyMesh(mesh, &spec);
  return spec;
}

using testenv::GatherGlobalParams;
using testenv::GlobalTensors;

// Runs `spec` to its end, or to `stop_after` steps; with `restored`, each rank's parameters as
// restored, before its first step, go there.
testenv::RankRun RunOrFail(const config::JobSpec& spec, int64_t stop_after,
                           std::vector<std::vector<float>>* restored = nullptr) {
  if (restored != nullptr) restored->assign(spec.world_size(), {});
  testenv::RankRun run = testenv::RunRanks(spec, {.customize = [&](int rank, TrainOptions& o) {
                                             o.stop_after_step = stop_after;
                                             if (restored != nullptr) {
                                               o.restored_parameters = &(*restored)[rank];
                                             }
                                           }});
  for (size_t r = 0; r < run.results.size(); ++r) {
    EXPECT_TRUE(run.results[r].ok()) << "rank " << r << ": " << run.results[r].status();
  }
  return run;
}

// A checkpoint written on `source` loads on every mesh of `meshes` (the first: one process).
void CheckReshard(config::ModelFamily family, const MeshCase& source,
                  std::span<const MeshCase> meshes) {
  const std::filesystem::path scratch = testenv::MakeScratchDir("reshard");
  // The single-process losses nothing interrupted: what every mesh must continue with.
  testenv::RankRun reference = RunOrFail(Job(family, meshes[0]), 0);
  ASSERT_TRUE(reference.results[0].ok());
  const std::vector<double> ref_losses = reference.results[0]->train_losses;

  config::JobSpec writer = Job(family, source);
  writer.checkpoint.dir = (scratch / "saved").string();
  writer.checkpoint.every_steps = kSavedStep;
  testenv::RankRun saved = RunOrFail(writer, kSavedStep);
  ASSERT_TRUE(saved.results[0].ok());
  const GlobalTensors saved_params = GatherGlobalParams(writer, saved);
  // The writer's mesh, uninterrupted: its own continuation must match it bit for bit.
  config::JobSpec plain = Job(family, source);
  testenv::RankRun uninterrupted = RunOrFail(plain, 0);
  ASSERT_TRUE(uninterrupted.results[0].ok());

  int index = 0;
  for (const MeshCase& target : meshes) {
    SCOPED_TRACE(absl::StrCat(source.name, " -> ", target.name));
    config::JobSpec reader = Job(family, target);
    reader.checkpoint.dir = (scratch / absl::StrCat("target", index++)).string();
    reader.checkpoint.resume_from = writer.checkpoint.dir;
    testenv::RankRun at_restore;
    testenv::RankRun continued = RunOrFail(reader, 0, &at_restore.final_params);
    ASSERT_TRUE(continued.results[0].ok());
    EXPECT_EQ(continued.results[0]->first_step, kSavedStep);
    const GlobalTensors loaded_params = GatherGlobalParams(reader, at_restore);
    ASSERT_EQ(loaded_params.size(), saved_params.size());
    for (const auto& [name, values] : saved_params) {
      EXPECT_EQ(loaded_params.at(name), values) << name << " differs after loading";
    }
    const std::vector<double>& losses = continued.results[0]->train_losses;
    ASSERT_EQ(losses.size(), static_cast<size_t>(kSteps - kSavedStep));
    for (size_t i = 0; i < losses.size(); ++i) {
      const double want = ref_losses[kSavedStep + i];
      EXPECT_LE(std::abs(losses[i] - want) / want, 1e-5)
          << "step " << kSavedStep + i + 1 << ": " << losses[i] << " vs " << want;
    }
    if (std::string(target.name) == source.name) {
      EXPECT_EQ(losses.back(), uninterrupted.results[0]->train_losses.back())
          << "on its own mesh the continuation must be bit for bit";
    }
  }
  std::filesystem::remove_all(scratch);
}

class Reshard : public ::testing::TestWithParam<std::tuple<config::ModelFamily, MeshCase>> {};

TEST_P(Reshard, CheckpointLoadsOnEveryMesh) {
  const auto [family, source] = GetParam();
  CheckReshard(family, source, kMeshes);
}

INSTANTIATE_TEST_SUITE_P(Meshes, Reshard,
                         ::testing::Combine(::testing::Values(config::ModelFamily::kGpt2,
                                                              config::ModelFamily::kLlama),
                                            ::testing::ValuesIn(kMeshes)),
                         [](const auto& info) {
                           return absl::StrCat(config::FamilyName(std::get<0>(info.param)),
                                               "_from_", std::get<1>(info.param).name);
                         });

class ReshardExperts : public ::testing::TestWithParam<std::tuple<config::ModelFamily, MeshCase>> {
};

TEST_P(ReshardExperts, CheckpointLoadsOnEveryMesh) {
  const auto [family, source] = GetParam();
  CheckReshard(family, source, kMoeMeshes);
}

INSTANTIATE_TEST_SUITE_P(MixtureOfExperts, ReshardExperts,
                         ::testing::Combine(::testing::Values(config::ModelFamily::kGpt2,
                                                              config::ModelFamily::kLlama),
                                            ::testing::ValuesIn(kMoeMeshes)),
                         [](const auto& info) {
                           return absl::StrCat(config::FamilyName(std::get<0>(info.param)),
                                               "_from_", std::get<1>(info.param).name);
                         });

class ReshardLatent : public ::testing::TestWithParam<MeshCase> {};

TEST_P(ReshardLatent, CheckpointLoadsOnEveryMesh) {
  CheckReshard(config::ModelFamily::kLlama, GetParam(), kLatentMeshes);
}

INSTANTIATE_TEST_SUITE_P(LatentAttention, ReshardLatent, ::testing::ValuesIn(kLatentMeshes),
                         [](const auto& info) {
                           return absl::StrCat("llama_from_", info.param.name);
                         });

}  // namespace
}  // namespace trainyard::worker
