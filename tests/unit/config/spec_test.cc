// Specs that must parse, and what they parse to.
#include "config/spec.h"

#include <cmath>
#include <cstdlib>
#include <map>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "config/mesh.h"
#include "gtest/gtest.h"

namespace trainyard::config {
namespace {

std::string ExamplesDir() {
  const char* source_dir = std::getenv("TRAINYARD_SOURCE_DIR");
  return absl::StrCat(source_dir == nullptr ? "." : source_dir, "/config/examples");
}

JobSpec MustParse(const std::string& yaml) {
  absl::StatusOr<JobSpec> spec = ParseJobSpec(yaml, "test.yaml");
  EXPECT_TRUE(spec.ok()) << spec.status();
  return spec.ok() ? *spec : JobSpec();
}

TEST(ExampleSpecsTest, TinyParses) {
  absl::StatusOr<JobSpec> spec = LoadJobSpec(*RealFileSystem(), ExamplesDir() + "/tiny.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->name, "tiny");
  EXPECT_EQ(spec->model.family, ModelFamily::kGpt2);
  EXPECT_EQ(spec->model.layers, 2);
  EXPECT_EQ(spec->model.width, 64);
  EXPECT_EQ(spec->data.source, "markov");
  EXPECT_EQ(spec->data.markov.vocab, 32);
  EXPECT_EQ(spec->data.markov.seed, 7u);
  EXPECT_EQ(spec->data.markov.train_tokens, 1000000);
  EXPECT_EQ(spec->training.steps, 300);
  EXPECT_EQ(spec->training.batch, 16);
  EXPECT_EQ(spec->training.seq_len, 32);
  EXPECT_DOUBLE_EQ(spec->training.lr, 3e-3);
  EXPECT_TRUE(ValidateJobSpec(*spec).ok());
}

TEST(ExampleSpecsTest, TinyLlamaAndGpt2Parse) {
  absl::StatusOr<JobSpec> llama =
      LoadJobSpec(*RealFileSystem(), ExamplesDir() + "/tiny-llama.yaml");
  ASSERT_TRUE(llama.ok()) << llama.status();
  EXPECT_EQ(llama->model.family, ModelFamily::kLlama);
  EXPECT_EQ(llama->model.kv_heads, 2);
  EXPECT_FALSE(llama->model.tied_embeddings);
  EXPECT_EQ(llama->training.micro_batch, 8);
  EXPECT_EQ(llama->data.markov.order, 2);

  absl::StatusOr<JobSpec> gpt2 = LoadJobSpec(*RealFileSystem(), ExamplesDir() + "/gpt2-124m.yaml");
  ASSERT_TRUE(gpt2.ok()) << gpt2.status();
  EXPECT_EQ(gpt2->model.vocab, 50257);
  EXPECT_EQ(gpt2->data.source, "bin");
  EXPECT_EQ(gpt2->data.path, "data/fineweb10B/fineweb_train_*.bin");
  EXPECT_EQ(gpt2->data.val_path, "data/fineweb10B/fineweb_val_*.bin");
  EXPECT_EQ(gpt2->training.seq_len, 1024);
  EXPECT_DOUBLE_EQ(gpt2->training.min_lr_ratio, 0.0);
}

TEST(ExampleSpecsTest, EveryExampleParses) {
  absl::StatusOr<std::vector<std::string>> names = RealFileSystem()->ListDir(ExamplesDir());
  ASSERT_TRUE(names.ok()) << names.status();
  int yaml_files = 0;
  for (const std::string& name : *names) {
    if (!absl::EndsWith(name, ".yaml")) continue;
    ++yaml_files;
    absl::StatusOr<JobSpec> spec = LoadJobSpec(*RealFileSystem(), ExamplesDir() + "/" + name);
    EXPECT_TRUE(spec.ok()) << name << ": " << spec.status();
  }
  EXPECT_GE(yaml_files, 5);
}

TEST(ExampleSpecsTest, TwoRankAndLlama1bParse) {
  absl::StatusOr<JobSpec> two = LoadJobSpec(*RealFileSystem(), ExamplesDir() + "/tiny-2rank.yaml");
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_EQ(two->parallelism.dp, 2);
  EXPECT_EQ(two->world_size(), 2);
  EXPECT_EQ(two->resources.kind, DeviceKind::kCpu);
  EXPECT_EQ(two->resources.devices_per_node, 2);
  EXPECT_EQ(two->fault_tolerance.max_restarts, 2);

  absl::StatusOr<JobSpec> llama = LoadJobSpec(*RealFileSystem(), ExamplesDir() + "/llama-1b.yaml");
  ASSERT_TRUE(llama.ok()) << llama.status();
  EXPECT_EQ(llama->model.family, ModelFamily::kLlama);
  EXPECT_EQ(llama->model.vocab, 50304);
  EXPECT_EQ(llama->resources.kind, DeviceKind::kGpu);
  EXPECT_EQ(llama->world_size(), 16);
  EXPECT_EQ(llama->parallelism.tp, 4);
  EXPECT_EQ(llama->parallelism.zero, 1);
  EXPECT_TRUE(llama->checkpoint.enabled());
  EXPECT_FALSE(llama->checkpoint.every_steps.has_value());  // auto
  EXPECT_EQ(llama->min_nodes(), 1);
  EXPECT_EQ(llama->max_nodes(), 2);
  EXPECT_DOUBLE_EQ(llama->fault_tolerance.heartbeat_timeout_s, 30.0);
  EXPECT_EQ(llama->priority, 10);
  EXPECT_EQ(llama->labels.at("team"), "research");
}

TEST(ParseJobSpecTest, RunSectionDefaults) {
  JobSpec spec = MustParse("name: minimal\nmodel: {preset: gpt2-debug}\n");
  EXPECT_FALSE(spec.parallelism.automatic);
  EXPECT_FALSE(spec.parallelism.sequence_parallel);
  EXPECT_EQ(spec.parallelism.schedule, PipelineSchedule::kOneForwardOneBackward);
  EXPECT_EQ(spec.parallelism.virtual_stages, 1);
  EXPECT_EQ(spec.world_size(), 1);
  EXPECT_EQ(spec.parallelism.zero, 0);
  EXPECT_EQ(spec.resources.nodes, 1);
  EXPECT_EQ(spec.resources.devices_per_node, 1);
  EXPECT_EQ(spec.resources.kind, DeviceKind::kCpu);
  EXPECT_FALSE(spec.checkpoint.enabled());
  EXPECT_EQ(spec.fault_tolerance.max_restarts, 2);
  EXPECT_EQ(spec.fault_tolerance.min_nodes, 1);  // filled in from resources.nodes
  EXPECT_EQ(spec.fault_tolerance.max_nodes, 1);
  EXPECT_DOUBLE_EQ(spec.fault_tolerance.heartbeat_timeout_s, 10.0);
  EXPECT_EQ(spec.priority, 0);
  EXPECT_TRUE(spec.labels.empty());
}

TEST(ParseJobSpecTest, FailureHandlingFields) {
  JobSpec spec = MustParse(R"(name: ft
model: {preset: gpt2-debug}
checkpoint: {dir: ckpt, min_every_steps: 5, max_every_steps: 500}
fault_tolerance:
  max_restarts: 4
  max_restarts_by_cause: {hang: 1, node_lost: 4}
  backoff_initial_s: 0.5
  backoff_max_s: 8
  backoff_multiplier: 3
  backoff_jitter: 0
  hang_floor_s: 5
  hang_step_multiple: 20
  hang_startup_s: 120
  straggler_margin: 0.5
  straggler_window: 8
)");
  EXPECT_FALSE(spec.checkpoint.every_steps.has_value());  // auto, the default
  EXPECT_EQ(spec.checkpoint.min_every_steps, 5);
  EXPECT_EQ(spec.checkpoint.max_every_steps, 500);
  EXPECT_EQ(spec.checkpoint.interval_steps(), 100);  // standalone auto, within the bounds
  const FaultToleranceSpec& f = spec.fault_tolerance;
  EXPECT_EQ(f.max_restarts_by_cause, (std::map<std::string, int>{{"hang", 1}, {"node_lost", 4}}));
  EXPECT_DOUBLE_EQ(f.backoff_initial_s, 0.5);
  EXPECT_DOUBLE_EQ(f.backoff_max_s, 8);
  EXPECT_DOUBLE_EQ(f.backoff_multiplier, 3);
  EXPECT_DOUBLE_EQ(f.backoff_jitter, 0);
  EXPECT_DOUBLE_EQ(f.hang_floor_s, 5);
  EXPECT_DOUBLE_EQ(f.hang_step_multiple, 20);
  EXPECT_DOUBLE_EQ(f.hang_startup_s, 120);
  EXPECT_DOUBLE_EQ(f.straggler_margin, 0.5);
  EXPECT_EQ(f.straggler_window, 8);
  // Defaults fit every valid spec.
  const FaultToleranceSpec d = MustParse("name: d\nmodel: {preset: gpt2-debug}\n").fault_tolerance;
  EXPECT_DOUBLE_EQ(d.backoff_initial_s, 1);
  EXPECT_DOUBLE_EQ(d.hang_floor_s, 10);
  EXPECT_DOUBLE_EQ(d.hang_startup_s, 600);
  EXPECT_TRUE(d.max_restarts_by_cause.empty());
}

TEST(ParseJobSpecTest, FullRunSections) {
  JobSpec spec = MustParse(R"(name: full
model: {preset: llama-debug}
training: {batch: 12, micro_batch: 3}
parallelism: {dp: 2, tp: 2, pp: 2, zero: 3, sequence_parallel: true, schedule: zero-bubble}
resources: {nodes: 2, devices_per_node: 4, kind: gpu}
checkpoint: {dir: ckpt/full, every_steps: 250, keep: 5}
fault_tolerance: {max_restarts: 0, min_nodes: 1, max_nodes: 2, heartbeat_timeout_s: 2.5}
priority: -7
labels: {team: infra, cost-center: 1234, example.com/owner: "ada", empty: ""}
)");
  EXPECT_EQ(spec.parallelism.dp, 2);
  EXPECT_EQ(spec.parallelism.tp, 2);
  EXPECT_EQ(spec.parallelism.pp, 2);
  EXPECT_EQ(spec.parallelism.zero, 3);
  EXPECT_TRUE(spec.parallelism.sequence_parallel);
  EXPECT_EQ(spec.parallelism.schedule, PipelineSchedule::kZeroBubble);
  EXPECT_EQ(spec.world_size(), 8);
  EXPECT_EQ(spec.resources.world_size(), 8);
  EXPECT_EQ(spec.resources.kind, DeviceKind::kGpu);
  EXPECT_EQ(spec.checkpoint.dir, "ckpt/full");
  EXPECT_EQ(spec.checkpoint.every_steps, 250);
  EXPECT_EQ(spec.checkpoint.keep, 5);
  EXPECT_EQ(spec.fault_tolerance.max_restarts, 0);
  EXPECT_EQ(spec.min_nodes(), 1);
  EXPECT_EQ(spec.max_nodes(), 2);
  EXPECT_DOUBLE_EQ(spec.fault_tolerance.heartbeat_timeout_s, 2.5);
  EXPECT_EQ(spec.priority, -7);
  const std::map<std::string, std::string> labels = {
      {"team", "infra"}, {"cost-center", "1234"}, {"example.com/owner", "ada"}, {"empty", ""}};
  EXPECT_EQ(spec.labels, labels);
}

// Interleaved 1F1B: V chunks per pipeline rank, layers in pp · V equal chunks, micro-batches in
// whole rounds of pp. The ranks stay dp × tp × pp: virtual stages add chunks, not processes.
TEST(ParseJobSpecTest, InterleavedScheduleWithVirtualStages) {
  JobSpec spec = MustParse(R"(name: interleaved
model: {preset: gpt2-debug, layers: 4}
training: {batch: 8, micro_batch: 2}
parallelism: {pp: 2, schedule: interleaved, virtual_stages: 2}
resources: {devices_per_node: 2}
)");
  EXPECT_EQ(spec.parallelism.schedule, PipelineSchedule::kInterleaved);
  EXPECT_EQ(spec.parallelism.virtual_stages, 2);
  EXPECT_EQ(spec.parallelism.pp, 2);
  EXPECT_EQ(spec.world_size(), 2);
  EXPECT_STREQ(ScheduleName(spec.parallelism.schedule), "interleaved");

  // Three chunks of two layers on each of two ranks, over dp 2: 16 / 2 / 2 = 4 micro-batches, two
  // rounds of pp.
  spec = MustParse(R"(name: interleaved
model: {preset: llama-debug, layers: 12}
training: {batch: 16, micro_batch: 2}
parallelism: {dp: 2, pp: 2, zero: 1, schedule: interleaved, virtual_stages: 3}
resources: {devices_per_node: 4}
)");
  EXPECT_EQ(spec.parallelism.schedule, PipelineSchedule::kInterleaved);
  EXPECT_EQ(spec.parallelism.virtual_stages, 3);
  EXPECT_EQ(spec.parallelism.dp, 2);
  EXPECT_EQ(spec.world_size(), 4);
}

// `schedule: auto` leaves the choice to the planner: until it chooses, the mesh runs 1F1B.
TEST(ParseJobSpecTest, AutomaticScheduleIsThePlannersToChoose) {
  const JobSpec spec = MustParse(R"(name: auto-schedule
model: {preset: gpt2-debug, layers: 4}
training: {batch: 8, micro_batch: 2}
parallelism: {pp: 2, schedule: auto}
resources: {devices_per_node: 2}
)");
  EXPECT_TRUE(spec.parallelism.automatic_schedule);
  EXPECT_FALSE(spec.parallelism.automatic);
  EXPECT_EQ(spec.parallelism.schedule, PipelineSchedule::kOneForwardOneBackward);
  EXPECT_EQ(spec.parallelism.virtual_stages, 1);
  EXPECT_EQ(ScheduleFromName("interleaved"), PipelineSchedule::kInterleaved);
  EXPECT_FALSE(ScheduleFromName("auto").has_value());
}

TEST(ParseJobSpecTest, AutoParallelismPrefersDataParallel) {
  // Four ranks and a batch of 8: pure data parallelism fits.
  JobSpec spec = MustParse(
      "name: a\nmodel: {preset: gpt2-debug}\nresources: {devices_per_node: 4}\n"
      "parallelism: auto\n");
  EXPECT_TRUE(spec.parallelism.automatic);
  EXPECT_EQ(spec.parallelism.dp, 4);
  EXPECT_EQ(spec.parallelism.tp, 1);
  EXPECT_EQ(spec.parallelism.pp, 1);

  // A batch of 6 is not divisible by dp 4, so two replicas of a two-way tensor-parallel model.
  spec = MustParse(
      "name: a\nmodel: {preset: gpt2-debug}\ntraining: {batch: 6}\n"
      "resources: {devices_per_node: 4}\nparallelism: auto\n");
  EXPECT_EQ(spec.parallelism.dp, 2);
  EXPECT_EQ(spec.parallelism.tp, 2);
  EXPECT_EQ(spec.parallelism.pp, 1);

  // One sequence per step and one device per node: tensor parallelism cannot cross nodes, so the
  // two nodes become two pipeline stages.
  spec = MustParse(
      "name: a\nmodel: {preset: gpt2-debug}\ntraining: {batch: 1}\n"
      "resources: {nodes: 2}\nparallelism: auto\n");
  EXPECT_EQ(spec.parallelism.dp, 1);
  EXPECT_EQ(spec.parallelism.tp, 1);
  EXPECT_EQ(spec.parallelism.pp, 2);
}

TEST(ParseJobSpecTest, MicroBatchIsPerRankUnderDataParallelism) {
  JobSpec spec = MustParse(
      "name: a\nmodel: {preset: gpt2-debug}\ntraining: {batch: 16, micro_batch: 4}\n"
      "resources: {devices_per_node: 2}\nparallelism: {dp: 2}\n");
  EXPECT_EQ(MicroBatchPerRank(spec.training, spec.parallelism), 4);
  spec.training.micro_batch = 0;
  EXPECT_EQ(MicroBatchPerRank(spec.training, spec.parallelism), 8);  // batch / dp
}

TEST(ParseJobSpecTest, MinimalSpecGetsDefaults) {
  JobSpec spec = MustParse("name: minimal\nmodel: {preset: gpt2-debug}\n");
  EXPECT_EQ(spec.name, "minimal");
  const TrainingSpec defaults;
  EXPECT_EQ(spec.training.steps, defaults.steps);
  EXPECT_EQ(spec.training.batch, defaults.batch);
  EXPECT_EQ(spec.training.micro_batch, 0);
  EXPECT_EQ(spec.training.schedule, "cosine");
  EXPECT_DOUBLE_EQ(spec.training.beta2, defaults.beta2);
  EXPECT_EQ(spec.data.source, "markov");
  EXPECT_EQ(spec.data.markov.vocab, MarkovSpec().vocab);
  EXPECT_EQ(spec.model.max_seq, 64);
}

// Qwen2's layout: a Llama model with biases on q, k and v, whose count grows by their rows.
TEST(ParseJobSpecTest, QkvBias) {
  JobSpec plain = MustParse("name: q\nmodel: {preset: llama-debug}\n");
  JobSpec biased = MustParse("name: q\nmodel: {preset: llama-debug, qkv_bias: true}\n");
  EXPECT_FALSE(plain.model.qkv_bias);
  EXPECT_TRUE(biased.model.qkv_bias);
  EXPECT_EQ(biased.model.ParameterCount() - plain.model.ParameterCount(),
            int64_t{plain.model.layers} * plain.model.qkv_width());
}

// Heads wider than width / heads (Mistral Nemo's and Qwen3's shape): q, k and v and the output
// projection grow with heads · head_dim; the model's width stays.
TEST(ParseJobSpecTest, HeadDim) {
  JobSpec plain = MustParse("name: q\nmodel: {preset: llama-debug}\n");
  JobSpec wide = MustParse("name: q\nmodel: {preset: llama-debug, head_dim: 24}\n");
  EXPECT_EQ(plain.model.head_dim(), 16);
  EXPECT_EQ(wide.model.head_dim(), 24);
  EXPECT_EQ(wide.model.attention_width(), 96);
  EXPECT_EQ(wide.model.qkv_width(), (4 + 2 * 2) * 24);
  // Per layer: q, k and v grow by 8 columns per head (4 + 2 · 2 heads), the output projection
  // by 4 · 8 input columns, each over the width of 64.
  EXPECT_EQ(wide.model.ParameterCount() - plain.model.ParameterCount(),
            int64_t{plain.model.layers} * (8 * 8 * 64 + 4 * 8 * 64));
  // Width and heads need not divide once head_dim is given.
  JobSpec odd = MustParse(
      "name: q\nmodel: {family: llama, layers: 1, width: 40, heads: 3, kv_heads: 1, head_dim: 16, "
      "ffn_hidden: 64, vocab: 64, max_seq: 64}\n");
  EXPECT_EQ(odd.model.qkv_width(), 80);
}

// Qwen3's layout: a Llama model with a norm over each query and each key head, one weight of
// head_dim for each.
TEST(ParseJobSpecTest, QkNorm) {
  JobSpec plain = MustParse("name: q\nmodel: {preset: llama-debug, head_dim: 32}\n");
  JobSpec normed =
      MustParse("name: q\nmodel: {preset: llama-debug, head_dim: 32, qk_norm: true}\n");
  EXPECT_FALSE(plain.model.qk_norm);
  EXPECT_TRUE(normed.model.qk_norm);
  EXPECT_EQ(normed.model.ParameterCount() - plain.model.ParameterCount(),
            int64_t{plain.model.layers} * 2 * 32);
  // OLMoE's: one norm over each token's whole q (heads · head_dim) and one over its k.
  JobSpec whole = MustParse(
      "name: q\nmodel: {preset: llama-debug, head_dim: 32, qk_norm: true, "
      "qk_norm_span: projection}\n");
  EXPECT_TRUE(whole.model.NormsWholeProjection());
  EXPECT_EQ(whole.model.q_norm_width(), whole.model.heads * 32);
  EXPECT_EQ(whole.model.k_norm_width(), whole.model.kv_heads * 32);
  EXPECT_EQ(whole.model.ParameterCount() - plain.model.ParameterCount(),
            int64_t{plain.model.layers} * (whole.model.heads + whole.model.kv_heads) * 32);
}

// A sliding window changes what the attention sees, not the parameters.
TEST(ParseJobSpecTest, SlidingWindow) {
  JobSpec plain = MustParse("name: w\nmodel: {preset: llama-debug}\n");
  JobSpec windowed = MustParse("name: w\nmodel: {preset: llama-debug, sliding_window: 4}\n");
  EXPECT_EQ(plain.model.sliding_window, 0);
  EXPECT_EQ(windowed.model.sliding_window, 4);
  EXPECT_EQ(windowed.model.ParameterCount(), plain.model.ParameterCount());
  // Local and global blocks: the window in block 0 only.
  JobSpec mixed = MustParse(
      "name: w\nmodel: {preset: llama-debug, sliding_window: 4, full_attention_layers: [1]}\n");
  EXPECT_EQ(mixed.model.WindowOf(0), 4);
  EXPECT_EQ(mixed.model.WindowOf(1), 0);
  EXPECT_EQ(windowed.model.WindowOf(1), 4);
  // At 16 positions a window of 4 counts as 2·(4·5/2 + 12·4)/16 = 7.25 positions, a full block 16.
  EXPECT_DOUBLE_EQ(windowed.model.AttendedSpan(16), 7.25);
  EXPECT_DOUBLE_EQ(mixed.model.AttendedSpan(16), (7.25 + 16) / 2);
}

// Gemma's MLP gate and embedding scale change what the parameters compute, not how many there are.
TEST(ParseJobSpecTest, GegluAndScaledEmbeddings) {
  JobSpec plain = MustParse("name: g\nmodel: {preset: llama-debug}\n");
  JobSpec gemma = MustParse(
      "name: g\nmodel: {preset: llama-debug, activation: geglu, scale_embeddings: true}\n");
  JobSpec swiglu = MustParse("name: g\nmodel: {preset: llama-debug, activation: swiglu}\n");
  EXPECT_FALSE(plain.model.geglu || plain.model.scale_embeddings || swiglu.model.geglu);
  EXPECT_TRUE(gemma.model.geglu && gemma.model.scale_embeddings);
  EXPECT_EQ(plain.model.embedding_scale(), 1.0f);
  EXPECT_EQ(gemma.model.embedding_scale(),
            static_cast<float>(std::sqrt(static_cast<double>(gemma.model.width))));
  EXPECT_EQ(gemma.model.ParameterCount(), plain.model.ParameterCount());
}

// Gemma 3's blocks: norms of the branches' outputs (two weights of width more per block) and a
// RoPE base of the local blocks' own.
TEST(ParseJobSpecTest, PostNormsAndLocalRope) {
  JobSpec plain = MustParse("name: g\nmodel: {preset: llama-debug}\n");
  JobSpec gemma3 = MustParse(
      "name: g\nmodel: {preset: llama-debug, post_norms: true, sliding_window: 4,\n"
      "  full_attention_layers: [1], rope_local_theta: 10000, rope_theta: 1000000}\n");
  EXPECT_TRUE(gemma3.model.post_norms);
  EXPECT_EQ(gemma3.model.rope_local_theta, 10000.0f);
  EXPECT_EQ(gemma3.model.ParameterCount() - plain.model.ParameterCount(),
            int64_t{plain.model.layers} * 2 * plain.model.width);
}

// OLMo 2's blocks: norms after each branch only, the two before them gone.
TEST(ParseJobSpecTest, NormsAfterEachBranchOnly) {
  JobSpec plain = MustParse("name: g\nmodel: {preset: llama-debug}\n");
  JobSpec olmo2 =
      MustParse("name: g\nmodel: {preset: llama-debug, post_norms: true, pre_norms: false}\n");
  EXPECT_FALSE(olmo2.model.pre_norms);
  EXPECT_TRUE(plain.model.pre_norms);
  EXPECT_EQ(olmo2.model.ParameterCount(), plain.model.ParameterCount());
}

// Gemma 2's scores: a scale of their own and soft caps, for either family; no parameters.
TEST(ParseJobSpecTest, ScoreScaleAndSoftCaps) {
  JobSpec plain = MustParse("name: g\nmodel: {preset: llama-debug}\n");
  EXPECT_EQ(plain.model.attention_scale(), 1.0f / std::sqrt(float(plain.model.head_dim())));
  JobSpec gemma2 = MustParse(
      "name: g\nmodel: {preset: llama-debug, attention_scale_dim: 144, attention_softcap: 50,\n"
      "  logit_softcap: 30}\n");
  EXPECT_EQ(gemma2.model.attention_scale_dim, 144);
  EXPECT_EQ(gemma2.model.attention_scale(), 1.0f / 12.0f);
  EXPECT_EQ(gemma2.model.attention_softcap, 50.0f);
  EXPECT_EQ(gemma2.model.logit_softcap, 30.0f);
  EXPECT_EQ(gemma2.model.ParameterCount(), plain.model.ParameterCount());
  JobSpec gpt2 = MustParse("name: g\nmodel: {preset: gpt2-debug, attention_softcap: 20}\n");
  EXPECT_EQ(gpt2.model.attention_softcap, 20.0f);
  // Both caps run on GPU ranks too (the CUDA attention and loss kernels take them).
  JobSpec on_gpus = MustParse(
      "name: g\nmodel: {preset: gpt2-debug, attention_softcap: 50, logit_softcap: 30}\n"
      "resources: {kind: gpu}\n");
  EXPECT_EQ(on_gpus.model.attention_softcap, 50.0f);
  EXPECT_EQ(on_gpus.model.logit_softcap, 30.0f);
}

// PaLM's z-loss on the logits: off unless given, an objective term that adds no parameters, on
// either family and either kind of rank.
TEST(ParseJobSpecTest, LogitZLoss) {
  JobSpec plain = MustParse("name: z\nmodel: {preset: llama-debug}\n");
  EXPECT_EQ(plain.model.z_loss_coeff, 0.0f);
  JobSpec z = MustParse("name: z\nmodel: {preset: gpt2-debug, z_loss_coeff: 1e-4}\n");
  EXPECT_EQ(z.model.z_loss_coeff, 1e-4f);
  EXPECT_EQ(z.model.moe.z_loss_coeff, 0.0f);  // the router's is another field
  EXPECT_EQ(z.model.ParameterCount(),
            MustParse("name: z\nmodel: {preset: gpt2-debug}\n").model.ParameterCount());
  JobSpec on_gpus = MustParse(
      "name: z\nmodel: {preset: llama-debug, z_loss_coeff: 1e-4}\nresources: {kind: gpu}\n");
  EXPECT_EQ(on_gpus.model.z_loss_coeff, 1e-4f);
}

// Documents: attention across the whole sequence unless a token begins each document; on either
// family, with every kind of mesh, adding no parameters.
TEST(ParseJobSpecTest, DocumentToken) {
  JobSpec plain = MustParse("name: d\nmodel: {preset: llama-debug}\n");
  EXPECT_EQ(plain.model.document_token, -1);
  JobSpec docs = MustParse(
      "name: d\nmodel: {preset: gpt2-debug, document_token: 255}\n"
      "training: {seq_len: 16}\nparallelism: {tp: 2, pp: 2, cp: 2}\n"
      "resources: {devices_per_node: 8}\n");
  EXPECT_EQ(docs.model.document_token, 255);
  EXPECT_EQ(docs.model.ParameterCount(),
            MustParse("name: d\nmodel: {preset: gpt2-debug}\n").model.ParameterCount());
  EXPECT_EQ(
      MustParse("name: d\nmodel: {preset: llama-debug, document_token: 0}\n").model.document_token,
      0);
}

// Latent attention: value heads as wide as the heads' unrotated part unless given; the packed
// row, the output width and the parameters follow from the ranks; the latents' own epsilon.
TEST(ParseJobSpecTest, LatentAttention) {
  const JobSpec j = MustParse(
      "name: m\nmodel:\n  preset: llama-debug\n  kv_heads: 4\n  head_dim: 24\n  rope_dim: 8\n"
      "  latent_attention: {q_rank: 32, kv_rank: 20}\n");
  const config::ModelConfig& m = j.model;
  EXPECT_EQ(m.latent.q_rank, 32);
  EXPECT_EQ(m.latent.kv_rank, 20);
  EXPECT_EQ(m.latent.value_dim, 16);
  EXPECT_EQ(m.value_head_dim(), 16);
  EXPECT_EQ(m.qkv_width(), 2 * 4 * 24 + 4 * 16);
  EXPECT_EQ(m.attention_width(), 4 * 16);
  EXPECT_EQ(m.attention_flop_width(), 4 * (24 + 16) / 2.0);
  // Per block: q_a, its norm, q_b; kv_a, its norm, kv_b; the output projection.
  const int64_t projections =
      32 * 64 + 32 + 96 * 32 + (20 + 8) * 64 + 20 + 4 * (16 + 16) * 20 + 64 * 64;
  const int64_t dense = MustParse("name: m\nmodel: {preset: llama-debug}\n").model.ParameterCount();
  EXPECT_EQ(m.ParameterCount(), dense + 2 * (projections - (64 + 2 * 32) * 64 - 64 * 64));
  const JobSpec narrow = MustParse(
      "name: m\nmodel:\n  preset: llama-debug\n  kv_heads: 4\n  rope_dim: 4\n"
      "  latent_attention: {kv_rank: 20, value_dim: 6}\ntraining: {seq_len: 16}\n"
      "parallelism: {tp: 2, pp: 2, cp: 2, sequence_parallel: true}\n"
      "resources: {devices_per_node: 8}\n");
  EXPECT_EQ(narrow.model.latent.q_rank, 0);
  EXPECT_EQ(narrow.model.latent.value_dim, 6);
  // The latents' norms take DeepSeek's 1e-6 whatever the model's take, unless given.
  EXPECT_EQ(m.latent.norm_eps, 1e-6f);
  EXPECT_EQ(m.norm_eps, 1e-5f);
  EXPECT_EQ(MustParse("name: m\nmodel:\n  preset: llama-debug\n  kv_heads: 4\n  rope_dim: 4\n"
                      "  latent_attention: {kv_rank: 20, norm_eps: 1e-5}\n")
                .model.latent.norm_eps,
            1e-5f);
}

TEST(ParseJobSpecTest, SampleFields) {
  JobSpec minimal = MustParse("name: minimal\nmodel: {preset: gpt2-debug}\n");
  EXPECT_EQ(minimal.training.sample_every, 0);  // off unless asked for
  JobSpec text = MustParse(
      "name: s\nmodel: {preset: gpt2-debug}\ntraining:\n  sample_every: 20\n"
      "  sample_tokens: 40\n  sample_prompt: \"Once upon\"\n  sample_temperature: 0.8\n"
      "  sample_top_k: 40\n  sample_top_p: 0.95\n");
  EXPECT_EQ(text.training.sample_every, 20);
  EXPECT_EQ(text.training.sample_tokens, 40);
  EXPECT_EQ(text.training.sample_prompt, "Once upon");
  EXPECT_DOUBLE_EQ(text.training.sample_temperature, 0.8);
  EXPECT_EQ(text.training.sample_top_k, 40);
  EXPECT_DOUBLE_EQ(text.training.sample_top_p, 0.95);
  EXPECT_DOUBLE_EQ(minimal.training.sample_top_p, 1.0);
  JobSpec ids = MustParse(
      "name: s\nmodel: {preset: gpt2-debug}\ntraining:\n  sample_every: 5\n"
      "  sample_tokens: 8\n  sample_prompt_tokens: [10, 0, 255]\n  sample_temperature: 0\n");
  EXPECT_EQ(ids.training.sample_prompt_tokens, (std::vector<int32_t>{10, 0, 255}));
  EXPECT_DOUBLE_EQ(ids.training.sample_temperature, 0.0);
  // A text prompt for a wider vocabulary goes through the tokenizer; its length in tokens is
  // known once tokenized (worker/data/sample_text.h), not here.
  JobSpec tokenized = MustParse(
      "name: s\nmodel: {preset: gpt2-debug, vocab: 50257}\ntraining:\n  sample_every: 5\n"
      "  sample_prompt: \"Once upon a time\"\n  sample_tokenizer: gpt2/tokenizer.json\n");
  EXPECT_EQ(tokenized.training.sample_tokenizer, "gpt2/tokenizer.json");
  EXPECT_EQ(SamplePromptLength(tokenized.training), 0);
}

TEST(ParseJobSpecTest, PresetOverridesKeepGpt2Consistent) {
  JobSpec spec = MustParse(R"(name: wider
model:
  preset: gpt2-debug
  layers: 3
  width: 128
  heads: 8
  tied_embeddings: false
  recompute: true
)");
  EXPECT_EQ(spec.model.layers, 3);
  EXPECT_EQ(spec.model.width, 128);
  EXPECT_EQ(spec.model.heads, 8);
  EXPECT_EQ(spec.model.kv_heads, 8);      // GPT-2: follows heads
  EXPECT_EQ(spec.model.ffn_hidden, 512);  // GPT-2: 4 x width
  EXPECT_FALSE(spec.model.tied_embeddings);
  EXPECT_TRUE(spec.model.recompute);
  EXPECT_EQ(spec.model.vocab, 256);  // untouched preset field
}

TEST(ParseJobSpecTest, FullModelWithoutPreset) {
  JobSpec spec = MustParse(R"(name: custom
model:
  family: llama
  layers: 3
  width: 96
  heads: 6
  ffn_hidden: 256
  vocab: 512
  max_seq: 128
  rope_theta: 500000
  norm_eps: 1e-6
)");
  EXPECT_EQ(spec.model.family, ModelFamily::kLlama);
  EXPECT_EQ(spec.model.kv_heads, 6);
  EXPECT_FALSE(spec.model.tied_embeddings);
  EXPECT_FLOAT_EQ(spec.model.rope_theta, 500000.0f);
  EXPECT_FLOAT_EQ(spec.model.norm_eps, 1e-6f);
}

// Llama 3's RoPE scaling: transformers' defaults for the bands and the original context.
TEST(ParseJobSpecTest, RopeScaling) {
  const JobSpec plain = MustParse("name: plain\nmodel: {preset: llama-debug}\n");
  EXPECT_FALSE(plain.model.rope_scaling.enabled());
  const JobSpec scaled = MustParse(
      "name: scaled\nmodel:\n  preset: llama-debug\n  rope_scaling: {type: llama3, factor: 32}\n");
  EXPECT_EQ(scaled.model.rope_scaling, (config::RopeScaling{.factor = 32.0f,
                                                            .low_freq_factor = 1.0f,
                                                            .high_freq_factor = 4.0f,
                                                            .original_max_seq = 8192}));
  const JobSpec full = MustParse(
      "name: full\nmodel:\n  preset: llama-debug\n  rope_scaling: {type: llama3, factor: 8, "
      "low_freq_factor: 2, high_freq_factor: 8, original_max_seq: 4096}\n");
  EXPECT_EQ(full.model.rope_scaling, (config::RopeScaling{.factor = 8.0f,
                                                          .low_freq_factor = 2.0f,
                                                          .high_freq_factor = 8.0f,
                                                          .original_max_seq = 4096}));
  // Position interpolation: every pair factor times slower (Gemma 3's global blocks).
  const JobSpec linear = MustParse(
      "name: linear\nmodel:\n  preset: llama-debug\n  rope_scaling: {type: linear, factor: 8}\n");
  EXPECT_EQ(linear.model.rope_scaling, (config::RopeScaling{.linear = true, .factor = 8.0f}));
}

// YaRN: the factor and the original context required, the betas 32 and 1 and the blend's ends
// whole pairs unless given, the attention factor the paper's (0.1 · ln factor + 1) unless given.
TEST(ParseJobSpecTest, YarnRopeScaling) {
  const JobSpec plain = MustParse(
      "name: yarn\nmodel:\n  preset: llama-debug\n"
      "  rope_scaling: {type: yarn, factor: 4, original_max_seq: 32}\n");
  EXPECT_EQ(plain.model.rope_scaling,
            (config::RopeScaling{.factor = 4.0f,
                                 .original_max_seq = 32,
                                 .attention_factor = config::YarnAttentionFactor(4.0),
                                 .yarn = true}));
  const JobSpec given = MustParse(
      "name: yarn\nmodel:\n  preset: llama-debug\n"
      "  rope_scaling: {type: yarn, factor: 8, original_max_seq: 4096, beta_fast: 16,\n"
      "                 beta_slow: 0.5, truncate: false, attention_factor: 1.2}\n");
  EXPECT_EQ(given.model.rope_scaling, (config::RopeScaling{.factor = 8.0f,
                                                           .original_max_seq = 4096,
                                                           .attention_factor = 1.2f,
                                                           .yarn = true,
                                                           .beta_fast = 16.0f,
                                                           .beta_slow = 0.5f,
                                                           .truncate = false}));
}

// Phi-4 mini's RoPE: part of each head (rope_dim) turned with LongRoPE's per-pair factors; the
// attention factor is the paper's for max_seq over original_max_seq unless given.
TEST(ParseJobSpecTest, PartialRopeAndLongRope) {
  const JobSpec phi = MustParse(
      "name: phi\nmodel:\n  preset: llama-debug\n  max_seq: 128\n  rope_dim: 4\n"
      "  rope_scaling: {type: longrope, original_max_seq: 32, short_factor: [1, 1.5],\n"
      "                 long_factor: [2.5, 7]}\n");
  EXPECT_EQ(phi.model.rope_dim, 4);
  EXPECT_EQ(phi.model.rotary_dim(), 4);
  const config::RopeScaling& r = phi.model.rope_scaling;
  EXPECT_TRUE(r.enabled());
  EXPECT_TRUE(r.longrope);
  EXPECT_EQ(r.factor, 0.0f);
  EXPECT_EQ(r.original_max_seq, 32);
  EXPECT_EQ(r.short_factor, (std::vector<float>{1.0f, 1.5f}));
  EXPECT_EQ(r.long_factor, (std::vector<float>{2.5f, 7.0f}));
  // √(1 + ln 4 / ln 32) for a context 4 times the original.
  EXPECT_FLOAT_EQ(r.attention_factor, std::sqrt(1.0f + std::log(4.0f) / std::log(32.0f)));
  const JobSpec given = MustParse(
      "name: phi\nmodel:\n  preset: llama-debug\n  rope_scaling: {type: longrope, "
      "original_max_seq: 32,\n    short_factor: [1, 1, 1, 1, 1, 1, 1, 1], long_factor: [2, 2, 2, "
      "2, 2, 2, 2, 2], attention_factor: 1.5}\n");
  EXPECT_EQ(given.model.rope_dim, 0);
  EXPECT_EQ(given.model.rotary_dim(), 16);
  EXPECT_EQ(given.model.rope_scaling.attention_factor, 1.5f);
  // No longer context than the original: no magnitude.
  const JobSpec same = MustParse(
      "name: phi\nmodel:\n  preset: llama-debug\n  rope_dim: 2\n  rope_scaling: {type: longrope, "
      "original_max_seq: 64, short_factor: [1], long_factor: [3]}\n");
  EXPECT_EQ(same.model.rope_scaling.attention_factor, 1.0f);
}

// SmolLM3's NoPE blocks: listed blocks leave queries and keys unturned; none by default.
TEST(ParseJobSpecTest, NopeLayers) {
  const JobSpec plain = MustParse("name: s\nmodel: {preset: llama-debug}\n");
  EXPECT_TRUE(plain.model.nope_layers.empty());
  EXPECT_TRUE(plain.model.RotatesLayer(0) && plain.model.RotatesLayer(1));
  const JobSpec smol = MustParse("name: s\nmodel: {preset: llama-debug, nope_layers: [1]}\n");
  EXPECT_EQ(smol.model.nope_layers, (std::vector<int32_t>{1}));
  EXPECT_TRUE(smol.model.RotatesLayer(0));
  EXPECT_FALSE(smol.model.RotatesLayer(1));
  EXPECT_EQ(smol.model.ParameterCount(), plain.model.ParameterCount());
  EXPECT_FALSE(MustParse("name: s\nmodel: {preset: gpt2-debug}\n").model.RotatesLayer(0));
}

TEST(ParseJobSpecTest, GraniteMultipliers) {
  const ModelConfig plain = MustParse("name: s\nmodel: {preset: llama-debug}\n").model;
  EXPECT_FALSE(plain.HasGraniteMultipliers());
  EXPECT_EQ(plain.embedding_scale(), 1.0f);
  EXPECT_EQ(plain.attention_scale(), 0.25f);  // heads of 16
  const ModelConfig granite =
      MustParse(
          "name: s\nmodel: {preset: llama-debug, embedding_multiplier: 12, residual_multiplier: "
          "0.22, attention_multiplier: 0.0625, logits_scaling: 8}\n")
          .model;
  EXPECT_TRUE(granite.HasGraniteMultipliers());
  EXPECT_EQ(granite.embedding_scale(), 12.0f);
  EXPECT_EQ(granite.residual_multiplier, 0.22f);
  EXPECT_EQ(granite.attention_scale(), 0.0625f);
  EXPECT_EQ(granite.logits_scaling, 8.0f);
  EXPECT_EQ(granite.ParameterCount(), plain.ParameterCount());
  // One multiplier alone is Granite's too (and names itself in messages).
  const ModelConfig residual =
      MustParse("name: s\nmodel: {preset: llama-debug, residual_multiplier: 0.5}\n").model;
  EXPECT_STREQ(residual.GraniteField(), "residual_multiplier");
}

TEST(ParseJobSpecTest, MoeDefaults) {
  const MoeConfig dense = MustParse("name: dense\nmodel: {preset: gpt2-debug}\n").model.moe;
  EXPECT_EQ(dense.experts, 0);
  EXPECT_FALSE(dense.enabled());

  const MoeConfig moe =
      MustParse("name: moe\nmodel: {preset: gpt2-debug, moe: {experts: 4}}\n").model.moe;
  EXPECT_EQ(moe.experts, 4);
  EXPECT_EQ(moe.top_k, 1);
  EXPECT_EQ(moe.shared_experts, 0);
  EXPECT_EQ(moe.every, 1);
  EXPECT_EQ(moe.dense_first, 0);
  EXPECT_FLOAT_EQ(moe.routed_scale, 1.0f);
  EXPECT_EQ(moe.groups, 1);
  EXPECT_EQ(moe.z_loss_coeff, 0.0f);
  EXPECT_EQ(moe.group_top_k, 0);
  EXPECT_FALSE(moe.limits_groups());
  EXPECT_EQ(moe.ffn, 256);  // the preset's ffn_hidden
  EXPECT_EQ(moe.score, MoeScore::kSoftmax);
  EXPECT_FALSE(moe.normalize_top_k);
  EXPECT_EQ(moe.balance, MoeBalance::kAuxLoss);
  EXPECT_FLOAT_EQ(moe.aux_loss_coeff, 0.01f);
  EXPECT_FLOAT_EQ(moe.bias_update_rate, 0.001f);
  EXPECT_FLOAT_EQ(moe.capacity_factor, 0.0f);
  EXPECT_FALSE(moe.has_bias());
}

TEST(ParseJobSpecTest, MoeExpertFfnFollowsTheModelsOwn) {
  // A GPT-2 width override makes ffn_hidden 4 × width, and the experts' ffn follows it.
  EXPECT_EQ(MustParse("name: m\nmodel: {preset: gpt2-debug, width: 128, moe: {experts: 2}}\n")
                .model.moe.ffn,
            512);
  EXPECT_EQ(MustParse("name: m\nmodel: {preset: llama-debug, ffn_hidden: 96, moe: {experts: 2}}\n")
                .model.moe.ffn,
            96);
  EXPECT_EQ(MustParse("name: m\nmodel: {preset: llama-debug, moe: {experts: 2}}\n").model.moe.ffn,
            128);
  EXPECT_EQ(MustParse("name: m\nmodel: {preset: llama-debug, moe: {experts: 2, ffn: 32}}\n")
                .model.moe.ffn,
            32);
}

TEST(ParseJobSpecTest, MoeSigmoidScoresNormaliseTheirPicksByDefault) {
  const MoeConfig sigmoid =
      MustParse("name: m\nmodel: {preset: llama-debug, moe: {experts: 8, score: sigmoid}}\n")
          .model.moe;
  EXPECT_EQ(sigmoid.score, MoeScore::kSigmoid);
  EXPECT_TRUE(sigmoid.normalize_top_k);
  EXPECT_FALSE(MustParse("name: m\nmodel: {preset: llama-debug, moe: {experts: 8, score: sigmoid, "
                         "normalize_top_k: false}}\n")
                   .model.moe.normalize_top_k);
  EXPECT_TRUE(MustParse("name: m\nmodel: {preset: llama-debug, moe: {experts: 8, score: softmax, "
                        "normalize_top_k: true}}\n")
                  .model.moe.normalize_top_k);
}

TEST(ParseJobSpecTest, MoeEveryField) {
  JobSpec spec = MustParse(R"(name: moe
model:
  preset: llama-tiny
  moe:
    experts: 16
    top_k: 2
    shared_experts: 1
    shared_gate: true
    every: 2
    ffn: 88
    score: sigmoid
    normalize_top_k: false
    balance: bias
    bias_update_rate: 0.002
    capacity_factor: 1.25
resources: {devices_per_node: 2}
parallelism: {dp: 1, tp: 2}
)");
  const MoeConfig& moe = spec.model.moe;
  EXPECT_EQ(moe.experts, 16);
  EXPECT_EQ(moe.top_k, 2);
  EXPECT_EQ(moe.shared_experts, 1);
  EXPECT_TRUE(moe.shared_gate);
  EXPECT_EQ(moe.every, 2);
  EXPECT_EQ(moe.ffn, 88);
  EXPECT_EQ(moe.score, MoeScore::kSigmoid);
  EXPECT_FALSE(moe.normalize_top_k);
  EXPECT_EQ(moe.balance, MoeBalance::kBias);
  EXPECT_TRUE(moe.has_bias());
  EXPECT_FLOAT_EQ(moe.bias_update_rate, 0.002f);
  EXPECT_FLOAT_EQ(moe.aux_loss_coeff, 0.01f);  // unused under bias, left at its default
  EXPECT_FLOAT_EQ(moe.capacity_factor, 1.25f);
  // Blocks 1 and 3 of the 4 are MoE blocks.
  EXPECT_FALSE(moe.IsMoeLayer(0));
  EXPECT_TRUE(moe.IsMoeLayer(1));
  EXPECT_FALSE(moe.IsMoeLayer(2));
  EXPECT_TRUE(moe.IsMoeLayer(3));

  // DeepSeek-V3's and GLM-4.5's shape: the first blocks dense, the others MoE blocks whose
  // routed experts' weights are scaled.
  const MoeConfig deep = MustParse(
                             "name: m\nmodel: {preset: llama-tiny, moe: {experts: 4, "
                             "dense_first: 1, routed_scale: 2.5}}\n")
                             .model.moe;
  EXPECT_EQ(deep.dense_first, 1);
  EXPECT_FLOAT_EQ(deep.routed_scale, 2.5f);
  EXPECT_FALSE(deep.IsMoeLayer(0));
  EXPECT_TRUE(deep.IsMoeLayer(1));
  EXPECT_TRUE(deep.IsMoeLayer(3));
  EXPECT_EQ(deep.MoeLayers(4), 3);
  // With every: 2, the blocks every says that come past the dense ones.
  const MoeConfig both = MustParse(
                             "name: m\nmodel: {preset: llama-tiny, moe: {experts: 4, every: 2, "
                             "dense_first: 2}}\n")
                             .model.moe;
  EXPECT_FALSE(both.IsMoeLayer(1));
  EXPECT_TRUE(both.IsMoeLayer(3));
  EXPECT_EQ(both.MoeLayers(4), 1);
  // DeepSeek-V3's group-limited routing; group_top_k left out keeps every group.
  const MoeConfig grouped = MustParse(
                                "name: m\nmodel: {preset: llama-tiny, moe: {experts: 8, top_k: 2, "
                                "groups: 4, group_top_k: 2}}\n")
                                .model.moe;
  EXPECT_EQ(grouped.groups, 4);
  EXPECT_FLOAT_EQ(MustParse("name: m\nmodel: {preset: llama-tiny, moe: {experts: 8, balance: bias, "
                            "z_loss_coeff: 0.001}}\n")
                      .model.moe.z_loss_coeff,
                  0.001f);
  EXPECT_EQ(grouped.kept_groups(), 2);
  EXPECT_TRUE(grouped.limits_groups());
  EXPECT_EQ(grouped.group_score, config::GroupScore::kTopTwoSum);
  // DeepSeek-V2's: a group scored by its best value.
  EXPECT_EQ(MustParse("name: m\nmodel: {preset: llama-tiny, moe: {experts: 8, top_k: 2, "
                      "groups: 4, group_top_k: 2, group_score: max}}\n")
                .model.moe.group_score,
            config::GroupScore::kMax);
  const MoeConfig all_groups = MustParse(
                                   "name: m\nmodel: {preset: llama-tiny, moe: {experts: 8, "
                                   "groups: 4}}\n")
                                   .model.moe;
  EXPECT_EQ(all_groups.kept_groups(), 4);
  EXPECT_FALSE(all_groups.limits_groups());

  const MoeConfig aux = MustParse(
                            "name: m\nmodel: {preset: gpt2-debug, moe: {experts: 4, "
                            "balance: aux_loss, aux_loss_coeff: 0}}\n")
                            .model.moe;
  EXPECT_EQ(aux.balance, MoeBalance::kAuxLoss);
  EXPECT_FLOAT_EQ(aux.aux_loss_coeff, 0.0f);
}

TEST(ParseJobSpecTest, NumbersStringsAndBooleans) {
  JobSpec spec = MustParse(R"(name: "quoted-name"
model: {preset: llama-debug, tied_embeddings: True}
data:
  source: text
  path: "corpus.txt"
  val_fraction: .1
training:
  steps: +500
  lr: 1
  seed: 18446744073709551615
  schedule: 'constant'
  grad_clip: 0
  eval_every: 0
)");
  EXPECT_EQ(spec.name, "quoted-name");
  EXPECT_TRUE(spec.model.tied_embeddings);
  EXPECT_EQ(spec.data.path, "corpus.txt");
  EXPECT_DOUBLE_EQ(spec.data.val_fraction, 0.1);
  EXPECT_EQ(spec.training.steps, 500);
  EXPECT_DOUBLE_EQ(spec.training.lr, 1.0);
  EXPECT_EQ(spec.training.seed, 18446744073709551615u);
  EXPECT_EQ(spec.training.schedule, "constant");
  EXPECT_EQ(spec.training.grad_clip, 0.0);
}

// Warmup-stable-decay: the decay's length and shape; the shape defaults to linear.
TEST(ParseJobSpecTest, WarmupStableDecay) {
  JobSpec spec = MustParse(R"(name: wsd
model: {preset: llama-debug}
training: {steps: 100, warmup_steps: 5, schedule: wsd, decay_steps: 20, decay_shape: 1-sqrt,
           min_lr_ratio: 0}
)");
  EXPECT_EQ(spec.training.schedule, "wsd");
  EXPECT_EQ(spec.training.decay_steps, 20);
  EXPECT_EQ(spec.training.decay_shape, "1-sqrt");
  EXPECT_EQ(spec.training.min_lr_ratio, 0.0);
  spec = MustParse(
      "name: wsd\nmodel: {preset: llama-debug}\n"
      "training: {steps: 10, schedule: wsd, decay_steps: 10, warmup_steps: 0}\n");
  EXPECT_EQ(spec.training.decay_shape, "linear");
}

TEST(ParseJobSpecTest, BinWithValidationFraction) {
  JobSpec spec = MustParse(R"(name: shards
model: {preset: gpt2-124m}
data: {source: bin, path: "shards/train_*.bin", val_fraction: 0.01}
training: {seq_len: 1024, batch: 4}
)");
  EXPECT_EQ(spec.data.path, "shards/train_*.bin");
  EXPECT_TRUE(spec.data.val_path.empty());
  EXPECT_DOUBLE_EQ(spec.data.val_fraction, 0.01);
}

TEST(LoadJobSpecTest, ReadsThroughTheFileSystemSeam) {
  FakeFileSystem fs;
  ASSERT_TRUE(fs.CreateDirs("/jobs").ok());
  ASSERT_TRUE(fs.WriteFileAtomic("/jobs/a.yaml", "name: a\nmodel: {preset: gpt2-debug}\n").ok());
  absl::StatusOr<JobSpec> spec = LoadJobSpec(fs, "/jobs/a.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->name, "a");

  ASSERT_TRUE(fs.WriteFileAtomic("/jobs/bad.yaml", "name: a\nmodel: {preset: nope}\n").ok());
  absl::Status bad = LoadJobSpec(fs, "/jobs/bad.yaml").status();
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StartsWith(bad.message(), "/jobs/bad.yaml:2:17: model.preset: ")) << bad;
}

TEST(LoadJobSpecTest, MissingFileIsNotFound) {
  FakeFileSystem fs;
  absl::Status status = LoadJobSpec(fs, "/jobs/missing.yaml").status();
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), "/jobs/missing.yaml")) << status;
}

