#include "config/model_config.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"
#include "kernels/rope_frequencies.h"

namespace trainyard::config {
namespace {

constexpr int kMaxExperts = 65536;

ModelConfig Gpt2(int layers, int width, int heads, int vocab, int max_seq) {
  ModelConfig c;
  c.family = ModelFamily::kGpt2;
  c.layers = layers;
  c.width = width;
  c.heads = heads;
  c.kv_heads = heads;
  c.ffn_hidden = 4 * width;
  c.vocab = vocab;
  c.max_seq = max_seq;
  c.tied_embeddings = true;
  return c;
}

ModelConfig Llama(int layers, int width, int heads, int kv_heads, int ffn, int vocab, int max_seq) {
  ModelConfig c;
  c.family = ModelFamily::kLlama;
  c.layers = layers;
  c.width = width;
  c.heads = heads;
  c.kv_heads = kv_heads;
  c.ffn_hidden = ffn;
  c.vocab = vocab;
  c.max_seq = max_seq;
  c.tied_embeddings = false;
  c.rope_theta = 10000.0f;
  return c;
}

const std::map<std::string, ModelConfig>& Presets() {
  static const auto* presets = new std::map<std::string, ModelConfig>{
      {"gpt2-debug", Gpt2(2, 64, 4, 256, 64)},
      {"gpt2-tiny", Gpt2(4, 128, 4, 256, 256)},
      {"gpt2-small-cpu", Gpt2(4, 256, 8, 256, 256)},
      {"gpt2-124m", Gpt2(12, 768, 12, 50257, 1024)},
      {"gpt2-350m", Gpt2(24, 1024, 16, 50257, 1024)},
      {"llama-debug", Llama(2, 64, 4, 2, 128, 256, 64)},
      {"llama-tiny", Llama(4, 128, 4, 2, 352, 256, 256)},
      {"llama-small-cpu", Llama(4, 256, 8, 4, 704, 256, 256)},
      {"llama-1b", Llama(16, 2048, 32, 8, 8192, 128256, 2048)},
  };
  return *presets;
}

}  // namespace

int ModelConfig::WindowOf(int layer) const {
  const bool full =
      std::binary_search(full_attention_layers.begin(), full_attention_layers.end(), layer);
  return full ? 0 : sliding_window;
}

const char* ModelConfig::GraniteField() const {
  if (embedding_multiplier != 1.0f) return "embedding_multiplier";
  if (residual_multiplier != 1.0f) return "residual_multiplier";
  if (attention_multiplier != 0.0f) return "attention_multiplier";
  if (logits_scaling != 1.0f) return "logits_scaling";
  return nullptr;
}

bool ModelConfig::RotatesLayer(int layer) const {
  return family == ModelFamily::kLlama &&
         !std::binary_search(nope_layers.begin(), nope_layers.end(), layer);
}

double ModelConfig::AttendedSpan(double seq_len, int layer) const {
  const double w = WindowOf(layer);
  if (w == 0 || w >= seq_len) return seq_len;
  return 2.0 * (w * (w + 1) / 2 + (seq_len - w) * w) / seq_len;
}

double ModelConfig::AttendedSpan(double seq_len) const {
  double sum = 0;
  for (int l = 0; l < layers; ++l) sum += AttendedSpan(seq_len, l);
  return layers > 0 ? sum / layers : seq_len;
}

int64_t ModelConfig::ParameterCount() const {
  const int64_t c = width, v = vocab;
  const int64_t qkv = qkv_width();
  const int64_t attn_out = attention_width();
  const bool gpt2 = family == ModelFamily::kGpt2;
  // One MLP of hidden size f: GPT-2's fc and proj with biases, or Llama's gate/up and down.
  auto mlp = [&](int64_t f) { return gpt2 ? f * c + f + c * f + c : 2 * f * c + c * f; };
  int64_t attention = 0;  // everything of a block but its MLP
  int64_t total = v * c;  // token embedding
  if (gpt2) {
    attention = 2 * c + qkv * c + qkv + c * attn_out + c + 2 * c;  // norms, qkv, projection
    total += static_cast<int64_t>(max_seq) * c + 2 * c;            // positions, final LayerNorm
  } else {
    attention = (latent.enabled() ? LatentProjectionCount() : qkv * c) + (qkv_bias ? qkv : 0) +
                (qk_norm ? q_norm_width() + k_norm_width() : 0) + c * attn_out +
                (pre_norms ? 2 * c : 0) + (post_norms ? 2 * c : 0);
    total += c;  // final RMSNorm
  }
  for (int l = 0; l < layers; ++l) {
    total += attention;
    if (!moe.IsMoeLayer(l)) {
      total += mlp(ffn_hidden);
      continue;
    }
    // The router (its selection bias is not trained), the routed and the shared experts.
    total += int64_t{moe.experts} * c + moe.experts * mlp(moe.ffn);
    if (moe.shared_experts > 0) total += mlp(int64_t{moe.shared_experts} * moe.ffn);
    if (moe.shared_gate) total += c;
  }
  if (!tied_embeddings) total += v * c;
  return total;
}

int64_t ModelConfig::LatentProjectionCount() const {
  const int64_t c = width, h = heads, d = head_dim(), rope = rope_dim;
  const int64_t q_rank = latent.q_rank, kv_rank = latent.kv_rank;
  const int64_t queries = q_rank > 0 ? q_rank * c + q_rank + h * d * q_rank : h * d * c;
  return queries + (kv_rank + rope) * c + kv_rank + h * (d - rope + latent.value_dim) * kv_rank;
}

int64_t ModelConfig::ActiveParameterCount() const {
  if (!moe.enabled()) return ParameterCount();
  ModelConfig active = *this;
  // A token's share of an MoE layer: the router, top_k routed experts and the shared ones.
  active.moe.experts = moe.top_k;
  const int64_t unused_router = int64_t{moe.experts - moe.top_k} * width;
  return active.ParameterCount() + unused_router * moe.MoeLayers(layers);
}

std::string FamilyName(ModelFamily family) {
  return family == ModelFamily::kGpt2 ? "gpt2" : "llama";
}

absl::StatusOr<ModelFamily> ParseFamily(const std::string& name) {
  if (name == "gpt2") return ModelFamily::kGpt2;
  if (name == "llama") return ModelFamily::kLlama;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown model family '", name, "' (expected gpt2 or llama)"));
}

absl::StatusOr<ModelConfig> Preset(const std::string& name) {
  auto it = Presets().find(name);
  if (it == Presets().end()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown model preset '", name, "' (known: ", absl::StrJoin(PresetNames(), ", "), ")"));
  }
  return it->second;
}

std::vector<std::string> PresetNames() {
  std::vector<std::string> names;
  for (const auto& [name, unused] : Presets()) names.push_back(name);
  return names;
}

namespace {

// The MoE fields, checked unless experts is 0 (a dense model, whose other moe fields mean nothing).
// NaN fails every comparison, so the real-valued checks are written as "!(good)".
absl::Status ValidateMoe(const ModelConfig& c, const std::string& p) {
  const MoeConfig& moe = c.moe;
  if (moe.experts == 0) return absl::OkStatus();
  auto bad = [&](const char* field, const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat(p, ".moe.", field, ": ", why));
  };
  if (moe.experts < 1 || moe.experts > kMaxExperts) {
    return bad("experts",
               absl::StrCat("must be between 1 and ", kMaxExperts, ", got ", moe.experts));
  }
  if (moe.top_k < 1 || moe.top_k > moe.experts) {
    return bad("top_k",
               absl::StrCat("must be between 1 and experts ", moe.experts, ", got ", moe.top_k));
  }
  if (moe.shared_experts < 0) {
    return bad("shared_experts", absl::StrCat("must be at least 0, got ", moe.shared_experts));
  }
  if (moe.shared_gate && moe.shared_experts == 0) {
    return bad("shared_gate", "gates the shared experts, and model.moe.shared_experts is 0");
  }
  if (moe.shared_gate && c.family != ModelFamily::kLlama) {
    return bad("shared_gate", "is the llama family's (GPT-2's shared experts have biases)");
  }
  if (moe.every < 1 || moe.every > c.layers) {
    return bad("every",
               absl::StrCat("must be between 1 and layers ", c.layers, ", got ", moe.every));
  }
  if (moe.dense_first < 0 || moe.MoeLayers(c.layers) == 0) {
    return bad("dense_first",
               absl::StrCat("must be at least 0 and leave an MoE block among the ", c.layers,
                            " (every ", moe.every, "), got ", moe.dense_first));
  }
  if (moe.ffn < 1) return bad("ffn", absl::StrCat("must be at least 1, got ", moe.ffn));
  if (moe.groups < 1 || moe.experts % moe.groups != 0 ||
      (moe.groups > 1 && moe.experts / moe.groups < 2)) {
    return bad("groups", absl::StrCat("must divide experts ", moe.experts,
                                      " into groups of at least two (or be 1), got ", moe.groups));
  }
  if (moe.group_top_k < 0 || moe.group_top_k > moe.groups) {
    return bad("group_top_k", absl::StrCat("must be between 0 (every group) and groups ",
                                           moe.groups, ", got ", moe.group_top_k));
  }
  if (moe.top_k > moe.kept_groups() * (moe.experts / moe.groups)) {
    return bad("group_top_k",
               absl::StrCat("keeps ", moe.kept_groups(), " of ", moe.groups, " groups of ",
                            moe.experts / moe.groups, " experts, fewer than top_k ", moe.top_k));
  }
  if (!(moe.routed_scale > 0.0f) || !std::isfinite(moe.routed_scale)) {
    return bad("routed_scale", absl::StrCat("must be positive, got ", moe.routed_scale));
  }
  if (!(moe.aux_loss_coeff >= 0.0f) || !std::isfinite(moe.aux_loss_coeff)) {
    return bad("aux_loss_coeff",
               absl::StrCat("must be zero or positive, got ", moe.aux_loss_coeff));
  }
  if (!(moe.z_loss_coeff >= 0.0f) || !std::isfinite(moe.z_loss_coeff)) {
    return bad("z_loss_coeff", absl::StrCat("must be zero or positive, got ", moe.z_loss_coeff));
  }
  if (!(moe.bias_update_rate > 0.0f) || !std::isfinite(moe.bias_update_rate)) {
    return bad("bias_update_rate", absl::StrCat("must be positive, got ", moe.bias_update_rate));
  }
  if (!(moe.capacity_factor >= 0.0f) || !std::isfinite(moe.capacity_factor)) {
    return bad("capacity_factor",
               absl::StrCat("must be 0 (dropless) or positive, got ", moe.capacity_factor));
  }
  return absl::OkStatus();
}

}  // namespace

