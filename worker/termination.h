// TerminationWatcher: what SIGTERM means to a coordinated worker. The same signal comes from the
// worker's node agent stopping it (a cancel, a restart, a resize) and from outside the control
// plane (a batch system ending the job signals every process of it; a user's kill), and only the
// coordinator knows which: each SIGTERM asks it (ProgressReport.terminated, sent directly).
// ORDER_DRAIN sets the drain flag the training loop watches (the ranks checkpoint at a step they
// agree on and exit 0, as a standalone worker does on SIGTERM); any other answer, an error or no
// answer within kTerminationTimeout ends the process as SIGTERM's default action would.
//
// Threading: the handler only writes to a pipe; a thread of the watcher's own asks.
#ifndef TRAINYARD_WORKER_TERMINATION_H_
#define TRAINYARD_WORKER_TERMINATION_H_

#include <atomic>
#include <functional>
#include <thread>

#include "absl/functional/any_invocable.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/trainyard.pb.h"

namespace trainyard::worker {

inline constexpr absl::Duration kTerminationTimeout = absl::Seconds(2);

class TerminationWatcher {
 public:
  // Asks the coordinator what a SIGTERM means, within `timeout` (may own what it asks through).
  using Ask = absl::AnyInvocable<absl::StatusOr<trainyard::v1::Order>(absl::Duration timeout)>;
  // What ends the process (tests replace it); by default SIGTERM's own action.
  using Terminate = std::function<void()>;

  // Installs the SIGTERM handler (one watcher per process), starts the thread, and unblocks
  // SIGTERM in the calling thread (the agent starts workers with it blocked, so that one sent
  // before the handler was in place waits for it).
  TerminationWatcher(Ask ask, std::atomic<bool>* drain, Terminate terminate = DefaultTerminate);
  // Stops the thread (a SIGTERM whose answer comes after this ends nothing: the worker is ending
  // anyway) and restores SIGTERM's default action.
  ~TerminationWatcher();
  TerminationWatcher(const TerminationWatcher&) = delete;
  TerminationWatcher& operator=(const TerminationWatcher&) = delete;

  // Signals handled so far (each asked once).
  int handled() const { return handled_.load(); }

  static void DefaultTerminate();

 private:
  void Loop();

  Ask ask_;
  std::atomic<bool>* drain_;
  Terminate terminate_;
  std::atomic<bool> stop_{false};
  std::atomic<int> handled_{0};
  std::thread thread_;
};

}  // namespace trainyard::worker

#endif  // TRAINYARD_WORKER_TERMINATION_H_
