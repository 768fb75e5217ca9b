#include "server/agent/process_launcher.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/process.h"
#include "common/status.h"

namespace trainyard::server::agent {
namespace {

ProcessExit ExitOf(int wait_status) {
  const ExitStatus exit = DecodeWaitStatus(wait_status);
  return ProcessExit{.exit_code = exit.signal == 0 ? exit.exit_code : 0, .signal = exit.signal};
}

class RealProcessLauncher : public ProcessLauncher {
 public:
  absl::StatusOr<ProcessId> Launch(const LaunchRequest& request) override {
    TY_ASSIGN_OR_RETURN(const pid_t pid, Spawn({.argv = request.argv,
                                                .env = request.env,
                                                .stdout_path = request.log_path,
                                                .stderr_path = request.log_path,
                                                .blocked_signals = request.blocked_signals}));
    // A child that already exited is a zombie until reaped, and keeps its start time.
    return ProcessId{pid, ProcessStartTicks(pid, /*include_ended=*/true).value_or(0)};
  }

  std::optional<ProcessExit> Poll(const ProcessId& id) override {
    siginfo_t info;
    memset(&info, 0, sizeof(info));
    if (waitid(P_PID, static_cast<id_t>(id.pid), &info, WEXITED | WNOHANG | WNOWAIT) != 0) {
      if (errno != ECHILD) return std::nullopt;  // EINTR: look again next time
      // Not our child: adopted after a restart, or already reaped.
      if (IsAlive(id)) return std::nullopt;
      return ProcessExit{.known = false};
    }
    if (info.si_pid == 0) return std::nullopt;  // still running
    // The leader has ended; while it is a zombie its group id cannot be reused, so whatever it
    // left behind in its group is killed before it is reaped.
    kill(-static_cast<pid_t>(id.pid), SIGKILL);
    int status = 0;
    while (waitpid(static_cast<pid_t>(id.pid), &status, 0) < 0) {
      if (errno != EINTR) return ProcessExit{.known = false};
    }
    return ExitOf(status);
  }

  absl::Status SignalGroup(const ProcessId& id, int signal) override {
    if (!IsAlive(id)) return absl::OkStatus();  // gone, or its pid now names someone else
    if (kill(-static_cast<pid_t>(id.pid), signal) != 0 && errno != ESRCH) {
      return ErrnoStatus(errno, absl::StrCat("kill process group ", id.pid));
    }
    return absl::OkStatus();
  }

  bool IsAlive(const ProcessId& id) override {
    std::optional<uint64_t> ticks = ProcessStartTicks(id.pid);
    return ticks && (id.start_ticks == 0 || *ticks == id.start_ticks);
  }
};

}  // namespace

std::unique_ptr<ProcessLauncher> MakeRealProcessLauncher() {
  return std::make_unique<RealProcessLauncher>();
}

std::optional<uint64_t> ProcessStartTicks(int64_t pid, bool include_ended) {
  if (pid <= 0) return std::nullopt;
  std::ifstream file(absl::StrCat("/proc/", pid, "/stat"));
  std::string line;
  if (!file || !std::getline(file, line)) return std::nullopt;
  // "pid (comm) state ppid ...": comm may hold spaces and parentheses, so fields are counted
  // from the last ')'. The state is field 3 and the start time field 22.
  const size_t paren = line.rfind(')');
  if (paren == std::string::npos) return std::nullopt;
  std::istringstream fields(line.substr(paren + 1));
  std::string state;
  fields >> state;
  if (!include_ended && (state == "Z" || state == "X")) return std::nullopt;  // ended, unreaped
  std::string field;
  for (int i = 4; i < 22 && fields >> field; ++i) {
  }
  uint64_t start = 0;
  if (!(fields >> start)) return std::nullopt;
  return start;
}

}  // namespace trainyard::server::agent
