// The `done:` line a rank prints when training ends (worker::SummaryLine), which the coordinated
// worker's log ends with: an MoE run adds its worst layer's routing, and the exact final loss
// stays last for the tools that read it from there.
#include <string>

#include "absl/strings/match.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/trainer.h"

namespace trainyard::worker {
namespace {

using ::testing::EndsWith;
using ::testing::HasSubstr;
using ::testing::Not;

TrainResult DenseRun() {
  TrainResult result;
  result.train_losses = {3.0, 2.5};
  result.step_seconds = {0.02, 0.01};
  result.tokens_per_second = 1234;
  return result;
}

TEST(SummaryLineTest, AnMoeRunNamesItsWorstLayerAndItsDropsBeforeTheExactLoss) {
  TrainResult result = DenseRun();
  // Layer 1: 40 tokens, top_k 2, the busiest expert picked by 30 of them; layer 3 even.
  result.moe_routing.push_back({1, {30, 20, 20, 10}, 5, 0.0, 40, 0.0});
  result.moe_routing.push_back({3, {20, 20, 20, 20}, 2, 0.0, 40, 0.0});
  const std::string line = SummaryLine(result);
  EXPECT_THAT(line, HasSubstr(" | median step 20.00 ms | moe max expert share 0.750 (layer 1), 7 "
                              "dropped | exact final loss "));
  EXPECT_THAT(line, EndsWith("exact final loss 0x1.4p+1"));
}

TEST(SummaryLineTest, ADenseRunsLineHasNoMoeSegment) {
  const std::string line = SummaryLine(DenseRun());
  EXPECT_EQ(line,
            "done: 2 steps | final train loss 2.5000 | 1234 tok/s | median step 20.00 ms | exact "
            "final loss 0x1.4p+1");
  EXPECT_THAT(line, Not(HasSubstr("moe")));
}

TEST(SummaryLineTest, AZLossRunShowsItsLastStepsZLossBesideTheLoss) {
  TrainResult result = DenseRun();
  result.train_z_losses = {0.03, 0.0123};
  EXPECT_EQ(SummaryLine(result),
            "done: 2 steps | final train loss 2.5000 | z-loss 0.0123 | 1234 tok/s | median step "
            "20.00 ms | exact final loss 0x1.4p+1");
}

}  // namespace
}  // namespace trainyard::worker
