// The engine against an independent PyTorch implementation (tests/oracle/run_oracle.py, built
// from torch modules and autograd, run in float64) on the same weights and tokens.
//
// Error measure: for a tensor a (ours, fp32) against the reference b (float64), we report
// max_i |a_i − b_i| / max_i |b_i| — the worst element error relative to the tensor's scale.
// An element-wise ratio is meaningless for entries that are zero up to rounding (e.g. gradients
// of embedding rows of tokens that never occur). Bound: 1e-4 for logits, loss and every
// parameter gradient; 1e-5 relative for the losses of five AdamW steps. fp32 rounding over a
// width-64 model stays near 1e-6, so these bounds catch any real formula error (a wrong scale,
// a missing term, a misplaced head) by orders of magnitude.
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "tests/integration/test_env.h"
#include "worker/backend.h"
#include "worker/local_model.h"
#include "worker/moe_routing.h"
#include "worker/optimizer.h"

namespace trainyard::worker {
namespace {

namespace fs = std::filesystem;
using config::ModelConfig;

constexpr int kBatch = 4, kMicro = 2, kSeq = 32, kSteps = 5;

OptimizerConfig TestOptimizer() {
  OptimizerConfig o;
  o.lr = 1e-2;
  o.min_lr_ratio = 0.1;
  o.warmup_steps = 2;
  o.total_steps = kSteps;
  o.schedule = LrSchedule::kCosine;
  o.weight_decay = 0.1;
  o.beta1 = 0.9;
  o.beta2 = 0.95;
  o.eps = 1e-8;
  o.grad_clip = 0.5;
  return o;
}

template <typename T>
void WriteRaw(const fs::path& path, const T* data, size_t count) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(data), count * sizeof(T));
  ASSERT_TRUE(out.good()) << path;
}

std::vector<double> ReadF64(const fs::path& path, size_t expected) {
  std::ifstream in(path, std::ios::binary);
  std::vector<double> v(expected);
  in.read(reinterpret_cast<char*>(v.data()), expected * sizeof(double));
  EXPECT_TRUE(in.good()) << "cannot read " << expected << " doubles from " << path;
  return v;
}

std::vector<double> ReadLines(const fs::path& path) {
  std::ifstream in(path);
  std::vector<double> v;
  for (double x; in >> x;) v.push_back(x);
  return v;
}

double ScaledMaxError(const float* a, const std::vector<double>& b) {
  double err = 0, scale = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    err = std::max(err, std::abs(a[i] - b[i]));
    scale = std::max(scale, std::abs(b[i]));
  }
  return scale == 0 ? err : err / scale;
}

