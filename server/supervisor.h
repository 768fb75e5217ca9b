// Supervisor: the coordinator's state manager. It owns every job's state machine
//
//   QUEUED -> STARTING -> RUNNING -> SUCCEEDED
//                |           |
//                +-----------+--> RESTARTING -> STARTING ...   (a rank failed, restarts remain)
//                            +--> FAILED                       (no restarts remain)
//   any non-final state ------> CANCELLED                      (CancelJob)
//   any non-final state ------> DRAINED                        (DrainJob)
//
// and drives it from four kinds of input: user calls (Submit, Cancel, Drain), agent reports
// (connect, heartbeat, worker started/exited), worker calls (Join, ReportProgress) and Tick()
// (timeouts, lost nodes, scheduling, progress persistence). Every transition is written to the
// JobStore together with a durable event naming its cause, before any order that follows from it
// is sent to an agent; when the store fails, the change and its orders are held back until it is
// stored (CommitLocked). Readers (GetJob, ListJobs, Watch, Metrics) see only what is stored.
// Finals are reached only when every worker of the attempt is gone, so a
// FAILED, CANCELLED or DRAINED job has no process left.
//
// Checkpoints: rank 0 reports every save that ended (ProgressUpdate::checkpoints); each new
// record is stored with a "checkpoint" event in one transaction (CheckpointLedger tells repeats,
// which workers send until acknowledged, from news). The job's last_checkpoint is its newest
// committed one by step, and every new attempt is told to resume from it (JoinInfo).
//
// Drain: a durable flag (drain_requested). While it is set, every progress report of the live
// attempt is answered kDrain; the ranks checkpoint and exit 0, and the job becomes DRAINED. A
// rank failure while draining fails the job (no restart). A job with no worker running drains at
// once. A rank's termination notice (it received SIGTERM) drains the job too, unless the rank is
// being stopped (its attempt is stopping, its job being cancelled): then it is told to stop.
//
// Restart after a coordinator crash: Create() reloads jobs and attempts; live attempts keep
// their slots, and when their agents reconnect and list their running workers those workers are
// adopted, never started again. Workers nobody owns are ordered stopped. A node that does not
// come back within a job's fault_tolerance.heartbeat_timeout_s is lost for that job: the ranks
// there fail (and the job restarts if allowed).
//
// Threading: thread-safe. One mutex guards all state; callbacks handed in (Join/KV completions)
// run after it is released, on the calling thread. JobWatcher and AgentChannel methods run with
// it held and must neither block nor call back into the Supervisor.
#ifndef TRAINYARD_SERVER_SUPERVISOR_H_
#define TRAINYARD_SERVER_SUPERVISOR_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "config/hang_limit.h"
#include "config/spec.h"
#include "planner/device_profile.h"
#include "server/agent_registry.h"
#include "server/checkpoint_ledger.h"
#include "server/checkpoint_policy.h"
#include "server/commit_queue.h"
#include "server/failure_detector.h"
#include "server/goodput.h"
#include "server/job_controller.h"
#include "server/job_store.h"
#include "server/kv_space.h"
#include "server/node_quarantine.h"
#include "server/restart_policy.h"
#include "server/scheduler.h"
#include "server/straggler_detector.h"
#include "server/types.h"

