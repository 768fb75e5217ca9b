// The planner's arithmetic against values worked out by hand here: the 1F1B bubble, PaLM's FLOP
// count, Young–Daly, the ZeRO sharding factors and their padding, ring bytes, the engine's limits
// on meshes, the choice and its explanation, the device profiles, and context parallelism (its
// activations, ring buffers and traffic, the ring's overlap with attention, and when it is
// chosen), and mixture-of-experts models (active FLOPs, their activations, a given mesh only).
#include "planner/planner.h"

#include <cmath>
#include <set>
#include <vector>

#include "config/mesh.h"
#include "gtest/gtest.h"
#include "planner/device_profile.h"
#include "planner/memory_model.h"
#include "planner/rank_shape.h"
#include "planner/traffic_model.h"

namespace trainyard::planner {
namespace {

// gpt2-debug: 2 layers, width 64, 4 heads, ffn 256, vocab 256, max_seq 64, tied embeddings.
// Per block: ln1 2·64 + qkv 192·64 + 192 + proj 64·64 + 64 + ln2 2·64 + fc 256·64 + 256
// + mlp proj 64·256 + 64 = 49984. Embeddings: wte 256·64 + wpe 64·64 = 20480; final norm 128.
constexpr int64_t kBlock =
    128 + 192 * 64 + 192 + 64 * 64 + 64 + 128 + 256 * 64 + 256 + 64 * 256 + 64;
constexpr int64_t kEmbeddings = 256 * 64 + 64 * 64;
constexpr int64_t kPsi = kEmbeddings + 2 * kBlock + 128;  // 120576

config::JobSpec Gpt2Debug(int devices) {
  config::JobSpec spec;
  spec.name = "plan";
  spec.model = *config::Preset("gpt2-debug");
  spec.training.batch = 8;
  spec.training.seq_len = 32;
  spec.resources.devices_per_node = devices;
  return spec;
}

config::ParallelismSpec Mesh(int dp, int tp, int pp, int zero) {
  config::ParallelismSpec m;
  m.dp = dp;
  m.tp = tp;
  m.pp = pp;
  m.zero = zero;
  return m;
}

TEST(Bubble, IsStagesMinusOneOverMicroBatchesPlusStagesMinusOne) {
  EXPECT_DOUBLE_EQ(BubbleFraction(1, 8), 0.0);
  EXPECT_DOUBLE_EQ(BubbleFraction(2, 4), 1.0 / 5.0);
  EXPECT_DOUBLE_EQ(BubbleFraction(4, 12), 3.0 / 15.0);
  EXPECT_DOUBLE_EQ(BubbleFraction(8, 1), 7.0 / 8.0);
}

TEST(Flops, FollowPalmsCount) {
  const config::JobSpec gpt2 = Gpt2Debug(1);
  ASSERT_EQ(gpt2.model.ParameterCount(), kPsi);
  // N excludes the position table (a lookup); the tied token embedding is the LM head's matmul.
  const double n = kPsi - 64 * 64;
  const double per_token = 6 * n + 12.0 * 2 * 64 * 32;
  EXPECT_DOUBLE_EQ(ModelFlopsPerStep(gpt2), per_token * 8 * 32);

  config::JobSpec llama = gpt2;
  llama.model = *config::Preset("llama-debug");  // untied: the input table is a lookup
  EXPECT_EQ(MatmulParameterCount(llama.model),
            llama.model.ParameterCount() - int64_t{llama.model.vocab} * llama.model.width);
}

// A sliding window of W = 8 over s = 32 positions: the queries see 1, 2, …, 8 keys and then 8
// each, (36 + 24·8) / 32 = 7.125 on average. PaLM's s is about twice the mean a causal query
// sees, so twice the window's mean, 14.25, stands in for 32.
TEST(Flops, ASlidingWindowCountsTheKeysItSees) {
  config::JobSpec llama = Gpt2Debug(1);
  llama.model = *config::Preset("llama-debug");
  const double n = static_cast<double>(MatmulParameterCount(llama.model));
  const double attention = 12.0 * llama.model.layers * llama.model.attention_width();
  EXPECT_DOUBLE_EQ(ModelFlopsPerStep(llama), (6 * n + attention * 32) * 8 * 32);
  llama.model.sliding_window = 8;
  EXPECT_DOUBLE_EQ(ModelFlopsPerStep(llama), (6 * n + attention * 14.25) * 8 * 32);
  llama.model.sliding_window = 32;  // the whole sequence: no change
  EXPECT_DOUBLE_EQ(ModelFlopsPerStep(llama), (6 * n + attention * 32) * 8 * 32);
}

// With the window in block 0 only, the whole model counts their mean, and each of two pipeline
// stages its own block's span: 14.25 on the first, 32 on the second.
TEST(Flops, EachStageCountsItsBlocksWindows) {
  config::JobSpec llama = Gpt2Debug(2);
  llama.model = *config::Preset("llama-debug");
  llama.model.sliding_window = 8;
  llama.model.full_attention_layers = {1};
  const double n = static_cast<double>(MatmulParameterCount(llama.model));
  const double width = llama.model.attention_width();
  EXPECT_DOUBLE_EQ(ModelFlopsPerStep(llama),
                   (6 * n + 12.0 * width * (14.25 + 32) / 2 * 2) * 8 * 32);
  const BackendShape backend{4, 1 << 20};
  const RankShape first = ShapeOf(llama, Mesh(1, 1, 2, 0), 0);
  const RankShape second = ShapeOf(llama, Mesh(1, 1, 2, 0), 1);
  EXPECT_DOUBLE_EQ(first.attended_span(), 14.25);
  EXPECT_DOUBLE_EQ(second.attended_span(), 32);
  const double tokens = static_cast<double>(first.rows());
  const double first_attention = WorkOf(first, backend).forward_flops -
                                 tokens * 2.0 * (first.matmul_params + first.head_params);
  const double second_attention = WorkOf(second, backend).forward_flops -
                                  tokens * 2.0 * (second.matmul_params + second.head_params);
  EXPECT_DOUBLE_EQ(first_attention, tokens * 4.0 * width * 14.25);
  EXPECT_DOUBLE_EQ(second_attention, tokens * 4.0 * width * 32);
}

TEST(YoungDaly, HigherOrderFormByHand) {
  // δ = 60 s, M = 24 h: √(2·60·86400) = 3219.9379; δ/(2M) = 3.4722e-4;
  // τ = 3219.9379 · (1 + 0.0186339/3 + 0.00034722/9) − 60 = 3180.0621.
  EXPECT_NEAR(YoungInterval(60, 86400), 3219.937887599697, 1e-9);
  EXPECT_NEAR(DalyInterval(60, 86400), 3180.0621135984475, 1e-9);
  EXPECT_DOUBLE_EQ(DalyInterval(7200, 3600), 3600);  // δ ≥ 2M: checkpoint every M

  PlanRequest request;
  request.spec = Gpt2Debug(2);
  request.device = *PublishedProfile("h100");
  request.checkpoint_seconds = 60;
  request.mtbf_hours = 24;
  absl::StatusOr<Plan> plan = MakePlan(request);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_TRUE(plan->young_daly.has_value());
  EXPECT_DOUBLE_EQ(plan->young_daly->mtbf_seconds, 86400);
  EXPECT_NEAR(plan->young_daly->interval_seconds, 3180.0621135984475, 1e-9);
}

TEST(Zero, ShardsStateByStage) {
  const config::JobSpec spec = Gpt2Debug(4);  // every group divides by 4: no padding
  const BackendShape cpu;
  struct Expected {
    int zero;
    int64_t params, grads, optimizer;
  } expected[] = {{0, 4 * kPsi, 4 * kPsi, 8 * kPsi},
                  {1, 4 * kPsi, 4 * kPsi, 8 * kPsi / 4},
                  {2, 4 * kPsi, 4 * kPsi / 4, 8 * kPsi / 4},
                  {3, 4 * kPsi / 4, 4 * kPsi / 4, 8 * kPsi / 4}};
  for (const Expected& e : expected) {
    const RankMemory m = PredictRankMemory(ShapeOf(spec, Mesh(4, 1, 1, e.zero), 0), cpu);
    EXPECT_EQ(m.parameters, e.params) << "ZeRO-" << e.zero;
    EXPECT_EQ(m.gradients, e.grads) << "ZeRO-" << e.zero;
    EXPECT_EQ(m.optimizer, e.optimizer) << "ZeRO-" << e.zero;
  }
}

// With bf16 activations the engine keeps bf16 copies of the blocks' matmul weights and biases (2
// bytes an element, with the activations), except under ZeRO-3; fp32 activations convert nothing.
TEST(Zero, KeptWeightCopiesUnlessZero3) {
  const config::JobSpec spec = Gpt2Debug(4);
  const BackendShape cpu, bf16{.act_bytes = 2};
  const int64_t c = spec.model.width, ffn = spec.model.ffn_hidden;
  const int64_t block_weights = spec.model.layers * (4 * c * c + 2 * c * ffn + 5 * c + ffn);
  for (int zero : {0, 1, 2, 3}) {
    const RankShape shape = ShapeOf(spec, Mesh(4, 1, 1, zero), 0);
    EXPECT_EQ(shape.block_linear_params, block_weights);
    EXPECT_EQ(KeptWeightBytes(shape, cpu), 0);
    EXPECT_EQ(KeptWeightBytes(shape, bf16), zero < 3 ? 2 * block_weights : 0) << "ZeRO-" << zero;
    EXPECT_EQ(PredictRankMemory(shape, bf16).activations,
              ActivationSlots(shape) * ActivationSlotBytes(shape, bf16) +
                  PaddedHeadBytes(shape, bf16) + KeptWeightBytes(shape, bf16));
  }
}

TEST(Zero, PadsEachGroupToAMultipleOfDp) {
  // dp 3: chunks ⌈20480/3⌉ = 6827, ⌈49984/3⌉ = 16662 (twice), ⌈128/3⌉ = 43.
  config::JobSpec spec = Gpt2Debug(3);
  spec.training.batch = 6;
  const RankMemory zero0 = PredictRankMemory(ShapeOf(spec, Mesh(3, 1, 1, 0), 0), {});
  const RankMemory zero3 = PredictRankMemory(ShapeOf(spec, Mesh(3, 1, 1, 3), 0), {});
  EXPECT_EQ(zero0.parameters, 4 * 3 * (6827 + 2 * 16662 + 43));
  EXPECT_EQ(zero3.parameters, 4 * (6827 + 2 * 16662 + 43));
  EXPECT_EQ(zero3.optimizer, 8 * (6827 + 2 * 16662 + 43));
}

TEST(Traffic, RingBytesByHand) {
  // Ring all-reduce of c over n: 2c minus this rank's chunk and the next one's.
  EXPECT_EQ(RingAllReduceElements(10, 4, 0), 20 - 2 - 3);  // chunks 2, 3, 2, 3
  EXPECT_EQ(RingAllReduceElements(10, 1, 0), 0);
  const config::JobSpec spec = Gpt2Debug(2);
  const LoopOptions loop{.bucket_bytes = int64_t{1} << 30, .agreement_values = 1};
  // ZeRO-0, one bucket: Ψ elements sent (4Ψ bytes), then the loss and the agreement (2 floats
  // each, one of them sent).
  const RankShape zero0 = ShapeOf(spec, Mesh(2, 1, 1, 0), 0);
  EXPECT_EQ(TotalBytes(DataParallelTraffic(zero0, loop, 0)), 4 * kPsi + 8 + 8);
  // ZeRO-2 (micro_batch 0: each rank's 4 sequences are one micro-batch): the gradient
  // reduce-scattered once and the parameters all-gathered once, Ψ/2 elements each; then the loss
  // with the gradient norm (4 floats, two of them sent) and the agreement.
  const RankShape zero2 = ShapeOf(spec, Mesh(2, 1, 1, 2), 0);
  ASSERT_EQ(zero2.micro_batches, 1);
  EXPECT_EQ(TotalBytes(DataParallelTraffic(zero2, loop, 0)), 4 * kPsi / 2 * 2 + 3 * 8);
}

// Thread hand-overs of the communication thread, collective by collective: an overlapped one
// wakes it (1), an exposed one also wakes the waiting training thread (2); ZeRO-1/2's parameter
// gathers are one exposed collective for all groups.
TEST(Traffic, HandOversByHand) {
  config::JobSpec spec = Gpt2Debug(2);
  const LoopOptions loop{.bucket_bytes = int64_t{1} << 30, .agreement_values = 1};
  auto hand_overs = [&](int zero, Phase phase) {
    int64_t total = 0;
    for (const Collective& c : DataParallelTraffic(ShapeOf(spec, Mesh(2, 1, 1, zero), 0), loop, 0))
      if (c.phase == phase) total += c.repeat * c.hand_overs;
    return total;
  };
  // ZeRO-0 in one bucket: it is the last, exposed (2); the loss and the agreement (2 each).
  EXPECT_EQ(hand_overs(0, Phase::kExposed), 2 + 2 + 2);
  EXPECT_EQ(hand_overs(0, Phase::kBackward), 0);
  // ZeRO-2, one micro-batch: a reduce-scatter per group beside the backward pass (1 each); the
  // gathers' batch (2); the loss with the gradient norm, and the agreement (2 each).
  const RankShape zero2 = ShapeOf(spec, Mesh(2, 1, 1, 2), 0);
  const auto groups = static_cast<int64_t>(zero2.group_sizes.size());
  EXPECT_EQ(hand_overs(2, Phase::kBackward), groups);
  EXPECT_EQ(hand_overs(2, Phase::kExposed), 2 + 2 * 2);
  // ZeRO-1 in one bucket: the bucket (2), the gathers' batch (2), the two scalar sums (2 each).
  EXPECT_EQ(hand_overs(1, Phase::kExposed), 2 + 2 + 2 * 2);
  // Tensor parallelism runs on the training thread: no hand-overs.
  spec.resources.devices_per_node = 2;
  for (const Collective& c :
       TensorParallelTraffic(ShapeOf(spec, Mesh(1, 2, 1, 0), 0), BackendShape{4, 1 << 20}, loop, 0))
    EXPECT_EQ(c.hand_overs, 0);
}

// The engine's limits are the mesh validator's rules (config/mesh.h), so the planner offers only
// meshes a submission would accept.
TEST(Meshes, EngineLimitsAreApplied) {
  config::JobSpec spec = Gpt2Debug(4);
  spec.model.vocab = 250;  // not divisible by 4
  EXPECT_TRUE(config::FindMeshProblem(Mesh(1, 4, 1, 0), spec).has_value());
  EXPECT_FALSE(config::FindMeshProblem(Mesh(4, 1, 1, 0), spec).has_value());
  spec.model.vocab = 256;
  EXPECT_TRUE(config::FindMeshProblem(Mesh(2, 1, 2, 2), spec).has_value());  // tied across stages
  EXPECT_FALSE(config::FindMeshProblem(Mesh(2, 1, 2, 1), spec).has_value());
  for (const config::ParallelismSpec& mesh : ValidMeshes(spec)) {
    EXPECT_EQ(mesh.world_size(), 4);
    EXPECT_FALSE(mesh.pp > 1 && mesh.zero >= 2);
    EXPECT_FALSE(mesh.dp * mesh.cp == 1 && mesh.zero > 0);  // ZeRO shards over dp · cp
  }
}

TEST(Plan, ChoosesTheFastestMeshThatFits) {
  PlanRequest request;
  request.spec = Gpt2Debug(4);
  request.device = *PublishedProfile("h100");
  absl::StatusOr<Plan> plan = MakePlan(request);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_TRUE(plan->chosen.has_value());
  const Candidate& chosen = plan->candidates[*plan->chosen];
  for (const Candidate& c : plan->candidates) {
    if (c.fits) {
      EXPECT_LE(chosen.step.total, c.step.total);
    }
  }
  EXPECT_EQ(plan->explanation.rfind("Chose " + MeshName(chosen.mesh), 0), 0u) << plan->explanation;
}

TEST(Plan, SaysWhenNothingFits) {
  PlanRequest request;
  request.spec = Gpt2Debug(2);
  request.device = *PublishedProfile("h100");
  request.device.memory_bytes = 1 << 20;  // 1 MiB
  absl::StatusOr<Plan> plan = MakePlan(request);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_FALSE(plan->chosen.has_value());
  EXPECT_EQ(plan->explanation.rfind("Nothing fits", 0), 0u) << plan->explanation;
}

// `schedule: auto`: a pipelined mesh is planned under every schedule it can run, the fastest
// that fits is chosen, and the explanation names the others with their steps; a mesh whose
// memory the faster schedules overflow runs the one that fits.
TEST(Plan, ScheduleAutoChoosesTheFastestScheduleThatFits) {
  PlanRequest request;
  request.spec = Gpt2Debug(2);
  request.spec.model = *config::Preset("gpt2-124m");  // 12 layers: compute, not latency, dominates
  request.spec.training.seq_len = 1024;
  request.spec.training.micro_batch = 1;  // 8 micro-batches per step
  request.spec.parallelism.automatic_schedule = true;
  request.device = *PublishedProfile("h100");
  request.mesh = Mesh(1, 1, 2, 0);
  request.mesh->automatic_schedule = true;
  const std::vector<config::ParallelismSpec> options = ScheduleOptions(*request.mesh, request.spec);
  // 1F1B, ZB-H1, interleaved over 2 and 3 chunks (12 layers do not split into 2 · 4 chunks).
  ASSERT_EQ(options.size(), 4u);
  EXPECT_EQ(options[1].schedule, config::PipelineSchedule::kZeroBubble);
  EXPECT_EQ(options[2].schedule, config::PipelineSchedule::kInterleaved);
  EXPECT_EQ(options[2].virtual_stages, 2);
  EXPECT_EQ(options[3].virtual_stages, 3);
  absl::StatusOr<Plan> plan = MakePlan(request);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->candidates.size(), 4u);
  ASSERT_TRUE(plan->chosen.has_value());
  const Candidate& chosen = plan->candidates[*plan->chosen];
  for (const Candidate& c : plan->candidates) EXPECT_LE(chosen.step.total, c.step.total);
  EXPECT_NE(chosen.mesh.schedule, config::PipelineSchedule::kOneForwardOneBackward)
      << plan->explanation;  // both others shrink the bubble of these equal stages
  EXPECT_NE(plan->explanation.find("Schedule auto: "), std::string::npos) << plan->explanation;
  EXPECT_NE(plan->explanation.find("1f1b: step "), std::string::npos) << plan->explanation;

