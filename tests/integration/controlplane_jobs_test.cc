// The control plane end to end on loopback: trainyard-server, agents and workers as real
// processes, driven through the trainyard CLI.
#include <set>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/controlplane_util.h"
#include "tests/integration/test_env.h"

namespace trainyard::testenv {
namespace {

using ::testing::HasSubstr;

// The exact final loss (a hexadecimal float) from the `done:` line a rank-0 log ends with
// ("done: 20 steps | final train loss 2.1043 | ... | exact final loss 0x1.0d5f...p+1").
std::string FinalLossOf(const std::string& text) {
  const std::string key = "exact final loss ";
  const size_t done = text.rfind(key);
  if (done == std::string::npos) return "";
  const size_t begin = done + key.size();
  const size_t end = text.find_first_of(" \n", begin);
  return text.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
}

TEST(ControlPlaneJobsTest, OneRankJobThroughTheCli) {
  ControlPlane cp("cp_one_rank");
  cp.StartServer({.local_agent = true, .local_slots = 2});
  const std::string spec = cp.WriteSpec("one.yaml", TinySpec({.name = "one", .steps = 30}));

  const ProcessResult submitted = cp.Cli({"submit", spec, "--watch"});
  EXPECT_EQ(submitted.exit_code, 0) << submitted.out << submitted.err;
  const std::string job_id = submitted.out.substr(0, submitted.out.find('\n'));
  EXPECT_TRUE(absl::StartsWith(job_id, "j-")) << submitted.out;
  EXPECT_THAT(submitted.out, HasSubstr(job_id + " one SUCCEEDED"));

  const v1::GetJobReply reply = cp.Status(job_id);
  EXPECT_EQ(reply.job().state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(reply.job().progress().step(), 30);
  EXPECT_EQ(reply.job().attempts(), 1);
  // The step time's phases are measured, not zeros.
  const v1::StepTimes& times = reply.job().progress().step_times();
  EXPECT_GT(times.total_ms(), 0);
  EXPECT_GT(times.forward_ms(), 0);
  EXPECT_GT(times.backward_ms(), 0);
  EXPECT_GT(times.optimizer_ms(), 0);
  EXPECT_GT(times.data_ms(), 0);

  const ProcessResult watch = cp.Cli({"watch", job_id});  // a finished job: its outcome at once
  EXPECT_EQ(watch.exit_code, 0);
  const ProcessResult status = cp.Cli({"status", job_id});
  EXPECT_EQ(status.exit_code, 0);
  EXPECT_THAT(status.out, HasSubstr("state       SUCCEEDED"));
  EXPECT_THAT(status.out, HasSubstr("step 30/30 (100%)"));
  const ProcessResult list = cp.Cli({"list"});
  EXPECT_EQ(list.exit_code, 0);
  EXPECT_THAT(list.out, HasSubstr(job_id));
  const ProcessResult list_json = cp.Cli({"list", "--json", "--state", "succeeded"});
  EXPECT_THAT(list_json.out, HasSubstr("\"id\":\"" + job_id + "\""));
  const ProcessResult logs = cp.Cli({"logs", job_id, "--rank", "0"});
  EXPECT_EQ(logs.exit_code, 0);
  EXPECT_THAT(logs.out, HasSubstr("done: 30 steps"));
  const ProcessResult tail = cp.Cli({"logs", job_id, "--rank", "0", "--tail", "1"});
  EXPECT_EQ(std::string(absl::StripAsciiWhitespace(tail.out)).find('\n'), std::string::npos);
  EXPECT_THAT(tail.out, HasSubstr("done: 30 steps"));
  const ProcessResult nodes = cp.Cli({"nodes", "--json"});
  EXPECT_THAT(nodes.out, HasSubstr("\"node_id\":\"local\""));

  // Bad input is exit 2 with the server's one-line message; the server stays up.
  const std::string bad = cp.WriteSpec("bad.yaml",
                                       "name: bad\nmodel: {preset: gpt2-debug}\n"
                                       "training: {steps: many}\n");
  const ProcessResult refused = cp.Cli({"submit", bad});
  EXPECT_EQ(refused.exit_code, 2);
  EXPECT_THAT(refused.err, HasSubstr("bad.yaml:3:19: training.steps: expected an integer"));
  EXPECT_EQ(cp.Cli({"status", "j-999999"}).exit_code, 2);
  EXPECT_EQ(cp.Cli({"cancel", job_id}).exit_code, 2);  // it already succeeded
  EXPECT_TRUE(cp.ServerRunning());
}

TEST(ControlPlaneJobsTest, TwoRankJobMatchesTheStandaloneRun) {
  ControlPlane cp("cp_two_rank");
  cp.StartServer({.local_agent = true, .local_slots = 2});
  const std::string yaml = TinySpec({.name = "two", .ranks_per_node = 2, .steps = 40});
  const std::string spec = cp.WriteSpec("two.yaml", yaml);
  const ProcessResult submitted = cp.Cli({"submit", spec, "--watch"});
  ASSERT_EQ(submitted.exit_code, 0) << submitted.out << submitted.err;
  const std::string job_id = submitted.out.substr(0, submitted.out.find('\n'));
  const v1::GetJobReply reply = cp.Status(job_id);
  ASSERT_EQ(reply.attempts_size(), 1);
  EXPECT_EQ(reply.attempts(0).mesh().dp(), 2);
  EXPECT_EQ(reply.attempts(0).placement_size(), 2);

  const ProcessResult logs = cp.Cli({"logs", job_id});
  EXPECT_THAT(logs.out, HasSubstr("[rank 0] "));
  EXPECT_THAT(logs.out, HasSubstr("[rank 1] "));
  const ProcessResult standalone =
      RunProcess({BinaryDir() + "/worker/trainyard-worker", "--standalone", spec}, 300);
  ASSERT_EQ(standalone.exit_code, 0) << standalone.err;
  const std::string coordinated_loss = FinalLossOf(cp.Cli({"logs", job_id, "--rank", "0"}).out);
  EXPECT_FALSE(coordinated_loss.empty());
  EXPECT_EQ(coordinated_loss, FinalLossOf(standalone.out));
}

// An MoE job's routing travels from both ranks' reports, through the agent's relay and the
// coordinator, to `trainyard status`; the done line adds the run's worst layer.
TEST(ControlPlaneJobsTest, MoeJobsRoutingReachesStatus) {
  ControlPlane cp("cp_moe");
  cp.StartServer({.local_agent = true, .local_slots = 2});
  const std::string spec = cp.WriteSpec(
      "moe.yaml", TinySpec({.name = "moe",
                            .ranks_per_node = 2,
                            .steps = 8,
                            .model = "{preset: gpt2-debug, moe: {experts: 4, top_k: 2}}"}));
  const ProcessResult submitted = cp.Cli({"submit", spec, "--watch"});
  ASSERT_EQ(submitted.exit_code, 0) << submitted.out << submitted.err;
  const std::string job_id = submitted.out.substr(0, submitted.out.find('\n'));

  const v1::Progress progress = cp.Status(job_id).job().progress();
  EXPECT_EQ(progress.step(), 8);
  ASSERT_EQ(progress.moe_size(), 2) << "gpt2-debug's two blocks are both MoE blocks";
  for (int i = 0; i < 2; ++i) {
    const v1::MoeLayerProgress& layer = progress.moe(i);
    SCOPED_TRACE(layer.DebugString());
    EXPECT_EQ(layer.layer(), i);
    ASSERT_EQ(layer.tokens_per_expert_size(), 4);
    ASSERT_GE(layer.steps(), 1);
    // Both ranks' tokens: 2 ranks × 4 sequences × 16 tokens a step, each picking 2 experts.
    EXPECT_EQ(layer.tokens(), 128 * layer.steps());
    int64_t picks = 0;
    for (const int64_t p : layer.tokens_per_expert()) picks += p;
    EXPECT_EQ(picks, 2 * layer.tokens());
    EXPECT_GE(layer.tokens_max_share(), 0.5);  // top_k / experts at best
    EXPECT_LE(layer.tokens_max_share(), 1.0);
    EXPECT_GE(layer.tokens_cv(), 0.0);
    EXPECT_EQ(layer.balance(), v1::MOE_BALANCE_AUX_LOSS);
    EXPECT_GT(layer.aux_loss(), 0.0);
    EXPECT_EQ(layer.dropped_total(), 0) << "dropless";
  }
  const ProcessResult status = cp.Cli({"status", job_id});
  EXPECT_EQ(status.exit_code, 0);
  EXPECT_THAT(status.out, HasSubstr("moe routing (tokens per expert over the last "));
  EXPECT_THAT(status.out, HasSubstr("aux loss "));
  const std::string log = cp.Cli({"logs", job_id, "--rank", "0"}).out;
  EXPECT_THAT(log, HasSubstr("moe max expert share "));
  EXPECT_FALSE(FinalLossOf(log).empty()) << "the exact final loss stays the done line's last";
}

TEST(ControlPlaneJobsTest, FourRanksSpanTwoAgents) {
  ControlPlane cp("cp_four_rank");
  cp.StartServer();
  cp.StartAgent("node-a", 2);
  cp.StartAgent("node-b", 2);
  const std::string spec = cp.WriteSpec(
      "four.yaml", TinySpec({.name = "four", .nodes = 2, .ranks_per_node = 2, .steps = 20}));
  const ProcessResult submitted = cp.Cli({"submit", spec, "--watch"}, 300);
  ASSERT_EQ(submitted.exit_code, 0) << submitted.out << submitted.err;
  const std::string job_id = submitted.out.substr(0, submitted.out.find('\n'));
  const v1::GetJobReply reply = cp.Status(job_id);
  ASSERT_EQ(reply.attempts_size(), 1);
  std::set<std::string> nodes;
  for (const v1::RankPlacement& place : reply.attempts(0).placement()) {
    nodes.insert(place.node_id());
  }
  EXPECT_EQ(nodes, (std::set<std::string>{"node-a", "node-b"}));
  EXPECT_EQ(reply.attempts(0).exits_size(), 4);
  for (const v1::RankExit& exit : reply.attempts(0).exits()) {
    EXPECT_EQ(exit.exit_code(), 0);
    EXPECT_EQ(exit.signal(), 0);
  }
}

TEST(ControlPlaneJobsTest, JobsNeedingEverySlotRunOneAfterTheOtherByPriority) {
  ControlPlane cp("cp_priority");
  cp.StartServer();  // no agent yet: both jobs queue
  const std::string low = cp.Submit(cp.WriteSpec(
      "low.yaml", TinySpec({.name = "low", .ranks_per_node = 2, .steps = 30, .priority = 1})));
  const std::string high = cp.Submit(cp.WriteSpec(
      "high.yaml", TinySpec({.name = "high", .ranks_per_node = 2, .steps = 30, .priority = 5})));
  ASSERT_FALSE(low.empty());
  ASSERT_FALSE(high.empty());
  const ProcessResult queued = cp.Cli({"list", "--state", "queued", "--json"});
  EXPECT_THAT(queued.out, HasSubstr(low));
  EXPECT_THAT(queued.out, HasSubstr(high));
  cp.StartAgent("node-a", 2);
  EXPECT_EQ(cp.Cli({"watch", low}, 300).exit_code, 0);
  EXPECT_EQ(cp.Cli({"watch", high}, 300).exit_code, 0);
  const v1::Job first = cp.Status(high).job();
  const v1::Job second = cp.Status(low).job();
  EXPECT_GT(first.started_unix_ms(), 0);
  EXPECT_LE(first.started_unix_ms(), second.started_unix_ms());
  EXPECT_LE(first.finished_unix_ms(), second.started_unix_ms())
      << "both need every slot, so the second may only start once the first has finished";
}

TEST(ControlPlaneJobsTest, CancelStopsEveryWorkerWithinTheGracePeriod) {
  ControlPlane cp("cp_cancel");
  cp.StartServer({.local_agent = true, .local_slots = 2, .stop_grace_s = 2});
  const std::string job_id = cp.Submit(
      cp.WriteSpec("long.yaml", TinySpec({.name = "long", .ranks_per_node = 2, .steps = 1000000})));
  ASSERT_TRUE(cp.WaitForStep(job_id, 5, 120));
  std::vector<int64_t> pids;
  const v1::GetJobReply running = cp.Status(job_id);
  ASSERT_EQ(running.attempts_size(), 1);
  for (const v1::RankPlacement& place : running.attempts(0).placement()) {
    pids.push_back(place.pid());
  }
  ASSERT_EQ(pids.size(), 2u);
  for (int64_t pid : pids) EXPECT_FALSE(ProcessGone(pid)) << pid;

  const auto cancelled_at = std::chrono::steady_clock::now();
  const ProcessResult cancel = cp.Cli({"cancel", job_id, "--reason", "test"});
  EXPECT_EQ(cancel.exit_code, 0) << cancel.err;
  const ProcessResult watch = cp.Cli({"watch", job_id}, 60);
  EXPECT_EQ(watch.exit_code, 4) << watch.out << watch.err;
  for (int64_t pid : pids) {
    while (!ProcessGone(pid) && std::chrono::steady_clock::now() - cancelled_at <
                                    std::chrono::milliseconds(2000 + 1500)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    EXPECT_TRUE(ProcessGone(pid)) << "worker " << pid << " outlived the grace period";
  }
  EXPECT_TRUE(cp.WorkerPids().empty());
  const v1::GetJobReply cancelled = cp.Status(job_id);
  EXPECT_EQ(cancelled.job().state(), v1::JOB_STATE_CANCELLED);
  // The event says who cancelled; the ranks it stopped are not listed as failures.
  std::string causes;
  for (const v1::Event& event : cancelled.events()) absl::StrAppend(&causes, event.cause(), "\n");
  EXPECT_THAT(causes, ::testing::ContainsRegex("cancelled by [^:]+: test"));
  const std::string status = cp.Cli({"status", job_id}).out;
  EXPECT_THAT(status, ::testing::Not(::testing::HasSubstr("failures")));
}

}  // namespace
}  // namespace trainyard::testenv
