#include "server/agent/fake_process_launcher.h"

#include <signal.h>

namespace trainyard::server::agent {

absl::StatusOr<ProcessId> FakeProcessLauncher::Launch(const LaunchRequest& request) {
  absl::MutexLock lock(&mu_);
  if (next_failure_) {
    absl::Status failure = *next_failure_;
    next_failure_.reset();
    return failure;
  }
  launches_.push_back(request);
  const ProcessId id{next_pid_++, 7};
  processes_[id.pid] = Process{.id = id};
  return id;
}

std::optional<ProcessExit> FakeProcessLauncher::Poll(const ProcessId& id) {
  absl::MutexLock lock(&mu_);
  auto it = processes_.find(id.pid);
  if (it == processes_.end()) return ProcessExit{.known = false};
  Process& p = it->second;
  if (p.reaped) return ProcessExit{.known = false};
  if (!p.exit) return std::nullopt;
  p.reaped = true;
  return p.foreign ? ProcessExit{.known = false} : *p.exit;
}

absl::Status FakeProcessLauncher::SignalGroup(const ProcessId& id, int signal) {
  absl::MutexLock lock(&mu_);
  auto it = processes_.find(id.pid);
  if (it == processes_.end() || it->second.exit) return absl::OkStatus();
  Process& p = it->second;
  signals_.emplace_back(id.pid, signal);
  if (signal == SIGKILL || (signal == SIGTERM && !p.ignore_term)) {
    p.exit = ProcessExit{.signal = signal};
  }
  return absl::OkStatus();
}

bool FakeProcessLauncher::IsAlive(const ProcessId& id) {
  absl::MutexLock lock(&mu_);
  auto it = processes_.find(id.pid);
  return it != processes_.end() && !it->second.exit && it->second.id.start_ticks == id.start_ticks;
}

void FakeProcessLauncher::FailNextLaunch(absl::Status status) {
  absl::MutexLock lock(&mu_);
  next_failure_ = std::move(status);
}

void FakeProcessLauncher::Exit(int64_t pid, ProcessExit exit) {
  absl::MutexLock lock(&mu_);
  auto it = processes_.find(pid);
  if (it != processes_.end() && !it->second.exit) it->second.exit = exit;
}

void FakeProcessLauncher::IgnoreTerm(int64_t pid) {
  absl::MutexLock lock(&mu_);
  processes_[pid].ignore_term = true;
}

void FakeProcessLauncher::AddForeignProcess(ProcessId id) {
  absl::MutexLock lock(&mu_);
  processes_[id.pid] = Process{.id = id, .foreign = true};
}

void FakeProcessLauncher::Vanish(int64_t pid) { Exit(pid, ProcessExit{.known = false}); }

std::vector<LaunchRequest> FakeProcessLauncher::launches() const {
  absl::MutexLock lock(&mu_);
  return launches_;
}

std::vector<std::pair<int64_t, int>> FakeProcessLauncher::signals() const {
  absl::MutexLock lock(&mu_);
  return signals_;
}

bool FakeProcessLauncher::running(int64_t pid) const {
  absl::MutexLock lock(&mu_);
  auto it = processes_.find(pid);
  return it != processes_.end() && !it->second.exit;
}

}  // namespace trainyard::server::agent