  // Room for the smallest footprint only: the schedule with it is chosen, the others are named
  // with what they would need.
  int64_t smallest = INT64_MAX, largest = 0;
  for (const Candidate& c : plan->candidates) {
    smallest = std::min(smallest, c.memory.total());
    largest = std::max(largest, c.memory.total());
  }
  request.device.memory_bytes = smallest;
  plan = MakePlan(request);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_TRUE(plan->chosen.has_value());
  EXPECT_EQ(plan->candidates[*plan->chosen].memory.total(), smallest);
  if (largest > smallest) {
    EXPECT_NE(plan->explanation.find("over the"), std::string::npos) << plan->explanation;
  }

  // A fixed schedule is planned as written.
  request.spec.parallelism.automatic_schedule = false;
  request.mesh->automatic_schedule = false;
  EXPECT_EQ(ScheduleOptions(*request.mesh, request.spec).size(), 1u);
}

TEST(Plan, RefusesAnImpossibleMesh) {
  PlanRequest request;
  request.spec = Gpt2Debug(2);
  request.device = *PublishedProfile("h100");
  request.mesh = Mesh(3, 1, 1, 0);
  absl::StatusOr<Plan> plan = MakePlan(request);
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(Profiles, PublishedFiguresAndTheCpuFile) {
  absl::StatusOr<DeviceProfile> h100 = PublishedProfile("h100");
  ASSERT_TRUE(h100.ok());
  EXPECT_EQ(h100->memory_bytes, int64_t{80} << 30);
  EXPECT_DOUBLE_EQ(h100->peak_flops, 989.4e12);
  EXPECT_EQ(PublishedProfile("h200")->memory_bytes, int64_t{141} << 30);
  EXPECT_EQ(PublishedProfile("a100").status().code(), absl::StatusCode::kInvalidArgument);

  EXPECT_EQ(CpuProfilePath("/x", "/home/u"), "/x/trainyard/cpu-profile.json");
  EXPECT_EQ(CpuProfilePath(nullptr, "/home/u"), "/home/u/.config/trainyard/cpu-profile.json");
  EXPECT_EQ(CpuProfilePath(nullptr, nullptr), "");

  DeviceProfile cpu;
  cpu.memory_bytes = 1 << 30;
  cpu.peak_flops = 2e10;
  cpu.matmul_flops = 1e10;
  cpu.memory_bytes_per_second = 5e9;
  cpu.intra_node = cpu.inter_node = Link{.alpha_seconds = 3e-5, .bytes_per_second = 1e9};
  absl::StatusOr<DeviceProfile> back = ProfileFromJson(ProfileToJson(cpu));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(back->calibrated);
  EXPECT_DOUBLE_EQ(back->matmul_flops, 1e10);
  EXPECT_DOUBLE_EQ(back->intra_node.alpha_seconds, 3e-5);
  EXPECT_EQ(ProfileFromJson("{\"memory_bytes\": 1}").status().code(),
            absl::StatusCode::kInvalidArgument);
}

// A calibrated cpu profile with per-rank figures for 1, 2 and 4 ranks on a 2-core machine.
DeviceProfile SharedCpu() {
  DeviceProfile cpu;
  cpu.shared_node = true;
  cpu.cores = 2;
  cpu.memory_bytes = int64_t{8} << 30;
  cpu.peak_flops = 2e11;
  cpu.matmul_flops = 1e11;
  cpu.memory_bytes_per_second = 4e10;
  cpu.intra_node = cpu.inter_node = Link{.alpha_seconds = 7e-5, .bytes_per_second = 1.5e9};
  cpu.shared = {{.ranks = 1, .matmul_flops = 1.6e11, .link = {0, 1.5e9}},
                {.ranks = 2, .matmul_flops = 1e11, .link = {4e-4, 1.5e9}},
                {.ranks = 4,
                 .matmul_flops = 5e10,
                 .link = {3e-3, 1.5e9},
                 .lockstep_alpha_seconds = 5e-3,
                 .lockstep_matmul_flops = 8e10}};
  return cpu;
}

TEST(Profiles, RanksSharingTheCoresGetTheirCalibratedEntry) {
  const DeviceProfile cpu = SharedCpu();
  const DeviceProfile two = PerRankProfile(cpu, 2);
  EXPECT_DOUBLE_EQ(two.matmul_flops, 1e11);
  EXPECT_DOUBLE_EQ(two.intra_node.alpha_seconds, 4e-4);
  EXPECT_DOUBLE_EQ(two.inter_node.alpha_seconds, 4e-4);
  EXPECT_EQ(two.memory_bytes, int64_t{4} << 30);
  EXPECT_DOUBLE_EQ(two.memory_bytes_per_second, 2e10);
  EXPECT_DOUBLE_EQ(two.peak_flops, 1e11);
  EXPECT_FALSE(two.overlap);  // two one-thread ranks keep both cores computing
  // Three ranks: the entry for two, its rate shared three ways; its link.
  const DeviceProfile three = PerRankProfile(cpu, 3);
  EXPECT_DOUBLE_EQ(three.matmul_flops, 1e11 * 2 / 3);
  EXPECT_DOUBLE_EQ(three.intra_node.alpha_seconds, 4e-4);
  // One rank has no peer on the node: the machine's link stays.
  const DeviceProfile one = PerRankProfile(cpu, 1);
  EXPECT_DOUBLE_EQ(one.matmul_flops, 1.6e11);
  EXPECT_DOUBLE_EQ(one.intra_node.alpha_seconds, 7e-5);
  EXPECT_DOUBLE_EQ(PerRankProfile(cpu, 8).matmul_flops, 5e10 * 4 / 8);

  // Four ranks in lockstep: each message costs the wake-up of ranks that do not time-share (the
  // two-rank α), and each point all must reach the rest of the lockstep α (its probe's
  // collectives are one step each): 5e-3 − 4e-4. Not in lockstep: the pair's α, no skew.
  const DeviceProfile lockstep = PerRankProfile(cpu, 4, true);
  EXPECT_DOUBLE_EQ(lockstep.intra_node.alpha_seconds, 4e-4);
  EXPECT_DOUBLE_EQ(lockstep.sync_skew_seconds, 5e-3 - 4e-4);
  EXPECT_DOUBLE_EQ(PerRankProfile(cpu, 4).intra_node.alpha_seconds, 3e-3);
  EXPECT_DOUBLE_EQ(PerRankProfile(cpu, 4).sync_skew_seconds, 0);
  // A tensor-parallel rank in lockstep computes at the lockstep probe's rate, shared like the
  // matmul rate between entries; out of lockstep (a pipeline) it has none.
  EXPECT_DOUBLE_EQ(lockstep.tensor_parallel_matmul_flops, 8e10);
  EXPECT_DOUBLE_EQ(lockstep.matmul_flops, 5e10);
  EXPECT_DOUBLE_EQ(PerRankProfile(cpu, 8, true).tensor_parallel_matmul_flops, 8e10 * 4 / 8);
  EXPECT_DOUBLE_EQ(PerRankProfile(cpu, 4).tensor_parallel_matmul_flops, 0);
  // Without a lockstep measurement (the two-rank entry here), lockstep changes nothing.
  EXPECT_DOUBLE_EQ(PerRankProfile(cpu, 2, true).intra_node.alpha_seconds, 4e-4);
  EXPECT_DOUBLE_EQ(PerRankProfile(cpu, 2, true).sync_skew_seconds, 0);

  // Without entries, an even split; with a spare core, collectives overlap compute.
  DeviceProfile plain = cpu;
  plain.shared.clear();
  plain.cores = 3;
  EXPECT_DOUBLE_EQ(PerRankProfile(plain, 2).matmul_flops, 5e10);
  EXPECT_TRUE(PerRankProfile(plain, 2).overlap);
  EXPECT_FALSE(PerRankProfile(plain, 3).overlap);
}

TEST(Profiles, SharedRanksSurviveTheFileAndBadOnesAreRefused) {
  absl::StatusOr<DeviceProfile> back = ProfileFromJson(ProfileToJson(SharedCpu()));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->cores, 2);
  ASSERT_EQ(back->shared.size(), 3u);
  EXPECT_EQ(back->shared[2].ranks, 4);
  EXPECT_DOUBLE_EQ(back->shared[2].matmul_flops, 5e10);
  EXPECT_DOUBLE_EQ(back->shared[1].link.alpha_seconds, 4e-4);
  EXPECT_DOUBLE_EQ(back->shared[2].lockstep_alpha_seconds, 5e-3);
  EXPECT_DOUBLE_EQ(back->shared[1].lockstep_alpha_seconds, 0);
  EXPECT_DOUBLE_EQ(back->shared[2].lockstep_matmul_flops, 8e10);
  EXPECT_DOUBLE_EQ(back->shared[1].lockstep_matmul_flops, 0);
  DeviceProfile background = SharedCpu();
  background.shared[1].background_alpha_seconds = 1e-4;
  absl::StatusOr<DeviceProfile> with_background = ProfileFromJson(ProfileToJson(background));
  ASSERT_TRUE(with_background.ok()) << with_background.status();
  EXPECT_DOUBLE_EQ(with_background->shared[1].background_alpha_seconds, 1e-4);
  EXPECT_DOUBLE_EQ(PerRankProfile(*with_background, 2).background_alpha_seconds, 1e-4);

  DeviceProfile unordered = SharedCpu();
  std::swap(unordered.shared[0], unordered.shared[1]);
  EXPECT_EQ(ProfileFromJson(ProfileToJson(unordered)).status().code(),
            absl::StatusCode::kInvalidArgument);
  DeviceProfile no_entries = SharedCpu();
  no_entries.shared.clear();
  absl::StatusOr<DeviceProfile> empty = ProfileFromJson(ProfileToJson(no_entries));
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_TRUE(empty->shared.empty());
}

// SharedCpu() with every measured figure scaled by `factor` and the reference named.
DeviceProfile ScaledCalibration(double factor, const std::string& reference = "gpt2-tiny") {
  DeviceProfile c = SharedCpu();
  c.calibrated = true;
  c.reference = reference;
  c.peak_flops *= factor;
  c.matmul_flops *= factor;
  c.memory_bytes_per_second *= factor;
  c.intra_node.alpha_seconds *= factor;
  c.inter_node.alpha_seconds *= factor;
  for (SharedRanks& e : c.shared) {
    e.matmul_flops *= factor;
    e.link.alpha_seconds *= factor;
    e.lockstep_alpha_seconds *= factor;
    e.lockstep_matmul_flops *= factor;
  }
  return c;
}

TEST(Profiles, TheStoredProfileIsTheMedianOfTheKeptCalibrations) {
  // Three draws: every figure's median is the middle one's, entry by entry.
  CpuProfileFile file = AddCalibration(std::nullopt, ScaledCalibration(1.0));
  EXPECT_EQ(file.calibrations.size(), 1u);
  EXPECT_DOUBLE_EQ(file.profile.shared[1].link.alpha_seconds, 4e-4);
  file = AddCalibration(file, ScaledCalibration(3.0));
  // Two: the mean of both.
  EXPECT_DOUBLE_EQ(file.profile.shared[1].link.alpha_seconds, 8e-4);
  file = AddCalibration(file, ScaledCalibration(1.5));
  ASSERT_EQ(file.calibrations.size(), 3u);
  EXPECT_DOUBLE_EQ(file.profile.matmul_flops, 1.5e11);
  EXPECT_DOUBLE_EQ(file.profile.intra_node.alpha_seconds, 7e-5 * 1.5);
  EXPECT_DOUBLE_EQ(file.profile.shared[1].link.alpha_seconds, 4e-4 * 1.5);
  EXPECT_DOUBLE_EQ(file.profile.shared[2].matmul_flops, 5e10 * 1.5);
  EXPECT_DOUBLE_EQ(file.profile.shared[2].lockstep_alpha_seconds, 5e-3 * 1.5);
  EXPECT_DOUBLE_EQ(file.profile.shared[2].lockstep_matmul_flops, 8e10 * 1.5);
  EXPECT_DOUBLE_EQ(file.profile.memory_bytes_per_second, 4e10 * 1.5);
  // A calibration from before the lockstep rate was measured has none (0): the median is over
  // those that have it, still the middle one of the three.
  DeviceProfile older = ScaledCalibration(1.0);
  older.shared[2].lockstep_matmul_flops = 0;
  const CpuProfileFile mixed = AddCalibration(file, older);
  ASSERT_EQ(mixed.calibrations.size(), 4u);
  EXPECT_DOUBLE_EQ(mixed.profile.shared[2].lockstep_matmul_flops, 8e10 * 1.5);
  EXPECT_DOUBLE_EQ(mixed.profile.shared[2].lockstep_alpha_seconds, (5e-3 * 1.5 + 5e-3) / 2);

  // At most kKeptCalibrations: the oldest go first.
  for (int i = 0; i < kKeptCalibrations; ++i) file = AddCalibration(file, ScaledCalibration(2.0));
  ASSERT_EQ(file.calibrations.size(), static_cast<size_t>(kKeptCalibrations));
  EXPECT_DOUBLE_EQ(file.profile.matmul_flops, 2e11);

  // Another reference, or another machine, starts over.
  EXPECT_EQ(AddCalibration(file, ScaledCalibration(1.0, "llama-debug")).calibrations.size(), 1u);
  DeviceProfile bigger = ScaledCalibration(1.0);
  bigger.cores = 4;
  EXPECT_EQ(AddCalibration(file, bigger).calibrations.size(), 1u);
}

TEST(Profiles, TheCalibrationsSurviveTheFileAndAnOlderFileLoads) {
  CpuProfileFile file = AddCalibration(std::nullopt, ScaledCalibration(1.0, "gpt2, \"tiny\" × 4"));
  file = AddCalibration(file, ScaledCalibration(2.0, "gpt2, \"tiny\" × 4"));
  absl::StatusOr<CpuProfileFile> back = ProfileFileFromJson(ProfileFileToJson(file));
  ASSERT_TRUE(back.ok()) << back.status() << ProfileFileToJson(file);
  ASSERT_EQ(back->calibrations.size(), 2u);
  EXPECT_EQ(back->calibrations[0].reference, "gpt2, \"tiny\" × 4");
  EXPECT_DOUBLE_EQ(back->calibrations[1].shared[1].link.alpha_seconds, 8e-4);
  EXPECT_DOUBLE_EQ(back->profile.shared[1].link.alpha_seconds, 6e-4);
  EXPECT_NE(back->profile.description.find("the median of 2 calibrations"), std::string::npos);
  // Read back, the history still grows: the reference compares equal after the round trip.
  EXPECT_EQ(AddCalibration(*back, ScaledCalibration(1.0, "gpt2, \"tiny\" × 4")).calibrations.size(),
            3u);

  // A file of one profile without the list (written before calibrations were kept).
  absl::StatusOr<CpuProfileFile> older = ProfileFileFromJson(ProfileToJson(SharedCpu()));
  ASSERT_TRUE(older.ok()) << older.status();
  EXPECT_TRUE(older->calibrations.empty());
  EXPECT_DOUBLE_EQ(older->profile.shared[1].link.alpha_seconds, 4e-4);
  // A malformed entry is refused, naming it.
  std::string bad = ProfileFileToJson(file);
  bad.replace(bad.rfind("\"matmul_flops\""), 14, "\"matmul_flopz\"");
  absl::StatusOr<CpuProfileFile> refused = ProfileFileFromJson(bad);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("calibration 2"), std::string::npos)
      << refused.status();
}

