// Mixture-of-experts layers (config::MoeConfig): the router's decisions and backward
// (worker/moe_routing.h) against values worked by hand and finite differences, a micro-batch
// routed in pieces against the whole, and whole MoE
// models on the CPU backend: one expert with top-1 is the dense model, the gradient of the
// training objective (cross-entropy plus the aux loss) matches finite differences, and generation
// with the key/value cache computes the training model's logits.
#include <algorithm>
#include <cmath>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "absl/strings/str_replace.h"
#include "config/model_config.h"
#include "gtest/gtest.h"
#include "tests/unit/worker/worker_test_util.h"
#include "worker/backend.h"
#include "worker/generate.h"
#include "worker/local_model.h"
#include "worker/moe_routing.h"

namespace trainyard::worker {
namespace {

using config::MoeBalance;
using config::MoeConfig;
using config::MoeScore;

MoeConfig Moe(int experts, int top_k) {
  MoeConfig moe;
  moe.experts = experts;
  moe.top_k = top_k;
  moe.ffn = 32;
  return moe;
}

TEST(MoeRouting, TopKPicksBestFirstAndTiesGoToTheLowerExpert) {
  MoeConfig moe = Moe(4, 2);
  // Token 0: experts 1 and 3 tie for best; token 1: all four tie.
  const std::vector<float> logits = {0.0f, 2.0f, 1.0f, 2.0f, 0.5f, 0.5f, 0.5f, 0.5f};
  const MoeRouting r = Route(moe, logits.data(), 2, {});
  EXPECT_EQ(r.expert, (std::vector<int32_t>{1, 3, 0, 1}));
  // Softmax weights are the picks' probabilities as they are.
  const double z = 2 * std::exp(2.0) + std::exp(1.0) + 1.0;
  EXPECT_NEAR(r.weight[0], std::exp(2.0) / z, 1e-6);
  EXPECT_NEAR(r.weight[2], 0.25, 1e-6);
  // Kept rows expert by expert, token order within one.
  EXPECT_EQ(r.offsets, (std::vector<int64_t>{0, 1, 3, 3, 4}));
  EXPECT_EQ(r.source, (std::vector<int32_t>{1, 0, 1, 0}));
  EXPECT_EQ(r.slot, (std::vector<int32_t>{1, 3, 0, 2}));
  EXPECT_EQ(r.picks, (std::vector<int64_t>{1, 2, 0, 1}));
}

TEST(MoeRouting, NormalisedSigmoidWeightsAndTheSelectionBias) {
  MoeConfig moe = Moe(3, 2);
  moe.score = MoeScore::kSigmoid;
  moe.normalize_top_k = true;
  const std::vector<float> logits = {1.0f, 0.0f, -1.0f};
  const std::vector<float> bias = {0.0f, 0.0f, 1.0f};  // moves expert 2 ahead of expert 1
  const MoeRouting r = Route(moe, logits.data(), 1, bias);
  EXPECT_EQ(r.expert, (std::vector<int32_t>{2, 0}));
  const double s0 = 1 / (1 + std::exp(-1.0)), s2 = 1 / (1 + std::exp(1.0));
  // The weights use the unbiased scores.
  EXPECT_NEAR(r.weight[0], s2 / (s0 + s2), 1e-6);
  EXPECT_NEAR(r.weight[1], s0 / (s0 + s2), 1e-6);
}

// routed_scale multiplies the combine weights and nothing else: the same picks, and weights that
// sum to the scale when normalised (DeepSeek-V3's routed_scaling_factor).
TEST(MoeRouting, TheRoutedScaleMultipliesTheWeights) {
  MoeConfig moe = Moe(3, 2);
  moe.score = MoeScore::kSigmoid;
  moe.normalize_top_k = true;
  const std::vector<float> logits = {1.0f, 0.0f, -1.0f};
  const MoeRouting plain = Route(moe, logits.data(), 1, {});
  moe.routed_scale = 2.5f;
  const MoeRouting scaled = Route(moe, logits.data(), 1, {});
  EXPECT_EQ(scaled.expert, plain.expert);
  EXPECT_EQ(scaled.scores, plain.scores);
  EXPECT_FLOAT_EQ(scaled.weight[0], 2.5f * plain.weight[0]);
  EXPECT_FLOAT_EQ(scaled.weight[1], 2.5f * plain.weight[1]);
  EXPECT_NEAR(scaled.weight[0] + scaled.weight[1], 2.5, 1e-6);
}

// DeepSeek-V3's group-limited routing, worked by hand: six experts in three groups of two, sigmoid
// scores. Token 0's groups score σ(3) + σ(−3) = 1, 2σ(1) ≈ 1.46 and σ(2) + σ(0) ≈ 1.38, so its
// best single expert (0) sits in the worst group; token 1's groups tie, and the lower one is kept.
TEST(MoeRouting, GroupLimitedRoutingPicksFromTheBestGroupsOnly) {
  MoeConfig moe = Moe(6, 2);
  moe.score = MoeScore::kSigmoid;
  moe.normalize_top_k = true;
  const std::vector<float> logits = {3.0f, -3.0f, 1.0f, 1.0f, 2.0f, 0.0f,  // token 0
                                     0.0f, 0.0f,  0.0f, 0.0f, 0.0f, 0.0f};
  auto picks = [&](int groups, int kept, std::span<const float> bias) {
    moe.groups = groups;
    moe.group_top_k = kept;
    return Route(moe, logits.data(), 2, bias).expert;
  };
  EXPECT_EQ(picks(1, 0, {}), (std::vector<int32_t>{0, 4, 0, 1}));
  EXPECT_EQ(picks(3, 0, {}), (std::vector<int32_t>{0, 4, 0, 1}));  // every group kept
  EXPECT_EQ(picks(3, 3, {}), (std::vector<int32_t>{0, 4, 0, 1}));
  EXPECT_EQ(picks(3, 1, {}), (std::vector<int32_t>{2, 3, 0, 1}));
  EXPECT_EQ(picks(3, 2, {}), (std::vector<int32_t>{4, 2, 0, 1}));
  // The selection bias counts in the groups' scores: +1 on expert 1 lifts group 0 to 2, and
  // token 1's expert 1 ahead of expert 0. The weights stay the unbiased scores, normalised.
  const std::vector<float> bias = {0.0f, 1.0f, 0.0f, 0.0f, 0.0f, 0.0f};
  EXPECT_EQ(picks(3, 1, bias), (std::vector<int32_t>{1, 0, 1, 0}));
  const MoeRouting r = Route(moe, logits.data(), 2, bias);
  const double s0 = 1 / (1 + std::exp(-3.0)), s1 = 1 / (1 + std::exp(3.0));
  EXPECT_NEAR(r.weight[0], s1 / (s0 + s1), 1e-6);
  EXPECT_NEAR(r.weight[1], s0 / (s0 + s1), 1e-6);
}

// DeepSeek-V2's groups, scored by their best value: token 0's score σ(3), σ(1) and σ(2), so one
// kept group is group 0 (its worst expert, 1, picked second over experts 4 and 2); two keep
// groups 0 and 2. Token 1's groups tie as before. Softmax scores the same way.
TEST(MoeRouting, GroupsScoredByTheirBestValue) {
  MoeConfig moe = Moe(6, 2);
  moe.score = MoeScore::kSigmoid;
  moe.group_score = config::GroupScore::kMax;
  moe.groups = 3;
  const std::vector<float> logits = {3.0f, -3.0f, 1.0f, 1.0f, 2.0f, 0.0f,  // token 0
                                     0.0f, 0.0f,  0.0f, 0.0f, 0.0f, 0.0f};
  moe.group_top_k = 1;
  EXPECT_EQ(Route(moe, logits.data(), 2, {}).expert, (std::vector<int32_t>{0, 1, 0, 1}));
  moe.group_top_k = 2;
  EXPECT_EQ(Route(moe, logits.data(), 2, {}).expert, (std::vector<int32_t>{0, 4, 0, 1}));
  moe.score = MoeScore::kSoftmax;
  moe.group_top_k = 1;
  EXPECT_EQ(Route(moe, logits.data(), 2, {}).expert, (std::vector<int32_t>{0, 1, 0, 1}));
}

TEST(MoeRouting, CapacityDropsThePicksPastAnExpertsRoomInTokenOrder) {
  MoeConfig moe = Moe(2, 1);
  moe.capacity_factor = 1.0f;  // ceil(1.0 · 5 · 1 / 2) = 3 rows per expert
  // Every token prefers expert 0.
  const std::vector<float> logits = {1, 0, 1, 0, 1, 0, 1, 0, 0, 1};
  const MoeRouting r = Route(moe, logits.data(), 5, {});
  EXPECT_EQ(r.picks, (std::vector<int64_t>{4, 1}));
  EXPECT_EQ(r.dropped, 1);
  EXPECT_EQ(r.slot, (std::vector<int32_t>{0, 1, 2, -1, 3}));
  EXPECT_EQ(r.offsets, (std::vector<int64_t>{0, 3, 4}));
}

TEST(MoeRouting, AuxLossByHand) {
  MoeConfig moe = Moe(2, 1);
  moe.aux_loss_coeff = 0.5f;
  const std::vector<float> logits = {std::log(3.0f), 0.0f, 0.0f, 0.0f};  // p = (.75,.25), (.5,.5)
  const MoeRouting r = Route(moe, logits.data(), 2, {});
  // f = (1, 0) (the tie goes to expert 0), P = (0.625, 0.375): 0.5 · 2 · (1 · 0.625).
  EXPECT_NEAR(r.aux_loss, 0.625, 1e-6);
}

// The router z-loss by hand: logits (ln 3, 0) have log-sum-exp ln 4, logits (0, 0) ln 2; with
// coefficient 0.1, 0.1 · ((ln 4)² + (ln 2)²) / 2, under either balance rule, and 0 without one.
TEST(MoeRouting, RouterZLossByHand) {
  MoeConfig moe = Moe(2, 1);
  const std::vector<float> logits = {std::log(3.0f), 0.0f, 0.0f, 0.0f};
  EXPECT_EQ(Route(moe, logits.data(), 2, {}).z_loss, 0.0);
  EXPECT_TRUE(Route(moe, logits.data(), 2, {}).z_grad.empty());
  moe.z_loss_coeff = 0.1f;
  const double want = 0.1 * (std::pow(std::log(4.0), 2) + std::pow(std::log(2.0), 2)) / 2;
  EXPECT_NEAR(Route(moe, logits.data(), 2, {}).z_loss, want, 1e-7);
  moe.balance = MoeBalance::kBias;
  moe.score = MoeScore::kSigmoid;
  const std::vector<float> bias = {0.0f, 0.0f};
  EXPECT_NEAR(Route(moe, logits.data(), 2, bias).z_loss, want, 1e-7);
}

TEST(MoeRouting, BiasRuleByHand) {
  MoeConfig moe = Moe(4, 1);
  moe.balance = MoeBalance::kBias;
  moe.bias_update_rate = 0.01f;
  const std::vector<double> load = {10, 2, 4, 4};  // mean 5
  EXPECT_EQ(BiasUpdate(moe, load), (std::vector<float>{-0.01f, 0.01f, 0.01f, 0.01f}));
  EXPECT_EQ(BiasUpdate(moe, std::vector<double>{3, 3, 3, 3}), (std::vector<float>(4, 0.0f)));
}

// The router's backward against central differences of weights·r + aux_grad · (aux loss + router
// z-loss), for every score and normalisation (the normalised weights scaled by 2.5), with a
// capacity drop; under the bias rule the z-loss's part alone.
TEST(MoeRouting, BackwardMatchesFiniteDifferences) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t tokens = 6;
  for (MoeScore score : {MoeScore::kSoftmax, MoeScore::kSigmoid}) {
    for (bool normalize : {false, true}) {
      MoeConfig moe = Moe(5, 2);
      moe.score = score;
      moe.normalize_top_k = normalize;
      moe.routed_scale = normalize ? 2.5f : 1.0f;
      moe.aux_loss_coeff = 0.3f;
      moe.z_loss_coeff = 0.2f;
      moe.capacity_factor = 1.0f;
      if (score == MoeScore::kSigmoid && !normalize) moe.balance = MoeBalance::kBias;
      std::vector<float> logits(tokens * moe.experts), dweight(tokens * moe.top_k);
      for (float& x : logits) x = normal(rng);
      for (float& x : dweight) x = normal(rng);
      const double aux_grad = 0.7;
      auto objective = [&](const std::vector<float>& l) {
        const MoeRouting r = Route(moe, l.data(), tokens, {});
        double sum = aux_grad * (r.aux_loss + r.z_loss);
        for (size_t p = 0; p < r.weight.size(); ++p) {
          if (r.slot[p] >= 0) sum += double{r.weight[p]} * dweight[p];
        }
        return sum;
      };
      const MoeRouting r = Route(moe, logits.data(), tokens, {});
      std::vector<float> dlogits(logits.size());
      RouterBackward(moe, r, dweight.data(), aux_grad, dlogits.data());
      for (size_t i = 0; i < logits.size(); ++i) {
        std::vector<float> plus = logits, minus = logits;
        plus[i] += 1e-3f;
        minus[i] -= 1e-3f;
        const double numeric = (objective(plus) - objective(minus)) / 2e-3;
        EXPECT_NEAR(dlogits[i], numeric, 2e-3)
            << "logit " << i << " score " << static_cast<int>(score) << " normalize " << normalize;
      }
    }
  }
}

// A micro-batch of 3 sequences × 8 tokens split head-tail over two ranks (chunks of 2: rank 0
// holds chunks 0 and 3 of each sequence, rank 1 chunks 1 and 2; rows half-major), each rank routing
// its own tokens with the picks made before each of its chunks: every token's picks kept or
// dropped as when the whole micro-batch is routed at once, the drops and the aux loss add up, and
// the router's backward gives each token's logits the whole micro-batch's gradient.
TEST(MoeRouting, ASplitMicroBatchRoutesAsTheWholeOne) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int b = 3, t = 8, ranks = 2, c = t / (2 * ranks);
  MoeConfig moe = Moe(4, 2);
  moe.aux_loss_coeff = 0.3f;
  moe.z_loss_coeff = 0.2f;
  moe.capacity_factor = 1.0f;
  const int E = moe.experts, K = moe.top_k;
  std::vector<float> logits(b * t * E), dweight(b * t * K);
  for (float& x : logits) x = normal(rng);
  for (float& x : dweight) x = normal(rng);
  for (int i = 0; i < b * t; ++i) logits[i * E] += 1.0f;  // expert 0 overflows
  const MoeRouting whole = Route(moe, logits.data(), b * t, {});
  ASSERT_GT(whole.dropped, 0);
  std::vector<float> whole_dlogits(logits.size());
  RouterBackward(moe, whole, dweight.data(), 0.7, whole_dlogits.data());

