#include "worker/data/markov.h"

#include <cmath>
#include <cstdint>
#include <vector>

#include "config/spec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainyard::worker {
namespace {

using ::testing::HasSubstr;

config::MarkovSpec Spec(int order, int vocab, double concentration, uint64_t seed = 1234) {
  config::MarkovSpec spec;
  spec.order = order;
  spec.vocab = vocab;
  spec.concentration = concentration;
  spec.seed = seed;
  return spec;
}

MarkovChain MustRandom(const config::MarkovSpec& spec) {
  absl::StatusOr<MarkovChain> chain = MarkovChain::Random(spec);
  EXPECT_TRUE(chain.ok()) << chain.status();
  return *std::move(chain);
}

// Plug-in estimate of H(X_t | previous `order` symbols) from a sample path, in nats.
double EmpiricalConditionalEntropy(const MarkovChain& chain, const std::vector<uint16_t>& seq) {
  const int64_t vocab = chain.vocab();
  std::vector<double> joint(chain.contexts() * vocab, 0.0);
  std::vector<double> marginal(chain.contexts(), 0.0);
  int64_t context = 0;
  for (int i = 0; i < chain.order(); ++i) context = chain.NextContext(context, seq[i]);
  for (size_t i = chain.order(); i < seq.size(); ++i) {
    joint[context * vocab + seq[i]] += 1;
    marginal[context] += 1;
    context = chain.NextContext(context, seq[i]);
  }
  const double n = static_cast<double>(seq.size() - chain.order());
  double entropy = 0.0;
  for (int64_t c = 0; c < chain.contexts(); ++c) {
    for (int64_t s = 0; s < vocab; ++s) {
      const double count = joint[c * vocab + s];
      if (count > 0) entropy -= count / n * std::log(count / marginal[c]);
    }
  }
  return entropy;
}

TEST(MarkovTest, RowsAndStationaryDistributionAreDistributions) {
  const MarkovChain chain = MustRandom(Spec(2, 16, 0.3));
  ASSERT_EQ(chain.contexts(), 256);
  double stationary_total = 0.0;
  for (int64_t c = 0; c < chain.contexts(); ++c) {
    double row = 0.0;
    for (int s = 0; s < chain.vocab(); ++s) {
      EXPECT_GE(chain.Probability(c, s), 0.0);
      row += chain.Probability(c, s);
    }
    EXPECT_NEAR(row, 1.0, 1e-12) << "context " << c;
    stationary_total += chain.StationaryProbability(c);
  }
  EXPECT_NEAR(stationary_total, 1.0, 1e-12);
}

TEST(MarkovTest, StationaryDistributionIsAFixedPoint) {
  const MarkovChain chain = MustRandom(Spec(2, 8, 0.5));
  std::vector<double> next(chain.contexts(), 0.0);
  for (int64_t c = 0; c < chain.contexts(); ++c) {
    for (int s = 0; s < chain.vocab(); ++s) {
      next[chain.NextContext(c, s)] += chain.StationaryProbability(c) * chain.Probability(c, s);
    }
  }
  for (int64_t c = 0; c < chain.contexts(); ++c) {
    EXPECT_NEAR(next[c], chain.StationaryProbability(c), 1e-11) << "context " << c;
  }
}

TEST(MarkovTest, ContextKeepsTheLastOrderSymbolsMostRecentLowest) {
  const MarkovChain chain = MustRandom(Spec(2, 3, 1.0));
  // Context 5 = (1, 2): 2 was emitted last. Emitting 0 gives (2, 0) = 6.
  EXPECT_EQ(chain.NextContext(5, 0), 6);
  EXPECT_EQ(chain.NextContext(8, 2), 8);
}

TEST(MarkovTest, HandMadeTwoStateChainHasTheHandComputedEntropyRate) {
  // P(0->1) = a = 0.1, P(1->0) = b = 0.3. Stationary: pi0 = b/(a+b) = 0.75, pi1 = 0.25.
  // H = 0.75 h(0.1) + 0.25 h(0.3), h(p) = -p ln p - (1-p) ln(1-p)
  //   = 0.75 * 0.3250829733914482 + 0.25 * 0.6108643020548935 = 0.3965283055573095 nats.
  absl::StatusOr<MarkovChain> chain = MarkovChain::FromTransitions(1, 2, {0.9, 0.1, 0.3, 0.7});
  ASSERT_TRUE(chain.ok()) << chain.status();
  EXPECT_NEAR(chain->StationaryProbability(0), 0.75, 1e-12);
  EXPECT_NEAR(chain->StationaryProbability(1), 0.25, 1e-12);
  EXPECT_NEAR(chain->EntropyRateNats(), 0.3965283055573095, 1e-12);
}

TEST(MarkovTest, PeriodicChainConverges) {
  // 0 -> 1 -> 0 deterministically: plain power iteration would oscillate.
  absl::StatusOr<MarkovChain> chain = MarkovChain::FromTransitions(1, 2, {0.0, 1.0, 1.0, 0.0});
  ASSERT_TRUE(chain.ok()) << chain.status();
  EXPECT_NEAR(chain->StationaryProbability(0), 0.5, 1e-12);
  EXPECT_EQ(chain->EntropyRateNats(), 0.0);
  const std::vector<uint16_t> seq = chain->Generate(10, 5);
  for (size_t i = 1; i < seq.size(); ++i) EXPECT_NE(seq[i], seq[i - 1]);
}

TEST(MarkovTest, RejectsChainsThatMixTooSlowly) {
  // Two nearly closed states: the stationary distribution (2/3, 1/3) is approached by a factor
  // 1 - 1.5e-9 per lazy step, far beyond the iteration budget. The test also bounds how long the
  // rejection takes, through the test timeout.
  const absl::Status status =
      MarkovChain::FromTransitions(1, 2, {1 - 1e-9, 1e-9, 2e-9, 1 - 2e-9}).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("mixes too slowly"));
}

