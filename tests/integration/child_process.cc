#include "tests/integration/child_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <thread>

#include "common/process.h"

namespace trainyard::testenv {

ChildProcess::ChildProcess(const std::vector<std::string>& argv, const std::string& stdout_path,
                           const std::string& stderr_path, const std::vector<std::string>& env) {
  absl::StatusOr<pid_t> pid = Spawn({.argv = argv,
                                     .extra_env = env,
                                     .stdout_path = stdout_path,
                                     .stderr_path = stderr_path,
                                     .keep_stdin = true});
  if (pid.ok()) {
    pid_ = *pid;
  } else {
    std::ofstream(stderr_path, std::ios::app) << "spawn: " << pid.status() << "\n";
  }
}

ChildProcess::~ChildProcess() { KillGroup(); }

bool ChildProcess::running() {
  if (pid_ <= 0 || status_.has_value()) return false;
  int status = 0;
  if (waitpid(pid_, &status, WNOHANG) == pid_) {
    status_ = status;
    return false;
  }
  return true;
}

void ChildProcess::Signal(int signal) {
  if (running()) kill(pid_, signal);
}

void ChildProcess::KillGroup() {
  if (pid_ <= 0) return;
  kill(-pid_, SIGKILL);
  if (!status_.has_value()) {
    int status = 0;
    if (waitpid(pid_, &status, 0) == pid_) status_ = status;
  }
}

std::optional<int> ChildProcess::Wait(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (running()) {
    if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return status_;
}

std::string ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

std::string WaitForFileLine(const std::string& path, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    const std::string text = ReadWholeFile(path);
    const size_t newline = text.find('\n');
    if (newline != std::string::npos && newline > 0) return text.substr(0, newline);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return "";
}

}  // namespace trainyard::testenv
