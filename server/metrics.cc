#include "server/metrics.h"

#include <exception>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"

namespace trainyard::server {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

// A Prometheus label name for a job label key: letters, digits and '_' only.
std::string LabelName(const std::string& key) {
  std::string name = "label_";
  for (char c : key) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
    name.push_back(ok ? c : '_');
  }
  return name;
}

ClientMetric Metric(std::vector<ClientMetric::Label> labels, double value, MetricType type) {
  ClientMetric metric;
  metric.label = std::move(labels);
  if (type == MetricType::Counter) {
    metric.counter.value = value;
  } else {
    metric.gauge.value = value;
  }
  return metric;
}

MetricFamily Family(std::string name, std::string help, MetricType type) {
  MetricFamily family;
  family.name = std::move(name);
  family.help = std::move(help);
  family.type = type;
  return family;
}

ClientMetric HistogramMetric(std::vector<ClientMetric::Label> labels, const Histogram& histogram) {
  ClientMetric metric;
  metric.label = std::move(labels);
  metric.histogram.sample_count = histogram.count();
  metric.histogram.sample_sum = histogram.sum();
  uint64_t cumulative = 0;
  for (size_t i = 0; i < histogram.counts().size(); ++i) {
    cumulative += histogram.counts()[i];
    const double bound = i < histogram.bounds().size() ? histogram.bounds()[i]
                                                       : std::numeric_limits<double>::infinity();
    metric.histogram.bucket.push_back({cumulative, bound});
  }
  return metric;
}

std::vector<ClientMetric::Label> JobLabels(const JobMetrics& job) {
  std::vector<ClientMetric::Label> labels = {{"job_id", job.job_id}, {"job_name", job.name}};
  for (const auto& [key, value] : job.labels) labels.push_back({LabelName(key), value});
  return labels;
}

// The checkpoint families, for the jobs whose spec checkpoints. Histograms and the failure
// counter hold what was reported since the coordinator started; the gauges, the newest
// committed checkpoint (absent while there is none).
std::vector<MetricFamily> CheckpointFamilies(const std::vector<JobMetrics>& jobs) {
  MetricFamily duration = Family("trainyard_checkpoint_duration_seconds",
                                 "Time to write a committed checkpoint, from the snapshot to the "
                                 "commit of its manifest",
                                 MetricType::Histogram);
  MetricFamily blocked = Family("trainyard_checkpoint_blocked_seconds",
                                "Time training was blocked by a checkpoint save (committed or "
                                "failed)",
                                MetricType::Histogram);
  MetricFamily bytes = Family("trainyard_checkpoint_bytes",
                              "Size of the newest committed checkpoint", MetricType::Gauge);
  MetricFamily step = Family("trainyard_checkpoint_last_committed_step",
                             "Step of the newest committed checkpoint", MetricType::Gauge);
  MetricFamily failures =
      Family("trainyard_checkpoint_failures_total",
             "Checkpoint saves that failed since the coordinator started", MetricType::Counter);
  for (const JobMetrics& job : jobs) {
    if (!job.checkpointing) continue;
    const std::vector<ClientMetric::Label> labels = JobLabels(job);
    duration.metric.push_back(HistogramMetric(labels, job.checkpoints.write_seconds));
    blocked.metric.push_back(HistogramMetric(labels, job.checkpoints.blocked_seconds));
    failures.metric.push_back(
        Metric(labels, static_cast<double>(job.checkpoints.failures), MetricType::Counter));
    if (job.last_checkpoint.path.empty()) continue;
    bytes.metric.push_back(
        Metric(labels, static_cast<double>(job.last_checkpoint.bytes), MetricType::Gauge));
    step.metric.push_back(
        Metric(labels, static_cast<double>(job.last_checkpoint.step), MetricType::Gauge));
  }
  return {duration, blocked, bytes, step, failures};
}

}  // namespace

