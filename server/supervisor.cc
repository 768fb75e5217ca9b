// Supervisor: construction, restore, the user-facing calls, and the transaction helpers. The
// agent side is in supervisor_agents.cc, the worker side in supervisor_workers.cc, the attempt
// state machine in supervisor_attempts.cc.
#include "server/supervisor.h"

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/filesystem.h"
#include "common/logging.h"
#include "common/status.h"
#include "planner/planner.h"
#include "server/mesh_advisor.h"
#include "server/requirements.h"
#include "worker/convert/init_from.h"
#include "worker/data/sample_text.h"

namespace trainyard::server {

Supervisor::Supervisor(StateStore* store, AgentRegistry* registry, KvSpace* kv, Clock* clock,
                       SupervisorOptions options)
    : store_(store),
      registry_(registry),
      kv_(kv),
      clock_(clock),
      options_(std::move(options)),
      cpu_profile_(options_.cpu_profile ? *options_.cpu_profile : CoordinatorCpuProfile()),
      quarantine_(options_.quarantine),
      jitter_draw_(options_.jitter_draw
                       ? options_.jitter_draw
                       : [draws = JitterDraws(static_cast<uint64_t>(absl::ToUnixNanos(
                              clock->Now())))]() mutable { return draws.Next(); }),
      outbox_(
          store,
          CommitQueue::Hooks{
              .stored =
                  [this](QueuedCommit& commit) ABSL_NO_THREAD_SAFETY_ANALYSIS {
                    ApplyStoredLocked(commit);  // under mu_: the queue calls it holding it
                    SendOrdersLocked(commit.orders);
                  },
              .notify = [this](const std::set<std::string>& job_ids,
                               const std::vector<EventRecord>& events)
                            ABSL_NO_THREAD_SAFETY_ANALYSIS { NotifyStoredLocked(job_ids, events); },
              .held_back = [this](QueuedCommit& commit, const absl::Status& status)
                               ABSL_NO_THREAD_SAFETY_ANALYSIS { HoldBackLocked(commit, status); },
          }),
      coordinator_address_(options_.coordinator_address) {}

void Supervisor::SetCoordinatorAddress(const std::string& address) {
  absl::MutexLock lock(&mu_);
  coordinator_address_ = address;
}

absl::StatusOr<std::unique_ptr<Supervisor>> Supervisor::Create(StateStore* store,
                                                               AgentRegistry* registry, KvSpace* kv,
                                                               Clock* clock,
                                                               SupervisorOptions options) {
  std::unique_ptr<Supervisor> supervisor(
      new Supervisor(store, registry, kv, clock, std::move(options)));
  TY_RETURN_IF_ERROR_WITH(supervisor->Restore(), "restoring the coordinator's state");
  return supervisor;
}

absl::Status Supervisor::Restore() {
  TY_ASSIGN_OR_RETURN(StoredState state, store_->Load());
  absl::MutexLock lock(&mu_);
  max_seq_ = state.max_job_seq;
  for (NodeRecord& node : state.nodes) {
    registry_->AddKnownNode(node);
    nodes_[node.node_id] = std::move(node);
  }
  for (JobRecord& job : state.jobs) {
    const std::string id = job.id;
    if (!job.client_request_id.empty()) {
      by_request_id_[RequestKey(job.user, job.client_request_id)] = id;
    }
    JobEntry& entry = jobs_[id];
    job_index_[id] = &entry;
    entry.job = std::move(job);
  }
  for (AttemptRecord& attempt : state.attempts) {
    JobEntry* entry = FindJob(attempt.job_id);
    if (entry == nullptr) {
      return absl::InternalError(
          absl::StrCat("attempt ", attempt.attempt_id, " of unknown job ", attempt.job_id));
    }
    entry->attempts.push_back(std::move(attempt));
  }
  RestoreCheckpointsLocked(std::move(state.checkpoints));
  for (const Cordon& cordon : state.cordons) quarantine_.Restore(cordon);
  for (auto& [id, entry] : jobs_) {
    entry.stored = entry.job;
    entry.stored.accounts.clear();  // never shown
    entry.stored_attempts = entry.attempts;
  }
  for (auto& [id, entry] : jobs_) {
    if (IsFinal(entry.job.state)) continue;
    live_jobs_.emplace(id, &entry);
    LoadPoliciesLocked(entry);
    const bool accounts_restored = RestoreAccountsLocked(entry);
    AttemptRecord* attempt = LiveAttempt(entry);
    if (attempt == nullptr) {
      // QUEUED, or RESTARTING after its failed attempt was torn down.
      EnqueueLocked(entry);
      continue;
    }
    for (const RankSlot& slot : attempt->ranks) {
      if (!slot.exit.has_value()) registry_->Hold(slot.node_id, attempt->kind, slot.slot);
    }
    kv_->Open(KvSpace::PrefixFor(id, attempt->attempt_id));
    if (attempt->state == AttemptState::kStopping) entry.stop_sent = clock_->Now();
    if (attempt->state == AttemptState::kRunning) {
      // Watched again from now: its ranks report on, or the progress check finds them hung.
      // The stored goodput account has the attempt already (an older record, none: counted
      // from its start); Young–Daly exposure counts on from the restore.
      if (!accounts_restored) {
        entry.goodput.AttemptScheduled(attempt->created, entry.job.last_checkpoint.step);
      }
      WatchAttemptLocked(entry, *attempt, clock_->Now());
    }
  }
  TY_LOG(INFO) << "coordinator state restored: " << jobs_.size() << " jobs (" << live_jobs_.size()
               << " live), " << nodes_.size() << " known nodes";
  return absl::OkStatus();
}

Supervisor::JobEntry* Supervisor::FindJob(const std::string& job_id) {
  auto it = job_index_.find(job_id);
  return it == job_index_.end() ? nullptr : it->second;
}

AttemptRecord* Supervisor::FindAttempt(JobEntry& entry, int attempt_id) {
  if (attempt_id < 1 || attempt_id > static_cast<int>(entry.attempts.size())) return nullptr;
  AttemptRecord& attempt = entry.attempts[attempt_id - 1];
  return attempt.attempt_id == attempt_id ? &attempt : nullptr;
}

AttemptRecord* Supervisor::CurrentAttempt(JobEntry& entry) {
  return FindAttempt(entry, entry.job.current_attempt);
}

AttemptRecord* Supervisor::LiveAttempt(JobEntry& entry) {
  AttemptRecord* attempt = CurrentAttempt(entry);
  return attempt != nullptr && !IsFinal(attempt->state) ? attempt : nullptr;
}

void Supervisor::TouchJob(Txn& txn, JobEntry& entry) {
  if (txn.touched.insert(&entry).second) txn.batch.updated_jobs.push_back(&entry.job);
}

void Supervisor::TouchAttempt(Txn& txn, JobEntry& entry, AttemptRecord& attempt) {
  if (std::find(txn.batch.attempts.begin(), txn.batch.attempts.end(), &attempt) ==
      txn.batch.attempts.end()) {
    txn.batch.attempts.push_back(&attempt);
  }
  TouchJob(txn, entry);
}

void Supervisor::AddEvent(Txn& txn, JobEntry& entry, int attempt_id, JobState from, JobState to,
                          std::string kind, std::string cause) {
  EventRecord event;
  event.job_id = entry.job.id;
  event.attempt_id = attempt_id;
  event.time = clock_->Now();
  event.from = from;
  event.to = to;
  event.kind = std::move(kind);
  event.cause = std::move(cause);
  TY_LOG(INFO) << "job " << event.job_id << ": " << event.kind << " (" << JobStateName(from)
               << " -> " << JobStateName(to) << "): " << event.cause;
  txn.batch.events.push_back(std::move(event));
  TouchJob(txn, entry);
}

void Supervisor::Transition(Txn& txn, JobEntry& entry, JobState to, std::string kind,
                            std::string cause) {
  JobRecord& job = entry.job;
  const JobState from = job.state;
  job.state = to;
  const absl::Time now = clock_->Now();
  if (to == JobState::kStarting && job.started == absl::InfinitePast()) job.started = now;
  if (IsFinal(to)) {
    job.finished = now;
    entry.goodput.Finished(now);
    entry.detector.reset();
    entry.stragglers.reset();
    job.progress.eta.reset();  // nothing left to estimate
    live_jobs_.erase(job.id);
    scheduler_.Remove(job.id);
    // Every node that ran the job may hold its snapshots in memory (its own or a peer's).
    std::set<std::string> nodes;
    for (const AttemptRecord& attempt : entry.attempts) {
      for (const RankSlot& slot : attempt.ranks) nodes.insert(slot.node_id);
    }
    for (const std::string& node : nodes) {
      txn.orders.emplace_back(node, ReleaseMemoryOrder{job.id});
    }
  }
  AddEvent(txn, entry, job.current_attempt, from, to, std::move(kind), std::move(cause));
}

absl::Status Supervisor::CommitLocked(Txn& txn) {
  for (JobEntry* entry : txn.touched) {
    entry->progress_dirty = false;
    entry->progress_flushed = clock_->Now();
    if (AttemptRecord* current = CurrentAttempt(*entry);
        current != nullptr && std::find(txn.batch.attempts.begin(), txn.batch.attempts.end(),
                                        current) != txn.batch.attempts.end()) {
      entry->attempt_dirty = false;
    }
  }
  if (txn.batch.empty() && txn.orders.empty()) return absl::OkStatus();
  if (txn.batch.empty() && outbox_.empty()) {
    // Nothing to store and nothing stored ahead of them: the orders go out now.
    SendOrdersLocked(txn.orders);
    return absl::OkStatus();
  }
  return outbox_.AwaitStored(mu_, EnqueueCommitLocked(txn, /*submission=*/false));
}

uint64_t Supervisor::EnqueueCommitLocked(Txn& txn, bool submission) {
  QueuedCommit commit;
  commit.submission = submission;
  for (const JobRecord* job : txn.batch.new_jobs) commit.new_jobs.push_back(*job);
  for (const JobRecord* job : txn.batch.updated_jobs) {
    commit.updated_jobs.push_back(*job);
    if (const JobEntry* entry = FindJob(job->id)) {
      commit.updated_jobs.back().accounts = EncodeAccountsLocked(*entry);
    }
  }
  for (const AttemptRecord* attempt : txn.batch.attempts) commit.attempts.push_back(*attempt);
  for (const NodeRecord* node : txn.batch.nodes) commit.nodes.push_back(*node);
  commit.events = std::move(txn.batch.events);
  commit.checkpoints = std::move(txn.batch.checkpoints);
  commit.cordons = std::move(txn.batch.cordons);
  commit.orders = std::move(txn.orders);
  txn.orders.clear();
  for (const JobEntry* entry : txn.touched) commit.touched.push_back(entry->job.id);
  for (const JobRecord& job : commit.new_jobs) commit.touched.push_back(job.id);
  txn.batch = StoreBatch();
  return outbox_.Enqueue(mu_, std::move(commit));
}

void Supervisor::ApplyStoredLocked(QueuedCommit& commit) {
  // A submission's entry does not exist yet: Submit gives it its stored record.
  for (std::vector<JobRecord>* jobs : {&commit.new_jobs, &commit.updated_jobs}) {
    for (JobRecord& job : *jobs) {
      if (JobEntry* entry = FindJob(job.id)) {
        entry->stored = std::move(job);
        entry->stored.accounts.clear();  // never shown
      }
    }
  }
  for (AttemptRecord& attempt : commit.attempts) {
    JobEntry* entry = FindJob(attempt.job_id);
    if (entry == nullptr) continue;
    std::deque<AttemptRecord>& stored = entry->stored_attempts;
    auto it = std::find_if(stored.begin(), stored.end(), [&](const AttemptRecord& a) {
      return a.attempt_id == attempt.attempt_id;
    });
    if (it == stored.end()) {
      stored.push_back(std::move(attempt));
    } else {
      *it = std::move(attempt);
    }
  }
}

void Supervisor::ApplyStoredSoftStateLocked(const SoftStateBatch& soft) {
  std::set<JobEntry*> changed;
  for (const auto& [job_id, progress] : soft.progress) {
    JobEntry* entry = FindJob(job_id);
    // A commit may have stored newer progress (with the job's row) since this was collected.
    if (entry == nullptr || entry->stored.progress.reported > progress.reported) continue;
    entry->stored.progress = progress;
    changed.insert(entry);
  }
  for (const SoftStateBatch::Pid& pid : soft.pids) {
    JobEntry* entry = FindJob(pid.job_id);
    if (entry == nullptr) continue;
    for (AttemptRecord& attempt : entry->stored_attempts) {
      if (attempt.attempt_id == pid.attempt_id && pid.rank >= 0 &&
          pid.rank < static_cast<int>(attempt.ranks.size())) {
        attempt.ranks[pid.rank].pid = pid.pid;
      }
    }
  }
  const absl::Time now = clock_->Now();
  for (JobEntry* entry : changed) {
    if (entry->watchers.empty()) continue;
    const JobRecord view = StoredViewLocked(*entry, now);
    for (auto& [id, watcher] : entry->watchers) watcher->OnUpdate(view, nullptr);
  }
}

JobRecord Supervisor::StoredViewLocked(JobEntry& entry, absl::Time now, bool with_spec) {
  RefreshHealthLocked(entry, now);
  JobRecord view;
  if (with_spec) {
    view = entry.stored;
  } else {  // without copying the spec (up to 1 MiB) only to drop it
    std::string spec = std::move(entry.stored.spec_yaml);
    view = entry.stored;
    entry.stored.spec_yaml = std::move(spec);
  }
  view.health = entry.job.health;
  FillWaitingLocked(view, now);
  if (!outbox_.storage_error().ok() && outbox_.HoldsBackChangeOf(entry.job.id)) {
    view.waiting = absl::StrCat(
        "the coordinator cannot store this job's latest changes (",
        outbox_.storage_error().message(),
        "); shown is what is stored, and its workers hear of the changes once they are stored");
  }
  return view;
}

void Supervisor::SendOrdersLocked(std::vector<std::pair<std::string, AgentOrder>>& orders) {
  // Each run of orders to one node goes together (an attempt's start orders: one message).
  for (size_t first = 0; first < orders.size();) {
    const std::string& node_id = orders[first].first;
    std::vector<AgentOrder> run;
    size_t end = first;
    for (; end < orders.size() && orders[end].first == node_id; ++end) {
      run.push_back(std::move(orders[end].second));
    }
    if (!registry_->SendAll(node_id, std::move(run))) {
      TY_LOG(WARNING) << "node " << node_id << " is not connected; " << end - first
                      << " order(s) to it were dropped";
    }
    first = end;
  }
  orders.clear();
}

void Supervisor::HoldBackLocked(QueuedCommit& commit, const absl::Status& status) {
  // Each job this change touched says why its workers are not told yet; stored with it.
  for (const std::string& job_id :
       std::set<std::string>(commit.touched.begin(), commit.touched.end())) {
    const JobEntry* entry = FindJob(job_id);
    if (entry == nullptr) continue;
    EventRecord event;
    event.job_id = job_id;
    event.attempt_id = entry->job.current_attempt;
    event.time = clock_->Now();
    event.from = event.to = entry->job.state;
    event.kind = "storage_failed";
    event.cause = absl::StrCat("the coordinator could not store this change (", status.message(),
                               "); orders to agents wait until it is stored");
    commit.events.push_back(std::move(event));
  }
}

void Supervisor::NotifyStoredLocked(const std::set<std::string>& job_ids,
                                    const std::vector<EventRecord>& events) {
  for (const std::string& job_id : job_ids) {
    JobEntry* entry = FindJob(job_id);
    if (entry == nullptr || entry->watchers.empty()) continue;
    const JobRecord view = StoredViewLocked(*entry, clock_->Now());
    bool notified = false;
    for (const EventRecord& event : events) {
      if (event.job_id != job_id) continue;
      for (auto& [id, watcher] : entry->watchers) watcher->OnUpdate(view, &event);
      notified = true;
    }
    if (!notified) {
      for (auto& [id, watcher] : entry->watchers) watcher->OnUpdate(view, nullptr);
    }
  }
}

void Supervisor::RunAfter(Txn& txn) {
  for (auto& fn : txn.after) fn();
  txn.after.clear();
}

void Supervisor::EnqueueLocked(JobEntry& entry) {
  if (entry.job.cancel_requested || entry.job.drain_requested) return;
  PendingJob pending;
  pending.job_id = entry.job.id;
  pending.priority = entry.job.priority;
  pending.seq = entry.job.seq;
  pending.requirements = entry.job.requirements;
  pending.avoid_nodes = entry.controller.avoid_nodes();
  pending.memory_per_rank = entry.memory_per_rank;
  // Only a restart may run smaller: a new job waits for its own size. Any may run larger.
  pending.larger = entry.larger_shapes;
  if (entry.job.state == JobState::kRestarting) pending.smaller = entry.smaller_shapes;
  scheduler_.Enqueue(pending);
}

// model.init_from and training.sample_tokenizer, when this machine can see them (under the data
// roots): the weights' model against the spec's and the files' headers, the tokenizer and the
// prompt through it, before the job is queued. Elsewhere the workers check them before their
// first step.
absl::Status Supervisor::CheckFilesHere(const config::JobSpec& spec) const {
  const std::vector<std::string>& roots = options_.spec_limits.allowed_data_roots;
  std::unique_ptr<FileSystem> confined;
  if (!roots.empty()) confined = NewConfinedFileSystem(roots);
  FileSystem& fs = confined ? *confined : *RealFileSystem();
  if (!spec.init_from.empty() && fs.Exists(spec.init_from)) {
    TY_RETURN_IF_ERROR(worker::convert::CheckInitFrom(fs, spec));
  }
  const std::string& tokenizer = spec.training.sample_tokenizer;
  if (!tokenizer.empty() && fs.Exists(tokenizer)) {
    TY_RETURN_IF_ERROR(worker::data::LoadSampleText(fs, spec).status());
  }
  return absl::OkStatus();
}

absl::StatusOr<JobRecord> Supervisor::Submit(const SubmitRequest& request) {
  if (request.spec_yaml.size() > config::kMaxSpecBytes) {
    return absl::ResourceExhaustedError(absl::StrCat("spec of ", request.spec_yaml.size(),
                                                     " bytes is over the limit of ",
                                                     config::kMaxSpecBytes, " bytes"));
  }
  TY_ASSIGN_OR_RETURN(
      config::JobSpec parsed,
      config::ParseJobSpec(request.spec_yaml, request.spec_source, options_.spec_limits));
  TY_ASSIGN_OR_RETURN_WITH(const Admission admission,
                           AdmitSpec(std::move(parsed), registry_->SmallestNodes(), cpu_profile_),
                           request.spec_source);
  const config::JobSpec& spec = admission.spec;
  TY_RETURN_IF_ERROR_WITH(CheckFilesHere(spec), request.spec_source);
  TY_ASSIGN_OR_RETURN_WITH(JobRequirements requirements, RequirementsFromSpec(spec),
                           request.spec_source);
  Txn txn;
  JobRecord result;
  {
    absl::MutexLock lock(&mu_);
    // Request ids are per user: another user's retry key must neither find nor block this one.
    const std::string key = request.client_request_id.empty()
                                ? ""
                                : RequestKey(request.user, request.client_request_id);
    while (!key.empty()) {
      if (shutting_down_) return absl::UnavailableError("the coordinator is shutting down");
      if (auto it = by_request_id_.find(key); it != by_request_id_.end()) {
        return jobs_.at(it->second).stored;
      }
      // The same request is being stored by another call: its outcome answers this one too.
      if (submitting_.count(key) == 0) break;
      outbox_.WaitForStore(mu_);
    }
    if (shutting_down_) return absl::UnavailableError("the coordinator is shutting down");
    TY_RETURN_IF_ERROR(CheckQueuedLimitLocked(request.user));
    JobRecord job;
    job.seq = ++max_seq_;  // a refused submission leaves its number unused
    job.id = JobIdForSeq(job.seq);
    job.name = spec.name;
    job.spec_yaml = request.spec_yaml;
    job.state = JobState::kQueued;
    job.priority = spec.priority;
    job.requirements = requirements;
    job.user = request.user;
    job.labels = spec.labels;
    job.client_request_id = request.client_request_id;
    job.created = clock_->Now();

    // Store first: nothing exists in memory that is not on disk. The job joins the commit queue
    // like any change (concurrent submissions share one transaction) but is refused, not held
    // back, when the store fails.
    Txn stored;
    stored.batch.new_jobs.push_back(&job);
    EventRecord submitted;
    submitted.job_id = job.id;
    submitted.time = job.created;
    submitted.from = submitted.to = JobState::kQueued;
    submitted.kind = "submitted";
    submitted.cause = absl::StrCat(
        "submitted by ", job.user.empty() ? "unknown user" : job.user, ": ",
        requirements.world_size(), " ranks on ", requirements.nodes, " node(s), priority ",
        job.priority, "; mesh ", planner::MeshName(spec.parallelism),
        spec.parallelism.automatic ? " (chosen by the planner)" : "", "; ", admission.note);
    stored.batch.events.push_back(submitted);
    const uint64_t seq = EnqueueCommitLocked(stored, /*submission=*/true);
    if (!key.empty()) submitting_.insert(key);
    const absl::Status status = outbox_.AwaitStored(mu_, seq);
    if (!key.empty()) submitting_.erase(key);
    if (!status.ok()) {
      outbox_.Signal();  // a submission waiting on the same key tries again
      return Annotate(status, "storing the job");
    }
    if (!key.empty()) by_request_id_[key] = job.id;
    JobEntry& entry = jobs_[job.id];
    job_index_[job.id] = &entry;
    live_jobs_.emplace(job.id, &entry);
    entry.stored = job;
    entry.job = std::move(job);
    TY_LOG(INFO) << "job " << entry.job.id << " (" << entry.job.name << ") submitted";
    LoadPoliciesLocked(entry, &spec);
    EnqueueLocked(entry);
    ScheduleLocked(txn);
    result = entry.job;
    CommitLocked(txn).IgnoreError();
  }
  RunAfter(txn);
  return result;
}

absl::StatusOr<JobRecord> Supervisor::Cancel(const std::string& job_id, const std::string& reason,
                                             const std::string& user) {
  Txn txn;
  JobRecord result;
  {
    absl::MutexLock lock(&mu_);
    JobEntry* entry = FindJob(job_id);
    if (entry == nullptr) return absl::NotFoundError(absl::StrCat("no job ", job_id));
    JobRecord& job = entry->job;
    if (job.state == JobState::kCancelled) return job;
    if (IsFinal(job.state)) {
      return absl::FailedPreconditionError(
          absl::StrCat("job ", job_id, " already ", JobStateName(job.state)));
    }
    const std::string cause = RequestCause("cancelled", "cancelled by request", user, reason);
    AttemptRecord* attempt = LiveAttempt(*entry);
    if (!job.cancel_requested) {
      job.cancel_requested = true;
      job.message = cause;
    }
    if (attempt == nullptr) {
      scheduler_.Remove(job_id);
      Transition(txn, *entry, JobState::kCancelled, "cancelled", cause);
    } else {
      AddEvent(txn, *entry, attempt->attempt_id, job.state, job.state, "cancel_requested",
               absl::StrCat(cause, "; stopping attempt ", attempt->attempt_id));
      if (attempt->state != AttemptState::kStopping) {
        attempt->state = AttemptState::kStopping;
        attempt->cause = cause;
        TouchAttempt(txn, *entry, *attempt);
        FailJoinWaitersLocked(txn, *entry, absl::FailedPreconditionError("the job was cancelled"));
      }
      StopRemainingLocked(txn, *entry, *attempt, cause);
    }
    ScheduleLocked(txn);  // a cancelled head of the queue may have blocked others
    TY_RETURN_IF_ERROR(CommitLocked(txn));
    result = job;
  }
  RunAfter(txn);
  return result;
}

absl::StatusOr<JobView> Supervisor::GetJob(const std::string& job_id, int max_events) {
  JobView view;
  {
    absl::MutexLock lock(&mu_);
    JobEntry* entry = FindJob(job_id);
    if (entry == nullptr) return absl::NotFoundError(absl::StrCat("no job ", job_id));
    view.job = StoredViewLocked(*entry, clock_->Now());
    view.attempts.assign(entry->stored_attempts.begin(), entry->stored_attempts.end());
  }
  TY_ASSIGN_OR_RETURN(view.events, store_->ListEvents(job_id, max_events > 0 ? max_events : 50));
  return view;
}

absl::Status Supervisor::CheckQueuedLimitLocked(const std::string& user) const {
  // Only the scheduler's queue, not every job: this runs at every submission.
  int queued = 0;
  for (const std::string& job_id : scheduler_.QueueOrder()) {
    auto it = jobs_.find(job_id);
    if (it != jobs_.end() && it->second.job.user == user &&
        it->second.job.state == JobState::kQueued) {
      ++queued;
    }
  }
  if (queued < options_.max_queued_jobs_per_user) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      user.empty() ? "this user" : user, " has ", queued,
      " jobs queued, the limit per user (trainyard-server --max-queued-jobs-per-user); wait for "
      "some to start or cancel them"));
}

