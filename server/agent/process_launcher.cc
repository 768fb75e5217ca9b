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
#include "common/status.h"

#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1U << 2)
#endif

namespace trainyard::server::agent {
namespace {

// A descriptor closed when this goes out of scope.
class ScopedFd {
 public:
  explicit ScopedFd(int fd = -1) : fd_(fd) {}
  ScopedFd(const ScopedFd&) = delete;
  ScopedFd& operator=(const ScopedFd&) = delete;
  ~ScopedFd() { Reset(); }
  int get() const { return fd_; }
  void Reset() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }

 private:
  int fd_;
};

std::vector<char*> NullTerminated(const std::vector<std::string>& strings) {
  std::vector<char*> pointers;
  pointers.reserve(strings.size() + 1);
  for (const std::string& s : strings) pointers.push_back(const_cast<char*>(s.c_str()));
  pointers.push_back(nullptr);
  return pointers;
}

// Runs in the child between fork and exec: async-signal-safe calls only, never returns.
[[noreturn]] void ExecChild(char* const* argv, char* const* envp, int stdin_fd, int log_fd,
                            int error_fd, int max_fd) {
  setpgid(0, 0);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  struct sigaction default_action;
  memset(&default_action, 0, sizeof(default_action));
  default_action.sa_handler = SIG_DFL;
  for (int s = 1; s < NSIG; ++s) sigaction(s, &default_action, nullptr);
  if (dup2(stdin_fd, STDIN_FILENO) < 0 || dup2(log_fd, STDOUT_FILENO) < 0 ||
      dup2(log_fd, STDERR_FILENO) < 0) {
    const int error = errno;
    (void)!write(error_fd, &error, sizeof(error));
    _exit(127);
  }
  // Nothing else the agent holds (sockets, other workers' logs) may leak into the worker.
  if (close_range(3, ~0U, CLOSE_RANGE_CLOEXEC) != 0) {
    for (int fd = 3; fd < max_fd; ++fd) {
      if (fd != error_fd) fcntl(fd, F_SETFD, FD_CLOEXEC);
    }
  }
  execve(argv[0], argv, envp);
  const int error = errno;
  (void)!write(error_fd, &error, sizeof(error));
  _exit(127);
}

ProcessExit DecodeWaitStatus(int status) {
  ProcessExit exit;
  if (WIFEXITED(status)) {
    exit.exit_code = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    exit.signal = WTERMSIG(status);
  }
  return exit;
}

class RealProcessLauncher : public ProcessLauncher {
 public:
  absl::StatusOr<ProcessId> Launch(const LaunchRequest& request) override {
    if (request.argv.empty() || request.argv[0].empty()) {
      return absl::InvalidArgumentError("launch: empty argv");
    }
    // Everything the child needs is prepared before fork: it may not allocate.
    std::vector<char*> argv = NullTerminated(request.argv);
    std::vector<char*> envp = NullTerminated(request.env);
    ScopedFd log_fd(
        open(request.log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644));
    if (log_fd.get() < 0) {
      return ErrnoEnvironmentError(errno, absl::StrCat("open log ", request.log_path));
    }
    ScopedFd null_fd(open("/dev/null", O_RDONLY | O_CLOEXEC));
    if (null_fd.get() < 0) {
      return ErrnoEnvironmentError(errno, "open /dev/null");
    }
    int pipe_fds[2];
    if (pipe2(pipe_fds, O_CLOEXEC) != 0) {
      return ErrnoEnvironmentError(errno, "pipe");
    }
    ScopedFd error_read(pipe_fds[0]), error_write(pipe_fds[1]);
    struct rlimit files;
    const int max_fd =
        getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < 65536 ? files.rlim_cur : 65536;

    const pid_t pid = fork();
    if (pid < 0) return ErrnoEnvironmentError(errno, "fork");
    if (pid == 0) {
      ExecChild(argv.data(), envp.data(), null_fd.get(), log_fd.get(), error_write.get(), max_fd);
    }
    setpgid(pid, pid);  // also here, so the group exists before anyone signals it
    error_write.Reset();
    int child_errno = 0;
    ssize_t got;
    do {
      got = read(error_read.get(), &child_errno, sizeof(child_errno));
    } while (got < 0 && errno == EINTR);
    if (got == static_cast<ssize_t>(sizeof(child_errno))) {
      int status;
      while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
      }
      return ErrnoEnvironmentError(child_errno, absl::StrCat("exec ", request.argv[0]));
    }
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
    return DecodeWaitStatus(status);
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
