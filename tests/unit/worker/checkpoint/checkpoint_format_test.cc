// The checkpoint format's pure parts: where a rank's local tensors sit in the global ones (for
// every shard kind and tensor-parallel size), the manifest's checksum, directory names, and the
// model check that names the differing field.
#include <numeric>
#include <string>
#include <vector>

#include "common/filesystem.h"
#include "config/model_config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/checkpoint/format.h"
#include "worker/shape/parameters.h"
#include "worker/shape/tensor_slices.h"

namespace trainyard::worker::checkpoint {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// Rebuilding each global tensor from the local tensors of every tensor-parallel rank, through
// LocalPieces/ForEachRun, must give back exactly the global tensor ParameterLayout::Slice cut.
void ExpectPiecesInvertSlice(const config::ModelConfig& model, int tp) {
  const ParameterLayout full(model);
  std::vector<float> global(full.total());
  std::iota(global.begin(), global.end(), 0.0f);
  for (int rank = 0; rank < tp; ++rank) {
    const ParameterLayout local(model, rank, tp);
    for (const ParamTensor& t : local.tensors()) {
      const ParamTensor* g = full.Find(t.name);
      ASSERT_NE(g, nullptr) << t.name;
      std::vector<float> sliced(t.numel);
      local.Slice(t, global.data() + g->offset, sliced.data());
      std::vector<float> rebuilt(t.numel, -1.0f);
      const std::vector<Hyperslab> pieces = LocalPieces(t, rank, tp);
      int64_t start = 0;
      for (const Hyperslab& piece : pieces) {
        // Two halves, to exercise runs that start and end inside a row.
        const int64_t n = piece.numel(), half = n / 2 + 1;
        for (auto [b, e] :
             {std::pair<int64_t, int64_t>{0, std::min(half, n)}, {std::min(half, n), n}}) {
          ForEachRun(t.global_shape, piece, b, e, [&](int64_t at, int64_t from, int64_t count) {
            for (int64_t i = 0; i < count; ++i) {
              rebuilt[start + from + i] = global[g->offset + at + i];
            }
          });
        }
        start += n;
      }
      EXPECT_EQ(start, t.numel) << t.name;
      EXPECT_EQ(rebuilt, sliced) << t.name << " on tp rank " << rank << " of " << tp;
    }
  }
}

TEST(CheckpointFormatTest, LocalPiecesInvertTensorParallelSlices) {
  for (const char* preset : {"gpt2-debug", "llama-debug"}) {
    config::ModelConfig model = *config::Preset(preset);
    for (int tp : {1, 2}) {
      SCOPED_TRACE(testing::Message() << preset << " tp " << tp);
      ExpectPiecesInvertSlice(model, tp);
    }
  }
}

TEST(CheckpointFormatTest, SplitByPieceCutsRangesAtPieceBoundaries) {
  const std::vector<Hyperslab> pieces = {{{0, 0}, {2, 3}}, {{4, 0}, {1, 3}}};  // 6 + 3 elements
  const std::vector<PieceRange> split = SplitByPiece(pieces, 4, 8);
  ASSERT_EQ(split.size(), 2u);
  EXPECT_EQ(split[0].piece, 0);
  EXPECT_EQ(split[0].begin, 4);
  EXPECT_EQ(split[0].end, 6);
  EXPECT_EQ(split[1].piece, 1);
  EXPECT_EQ(split[1].begin, 0);
  EXPECT_EQ(split[1].end, 2);
  EXPECT_TRUE(SplitByPiece(pieces, 9, 9).empty());
}

TEST(CheckpointFormatTest, DirectoryNamesRoundTrip) {
  EXPECT_EQ(CheckpointDirName(120, "0a1b2c3d"), "step-00000120-0a1b2c3d");
  EXPECT_EQ(StepOfDirName("step-00000120-0a1b2c3d"), 120);
  EXPECT_EQ(StepOfDirName("step-120"), std::nullopt);
  EXPECT_EQ(StepOfDirName("step--x"), std::nullopt);
  EXPECT_EQ(StepOfDirName("manifest.json"), std::nullopt);
  EXPECT_EQ(ShardFileName(1, 4), "shard-00001-of-00004.bin");
}

Manifest SomeManifest() {
  Manifest m;
  m.set_format_version(kFormatVersion);
  m.set_step(7);
  m.set_job("j");
  *m.mutable_model() = SignatureOf(*config::Preset("gpt2-debug"));
  ShardFile* shard = m.add_shards();
  shard->set_file(ShardFileName(0, 1));
  shard->set_bytes(8);
  TensorRecord* r = shard->add_records();
  r->set_name("wte");
  r->set_xxh3(0xfedcba9876543210ull);
  return m;
}

TEST(CheckpointFormatTest, ManifestRoundTripsAndEveryFlippedBitIsDetected) {
  FakeFileSystem fs;
  ASSERT_TRUE(fs.CreateDirs("ck/step-00000007-aa").ok());
  const std::string json = SerializeManifest(SomeManifest());
  ASSERT_TRUE(fs.WriteFileAtomic("ck/step-00000007-aa/manifest.json", json).ok());
  absl::StatusOr<Manifest> read = ReadManifest(fs, "ck/step-00000007-aa");
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->step(), 7);
  EXPECT_EQ(read->shards(0).records(0).xxh3(), 0xfedcba9876543210ull);
  int undetected = 0;
  for (size_t byte = 0; byte < json.size(); ++byte) {
    for (int bit : {0, 3, 6}) {
      std::string bad = json;
      bad[byte] = static_cast<char>(bad[byte] ^ (1 << bit));
      ASSERT_TRUE(fs.WriteFileAtomic("ck/step-00000007-aa/manifest.json", bad).ok());
      absl::StatusOr<Manifest> m = ReadManifest(fs, "ck/step-00000007-aa");
      // A flip that leaves the same message (whitespace turned into other whitespace, say) is
      // harmless; every other one must be refused.
      if (m.ok() && SerializeManifest(*m) != json) ++undetected;
    }
  }
  EXPECT_EQ(undetected, 0);
  ASSERT_TRUE(fs.WriteFileAtomic("ck/step-00000007-aa/manifest.json", json.substr(0, 40)).ok());
  EXPECT_EQ(ReadManifest(fs, "ck/step-00000007-aa").status().code(), absl::StatusCode::kDataLoss);
}

