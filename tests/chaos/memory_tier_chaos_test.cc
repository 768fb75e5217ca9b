// The memory tier with real processes: a worker killed with SIGKILL costs at most the snapshot
// in flight (the new attempt resumes from its node's memory, not from the far older checkpoint
// on disk, within two steps of the last one logged), at context and expert parallelism too, and
// over three nodes, where no node holds every rank and each gathers the ranks it lacks from the
// others; a whole node lost (agent and worker killed) resumes from the copy its peer node holds,
// on the survivors alone, over two nodes and over three; an agent restarted under its workers
// takes their snapshots again and copies them to its peer node again; and an agent whose budget
// is too small refuses the reservation with an event while the job goes on.
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <iostream>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/controlplane_util.h"

namespace trainyard::testenv {
namespace {

using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

// The last "step N/M" line of a rank-0 log; -1 when none.
int64_t LastLoggedStep(const std::string& log) {
  int64_t last = -1;
  const std::regex line("step +([0-9]+)/[0-9]+ \\|");
  for (auto it = std::sregex_iterator(log.begin(), log.end(), line); it != std::sregex_iterator();
       ++it) {
    last = std::stoll((*it)[1].str());
  }
  return last;
}

// The "resumed" event of `attempt`; empty when there is none (yet).
std::string ResumedCause(const v1::GetJobReply& reply, int attempt) {
  for (const v1::Event& event : reply.events()) {
    if (event.kind() == "resumed" && event.attempt_id() == attempt) return event.cause();
  }
  return "";
}

int64_t ResumedStep(const std::string& cause) {
  std::smatch m;
  if (!std::regex_search(cause, m, std::regex("resumed from step ([0-9]+)"))) return -1;
  return std::stoll(m[1].str());
}

// dp 2 over `nodes` nodes (dp 3 over three), every step logged and snapshotted in memory (not
// `auto`, which would space them out on this tiny model), a checkpoint on disk only every 1000
// steps; over two nodes or more it may shrink, and does not grow back within the test.
std::string MemoryJob(const std::string& name, const std::string& dir, int nodes) {
  std::string spec = TinySpec(
      {.name = name,
       .nodes = nodes,
       .ranks_per_node = std::max(1, 2 / nodes),
       .steps = 1200,
       .max_restarts = 2,
       .checkpoint = absl::StrCat("{dir: ", dir, ", every_steps: 1000}"),
       .fault_tolerance = absl::StrCat(nodes > 1 ? "min_nodes: 1, resize_cooldown_s: 600, " : "",
                                       "backoff_initial_s: 0, memory_every_steps: 1")});
  return absl::StrReplaceAll(spec, {{"log_every: 10", "log_every: 1"}});
}

double ReferenceLoss(ControlPlane& cp, int nodes) {
  const std::string reference =
      cp.Submit(cp.WriteSpec("reference.yaml", MemoryJob("reference", cp.dir() + "/ref", nodes)));
  const ProcessResult watch = cp.Cli({"watch", reference}, 300);
  EXPECT_EQ(watch.exit_code, 0) << watch.out << watch.err;
  return ExactFinalLoss(cp.Cli({"logs", reference, "--rank", "0"}).out);
}

// Waits for attempt 2 to report where it resumed; its event's cause.
std::string WaitForResumedAttempt2(ControlPlane& cp, const std::string& job_id) {
  std::string cause;
  cp.WaitFor(
      job_id,
      [&cause](const v1::GetJobReply& r) {
        cause = ResumedCause(r, 2);
        return !cause.empty();
      },
      30);
  return cause;
}

TEST(MemoryTierChaosTest, WorkerKillResumesFromTheInterruptedStepInMemory) {
  ControlPlane cp("chaos_memory_worker");
  cp.StartServer({.local_agent = false});
  cp.StartAgent("node-a", 2);
  const double want = ReferenceLoss(cp, 1);
  ASSERT_FALSE(std::isnan(want));

  const std::string job_id =
      cp.Submit(cp.WriteSpec("job.yaml", MemoryJob("job", cp.dir() + "/ckpt", 1)));
  ASSERT_TRUE(cp.WaitForStep(job_id, 300, 120));
  const v1::GetJobReply running = cp.Status(job_id);
  ASSERT_EQ(running.attempts_size(), 1);
  ASSERT_EQ(running.attempts(0).placement_size(), 2);
  const Clock::time_point killed = Clock::now();
  ASSERT_EQ(kill(static_cast<pid_t>(running.attempts(0).placement(1).pid()), SIGKILL), 0);

  const std::string cause = WaitForResumedAttempt2(cp, job_id);
  ASSERT_FALSE(cause.empty()) << cp.Cli({"status", job_id}).out;
  std::cout << "attempt 2 reported where it resumed "
            << std::chrono::duration<double>(Clock::now() - killed).count()
            << " s after the kill: " << cause << std::endl;
  EXPECT_THAT(cause, HasSubstr("memory tier"));
  const int64_t interrupted =
      LastLoggedStep(cp.Cli({"logs", job_id, "--attempt", "1", "--rank", "0"}).out);
  const int64_t resumed = ResumedStep(cause);
  EXPECT_GE(interrupted, 300);
  // Each rank writes one snapshot at a time (the next save waits for the last): a kill that
  // lands after step L's collectives but before the rank saved L, while its snapshot of L − 1 is
  // still being written (a loaded machine writes slower than it steps), leaves L − 2 as the
  // newest snapshot every rank committed.
  EXPECT_GE(resumed, interrupted - 2) << "more than the snapshot in flight lost";
  EXPECT_LE(resumed, interrupted);

  const ProcessResult watch = cp.Cli({"watch", job_id}, 300);
  EXPECT_EQ(watch.exit_code, 0) << watch.out << watch.err;
  const double got = ExactFinalLoss(cp.Cli({"logs", job_id, "--attempt", "2", "--rank", "0"}).out);
  EXPECT_NEAR(got, want, 1e-4 * std::abs(want)) << "uninterrupted " << want << ", resumed " << got;
}

// Runs `job(name, dir)` uninterrupted, then again with rank 1 SIGKILLed after `kill_after`
// steps: the new attempt resumes from the node's memory and ends at the uninterrupted run's exact
// loss.
void ExpectResumesFromMemoryToTheExactLoss(
    ControlPlane& cp, const std::function<std::string(const std::string&, const std::string&)>& job,
    int64_t kill_after) {
  const std::string reference =
      cp.Submit(cp.WriteSpec("reference.yaml", job("reference", cp.dir() + "/ref")));
  const ProcessResult uninterrupted = cp.Cli({"watch", reference}, 300);
  ASSERT_EQ(uninterrupted.exit_code, 0) << uninterrupted.out << uninterrupted.err;
  const double want = ExactFinalLoss(cp.Cli({"logs", reference, "--rank", "0"}).out);
  ASSERT_FALSE(std::isnan(want));

  const std::string job_id = cp.Submit(cp.WriteSpec("job.yaml", job("job", cp.dir() + "/ckpt")));
  ASSERT_TRUE(cp.WaitForStep(job_id, kill_after, 120));
  const v1::GetJobReply running = cp.Status(job_id);
  ASSERT_GE(running.attempts(0).placement_size(), 2);
  ASSERT_EQ(kill(static_cast<pid_t>(running.attempts(0).placement(1).pid()), SIGKILL), 0);
  const std::string cause = WaitForResumedAttempt2(cp, job_id);
  ASSERT_FALSE(cause.empty()) << cp.Cli({"status", job_id}).out;
  std::cout << "attempt 2: " << cause << std::endl;
  EXPECT_THAT(cause, HasSubstr("memory tier"));
  EXPECT_GE(ResumedStep(cause), kill_after);

  const ProcessResult watch = cp.Cli({"watch", job_id}, 300);
  EXPECT_EQ(watch.exit_code, 0) << watch.out << watch.err;
  const double got = ExactFinalLoss(cp.Cli({"logs", job_id, "--attempt", "2", "--rank", "0"}).out);
  EXPECT_NEAR(got, want, 1e-4 * std::abs(want)) << "uninterrupted " << want << ", resumed " << got;
}

// dp 1 × cp 2: both ranks hold every parameter (replicated over the cp ranks as over dp ones)
// and each its own half of every sequence.
TEST(MemoryTierChaosTest, ContextParallelJobResumesFromMemoryToTheExactLoss) {
  ControlPlane cp("chaos_memory_cp");
  cp.StartServer({.local_agent = false});
  cp.StartAgent("node-a", 2);
  ExpectResumesFromMemoryToTheExactLoss(
      cp,
      [](const std::string& name, const std::string& dir) {
        return absl::StrReplaceAll(MemoryJob(name, dir, 1),
                                   {{"parallelism: {dp: 2}", "parallelism: {dp: 1, cp: 2}"},
                                    {"steps: 1200", "steps: 400"}});
      },
      100);
}

// A mixture of experts with dp 2 × ep 2: each rank's snapshot holds its own two of the four
// experts of every block (and the router's selection state), which the resumed ranks reload.
TEST(MemoryTierChaosTest, ExpertParallelJobResumesFromMemoryToTheExactLoss) {
  ControlPlane cp("chaos_memory_ep");
  cp.StartServer({.local_agent = false});
  cp.StartAgent("node-a", 2);
  ExpectResumesFromMemoryToTheExactLoss(
      cp,
      [](const std::string& name, const std::string& dir) {
        return absl::StrReplaceAll(
            MemoryJob(name, dir, 1),
            {{"model: {preset: gpt2-debug}",
              "model: {preset: gpt2-debug, moe: {experts: 4, top_k: 2, balance: bias}}"},
             {"parallelism: {dp: 2}", "parallelism: {dp: 2, ep: 2}"},
             {"steps: 1200", "steps: 400"}});
      },
      100);
}

// Three nodes of one rank each: every node holds its own rank and its predecessor's copies, never
// a whole snapshot, so each node's agent fetches the rank it lacks from the node that holds it.
TEST(MemoryTierChaosTest, ThreeNodeJobResumesFromMemoryGatheredAcrossTheNodes) {
  ControlPlane cp("chaos_memory_three");
  cp.StartServer({.local_agent = false});
  for (const char* node : {"node-a", "node-b", "node-c"}) cp.StartAgent(node, 1);
  ExpectResumesFromMemoryToTheExactLoss(
      cp,
      [](const std::string& name, const std::string& dir) {
        return absl::StrReplaceAll(MemoryJob(name, dir, 3), {{"steps: 1200", "steps: 400"}});
      },
      100);
}

// Runs MemoryJob over `nodes` nodes of one rank each (snapshots every `every` steps), loses the
// last node (worker and agent killed) after step 300: the job goes on without it from memory, the
// lost rank's state from the copy its successor holds, at most `lag` steps behind where rank 0
// stopped, and ends at the uninterrupted run's loss.
void ExpectALostNodeResumesFromMemory(int nodes, const std::string& every, int64_t lag) {
  ControlPlane cp(absl::StrCat("chaos_memory_node", nodes));
  cp.StartServer({.local_agent = false});
  std::vector<std::string> names;
  for (int n = 0; n < nodes; ++n) {
    names.push_back(absl::StrCat("node-", std::string(1, static_cast<char>('a' + n))));
    cp.StartAgent(names.back(), 1);
  }
  const auto job = [&](const std::string& name, const std::string& dir) {
    return absl::StrReplaceAll(MemoryJob(name, dir, nodes),
                               {{"memory_every_steps: 1", "memory_every_steps: " + every}});
  };
  const std::string reference =
      cp.Submit(cp.WriteSpec("reference.yaml", job("reference", cp.dir() + "/ref")));
  ASSERT_EQ(cp.Cli({"watch", reference}, 300).exit_code, 0);
  const double want = ExactFinalLoss(cp.Cli({"logs", reference, "--rank", "0"}).out);
  ASSERT_FALSE(std::isnan(want));

  const std::string job_id = cp.Submit(cp.WriteSpec("job.yaml", job("job", cp.dir() + "/ckpt")));
  ASSERT_TRUE(cp.WaitForStep(job_id, 300, 120));
  const v1::GetJobReply running = cp.Status(job_id);
  ASSERT_EQ(running.attempts_size(), 1);
  const std::string& lost = names.back();
  int64_t lost_worker = 0;
  for (const auto& p : running.attempts(0).placement()) {
    if (p.node_id() == lost) lost_worker = p.pid();
  }
  ASSERT_GT(lost_worker, 0) << running.DebugString();
  // The whole node goes: its worker and its agent.
  const Clock::time_point killed = Clock::now();
  ASSERT_EQ(kill(static_cast<pid_t>(lost_worker), SIGKILL), 0);
  cp.KillAgent(lost);

  ASSERT_TRUE(cp.WaitFor(
      job_id,
      [nodes](const v1::GetJobReply& r) {
        return r.job().state() == v1::JOB_STATE_RUNNING && r.attempts_size() == 2 &&
               r.attempts(1).placement_size() == nodes - 1;
      },
      20))
      << "no " << nodes - 1 << "-rank attempt running within 20 s of losing " << lost;
  const std::string cause = WaitForResumedAttempt2(cp, job_id);
  ASSERT_FALSE(cause.empty()) << cp.Cli({"status", job_id}).out;
  const int64_t interrupted =
      LastLoggedStep(cp.Cli({"logs", job_id, "--attempt", "1", "--rank", "0"}).out);
  const int64_t resumed = ResumedStep(cause);
  std::cout << "attempt 2 (" << nodes - 1 << " ranks) reported where it resumed "
            << std::chrono::duration<double>(Clock::now() - killed).count() << " s after " << lost
            << " was killed (rank 0 had logged step " << interrupted << "): " << cause << std::endl;
  EXPECT_THAT(cause, HasSubstr("memory tier"));
  // No checkpoint on disk yet (every 1000 steps): all of it came from memory.
  EXPECT_LT(interrupted, 1000);
  EXPECT_GT(resumed, 0);
  EXPECT_GE(resumed, interrupted - lag);
  EXPECT_LE(resumed, interrupted);

  const ProcessResult watch = cp.Cli({"watch", job_id}, 300);
  EXPECT_EQ(watch.exit_code, 0) << watch.out << watch.err;
  const double got = ExactFinalLoss(cp.Cli({"logs", job_id, "--attempt", "2", "--rank", "0"}).out);
  EXPECT_NEAR(got, want, 1e-4 * std::abs(want)) << "uninterrupted " << want << ", shrunk " << got;
}

// Two nodes, a snapshot every step: the survivor holds the lost node's copy and its own of the
// same step. The peer copy trails the snapshot it copies (one per step) by the time a copy takes:
// a few steps of this tiny model on an idle machine, but 11 and 20 steps in two runs of the whole
// suite on a loaded 2-core machine (a step takes milliseconds). 50 steps still tells a recent
// copy from a stale one; the exact final loss tells that it was whole.
TEST(MemoryTierChaosTest, LostNodeResumesFromThePeerCopyOnTheSurvivor) {
  ExpectALostNodeResumesFromMemory(2, "1", 50);
}

// Three nodes, a snapshot every step, while a copy takes several: the ranks copy only the
// snapshots no earlier copy is still under way for, the same steps on every node, and every node
// keeps the two newest copied steps. So the lost node's successor holds its copy of a step the
// two survivors hold their own ranks of, however many snapshots were kept local since.
TEST(MemoryTierChaosTest, ThreeNodeJobLosingANodeResumesFromMemory) {
  ExpectALostNodeResumesFromMemory(3, "1", 100);
}

// The newest step of which `tier_job_dir` (a node's tier folder of one job) holds a snapshot of
// attempt 1 with the manifests of every rank in `ranks`; -1 when none.
int64_t NewestSnapshotOf(const std::string& tier_job_dir, const std::vector<int>& ranks) {
  int64_t newest = -1;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(tier_job_dir, error)) {
    std::smatch m;
    const std::string name = entry.path().filename().string();
    if (!std::regex_match(name, m, std::regex("a0001-step-([0-9]+)"))) continue;
    const bool whole = std::all_of(ranks.begin(), ranks.end(), [&](int rank) {
      return std::filesystem::exists(entry.path() / absl::StrFormat("rank-%05d.json", rank), error);
    });
    if (whole) newest = std::max<int64_t>(newest, std::stoll(m[1].str()));
  }
  return newest;
}

// Waits up to 90 s for a snapshot of `ranks` in `tier_job_dir` at step `at_least` or later; its
// step, or the newest one held when none came.
int64_t WaitForSnapshotOf(const std::string& tier_job_dir, const std::vector<int>& ranks,
                          int64_t at_least) {
  const Clock::time_point start = Clock::now();
  int64_t snapshot = NewestSnapshotOf(tier_job_dir, ranks);
  while (snapshot < at_least && Clock::now() - start < std::chrono::seconds(90)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    snapshot = NewestSnapshotOf(tier_job_dir, ranks);
  }
  return snapshot;
}

// Starts `node`'s agent again after KillAgent and waits until its memory tier has started (and
// so cleared its folder of what the old agent's workers wrote meanwhile, which it never took).
void StartAgentAgain(ControlPlane& cp, const std::string& node, int slots) {
  cp.StartAgent(node, slots);
  const std::string log = cp.dir() + "/agent-" + node + ".err";
  const auto tiers_started = [&log] {
    const std::string text = ReadWholeFile(log);
    int started = 0;
    for (size_t at = text.find("peers reach it at"); at != std::string::npos;
         at = text.find("peers reach it at", at + 1)) {
      ++started;
    }
    return started;
  };
  const Clock::time_point start = Clock::now();
  while (tiers_started() < 2 && Clock::now() - start < std::chrono::seconds(20)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_GE(tiers_started(), 2) << "the memory tier of " << node << "'s new agent did not start";
}

// An agent killed under its running workers and started again within the heartbeat timeout
// adopts them, with an empty tier on the port it had. It refuses their snapshots (it holds no
// reservation for them) until they pause, reserve their room again and snapshot on, so a worker
// killed later resumes from memory at a step after the restart. (The job has nothing on disk:
// without the snapshots it would start again from step 0.)
TEST(MemoryTierChaosTest, AgentRestartedUnderItsWorkersTakesTheirSnapshotsAgain) {
  ControlPlane cp("chaos_memory_agent_restart");
  cp.StartServer({.local_agent = false});
  cp.StartAgent("node-a", 2);
  const std::string job_id = cp.Submit(cp.WriteSpec(
      "job.yaml",
      TinySpec({.name = "job",
                .ranks_per_node = 2,
                .steps = 1000000,
                .max_restarts = 1,
                .checkpoint = absl::StrCat("{dir: ", cp.dir(), "/ckpt, every_steps: 1000000}"),
                .fault_tolerance = "backoff_initial_s: 0, memory_every_steps: 1"})));
  ASSERT_TRUE(cp.WaitForStep(job_id, 20, 120));
  const std::vector<int64_t> pids = cp.WorkerPids();
  ASSERT_EQ(pids.size(), 2u);
  cp.KillAgent("node-a");
  const int64_t restarted_after = cp.Status(job_id).job().progress().step();
  ASSERT_NO_FATAL_FAILURE(StartAgentAgain(cp, "node-a", 2));
  const Clock::time_point restarted = Clock::now();
  // A snapshot of both ranks, well after the restart, in the new agent's tier.
  const int64_t snapshot =
      WaitForSnapshotOf(cp.dir() + "/tier-node-a/" + job_id, {0, 1}, restarted_after + 20);
  ASSERT_GE(snapshot, restarted_after + 20) << "no snapshot after the agent's restart";
  std::cout << "snapshots of step " << snapshot << " in the restarted agent's tier "
            << std::chrono::duration<double>(Clock::now() - restarted).count()
            << " s after it started" << std::endl;
  const v1::GetJobReply running = cp.Status(job_id);
  ASSERT_EQ(running.attempts_size(), 1) << "the workers were not adopted";
  EXPECT_EQ(cp.WorkerPids(), pids);
  ASSERT_EQ(kill(static_cast<pid_t>(pids[1]), SIGKILL), 0);

  const std::string cause = WaitForResumedAttempt2(cp, job_id);
  ASSERT_FALSE(cause.empty()) << cp.Cli({"status", job_id}).out;
  EXPECT_THAT(cause, HasSubstr("memory tier"));
  EXPECT_GT(ResumedStep(cause), restarted_after) << cause;
  EXPECT_EQ(cp.Cli({"cancel", job_id}).exit_code, 0);
}

// Over two nodes, an agent restarted under its worker also copies that worker's snapshots to the
// other node again (the registration's answer names the peer its start order did). So when the
// whole node is lost later, the job resumes on the survivor from a copy made after the restart.
TEST(MemoryTierChaosTest, AgentRestartedOnOneOfTwoNodesCopiesItsWorkersSnapshotsAgain) {
  ControlPlane cp("chaos_memory_agent_restart_peer");
  cp.StartServer({.local_agent = false});
  cp.StartAgent("node-a", 1);
  cp.StartAgent("node-b", 1);
  const std::string job_id = cp.Submit(cp.WriteSpec(
      "job.yaml", absl::StrReplaceAll(MemoryJob("job", cp.dir() + "/ckpt", 2),
                                      {{"steps: 1200", "steps: 1000000"},
                                       {"every_steps: 1000", "every_steps: 1000000"}})));
  ASSERT_TRUE(cp.WaitForStep(job_id, 20, 120));
  const v1::GetJobReply running = cp.Status(job_id);
  ASSERT_EQ(running.attempts_size(), 1);
  int restarted_rank = -1;
  int64_t restarted_worker = 0;
  for (const auto& p : running.attempts(0).placement()) {
    if (p.node_id() != "node-a") continue;
    restarted_rank = p.rank();
    restarted_worker = p.pid();
  }
  ASSERT_GE(restarted_rank, 0) << running.DebugString();
  const std::string copies = cp.dir() + "/tier-node-b/" + job_id;
  ASSERT_GT(WaitForSnapshotOf(copies, {restarted_rank}, 1), 0) << "no copy before the restart";
  cp.KillAgent("node-a");
  // The newest copy the old agent sent (the coordinator's step may trail it: progress comes in
  // batches).
  const int64_t restarted_after = NewestSnapshotOf(copies, {restarted_rank});
  ASSERT_NO_FATAL_FAILURE(StartAgentAgain(cp, "node-a", 1));
  const Clock::time_point restarted = Clock::now();
  // node-a's rank, copied to node-b well after the restart.
  const int64_t copy = WaitForSnapshotOf(copies, {restarted_rank}, restarted_after + 20);
  ASSERT_GE(copy, restarted_after + 20) << "no copy of rank " << restarted_rank << " on node-b";
  std::cout << "copy of step " << copy << " on node-b "
            << std::chrono::duration<double>(Clock::now() - restarted).count()
            << " s after node-a's agent started again (the old one's last: step " << restarted_after
            << ")" << std::endl;
  ASSERT_EQ(cp.Status(job_id).attempts_size(), 1) << "the workers were not adopted";

  // The whole node goes: its worker and its agent.
  ASSERT_EQ(kill(static_cast<pid_t>(restarted_worker), SIGKILL), 0);
  cp.KillAgent("node-a");
  const std::string cause = WaitForResumedAttempt2(cp, job_id);
  ASSERT_FALSE(cause.empty()) << cp.Cli({"status", job_id}).out;
  EXPECT_THAT(cause, HasSubstr("memory tier"));
  EXPECT_GT(ResumedStep(cause), restarted_after) << cause;
  EXPECT_EQ(cp.Cli({"cancel", job_id}).exit_code, 0);
}

TEST(MemoryTierChaosTest, ReservationOverTheBudgetIsRefusedWithAnEventAndTheJobGoesOn) {
  ControlPlane cp("chaos_memory_budget");
  cp.StartServer({.local_agent = false});
  // The tiny model's state is about 1.2 MiB a rank: three snapshots do not fit in 1 MiB.
  cp.StartAgent("node-a", 1, {}, {"--memory-tier-mb", "1"});
  const std::string job_id = cp.Submit(
      cp.WriteSpec("job.yaml", TinySpec({.name = "budget", .steps = 30, .checkpoint = ""})));
  const ProcessResult watch = cp.Cli({"watch", job_id}, 120);
  EXPECT_EQ(watch.exit_code, 0) << watch.out << watch.err;
  std::string notice;
  const v1::GetJobReply done = cp.Status(job_id);
  for (const v1::Event& event : done.events()) {
    if (event.kind() == "memory_tier") notice += event.cause();
  }
  EXPECT_THAT(notice, HasSubstr("memory tier of node-a refused rank 0"));
  EXPECT_THAT(notice, HasSubstr("budget"));
}

}  // namespace
}  // namespace trainyard::testenv
