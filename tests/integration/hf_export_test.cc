// Weights out and back in (worker/convert/). A checkpoint written on dp 2 with ZeRO-3, tp 2 and
// pp 2 exports as a Hugging Face directory that reads back bit for bit (fp32), and a job started
// from it (model.init_from) on the writer's mesh and on one process takes the same first step.
// The exported files, read by an independent oracle (tests/oracle/hf_oracle.py: PyTorch, Hugging
// Face's names, layouts and conventions), give Trainyard's logits to 1e-4 relative, for both
// families; an llm.c model file written from them (tests/oracle/write_llmc.py) loads to the same
// logits. Greedy generation with the key/value cache, from the export and from the checkpoint,
// chooses the oracle's 32 tokens. A Llama mixture-of-experts model of Mixtral's shape does all of
// this as MixtralForCausalLM, its experts split over data-parallel (ep 2), tensor-parallel and
// pipeline ranks. The llm.c export of a GPT-2 checkpoint is byte for byte llm.c's layout of the
// same weights.
//
// Ranks run as threads of this process (rank_threads.h).
#include "worker/convert/hf_export.h"

#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/fp8_format.h"
#include "tests/integration/global_params.h"
#include "tests/integration/mesh_cases.h"
#include "tests/integration/rank_threads.h"
#include "tests/integration/test_env.h"
#include "worker/backend.h"
#include "worker/convert/init_from.h"
#include "worker/convert/llmc_export.h"
#include "worker/convert/safetensors.h"
#include "worker/convert/weights.h"
#include "worker/generate.h"
#include "worker/local_model.h"
#include "worker/trainer.h"