// The time model reads the per-rank entry for the ranks sharing the node, and exposes every
// data-parallel collective when no core is spare for them.
TEST(Plan, SharedCoresSlowComputeAndExposeReductions) {
  config::JobSpec spec = Gpt2Debug(2);
  spec.training.micro_batch = 1;  // four micro-batches per rank, each reduced beside its backward
  const DeviceProfile cpu = SharedCpu();
  const Candidate dp2 = Evaluate(spec, Mesh(2, 1, 1, 3), cpu, LoopOptions{});
  DeviceProfile spare = cpu;
  spare.cores = 3;  // two one-thread ranks leave a core to the collectives
  const Candidate dp2_spare = Evaluate(spec, Mesh(2, 1, 1, 3), spare, LoopOptions{});
  EXPECT_GT(dp2.step.communication, dp2_spare.step.communication);
  EXPECT_DOUBLE_EQ(dp2.step.compute, dp2_spare.step.compute);
  spec.resources.devices_per_node = 4;
  const Candidate dp4 = Evaluate(spec, Mesh(4, 1, 1, 0), cpu, LoopOptions{});
  const Candidate dp4_even = Evaluate(
      spec, Mesh(4, 1, 1, 0),
      [&] {
        DeviceProfile even = cpu;
        even.shared.clear();
        return even;
      }(),
      LoopOptions{});
  // The calibrated four-rank rate (5e10 per rank), not a quarter of the one-rank figure.
  EXPECT_LT(dp4.step.compute, dp4_even.step.compute);

  // Without pipelining the four ranks exchange in lockstep: the lockstep measurement prices their
  // tensor-parallel all-reduces (4e-4 + (5e-3 − 4e-4) = 5e-3, above the pair's 3e-3); a
  // pipeline's stages do not move in step and keep the pair's α.
  DeviceProfile no_lockstep = cpu;
  no_lockstep.shared[2].lockstep_alpha_seconds = 0;
  EXPECT_GT(Evaluate(spec, Mesh(2, 2, 1, 0), cpu, LoopOptions{}).step.communication,
            Evaluate(spec, Mesh(2, 2, 1, 0), no_lockstep, LoopOptions{}).step.communication);
  EXPECT_DOUBLE_EQ(Evaluate(spec, Mesh(1, 2, 2, 0), cpu, LoopOptions{}).step.communication,
                   Evaluate(spec, Mesh(1, 2, 2, 0), no_lockstep, LoopOptions{}).step.communication);

  // In lockstep a tensor-parallel rank's passes run at the lockstep probe's rate (8e10, not the
  // entry's 5e10): by hand, each pass's FLOPs at the one rate less at the other. dp 4 has no
  // tensor parallelism, and a pipeline's passes keep the rates of the ranks working then.
  DeviceProfile no_tp_rate = cpu;
  no_tp_rate.shared[2].lockstep_matmul_flops = 0;
  const RankShape shape = ShapeOf(spec, Mesh(2, 2, 1, 0), 0);
  const MicroBatchWork work = WorkOf(shape, BackendShape{4, int64_t{1} << 20});
  EXPECT_NEAR(
      Evaluate(spec, Mesh(2, 2, 1, 0), no_tp_rate, LoopOptions{}).step.compute -
          Evaluate(spec, Mesh(2, 2, 1, 0), cpu, LoopOptions{}).step.compute,
      shape.micro_batches * (work.forward_flops + work.backward_flops) * (1 / 5e10 - 1 / 8e10),
      1e-12);
  EXPECT_DOUBLE_EQ(Evaluate(spec, Mesh(4, 1, 1, 0), cpu, LoopOptions{}).step.compute,
                   Evaluate(spec, Mesh(4, 1, 1, 0), no_tp_rate, LoopOptions{}).step.compute);
  EXPECT_DOUBLE_EQ(Evaluate(spec, Mesh(1, 2, 2, 0), cpu, LoopOptions{}).step.compute,
                   Evaluate(spec, Mesh(1, 2, 2, 0), no_tp_rate, LoopOptions{}).step.compute);
}

