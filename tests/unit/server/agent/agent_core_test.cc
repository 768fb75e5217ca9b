// AgentCore driven by hand: a fake launcher, a fake clock, real files in a scratch directory.
#include "server/agent/agent_core.h"

#include <signal.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/filesystem.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/agent/fake_process_launcher.h"
#include "tests/unit/server/agent/agent_test_util.h"

namespace trainyard::server::agent {
namespace {

using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::UnorderedElementsAre;
using ::trainyard::server::agent::testing::ReadWholeFile;
using ::trainyard::server::agent::testing::TempDir;
using ::trainyard::server::agent::testing::WriteFile;

v1::CoordinatorMessage StartOrder(const std::string& job, int attempt, int rank, bool gpu = false,
                                  int slot = 0) {
  v1::CoordinatorMessage message;
  v1::StartWorker* start = message.mutable_start();
  start->set_job_id(job);
  start->set_attempt_id(attempt);
  start->set_rank(rank);
  start->set_local_rank(rank);
  start->set_slot(slot);
  start->set_gpu(gpu);
  start->set_coordinator_address("127.0.0.1:7000");
  return message;
}

v1::CoordinatorMessage StopOrder(const std::string& job, int attempt, std::vector<int> ranks,
                                 int64_t grace_ms, const std::string& reason = "cancelled") {
  v1::CoordinatorMessage message;
  v1::StopWorkers* stop = message.mutable_stop();
  stop->set_job_id(job);
  stop->set_attempt_id(attempt);
  for (int rank : ranks) stop->add_ranks(rank);
  stop->set_grace_period_ms(grace_ms);
  stop->set_reason(reason);
  return message;
}

v1::CoordinatorMessage ReadLogsOrder(int64_t id, const std::string& job, int attempt, int rank,
                                     int tail_lines, bool follow) {
  v1::CoordinatorMessage message;
  v1::ReadLogs* read = message.mutable_read_logs();
  read->set_request_id(id);
  read->set_job_id(job);
  read->set_attempt_id(attempt);
  read->set_rank(rank);
  read->set_tail_lines(tail_lines);
  read->set_follow(follow);
  return message;
}

v1::CoordinatorMessage Registered() {
  v1::CoordinatorMessage message;
  message.mutable_registered()->set_node_id("node-a");
  message.mutable_registered()->set_heartbeat_interval_ms(250);
  return message;
}

std::vector<v1::WorkerExited> Exits(const std::vector<v1::AgentMessage>& messages) {
  std::vector<v1::WorkerExited> exits;
  for (const v1::AgentMessage& m : messages) {
    if (m.has_exited()) exits.push_back(m.exited());
  }
  return exits;
}

std::string LogText(const std::vector<v1::AgentMessage>& messages, int64_t request_id,
                    bool* done = nullptr, std::string* error = nullptr) {
  std::string text;
  for (const v1::AgentMessage& m : messages) {
    if (!m.has_log() || m.log().request_id() != request_id) continue;
    text += m.log().data();
    if (done != nullptr && m.log().done()) *done = true;
    if (error != nullptr && !m.log().error().empty()) *error = m.log().error();
  }
  return text;
}

class AgentCoreTest : public ::testing::Test {
 protected:
  AgentConfig Config() const {
    AgentConfig config;
    config.node_id = "node-a";
    config.hostname = "host-a";
    config.cpu_slots = 2;
    config.worker_binary = "/opt/trainyard/bin/trainyard-worker";
    config.work_dir = dir_.path() + "/agent";
    config.environment = {{"PATH", "/usr/bin:/bin"},   {"HOME", "/home/ada"},
                          {"SECRET_TOKEN", "hunter2"}, {"LD_PRELOAD", "/tmp/evil.so"},
                          {"TRAINYARD_LOG", "debug"},  {"TRAINYARD_", "empty suffix"}};
    config.threads_per_cpu_worker = 3;
    return config;
  }

  std::unique_ptr<AgentCore> NewCore() {
    auto core = std::make_unique<AgentCore>(Config(), &launcher_, RealFileSystem(), &clock_);
    EXPECT_TRUE(core->Recover().ok());
    return core;
  }

  // Registers `core` and drops the registration's answer from its outgoing queue.
  void Connect(AgentCore& core) {
    core.Registration();
    core.Handle(Registered());
    core.TakeOutgoing();
  }

  int64_t StartedPid(AgentCore& core, const std::string& job, int attempt, int rank) {
    core.Handle(StartOrder(job, attempt, rank));
    for (const v1::AgentMessage& m : core.TakeOutgoing()) {
      if (m.has_started() && m.started().rank() == rank) return m.started().pid();
    }
    ADD_FAILURE() << "no WorkerStarted for rank " << rank;
    return -1;
  }

