#include "server/metrics.h"

#include <exception>
#include <initializer_list>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/moe_load.h"

namespace trainyard::server {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

using config::MetricLabelName;

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
  for (const auto& [key, value] : job.labels) labels.push_back({MetricLabelName(key), value});
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

// Failure handling per job: goodput and where the time went, restart budgets, hang limits,
// Young–Daly, stragglers.
std::vector<MetricFamily> JobFailureFamilies(const std::vector<JobMetrics>& jobs) {
  MetricFamily ratio = Family("trainyard_job_goodput_ratio",
                              "Productive training time over wall time since the job's first "
                              "attempt started",
                              MetricType::Gauge);
  MetricFamily seconds = Family("trainyard_job_time_seconds",
                                "The job's wall time by category (productive, checkpoint, startup, "
                                "restart, lost, other) and, for restart and lost, failure class",
                                MetricType::Gauge);
  MetricFamily budget_used =
      Family("trainyard_job_restarts_used", "Restarts used, by failure class", MetricType::Gauge);
  MetricFamily budget =
      Family("trainyard_job_restart_budget",
             "Restarts allowed, by failure class (max_restarts bounds the sum)", MetricType::Gauge);
  MetricFamily hang_limit = Family("trainyard_job_hang_limit_seconds",
                                   "How long a step of the running attempt may take before it is "
                                   "declared hung",
                                   MetricType::Gauge);
  MetricFamily delta =
      Family("trainyard_job_checkpoint_cost_seconds",
             "Young-Daly delta: measured training-blocked time per checkpoint", MetricType::Gauge);
  MetricFamily mtbf =
      Family("trainyard_job_mtbf_seconds",
             "Young-Daly M: the job's estimated mean time between failures", MetricType::Gauge);
  MetricFamily interval =
      Family("trainyard_job_checkpoint_interval_seconds",
             "Young-Daly tau: the checkpoint interval chosen", MetricType::Gauge);
  MetricFamily interval_steps = Family("trainyard_job_checkpoint_interval_steps",
                                       "Young-Daly tau in optimizer steps", MetricType::Gauge);
  MetricFamily straggler =
      Family("trainyard_rank_straggler_score",
             "A rank's compute time per step over its peers' median", MetricType::Gauge);
  MetricFamily flagged =
      Family("trainyard_rank_straggler", "1 for a rank flagged as a straggler", MetricType::Gauge);
  for (const JobMetrics& job : jobs) {
    const std::vector<ClientMetric::Label> labels = JobLabels(job);
    const JobHealth& h = job.health;
    auto with = [&](std::vector<ClientMetric::Label> extra) {
      std::vector<ClientMetric::Label> all = labels;
      all.insert(all.end(), extra.begin(), extra.end());
      return all;
    };
    const GoodputView& g = h.goodput;
    ratio.metric.push_back(Metric(labels, g.ratio, MetricType::Gauge));
    for (const auto& [category, value] :
         std::initializer_list<std::pair<const char*, double>>{{"productive", g.productive_s},
                                                               {"checkpoint", g.checkpoint_s},
                                                               {"startup", g.startup_s},
                                                               {"other", g.other_s}}) {
      seconds.metric.push_back(
          Metric(with({{"category", category}, {"failure_class", ""}}), value, MetricType::Gauge));
    }
    for (const auto& [cause, value] : g.restart_s) {
      seconds.metric.push_back(Metric(with({{"category", "restart"}, {"failure_class", cause}}),
                                      value, MetricType::Gauge));
    }
    for (const auto& [cause, value] : g.lost_s) {
      seconds.metric.push_back(
          Metric(with({{"category", "lost"}, {"failure_class", cause}}), value, MetricType::Gauge));
    }
    for (const RestartBudgetView& b : h.restart_budgets) {
      budget_used.metric.push_back(
          Metric(with({{"failure_class", b.failure_class}}), b.used, MetricType::Gauge));
      budget.metric.push_back(
          Metric(with({{"failure_class", b.failure_class}}), b.budget, MetricType::Gauge));
    }
    if (h.hang_limit_s > 0) {
      hang_limit.metric.push_back(Metric(labels, h.hang_limit_s, MetricType::Gauge));
    }
    if (h.young_daly) {
      const YoungDalyView& y = *h.young_daly;
      if (y.checkpoint_cost_s > 0) {
        delta.metric.push_back(Metric(labels, y.checkpoint_cost_s, MetricType::Gauge));
      }
      mtbf.metric.push_back(Metric(labels, y.mtbf_s, MetricType::Gauge));
      if (y.interval_s > 0)
        interval.metric.push_back(Metric(labels, y.interval_s, MetricType::Gauge));
      if (y.interval_steps > 0) {
        interval_steps.metric.push_back(
            Metric(labels, static_cast<double>(y.interval_steps), MetricType::Gauge));
      }
    }
    for (const RankScore& score : job.straggler_scores) {
      const auto rank = with({{"rank", absl::StrCat(score.rank)}});
      straggler.metric.push_back(Metric(rank, score.score, MetricType::Gauge));
      bool is_flagged = false;
      for (const StragglerView& s : h.stragglers) is_flagged |= s.rank == score.rank;
      flagged.metric.push_back(Metric(rank, is_flagged ? 1 : 0, MetricType::Gauge));
    }
  }
  return {ratio, seconds,  budget_used,    budget,    hang_limit, delta,
          mtbf,  interval, interval_steps, straggler, flagged};
}

// The MoE layers of each job's newest report, one series per layer (labelled `layer`); the aux
// loss only under the aux-loss rule and the bias spread only under the bias rule (both when the
// rule is not known). The drop counter counts from the attempt's start, so it starts again with
// each attempt (rate() reads that as a counter reset).
std::vector<MetricFamily> MoeFamilies(const std::vector<JobMetrics>& jobs) {
  MetricFamily cv = Family("trainyard_moe_expert_tokens_cv",
                           "Coefficient of variation (standard deviation over mean) of the tokens "
                           "each expert of an MoE layer was picked for, over the steps of the "
                           "latest progress report: 0 when the load is even",
                           MetricType::Gauge);
  MetricFamily max_share = Family("trainyard_moe_expert_tokens_max_share",
                                  "Share of an MoE layer's tokens that its busiest expert took "
                                  "over the steps of the latest progress report: top_k/experts "
                                  "when the load is even, 1 when the router has collapsed onto "
                                  "one expert",
                                  MetricType::Gauge);
  MetricFamily dead = Family("trainyard_moe_dead_experts",
                             "Experts of an MoE layer that no token picked over the steps of the "
                             "latest progress report",
                             MetricType::Gauge);
  MetricFamily dropped = Family("trainyard_moe_dropped_tokens_total",
                                "Picks an MoE layer dropped over an expert's capacity since the "
                                "job's current attempt started",
                                MetricType::Counter);
  MetricFamily aux_loss =
      Family("trainyard_moe_aux_loss",
             "An MoE layer's auxiliary load-balancing loss, mean over the steps "
             "of the latest progress report (balance: aux_loss)",
             MetricType::Gauge);
  MetricFamily bias_spread = Family("trainyard_moe_bias_spread",
                                    "Max minus min of an MoE layer's expert selection bias at the "
                                    "latest progress report (balance: bias)",
                                    MetricType::Gauge);
  MetricFamily z_loss = Family("trainyard_moe_router_z_loss",
                               "An MoE layer's router z-loss (its coefficient times the mean "
                               "squared log-sum-exp of the router's logits), mean over the steps "
                               "of the latest progress report (model.moe.z_loss_coeff > 0)",
                               MetricType::Gauge);
  for (const JobMetrics& job : jobs) {
    for (const MoeLayerProgress& layer : job.progress.moe) {
      std::vector<ClientMetric::Label> labels = JobLabels(job);
      labels.push_back({"layer", absl::StrCat(layer.layer)});
      const ExpertLoad load = SummarizeExpertLoad(layer.tokens_per_expert, layer.tokens);
      cv.metric.push_back(Metric(labels, load.cv, MetricType::Gauge));
      max_share.metric.push_back(Metric(labels, load.max_share, MetricType::Gauge));
      dead.metric.push_back(Metric(labels, load.dead, MetricType::Gauge));
      dropped.metric.push_back(
          Metric(labels, static_cast<double>(layer.dropped_total), MetricType::Counter));
      if (layer.balance != MoeBalance::kBias) {
        aux_loss.metric.push_back(Metric(labels, layer.aux_loss, MetricType::Gauge));
      }
      if (layer.balance != MoeBalance::kAuxLoss) {
        bias_spread.metric.push_back(Metric(labels, layer.bias_spread, MetricType::Gauge));
      }
      if (layer.z_loss > 0)
        z_loss.metric.push_back(Metric(labels, layer.z_loss, MetricType::Gauge));
    }
  }
  return {cv, max_share, dead, dropped, aux_loss, bias_spread, z_loss};
}

// Failures over all jobs since the coordinator started: counts and latencies.
std::vector<MetricFamily> FailureCounterFamilies(const MetricsSnapshot& snapshot) {
  MetricFamily failures =
      Family("trainyard_failures_total",
             "Failed attempts by failure class since the coordinator started", MetricType::Counter);
  MetricFamily detection = Family("trainyard_fault_detection_seconds",
                                  "From a fault (exit, last progress of a hung attempt, last "
                                  "heartbeat of a lost node) to the coordinator knowing it",
                                  MetricType::Histogram);
  for (const char* name : {"user_error", "crash", "hang", "node_lost", "collective_timeout"}) {
    auto it = snapshot.failures_by_class.find(name);
    failures.metric.push_back(Metric({{"failure_class", name}},
                                     it == snapshot.failures_by_class.end() ? 0 : it->second,
                                     MetricType::Counter));
    auto h = snapshot.detection_seconds.find(name);
    detection.metric.push_back(HistogramMetric(
        {{"failure_class", name}},
        h == snapshot.detection_seconds.end() ? Histogram(FailureSecondsBuckets()) : h->second));
  }
  MetricFamily restart =
      Family("trainyard_restart_seconds",
             "From a failure's detection to the next attempt's first step", MetricType::Histogram);
  restart.metric.push_back(HistogramMetric({}, snapshot.restart_seconds));
  MetricFamily store_failures = Family(
      "trainyard_store_commit_failures_total",
      "Commits of the coordinator's state the job store refused (disk full, I/O errors), retries "
      "included, since the coordinator started",
      MetricType::Counter);
  store_failures.metric.push_back(
      Metric({}, static_cast<double>(snapshot.store_failures_total), MetricType::Counter));
  MetricFamily held_back = Family("trainyard_store_held_back_changes",
                                  "State changes waiting to be stored; the orders that follow "
                                  "from them wait too (0 when storage works)",
                                  MetricType::Gauge);
  held_back.metric.push_back(
      Metric({}, static_cast<double>(snapshot.store_held_back), MetricType::Gauge));
  MetricFamily queued = Family("trainyard_store_queued_changes",
                               "State changes queued for the next group commit (a store in "
                               "progress included); held-back ones included",
                               MetricType::Gauge);
  queued.metric.push_back(
      Metric({}, static_cast<double>(snapshot.store_queued), MetricType::Gauge));
  return {failures, detection, restart, store_failures, held_back, queued};
}

// Each job's state and training progress: its step, losses, optimizer signals and step times.
std::vector<MetricFamily> JobProgressFamilies(const std::vector<JobMetrics>& jobs) {
  MetricFamily step = Family("trainyard_job_step", "Optimizer steps completed", MetricType::Gauge);
  MetricFamily loss =
      Family("trainyard_job_loss", "Training loss of the latest step reported", MetricType::Gauge);
  MetricFamily val_loss = Family("trainyard_job_val_loss",
                                 "Validation loss of the latest evaluation reported (jobs that "
                                 "have evaluated)",
                                 MetricType::Gauge);
  MetricFamily z_loss = Family("trainyard_job_logit_z_loss",
                               "Logit z-loss of the latest step reported: model.z_loss_coeff "
                               "times the mean squared log-sum-exp of its tokens' logits (jobs "
                               "with model.z_loss_coeff > 0)",
                               MetricType::Gauge);
  MetricFamily grad_norm = Family("trainyard_job_grad_norm",
                                  "Global gradient norm of the latest step reported, before "
                                  "clipping",
                                  MetricType::Gauge);
  MetricFamily learning_rate =
      Family("trainyard_job_learning_rate", "Learning rate of the latest step reported",
             MetricType::Gauge);
  MetricFamily tokens = Family("trainyard_job_tokens_per_second",
                               "Training throughput of the whole job", MetricType::Gauge);
  MetricFamily step_time = Family("trainyard_job_step_time_seconds",
                                  "Wall time of one optimizer step", MetricType::Gauge);
  MetricFamily phase_time =
      Family("trainyard_job_step_phase_seconds",
             "Wall time of one optimizer step spent in each phase (forward, backward, optimizer, "
             "communication, data)",
             MetricType::Gauge);
  MetricFamily job_state = Family("trainyard_job_state",
                                  "1 for the job's current state (a finished job is shown for a "
                                  "while after it ends)",
                                  MetricType::Gauge);
  for (const JobMetrics& job : jobs) {
    const std::vector<ClientMetric::Label> labels = JobLabels(job);
    std::vector<ClientMetric::Label> state_labels = labels;
    state_labels.push_back({"state", JobStateName(job.state)});
    job_state.metric.push_back(Metric(state_labels, 1, MetricType::Gauge));
    const Progress& p = job.progress;
    step.metric.push_back(Metric(labels, static_cast<double>(p.step), MetricType::Gauge));
    loss.metric.push_back(Metric(labels, p.loss, MetricType::Gauge));
    if (p.val_loss.has_value())
      val_loss.metric.push_back(Metric(labels, *p.val_loss, MetricType::Gauge));
    if (p.logit_z_loss > 0)
      z_loss.metric.push_back(Metric(labels, p.logit_z_loss, MetricType::Gauge));
    if (p.step > 0) {
      grad_norm.metric.push_back(Metric(labels, p.grad_norm, MetricType::Gauge));
      learning_rate.metric.push_back(Metric(labels, p.learning_rate, MetricType::Gauge));
    }
    tokens.metric.push_back(Metric(labels, p.tokens_per_second, MetricType::Gauge));
    step_time.metric.push_back(Metric(labels, p.step_times.total_ms / 1000.0, MetricType::Gauge));
    const std::pair<const char*, double> phases[] = {
        {"forward", p.step_times.forward_ms},
        {"backward", p.step_times.backward_ms},
        {"optimizer", p.step_times.optimizer_ms},
        {"communication", p.step_times.communication_ms},
        {"data", p.step_times.data_ms}};
    for (const auto& [phase, ms] : phases) {
      std::vector<ClientMetric::Label> phase_labels = labels;
      phase_labels.push_back({"phase", phase});
      phase_time.metric.push_back(Metric(phase_labels, ms / 1000.0, MetricType::Gauge));
    }
  }
  return {job_state, step,          loss,   val_loss,  z_loss,
          grad_norm, learning_rate, tokens, step_time, phase_time};
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
  for (const std::string cause : {"crash", "hang", "node_lost", "collective_timeout"}) {
    auto it = snapshot.restarts_by_cause.find(cause);
    const double value = it == snapshot.restarts_by_cause.end() ? 0 : it->second;
    restarts.metric.push_back(Metric({{"cause", cause}}, value, MetricType::Counter));
  }

  MetricFamily age = Family("trainyard_node_heartbeat_age_seconds",
                            "Time since the node's agent was last heard from", MetricType::Gauge);
  MetricFamily connected =
      Family("trainyard_node_connected", "1 when the node's agent is connected", MetricType::Gauge);
  MetricFamily free =
      Family("trainyard_node_free_slots", "Slots (GPUs, else CPU slots) not held by an attempt",
             MetricType::Gauge);
  MetricFamily cordoned =
      Family("trainyard_node_cordoned", "1 while the node is quarantined after repeated failures",
             MetricType::Gauge);
  for (const NodeStatus& node : snapshot.nodes) {
    std::vector<ClientMetric::Label> labels = {{"node", node.record.node_id}};
    age.metric.push_back(
        Metric(labels, absl::ToDoubleSeconds(node.heartbeat_age), MetricType::Gauge));
    connected.metric.push_back(Metric(labels, node.connected ? 1 : 0, MetricType::Gauge));
    free.metric.push_back(Metric(labels, node.free_slots, MetricType::Gauge));
    cordoned.metric.push_back(Metric(labels, node.cordoned ? 1 : 0, MetricType::Gauge));
  }
  std::vector<MetricFamily> families = {jobs, attempts, restarts};
  for (MetricFamily& family : JobProgressFamilies(snapshot.jobs)) {
    families.push_back(std::move(family));
  }
  for (MetricFamily* family : {&age, &connected, &free, &cordoned}) {
    families.push_back(std::move(*family));
  }
  for (MetricFamily& family : CheckpointFamilies(snapshot.jobs)) {
    families.push_back(std::move(family));
  }
  for (MetricFamily& family : JobFailureFamilies(snapshot.jobs)) {
    families.push_back(std::move(family));
  }
  for (MetricFamily& family : MoeFamilies(snapshot.jobs)) families.push_back(std::move(family));
  for (MetricFamily& family : FailureCounterFamilies(snapshot)) {
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
