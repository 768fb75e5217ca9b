#include "common/moe_load.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"

namespace trainyard {
namespace {

TEST(ExpertLoadTest, EvenLoadHasNoSpreadAndTheShareTopKOverExperts) {
  // 100 tokens, top_k 2, 4 experts: 50 picks each.
  const std::vector<int64_t> picks = {50, 50, 50, 50};
  const ExpertLoad load = SummarizeExpertLoad(picks, 100);
  EXPECT_EQ(load.picks, 200);
  EXPECT_EQ(load.min, 50);
  EXPECT_EQ(load.max, 50);
  EXPECT_DOUBLE_EQ(load.cv, 0.0);
  EXPECT_DOUBLE_EQ(load.max_share, 0.5);
  EXPECT_EQ(load.dead, 0);
}

TEST(ExpertLoadTest, SkewedLoadGivesThePopulationCvAndCountsDeadExperts) {
  // Mean 25; deviations 35, -5, -5, -25: variance (1225 + 25 + 25 + 625) / 4 = 475.
  const std::vector<int64_t> picks = {60, 20, 20, 0};
  const ExpertLoad load = SummarizeExpertLoad(picks, 100);
  EXPECT_EQ(load.min, 0);
  EXPECT_EQ(load.max, 60);
  EXPECT_NEAR(load.cv, std::sqrt(475.0) / 25.0, 1e-12);
  EXPECT_DOUBLE_EQ(load.max_share, 0.6);
  EXPECT_EQ(load.dead, 1);
}

TEST(ExpertLoadTest, ACollapsedRouterHasShareOneWhateverTopK) {
  // top_k 1: every token to expert 2; the CV is then sqrt(experts - 1).
  const std::vector<int64_t> top1 = {0, 0, 80, 0};
  const ExpertLoad one = SummarizeExpertLoad(top1, 80);
  EXPECT_DOUBLE_EQ(one.max_share, 1.0);
  EXPECT_NEAR(one.cv, std::sqrt(3.0), 1e-12);
  EXPECT_EQ(one.dead, 3);
  // top_k 2: every token picks experts 0 and 1.
  const std::vector<int64_t> top2 = {80, 80, 0, 0};
  EXPECT_DOUBLE_EQ(SummarizeExpertLoad(top2, 80).max_share, 1.0);
}

TEST(ExpertLoadTest, NoPicksIsAllZerosWithEveryExpertDead) {
  const std::vector<int64_t> picks(3, 0);
  const ExpertLoad load = SummarizeExpertLoad(picks, 0);
  EXPECT_EQ(load.picks, 0);
  EXPECT_DOUBLE_EQ(load.cv, 0.0);
  EXPECT_DOUBLE_EQ(load.max_share, 0.0);
  EXPECT_EQ(load.dead, 3);
  const ExpertLoad none = SummarizeExpertLoad({}, 0);
  EXPECT_EQ(none.dead, 0);
  EXPECT_EQ(none.max, 0);
}

}  // namespace
}  // namespace trainyard
