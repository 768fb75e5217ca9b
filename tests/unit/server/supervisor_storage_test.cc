// The job store failing (a full disk, I/O errors): memory moves on, but no agent is told of a
// change before it is stored. Held-back changes are stored in order once storage works again,
// and only then do their orders go out; a restart after that sees what memory saw.
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/supervisor.h"
#include "tests/unit/server/supervisor_fixture.h"

namespace trainyard::server {
namespace {

using testing::Agent;
using ::testing::Contains;
using testing::SupervisorTest;
using testing::TinySpec;

TEST_F(SupervisorTest, OrdersWaitUntilTheChangeTheyFollowFromIsStored) {
  const std::string id = Submit(TinySpec("disk"));
  faults_->FailEveryCommit(true);
  Agent agent = Connect("node-a", 2);
  EXPECT_EQ(State(id), JobState::kStarting);
  EXPECT_TRUE(agent.channel->TakeOf<StartWorkerOrder>().empty())
      << "workers ordered before their attempt was stored";
  AdvanceWithHeartbeats(absl::Seconds(3), {agent});  // every Tick tries again, in vain
  EXPECT_TRUE(agent.channel->TakeOf<StartWorkerOrder>().empty());
  MetricsSnapshot failing = supervisor_->Metrics();
  EXPECT_GT(failing.store_held_back, 0);
  EXPECT_GE(failing.store_failures_total, 4);
  // A submission now is refused: nothing exists in memory that is not stored.
  SubmitRequest request;
  request.spec_yaml = TinySpec("refused");
  EXPECT_FALSE(supervisor_->Submit(request).ok());

  faults_->FailEveryCommit(false);
  supervisor_->Tick();
  const auto starts = agent.channel->TakeOf<StartWorkerOrder>();
  ASSERT_EQ(starts.size(), 2u);
  EXPECT_EQ(starts[0].job_id, id);
  EXPECT_EQ(supervisor_->Metrics().store_held_back, 0);
  EXPECT_THAT(EventKinds(id), Contains("storage_failed"));
  // Stored: a restarted coordinator knows the attempt the workers were told of.
  Restart();
  const JobView view = View(id);
  EXPECT_EQ(view.job.state, JobState::kStarting);
  EXPECT_EQ(view.attempts.size(), 1u);
}

// "Commit fails at transaction N" over a job's whole life cycle: whichever commit fails, every
// worker is started exactly once, the job succeeds once, and what is stored agrees with memory
// (a job that succeeded in memory never runs again after a restart).
class StorageFailureTest : public SupervisorTest, public ::testing::WithParamInterface<int> {};

TEST_P(StorageFailureTest, TheLifeCycleCompletesAndIsStoredWhicheverCommitFails) {
  faults_->FailCommitNumber(GetParam());
  SubmitRequest request;
  request.spec_yaml = TinySpec("life");
  absl::StatusOr<JobRecord> submitted = supervisor_->Submit(request);
  if (!submitted.ok()) {  // the submission itself was not stored: refused, so submit again
    EXPECT_EQ(GetParam(), 1) << submitted.status();
    EXPECT_TRUE(supervisor_->ListJobs({}, 0).empty()) << "a refused job exists in memory";
    submitted = supervisor_->Submit(request);
  }
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  const std::string id = submitted->id;
  Agent agent = Connect("node-a", 2);
  supervisor_->Tick();
  const auto starts = agent.channel->TakeOf<StartWorkerOrder>();
  ASSERT_EQ(starts.size(), 2u) << "commit " << GetParam();
  const int attempt = starts[0].attempt_id;
  Started(agent, id, attempt, 0);
  Started(agent, id, attempt, 1);
  supervisor_->Tick();
  for (const auto& joined : JoinAll(id, attempt, 2)) ASSERT_TRUE(joined.ok()) << joined.status();
  supervisor_->Tick();
  ProgressUpdate progress;
  progress.job_id = id;
  progress.attempt_id = attempt;
  progress.step = 5;
  progress.total_steps = 5;
  ASSERT_TRUE(supervisor_->ReportProgress(progress).ok());
  Exit(agent, id, attempt, 0, 0);
  Exit(agent, id, attempt, 1, 0);
  supervisor_->Tick();
  EXPECT_EQ(State(id), JobState::kSucceeded);
  EXPECT_TRUE(agent.channel->TakeOf<StartWorkerOrder>().empty()) << "a worker started twice";
  EXPECT_EQ(supervisor_->Metrics().store_held_back, 0);
  EXPECT_EQ(faults_->failed(), 1) << "commit " << GetParam() << " of " << faults_->commits();
  Restart();
  const JobView stored = View(id);
  EXPECT_EQ(stored.job.state, JobState::kSucceeded) << "commit " << GetParam();
  EXPECT_EQ(stored.attempts.size(), 1u);
}

INSTANTIATE_TEST_SUITE_P(CommitNumber, StorageFailureTest,
                         ::testing::Range(1, 15));  // the life cycle makes 14 commits

}  // namespace
}  // namespace trainyard::server