void WriteOracleInput(const fs::path& dir, const ModelConfig& c, const LocalModel& model,
                      const std::vector<int32_t>& inputs, const std::vector<int32_t>& targets) {
  fs::create_directories(dir / "params");
  const OptimizerConfig o = TestOptimizer();
  std::ofstream cfg(dir / "config.json");
  cfg.precision(17);
  cfg << "{\"family\": \"" << config::FamilyName(c.family) << "\", \"layers\": " << c.layers
      << ", \"width\": " << c.width << ", \"heads\": " << c.heads
      << ", \"kv_heads\": " << c.kv_heads << ", \"ffn_hidden\": " << c.ffn_hidden
      << ", \"vocab\": " << c.vocab << ", \"max_seq\": " << c.max_seq
      << ", \"tied_embeddings\": " << (c.tied_embeddings ? "true" : "false")
      << ", \"qkv_bias\": " << (c.qkv_bias ? "true" : "false")
      << ", \"head_dim\": " << c.explicit_head_dim
      << ", \"qk_norm\": " << (c.qk_norm ? "true" : "false") << ", \"qk_norm_span\": \""
      << (c.NormsWholeProjection() ? "projection" : "head") << "\""
      << ", \"sliding_window\": " << c.sliding_window << ", \"full_attention_layers\": ["
      << absl::StrJoin(c.full_attention_layers, ", ") << "]"
      << ", \"scale_embeddings\": " << (c.scale_embeddings ? "true" : "false")
      << ", \"rope_local_theta\": " << c.rope_local_theta
      << ", \"post_norms\": " << (c.post_norms ? "true" : "false")
      << ", \"pre_norms\": " << (c.pre_norms ? "true" : "false")
      << ", \"attention_scale_dim\": " << c.attention_scale_dim
      << ", \"attention_softcap\": " << c.attention_softcap
      << ", \"logit_softcap\": " << c.logit_softcap << ", \"z_loss_coeff\": " << c.z_loss_coeff
      << (c.geglu ? ", \"activation\": \"geglu\"" : "") << ", \"norm_eps\": " << c.norm_eps
      << ", \"rope_theta\": " << c.rope_theta << ", \"rope_dim\": " << c.rope_dim
      << ", \"nope_layers\": [" << absl::StrJoin(c.nope_layers, ", ") << "]"
      << ", \"embedding_multiplier\": " << c.embedding_multiplier
      << ", \"residual_multiplier\": " << c.residual_multiplier
      << ", \"attention_multiplier\": " << c.attention_multiplier
      << ", \"logits_scaling\": " << c.logits_scaling
      << ", \"document_token\": " << c.document_token << ", \"batch\": " << kBatch
      << ", \"seq_len\": " << kSeq << ", \"steps\": " << kSteps << ", \"lr\": " << o.lr
      << ", \"min_lr_ratio\": " << o.min_lr_ratio << ", \"warmup_steps\": " << o.warmup_steps
      << ", \"schedule\": \"cosine\""
      << ", \"weight_decay\": " << o.weight_decay << ", \"beta1\": " << o.beta1
      << ", \"beta2\": " << o.beta2 << ", \"eps\": " << o.eps << ", \"grad_clip\": " << o.grad_clip;
  if (const config::RopeScaling& r = c.rope_scaling; r.longrope) {
    cfg << ", \"rope_scaling\": {\"type\": \"longrope\", \"short_factor\": ["
        << absl::StrJoin(r.short_factor, ", ") << "], \"long_factor\": ["
        << absl::StrJoin(r.long_factor, ", ") << "], \"original_max_seq\": " << r.original_max_seq
        << ", \"attention_factor\": " << r.attention_factor << "}";
  }
  if (const config::RopeScaling& r = c.rope_scaling; r.yarn) {
    cfg << ", \"rope_scaling\": {\"type\": \"yarn\", \"factor\": " << r.factor
        << ", \"original_max_seq\": " << r.original_max_seq << ", \"beta_fast\": " << r.beta_fast
        << ", \"beta_slow\": " << r.beta_slow
        << ", \"truncate\": " << (r.truncate ? "true" : "false")
        << ", \"attention_factor\": " << r.attention_factor << "}";
  }
  if (c.moe.enabled()) {
    const config::MoeConfig& m = c.moe;
    cfg << ", \"moe\": {\"experts\": " << m.experts << ", \"top_k\": " << m.top_k
        << ", \"shared_experts\": " << m.shared_experts
        << ", \"shared_gate\": " << (m.shared_gate ? "true" : "false") << ", \"every\": " << m.every
        << ", \"dense_first\": " << m.dense_first << ", \"routed_scale\": " << m.routed_scale
        << ", \"groups\": " << m.groups << ", \"group_top_k\": " << m.group_top_k
        << ", \"group_score\": \""
        << (m.group_score == config::GroupScore::kMax ? "max" : "top2_sum") << "\""
        << ", \"ffn\": " << m.ffn << ", \"score\": \""
        << (m.score == config::MoeScore::kSigmoid ? "sigmoid" : "softmax")
        << "\", \"normalize_top_k\": " << (m.normalize_top_k ? "true" : "false")
        << ", \"balance\": \"" << (m.balance == config::MoeBalance::kBias ? "bias" : "aux_loss")
        << "\", \"aux_loss_coeff\": " << m.aux_loss_coeff
        << ", \"bias_update_rate\": " << m.bias_update_rate
        << ", \"z_loss_coeff\": " << m.z_loss_coeff
        << ", \"capacity_factor\": " << m.capacity_factor << "}";
  }
  if (const config::LatentAttention& l = c.latent; l.enabled()) {
    cfg << ", \"latent_attention\": {\"q_rank\": " << l.q_rank << ", \"kv_rank\": " << l.kv_rank
        << ", \"value_dim\": " << l.value_dim << ", \"norm_eps\": " << l.norm_eps << "}";
  }
  cfg << "}\n";
  cfg.close();
  std::vector<float> params(model.num_params());
  model.ReadParameters(params.data());
  std::ofstream index(dir / "params.txt");
  for (const ParamTensor& t : model.layout().tensors()) {
    index << t.name;
    for (int64_t d : t.shape) index << " " << d;
    index << "\n";
    WriteRaw(dir / "params" / (t.name + ".f32"), params.data() + t.offset, t.numel);
  }
  WriteRaw(dir / "inputs.i32", inputs.data(), inputs.size());
  WriteRaw(dir / "targets.i32", targets.data(), targets.size());
}

