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

// Standard normal variates of the stream keyed by (seed, key), by Box–Muller: value 2p is pair p's
// cosine branch and value 2p + 1 its sine branch, pair p drawn from counters 2p and 2p + 1 alone,
// so any range of the stream is drawn without the values before it.
namespace normal_stream {

struct Pair {
  float cos, sin;
};

// Pair p: u1 in (0, 1] and u2 in [0, 1), 53-bit uniforms.
inline Pair PairAt(uint64_t start, int64_t p) {
  const uint64_t counter = start + 2 * static_cast<uint64_t>(p);
  const double u1 = (static_cast<double>(Mix64(counter) >> 11) + 1.0) * 0x1.0p-53;
  const double u2 = static_cast<double>(Mix64(counter + 1) >> 11) * 0x1.0p-53;
  const double r = std::sqrt(-2.0 * std::log(u1));
  const double theta = 2.0 * std::numbers::pi * u2;
  return {static_cast<float>(r * std::cos(theta)), static_cast<float>(r * std::sin(theta))};
}

}  // namespace normal_stream

// out[i − begin] = scale · value i of the stream keyed by (seed, key), for i in [begin, end).
inline void FillNormal(uint64_t seed, uint64_t key, float scale, int64_t begin, int64_t end,
                       float* out) {
  const uint64_t start = Mix64(seed ^ Mix64(key));
  for (int64_t i = begin; i < end;) {
    const normal_stream::Pair v = normal_stream::PairAt(start, i / 2);
    if (i % 2 == 0) out[i++ - begin] = scale * v.cos;
    if (i < end) out[i++ - begin] = scale * v.sin;
  }
}

}  // namespace trainyard::worker

#endif  // TRAINYARD_WORKER_SHAPE_RANDOM_H_
