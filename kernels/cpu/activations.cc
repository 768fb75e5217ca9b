#include "kernels/cpu/activations.h"

#include <cmath>

#include "kernels/cpu/fast_math.h"

namespace trainyard::kernels::cpu {
namespace {

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCoeff = 0.044715f;

inline float Gelu(float x) {
  return 0.5f * x * (1.0f + FastTanh(kSqrt2OverPi * (x + kGeluCoeff * x * x * x)));
}
// gelu'(x).
inline float GeluSlope(float x) {
  const float t = FastTanh(kSqrt2OverPi * (x + kGeluCoeff * x * x * x));
  const float dt = (1.0f - t * t) * kSqrt2OverPi * (1.0f + 3.0f * kGeluCoeff * x * x);
  return 0.5f * (1.0f + t) + 0.5f * x * dt;
}

// The gate's value g(x).
template <GluGate kGate>
inline float GateValue(float x) {
  if constexpr (kGate == GluGate::kSilu) {
    return x * FastSigmoid(x);
  } else {
    return Gelu(x);
  }
}
template <GluGate kGate>
void GluForwardOf(float* out, const float* inp, int64_t rows, int64_t f) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* gate = inp + r * 2 * f;
    const float* up = gate + f;
    float* y = out + r * f;
#pragma omp simd
    for (int64_t j = 0; j < f; ++j) y[j] = GateValue<kGate>(gate[j]) * up[j];
  }
}

template <GluGate kGate>
void GluBackwardOf(float* dinp, const float* dout, const float* inp, int64_t rows, int64_t f) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* gate = inp + r * 2 * f;
    const float* up = gate + f;
    const float* dy = dout + r * f;
    float* dgate = dinp + r * 2 * f;
    float* dup = dgate + f;
#pragma omp simd
    for (int64_t j = 0; j < f; ++j) {
      const float g = gate[j];
      if constexpr (kGate == GluGate::kSilu) {
        const float s = FastSigmoid(g);
        dgate[j] = dy[j] * up[j] * s * (1.0f + g * (1.0f - s));
        dup[j] = dy[j] * (g * s);
      } else {
        dgate[j] = dy[j] * up[j] * GeluSlope(g);
        dup[j] = dy[j] * Gelu(g);
      }
    }
  }
}

}  // namespace

void GeluForward(float* out, const float* inp, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) out[i] = Gelu(inp[i]);
}

void GeluBackward(float* dinp, const float* dout, const float* inp, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) dinp[i] = dout[i] * GeluSlope(inp[i]);
}

void GluForward(float* out, const float* inp, int64_t rows, int64_t f, GluGate gate) {
  gate == GluGate::kSilu ? GluForwardOf<GluGate::kSilu>(out, inp, rows, f)
                         : GluForwardOf<GluGate::kGeluTanh>(out, inp, rows, f);
}

void GluBackward(float* dinp, const float* dout, const float* inp, int64_t rows, int64_t f,
                 GluGate gate) {
  gate == GluGate::kSilu ? GluBackwardOf<GluGate::kSilu>(dinp, dout, inp, rows, f)
                         : GluBackwardOf<GluGate::kGeluTanh>(dinp, dout, inp, rows, f);
}

}  // namespace trainyard::kernels::cpu
