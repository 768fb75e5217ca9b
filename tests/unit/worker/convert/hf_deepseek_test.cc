// DeepSeek-V3's Hugging Face layout (DeepseekV3ForCausalLM; Kimi K2's kimi_k2) and DeepSeek-V2's
// (DeepseekV2ForCausalLM): config.json read as a model with latent attention and DeepSeek's
// routing, the tensors mapped onto ours (each query head's rotary rows moved and de-interleaved),
// written back the same, and what the layouts cannot hold refused by name.
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/convert/hf_format.h"

namespace trainyard::worker::convert {
namespace {

using config::ModelConfig;
using ::testing::HasSubstr;
using ::testing::Not;

// DeepSeek-V3's config.json as published (DeepSeek-R1's is the same model), its auto_map left
// out.
constexpr char kDeepseekV3Config[] = R"({
  "architectures": ["DeepseekV3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "aux_loss_alpha": 0.001, "bos_token_id": 0, "eos_token_id": 1, "ep_size": 1,
  "first_k_dense_replace": 3, "hidden_act": "silu", "hidden_size": 7168,
  "initializer_range": 0.02, "intermediate_size": 18432, "kv_lora_rank": 512,
  "max_position_embeddings": 163840, "model_type": "deepseek_v3", "moe_intermediate_size": 2048,
  "moe_layer_freq": 1, "n_group": 8, "n_routed_experts": 256, "n_shared_experts": 1,
  "norm_topk_prob": true, "num_attention_heads": 128, "num_experts_per_tok": 8,
  "num_hidden_layers": 61, "num_key_value_heads": 128, "num_nextn_predict_layers": 1,
  "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
  "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                          "weight_block_size": [128, 128]},
  "rms_norm_eps": 1e-06,
  "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
                   "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                   "type": "yarn"},
  "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "seq_aux": true,
  "tie_word_embeddings": false, "topk_group": 4, "topk_method": "noaux_tc",
  "torch_dtype": "bfloat16", "transformers_version": "4.33.1", "use_cache": true,
  "v_head_dim": 128, "vocab_size": 129280})";

// `json` with the first `from` replaced by `to`.
std::string Edited(std::string json, const std::string& from, const std::string& to) {
  const size_t at = json.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos) json.replace(at, from.size(), to);
  return json;
}

// Each Hugging Face tensor's shape, and the name of ours it is a piece of.
struct StoredTensors {
  std::map<std::string, std::vector<int64_t>> shapes;
  std::map<std::string, std::string> ours;
  std::map<std::string, HfPiece> pieces;
};
StoredTensors Stored(const std::vector<HfTensorMap>& tensors) {
  StoredTensors out;
  for (const HfTensorMap& t : tensors) {
    for (const HfPiece& piece : t.pieces) {
      out.shapes[piece.name] = HfShape(t, piece);
      out.ours[piece.name] = t.name;
      out.pieces[piece.name] = piece;
    }
  }
  return out;
}

// The fields a DeepSeek config.json decides, equal in `a` and `b`.
void ExpectSameModel(const ModelConfig& a, const ModelConfig& b) {
  EXPECT_EQ(a.ParameterCount(), b.ParameterCount());
  EXPECT_EQ(a.head_dim(), b.head_dim());
  EXPECT_EQ(a.rope_dim, b.rope_dim);
  EXPECT_EQ(a.latent.q_rank, b.latent.q_rank);
  EXPECT_EQ(a.latent.kv_rank, b.latent.kv_rank);
  EXPECT_EQ(a.latent.value_dim, b.latent.value_dim);
  EXPECT_EQ(a.latent.norm_eps, b.latent.norm_eps);
  EXPECT_EQ(a.norm_eps, b.norm_eps);
  EXPECT_EQ(a.rope_theta, b.rope_theta);
  EXPECT_TRUE(a.rope_scaling == b.rope_scaling);
  EXPECT_EQ(a.attention_multiplier, b.attention_multiplier);
  EXPECT_EQ(a.max_seq, b.max_seq);
  EXPECT_EQ(a.moe.enabled(), b.moe.enabled());
  EXPECT_EQ(a.moe.experts, b.moe.experts);
  EXPECT_EQ(a.moe.top_k, b.moe.top_k);
  EXPECT_EQ(a.moe.dense_first, b.moe.dense_first);
  EXPECT_EQ(a.moe.shared_experts, b.moe.shared_experts);
  EXPECT_EQ(a.moe.routed_scale, b.moe.routed_scale);
  EXPECT_EQ(a.moe.groups, b.moe.groups);
  EXPECT_EQ(a.moe.group_top_k, b.moe.group_top_k);
  EXPECT_EQ(a.moe.group_score, b.moe.group_score);
  EXPECT_EQ(a.moe.normalize_top_k, b.moe.normalize_top_k);
  EXPECT_EQ(a.moe.has_bias(), b.moe.has_bias());
}

