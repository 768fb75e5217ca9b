#include "worker/convert/hf_format.h"

#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>
#include <google/protobuf/util/message_differencer.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "common/status.h"
#include "worker/convert/hf_format_internal.h"

namespace trainyard::worker::convert {
namespace {

using config::ModelConfig;
using config::ModelFamily;
using google::protobuf::Value;

}  // namespace

// The shortest decimal that reads back as `value` in fp32 (1e-05, not 9.99999975e-06).
std::string ShortFloat(float value) {
  if (value == std::floor(value) && std::abs(value) < 1e9f) return absl::StrFormat("%.1f", value);
  return ShortestDecimal(
             value,
             [&](const std::string& text) { return std::strtof(text.c_str(), nullptr) == value; })
      .value_or(absl::StrFormat("%.9g", value));
}

namespace {

// out [cols, rows] = in [rows, cols]ᵀ, in cache-sized tiles.
void Transpose(const float* in, int64_t rows, int64_t cols, float* out) {
  // 16 x 16 tiles, each written a row of `out` at a time: contiguous stores, and the 16 rows of
  // `in` a tile reads stay in the L1 cache (6x faster than 64 x 64 tiles stored down columns).
  constexpr int64_t kTile = 16;
  for (int64_t r0 = 0; r0 < rows; r0 += kTile) {
    for (int64_t c0 = 0; c0 < cols; c0 += kTile) {
      const int64_t r1 = std::min(rows, r0 + kTile), c1 = std::min(cols, c0 + kTile);
      for (int64_t c = c0; c < c1; ++c) {
        for (int64_t r = r0; r < r1; ++r) out[c * rows + r] = in[r * cols + c];
      }
    }
  }
}

}  // namespace

HfTensorMap Whole(std::string ours, std::vector<int64_t> shape, std::string theirs,
                  bool transpose) {
  const int64_t rows = shape[0];
  return {std::move(ours), std::move(shape), {{std::move(theirs), 0, rows, transpose}}};
}

namespace {

// Gemma's layout: a Llama model with GeGLU and scaled embeddings (nothing else tells them apart).
bool IsGemma(const ModelConfig& m) {
  return m.family == ModelFamily::kLlama && m.geglu && m.scale_embeddings;
}

// GLM's layout: a Llama model with SwiGLU and norms both before and after each branch (Gemma 2's
// four, without Gemma's GeGLU and embeddings: GLM-4's, Glm4ForCausalLM), or, without the norms
// after, partial RoPE with biases on q, k and v, which Phi-3's layout cannot hold (GLM's,
// GlmForCausalLM).
bool IsGlm(const ModelConfig& m) {
  if (m.family != ModelFamily::kLlama || m.geglu || m.scale_embeddings || !m.pre_norms ||
      m.moe.enabled()) {
    return false;
  }
  return m.post_norms || (m.qkv_bias && m.rotary_dim() != m.head_dim());
}

// Gemma's GeGLU, scaled embeddings or scores, or Granite's multipliers.
bool HasGemmaOrGraniteOptions(const ModelConfig& m) {
  return m.geglu || m.scale_embeddings || m.attention_scale_dim != 0 || m.attention_softcap != 0 ||
         m.logit_softcap != 0 || m.HasGraniteMultipliers();
}

// EXAONE 4.0's layout: a Llama model whose blocks norm each branch's output only (OLMo 2's) with
// query and key norms over each head (OLMo's are over the whole projection), CheckExaone4Layout.
bool IsExaone4(const ModelConfig& m) {
  return m.family == ModelFamily::kLlama && !m.pre_norms && m.qk_norm && !m.NormsWholeProjection();
}

// ERNIE 4.5's MoE layout: a Llama MoE model with softmax scores picked with a selection bias
// (CheckErnieMoeLayout).
bool IsErnieMoe(const ModelConfig& m) {
  return m.family == ModelFamily::kLlama && m.moe.has_bias() &&
         m.moe.score == config::MoeScore::kSoftmax;
}

// MiniMax-M2's layout: a Llama MoE model with sigmoid scores and norms over the whole q and k
// (CheckMiniMaxM2Layout).
bool IsMiniMaxM2(const ModelConfig& m) {
  return m.family == ModelFamily::kLlama && m.moe.enabled() &&
         m.moe.score == config::MoeScore::kSigmoid && m.NormsWholeProjection();
}

// GLM-4.5's layout: a Llama MoE model routed as DeepSeek-V3 routes (sigmoid scores, dense first
// blocks, scaled weights or group-limited routing; a selection bias with softmax scores is
// ERNIE's, sigmoid scores with norms over the whole q and k MiniMax-M2's), which no other layout
// holds (CheckGlm4MoeLayout).
bool IsGlm4Moe(const ModelConfig& m) {
  const config::MoeConfig& moe = m.moe;
  return m.family == ModelFamily::kLlama && moe.enabled() && !IsErnieMoe(m) && !IsMiniMaxM2(m) &&
         (moe.score == config::MoeScore::kSigmoid || moe.dense_first > 0 ||
          moe.routed_scale != 1.0f || moe.limits_groups());
}

// Gemma 3's every k-th block attends to every position, the others to its sliding window
// (sliding_window_pattern k, layer_types naming the same): k, or 0 for another pattern.
int GemmaWindowPattern(const ModelConfig& m) {
  const std::vector<int32_t>& full = m.full_attention_layers;
  if (m.sliding_window == 0) return 0;
  if (full.empty()) return m.layers + 1;  // no block is the k-th
  const int k = full[0] + 1;
  for (int l = 0; l < m.layers; ++l) {
    if ((m.WindowOf(l) == 0) != ((l + 1) % k == 0)) return 0;
  }
  return k;
}

// An RMSNorm's weight: Gemma's stores weight − 1.
HfTensorMap Norm(const ModelConfig& m, std::string ours, int64_t width, std::string theirs) {
  HfTensorMap norm = Whole(std::move(ours), {width}, std::move(theirs));
  if (IsGemma(m)) norm.shift = 1.0f;
  return norm;
}

void AddGpt2Block(const ModelConfig& m, int l, std::vector<HfTensorMap>& out) {
  const int64_t c = m.width, f = m.ffn_hidden, qkv = m.qkv_width();
  const std::string p = absl::StrCat("h.", l, "."), h = absl::StrCat("h.", l, ".");
  out.push_back(Whole(p + "ln1.w", {c}, h + "ln_1.weight"));
  out.push_back(Whole(p + "ln1.b", {c}, h + "ln_1.bias"));
  out.push_back(Whole(p + "attn.qkv.w", {qkv, c}, h + "attn.c_attn.weight", true));
  out.push_back(Whole(p + "attn.qkv.b", {qkv}, h + "attn.c_attn.bias"));
  out.push_back(Whole(p + "attn.proj.w", {c, c}, h + "attn.c_proj.weight", true));
  out.push_back(Whole(p + "attn.proj.b", {c}, h + "attn.c_proj.bias"));
  out.push_back(Whole(p + "ln2.w", {c}, h + "ln_2.weight"));
  out.push_back(Whole(p + "ln2.b", {c}, h + "ln_2.bias"));
  out.push_back(Whole(p + "mlp.fc.w", {f, c}, h + "mlp.c_fc.weight", true));
  out.push_back(Whole(p + "mlp.fc.b", {f}, h + "mlp.c_fc.bias"));
  out.push_back(Whole(p + "mlp.proj.w", {c, f}, h + "mlp.c_proj.weight", true));
  out.push_back(Whole(p + "mlp.proj.b", {c}, h + "mlp.c_proj.bias"));
}

// A sparse MLP's Hugging Face names under a block's prefix: the router, each expert's prefix
// (before its index) and its gate, up and down projections; and where the layout has them, the
// shared expert's prefix, its gate and the router's selection bias.
struct ExpertNames {
  const char *router, *expert, *gate, *up, *down;
  const char *shared = nullptr, *shared_gate = nullptr, *router_bias = nullptr;
  bool bias_in_a_row = false;  // the selection bias stored [1, experts] (ERNIE 4.5's)
};
// Mixtral's: block_sparse_moe with w1 (gate), w3 (up), w2 (down).
constexpr ExpertNames kMixtralExperts{"block_sparse_moe.gate.weight", "block_sparse_moe.experts.",
                                      "w1.weight", "w3.weight", "w2.weight"};
// MiniMax-M2's: Mixtral's, and the selection bias beside the router.
constexpr ExpertNames kMiniMaxM2Experts{"block_sparse_moe.gate.weight",
                                        "block_sparse_moe.experts.",
                                        "w1.weight",
                                        "w3.weight",
                                        "w2.weight",
                                        nullptr,
                                        nullptr,
                                        "block_sparse_moe.e_score_correction_bias"};
// Qwen3-MoE's: the router mlp.gate, and gate_proj, up_proj, down_proj.
constexpr ExpertNames kQwen3MoeExperts{"mlp.gate.weight", "mlp.experts.", "gate_proj.weight",
                                       "up_proj.weight", "down_proj.weight"};
// Qwen2-MoE's: Qwen3-MoE's, and one shared expert mlp.shared_expert (gate_proj, up_proj,
// down_proj) gated by mlp.shared_expert_gate [1, width].
constexpr ExpertNames kQwen2MoeExperts{"mlp.gate.weight",
                                       "mlp.experts.",
                                       "gate_proj.weight",
                                       "up_proj.weight",
                                       "down_proj.weight",
                                       "mlp.shared_expert.",
                                       "mlp.shared_expert_gate.weight"};
// GLM-4.5's: Qwen3-MoE's, ungated shared experts mlp.shared_experts, and the router's selection
// bias mlp.gate.e_score_correction_bias [experts].
constexpr ExpertNames kGlm4MoeExperts{"mlp.gate.weight",
                                      "mlp.experts.",
                                      "gate_proj.weight",
                                      "up_proj.weight",
                                      "down_proj.weight",
                                      "mlp.shared_experts.",
                                      nullptr,
                                      "mlp.gate.e_score_correction_bias"};
// ERNIE 4.5's: GLM-4.5's, the selection bias [1, experts] under mlp.moe_statics.
constexpr ExpertNames kErnieMoeExperts{"mlp.gate.weight",
                                       "mlp.experts.",
                                       "gate_proj.weight",
                                       "up_proj.weight",
                                       "down_proj.weight",
                                       "mlp.shared_experts.",
                                       nullptr,
                                       "mlp.moe_statics.e_score_correction_bias",
                                       /*bias_in_a_row=*/true};

// DeepSeek-V2's: GLM-4.5's without the selection bias.
constexpr ExpertNames kDeepseekV2Experts{"mlp.gate.weight",  "mlp.experts.",
                                         "gate_proj.weight", "up_proj.weight",
                                         "down_proj.weight", "mlp.shared_experts."};

void AddExperts(const ModelConfig& m, const std::string& p, const std::string& h,
                const ExpertNames& names, std::vector<HfTensorMap>& out) {
  const int64_t c = m.width, f = m.moe.ffn, experts = m.moe.experts;
  out.push_back(Whole(p + "moe.router.w", {experts, c}, h + names.router));
  if (names.router_bias != nullptr) {  // GLM-4.5's, ERNIE's (HfTensors: the model has the bias)
    HfTensorMap bias = Whole(p + "moe.router.bias", {experts}, h + names.router_bias);
    if (names.bias_in_a_row) bias.pieces[0].shape = {1, experts};
    out.push_back(std::move(bias));
  }
  if (names.shared != nullptr && (names.shared_gate != nullptr || m.moe.shared_experts > 0)) {
    // Qwen2-MoE's, gated (HfTensors: so are the model's); GLM-4.5's and ERNIE's (any of them)
    const int64_t s = int64_t{m.moe.shared_experts} * f;
    const std::string e = h + names.shared;
    out.push_back(
        {p + "moe.shared.fc.w", {2 * s, c}, {{e + names.gate, 0, s}, {e + names.up, s, s}}});
    out.push_back(Whole(p + "moe.shared.proj.w", {c, s}, e + names.down));
    if (names.shared_gate != nullptr) {
      out.push_back(Whole(p + "moe.shared_gate.w", {1, c}, h + names.shared_gate));
    }
  }
  HfTensorMap fc{p + "moe.experts.fc.w", {experts * 2 * f, c}, {}};
  HfTensorMap proj{p + "moe.experts.proj.w", {experts, c, f}, {}};
  for (int64_t j = 0; j < experts; ++j) {
    const std::string e = absl::StrCat(h, names.expert, j, ".");
    fc.pieces.push_back({e + names.gate, j * 2 * f, f});
    fc.pieces.push_back({e + names.up, j * 2 * f + f, f});
    proj.pieces.push_back({e + names.down, j, 1});
  }
  out.push_back(std::move(fc));
  out.push_back(std::move(proj));
}

// GraniteMoE's experts, each kind's weights stacked in one tensor: the router
// block_sparse_moe.router.layer, input_linear [experts, 2·ffn, width] (each expert's gate rows,
// then its up rows: our fc.w's rows in order) and output_linear [experts, width, ffn] (our proj.w).
void AddStackedExperts(const ModelConfig& m, const std::string& p, const std::string& h,
                       std::vector<HfTensorMap>& out) {
  const int64_t c = m.width, f = m.moe.ffn, experts = m.moe.experts;
  const std::string moe = h + "block_sparse_moe.";
  out.push_back(Whole(p + "moe.router.w", {experts, c}, moe + "router.layer.weight"));
  out.push_back({p + "moe.experts.fc.w",
                 {experts * 2 * f, c},
                 {{moe + "input_linear.weight", 0, experts * 2 * f, false, {experts, 2 * f, c}}}});
  out.push_back({p + "moe.experts.proj.w",
                 {experts, c, f},
                 {{moe + "output_linear.weight", 0, experts, false, {experts, c, f}}}});
}

// The attention's tensors of a block of the Llama family: q_proj, k_proj and v_proj (or Phi-3's
// fused qkv_proj), their biases, query and key norms, and o_proj.
void AddLlamaAttention(const ModelConfig& m, const std::string& p, const std::string& h,
                       const HfLayout& layout, std::vector<HfTensorMap>& out) {
  const int64_t c = m.width, d = m.head_dim();
  const int64_t q = int64_t{m.heads} * d, kv = int64_t{m.kv_heads} * d;
  // q_proj, k_proj and v_proj (GLM's q and k rows interleaved for its RoPE) as `kind`.
  const bool pairs = layout.interleaved_rope;
  const bool fused = layout.projections == HfProjections::kFused;
  const int64_t head = pairs ? d : 0, rope = pairs ? m.rotary_dim() : 0;
  auto projections = [&](const std::string& kind) -> std::vector<HfPiece> {
    return {{h + "self_attn.q_proj." + kind, 0, q, false, {}, head, rope},
            {h + "self_attn.k_proj." + kind, q, kv, false, {}, head, rope},
            {h + "self_attn.v_proj." + kind, q + kv, kv}};
  };
  if (fused) {  // Phi-3's
    out.push_back(Whole(p + "attn.qkv.w", {q + 2 * kv, c}, h + "self_attn.qkv_proj.weight"));
  } else {
    out.push_back({p + "attn.qkv.w", {q + 2 * kv, c}, projections("weight")});
  }
  if (m.qkv_bias) {  // Qwen2's and GLM's
    out.push_back({p + "attn.qkv.b", {q + 2 * kv}, projections("bias")});
  }
  if (m.qk_norm) {  // Qwen3's and Gemma 3's
    out.push_back(Norm(m, p + "attn.q_norm.w", m.q_norm_width(), h + "self_attn.q_norm.weight"));
    out.push_back(Norm(m, p + "attn.k_norm.w", m.k_norm_width(), h + "self_attn.k_norm.weight"));
  }
  out.push_back(Whole(p + "attn.proj.w", {c, q}, h + "self_attn.o_proj.weight"));
}

void AddLlamaBlock(const ModelConfig& m, int l, const HfLayout& layout,
                   std::vector<HfTensorMap>& out) {
  const int64_t c = m.width, f = m.ffn_hidden;
  const std::string p = absl::StrCat("h.", l, "."), h = absl::StrCat("model.layers.", l, ".");
  const bool fused = layout.projections == HfProjections::kFused;
  if (m.pre_norms) out.push_back(Norm(m, p + "ln1.w", c, h + "input_layernorm.weight"));
  if (m.latent.enabled()) {
    AddLatentAttention(m, p, h, layout, out);
  } else {
    AddLlamaAttention(m, p, h, layout, out);
  }
  if (m.post_norms && layout.glm) {  // GLM-4's names of Gemma 2's four norms
    out.push_back(Norm(m, p + "attn.post_norm.w", c, h + "post_self_attn_layernorm.weight"));
    out.push_back(Norm(m, p + "ln2.w", c, h + "post_attention_layernorm.weight"));
    out.push_back(Norm(m, p + "mlp.post_norm.w", c, h + "post_mlp_layernorm.weight"));
  } else if (m.post_norms) {  // Gemma's and OLMo 2's: post_attention_layernorm the attention's
    out.push_back(Norm(m, p + "attn.post_norm.w", c, h + "post_attention_layernorm.weight"));
    if (m.pre_norms) {
      out.push_back(Norm(m, p + "ln2.w", c, h + "pre_feedforward_layernorm.weight"));
    }
    out.push_back(Norm(m, p + "mlp.post_norm.w", c, h + "post_feedforward_layernorm.weight"));
  } else {
    out.push_back(Norm(m, p + "ln2.w", c, h + "post_attention_layernorm.weight"));
  }
  if (m.moe.IsMoeLayer(l)) {
    switch (layout.experts) {
      case HfExperts::kMixtral:
        return AddExperts(m, p, h, kMixtralExperts, out);
      case HfExperts::kQwen3Moe:
        return AddExperts(m, p, h, kQwen3MoeExperts, out);
      case HfExperts::kQwen2Moe:
        return AddExperts(m, p, h, kQwen2MoeExperts, out);
      case HfExperts::kGraniteMoe:
        return AddStackedExperts(m, p, h, out);
      case HfExperts::kGlm4Moe:
        return AddExperts(m, p, h, kGlm4MoeExperts, out);
      case HfExperts::kErnieMoe:
        return AddExperts(m, p, h, kErnieMoeExperts, out);
      case HfExperts::kMiniMaxM2:
        return AddExperts(m, p, h, kMiniMaxM2Experts, out);
      case HfExperts::kDeepseekV2:
        return AddExperts(m, p, h, kDeepseekV2Experts, out);
    }
  }
  if (layout.projections == HfProjections::kGraniteSharedMlp) {
    out.push_back(Whole(p + "mlp.fc.w", {2 * f, c}, h + "shared_mlp.input_linear.weight"));
    out.push_back(Whole(p + "mlp.proj.w", {c, f}, h + "shared_mlp.output_linear.weight"));
    return;
  }
  if (fused || layout.projections == HfProjections::kFusedMlp) {
    out.push_back(Whole(p + "mlp.fc.w", {2 * f, c}, h + "mlp.gate_up_proj.weight"));
  } else {
    out.push_back({p + "mlp.fc.w",
                   {2 * f, c},
                   {{h + "mlp.gate_proj.weight", 0, f}, {h + "mlp.up_proj.weight", f, f}}});
  }
  out.push_back(Whole(p + "mlp.proj.w", {c, f}, h + "mlp.down_proj.weight"));
}

// Whether YaRN's `factor` is `max_positions` over its original context, as recent transformers
// take it when rope_scaling gives that context (older ones take `factor` itself).
bool YarnFactorAgrees(double max_positions, int original, float factor) {
  return std::abs(max_positions / original - factor) <= 1e-6 * factor;
}

}  // namespace

// config.json's max_position_embeddings: the model's max_seq; with YaRN over an original context
// other than it, factor times that context (CheckHfWritable: a whole number), whatever context
// the model last trained at, so that every transformers version reads the same factor.
int64_t HfMaxPositions(const ModelConfig& m) {
  const config::RopeScaling& r = m.rope_scaling;
  if (!r.yarn || m.max_seq == r.original_max_seq) return m.max_seq;
  return std::llround(static_cast<double>(r.factor) * r.original_max_seq);
}

// config.json's rope_scaling: null, linear, YaRN, or Llama 3's (transformers' rope_type llama3).
// YaRN's original context goes in only when max_position_embeddings is not it.
std::string RopeScalingJson(const ModelConfig& m) {
  const config::RopeScaling& r = m.rope_scaling;
  if (!r.enabled()) return "null";
  if (r.yarn) {
    return absl::StrCat(
        "{\"rope_type\": \"yarn\", \"factor\": ", ShortFloat(r.factor),
        HfMaxPositions(m) != r.original_max_seq
            ? absl::StrCat(", \"original_max_position_embeddings\": ", r.original_max_seq)
            : "",
        ", \"beta_fast\": ", ShortFloat(r.beta_fast), ", \"beta_slow\": ", ShortFloat(r.beta_slow),
        r.truncate ? "" : ", \"truncate\": false",
        ", \"attention_factor\": ", ShortFloat(r.attention_factor), "}");
  }
  if (r.linear)
    return absl::StrCat("{\"rope_type\": \"linear\", \"factor\": ", ShortFloat(r.factor), "}");
  return absl::StrCat("{\"rope_type\": \"llama3\", \"factor\": ", ShortFloat(r.factor),
                      ", \"low_freq_factor\": ", ShortFloat(r.low_freq_factor),
                      ", \"high_freq_factor\": ", ShortFloat(r.high_freq_factor),
                      ", \"original_max_position_embeddings\": ", r.original_max_seq, "}");
}

namespace {

absl::Status ReadGpt2Config(const ConfigFields& f, ModelConfig& m) {
  m.family = ModelFamily::kGpt2;
  TY_RETURN_IF_ERROR(f.Int("vocab_size", &m.vocab));
  TY_RETURN_IF_ERROR(f.Int("n_positions", &m.max_seq));
  TY_RETURN_IF_ERROR(f.Int("n_embd", &m.width));
  TY_RETURN_IF_ERROR(f.Int("n_layer", &m.layers));
  TY_RETURN_IF_ERROR(f.Int("n_head", &m.heads));
  m.kv_heads = m.heads;
  m.ffn_hidden = 4 * m.width;
  TY_RETURN_IF_ERROR(f.Int("n_inner", &m.ffn_hidden, /*required=*/false));
  m.norm_eps = 1e-5f;
  TY_RETURN_IF_ERROR(f.Float("layer_norm_epsilon", &m.norm_eps));
  m.tied_embeddings = true;
  TY_RETURN_IF_ERROR(f.Bool("tie_word_embeddings", &m.tied_embeddings));
  return f.OneOf("activation_function", {"gelu_new", "gelu_pytorch_tanh"});
}

// A list of positive numbers (LongRoPE's per-pair factors).
absl::Status ReadFactors(const ConfigFields& f, const std::string& key, std::vector<float>* out) {
  const Value* value = f.Get(key);
  if (value == nullptr) return f.Bad(key, "is missing");
  if (value->kind_case() != Value::kListValue) return f.Bad(key, "must be a list of numbers");
  out->clear();
  for (const Value& v : value->list_value().values()) {
    if (v.kind_case() != Value::kNumberValue || !(v.number_value() > 0) ||
        !std::isfinite(v.number_value())) {
      return f.Bad(key, "must be a list of positive numbers");
    }
    out->push_back(static_cast<float>(v.number_value()));
  }
  return absl::OkStatus();
}

// LongRoPE (rope_type "longrope", Phi-3's older "su"): the short and long per-pair factors; the
// context they switch at, original_max_position_embeddings, beside rope_scaling (Phi-3's place)
// or in it, else max_position_embeddings; and attention_factor, else the paper's for
// rope_scaling's `factor` (else, or with the context beside it, max_position_embeddings over that
// context), as transformers computes.
absl::Status ReadLongRope(const ConfigFields& f, const ConfigFields& scaling, ModelConfig& m) {
  config::RopeScaling& r = m.rope_scaling;
  r.longrope = true;
  TY_RETURN_IF_ERROR(ReadFactors(scaling, "short_factor", &r.short_factor));
  TY_RETURN_IF_ERROR(ReadFactors(scaling, "long_factor", &r.long_factor));
  r.original_max_seq = m.max_seq;
  TY_RETURN_IF_ERROR(
      scaling.Int("original_max_position_embeddings", &r.original_max_seq, /*required=*/false));
  // Beside rope_scaling (Phi-3's place) it wins, and the context's extension is then
  // max_position_embeddings over it whatever rope_scaling's factor says, as transformers' Phi-3
  // computes them. In double, as the spec's default and the export compute it, so that a model
  // written without attention_factor reads back with the same one.
  const bool beside = f.Has("original_max_position_embeddings");
  TY_RETURN_IF_ERROR(f.Int("original_max_position_embeddings", &r.original_max_seq, false));
  double factor = static_cast<double>(m.max_seq) / r.original_max_seq;
  if (scaling.Has("factor") && !beside) {
    float given = 0.0f;
    TY_RETURN_IF_ERROR(scaling.Float("factor", &given));
    factor = given;
  }
  r.attention_factor = config::LongRopeAttentionFactor(factor, r.original_max_seq);
  return scaling.Float("attention_factor", &r.attention_factor);
}

// YaRN (rope_type "yarn"): factor; the original context, original_max_position_embeddings in
// rope_scaling, else max_position_embeddings; beta_fast, beta_slow (32 and 1 when absent or 0)
// and truncate; attention_factor, else mscale over mscale_all_dim (DeepSeek's) when both are set,
// else the paper's for the factor, as transformers computes. Recent transformers take the factor
// as max_position_embeddings over the original context when rope_scaling gives that context,
// older ones rope_scaling's factor: a config where the two differ is refused.
absl::Status ReadYarn(const ConfigFields& scaling, ModelConfig& m) {
  config::RopeScaling& r = m.rope_scaling;
  r.yarn = true;
  r.factor = 0.0f;
  TY_RETURN_IF_ERROR(scaling.Float("factor", &r.factor));
  if (!(r.factor > 0.0f)) return scaling.Bad("factor", "is missing");
  r.original_max_seq = m.max_seq;
  if (scaling.Has("original_max_position_embeddings")) {
    TY_RETURN_IF_ERROR(scaling.Int("original_max_position_embeddings", &r.original_max_seq));
    const double ratio = static_cast<double>(m.max_seq) / r.original_max_seq;
    if (!YarnFactorAgrees(m.max_seq, r.original_max_seq, r.factor)) {
      return scaling.Bad(
          "factor",
          absl::StrCat("is ", r.factor, " but max_position_embeddings ", m.max_seq,
                       " over original_max_position_embeddings ", r.original_max_seq, " is ", ratio,
                       " (transformers' versions take one or the other; make them "
                       "agree)"));
    }
  }
  for (auto [key, value] : {std::pair{"beta_fast", &r.beta_fast}, {"beta_slow", &r.beta_slow}}) {
    float given = 0.0f;
    TY_RETURN_IF_ERROR(scaling.Float(key, &given, /*zero_too=*/true));
    if (given != 0.0f) *value = given;
  }
  TY_RETURN_IF_ERROR(scaling.Bool("truncate", &r.truncate));
  float mscale = 0.0f, mscale_all_dim = 0.0f;
  TY_RETURN_IF_ERROR(scaling.Float("mscale", &mscale, /*zero_too=*/true));
  TY_RETURN_IF_ERROR(scaling.Float("mscale_all_dim", &mscale_all_dim, /*zero_too=*/true));
  r.attention_factor = mscale != 0.0f && mscale_all_dim != 0.0f
                           ? static_cast<float>(config::YarnScale(r.factor, mscale) /
                                                config::YarnScale(r.factor, mscale_all_dim))
                           : config::YarnAttentionFactor(r.factor);
  return scaling.Float("attention_factor", &r.attention_factor);
}

// rope_scaling: null, rope_type "default" (none), "linear", "llama3", "longrope" or "yarn" (also
// under the older key "type").
absl::Status ReadRopeScaling(const ConfigFields& f, ModelConfig& m) {
  const Value* value = f.Get("rope_scaling");
  if (value == nullptr) return absl::OkStatus();
  auto unsupported = [&] {
    return f.Bad("rope_scaling",
                 "is not supported (null, or rope_type \"llama3\", \"linear\", "
                 "\"longrope\", \"yarn\" or \"default\")");
  };
  if (value->kind_case() != Value::kStructValue) return unsupported();
  const ConfigFields scaling(value->struct_value(), f.source() + ": rope_scaling");
  const Value* type = scaling.Get("rope_type");
  if (type == nullptr) type = scaling.Get("type");
  const std::string name = type != nullptr ? type->string_value() : "";
  if (name == "default") return absl::OkStatus();
  if (name == "longrope" || name == "su") return ReadLongRope(f, scaling, m);
  if (name == "yarn") return ReadYarn(scaling, m);
  if (name != "llama3" && name != "linear") return unsupported();
  config::RopeScaling& r = m.rope_scaling;
  r.factor = 0.0f;
  r.linear = name == "linear";
  TY_RETURN_IF_ERROR(scaling.Float("factor", &r.factor));
  if (!r.enabled()) return scaling.Bad("factor", "is missing");
  if (r.linear) return absl::OkStatus();
  TY_RETURN_IF_ERROR(scaling.Float("low_freq_factor", &r.low_freq_factor));
  TY_RETURN_IF_ERROR(scaling.Float("high_freq_factor", &r.high_freq_factor));
  return scaling.Int("original_max_position_embeddings", &r.original_max_seq, /*required=*/false);
}

// A Llama-family config's sizes, norm, RoPE and embeddings (not its activation), `defaults` for
// what it leaves out. Heads wider than hidden_size / num_attention_heads are the model's head_dim.
absl::Status ReadLlamaShape(const ConfigFields& f, ModelConfig& m,
                            const LlamaDefaults& defaults = {}) {
  m.family = ModelFamily::kLlama;
  TY_RETURN_IF_ERROR(f.Int("vocab_size", &m.vocab));
  TY_RETURN_IF_ERROR(f.Int("max_position_embeddings", &m.max_seq));
  TY_RETURN_IF_ERROR(f.Int("hidden_size", &m.width));
  TY_RETURN_IF_ERROR(f.Int("intermediate_size", &m.ffn_hidden));
  TY_RETURN_IF_ERROR(f.Int("num_hidden_layers", &m.layers));
  TY_RETURN_IF_ERROR(f.Int("num_attention_heads", &m.heads));
  m.kv_heads = m.heads;
  TY_RETURN_IF_ERROR(f.Int("num_key_value_heads", &m.kv_heads, /*required=*/false));
  // Heads wider than hidden_size / num_attention_heads (Mistral Nemo's, Qwen3's) are the
  // model's head_dim.
  int head_dim = defaults.head_dim;
  TY_RETURN_IF_ERROR(f.Int("head_dim", &head_dim, /*required=*/false));
  if (head_dim != 0 && (m.heads < 1 || int64_t{head_dim} * m.heads != m.width)) {
    m.explicit_head_dim = head_dim;
  }
  m.norm_eps = defaults.norm_eps;
  TY_RETURN_IF_ERROR(f.Float("rms_norm_eps", &m.norm_eps));
  m.rope_theta = defaults.rope_theta;
  TY_RETURN_IF_ERROR(f.Float("rope_theta", &m.rope_theta));
  m.tied_embeddings = defaults.tied_embeddings;
  TY_RETURN_IF_ERROR(f.Bool("tie_word_embeddings", &m.tied_embeddings));
  std::vector<const char*> unbiased = {"mlp_bias"};
  if (defaults.qkv_attention_bias.has_value()) {
    m.qkv_bias = *defaults.qkv_attention_bias;
    TY_RETURN_IF_ERROR(f.Bool("attention_bias", &m.qkv_bias));
  } else {
    unbiased.push_back("attention_bias");
  }
  for (const char* key : unbiased) {
    bool biased = false;
    TY_RETURN_IF_ERROR(f.Bool(key, &biased));
    if (biased) return f.Bad(key, "must be false (Trainyard's Llama has no biases)");
  }
  return ReadRopeScaling(f, m);
}

}  // namespace

absl::Status ReadLlamaConfig(const ConfigFields& f, ModelConfig& m, const LlamaDefaults& defaults) {
  TY_RETURN_IF_ERROR(ReadLlamaShape(f, m, defaults));
  return f.OneOf("hidden_act", {"silu"});
}

namespace {

// Gemma's family: heads 256 wide and tied embeddings unless the config says otherwise.
constexpr LlamaDefaults kGemmaDefaults{.head_dim = 256, .tied_embeddings = true};

// Gemma's (GemmaForCausalLM): Llama's model with GeGLU, embeddings scaled by √hidden_size, tied
// embeddings and 256-wide heads unless the config says otherwise, and its norms' weights less one
// (HfTensors). Gemma's MLP is GELU with the tanh approximation: the first published configs say
// hidden_act "gelu" and transformers reads that as the approximation unless hidden_activation
// says otherwise; an explicit exact GELU is refused.
absl::Status ReadGemmaConfig(const ConfigFields& f, ModelConfig& m) {
  TY_RETURN_IF_ERROR(ReadLlamaShape(f, m, kGemmaDefaults));
  m.geglu = true;
  m.scale_embeddings = true;
  if (f.Has("hidden_activation")) {
    return f.OneOf("hidden_activation", {"gelu_pytorch_tanh", "gelu_new"});
  }
  return f.OneOf("hidden_act", {"gelu_pytorch_tanh", "gelu", "gelu_new"});
}

// The blocks a layer_types list (transformers' newer configs) names "full_attention", the others
// being "sliding_attention"; `full` unchanged when the config has no list.
absl::Status ReadLayerTypes(const ConfigFields& f, int layers, std::vector<int32_t>& full) {
  const Value* types = f.Get("layer_types");
  if (types == nullptr) return absl::OkStatus();
  auto bad = [&] {
    return f.Bad("layer_types",
                 absl::StrCat("must name \"sliding_attention\" or \"full_attention\" "
                              "for each of the ",
                              layers, " layers"));
  };
  if (types->kind_case() != Value::kListValue || types->list_value().values_size() != layers) {
    return bad();
  }
  full.clear();
  for (int l = 0; l < layers; ++l) {
    const std::string& type = types->list_value().values(l).string_value();
    if (type == "full_attention") {
      full.push_back(l);
    } else if (type != "sliding_attention") {
      return bad();
    }
  }
  return absl::OkStatus();
}

// A window of sliding_window (`window` when the config leaves it out, none when it is null) in the
// blocks layer_types names "sliding_attention", or without the list in the blocks not in `full`;
// a window as long as the positions hides nothing. `global`, when given, receives the blocks
// outside the window whether or not it hides anything (none with a null window).
absl::Status ReadTypedWindow(const ConfigFields& f, ModelConfig& m, int window,
                             std::vector<int32_t> full, std::vector<int32_t>* global = nullptr) {
  if (f.IsNull("sliding_window")) return absl::OkStatus();
  TY_RETURN_IF_ERROR(f.Int("sliding_window", &window, /*required=*/false));
  TY_RETURN_IF_ERROR(ReadLayerTypes(f, m.layers, full));
  if (global != nullptr) *global = full;
  const bool windowed = window < m.max_seq && static_cast<int>(full.size()) < m.layers;
  m.sliding_window = windowed ? window : 0;
  m.full_attention_layers = windowed ? full : std::vector<int32_t>{};
  return absl::OkStatus();
}

// Gemma 2's and 3's scores: scaled by query_pre_attn_scalar^-1/2 (transformers' default 256),
// the attention's soft-capped at attn_logit_softcapping and the logits at
// final_logit_softcapping (null: none).
absl::Status ReadGemmaScores(const ConfigFields& f, ModelConfig& m) {
  int scalar = 256;
  TY_RETURN_IF_ERROR(f.Int("query_pre_attn_scalar", &scalar, /*required=*/false));
  m.attention_scale_dim = scalar == m.head_dim() ? 0 : scalar;
  TY_RETURN_IF_ERROR(f.Float("attn_logit_softcapping", &m.attention_softcap));
  return f.Float("final_logit_softcapping", &m.logit_softcap);
}

// Gemma 2 (Gemma2ForCausalLM): Gemma's model with norms of the attention's and the MLP's outputs
// (post_attention_layernorm and post_feedforward_layernorm; pre_feedforward_layernorm is the
// MLP's input norm), each RMSNorm multiplying by 1 + its weight, soft-capped scores and logits,
// and local blocks: the even blocks (counted from 0) attend to the sliding window, the odd ones
// to every position (or as layer_types says), all with rope_theta.
absl::Status ReadGemma2Config(const ConfigFields& f, ModelConfig& m) {
  TY_RETURN_IF_ERROR(ReadLlamaShape(f, m, kGemmaDefaults));
  m.geglu = m.scale_embeddings = m.post_norms = true;
  TY_RETURN_IF_ERROR(f.OneOf("hidden_activation", {"gelu_pytorch_tanh", "gelu_new"}));
  TY_RETURN_IF_ERROR(ReadGemmaScores(f, m));
  int window = 4096;  // transformers' default
  TY_RETURN_IF_ERROR(f.Int("sliding_window", &window, /*required=*/false));
  std::vector<int32_t> full;
  for (int l = 1; l < m.layers; l += 2) full.push_back(l);
  TY_RETURN_IF_ERROR(ReadLayerTypes(f, m.layers, full));
  m.sliding_window = window < m.max_seq && static_cast<int>(full.size()) < m.layers ? window : 0;
  m.full_attention_layers = m.sliding_window > 0 ? full : std::vector<int32_t>{};
  return absl::OkStatus();
}

// Gemma 3's text model (Gemma3ForCausalLM, model_type gemma3_text): Gemma 2's with query and key
// norms, and every sliding_window_pattern-th block (or those layer_types names full_attention)
// attending to every position with rope_theta, the others to the window with
// rope_local_base_freq. Causal, and RoPE unscaled.
absl::Status ReadGemma3Config(const ConfigFields& f, ModelConfig& m) {
  TY_RETURN_IF_ERROR(ReadLlamaShape(f, m, kGemmaDefaults));
  m.geglu = m.scale_embeddings = m.qk_norm = m.post_norms = true;
  TY_RETURN_IF_ERROR(f.OneOf("hidden_activation", {"gelu_pytorch_tanh", "gelu_new"}));
  TY_RETURN_IF_ERROR(ReadGemmaScores(f, m));
  bool bidirectional = false;
  TY_RETURN_IF_ERROR(f.Bool("use_bidirectional_attention", &bidirectional));
  if (bidirectional) return f.Bad("use_bidirectional_attention", "must be false (causal only)");
  int window = 4096, pattern = 6;  // transformers' defaults
  TY_RETURN_IF_ERROR(f.Int("sliding_window", &window, /*required=*/false));
  TY_RETURN_IF_ERROR(f.Int("sliding_window_pattern", &pattern, /*required=*/false));
  std::vector<int32_t> full;
  for (int l = 0; l < m.layers; ++l) {
    if ((l + 1) % pattern == 0) full.push_back(l);
  }
  TY_RETURN_IF_ERROR(ReadLayerTypes(f, m.layers, full));
  m.sliding_window = window < m.max_seq && static_cast<int>(full.size()) < m.layers ? window : 0;
  m.full_attention_layers = m.sliding_window > 0 ? full : std::vector<int32_t>{};
  float local = 10000.0f;
  TY_RETURN_IF_ERROR(f.Float("rope_local_base_freq", &local));
  // The local blocks turn at their own base, unscaled: with RoPE scaling (the global blocks'),
  // kept even when it equals rope_theta.
  m.rope_local_theta =
      m.sliding_window > 0 && (local != m.rope_theta || m.rope_scaling.enabled()) ? local : 0.0f;
  return absl::OkStatus();
}

// transformers' Gemma3TextConfig defaults, which a multimodal Gemma 3 config's text_config leaves
// out (the published 4B to 27B configs give only what differs from them).
constexpr char kGemma3TextDefaults[] = R"({
  "model_type": "gemma3_text", "vocab_size": 262208, "hidden_size": 2304,
  "intermediate_size": 9216, "num_hidden_layers": 26, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
  "max_position_embeddings": 131072, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
  "query_pre_attn_scalar": 256, "sliding_window": 4096, "sliding_window_pattern": 6,
  "rope_local_base_freq": 10000.0, "tie_word_embeddings": true})";