namespace trainyard::worker {
namespace {

namespace fs = std::filesystem;
using config::ModelFamily;
using testenv::MeshCase;

const MeshCase kMeshes[] = {
    {.name = "dp2_zero3", .dp = 2, .zero = 3},
    {.name = "tp2", .tp = 2},
    {.name = "pp2", .pp = 2},
};

constexpr int64_t kSavedStep = 3;

// Mixture-of-experts meshes (Llama): the model of Mixtral's shape (Job), its experts split
// over data-parallel ranks with ZeRO-3, over tensor-parallel ranks, and over pipeline stages.
const MeshCase kMixtralMeshes[] = {
    {.name = "moe_dp2_ep2_zero3", .dp = 2, .zero = 3, .experts = 4, .ep = 2},
    {.name = "moe_tp2", .tp = 2, .experts = 4},
    {.name = "moe_pp2", .pp = 2, .experts = 4},
};

// The whole of the file at `path`, its bytes as they are.
std::string FileBytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

config::JobSpec Job(ModelFamily family, const MeshCase& mesh) {
  config::JobSpec spec = testenv::DebugJob(family, mesh, /*max_seq=*/16);
  spec.name = "export";
  // Mixtral's shape: no shared experts, top-k renormalised.
  if (mesh.experts > 0 && !mesh.shared_gate && !mesh.glm45 && !mesh.ernie_moe) {
    spec.model.moe.shared_experts = 0;
    spec.model.moe.normalize_top_k = true;
  }
  // DeepSeek-V2's: a shared expert, the top k's probabilities as scored, times 1.5.
  if (mesh.latent && mesh.experts > 0 && !mesh.glm45) {
    spec.model.moe.shared_experts = 1;
    spec.model.moe.normalize_top_k = false;
    spec.model.moe.routed_scale = 1.5f;
  }
  if (mesh.post_norms && mesh.qk_norm && mesh.sliding_window > 0) {  // Gemma 3's local RoPE
    spec.model.rope_local_theta = 1000.0f;
  }
  // Qwen3-MoE's and Qwen2-MoE's: an MoE block every second, the top k as the router scored them
  // (Qwen2-MoE's with its gated shared expert).
  if (mesh.experts > 0 && (mesh.qk_norm || mesh.shared_gate) && !mesh.glm45) {
    spec.model.moe.every = 2;
    spec.model.moe.normalize_top_k = false;
  }
  // OLMoE's: the top k as scored (MiniMax-M2's normalised).
  if (mesh.whole_norms && !mesh.minimax_m2) spec.model.moe.normalize_top_k = false;
  return spec;
}

testenv::RankRun RunOrFail(const config::JobSpec& spec, int64_t stop_after) {
  testenv::RankRun run = testenv::RunRanks(
      spec, {.customize = [&](int, TrainOptions& o) { o.stop_after_step = stop_after; }});
  for (size_t r = 0; r < run.results.size(); ++r) {
    EXPECT_TRUE(run.results[r].ok()) << "rank " << r << ": " << run.results[r].status();
  }
  return run;
}

// Trains `spec` to kSavedStep with a checkpoint there and exports it to `out`; returns the
// model's global tensors as the writer held them.
testenv::GlobalTensors TrainAndExport(config::JobSpec spec, const fs::path& scratch,
                                      const fs::path& out) {
  spec.checkpoint.dir = (scratch / "ckpt").string();
  spec.checkpoint.every_steps = kSavedStep;
  testenv::RankRun saved = RunOrFail(spec, kSavedStep);
  if (!saved.results[0].ok()) return {};
  absl::StatusOr<convert::ExportResult> exported =
      convert::ExportHf(*RealFileSystem(), spec.checkpoint.dir, {.out_dir = out.string()});
  EXPECT_TRUE(exported.ok()) << exported.status();
  if (exported.ok()) {
    EXPECT_EQ(exported->step, kSavedStep);
  }
  return testenv::GatherGlobalParams(spec, saved);
}

double FirstLoss(const config::JobSpec& spec) {
  testenv::RankRun run = RunOrFail(spec, 1);
  if (!run.results[0].ok() || run.results[0]->train_losses.empty()) return NAN;
  return run.results[0]->train_losses[0];
}

class HfRoundTrip : public ::testing::TestWithParam<std::tuple<ModelFamily, MeshCase>> {};

TEST_P(HfRoundTrip, ExportReadsBackBitForBitAndInitFromStartsThere) {
  const auto [family, mesh] = GetParam();
  const fs::path scratch = testenv::MakeScratchDir("hf_export");
  const fs::path hf = scratch / "hf";
  const testenv::GlobalTensors saved = TrainAndExport(Job(family, mesh), scratch, hf);
  ASSERT_FALSE(saved.empty());

  absl::StatusOr<std::unique_ptr<convert::WeightSource>> source =
      convert::WeightSource::Open(*RealFileSystem(), hf.string());
  ASSERT_TRUE(source.ok()) << source.status();
  std::vector<float> read;
  for (const auto& [name, values] : saved) {
    ASSERT_TRUE((*source)->Read(name, read).ok()) << name;
    EXPECT_TRUE(std::equal(values.begin(), values.end(), read.begin()))
        << name << " differs after the round trip";
  }

  // A job started from the export, on the writer's mesh and on one process, takes the same
  // first step, which a random start does not.
  config::JobSpec on_mesh = Job(family, mesh);
  on_mesh.init_from = hf.string();
  const MeshCase one{.name = "dp1",
                     .qkv_bias = mesh.qkv_bias,
                     .head_dim = mesh.head_dim,
                     .qk_norm = mesh.qk_norm,
                     .whole_norms = mesh.whole_norms,
                     .sliding_window = mesh.sliding_window,
                     .gemma = mesh.gemma,
                     .full_layer = mesh.full_layer,
                     .post_norms = mesh.post_norms,
                     .post_norms_only = mesh.post_norms_only,
                     .softcaps = mesh.softcaps,
                     .longrope = mesh.longrope,
                     .nope_layer = mesh.nope_layer,
                     .rope_dim = mesh.rope_dim,
                     .granite = mesh.granite,
                     .experts = mesh.experts,
                     .bias_balance = mesh.bias_balance,
                     .shared_gate = mesh.shared_gate,
                     .glm45 = mesh.glm45,
                     .ernie_moe = mesh.ernie_moe,
                     .minimax_m2 = mesh.minimax_m2,
                     .groups = mesh.groups,
                     .group_top_k = mesh.group_top_k,
                     .group_max = mesh.group_max,
                     .latent = mesh.latent,
                     .latent_direct_queries = mesh.latent_direct_queries};
  config::JobSpec single = Job(family, one);
  single.init_from = hf.string();
  const double mesh_loss = FirstLoss(on_mesh), single_loss = FirstLoss(single);
  EXPECT_LE(std::abs(mesh_loss - single_loss) / single_loss, 1e-5)
      << mesh_loss << " vs " << single_loss;
  const double random_loss = FirstLoss(Job(family, one));
  EXPECT_LT(single_loss, random_loss - 0.05) << "the exported weights were trained";
  fs::remove_all(scratch);
}

INSTANTIATE_TEST_SUITE_P(Meshes, HfRoundTrip,
                         ::testing::Combine(::testing::Values(ModelFamily::kGpt2,
                                                              ModelFamily::kLlama),
                                            ::testing::ValuesIn(kMeshes)),
                         [](const auto& info) {
                           return absl::StrCat(config::FamilyName(std::get<0>(info.param)),
                                               "_from_", std::get<1>(info.param).name);
                         });

INSTANTIATE_TEST_SUITE_P(Mixtral, HfRoundTrip,
                         ::testing::Combine(::testing::Values(ModelFamily::kLlama),
                                            ::testing::ValuesIn(kMixtralMeshes)),
                         [](const auto& info) {
                           return absl::StrCat("mixtral_from_", std::get<1>(info.param).name);
                         });

// Llama with biases on q, k and v exports as Qwen2 (Qwen2ForCausalLM's names and config) and
// reads back on a tensor-parallel mesh, the biases split by heads.
INSTANTIATE_TEST_SUITE_P(
    Qwen2, HfRoundTrip,
    ::testing::Combine(
        ::testing::Values(ModelFamily::kLlama),
        ::testing::Values(
            MeshCase{.name = "qwen2_dp2_tp2_zero3", .dp = 2, .tp = 2, .zero = 3, .qkv_bias = true},
            // Its window from layer max_window_layers (1) on, the blocks split over two stages.
            MeshCase{.name = "qwen2_window_from_layer1_pp2",
                     .pp = 2,
                     .qkv_bias = true,
                     .sliding_window = 5,
                     .full_layer = 0})),
    [](const auto& info) { return std::string(std::get<1>(info.param).name); });

// Heads wider than width / heads export with config.json's head_dim (as Mistral Nemo's) and read
// back split over tensor-parallel ranks and pipeline stages.
INSTANTIATE_TEST_SUITE_P(
    WideHeads, HfRoundTrip,
    ::testing::Combine(::testing::Values(ModelFamily::kLlama),
                       ::testing::Values(MeshCase{
                           .name = "wide_heads_tp2_pp2", .tp = 2, .pp = 2, .head_dim = 24})),
    [](const auto& info) { return std::string(std::get<1>(info.param).name); });

// A sliding window exports as Mistral (MistralForCausalLM's config with its sliding_window) and
// reads back as the same model on a context-parallel mesh, whose ring skips the blocks outside it.
INSTANTIATE_TEST_SUITE_P(
    Mistral, HfRoundTrip,
    ::testing::Combine(::testing::Values(ModelFamily::kLlama),
                       ::testing::Values(MeshCase{
                           .name = "mistral_window_cp2", .cp = 2, .sliding_window = 5})),
    [](const auto& info) { return std::string(std::get<1>(info.param).name); });

// GeGLU with scaled embeddings exports as Gemma (GemmaForCausalLM's config, each norm's weight
// stored less one) and reads back split over tensor-parallel ranks, the norms whole on each.
INSTANTIATE_TEST_SUITE_P(
    Gemma, HfRoundTrip,
    ::testing::Combine(::testing::Values(ModelFamily::kLlama),
                       ::testing::Values(MeshCase{.name = "gemma_dp2_tp2_zero3",
                                                  .dp = 2,
                                                  .tp = 2,
                                                  .zero = 3,
                                                  .head_dim = 24,
                                                  .gemma = true})),
    [](const auto& info) { return std::string(std::get<1>(info.param).name); });

// With query and key norms, norms of the branches' outputs and local blocks, Gemma's model exports
// as Gemma 3 (Gemma3ForCausalLM) and reads back split over tensor-parallel ranks under sequence
// parallelism.
INSTANTIATE_TEST_SUITE_P(Gemma3, HfRoundTrip,
                         ::testing::Combine(::testing::Values(ModelFamily::kLlama),
                                            ::testing::Values(MeshCase{.name = "gemma3_tp2_sp",
                                                                       .tp = 2,
                                                                       .sequence_parallel = true,
                                                                       .head_dim = 24,
                                                                       .qk_norm = true,
                                                                       .sliding_window = 5,
                                                                       .gemma = true,
                                                                       .full_layer = 1,
                                                                       .post_norms = true})),
                         [](const auto& info) {
                           return std::string(std::get<1>(info.param).name);
                         });

// Without query and key norms, and with capped scores and logits, Gemma 3's model is Gemma 2's:
// it exports as Gemma2ForCausalLM and reads back on a context-parallel ring.
INSTANTIATE_TEST_SUITE_P(Gemma2, HfRoundTrip,
                         ::testing::Combine(::testing::Values(ModelFamily::kLlama),
                                            ::testing::Values(MeshCase{.name = "gemma2_cp2",
                                                                       .cp = 2,
                                                                       .head_dim = 24,
                                                                       .sliding_window = 5,
                                                                       .gemma = true,
                                                                       .full_layer = 1,
                                                                       .post_norms = true,
                                                                       .softcaps = true})),
                         [](const auto& info) {
                           return std::string(std::get<1>(info.param).name);
                         });

// Partial RoPE with LongRoPE exports as Phi-3 (Phi3ForCausalLM's fused projections, its
// partial_rotary_factor and rope_scaling) and reads back split over tensor-parallel ranks.
INSTANTIATE_TEST_SUITE_P(
    Phi3, HfRoundTrip,
    ::testing::Combine(::testing::Values(ModelFamily::kLlama),
                       ::testing::Values(MeshCase{
                           .name = "phi3_longrope_tp2", .tp = 2, .longrope = true})),
    [](const auto& info) { return std::string(std::get<1>(info.param).name); });

// NoPE blocks export as SmolLM3 and read back on pipeline stages.
INSTANTIATE_TEST_SUITE_P(SmolLM3, HfRoundTrip,
                         ::testing::Combine(::testing::Values(ModelFamily::kLlama),
                                            ::testing::Values(MeshCase{
                                                .name = "smollm3_pp2", .pp = 2, .nope_layer = 1})),
                         [](const auto& info) {
                           return std::string(std::get<1>(info.param).name);
                         });

// Granite's multipliers export as Granite (GraniteForCausalLM's config with the four of them)
// and read back split over tensor-parallel ranks under sequence parallelism; with experts as
// GraniteMoE (each kind of expert weight stacked in one tensor), read back with the experts
// split over data-parallel ranks under ZeRO-3.
INSTANTIATE_TEST_SUITE_P(
    Granite, HfRoundTrip,
    ::testing::Combine(::testing::Values(ModelFamily::kLlama),
                       ::testing::Values(MeshCase{.name = "granite_tp2_sp",
                                                  .tp = 2,
                                                  .sequence_parallel = true,
                                                  .granite = true},
                                         MeshCase{.name = "granitemoe_dp2_ep2_zero3",
                                                  .dp = 2,
                                                  .zero = 3,
                                                  .granite = true,
                                                  .experts = 4,
                                                  .ep = 2})),
    [](const auto& info) { return std::string(std::get<1>(info.param).name); });

// Latent attention exports as DeepSeek-V3 (each query head's rotary rows moved last and put in
// neighbouring pairs, the rotary key's too): over DeepSeek-V3's routing past a dense first block,
// read back with the experts split over data-parallel ranks under ZeRO-3, and without the query
// latent on pipeline stages with the heads split over tensor-parallel ranks; dense (null
// experts), split over tensor-parallel ranks under sequence parallelism. Over softmax routing it
// exports as DeepSeek-V2, read back with the experts split over data-parallel ranks.
INSTANTIATE_TEST_SUITE_P(
    DeepseekV3, HfRoundTrip,
    ::testing::Combine(::testing::Values(ModelFamily::kLlama),
                       ::testing::Values(MeshCase{.name = "deepseek_v3_dp2_ep2_zero3",
                                                  .dp = 2,
                                                  .zero = 3,
                                                  .experts = 4,
                                                  .ep = 2,
                                                  .glm45 = true,
                                                  .latent = true},
                                         MeshCase{.name = "deepseek_v3_tp2_pp2_direct_queries",
                                                  .tp = 2,
                                                  .pp = 2,
                                                  .experts = 4,
                                                  .glm45 = true,
                                                  .latent = true,
                                                  .latent_direct_queries = true},
                                         MeshCase{.name = "deepseek_v3_dense_tp2_sp",
                                                  .tp = 2,
                                                  .sequence_parallel = true,
                                                  .latent = true},
                                         MeshCase{.name = "deepseek_v2_dp2_ep2_zero1",
                                                  .dp = 2,
                                                  .zero = 1,
                                                  .experts = 4,
                                                  .ep = 2,
                                                  .latent = true})),
    [](const auto& info) { return std::string(std::get<1>(info.param).name); });

// Gated shared experts with q, k and v biases export as Qwen2-MoE and read back split over
// tensor-parallel ranks under sequence parallelism.
INSTANTIATE_TEST_SUITE_P(Qwen2Moe, HfRoundTrip,
                         ::testing::Combine(::testing::Values(ModelFamily::kLlama),
                                            ::testing::Values(MeshCase{.name = "qwen2_moe_tp2_sp",
                                                                       .tp = 2,
                                                                       .sequence_parallel = true,
                                                                       .qkv_bias = true,
                                                                       .experts = 4,
                                                                       .shared_gate = true})),
                         [](const auto& info) {
                           return std::string(std::get<1>(info.param).name);
                         });

// GLM-4.5's routing (the first block dense, biased sigmoid scores, weights times 2.5, a shared
// expert) over q, k and v biases, per-head query and key norms and half of each head turned
// exports as GLM-4.5 and reads back with the experts split over data-parallel ranks under ZeRO-3,
// and on pipeline stages (the dense block on one, the MoE block on the other) with the heads and
// the experts split over tensor-parallel ranks.
INSTANTIATE_TEST_SUITE_P(
    Glm45, HfRoundTrip,
    ::testing::Combine(::testing::Values(ModelFamily::kLlama),
                       ::testing::Values(MeshCase{.name = "glm45_dp2_ep2_zero3",
                                                  .dp = 2,
                                                  .zero = 3,
                                                  .qkv_bias = true,
                                                  .qk_norm = true,
                                                  .rope_dim = 8,
                                                  .experts = 4,
                                                  .ep = 2,
                                                  .glm45 = true},
                                         MeshCase{.name = "glm45_tp2_pp2",
                                                  .tp = 2,
                                                  .pp = 2,
                                                  .qkv_bias = true,
                                                  .qk_norm = true,
                                                  .rope_dim = 8,
                                                  .experts = 4,
                                                  .glm45 = true})),
    [](const auto& info) { return std::string(std::get<1>(info.param).name); });

// MiniMax-M2's model (norms over the whole q and k, half of each head turned, in every block
// experts picked by sigmoid score plus a selection bias, no shared expert) exports as MiniMax-M2
// and reads back with the experts split over data-parallel ranks under ZeRO-3, and over
// tensor-parallel ranks on pipeline stages (the whole-projection norms summed over the group).
INSTANTIATE_TEST_SUITE_P(
    MiniMaxM2, HfRoundTrip,
    ::testing::Combine(::testing::Values(ModelFamily::kLlama),
                       ::testing::Values(MeshCase{.name = "minimax_m2_dp2_ep2_zero3",
                                                  .dp = 2,
                                                  .zero = 3,
                                                  .whole_norms = true,
                                                  .rope_dim = 8,
                                                  .experts = 4,
                                                  .ep = 2,
                                                  .minimax_m2 = true},
                                         MeshCase{.name = "minimax_m2_tp2_pp2",
                                                  .tp = 2,
                                                  .pp = 2,
                                                  .whole_norms = true,
                                                  .rope_dim = 8,
                                                  .experts = 4,
                                                  .minimax_m2 = true})),
    [](const auto& info) { return std::string(std::get<1>(info.param).name); });

// Softmax scores picked with a selection bias past a dense first block export as ERNIE 4.5's MoE
// (its q and k rows interleaved for RoPE in neighbouring pairs) and read back with the experts
// split over data-parallel ranks under ZeRO-3, and over tensor-parallel ranks on pipeline stages.
INSTANTIATE_TEST_SUITE_P(
    ErnieMoe, HfRoundTrip,
    ::testing::Combine(::testing::Values(ModelFamily::kLlama),
                       ::testing::Values(MeshCase{.name = "ernie_moe_dp2_ep2_zero3",
                                                  .dp = 2,
                                                  .zero = 3,
                                                  .experts = 4,
                                                  .ep = 2,
                                                  .ernie_moe = true},
                                         MeshCase{.name = "ernie_moe_tp2_pp2",
                                                  .tp = 2,
                                                  .pp = 2,
                                                  .experts = 4,
                                                  .ernie_moe = true})),
    [](const auto& info) { return std::string(std::get<1>(info.param).name); });

// Query and key norms over the whole projection with experts in every block export as OLMoE and
// read back with the experts split over data-parallel ranks under ZeRO-3, and on pipeline stages.
INSTANTIATE_TEST_SUITE_P(
    Olmoe, HfRoundTrip,
    ::testing::Combine(
        ::testing::Values(ModelFamily::kLlama),
        ::testing::Values(MeshCase{.name = "olmoe_dp2_ep2_zero3",
                                   .dp = 2,
                                   .zero = 3,
                                   .whole_norms = true,
                                   .experts = 4,
                                   .ep = 2},
                          MeshCase{
                              .name = "olmoe_pp2", .pp = 2, .whole_norms = true, .experts = 4})),
    [](const auto& info) { return std::string(std::get<1>(info.param).name); });

// Norms after each branch only, with query and key norms over the whole projection, export as
// OLMo 2 and read back sharded by ZeRO-3 over data-parallel ranks, and on pipeline stages with
// the heads (and those norms' columns) split over tensor-parallel ranks; with a window in the
// first block as OLMo 3 (its layer_types), read back with the sequences split over
// context-parallel ranks.
INSTANTIATE_TEST_SUITE_P(Olmo2, HfRoundTrip,
                         ::testing::Combine(::testing::Values(ModelFamily::kLlama),
                                            ::testing::Values(MeshCase{.name = "olmo2_dp2_zero3",
                                                                       .dp = 2,
                                                                       .zero = 3,
                                                                       .whole_norms = true,
                                                                       .post_norms_only = true},
                                                              MeshCase{.name = "olmo2_tp2_pp2",
                                                                       .tp = 2,
                                                                       .pp = 2,
                                                                       .whole_norms = true,
                                                                       .post_norms_only = true},
                                                              MeshCase{.name = "olmo3_dp2_cp2",
                                                                       .dp = 2,
                                                                       .cp = 2,
                                                                       .whole_norms = true,
                                                                       .sliding_window = 5,
                                                                       .full_layer = 1,
                                                                       .post_norms_only = true})),
                         [](const auto& info) {
                           return std::string(std::get<1>(info.param).name);
                         });

// A window in the first block only exports as Ministral (its layer_types) and reads back with
// the heads split over tensor-parallel ranks on pipeline stages.
INSTANTIATE_TEST_SUITE_P(
    Ministral, HfRoundTrip,
    ::testing::Combine(
        ::testing::Values(ModelFamily::kLlama),
        ::testing::Values(MeshCase{
            .name = "ministral_tp2_pp2", .tp = 2, .pp = 2, .sliding_window = 5, .full_layer = 1})),
    [](const auto& info) { return std::string(std::get<1>(info.param).name); });

// OLMo 2's blocks with per-head query and key norms, a window in the first block and NoPE in the
// second export as EXAONE 4.0, read back with the heads (and the norms) split over
// tensor-parallel ranks on pipeline stages, and with the sequences split over context-parallel
// ranks.
INSTANTIATE_TEST_SUITE_P(Exaone4, HfRoundTrip,
                         ::testing::Combine(::testing::Values(ModelFamily::kLlama),
                                            ::testing::Values(MeshCase{.name = "exaone4_tp2_pp2",
                                                                       .tp = 2,
                                                                       .pp = 2,
                                                                       .qk_norm = true,
                                                                       .sliding_window = 5,
                                                                       .full_layer = 1,
                                                                       .post_norms_only = true,
                                                                       .nope_layer = 1},
                                                              MeshCase{.name = "exaone4_dp2_cp2",
                                                                       .dp = 2,
                                                                       .cp = 2,
                                                                       .qk_norm = true,
                                                                       .sliding_window = 5,
                                                                       .full_layer = 1,
                                                                       .post_norms_only = true,
                                                                       .nope_layer = 1})),
                         [](const auto& info) {
                           return std::string(std::get<1>(info.param).name);
                         });

// Biases on q, k and v with half of each head turned, and norms after each branch as well as
// before, export as GLM-4 (q's and k's rows interleaved for GLM's RoPE) and read back with the
// heads split over tensor-parallel ranks on pipeline stages; without the norms after, as GLM,
// read back sharded by ZeRO-3 over data-parallel ranks.
INSTANTIATE_TEST_SUITE_P(Glm, HfRoundTrip,
                         ::testing::Combine(::testing::Values(ModelFamily::kLlama),
                                            ::testing::Values(MeshCase{.name = "glm4_tp2_pp2",
                                                                       .tp = 2,
                                                                       .pp = 2,
                                                                       .qkv_bias = true,
                                                                       .post_norms = true,
                                                                       .rope_dim = 8},
                                                              MeshCase{.name = "glm_dp2_zero3",
                                                                       .dp = 2,
                                                                       .zero = 3,
                                                                       .qkv_bias = true,
                                                                       .rope_dim = 8})),
                         [](const auto& info) {
                           return std::string(std::get<1>(info.param).name);
                         });

// How a multimodal checkpoint's config.json names itself: its architecture and model_type.
struct MultimodalKind {
  const char* architecture;
  const char* model_type;
};
constexpr MultimodalKind kGemma3Multimodal{"Gemma3ForConditionalGeneration", "gemma3"};
constexpr MultimodalKind kMistral3{"Mistral3ForConditionalGeneration", "mistral3"};

// `text` (a text model's directory) as a multimodal checkpoint of `kind` in `out`: config.json
// with the text model's config as text_config beside a vision tower's, and the tensors under
// `prefix` (language_model.model. as Gemma 3 4B to 27B and Mistral Small 3.1 are published,
// model.language_model. as newer transformers save them) beside a vision tower's and a
// projector's.
void WriteMultimodal(const fs::path& text, const fs::path& out, const std::string& prefix,
                     const MultimodalKind& kind = kGemma3Multimodal) {
  fs::create_directories(out);
  const std::string text_config = FileBytes(text / "config.json");
  std::ofstream(out / "config.json")
      << "{\"architectures\": [\"" << kind.architecture << "\"], \"model_type\": \""
      << kind.model_type << "\", \"mm_tokens_per_image\": 4, \"text_config\": " << text_config
      << ", \"vision_config\": {\"hidden_size\": 4, \"model_type\": \"siglip_vision_model\"}}";
  absl::StatusOr<std::unique_ptr<convert::SafetensorsFile>> in =
      convert::SafetensorsFile::Open(*RealFileSystem(), (text / "model.safetensors").string());
  ASSERT_TRUE(in.ok()) << in.status();
  std::vector<convert::TensorInfo> tensors = {
      {"vision_tower.vision_model.post_layernorm.weight", convert::TensorDtype::kF32, {4}},
      {"multi_modal_projector.mm_input_projection_weight", convert::TensorDtype::kF32, {4, 8}}};
  // The text model's model.X under the prefix; an untied head under language_model.lm_head (as
  // published) or lm_head (as newer transformers save it).
  auto renamed = [&](const std::string& name) {
    if (absl::StartsWith(name, "model.")) return prefix + name.substr(6);
    return (prefix == "language_model.model." ? "language_model." : "") + name;
  };
  for (const convert::TensorInfo& t : (*in)->tensors()) {
    tensors.push_back({renamed(t.name), t.dtype, t.shape});
  }
  auto writer = convert::SafetensorsWriter::Create(
      *RealFileSystem(), (out / "model.safetensors").string(), tensors, {{"format", "pt"}});
  ASSERT_TRUE(writer.ok()) << writer.status();
  std::vector<float> values(32, 0.5f);
  ASSERT_TRUE((*writer)->Write(tensors[0].name, values.data()).ok());
  ASSERT_TRUE((*writer)->Write(tensors[1].name, values.data()).ok());
  for (const convert::TensorInfo& t : (*in)->tensors()) {
    values.resize(t.numel());
    (*in)->ReadFloats(t, 0, t.numel(), values.data());
    ASSERT_TRUE((*writer)->Write(renamed(t.name), values.data()).ok());
  }
  ASSERT_TRUE((*writer)->Finish().ok());
}

// A model of `mesh` trained and exported, then rewritten as a multimodal checkpoint of `kind`
// under either naming: its language model reads tensor for tensor as the text model does (the
// vision tower's and projector's tensors left unread), and a job starts from it at the text
// model's first loss.
void ExpectLanguageModelReadsAsTextModel(const MeshCase& mesh, const MultimodalKind& kind) {
  const fs::path scratch = testenv::MakeScratchDir(absl::StrCat("hf_", kind.model_type));
  const fs::path text = scratch / "text";
  const testenv::GlobalTensors saved =
      TrainAndExport(Job(ModelFamily::kLlama, mesh), scratch, text);
  ASSERT_FALSE(saved.empty());
  config::JobSpec from_text = Job(ModelFamily::kLlama, mesh);
  from_text.init_from = text.string();
  const double text_loss = FirstLoss(from_text);
  for (const std::string prefix : {"language_model.model.", "model.language_model."}) {
    SCOPED_TRACE(prefix);
    const fs::path multimodal = scratch / prefix;
    WriteMultimodal(text, multimodal, prefix, kind);
    auto source = convert::WeightSource::Open(*RealFileSystem(), multimodal.string());
    ASSERT_TRUE(source.ok()) << source.status();
    EXPECT_THAT((*source)->description(),
                ::testing::HasSubstr(absl::StrCat(kind.model_type, " (its language model)")));
    std::vector<float> read;
    for (const auto& [name, values] : saved) {
      ASSERT_TRUE((*source)->Read(name, read).ok()) << name;
      ASSERT_GE(read.size(), values.size()) << name;
      EXPECT_TRUE(std::equal(values.begin(), values.end(), read.begin())) << name;
    }
    config::JobSpec from_multimodal = Job(ModelFamily::kLlama, mesh);
    from_multimodal.init_from = multimodal.string();
    EXPECT_EQ(FirstLoss(from_multimodal), text_loss);
  }
  fs::remove_all(scratch);
}

// Gemma 3 4B to 27B are published as multimodal checkpoints (Gemma3ForConditionalGeneration).
TEST(HfMultimodalGemma3, TheLanguageModelReadsAsTheTextModel) {
  ExpectLanguageModelReadsAsTextModel(MeshCase{.name = "dp1",
                                               .head_dim = 24,
                                               .qk_norm = true,
                                               .sliding_window = 5,
                                               .gemma = true,
                                               .full_layer = 1,
                                               .post_norms = true},
                                      kGemma3Multimodal);
}

// Mistral Small 3.1 and 3.2 are published as multimodal checkpoints
// (Mistral3ForConditionalGeneration) whose language model is a Mistral: here one with a window
// and heads wider than width / heads, so that its export is a MistralForCausalLM.
TEST(HfMistral3, TheLanguageModelReadsAsTheTextModel) {
  ExpectLanguageModelReadsAsTextModel(MeshCase{.name = "dp1", .head_dim = 24, .sliding_window = 5},
                                      kMistral3);
}

// `text` (a GraniteForCausalLM directory of `model`) as Granite 4.0's non-hybrid layout in `out`:
// GraniteMoeHybridForCausalLM's config with every layer attention, no experts and RoPE, and each
// block's gate_proj and up_proj rows stacked as shared_mlp.input_linear, its down_proj as
// shared_mlp.output_linear.
void WriteGraniteHybrid(const fs::path& text, const fs::path& out,
                        const config::ModelConfig& model) {
  fs::create_directories(out);
  std::string config = FileBytes(text / "config.json");
  const std::string granite = "\"model_type\": \"granite\"";
  ASSERT_NE(config.find(granite), std::string::npos) << config;
  std::vector<std::string> attention(model.layers, "\"attention\"");
  config.replace(config.find(granite), granite.size(),
                 absl::StrCat("\"model_type\": \"granitemoehybrid\", \"num_local_experts\": 0, "
                              "\"position_embedding_type\": \"rope\", \"layer_types\": [",
                              absl::StrJoin(attention, ", "),
                              "], \"shared_intermediate_size\": ", model.ffn_hidden));
  std::ofstream(out / "config.json") << config;
  absl::StatusOr<std::unique_ptr<convert::SafetensorsFile>> in =
      convert::SafetensorsFile::Open(*RealFileSystem(), (text / "model.safetensors").string());
  ASSERT_TRUE(in.ok()) << in.status();
  auto read = [&](const std::string& name) {
    for (const convert::TensorInfo& t : (*in)->tensors()) {
      if (t.name != name) continue;
      std::vector<float> values(t.numel());
      (*in)->ReadFloats(t, 0, t.numel(), values.data());
      return values;
    }
    ADD_FAILURE() << name << " is not in the export";
    return std::vector<float>{};
  };
  // Each tensor of the hybrid layout and where its values come from (gate then up for the input).
  std::vector<convert::TensorInfo> tensors;
  std::vector<std::vector<std::string>> sources;
  for (const convert::TensorInfo& t : (*in)->tensors()) {
    if (absl::EndsWith(t.name, "mlp.up_proj.weight")) continue;
    const std::string block = t.name.substr(0, t.name.find("mlp."));
    if (absl::EndsWith(t.name, "mlp.gate_proj.weight")) {
      tensors.push_back({block + "shared_mlp.input_linear.weight",
                         convert::TensorDtype::kF32,
                         {2 * t.shape[0], t.shape[1]}});
      sources.push_back({t.name, block + "mlp.up_proj.weight"});
    } else if (absl::EndsWith(t.name, "mlp.down_proj.weight")) {
      tensors.push_back(
          {block + "shared_mlp.output_linear.weight", convert::TensorDtype::kF32, t.shape});
      sources.push_back({t.name});
    } else {
      tensors.push_back({t.name, convert::TensorDtype::kF32, t.shape});
      sources.push_back({t.name});
    }
  }
  auto writer = convert::SafetensorsWriter::Create(
      *RealFileSystem(), (out / "model.safetensors").string(), tensors, {{"format", "pt"}});
  ASSERT_TRUE(writer.ok()) << writer.status();
  for (size_t i = 0; i < tensors.size(); ++i) {
    std::vector<float> values;
    for (const std::string& source : sources[i]) {
      const std::vector<float> part = read(source);
      values.insert(values.end(), part.begin(), part.end());
    }
    ASSERT_TRUE((*writer)->Write(tensors[i].name, values.data()).ok()) << tensors[i].name;
  }
  ASSERT_TRUE((*writer)->Finish().ok());
}

// Granite 4.0's models without Mamba-2 layers are published as GraniteMoeHybridForCausalLM with
// the MLP as a shared one: a Granite model rewritten so reads tensor for tensor as the Granite
// export does, and a job starts from it at the same first loss.
TEST(HfGraniteHybrid, AttentionOnlyLayoutReadsAsGranite) {
  const MeshCase mesh{.name = "dp1", .granite = true};
  const fs::path scratch = testenv::MakeScratchDir("hf_granitemoehybrid");
  const fs::path text = scratch / "granite", hybrid = scratch / "hybrid";
  const config::JobSpec spec = Job(ModelFamily::kLlama, mesh);
  const testenv::GlobalTensors saved = TrainAndExport(spec, scratch, text);
  ASSERT_FALSE(saved.empty());
  WriteGraniteHybrid(text, hybrid, spec.model);
  auto source = convert::WeightSource::Open(*RealFileSystem(), hybrid.string());
  ASSERT_TRUE(source.ok()) << source.status();
  EXPECT_THAT((*source)->description(), ::testing::HasSubstr("granitemoehybrid"));
  std::vector<float> read;
  for (const auto& [name, values] : saved) {
    ASSERT_TRUE((*source)->Read(name, read).ok()) << name;
    ASSERT_GE(read.size(), values.size()) << name;
    EXPECT_TRUE(std::equal(values.begin(), values.end(), read.begin())) << name;
  }
  config::JobSpec from_text = spec, from_hybrid = spec;
  from_text.init_from = text.string();
  from_hybrid.init_from = hybrid.string();
  EXPECT_EQ(FirstLoss(from_hybrid), FirstLoss(from_text));
  fs::remove_all(scratch);
}

// `tensors` with their `values` as out/model.safetensors.
void WriteTensors(const fs::path& out, const std::vector<convert::TensorInfo>& tensors,
                  const std::vector<std::vector<float>>& values) {
  auto writer = convert::SafetensorsWriter::Create(
      *RealFileSystem(), (out / "model.safetensors").string(), tensors, {{"format", "pt"}});
  ASSERT_TRUE(writer.ok()) << writer.status();
  for (size_t i = 0; i < tensors.size(); ++i) {
    ASSERT_TRUE((*writer)->Write(tensors[i].name, values[i].data()).ok()) << tensors[i].name;
  }
  ASSERT_TRUE((*writer)->Finish().ok());
}

// `text` (a Hugging Face directory) as a block-quantized FP8 checkpoint in `out`, as DeepSeek's
// and Qwen's "-FP8" releases store one: every projection weight (`_proj.weight`, and DeepSeek's
// `kv_a_proj_with_mqa.weight`) as F8_E4M3 codes of its values over a per-block scale, beside that
// scale as `X_scale_inv` (the block's largest magnitude / 448), in blocks of `block`, and
// config.json's quantization_config saying so. `expected` gets each quantized tensor's values as
// the codes times their scales.
void WriteFp8(const fs::path& text, const fs::path& out, std::array<int64_t, 2> block,
              std::map<std::string, std::vector<float>>* expected) {
  fs::create_directories(out);
  std::string config = FileBytes(text / "config.json");
  config.insert(config.rfind('}'),
                absl::StrCat(", \"quantization_config\": {\"activation_scheme\": \"dynamic\", "
                             "\"fmt\": \"float8_e4m3fn\", \"quant_method\": \"fp8\", "
                             "\"weight_block_size\": [",
                             block[0], ", ", block[1], "]}"));
  std::ofstream(out / "config.json") << config;
  absl::StatusOr<std::unique_ptr<convert::SafetensorsFile>> in =
      convert::SafetensorsFile::Open(*RealFileSystem(), (text / "model.safetensors").string());
  ASSERT_TRUE(in.ok()) << in.status();
  std::vector<convert::TensorInfo> tensors;
  std::vector<std::vector<float>> values;
  for (const convert::TensorInfo& t : (*in)->tensors()) {
    std::vector<float> v(t.numel());
    (*in)->ReadFloats(t, 0, t.numel(), v.data());
    const bool projection =
        absl::EndsWith(t.name, "_proj.weight") || absl::EndsWith(t.name, "_proj_with_mqa.weight");
    if (!projection || t.shape.size() != 2) {
      tensors.push_back({t.name, convert::TensorDtype::kF32, t.shape});
      values.push_back(std::move(v));
      continue;
    }
    const int64_t rows = t.shape[0], cols = t.shape[1];
    const int64_t block_rows = (rows + block[0] - 1) / block[0];
    const int64_t block_cols = (cols + block[1] - 1) / block[1];
    std::vector<float> scale(block_rows * block_cols, 0.0f), scaled(v.size());
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        float& s = scale[(r / block[0]) * block_cols + c / block[1]];
        s = std::max(s, std::fabs(v[r * cols + c]) / 448.0f);
      }
    }
    std::vector<float>& want = (*expected)[t.name];
    want.resize(v.size());
    for (int64_t e = 0; e < rows * cols; ++e) {
      const float s = scale[(e / cols / block[0]) * block_cols + e % cols / block[1]];
      scaled[e] = s > 0 ? v[e] / s : 0.0f;
      want[e] = kernels::DecodeFp8(kernels::EncodeFp8(scaled[e], kernels::Fp8Format::kE4M3),
                                   kernels::Fp8Format::kE4M3) *
                s;
    }
    tensors.push_back({t.name, convert::TensorDtype::kF8E4M3, t.shape});
    values.push_back(std::move(scaled));
    tensors.push_back(
        {t.name + "_scale_inv", convert::TensorDtype::kF32, {block_rows, block_cols}});
    values.push_back(std::move(scale));
  }
  WriteTensors(out, tensors, values);
}

