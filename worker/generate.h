// Text generation with a key/value cache: `trainyard sample`'s engine.
//
// A Generator holds a whole model (one process, no mesh) on a Backend and, per layer, the keys
// and values of every position so far, for as many positions as the request in hand needs. The
// prompt runs as one causal pass that fills the cache; each new token then runs alone, its query
// attending to the cached keys (the backend's attention block with every key visible), so a token
// costs one row through the model instead of the whole sequence again.
//
// Multi-head latent attention (model.latent_attention) caches what DeepSeek-V2's inference caches:
// per position, the shared rotary key (turned at its position) and the normed key/value latent,
// rope_dim + kv_rank elements a layer instead of a key and a value per head. The prompt's pass
// decompresses its keys and values into one layer's scratch and attends as training does; each
// later token attends over the latents directly (the absorbed form): its query head h's
// non-rotary part goes through the head's key up-projection (kv_b's rows for the head's keys, as
// q_nope_h · W_uk_h, kv_rank wide) so that it scores against the cached latents, its rotary part
// scores against the cached rotary key, every head reads the one cached row as multi-query
// attention reads its shared key, and the head's output over the latents goes through the
// head's value up-projection. The same scores and outputs as decompressed keys and values, summed
// in another order.
//
// A mixture-of-experts block routes each row as training does (worker/moe_routing.h: the same
// scores, picks, selection bias and combine weights) but drops no pick: a capacity_factor bounds
// the experts' load within a training micro-batch and has no meaning for one row at a time.
//
// Choosing a token: greedy (temperature 0: the largest logit, the lowest id on ties), else a draw
// from softmax(logits / temperature), over the top_k largest when top_k > 0, then over the
// nucleus when top_p < 1 (the most likely tokens, in order, up to and including the one whose
// probability brings their sum to top_p; ties in the order go to the lower id), as Hugging Face's
// generate filters (temperature, top-k, top-p); from a generator seeded with `seed`: the same
// seed gives the same text. Generation ends early after a token of `stop_ids` (the model's
// end-of-sequence tokens), which is the last one returned.
//
// Not thread-safe.
#ifndef TRAINYARD_WORKER_GENERATE_H_
#define TRAINYARD_WORKER_GENERATE_H_

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <vector>

#include "absl/status/statusor.h"
#include "config/model_config.h"
#include "worker/backend.h"
#include "worker/buffer.h"
#include "worker/head_norm.h"
#include "worker/shape/parameters.h"

namespace trainyard::worker {

struct SampleOptions {
  int tokens = 32;  // new tokens to generate
  float temperature = 0.0f;
  int top_k = 0;       // 0: every token
  float top_p = 1.0f;  // in (0, 1]; 1: every token top_k kept
  uint64_t seed = 0;
  std::vector<int32_t> stop_ids;  // generation ends after one of these

  bool Stops(int32_t token) const {
    return std::find(stop_ids.begin(), stop_ids.end(), token) != stop_ids.end();
  }
};

// The next token from the last position's logits (vocab floats), as described above; `rng`
// advances by one draw when temperature > 0.
int32_t ChooseToken(const std::vector<float>& logits, const SampleOptions& options,
                    std::mt19937_64& rng);

class Generator {
 public:
  // `params`: the model's tensors in ParameterLayout(model) order (one process's whole layout).
  // `backend` must outlive the generator.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Generator>> Create(
      const config::ModelConfig& model, Backend* backend, const float* params);

  // The `options.tokens` tokens that follow `prompt` (at least one token, each below the
  // vocabulary), fewer when one of `options.stop_ids` comes first (it ends the list); `on_token`
  // sees each as it is chosen. INVALID_ARGUMENT when prompt and new tokens together exceed the
  // model's max_seq, or top_p is outside (0, 1].
  // Generate's checks of its arguments, without generating.
  [[nodiscard]] absl::Status CheckRequest(const std::vector<int32_t>& prompt,
                                          const SampleOptions& options) const;

  [[nodiscard]] absl::StatusOr<std::vector<int32_t>> Generate(
      const std::vector<int32_t>& prompt, const SampleOptions& options,
      const std::function<void(int32_t)>& on_token = {});

