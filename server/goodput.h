// GoodputAccount: where one job's wall time went. The Supervisor tells it when attempts are
// scheduled, how far they train, how long checkpoint saves block them, when they fail and when
// the job ends; Snapshot() splits the wall time into categories that add up to it exactly, for
// `status` and /metrics.
//
// Definitions (an attempt's "first completed step" is its first Progress() report of a step
// above the step it resumed from; an attempt "ends" at its failure's fault, at the scheduling of
// the attempt that replaces it, or at Finished(); a running one ends at `now`):
//
// - wall: from the first attempt's scheduling until Finished(), or until `now` while the job
//   runs. The queue wait before the first attempt is not part of it.
// - startup: from the first attempt's scheduling to its first completed step (start-up,
//   rendezvous, restore, and the steps before that report); to its end if it ends before one.
// - restart[cause]: from the fault of a failure of that cause to the next attempt's first
//   completed step (detection, backoff, rescheduling, start-up, restore); to that attempt's end
//   when it ends before one (its own failure's restart time follows), and to `now` or
//   Finished() while no next attempt has completed a step.
// - training of an attempt: counted from its first completed step, the sum of the intervals
//   between consecutive reports in which the step rose. Intervals in which it did not rise are
//   its stalls; the time from its last report to its end is its tail.
// - checkpoint: the blocked seconds of the saves reported while an attempt was the latest one,
//   taken out of that attempt's stalls and tail first, then out of its training, and capped at
//   their sum (so saves of an attempt that never completed a step count nothing).
// - lost[cause]: when an attempt resumes from step C after a failure of that cause, each earlier
//   attempt that reached a step F above C loses the steps from max(C, its first completed step)
//   to F (fewer when an earlier resume already cut it lower): their number times that attempt's
//   mean step time, i.e. its training time less its checkpoint share divided by the steps it
//   rose during training. Lost time is therefore bounded by the time trained after C.
// - productive: the training time of every attempt less its checkpoint share and its lost time.
// - other: wall less all of the above: stalls and tails that no checkpoint took (evaluation,
//   drain, shutdown, the moments since the latest report).
// - ratio: productive / wall; 0 when wall is 0.
//
// Latencies of a failure: detection is `detected - fault` (as given, at least 0); restart is
// from `detected` to the next attempt's first completed step.
//
// Odd orders. A time earlier than one given before (to AttemptScheduled, Progress, Failed's
// fault or Finished) is taken as that earlier time: a fault named before the attempt's last
// report happened at that report, since the attempt was evidently alive. Ignored: Progress with
// no running attempt (before the first, after Failed), Failed with no running attempt, and
// every call after Finished. AttemptScheduled while an attempt runs ends that attempt as a
// failure of cause kRescheduledCause found at once (an elastic resize or a resumed drain costs
// restart and lost time like a failure).
//
// Threading: none; the Supervisor owns one per job under its lock.
#ifndef TRAINYARD_SERVER_GOODPUT_H_
#define TRAINYARD_SERVER_GOODPUT_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "proto/stored.pb.h"

namespace trainyard::server {

// The cause booked for an attempt replaced without a reported failure.
inline constexpr char kRescheduledCause[] = "rescheduled";

struct FailureLatency {
  std::string cause;
  double detection_s = 0;
  std::optional<double> restart_s;  // unknown until the next attempt completes a step
};

// Seconds. wall_s == productive_s + checkpoint_s + startup_s + restart_s + lost_s + other_s.
struct GoodputSnapshot {
  double wall_s = 0;
  double productive_s = 0;
  double checkpoint_s = 0;
  double startup_s = 0;
  double restart_s = 0;  // sum of restart_s_by_cause
  double lost_s = 0;     // sum of lost_s_by_cause
  double other_s = 0;
  // A key for every cause that has failed, also where its time is 0.
  std::map<std::string, double> restart_s_by_cause;
  std::map<std::string, double> lost_s_by_cause;
  double ratio = 0;
  int attempts = 0;
  // Failures, replacements of a running attempt (kRescheduledCause) included.
  std::map<std::string, int> failures_by_cause;
  std::vector<FailureLatency> failures;  // oldest first
  std::optional<double> last_detection_latency_s;
  std::optional<double> last_restart_latency_s;
};

class GoodputAccount {
 public:
  // An attempt was scheduled at `t` to resume from checkpoint step `resume_step` (0: none).
  void AttemptScheduled(absl::Time t, int64_t resume_step);
  // The latest attempt actually resumed from `step`, newer than the checkpoint it was scheduled
  // with (the memory tier): less of the earlier attempts' work was lost.
  void Resumed(int64_t step);
  // The running attempt had reached `step` at `t` (the highest step so far; reports are sparse,
  // about every half second).
  void Progress(absl::Time t, int64_t step);
  // A save of the latest attempt blocked training for `seconds`. Negative or non-finite values
  // are ignored.
  void CheckpointBlocked(double seconds);
  // The running attempt failed at `fault` (the last progress before a hang, the exit of a crash,
  // the last heartbeat of a lost node) and the coordinator noticed at `detected`.
  void Failed(absl::Time fault, absl::Time detected, const std::string& cause);
  // The job ended at `t` (whatever its outcome); the account is final.
  void Finished(absl::Time t);

  // The categories up to `now` (ignored once finished).
  GoodputSnapshot Snapshot(absl::Time now) const;

  // The whole account, to store and to restore after a coordinator restart (Load replaces
  // this account; INVALID_ARGUMENT for one that does not hold together).
  stored::Goodput Save() const;
  [[nodiscard]] absl::Status Load(const stored::Goodput& saved);

 private:
  struct Cut {
    int64_t step = 0;
    std::string cause;
    size_t by = 0;  // the attempt whose resume cut here
  };
  struct Attempt {
    absl::Time scheduled;
    int64_t resume_step = 0;
    std::optional<absl::Time> first_step_time;
    int64_t first_step = 0;  // the step of the first completed step's report
    int64_t top_step = 0;    // the highest step reported after it
    absl::Time last_report;  // the latest report counted after it
    absl::Duration training;
    absl::Duration stalled;
    absl::Duration checkpoint_blocked;
    std::optional<absl::Time> end;
    std::optional<size_t> failure;  // index in failures_ when it ended by failing
    std::vector<Cut> cuts;          // later resumes below top_step, in order
  };
  struct Failure {
    std::string cause;
    absl::Duration detection;
    absl::Time detected;
    std::optional<absl::Time> next_first_step;
  };
  // How an attempt's time after its first completed step splits.
  struct AttemptShares {
    absl::Duration checkpoint;
    absl::Duration productive;
    absl::Duration nontraining_left;  // stalls and tail not taken by checkpoints
  };

  // `t`, or the latest time given before when that is later; remembers it.
  absl::Time Ordered(absl::Time t);
  bool running() const;
  // Ends the running attempt at `end` by a failure.
  void EndRunning(absl::Time end, absl::Duration detection, absl::Time detected,
                  const std::string& cause);
  // Splits `attempt` (ending at `end`) and books its lost time into `lost`.
  AttemptShares Shares(const Attempt& attempt, absl::Time end,
                       std::map<std::string, absl::Duration>& lost) const;

  std::vector<Attempt> attempts_;
  std::vector<Failure> failures_;
  std::optional<absl::Time> finished_;
  absl::Time latest_ = absl::InfinitePast();
};

}  // namespace trainyard::server

#endif  // TRAINYARD_SERVER_GOODPUT_H_