// A block-quantized FP8 checkpoint reads as its codes times their blocks' scales, to the bit, in
// blocks that do not divide the weights (3 × 5 over rows and columns of 16, 24, 48...), and a job
// starts from it within FP8's rounding of the unquantized model's first loss. What it cannot
// read is refused naming the file and tensor or field.
TEST(HfFp8, BlockQuantizedWeightsReadAsCodesTimesScales) {
  const MeshCase mesh{.name = "dp1"};
  const fs::path scratch = testenv::MakeScratchDir("hf_fp8");
  const fs::path text = scratch / "bf16", fp8 = scratch / "fp8";
  const config::JobSpec spec = Job(ModelFamily::kLlama, mesh);
  const testenv::GlobalTensors saved = TrainAndExport(spec, scratch, text);
  ASSERT_FALSE(saved.empty());
  std::map<std::string, std::vector<float>> expected;
  WriteFp8(text, fp8, {3, 5}, &expected);
  ASSERT_GT(expected.size(), 4u);
  auto source = convert::WeightSource::Open(*RealFileSystem(), fp8.string());
  ASSERT_TRUE(source.ok()) << source.status();
  EXPECT_THAT((*source)->description(), ::testing::HasSubstr("FP8 in blocks of 3×5"));
  // Our h.0.attn.proj.w is their o_proj whole; mlp.proj.w their down_proj.
  std::vector<float> read;
  for (const auto& [ours, theirs] :
       {std::pair{"h.0.attn.proj.w", "model.layers.0.self_attn.o_proj.weight"},
        std::pair{"h.1.mlp.proj.w", "model.layers.1.mlp.down_proj.weight"}}) {
    ASSERT_TRUE((*source)->Read(ours, read).ok()) << ours;
    const std::vector<float>& want = expected.at(theirs);
    ASSERT_GE(read.size(), want.size());
    EXPECT_TRUE(std::equal(want.begin(), want.end(), read.begin())) << ours;
    const std::vector<float>& unquantized = saved.at(ours);
    double worst = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      worst = std::max(worst, std::fabs(double{read[i]} - unquantized[i]));
    }
    EXPECT_GT(worst, 0.0) << ours << " was not quantized";
  }
  config::JobSpec from_text = spec, from_fp8 = spec;
  from_text.init_from = text.string();
  from_fp8.init_from = fp8.string();
  const double text_loss = FirstLoss(from_text), fp8_loss = FirstLoss(from_fp8);
  EXPECT_LE(std::abs(fp8_loss - text_loss) / text_loss, 0.02) << fp8_loss << " vs " << text_loss;

  // Refusals: a scale missing, blocks that do not match the scales, no quantization_config.
  auto refusal = [&](const fs::path& dir) {
    return std::string(
        convert::WeightSource::Open(*RealFileSystem(), dir.string()).status().message());
  };
  const fs::path other = scratch / "other";
  WriteFp8(text, other, {4, 4}, &expected);
  std::string four = FileBytes(other / "config.json");
  four.replace(four.find("[4, 4]"), 6, "[3, 5]");
  std::ofstream(other / "config.json") << four;
  EXPECT_THAT(refusal(other), ::testing::HasSubstr("_scale_inv of shape"));
  four.erase(four.find(", \"quantization_config\""));
  std::ofstream(other / "config.json") << four << "}";
  EXPECT_THAT(refusal(other),
              ::testing::HasSubstr("is F8_E4M3, but config.json has no quantization_config"));
  fs::remove_all(scratch);
}