// The config's `key` ← `value`, unless it already holds a different non-null value there: then
// the field is given two ways that disagree, refused naming both.
absl::Status SetUnlessOtherwise(google::protobuf::Struct& config, const std::string& source,
                                const std::string& key, const Value& value,
                                const std::string& from) {
  auto& fields = *config.mutable_fields();
  auto it = fields.find(key);
  if (it != fields.end() && it->second.kind_case() != Value::kNullValue) {
    if (!google::protobuf::util::MessageDifferencer::Equals(it->second, value)) {
      return absl::InvalidArgumentError(absl::StrCat(
          source, ": ", key, " and ", from, " both give it, differently (keep one of them)"));
    }
  }
  fields[key] = value;
  return absl::OkStatus();
}

// One map of transformers 5's rope_parameters (`where` names it) as transformers 4 wrote its
// fields: rope_theta and partial_rotary_factor beside the config's other fields, the rest
// (rope_type and the scaling's keys) as rope_scaling unless rope_type is "default".
absl::Status RopeMapAsFields(google::protobuf::Struct& config, const std::string& source,
                             const google::protobuf::Struct& map, const std::string& where) {
  google::protobuf::Struct scaling;
  std::string type = "default";
  for (const auto& [key, value] : map.fields()) {
    if (key == "rope_theta" || key == "partial_rotary_factor") {
      TY_RETURN_IF_ERROR(
          SetUnlessOtherwise(config, source, key, value, absl::StrCat(where, ".", key)));
      continue;
    }
    if ((key == "rope_type" || key == "type") && value.kind_case() == Value::kStringValue) {
      type = value.string_value();
    }
    (*scaling.mutable_fields())[key] = value;
  }
  if (type == "default") return absl::OkStatus();
  Value as_value;
  *as_value.mutable_struct_value() = std::move(scaling);
  return SetUnlessOtherwise(config, source, "rope_scaling", as_value, where);
}