// The routing of the first batch: expert_counts.txt holds, per MoE layer, "layer count_0 …
// count_{E−1} dropped".
void ExpectSameRouting(const std::vector<Model::MoeLayerStats>& stats, const fs::path& out) {
  std::ifstream in(out / "expert_counts.txt");
  std::vector<std::vector<int64_t>> want;
  for (std::string line; std::getline(in, line);) {
    std::istringstream fields(line);
    want.emplace_back();
    for (int64_t v; fields >> v;) want.back().push_back(v);
  }
  ASSERT_EQ(want.size(), stats.size());
  for (size_t i = 0; i < stats.size(); ++i) {
    std::vector<int64_t> got = {stats[i].layer};
    got.insert(got.end(), stats[i].picks.begin(), stats[i].picks.end());
    got.push_back(stats[i].dropped);
    EXPECT_EQ(got, want[i]) << "routing of layer " << stats[i].layer;
  }
}

// After an optimizer step: the bias rule on each MoE layer's selection bias from the step's
// loads (as the trainer does over its data-parallel group); returns the step's Σ aux losses and
// router z-losses (token-weighted means over micro-batches).
double MoeStep(LocalModel& model, Backend& backend) {
  const config::MoeConfig& moe = model.config().moe;
  double aux = 0;
  for (const Model::MoeLayerStats& s : model.model().TakeMoeStats()) {
    aux += (s.aux_loss + s.z_loss) / static_cast<double>(s.tokens);
    const int64_t offset = model.layout().block(s.layer).router_bias;
    if (offset < 0) continue;
    const std::vector<double> load(s.picks.begin(), s.picks.end());
    const std::vector<float> delta = BiasUpdate(moe, load);
    std::vector<float> bias(moe.experts);
    backend.CopyToHost(bias.data(), model.params() + offset, moe.experts);
    for (int e = 0; e < moe.experts; ++e) bias[e] += delta[e];
    backend.CopyFromHost(model.params() + offset, bias.data(), moe.experts);
  }
  return aux;
}