// `text` with each tensor of `values` (by its Hugging Face name) replaced by those values, as F32,
// in `out`.
void WriteReplaced(const fs::path& text, const fs::path& out,
                   const std::map<std::string, std::vector<float>>& values) {
  fs::create_directories(out);
  fs::copy_file(text / "config.json", out / "config.json");
  absl::StatusOr<std::unique_ptr<convert::SafetensorsFile>> in =
      convert::SafetensorsFile::Open(*RealFileSystem(), (text / "model.safetensors").string());
  ASSERT_TRUE(in.ok()) << in.status();
  std::vector<convert::TensorInfo> tensors;
  std::vector<std::vector<float>> data;
  for (const convert::TensorInfo& t : (*in)->tensors()) {
    tensors.push_back({t.name, convert::TensorDtype::kF32, t.shape});
    if (auto it = values.find(t.name); it != values.end()) {
      data.push_back(it->second);
    } else {
      data.emplace_back(t.numel());
      (*in)->ReadFloats(t, 0, t.numel(), data.back().data());
    }
  }
  WriteTensors(out, tensors, data);
}

// DeepSeek-V3's FP8 release quantizes latent attention's projections too: kv_a_proj_with_mqa,
// whose last rows (the rotary key) the conversion moves first and de-interleaves, and q_b_proj
// and kv_b_proj, whose rows it reorders within each head. Each block's scale must follow its rows
// to where they land: read from such a checkpoint (blocks of 3 × 5, which cut across heads and
// across the rotary rows), every tensor is what the same checkpoint with each weight stored as
// its codes times their scales gives, and a job started from it on two tensor-parallel ranks
// (each reading its heads' rows) takes the same first step as one started from those values.
TEST(HfFp8, DeepseekV3LatentAttentionReadsAsItsDequantizedWeights) {
  const MeshCase mesh{.name = "dp1", .experts = 4, .glm45 = true, .latent = true};
  const fs::path scratch = testenv::MakeScratchDir("hf_fp8_deepseek");
  const fs::path text = scratch / "bf16", fp8 = scratch / "fp8", values = scratch / "values";
  const testenv::GlobalTensors saved =
      TrainAndExport(Job(ModelFamily::kLlama, mesh), scratch, text);
  ASSERT_FALSE(saved.empty());
  std::map<std::string, std::vector<float>> expected;
  WriteFp8(text, fp8, {3, 5}, &expected);
  for (const char* latent :
       {"model.layers.0.self_attn.kv_a_proj_with_mqa.weight",
        "model.layers.1.self_attn.q_b_proj.weight", "model.layers.1.self_attn.kv_b_proj.weight"}) {
    EXPECT_TRUE(expected.contains(latent)) << latent << " was not quantized";
  }
  WriteReplaced(text, values, expected);
  auto quantized = convert::WeightSource::Open(*RealFileSystem(), fp8.string());
  auto dequantized = convert::WeightSource::Open(*RealFileSystem(), values.string());
  ASSERT_TRUE(quantized.ok()) << quantized.status();
  ASSERT_TRUE(dequantized.ok()) << dequantized.status();
  std::vector<float> got, want;
  for (const auto& [name, unquantized] : saved) {
    ASSERT_TRUE((*quantized)->Read(name, got).ok()) << name;
    ASSERT_TRUE((*dequantized)->Read(name, want).ok()) << name;
    EXPECT_EQ(got, want) << name;
  }
  ASSERT_TRUE((*quantized)->Read("h.0.attn.kv_a.w", got).ok());
  EXPECT_NE(std::vector<float>(got.begin(), got.begin() + saved.at("h.0.attn.kv_a.w").size()),
            saved.at("h.0.attn.kv_a.w"))
      << "kv_a was not quantized";

  config::JobSpec from_fp8 = Job(
      ModelFamily::kLlama, {.name = "tp2", .tp = 2, .experts = 4, .glm45 = true, .latent = true});
  config::JobSpec from_values = from_fp8;
  from_fp8.init_from = fp8.string();
  from_values.init_from = values.string();
  EXPECT_EQ(FirstLoss(from_fp8), FirstLoss(from_values));
  fs::remove_all(scratch);
}

