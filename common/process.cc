#include "common/process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/status.h"

#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1U << 2)
#endif

extern char** environ;

namespace trainyard {
namespace {

// A descriptor closed when this goes out of scope.
class ScopedFd {
 public:
  explicit ScopedFd(int fd = -1) : fd_(fd) {}
  ScopedFd(const ScopedFd&) = delete;
  ScopedFd& operator=(const ScopedFd&) = delete;
  ~ScopedFd() { Reset(); }
  int get() const { return fd_; }
  void Reset(int fd = -1) {
    if (fd_ >= 0) close(fd_);
    fd_ = fd;
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

// This process's environment with `extra` set on top of it.
std::vector<std::string> InheritedEnvironment(const std::vector<std::string>& extra) {
  std::map<std::string, std::string> by_name;
  auto add = [&](const std::string& entry) {
    const size_t equals = entry.find('=');
    by_name[entry.substr(0, equals)] = entry;
  };
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) add(*entry);
  for (const std::string& entry : extra) add(entry);
  std::vector<std::string> env;
  env.reserve(by_name.size());
  for (auto& [name, entry] : by_name) env.push_back(std::move(entry));
  return env;
}

absl::StatusOr<int> OpenOutput(const std::string& path) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoEnvironmentError(errno, absl::StrCat("open ", path));
  return fd;
}

// What the child does between fork and exec, prepared by the parent: the child may not allocate.
struct ChildPlan {
  char* const* argv;
  char* const* envp;
  int stdin_fd;  // -1: keep
  int stdout_fd;
  int stderr_fd;
  int error_fd;  // the close-on-exec pipe that carries an errno back
  int max_fd;
  bool new_process_group;
  const sigset_t* blocked;
};

// Runs in the child: async-signal-safe calls only, never returns.
[[noreturn]] void ExecChild(const ChildPlan& plan) {
  if (plan.new_process_group) setpgid(0, 0);
  struct sigaction default_action;
  memset(&default_action, 0, sizeof(default_action));
  default_action.sa_handler = SIG_DFL;
  for (int s = 1; s < NSIG; ++s) sigaction(s, &default_action, nullptr);
  sigprocmask(SIG_SETMASK, plan.blocked, nullptr);
  if ((plan.stdin_fd >= 0 && dup2(plan.stdin_fd, STDIN_FILENO) < 0) ||
      (plan.stdout_fd >= 0 && dup2(plan.stdout_fd, STDOUT_FILENO) < 0) ||
      (plan.stderr_fd >= 0 && dup2(plan.stderr_fd, STDERR_FILENO) < 0)) {
    const int error = errno;
    (void)!write(plan.error_fd, &error, sizeof(error));
    _exit(127);
  }
  // Nothing else the parent holds (sockets, other children's logs) may leak into the child.
  if (close_range(3, ~0U, CLOSE_RANGE_CLOEXEC) != 0) {
    for (int fd = 3; fd < plan.max_fd; ++fd) {
      if (fd != plan.error_fd) fcntl(fd, F_SETFD, FD_CLOEXEC);
    }
  }
  execve(plan.argv[0], plan.argv, plan.envp);
  const int error = errno;
  (void)!write(plan.error_fd, &error, sizeof(error));
  _exit(127);
}

}  // namespace

absl::StatusOr<pid_t> Spawn(const SpawnOptions& options) {
  if (options.argv.empty() || options.argv[0].empty()) {
    return absl::InvalidArgumentError("spawn: empty argv");
  }
  // Everything the child needs is prepared before fork.
  const std::vector<std::string> env =
      options.env.has_value() ? *options.env : InheritedEnvironment(options.extra_env);
  std::vector<char*> argv = NullTerminated(options.argv);
  std::vector<char*> envp = NullTerminated(env);
  ScopedFd stdin_fd, stdout_fd, stderr_fd;
  if (!options.keep_stdin) {
    stdin_fd.Reset(open("/dev/null", O_RDONLY | O_CLOEXEC));
    if (stdin_fd.get() < 0) return ErrnoEnvironmentError(errno, "open /dev/null");
  }
  if (!options.stdout_path.empty()) {
    TY_ASSIGN_OR_RETURN(const int fd, OpenOutput(options.stdout_path));
    stdout_fd.Reset(fd);
  }
  if (!options.stderr_path.empty()) {
    if (options.stderr_path == options.stdout_path) {
      stderr_fd.Reset(fcntl(stdout_fd.get(), F_DUPFD_CLOEXEC, 0));
      if (stderr_fd.get() < 0) return ErrnoEnvironmentError(errno, "dup");
    } else {
      TY_ASSIGN_OR_RETURN(const int fd, OpenOutput(options.stderr_path));
      stderr_fd.Reset(fd);
    }
  }
  int pipe_fds[2];
  if (pipe2(pipe_fds, O_CLOEXEC) != 0) return ErrnoEnvironmentError(errno, "pipe");
  ScopedFd error_read(pipe_fds[0]), error_write(pipe_fds[1]);
  struct rlimit files;
  const int max_fd =
      getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < 65536 ? files.rlim_cur : 65536;
  sigset_t blocked;
  sigemptyset(&blocked);
  for (int signal : options.blocked_signals) sigaddset(&blocked, signal);
  const ChildPlan plan{.argv = argv.data(),
                       .envp = envp.data(),
                       .stdin_fd = stdin_fd.get(),
                       .stdout_fd = stdout_fd.get(),
                       .stderr_fd = stderr_fd.get(),
                       .error_fd = error_write.get(),
                       .max_fd = max_fd,
                       .new_process_group = options.new_process_group,
                       .blocked = &blocked};

  const pid_t pid = fork();
  if (pid < 0) return ErrnoEnvironmentError(errno, "fork");
  if (pid == 0) ExecChild(plan);
  // Also here, so that the group exists before anyone signals it.
  if (options.new_process_group) setpgid(pid, pid);
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
    return ErrnoEnvironmentError(child_errno, absl::StrCat("exec ", options.argv[0]));
  }
  return pid;
}

