// Helpers shared by the engine's unit tests.
#ifndef TRAINYARD_TESTS_UNIT_WORKER_WORKER_TEST_UTIL_H_
#define TRAINYARD_TESTS_UNIT_WORKER_WORKER_TEST_UTIL_H_

#include <cstdint>
#include <random>
#include <vector>

namespace trainyard::worker::test_util {

// `n` token ids drawn uniformly from [0, vocab), the same for the same seed.
inline std::vector<int32_t> RandomTokens(int64_t n, int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> pick(0, vocab - 1);
  std::vector<int32_t> v(n);
  for (int32_t& x : v) x = pick(rng);
  return v;
}

}  // namespace trainyard::worker::test_util

#endif  // TRAINYARD_TESTS_UNIT_WORKER_WORKER_TEST_UTIL_H_