// Where the optimizer step was measured (cpu), a step's optimizer time is the parameters the
// rank owns over the entry's rate, shared like the matmul rate between entries; elsewhere AdamW
// streams 28 bytes per owned parameter at the memory bandwidth. By hand, on one-micro-batch
// dp 2: ZeRO-0 updates every parameter, ZeRO-1 half of them (the groups padded to even).
TEST(Plan, TheOptimizerStepAtItsMeasuredRate) {
  config::JobSpec spec = Gpt2Debug(2);
  spec.training.micro_batch = spec.training.batch / 2;
  DeviceProfile cpu = SharedCpu();
  const Candidate bandwidth = Evaluate(spec, Mesh(2, 1, 1, 0), cpu, LoopOptions{});
  cpu.shared[1].optimizer_elements_per_second = 1e7;
  const Candidate zero0 = Evaluate(spec, Mesh(2, 1, 1, 0), cpu, LoopOptions{});
  const Candidate zero1 = Evaluate(spec, Mesh(2, 1, 1, 1), cpu, LoopOptions{});
  const double params = static_cast<double>(zero0.memory.optimizer) / 8;
  const double owned = static_cast<double>(zero1.memory.optimizer) / 8;
  EXPECT_NEAR(zero0.step.compute - bandwidth.step.compute,
              params / 1e7 - 28 * params / (cpu.memory_bytes_per_second / 2), 1e-12);
  // ZeRO-1 changes nothing in the passes of one micro-batch, only the owned share.
  EXPECT_NEAR(zero0.step.compute - zero1.step.compute, (params - owned) / 1e7, 1e-12);
  // Three ranks: the two-rank entry's rate shared three ways.
  EXPECT_DOUBLE_EQ(PerRankProfile(cpu, 3).optimizer_elements_per_second, 1e7 * 2 / 3);
  // The rate survives the file and the median.
  absl::StatusOr<DeviceProfile> back = ProfileFromJson(ProfileToJson(cpu));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_DOUBLE_EQ(back->shared[1].optimizer_elements_per_second, 1e7);
  DeviceProfile other = cpu;
  other.shared[1].optimizer_elements_per_second = 3e7;
  EXPECT_DOUBLE_EQ(MedianProfile({cpu, other}).shared[1].optimizer_elements_per_second, 2e7);
}