  // The logits (vocab floats) the last token was chosen from: inside `on_token`, those of the
  // token it sees.
  const std::vector<float>& last_logits() const { return host_logits_; }

  // Activation elements the cache keeps per position, over all layers: a key and a value row per
  // layer, or (latent attention) the rotary key and the latent.
  int64_t CachePerPosition() const;

 private:
  Generator(const config::ModelConfig& model, Backend* backend);
  // Runs tokens [0, n) at positions [pos, pos + n) through the model, appending their keys and
  // values to the cache, and leaves the last row's logits in logits_.
  void Forward(const int32_t* tokens, int64_t n, int64_t pos);
  void Block(int layer, int64_t n, int64_t pos);
  void Project(int layer, int64_t n, bool prompt);
  // Latent attention: the n rows' rotary keys (turned) and normed latents join layer's cache, and
  // (pos > 0) each row attends over the cache in the absorbed form, into attn_.
  void CacheLatents(int layer, int64_t n, int64_t pos);
  void AbsorbedAttention(int layer, int64_t n, int64_t pos);
  // An MoE block's routed experts on norm_'s n rows, added onto tmp_ (overwritten when the block
  // has no shared experts).
  void RoutedExperts(int layer, int64_t n);
  // Room for `rows` positions: the activations and the key/value cache are sized by the request
  // in hand (its prompt and new tokens), not by max_seq, which a published model may set to
  // 131072. Grows only; a larger request allocates afresh.
  void Reserve(int64_t rows);
  const float* P(int64_t offset) const { return params_.data() + offset; }

  const config::ModelConfig model_;
  Backend* backend_;
  const ParameterLayout layout_;
  Buffer<float> params_;
  Buffer<int32_t> tokens_;
  // model.document_token: each row's document's first position, and the last document's so far
  // (a query sees only its document's keys, as in training).
  Buffer<int32_t> doc_starts_;
  int32_t doc_start_ = 0;
  // Activations for rows_ rows (Reserve); the cache [layer][position, kv_stride()].
  int64_t rows_ = 0;
  Buffer<Act> x_, norm_, qkv_, attn_, tmp_, fc_, act_, logits_;
  Buffer<float> mean_, rstd_, lse_;
  // qk_norm: the head norms' inputs, statistics and scratch (worker/head_norm.h).
  Buffer<Act> head_pre_, head_scratch_;
  Buffer<float> head_rstd_;
  // model.latent_attention: the latents, their norms' statistics and the projections' scratch
  // (worker/latent_attention.h), rows_ each.
  Buffer<Act> latent_q_, latent_q_normed_, latent_kv_, latent_kv_normed_, latent_scratch_;
  Buffer<float> latent_q_rstd_, latent_kv_rstd_;
  // The cache, rows_ · kv_stride() each: a value row as wide as a key row (latent attention's
  // value heads are narrower than its key heads; the attention reads both at one stride). Latent
  // attention: keys_ and values_ hold one layer's, the prompt pass's scratch, and latents_ the
  // cache, rows_ · (rope_dim + kv_rank) a layer, each row [rotary key | latent]; absorbed_q_ and
  // absorbed_out_ one row's absorbed queries [heads, rope_dim + kv_rank] and outputs
  // [heads, kv_rank].
  std::vector<Buffer<Act>> keys_, values_, latents_;
  Buffer<Act> absorbed_q_, absorbed_out_;
  int64_t kv_stride() const {
    return int64_t{model_.kv_heads} * std::max(model_.head_dim(), model_.value_head_dim());
  }
  std::vector<float> host_logits_;
  // MoE blocks: the router's logits, each permuted row's token, each pick's row and weight, the
  // experts' rows; the routing copy of the model has capacity_factor 0 (dropless). bias_[layer]:
  // the selection bias.
  config::MoeConfig routing_;
  Buffer<float> router_logits_, pick_weight_;
  Buffer<float> shared_gate_;  // moe.shared_gate: each row's gate [rows]
  Buffer<int32_t> source_, slot_;
  Buffer<Act> expert_in_, expert_fc_, expert_act_, expert_out_;
  std::vector<float> host_router_logits_;
  std::vector<std::vector<float>> bias_;
};

}  // namespace trainyard::worker

#endif  // TRAINYARD_WORKER_GENERATE_H_
