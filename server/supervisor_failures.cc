// Supervisor: failure handling — classifying a failed attempt and deciding its restart
// (RestartPolicy), hang verdicts (FailureDetector), stragglers, quarantine of nodes where
// attempts keep failing (NodeQuarantine), the Young–Daly checkpoint orders (CheckpointPolicy)
// and the goodput account (GoodputAccount). The policies are pure classes; this file feeds them
// and turns their answers into transitions, events and orders.
#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "common/status.h"
#include "config/mesh.h"
#include "server/mesh_advisor.h"
#include "server/requirements.h"
#include "server/supervisor.h"

namespace trainyard::server {
namespace {

std::string Where(const AttemptRecord& attempt, int rank) {
  if (rank < 0 || rank >= static_cast<int>(attempt.ranks.size())) return "";
  const RankSlot& slot = attempt.ranks[rank];
  std::string where = absl::StrCat("rank ", rank, " on ", slot.node_id);
  if (!slot.hostname.empty() && slot.hostname != slot.node_id) {
    absl::StrAppend(&where, " (", slot.hostname, ")");
  }
  if (slot.pid != 0) absl::StrAppend(&where, " (pid ", slot.pid, ")");
  return where;
}

// A stored spec, read back at restart: fields it holds without effect are logged, not refused.
absl::StatusOr<config::JobSpec> ParseStored(const JobRecord& job) {
  std::vector<std::string> ignored;
  absl::StatusOr<config::JobSpec> spec =
      config::ParseStoredJobSpec(job.spec_yaml, job.id, &ignored);
  for (const std::string& field : ignored) {
    TY_LOG(WARNING) << "job " << job.id
                    << ": stored spec field ignored, it has no effect: " << field;
  }
  return spec;
}

}  // namespace

std::string Supervisor::EncodeAccountsLocked(const JobEntry& entry) const {
  stored::JobAccounts accounts;
  *accounts.mutable_goodput() = entry.goodput.Save();
  entry.controller.SaveCheckpointEstimates(accounts);
  return accounts.SerializeAsString();
}

bool Supervisor::RestoreAccountsLocked(JobEntry& entry) {
  // Read once: from here the policies hold them, and each commit encodes them afresh.
  const std::string encoded = std::move(entry.job.accounts);
  entry.job.accounts.clear();
  if (encoded.empty()) return false;
  stored::JobAccounts accounts;
  absl::Status loaded = accounts.ParseFromString(encoded) ? entry.goodput.Load(accounts.goodput())
                                                          : absl::DataLossError("unreadable");
  if (loaded.ok()) loaded = entry.controller.LoadCheckpointEstimates(accounts);
  if (!loaded.ok()) {
    // Load validates before it changes anything, so only a goodput account loaded before the
    // Young–Daly estimates failed needs undoing.
    TY_LOG(WARNING) << "job " << entry.job.id << ": the stored goodput and Young–Daly accounts "
                    << "do not read back (" << loaded.message() << "); they start afresh";
    entry.goodput = GoodputAccount();
    return false;
  }
  return true;
}

std::optional<config::JobSpec> Supervisor::ResizedSpecLocked(const config::JobSpec& spec,
                                                             int nodes) {
  if (spec.parallelism.automatic && nodes != spec.resources.nodes) {
    // `auto` is the planner's choice at every size: the mesh it would choose had the job been
    // submitted for this many nodes (the fastest that fits the connected nodes), run with the
    // micro-batch fitted as for any resize. When it has none, the static rule's mesh stands (the
    // scheduler still places it only where its memory fits).
    config::JobSpec ask = spec;
    ask.resources.nodes = nodes;
    absl::StatusOr<Admission> planned =
        AdmitSpec(std::move(ask), registry_->SmallestNodes(), cpu_profile_);
    if (planned.ok()) {
      std::optional<config::JobSpec> resized =
          config::ResizedSpec(spec, nodes, &planned->spec.parallelism);
      if (resized.has_value()) return resized;
    }
  }
  return config::ResizedSpec(spec, nodes);
}

void Supervisor::LoadPoliciesLocked(JobEntry& entry, const config::JobSpec* parsed) {
  // Parsing YAML is the costliest part of a submission: never twice, and not under the lock.
  absl::StatusOr<config::JobSpec> spec =
      parsed != nullptr ? absl::StatusOr<config::JobSpec>(*parsed) : ParseStored(entry.job);
  if (!spec.ok()) {
    // Stored specs passed validation, and fields a newer build finds without effect are ignored;
    // one that a newer build refuses for another reason keeps the defaults.
    TY_LOG(WARNING) << "job " << entry.job.id
                    << ": fault tolerance from defaults: " << spec.status();
    config::FaultToleranceSpec defaults;
    defaults.max_restarts = entry.job.requirements.max_restarts;
    entry.controller.Configure(defaults);
  } else {
    entry.controller.Configure(spec->fault_tolerance);
    // The mesh the job was admitted with: for `auto`, the planner's choice (not config's).
    const Mesh& admitted = entry.job.requirements.mesh;
    if (admitted.dp > 0) {
      spec->parallelism.dp = admitted.dp;
      spec->parallelism.tp = std::max(1, admitted.tp);
      spec->parallelism.pp = std::max(1, admitted.pp);
      spec->parallelism.cp = std::max(1, admitted.cp);
      if (admitted.ep > 0) spec->parallelism.ep = admitted.ep;  // 0: the spec's own
      spec->parallelism.zero = admitted.zero_stage;
      if (const auto schedule = config::ScheduleFromName(admitted.schedule)) {
        spec->parallelism.schedule = *schedule;  // for `schedule: auto`, the planner's choice
        spec->parallelism.virtual_stages = std::max(1, admitted.virtual_stages);
      }
    }
  }
  std::optional<CheckpointPolicyOptions> young_daly;
  if (spec.ok() && spec->checkpoint.enabled() && !spec->checkpoint.every_steps) {
    CheckpointPolicyOptions& options = young_daly.emplace();
    options.node_mtbf = options_.node_mtbf;
    options.nodes = std::max(entry.job.requirements.nodes, 1);
    options.min_every_steps = spec->checkpoint.min_every_steps;
    options.max_every_steps = spec->checkpoint.max_every_steps;
    options.first_checkpoint_steps = std::clamp<int64_t>(
        options.first_checkpoint_steps, options.min_every_steps, options.max_every_steps);
  }
  entry.controller.ChooseCheckpoints(young_daly);
  // Elastic sizes, max_nodes down to min_nodes but its own, where the spec has a valid mesh.
  entry.min_nodes = spec.ok() ? spec->min_nodes() : entry.job.requirements.nodes;
  entry.max_nodes = spec.ok() ? spec->max_nodes() : entry.job.requirements.nodes;
  entry.memory_per_rank = spec.ok() ? RankMemoryNeed(*spec, cpu_profile_) : 0;
  entry.larger_shapes.clear();
  entry.smaller_shapes.clear();
  if (spec.ok()) {
    auto accumulation = [](const config::JobSpec& s) {
      const int micro = config::MicroBatchPerRank(s.training, s.parallelism);
      return micro > 0 ? s.training.batch / s.parallelism.dp / micro : 1;
    };
    entry.full_accumulation = accumulation(*spec);
    entry.full_micro_batch = config::MicroBatchPerRank(spec->training, spec->parallelism);
    for (int nodes = spec->max_nodes(); nodes >= spec->min_nodes(); --nodes) {
      if (nodes == spec->resources.nodes) continue;
      std::optional<config::JobSpec> resized = nodes > spec->resources.nodes
                                                   ? config::GrownSpec(*spec, nodes)
                                                   : ResizedSpecLocked(*spec, nodes);
      if (!resized) continue;
      (nodes > spec->resources.nodes ? entry.larger_shapes : entry.smaller_shapes)
          .push_back(JobShape{nodes, MeshOf(resized->parallelism), accumulation(*resized),
                              config::MicroBatchPerRank(resized->training, resized->parallelism),
                              RankMemoryNeed(*resized, cpu_profile_)});
    }
  }
  entry.controller.Restore(entry.attempts);
}

void Supervisor::WatchAttemptLocked(JobEntry& entry, const AttemptRecord& attempt,
                                    absl::Time since) {
  entry.detector = std::make_unique<FailureDetector>(
      FailureDetector::Options{.limits = entry.controller.fault_tolerance(),
                               .gather = options_.hang_gather,
                               .slack = options_.hang_slack},
      static_cast<int>(attempt.ranks.size()), since);
  entry.stragglers.reset();
  if (entry.controller.fault_tolerance().straggler_margin > 0) {
    entry.stragglers = std::make_unique<StragglerDetector>(
        StragglerOptions{.margin = entry.controller.fault_tolerance().straggler_margin,
                         .window = entry.controller.fault_tolerance().straggler_window});
  }
  std::set<std::string> nodes;
  for (const RankSlot& slot : attempt.ranks) nodes.insert(slot.node_id);
  entry.controller.AttemptRunning(since, static_cast<int>(nodes.size()));
}

void Supervisor::FailAttemptLocked(Txn& txn, JobEntry& entry, AttemptRecord& attempt,
                                   const AttemptFailure& failure) {
  JobRecord& job = entry.job;
  const absl::Time now = clock_->Now();
  const std::string class_name = FailureClassName(failure.failure_class);
  attempt.state = AttemptState::kStopping;
  attempt.cause = failure.cause;
  attempt.failure_class = class_name;
  attempt.blamed_rank = failure.rank;
  TouchAttempt(txn, entry, attempt);
  FailJoinWaitersLocked(txn, entry,
                        absl::FailedPreconditionError(absl::StrCat("attempt ", attempt.attempt_id,
                                                                   " failed: ", failure.cause)));
  entry.detector.reset();
  entry.resizing = false;  // a failure ends a resize in flight: the restart policy decides
  std::vector<Straggler> stragglers;
  if (entry.stragglers) stragglers = entry.stragglers->Flagged();
  entry.stragglers.reset();

  const absl::Time fault =
      failure.fault == absl::InfinitePast() ? now : std::min(failure.fault, now);
  const FailureSummary& summary = entry.controller.Record(
      JobController::Failure{failure.failure_class, failure.cause, failure.rank, fault}, attempt,
      now);
  ++failures_by_class_[class_name];
  detection_seconds_.try_emplace(class_name, FailureSecondsBuckets())
      .first->second.Observe(summary.detection_seconds);
  entry.goodput.Failed(fault, now, class_name);

  const bool infrastructure = failure.failure_class != FailureClass::kUserError;
  if (infrastructure && !summary.node_id.empty()) {
    RecordNodeFailureLocked(txn, entry, attempt.attempt_id, summary.node_id, failure.cause, now);
  }

  // A job being cancelled or drained is never restarted: the user asked it to stop.
  if (job.cancel_requested) {
    AddEvent(txn, entry, attempt.attempt_id, job.state, job.state, class_name, failure.cause);
  } else if (job.drain_requested) {
    AddEvent(txn, entry, attempt.attempt_id, job.state, job.state, class_name,
             absl::StrCat(failure.cause, "; the job was draining: no restart"));
  } else {
    const JobController::Verdict verdict =
        entry.controller.Decide(attempt, stragglers, now, jitter_draw_());
    if (verdict.restart) {
      // Counted when granted, in the budgets and the job's total alike, so that `status` shows
      // the same count on its attempts and restarts lines while the restart waits for a node.
      ++job.restarts;
      ++restarts_by_cause_[class_name];
      Transition(txn, entry, JobState::kRestarting, class_name,
                 absl::StrCat(failure.cause, "; ", verdict.reason));
      for (const JobController::Exclusion& x : verdict.excluded) {
        AddEvent(txn, entry, attempt.attempt_id, job.state, job.state, "straggler_excluded",
                 absl::StrFormat("the next attempt avoids node %s when enough others are free: "
                                 "rank %d there computed %.2f× its peers' median",
                                 x.node_id, x.rank, x.score));
      }
    } else {
      AddEvent(txn, entry, attempt.attempt_id, job.state, job.state, class_name,
               absl::StrCat(failure.cause, "; ", verdict.reason));
    }
  }
  StopRemainingLocked(txn, entry, attempt, failure.cause);
}

void Supervisor::CheckHangLocked(Txn& txn, JobEntry& entry, absl::Time now) {
  AttemptRecord* attempt = LiveAttempt(entry);
  if (attempt == nullptr || attempt->state != AttemptState::kRunning || !entry.detector) return;
  std::optional<HangVerdict> verdict = entry.detector->Check(now);
  if (!verdict) return;
  FailAttemptLocked(txn, entry, *attempt,
                    AttemptFailure{.failure_class = FailureClass::kHang,
                                   .cause = absl::StrCat(Where(*attempt, verdict->rank),
                                                         " is hung: ", verdict->reason),
                                   .rank = verdict->rank,
                                   .fault = verdict->fault});
  if (AllRanksExited(*attempt)) FinishAttemptLocked(txn, entry, *attempt);
}

absl::Status Supervisor::ReportHang(const HangUpdate& update) {
  Txn txn;
  {
    absl::MutexLock lock(&mu_);
    const HangReport& r = update.report;
    TY_ASSIGN_OR_RETURN(const RankOfAttempt found,
                        FindLiveRankLocked(update.job_id, update.attempt_id, r.rank));
    JobEntry* entry = found.entry;
    AttemptRecord* attempt = found.attempt;
    if (attempt->state != AttemptState::kRunning || !entry->detector) return absl::OkStatus();
    const absl::Time now = clock_->Now();
    std::string what = r.operation.empty()
                           ? std::string("not blocked in a collective")
                           : absl::StrFormat("blocked %.1f s in %s (%s group) waiting for",
                                             r.waiting_s, r.operation, r.group);
    for (size_t i = 0; i < r.waiting_for.size(); ++i) {
      absl::StrAppend(&what, i == 0 ? " rank " : ", ", r.waiting_for[i]);
    }
    AddEvent(txn, *entry, update.attempt_id, entry->job.state, entry->job.state, "hang_report",
             absl::StrFormat("%s: step %d has run %.1f s (limit %.1f s), %s",
                             Where(*attempt, r.rank), r.step + 1, r.elapsed_s, r.limit_s, what));
    entry->detector->HangReported(r, now);
    CheckHangLocked(txn, *entry, now);
    ScheduleLocked(txn);
    CommitLocked(txn).IgnoreError();
  }
  RunAfter(txn);
  return absl::OkStatus();
}

void Supervisor::ObserveProgressLocked(Txn& txn, JobEntry& entry, const ProgressUpdate& update,
                                       OrderReply& reply) {
  const absl::Time now = clock_->Now();
  AttemptRecord* attempt = FindAttempt(entry, update.attempt_id);
  if (entry.detector) {
    entry.detector->Progress(update.rank, update.step, update.max_step_ms / 1e3, now);
    // The last step's checkpoint commit, and a drain's, may take long: not a hang.
    if (update.step >= update.total_steps || entry.job.drain_requested || entry.resizing) {
      entry.detector->Suspend();
    }
  }
  if (entry.stragglers && update.step_times.total_ms > 0 && attempt != nullptr) {
    const double compute_s =
        std::max(0.0, update.step_times.total_ms - update.step_times.communication_ms) / 1e3;
    if (std::optional<StragglerChange> change =
            entry.stragglers->Report(update.rank, compute_s, now)) {
      AddEvent(txn, entry, update.attempt_id, entry.job.state, entry.job.state,
               change->flagged ? "straggler" : "straggler_recovered",
               change->flagged
                   ? absl::StrFormat("%s is a straggler: it computes %.2f× its peers' median "
                                     "(margin %.0f%%, %d reports in a row)",
                                     Where(*attempt, change->rank), change->score,
                                     100 * entry.controller.fault_tolerance().straggler_margin,
                                     entry.controller.fault_tolerance().straggler_window)
                   : absl::StrFormat("%s is no longer a straggler (%.2f× its peers' median)",
                                     Where(*attempt, change->rank), change->score));
    }
  }
  if (update.rank != 0) return;
  entry.goodput.Progress(now, update.step);
  if (update.attempt_id == entry.job.current_attempt) {
    if (std::optional<absl::Duration> latency = entry.controller.FirstStep(now)) {
      restart_seconds_.Observe(absl::ToDoubleSeconds(*latency));
    }
  }
  entry.controller.StepTook(update.step_times.total_ms / 1e3);
  if (!entry.controller.chooses_checkpoints() || update.step >= update.total_steps) return;
  int64_t last = std::max(entry.last_save_step, entry.job.last_checkpoint.step);
  // The ranks save at the ordered step itself: once this attempt has passed it, that save counts
  // as the last one, even before its report arrives (saves report when they commit), so that
  // the next order keeps min_every_steps from it.
  if (entry.ordered_attempt == update.attempt_id && entry.ordered_step <= update.step) {
    last = std::max(last, entry.ordered_step);
  }
  if (std::optional<int64_t> next = entry.controller.CheckpointDue(update.step, last)) {
    entry.ordered_step = std::min(*next, update.total_steps);
    entry.ordered_attempt = update.attempt_id;
    reply.order = WorkerOrder::kCheckpoint;
    reply.checkpoint_step = entry.ordered_step;
  }
}

void Supervisor::TickFailuresLocked(JobEntry& entry, absl::Time now) {
  if (entry.job.state == JobState::kRestarting && entry.controller.BackoffEnded(now)) {
    EnqueueLocked(entry);  // placed by Tick's ScheduleLocked
  }
  entry.controller.RunningUntil(now);
}

void Supervisor::RefreshHealthLocked(JobEntry& entry, absl::Time now) {
  JobHealth& health = entry.job.health;
  health = JobHealth{};
  entry.controller.FillHealth(health, entry.job.state == JobState::kRestarting, now,
                              entry.ordered_step);
  if (entry.detector) {
    health.hang_limit_s = entry.detector->LimitInUse();
    health.hang_limit_of = entry.detector->LimitOf();
  }
  const GoodputSnapshot g = entry.goodput.Snapshot(now);
  health.goodput = GoodputView{g.wall_s,  g.productive_s,       g.checkpoint_s,    g.startup_s,
                               g.other_s, g.restart_s_by_cause, g.lost_s_by_cause, g.ratio};
  if (entry.stragglers) {
    const AttemptRecord* attempt = LiveAttempt(entry);
    for (const Straggler& s : entry.stragglers->Flagged()) {
      StragglerView view{s.rank, "", s.score, s.since};
      if (attempt != nullptr && s.rank < static_cast<int>(attempt->ranks.size())) {
        view.node_id = attempt->ranks[s.rank].node_id;
      }
      health.stragglers.push_back(std::move(view));
    }
  }
}

void Supervisor::RecordNodeFailureLocked(Txn& txn, JobEntry& entry, int attempt_id,
                                         const std::string& node_id, const std::string& cause,
                                         absl::Time now) {
  if (!quarantine_.RecordFailure(node_id, now, cause)) return;
  const JobState state = entry.job.state;
  const std::optional<Cordon> cordon = quarantine_.Find(node_id, now);
  const std::string reason = cordon ? cordon->reason : cause;
  if (!CouldRunLocked(entry, now)) {
    // A cordon would strand the job (on a one-node cluster, the only node): the node stays
    // usable and its failures count from zero again; the job's own restart limit still holds.
    quarantine_.Uncordon(node_id);
    const std::string why =
        absl::StrCat("node ", node_id, " not cordoned (", reason, "): no other connected node ",
                     "can run job ", entry.job.id, ", which a cordon would strand");
    TY_LOG(WARNING) << why;
    AddEvent(txn, entry, attempt_id, state, state, "node_not_cordoned", why);
    return;
  }
  const std::string why = absl::StrCat(
      "node ", node_id, " cordoned until ",
      cordon ? absl::FormatTime("%Y-%m-%d %H:%M:%S UTC", cordon->until, absl::UTCTimeZone())
             : std::string("lifted"),
      ": ", reason);
  TY_LOG(WARNING) << why;
  if (cordon) txn.batch.cordons.push_back({node_id, *cordon});  // a restarted coordinator keeps it
  AddEvent(txn, entry, attempt_id, state, state, "node_cordoned", why);
}

bool Supervisor::CouldRunLocked(const JobEntry& entry, absl::Time now) {
  PendingJob job;
  job.job_id = entry.job.id;
  job.requirements = entry.job.requirements;
  job.memory_per_rank = entry.memory_per_rank;
  job.smaller = entry.smaller_shapes;  // a restart may run at any of them (larger ones need more)
  std::vector<NodeView> capacity = CapacityLocked(now);
  Placement ignored;
  return PlaceAtSomeSize(job, capacity, ignored);
}

std::vector<NodeView> Supervisor::SchedulableNodesLocked(absl::Time now) {
  std::vector<NodeView> nodes;
  for (NodeView& node : registry_->FreeNodes()) {
    if (!quarantine_.IsCordoned(node.node_id, now)) nodes.push_back(std::move(node));
  }
  return nodes;
}

std::vector<NodeView> Supervisor::CapacityLocked(absl::Time now, bool with_cordoned) {
  std::vector<NodeView> nodes;
  for (const NodeStatus& status : registry_->Nodes()) {
    if (!status.connected || status.lost ||
        (!with_cordoned && quarantine_.IsCordoned(status.record.node_id, now))) {
      continue;
    }
    NodeView& node = nodes.emplace_back();
    node.node_id = status.record.node_id;
    node.hostname = status.record.hostname;
    node.memory_bytes = status.record.memory_bytes;
    node.gpu_memory_bytes = SmallestGpuMemory(status.record);
    for (int slot = 0; slot < status.record.cpu_slots; ++slot) node.free_cpu_slots.push_back(slot);
    for (const GpuInfo& gpu : status.record.gpus) node.free_gpus.push_back(gpu.index);
  }
  return nodes;
}

void Supervisor::FillWaitingLocked(JobRecord& job, absl::Time now) {
  if (!scheduler_.Contains(job.id)) return;
  const std::vector<NodeView> capacity = CapacityLocked(now);
  job.waiting = scheduler_.WaitReason(job.id, capacity, SchedulableNodesLocked(now));
  const std::vector<Cordon> cordons = quarantine_.Cordoned(now);
  if (cordons.empty() || !scheduler_.FitsNowhere(job.id, capacity) ||
      scheduler_.FitsNowhere(job.id, CapacityLocked(now, /*with_cordoned=*/true))) {
    return;
  }
  // Only cordoned nodes could run it: say which, why, until when, and how to lift them.
  std::vector<std::string> parts;
  for (const Cordon& c : cordons) {
    parts.push_back(
        absl::StrCat("node ", c.node_id, " is cordoned until ",
                     absl::FormatTime("%Y-%m-%d %H:%M:%S UTC", c.until, absl::UTCTimeZone()), " (",
                     c.reason, "); `trainyard nodes uncordon ", c.node_id, "` lifts it now"));
  }
  job.waiting = absl::StrCat("waiting for cordoned nodes: ", absl::StrJoin(parts, "; "));
}

absl::StatusOr<NodeStatus> Supervisor::Uncordon(const std::string& node_id) {
  Txn txn;
  NodeStatus result;
  {
    absl::MutexLock lock(&mu_);
    const absl::Time now = clock_->Now();
    std::vector<NodeStatus> nodes = registry_->Nodes();
    auto node = std::find_if(nodes.begin(), nodes.end(),
                             [&](const NodeStatus& n) { return n.record.node_id == node_id; });
    if (node == nodes.end()) return absl::NotFoundError(absl::StrCat("no node ", node_id));
    if (!quarantine_.IsCordoned(node_id, now)) {
      return absl::FailedPreconditionError(absl::StrCat("node ", node_id, " is not cordoned"));
    }
    quarantine_.Uncordon(node_id);
    txn.batch.cordons.push_back({node_id, std::nullopt});
    TY_LOG(INFO) << "node " << node_id << " uncordoned";
    result = *node;
    ScheduleLocked(txn);
    CommitLocked(txn).IgnoreError();
  }
  RunAfter(txn);
  return result;
}

}  // namespace trainyard::server