namespace {

// A list of blocks (full_attention_layers, nope_layers): each one of the model's, each once, in
// increasing order.
absl::Status ValidateLayerList(const std::vector<int32_t>& list, int layers,
                               const std::string& field) {
  for (size_t i = 0; i < list.size(); ++i) {
    if (list[i] < 0 || list[i] >= layers) {
      return absl::InvalidArgumentError(absl::StrCat(field, ": layer ", list[i],
                                                     " is not one of the ", layers,
                                                     " layers (0 to ", layers - 1, ")"));
    }
    if (i > 0 && list[i] <= list[i - 1]) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": must list each layer once, in increasing order"));
    }
  }
  return absl::OkStatus();
}

// Which keys a query sees: model.sliding_window and what goes with it (full_attention_layers,
// rope_local_theta), and model.document_token.
absl::Status ValidateWindow(const ModelConfig& c, const std::string& p) {
  auto bad = [&](const char* field, const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat(p, ".", field, ": ", why));
  };
  if (c.sliding_window < 0) {
    return bad("sliding_window",
               absl::StrCat("must be a number of positions (0 for none), got ", c.sliding_window));
  }
  if (c.family == ModelFamily::kGpt2 && c.sliding_window != 0) {
    return bad("sliding_window", "is for the llama family");
  }
  if (!c.full_attention_layers.empty() && c.sliding_window == 0) {
    return bad("full_attention_layers",
               "needs a sliding_window (without one every block attends to every position)");
  }
  TY_RETURN_IF_ERROR(
      ValidateLayerList(c.full_attention_layers, c.layers, p + ".full_attention_layers"));
  if (c.rope_local_theta != 0.0f) {
    if (!(c.rope_local_theta > 0.0f) || !std::isfinite(c.rope_local_theta)) {
      return bad("rope_local_theta", "must be positive (0 for rope_theta in every block)");
    }
    if (c.sliding_window == 0) {
      return bad("rope_local_theta",
                 "needs a sliding_window (it is the RoPE base of the blocks that use one)");
    }
  }
  if (c.document_token < -1 || c.document_token >= c.vocab) {
    return bad("document_token",
               absl::StrCat("must be a token id below the vocabulary of ", c.vocab,
                            " (leave it out for attention across the whole sequence), got ",
                            c.document_token));
  }
  return absl::OkStatus();
}