namespace trainyard::server {

struct SupervisorOptions {
  absl::Duration stop_grace = absl::Seconds(10);  // SIGTERM -> SIGKILL on cancel and teardown
  absl::Duration heartbeat_interval = absl::Seconds(1);
  absl::Duration progress_flush_interval = absl::Seconds(1);  // progress is written this often
  absl::Duration max_join_wait = absl::Minutes(10);
  absl::Duration max_kv_wait = absl::Seconds(30);
  absl::Duration finished_job_metrics_retention = absl::Minutes(10);
  std::string coordinator_address;  // host:port workers reach WorkerService at
  config::SpecLimits spec_limits;
  // Failure handling (docs/failures.md): the prior MTBF of one node for Young–Daly, the
  // quarantine of nodes where attempts keep failing, how long hang reports are gathered and the
  // slack of the coordinator's own progress check, and the source of the backoff jitter.
  absl::Duration node_mtbf = absl::Hours(5000);
  QuarantineOptions quarantine;
  absl::Duration hang_gather = absl::Seconds(2);
  absl::Duration hang_slack = absl::Seconds(3);
  // Draws uniform in [0, 1) for the restart backoff's jitter (RestartPolicy::Decide); empty:
  // JitterDraws seeded from the clock.
  std::function<double()> jitter_draw;
  // The secret a worker of (job, attempt) proves itself with (ServiceAuth::Worker); null: none.
  std::function<std::string(const std::string& job_id, int attempt_id)> attempt_secret;
  // Submissions beyond this many QUEUED jobs of one user are refused (RESOURCE_EXHAUSTED).
  int max_queued_jobs_per_user = 256;
  // The profile CPU jobs are planned with at submit (server/mesh_advisor.h); none: the
  // coordinator's calibrated one (CoordinatorCpuProfile).
  std::optional<planner::DeviceProfile> cpu_profile;
};

struct SubmitRequest {
  std::string spec_yaml;
  std::string spec_source = "<spec>";  // names the spec in parse errors
  std::string user;
  std::string client_request_id;
};

struct JobView {
  JobRecord job;
  std::vector<AttemptRecord> attempts;
  std::vector<EventRecord> events;
};

// What a rank learns when the rendezvous completes.
struct JoinInfo {
  int world_size = 0;
  int rank = 0;
  int local_rank = 0;
  int local_world_size = 0;
  Mesh mesh;
  int dp_rank = 0;
  int tp_rank = 0;
  int pp_rank = 0;
  int cp_rank = 0;
  int micro_batch = 0;  // this attempt's (JoinReply.micro_batch); 0: the spec's own
  std::string spec_yaml;
  std::string kv_prefix;
  CheckpointInfo resume_from;
  int slot = 0;
  std::string node_id;
  std::vector<std::string> data_roots;        // absolute; empty: data is not confined
  std::vector<std::string> checkpoint_roots;  // absolute; empty: checkpoints are not confined
};
using JoinCallback = std::function<void(absl::StatusOr<JoinInfo>)>;

struct ProgressUpdate {
  std::string job_id;
  int attempt_id = 0;
  int rank = 0;
  int64_t step = 0;
  int64_t total_steps = 0;
  double loss = 0;
  double logit_z_loss = 0;
  double learning_rate = 0;
  double grad_norm = 0;
  double tokens_per_second = 0;
  StepTimes step_times;
  std::optional<double> val_loss;
  double max_step_ms = 0;  // the slowest step since the rank's previous report
  // The newest complete checkpoint the rank knows (path empty: none). Only a worker that does
  // not send `checkpoints` needs it; a path the ledger knows is ignored here.
  CheckpointInfo checkpoint;
  // Rank 0: saves that ended since its last acknowledged report, oldest first. Invalid records
  // (CheckpointLedger::Validate) are logged and dropped; attempt_id 0 means this report's
  // attempt, an unset written time the time of the report.
  std::vector<CheckpointInfo> checkpoints;
  // Rank 0, in its first reports of an attempt: where the attempt started from.
  struct Resumed {
    int64_t step = 0;
    std::string from;
    bool from_memory = false;
    double restore_ms = 0;
    double started_ms = 0;
  };
  std::optional<Resumed> resumed;
  // Rank 0, once after its last step: a serialized v1::RunReport (empty: none).
  std::string run_report;
  // The MoE layers' routing since the rank's previous report; empty for a dense model.
  std::vector<MoeLayerProgress> moe;
  // Set when the rank enters a phase other than the step (ProgressReport.phase): the report
  // says only that, and the hang limit the rank holds the phase to.
  struct Phase {
    config::HangPhase phase = config::HangPhase::kEvaluation;
    double limit_s = 0;
  };
  std::optional<Phase> phase;
  // A termination notice (ProgressReport.terminated): the rank received SIGTERM. The other
  // fields but the identity are unset.
  bool terminated = false;
};

enum class WorkerOrder { kContinue, kCheckpoint, kDrain, kStop };
struct OrderReply {
  WorkerOrder order = WorkerOrder::kContinue;
  int64_t checkpoint_step = 0;
};

// A rank's hang watchdog fired (WorkerService.ReportHang).
struct HangUpdate {
  std::string job_id;
  int attempt_id = 0;
  HangReport report;
};

struct RunningWorker {
  std::string job_id;
  int attempt_id = 0;
  int rank = 0;
  int64_t pid = 0;  // 0: not said (a worker that a progress batch's report speaks for)
};

struct WorkerExit {
  std::string job_id;
  int attempt_id = 0;
  int rank = 0;
  RankExit exit;
};

// Sent first on every agent connection (AgentRegistered on the wire).
struct RegisteredOrder {
  std::string node_id;
  absl::Duration heartbeat_interval;
  absl::Duration heartbeat_timeout;
  // The live attempts among the workers the agent reported running, with what their StartWorker
  // orders told the agent: the attempt's secret ("" without secrets) and its memory tier's peers.
  struct Adopted {
    std::string job_id;
    int attempt_id = 0;
    std::string secret;
    std::string memory_peer_address;
    std::vector<std::string> memory_tier_addresses;
  };
  std::vector<Adopted> adopted;
};

// Receives a job's updates: the current state on subscription, then every change. Runs with the
// Supervisor's lock held: must not block or call back.
class JobWatcher {
 public:
  virtual ~JobWatcher() = default;
  // `event` is null for changes that are not events (progress).
  virtual void OnUpdate(const JobRecord& job, const EventRecord* event) = 0;
  // The coordinator is shutting down; no more updates.
  virtual void OnClose(const absl::Status& status) = 0;
};

struct LogTarget {
  int rank = 0;
  std::string node_id;
  bool exited = false;
};
struct LogTargets {
  int attempt_id = 0;
  std::vector<LogTarget> ranks;
};

// Bucket bounds (seconds) of the fault detection and restart latency histograms.
inline std::vector<double> FailureSecondsBuckets() {
  return {0.1, 0.25, 0.5, 1, 2.5, 5, 10, 15, 30, 60, 120, 300, 600};
}

struct JobMetrics {
  std::string job_id;
  std::string name;
  JobState state = JobState::kQueued;
  JobHealth health;
  std::vector<RankScore> straggler_scores;  // the live attempt's ranks
  Progress progress;
  std::map<std::string, std::string> labels;
  bool checkpointing = false;      // the spec has a checkpoint section
  CheckpointInfo last_checkpoint;  // the newest committed; path empty: none
  CheckpointStats checkpoints;     // saves reported since the coordinator started
};
struct MetricsSnapshot {
  std::map<JobState, int64_t> jobs_by_state;  // every state present, zeros included
  int64_t attempts_total = 0;
  std::map<std::string, int64_t> restarts_by_cause;  // by failure class
  std::map<std::string, int64_t> failures_by_class;  // every failed attempt, restarted or not
  // Since the coordinator started: from each fault to its detection, by failure class; and
  // from a failure's detection to the next attempt's first reported step.
  std::map<std::string, Histogram> detection_seconds;
  Histogram restart_seconds{FailureSecondsBuckets()};
  std::vector<JobMetrics> jobs;  // live jobs and those finished within the retention
  std::vector<NodeStatus> nodes;
  int64_t store_failures_total = 0;  // commits the job store refused (each retry counts)
  int64_t store_held_back = 0;       // changes waiting to be stored (their orders wait too)
  int64_t store_queued = 0;          // changes queued for the next group commit, or in it
};

class Supervisor {
 public:
  // Loads the stored state. `store`, `registry`, `kv` and `clock` are not owned and must outlive
  // the Supervisor.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Supervisor>> Create(
      StateStore* store, AgentRegistry* registry, KvSpace* kv, Clock* clock,
      SupervisorOptions options);

