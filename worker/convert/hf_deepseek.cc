// DeepSeek-V2's and V3's Hugging Face layouts (DeepSeek-V3, R1, Moonlight, Kimi K2, DeepSeek-V2,
// V2.5, V2-Lite, Coder-V2): latent attention's tensors with each query head's rotary rows moved,
// their configs read and written, and what their layouts hold.
#include <google/protobuf/struct.pb.h>

#include <cmath>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "config/model_config.h"
#include "worker/convert/hf_format.h"
#include "worker/convert/hf_format_internal.h"

namespace trainyard::worker::convert {
namespace {

using config::ModelConfig;
using google::protobuf::Value;

// DeepSeek-V3's config class's defaults for its experts (DeepseekV3Config's).
constexpr ExpertKeys kDeepseekV3Keys{
    "n_routed_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
    "n_shared_experts",
    "first_k_dense_replace",
    nullptr,
    {.experts = 256, .top_k = 8, .shared_experts = 1, .dense_first = 3, .ffn = 2048},
    1};

// The factor on DeepSeek's scores beyond (qk_nope_head_dim + qk_rope_head_dim)^-1/2 under YaRN:
// its scale for mscale_all_dim, squared, as DeepseekV3Attention computes it; with that factor the
// scores' multiplier (model.attention_multiplier).
float DeepseekMultiplier(float factor, int64_t head_dim, double mscale_all_dim) {
  const double scale = config::YarnScale(factor, mscale_all_dim);
  return static_cast<float>(scale * scale / std::sqrt(static_cast<double>(head_dim)));
}

// DeepSeek's latent attention: qk_nope_head_dim (128) and qk_rope_head_dim (64) make each query
// and key head, the rotary part first in ours (HfTensors moves it); v_head_dim (128) the value
// heads; kv_lora_rank (512) and q_lora_rank (1536; null: queries from the input) the latents,
// whose norms take DeepSeek's fixed 1e-6. transformers writes head_dim as qk_rope_head_dim (what
// its RoPE turns); another head_dim is refused. Under YaRN the scores gain the square of its scale
// for rope_scaling's mscale_all_dim (model.attention_multiplier).
absl::Status ReadDeepseekAttention(const ConfigFields& f, ModelConfig& m) {
  int nope = 128, rope = 64, value = 128, kv_rank = 512, q_rank = 1536, head_dim = 0;
  TY_RETURN_IF_ERROR(f.Int("qk_nope_head_dim", &nope, /*required=*/false));
  TY_RETURN_IF_ERROR(f.Int("qk_rope_head_dim", &rope, /*required=*/false));
  TY_RETURN_IF_ERROR(f.Int("v_head_dim", &value, /*required=*/false));
  TY_RETURN_IF_ERROR(f.Int("kv_lora_rank", &kv_rank, /*required=*/false));
  if (f.IsNull("q_lora_rank")) {
    q_rank = 0;
  } else {
    TY_RETURN_IF_ERROR(f.Int("q_lora_rank", &q_rank, /*required=*/false));
  }
  TY_RETURN_IF_ERROR(f.Int("head_dim", &head_dim, /*required=*/false));
  if (head_dim != 0 && head_dim != rope) {
    return f.Bad("head_dim", absl::StrCat("is ", head_dim,
                                          "; DeepSeek's configs give "
                                          "qk_rope_head_dim ",
                                          rope, " there (what RoPE turns)"));
  }
  if (m.kv_heads != m.heads) {
    return f.Bad("num_key_value_heads", absl::StrCat("is ", m.kv_heads,
                                                     "; latent attention decompresses a key and a "
                                                     "value for each of the num_attention_heads ",
                                                     m.heads));
  }
  const int d = nope + rope;
  m.rope_dim = rope;
  m.explicit_head_dim = int64_t{d} * m.heads == m.width ? 0 : d;
  m.latent = {.q_rank = q_rank, .kv_rank = kv_rank, .value_dim = value, .norm_eps = 1e-6f};
  const Value* scaling = f.Get("rope_scaling");
  if (scaling == nullptr || scaling->kind_case() != Value::kStructValue) return absl::OkStatus();
  const Value* all_dim = ConfigFields(scaling->struct_value(), "").Get("mscale_all_dim");
  if (all_dim == nullptr || all_dim->number_value() == 0) return absl::OkStatus();
  if (!m.rope_scaling.yarn) {
    return f.Bad("rope_scaling", "gives mscale_all_dim to a RoPE other than yarn");
  }
  if (m.rope_scaling.factor > 1.0f) {
    m.attention_multiplier = DeepseekMultiplier(m.rope_scaling.factor, d, all_dim->number_value());
  }
  return absl::OkStatus();
}

// What DeepSeek-V2's and V3's configs share: Llama's blocks with DeepSeek's latent attention
// and an MoE block after every dense one (moe_layer_freq 1, which DeepSeek's own code reads);
// true when every block is dense (first_k_dense_replace, `dense_first` where the config is
// silent, covers them all).
absl::StatusOr<bool> ReadDeepseekShape(const ConfigFields& f, int dense_first, ModelConfig& m) {
  TY_RETURN_IF_ERROR(ReadLlamaConfig(f, m));
  TY_RETURN_IF_ERROR(ReadDeepseekAttention(f, m));
  int every = 1;
  TY_RETURN_IF_ERROR(f.Int("moe_layer_freq", &every, /*required=*/false));
  if (every != 1) return f.Bad("moe_layer_freq", "must be 1 (transformers reads no other)");
  TY_RETURN_IF_ERROR(f.Int("first_k_dense_replace", &dense_first, /*required=*/false, 0));
  return dense_first >= m.layers;
}

// DeepSeek-V2's config class's defaults for its experts: none for the counts (each required),
// experts of 1407, no dense first blocks.
constexpr ExpertKeys kDeepseekV2Keys{
    "n_routed_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
    "n_shared_experts",
    "first_k_dense_replace",
    nullptr,
    {.experts = 0, .top_k = 0, .shared_experts = 0, .dense_first = 0, .ffn = 1407},
    1};

// rope_scaling's mscale_all_dim for DeepSeek's layout: the shortest decimal from which
// DeepseekMultiplier gives model.attention_multiplier back exactly; none where none does, or
// where YaRN does not extend the context.
std::optional<std::string> DeepseekMscaleAllDim(const ModelConfig& m) {
  const float factor = m.rope_scaling.factor;
  if (!m.rope_scaling.yarn || !(factor > 1.0f) || !(m.attention_multiplier > 0.0f)) {
    return std::nullopt;
  }
  const double scale =
      std::sqrt(m.attention_multiplier * std::sqrt(static_cast<double>(m.head_dim())));
  return ShortestDecimal(
      (scale - 1.0) / (0.1 * std::log(double{factor})), [&](const std::string& all_dim) {
        return DeepseekMultiplier(factor, m.head_dim(), std::strtod(all_dim.c_str(), nullptr)) ==
               m.attention_multiplier;
      });
}

}  // namespace

// DeepSeek's latent attention (DeepseekV3Attention's names): q_a_proj, q_a_layernorm and q_b_proj
// (q_proj without a query latent), kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj and o_proj.
// Theirs holds each query head as [nope | rope], ours as [rope | nope]; the rotary key comes last
// in kv_a_proj_with_mqa as in ours; with rope_interleave (layout.interleaved_rope) the rotary rows
// are in neighbouring pairs. kv_b_proj's heads are [nope | value] in both.
void AddLatentAttention(const ModelConfig& m, const std::string& p, const std::string& h,
                        const HfLayout& layout, std::vector<HfTensorMap>& out) {
  const config::LatentAttention& l = m.latent;
  const int64_t c = m.width, d = m.head_dim(), r = m.rope_dim, heads = m.heads;
  const int64_t q = heads * d, latent = l.kv_rank + r;
  const std::string a = h + "self_attn.";
  const bool pairs = layout.interleaved_rope;
  HfPiece queries{"", 0, q, false, {}, d, r, /*our_rope_at=*/0, /*their_rope_at=*/d - r, pairs};
  if (l.q_rank > 0) {
    out.push_back(Whole(p + "attn.q_a.w", {l.q_rank, c}, a + "q_a_proj.weight"));
    out.push_back(Whole(p + "attn.q_a_norm.w", {l.q_rank}, a + "q_a_layernorm.weight"));
    queries.name = a + "q_b_proj.weight";
    out.push_back({p + "attn.q_b.w", {q, l.q_rank}, {queries}});
  } else {
    queries.name = a + "q_proj.weight";
    out.push_back({p + "attn.q.w", {q, c}, {queries}});
  }
  out.push_back({p + "attn.kv_a.w",
                 {latent, c},
                 {{a + "kv_a_proj_with_mqa.weight",
                   0,
                   latent,
                   false,
                   {},
                   latent,
                   r,
                   l.kv_rank,
                   l.kv_rank,
                   pairs}}});
  out.push_back(Whole(p + "attn.kv_a_norm.w", {l.kv_rank}, a + "kv_a_layernorm.weight"));
  out.push_back(
      Whole(p + "attn.kv_b.w", {heads * (d - r + l.value_dim), l.kv_rank}, a + "kv_b_proj.weight"));
  out.push_back(Whole(p + "attn.proj.w", {c, heads * l.value_dim}, a + "o_proj.weight"));
}

// DeepSeek-V3's (DeepseekV3ForCausalLM, model_type deepseek_v3, as DeepSeek-V3, R1 and Moonlight
// are published; Kimi K2's kimi_k2 is the same model): Llama's blocks with DeepSeek's latent
// attention (ReadDeepseekAttention), rms_norm_eps 1e-6 unless the config says otherwise, and
// GLM-4.5's mixture of experts with DeepSeek-V3's defaults: the first first_k_dense_replace (3)
// blocks dense (intermediate_size), the others n_routed_experts (256) experts of
// moe_intermediate_size (2048) picked by sigmoid score plus the selection bias (balance: bias), the
// num_experts_per_tok (8) of them weighed by their scores, divided by their sum with
// norm_topk_prob (true), times routed_scaling_factor (2.5), from the topk_group (4) best of n_group
// (8) groups, beside n_shared_experts (1) shared ones. A config whose experts are null or whose
// dense blocks are all of them is a dense model. scoring_func, topk_method and moe_layer_freq,
// which DeepSeek's own code reads, must be "sigmoid", "noaux_tc" and 1 where given. The multi-token
// prediction layers (num_nextn_predict_layers, stored after the model's) are not read.
absl::Status ReadDeepseekV3Config(const ConfigFields& f, ModelConfig& m) {
  TY_ASSIGN_OR_RETURN(const bool dense,
                      ReadDeepseekShape(f, kDeepseekV3Keys.defaults.dense_first, m));
  TY_RETURN_IF_ERROR(f.OneOf("scoring_func", {"sigmoid"}));
  TY_RETURN_IF_ERROR(f.OneOf("topk_method", {"noaux_tc"}));
  if (dense || f.IsNull("n_routed_experts")) return absl::OkStatus();
  TY_RETURN_IF_ERROR(ReadExpertShape(f, kDeepseekV3Keys, m));
  config::MoeConfig& moe = m.moe;
  moe.score = config::MoeScore::kSigmoid;
  moe.balance = config::MoeBalance::kBias;
  moe.normalize_top_k = true;
  moe.routed_scale = 2.5f;
  TY_RETURN_IF_ERROR(f.Bool("norm_topk_prob", &moe.normalize_top_k));
  TY_RETURN_IF_ERROR(f.Float("routed_scaling_factor", &moe.routed_scale));
  return ReadExpertGroups(f, moe, /*groups=*/8, /*kept=*/4);
}

// DeepSeek-V2's (DeepseekV2ForCausalLM, model_type deepseek_v2, as DeepSeek-V2-Lite and
// DeepSeek-Coder-V2-Lite are published): DeepSeek-V3's latent attention (ReadDeepseekAttention;
// its RoPE always in neighbouring pairs, and under YaRN its scores scaled as DeepSeek's own code
// and vLLM scale them: transformers' port leaves mscale_all_dim out) over experts routed by
// softmax: past the first first_k_dense_replace (0) blocks, n_routed_experts experts of
// moe_intermediate_size (1407), of which each token takes the num_experts_per_tok of highest
// probability (topk_method "greedy"; "group_limited_greedy", as DeepSeek-V2, V2.5 and Coder-V2
// 236B route, from the topk_group of n_group groups whose best probability is highest: moe.groups
// with group_score max), weighed by their probabilities times routed_scaling_factor (1), beside
// n_shared_experts shared ones (balance: aux_loss; no selection bias). Without n_routed_experts
// (null, or absent: the class's default) every block is dense. Refused: scoring_func other than
// "softmax"; norm_topk_prob true (transformers' port ignores it where DeepSeek's code normalises
// and drops the scale).
absl::Status ReadDeepseekV2Config(const ConfigFields& f, ModelConfig& m) {
  TY_ASSIGN_OR_RETURN(const bool dense,
                      ReadDeepseekShape(f, kDeepseekV2Keys.defaults.dense_first, m));
  TY_RETURN_IF_ERROR(f.OneOf("scoring_func", {"softmax"}));
  TY_RETURN_IF_ERROR(f.OneOf("topk_method", {"greedy", "group_limited_greedy"}));
  bool normalize = false;
  TY_RETURN_IF_ERROR(f.Bool("norm_topk_prob", &normalize));
  if (normalize) {
    return f.Bad("norm_topk_prob",
                 "must be false (transformers' DeepseekV2 ignores it, while DeepSeek's code "
                 "normalises and then leaves routed_scaling_factor out)");
  }
  if (dense || !f.Has("n_routed_experts")) return absl::OkStatus();
  TY_RETURN_IF_ERROR(ReadExpertShape(f, kDeepseekV2Keys, m));
  m.moe.routed_scale = 1.0f;
  TY_RETURN_IF_ERROR(f.Float("routed_scaling_factor", &m.moe.routed_scale));
  const Value* method = f.Get("topk_method");
  if (method == nullptr || method->string_value() != "group_limited_greedy") {
    return absl::OkStatus();  // greedy: n_group and topk_group unread, as DeepSeek's code
  }
  m.moe.group_score = config::GroupScore::kMax;
  return ReadExpertGroups(f, m.moe);
}

// Whether a model with latent attention travels as DeepSeek-V2 (softmax-routed experts) rather
// than DeepSeek-V3.
bool IsDeepseekV2(const ModelConfig& m) {
  return m.latent.enabled() && m.moe.enabled() && m.moe.score == config::MoeScore::kSoftmax;
}

// DeepSeek-V2's and V3's layouts hold a Llama model with latent attention (its latents normed
// with DeepSeek's 1e-6), SwiGLU and norms before each branch, plain RoPE or YaRN, scores scaled by
// head_dim^-1/2 or, under YaRN, also by the square of the scale of some mscale_all_dim
// (DeepseekMscaleAllDim), and dense MLPs or experts in every block past the dense first ones
// beside ungated shared experts: DeepSeek-V3's sigmoid scores with a selection bias (any groups
// scored by their two best), or DeepSeek-V2's softmax scores unnormalised without one (any groups
// scored by their best).
absl::Status CheckDeepseekLayout(const ModelConfig& m) {
  auto bad = [](const std::string& field, const std::string& why) {
    return absl::UnimplementedError(absl::StrCat(
        "model.", field, ": ", why,
        "; Trainyard writes latent attention in DeepSeek-V3's and V2's layouts only (latents "
        "normed with 1e-6, plain RoPE or YaRN, scores scaled by head_dim^-1/2 or by YaRN's "
        "mscale_all_dim, dense MLPs or experts in every block past the dense first ones with "
        "ungated shared experts, scored by sigmoid with balance: bias and groups scored by "
        "their two best (V3's) or by softmax unnormalised with balance: aux_loss and groups "
        "scored by their best (V2's); no sliding window, NoPE "
        "blocks, Gemma's, Granite's or OLMo's options)"));
  };
  if (m.latent.norm_eps != 1e-6f) {
    return bad("latent_attention.norm_eps", absl::StrCat("is ", m.latent.norm_eps));
  }
  if (const config::MoeConfig& moe = m.moe; moe.enabled()) {
    const bool v3 = moe.score == config::MoeScore::kSigmoid;
    if (moe.has_bias() != v3) return bad("moe.balance", v3 ? "is aux_loss" : "is bias");
    if (!v3 && moe.normalize_top_k) return bad("moe.normalize_top_k", "is true with softmax");
    using config::GroupScore;
    if (moe.limits_groups() && (moe.group_score == GroupScore::kMax) == v3) {
      return bad("moe.group_score", v3 ? "is max with sigmoid" : "is top2_sum with softmax");
    }
    if (moe.every != 1) return bad("moe.every", absl::StrCat("is ", moe.every));
    if (moe.shared_experts < 1) return bad("moe.shared_experts", "is 0");
    if (moe.shared_gate) return bad("moe.shared_gate", "is true");
  }
  if (m.geglu || m.scale_embeddings || m.post_norms || !m.pre_norms || m.attention_scale_dim != 0 ||
      m.attention_softcap != 0 || m.logit_softcap != 0) {
    return bad("activation", "or the norms or scores are Gemma's or OLMo's");
  }
  if (m.embedding_multiplier != 1.0f || m.residual_multiplier != 1.0f || m.logits_scaling != 1.0f) {
    return bad(m.GraniteField(), "is set");
  }
  if (!m.nope_layers.empty()) return bad("nope_layers", "is set");
  if (m.sliding_window > 0) return bad("sliding_window", absl::StrCat("is ", m.sliding_window));
  if (m.rope_local_theta != 0) return bad("rope_local_theta", "is set");
  if (m.rope_scaling.enabled() && !m.rope_scaling.yarn) return bad("rope_scaling", "is not yarn");
  if (m.attention_multiplier != 0.0f && !DeepseekMscaleAllDim(m)) {
    return bad("attention_multiplier",
               absl::StrCat("is ", m.attention_multiplier,
                            ", which no YaRN mscale_all_dim over rope_scaling's factor gives"));
  }
  return absl::OkStatus();
}

// config.json of DeepSeek-V3 (DeepseekV3ForCausalLM), or with softmax-routed experts of
// DeepSeek-V2 (DeepseekV2ForCausalLM): the shape without head_dim (transformers takes head_dim as
// qk_rope_head_dim), the latent attention's ranks and head parts, RoPE with its rows in
// neighbouring pairs (V3's rope_interleave; V2's always), YaRN with mscale_all_dim where the
// scores are scaled beyond head_dim^-1/2 (and mscale, which DeepSeek's own code reads in place of
// attention_factor), and the experts as GLM-4.5's are written (V2's with the aux loss's weight),
// or null experts for a dense model.
std::string DeepseekConfigJson(const ModelConfig& m, const char* tied, const std::string& dtype) {
  const bool v2 = IsDeepseekV2(m);
  const config::LatentAttention& l = m.latent;
  std::string rope = RopeScalingJson(m);
  if (const config::RopeScaling& r = m.rope_scaling; r.yarn && r.factor > 1.0f) {
    // mscale: what gives attention_factor over mscale_all_dim's scale, as DeepSeek's code and
    // transformers without attention_factor compute it.
    const std::string all_dim = DeepseekMscaleAllDim(m).value_or("0");
    const double all_scale = config::YarnScale(r.factor, std::strtod(all_dim.c_str(), nullptr));
    const std::optional<std::string> mscale = ShortestDecimal(
        (r.attention_factor * all_scale - 1.0) / (0.1 * std::log(double{r.factor})),
        [&](const std::string& weight) {
          const double scale = config::YarnScale(r.factor, std::strtod(weight.c_str(), nullptr));
          return static_cast<float>(scale / all_scale) == r.attention_factor;
        });
    rope.insert(rope.size() - 1, absl::StrCat(mscale ? absl::StrCat(", \"mscale\": ", *mscale) : "",
                                              ", \"mscale_all_dim\": ", all_dim));
  }
  const std::string experts =
      !m.moe.enabled() ? ",\n  \"n_routed_experts\": null"
      : v2             ? absl::StrCat(DeepseekExpertsJson(m.moe),
                                      ",\n  \"scoring_func\": \"softmax\",\n  \"topk_method\": \"",
                          m.moe.limits_groups() ? "group_limited_greedy" : "greedy", "\"",
                                      ",\n  \"aux_loss_alpha\": ", ShortFloat(m.moe.aux_loss_coeff),
                                      ",\n  \"seq_aux\": false")
                       : absl::StrCat(DeepseekExpertsJson(m.moe),
                                      ",\n  \"scoring_func\": \"sigmoid\",\n  \"topk_method\": \"noaux_tc\"");
  return absl::StrCat(
      "{\n  \"architectures\": [\"", v2 ? "DeepseekV2" : "DeepseekV3",
      "ForCausalLM\"],\n  \"model_type\": \"", v2 ? "deepseek_v2" : "deepseek_v3", "\",\n",
      "  \"vocab_size\": ", m.vocab, ",\n  \"hidden_size\": ", m.width,
      ",\n  \"intermediate_size\": ", m.ffn_hidden, experts, ",\n  \"moe_layer_freq\": 1",
      ",\n  \"num_nextn_predict_layers\": 0,\n  \"num_hidden_layers\": ", m.layers,
      ",\n  \"num_attention_heads\": ", m.heads, ",\n  \"num_key_value_heads\": ", m.kv_heads,
      ",\n  \"q_lora_rank\": ", l.q_rank > 0 ? absl::StrCat(l.q_rank) : "null",
      ",\n  \"kv_lora_rank\": ", l.kv_rank, ",\n  \"qk_rope_head_dim\": ", m.rope_dim,
      ",\n  \"qk_nope_head_dim\": ", m.head_dim() - m.rope_dim,
      ",\n  \"v_head_dim\": ", l.value_dim, ",\n  \"max_position_embeddings\": ", HfMaxPositions(m),
      ",\n  \"rms_norm_eps\": ", ShortFloat(m.norm_eps),
      ",\n  \"rope_theta\": ", ShortFloat(m.rope_theta), ",\n  \"rope_scaling\": ", rope,
      v2 ? "" : ",\n  \"rope_interleave\": true",
      ",\n  \"hidden_act\": \"silu\",\n  \"attention_bias\": false",
      ",\n  \"tie_word_embeddings\": ", tied, ",\n  \"torch_dtype\": \"", dtype, "\"\n}\n");
}

// DeepSeek's model types: V3's own, Kimi K2's (the same model under DeepSeek's code) and V2's.
bool IsDeepseekType(const std::string& model_type) {
  return model_type == "deepseek_v3" || model_type == "kimi_k2" || model_type == "deepseek_v2";
}

}  // namespace trainyard::worker::convert
