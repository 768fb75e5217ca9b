// The Supervisor's checkpoint records and drains, driven through its public calls with fake
// agents and a fake clock: records from rank 0's reports (stored once, announced once, observed
// once), the newest committed checkpoint and the resume point of a new attempt, DrainJob from
// the order to the DRAINED state, across a coordinator restart, and its refusals.
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_replace.h"
#include "config/spec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/supervisor.h"
#include "tests/unit/server/supervisor_fixture.h"

namespace trainyard::server {
namespace {

using testing::Agent;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::RecordingWatcher;
using testing::SupervisorTest;
using testing::TinySpec;

// TinySpec (2 ranks on one node) with a checkpoint section; `every` "auto" or a number.
std::string CheckpointedSpec(const std::string& name, const std::string& every = "2",
                             int max_restarts = 1) {
  return TinySpec(name, 1, 2, 0, max_restarts) + "checkpoint: {dir: ckpt/" + name +
         ", every_steps: " + every + ", keep: 2}\n";
}

CheckpointInfo Save(int64_t step, CheckpointState state, const std::string& message = "") {
  CheckpointInfo record;
  record.step = step;
  record.path = "ckpt/run/step-" + std::to_string(step);
  record.state = state;
  record.bytes = state == CheckpointState::kCommitted ? int64_t{3} << 20 : 0;
  record.write_seconds = state == CheckpointState::kCommitted ? 1.5 : 0;
  record.blocked_seconds = 0.25;
  record.message = message;
  record.written = absl::FromUnixSeconds(1'000'000 + step);
  return record;
}

class SupervisorCheckpointTest : public SupervisorTest {
 protected:
  // A running two-rank job of attempt 1 on node-a.
  std::string StartJob(const std::string& spec) {
    const std::string id = Submit(spec);
    agent_ = Connect("node-a", 2);
    agent_.channel->Take();
    Started(agent_, id, 1, 0);
    Started(agent_, id, 1, 1);
    JoinAll(id, 1, 2);
    EXPECT_EQ(State(id), JobState::kRunning);
    return id;
  }

  // A step's report of rank `rank` of `attempt`, carrying `records`.
  absl::StatusOr<OrderReply> Report(const std::string& id, int attempt, int rank, int64_t step,
                                    std::vector<CheckpointInfo> records = {}) {
    ProgressUpdate update = StepUpdate(id, attempt, rank, step);
    update.loss = 3.0;
    update.checkpoints = std::move(records);
    return supervisor_->ReportProgress(update);
  }

  // Rank `rank` of `attempt` restored its state from `from`, of `step`.
  absl::StatusOr<OrderReply> Resumed(const std::string& id, int attempt, int rank, int64_t step,
                                     const std::string& from, bool from_memory = false) {
    ProgressUpdate update = StepUpdate(id, attempt, rank, step);
    update.resumed =
        ProgressUpdate::Resumed{.step = step, .from = from, .from_memory = from_memory};
    return supervisor_->ReportProgress(update);
  }

  static ProgressUpdate StepUpdate(const std::string& id, int attempt, int rank, int64_t step) {
    ProgressUpdate update;
    update.job_id = id;
    update.attempt_id = attempt;
    update.rank = rank;
    update.step = step;
    update.total_steps = 10;
    return update;
  }

  // Attempt `attempt` fails (rank 1 first) and the next one's ranks join.
  std::vector<absl::StatusOr<JoinInfo>> FailAndRejoin(const std::string& id, int attempt) {
    Exit(agent_, id, attempt, 1, 3);
    Exit(agent_, id, attempt, 0, 0, 15);
    EXPECT_EQ(State(id), JobState::kStarting);
    return JoinAll(id, attempt + 1, 2);
  }

  // A termination notice: the rank received SIGTERM.
  absl::StatusOr<OrderReply> Terminated(const std::string& id, int attempt, int rank) {
    ProgressUpdate update;
    update.job_id = id;
    update.attempt_id = attempt;
    update.rank = rank;
    update.terminated = true;
    return supervisor_->ReportProgress(update);
  }

