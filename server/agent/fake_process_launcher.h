// A ProcessLauncher without processes, for unit tests of the agent: launches are recorded and
// get pids from 1000 up; a test ends a process with Exit(); signals are recorded, and by default
// SIGKILL ends the process at once while SIGTERM ends it unless the test made it IgnoreTerm().
//
// Threading: thread-safe.
#ifndef TRAINYARD_SERVER_AGENT_FAKE_PROCESS_LAUNCHER_H_
#define TRAINYARD_SERVER_AGENT_FAKE_PROCESS_LAUNCHER_H_

#include <map>
#include <set>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "server/agent/process_launcher.h"

namespace trainyard::server::agent {

class FakeProcessLauncher : public ProcessLauncher {
 public:
  [[nodiscard]] absl::StatusOr<ProcessId> Launch(const LaunchRequest& request) override;
  std::optional<ProcessExit> Poll(const ProcessId& id) override;
  [[nodiscard]] absl::Status SignalGroup(const ProcessId& id, int signal) override;
  bool IsAlive(const ProcessId& id) override;

  // The next Launch fails with `status`.
  void FailNextLaunch(absl::Status status);
  // Process `pid` ends with `exit` (seen by the next Poll).
  void Exit(int64_t pid, ProcessExit exit);
  // SIGTERM to `pid`'s group is recorded but does not end it.
  void IgnoreTerm(int64_t pid);
  // A live process this launcher did not start (to be adopted), and one whose exit cannot be
  // observed once Vanish() is called.
  void AddForeignProcess(ProcessId id);
  void Vanish(int64_t pid);

  std::vector<LaunchRequest> launches() const;
  // (pid, signal) in the order sent, to live processes only.
  std::vector<std::pair<int64_t, int>> signals() const;
  bool running(int64_t pid) const;

 private:
  struct Process {
    ProcessId id;
    bool foreign = false;
    bool ignore_term = false;
    std::optional<ProcessExit> exit;  // set once it ended, until polled
    bool reaped = false;
  };

  mutable absl::Mutex mu_;
  int64_t next_pid_ ABSL_GUARDED_BY(mu_) = 1000;
  std::optional<absl::Status> next_failure_ ABSL_GUARDED_BY(mu_);
  std::vector<LaunchRequest> launches_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<int64_t, int>> signals_ ABSL_GUARDED_BY(mu_);
  std::map<int64_t, Process> processes_ ABSL_GUARDED_BY(mu_);
};

}  // namespace trainyard::server::agent

#endif  // TRAINYARD_SERVER_AGENT_FAKE_PROCESS_LAUNCHER_H_
