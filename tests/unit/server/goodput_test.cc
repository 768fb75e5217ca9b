#include "server/goodput.h"

#include <cmath>
#include <cstdint>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainyard::server {
namespace {

using ::testing::DoubleNear;
using ::testing::ElementsAre;
using ::testing::Pair;

constexpr double kTolerance = 1e-9;

absl::Time At(double seconds) { return absl::FromUnixSeconds(1'000'000) + absl::Seconds(seconds); }

// The invariant every snapshot must keep: the categories add up to the wall time.
void ExpectSumsToWall(const GoodputSnapshot& s) {
  double restart = 0;
  for (const auto& [cause, seconds] : s.restart_s_by_cause) restart += seconds;
  double lost = 0;
  for (const auto& [cause, seconds] : s.lost_s_by_cause) lost += seconds;
  EXPECT_NEAR(restart, s.restart_s, kTolerance);
  EXPECT_NEAR(lost, s.lost_s, kTolerance);
  EXPECT_NEAR(s.productive_s + s.checkpoint_s + s.startup_s + s.restart_s + s.lost_s + s.other_s,
              s.wall_s, kTolerance);
  for (double part :
       {s.productive_s, s.checkpoint_s, s.startup_s, s.restart_s, s.lost_s, s.other_s}) {
    EXPECT_GE(part, -kTolerance);
  }
  if (s.wall_s > 0) {
    EXPECT_NEAR(s.ratio, s.productive_s / s.wall_s, kTolerance);
  }
}

// Reports steps from..to (inclusive, every `per_report` steps) one second apart from `start`.
void TrainSteadily(GoodputAccount& account, double start, int64_t from, int64_t to,
                   int64_t per_report) {
  double t = start;
  for (int64_t step = from; step <= to; step += per_report, t += 1) account.Progress(At(t), step);
}

TEST(GoodputAccountTest, EmptyAccountIsAllZero) {
  GoodputAccount account;
  const GoodputSnapshot s = account.Snapshot(At(50));
  EXPECT_EQ(s.wall_s, 0);
  EXPECT_EQ(s.ratio, 0);
  EXPECT_EQ(s.attempts, 0);
  EXPECT_FALSE(s.last_detection_latency_s.has_value());
  ExpectSumsToWall(s);
}

TEST(GoodputAccountTest, JobWithoutFailuresIsStartupTrainingAndTail) {
  GoodputAccount account;
  account.AttemptScheduled(At(0), 0);
  account.Progress(At(4), 0);            // restored, no step completed yet: still start-up
  TrainSteadily(account, 10, 1, 11, 1);  // first completed step at 10 s, the last at 20 s

  GoodputSnapshot live = account.Snapshot(At(20.5));
  EXPECT_DOUBLE_EQ(live.wall_s, 20.5);
  EXPECT_DOUBLE_EQ(live.startup_s, 10);
  EXPECT_DOUBLE_EQ(live.productive_s, 10);
  EXPECT_DOUBLE_EQ(live.other_s, 0.5);  // since the latest report
  EXPECT_TRUE(live.restart_s_by_cause.empty());
  ExpectSumsToWall(live);

  account.Finished(At(22));
  const GoodputSnapshot done = account.Snapshot(At(1000));  // `now` no longer matters
  EXPECT_DOUBLE_EQ(done.wall_s, 22);
  EXPECT_DOUBLE_EQ(done.startup_s, 10);
  EXPECT_DOUBLE_EQ(done.productive_s, 10);
  EXPECT_DOUBLE_EQ(done.other_s, 2);
  EXPECT_DOUBLE_EQ(done.ratio, 10.0 / 22);
  EXPECT_EQ(done.lost_s, 0);
  EXPECT_EQ(done.attempts, 1);
  EXPECT_TRUE(done.failures.empty());
  ExpectSumsToWall(done);

  // Nothing changes the account once finished.
  account.Progress(At(30), 50);
  account.CheckpointBlocked(1);
  account.Failed(At(30), At(31), "crash");
  account.AttemptScheduled(At(40), 0);
  const GoodputSnapshot after = account.Snapshot(At(1000));
  EXPECT_DOUBLE_EQ(after.wall_s, 22);
  EXPECT_DOUBLE_EQ(after.productive_s, 10);
  EXPECT_EQ(after.checkpoint_s, 0);
  ExpectSumsToWall(after);
}

TEST(GoodputAccountTest, CheckpointBlockingComesOutOfStallsFirstThenTraining) {
  GoodputAccount account;
  account.AttemptScheduled(At(0), 0);
  account.Progress(At(5), 10);
  account.Progress(At(6), 20);
  account.Progress(At(7), 30);
  account.Progress(At(8), 30);  // stalled while saving
  account.Progress(At(9), 30);
  account.Progress(At(10), 40);
  account.Progress(At(11), 50);
  account.CheckpointBlocked(3);
  account.CheckpointBlocked(-1);            // ignored
  account.CheckpointBlocked(std::nan(""));  // ignored
  account.Finished(At(11));

  const GoodputSnapshot s = account.Snapshot(At(11));
  EXPECT_DOUBLE_EQ(s.wall_s, 11);
  EXPECT_DOUBLE_EQ(s.startup_s, 5);
  EXPECT_DOUBLE_EQ(s.checkpoint_s, 3);
  // 4 s of rising steps, 1 s of which the save took beyond the 2 s stall.
  EXPECT_DOUBLE_EQ(s.productive_s, 3);
  EXPECT_DOUBLE_EQ(s.other_s, 0);
  ExpectSumsToWall(s);
}

TEST(GoodputAccountTest, StallsWithoutSavesAreOtherAndFinalSaveFitsInTheTail) {
  GoodputAccount account;
  account.AttemptScheduled(At(0), 0);
  account.Progress(At(2), 1);
  account.Progress(At(3), 2);
  account.Progress(At(6), 2);  // evaluation: 3 s without a rising step
  account.Progress(At(7), 3);
  account.CheckpointBlocked(1.5);  // the final save, after the last report
  account.Finished(At(9));

  const GoodputSnapshot s = account.Snapshot(At(9));
  EXPECT_DOUBLE_EQ(s.startup_s, 2);
  EXPECT_DOUBLE_EQ(s.productive_s, 2);
  EXPECT_DOUBLE_EQ(s.checkpoint_s, 1.5);
  EXPECT_DOUBLE_EQ(s.other_s, 3.5);  // the 3 s stall and 2 s tail, less the save
  ExpectSumsToWall(s);
}

TEST(GoodputAccountTest, CheckpointTimeIsCappedAtTheAttemptsTime) {
  GoodputAccount account;
  account.AttemptScheduled(At(0), 0);
  account.Progress(At(2), 1);
  account.Progress(At(4), 3);
  account.CheckpointBlocked(100);
  const GoodputSnapshot s = account.Snapshot(At(5));
  EXPECT_DOUBLE_EQ(s.checkpoint_s, 3);  // 2 s of training and the 1 s tail
  EXPECT_EQ(s.productive_s, 0);
  EXPECT_DOUBLE_EQ(s.startup_s, 2);
  ExpectSumsToWall(s);
}

TEST(GoodputAccountTest, CrashBooksLostWorkAndRestartByCause) {
  GoodputAccount account;
  account.AttemptScheduled(At(0), 0);
  TrainSteadily(account, 10, 10, 110, 10);  // 100 steps in 10 s: 0.1 s a step
  account.Failed(At(20.4), At(21), "crash");
  account.Progress(At(21.5), 150);  // after the failure: not counted
  account.AttemptScheduled(At(25), 60);

  GoodputSnapshot restarting = account.Snapshot(At(30));
  EXPECT_NEAR(restarting.restart_s_by_cause.at("crash"), 30 - 20.4, kTolerance);
  EXPECT_DOUBLE_EQ(restarting.lost_s_by_cause.at("crash"), 5);  // steps 60..110
  EXPECT_FALSE(restarting.last_restart_latency_s.has_value());
  ExpectSumsToWall(restarting);

  TrainSteadily(account, 32, 70, 110, 10);  // first completed step at 32 s
  account.Finished(At(36));
  const GoodputSnapshot s = account.Snapshot(At(36));
  EXPECT_DOUBLE_EQ(s.wall_s, 36);
  EXPECT_DOUBLE_EQ(s.startup_s, 10);
  EXPECT_THAT(s.restart_s_by_cause, ElementsAre(Pair("crash", DoubleNear(11.6, kTolerance))));
  EXPECT_THAT(s.lost_s_by_cause, ElementsAre(Pair("crash", DoubleNear(5, kTolerance))));
  EXPECT_DOUBLE_EQ(s.productive_s, 5 + 4);
  EXPECT_NEAR(s.other_s, 0.4, kTolerance);  // from the last report to the crash
  EXPECT_DOUBLE_EQ(s.ratio, 9.0 / 36);
  EXPECT_THAT(s.failures_by_cause, ElementsAre(Pair("crash", 1)));
  ASSERT_EQ(s.failures.size(), 1u);
  EXPECT_NEAR(s.failures[0].detection_s, 0.6, kTolerance);
  EXPECT_NEAR(*s.last_detection_latency_s, 0.6, kTolerance);
  EXPECT_DOUBLE_EQ(*s.last_restart_latency_s, 32 - 21);
  ExpectSumsToWall(s);
}

TEST(GoodputAccountTest, ResumingFromMemoryNewerThanTheCheckpointLosesLess) {
  GoodputAccount account;
  account.AttemptScheduled(At(0), 0);
  TrainSteadily(account, 10, 10, 110, 10);  // 100 steps in 10 s
  account.Failed(At(20.4), At(21), "crash");
  account.AttemptScheduled(At(25), 60);  // the newest checkpoint: step 60
  EXPECT_DOUBLE_EQ(account.Snapshot(At(26)).lost_s_by_cause.at("crash"), 5);
  account.Resumed(100);  // the memory tier had step 100
  EXPECT_DOUBLE_EQ(account.Snapshot(At(26)).lost_s_by_cause.at("crash"), 1);  // 100..110
  account.Resumed(50);  // older than what it resumed from: ignored
  EXPECT_DOUBLE_EQ(account.Snapshot(At(26)).lost_s_by_cause.at("crash"), 1);
  account.Resumed(110);  // nothing lost
  EXPECT_DOUBLE_EQ(account.Snapshot(At(26)).lost_s_by_cause.at("crash"), 0);
  TrainSteadily(account, 32, 111, 120, 1);
  EXPECT_GT(account.Snapshot(At(40)).productive_s, 10);
}

TEST(GoodputAccountTest, ResumingFromStepZeroLosesOnlyMeasuredTraining) {
  GoodputAccount account;
  account.AttemptScheduled(At(0), 0);
  TrainSteadily(account, 10, 10, 110, 10);
  account.Failed(At(20), At(21), "collective_timeout");
  account.AttemptScheduled(At(22), 0);
  account.Progress(At(30), 5);
  const GoodputSnapshot s = account.Snapshot(At(30));
  // Steps 1..10 were trained during start-up; only the 10 s measured after them are lost.
  EXPECT_DOUBLE_EQ(s.lost_s_by_cause.at("collective_timeout"), 10);
  EXPECT_EQ(s.productive_s, 0);
  EXPECT_DOUBLE_EQ(s.startup_s, 10);
  EXPECT_DOUBLE_EQ(s.restart_s_by_cause.at("collective_timeout"), 10);
  ExpectSumsToWall(s);
}

TEST(GoodputAccountTest, HangCountsFromTheLastProgressUntilTheNextFirstStep) {
  GoodputAccount account;
  account.AttemptScheduled(At(0), 0);
  TrainSteadily(account, 10, 10, 110, 10);  // last progress at 20 s
  // Nothing is known of the hang until it is detected, 30 s later.
  GoodputSnapshot before = account.Snapshot(At(40));
  EXPECT_DOUBLE_EQ(before.other_s, 20);
  EXPECT_FALSE(before.last_detection_latency_s.has_value());
  ExpectSumsToWall(before);

  account.Failed(At(20), At(50), "hang");
  account.AttemptScheduled(At(52), 100);
  GoodputSnapshot waiting = account.Snapshot(At(55));
  EXPECT_DOUBLE_EQ(waiting.restart_s_by_cause.at("hang"), 35);
  EXPECT_DOUBLE_EQ(*waiting.last_detection_latency_s, 30);
  EXPECT_FALSE(waiting.last_restart_latency_s.has_value());
  ExpectSumsToWall(waiting);

  account.Progress(At(60), 101);
  account.Progress(At(61), 111);
  const GoodputSnapshot s = account.Snapshot(At(61));
  EXPECT_DOUBLE_EQ(s.restart_s_by_cause.at("hang"), 40);
  EXPECT_DOUBLE_EQ(s.lost_s_by_cause.at("hang"), 1);  // steps 100..110
  EXPECT_DOUBLE_EQ(s.productive_s, 9 + 1);
  EXPECT_EQ(s.other_s, 0);
  EXPECT_DOUBLE_EQ(*s.last_detection_latency_s, 30);
  EXPECT_DOUBLE_EQ(*s.last_restart_latency_s, 10);
  ExpectSumsToWall(s);
}

TEST(GoodputAccountTest, FailureBeforeTheFirstStepEndsStartup) {
  GoodputAccount account;
  account.AttemptScheduled(At(0), 0);
  account.Progress(At(3), 0);
  account.CheckpointBlocked(2);  // of an attempt that never completes a step: counts nothing
  account.Failed(At(5), At(6), "node_lost");
  account.AttemptScheduled(At(8), 0);
  account.Progress(At(12), 1);
  account.Progress(At(13), 11);
  account.Finished(At(13));

  const GoodputSnapshot s = account.Snapshot(At(13));
  EXPECT_DOUBLE_EQ(s.startup_s, 5);
  EXPECT_EQ(s.checkpoint_s, 0);
  EXPECT_THAT(s.restart_s_by_cause, ElementsAre(Pair("node_lost", DoubleNear(7, kTolerance))));
  EXPECT_THAT(s.lost_s_by_cause, ElementsAre(Pair("node_lost", 0)));
  EXPECT_DOUBLE_EQ(s.productive_s, 1);
  EXPECT_DOUBLE_EQ(*s.last_detection_latency_s, 1);
  EXPECT_DOUBLE_EQ(*s.last_restart_latency_s, 6);
  ExpectSumsToWall(s);
}

TEST(GoodputAccountTest, ConsecutiveFailuresSplitRestartTimeByCause) {
  GoodputAccount account;
  account.AttemptScheduled(At(0), 0);
  account.Progress(At(2), 1);
  account.Progress(At(3), 2);
  account.Failed(At(3), At(4), "crash");
  account.AttemptScheduled(At(5), 2);
  account.Failed(At(9), At(9), "node_lost");  // before its first step
  account.AttemptScheduled(At(10), 2);
  account.Progress(At(14), 3);

  const GoodputSnapshot s = account.Snapshot(At(14));
  EXPECT_DOUBLE_EQ(s.restart_s_by_cause.at("crash"), 6);      // 3 s to 9 s
  EXPECT_DOUBLE_EQ(s.restart_s_by_cause.at("node_lost"), 5);  // 9 s to 14 s
  ASSERT_EQ(s.failures.size(), 2u);
  EXPECT_FALSE(s.failures[0].restart_s.has_value());  // its next attempt never got a step
  EXPECT_DOUBLE_EQ(*s.failures[1].restart_s, 5);
  EXPECT_DOUBLE_EQ(s.productive_s, 1);
  ExpectSumsToWall(s);
}

TEST(GoodputAccountTest, AnOlderCheckpointCutsEveryEarlierAttempt) {
  GoodputAccount account;
  account.AttemptScheduled(At(0), 0);
  TrainSteadily(account, 10, 10, 110, 10);  // 0.1 s a step
  account.Failed(At(20), At(20), "crash");
  account.AttemptScheduled(At(20), 80);
  TrainSteadily(account, 30, 90, 130, 20);  // 40 steps in 2 s: 0.05 s a step
  account.Failed(At(32), At(32), "hang");
  account.AttemptScheduled(At(32), 50);  // the checkpoint at 80 turned out corrupt

  const GoodputSnapshot s = account.Snapshot(At(33));
  EXPECT_NEAR(s.lost_s_by_cause.at("crash"), 3, kTolerance);     // 80..110 of the first
  EXPECT_NEAR(s.lost_s_by_cause.at("hang"), 3 + 2, kTolerance);  // 50..80, and all of the second
  EXPECT_NEAR(s.productive_s, 4, kTolerance);                    // 10..50 of the first
  ExpectSumsToWall(s);
}

TEST(GoodputAccountTest, FaultBeforeTheLastReportIsTakenAtThatReport) {
  GoodputAccount account;
  account.AttemptScheduled(At(0), 0);
  TrainSteadily(account, 10, 10, 50, 10);       // last report at 14 s
  account.Failed(At(12), At(16), "node_lost");  // the last heartbeat was older
  const GoodputSnapshot s = account.Snapshot(At(20));
  EXPECT_DOUBLE_EQ(s.productive_s, 4);
  EXPECT_DOUBLE_EQ(s.restart_s_by_cause.at("node_lost"), 6);
  EXPECT_DOUBLE_EQ(*s.last_detection_latency_s, 4);  // as the caller named it
  ExpectSumsToWall(s);
}

TEST(GoodputAccountTest, ReplacingARunningAttemptCountsAsRescheduled) {
  GoodputAccount account;
  account.AttemptScheduled(At(0), 0);
  TrainSteadily(account, 1, 1, 11, 1);  // steps 1..11, 1 s each, last report at 11 s
  account.AttemptScheduled(At(12), 6);  // an elastic resize from the checkpoint of step 6
  account.Progress(At(15), 7);
  account.Failed(At(16), At(17), "crash");
  account.Failed(At(18), At(19), "hang");  // no attempt runs: ignored
  account.Progress(At(18), 9);             // likewise

  const GoodputSnapshot s = account.Snapshot(At(18));
  EXPECT_DOUBLE_EQ(s.restart_s_by_cause.at(kRescheduledCause), 3);
  EXPECT_DOUBLE_EQ(s.lost_s_by_cause.at(kRescheduledCause), 5);
  EXPECT_DOUBLE_EQ(s.restart_s_by_cause.at("crash"), 2);
  EXPECT_EQ(s.restart_s_by_cause.count("hang"), 0u);
  EXPECT_DOUBLE_EQ(*s.failures[0].restart_s, 3);
  ExpectSumsToWall(s);
}

TEST(GoodputAccountTest, JobThatGivesUpAfterAFailureEndsItsRestartAtTheFinish) {
  GoodputAccount account;
  account.AttemptScheduled(At(0), 0);
  account.Progress(At(1), 1);
  account.Progress(At(2), 2);
  account.Failed(At(2), At(3), "crash");
  account.Finished(At(4));
  const GoodputSnapshot s = account.Snapshot(At(100));
  EXPECT_DOUBLE_EQ(s.wall_s, 4);
  EXPECT_DOUBLE_EQ(s.restart_s_by_cause.at("crash"), 2);
  ExpectSumsToWall(s);
}

TEST(GoodputAccountTest, TimesThatGoBackwardsAreOrdered) {
  GoodputAccount account;
  account.AttemptScheduled(At(10), 0);
  account.Progress(At(12), 1);
  account.Progress(At(11), 2);  // earlier than the previous report: taken at 12 s
  account.Progress(At(13), 3);
  const GoodputSnapshot early = account.Snapshot(At(5));  // `now` before the inputs
  EXPECT_DOUBLE_EQ(early.wall_s, 3);
  EXPECT_DOUBLE_EQ(early.productive_s, 1);
  ExpectSumsToWall(early);
}

// Saved and loaded, an account goes on exactly as the original: the same split now and after
// more events (a resume that cuts the lost work, more training, the end).
TEST(GoodputAccountTest, ASavedAccountLoadsBackAndGoesOnAsTheOriginal) {
  GoodputAccount original;
  original.AttemptScheduled(At(0), 0);
  TrainSteadily(original, 2, 1, 20, 2);
  original.CheckpointBlocked(0.5);
  original.Failed(At(14), At(15), "hang");
  original.AttemptScheduled(At(16), 10);
  TrainSteadily(original, 18, 11, 15, 1);
  GoodputAccount loaded;
  ASSERT_TRUE(loaded.Load(original.Save()).ok());
  for (GoodputAccount* account : {&original, &loaded}) {
    account->Resumed(12);
    TrainSteadily(*account, 24, 16, 30, 1);
    account->Finished(At(40));
  }
  const GoodputSnapshot a = original.Snapshot(At(50));
  const GoodputSnapshot b = loaded.Snapshot(At(50));
  ExpectSumsToWall(b);
  EXPECT_DOUBLE_EQ(b.wall_s, a.wall_s);
  EXPECT_DOUBLE_EQ(b.productive_s, a.productive_s);
  EXPECT_DOUBLE_EQ(b.checkpoint_s, a.checkpoint_s);
  EXPECT_DOUBLE_EQ(b.startup_s, a.startup_s);
  EXPECT_EQ(b.restart_s_by_cause, a.restart_s_by_cause);
  EXPECT_EQ(b.lost_s_by_cause, a.lost_s_by_cause);
  EXPECT_EQ(b.attempts, a.attempts);
  EXPECT_GT(b.lost_s, 0);

  stored::Goodput broken = original.Save();
  broken.mutable_attempts(1)->add_cuts()->set_by(7);  // no attempt 7
  EXPECT_FALSE(GoodputAccount().Load(broken).ok());
}

}  // namespace
}  // namespace trainyard::server
