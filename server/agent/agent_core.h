// AgentCore: the node agent's logic, without sockets. It turns the coordinator's orders
// (trainyard.v1.CoordinatorMessage: start/stop workers, read logs) into process launches and
// signals through a ProcessLauncher, watches its workers, and produces the agent's messages
// (trainyard.v1.AgentMessage: registration, heartbeats, worker started/exited, log data) for
// the transport (agent.h) to send.
//
// Workers: each runs `<worker_binary> --coordinator ADDR --job J --attempt A --rank R` (an argv,
// never a shell) as the leader of its own process group, with an allowlisted environment, its
// stdout and stderr appended to <work_dir>/logs/<job>/attempt-<A>/rank-<R>.log. Stopping is
// SIGTERM to the group, then SIGKILL once the grace period has passed. Every exit (code or
// signal, with the last 20 log lines) is reported exactly once: over the stream when connected,
// else in the next registration's exited_while_disconnected.
//
// Restarts: the running workers are recorded in <work_dir>/workers (through the FileSystem seam)
// at every change. Recover() re-adopts those still alive (same pid and start time) and reports
// them in the registration, so that a restarted agent or coordinator never starts a job twice.
// The exit status of an adopted worker, which is no longer this process's child, is read from
// the file named by TRAINYARD_EXIT_STATUS_FILE, which trainyard-worker writes as it exits.
//
// Threading: thread-safe; every public method takes one internal mutex. The transport calls
// Handle from its reading thread and the rest from its loop thread.
#ifndef TRAINYARD_SERVER_AGENT_AGENT_CORE_H_
#define TRAINYARD_SERVER_AGENT_AGENT_CORE_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/filesystem.h"
#include "common/rpc.h"
#include "proto/trainyard.pb.h"
#include "server/agent/memory_tier.h"
#include "server/agent/process_launcher.h"
#include "server/agent/progress_relay.h"
#include "server/agent/worker_records.h"

namespace trainyard::server::agent {

namespace v1 = ::trainyard::v1;

struct AgentConfig {
  std::string node_id;   // non-empty, stable across restarts
  std::string hostname;  // reported to the coordinator
  int cpu_slots = 1;
  std::vector<v1::GpuInfo> gpus;
  int64_t memory_bytes = 0;   // the machine's physical memory, for the coordinator's fit check
  std::string worker_binary;  // absolute path of trainyard-worker
  std::string work_dir;       // logs and the worker records live here
  // The agent's own environment; only the allowed variables reach workers (the defaults and
  // `pass_env`, patterns as IsAllowedWorkerVariable takes them).
  std::map<std::string, std::string> environment;
  std::vector<std::string> pass_env;
  // OMP_NUM_THREADS for CPU workers when neither the environment nor the order sets it.
  int threads_per_cpu_worker = 1;
  std::string version = "trainyard-agent 0.1";
  std::string instance_id;  // new with every start of the agent process
  // The node's memory tier (null: none), and where its service listens: for peers, and for this
  // node's workers (TRAINYARD_MEMORY_TIER).
  MemoryTier* memory_tier = nullptr;
  std::string memory_tier_address;
  std::string memory_tier_local_address;
  // The node's progress relay (null: workers report to the coordinator themselves) and its
  // loopback address (the workers' TRAINYARD_PROGRESS_RELAY).
  ProgressRelay* progress_relay = nullptr;
  std::string progress_relay_address;
  // Given to every worker: its TLS files (TRAINYARD_TLS_*; none when empty) and, when set, the
  // address its collectives listen on (TRAINYARD_GLOO_HOSTNAME).
  rpc::TlsFiles tls;
  std::string gloo_hostname;
};

// The variables that pass from the agent's environment (or a StartWorker order) to its workers
// unless the operator adds more (trainyard-agent --pass-env): the basics of a process, and the
// settings of the libraries a worker computes and communicates with (OpenMP, OpenBLAS, CUDA,
// NCCL, Gloo), which decide its kernels, threads and transports. A pattern is a name, or a
// prefix ending in '*' (which matches longer names only).
inline constexpr const char* kDefaultWorkerVariables[] = {
    "PATH",   "HOME",  "LANG",       "LC_*",   "TZ",     "TMPDIR", "LD_LIBRARY_PATH", "OMP_*",
    "GOMP_*", "KMP_*", "OPENBLAS_*", "CUDA_*", "NCCL_*", "GLOO_*", "TRAINYARD_*"};

// Whether `name` may pass to a worker: it matches a default pattern or one of `extra`.
bool IsAllowedWorkerVariable(const std::string& name, const std::vector<std::string>& extra = {});
// Whether `pattern` is a valid --pass-env pattern: [A-Za-z_][A-Za-z0-9_]*, optionally ending in
// '*'.
bool IsValidVariablePattern(const std::string& pattern);

class AgentCore {
 public:
  // `launcher`, `fs` and `clock` must outlive the core.
  AgentCore(AgentConfig config, ProcessLauncher* launcher, FileSystem* fs, Clock* clock);

