// Elastic restarts of real processes: a 2-node job that may shrink (fault_tolerance.min_nodes 1)
// loses a node and goes on at once on the survivor, with the global batch kept; when the node
// comes back the job grows back at a checkpoint; and it ends at the uninterrupted run's loss. A
// tensor-parallel job keeps its groups whole, and an expert-parallel one runs every expert on the
// survivor. A job allowed more nodes than it asked for grows onto a free one.
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <regex>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/controlplane_util.h"

namespace trainyard::testenv {
namespace {

using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

TinyJob ElasticJob(const std::string& name, const std::string& dir) {
  return {.name = name,
          .nodes = 2,
          .ranks_per_node = 1,
          .steps = 4000,
          .max_restarts = 2,
          .checkpoint = absl::StrCat("{dir: ", dir, ", every_steps: 200}"),
          .fault_tolerance = "min_nodes: 1, backoff_initial_s: 0, resize_cooldown_s: 0"};
}

// Waits until the job runs and has committed a checkpoint of at least `step`, kills node-b's
// agent, and waits (at most 20 s) for a second attempt of `ranks` ranks to run: the shrink.
void LoseNodeBAndExpectAShrinkTo(ControlPlane& cp, const std::string& job_id, int64_t step,
                                 int ranks) {
  ASSERT_TRUE(cp.WaitFor(
      job_id,
      [step](const v1::GetJobReply& r) {
        return r.job().state() == v1::JOB_STATE_RUNNING && r.job().last_checkpoint().step() >= step;
      },
      120));
  cp.KillAgent("node-b");
  const Clock::time_point killed = Clock::now();
  ASSERT_TRUE(cp.WaitFor(
      job_id,
      [ranks](const v1::GetJobReply& r) {
        return r.job().state() == v1::JOB_STATE_RUNNING && r.attempts_size() == 2 &&
               r.attempts(1).placement_size() == ranks;
      },
      20))
      << "no " << ranks << "-rank attempt running within 20 s of losing node-b";
  std::cout << "a " << ranks << "-rank attempt ran "
            << std::chrono::duration<double>(Clock::now() - killed).count()
            << " s after node-b's agent was killed" << std::endl;
}

TEST(ElasticChaosTest, LostNodeShrinksTheJobAndItsReturnGrowsItBackWithTheSameLoss) {
  ControlPlane cp("chaos_shrink");
  cp.StartServer({.local_agent = false});
  cp.StartAgent("node-a", 1);
  cp.StartAgent("node-b", 1);

  // The uninterrupted run, for the loss to match.
  const std::string reference = cp.Submit(
      cp.WriteSpec("reference.yaml", TinySpec(ElasticJob("reference", cp.dir() + "/ref"))));
  const ProcessResult ref_watch = cp.Cli({"watch", reference}, 300);
  ASSERT_EQ(ref_watch.exit_code, 0) << ref_watch.out << ref_watch.err;
  const double want = ExactFinalLoss(cp.Cli({"logs", reference, "--rank", "0"}).out);
  ASSERT_FALSE(std::isnan(want));

  const std::string job_id =
      cp.Submit(cp.WriteSpec("elastic.yaml", TinySpec(ElasticJob("elastic", cp.dir() + "/ckpt"))));
  LoseNodeBAndExpectAShrinkTo(cp, job_id, 200, 1);
  if (HasFatalFailure()) return;
  const v1::GetJobReply shrunk = cp.Status(job_id);
  ASSERT_GE(shrunk.attempts_size(), 2) << shrunk.DebugString();
  ASSERT_EQ(shrunk.attempts(1).placement_size(), 1) << shrunk.DebugString();
  EXPECT_EQ(shrunk.attempts(1).placement(0).node_id(), "node-a");
  EXPECT_EQ(shrunk.attempts(1).mesh().dp(), 1);
  EXPECT_EQ(shrunk.job().last_failure().failure_class(), "node_lost");

  // node-b comes back: the job grows back to 2 ranks at a checkpoint.
  ASSERT_TRUE(cp.WaitFor(
      job_id, [](const v1::GetJobReply& r) { return r.job().progress().step() >= 1500; }, 120));
  cp.StartAgent("node-b", 1);
  ASSERT_TRUE(cp.WaitFor(
      job_id,
      [](const v1::GetJobReply& r) {
        return r.attempts_size() == 3 && r.attempts(2).placement_size() == 2 &&
               r.job().state() == v1::JOB_STATE_RUNNING;
      },
      60))
      << cp.Cli({"status", job_id}).out;
  const v1::GetJobReply grown = cp.Status(job_id);
  ASSERT_GE(grown.attempts_size(), 3) << grown.DebugString();
  EXPECT_EQ(grown.attempts(2).mesh().dp(), 2);
  EXPECT_EQ(grown.job().restarts(), 1) << "growing back is not a restart after a failure";

  const ProcessResult watch = cp.Cli({"watch", job_id}, 300);
  EXPECT_EQ(watch.exit_code, 0) << watch.out << watch.err;
  std::string resized, requested;
  const v1::GetJobReply finished = cp.Status(job_id);
  for (const v1::Event& event : finished.events()) {
    if (event.kind() == "resized") resized += event.cause();
    if (event.kind() == "resize_requested") requested += event.cause();
  }
  EXPECT_THAT(resized, HasSubstr("dp 2 → 1, accumulation 1 → 2"));
  EXPECT_THAT(resized, HasSubstr("node-b lost"));
  EXPECT_THAT(requested, HasSubstr("growing from 1 to 2 nodes (2 asked for)"));
  EXPECT_THAT(cp.Cli({"logs", job_id, "--attempt", "2", "--rank", "0"}).out,
              HasSubstr("resumed from step"));
  const std::string log = cp.Cli({"logs", job_id, "--attempt", "3", "--rank", "0"}).out;
  EXPECT_THAT(log, HasSubstr("resumed from step"));
  const double got = ExactFinalLoss(log);
  EXPECT_NEAR(got, want, 1e-4 * std::abs(want)) << "uninterrupted " << want << ", shrunk " << got;
  std::cout << "final loss " << got << " against " << want << " uninterrupted" << std::endl;
}

// A 1-node job with fault_tolerance.max_nodes 2 grows onto a second node when that node's agent
// joins, at a checkpoint and without counting a restart, and ends at the loss of a run that
// stayed on one node (the global batch and the data order are kept).
TEST(ElasticChaosTest, AJobGrowsPastItsSizeOntoAFreeNodeWithTheSameLoss) {
  ControlPlane cp("chaos_grow_past");
  cp.StartServer({.local_agent = false});
  cp.StartAgent("node-a", 1);
  auto job = [&](const std::string& name, const std::string& more) {
    return TinySpec(
        {.name = name,
         .nodes = 1,
         .steps = 2000,
         .checkpoint = absl::StrCat("{dir: ", cp.dir(), "/", name, ", every_steps: 100}"),
         .fault_tolerance = absl::StrCat("backoff_initial_s: 0", more),
         .batch_per_rank = 8});
  };
  const std::string reference = cp.Submit(cp.WriteSpec("reference.yaml", job("reference", "")));
  const ProcessResult ref_watch = cp.Cli({"watch", reference}, 300);
  ASSERT_EQ(ref_watch.exit_code, 0) << ref_watch.out << ref_watch.err;
  const double want = ExactFinalLoss(cp.Cli({"logs", reference, "--rank", "0"}).out);
  ASSERT_FALSE(std::isnan(want));

  const std::string job_id =
      cp.Submit(cp.WriteSpec("grows.yaml", job("grows", ", max_nodes: 2, resize_cooldown_s: 0")));
  ASSERT_TRUE(cp.WaitFor(
      job_id,
      [](const v1::GetJobReply& r) {
        return r.job().state() == v1::JOB_STATE_RUNNING && r.job().last_checkpoint().step() >= 200;
      },
      120));
  const v1::GetJobReply before = cp.Status(job_id);
  ASSERT_EQ(before.attempts_size(), 1) << before.DebugString();
  EXPECT_EQ(before.attempts(0).placement_size(), 1) << "node-b is not there yet";
  cp.StartAgent("node-b", 1);
  ASSERT_TRUE(cp.WaitFor(
      job_id,
      [](const v1::GetJobReply& r) {
        return r.attempts_size() == 2 && r.attempts(1).placement_size() == 2 &&
               r.job().state() == v1::JOB_STATE_RUNNING;
      },
      60))
      << cp.Cli({"status", job_id}).out;
  const v1::GetJobReply grown = cp.Status(job_id);
  EXPECT_EQ(grown.attempts(1).mesh().dp(), 2);
  EXPECT_EQ(grown.job().restarts(), 0) << "growing is not a restart after a failure";

  const ProcessResult watch = cp.Cli({"watch", job_id}, 300);
  EXPECT_EQ(watch.exit_code, 0) << watch.out << watch.err;
  std::string resized;
  const v1::GetJobReply finished = cp.Status(job_id);
  for (const v1::Event& event : finished.events()) {
    if (event.kind() == "resized") resized += event.cause();
  }
  EXPECT_THAT(resized, HasSubstr("runs on 2 nodes, above the 1 asked for: dp 1 → 2"));
  const std::string log = cp.Cli({"logs", job_id, "--attempt", "2", "--rank", "0"}).out;
  EXPECT_THAT(log, HasSubstr("resumed from step"));
  const double got = ExactFinalLoss(log);
  EXPECT_NEAR(got, want, 1e-4 * std::abs(want)) << "on one node " << want << ", grown " << got;
  std::cout << "final loss " << got << " against " << want << " on one node" << std::endl;
}

// A job on 2 nodes of `per_node` slots that may shrink to one, checkpointing every 100 steps.
std::string ShrinkableSpec(ControlPlane& cp, const std::string& name, const std::string& model,
                           int steps, const std::string& parallelism, int per_node) {
  return absl::StrCat(
      "name: ", name, "\nmodel: ", model,
      "\ndata: {source: markov, markov: {vocab: 32, train_tokens: 50000, val_tokens: 2000}}\n"
      "training: {steps: ",
      steps,
      ", batch: 8, seq_len: 16, eval_every: 0, log_every: 100, threads: 1}\n"
      "parallelism: ",
      parallelism, "\nresources: {nodes: 2, devices_per_node: ", per_node,
      "}\ncheckpoint: {dir: ", cp.dir(), "/", name, ", every_steps: 100}\n",
      "fault_tolerance: {max_restarts: 2, heartbeat_timeout_s: 5, min_nodes: 1, "
      "backoff_initial_s: 0}\n");
}

TEST(ElasticChaosTest, TensorParallelJobLosingANodeKeepsItsTensorParallelGroup) {
  ControlPlane cp("chaos_shrink_tp");
  cp.StartServer({.local_agent = false});
  cp.StartAgent("node-a", 2);
  cp.StartAgent("node-b", 2);
  // tp 2 × dp 2 on 2 nodes of 2 slots: each node holds one tensor-parallel pair.
  auto spec = [&cp](const std::string& name) {
    return ShrinkableSpec(cp, name, "{preset: gpt2-debug}", 800, "{dp: 2, tp: 2}", 2);
  };
  // The uninterrupted run, for the loss to match.
  const std::string reference = cp.Submit(cp.WriteSpec("reference.yaml", spec("reference")));
  const ProcessResult ref_watch = cp.Cli({"watch", reference}, 300);
  ASSERT_EQ(ref_watch.exit_code, 0) << ref_watch.out << ref_watch.err;
  const double want = ExactFinalLoss(cp.Cli({"logs", reference, "--rank", "0"}).out);
  ASSERT_FALSE(std::isnan(want));

  const std::string job_id = cp.Submit(cp.WriteSpec("tp.yaml", spec("tp")));
  LoseNodeBAndExpectAShrinkTo(cp, job_id, 100, 2);
  if (HasFatalFailure()) return;
  const v1::GetJobReply shrunk = cp.Status(job_id);
  ASSERT_GE(shrunk.attempts_size(), 2);
  EXPECT_EQ(shrunk.attempts(1).mesh().tp(), 2);
  EXPECT_EQ(shrunk.attempts(1).mesh().dp(), 1);
  const ProcessResult watch = cp.Cli({"watch", job_id}, 300);
  EXPECT_EQ(watch.exit_code, 0) << watch.out << watch.err;
  const std::string log = cp.Cli({"logs", job_id, "--attempt", "2", "--rank", "0"}).out;
  EXPECT_THAT(log, HasSubstr("resumed from step"));
  const double got = ExactFinalLoss(log);
  EXPECT_NEAR(got, want, 1e-4 * std::abs(want)) << "uninterrupted " << want << ", shrunk " << got;
}

// A mixture of experts split over both nodes (dp 2 × ep 2) losing one: the survivor runs every
// expert (ep 1, the largest group that divides the one data-parallel rank left), resharded from
// the checkpoint that stored each expert once, and trains on as the uninterrupted run did. Not
// to the last bit: at ep 2 an expert's weight gradient is one GEMM over both ranks' rows, at
// ep 1 two accumulated ones, and routing's discrete choices amplify that rounding over the
// following steps: the first 100 agree to within a unit of the log's last digit; 200 steps on, the
// losses differed by 0.1% here, and the final loss is only held to 5%.
TEST(ElasticChaosTest, ExpertParallelJobLosingANodeRunsEveryExpertOnTheSurvivor) {
  ControlPlane cp("chaos_shrink_ep");
  cp.StartServer({.local_agent = false});
  cp.StartAgent("node-a", 1);
  cp.StartAgent("node-b", 1);
  auto spec = [&cp](const std::string& name) {
    return ShrinkableSpec(cp, name, "{preset: gpt2-debug, moe: {experts: 4, top_k: 2}}", 600,
                          "{dp: 2, ep: 2}", 1);
  };
  const std::string reference = cp.Submit(cp.WriteSpec("reference.yaml", spec("reference")));
  const ProcessResult ref_watch = cp.Cli({"watch", reference}, 300);
  ASSERT_EQ(ref_watch.exit_code, 0) << ref_watch.out << ref_watch.err;
  const std::string reference_log = cp.Cli({"logs", reference, "--rank", "0"}).out;
  const double want = ExactFinalLoss(reference_log);
  ASSERT_FALSE(std::isnan(want));

  const std::string job_id = cp.Submit(cp.WriteSpec("ep.yaml", spec("ep")));
  LoseNodeBAndExpectAShrinkTo(cp, job_id, 100, 1);
  if (HasFatalFailure()) return;
  EXPECT_THAT(cp.Cli({"logs", job_id, "--attempt", "1", "--rank", "0"}).out,
              HasSubstr("experts over ep 2"));
  const ProcessResult watch = cp.Cli({"watch", job_id}, 300);
  EXPECT_EQ(watch.exit_code, 0) << watch.out << watch.err;
  const std::string log = cp.Cli({"logs", job_id, "--attempt", "2", "--rank", "0"}).out;
  EXPECT_THAT(log, HasSubstr("resumed from step"));
  EXPECT_THAT(log, ::testing::Not(HasSubstr("experts over ep")));
  // The first step logged after the resume (from the checkpoint of step 100 or later): its loss
  // and gradient norm as the uninterrupted run logged them.
  const std::smatch resumed = [&log] {
    std::smatch m;
    std::regex_search(log, m, std::regex("resumed from step ([0-9]+)"));
    return m;
  }();
  ASSERT_FALSE(resumed.empty()) << log;
  const int64_t next = (std::stoll(resumed[1].str()) / 100 + 1) * 100;
  // The log prints the loss to four decimals and the norm to three: values a few 1e-6 apart can
  // round to neighbouring last digits, so each may differ by one unit there and no more.
  const std::regex line(
      absl::StrCat("step +", next, "/600 \\| loss ([0-9.]+) \\| lr [^|]+\\| grad norm ([0-9.]+)"));
  std::smatch ours, theirs;
  ASSERT_TRUE(std::regex_search(log, ours, line)) << log;
  ASSERT_TRUE(std::regex_search(reference_log, theirs, line)) << reference_log;
  EXPECT_NEAR(std::stod(ours[1].str()), std::stod(theirs[1].str()), 1.5e-4) << ours.str() << "\n"
                                                                            << theirs.str();
  EXPECT_NEAR(std::stod(ours[2].str()), std::stod(theirs[2].str()), 1.5e-3) << ours.str() << "\n"
                                                                            << theirs.str();
  const double got = ExactFinalLoss(log);
  EXPECT_NEAR(got, want, 5e-2 * std::abs(want))
      << "uninterrupted " << want << ", shrunk " << got << "\nuninterrupted:\n"
      << reference_log << "\nshrunk:\n"
      << log;
}

TEST(ElasticChaosTest, FlappingNodeCausesAtMostOneResizePerCooldown) {
  ControlPlane cp("chaos_flap");
  cp.StartServer({.local_agent = false});
  cp.StartAgent("node-a", 1);
  cp.StartAgent("node-b", 1);
  TinyJob job = ElasticJob("flap", cp.dir() + "/ckpt");
  job.steps = 1000000;
  job.checkpoint = absl::StrCat("{dir: ", cp.dir(), "/ckpt, every_steps: 50}");
  job.fault_tolerance = "min_nodes: 1, backoff_initial_s: 0, resize_cooldown_s: 20";
  const std::string job_id = cp.Submit(cp.WriteSpec("flap.yaml", TinySpec(job)));
  LoseNodeBAndExpectAShrinkTo(cp, job_id, 50, 1);
  if (HasFatalFailure()) return;
  // node-b comes back and dies three times within the cool-down.
  for (int flap = 0; flap < 3; ++flap) {
    cp.StartAgent("node-b", 1);
    std::this_thread::sleep_for(std::chrono::seconds(3));
    cp.KillAgent("node-b");
    std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  // Then it stays: the job grows back once, when the cool-down since the shrink has passed.
  cp.StartAgent("node-b", 1);
  ASSERT_TRUE(cp.WaitFor(
      job_id,
      [](const v1::GetJobReply& r) {
        return r.attempts_size() >= 3 && r.attempts(2).placement_size() == 2 &&
               r.job().state() == v1::JOB_STATE_RUNNING;
      },
      60))
      << cp.Cli({"status", job_id}).out;
  const v1::GetJobReply grown = cp.Status(job_id);
  // The cool-down counts from the shrunk attempt's placement. (Its `resized` event may be older
  // than the newest events status shows, after the flaps' and the checkpoints' events.)
  const int64_t shrunk_ms = grown.attempts(1).created_unix_ms();
  int64_t grow_ms = 0;
  int grows = 0;
  for (const v1::Event& event : grown.events()) {
    if (event.kind() == "resize_requested") {
      ++grows;
      grow_ms = event.time_unix_ms();
    }
  }
  EXPECT_EQ(grows, 1) << cp.Cli({"status", job_id}).out;
  EXPECT_EQ(grown.attempts_size(), 3) << "one shrink and one growth, nothing else";
  EXPECT_GE(grow_ms - shrunk_ms, 19000) << "grew back within the cool-down";
  EXPECT_EQ(cp.Cli({"cancel", job_id}).exit_code, 0);
}

}  // namespace
}  // namespace trainyard::testenv