std::vector<MetricFamily> MetricFamilies(const MetricsSnapshot& snapshot) {
  MetricFamily jobs = Family("trainyard_jobs", "Jobs in each state", MetricType::Gauge);
  for (const auto& [state, count] : snapshot.jobs_by_state) {
    jobs.metric.push_back(
        Metric({{"state", JobStateName(state)}}, static_cast<double>(count), MetricType::Gauge));
  }
  MetricFamily attempts =
      Family("trainyard_attempts_total", "Attempts started, over all jobs", MetricType::Counter);
  attempts.metric.push_back(
      Metric({}, static_cast<double>(snapshot.attempts_total), MetricType::Counter));
  MetricFamily restarts = Family("trainyard_restarts_total",
                                 "Restarts of failed attempts by cause since the coordinator "
                                 "started",
                                 MetricType::Counter);
  for (const std::string cause : {"rank_failed", "node_lost"}) {
    auto it = snapshot.restarts_by_cause.find(cause);
    const double value = it == snapshot.restarts_by_cause.end() ? 0 : it->second;
    restarts.metric.push_back(Metric({{"cause", cause}}, value, MetricType::Counter));
  }

  MetricFamily step = Family("trainyard_job_step", "Optimizer steps completed", MetricType::Gauge);
  MetricFamily loss =
      Family("trainyard_job_loss", "Training loss of the latest step reported", MetricType::Gauge);
  MetricFamily tokens = Family("trainyard_job_tokens_per_second",
                               "Training throughput of the whole job", MetricType::Gauge);
  MetricFamily step_time = Family("trainyard_job_step_time_seconds",
                                  "Wall time of one optimizer step", MetricType::Gauge);
  for (const JobMetrics& job : snapshot.jobs) {
    const std::vector<ClientMetric::Label> labels = JobLabels(job);
    const Progress& p = job.progress;
    step.metric.push_back(Metric(labels, static_cast<double>(p.step), MetricType::Gauge));
    loss.metric.push_back(Metric(labels, p.loss, MetricType::Gauge));
    tokens.metric.push_back(Metric(labels, p.tokens_per_second, MetricType::Gauge));
    step_time.metric.push_back(Metric(labels, p.step_times.total_ms / 1000.0, MetricType::Gauge));
  }

  MetricFamily age = Family("trainyard_node_heartbeat_age_seconds",
                            "Time since the node's agent was last heard from", MetricType::Gauge);
  MetricFamily connected =
      Family("trainyard_node_connected", "1 when the node's agent is connected", MetricType::Gauge);
  MetricFamily free =
      Family("trainyard_node_free_slots", "Slots (GPUs, else CPU slots) not held by an attempt",
             MetricType::Gauge);
  for (const NodeStatus& node : snapshot.nodes) {
    std::vector<ClientMetric::Label> labels = {{"node", node.record.node_id}};
    age.metric.push_back(
        Metric(labels, absl::ToDoubleSeconds(node.heartbeat_age), MetricType::Gauge));
    connected.metric.push_back(Metric(labels, node.connected ? 1 : 0, MetricType::Gauge));
    free.metric.push_back(Metric(labels, node.free_slots, MetricType::Gauge));
  }
  std::vector<MetricFamily> families = {jobs,   attempts,  restarts, step,      loss,
                                        tokens, step_time, age,      connected, free};
  for (MetricFamily& family : CheckpointFamilies(snapshot.jobs)) {
    families.push_back(std::move(family));
  }
  return families;
}

std::vector<MetricFamily> CoordinatorMetrics::Collect() const {
  return MetricFamilies(supervisor_->Metrics());
}

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(
    const std::string& listen, std::shared_ptr<prometheus::Collectable> metrics) {
  std::unique_ptr<MetricsServer> server(new MetricsServer());
  try {
    server->exposer_ = std::make_unique<prometheus::Exposer>(listen, /*num_threads=*/2);
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("cannot serve metrics on ", listen, ": ", e.what()));
  }
  server->metrics_ = std::move(metrics);
  server->exposer_->RegisterCollectable(server->metrics_);
  const std::vector<int> ports = server->exposer_->GetListeningPorts();
  if (ports.empty())
    return absl::UnavailableError(absl::StrCat("metrics: no port bound for ", listen));
  const size_t colon = listen.rfind(':');
  const std::string host = colon == std::string::npos ? listen : listen.substr(0, colon);
  server->address_ = absl::StrCat(host, ":", ports.front());
  return server;
}

}  // namespace trainyard::server
