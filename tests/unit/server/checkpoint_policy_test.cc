#include "server/checkpoint_policy.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>

#include "gtest/gtest.h"

namespace trainyard::server {
namespace {

constexpr double kHour = 3600;

// Feeds `hours` of exposure in one-minute reports, as progress reports would arrive.
void RunFor(CheckpointPolicy& policy, double hours) {
  const int64_t minutes = std::llround(hours * 60);
  for (int64_t m = 0; m < minutes; ++m) policy.ObserveRunning(absl::Minutes(1));
}

// `count` failures, each after `gap_hours` of exposure.
void FailEvery(CheckpointPolicy& policy, double gap_hours, int count) {
  for (int i = 0; i < count; ++i) {
    RunFor(policy, gap_hours);
    policy.ObserveFailure();
  }
}

// A job whose prior MTBF is `job_mtbf_hours` (one node).
CheckpointPolicyOptions PriorOf(double job_mtbf_hours) {
  CheckpointPolicyOptions options;
  options.node_mtbf = absl::Hours(job_mtbf_hours);
  options.nodes = 1;
  return options;
}

TEST(YoungDalyTest, YoungIsSquareRootOfTwiceDeltaTimesMtbf) {
  // √(2·60·86400) = √10,368,000 = 3219.94.
  EXPECT_NEAR(CheckpointPolicy::YoungInterval(60, 86400), 3219.9379, 1e-3);
  EXPECT_NEAR(CheckpointPolicy::YoungInterval(30, 7200), 657.2671, 1e-3);
  EXPECT_EQ(CheckpointPolicy::YoungInterval(0, 7200), 0);
}

TEST(YoungDalyTest, DalyMatchesHandComputedValues) {
  // δ = 60 s, M = 24 h: x = δ/2M = 1/2880, √x = 0.0186339;
  // 3219.9379 · (1 + 0.0062113 + 0.0000386) − 60 = 3240.0621 − 60 = 3180.0621.
  EXPECT_NEAR(CheckpointPolicy::DalyInterval(60, 86400), 3180.0621, 1e-3);
  // δ = 30 s, M = 2 h: x = 1/480, √x = 0.0456435;
  // 657.2671 · (1 + 0.0152145 + 0.0002315) − 30 = 667.4192 − 30 = 637.4192.
  EXPECT_NEAR(CheckpointPolicy::DalyInterval(30, 7200), 637.4192, 1e-3);
  // δ = 10 min, M = 1 h: x = 1/12, √x = 0.2886751;
  // 2078.4610 · (1 + 0.0962250 + 0.0092593) − 600 = 2297.7060 − 600 = 1697.7060.
  EXPECT_NEAR(CheckpointPolicy::DalyInterval(600, 3600), 1697.7060, 1e-3);
  // δ = 100 s, M = 60 s (δ < 2M still): x = 5/6, √x = 0.9128709;
  // 109.5445 · (1 + 0.3042903 + 0.0925926) − 100 = 153.0209 − 100 = 53.0209.
  EXPECT_NEAR(CheckpointPolicy::DalyInterval(100, 60), 53.0209, 1e-3);
}

TEST(YoungDalyTest, DalyTendsToYoungAsDeltaOverMtbfShrinks) {
  // Daly / Young = 1 − (2/3)·√(δ/2M) + O(δ/M): the gap shrinks with √(δ/M).
  const double mtbf = 86400;
  double previous_gap = 1;
  for (double delta : {600.0, 60.0, 6.0, 0.6, 0.06, 0.006}) {
    const double young = CheckpointPolicy::YoungInterval(delta, mtbf);
    const double gap = std::abs(CheckpointPolicy::DalyInterval(delta, mtbf) / young - 1);
    EXPECT_LT(gap, previous_gap) << "delta " << delta;
    EXPECT_NEAR(gap, (2.0 / 3.0) * std::sqrt(delta / (2 * mtbf)), delta / mtbf) << delta;
    previous_gap = gap;
  }
  EXPECT_LT(previous_gap, 2e-4);
}

TEST(YoungDalyTest, DeltaOfTwiceMtbfOrMoreGivesMtbf) {
  EXPECT_EQ(CheckpointPolicy::DalyInterval(120, 60), 60);
  EXPECT_EQ(CheckpointPolicy::DalyInterval(1000, 60), 60);
  EXPECT_EQ(CheckpointPolicy::DalyInterval(7200, 3600), 3600);
  // Just below the boundary the series still applies: 2M·(13/9) − 2M = (8/9)·M.
  EXPECT_NEAR(CheckpointPolicy::DalyInterval(119.999999, 60), 60.0 * 8 / 9, 1e-4);
}

TEST(CheckpointPolicyTest, MtbfStartsAtThePriorPerNodeDividedByNodes) {
  CheckpointPolicyOptions options;  // 5000 h per node
  options.nodes = 100;
  CheckpointPolicy policy(options);
  EXPECT_DOUBLE_EQ(policy.mtbf_seconds(), 50 * kHour);
  const CheckpointPolicySnapshot snapshot = policy.Snapshot();
  EXPECT_DOUBLE_EQ(snapshot.mtbf_s, 50 * kHour);
  EXPECT_EQ(snapshot.failures, 0);
  EXPECT_EQ(snapshot.exposure, absl::ZeroDuration());
  EXPECT_FALSE(snapshot.delta_s.has_value());
  EXPECT_FALSE(snapshot.interval_s.has_value());
  EXPECT_FALSE(snapshot.interval_steps.has_value());
}

TEST(CheckpointPolicyTest, MtbfConvergesToTheObservedRateFromAWrongPrior) {
  CheckpointPolicy policy(PriorOf(8));  // 4x longer than the truth
  FailEvery(policy, 2, 4);
  // Learning, not yet there.
  EXPECT_GT(policy.mtbf_seconds(), 2.5 * kHour);
  EXPECT_LT(policy.mtbf_seconds(), 4 * kHour);
  FailEvery(policy, 2, 56);
  // Just after a failure the estimate sits a little under the mean gap, just before one a
  // little over it.
  EXPECT_NEAR(policy.mtbf_seconds(), 2 * kHour, 0.2 * kHour);
  RunFor(policy, 1.9);
  EXPECT_NEAR(policy.mtbf_seconds(), 2 * kHour, 0.2 * kHour);
  EXPECT_EQ(policy.Snapshot().failures, 60);
  EXPECT_EQ(policy.Snapshot().exposure, absl::Minutes(60 * 120 + 114));
}

TEST(CheckpointPolicyTest, MtbfConvergesUnderRandomFailures) {
  std::mt19937_64 rng(42);
  std::exponential_distribution<double> gap_minutes(1.0 / 180);  // MTBF 3 h
  CheckpointPolicy policy(PriorOf(0.75));                        // 4x shorter than the truth
  // The estimate as the interval uses it: sampled every hour of exposure, after 100 failures.
  // Over time it runs about 10% high (see the header).
  double sum_of_estimates = 0;
  int estimates = 0;
  double next_failure = gap_minutes(rng);
  for (int minute = 1; minute <= 2000 * 180; ++minute) {
    policy.ObserveRunning(absl::Minutes(1));
    while (next_failure <= minute) {
      policy.ObserveFailure();
      next_failure += gap_minutes(rng);
    }
    if (minute >= 100 * 180 && minute % 60 == 0) {
      sum_of_estimates += policy.mtbf_seconds();
      ++estimates;
    }
  }
  EXPECT_GT(sum_of_estimates / estimates, 3.0 * kHour);
  EXPECT_LT(sum_of_estimates / estimates, 3.6 * kHour);
}

TEST(CheckpointPolicyTest, MtbfFollowsARateThatRisesWithinAFewFailures) {
  CheckpointPolicy policy(PriorOf(8));
  FailEvery(policy, 8, 10);
  EXPECT_NEAR(policy.mtbf_seconds(), 8 * kHour, 1 * kHour);
  FailEvery(policy, 0.5, 5);
  EXPECT_LT(policy.mtbf_seconds(), 0.75 * kHour);
  FailEvery(policy, 0.5, 20);
  EXPECT_NEAR(policy.mtbf_seconds(), 0.5 * kHour, 0.1 * kHour);
}

TEST(CheckpointPolicyTest, MtbfFollowsARateThatFalls) {
  CheckpointPolicy policy(PriorOf(8));
  FailEvery(policy, 0.5, 20);
  EXPECT_NEAR(policy.mtbf_seconds(), 0.5 * kHour, 0.1 * kHour);
  // Eight half-hour MTBFs without a failure (P = e^-8 under the old rate) say the rate fell:
  // the estimate becomes the quiet time so far...
  RunFor(policy, 4);
  EXPECT_GT(policy.mtbf_seconds(), 3.5 * kHour);
  // ...and keeps growing with it, without overshooting wildly.
  RunFor(policy, 20);
  EXPECT_GT(policy.mtbf_seconds(), 20 * kHour);
  EXPECT_LT(policy.mtbf_seconds(), 48 * kHour);
  // Failures at the new rate bring it back to that rate.
  FailEvery(policy, 8, 20);
  EXPECT_NEAR(policy.mtbf_seconds(), 8 * kHour, 1.5 * kHour);
}

TEST(CheckpointPolicyTest, MtbfForgetsOldFailuresWhenTheRateDriftsTooLittleForTheTests) {
  CheckpointPolicy policy(PriorOf(2));
  FailEvery(policy, 2, 30);
  FailEvery(policy, 4, 30);
  // Without forgetting it would be the average of the whole run, 3 h.
  EXPECT_NEAR(policy.mtbf_seconds(), 4 * kHour, 0.5 * kHour);
  FailEvery(policy, 2, 30);
  EXPECT_NEAR(policy.mtbf_seconds(), 2 * kHour, 0.25 * kHour);
}

TEST(CheckpointPolicyTest, MtbfStaysFiniteAfterAVeryLongQuietRun) {
  CheckpointPolicy policy(PriorOf(1));
  policy.ObserveRunning(absl::Hours(24 * 365 * 10));
  EXPECT_TRUE(std::isfinite(policy.mtbf_seconds()));
  EXPECT_GT(policy.mtbf_seconds(), 1 * kHour);
}

TEST(CheckpointPolicyTest, IntervalIsDalyOverTheStepTime) {
  CheckpointPolicy policy(PriorOf(24));
  policy.ObserveStepTime(2.0);
  policy.ObserveCheckpoint(60);
  const CheckpointPolicySnapshot snapshot = policy.Snapshot();
  ASSERT_TRUE(snapshot.delta_s.has_value());
  EXPECT_DOUBLE_EQ(*snapshot.delta_s, 60);
  ASSERT_TRUE(snapshot.interval_s.has_value());
  EXPECT_NEAR(*snapshot.interval_s, 3180.0621, 1e-3);
  EXPECT_EQ(snapshot.interval_steps, 1590);  // round(3180.06 / 2)
  EXPECT_EQ(policy.IntervalSteps(), 1590);
}

TEST(CheckpointPolicyTest, IntervalIsClampedToTheSpecBounds) {
  CheckpointPolicyOptions options = PriorOf(24);
  options.min_every_steps = 2000;
  {
    CheckpointPolicy policy(options);
    policy.ObserveStepTime(2.0);
    policy.ObserveCheckpoint(60);
    EXPECT_EQ(policy.IntervalSteps(), 2000);
  }
  options.min_every_steps = 1;
  options.max_every_steps = 1000;
  {
    CheckpointPolicy policy(options);
    policy.ObserveStepTime(2.0);
    policy.ObserveCheckpoint(60);
    EXPECT_EQ(policy.IntervalSteps(), 1000);
  }
  // τ of zero (a free save) still saves every min_every_steps, not every 0 steps.
  options.max_every_steps = std::numeric_limits<int64_t>::max();
  {
    CheckpointPolicy policy(options);
    policy.ObserveStepTime(2.0);
    policy.ObserveCheckpoint(0);
    EXPECT_EQ(policy.IntervalSteps(), 1);
  }
  // A tiny step time against a huge MTBF does not overflow.
  {
    CheckpointPolicyOptions huge = PriorOf(1e9);
    CheckpointPolicy policy(huge);
    policy.ObserveStepTime(1e-12);
    policy.ObserveCheckpoint(1e6);
    EXPECT_EQ(policy.IntervalSteps(), std::numeric_limits<int64_t>::max());
    EXPECT_EQ(policy.NextCheckpointStep(10, 5), std::numeric_limits<int64_t>::max());
  }
}

TEST(CheckpointPolicyTest, NoStepTimeMeansNoNextStep) {
  CheckpointPolicy policy(PriorOf(24));
  policy.ObserveCheckpoint(60);
  EXPECT_EQ(policy.NextCheckpointStep(100, 0), std::nullopt);
  EXPECT_EQ(policy.IntervalSteps(), std::nullopt);
}

TEST(CheckpointPolicyTest, NextStepIsLastCheckpointPlusIntervalButAlwaysAhead) {
  CheckpointPolicy policy(PriorOf(24));
  policy.ObserveStepTime(2.0);
  policy.ObserveCheckpoint(60);  // 1590 steps
  EXPECT_EQ(policy.NextCheckpointStep(100, 0), 1590);
  EXPECT_EQ(policy.NextCheckpointStep(2000, 1000), 2590);
  EXPECT_EQ(policy.NextCheckpointStep(1589, 0), 1590);
  // Past due (the interval shrank, or a report came late): the very next step.
  EXPECT_EQ(policy.NextCheckpointStep(1590, 0), 1591);
  EXPECT_EQ(policy.NextCheckpointStep(5000, 0), 5001);
}

TEST(CheckpointPolicyTest, NextStepShrinksAsFailuresArrive) {
  CheckpointPolicy policy(PriorOf(24));
  policy.ObserveStepTime(2.0);
  policy.ObserveCheckpoint(60);
  const int64_t before = *policy.NextCheckpointStep(0, 0);
  FailEvery(policy, 1, 10);
  const int64_t after = *policy.NextCheckpointStep(0, 0);
  // M fell from 24 h to about 1 h: τ shrinks about √24 ≈ 5-fold.
  EXPECT_LT(after, before / 3);
  EXPECT_GT(after, before / 8);
}

TEST(CheckpointPolicyTest, FirstCheckpointComesEarlyUntilDeltaIsMeasured) {
  CheckpointPolicyOptions options = PriorOf(24);
  options.first_checkpoint_steps = 10;
  CheckpointPolicy policy(options);
  policy.ObserveStepTime(2.0);
  EXPECT_EQ(policy.NextCheckpointStep(3, 0), 10);
  EXPECT_EQ(policy.NextCheckpointStep(12, 0), 13);
  // Resumed from a checkpoint the policy did not see measured: early again.
  EXPECT_EQ(policy.NextCheckpointStep(500, 500), 510);
  const CheckpointPolicySnapshot snapshot = policy.Snapshot();
  EXPECT_FALSE(snapshot.interval_s.has_value());
  EXPECT_EQ(snapshot.interval_steps, 10);
  // Once a save has been measured, the real interval.
  policy.ObserveCheckpoint(60);
  EXPECT_EQ(policy.NextCheckpointStep(10, 10), 1600);
}

TEST(CheckpointPolicyTest, FirstCheckpointRespectsTheSpecBounds) {
  CheckpointPolicyOptions options = PriorOf(24);
  options.first_checkpoint_steps = 10;
  options.min_every_steps = 50;
  CheckpointPolicy policy(options);
  policy.ObserveStepTime(2.0);
  EXPECT_EQ(policy.NextCheckpointStep(0, 0), 50);
  options.min_every_steps = 1;
  options.max_every_steps = 4;
  CheckpointPolicy bounded(options);
  bounded.ObserveStepTime(2.0);
  EXPECT_EQ(bounded.NextCheckpointStep(0, 0), 4);
}

TEST(CheckpointPolicyTest, DeltaAndStepTimeIgnoreOutliers) {
  CheckpointPolicy policy(PriorOf(24));
  for (double blocked : {60.0, 61.0, 900.0, 59.0, 60.0}) policy.ObserveCheckpoint(blocked);
  EXPECT_DOUBLE_EQ(*policy.Snapshot().delta_s, 60);
  // Warm-up reports of an attempt, then steady steps.
  for (double seconds : {40.0, 9.0}) policy.ObserveStepTime(seconds);
  for (int i = 0; i < 5; ++i) policy.ObserveStepTime(2.0);
  EXPECT_DOUBLE_EQ(*policy.Snapshot().step_time_s, 2.0);
  // A lasting change is followed within half a window.
  for (int i = 0; i < 3; ++i) policy.ObserveCheckpoint(240);
  EXPECT_DOUBLE_EQ(*policy.Snapshot().delta_s, 240);
}

TEST(CheckpointPolicyTest, InvalidMeasurementsAreIgnored) {
  CheckpointPolicy policy(PriorOf(24));
  policy.ObserveStepTime(2.0);
  policy.ObserveCheckpoint(60);
  const CheckpointPolicySnapshot before = policy.Snapshot();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  for (double bad : {nan, inf, -1.0}) {
    policy.ObserveCheckpoint(bad);
    policy.ObserveStepTime(bad);
  }
  policy.ObserveStepTime(0);
  policy.ObserveRunning(absl::Seconds(-5));
  policy.ObserveRunning(absl::InfiniteDuration());
  const CheckpointPolicySnapshot after = policy.Snapshot();
  EXPECT_EQ(after.delta_s, before.delta_s);
  EXPECT_EQ(after.step_time_s, before.step_time_s);
  EXPECT_EQ(after.mtbf_s, before.mtbf_s);
  EXPECT_EQ(after.exposure, absl::ZeroDuration());
  EXPECT_EQ(after.interval_steps, 1590);
}

TEST(CheckpointPolicyTest, ValidateNamesTheBadField) {
  EXPECT_TRUE(CheckpointPolicy::Validate(CheckpointPolicyOptions()).ok());
  auto expect_bad = [](CheckpointPolicyOptions options, const char* field) {
    const absl::Status status = CheckpointPolicy::Validate(options);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << field;
    EXPECT_NE(status.message().find(field), std::string::npos) << status;
  };
  CheckpointPolicyOptions options;
  options.node_mtbf = absl::ZeroDuration();
  expect_bad(options, "node_mtbf");
  options = {};
  options.nodes = 0;
  expect_bad(options, "nodes");
  options = {};
  options.prior_failures = 0;
  expect_bad(options, "prior_failures");
  options = {};
  options.memory_mtbfs = std::numeric_limits<double>::quiet_NaN();
  expect_bad(options, "memory_mtbfs");
  options = {};
  options.delta_window = 0;
  expect_bad(options, "delta_window");
  options = {};
  options.min_every_steps = 10;
  options.max_every_steps = 9;
  expect_bad(options, "max_every_steps");
  options = {};
  options.first_checkpoint_steps = 0;
  expect_bad(options, "first_checkpoint_steps");
}

// Failures come from nodes: on twice its own nodes a job's MTBF halves and an hour there weighs
// as two at its own size, and the evidence carries over from one size to another.
TEST(CheckpointPolicyTest, TheEstimateFollowsTheNodesTheJobRunsOn) {
  CheckpointPolicyOptions options;
  options.node_mtbf = absl::Hours(100);
  options.nodes = 4;
  CheckpointPolicy policy(options);
  EXPECT_DOUBLE_EQ(policy.mtbf_seconds(), 25 * kHour);
  policy.RunOn(2);
  EXPECT_DOUBLE_EQ(policy.mtbf_seconds(), 50 * kHour);
  policy.RunOn(8);
  EXPECT_DOUBLE_EQ(policy.mtbf_seconds(), 12.5 * kHour);
  policy.ObserveStepTime(1);
  policy.ObserveCheckpoint(10);
  // Daly's interval at the size it runs at now.
  EXPECT_NEAR(*policy.Snapshot().interval_s, CheckpointPolicy::DalyInterval(10, 12.5 * kHour),
              1e-6);

  CheckpointPolicy doubled(options), own(options);
  doubled.RunOn(8);
  FailEvery(doubled, 3, 4);  // 12 h on 8 nodes...
  FailEvery(own, 6, 4);      // ...weigh as 24 h on its own 4
  doubled.RunOn(4);
  // Equal but for the fading's integration, in steps of one report (twice as long at 8 nodes).
  EXPECT_NEAR(doubled.mtbf_seconds(), own.mtbf_seconds(), 1e-4 * own.mtbf_seconds());
  EXPECT_NEAR(doubled.Snapshot().effective_failures, own.Snapshot().effective_failures, 1e-3);
  EXPECT_EQ(doubled.Snapshot().exposure, absl::Hours(12));  // the time it ran
  EXPECT_EQ(own.Snapshot().exposure, absl::Hours(24));

  // Four failures in 24 h at its own size: M̂ has left the 25 h prior for the 6 h observed.
  EXPECT_LT(own.mtbf_seconds(), 10 * kHour);

  // Saved and loaded, the size-scaled clock goes on; a record written before the clock counts
  // its exposure as time at the job's own size.
  CheckpointPolicy loaded(options);
  ASSERT_TRUE(loaded.Load(doubled.Save()).ok());
  for (CheckpointPolicy* p : {&doubled, &loaded}) {
    p->RunOn(8);
    FailEvery(*p, 1, 2);
  }
  EXPECT_DOUBLE_EQ(loaded.mtbf_seconds(), doubled.mtbf_seconds());
  stored::YoungDaly old = own.Save();
  old.clear_clock_s();
  CheckpointPolicy from_old(options), from_new(options);
  ASSERT_TRUE(from_old.Load(old).ok());
  ASSERT_TRUE(from_new.Load(own.Save()).ok());
  for (CheckpointPolicy* p : {&from_old, &from_new}) FailEvery(*p, 0.5, 3);
  EXPECT_DOUBLE_EQ(from_old.mtbf_seconds(), from_new.mtbf_seconds());
}

// Saved and loaded, the estimates are the original's, and stay so under the same observations.
TEST(CheckpointPolicyTest, SavedEstimatesLoadBackAndGoOnAsTheOriginal) {
  CheckpointPolicy original(PriorOf(10));
  original.ObserveStepTime(0.5);
  original.ObserveCheckpoint(4);
  FailEvery(original, 1, 3);
  CheckpointPolicy loaded(PriorOf(10));
  ASSERT_TRUE(loaded.Load(original.Save()).ok());
  for (CheckpointPolicy* policy : {&original, &loaded}) {
    FailEvery(*policy, 0.5, 2);
    policy->ObserveCheckpoint(6);
  }
  const CheckpointPolicySnapshot a = original.Snapshot();
  const CheckpointPolicySnapshot b = loaded.Snapshot();
  EXPECT_EQ(b.delta_s, a.delta_s);
  EXPECT_EQ(b.step_time_s, a.step_time_s);
  EXPECT_DOUBLE_EQ(b.mtbf_s, a.mtbf_s);
  EXPECT_EQ(b.interval_steps, a.interval_steps);
  EXPECT_EQ(b.failures, a.failures);
  EXPECT_EQ(b.exposure, a.exposure);
  EXPECT_DOUBLE_EQ(b.effective_failures, a.effective_failures);

  stored::YoungDaly broken = original.Save();
  broken.set_evidence_failures(0);
  EXPECT_FALSE(CheckpointPolicy(PriorOf(10)).Load(broken).ok());
}

}  // namespace
}  // namespace trainyard::server
