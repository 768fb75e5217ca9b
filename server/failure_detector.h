// FailureDetector: decides that a running attempt is hung, and which rank is to blame.
//
// Two signals, one rule (config/hang_limit.h):
//  - the workers' watchdogs (worker/hang_watchdog.h) report a step that ran past the limit, with
//    the collective they are blocked in and the peers they wait for (HangReported);
//  - the coordinator's own check: no rank reported a finished step for longer than the limit
//    computed from the slowest reported steps, plus `slack` (a rank that is stopped, or whose
//    reports do not get through, cannot report itself; the slack lets the workers' reports,
//    which say more, arrive first). A rank entering a phase other than the step (evaluation,
//    sampling, a checkpoint save) says so with the limit it holds the phase to; until the next
//    step is reported, the check allows that phase its limit from when it began.
// The first worker report opens a gathering window: the verdict comes when every rank still
// running has reported, or `gather` after the first report, so that the reports of the ranks
// waiting in a ring can be put together. Blame follows the waits: the rank others wait for and
// that does not itself report waiting (stopped, or computing forever) is the stuck one; failing
// that, a rank that reports being stuck outside any collective; in a cycle of waits, the rank
// that has waited longest. Without worker reports, the rank whose last report is oldest.
// While gathering, the supervisor holds rank exits (a rank that noticed and exited is a witness,
// not the cause).
//
// Pure: no clock, no threads; times come in as arguments. One detector per running attempt.
#ifndef TRAINYARD_SERVER_FAILURE_DETECTOR_H_
#define TRAINYARD_SERVER_FAILURE_DETECTOR_H_

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "config/hang_limit.h"
#include "config/spec.h"

namespace trainyard::server {

// A worker's watchdog report (trainyard.v1.HangReport).
struct HangReport {
  int rank = 0;
  int64_t step = 0;  // steps completed
  double elapsed_s = 0;
  double limit_s = 0;
  std::string operation;  // empty: not blocked in a collective
  std::string group;
  std::vector<int> waiting_for;  // global ranks
  double waiting_s = 0;
};

struct HangVerdict {
  int rank = 0;        // the rank blamed
  std::string reason;  // "rank 0 waited 3.1 s for it in all-reduce (dp group); ..."
  absl::Time fault;    // the last progress: when the attempt stopped moving
  absl::Time detected;
  bool from_workers = false;  // decided from watchdog reports (else the coordinator's check)
};

class FailureDetector {
 public:
  struct Options {
    config::FaultToleranceSpec limits;
    absl::Duration gather = absl::Seconds(2);
    absl::Duration slack = absl::Seconds(3);
  };

  FailureDetector(Options options, int world_size, absl::Time running_since);

  // A progress report of `rank`: `step` steps done, the slowest recent step `max_step_s`.
  void Progress(int rank, int64_t step, double max_step_s, absl::Time now);
  // `rank` completed `step` steps and entered `phase`, which it holds to `limit_s`.
  void PhaseStarted(int rank, int64_t step, config::HangPhase phase, double limit_s,
                    absl::Time now);
  // Ignored for a rank outside the world or after the verdict.
  void HangReported(const HangReport& report, absl::Time now);
  void RankExited(int rank);
  // Stops the coordinator's own check (the final checkpoint's commit, a drain); reports still
  // count.
  void Suspend() { suspended_ = true; }

  bool gathering() const { return first_report_.has_value() && !decided_; }
  // The verdict, once: when the gathering is over, or no progress came within the limit.
  std::optional<HangVerdict> Check(absl::Time now);

  // The limit a step has now (the workers' rule over the reported slowest steps), and when the
  // attempt last moved.
  double LimitSeconds() const;
  // The limit in use: the start-up limit before the first step, a phase's while one runs, else
  // the step's; and what it applies to ("start-up", "step", "evaluation", ...).
  double LimitInUse() const;
  std::string LimitOf() const;
  absl::Time last_progress() const { return last_progress_; }
  int64_t step() const { return step_; }

 private:
  HangVerdict BlameFromReports(absl::Time now) const;
  HangVerdict BlameFromSilence(absl::Time now) const;

  const Options options_;
  const int world_size_;
  absl::Time last_progress_;
  int64_t step_ = 0;
  bool moved_ = false;  // a step finished in this attempt
  std::deque<double> recent_;
  struct RunningPhase {
    config::HangPhase phase;
    double limit_s;
    absl::Time since;
  };
  std::optional<RunningPhase> phase_;      // until a later step is reported
  std::map<int, absl::Time> last_report_;  // by rank
  std::map<int, HangReport> reports_;      // by rank
  std::set<int> exited_;
  std::optional<absl::Time> first_report_;
  bool suspended_ = false;
  bool decided_ = false;
};

}  // namespace trainyard::server

#endif  // TRAINYARD_SERVER_FAILURE_DETECTOR_H_
