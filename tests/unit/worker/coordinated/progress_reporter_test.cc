#include "worker/progress_reporter.h"

#include <atomic>
#include <cmath>
#include <memory>
#include <vector>

#include "absl/strings/match.h"
#include "common/clock.h"
#include "gtest/gtest.h"

namespace trainyard::worker {
namespace {

namespace v1 = ::trainyard::v1;

class FakeProgressChannel : public ProgressChannel {
 public:
  absl::StatusOr<v1::ProgressReply> Report(const v1::ProgressReport& report,
                                           absl::Duration timeout) override {
    reports.push_back(report);
    timeouts.push_back(timeout);
    if (clock != nullptr) clock->Advance(timeout * takes);
    if (unavailable_calls > 0) {
      --unavailable_calls;
      return absl::UnavailableError("restarting");
    }
    if (!next_status.ok()) return next_status;
    v1::ProgressReply reply;
    reply.set_order(next_order);
    return reply;
  }

  std::vector<v1::ProgressReport> reports;
  std::vector<absl::Duration> timeouts;
  absl::Status next_status;
  int unavailable_calls = 0;  // the next calls that fail as UNAVAILABLE before next_status holds
  v1::Order next_order = v1::ORDER_CONTINUE;
  FakeClock* clock = nullptr;  // when set, each call takes `takes` of its timeout on it
  double takes = 1;
};

StepReport Step(int64_t step, double seconds = 0.1, double tokens_per_second = 1000) {
  StepReport report;
  report.step = step;
  report.total_steps = 100;
  report.loss = 5.0 - 0.01 * step;
  report.z_loss = 0.001 * step;
  report.learning_rate = 1e-3;
  report.grad_norm = 0.5;
  report.step_seconds = seconds;
  report.forward_seconds = 0.3 * seconds;
  report.backward_seconds = 0.4 * seconds;
  report.optimizer_seconds = 0.2 * seconds;
  report.data_seconds = 0.1 * seconds;
  report.tokens_per_second = tokens_per_second;
  return report;
}

class ProgressReporterTest : public ::testing::Test {
 protected:
  FakeProgressChannel channel_;
  FakeClock clock_;
  ProgressReporter reporter_{&channel_, WorkerIdentity{"j-000003", 2, 1}, &clock_,
                             absl::Milliseconds(500)};
};

TEST_F(ProgressReporterTest, ReportsAtMostEveryIntervalWithAveragedTimes) {
  ASSERT_TRUE(reporter_.OnStep(Step(1)).ok());
  ASSERT_EQ(channel_.reports.size(), 1u);
  const v1::ProgressReport& first = channel_.reports[0];
  EXPECT_EQ(first.job_id(), "j-000003");
  EXPECT_EQ(first.attempt_id(), 2);
  EXPECT_EQ(first.rank(), 1);
  EXPECT_EQ(first.step(), 1);
  EXPECT_EQ(first.total_steps(), 100);
  EXPECT_DOUBLE_EQ(first.loss(), 4.99);
  EXPECT_DOUBLE_EQ(first.logit_z_loss(), 0.001);
  EXPECT_DOUBLE_EQ(first.learning_rate(), 1e-3);
  EXPECT_DOUBLE_EQ(first.grad_norm(), 0.5);
  EXPECT_FALSE(first.has_val_loss());

  clock_.Advance(absl::Milliseconds(200));
  ASSERT_TRUE(reporter_.OnStep(Step(2, 0.1, 1000)).ok());
  clock_.Advance(absl::Milliseconds(200));
  ASSERT_TRUE(reporter_.OnStep(Step(3, 0.3, 3000)).ok());
  EXPECT_EQ(channel_.reports.size(), 1u);
  clock_.Advance(absl::Milliseconds(100));
  ASSERT_TRUE(reporter_.OnStep(Step(4, 0.2, 2000)).ok());
  ASSERT_EQ(channel_.reports.size(), 2u);
  const v1::ProgressReport& second = channel_.reports[1];
  EXPECT_EQ(second.step(), 4);
  // Steps 2-4: 0.6 s in all, 100 + 900 + 400 tokens.
  EXPECT_NEAR(second.step_times().total_ms(), 200.0, 1e-9);
  // Each phase is averaged over the same steps (Step() spends 30/40/20/10% of a step on them).
  EXPECT_NEAR(second.step_times().forward_ms(), 60.0, 1e-9);
  EXPECT_NEAR(second.step_times().backward_ms(), 80.0, 1e-9);
  EXPECT_NEAR(second.step_times().optimizer_ms(), 40.0, 1e-9);
  EXPECT_NEAR(second.step_times().data_ms(), 20.0, 1e-9);
  EXPECT_NEAR(second.tokens_per_second(), 1400 / 0.6, 1e-6);
  EXPECT_EQ(reporter_.reports_sent(), 2);
}

TEST_F(ProgressReporterTest, LastStepAndEvaluationsAreAlwaysReported) {
  ASSERT_TRUE(reporter_.OnStep(Step(1)).ok());
  StepReport eval = Step(2);
  eval.val_loss = 3.25;
  ASSERT_TRUE(reporter_.OnStep(eval).ok());
  ASSERT_EQ(channel_.reports.size(), 2u);
  EXPECT_TRUE(channel_.reports[1].has_val_loss());
  EXPECT_DOUBLE_EQ(channel_.reports[1].val_loss(), 3.25);
  ASSERT_TRUE(reporter_.OnStep(Step(100)).ok());
  ASSERT_EQ(channel_.reports.size(), 3u);
  EXPECT_EQ(channel_.reports[2].step(), 100);
  EXPECT_TRUE(channel_.reports[2].has_val_loss());  // the latest one is carried along
}

TEST_F(ProgressReporterTest, StopAndDrainOrdersCancel) {
  channel_.next_order = v1::ORDER_STOP;
  absl::Status stop = reporter_.OnStep(Step(7));
  EXPECT_EQ(stop.code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(stop.message(), "stopped by the coordinator at step 7");
  channel_.next_order = v1::ORDER_DRAIN;
  clock_.Advance(absl::Seconds(1));
  EXPECT_EQ(reporter_.OnStep(Step(8)).code(), absl::StatusCode::kCancelled);
  channel_.next_order = v1::ORDER_CHECKPOINT;
  clock_.Advance(absl::Seconds(1));
  EXPECT_TRUE(reporter_.OnStep(Step(9)).ok());
}

TEST_F(ProgressReporterTest, DrainSetsTheFlagTheLoopWatches) {
  std::atomic<bool> drain{false};
  ProgressReporter reporter(&channel_, WorkerIdentity{"j-000003", 2, 0}, &clock_,
                            absl::Milliseconds(500), absl::Minutes(10), &drain);
  channel_.next_order = v1::ORDER_DRAIN;
  EXPECT_TRUE(reporter.OnStep(Step(7)).ok());  // training goes on to the agreed step
  EXPECT_TRUE(drain.load());
  channel_.next_order = v1::ORDER_STOP;
  clock_.Advance(absl::Seconds(1));
  EXPECT_EQ(reporter.OnStep(Step(8)).code(), absl::StatusCode::kCancelled);
}

TEST_F(ProgressReporterTest, CheckpointRecordsRideAlongUntilAReportIsAnswered) {
  ASSERT_TRUE(reporter_.OnStep(Step(1)).ok());
  v1::Checkpoint committed;
  committed.set_step(2);
  committed.set_path("/ck/step-00000002-aa");
  committed.set_state(v1::CHECKPOINT_STATE_COMMITTED);
  reporter_.AddCheckpoint(committed);
  // Due at once although the interval has not passed; the coordinator is down this time.
  channel_.next_status = absl::UnavailableError("down");
  ASSERT_TRUE(reporter_.OnStep(Step(2)).ok());
  ASSERT_EQ(channel_.reports.size(), 2u);
  EXPECT_EQ(channel_.reports[1].checkpoints_size(), 1);
  v1::Checkpoint failed = committed;
  failed.set_step(4);
  failed.set_path("/ck/step-00000004-aa");
  failed.set_state(v1::CHECKPOINT_STATE_FAILED);
  reporter_.AddCheckpoint(failed);
  channel_.next_status = absl::OkStatus();
  clock_.Advance(kUnreachableRetry);  // the coordinator did not answer: the next try waits
  ASSERT_TRUE(reporter_.OnStep(Step(3)).ok());
  ASSERT_EQ(channel_.reports.size(), 3u);
  ASSERT_EQ(channel_.reports[2].checkpoints_size(), 2);  // the unanswered one again, in order
  EXPECT_EQ(channel_.reports[2].checkpoints(0).step(), 2);
  EXPECT_EQ(channel_.reports[2].checkpoints(1).step(), 4);
  EXPECT_EQ(channel_.reports[2].last_checkpoint().step(), 2);  // the newest committed
  clock_.Advance(absl::Seconds(1));
  ASSERT_TRUE(reporter_.OnStep(Step(4)).ok());
  EXPECT_EQ(channel_.reports.back().checkpoints_size(), 0);  // acknowledged: not sent again
}

TEST_F(ProgressReporterTest, AnEndedAttemptAborts) {
  channel_.next_status = absl::FailedPreconditionError("attempt 2 of j-000003 is superseded");
  absl::Status status = reporter_.OnStep(Step(1));
  EXPECT_EQ(status.code(), absl::StatusCode::kAborted);
  EXPECT_EQ(status.message(),
            "the coordinator ended this attempt: attempt 2 of j-000003 is superseded");
  channel_.next_status = absl::NotFoundError("no such job");
  clock_.Advance(absl::Seconds(1));
  EXPECT_EQ(reporter_.OnStep(Step(2)).code(), absl::StatusCode::kAborted);
}

TEST_F(ProgressReporterTest, AnUnreachableCoordinatorDoesNotStopTraining) {
  channel_.next_status = absl::UnavailableError("connection refused");
  EXPECT_TRUE(reporter_.OnStep(Step(1)).ok());
  clock_.Advance(kUnreachableRetry);
  channel_.next_status = absl::DeadlineExceededError("deadline");
  EXPECT_TRUE(reporter_.OnStep(Step(2)).ok());
  EXPECT_EQ(reporter_.reports_sent(), 0);
  clock_.Advance(kUnreachableRetry);
  channel_.next_status = absl::OkStatus();
  EXPECT_TRUE(reporter_.OnStep(Step(3)).ok());
  EXPECT_EQ(reporter_.reports_sent(), 1);
  EXPECT_EQ(channel_.reports.size(), 3u);
}

// A partition swallows calls until their deadline: while the coordinator does not answer, a
// report is tried only every kUnreachableRetry, with the short deadline, even when a checkpoint
// record waits to be sent, so training is not held up on every step.
TEST_F(ProgressReporterTest, WhileUnreachableReportsAreSpacedOutAndShort) {
  ASSERT_TRUE(reporter_.OnStep(Step(1)).ok());
  EXPECT_EQ(channel_.timeouts.back(), kReportTimeout);
  channel_.next_status = absl::DeadlineExceededError("deadline");
  clock_.Advance(absl::Seconds(1));
  ASSERT_TRUE(reporter_.OnStep(Step(2)).ok());
  ASSERT_EQ(channel_.reports.size(), 2u);
  v1::Checkpoint committed;
  committed.set_step(3);
  committed.set_state(v1::CHECKPOINT_STATE_COMMITTED);
  reporter_.AddCheckpoint(committed);
  for (int step = 3; step < 20; ++step) {
    clock_.Advance(absl::Milliseconds(100));
    ASSERT_TRUE(reporter_.OnStep(Step(step)).ok());
  }
  EXPECT_EQ(channel_.reports.size(), 2u) << "tried again within " << kUnreachableRetry;
  clock_.Advance(kUnreachableRetry);
  ASSERT_TRUE(reporter_.OnStep(Step(20)).ok());
  ASSERT_EQ(channel_.reports.size(), 3u);
  EXPECT_EQ(channel_.timeouts.back(), kUnreachableTimeout);
  EXPECT_EQ(channel_.reports.back().checkpoints_size(), 1);
  // Answered again: the normal deadline, and reports as often as before.
  channel_.next_status = absl::OkStatus();
  clock_.Advance(kUnreachableRetry);
  ASSERT_TRUE(reporter_.OnStep(Step(21)).ok());
  clock_.Advance(absl::Milliseconds(500));
  ASSERT_TRUE(reporter_.OnStep(Step(22)).ok());
  ASSERT_EQ(channel_.reports.size(), 5u);
  EXPECT_EQ(channel_.timeouts.back(), kReportTimeout);
}

// A partition where the relay says after a while that it lost the coordinator, and the
// coordinator itself swallows the direct call until its deadline: the tries, each bounded by
// one deadline across both calls, with the spacing counted from a try's end, leave training
// two thirds of the time.
TEST(ProgressReporterPartitionTest, APartitionSlowsTrainingByAThirdAtMost) {
  FakeClock clock;
  auto relay = std::make_unique<FakeProgressChannel>();
  auto direct = std::make_unique<FakeProgressChannel>();
  relay->clock = direct->clock = &clock;
  relay->takes = 0.5;
  relay->next_status = absl::UnavailableError("the agent lost the coordinator");
  direct->next_status = absl::DeadlineExceededError("Deadline Exceeded");
  FakeProgressChannel* direct_calls = direct.get();
  std::unique_ptr<ProgressChannel> channel =
      MakeFallbackProgressChannel(std::move(relay), std::move(direct), &clock);
  ProgressReporter reporter(channel.get(), WorkerIdentity{"j-1", 1, 0}, &clock,
                            absl::Milliseconds(500));
  // The first try has the normal deadline; from then on it is known unreachable.
  const absl::Duration step_time = absl::Milliseconds(10);
  int64_t step = 0;
  while (direct_calls->reports.empty()) {
    clock.Advance(step_time);
    ASSERT_TRUE(reporter.OnStep(Step(++step, absl::ToDoubleSeconds(step_time))).ok());
  }
  const int64_t first_step = step, start = clock.NowNanosMonotonic();
  while (clock.NowNanosMonotonic() - start < absl::ToInt64Nanoseconds(absl::Minutes(1))) {
    clock.Advance(step_time);
    ASSERT_TRUE(reporter.OnStep(Step(++step % 99 + 1, absl::ToDoubleSeconds(step_time))).ok());
  }
  const double training = absl::ToDoubleSeconds((step - first_step) * step_time);
  const double elapsed = (clock.NowNanosMonotonic() - start) / 1e9;
  EXPECT_GE(training / elapsed, 2.0 / 3 - 0.01)
      << step - first_step << " steps in " << elapsed << " s, " << direct_calls->reports.size()
      << " tries";
  EXPECT_EQ(direct_calls->timeouts.back(), kUnreachableTimeout / 2);
}

// The last step's report (the final progress, the last checkpoints) is not lost to a coordinator
// that is restarting: it is tried every kUnreachableRetry until answered.
TEST_F(ProgressReporterTest, TheLastStepsReportWaitsForACoordinatorThatComesBack) {
  v1::Checkpoint committed;
  committed.set_step(100);
  committed.set_state(v1::CHECKPOINT_STATE_COMMITTED);
  reporter_.AddCheckpoint(committed);
  channel_.unavailable_calls = 3;
  const int64_t before = clock_.NowNanosMonotonic();
  ASSERT_TRUE(reporter_.OnStep(Step(100)).ok());
  ASSERT_EQ(channel_.reports.size(), 4u);
  EXPECT_EQ(reporter_.reports_sent(), 1);
  EXPECT_EQ(channel_.reports.back().step(), 100);
  EXPECT_EQ(channel_.reports.back().checkpoints_size(), 1);
  EXPECT_EQ(clock_.NowNanosMonotonic() - before, 3 * absl::ToInt64Nanoseconds(kUnreachableRetry));
}

// ... but not past the orphan timeout, nor for an earlier step.
TEST_F(ProgressReporterTest, TheLastStepsReportGivesUpAtTheOrphanTimeout) {
  channel_.next_status = absl::UnavailableError("connection refused");
  EXPECT_TRUE(reporter_.OnStep(Step(99)).ok());
  EXPECT_EQ(channel_.reports.size(), 1u);
  absl::Status status = reporter_.OnStep(Step(100));
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), "unreachable for over 10m")) << status;
}