absl::StatusOr<std::string> Supervisor::JobOwner(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  const JobEntry* entry = FindJob(job_id);
  if (entry == nullptr) return absl::NotFoundError(absl::StrCat("no job ", job_id));
  return entry->job.user;
}

std::vector<JobRecord> Supervisor::ListJobs(const std::set<JobState>& states, int limit,
                                            const std::optional<std::string>& user) {
  absl::MutexLock lock(&mu_);
  std::vector<JobEntry*> matching;
  const absl::Time now = clock_->Now();
  for (auto& [id, entry] : jobs_) {
    if (!states.empty() && states.count(entry.stored.state) == 0) continue;
    if (user && entry.stored.user != *user) continue;
    matching.push_back(&entry);
  }
  std::sort(matching.begin(), matching.end(),
            [](const JobEntry* a, const JobEntry* b) { return a->stored.seq > b->stored.seq; });
  if (limit > 0 && static_cast<int>(matching.size()) > limit) matching.resize(limit);
  std::vector<JobRecord> out;
  out.reserve(matching.size());
  for (JobEntry* entry : matching) {
    out.push_back(StoredViewLocked(*entry, now, /*with_spec=*/false));
  }
  return out;
}

absl::StatusOr<uint64_t> Supervisor::Watch(const std::string& job_id,
                                           std::shared_ptr<JobWatcher> watcher) {
  absl::MutexLock lock(&mu_);
  if (shutting_down_) return absl::UnavailableError("the coordinator is shutting down");
  JobEntry* entry = FindJob(job_id);
  if (entry == nullptr) return absl::NotFoundError(absl::StrCat("no job ", job_id));
  const uint64_t id = next_watch_id_++;
  watcher->OnUpdate(StoredViewLocked(*entry, clock_->Now()), nullptr);
  entry->watchers[id] = std::move(watcher);
  return id;
}