TEST(CheckpointFormatTest, ListCommittedIgnoresTornDirectoriesAndSortsNewestFirst) {
  FakeFileSystem fs;
  for (const char* d :
       {"ck/step-00000010-aa", "ck/step-00000030-bb", "ck/step-00000020-aa", "ck/other"}) {
    ASSERT_TRUE(fs.CreateDirs(d).ok());
  }
  ASSERT_TRUE(fs.WriteFileAtomic("ck/step-00000010-aa/manifest.json", "{}").ok());
  ASSERT_TRUE(fs.WriteFileAtomic("ck/step-00000020-aa/manifest.json", "{}").ok());
  absl::StatusOr<std::vector<std::string>> list = ListCommitted(fs, "ck");
  ASSERT_TRUE(list.ok());
  EXPECT_EQ(*list, (std::vector<std::string>{"ck/step-00000020-aa", "ck/step-00000010-aa"}));
}

TEST(CheckpointFormatTest, ModelMismatchNamesTheField) {
  config::ModelConfig model = *config::Preset("gpt2-debug");
  const ModelSignature saved = SignatureOf(model);
  EXPECT_TRUE(CheckModelMatches(saved, model).ok());
  model.width *= 2;
  absl::Status s = CheckModelMatches(saved, model);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("model.width"));
  model = *config::Preset("llama-debug");
  EXPECT_THAT(CheckModelMatches(saved, model).message(), HasSubstr("model.family"));
  // Biases on q, k and v change the tensors: a checkpoint with them loads only with them, and
  // the signature carries them back (a checkpoint from before they existed reads as without).
  config::ModelConfig biased = model;
  biased.qkv_bias = true;
  EXPECT_THAT(CheckModelMatches(SignatureOf(biased), model).message(), HasSubstr("model.qkv_bias"));
  EXPECT_TRUE(ModelFromSignature(SignatureOf(biased))->qkv_bias);
  EXPECT_FALSE(ModelFromSignature(SignatureOf(model))->qkv_bias);

  // The heads' width is compared as a width: head_dim 16 written out is llama-debug's own, 24 is
  // another model, and an old checkpoint (no head_dim) reads as width / heads.
  config::ModelConfig same = model, wide = model;
  same.explicit_head_dim = 16;
  wide.explicit_head_dim = 24;
  EXPECT_TRUE(CheckModelMatches(SignatureOf(same), model).ok());
  EXPECT_TRUE(CheckModelMatches(SignatureOf(model), same).ok());
  EXPECT_THAT(CheckModelMatches(SignatureOf(wide), model).message(),
              HasSubstr("model.head_dim is 24 in the checkpoint, 16 in the spec"));
  EXPECT_EQ(ModelFromSignature(SignatureOf(wide))->head_dim(), 24);
  EXPECT_EQ(ModelFromSignature(SignatureOf(model))->head_dim(), 16);

  // So do the norms of the branches' outputs.
  config::ModelConfig post = model;
  post.post_norms = true;
  EXPECT_THAT(CheckModelMatches(SignatureOf(post), model).message(),
              HasSubstr("model.post_norms is true in the checkpoint, false in the spec"));
  EXPECT_TRUE(ModelFromSignature(SignatureOf(post))->post_norms);
  // And the norms before the branches, when they are absent.
  config::ModelConfig post_only = post;
  post_only.pre_norms = false;
  EXPECT_THAT(CheckModelMatches(SignatureOf(post_only), post).message(),
              HasSubstr("model.pre_norms is false in the checkpoint, true in the spec"));
  EXPECT_FALSE(ModelFromSignature(SignatureOf(post_only))->pre_norms);
  EXPECT_TRUE(ModelFromSignature(SignatureOf(post))->pre_norms);
  // Local blocks' RoPE base is what the parameters mean, as rope_theta.
  config::ModelConfig local = model;
  local.sliding_window = 8;
  local.rope_local_theta = 500.0f;
  EXPECT_TRUE(CheckModelMatches(SignatureOf(local), model).ok());
  EXPECT_EQ(ModelFromSignature(SignatureOf(local))->rope_local_theta, 500.0f);

  // Gemma 2's score scale and soft caps are what the parameters mean, as rope_theta.
  config::ModelConfig capped = model;
  capped.attention_scale_dim = 7;
  capped.attention_softcap = 50.0f;
  capped.logit_softcap = 30.0f;
  EXPECT_TRUE(CheckModelMatches(SignatureOf(capped), model).ok());
  absl::StatusOr<config::ModelConfig> back = ModelFromSignature(SignatureOf(capped));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->attention_scale_dim, 7);
  EXPECT_EQ(back->attention_softcap, 50.0f);
  EXPECT_EQ(back->logit_softcap, 30.0f);

  // Query and key norms add tensors: refused without them, carried back with them.
  config::ModelConfig normed = model;
  normed.qk_norm = true;
  EXPECT_THAT(CheckModelMatches(SignatureOf(normed), model).message(),
              HasSubstr("model.qk_norm is true in the checkpoint, false in the spec"));
  EXPECT_TRUE(ModelFromSignature(SignatureOf(normed))->qk_norm);
  EXPECT_FALSE(ModelFromSignature(SignatureOf(model))->qk_norm);

  // A sliding window is what the attention means, as rope_theta: a job may resume with another
  // (the tensors are the same), and an export reads it from the signature.
  config::ModelConfig windowed = model;
  windowed.sliding_window = 8;
  EXPECT_TRUE(CheckModelMatches(SignatureOf(windowed), model).ok());
  EXPECT_EQ(ModelFromSignature(SignatureOf(windowed))->sliding_window, 8);
  EXPECT_EQ(ModelFromSignature(SignatureOf(model))->sliding_window, 0);
  windowed.full_attention_layers = {1};
  EXPECT_TRUE(CheckModelMatches(SignatureOf(windowed), model).ok());
  EXPECT_EQ(ModelFromSignature(SignatureOf(windowed))->full_attention_layers,
            std::vector<int32_t>{1});
  EXPECT_TRUE(ModelFromSignature(SignatureOf(model))->full_attention_layers.empty());
  // So are SmolLM3's NoPE blocks.
  config::ModelConfig nope = model;
  nope.nope_layers = {1};
  EXPECT_TRUE(CheckModelMatches(SignatureOf(nope), model).ok());
  EXPECT_EQ(ModelFromSignature(SignatureOf(nope))->nope_layers, std::vector<int32_t>{1});
  EXPECT_TRUE(ModelFromSignature(SignatureOf(model))->nope_layers.empty());
  // So are Granite's multipliers; a signature from before them (0s) reads as none.
  config::ModelConfig granite = model;
  granite.embedding_multiplier = 12.0f;
  granite.residual_multiplier = 0.22f;
  granite.attention_multiplier = 0.0078125f;
  granite.logits_scaling = 16.0f;
  EXPECT_TRUE(CheckModelMatches(SignatureOf(granite), model).ok());
  const absl::StatusOr<config::ModelConfig> multiplied = ModelFromSignature(SignatureOf(granite));
  ASSERT_TRUE(multiplied.ok()) << multiplied.status();
  EXPECT_EQ(multiplied->embedding_multiplier, 12.0f);
  EXPECT_EQ(multiplied->residual_multiplier, 0.22f);
  EXPECT_EQ(multiplied->attention_multiplier, 0.0078125f);
  EXPECT_EQ(multiplied->logits_scaling, 16.0f);
  ModelSignature before = SignatureOf(model);
  before.clear_embedding_multiplier();
  before.clear_residual_multiplier();
  before.clear_logits_scaling();
  const absl::StatusOr<config::ModelConfig> old = ModelFromSignature(before);
  ASSERT_TRUE(old.ok()) << old.status();
  EXPECT_FALSE(old->HasGraniteMultipliers());

  // So are Gemma's GeGLU and embedding scale: recorded for exports, not compared on resume.
  config::ModelConfig gemma = model;
  gemma.geglu = true;
  gemma.scale_embeddings = true;
  EXPECT_TRUE(CheckModelMatches(SignatureOf(gemma), model).ok());
  const absl::StatusOr<config::ModelConfig> read = ModelFromSignature(SignatureOf(gemma));
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_TRUE(read->geglu && read->scale_embeddings);
  EXPECT_FALSE(ModelFromSignature(SignatureOf(model))->geglu);
  EXPECT_FALSE(ModelFromSignature(SignatureOf(model))->scale_embeddings);
}

