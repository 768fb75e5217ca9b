// `trainyard export` and `trainyard sample`: commands that read model weights on this machine,
// run by `trainyard-worker export` / `trainyard-worker sample` as a child process so that the CLI
// links no engine code. The child writes to this process's stdout and stderr.
//
// Threading: one call at a time; each blocks until its child exits.
#ifndef TRAINYARD_TOOLS_CLI_WORKER_COMMAND_H_
#define TRAINYARD_TOOLS_CLI_WORKER_COMMAND_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace trainyard::cli {

// Runs `trainyard-worker <args>` (LocateWorkerBinary, common/process.h) and returns its exit
// code. FAILED_PRECONDITION when there is no trainyard-worker; UNAVAILABLE when it cannot start.
[[nodiscard]] absl::StatusOr<int> RunWorkerCommand(const std::vector<std::string>& args);

}  // namespace trainyard::cli

#endif  // TRAINYARD_TOOLS_CLI_WORKER_COMMAND_H_