  int64_t dropped = 0;
  double aux = 0, z_sum = 0;
  for (int rank = 0; rank < ranks; ++rank) {
    // The rank's tokens in its row order: half h of sequence i is chunk HeadTail(h).
    auto chunk_of = [&](int half) { return half == 0 ? rank : 2 * ranks - 1 - rank; };
    std::vector<int> token;  // local row → the micro-batch's token
    for (int half = 0; half < 2; ++half) {
      for (int i = 0; i < b; ++i) {
        for (int j = 0; j < c; ++j) token.push_back(i * t + chunk_of(half) * c + j);
      }
    }
    const int64_t n = static_cast<int64_t>(token.size());
    std::vector<float> local(n * E), local_dweight(n * K);
    for (int64_t row = 0; row < n; ++row) {
      std::copy_n(&logits[token[row] * E], E, &local[row * E]);
      std::copy_n(&dweight[token[row] * K], K, &local_dweight[row * K]);
    }
    MoeRouting r = SelectExperts(moe, local.data(), n, {});
    // Each run (a chunk of c rows) starts after every pick of the micro-batch's earlier tokens.
    MoeShare share{.batch_tokens = b * t, .run_rows = c};
    for (int run = 0; run < 2 * b; ++run) {
      const int first = token[run * c];
      for (int e = 0; e < E; ++e) {
        int64_t before = 0;
        for (int64_t p = 0; p < int64_t{first} * K; ++p) before += whole.expert[p] == e ? 1 : 0;
        share.picks_before.push_back(before);
      }
    }
    KeepPicks(moe, r, share);
    Balance(moe, r, b * t, whole.picks, whole.score_sum, whole.z_sum);
    EXPECT_NEAR(r.aux_loss, whole.aux_loss, 1e-12);
    EXPECT_NEAR(r.z_loss, whole.z_loss, 1e-12);
    z_sum += r.z_sum;
    dropped += r.dropped;
    aux += r.aux_loss * static_cast<double>(n);
    std::vector<float> dlogits(n * E);
    RouterBackward(moe, r, local_dweight.data(), 0.7, dlogits.data());
    for (int64_t row = 0; row < n; ++row) {
      for (int j = 0; j < K; ++j) {
        EXPECT_EQ(r.slot[row * K + j] >= 0, whole.slot[token[row] * K + j] >= 0)
            << "rank " << rank << " row " << row << " pick " << j;
      }
      for (int e = 0; e < E; ++e) {
        EXPECT_EQ(dlogits[row * E + e], whole_dlogits[token[row] * E + e])
            << "rank " << rank << " row " << row << " expert " << e;
      }
    }
    // Kept rows expert by expert, the rank's token order within one.
    for (int e = 0; e < E; ++e) {
      for (int64_t k = r.offsets[e] + 1; k < r.offsets[e + 1]; ++k) {
        EXPECT_LT(r.source[k - 1], r.source[k]);
      }
    }
  }
  EXPECT_EQ(dropped, whole.dropped);
  EXPECT_NEAR(aux, whole.aux_loss * b * t, 1e-9);
  EXPECT_NEAR(z_sum, whole.z_sum, 1e-9);
}

