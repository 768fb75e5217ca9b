// The sizes of one block's latent attention projections over `rows` rows on one rank of a tensor-
// parallel group of `tp`, which holds heads / tp of the heads (model.latent_attention;
// worker/latent_attention.h runs them): plain arithmetic, which the planner's memory model reads
// as the engine allocates.
#ifndef TRAINYARD_WORKER_SHAPE_LATENT_SHAPE_H_
#define TRAINYARD_WORKER_SHAPE_LATENT_SHAPE_H_

#include <cstdint>

#include "config/model_config.h"

namespace trainyard::worker {

struct LatentShape {
  int64_t rows, width, heads, head_dim, rope, value_dim, q_rank, kv_rank;
  float eps;
  static LatentShape Of(const config::ModelConfig& c, int64_t rows, int tp = 1) {
    return {.rows = rows,
            .width = c.width,
            .heads = c.heads / tp,
            .head_dim = c.head_dim(),
            .rope = c.rope_dim,
            .value_dim = c.latent.value_dim,
            .q_rank = c.latent.q_rank,
            .kv_rank = c.latent.kv_rank,
            .eps = c.latent.norm_eps};
  }
  int64_t nope() const { return head_dim - rope; }
  int64_t q_width() const { return heads * head_dim; }
  int64_t kv_width() const { return heads * (nope() + value_dim); }  // kv_b's output
  int64_t latent_width() const { return kv_rank + rope; }            // kv_a's output
  int64_t qkv_row() const { return 2 * heads * head_dim + heads * value_dim; }
  // Activation elements of the scratch the forward and the backward use (per call, not kept):
  // q's, kv_b's and kv_a's outputs (or their gradients), the latents' gradients before and after
  // their norms, the rotary key's summed and one head's gradient, and the input's gradient from
  // the key/value path.
  int64_t scratch() const {
    return rows *
           (q_width() + kv_width() + latent_width() + 2 * kv_rank + 2 * rope + 2 * q_rank + width);
  }
  // Elements kept per block for the backward: the latents before and after their norms
  // (activations) and the norms' statistics (fp32).
  int64_t saved_acts() const { return rows * 2 * (q_rank + kv_rank); }
  int64_t saved_floats() const { return rows * ((q_rank > 0 ? 1 : 0) + 1); }
};

}  // namespace trainyard::worker

#endif  // TRAINYARD_WORKER_SHAPE_LATENT_SHAPE_H_