ExitStatus DecodeWaitStatus(int wait_status) {
  ExitStatus exit;
  if (WIFEXITED(wait_status)) {
    exit.exit_code = WEXITSTATUS(wait_status);
  } else if (WIFSIGNALED(wait_status)) {
    exit.signal = WTERMSIG(wait_status);
  }
  return exit;
}

absl::StatusOr<std::string> LocateWorkerBinary() {
  namespace fs = std::filesystem;
  std::vector<fs::path> candidates;
  if (const char* env = std::getenv("TRAINYARD_WORKER_BINARY"); env != nullptr && *env != '\0') {
    candidates.push_back(env);
  }
  std::error_code error;
  const fs::path self = fs::read_symlink("/proc/self/exe", error);
  if (!error) {
    const fs::path dir = self.parent_path();
    candidates.push_back(dir / "trainyard-worker");
    candidates.push_back(dir / ".." / "worker" / "trainyard-worker");
    candidates.push_back(dir / ".." / ".." / "worker" / "trainyard-worker");
  }
  if (const char* path = std::getenv("PATH"); path != nullptr) {
    for (absl::string_view dir : absl::StrSplit(path, ':', absl::SkipEmpty())) {
      candidates.push_back(fs::path(std::string(dir)) / "trainyard-worker");
    }
  }
  std::vector<std::string> looked;
  for (const fs::path& candidate : candidates) {
    if (fs::is_regular_file(candidate, error) && access(candidate.c_str(), X_OK) == 0) {
      const fs::path absolute = fs::absolute(candidate, error);
      return (error ? candidate : absolute.lexically_normal()).string();
    }
    looked.push_back(candidate.string());
  }
  return absl::NotFoundError(
      absl::StrCat("trainyard-worker not found (looked at ", absl::StrJoin(looked, ", "), ")"));
}

}  // namespace trainyard
