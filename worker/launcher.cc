#include "worker/launcher.h"

#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/process.h"
#include "common/status.h"

namespace trainyard::worker {
namespace {

volatile sig_atomic_t g_stop_signal = 0;
volatile sig_atomic_t g_drain_signal = 0;

void OnStopSignal(int sig) { g_stop_signal = sig; }
void OnDrainSignal(int) { g_drain_signal = 1; }

absl::Status StatusForExit(int rank, int wstatus) {
  if (WIFSIGNALED(wstatus)) {
    return absl::InternalError(absl::StrCat("rank ", rank, " was killed by signal ",
                                            WTERMSIG(wstatus), " (", strsignal(WTERMSIG(wstatus)),
                                            ")"));
  }
  const int code = WEXITSTATUS(wstatus);
  return absl::Status(StatusCodeForExitCode(code),
                      absl::StrCat("rank ", rank, " exited with code ", code));
}

// The ranks left when one failed or the launcher was interrupted: nothing they could still do
// (a drain needs every rank) is worth waiting for, so SIGKILL.
void StopAll(const std::vector<pid_t>& pids, std::chrono::milliseconds grace) {
  for (pid_t pid : pids) {
    if (pid > 0) kill(pid, SIGKILL);
  }
  const auto deadline = std::chrono::steady_clock::now() + grace;
  for (pid_t pid : pids) {
    if (pid <= 0) continue;
    int wstatus = 0;
    while (waitpid(pid, &wstatus, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        kill(pid, SIGKILL);
        waitpid(pid, &wstatus, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
}

}  // namespace

absl::Status LaunchLocal(const LaunchOptions& options) {
  std::string dir_template =
      (std::filesystem::temp_directory_path() / "trainyard-rendezvous.XXXXXX").string();
  if (mkdtemp(dir_template.data()) == nullptr) {
    return ErrnoEnvironmentError(errno, "mkdtemp");
  }
  const std::string rendezvous = dir_template;

  struct sigaction action {};
  action.sa_handler = OnStopSignal;
  sigaction(SIGINT, &action, nullptr);
  struct sigaction drain {};
  drain.sa_handler = OnDrainSignal;
  sigaction(SIGTERM, &drain, nullptr);
  bool drain_forwarded = false;

  std::vector<pid_t> pids(options.world, -1);
  absl::Status status;
  for (int rank = 0; rank < options.world && status.ok(); ++rank) {
    std::vector<std::string> args{options.executable};
    args.insert(args.end(), options.common_args.begin(), options.common_args.end());
    args.insert(args.end(), {"--rank", std::to_string(rank), "--rendezvous", rendezvous});
    // SIGTERM stays blocked across exec until the rank has installed its drain handler
    // (worker/main.cc), so a drain forwarded early is held, not fatal. The ranks stay in the
    // launcher's process group and share its terminal.
    absl::StatusOr<pid_t> pid = Spawn({.argv = std::move(args),
                                       .keep_stdin = true,
                                       .new_process_group = false,
                                       .blocked_signals = {SIGTERM}});
    if (!pid.ok()) {
      status = pid.status();
      break;
    }
    pids[rank] = *pid;
  }

  int running = 0;
  for (pid_t pid : pids) running += pid > 0;
  while (status.ok() && running > 0) {
    if (g_stop_signal != 0) {
      status = absl::CancelledError(absl::StrCat("stopped by signal ", g_stop_signal));
      break;
    }
    if (g_drain_signal != 0 && !drain_forwarded) {
      // SIGTERM drains: every rank checkpoints at the same step and exits 0.
      for (pid_t pid : pids) {
        if (pid > 0) kill(pid, SIGTERM);
      }
      drain_forwarded = true;
    }
    int wstatus = 0;
    const pid_t pid = waitpid(-1, &wstatus, WNOHANG);
    if (pid <= 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      continue;
    }
    for (int rank = 0; rank < options.world; ++rank) {
      if (pids[rank] != pid) continue;
      pids[rank] = -1;
      --running;
      if (!(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0)) status = StatusForExit(rank, wstatus);
    }
  }
  StopAll(pids, options.grace);
  std::error_code ec;
  std::filesystem::remove_all(rendezvous, ec);
  return status;
}

}  // namespace trainyard::worker
