// Counter-based randomness: results depend only on the keys given, never on call order across
// objects, threads or ranks.
#ifndef TRAINYARD_WORKER_SHAPE_RANDOM_H_
#define TRAINYARD_WORKER_SHAPE_RANDOM_H_

#include <cmath>
#include <cstdint>
#include <numbers>
#include <string_view>

namespace trainyard::worker {

// SplitMix64's finaliser: a bijective 64-bit mix.
inline uint64_t Mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// FNV-1a, then mixed: a stable hash of a name across platforms and runs.
inline uint64_t HashString(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char ch : s) h = (h ^ ch) * 0x100000001b3ULL;
  return Mix64(h);
}

// Standard normal variates from the stream keyed by (seed, key), by Box–Muller.
class NormalStream {
 public:
  NormalStream(uint64_t seed, uint64_t key) : state_(Mix64(seed ^ Mix64(key))) {}

  float Next() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    // u1 in (0, 1], u2 in [0, 1): 53-bit uniforms.
    const double u1 = (static_cast<double>(NextBits() >> 11) + 1.0) * 0x1.0p-53;
    const double u2 = static_cast<double>(NextBits() >> 11) * 0x1.0p-53;
    const double r = std::sqrt(-2.0 * std::log(u1));
    const double theta = 2.0 * std::numbers::pi * u2;
    spare_ = static_cast<float>(r * std::sin(theta));
    has_spare_ = true;
    return static_cast<float>(r * std::cos(theta));
  }

 private:
  uint64_t NextBits() { return Mix64(state_++); }

  uint64_t state_;
  float spare_ = 0.0f;
  bool has_spare_ = false;
};

}  // namespace trainyard::worker

#endif  // TRAINYARD_WORKER_SHAPE_RANDOM_H_
