// Model architecture: the two decoder-only families Trainyard trains, their named presets, and
// the one validator every entry point (spec parser, worker, planner) shares.
#ifndef TRAINYARD_CONFIG_MODEL_CONFIG_H_
#define TRAINYARD_CONFIG_MODEL_CONFIG_H_

#include <cmath>
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

// Mixture of experts: every `every`-th block's MLP (blocks every−1, 2·every−1, … counting from 0)
// past the first `dense_first` blocks (DeepSeek-V3's and GLM-4.5's dense first blocks) becomes
// `experts` routed MLPs of the family's shape with hidden size `ffn`, of which each token
// uses `top_k`, plus `shared_experts` MLPs every token uses (held as one MLP of hidden
// shared_experts·ffn). The router is a linear layer [experts, width] computed in fp32; its scores
// are softmax(logits) or sigmoid(logits); a token picks the top_k of score + bias (bias: the
// auxiliary-loss-free rule's per-expert selection bias, zero under aux_loss; ties go to the lower
// expert index) and weighs expert e by score_e, divided by the sum of its picks' scores when
// normalize_top_k, times routed_scale (DeepSeek-V3's routed_scaling_factor). The output is
// Σ weight · expert(x) + shared(x), or with `shared_gate` (Qwen2-MoE's shared_expert_gate)
// Σ weight · expert(x) + sigmoid(x · g) · shared(x), g a learned [width] vector of the block.
enum class MoeBalance {
  kAuxLoss,  // + aux_loss_coeff · E · Σᵢ fᵢ·Pᵢ per micro-batch (fᵢ: share of the micro-batch's
             // picks that went to i, Pᵢ: its mean normalised score)
  kBias,  // after each step biasᵢ += bias_update_rate · sign(mean load − loadᵢ), the loads
          // summed over the step and the data-parallel world
};
enum class MoeScore { kSoftmax, kSigmoid };
// How group-limited routing scores a group of experts: the sum of its two best values
// (DeepSeek-V3's noaux_tc) or its best value (DeepSeek-V2's group_limited_greedy).
enum class GroupScore { kTopTwoSum, kMax };

// What model.qk_norm's RMSNorms span: each head of q and of k (Qwen3's, Gemma 3's), or each
// token's whole q and whole k projection (OLMo 2's, OLMoE's).
enum class QkNormSpan { kHead, kProjection };

struct MoeConfig {
  int experts = 0;  // 0: a dense model (no MoE layers)
  int top_k = 1;
  int shared_experts = 0;
  bool shared_gate = false;  // the shared experts' output gated per token (above)
  int every = 1;
  int dense_first = 0;  // the first blocks that keep their dense MLP whatever `every` says
  int ffn = 0;          // each expert's hidden size (the family's MLP shape)
  MoeScore score = MoeScore::kSoftmax;
  bool normalize_top_k = false;
  float routed_scale = 1.0f;  // the routed experts' combine weights are multiplied by it
  // Group-limited routing (DeepSeek-V3's, V2's): the experts split into `groups` equal groups in
  // index order, each group scored by `group_score` over its score + bias values (the sum of its
  // two best, or its best), and a token's picks come from the group_top_k best groups only (0:
  // every group, no limit).
  int groups = 1;
  int group_top_k = 0;
  GroupScore group_score = GroupScore::kTopTwoSum;
  MoeBalance balance = MoeBalance::kAuxLoss;
  float aux_loss_coeff = 0.01f;
  float bias_update_rate = 0.001f;
  // ST-MoE's router z-loss: each micro-batch's objective gains z_loss_coeff times the mean over
  // its tokens of the squared log-sum-exp of the router's logits (0: none), whatever `balance`.
  float z_loss_coeff = 0.0f;
  // 0: dropless. Otherwise each expert takes at most ceil(capacity_factor · tokens · top_k /
  // experts) of a micro-batch's picks, in token order; the rest are dropped (counted).
  float capacity_factor = 0.0f;

