// Rotary position embedding (half-split convention) applied in place to the query and key heads
// of a packed qkv activation [b, t, (heads + kv_heads) · d + kv_heads · dv] (dv = value_dim, or d
// when 0; kernels/cpu/attention.h's layout): with r = the rotated dimensions
// (d, or freq.rotary_dim), for i < r/2 the pair (x[i], x[i + r/2]) of position p is rotated by
// p · inv_freq(i) (kernels/rope_frequencies.h: theta^(-2i/r), or a scaling of it) and scaled by
// freq.magnitude; dimensions from r on pass through. Row j of each sequence has position
// first_position + j (a chunk of a longer sequence under context parallelism).
#ifndef TRAINYARD_KERNELS_CPU_ROPE_H_
#define TRAINYARD_KERNELS_CPU_ROPE_H_

#include <cstdint>

#include "kernels/rope_frequencies.h"

namespace trainyard::kernels::cpu {

void RopeForward(float* qkv, int64_t b, int64_t t, int64_t heads, int64_t kv_heads, int64_t d,
                 const RopeFrequencies& freq, int64_t first_position, int64_t value_dim = 0);
// The gradient of a rotation is the inverse rotation (times the same magnitude): applied in
// place to dqkv.
void RopeBackward(float* dqkv, int64_t b, int64_t t, int64_t heads, int64_t kv_heads, int64_t d,
                  const RopeFrequencies& freq, int64_t first_position, int64_t value_dim = 0);

}  // namespace trainyard::kernels::cpu

#endif  // TRAINYARD_KERNELS_CPU_ROPE_H_