// Query and key norms export as Qwen3 (Qwen3ForCausalLM's names and config) and read back whole
// on every tensor-parallel rank.
INSTANTIATE_TEST_SUITE_P(
    Qwen3, HfRoundTrip,
    ::testing::Combine(::testing::Values(ModelFamily::kLlama),
                       ::testing::Values(MeshCase{.name = "qwen3_dp2_tp2_zero3",
                                                  .dp = 2,
                                                  .tp = 2,
                                                  .zero = 3,
                                                  .head_dim = 24,
                                                  .qk_norm = true},
                                         // Qwen3-MoE: the experts split over ep 2, its dense
                                         // block's MLP and the norms whole on every rank.
                                         MeshCase{.name = "qwen3_moe_dp2_ep2_zero3",
                                                  .dp = 2,
                                                  .zero = 3,
                                                  .head_dim = 24,
                                                  .qk_norm = true,
                                                  .experts = 4,
                                                  .ep = 2})),
    [](const auto& info) { return std::string(std::get<1>(info.param).name); });

constexpr int kBatch = 2, kSeq = 16;

// Trainyard's logits for `tokens` with the weights at `path` (a Hugging Face directory or an
// llm.c file) loaded through model.init_from's reader.
std::vector<float> TrainyardLogits(const config::ModelConfig& model, const std::string& path,
                                   const std::vector<int32_t>& tokens) {
  auto backend = MakeCpuBackend(1);
  auto local = LocalModel::Create(model, backend.get());
  EXPECT_TRUE(local.ok());
  auto source = convert::WeightSource::Open(*RealFileSystem(), path);
  EXPECT_TRUE(source.ok()) << source.status();
  if (!local.ok() || !source.ok()) return {};
  std::vector<float> host((*local)->num_params());
  EXPECT_TRUE((*source)->ReadLayout((*local)->layout(), host.data()).ok());
  (*local)->LoadParameters(host.data());
  std::vector<float> logits(int64_t{kBatch} * kSeq * model.vocab);
  EXPECT_TRUE((*local)->Logits(tokens.data(), kBatch, kSeq, logits.data()).ok());
  return logits;
}

// max |ours − theirs| / max |theirs|.
double RelativeError(const std::vector<float>& ours, const std::vector<double>& theirs) {
  double err = 0, scale = 0;
  for (size_t i = 0; i < theirs.size(); ++i) {
    err = std::max(err, std::abs(ours[i] - theirs[i]));
    scale = std::max(scale, std::abs(theirs[i]));
  }
  return err / scale;
}

// 32 greedy tokens after `prompt` from the weights at `path`, with the key/value cache.
std::vector<int32_t> Generate(const std::string& path, const std::vector<int32_t>& prompt) {
  auto weights = convert::LoadModelWeights(*RealFileSystem(), path);
  EXPECT_TRUE(weights.ok()) << weights.status();
  if (!weights.ok()) return {};
  auto backend = MakeCpuBackend(1);
  auto generator = Generator::Create(weights->model, backend.get(), weights->params.data());
  EXPECT_TRUE(generator.ok()) << generator.status();
  if (!generator.ok()) return {};
  auto out = (*generator)->Generate(prompt, {.tokens = 32});
  EXPECT_TRUE(out.ok()) << out.status();
  return out.ok() ? *out : std::vector<int32_t>{};
}

