// Supervisor: the agent side — registration and reconciliation, heartbeats, worker start and
// exit reports.
#include <map>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status.h"
#include "server/supervisor.h"

namespace trainyard::server {
namespace {

std::string WorkerKey(const std::string& node_id, const RunningWorker& worker) {
  return absl::StrCat(node_id, "/", worker.job_id, "/", worker.attempt_id, "/", worker.rank);
}

absl::Status ValidateNode(const NodeRecord& node) {
  if (node.node_id.empty()) return absl::InvalidArgumentError("registration: empty node_id");
  if (node.node_id.size() > 253) {
    return absl::InvalidArgumentError("registration: node_id longer than 253 characters");
  }
  for (char c : node.node_id) {
    if (c == '/' || c == '\n' || c == '\0') {
      return absl::InvalidArgumentError(
          absl::StrCat("registration: node_id '", node.node_id, "' contains '/' or a control"));
    }
  }
  if (node.cpu_slots < 1 && node.gpus.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("registration: node ", node.node_id, " offers no CPU slots and no GPUs"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<uint64_t> Supervisor::AgentConnected(
    const NodeRecord& node_in, const std::vector<RunningWorker>& running,
    const std::vector<WorkerExit>& exited_while_disconnected, std::shared_ptr<AgentChannel> channel,
    const std::function<void(const RegisteredOrder&)>& on_registered) {
  TY_RETURN_IF_ERROR(ValidateNode(node_in));
  Txn txn;
  uint64_t session = 0;
  {
    absl::MutexLock lock(&mu_);
    if (shutting_down_) return absl::UnavailableError("the coordinator is shutting down");
    // Until the coordinator knows the address its workers reach it at (its port is chosen when
    // its server starts), it could only order workers started with an empty one: the agent
    // retries in a moment.
    if (coordinator_address_.empty()) {
      return absl::UnavailableError("the coordinator is starting; connect again");
    }
    TY_RETURN_IF_ERROR(registry_->CheckNodeIdFree(node_in));
    NodeRecord& node = nodes_[node_in.node_id];
    const absl::Time registered = node.registered;
    node = node_in;
    node.registered = registered == absl::InfinitePast() ? clock_->Now() : registered;
    node.last_seen = clock_->Now();
    txn.batch.nodes.push_back(&node);
    session = registry_->Connect(node, std::move(channel));
    on_registered(RegisteredOrder{node.node_id, options_.heartbeat_interval,
                                  registry_->heartbeat_timeout(),
                                  AdoptedAttemptsLocked(node.node_id, running)});
    TY_LOG(INFO) << "agent " << node.node_id << " connected (" << node.cpu_slots << " CPU slots, "
                 << node.gpus.size() << " GPUs, " << running.size() << " running workers)";
    for (const WorkerExit& exit : exited_while_disconnected) {
      HandleExitLocked(txn, node.node_id, exit, "rank_failed");
    }
    ReconcileLocked(txn, node.node_id, running, /*on_connect=*/true);
    ScheduleLocked(txn);
    CommitLocked(txn).IgnoreError();
  }
  RunAfter(txn);
  return session;
}

std::vector<RegisteredOrder::Adopted> Supervisor::AdoptedAttemptsLocked(
    const std::string& node_id, const std::vector<RunningWorker>& running) {
  std::vector<RegisteredOrder::Adopted> adopted;
  std::set<std::pair<std::string, int>> seen;
  for (const RunningWorker& worker : running) {
    if (!seen.insert({worker.job_id, worker.attempt_id}).second) continue;
    JobEntry* entry = FindJob(worker.job_id);
    if (entry == nullptr) continue;
    const AttemptRecord* attempt = LiveAttempt(*entry);
    if (attempt == nullptr || attempt->attempt_id != worker.attempt_id) continue;
    RegisteredOrder::Adopted& a = adopted.emplace_back();
    a.job_id = worker.job_id;
    a.attempt_id = worker.attempt_id;
    if (options_.attempt_secret) a.secret = options_.attempt_secret(a.job_id, a.attempt_id);
    std::tie(a.memory_peer_address, a.memory_tier_addresses) = MemoryPeersOf(*attempt, node_id);
  }
  return adopted;
}

void Supervisor::AgentDisconnected(const std::string& node_id, uint64_t session) {
  if (registry_->Disconnect(node_id, session)) {
    TY_LOG(INFO) << "agent " << node_id << " disconnected";
  }
}

absl::Status Supervisor::Heartbeat(const std::string& node_id, uint64_t session,
                                   const std::vector<RunningWorker>& running) {
  if (!registry_->Touch(node_id, session)) {
    return absl::FailedPreconditionError(
        absl::StrCat("session of node ", node_id, " was replaced or lost; reconnect"));
  }
  Txn txn;
  {
    absl::MutexLock lock(&mu_);
    ReconcileLocked(txn, node_id, running, /*on_connect=*/false);
    CommitLocked(txn).IgnoreError();
  }
  RunAfter(txn);
  return absl::OkStatus();
}

absl::Status Supervisor::TierNotice(const std::string& node_id, uint64_t session,
                                    const std::string& job_id, const std::string& message) {
  if (!registry_->Touch(node_id, session)) {
    return absl::FailedPreconditionError(
        absl::StrCat("session of node ", node_id, " was replaced or lost; reconnect"));
  }
  Txn txn;
  {
    absl::MutexLock lock(&mu_);
    JobEntry* entry = FindJob(job_id);
    if (entry == nullptr || IsFinal(entry->job.state)) return absl::OkStatus();
    AddEvent(txn, *entry, entry->job.current_attempt, entry->job.state, entry->job.state,
             "memory_tier", message);
    CommitLocked(txn).IgnoreError();
  }
  RunAfter(txn);
  return absl::OkStatus();
}

absl::Status Supervisor::WorkerStarted(const std::string& node_id, uint64_t session,
                                       const RunningWorker& worker) {
  if (!registry_->Touch(node_id, session)) {
    return absl::FailedPreconditionError(
        absl::StrCat("session of node ", node_id, " was replaced or lost; reconnect"));
  }
  Txn txn;
  {
    absl::MutexLock lock(&mu_);
    ReconcileLocked(txn, node_id, {worker}, /*on_connect=*/false);
    CommitLocked(txn).IgnoreError();
  }
  RunAfter(txn);
  return absl::OkStatus();
}

absl::Status Supervisor::WorkerExited(const std::string& node_id, uint64_t session,
                                      const WorkerExit& exit) {
  if (!registry_->Touch(node_id, session)) {
    return absl::FailedPreconditionError(
        absl::StrCat("session of node ", node_id, " was replaced or lost; reconnect"));
  }
  Txn txn;
  {
    absl::MutexLock lock(&mu_);
    HandleExitLocked(txn, node_id, exit, "rank_failed");
    ScheduleLocked(txn);  // the exit freed a slot
    CommitLocked(txn).IgnoreError();
  }
  RunAfter(txn);
  return absl::OkStatus();
}

void Supervisor::StopStrayLocked(Txn& txn, const std::string& node_id, const RunningWorker& worker,
                                 const std::string& reason) {
  const absl::Time now = clock_->Now();
  absl::Time& last = stray_stops_[WorkerKey(node_id, worker)];
  if (now - last < options_.stop_grace) return;
  last = now;
  TY_LOG(WARNING) << "stopping stray worker " << worker.job_id << "/" << worker.attempt_id
                  << "/rank " << worker.rank << " (pid " << worker.pid << ") on " << node_id << ": "
                  << reason;
  StopWorkersOrder order;
  order.job_id = worker.job_id;
  order.attempt_id = worker.attempt_id;
  order.ranks = {worker.rank};
  order.grace = options_.stop_grace;
  order.reason = reason;
  txn.orders.emplace_back(node_id, std::move(order));
}

void Supervisor::ReconcileLocked(Txn& txn, const std::string& node_id,
                                 const std::vector<RunningWorker>& running, bool on_connect) {
  std::set<std::pair<JobEntry*, int>> seen;  // (job, rank) of the live attempt
  std::map<JobEntry*, int> adopted;
  for (const RunningWorker& worker : running) {
    JobEntry* entry = FindJob(worker.job_id);
    AttemptRecord* attempt = entry != nullptr ? LiveAttempt(*entry) : nullptr;
    const bool owned = attempt != nullptr && attempt->attempt_id == worker.attempt_id &&
                       worker.rank >= 0 && worker.rank < static_cast<int>(attempt->ranks.size()) &&
                       attempt->ranks[worker.rank].node_id == node_id &&
                       !attempt->ranks[worker.rank].exit.has_value();
    if (!owned) {
      StopStrayLocked(txn, node_id, worker, "the worker belongs to no live attempt");
      continue;
    }
    if (on_connect) seen.insert({entry, worker.rank});  // read only on connect
    RankSlot& slot = attempt->ranks[worker.rank];
    if (worker.pid != 0 && slot.pid != worker.pid) {
      slot.pid = worker.pid;  // soft state: stored by the next flush (agents re-report it)
      entry->attempt_dirty = true;
    }
    if (on_connect) ++adopted[entry];
    if (attempt->state == AttemptState::kStopping &&
        clock_->Now() - entry->stop_sent >= options_.stop_grace) {
      StopStrayLocked(txn, node_id, worker, attempt->cause);  // the stop order may have been lost
    }
  }
  if (!on_connect) return;
  for (auto& [entry, count] : adopted) {
    AddEvent(txn, *entry, entry->job.current_attempt, entry->job.state, entry->job.state, "adopted",
             absl::StrCat("node ", node_id, " reconnected with ", count,
                          " running worker(s) of attempt ", entry->job.current_attempt));
  }
  // Ranks placed here that the agent does not run: never started (the order was lost: send it
  // again) or gone while nobody was listening (a lost worker, handled as a failure).
  std::vector<JobEntry*> live;  // HandleExitLocked may end a job (and leave live_jobs_)
  for (const auto& [id, entry] : live_jobs_) live.push_back(entry);
  for (JobEntry* live_entry : live) {
    JobEntry& entry = *live_entry;
    const std::string& id = entry.job.id;
    AttemptRecord* attempt = LiveAttempt(entry);
    if (attempt == nullptr) continue;
    const int attempt_id = attempt->attempt_id;
    for (int rank = 0; rank < static_cast<int>(attempt->ranks.size()); ++rank) {
      attempt = FindAttempt(entry, attempt_id);
      if (IsFinal(attempt->state)) break;
      const RankSlot& slot = attempt->ranks[rank];
      if (slot.node_id != node_id || slot.exit.has_value() || seen.count({&entry, rank}) > 0) {
        continue;
      }
      if (slot.pid == 0 && attempt->state == AttemptState::kStarting) {
        txn.orders.emplace_back(node_id, StartOrderFor(entry, *attempt, slot));
        continue;
      }
      WorkerExit exit;
      exit.job_id = id;
      exit.attempt_id = attempt_id;
      exit.rank = rank;
      exit.exit.exit_code = -1;
      exit.exit.pid = slot.pid;
      exit.exit.message = slot.pid == 0 ? "never started (its node reconnected without it)"
                                        : "not running when its node reconnected";
      HandleExitLocked(txn, node_id, exit, "rank_failed");
    }
  }
}

}  // namespace trainyard::server
