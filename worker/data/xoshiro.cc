#include "worker/data/xoshiro.h"

#include <cmath>

namespace trainyard::worker {
namespace {

inline uint64_t RotateLeft(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

}  // namespace

Xoshiro256::Xoshiro256(uint64_t seed) {
  // Successive splitmix64 outputs; never all zero because Mix64 is a bijection of distinct inputs.
  for (int i = 0; i < 4; ++i) {
    seed += 0x9E3779B97F4A7C15ull;
    s_[i] = Mix64(seed);
  }
}

uint64_t Xoshiro256::Next() {
  const uint64_t result = RotateLeft(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = RotateLeft(s_[3], 45);
  return result;
}

double Xoshiro256::Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }

double Xoshiro256::UniformPositive() { return static_cast<double>((Next() >> 11) + 1) * 0x1.0p-53; }

double Xoshiro256::Normal() {
  if (has_spare_normal_) {
    has_spare_normal_ = false;
    return spare_normal_;
  }
  double u, v, s;
  do {
    u = 2.0 * Uniform() - 1.0;
    v = 2.0 * Uniform() - 1.0;
    s = u * u + v * v;
  } while (s >= 1.0 || s == 0.0);
  const double scale = std::sqrt(-2.0 * std::log(s) / s);
  spare_normal_ = v * scale;
  has_spare_normal_ = true;
  return u * scale;
}

double Xoshiro256::LogGamma(double shape) {
  if (shape < 1.0) {
    // Gamma(a) = Gamma(a + 1) * U^(1/a), taken in log space.
    const double boost = std::log(UniformPositive()) / shape;
    return LogGamma(shape + 1.0) + boost;
  }
  const double d = shape - 1.0 / 3.0;
  const double c = 1.0 / std::sqrt(9.0 * d);
  for (;;) {
    const double x = Normal();
    const double t = 1.0 + c * x;
    if (t <= 0.0) continue;
    const double v = t * t * t;
    const double log_u = std::log(UniformPositive());
    if (log_u < 0.5 * x * x + d - d * v + d * std::log(v)) return std::log(d) + std::log(v);
  }
}

}  // namespace trainyard::worker