void CompareWithOracle(ModelConfig c) {
  const fs::path dir = testenv::MakeScratchDir("oracle");
  auto backend = MakeCpuBackend(2);
  auto model_or = LocalModel::Create(c, backend.get());
  ASSERT_TRUE(model_or.ok()) << model_or.status();
  LocalModel& model = **model_or;
  model.InitParameters(2024);

  const int64_t per_step = int64_t{kBatch} * kSeq;
  std::vector<int32_t> inputs(kSteps * per_step), targets(kSteps * per_step);
  std::mt19937 rng(99);
  for (auto* v : {&inputs, &targets}) {
    for (int32_t& x : *v) x = static_cast<int32_t>(rng() % c.vocab);
  }
  if (c.document_token >= 0) {  // documents of about six tokens
    for (int32_t& x : inputs) {
      if (rng() % 6 == 0) x = c.document_token;
    }
  }
  WriteOracleInput(dir / "in", c, model, inputs, targets);

  const std::string cmd = absl::StrCat(testenv::PythonInterpreter(), " ", testenv::SourceDir(),
                                       "/tests/oracle/run_oracle.py ", (dir / "in").string(), " ",
                                       (dir / "out").string());
  const int rc = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(rc) && WEXITSTATUS(rc) == 0) << "oracle failed: " << cmd;
  const fs::path out = dir / "out";

  // Logits of the first batch.
  std::vector<float> logits(per_step * c.vocab);
  ASSERT_TRUE(model.Logits(inputs.data(), kBatch, kSeq, logits.data()).ok());
  const double logit_err =
      ScaledMaxError(logits.data(), ReadF64(out / "logits.f64", logits.size()));
  EXPECT_LE(logit_err, 1e-4) << "logits";

  // Loss and every parameter gradient of the first batch, in one micro-batch.
  model.ZeroGradients();
  auto loss_sum =
      model.ForwardBackward(inputs.data(), targets.data(), kBatch, kSeq, 1.0f / per_step);
  ASSERT_TRUE(loss_sum.ok()) << loss_sum.status();
  const double loss = *loss_sum / per_step;
  const double ref_loss = ReadLines(out / "loss.txt").at(0);
  ASSERT_TRUE(model.model().TakeLogitSquares().ok());  // the step-0 pass's, compared below
  EXPECT_LE(std::abs(loss - ref_loss) / ref_loss, 1e-5) << loss << " vs " << ref_loss;
  std::vector<float> grads(model.num_params());
  model.ReadGradients(grads.data());
  ExpectSameRouting(model.model().TakeMoeStats(), out);
  double worst = 0;
  for (const ParamTensor& t : model.layout().tensors()) {
    if (!t.trainable) continue;  // an MoE selection bias: no gradient
    const double err = ScaledMaxError(grads.data() + t.offset,
                                      ReadF64(out / "grads" / (t.name + ".f64"), t.numel));
    EXPECT_LE(err, 1e-4) << "gradient of " << t.name;
    worst = std::max(worst, err);
  }

  // Five AdamW steps with two micro-batches each (gradient accumulation; one with MoE layers,
  // whose aux loss and capacity are per micro-batch where the oracle's are per batch), clipping
  // and the warmup + cosine schedule; then the bias rule.
  AdamW opt(TestOptimizer(), model.layout(), backend.get());
  const std::vector<double> ref_losses = ReadLines(out / "losses.txt");
  const std::vector<double> ref_aux = ReadLines(out / "aux_losses.txt");
  const std::vector<double> ref_z = ReadLines(out / "z_losses.txt");
  ASSERT_EQ(ref_losses.size(), static_cast<size_t>(kSteps));
  const int micro = c.moe.enabled() ? kBatch : kMicro;
  for (int step = 0; step < kSteps; ++step) {
    model.ZeroGradients();
    double sum = 0;
    for (int first = 0; first < kBatch; first += micro) {
      const int64_t off = step * per_step + int64_t{first} * kSeq;
      auto l = model.ForwardBackward(inputs.data() + off, targets.data() + off, micro, kSeq,
                                     1.0f / per_step);
      ASSERT_TRUE(l.ok()) << l.status();
      sum += *l;
    }
    auto lse_squares = model.model().TakeLogitSquares();
    ASSERT_TRUE(lse_squares.ok()) << lse_squares.status();
    const double z_loss = c.z_loss_coeff * *lse_squares / per_step;
    EXPECT_NEAR(z_loss, ref_z.at(step), 1e-5 * std::max(1e-3, ref_z.at(step))) << step;
    opt.ClipGradients(model.grads());
    opt.Step(model.params(), model.grads(), step);
    if (c.moe.enabled()) {
      const double aux = MoeStep(model, *backend);
      EXPECT_NEAR(aux, ref_aux.at(step), 1e-5 * std::max(1e-3, ref_aux.at(step))) << step;
    }
    const double step_loss = sum / per_step;
    EXPECT_LE(std::abs(step_loss - ref_losses[step]) / ref_losses[step], 1e-5)
        << "step " << step << ": " << step_loss << " vs " << ref_losses[step];
    std::printf("%s step %d loss %.8f oracle %.8f\n", config::FamilyName(c.family).c_str(), step,
                step_loss, ref_losses[step]);
  }
  std::printf("%s: logits error %.2e, loss %.8f vs %.8f, worst gradient error %.2e\n",
              config::FamilyName(c.family).c_str(), logit_err, loss, ref_loss, worst);
  std::error_code ec;
  fs::remove_all(dir, ec);
}

ModelConfig Small(config::ModelFamily family) {
  ModelConfig c =
      *config::Preset(family == config::ModelFamily::kGpt2 ? "gpt2-debug" : "llama-debug");
  c.layers = 2;
  c.width = 64;
  c.heads = 4;
  c.kv_heads = family == config::ModelFamily::kGpt2 ? 4 : 2;
  c.vocab = 256;
  c.max_seq = kSeq;
  return c;
}

TEST(TorchOracle, Gpt2) { CompareWithOracle(Small(config::ModelFamily::kGpt2)); }

TEST(TorchOracle, Llama) { CompareWithOracle(Small(config::ModelFamily::kLlama)); }