TEST(HfDeepseek, DeepseekV3ConfigReadsAsLatentAttentionOverDeepSeekRouting) {
  HfLayout layout;
  auto m = ModelFromHfConfig(kDeepseekV3Config, "DeepSeek-V3/config.json", &layout);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(layout.experts, HfExperts::kGlm4Moe);  // GLM-4.5's names are DeepSeek-V3's
  EXPECT_EQ(layout.projections, HfProjections::kSeparate);
  EXPECT_TRUE(layout.interleaved_rope);      // rope_interleave's default
  EXPECT_EQ(layout.unread_layers_from, 61);  // the multi-token prediction layer after
  EXPECT_EQ(m->kv_heads, 128);
  EXPECT_EQ(m->head_dim(), 192);
  EXPECT_EQ(m->rope_dim, 64);
  EXPECT_EQ(m->value_head_dim(), 128);
  EXPECT_EQ(m->latent.q_rank, 1536);
  EXPECT_EQ(m->latent.kv_rank, 512);
  EXPECT_EQ(m->latent.norm_eps, 1e-6f);
  EXPECT_EQ(m->norm_eps, 1e-6f);
  EXPECT_FALSE(m->tied_embeddings);
  // YaRN over the original 4096 positions, 40 times longer; mscale over mscale_all_dim leaves the
  // cosines alone, and the scores grow by the square of YaRN's scale for mscale_all_dim 1.
  EXPECT_TRUE(m->rope_scaling.yarn);
  EXPECT_EQ(m->rope_scaling.factor, 40.0f);
  EXPECT_EQ(m->rope_scaling.original_max_seq, 4096);
  EXPECT_EQ(m->rope_scaling.attention_factor, 1.0f);
  EXPECT_EQ(m->max_seq, 163840);
  const double mscale = 0.1 * std::log(40.0) + 1.0;
  EXPECT_FLOAT_EQ(m->attention_multiplier, mscale * mscale / std::sqrt(192.0));
  const config::MoeConfig& moe = m->moe;
  EXPECT_EQ(moe.experts, 256);
  EXPECT_EQ(moe.top_k, 8);
  EXPECT_EQ(moe.ffn, 2048);
  EXPECT_EQ(moe.shared_experts, 1);
  EXPECT_EQ(moe.dense_first, 3);
  EXPECT_EQ(moe.every, 1);
  EXPECT_EQ(moe.groups, 8);
  EXPECT_EQ(moe.kept_groups(), 4);
  EXPECT_EQ(moe.routed_scale, 2.5f);
  EXPECT_EQ(moe.score, config::MoeScore::kSigmoid);
  EXPECT_TRUE(moe.has_bias() && moe.normalize_top_k);
  // By hand: per block the query latent, its norm and q_b, kv_a with the rotary key, its norm,
  // kv_b, o_proj and two norms; three dense MLPs of 18432, then 58 blocks of a router, 256 experts
  // and one shared of 2048; the untied embedding and head and the final norm: the card's 671B
  // (its 685B count the multi-token prediction layer too).
  const int64_t c = 7168;
  const int64_t attention = 1536 * c + 1536 + int64_t{128} * 192 * 1536 + (512 + 64) * c + 512 +
                            int64_t{128} * 256 * 512 + c * 128 * 128 + 2 * c;
  const int64_t expert = 3 * int64_t{2048} * c;
  const int64_t dense = attention + 3 * int64_t{18432} * c;
  const int64_t sparse = attention + 256 * c + 256 * expert + expert;
  EXPECT_EQ(m->ParameterCount(), 3 * dense + 58 * sparse + 2 * int64_t{129280} * c + c);
  EXPECT_EQ(m->ParameterCount() / 1'000'000'000, 671);

  absl::StatusOr<std::vector<HfTensorMap>> tensors = HfTensors(*m, layout);
  ASSERT_TRUE(tensors.ok()) << tensors.status();
  StoredTensors stored = Stored(*tensors);
  const std::string a = "model.layers.60.self_attn.";
  EXPECT_EQ(stored.shapes[a + "q_a_proj.weight"], (std::vector<int64_t>{1536, c}));
  EXPECT_EQ(stored.shapes[a + "q_a_layernorm.weight"], (std::vector<int64_t>{1536}));
  EXPECT_EQ(stored.shapes[a + "q_b_proj.weight"], (std::vector<int64_t>{128 * 192, 1536}));
  EXPECT_EQ(stored.shapes[a + "kv_a_proj_with_mqa.weight"], (std::vector<int64_t>{576, c}));
  EXPECT_EQ(stored.shapes[a + "kv_a_layernorm.weight"], (std::vector<int64_t>{512}));
  EXPECT_EQ(stored.shapes[a + "kv_b_proj.weight"], (std::vector<int64_t>{128 * 256, 512}));
  EXPECT_EQ(stored.shapes[a + "o_proj.weight"], (std::vector<int64_t>{c, 128 * 128}));
  EXPECT_EQ(stored.ours[a + "q_b_proj.weight"], "h.60.attn.q_b.w");
  EXPECT_EQ(stored.ours[a + "kv_a_proj_with_mqa.weight"], "h.60.attn.kv_a.w");
  EXPECT_EQ(stored.ours["model.layers.60.mlp.gate.e_score_correction_bias"],
            "h.60.moe.router.bias");
  EXPECT_EQ(stored.shapes["model.layers.2.mlp.gate_proj.weight"], (std::vector<int64_t>{18432, c}));
  EXPECT_FALSE(stored.shapes.contains("model.layers.0.self_attn.q_proj.weight"));
  // Query head 5's rows: its 128 other rows first in theirs, then its rotary ones in pairs.
  const HfPiece& q_b = stored.pieces[a + "q_b_proj.weight"];
  EXPECT_EQ(TheirRow(q_b, 5 * 192 + 0), 5 * 192 + 128);    // our rotary row 0: their pair 0's first
  EXPECT_EQ(TheirRow(q_b, 5 * 192 + 32), 5 * 192 + 129);   // our row r/2: that pair's second
  EXPECT_EQ(TheirRow(q_b, 5 * 192 + 1), 5 * 192 + 130);    // row 1: pair 1's first
  EXPECT_EQ(TheirRow(q_b, 5 * 192 + 64), 5 * 192 + 0);     // the first other row
  EXPECT_EQ(TheirRow(q_b, 5 * 192 + 191), 5 * 192 + 127);  // the last other row
  // kv_a_proj_with_mqa: the latent's rows in place, the rotary key's after it in pairs.
  const HfPiece& kv_a = stored.pieces[a + "kv_a_proj_with_mqa.weight"];
  EXPECT_EQ(TheirRow(kv_a, 511), 511);
  EXPECT_EQ(TheirRow(kv_a, 512), 512);
  EXPECT_EQ(TheirRow(kv_a, 513), 514);
  EXPECT_EQ(TheirRow(kv_a, 512 + 32), 513);
  EXPECT_EQ(TheirRow(kv_a, 575), 575);
  const config::ModelFamily llama = config::ModelFamily::kLlama;
  EXPECT_EQ(HfLookupName("model.layers.61.eh_proj.weight", llama, layout), std::nullopt);
  EXPECT_EQ(HfLookupName("model.layers.61.self_attn.kv_b_proj.weight", llama, layout),
            std::nullopt);

  // Written back: DeepSeek-V3's config, YaRN's mscale and mscale_all_dim as published, no
  // head_dim (transformers would take it as the rotary part), which reads as the same model.
  ASSERT_TRUE(CheckHfWritable(*m).ok()) << CheckHfWritable(*m);
  EXPECT_EQ(HfExportLayout(*m).experts, HfExperts::kGlm4Moe);
  EXPECT_TRUE(HfExportLayout(*m).interleaved_rope);
  const std::string written = HfConfigJson(*m, TensorDtype::kBF16);
  EXPECT_THAT(written, HasSubstr("\"architectures\": [\"DeepseekV3ForCausalLM\"]"));
  EXPECT_THAT(written, HasSubstr("\"mscale\": 1, \"mscale_all_dim\": 1}"));
  EXPECT_THAT(written, HasSubstr("\"q_lora_rank\": 1536"));
  EXPECT_THAT(written, HasSubstr("\"n_group\": 8,\n  \"topk_group\": 4"));
  EXPECT_THAT(written, HasSubstr("\"rope_interleave\": true"));
  EXPECT_THAT(written, Not(HasSubstr("head_dim\": 192")));
  HfLayout back_layout;
  auto back = ModelFromHfConfig(written, "out/config.json", &back_layout);
  ASSERT_TRUE(back.ok()) << back.status() << "\n" << written;
  ExpectSameModel(*back, *m);
  EXPECT_TRUE(back_layout.interleaved_rope);
}

// transformers writes DeepSeek's configs with head_dim as qk_rope_head_dim (its RoPE's width) and
// RoPE as rope_parameters (transformers 5); both read as the published config does.
TEST(HfDeepseek, TransformersWrittenFieldsReadTheSame) {
  auto published = ModelFromHfConfig(kDeepseekV3Config, "a/config.json");
  ASSERT_TRUE(published.ok()) << published.status();
  auto with_head_dim = ModelFromHfConfig(
      Edited(kDeepseekV3Config, "\"v_head_dim\": 128", "\"v_head_dim\": 128, \"head_dim\": 64"),
      "b/config.json");
  ASSERT_TRUE(with_head_dim.ok()) << with_head_dim.status();
  ExpectSameModel(*with_head_dim, *published);
  auto wrong = ModelFromHfConfig(
      Edited(kDeepseekV3Config, "\"v_head_dim\": 128", "\"v_head_dim\": 128, \"head_dim\": 192"),
      "c/config.json");
  ASSERT_FALSE(wrong.ok());
  EXPECT_THAT(wrong.status().message(), HasSubstr("c/config.json: head_dim is 192"));
}

// Moonlight's shape (DeepseekV3ForCausalLM): queries from the input (q_lora_rank null), plain
// RoPE, no expert groups, 64 experts of which 6 per token beside 2 shared, the model's norms at
// 1e-5 and the latents' at DeepSeek's 1e-6.
TEST(HfDeepseek, QueriesFromTheInputAndPlainRope) {
  std::string json = Edited(kDeepseekV3Config, "\"q_lora_rank\": 1536", "\"q_lora_rank\": null");
  json = Edited(json, "\"rms_norm_eps\": 1e-06", "\"rms_norm_eps\": 1e-05");
  json = Edited(json, "\"n_group\": 8", "\"n_group\": 1");
  json = Edited(json, "\"topk_group\": 4", "\"topk_group\": 1");
  json = Edited(json, "\"n_routed_experts\": 256", "\"n_routed_experts\": 64");
  json = Edited(json, "\"num_experts_per_tok\": 8", "\"num_experts_per_tok\": 6");
  json = Edited(json, "\"n_shared_experts\": 1", "\"n_shared_experts\": 2");
  json = Edited(json, "\"routed_scaling_factor\": 2.5", "\"routed_scaling_factor\": 2.446");
  const size_t from = json.find("\"rope_scaling\": {"), to = json.find('}', from);
  json.replace(from, to + 1 - from, "\"rope_scaling\": null");
  HfLayout layout;
  auto m = ModelFromHfConfig(json, "Moonlight/config.json", &layout);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->latent.q_rank, 0);
  EXPECT_EQ(m->norm_eps, 1e-5f);
  EXPECT_EQ(m->latent.norm_eps, 1e-6f);
  EXPECT_FALSE(m->rope_scaling.enabled());
  EXPECT_EQ(m->attention_multiplier, 0.0f);  // head_dim^-1/2
  EXPECT_FALSE(m->moe.limits_groups());
  EXPECT_EQ(m->moe.routed_scale, 2.446f);
  absl::StatusOr<std::vector<HfTensorMap>> tensors = HfTensors(*m, layout);
  ASSERT_TRUE(tensors.ok()) << tensors.status();
  StoredTensors stored = Stored(*tensors);
  EXPECT_EQ(stored.shapes["model.layers.0.self_attn.q_proj.weight"],
            (std::vector<int64_t>{128 * 192, 7168}));
  EXPECT_EQ(stored.ours["model.layers.0.self_attn.q_proj.weight"], "h.0.attn.q.w");
  EXPECT_FALSE(stored.shapes.contains("model.layers.0.self_attn.q_a_proj.weight"));
  const std::string written = HfConfigJson(*m, TensorDtype::kBF16);
  EXPECT_THAT(written, HasSubstr("\"q_lora_rank\": null"));
  EXPECT_THAT(written, HasSubstr("\"rope_scaling\": null"));
  auto back = ModelFromHfConfig(written, "out/config.json");
  ASSERT_TRUE(back.ok()) << back.status() << "\n" << written;
  ExpectSameModel(*back, *m);

  // rope_interleave false: the rotary rows moved, not paired.
  auto halves = ModelFromHfConfig(
      Edited(json, "\"v_head_dim\"", "\"rope_interleave\": false, \"v_head_dim\""),
      "halves/config.json", &layout);
  ASSERT_TRUE(halves.ok()) << halves.status();
  EXPECT_FALSE(layout.interleaved_rope);
  stored = Stored(*HfTensors(*halves, layout));
  const HfPiece& q = stored.pieces["model.layers.0.self_attn.q_proj.weight"];
  EXPECT_EQ(TheirRow(q, 192 + 1), 192 + 129);
  EXPECT_EQ(TheirRow(q, 192 + 32), 192 + 160);
}

