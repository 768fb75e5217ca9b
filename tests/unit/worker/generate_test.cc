// The generator sizes its buffers by the request, not by the model's max_seq (published Llama 3
// configs say 131072; on a GPU that much cache would be committed memory): a model of max_seq 2M
// generates, and a longer request after a shorter one grows the buffers and gives what a fresh
// generator gives.
#include "worker/generate.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <vector>

#include "config/model_config.h"
#include "gtest/gtest.h"
#include "worker/backend.h"
#include "worker/local_model.h"

namespace trainyard::worker {
namespace {

std::vector<float> RandomParams(const config::ModelConfig& model, Backend* backend) {
  auto local = LocalModel::Create(model, backend);
  EXPECT_TRUE(local.ok()) << local.status();
  if (!local.ok()) return {};
  (*local)->InitParameters(7);
  std::vector<float> params((*local)->num_params());
  (*local)->ReadParameters(params.data());
  return params;
}

TEST(Generator, BuffersFollowTheRequest) {
  config::ModelConfig model = *config::Preset("llama-debug");
  model.max_seq = 1 << 21;
  std::unique_ptr<Backend> backend = MakeCpuBackend(1);
  const std::vector<float> params = RandomParams(model, backend.get());
  auto generator = Generator::Create(model, backend.get(), params.data());
  ASSERT_TRUE(generator.ok()) << generator.status();
  const std::vector<int32_t> prompt = {3, 141, 59};
  auto short_run = (*generator)->Generate(prompt, {.tokens = 2});
  auto long_run = (*generator)->Generate(prompt, {.tokens = 20});
  ASSERT_TRUE(short_run.ok() && long_run.ok());
  auto fresh = Generator::Create(model, backend.get(), params.data());
  ASSERT_TRUE(fresh.ok());
  auto fresh_run = (*fresh)->Generate(prompt, {.tokens = 20});
  ASSERT_TRUE(fresh_run.ok());
  EXPECT_EQ(*long_run, *fresh_run);
  EXPECT_EQ(std::vector<int32_t>(long_run->begin(), long_run->begin() + 2), *short_run);
}

// Generates `tokens` tokens after `prompt` with the key/value cache and checks that the logits
// each token is chosen from are the training model's (same parameters) over the sequence so far,
// for the prompt's pass and each step.
void ExpectEachStepIsTheTrainingModels(const config::ModelConfig& model,
                                       const std::vector<int32_t>& prompt, int tokens) {
  std::unique_ptr<Backend> backend = MakeCpuBackend(1);
  const std::vector<float> params = RandomParams(model, backend.get());
  auto local = LocalModel::Create(model, backend.get());
  ASSERT_TRUE(local.ok()) << local.status();
  (*local)->LoadParameters(params.data());
  auto generator = Generator::Create(model, backend.get(), params.data());
  ASSERT_TRUE(generator.ok()) << generator.status();
  std::vector<std::vector<float>> chosen_from;
  auto out = (*generator)->Generate(prompt, {.tokens = tokens}, [&](int32_t) {
    chosen_from.push_back((*generator)->last_logits());
  });
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(chosen_from.size(), static_cast<size_t>(tokens));
  std::vector<int32_t> sequence = prompt;
  sequence.insert(sequence.end(), out->begin(), out->end());
  for (size_t i = 0; i < chosen_from.size(); ++i) {
    const int t = static_cast<int>(prompt.size() + i);  // the sequence token i is chosen after
    std::vector<float> logits(int64_t{t} * model.vocab);
    ASSERT_TRUE((*local)->Logits(sequence.data(), 1, t, logits.data()).ok());
    const float* want = &logits[int64_t{t - 1} * model.vocab];
    for (int v = 0; v < model.vocab; ++v) {
      ASSERT_NEAR(chosen_from[i][v], want[v], 1e-4f * std::max(1.0f, std::abs(want[v])))
          << "token " << i << " (after " << t << " positions) logit " << v;
    }
  }
}

// With a sliding window of 4 the cached keys outside each new token's window must not count (the
// training model's causal attention is windowed the same way).
TEST(Generator, ASlidingWindowSeesWhatTheTrainingModelSees) {
  config::ModelConfig model = *config::Preset("llama-debug");
  model.max_seq = 32;
  model.sliding_window = 4;
  ExpectEachStepIsTheTrainingModels(model, {3, 141, 59, 26, 5, 35}, 10);
}

// Documents (model.document_token): each position sees only its own document's cached keys, as
// the training model's attention does: documents begun in the prompt, and then one begun by a
// generated token (the first one greedy decoding picks after a prompt without the token).
TEST(Generator, DocumentsSeeWhatTheTrainingModelSees) {
  config::ModelConfig model = *config::Preset("llama-debug");
  model.max_seq = 32;
  model.document_token = 26;
  ExpectEachStepIsTheTrainingModels(model, {3, 141, 26, 59, 5, 26, 35}, 10);

  model.document_token = -1;
  const std::vector<int32_t> prompt = {3, 141, 59, 5};
  std::unique_ptr<Backend> backend = MakeCpuBackend(1);
  const std::vector<float> params = RandomParams(model, backend.get());
  auto generator = Generator::Create(model, backend.get(), params.data());
  ASSERT_TRUE(generator.ok()) << generator.status();
  auto first = (*generator)->Generate(prompt, {.tokens = 1});
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_EQ(std::count(prompt.begin(), prompt.end(), first->at(0)), 0);
  model.document_token = first->at(0);
  ExpectEachStepIsTheTrainingModels(model, prompt, 10);
}

// LongRoPE's factors follow the sequence's length (Phi-4 mini's RoPE: 10 of 16 dimensions, short
// factors up to 8 positions, long ones beyond): before, at and after the step where the sequence
// grows past 8, where the generator runs the whole sequence again so that no cached key keeps the
// short factors' rotation (without that pass the step after 9 positions is off).
TEST(Generator, LongRopeSeesWhatTheTrainingModelSeesAcrossItsSwitch) {
  config::ModelConfig model = *config::Preset("llama-debug");
  model.max_seq = 32;
  model.rope_dim = 10;
  model.rope_scaling = {.original_max_seq = 8,
                        .longrope = true,
                        .short_factor = {1.0f, 1.5f, 2.0f, 3.0f, 4.0f},
                        .long_factor = {2.0f, 3.0f, 5.0f, 11.0f, 30.0f},
                        .attention_factor = 1.2f};
  ExpectEachStepIsTheTrainingModels(model, {3, 141, 59, 26, 5}, 10);
}

// SmolLM3's NoPE block: the cached keys of the second block stay unturned, as the training
// model's are.
TEST(Generator, NopeLayersSeeWhatTheTrainingModelSees) {
  config::ModelConfig model = *config::Preset("llama-debug");
  model.max_seq = 32;
  model.nope_layers = {1};
  ExpectEachStepIsTheTrainingModels(model, {3, 141, 59, 26, 5}, 10);
}

// Multi-head latent attention: the cache holds each position's shared rotary key (turned at its
// position) and normed latent, rope_dim + kv_rank elements a layer; the prompt's pass attends over
// decompressed keys and values, each later token over the cached latents in the absorbed form
// (each head's query through its key up-projection, its output through its value
// up-projection). With and without the query latent, with value heads wider than the keys, and
// with what the scores pass through on the way (a sliding window, documents, a soft cap, Granite's
// multiplier in place of head_dim^-1/2).
TEST(Generator, LatentAttentionIsTheTrainingModels) {
  config::ModelConfig model = *config::Preset("llama-debug");
  model.max_seq = 32;
  model.kv_heads = model.heads;
  model.explicit_head_dim = 24;
  model.rope_dim = 8;
  model.latent = {.q_rank = 20, .kv_rank = 12, .value_dim = 16};
  ExpectEachStepIsTheTrainingModels(model, {3, 141, 59, 26, 5}, 10);
  model.latent = {.q_rank = 0, .kv_rank = 12, .value_dim = 30};
  ExpectEachStepIsTheTrainingModels(model, {3, 141, 59, 26, 5}, 10);
  model.sliding_window = 4;
  model.document_token = 26;
  model.attention_softcap = 5.0f;
  model.attention_multiplier = 0.3f;
  ExpectEachStepIsTheTrainingModels(model, {3, 141, 59, 5, 26, 35}, 10);
}

TEST(Generator, LatentAttentionCachesTheLatents) {
  config::ModelConfig model = *config::Preset("llama-debug");
  model.kv_heads = model.heads;
  model.explicit_head_dim = 24;
  model.rope_dim = 8;
  model.latent = {.q_rank = 20, .kv_rank = 12, .value_dim = 16};
  std::unique_ptr<Backend> backend = MakeCpuBackend(1);
  const std::vector<float> params = RandomParams(model, backend.get());
  auto latent = Generator::Create(model, backend.get(), params.data());
  ASSERT_TRUE(latent.ok()) << latent.status();
  EXPECT_EQ((*latent)->CachePerPosition(), model.layers * (8 + 12));
  model.latent = {};
  model.explicit_head_dim = 0;
  model.rope_dim = 0;
  const std::vector<float> dense_params = RandomParams(model, backend.get());
  auto dense = Generator::Create(model, backend.get(), dense_params.data());
  ASSERT_TRUE(dense.ok()) << dense.status();
  EXPECT_EQ((*dense)->CachePerPosition(), model.layers * 2 * model.kv_heads * model.head_dim());
}

// Granite's multipliers: the embeddings, each branch joining the cached residual stream, the
// scores against cached keys and the logits, scaled as the training model scales them.
TEST(Generator, GraniteMultipliersAreTheTrainingModels) {
  config::ModelConfig model = *config::Preset("llama-debug");
  model.max_seq = 32;
  model.embedding_multiplier = 6.0f;
  model.residual_multiplier = 0.5f;
  model.attention_multiplier = 0.0625f;
  model.logits_scaling = 2.0f;
  ExpectEachStepIsTheTrainingModels(model, {3, 141, 59, 26, 5}, 10);
}

// How often each token is drawn in `draws` draws from `logits`.
std::map<int32_t, int> Draws(const std::vector<float>& logits, const SampleOptions& options,
                             int draws) {
  std::mt19937_64 rng(options.seed);
  std::map<int32_t, int> counts;
  for (int i = 0; i < draws; ++i) ++counts[ChooseToken(logits, options, rng)];
  return counts;
}

std::set<int32_t> Drawn(const std::map<int32_t, int>& counts) {
  std::set<int32_t> ids;
  for (const auto& [id, n] : counts) ids.insert(id);
  return ids;
}

// Nucleus sampling as transformers' TopPLogitsWarper: the most likely tokens up to and including
// the one whose probability brings their sum to top_p, the rest never drawn, the kept ones in
// proportion to their probabilities; after top-k, over the probabilities top-k left.
TEST(ChooseToken, TopPKeepsTheNucleus) {
  // Probabilities 0.05, 0.5, 0.15, 0.3 (ids out of order on purpose).
  const std::vector<float> logits = {std::log(0.05f), std::log(0.5f), std::log(0.15f),
                                     std::log(0.3f)};
  auto with = [](float top_p, int top_k = 0) {
    return SampleOptions{.temperature = 1.0f, .top_k = top_k, .top_p = top_p, .seed = 11};
  };
  EXPECT_EQ(Drawn(Draws(logits, with(0.4f), 2000)), (std::set<int32_t>{1}));
  EXPECT_EQ(Drawn(Draws(logits, with(0.7f), 2000)), (std::set<int32_t>{1, 3}));
  EXPECT_EQ(Drawn(Draws(logits, with(0.85f), 4000)), (std::set<int32_t>{1, 2, 3}));
  EXPECT_EQ(Drawn(Draws(logits, with(0.99f), 8000)), (std::set<int32_t>{0, 1, 2, 3}));
  const std::map<int32_t, int> counts = Draws(logits, with(0.7f), 40000);
  EXPECT_NEAR(counts.at(1) / 40000.0, 0.5 / 0.8, 0.01);
  // Top-k 3 leaves 0.5, 0.15, 0.3 (of 0.95): 0.8 of that is reached at id 3 (0.842 before id 2).
  EXPECT_EQ(Drawn(Draws(logits, with(0.8f, 3), 4000)), (std::set<int32_t>{1, 3}));
  EXPECT_EQ(Drawn(Draws(logits, with(0.9f, 3), 4000)), (std::set<int32_t>{1, 2, 3}));
  // Ties go to the lower id: four equal tokens, 0.3 is reached with the second.
  EXPECT_EQ(Drawn(Draws({2.0f, 2.0f, 2.0f, 2.0f}, with(0.3f), 2000)), (std::set<int32_t>{0, 1}));
  // top_p 1 draws as before it existed: the same sequence as without the filter.
  std::mt19937_64 a(5), b(5);
  for (int i = 0; i < 100; ++i) {
    const SampleOptions all{.temperature = 0.8f, .top_k = 3, .seed = 5};
    SampleOptions one = all;
    one.top_p = 1.0f;
    EXPECT_EQ(ChooseToken(logits, all, a), ChooseToken(logits, one, b));
  }
}

// Generation ends after an end-of-sequence token, which is the last one returned; a request's
// top_p outside (0, 1] is refused.
TEST(Generator, StopsAfterAnEndOfSequenceToken) {
  const config::ModelConfig model = *config::Preset("llama-debug");
  std::unique_ptr<Backend> backend = MakeCpuBackend(1);
  const std::vector<float> params = RandomParams(model, backend.get());
  auto generator = Generator::Create(model, backend.get(), params.data());
  ASSERT_TRUE(generator.ok()) << generator.status();
  const std::vector<int32_t> prompt = {3, 141, 59};
  // Drawn (the same seed, the same draws) rather than greedy, whose tokens repeat.
  auto all = (*generator)->Generate(prompt, {.tokens = 12, .temperature = 1.0f, .seed = 3});
  ASSERT_TRUE(all.ok()) << all.status();
  // The last token that had not come before: generation must stop there, not earlier.
  size_t last_new = 0;
  for (size_t i = 0; i < all->size(); ++i) {
    if (std::find(all->begin(), all->begin() + i, (*all)[i]) == all->begin() + i) last_new = i;
  }
  ASSERT_GE(last_new, 6u);
  int32_t absent = 0;  // a second stop id, never generated
  while (std::find(all->begin(), all->end(), absent) != all->end()) ++absent;
  std::vector<int32_t> seen;
  auto stopped = (*generator)
                     ->Generate(prompt,
                                {.tokens = 12,
                                 .temperature = 1.0f,
                                 .seed = 3,
                                 .stop_ids = {absent, (*all)[last_new]}},
                                [&](int32_t t) { seen.push_back(t); });
  ASSERT_TRUE(stopped.ok()) << stopped.status();
  EXPECT_EQ(*stopped, std::vector<int32_t>(all->begin(), all->begin() + last_new + 1));
  EXPECT_EQ(seen, *stopped);
  for (float top_p : {0.0f, -0.5f, 1.5f, NAN}) {
    EXPECT_FALSE((*generator)->CheckRequest(prompt, {.temperature = 1.0f, .top_p = top_p}).ok())
        << top_p;
  }
}

}  // namespace
}  // namespace trainyard::worker
