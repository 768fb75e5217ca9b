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
    const float* x = inp + r * c;
    float ss = 0.0f;
    for (int64_t j = 0; j < c; ++j) ss += x[j] * x[j];
    const float rs = 1.0f / std::sqrt(ss / c + eps);
    float* y = out + r * c;
    for (int64_t j = 0; j < c; ++j) y[j] = x[j] * rs * weight[j];
    rstd[r] = rs;
  }
}

void RmsNormBackward(float* dinp, float* dweight, const float* dout, const float* inp,
                     const float* weight, const float* rstd, int64_t rows, int64_t c) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = inp + r * c;
    const float* dy = dout + r * c;
    float dot = 0.0f;
    for (int64_t j = 0; j < c; ++j) dot += dy[j] * weight[j] * x[j] * rstd[r];
    dot /= c;
    float* dx = dinp + r * c;
    for (int64_t j = 0; j < c; ++j) {
      const float xhat = x[j] * rstd[r];
      dx[j] += (dy[j] * weight[j] - xhat * dot) * rstd[r];
    }
  }
  AccumulateNormParamGrads(dweight, nullptr, dout, inp, nullptr, rstd, rows, c);
}

}  // namespace trainyard::kernels::cpu