// Kimi K2's shape (model_type kimi_k2 under DeepSeek-V3's code): 64 heads, 384 experts, one dense
// block, a vocabulary of 163840, and YaRN 64 times longer at base 50000 with both betas 1 (one
// pair index between the pairs that keep their rate and those slowed).
TEST(HfDeepseek, KimiK2ReadsAsDeepseekV3) {
  std::string json = Edited(kDeepseekV3Config, "\"deepseek_v3\"", "\"kimi_k2\"");
  json = Edited(json, "\"num_attention_heads\": 128", "\"num_attention_heads\": 64");
  json = Edited(json, "\"num_key_value_heads\": 128", "\"num_key_value_heads\": 64");
  json = Edited(json, "\"n_routed_experts\": 256", "\"n_routed_experts\": 384");
  json = Edited(json, "\"first_k_dense_replace\": 3", "\"first_k_dense_replace\": 1");
  json = Edited(json, "\"n_group\": 8", "\"n_group\": 1");
  json = Edited(json, "\"topk_group\": 4", "\"topk_group\": 1");
  json = Edited(json, "\"beta_fast\": 32", "\"beta_fast\": 1.0");
  json = Edited(json, "\"factor\": 40", "\"factor\": 64");
  json = Edited(json, "\"max_position_embeddings\": 163840", "\"max_position_embeddings\": 262144");
  json = Edited(json, "\"vocab_size\": 129280", "\"vocab_size\": 163840");
  json = Edited(json, "\"rope_theta\": 10000", "\"rope_theta\": 50000.0");
  HfLayout layout;
  auto m = ModelFromHfConfig(json, "Kimi-K2/config.json", &layout);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(layout.model_type, "kimi_k2");
  EXPECT_EQ(layout.unread_layers_from, 61);
  EXPECT_TRUE(layout.interleaved_rope);
  EXPECT_EQ(m->heads, 64);
  EXPECT_EQ(m->moe.experts, 384);
  EXPECT_EQ(m->rope_scaling.beta_fast, m->rope_scaling.beta_slow);
  const double mscale = 0.1 * std::log(64.0) + 1.0;
  EXPECT_FLOAT_EQ(m->attention_multiplier, mscale * mscale / std::sqrt(192.0));
  EXPECT_EQ(m->ParameterCount() / 1'000'000'000, 1026);  // the card's "1T"
  const std::string written = HfConfigJson(*m, TensorDtype::kBF16);
  auto back = ModelFromHfConfig(written, "out/config.json");
  ASSERT_TRUE(back.ok()) << back.status() << "\n" << written;
  ExpectSameModel(*back, *m);
}

// A config without experts (n_routed_experts null, or every block dense) is a dense model with
// latent attention, written back with null experts.
TEST(HfDeepseek, NullExpertsReadAsADenseModel) {
  for (const auto& [from, to] :
       {std::pair{"\"n_routed_experts\": 256", "\"n_routed_experts\": null"},
        std::pair{"\"first_k_dense_replace\": 3", "\"first_k_dense_replace\": 61"}}) {
    auto m = ModelFromHfConfig(Edited(kDeepseekV3Config, from, to), "dense/config.json");
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_FALSE(m->moe.enabled()) << to;
    EXPECT_EQ(m->ffn_hidden, 18432);
    const std::string written = HfConfigJson(*m, TensorDtype::kF32);
    EXPECT_THAT(written, HasSubstr("\"n_routed_experts\": null"));
    auto back = ModelFromHfConfig(written, "out/config.json");
    ASSERT_TRUE(back.ok()) << back.status() << "\n" << written;
    ExpectSameModel(*back, *m);
  }
}

// Scores scaled by a multiplier that YaRN's mscale_all_dim does not give exactly in one decimal,
// and an attention factor other than 1: both written with the digits that give them back.
TEST(HfDeepseek, YarnScalesWriteWithTheDigitsThatReadBack) {
  auto m = ModelFromHfConfig(kDeepseekV3Config, "a/config.json");
  ASSERT_TRUE(m.ok()) << m.status();
  m->attention_multiplier = 0.123456f;
  m->rope_scaling.attention_factor = 1.0625f;
  ASSERT_TRUE(CheckHfWritable(*m).ok()) << CheckHfWritable(*m);
  const std::string written = HfConfigJson(*m, TensorDtype::kBF16);
  auto back = ModelFromHfConfig(written, "out/config.json");
  ASSERT_TRUE(back.ok()) << back.status() << "\n" << written;
  EXPECT_EQ(back->attention_multiplier, 0.123456f) << written;
  EXPECT_EQ(back->rope_scaling.attention_factor, 1.0625f) << written;
  // Without attention_factor (DeepSeek's own code reads mscale over mscale_all_dim), the same.
  const size_t at = written.find(", \"attention_factor\": ");
  ASSERT_NE(at, std::string::npos) << written;
  std::string without = written;
  without.erase(at, written.find(',', at + 2) - at);
  auto derived = ModelFromHfConfig(without, "out/config.json");
  ASSERT_TRUE(derived.ok()) << derived.status() << "\n" << without;
  EXPECT_EQ(derived->rope_scaling.attention_factor, 1.0625f) << without;
}

// DeepSeek-V2-Lite's config.json as published (DeepSeek-Coder-V2-Lite's differs in sizes), its
// auto_map left out.
constexpr char kDeepseekV2LiteConfig[] = R"({
  "architectures": ["DeepseekV2ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "aux_loss_alpha": 0.001, "bos_token_id": 100000, "eos_token_id": 100001,
  "first_k_dense_replace": 1, "hidden_act": "silu", "hidden_size": 2048,
  "initializer_range": 0.02, "intermediate_size": 10944, "kv_lora_rank": 512,
  "max_position_embeddings": 163840, "model_type": "deepseek_v2", "moe_intermediate_size": 1408,
  "moe_layer_freq": 1, "n_group": 1, "n_routed_experts": 64, "n_shared_experts": 2,
  "norm_topk_prob": false, "num_attention_heads": 16, "num_experts_per_tok": 6,
  "num_hidden_layers": 27, "num_key_value_heads": 16, "pretraining_tp": 1, "q_lora_rank": null,
  "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06,
  "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 0.707,
                   "mscale_all_dim": 0.707, "original_max_position_embeddings": 4096,
                   "type": "yarn"},
  "rope_theta": 10000, "routed_scaling_factor": 1.0, "scoring_func": "softmax", "seq_aux": true,
  "tie_word_embeddings": false, "topk_group": 1, "topk_method": "greedy",
  "torch_dtype": "bfloat16", "transformers_version": "4.33.1", "use_cache": true,
  "v_head_dim": 128, "vocab_size": 102400})";

