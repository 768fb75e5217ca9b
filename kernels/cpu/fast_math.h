// Vectorisable transcendental functions for the CPU kernels. libm's expf/tanhf are scalar calls
// that the compiler cannot vectorise (without -ffast-math), and in a small model they cost more
// than the GEMMs. These are branch-free, so `#pragma omp simd` loops that call them become
// AVX2/AVX-512 code; being pure arithmetic they are also deterministic.
#ifndef TRAINYARD_KERNELS_CPU_FAST_MATH_H_
#define TRAINYARD_KERNELS_CPU_FAST_MATH_H_

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

namespace trainyard::kernels::cpu {

// e^x with a relative error below 2e-7 over the whole float range (Cephes' expf polynomial after
// range reduction x = n·ln2 + r, |r| ≤ ln2/2). Inputs below −87.3 give 0, above 88.7 give +inf-ish
// (clamped to 2^127 · e^r); NaN is not propagated (callers never pass one to a live lane).
#pragma omp declare simd
inline float FastExp(float x) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f;
  constexpr float kLn2Lo = -2.12194440e-4f;
  x = std::min(std::max(x, -87.33654f), 88.72283f);
  const float n = std::floor(x * kLog2e + 0.5f);
  const float r = (x - n * kLn2Hi) - n * kLn2Lo;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float er = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  return er * std::bit_cast<float>(bits);
}

// tanh through e^{2x}: absolute error below 3e-7.
#pragma omp declare simd
inline float FastTanh(float x) { return 1.0f - 2.0f / (FastExp(2.0f * x) + 1.0f); }

#pragma omp declare simd
inline float FastSigmoid(float x) { return 1.0f / (1.0f + FastExp(-x)); }

}  // namespace trainyard::kernels::cpu

#endif  // TRAINYARD_KERNELS_CPU_FAST_MATH_H_
