// The job store failing (a full disk, I/O errors): memory moves on, but no agent is told of a
// change before it is stored. Held-back changes are stored in order once storage works again,
// and only then do their orders go out; a restart after that sees what memory saw.
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
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
  EXPECT_EQ(State(id), JobState::kQueued) << "status shows a placement that is not stored";
  EXPECT_THAT(View(id).job.waiting, ::testing::HasSubstr("cannot store this job's latest changes"));
  EXPECT_TRUE(View(id).attempts.empty());
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

// Status, list, watch and metrics show only what is stored: a job that succeeds while the disk is
// full stays RUNNING for every reader (a restart would find it so) until SUCCEEDED is stored.
TEST_F(SupervisorTest, ReadersSeeOnlyStoredStateWhileTheStoreFails) {
  const std::string id = Submit(TinySpec("full-disk"));
  Agent agent = Connect("node-a", 2);
  supervisor_->Tick();
  const auto starts = agent.channel->TakeOf<StartWorkerOrder>();
  ASSERT_EQ(starts.size(), 2u);
  const int attempt = starts[0].attempt_id;
  Started(agent, id, attempt, 0);
  Started(agent, id, attempt, 1);
  for (const auto& joined : JoinAll(id, attempt, 2)) ASSERT_TRUE(joined.ok()) << joined.status();
  supervisor_->Tick();
  ASSERT_EQ(State(id), JobState::kRunning);
  auto watcher = std::make_shared<testing::RecordingWatcher>();
  ASSERT_TRUE(supervisor_->Watch(id, watcher).ok());
  ProgressUpdate progress;
  progress.job_id = id;
  progress.attempt_id = attempt;
  progress.step = 7;
  progress.total_steps = 7;
  ASSERT_TRUE(supervisor_->ReportProgress(progress).ok());
  EXPECT_EQ(View(id).job.progress.step, 0) << "progress shown before it is stored";
  clock_.Advance(absl::Seconds(2));
  supervisor_->Tick();  // the progress write
  EXPECT_EQ(View(id).job.progress.step, 7);
  ASSERT_FALSE(watcher->states.empty());

  faults_->FailEveryCommit(true);
  Exit(agent, id, attempt, 0, 0);
  Exit(agent, id, attempt, 1, 0);
  AdvanceWithHeartbeats(absl::Seconds(2), {agent});
  const JobView view = View(id);
  EXPECT_EQ(view.job.state, JobState::kRunning);
  EXPECT_THAT(view.job.waiting, ::testing::HasSubstr("database or disk is full"));
  ASSERT_EQ(view.attempts.size(), 1u);
  EXPECT_EQ(view.attempts[0].state, AttemptState::kRunning);
  EXPECT_FALSE(view.attempts[0].ranks[0].exit.has_value());
  const std::vector<JobRecord> listed = supervisor_->ListJobs({JobState::kSucceeded}, 0);
  EXPECT_TRUE(listed.empty()) << "listed SUCCEEDED before it was stored";
  ASSERT_EQ(supervisor_->ListJobs({}, 0).size(), 1u);
  EXPECT_EQ(supervisor_->ListJobs({}, 0)[0].state, JobState::kRunning);
  MetricsSnapshot metrics = supervisor_->Metrics();
  EXPECT_EQ(metrics.jobs_by_state[JobState::kSucceeded], 0);
  EXPECT_EQ(metrics.jobs_by_state[JobState::kRunning], 1);
  ASSERT_EQ(metrics.jobs.size(), 1u);
  EXPECT_EQ(metrics.jobs[0].state, JobState::kRunning);
  auto late = std::make_shared<testing::RecordingWatcher>();
  ASSERT_TRUE(supervisor_->Watch(id, late).ok());
  EXPECT_THAT(late->states, ::testing::ElementsAre(JobState::kRunning));
  EXPECT_THAT(watcher->states, ::testing::Not(Contains(JobState::kSucceeded)));

  faults_->FailEveryCommit(false);
  supervisor_->Tick();
  EXPECT_EQ(State(id), JobState::kSucceeded);
  EXPECT_EQ(supervisor_->ListJobs({JobState::kSucceeded}, 0).size(), 1u);
  EXPECT_EQ(supervisor_->Metrics().jobs_by_state[JobState::kSucceeded], 1);
  EXPECT_THAT(watcher->states, Contains(JobState::kSucceeded));
  EXPECT_TRUE(View(id).job.waiting.empty());
}

// Group commit: while one change is being stored (a slow disk), the supervisor's lock is free —
// readers and changes that store nothing answer at once — and the changes that arrive meanwhile
// are stored together in the next transaction, each caller answered once its own is stored.
TEST_F(SupervisorTest, ChangesArrivingDuringAStoreShareTheNextTransaction) {
  faults_->Pause();
  std::vector<std::thread> submitters;
  std::vector<std::string> ids(5);
  submitters.emplace_back([&] { ids[0] = Submit(TinySpec("first")); });
  faults_->AwaitBlocked(1);  // the first submission is in the store, the lock released
  const int commits_before = faults_->commits();
  // Not held up by the store in progress: a read, and a heartbeat of an unknown node.
  EXPECT_TRUE(supervisor_->ListJobs({}, 0).empty()) << "a job not yet stored is listed";
  EXPECT_FALSE(supervisor_->Heartbeat("nobody", 1, {}).ok());
  for (int i = 1; i < 5; ++i) {
    submitters.emplace_back([&, i] { ids[i] = Submit(TinySpec(absl::StrCat("next", i))); });
  }
  // The four queue behind the store in progress; none starts a transaction of its own.
  while (supervisor_->Metrics().store_queued < 5) absl::SleepFor(absl::Milliseconds(1));
  EXPECT_EQ(faults_->commits(), commits_before);
  faults_->Resume();
  for (std::thread& t : submitters) t.join();
  for (const std::string& id : ids) EXPECT_FALSE(id.empty());
  const std::vector<size_t> per_commit = faults_->new_jobs_per_commit();
  ASSERT_GE(per_commit.size(), 2u);
  EXPECT_EQ(per_commit[0], 1u);
  EXPECT_EQ(per_commit[1], 4u) << "the four submissions that waited were not stored together";
  // Stored as answered: a restart finds all five.
  Restart();
  EXPECT_EQ(supervisor_->ListJobs({}, 0).size(), 5u);
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
                         ::testing::Range(1, 6));  // the life cycle stores 5 changes

}  // namespace
}  // namespace trainyard::server
