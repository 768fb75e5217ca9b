#include "server/agent/progress_relay.h"

#include <algorithm>
#include <span>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/moe_load.h"

namespace trainyard::server::agent {
namespace {

// Compares without stopping at the first difference.
bool SameSecret(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

bool SameCheckpoint(const v1::Checkpoint& a, const v1::Checkpoint& b) {
  return a.path() == b.path() && a.state() == b.state() && a.step() == b.step();
}

// `newer`'s MoE layers over both windows, as if one report had covered them: picks, tokens,
// drops and steps summed, the aux loss averaged over all the steps, the derived figures
// recomputed; the bias spread and the running drop count are the newer's. A layer `older` lacks
// (or has with other experts) stays as it is.
void MergeMoeWindows(const v1::ProgressReport& older, v1::ProgressReport* newer) {
  if (newer->moe_size() == 0) {
    *newer->mutable_moe() = older.moe();
    return;
  }
  for (v1::MoeLayerProgress& layer : *newer->mutable_moe()) {
    const auto before = std::find_if(
        older.moe().begin(), older.moe().end(), [&layer](const v1::MoeLayerProgress& o) {
          return o.layer() == layer.layer() &&
                 o.tokens_per_expert_size() == layer.tokens_per_expert_size();
        });
    if (before == older.moe().end()) continue;
    for (int e = 0; e < layer.tokens_per_expert_size(); ++e) {
      layer.set_tokens_per_expert(e, layer.tokens_per_expert(e) + before->tokens_per_expert(e));
    }
    const int64_t steps = layer.steps() + before->steps();
    if (steps > 0) {
      layer.set_aux_loss((layer.aux_loss() * static_cast<double>(layer.steps()) +
                          before->aux_loss() * static_cast<double>(before->steps())) /
                         static_cast<double>(steps));
      layer.set_z_loss((layer.z_loss() * static_cast<double>(layer.steps()) +
                        before->z_loss() * static_cast<double>(before->steps())) /
                       static_cast<double>(steps));
    }
    layer.set_steps(steps);
    layer.set_tokens(layer.tokens() + before->tokens());
    layer.set_dropped(layer.dropped() + before->dropped());
    const ExpertLoad load = SummarizeExpertLoad(
        std::span<const int64_t>(layer.tokens_per_expert().data(), layer.tokens_per_expert_size()),
        layer.tokens());
    layer.set_tokens_min(load.min);
    layer.set_tokens_max(load.max);
    layer.set_tokens_cv(load.cv);
    layer.set_tokens_max_share(load.max_share);
    layer.set_dead_experts(load.dead);
  }
}

}  // namespace

ProgressRelay::ProgressRelay(Clock* clock, std::function<void()> on_due, absl::Duration window)
    : clock_(clock), on_due_(std::move(on_due)), window_(window) {}

void ProgressRelay::Admit(const std::string& job_id, int attempt_id, const std::string& secret) {
  absl::MutexLock lock(&mu_);
  secrets_[{job_id, attempt_id}] = secret;
}

void ProgressRelay::AddRank(const std::string& job_id, int attempt_id, int rank) {
  absl::MutexLock lock(&mu_);
  ranks_[{job_id, attempt_id}].insert(rank);
}

void ProgressRelay::RemoveRank(const std::string& job_id, int attempt_id, int rank) {
  absl::MutexLock lock(&mu_);
  auto it = ranks_.find({job_id, attempt_id});
  if (it == ranks_.end()) return;
  it->second.erase(rank);
  if (it->second.empty()) ranks_.erase(it);
}

void ProgressRelay::ForgetJob(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  for (auto it = secrets_.lower_bound({job_id, INT32_MIN});
       it != secrets_.end() && it->first.first == job_id;) {
    it = secrets_.erase(it);
  }
}

ProgressRelay::RankKey ProgressRelay::KeyOf(const v1::ProgressReport& report) {
  return {report.job_id(), report.attempt_id(), report.rank()};
}

absl::Status ProgressRelay::CheckSecret(const v1::ProgressReport& report,
                                        const std::string& secret) const {
  const auto admitted = secrets_.find({report.job_id(), report.attempt_id()});
  if (admitted != secrets_.end() && SameSecret(admitted->second, secret)) return absl::OkStatus();
  for (const auto& [attempt, known] : secrets_) {
    if (!secret.empty() && SameSecret(known, secret)) {
      return absl::PermissionDeniedError(
          absl::StrCat("this secret belongs to attempt ", attempt.second, " of job ", attempt.first,
                       ", not to attempt ", report.attempt_id(), " of job ", report.job_id()));
    }
  }
  return absl::UnauthenticatedError(absl::StrCat("no worker of attempt ", report.attempt_id(),
                                                 " of job ", report.job_id(),
                                                 " was started on this node with this secret"));
}

void ProgressRelay::Report(const v1::ProgressReport& report, const std::string& secret,
                           Answer answer) {
  absl::Status refused;
  bool due = false;
  {
    absl::MutexLock lock(&mu_);
    refused = CheckSecret(report, secret);
    if (refused.ok()) {
      const int64_t now = clock_->NowNanosMonotonic();
      due = Keep(report, now);
      if (!connected_) {
        refused = absl::UnavailableError(
            "this node's agent is not connected to the coordinator (the report is kept)");
      } else {
        waiters_[KeyOf(report)].push_back(Waiter{std::move(answer), now});
      }
    }
  }
  if (!refused.ok()) {
    answer(refused);
    return;
  }
  if (due && on_due_) on_due_();
}

void ProgressRelay::Fold(std::map<RankKey, Pending>& into, const v1::ProgressReport& report,
                         int64_t since_nanos, bool urgent) {
  auto [it, inserted] = into.try_emplace(KeyOf(report));
  Pending& pending = it->second;
  if (inserted) {
    pending.report = report;
    pending.since_nanos = since_nanos;
  } else {
    Merge(&pending.report, report);
    pending.since_nanos = std::min(pending.since_nanos, since_nanos);
  }
  pending.urgent = pending.urgent || urgent;
}

bool ProgressRelay::Keep(const v1::ProgressReport& report, int64_t now_nanos) {
  Fold(pending_, report, now_nanos, IsUrgent(report));
  return connected_ && DueLocked(now_nanos);
}

bool ProgressRelay::IsUrgent(const v1::ProgressReport& report) {
  return report.checkpoints_size() > 0 || report.has_resumed() || report.has_run_report() ||
         report.has_val_loss() || report.phase() != v1::ITERATION_PHASE_STEP ||
         (report.total_steps() > 0 && report.step() >= report.total_steps());
}

bool ProgressRelay::DueLocked(int64_t now_nanos) const {
  if (pending_.empty()) return false;
  const int64_t late = now_nanos - absl::ToInt64Nanoseconds(window_);
  std::map<AttemptKey, size_t> reported;
  for (const auto& [key, pending] : pending_) {
    if (pending.urgent || pending.since_nanos <= late) return true;
    ++reported[{std::get<0>(key), std::get<1>(key)}];
  }
  for (const auto& [attempt, count] : reported) {
    const auto ranks = ranks_.find(attempt);
    if (ranks != ranks_.end() && count >= ranks->second.size()) return true;
  }
  return false;
}

void ProgressRelay::Merge(v1::ProgressReport* older, const v1::ProgressReport& newer) {
  if (newer.phase() != v1::ITERATION_PHASE_STEP && newer.total_steps() == 0) {
    // A phase notice: the waiting report keeps its figures and carries the phase too.
    older->set_phase(newer.phase());
    older->set_phase_limit_s(newer.phase_limit_s());
    return;
  }
  v1::ProgressReport merged = newer;
  merged.clear_checkpoints();
  for (const v1::Checkpoint& c : older->checkpoints()) *merged.add_checkpoints() = c;
  for (const v1::Checkpoint& c : newer.checkpoints()) {
    const bool known = std::any_of(older->checkpoints().begin(), older->checkpoints().end(),
                                   [&c](const v1::Checkpoint& o) { return SameCheckpoint(o, c); });
    if (!known) *merged.add_checkpoints() = c;
  }
  if (!newer.has_resumed() && older->has_resumed()) *merged.mutable_resumed() = older->resumed();
  if (!newer.has_run_report() && older->has_run_report()) {
    *merged.mutable_run_report() = older->run_report();
  }
  if (!newer.has_val_loss() && older->has_val_loss()) {
    merged.set_has_val_loss(true);
    merged.set_val_loss(older->val_loss());
  }
  if (newer.last_checkpoint().path().empty() && !older->last_checkpoint().path().empty()) {
    *merged.mutable_last_checkpoint() = older->last_checkpoint();
  }
  merged.set_max_step_ms(std::max(older->max_step_ms(), newer.max_step_ms()));
  MergeMoeWindows(*older, &merged);
  *older = std::move(merged);
}

void ProgressRelay::AnswerAllLocked(const absl::Status& status, Deliveries& out) {
  for (auto& [key, waiters] : waiters_) {
    for (Waiter& waiter : waiters) out.emplace_back(std::move(waiter.answer), status);
  }
  waiters_.clear();
}

void ProgressRelay::Deliver(Deliveries& deliveries) {
  for (auto& [answer, result] : deliveries) answer(std::move(result));
}

void ProgressRelay::SetConnected(bool connected) {
  Deliveries deliveries;
  {
    absl::MutexLock lock(&mu_);
    connected_ = connected;
    if (!connected) {
      AnswerAllLocked(absl::UnavailableError("this node's agent lost its connection to the "
                                             "coordinator (the report is kept)"),
                      deliveries);
      // Unanswered batches, oldest first, under what came since.
      std::map<RankKey, Pending> returned;
      const int64_t now = clock_->NowNanosMonotonic();
      for (auto& [id, sent] : in_flight_) {
        for (const v1::ProgressReport& report : sent.reports) {
          Fold(returned, report, now, IsUrgent(report));
        }
      }
      in_flight_.clear();
      for (auto& [key, later] : pending_)
        Fold(returned, later.report, later.since_nanos, later.urgent);
      pending_ = std::move(returned);
    }
  }
  Deliver(deliveries);
}

std::optional<v1::ProgressBatch> ProgressRelay::TakeBatch(bool force) {
  Deliveries deliveries;
  std::optional<v1::ProgressBatch> batch;
  {
    absl::MutexLock lock(&mu_);
    const int64_t now = clock_->NowNanosMonotonic();
    const int64_t expired = now - absl::ToInt64Nanoseconds(kProgressAnswerLimit);
    for (auto& [key, waiters] : waiters_) {
      auto late = std::partition(waiters.begin(), waiters.end(),
                                 [expired](const Waiter& w) { return w.since_nanos > expired; });
      for (auto it = late; it != waiters.end(); ++it) {
        deliveries.emplace_back(std::move(it->answer),
                                absl::UnavailableError("the coordinator has not answered yet (the "
                                                       "report is kept)"));
      }
      waiters.erase(late, waiters.end());
    }
    if (connected_ && (force ? !pending_.empty() : DueLocked(now))) {
      batch.emplace();
      batch->set_batch_id(next_batch_id_++);
      batch->set_omit_plain_answers(true);
      Sent& sent = in_flight_[batch->batch_id()];
      for (auto& [key, pending] : pending_) {
        *batch->add_reports() = pending.report;
        sent.reports.push_back(std::move(pending.report));
      }
      pending_.clear();
    }
  }
  Deliver(deliveries);
  return batch;
}

void ProgressRelay::AnswerLocked(const RankKey& key,
                                 const absl::StatusOr<v1::ProgressReply>& result, Deliveries& out) {
  auto it = waiters_.find(key);
  if (it == waiters_.end()) return;
  for (Waiter& waiter : it->second) out.emplace_back(std::move(waiter.answer), result);
  waiters_.erase(it);
}

void ProgressRelay::OnAnswers(const v1::ProgressAnswers& answers) {
  Deliveries deliveries;
  {
    absl::MutexLock lock(&mu_);
    for (const v1::ProgressAnswer& a : answers.answers()) {
      AnswerLocked({a.job_id(), a.attempt_id(), a.rank()},
                   a.code() == 0
                       ? absl::StatusOr<v1::ProgressReply>(a.reply())
                       : absl::Status(static_cast<absl::StatusCode>(a.code()), a.message()),
                   deliveries);
    }
    // The batch asked for omit_plain_answers: the reports answered above have no waiters left,
    // the rest were answered OK with ORDER_CONTINUE.
    auto sent = in_flight_.find(answers.batch_id());
    if (sent != in_flight_.end()) {
      v1::ProgressReply plain;
      plain.set_order(v1::ORDER_CONTINUE);
      for (const v1::ProgressReport& report : sent->second.reports) {
        AnswerLocked(KeyOf(report), plain, deliveries);
      }
      in_flight_.erase(sent);
    }
  }
  Deliver(deliveries);
}

int ProgressRelay::pending() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(pending_.size());
}

int ProgressRelay::in_flight() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(in_flight_.size());
}

}  // namespace trainyard::server::agent
