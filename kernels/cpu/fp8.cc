#include "kernels/cpu/fp8.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace trainyard::kernels::cpu {

float AbsMax(const float* x, int64_t n) {
  float amax = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    if (std::isnan(x[i])) return std::nanf("");
    amax = std::max(amax, std::fabs(x[i]));
  }
  return amax;
}

float Fp8Scale(float amax, Fp8Format f) { return Fp8Max(f) / std::max(amax, kFp8MinAmax); }

void QuantizeFp8(const float* x, int64_t rows, int64_t cols, float scale, Fp8Format f, uint8_t* out,
                 uint8_t* out_t) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const uint8_t v = EncodeFp8(x[r * cols + c] * scale, f);
      out[r * cols + c] = v;
      if (out_t != nullptr) out_t[c * rows + r] = v;
    }
  }
}

}  // namespace trainyard::kernels::cpu