void Supervisor::Unwatch(const std::string& job_id, uint64_t watch_id) {
  absl::MutexLock lock(&mu_);
  if (JobEntry* entry = FindJob(job_id)) entry->watchers.erase(watch_id);
}

absl::StatusOr<LogTargets> Supervisor::LocateLogs(const std::string& job_id, int attempt_id,
                                                  std::optional<int> rank) {
  absl::MutexLock lock(&mu_);
  JobEntry* entry = FindJob(job_id);
  if (entry == nullptr) return absl::NotFoundError(absl::StrCat("no job ", job_id));
  AttemptRecord* attempt =
      attempt_id == 0 ? CurrentAttempt(*entry) : FindAttempt(*entry, attempt_id);
  if (attempt == nullptr) {
    return absl::NotFoundError(attempt_id == 0
                                   ? absl::StrCat("job ", job_id, " has not started yet")
                                   : absl::StrCat("job ", job_id, " has no attempt ", attempt_id));
  }
  LogTargets targets;
  targets.attempt_id = attempt->attempt_id;
  for (const RankSlot& slot : attempt->ranks) {
    if (rank.has_value() && *rank != slot.rank) continue;
    targets.ranks.push_back(LogTarget{slot.rank, slot.node_id, slot.exit.has_value()});
  }
  if (targets.ranks.empty()) {
    return absl::NotFoundError(absl::StrCat("rank ", rank.value_or(-1), " is outside job ", job_id,
                                            "'s world of ", attempt->ranks.size()));
  }
  return targets;
}