// On a shared node a data-parallel collective's messages cost the communication thread's α
// beside compute while the ranks compute, and the machine's idle α when every rank waits for it
// (an exposed one, without pipelining); its hand-overs cost the link's α, but the step's scalar
// sums', run while no rank computes, the idle α. By hand, ZeRO-2 over two ranks in one
// micro-batch: a one-step reduce-scatter per group beside the backward pass; exposed, the
// gathers' batch (one step for all groups) and two one-step scalar sums (the loss with the
// gradient norm, and the agreement: two hand-overs each).
TEST(Plan, TheCommunicationThreadsMessagesCostTheirAlpha) {
  config::JobSpec spec = Gpt2Debug(2);
  const LoopOptions loop{.bucket_bytes = int64_t{1} << 30, .agreement_values = 1};
  const int64_t groups =
      static_cast<int64_t>(ShapeOf(spec, Mesh(2, 1, 1, 2), 0).group_sizes.size());
  DeviceProfile cpu = SharedCpu();
  const Candidate link_alpha = Evaluate(spec, Mesh(2, 1, 1, 2), cpu, loop);
  cpu.shared[1].background_alpha_seconds = 1e-4;
  const Candidate background = Evaluate(spec, Mesh(2, 1, 1, 2), cpu, loop);
  EXPECT_NEAR(link_alpha.step.communication - background.step.communication, groups * (4e-4 - 1e-4),
              1e-12);
  cpu.intra_node.alpha_seconds = 2e-5;  // the idle machine's α: 7e-5 before
  const Candidate idle = Evaluate(spec, Mesh(2, 1, 1, 2), cpu, loop);
  EXPECT_NEAR(background.step.communication - idle.step.communication,
              (1 + 2 + 2 * 2) * (7e-5 - 2e-5), 1e-12);
}

TEST(Plan, IdleStagesLeaveTheirCoresToTheWorkingOnes) {
  config::JobSpec spec = Gpt2Debug(4);
  const DeviceProfile cpu = SharedCpu();
  DeviceProfile unknown = cpu;
  unknown.cores = 0;  // without the cores, every pass at the profile of all four ranks
  // Four ranks on two cores: while one stage (two ranks) waits, the other's passes run at the
  // two-rank entry's rate and α.
  const Candidate pp = Evaluate(spec, Mesh(2, 1, 2, 1), cpu, LoopOptions{});
  const Candidate pp_all = Evaluate(spec, Mesh(2, 1, 2, 1), unknown, LoopOptions{});
  EXPECT_LT(pp.step.total, pp_all.step.total);
  EXPECT_LT(pp.step.compute, pp_all.step.compute);
  // Two ranks on two cores: each has its own core, an idle neighbour frees nothing (the
  // one-rank entry never applies).
  spec.resources.devices_per_node = 2;
  DeviceProfile faster_alone = cpu;
  faster_alone.shared[0].matmul_flops *= 10;
  const Candidate two = Evaluate(spec, Mesh(1, 1, 2, 0), cpu, LoopOptions{});
  const Candidate two_alone = Evaluate(spec, Mesh(1, 1, 2, 0), faster_alone, LoopOptions{});
  EXPECT_DOUBLE_EQ(two.step.total, two_alone.step.total);
  EXPECT_DOUBLE_EQ(two.step.bubble, two_alone.step.bubble);
}