// model.attention_scale_dim, attention_softcap and logit_softcap (Gemma 2's scores and logits),
// z_loss_coeff (PaLM's z-loss on the logits), and Granite's multipliers.
absl::Status ValidateScores(const ModelConfig& c, const std::string& p) {
  auto bad = [&](const char* field, const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat(p, ".", field, ": ", why));
  };
  if (c.attention_scale_dim < 0) {
    return bad("attention_scale_dim",
               absl::StrCat("must be positive (0 for head_dim), got ", c.attention_scale_dim));
  }
  for (const auto& [cap, field] : {std::pair{c.attention_softcap, "attention_softcap"},
                                   std::pair{c.logit_softcap, "logit_softcap"}}) {
    if (!(cap >= 0.0f) || !std::isfinite(cap)) {
      return bad(field, absl::StrCat("must be a positive cap (0 for none), got ", cap));
    }
  }
  if (!(c.z_loss_coeff >= 0.0f) || !std::isfinite(c.z_loss_coeff)) {
    return bad("z_loss_coeff", absl::StrCat("must be zero or positive, got ", c.z_loss_coeff));
  }
  for (const auto& [factor, field] : {std::pair{c.embedding_multiplier, "embedding_multiplier"},
                                      std::pair{c.residual_multiplier, "residual_multiplier"},
                                      std::pair{c.logits_scaling, "logits_scaling"}}) {
    if (!(factor > 0.0f) || !std::isfinite(factor)) {
      return bad(field, absl::StrCat("must be positive (1 for none), got ", factor));
    }
  }
  if (!(c.attention_multiplier >= 0.0f) || !std::isfinite(c.attention_multiplier)) {
    return bad("attention_multiplier", absl::StrCat("must be positive (0 for head_dim^-1/2), got ",
                                                    c.attention_multiplier));
  }
  if (c.embedding_multiplier != 1.0f && c.scale_embeddings) {
    return bad("embedding_multiplier", "and scale_embeddings both scale the embeddings; set one");
  }
  if (c.attention_multiplier != 0.0f && c.attention_scale_dim != 0) {
    return bad("attention_multiplier",
               "and attention_scale_dim both set the scores' scale; set one");
  }
  return absl::OkStatus();
}