int RunPython(const std::string& script, const std::string& args) {
  const std::string cmd = absl::StrCat(testenv::PythonInterpreter(), " ", testenv::SourceDir(),
                                       "/tests/oracle/", script, " ", args);
  const int rc = std::system(cmd.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

// The oracle's logits from the Hugging Face directory `dir` against Trainyard's from the same
// files, for kBatch sequences of kSeq tokens drawn from `model`'s vocabulary with `seed` (left
// in `tokens`, the oracle's logits in `oracle`): max relative error (NaN when either side
// failed). Scratch files go to `scratch`.
double ErrorAgainstTheOracle(const config::ModelConfig& model, const fs::path& dir,
                             const fs::path& scratch, unsigned seed, std::vector<int32_t>& tokens,
                             std::vector<double>& oracle) {
  tokens.assign(kBatch * kSeq, 0);
  std::mt19937 rng(seed);
  for (int32_t& t : tokens) t = static_cast<int32_t>(rng() % model.vocab);
  const fs::path tokens_file = scratch / "tokens.i32";
  std::ofstream(tokens_file, std::ios::binary)
      .write(reinterpret_cast<const char*>(tokens.data()), 4 * tokens.size());
  const int rc = RunPython("hf_oracle.py", absl::StrCat(dir.string(), " ", tokens_file.string(),
                                                        " ", (scratch / "out").string(),
                                                        " --batch ", kBatch, " --seq ", kSeq));
  EXPECT_EQ(rc, 0);
  oracle.assign(tokens.size() * model.vocab, 0.0);
  std::ifstream(scratch / "out" / "logits.f64", std::ios::binary)
      .read(reinterpret_cast<char*>(oracle.data()), 8 * oracle.size());
  const std::vector<float> ours = TrainyardLogits(model, dir.string(), tokens);
  EXPECT_EQ(ours.size(), oracle.size());
  if (rc != 0 || ours.size() != oracle.size()) return NAN;
  return RelativeError(ours, oracle);
}

// The oracle's logits and greedy tokens from the export of a model trained on one rank (`mesh`
// says only what model it is), with `scaling` as its RoPE scaling when one is given (Llama), and
// the export's config.json rewritten by `restate` when one is given.
void CheckAgainstTheOracle(ModelFamily family, const MeshCase& mesh,
                           const config::RopeScaling& scaling = {},
                           const std::function<std::string(std::string)>& restate = {},
                           float attention_multiplier = 0.0f) {
  const fs::path scratch = testenv::MakeScratchDir("hf_oracle");
  const fs::path hf = scratch / "hf";
  config::JobSpec spec = Job(family, mesh);
  if (scaling.enabled()) spec.model.rope_scaling = scaling;
  if (attention_multiplier != 0.0f) spec.model.attention_multiplier = attention_multiplier;
  if (scaling.enabled() && mesh.whole_norms && mesh.post_norms_only && mesh.sliding_window > 0) {
    spec.model.rope_local_theta = spec.model.rope_theta;  // OLMo 3's windowed blocks: unscaled
  }
  spec.model.max_seq = 48;  // room for an 8-token prompt and 32 generated tokens
  ASSERT_FALSE(TrainAndExport(spec, scratch, hf).empty());
  if (restate) {
    const std::string json = FileBytes(hf / "config.json");
    std::ofstream(hf / "config.json", std::ios::trunc) << restate(json);
  }

  std::vector<int32_t> tokens;
  std::vector<double> oracle;
  const double error = ErrorAgainstTheOracle(spec.model, hf, scratch, 7, tokens, oracle);
  std::printf("%s%s logits against the oracle: max relative error %.2e\n",
              config::FamilyName(family).c_str(),
              restate                                          ? " (config restated)"
              : mesh.latent && mesh.experts > 0 && !mesh.glm45 ? " (deepseek_v2)"
              : mesh.latent                                    ? " (deepseek_v3)"
              : mesh.experts == 0                              ? ""
              : mesh.glm45                                     ? " (glm4_moe)"
              : mesh.minimax_m2                                ? " (minimax_m2)"
              : mesh.ernie_moe                                 ? " (ernie4_5_moe)"
              : mesh.qk_norm                                   ? " (qwen3_moe)"
              : mesh.shared_gate                               ? " (qwen2_moe)"
              : mesh.whole_norms                               ? " (olmoe)"
              : mesh.granite                                   ? " (granitemoe)"
                                                               : " (mixtral)",
              error);
  EXPECT_LE(error, 1e-4);

  // Greedy generation with the key/value cache, from the export and from the checkpoint itself,
  // against the oracle's (which recomputes the whole sequence for every token).
  const std::vector<int32_t> prompt(tokens.begin(), tokens.begin() + 8);
  const fs::path prompt_file = scratch / "prompt.i32";
  std::ofstream(prompt_file, std::ios::binary)
      .write(reinterpret_cast<const char*>(prompt.data()), 4 * prompt.size());
  ASSERT_EQ(RunPython("hf_oracle.py",
                      absl::StrCat(hf.string(), " ", prompt_file.string(), " ",
                                   (scratch / "gen").string(), " --batch 1 --seq 8 --generate 32")),
            0);
  std::vector<int32_t> oracle_tokens;
  std::ifstream generated(scratch / "gen" / "generated.txt");
  for (int32_t t; generated >> t;) oracle_tokens.push_back(t);
  ASSERT_EQ(oracle_tokens.size(), 32u);
  std::printf("oracle greedy tokens:");
  for (int32_t t : oracle_tokens) std::printf(" %d", t);
  std::printf("\n");
  for (const fs::path& from : {hf, scratch / "ckpt"}) {
    EXPECT_EQ(Generate(from.string(), prompt), oracle_tokens) << from;
  }

  if (family == ModelFamily::kGpt2 && mesh.experts == 0) {
    // llm.c's file of the same weights: version 3 (fp32) gives the same logits; version 5 (bf16)
    // the same up to bf16's rounding of the weights.
    for (int version : {3, 5}) {
      const fs::path bin = scratch / absl::StrCat("gpt2_v", version, ".bin");
      ASSERT_EQ(RunPython("write_llmc.py",
                          absl::StrCat(hf.string(), " ", bin.string(), " --version ", version)),
                0);
      const std::vector<float> llmc = TrainyardLogits(spec.model, bin.string(), tokens);
      ASSERT_EQ(llmc.size(), oracle.size());
      const double llmc_error = RelativeError(llmc, oracle);
      std::printf("llm.c version %d logits against the oracle: max relative error %.2e\n", version,
                  llmc_error);
      EXPECT_LE(llmc_error, version == 3 ? 1e-4 : 3e-2);
    }
  }
  fs::remove_all(scratch);
}

// `trainyard export --format llmc` of a GPT-2 checkpoint written on dp 2 with ZeRO-3 is, byte
// for byte, the file llm.c's layout makes of the same weights (tests/oracle/write_llmc.py, from
// the Hugging Face export), in fp32 (version 3) and bf16 (version 5), the vocabulary of 64 padded
// to 128 rows; and it loads through model.init_from's reader to the logits of the export.
TEST(LlmcExport, IsLlmcsLayoutOfTheCheckpoint) {
  const fs::path scratch = testenv::MakeScratchDir("llmc_export");
  const fs::path hf = scratch / "hf";
  const config::JobSpec spec = Job(ModelFamily::kGpt2, {.name = "dp2_zero3", .dp = 2, .zero = 3});
  ASSERT_FALSE(TrainAndExport(spec, scratch, hf).empty());
  const std::string checkpoints = (scratch / "ckpt").string();
  for (int version : {3, 5}) {
    SCOPED_TRACE(absl::StrCat("version ", version));
    const fs::path native = scratch / absl::StrCat("native_v", version, ".bin");
    const fs::path reference = scratch / absl::StrCat("reference_v", version, ".bin");
    absl::StatusOr<convert::ExportResult> exported = convert::ExportLlmc(
        *RealFileSystem(), checkpoints,
        {.out_dir = native.string(),
         .dtype = version == 3 ? convert::TensorDtype::kF32 : convert::TensorDtype::kBF16});
    ASSERT_TRUE(exported.ok()) << exported.status();
    EXPECT_EQ(exported->step, kSavedStep);
    ASSERT_EQ(RunPython("write_llmc.py",
                        absl::StrCat(hf.string(), " ", reference.string(), " --version ", version)),
              0);
    const std::string bytes = FileBytes(native);
    EXPECT_EQ(bytes.size(), FileBytes(reference).size());
    EXPECT_TRUE(bytes == FileBytes(reference)) << "the files differ";
    EXPECT_FALSE(fs::exists(native.string() + ".exporting"));
  }
  std::vector<int32_t> tokens(kBatch * kSeq);
  std::mt19937 rng(3);
  for (int32_t& t : tokens) t = static_cast<int32_t>(rng() % spec.model.vocab);
  EXPECT_EQ(TrainyardLogits(spec.model, (scratch / "native_v3.bin").string(), tokens),
            TrainyardLogits(spec.model, hf.string(), tokens));

  // A destination that exists, and shards, which one file does not have.
  const convert::ExportOptions onto_existing{.out_dir = (scratch / "native_v3.bin").string()};
  EXPECT_THAT(convert::ExportLlmc(*RealFileSystem(), checkpoints, onto_existing).status().message(),
              ::testing::HasSubstr("exists (an llm.c export writes a new file)"));
  const convert::ExportOptions sharded{.out_dir = (scratch / "x.bin").string(),
                                       .max_shard_bytes = 1 << 20};
  EXPECT_EQ(convert::ExportLlmc(*RealFileSystem(), checkpoints, sharded).status().code(),
            absl::StatusCode::kInvalidArgument);
  fs::remove_all(scratch);
}

class HfOracle : public ::testing::TestWithParam<ModelFamily> {};

TEST_P(HfOracle, ExportedFilesGiveTrainyardsLogits) {
  CheckAgainstTheOracle(GetParam(), MeshCase{.name = "dp1"});
}

// Llama 3's RoPE scaling travels to config.json and means there what it means here. An original
// context of 32 over heads of 16 puts the pairs in all three bands (kept, blended, slowed).
TEST(HfOracleLlama3, ExportedFilesGiveTrainyardsLogits) {
  CheckAgainstTheOracle(
      ModelFamily::kLlama, MeshCase{.name = "dp1"},
      {.factor = 8.0f, .low_freq_factor = 1.0f, .high_freq_factor = 4.0f, .original_max_seq = 32});
}

// Linear scaling (position interpolation) travels as rope_type linear.
TEST(HfOracleLlamaLinearRope, ExportedFilesGiveTrainyardsLogits) {
  CheckAgainstTheOracle(ModelFamily::kLlama, MeshCase{.name = "dp1"},
                        {.linear = true, .factor = 4.0f});
}

// YaRN travels as rope_type yarn and means there what it means here: over an original context
// of 16 extended 3 times to model.max_seq 48 (config.json names the original context, with
// max_position_embeddings 3 times it, as recent transformers read the factor), the ends of its
// blend rounded to whole pairs and the paper's attention factor; and over an original context of
// max_seq itself (left out: max_position_embeddings is it), untruncated, with its own factor.
TEST(HfOracleYarn, ExportedFilesGiveTrainyardsLogits) {
  CheckAgainstTheOracle(ModelFamily::kLlama, MeshCase{.name = "dp1"},
                        {.factor = 3.0f,
                         .original_max_seq = 16,
                         .attention_factor = config::YarnAttentionFactor(3.0),
                         .yarn = true,
                         .beta_fast = 8.0f,
                         .beta_slow = 0.25f});
  CheckAgainstTheOracle(ModelFamily::kLlama, MeshCase{.name = "dp1"},
                        {.factor = 2.5f,
                         .original_max_seq = 48,
                         .attention_factor = 1.25f,
                         .yarn = true,
                         .beta_fast = 16.0f,
                         .beta_slow = 0.5f,
                         .truncate = false});
}

// Phi-4 mini's RoPE (10 of each head's 16 dimensions turned, with LongRoPE) travels as Phi-3's
// partial_rotary_factor and longrope scaling. Its short factors serve passes of up to
// original_max_seq positions, its long ones longer passes: with an original context of 6 every
// pass is longer (the 16-position logits, the 8-token prompt, each generated token), with one of
// 64 none is (40 positions at most), and with one of 12 the generation crosses it at its fifth
// token, where the generator runs the whole sequence again with the long factors — as the
// oracle's recomputation of every position does.
TEST(HfOraclePhi3, PartialRopeWithLongRopeGivesTrainyardsLogits) {
  for (const int original : {6, 64, 12}) {
    SCOPED_TRACE(absl::StrCat("original_max_seq ", original));
    CheckAgainstTheOracle(ModelFamily::kLlama, MeshCase{.name = "dp1", .longrope = true},
                          {.original_max_seq = original,
                           .longrope = true,
                           .short_factor = {1.0f, 1.25f, 2.0f, 3.0f, 5.0f},
                           .long_factor = {1.5f, 2.5f, 6.0f, 13.0f, 40.0f},
                           .attention_factor = 1.1875f});
  }
}

// NoPE blocks export as SmolLM3 (its no_rope_layers), which the oracle computes with
// transformers' SmolLM3 conventions: the second block's queries and keys unturned; then with a
// window in that NoPE block alone (use_sliding_window, as SmolLM3 places it), over whose cached
// keys the greedy tokens also run.
TEST(HfOracleSmolLM3, NopeLayersGiveTrainyardsLogits) {
  CheckAgainstTheOracle(ModelFamily::kLlama, MeshCase{.name = "dp1", .nope_layer = 1});
  CheckAgainstTheOracle(
      ModelFamily::kLlama,
      MeshCase{.name = "dp1", .sliding_window = 5, .full_layer = 0, .nope_layer = 1});
}

// Granite's multipliers export as Granite, which the oracle computes with transformers' Granite
// conventions (the embeddings, each branch, the scores and the logits scaled); the greedy tokens
// check the generator's multipliers too.
TEST(HfOracleGranite, MultipliersGiveTrainyardsLogits) {
  CheckAgainstTheOracle(ModelFamily::kLlama, MeshCase{.name = "dp1", .granite = true});
}

// With experts, Granite's model exports as GraniteMoE, which the oracle computes with
// transformers' GraniteMoE conventions (the stacked experts, the top k's softmax over their
// scores alone).
TEST(HfOracleGraniteMoe, StackedExpertsGiveTrainyardsLogits) {
  CheckAgainstTheOracle(ModelFamily::kLlama,
                        MeshCase{.name = "dp1", .granite = true, .experts = 4});
}

// A Llama mixture-of-experts model exports as Mixtral (MixtralForCausalLM's names and config).
TEST(HfOracleMixtral, ExportedFilesGiveTrainyardsLogits) {
  CheckAgainstTheOracle(ModelFamily::kLlama, MeshCase{.name = "dp1", .experts = 4});
}

// A gated shared expert (with q, k and v biases and an MoE block every second) exports as
// Qwen2-MoE, which the oracle computes with transformers' Qwen2-MoE conventions (the shared
// expert's output times the sigmoid of its gate, the top k unnormalised); the greedy tokens check
// the generator's gate too.
TEST(HfOracleQwen2Moe, GatedSharedExpertGivesTrainyardsLogits) {
  CheckAgainstTheOracle(
      ModelFamily::kLlama,
      MeshCase{.name = "dp1", .qkv_bias = true, .experts = 4, .shared_gate = true});
}

// GLM-4.5's routing with q, k and v biases, per-head query and key norms and partial RoPE exports
// as GLM-4.5, which the oracle computes with transformers' Glm4Moe conventions (sigmoid scores
// picked with e_score_correction_bias, which three steps of the bias rule moved, normalised and
// times routed_scaling_factor; the shared experts; the dense first block); the greedy tokens check
// the generator's routing too.
TEST(HfOracleGlm45, BiasedSigmoidRoutingPastADenseBlockGivesTrainyardsLogits) {
  CheckAgainstTheOracle(ModelFamily::kLlama, MeshCase{.name = "dp1",
                                                      .qkv_bias = true,
                                                      .qk_norm = true,
                                                      .rope_dim = 8,
                                                      .experts = 4,
                                                      .glm45 = true});
}

// DeepSeek-V3's group-limited routing exports as GLM-4.5's n_group and topk_group: six experts in
// three groups, each token's picks from the two groups whose two best biased scores sum highest,
// which the oracle ranks with tensor operations of its own.
TEST(HfOracleGlm45, GroupLimitedRoutingGivesTrainyardsLogits) {
  CheckAgainstTheOracle(ModelFamily::kLlama, MeshCase{.name = "dp1",
                                                      .qk_norm = true,
                                                      .experts = 6,
                                                      .glm45 = true,
                                                      .groups = 3,
                                                      .group_top_k = 2});
}

// Latent attention over DeepSeek-V3's routing (the first block dense, biased sigmoid scores)
// exports as DeepSeek-V3, which the oracle computes with transformers' DeepseekV3 conventions
// (each head [nope | rope], the rotary rows de-interleaved before RoPE, one rotary key for every
// head, the latents normed with 1e-6); the greedy tokens check the generator's cache of latents
// (attended in the absorbed form) too.
TEST(HfOracleDeepseekV3, LatentAttentionOverBiasedSigmoidRoutingGivesTrainyardsLogits) {
  CheckAgainstTheOracle(ModelFamily::kLlama,
                        MeshCase{.name = "dp1", .experts = 4, .glm45 = true, .latent = true});
}

// Latent attention over softmax routing (every block's experts picked by probability, the picks
// unnormalised and weighed times 1.5, a shared expert) exports as DeepSeek-V2, which the oracle
// computes with DeepSeek-V2's conventions (its RoPE in neighbouring pairs, no selection bias).
TEST(HfOracleDeepseekV2, LatentAttentionOverSoftmaxRoutingGivesTrainyardsLogits) {
  CheckAgainstTheOracle(ModelFamily::kLlama, MeshCase{.name = "dp1", .experts = 4, .latent = true});
}

// DeepSeek-V2's group-limited routing (V2, V2.5 and Coder-V2 236B route so): four experts in two
// groups, each token's picks from the group whose best probability is highest, exported as
// group_limited_greedy, which the oracle computes as DeepSeek's code does (the other group's
// probabilities masked to 0); the greedy tokens check the generator's routing too.
TEST(HfOracleDeepseekV2, GroupsScoredByTheirBestProbabilityGiveTrainyardsLogits) {
  CheckAgainstTheOracle(ModelFamily::kLlama, MeshCase{.name = "dp1",
                                                      .experts = 4,
                                                      .groups = 2,
                                                      .group_top_k = 1,
                                                      .group_max = true,
                                                      .latent = true});
}

// Without the query latent and experts, under YaRN (4 times an original 12 positions) whose
// mscale_all_dim of 0.7 scales the scores by its YaRN scale squared: written as DeepSeek's
// rope_scaling, which the oracle reads as transformers does.
TEST(HfOracleDeepseekV3, YarnScaledScoresWithoutAQueryLatentGiveTrainyardsLogits) {
  const double mscale = 0.1 * 0.7 * std::log(4.0) + 1.0;
  CheckAgainstTheOracle(
      ModelFamily::kLlama, MeshCase{.name = "dp1", .latent = true, .latent_direct_queries = true},
      config::RopeScaling{.factor = 4.0f, .original_max_seq = 12, .yarn = true}, {},
      static_cast<float>(mscale * mscale / 4.0));  // heads of 16
}

// MiniMax-M2's model (norms over the whole q and k, half of each head turned, every block's
// experts picked by sigmoid score plus a selection bias that three steps of the bias rule moved)
// exports as MiniMax-M2, which the oracle computes with MiniMax-M2's conventions; the greedy
// tokens check the generator's routing too.
TEST(HfOracleMiniMaxM2, BiasedSigmoidExpertsUnderWholeProjectionNormsGiveTrainyardsLogits) {
  CheckAgainstTheOracle(
      ModelFamily::kLlama,
      MeshCase{
          .name = "dp1", .whole_norms = true, .rope_dim = 8, .experts = 4, .minimax_m2 = true});
}

// dots.llm1's model (Qwen3's attention over DeepSeek-V3's experts) is GLM-4.5's with per-head
// query and key norms over the whole head: the export, its config restated as dots1's, reads in
// Trainyard and in the oracle (transformers' Dots1 conventions) to the same logits and greedy
// tokens.
TEST(HfOracleDots1, ADots1DirectoryGivesTrainyardsLogits) {
  CheckAgainstTheOracle(
      ModelFamily::kLlama,
      MeshCase{.name = "dp1",
               .qk_norm = true,
               .experts = 6,
               .glm45 = true,
               .groups = 3,
               .group_top_k = 2},
      {}, [](std::string json) {
        for (const auto& [from, to] : {std::pair{"Glm4MoeForCausalLM", "Dots1ForCausalLM"},
                                       std::pair{"\"glm4_moe\"", "\"dots1\""}}) {
          const size_t at = json.find(from);
          EXPECT_NE(at, std::string::npos) << json;
          if (at != std::string::npos) json.replace(at, strlen(from), to);
        }
        return json;
      });
}

// Softmax scores picked with a selection bias past a dense first block export as ERNIE 4.5's MoE,
// which the oracle computes with transformers' Ernie4_5_Moe conventions (RoPE in neighbouring
// pairs, the bias moe_statics.e_score_correction_bias [1, E] choosing, the picks' probabilities
// normalised, the shared expert); the greedy tokens check the generator's routing too.
TEST(HfOracleErnieMoe, BiasedSoftmaxRoutingPastADenseBlockGivesTrainyardsLogits) {
  CheckAgainstTheOracle(ModelFamily::kLlama,
                        MeshCase{.name = "dp1", .experts = 4, .ernie_moe = true});
}

// Exported in bf16, GLM-4.5's selection bias stays F32, as transformers keeps
// e_score_correction_bias (rounded, it would pick other experts), and reads back exactly; every
// other tensor is bf16.
TEST(HfGlm45, TheSelectionBiasStaysF32InABf16Export) {
  const fs::path scratch = testenv::MakeScratchDir("hf_glm45_bf16");
  config::JobSpec spec = Job(ModelFamily::kLlama, MeshCase{.name = "dp1",
                                                           .qkv_bias = true,
                                                           .qk_norm = true,
                                                           .rope_dim = 8,
                                                           .experts = 4,
                                                           .glm45 = true});
  spec.checkpoint.dir = (scratch / "ckpt").string();
  spec.checkpoint.every_steps = kSavedStep;
  testenv::RankRun saved = RunOrFail(spec, kSavedStep);
  ASSERT_TRUE(saved.results[0].ok());
  const fs::path out = scratch / "hf";
  ASSERT_TRUE(convert::ExportHf(*RealFileSystem(), spec.checkpoint.dir,
                                {.out_dir = out.string(), .dtype = convert::TensorDtype::kBF16})
                  .ok());
  auto file =
      convert::SafetensorsFile::Open(*RealFileSystem(), (out / "model.safetensors").string());
  ASSERT_TRUE(file.ok()) << file.status();
  const testenv::GlobalTensors global = testenv::GatherGlobalParams(spec, saved);
  int biases = 0;
  for (const convert::TensorInfo& t : (*file)->tensors()) {
    const bool bias = absl::EndsWith(t.name, "mlp.gate.e_score_correction_bias");
    EXPECT_EQ(t.dtype, bias ? convert::TensorDtype::kF32 : convert::TensorDtype::kBF16) << t.name;
    if (!bias) continue;
    ++biases;
    std::vector<float> read(t.numel());
    (*file)->ReadFloats(t, 0, t.numel(), read.data());
    const std::vector<float>& want = global.at("h.1.moe.router.bias");
    EXPECT_EQ(read, want);
    EXPECT_NE(read, std::vector<float>(read.size(), 0.0f)) << "the bias rule moved it";
  }
  EXPECT_EQ(biases, 1);  // block 0 is dense
  fs::remove_all(scratch);
}

// Query and key norms over each token's whole q and k, with experts in every block, export as
// OLMoE, which the oracle computes with transformers' OLMoE conventions; the greedy tokens check
// the generator's norms too.
TEST(HfOracleOlmoe, NormsOverTheWholeProjectionGiveTrainyardsLogits) {
  CheckAgainstTheOracle(ModelFamily::kLlama,
                        MeshCase{.name = "dp1", .whole_norms = true, .experts = 4});
}

// No norms before the branches, each branch's output normed, and query and key norms over each
// token's whole q and k export as OLMo 2, which the oracle computes with transformers' OLMo 2
// conventions; the greedy tokens check the generator's blocks too.
TEST(HfOracleOlmo2, NormsAfterEachBranchOnlyGiveTrainyardsLogits) {
  CheckAgainstTheOracle(ModelFamily::kLlama,
                        MeshCase{.name = "dp1", .whole_norms = true, .post_norms_only = true});
}

// A window in the first block with OLMo 2's blocks exports as OLMo 3 (its layer_types), YaRN
// (factor 3 over an original context of 16, max_seq 48) turning the second, full-attention block
// only, the windowed one at rope_theta unscaled; the oracle computes it with transformers' OLMo 3
// conventions, over the generator's cached keys too.
TEST(HfOracleOlmo3, WindowedBlocksUnscaledGiveTrainyardsLogits) {
  CheckAgainstTheOracle(
      ModelFamily::kLlama,
      MeshCase{.name = "dp1",
               .whole_norms = true,
               .sliding_window = 5,
               .full_layer = 1,
               .post_norms_only = true},
      {.factor = 3.0f, .original_max_seq = 16, .attention_factor = 1.2f, .yarn = true});
}

// OLMo 2's blocks with per-head query and key norms, a window in the first block and the second
// attending to every position without RoPE export as EXAONE 4.0 (its layer_types), Llama 3's
// RoPE scaling (factor 2 over an original context of 16) turning the windowed block; the oracle
// computes it with transformers' EXAONE 4.0 conventions, over the generator's cached keys too.
TEST(HfOracleExaone4, WindowedRopeAndGlobalNopeGiveTrainyardsLogits) {
  CheckAgainstTheOracle(ModelFamily::kLlama,
                        MeshCase{.name = "dp1",
                                 .qk_norm = true,
                                 .sliding_window = 5,
                                 .full_layer = 1,
                                 .post_norms_only = true,
                                 .nope_layer = 1},
                        {.factor = 2.0f, .original_max_seq = 16});
}

// Biases on q, k and v export as Qwen2, which the oracle computes with transformers' Qwen2
// conventions.
TEST(HfOracleQwen2, ExportedFilesGiveTrainyardsLogits) {
  CheckAgainstTheOracle(ModelFamily::kLlama, MeshCase{.name = "dp1", .qkv_bias = true});
}

// Biases on q, k and v, half of each head turned and norms after each branch too export as
// GLM-4, which the oracle computes with transformers' GLM conventions (RoPE in neighbouring
// pairs); the greedy tokens check the generator's blocks too. Without the norms after, as GLM.
TEST(HfOracleGlm, ExportedFilesGiveTrainyardsLogits) {
  CheckAgainstTheOracle(
      ModelFamily::kLlama,
      MeshCase{.name = "dp1", .qkv_bias = true, .post_norms = true, .rope_dim = 8});
  CheckAgainstTheOracle(ModelFamily::kLlama,
                        MeshCase{.name = "dp1", .qkv_bias = true, .rope_dim = 8});
}

// The Hugging Face directory `in` rewritten in `out` as another layout of the same model: each
// `edits` pair's first text in config.json replaced by its second, and with `pairs_head_dim` > 0
// each head's rows of q_proj and k_proj (weights and biases, heads that wide) interleaved, row i
// as row 2i and row head_dim/2 + i as row 2i + 1, for RoPE in neighbouring pairs (ERNIE 4.5's,
// Helium's).
void RewriteExport(const fs::path& in, const fs::path& out,
                   const std::vector<std::pair<std::string, std::string>>& edits,
                   int pairs_head_dim) {
  fs::create_directories(out);
  std::string config = FileBytes(in / "config.json");
  for (const auto& [from, to] : edits) {
    ASSERT_NE(config.find(from), std::string::npos) << from;
    config.replace(config.find(from), from.size(), to);
  }
  std::ofstream(out / "config.json") << config;
  absl::StatusOr<std::unique_ptr<convert::SafetensorsFile>> file =
      convert::SafetensorsFile::Open(*RealFileSystem(), (in / "model.safetensors").string());
  ASSERT_TRUE(file.ok()) << file.status();
  auto writer =
      convert::SafetensorsWriter::Create(*RealFileSystem(), (out / "model.safetensors").string(),
                                         (*file)->tensors(), {{"format", "pt"}});
  ASSERT_TRUE(writer.ok()) << writer.status();
  std::vector<float> values, paired;
  for (const convert::TensorInfo& t : (*file)->tensors()) {
    values.resize(t.numel());
    (*file)->ReadFloats(t, 0, t.numel(), values.data());
    const int64_t d = pairs_head_dim;
    if (d > 0 && (absl::StrContains(t.name, "q_proj.") || absl::StrContains(t.name, "k_proj."))) {
      const int64_t cols = t.shape.size() > 1 ? t.shape[1] : 1, half = d / 2;
      paired = values;
      for (int64_t head = 0; head < t.shape[0] / d; ++head) {
        for (int64_t i = 0; i < d; ++i) {
          const int64_t to = head * d + (i < half ? 2 * i : 2 * (i - half) + 1);
          std::copy_n(&values[(head * d + i) * cols], cols, &paired[to * cols]);
        }
      }
      values.swap(paired);
    }
    ASSERT_TRUE((*writer)->Write(t.name, values.data()).ok()) << t.name;
  }
  ASSERT_TRUE((*writer)->Finish().ok());
}

// A model of `mesh` trained and exported, its export rewritten as `model_type` (RewriteExport's
// `edits` and `pairs`): the rewritten directory reads back bit for bit, gives the oracle's
// logits for that model type, and starts a job on tensor-parallel ranks at the first loss of one
// started from the export.
void CheckRewrittenExport(const MeshCase& mesh, const std::string& model_type,
                          const std::vector<std::pair<std::string, std::string>>& edits,
                          bool pairs) {
  const fs::path scratch = testenv::MakeScratchDir("hf_rewritten");
  const fs::path exported = scratch / "exported", rewritten = scratch / model_type;
  config::JobSpec spec = Job(ModelFamily::kLlama, mesh);
  const testenv::GlobalTensors saved = TrainAndExport(spec, scratch, exported);
  ASSERT_FALSE(saved.empty());
  RewriteExport(exported, rewritten, edits, pairs ? spec.model.head_dim() : 0);
  auto source = convert::WeightSource::Open(*RealFileSystem(), rewritten.string());
  ASSERT_TRUE(source.ok()) << source.status();
  EXPECT_THAT((*source)->description(), ::testing::HasSubstr(model_type));
  std::vector<float> read;
  for (const auto& [name, values] : saved) {
    ASSERT_TRUE((*source)->Read(name, read).ok()) << name;
    EXPECT_TRUE(std::equal(values.begin(), values.end(), read.begin())) << name;
  }

  std::vector<int32_t> tokens;
  std::vector<double> oracle;
  const double error = ErrorAgainstTheOracle(spec.model, rewritten, scratch, 11, tokens, oracle);
  std::printf("%s logits against the oracle: max relative error %.2e\n", model_type.c_str(), error);
  EXPECT_LE(error, 1e-4);

  config::JobSpec from_export = spec, from_rewritten = spec;
  from_export.init_from = exported.string();
  from_rewritten.init_from = rewritten.string();
  from_rewritten.parallelism.tp = 2;
  from_rewritten.resources.devices_per_node = 2;
  const double loss = FirstLoss(from_export);
  EXPECT_LE(std::abs(FirstLoss(from_rewritten) - loss), 1e-5 * loss);
  fs::remove_all(scratch);
}

// ERNIE 4.5 (Ernie4_5ForCausalLM) is Llama's model with RoPE in neighbouring pairs: a Llama export
// rewritten in its layout (q's and k's rows interleaved by the test's own loop) reads as the same
// model, and the oracle's ERNIE turns the pairs as transformers does.
TEST(HfErnie45, NeighbouringPairsReadAsTrainyardsRope) {
  CheckRewrittenExport(MeshCase{.name = "dp1"}, "ernie4_5",
                       {{"LlamaForCausalLM", "Ernie4_5ForCausalLM"},
                        {"\"model_type\": \"llama\"", "\"model_type\": \"ernie4_5\""},
                        {"\"mlp_bias\": false", "\"mlp_bias\": false, \"use_bias\": false"}},
                       /*pairs=*/true);
}

// Helium (HeliumForCausalLM) is Llama's model with RoPE in neighbouring pairs and, with
// attention_bias, Qwen2's biases: a Qwen2 export rewritten in its layout (q's and k's weights and
// biases interleaved) reads as the same model.
TEST(HfHelium, NeighbouringPairsWithBiasesReadAsTrainyardsRope) {
  CheckRewrittenExport(
      MeshCase{.name = "dp1", .qkv_bias = true}, "helium",
      {{"Qwen2ForCausalLM", "HeliumForCausalLM"},
       {"\"model_type\": \"qwen2\"", "\"model_type\": \"helium\""},
       {"\"hidden_act\": \"silu\"", "\"hidden_act\": \"silu\", \"attention_bias\": true"}},
      /*pairs=*/true);
}

// Seed-OSS (SeedOssForCausalLM) is Qwen2's model: a Qwen2 export rewritten as Seed-OSS (its
// attention_bias left to the default, true; attention_out_bias false; dropout probabilities that
// training here does not apply) reads as the same model, and the oracle's Seed-OSS agrees.
TEST(HfSeedOss, ReadsAsQwen2) {
  CheckRewrittenExport(
      MeshCase{.name = "dp1", .qkv_bias = true}, "seed_oss",
      {{"Qwen2ForCausalLM", "SeedOssForCausalLM"},
       {"\"model_type\": \"qwen2\"", "\"model_type\": \"seed_oss\""},
       {"\"hidden_act\": \"silu\"",
        "\"hidden_act\": \"silu\", \"attention_out_bias\": false, \"attention_dropout\": 0.1, "
        "\"residual_dropout\": 0.1"}},
      /*pairs=*/false);
}

// Query and key norms (with wide heads, Qwen3's shape) export as Qwen3, which the oracle computes
// with transformers' Qwen3 conventions; its greedy tokens check the generator's norms too.
TEST(HfOracleQwen3, ExportedFilesGiveTrainyardsLogits) {
  CheckAgainstTheOracle(ModelFamily::kLlama,
                        MeshCase{.name = "dp1", .head_dim = 24, .qk_norm = true});
}

// With query and key norms, a mixture-of-experts model exports as Qwen3-MoE (its dense block
// keeps Llama's MLP); the oracle computes it with transformers' Qwen3-MoE conventions.
TEST(HfOracleQwen3Moe, ExportedFilesGiveTrainyardsLogits) {
  CheckAgainstTheOracle(ModelFamily::kLlama,
                        MeshCase{.name = "dp1", .head_dim = 24, .qk_norm = true, .experts = 4});
}

// A window from layer 1 on travels as Qwen2's use_sliding_window with max_window_layers 1, which
// the oracle applies as transformers does (its first layer sees every position).
TEST(HfOracleQwen2, WindowFromMaxWindowLayersOn) {
  CheckAgainstTheOracle(
      ModelFamily::kLlama,
      MeshCase{.name = "dp1", .qkv_bias = true, .sliding_window = 5, .full_layer = 0});
}

// Gemma's model (GeGLU, embeddings times √width, wide heads) exports as Gemma, which the oracle
// computes with transformers' Gemma conventions: each norm multiplies by 1 + its stored weight.
TEST(HfOracleGemma, ExportedFilesGiveTrainyardsLogits) {
  CheckAgainstTheOracle(ModelFamily::kLlama,
                        MeshCase{.name = "dp1", .head_dim = 24, .gemma = true});
}

// Gemma 3's model: the oracle reads its layer pattern, the local blocks' RoPE base and the norms
// of the branches' outputs as transformers does.
TEST(HfOracleGemma3, ExportedFilesGiveTrainyardsLogits) {
  CheckAgainstTheOracle(ModelFamily::kLlama, MeshCase{.name = "dp1",
                                                      .head_dim = 24,
                                                      .qk_norm = true,
                                                      .sliding_window = 5,
                                                      .gemma = true,
                                                      .full_layer = 1,
                                                      .post_norms = true});
}

// Gemma 2's model: the oracle reads its even/odd local blocks, query_pre_attn_scalar and both
// soft caps as transformers does; the greedy tokens check the generator's capped scores and
// logits.
TEST(HfOracleGemma2, ExportedFilesGiveTrainyardsLogits) {
  CheckAgainstTheOracle(ModelFamily::kLlama, MeshCase{.name = "dp1",
                                                      .head_dim = 24,
                                                      .sliding_window = 5,
                                                      .gemma = true,
                                                      .full_layer = 1,
                                                      .post_norms = true,
                                                      .softcaps = true});
}

// Gemma 3 4B's RoPE: its global blocks scaled linearly, its local blocks unscaled at their own
// base, as the oracle applies them.
TEST(HfOracleGemma3, LinearRopeScalingInTheGlobalBlocks) {
  CheckAgainstTheOracle(ModelFamily::kLlama,
                        MeshCase{.name = "dp1",
                                 .head_dim = 24,
                                 .qk_norm = true,
                                 .sliding_window = 5,
                                 .gemma = true,
                                 .full_layer = 1,
                                 .post_norms = true},
                        {.linear = true, .factor = 8.0f});
}

// A sliding window of 5 travels as Mistral's sliding_window, which the oracle applies as
// transformers' mask does; the greedy tokens (8 of prompt, 32 new) check the generator's window
// over its key/value cache.
TEST(HfOracleMistral, ExportedFilesGiveTrainyardsLogits) {
  CheckAgainstTheOracle(ModelFamily::kLlama, MeshCase{.name = "dp1", .sliding_window = 5});
}

// A window of 5 in the first block only travels as Ministral's layer_types, which the oracle
// applies as transformers does, over the generator's key/value cache too.
TEST(HfOracleMinistral, AWindowInSomeBlocksGivesTrainyardsLogits) {
  CheckAgainstTheOracle(ModelFamily::kLlama,
                        MeshCase{.name = "dp1", .sliding_window = 5, .full_layer = 1});
}

// model.head_dim travels as config.json's head_dim, which the oracle reads as transformers does.
TEST(HfOracleWideHeads, ExportedFilesGiveTrainyardsLogits) {
  CheckAgainstTheOracle(ModelFamily::kLlama, MeshCase{.name = "dp1", .head_dim = 24});
}

INSTANTIATE_TEST_SUITE_P(Families, HfOracle,
                         ::testing::Values(ModelFamily::kGpt2, ModelFamily::kLlama),
                         [](const auto& info) { return config::FamilyName(info.param); });

}  // namespace
}  // namespace trainyard::worker