TEST_F(ProgressReporterTest, AWorkerWithoutACoordinatorForTooLongStops) {
  ProgressReporter reporter(&channel_, WorkerIdentity{"j-1", 1, 0}, &clock_,
                            absl::Milliseconds(500), absl::Minutes(10));
  channel_.next_status = absl::UnavailableError("connection refused");
  EXPECT_TRUE(reporter.OnStep(Step(1)).ok());
  clock_.Advance(absl::Minutes(9));
  EXPECT_TRUE(reporter.OnStep(Step(2)).ok());
  // Reachable again: the clock starts over.
  channel_.next_status = absl::OkStatus();
  clock_.Advance(kUnreachableRetry);
  EXPECT_TRUE(reporter.OnStep(Step(3)).ok());
  channel_.next_status = absl::UnavailableError("connection refused");
  clock_.Advance(absl::Seconds(1));
  EXPECT_TRUE(reporter.OnStep(Step(4)).ok());
  clock_.Advance(absl::Minutes(9));
  EXPECT_TRUE(reporter.OnStep(Step(5)).ok());
  clock_.Advance(absl::Minutes(2));
  absl::Status status = reporter.OnStep(Step(6));
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(absl::StrContains(status.message(), "unreachable for over 10m")) << status;
}

// A worker whose agent died (its relay refuses connections), lost the coordinator or forgot the
// attempt still hears from the coordinator directly, e.g. that its attempt ended; what the relay
// relays stands.
// Two MoE layers (blocks 1 and 3) of 4 experts, top_k 2: 8 tokens, 16 picks a step.
StepReport MoeStep(int64_t step, std::vector<int64_t> layer1, int64_t dropped, double aux_loss) {
  StepReport report = Step(step);
  report.moe.push_back({1, std::move(layer1), dropped, aux_loss, 0.0, aux_loss / 10});
  report.moe.push_back({3, {4, 4, 4, 4}, 0, 0.5, 0.0});
  return report;
}