// PaLM's z-loss on the logits (0.05: strong enough to move every gradient), alone and through
// Gemma 2's final soft cap (the log-sum-exp the capped logits'): the gradients of the objective,
// the z-loss of every step and the cross-entropy after the updates.
TEST(TorchOracle, ZLossOnTheLogits) {
  ModelConfig gpt2 = Small(config::ModelFamily::kGpt2);
  gpt2.z_loss_coeff = 0.05f;
  CompareWithOracle(gpt2);
  ModelConfig llama = Small(config::ModelFamily::kLlama);
  llama.z_loss_coeff = 0.05f;
  llama.logit_softcap = 0.75f;
  CompareWithOracle(llama);
}

config::MoeConfig OracleMoe() {
  config::MoeConfig moe;
  moe.experts = 4;
  moe.top_k = 2;
  moe.shared_experts = 1;
  moe.ffn = 48;
  moe.aux_loss_coeff = 0.05f;
  return moe;
}

// Mixture of experts on every block: softmax top-2 with an aux loss and a capacity that drops
// picks (GPT-2), normalised sigmoid scores under the bias rule on the second block only (Llama).
TEST(TorchOracle, Gpt2MixtureOfExperts) {
  ModelConfig c = Small(config::ModelFamily::kGpt2);
  c.moe = OracleMoe();
  c.moe.capacity_factor = 1.0f;
  CompareWithOracle(c);
}

TEST(TorchOracle, LlamaMixtureOfExpertsWithTheBiasRule) {
  ModelConfig c = Small(config::ModelFamily::kLlama);
  c.moe = OracleMoe();
  c.moe.every = 2;
  c.moe.score = config::MoeScore::kSigmoid;
  c.moe.normalize_top_k = true;
  c.moe.balance = config::MoeBalance::kBias;
  c.moe.bias_update_rate = 0.01f;
  CompareWithOracle(c);
}

// DeepSeek-V3's and GLM-4.5's routing: the first block dense, normalised sigmoid scores under the
// bias rule, the routed experts' weights scaled by 2.5 (the scale reaches the router's gradient),
// a shared expert beside them.
TEST(TorchOracle, LlamaMixtureOfExpertsPastADenseBlockWithScaledWeights) {
  ModelConfig c = Small(config::ModelFamily::kLlama);
  c.qkv_bias = true;
  c.moe = OracleMoe();
  c.moe.dense_first = 1;
  c.moe.score = config::MoeScore::kSigmoid;
  c.moe.normalize_top_k = true;
  c.moe.routed_scale = 2.5f;
  c.moe.balance = config::MoeBalance::kBias;
  c.moe.bias_update_rate = 0.01f;
  ASSERT_FALSE(c.moe.IsMoeLayer(0));
  ASSERT_TRUE(c.moe.IsMoeLayer(1));
  CompareWithOracle(c);
}

// DeepSeek-V3's group-limited routing: six experts in three groups of two, each token's two picks
// from the two groups whose best two biased sigmoid scores sum highest (the oracle ranks the
// groups its own way), under the bias rule so the groups' scores move between steps.
TEST(TorchOracle, LlamaMixtureOfExpertsWithGroupLimitedRouting) {
  ModelConfig c = Small(config::ModelFamily::kLlama);
  c.moe = OracleMoe();
  c.moe.experts = 6;
  c.moe.groups = 3;
  c.moe.group_top_k = 2;
  c.moe.score = config::MoeScore::kSigmoid;
  c.moe.normalize_top_k = true;
  c.moe.routed_scale = 2.5f;
  c.moe.balance = config::MoeBalance::kBias;
  c.moe.bias_update_rate = 0.01f;
  CompareWithOracle(c);
}

// DeepSeek-V2's group-limited routing: softmax probabilities, each token's two picks from the
// group of three whose best probability is highest, weighed unnormalised times 16 (V2 236B's).
TEST(TorchOracle, LlamaMixtureOfExpertsWithGroupsScoredByTheirBest) {
  ModelConfig c = Small(config::ModelFamily::kLlama);
  c.moe = OracleMoe();
  c.moe.experts = 6;
  c.moe.groups = 2;
  c.moe.group_top_k = 1;
  c.moe.group_score = config::GroupScore::kMax;
  c.moe.routed_scale = 16.0f;
  CompareWithOracle(c);
}