TEST(LoadJobSpecTest, OversizedFileIsRefused) {
  FakeFileSystem fs;
  ASSERT_TRUE(fs.WriteFileAtomic("big.yaml", std::string(kMaxSpecBytes + 1, '#')).ok());
  absl::Status status = LoadJobSpec(fs, "big.yaml").status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StartsWith(status.message(), "big.yaml:1:1: spec: the spec is 1048577 bytes"))
      << status;
}

TEST(ValidateJobSpecTest, ChecksStructsBuiltInCode) {
  JobSpec spec;
  spec.name = "built";
  EXPECT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec);

  spec.training.batch = 12;
  spec.training.micro_batch = 5;
  absl::Status status = ValidateJobSpec(spec);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "training.micro_batch: batch 12 is not divisible by micro_batch 5");

  spec.training.micro_batch = 4;
  spec.model.heads = 3;
  status = ValidateJobSpec(spec);
  EXPECT_TRUE(absl::StartsWith(status.message(), "model.heads: ")) << status;

  spec.model.heads = 4;
  spec.model.kv_heads = 4;
  spec.training.lr = std::nan("");
  EXPECT_TRUE(absl::StartsWith(ValidateJobSpec(spec).message(), "training.lr: ")) << status;

  spec.training.lr = 1e-3;
  spec.data.source = "bin";
  EXPECT_EQ(ValidateJobSpec(spec).message(), "data.path: required when source is bin");
}

