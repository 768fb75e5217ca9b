// The coordinator's Prometheus metrics, computed from a Supervisor snapshot at every scrape (so
// series of jobs that have gone away disappear on their own), and the HTTP exposer serving them
// at /metrics.
//
//   trainyard_jobs{state}                          gauge: jobs in each state
//   trainyard_attempts_total                       counter: attempts started
//   trainyard_restarts_total{cause}                counter: restarts since the coordinator started
//   trainyard_job_step{job_id,job_name,label_*}    gauge: optimizer steps completed
//   trainyard_job_loss{...}                        gauge: training loss of the latest report
//   trainyard_job_val_loss{...}                    gauge: the latest validation loss (jobs that
//                                                  have evaluated)
//   trainyard_job_logit_z_loss{...}                gauge: the latest step's logit z-loss
//                                                  (model.z_loss_coeff > 0)
//   trainyard_job_grad_norm{...}                   gauge: global norm before clipping
//   trainyard_job_learning_rate{...}               gauge
//   trainyard_job_tokens_per_second{...}           gauge
//   trainyard_job_step_time_seconds{...}           gauge
//   trainyard_checkpoint_duration_seconds{...}     histogram: write time of committed saves,
//                                                  buckets 0.1 s to 1 h
//   trainyard_checkpoint_blocked_seconds{...}      histogram: training blocked per save
//   trainyard_checkpoint_bytes{...}                gauge: size of the newest committed checkpoint
//   trainyard_checkpoint_last_committed_step{...}  gauge
//   trainyard_checkpoint_failures_total{...}       counter: failed saves
//     (the checkpoint series exist for jobs whose spec checkpoints; the histograms and the
//     counter count each reported save once, from the coordinator's start)
//   trainyard_moe_expert_tokens_cv{...,layer}      gauge: per MoE layer, over the latest report's
//                                                  steps: std/mean of the tokens per expert
//   trainyard_moe_expert_tokens_max_share{...}     gauge: the busiest expert's share of the tokens
//   trainyard_moe_dead_experts{...}                gauge: experts no token picked
//   trainyard_moe_aux_loss{...}                    gauge (balance: aux_loss)
//   trainyard_moe_bias_spread{...}                 gauge (balance: bias)
//   trainyard_moe_router_z_loss{...}               gauge (model.moe.z_loss_coeff > 0)
//   trainyard_moe_dropped_tokens_total{...}        counter: dropped picks since the attempt began
//   trainyard_node_heartbeat_age_seconds{node}     gauge
//   trainyard_node_connected{node}                 gauge: 1 or 0
//   trainyard_node_free_slots{node}                gauge
//
// Threading: Collect() is called on the exposer's HTTP threads; the Supervisor is thread-safe.
#ifndef TRAINYARD_SERVER_METRICS_H_
#define TRAINYARD_SERVER_METRICS_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "prometheus/collectable.h"
#include "prometheus/exposer.h"
#include "prometheus/metric_family.h"
#include "server/supervisor.h"

namespace trainyard::server {

// Prometheus families for one snapshot (exposed for tests).
std::vector<prometheus::MetricFamily> MetricFamilies(const MetricsSnapshot& snapshot);

class CoordinatorMetrics : public prometheus::Collectable {
 public:
  explicit CoordinatorMetrics(Supervisor* supervisor) : supervisor_(supervisor) {}
  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  Supervisor* const supervisor_;
};

// Serves `metrics` at http://<address>/metrics. INVALID_ARGUMENT/UNAVAILABLE when the address
// cannot be bound.
class MetricsServer {
 public:
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(
      const std::string& listen, std::shared_ptr<prometheus::Collectable> metrics);
  // host:port actually bound.
  const std::string& address() const { return address_; }

 private:
  MetricsServer() = default;
  std::unique_ptr<prometheus::Exposer> exposer_;
  std::shared_ptr<prometheus::Collectable> metrics_;
  std::string address_;
};

}  // namespace trainyard::server

#endif  // TRAINYARD_SERVER_METRICS_H_