// transformers 5 writes a model's RoPE into one map, rope_parameters (rope_type, rope_theta,
// partial_rotary_factor and the scaling's keys), or one such map per layer type, where 4 wrote
// rope_theta, partial_rotary_factor and rope_scaling beside the other fields (and 5 still reads
// them so). `config`'s rope_parameters, if any, becomes those fields, so that one reader serves
// configs of both; a field given both ways with different values is refused. Per layer type
// (Gemma 3's, OLMo 3's): the full_attention map as above, and the sliding_attention blocks' plain
// RoPE, whose base is Gemma 3's rope_local_base_freq and OLMo 3's rope_theta (its windowed blocks
// turn unscaled at the global base); another model's per-type maps are refused.
absl::Status RopeParametersAsFields(google::protobuf::Struct& config, const std::string& source,
                                    const std::string& model_type) {
  auto& fields = *config.mutable_fields();
  auto it = fields.find("rope_parameters");
  if (it == fields.end() || it->second.kind_case() == Value::kNullValue) return absl::OkStatus();
  if (it->second.kind_case() != Value::kStructValue) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": rope_parameters must be a map"));
  }
  const google::protobuf::Struct parameters = it->second.struct_value();
  fields.erase(it);
  const auto& maps = parameters.fields();
  const bool per_type =
      !maps.empty() && std::all_of(maps.begin(), maps.end(), [](const auto& entry) {
        return (entry.first == "full_attention" || entry.first == "sliding_attention") &&
               entry.second.kind_case() == Value::kStructValue;
      });
  if (!per_type) return RopeMapAsFields(config, source, parameters, "rope_parameters");
  const bool gemma3 = model_type == "gemma3_text";
  if (!gemma3 && model_type != "olmo3") {
    return absl::InvalidArgumentError(
        absl::StrCat(source,
                     ": rope_parameters gives RoPE per layer type, which Trainyard reads "
                     "for Gemma 3 and OLMo 3 only"));
  }
  if (auto full = maps.find("full_attention"); full != maps.end()) {
    TY_RETURN_IF_ERROR(RopeMapAsFields(config, source, full->second.struct_value(),
                                       "rope_parameters.full_attention"));
  }
  auto sliding = maps.find("sliding_attention");
  if (sliding == maps.end()) return absl::OkStatus();
  const std::string where = "rope_parameters.sliding_attention";
  for (const auto& [key, value] : sliding->second.struct_value().fields()) {
    if (key == "rope_type" || key == "type") {
      if (value.string_value() != "default") {
        return absl::InvalidArgumentError(absl::StrCat(
            source, ": ", where, ".", key, " must be \"default\" (windowed blocks turn unscaled)"));
      }
    } else if (key == "rope_theta") {
      TY_RETURN_IF_ERROR(SetUnlessOtherwise(config, source,
                                            gemma3 ? "rope_local_base_freq" : "rope_theta", value,
                                            absl::StrCat(where, ".rope_theta")));
    } else if (key != "partial_rotary_factor") {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": ", where, ".", key, " is not read (plain RoPE has none)"));
    }
  }
  return absl::OkStatus();
}

// A multimodal checkpoint's language model config: its text_config over `defaults` (the text
// config class's defaults, which a published text_config may leave out; an explicit null stays
// null). `what` names the checkpoint in a refusal.
absl::StatusOr<google::protobuf::Struct> TextConfigOver(const ConfigFields& f, const char* defaults,
                                                        const std::string& what) {
  const Value* text = f.Get("text_config");
  if (text == nullptr || text->kind_case() != Value::kStructValue) {
    return f.Bad("text_config", absl::StrCat("is missing (", what, "'s language model is there)"));
  }
  google::protobuf::Struct merged;
  if (!google::protobuf::util::JsonStringToMessage(defaults, &merged).ok()) {
    return absl::InternalError(absl::StrCat(what, "'s text config defaults do not parse"));
  }
  google::protobuf::Struct given = text->struct_value();
  auto type = given.fields().find("model_type");
  if (type == given.fields().end()) type = merged.fields().find("model_type");
  const std::string model_type = type->second.string_value();
  TY_RETURN_IF_ERROR(RopeParametersAsFields(given, f.source() + ": text_config", model_type));
  for (const auto& [key, value] : given.fields()) (*merged.mutable_fields())[key] = value;
  return merged;
}

// A multimodal Gemma 3 (Gemma3ForConditionalGeneration, model_type gemma3): its language model,
// text_config over Gemma3TextConfig's defaults, read as gemma3_text. The vision tower's and the
// projector's configs are not read.
absl::Status ReadGemma3MultimodalConfig(const ConfigFields& f, ModelConfig& m) {
  TY_ASSIGN_OR_RETURN(const google::protobuf::Struct text,
                      TextConfigOver(f, kGemma3TextDefaults, "a multimodal Gemma 3"));
  return ReadGemma3Config(ConfigFields(text, f.source() + ": text_config"), m);
}

// Mistral's and Mixtral's sliding_window: the model's, or none when it is null or spans
// max_position_embeddings (the same attention), in every block but `full` (Qwen's first
// max_window_layers) or those a layer_types list names "full_attention".
absl::Status ReadSlidingWindow(const ConfigFields& f, ModelConfig& m,
                               std::vector<int32_t> full = {}) {
  int window = 0;
  TY_RETURN_IF_ERROR(f.Int("sliding_window", &window, /*required=*/false));
  TY_RETURN_IF_ERROR(ReadLayerTypes(f, m.layers, full));
  if (window == 0 && f.Has("layer_types") && static_cast<int>(full.size()) != m.layers) {
    return f.Bad("layer_types", "names sliding_attention layers, but sliding_window is null");
  }
  const bool everywhere = window == 0 || window >= m.max_seq;
  m.sliding_window = everywhere || static_cast<int>(full.size()) == m.layers ? 0 : window;
  m.full_attention_layers = m.sliding_window > 0 ? full : std::vector<int32_t>{};
  return absl::OkStatus();
}

// transformers' MistralConfig defaults, which a Mistral 3 config's text_config may leave out.
constexpr char kMistralTextDefaults[] = R"({
  "model_type": "mistral", "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336,
  "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
  "hidden_act": "silu", "max_position_embeddings": 131072, "rms_norm_eps": 1e-6,
  "rope_theta": 10000.0, "sliding_window": 4096, "tie_word_embeddings": false})";

// A Mistral 3 (Mistral3ForConditionalGeneration, model_type mistral3: Mistral Small 3.1 and 3.2):
// its language model, a Mistral text_config over MistralConfig's defaults, read
// as mistral. The vision tower's and the projector's configs are not read. The head's tie is
// the text config's; an outer tie_word_embeddings that says otherwise is refused, since
// transformers versions differ in which one they follow.
absl::Status ReadMistral3Config(const ConfigFields& f, ModelConfig& m) {
  TY_ASSIGN_OR_RETURN(const google::protobuf::Struct text,
                      TextConfigOver(f, kMistralTextDefaults, "a Mistral 3"));
  const ConfigFields t(text, f.source() + ": text_config");
  TY_RETURN_IF_ERROR(t.OneOf("model_type", {"mistral"}));
  TY_RETURN_IF_ERROR(ReadLlamaConfig(t, m));
  TY_RETURN_IF_ERROR(ReadSlidingWindow(t, m));
  bool tied = m.tied_embeddings;
  TY_RETURN_IF_ERROR(f.Bool("tie_word_embeddings", &tied));
  if (tied != m.tied_embeddings) {
    return f.Bad("tie_word_embeddings",
                 absl::StrCat("is ", tied ? "true" : "false", " but text_config's is ",
                              m.tied_embeddings ? "true" : "false"));
  }
  return absl::OkStatus();
}

// ERNIE 4.5's (Ernie4_5ForCausalLM, as ERNIE-4.5-0.3B is published): Llama's model with RoPE in
// GLM's neighbouring pairs over the whole head (HfTensors interleaves q's and k's rows), heads 128
// wide, rope_theta 500000 and tied embeddings unless the config says otherwise, and use_bias (on
// every projection) false.
absl::Status ReadErnieConfig(const ConfigFields& f, ModelConfig& m) {
  TY_RETURN_IF_ERROR(
      ReadLlamaConfig(f, m, {.head_dim = 128, .rope_theta = 500000.0f, .tied_embeddings = true}));
  bool biased = false;
  TY_RETURN_IF_ERROR(f.Bool("use_bias", &biased));
  if (biased) return f.Bad("use_bias", "must be false (Trainyard reads ERNIE 4.5 without biases)");
  return absl::OkStatus();
}

// Seed-OSS's (SeedOssForCausalLM, as Seed-OSS-36B is published): Llama's model with biases on q,
// k and v (attention_bias, true unless the config says otherwise; attention_out_bias, o_proj's,
// must be false) and heads 128 wide unless head_dim says otherwise. Its attention_dropout and
// residual_dropout are training-time noise Trainyard does not apply.
absl::Status ReadSeedOssConfig(const ConfigFields& f, ModelConfig& m) {
  TY_RETURN_IF_ERROR(ReadLlamaConfig(f, m, {.head_dim = 128, .qkv_attention_bias = true}));
  bool out_bias = false;
  TY_RETURN_IF_ERROR(f.Bool("attention_out_bias", &out_bias));
  if (out_bias) {
    return f.Bad("attention_out_bias", "must be false (Trainyard's o_proj has no bias)");
  }
  return absl::OkStatus();
}

// Helium's (HeliumForCausalLM, as Kyutai's Helium 1 is published): Llama's model with RoPE over
// the whole head in GLM's neighbouring pairs (HfTensors interleaves q's and k's rows), biases on
// q, k and v only with attention_bias, and transformers' defaults where the config is silent:
// heads 128 wide, rope_theta 100000, rms_norm_eps 1e-8.
absl::Status ReadHeliumConfig(const ConfigFields& f, ModelConfig& m) {
  return ReadLlamaConfig(
      f, m,
      {.head_dim = 128, .rope_theta = 100000.0f, .norm_eps = 1e-8f, .qkv_attention_bias = false});
}

// partial_rotary_factor (`fallback` without it): RoPE over the first head_dim · factor
// dimensions of each head, truncated as transformers does (Phi-4 mini's 0.75 turns 96 of 128).
absl::Status ReadPartialRotary(const ConfigFields& f, double fallback, ModelConfig& m) {
  const Value* rotary = f.Get("partial_rotary_factor");
  const double factor = rotary != nullptr ? rotary->number_value() : fallback;
  const double dims = std::floor(static_cast<double>(m.head_dim()) * factor);
  if ((rotary != nullptr && rotary->kind_case() != Value::kNumberValue) ||
      !(factor > 0 && factor <= 1) || dims < 2 || std::fmod(dims, 2.0) != 0) {
    return f.Bad("partial_rotary_factor",
                 absl::StrCat("must be in (0, 1] and turn an even number of each head's ",
                              m.head_dim(), " dimensions"));
  }
  m.rope_dim = dims == m.head_dim() ? 0 : static_cast<int>(dims);
  return absl::OkStatus();
}

// Phi-3's (Phi3ForCausalLM, as Phi-3, Phi-3.5 and Phi-4 are published): Mistral's model and
// window (Phi-3 mini's 2047 positions), RoPE over the first partial_rotary_factor of each head
// (transformers truncates head_dim · factor; Phi-4 mini's 0.75 turns 96 of 128), and its longrope
// scaling (the 128k models').
absl::Status ReadPhi3Config(const ConfigFields& f, ModelConfig& m) {
  TY_RETURN_IF_ERROR(ReadLlamaConfig(f, m));
  TY_RETURN_IF_ERROR(ReadPartialRotary(f, 1.0, m));
  return ReadSlidingWindow(f, m);
}

// GLM's (GlmForCausalLM, GLM-4 9B's first checkpoints) and GLM-4's (Glm4ForCausalLM, GLM-4
// 0414's and GLM-Z1's, `norms_after`: their branches' outputs normed too): Llama's shape with
// biases on q, k and v (attention_bias, default true), heads 128 wide unless the config says
// otherwise (head_dim), RoPE over the first half of each head (partial_rotary_factor's default)
// in neighbouring pairs (HfTensors interleaves q's and k's rows), plain RoPE only, and the MLP's
// gate and up fused (gate_up_proj).
absl::Status ReadGlmConfig(const ConfigFields& f, bool norms_after, ModelConfig& m) {
  TY_RETURN_IF_ERROR(ReadLlamaConfig(f, m, {.head_dim = 128, .qkv_attention_bias = true}));
  if (m.rope_scaling.enabled()) {
    return f.Bad("rope_scaling", "must be null (Trainyard reads GLM's plain RoPE only)");
  }
  TY_RETURN_IF_ERROR(ReadPartialRotary(f, 0.5, m));
  m.post_norms = norms_after;
  return absl::OkStatus();
}

// SmolLM3's (SmolLM3ForCausalLM): Llama's model with tied embeddings unless the config says
// otherwise, and NoPE layers: no_rope_layers holds 1 (RoPE) or 0 (none) for each layer, or
// without it every no_rope_layer_interval-th layer (4) leaves its queries and keys unturned, as
// transformers builds the list. With use_sliding_window and a sliding_window, the NoPE layers
// attend within the window (or those a layer_types list names "sliding_attention").
absl::Status ReadSmolLM3Config(const ConfigFields& f, ModelConfig& m) {
  TY_RETURN_IF_ERROR(ReadLlamaConfig(f, m, {.tied_embeddings = true}));
  std::vector<int32_t> rotated;  // the RoPE layers, full-attention ones under a window
  if (const Value* flags = f.Get("no_rope_layers"); flags != nullptr) {
    const bool listed =
        flags->kind_case() == Value::kListValue && flags->list_value().values_size() >= m.layers;
    for (int l = 0; listed && l < m.layers; ++l) {
      const Value& flag = flags->list_value().values(l);
      if (flag.kind_case() != Value::kNumberValue ||
          (flag.number_value() != 0 && flag.number_value() != 1)) {
        return f.Bad(
            "no_rope_layers",
            absl::StrCat("must hold 1 (RoPE) or 0 (none) for each of the ", m.layers, " layers"));
      }
      (flag.number_value() == 1 ? rotated : m.nope_layers).push_back(l);
    }
    if (!listed) {
      return f.Bad("no_rope_layers", absl::StrCat("must hold 1 (RoPE) or 0 (none) for each of the ",
                                                  m.layers, " layers"));
    }
  } else {
    int interval = 4;  // transformers' default
    TY_RETURN_IF_ERROR(f.Int("no_rope_layer_interval", &interval, /*required=*/false));
    for (int l = 0; l < m.layers; ++l)
      ((l + 1) % interval == 0 ? m.nope_layers : rotated).push_back(l);
  }
  bool sliding = false;
  TY_RETURN_IF_ERROR(f.Bool("use_sliding_window", &sliding));
  if (!sliding || !f.Has("sliding_window")) return absl::OkStatus();
  return ReadSlidingWindow(f, m, std::move(rotated));
}

// Granite's (GraniteForCausalLM, as Granite 3.x is published): Llama's model and tensors with
// four multipliers, each transformers' default 1 when absent: the embeddings'
// (embedding_multiplier), each branch's before it joins the residual stream
// (residual_multiplier), the attention scores' in place of head_dim^-1/2 (attention_multiplier)
// and the logits' divisor (logits_scaling).
absl::Status ReadGraniteConfig(const ConfigFields& f, ModelConfig& m) {
  TY_RETURN_IF_ERROR(ReadLlamaConfig(f, m));
  m.attention_multiplier = 1.0f;
  TY_RETURN_IF_ERROR(f.Float("embedding_multiplier", &m.embedding_multiplier));
  TY_RETURN_IF_ERROR(f.Float("residual_multiplier", &m.residual_multiplier));
  TY_RETURN_IF_ERROR(f.Float("attention_multiplier", &m.attention_multiplier));
  TY_RETURN_IF_ERROR(f.Float("logits_scaling", &m.logits_scaling));
  // A multiplier of head_dim^-1/2 is the default scale, as Trainyard writes a model without one.
  const float usual = 1.0f / std::sqrt(static_cast<float>(m.head_dim()));
  if (m.head_dim() > 0 && m.attention_multiplier == usual) m.attention_multiplier = 0.0f;
  return absl::OkStatus();
}

// Whether `list` is a JSON list whose every entry satisfies `ok`.
template <typename Predicate>
bool EveryEntry(const Value* list, const Predicate& ok) {
  return list->kind_case() == Value::kListValue &&
         std::all_of(list->list_value().values().begin(), list->list_value().values().end(), ok);
}

// Granite 4.0's non-hybrid models (GraniteMoeHybridForCausalLM, model_type granitemoehybrid, with
// every layer attention and no experts): Granite's model, the MLP as the shared one
// (shared_intermediate_size wide; intermediate_size is not read), RoPE where
// position_embedding_type says "rope" and none (NoPE in every block) where it is absent.
// transformers' defaults make every layer Mamba-2 and give 8 experts: a config must say
// otherwise, and Mamba-2 layers or experts (Granite 4.0-H's hybrids) are refused.
absl::Status ReadGraniteHybridConfig(const ConfigFields& f, ModelConfig& m) {
  TY_RETURN_IF_ERROR(ReadGraniteConfig(f, m));
  const char* key = f.Has("layer_types") ? "layer_types" : "layers_block_type";
  const Value* types = f.Get(key);
  if (types == nullptr) {
    return f.Bad("layer_types", "is missing (transformers then makes every layer Mamba-2)");
  }
  const bool attention_only =
      EveryEntry(types, [](const Value& v) { return v.string_value() == "attention"; }) &&
      types->list_value().values_size() == m.layers;
  if (!attention_only) {
    return f.Bad(key, absl::StrCat("must name \"attention\" for each of the ", m.layers,
                                   " layers (Trainyard does not train Granite 4.0-H's Mamba-2 "
                                   "layers)"));
  }
  int experts = 8;  // transformers' default
  TY_RETURN_IF_ERROR(f.Int("num_local_experts", &experts, /*required=*/false, /*minimum=*/0));
  if (experts != 0) {
    return f.Bad("num_local_experts", absl::StrCat("is ", experts,
                                                   "; Trainyard reads Granite 4.0's models "
                                                   "without experts (0)"));
  }
  m.ffn_hidden = 1024;  // transformers' default
  TY_RETURN_IF_ERROR(f.Int("shared_intermediate_size", &m.ffn_hidden, /*required=*/false));
  const Value* position = f.Get("position_embedding_type");
  if (position != nullptr && position->string_value() == "rope") return absl::OkStatus();
  if (position != nullptr) {
    return f.Bad("position_embedding_type", "must be \"rope\" or null (none)");
  }
  m.rope_scaling = {};
  for (int l = 0; l < m.layers; ++l) m.nope_layers.push_back(l);
  return absl::OkStatus();
}

// Qwen2's and Qwen3's sliding window applies only with use_sliding_window, and then in the layers
// from max_window_layers on (or those a layer_types list names "sliding_attention").
absl::Status ReadQwenWindow(const ConfigFields& f, ModelConfig& m) {
  bool sliding = false;
  TY_RETURN_IF_ERROR(f.Bool("use_sliding_window", &sliding));
  if (!sliding) {  // transformers drops the window: every layer must be a full one
    std::vector<int32_t> full(m.layers);
    for (int l = 0; l < m.layers; ++l) full[l] = l;
    TY_RETURN_IF_ERROR(ReadLayerTypes(f, m.layers, full));
    if (static_cast<int>(full.size()) != m.layers) {
      return f.Bad("layer_types",
                   "names sliding_attention layers, but use_sliding_window is false");
    }
    return absl::OkStatus();
  }
  int first = 28;  // transformers' default
  TY_RETURN_IF_ERROR(f.Int("max_window_layers", &first, /*required=*/false, /*minimum=*/0));
  std::vector<int32_t> full;
  for (int l = 0; l < std::min(first, m.layers); ++l) full.push_back(l);
  return ReadSlidingWindow(f, m, std::move(full));
}

