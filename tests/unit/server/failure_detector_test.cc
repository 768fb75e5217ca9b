#include "server/failure_detector.h"

#include <vector>

#include "absl/time/time.h"
#include "config/hang_limit.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainyard::server {
namespace {

using ::testing::HasSubstr;

const absl::Time kStart = absl::FromUnixSeconds(1'700'000'000);

config::FaultToleranceSpec Limits(double floor_s = 3, double multiple = 10, double startup = 60) {
  config::FaultToleranceSpec f;
  f.hang_floor_s = floor_s;
  f.hang_step_multiple = multiple;
  f.hang_startup_s = startup;
  return f;
}

FailureDetector::Options Opts(config::FaultToleranceSpec limits = Limits()) {
  return {.limits = limits, .gather = absl::Seconds(2), .slack = absl::Seconds(3)};
}

HangReport Waiting(int rank, std::vector<int> peers, double waited = 3.1) {
  HangReport r;
  r.rank = rank;
  r.step = 57;
  r.elapsed_s = waited + 0.1;
  r.limit_s = 3;
  r.operation = "all-reduce";
  r.group = "dp";
  r.waiting_for = std::move(peers);
  r.waiting_s = waited;
  return r;
}

TEST(HangLimitPolicyTest, StartupUntilAStepThenFloorOrMultipleOfP99) {
  const config::FaultToleranceSpec f = Limits(30, 10, 600);
  EXPECT_EQ(config::HangLimitSeconds(f, {}), 600);
  const std::vector<double> fast(100, 0.5);
  EXPECT_EQ(config::HangLimitSeconds(f, fast), 30);  // 10 × 0.5 s is below the floor
  std::vector<double> slow(100, 2.0);
  EXPECT_EQ(config::HangLimitSeconds(f, slow), 30);
  slow.assign(100, 4.0);
  EXPECT_EQ(config::HangLimitSeconds(f, slow), 40);
  // p99 by nearest rank: of 100 values the 99th smallest; one outlier is ignored, two are not.
  std::vector<double> one(100, 4.0);
  one[10] = 100;
  EXPECT_EQ(config::HangLimitSeconds(f, one), 40);
  one[20] = 50;
  EXPECT_EQ(config::HangLimitSeconds(f, one), 500);
}

TEST(FailureDetectorTest, SteadyProgressIsNeverAHang) {
  FailureDetector d(Opts(), 2, kStart);
  absl::Time t = kStart;
  for (int step = 1; step <= 100; ++step) {
    t += absl::Milliseconds(500);
    d.Progress(0, step, 0.1, t);
    d.Progress(1, step, 0.1, t);
    EXPECT_FALSE(d.Check(t).has_value());
  }
  EXPECT_EQ(d.LimitSeconds(), 3);
}

// A rank that says it entered a long phase (a first evaluation, a checkpoint save) is allowed
// that phase's limit from when it began; the next step's report ends it, and the step's short
// limit applies again.
TEST(FailureDetectorTest, APhaseNoticeExtendsTheCheckUntilTheNextStep) {
  FailureDetector d(Opts(), 2, kStart);
  absl::Time t = kStart;
  for (int step = 1; step <= 20; ++step) {
    t += absl::Milliseconds(100);
    d.Progress(0, step, 0.1, t);
    d.Progress(1, step, 0.1, t);
  }
  EXPECT_EQ(d.LimitOf(), "step");
  t += absl::Milliseconds(100);
  d.PhaseStarted(0, 21, config::HangPhase::kEvaluation, 60, t);
  EXPECT_EQ(d.step(), 21) << "the notice says step 21 finished";
  EXPECT_EQ(d.LimitInUse(), 60);
  EXPECT_EQ(d.LimitOf(), "evaluation");
  const absl::Time phase_start = t;
  EXPECT_FALSE(d.Check(phase_start + absl::Seconds(62)).has_value());  // 60 s + 3 s slack
  t = phase_start + absl::Seconds(50);
  d.Progress(0, 22, 0.1, t);  // the evaluation ended; the next step finished
  EXPECT_EQ(d.LimitOf(), "step");
  EXPECT_EQ(d.LimitInUse(), 3);
  EXPECT_FALSE(d.Check(t + absl::Seconds(6)).has_value());
  const std::optional<HangVerdict> v = d.Check(t + absl::Seconds(6.5));
  ASSERT_TRUE(v.has_value());
  EXPECT_THAT(v->reason, HasSubstr("after step 22 (step limit 3.0 s + 3 s)"));
}

TEST(FailureDetectorTest, ASilentPhasePastItsLimitIsAHang) {
  FailureDetector d(Opts(), 1, kStart);
  d.Progress(0, 5, 0.1, kStart + absl::Seconds(1));
  d.PhaseStarted(0, 5, config::HangPhase::kCheckpoint, 20, kStart + absl::Seconds(2));
  d.PhaseStarted(0, 5, config::HangPhase::kCheckpoint, -1, kStart + absl::Seconds(2));  // ignored
  EXPECT_FALSE(d.Check(kStart + absl::Seconds(25)).has_value());
  const std::optional<HangVerdict> v = d.Check(kStart + absl::Seconds(25.5));
  ASSERT_TRUE(v.has_value());
  EXPECT_THAT(v->reason, HasSubstr("(checkpoint save limit 20.0 s + 3 s)"));
}

TEST(FailureDetectorTest, StartupLimitBeforeTheFirstStep) {
  FailureDetector d(Opts(Limits(3, 10, 60)), 1, kStart);
  EXPECT_FALSE(d.Check(kStart + absl::Seconds(62)).has_value());  // 60 s + 3 s slack
  const std::optional<HangVerdict> v = d.Check(kStart + absl::Seconds(64));
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(v->rank, 0);
  EXPECT_THAT(v->reason, HasSubstr("after the attempt started"));
  EXPECT_FALSE(d.Check(kStart + absl::Seconds(65)).has_value()) << "a verdict is given once";
}

TEST(FailureDetectorTest, SilentSingleRankIsBlamedByTheProgressCheck) {
  FailureDetector d(Opts(), 1, kStart);
  d.Progress(0, 10, 0.05, kStart + absl::Seconds(1));
  EXPECT_FALSE(d.Check(kStart + absl::Seconds(6)).has_value());  // 3 s limit + 3 s slack
  const std::optional<HangVerdict> v = d.Check(kStart + absl::Seconds(7.5));
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(v->rank, 0);
  EXPECT_FALSE(v->from_workers);
  EXPECT_EQ(v->fault, kStart + absl::Seconds(1));
  EXPECT_THAT(v->reason, HasSubstr("after step 10"));
}

TEST(FailureDetectorTest, SilenceBlamesTheRankHeardFromLeast) {
  FailureDetector d(Opts(), 3, kStart);
  d.Progress(0, 5, 0.1, kStart + absl::Seconds(1));
  d.Progress(2, 5, 0.1, kStart + absl::Seconds(1));
  d.Progress(1, 4, 0.1, kStart + absl::Milliseconds(300));  // rank 1 went quiet first
  const std::optional<HangVerdict> v = d.Check(kStart + absl::Seconds(10));
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(v->rank, 1);
}

TEST(FailureDetectorTest, BlameGoesToTheRankOthersWaitFor) {
  FailureDetector d(Opts(), 2, kStart);
  d.Progress(0, 57, 0.1, kStart);
  d.Progress(1, 57, 0.1, kStart);
  d.HangReported(Waiting(0, {1}), kStart + absl::Seconds(3));
  EXPECT_TRUE(d.gathering());
  EXPECT_FALSE(d.Check(kStart + absl::Seconds(4)).has_value()) << "rank 1 may still report";
  const std::optional<HangVerdict> v = d.Check(kStart + absl::Seconds(5));
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(v->rank, 1) << "the healthy rank that noticed is not to blame";
  EXPECT_TRUE(v->from_workers);
  EXPECT_THAT(v->reason, HasSubstr("rank 0 waited 3.1 s for it in all-reduce (dp group)"));
}

TEST(FailureDetectorTest, RingOfWaitsBlamesItsSink) {
  // Rank 2 of a ring of 4 stopped: 3 waits for 2, 0 for 3, 1 for 0.
  FailureDetector d(Opts(), 4, kStart);
  d.HangReported(Waiting(0, {3}), kStart + absl::Seconds(3));
  d.HangReported(Waiting(1, {0}), kStart + absl::Seconds(3));
  d.HangReported(Waiting(3, {2}), kStart + absl::Seconds(3));
  const std::optional<HangVerdict> v = d.Check(kStart + absl::Seconds(5));
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(v->rank, 2);
}

TEST(FailureDetectorTest, VerdictAsSoonAsEveryRankReportedOrExited) {
  FailureDetector d(Opts(), 3, kStart);
  d.HangReported(Waiting(0, {2}), kStart + absl::Seconds(3));
  d.RankExited(1);
  EXPECT_FALSE(d.Check(kStart + absl::Seconds(3)).has_value());
  d.HangReported(Waiting(2, {0}), kStart + absl::Seconds(3));
  // 0 and 2 wait for each other: a cycle; the longest wait is blamed.
  const std::optional<HangVerdict> v = d.Check(kStart + absl::Seconds(3));
  ASSERT_TRUE(v.has_value());
  EXPECT_THAT(v->reason, HasSubstr("every rank reported waiting"));
}

TEST(FailureDetectorTest, RankStuckOutsideACollectiveBlamesItself) {
  FailureDetector d(Opts(), 2, kStart);
  HangReport spinning;
  spinning.rank = 1;
  spinning.step = 20;
  spinning.elapsed_s = 3.2;
  spinning.limit_s = 3;
  d.HangReported(spinning, kStart + absl::Seconds(3));
  d.HangReported(Waiting(0, {1}), kStart + absl::Seconds(3));
  const std::optional<HangVerdict> v = d.Check(kStart + absl::Seconds(3));
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(v->rank, 1);
  EXPECT_THAT(v->reason, HasSubstr("outside any collective"));
}

TEST(FailureDetectorTest, SuspendedAttemptIsNotCheckedButReportsStillCount) {
  FailureDetector d(Opts(), 1, kStart);
  d.Progress(0, 100, 0.1, kStart);
  d.Suspend();  // the last step's checkpoint commit
  EXPECT_FALSE(d.Check(kStart + absl::Minutes(10)).has_value());
  d.HangReported(Waiting(0, {}), kStart + absl::Minutes(10));
  EXPECT_TRUE(d.Check(kStart + absl::Minutes(10)).has_value());
}

TEST(FailureDetectorTest, LimitFollowsTheSlowestReportedSteps) {
  FailureDetector d(Opts(Limits(1, 10, 60)), 1, kStart);
  EXPECT_EQ(d.LimitSeconds(), 60);
  d.Progress(0, 1, 0.8, kStart + absl::Seconds(1));
  EXPECT_DOUBLE_EQ(d.LimitSeconds(), 8);
}

}  // namespace
}  // namespace trainyard::server
