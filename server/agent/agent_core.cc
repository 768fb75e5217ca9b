#include "server/agent/agent_core.h"

#include <signal.h>

#include <algorithm>
#include <cctype>
#include <string_view>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "common/status.h"
#include "server/agent/log_files.h"

namespace trainyard::server::agent {
namespace {

constexpr int kExitLogLines = 20;
constexpr int64_t kLogChunkBytes = 64 << 10;
constexpr int kLogChunksPerTick = 16;
constexpr int kLaunchFailureExitCode = 127;

std::string DirectoryOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

WorkerKey KeyOf(const std::string& job_id, int attempt_id, int rank) {
  return WorkerKey{job_id, attempt_id, rank};
}

}  // namespace

namespace {

bool MatchesPattern(const std::string& name, std::string_view pattern) {
  if (!pattern.empty() && pattern.back() == '*') {
    pattern.remove_suffix(1);
    return name.size() > pattern.size() && name.compare(0, pattern.size(), pattern) == 0;
  }
  return name == pattern;
}

}  // namespace

bool IsAllowedWorkerVariable(const std::string& name, const std::vector<std::string>& extra) {
  for (const char* pattern : kDefaultWorkerVariables) {
    if (MatchesPattern(name, pattern)) return true;
  }
  for (const std::string& pattern : extra) {
    if (MatchesPattern(name, pattern)) return true;
  }
  return false;
}

bool IsValidVariablePattern(const std::string& pattern) {
  std::string_view body = pattern;
  if (!body.empty() && body.back() == '*') body.remove_suffix(1);
  if (body.empty() || std::isdigit(static_cast<unsigned char>(body[0]))) return false;
  for (char c : body) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_') return false;
  }
  return true;
}

AgentCore::AgentCore(AgentConfig config, ProcessLauncher* launcher, FileSystem* fs, Clock* clock)
    : config_(std::move(config)), launcher_(launcher), fs_(fs), clock_(clock) {}

std::string AgentCore::LogPath(const WorkerKey& key) const {
  return absl::StrCat(config_.work_dir, "/logs/", key.job_id, "/attempt-", key.attempt_id, "/rank-",
                      key.rank, ".log");
}

std::string AgentCore::ExitStatusPath(const WorkerKey& key) const {
  return absl::StrCat(config_.work_dir, "/logs/", key.job_id, "/attempt-", key.attempt_id, "/rank-",
                      key.rank, ".exit");
}

int64_t AgentCore::NowUnixMs() const { return absl::ToUnixMillis(clock_->Now()); }

absl::Status AgentCore::Recover() {
  TY_RETURN_IF_ERROR(fs_->CreateDirs(config_.work_dir + "/logs"));
  const std::string path = config_.work_dir + "/workers";
  if (!fs_->Exists(path)) return absl::OkStatus();
  TY_ASSIGN_OR_RETURN(const std::string text, fs_->ReadFile(path));
  absl::StatusOr<std::vector<WorkerRecord>> records = ParseWorkerRecords(text);
  if (!records.ok()) {
    TY_LOG(WARNING) << "ignoring unreadable worker records " << path << ": " << records.status();
    return absl::OkStatus();
  }
  absl::MutexLock lock(&mu_);
  for (const WorkerRecord& record : *records) {
    if (launcher_->IsAlive(record.process)) {
      TY_LOG(INFO) << "adopting worker " << record.key.job_id << "/" << record.key.attempt_id
                   << " rank " << record.key.rank << " (pid " << record.process.pid << ")";
      workers_[record.key] = Worker{.record = record};
      if (config_.progress_relay != nullptr) {
        config_.progress_relay->AddRank(record.key.job_id, record.key.attempt_id, record.key.rank);
      }
    } else {
      ReportExit(record.key, record.process.pid, ExitOfAdopted(record.key),
                 "ended while the agent was down");
    }
  }
  SaveRecords();
  return absl::OkStatus();
}