// The experts (under `experts_key`) and num_experts_per_tok, at most as many.
absl::Status ReadExpertCounts(const ConfigFields& f, const std::string& experts_key,
                              config::MoeConfig& moe) {
  TY_RETURN_IF_ERROR(f.Int(experts_key, &moe.experts));
  TY_RETURN_IF_ERROR(f.Int("num_experts_per_tok", &moe.top_k));
  if (moe.top_k > moe.experts) {
    return f.Bad("num_experts_per_tok", absl::StrCat("is ", moe.top_k, ", more than the ",
                                                     moe.experts, " of ", experts_key));
  }
  return absl::OkStatus();
}

// Mixtral's experts over a Llama config (whose intermediate_size is each expert's hidden size).
absl::Status ReadMixtralConfig(const ConfigFields& f, ModelConfig& m) {
  config::MoeConfig& moe = m.moe;
  TY_RETURN_IF_ERROR(ReadExpertCounts(f, "num_local_experts", moe));
  moe.ffn = m.ffn_hidden;
  moe.normalize_top_k = true;  // Mixtral divides the top k's probabilities by their sum
  return f.Float("router_aux_loss_coef", &moe.aux_loss_coeff, /*zero_too=*/true);
}

// GraniteMoE's experts over a Granite config: Mixtral's (every block sparse, intermediate_size
// each expert's hidden size, the top k's weights a softmax over their scores alone, which is the
// full softmax's renormalised), stacked in three tensors per block (AddStackedExperts).
absl::Status ReadGraniteMoeConfig(const ConfigFields& f, ModelConfig& m) {
  config::MoeConfig& moe = m.moe;
  TY_RETURN_IF_ERROR(ReadExpertCounts(f, "num_local_experts", moe));
  moe.ffn = m.ffn_hidden;
  moe.normalize_top_k = true;
  return f.Float("router_aux_loss_coef", &moe.aux_loss_coeff, /*zero_too=*/true);
}

// OLMo 2's and OLMoE's shared fields: Llama's, with one RMSNorm over each token's whole q and one
// over its whole k (q_norm [hidden_size], k_norm [kv_heads·head_dim]); clip_qkv must be null.
absl::Status ReadOlmoConfig(const ConfigFields& f, ModelConfig& m) {
  TY_RETURN_IF_ERROR(ReadLlamaConfig(f, m));
  if (f.Get("clip_qkv") != nullptr) {
    return f.Bad("clip_qkv",
                 "is set; Trainyard does not clip q, k and v (OLMo 2 and OLMoE are published "
                 "without)");
  }
  m.qk_norm = true;
  m.qk_norm_span = config::QkNormSpan::kProjection;
  return absl::OkStatus();
}

// OLMo 2's blocks: each branch reads the residual stream itself, and its output is normed
// (post_attention_layernorm, post_feedforward_layernorm) before it joins.
absl::Status ReadOlmo2Config(const ConfigFields& f, ModelConfig& m) {
  TY_RETURN_IF_ERROR(ReadOlmoConfig(f, m));
  m.pre_norms = false;
  m.post_norms = true;
  return absl::OkStatus();
}

// OLMo 3's: OLMo 2's blocks, those layer_types names "sliding_attention" attending within
// sliding_window (transformers' default 4096), the others to every position; RoPE scaling (its
// published configs' YaRN) turns the full-attention blocks only, the windowed ones unscaled at
// rope_theta (model.rope_local_theta set to it).
absl::Status ReadOlmo3Config(const ConfigFields& f, ModelConfig& m) {
  TY_RETURN_IF_ERROR(ReadOlmo2Config(f, m));
  if (!f.Has("layer_types")) return f.Bad("layer_types", "is missing");
  int window = 4096;
  TY_RETURN_IF_ERROR(f.Int("sliding_window", &window, /*required=*/false));
  std::vector<int32_t> full;
  TY_RETURN_IF_ERROR(ReadLayerTypes(f, m.layers, full));
  // A window as long as the model still marks its blocks: their RoPE is unscaled whatever its
  // length.
  const bool sliding = static_cast<int>(full.size()) < m.layers;
  m.sliding_window = sliding && (window < m.max_seq || m.rope_scaling.enabled()) ? window : 0;
  m.full_attention_layers = m.sliding_window > 0 ? full : std::vector<int32_t>{};
  if (m.sliding_window > 0 && m.rope_scaling.enabled()) m.rope_local_theta = m.rope_theta;
  return absl::OkStatus();
}

// EXAONE 4.0's (Exaone4ForCausalLM, as EXAONE-4.0-1.2B and EXAONE-4.0-32B are published): OLMo
// 2's blocks (each branch reads the residual stream, its output normed before it joins) with
// Qwen3's query and key norms over each head before RoPE, rms_norm_eps 1e-5. With a
// sliding_window (transformers' default 4096; null for none), the blocks layer_types names
// "sliding_attention" (without the list: all but every sliding_window_pattern-th, default 4)
// attend within it and turn with RoPE, and the others attend to every position without RoPE
// (NoPE); without a window every block attends everywhere with RoPE. A window as long as the
// model's positions hides nothing, so only the NoPE blocks remain of it.
absl::Status ReadExaone4Config(const ConfigFields& f, ModelConfig& m) {
  TY_RETURN_IF_ERROR(ReadLlamaConfig(f, m, {.norm_eps = 1e-5f}));
  m.qk_norm = true;
  m.pre_norms = false;
  m.post_norms = true;
  if (f.IsNull("sliding_window")) return absl::OkStatus();
  std::vector<int32_t> full;  // without layer_types, every sliding_window_pattern-th block
  if (!f.Has("layer_types")) {
    int pattern = 4;
    TY_RETURN_IF_ERROR(f.Int("sliding_window_pattern", &pattern, /*required=*/false));
    for (int l = 0; l < m.layers; ++l) {
      if ((l + 1) % pattern == 0) full.push_back(l);
    }
  }
  return ReadTypedWindow(f, m, 4096, std::move(full), &m.nope_layers);
}

// OLMoE's: in every block Qwen3-MoE's experts of intermediate_size, the top k as scored unless
// norm_topk_prob.
absl::Status ReadOlmoeConfig(const ConfigFields& f, ModelConfig& m) {
  TY_RETURN_IF_ERROR(ReadOlmoConfig(f, m));
  config::MoeConfig& moe = m.moe;
  TY_RETURN_IF_ERROR(ReadExpertCounts(f, "num_experts", moe));
  moe.ffn = m.ffn_hidden;
  moe.normalize_top_k = false;  // transformers' default for OLMoE
  TY_RETURN_IF_ERROR(f.Bool("norm_topk_prob", &moe.normalize_top_k));
  return f.Float("router_aux_loss_coef", &moe.aux_loss_coeff, /*zero_too=*/true);
}

// Qwen3-MoE's experts over a Qwen3 config: sparse blocks every decoder_sparse_step (as
// model.moe.every counts them), dense ones of intermediate_size between, none forced dense.
absl::Status ReadQwen3MoeConfig(const ConfigFields& f, ModelConfig& m) {
  config::MoeConfig& moe = m.moe;
  TY_RETURN_IF_ERROR(ReadExpertCounts(f, "num_experts", moe));
  TY_RETURN_IF_ERROR(f.Int("moe_intermediate_size", &moe.ffn));
  moe.every = 1;
  TY_RETURN_IF_ERROR(f.Int("decoder_sparse_step", &moe.every, /*required=*/false));
  if (const Value* dense = f.Get("mlp_only_layers");
      dense != nullptr &&
      (dense->kind_case() != Value::kListValue || dense->list_value().values_size() > 0)) {
    return f.Bad("mlp_only_layers",
                 "must be empty (Trainyard places MoE blocks by "
                 "decoder_sparse_step only)");
  }
  moe.normalize_top_k = false;  // transformers' default for Qwen3-MoE
  TY_RETURN_IF_ERROR(f.Bool("norm_topk_prob", &moe.normalize_top_k));
  return f.Float("router_aux_loss_coef", &moe.aux_loss_coeff, /*zero_too=*/true);
}

// Qwen2-MoE's experts (Qwen3-MoE's keys) and its gated shared expert, whose hidden size is
// shared_expert_intermediate_size: a positive multiple of each expert's, held as that many shared
// experts. Biases on q, k and v (qkv_bias, true by default and in every published model); no
// sliding window.
absl::Status ReadQwen2MoeConfig(const ConfigFields& f, ModelConfig& m) {
  TY_RETURN_IF_ERROR(ReadQwen3MoeConfig(f, m));
  config::MoeConfig& moe = m.moe;
  int shared = 0;
  TY_RETURN_IF_ERROR(f.Int("shared_expert_intermediate_size", &shared));
  if (shared % moe.ffn != 0) {
    return f.Bad("shared_expert_intermediate_size",
                 absl::StrCat("is ", shared, ", not a multiple of moe_intermediate_size ", moe.ffn,
                              " (Trainyard holds the shared expert as that many experts' MLP)"));
  }
  moe.shared_experts = shared / moe.ffn;
  moe.shared_gate = true;
  m.qkv_bias = true;
  TY_RETURN_IF_ERROR(f.Bool("qkv_bias", &m.qkv_bias));
  if (!m.qkv_bias) {
    return f.Bad("qkv_bias", "is false; Trainyard reads Qwen2-MoE with its biases on q, k and v");
  }
  bool sliding = false;
  TY_RETURN_IF_ERROR(f.Bool("use_sliding_window", &sliding));
  if (sliding) {
    return f.Bad(
        "use_sliding_window",
        "is true; Trainyard reads Qwen2-MoE without a sliding window (as it is published)");
  }
  return absl::OkStatus();
}

constexpr ExpertKeys kGlm4MoeKeys{
    "n_routed_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
    "n_shared_experts",
    "first_k_dense_replace",
    nullptr,
    {.experts = 128, .top_k = 8, .shared_experts = 1, .dense_first = 1, .ffn = 1408},
    1};
constexpr ExpertKeys kErnieMoeKeys{
    "moe_num_experts",
    "moe_k",
    "moe_intermediate_size",
    "moe_num_shared_experts",
    "moe_layer_start_index",
    "moe_layer_interval",
    {.experts = 64, .top_k = 6, .shared_experts = 2, .dense_first = 1, .ffn = 1536},
    0};

// dots.llm1's: transformers' class has no default for the counts (0 here: each is required).
constexpr ExpertKeys kDots1Keys{
    "n_routed_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
    "n_shared_experts",
    "first_k_dense_replace",
    nullptr,
    {.experts = 0, .top_k = 0, .shared_experts = 0, .dense_first = 0, .ffn = 1408},
    1};

}  // namespace

absl::Status ReadExpertShape(const ConfigFields& f, const ExpertKeys& keys, ModelConfig& m) {
  if (keys.defaults.experts == 0) {  // the config class has no defaults for the counts
    for (const char* key : {keys.experts, keys.top_k, keys.shared}) {
      if (!f.Has(key)) return f.Bad(key, "is missing");
    }
  }
  config::MoeConfig& moe = m.moe;
  const config::MoeConfig& d = keys.defaults;
  moe.experts = d.experts;
  moe.top_k = d.top_k;
  moe.ffn = d.ffn;
  moe.shared_experts = d.shared_experts;
  moe.dense_first = d.dense_first;
  TY_RETURN_IF_ERROR(f.Int(keys.experts, &moe.experts, /*required=*/false));
  TY_RETURN_IF_ERROR(f.Int(keys.top_k, &moe.top_k, /*required=*/false));
  if (moe.top_k > moe.experts) {
    return f.Bad(keys.top_k, absl::StrCat("is ", moe.top_k, ", more than the ", moe.experts, " of ",
                                          keys.experts));
  }
  TY_RETURN_IF_ERROR(f.Int(keys.ffn, &moe.ffn, /*required=*/false));
  TY_RETURN_IF_ERROR(
      f.Int(keys.shared, &moe.shared_experts, /*required=*/false, keys.least_shared));
  TY_RETURN_IF_ERROR(f.Int(keys.dense_first, &moe.dense_first, /*required=*/false, 0));
  if (keys.every != nullptr) TY_RETURN_IF_ERROR(f.Int(keys.every, &moe.every, false));
  if (moe.MoeLayers(m.layers) == 0) {
    return f.Bad(keys.dense_first,
                 absl::StrCat("is ", moe.dense_first, ", which leaves no MoE block among the ",
                              m.layers, " of num_hidden_layers"));
  }
  return absl::OkStatus();
}

// Group-limited routing as GLM-4.5's and DeepSeek's configs give it: n_group (`groups`, GLM-4.5's
// 1) groups of experts, of which topk_group (`kept`, 1) are kept (what scores a group, the sum of
// its two best biased scores or DeepSeek-V2's best, is the caller's: moe.group_score). Every
// group kept reads as no groups.
absl::Status ReadExpertGroups(const ConfigFields& f, config::MoeConfig& moe, int groups, int kept) {
  TY_RETURN_IF_ERROR(f.Int("n_group", &groups, /*required=*/false));
  TY_RETURN_IF_ERROR(f.Int("topk_group", &kept, /*required=*/false));
  if (groups < 1 || moe.experts % groups != 0 || (groups > 1 && moe.experts / groups < 2)) {
    return f.Bad("n_group", absl::StrCat("is ", groups, ", which does not divide the ", moe.experts,
                                         " experts into groups of at least two"));
  }
  if (kept < 1 || kept > groups) {
    return f.Bad("topk_group", absl::StrCat("is ", kept, ", outside 1 to n_group ", groups));
  }
  if (kept * (moe.experts / groups) < moe.top_k) {
    return f.Bad(
        "topk_group",
        absl::StrCat("keeps ", kept, " of n_group ", groups, " groups of ", moe.experts / groups,
                     " experts, fewer than num_experts_per_tok ", moe.top_k));
  }
  if (kept < groups) moe.groups = groups, moe.group_top_k = kept;
  return absl::OkStatus();
}

namespace {

// GLM-4.5's (Glm4MoeForCausalLM, as GLM-4.5, GLM-4.5-Air and GLM-4.6 are published): Llama's
// attention with biases on q, k and v when attention_bias (default false), query and key norms
// over each head with use_qk_norm (default false), RoPE over the first partial_rotary_factor (0.5)
// of each head in Llama's halves (not GLM's pairs), plain RoPE only, rms_norm_eps 1e-5 unless the
// config says otherwise. Its first first_k_dense_replace (1) blocks keep a dense MLP of
// intermediate_size (model.moe.dense_first); the others hold n_routed_experts (128) experts of
// moe_intermediate_size (1408), of which each token takes the num_experts_per_tok (8) of highest
// sigmoid score plus the selection bias e_score_correction_bias (balance: bias), weighed by their
// scores, divided by their sum with norm_topk_prob (true), times routed_scaling_factor (1), beside
// n_shared_experts (1) shared experts. With topk_group (1) below n_group (1), a token's picks come
// from the topk_group groups of highest group score only (model.moe.groups and group_top_k).
absl::Status ReadGlm4MoeConfig(const ConfigFields& f, ModelConfig& m) {
  TY_RETURN_IF_ERROR(ReadLlamaConfig(f, m, {.norm_eps = 1e-5f, .qkv_attention_bias = false}));
  if (m.rope_scaling.enabled()) {
    return f.Bad("rope_scaling", "must be null (Trainyard reads GLM-4.5's plain RoPE only)");
  }
  TY_RETURN_IF_ERROR(ReadPartialRotary(f, 0.5, m));
  TY_RETURN_IF_ERROR(f.Bool("use_qk_norm", &m.qk_norm));
  TY_RETURN_IF_ERROR(ReadExpertShape(f, kGlm4MoeKeys, m));
  config::MoeConfig& moe = m.moe;
  moe.score = config::MoeScore::kSigmoid;
  moe.balance = config::MoeBalance::kBias;
  moe.normalize_top_k = true;
  TY_RETURN_IF_ERROR(f.Bool("norm_topk_prob", &moe.normalize_top_k));
  TY_RETURN_IF_ERROR(f.Float("routed_scaling_factor", &moe.routed_scale));
  return ReadExpertGroups(f, moe);
}

// MiniMax-M2's (MiniMaxM2ForCausalLM, model_type minimax_m2): in every block Llama's attention
// with one RMSNorm over each token's whole q and one over its whole k (use_qk_norm,
// qk_norm_type "per_layer"), RoPE over the first rotary_dim dimensions of each head in Llama's
// halves (or partial_rotary_factor's, as transformers 5 writes it), and Mixtral's experts
// (num_local_experts of intermediate_size, num_experts_per_tok per token) picked by sigmoid score
// plus the selection bias e_score_correction_bias (scoring_func "sigmoid", use_routing_bias:
// balance: bias), weighed by their scores divided by their sum. No shared experts, no dense or
// linear-attention blocks (attn_type_list all 1), no window. Its multi-token prediction modules
// are not read.
absl::Status ReadMiniMaxM2Config(const ConfigFields& f, ModelConfig& m) {
  TY_RETURN_IF_ERROR(ReadLlamaConfig(f, m, {.rope_theta = 5000000.0f}));
  if (m.rope_scaling.enabled()) {
    return f.Bad("rope_scaling", "must be null (Trainyard reads MiniMax-M2's plain RoPE only)");
  }
  if (f.Has("rotary_dim")) {
    int rotary = 0;
    TY_RETURN_IF_ERROR(f.Int("rotary_dim", &rotary));
    if (rotary > m.head_dim() || rotary % 2 != 0) {
      return f.Bad("rotary_dim", absl::StrCat("must be even and at most head_dim ", m.head_dim()));
    }
    m.rope_dim = rotary == m.head_dim() ? 0 : rotary;
  } else {
    TY_RETURN_IF_ERROR(ReadPartialRotary(f, 1.0, m));
  }
  bool norms = true, bias = true;
  TY_RETURN_IF_ERROR(f.Bool("use_qk_norm", &norms));
  TY_RETURN_IF_ERROR(f.Bool("use_routing_bias", &bias));
  if (!norms) return f.Bad("use_qk_norm", "must be true (MiniMax-M2's norms of q and k)");
  if (!bias) return f.Bad("use_routing_bias", "must be true (MiniMax-M2's selection bias)");
  TY_RETURN_IF_ERROR(f.OneOf("qk_norm_type", {"per_layer"}));
  TY_RETURN_IF_ERROR(f.OneOf("scoring_func", {"sigmoid"}));
  int shared = 0;
  TY_RETURN_IF_ERROR(f.Int("shared_intermediate_size", &shared, /*required=*/false, 0));
  if (shared != 0) return f.Bad("shared_intermediate_size", "must be 0 (no shared experts)");
  if (f.Get("sliding_window") != nullptr) return f.Bad("sliding_window", "must be null");
  if (const Value* types = f.Get("attn_type_list"); types != nullptr) {
    if (!EveryEntry(types, [](const Value& v) { return v.number_value() == 1; })) {
      return f.Bad("attn_type_list", "must be all 1 (Trainyard has no linear-attention blocks)");
    }
  }
  m.qk_norm = true;
  m.qk_norm_span = config::QkNormSpan::kProjection;
  TY_RETURN_IF_ERROR(ReadMixtralConfig(f, m));
  m.moe.score = config::MoeScore::kSigmoid;
  m.moe.balance = config::MoeBalance::kBias;
  return absl::OkStatus();
}

// dots.llm1's (Dots1ForCausalLM, as dots.llm1.base and dots.llm1.inst are published): Qwen3's
// attention (per-head query and key norms, no biases) over DeepSeek-V3's mixture of experts as
// GLM-4.5 reads it, with its own defaults: n_routed_experts, num_experts_per_tok and
// n_shared_experts required, first_k_dense_replace 0, norm_topk_prob false. Its sliding window:
// the blocks layer_types names "sliding_attention", or without the list those from
// max_window_layers (62) on, unless sliding_window (4096) is null.
absl::Status ReadDots1Config(const ConfigFields& f, ModelConfig& m) {
  TY_RETURN_IF_ERROR(ReadLlamaConfig(f, m));
  m.qk_norm = true;
  TY_RETURN_IF_ERROR(ReadExpertShape(f, kDots1Keys, m));
  config::MoeConfig& moe = m.moe;
  moe.score = config::MoeScore::kSigmoid;
  moe.balance = config::MoeBalance::kBias;
  TY_RETURN_IF_ERROR(f.Bool("norm_topk_prob", &moe.normalize_top_k));
  TY_RETURN_IF_ERROR(f.Float("routed_scaling_factor", &moe.routed_scale));
  TY_RETURN_IF_ERROR(ReadExpertGroups(f, moe));
  int from = 62;
  TY_RETURN_IF_ERROR(f.Int("max_window_layers", &from, /*required=*/false, 0));
  std::vector<int32_t> full;
  for (int l = 0; l < std::min(from, m.layers); ++l) full.push_back(l);
  return ReadTypedWindow(f, m, 4096, std::move(full));
}

// ERNIE 4.5's MoE (Ernie4_5_MoeForCausalLM, as ERNIE-4.5-21B-A3B and ERNIE-4.5-300B-A47B are
// published): ERNIE 4.5's attention and RoPE (ReadErnieConfig's, heads hidden_size /
// num_attention_heads wide unless head_dim says otherwise, rms_norm_eps 1e-5), and an MoE block
// every moe_layer_interval (1) from moe_layer_start_index (1) to moe_layer_end_index (-1: the
// last block), as model.moe.every and dense_first place them: moe_num_experts (64) experts of
// moe_intermediate_size (1536), of which each token takes the moe_k (6) of highest softmax
// probability plus the selection bias moe_statics.e_score_correction_bias (balance: bias), weighed
// by their probabilities divided by their sum, beside moe_num_shared_experts (2) shared ones. A
// sum below moe_norm_min (1e-12) cannot happen: k picks of a softmax over E experts hold at least
// k / E. The multi-token prediction tensors (model.mtp_*) are not read.
absl::Status ReadErnieMoeConfig(const ConfigFields& f, ModelConfig& m) {
  TY_RETURN_IF_ERROR(
      ReadLlamaConfig(f, m, {.rope_theta = 500000.0f, .norm_eps = 1e-5f, .tied_embeddings = true}));
  bool biased = false;
  TY_RETURN_IF_ERROR(f.Bool("use_bias", &biased));
  if (biased) return f.Bad("use_bias", "must be false (Trainyard reads ERNIE 4.5 without biases)");
  if (m.rope_scaling.enabled()) {
    return f.Bad("rope_scaling", "must be null (Trainyard reads ERNIE 4.5's plain RoPE only)");
  }
  if (const Value* end = f.Get("moe_layer_end_index");
      end != nullptr && end->number_value() != -1 && end->number_value() < m.layers - 1) {
    return f.Bad("moe_layer_end_index",
                 absl::StrCat("must be -1 or reach the last block, ", m.layers - 1,
                              " (Trainyard places MoE blocks up to the last)"));
  }
  TY_RETURN_IF_ERROR(ReadExpertShape(f, kErnieMoeKeys, m));
  config::MoeConfig& moe = m.moe;
  moe.score = config::MoeScore::kSoftmax;
  moe.balance = config::MoeBalance::kBias;
  moe.normalize_top_k = true;
  return absl::OkStatus();
}

}  // namespace