TEST(ValidateJobSpecTest, ChecksMoeBuiltInCode) {
  JobSpec spec;
  spec.name = "built";
  // experts 0 is a dense model: its other moe fields are not looked at.
  spec.model.moe.top_k = 99;
  spec.model.moe.ffn = -1;
  EXPECT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec);

  spec.model.moe = MoeConfig{.experts = 4, .ffn = 64};
  EXPECT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec);
  auto message = [&](auto change) {
    JobSpec changed = spec;
    change(changed.model.moe);
    return std::string(ValidateJobSpec(changed).message());
  };
  EXPECT_EQ(message([](MoeConfig& m) { m.experts = -1; }),
            "model.moe.experts: must be between 1 and 65536, got -1");
  EXPECT_EQ(message([](MoeConfig& m) { m.top_k = 5; }),
            "model.moe.top_k: must be between 1 and experts 4, got 5");
  EXPECT_EQ(message([](MoeConfig& m) { m.shared_experts = -2; }),
            "model.moe.shared_experts: must be at least 0, got -2");
  EXPECT_EQ(message([](MoeConfig& m) { m.every = 3; }),
            "model.moe.every: must be between 1 and layers 2, got 3");
  EXPECT_EQ(message([](MoeConfig& m) { m.ffn = 0; }), "model.moe.ffn: must be at least 1, got 0");
  EXPECT_EQ(message([](MoeConfig& m) { m.aux_loss_coeff = std::nanf(""); }),
            "model.moe.aux_loss_coeff: must be zero or positive, got nan");
  EXPECT_EQ(message([](MoeConfig& m) { m.bias_update_rate = 0; }),
            "model.moe.bias_update_rate: must be positive, got 0");
  EXPECT_EQ(message([](MoeConfig& m) { m.bias_update_rate = INFINITY; }),
            "model.moe.bias_update_rate: must be positive, got inf");
  EXPECT_EQ(message([](MoeConfig& m) { m.capacity_factor = -0.5f; }),
            "model.moe.capacity_factor: must be 0 (dropless) or positive, got -0.5");
  EXPECT_EQ(message([](MoeConfig& m) { m.capacity_factor = INFINITY; }),
            "model.moe.capacity_factor: must be 0 (dropless) or positive, got inf");
  EXPECT_TRUE(message([](MoeConfig& m) { m.capacity_factor = 2; }).empty());
  // ValidateModelConfig names the field under its caller's prefix.
  ModelConfig model = spec.model;
  model.moe.top_k = 0;
  EXPECT_EQ(ValidateModelConfig(model, "m").message(),
            "m.moe.top_k: must be between 1 and experts 4, got 0");
}