void Supervisor::CollectSoftStateLocked(JobEntry& entry, SoftStateBatch& batch,
                                        bool with_accounts) {
  if (entry.progress_dirty) batch.progress.emplace_back(entry.job.id, entry.job.progress);
  if (entry.progress_dirty || with_accounts) {
    batch.accounts.emplace_back(entry.job.id, EncodeAccountsLocked(entry));
  }
  AttemptRecord* current = CurrentAttempt(entry);
  if (entry.attempt_dirty && current != nullptr) {
    for (const RankSlot& slot : current->ranks) {
      batch.pids.push_back({entry.job.id, current->attempt_id, slot.rank, slot.pid});
    }
  }
  entry.progress_dirty = false;
  entry.attempt_dirty = false;
  entry.progress_flushed = clock_->Now();
}

void Supervisor::Tick() {
  Txn txn;
  SoftStateBatch soft;
  const absl::Time now = clock_->Now();
  {
    absl::MutexLock lock(&mu_);
    if (shutting_down_) return;
    registry_->CollectLost();  // closes the channels of silent agents
    // Entries stay where they are (jobs are never erased), while the loop may end live jobs.
    std::vector<JobEntry*> live_entries;
    live_entries.reserve(live_jobs_.size());
    absl::Duration shortest_timeout = absl::InfiniteDuration();
    for (const auto& [id, entry] : live_jobs_) {
      live_entries.push_back(entry);
      shortest_timeout = std::min(shortest_timeout, entry->job.requirements.heartbeat_timeout);
    }
    // Only the nodes silent for longer than some job tolerates.
    const std::map<std::string, absl::Duration> ages = registry_->HeartbeatAges(shortest_timeout);
    for (JobEntry* live_entry : live_entries) {
      JobEntry& entry = *live_entry;
      const std::string& id = entry.job.id;
      if (AttemptRecord* live = ages.empty() ? nullptr : LiveAttempt(entry)) {
        std::set<std::string> silent;
        for (const RankSlot& slot : live->ranks) {
          auto age = ages.find(slot.node_id);
          if (!slot.exit.has_value() && age != ages.end() &&
              age->second > entry.job.requirements.heartbeat_timeout) {
            silent.insert(slot.node_id);
          }
        }
        for (const std::string& node_id : silent) {
          NodeLostLocked(txn, entry, node_id, ages.at(node_id));
        }
      }
      auto keep = entry.join_waiters.begin();
      for (auto w = entry.join_waiters.begin(); w != entry.join_waiters.end(); ++w) {
        if (w->deadline > now) {
          if (keep != w) *keep = std::move(*w);
          ++keep;
          continue;
        }
        AttemptRecord* attempt = CurrentAttempt(entry);
        std::string missing;
        for (int r = 0; attempt != nullptr && r < static_cast<int>(attempt->ranks.size()); ++r) {
          if (entry.joined.count(r) == 0) absl::StrAppend(&missing, missing.empty() ? "" : ", ", r);
        }
        txn.after.push_back([done = std::move(w->done), id, missing] {
          done(absl::DeadlineExceededError(absl::StrCat(
              "not every rank of job ", id, " joined in time; missing ranks: ", missing)));
        });
      }
      entry.join_waiters.erase(keep, entry.join_waiters.end());
      TickFailuresLocked(entry, now);
      CheckHangLocked(txn, entry, now);
      ConsiderGrowLocked(txn, entry, now);
      AttemptRecord* attempt = LiveAttempt(entry);
      if (attempt != nullptr && attempt->state == AttemptState::kStopping &&
          now - entry.stop_sent >= 2 * options_.stop_grace) {
        StopRemainingLocked(txn, entry, *attempt, attempt->cause);
      }
      if (now - entry.progress_flushed >= options_.progress_flush_interval) {
        CollectSoftStateLocked(entry, soft);
      }
    }
    outbox_.RetryHeldBack(mu_);
    ScheduleLocked(txn);
    CommitLocked(txn).IgnoreError();
  }
  // Outside the lock: soft state never decides anything, so RPCs need not wait for its write.
  if (absl::Status stored = store_->CommitSoftState(soft); !stored.ok()) {
    TY_LOG(ERROR) << "storing progress failed: " << stored;
  } else if (!soft.empty()) {
    absl::MutexLock lock(&mu_);
    ApplyStoredSoftStateLocked(soft);
  }
  kv_->ExpireWaiters(now);
  RunAfter(txn);
}

