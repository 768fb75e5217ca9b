// ChildProcess: a long-running child for integration tests (a coordinator, an agent). Started
// from an argv (no shell) in its own process group, stdout and stderr appended to files; the
// destructor kills the whole group with SIGKILL and reaps the child, so a failing test leaves no
// process behind.
#ifndef TRAINYARD_TESTS_INTEGRATION_CHILD_PROCESS_H_
#define TRAINYARD_TESTS_INTEGRATION_CHILD_PROCESS_H_

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace trainyard::testenv {

class ChildProcess {
 public:
  // Starts argv[0] with `argv`; output goes to `stdout_path` / `stderr_path` (appended). `env`
  // entries ("NAME=value") are added to this process's environment. Check running() after.
  ChildProcess(const std::vector<std::string>& argv, const std::string& stdout_path,
               const std::string& stderr_path, const std::vector<std::string>& env = {});
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const { return pid_; }
  // True until the child has been reaped.
  bool running();
  // Sends `signal` to the child only (not its group).
  void Signal(int signal);
  // Sends SIGKILL to the child's process group and reaps the child.
  void KillGroup();
  // Waits up to `timeout` for the child to exit; its wait status, or nullopt on timeout.
  std::optional<int> Wait(std::chrono::milliseconds timeout);

 private:
  pid_t pid_ = -1;
  std::optional<int> status_;
};

// Polls `path` until it exists and holds a non-empty first line (e.g. <state-dir>/server.addr);
// returns that line, or "" after `timeout`.
std::string WaitForFileLine(const std::string& path, std::chrono::milliseconds timeout);

// Reads a whole file ("" when missing).
std::string ReadWholeFile(const std::string& path);

}  // namespace trainyard::testenv

#endif  // TRAINYARD_TESTS_INTEGRATION_CHILD_PROCESS_H_
