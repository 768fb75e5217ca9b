#include "tools/cli/format.h"

#include <cmath>
#include <limits>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainyard::cli {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(FormatTest, StateNames) {
  EXPECT_EQ(StateName(v1::JOB_STATE_RUNNING), "RUNNING");
  EXPECT_EQ(StateName(v1::JOB_STATE_CANCELLED), "CANCELLED");
  EXPECT_EQ(StateName(v1::JOB_STATE_DRAINED), "DRAINED");
  EXPECT_EQ(AttemptStateName(v1::ATTEMPT_STATE_STOPPING), "STOPPING");
}

TEST(FormatTest, Durations) {
  EXPECT_EQ(FormatDuration(-1), "-");
  EXPECT_EQ(FormatDuration(850), "850ms");
  EXPECT_EQ(FormatDuration(42'900), "42s");
  EXPECT_EQ(FormatDuration(185'000), "3m05s");
  EXPECT_EQ(FormatDuration(7'440'000), "2h04m");
  EXPECT_EQ(FormatDuration(266'400'000), "3d02h");
}

TEST(FormatTest, Counts) {
  EXPECT_EQ(FormatCount(950), "950");
  EXPECT_EQ(FormatCount(12'345), "12.3k");
  EXPECT_EQ(FormatCount(4'560'000), "4.56M");
  EXPECT_EQ(FormatCount(std::nan("")), "-");
}

TEST(FormatTest, Exits) {
  v1::RankExit exit;
  exit.set_exit_code(3);
  EXPECT_EQ(FormatExit(exit), "exit code 3");
  exit.set_signal(9);
  EXPECT_EQ(FormatExit(exit), "killed by signal 9 (SIGKILL)");
  exit.set_signal(0);
  exit.set_exit_code(-1);
  EXPECT_EQ(FormatExit(exit), "exit status unknown");
}

TEST(FormatTest, TimesAreUtc) {
  EXPECT_EQ(FormatTime(0), "-");
  EXPECT_EQ(FormatTime(1'700'000'000'000), "2023-11-14 22:13:20 UTC");
}

TEST(FormatTest, ProgressBars) {
  EXPECT_EQ(ProgressBar(0, 4), "[----]");
  EXPECT_EQ(ProgressBar(0.5, 4), "[##--]");
  EXPECT_EQ(ProgressBar(1.7, 4), "[####]");
  EXPECT_EQ(ProgressBar(std::nan(""), 4), "[----]");
}

TEST(FormatTest, Sparklines) {
  EXPECT_EQ(Sparkline({}, 10), "");
  EXPECT_EQ(Sparkline({4, 3, 2, 1}, 10), "█▆▃▁");
  EXPECT_EQ(Sparkline({1, 1, 1}, 10), "▄▄▄");
  // Only the last `width` finite values.
  EXPECT_EQ(Sparkline({100, 5, std::numeric_limits<double>::infinity(), 1, 5}, 3), "█▁█");
}

v1::Job RunningJob() {
  v1::Job job;
  job.set_id("j-000004");
  job.set_name("tiny");
  job.set_state(v1::JOB_STATE_RUNNING);
  job.set_world_size(2);
  job.set_attempts(1);
  job.mutable_progress()->set_step(150);
  job.mutable_progress()->set_total_steps(300);
  job.mutable_progress()->set_loss(2.5);
  job.mutable_progress()->set_tokens_per_second(12'345);
  job.mutable_progress()->set_eta_ms(42'000);
  return job;
}

TEST(FormatTest, WatchLineShowsBarStepLossSparklineRateAndEta) {
  const std::string line = WatchLine(RunningJob(), {3.0, 2.5}, 0);
  EXPECT_EQ(line,
            "j-000004 tiny RUNNING [############------------]  50% | step 150/300 | loss 2.5000 "
            "█▁ | 12.3k tok/s | ETA 42s");
  v1::Job queued;
  queued.set_id("j-1");
  queued.set_name("x");
  queued.set_state(v1::JOB_STATE_QUEUED);
  EXPECT_EQ(WatchLine(queued, {}, 0), "j-1 x QUEUED | waiting for slots");
}

TEST(FormatTest, OutcomeLines) {
  v1::Job job = RunningJob();
  job.set_state(v1::JOB_STATE_FAILED);
  job.set_started_unix_ms(1000);
  job.set_finished_unix_ms(63'000);
  job.set_restarts(2);
  job.set_message("rank 1 on node-b: killed by signal 9");
  EXPECT_EQ(OutcomeLine(job),
            "j-000004 tiny FAILED after 1m02s | step 150/300 | loss 2.5000 | 2 restarts | rank 1 "
            "on node-b: killed by signal 9");
  EXPECT_EQ(OutcomeExitCode(v1::JOB_STATE_SUCCEEDED), 0);
  EXPECT_EQ(OutcomeExitCode(v1::JOB_STATE_FAILED), 1);
  EXPECT_EQ(OutcomeExitCode(v1::JOB_STATE_CANCELLED), 4);
  EXPECT_EQ(OutcomeExitCode(v1::JOB_STATE_DRAINED), 5);
  EXPECT_EQ(OutcomeExitCode(v1::JOB_STATE_RUNNING), -1);
}

TEST(FormatTest, JobTable) {
  v1::Job queued;
  queued.set_id("j-000005");
  queued.set_name("second");
  queued.set_state(v1::JOB_STATE_QUEUED);
  queued.set_priority(-3);
  queued.set_world_size(4);
  queued.set_created_unix_ms(100'000);
  const std::string table = JobTable({RunningJob(), queued}, 160'000);
  EXPECT_EQ(table,
            "ID        NAME    STATE    PRIORITY  RANKS  STEP     LOSS    AGE    USER\n"
            "j-000004  tiny    RUNNING  0         2      150/300  2.5000  -      -\n"
            "j-000005  second  QUEUED   -3        4      -        -       1m00s  -\n");
}

TEST(FormatTest, ReportNamesTheFailedRankNodeExitAndLastLogLines) {
  v1::GetJobReply reply;
  *reply.mutable_job() = RunningJob();
  reply.mutable_job()->set_state(v1::JOB_STATE_FAILED);
  reply.mutable_job()->set_attempts(2);
  reply.mutable_job()->set_restarts(1);
  reply.mutable_job()->set_max_restarts(1);
  reply.mutable_job()->set_message("restart limit reached");
  (*reply.mutable_job()->mutable_labels())["team"] = "infra";
  for (int id = 1; id <= 2; ++id) {
    v1::Attempt* attempt = reply.add_attempts();
    attempt->set_attempt_id(id);
    attempt->set_state(v1::ATTEMPT_STATE_FAILED);
    attempt->mutable_mesh()->set_dp(2);
    attempt->mutable_mesh()->set_tp(1);
    attempt->mutable_mesh()->set_pp(1);
    v1::RankPlacement* place = attempt->add_placement();
    place->set_rank(0);
    place->set_node_id("node-a");
    place->set_pid(100 + id);
    v1::RankExit* ok = attempt->add_exits();
    ok->set_rank(0);
    ok->set_node_id("node-a");
    v1::RankExit* bad = attempt->add_exits();
    bad->set_rank(1);
    bad->set_node_id("node-b");
    bad->set_hostname("host-b");
    bad->set_signal(9);
    bad->set_pid(4242 + id);
    bad->add_last_log_lines(absl::StrCat("attempt ", id, " step 3"));
    bad->add_last_log_lines("the last line");
  }
  v1::Event* event = reply.add_events();
  event->set_kind("failed");
  event->set_to_state(v1::JOB_STATE_FAILED);
  event->set_cause("restart limit reached");
  const std::string report = JobReport(reply, 0);
  EXPECT_THAT(report, HasSubstr("job j-000004 (tiny)\n"));
  EXPECT_THAT(report, HasSubstr("state       FAILED"));
  EXPECT_THAT(report, HasSubstr("labels      team=infra"));
  EXPECT_THAT(report, HasSubstr("attempts    2 (1 restarts of 1 allowed)"));
  EXPECT_THAT(report, HasSubstr("mesh        dp 2 × tp 1 × pp 1, ZeRO-0, 2 ranks"));
  EXPECT_THAT(report, HasSubstr("placement   attempt 2 FAILED: 0→node-a:0 (pid 102)"));
  EXPECT_THAT(report, HasSubstr("step 150/300 (50%) | loss 2.5000 | 12.3k tok/s"));
  EXPECT_THAT(report, HasSubstr("ETA         -"));  // only a running job has one
  EXPECT_THAT(report, HasSubstr("checkpoint  none"));
  EXPECT_THAT(report,
              HasSubstr("  attempt 2: rank 1 on node node-b (host-b): killed by signal 9 "
                        "(SIGKILL), pid 4244\n    | attempt 2 step 3\n    | the last line\n"));
  EXPECT_THAT(report, HasSubstr("  attempt 1: rank 1 on node node-b (host-b): killed by signal 9 "
                                "(SIGKILL), pid 4243\n"));
  EXPECT_THAT(report, Not(HasSubstr("attempt 1 step 3")));  // older attempts: one line each
  EXPECT_THAT(report, Not(HasSubstr("rank 0 on node")));    // rank 0 exited cleanly
  EXPECT_THAT(report, HasSubstr("FAILED  failed  restart limit reached"));
}

// `trainyard status JOB` shows the optimizer's signals under the progress, and the logit z-loss
// beside the loss only for a job that has one.
TEST(FormatTest, ReportShowsTheOptimizerAndTheLogitZLossWhereThereIsOne) {
  v1::GetJobReply reply;
  *reply.mutable_job() = RunningJob();
  v1::Progress* p = reply.mutable_job()->mutable_progress();
  p->set_learning_rate(0.0003);
  p->set_grad_norm(1.25);
  EXPECT_THAT(JobReport(reply, 0), HasSubstr("step 150/300 (50%) | loss 2.5000 | 12.3k tok/s"));
  EXPECT_THAT(JobReport(reply, 0),
              HasSubstr("  optimizer   lr 0.0003 | grad norm 1.25 before clipping\n"));
  p->set_logit_z_loss(0.0125);
  p->set_has_val_loss(true);
  p->set_val_loss(2.75);
  EXPECT_THAT(JobReport(reply, 0), HasSubstr("step 150/300 (50%) | loss 2.5000 | z-loss 0.0125 | "
                                             "val loss 2.7500 | 12.3k tok/s"));
  p->set_step(0);  // nothing stepped yet: no optimizer row
  EXPECT_THAT(JobReport(reply, 0), Not(HasSubstr("optimizer")));
}

// A context-parallel mesh names cp; one without (cp 1, or 0 from an older coordinator) reads as
// before.
// A running job of 4 ranks in the spec whose attempt runs on dp 2 × tp 1 × pp 1.
v1::Mesh* JobOfFourRanksOnDp2(v1::GetJobReply* reply) {
  *reply->mutable_job() = RunningJob();
  reply->mutable_job()->set_world_size(4);
  v1::Mesh* mesh = reply->add_attempts()->mutable_mesh();
  mesh->set_dp(2);
  mesh->set_tp(1);
  mesh->set_pp(1);
  return mesh;
}

TEST(FormatTest, ReportNamesContextParallelismOnlyWhenTheMeshHasIt) {
  v1::GetJobReply reply;
  v1::Mesh* mesh = JobOfFourRanksOnDp2(&reply);
  mesh->set_cp(2);
  EXPECT_THAT(JobReport(reply, 0),
              HasSubstr("mesh        dp 2 × cp 2 × tp 1 × pp 1, ZeRO-0, 4 ranks"));
  mesh->set_dp(4);
  mesh->set_cp(1);
  EXPECT_THAT(JobReport(reply, 0), HasSubstr("mesh        dp 4 × tp 1 × pp 1, ZeRO-0, 4 ranks"));
  mesh->set_cp(0);
  EXPECT_THAT(JobReport(reply, 0), HasSubstr("mesh        dp 4 × tp 1 × pp 1, ZeRO-0, 4 ranks"));
}

// An elastic attempt on fewer (or more) ranks than the spec's shows its own, and the spec's.
TEST(FormatTest, ReportShowsTheRanksOfAResizedAttempt) {
  v1::GetJobReply reply;
  JobOfFourRanksOnDp2(&reply);
  EXPECT_THAT(JobReport(reply, 0),
              HasSubstr("mesh        dp 2 × tp 1 × pp 1, ZeRO-0, 2 ranks (resized: the spec "
                        "asks for 4)\n"));
}

TEST(FormatTest, QueuedJobsSayWhyTheyWait) {
  v1::Job job = RunningJob();
  job.set_state(v1::JOB_STATE_QUEUED);
  job.clear_progress();
  job.set_waiting_reason(
      "it cannot be placed on the connected nodes: it needs 1 node with 8 CPU "
      "slots; the largest connected node, node-a, has 4");
  EXPECT_THAT(JobTable({job}, 0), HasSubstr("\nj-000004 waits: it cannot be placed"));
  v1::GetJobReply reply;
  *reply.mutable_job() = job;
  EXPECT_THAT(JobReport(reply, 0), HasSubstr("waiting     it cannot be placed"));
  EXPECT_THAT(WatchLine(job, {}, 0), HasSubstr("QUEUED | it cannot be placed"));
}

// An MoE job's status has one row per MoE layer, with its balancing rule's figure; a dense job
// has none.
TEST(FormatTest, ReportShowsAnMoeJobsRoutingPerLayer) {
  v1::GetJobReply reply;
  *reply.mutable_job() = RunningJob();
  EXPECT_THAT(JobReport(reply, 0), Not(HasSubstr("moe routing")));
  v1::Progress* p = reply.mutable_job()->mutable_progress();
  v1::MoeLayerProgress* aux = p->add_moe();
  aux->set_layer(1);
  aux->set_steps(5);
  for (int64_t picks : {3000, 12500, 0, 4500}) aux->add_tokens_per_expert(picks);
  aux->set_tokens_min(0);
  aux->set_tokens_max(12500);
  aux->set_tokens_cv(0.9354);
  aux->set_tokens_max_share(0.625);
  aux->set_dead_experts(1);
  aux->set_dropped(17);
  aux->set_balance(v1::MOE_BALANCE_AUX_LOSS);
  aux->set_aux_loss(0.01234);
  v1::MoeLayerProgress* bias = p->add_moe();
  bias->set_layer(3);
  bias->set_steps(5);
  for (int64_t picks : {5000, 5000, 5000, 5000}) bias->add_tokens_per_expert(picks);
  bias->set_tokens_min(5000);
  bias->set_tokens_max(5000);
  bias->set_tokens_max_share(0.25);
  bias->set_balance(v1::MOE_BALANCE_BIAS);
  bias->set_bias_spread(0.004);
  const std::string report = JobReport(reply, 0);
  EXPECT_THAT(report,
              HasSubstr("moe routing (tokens per expert over the last 5 steps):\n"
                        "  LAYER  MIN   MAX    CV     MAX SHARE  DEAD  DROPPED  BALANCE\n"
                        "  1      0     12.5k  0.935  0.625      1/4   17       aux loss "
                        "0.01234\n"
                        "  3      5.0k  5.0k   0.000  0.250      0/4   0        bias spread "
                        "0.004\n"));
  bias->set_balance(v1::MOE_BALANCE_UNSPECIFIED);
  EXPECT_THAT(JobReport(reply, 0), HasSubstr("aux loss 0, bias spread 0.004"));
  // The router z-loss beside either rule's figure, when the layer has one.
  bias->set_balance(v1::MOE_BALANCE_BIAS);
  bias->set_z_loss(0.00321);
  EXPECT_THAT(JobReport(reply, 0), HasSubstr("bias spread 0.004, router z-loss 0.00321"));
}

// Ranks that ended on the coordinator's stop order (here a cancel) are not failures.
TEST(FormatTest, ACancelledJobListsNoFailures) {
  v1::GetJobReply reply;
  *reply.mutable_job() = RunningJob();
  reply.mutable_job()->set_state(v1::JOB_STATE_CANCELLED);
  v1::Attempt* attempt = reply.add_attempts();
  attempt->set_attempt_id(1);
  attempt->set_state(v1::ATTEMPT_STATE_CANCELLED);
  for (int rank = 0; rank < 2; ++rank) {
    v1::RankExit* exit = attempt->add_exits();
    exit->set_rank(rank);
    exit->set_node_id("node-a");
    exit->set_signal(15);
    exit->set_stopped(true);
    exit->set_message("stopped by the coordinator: cancelled by alice");
  }
  const std::string report = JobReport(reply, 0);
  EXPECT_THAT(report, Not(HasSubstr("failures")));
  attempt->mutable_exits(1)->set_stopped(false);  // one rank failed by itself first
  EXPECT_THAT(JobReport(reply, 0), HasSubstr("failures (newest first):\n  attempt 1: rank 1"));
}

TEST(FormatTest, JsonStrings) {
  EXPECT_EQ(JsonString("a\"b\\c\nd\te"), "\"a\\\"b\\\\c\\nd\\te\"");
  EXPECT_EQ(JsonString(std::string("\x01", 1)), "\"\\u0001\"");
  EXPECT_EQ(JsonString("héllo ▁"), "\"héllo ▁\"");
  EXPECT_EQ(JsonString("bad \xff byte"), "\"bad \\ufffd byte\"");
  EXPECT_EQ(JsonString("cut \xe2\x96"), "\"cut \\ufffd\\ufffd\"");
}

TEST(FormatTest, JsonOfMessagesUsesProtoNames) {
  v1::Job job = RunningJob();
  const std::string json = ToJson(job);
  EXPECT_THAT(json, HasSubstr("\"id\":\"j-000004\""));
  EXPECT_THAT(json, HasSubstr("\"state\":\"JOB_STATE_RUNNING\""));
  EXPECT_THAT(json, HasSubstr("\"world_size\":2"));
  EXPECT_THAT(json, HasSubstr("\"total_steps\":\"300\""));  // int64 as a string, per proto3 JSON
  EXPECT_THAT(json, Not(HasSubstr("\n")));
}

}  // namespace
}  // namespace trainyard::cli
