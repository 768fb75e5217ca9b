// An MoE job's routing from its rank 0's progress reports to what `trainyard status` and
// /metrics show: the supervisor driven by hand (fake clock and agents), the reports and the
// status through the gRPC edge's conversions, /metrics through MetricFamilies.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/text_serializer.h"
#include "server/convert.h"
#include "server/metrics.h"
#include "tests/unit/server/supervisor_fixture.h"

namespace trainyard::server {
namespace {

using testing::Agent;
using ::testing::HasSubstr;
using ::testing::Not;
using testing::SupervisorTest;
using testing::TinySpec;

std::string MoeSpec(const std::string& name) {
  return absl::StrReplaceAll(TinySpec(name), {{"model: {preset: gpt2-debug}",
                                               "model: {preset: gpt2-debug, moe: {experts: 4, "
                                               "top_k: 2}}"}});
}

// Rank `rank`'s report at `step` with two MoE layers: block 0 evenly loaded, block 1 collapsed
// onto expert 2 (top_k 2, so expert 2 took every token and the others shared the second picks).
v1::ProgressReport MoeReport(const std::string& job_id, int rank, int64_t step) {
  v1::ProgressReport report;
  report.set_job_id(job_id);
  report.set_attempt_id(1);
  report.set_rank(rank);
  report.set_step(step);
  report.set_total_steps(5);
  report.set_loss(3.5);
  report.mutable_step_times()->set_total_ms(100);
  v1::MoeLayerProgress* even = report.add_moe();
  even->set_layer(0);
  even->set_steps(2);
  for (int64_t picks : {16, 16, 16, 16}) even->add_tokens_per_expert(picks);
  even->set_tokens(32);
  even->set_balance(v1::MOE_BALANCE_AUX_LOSS);
  even->set_aux_loss(0.0101);
  v1::MoeLayerProgress* collapsed = report.add_moe();
  collapsed->set_layer(1);
  collapsed->set_steps(2);
  for (int64_t picks : {20, 12, 32, 0}) collapsed->add_tokens_per_expert(picks);
  collapsed->set_tokens(32);
  collapsed->set_dropped(7);
  collapsed->set_dropped_total(19);
  collapsed->set_balance(v1::MOE_BALANCE_AUX_LOSS);
  collapsed->set_aux_loss(0.0377);
  // What the worker derived is not taken on trust: the coordinator derives it again.
  collapsed->set_tokens_cv(99);
  return report;
}

std::string MetricsText(Supervisor& supervisor) {
  return prometheus::TextSerializer().Serialize(MetricFamilies(supervisor.Metrics()));
}

class MoeStatusTest : public SupervisorTest {
 protected:
  // Submits `spec` and brings its two ranks to RUNNING.
  std::string Run(const std::string& spec) {
    const std::string id = Submit(spec);
    agent_ = Connect("node-a", 2);
    Started(agent_, id, 1, 0);
    Started(agent_, id, 1, 1);
    JoinAll(id, 1, 2);
    EXPECT_EQ(State(id), JobState::kRunning);
    return id;
  }
  v1::Job StatusOf(const std::string& id) {
    v1::Job job;
    ToProto(View(id).job, &job);
    return job;
  }
  Agent agent_;
};

TEST_F(MoeStatusTest, RankZerosRoutingShowsInStatusAndMetricsAndSurvivesARestart) {
  const std::string id = Run(MoeSpec("moe"));
  ASSERT_TRUE(supervisor_->ReportProgress(FromProto(MoeReport(id, 0, 2))).ok());
  // Another rank's report changes nothing (every rank sends the same; rank 0's is shown).
  v1::ProgressReport other = MoeReport(id, 1, 2);
  other.mutable_moe(1)->set_dropped_total(1000);
  ASSERT_TRUE(supervisor_->ReportProgress(FromProto(other)).ok());

  StoreProgress();
  v1::Job job = StatusOf(id);
  ASSERT_EQ(job.progress().moe_size(), 2);
  const v1::MoeLayerProgress& layer = job.progress().moe(1);
  EXPECT_EQ(layer.layer(), 1);
  EXPECT_EQ(layer.steps(), 2);
  EXPECT_EQ(layer.tokens_per_expert_size(), 4);
  EXPECT_EQ(layer.tokens_min(), 0);
  EXPECT_EQ(layer.tokens_max(), 32);
  EXPECT_DOUBLE_EQ(layer.tokens_max_share(), 1.0);
  EXPECT_NEAR(layer.tokens_cv(), 0.7288689868556626, 1e-12);  // sqrt(136) / 16
  EXPECT_EQ(layer.dead_experts(), 1);
  EXPECT_EQ(layer.dropped(), 7);
  EXPECT_EQ(layer.dropped_total(), 19);
  EXPECT_EQ(layer.balance(), v1::MOE_BALANCE_AUX_LOSS);
  EXPECT_DOUBLE_EQ(layer.aux_loss(), 0.0377);
  EXPECT_DOUBLE_EQ(job.progress().moe(0).tokens_max_share(), 0.5);

  const std::string labels =
      absl::StrCat("job_id=\"", id, "\",job_name=\"moe\",label_team=\"research\"");
  std::string text = MetricsText(*supervisor_);
  EXPECT_THAT(text, HasSubstr("# TYPE trainyard_moe_expert_tokens_cv gauge"));
  EXPECT_THAT(text, HasSubstr("# TYPE trainyard_moe_dropped_tokens_total counter"));
  EXPECT_THAT(text, HasSubstr(absl::StrCat("trainyard_moe_expert_tokens_max_share{", labels,
                                           ",layer=\"1\"} 1")));
  EXPECT_THAT(text, HasSubstr(absl::StrCat("trainyard_moe_expert_tokens_max_share{", labels,
                                           ",layer=\"0\"} 0.5")));
  EXPECT_THAT(text, HasSubstr(absl::StrCat("trainyard_moe_expert_tokens_cv{", labels,
                                           ",layer=\"1\"} 0.728868")));
  EXPECT_THAT(
      text, HasSubstr(absl::StrCat("trainyard_moe_expert_tokens_cv{", labels, ",layer=\"0\"} 0")));
  EXPECT_THAT(text,
              HasSubstr(absl::StrCat("trainyard_moe_dead_experts{", labels, ",layer=\"1\"} 1")));
  EXPECT_THAT(text, HasSubstr(absl::StrCat("trainyard_moe_dropped_tokens_total{", labels,
                                           ",layer=\"1\"} 19")));
  EXPECT_THAT(text,
              HasSubstr(absl::StrCat("trainyard_moe_aux_loss{", labels, ",layer=\"1\"} 0.0377")));
  EXPECT_THAT(text, Not(HasSubstr("trainyard_moe_bias_spread{"))) << "the aux-loss rule only";

  // A report of the run's end without routing (none is expected, but it must not erase any)
  // keeps the newest figures.
  v1::ProgressReport plain = MoeReport(id, 0, 3);
  plain.clear_moe();
  ASSERT_TRUE(supervisor_->ReportProgress(FromProto(plain)).ok());
  EXPECT_EQ(StatusOf(id).progress().moe_size(), 2);

  // Stored as progress is: a restarted coordinator shows the same.
  AdvanceWithHeartbeats(absl::Seconds(2), {agent_});
  Restart();
  job = StatusOf(id);
  EXPECT_EQ(job.progress().step(), 3);
  ASSERT_EQ(job.progress().moe_size(), 2);
  EXPECT_EQ(job.progress().moe(1).dropped_total(), 19);
  EXPECT_DOUBLE_EQ(job.progress().moe(1).aux_loss(), 0.0377);
  EXPECT_EQ(job.progress().moe(1).dead_experts(), 1);
  EXPECT_THAT(
      MetricsText(*supervisor_),
      HasSubstr(absl::StrCat("trainyard_moe_dropped_tokens_total{", labels, ",layer=\"1\"} 19")));
}

TEST_F(MoeStatusTest, SeriesGoWithTheJobsOtherSeries) {
  const std::string id = Run(MoeSpec("moe"));
  ASSERT_TRUE(supervisor_->ReportProgress(FromProto(MoeReport(id, 0, 5))).ok());
  Exit(agent_, id, 1, 0, 0);
  Exit(agent_, id, 1, 1, 0);
  ASSERT_EQ(State(id), JobState::kSucceeded);
  EXPECT_THAT(MetricsText(*supervisor_),
              HasSubstr("trainyard_moe_expert_tokens_cv{job_id=\"" + id));
  AdvanceWithHeartbeats(options_.finished_job_metrics_retention + absl::Seconds(1), {agent_});
  const std::string text = MetricsText(*supervisor_);
  EXPECT_THAT(text, Not(HasSubstr("trainyard_job_step{job_id=\"" + id)));
  EXPECT_THAT(text, Not(HasSubstr("trainyard_moe_expert_tokens_cv{job_id=\"" + id)));
  EXPECT_THAT(text, Not(HasSubstr("trainyard_moe_dropped_tokens_total{job_id=\"" + id)));
}

TEST_F(MoeStatusTest, ADenseJobHasNoRouting) {
  const std::string id = Run(TinySpec("dense"));
  v1::ProgressReport report = MoeReport(id, 0, 2);
  report.clear_moe();
  ASSERT_TRUE(supervisor_->ReportProgress(FromProto(report)).ok());
  EXPECT_EQ(StatusOf(id).progress().moe_size(), 0);
  const std::string text = MetricsText(*supervisor_);
  EXPECT_THAT(text, HasSubstr("trainyard_job_step{job_id=\"" + id));
  EXPECT_THAT(text, Not(HasSubstr("trainyard_moe_expert_tokens_cv{")));
}

// A running job's metrics with one MoE layer under the bias rule, whose picks are `picks`.
JobMetrics OneLayerJob(const std::string& id, const std::string& name, int layer,
                       std::vector<int64_t> picks) {
  JobMetrics job;
  job.job_id = id;
  job.name = name;
  job.state = JobState::kRunning;
  MoeLayerProgress l;
  l.layer = layer;
  l.steps = 1;
  l.tokens = 0;
  for (int64_t p : picks) l.tokens += p;
  l.tokens_per_expert = std::move(picks);
  l.balance = MoeBalance::kBias;
  job.progress.moe = {l};
  return job;
}

TEST(MoeMetricsTest, EachRulesFigureOnlyForItsRule) {
  MetricsSnapshot snapshot;
  JobMetrics job = OneLayerJob("j-000012", "bias", 3, {3, 5});
  job.progress.moe[0].bias_spread = 0.004;
  snapshot.jobs.push_back(job);
  job.job_id = "j-000013";
  job.name = "unknown";
  job.progress.moe[0].balance = MoeBalance::kUnknown;
  snapshot.jobs.push_back(job);

  const std::string text = prometheus::TextSerializer().Serialize(MetricFamilies(snapshot));
  EXPECT_THAT(text, HasSubstr("trainyard_moe_bias_spread{job_id=\"j-000012\",job_name=\"bias\","
                              "layer=\"3\"} 0.004"));
  EXPECT_THAT(text, HasSubstr("trainyard_moe_expert_tokens_max_share{job_id=\"j-000012\","
                              "job_name=\"bias\",layer=\"3\"} 0.625"));
  EXPECT_THAT(text, Not(HasSubstr("trainyard_moe_aux_loss{job_id=\"j-000012\"")));
  EXPECT_THAT(text, HasSubstr("trainyard_moe_aux_loss{job_id=\"j-000013\""));
  EXPECT_THAT(text, HasSubstr("trainyard_moe_bias_spread{job_id=\"j-000013\""));
  EXPECT_THAT(text, Not(HasSubstr("trainyard_moe_router_z_loss{"))) << "no router z-loss";
}

// The router z-loss is a series of its own, for the layers that report one.
TEST(MoeMetricsTest, TheRouterZLossWhereALayerHasOne) {
  MetricsSnapshot snapshot;
  JobMetrics job = OneLayerJob("j-000014", "z", 1, {4, 4});
  job.progress.moe[0].z_loss = 0.0125;
  snapshot.jobs.push_back(job);
  const std::string text = prometheus::TextSerializer().Serialize(MetricFamilies(snapshot));
  EXPECT_THAT(text, HasSubstr("trainyard_moe_router_z_loss{job_id=\"j-000014\",job_name=\"z\","
                              "layer=\"1\"} 0.0125"));
}

}  // namespace
}  // namespace trainyard::server
