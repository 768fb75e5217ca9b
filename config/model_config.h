// Model architecture: the two decoder-only families Trainyard trains, their named presets, and
// the one validator every entry point (spec parser, worker, planner) shares.
#ifndef TRAINYARD_CONFIG_MODEL_CONFIG_H_
#define TRAINYARD_CONFIG_MODEL_CONFIG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace trainyard::config {

enum class ModelFamily {
  kGpt2,   // learned positions, LayerNorm (with bias), GELU (tanh), biased linears, tied embeddings
  kLlama,  // RoPE, RMSNorm, SwiGLU, grouped-query attention, no biases, untied embeddings
};

struct ModelConfig {
  ModelFamily family = ModelFamily::kGpt2;
  int layers = 2;
  int width = 64;        // model dimension C
  int heads = 4;         // query heads; head_dim = width / heads
  int kv_heads = 4;      // key/value heads (== heads for GPT-2)
  int ffn_hidden = 256;  // MLP hidden size (GPT-2: 4C; Llama: SwiGLU hidden)
  int vocab = 256;
  int max_seq = 64;  // learned position table size (GPT-2) / longest sequence (Llama)
  bool tied_embeddings = true;
  float norm_eps = 1e-5f;
  float rope_theta = 10000.0f;
  bool recompute = false;  // recompute each layer's activations in the backward pass

  int head_dim() const { return width / heads; }
  int qkv_width() const { return (heads + 2 * kv_heads) * head_dim(); }
  // Number of trainable parameters (counted once when embeddings are tied).
  int64_t ParameterCount() const;
};

std::string FamilyName(ModelFamily family);
[[nodiscard]] absl::StatusOr<ModelFamily> ParseFamily(const std::string& name);

// Named presets, from debug sizes up to GPT-2 124M and a Llama-style 1B.
[[nodiscard]] absl::StatusOr<ModelConfig> Preset(const std::string& name);
std::vector<std::string> PresetNames();

// Checks internal consistency. Errors are INVALID_ARGUMENT naming the field under `path_prefix`
// (e.g. "model.heads: width 100 is not divisible by heads 3").
[[nodiscard]] absl::Status ValidateModelConfig(const ModelConfig& config,
                                               const std::string& path_prefix = "model");

}  // namespace trainyard::config

#endif  // TRAINYARD_CONFIG_MODEL_CONFIG_H_
