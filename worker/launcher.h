// The local launcher: runs every rank of a job as a child process on this machine, for the
// standalone mode and tests (the control plane's agents replace it on a cluster).
//
// Each child is this same binary, exec'd with an argv (no shell) and `--rank R --rendezvous DIR`,
// sharing a file rendezvous store in a fresh temporary directory. The launcher waits for all of
// them; when one fails (or the launcher gets SIGINT) it kills the others so nothing is left
// running, and reports the first failure. SIGTERM to the launcher is passed on to every rank,
// which drains (checkpoints at a step they agree on and exits 0).
#ifndef TRAINYARD_WORKER_LAUNCHER_H_
#define TRAINYARD_WORKER_LAUNCHER_H_

#include <chrono>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace trainyard::worker {

struct LaunchOptions {
  std::string executable;                // the trainyard-worker binary
  std::vector<std::string> common_args;  // passed to every rank (e.g. --standalone SPEC)
  int world = 1;
  std::chrono::milliseconds grace{5000};
};

// OK when every rank exited 0. Otherwise the first failing rank's status: its exit code mapped
// back to a status code (2 → INVALID_ARGUMENT, 3 → DEADLINE_EXCEEDED, else INTERNAL) or the
// signal that killed it.
[[nodiscard]] absl::Status LaunchLocal(const LaunchOptions& options);

}  // namespace trainyard::worker

#endif  // TRAINYARD_WORKER_LAUNCHER_H_
