// The learning-rate schedules (worker/optimizer.h): warmup, then cosine, linear, constant, or
// warmup-stable-decay in each of its shapes, against values worked out by hand.
#include <cmath>
#include <cstdint>

#include "gtest/gtest.h"
#include "worker/optimizer.h"

namespace trainyard::worker {
namespace {

OptimizerConfig Config(LrSchedule schedule) {
  OptimizerConfig c;
  c.lr = 1.0;
  c.min_lr_ratio = 0.1;
  c.warmup_steps = 2;
  c.total_steps = 10;
  c.schedule = schedule;
  return c;
}

TEST(LearningRate, WarmupThenTheClassicDecays) {
  for (LrSchedule s : {LrSchedule::kCosine, LrSchedule::kLinear, LrSchedule::kConstant}) {
    EXPECT_DOUBLE_EQ(LearningRate(Config(s), 0), 0.5);
    EXPECT_DOUBLE_EQ(LearningRate(Config(s), 1), 1.0);
    EXPECT_DOUBLE_EQ(LearningRate(Config(s), 2), 1.0);  // the decay's first step: progress 0
    EXPECT_DOUBLE_EQ(LearningRate(Config(LrSchedule::kConstant), 9), 1.0);
  }
  // Step 6 is halfway through the 8 steps after the warmup.
  EXPECT_DOUBLE_EQ(LearningRate(Config(LrSchedule::kLinear), 6), 0.55);
  EXPECT_DOUBLE_EQ(LearningRate(Config(LrSchedule::kCosine), 6), 0.55);
  EXPECT_DOUBLE_EQ(LearningRate(Config(LrSchedule::kLinear), 9), 1.0 - 0.9 * 7.0 / 8.0);
  EXPECT_NEAR(LearningRate(Config(LrSchedule::kCosine), 4),
              0.1 + 0.45 * (1.0 + std::cos(M_PI / 4.0)), 1e-15);
}

// lr until the last decay_steps steps, then the decay over them: steps 6 to 9 of 10 here, at
// progress 0, ¼, ½ and ¾.
TEST(LearningRate, WarmupStableDecayInEachShape) {
  OptimizerConfig c = Config(LrSchedule::kWarmupStableDecay);
  c.decay_steps = 4;
  const double progress[] = {0.0, 0.25, 0.5, 0.75};
  for (DecayShape shape : {DecayShape::kLinear, DecayShape::kCosine, DecayShape::kOneMinusSqrt}) {
    c.decay_shape = shape;
    EXPECT_DOUBLE_EQ(LearningRate(c, 0), 0.5);
    for (int64_t step = 1; step < 6; ++step) EXPECT_DOUBLE_EQ(LearningRate(c, step), 1.0);
    for (int i = 0; i < 4; ++i) {
      const double p = progress[i];
      const double want = shape == DecayShape::kLinear   ? 1.0 - 0.9 * p
                          : shape == DecayShape::kCosine ? 0.1 + 0.45 * (1.0 + std::cos(M_PI * p))
                                                         : 1.0 - 0.9 * std::sqrt(p);
      EXPECT_NEAR(LearningRate(c, 6 + i), want, 1e-15) << "step " << 6 + i;
    }
    EXPECT_NEAR(LearningRate(c, 10), 0.1, 1e-15);  // past the run: the floor
  }
}

// A decay over every step after the warmup is the classic schedule of that shape, to the bit.
TEST(LearningRate, WholeRunDecayIsTheClassicSchedule) {
  OptimizerConfig wsd = Config(LrSchedule::kWarmupStableDecay);
  wsd.decay_steps = 8;
  for (auto [shape, classic] : {std::pair{DecayShape::kLinear, LrSchedule::kLinear},
                                {DecayShape::kCosine, LrSchedule::kCosine}}) {
    wsd.decay_shape = shape;
    for (int64_t step = 0; step < 10; ++step) {
      EXPECT_EQ(LearningRate(wsd, step), LearningRate(Config(classic), step)) << step;
    }
  }
}

}  // namespace
}  // namespace trainyard::worker
