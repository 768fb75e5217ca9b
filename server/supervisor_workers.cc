// Supervisor: the worker side — the rendezvous and progress reports.
#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status.h"
#include "config/mesh.h"
#include "server/supervisor.h"

namespace trainyard::server {

JoinInfo Supervisor::JoinInfoFor(const JobEntry& entry, const AttemptRecord& attempt,
                                 int rank) const {
  const RankSlot& slot = attempt.ranks[rank];
  JoinInfo info;
  info.world_size = static_cast<int>(attempt.ranks.size());
  info.rank = rank;
  info.local_rank = slot.local_rank;
  info.local_world_size = static_cast<int>(
      std::count_if(attempt.ranks.begin(), attempt.ranks.end(),
                    [&](const RankSlot& other) { return other.node_id == slot.node_id; }));
  info.mesh = attempt.mesh;
  const config::MeshCoordinates at =
      config::CoordinatesOf(config::ParallelismSpec{.dp = attempt.mesh.dp,
                                                    .tp = attempt.mesh.tp,
                                                    .pp = attempt.mesh.pp,
                                                    .cp = attempt.mesh.cp},
                            rank);
  info.tp_rank = at.tp;
  info.dp_rank = at.dp;
  info.pp_rank = at.pp;
  info.cp_rank = at.cp;
  // The micro-batch of the size the attempt runs at; at another size only the shape of that
  // many nodes knows it (none: the worker fits its own, 0).
  info.micro_batch = entry.full_micro_batch;
  if (info.world_size != entry.job.requirements.world_size()) {
    info.micro_batch = 0;
    for (const std::vector<JobShape>* shapes : {&entry.larger_shapes, &entry.smaller_shapes}) {
      for (const JobShape& s : *shapes) {
        if (s.nodes * entry.job.requirements.ranks_per_node == info.world_size) {
          info.micro_batch = s.micro_batch;
        }
      }
    }
  }
  info.spec_yaml = entry.job.spec_yaml;
  info.kv_prefix = KvSpace::PrefixFor(entry.job.id, attempt.attempt_id);
  info.resume_from = entry.job.last_checkpoint;
  info.slot = slot.slot;
  info.node_id = slot.node_id;
  info.data_roots = options_.spec_limits.allowed_data_roots;
  info.checkpoint_roots = options_.spec_limits.allowed_checkpoint_roots;
  return info;
}

void Supervisor::Join(const std::string& job_id, int attempt_id, int rank, absl::Time deadline,
                      JoinCallback done) {
  Txn txn;
  absl::Status error;
  {
    absl::MutexLock lock(&mu_);
    JobEntry* entry = FindJob(job_id);
    AttemptRecord* attempt = entry != nullptr ? FindAttempt(*entry, attempt_id) : nullptr;
    if (shutting_down_) {
      error = absl::UnavailableError("the coordinator is shutting down");
    } else if (entry == nullptr) {
      error = absl::NotFoundError(absl::StrCat("no job ", job_id));
    } else if (attempt == nullptr) {
      error = absl::NotFoundError(absl::StrCat("job ", job_id, " has no attempt ", attempt_id));
    } else if (attempt_id != entry->job.current_attempt) {
      error = absl::FailedPreconditionError(absl::StrCat("attempt ", attempt_id, " of job ", job_id,
                                                         " was superseded by attempt ",
                                                         entry->job.current_attempt));
    } else if (IsFinal(attempt->state) || attempt->state == AttemptState::kStopping) {
      error = absl::FailedPreconditionError(absl::StrCat("attempt ", attempt_id, " of job ", job_id,
                                                         " is ", AttemptStateName(attempt->state)));
    } else if (rank < 0 || rank >= static_cast<int>(attempt->ranks.size())) {
      error = absl::InvalidArgumentError(
          absl::StrCat("rank ", rank, " is outside the world of ", attempt->ranks.size()));
    } else if (attempt->state == AttemptState::kRunning) {
      txn.after.push_back(
          [done = std::move(done), info = JoinInfoFor(*entry, *attempt, rank)] { done(info); });
    } else {
      entry->joined.insert(rank);
      entry->join_waiters.push_back(JoinWaiter{
          rank, std::min(deadline, clock_->Now() + options_.max_join_wait), std::move(done)});
      if (entry->joined.size() == attempt->ranks.size()) {
        MarkRunningLocked(txn, *entry, *attempt);
      }
      CommitLocked(txn).IgnoreError();
    }
  }
  if (!error.ok()) {
    done(error);
    return;
  }
  RunAfter(txn);
}

void Supervisor::UpdateProgressLocked(Txn& txn, JobEntry& entry, const ProgressUpdate& update) {
  Progress& progress = entry.job.progress;
  const absl::Time now = clock_->Now();
  // The step time: what the worker measured, else the pace between two reports.
  double step_ms = update.step_times.total_ms;
  if (step_ms <= 0 && progress.reported != absl::InfinitePast() && update.step > progress.step) {
    step_ms = absl::ToDoubleMilliseconds(now - progress.reported) /
              static_cast<double>(update.step - progress.step);
  }
  progress.step = update.step;
  progress.total_steps = update.total_steps;
  progress.loss = update.loss;
  progress.logit_z_loss = update.logit_z_loss;
  progress.learning_rate = update.learning_rate;
  progress.grad_norm = update.grad_norm;
  progress.tokens_per_second = update.tokens_per_second;
  progress.step_times = update.step_times;
  if (progress.step_times.total_ms <= 0 && step_ms > 0) progress.step_times.total_ms = step_ms;
  if (update.val_loss.has_value()) progress.val_loss = update.val_loss;
  // Like the validation loss, the newest figures stand until a report brings others.
  if (!update.moe.empty()) progress.moe = update.moe;
  if (step_ms > 0 && update.total_steps >= update.step) {
    progress.eta =
        absl::Milliseconds(step_ms * static_cast<double>(update.total_steps - update.step));
  }
  progress.reported = now;
  entry.progress_dirty = true;
  RecordReportedCheckpointLocked(txn, entry, update);
  // Watchers hear of the progress once it is stored: with the job's row when the transaction
  // touched it, else with the next soft-state write (Tick).
}

absl::StatusOr<Supervisor::RankOfAttempt> Supervisor::FindLiveRankLocked(const std::string& job_id,
                                                                         int attempt_id, int rank) {
  JobEntry* entry = FindJob(job_id);
  if (entry == nullptr) return absl::NotFoundError(absl::StrCat("no job ", job_id));
  AttemptRecord* attempt = FindAttempt(*entry, attempt_id);
  if (attempt == nullptr) {
    return absl::NotFoundError(absl::StrCat("job ", job_id, " has no attempt ", attempt_id));
  }
  if (attempt_id != entry->job.current_attempt || IsFinal(attempt->state)) {
    return absl::FailedPreconditionError(
        absl::StrCat("attempt ", attempt_id, " of job ", job_id, " has ended"));
  }
  if (rank < 0 || rank >= static_cast<int>(attempt->ranks.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " is outside the world of ", attempt->ranks.size()));
  }
  return RankOfAttempt{entry, attempt};
}