std::vector<int64_t> HfShape(const HfTensorMap& tensor, const HfPiece& piece) {
  if (!piece.shape.empty()) return piece.shape;
  if (tensor.shape.size() == 1) return {piece.rows};
  if (tensor.shape.size() == 3) return {piece.rows * tensor.shape[1], tensor.shape[2]};
  const int64_t cols = tensor.shape[1];
  return piece.transpose ? std::vector<int64_t>{cols, piece.rows}
                         : std::vector<int64_t>{piece.rows, cols};
}

namespace {

// The block a stored tensor model.layers.N.… belongs to: N, or −1 for another name.
int StoredLayer(const std::string& stored) {
  constexpr absl::string_view kPrefix = "model.layers.";
  if (!absl::StartsWith(stored, kPrefix)) return -1;
  const absl::string_view rest = absl::string_view(stored).substr(kPrefix.size());
  int layer = 0;
  return absl::SimpleAtoi(rest.substr(0, rest.find('.')), &layer) ? layer : -1;
}

}  // namespace

std::optional<std::string> HfLookupName(const std::string& stored, config::ModelFamily family,
                                        const HfLayout& layout) {
  if (family == ModelFamily::kGpt2 && absl::StartsWith(stored, "transformer.")) {
    return stored.substr(std::strlen("transformer."));
  }
  if (layout.unread_layers_from > 0 && StoredLayer(stored) >= layout.unread_layers_from) {
    return std::nullopt;
  }
  if (!layout.unread_prefix.empty() && absl::StartsWith(stored, layout.unread_prefix)) {
    return std::nullopt;
  }
  if (!layout.multimodal) return stored;
  constexpr std::pair<const char*, const char*> kLanguageModel[] = {
      {"language_model.model.", "model."},
      {"model.language_model.", "model."},
      {"language_model.lm_head.", "lm_head."}};
  for (const auto& [prefix, replacement] : kLanguageModel) {
    if (absl::StartsWith(stored, prefix)) {
      return absl::StrCat(replacement, stored.substr(std::strlen(prefix)));
    }
  }
  for (const char* prefix : {"vision_tower.", "multi_modal_projector.", "model.vision_tower.",
                             "model.multi_modal_projector."}) {
    if (absl::StartsWith(stored, prefix)) return std::nullopt;
  }
  return stored;
}

int64_t RowElements(const HfTensorMap& tensor) {
  int64_t n = 1;
  for (size_t i = 1; i < tensor.shape.size(); ++i) n *= tensor.shape[i];
  return n;
}

