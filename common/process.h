// Starting a child process: the one fork/exec of the project. The agent's worker launcher, the
// standalone worker launcher, the test harness and the benchmarks all start processes through
// Spawn, so the careful part — nothing but async-signal-safe calls between fork and exec, no
// descriptor leaking into the child, an exec failure reported to the caller rather than as a
// mysterious exit 127 — is written once.
//
// Threading: Spawn may be called from any thread; the child inherits only the calling thread.
#ifndef TRAINYARD_COMMON_PROCESS_H_
#define TRAINYARD_COMMON_PROCESS_H_

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace trainyard {

struct SpawnOptions {
  // argv[0] is the program's path, executed as is: no PATH search, no shell.
  std::vector<std::string> argv;
  // The whole environment ("NAME=value" each) when set; otherwise this process's environment
  // with `extra_env` added (an entry replaces a variable of the same name).
  std::optional<std::vector<std::string>> env;
  std::vector<std::string> extra_env;
  // Where stdout and stderr go: appended to the file (created 0644 when missing), "" to keep
  // this process's. The same path for both gives one interleaved log. stdin is /dev/null unless
  // keep_stdin.
  std::string stdout_path;
  std::string stderr_path;
  bool keep_stdin = false;
  // The child leads a new process group, so that it and everything it starts can be signalled
  // together (kill(-pid, ...)).
  bool new_process_group = true;
  // Signals blocked in the child across exec (all others unblocked, every disposition default):
  // for a child that installs its own handler for them first.
  std::vector<int> blocked_signals;
};

// Starts the process and returns its pid once exec has succeeded. UNAVAILABLE (this machine
// cannot start it now) naming the call: the program cannot be executed ("exec /x: No such file
// or directory"), an output file cannot be opened, fork or pipe failed; INVALID_ARGUMENT for an
// empty argv. The caller reaps the child (waitpid).
[[nodiscard]] absl::StatusOr<pid_t> Spawn(const SpawnOptions& options);

// How a reaped child ended, from its wait status.
struct ExitStatus {
  int exit_code = -1;  // when it exited normally
  int signal = 0;      // the terminating signal, 0 for a normal exit
};
ExitStatus DecodeWaitStatus(int wait_status);

// The trainyard-worker a program of the project execs: $TRAINYARD_WORKER_BINARY when set, else
// "trainyard-worker" beside this executable (an installation's bin/), else in the build tree's
// worker/ folder one or two levels up from it (build/server/trainyard-server,
// build/tools/cli/trainyard), else on PATH. An absolute path; NOT_FOUND listing the places looked
// at.
[[nodiscard]] absl::StatusOr<std::string> LocateWorkerBinary();

}  // namespace trainyard

#endif  // TRAINYARD_COMMON_PROCESS_H_