  // --- Users ---------------------------------------------------------------------------------
  // INVALID_ARGUMENT with the parser's message for a bad spec (nothing stored); FAILED_PRECONDITION
  // with the planner's explanation when the job cannot fit the memory of the connected nodes of
  // its kind (server/mesh_advisor.h; `parallelism: auto` becomes the planner's choice there);
  // RESOURCE_EXHAUSTED over 1 MiB; UNAVAILABLE when shutting down; INTERNAL on store failure.
  // model.init_from is checked here when this machine sees its path (worker/convert/init_from.h).
  [[nodiscard]] absl::StatusOr<JobRecord> Submit(const SubmitRequest& request);
  // NOT_FOUND; FAILED_PRECONDITION for a SUCCEEDED, FAILED or DRAINED job; OK (no-op) when
  // CANCELLED.
  [[nodiscard]] absl::StatusOr<JobRecord> Cancel(const std::string& job_id,
                                                 const std::string& reason,
                                                 const std::string& user = "");
  // Asks the job's ranks to checkpoint and exit (see the class comment and DrainJob in the
  // proto). NOT_FOUND; FAILED_PRECONDITION for a SUCCEEDED, FAILED or CANCELLED job or one being
  // cancelled; OK (no-op) when DRAINED or already draining; INTERNAL when the store fails.
  [[nodiscard]] absl::StatusOr<JobRecord> Drain(const std::string& job_id,
                                                const std::string& reason,
                                                const std::string& user = "");
  // Every checkpoint record of the job, oldest first (written time, then step). NOT_FOUND.
  [[nodiscard]] absl::StatusOr<std::vector<CheckpointInfo>> ListCheckpoints(
      const std::string& job_id);
  [[nodiscard]] absl::StatusOr<JobView> GetJob(const std::string& job_id, int max_events);
  // Newest first, spec_yaml left empty; `states` empty means all; `user`: only that user's jobs.
  std::vector<JobRecord> ListJobs(const std::set<JobState>& states, int limit,
                                  const std::optional<std::string>& user = std::nullopt);
  // Who submitted the job; NOT_FOUND for an unknown one.
  [[nodiscard]] absl::StatusOr<std::string> JobOwner(const std::string& job_id);
  // Subscribes; the watcher gets the current state at once. NOT_FOUND for an unknown job.
  [[nodiscard]] absl::StatusOr<uint64_t> Watch(const std::string& job_id,
                                               std::shared_ptr<JobWatcher> watcher);
  void Unwatch(const std::string& job_id, uint64_t watch_id);
  // Where the logs of an attempt (0: current) live; `rank` nullopt: every rank. NOT_FOUND for
  // an unknown job, an attempt that does not exist, or a rank outside the world.
  [[nodiscard]] absl::StatusOr<LogTargets> LocateLogs(const std::string& job_id, int attempt_id,
                                                      std::optional<int> rank);

