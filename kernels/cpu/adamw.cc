#include "kernels/cpu/adamw.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace trainyard::kernels::cpu {

void AdamWUpdate(float* param, const float* grad, float* m, float* v, int64_t n,
                 const AdamWStep& s) {
  const double bc1 = 1.0 - std::pow(static_cast<double>(s.beta1), static_cast<double>(s.step));
  const double bc2 = 1.0 - std::pow(static_cast<double>(s.beta2), static_cast<double>(s.step));
  const float step_size = static_cast<float>(s.lr / bc1);
  const float inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
  const float decay = 1.0f - s.lr * s.weight_decay;
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float g = grad[i] * s.grad_scale;
    const float mi = s.beta1 * m[i] + (1.0f - s.beta1) * g;
    const float vi = s.beta2 * v[i] + (1.0f - s.beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    param[i] = param[i] * decay - step_size * mi / (std::sqrt(vi) * inv_sqrt_bc2 + s.eps);
  }
}

double SumOfSquares(const float* x, int64_t n) {
  // Fixed-size blocks summed in order: the result does not depend on the thread count.
  constexpr int64_t kBlock = 4096;
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  std::vector<double> partial(blocks);
#pragma omp parallel for schedule(static)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    // Eight running sums, element i into sum i mod 8, then added in order: independent chains
    // the compiler keeps in vector registers, where one sum would wait on every add's latency.
    constexpr int kLanes = 8;
    double lanes[kLanes] = {};
    const int64_t begin = blk * kBlock, end = std::min(n, begin + kBlock);
    int64_t i = begin;
    for (; i + kLanes <= end; i += kLanes) {
      for (int l = 0; l < kLanes; ++l) lanes[l] += static_cast<double>(x[i + l]) * x[i + l];
    }
    for (; i < end; ++i) lanes[(i - begin) % kLanes] += static_cast<double>(x[i]) * x[i];
    double acc = 0.0;
    for (double lane : lanes) acc += lane;
    partial[blk] = acc;
  }
  double total = 0.0;
  for (double p : partial) total += p;
  return total;
}

void ScaleInPlace(float* x, int64_t n, float factor) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) x[i] *= factor;
}

void ScaleInto(float* out, const float* in, int64_t n, float factor) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) out[i] = in[i] * factor;
}

}  // namespace trainyard::kernels::cpu