TEST(HfDeepseek, DeepseekV2LiteReadsAsSoftmaxRoutingWithoutABias) {
  HfLayout layout;
  auto m = ModelFromHfConfig(kDeepseekV2LiteConfig, "DeepSeek-V2-Lite/config.json", &layout);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(layout.experts, HfExperts::kDeepseekV2);
  EXPECT_TRUE(layout.interleaved_rope);
  EXPECT_EQ(m->latent.q_rank, 0);
  EXPECT_EQ(m->latent.kv_rank, 512);
  EXPECT_EQ(m->head_dim(), 192);
  EXPECT_EQ(m->rope_scaling.attention_factor, 1.0f);  // mscale over an equal mscale_all_dim
  const double mscale = 0.1 * 0.707 * std::log(40.0) + 1.0;
  EXPECT_FLOAT_EQ(m->attention_multiplier, mscale * mscale / std::sqrt(192.0));
  const config::MoeConfig& moe = m->moe;
  EXPECT_EQ(moe.score, config::MoeScore::kSoftmax);
  EXPECT_FALSE(moe.has_bias() || moe.normalize_top_k || moe.limits_groups());
  EXPECT_EQ(moe.experts, 64);
  EXPECT_EQ(moe.top_k, 6);
  EXPECT_EQ(moe.ffn, 1408);
  EXPECT_EQ(moe.shared_experts, 2);
  EXPECT_EQ(moe.dense_first, 1);
  EXPECT_EQ(moe.routed_scale, 1.0f);
  // By hand: q_proj, kv_a with the rotary key, its norm, kv_b, o_proj and two norms per block;
  // one dense MLP of 10944, then 26 blocks of a router, 64 experts and two shared of 1408; the
  // untied embedding and head and the final norm: the card's 15.7B.
  const int64_t c = 2048;
  const int64_t attention =
      int64_t{16} * 192 * c + 576 * c + 512 + int64_t{16} * 256 * 512 + c * 16 * 128 + 2 * c;
  const int64_t expert = 3 * int64_t{1408} * c;
  const int64_t sparse = attention + 64 * c + 66 * expert;
  EXPECT_EQ(m->ParameterCount(),
            attention + 3 * int64_t{10944} * c + 26 * sparse + 2 * int64_t{102400} * c + c);
  EXPECT_EQ(m->ParameterCount() / 100'000'000, 157);
  absl::StatusOr<std::vector<HfTensorMap>> tensors = HfTensors(*m, layout);
  ASSERT_TRUE(tensors.ok()) << tensors.status();
  StoredTensors stored = Stored(*tensors);
  EXPECT_EQ(stored.shapes["model.layers.26.mlp.gate.weight"], (std::vector<int64_t>{64, c}));
  EXPECT_FALSE(stored.shapes.contains("model.layers.26.mlp.gate.e_score_correction_bias"));
  EXPECT_EQ(stored.shapes["model.layers.26.mlp.shared_experts.up_proj.weight"],
            (std::vector<int64_t>{2816, c}));
  const HfPiece& q = stored.pieces["model.layers.3.self_attn.q_proj.weight"];
  EXPECT_EQ(TheirRow(q, 1), 130);  // the rotary rows last, in neighbouring pairs
  // Written back: DeepSeek-V2's config (its RoPE always in pairs: no rope_interleave).
  ASSERT_TRUE(CheckHfWritable(*m).ok()) << CheckHfWritable(*m);
  EXPECT_EQ(HfExportLayout(*m).experts, HfExperts::kDeepseekV2);
  const std::string written = HfConfigJson(*m, TensorDtype::kBF16);
  EXPECT_THAT(written, HasSubstr("\"architectures\": [\"DeepseekV2ForCausalLM\"]"));
  EXPECT_THAT(written, HasSubstr("\"scoring_func\": \"softmax\",\n  \"topk_method\": \"greedy\""));
  EXPECT_THAT(written, HasSubstr("\"mscale\": 0.707, \"mscale_all_dim\": 0.707}"));
  EXPECT_THAT(written, Not(HasSubstr("rope_interleave")));
  HfLayout back_layout;
  auto back = ModelFromHfConfig(written, "out/config.json", &back_layout);
  ASSERT_TRUE(back.ok()) << back.status() << "\n" << written;
  ExpectSameModel(*back, *m);
  EXPECT_EQ(back_layout.experts, HfExperts::kDeepseekV2);
  // Without n_routed_experts (the class's default), every block is dense.
  auto dense = ModelFromHfConfig(Edited(kDeepseekV2LiteConfig, "\"n_routed_experts\": 64,", ""),
                                 "dense/config.json");
  ASSERT_TRUE(dense.ok()) << dense.status();
  EXPECT_FALSE(dense->moe.enabled());
}

