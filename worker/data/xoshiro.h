// Platform-independent pseudo-random numbers for the data layer.
//
// Everything here is defined by integer arithmetic (splitmix64's Mix64, xoshiro256**) plus IEEE-754
// double operations and libm's log/sqrt, so a given seed yields the same numbers under any
// conforming compiler and standard library (unlike std::*_distribution, whose algorithms are
// implementation-defined). Generated Markov chains and sample orders are therefore reproducible
// across machines, which resumed and resized jobs rely on.
//
// Threading: the free functions are pure. A Xoshiro256 instance is not thread-safe; give each
// thread its own.

#ifndef TRAINYARD_WORKER_DATA_XOSHIRO_H_
#define TRAINYARD_WORKER_DATA_XOSHIRO_H_

#include <cstdint>

#include "worker/shape/random.h"  // Mix64

namespace trainyard::worker {

// Counter-based hash of (seed, a, b): a pure function, so callers can derive a random value for
// any coordinate without carrying generator state.
inline uint64_t HashCounter(uint64_t seed, uint64_t a, uint64_t b) {
  return Mix64(Mix64(Mix64(seed) ^ a) ^ b);
}

// xoshiro256** seeded through splitmix64; period 2^256 - 1.
class Xoshiro256 {
 public:
  explicit Xoshiro256(uint64_t seed);

  uint64_t Next();
  // Uniform in [0, 1) with 53 random bits.
  double Uniform();
  // Uniform in (0, 1]: safe to take the logarithm of.
  double UniformPositive();
  // Standard normal (Marsaglia's polar method).
  double Normal();
  // Natural logarithm of a Gamma(shape, 1) variate, shape > 0 (Marsaglia–Tsang). Returned in log
  // space because for small shapes the variate itself underflows to zero (e.g. shape 1e-3).
  double LogGamma(double shape);

 private:
  uint64_t s_[4];
  bool has_spare_normal_ = false;
  double spare_normal_ = 0.0;
};

}  // namespace trainyard::worker

#endif  // TRAINYARD_WORKER_DATA_XOSHIRO_H_
