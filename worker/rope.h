// The rotation frequencies of a model's RoPE (kernels/rope_frequencies.h) from its config: the
// base rope_theta, the rotated part of each head (model.rope_dim), and its scaling (Llama 3's,
// linear, LongRoPE or YaRN) when model.rope_scaling is set, or a local block's base.
#ifndef TRAINYARD_WORKER_ROPE_H_
#define TRAINYARD_WORKER_ROPE_H_

#include <algorithm>
#include <cstdint>
#include <vector>

#include "config/model_config.h"
#include "kernels/rope_frequencies.h"

namespace trainyard::worker {

// Block `layer`'s, in a pass that covers `positions` positions of its sequence (the whole
// sequence's length in training, the last position + 1 in generation's passes): LongRoPE turns
// with its short factors up to original_max_seq positions and with its long ones beyond, as
// transformers chooses per forward pass (generation runs the whole sequence again when it first
// grows past original_max_seq: Generator::Generate). With model.rope_local_theta, a block with
// the sliding window turns at that base, unscaled.
inline kernels::RopeFrequencies RopeOf(const config::ModelConfig& m, int layer, int64_t positions) {
  kernels::RopeFrequencies f{.theta = m.rope_theta, .rotary_dim = m.rotary_dim()};
  if (m.rope_local_theta > 0 && m.WindowOf(layer) > 0) {
    f.theta = m.rope_local_theta;
    return f;
  }
  const config::RopeScaling& s = m.rope_scaling;
  if (s.longrope) {
    const std::vector<float>& factors =
        positions > s.original_max_seq ? s.long_factor : s.short_factor;
    f.pairs = static_cast<int>(std::min<size_t>(factors.size(), kernels::kMaxRopePairs));
    std::copy_n(factors.begin(), f.pairs, f.pair_factor);
    f.magnitude = s.attention_factor;
    return f;
  }
  f.factor = s.enabled() ? s.factor : 0.0;
  f.linear = s.linear;
  f.yarn = s.yarn;
  f.beta_fast = s.beta_fast;
  f.beta_slow = s.beta_slow;
  f.truncate = s.truncate;
  if (s.yarn) f.magnitude = s.attention_factor;
  f.low_freq_factor = s.low_freq_factor;
  f.high_freq_factor = s.high_freq_factor;
  f.original_max_seq = static_cast<double>(s.original_max_seq);
  return f;
}

}  // namespace trainyard::worker

#endif  // TRAINYARD_WORKER_ROPE_H_