TEST(ValidateJobSpecTest, ChecksRunSectionsBuiltInCode) {
  JobSpec spec;
  spec.name = "built";
  spec.resources.devices_per_node = 2;
  EXPECT_EQ(ValidateJobSpec(spec).message(),
            "parallelism.dp: dp 1 × tp 1 × pp 1 = 1 ranks, but resources provide 2 (nodes 1 × "
            "devices_per_node 2); dp 2 would fit");
  spec.parallelism.dp = 2;
  EXPECT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec);
  // min_nodes/max_nodes of 0 stand for resources.nodes.
  EXPECT_EQ(spec.min_nodes(), 1);
  EXPECT_EQ(spec.max_nodes(), 1);

  spec.parallelism.automatic = true;  // dp/tp/pp are the planner's choice; a fitting mesh exists
  spec.parallelism.dp = 1;
  EXPECT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec);

  spec.checkpoint.dir = "/ckpt";
  spec.checkpoint.every_steps = 0;
  EXPECT_EQ(ValidateJobSpec(spec).message(),
            "checkpoint.every_steps: must be at least 1 or auto, got 0");
  spec.checkpoint.every_steps.reset();
  SpecLimits limits;
  limits.allowed_checkpoint_roots = {"/ckpt"};
  EXPECT_TRUE(ValidateJobSpec(spec, limits).ok());
  limits.allowed_checkpoint_roots = {"/other"};
  EXPECT_TRUE(absl::StartsWith(ValidateJobSpec(spec, limits).message(), "checkpoint.dir: "));

  spec.labels["bad key"] = "x";
  EXPECT_TRUE(absl::StartsWith(ValidateJobSpec(spec).message(), "labels.'bad key': "));
}