  // --- Agents --------------------------------------------------------------------------------
  // Registers the agent and reconciles what it runs with what the store says should run. The
  // channel first receives a RegisteredOrder (through `on_registered`, under the lock, before
  // any other order). INVALID_ARGUMENT for a bad registration; UNAVAILABLE when shutting down.
  [[nodiscard]] absl::StatusOr<uint64_t> AgentConnected(
      const NodeRecord& node, const std::vector<RunningWorker>& running,
      const std::vector<WorkerExit>& exited_while_disconnected,
      std::shared_ptr<AgentChannel> channel,
      const std::function<void(const RegisteredOrder&)>& on_registered);
  void AgentDisconnected(const std::string& node_id, uint64_t session);
  // FAILED_PRECONDITION when `session` was replaced or declared lost (the agent must reconnect).
  [[nodiscard]] absl::Status Heartbeat(const std::string& node_id, uint64_t session,
                                       const std::vector<RunningWorker>& running);
  [[nodiscard]] absl::Status WorkerStarted(const std::string& node_id, uint64_t session,
                                           const RunningWorker& worker);
  [[nodiscard]] absl::Status WorkerExited(const std::string& node_id, uint64_t session,
                                          const WorkerExit& exit);
  // The node's memory tier has something to say about a job (a refused reservation, a failed
  // peer copy): an event of the job.
  [[nodiscard]] absl::Status TierNotice(const std::string& node_id, uint64_t session,
                                        const std::string& job_id, const std::string& message);

  // --- Workers -------------------------------------------------------------------------------
  // Completes `done` exactly once: when every rank joined, or with an error (see the proto).
  void Join(const std::string& job_id, int attempt_id, int rank, absl::Time deadline,
            JoinCallback done);
  [[nodiscard]] absl::StatusOr<OrderReply> ReportProgress(const ProgressUpdate& update);
  // The reports an agent's progress relay forwarded for its node's ranks (a ProgressBatch on its
  // Connect stream), handled under one lock and one transaction: one answer per update, in order,
  // each what ReportProgress would answer, or PERMISSION_DENIED for a rank that the update's
  // attempt did not place on `node_id`. FAILED_PRECONDITION for the whole batch when `session`
  // was replaced or lost (the agent must reconnect). `heartbeat` (may be null): the workers a
  // heartbeat sent with the batch lists, taken as Heartbeat takes them, before the updates.
  [[nodiscard]] absl::StatusOr<std::vector<absl::StatusOr<OrderReply>>> ReportNodeProgress(
      const std::string& node_id, uint64_t session, const std::vector<ProgressUpdate>& updates,
      const std::vector<RunningWorker>* heartbeat = nullptr);

  // --- Time and lifecycle --------------------------------------------------------------------
  // Expires rendezvous and KV waits, declares silent nodes lost, resends stop orders that went
  // unanswered, schedules queued jobs and persists progress. Call it often (every 100 ms).
  void Tick();
  // Refuses new work with UNAVAILABLE and ends every waiter and watcher. Jobs keep running:
  // a restarted coordinator adopts them.
  void Shutdown();
  // Starts no queued job from now on, while everything else goes on: for a coordinator that
  // drains its jobs before it stops (trainyard-server --drain-on-stop), so that the slots the
  // drained jobs free are not taken by a job that would only be stopped.
  void HoldQueue();