// An error naming rope_scaling's `field` under the model's path `p`.
absl::Status RopeScalingError(const std::string& p, const char* field, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat(p, ".rope_scaling.", field, ": ", why));
}

// The factor of Llama 3's, linear and YaRN scaling: at least 1.
absl::Status ValidateScalingFactor(const RopeScaling& r, const std::string& p) {
  if (!(r.factor >= 1.0f) || !std::isfinite(r.factor)) {
    return RopeScalingError(p, "factor", absl::StrCat("must be at least 1, got ", r.factor));
  }
  return absl::OkStatus();
}

// LongRoPE's and YaRN's factor of the cosines and sines: positive.
absl::Status ValidateAttentionFactor(const RopeScaling& r, const std::string& p) {
  if (!(r.attention_factor > 0.0f) || !std::isfinite(r.attention_factor)) {
    return RopeScalingError(p, "attention_factor",
                            absl::StrCat("must be positive, got ", r.attention_factor));
  }
  return absl::OkStatus();
}

// Llama 3's and linear scaling's factors.
absl::Status ValidateRopeFactor(const RopeScaling& r, const std::string& p) {
  auto bad = [&](const char* field, const std::string& why) {
    return RopeScalingError(p, field, why);
  };
  TY_RETURN_IF_ERROR(ValidateScalingFactor(r, p));
  if (!(r.low_freq_factor > 0.0f) || !std::isfinite(r.low_freq_factor)) {
    return bad("low_freq_factor", "must be positive");
  }
  if (!(r.high_freq_factor > r.low_freq_factor) || !std::isfinite(r.high_freq_factor)) {
    return bad("high_freq_factor", absl::StrCat("must exceed low_freq_factor ", r.low_freq_factor,
                                                ", got ", r.high_freq_factor));
  }
  return absl::OkStatus();
}