TEST(ResizedSpecTest, FewerNodesKeepTheGlobalBatchByAccumulating) {
  const JobSpec spec = MustParse(R"(name: elastic
model: {preset: gpt2-debug}
training: {batch: 16}
parallelism: {dp: 4}
resources: {nodes: 4}
fault_tolerance: {min_nodes: 1}
)");
  const std::optional<JobSpec> same = ResizedSpec(spec, 4);
  ASSERT_TRUE(same.has_value());
  EXPECT_EQ(same->parallelism.dp, 4);
  EXPECT_EQ(same->training.micro_batch, 0);  // untouched
  const std::optional<JobSpec> half = ResizedSpec(spec, 2);
  ASSERT_TRUE(half.has_value());
  EXPECT_EQ(half->resources.nodes, 2);
  EXPECT_EQ(half->parallelism.dp, 2);
  EXPECT_EQ(half->training.batch, 16);       // the global batch is kept
  EXPECT_EQ(half->training.micro_batch, 4);  // the full-size micro-batch: 2 micro-batches a step
  const std::optional<JobSpec> one = ResizedSpec(spec, 1);
  ASSERT_TRUE(one.has_value());
  EXPECT_EQ(one->parallelism.dp, 1);
  EXPECT_EQ(one->training.micro_batch, 4);
  // 16 sequences do not split over 3 replicas, and gpt2-debug has too few layers for pp 3.
  EXPECT_FALSE(ResizedSpec(spec, 3).has_value());
  EXPECT_FALSE(ResizedSpec(spec, 0).has_value());
}

