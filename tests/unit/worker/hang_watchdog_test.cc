// The worker's hang watchdog (worker/hang_watchdog.h) and the wait registry it reads
// (worker/parallel/wait_registry.h), driven with a fake clock and direct Poll() calls: no
// threads, no sleeps.
#include "worker/hang_watchdog.h"

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "common/clock.h"
#include "config/spec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/parallel/wait_registry.h"

namespace trainyard::worker {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// floor 2 s, 10 × p99, 60 s before the first step.
config::FaultToleranceSpec Limits() {
  config::FaultToleranceSpec limits;
  limits.hang_floor_s = 2;
  limits.hang_step_multiple = 10;
  limits.hang_startup_s = 60;
  return limits;
}

class HangWatchdogDetectorTest : public ::testing::Test {
 protected:
  HangWatchdogDetectorTest()
      : waits_(&clock_),
        watchdog_(Limits(), &clock_, &waits_,
                  [this](const HangDiagnosis& diagnosis) { fired_.push_back(diagnosis); }) {}

  // `count` steps of `seconds` each, as the training loop marks them.
  void RunSteps(int count, double seconds) {
    for (int i = 0; i < count; ++i) {
      watchdog_.StepStarted(completed_);
      clock_.Advance(absl::Seconds(seconds));
      watchdog_.StepFinished();
      ++completed_;
    }
  }

