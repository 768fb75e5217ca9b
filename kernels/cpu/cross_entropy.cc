#include "kernels/cpu/cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/fast_math.h"
#include "kernels/soft_cap.h"

namespace trainyard::kernels::cpu {
namespace {

float RowMax(const float* x, int64_t n) {
  float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
  for (int64_t j = 0; j < n; ++j) mx = std::max(mx, x[j]);
  return mx;
}

// One row of SoftmaxCrossEntropy: its loss, and its log-sum-exp in *lse (when not null); x becomes
// the softmax's gradient when write_grad, the softmax term times 1 + 2·z_loss·lse (the z-loss's
// share).
double PlainRow(float* x, int32_t target, int64_t vocab, float grad_scale, bool write_grad,
                float z_loss, float* lse) {
  const float target_logit = x[target];
  const float mx = RowMax(x, vocab);
  double sum = 0.0;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < vocab; ++j) {
    x[j] = FastExp(x[j] - mx);
    sum += x[j];
  }
  const double row_lse = mx + std::log(sum);
  if (lse != nullptr) *lse = static_cast<float>(row_lse);
  if (write_grad) {
    const float factor =
        static_cast<float>(grad_scale * ZLossFactor(z_loss, static_cast<float>(row_lse)) / sum);
#pragma omp simd
    for (int64_t j = 0; j < vocab; ++j) x[j] *= factor;
    x[target] -= grad_scale;
  }
  return row_lse - target_logit;
}

// The same under a soft cap: x holds the capped logits z, read twice (the sum of exponentials,
// then the gradient, which needs z for its 1 − (z / C)²).
double CappedRow(float* x, int32_t target, int64_t vocab, float grad_scale, bool write_grad,
                 float cap, float z_loss, float* lse) {
  const float target_logit = x[target];
  const float mx = RowMax(x, vocab);
  double sum = 0.0;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < vocab; ++j) sum += FastExp(x[j] - mx);
  const double row_lse = mx + std::log(sum);
  if (lse != nullptr) *lse = static_cast<float>(row_lse);
  if (write_grad) {
    const float factor =
        static_cast<float>(grad_scale * ZLossFactor(z_loss, static_cast<float>(row_lse)) / sum);
    const float inv_cap = InverseCap(cap);
    for (int64_t j = 0; j < vocab; ++j) {
      const float g = FastExp(x[j] - mx) * factor - (j == target ? grad_scale : 0.0f);
      x[j] = ThroughCap(g, x[j], inv_cap);
    }
  }
  return row_lse - target_logit;
}

}  // namespace

void SoftCap(float* x, int64_t rows, int64_t cols, int64_t ld, float cap) {
  const float inv = InverseCap(cap);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    float* row = x + r * ld;
    for (int64_t j = 0; j < cols; ++j) row[j] = SoftCapped(row[j], cap, inv);
  }
}

double SoftmaxCrossEntropy(float* logits, const int32_t* targets, int64_t rows, int64_t vocab,
                           int64_t ld, float grad_scale, bool write_grad, float softcap,
                           float z_loss, float* lse) {
  std::vector<double> row_loss(rows);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    float* x = logits + r * ld;
    float* row_lse = lse != nullptr ? &lse[r] : nullptr;
    row_loss[r] =
        softcap > 0.0f
            ? CappedRow(x, targets[r], vocab, grad_scale, write_grad, softcap, z_loss, row_lse)
            : PlainRow(x, targets[r], vocab, grad_scale, write_grad, z_loss, row_lse);
  }
  double total = 0.0;
  for (double l : row_loss) total += l;  // fixed order: deterministic
  return total;
}

void CrossEntropyShardStats(const float* logits, const int32_t* local_targets, int64_t rows,
                            int64_t vocab, float* stats) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = logits + r * vocab;
    const float mx = RowMax(x, vocab);
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < vocab; ++j) sum += FastExp(x[j] - mx);
    stats[3 * r] = mx;
    stats[3 * r + 1] = sum;
    stats[3 * r + 2] = local_targets[r] >= 0 ? x[local_targets[r]] : 0.0f;
  }
}

void CrossEntropyShardGrad(float* logits, const int32_t* local_targets, const float* lse,
                           int64_t rows, int64_t vocab, float grad_scale, float softcap,
                           float z_loss) {
  const float inv_cap = InverseCap(softcap);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    float* x = logits + r * vocab;
    const float l = lse[r], scale = grad_scale * ZLossFactor(z_loss, l);
    if (inv_cap == 0.0f) {
#pragma omp simd
      for (int64_t j = 0; j < vocab; ++j) x[j] = scale * FastExp(x[j] - l);
      if (local_targets[r] >= 0) x[local_targets[r]] -= grad_scale;
      continue;
    }
    for (int64_t j = 0; j < vocab; ++j) {
      const float g = scale * FastExp(x[j] - l) - (j == local_targets[r] ? grad_scale : 0.0f);
      x[j] = ThroughCap(g, x[j], inv_cap);
    }
  }
}

double CrossEntropyMergeShardStats(const float* gathered, int ranks, int64_t stride, int64_t rows,
                                   float* lse, float* row_loss) {
  double total = 0.0;
  for (int64_t r = 0; r < rows; ++r) {
    double mx = -INFINITY, target = 0.0, sum = 0.0;
    for (int k = 0; k < ranks; ++k) mx = std::max(mx, double{gathered[3 * (k * stride + r)]});
    for (int k = 0; k < ranks; ++k) {
      const float* s = &gathered[3 * (k * stride + r)];
      sum += double{s[1]} * std::exp(double{s[0]} - mx);
      target += s[2];
    }
    const double row_lse = mx + std::log(sum);
    lse[r] = static_cast<float>(row_lse);
    if (row_loss != nullptr) row_loss[r] = static_cast<float>(row_lse - target);
    total += row_lse - target;
  }
  return total;
}

}  // namespace trainyard::kernels::cpu
