// The process seam of the node agent: start a worker (argv, no shell) in its own process group
// with its output in a log file, observe how it ended, and signal its group. The agent's logic
// (AgentCore) only talks to this interface, so it is unit-tested with FakeProcessLauncher and no
// processes; RealProcessLauncher does fork/exec.
//
// A process is named by its pid and its start time (clock ticks since boot, from
// /proc/<pid>/stat), so that a pid the kernel has reused is never mistaken for a worker.
//
// Threading: implementations are thread-safe.
#ifndef TRAINYARD_SERVER_AGENT_PROCESS_LAUNCHER_H_
#define TRAINYARD_SERVER_AGENT_PROCESS_LAUNCHER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace trainyard::server::agent {

struct LaunchRequest {
  // argv[0] is the program's path, executed as is: no PATH search, no shell.
  std::vector<std::string> argv;
  // The whole environment, "NAME=value" each; nothing else is inherited.
  std::vector<std::string> env;
  // stdout and stderr are appended to this file (created 0644 when missing); stdin is /dev/null.
  std::string log_path;
  // Signals blocked in the process across exec, for a program that installs its own handler for
  // them first (a worker's SIGTERM: worker/termination.h).
  std::vector<int> blocked_signals;
};

struct ProcessId {
  int64_t pid = 0;
  uint64_t start_ticks = 0;  // 0 when unknown (then only the pid is compared)

  bool operator==(const ProcessId&) const = default;
};

struct ProcessExit {
  bool known = true;  // false: the process is gone but its status could not be observed
  int exit_code = 0;  // when signal == 0
  int signal = 0;     // the terminating signal, 0 for a normal exit
};

class ProcessLauncher {
 public:
  virtual ~ProcessLauncher() = default;

  // Starts the process as the leader of a new process group. Errors, all UNAVAILABLE (this node
  // cannot start it now: ErrnoEnvironmentError): the program cannot be executed ("exec <path>: No
  // such file or directory"), the log file cannot be opened (naming it), fork or pipe failed.
  [[nodiscard]] virtual absl::StatusOr<ProcessId> Launch(const LaunchRequest& request) = 0;

  // Non-blocking. Nothing while the process runs; once it has ended, how (reaping it, and first
  // killing whatever is left in its process group). For a process this launcher did not start
  // (adopted after a restart) the status cannot be observed: known is false.
  virtual std::optional<ProcessExit> Poll(const ProcessId& id) = 0;

  // Sends `signal` to the process group `id` leads. OK when the group is already gone.
  [[nodiscard]] virtual absl::Status SignalGroup(const ProcessId& id, int signal) = 0;

  // True when `id` names a live process (same pid and, when known, same start time).
  virtual bool IsAlive(const ProcessId& id) = 0;
};

// fork/exec on this machine. Between fork and exec the child only makes async-signal-safe calls:
// it joins a new process group, resets signal dispositions and mask, redirects stdin/stdout/
// stderr, marks every other descriptor close-on-exec, and execs; an exec failure is reported
// back through a close-on-exec pipe.
std::unique_ptr<ProcessLauncher> MakeRealProcessLauncher();

// The start time of process `pid` in clock ticks since boot, or nothing when it does not exist
// or (unless include_ended) has ended but is not yet reaped.
std::optional<uint64_t> ProcessStartTicks(int64_t pid, bool include_ended = false);

}  // namespace trainyard::server::agent

#endif  // TRAINYARD_SERVER_AGENT_PROCESS_LAUNCHER_H_
