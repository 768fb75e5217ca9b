// The calibration's text forms (planner/calibration.h): the JSON `trainyard-worker calibrate`
// prints reads back as exactly what was measured, field by field, and the reference spec the CLI
// hands it gives back the reference.
#include "planner/calibration.h"

#include <cmath>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_replace.h"
#include "config/spec.h"
#include "gtest/gtest.h"

namespace trainyard::planner {
namespace {

// A figure no short decimal form holds: only the exact text reads back as it.
double Awkward(double base, int i) { return std::nextafter(base / 3 * (i + 1), 1e300); }

// A calibration as worker::CalibrateCpu makes one, every figure distinct and awkward.
Calibration AwkwardCalibration() {
  Calibration c;
  int i = 0;
  c.large_gemm_flops = Awkward(3e10, i++);
  c.gemm_flops = Awkward(2e10, i++);
  c.add_bytes_per_second = Awkward(7e9, i++);
  c.alpha_seconds = Awkward(4e-5, i++);
  c.bytes_per_second = Awkward(2e9, i++);
  c.reference_name = "gpt2, 4 layers, width 128, 4 × 64 tokens \"quoted\"";
  for (int ranks : {1, 2, 4}) {
    SharedRanksCalibration& s = c.shared.emplace_back();
    s.entry.ranks = ranks;
    s.entry.matmul_flops = Awkward(1e10, i++);
    s.entry.link = Link{.alpha_seconds = Awkward(1e-4, i++), .bytes_per_second = Awkward(2e9, i++)};
    s.entry.lockstep_alpha_seconds = Awkward(2e-4, i++);
    s.entry.background_alpha_seconds = Awkward(3e-4, i++);
    s.entry.optimizer_elements_per_second = Awkward(5e8, i++);
    s.entry.lockstep_matmul_flops = ranks == 1 ? 0 : Awkward(9e9, i++);
    s.pass_seconds = Awkward(0.01, i++);
    s.optimizer_step_seconds = Awkward(0.002, i++);
    s.collective_seconds = ranks == 1 ? 0 : Awkward(0.003, i++);
    s.lockstep_collective_seconds = ranks == 1 ? 0 : Awkward(0.004, i++);
    s.lockstep_compute_seconds = ranks == 1 ? 0 : Awkward(0.005, i++);
    s.background_seconds = ranks == 1 ? 0 : Awkward(0.006, i++);
    c.profile.shared.push_back(s.entry);
  }
  DeviceProfile& p = c.profile;
  p.name = "cpu";
  p.description = "CPU ranks (calibrated on this machine)";
  p.memory_bytes = (int64_t{1} << 34) + 12345;
  p.shared_node = true;
  p.peak_flops = Awkward(4e10, i++);
  p.matmul_flops = c.gemm_flops;
  p.memory_bytes_per_second = c.add_bytes_per_second;
  p.intra_node = Link{.alpha_seconds = c.alpha_seconds, .bytes_per_second = c.bytes_per_second};
  p.inter_node = p.intra_node;
  p.act_bytes = 4;
  p.max_logits_chunk = int64_t{1} << 20;
  p.calibrated = true;
  p.reference = c.reference_name;
  p.cores = 2;
  return c;
}

void ExpectSameEntry(const SharedRanks& a, const SharedRanks& b) {
  EXPECT_EQ(a.ranks, b.ranks);
  EXPECT_EQ(a.matmul_flops, b.matmul_flops) << a.ranks;
  EXPECT_EQ(a.link.alpha_seconds, b.link.alpha_seconds) << a.ranks;
  EXPECT_EQ(a.link.bytes_per_second, b.link.bytes_per_second) << a.ranks;
  EXPECT_EQ(a.lockstep_alpha_seconds, b.lockstep_alpha_seconds) << a.ranks;
  EXPECT_EQ(a.background_alpha_seconds, b.background_alpha_seconds) << a.ranks;
  EXPECT_EQ(a.optimizer_elements_per_second, b.optimizer_elements_per_second) << a.ranks;
  EXPECT_EQ(a.lockstep_matmul_flops, b.lockstep_matmul_flops) << a.ranks;
}

void ExpectSameProfile(const DeviceProfile& a, const DeviceProfile& b) {
  EXPECT_EQ(a.name, b.name);
  EXPECT_EQ(a.description, b.description);
  EXPECT_EQ(a.memory_bytes, b.memory_bytes);
  EXPECT_EQ(a.shared_node, b.shared_node);
  EXPECT_EQ(a.peak_flops, b.peak_flops);
  EXPECT_EQ(a.matmul_flops, b.matmul_flops);
  EXPECT_EQ(a.memory_bytes_per_second, b.memory_bytes_per_second);
  EXPECT_EQ(a.intra_node.alpha_seconds, b.intra_node.alpha_seconds);
  EXPECT_EQ(a.intra_node.bytes_per_second, b.intra_node.bytes_per_second);
  EXPECT_EQ(a.inter_node.alpha_seconds, b.inter_node.alpha_seconds);
  EXPECT_EQ(a.inter_node.bytes_per_second, b.inter_node.bytes_per_second);
  EXPECT_EQ(a.act_bytes, b.act_bytes);
  EXPECT_EQ(a.max_logits_chunk, b.max_logits_chunk);
  EXPECT_EQ(a.calibrated, b.calibrated);
  EXPECT_EQ(a.reference, b.reference);
  ASSERT_EQ(a.shared.size(), b.shared.size());
  for (size_t i = 0; i < a.shared.size(); ++i) ExpectSameEntry(a.shared[i], b.shared[i]);
  EXPECT_EQ(a.cores, b.cores);
  EXPECT_EQ(a.sync_skew_seconds, b.sync_skew_seconds);
  EXPECT_EQ(a.background_alpha_seconds, b.background_alpha_seconds);
  EXPECT_EQ(a.optimizer_elements_per_second, b.optimizer_elements_per_second);
  EXPECT_EQ(a.tensor_parallel_matmul_flops, b.tensor_parallel_matmul_flops);
  EXPECT_EQ(a.idle_alpha_seconds, b.idle_alpha_seconds);
  EXPECT_EQ(a.overlap, b.overlap);
}

TEST(CalibrationJson, EveryFieldReadsBackExactly) {
  const Calibration c = AwkwardCalibration();
  const std::string json = CalibrationToJson(c);
  absl::StatusOr<Calibration> back = CalibrationFromJson(json);
  ASSERT_TRUE(back.ok()) << back.status() << "\n" << json;
  EXPECT_EQ(back->large_gemm_flops, c.large_gemm_flops);
  EXPECT_EQ(back->gemm_flops, c.gemm_flops);
  EXPECT_EQ(back->add_bytes_per_second, c.add_bytes_per_second);
  EXPECT_EQ(back->alpha_seconds, c.alpha_seconds);
  EXPECT_EQ(back->bytes_per_second, c.bytes_per_second);
  EXPECT_EQ(back->reference_name, c.reference_name);
  ASSERT_EQ(back->shared.size(), c.shared.size());
  for (size_t i = 0; i < c.shared.size(); ++i) {
    const SharedRanksCalibration &got = back->shared[i], &want = c.shared[i];
    ExpectSameEntry(got.entry, want.entry);
    EXPECT_EQ(got.pass_seconds, want.pass_seconds) << i;
    EXPECT_EQ(got.optimizer_step_seconds, want.optimizer_step_seconds) << i;
    EXPECT_EQ(got.collective_seconds, want.collective_seconds) << i;
    EXPECT_EQ(got.lockstep_collective_seconds, want.lockstep_collective_seconds) << i;
    EXPECT_EQ(got.lockstep_compute_seconds, want.lockstep_compute_seconds) << i;
    EXPECT_EQ(got.background_seconds, want.background_seconds) << i;
  }
  ExpectSameProfile(back->profile, c.profile);
  EXPECT_EQ(CalibrationToJson(*back), json);
}

TEST(CalibrationJson, NoSharedEntriesAndAnEmptyReference) {
  Calibration c = AwkwardCalibration();
  c.shared.clear();
  c.profile.shared.clear();
  c.reference_name = c.profile.reference = "";
  absl::StatusOr<Calibration> back = CalibrationFromJson(CalibrationToJson(c));
  ASSERT_TRUE(back.ok()) << back.status() << "\n" << CalibrationToJson(c);
  EXPECT_TRUE(back->shared.empty());
  EXPECT_EQ(back->reference_name, "");
  ExpectSameProfile(back->profile, c.profile);
}

TEST(CalibrationJson, NamesTheFieldThatIsMissingOrMalformed) {
  const std::string json = CalibrationToJson(AwkwardCalibration());
  auto error_of = [](const std::string& text) {
    absl::StatusOr<Calibration> c = CalibrationFromJson(text);
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << text;
    return std::string(c.status().message());
  };
  EXPECT_TRUE(absl::StrContains(
      error_of(absl::StrReplaceAll(json, {{"\"gemm_flops\"", "\"gemm\""}})), "gemm_flops"));
  EXPECT_TRUE(
      absl::StrContains(error_of(absl::StrReplaceAll(json, {{"\"pass_seconds\"", "\"pass\""}})),
                        "shared[0].pass_seconds"));
  EXPECT_TRUE(absl::StrContains(
      error_of(absl::StrReplaceAll(json, {{"\"ranks\": 2,", "\"ranks\": 2.5,"}})), "ranks"));
  EXPECT_TRUE(absl::StrContains(
      error_of(absl::StrReplaceAll(json, {{"\"peak_flops\"", "\"peak\""}})), "profile"));
  error_of("trainyard-worker: error: not json {");
  error_of("");
}

config::JobSpec SpecOf(const std::string& yaml) {
  absl::StatusOr<config::JobSpec> spec = config::ParseJobSpec(yaml, "reference.yaml");
  EXPECT_TRUE(spec.ok()) << spec.status() << "\n" << yaml;
  return spec.ok() ? *spec : config::JobSpec();
}

// CalibrationReference of the spec CalibrationReferenceYaml writes is the reference itself.
void ExpectCarried(const config::JobSpec& spec) {
  const config::JobSpec want = CalibrationReference(spec);
  const config::JobSpec got = CalibrationReference(SpecOf(CalibrationReferenceYaml(spec)));
  const config::ModelConfig &a = got.model, &b = want.model;
  EXPECT_EQ(a.family, b.family);
  EXPECT_EQ(a.layers, b.layers);
  EXPECT_EQ(a.width, b.width);
  EXPECT_EQ(a.heads, b.heads);
  EXPECT_EQ(a.kv_heads, b.kv_heads);
  EXPECT_EQ(a.ffn_hidden, b.ffn_hidden);
  EXPECT_EQ(a.vocab, b.vocab);
  EXPECT_EQ(a.max_seq, b.max_seq);
  EXPECT_EQ(a.tied_embeddings, b.tied_embeddings);
  EXPECT_EQ(a.norm_eps, b.norm_eps);
  EXPECT_EQ(a.rope_theta, b.rope_theta);
  EXPECT_EQ(a.rope_scaling, b.rope_scaling);
  EXPECT_EQ(a.recompute, b.recompute);
  EXPECT_EQ(a.moe.experts, b.moe.experts);
  EXPECT_EQ(a.moe.top_k, b.moe.top_k);
  EXPECT_EQ(a.moe.shared_experts, b.moe.shared_experts);
  EXPECT_EQ(a.moe.every, b.moe.every);
  EXPECT_EQ(a.moe.dense_first, b.moe.dense_first);
  EXPECT_EQ(a.moe.routed_scale, b.moe.routed_scale);
  EXPECT_EQ(a.moe.groups, b.moe.groups);
  EXPECT_EQ(a.moe.z_loss_coeff, b.moe.z_loss_coeff);
  EXPECT_EQ(a.moe.group_top_k, b.moe.group_top_k);
  EXPECT_EQ(a.moe.ffn, b.moe.ffn);
  EXPECT_EQ(a.moe.score, b.moe.score);
  EXPECT_EQ(a.moe.normalize_top_k, b.moe.normalize_top_k);
  EXPECT_EQ(a.moe.balance, b.moe.balance);
  EXPECT_EQ(a.moe.aux_loss_coeff, b.moe.aux_loss_coeff);
  EXPECT_EQ(a.moe.bias_update_rate, b.moe.bias_update_rate);
  EXPECT_EQ(a.moe.capacity_factor, b.moe.capacity_factor);
  EXPECT_EQ(got.training.batch, want.training.batch);
  EXPECT_EQ(got.training.micro_batch, want.training.micro_batch);
  EXPECT_EQ(got.training.seq_len, want.training.seq_len);
  EXPECT_EQ(got.parallelism.dp, 1);
  EXPECT_EQ(got.parallelism.tp, 1);
  EXPECT_EQ(got.parallelism.pp, 1);
}

TEST(CalibrationReference, TheSpecFileCarriesTheReference) {
  ExpectCarried(DefaultCalibrationReference());
  // A llama model with every field its own, and a micro-batch from the batch over dp.
  ExpectCarried(
      SpecOf("name: l\nmodel: {family: llama, layers: 3, width: 96, heads: 6, kv_heads: 2, "
             "ffn_hidden: 200, vocab: 300, max_seq: 128, tied_embeddings: true, norm_eps: 3.3e-6, "
             "rope_theta: 123456.7, recompute: true, rope_scaling: {type: llama3, factor: 32, "
             "low_freq_factor: 1.5, high_freq_factor: 6, original_max_seq: 4096}}\n"
             "training: {batch: 12, seq_len: 100}\nparallelism: {dp: 2, tp: 1, pp: 1}\n"
             "resources: {nodes: 1, devices_per_node: 2}\n"));
  // YaRN, every field its own.
  ExpectCarried(
      SpecOf("name: y\nmodel: {preset: llama-debug, rope_scaling: {type: yarn, factor: 4, "
             "original_max_seq: 64, beta_fast: 16, beta_slow: 0.5, truncate: false, "
             "attention_factor: 1.3}}\n"));
  // A vocabulary smaller than the default data's, untied GPT-2 embeddings.
  ExpectCarried(
      SpecOf("name: s\nmodel: {preset: gpt2-debug, vocab: 16, tied_embeddings: false}\n"
             "data: {source: markov, markov: {vocab: 8}}\ntraining: {batch: 4, micro_batch: 2, "
             "seq_len: 16}\n"));
  // MoE models, under each balance rule (each writes only its own coefficient), with values
  // that are not the defaults.
  ExpectCarried(
      SpecOf("name: m\nmodel: {preset: llama-debug, moe: {experts: 6, top_k: 2, shared_experts: 1, "
             "every: 2, dense_first: 1, ffn: 48, score: sigmoid, normalize_top_k: false, "
             "routed_scale: 2.5, groups: 3, group_top_k: 2, balance: bias, "
             "bias_update_rate: 0.0025, z_loss_coeff: 0.001, capacity_factor: 1.3}}\n"));
  ExpectCarried(
      SpecOf("name: m\nmodel: {preset: gpt2-debug, moe: {experts: 3, normalize_top_k: true, "
             "aux_loss_coeff: 0.037}}\n"));
}

}  // namespace
}  // namespace trainyard::planner
