// The rotation frequencies of a model's RoPE (kernels/rope_frequencies.h) from its config: the
// base rope_theta and its scaling (Llama 3's or linear) when model.rope_scaling is set, or a
// local block's base.
#ifndef TRAINYARD_WORKER_ROPE_H_
#define TRAINYARD_WORKER_ROPE_H_

#include "config/model_config.h"
#include "kernels/rope_frequencies.h"

namespace trainyard::worker {

// Block `layer`'s: with model.rope_local_theta, a block with the sliding window turns at that
// base, unscaled.
inline kernels::RopeFrequencies RopeOf(const config::ModelConfig& m, int layer) {
  if (m.rope_local_theta > 0 && m.WindowOf(layer) > 0) return {.theta = m.rope_local_theta};
  const config::RopeScaling& s = m.rope_scaling;
  return {.theta = m.rope_theta,
          .factor = s.enabled() ? s.factor : 0.0,
          .linear = s.linear,
          .low_freq_factor = s.low_freq_factor,
          .high_freq_factor = s.high_freq_factor,
          .original_max_seq = static_cast<double>(s.original_max_seq)};
}

}  // namespace trainyard::worker

#endif  // TRAINYARD_WORKER_ROPE_H_