  MetricsSnapshot Metrics();
  std::vector<NodeStatus> Nodes();
  // Lifts a node's quarantine. NOT_FOUND (unknown node); FAILED_PRECONDITION (not cordoned).
  [[nodiscard]] absl::StatusOr<NodeStatus> Uncordon(const std::string& node_id);
  // A worker's hang report: gathered with the attempt's others, then a verdict (see
  // FailureDetector). Errors as ReportProgress.
  [[nodiscard]] absl::Status ReportHang(const HangUpdate& update);
  // OK while (job, attempt) is the job's current, unfinished attempt and `rank` in it: the
  // fencing check before a checkpoint commit (WorkerService.ConfirmAttempt).
  [[nodiscard]] absl::Status ConfirmAttempt(const std::string& job_id, int attempt_id, int rank);

  // The address put in StartWorker orders (known once the server has bound its port).
  void SetCoordinatorAddress(const std::string& address);

 private:
  [[nodiscard]] absl::Status CheckFilesHere(const config::JobSpec& spec) const;
  struct JoinWaiter {
    int rank;
    absl::Time deadline;
    JoinCallback done;
  };
  struct JobEntry {
    JobRecord job;
    std::deque<AttemptRecord> attempts;  // oldest first; references stay valid on push_back
    // The job's and its attempts' records as the store holds them: what readers see (status,
    // list, watch, metrics). Memory runs ahead of them from a change until its commit, and for
    // as long as the store fails; a restart would find these, not `job` and `attempts`.
    JobRecord stored;
    std::deque<AttemptRecord> stored_attempts;
    std::set<int> joined;  // ranks of the current attempt that called Join
    std::vector<JoinWaiter> join_waiters;
    absl::Time stop_sent = absl::InfinitePast();
    // Soft state not yet stored: progress (the job row) and worker pids (the current attempt's
    // rows). Written by Tick every progress_flush_interval, in one transaction for all jobs.
    bool progress_dirty = false;
    bool attempt_dirty = false;
    absl::Time progress_flushed = absl::InfinitePast();
    std::map<uint64_t, std::shared_ptr<JobWatcher>> watchers;
    CheckpointLedger checkpoints;
    // Failure handling (supervisor_failures.cc). The restart policy and what it remembers
    // between attempts, from the spec's fault_tolerance section.
    JobController controller;
    std::unique_ptr<FailureDetector> detector;      // the running attempt's
    std::unique_ptr<StragglerDetector> stragglers;  // the running attempt's
    // Elastic sizes with a valid mesh, largest first: above resources.nodes up to max_nodes
    // (taken when nodes are free) and below it down to min_nodes (a restart after a loss); and
    // the micro-batches accumulated per step at the job's own size.
    int min_nodes = 1;
    int max_nodes = 1;
    std::vector<JobShape> larger_shapes;
    std::vector<JobShape> smaller_shapes;
    // The memory one rank needs at the job's full size (the planner's prediction; 0: unknown),
    // which the scheduler checks nodes against.
    int64_t memory_per_rank = 0;
    int full_accumulation = 1;
    int full_micro_batch = 0;
    // Growing back: the ranks were ordered to checkpoint and stop (like a drain) so that the
    // job restarts on more nodes; at most one resize in flight, one per resize_cooldown_s.
    bool resizing = false;
    bool resized_by_choice = false;  // the next attempt follows a resize, not a failure
    int resumed_attempt = 0;         // the attempt whose "resumed" event was recorded
    absl::Time last_resize = absl::InfinitePast();
    int64_t last_save_step = 0;  // the newest save reported, in any state
    int64_t ordered_step = 0;    // the save ordered next
    int ordered_attempt = 0;     // the attempt it was ordered of
    GoodputAccount goodput;
  };
  // Changes of one operation: stored together (group commit, below), then orders sent and
  // watchers notified (under the lock, so orders keep their order), then `after` run without the
  // lock.
  struct Txn {
    StoreBatch batch;
    std::set<JobEntry*> touched;
    std::vector<std::pair<std::string, AgentOrder>> orders;
    std::vector<std::function<void()>> after;
  };