namespace {

// partial_rotary_factor: rope_dim / head_dim, written with the digits that make transformers'
// int(head_dim · factor) give rope_dim back (CheckPhi3Layout refuses a ratio that does not).
std::string PartialRotaryJson(const ModelConfig& m) {
  return absl::StrFormat("%.17g", static_cast<double>(m.rotary_dim()) / m.head_dim());
}

// OK when transformers' int(head_dim · partial_rotary_factor), of the factor as written, gives
// the model's rotated dimensions back; else `bad`'s refusal of model.rope_dim.
template <typename Refusal>
absl::Status CheckPartialRotaryReadsBack(const ModelConfig& m, const Refusal& bad) {
  const double factor = std::strtod(PartialRotaryJson(m).c_str(), nullptr);
  if (static_cast<int>(std::floor(m.head_dim() * factor)) == m.rotary_dim()) {
    return absl::OkStatus();
  }
  return bad("rope_dim", absl::StrCat("is ", m.rope_dim, ", which no partial_rotary_factor of ",
                                      "head_dim ", m.head_dim(), " gives back"));
}

// What neither GLM-4.5's nor ERNIE 4.5's MoE layout holds: gated shared experts, Gemma's, OLMo's
// or Granite's options, scaled RoPE, NoPE blocks or a window.
template <typename Refusal>
absl::Status CheckDeepSeekStyleModel(const ModelConfig& m, const Refusal& bad) {
  if (m.moe.shared_gate) return bad("moe.shared_gate", "is true");
  if (m.geglu || m.scale_embeddings || m.post_norms || !m.pre_norms || m.attention_scale_dim != 0 ||
      m.attention_softcap != 0 || m.logit_softcap != 0) {
    return bad("activation", "or the norms or scores are Gemma's or OLMo's");
  }
  if (m.HasGraniteMultipliers()) return bad(m.GraniteField(), "is set");
  if (m.rope_scaling.enabled()) return bad("rope_scaling", "is set");
  if (!m.nope_layers.empty()) return bad("nope_layers", "is set");
  if (m.sliding_window > 0) return bad("sliding_window", absl::StrCat("is ", m.sliding_window));
  return absl::OkStatus();
}

// GLM-4.5's layout (IsGlm4Moe) holds a Llama MoE model with sigmoid scores and a selection bias,
// every block past the dense first ones an MoE block with ungated shared experts, plain RoPE over
// any even part of each head, q, k and v biases and per-head query and key norms or not; no
// other option of the family.
absl::Status CheckGlm4MoeLayout(const ModelConfig& m) {
  const config::MoeConfig& moe = m.moe;
  auto bad = [](const std::string& field, const std::string& why) {
    return absl::UnimplementedError(absl::StrCat(
        "model.", field, ": ", why,
        "; Trainyard writes a mixture of experts with sigmoid scores, a selection bias, dense "
        "first blocks, scaled weights or expert groups in GLM-4.5's layout only (score: sigmoid, "
        "balance: bias, every: 1, shared experts ungated, plain RoPE, per-head query and key "
        "norms or none, no sliding window, Gemma's, Granite's or OLMo's options)"));
  };
  if (moe.score != config::MoeScore::kSigmoid) return bad("moe.score", "is softmax");
  if (!moe.has_bias()) return bad("moe.balance", "is aux_loss (GLM-4.5's routers hold a bias)");
  if (moe.limits_groups() && moe.group_score == config::GroupScore::kMax) {
    return bad("moe.group_score", "is max (GLM-4.5 scores a group by its two best)");
  }
  if (moe.every != 1) return bad("moe.every", absl::StrCat("is ", moe.every));
  if (moe.shared_experts < 1) return bad("moe.shared_experts", "is 0");
  TY_RETURN_IF_ERROR(CheckDeepSeekStyleModel(m, bad));
  if (m.qk_norm && m.NormsWholeProjection()) return bad("qk_norm_span", "is projection");
  return CheckPartialRotaryReadsBack(m, bad);
}

// ERNIE 4.5's MoE layout (IsErnieMoe) holds a Llama MoE model with softmax scores picked with a
// selection bias, normalised and unscaled, in no expert groups, MoE blocks every `every` past
// `dense_first`, shared experts ungated (or none), RoPE over each whole head in neighbouring pairs
// (HfTensors interleaves q's and k's rows), no biases, query and key norms or other option of the
// family.
absl::Status CheckErnieMoeLayout(const ModelConfig& m) {
  const config::MoeConfig& moe = m.moe;
  auto bad = [](const std::string& field, const std::string& why) {
    return absl::UnimplementedError(absl::StrCat(
        "model.", field, ": ", why,
        "; Trainyard writes a mixture of experts with softmax scores and a selection bias in "
        "ERNIE 4.5's MoE layout only (normalize_top_k, routed_scale 1, no expert groups, shared "
        "experts ungated, plain RoPE over each whole head, no biases, query and key norms, "
        "sliding window, Gemma's, Granite's or OLMo's options)"));
  };
  if (!moe.normalize_top_k) return bad("moe.normalize_top_k", "is false");
  if (moe.routed_scale != 1.0f) {
    return bad("moe.routed_scale", absl::StrCat("is ", moe.routed_scale));
  }
  if (moe.limits_groups()) {
    return bad("moe.group_top_k",
               absl::StrCat("keeps ", moe.group_top_k, " of ", moe.groups, " expert groups"));
  }
  if (m.qkv_bias) return bad("qkv_bias", "is true");
  if (m.qk_norm) return bad("qk_norm", "is true");
  if (m.rotary_dim() != m.head_dim()) return bad("rope_dim", absl::StrCat("is ", m.rope_dim));
  return CheckDeepSeekStyleModel(m, bad);
}

// Mixture-of-experts models travel as Mixtral (a Llama model, every block MoE) or, with query
// and key norms, as Qwen3-MoE (MoE blocks every `every`, top-k renormalised or not).
// MiniMax-M2's layout holds a Llama model without biases, Gemma's, Granite's or OLMo 2's options,
// plain RoPE over whole heads or a part of each, no NoPE blocks or window, norms over the whole q
// and k, and in every block experts picked by sigmoid score plus a selection bias, weighed by
// their normalised scores, without shared experts, groups or a routed scale.
absl::Status CheckMiniMaxM2Layout(const ModelConfig& m) {
  const config::MoeConfig& moe = m.moe;
  auto bad = [](const std::string& field, const std::string& why) {
    return absl::UnimplementedError(absl::StrCat(
        "model.", field, ": ", why,
        "; Trainyard writes sigmoid-scored experts with norms over the whole q and k in "
        "MiniMax-M2's layout only (no biases, Gemma's, Granite's or OLMo 2's options, plain "
        "RoPE, NoPE blocks or window; every block MoE with balance: bias, normalize_top_k, no "
        "shared experts, groups or routed scale)"));
  };
  if (m.qkv_bias) return bad("qkv_bias", "is true");
  if (HasGemmaOrGraniteOptions(m) || !m.pre_norms || m.post_norms) {
    return bad("activation",
               "or the norms, scores or multipliers are Gemma's, Granite's or OLMo's");
  }
  if (m.rope_scaling.enabled() || !m.nope_layers.empty() || m.sliding_window > 0) {
    return bad("rope_scaling", "or nope_layers or sliding_window is set");
  }
  if (moe.every != 1 || moe.dense_first != 0) return bad("moe.every", "leaves blocks dense");
  if (moe.shared_experts != 0 || moe.shared_gate) return bad("moe.shared_experts", "is set");
  if (moe.limits_groups() || moe.routed_scale != 1.0f) {
    return bad("moe.groups", "or model.moe.routed_scale is set");
  }
  if (!moe.normalize_top_k) return bad("moe.normalize_top_k", "is false");
  if (moe.balance != config::MoeBalance::kBias) return bad("moe.balance", "is not bias");
  return absl::OkStatus();
}

absl::Status CheckMoeLayout(const ModelConfig& m) {
  const config::MoeConfig& moe = m.moe;
  auto bad = [](const std::string& field, const std::string& why) {
    return absl::UnimplementedError(absl::StrCat(
        "model.moe", field, ": ", why,
        "; Trainyard writes and reads mixture-of-experts models in Hugging Face's Mixtral layout "
        "only (a Llama model, every block MoE, no shared experts, softmax scores with "
        "normalize_top_k, balance: aux_loss; with Granite's multipliers GraniteMoE's), or with "
        "model.qk_norm in Qwen3-MoE's (MoE blocks every `every`, normalize_top_k either way; "
        "OLMoE's with qk_norm_span: projection), or "
        "with model.moe.shared_gate in Qwen2-MoE's (Qwen3-MoE's experts with q, k and v biases, "
        "no sliding window, and the gated shared experts)"));
  };
  if (m.family != ModelFamily::kLlama) return bad("", "a GPT-2 model has MoE blocks");
  if (IsMiniMaxM2(m)) return CheckMiniMaxM2Layout(m);
  if (IsGlm4Moe(m)) return CheckGlm4MoeLayout(m);
  if (IsErnieMoe(m)) return CheckErnieMoeLayout(m);
  // From here on: softmax scores without a selection bias.
  const bool qwen = m.qk_norm || moe.shared_gate;  // Qwen3-MoE's or Qwen2-MoE's
  if (moe.every != 1 && !qwen) return bad(".every", absl::StrCat("is ", moe.every));
  if (moe.shared_experts != 0 && !moe.shared_gate) {
    return bad(".shared_experts", absl::StrCat("is ", moe.shared_experts, " and ungated"));
  }
  if (!moe.normalize_top_k && !qwen) return bad(".normalize_top_k", "is false");
  if (moe.shared_gate && !m.qkv_bias) return bad(".shared_gate", "is set without model.qkv_bias");
  if (moe.shared_gate && m.sliding_window > 0) {
    return bad(".shared_gate", "is set with model.sliding_window");
  }
  if (m.qkv_bias && !moe.shared_gate) {
    return absl::UnimplementedError(
        "model.qkv_bias: a mixture-of-experts model with biases on q, k and v has no Hugging "
        "Face layout Trainyard writes but Qwen2-MoE's, whose shared experts are gated "
        "(model.moe.shared_gate); neither Mixtral's nor Qwen3-MoE's has them");
  }
  return absl::OkStatus();
}

// GeGLU and scaled embeddings travel together, as Gemma (whose model has none of the Llama
// family's other options) or, with norms of the branches' outputs, as Gemma 2 or (with query and
// key norms and local blocks) Gemma 3; norms of the branches' outputs travel only so.
absl::Status CheckGemmaLayout(const ModelConfig& m) {
  // OLMo 2's norms after each branch only are CheckOlmoLayout's.
  const bool gemma_norms = m.post_norms && m.pre_norms;
  if (m.family != ModelFamily::kLlama || (!m.geglu && !m.scale_embeddings && !gemma_norms)) {
    return absl::OkStatus();
  }
  auto bad = [](const std::string& field, const std::string& why) {
    return absl::UnimplementedError(absl::StrCat(
        "model.", field, ": ", why,
        "; Trainyard writes and reads a Llama model with GeGLU, scaled embeddings or post_norms "
        "in Gemma's layout only (model.activation geglu and model.scale_embeddings together, no "
        "biases, query and key norms, sliding window, RoPE scaling or MoE blocks), Gemma 2's "
        "(those with post_norms, no biases, RoPE scaling or MoE blocks) or Gemma 3's (with "
        "qk_norm and a sliding_window too)"));
  };
  if (!m.geglu) return bad("activation", "is swiglu with scale_embeddings or post_norms");
  if (!m.scale_embeddings) return bad("scale_embeddings", "is false with activation geglu");
  if (m.qkv_bias) return bad("qkv_bias", "is true");
  if (m.rope_scaling.enabled() && !(m.post_norms && m.qk_norm && m.rope_scaling.linear)) {
    return bad("rope_scaling", "is set (Gemma 3's global blocks take linear scaling only)");
  }
  if (m.rope_scaling.enabled() && m.rope_local_theta == 0) {
    return bad("rope_local_theta",
               "is 0 with rope_scaling (Gemma 3's local blocks turn unscaled, "
               "at rope_local_base_freq)");
  }
  if (m.moe.enabled()) return bad("moe", "has experts");
  if (!m.post_norms) {  // Gemma's
    if (m.qk_norm) return bad("qk_norm", "is true without post_norms");
    if (m.sliding_window != 0) return bad("sliding_window", absl::StrCat("is ", m.sliding_window));
    return absl::OkStatus();
  }
  if (m.qk_norm && m.sliding_window == 0) {
    return bad("sliding_window", "is none with post_norms and qk_norm");
  }
  if (!m.qk_norm && m.rope_local_theta != 0) {
    return bad("rope_local_theta",
               "is set with post_norms but without qk_norm (Gemma 2's blocks "
               "share one RoPE base)");
  }
  return absl::OkStatus();
}

// Norms over the whole q and k projection, and blocks without norms before their branches,
// travel as OLMoE, OLMo 2 or OLMo 3 only: a Llama model of heads width / heads wide without
// biases, Gemma's or Granite's options, partial RoPE or NoPE blocks; OLMoE's every block an MoE
// block of Qwen3-MoE's experts without shared experts, normed before each branch, without a
// window; OLMo 2's dense, normed after each branch only; OLMo 3's the same with a window, whose
// blocks turn unscaled at rope_theta (CheckMoeLayout refuses the rest).
absl::Status CheckOlmoLayout(const ModelConfig& m) {
  if (!m.NormsWholeProjection() && m.pre_norms) return absl::OkStatus();
  auto bad = [](const std::string& field, const std::string& why) {
    return absl::UnimplementedError(absl::StrCat(
        "model.", field, ": ", why,
        "; Trainyard writes query and key norms over the whole projection "
        "(model.qk_norm_span: projection) and blocks without norms before their branches "
        "(model.pre_norms: false) in OLMoE's, OLMo 2's and OLMo 3's layouts only (a Llama model "
        "with heads of width / heads, no biases, Gemma's or Granite's options, partial RoPE or "
        "NoPE blocks; OLMoE's every block an MoE block without shared experts, normed before "
        "each branch, without a window; OLMo 2's dense, normed after each branch only, and OLMo "
        "3's the same with a window in some blocks, which turn unscaled at rope_theta)"));
  };
  if (!m.NormsWholeProjection()) {  // per-head norms are EXAONE 4.0's (IsExaone4)
    return bad("qk_norm", "is false, and model.pre_norms is false");
  }
  if (m.explicit_head_dim != 0 && m.explicit_head_dim * m.heads != m.width) {
    return bad("head_dim", absl::StrCat("is ", m.explicit_head_dim));
  }
  if (m.qkv_bias) return bad("qkv_bias", "is true");
  if (HasGemmaOrGraniteOptions(m)) {
    return bad("activation", "or the scores or multipliers are Gemma's or Granite's");
  }
  if (m.rotary_dim() != m.head_dim() || m.rope_scaling.longrope || !m.nope_layers.empty()) {
    return bad("rope_dim", "or rope_scaling or nope_layers leave RoPE Llama's");
  }
  if (!m.pre_norms) {  // OLMo 2's (model validation: post_norms with it), OLMo 3's with a window
    if (m.moe.enabled()) return bad("moe", "has experts, and model.pre_norms is false");
    // OLMo 3's windowed blocks turn at rope_theta, unscaled.
    const float local = m.rope_scaling.enabled() ? m.rope_theta : 0.0f;
    if (m.sliding_window > 0 && m.rope_local_theta != local && m.rope_local_theta != m.rope_theta) {
      return bad(
          "rope_local_theta",
          m.rope_scaling.enabled()
              ? absl::StrCat("is ", m.rope_local_theta,
                             " (OLMo 3's windowed blocks turn unscaled at rope_theta, ",
                             m.rope_theta, ")")
              : absl::StrCat("is ", m.rope_local_theta, " (OLMo 3's blocks share one base)"));
    }
    return absl::OkStatus();
  }
  if (m.sliding_window > 0) return bad("sliding_window", absl::StrCat("is ", m.sliding_window));
  if (!m.moe.enabled()) {
    return bad("moe",
               "is absent, and model.pre_norms is true (OLMo 2's dense blocks are normed "
               "after each branch only)");
  }
  if (m.post_norms) return bad("post_norms", "is true with experts");
  if (m.moe.every != 1) return bad("moe.every", absl::StrCat("is ", m.moe.every));
  if (m.moe.shared_experts != 0) {
    return bad("moe.shared_experts", absl::StrCat("is ", m.moe.shared_experts));
  }
  return absl::OkStatus();
}

// EXAONE 4.0's layout (IsExaone4) holds a dense Llama model with SwiGLU, no biases, Gemma's or
// Granite's options, RoPE over each whole head at one base (scaled or not), and either no NoPE
// blocks and no window, or NoPE blocks exactly where a window leaves blocks attending to every
// position (without a window, the NoPE blocks are written as such under a window as long as
// the positions).
absl::Status CheckExaone4Layout(const ModelConfig& m) {
  auto bad = [](const std::string& field, const std::string& why) {
    return absl::UnimplementedError(absl::StrCat(
        "model.", field, ": ", why,
        "; Trainyard writes per-head query and key norms in blocks without norms before their "
        "branches (model.pre_norms: false) in EXAONE 4.0's layout only (a dense Llama model "
        "with SwiGLU, no biases, Gemma's or Granite's options or partial RoPE, one RoPE base, "
        "and NoPE blocks exactly where a sliding window leaves blocks attending to every "
        "position)"));
  };
  if (m.moe.enabled()) return bad("moe", "has experts");
  if (m.qkv_bias) return bad("qkv_bias", "is true");
  if (HasGemmaOrGraniteOptions(m)) {
    return bad("activation", "or the scores or multipliers are Gemma's or Granite's");
  }
  if (m.rotary_dim() != m.head_dim()) return bad("rope_dim", absl::StrCat("is ", m.rope_dim));
  if (m.rope_scaling.longrope) return bad("rope_scaling", "is LongRoPE");
  if (m.rope_local_theta != 0) {
    return bad("rope_local_theta", absl::StrCat("is ", m.rope_local_theta));
  }
  for (int l = 0; l < m.layers && m.sliding_window > 0; ++l) {
    if ((m.WindowOf(l) > 0) != m.RotatesLayer(l)) {
      return bad(
          "nope_layers",
          absl::StrCat("does not name exactly the blocks outside the window (block ", l, ")"));
    }
  }
  return absl::OkStatus();
}

// Scores scaled other than by 1/√head_dim, or soft caps, travel as Gemma 2 or 3 only.
absl::Status CheckScoresLayout(const ModelConfig& m) {
  if (IsGemma(m) && m.post_norms) return absl::OkStatus();
  for (const auto& [set, field] : {std::pair{m.attention_scale_dim != 0, "attention_scale_dim"},
                                   std::pair{m.attention_softcap != 0, "attention_softcap"},
                                   std::pair{m.logit_softcap != 0, "logit_softcap"}}) {
    if (!set) continue;
    return absl::UnimplementedError(absl::StrCat(
        "model.", field,
        " is set; Trainyard writes and reads scaled or soft-capped scores in Gemma 2's and "
        "Gemma 3's layouts only (a Llama model with GeGLU, scaled embeddings and post_norms)"));
  }
  return absl::OkStatus();
}

// Whether a layout holds `m`: DeepSeek-V3's its latent attention, the others the rest.
absl::Status CheckTensorLayout(const ModelConfig& m, const HfLayout& layout) {
  if (m.latent.enabled()) return CheckDeepseekLayout(m);
  // MiniMax-M2's norms over the whole q and k are CheckMoeLayout's.
  TY_RETURN_IF_ERROR(IsExaone4(m)     ? CheckExaone4Layout(m)
                     : IsMiniMaxM2(m) ? absl::OkStatus()
                                      : CheckOlmoLayout(m));
  if (!layout.glm) TY_RETURN_IF_ERROR(CheckGemmaLayout(m));  // GLM-4's norms are Gemma 2's
  TY_RETURN_IF_ERROR(CheckScoresLayout(m));
  if (m.moe.enabled()) TY_RETURN_IF_ERROR(CheckMoeLayout(m));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<HfTensorMap>> HfTensors(const ModelConfig& m, const HfLayout& layout) {
  TY_RETURN_IF_ERROR(CheckTensorLayout(m, layout));
  if (m.moe.enabled() && m.moe.shared_gate != (layout.experts == HfExperts::kQwen2Moe)) {
    return absl::InvalidArgumentError(
        m.moe.shared_gate
            ? "model.moe.shared_gate: its experts are stored in Qwen2-MoE's layout only"
            : "Qwen2-MoE's layout stores gated shared experts; model.moe.shared_gate "
              "is false");
  }
  if (m.qkv_bias && m.qk_norm && !IsGlm4Moe(m)) {
    return absl::UnimplementedError(
        "model.qk_norm with model.qkv_bias has no Hugging Face layout Trainyard writes (Qwen2 has "
        "no query and key norms; Qwen3's attention_bias puts a bias on o_proj too)");
  }
  std::vector<HfTensorMap> out;
  const int64_t c = m.width, v = m.vocab;
  if (m.family == ModelFamily::kGpt2) {
    out.push_back(Whole("wte", {v, c}, "wte.weight"));
    out.push_back(Whole("wpe", {m.max_seq, c}, "wpe.weight"));
    for (int l = 0; l < m.layers; ++l) AddGpt2Block(m, l, out);
    out.push_back(Whole("lnf.w", {c}, "ln_f.weight"));
    out.push_back(Whole("lnf.b", {c}, "ln_f.bias"));
  } else {
    out.push_back(Whole("wte", {v, c}, "model.embed_tokens.weight"));
    for (int l = 0; l < m.layers; ++l) AddLlamaBlock(m, l, layout, out);
    out.push_back(Norm(m, "lnf.w", c, "model.norm.weight"));
  }
  if (!m.tied_embeddings) out.push_back(Whole("lm_head.w", {v, c}, "lm_head.weight"));
  return out;
}

absl::StatusOr<std::vector<HfTensorMap>> HfTensors(const ModelConfig& m) {
  return HfTensors(m, HfExportLayout(m));
}

int64_t TheirRow(const HfPiece& piece, int64_t row) {
  if (piece.head_rows == 0) return row;
  const int64_t head = row / piece.head_rows, i = row % piece.head_rows, r = piece.rope_rows;
  int64_t theirs;
  if (i >= piece.our_rope_at && i < piece.our_rope_at + r) {  // a rotary row
    const int64_t j = i - piece.our_rope_at, half = r / 2;
    theirs = piece.their_rope_at + (!piece.pairs ? j : j < half ? 2 * j : 2 * (j - half) + 1);
  } else {  // the head's other rows keep their order around the rotary ones
    const int64_t other = i < piece.our_rope_at ? i : i - r;
    theirs = other < piece.their_rope_at ? other : other + r;
  }
  return head * piece.head_rows + theirs;
}

bool Reorders(const HfPiece& piece) { return piece.transpose || piece.head_rows != 0; }

void ToHf(const HfTensorMap& tensor, const HfPiece& piece, const float* ours, float* theirs) {
  const int64_t cols = RowElements(tensor), count = piece.rows * cols;
  const float* from = ours + piece.row_begin * cols;
  if (piece.transpose) {
    Transpose(from, piece.rows, cols, theirs);
  } else {
    for (int64_t r = 0; r < piece.rows; ++r) {
      std::copy(from + r * cols, from + (r + 1) * cols, theirs + TheirRow(piece, r) * cols);
    }
  }
  if (tensor.shift != 0.0f) {
    for (int64_t i = 0; i < count; ++i) theirs[i] -= tensor.shift;
  }
}

void FromHf(const HfTensorMap& tensor, const HfPiece& piece, const float* theirs, float* ours) {
  const int64_t cols = RowElements(tensor), count = piece.rows * cols;
  float* to = ours + piece.row_begin * cols;
  if (piece.transpose) {
    Transpose(theirs, cols, piece.rows, to);
  } else {
    for (int64_t r = 0; r < piece.rows; ++r) {
      const float* row = theirs + TheirRow(piece, r) * cols;
      std::copy(row, row + cols, to + r * cols);
    }
  }
  if (tensor.shift != 0.0f) {
    for (int64_t i = 0; i < count; ++i) to[i] += tensor.shift;
  }
}

namespace {

// config.json's opening, shared by Llama's, SmolLM3's and Gemma's layouts: the architecture and
// model type, then the shape through rope_theta; `sizes` holds the MLPs' fields after hidden_size.
std::string LlamaShapeJson(const ModelConfig& m, const std::string& architecture,
                           const std::string& type, const std::string& sizes) {
  return absl::StrCat(
      "{\n  \"architectures\": [\"", architecture, "\"],\n  \"model_type\": \"", type, "\",\n",
      "  \"vocab_size\": ", m.vocab, ",\n  \"hidden_size\": ", m.width, sizes,
      ",\n  \"num_hidden_layers\": ", m.layers, ",\n  \"num_attention_heads\": ", m.heads,
      ",\n  \"num_key_value_heads\": ", m.kv_heads, ",\n  \"head_dim\": ", m.head_dim(),
      ",\n  \"max_position_embeddings\": ", HfMaxPositions(m),
      ",\n  \"rms_norm_eps\": ", ShortFloat(m.norm_eps),
      ",\n  \"rope_theta\": ", ShortFloat(m.rope_theta));
}

// layer_types' entries: each block "sliding_attention" where it has a window, else
// "full_attention".
std::string LayerTypesJson(const ModelConfig& m) {
  std::string types;
  for (int l = 0; l < m.layers; ++l) {
    absl::StrAppend(&types, l == 0 ? "" : ", ",
                    m.WindowOf(l) > 0 ? "\"sliding_attention\"" : "\"full_attention\"");
  }
  return types;
}

// The one intermediate_size of a model without experts.
std::string DenseSizeJson(const ModelConfig& m) {
  return absl::StrCat(",\n  \"intermediate_size\": ", m.ffn_hidden);
}

// config.json's count of experts under `count_key` (Mixtral's num_local_experts, Qwen's and
// OLMoE's num_experts) and the number each token is routed to.
std::string ExpertsJson(const config::MoeConfig& moe, const char* count_key) {
  return absl::StrCat(",\n  \"", count_key, "\": ", moe.experts,
                      ",\n  \"num_experts_per_tok\": ", moe.top_k);
}

// Qwen-MoE's and OLMoE's experts: num_experts, and whether the top k's weights are renormalized.
std::string QwenExpertsJson(const config::MoeConfig& moe) {
  return absl::StrCat(ExpertsJson(moe, "num_experts"),
                      ",\n  \"norm_topk_prob\": ", moe.normalize_top_k ? "true" : "false");
}

// Every mixture-of-experts config's router fields: the load-balancing loss's weight, and router
// logits not returned.
std::string RouterJson(const config::MoeConfig& moe) {
  return absl::StrCat(",\n  \"router_aux_loss_coef\": ", ShortFloat(moe.aux_loss_coeff),
                      ",\n  \"output_router_logits\": false");
}

// config.json of the Llama family: Llama's, Mistral's (a sliding window), Mixtral's (MoE),
// Qwen2's (biases on q, k and v), Qwen3's (query and key norms) or Qwen3-MoE's (both of the last
// kinds' fields).
std::string LlamaConfigJson(const ModelConfig& m, const char* tied, const std::string& dtype) {
  const config::MoeConfig& moe = m.moe;
  const bool qwen = m.qkv_bias || m.qk_norm, experts = moe.enabled();
  // Llama's config has no sliding window; Mistral's is Llama's with one in every block, and
  // Ministral's with one in the blocks its layer_types names.
  const bool mistral = !qwen && !experts && m.sliding_window > 0;
  const bool ministral = mistral && !m.full_attention_layers.empty();
  const bool qwen2_moe = experts && moe.shared_gate;
  const char* type = qwen2_moe    ? "qwen2_moe"
                     : experts    ? (m.qk_norm ? "qwen3_moe" : "mixtral")
                     : m.qkv_bias ? "qwen2"
                     : m.qk_norm  ? "qwen3"
                     : ministral  ? "ministral"
                     : mistral    ? "mistral"
                                  : "llama";
  const char* architecture = qwen2_moe ? "Qwen2MoeForCausalLM"
                             : experts ? (m.qk_norm ? "Qwen3MoeForCausalLM" : "MixtralForCausalLM")
                             : m.qkv_bias ? "Qwen2ForCausalLM"
                             : m.qk_norm  ? "Qwen3ForCausalLM"
                             : ministral  ? "MinistralForCausalLM"
                             : mistral    ? "MistralForCausalLM"
                                          : "LlamaForCausalLM";
  std::string sizes;  // the MLPs' sizes and the experts
  if (!experts) {
    sizes = DenseSizeJson(m);
  } else if (!m.qk_norm && !qwen2_moe) {  // Mixtral: intermediate_size is each expert's
    sizes = absl::StrCat(",\n  \"intermediate_size\": ", moe.ffn,
                         ExpertsJson(moe, "num_local_experts"), RouterJson(moe));
  } else {  // Qwen3-MoE, Qwen2-MoE: dense blocks between the sparse ones keep intermediate_size
    sizes = absl::StrCat(",\n  \"intermediate_size\": ", m.ffn_hidden,
                         ",\n  \"moe_intermediate_size\": ", moe.ffn, QwenExpertsJson(moe),
                         ",\n  \"decoder_sparse_step\": ", moe.every,
                         ",\n  \"mlp_only_layers\": []", RouterJson(moe));
    if (qwen2_moe) {  // and its one gated shared expert, qkv_bias written for newer transformers
      absl::StrAppend(&sizes, ",\n  \"shared_expert_intermediate_size\": ",
                      int64_t{moe.shared_experts} * moe.ffn, ",\n  \"qkv_bias\": true");
    }
  }
  // Qwen2 has biases on q, k and v (no attention_bias field), Qwen3 none. A sliding window is
  // Qwen's from layer max_window_layers on (the full-attention blocks come first: CheckHfWritable),
  // also written as layer_types; Mistral's and Mixtral's sliding_window is in every block.
  const std::string window =
      m.sliding_window > 0 ? absl::StrCat(m.sliding_window) : std::string("null");
  const std::string types = m.sliding_window > 0 ? LayerTypesJson(m) : "";
  const int full_layers =
      m.sliding_window > 0 ? static_cast<int>(m.full_attention_layers.size()) : m.layers;
  const std::string attention =
      qwen ? absl::StrCat(m.qk_norm ? ",\n  \"attention_bias\": false" : "",
                          ",\n  \"use_sliding_window\": ", m.sliding_window > 0 ? "true" : "false",
                          ",\n  \"sliding_window\": ", window,
                          ",\n  \"max_window_layers\": ", full_layers,
                          types.empty() ? "" : ",\n  \"layer_types\": [" + types + "]")
           : absl::StrCat(experts || mistral ? ",\n  \"sliding_window\": " + window : "",
                          ministral ? ",\n  \"layer_types\": [" + types + "]" : "",
                          ",\n  \"attention_bias\": false,\n  \"mlp_bias\": false");
  return absl::StrCat(
      LlamaShapeJson(m, architecture, type, sizes), ",\n  \"rope_scaling\": ", RopeScalingJson(m),
      ",\n  \"hidden_act\": \"silu\"", attention, ",\n  \"tie_word_embeddings\": ", tied,
      ",\n  \"torch_dtype\": \"", dtype, "\"\n}\n");
}

// A soft cap in config.json: the number, or null for none.
std::string CapJson(float cap) { return cap > 0 ? ShortFloat(cap) : "null"; }

// config.json's fields of Gemma 2's and 3's local blocks and scores: the window (Gemma 2 without
// one: a window as long as the context, which hides nothing), layer_types, and with query and key
// norms (Gemma 3) the pattern and the local blocks' RoPE base.
std::string GemmaLocalBlocksJson(const ModelConfig& m) {
  std::string types;
  for (int l = 0; l < m.layers; ++l) {
    absl::StrAppend(&types, l == 0 ? "" : ", ",
                    m.WindowOf(l) > 0 || (m.sliding_window == 0 && l % 2 == 0)
                        ? "\"sliding_attention\""
                        : "\"full_attention\"");
  }
  std::string out =
      absl::StrCat(",\n  \"query_pre_attn_scalar\": ",
                   m.attention_scale_dim > 0 ? m.attention_scale_dim : m.head_dim(),
                   ",\n  \"sliding_window\": ", m.sliding_window > 0 ? m.sliding_window : m.max_seq,
                   ",\n  \"layer_types\": [", types, "]",
                   ",\n  \"final_logit_softcapping\": ", CapJson(m.logit_softcap),
                   ",\n  \"attn_logit_softcapping\": ", CapJson(m.attention_softcap));
  if (m.qk_norm) {
    const float local = m.rope_local_theta > 0 ? m.rope_local_theta : m.rope_theta;
    absl::StrAppend(&out, ",\n  \"rope_scaling\": ", RopeScalingJson(m),
                    ",\n  \"sliding_window_pattern\": ", GemmaWindowPattern(m),
                    ",\n  \"rope_local_base_freq\": ", ShortFloat(local));
  }
  return out;
}

// config.json of Gemma (GemmaForCausalLM), or with post_norms of Gemma 2 (Gemma2ForCausalLM)
// or, with query and key norms too, of Gemma 3's text model (Gemma3ForCausalLM).
std::string GemmaConfigJson(const ModelConfig& m, const char* tied, const std::string& dtype) {
  const char* architecture = !m.post_norms ? "GemmaForCausalLM"
                             : m.qk_norm   ? "Gemma3ForCausalLM"
                                           : "Gemma2ForCausalLM";
  const char* type = !m.post_norms ? "gemma" : m.qk_norm ? "gemma3_text" : "gemma2";
  const std::string local_blocks = m.post_norms ? GemmaLocalBlocksJson(m) : "";
  return absl::StrCat(LlamaShapeJson(m, architecture, type, DenseSizeJson(m)),
                      ",\n  \"hidden_act\": \"gelu_pytorch_tanh\",\n  \"hidden_activation\": "
                      "\"gelu_pytorch_tanh\",\n  \"attention_bias\": false",
                      local_blocks, ",\n  \"tie_word_embeddings\": ", tied,
                      ",\n  \"torch_dtype\": \"", dtype, "\"\n}\n");
}

// A list of factors in config.json.
std::string FactorsJson(const std::vector<float>& factors) {
  return absl::StrCat(
      "[",
      absl::StrJoin(factors, ", ",
                    [](std::string* out, float f) { absl::StrAppend(out, ShortFloat(f)); }),
      "]");
}

// config.json of Phi-3 (Phi3ForCausalLM): Mistral's fields, the rotated part of each head, and
// LongRoPE as Phi-3.5's config writes it (the factors in rope_scaling, the context they switch at
// beside it, attention_factor only when it is not the one max_position_embeddings implies).
std::string Phi3ConfigJson(const ModelConfig& m, const char* tied, const std::string& dtype) {
  const config::RopeScaling& r = m.rope_scaling;
  std::string scaling = "null", original;
  if (r.longrope) {
    const float implied = config::LongRopeAttentionFactor(
        static_cast<double>(m.max_seq) / r.original_max_seq, r.original_max_seq);
    scaling =
        absl::StrCat("{\"type\": \"longrope\", \"short_factor\": ", FactorsJson(r.short_factor),
                     ", \"long_factor\": ", FactorsJson(r.long_factor),
                     r.attention_factor != implied
                         ? absl::StrCat(", \"attention_factor\": ", ShortFloat(r.attention_factor))
                         : "",
                     "}");
    original = absl::StrCat(",\n  \"original_max_position_embeddings\": ", r.original_max_seq);
  }
  const std::string window =
      m.sliding_window > 0 ? absl::StrCat(m.sliding_window) : std::string("null");
  return absl::StrCat(
      "{\n  \"architectures\": [\"Phi3ForCausalLM\"],\n  \"model_type\": \"phi3\",\n",
      "  \"vocab_size\": ", m.vocab, ",\n  \"hidden_size\": ", m.width,
      ",\n  \"intermediate_size\": ", m.ffn_hidden, ",\n  \"num_hidden_layers\": ", m.layers,
      ",\n  \"num_attention_heads\": ", m.heads, ",\n  \"num_key_value_heads\": ", m.kv_heads,
      ",\n  \"max_position_embeddings\": ", m.max_seq, original,
      ",\n  \"rms_norm_eps\": ", ShortFloat(m.norm_eps),
      ",\n  \"rope_theta\": ", ShortFloat(m.rope_theta),
      ",\n  \"partial_rotary_factor\": ", PartialRotaryJson(m), ",\n  \"rope_scaling\": ", scaling,
      ",\n  \"sliding_window\": ", window,
      ",\n  \"hidden_act\": \"silu\",\n  \"attention_bias\": false",
      ",\n  \"tie_word_embeddings\": ", tied, ",\n  \"torch_dtype\": \"", dtype, "\"\n}\n");
}

// config.json of SmolLM3 (SmolLM3ForCausalLM): Llama's fields, no_rope_layers (1 for the blocks
// RoPE turns, 0 for the NoPE ones) and, with a window, use_sliding_window and layer_types (the
// NoPE blocks sliding: CheckSmolLM3Layout).
std::string SmolLM3ConfigJson(const ModelConfig& m, const char* tied, const std::string& dtype) {
  std::string flags, types;
  for (int l = 0; l < m.layers; ++l) {
    absl::StrAppend(&flags, l == 0 ? "" : ", ", m.RotatesLayer(l) ? 1 : 0);
    absl::StrAppend(&types, l == 0 ? "" : ", ",
                    m.WindowOf(l) > 0 ? "\"sliding_attention\"" : "\"full_attention\"");
  }
  const bool window = m.sliding_window > 0;
  return absl::StrCat(
      LlamaShapeJson(m, "SmolLM3ForCausalLM", "smollm3", DenseSizeJson(m)),
      ",\n  \"rope_scaling\": ", RopeScalingJson(m), ",\n  \"hidden_act\": \"silu\"",
      ",\n  \"no_rope_layers\": [", flags, "]",
      ",\n  \"use_sliding_window\": ", window ? "true" : "false",
      ",\n  \"sliding_window\": ", window ? absl::StrCat(m.sliding_window) : std::string("null"),
      window ? ",\n  \"layer_types\": [" + types + "]" : std::string(),
      ",\n  \"attention_bias\": false,\n  \"mlp_bias\": false",
      ",\n  \"tie_word_embeddings\": ", tied, ",\n  \"torch_dtype\": \"", dtype, "\"\n}\n");
}

// What Phi-3's, SmolLM3's and Granite's layouts share with Llama's and cannot hold beside it:
// biases on q, k and v, query and key norms, Gemma's activation, embeddings, norms or scores, and
// experts (unless `experts` allows them). bad(field, why) words the refusal in the caller's layout.
template <typename Refusal>
absl::Status CheckPlainLlama(const ModelConfig& m, const Refusal& bad, bool experts = false) {
  if (m.qkv_bias) return bad("qkv_bias", "is true");
  if (m.qk_norm) return bad("qk_norm", "is true");
  if (m.geglu || m.scale_embeddings || m.post_norms || m.attention_scale_dim != 0 ||
      m.attention_softcap != 0 || m.logit_softcap != 0) {
    return bad("activation", "or the scores are Gemma's");
  }
  if (m.moe.enabled() && !experts) return bad("moe", "has experts");
  return absl::OkStatus();
}

// OLMoE's config.json (CheckOlmoLayout): intermediate_size each expert's; or OLMo 2's, dense;
// or with a window OLMo 3's, its blocks' attention in layer_types.
std::string OlmoConfigJson(const ModelConfig& m, const char* tied, const std::string& dtype) {
  const bool experts = m.moe.enabled(), olmo3 = !experts && m.sliding_window > 0;
  std::string sizes = experts ? absl::StrCat(",\n  \"intermediate_size\": ", m.moe.ffn,
                                             QwenExpertsJson(m.moe), RouterJson(m.moe))
                              : DenseSizeJson(m);
  if (olmo3) {
    absl::StrAppend(&sizes, ",\n  \"sliding_window\": ", m.sliding_window,
                    ",\n  \"layer_types\": [", LayerTypesJson(m), "]");
  }
  return absl::StrCat(
      LlamaShapeJson(m,
                     experts ? "OlmoeForCausalLM"
                     : olmo3 ? "Olmo3ForCausalLM"
                             : "Olmo2ForCausalLM",
                     experts ? "olmoe"
                     : olmo3 ? "olmo3"
                             : "olmo2",
                     sizes),
      ",\n  \"rope_scaling\": ", RopeScalingJson(m),
      ",\n  \"hidden_act\": \"silu\",\n  \"attention_bias\": false,\n  \"clip_qkv\": null",
      ",\n  \"tie_word_embeddings\": ", tied, ",\n  \"torch_dtype\": \"", dtype, "\"\n}\n");
}

// config.json of EXAONE 4.0 (Exaone4ForCausalLM, CheckExaone4Layout): Llama's fields and RoPE
// scaling, and the blocks' attention: with NoPE blocks a sliding_window (the model's, or one as
// long as its positions) and layer_types naming the NoPE blocks "full_attention" and the others
// "sliding_attention"; without either, no window and every block "full_attention".
std::string Exaone4ConfigJson(const ModelConfig& m, const char* tied, const std::string& dtype) {
  std::string types;
  for (int l = 0; l < m.layers; ++l) {
    absl::StrAppend(&types, l == 0 ? "" : ", ",
                    m.RotatesLayer(l) && (m.sliding_window > 0 || !m.nope_layers.empty())
                        ? "\"sliding_attention\""
                        : "\"full_attention\"");
  }
  const std::string window = m.sliding_window > 0    ? absl::StrCat(m.sliding_window)
                             : m.nope_layers.empty() ? std::string("null")
                                                     : absl::StrCat(HfMaxPositions(m));
  return absl::StrCat(LlamaShapeJson(m, "Exaone4ForCausalLM", "exaone4", DenseSizeJson(m)),
                      ",\n  \"rope_scaling\": ", RopeScalingJson(m),
                      ",\n  \"hidden_act\": \"silu\"", ",\n  \"sliding_window\": ", window,
                      ",\n  \"sliding_window_pattern\": null", ",\n  \"layer_types\": [", types,
                      "]", ",\n  \"tie_word_embeddings\": ", tied, ",\n  \"torch_dtype\": \"",
                      dtype, "\"\n}\n");
}

// config.json of Granite (GraniteForCausalLM): Llama's fields and the four multipliers, the
// attention's written as the scale itself (head_dim^-1/2 when the model has none); with experts
// GraniteMoE's (GraniteMoeForCausalLM), intermediate_size each expert's.
std::string GraniteConfigJson(const ModelConfig& m, const char* tied, const std::string& dtype) {
  const config::MoeConfig& moe = m.moe;
  const std::string sizes =
      moe.enabled() ? absl::StrCat(",\n  \"intermediate_size\": ", moe.ffn,
                                   ExpertsJson(moe, "num_local_experts"), RouterJson(moe))
                    : DenseSizeJson(m);
  return absl::StrCat(
      LlamaShapeJson(m, moe.enabled() ? "GraniteMoeForCausalLM" : "GraniteForCausalLM",
                     moe.enabled() ? "granitemoe" : "granite", sizes),
      ",\n  \"rope_scaling\": ", RopeScalingJson(m), ",\n  \"hidden_act\": \"silu\"",
      ",\n  \"embedding_multiplier\": ", ShortFloat(m.embedding_multiplier),
      ",\n  \"residual_multiplier\": ", ShortFloat(m.residual_multiplier),
      ",\n  \"attention_multiplier\": ", ShortFloat(m.attention_scale()),
      ",\n  \"logits_scaling\": ", ShortFloat(m.logits_scaling),
      ",\n  \"attention_bias\": false,\n  \"mlp_bias\": false",
      ",\n  \"tie_word_embeddings\": ", tied, ",\n  \"torch_dtype\": \"", dtype, "\"\n}\n");
}

// Granite's multipliers travel as Granite (or with experts GraniteMoE, whose experts are
// Mixtral's: CheckMoeLayout) only: a Llama model with SwiGLU, no biases, query and key norms,
// Gemma's options, partial RoPE or LongRoPE, NoPE blocks or sliding window.
absl::Status CheckGraniteLayout(const ModelConfig& m) {
  if (!m.HasGraniteMultipliers()) return absl::OkStatus();
  auto bad = [](const std::string& field, const std::string& why) {
    return absl::UnimplementedError(absl::StrCat(
        "model.", field, ": ", why,
        "; Trainyard writes Granite's multipliers (model.embedding_multiplier, "
        "residual_multiplier, attention_multiplier, logits_scaling) in Granite's and "
        "GraniteMoE's layouts only (SwiGLU, no biases, query and key norms, Gemma's options, "
        "partial RoPE or LongRoPE, NoPE blocks or sliding window)"));
  };
  TY_RETURN_IF_ERROR(CheckPlainLlama(m, bad, /*experts=*/true));
  if (m.rotary_dim() != m.head_dim()) return bad("rope_dim", absl::StrCat("is ", m.rope_dim));
  if (m.rope_scaling.longrope) return bad("rope_scaling", "is LongRoPE");
  if (!m.nope_layers.empty()) return bad("nope_layers", "is set");
  if (m.sliding_window > 0) return bad("sliding_window", absl::StrCat("is ", m.sliding_window));
  return absl::OkStatus();
}

// NoPE blocks travel as SmolLM3 only: a Llama model with SwiGLU, no biases, query and key norms,
// Gemma's options, experts, partial RoPE or LongRoPE, and a window (if any) in its NoPE blocks
// alone, as SmolLM3's use_sliding_window places it.
absl::Status CheckSmolLM3Layout(const ModelConfig& m) {
  if (m.nope_layers.empty() || IsExaone4(m)) return absl::OkStatus();
  auto bad = [](const std::string& field, const std::string& why) {
    return absl::UnimplementedError(absl::StrCat(
        "model.", field, ": ", why,
        "; Trainyard writes NoPE blocks (model.nope_layers) in SmolLM3's layout only (SwiGLU, no "
        "biases, query and key norms, Gemma's options, experts, partial RoPE or LongRoPE, a "
        "sliding window in the NoPE blocks alone or none)"));
  };
  TY_RETURN_IF_ERROR(CheckPlainLlama(m, bad));
  if (m.rotary_dim() != m.head_dim()) return bad("rope_dim", absl::StrCat("is ", m.rope_dim));
  if (m.rope_scaling.longrope) return bad("rope_scaling", "is LongRoPE");
  for (int l = 0; l < m.layers && m.sliding_window > 0; ++l) {
    if ((m.WindowOf(l) > 0) == m.RotatesLayer(l)) {
      return bad("full_attention_layers",
                 absl::StrCat("does not name exactly the blocks RoPE turns (block ", l, ")"));
    }
  }
  return absl::OkStatus();
}

// Partial RoPE and LongRoPE travel as Phi-3 only: a Llama model with SwiGLU, heads of width /
// heads, no biases, query and key norms, Gemma's options, MoE blocks or window-less blocks.
absl::Status CheckPhi3Layout(const ModelConfig& m) {
  if (HfExportProjections(m) != HfProjections::kFused) return absl::OkStatus();
  auto bad = [](const std::string& field, const std::string& why) {
    return absl::UnimplementedError(absl::StrCat(
        "model.", field, ": ", why,
        "; Trainyard writes partial RoPE (model.rope_dim) and LongRoPE in Phi-3's layout only "
        "(SwiGLU, heads of width / heads, no biases, query and key norms, Gemma's options, MoE "
        "blocks or other RoPE scaling, the sliding window in every block or none)"));
  };
  TY_RETURN_IF_ERROR(CheckPlainLlama(m, bad));
  if (m.explicit_head_dim != 0) {
    return bad("head_dim", absl::StrCat("is ", m.explicit_head_dim,
                                        " (Phi-3's heads are width / "
                                        "heads wide)"));
  }
  if (!m.full_attention_layers.empty()) return bad("full_attention_layers", "is set");
  if (m.rope_scaling.enabled() && !m.rope_scaling.longrope) {
    return bad("rope_scaling", m.rope_scaling.linear ? "is linear"
                               : m.rope_scaling.yarn ? "is YaRN"
                                                     : "is Llama 3's");
  }
  return CheckPartialRotaryReadsBack(m, bad);
}

// GLM's layout (IsGlm) holds a Llama model with SwiGLU, its RoPE plain (any part of each head
// turned, no scaling), biases on q, k and v or none: no query and key norms, Gemma's scores,
// Granite's multipliers, NoPE blocks, window or experts.
absl::Status CheckGlmLayout(const ModelConfig& m) {
  if (!IsGlm(m)) return absl::OkStatus();
  auto bad = [](const std::string& field, const std::string& why) {
    return absl::UnimplementedError(absl::StrCat(
        "model.", field, ": ", why,
        "; Trainyard writes a Llama model with SwiGLU and norms after each branch as well as "
        "before, or partial RoPE with biases on q, k and v, in GLM's and GLM-4's layouts only "
        "(plain RoPE over any even part of each head, no query and key norms, Gemma's scores, "
        "Granite's multipliers, NoPE blocks, sliding window or MoE blocks)"));
  };
  if (m.qk_norm) return bad("qk_norm", "is true");
  if (m.attention_scale_dim != 0 || m.attention_softcap != 0 || m.logit_softcap != 0) {
    return bad("attention_scale_dim", "or a soft cap is set");
  }
  if (m.HasGraniteMultipliers()) return bad(m.GraniteField(), "is set");
  if (m.rope_scaling.enabled()) return bad("rope_scaling", "is set");
  if (!m.nope_layers.empty()) return bad("nope_layers", "is set");
  if (m.sliding_window > 0) return bad("sliding_window", absl::StrCat("is ", m.sliding_window));
  if (m.moe.enabled()) return bad("moe", "has experts");
  return CheckPartialRotaryReadsBack(m, bad);
}

// config.json of GLM-4 (Glm4ForCausalLM): Llama's fields, the rotated part of each head, and
// attention_bias (q, k and v only). Without norms after the branches the model is GLM's
// (GlmForCausalLM, as GLM-4 9B's first checkpoints are published).
std::string GlmConfigJson(const ModelConfig& m, const char* tied, const std::string& dtype) {
  const bool glm4 = m.post_norms;
  return absl::StrCat(
      LlamaShapeJson(m, glm4 ? "Glm4ForCausalLM" : "GlmForCausalLM", glm4 ? "glm4" : "glm",
                     DenseSizeJson(m)),
      ",\n  \"partial_rotary_factor\": ", PartialRotaryJson(m),
      ",\n  \"hidden_act\": \"silu\",\n  \"attention_bias\": ", m.qkv_bias ? "true" : "false",
      ",\n  \"tie_word_embeddings\": ", tied, ",\n  \"torch_dtype\": \"", dtype, "\"\n}\n");
}

}  // namespace

// DeepSeek-V3's experts as GLM-4.5's and DeepSeek-V3's configs give them: their sizes and
// counts, the dense first blocks, and the routing (n_group 1 when no group is left out).
std::string DeepseekExpertsJson(const config::MoeConfig& moe) {
  return absl::StrCat(",\n  \"moe_intermediate_size\": ", moe.ffn,
                      ",\n  \"n_routed_experts\": ", moe.experts,
                      ",\n  \"num_experts_per_tok\": ", moe.top_k,
                      ",\n  \"n_shared_experts\": ", moe.shared_experts,
                      ",\n  \"first_k_dense_replace\": ", moe.dense_first,
                      ",\n  \"norm_topk_prob\": ", moe.normalize_top_k ? "true" : "false",
                      ",\n  \"routed_scaling_factor\": ", ShortFloat(moe.routed_scale),
                      ",\n  \"n_group\": ", moe.limits_groups() ? moe.groups : 1,
                      ",\n  \"topk_group\": ", moe.limits_groups() ? moe.group_top_k : 1);
}

namespace {

// config.json of GLM-4.5 (Glm4MoeForCausalLM): Llama's fields, the dense blocks' and the experts'
// sizes, the routing (n_group 1 when no group is left out), the rotated part of each head,
// attention_bias (q, k and v only) and use_qk_norm.
std::string Glm4MoeConfigJson(const ModelConfig& m, const char* tied, const std::string& dtype) {
  const std::string sizes = absl::StrCat(DenseSizeJson(m), DeepseekExpertsJson(m.moe),
                                         ",\n  \"num_nextn_predict_layers\": 0");
  return absl::StrCat(
      LlamaShapeJson(m, "Glm4MoeForCausalLM", "glm4_moe", sizes),
      ",\n  \"partial_rotary_factor\": ", PartialRotaryJson(m),
      ",\n  \"hidden_act\": \"silu\",\n  \"attention_bias\": ", m.qkv_bias ? "true" : "false",
      ",\n  \"use_qk_norm\": ", m.qk_norm ? "true" : "false",
      ",\n  \"tie_word_embeddings\": ", tied, ",\n  \"torch_dtype\": \"", dtype, "\"\n}\n");
}

// config.json of MiniMax-M2 (MiniMaxM2ForCausalLM): Llama's fields, intermediate_size each
// expert's, the rotated dimensions as rotary_dim and partial_rotary_factor, every block softmax
// attention with norms over the whole q and k, and sigmoid-scored experts with a selection bias.
std::string MiniMaxM2ConfigJson(const ModelConfig& m, const char* tied, const std::string& dtype) {
  const config::MoeConfig& moe = m.moe;
  std::vector<std::string> softmax(m.layers, "1");
  const std::string sizes = absl::StrCat(",\n  \"intermediate_size\": ", moe.ffn,
                                         ",\n  \"num_local_experts\": ", moe.experts,
                                         ",\n  \"num_experts_per_tok\": ", moe.top_k);
  return absl::StrCat(LlamaShapeJson(m, "MiniMaxM2ForCausalLM", "minimax_m2", sizes),
                      ",\n  \"rotary_dim\": ", m.rotary_dim(),
                      ",\n  \"partial_rotary_factor\": ", PartialRotaryJson(m),
                      ",\n  \"attn_type_list\": [", absl::StrJoin(softmax, ", "),
                      "],\n  \"use_qk_norm\": true,\n  \"qk_norm_type\": \"per_layer\"",
                      ",\n  \"scoring_func\": \"sigmoid\",\n  \"use_routing_bias\": true",
                      ",\n  \"shared_intermediate_size\": 0,\n  \"hidden_act\": \"silu\"",
                      ",\n  \"tie_word_embeddings\": ", tied, ",\n  \"torch_dtype\": \"", dtype,
                      "\"\n}\n");
}

// config.json of ERNIE 4.5's MoE (Ernie4_5_MoeForCausalLM): Llama's fields, the dense blocks' and
// the experts' sizes, where the MoE blocks are (from dense_first, every `every`, to the last), and
// use_bias false.
std::string ErnieMoeConfigJson(const ModelConfig& m, const char* tied, const std::string& dtype) {
  const config::MoeConfig& moe = m.moe;
  const std::string sizes = absl::StrCat(
      DenseSizeJson(m), ",\n  \"moe_intermediate_size\": ", moe.ffn,
      ",\n  \"moe_num_experts\": ", moe.experts, ",\n  \"moe_k\": ", moe.top_k,
      ",\n  \"moe_num_shared_experts\": ", moe.shared_experts,
      ",\n  \"moe_layer_start_index\": ", moe.dense_first,
      ",\n  \"moe_layer_end_index\": ", m.layers - 1, ",\n  \"moe_layer_interval\": ", moe.every);
  return absl::StrCat(LlamaShapeJson(m, "Ernie4_5_MoeForCausalLM", "ernie4_5_moe", sizes),
                      ",\n  \"hidden_act\": \"silu\",\n  \"use_bias\": false",
                      ",\n  \"tie_word_embeddings\": ", tied, ",\n  \"torch_dtype\": \"", dtype,
                      "\"\n}\n");
}

}  // namespace

HfProjections HfExportProjections(const ModelConfig& m) {
  if (m.latent.enabled()) return HfProjections::kSeparate;  // DeepSeek-V3's
  if (IsGlm(m)) return HfProjections::kFusedMlp;
  if (IsGlm4Moe(m) || IsErnieMoe(m) || IsMiniMaxM2(m)) return HfProjections::kSeparate;
  const bool phi3 = m.family == ModelFamily::kLlama &&
                    (m.rotary_dim() != m.head_dim() || m.rope_scaling.longrope);
  return phi3 ? HfProjections::kFused : HfProjections::kSeparate;
}

HfLayout HfExportLayout(const ModelConfig& m) {
  HfLayout layout;
  layout.projections = HfExportProjections(m);
  layout.glm = IsGlm(m);
  layout.interleaved_rope = layout.glm || IsErnieMoe(m) || m.latent.enabled();
  layout.experts = IsDeepseekV2(m)             ? HfExperts::kDeepseekV2
                   : m.latent.enabled()        ? HfExperts::kGlm4Moe  // DeepSeek-V3's
                   : m.HasGraniteMultipliers() ? HfExperts::kGraniteMoe
                   : IsMiniMaxM2(m)            ? HfExperts::kMiniMaxM2
                   : IsGlm4Moe(m)              ? HfExperts::kGlm4Moe
                   : IsErnieMoe(m)             ? HfExperts::kErnieMoe
                   : m.moe.shared_gate         ? HfExperts::kQwen2Moe
                   : m.qk_norm                 ? HfExperts::kQwen3Moe
                                               : HfExperts::kMixtral;
  return layout;
}

absl::Status CheckHfWritable(const ModelConfig& m) {
  if (const config::RopeScaling& r = m.rope_scaling;
      r.yarn && m.max_seq != r.original_max_seq &&
      !YarnFactorAgrees(static_cast<double>(HfMaxPositions(m)), r.original_max_seq, r.factor)) {
    return absl::UnimplementedError(absl::StrCat(
        "model.rope_scaling.factor: is ", r.factor, ", which over original_max_seq ",
        r.original_max_seq,
        " gives no whole max_position_embeddings (recent transformers take YaRN's factor as "
        "max_position_embeddings over original_max_position_embeddings)"));
  }
  if (m.latent.enabled()) return CheckDeepseekLayout(m);  // every other layout's options refused
  TY_RETURN_IF_ERROR(CheckGraniteLayout(m));
  TY_RETURN_IF_ERROR(CheckSmolLM3Layout(m));
  TY_RETURN_IF_ERROR(CheckPhi3Layout(m));
  TY_RETURN_IF_ERROR(CheckGlmLayout(m));
  const std::vector<int32_t>& full = m.full_attention_layers;
  if (IsGemma(m) && m.post_norms && !m.qk_norm && m.sliding_window > 0 &&
      GemmaWindowPattern(m) != 2) {
    return absl::UnimplementedError(absl::StrCat(
        "model.full_attention_layers: [", absl::StrJoin(full, ", "),
        "]; Trainyard writes Gemma 2's local and global blocks as its own (the even blocks use "
        "the window, the odd ones attend to every position)"));
  }
  if (IsGemma(m) && m.post_norms && m.sliding_window > 0 && GemmaWindowPattern(m) == 0) {
    return absl::UnimplementedError(absl::StrCat(
        "model.full_attention_layers: [", absl::StrJoin(full, ", "),
        "]; Trainyard writes Gemma 3's local and global blocks as its sliding_window_pattern k "
        "(blocks k − 1, 2k − 1, … attend to every position)"));
  }
  const bool olmo3_local =
      !m.pre_norms && m.sliding_window > 0 && m.rope_local_theta == m.rope_theta;
  if (m.rope_local_theta != 0 && !(IsGemma(m) && m.post_norms && m.qk_norm) && !olmo3_local) {
    return absl::UnimplementedError(
        "model.rope_local_theta is set; Trainyard writes the local blocks' own RoPE base in Gemma "
        "3's layout only (rope_local_base_freq), and no other layout has a place for it");
  }
  // Gemma's and SmolLM3's windows are their own (checked above).
  if (full.empty() || m.post_norms || !m.nope_layers.empty()) return absl::OkStatus();
  const bool qwen = m.family == ModelFamily::kLlama && (m.qkv_bias || m.qk_norm);
  const bool leading = full.back() == static_cast<int32_t>(full.size()) - 1;
  if (qwen && leading) return absl::OkStatus();
  if (!qwen && !m.moe.enabled()) return absl::OkStatus();  // Ministral's layer_types
  return absl::UnimplementedError(absl::StrCat(
      "model.full_attention_layers: [", absl::StrJoin(full, ", "),
      "]; Trainyard writes a sliding window in some blocks only as Qwen2's or Qwen3's "
      "max_window_layers (a model with qkv_bias or qk_norm, its full-attention blocks first) or "
      "in Ministral's layer_types (a dense Llama model without either)"));
}

std::string HfConfigJson(const ModelConfig& m, TensorDtype dtype) {
  const std::string torch_dtype = dtype == TensorDtype::kBF16 ? "bfloat16" : "float32";
  const char* tied = m.tied_embeddings ? "true" : "false";
  if (m.family == ModelFamily::kGpt2) {
    return absl::StrCat(
        "{\n  \"architectures\": [\"GPT2LMHeadModel\"],\n  \"model_type\": \"gpt2\",\n",
        "  \"vocab_size\": ", m.vocab, ",\n  \"n_positions\": ", m.max_seq,
        ",\n  \"n_ctx\": ", m.max_seq, ",\n  \"n_embd\": ", m.width, ",\n  \"n_layer\": ", m.layers,
        ",\n  \"n_head\": ", m.heads, ",\n  \"n_inner\": ", m.ffn_hidden,
        ",\n  \"activation_function\": \"gelu_new\",\n  \"layer_norm_epsilon\": ",
        ShortFloat(m.norm_eps),
        ",\n  \"resid_pdrop\": 0.0,\n  \"embd_pdrop\": 0.0,\n  \"attn_pdrop\": 0.0,\n"
        "  \"scale_attn_weights\": true,\n  \"tie_word_embeddings\": ",
        tied, ",\n  \"torch_dtype\": \"", torch_dtype, "\"\n}\n");
  }
  if (m.latent.enabled()) return DeepseekConfigJson(m, tied, torch_dtype);
  if (IsGemma(m)) return GemmaConfigJson(m, tied, torch_dtype);
  if (IsGlm(m)) return GlmConfigJson(m, tied, torch_dtype);
  if (IsMiniMaxM2(m)) return MiniMaxM2ConfigJson(m, tied, torch_dtype);
  if (IsGlm4Moe(m)) return Glm4MoeConfigJson(m, tied, torch_dtype);
  if (IsErnieMoe(m)) return ErnieMoeConfigJson(m, tied, torch_dtype);
  if (HfExportProjections(m) == HfProjections::kFused) {
    return Phi3ConfigJson(m, tied, torch_dtype);
  }
  if (IsExaone4(m)) return Exaone4ConfigJson(m, tied, torch_dtype);
  if (!m.nope_layers.empty()) return SmolLM3ConfigJson(m, tied, torch_dtype);
  if (m.HasGraniteMultipliers()) return GraniteConfigJson(m, tied, torch_dtype);
  if (m.NormsWholeProjection()) return OlmoConfigJson(m, tied, torch_dtype);
  return LlamaConfigJson(m, tied, torch_dtype);
}

namespace {

// How a directory of `model_type` (its model `layers` blocks deep, its config `f`) stores its
// tensors.
absl::StatusOr<HfLayout> StoredLayout(const std::string& model_type, const ConfigFields& f,
                                      int layers) {
  HfLayout layout;
  layout.model_type = model_type;
  layout.glm = model_type == "glm" || model_type == "glm4";
  layout.interleaved_rope = layout.glm || model_type == "ernie4_5" ||
                            model_type == "ernie4_5_moe" || model_type == "helium";
  layout.projections = model_type == "phi3"               ? HfProjections::kFused
                       : layout.glm                       ? HfProjections::kFusedMlp
                       : model_type == "granitemoehybrid" ? HfProjections::kGraniteSharedMlp
                                                          : HfProjections::kSeparate;
  layout.experts = model_type == "granitemoe"    ? HfExperts::kGraniteMoe
                   : model_type == "qwen2_moe"   ? HfExperts::kQwen2Moe
                   : model_type == "deepseek_v2" ? HfExperts::kDeepseekV2
                   : model_type == "glm4_moe" || model_type == "dots1" || IsDeepseekType(model_type)
                       ? HfExperts::kGlm4Moe
                   : model_type == "ernie4_5_moe"                       ? HfExperts::kErnieMoe
                   : model_type == "qwen3_moe" || model_type == "olmoe" ? HfExperts::kQwen3Moe
                   : model_type == "minimax_m2"                         ? HfExperts::kMiniMaxM2
                                                                        : HfExperts::kMixtral;
  layout.multimodal = model_type == "gemma3" || model_type == "mistral3";
  layout.unread_layers_from =
      model_type == "glm4_moe" || model_type == "minimax_m2" || IsDeepseekType(model_type) ? layers
                                                                                           : 0;
  layout.unread_prefix = model_type == "ernie4_5_moe" ? "model.mtp" : "";
  // DeepSeek's rotary rows in neighbouring pairs (V3's rope_interleave, true unless the config
  // says otherwise; DeepSeek's own code reads no other, nor does V2's).
  if (IsDeepseekType(model_type)) {
    layout.interleaved_rope = true;
    if (model_type != "deepseek_v2") {
      TY_RETURN_IF_ERROR(f.Bool("rope_interleave", &layout.interleaved_rope));
    }
  }
  return layout;
}

}  // namespace

// The model_types ModelFromHfConfig reads, for its refusal of another.
constexpr char kHfModelTypes[] =
    "\"gpt2\", \"llama\", \"gemma\", \"gemma2\", \"gemma3_text\", \"gemma3\" (its language "
    "model), \"mistral\", \"mistral3\" (its language model), \"ministral\", \"phi3\", \"qwen2\", "
    "\"qwen2_moe\", \"qwen3\", \"qwen3_moe\", \"mixtral\", \"olmo2\", \"olmo3\", \"olmoe\", "
    "\"exaone4\", \"smollm3\", \"granite\", \"granitemoe\", \"granitemoehybrid\" (attention only), "
    "\"glm\", \"glm4\", \"glm4_moe\", "
    "\"dots1\", \"minimax_m2\", \"ernie4_5\", \"ernie4_5_moe\", \"helium\", \"seed_oss\", "
    "\"deepseek_v2\", \"deepseek_v3\" and \"kimi_k2\"";

absl::StatusOr<ModelConfig> ModelFromHfConfig(const std::string& json, const std::string& source,
                                              HfLayout* layout) {
  google::protobuf::Struct parsed;
  if (!google::protobuf::util::JsonStringToMessage(json, &parsed).ok()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": not a JSON object"));
  }
  auto type = parsed.fields().find("model_type");
  const std::string model_type = type != parsed.fields().end() ? type->second.string_value() : "";
  TY_RETURN_IF_ERROR(RopeParametersAsFields(parsed, source, model_type));
  const ConfigFields fields(parsed, source);
  ModelConfig m;
  if (model_type == "gpt2") {
    TY_RETURN_IF_ERROR(ReadGpt2Config(fields, m));
  } else if (model_type == "llama") {
    TY_RETURN_IF_ERROR(ReadLlamaConfig(fields, m));
  } else if (model_type == "gemma") {
    TY_RETURN_IF_ERROR(ReadGemmaConfig(fields, m));
  } else if (model_type == "gemma2") {
    TY_RETURN_IF_ERROR(ReadGemma2Config(fields, m));
  } else if (model_type == "gemma3_text") {
    TY_RETURN_IF_ERROR(ReadGemma3Config(fields, m));
  } else if (model_type == "gemma3") {  // a multimodal Gemma 3: its language model
    TY_RETURN_IF_ERROR(ReadGemma3MultimodalConfig(fields, m));
  } else if (model_type == "mistral3") {  // Mistral Small 3.1 and later: its language model
    TY_RETURN_IF_ERROR(ReadMistral3Config(fields, m));
  } else if (model_type == "mistral") {  // Llama's tensors and config, and sliding_window
    TY_RETURN_IF_ERROR(ReadLlamaConfig(fields, m));
    TY_RETURN_IF_ERROR(ReadSlidingWindow(fields, m));
  } else if (model_type == "ministral") {  // Mistral's, its window in the blocks layer_types says
    TY_RETURN_IF_ERROR(ReadLlamaConfig(fields, m));
    TY_RETURN_IF_ERROR(ReadTypedWindow(fields, m, 4096, {}));
  } else if (model_type == "phi3") {  // Mistral's model, its projections fused
    TY_RETURN_IF_ERROR(ReadPhi3Config(fields, m));
  } else if (model_type == "qwen2") {  // Llama's tensors and config, and biases on q, k and v
    TY_RETURN_IF_ERROR(ReadLlamaConfig(fields, m));
    m.qkv_bias = true;
    TY_RETURN_IF_ERROR(ReadQwenWindow(fields, m));
  } else if (model_type == "qwen3") {  // Llama's tensors and config, and query and key norms
    TY_RETURN_IF_ERROR(ReadLlamaConfig(fields, m));
    m.qk_norm = true;
    TY_RETURN_IF_ERROR(ReadQwenWindow(fields, m));
  } else if (model_type == "qwen3_moe") {  // Qwen3's attention, and experts
    TY_RETURN_IF_ERROR(ReadLlamaConfig(fields, m));
    m.qk_norm = true;
    TY_RETURN_IF_ERROR(ReadQwenWindow(fields, m));
    TY_RETURN_IF_ERROR(ReadQwen3MoeConfig(fields, m));
  } else if (model_type == "qwen2_moe") {  // Qwen2's attention, experts and a gated shared one
    TY_RETURN_IF_ERROR(ReadLlamaConfig(fields, m));
    TY_RETURN_IF_ERROR(ReadQwen2MoeConfig(fields, m));
  } else if (model_type == "olmoe") {  // norms over the whole q and k, and experts
    TY_RETURN_IF_ERROR(ReadOlmoeConfig(fields, m));
  } else if (model_type == "olmo2") {  // those norms, and each branch's output normed only
    TY_RETURN_IF_ERROR(ReadOlmo2Config(fields, m));
  } else if (model_type == "olmo3") {  // OLMo 2's, with a window in some blocks
    TY_RETURN_IF_ERROR(ReadOlmo3Config(fields, m));
  } else if (model_type == "exaone4") {  // OLMo 2's blocks, Qwen3's norms, NoPE global blocks
    TY_RETURN_IF_ERROR(ReadExaone4Config(fields, m));
  } else if (model_type == "smollm3") {  // Llama's tensors and config, and NoPE layers
    TY_RETURN_IF_ERROR(ReadSmolLM3Config(fields, m));
  } else if (model_type == "granite") {  // Llama's tensors and config, and four multipliers
    TY_RETURN_IF_ERROR(ReadGraniteConfig(fields, m));
  } else if (model_type == "granitemoehybrid") {  // Granite 4.0's, attention only
    TY_RETURN_IF_ERROR(ReadGraniteHybridConfig(fields, m));
  } else if (model_type == "granitemoe") {  // Granite's, and experts
    TY_RETURN_IF_ERROR(ReadGraniteConfig(fields, m));
    TY_RETURN_IF_ERROR(ReadGraniteMoeConfig(fields, m));
  } else if (model_type == "glm" || model_type == "glm4") {  // interleaved partial RoPE
    TY_RETURN_IF_ERROR(ReadGlmConfig(fields, /*norms_after=*/model_type == "glm4", m));
  } else if (model_type == "glm4_moe") {  // Llama's attention, partial RoPE, DeepSeek's routing
    TY_RETURN_IF_ERROR(ReadGlm4MoeConfig(fields, m));
  } else if (model_type == "minimax_m2") {  // OLMoE's norms, partial RoPE, biased sigmoid routing
    TY_RETURN_IF_ERROR(ReadMiniMaxM2Config(fields, m));
  } else if (model_type == "dots1") {  // Qwen3's attention, DeepSeek-V3's experts
    TY_RETURN_IF_ERROR(ReadDots1Config(fields, m));
  } else if (model_type == "ernie4_5") {  // Llama's, its RoPE in neighbouring pairs
    TY_RETURN_IF_ERROR(ReadErnieConfig(fields, m));
  } else if (model_type == "ernie4_5_moe") {  // ERNIE 4.5's, and experts picked with a bias
    TY_RETURN_IF_ERROR(ReadErnieMoeConfig(fields, m));
  } else if (model_type == "helium") {  // Llama's, its RoPE in neighbouring pairs
    TY_RETURN_IF_ERROR(ReadHeliumConfig(fields, m));
  } else if (model_type == "seed_oss") {  // Qwen2's model: biases on q, k and v
    TY_RETURN_IF_ERROR(ReadSeedOssConfig(fields, m));
  } else if (model_type == "deepseek_v2") {  // latent attention, softmax-routed experts
    TY_RETURN_IF_ERROR(ReadDeepseekV2Config(fields, m));
  } else if (IsDeepseekType(model_type)) {  // latent attention, DeepSeek-V3's experts
    TY_RETURN_IF_ERROR(ReadDeepseekV3Config(fields, m));
  } else if (model_type == "mixtral") {  // Mistral's attention, and experts
    TY_RETURN_IF_ERROR(ReadLlamaConfig(fields, m));
    TY_RETURN_IF_ERROR(ReadSlidingWindow(fields, m));
    TY_RETURN_IF_ERROR(ReadMixtralConfig(fields, m));
  } else {
    return fields.Bad("model_type",
                      absl::StrCat("is \"", model_type, "\"; Trainyard reads ", kHfModelTypes));
  }
  TY_ASSIGN_OR_RETURN(HfLayout stored, StoredLayout(model_type, fields, m.layers));
  if (layout != nullptr) *layout = stored;
  if (absl::Status valid = config::ValidateModelConfig(m, source + ":"); !valid.ok()) return valid;
  return m;
}

