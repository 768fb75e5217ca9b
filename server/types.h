// The coordinator's domain types: jobs, attempts, events and nodes as the managers (JobStore,
// Scheduler, Supervisor, AgentRegistry) see them. The gRPC edge converts them to and from
// trainyard.v1 messages (server/convert.h); nothing here depends on protobuf.
//
// Threading: plain values.
#ifndef TRAINYARD_SERVER_TYPES_H_
#define TRAINYARD_SERVER_TYPES_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace trainyard::server {

// The numeric values are stored in SQLite and match trainyard.v1.JobState; never renumber.
enum class JobState {
  kQueued = 1,
  kStarting = 2,
  kRunning = 3,
  kRestarting = 4,
  kSucceeded = 5,
  kFailed = 6,
  kCancelled = 7,
  kDrained = 8,
};
inline constexpr int kLastJobState = 8;  // JobState values are 1..kLastJobState

// Stored in SQLite; matches trainyard.v1.AttemptState; never renumber.
enum class AttemptState {
  kStarting = 1,
  kRunning = 2,
  kStopping = 3,
  kSucceeded = 4,
  kFailed = 5,
  kCancelled = 6,
};

enum class DeviceKind { kCpu = 0, kGpu = 1 };

// Stored in SQLite; matches trainyard.v1.CheckpointState; never renumber.
enum class CheckpointState {
  kCommitted = 1,  // its manifest is durable: it can be resumed from
  kFailed = 2,     // the save failed; training went on
  kSkipped = 3,    // a due save was skipped
};

const char* JobStateName(JobState state);  // "QUEUED", "STARTING", ...
const char* AttemptStateName(AttemptState state);
const char* CheckpointStateName(CheckpointState state);  // "COMMITTED", "FAILED", "SKIPPED"
bool IsFinal(JobState state);
bool IsFinal(AttemptState state);
// Values read back from the store are checked: INTERNAL for a number no state has.
[[nodiscard]] absl::StatusOr<JobState> JobStateFromInt(int64_t value);
[[nodiscard]] absl::StatusOr<AttemptState> AttemptStateFromInt(int64_t value);
[[nodiscard]] absl::StatusOr<CheckpointState> CheckpointStateFromInt(int64_t value);

struct Mesh {
  int dp = 1;
  int tp = 1;
  int pp = 1;
  int zero_stage = 0;
  // The pipeline schedule (config::ScheduleName) and its virtual stages; "" for the spec's own
  // (meshes stored before the schedule was recorded).
  std::string schedule;
  int virtual_stages = 1;
  // Context-parallel ranks per sequence; the world is dp × cp × tp × pp.
  int cp = 1;
  // Expert-parallel ranks an MoE layer's experts are split over (drawn from the dp ranks); 0 for
  // the spec's own (meshes stored before it was recorded).
  int ep = 1;
};

// How a job checkpoints, from its spec's checkpoint section.
struct CheckpointSettings {
  std::string dir;          // empty: the job does not checkpoint
  int64_t every_steps = 0;  // the interval in force (for `auto`, the fixed interval it stands for)
  bool interval_auto = false;  // the spec says `every_steps: auto`
  int keep = 0;                // committed checkpoints kept on disk
  // False for a job stored before the policy was recorded (schema 1): the supervisor derives the
  // policy from the job's spec when it restores the job.
  bool recorded = true;

  bool enabled() const { return !dir.empty(); }
};

// What the scheduler and supervisor need from a job spec, extracted once at submission and
// stored beside the spec text (server/requirements.h).
struct JobRequirements {
  int nodes = 1;           // distinct nodes the job spans
  int ranks_per_node = 1;  // slots taken on each of them
  DeviceKind kind = DeviceKind::kCpu;
  Mesh mesh;
  int max_restarts = 2;
  // A node silent (or disconnected) this long is lost for this job: its ranks count as failed.
  absl::Duration heartbeat_timeout = absl::Seconds(10);
  CheckpointSettings checkpoint;

  int world_size() const { return nodes * ranks_per_node; }
};

struct StepTimes {
  double total_ms = 0;
  double forward_ms = 0;
  double backward_ms = 0;
  double optimizer_ms = 0;
  double communication_ms = 0;
  double data_ms = 0;
};