  Supervisor(StateStore* store, AgentRegistry* registry, KvSpace* kv, Clock* clock,
             SupervisorOptions options);
  [[nodiscard]] absl::Status Restore();
  // Gives the restored jobs their checkpoint records, newest committed checkpoint and (for jobs
  // stored before it was recorded) checkpoint policy.
  void RestoreCheckpointsLocked(std::vector<JobCheckpoint> checkpoints)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  JobEntry* FindJob(const std::string& job_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // RESOURCE_EXHAUSTED when `user` has max_queued_jobs_per_user jobs QUEUED.
  [[nodiscard]] absl::Status CheckQueuedLimitLocked(const std::string& user) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // by_request_id_'s key: request ids are scoped to the user who sent them.
  static std::string RequestKey(const std::string& user, const std::string& request_id) {
    return user + '\0' + request_id;
  }
  // The job and current attempt a worker call names, checked as WorkerService documents:
  // NOT_FOUND (job, attempt), FAILED_PRECONDITION (superseded or ended), INVALID_ARGUMENT (rank).
  struct RankOfAttempt {
    JobEntry* entry;
    AttemptRecord* attempt;
  };
  [[nodiscard]] absl::StatusOr<RankOfAttempt> FindLiveRankLocked(const std::string& job_id,
                                                                 int attempt_id, int rank)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // One progress report (`node_id`: the node whose agent forwarded it, checked against the
  // rank's placement; null: the worker called directly).
  [[nodiscard]] absl::StatusOr<OrderReply> ReportProgressLocked(Txn& txn,
                                                                const ProgressUpdate& update,
                                                                const std::string* node_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A termination notice (ProgressUpdate::terminated) of `rank` of the live `attempt`.
  OrderReply TerminatedLocked(Txn& txn, JobEntry& entry, const AttemptRecord& attempt, int rank)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static AttemptRecord* FindAttempt(JobEntry& entry, int attempt_id);
  // For the registering agent of `node_id`: the live attempts among its running workers.
  std::vector<RegisteredOrder::Adopted> AdoptedAttemptsLocked(
      const std::string& node_id, const std::vector<RunningWorker>& running)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static AttemptRecord* CurrentAttempt(JobEntry& entry);
  // The current attempt when it has not ended, else null.
  static AttemptRecord* LiveAttempt(JobEntry& entry);

  // Txn helpers.
  void TouchJob(Txn& txn, JobEntry& entry);
  void TouchAttempt(Txn& txn, JobEntry& entry, AttemptRecord& attempt);
  void AddEvent(Txn& txn, JobEntry& entry, int attempt_id, JobState from, JobState to,
                std::string kind, std::string cause) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Transition(Txn& txn, JobEntry& entry, JobState to, std::string kind, std::string cause)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Stores txn.batch, then sends txn.orders and notifies watchers, and returns once that is
  // done, through the commit queue (outbox_, server/commit_queue.h): whichever caller finds no
  // store in progress stores everything queued in one transaction with mu_ released, so when
  // this returns other threads may have changed the state in between. When the store fails, the
  // change is held back with a "storage_failed" event for each job it touched, and so are its
  // orders and every later change's: no agent acts on a change before it is stored. Returns the
  // store's error then; memory keeps the change, and Tick stores it once the store works again.
  [[nodiscard]] absl::Status CommitLocked(Txn& txn) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Queues txn's changes (copies of its records; taking txn.orders) and returns their sequence
  // number.
  uint64_t EnqueueCommitLocked(Txn& txn, bool submission) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sends `orders` in order (taking them); an order to a disconnected node is dropped, logged.
  void SendOrdersLocked(std::vector<std::pair<std::string, AgentOrder>>& orders)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The commit queue's hook for a change held back: a storage_failed event for each job it
  // touched, stored with it.
  void HoldBackLocked(QueuedCommit& commit, const absl::Status& status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void NotifyStoredLocked(const std::set<std::string>& job_ids,
                          const std::vector<EventRecord>& events)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Tick: retries the held-back changes; once they are stored their orders go out.
  static void RunAfter(Txn& txn);

  // State machine steps.
  void ScheduleLocked(Txn& txn) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `shape`: the smaller size an elastic restart was placed at (none: the job's own).
  void StartAttemptLocked(Txn& txn, JobEntry& entry, std::vector<RankSlot> ranks,
                          const std::optional<JobShape>& shape) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `secret`: the attempt's secret when the caller has it (one HMAC per attempt, not per rank);
  // null: worked out here.
  StartWorkerOrder StartOrderFor(const JobEntry& entry, const AttemptRecord& attempt,
                                 const RankSlot& slot, const std::string* secret = nullptr) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The memory tier that keeps copies of `node_id`'s snapshots of `attempt` (the next node of the
  // attempt; "" on one node), and the tiers of all its nodes (none on one node).
  std::pair<std::string, std::vector<std::string>> MemoryPeersOf(const AttemptRecord& attempt,
                                                                 const std::string& node_id) const;
  void MarkRunningLocked(Txn& txn, JobEntry& entry, AttemptRecord& attempt)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void HandleExitLocked(Txn& txn, const std::string& node_id, const WorkerExit& exit,
                        const std::string& failure_kind) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Why an attempt failed: its class, the cause (naming the rank blamed) and when the fault
  // happened (for the detection latency).
  struct AttemptFailure {
    FailureClass failure_class = FailureClass::kCrash;
    std::string cause;
    int rank = -1;
    absl::Time fault = absl::InfinitePast();
  };
  void FailAttemptLocked(Txn& txn, JobEntry& entry, AttemptRecord& attempt,
                         const AttemptFailure& failure) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Elastic growth (supervisor_elastic.cc). Whether a job of `kind` other than `except` wants
  // nodes: queued, waiting out a restart's backoff (or for its workers to stop), or growing. No
  // job grows past its size then.
  bool OthersWantNodesLocked(DeviceKind kind, const std::string& except)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The kinds of the jobs restarting outside the queue (in backoff, or their workers stopping):
  // no queued job of those kinds is placed above its size.
  std::set<DeviceKind> KindsNotToGrowLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Failure handling (supervisor_failures.cc).
  // The spec of an elastic attempt of `spec`'s job on fewer `nodes` (config::ResizedSpec; for
  // `parallelism: auto`, with the planner's mesh for that size).
  std::optional<config::JobSpec> ResizedSpecLocked(const config::JobSpec& spec, int nodes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Reads the spec's fault tolerance and checkpoint sections into the entry's policies, and
  // the restart counts from the stored attempts. `parsed`: the job's spec as admitted (a
  // submission has it already); null: parsed from the stored YAML.
  void LoadPoliciesLocked(JobEntry& entry, const config::JobSpec* parsed = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The job's goodput account and Young–Daly estimates, serialized for its stored record
  // (JobRecord::accounts); and, at restore, read back into the entry's policies (after
  // LoadPoliciesLocked). False when the record has none, or none that reads back (logged).
  std::string EncodeAccountsLocked(const JobEntry& entry) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool RestoreAccountsLocked(JobEntry& entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Elastic growth (supervisor_elastic.cc): orders a resize when more nodes fit the job, and
  // restarts it when its ranks stopped for it.
  void ConsiderGrowLocked(Txn& txn, JobEntry& entry, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FinishResizeLocked(Txn& txn, JobEntry& entry, AttemptRecord& attempt)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Starts watching a running attempt (from `since`): hang detector, stragglers, exposure.
  void WatchAttemptLocked(JobEntry& entry, const AttemptRecord& attempt, absl::Time since)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A verdict of the live attempt's detector, if any, fails it.
  void CheckHangLocked(Txn& txn, JobEntry& entry, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Per-report bookkeeping of a running attempt: detector, stragglers, goodput, Young–Daly.
  void ObserveProgressLocked(Txn& txn, JobEntry& entry, const ProgressUpdate& update,
                             OrderReply& reply) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Re-enqueues jobs whose backoff ended; counts running time for the MTBF estimates.
  void TickFailuresLocked(JobEntry& entry, absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RefreshHealthLocked(JobEntry& entry, absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::vector<NodeView> SchedulableNodesLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Every slot of the nodes a job could be placed on (connected, not lost, and not cordoned
  // unless `with_cordoned`), as if all were free.
  std::vector<NodeView> CapacityLocked(absl::Time now, bool with_cordoned = false)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether `entry`'s job, at its own size or a smaller one it may restart at, fits the capacity
  // left without cordoned nodes.
  bool CouldRunLocked(const JobEntry& entry, absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Counts an infrastructure failure against `node_id`; a cordon it brings is undone (with an
  // event saying so) when it would leave `entry`'s job no node to run on.
  void RecordNodeFailureLocked(Txn& txn, JobEntry& entry, int attempt_id,
                               const std::string& node_id, const std::string& cause, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `job`, a copy of a job's record for a reader, with `waiting` filled in while it is queued.
  void FillWaitingLocked(JobRecord& job, absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // What a reader sees of a job: its stored record (spec left out unless `with_spec`), with what
  // is never stored (health, why it waits) computed now; `waiting` says so when changes to it
  // are held back by a failing store.
  JobRecord StoredViewLocked(JobEntry& entry, absl::Time now, bool with_spec = true)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A commit stored: its records become what readers see.
  void ApplyStoredLocked(QueuedCommit& commit) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The progress and pids of a soft-state write that succeeded become what readers see, and the
  // jobs' watchers hear of it.
  void ApplyStoredSoftStateLocked(const SoftStateBatch& soft) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void StopRemainingLocked(Txn& txn, JobEntry& entry, AttemptRecord& attempt,
                           const std::string& reason) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FinishAttemptLocked(Txn& txn, JobEntry& entry, AttemptRecord& attempt)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FailJoinWaitersLocked(Txn& txn, JobEntry& entry, const absl::Status& status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EnqueueLocked(JobEntry& entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Moves `entry`'s unsaved progress and pids into `batch` and marks them saved; its accounts go
  // with its progress, or always with `with_accounts`.
  void CollectSoftStateLocked(JobEntry& entry, SoftStateBatch& batch, bool with_accounts = false)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  JoinInfo JoinInfoFor(const JobEntry& entry, const AttemptRecord& attempt, int rank) const;
  void UpdateProgressLocked(Txn& txn, JobEntry& entry, const ProgressUpdate& update)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Checkpoints and drain (supervisor_checkpoints.cc).
  // Stores and announces the new records of rank 0's report; updates last_checkpoint.
  void RecordCheckpointsLocked(Txn& txn, JobEntry& entry, const ProgressUpdate& update)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The report's last_checkpoint, from a worker that does not send records.
  void RecordReportedCheckpointLocked(Txn& txn, JobEntry& entry, const ProgressUpdate& update)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The checkpoint an attempt resumed from, when it is newer than the job's last_checkpoint: a
  // save whose report never arrived (its node died, or a peer rank did, right after the commit).
  void RecordResumedCheckpointLocked(Txn& txn, JobEntry& entry, int attempt_id,
                                     const ProgressUpdate::Resumed& resumed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sets the job's drain flag with an event naming `cause`, and drains it at once when no worker
  // runs: Drain without its checks and commit.
  void DrainLocked(Txn& txn, JobEntry& entry, const std::string& cause)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The final transition of a drained job (no worker left).
  void FinishDrainLocked(Txn& txn, JobEntry& entry, const std::string& context)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Agent reconciliation.
  void ReconcileLocked(Txn& txn, const std::string& node_id,
                       const std::vector<RunningWorker>& running, bool on_connect)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void StopStrayLocked(Txn& txn, const std::string& node_id, const RunningWorker& worker,
                       const std::string& reason) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Fails the ranks of `entry`'s live attempt on `node_id`, silent for `age`.
  void NodeLostLocked(Txn& txn, JobEntry& entry, const std::string& node_id, absl::Duration age)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  StateStore* const store_;
  AgentRegistry* const registry_;
  KvSpace* const kv_;
  Clock* const clock_;
  const SupervisorOptions options_;
  const planner::DeviceProfile cpu_profile_;  // options_.cpu_profile, or the coordinator's

  absl::Mutex mu_;
  std::map<std::string, JobEntry> jobs_ ABSL_GUARDED_BY(mu_);
  // jobs_ by id, hashed: the lookup of every report and heartbeat (entries never move).
  absl::flat_hash_map<std::string, JobEntry*> job_index_ ABSL_GUARDED_BY(mu_);
  // The non-final jobs by id (entries of jobs_, which never moves or erases one).
  std::map<std::string, JobEntry*> live_jobs_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::string> by_request_id_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, NodeRecord> nodes_ ABSL_GUARDED_BY(mu_);
  Scheduler scheduler_ ABSL_GUARDED_BY(mu_);
  int64_t max_seq_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_watch_id_ ABSL_GUARDED_BY(mu_) = 1;
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  bool queue_held_ ABSL_GUARDED_BY(mu_) = false;  // HoldQueue
  std::map<std::string, int64_t> restarts_by_cause_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int64_t> failures_by_class_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Histogram> detection_seconds_ ABSL_GUARDED_BY(mu_);
  Histogram restart_seconds_ ABSL_GUARDED_BY(mu_){FailureSecondsBuckets()};
  NodeQuarantine quarantine_ ABSL_GUARDED_BY(mu_);
  std::function<double()> jitter_draw_ ABSL_GUARDED_BY(mu_);
  // Stop orders sent for stray workers, keyed "node/job/attempt/rank", to resend them at most
  // once per grace period.
  std::map<std::string, absl::Time> stray_stops_ ABSL_GUARDED_BY(mu_);
  // Group commit (server/commit_queue.h): the changes not stored yet and the store's health.
  CommitQueue outbox_ ABSL_GUARDED_BY(mu_);
  // Submissions being stored, by client_request_id: a second one with the same key waits.
  std::set<std::string> submitting_ ABSL_GUARDED_BY(mu_);
  std::string coordinator_address_ ABSL_GUARDED_BY(mu_);
};

}  // namespace trainyard::server

#endif  // TRAINYARD_SERVER_SUPERVISOR_H_
