#include "kernels/cpu/fp8.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace trainyard::kernels::cpu {
namespace {

struct Layout {
  int mantissa_bits;
  int bias;
  uint8_t largest;  // the code of the largest finite magnitude
};

Layout LayoutOf(Fp8Format f) {
  return f == Fp8Format::kE4M3 ? Layout{3, 7, 0x7E} : Layout{2, 15, 0x7B};
}

}  // namespace

uint8_t EncodeFp8(float x, Fp8Format f) {
  const Layout l = LayoutOf(f);
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

float DecodeFp8(uint8_t v, Fp8Format f) {
  const Layout l = LayoutOf(f);
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

float AbsMax(const float* x, int64_t n) {
  float amax = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    if (std::isnan(x[i])) return std::nanf("");
    amax = std::max(amax, std::fabs(x[i]));
  }
  return amax;
}

float Fp8Scale(float amax, Fp8Format f) { return Fp8Max(f) / std::max(amax, kFp8MinAmax); }

void QuantizeFp8(const float* x, int64_t rows, int64_t cols, float scale, Fp8Format f, uint8_t* out,
                 uint8_t* out_t) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const uint8_t v = EncodeFp8(x[r * cols + c] * scale, f);
      out[r * cols + c] = v;
      if (out_t != nullptr) out_t[c * rows + r] = v;
    }
  }
}

}  // namespace trainyard::kernels::cpu
