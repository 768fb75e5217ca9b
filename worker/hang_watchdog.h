// HangWatchdog: notices, from inside a rank, that a step has run far longer than its recent
// steps — a collective whose peer stopped, a kernel that never returns, a loop that makes no
// progress — and says what the rank is blocked in, long before a collective's own timeout.
//
// The training loop marks each step's start (StepStarted) and end (StepFinished), and within
// the iteration the phases that are not the step (PhaseStarted/PhaseFinished: evaluation,
// sampling, a checkpoint save). A thread polls every `poll`: once the step (its time outside
// the phases) or the running phase has taken longer than its limit (config/hang_limit.h: each
// over its own recent durations; hang_startup_s for the first of each phase, and until a step has
// finished for the whole first iteration, so start-up, rendezvous and restore count against
// it), it calls `on_hang` once with a diagnosis: the step, the phase, how long it ran, the
// limit, and the longest wait in progress from the WaitRegistry (the collective, its group and
// the peers not heard from). The caller reports it and ends the process with kExitHang
// (common/exit_codes.h); the watchdog itself only watches.
//
// Threading: StepStarted/StepFinished/Suspend from the training thread; the poller on its own
// thread (Start); Poll may be called directly by tests instead of Start.
#ifndef TRAINYARD_WORKER_HANG_WATCHDOG_H_
#define TRAINYARD_WORKER_HANG_WATCHDOG_H_

#include <array>
#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "config/hang_limit.h"
#include "config/spec.h"
#include "worker/parallel/wait_registry.h"

namespace trainyard::worker {

struct HangDiagnosis {
  int64_t step = 0;                                    // steps completed; the hung one is step + 1
  config::HangPhase phase = config::HangPhase::kStep;  // what of step + 1 ran past its limit
  double elapsed_s = 0;                                // how long it has run
  double limit_s = 0;
  std::optional<parallel::CollectiveWait> wait;  // the longest wait in progress, if any
  double waiting_s = 0;                          // how long that wait has lasted

  // "step 58 has run 6.1 s (limit 3.0 s), blocked 5.9 s in all-reduce (dp group) waiting for
  // rank 1", or "... not blocked in a collective"; "the evaluation of step 58 has run ...".
  std::string Describe() const;
};

class HangWatchdog {
 public:
  using OnHang = std::function<void(const HangDiagnosis&)>;

  // `clock` and `waits` (may be null) must outlive the watchdog. Armed at once: the start-up
  // limit runs from construction.
  HangWatchdog(config::FaultToleranceSpec limits, Clock* clock, const parallel::WaitRegistry* waits,
               OnHang on_hang, absl::Duration poll = absl::Milliseconds(100));
  ~HangWatchdog();  // stops the poller
  HangWatchdog(const HangWatchdog&) = delete;
  HangWatchdog& operator=(const HangWatchdog&) = delete;

  void Start();  // polls on a thread of its own until destroyed

  // Step `completed + 1` begins. The first call keeps the start-up clock running.
  void StepStarted(int64_t completed);
  // The step ends; its time outside the phases joins the step's recent durations.
  void StepFinished();
  // A phase of the iteration other than the step begins (the step's clock pauses); returns the
  // limit it is held to. PhaseFinished records its duration and resumes the step's clock.
  double PhaseStarted(config::HangPhase phase);
  void PhaseFinished();
  // Stops watching (the last checkpoint's commit, shutdown); StepStarted watches again.
  void Suspend();

  // The step's limit now.
  double LimitSeconds() const;
  // One check: calls on_hang (once per watchdog) and returns true when the running step is
  // past the limit.
  bool Poll();

 private:
  const config::FaultToleranceSpec limits_;
  Clock* const clock_;
  const parallel::WaitRegistry* const waits_;
  const OnHang on_hang_;
  const absl::Duration poll_;

  double LimitLocked(config::HangPhase phase) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool StartingUp() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return recent_[static_cast<int>(config::HangPhase::kStep)].empty();
  }

  mutable absl::Mutex mu_;
  bool armed_ ABSL_GUARDED_BY(mu_) = true;
  bool fired_ ABSL_GUARDED_BY(mu_) = false;
  int64_t step_ ABSL_GUARDED_BY(mu_) = 0;
  const int64_t created_nanos_;  // the start-up limit runs from here
  config::HangPhase phase_ ABSL_GUARDED_BY(mu_) = config::HangPhase::kStep;
  int64_t since_nanos_ ABSL_GUARDED_BY(mu_) = 0;  // the phase, or the step's stretch, began
  double step_spent_s_ ABSL_GUARDED_BY(mu_) = 0;  // the step's time before that stretch
  std::array<std::deque<double>, config::kHangPhases> recent_ ABSL_GUARDED_BY(mu_);

  absl::Notification stop_;
  std::thread poller_;
};

}  // namespace trainyard::worker

#endif  // TRAINYARD_WORKER_HANG_WATCHDOG_H_
