#include "server/job_controller.h"

#include <deque>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainyard::server {
namespace {

using ::testing::HasSubstr;

const absl::Time kT0 = absl::FromUnixSeconds(1'800'000'000);

config::FaultToleranceSpec Policy() {
  config::FaultToleranceSpec f;
  f.max_restarts = 3;
  f.max_restarts_by_cause = {{"hang", 1}};
  f.backoff_initial_s = 2;
  f.backoff_multiplier = 2;
  f.backoff_max_s = 60;
  f.backoff_jitter = 0;
  return f;
}

AttemptRecord Attempt(int id, int ranks) {
  AttemptRecord attempt;
  attempt.attempt_id = id;
  for (int r = 0; r < ranks; ++r) {
    RankSlot slot;
    slot.rank = r;
    slot.node_id = "node-" + std::to_string(r);
    attempt.ranks.push_back(slot);
  }
  return attempt;
}

JobController::Failure Crash(int rank, absl::Time fault) {
  return {
      .failure_class = FailureClass::kCrash, .cause = "rank crashed", .rank = rank, .fault = fault};
}

int Used(const JobHealth& health, const std::string& failure_class) {
  for (const RestartBudgetView& b : health.restart_budgets) {
    if (b.failure_class == failure_class) return b.used;
  }
  return -1;
}

// A restart is counted when it is granted, the backoff doubles with failures in a row, and a
// backoff that outlasts the attempt's workers holds the job until it ends, which is said once.
TEST(JobControllerTest, RestartsAreCountedWhenGrantedAndWaitOutTheirBackoff) {
  JobController controller;
  controller.Configure(Policy());
  const AttemptRecord first = Attempt(1, 2);
  const FailureSummary& summary = controller.Record(Crash(1, kT0 - absl::Seconds(3)), first, kT0);
  EXPECT_EQ(summary.node_id, "node-1");
  EXPECT_DOUBLE_EQ(summary.detection_seconds, 3);
  JobController::Verdict verdict = controller.Decide(first, {}, kT0, 0.5);
  ASSERT_TRUE(verdict.restart);
  EXPECT_TRUE(controller.last_failure().restarted);
  EXPECT_EQ(controller.restart_at(), kT0 + absl::Seconds(2));
  JobHealth health;
  controller.FillHealth(health, /*restarting=*/true, kT0, 0);
  EXPECT_EQ(Used(health, "crash"), 1);
  EXPECT_EQ(health.restart_at, kT0 + absl::Seconds(2));

  EXPECT_TRUE(controller.HoldForBackoff(kT0 + absl::Seconds(1)));
  EXPECT_FALSE(controller.BackoffEnded(kT0 + absl::Seconds(1)));
  EXPECT_TRUE(controller.BackoffEnded(kT0 + absl::Seconds(2)));
  EXPECT_FALSE(controller.BackoffEnded(kT0 + absl::Seconds(3)));  // once

  // The second failure in a row waits twice as long; a committed checkpoint resets that.
  const AttemptRecord second = Attempt(2, 2);
  controller.AttemptPlaced();
  controller.Record(Crash(0, kT0 + absl::Seconds(10)), second, kT0 + absl::Seconds(10));
  ASSERT_TRUE(controller.Decide(second, {}, kT0 + absl::Seconds(10), 0.5).restart);
  EXPECT_EQ(controller.restart_at(), kT0 + absl::Seconds(14));
  controller.ProgressCommitted();
  controller.Record(Crash(0, kT0 + absl::Seconds(20)), second, kT0 + absl::Seconds(20));
  ASSERT_TRUE(controller.Decide(second, {}, kT0 + absl::Seconds(20), 0.5).restart);
  EXPECT_EQ(controller.restart_at(), kT0 + absl::Seconds(22));
  // The budget of 3 is spent.
  controller.Record(Crash(0, kT0 + absl::Seconds(30)), second, kT0 + absl::Seconds(30));
  verdict = controller.Decide(second, {}, kT0 + absl::Seconds(30), 0.5);
  EXPECT_FALSE(verdict.restart);
  EXPECT_FALSE(controller.last_failure().restarted);
  EXPECT_THAT(verdict.reason, HasSubstr("no restarts left"));
}

// A coordinator restart counts the budgets from the stored attempts: the failed attempts followed
// by another count against their class, the failed ones at the end are the failures in a row.
TEST(JobControllerTest, RestoreCountsTheBudgetsAndTheFailuresInARowFromTheAttempts) {
  std::deque<AttemptRecord> attempts;
  for (const char* failure_class : {"hang", "crash", "crash"}) {
    AttemptRecord attempt = Attempt(static_cast<int>(attempts.size()) + 1, 1);
    attempt.state = AttemptState::kFailed;
    attempt.failure_class = failure_class;
    attempts.push_back(attempt);
  }
  JobController controller;
  controller.Configure(Policy());
  controller.Restore(attempts);
  JobHealth health;
  controller.FillHealth(health, /*restarting=*/false, kT0, 0);
  EXPECT_EQ(Used(health, "hang"), 1);
  EXPECT_EQ(Used(health, "crash"), 1);  // the last attempt's failure has no successor
  // The hang budget (1) is used up; three failures in a row make the next backoff 2·2³ s.
  controller.Record({.failure_class = FailureClass::kHang, .cause = "hung", .fault = kT0},
                    attempts.back(), kT0);
  EXPECT_FALSE(controller.Decide(attempts.back(), {}, kT0, 0.5).restart);
  controller.Record(Crash(0, kT0), attempts.back(), kT0);
  ASSERT_TRUE(controller.Decide(attempts.back(), {}, kT0, 0.5).restart);
  EXPECT_EQ(controller.restart_at(), kT0 + absl::Seconds(16));
}

// With exclude_stragglers, a restart avoids its stragglers' nodes (each once), and says which.
TEST(JobControllerTest, ARestartAvoidsTheStragglersNodesOnlyWhenAskedTo) {
  const AttemptRecord attempt = Attempt(1, 4);
  const std::vector<Straggler> stragglers = {{.rank = 2, .score = 1.8}, {.rank = 9, .score = 2}};
  JobController plain;
  plain.Configure(Policy());
  plain.Record(Crash(0, kT0), attempt, kT0);
  EXPECT_TRUE(plain.Decide(attempt, stragglers, kT0, 0.5).excluded.empty());
  EXPECT_TRUE(plain.avoid_nodes().empty());

  config::FaultToleranceSpec excluding = Policy();
  excluding.exclude_stragglers = true;
  JobController controller;
  controller.Configure(excluding);
  controller.Record(Crash(0, kT0), attempt, kT0);
  const JobController::Verdict verdict = controller.Decide(attempt, stragglers, kT0, 0.5);
  ASSERT_EQ(verdict.excluded.size(), 1u);  // rank 9 is not one of the attempt's
  EXPECT_EQ(verdict.excluded[0].node_id, "node-2");
  EXPECT_DOUBLE_EQ(verdict.excluded[0].score, 1.8);
  EXPECT_EQ(controller.avoid_nodes(), std::set<std::string>{"node-2"});
}

// The restart latency is measured once, at the restarted attempt's first step.
TEST(JobControllerTest, TheFirstStepAfterARestartGivesItsLatencyOnce) {
  JobController controller;
  controller.Configure(Policy());
  EXPECT_FALSE(controller.FirstStep(kT0).has_value());
  const AttemptRecord attempt = Attempt(1, 1);
  controller.Record(Crash(0, kT0), attempt, kT0);
  ASSERT_TRUE(controller.Decide(attempt, {}, kT0, 0.5).restart);
  EXPECT_EQ(controller.FirstStep(kT0 + absl::Seconds(5)), absl::Seconds(5));
  EXPECT_FALSE(controller.FirstStep(kT0 + absl::Seconds(6)).has_value());
}

// A job restored after it ended is never configured: it shows no budgets (not unused ones).
TEST(JobControllerTest, AnUnconfiguredControllerShowsNoBudgets) {
  JobController controller;
  JobHealth health;
  controller.FillHealth(health, false, kT0, 0);
  EXPECT_TRUE(health.restart_budgets.empty());
}

// For `every_steps: auto` the controller keeps the Young–Daly estimate: the attempt's running
// time and its infrastructure failures (not the user's) feed it, the first save comes after
// first_checkpoint_steps, and the estimate survives a coordinator restart through the accounts.
TEST(JobControllerTest, YoungDalyCountsRunningTimeAndInfrastructureFailuresAndIsStored) {
  JobController none;
  none.Configure(Policy());
  none.ChooseCheckpoints(std::nullopt);
  EXPECT_FALSE(none.chooses_checkpoints());
  EXPECT_FALSE(none.CheckpointDue(100, 0).has_value());
  JobHealth plain;
  none.FillHealth(plain, false, kT0, 0);
  EXPECT_FALSE(plain.young_daly.has_value());

  CheckpointPolicyOptions options;
  options.first_checkpoint_steps = 10;
  JobController controller;
  controller.Configure(Policy());
  controller.ChooseCheckpoints(options);
  const AttemptRecord attempt = Attempt(1, 1);
  controller.AttemptRunning(kT0, 1);
  controller.RunningUntil(kT0 + absl::Minutes(30));
  controller.Record(Crash(0, kT0 + absl::Hours(1)), attempt, kT0 + absl::Hours(1));
  controller.Record({.failure_class = FailureClass::kUserError,
                     .cause = "bad data",
                     .fault = kT0 + absl::Hours(2)},
                    attempt, kT0 + absl::Hours(2));         // not running: no exposure, no failure
  EXPECT_EQ(controller.CheckpointDue(3, 0), std::nullopt);  // no step time yet
  controller.StepTook(0.5);
  EXPECT_EQ(controller.CheckpointDue(3, 0), 10);
  EXPECT_EQ(controller.CheckpointDue(12, 0), 13);  // past due: the next step
  JobHealth health;
  controller.FillHealth(health, false, kT0, /*next_checkpoint_step=*/10);
  ASSERT_TRUE(health.young_daly.has_value());
  EXPECT_EQ(health.young_daly->failures_observed, 1);
  EXPECT_DOUBLE_EQ(health.young_daly->exposure_s, 3600);
  EXPECT_EQ(health.young_daly->next_step, 10);

  stored::JobAccounts accounts;
  controller.SaveCheckpointEstimates(accounts);
  JobController restarted;
  restarted.Configure(Policy());
  restarted.ChooseCheckpoints(options);
  ASSERT_TRUE(restarted.LoadCheckpointEstimates(accounts).ok());
  JobHealth again;
  restarted.FillHealth(again, false, kT0, 10);
  ASSERT_TRUE(again.young_daly.has_value());
  EXPECT_EQ(again.young_daly->failures_observed, 1);
  EXPECT_DOUBLE_EQ(again.young_daly->mtbf_s, health.young_daly->mtbf_s);
}

}  // namespace
}  // namespace trainyard::server