// LongRoPE's: one positive factor per rotated pair in each list, and a positive attention factor.
absl::Status ValidateLongRope(const RopeScaling& r, int pairs, const std::string& p) {
  auto bad = [&](const char* field, const std::string& why) {
    return RopeScalingError(p, field, why);
  };
  if (pairs > kernels::kMaxRopePairs) {
    return bad("short_factor",
               absl::StrCat("describes ", pairs, " pairs; at most ", kernels::kMaxRopePairs,
                            " (a rotated part of ", 2 * kernels::kMaxRopePairs, ") are supported"));
  }
  for (const auto& [factors, field] :
       {std::pair{&r.short_factor, "short_factor"}, std::pair{&r.long_factor, "long_factor"}}) {
    if (static_cast<int>(factors->size()) != pairs) {
      return bad(field, absl::StrCat("needs one factor per rotated pair, ", pairs,
                                     " (rope_dim / 2)", ", got ", factors->size()));
    }
    for (const float f : *factors) {
      if (!(f > 0.0f) || !std::isfinite(f)) {
        return bad(field, absl::StrCat("every factor must be positive, got ", f));
      }
    }
  }
  TY_RETURN_IF_ERROR(ValidateAttentionFactor(r, p));
  return absl::OkStatus();
}

// YaRN's: a factor of at least 1, beta_fast at least beta_slow (Kimi K2's are both 1: one pair
// index between kept and slowed, as transformers blends it) above 0, a positive attention factor.
absl::Status ValidateYarn(const RopeScaling& r, const std::string& p) {
  auto bad = [&](const char* field, const std::string& why) {
    return RopeScalingError(p, field, why);
  };
  TY_RETURN_IF_ERROR(ValidateScalingFactor(r, p));
  if (!(r.beta_slow > 0.0f) || !std::isfinite(r.beta_slow)) {
    return bad("beta_slow", absl::StrCat("must be positive, got ", r.beta_slow));
  }
  if (!(r.beta_fast >= r.beta_slow) || !std::isfinite(r.beta_fast)) {
    return bad("beta_fast",
               absl::StrCat("must be at least beta_slow ", r.beta_slow, ", got ", r.beta_fast));
  }
  TY_RETURN_IF_ERROR(ValidateAttentionFactor(r, p));
  return absl::OkStatus();
}

