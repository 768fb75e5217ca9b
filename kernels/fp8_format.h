// The two 8-bit floating-point formats (OCP FP8) the linear layers may compute in, shared by the
// CPU reference (kernels/cpu/fp8.h) and the CUDA quantizers and GEMMs (kernels/cuda/fp8.h,
// gemm.h).
//
// E4M3: 4 exponent bits (bias 7), 3 mantissa bits, no infinities (S.1111.111 is NaN), largest
// finite 448; for weights and activations. E5M2: 5 exponent bits (bias 15), 2 mantissa bits,
// IEEE-like, largest finite 57344; for gradients. Both have subnormals. Encoding rounds to
// nearest even and saturates: a finite value beyond the largest, and an infinity, becomes the
// largest of its sign; NaN becomes 0x7F.
//
// Per-tensor ("tensorwise") current scaling: a tensor is multiplied by scale = max / amax (amax
// its largest magnitude, at least kFp8MinAmax; NaN when the tensor holds one) before encoding,
// so that it spans the format's range; a product of two such tensors is multiplied back by both
// 1 / scale.
#ifndef TRAINYARD_KERNELS_FP8_FORMAT_H_
#define TRAINYARD_KERNELS_FP8_FORMAT_H_

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace trainyard::kernels {

enum class Fp8Format { kE4M3, kE5M2 };

// The largest finite value of the format: 448 (E4M3), 57344 (E5M2).
inline constexpr float Fp8Max(Fp8Format f) { return f == Fp8Format::kE4M3 ? 448.0f : 57344.0f; }

// An amax below this counts as this, so that an all-zero tensor gets a finite scale.
inline constexpr float kFp8MinAmax = 1e-12f;

namespace fp8_internal {

struct Layout {
  int mantissa_bits;
  int bias;
  uint8_t largest;  // the code of the largest finite magnitude
};

inline Layout LayoutOf(Fp8Format f) {
  return f == Fp8Format::kE4M3 ? Layout{3, 7, 0x7E} : Layout{2, 15, 0x7B};
}

}  // namespace fp8_internal

// x as the format's code, rounded to nearest even and saturated as above (host code: the CPU
// reference, and checkpoints' FP8 weights).
inline uint8_t EncodeFp8(float x, Fp8Format f) {
  const fp8_internal::Layout l = fp8_internal::LayoutOf(f);
  if (std::isnan(x)) return 0x7F;
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  const float a = std::fabs(x);
  if (a >= Fp8Max(f)) return sign | l.largest;
  if (a == 0.0f) return sign;
  const int m = l.mantissa_bits;
  const int min_exponent = 1 - l.bias;  // of the smallest normal value
  // Below the smallest normal the step is 2^(min_exponent - m); above it, 2^(e - m) for a in
  // [2^e, 2^(e + 1)). The code is then exponent and mantissa read as one integer, so a mantissa
  // that rounds up to 2^m carries into the exponent by itself.
  int e = 0;
  std::frexp(a, &e);  // a = fraction · 2^e, fraction in [0.5, 1)
  const int exponent = std::max(e - 1, min_exponent);
  const float steps = std::nearbyint(std::ldexp(a, m - exponent));  // to nearest even
  const int code = (exponent - min_exponent) * (1 << m) + static_cast<int>(steps);
  return sign | static_cast<uint8_t>(code);
}

// The value of code v.
inline float DecodeFp8(uint8_t v, Fp8Format f) {
  const fp8_internal::Layout l = fp8_internal::LayoutOf(f);
  const float sign = (v & 0x80) != 0 ? -1.0f : 1.0f;
  const int bits = v & 0x7F;
  const int m = l.mantissa_bits;
  const int exponent_field = bits >> m, mantissa = bits & ((1 << m) - 1);
  if (f == Fp8Format::kE4M3 && bits == 0x7F) return std::nanf("");
  if (f == Fp8Format::kE5M2 && exponent_field == 31) {
    return mantissa == 0 ? sign * INFINITY : std::nanf("");
  }
  if (exponent_field == 0) return sign * std::ldexp(static_cast<float>(mantissa), 1 - l.bias - m);
  return sign * std::ldexp(static_cast<float>((1 << m) + mantissa), exponent_field - l.bias - m);
}

}  // namespace trainyard::kernels

#endif  // TRAINYARD_KERNELS_FP8_FORMAT_H_