// Expert parallelism shrinks with the data-parallel ranks it is drawn from: ep 4 over dp 4
// becomes ep 2 over dp 2 and ep 1 on one node (the checkpoint reshards across ep), and comes back
// with the nodes.
TEST(ResizedSpecTest, ExpertParallelismShrinksWithTheDataParallelRanks) {
  const JobSpec spec = MustParse(R"(name: experts
model: {preset: gpt2-debug, moe: {experts: 4, top_k: 2}}
training: {batch: 16}
parallelism: {dp: 4, ep: 4}
resources: {nodes: 4}
fault_tolerance: {min_nodes: 1}
)");
  const std::optional<JobSpec> half = ResizedSpec(spec, 2);
  ASSERT_TRUE(half.has_value());
  EXPECT_EQ(half->parallelism.dp, 2);
  EXPECT_EQ(half->parallelism.ep, 2);
  const std::optional<JobSpec> one = ResizedSpec(spec, 1);
  ASSERT_TRUE(one.has_value());
  EXPECT_EQ(one->parallelism.dp, 1);
  EXPECT_EQ(one->parallelism.ep, 1);
  const std::optional<JobSpec> back = ResizedSpec(*one, 4);
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->parallelism.ep, 1);  // from the shrunk spec; the original keeps its own
  EXPECT_EQ(ResizedSpec(spec, 4)->parallelism.ep, 4);
}