using test_util::RandomTokens;

config::ModelConfig Small(config::ModelFamily family) {
  config::ModelConfig c;
  c.family = family;
  c.layers = 2;
  c.width = 16;
  c.heads = 2;
  c.kv_heads = family == config::ModelFamily::kGpt2 ? 2 : 1;
  c.ffn_hidden = 24;
  c.vocab = 32;
  c.max_seq = 8;
  c.tied_embeddings = family == config::ModelFamily::kGpt2;
  return c;
}

// The CPU backend runs a layer's experts as one grouped pass (row blocks and weight-gradient
// blocks spread over the threads, single-threaded GEMMs); the interface's default runs one
// Linear pair per expert. Both agree, for GELU with biases and for SwiGLU, with an expert that
// has no rows and experts with more rows than one block, on one thread and on two.
TEST(MoeExperts, TheCpuGroupedPassIsTheExpertByExpertLoop) {
  const int64_t width = 24, ffn = 20, experts = 5;
  const std::vector<int64_t> offsets = {0, 70, 70, 73, 181, 200};
  const int64_t rows = offsets.back();
  std::mt19937 gen(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  // Weights of a trained layer's scale (0.3), so that activations and gradients stay near 1 and
  // the two passes' different summation orders differ by a few ulps of them.
  auto random = [&](int64_t n, float scale = 1.0f) {
    std::vector<float> v(n);
    for (float& x : v) x = scale * normal(gen);
    return v;
  };
  for (const char* activation : {"gelu", "swiglu", "geglu"}) {
    const bool gated = activation != std::string_view("gelu");
    for (int threads : {1, 2}) {
      SCOPED_TRACE(testing::Message() << activation << ", threads " << threads);
      const int64_t fc = gated ? 2 * ffn : ffn;
      std::vector<float> fc_w = random(experts * fc * width, 0.3f);
      std::vector<float> proj_w = random(experts * width * ffn, 0.3f);
      std::vector<float> fc_b = random(experts * fc, 0.3f), proj_b = random(experts * width, 0.3f);
      const std::vector<float> in = random(rows * width), dout = random(rows * width);
      const ExpertMlp mlp{.offsets = offsets,
                          .width = width,
                          .ffn = ffn,
                          .gated = gated,
                          .gate = kernels::GluGateOf(activation == std::string_view("geglu")),
                          .fc_w = fc_w.data(),
                          .fc_b = gated ? nullptr : fc_b.data(),
                          .proj_w = proj_w.data(),
                          .proj_b = gated ? nullptr : proj_b.data()};
      std::unique_ptr<Backend> be = MakeCpuBackend(threads);
      struct Pass {
        std::vector<float> hidden, act, out, dact, dhidden, din, dfc_w, dfc_b, dproj_w, dproj_b;
      };
      auto run = [&](bool grouped) {
        Pass p{std::vector<float>(rows * fc),           std::vector<float>(rows * ffn),
               std::vector<float>(rows * width),        std::vector<float>(rows * ffn),
               std::vector<float>(rows * fc),           std::vector<float>(rows * width),
               std::vector<float>(fc_w.size(), 0.5f),   std::vector<float>(fc_b.size(), 0.5f),
               std::vector<float>(proj_w.size(), 0.5f), std::vector<float>(proj_b.size(), 0.5f)};
        auto A = [](std::vector<float>& v) { return reinterpret_cast<Act*>(v.data()); };
        auto C = [](const std::vector<float>& v) { return reinterpret_cast<const Act*>(v.data()); };
        const ExpertMlpGrads grads{p.dfc_w.data(), gated ? nullptr : p.dfc_b.data(),
                                   p.dproj_w.data(), gated ? nullptr : p.dproj_b.data()};
        if (grouped) {
          be->ExpertsForward(mlp, C(in), A(p.hidden), A(p.act), A(p.out));
          be->ExpertsBackward(mlp, grads, C(dout), C(in), C(p.hidden), C(p.act), A(p.dact),
                              A(p.dhidden), A(p.din));
        } else {
          be->Backend::ExpertsForward(mlp, C(in), A(p.hidden), A(p.act), A(p.out));
          be->Backend::ExpertsBackward(mlp, grads, C(dout), C(in), C(p.hidden), C(p.act), A(p.dact),
                                       A(p.dhidden), A(p.din));
        }
        return p;
      };
      const Pass want = run(false), got = run(true);
      auto expect_near = [](const std::vector<float>& a, const std::vector<float>& b,
                            const char* what) {
        ASSERT_EQ(a.size(), b.size()) << what;
        for (size_t i = 0; i < a.size(); ++i) {
          ASSERT_NEAR(a[i], b[i], 1e-5f * std::max(1.0f, std::abs(b[i])))
              << what << "[" << i << "]";
        }
      };
      expect_near(got.out, want.out, "out");
      expect_near(got.act, want.act, "act");
      expect_near(got.din, want.din, "din");
      expect_near(got.dfc_w, want.dfc_w, "dfc_w");
      expect_near(got.dproj_w, want.dproj_w, "dproj_w");
      expect_near(got.dfc_b, want.dfc_b, "dfc_b");
      expect_near(got.dproj_b, want.dproj_b, "dproj_b");
      // The empty expert's gradients are untouched.
      EXPECT_EQ(got.dproj_w[1 * width * ffn], 0.5f);
      EXPECT_EQ(got.dfc_w[1 * fc * width + fc * width - 1], 0.5f);
    }
  }
}

// One expert with top-1 routes every token to it with weight 1: the dense model's loss and
// gradients, the router's gradient zero.
TEST(MoeModel, OneExpertIsTheDenseModel) {
  for (auto family : {config::ModelFamily::kGpt2, config::ModelFamily::kLlama}) {
    const config::ModelConfig dense_config = Small(family);
    config::ModelConfig moe_config = dense_config;
    moe_config.moe = Moe(1, 1);
    moe_config.moe.ffn = dense_config.ffn_hidden;
    std::unique_ptr<Backend> be = MakeCpuBackend(1);
    auto dense = LocalModel::Create(dense_config, be.get());
    auto moe = LocalModel::Create(moe_config, be.get());
    ASSERT_TRUE(dense.ok() && moe.ok()) << dense.status() << moe.status();
    (*dense)->InitParameters(3);
    (*moe)->InitParameters(5);
    std::vector<float> dense_params((*dense)->num_params()), moe_params((*moe)->num_params());
    (*dense)->ReadParameters(dense_params.data());
    (*moe)->ReadParameters(moe_params.data());
    auto dense_name = [](const std::string& name) {
      return absl::StrReplaceAll(name, {{"moe.experts.", "mlp."}});
    };
    for (const ParamTensor& t : (*moe)->layout().tensors()) {
      const ParamTensor* d = (*dense)->layout().Find(dense_name(t.name));
      if (d == nullptr) continue;  // the router
      ASSERT_EQ(d->numel, t.numel) << t.name;
      std::copy_n(dense_params.data() + d->offset, d->numel, moe_params.data() + t.offset);
    }
    (*moe)->LoadParameters(moe_params.data());
    const int b = 2, t = 8;
    const auto inputs = RandomTokens(b * t, 32, 1), targets = RandomTokens(b * t, 32, 2);
    auto dense_loss = (*dense)->ForwardBackward(inputs.data(), targets.data(), b, t, 1.0f / 16);
    auto moe_loss = (*moe)->ForwardBackward(inputs.data(), targets.data(), b, t, 1.0f / 16);
    ASSERT_TRUE(dense_loss.ok() && moe_loss.ok());
    EXPECT_NEAR(*moe_loss, *dense_loss, 1e-5 * std::abs(*dense_loss));
    std::vector<float> dense_grads((*dense)->num_params()), moe_grads((*moe)->num_params());
    (*dense)->ReadGradients(dense_grads.data());
    (*moe)->ReadGradients(moe_grads.data());
    for (const ParamTensor& t : (*moe)->layout().tensors()) {
      const ParamTensor* d = (*dense)->layout().Find(dense_name(t.name));
      for (int64_t i = 0; i < t.numel; ++i) {
        const float want = d != nullptr ? dense_grads[d->offset + i] : 0.0f;
        ASSERT_NEAR(moe_grads[t.offset + i], want, 1e-4 * std::max(1.0f, std::abs(want)))
            << t.name << "[" << i << "]";
      }
    }
  }
}

// The gradient of mean cross-entropy + Σ aux losses against central differences along random
// directions, for both families with shared experts, and the routing counted once per token.
// Routing is piecewise constant, so a direction that changes a pick has no derivative: with
// top_k = experts no pick can change (all parameters move); with top_k < experts only the last
// block's routed experts move, which no router reads.
void CheckObjectiveGradient(config::ModelFamily family, int top_k, bool last_experts_only) {
  config::ModelConfig c = Small(family);
  c.moe = Moe(4, top_k);
  c.moe.ffn = 8;
  c.moe.shared_experts = 1;
  c.moe.aux_loss_coeff = 0.5f;
  std::unique_ptr<Backend> be = MakeCpuBackend(1);
  auto model = LocalModel::Create(c, be.get());
  ASSERT_TRUE(model.ok()) << model.status();
  LocalModel& m = **model;
  m.InitParameters(11);
  const int b = 2, t = 8;
  const float scale = 1.0f / (b * t);
  const auto inputs = RandomTokens(b * t, 32, 3), targets = RandomTokens(b * t, 32, 4);
  auto objective = [&](double* aux_out = nullptr) {
    m.ZeroGradients();
    const double ce = *m.ForwardBackward(inputs.data(), targets.data(), b, t, scale);
    double aux = 0;
    for (const Model::MoeLayerStats& s : m.model().TakeMoeStats()) {
      aux += s.aux_loss;
      int64_t picks = 0;
      for (int64_t p : s.picks) picks += p;
      EXPECT_EQ(picks, b * t * c.moe.top_k);
      EXPECT_EQ(s.tokens, b * t);
    }
    if (aux_out != nullptr) *aux_out = aux * scale;
    return (ce + aux) * scale;
  };
  std::vector<float> params(m.num_params()), grads(m.num_params()), movable(m.num_params(), 1);
  if (last_experts_only) {
    std::fill(movable.begin(), movable.end(), 0.0f);
    for (const ParamTensor& p : m.layout().tensors()) {
      if (p.name.starts_with("h.1.moe.experts.")) {
        std::fill_n(movable.begin() + p.offset, p.numel, 1.0f);
      }
    }
  }
  m.ReadParameters(params.data());
  double aux = 0;
  objective(&aux);
  EXPECT_GT(aux, 0.0);
  m.ReadGradients(grads.data());
  std::mt19937 rng(9);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  // Small enough that the curvature of GPT-2's norms stays under the tolerance (the dense model
  // is 0.8% off at 1e-3), large enough for fp32.
  constexpr float kEps = 3e-4f;
  for (int trial = 0; trial < 3; ++trial) {
    std::vector<float> plus = params, minus = params;
    double analytic = 0;
    for (size_t i = 0; i < params.size(); ++i) {
      const float d = movable[i] * normal(rng);
      plus[i] += kEps * d;
      minus[i] -= kEps * d;
      analytic += double{grads[i]} * d;
    }
    m.LoadParameters(plus.data());
    const double up = objective();
    m.LoadParameters(minus.data());
    const double down = objective();
    m.LoadParameters(params.data());
    const double numeric = (up - down) / (2 * kEps);
    EXPECT_NEAR(analytic, numeric, 5e-3 * std::max(1.0, std::abs(numeric)))
        << config::FamilyName(family) << " top_k " << top_k << " trial " << trial;
  }
}

TEST(MoeModel, ObjectiveGradientMatchesFiniteDifferences) {
  for (auto family : {config::ModelFamily::kGpt2, config::ModelFamily::kLlama}) {
    CheckObjectiveGradient(family, /*top_k=*/4, /*last_experts_only=*/false);
    CheckObjectiveGradient(family, /*top_k=*/2, /*last_experts_only=*/true);
  }
}

// Generation (worker/generate.h) runs an MoE model one token at a time with the key/value cache;
// the logits each token was chosen from are the training model's over the whole sequence at that
// position. GPT-2: softmax top-2 with a shared expert in every second block; Llama: normalised
// sigmoid top-2 with a selection bias that changes picks, every block. Greedy, 12 new tokens.
void CheckGenerationIsTheModel(config::ModelConfig c) {
  c.max_seq = 24;
  std::unique_ptr<Backend> be = MakeCpuBackend(1);
  auto model = LocalModel::Create(c, be.get());
  ASSERT_TRUE(model.ok()) << model.status();
  LocalModel& m = **model;
  m.InitParameters(17);
  std::vector<float> params(m.num_params());
  m.ReadParameters(params.data());
  std::mt19937 rng(4);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (const ParamTensor& t : m.layout().tensors()) {
    // Routers strong enough to prefer experts clearly; the selection bias away from zero.
    const bool router = t.name.ends_with("router.w"), bias = t.name.ends_with("router.bias");
    for (int64_t i = 0; router && i < t.numel; ++i) params[t.offset + i] *= 8.0f;
    for (int64_t i = 0; bias && i < t.numel; ++i) params[t.offset + i] = normal(rng);
  }
  m.LoadParameters(params.data());
  auto generator = Generator::Create(c, be.get(), params.data());
  ASSERT_TRUE(generator.ok()) << generator.status();
  const std::vector<int32_t> prompt = RandomTokens(5, c.vocab, 6);
  std::vector<std::vector<float>> chosen_from;
  auto out = (*generator)->Generate(prompt, {.tokens = 12}, [&](int32_t) {
    chosen_from.push_back((*generator)->last_logits());
  });
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(chosen_from.size(), 12u);
  std::vector<int32_t> sequence = prompt;
  sequence.insert(sequence.end(), out->begin(), out->end() - 1);
  const int t = static_cast<int>(sequence.size());
  std::vector<float> logits(int64_t{t} * c.vocab);
  ASSERT_TRUE(m.Logits(sequence.data(), 1, t, logits.data()).ok());
  for (int i = 0; i < 12; ++i) {
    const float* want = &logits[int64_t{5 + i - 1} * c.vocab];
    for (int v = 0; v < c.vocab; ++v) {
      ASSERT_NEAR(chosen_from[i][v], want[v], 1e-4f * std::max(1.0f, std::abs(want[v])))
          << config::FamilyName(c.family) << " token " << i << " logit " << v;
    }
  }
}

TEST(MoeModel, GenerationWithTheCacheIsTheTrainingModel) {
  config::ModelConfig gpt2 = Small(config::ModelFamily::kGpt2);
  gpt2.moe = Moe(4, 2);
  gpt2.moe.shared_experts = 1;
  gpt2.moe.every = 2;
  CheckGenerationIsTheModel(gpt2);
  config::ModelConfig llama = Small(config::ModelFamily::kLlama);
  llama.moe = Moe(4, 2);
  llama.moe.score = MoeScore::kSigmoid;
  llama.moe.normalize_top_k = true;
  llama.moe.balance = MoeBalance::kBias;
  CheckGenerationIsTheModel(llama);
}

}  // namespace
}  // namespace trainyard::worker
