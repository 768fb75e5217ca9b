// Failures of real processes under a real coordinator: a rank stopped with SIGSTOP (in a 2-rank
// and a 1-rank job), a rank that spins without progress, a bad data file, a rank slowed by CPU
// hogs, and repeated failures on one node. Each test states how fast the failure must be found
// and whom it must blame.
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/controlplane_util.h"

namespace trainyard::testenv {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using Clock = std::chrono::steady_clock;

// Hang limits small enough for a tiny job: a step is hung after max(2 s, 10 × p99) — the tiny
// model's steps take milliseconds — and restarts wait 0.2 s.
constexpr char kFastHangs[] = "hang_floor_s: 2, hang_step_multiple: 10, backoff_initial_s: 0.2";

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

bool FailedAs(const v1::GetJobReply& r, const std::string& failure_class) {
  return r.job().last_failure().failure_class() == failure_class;
}

// Stops rank `rank` of the running job with SIGSTOP once it has committed a checkpoint; returns
// when it was stopped.
Clock::time_point StopRankAfterACheckpoint(ControlPlane& cp, const std::string& job_id, int rank,
                                           int64_t* pid) {
  EXPECT_TRUE(cp.WaitFor(
      job_id,
      [](const v1::GetJobReply& r) {
        return r.job().state() == v1::JOB_STATE_RUNNING && r.job().last_checkpoint().step() > 0 &&
               r.attempts_size() == 1 && r.attempts(0).placement_size() > 0 &&
               r.attempts(0).placement(r.attempts(0).placement_size() - 1).pid() > 0;
      },
      120));
  const v1::GetJobReply running = cp.Status(job_id);
  *pid = running.attempts(0).placement(rank).pid();
  EXPECT_EQ(kill(static_cast<pid_t>(*pid), SIGSTOP), 0);
  return Clock::now();
}

TEST(FailureDetectorChaosTest, StoppedRankOfATwoRankJobIsBlamedWithinSeconds) {
  ControlPlane cp("chaos_hang2");
  cp.StartServer({.local_agent = true, .local_slots = 2});
  const std::string job_id = cp.Submit(cp.WriteSpec(
      "job.yaml",
      TinySpec({.name = "stopped",
                .ranks_per_node = 2,
                .steps = 3000,
                .max_restarts = 2,
                .checkpoint = absl::StrCat("{dir: ", cp.dir(), "/ckpt, every_steps: 20}"),
                .fault_tolerance = kFastHangs})));
  int64_t stopped = 0;
  const Clock::time_point t0 = StopRankAfterACheckpoint(cp, job_id, 1, &stopped);
  ASSERT_TRUE(cp.WaitFor(
      job_id, [](const v1::GetJobReply& r) { return FailedAs(r, "hang"); }, 15))
      << "no hang found within 15 s";
  const double found = SecondsSince(t0);
  const v1::GetJobReply hung = cp.Status(job_id);
  const v1::FailureSummary& failure = hung.job().last_failure();
  EXPECT_EQ(failure.rank(), 1) << failure.cause();  // the stopped rank, not the one that noticed
  EXPECT_THAT(failure.cause(), HasSubstr("rank 1 on local"));
  EXPECT_THAT(failure.cause(), HasSubstr("rank 0 waited"));
  EXPECT_TRUE(failure.restarted());
  std::cout << "hang of a 2-rank job found " << found << " s after SIGSTOP; " << failure.cause()
            << std::endl;

  const ProcessResult watch = cp.Cli({"watch", job_id}, 300);
  EXPECT_EQ(watch.exit_code, 0) << watch.out << watch.err;
  const v1::GetJobReply done = cp.Status(job_id);
  EXPECT_EQ(done.job().state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(done.job().restarts(), 1);
  EXPECT_TRUE(ProcessGone(stopped)) << "the stopped rank was killed";
  // The second attempt resumed from the checkpoint, so some work was kept.
  const ProcessResult logs = cp.Cli({"logs", job_id, "--attempt", "2", "--rank", "0"});
  EXPECT_THAT(logs.out, HasSubstr("resumed from step"));
  EXPECT_TRUE(cp.WorkerPids().empty());
}

// With the default limits, a stopped rank of a 2-rank job that evaluates and checkpoints every
// 20 steps is found within 15 s, and status shows the limit in use.
TEST(FailureDetectorChaosTest, StoppedRankIsFoundWithinFifteenSecondsWithTheDefaults) {
  ControlPlane cp("chaos_hang_defaults");
  cp.StartServer({.local_agent = true, .local_slots = 2});
  const std::string job_id = cp.Submit(cp.WriteSpec(
      "job.yaml",
      TinySpec({.name = "defaults",
                .ranks_per_node = 2,
                .steps = 100000,
                .max_restarts = 2,
                .checkpoint = absl::StrCat("{dir: ", cp.dir(), "/ckpt, every_steps: 20}"),
                .fault_tolerance = "backoff_initial_s: 0.2",
                .eval_every = 20})));
  int64_t stopped = 0;
  const Clock::time_point t0 = StopRankAfterACheckpoint(cp, job_id, 1, &stopped);
  const v1::Job before = cp.Status(job_id).job();
  EXPECT_EQ(before.restarts(), 0) << "an evaluation or save was taken for a hang";
  EXPECT_GT(before.hang_limit_s(), 0);
  EXPECT_LE(before.hang_limit_s(), 10) << before.hang_limit_of();
  ASSERT_TRUE(cp.WaitFor(
      job_id, [](const v1::GetJobReply& r) { return FailedAs(r, "hang"); }, 15))
      << "no hang found within 15 s";
  const double found = SecondsSince(t0);
  const v1::FailureSummary failure = cp.Status(job_id).job().last_failure();
  EXPECT_EQ(failure.rank(), 1) << failure.cause();
  std::cout << "with the default limits, a stopped rank of a 2-rank job was found " << found
            << " s after SIGSTOP; " << failure.cause() << std::endl;
  EXPECT_EQ(cp.Cli({"cancel", job_id}).exit_code, 0);
  EXPECT_TRUE(cp.WaitFor(
      job_id, [](const v1::GetJobReply& r) { return r.job().state() == v1::JOB_STATE_CANCELLED; },
      60));
  EXPECT_TRUE(ProcessGone(stopped));
  EXPECT_TRUE(cp.WorkerPids().empty());
}

// Evaluations and checkpoint saves longer than the step's limit and the coordinator's slack are
// no hang: each phase has a limit of its own, and the ranks tell the coordinator when one begins.
TEST(FailureDetectorChaosTest, LongEvaluationsAndSavesAreNoHang) {
  ControlPlane cp("chaos_slow_phases");
  cp.StartServer({.local_agent = true,
                  .local_slots = 2,
                  .env = {"TRAINYARD_INJECT_SLOW_PHASE=evaluation:6,checkpoint:6"}});
  const std::string job_id = cp.Submit(cp.WriteSpec(
      "job.yaml",
      TinySpec({.name = "slow-phases",
                .ranks_per_node = 2,
                .steps = 40,
                .max_restarts = 2,
                .checkpoint = absl::StrCat("{dir: ", cp.dir(), "/ckpt, every_steps: 20}"),
                .fault_tolerance = kFastHangs,  // the step's limit: 2 s; the slack: 3 s
                .eval_every = 20})));
  std::string phase;
  EXPECT_TRUE(cp.WaitFor(
      job_id,
      [&phase](const v1::GetJobReply& r) {
        phase = r.job().hang_limit_of();
        return phase == "evaluation" || phase == "checkpoint save" ||
               r.job().state() == v1::JOB_STATE_SUCCEEDED;
      },
      120));
  EXPECT_TRUE(phase == "evaluation" || phase == "checkpoint save") << phase;
  const ProcessResult watch = cp.Cli({"watch", job_id}, 300);
  EXPECT_EQ(watch.exit_code, 0) << watch.out << watch.err;
  const v1::GetJobReply done = cp.Status(job_id);
  EXPECT_EQ(done.job().state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(done.job().restarts(), 0) << done.job().last_failure().cause();
  const ProcessResult logs = cp.Cli({"logs", job_id, "--rank", "0"});
  EXPECT_THAT(logs.out, HasSubstr("val loss"));
  EXPECT_THAT(logs.out, Not(HasSubstr("hang:")));
}

TEST(FailureDetectorChaosTest, StoppedOnlyRankIsFoundByTheCoordinator) {
  ControlPlane cp("chaos_hang1");
  cp.StartServer({.local_agent = true, .local_slots = 1});
  const std::string job_id = cp.Submit(cp.WriteSpec(
      "job.yaml",
      TinySpec({.name = "alone",
                .steps = 3000,
                .max_restarts = 1,
                .checkpoint = absl::StrCat("{dir: ", cp.dir(), "/ckpt, every_steps: 20}"),
                .fault_tolerance = kFastHangs})));
  int64_t stopped = 0;
  const Clock::time_point t0 = StopRankAfterACheckpoint(cp, job_id, 0, &stopped);
  ASSERT_TRUE(cp.WaitFor(
      job_id, [](const v1::GetJobReply& r) { return FailedAs(r, "hang"); }, 15))
      << "no hang found within 15 s";
  std::cout << "hang of a 1-rank job found " << SecondsSince(t0) << " s after SIGSTOP" << std::endl;
  const v1::GetJobReply hung = cp.Status(job_id);
  EXPECT_EQ(hung.job().last_failure().rank(), 0);
  EXPECT_THAT(hung.job().last_failure().cause(), HasSubstr("no step finished"));
  const ProcessResult watch = cp.Cli({"watch", job_id}, 300);
  EXPECT_EQ(watch.exit_code, 0) << watch.out << watch.err;
  EXPECT_EQ(cp.Status(job_id).job().state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_TRUE(ProcessGone(stopped));
}

TEST(FailureDetectorChaosTest, RankLoopingWithoutProgressIsBlamedByItsWatchdog) {
  ControlPlane cp("chaos_spin");
  cp.StartServer({.local_agent = false});
  // Rank 1 of every attempt spins forever in step 31.
  cp.StartAgent("node-a", 2, {"TRAINYARD_INJECT_SPIN=1:30"});
  const std::string job_id =
      cp.Submit(cp.WriteSpec("job.yaml", TinySpec({.name = "spinner",
                                                   .ranks_per_node = 2,
                                                   .steps = 3000,
                                                   .max_restarts = 0,
                                                   .fault_tolerance = kFastHangs})));
  const ProcessResult watch = cp.Cli({"watch", job_id}, 120);
  EXPECT_EQ(watch.exit_code, 1) << watch.out << watch.err;
  const v1::GetJobReply failed = cp.Status(job_id);
  EXPECT_EQ(failed.job().state(), v1::JOB_STATE_FAILED);
  const v1::FailureSummary& failure = failed.job().last_failure();
  EXPECT_EQ(failure.failure_class(), "hang");
  EXPECT_EQ(failure.rank(), 1) << failure.cause();
  EXPECT_THAT(failure.cause(), HasSubstr("outside any collective"));
  EXPECT_THAT(watch.out, HasSubstr("FAILED"));
  EXPECT_THAT(watch.out, HasSubstr("hang"));
  EXPECT_TRUE(cp.WorkerPids().empty());
}

TEST(FailureDetectorChaosTest, BadDataFailsAtOnceByRestartPolicyWithTheReason) {
  ControlPlane cp("chaos_bad_data");
  cp.StartServer({.local_agent = true, .local_slots = 1});
  const std::string missing = cp.dir() + "/no-such-shard.bin";
  const std::string spec = cp.WriteSpec(
      "job.yaml", TinySpec({.name = "nodata",
                            .max_restarts = 3,
                            .data = absl::StrCat("{source: bin, path: ", missing, "}")}));
  const Clock::time_point t0 = Clock::now();
  const ProcessResult watch = cp.Cli({"submit", spec, "--watch"}, 120);
  std::cout << "bad data: FAILED " << SecondsSince(t0) << " s after submission" << std::endl;
  EXPECT_EQ(watch.exit_code, 1) << watch.out << watch.err;
  EXPECT_THAT(watch.out, HasSubstr("FAILED"));
  EXPECT_THAT(watch.out, HasSubstr("user_error"));
  EXPECT_THAT(watch.out, HasSubstr(missing));  // the worker's own error, before exiting
  const std::string job_id = watch.out.substr(0, watch.out.find('\n'));
  const v1::GetJobReply reply = cp.Status(job_id);
  EXPECT_EQ(reply.job().state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(reply.job().attempts(), 1);  // no restart burned on an error no restart can fix
  EXPECT_EQ(reply.job().restarts(), 0);
  EXPECT_EQ(reply.job().last_failure().failure_class(), "user_error");
  const ProcessResult status = cp.Cli({"status", job_id});
  EXPECT_THAT(status.out, HasSubstr("exit code 2"));
  EXPECT_THAT(status.out, HasSubstr("failure"));
}

// Pins every thread of `pid` to `cpu`.
bool PinProcess(int64_t pid, int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  bool any = false;
  for (const auto& task :
       std::filesystem::directory_iterator(absl::StrCat("/proc/", pid, "/task"))) {
    const pid_t tid = static_cast<pid_t>(std::stol(task.path().filename().string()));
    any |= sched_setaffinity(tid, sizeof(set), &set) == 0;
  }
  return any;
}

TEST(FailureDetectorChaosTest, RankSlowedByCpuHogsIsAStraggler) {
  if (std::thread::hardware_concurrency() < 2) GTEST_SKIP() << "needs 2 CPUs to slow one rank";
  ControlPlane cp("chaos_straggler");
  cp.StartServer({.local_agent = true, .local_slots = 2});
  const std::string job_id = cp.Submit(cp.WriteSpec(
      "job.yaml", TinySpec({.name = "uneven",
                            .ranks_per_node = 2,
                            .steps = 100000,
                            .max_restarts = 0,
                            .fault_tolerance = "straggler_margin: 0.5, straggler_window: 5",
                            .batch_per_rank = 16})));
  ASSERT_TRUE(cp.WaitForStep(job_id, 20, 120));
  const v1::GetJobReply running = cp.Status(job_id);
  ASSERT_TRUE(PinProcess(running.attempts(0).placement(0).pid(), 0));
  ASSERT_TRUE(PinProcess(running.attempts(0).placement(1).pid(), 1));
  // Eight spinning processes share rank 1's CPU: it computes at about a ninth of its speed, far
  // past the margin even when other work also loads rank 0's CPU.
  std::vector<pid_t> hogs;
  for (int i = 0; i < 8; ++i) {
    const pid_t hog = fork();
    if (hog == 0) {
      cpu_set_t set;
      CPU_ZERO(&set);
      CPU_SET(1, &set);
      sched_setaffinity(0, sizeof(set), &set);
      volatile uint64_t spin = 0;
      for (;;) spin = spin + 1;
    }
    hogs.push_back(hog);
  }
  const bool flagged = cp.WaitFor(
      job_id, [](const v1::GetJobReply& r) { return r.job().stragglers_size() > 0; }, 90);
  // Read while the hogs still run: once they stop, rank 1 catches up and its score falls back
  // within the window (under a loaded machine it was read at 1.46 after the kill).
  const v1::GetJobReply reply = cp.Status(job_id);
  const ProcessResult status = cp.Cli({"status", job_id});
  for (pid_t hog : hogs) {
    kill(hog, SIGKILL);
    waitpid(hog, nullptr, 0);
  }
  ASSERT_TRUE(flagged) << "no straggler flagged within 90 s";
  ASSERT_GT(reply.job().stragglers_size(), 0);
  EXPECT_EQ(reply.job().stragglers(0).rank(), 1);
  EXPECT_GT(reply.job().stragglers(0).score(), 1.5);
  EXPECT_THAT(status.out, HasSubstr("straggler   rank 1 on local"));
  EXPECT_EQ(cp.Cli({"cancel", job_id}).exit_code, 0);
  EXPECT_TRUE(cp.WaitFor(
      job_id, [](const v1::GetJobReply& r) { return r.job().state() == v1::JOB_STATE_CANCELLED; },
      60));
}

// SIGKILLs attempt `attempt` of the job's rank 0 once it runs.
void KillRunningAttempt(ControlPlane& cp, const std::string& job_id, int attempt) {
  ASSERT_TRUE(cp.WaitFor(
      job_id,
      [attempt](const v1::GetJobReply& r) {
        return r.attempts_size() == attempt && r.job().state() == v1::JOB_STATE_RUNNING &&
               r.attempts(attempt - 1).placement(0).pid() > 0;
      },
      120))
      << "attempt " << attempt;
  const v1::GetJobReply running = cp.Status(job_id);
  ASSERT_EQ(kill(static_cast<pid_t>(running.attempts(attempt - 1).placement(0).pid()), SIGKILL), 0);
}

// Failures that would cordon the only node do not (the job would be stranded), and the job goes
// on there; once a second node is connected, the same count of failures cordons the first, the
// next attempt runs on the second, and `nodes uncordon` lifts the cordon.
TEST(FailureDetectorChaosTest, NodeWhereAttemptsKeepFailingIsCordonedByPolicy) {
  ControlPlane cp("chaos_cordon");
  cp.StartServer({.local_agent = false,
                  .extra_args = {"--quarantine-failures", "2", "--quarantine-window", "600",
                                 "--quarantine-cooldown", "3600"}});
  cp.StartAgent("node-a", 1);
  const std::string job_id =
      cp.Submit(cp.WriteSpec("job.yaml", TinySpec({.name = "unlucky",
                                                   .steps = 100000,
                                                   .max_restarts = 5,
                                                   .fault_tolerance = "backoff_initial_s: 0.1"})));
  for (int attempt = 1; attempt <= 2; ++attempt) KillRunningAttempt(cp, job_id, attempt);
  // The only node: not cordoned, and the third attempt runs there.
  ASSERT_TRUE(cp.WaitFor(
      job_id,
      [](const v1::GetJobReply& r) {
        return r.attempts_size() == 3 && r.job().state() == v1::JOB_STATE_RUNNING;
      },
      60));
  EXPECT_THAT(cp.Cli({"nodes"}).out, ::testing::Not(HasSubstr("cordoned until")));
  EXPECT_THAT(cp.Cli({"status", job_id}).out, HasSubstr("no other connected node can run job"));

  cp.StartAgent("node-b", 1);
  for (int attempt = 3; attempt <= 4; ++attempt) KillRunningAttempt(cp, job_id, attempt);
  // node-a is cordoned now that node-b could run the job: the fifth attempt goes there.
  ASSERT_TRUE(cp.WaitFor(
      job_id,
      [](const v1::GetJobReply& r) {
        return r.attempts_size() == 5 && r.attempts(4).placement(0).node_id() == "node-b";
      },
      60));
  const ProcessResult nodes = cp.Cli({"nodes"});
  EXPECT_THAT(nodes.out, HasSubstr("cordoned until"));
  EXPECT_THAT(nodes.out, HasSubstr("2 failures"));
  const ProcessResult lifted = cp.Cli({"nodes", "uncordon", "node-a"});
  EXPECT_EQ(lifted.exit_code, 0) << lifted.out << lifted.err;
  EXPECT_THAT(lifted.out, HasSubstr("node-a uncordoned"));
  EXPECT_EQ(cp.Cli({"nodes", "uncordon", "node-a"}).exit_code, 2);  // not cordoned any more
  EXPECT_THAT(cp.Cli({"nodes"}).out, ::testing::Not(HasSubstr("cordoned until")));
  EXPECT_EQ(cp.Cli({"cancel", job_id}).exit_code, 0);
  EXPECT_TRUE(cp.WaitFor(
      job_id, [](const v1::GetJobReply& r) { return r.job().state() == v1::JOB_STATE_CANCELLED; },
      60));
}

}  // namespace
}  // namespace trainyard::testenv