TEST(MarkovTest, OrderZeroIsAnIidSource) {
  const MarkovChain chain = MustRandom(Spec(0, 5, 1.0));
  EXPECT_EQ(chain.contexts(), 1);
  double entropy = 0.0;
  for (int s = 0; s < 5; ++s)
    entropy -= chain.Probability(0, s) * std::log(chain.Probability(0, s));
  EXPECT_NEAR(chain.EntropyRateNats(), entropy, 1e-15);
  EXPECT_EQ(chain.Generate(100, 3).size(), 100u);
}

TEST(MarkovTest, TinyConcentrationGivesNearlyDeterministicChain) {
  const MarkovChain chain = MustRandom(Spec(1, 8, 1e-4));
  EXPECT_GE(chain.EntropyRateNats(), 0.0);
  EXPECT_LT(chain.EntropyRateNats(), 0.01);
}

TEST(MarkovTest, HugeConcentrationGivesNearlyUniformChain) {
  const MarkovChain chain = MustRandom(Spec(2, 8, 1e6));
  EXPECT_NEAR(chain.EntropyRateNats(), std::log(8.0), 1e-4);
  EXPECT_LE(chain.EntropyRateNats(), std::log(8.0) + 1e-12);
}

TEST(MarkovTest, EmpiricalEntropyOfALongRunMatchesTheEntropyRate) {
  const MarkovChain chain = MustRandom(Spec(2, 8, 0.5, 99));
  const std::vector<uint16_t> seq = chain.Generate(2'000'000, 7);
  const double exact = chain.EntropyRateNats();
  ASSERT_GT(exact, 0.1);
  EXPECT_NEAR(EmpiricalConditionalEntropy(chain, seq), exact, 0.01 * exact);
}

TEST(MarkovTest, GenerateIsAPureFunctionOfTheSeed) {
  const MarkovChain chain = MustRandom(Spec(1, 32, 0.05));
  const std::vector<uint16_t> a = chain.Generate(1000, 1);
  EXPECT_EQ(a, chain.Generate(1000, 1));
  EXPECT_NE(a, chain.Generate(1000, 2));
  for (uint16_t token : a) EXPECT_LT(token, 32);
  EXPECT_TRUE(chain.Generate(0, 1).empty());
}

TEST(MarkovTest, ChainIsAPureFunctionOfTheSpec) {
  const MarkovChain a = MustRandom(Spec(1, 16, 0.1, 5));
  const MarkovChain b = MustRandom(Spec(1, 16, 0.1, 5));
  const MarkovChain c = MustRandom(Spec(1, 16, 0.1, 6));
  EXPECT_EQ(a.EntropyRateNats(), b.EntropyRateNats());
  EXPECT_NE(a.EntropyRateNats(), c.EntropyRateNats());
}

TEST(MarkovTest, DefaultSpecIsReproducible) {
  // Golden values: the generator uses no standard-library distribution, so these hold on every
  // platform. A change here changes every "markov" dataset users have trained on.
  const MarkovChain chain = MustRandom(config::MarkovSpec{});
  EXPECT_NEAR(chain.EntropyRateNats(), 0.61117706712277375, 1e-12);
  EXPECT_EQ(chain.Generate(12, 1234),
            (std::vector<uint16_t>{1, 0, 14, 8, 29, 11, 31, 16, 2, 19, 24, 24}));
}

TEST(MarkovTest, RejectsTooManyContexts) {
  const absl::Status status = MarkovChain::Random(Spec(4, 32, 1.0), "data.markov").status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("data.markov.order"));
  EXPECT_THAT(status.message(), HasSubstr("65536"));
}

TEST(MarkovTest, RejectsTooManyTransitions) {
  // 8192 contexts are fine, but 8192^2 = 2^26 transition probabilities are not.
  const absl::Status status = MarkovChain::Random(Spec(1, 8192, 1.0)).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("transition probabilities exceeds the limit"));
}

TEST(MarkovTest, AcceptsTheLargestContextCount) {
  // 4^8 = 65536 contexts, 4^9 transitions.
  EXPECT_TRUE(MarkovChain::Random(Spec(8, 4, 1.0)).ok());
}

TEST(MarkovTest, RejectsBadFields) {
  EXPECT_THAT(MarkovChain::Random(Spec(1, 1, 1.0)).status().message(), HasSubstr("markov.vocab"));
  EXPECT_THAT(MarkovChain::Random(Spec(1, 70000, 1.0)).status().message(),
              HasSubstr("markov.vocab"));
  EXPECT_THAT(MarkovChain::Random(Spec(-1, 8, 1.0)).status().message(), HasSubstr("markov.order"));
  for (double bad : {0.0, -1.0, std::nan("")}) {
    const absl::Status status = MarkovChain::Random(Spec(1, 8, bad)).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(status.message(), HasSubstr("markov.concentration"));
  }
}

TEST(MarkovTest, RejectsTransitionTablesThatAreNotDistributions) {
  EXPECT_THAT(MarkovChain::FromTransitions(1, 2, {0.5, 0.4, 0.5, 0.5}).status().message(),
              HasSubstr("sum to 0.9"));
  EXPECT_THAT(MarkovChain::FromTransitions(1, 2, {1.5, -0.5, 0.5, 0.5}).status().message(),
              HasSubstr("not a probability"));
  EXPECT_THAT(MarkovChain::FromTransitions(1, 2, {1.0, 0.0}).status().message(),
              HasSubstr("expected 4"));
}

}  // namespace
}  // namespace trainyard::worker
