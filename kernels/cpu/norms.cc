#include "kernels/cpu/norms.h"

#include <algorithm>
#include <cmath>

#include "kernels/cpu/parallel.h"

namespace trainyard::kernels::cpu {
namespace {

// dweight[c] += Σ_rows dout · x̂ and (when dbias is set) dbias[c] += Σ_rows dout, where
// x̂ = (x - shift) · rstd; shift is null for RMSNorm. Column blocks keep it deterministic.
void AccumulateNormParamGrads(float* dweight, float* dbias, const float* dout, const float* inp,
                              const float* shift, const float* rstd, int64_t rows, int64_t c) {
  const int64_t blocks = (c + kColumnBlock - 1) / kColumnBlock;
#pragma omp parallel for schedule(static)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t c0 = blk * kColumnBlock;
    const int64_t c1 = std::min(c, c0 + kColumnBlock);
    float dw[kColumnBlock] = {};
    float db[kColumnBlock] = {};
    for (int64_t r = 0; r < rows; ++r) {
      const float* x = inp + r * c;
      const float* dy = dout + r * c;
      const float mu = shift ? shift[r] : 0.0f;
      for (int64_t j = c0; j < c1; ++j) {
        dw[j - c0] += dy[j] * ((x[j] - mu) * rstd[r]);
        db[j - c0] += dy[j];
      }
    }
    for (int64_t j = c0; j < c1; ++j) {
      dweight[j] += dw[j - c0];
      if (dbias) dbias[j] += db[j - c0];
    }
  }
}

// RMSNorm's steps on one row of c columns, shared by the whole-row norm and the norm whose rows
// are split over ranks (its sums and dots added over the ranks between the steps).
float SquareSum(const float* x, int64_t c) {
  float ss = 0.0f;
  for (int64_t j = 0; j < c; ++j) ss += x[j] * x[j];
  return ss;
}

// 1/sqrt(mean(x²) + eps) from Σx² over n columns.
float RmsOfSquares(float sum, int64_t n, float eps) { return 1.0f / std::sqrt(sum / n + eps); }

void ScaleRow(float* y, const float* x, const float* w, float rs, int64_t c) {
  for (int64_t j = 0; j < c; ++j) y[j] = x[j] * rs * w[j];
}

// Σ dy · w · x̂.
float NormDot(const float* dy, const float* w, const float* x, float rs, int64_t c) {
  float dot = 0.0f;
  for (int64_t j = 0; j < c; ++j) dot += dy[j] * w[j] * x[j] * rs;
  return dot;
}

// dx += (dy · w − x̂ · mean_dot) · rstd, mean_dot the row's Σ dy · w · x̂ over its n columns / n.
void RmsInputGrad(float* dx, const float* dy, const float* w, const float* x, float rs,
                  float mean_dot, int64_t c) {
  for (int64_t j = 0; j < c; ++j) {
    const float xhat = x[j] * rs;
    dx[j] += (dy[j] * w[j] - xhat * mean_dot) * rs;
  }
}

}  // namespace

void LayerNormForward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                      const float* bias, int64_t rows, int64_t c, float eps) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = inp + r * c;
    float sum = 0.0f;
    for (int64_t j = 0; j < c; ++j) sum += x[j];
    const float mu = sum / c;
    float var = 0.0f;
    for (int64_t j = 0; j < c; ++j) var += (x[j] - mu) * (x[j] - mu);
    const float rs = 1.0f / std::sqrt(var / c + eps);
    float* y = out + r * c;
    for (int64_t j = 0; j < c; ++j) y[j] = (x[j] - mu) * rs * weight[j] + bias[j];
    mean[r] = mu;
    rstd[r] = rs;
  }
}

void LayerNormBackward(float* dinp, float* dweight, float* dbias, const float* dout,
                       const float* inp, const float* weight, const float* mean, const float* rstd,
                       int64_t rows, int64_t c) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = inp + r * c;
    const float* dy = dout + r * c;
    float dnorm_mean = 0.0f, dnorm_xhat_mean = 0.0f;
    for (int64_t j = 0; j < c; ++j) {
      const float xhat = (x[j] - mean[r]) * rstd[r];
      const float dnorm = dy[j] * weight[j];
      dnorm_mean += dnorm;
      dnorm_xhat_mean += dnorm * xhat;
    }
    dnorm_mean /= c;
    dnorm_xhat_mean /= c;
    float* dx = dinp + r * c;
    for (int64_t j = 0; j < c; ++j) {
      const float xhat = (x[j] - mean[r]) * rstd[r];
      const float dnorm = dy[j] * weight[j];
      dx[j] += (dnorm - dnorm_mean - xhat * dnorm_xhat_mean) * rstd[r];
    }
  }
  AccumulateNormParamGrads(dweight, dbias, dout, inp, mean, rstd, rows, c);
}

void RmsNormForward(float* out, float* rstd, const float* inp, const float* weight, int64_t rows,
                    int64_t c, float eps) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    rstd[r] = RmsOfSquares(SquareSum(inp + r * c, c), c, eps);
    ScaleRow(out + r * c, inp + r * c, weight, rstd[r], c);
  }
}

void RmsNormBackward(float* dinp, float* dweight, const float* dout, const float* inp,
                     const float* weight, const float* rstd, int64_t rows, int64_t c) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float dot = NormDot(dout + r * c, weight, inp + r * c, rstd[r], c);
    RmsInputGrad(dinp + r * c, dout + r * c, weight, inp + r * c, rstd[r], dot / c, c);
  }
  AccumulateNormParamGrads(dweight, nullptr, dout, inp, nullptr, rstd, rows, c);
}

void RowSquareSums(float* sums, const float* x, int64_t rows, int64_t c) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) sums[r] = SquareSum(x + r * c, c);
}

void RmsNormFromSums(float* out, float* rstd, const float* inp, const float* weight, int64_t rows,
                     int64_t c, int64_t n, float eps) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    rstd[r] = RmsOfSquares(rstd[r], n, eps);
    ScaleRow(out + r * c, inp + r * c, weight, rstd[r], c);
  }
}

void RmsNormDots(float* dots, const float* dout, const float* inp, const float* weight,
                 const float* rstd, int64_t rows, int64_t c) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r)
    dots[r] = NormDot(dout + r * c, weight, inp + r * c, rstd[r], c);
}

void RmsNormBackwardFromDots(float* dinp, float* dweight, const float* dout, const float* inp,
                             const float* weight, const float* rstd, const float* dots,
                             int64_t rows, int64_t c, int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    RmsInputGrad(dinp + r * c, dout + r * c, weight, inp + r * c, rstd[r], dots[r] / n, c);
  }
  AccumulateNormParamGrads(dweight, nullptr, dout, inp, nullptr, rstd, rows, c);
}

}  // namespace trainyard::kernels::cpu