// model.rope_dim, nope_layers and rope_scaling.
absl::Status ValidateRope(const ModelConfig& c, const std::string& p) {
  auto bad = [&](const char* field, const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat(p, ".", field, ": ", why));
  };
  if (c.rope_dim != 0) {
    if (c.family != ModelFamily::kLlama) {
      return bad("rope_dim", "only the llama family uses rotary position embeddings");
    }
    if (c.rope_dim < 0 || c.rope_dim % 2 != 0 || c.rope_dim > c.head_dim()) {
      return bad("rope_dim", absl::StrCat("must be even and at most head_dim ", c.head_dim(),
                                          " (0 for all of it), got ", c.rope_dim));
    }
  }
  if (!c.nope_layers.empty()) {
    if (c.family != ModelFamily::kLlama) {
      return bad("nope_layers", "only the llama family uses rotary position embeddings");
    }
    TY_RETURN_IF_ERROR(ValidateLayerList(c.nope_layers, c.layers, p + ".nope_layers"));
  }
  const RopeScaling& r = c.rope_scaling;
  if (!r.enabled()) return absl::OkStatus();
  if (c.family != ModelFamily::kLlama) {
    return bad("rope_scaling", "only the llama family uses rotary position embeddings");
  }
  if (r.original_max_seq < 1) return bad("rope_scaling.original_max_seq", "must be positive");
  if (r.yarn) return ValidateYarn(r, p);
  return r.longrope ? ValidateLongRope(r, c.rotary_dim() / 2, p) : ValidateRopeFactor(r, p);
}