v1::RunningWorker AgentCore::RunningMessage(const WorkerRecord& record) const {
  v1::RunningWorker running;
  running.set_job_id(record.key.job_id);
  running.set_attempt_id(record.key.attempt_id);
  running.set_rank(record.key.rank);
  running.set_pid(record.process.pid);
  running.set_started_unix_ms(record.started_unix_ms);
  return running;
}

v1::AgentMessage AgentCore::Registration() {
  absl::MutexLock lock(&mu_);
  connected_ = true;
  if (config_.progress_relay != nullptr) config_.progress_relay->SetConnected(true);
  outgoing_.clear();
  v1::AgentMessage message;
  v1::RegisterAgent* r = message.mutable_registration();
  r->set_node_id(config_.node_id);
  r->set_hostname(config_.hostname);
  r->set_cpu_slots(config_.cpu_slots);
  r->set_memory_bytes(config_.memory_bytes);
  for (const v1::GpuInfo& gpu : config_.gpus) *r->add_gpus() = gpu;
  r->set_agent_version(config_.version);
  r->set_instance_id(config_.instance_id);
  r->set_accepts_start_batches(true);
  if (config_.memory_tier != nullptr) {
    r->set_memory_tier_address(config_.memory_tier_address);
    r->set_memory_tier_budget_bytes(config_.memory_tier->budget_bytes());
  }
  for (const auto& [key, worker] : workers_) *r->add_running() = RunningMessage(worker.record);
  for (v1::WorkerExited& exit : unreported_exits_) {
    *r->add_exited_while_disconnected() = exit;
    exits_in_registration_.push_back(std::move(exit));
  }
  unreported_exits_.clear();
  return message;
}

void AgentCore::OnDisconnected() {
  absl::MutexLock lock(&mu_);
  connected_ = false;
  if (config_.progress_relay != nullptr) config_.progress_relay->SetConnected(false);
  for (v1::AgentMessage& message : outgoing_) {
    if (message.has_exited()) unreported_exits_.push_back(std::move(*message.mutable_exited()));
  }
  outgoing_.clear();
  // The coordinator never acknowledged them: report them again.
  for (v1::WorkerExited& exit : exits_in_registration_)
    unreported_exits_.push_back(std::move(exit));
  exits_in_registration_.clear();
  log_requests_.clear();
}

void AgentCore::ReturnUnsent(std::vector<v1::AgentMessage> messages) {
  absl::MutexLock lock(&mu_);
  for (v1::AgentMessage& message : messages) {
    if (message.has_exited()) unreported_exits_.push_back(std::move(*message.mutable_exited()));
  }
}

void AgentCore::AdmitAndStart(const v1::StartWorker& order) {
  if (config_.memory_tier != nullptr) {
    config_.memory_tier->SetPeer(
        order.job_id(), order.memory_peer_address(),
        {order.memory_tier_addresses().begin(), order.memory_tier_addresses().end()});
    config_.memory_tier->AdmitSecret(order.job_id(), order.attempt_secret());
  }
  if (config_.progress_relay != nullptr) {
    config_.progress_relay->Admit(order.job_id(), order.attempt_id(), order.attempt_secret());
  }
  Start(order);
}

void AgentCore::AdmitAdopted(const v1::AttemptSecret& adopted) {
  if (config_.memory_tier != nullptr) {
    // An adopted worker's snapshots go on to the peer its StartWorker order named.
    config_.memory_tier->AdoptPeer(
        adopted.job_id(), adopted.memory_peer_address(),
        {adopted.memory_tier_addresses().begin(), adopted.memory_tier_addresses().end()});
    if (!adopted.secret().empty())
      config_.memory_tier->AdmitSecret(adopted.job_id(), adopted.secret());
  }
  if (config_.progress_relay != nullptr && !adopted.secret().empty()) {
    config_.progress_relay->Admit(adopted.job_id(), adopted.attempt_id(), adopted.secret());
  }
}