// A schedule that needs several micro-batches per step keeps its mesh on fewer nodes: the mesh is
// checked with the micro-batch the resized job runs, not one micro-batch per step.
TEST(ResizedSpecTest, PipelineSchedulesKeepTheirMesh) {
  for (const char* schedule : {"{dp: 2, pp: 2, schedule: interleaved, virtual_stages: 2}",
                               "{dp: 2, pp: 2, schedule: zero-bubble}"}) {
    const JobSpec spec = MustParse(absl::StrCat(R"(name: pipelined
model: {preset: gpt2-debug, layers: 4}
training: {batch: 8, micro_batch: 2}
parallelism: )",
                                                schedule, R"(
resources: {nodes: 2, devices_per_node: 2}
)"));
    const std::optional<JobSpec> one = ResizedSpec(spec, 1);
    ASSERT_TRUE(one.has_value()) << schedule;
    EXPECT_EQ(one->parallelism.pp, 2) << schedule;
    EXPECT_EQ(one->parallelism.dp, 1) << schedule;
    EXPECT_EQ(one->parallelism.schedule, spec.parallelism.schedule) << schedule;
    EXPECT_EQ(one->parallelism.virtual_stages, spec.parallelism.virtual_stages) << schedule;
    EXPECT_EQ(one->training.micro_batch, 2) << schedule;  // 4 micro-batches per step
  }
}