  std::vector<CheckpointInfo> Checkpoints(const std::string& id) {
    auto records = supervisor_->ListCheckpoints(id);
    EXPECT_TRUE(records.ok()) << records.status();
    return records.value_or(std::vector<CheckpointInfo>{});
  }

  std::vector<std::string> CheckpointCauses(const std::string& id) {
    std::vector<std::string> causes;
    for (const EventRecord& e : View(id).events) {
      if (e.kind == "checkpoint") causes.push_back(e.cause);
    }
    return causes;
  }

  const JobMetrics* MetricsOf(const MetricsSnapshot& snapshot, const std::string& id) {
    for (const JobMetrics& job : snapshot.jobs) {
      if (job.job_id == id) return &job;
    }
    ADD_FAILURE() << "no metrics for " << id;
    return nullptr;
  }

  Agent agent_;
};

TEST_F(SupervisorCheckpointTest, CheckpointRecordsAreStoredAndAnnouncedOnceAndSurviveARestart) {
  const std::string id = StartJob(CheckpointedSpec("run"));
  ASSERT_TRUE(Report(id, 1, 0, 2, {Save(2, CheckpointState::kCommitted)}).ok());
  // Re-sent until acknowledged: repeats change nothing.
  ASSERT_TRUE(Report(id, 1, 0, 3, {Save(2, CheckpointState::kCommitted)}).ok());
  ASSERT_TRUE(Report(id, 1, 0, 4, {Save(2, CheckpointState::kCommitted)}).ok());
  EXPECT_THAT(CheckpointCauses(id),
              ElementsAre("checkpoint of step 2 committed at ckpt/run/step-2 (3.0 MiB, written in "
                          "1.50 s, training blocked 0.25 s)"));
  ASSERT_TRUE(Report(id, 1, 0, 5, {Save(4, CheckpointState::kFailed, "disk full\nENOSPC")}).ok());
  EXPECT_EQ(CheckpointCauses(id).back(), "checkpoint of step 4 failed: disk full ENOSPC");

  std::vector<CheckpointInfo> records = Checkpoints(id);
  ASSERT_EQ(records.size(), 2u);
  EXPECT_EQ(records[0].step, 2);
  EXPECT_EQ(records[0].attempt_id, 1);  // filled in from the report
  EXPECT_EQ(records[1].state, CheckpointState::kFailed);
  // The newest committed one is the job's checkpoint, not the later failed one.
  JobView view = View(id);
  EXPECT_EQ(view.job.last_checkpoint.path, "ckpt/run/step-2");
  EXPECT_EQ(view.job.last_checkpoint.bytes, int64_t{3} << 20);

  // The snapshot outlives the pointers into it.
  MetricsSnapshot snapshot = supervisor_->Metrics();
  const JobMetrics* metrics = MetricsOf(snapshot, id);
  ASSERT_NE(metrics, nullptr);
  EXPECT_TRUE(metrics->checkpointing);
  EXPECT_EQ(metrics->checkpoints.write_seconds.count(), 1u);  // the repeats were not observed
  EXPECT_EQ(metrics->checkpoints.blocked_seconds.count(), 2u);
  EXPECT_EQ(metrics->checkpoints.failures, 1);
  EXPECT_EQ(metrics->last_checkpoint.step, 2);

  Restart();
  records = Checkpoints(id);
  ASSERT_EQ(records.size(), 2u);
  EXPECT_EQ(records[0].path, "ckpt/run/step-2");
  EXPECT_EQ(records[0].write_seconds, 1.5);
  EXPECT_EQ(records[1].message, "disk full ENOSPC");
  view = View(id);
  EXPECT_EQ(view.job.last_checkpoint.step, 2);
  EXPECT_EQ(view.job.last_checkpoint.bytes, int64_t{3} << 20);
  // A worker still re-sending after the restart is recognised; nothing is observed again.
  Agent back = Connect("node-a", 2, {RunningWorker{id, 1, 0, 1000}, RunningWorker{id, 1, 1, 1001}});
  ASSERT_TRUE(Report(id, 1, 0, 6, {Save(4, CheckpointState::kFailed, "disk full\nENOSPC")}).ok());
  EXPECT_EQ(CheckpointCauses(id).size(), 2u);
  snapshot = supervisor_->Metrics();
  metrics = MetricsOf(snapshot, id);
  ASSERT_NE(metrics, nullptr);
  EXPECT_EQ(metrics->checkpoints.blocked_seconds.count(), 0u);
  EXPECT_EQ(metrics->checkpoints.failures, 0);
  EXPECT_EQ(metrics->last_checkpoint.bytes, int64_t{3} << 20);
}

TEST_F(SupervisorCheckpointTest, NewAttemptResumesFromTheNewestCommittedCheckpoint) {
  const std::string id = StartJob(CheckpointedSpec("resume"));
  // Out of order and mixed: 4 committed, then a late 2, then 6 failed.
  ASSERT_TRUE(Report(id, 1, 0, 5,
                     {Save(4, CheckpointState::kCommitted), Save(2, CheckpointState::kCommitted),
                      Save(6, CheckpointState::kFailed, "out of space")})
                  .ok());
  // Rank 1 does not speak for the job.
  ASSERT_TRUE(Report(id, 1, 1, 7, {Save(8, CheckpointState::kCommitted)}).ok());
  EXPECT_EQ(Checkpoints(id).size(), 3u);
  Exit(agent_, id, 1, 1, 3);
  Exit(agent_, id, 1, 0, 0, 15);
  ASSERT_EQ(State(id), JobState::kStarting);
  auto joins = JoinAll(id, 2, 2);
  ASSERT_TRUE(joins[0].ok()) << joins[0].status();
  EXPECT_EQ(joins[0]->resume_from.step, 4);
  EXPECT_EQ(joins[0]->resume_from.path, "ckpt/run/step-4");
  EXPECT_EQ(joins[0]->resume_from.bytes, int64_t{3} << 20);
  EXPECT_EQ(joins[0]->resume_from.attempt_id, 1);
  EXPECT_EQ(joins[1]->resume_from.path, "ckpt/run/step-4");
  // The same path re-written by the new attempt is news, not a repeat.
  CheckpointInfo rewritten = Save(6, CheckpointState::kCommitted);
  ASSERT_TRUE(Report(id, 2, 0, 6, {rewritten}).ok());
  EXPECT_EQ(View(id).job.last_checkpoint.step, 6);
  EXPECT_EQ(View(id).job.last_checkpoint.attempt_id, 2);
  EXPECT_EQ(Checkpoints(id).size(), 3u);  // one record per path
}

// Attempt 1 committed step 4 but its report never arrived (the node died right after the
// commit); attempt 2 found the checkpoint itself. Its "resumed" report makes it the job's
// checkpoint, without a ledger record: nothing about the save was measured.
TEST_F(SupervisorCheckpointTest, ACheckpointAnAttemptResumedFromIsTheJobsCheckpoint) {
  const std::string id = StartJob(CheckpointedSpec("unreported"));
  ASSERT_TRUE(Report(id, 1, 0, 3, {Save(2, CheckpointState::kCommitted)}).ok());
  auto joins = FailAndRejoin(id, 1);
  ASSERT_TRUE(joins[0].ok()) << joins[0].status();
  EXPECT_EQ(joins[0]->resume_from.step, 2);
  // Rank 1 does not speak for the job.
  ASSERT_TRUE(Resumed(id, 2, 1, 4, "ckpt/run/step-4").ok());
  EXPECT_EQ(View(id).job.last_checkpoint.step, 2);
  ASSERT_TRUE(Resumed(id, 2, 0, 4, "ckpt/run/step-4").ok());
  JobView view = View(id);
  EXPECT_EQ(view.job.last_checkpoint.step, 4);
  EXPECT_EQ(view.job.last_checkpoint.path, "ckpt/run/step-4");
  EXPECT_EQ(view.job.last_checkpoint.written, absl::InfinitePast());  // unknown
  EXPECT_THAT(CheckpointCauses(id).back(),
              HasSubstr("checkpoint of step 4 at ckpt/run/step-4, which no save report named"));
  EXPECT_EQ(Checkpoints(id).size(), 1u);  // the ledger holds what was reported
  MetricsSnapshot snapshot = supervisor_->Metrics();
  const JobMetrics* metrics = MetricsOf(snapshot, id);
  ASSERT_NE(metrics, nullptr);
  EXPECT_EQ(metrics->checkpoints.write_seconds.count(), 1u);
  // Stored, so the next attempt resumes from it even after a restart of the coordinator.
  Restart();
  EXPECT_EQ(View(id).job.last_checkpoint.step, 4);
  EXPECT_EQ(View(id).job.last_checkpoint.path, "ckpt/run/step-4");
  // A later save that is reported is the checkpoint again, with its measured costs.
  Agent back = Connect("node-a", 2, {RunningWorker{id, 2, 0, 1000}, RunningWorker{id, 2, 1, 1001}});
  ASSERT_TRUE(Report(id, 2, 0, 6, {Save(6, CheckpointState::kCommitted)}).ok());
  EXPECT_EQ(View(id).job.last_checkpoint.step, 6);
  EXPECT_EQ(View(id).job.last_checkpoint.bytes, int64_t{3} << 20);
}

// Resuming from the memory tier, or from an older checkpoint than the recorded one, leaves the
// job's checkpoint as it is.
TEST_F(SupervisorCheckpointTest, AResumeFromMemoryOrAnOlderCheckpointChangesNothing) {
  const std::string id = StartJob(CheckpointedSpec("older", "2", 3));
  ASSERT_TRUE(Report(id, 1, 0, 5, {Save(4, CheckpointState::kCommitted)}).ok());
  FailAndRejoin(id, 1);
  ASSERT_TRUE(Resumed(id, 2, 0, 5, "rank snapshots", /*from_memory=*/true).ok());
  EXPECT_EQ(View(id).job.last_checkpoint.step, 4);
  FailAndRejoin(id, 2);
  ASSERT_TRUE(Resumed(id, 3, 0, 2, "ckpt/run/step-2").ok());
  EXPECT_EQ(View(id).job.last_checkpoint.path, "ckpt/run/step-4");
  EXPECT_EQ(CheckpointCauses(id).size(), 1u);
}

TEST_F(SupervisorCheckpointTest, InvalidCheckpointRecordsAreDroppedAndProgressGoesOn) {
  const std::string id = StartJob(CheckpointedSpec("bad"));
  CheckpointInfo no_path = Save(2, CheckpointState::kCommitted);
  no_path.path.clear();
  CheckpointInfo no_state = Save(3, CheckpointState::kCommitted);
  no_state.state = static_cast<CheckpointState>(0);
  CheckpointInfo negative = Save(4, CheckpointState::kCommitted);
  negative.write_seconds = -1;
  auto order = Report(id, 1, 0, 5, {no_path, no_state, negative});
  ASSERT_TRUE(order.ok()) << order.status();
  EXPECT_EQ(order->order, WorkerOrder::kContinue);
  EXPECT_TRUE(Checkpoints(id).empty());
  StoreProgress();
  EXPECT_EQ(View(id).job.progress.step, 5);
  EXPECT_TRUE(View(id).job.last_checkpoint.path.empty());
}

// The ranks save at the ordered step, and their report of the save comes when it commits: a report
// from past the ordered step that does not carry the save yet must not bring the next order
// closer than min_every_steps to it.
TEST_F(SupervisorCheckpointTest, OrdersKeepTheirIntervalFromASaveNotYetReported) {
  const std::string id = StartJob(TinySpec("young", 1, 2, 0, 1) +
                                  "checkpoint: {dir: ckpt/young, every_steps: auto, "
                                  "min_every_steps: 5, keep: 2}\n");
  auto report = [&](int64_t step) {
    ProgressUpdate update;
    update.job_id = id;
    update.attempt_id = 1;
    update.rank = 0;
    update.step = step;
    update.total_steps = 1000;
    update.loss = 3.0;
    update.step_times.total_ms = 100;
    return supervisor_->ReportProgress(update);
  };
  auto first = report(1);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_EQ(first->order, WorkerOrder::kCheckpoint);
  const int64_t ordered = first->checkpoint_step;
  auto next = report(ordered);  // the save is taken, its record still on the way
  ASSERT_TRUE(next.ok()) << next.status();
  ASSERT_EQ(next->order, WorkerOrder::kCheckpoint);
  EXPECT_GE(next->checkpoint_step - ordered, 5) << "ordered " << ordered;
}

TEST_F(SupervisorCheckpointTest, CheckpointSettingsComeFromTheSpec) {
  const std::string every = Submit(CheckpointedSpec("every", "250"));
  const std::string automatic = Submit(CheckpointedSpec("automatic", "auto"));
  const std::string none = Submit(TinySpec("none"));
  Restart();
  const CheckpointSettings fixed = View(every).job.requirements.checkpoint;
  EXPECT_EQ(fixed.dir, "ckpt/every");
  EXPECT_EQ(fixed.every_steps, 250);
  EXPECT_FALSE(fixed.interval_auto);
  EXPECT_EQ(fixed.keep, 2);
  const CheckpointSettings aut = View(automatic).job.requirements.checkpoint;
  EXPECT_EQ(aut.every_steps, 100);  // what the workers use for auto
  EXPECT_TRUE(aut.interval_auto);
  EXPECT_FALSE(View(none).job.requirements.checkpoint.enabled());
}

TEST_F(SupervisorCheckpointTest, PolicyOfAJobStoredBeforeItWasRecordedIsDerivedFromItsSpec) {
  JobRecord old;
  old.seq = 41;
  old.id = JobIdForSeq(41);
  old.name = "old";
  old.spec_yaml = CheckpointedSpec("old", "7");
  old.state = JobState::kSucceeded;
  old.requirements.checkpoint.recorded = false;
  StoreBatch batch;
  batch.new_jobs.push_back(&old);
  ASSERT_TRUE(store_->Commit(batch).ok());
  Restart();
  const CheckpointSettings policy = View(old.id).job.requirements.checkpoint;
  EXPECT_EQ(policy.dir, "ckpt/old");
  EXPECT_EQ(policy.every_steps, 7);
}

// A build that did not refuse fields without effect yet stored this spec. Read back after an
// upgrade, the field is ignored, and the job's policy still comes from its spec.
TEST_F(SupervisorCheckpointTest, AStoredFieldWithoutEffectDoesNotLoseThePolicy) {
  JobRecord old;
  old.seq = 42;
  old.id = JobIdForSeq(42);
  old.name = "old";
  old.spec_yaml =
      absl::StrReplaceAll(CheckpointedSpec("old", "7"),
                          {{"seq_len: 16}", "seq_len: 16, eval_every: 0, eval_batches: 2}"}});
  ASSERT_FALSE(config::ParseJobSpec(old.spec_yaml).ok());  // refused if submitted today
  old.state = JobState::kSucceeded;
  old.requirements.checkpoint.recorded = false;
  StoreBatch batch;
  batch.new_jobs.push_back(&old);
  ASSERT_TRUE(store_->Commit(batch).ok());
  Restart();
  const CheckpointSettings policy = View(old.id).job.requirements.checkpoint;
  EXPECT_EQ(policy.dir, "ckpt/old");
  EXPECT_EQ(policy.every_steps, 7);
}

TEST_F(SupervisorCheckpointTest, DrainOrdersEveryRankAndEndsDrainedAtTheCheckpoint) {
  const std::string id = StartJob(CheckpointedSpec("drained"));
  auto watcher = std::make_shared<RecordingWatcher>();
  ASSERT_TRUE(supervisor_->Watch(id, watcher).ok());
  ASSERT_EQ(Report(id, 1, 0, 3)->order, WorkerOrder::kContinue);
  auto drained = supervisor_->Drain(id, "maintenance at noon");
  ASSERT_TRUE(drained.ok()) << drained.status();
  EXPECT_TRUE(drained->drain_requested);
  EXPECT_EQ(drained->state, JobState::kRunning);
  EXPECT_EQ(View(id).events.back().kind, "drain_requested");
  EXPECT_THAT(View(id).events.back().cause, HasSubstr("maintenance at noon"));
  EXPECT_TRUE(agent_.channel->TakeOf<StopWorkersOrder>().empty());  // no one is killed
  EXPECT_EQ(Report(id, 1, 0, 4)->order, WorkerOrder::kDrain);
  EXPECT_EQ(Report(id, 1, 1, 4)->order, WorkerOrder::kDrain);
  EXPECT_EQ(Report(id, 1, 1, 5)->order, WorkerOrder::kDrain);  // repeated: a lost reply is fine
  EXPECT_TRUE(supervisor_->Drain(id, "").ok());                // draining again: no-op
  ASSERT_EQ(Report(id, 1, 0, 5, {Save(5, CheckpointState::kCommitted)})->order,
            WorkerOrder::kDrain);
  Exit(agent_, id, 1, 1, 0);
  EXPECT_EQ(State(id), JobState::kRunning);
  Exit(agent_, id, 1, 0, 0);
  JobView view = View(id);
  EXPECT_EQ(view.job.state, JobState::kDrained);
  EXPECT_EQ(view.job.message, "drained at step 5: checkpoint ckpt/run/step-5");
  EXPECT_EQ(view.attempts[0].state, AttemptState::kSucceeded);
  EXPECT_NE(view.job.finished, absl::InfinitePast());
  EXPECT_EQ(view.events.back().kind, "drained");
  EXPECT_EQ(watcher->states.back(), JobState::kDrained);
  EXPECT_EQ(watcher->events.back(), "drained");
  EXPECT_EQ(supervisor_->Metrics().jobs_by_state[JobState::kDrained], 1);
  EXPECT_EQ(registry_->FreeNodes()[0].free_cpu_slots.size(), 2u);
  // Final: further drains are a no-op, cancels are refused, the job never starts again.
  EXPECT_TRUE(supervisor_->Drain(id, "").ok());
  EXPECT_EQ(supervisor_->Cancel(id, "").status().code(), absl::StatusCode::kFailedPrecondition);
  Restart();
  EXPECT_EQ(State(id), JobState::kDrained);
}

// SIGTERM from outside the control plane (a batch system ending the job) drains the job; the
// notice is no progress report: the job's progress stays rank 0's last.
TEST_F(SupervisorCheckpointTest, ARanksSigtermDrainsTheJob) {
  const std::string id = StartJob(CheckpointedSpec("signalled"));
  ASSERT_EQ(Report(id, 1, 0, 3)->order, WorkerOrder::kContinue);
  ASSERT_EQ(Terminated(id, 1, 1)->order, WorkerOrder::kDrain);
  JobView view = View(id);
  EXPECT_TRUE(view.job.drain_requested);
  EXPECT_EQ(view.job.progress.step, 3);
  EXPECT_EQ(view.events.back().kind, "drain_requested");
  EXPECT_THAT(view.events.back().cause, HasSubstr("rank 1 of attempt 1 received SIGTERM"));
  EXPECT_TRUE(agent_.channel->TakeOf<StopWorkersOrder>().empty());  // no one is killed
  // Every rank gets the signal: one event, the same answer.
  ASSERT_EQ(Terminated(id, 1, 0)->order, WorkerOrder::kDrain);
  EXPECT_EQ(View(id).events.size(), view.events.size());
  EXPECT_EQ(Report(id, 1, 0, 4)->order, WorkerOrder::kDrain);
  ASSERT_TRUE(Report(id, 1, 0, 4, {Save(4, CheckpointState::kCommitted)}).ok());
  Exit(agent_, id, 1, 0, 0);
  Exit(agent_, id, 1, 1, 0);
  EXPECT_EQ(State(id), JobState::kDrained);
  EXPECT_EQ(View(id).job.message, "drained at step 4: checkpoint ckpt/run/step-4");
}

// The coordinator's own stop sends SIGTERM too: a rank of a job being cancelled, or of an attempt
// being stopped, is told to exit, and nothing is drained.
TEST_F(SupervisorCheckpointTest, ASigtermOfACancelMeansExit) {
  const std::string cancelled = StartJob(CheckpointedSpec("cancelled"));
  ASSERT_TRUE(supervisor_->Cancel(cancelled, "").ok());
  EXPECT_EQ(Terminated(cancelled, 1, 0)->order, WorkerOrder::kStop);
  EXPECT_FALSE(View(cancelled).job.drain_requested);
}

TEST_F(SupervisorCheckpointTest, ASigtermOfAStoppingAttemptMeansExit) {
  const std::string failing = StartJob(CheckpointedSpec("failing", "2", /*max_restarts=*/2));
  Exit(agent_, failing, 1, 1, 3);  // the attempt stops; rank 0 gets SIGTERM from its agent
  EXPECT_EQ(Terminated(failing, 1, 0)->order, WorkerOrder::kStop);
  EXPECT_FALSE(View(failing).job.drain_requested);
  EXPECT_EQ(Terminated(failing, 9, 0).status().code(), absl::StatusCode::kNotFound);
}

// A rank whose exit the coordinator has recorded, still seen running (a stray it stops), is told
// to exit; its attempt goes on.
TEST_F(SupervisorCheckpointTest, ASigtermOfARankThatExitedAlreadyMeansExit) {
  const std::string id = StartJob(CheckpointedSpec("stray"));
  Exit(agent_, id, 1, 1, 0);
  EXPECT_EQ(Terminated(id, 1, 1)->order, WorkerOrder::kStop);
  EXPECT_FALSE(View(id).job.drain_requested);
  EXPECT_EQ(State(id), JobState::kRunning);
}

// A coordinator that drains before it stops holds the queue: the slots drained jobs free go to
// nobody.
TEST_F(SupervisorCheckpointTest, AHeldQueueStartsNoJob) {
  const std::string running = StartJob(CheckpointedSpec("running"));
  const std::string queued = Submit(CheckpointedSpec("queued"));
  EXPECT_EQ(State(queued), JobState::kQueued);
  supervisor_->HoldQueue();
  ASSERT_TRUE(supervisor_->Drain(running, "").ok());
  Exit(agent_, running, 1, 0, 0);
  Exit(agent_, running, 1, 1, 0);
  EXPECT_EQ(State(running), JobState::kDrained);
  supervisor_->Tick();
  EXPECT_EQ(State(queued), JobState::kQueued);
  EXPECT_TRUE(agent_.channel->TakeOf<StartWorkerOrder>().empty());
}

TEST_F(SupervisorCheckpointTest, DrainSurvivesACoordinatorRestart) {
  const std::string id = StartJob(CheckpointedSpec("durable"));
  ASSERT_TRUE(supervisor_->Drain(id, "").ok());
  Restart();
  EXPECT_TRUE(View(id).job.drain_requested);
  Agent back = Connect("node-a", 2, {RunningWorker{id, 1, 0, 1000}, RunningWorker{id, 1, 1, 1001}});
  EXPECT_EQ(Report(id, 1, 0, 4)->order, WorkerOrder::kDrain);
  EXPECT_EQ(Report(id, 1, 1, 4)->order, WorkerOrder::kDrain);
  ASSERT_TRUE(Report(id, 1, 0, 4, {Save(4, CheckpointState::kCommitted)}).ok());
  Exit(back, id, 1, 0, 0);
  Exit(back, id, 1, 1, 0);
  EXPECT_EQ(State(id), JobState::kDrained);
  EXPECT_EQ(View(id).job.message, "drained at step 4: checkpoint ckpt/run/step-4");
}

TEST_F(SupervisorCheckpointTest, RankFailureWhileDrainingFailsTheJobWithoutARestart) {
  const std::string id = StartJob(CheckpointedSpec("fragile", "2", /*max_restarts=*/2));
  ASSERT_TRUE(supervisor_->Drain(id, "").ok());
  Exit(agent_, id, 1, 1, 3);
  EXPECT_EQ(Report(id, 1, 0, 4)->order, WorkerOrder::kStop);
  auto stops = agent_.channel->TakeOf<StopWorkersOrder>();
  ASSERT_EQ(stops.size(), 1u);
  EXPECT_EQ(stops[0].ranks, std::vector<int>{0});
  Exit(agent_, id, 1, 0, 0, 15);
  JobView view = View(id);
  EXPECT_EQ(view.job.state, JobState::kFailed);
  EXPECT_EQ(view.job.attempts, 1);
  EXPECT_EQ(view.job.restarts, 0);
  EXPECT_THAT(view.job.message, HasSubstr("rank 1 on node-a"));
  EXPECT_TRUE(agent_.channel->TakeOf<StartWorkerOrder>().empty());
  EXPECT_THAT(EventKinds(id), ElementsAre("submitted", "scheduled", "running", "drain_requested",
                                          "collective_timeout", "failed"));
}

TEST_F(SupervisorCheckpointTest, DrainOfARestartingJobEndsDrainedOnceItsWorkersAreGone) {
  const std::string id = StartJob(CheckpointedSpec("restarting"));
  ASSERT_TRUE(Report(id, 1, 0, 2, {Save(2, CheckpointState::kCommitted)}).ok());
  Exit(agent_, id, 1, 1, 3);
  ASSERT_EQ(State(id), JobState::kRestarting);
  ASSERT_TRUE(supervisor_->Drain(id, "").ok());
  EXPECT_EQ(State(id), JobState::kRestarting);  // rank 0 is still being stopped
  agent_.channel->Take();
  Exit(agent_, id, 1, 0, 0, 15);
  JobView view = View(id);
  EXPECT_EQ(view.job.state, JobState::kDrained);
  EXPECT_EQ(view.job.message, "drained at step 2: checkpoint ckpt/run/step-2");
  EXPECT_EQ(view.job.attempts, 1);  // the restart never came
  EXPECT_TRUE(agent_.channel->TakeOf<StartWorkerOrder>().empty());
}

TEST_F(SupervisorCheckpointTest, DrainOfAQueuedJobIsImmediateAndBadRequestsAreRefused) {
  EXPECT_EQ(supervisor_->Drain("j-999999", "").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(supervisor_->ListCheckpoints("j-999999").status().code(), absl::StatusCode::kNotFound);

  const std::string queued = Submit(TinySpec("queued"));
  auto drained = supervisor_->Drain(queued, "");
  ASSERT_TRUE(drained.ok()) << drained.status();
  EXPECT_EQ(drained->state, JobState::kDrained);
  EXPECT_EQ(drained->message, "drained without a checkpoint");
  const std::string queued_checkpointed = Submit(CheckpointedSpec("queued2"));
  ASSERT_TRUE(supervisor_->Drain(queued_checkpointed, "").ok());
  EXPECT_EQ(View(queued_checkpointed).job.message, "drained before any checkpoint was committed");
  // Their slots are never taken.
  Agent agent = Connect("node-a", 2);
  EXPECT_TRUE(agent.channel->TakeOf<StartWorkerOrder>().empty());

  const std::string done = Submit(TinySpec("done"));
  JoinAll(done, 1, 2);
  Exit(agent, done, 1, 0, 0);
  Exit(agent, done, 1, 1, 0);
  ASSERT_EQ(State(done), JobState::kSucceeded);
  auto refused = supervisor_->Drain(done, "");
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("already SUCCEEDED"));

  const std::string cancelling = Submit(TinySpec("cancelling"));
  JoinAll(cancelling, 1, 2);
  ASSERT_TRUE(supervisor_->Cancel(cancelling, "").ok());
  EXPECT_EQ(supervisor_->Drain(cancelling, "").status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(View(cancelling).job.drain_requested);
}

TEST_F(SupervisorCheckpointTest, CancelWinsOverADrain) {
  const std::string id = StartJob(CheckpointedSpec("both"));
  ASSERT_TRUE(supervisor_->Drain(id, "").ok());
  ASSERT_TRUE(supervisor_->Cancel(id, "changed my mind").ok());
  EXPECT_EQ(Report(id, 1, 0, 3)->order, WorkerOrder::kStop);
  Exit(agent_, id, 1, 0, 0, 15);
  Exit(agent_, id, 1, 1, 0, 15);
  EXPECT_EQ(State(id), JobState::kCancelled);
}

}  // namespace
}  // namespace trainyard::server