void AgentCore::Handle(const v1::CoordinatorMessage& message) {
  absl::MutexLock lock(&mu_);
  switch (message.msg_case()) {
    case v1::CoordinatorMessage::kRegistered:
      if (message.registered().heartbeat_interval_ms() > 0) {
        heartbeat_interval_ = absl::Milliseconds(message.registered().heartbeat_interval_ms());
      }
      exits_in_registration_.clear();
      for (const v1::AttemptSecret& a : message.registered().attempt_secrets()) AdmitAdopted(a);
      break;
    case v1::CoordinatorMessage::kStart:
      AdmitAndStart(message.start());
      break;
    case v1::CoordinatorMessage::kStartBatch:
      for (const v1::StartWorker& order : message.start_batch().workers()) AdmitAndStart(order);
      break;
    case v1::CoordinatorMessage::kProgressAnswers:
      if (config_.progress_relay != nullptr) {
        config_.progress_relay->OnAnswers(message.progress_answers());
      }
      break;
    case v1::CoordinatorMessage::kReleaseMemory:
      if (config_.memory_tier != nullptr) {
        config_.memory_tier->Release(message.release_memory().job_id());
      }
      if (config_.progress_relay != nullptr) {
        config_.progress_relay->ForgetJob(message.release_memory().job_id());
      }
      break;
    case v1::CoordinatorMessage::kStop:
      Stop(message.stop());
      break;
    case v1::CoordinatorMessage::kReadLogs:
      StartReadingLog(message.read_logs());
      break;
    case v1::CoordinatorMessage::kCancelReadLogs:
      log_requests_.erase(message.cancel_read_logs().request_id());
      break;
    case v1::CoordinatorMessage::MSG_NOT_SET:
      TY_LOG(WARNING) << "ignoring an empty message from the coordinator";
      break;
  }
}

absl::StatusOr<std::vector<std::string>> AgentCore::WorkerEnvironment(const v1::StartWorker& order,
                                                                      const WorkerKey& key) const {
  std::map<std::string, std::string> env;
  for (const auto& [name, value] : config_.environment) {
    if (IsAllowedWorkerVariable(name, config_.pass_env)) env[name] = value;
  }
  for (const auto& [name, value] : order.env()) {
    if (!IsAllowedWorkerVariable(name, config_.pass_env)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "environment variable ", name, " is not allowed for workers (only ",
          absl::StrJoin(kDefaultWorkerVariables, ", "), config_.pass_env.empty() ? "" : ", ",
          absl::StrJoin(config_.pass_env, ", "), "; trainyard-agent --pass-env adds more)"));
    }
    env[name] = value;
  }
  if (order.gpu()) {
    env["CUDA_VISIBLE_DEVICES"] = absl::StrCat(order.slot());
  } else if (!env.count("OMP_NUM_THREADS")) {
    env["OMP_NUM_THREADS"] = absl::StrCat(std::max(1, config_.threads_per_cpu_worker));
  }
  env["TRAINYARD_NODE_ID"] = config_.node_id;
  env["TRAINYARD_LOCAL_RANK"] = absl::StrCat(order.local_rank());
  env["TRAINYARD_SLOT"] = absl::StrCat(order.slot());
  env["TRAINYARD_EXIT_STATUS_FILE"] = ExitStatusPath(key);
  // The worker's credential comes from the coordinator's order only, never from a job's spec.
  env.erase(rpc::kAttemptSecretVariable);
  if (!order.attempt_secret().empty()) env[rpc::kAttemptSecretVariable] = order.attempt_secret();
  if (config_.memory_tier != nullptr) {
    env["TRAINYARD_MEMORY_TIER"] = config_.memory_tier_local_address;
  } else {
    env.erase("TRAINYARD_MEMORY_TIER");
  }
  if (config_.progress_relay != nullptr) {
    env[rpc::kProgressRelayVariable] = config_.progress_relay_address;
  } else {
    env.erase(rpc::kProgressRelayVariable);
  }
  // The agent's own credentials, never a job's: a spec cannot point its workers elsewhere.
  const std::pair<const char*, const std::string*> tls[] = {
      {rpc::kTlsCaVariable, &config_.tls.ca},
      {rpc::kTlsCertVariable, &config_.tls.cert},
      {rpc::kTlsKeyVariable, &config_.tls.key}};
  for (const auto& [name, path] : tls) {
    if (path->empty()) {
      env.erase(name);
    } else {
      env[name] = *path;
    }
  }
  if (!config_.gloo_hostname.empty()) env["TRAINYARD_GLOO_HOSTNAME"] = config_.gloo_hostname;
  std::vector<std::string> list;
  for (const auto& [name, value] : env) list.push_back(absl::StrCat(name, "=", value));
  return list;
}