config::ParallelismSpec ContextMesh(int dp, int cp, int tp, int zero) {
  config::ParallelismSpec m = Mesh(dp, tp, 1, zero);
  m.cp = cp;
  return m;
}

// A rank of cp ranks holds seq_len / cp tokens of every sequence: each per-row buffer of a
// micro-batch's slot has 1/cp of the rows, so the slot is the cp 1 slot / cp exactly (32 tokens
// split into 2 · cp chunks; 64 rows of logits fit in one chunk at every cp). Ring attention's
// buffers come once per rank, on top.
TEST(ContextParallel, ActivationsFallAsOneOverCp) {
  for (const char* preset : {"gpt2-debug", "llama-debug"}) {
    for (int tp : {1, 2}) {
      config::JobSpec spec = Gpt2Debug(4);
      spec.model = *config::Preset(preset);
      spec.training.micro_batch = 2;
      const int64_t slot = ActivationSlotBytes(ShapeOf(spec, ContextMesh(4 / tp, 1, tp, 0), 0), {});
      const RankMemory base =
          PredictRankMemory(ShapeOf(spec, ContextMesh(4 / tp, 1, tp, 0), 0), {});
      EXPECT_EQ(base.activations, slot);  // no ring at cp 1
      for (int cp : {2, 4}) {
        if (cp * tp > 4) continue;
        const RankShape shape = ShapeOf(spec, ContextMesh(4 / tp / cp, cp, tp, 0), 0);
        EXPECT_EQ(shape.local_seq, 32 / cp);
        EXPECT_EQ(cp * ActivationSlotBytes(shape, {}), slot)
            << preset << " tp " << tp << " cp " << cp;
        EXPECT_EQ(PredictRankMemory(shape, {}).activations, slot / cp + RingBufferBytes(shape, {}));
      }
    }
  }
}

// The ring's buffers by hand, for 2 sequences of 32 tokens: at cp 2 a rank holds n = 32 rows.
// gpt2-debug (4 heads, head_dim 16): keys and values kv = 32 · 2 · 4 · 16 = 4096 elements, five
// such buffers, a partial result of 16 · 4 · 16 = 1024 elements and its 16 · 4 log-sum-exps.
// llama-debug (4 heads, 2 key/value heads) over tp 2: kv = 32 · 2 · 1 · 16 = 1024, partial
// 16 · 2 · 16 = 512, lse 16 · 2.
TEST(ContextParallel, RingBufferBytesByHand) {
  config::JobSpec spec = Gpt2Debug(4);
  spec.training.micro_batch = 2;
  EXPECT_EQ(RingBufferBytes(ShapeOf(spec, ContextMesh(2, 2, 1, 0), 0), {}),
            (5 * 4096 + 1024) * 4 + 4 * 64);
  EXPECT_EQ(RingBufferBytes(ShapeOf(spec, ContextMesh(2, 2, 1, 0), 0), {.act_bytes = 2}),
            (5 * 4096 + 1024) * 2 + 4 * 64);
  EXPECT_EQ(RingBufferBytes(ShapeOf(spec, ContextMesh(4, 1, 1, 0), 0), {}), 0);
  spec.model = *config::Preset("llama-debug");
  EXPECT_EQ(RingBufferBytes(ShapeOf(spec, ContextMesh(1, 2, 2, 0), 0), {}),
            (5 * 1024 + 512) * 4 + 4 * 32);
}

// ZeRO and the gradient sums run over the dp · cp ranks that hold the same parameters: dp 1 ×
// cp 2 shards and reduces exactly as dp 2 does.
TEST(ContextParallel, ZeroAndDataParallelTrafficSpanDpTimesCp) {
  config::JobSpec spec = Gpt2Debug(4);
  spec.training.micro_batch = 2;
  const LoopOptions loop{.bucket_bytes = int64_t{1} << 30, .agreement_values = 1};
  for (int zero : {0, 1, 2, 3}) {
    const RankShape cp = ShapeOf(spec, ContextMesh(2, 2, 1, zero), 0);
    const RankShape dp = ShapeOf(spec, ContextMesh(4, 1, 1, zero), 0);
    const RankMemory cp_memory = PredictRankMemory(cp, {}), dp_memory = PredictRankMemory(dp, {});
    EXPECT_EQ(cp_memory.parameters, dp_memory.parameters) << "ZeRO-" << zero;
    EXPECT_EQ(cp_memory.gradients, dp_memory.gradients) << "ZeRO-" << zero;
    EXPECT_EQ(cp_memory.optimizer, dp_memory.optimizer) << "ZeRO-" << zero;
    // dp 4 runs half the micro-batches of dp 2 × cp 2 (each rank its own sequences).
    if (zero <= 1) {
      EXPECT_EQ(TotalBytes(DataParallelTraffic(cp, loop, 3)),
                TotalBytes(DataParallelTraffic(dp, loop, 3)));
    }
  }
  // The group rank of dp 1, cp 1 of dp 2 × cp 2: 1 · 2 + 1.
  EXPECT_EQ(DataGroupRank(ContextMesh(2, 2, 1, 0), {.dp = 1, .cp = 1}), 3);
  EXPECT_EQ(ShapeOf(spec, ContextMesh(1, 4, 1, 1), 0).chunk(0), (kEmbeddings + 3) / 4);
}

// Per block and micro-batch the keys and values go round cp − 1 times forward and cp − 1 times
// backward, their gradients cp times (recomputation: the forward's again). gpt2-debug, micro 2,
// 4 micro-batches of 2 layers: at cp 2 kv = 2 · 16 · 2 · 4 · 16 = 4096 floats, 1 + 1 + 2 sends;
// at cp 4 kv = 2 · 8 · 2 · 4 · 16 = 2048 floats, 3 + 3 + 4 sends.
TEST(ContextParallel, RingBytesByHand) {
  config::JobSpec spec = Gpt2Debug(4);
  spec.training.micro_batch = 2;
  const BackendShape cpu{};
  const RankShape cp2 = ShapeOf(spec, ContextMesh(1, 2, 1, 0), 0);
  ASSERT_EQ(cp2.micro_batches, 4);
  EXPECT_EQ(RingKeyValueElements(cp2), 4096);
  EXPECT_EQ(TotalBytes(ContextParallelTraffic(cp2, cpu)), 4 * 2 * (1 + 1 + 2) * 4096 * 4);
  EXPECT_EQ(TotalBytes(ContextParallelTraffic(ShapeOf(spec, ContextMesh(1, 4, 1, 0), 0), cpu)),
            4 * 2 * (3 + 3 + 4) * 2048 * 4);
  spec.model.recompute = true;
  EXPECT_EQ(TotalBytes(ContextParallelTraffic(ShapeOf(spec, ContextMesh(1, 2, 1, 0), 0), cpu)),
            4 * 2 * (1 + 1 + 1 + 2) * 4096 * 4);
  EXPECT_TRUE(ContextParallelTraffic(ShapeOf(spec, ContextMesh(4, 1, 1, 0), 0), cpu).empty());
}

