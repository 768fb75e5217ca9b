#include "worker/data/xoshiro.h"

#include <cmath>
#include <cstdint>

#include "gtest/gtest.h"

namespace trainyard::worker {
namespace {

TEST(XoshiroTest, SameSeedSameSequence) {
  Xoshiro256 a(17), b(17), c(18);
  bool differs = false;
  for (int i = 0; i < 100; ++i) {
    const uint64_t x = a.Next();
    EXPECT_EQ(x, b.Next());
    differs |= x != c.Next();
  }
  EXPECT_TRUE(differs);
}

TEST(XoshiroTest, UniformsStayInRange) {
  Xoshiro256 rng(1);
  for (int i = 0; i < 100000; ++i) {
    const double u = rng.Uniform();
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    const double p = rng.UniformPositive();
    ASSERT_GT(p, 0.0);
    ASSERT_LE(p, 1.0);
  }
}

TEST(XoshiroTest, NormalHasUnitVariance) {
  Xoshiro256 rng(2);
  const int n = 200000;
  double sum = 0, sum_sq = 0;
  for (int i = 0; i < n; ++i) {
    const double x = rng.Normal();
    sum += x;
    sum_sq += x * x;
  }
  EXPECT_NEAR(sum / n, 0.0, 5 / std::sqrt(n));
  EXPECT_NEAR(sum_sq / n, 1.0, 5 * std::sqrt(2.0 / n));
}

// Gamma(k, 1) has mean k and variance k; checked to five standard errors for shapes on both
// sides of 1 (the boost path and the direct Marsaglia–Tsang path).
TEST(XoshiroTest, GammaHasTheRightMeanAndVariance) {
  for (double shape : {0.05, 0.3, 1.0, 5.5, 100.0}) {
    Xoshiro256 rng(3);
    const int n = 200000;
    double sum = 0, sum_sq = 0;
    for (int i = 0; i < n; ++i) {
      const double x = std::exp(rng.LogGamma(shape));
      sum += x;
      sum_sq += x * x;
    }
    const double mean = sum / n;
    const double variance = sum_sq / n - mean * mean;
    EXPECT_NEAR(mean, shape, 5 * std::sqrt(shape / n)) << "shape " << shape;
    // Var of the sample variance: (mu4 - sigma^4) / n with mu4 = 3k^2 + 6k for Gamma(k).
    EXPECT_NEAR(variance, shape, 5 * std::sqrt((2 * shape * shape + 6 * shape) / n))
        << "shape " << shape;
  }
}

TEST(XoshiroTest, HashCounterSeparatesItsArguments) {
  EXPECT_EQ(HashCounter(1, 2, 3), HashCounter(1, 2, 3));
  EXPECT_NE(HashCounter(1, 2, 3), HashCounter(1, 3, 2));
  EXPECT_NE(HashCounter(1, 2, 3), HashCounter(2, 2, 3));
  EXPECT_NE(HashCounter(0, 0, 0), HashCounter(0, 0, 1));
}

}  // namespace
}  // namespace trainyard::worker
