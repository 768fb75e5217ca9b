// Chaos for the control plane: the coordinator and workers are SIGKILLed mid-run. The jobs must
// finish (or fail for the stated reason), no rank may run twice, and nothing may be left running.
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/child_process.h"
#include "tests/integration/controlplane_util.h"

namespace trainyard::testenv {
namespace {

using ::testing::HasSubstr;
using ::testing::UnorderedElementsAreArray;

// Long enough (several seconds) that the chaos lands mid-run, short enough for CI.
constexpr int kLongSteps = 3000;

std::vector<int64_t> PlacedPids(const v1::Attempt& attempt) {
  std::vector<int64_t> pids;
  for (const v1::RankPlacement& place : attempt.placement()) pids.push_back(place.pid());
  return pids;
}

int CountOccurrences(const std::string& text, const std::string& needle) {
  int count = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) {
    ++count;
  }
  return count;
}

// Kills the coordinator while a 2-rank job runs, restarts it on the same state directory and
// port, and checks that the same workers finish the same attempt.
void CoordinatorCrashMidRun(ControlPlane& cp, const ServerOptions& server,
                            const std::string& agent_logs) {
  const std::string job_id = cp.Submit(cp.WriteSpec(
      "job.yaml", TinySpec({.name = "survivor", .ranks_per_node = 2, .steps = kLongSteps})));
  ASSERT_TRUE(cp.WaitForStep(job_id, 10, 120));
  const v1::GetJobReply before = cp.Status(job_id);
  ASSERT_EQ(before.attempts_size(), 1);
  const std::vector<int64_t> pids = PlacedPids(before.attempts(0));
  ASSERT_EQ(pids.size(), 2u);
  EXPECT_THAT(cp.WorkerPids(), UnorderedElementsAreArray(pids));

  cp.KillServer();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  for (int64_t pid : pids) EXPECT_FALSE(ProcessGone(pid)) << "workers outlive the coordinator";
  cp.StartServer(server);

  const ProcessResult watch = cp.Cli({"watch", job_id}, 300);
  EXPECT_EQ(watch.exit_code, 0) << watch.out << watch.err;
  const v1::GetJobReply after = cp.Status(job_id);
  EXPECT_EQ(after.job().state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(after.job().attempts(), 1) << "the job must not have been started again";
  EXPECT_EQ(after.job().restarts(), 0);
  EXPECT_EQ(after.job().progress().step(), kLongSteps);
  ASSERT_EQ(after.attempts_size(), 1);
  EXPECT_EQ(PlacedPids(after.attempts(0)), pids);
  // Each rank ran once: one log per rank, in attempt 1 only, each with one start line.
  const std::string job_logs = agent_logs + "/" + job_id;
  std::vector<std::string> attempts;
  for (const auto& entry : std::filesystem::directory_iterator(job_logs)) {
    attempts.push_back(entry.path().filename().string());
  }
  EXPECT_EQ(attempts, std::vector<std::string>{"attempt-1"});
  for (int rank = 0; rank < 2; ++rank) {
    const std::string log = ReadWholeFile(absl::StrCat(job_logs, "/attempt-1/rank-", rank, ".log"));
    EXPECT_EQ(CountOccurrences(log, absl::StrCat("attempt 1: rank ", rank, " of 2")), 1) << log;
  }
  EXPECT_TRUE(cp.WorkerPids().empty()) << "no orphans";
  for (int64_t pid : pids) EXPECT_TRUE(ProcessGone(pid));
}

TEST(ControlPlaneChaosTest, CoordinatorKilledMidRunWithASeparateAgent) {
  ControlPlane cp("chaos_coordinator");
  cp.StartServer();
  cp.StartAgent("node-a", 2);
  CoordinatorCrashMidRun(cp, ServerOptions(), cp.dir() + "/agent-node-a/logs");
}

TEST(ControlPlaneChaosTest, EmbeddedDefaultKilledMidRunAdoptsItsWorkers) {
  // The agent dies with the coordinator here; the restarted one finds the workers it recorded.
  ControlPlane cp("chaos_embedded");
  const ServerOptions server{.local_agent = true, .local_slots = 2};
  cp.StartServer(server);
  CoordinatorCrashMidRun(cp, server, cp.state_dir() + "/agent/logs");
}

TEST(ControlPlaneChaosTest, KilledWorkerGetsANewAttempt) {
  ControlPlane cp("chaos_worker");
  cp.StartServer({.local_agent = true, .local_slots = 2});
  const std::string job_id = cp.Submit(cp.WriteSpec(
      "job.yaml",
      TinySpec({.name = "phoenix", .ranks_per_node = 2, .steps = 1000, .max_restarts = 2})));
  ASSERT_TRUE(cp.WaitForStep(job_id, 5, 120));
  const std::vector<int64_t> first = PlacedPids(cp.Status(job_id).attempts(0));
  ASSERT_EQ(first.size(), 2u);
  ASSERT_EQ(kill(static_cast<pid_t>(first[1]), SIGKILL), 0);

  const ProcessResult watch = cp.Cli({"watch", job_id}, 300);
  EXPECT_EQ(watch.exit_code, 0) << watch.out << watch.err;
  const v1::GetJobReply reply = cp.Status(job_id);
  EXPECT_EQ(reply.job().state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(reply.job().attempts(), 2);
  EXPECT_EQ(reply.job().restarts(), 1);
  ASSERT_EQ(reply.attempts_size(), 2);
  bool saw_kill = false;
  for (const v1::RankExit& exit : reply.attempts(0).exits()) {
    if (exit.rank() == 1) saw_kill = exit.signal() == SIGKILL && exit.pid() == first[1];
  }
  EXPECT_TRUE(saw_kill) << reply.attempts(0).DebugString();
  for (int64_t pid : PlacedPids(reply.attempts(1))) {
    EXPECT_TRUE(std::find(first.begin(), first.end(), pid) == first.end());
  }
  EXPECT_TRUE(cp.WorkerPids().empty());
}

TEST(ControlPlaneChaosTest, PastTheRestartLimitTheJobFailsAndStatusSaysWhy) {
  ControlPlane cp("chaos_limit");
  cp.StartServer({.local_agent = true, .local_slots = 1});
  const std::string job_id = cp.Submit(
      cp.WriteSpec("job.yaml", TinySpec({.name = "doomed", .steps = 1000000, .max_restarts = 1})));
  for (int attempt = 1; attempt <= 2; ++attempt) {
    ASSERT_TRUE(cp.WaitFor(
        job_id,
        [attempt](const v1::GetJobReply& r) {
          return r.job().current_attempt_id() == attempt &&
                 r.job().state() == v1::JOB_STATE_RUNNING && r.job().progress().step() >= 10 &&
                 r.attempts_size() == attempt && r.attempts(attempt - 1).placement(0).pid() > 0;
        },
        120))
        << "attempt " << attempt;
    // A resumed attempt reports its resume step at once: wait for a step line of its own in its
    // log too, which the failure's status then shows.
    const std::vector<std::string> logs = {"logs",   job_id, "--attempt", absl::StrCat(attempt),
                                           "--rank", "0"};
    bool logged = false;
    for (int i = 0; i < 600 && !logged; ++i) {
      const std::string log = cp.Cli(logs).out;
      logged = absl::StartsWith(log, "step ") || absl::StrContains(log, "\nstep ");
      if (!logged) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    ASSERT_TRUE(logged) << "attempt " << attempt << " logged no step: " << cp.Cli(logs).out;
    const v1::GetJobReply running = cp.Status(job_id);
    ASSERT_EQ(kill(static_cast<pid_t>(running.attempts(attempt - 1).placement(0).pid()), SIGKILL),
              0);
  }
  const ProcessResult watch = cp.Cli({"watch", job_id}, 120);
  EXPECT_EQ(watch.exit_code, 1) << watch.out << watch.err;
  EXPECT_THAT(watch.out, HasSubstr(job_id + " doomed FAILED"));

  const ProcessResult status = cp.Cli({"status", job_id});
  EXPECT_EQ(status.exit_code, 0);
  EXPECT_THAT(status.out, HasSubstr("state       FAILED"));
  EXPECT_THAT(status.out, HasSubstr("attempts    2 (1 restarts of 1 allowed)"));
  EXPECT_THAT(status.out, HasSubstr("attempt 2: rank 0 on node local"));
  EXPECT_THAT(status.out, HasSubstr("killed by signal 9 (SIGKILL)"));
  EXPECT_THAT(status.out, HasSubstr("    | step "));  // the rank's last log lines
  EXPECT_TRUE(cp.WorkerPids().empty());
}

// Workers report through their agent's progress relay. When the agent dies, its worker (alone in
// its job: no collective breaks) falls back to the coordinator, which declares the node lost
// after the spec's 5 s heartbeat timeout and answers that the attempt has ended: the worker
// stops instead of training on unsupervised until the orphan limit.
TEST(ControlPlaneChaosTest, AWorkerWhoseAgentDiedStopsOnceItsNodeIsLost) {
  ControlPlane cp("cp_agent_died");
  cp.StartServer({.local_agent = false});
  cp.StartAgent("node-a", 1);
  const std::string job_id = cp.Submit(
      cp.WriteSpec("job.yaml", TinySpec({.name = "orphaned", .steps = 200000, .max_restarts = 0})));
  ASSERT_TRUE(cp.WaitForStep(job_id, 10, 120));
  const std::vector<int64_t> pids = cp.WorkerPids();
  ASSERT_EQ(pids.size(), 1u);
  cp.KillAgent("node-a");
  const auto killed = std::chrono::steady_clock::now();
  while (!ProcessGone(pids[0]) &&
         std::chrono::steady_clock::now() - killed < std::chrono::seconds(30)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(ProcessGone(pids[0])) << "the worker still trains 30 s after its agent died";
  std::cout << "the worker stopped "
            << std::chrono::duration<double>(std::chrono::steady_clock::now() - killed).count()
            << " s after its agent was killed" << std::endl;
  const v1::GetJobReply after = cp.Status(job_id);
  EXPECT_EQ(after.job().state(), v1::JOB_STATE_FAILED) << after.DebugString();
  EXPECT_EQ(after.job().last_failure().failure_class(), "node_lost") << after.DebugString();
}

}  // namespace
}  // namespace trainyard::testenv