// ST-MoE's router z-loss beside each balance rule: its gradient reaches the router's logits
// straight, not through the scores (the oracle differentiates logsumexp(logits)² itself).
TEST(TorchOracle, MixtureOfExpertsWithTheRouterZLoss) {
  for (const config::ModelFamily family :
       {config::ModelFamily::kGpt2, config::ModelFamily::kLlama}) {
    ModelConfig c = Small(family);
    c.moe = OracleMoe();
    c.moe.z_loss_coeff = 0.05f;
    if (family == config::ModelFamily::kLlama) {
      c.moe.score = config::MoeScore::kSigmoid;
      c.moe.normalize_top_k = true;
      c.moe.balance = config::MoeBalance::kBias;
      c.moe.bias_update_rate = 0.01f;
    }
    CompareWithOracle(c);
  }
}

// Qwen2-MoE's shape: biases on q, k and v, softmax top-2 weights left unnormalised, and two
// shared experts whose output each token gates by sigmoid(x · g); the gate's gradient reaches g
// and the block's input.
TEST(TorchOracle, LlamaMixtureOfExpertsWithASharedGate) {
  ModelConfig c = Small(config::ModelFamily::kLlama);
  c.qkv_bias = true;
  c.moe = OracleMoe();
  c.moe.shared_experts = 2;
  c.moe.shared_gate = true;
  CompareWithOracle(c);
}

// Qwen2's layout: biases on q, k and v (trained from zero, so the oracle sees them move).
TEST(TorchOracle, LlamaWithQkvBiases) {
  ModelConfig c = Small(config::ModelFamily::kLlama);
  c.qkv_bias = true;
  CompareWithOracle(c);
}

// Heads wider than width / heads (Mistral Nemo's and Qwen3's shape): the attention's width
// (heads · head_dim) exceeds the model's, so q, k, v and the output projection are not square.
TEST(TorchOracle, LlamaWithHeadsWiderThanTheWidthSplits) {
  ModelConfig c = Small(config::ModelFamily::kLlama);
  c.explicit_head_dim = 3 * c.width / c.heads / 2;
  ASSERT_GT(c.heads * c.head_dim(), c.width);
  CompareWithOracle(c);
}

// Qwen3's attention: heads wider than width / heads, each query and key head normed before RoPE.
// The norms' weights start at one; with a learning rate of this size they move in five steps.
TEST(TorchOracle, LlamaWithQueryAndKeyNorms) {
  ModelConfig c = Small(config::ModelFamily::kLlama);
  c.explicit_head_dim = 24;
  c.qk_norm = true;
  CompareWithOracle(c);
}

TEST(TorchOracle, LlamaWithQueryAndKeyNormsRecomputed) {
  ModelConfig c = Small(config::ModelFamily::kLlama);
  c.explicit_head_dim = 24;
  c.qk_norm = true;
  c.recompute = true;
  CompareWithOracle(c);
}

// OLMoE's attention and experts: one RMSNorm over each token's whole q (weight heads·head_dim) and
// one over its whole k (kv_heads·head_dim), before RoPE, and every block's MLP eight experts of
// which each token takes two, unnormalised; recomputed.
TEST(TorchOracle, LlamaMixtureOfExpertsWithNormsOverTheWholeProjection) {
  ModelConfig c = Small(config::ModelFamily::kLlama);
  c.qk_norm = true;
  c.qk_norm_span = config::QkNormSpan::kProjection;
  c.moe = OracleMoe();
  c.moe.experts = 8;
  c.moe.shared_experts = 0;
  c.recompute = true;
  CompareWithOracle(c);
}

// OLMo 2's block: no norms before the attention and the MLP, each branch's output normed before
// it joins the residual stream, and OLMoE's norms over the whole q and k.
TEST(TorchOracle, LlamaWithNormsAfterEachBranchOnly) {
  ModelConfig c = Small(config::ModelFamily::kLlama);
  c.pre_norms = false;
  c.post_norms = true;
  c.qk_norm = true;
  c.qk_norm_span = config::QkNormSpan::kProjection;
  CompareWithOracle(c);
}

// The same recomputed, and without the query and key norms.
TEST(TorchOracle, LlamaWithNormsAfterEachBranchOnlyRecomputed) {
  ModelConfig c = Small(config::ModelFamily::kLlama);
  c.pre_norms = false;
  c.post_norms = true;
  c.recompute = true;
  CompareWithOracle(c);
}

