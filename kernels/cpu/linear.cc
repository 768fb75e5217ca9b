#include "kernels/cpu/linear.h"

#include <cblas.h>

#include <algorithm>

#include "kernels/cpu/parallel.h"

namespace trainyard::kernels::cpu {

void LinearForward(float* out, const float* inp, const float* weight, const float* bias, int64_t m,
                   int64_t n, int64_t k) {
  float beta = 0.0f;
  if (bias != nullptr) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < m; ++i) std::copy(bias, bias + n, out + i * n);
    beta = 1.0f;
  }
  if (m == 1) {  // one row (generation's steps): one pass over the weight, see linear.h
    cblas_sgemv(CblasRowMajor, CblasNoTrans, n, k, 1.0f, weight, k, inp, 1, beta, out, 1);
    return;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, inp, k, weight, k, beta, out,
              n);
}

void LinearBackward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                    const float* weight, int64_t m, int64_t n, int64_t k) {
  if (dinp != nullptr && m == 1) {
    cblas_sgemv(CblasRowMajor, CblasTrans, n, k, 1.0f, weight, k, dout, 1, 0.0f, dinp, 1);
  } else if (dinp != nullptr) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, k, n, 1.0f, dout, n, weight, k, 0.0f,
                dinp, k);
  }
  if (dweight != nullptr) {
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, k, m, 1.0f, dout, n, inp, k, 1.0f,
                dweight, k);
  }
  if (dbias != nullptr) AccumulateColumnSums(dbias, dout, m, n);
}

void AddBias(float* out, const float* bias, int64_t m, int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < m; ++i) {
    float* row = out + i * n;
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) row[j] += bias[j];
  }
}

void AccumulateColumnSums(float* sums, const float* x, int64_t m, int64_t n) {
  const int64_t blocks = (n + kColumnBlock - 1) / kColumnBlock;
#pragma omp parallel for schedule(static)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t c0 = blk * kColumnBlock;
    const int64_t c1 = std::min(n, c0 + kColumnBlock);
    float acc[kColumnBlock] = {};
    for (int64_t i = 0; i < m; ++i) {
      const float* row = x + i * n;
      for (int64_t c = c0; c < c1; ++c) acc[c - c0] += row[c];
    }
    for (int64_t c = c0; c < c1; ++c) sums[c] += acc[c - c0];
  }
}

}  // namespace trainyard::kernels::cpu