// DeepSeek-V2's config.json as published (236B; DeepSeek-V2.5's and DeepSeek-Coder-V2's have the
// same shape and routing), its auto_map left out.
constexpr char kDeepseekV2Config[] = R"({
  "architectures": ["DeepseekV2ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "aux_loss_alpha": 0.001, "bos_token_id": 100000, "eos_token_id": 100001, "ep_size": 1,
  "first_k_dense_replace": 1, "hidden_act": "silu", "hidden_size": 5120,
  "initializer_range": 0.02, "intermediate_size": 12288, "kv_lora_rank": 512,
  "max_position_embeddings": 163840, "model_type": "deepseek_v2", "moe_intermediate_size": 1536,
  "moe_layer_freq": 1, "n_group": 8, "n_routed_experts": 160, "n_shared_experts": 2,
  "norm_topk_prob": false, "num_attention_heads": 128, "num_experts_per_tok": 6,
  "num_hidden_layers": 60, "num_key_value_heads": 128, "pretraining_tp": 1, "q_lora_rank": 1536,
  "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06,
  "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 0.707,
                   "mscale_all_dim": 0.707, "original_max_position_embeddings": 4096,
                   "type": "yarn"},
  "rope_theta": 10000, "routed_scaling_factor": 16.0, "scoring_func": "softmax", "seq_aux": true,
  "tie_word_embeddings": false, "topk_group": 3, "topk_method": "group_limited_greedy",
  "torch_dtype": "bfloat16", "transformers_version": "4.39.3", "use_cache": true,
  "v_head_dim": 128, "vocab_size": 102400})";