// The ring's transfers hide behind attention per ring step: exposed is what a step's transfers
// take beyond its 1/cp of the block's attention; the gradient's last hop to its owner is always
// exposed. By hand for cp 4, with t one transfer, a the block's forward attention:
// forward 3·max(0, t − a/4), backward 2·max(0, t − 2a/4) + 2·max(0, 2t − 2a/4) + t, per block
// and micro-batch. Where the communicator does not overlap (the CUDA backend's), a = 0.
TEST(ContextParallel, RingTransfersHideBehindAttention) {
  config::JobSpec spec = Gpt2Debug(4);
  spec.training.micro_batch = 2;
  const config::ParallelismSpec mesh = ContextMesh(1, 4, 1, 0);
  const RankShape shape = ShapeOf(spec, mesh, 0);
  DeviceProfile device = *PublishedProfile("h100");
  EXPECT_FALSE(device.ring_overlap);  // GPU overlap not yet measured: every hop counted whole
  device.ring_overlap = true;
  device.matmul_flops = 1e9;  // a block's attention: 4 · 64 · 32 · 16 FLOPs, 131 µs
  const double bytes = RingKeyValueElements(shape) * device.act_bytes;
  const double a = 4.0 * 64 * 32 * shape.rows() / device.matmul_flops;
  auto exposed = [&](double t) {
    const double forward = 3 * std::max(0.0, t - a / 4);
    const double backward = 2 * std::max(0.0, t - a / 2) + 2 * std::max(0.0, 2 * t - a / 2) + t;
    return shape.micro_batches * shape.layers() * (forward + backward);
  };
  for (double bytes_per_second : {1e3, 1e15}) {  // transfers far slower, then far faster
    device.intra_node = Link{.alpha_seconds = 1e-9, .bytes_per_second = bytes_per_second};
    const double t = 1e-9 + bytes / bytes_per_second;
    const Candidate c = Evaluate(spec, mesh, device, LoopOptions{});
    EXPECT_NEAR(c.exposed.cp, exposed(t), 1e-9 * exposed(t)) << bytes_per_second;
    EXPECT_EQ(c.bytes_cp, TotalBytes(ContextParallelTraffic(shape, {.act_bytes = 2})));
  }
  // Fast links: only the last gradient hop of each block is left.
  EXPECT_NEAR(Evaluate(spec, mesh, device, LoopOptions{}).exposed.cp,
              shape.micro_batches * shape.layers() * (1e-9 + bytes / 1e15), 1e-15);
  // Without overlap every transfer is exposed: 3t forward, 2t + 2·2t + t backward.
  device.ring_overlap = false;
  const double t = 1e-9 + bytes / 1e15;
  EXPECT_NEAR(Evaluate(spec, mesh, device, LoopOptions{}).exposed.cp,
              shape.micro_batches * shape.layers() * 10 * t, 1e-9 * 10 * t);
}

// A rank's compute under cp: its seq_len / cp tokens, each attending over the whole sequence,
// so exactly 1/cp of the cp 1 rank's FLOPs for the same micro-batch.
TEST(ContextParallel, ComputeIsTheLocalTokensShare) {
  config::JobSpec spec = Gpt2Debug(4);
  spec.training.micro_batch = 2;
  const MicroBatchWork whole = WorkOf(ShapeOf(spec, ContextMesh(4, 1, 1, 0), 0), {});
  const MicroBatchWork half = WorkOf(ShapeOf(spec, ContextMesh(2, 2, 1, 0), 0), {});
  EXPECT_DOUBLE_EQ(2 * half.forward_flops, whole.forward_flops);
  EXPECT_DOUBLE_EQ(2 * half.backward_flops, whole.backward_flops);
}

// A sequence too long for any mesh without context parallelism: the planner splits it (cp 2),
// and says why; with memory to spare it keeps cp 1, which the ring only slows. GPU resources
// never get cp > 1 (the CUDA backend has no ring attention).
TEST(ContextParallel, ChosenForASequenceThatFitsNoOtherWay) {
  PlanRequest request;
  request.spec = Gpt2Debug(2);
  request.spec.model.max_seq = 4096;
  request.spec.training.seq_len = 4096;
  request.spec.training.batch = 2;
  request.spec.training.micro_batch = 1;
  request.device = SharedCpu();
  request.device.memory_bytes = int64_t{64} << 30;
  absl::StatusOr<Plan> roomy = MakePlan(request);
  ASSERT_TRUE(roomy.ok()) << roomy.status();
  ASSERT_TRUE(roomy->chosen.has_value());
  EXPECT_EQ(roomy->candidates[*roomy->chosen].mesh.cp, 1) << roomy->explanation;
  int64_t without = INT64_MAX, with = INT64_MAX;
  for (const Candidate& c : roomy->candidates) {
    (c.mesh.cp == 1 ? without : with) = std::min(c.mesh.cp == 1 ? without : with, c.memory.total());
  }
  ASSERT_LT(with, without) << "cp 2 halves the activations of the longest sequence";

  request.device.memory_bytes = 2 * with;  // two ranks share the node: `with` per rank
  absl::StatusOr<Plan> tight = MakePlan(request);
  ASSERT_TRUE(tight.ok()) << tight.status();
  ASSERT_TRUE(tight->chosen.has_value()) << tight->explanation;
  const Candidate& chosen = tight->candidates[*tight->chosen];
  EXPECT_EQ(chosen.mesh.cp, 2);
  EXPECT_GT(chosen.bytes_cp, 0);
  EXPECT_EQ(tight->explanation.rfind("Chose dp 1 × cp 2 × tp 1 × pp 1", 0), 0u)
      << tight->explanation;
  EXPECT_NE(tight->explanation.find("Context parallelism: cp 2 splits each sequence of 4096 "
                                    "tokens over 2 ranks (2048 each)"),
            std::string::npos)
      << tight->explanation;
  EXPECT_NE(tight->explanation.find("without it no mesh fits"), std::string::npos)
      << tight->explanation;

  // On GPU resources too; the CUDA backend's ring hides none of its transfers, which the
  // planner counts whole.
  request.spec.resources.kind = config::DeviceKind::kGpu;
  request.device.ring_overlap = false;
  absl::StatusOr<Plan> gpu = MakePlan(request);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  ASSERT_TRUE(gpu->chosen.has_value()) << gpu->explanation;
  const Candidate& on_gpu = gpu->candidates[*gpu->chosen];
  EXPECT_EQ(on_gpu.mesh.cp, 2);
  EXPECT_GT(on_gpu.exposed.cp, chosen.exposed.cp);
}

// cp is one of the degrees of the world's split, only where the sequence splits into 2 · cp.
TEST(ContextParallel, DegreesDivideTheWorldAndTheSequence) {
  config::JobSpec spec = Gpt2Debug(4);
  EXPECT_EQ(ContextParallelDegrees(spec), (std::vector<int>{1, 2, 4}));
  spec.training.seq_len = 36;  // 36 = 2 · 18: cp 2 only (36 % 8 ≠ 0)
  spec.model.max_seq = 64;
  EXPECT_EQ(ContextParallelDegrees(spec), (std::vector<int>{1, 2}));
  spec.resources.kind = config::DeviceKind::kGpu;
  EXPECT_EQ(ContextParallelDegrees(spec), (std::vector<int>{1, 2}));
}

// gpt2-debug with four experts of hidden size 32 in every block, top-2, one shared expert.
// One such MLP: fc 32·64 + 32, proj 64·32 + 64 = 4192 parameters.
config::JobSpec Gpt2DebugMoe(int devices) {
  config::JobSpec spec = Gpt2Debug(devices);
  spec.model.moe = config::MoeConfig{.experts = 4, .top_k = 2, .shared_experts = 1, .ffn = 32};
  return spec;
}

// PaLM's N counts what one token uses: per block the router (4·64), two routed experts and the
// shared one (3 · 4192) besides attention and norms (16896); with the embeddings (wte 256·64;
// wpe 64·64, a lookup, left out) and the final norm (128): N = 16384 + 128 + 2·(16896 + 256 +
// 3·4192) = 75968, not the 92736 of all four experts.
TEST(Moe, ModelFlopsCountTheActiveParameters) {
  const config::JobSpec spec = Gpt2DebugMoe(2);
  EXPECT_EQ(MatmulParameterCount(spec.model), 75968);
  EXPECT_EQ(spec.model.ParameterCount() - 64 * 64, 92736);
  EXPECT_DOUBLE_EQ(ModelFlopsPerStep(spec), (6.0 * 75968 + 12.0 * 2 * 64 * 32) * 8 * 32);
}

// A rank's matmul weights per token: qkv 192·64, projection 64·64, the shared expert's 2·32·64,
// the router's 4·64 (whole on every tensor-parallel rank) and two routed experts' 2·32·64 each:
// 28928 per block; its weight pass (a split backward) leaves out the router and the routed
// experts, whose gradients the input-gradient pass computes: 20480. Under tp 2 everything but the
// router halves: 14592 and 10240.
TEST(Moe, RankMatmulsAreTheActiveOnes) {
  const config::JobSpec spec = Gpt2DebugMoe(2);
  const RankShape whole = ShapeOf(spec, Mesh(2, 1, 1, 0), 0);
  EXPECT_EQ(whole.matmul_params, 2 * 28928);
  EXPECT_EQ(whole.weight_pass_params, 2 * 20480);
  EXPECT_EQ(whole.moe_blocks(), 2);
  const RankShape half = ShapeOf(spec, Mesh(1, 2, 1, 0), 0);
  EXPECT_EQ(half.matmul_params, 2 * 14592);
  EXPECT_EQ(half.weight_pass_params, 2 * 10240);
  // One micro-batch's (4 × 32 tokens) forward FLOPs: per token 2 per weight (the tied head's
  // 256·64 included) and PaLM's attention, 4·64·32 per block.
  const MicroBatchWork work = WorkOf(whole, {});
  EXPECT_DOUBLE_EQ(work.forward_flops,
                   4.0 * 32 * (2.0 * (2 * 28928 + 256 * 64) + 2 * 4.0 * 64 * 32));
  // A block's routed experts and router form groups the layout keeps apart from the block's.
  EXPECT_EQ(whole.group_sizes.size(), size_t{6});  // embeddings, 2 × (block, experts), final
  EXPECT_EQ(whole.block_group(1), 3);
  EXPECT_EQ(whole.expert_group(1), 4);
}