void AgentCore::ReportLaunchFailure(const v1::StartWorker& order, const std::string& message) {
  TY_LOG(WARNING) << "cannot start " << order.job_id() << "/" << order.attempt_id() << " rank "
                  << order.rank() << ": " << message;
  v1::AgentMessage out;
  v1::WorkerExited* exited = out.mutable_exited();
  exited->set_job_id(order.job_id());
  exited->set_attempt_id(order.attempt_id());
  v1::RankExit* exit = exited->mutable_exit();
  exit->set_rank(order.rank());
  exit->set_node_id(config_.node_id);
  exit->set_hostname(config_.hostname);
  exit->set_exit_code(kLaunchFailureExitCode);
  exit->set_pid(0);
  exit->set_exited_unix_ms(NowUnixMs());
  exit->set_message(message);
  Emit(std::move(out));
}

void AgentCore::Start(const v1::StartWorker& order) {
  if (!IsSafeJobId(order.job_id()) || order.attempt_id() < 0 || order.rank() < 0) {
    ReportLaunchFailure(order,
                        absl::StrCat("invalid worker identity: job '", order.job_id(), "' attempt ",
                                     order.attempt_id(), " rank ", order.rank()));
    return;
  }
  const WorkerKey key = KeyOf(order.job_id(), order.attempt_id(), order.rank());
  if (workers_.count(key)) return;  // already running: the order is idempotent
  absl::StatusOr<std::vector<std::string>> env = WorkerEnvironment(order, key);
  if (!env.ok()) {
    ReportLaunchFailure(order, std::string(env.status().message()));
    return;
  }
  const std::string log_path = LogPath(key);
  if (absl::Status made = fs_->CreateDirs(DirectoryOf(log_path)); !made.ok()) {
    ReportLaunchFailure(order, std::string(made.message()));
    return;
  }
  if (fs_->Exists(ExitStatusPath(key))) (void)fs_->RemoveFile(ExitStatusPath(key));
  LaunchRequest request;
  request.argv = {config_.worker_binary,
                  "--coordinator",
                  order.coordinator_address(),
                  "--job",
                  order.job_id(),
                  "--attempt",
                  absl::StrCat(order.attempt_id()),
                  "--rank",
                  absl::StrCat(order.rank())};
  request.env = *std::move(env);
  request.log_path = log_path;
  // Until the worker's own handler is in place (worker/termination.h): a SIGTERM that comes
  // earlier waits for it instead of ending the worker.
  request.blocked_signals = {SIGTERM};
  absl::StatusOr<ProcessId> process = launcher_->Launch(request);
  if (!process.ok()) {
    ReportLaunchFailure(order, std::string(process.status().message()));
    return;
  }
  TY_LOG(INFO) << "started " << key.job_id << "/" << key.attempt_id << " rank " << key.rank
               << " as pid " << process->pid;
  workers_[key] = Worker{
      .record = WorkerRecord{.key = key, .process = *process, .started_unix_ms = NowUnixMs()}};
  if (config_.progress_relay != nullptr) {
    config_.progress_relay->AddRank(key.job_id, key.attempt_id, key.rank);
  }
  SaveRecords();
  v1::AgentMessage out;
  v1::WorkerStarted* started = out.mutable_started();
  started->set_job_id(key.job_id);
  started->set_attempt_id(key.attempt_id);
  started->set_rank(key.rank);
  started->set_pid(process->pid);
  Emit(std::move(out));
}