  FakeClock clock_;
  parallel::WaitRegistry waits_;
  std::vector<HangDiagnosis> fired_;
  HangWatchdog watchdog_;  // constructed last: it reads the clock and the registry
  int64_t completed_ = 0;
};

TEST_F(HangWatchdogDetectorTest, BeforeTheFirstStepOnlyTheStartupLimitApplies) {
  EXPECT_DOUBLE_EQ(watchdog_.LimitSeconds(), 60);
  // Start-up, rendezvous and restore count against the limit: the first StepStarted does not
  // restart the clock.
  clock_.Advance(absl::Seconds(30));
  watchdog_.StepStarted(0);
  clock_.Advance(absl::Seconds(30));
  EXPECT_FALSE(watchdog_.Poll());  // 60 s: at the limit, not past it
  EXPECT_TRUE(fired_.empty());
  clock_.Advance(absl::Milliseconds(500));
  EXPECT_TRUE(watchdog_.Poll());
  ASSERT_EQ(fired_.size(), 1u);
  EXPECT_EQ(fired_[0].step, 0);
  EXPECT_DOUBLE_EQ(fired_[0].limit_s, 60);
  EXPECT_DOUBLE_EQ(fired_[0].elapsed_s, 60.5);
  EXPECT_FALSE(fired_[0].wait.has_value());
  EXPECT_EQ(fired_[0].Describe(),
            "step 1 has run 60.5 s (limit 60.0 s), not blocked in a collective");
}

TEST_F(HangWatchdogDetectorTest, AfterStepsFastOnesUseTheFloor) {
  RunSteps(20, 0.1);  // 10 × 0.1 s = 1 s: below the 2 s floor
  EXPECT_DOUBLE_EQ(watchdog_.LimitSeconds(), 2);
  watchdog_.StepStarted(completed_);
  clock_.Advance(absl::Seconds(2));
  EXPECT_FALSE(watchdog_.Poll());
  clock_.Advance(absl::Milliseconds(100));
  EXPECT_TRUE(watchdog_.Poll());
  ASSERT_EQ(fired_.size(), 1u);
  EXPECT_EQ(fired_[0].step, 20);
  EXPECT_DOUBLE_EQ(fired_[0].limit_s, 2);
}

TEST_F(HangWatchdogDetectorTest, AfterStepsSlowOnesUseAMultipleOfTheirP99) {
  RunSteps(20, 0.5);  // 10 × 0.5 s = 5 s: above the floor
  EXPECT_DOUBLE_EQ(watchdog_.LimitSeconds(), 5);
  watchdog_.StepStarted(completed_);
  clock_.Advance(absl::Milliseconds(4900));
  EXPECT_FALSE(watchdog_.Poll());  // past the floor, within the multiple
  clock_.Advance(absl::Milliseconds(200));
  EXPECT_TRUE(watchdog_.Poll());
  ASSERT_EQ(fired_.size(), 1u);
  EXPECT_DOUBLE_EQ(fired_[0].limit_s, 5);
  EXPECT_DOUBLE_EQ(fired_[0].elapsed_s, 5.1);
}

TEST_F(HangWatchdogDetectorTest, OneSlowStepAmongAHundredDoesNotRaiseTheLimitButTwoDo) {
  RunSteps(99, 0.5);
  RunSteps(1, 3.0);  // the nearest-rank p99 of 100 steps ignores the slowest one
  EXPECT_DOUBLE_EQ(watchdog_.LimitSeconds(), 5);
  RunSteps(1, 3.0);  // the oldest fast step leaves the window of 100
  EXPECT_DOUBLE_EQ(watchdog_.LimitSeconds(), 30);
}

TEST_F(HangWatchdogDetectorTest, DiagnosisNamesTheLongestWaitInProgress) {
  RunSteps(20, 0.5);
  watchdog_.StepStarted(completed_);
  clock_.Advance(absl::Milliseconds(1100));
  parallel::WaitRegistry::Scope all_reduce = waits_.Begin("all-reduce", "dp", {1});
  clock_.Advance(absl::Seconds(3));
  parallel::WaitRegistry::Scope send = waits_.Begin("send", "pp", {3});
  clock_.Advance(absl::Seconds(1));
  ASSERT_TRUE(watchdog_.Poll());  // 5.1 s into the step
  ASSERT_EQ(fired_.size(), 1u);
  const HangDiagnosis& diagnosis = fired_[0];
  ASSERT_TRUE(diagnosis.wait.has_value());
  EXPECT_EQ(diagnosis.wait->operation, "all-reduce");
  EXPECT_EQ(diagnosis.wait->group, "dp");
  EXPECT_THAT(diagnosis.wait->waiting_for, ElementsAre(1));
  EXPECT_DOUBLE_EQ(diagnosis.waiting_s, 4);
  EXPECT_EQ(diagnosis.Describe(),
            "step 21 has run 5.1 s (limit 5.0 s), blocked 4.0 s in all-reduce (dp group) waiting "
            "for rank 1");
}

TEST_F(HangWatchdogDetectorTest, DiagnosisListsEveryPeerOfTheWait) {
  RunSteps(20, 0.1);
  watchdog_.StepStarted(completed_);
  parallel::WaitRegistry::Scope barrier = waits_.Begin("barrier", "tp", {2, 3});
  clock_.Advance(absl::Seconds(3));
  ASSERT_TRUE(watchdog_.Poll());
  ASSERT_EQ(fired_.size(), 1u);
  EXPECT_THAT(fired_[0].Describe(), HasSubstr("in barrier (tp group) waiting for ranks 2, 3"));
}

TEST_F(HangWatchdogDetectorTest, WaitsThatEndedAreNotReported) {
  RunSteps(20, 0.1);
  watchdog_.StepStarted(completed_);
  { parallel::WaitRegistry::Scope done = waits_.Begin("all-reduce", "dp", {1}); }
  clock_.Advance(absl::Seconds(3));
  ASSERT_TRUE(watchdog_.Poll());
  ASSERT_EQ(fired_.size(), 1u);
  EXPECT_FALSE(fired_[0].wait.has_value());
  EXPECT_THAT(fired_[0].Describe(), HasSubstr("not blocked in a collective"));
}

TEST_F(HangWatchdogDetectorTest, SuspendStopsWatchingUntilTheNextStep) {
  RunSteps(20, 0.1);
  watchdog_.Suspend();  // the final checkpoint's commit may take long
  clock_.Advance(absl::Minutes(10));
  EXPECT_FALSE(watchdog_.Poll());
  EXPECT_TRUE(fired_.empty());
  // The next step watches again, timed from its own start.
  watchdog_.StepStarted(completed_);
  clock_.Advance(absl::Seconds(2));
  EXPECT_FALSE(watchdog_.Poll());
  clock_.Advance(absl::Milliseconds(100));
  EXPECT_TRUE(watchdog_.Poll());
  ASSERT_EQ(fired_.size(), 1u);
  EXPECT_NEAR(fired_[0].elapsed_s, 2.1, 1e-9);
}

TEST_F(HangWatchdogDetectorTest, SuspendBeforeTheFirstStepStopsTheStartupLimit) {
  watchdog_.Suspend();
  clock_.Advance(absl::Minutes(5));
  EXPECT_FALSE(watchdog_.Poll());
  EXPECT_TRUE(fired_.empty());
}

TEST_F(HangWatchdogDetectorTest, FiresOnlyOnce) {
  RunSteps(20, 0.1);
  watchdog_.StepStarted(completed_);
  clock_.Advance(absl::Seconds(3));
  EXPECT_TRUE(watchdog_.Poll());
  clock_.Advance(absl::Seconds(3));
  EXPECT_FALSE(watchdog_.Poll());
  // Not even for a later step.
  watchdog_.StepFinished();
  watchdog_.StepStarted(completed_ + 1);
  clock_.Advance(absl::Minutes(10));
  EXPECT_FALSE(watchdog_.Poll());
  EXPECT_EQ(fired_.size(), 1u);
}

// Evaluation, sampling and checkpoint saves have limits of their own: the first of each gets the
// start-up limit, later ones a multiple of their own recent durations; their time is not the
// step's, so the step's limit stays short.
TEST_F(HangWatchdogDetectorTest, PhasesAreHeldToTheirOwnLimitsAndLeaveTheStepsAlone) {
  RunSteps(20, 0.1);  // the step's limit: the 2 s floor
  watchdog_.StepStarted(completed_);
  clock_.Advance(absl::Milliseconds(100));
  EXPECT_DOUBLE_EQ(watchdog_.PhaseStarted(config::HangPhase::kEvaluation), 60);
  clock_.Advance(absl::Seconds(40));  // a first evaluation of 40 s: within the start-up limit
  EXPECT_FALSE(watchdog_.Poll());
  watchdog_.PhaseFinished();
  clock_.Advance(absl::Milliseconds(50));  // the step's own time: 0.15 s
  EXPECT_FALSE(watchdog_.Poll());
  watchdog_.StepFinished();
  ++completed_;
  EXPECT_DOUBLE_EQ(watchdog_.LimitSeconds(), 2) << "the evaluation counted as the step's";
  // A first checkpoint save is allowed the start-up limit too, whatever the evaluations took.
  watchdog_.StepStarted(completed_);
  EXPECT_DOUBLE_EQ(watchdog_.PhaseStarted(config::HangPhase::kCheckpoint), 60);
  clock_.Advance(absl::Seconds(3));
  watchdog_.PhaseFinished();
  watchdog_.StepFinished();
  ++completed_;
  // The second evaluation: 10 × the first one's 40 s.
  watchdog_.StepStarted(completed_);
  EXPECT_DOUBLE_EQ(watchdog_.PhaseStarted(config::HangPhase::kEvaluation), 400);
  clock_.Advance(absl::Seconds(400));
  EXPECT_FALSE(watchdog_.Poll());
  clock_.Advance(absl::Seconds(1));
  ASSERT_TRUE(watchdog_.Poll());
  ASSERT_EQ(fired_.size(), 1u);
  EXPECT_EQ(fired_[0].phase, config::HangPhase::kEvaluation);
  EXPECT_DOUBLE_EQ(fired_[0].limit_s, 400);
  EXPECT_EQ(fired_[0].Describe(),
            "the evaluation of step 23 has run 401.0 s (limit 400.0 s), not blocked in a "
            "collective");
}

// A stopped peer blocks this rank in the step's collective: found after the step's short limit,
// not the phases' long ones.
TEST_F(HangWatchdogDetectorTest, AStepAfterAPhaseIsHeldToTheStepsLimit) {
  RunSteps(20, 0.1);
  watchdog_.StepStarted(completed_);
  watchdog_.PhaseStarted(config::HangPhase::kCheckpoint);
  clock_.Advance(absl::Seconds(30));
  watchdog_.PhaseFinished();
  watchdog_.StepFinished();
  ++completed_;
  watchdog_.StepStarted(completed_);
  parallel::WaitRegistry::Scope all_reduce = waits_.Begin("all-reduce", "dp", {1});
  clock_.Advance(absl::Milliseconds(2100));
  ASSERT_TRUE(watchdog_.Poll());
  ASSERT_EQ(fired_.size(), 1u);
  EXPECT_EQ(fired_[0].phase, config::HangPhase::kStep);
  EXPECT_DOUBLE_EQ(fired_[0].limit_s, 2);
}

TEST_F(HangWatchdogDetectorTest, FinishedStepsKeepTheWatchdogQuiet) {
  // Steady steps, each well within the limit, however long the run.
  for (int i = 0; i < 200; ++i) {
    RunSteps(1, 0.5);
    EXPECT_FALSE(watchdog_.Poll());
  }
  EXPECT_TRUE(fired_.empty());
}

TEST_F(HangWatchdogDetectorTest, WaitRegistryScopesEndTheirWaitsAndListTheLongestFirst) {
  FakeClock& clock = clock_;
  parallel::WaitRegistry& waits = waits_;
  EXPECT_TRUE(waits.Snapshot().empty());
  std::optional<parallel::WaitRegistry::Scope> first;
  first.emplace(waits.Begin("all-reduce", "dp", {1}));
  clock.Advance(absl::Seconds(1));
  std::optional<parallel::WaitRegistry::Scope> second;
  second.emplace(waits.Begin("send", "pp", {3}));
  clock.Advance(absl::Seconds(1));
  {
    parallel::WaitRegistry::Scope third = waits.Begin("barrier", "tp", {2, 3});
    std::vector<parallel::CollectiveWait> now = waits.Snapshot();
    ASSERT_EQ(now.size(), 3u);
    EXPECT_EQ(now[0].operation, "all-reduce");
    EXPECT_EQ(now[0].since_nanos, 0);
    EXPECT_EQ(now[1].operation, "send");
    EXPECT_EQ(now[1].group, "pp");
    EXPECT_THAT(now[1].waiting_for, ElementsAre(3));
    EXPECT_EQ(now[1].since_nanos, absl::ToInt64Nanoseconds(absl::Seconds(1)));
    EXPECT_EQ(now[2].operation, "barrier");
  }
  // The third scope ended with its block; ending the first leaves the second alone.
  ASSERT_EQ(waits.Snapshot().size(), 2u);
  first.reset();
  std::vector<parallel::CollectiveWait> left = waits.Snapshot();
  ASSERT_EQ(left.size(), 1u);
  EXPECT_EQ(left[0].operation, "send");

  // A moved scope ends its wait once, when the new owner goes; the moved-from one records
  // nothing.
  {
    parallel::WaitRegistry::Scope moved(std::move(*second));
    second.reset();
    ASSERT_EQ(waits.Snapshot().size(), 1u);
  }
  EXPECT_TRUE(waits.Snapshot().empty());
  { parallel::WaitRegistry::Scope nothing; }
  EXPECT_TRUE(waits.Snapshot().empty());
}

}  // namespace
}  // namespace trainyard::worker