TEST_F(ProgressReporterTest, MoeRoutingIsSummedOverTheReportsWindow) {
  reporter_.SetMoe(v1::MOE_BALANCE_AUX_LOSS, 2);
  ASSERT_TRUE(reporter_.OnStep(MoeStep(1, {8, 8, 0, 0}, 1, 0.25)).ok());
  ASSERT_EQ(channel_.reports.size(), 1u);
  ASSERT_EQ(channel_.reports[0].moe_size(), 2);
  // One step: expert 0 and 1 took every token (both top-2 picks), 2 and 3 none.
  const v1::MoeLayerProgress& first = channel_.reports[0].moe(0);
  EXPECT_EQ(first.layer(), 1);
  EXPECT_EQ(first.steps(), 1);
  EXPECT_EQ(first.tokens(), 8);
  EXPECT_DOUBLE_EQ(first.tokens_max_share(), 1.0) << "a collapsed top-2 router";
  EXPECT_EQ(first.dead_experts(), 2);
  EXPECT_DOUBLE_EQ(first.tokens_cv(), 1.0);  // mean 4, deviations ±4

  // Three steps in the next window: the picks add up, expert 3 is never picked.
  clock_.Advance(absl::Milliseconds(200));
  ASSERT_TRUE(reporter_.OnStep(MoeStep(2, {6, 6, 4, 0}, 2, 0.25)).ok());
  clock_.Advance(absl::Milliseconds(200));
  ASSERT_TRUE(reporter_.OnStep(MoeStep(3, {4, 4, 8, 0}, 0, 0.5)).ok());
  clock_.Advance(absl::Milliseconds(100));
  ASSERT_TRUE(reporter_.OnStep(MoeStep(4, {5, 5, 6, 0}, 3, 0.75)).ok());
  ASSERT_EQ(channel_.reports.size(), 2u);
  ASSERT_EQ(channel_.reports[1].moe_size(), 2);
  const v1::MoeLayerProgress& window = channel_.reports[1].moe(0);
  EXPECT_EQ(window.layer(), 1);
  EXPECT_EQ(window.steps(), 3);
  EXPECT_EQ(
      std::vector<int64_t>(window.tokens_per_expert().begin(), window.tokens_per_expert().end()),
      (std::vector<int64_t>{15, 15, 18, 0}));
  EXPECT_EQ(window.tokens(), 24);  // 48 picks, 2 per token
  EXPECT_EQ(window.tokens_min(), 0);
  EXPECT_EQ(window.tokens_max(), 18);
  EXPECT_DOUBLE_EQ(window.tokens_max_share(), 18.0 / 24.0);
  // Mean 12; deviations 3, 3, 6, -12: variance (9 + 9 + 36 + 144) / 4 = 49.5.
  EXPECT_NEAR(window.tokens_cv(), std::sqrt(49.5) / 12.0, 1e-12);
  EXPECT_EQ(window.dead_experts(), 1);
  EXPECT_EQ(window.dropped(), 5);
  EXPECT_EQ(window.dropped_total(), 6) << "the first window's drop counts too";
  EXPECT_DOUBLE_EQ(window.aux_loss(), 0.5);  // the mean of 0.25, 0.5 and 0.75
  EXPECT_DOUBLE_EQ(window.z_loss(), 0.05);   // and of the router z-losses, a tenth of them
  EXPECT_EQ(window.balance(), v1::MOE_BALANCE_AUX_LOSS);
  const v1::MoeLayerProgress& even = channel_.reports[1].moe(1);
  EXPECT_EQ(even.layer(), 3);
  EXPECT_DOUBLE_EQ(even.tokens_cv(), 0.0);
  EXPECT_DOUBLE_EQ(even.tokens_max_share(), 0.5) << "top_k / experts when even";
  EXPECT_EQ(even.dead_experts(), 0);
}