  bool enabled() const { return experts > 0; }
  // The most of a micro-batch's `picks` (tokens · top_k) one expert takes: all of them when
  // dropless, else ceil(capacity_factor · picks / experts).
  int64_t CapacityPerExpert(int64_t picks) const {
    if (capacity_factor <= 0) return picks;
    return static_cast<int64_t>(
        std::ceil(double{capacity_factor} * static_cast<double>(picks) / experts));
  }
  bool IsMoeLayer(int layer) const {
    return enabled() && layer >= dense_first && (layer + 1) % every == 0;
  }
  // How many of `layers` blocks are MoE blocks.
  int MoeLayers(int layers) const {
    int count = 0;
    for (int l = 0; l < layers; ++l) count += IsMoeLayer(l) ? 1 : 0;
    return count;
  }
  bool has_bias() const { return enabled() && balance == MoeBalance::kBias; }
  // The groups a token's picks may come from, and whether that leaves some out.
  int kept_groups() const { return group_top_k > 0 ? group_top_k : groups; }
  bool limits_groups() const { return kept_groups() < groups; }
};

// Llama 3's scaling of RoPE's long wavelengths (transformers' rope_type llama3; the formula is
// in kernels/rope_frequencies.h), or with `linear` position interpolation (rope_type linear:
// every pair turns factor times slower; Gemma 3's global blocks): factor 0 for none.
struct RopeScaling {
  bool linear = false;  // the llama3 fields below are then unused
  float factor = 0.0f;
  float low_freq_factor = 1.0f;
  float high_freq_factor = 4.0f;
  int original_max_seq = 8192;  // the context the model was first trained on
  // LongRoPE (transformers' rope_type longrope; factor stays 0): pair i of the rotated dimensions
  // turns short_factor[i] times slower while a pass covers at most original_max_seq positions,
  // long_factor[i] times beyond, and the cosines and sines are multiplied by attention_factor.
  bool longrope = false;
  std::vector<float> short_factor, long_factor;
  float attention_factor = 1.0f;
  // YaRN (transformers' rope_type yarn; factor > 0): a pair that turns more than beta_fast times
  // over original_max_seq positions keeps its rate, one that turns fewer than beta_slow times
  // turns factor times slower, the pairs between blend linearly (their ends rounded out to whole
  // pairs when `truncate`), and the cosines and sines are multiplied by attention_factor.
  bool yarn = false;
  float beta_fast = 32.0f;
  float beta_slow = 1.0f;
  bool truncate = true;

  bool enabled() const { return factor > 0.0f || longrope; }
  bool operator==(const RopeScaling&) const = default;
};

// LongRoPE's default attention factor (the paper's, transformers'): for a context extended
// `extension` times past original_max_seq (transformers' factor, else max_position_embeddings /
// original_max_position_embeddings), √(1 + ln extension / ln original_max_seq); 1 when it is not
// extended.
inline float LongRopeAttentionFactor(double extension, int original_max_seq) {
  if (!(extension > 1.0) || original_max_seq < 2) return 1.0f;
  return static_cast<float>(
      std::sqrt(1.0 + std::log(extension) / std::log(static_cast<double>(original_max_seq))));
}

// YaRN's attention scale for a context extended `factor` times (the paper's, transformers'):
// 0.1 · weight · ln factor + 1, 1 when it is not extended. Its default attention factor is this
// scale at weight 1; DeepSeek's configs give the ratio of two weights' scales (mscale over
// mscale_all_dim).
inline double YarnScale(double factor, double weight = 1.0) {
  return factor > 1.0 ? 0.1 * weight * std::log(factor) + 1.0 : 1.0;
}
inline float YarnAttentionFactor(double factor) { return static_cast<float>(YarnScale(factor)); }