void AgentCore::Stop(const v1::StopWorkers& order) {
  const int64_t now = clock_->NowNanosMonotonic();
  const int64_t grace_nanos = std::max<int64_t>(0, order.grace_period_ms()) * 1'000'000;
  for (auto& [key, worker] : workers_) {
    if (key.job_id != order.job_id() || key.attempt_id != order.attempt_id()) continue;
    if (!order.ranks().empty() &&
        std::find(order.ranks().begin(), order.ranks().end(), key.rank) == order.ranks().end()) {
      continue;
    }
    if (worker.stopping) continue;  // the first order's deadline stands
    worker.stopping = true;
    worker.stop_reason = order.reason();
    worker.kill_at_nanos = now + grace_nanos;
    const int signal = grace_nanos == 0 ? SIGKILL : SIGTERM;
    worker.killed = signal == SIGKILL;
    if (absl::Status sent = launcher_->SignalGroup(worker.record.process, signal); !sent.ok()) {
      TY_LOG(WARNING) << sent;
    }
  }
}

ProcessExit AgentCore::ExitOfAdopted(const WorkerKey& key) const {
  absl::StatusOr<std::string> text = fs_->ReadFile(ExitStatusPath(key));
  int code = 0;
  if (text.ok() && absl::SimpleAtoi(absl::StripAsciiWhitespace(*text), &code)) {
    return ProcessExit{.exit_code = code};
  }
  return ProcessExit{.known = false, .exit_code = -1};
}

void AgentCore::ReportExit(const WorkerKey& key, int64_t pid, const ProcessExit& process_exit,
                           const std::string& message, bool stopped) {
  v1::AgentMessage out;
  v1::WorkerExited* exited = out.mutable_exited();
  exited->set_job_id(key.job_id);
  exited->set_attempt_id(key.attempt_id);
  v1::RankExit* exit = exited->mutable_exit();
  exit->set_rank(key.rank);
  exit->set_node_id(config_.node_id);
  exit->set_hostname(config_.hostname);
  exit->set_exit_code(process_exit.known ? process_exit.exit_code : -1);
  exit->set_signal(process_exit.signal);
  exit->set_pid(pid);
  exit->set_exited_unix_ms(NowUnixMs());
  if (absl::StatusOr<std::vector<std::string>> lines = LastLines(LogPath(key), kExitLogLines);
      lines.ok()) {
    for (std::string& line : *lines) exit->add_last_log_lines(std::move(line));
  }
  std::string why = message;
  if (!process_exit.known) {
    absl::StrAppend(&why, why.empty() ? "" : "; ",
                    "its exit status is unknown (it was not this agent's child and left none)");
  }
  exit->set_message(why);
  exit->set_stopped(stopped);
  TY_LOG(INFO) << key.job_id << "/" << key.attempt_id << " rank " << key.rank << " (pid " << pid
               << ") exited: code " << exit->exit_code() << " signal " << exit->signal()
               << (why.empty() ? "" : " - ") << why;
  // The coordinator hears of the rank's last reports before its exit.
  EmitProgress(/*force=*/true);
  if (config_.progress_relay != nullptr) {
    config_.progress_relay->RemoveRank(key.job_id, key.attempt_id, key.rank);
  }
  Emit(std::move(out));
}

