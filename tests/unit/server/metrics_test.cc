#include "server/metrics.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/text_serializer.h"
#include "server/coordinator.h"

namespace trainyard::server {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(MetricsTest, SnapshotBecomesTheDocumentedFamilies) {
  MetricsSnapshot snapshot;
  for (int s = 1; s <= kLastJobState; ++s) snapshot.jobs_by_state[static_cast<JobState>(s)] = 0;
  snapshot.jobs_by_state[JobState::kRunning] = 2;
  snapshot.attempts_total = 5;
  snapshot.restarts_by_cause["node_lost"] = 1;
  JobMetrics job;
  job.job_id = "j-000007";
  job.name = "tiny";
  job.state = JobState::kRunning;
  job.progress.step = 42;
  job.progress.loss = 2.5;
  job.progress.tokens_per_second = 900;
  job.progress.step_times.total_ms = 250;
  job.progress.step_times.backward_ms = 125;
  job.labels = {{"team/area", "research"}};
  snapshot.jobs.push_back(job);
  NodeStatus node;
  node.record.node_id = "node-a";
  node.connected = true;
  node.heartbeat_age = absl::Milliseconds(1500);
  node.free_slots = 3;
  snapshot.nodes.push_back(node);

  const std::string text = prometheus::TextSerializer().Serialize(MetricFamilies(snapshot));
  EXPECT_THAT(text, HasSubstr("trainyard_jobs{state=\"RUNNING\"} 2"));
  EXPECT_THAT(text, HasSubstr("trainyard_jobs{state=\"FAILED\"} 0"));
  EXPECT_THAT(text, HasSubstr("trainyard_attempts_total 5"));
  EXPECT_THAT(text, HasSubstr("trainyard_restarts_total{cause=\"node_lost\"} 1"));
  EXPECT_THAT(text, HasSubstr("trainyard_restarts_total{cause=\"crash\"} 0"));
  EXPECT_THAT(text, HasSubstr("trainyard_job_step{job_id=\"j-000007\",job_name=\"tiny\","
                              "label_team_area=\"research\"} 42"));
  EXPECT_THAT(text, HasSubstr("trainyard_job_state{job_id=\"j-000007\",job_name=\"tiny\","
                              "label_team_area=\"research\",state=\"RUNNING\"} 1"));
  EXPECT_THAT(text, HasSubstr("trainyard_job_loss{"));
  EXPECT_THAT(text, HasSubstr("trainyard_job_step_time_seconds{job_id=\"j-000007\",job_name="
                              "\"tiny\",label_team_area=\"research\"} 0.25"));
  EXPECT_THAT(text, HasSubstr("trainyard_job_step_phase_seconds{job_id=\"j-000007\",job_name="
                              "\"tiny\",label_team_area=\"research\",phase=\"backward\"} 0.125"));
  EXPECT_THAT(text, HasSubstr("trainyard_job_step_phase_seconds{job_id=\"j-000007\",job_name="
                              "\"tiny\",label_team_area=\"research\",phase=\"forward\"} 0"));
  EXPECT_THAT(text, HasSubstr("trainyard_node_heartbeat_age_seconds{node=\"node-a\"} 1.5"));
  EXPECT_THAT(text, HasSubstr("trainyard_node_free_slots{node=\"node-a\"} 3"));
}

// The optimizer's signals and the losses beside the training loss, each only where the job has
// it: a validation loss once it evaluated, a logit z-loss with model.z_loss_coeff, a gradient
// norm and learning rate once a step was reported.
TEST(MetricsTest, TrainingSignalsOnlyWhereTheJobHasThem) {
  MetricsSnapshot snapshot;
  JobMetrics job;
  job.job_id = "j-000012";
  job.name = "signals";
  job.state = JobState::kRunning;
  job.progress.step = 7;
  job.progress.loss = 3.25;
  job.progress.val_loss = 3.5;
  job.progress.logit_z_loss = 0.0625;
  job.progress.grad_norm = 1.75;
  job.progress.learning_rate = 0.0003;
  snapshot.jobs.push_back(job);
  JobMetrics plain;  // a step reported, no evaluation, no z-loss
  plain.job_id = "j-000013";
  plain.name = "plain";
  plain.state = JobState::kRunning;
  plain.progress.step = 3;
  plain.progress.grad_norm = 0.5;
  plain.progress.learning_rate = 0.001;
  snapshot.jobs.push_back(plain);
  JobMetrics fresh;  // nothing reported yet
  fresh.job_id = "j-000014";
  fresh.name = "fresh";
  fresh.state = JobState::kRunning;
  snapshot.jobs.push_back(fresh);

  const std::string text = prometheus::TextSerializer().Serialize(MetricFamilies(snapshot));
  EXPECT_THAT(text, HasSubstr("trainyard_job_val_loss{job_id=\"j-000012\",job_name=\"signals\"} "
                              "3.5\n"));
  EXPECT_THAT(text, HasSubstr("trainyard_job_logit_z_loss{job_id=\"j-000012\",job_name="
                              "\"signals\"} 0.0625\n"));
  EXPECT_THAT(text, HasSubstr("trainyard_job_grad_norm{job_id=\"j-000012\",job_name=\"signals\"} "
                              "1.75\n"));
  EXPECT_THAT(text, HasSubstr("trainyard_job_learning_rate{job_id=\"j-000012\",job_name="
                              "\"signals\"} 0.0003\n"));
  EXPECT_THAT(text, HasSubstr("trainyard_job_grad_norm{job_id=\"j-000013\",job_name=\"plain\"} "
                              "0.5\n"));
  EXPECT_THAT(text, Not(HasSubstr("trainyard_job_val_loss{job_id=\"j-000013\"")));
  EXPECT_THAT(text, Not(HasSubstr("trainyard_job_logit_z_loss{job_id=\"j-000013\"")));
  EXPECT_THAT(text, Not(HasSubstr("trainyard_job_grad_norm{job_id=\"j-000014\"")));
  EXPECT_THAT(text, Not(HasSubstr("trainyard_job_learning_rate{job_id=\"j-000014\"")));
}

TEST(MetricsTest, CheckpointFamiliesPerCheckpointingJob) {
  MetricsSnapshot snapshot;
  JobMetrics job;
  job.job_id = "j-000009";
  job.name = "ckpt";
  job.state = JobState::kRunning;
  job.checkpointing = true;
  job.last_checkpoint = CheckpointInfo{300, "ckpt/step-300", absl::FromUnixSeconds(5)};
  job.last_checkpoint.bytes = 4096;
  job.checkpoints.write_seconds.Observe(0.2);
  job.checkpoints.write_seconds.Observe(45);
  job.checkpoints.blocked_seconds.Observe(0.05);
  job.checkpoints.failures = 2;
  snapshot.jobs.push_back(job);
  JobMetrics plain;  // no checkpoint section: no checkpoint series
  plain.job_id = "j-000010";
  plain.name = "plain";
  snapshot.jobs.push_back(plain);
  JobMetrics fresh = job;  // checkpoints, but none committed yet: no gauges
  fresh.job_id = "j-000011";
  fresh.last_checkpoint = CheckpointInfo{};
  snapshot.jobs.push_back(fresh);

  const std::string text = prometheus::TextSerializer().Serialize(MetricFamilies(snapshot));
  const std::string labels = "job_id=\"j-000009\",job_name=\"ckpt\"";
  EXPECT_THAT(text, HasSubstr("# TYPE trainyard_checkpoint_duration_seconds histogram"));
  EXPECT_THAT(text, HasSubstr("trainyard_checkpoint_duration_seconds_count{" + labels + "} 2"));
  EXPECT_THAT(text, HasSubstr("trainyard_checkpoint_duration_seconds_sum{" + labels + "} 45.2"));
  EXPECT_THAT(
      text, HasSubstr("trainyard_checkpoint_duration_seconds_bucket{" + labels + ",le=\"0.1\"} 0"));
  EXPECT_THAT(text, HasSubstr("trainyard_checkpoint_duration_seconds_bucket{" + labels +
                              ",le=\"0.25\"} 1"));
  EXPECT_THAT(
      text, HasSubstr("trainyard_checkpoint_duration_seconds_bucket{" + labels + ",le=\"60\"} 2"));
  EXPECT_THAT(text, HasSubstr("trainyard_checkpoint_duration_seconds_bucket{" + labels +
                              ",le=\"3600\"} 2"));
  EXPECT_THAT(text, HasSubstr("trainyard_checkpoint_duration_seconds_bucket{" + labels +
                              ",le=\"+Inf\"} 2"));
  EXPECT_THAT(text, HasSubstr("trainyard_checkpoint_blocked_seconds_count{" + labels + "} 1"));
  EXPECT_THAT(text, HasSubstr("trainyard_checkpoint_bytes{" + labels + "} 4096"));
  EXPECT_THAT(text, HasSubstr("trainyard_checkpoint_last_committed_step{" + labels + "} 300"));
  EXPECT_THAT(text, HasSubstr("trainyard_checkpoint_failures_total{" + labels + "} 2"));
  EXPECT_THAT(text, HasSubstr("trainyard_job_step{job_id=\"j-000010\""));
  EXPECT_THAT(text, Not(HasSubstr("trainyard_checkpoint_failures_total{job_id=\"j-000010\"")));
  EXPECT_THAT(text,
              Not(HasSubstr("trainyard_checkpoint_duration_seconds_count{job_id=\"j-000010\"")));
  EXPECT_THAT(text, Not(HasSubstr("trainyard_checkpoint_bytes{job_id=\"j-000011\"")));
  EXPECT_THAT(text, HasSubstr("trainyard_checkpoint_failures_total{job_id=\"j-000011\""));
}

TEST(AddressTest, LoopbackAndHostPortParsing) {
  EXPECT_TRUE(IsLoopbackHost("127.0.0.1"));
  EXPECT_TRUE(IsLoopbackHost("127.1.2.3"));
  EXPECT_TRUE(IsLoopbackHost("localhost"));
  EXPECT_TRUE(IsLoopbackHost("::1"));
  EXPECT_FALSE(IsLoopbackHost("0.0.0.0"));
  EXPECT_FALSE(IsLoopbackHost("10.0.0.1"));
  EXPECT_FALSE(IsLoopbackHost("::"));
  auto v4 = SplitHostPort("127.0.0.1:8080");
  ASSERT_TRUE(v4.ok());
  EXPECT_EQ(v4->first, "127.0.0.1");
  EXPECT_EQ(v4->second, 8080);
  auto v6 = SplitHostPort("[::1]:0");
  ASSERT_TRUE(v6.ok());
  EXPECT_EQ(v6->first, "::1");
  EXPECT_FALSE(SplitHostPort("no-port").ok());
  EXPECT_FALSE(SplitHostPort("host:99999").ok());
  EXPECT_FALSE(SplitHostPort("::1:80").ok());
  EXPECT_FALSE(SplitHostPort(":80").ok());
}

TEST(CoordinatorTest, RefusesAnExposedAddressWithoutTls) {
  CoordinatorOptions options;
  options.listen = "0.0.0.0:0";
  options.state_dir = ::testing::TempDir() + "/coordinator_refuses";
  auto coordinator = Coordinator::Start(options);
  EXPECT_EQ(coordinator.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(coordinator.status().message()), HasSubstr("TLS"));
  options.listen = "127.0.0.1:0";
  options.tls_cert_file = "cert.pem";  // a certificate without a key
  EXPECT_EQ(Coordinator::Start(options).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace trainyard::server