// Llama family: multi-head latent attention (DeepSeek-V2's and V3's, Kimi K2's). Each token's
// keys and values come from one latent of kv_rank, RMS-normed and decompressed per head:
// kv_a [kv_rank + rope_dim, width] gives the latent and one rotary key of rope_dim that every
// head shares; kv_b [heads · (nope + value_dim), kv_rank] gives each head's key (after the
// shared rotary part, nope = head_dim − rope_dim wide) and value (value_dim wide). The queries
// come from a latent of q_rank the same way (q_a [q_rank, width], an RMSNorm, q_b
// [heads · head_dim, q_rank]), or with q_rank 0 from the input directly ([heads · head_dim,
// width]). A head is its rope_dim rotary dimensions, then its nope others; the output
// projection reads heads · value_dim. The latents' RMSNorms take norm_eps, DeepSeek's 1e-6
// whatever the model's other norms take (its reference code and transformers' leave them at
// their class's default).
struct LatentAttention {
  int q_rank = 0;
  int kv_rank = 0;  // 0: ordinary attention
  int value_dim = 0;
  float norm_eps = 1e-6f;
  bool enabled() const { return kv_rank > 0; }
};

struct ModelConfig {
  ModelFamily family = ModelFamily::kGpt2;
  int layers = 2;
  int width = 64;        // model dimension C
  int heads = 4;         // query heads, each head_dim() wide
  int kv_heads = 4;      // key/value heads (== heads for GPT-2)
  int ffn_hidden = 256;  // MLP hidden size (GPT-2: 4C; Llama: SwiGLU hidden)
  int vocab = 256;
  int max_seq = 64;  // learned position table size (GPT-2) / longest sequence (Llama)
  bool tied_embeddings = true;
  // Llama family: biases on the query, key and value projections (Qwen2's layout; the output
  // projection and the MLP stay without). GPT-2's linears always have biases (false there).
  bool qkv_bias = false;
  // Llama family: model.head_dim when the heads are not width / heads wide (Mistral Nemo's and
  // Qwen3's are wider: heads · head_dim exceeds the width); 0 for width / heads.
  int explicit_head_dim = 0;
  // Llama family: an RMSNorm over each query and key head before RoPE, one weight of head_dim
  // for the queries and one for the keys (Qwen3's layout); with qk_norm_span kProjection one
  // RMSNorm over each token's whole q projection (weight heads·head_dim) and one over its whole k
  // projection (kv_heads·head_dim), OLMo 2's and OLMoE's.
  bool qk_norm = false;
  QkNormSpan qk_norm_span = QkNormSpan::kHead;
  // Llama family: each query attends to this many positions, its own and the ones just before it
  // (Mistral's, Phi-3's sliding window); 0 for every earlier position.
  int sliding_window = 0;
  // Llama family, with a sliding window: the blocks (counted from 0) that attend to every earlier
  // position all the same (Gemma's global layers, Qwen2's first max_window_layers); empty for
  // the window in every block. Increasing, each below layers.
  std::vector<int32_t> full_attention_layers;
  // Llama family, with a sliding window: the RoPE base of the blocks that use it, unscaled (Gemma
  // 3's rope_local_base_freq); 0 for rope_theta (and rope_scaling) in every block.
  float rope_local_theta = 0.0f;
  // Llama family: an RMSNorm on the attention's output and one on the MLP's before each joins the
  // residual stream, besides the norms before them (Gemma 2's and 3's), each a weight of width.
  bool post_norms = false;
  // Llama family, with post_norms: false drops the norms before the attention and the MLP, so
  // each branch reads the residual stream itself and only its output is normed (OLMo 2's blocks).
  bool pre_norms = true;
  // Llama family: the MLP's gate is GELU with the tanh approximation instead of SiLU: GeGLU in
  // place of SwiGLU (Gemma's MLP).
  bool geglu = false;
  // Llama family: the token embeddings are multiplied by √width on the way in, in fp32 (Gemma's);
  // a tied output head uses them unscaled.
  bool scale_embeddings = false;
  // Attention scores are scaled by attention_scale_dim^-1/2 instead of head_dim^-1/2 (Gemma 2's
  // and 3's query_pre_attn_scalar); 0 for head_dim.
  int attention_scale_dim = 0;
  // Attention scores s become C·tanh(s / C) after the scale and before the mask and softmax
  // (Gemma 2's attn_logit_softcapping); 0 for none.
  float attention_softcap = 0.0f;
  // The output logits z become C·tanh(z / C) before the loss and sampling (Gemma 2's
  // final_logit_softcapping); 0 for none.
  float logit_softcap = 0.0f;
  // PaLM's z-loss on the output logits: z_loss_coeff · lse² joins each token's cross-entropy in
  // training (lse the log-sum-exp of its logits, after any soft cap), which keeps the softmax's
  // normaliser near 1; 0 for none. An objective term: checkpoints, exports, evaluation and
  // sampling do not see it.
  float z_loss_coeff = 0.0f;
  // Attention within documents (block-causal, Llama 3's and TorchTitan's document mask): a
  // position sees only the keys from the last occurrence of this token at or before it, so a
  // sequence packed from several documents trains as if each stood alone (positions still count
  // from the sequence's start). The token begins each document: llm.c's GPT-2 shards and
  // `trainyard tokenize --separator` put it before each, Llama 3's template <|begin_of_text|>.
  // −1 for attention across the whole sequence. Training and evaluation only (checkpoints and
  // exports do not carry it); CPU ranks only until the CUDA kernels' mask has run on a device.
  int32_t document_token = -1;
  // Llama family, Granite's multipliers (1, or 0 for the attention's, where they change nothing):
  // the token embeddings times embedding_multiplier on the way in (not with scale_embeddings; a
  // tied output head uses them unmultiplied); each block's attention and MLP output times
  // residual_multiplier before it joins the residual stream; attention scores times
  // attention_multiplier in place of head_dim^-1/2 (not with attention_scale_dim); the output
  // logits divided by logits_scaling before any soft cap, the loss and sampling.
  float embedding_multiplier = 1.0f;
  float residual_multiplier = 1.0f;
  float attention_multiplier = 0.0f;
  float logits_scaling = 1.0f;
  float norm_eps = 1e-5f;
  float rope_theta = 10000.0f;
  // Llama family: the dimensions of each query and key head that RoPE turns, the first ones
  // (Phi-4 mini's partial_rotary_factor · head_dim); 0 for all head_dim of them.
  int rope_dim = 0;
  // Llama family: the blocks (counted from 0) whose queries and keys RoPE leaves unturned, so
  // that their attention sees no positions but the causal mask's (SmolLM3's NoPE layers, every
  // fourth); empty for RoPE in every block. Increasing, each below layers.
  std::vector<int32_t> nope_layers;
  RopeScaling rope_scaling;
  bool recompute = false;  // recompute each layer's activations in the backward pass
  MoeConfig moe;
  LatentAttention latent;