// Mistral's sliding window, seven positions of the 32: the first rows see every earlier key, the
// rest only their window.
TEST(TorchOracle, LlamaWithASlidingWindow) {
  ModelConfig c = Small(config::ModelFamily::kLlama);
  c.sliding_window = 7;
  ASSERT_LT(c.sliding_window, kSeq);
  CompareWithOracle(c);
}

// Gemma's model: GeGLU, the token embeddings times √width on the way in and unscaled in the tied
// head, heads wider than width / heads and one key/value head (Gemma 2B's shape, small).
TEST(TorchOracle, LlamaWithGegluAndScaledEmbeddings) {
  ModelConfig c = Small(config::ModelFamily::kLlama);
  c.geglu = true;
  c.scale_embeddings = true;
  c.tied_embeddings = true;
  c.kv_heads = 1;
  c.explicit_head_dim = 24;
  CompareWithOracle(c);
}

TEST(TorchOracle, LlamaWithGegluRecomputed) {
  ModelConfig c = Small(config::ModelFamily::kLlama);
  c.geglu = true;
  c.scale_embeddings = true;
  c.recompute = true;
  CompareWithOracle(c);
}

// Documents packed into each sequence (model.document_token, about six tokens each): a query
// sees only its own document's keys; with a sliding window narrower than some documents too.
TEST(TorchOracle, LlamaWithDocumentMask) {
  ModelConfig c = Small(config::ModelFamily::kLlama);
  c.document_token = 3;
  CompareWithOracle(c);
  c.sliding_window = 4;
  CompareWithOracle(c);
}

// Multi-head latent attention (DeepSeek-V3's block in miniature): heads of 24 whose first 8
// dimensions turn, value heads of 16, a query latent of 32 and a key/value latent of 20; without
// the query latent and with documents; and recomputed, with value heads wider than the rest and
// the latents normed with an epsilon of their own.
TEST(TorchOracle, LlamaWithLatentAttention) {
  ModelConfig c = Small(config::ModelFamily::kLlama);
  c.kv_heads = c.heads;
  c.explicit_head_dim = 24;
  c.rope_dim = 8;
  c.latent = {.q_rank = 32, .kv_rank = 20, .value_dim = 16};
  CompareWithOracle(c);
  c.latent.q_rank = 0;
  c.document_token = 3;
  CompareWithOracle(c);
  c.document_token = -1;
  c.latent = {.q_rank = 12, .kv_rank = 20, .value_dim = 30, .norm_eps = 0.25f};
  c.recompute = true;
  CompareWithOracle(c);
}

// GPT-2's learned positions count from the sequence's start in every document.
TEST(TorchOracle, Gpt2WithDocumentMask) {
  ModelConfig c = Small(config::ModelFamily::kGpt2);
  c.document_token = 0;
  CompareWithOracle(c);
}

// Local and global blocks (Gemma's and Qwen2's pattern): the window in the first block only.
TEST(TorchOracle, LlamaWithTheWindowInSomeBlocks) {
  ModelConfig c = Small(config::ModelFamily::kLlama);
  c.sliding_window = 5;
  c.full_attention_layers = {1};
  CompareWithOracle(c);
}

// Gemma 3's block: norms of the attention's and the MLP's outputs, query and key norms, GeGLU,
// scaled embeddings, and local blocks with a window and their own RoPE base.
TEST(TorchOracle, LlamaWithPostNormsAndLocalRope) {
  ModelConfig c = Small(config::ModelFamily::kLlama);
  c.post_norms = true;
  c.qk_norm = true;
  c.geglu = true;
  c.scale_embeddings = true;
  c.tied_embeddings = true;
  c.sliding_window = 5;
  c.full_attention_layers = {1};
  c.rope_local_theta = 500.0f;
  CompareWithOracle(c);
}

// Gemma 2's model: Gemma's with norms of the branches' outputs, every other block windowed, the
// scores scaled by 24^-1/2 (not head_dim 16's) and capped at 0.05, the logits capped at 0.75
// (caps small enough that a tiny model's scores and logits bend under them).
TEST(TorchOracle, LlamaWithSoftCapsAndScoreScale) {
  ModelConfig c = Small(config::ModelFamily::kLlama);
  c.post_norms = true;
  c.geglu = true;
  c.scale_embeddings = true;
  c.tied_embeddings = true;
  c.sliding_window = 5;
  c.full_attention_layers = {1};
  c.attention_scale_dim = 24;
  c.attention_softcap = 0.05f;
  c.logit_softcap = 0.75f;
  CompareWithOracle(c);
}