config::ModelConfig MoeModel() {
  config::ModelConfig model = *config::Preset("llama-debug");
  model.moe = {.experts = 4, .top_k = 2, .shared_experts = 1, .every = 2, .ffn = 32};
  return model;
}

TEST(CheckpointFormatTest, MoeMismatchNamesTheField) {
  const config::ModelConfig moe = MoeModel();
  const ModelSignature saved = SignatureOf(moe);
  EXPECT_TRUE(CheckModelMatches(saved, moe).ok());
  // What leaves every parameter's shape alone may change between runs.
  config::ModelConfig retuned = moe;
  retuned.moe.top_k = 1;
  retuned.moe.score = config::MoeScore::kSigmoid;
  retuned.moe.normalize_top_k = true;
  retuned.moe.aux_loss_coeff = 0.1f;
  retuned.moe.capacity_factor = 1.5f;
  retuned.moe.routed_scale = 2.5f;
  retuned.moe.groups = 2;
  retuned.moe.group_top_k = 1;
  retuned.moe.group_score = config::GroupScore::kMax;
  EXPECT_TRUE(CheckModelMatches(saved, retuned).ok());
  // The routed experts' scale and groups (with what scores them) are recorded for generation and
  // export; a signature written before they were (0) reads as 1 and one group.
  const absl::StatusOr<config::ModelConfig> recorded = ModelFromSignature(SignatureOf(retuned));
  ASSERT_TRUE(recorded.ok()) << recorded.status();
  EXPECT_EQ(recorded->moe.routed_scale, 2.5f);
  EXPECT_EQ(recorded->moe.groups, 2);
  EXPECT_EQ(recorded->moe.group_top_k, 1);
  EXPECT_EQ(recorded->moe.group_score, config::GroupScore::kMax);
  ModelSignature unscaled = SignatureOf(moe);
  unscaled.mutable_moe()->clear_routed_scale();
  unscaled.mutable_moe()->clear_groups();
  unscaled.mutable_moe()->clear_group_top_k();
  const absl::StatusOr<config::ModelConfig> before = ModelFromSignature(unscaled);
  ASSERT_TRUE(before.ok()) << before.status();
  EXPECT_EQ(before->moe.routed_scale, 1.0f);
  EXPECT_EQ(before->moe.groups, 1);
  EXPECT_FALSE(before->moe.limits_groups());
  auto mismatch = [&](auto change) {
    config::ModelConfig changed = moe;
    change(changed.moe);
    return std::string(CheckModelMatches(saved, changed).message());
  };
  EXPECT_EQ(mismatch([](config::MoeConfig& m) { m.experts = 8; }),
            "model.moe.experts is 4 in the checkpoint, 8 in the spec");
  EXPECT_EQ(mismatch([](config::MoeConfig& m) { m.ffn = 64; }),
            "model.moe.ffn is 32 in the checkpoint, 64 in the spec");
  EXPECT_EQ(mismatch([](config::MoeConfig& m) { m.shared_experts = 0; }),
            "model.moe.shared_experts is 1 in the checkpoint, 0 in the spec");
  EXPECT_EQ(mismatch([](config::MoeConfig& m) { m.every = 1; }),
            "model.moe.every is 2 in the checkpoint, 1 in the spec");
  EXPECT_EQ(mismatch([](config::MoeConfig& m) { m.dense_first = 1; }),
            "model.moe.dense_first is 0 in the checkpoint, 1 in the spec");
  // The query and key norms' span sets their weights' shapes.
  config::ModelConfig whole = moe;
  whole.qk_norm = true;
  config::ModelConfig per_head = whole;
  whole.qk_norm_span = config::QkNormSpan::kProjection;
  EXPECT_EQ(CheckModelMatches(SignatureOf(per_head), whole).message(),
            "model.qk_norm_span is head in the checkpoint, projection in the spec");
  auto spanned = ModelFromSignature(SignatureOf(whole));
  ASSERT_TRUE(spanned.ok()) << spanned.status();
  EXPECT_TRUE(spanned->NormsWholeProjection());
  // The gate is a tensor of its own.
  EXPECT_EQ(mismatch([](config::MoeConfig& m) { m.shared_gate = true; }),
            "model.moe.shared_gate is false in the checkpoint, true in the spec");
  config::ModelConfig gated = moe;
  gated.moe.shared_gate = true;
  auto read = ModelFromSignature(SignatureOf(gated));
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_TRUE(read->moe.shared_gate);
  EXPECT_TRUE(CheckModelMatches(SignatureOf(gated), gated).ok());
  // The selection bias is a tensor of the bias rule's routers only.
  EXPECT_EQ(mismatch([](config::MoeConfig& m) { m.balance = config::MoeBalance::kBias; }),
            "model.moe.balance is aux_loss in the checkpoint, bias in the spec");
  // A dense checkpoint (every one written before MoE existed, too) and an MoE model.
  const config::ModelConfig dense = *config::Preset("llama-debug");
  EXPECT_EQ(CheckModelMatches(SignatureOf(dense), moe).message(),
            "model.moe.experts is 0 in the checkpoint, 4 in the spec");
  EXPECT_EQ(CheckModelMatches(saved, dense).message(),
            "model.moe.experts is 4 in the checkpoint, 0 in the spec");
}

