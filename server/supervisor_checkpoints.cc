// Supervisor: checkpoint records and drains — what rank 0 reports about its saves, the job's
// newest committed checkpoint, DrainJob and the DRAINED transition.
#include <algorithm>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status.h"
#include "server/requirements.h"
#include "server/supervisor.h"

namespace trainyard::server {
namespace {

// "drained at step S: checkpoint PATH" from the newest committed checkpoint.
std::string DrainedMessage(const JobRecord& job) {
  if (!job.last_checkpoint.path.empty()) {
    return absl::StrCat("drained at step ", job.last_checkpoint.step, ": checkpoint ",
                        job.last_checkpoint.path);
  }
  if (!job.requirements.checkpoint.enabled()) return "drained without a checkpoint";
  return "drained before any checkpoint was committed";
}

std::string OneLine(std::string text) {
  for (char& c : text) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  return text;
}

}  // namespace

void Supervisor::RestoreCheckpointsLocked(std::vector<JobCheckpoint> checkpoints) {
  std::map<std::string, std::vector<CheckpointInfo>> by_job;
  for (JobCheckpoint& checkpoint : checkpoints) {
    by_job[checkpoint.job_id].push_back(std::move(checkpoint.record));
  }
  for (auto& [id, entry] : jobs_) {
    CheckpointSettings& policy = entry.job.requirements.checkpoint;
    if (!policy.recorded) {
      // Stored before schema 2. The spec passed validation when it was submitted; roots that
      // changed since do not matter for reading its checkpoint section.
      absl::StatusOr<config::JobSpec> spec = config::ParseStoredJobSpec(entry.job.spec_yaml, id);
      if (spec.ok()) {
        policy = CheckpointSettingsFromSpec(spec->checkpoint);
      } else {
        TY_LOG(WARNING) << "job " << id << ": checkpoint policy unknown: " << spec.status();
      }
    }
    auto records = by_job.find(id);
    if (records == by_job.end()) continue;
    entry.checkpoints.Load(std::move(records->second));
    entry.job.last_checkpoint = entry.checkpoints.NewestCommitted(entry.job.last_checkpoint);
    by_job.erase(records);
  }
  for (const auto& [id, records] : by_job) {
    TY_LOG(WARNING) << records.size() << " checkpoint record(s) of unknown job " << id
                    << " ignored";
  }
}

void Supervisor::RecordCheckpointsLocked(Txn& txn, JobEntry& entry, const ProgressUpdate& update) {
  JobRecord& job = entry.job;
  for (CheckpointInfo record : update.checkpoints) {
    if (record.attempt_id == 0) record.attempt_id = update.attempt_id;
    if (record.written == absl::InfinitePast()) record.written = clock_->Now();
    record.message = OneLine(std::move(record.message));
    if (absl::Status valid = CheckpointLedger::Validate(record); !valid.ok()) {
      TY_LOG(WARNING) << "job " << job.id << ": dropped a record from rank " << update.rank
                      << " of attempt " << update.attempt_id << ": " << valid;
      continue;
    }
    if (entry.checkpoints.Apply(record) == CheckpointLedger::Outcome::kRepeat) continue;
    txn.batch.checkpoints.push_back(JobCheckpoint{job.id, record});
    AddEvent(txn, entry, record.attempt_id, job.state, job.state, "checkpoint",
             DescribeCheckpoint(record));
    entry.last_save_step = std::max(entry.last_save_step, record.step);
    if (record.state == CheckpointState::kCommitted) {
      entry.goodput.CheckpointBlocked(record.blocked_seconds);
      // Of the current attempt, durable progress: the next failure starts the backoff afresh.
      entry.controller.CheckpointCommitted(record.blocked_seconds,
                                           record.attempt_id == job.current_attempt);
    }
  }
  CheckpointInfo newest = entry.checkpoints.NewestCommitted(job.last_checkpoint);
  const bool moved = newest.path != job.last_checkpoint.path ||
                     newest.step != job.last_checkpoint.step ||
                     newest.written != job.last_checkpoint.written;
  job.last_checkpoint = std::move(newest);
  if (moved) TouchJob(txn, entry);  // its columns in the jobs row changed
}

void Supervisor::RecordReportedCheckpointLocked(Txn& txn, JobEntry& entry,
                                                const ProgressUpdate& update) {
  CheckpointInfo checkpoint = update.checkpoint;
  JobRecord& job = entry.job;
  if (checkpoint.path.empty() || entry.checkpoints.Find(checkpoint.path) != nullptr) return;
  if (!job.last_checkpoint.path.empty() && checkpoint.step <= job.last_checkpoint.step) return;
  checkpoint.state = CheckpointState::kCommitted;
  if (checkpoint.attempt_id == 0) checkpoint.attempt_id = update.attempt_id;
  if (checkpoint.written == absl::InfinitePast()) checkpoint.written = clock_->Now();
  job.last_checkpoint = checkpoint;
  AddEvent(txn, entry, job.current_attempt, job.state, job.state, "checkpoint",
           absl::StrCat("checkpoint of step ", checkpoint.step, " at ", checkpoint.path));
}

void Supervisor::RecordResumedCheckpointLocked(Txn& txn, JobEntry& entry, int attempt_id,
                                               const ProgressUpdate::Resumed& resumed) {
  JobRecord& job = entry.job;
  if (resumed.from_memory || resumed.step <= 0 || resumed.from.empty()) return;
  if (resumed.step <= job.last_checkpoint.step && !job.last_checkpoint.path.empty()) return;
  // A record of the path is the truth about it; one the attempt resumed from exists.
  if (entry.checkpoints.Find(resumed.from) != nullptr) return;
  // Not a ledger record: its size and costs are unknown, and the Young–Daly interval and the
  // checkpoint metrics are drawn from measured saves only. Its write time is unknown too.
  job.last_checkpoint = CheckpointInfo{.step = resumed.step, .path = resumed.from};
  TouchJob(txn, entry);
  AddEvent(txn, entry, attempt_id, job.state, job.state, "checkpoint",
           absl::StrCat("checkpoint of step ", resumed.step, " at ", resumed.from,
                        ", which no save "
                        "report named: attempt ",
                        attempt_id, " resumed from it"));
}

void Supervisor::FinishDrainLocked(Txn& txn, JobEntry& entry, const std::string& context) {
  JobRecord& job = entry.job;
  job.message = DrainedMessage(job);
  Transition(txn, entry, JobState::kDrained, "drained", absl::StrCat(job.message, "; ", context));
}

void Supervisor::DrainLocked(Txn& txn, JobEntry& entry, const std::string& cause) {
  JobRecord& job = entry.job;
  job.drain_requested = true;
  AttemptRecord* attempt = LiveAttempt(entry);
  if (attempt == nullptr) {
    scheduler_.Remove(job.id);
    FinishDrainLocked(txn, entry, absl::StrCat(cause, " while no worker was running"));
  } else if (attempt->state == AttemptState::kStopping) {
    AddEvent(txn, entry, attempt->attempt_id, job.state, job.state, "drain_requested",
             absl::StrCat(cause, "; attempt ", attempt->attempt_id,
                          " is already stopping: no restart follows"));
  } else {
    AddEvent(txn, entry, attempt->attempt_id, job.state, job.state, "drain_requested",
             absl::StrCat(cause, "; the ranks of attempt ", attempt->attempt_id,
                          job.requirements.checkpoint.enabled()
                              ? " checkpoint at a step they agree on, then exit"
                              : " stop at a step they agree on and exit (no checkpoint dir)"));
  }
  ScheduleLocked(txn);  // a drained head of the queue may have blocked others
}

absl::StatusOr<JobRecord> Supervisor::Drain(const std::string& job_id, const std::string& reason,
                                            const std::string& user) {
  Txn txn;
  JobRecord result;
  {
    absl::MutexLock lock(&mu_);
    JobEntry* entry = FindJob(job_id);
    if (entry == nullptr) return absl::NotFoundError(absl::StrCat("no job ", job_id));
    JobRecord& job = entry->job;
    if (job.state == JobState::kDrained || (job.drain_requested && !IsFinal(job.state))) {
      return job;
    }
    if (IsFinal(job.state)) {
      return absl::FailedPreconditionError(
          absl::StrCat("job ", job_id, " already ", JobStateName(job.state)));
    }
    if (job.cancel_requested) {
      return absl::FailedPreconditionError(absl::StrCat("job ", job_id, " is being cancelled"));
    }
    DrainLocked(txn, *entry, RequestCause("drain requested", "drain requested", user, reason));
    TY_RETURN_IF_ERROR(CommitLocked(txn));
    result = job;
  }
  RunAfter(txn);
  return result;
}

absl::StatusOr<std::vector<CheckpointInfo>> Supervisor::ListCheckpoints(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  JobEntry* entry = FindJob(job_id);
  if (entry == nullptr) return absl::NotFoundError(absl::StrCat("no job ", job_id));
  return entry->checkpoints.Chronological();
}

}  // namespace trainyard::server