// Phi-4 mini's RoPE: the first 10 of each head's 16 dimensions turn, with LongRoPE's factors —
// the long ones, since the 32 positions exceed original_max_seq 24 — and its attention factor.
TEST(TorchOracle, LlamaWithPartialRopeAndLongRope) {
  ModelConfig c = Small(config::ModelFamily::kLlama);
  ASSERT_EQ(c.head_dim(), 16);
  c.rope_dim = 10;
  c.rope_scaling = {.original_max_seq = 24,
                    .longrope = true,
                    .short_factor = {1.0f, 1.25f, 1.5f, 2.0f, 3.0f},
                    .long_factor = {1.5f, 2.0f, 4.0f, 9.0f, 20.0f},
                    .attention_factor = 1.25f};
  ASSERT_GT(kSeq, c.rope_scaling.original_max_seq);
  CompareWithOracle(c);
}

// YaRN over an original context of 16 extended 2.5 times: with beta_fast 8 and beta_slow 0.25
// (at base 10000 the pairs of indices −0.99 and 2.02 of the eight) the first pair keeps its rate,
// those from the fourth on turn 2.5 times slower, and the second and third blend, a third and two
// thirds of the way when the ends are whole pairs (0 and 3), 0.49 and 0.98 of it when they are
// not; both tables grow by the attention factor.
TEST(TorchOracle, LlamaWithYarn) {
  for (const bool truncate : {true, false}) {
    SCOPED_TRACE(truncate ? "truncated" : "untruncated");
    ModelConfig c = Small(config::ModelFamily::kLlama);
    ASSERT_EQ(c.head_dim(), 16);
    c.rope_scaling = {.factor = 2.5f,
                      .original_max_seq = 16,
                      .attention_factor = config::YarnAttentionFactor(2.5),
                      .yarn = true,
                      .beta_fast = 8.0f,
                      .beta_slow = 0.25f,
                      .truncate = truncate};
    CompareWithOracle(c);
  }
}

// SmolLM3's model: tied embeddings, and a NoPE block (the second) whose queries and keys RoPE
// leaves unturned; recomputed, so that the backward's second forward skips it too.
TEST(TorchOracle, LlamaWithNopeLayers) {
  ModelConfig c = Small(config::ModelFamily::kLlama);
  c.tied_embeddings = true;
  c.nope_layers = {1};
  c.recompute = true;
  CompareWithOracle(c);
}

// Granite's four multipliers (values of Granite 3's size, scaled to this width), tied embeddings
// as Granite 3 has them, once recomputed.
TEST(TorchOracle, LlamaWithGraniteMultipliers) {
  ModelConfig c = Small(config::ModelFamily::kLlama);
  c.tied_embeddings = true;
  c.embedding_multiplier = 12.0f;
  c.residual_multiplier = 0.22f;
  c.attention_multiplier = 0.0625f;
  c.logits_scaling = 2.5f;
  CompareWithOracle(c);
  c.recompute = true;
  CompareWithOracle(c);
}

TEST(TorchOracle, LlamaWithPartialRopeRecomputed) {
  ModelConfig c = Small(config::ModelFamily::kLlama);
  c.rope_dim = 6;
  c.recompute = true;
  CompareWithOracle(c);
}

// GPT-2's family takes the same scores (the attention and the loss are shared), recomputed.
TEST(TorchOracle, Gpt2WithSoftCapsRecomputed) {
  ModelConfig c = Small(config::ModelFamily::kGpt2);
  c.attention_softcap = 0.05f;
  c.logit_softcap = 0.75f;
  c.recompute = true;
  CompareWithOracle(c);
}

TEST(TorchOracle, LlamaWithPostNormsRecomputed) {
  ModelConfig c = Small(config::ModelFamily::kLlama);
  c.post_norms = true;
  c.recompute = true;
  CompareWithOracle(c);
}

TEST(TorchOracle, LlamaTiedWithRecomputation) {
  ModelConfig c = Small(config::ModelFamily::kLlama);
  c.tied_embeddings = true;
  c.recompute = true;
  CompareWithOracle(c);
}

}  // namespace
}  // namespace trainyard::worker