// One checkpoint save as rank 0 reported it (or, from a worker that reports only its newest
// complete checkpoint, step, path and time with the other fields zero).
struct CheckpointInfo {
  int64_t step = 0;
  std::string path;                           // the checkpoint directory; empty: none
  absl::Time written = absl::InfinitePast();  // committed (or failed)
  CheckpointState state = CheckpointState::kCommitted;
  int64_t bytes = 0;           // every shard file and the manifest
  double write_seconds = 0;    // from the snapshot to the commit
  double blocked_seconds = 0;  // training blocked by this save
  std::string message;         // FAILED/SKIPPED: why
  int attempt_id = 0;          // the attempt that wrote it
};

// How an MoE layer keeps its experts' load even. The numeric values are stored in SQLite and
// match trainyard.v1.MoeBalance; never renumber.
enum class MoeBalance { kUnknown = 0, kAuxLoss = 1, kBias = 2 };

// One MoE layer's routing over the steps of the newest report that carried it (a
// v1::MoeLayerProgress without the figures derived from tokens_per_expert, which
// SummarizeExpertLoad in common/moe_load.h computes when they are shown).
struct MoeLayerProgress {
  int layer = 0;
  int64_t steps = 0;                       // optimizer steps in the report's window
  std::vector<int64_t> tokens_per_expert;  // picks per expert over them, before capacity drops
  int64_t tokens = 0;                      // tokens the layer routed over them
  int64_t dropped = 0;                     // picks over an expert's capacity over them
  int64_t dropped_total = 0;               // since the attempt's ranks started
  MoeBalance balance = MoeBalance::kUnknown;
  double aux_loss = 0;     // mean over the window's steps (kAuxLoss)
  double bias_spread = 0;  // max − min of the selection bias at its last step (kBias)
  double z_loss = 0;       // the router z-loss, mean over the window's steps (0: none)

  bool operator==(const MoeLayerProgress&) const = default;
};

struct Progress {
  int64_t step = 0;
  int64_t total_steps = 0;
  double loss = 0;
  double logit_z_loss = 0;  // model.z_loss_coeff times the step's mean lse² (0: none)
  double learning_rate = 0;
  double grad_norm = 0;
  double tokens_per_second = 0;
  StepTimes step_times;
  std::optional<double> val_loss;
  std::optional<absl::Duration> eta;  // unknown until a step time is known
  absl::Time reported = absl::InfinitePast();
  // Once the run ended: rank 0's serialized v1::RunReport (the planner's prediction beside what
  // was measured); empty before. Opaque to the coordinator.
  std::string run_report;
  // The MoE layers' routing as the newest report that carried it had it; empty for a dense model.
  std::vector<MoeLayerProgress> moe;
};

// The newest failure of a job's attempts: how it was classified and whom it blamed.
struct FailureSummary {
  std::string failure_class;  // restart_policy.h names; empty: no failure yet
  std::string cause;
  int rank = -1;  // the rank blamed; -1: none
  std::string node_id;
  int attempt_id = 0;
  absl::Time detected = absl::InfinitePast();
  double detection_seconds = 0;  // from the fault to the coordinator knowing
  bool restarted = false;
};

struct RestartBudgetView {
  std::string failure_class;
  int used = 0;
  int budget = 0;
};

struct YoungDalyView {
  double checkpoint_cost_s = 0;  // δ (0: not measured yet)
  double mtbf_s = 0;             // M
  double interval_s = 0;         // τ (0: not known yet)
  int64_t interval_steps = 0;
  int64_t next_step = 0;  // the save ordered next (0: none)
  int failures_observed = 0;
  double exposure_s = 0;
};

struct GoodputView {
  double wall_s = 0;
  double productive_s = 0;
  double checkpoint_s = 0;
  double startup_s = 0;
  double other_s = 0;
  std::map<std::string, double> restart_s;  // by failure class
  std::map<std::string, double> lost_s;     // by failure class
  double ratio = 0;
};

struct StragglerView {
  int rank = 0;
  std::string node_id;
  double score = 0;
  absl::Time since = absl::InfinitePast();
};

// What the supervisor knows of a job's failures and their cost, computed when asked (not
// stored as such; the restart counts, the goodput account and the Young–Daly estimates it is
// computed from are, in the attempts and JobRecord::accounts).
struct JobHealth {
  FailureSummary last_failure;
  std::vector<RestartBudgetView> restart_budgets;
  absl::Time restart_at = absl::InfinitePast();  // RESTARTING: the backoff ends then
  double hang_limit_s = 0;                       // the live attempt's; 0: none running
  std::string hang_limit_of;  // what it applies to: "start-up", "step", "evaluation", ...
  std::optional<YoungDalyView> young_daly;  // `every_steps: auto` only
  GoodputView goodput;
  std::vector<StragglerView> stragglers;
};

