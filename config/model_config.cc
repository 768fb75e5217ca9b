#include "config/model_config.h"

#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace trainyard::config {
namespace {

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

int64_t ModelConfig::ParameterCount() const {
  const int64_t c = width, f = ffn_hidden, v = vocab;
  const int64_t qkv = qkv_width();
  const int64_t attn_out = static_cast<int64_t>(heads) * head_dim();
  int64_t per_layer = 0;
  int64_t total = v * c;  // token embedding
  if (family == ModelFamily::kGpt2) {
    per_layer = 2 * c                                    // ln1
                + qkv * c + qkv                          // qkv
                + c * attn_out + c                       // attention projection
                + 2 * c                                  // ln2
                + f * c + f + c * f + c;                 // MLP
    total += static_cast<int64_t>(max_seq) * c + 2 * c;  // positions, final LayerNorm
  } else {
    per_layer = c + qkv * c + c * attn_out + c + 2 * f * c + c * f;
    total += c;  // final RMSNorm
  }
  total += per_layer * layers;
  if (!tied_embeddings) total += v * c;
  return total;
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
  if (c.width % c.heads != 0) {
    return bad("heads", absl::StrCat("width ", c.width, " is not divisible by heads ", c.heads));
  }
  if (c.heads % c.kv_heads != 0) {
    return bad("kv_heads",
               absl::StrCat("heads ", c.heads, " is not divisible by kv_heads ", c.kv_heads));
  }
  if (c.family == ModelFamily::kGpt2 && c.kv_heads != c.heads) {
    return bad("kv_heads", "the gpt2 family has as many key/value heads as query heads");
  }
  if (c.family == ModelFamily::kLlama && c.head_dim() % 2 != 0) {
    return bad("heads", absl::StrCat("RoPE needs an even head dimension, got ", c.head_dim()));
  }
  if (!(c.norm_eps > 0.0f)) return bad("norm_eps", "must be positive");
  if (!(c.rope_theta > 0.0f)) return bad("rope_theta", "must be positive");
  return absl::OkStatus();
}

}  // namespace trainyard::config
