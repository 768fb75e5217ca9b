// Checkpoints through the control plane on loopback: trainyard-server with its local agent, real
// workers and the trainyard CLI. A rank killed with SIGKILL costs the job only the steps since
// the checkpoint the coordinator recorded, and the restarted job ends with exactly the loss of a
// run nobody killed; `checkpoints` and `status` show the saves; `drain` stops a job at a
// checkpoint that a resubmitted spec continues from, and so do SIGTERM to a rank and, with
// --drain-on-stop, to the coordinator; a bad resume_from is a clear failure.
#include <google/protobuf/util/json_util.h>
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <regex>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/controlplane_util.h"
#include "tests/integration/test_env.h"

namespace trainyard::testenv {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;

// Long enough to be killed or drained midway even unloaded (4 ms a step for two ranks of this
// model; a progress report, which carries checkpoints and drain orders, every 500 ms), short
// enough to train four times in a test on a loaded 2-core machine (15 ms a step).
constexpr int kSteps = 400;

// The memory tier is off: these tests are about the disk tier (tests/chaos/memory_tier_chaos_test
// covers restarts from memory).
TinyJob Job(const std::string& name, const std::string& checkpoint) {
  return {.name = name,
          .ranks_per_node = 2,
          .steps = kSteps,
          .checkpoint = checkpoint,
          .fault_tolerance = "memory_every_steps: 0"};
}

// "exact final loss 0x1.0d5f...p+1" from a rank-0 log's `done:` line; "" when absent.
std::string ExactFinalLoss(const std::string& log) {
  std::smatch m;
  return std::regex_search(log, m, std::regex("exact final loss (\\S+)")) ? m[1].str() : "";
}

// The exact final loss of the 2-rank spec without a checkpoint section, trained uninterrupted as
// a job of `cp`. (Not the standalone worker's: agents start workers with a minimal environment,
// so OPENBLAS_* variables of the test's environment, which select other GEMM kernels, reach the
// standalone run only.)
std::string UninterruptedLoss(ControlPlane& cp) {
  const ProcessResult run =
      cp.Cli({"submit", cp.WriteSpec("plain.yaml", TinySpec(Job("ck", ""))), "--watch"}, 180);
  EXPECT_EQ(run.exit_code, 0) << run.out << run.err;
  const std::string job_id = run.out.substr(0, run.out.find('\n'));
  return ExactFinalLoss(cp.Cli({"logs", job_id, "--rank", "0"}).out);
}

struct Resumed {
  int64_t step = -1;  // -1: the log has no "resumed from" line
  std::string path;
};

Resumed ResumedFrom(const std::string& log) {
  std::smatch m;
  if (!std::regex_search(log, m, std::regex("resumed from step (\\d+): (\\S+)"))) return {};
  return {std::stoll(m[1].str()), m[2].str()};
}

bool IsCommittedCheckpoint(const std::string& path) {
  return !path.empty() && fs::is_directory(path) &&
         fs::is_regular_file(fs::path(path) / "manifest.json");
}

v1::ListCheckpointsReply CheckpointsOf(ControlPlane& cp, const std::string& job_id) {
  const ProcessResult listed = cp.Cli({"checkpoints", job_id, "--json"}, 30);
  EXPECT_EQ(listed.exit_code, 0) << listed.err;
  v1::ListCheckpointsReply reply;
  const auto parsed = google::protobuf::util::JsonStringToMessage(listed.out, &reply);
  EXPECT_TRUE(parsed.ok()) << parsed.ToString() << ": " << listed.out;
  return reply;
}

// The newest (by step) committed checkpoint among `reply`'s, of `attempt_id` unless it is 0.
v1::Checkpoint NewestCommitted(const v1::ListCheckpointsReply& reply, int attempt_id = 0) {
  v1::Checkpoint newest;
  for (const v1::Checkpoint& c : reply.checkpoints()) {
    if (c.state() != v1::CHECKPOINT_STATE_COMMITTED) continue;
    if (attempt_id != 0 && c.attempt_id() != attempt_id) continue;
    if (newest.path().empty() || c.step() > newest.step()) newest = c;
  }
  return newest;
}

bool Final(const v1::GetJobReply& r) {
  const v1::JobState s = r.job().state();
  return s == v1::JOB_STATE_SUCCEEDED || s == v1::JOB_STATE_FAILED ||
         s == v1::JOB_STATE_CANCELLED || s == v1::JOB_STATE_DRAINED;
}

TEST(ControlPlaneCheckpointTest, KilledRankResumesFromTheRecordedCheckpointWithTheExactLoss) {
  ControlPlane cp("cp_ck_kill");
  cp.StartServer({.local_agent = true, .local_slots = 2});
  const std::string want = UninterruptedLoss(cp);
  ASSERT_FALSE(want.empty());
  const std::string ck = cp.dir() + "/ck";
  constexpr int64_t kEvery = 25;  // checkpoint.every_steps
  const std::string job_id = cp.Submit(cp.WriteSpec(
      "job.yaml",
      TinySpec(Job("ck", absl::StrCat("{dir: ", ck, ", every_steps: ", kEvery, ", keep: 2}")))));
  ASSERT_FALSE(job_id.empty());

  // A committed checkpoint the coordinator knows of, then rank 1 of the first attempt dies.
  ASSERT_TRUE(cp.WaitFor(
      job_id,
      [](const v1::GetJobReply& r) {
        return r.job().state() == v1::JOB_STATE_RUNNING && r.job().last_checkpoint().step() > 0 &&
               r.attempts_size() == 1 && r.attempts(0).placement_size() == 2 &&
               r.attempts(0).placement(1).pid() > 0;
      },
      120))
      << cp.Cli({"status", job_id}).out;
  const v1::GetJobReply before = cp.Status(job_id);
  const int64_t recorded_before_kill = before.job().last_checkpoint().step();
  const int64_t rank1 = before.attempts(0).placement(1).pid();
  ASSERT_LT(recorded_before_kill, kSteps);
  ASSERT_EQ(kill(static_cast<pid_t>(rank1), SIGKILL), 0) << rank1;
  std::printf("killed rank 1 at step %lld, the recorded checkpoint being step %lld\n",
              static_cast<long long>(before.job().progress().step()),
              static_cast<long long>(recorded_before_kill));

  ASSERT_TRUE(cp.WaitFor(job_id, Final, 180)) << cp.Cli({"status", job_id}).out;
  const v1::GetJobReply done = cp.Status(job_id);
  ASSERT_EQ(done.job().state(), v1::JOB_STATE_SUCCEEDED) << cp.Cli({"status", job_id}).out;
  ASSERT_EQ(done.attempts_size(), 2) << "the kill must land before the first attempt finished";
  EXPECT_EQ(done.job().restarts(), 1);
  EXPECT_THAT(done.attempts(0).cause(), HasSubstr("rank 1"));
  EXPECT_THAT(done.attempts(0).cause(), HasSubstr("signal 9"));

  // The second attempt resumed from the newest checkpoint the first one committed: the newest it
  // reported, or a newer one whose commit ended as rank 1 died, before rank 0 could report it.
  const v1::ListCheckpointsReply listed = CheckpointsOf(cp, job_id);
  const v1::Checkpoint recorded = NewestCommitted(listed, /*attempt_id=*/1);
  ASSERT_FALSE(recorded.path().empty()) << listed.DebugString();
  EXPECT_GE(recorded.step(), recorded_before_kill);
  const std::string log = cp.Cli({"logs", job_id, "--rank", "0", "--attempt", "2"}).out;
  const Resumed resumed = ResumedFrom(log);
  if (resumed.step == recorded.step()) {
    EXPECT_EQ(resumed.path, recorded.path()) << log;
  } else {
    EXPECT_GT(resumed.step, recorded.step()) << log;
    EXPECT_EQ(resumed.step % kEvery, 0) << log;
    EXPECT_EQ(fs::path(resumed.path).parent_path(), fs::path(ck)) << log;
  }
  std::printf("attempt 2 resumed from step %lld (%s)\n", static_cast<long long>(resumed.step),
              resumed.step == recorded.step() ? "recorded" : "committed, not yet reported");
  EXPECT_THAT(cp.Cli({"logs", job_id, "--rank", "0", "--attempt", "1"}).out,
              Not(HasSubstr("resumed from step")));
  EXPECT_EQ(ExactFinalLoss(log), want) << log;

  // `checkpoints` lists every committed save of both attempts; the newest is on disk.
  const v1::Checkpoint newest = NewestCommitted(listed);
  EXPECT_EQ(newest.step(), kSteps);
  EXPECT_EQ(newest.attempt_id(), 2);
  EXPECT_GT(newest.bytes(), 0);
  EXPECT_TRUE(IsCommittedCheckpoint(newest.path())) << newest.path();
  EXPECT_EQ(fs::path(newest.path()).parent_path(), fs::path(ck));
  const ProcessResult table = cp.Cli({"checkpoints", job_id});
  ASSERT_EQ(table.exit_code, 0) << table.err;
  EXPECT_THAT(table.out, HasSubstr("STEP"));
  EXPECT_THAT(table.out, HasSubstr("SIZE"));
  EXPECT_THAT(table.out, HasSubstr("STATE"));
  EXPECT_THAT(table.out, HasSubstr("PATH"));
  int committed = 0;
  for (const v1::Checkpoint& c : listed.checkpoints()) {
    if (c.state() != v1::CHECKPOINT_STATE_COMMITTED) continue;
    ++committed;
    // Its row: the step first, the state and the path last, a size in between.
    const std::regex row(absl::StrCat("(^|\\n)", c.step(), " [^\\n]* [0-9.]+ (B|KiB|MiB) [^\\n]*",
                                      "COMMITTED +", c.path(), "(\\n|$)"));
    EXPECT_TRUE(std::regex_search(table.out, row)) << c.path() << " in\n" << table.out;
  }
  EXPECT_GE(committed, 3);  // the one resumed from, at least one more by attempt 2, the last one
  // keep: 2 — only the two newest committed checkpoints remain on disk.
  int on_disk = 0;
  for (const auto& entry : fs::directory_iterator(ck)) {
    on_disk += IsCommittedCheckpoint(entry.path().string());
  }
  EXPECT_EQ(on_disk, 2);

  // `status` shows the policy and the newest checkpoint.
  EXPECT_EQ(done.job().last_checkpoint().step(), kSteps);
  EXPECT_EQ(done.job().last_checkpoint().path(), newest.path());
  EXPECT_EQ(done.job().checkpoint_policy().every_steps(), 25);
  EXPECT_EQ(done.job().checkpoint_policy().keep(), 2);
  const ProcessResult status = cp.Cli({"status", job_id});
  EXPECT_THAT(status.out, HasSubstr("every 25 steps, keep 2, dir " + ck));
  EXPECT_THAT(status.out, HasSubstr(absl::StrCat("step ", kSteps)));
  EXPECT_THAT(status.out, HasSubstr(newest.path()));
}

// The spec of a job of `cp` whose only checkpoint before its end is the one a drain takes (under
// <dir>/ck), written to job.yaml.
std::string DrainableSpec(ControlPlane& cp) {
  return cp.WriteSpec("job.yaml",
                      TinySpec(Job("ck", absl::StrCat("{dir: ", cp.dir(),
                                                      "/ck, every_steps: ", 10 * kSteps, "}"))));
}

// Submits `spec` and waits until the job has made a step: its id, "" after a failure.
std::string SubmitAndWaitForAStep(ControlPlane& cp, const std::string& spec) {
  const std::string job_id = cp.Submit(spec);
  if (job_id.empty()) return "";
  EXPECT_TRUE(cp.WaitForStep(job_id, 1, 120)) << cp.Cli({"status", job_id}).out;
  return job_id;
}

// A drained job of `cp`: DRAINED after one attempt, at a committed checkpoint before its last
// step; its status, for more checks.
v1::GetJobReply ExpectDrainedAtACheckpoint(ControlPlane& cp, const std::string& job_id) {
  const v1::GetJobReply drained = cp.Status(job_id);
  EXPECT_EQ(drained.job().state(), v1::JOB_STATE_DRAINED) << cp.Cli({"status", job_id}).out;
  const v1::Checkpoint& last = drained.job().last_checkpoint();
  EXPECT_GT(last.step(), 0);
  EXPECT_LT(last.step(), kSteps) << "the drain must stop the job before its last step";
  EXPECT_TRUE(IsCommittedCheckpoint(last.path())) << last.path();
  EXPECT_EQ(drained.attempts_size(), 1) << "a drain, not a failure and a restart";
  return drained;
}

TEST(ControlPlaneCheckpointTest, DrainedJobEndsAtACheckpointThatTheResubmittedSpecContinues) {
  ControlPlane cp("cp_ck_drain");
  cp.StartServer({.local_agent = true, .local_slots = 2});
  const std::string want = UninterruptedLoss(cp);
  ASSERT_FALSE(want.empty());
  const std::string ck = cp.dir() + "/ck";
  // No periodic save before the end: the drain's checkpoint is the only one.
  const std::string spec = DrainableSpec(cp);
  const std::string job_id = SubmitAndWaitForAStep(cp, spec);
  ASSERT_FALSE(job_id.empty());

  const ProcessResult drain = cp.Cli({"drain", job_id, "--reason", "maintenance"});
  ASSERT_EQ(drain.exit_code, 0) << drain.err;
  EXPECT_THAT(drain.out, HasSubstr("checkpoint at a step they agree on"));
  const ProcessResult watch = cp.Cli({"watch", job_id}, 120);
  EXPECT_EQ(watch.exit_code, 5) << watch.out << watch.err;

  const v1::GetJobReply drained = cp.Status(job_id);
  ASSERT_EQ(drained.job().state(), v1::JOB_STATE_DRAINED) << cp.Cli({"status", job_id}).out;
  const v1::Checkpoint& last = drained.job().last_checkpoint();
  ASSERT_GT(last.step(), 0);
  ASSERT_LT(last.step(), kSteps) << "the drain must stop the job before its last step";
  std::printf("drained at step %lld\n", static_cast<long long>(last.step()));
  EXPECT_EQ(drained.job().message(),
            absl::StrCat("drained at step ", last.step(), ": checkpoint ", last.path()));
  EXPECT_TRUE(IsCommittedCheckpoint(last.path())) << last.path();
  EXPECT_EQ(fs::path(last.path()).parent_path(), fs::path(ck));
  EXPECT_EQ(drained.attempts_size(), 1);
  const std::string drained_log = cp.Cli({"logs", job_id, "--rank", "0"}).out;
  EXPECT_THAT(drained_log, HasSubstr(absl::StrCat("drained at step ", last.step(), "\n")));
  EXPECT_THAT(drained_log, HasSubstr(absl::StrCat("checkpoint step ", last.step(),
                                                  " committed: ", last.path())));
  EXPECT_EQ(cp.Cli({"drain", job_id}).exit_code, 0) << "draining a drained job changes nothing";
  EXPECT_EQ(cp.Cli({"cancel", job_id}).exit_code, 2) << "DRAINED is final";

  // The same spec again: a new job that continues from the drain's checkpoint to the end.
  const std::string again = cp.Submit(spec);
  ASSERT_FALSE(again.empty());
  EXPECT_NE(again, job_id);
  const ProcessResult finished = cp.Cli({"watch", again}, 180);
  EXPECT_EQ(finished.exit_code, 0) << finished.out << finished.err;
  const v1::GetJobReply resumed_job = cp.Status(again);
  EXPECT_EQ(resumed_job.job().state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(resumed_job.job().attempts(), 1);
  const std::string log = cp.Cli({"logs", again, "--rank", "0"}).out;
  const Resumed resumed = ResumedFrom(log);
  EXPECT_EQ(resumed.step, last.step()) << log;
  EXPECT_EQ(resumed.path, last.path()) << log;
  EXPECT_EQ(ExactFinalLoss(log), want) << log;
}

// A batch system ending a job (Slurm's scancel, a preemption) sends SIGTERM to every process of
// it. A rank that receives it asks the coordinator, which drains the job: every rank checkpoints
// at a step they agree on and exits 0, as `trainyard drain` has them do.
TEST(ControlPlaneCheckpointTest, SigtermToARankDrainsTheJobAtACheckpoint) {
  ControlPlane cp("cp_ck_sigterm");
  cp.StartServer({.local_agent = true, .local_slots = 2});
  const std::string job_id = SubmitAndWaitForAStep(cp, DrainableSpec(cp));
  ASSERT_FALSE(job_id.empty());
  const std::vector<int64_t> pids = cp.WorkerPids();
  ASSERT_EQ(pids.size(), 2u);
  ASSERT_EQ(kill(static_cast<pid_t>(pids[1]), SIGTERM), 0);

  const ProcessResult watch = cp.Cli({"watch", job_id}, 120);
  EXPECT_EQ(watch.exit_code, 5) << watch.out << watch.err;
  const v1::GetJobReply drained = ExpectDrainedAtACheckpoint(cp, job_id);
  const std::string status = cp.Cli({"status", job_id}).out;
  EXPECT_THAT(status, HasSubstr("received SIGTERM")) << status;
  ASSERT_EQ(drained.attempts_size(), 1);
  ASSERT_EQ(drained.attempts(0).exits_size(), 2);
  for (const v1::RankExit& exit : drained.attempts(0).exits()) {
    EXPECT_EQ(exit.signal(), 0) << "rank " << exit.rank();
    EXPECT_EQ(exit.exit_code(), 0) << "rank " << exit.rank();
  }
}

// The coordinator's own SIGTERM, with --drain-on-stop (a coordinator whose end ends the jobs, as
// in a Slurm allocation): it drains every running job, stops once they have ended, and the
// next start finds them DRAINED at their checkpoints.
TEST(ControlPlaneCheckpointTest, DrainOnStopDrainsTheRunningJobsBeforeTheCoordinatorExits) {
  ControlPlane cp("cp_ck_drain_on_stop");
  ServerOptions options{.local_agent = true, .local_slots = 2};
  options.extra_args = {"--drain-on-stop", "60"};
  cp.StartServer(options);
  const std::string job_id = SubmitAndWaitForAStep(cp, DrainableSpec(cp));
  ASSERT_FALSE(job_id.empty());

  const std::optional<int> exited = cp.StopServer(SIGTERM, 60);
  ASSERT_TRUE(exited.has_value()) << "the coordinator did not stop within 60 s";
  EXPECT_TRUE(WIFEXITED(*exited) && WEXITSTATUS(*exited) == 0) << *exited;
  cp.StartServer(options);
  ExpectDrainedAtACheckpoint(cp, job_id);
  const std::string status = cp.Cli({"status", job_id}).out;
  EXPECT_THAT(status, HasSubstr("the coordinator received Terminated")) << status;
}

// The coordinator does not look at the path (it may exist only on the workers' nodes); the ranks
// refuse it with exit code 2 before training, and the user sees why in status and logs. Exit
// code 2 is a user error: the job fails at once, no restart used; a rank slower to refuse it is
// stopped.
TEST(ControlPlaneCheckpointTest, MissingResumeFromFailsTheJobWithTheWorkersReason) {
  ControlPlane cp("cp_ck_bad_resume");
  cp.StartServer({.local_agent = true, .local_slots = 2});
  const std::string missing = cp.dir() + "/no-such-checkpoint";
  const std::string reason =
      absl::StrCat("checkpoint.resume_from: ", missing, ": no such file or directory");
  TinyJob job = Job("bad", absl::StrCat("{resume_from: ", missing, "}"));
  job.max_restarts = 1;
  const std::string job_id = cp.Submit(cp.WriteSpec("bad.yaml", TinySpec(job)));
  ASSERT_FALSE(job_id.empty());
  const ProcessResult watch = cp.Cli({"watch", job_id}, 120);
  EXPECT_EQ(watch.exit_code, 1) << watch.out << watch.err;

  const v1::GetJobReply failed = cp.Status(job_id);
  ASSERT_EQ(failed.job().state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(failed.job().message(), HasSubstr("exited with code 2"));
  EXPECT_EQ(failed.job().progress().step(), 0);
  EXPECT_TRUE(failed.job().last_checkpoint().path().empty());
  ASSERT_EQ(failed.attempts_size(), 1);
  EXPECT_EQ(failed.job().restarts(), 0);
  EXPECT_EQ(failed.job().last_failure().failure_class(), "user_error");
  for (const v1::Attempt& attempt : failed.attempts()) {
    ASSERT_EQ(attempt.exits_size(), 2) << attempt.DebugString();
    int refused = 0;
    for (const v1::RankExit& exit : attempt.exits()) {
      if (exit.signal() == 0 && exit.exit_code() == 2) {
        ++refused;
      } else {
        EXPECT_TRUE(exit.signal() == SIGTERM || exit.signal() == SIGKILL ||
                    (exit.signal() == 0 && exit.exit_code() == 0))
            << "attempt " << attempt.attempt_id() << " rank " << exit.rank() << " was stopped";
      }
    }
    EXPECT_GE(refused, 1) << attempt.DebugString();
  }
  // The ranks that refused it carry the worker's one-line reason (a rank stopped before it read
  // the spec, once another had refused it, does not).
  const v1::Attempt& last = failed.attempts(failed.attempts_size() - 1);
  int refusing_rank = -1;
  for (const v1::RankExit& exit : last.exits()) {
    if (exit.exit_code() != 2) continue;
    refusing_rank = exit.rank();
    bool shown = false;
    for (const std::string& line : exit.last_log_lines()) {
      shown |= line == "trainyard-worker: error: " + reason;
    }
    EXPECT_TRUE(shown) << last.DebugString();
  }
  const ProcessResult status = cp.Cli({"status", job_id});
  EXPECT_THAT(status.out, HasSubstr("state       FAILED"));
  EXPECT_THAT(status.out, HasSubstr("exited with code 2"));
  EXPECT_THAT(status.out, HasSubstr("| trainyard-worker: error: " + reason));
  ASSERT_GE(refusing_rank, 0);
  EXPECT_THAT(cp.Cli({"logs", job_id, "--attempt", absl::StrCat(last.attempt_id()), "--rank",
                      absl::StrCat(refusing_rank)})
                  .out,
              HasSubstr("trainyard-worker: error: " + reason + "\n"));
  EXPECT_FALSE(fs::exists(missing)) << "nothing is written for a refused resume_from";
}

// `trainyard export JOB` and `trainyard sample JOB` read the job's newest committed checkpoint,
// which the coordinator names, on this machine; an unknown job is refused and nothing written.
// The job samples while it trains (training.sample_every), and its log keeps the samples.
TEST(ControlPlaneCheckpointTest, ExportAndSampleOfAJobReadItsNewestCheckpoint) {
  ControlPlane cp("cp_ck_export");
  cp.StartServer({.local_agent = true, .local_slots = 2});
  const TinyJob job = Job("weights", absl::StrCat("{dir: ", cp.dir(), "/ckpt, every_steps: 100}"));
  // With samples while it trains (training.sample_every), kept in rank 0's log.
  const std::string spec = absl::StrReplaceAll(
      TinySpec(job), {{"training: {", "training: {sample_every: 100, sample_tokens: 6, "}});
  const ProcessResult run = cp.Cli({"submit", cp.WriteSpec("w.yaml", spec), "--watch"}, 180);
  ASSERT_EQ(run.exit_code, 0) << run.out << run.err;
  const std::string job_id = run.out.substr(0, run.out.find('\n'));
  const std::string log = cp.Cli({"logs", job_id, "--rank", "0"}).out;
  for (int step = 100; step <= kSteps; step += 100) {
    EXPECT_THAT(log, HasSubstr(absl::StrCat("sample step ", step, " | \""))) << log;
  }
  const std::string out = cp.dir() + "/hf";
  const ProcessResult exported = cp.Cli({"export", job_id, "--format", "hf", "--out", out}, 60);
  EXPECT_EQ(exported.exit_code, 0) << exported.out << exported.err;
  EXPECT_THAT(exported.out, HasSubstr(absl::StrCat("exported step ", kSteps, " of ")));
  EXPECT_TRUE(fs::exists(out + "/config.json"));
  EXPECT_TRUE(fs::exists(out + "/model.safetensors"));
  const ProcessResult sampled =
      cp.Cli({"sample", job_id, "--prompt-tokens", "1 2 3", "--tokens", "5"}, 60);
  EXPECT_EQ(sampled.exit_code, 0) << sampled.out << sampled.err;
  EXPECT_EQ(std::count(sampled.out.begin(), sampled.out.end(), ' '), 4) << sampled.out;
  const ProcessResult unknown =
      cp.Cli({"export", "j-999999", "--format", "hf", "--out", cp.dir() + "/none"}, 30);
  EXPECT_EQ(unknown.exit_code, 2) << unknown.out << unknown.err;
  EXPECT_FALSE(fs::exists(cp.dir() + "/none"));
}

// `every_steps: auto` on real ranks: the coordinator orders saves at its Young–Daly interval
// through the progress reply, and both ranks save at the step rank 0 was told. A tiny per-node
// MTBF prior makes the interval a few dozen of the tiny model's steps, so the run saves several
// times at steps no fixed interval names.
TEST(ControlPlaneCheckpointTest, YoungDalyPolicyOrdersSavesThatEveryRankTakes) {
  ControlPlane cp("cp_ck_young_daly");
  cp.StartServer(
      {.local_agent = true, .local_slots = 2, .extra_args = {"--node-mtbf-hours", "0.001"}});
  TinyJob job =
      Job("auto", absl::StrCat("{dir: ", cp.dir(), "/ckpt, keep: 100, min_every_steps: 5}"));
  job.steps = 400;
  const std::string job_id = cp.Submit(cp.WriteSpec("auto.yaml", TinySpec(job)));
  ASSERT_FALSE(job_id.empty());
  const ProcessResult watch = cp.Cli({"watch", job_id}, 300);
  ASSERT_EQ(watch.exit_code, 0) << watch.out << watch.err;
  const v1::GetJobReply done = cp.Status(job_id);
  const v1::YoungDaly& yd = done.job().young_daly();
  EXPECT_GT(yd.checkpoint_cost_s(), 0);  // δ measured from the saves
  EXPECT_GT(yd.mtbf_s(), 3.0);  // the prior, 0.001 h for one node, grown by failure-free time
  EXPECT_GT(yd.interval_s(), 0);
  EXPECT_GE(yd.interval_steps(), 5);
  std::vector<int64_t> steps;
  const v1::ListCheckpointsReply listed = CheckpointsOf(cp, job_id);
  for (const v1::Checkpoint& c : listed.checkpoints()) {
    EXPECT_EQ(c.state(), v1::CHECKPOINT_STATE_COMMITTED) << c.message();
    steps.push_back(c.step());
  }
  ASSERT_GE(steps.size(), 3u) << "the first early save, ordered ones and the last step";
  EXPECT_EQ(steps.back(), 400);
  EXPECT_EQ(steps.front(), 10) << "the first save is ordered early, to measure its cost";
  for (size_t i = 1; i + 1 < steps.size(); ++i) {
    EXPECT_GE(steps[i] - steps[i - 1], 5) << "min_every_steps bounds the interval";
  }
  std::cout << "saved at steps";
  for (int64_t step : steps) std::cout << " " << step;
  std::cout << "; delta " << yd.checkpoint_cost_s() << " s, M " << yd.mtbf_s() << " s, tau "
            << yd.interval_s() << " s = " << yd.interval_steps() << " steps" << std::endl;
  const ProcessResult status = cp.Cli({"status", job_id});
  EXPECT_THAT(status.out, HasSubstr("young-daly"));
  EXPECT_THAT(status.out, HasSubstr("goodput"));
}

}  // namespace
}  // namespace trainyard::testenv