void Supervisor::HoldQueue() {
  absl::MutexLock lock(&mu_);
  queue_held_ = true;
}

void Supervisor::Shutdown() {
  Txn txn;
  SoftStateBatch soft;
  {
    absl::MutexLock lock(&mu_);
    if (shutting_down_) return;
    shutting_down_ = true;
    const absl::Status closing = absl::UnavailableError("the coordinator is shutting down");
    for (auto& [id, entry] : jobs_) {
      FailJoinWaitersLocked(txn, entry, closing);
      for (auto& [watch_id, watcher] : entry.watchers) watcher->OnClose(closing);
      entry.watchers.clear();
      CollectSoftStateLocked(entry, soft, /*with_accounts=*/live_jobs_.contains(id));
    }
    CommitLocked(txn).IgnoreError();
  }
  if (absl::Status stored = store_->CommitSoftState(soft); !stored.ok()) {
    TY_LOG(ERROR) << "storing progress failed: " << stored;
  }
  kv_->FailAll(absl::UnavailableError("the coordinator is shutting down"));
  registry_->CloseAll(absl::UnavailableError("the coordinator is shutting down; reconnect"));
  RunAfter(txn);
}

MetricsSnapshot Supervisor::Metrics() {
  MetricsSnapshot snapshot;
  {
    absl::MutexLock lock(&mu_);
    for (int s = 1; s <= kLastJobState; ++s) {
      snapshot.jobs_by_state[static_cast<JobState>(s)] = 0;
    }
    const absl::Time now = clock_->Now();
    snapshot.store_failures_total = outbox_.storage_failures();
    snapshot.store_held_back = outbox_.held_back();
    snapshot.store_queued = outbox_.queued();
    for (auto& [id, entry] : jobs_) {
      const JobRecord& job = entry.stored;
      ++snapshot.jobs_by_state[job.state];
      snapshot.attempts_total += job.attempts;
      if (!IsFinal(job.state) || now - job.finished <= options_.finished_job_metrics_retention) {
        RefreshHealthLocked(entry, now);
        JobMetrics metrics{job.id,
                           job.name,
                           job.state,
                           entry.job.health,
                           {},
                           job.progress,
                           job.labels,
                           job.requirements.checkpoint.enabled(),
                           job.last_checkpoint,
                           entry.checkpoints.stats()};
        if (entry.stragglers) metrics.straggler_scores = entry.stragglers->Scores(now);
        snapshot.jobs.push_back(std::move(metrics));
      }
    }
    snapshot.restarts_by_cause = restarts_by_cause_;
    snapshot.failures_by_class = failures_by_class_;
    snapshot.detection_seconds = detection_seconds_;
    snapshot.restart_seconds = restart_seconds_;
  }
  snapshot.nodes = Nodes();
  return snapshot;
}

std::vector<NodeStatus> Supervisor::Nodes() {
  std::vector<NodeStatus> nodes = registry_->Nodes();
  absl::MutexLock lock(&mu_);
  const absl::Time now = clock_->Now();
  for (NodeStatus& node : nodes) {
    if (std::optional<Cordon> cordon = quarantine_.Find(node.record.node_id, now)) {
      node.cordoned = true;
      node.cordon_reason = cordon->reason;
      node.cordoned_until = cordon->until;
    }
  }
  return nodes;
}

}  // namespace trainyard::server