TEST_F(ProgressReporterTest, MoeBiasRuleReportsTheLatestSpread) {
  reporter_.SetMoe(v1::MOE_BALANCE_BIAS, 1);
  StepReport first = Step(1);
  first.moe.push_back({0, {3, 1}, 0, 0.0, 0.0});
  ASSERT_TRUE(reporter_.OnStep(first).ok());
  clock_.Advance(absl::Milliseconds(300));
  StepReport second = Step(2);
  second.moe.push_back({0, {2, 2}, 0, 0.0, 0.002});
  ASSERT_TRUE(reporter_.OnStep(second).ok());
  clock_.Advance(absl::Milliseconds(300));
  StepReport third = Step(3);
  third.moe.push_back({0, {1, 3}, 0, 0.0, 0.001});
  ASSERT_TRUE(reporter_.OnStep(third).ok());
  ASSERT_EQ(channel_.reports.size(), 2u);
  const v1::MoeLayerProgress& layer = channel_.reports[1].moe(0);
  EXPECT_EQ(layer.balance(), v1::MOE_BALANCE_BIAS);
  EXPECT_DOUBLE_EQ(layer.bias_spread(), 0.001) << "the latest step's, not the window's largest";
  EXPECT_EQ(layer.tokens(), 8);  // top_k 1: one pick per token
  EXPECT_DOUBLE_EQ(layer.tokens_max_share(), 5.0 / 8.0);
  EXPECT_DOUBLE_EQ(layer.aux_loss(), 0.0);
}

