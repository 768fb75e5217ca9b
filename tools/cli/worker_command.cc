#include "tools/cli/worker_command.h"

#include <sys/types.h>
#include <sys/wait.h>

#include <cerrno>

#include "absl/strings/str_cat.h"
#include "common/process.h"
#include "common/status.h"

namespace trainyard::cli {

absl::StatusOr<int> RunWorkerCommand(const std::vector<std::string>& args) {
  absl::StatusOr<std::string> worker = LocateWorkerBinary();
  if (!worker.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("this command needs trainyard-worker beside trainyard or on PATH: ",
                     worker.status().message()));
  }
  SpawnOptions spawn;
  spawn.argv = {*worker};
  spawn.argv.insert(spawn.argv.end(), args.begin(), args.end());
  spawn.keep_stdin = true;
  // In this process's group, so that a Ctrl-C at the terminal stops it too.
  spawn.new_process_group = false;
  TY_ASSIGN_OR_RETURN(const pid_t pid, Spawn(spawn));
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return absl::InternalError("waitpid on trainyard-worker failed");
  }
  const ExitStatus exit = DecodeWaitStatus(status);
  if (exit.signal != 0) {
    return absl::InternalError(absl::StrCat("trainyard-worker ended by signal ", exit.signal));
  }
  return exit.exit_code;
}

}  // namespace trainyard::cli
