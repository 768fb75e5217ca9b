// The Supervisor's test fixture: a store in a scratch directory, a fake clock, fake agents
// (RecordingChannel) and helpers that play the agents and the workers.
#ifndef TRAINYARD_TESTS_UNIT_SERVER_SUPERVISOR_FIXTURE_H_
#define TRAINYARD_TESTS_UNIT_SERVER_SUPERVISOR_FIXTURE_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "gtest/gtest.h"
#include "server/supervisor.h"
#include "tests/unit/server/server_test_util.h"

namespace trainyard::server::testing {

struct Agent {
  std::shared_ptr<RecordingChannel> channel;
  uint64_t session = 0;
  std::string node_id;
};

class RecordingWatcher : public JobWatcher {
 public:
  void OnUpdate(const JobRecord& job, const EventRecord* event) override {
    states.push_back(job.state);
    if (event != nullptr) events.push_back(event->kind);
  }
  void OnClose(const absl::Status& status) override { closed = status; }
  std::vector<JobState> states;
  std::vector<std::string> events;
  std::optional<absl::Status> closed;
};

// A StateStore that passes everything to a real one, except the commits it is told to fail (as a
// full disk does): "commit fails at transaction N".
class FaultInjectingStore final : public StateStore {
 public:
  explicit FaultInjectingStore(StateStore* inner) : inner_(inner) {}

  // The n-th Commit from now (1: the next one) fails; 0: none.
  void FailCommitNumber(int n) {
    absl::MutexLock lock(&mu_);
    fail_at_ = n > 0 ? commits_ + n : 0;
  }
  // Every Commit fails until this is called with false.
  void FailEveryCommit(bool fail) {
    absl::MutexLock lock(&mu_);
    fail_all_ = fail;
  }
  int commits() const {
    absl::MutexLock lock(&mu_);
    return commits_;
  }
  int failed() const {
    absl::MutexLock lock(&mu_);
    return failed_;
  }
  // A slow disk: while paused, Commit blocks (having counted itself) until Resume().
  void Pause() {
    absl::MutexLock lock(&mu_);
    paused_ = true;
  }
  void Resume() {
    absl::MutexLock lock(&mu_);
    paused_ = false;
  }
  // Blocks until `n` commits are blocked in the pause.
  void AwaitBlocked(int n) {
    absl::MutexLock lock(&mu_);
    want_blocked_ = n;
    mu_.Await(absl::Condition(this, &FaultInjectingStore::EnoughBlocked));
  }
  // The number of new jobs each commit stored, in order.
  std::vector<size_t> new_jobs_per_commit() const {
    absl::MutexLock lock(&mu_);
    return new_jobs_per_commit_;
  }

  absl::Status Commit(StoreBatch& batch) override {
    {
      absl::MutexLock lock(&mu_);
      ++commits_;
      if (fail_all_ || commits_ == fail_at_) {
        ++failed_;
        return absl::InternalError("database or disk is full");
      }
      ++blocked_;
      mu_.Await(absl::Condition(this, &FaultInjectingStore::Running));
      --blocked_;
      new_jobs_per_commit_.push_back(batch.new_jobs.size());
    }
    return inner_->Commit(batch);
  }
  absl::Status CommitSoftState(const SoftStateBatch& batch) override {
    {
      absl::MutexLock lock(&mu_);
      if (fail_all_) return absl::InternalError("database or disk is full");
    }
    return inner_->CommitSoftState(batch);
  }
  absl::StatusOr<StoredState> Load() override { return inner_->Load(); }
  absl::StatusOr<std::vector<EventRecord>> ListEvents(const std::string& job_id,
                                                      int limit) override {
    return inner_->ListEvents(job_id, limit);
  }
  absl::StatusOr<std::optional<std::string>> FindJobByClientRequestId(
      const std::string& key) override {
    return inner_->FindJobByClientRequestId(key);
  }

 private:
  bool EnoughBlocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return blocked_ >= want_blocked_;
  }
  bool Running() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !paused_; }

  StateStore* const inner_;
  mutable absl::Mutex mu_;
  int commits_ = 0, failed_ = 0, fail_at_ = 0, blocked_ = 0, want_blocked_ = 0;
  bool fail_all_ = false, paused_ = false;
  std::vector<size_t> new_jobs_per_commit_;
};

class SupervisorTest : public ::testing::Test {
 protected:
  void SetUp() override { Open(); }

  void Open() {
    auto store = JobStore::Open(dir_.path() + "/state.db");
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
    faults_ = std::make_unique<FaultInjectingStore>(store_.get());
    registry_ = std::make_unique<AgentRegistry>(&clock_, absl::Seconds(10));
    kv_ = std::make_unique<KvSpace>(&clock_);
    auto supervisor =
        Supervisor::Create(faults_.get(), registry_.get(), kv_.get(), &clock_, options_);
    ASSERT_TRUE(supervisor.ok()) << supervisor.status();
    supervisor_ = std::move(*supervisor);
  }

