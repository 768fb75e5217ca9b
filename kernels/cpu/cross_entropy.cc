#include "kernels/cpu/cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace trainyard::kernels::cpu {

double SoftmaxCrossEntropy(float* logits, const int32_t* targets, int64_t rows, int64_t vocab,
                           float grad_scale, bool write_grad) {
  std::vector<double> row_loss(rows);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    float* x = logits + r * vocab;
    float mx = -INFINITY;
    for (int64_t j = 0; j < vocab; ++j) mx = std::max(mx, x[j]);
    double sum = 0.0;
    for (int64_t j = 0; j < vocab; ++j) sum += std::exp(static_cast<double>(x[j] - mx));
    const double lse = mx + std::log(sum);
    row_loss[r] = lse - x[targets[r]];
    if (write_grad) {
      const float lse_f = static_cast<float>(lse);
      for (int64_t j = 0; j < vocab; ++j) x[j] = grad_scale * std::exp(x[j] - lse_f);
      x[targets[r]] -= grad_scale;
    }
  }
  double total = 0.0;
  for (double l : row_loss) total += l;  // fixed order: deterministic
  return total;
}

}  // namespace trainyard::kernels::cpu