TEST_F(ProgressReporterTest, DenseModelsReportNoMoeRouting) {
  ASSERT_TRUE(reporter_.OnStep(Step(1)).ok());
  ASSERT_TRUE(reporter_.OnStep(Step(100)).ok());
  ASSERT_EQ(channel_.reports.size(), 2u);
  EXPECT_EQ(channel_.reports[0].moe_size(), 0);
  EXPECT_EQ(channel_.reports[1].moe_size(), 0);
}

TEST(FallbackProgressChannelTest, TheCoordinatorAnswersWhenTheRelayCannot) {
  FakeClock clock;  // the calls take no time
  auto relay_owned = std::make_unique<FakeProgressChannel>();
  auto direct_owned = std::make_unique<FakeProgressChannel>();
  FakeProgressChannel* relay = relay_owned.get();
  FakeProgressChannel* direct = direct_owned.get();
  std::unique_ptr<ProgressChannel> channel =
      MakeFallbackProgressChannel(std::move(relay_owned), std::move(direct_owned), &clock);
  v1::ProgressReport report;
  report.set_step(4);

  // The relay answers: the coordinator is not asked.
  relay->next_order = v1::ORDER_DRAIN;
  EXPECT_EQ(channel->Report(report, absl::Seconds(5))->order(), v1::ORDER_DRAIN);
  EXPECT_TRUE(direct->reports.empty());

  // The relay is gone: the coordinator says the attempt ended.
  relay->next_status = absl::UnavailableError("failed to connect to all addresses");
  direct->next_status = absl::FailedPreconditionError("attempt 2 of job j-000003 has ended");
  EXPECT_TRUE(absl::IsFailedPrecondition(channel->Report(report, absl::Seconds(1)).status()));
  ASSERT_EQ(direct->reports.size(), 1u);
  EXPECT_EQ(direct->timeouts[0], absl::Seconds(1));

  // Neither answers: the relay's reason is kept.
  direct->next_status = absl::UnavailableError("the coordinator is down");
  absl::Status both = channel->Report(report, absl::Seconds(1)).status();
  EXPECT_EQ(both.message(), "failed to connect to all addresses");

  // A relay that does not know the attempt: the coordinator does.
  relay->next_status = absl::UnauthenticatedError("no worker of attempt 2 was started here");
  direct->next_status = absl::FailedPreconditionError("attempt 2 of job j-000003 has ended");
  EXPECT_TRUE(absl::IsFailedPrecondition(channel->Report(report, absl::Seconds(1)).status()));
  EXPECT_EQ(direct->reports.size(), 3u);

  // What the relay relays stands: an order, or the coordinator's refusal.
  relay->next_status = absl::NotFoundError("job j-000003 has no attempt 2");
  EXPECT_TRUE(absl::IsNotFound(channel->Report(report, absl::Seconds(1)).status()));
  EXPECT_EQ(direct->reports.size(), 3u);
}

