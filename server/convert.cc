#include "server/convert.h"

#include <string>
#include <type_traits>
#include <variant>

#include "absl/strings/str_cat.h"
#include "common/moe_load.h"

namespace trainyard::server {
namespace {

v1::Order ToProto(WorkerOrder order) {
  switch (order) {
    case WorkerOrder::kContinue:
      return v1::ORDER_CONTINUE;
    case WorkerOrder::kCheckpoint:
      return v1::ORDER_CHECKPOINT;
    case WorkerOrder::kDrain:
      return v1::ORDER_DRAIN;
    case WorkerOrder::kStop:
      return v1::ORDER_STOP;
  }
  return v1::ORDER_CONTINUE;
}

v1::MoeBalance ToProto(MoeBalance balance) {
  switch (balance) {
    case MoeBalance::kAuxLoss:
      return v1::MOE_BALANCE_AUX_LOSS;
    case MoeBalance::kBias:
      return v1::MOE_BALANCE_BIAS;
    case MoeBalance::kUnknown:
      break;
  }
  return v1::MOE_BALANCE_UNSPECIFIED;
}

MoeBalance FromProto(v1::MoeBalance balance) {
  switch (balance) {
    case v1::MOE_BALANCE_AUX_LOSS:
      return MoeBalance::kAuxLoss;
    case v1::MOE_BALANCE_BIAS:
      return MoeBalance::kBias;
    default:
      return MoeBalance::kUnknown;
  }
}

// The derived figures (min, max, CV, max share, dead experts) from tokens_per_expert.
void ToProto(const MoeLayerProgress& layer, v1::MoeLayerProgress* out) {
  const ExpertLoad load = SummarizeExpertLoad(layer.tokens_per_expert, layer.tokens);
  out->set_layer(layer.layer);
  out->set_steps(layer.steps);
  for (const int64_t picks : layer.tokens_per_expert) out->add_tokens_per_expert(picks);
  out->set_tokens(layer.tokens);
  out->set_tokens_min(load.min);
  out->set_tokens_max(load.max);
  out->set_tokens_cv(load.cv);
  out->set_tokens_max_share(load.max_share);
  out->set_dead_experts(load.dead);
  out->set_dropped(layer.dropped);
  out->set_dropped_total(layer.dropped_total);
  out->set_balance(ToProto(layer.balance));
  out->set_aux_loss(layer.aux_loss);
  out->set_bias_spread(layer.bias_spread);
  out->set_z_loss(layer.z_loss);
}

// Only what the worker measured: the coordinator derives the rest itself.
MoeLayerProgress FromProto(const v1::MoeLayerProgress& layer) {
  MoeLayerProgress out;
  out.layer = layer.layer();
  out.steps = layer.steps();
  out.tokens_per_expert.assign(layer.tokens_per_expert().begin(), layer.tokens_per_expert().end());
  out.tokens = layer.tokens();
  out.dropped = layer.dropped();
  out.dropped_total = layer.dropped_total();
  out.balance = FromProto(layer.balance());
  out.aux_loss = layer.aux_loss();
  out.bias_spread = layer.bias_spread();
  out.z_loss = layer.z_loss();
  return out;
}

absl::Time FromUnixMillis(int64_t millis) {
  return millis == 0 ? absl::InfinitePast() : absl::FromUnixMillis(millis);
}

void ToProto(const Mesh& mesh, v1::Mesh* out) {
  out->set_dp(mesh.dp);
  out->set_tp(mesh.tp);
  out->set_pp(mesh.pp);
  out->set_zero_stage(mesh.zero_stage);
  out->set_schedule(mesh.schedule);
  out->set_virtual_stages(mesh.virtual_stages);
  out->set_cp(mesh.cp);
  out->set_ep(mesh.ep);
}

void ToProto(const CheckpointSettings& policy, v1::CheckpointPolicy* out) {
  if (!policy.enabled()) return;  // every field 0
  out->set_dir(policy.dir);
  out->set_every_steps(policy.every_steps);
  out->set_interval_auto(policy.interval_auto);
  out->set_keep(policy.keep);
}

CheckpointInfo FromProto(const v1::Checkpoint& checkpoint) {
  CheckpointInfo out;
  out.step = checkpoint.step();
  out.path = checkpoint.path();
  out.written = FromUnixMillis(checkpoint.written_unix_ms());
  // Checked by the supervisor (CheckpointLedger::Validate): UNSPECIFIED and unknown numbers are
  // refused there.
  out.state = static_cast<CheckpointState>(static_cast<int>(checkpoint.state()));
  out.bytes = checkpoint.bytes();
  out.write_seconds = checkpoint.write_seconds();
  out.blocked_seconds = checkpoint.blocked_seconds();
  out.message = checkpoint.message();
  out.attempt_id = checkpoint.attempt_id();
  return out;
}

void ToProto(const StepTimes& times, v1::StepTimes* out) {
  out->set_total_ms(times.total_ms);
  out->set_forward_ms(times.forward_ms);
  out->set_backward_ms(times.backward_ms);
  out->set_optimizer_ms(times.optimizer_ms);
  out->set_communication_ms(times.communication_ms);
  out->set_data_ms(times.data_ms);
}

StepTimes FromProto(const v1::StepTimes& times) {
  StepTimes out;
  out.total_ms = times.total_ms();
  out.forward_ms = times.forward_ms();
  out.backward_ms = times.backward_ms();
  out.optimizer_ms = times.optimizer_ms();
  out.communication_ms = times.communication_ms();
  out.data_ms = times.data_ms();
  return out;
}

void ToProto(const Progress& progress, v1::Progress* out) {
  out->set_step(progress.step);
  out->set_total_steps(progress.total_steps);
  out->set_loss(progress.loss);
  out->set_logit_z_loss(progress.logit_z_loss);
  out->set_learning_rate(progress.learning_rate);
  out->set_grad_norm(progress.grad_norm);
  out->set_tokens_per_second(progress.tokens_per_second);
  ToProto(progress.step_times, out->mutable_step_times());
  out->set_has_val_loss(progress.val_loss.has_value());
  out->set_val_loss(progress.val_loss.value_or(0));
  out->set_eta_ms(progress.eta.has_value() ? absl::ToInt64Milliseconds(*progress.eta) : -1);
  out->set_reported_unix_ms(UnixMillisOrZero(progress.reported));
  if (!progress.run_report.empty() &&
      !out->mutable_run_report()->ParseFromString(progress.run_report)) {
    out->clear_run_report();
  }
  for (const MoeLayerProgress& layer : progress.moe) ToProto(layer, out->add_moe());
}

void ToProto(const RankExit& exit, const RankSlot& slot, v1::RankExit* out) {
  out->set_rank(slot.rank);
  out->set_node_id(slot.node_id);
  out->set_hostname(slot.hostname);
  out->set_exit_code(exit.exit_code);
  out->set_signal(exit.signal);
  out->set_pid(exit.pid);
  out->set_exited_unix_ms(UnixMillisOrZero(exit.exited));
  for (const std::string& line : exit.last_log_lines) out->add_last_log_lines(line);
  out->set_message(exit.message);
  out->set_stopped(exit.stopped);
}

}  // namespace

int64_t UnixMillisOrZero(absl::Time time) {
  if (time == absl::InfinitePast()) return 0;
  return absl::ToUnixMillis(time);
}

absl::Time FromDeadline(std::chrono::system_clock::time_point deadline) {
  if (deadline >= std::chrono::system_clock::time_point::max() - std::chrono::hours(24 * 365)) {
    return absl::InfiniteFuture();
  }
  return absl::FromChrono(deadline);
}

void ToProto(const CheckpointInfo& checkpoint, v1::Checkpoint* out) {
  out->set_step(checkpoint.step);
  out->set_path(checkpoint.path);
  out->set_written_unix_ms(UnixMillisOrZero(checkpoint.written));
  if (checkpoint.path.empty()) return;  // none: the other fields stay 0
  out->set_state(static_cast<v1::CheckpointState>(static_cast<int>(checkpoint.state)));
  out->set_bytes(checkpoint.bytes);
  out->set_write_seconds(checkpoint.write_seconds);
  out->set_blocked_seconds(checkpoint.blocked_seconds);
  out->set_message(checkpoint.message);
  out->set_attempt_id(checkpoint.attempt_id);
}

v1::JobState ToProto(JobState state) { return static_cast<v1::JobState>(static_cast<int>(state)); }

absl::StatusOr<JobState> FromProto(v1::JobState state) {
  const int value = static_cast<int>(state);
  if (value < 1 || value > kLastJobState) {
    return absl::InvalidArgumentError(absl::StrCat("unknown job state ", value));
  }
  return static_cast<JobState>(value);
}

void ToProto(const JobHealth& health, v1::Job* out) {
  const FailureSummary& f = health.last_failure;
  if (!f.failure_class.empty()) {
    v1::FailureSummary* failure = out->mutable_last_failure();
    failure->set_failure_class(f.failure_class);
    failure->set_cause(f.cause);
    failure->set_rank(f.rank);
    failure->set_node_id(f.node_id);
    failure->set_attempt_id(f.attempt_id);
    failure->set_detected_unix_ms(UnixMillisOrZero(f.detected));
    failure->set_detection_seconds(f.detection_seconds);
    failure->set_restarted(f.restarted);
  }
  for (const RestartBudgetView& b : health.restart_budgets) {
    v1::RestartBudget* budget = out->add_restart_budgets();
    budget->set_failure_class(b.failure_class);
    budget->set_used(b.used);
    budget->set_budget(b.budget);
  }
  out->set_restart_at_unix_ms(UnixMillisOrZero(health.restart_at));
  out->set_hang_limit_s(health.hang_limit_s);
  out->set_hang_limit_of(health.hang_limit_of);
  if (health.young_daly) {
    const YoungDalyView& y = *health.young_daly;
    v1::YoungDaly* yd = out->mutable_young_daly();
    yd->set_checkpoint_cost_s(y.checkpoint_cost_s);
    yd->set_mtbf_s(y.mtbf_s);
    yd->set_interval_s(y.interval_s);
    yd->set_interval_steps(y.interval_steps);
    yd->set_next_step(y.next_step);
    yd->set_failures_observed(y.failures_observed);
    yd->set_exposure_s(y.exposure_s);
    // The interval in force, in the policy's field too.
    out->mutable_checkpoint_policy()->set_every_steps(y.interval_steps);
  }
  const GoodputView& g = health.goodput;
  v1::Goodput* goodput = out->mutable_goodput();
  goodput->set_wall_s(g.wall_s);
  goodput->set_productive_s(g.productive_s);
  goodput->set_checkpoint_s(g.checkpoint_s);
  goodput->set_startup_s(g.startup_s);
  goodput->set_other_s(g.other_s);
  for (const auto& [cause, seconds] : g.restart_s) (*goodput->mutable_restart_s())[cause] = seconds;
  for (const auto& [cause, seconds] : g.lost_s) (*goodput->mutable_lost_s())[cause] = seconds;
  goodput->set_ratio(g.ratio);
  for (const StragglerView& s : health.stragglers) {
    v1::Straggler* straggler = out->add_stragglers();
    straggler->set_rank(s.rank);
    straggler->set_node_id(s.node_id);
    straggler->set_score(s.score);
    straggler->set_since_unix_ms(UnixMillisOrZero(s.since));
  }
}

void ToProto(const JobRecord& job, v1::Job* out) {
  out->set_id(job.id);
  out->set_name(job.name);
  out->set_spec_yaml(job.spec_yaml);
  out->set_state(ToProto(job.state));
  out->set_priority(job.priority);
  out->set_world_size(job.requirements.world_size());
  out->set_user(job.user);
  for (const auto& [key, value] : job.labels) (*out->mutable_labels())[key] = value;
  out->set_created_unix_ms(UnixMillisOrZero(job.created));
  out->set_started_unix_ms(UnixMillisOrZero(job.started));
  out->set_finished_unix_ms(UnixMillisOrZero(job.finished));
  out->set_attempts(job.attempts);
  out->set_restarts(job.restarts);
  out->set_max_restarts(job.requirements.max_restarts);
  out->set_current_attempt_id(job.current_attempt);
  ToProto(job.progress, out->mutable_progress());
  ToProto(job.last_checkpoint, out->mutable_last_checkpoint());
  out->set_cancel_requested(job.cancel_requested);
  out->set_message(job.message);
  out->set_waiting_reason(job.waiting);
  out->set_drain_requested(job.drain_requested);
  ToProto(job.requirements.checkpoint, out->mutable_checkpoint_policy());
  ToProto(job.health, out);
}

void ToProto(const AttemptRecord& attempt, v1::Attempt* out) {
  out->set_job_id(attempt.job_id);
  out->set_attempt_id(attempt.attempt_id);
  out->set_state(static_cast<v1::AttemptState>(static_cast<int>(attempt.state)));
  ToProto(attempt.mesh, out->mutable_mesh());
  for (const RankSlot& slot : attempt.ranks) {
    v1::RankPlacement* placement = out->add_placement();
    placement->set_rank(slot.rank);
    placement->set_node_id(slot.node_id);
    placement->set_hostname(slot.hostname);
    placement->set_slot(slot.slot);
    placement->set_local_rank(slot.local_rank);
    placement->set_pid(slot.pid);
    if (slot.exit.has_value()) ToProto(*slot.exit, slot, out->add_exits());
  }
  out->set_created_unix_ms(UnixMillisOrZero(attempt.created));
  out->set_running_unix_ms(UnixMillisOrZero(attempt.running));
  out->set_finished_unix_ms(UnixMillisOrZero(attempt.finished));
  out->set_cause(attempt.cause);
}

void ToProto(const EventRecord& event, v1::Event* out) {
  out->set_id(event.id);
  out->set_job_id(event.job_id);
  out->set_attempt_id(event.attempt_id);
  out->set_time_unix_ms(UnixMillisOrZero(event.time));
  out->set_from_state(ToProto(event.from));
  out->set_to_state(ToProto(event.to));
  out->set_kind(event.kind);
  out->set_cause(event.cause);
}

void ToProto(const NodeStatus& node, v1::Node* out) {
  out->set_node_id(node.record.node_id);
  out->set_hostname(node.record.hostname);
  out->set_cpu_slots(node.record.cpu_slots);
  for (const GpuInfo& gpu : node.record.gpus) {
    v1::GpuInfo* info = out->add_gpus();
    info->set_index(gpu.index);
    info->set_name(gpu.name);
    info->set_memory_bytes(gpu.memory_bytes);
  }
  out->set_free_slots(node.free_slots);
  out->set_connected(node.connected);
  const int64_t age_ms = absl::ToInt64Milliseconds(node.heartbeat_age);
  out->set_heartbeat_age_ms(age_ms);
  out->set_last_heartbeat_unix_ms(absl::ToUnixMillis(absl::Now()) - age_ms);
  out->set_cordoned(node.cordoned);
  out->set_cordon_reason(node.cordon_reason);
  out->set_cordoned_until_unix_ms(UnixMillisOrZero(node.cordoned_until));
}

void ToProto(const JoinInfo& info, v1::JoinReply* out) {
  out->set_world_size(info.world_size);
  out->set_rank(info.rank);
  out->set_local_rank(info.local_rank);
  out->set_local_world_size(info.local_world_size);
  ToProto(info.mesh, out->mutable_mesh());
  out->set_dp_rank(info.dp_rank);
  out->set_tp_rank(info.tp_rank);
  out->set_pp_rank(info.pp_rank);
  out->set_cp_rank(info.cp_rank);
  out->set_micro_batch(info.micro_batch);
  out->set_spec_yaml(info.spec_yaml);
  out->set_kv_prefix(info.kv_prefix);
  ToProto(info.resume_from, out->mutable_resume_from());
  out->set_slot(info.slot);
  out->set_node_id(info.node_id);
  for (const std::string& root : info.data_roots) out->add_data_roots(root);
  for (const std::string& root : info.checkpoint_roots) out->add_checkpoint_roots(root);
}

void ToProto(const RegisteredOrder& order, v1::CoordinatorMessage* out) {
  v1::AgentRegistered* registered = out->mutable_registered();
  registered->set_node_id(order.node_id);
  registered->set_heartbeat_interval_ms(absl::ToInt64Milliseconds(order.heartbeat_interval));
  registered->set_heartbeat_timeout_ms(absl::ToInt64Milliseconds(order.heartbeat_timeout));
  for (const RegisteredOrder::Adopted& a : order.adopted) {
    v1::AttemptSecret* adopted = registered->add_attempt_secrets();
    adopted->set_job_id(a.job_id);
    adopted->set_attempt_id(a.attempt_id);
    adopted->set_secret(a.secret);
    adopted->set_memory_peer_address(a.memory_peer_address);
    for (const std::string& tier : a.memory_tier_addresses)
      adopted->add_memory_tier_addresses(tier);
  }
}

void ToProto(const AgentOrder& order, v1::CoordinatorMessage* out) {
  std::visit(
      [out](const auto& o) {
        using T = std::decay_t<decltype(o)>;
        if constexpr (std::is_same_v<T, StartWorkerOrder>) {
          v1::StartWorker* start = out->mutable_start();
          start->set_job_id(o.job_id);
          start->set_attempt_id(o.attempt_id);
          start->set_rank(o.rank);
          start->set_local_rank(o.local_rank);
          start->set_slot(o.slot);
          start->set_coordinator_address(o.coordinator_address);
          for (const auto& [key, value] : o.env) (*start->mutable_env())[key] = value;
          start->set_gpu(o.gpu);
          start->set_memory_peer_address(o.memory_peer_address);
          for (const std::string& a : o.memory_tier_addresses) start->add_memory_tier_addresses(a);
          start->set_attempt_secret(o.attempt_secret);
        } else if constexpr (std::is_same_v<T, StopWorkersOrder>) {
          v1::StopWorkers* stop = out->mutable_stop();
          stop->set_job_id(o.job_id);
          stop->set_attempt_id(o.attempt_id);
          for (int rank : o.ranks) stop->add_ranks(rank);
          stop->set_grace_period_ms(absl::ToInt64Milliseconds(o.grace));
          stop->set_reason(o.reason);
        } else if constexpr (std::is_same_v<T, ReadLogsOrder>) {
          v1::ReadLogs* read = out->mutable_read_logs();
          read->set_request_id(o.request_id);
          read->set_job_id(o.job_id);
          read->set_attempt_id(o.attempt_id);
          read->set_rank(o.rank);
          read->set_tail_lines(o.tail_lines);
          read->set_follow(o.follow);
        } else if constexpr (std::is_same_v<T, ReleaseMemoryOrder>) {
          out->mutable_release_memory()->set_job_id(o.job_id);
        } else {
          out->mutable_cancel_read_logs()->set_request_id(o.request_id);
        }
      },
      order);
}

NodeRecord FromProto(const v1::RegisterAgent& registration) {
  NodeRecord node;
  node.node_id = registration.node_id();
  node.hostname = registration.hostname().empty() ? node.node_id : registration.hostname();
  node.cpu_slots = registration.cpu_slots();
  node.memory_tier_address = registration.memory_tier_address();
  node.memory_tier_budget_bytes = registration.memory_tier_budget_bytes();
  node.instance_id = registration.instance_id();
  node.memory_bytes = registration.memory_bytes();
  for (const v1::GpuInfo& gpu : registration.gpus()) {
    node.gpus.push_back(GpuInfo{gpu.index(), gpu.name(), gpu.memory_bytes()});
  }
  return node;
}

RunningWorker FromProto(const v1::RunningWorker& worker) {
  return RunningWorker{worker.job_id(), worker.attempt_id(), worker.rank(), worker.pid()};
}

WorkerExit FromProto(const v1::WorkerExited& exited) {
  WorkerExit out;
  out.job_id = exited.job_id();
  out.attempt_id = exited.attempt_id();
  out.rank = exited.exit().rank();
  out.exit.exit_code = exited.exit().exit_code();
  out.exit.signal = exited.exit().signal();
  out.exit.pid = exited.exit().pid();
  out.exit.exited = FromUnixMillis(exited.exit().exited_unix_ms());
  for (const std::string& line : exited.exit().last_log_lines()) {
    out.exit.last_log_lines.push_back(line);
  }
  out.exit.message = exited.exit().message();
  out.exit.stopped = exited.exit().stopped();
  return out;
}

HangUpdate FromProto(const v1::HangReport& report) {
  HangUpdate out;
  out.job_id = report.job_id();
  out.attempt_id = report.attempt_id();
  out.report.rank = report.rank();
  out.report.step = report.step();
  out.report.elapsed_s = report.elapsed_s();
  out.report.limit_s = report.limit_s();
  out.report.operation = report.operation();
  out.report.group = report.group();
  out.report.waiting_for.assign(report.waiting_for().begin(), report.waiting_for().end());
  out.report.waiting_s = report.waiting_s();
  return out;
}

void ToProto(const OrderReply& order, v1::ProgressReply* out) {
  out->set_order(ToProto(order.order));
  out->set_checkpoint_step(order.checkpoint_step);
}

ProgressUpdate FromProto(const v1::ProgressReport& report) {
  ProgressUpdate out;
  out.job_id = report.job_id();
  out.attempt_id = report.attempt_id();
  out.rank = report.rank();
  out.step = report.step();
  out.total_steps = report.total_steps();
  out.loss = report.loss();
  out.logit_z_loss = report.logit_z_loss();
  out.learning_rate = report.learning_rate();
  out.grad_norm = report.grad_norm();
  out.tokens_per_second = report.tokens_per_second();
  out.step_times = FromProto(report.step_times());
  if (report.has_val_loss()) out.val_loss = report.val_loss();
  out.max_step_ms = report.max_step_ms();
  out.checkpoint.step = report.last_checkpoint().step();
  out.checkpoint.path = report.last_checkpoint().path();
  out.checkpoint.written = FromUnixMillis(report.last_checkpoint().written_unix_ms());
  for (const v1::Checkpoint& checkpoint : report.checkpoints()) {
    out.checkpoints.push_back(FromProto(checkpoint));
  }
  if (report.has_resumed()) {
    const v1::Resumed& r = report.resumed();
    out.resumed = ProgressUpdate::Resumed{r.step(), r.from(), r.from_memory(), r.restore_ms(),
                                          r.started_ms()};
  }
  if (report.has_run_report()) out.run_report = report.run_report().SerializeAsString();
  for (const v1::MoeLayerProgress& layer : report.moe()) out.moe.push_back(FromProto(layer));
  if (report.phase() != v1::ITERATION_PHASE_STEP) {
    out.phase = ProgressUpdate::Phase{static_cast<config::HangPhase>(report.phase()),
                                      report.phase_limit_s()};
  }
  out.terminated = report.terminated();
  return out;
}

}  // namespace trainyard::server