absl::Status Supervisor::ConfirmAttempt(const std::string& job_id, int attempt_id, int rank) {
  absl::MutexLock lock(&mu_);
  return FindLiveRankLocked(job_id, attempt_id, rank).status();
}

absl::StatusOr<OrderReply> Supervisor::ReportProgress(const ProgressUpdate& update) {
  Txn txn;
  absl::StatusOr<OrderReply> reply;
  {
    absl::MutexLock lock(&mu_);
    reply = ReportProgressLocked(txn, update, /*node_id=*/nullptr);
    const absl::Status committed = CommitLocked(txn);
    // A drain a termination notice asked for must be stored before the rank drains: if it were
    // lost with the coordinator, ranks that exit 0 would end the job SUCCEEDED. Unstored, the
    // worker gets the error and ends as SIGTERM ends it, a failure the job may restart from.
    if (update.terminated && !committed.ok()) reply = committed;
  }
  RunAfter(txn);
  return reply;
}

absl::StatusOr<std::vector<absl::StatusOr<OrderReply>>> Supervisor::ReportNodeProgress(
    const std::string& node_id, uint64_t session, const std::vector<ProgressUpdate>& updates,
    const std::vector<RunningWorker>* heartbeat) {
  if (!registry_->Touch(node_id, session)) {
    return absl::FailedPreconditionError(
        absl::StrCat("session of node ", node_id, " was replaced or lost; reconnect"));
  }
  std::vector<absl::StatusOr<OrderReply>> answers;
  answers.reserve(updates.size());
  Txn txn;
  {
    absl::MutexLock lock(&mu_);
    if (heartbeat != nullptr) ReconcileLocked(txn, node_id, *heartbeat, /*on_connect=*/false);
    for (const ProgressUpdate& update : updates) {
      answers.push_back(ReportProgressLocked(txn, update, &node_id));
    }
    CommitLocked(txn).IgnoreError();
  }
  RunAfter(txn);
  return answers;
}

