#include "kernels/cpu/embedding.h"

#include <algorithm>

#include "kernels/cpu/parallel.h"

namespace trainyard::kernels::cpu {

void EmbeddingForward(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                      int64_t b, int64_t t, int64_t c, float scale) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < b * t; ++r) {
    float* y = out + r * c;
    if (tokens[r] < 0) {  // a token another vocabulary shard owns: a zero row
      std::fill(y, y + c, 0.0f);
    } else {
      const float* e = wte + static_cast<int64_t>(tokens[r]) * c;
      if (scale == 1.0f) {
        std::copy(e, e + c, y);
      } else {
        for (int64_t j = 0; j < c; ++j) y[j] = scale * e[j];
      }
    }
    if (wpe != nullptr) {
      const float* p = wpe + (r % t) * c;
      for (int64_t j = 0; j < c; ++j) y[j] += p[j];
    }
  }
}

void EmbeddingBackward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                       int64_t b, int64_t t, int64_t c, float scale) {
  const int64_t blocks = (c + kColumnBlock - 1) / kColumnBlock;
#pragma omp parallel for schedule(static)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t c0 = blk * kColumnBlock;
    const int64_t c1 = std::min(c, c0 + kColumnBlock);
    for (int64_t r = 0; r < b * t; ++r) {
      const float* dy = dout + r * c;
      if (tokens[r] >= 0) {
        float* de = dwte + static_cast<int64_t>(tokens[r]) * c;
        for (int64_t j = c0; j < c1; ++j) de[j] += scale * dy[j];
      }
      if (dwpe != nullptr) {
        float* dp = dwpe + (r % t) * c;
        for (int64_t j = c0; j < c1; ++j) dp[j] += dy[j];
      }
    }
  }
}

}  // namespace trainyard::kernels::cpu