  // Creates the work directory and re-adopts the recorded workers that still run; recorded
  // workers that are gone are reported as exited (in the next registration). Call once, first.
  [[nodiscard]] absl::Status Recover();

  // The first message of a new stream: the node and every worker still running, plus the exits
  // seen while disconnected (kept until the coordinator answers with `registered`).
  v1::AgentMessage Registration();
  // The stream ended: messages not yet sent are dropped except exits, which wait for the next
  // registration; log requests end.
  void OnDisconnected();
  // An order from the coordinator.
  void Handle(const v1::CoordinatorMessage& message);
  // Reaps exited workers, sends SIGKILL past the grace period, streams followed logs. Call it
  // often (every 50-100 ms).
  void Tick();
  // With `batch`: the heartbeat to ride on it, which leaves out the workers whose reports the
  // batch carries (Heartbeat.omits_reported).
  v1::AgentMessage Heartbeat(const v1::ProgressBatch* batch = nullptr);
  // The messages produced since the last call, in order.
  std::vector<v1::AgentMessage> TakeOutgoing();
  // Messages the transport took but could not send; exits among them wait for the next
  // registration.
  void ReturnUnsent(std::vector<v1::AgentMessage> messages);

  // Sends SIGTERM to every running worker's process group that it has not sent it yet (the
  // worker's job drains on it, when the coordinator is not stopping the worker itself:
  // worker/termination.h); returns how many it signalled now. Their exits are reported as any
  // exit is.
  int TerminateWorkers();

  absl::Duration heartbeat_interval() const;
  bool connected() const;
  std::vector<WorkerRecord> running_workers() const;

  // Where the log of a rank is written.
  std::string LogPath(const WorkerKey& key) const;
  std::string ExitStatusPath(const WorkerKey& key) const;

 private:
  struct Worker {
    WorkerRecord record;
    bool stopping = false;
    bool killed = false;
    bool terminated = false;    // TerminateWorkers sent it SIGTERM
    int64_t kill_at_nanos = 0;  // monotonic
    std::string stop_reason;
  };
  struct LogRequest {
    v1::ReadLogs order;
    std::string path;
    int64_t offset = 0;
  };

  void Start(const v1::StartWorker& order) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A start order: its attempt's secret admitted by the memory tier and the relay, then Start.
  void AdmitAndStart(const v1::StartWorker& order) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A live attempt of adopted workers, named in the registration's answer: what AdmitAndStart
  // would have admitted from its start orders.
  void AdmitAdopted(const v1::AttemptSecret& adopted) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Stop(const v1::StopWorkers& order) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void StartReadingLog(const v1::ReadLogs& order) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends a log request at once: the log cannot be read, and why.
  void FinishLogWithError(const v1::ReadLogs& order, const std::string& error)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sends what is new in `request`'s log; true when the request is finished.
  bool PumpLog(LogRequest& request) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  [[nodiscard]] absl::StatusOr<std::vector<std::string>> WorkerEnvironment(
      const v1::StartWorker& order, const WorkerKey& key) const;
  // `stopped`: the worker exited after a stop order (not a failure of its own).
  void ReportExit(const WorkerKey& key, int64_t pid, const ProcessExit& exit,
                  const std::string& message, bool stopped = false)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReportLaunchFailure(const v1::StartWorker& order, const std::string& message)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  ProcessExit ExitOfAdopted(const WorkerKey& key) const;
  void Emit(v1::AgentMessage message) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sends the relay's batch when one is due (`force`: whatever is pending).
  void EmitProgress(bool force) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SaveRecords() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  v1::RunningWorker RunningMessage(const WorkerRecord& record) const;
  int64_t NowUnixMs() const;

  const AgentConfig config_;
  ProcessLauncher* const launcher_;
  FileSystem* const fs_;
  Clock* const clock_;

  mutable absl::Mutex mu_;
  bool connected_ ABSL_GUARDED_BY(mu_) = false;
  absl::Duration heartbeat_interval_ ABSL_GUARDED_BY(mu_) = absl::Seconds(1);
  std::map<WorkerKey, Worker> workers_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::WorkerExited> unreported_exits_ ABSL_GUARDED_BY(mu_);
  // Exits in the registration of the current stream, dropped once the coordinator answers.
  std::vector<v1::WorkerExited> exits_in_registration_ ABSL_GUARDED_BY(mu_);
  std::map<int64_t, LogRequest> log_requests_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::AgentMessage> outgoing_ ABSL_GUARDED_BY(mu_);
};

}  // namespace trainyard::server::agent

#endif  // TRAINYARD_SERVER_AGENT_AGENT_CORE_H_