absl::StatusOr<std::array<int64_t, 2>> Fp8WeightBlock(const std::string& json,
                                                      const std::string& source) {
  google::protobuf::Struct parsed;
  if (!google::protobuf::util::JsonStringToMessage(json, &parsed).ok()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": not a JSON object"));
  }
  const ConfigFields fields(parsed, source);
  const Value* quantization = fields.Get("quantization_config");
  if (quantization == nullptr) return std::array<int64_t, 2>{0, 0};
  if (quantization->kind_case() != Value::kStructValue) {
    return fields.Bad("quantization_config", "must be a map");
  }
  const ConfigFields q(quantization->struct_value(), source + ": quantization_config");
  const Value* method = q.Get("quant_method");
  if (method == nullptr || method->string_value() != "fp8") {
    return q.Bad("quant_method", absl::StrCat("is \"", method ? method->string_value() : "",
                                              "\"; Trainyard reads unquantized weights and "
                                              "block-quantized \"fp8\""));
  }
  TY_RETURN_IF_ERROR(q.OneOf("fmt", {"float8_e4m3fn", "e4m3"}));
  const Value* block = q.Get("weight_block_size");
  if (block == nullptr || block->kind_case() != Value::kListValue ||
      block->list_value().values_size() != 2) {
    return q.Bad("weight_block_size",
                 "must be [rows, cols] (Trainyard reads FP8 weights scaled per block)");
  }
  std::array<int64_t, 2> out{};
  for (int i = 0; i < 2; ++i) {
    const double v = block->list_value().values(i).number_value();
    if (!(v >= 1 && v <= 65536) || v != std::floor(v)) {
      return q.Bad("weight_block_size", "must be two positive integers");
    }
    out[i] = static_cast<int64_t>(v);
  }
  return out;
}

absl::StatusOr<std::vector<int32_t>> EndOfSequenceIds(const std::string& json,
                                                      const std::string& source, int vocab) {
  google::protobuf::Struct parsed;
  if (!google::protobuf::util::JsonStringToMessage(json, &parsed).ok()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": not a JSON object"));
  }
  const ConfigFields fields(parsed, source);
  const Value* value = fields.Get("eos_token_id");
  std::vector<int32_t> ids;
  if (value == nullptr) return ids;
  std::vector<const Value*> items;
  if (value->kind_case() == Value::kListValue) {
    for (const Value& item : value->list_value().values()) items.push_back(&item);
  } else {
    items.push_back(value);
  }
  for (const Value* item : items) {
    const double v = item->number_value();
    if (item->kind_case() != Value::kNumberValue || v != std::floor(v) || v < 0 || v >= vocab) {
      return fields.Bad("eos_token_id", absl::StrCat("must be a token id below the vocabulary of ",
                                                     vocab, " or a list of them"));
    }
    ids.push_back(static_cast<int32_t>(v));
  }
  return ids;
}

}  // namespace trainyard::worker::convert
