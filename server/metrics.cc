#include "server/metrics.h"

#include <exception>
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
    std::vector<ClientMetric::Label> labels = {{"job_id", job.job_id}, {"job_name", job.name}};
    for (const auto& [key, value] : job.labels) labels.push_back({LabelName(key), value});
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
  return {jobs, attempts, restarts, step, loss, tokens, step_time, age, connected, free};
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