struct JobRecord {
  std::string id;
  int64_t seq = 0;  // submission order (FIFO within a priority); the number in the id
  std::string name;
  std::string spec_yaml;
  JobState state = JobState::kQueued;
  int priority = 0;
  JobRequirements requirements;
  std::string user;
  std::map<std::string, std::string> labels;
  std::string client_request_id;
  absl::Time created = absl::InfinitePast();
  absl::Time started = absl::InfinitePast();   // first STARTING
  absl::Time finished = absl::InfinitePast();  // final state reached
  int attempts = 0;
  int restarts = 0;
  int current_attempt = 0;  // 0: none yet
  Progress progress;
  CheckpointInfo last_checkpoint;  // the newest committed (by step); path empty: none
  bool cancel_requested = false;
  bool drain_requested = false;
  std::string message;  // why it failed, was cancelled or drained
  // While it waits in the queue: why it is not placed (Scheduler::WaitReason). Not stored.
  std::string waiting;
  JobHealth health;  // filled in by the supervisor when the job is read; never stored
  // Its goodput account and Young–Daly estimates (a serialized stored::JobAccounts; empty: none
  // yet): stored with the job so that a coordinator restart keeps them; never shown.
  std::string accounts;
};

struct RankExit {
  int exit_code = 0;
  int signal = 0;
  int64_t pid = 0;
  absl::Time exited = absl::InfinitePast();
  std::vector<std::string> last_log_lines;
  std::string message;   // "node lost", "exec failed: ..."
  bool stopped = false;  // it followed a stop order (cancel, drain, the attempt's end)

  bool Succeeded() const { return exit_code == 0 && signal == 0; }
};

struct RankSlot {
  int rank = 0;
  std::string node_id;
  std::string hostname;
  int slot = 0;
  int local_rank = 0;
  int64_t pid = 0;               // 0 until the agent reports the worker started
  std::optional<RankExit> exit;  // set once the rank has ended
};

struct AttemptRecord {
  std::string job_id;
  int attempt_id = 0;
  AttemptState state = AttemptState::kStarting;
  Mesh mesh;
  DeviceKind kind = DeviceKind::kCpu;
  std::vector<RankSlot> ranks;  // indexed by rank
  absl::Time created = absl::InfinitePast();
  absl::Time running = absl::InfinitePast();
  absl::Time finished = absl::InfinitePast();
  std::string cause;
  // A failed attempt: its class (server/restart_policy.h names) and the rank blamed (-1: none).
  std::string failure_class;
  int blamed_rank = -1;
};

// True once every rank of `attempt` has exited (an attempt ends only then).
bool AllRanksExited(const AttemptRecord& attempt);

struct EventRecord {
  int64_t id = 0;  // assigned by the store
  std::string job_id;
  int attempt_id = 0;
  absl::Time time = absl::InfinitePast();
  JobState from = JobState::kQueued;
  JobState to = JobState::kQueued;
  std::string kind;
  std::string cause;
};

struct GpuInfo {
  int index = 0;
  std::string name;
  int64_t memory_bytes = 0;
};

// A node as last registered; persisted so that `ListNodes` and metrics know nodes that are gone.
struct NodeRecord {
  std::string node_id;
  std::string hostname;
  int cpu_slots = 0;
  std::vector<GpuInfo> gpus;
  // The node's physical memory (what its CPU ranks share); reported at each registration, not
  // stored; 0: not reported.
  int64_t memory_bytes = 0;
  absl::Time registered = absl::InfinitePast();
  absl::Time last_seen = absl::InfinitePast();
  // The agent's memory tier service (empty: none); reported at each registration, not stored.
  std::string memory_tier_address;
  int64_t memory_tier_budget_bytes = 0;
  std::string instance_id;  // of the agent process (RegisterAgent.instance_id); not stored
};

// The memory of the node's smallest GPU that reports it; 0: none does.
int64_t SmallestGpuMemory(const NodeRecord& node);

// "j-000042" for seq 42.
std::string JobIdForSeq(int64_t seq);

// The cause an event records for a user's request: "<what> by <user>" and ": <reason>" when
// given; without a user, the reason alone, else `anonymous`.
std::string RequestCause(const std::string& what, const std::string& anonymous,
                         const std::string& user, const std::string& reason);

}  // namespace trainyard::server

#endif  // TRAINYARD_SERVER_TYPES_H_
