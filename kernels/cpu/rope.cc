#include "kernels/cpu/rope.h"

#include <cmath>
#include <vector>

namespace trainyard::kernels::cpu {
namespace {

void Rotate(float* qkv, int64_t b, int64_t t, int64_t heads, int64_t kv_heads, int64_t d,
            int64_t value_dim, const RopeFrequencies& freq, int64_t first_position,
            float direction) {
  const int64_t half = RopeRotaryDim(freq, d) / 2;
  std::vector<float> cos_table(t * half), sin_table(t * half);
  std::vector<double> inv_freq(half);
  for (int64_t i = 0; i < half; ++i) inv_freq[i] = RopeInvFreq(freq, i, 2 * half);
  for (int64_t p = 0; p < t; ++p) {
    for (int64_t i = 0; i < half; ++i) {
      const double angle = static_cast<double>(first_position + p) * inv_freq[i];
      cos_table[p * half + i] = static_cast<float>(freq.magnitude * std::cos(angle));
      sin_table[p * half + i] = static_cast<float>(direction * freq.magnitude * std::sin(angle));
    }
  }
  const int64_t row_width = (heads + kv_heads) * d + kv_heads * (value_dim > 0 ? value_dim : d);
  const int64_t rotated_heads = heads + kv_heads;  // queries then keys; values are not rotated
#pragma omp parallel for schedule(static)
  for (int64_t row = 0; row < b * t; ++row) {
    const int64_t p = row % t;
    const float* cs = cos_table.data() + p * half;
    const float* sn = sin_table.data() + p * half;
    for (int64_t h = 0; h < rotated_heads; ++h) {
      float* x = qkv + row * row_width + h * d;
      for (int64_t i = 0; i < half; ++i) {
        const float x1 = x[i], x2 = x[i + half];
        x[i] = x1 * cs[i] - x2 * sn[i];
        x[i + half] = x2 * cs[i] + x1 * sn[i];
      }
    }
  }
}

}  // namespace

void RopeForward(float* qkv, int64_t b, int64_t t, int64_t heads, int64_t kv_heads, int64_t d,
                 const RopeFrequencies& freq, int64_t first_position, int64_t value_dim) {
  Rotate(qkv, b, t, heads, kv_heads, d, value_dim, freq, first_position, 1.0f);
}

void RopeBackward(float* dqkv, int64_t b, int64_t t, int64_t heads, int64_t kv_heads, int64_t d,
                  const RopeFrequencies& freq, int64_t first_position, int64_t value_dim) {
  Rotate(dqkv, b, t, heads, kv_heads, d, value_dim, freq, first_position, -1.0f);
}

}  // namespace trainyard::kernels::cpu