// model.latent_attention: a llama model whose heads each have a rotary part (rope_dim) and keys
// and values of their own (kv_heads = heads), with positive ranks and value heads.
absl::Status ValidateLatent(const ModelConfig& c, const std::string& p) {
  const LatentAttention& l = c.latent;
  if (!l.enabled() && l.q_rank == 0 && l.value_dim == 0) return absl::OkStatus();
  auto bad = [&](const char* field, const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat(p, ".latent_attention.", field, ": ", why));
  };
  if (l.kv_rank < 1) return bad("kv_rank", absl::StrCat("must be at least 1, got ", l.kv_rank));
  if (l.q_rank < 0) {
    return bad("q_rank",
               absl::StrCat("must be at least 0 (0: queries from the input), got ", l.q_rank));
  }
  if (l.value_dim < 1) {
    return bad("value_dim", absl::StrCat("must be at least 1, got ", l.value_dim));
  }
  if (!(l.norm_eps > 0.0f) || !std::isfinite(l.norm_eps)) {
    return bad("norm_eps", absl::StrCat("must be a positive number, got ", l.norm_eps));
  }
  auto refused = [&](const char* field, const std::string& why) {
    return absl::InvalidArgumentError(
        absl::StrCat(p, ".", field, ": ", why, " (model.latent_attention)"));
  };
  if (c.family != ModelFamily::kLlama) {
    return refused("family", "latent attention is for the llama family");
  }
  if (c.kv_heads != c.heads) {
    return refused("kv_heads",
                   absl::StrCat("must equal heads ", c.heads,
                                ": latent attention decompresses a key and value per query head"));
  }
  if (c.rope_dim <= 0 || c.rope_dim >= c.head_dim()) {
    return refused("rope_dim",
                   absl::StrCat("must be set below head_dim ", c.head_dim(),
                                ": the rotary part of each head, which the key heads share"));
  }
  if (c.qkv_bias) return refused("qkv_bias", "latent attention's projections have no biases");
  if (c.qk_norm) return refused("qk_norm", "latent attention norms its latents, not its heads");
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateModelConfig(const ModelConfig& c, const std::string& p) {
  auto bad = [&](const char* field, const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat(p, ".", field, ": ", why));
  };
  if (c.layers < 1) return bad("layers", absl::StrCat("must be at least 1, got ", c.layers));
  if (c.width < 1) return bad("width", absl::StrCat("must be at least 1, got ", c.width));
  if (c.heads < 1) return bad("heads", absl::StrCat("must be at least 1, got ", c.heads));
  if (c.kv_heads < 1) return bad("kv_heads", absl::StrCat("must be at least 1, got ", c.kv_heads));
  if (c.ffn_hidden < 1) {
    return bad("ffn_hidden", absl::StrCat("must be at least 1, got ", c.ffn_hidden));
  }
  if (c.vocab < 2) return bad("vocab", absl::StrCat("must be at least 2, got ", c.vocab));
  if (c.max_seq < 1) return bad("max_seq", absl::StrCat("must be at least 1, got ", c.max_seq));
  if (c.explicit_head_dim != 0) {
    if (c.family != ModelFamily::kLlama) {
      return bad("head_dim", "is for the llama family (GPT-2's heads are width / heads wide)");
    }
    if (c.explicit_head_dim < 2) {
      return bad("head_dim", absl::StrCat("must be at least 2, got ", c.explicit_head_dim));
    }
    if ((int64_t{c.heads} + 2 * int64_t{c.kv_heads}) * c.explicit_head_dim > INT32_MAX) {
      return bad("head_dim", absl::StrCat(c.explicit_head_dim, " makes q, k and v wider than ",
                                          INT32_MAX, " columns"));
    }
  } else if (c.width % c.heads != 0) {
    return bad("heads", absl::StrCat("width ", c.width, " is not divisible by heads ", c.heads,
                                     " (model.head_dim sets the heads' width apart)"));
  }
  if (c.heads % c.kv_heads != 0) {
    return bad("kv_heads",
               absl::StrCat("heads ", c.heads, " is not divisible by kv_heads ", c.kv_heads));
  }
  // The llama family's options, refused for gpt2.
  const std::pair<bool, const char*> llama_only[] = {{c.qk_norm, "qk_norm"},
                                                     {c.post_norms, "post_norms"},
                                                     {c.scale_embeddings, "scale_embeddings"},
                                                     {c.HasGraniteMultipliers(), c.GraniteField()}};
  for (const auto& [set, field] : llama_only) {
    if (c.family == ModelFamily::kGpt2 && set) return bad(field, "is for the llama family");
  }
  if (!c.pre_norms && !c.post_norms) {
    return bad("pre_norms", c.family == ModelFamily::kGpt2
                                ? "is false, and the gpt2 family's blocks norm their inputs"
                                : "is false without model.post_norms (a block would norm nothing)");
  }
  if (c.qk_norm_span == QkNormSpan::kProjection && !c.qk_norm) {
    return bad("qk_norm_span", "is projection, and model.qk_norm is false");
  }
  if (c.family == ModelFamily::kGpt2 && c.geglu) {
    return bad("activation", "geglu is for the llama family (GPT-2's MLP is GELU, ungated)");
  }
  if (c.family == ModelFamily::kGpt2 && c.qkv_bias) {
    return bad("qkv_bias", "is for the llama family (GPT-2's projections always have biases)");
  }
  TY_RETURN_IF_ERROR(ValidateWindow(c, p));
  TY_RETURN_IF_ERROR(ValidateScores(c, p));
  if (c.family == ModelFamily::kGpt2 && c.kv_heads != c.heads) {
    return bad("kv_heads", "the gpt2 family has as many key/value heads as query heads");
  }
  if (c.family == ModelFamily::kLlama && c.head_dim() % 2 != 0) {
    return bad(c.explicit_head_dim != 0 ? "head_dim" : "heads",
               absl::StrCat("RoPE needs an even head dimension, got ", c.head_dim()));
  }
  if (!(c.norm_eps > 0.0f)) return bad("norm_eps", "must be positive");
  if (!(c.rope_theta > 0.0f)) return bad("rope_theta", "must be positive");
  TY_RETURN_IF_ERROR(ValidateRope(c, p));
  TY_RETURN_IF_ERROR(ValidateLatent(c, p));
  return ValidateMoe(c, p);
}

}  // namespace trainyard::config