// One deadline for both calls: the coordinator gets what the relay left, and no call when the
// relay used it all.
TEST(FallbackProgressChannelTest, BothCallsShareTheReportsDeadline) {
  FakeClock clock;
  auto relay_owned = std::make_unique<FakeProgressChannel>();
  auto direct_owned = std::make_unique<FakeProgressChannel>();
  FakeProgressChannel* relay = relay_owned.get();
  FakeProgressChannel* direct = direct_owned.get();
  relay->clock = &clock;
  std::unique_ptr<ProgressChannel> channel =
      MakeFallbackProgressChannel(std::move(relay_owned), std::move(direct_owned), &clock);
  v1::ProgressReport report;

  relay->takes = 0.8;  // the relay's own UNAVAILABLE after its answer limit
  relay->next_status = absl::UnavailableError("no answer from the coordinator");
  direct->next_order = v1::ORDER_STOP;
  EXPECT_EQ(channel->Report(report, absl::Seconds(5))->order(), v1::ORDER_STOP);
  ASSERT_EQ(direct->timeouts.size(), 1u);
  EXPECT_EQ(direct->timeouts[0], absl::Seconds(1));

  relay->takes = 1;
  relay->next_status = absl::DeadlineExceededError("Deadline Exceeded");
  EXPECT_TRUE(absl::IsDeadlineExceeded(channel->Report(report, absl::Seconds(1)).status()));
  EXPECT_EQ(direct->timeouts.size(), 1u) << "asked with nothing of the deadline left";
}

}  // namespace
}  // namespace trainyard::worker