// DeepSeek-V2's group-limited routing: each token's 6 picks from the 3 of 8 groups of 20 experts
// whose best probability is highest (model.moe.group_score max), weighed times 16. Written back as
// group_limited_greedy, which reads as the same model.
TEST(HfDeepseek, DeepseekV2ReadsAsGroupsScoredByTheirBestProbability) {
  HfLayout layout;
  auto m = ModelFromHfConfig(kDeepseekV2Config, "DeepSeek-V2/config.json", &layout);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(layout.experts, HfExperts::kDeepseekV2);
  EXPECT_EQ(m->latent.q_rank, 1536);
  const config::MoeConfig& moe = m->moe;
  EXPECT_EQ(moe.score, config::MoeScore::kSoftmax);
  EXPECT_EQ(moe.groups, 8);
  EXPECT_EQ(moe.group_top_k, 3);
  EXPECT_EQ(moe.group_score, config::GroupScore::kMax);
  EXPECT_EQ(moe.routed_scale, 16.0f);
  EXPECT_EQ(moe.experts, 160);
  // By hand: q_a, its norm, q_b, kv_a, its norm, kv_b, o_proj and two norms per block; one dense
  // MLP of 12288, then 59 blocks of a router, 160 experts and two shared of 1536; the untied
  // embedding and head and the final norm: the card's 236B.
  const int64_t c = 5120;
  const int64_t attention = 1536 * c + 1536 + int64_t{128} * 192 * 1536 + 576 * c + 512 +
                            int64_t{128} * 256 * 512 + c * 128 * 128 + 2 * c;
  const int64_t sparse = attention + 160 * c + 162 * (3 * int64_t{1536} * c);
  EXPECT_EQ(m->ParameterCount(),
            attention + 3 * int64_t{12288} * c + 59 * sparse + 2 * int64_t{102400} * c + c);
  EXPECT_EQ(m->ParameterCount() / 1'000'000'000, 235);
  ASSERT_TRUE(CheckHfWritable(*m).ok()) << CheckHfWritable(*m);
  const std::string written = HfConfigJson(*m, TensorDtype::kBF16);
  EXPECT_THAT(written, HasSubstr("\"n_group\": 8,\n  \"topk_group\": 3"));
  EXPECT_THAT(written, HasSubstr("\"topk_method\": \"group_limited_greedy\""));
  auto back = ModelFromHfConfig(written, "out/config.json");
  ASSERT_TRUE(back.ok()) << back.status() << "\n" << written;
  ExpectSameModel(*back, *m);
  // Greedy routing reads no groups, whatever n_group and topk_group say.
  auto greedy =
      ModelFromHfConfig(Edited(kDeepseekV2Config, "\"topk_method\": \"group_limited_greedy\"",
                               "\"topk_method\": \"greedy\""),
                        "greedy/config.json");
  ASSERT_TRUE(greedy.ok()) << greedy.status();
  EXPECT_FALSE(greedy->moe.limits_groups());
  // DeepSeek-V3's layout scores groups by their two best: a V3 model with groups scored by their
  // best is refused by name.
  config::ModelConfig v3 = *m;
  v3.moe.score = config::MoeScore::kSigmoid;
  v3.moe.balance = config::MoeBalance::kBias;
  v3.moe.normalize_top_k = true;
  EXPECT_THAT(CheckHfWritable(v3).message(),
              HasSubstr("model.moe.group_score: is max with sigmoid"));
}

// DeepSeek-V2's own routing choices Trainyard does not make are refused by name: picks
// normalised, sigmoid scores, groups that do not divide the experts.
TEST(HfDeepseek, DeepseekV2RoutingItCannotHoldIsRefused) {
  struct Case {
    std::vector<std::pair<std::string, std::string>> edits;
    const char* why;
  };
  for (const Case& c : std::vector<Case>{
           {{{"\"topk_method\": \"greedy\"", "\"topk_method\": \"group_limited_greedy\""},
             {"\"n_group\": 1", "\"n_group\": 5"},
             {"\"topk_group\": 1", "\"topk_group\": 3"}},
            "n_group is 5, which does not divide the 64 experts"},
           {{{"\"norm_topk_prob\": false", "\"norm_topk_prob\": true"}},
            "norm_topk_prob must be false"},
           {{{"\"scoring_func\": \"softmax\"", "\"scoring_func\": \"sigmoid\""}},
            "scoring_func must be \"softmax\""},
           {{{"\"topk_method\": \"greedy\"", "\"topk_method\": \"noaux_tc\""}},
            "topk_method must be \"greedy\" or \"group_limited_greedy\""},
       }) {
    std::string json = kDeepseekV2LiteConfig;
    for (const auto& [from, to] : c.edits) json = Edited(json, from, to);
    auto m = ModelFromHfConfig(json, "v2/config.json");
    ASSERT_FALSE(m.ok()) << c.why;
    EXPECT_THAT(m.status().message(), HasSubstr(c.why)) << m.status();
  }
  // Keeping every group is the greedy routing.
  std::string kept = Edited(kDeepseekV2LiteConfig, "\"topk_method\": \"greedy\"",
                            "\"topk_method\": \"group_limited_greedy\"");
  kept = Edited(Edited(kept, "\"n_group\": 1", "\"n_group\": 8"), "\"topk_group\": 1",
                "\"topk_group\": 8");
  auto every = ModelFromHfConfig(kept, "v2/config.json");
  ASSERT_TRUE(every.ok()) << every.status();
  EXPECT_FALSE(every->moe.limits_groups());
}

TEST(HfDeepseek, ConfigsItCannotHoldAreRefusedByName) {
  struct Case {
    const char *from, *to, *why;
  };
  for (const Case& c : std::vector<Case>{
           {"\"num_key_value_heads\": 128", "\"num_key_value_heads\": 8",
            "num_key_value_heads is 8; latent attention decompresses"},
           {"\"scoring_func\": \"sigmoid\"", "\"scoring_func\": \"softmax\"",
            "scoring_func must be \"sigmoid\""},
           {"\"topk_method\": \"noaux_tc\"", "\"topk_method\": \"group_limited_greedy\"",
            "topk_method must be \"noaux_tc\""},
           {"\"moe_layer_freq\": 1", "\"moe_layer_freq\": 2", "moe_layer_freq must be 1"},
           {"\"attention_bias\": false", "\"attention_bias\": true",
            "attention_bias must be false"},
           {"\"type\": \"yarn\"", "\"type\": \"linear\"",
            "gives mscale_all_dim to a RoPE other than yarn"},
       }) {
    auto m = ModelFromHfConfig(Edited(kDeepseekV3Config, c.from, c.to), "x/config.json");
    ASSERT_FALSE(m.ok()) << c.to;
    EXPECT_THAT(m.status().message(), HasSubstr(c.why)) << m.status();
    EXPECT_THAT(m.status().message(), HasSubstr("x/config.json")) << m.status();
  }
}

// What DeepSeek-V3's layout cannot hold is refused before anything is written, naming the field.
TEST(HfDeepseek, ModelsItCannotHoldAreNotWritten) {
  auto m = ModelFromHfConfig(kDeepseekV3Config, "a/config.json");
  ASSERT_TRUE(m.ok()) << m.status();
  struct Case {
    const char* why;
    void (*edit)(ModelConfig&);
  };
  for (const Case& c : std::vector<Case>{
           {"model.latent_attention.norm_eps: is 1e-05",
            [](ModelConfig& x) { x.latent.norm_eps = 1e-5f; }},
           {"model.moe.balance: is bias",  // softmax scores are V2's, which has no bias
            [](ModelConfig& x) { x.moe.score = config::MoeScore::kSoftmax; }},
           {"model.moe.normalize_top_k: is true with softmax",
            [](ModelConfig& x) {
              x.moe.score = config::MoeScore::kSoftmax;
              x.moe.balance = config::MoeBalance::kAuxLoss;
            }},
           {"model.moe.balance: is aux_loss",
            [](ModelConfig& x) { x.moe.balance = config::MoeBalance::kAuxLoss; }},
           {"model.sliding_window: is 4096", [](ModelConfig& x) { x.sliding_window = 4096; }},
           {"model.rope_scaling: is not yarn",
            [](ModelConfig& x) { x.rope_scaling = {.linear = true, .factor = 2.0f}; }},
           {"model.attention_multiplier: is 0.5, which no YaRN mscale_all_dim",
            [](ModelConfig& x) {
              x.rope_scaling = {};
              x.attention_multiplier = 0.5f;
            }},
       }) {
    ModelConfig edited = *m;
    c.edit(edited);
    const absl::Status writable = CheckHfWritable(edited);
    EXPECT_THAT(writable.message(), HasSubstr(c.why)) << writable;
    EXPECT_THAT(writable.message(), HasSubstr("DeepSeek-V3's and V2's layouts")) << writable;
    EXPECT_FALSE(HfTensors(edited).ok()) << c.why;
  }
}

}  // namespace
}  // namespace trainyard::worker::convert