void AgentCore::Tick() {
  absl::MutexLock lock(&mu_);
  if (config_.memory_tier != nullptr) {
    for (auto& [job, text] : config_.memory_tier->TakeNotices()) {
      TY_LOG(WARNING) << job << ": " << text;
      v1::AgentMessage out;
      out.mutable_tier_notice()->set_job_id(job);
      out.mutable_tier_notice()->set_message(std::move(text));
      Emit(std::move(out));
    }
  }
  EmitProgress(/*force=*/false);
  const int64_t now = clock_->NowNanosMonotonic();
  bool changed = false;
  // Exits seen in this tick are reported those by a signal first: when a killed rank takes its
  // peers down with it, they exit within the same moment, and the coordinator blames the first
  // failure it hears of.
  struct Reaped {
    WorkerKey key;
    int64_t pid;
    ProcessExit exit;
    std::string message;
    bool stopped;
  };
  std::vector<Reaped> reaped;
  for (auto it = workers_.begin(); it != workers_.end();) {
    Worker& worker = it->second;
    std::optional<ProcessExit> exit = launcher_->Poll(worker.record.process);
    if (exit) {
      if (!exit->known) exit = ExitOfAdopted(it->first);
      std::string message;
      if (worker.stopping) {
        message = absl::StrCat("stopped by the coordinator", worker.stop_reason.empty() ? "" : ": ",
                               worker.stop_reason,
                               worker.killed ? " (killed after the grace period)" : "");
      }
      reaped.push_back(
          {it->first, worker.record.process.pid, *exit, std::move(message), worker.stopping});
      it = workers_.erase(it);
      changed = true;
      continue;
    }
    if (worker.stopping && !worker.killed && now >= worker.kill_at_nanos) {
      worker.killed = true;
      if (absl::Status sent = launcher_->SignalGroup(worker.record.process, SIGKILL); !sent.ok()) {
        TY_LOG(WARNING) << sent;
      }
    }
    ++it;
  }
  std::stable_sort(reaped.begin(), reaped.end(), [](const Reaped& a, const Reaped& b) {
    return (a.exit.signal != 0) > (b.exit.signal != 0);
  });
  for (const Reaped& r : reaped) ReportExit(r.key, r.pid, r.exit, r.message, r.stopped);
  if (changed) SaveRecords();
  for (auto it = log_requests_.begin(); it != log_requests_.end();) {
    it = PumpLog(it->second) ? log_requests_.erase(it) : std::next(it);
  }
}

void AgentCore::FinishLogWithError(const v1::ReadLogs& order, const std::string& error) {
  v1::AgentMessage out;
  v1::LogData* data = out.mutable_log();
  data->set_request_id(order.request_id());
  data->set_rank(order.rank());
  data->set_done(true);
  data->set_error(error);
  Emit(std::move(out));
}

void AgentCore::StartReadingLog(const v1::ReadLogs& order) {
  LogRequest request{.order = order};
  if (!IsSafeJobId(order.job_id())) {
    FinishLogWithError(order, absl::StrCat("invalid job id '", order.job_id(), "'"));
    return;
  }
  const WorkerKey key = KeyOf(order.job_id(), order.attempt_id(), order.rank());
  request.path = LogPath(key);
  if (!fs_->Exists(request.path) && !workers_.count(key)) {
    FinishLogWithError(
        order, absl::StrCat("no log for job ", key.job_id, " attempt ", key.attempt_id, " rank ",
                            key.rank, " on node ", config_.node_id));
    return;
  }
  if (order.tail_lines() > 0) {
    absl::StatusOr<int64_t> offset = OffsetOfLastLines(request.path, order.tail_lines());
    if (offset.ok()) request.offset = *offset;
  }
  if (!PumpLog(request)) log_requests_[order.request_id()] = std::move(request);
}