// The router's rule travels with the shapes (generation and export read it); the model of a
// checkpoint written before it was recorded is refused.
TEST(CheckpointFormatTest, TheSignatureCarriesTheRoutingRule) {
  config::ModelConfig model = MoeModel();
  model.moe.top_k = 3;
  model.moe.score = config::MoeScore::kSigmoid;
  model.moe.normalize_top_k = false;
  model.moe.balance = config::MoeBalance::kBias;
  ModelSignature saved = SignatureOf(model);
  absl::StatusOr<config::ModelConfig> read = ModelFromSignature(saved);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->moe.top_k, 3);
  EXPECT_EQ(read->moe.score, config::MoeScore::kSigmoid);
  EXPECT_FALSE(read->moe.normalize_top_k);
  EXPECT_EQ(read->moe.balance, config::MoeBalance::kBias);
  saved.mutable_moe()->clear_top_k();
  saved.mutable_moe()->clear_sigmoid_score();
  saved.mutable_moe()->clear_normalize_top_k();
  EXPECT_THAT(ModelFromSignature(saved).status().message(),
              HasSubstr("predates the recording of its routing"));
  // Loading into a job compares shapes only: the old checkpoint still resumes.
  EXPECT_TRUE(CheckModelMatches(saved, model).ok());
}