  TempDir dir_;
  FakeProcessLauncher launcher_;
  FakeClock clock_;
};

TEST_F(AgentCoreTest, RegistrationDescribesTheNode) {
  AgentConfig config = Config();
  v1::GpuInfo gpu;
  gpu.set_index(0);
  gpu.set_name("H100");
  config.gpus = {gpu};
  AgentCore core(config, &launcher_, RealFileSystem(), &clock_);
  ASSERT_TRUE(core.Recover().ok());
  EXPECT_FALSE(core.connected());
  const v1::AgentMessage message = core.Registration();
  ASSERT_TRUE(message.has_registration());
  const v1::RegisterAgent& r = message.registration();
  EXPECT_EQ(r.node_id(), "node-a");
  EXPECT_EQ(r.hostname(), "host-a");
  EXPECT_EQ(r.cpu_slots(), 2);
  ASSERT_EQ(r.gpus_size(), 1);
  EXPECT_EQ(r.gpus(0).name(), "H100");
  EXPECT_FALSE(r.agent_version().empty());
  EXPECT_EQ(r.running_size(), 0);
  EXPECT_EQ(r.exited_while_disconnected_size(), 0);
  EXPECT_TRUE(core.connected());
  core.Handle(Registered());
  EXPECT_EQ(core.heartbeat_interval(), absl::Milliseconds(250));
}

TEST_F(AgentCoreTest, StartExecsTheWorkerWithAnArgvAndTheAllowlistedEnvironment) {
  std::unique_ptr<AgentCore> core = NewCore();
  Connect(*core);
  core->Handle(StartOrder("j-000007", 2, 1));
  ASSERT_EQ(launcher_.launches().size(), 1u);
  const LaunchRequest launch = launcher_.launches()[0];
  EXPECT_THAT(launch.argv,
              ElementsAre("/opt/trainyard/bin/trainyard-worker", "--coordinator", "127.0.0.1:7000",
                          "--job", "j-000007", "--attempt", "2", "--rank", "1"));
  const std::string exit_file = dir_.path() + "/agent/logs/j-000007/attempt-2/rank-1.exit";
  EXPECT_THAT(launch.env,
              ElementsAre("HOME=/home/ada", "OMP_NUM_THREADS=3", "PATH=/usr/bin:/bin",
                          "TRAINYARD_EXIT_STATUS_FILE=" + exit_file, "TRAINYARD_LOCAL_RANK=1",
                          "TRAINYARD_LOG=debug", "TRAINYARD_NODE_ID=node-a", "TRAINYARD_SLOT=0"));
  EXPECT_EQ(launch.log_path, dir_.path() + "/agent/logs/j-000007/attempt-2/rank-1.log");
  EXPECT_EQ(core->LogPath({"j-000007", 2, 1}), launch.log_path);

  const std::vector<v1::AgentMessage> out = core->TakeOutgoing();
  ASSERT_EQ(out.size(), 1u);
  ASSERT_TRUE(out[0].has_started());
  EXPECT_EQ(out[0].started().job_id(), "j-000007");
  EXPECT_EQ(out[0].started().attempt_id(), 2);
  EXPECT_EQ(out[0].started().rank(), 1);
  EXPECT_EQ(out[0].started().pid(), 1000);

  const v1::AgentMessage heartbeat = core->Heartbeat();
  ASSERT_EQ(heartbeat.heartbeat().running_size(), 1);
  EXPECT_EQ(heartbeat.heartbeat().running(0).pid(), 1000);
  EXPECT_EQ(heartbeat.heartbeat().running(0).job_id(), "j-000007");
  EXPECT_EQ(heartbeat.heartbeat().sent_unix_ms(), absl::ToUnixMillis(clock_.Now()));
  EXPECT_FALSE(heartbeat.heartbeat().omits_reported());

  // On a progress batch the heartbeat leaves out the workers the batch's reports speak for.
  v1::ProgressBatch batch;
  v1::ProgressReport* report = batch.add_reports();
  report->set_job_id("j-000007");
  report->set_attempt_id(2);
  report->set_rank(1);
  const v1::AgentMessage riding = core->Heartbeat(&batch);
  EXPECT_TRUE(riding.heartbeat().omits_reported());
  EXPECT_EQ(riding.heartbeat().running_size(), 0);
  report->set_rank(0);  // a report of another rank speaks for nobody this node runs
  EXPECT_EQ(core->Heartbeat(&batch).heartbeat().running_size(), 1);
}

TEST_F(AgentCoreTest, AStartBatchStartsEachWorkerInOrder) {
  std::unique_ptr<AgentCore> core = NewCore();
  EXPECT_TRUE(core->Registration().registration().accepts_start_batches());
  Connect(*core);
  v1::CoordinatorMessage batch;
  for (int rank = 0; rank < 3; ++rank) {
    *batch.mutable_start_batch()->add_workers() = StartOrder("j-1", 1, rank).start();
  }
  core->Handle(batch);
  ASSERT_EQ(launcher_.launches().size(), 3u);
  std::vector<int> started;
  for (const v1::AgentMessage& m : core->TakeOutgoing()) {
    if (m.has_started()) started.push_back(m.started().rank());
  }
  EXPECT_EQ(started, (std::vector<int>{0, 1, 2}));
}

TEST_F(AgentCoreTest, GpuWorkersSeeOnlyTheirDevice) {
  std::unique_ptr<AgentCore> core = NewCore();
  Connect(*core);
  core->Handle(StartOrder("j-1", 1, 0, /*gpu=*/true, /*slot=*/3));
  ASSERT_EQ(launcher_.launches().size(), 1u);
  const std::vector<std::string> env = launcher_.launches()[0].env;
  EXPECT_THAT(env, Contains("CUDA_VISIBLE_DEVICES=3"));
  EXPECT_THAT(env, Contains("TRAINYARD_SLOT=3"));
  EXPECT_THAT(env, Not(Contains("OMP_NUM_THREADS=3")));
}

TEST_F(AgentCoreTest, StartIsIdempotent) {
  std::unique_ptr<AgentCore> core = NewCore();
  Connect(*core);
  core->Handle(StartOrder("j-1", 1, 0));
  core->Handle(StartOrder("j-1", 1, 0));
  EXPECT_EQ(launcher_.launches().size(), 1u);
  EXPECT_EQ(core->TakeOutgoing().size(), 1u);
  EXPECT_EQ(core->running_workers().size(), 1u);
}

TEST_F(AgentCoreTest, OrdersThatCannotStartAreReportedAsExits) {
  std::unique_ptr<AgentCore> core = NewCore();
  Connect(*core);
  v1::CoordinatorMessage with_env = StartOrder("j-1", 1, 0);
  (*with_env.mutable_start()->mutable_env())["LD_PRELOAD"] = "/tmp/x.so";
  core->Handle(with_env);
  core->Handle(StartOrder("../../etc", 1, 1));
  launcher_.FailNextLaunch(
      absl::FailedPreconditionError("exec /opt/trainyard/bin/trainyard-worker: No such file"));
  core->Handle(StartOrder("j-1", 1, 2));
  EXPECT_TRUE(launcher_.launches().empty());
  const std::vector<v1::WorkerExited> exits = Exits(core->TakeOutgoing());
  ASSERT_EQ(exits.size(), 3u);
  for (const v1::WorkerExited& e : exits) {
    EXPECT_EQ(e.exit().pid(), 0);
    EXPECT_EQ(e.exit().exit_code(), 127);
    EXPECT_EQ(e.exit().node_id(), "node-a");
  }
  EXPECT_THAT(exits[0].exit().message(), HasSubstr("LD_PRELOAD is not allowed"));
  EXPECT_THAT(exits[1].exit().message(), HasSubstr("invalid worker identity"));
  EXPECT_EQ(exits[2].exit().rank(), 2);
  EXPECT_THAT(exits[2].exit().message(), HasSubstr("No such file"));
  EXPECT_TRUE(core->running_workers().empty());
}

TEST_F(AgentCoreTest, ExitIsReportedOnceWithTheLogTail) {
  std::unique_ptr<AgentCore> core = NewCore();
  Connect(*core);
  const int64_t pid = StartedPid(*core, "j-1", 1, 0);
  std::string log;
  for (int i = 1; i <= 30; ++i) absl::StrAppend(&log, "line ", i, "\n");
  WriteFile(core->LogPath({"j-1", 1, 0}), log);
  core->Tick();
  EXPECT_TRUE(core->TakeOutgoing().empty());  // still running

  clock_.Advance(absl::Seconds(3));
  launcher_.Exit(pid, ProcessExit{.exit_code = 3});
  core->Tick();
  const std::vector<v1::WorkerExited> exits = Exits(core->TakeOutgoing());
  ASSERT_EQ(exits.size(), 1u);
  const v1::RankExit& exit = exits[0].exit();
  EXPECT_EQ(exits[0].job_id(), "j-1");
  EXPECT_EQ(exits[0].attempt_id(), 1);
  EXPECT_EQ(exit.rank(), 0);
  EXPECT_EQ(exit.exit_code(), 3);
  EXPECT_FALSE(exit.stopped());
  EXPECT_EQ(exit.signal(), 0);
  EXPECT_EQ(exit.pid(), pid);
  EXPECT_EQ(exit.hostname(), "host-a");
  EXPECT_EQ(exit.exited_unix_ms(), absl::ToUnixMillis(clock_.Now()));
  ASSERT_EQ(exit.last_log_lines_size(), 20);
  EXPECT_EQ(exit.last_log_lines(0), "line 11");
  EXPECT_EQ(exit.last_log_lines(19), "line 30");
  EXPECT_TRUE(exit.message().empty());
  EXPECT_TRUE(core->running_workers().empty());

  core->Tick();
  EXPECT_TRUE(core->TakeOutgoing().empty());
  EXPECT_THAT(ReadWholeFile(dir_.path() + "/agent/workers"), Not(HasSubstr("j-1")));
}

TEST_F(AgentCoreTest, StopSendsTermThenKillAfterTheGracePeriod) {
  std::unique_ptr<AgentCore> core = NewCore();
  Connect(*core);
  const int64_t pid = StartedPid(*core, "j-1", 1, 0);
  launcher_.IgnoreTerm(pid);
  core->Handle(StopOrder("j-1", 1, {}, 5000, "job cancelled"));
  EXPECT_THAT(launcher_.signals(), ElementsAre(std::make_pair(pid, SIGTERM)));
  clock_.Advance(absl::Milliseconds(4900));
  core->Tick();
  EXPECT_EQ(launcher_.signals().size(), 1u);
  EXPECT_TRUE(core->TakeOutgoing().empty());
  // A second order does not push the deadline back.
  core->Handle(StopOrder("j-1", 1, {}, 60000));
  clock_.Advance(absl::Milliseconds(100));
  core->Tick();
  EXPECT_THAT(launcher_.signals(),
              ElementsAre(std::make_pair(pid, SIGTERM), std::make_pair(pid, SIGKILL)));
  core->Tick();
  const std::vector<v1::WorkerExited> exits = Exits(core->TakeOutgoing());
  ASSERT_EQ(exits.size(), 1u);
  EXPECT_EQ(exits[0].exit().signal(), SIGKILL);
  EXPECT_EQ(exits[0].exit().message(),
            "stopped by the coordinator: job cancelled (killed after the grace period)");
  EXPECT_TRUE(exits[0].exit().stopped());  // not a failure of its own
}

TEST_F(AgentCoreTest, StopWithoutGraceKillsAtOnce) {
  std::unique_ptr<AgentCore> core = NewCore();
  Connect(*core);
  const int64_t pid = StartedPid(*core, "j-1", 1, 0);
  core->Handle(StopOrder("j-1", 1, {}, 0));
  EXPECT_THAT(launcher_.signals(), ElementsAre(std::make_pair(pid, SIGKILL)));
}

// An agent stopping with a grace (a Slurm job step's): every worker gets SIGTERM, its job drains,
// and its exit is its own (code 0, not stopped by the coordinator).
TEST_F(AgentCoreTest, TerminateWorkersSendsEveryWorkerTerm) {
  std::unique_ptr<AgentCore> core = NewCore();
  Connect(*core);
  const int64_t a = StartedPid(*core, "j-1", 1, 0);
  const int64_t b = StartedPid(*core, "j-2", 1, 0);
  launcher_.IgnoreTerm(a);
  launcher_.IgnoreTerm(b);
  EXPECT_EQ(core->TerminateWorkers(), 2);
  EXPECT_THAT(launcher_.signals(),
              UnorderedElementsAre(std::make_pair(a, SIGTERM), std::make_pair(b, SIGTERM)));
  core->Tick();
  EXPECT_EQ(core->running_workers().size(), 2u) << "draining workers still run";
  launcher_.Exit(a, ProcessExit{.exit_code = 0});
  launcher_.Exit(b, ProcessExit{.exit_code = 0});
  core->Tick();
  const std::vector<v1::WorkerExited> exits = Exits(core->TakeOutgoing());
  ASSERT_EQ(exits.size(), 2u);
  for (const v1::WorkerExited& exit : exits) {
    EXPECT_EQ(exit.exit().exit_code(), 0);
    EXPECT_FALSE(exit.exit().stopped());
  }
  EXPECT_TRUE(core->running_workers().empty());
  EXPECT_EQ(core->TerminateWorkers(), 0);
}

// Each worker gets one SIGTERM, also one started after the first call (a start order that
// crossed the stop); and every worker starts with SIGTERM blocked, until its own handler is in
// place.
TEST_F(AgentCoreTest, TerminateWorkersSignalsEachWorkerOnceAndLateStartsToo) {
  std::unique_ptr<AgentCore> core = NewCore();
  Connect(*core);
  const int64_t a = StartedPid(*core, "j-1", 1, 0);
  launcher_.IgnoreTerm(a);
  EXPECT_EQ(core->TerminateWorkers(), 1);
  EXPECT_EQ(core->TerminateWorkers(), 0);
  const int64_t b = StartedPid(*core, "j-1", 1, 1);
  launcher_.IgnoreTerm(b);
  EXPECT_EQ(core->TerminateWorkers(), 1);
  EXPECT_THAT(launcher_.signals(),
              ElementsAre(std::make_pair(a, SIGTERM), std::make_pair(b, SIGTERM)));
  for (const LaunchRequest& launch : launcher_.launches()) {
    EXPECT_THAT(launch.blocked_signals, ElementsAre(SIGTERM));
  }
}

TEST_F(AgentCoreTest, StopSelectsTheAttemptAndRanks) {
  std::unique_ptr<AgentCore> core = NewCore();
  Connect(*core);
  const int64_t r0 = StartedPid(*core, "j-1", 1, 0);
  const int64_t r1 = StartedPid(*core, "j-1", 1, 1);
  const int64_t r2 = StartedPid(*core, "j-1", 1, 2);
  const int64_t other_attempt = StartedPid(*core, "j-1", 2, 0);
  const int64_t other_job = StartedPid(*core, "j-2", 1, 0);
  core->Handle(StopOrder("j-1", 1, {1}, 1000));
  EXPECT_THAT(launcher_.signals(), ElementsAre(std::make_pair(r1, SIGTERM)));
  core->Handle(StopOrder("j-1", 1, {}, 1000));
  EXPECT_THAT(launcher_.signals(),
              ElementsAre(std::make_pair(r1, SIGTERM), std::make_pair(r0, SIGTERM),
                          std::make_pair(r2, SIGTERM)));
  core->Tick();
  EXPECT_EQ(Exits(core->TakeOutgoing()).size(), 3u);
  EXPECT_TRUE(launcher_.running(other_attempt));
  EXPECT_TRUE(launcher_.running(other_job));
  EXPECT_EQ(core->running_workers().size(), 2u);
}

TEST_F(AgentCoreTest, ExitsWhileDisconnectedWaitForTheNextRegistration) {
  std::unique_ptr<AgentCore> core = NewCore();
  Connect(*core);
  const int64_t pid = StartedPid(*core, "j-1", 1, 0);
  core->OnDisconnected();
  launcher_.Exit(pid, ProcessExit{.exit_code = 0});
  core->Tick();
  EXPECT_TRUE(core->TakeOutgoing().empty());

  // Registered but never acknowledged: the exit is reported again next time.
  v1::AgentMessage first = core->Registration();
  ASSERT_EQ(first.registration().exited_while_disconnected_size(), 1);
  EXPECT_EQ(first.registration().running_size(), 0);
  core->OnDisconnected();
  v1::AgentMessage second = core->Registration();
  ASSERT_EQ(second.registration().exited_while_disconnected_size(), 1);
  EXPECT_EQ(second.registration().exited_while_disconnected(0).exit().pid(), pid);
  EXPECT_EQ(second.registration().exited_while_disconnected(0).exit().exit_code(), 0);
  core->Handle(Registered());
  core->OnDisconnected();
  EXPECT_EQ(core->Registration().registration().exited_while_disconnected_size(), 0);
}

TEST_F(AgentCoreTest, UnsentExitsAreNotLost) {
  std::unique_ptr<AgentCore> core = NewCore();
  Connect(*core);
  const int64_t pid = StartedPid(*core, "j-1", 1, 0);
  launcher_.Exit(pid, ProcessExit{.signal = SIGSEGV});
  core->Tick();
  std::vector<v1::AgentMessage> out = core->TakeOutgoing();
  ASSERT_EQ(out.size(), 1u);
  core->ReturnUnsent(out);  // the stream broke before it was written
  core->OnDisconnected();
  v1::AgentMessage registration = core->Registration();
  ASSERT_EQ(registration.registration().exited_while_disconnected_size(), 1);
  EXPECT_EQ(registration.registration().exited_while_disconnected(0).exit().signal(), SIGSEGV);
}

TEST_F(AgentCoreTest, RestartAdoptsLiveWorkersAndReportsTheOthers) {
  std::unique_ptr<AgentCore> first = NewCore();
  Connect(*first);
  const int64_t alive = StartedPid(*first, "j-1", 1, 0);
  const int64_t finished = StartedPid(*first, "j-1", 1, 1);
  const int64_t crashed = StartedPid(*first, "j-1", 1, 2);
  first.reset();  // the agent dies; its workers are no longer its children

  FakeProcessLauncher after_restart;
  after_restart.AddForeignProcess({alive, 7});
  // Rank 1 ended normally (the worker wrote its exit status); rank 2 left nothing.
  WriteFile(dir_.path() + "/agent/logs/j-1/attempt-1/rank-1.exit", "0\n");
  AgentCore second(Config(), &after_restart, RealFileSystem(), &clock_);
  ASSERT_TRUE(second.Recover().ok());
  const v1::RegisterAgent r = second.Registration().registration();
  ASSERT_EQ(r.running_size(), 1);
  EXPECT_EQ(r.running(0).pid(), alive);
  EXPECT_EQ(r.running(0).rank(), 0);
  ASSERT_EQ(r.exited_while_disconnected_size(), 2);
  EXPECT_EQ(r.exited_while_disconnected(0).exit().pid(), finished);
  EXPECT_EQ(r.exited_while_disconnected(0).exit().exit_code(), 0);
  EXPECT_EQ(r.exited_while_disconnected(1).exit().pid(), crashed);
  EXPECT_EQ(r.exited_while_disconnected(1).exit().exit_code(), -1);
  EXPECT_THAT(r.exited_while_disconnected(1).exit().message(), HasSubstr("exit status is unknown"));
  second.Handle(Registered());

  // The adopted worker ends; its status comes from the file it wrote.
  WriteFile(dir_.path() + "/agent/logs/j-1/attempt-1/rank-0.exit", "4\n");
  after_restart.Vanish(alive);
  second.Tick();
  const std::vector<v1::WorkerExited> exits = Exits(second.TakeOutgoing());
  ASSERT_EQ(exits.size(), 1u);
  EXPECT_EQ(exits[0].exit().exit_code(), 4);
  EXPECT_TRUE(exits[0].exit().message().empty());
}

TEST_F(AgentCoreTest, AWorkerStartedAgainGetsAFreshExitStatusFile) {
  std::unique_ptr<AgentCore> core = NewCore();
  Connect(*core);
  const std::string exit_file = core->ExitStatusPath({"j-1", 1, 0});
  WriteFile(exit_file, "0\n");
  StartedPid(*core, "j-1", 1, 0);
  EXPECT_FALSE(RealFileSystem()->Exists(exit_file));
}

TEST_F(AgentCoreTest, ReadLogsSendsTheTailThenDone) {
  std::unique_ptr<AgentCore> core = NewCore();
  Connect(*core);
  const int64_t pid = StartedPid(*core, "j-1", 1, 0);
  launcher_.Exit(pid, ProcessExit{});
  core->Tick();
  core->TakeOutgoing();
  WriteFile(core->LogPath({"j-1", 1, 0}), "a\nb\nc\n");
  core->Handle(ReadLogsOrder(5, "j-1", 1, 0, /*tail_lines=*/2, /*follow=*/false));
  bool done = false;
  EXPECT_EQ(LogText(core->TakeOutgoing(), 5, &done), "b\nc\n");
  EXPECT_TRUE(done);

  core->Handle(ReadLogsOrder(6, "j-1", 1, 0, 0, /*follow=*/true));  // it has exited: no waiting
  done = false;
  EXPECT_EQ(LogText(core->TakeOutgoing(), 6, &done), "a\nb\nc\n");
  EXPECT_TRUE(done);
}

TEST_F(AgentCoreTest, FollowStreamsUntilTheWorkerExits) {
  std::unique_ptr<AgentCore> core = NewCore();
  Connect(*core);
  const int64_t pid = StartedPid(*core, "j-1", 1, 0);
  // Nothing written yet: the request waits for the file.
  core->Handle(ReadLogsOrder(9, "j-1", 1, 0, 0, true));
  bool done = false;
  EXPECT_EQ(LogText(core->TakeOutgoing(), 9, &done), "");
  EXPECT_FALSE(done);
  const std::string path = core->LogPath({"j-1", 1, 0});
  WriteFile(path, "step 1\n");
  core->Tick();
  EXPECT_EQ(LogText(core->TakeOutgoing(), 9, &done), "step 1\n");
  EXPECT_FALSE(done);
  WriteFile(path, "step 2\n", /*append=*/true);
  launcher_.Exit(pid, ProcessExit{});
  core->Tick();
  const std::vector<v1::AgentMessage> out = core->TakeOutgoing();
  EXPECT_EQ(LogText(out, 9, &done), "step 2\n");
  EXPECT_TRUE(done);
  EXPECT_EQ(Exits(out).size(), 1u);
}

TEST_F(AgentCoreTest, CancelledAndMissingLogRequests) {
  std::unique_ptr<AgentCore> core = NewCore();
  Connect(*core);
  StartedPid(*core, "j-1", 1, 0);
  core->Handle(ReadLogsOrder(1, "j-1", 1, 0, 0, true));
  v1::CoordinatorMessage cancel;
  cancel.mutable_cancel_read_logs()->set_request_id(1);
  core->Handle(cancel);
  WriteFile(core->LogPath({"j-1", 1, 0}), "more\n");
  core->Tick();
  EXPECT_EQ(LogText(core->TakeOutgoing(), 1), "");

  core->Handle(ReadLogsOrder(2, "j-9", 1, 0, 0, false));
  bool done = false;
  std::string error;
  LogText(core->TakeOutgoing(), 2, &done, &error);
  EXPECT_TRUE(done);
  EXPECT_EQ(error, "no log for job j-9 attempt 1 rank 0 on node node-a");
}

TEST_F(AgentCoreTest, LogRequestsEndWithTheStream) {
  std::unique_ptr<AgentCore> core = NewCore();
  Connect(*core);
  StartedPid(*core, "j-1", 1, 0);
  core->Handle(ReadLogsOrder(1, "j-1", 1, 0, 0, true));
  core->OnDisconnected();
  Connect(*core);
  WriteFile(core->LogPath({"j-1", 1, 0}), "after reconnect\n");
  core->Tick();
  EXPECT_EQ(LogText(core->TakeOutgoing(), 1), "");
}

TEST(WorkerEnvironmentTest, Allowlist) {
  // The operator's settings of the libraries a worker computes and talks with pass by default.
  for (const char* allowed :
       {"PATH", "HOME", "LANG", "LC_ALL", "LD_LIBRARY_PATH", "OMP_NUM_THREADS", "OMP_PROC_BIND",
        "OPENBLAS_CORETYPE", "CUDA_VISIBLE_DEVICES", "CUDA_LAUNCH_BLOCKING", "NCCL_DEBUG",
        "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "TRAINYARD_X"}) {
    EXPECT_TRUE(IsAllowedWorkerVariable(allowed)) << allowed;
  }
  for (const char* refused :
       {"LD_PRELOAD", "SECRET", "TRAINYARD_", "OMP_", "PATHX", "path", "", "MY_SETTING"}) {
    EXPECT_FALSE(IsAllowedWorkerVariable(refused)) << refused;
  }
  // --pass-env adds names and prefixes.
  const std::vector<std::string> extra = {"MY_*", "HTTP_PROXY"};
  EXPECT_TRUE(IsAllowedWorkerVariable("MY_SETTING", extra));
  EXPECT_TRUE(IsAllowedWorkerVariable("HTTP_PROXY", extra));
  EXPECT_FALSE(IsAllowedWorkerVariable("HTTP_PROXY2", extra));
  EXPECT_FALSE(IsAllowedWorkerVariable("MY_", extra));
  for (const char* good : {"MY_*", "X", "_A1", "NCCL_*"}) EXPECT_TRUE(IsValidVariablePattern(good));
  for (const char* bad : {"", "*", "1A", "A-B", "A*B", "A=B"}) {
    EXPECT_FALSE(IsValidVariablePattern(bad)) << bad;
  }
}

// A restarted agent hears of its adopted workers' attempts in the registration's answer: their
// snapshots go on to the peer node that the start orders named, also without secrets. An agent
// that has a peer for the job keeps it.
TEST_F(AgentCoreTest, TheRegistrationAnswerNamesTheMemoryPeerOfAdoptedWorkers) {
  FakeFileSystem fs;
  MemoryTier tier(&fs, "/tier", 1 << 20, "node-a");
  ASSERT_TRUE(tier.Start().ok());
  AgentConfig config = Config();
  config.memory_tier = &tier;
  config.memory_tier_address = "node-a:7000";
  AgentCore core(std::move(config), &launcher_, RealFileSystem(), &clock_);
  ASSERT_TRUE(core.Recover().ok());
  core.Registration();
  v1::CoordinatorMessage registered = Registered();
  v1::AttemptSecret* adopted = registered.mutable_registered()->add_attempt_secrets();
  adopted->set_job_id("j-1");
  adopted->set_attempt_id(1);
  adopted->set_memory_peer_address("node-b:7000");
  adopted->add_memory_tier_addresses("node-a:7000");
  adopted->add_memory_tier_addresses("node-b:7000");
  core.Handle(registered);
  EXPECT_THAT(tier.AttemptTiers("j-1"), ElementsAre("node-a:7000", "node-b:7000"));

  const auto dir = tier.Reserve("j-1", 0, 100, /*peer_copy=*/false, "node-a");
  ASSERT_TRUE(dir.ok()) << dir.status();
  const std::string snapshot = MemorySnapshotName({1, 7});
  ASSERT_TRUE(fs.CreateDirs(absl::StrCat(*dir, "/", snapshot)).ok());
  ASSERT_TRUE(
      fs.WriteFileAtomic(absl::StrCat(*dir, "/", snapshot, "/", MemoryRankManifestName(0)), "{}")
          .ok());
  const auto queued = tier.Committed("j-1", 0, 2, snapshot, 7, {MemoryRankManifestName(0)});
  ASSERT_TRUE(queued.ok()) << queued.status();
  EXPECT_TRUE(*queued) << "no copy queued for the peer";
  const std::optional<PeerCopy> copy = tier.NextCopy();
  ASSERT_TRUE(copy);
  EXPECT_EQ(copy->peer_address, "node-b:7000");
  EXPECT_EQ(copy->step, 7);

  // The agent reconnects to a restarted coordinator before node-b has: the answer's partial view
  // leaves the peer the agent has.
  adopted->set_memory_peer_address("node-c:7000");
  adopted->clear_memory_tier_addresses();
  adopted->add_memory_tier_addresses("node-a:7000");
  core.Registration();
  core.Handle(registered);
  EXPECT_THAT(tier.AttemptTiers("j-1"), ElementsAre("node-a:7000", "node-b:7000"));
}

}  // namespace
}  // namespace trainyard::server::agent

namespace trainyard::server::agent {
namespace {

// The agent's progress relay inside AgentCore: workers learn its address, batches go out on the
// stream, a rank's last report goes before its exit, and an adopted worker's attempt secret
// comes with the registration answer.
class AgentCoreRelayTest : public AgentCoreTest {
 protected:
  AgentCoreRelayTest() : relay_(&clock_) {}
  std::unique_ptr<AgentCore> NewRelayCore() {
    AgentConfig config = Config();
    config.progress_relay = &relay_;
    config.progress_relay_address = "127.0.0.1:4242";
    auto core =
        std::make_unique<AgentCore>(std::move(config), &launcher_, RealFileSystem(), &clock_);
    EXPECT_TRUE(core->Recover().ok());
    return core;
  }
  static v1::ProgressReport ReportOf(int rank, int64_t step) {
    v1::ProgressReport report;
    report.set_job_id("j-1");
    report.set_attempt_id(1);
    report.set_rank(rank);
    report.set_step(step);
    report.set_total_steps(100);
    return report;
  }
  ProgressRelay relay_;
};

TEST_F(AgentCoreRelayTest, RanksReportThroughTheRelayAndTheLastReportPrecedesTheExit) {
  std::unique_ptr<AgentCore> core = NewRelayCore();
  Connect(*core);
  v1::CoordinatorMessage start0 = StartOrder("j-1", 1, 0);
  start0.mutable_start()->set_attempt_secret("attempt:j-1:1:mac");
  core->Handle(start0);
  v1::CoordinatorMessage start1 = StartOrder("j-1", 1, 1);
  start1.mutable_start()->set_attempt_secret("attempt:j-1:1:mac");
  core->Handle(start1);
  int64_t pid0 = 0;
  for (const v1::AgentMessage& m : core->TakeOutgoing()) {
    if (m.has_started() && m.started().rank() == 0) pid0 = m.started().pid();
  }
  ASSERT_GT(pid0, 0);
  EXPECT_THAT(launcher_.launches()[0].env, Contains("TRAINYARD_PROGRESS_RELAY=127.0.0.1:4242"));

  // Both ranks report: one batch of two on the next tick.
  std::vector<absl::StatusOr<v1::ProgressReply>> answers;
  auto collect = [&answers](absl::StatusOr<v1::ProgressReply> a) { answers.push_back(a); };
  relay_.Report(ReportOf(0, 5), "attempt:j-1:1:mac", collect);
  relay_.Report(ReportOf(1, 5), "attempt:j-1:1:mac", collect);
  core->Tick();
  std::vector<v1::AgentMessage> out = core->TakeOutgoing();
  ASSERT_EQ(out.size(), 1u);
  ASSERT_TRUE(out[0].has_progress());
  EXPECT_EQ(out[0].progress().reports_size(), 2);
  v1::CoordinatorMessage answer;
  answer.mutable_progress_answers()->set_batch_id(out[0].progress().batch_id());
  for (int rank = 0; rank < 2; ++rank) {
    v1::ProgressAnswer* a = answer.mutable_progress_answers()->add_answers();
    a->set_job_id("j-1");
    a->set_attempt_id(1);
    a->set_rank(rank);
    a->mutable_reply()->set_order(v1::ORDER_DRAIN);
  }
  core->Handle(answer);
  ASSERT_EQ(answers.size(), 2u);
  EXPECT_EQ(answers[0]->order(), v1::ORDER_DRAIN);

  // Rank 0 reports once more and exits before the batch was due: the report goes first.
  relay_.Report(ReportOf(0, 6), "attempt:j-1:1:mac", collect);
  launcher_.Exit(pid0, ProcessExit{.exit_code = 0});
  core->Tick();
  out = core->TakeOutgoing();
  ASSERT_EQ(out.size(), 2u);
  EXPECT_TRUE(out[0].has_progress());
  EXPECT_EQ(out[0].progress().reports(0).step(), 6);
  EXPECT_TRUE(out[1].has_exited());
}

TEST_F(AgentCoreRelayTest, TheRegistrationAnswerAdmitsTheSecretsOfAdoptedWorkers) {
  std::unique_ptr<AgentCore> core = NewRelayCore();
  core->Registration();
  v1::CoordinatorMessage registered = Registered();
  v1::AttemptSecret* secret = registered.mutable_registered()->add_attempt_secrets();
  secret->set_job_id("j-1");
  secret->set_attempt_id(1);
  secret->set_secret("attempt:j-1:1:mac");
  core->Handle(registered);
  std::optional<absl::StatusOr<v1::ProgressReply>> before, after;
  relay_.Report(ReportOf(0, 5), "attempt:j-1:1:other", [&](auto a) { before = a; });
  ASSERT_TRUE(before);
  EXPECT_TRUE(absl::IsUnauthenticated(before->status()));
  relay_.Report(ReportOf(0, 5), "attempt:j-1:1:mac", [&](auto a) { after = a; });
  EXPECT_FALSE(after) << "admitted: it waits for the coordinator's answer";
  EXPECT_EQ(relay_.pending(), 1);
}

}  // namespace
}  // namespace trainyard::server::agent
