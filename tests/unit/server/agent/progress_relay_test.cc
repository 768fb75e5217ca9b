// ProgressRelay driven by hand with a fake clock: when batches go, what each worker's call is
// answered, what survives a broken stream, and who may report.
#include "server/agent/progress_relay.h"

#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "common/clock.h"
#include "gtest/gtest.h"

namespace trainyard::server::agent {
namespace {

v1::ProgressReport ReportOf(const std::string& job, int attempt, int rank, int64_t step) {
  v1::ProgressReport report;
  report.set_job_id(job);
  report.set_attempt_id(attempt);
  report.set_rank(rank);
  report.set_step(step);
  report.set_total_steps(1000);
  report.set_max_step_ms(10);
  return report;
}

// Collects the answer of one call.
struct Call {
  std::optional<absl::StatusOr<v1::ProgressReply>> answer;
  ProgressRelay::Answer Callback() {
    return [this](absl::StatusOr<v1::ProgressReply> a) {
      ASSERT_FALSE(answer.has_value()) << "answered twice";
      answer = std::move(a);
    };
  }
};

v1::ProgressAnswers AnswersFor(const v1::ProgressBatch& batch, v1::Order order) {
  v1::ProgressAnswers answers;
  answers.set_batch_id(batch.batch_id());
  for (const v1::ProgressReport& r : batch.reports()) {
    v1::ProgressAnswer* a = answers.add_answers();
    a->set_job_id(r.job_id());
    a->set_attempt_id(r.attempt_id());
    a->set_rank(r.rank());
    a->mutable_reply()->set_order(order);
  }
  return answers;
}

class ProgressRelayTest : public ::testing::Test {
 protected:
  ProgressRelayTest() : relay_(&clock_, [this] { ++wakeups_; }) {
    relay_.Admit("job-a", 1, "secret-a1");
    relay_.Admit("job-b", 1, "secret-b1");
    for (int rank = 0; rank < 4; ++rank) relay_.AddRank("job-a", 1, rank);
    relay_.AddRank("job-b", 1, 0);
    relay_.SetConnected(true);
  }
  FakeClock clock_;
  int wakeups_ = 0;
  ProgressRelay relay_;
};

TEST_F(ProgressRelayTest, ABatchGoesOnceEveryRankOfAnAttemptReportedAndEachCallGetsItsAnswer) {
  std::vector<Call> calls(4);
  for (int rank = 0; rank < 3; ++rank) {
    relay_.Report(ReportOf("job-a", 1, rank, 7), "secret-a1", calls[rank].Callback());
  }
  EXPECT_FALSE(relay_.TakeBatch()) << "rank 3 has not reported and nothing waited 20 ms";
  EXPECT_EQ(wakeups_, 0);
  relay_.Report(ReportOf("job-a", 1, 3, 7), "secret-a1", calls[3].Callback());
  EXPECT_EQ(wakeups_, 1) << "the last rank makes the batch due at once";
  std::optional<v1::ProgressBatch> batch = relay_.TakeBatch();
  ASSERT_TRUE(batch);
  EXPECT_EQ(batch->reports_size(), 4);
  for (const Call& call : calls) {
    EXPECT_FALSE(call.answer) << "nobody is answered before the coordinator";
  }
  EXPECT_EQ(relay_.in_flight(), 1);

  v1::ProgressAnswers answers = AnswersFor(*batch, v1::ORDER_CONTINUE);
  answers.mutable_answers(1)->mutable_reply()->set_order(v1::ORDER_CHECKPOINT);
  answers.mutable_answers(1)->mutable_reply()->set_checkpoint_step(20);
  answers.mutable_answers(2)->set_code(static_cast<int>(absl::StatusCode::kFailedPrecondition));
  answers.mutable_answers(2)->set_message("attempt 1 of job job-a has ended");
  relay_.OnAnswers(answers);
  EXPECT_EQ(relay_.in_flight(), 0);
  ASSERT_TRUE(calls[0].answer && calls[0].answer->ok());
  EXPECT_EQ((*calls[0].answer)->order(), v1::ORDER_CONTINUE);
  ASSERT_TRUE(calls[1].answer && calls[1].answer->ok());
  EXPECT_EQ((*calls[1].answer)->order(), v1::ORDER_CHECKPOINT);
  EXPECT_EQ((*calls[1].answer)->checkpoint_step(), 20);
  ASSERT_TRUE(calls[2].answer);
  EXPECT_TRUE(absl::IsFailedPrecondition(calls[2].answer->status()));
  EXPECT_EQ(calls[2].answer->status().message(), "attempt 1 of job job-a has ended");
}

TEST_F(ProgressRelayTest, AReportTheAnswersLeaveOutWasAnsweredContinue) {
  std::vector<Call> calls(4);
  for (int rank = 0; rank < 4; ++rank) {
    relay_.Report(ReportOf("job-a", 1, rank, 7), "secret-a1", calls[rank].Callback());
  }
  std::optional<v1::ProgressBatch> batch = relay_.TakeBatch();
  ASSERT_TRUE(batch);
  EXPECT_TRUE(batch->omit_plain_answers());
  // Only rank 2 has something to say; the others are left out.
  v1::ProgressAnswers answers;
  answers.set_batch_id(batch->batch_id());
  v1::ProgressAnswer* drain = answers.add_answers();
  drain->set_job_id("job-a");
  drain->set_attempt_id(1);
  drain->set_rank(2);
  drain->mutable_reply()->set_order(v1::ORDER_DRAIN);
  relay_.OnAnswers(answers);
  EXPECT_EQ(relay_.in_flight(), 0);
  for (int rank = 0; rank < 4; ++rank) {
    ASSERT_TRUE(calls[rank].answer && calls[rank].answer->ok()) << "rank " << rank;
    EXPECT_EQ((*calls[rank].answer)->order(), rank == 2 ? v1::ORDER_DRAIN : v1::ORDER_CONTINUE);
  }
  // Answers of a batch the relay no longer knows (sent again after a reconnect) imply nothing.
  Call late;
  relay_.Report(ReportOf("job-a", 1, 0, 8), "secret-a1", late.Callback());
  answers.set_batch_id(batch->batch_id());
  answers.clear_answers();
  relay_.OnAnswers(answers);
  EXPECT_FALSE(late.answer);
}

TEST_F(ProgressRelayTest, AReportWaitsAtMostTheWindowAndUrgentOnesGoAtOnce) {
  Call first;
  relay_.Report(ReportOf("job-a", 1, 0, 5), "secret-a1", first.Callback());
  clock_.Advance(absl::Milliseconds(19));
  EXPECT_FALSE(relay_.TakeBatch());
  clock_.Advance(absl::Milliseconds(1));
  std::optional<v1::ProgressBatch> batch = relay_.TakeBatch();
  ASSERT_TRUE(batch);
  EXPECT_EQ(batch->reports_size(), 1);

  // A committed checkpoint, a resume, a validation loss, the last step: at once.
  std::vector<v1::ProgressReport> urgent(4, ReportOf("job-a", 1, 1, 6));
  urgent[0].add_checkpoints()->set_path("/ck/step-6");
  urgent[1].mutable_resumed()->set_step(3);
  urgent[2].set_has_val_loss(true);
  urgent[3].set_step(1000);
  for (const v1::ProgressReport& report : urgent) {
    Call call;
    relay_.Report(report, "secret-a1", call.Callback());
    ASSERT_TRUE(relay_.TakeBatch()) << report.DebugString();
  }
  EXPECT_EQ(wakeups_, 4);
}

TEST_F(ProgressRelayTest, ABrokenStreamAnswersUnavailableAndSendsTheReportsAgainMerged) {
  Call a, b;
  v1::ProgressReport with_checkpoint = ReportOf("job-b", 1, 0, 10);
  with_checkpoint.add_checkpoints()->set_path("/ck/step-10");
  with_checkpoint.set_max_step_ms(80);
  relay_.Report(with_checkpoint, "secret-b1", a.Callback());
  ASSERT_TRUE(relay_.TakeBatch());  // sent, never answered
  relay_.SetConnected(false);
  ASSERT_TRUE(a.answer);
  EXPECT_TRUE(absl::IsUnavailable(a.answer->status()));
  EXPECT_FALSE(relay_.TakeBatch(/*force=*/true)) << "nothing is sent while disconnected";

  // While disconnected the worker reports again (answered at once), resending the checkpoint it
  // was not answered for, with a newer one.
  v1::ProgressReport newer = ReportOf("job-b", 1, 0, 12);
  newer.add_checkpoints()->set_path("/ck/step-10");
  newer.add_checkpoints()->set_path("/ck/step-12");
  relay_.Report(newer, "secret-b1", b.Callback());
  ASSERT_TRUE(b.answer);
  EXPECT_TRUE(absl::IsUnavailable(b.answer->status()));
  EXPECT_EQ(relay_.pending(), 1);

  relay_.SetConnected(true);
  std::optional<v1::ProgressBatch> batch = relay_.TakeBatch();
  ASSERT_TRUE(batch) << "checkpoints make it urgent";
  ASSERT_EQ(batch->reports_size(), 1);
  const v1::ProgressReport& merged = batch->reports(0);
  EXPECT_EQ(merged.step(), 12);
  EXPECT_EQ(merged.max_step_ms(), 80) << "the slowest step of both";
  ASSERT_EQ(merged.checkpoints_size(), 2) << merged.DebugString();
  EXPECT_EQ(merged.checkpoints(0).path(), "/ck/step-10");
  EXPECT_EQ(merged.checkpoints(1).path(), "/ck/step-12");
}

// One MoE layer's window: `picks` over `steps` steps (top_k 1), derived figures left out.
v1::MoeLayerProgress MoeWindow(int layer, std::vector<int64_t> picks, int64_t steps,
                               int64_t dropped, double aux_loss) {
  v1::MoeLayerProgress window;
  window.set_layer(layer);
  window.set_steps(steps);
  int64_t tokens = 0;
  for (int64_t p : picks) {
    window.add_tokens_per_expert(p);
    tokens += p;
  }
  window.set_tokens(tokens);
  window.set_dropped(dropped);
  window.set_aux_loss(aux_loss);
  return window;
}

TEST_F(ProgressRelayTest, MergedReportsAddUpTheirMoeWindows) {
  relay_.SetConnected(false);
  Call a, b;
  v1::ProgressReport older = ReportOf("job-b", 1, 0, 10);
  *older.add_moe() = MoeWindow(1, {6, 0, 2}, 1, 3, 0.4);
  older.mutable_moe(0)->set_dropped_total(3);
  older.mutable_moe(0)->set_z_loss(0.02);
  *older.add_moe() = MoeWindow(3, {2, 2, 4}, 1, 0, 0.1);
  relay_.Report(older, "secret-b1", a.Callback());
  v1::ProgressReport newer = ReportOf("job-b", 1, 0, 13);
  *newer.add_moe() = MoeWindow(1, {6, 0, 10}, 3, 1, 0.2);
  newer.mutable_moe(0)->set_dropped_total(4);
  newer.mutable_moe(0)->set_bias_spread(0.5);
  newer.mutable_moe(0)->set_z_loss(0.01);
  relay_.Report(newer, "secret-b1", b.Callback());
  EXPECT_EQ(relay_.pending(), 1);

  relay_.SetConnected(true);
  std::optional<v1::ProgressBatch> batch = relay_.TakeBatch(/*force=*/true);
  ASSERT_TRUE(batch);
  ASSERT_EQ(batch->reports_size(), 1);
  const v1::ProgressReport& merged = batch->reports(0);
  ASSERT_EQ(merged.moe_size(), 1) << "the newest report's layers";
  const v1::MoeLayerProgress& layer = merged.moe(0);
  EXPECT_EQ(layer.steps(), 4);
  EXPECT_EQ(
      std::vector<int64_t>(layer.tokens_per_expert().begin(), layer.tokens_per_expert().end()),
      (std::vector<int64_t>{12, 0, 12}));
  EXPECT_EQ(layer.tokens(), 24);
  EXPECT_EQ(layer.tokens_min(), 0);
  EXPECT_EQ(layer.tokens_max(), 12);
  EXPECT_DOUBLE_EQ(layer.tokens_max_share(), 0.5);
  EXPECT_NEAR(layer.tokens_cv(), std::sqrt(2.0) / 2.0, 1e-12);  // mean 8, deviations 4, -8, 4
  EXPECT_EQ(layer.dead_experts(), 1) << "expert 1 had no pick in either window";
  EXPECT_EQ(layer.dropped(), 4);
  EXPECT_EQ(layer.dropped_total(), 4) << "the newer's running count";
  EXPECT_DOUBLE_EQ(layer.aux_loss(), (0.4 + 3 * 0.2) / 4);
  EXPECT_DOUBLE_EQ(layer.z_loss(), (0.02 + 3 * 0.01) / 4);
  EXPECT_DOUBLE_EQ(layer.bias_spread(), 0.5);
}

// A phase notice goes at once; one that finds a step's report waiting joins it, and the report
// keeps its figures.
TEST_F(ProgressRelayTest, APhaseNoticeGoesAtOnceAndJoinsAWaitingReport) {
  relay_.SetConnected(false);
  Call a, b;
  v1::ProgressReport step = ReportOf("job-b", 1, 0, 20);
  step.set_loss(2.5);
  relay_.Report(step, "secret-b1", a.Callback());
  v1::ProgressReport notice;
  notice.set_job_id("job-b");
  notice.set_attempt_id(1);
  notice.set_rank(0);
  notice.set_step(20);
  notice.set_phase(v1::ITERATION_PHASE_EVALUATION);
  notice.set_phase_limit_s(600);
  relay_.Report(notice, "secret-b1", b.Callback());
  EXPECT_EQ(relay_.pending(), 1);
  relay_.SetConnected(true);
  std::optional<v1::ProgressBatch> batch = relay_.TakeBatch(/*force=*/false);
  ASSERT_TRUE(batch) << "a phase notice is urgent";
  ASSERT_EQ(batch->reports_size(), 1);
  const v1::ProgressReport& merged = batch->reports(0);
  EXPECT_EQ(merged.total_steps(), 1000);
  EXPECT_DOUBLE_EQ(merged.loss(), 2.5);
  EXPECT_EQ(merged.phase(), v1::ITERATION_PHASE_EVALUATION);
  EXPECT_DOUBLE_EQ(merged.phase_limit_s(), 600);
}

TEST_F(ProgressRelayTest, OnlyTheAttemptsOwnSecretMayReport) {
  Call none, wrong, other, forged;
  relay_.Report(ReportOf("job-a", 1, 0, 1), "", none.Callback());
  relay_.Report(ReportOf("job-a", 1, 0, 1), "secret-b1", other.Callback());
  relay_.Report(ReportOf("job-a", 2, 0, 1), "secret-a1", wrong.Callback());
  relay_.Report(ReportOf("job-a", 1, 0, 1), "secret-a2", forged.Callback());
  ASSERT_TRUE(none.answer && other.answer && wrong.answer && forged.answer);
  EXPECT_TRUE(absl::IsUnauthenticated(none.answer->status()));
  EXPECT_TRUE(absl::IsPermissionDenied(other.answer->status())) << other.answer->status();
  EXPECT_TRUE(absl::IsPermissionDenied(wrong.answer->status())) << wrong.answer->status();
  EXPECT_TRUE(absl::IsUnauthenticated(forged.answer->status()));
  EXPECT_EQ(relay_.pending(), 0) << "refused reports are not kept";
}

TEST_F(ProgressRelayTest, ACallTheCoordinatorDoesNotAnswerIsReleasedAfterTheLimit) {
  Call call;
  relay_.Report(ReportOf("job-b", 1, 0, 1), "secret-b1", call.Callback());
  ASSERT_TRUE(relay_.TakeBatch());
  clock_.Advance(kProgressAnswerLimit + absl::Milliseconds(1));
  EXPECT_FALSE(relay_.TakeBatch());
  ASSERT_TRUE(call.answer);
  EXPECT_TRUE(absl::IsUnavailable(call.answer->status()));
}

TEST_F(ProgressRelayTest, ForceSendsWhateverWaits) {
  Call call;
  relay_.Report(ReportOf("job-a", 1, 2, 1), "secret-a1", call.Callback());
  EXPECT_FALSE(relay_.TakeBatch());
  std::optional<v1::ProgressBatch> batch = relay_.TakeBatch(/*force=*/true);
  ASSERT_TRUE(batch);
  EXPECT_EQ(batch->reports_size(), 1);
}

}  // namespace
}  // namespace trainyard::server::agent