// Llama 3's RoPE scaling travels with the model (export and generation compute with it); a
// checkpoint without it has none.
TEST(CheckpointFormatTest, TheSignatureCarriesTheRopeScaling) {
  config::ModelConfig model = *config::Preset("llama-debug");
  EXPECT_FALSE(ModelFromSignature(SignatureOf(model))->rope_scaling.enabled());
  model.rope_scaling = {
      .factor = 32.0f, .low_freq_factor = 2.0f, .high_freq_factor = 8.0f, .original_max_seq = 4096};
  absl::StatusOr<config::ModelConfig> read = ModelFromSignature(SignatureOf(model));
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->rope_scaling, model.rope_scaling);
  model.rope_scaling = {.linear = true, .factor = 8.0f};
  read = ModelFromSignature(SignatureOf(model));
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->rope_scaling, model.rope_scaling);
  // LongRoPE's factors and magnitude, over the part of each head model.rope_dim turns.
  model.rope_dim = 4;
  model.rope_scaling = {.original_max_seq = 32,
                        .longrope = true,
                        .short_factor = {1.0f, 1.0800000429153442f},
                        .long_factor = {3.5f, 41.25f},
                        .attention_factor = 1.1902380714238083f};
  read = ModelFromSignature(SignatureOf(model));
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->rope_scaling, model.rope_scaling);
  EXPECT_EQ(read->rope_dim, 4);
  EXPECT_EQ(ModelFromSignature(SignatureOf(*config::Preset("llama-debug")))->rope_dim, 0);
  // YaRN's factor, context, betas, untruncated blend and attention factor.
  model.rope_scaling = {.factor = 4.0f,
                        .original_max_seq = 32,
                        .attention_factor = 1.2f,
                        .yarn = true,
                        .beta_fast = 16.0f,
                        .beta_slow = 0.5f,
                        .truncate = false};
  read = ModelFromSignature(SignatureOf(model));
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->rope_scaling, model.rope_scaling);
}