  // The options every Open() creates the Supervisor with. A test that needs others (quarantine,
  // node MTBF) changes them and calls Restart(), before submitting anything or across a restart.
  static SupervisorOptions TestOptions() {
    SupervisorOptions options;
    options.stop_grace = absl::Seconds(3);
    options.coordinator_address = "127.0.0.1:7000";
    return options;
  }

  // Simulates a coordinator crash and restart on the same state directory.
  void Restart() {
    supervisor_.reset();
    kv_.reset();
    registry_.reset();
    faults_.reset();
    store_.reset();
    Open();
  }

  Agent Connect(const std::string& node_id, int slots,
                const std::vector<RunningWorker>& running = {},
                const std::vector<WorkerExit>& exited = {}) {
    Agent agent;
    agent.node_id = node_id;
    agent.channel = std::make_shared<RecordingChannel>();
    NodeRecord node;
    node.node_id = node_id;
    node.hostname = node_id + ".example";
    node.cpu_slots = slots;
    std::optional<RegisteredOrder> registered;
    auto session = supervisor_->AgentConnected(node, running, exited, agent.channel,
                                               [&](const RegisteredOrder& r) { registered = r; });
    EXPECT_TRUE(session.ok()) << session.status();
    EXPECT_TRUE(registered.has_value());
    agent.session = session.value_or(0);
    return agent;
  }

  std::string Submit(const std::string& spec, const std::string& request_id = "") {
    SubmitRequest request;
    request.spec_yaml = spec;
    request.user = "ada";
    request.client_request_id = request_id;
    auto job = supervisor_->Submit(request);
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? job->id : "";
  }

  JobView View(const std::string& job_id) {
    auto view = supervisor_->GetJob(job_id, 100);
    EXPECT_TRUE(view.ok()) << view.status();
    return view.value_or(JobView{});
  }
  JobState State(const std::string& job_id) { return View(job_id).job.state; }
  std::vector<std::string> EventKinds(const std::string& job_id) {
    std::vector<std::string> kinds;
    for (const EventRecord& e : View(job_id).events) kinds.push_back(e.kind);
    return kinds;
  }

  // Joins every rank; returns the answers once all arrived.
  std::vector<absl::StatusOr<JoinInfo>> JoinAll(const std::string& job_id, int attempt, int world) {
    std::vector<std::optional<absl::StatusOr<JoinInfo>>> answers(world);
    for (int rank = 0; rank < world; ++rank) {
      supervisor_->Join(job_id, attempt, rank, clock_.Now() + absl::Minutes(1),
                        [&answers, rank](absl::StatusOr<JoinInfo> info) { answers[rank] = info; });
    }
    std::vector<absl::StatusOr<JoinInfo>> out;
    for (auto& a : answers) {
      EXPECT_TRUE(a.has_value());
      out.push_back(a.value_or(absl::InternalError("no answer")));
    }
    return out;
  }

  void Exit(const Agent& agent, const std::string& job_id, int attempt, int rank, int code,
            int signal = 0, std::vector<std::string> log = {}) {
    WorkerExit exit;
    exit.job_id = job_id;
    exit.attempt_id = attempt;
    exit.rank = rank;
    exit.exit.exit_code = code;
    exit.exit.signal = signal;
    exit.exit.pid = 1000 + rank;
    exit.exit.last_log_lines = std::move(log);
    ASSERT_TRUE(supervisor_->WorkerExited(agent.node_id, agent.session, exit).ok());
  }

  // Moves time on while the agents keep heartbeating.
  void AdvanceWithHeartbeats(absl::Duration duration, const std::vector<Agent>& agents) {
    for (absl::Duration done; done < duration; done += absl::Seconds(1)) {
      clock_.Advance(std::min(absl::Seconds(1), duration - done));
      for (const Agent& agent : agents) {
        ASSERT_TRUE(supervisor_->Heartbeat(agent.node_id, agent.session, {}).ok());
      }
      supervisor_->Tick();
    }
  }

  // Readers see progress once it is stored: past the progress write interval, a Tick writes it.
  void StoreProgress() {
    clock_.Advance(options_.progress_flush_interval);
    supervisor_->Tick();
  }

  void Started(const Agent& agent, const std::string& job_id, int attempt, int rank) {
    ASSERT_TRUE(supervisor_
                    ->WorkerStarted(agent.node_id, agent.session,
                                    RunningWorker{job_id, attempt, rank, 1000 + rank})
                    .ok());
  }

  ScratchDir dir_;
  FakeClock clock_;
  SupervisorOptions options_ = TestOptions();
  std::unique_ptr<JobStore> store_;
  std::unique_ptr<FaultInjectingStore> faults_;  // between the supervisor and store_
  std::unique_ptr<AgentRegistry> registry_;
  std::unique_ptr<KvSpace> kv_;
  std::unique_ptr<Supervisor> supervisor_;
};

}  // namespace trainyard::server::testing

#endif  // TRAINYARD_TESTS_UNIT_SERVER_SUPERVISOR_FIXTURE_H_