absl::StatusOr<OrderReply> Supervisor::ReportProgressLocked(Txn& txn, const ProgressUpdate& update,
                                                            const std::string* node_id) {
  OrderReply reply;
  TY_ASSIGN_OR_RETURN(const RankOfAttempt found,
                      FindLiveRankLocked(update.job_id, update.attempt_id, update.rank));
  JobEntry* entry = found.entry;
  AttemptRecord* attempt = found.attempt;
  if (node_id != nullptr && attempt->ranks[update.rank].node_id != *node_id) {
    return absl::PermissionDeniedError(absl::StrCat("rank ", update.rank, " of attempt ",
                                                    update.attempt_id, " of job ", update.job_id,
                                                    " does not run on node ", *node_id));
  }
  if (update.terminated) return TerminatedLocked(txn, *entry, *attempt, update.rank);
  // A phase notice (ProgressUpdate::phase) alone, or merged into a step's report by the relay.
  const auto phase_started = [&] {
    if (update.phase && entry->detector && attempt->state == AttemptState::kRunning) {
      entry->detector->PhaseStarted(update.rank, update.step, update.phase->phase,
                                    update.phase->limit_s, clock_->Now());
    }
  };
  if (update.phase && update.total_steps == 0) {
    if (attempt->state == AttemptState::kStopping) reply.order = WorkerOrder::kStop;
    phase_started();
    return reply;
  }
  // A save that ended is a fact even when the attempt is being torn down: record it first.
  if (update.rank == 0) RecordCheckpointsLocked(txn, *entry, update);
  // So is the run's report (it comes after the last step, as the attempt may be ending).
  if (update.rank == 0 && !update.run_report.empty()) {
    entry->job.progress.run_report = update.run_report;
    entry->progress_dirty = true;
  }
  if (update.resumed && update.rank == 0 && entry->resumed_attempt != update.attempt_id) {
    entry->resumed_attempt = update.attempt_id;
    const ProgressUpdate::Resumed& r = *update.resumed;
    entry->goodput.Resumed(r.step);
    AddEvent(txn, *entry, update.attempt_id, entry->job.state, entry->job.state, "resumed",
             r.step == 0 ? absl::StrFormat("attempt %d started from step 0 (worker ready in "
                                           "%.0f ms)",
                                           update.attempt_id, r.started_ms)
                         : absl::StrFormat("attempt %d resumed from step %d (%s: %s) in %.0f ms; "
                                           "worker ready %.0f ms after its start",
                                           update.attempt_id, r.step,
                                           r.from_memory ? "memory tier" : "checkpoint", r.from,
                                           r.restore_ms, r.started_ms));
    RecordResumedCheckpointLocked(txn, *entry, update.attempt_id, r);
  }
  if (attempt->state == AttemptState::kStopping) {
    reply.order = WorkerOrder::kStop;
    return reply;
  }
  if (update.rank == 0) UpdateProgressLocked(txn, *entry, update);
  if (attempt->state == AttemptState::kRunning) ObserveProgressLocked(txn, *entry, update, reply);
  phase_started();
  // Repeated on every report while draining, so a lost reply costs nothing.
  // (A resize stops the ranks the same way: a checkpoint at a step they agree on.)
  if (entry->job.drain_requested || entry->resizing) reply.order = WorkerOrder::kDrain;
  return reply;
}

// A rank received SIGTERM. The coordinator's own stop of it (the attempt is stopping, the job
// being cancelled) says exit; a signal from outside the coordinator drains the job, the way a
// standalone worker drains on SIGTERM: a batch system ending the job signals every process of it.
OrderReply Supervisor::TerminatedLocked(Txn& txn, JobEntry& entry, const AttemptRecord& attempt,
                                        int rank) {
  OrderReply reply;
  // (A rank whose exit is recorded already is a stray the coordinator is stopping.)
  if (attempt.state == AttemptState::kStopping || entry.job.cancel_requested ||
      attempt.ranks[rank].exit.has_value()) {
    reply.order = WorkerOrder::kStop;
    return reply;
  }
  if (!entry.job.drain_requested) {
    DrainLocked(txn, entry,
                absl::StrFormat("drain requested: rank %d of attempt %d received SIGTERM", rank,
                                attempt.attempt_id));
  }
  reply.order = WorkerOrder::kDrain;
  return reply;
}

}  // namespace trainyard::server
