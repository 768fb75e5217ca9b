#include "kernels/cpu/activations.h"

#include <cmath>

#include "kernels/cpu/fast_math.h"

namespace trainyard::kernels::cpu {
namespace {

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCoeff = 0.044715f;

}  // namespace

void GeluForward(float* out, const float* inp, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float x = inp[i];
    out[i] = 0.5f * x * (1.0f + FastTanh(kSqrt2OverPi * (x + kGeluCoeff * x * x * x)));
  }
}

void GeluBackward(float* dinp, const float* dout, const float* inp, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float x = inp[i];
    const float t = FastTanh(kSqrt2OverPi * (x + kGeluCoeff * x * x * x));
    const float dt = (1.0f - t * t) * kSqrt2OverPi * (1.0f + 3.0f * kGeluCoeff * x * x);
    dinp[i] = dout[i] * (0.5f * (1.0f + t) + 0.5f * x * dt);
  }
}

void SwigluForward(float* out, const float* inp, int64_t rows, int64_t f) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* gate = inp + r * 2 * f;
    const float* up = gate + f;
    float* y = out + r * f;
#pragma omp simd
    for (int64_t j = 0; j < f; ++j) y[j] = gate[j] * FastSigmoid(gate[j]) * up[j];
  }
}

void SwigluBackward(float* dinp, const float* dout, const float* inp, int64_t rows, int64_t f) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* gate = inp + r * 2 * f;
    const float* up = gate + f;
    const float* dy = dout + r * f;
    float* dgate = dinp + r * 2 * f;
    float* dup = dgate + f;
#pragma omp simd
    for (int64_t j = 0; j < f; ++j) {
      const float s = FastSigmoid(gate[j]);
      const float silu = gate[j] * s;
      dgate[j] = dy[j] * up[j] * s * (1.0f + gate[j] * (1.0f - s));
      dup[j] = dy[j] * silu;
    }
  }
}

}  // namespace trainyard::kernels::cpu