TEST(ResizedSpecTest, TensorParallelGroupsStayWholeInsideANode) {
  const JobSpec spec = MustParse(R"(name: tp
model: {preset: gpt2-debug}
training: {batch: 8, micro_batch: 2}
parallelism: {dp: 2, tp: 2}
resources: {nodes: 2, devices_per_node: 2}
)");
  const std::optional<JobSpec> one = ResizedSpec(spec, 1);
  ASSERT_TRUE(one.has_value());
  EXPECT_EQ(one->parallelism.tp, 2);
  EXPECT_EQ(one->parallelism.dp, 1);
  EXPECT_EQ(one->training.micro_batch, 2);  // 8 sequences in 4 micro-batches
}

TEST(ResizedSpecTest, MicroBatchShrinksWhenItNoLongerDividesTheShare) {
  const JobSpec spec = MustParse(R"(name: odd
model: {preset: gpt2-debug}
training: {batch: 12}
parallelism: {dp: 4}
resources: {nodes: 4}
)");
  // Full size: 3 sequences per rank. On 2 nodes each rank takes 6: micro-batches of 3.
  const std::optional<JobSpec> two = ResizedSpec(spec, 2);
  ASSERT_TRUE(two.has_value());
  EXPECT_EQ(two->training.micro_batch, 3);
  const JobSpec six = MustParse(R"(name: six
model: {preset: gpt2-debug}
training: {batch: 24, micro_batch: 4}
parallelism: {dp: 3}
resources: {nodes: 3}
)");
  // 24 over 2 replicas is 12 a rank: micro-batches of 4 still divide it.
  ASSERT_TRUE(ResizedSpec(six, 2).has_value());
  EXPECT_EQ(ResizedSpec(six, 2)->training.micro_batch, 4);
}

TEST(ResizedSpecTest, AGivenMeshIsRunWithTheMicroBatchFittedToIt) {
  const JobSpec spec = MustParse(R"(name: given
model: {preset: gpt2-debug}
training: {batch: 12}
parallelism: {dp: 2, tp: 2}
resources: {nodes: 2, devices_per_node: 2}
)");
  // Full size: 6 sequences a rank. On one node the rule keeps tp 2 (dp 1, micro-batches of 6);
  // given dp 2 instead, each rank takes 6 again in one micro-batch.
  ParallelismSpec given = spec.parallelism;
  given.dp = 2;
  given.tp = 1;
  const std::optional<JobSpec> one = ResizedSpec(spec, 1, &given);
  ASSERT_TRUE(one.has_value());
  EXPECT_EQ(one->parallelism.dp, 2);
  EXPECT_EQ(one->parallelism.tp, 1);
  EXPECT_EQ(one->training.micro_batch, 6);
  // Given dp 4 on one node of 2 devices: no such mesh there.
  given.dp = 4;
  EXPECT_FALSE(ResizedSpec(spec, 1, &given).has_value());
}

TEST(ParseJobSpecTest, DefaultWarmupFitsAShortRun) {
  const JobSpec short_run =
      MustParse("name: short\nmodel: {preset: gpt2-debug}\ntraining: {steps: 4}\n");
  EXPECT_EQ(short_run.training.warmup_steps, 4);
  const JobSpec long_run =
      MustParse("name: long\nmodel: {preset: gpt2-debug}\ntraining: {steps: 400}\n");
  EXPECT_EQ(long_run.training.warmup_steps, 10);
}

}  // namespace
}  // namespace trainyard::config