  // The factor the token embeddings are multiplied by: √width with scale_embeddings, else
  // embedding_multiplier (1 unless set).
  float embedding_scale() const {
    return scale_embeddings ? static_cast<float>(std::sqrt(static_cast<double>(width)))
                            : embedding_multiplier;
  }
  int head_dim() const { return explicit_head_dim > 0 ? explicit_head_dim : width / heads; }
  // The factor attention scores are multiplied by before the softmax (and any soft cap).
  float attention_scale() const {
    if (attention_multiplier > 0.0f) return attention_multiplier;
    const int dim = attention_scale_dim > 0 ? attention_scale_dim : head_dim();
    return 1.0f / std::sqrt(static_cast<float>(dim));
  }
  int rotary_dim() const { return rope_dim > 0 ? rope_dim : head_dim(); }
  // Whether any of Granite's multipliers is set, and the first one that is (for messages).
  bool HasGraniteMultipliers() const { return GraniteField() != nullptr; }
  const char* GraniteField() const;
  // Whether RoPE turns block `layer`'s queries and keys: a llama block not in nope_layers.
  bool RotatesLayer(int layer) const;
  // The value heads' width: head_dim, or latent attention's value_dim.
  int value_head_dim() const { return latent.enabled() ? latent.value_dim : head_dim(); }
  // The packed row attention reads: queries and keys of head_dim, values of value_head_dim.
  int qkv_width() const { return (heads + kv_heads) * head_dim() + kv_heads * value_head_dim(); }
  // qk_norm: the widths of the query norm's and the key norm's weights.
  // RMSNorms (or LayerNorms) of each block: before the attention and the MLP, and with
  // post_norms after them.
  int norms_per_block() const { return (pre_norms ? 2 : 0) + (post_norms ? 2 : 0); }
  bool NormsWholeProjection() const { return qk_norm && qk_norm_span == QkNormSpan::kProjection; }
  int q_norm_width() const { return NormsWholeProjection() ? heads * head_dim() : head_dim(); }
  int k_norm_width() const { return NormsWholeProjection() ? kv_heads * head_dim() : head_dim(); }
  // The attention's output width, heads · value_head_dim (the model's width unless
  // model.head_dim or latent attention says otherwise): what the output projection reads.
  int attention_width() const { return heads * value_head_dim(); }
  // The mean of the query-key and the value widths, heads · (head_dim + value_head_dim) / 2: the
  // width PaLM's attention count (4·width·span per token and layer forward) takes.
  double attention_flop_width() const { return heads * (head_dim() + value_head_dim()) / 2.0; }
  // The window block `layer` attends with: sliding_window, or 0 (every earlier position) in one
  // of full_attention_layers.
  int WindowOf(int layer) const;
  // The sequence length PaLM's attention count (4·h·s per token and layer forward) takes for
  // block `layer` of a causal model at `seq_len`: seq_len itself (about twice the mean keys a
  // query sees), or with a sliding window W below it twice the window's mean,
  // (W·(W + 1) / 2 + (s − W)·W) / s. Without `layer`, the mean over the blocks.
  double AttendedSpan(double seq_len, int layer) const;
  double AttendedSpan(double seq_len) const;
  // Number of trainable parameters (counted once when embeddings are tied).
  int64_t ParameterCount() const;
  // Latent attention's projections of one block, their norms included (the output projection
  // not): q_a, its norm and q_b (or q), kv_a, its norm and kv_b.
  int64_t LatentProjectionCount() const;
  // Parameters one token's computation uses: with MoE layers, the router, top_k routed experts
  // and the shared experts of each (equal to ParameterCount for a dense model).
  int64_t ActiveParameterCount() const;
};

std::string FamilyName(ModelFamily family);
[[nodiscard]] absl::StatusOr<ModelFamily> ParseFamily(const std::string& name);

// Named presets, from debug sizes up to GPT-2 124M and a Llama-style 1B.
[[nodiscard]] absl::StatusOr<ModelConfig> Preset(const std::string& name);
std::vector<std::string> PresetNames();

// Checks internal consistency. Errors are INVALID_ARGUMENT naming the field under `path_prefix`
// (e.g. "model.heads: width 100 is not divisible by heads 3"). The moe fields are checked unless
// moe.experts is 0 (a dense model): experts 1..65536, top_k 1..experts, shared_experts >= 0,
// every 1..layers, ffn >= 1, aux_loss_coeff >= 0, bias_update_rate > 0, capacity_factor 0 or
// positive, the reals finite ("model.moe.top_k: must be between 1 and experts 4, got 5").
[[nodiscard]] absl::Status ValidateModelConfig(const ModelConfig& config,
                                               const std::string& path_prefix = "model");

}  // namespace trainyard::config

#endif  // TRAINYARD_CONFIG_MODEL_CONFIG_H_
