#include "kernels/cpu/moe.h"

#include <cblas.h>

#include <algorithm>

namespace trainyard::kernels::cpu {

void GatherRows(float* out, const float* inp, const int32_t* rows, const float* scale,
                int64_t count, int64_t cols) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < count; ++r) {
    const float* from = inp + int64_t{rows[r]} * cols;
    float* to = out + r * cols;
    const float s = scale != nullptr ? scale[r] : 1.0f;
#pragma omp simd
    for (int64_t c = 0; c < cols; ++c) to[c] = s * from[c];
  }
}

void CombineRows(float* out, const float* inp, const int32_t* slots, const float* weights,
                 int64_t rows, int64_t k, int64_t cols, bool accumulate) {
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < rows; ++t) {
    float* to = out + t * cols;
    if (!accumulate) std::fill_n(to, cols, 0.0f);
    for (int64_t j = 0; j < k; ++j) {
      const int32_t slot = slots[t * k + j];
      if (slot < 0) continue;
      const float* from = inp + int64_t{slot} * cols;
      const float w = weights != nullptr ? weights[t * k + j] : 1.0f;
#pragma omp simd
      for (int64_t c = 0; c < cols; ++c) to[c] += w * from[c];
    }
  }
}

void RowDots(float* out, const float* a, const int32_t* a_rows, const float* b, int64_t count,
             int64_t cols) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < count; ++r) {
    const float* x = a + int64_t{a_rows[r]} * cols;
    const float* y = b + r * cols;
    float sum = 0.0f;
    for (int64_t c = 0; c < cols; ++c) sum += x[c] * y[c];
    out[r] = sum;
  }
}

void LinearBackwardAccumulate(float* dinp, float* dweight, const float* dout, const float* inp,
                              const float* weight, int64_t m, int64_t n, int64_t k) {
  if (m == 0) return;
  if (dinp != nullptr) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, k, n, 1.0f, dout, n, weight, k, 1.0f,
                dinp, k);
  }
  if (dweight != nullptr) {
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, k, m, 1.0f, dout, n, inp, k, 1.0f,
                dweight, k);
  }
}

}  // namespace trainyard::kernels::cpu