bool AgentCore::PumpLog(LogRequest& request) {
  const v1::ReadLogs& order = request.order;
  const WorkerKey key = KeyOf(order.job_id(), order.attempt_id(), order.rank());
  const bool running = workers_.count(key) > 0;
  for (int chunk = 0; chunk < kLogChunksPerTick; ++chunk) {
    absl::StatusOr<std::string> data = ReadRange(request.path, request.offset, kLogChunkBytes);
    v1::AgentMessage out;
    v1::LogData* log = out.mutable_log();
    log->set_request_id(order.request_id());
    log->set_rank(order.rank());
    if (!data.ok()) {
      if (absl::IsNotFound(data.status()) && running) return false;  // not written yet
      log->set_done(true);
      log->set_error(std::string(data.status().message()));
      Emit(std::move(out));
      return true;
    }
    if (data->empty()) {
      if (order.follow() && running) return false;
      log->set_done(true);
      Emit(std::move(out));
      return true;
    }
    request.offset += static_cast<int64_t>(data->size());
    log->set_data(*std::move(data));
    Emit(std::move(out));
  }
  return false;  // more next tick
}

v1::AgentMessage AgentCore::Heartbeat(const v1::ProgressBatch* batch) {
  std::set<WorkerKey> reported;
  if (batch != nullptr) {
    for (const v1::ProgressReport& report : batch->reports()) {
      reported.insert(WorkerKey{report.job_id(), report.attempt_id(), report.rank()});
    }
  }
  absl::MutexLock lock(&mu_);
  v1::AgentMessage message;
  v1::Heartbeat* heartbeat = message.mutable_heartbeat();
  heartbeat->set_sent_unix_ms(NowUnixMs());
  heartbeat->set_omits_reported(batch != nullptr);
  for (const auto& [key, worker] : workers_) {
    if (reported.count(key) == 0) *heartbeat->add_running() = RunningMessage(worker.record);
  }
  return message;
}

std::vector<v1::AgentMessage> AgentCore::TakeOutgoing() {
  absl::MutexLock lock(&mu_);
  std::vector<v1::AgentMessage> taken;
  taken.swap(outgoing_);
  return taken;
}

void AgentCore::Emit(v1::AgentMessage message) {
  if (connected_) {
    outgoing_.push_back(std::move(message));
  } else if (message.has_exited()) {
    unreported_exits_.push_back(std::move(*message.mutable_exited()));
  }
}

void AgentCore::EmitProgress(bool force) {
  if (config_.progress_relay == nullptr || !connected_) return;
  std::optional<v1::ProgressBatch> batch = config_.progress_relay->TakeBatch(force);
  if (!batch) return;
  v1::AgentMessage out;
  *out.mutable_progress() = *std::move(batch);
  outgoing_.push_back(std::move(out));
}

void AgentCore::SaveRecords() {
  std::vector<WorkerRecord> records;
  for (const auto& [key, worker] : workers_) records.push_back(worker.record);
  if (absl::Status saved =
          fs_->WriteFileAtomic(config_.work_dir + "/workers", SerializeWorkerRecords(records));
      !saved.ok()) {
    TY_LOG(ERROR) << "cannot record running workers: " << saved;
  }
}

absl::Duration AgentCore::heartbeat_interval() const {
  absl::MutexLock lock(&mu_);
  return heartbeat_interval_;
}

bool AgentCore::connected() const {
  absl::MutexLock lock(&mu_);
  return connected_;
}

int AgentCore::TerminateWorkers() {
  absl::MutexLock lock(&mu_);
  int signalled = 0;
  for (auto& [key, worker] : workers_) {
    if (worker.terminated) continue;
    worker.terminated = true;
    if (absl::Status sent = launcher_->SignalGroup(worker.record.process, SIGTERM); !sent.ok()) {
      TY_LOG(WARNING) << sent;
      continue;
    }
    ++signalled;
  }
  return signalled;
}

std::vector<WorkerRecord> AgentCore::running_workers() const {
  absl::MutexLock lock(&mu_);
  std::vector<WorkerRecord> records;
  for (const auto& [key, worker] : workers_) records.push_back(worker.record);
  return records;
}

}  // namespace trainyard::server::agent
