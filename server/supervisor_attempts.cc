// Supervisor: the attempt state machine — placement, start, rendezvous completion, rank exits,
// failure, teardown and the job transitions that follow.
#include <algorithm>
#include <cstring>
#include <optional>
#include <set>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "server/supervisor.h"

namespace trainyard::server {
namespace {

std::string NodeName(const RankSlot& slot) {
  if (slot.hostname.empty() || slot.hostname == slot.node_id) return slot.node_id;
  return absl::StrCat(slot.node_id, " (", slot.hostname, ")");
}

// The worker's own account of an error: its last "error:" or "hang:" line, if it logged one.
std::string WorkerError(const RankExit& exit) {
  for (auto line = exit.last_log_lines.rbegin(); line != exit.last_log_lines.rend(); ++line) {
    for (const char* mark : {"error: ", "hang: "}) {
      const size_t at = line->find(mark);
      if (at != std::string::npos) return line->substr(at);
    }
  }
  return "";
}

std::string DescribeExit(const RankSlot& slot, const RankExit& exit, FailureClass failure_class) {
  const std::string who = absl::StrCat("rank ", slot.rank, " on ", NodeName(slot));
  const std::string pid = exit.pid != 0 ? absl::StrCat(" (pid ", exit.pid, ")") : "";
  if (!exit.message.empty()) return absl::StrCat(who, pid, ": ", exit.message);
  if (exit.signal != 0) {
    return absl::StrCat(who, pid, " was killed by signal ", exit.signal, " (",
                        strsignal(exit.signal), ")");
  }
  std::string text = absl::StrCat(who, pid, " exited with code ", exit.exit_code);
  switch (failure_class) {
    case FailureClass::kUserError:
      absl::StrAppend(&text, " (the job's own input or size is at fault)");
      break;
    case FailureClass::kHang:
      absl::StrAppend(&text, " (its hang watchdog fired)");
      break;
    case FailureClass::kCollectiveTimeout:
      absl::StrAppend(&text, " (a collective timed out)");
      break;
    default:
      break;
  }
  if (const std::string error = WorkerError(exit); !error.empty()) {
    absl::StrAppend(&text, ": ", error);
  }
  return text;
}

std::string DescribePlacement(const std::vector<RankSlot>& ranks) {
  std::vector<std::string> parts;
  size_t begin = 0;
  while (begin < ranks.size()) {
    size_t end = begin;
    while (end + 1 < ranks.size() && ranks[end + 1].node_id == ranks[begin].node_id) ++end;
    parts.push_back(begin == end
                        ? absl::StrCat(ranks[begin].node_id, " (rank ", begin, ")")
                        : absl::StrCat(ranks[begin].node_id, " (ranks ", begin, "-", end, ")"));
    begin = end + 1;
  }
  return absl::StrJoin(parts, ", ");
}

// "dp 4 → 2, accumulation 1 → 2", naming each axis that changed (dp always).
std::string MeshChange(const Mesh& from, int from_accumulation, const Mesh& to,
                       int to_accumulation) {
  return absl::StrCat(
      "dp ", from.dp, " → ", to.dp,
      to.cp != from.cp ? absl::StrCat(", cp ", from.cp, " → ", to.cp) : "",
      from.ep > 0 && to.ep != from.ep ? absl::StrCat(", ep ", from.ep, " → ", to.ep) : "",
      to.tp != from.tp ? absl::StrCat(", tp ", from.tp, " → ", to.tp) : "",
      to.pp != from.pp ? absl::StrCat(", pp ", from.pp, " → ", to.pp) : "", ", accumulation ",
      from_accumulation, " → ", to_accumulation);
}

// The size an attempt ran at: its nodes, its mesh, and the accumulation of the job's shape with
// that many nodes (the job's own, `own_accumulation`, at `own_nodes`).
JobShape ShapeOfAttempt(const AttemptRecord& attempt, int own_nodes, int own_accumulation,
                        const std::vector<JobShape>& larger, const std::vector<JobShape>& smaller) {
  JobShape shape;
  std::set<std::string> nodes;
  for (const RankSlot& slot : attempt.ranks) nodes.insert(slot.node_id);
  shape.nodes = static_cast<int>(nodes.size());
  shape.mesh = attempt.mesh;
  shape.accumulation = own_accumulation;
  for (const std::vector<JobShape>* shapes : {&larger, &smaller}) {
    for (const JobShape& s : *shapes) {
      if (s.nodes == shape.nodes && shape.nodes != own_nodes) shape.accumulation = s.accumulation;
    }
  }
  return shape;
}

}  // namespace

void Supervisor::ScheduleLocked(Txn& txn) {
  if (scheduler_.size() == 0 || shutting_down_ || queue_held_) return;
  // Only the nodes the queued jobs could take, from the registry's best-fit index: a pass costs
  // O(demand · log nodes), not a view of the whole cluster (Scheduler::Demands says why that
  // places the same).
  std::set<std::string> cordoned;
  for (const Cordon& cordon : quarantine_.Cordoned(clock_->Now())) cordoned.insert(cordon.node_id);
  std::map<std::string, NodeView> views;
  for (const Scheduler::Demand& demand : scheduler_.Demands()) {
    const auto usable = [&cordoned, &demand](const NodeView& node) {
      return !cordoned.contains(node.node_id) &&
             MemoryFits(node, demand.kind, demand.ranks_per_node, demand.memory_per_rank);
    };
    for (NodeView& view :
         registry_->NodesInFitOrder(demand.kind, demand.ranks_per_node, demand.nodes, usable)) {
      views.emplace(view.node_id, std::move(view));
    }
  }
  std::vector<NodeView> nodes;
  nodes.reserve(views.size());
  for (auto& [id, view] : views) nodes.push_back(std::move(view));
  const std::set<DeviceKind> no_growth =
      scheduler_.MayGrow() ? KindsNotToGrowLocked() : std::set<DeviceKind>();
  for (Placement& placement : scheduler_.Schedule(std::move(nodes), no_growth)) {
    JobEntry* entry = FindJob(placement.job_id);
    if (entry == nullptr || IsFinal(entry->job.state)) continue;
    StartAttemptLocked(txn, *entry, std::move(placement.ranks), placement.shape);
  }
}

StartWorkerOrder Supervisor::StartOrderFor(const JobEntry& entry, const AttemptRecord& attempt,
                                           const RankSlot& slot, const std::string* secret) const {
  StartWorkerOrder order;
  order.job_id = entry.job.id;
  order.attempt_id = attempt.attempt_id;
  order.rank = slot.rank;
  order.local_rank = slot.local_rank;
  order.slot = slot.slot;
  order.gpu = attempt.kind == DeviceKind::kGpu;
  order.coordinator_address = coordinator_address_;
  order.env["TRAINYARD_JOB_NAME"] = entry.job.name;
  if (secret != nullptr) {
    order.attempt_secret = *secret;
  } else if (options_.attempt_secret) {
    order.attempt_secret = options_.attempt_secret(entry.job.id, attempt.attempt_id);
  }
  std::tie(order.memory_peer_address, order.memory_tier_addresses) =
      MemoryPeersOf(attempt, slot.node_id);
  return order;
}

std::pair<std::string, std::vector<std::string>> Supervisor::MemoryPeersOf(
    const AttemptRecord& attempt, const std::string& node_id) const {
  // Peer copies of the memory tier go round the attempt's nodes: each node's snapshots to the
  // next one, so that a lost node's are on a survivor.
  std::vector<std::string> nodes;
  for (const RankSlot& r : attempt.ranks) {
    if (std::find(nodes.begin(), nodes.end(), r.node_id) == nodes.end()) nodes.push_back(r.node_id);
  }
  const auto at = std::find(nodes.begin(), nodes.end(), node_id);
  if (nodes.size() < 2 || at == nodes.end()) return {};
  std::string peer = registry_->MemoryTierAddress(nodes[(at - nodes.begin() + 1) % nodes.size()]);
  // From three nodes up no node holds a whole snapshot: a restore fetches what its node lacks.
  std::vector<std::string> tiers;
  for (const std::string& node : nodes) {
    std::string address = registry_->MemoryTierAddress(node);
    if (!address.empty()) tiers.push_back(std::move(address));
  }
  return {std::move(peer), std::move(tiers)};
}

void Supervisor::StartAttemptLocked(Txn& txn, JobEntry& entry, std::vector<RankSlot> ranks,
                                    const std::optional<JobShape>& shape) {
  JobRecord& job = entry.job;
  const bool restart = job.state == JobState::kRestarting;
  const bool after_failure = restart && !entry.resized_by_choice;
  // The shape of the attempt before this one, if any: a change of size is an event.
  std::optional<JobShape> previous;
  if (!entry.attempts.empty()) {
    previous = ShapeOfAttempt(entry.attempts.back(), job.requirements.nodes,
                              entry.full_accumulation, entry.larger_shapes, entry.smaller_shapes);
  }
  AttemptRecord attempt;
  attempt.job_id = job.id;
  attempt.attempt_id = static_cast<int>(entry.attempts.size()) + 1;
  attempt.state = AttemptState::kStarting;
  attempt.mesh = shape ? shape->mesh : job.requirements.mesh;
  attempt.kind = job.requirements.kind;
  attempt.ranks = std::move(ranks);
  attempt.created = clock_->Now();
  for (const RankSlot& slot : attempt.ranks) {
    registry_->Hold(slot.node_id, attempt.kind, slot.slot);
  }
  job.attempts = attempt.attempt_id;
  // job.restarts counted the restart when it was granted (FailAttemptLocked), as the restart
  // budgets do; a resize (growing back) is not one.
  entry.resized_by_choice = false;
  if (shape) entry.last_resize = attempt.created;
  job.current_attempt = attempt.attempt_id;
  entry.controller.AttemptPlaced();
  entry.goodput.AttemptScheduled(attempt.created, job.last_checkpoint.step);
  entry.joined.clear();
  entry.stop_sent = absl::InfinitePast();
  entry.attempts.push_back(std::move(attempt));
  AttemptRecord& stored = entry.attempts.back();
  kv_->Open(KvSpace::PrefixFor(job.id, stored.attempt_id));
  TouchAttempt(txn, entry, stored);
  Transition(txn, entry, JobState::kStarting, "scheduled",
             absl::StrCat("attempt ", stored.attempt_id,
                          restart ? absl::StrCat(" (restart ", job.restarts, " of ",
                                                 job.requirements.max_restarts, ")")
                                  : std::string(),
                          " placed on ", DescribePlacement(stored.ranks)));
  const FailureSummary& failure = entry.controller.last_failure();
  const std::string lost =
      after_failure && failure.failure_class == FailureClassName(FailureClass::kNodeLost)
          ? absl::StrCat(failure.node_id, " lost")
          : "";
  if (shape) {
    const bool larger = shape->nodes > job.requirements.nodes;
    const std::string why =
        larger ? absl::StrCat("max_nodes ", entry.max_nodes, "; the nodes were free")
               : absl::StrCat("min_nodes ", entry.min_nodes);
    AddEvent(
        txn, entry, stored.attempt_id, job.state, job.state, "resized",
        absl::StrCat("attempt ", stored.attempt_id, " runs on ", shape->nodes,
                     larger ? " nodes, above the " : " of ", job.requirements.nodes,
                     larger ? " asked for" : " nodes", ": ",
                     MeshChange(job.requirements.mesh, entry.full_accumulation, shape->mesh,
                                shape->accumulation),
                     " (the global batch is kept; ", lost.empty() ? "" : lost + "; ", why, ")"));
  } else if (previous && previous->nodes != job.requirements.nodes) {
    // Back at the size asked for, after an attempt at another.
    AddEvent(txn, entry, stored.attempt_id, job.state, job.state, "resized",
             absl::StrCat("attempt ", stored.attempt_id, " runs on the ", job.requirements.nodes,
                          " nodes asked for again, after ", previous->nodes, " in attempt ",
                          stored.attempt_id - 1, ": ",
                          MeshChange(previous->mesh, previous->accumulation, job.requirements.mesh,
                                     entry.full_accumulation),
                          " (the global batch is kept", lost.empty() ? "" : "; " + lost, ")"));
  }
  const std::string secret =
      options_.attempt_secret ? options_.attempt_secret(job.id, stored.attempt_id) : "";
  for (const RankSlot& slot : stored.ranks) {
    txn.orders.emplace_back(slot.node_id, StartOrderFor(entry, stored, slot, &secret));
  }
}

void Supervisor::MarkRunningLocked(Txn& txn, JobEntry& entry, AttemptRecord& attempt) {
  attempt.state = AttemptState::kRunning;
  attempt.running = clock_->Now();
  WatchAttemptLocked(entry, attempt, attempt.running);
  TouchAttempt(txn, entry, attempt);
  if (entry.job.state == JobState::kStarting) {
    Transition(txn, entry, JobState::kRunning, "running",
               absl::StrCat("all ", attempt.ranks.size(), " ranks of attempt ", attempt.attempt_id,
                            " joined"));
  }
  for (JoinWaiter& waiter : entry.join_waiters) {
    JoinInfo info = JoinInfoFor(entry, attempt, waiter.rank);
    txn.after.push_back([done = std::move(waiter.done), info = std::move(info)]() mutable {
      done(std::move(info));
    });
  }
  entry.join_waiters.clear();
}

void Supervisor::FailJoinWaitersLocked(Txn& txn, JobEntry& entry, const absl::Status& status) {
  for (JoinWaiter& waiter : entry.join_waiters) {
    txn.after.push_back([done = std::move(waiter.done), status] { done(status); });
  }
  entry.join_waiters.clear();
}

void Supervisor::HandleExitLocked(Txn& txn, const std::string& node_id, const WorkerExit& exit,
                                  const std::string& failure_kind) {
  JobEntry* entry = FindJob(exit.job_id);
  AttemptRecord* attempt = entry != nullptr ? FindAttempt(*entry, exit.attempt_id) : nullptr;
  if (attempt == nullptr || exit.rank < 0 || exit.rank >= static_cast<int>(attempt->ranks.size())) {
    TY_LOG(WARNING) << "node " << node_id << " reported an exit of unknown worker " << exit.job_id
                    << "/" << exit.attempt_id << "/" << exit.rank;
    return;
  }
  RankSlot& slot = attempt->ranks[exit.rank];
  if (slot.node_id != node_id || slot.exit.has_value()) return;  // stray or duplicate
  slot.exit = exit.exit;
  if (slot.exit->exited == absl::InfinitePast()) slot.exit->exited = clock_->Now();
  if (slot.exit->pid == 0) slot.exit->pid = slot.pid;
  registry_->Release(slot.node_id, attempt->kind, slot.slot);
  TouchAttempt(txn, *entry, *attempt);
  if (IsFinal(attempt->state)) return;
  if (!slot.exit->Succeeded() && attempt->state != AttemptState::kStopping) {
    if (entry->detector != nullptr && entry->detector->gathering()) {
      // A witness of a hang being judged (it noticed, or its peer left): the verdict decides.
      entry->detector->RankExited(exit.rank);
      CheckHangLocked(txn, *entry, clock_->Now());
    } else {
      const FailureSignal signal{.exit_code = slot.exit->exit_code,
                                 .signal = slot.exit->signal,
                                 .node_lost = failure_kind == "node_lost",
                                 .hang_detected = false,
                                 .message = slot.exit->message};
      const FailureClass failure_class = Classify(signal);
      FailAttemptLocked(txn, *entry, *attempt,
                        AttemptFailure{.failure_class = failure_class,
                                       .cause = DescribeExit(slot, *slot.exit, failure_class),
                                       .rank = exit.rank,
                                       .fault = slot.exit->exited});
    }
  }
  // (While a hang is judged, the last exit completes the gathering: the verdict came above.)
  if (AllRanksExited(*attempt)) FinishAttemptLocked(txn, *entry, *attempt);
}

void Supervisor::StopRemainingLocked(Txn& txn, JobEntry& entry, AttemptRecord& attempt,
                                     const std::string& reason) {
  std::map<std::string, std::vector<int>> by_node;
  for (const RankSlot& slot : attempt.ranks) {
    if (!slot.exit.has_value()) by_node[slot.node_id].push_back(slot.rank);
  }
  for (auto& [node_id, ranks] : by_node) {
    StopWorkersOrder order;
    order.job_id = entry.job.id;
    order.attempt_id = attempt.attempt_id;
    order.ranks = std::move(ranks);
    // A hung rank will not drain, and a stopped one does not even see SIGTERM: no grace.
    order.grace = attempt.failure_class == FailureClassName(FailureClass::kHang)
                      ? absl::ZeroDuration()
                      : options_.stop_grace;
    order.reason = reason;
    txn.orders.emplace_back(node_id, std::move(order));
  }
  entry.stop_sent = clock_->Now();
}

void Supervisor::FinishAttemptLocked(Txn& txn, JobEntry& entry, AttemptRecord& attempt) {
  JobRecord& job = entry.job;
  const std::string prefix = KvSpace::PrefixFor(job.id, attempt.attempt_id);
  // Closed now, under the supervisor's lock, so that no one sees the attempt ended while its
  // space still takes writes; its waiters are answered after the lock is released.
  txn.after.push_back(kv_->CloseDeferred(prefix));
  FailJoinWaitersLocked(txn, entry, absl::FailedPreconditionError("the attempt has ended"));
  attempt.finished = clock_->Now();
  TouchAttempt(txn, entry, attempt);
  if (job.cancel_requested) {
    attempt.state = AttemptState::kCancelled;
    if (attempt.cause.empty()) attempt.cause = job.message;
    Transition(
        txn, entry, JobState::kCancelled, "cancelled",
        absl::StrCat(job.message, "; every worker of attempt ", attempt.attempt_id, " is gone"));
    return;
  }
  if (attempt.state != AttemptState::kStopping) {
    attempt.state = AttemptState::kSucceeded;
    attempt.cause = absl::StrCat("all ", attempt.ranks.size(), " ranks exited with code 0");
    if (job.drain_requested) {
      absl::StrAppend(&attempt.cause, " after the drain");
      FinishDrainLocked(txn, entry, attempt.cause);
      return;
    }
    if (entry.resizing && job.progress.step < job.progress.total_steps) {
      FinishResizeLocked(txn, entry, attempt);
      return;
    }
    Transition(txn, entry, JobState::kSucceeded, "succeeded", attempt.cause);
    return;
  }
  attempt.state = AttemptState::kFailed;
  if (job.state == JobState::kRestarting && job.drain_requested) {
    // It failed before the drain was asked for; the restart it was waiting for will not come.
    FinishDrainLocked(
        txn, entry,
        absl::StrCat("every worker of the failed attempt ", attempt.attempt_id, " is gone"));
    return;
  }
  if (job.state == JobState::kRestarting) {
    const absl::Time now = clock_->Now();
    if (entry.controller.HoldForBackoff(now)) {  // Tick enqueues it when the backoff ends
      AddEvent(txn, entry, attempt.attempt_id, job.state, job.state, "requeued",
               absl::StrCat("every worker of attempt ", attempt.attempt_id,
                            " is gone; restarting after a backoff of ",
                            absl::FormatDuration(absl::Trunc(entry.controller.restart_at() - now,
                                                             absl::Milliseconds(100)))));
      return;
    }
    AddEvent(txn, entry, attempt.attempt_id, job.state, job.state, "requeued",
             absl::StrCat("every worker of attempt ", attempt.attempt_id,
                          " is gone; waiting for slots"));
    EnqueueLocked(entry);  // placed by the caller's next ScheduleLocked
    return;
  }
  job.message = attempt.cause;
  Transition(txn, entry, JobState::kFailed, "failed",
             absl::StrCat(attempt.cause, "; after ", job.attempts, " attempt(s)"));
}

void Supervisor::NodeLostLocked(Txn& txn, JobEntry& entry, const std::string& node_id,
                                absl::Duration age) {
  AttemptRecord* attempt = LiveAttempt(entry);
  if (attempt == nullptr) return;
  TY_LOG(WARNING) << "job " << entry.job.id << ": node " << node_id << " lost (silent for "
                  << absl::FormatDuration(age) << ")";
  const int attempt_id = attempt->attempt_id;
  for (int rank = 0; rank < static_cast<int>(attempt->ranks.size()); ++rank) {
    attempt = FindAttempt(entry, attempt_id);
    if (IsFinal(attempt->state)) break;
    const RankSlot& slot = attempt->ranks[rank];
    if (slot.node_id != node_id || slot.exit.has_value()) continue;
    WorkerExit exit;
    exit.job_id = entry.job.id;
    exit.attempt_id = attempt_id;
    exit.rank = rank;
    exit.exit.exit_code = -1;
    exit.exit.pid = slot.pid;
    exit.exit.exited = clock_->Now() - age;  // the fault: its last sign of life
    exit.exit.message = absl::StrCat("node lost (no heartbeat for ",
                                     absl::FormatDuration(absl::Trunc(age, absl::Seconds(1))), ")");
    HandleExitLocked(txn, node_id, exit, "node_lost");
  }
}

}  // namespace trainyard::server