// Top-2 against top-1 on one rank (n = 8 · 32 = 256 rows, fp32): each of the two saved MoE
// blocks holds n more picks: their weights and row weights (2n floats), sources and slots (2n
// ints), rows in, through fc (32) and the activation (32), and out (n · (64 + 32 + 32 + 64));
// the backward's scratch holds n more picks' output and input gradients (2n · 64), combine-weight
// gradients (n floats), and its fc and activation gradients widen from 32 to 2 · 32 (64n).
TEST(Moe, ActivationsHoldTopKPicksPerToken) {
  config::JobSpec top2 = Gpt2DebugMoe(1);
  config::JobSpec top1 = top2;
  top1.model.moe.top_k = 1;
  const int64_t n = 256;
  const int64_t per_block = 4 * (2 * n + 2 * n + n * (64 + 32 + 32 + 64));
  const int64_t scratch = 4 * (2 * n * 64 + n + 2 * n * 32);
  EXPECT_EQ(ActivationSlotBytes(ShapeOf(top2, Mesh(1, 1, 1, 0), 0), {}) -
                ActivationSlotBytes(ShapeOf(top1, Mesh(1, 1, 1, 0), 0), {}),
            2 * per_block + scratch);
}

// A plan for an MoE model searches expert parallelism too: every ep dividing dp and the experts,
// each ep > 1 candidate with its all-to-all bytes, ep 1 without; every axis and schedule
// evaluates.
TEST(Moe, PlansSearchExpertParallelism) {
  PlanRequest request;
  request.spec = Gpt2DebugMoe(4);
  request.spec.model.layers = 4;
  request.spec.training.micro_batch = 2;  // two per step at dp 2, as a pipeline needs
  request.device = *PublishedProfile("h100");
  absl::StatusOr<Plan> plan = MakePlan(request);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_TRUE(plan->chosen.has_value());
  std::set<int> degrees;
  for (const Candidate& c : plan->candidates) {
    degrees.insert(c.mesh.ep);
    EXPECT_EQ(c.bytes_ep > 0, c.mesh.ep > 1) << MeshName(c.mesh);
    EXPECT_DOUBLE_EQ(c.model_flops, ModelFlopsPerStep(request.spec)) << MeshName(c.mesh);
  }
  EXPECT_EQ(degrees, (std::set<int>{1, 2, 4}));
  EXPECT_EQ(ExpertParallelDegrees(request.spec, 4), (std::vector<int>{1, 2, 4}));
  EXPECT_EQ(ExpertParallelDegrees(request.spec, 3), (std::vector<int>{1}));  // 3 ∤ 4 experts
  request.spec.model.moe.experts = 0;
  EXPECT_EQ(ExpertParallelDegrees(request.spec, 4), (std::vector<int>{1}));
  request.spec.model.moe.experts = 4;
  // A given mesh, every axis and schedule.
  config::ParallelismSpec ep2 = Mesh(4, 1, 1, 3);
  ep2.ep = 2;
  config::ParallelismSpec tp_sp = Mesh(2, 2, 1, 1);
  tp_sp.sequence_parallel = true;
  tp_sp.ep = 2;
  config::ParallelismSpec zb = Mesh(2, 1, 2, 1);
  zb.schedule = config::PipelineSchedule::kZeroBubble;
  config::ParallelismSpec interleaved = Mesh(2, 1, 2, 0);
  interleaved.schedule = config::PipelineSchedule::kInterleaved;
  interleaved.virtual_stages = 2;
  interleaved.ep = 2;
  for (const config::ParallelismSpec& mesh : {ep2, tp_sp, zb, interleaved}) {
    ASSERT_FALSE(config::FindMeshProblem(mesh, request.spec).has_value()) << MeshName(mesh);
    request.mesh = mesh;
    absl::StatusOr<Plan> given = MakePlan(request);
    ASSERT_TRUE(given.ok()) << given.status();
    ASSERT_EQ(given->candidates.size(), 1u);
    const Candidate& c = given->candidates[0];
    EXPECT_GT(c.memory.activations, 0) << MeshName(mesh);
    EXPECT_GT(c.step.compute, 0) << MeshName(mesh);
    EXPECT_EQ(c.bytes_ep > 0, mesh.ep > 1) << MeshName(mesh);
  }
}

// Expert parallelism splits the routed experts, which ZeRO then shards over the dp / ep ranks
// holding the same ones; the all-to-alls carry (ep − 1) / ep of a micro-batch's picks each way
// in each pass, after an all-gather of the counts per expert.
TEST(Moe, ExpertParallelismSplitsTheExpertsAndCountsItsAllToAlls) {
  config::JobSpec spec = Gpt2DebugMoe(4);
  config::ParallelismSpec whole = Mesh(4, 1, 1, 0), split = whole;
  split.ep = 4;
  const RankShape all = ShapeOf(spec, whole, 0), quarter = ShapeOf(spec, split, 0);
  const config::MoeConfig& moe = spec.model.moe;
  const int64_t width = spec.model.width;
  // One expert: fc [32, 64] + bias 32, proj [64, 32] + bias 64 (GPT-2).
  const int64_t expert = 32 * width + 32 + width * 32 + width;
  const int64_t layers = spec.model.layers;
  EXPECT_EQ(all.local_params - quarter.local_params, layers * (moe.experts - 1) * expert);
  // ZeRO-1 shards the experts over dp / ep = 1 rank under ep 4: a rank keeps its own experts'
  // moments, as many as a quarter of all of them (ZeRO-1 over four ranks without ep), and a
  // quarter of the experts' parameters.
  split.zero = 1;
  whole.zero = 1;
  const BackendShape cpu;
  const RankMemory split_memory = PredictRankMemory(ShapeOf(spec, split, 0), cpu);
  const RankMemory whole_memory = PredictRankMemory(ShapeOf(spec, whole, 0), cpu);
  EXPECT_EQ(split_memory.parameters, 4 * quarter.local_params);
  EXPECT_EQ(split_memory.optimizer, whole_memory.optimizer);
  EXPECT_LT(split_memory.parameters, whole_memory.parameters);
  // The all-to-alls: rows = micro 2 × 32 tokens, picks 2 per row, 3/4 of them to other ranks.
  split.zero = 0;
  const RankShape s = ShapeOf(spec, split, 0);
  ASSERT_EQ(s.rows(), 64);
  EXPECT_EQ(ExchangedRows(s), 64 * 2 * 3 / 4);
  const int64_t per_block = 3 * 4 * moe.experts + 4 * ExchangedRows(s) * width * 4;
  const int64_t norm = 4 * RingAllReduceElements(2, 4, 0);  // the experts' share, ZeRO-0
  EXPECT_EQ(TotalBytes(ExpertParallelTraffic(s, cpu)), layers * per_block + norm);
  EXPECT_TRUE(ExpertParallelTraffic(all, cpu).empty());
  // The dp axis reduces only the dense groups over all four ranks; the experts' groups have no
  // one to share them with.
  EXPECT_LT(TotalBytes(DataParallelTraffic(s, LoopOptions{}, 0)),
            TotalBytes(DataParallelTraffic(all, LoopOptions{}, 0)));
}

// A micro-batch's FLOPs follow what a token uses: more experts at the same top_k add only the
// router's 2 · 64 per expert, token and block; more picks per token add whole experts (2 · 4096).
TEST(Moe, FlopsFollowTopKNotTheExperts) {
  auto forward = [](int experts, int top_k) {
    config::JobSpec spec = Gpt2DebugMoe(2);
    spec.model.moe.experts = experts;
    spec.model.moe.top_k = top_k;
    return WorkOf(ShapeOf(spec, Mesh(2, 1, 1, 0), 0), {}).forward_flops;
  };
  const double tokens = 4 * 32, blocks = 2;
  EXPECT_DOUBLE_EQ(forward(16, 2) - forward(4, 2), tokens * blocks * 2 * 12 * 64);
  EXPECT_DOUBLE_EQ(forward(4, 4) - forward(4, 2), tokens * blocks * 2 * 2 * 4096);
}

}  // namespace
}  // namespace trainyard::planner
