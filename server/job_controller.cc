#include "server/job_controller.h"

#include <algorithm>
#include <utility>

namespace trainyard::server {
namespace {

// The restart policy a fault_tolerance section gives.
RestartOptions RestartOptionsFromSpec(const config::FaultToleranceSpec& fault_tolerance) {
  RestartOptions options;
  options.max_restarts = fault_tolerance.max_restarts;
  for (const auto& [name, budget] : fault_tolerance.max_restarts_by_cause) {
    if (std::optional<FailureClass> c = ParseFailureClass(name)) options.budget[*c] = budget;
  }
  options.backoff_initial = absl::Seconds(fault_tolerance.backoff_initial_s);
  options.backoff_max = absl::Seconds(fault_tolerance.backoff_max_s);
  options.backoff_multiplier = fault_tolerance.backoff_multiplier;
  options.backoff_jitter = fault_tolerance.backoff_jitter;
  return options;
}

}  // namespace

void JobController::Configure(const config::FaultToleranceSpec& fault_tolerance) {
  fault_tolerance_ = fault_tolerance;
  policy_ = std::make_unique<RestartPolicy>(RestartOptionsFromSpec(fault_tolerance_));
}

void JobController::Restore(const std::deque<AttemptRecord>& attempts) {
  restarts_by_class_.clear();
  consecutive_failures_ = 0;
  for (size_t i = 0; i + 1 < attempts.size(); ++i) {
    if (std::optional<FailureClass> c = ParseFailureClass(attempts[i].failure_class)) {
      ++restarts_by_class_[*c];
      if (checkpoint_policy_ && *c != FailureClass::kUserError)
        checkpoint_policy_->ObserveFailure();
    }
  }
  for (auto a = attempts.rbegin(); a != attempts.rend(); ++a) {
    if (a->state != AttemptState::kFailed) break;
    ++consecutive_failures_;
  }
}

const FailureSummary& JobController::Record(const Failure& failure, const AttemptRecord& attempt,
                                            absl::Time now) {
  last_class_ = failure.failure_class;
  if (checkpoint_policy_) {
    RunningUntil(now);
    if (failure.failure_class != FailureClass::kUserError) checkpoint_policy_->ObserveFailure();
  }
  exposure_mark_ = absl::InfinitePast();
  FailureSummary& summary = last_failure_;
  summary = FailureSummary{};
  summary.failure_class = FailureClassName(failure.failure_class);
  summary.cause = failure.cause;
  summary.rank = failure.rank;
  if (failure.rank >= 0 && failure.rank < static_cast<int>(attempt.ranks.size())) {
    summary.node_id = attempt.ranks[failure.rank].node_id;
  }
  summary.attempt_id = attempt.attempt_id;
  summary.detected = now;
  summary.detection_seconds = absl::ToDoubleSeconds(now - failure.fault);
  return summary;
}

JobController::Verdict JobController::Decide(const AttemptRecord& attempt,
                                             const std::vector<Straggler>& stragglers,
                                             absl::Time now, double jitter_draw) {
  if (!policy_) Configure(fault_tolerance_);  // never configured: the defaults
  const RestartDecision decision =
      policy_->Decide(last_class_, restarts_by_class_, consecutive_failures_ + 1, jitter_draw);
  Verdict verdict;
  verdict.restart = decision.restart;
  verdict.reason = decision.reason;
  if (!decision.restart) return verdict;
  ++restarts_by_class_[last_class_];
  ++consecutive_failures_;
  restart_at_ = now + decision.delay;
  failed_at_ = now;
  awaiting_first_step_ = true;
  last_failure_.restarted = true;
  avoid_nodes_.clear();
  if (!fault_tolerance_.exclude_stragglers) return verdict;
  for (const Straggler& s : stragglers) {
    if (s.rank < 0 || s.rank >= static_cast<int>(attempt.ranks.size())) continue;
    const std::string& node = attempt.ranks[s.rank].node_id;
    if (avoid_nodes_.insert(node).second) verdict.excluded.push_back({node, s.rank, s.score});
  }
  return verdict;
}

bool JobController::HoldForBackoff(absl::Time now) {
  if (now >= restart_at_) return false;
  backing_off_ = true;
  return true;
}

bool JobController::BackoffEnded(absl::Time now) {
  if (!backing_off_ || now < restart_at_) return false;
  backing_off_ = false;
  return true;
}

std::optional<absl::Duration> JobController::FirstStep(absl::Time now) {
  if (!awaiting_first_step_ || failed_at_ == absl::InfinitePast()) return std::nullopt;
  awaiting_first_step_ = false;
  return now - failed_at_;
}

void JobController::ChooseCheckpoints(std::optional<CheckpointPolicyOptions> options) {
  checkpoint_policy_.reset();
  if (options) checkpoint_policy_ = std::make_unique<CheckpointPolicy>(*options);
}

void JobController::SaveCheckpointEstimates(stored::JobAccounts& accounts) const {
  if (checkpoint_policy_) *accounts.mutable_young_daly() = checkpoint_policy_->Save();
}

absl::Status JobController::LoadCheckpointEstimates(const stored::JobAccounts& accounts) {
  if (!checkpoint_policy_ || !accounts.has_young_daly()) return absl::OkStatus();
  return checkpoint_policy_->Load(accounts.young_daly());
}

void JobController::AttemptRunning(absl::Time since, int nodes) {
  exposure_mark_ = since;
  if (checkpoint_policy_) checkpoint_policy_->RunOn(nodes);
}

void JobController::RunningUntil(absl::Time now) {
  if (!checkpoint_policy_ || exposure_mark_ == absl::InfinitePast() || now <= exposure_mark_) {
    return;
  }
  checkpoint_policy_->ObserveRunning(now - exposure_mark_);
  exposure_mark_ = now;
}

void JobController::CheckpointCommitted(double blocked_seconds, bool of_current_attempt) {
  if (checkpoint_policy_) checkpoint_policy_->ObserveCheckpoint(blocked_seconds);
  if (of_current_attempt) ProgressCommitted();
}

void JobController::StepTook(double seconds) {
  if (checkpoint_policy_ && seconds > 0) checkpoint_policy_->ObserveStepTime(seconds);
}

std::optional<int64_t> JobController::CheckpointDue(int64_t step, int64_t last_saved) {
  if (!checkpoint_policy_) return std::nullopt;
  return checkpoint_policy_->NextCheckpointStep(step, last_saved);
}

void JobController::FillHealth(JobHealth& health, bool restarting, absl::Time now,
                               int64_t next_checkpoint_step) const {
  health.last_failure = last_failure_;
  // None for a job that had ended before a coordinator restart (never configured).
  for (FailureClass c : {FailureClass::kCrash, FailureClass::kHang, FailureClass::kNodeLost,
                         FailureClass::kCollectiveTimeout}) {
    if (!policy_) break;
    auto used = restarts_by_class_.find(c);
    health.restart_budgets.push_back(
        RestartBudgetView{FailureClassName(c), used == restarts_by_class_.end() ? 0 : used->second,
                          policy_->BudgetFor(c)});
  }
  if (restarting && now < restart_at_) health.restart_at = restart_at_;
  if (!checkpoint_policy_) return;
  const CheckpointPolicySnapshot p = checkpoint_policy_->Snapshot();
  YoungDalyView view;
  view.checkpoint_cost_s = p.delta_s.value_or(0);
  view.mtbf_s = p.mtbf_s;
  view.interval_s = p.interval_s.value_or(0);
  view.interval_steps = p.interval_steps.value_or(0);
  view.next_step = next_checkpoint_step;
  view.failures_observed = static_cast<int>(p.failures);
  view.exposure_s = absl::ToDoubleSeconds(p.exposure);
  health.young_daly = view;
}

}  // namespace trainyard::server