// Latent attention's ranks, value heads and rotary part size its projections: a checkpoint with
// it loads only into the same latent model, and the signature carries it back; a model without
// it writes no latent member.
TEST(CheckpointFormatTest, TheSignatureCarriesLatentAttention) {
  config::ModelConfig plain = *config::Preset("llama-debug");
  plain.kv_heads = plain.heads;
  plain.rope_dim = 4;
  config::ModelConfig latent = plain;
  latent.latent = {.q_rank = 24, .kv_rank = 12, .value_dim = 8};
  EXPECT_FALSE(SignatureOf(plain).has_latent());
  EXPECT_TRUE(CheckModelMatches(SignatureOf(latent), latent).ok());
  EXPECT_THAT(CheckModelMatches(SignatureOf(latent), plain).message(),
              HasSubstr("model.latent_attention is {q_rank: 24, kv_rank: 12, value_dim: 8} with "
                        "rope_dim 4 in the checkpoint, none in the spec"));
  config::ModelConfig other = latent;
  other.latent.value_dim = 12;
  EXPECT_THAT(CheckModelMatches(SignatureOf(latent), other).message(),
              HasSubstr("model.latent_attention"));
  other = latent;
  other.rope_dim = 8;  // the shared rotary key and each head's other part change size
  EXPECT_THAT(CheckModelMatches(SignatureOf(latent), other).message(),
              HasSubstr("with rope_dim 4 in the checkpoint"));
  absl::StatusOr<config::ModelConfig> read = ModelFromSignature(SignatureOf(latent));
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->latent.q_rank, 24);
  EXPECT_EQ(read->latent.kv_rank, 12);
  EXPECT_EQ(read->latent.value_dim, 8);
  EXPECT_EQ(read->latent.norm_eps, 1e-6f);
  EXPECT_FALSE(ModelFromSignature(SignatureOf(plain))->latent.enabled());
  // The latents' epsilon travels; written before it did, their norms took the model's.
  other = latent;
  other.latent.norm_eps = 0.25f;
  EXPECT_EQ(ModelFromSignature(SignatureOf(other))->latent.norm_eps, 0.25f);
  ModelSignature older = SignatureOf(latent);
  older.mutable_latent()->clear_norm_eps();
  EXPECT_EQ(ModelFromSignature(older)->latent.norm_eps, latent.norm_eps);
}

TEST(CheckpointFormatTest, OnlyMoeManifestsCarryAnMoeSignature) {
  // A dense model's manifest has no moe member, as before MoE existed.
  EXPECT_THAT(SerializeManifest(SomeManifest()), Not(HasSubstr("moe")));
  Manifest manifest = SomeManifest();
  config::ModelConfig moe = MoeModel();
  moe.moe.balance = config::MoeBalance::kBias;
  *manifest.mutable_model() = SignatureOf(moe);
  FakeFileSystem fs;
  ASSERT_TRUE(fs.CreateDirs("ck/step-00000007-aa").ok());
  const std::string json = SerializeManifest(manifest);
  EXPECT_THAT(json, HasSubstr("\"router_bias\": true"));
  ASSERT_TRUE(fs.WriteFileAtomic("ck/step-00000007-aa/manifest.json", json).ok());
  absl::StatusOr<Manifest> read = ReadManifest(fs, "ck/step-00000007-aa");
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_TRUE(CheckModelMatches(read->model(), moe).ok());
  EXPECT_EQ(read->model().moe().experts(), 4);
}

}  // namespace
}  // namespace trainyard::worker::checkpoint
