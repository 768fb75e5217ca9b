// The CPU kernel behind the global gradient norm (kernels/cpu/adamw.h: SumOfSquares): its value
// against the definition evaluated directly, and the same bits whatever the thread count.

#include <omp.h>

#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/adamw.h"

namespace trainyard::kernels::cpu {
namespace {

// The kernel's order, written out: blocks of 4096 elements, in a block element i into running sum
// i mod 8 (counted from the block's start), the eight sums added in order, the blocks in order.
double ByDefinition(const std::vector<float>& x) {
  const int64_t n = static_cast<int64_t>(x.size());
  double total = 0;
  for (int64_t begin = 0; begin < n; begin += 4096) {
    double lanes[8] = {};
    for (int64_t i = begin; i < std::min(n, begin + 4096); ++i) {
      lanes[(i - begin) % 8] += static_cast<double>(x[i]) * x[i];
    }
    double block = 0;
    for (double lane : lanes) block += lane;
    total += block;
  }
  return total;
}

std::vector<float> Random(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> x(n);
  for (float& v : x) v = normal(rng);
  return x;
}

TEST(SumOfSquares, EqualsItsDefinitionBitForBit) {
  for (int64_t n : {0, 1, 7, 8, 9, 4095, 4096, 4097, 4096 * 3 + 5, 100003}) {
    const std::vector<float> x = Random(n, static_cast<uint32_t>(n) + 1);
    EXPECT_EQ(SumOfSquares(x.data(), n), ByDefinition(x)) << "n = " << n;
  }
}

TEST(SumOfSquares, AgreesWithLongDoubleArithmetic) {
  const std::vector<float> x = Random(250001, 7);
  long double exact = 0;
  for (float v : x) exact += static_cast<long double>(v) * v;
  EXPECT_NEAR(SumOfSquares(x.data(), static_cast<int64_t>(x.size())), static_cast<double>(exact),
              1e-12 * static_cast<double>(exact));
}

TEST(SumOfSquares, TheThreadCountDoesNotChangeTheBits) {
  const std::vector<float> x = Random(4096 * 37 + 11, 3);
  const int64_t n = static_cast<int64_t>(x.size());
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  const double one = SumOfSquares(x.data(), n);
  omp_set_num_threads(3);
  const double three = SumOfSquares(x.data(), n);
  omp_set_num_threads(threads);
  EXPECT_EQ(one, three);
}

}  // namespace
}  // namespace trainyard::kernels::cpu
