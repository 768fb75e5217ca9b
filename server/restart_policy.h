// RestartPolicy: what the coordinator does after an attempt of a job failed. Classify() names
// the failure's class from what the agents reported; Decide() says whether a new attempt may
// start, after what delay, and why, in one sentence fit for the job's event log.
//
// Classification, first match wins:
//
//   the node (agent) was lost                          node_lost
//   the coordinator saw no progress past its limit     hang
//   killed by a signal                                 crash  (the kernel's OOM killer sends
//                                                              SIGKILL too: no way to tell)
//   exit code 1 internal error                         crash
//   exit code 2 bad spec, data file or flags           user_error
//   exit code 3 a collective or peer did not answer    collective_timeout
//   exit code 4 the rank's hang watchdog fired         hang
//   exit code 5 out of memory for the spec's sizes     user_error
//   any other exit code (0 included)                   crash
//
// (common/exit_codes.h defines the codes.)
//
// Budgets: a job has max_restarts restarts in all, and each class may have a smaller budget of
// its own; a class without one may use all of max_restarts. A user error is never restarted: the
// same input would fail the same way. Restarts are counted by the caller (Supervisor), per class,
// and passed in, so the policy holds no state and survives a coordinator restart unchanged.
//
// Backoff: the n-th consecutive failure (as the caller counts them; the supervisor counts the
// failures since an attempt last committed a checkpoint)
// waits backoff_initial × backoff_multiplier^(n−1), capped at backoff_max, then scaled by
// (1 + backoff_jitter × (2 × draw − 1)) for a draw uniform in [0, 1), and never less than zero.
// With initial 1 s, multiplier 2, max 60 s and no jitter: 1, 2, 4, 8, 16, 32, 60, 60, … s.
// Jitter spreads the restarts of many jobs hit by one fault; since it is applied after the cap,
// a delay may exceed backoff_max by up to the jitter fraction. backoff_initial 0: no delay.
//
// Pure: no clock, no randomness (the caller supplies the draw), no I/O.
// Threading: none needed; a const RestartPolicy may be shared freely.
#ifndef TRAINYARD_SERVER_RESTART_POLICY_H_
#define TRAINYARD_SERVER_RESTART_POLICY_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace trainyard::server {

enum class FailureClass { kUserError, kCrash, kHang, kNodeLost, kCollectiveTimeout };

// "user_error", "crash", "hang", "node_lost", "collective_timeout": metric labels, event kinds
// and config keys; never rename.
const char* FailureClassName(FailureClass failure_class);
// The class named `name` (exactly as FailureClassName spells it); nullopt for anything else.
std::optional<FailureClass> ParseFailureClass(std::string_view name);

// What is known about one failure of an attempt.
struct FailureSignal {
  int exit_code = 0;           // the rank's exit code; ignored when `signal` is set
  int signal = 0;              // non-zero: the rank was killed by this signal
  bool node_lost = false;      // the rank's node (agent) stopped answering
  bool hang_detected = false;  // the coordinator saw no progress past the adaptive limit
  std::string message;         // free text for people (the agent's or detector's words)
};

FailureClass Classify(const FailureSignal& signal);

// "killed by signal 9", "exit code 4 (hang watchdog)", "node lost", "no progress (hang)",
// followed by ": message" when there is one. For event causes and logs.
std::string DescribeFailure(const FailureSignal& signal);

struct RestartOptions {
  int max_restarts = 2;  // restarts in all, every class together
  // Per class; a class missing here may use all of max_restarts. kUserError is always 0
  // whatever is written here (Validate rejects anything else).
  std::map<FailureClass, int> budget;
  absl::Duration backoff_initial = absl::Seconds(1);  // 0: restart at once
  absl::Duration backoff_max = absl::Minutes(5);
  double backoff_multiplier = 2.0;
  double backoff_jitter = 0.1;  // fraction of the delay, 0..1
};

// INVALID_ARGUMENT, naming the field, when max_restarts is negative, a class budget is outside
// 0..max_restarts (or is not 0 for user_error), a duration is negative or infinite, initial
// exceeds max, the multiplier is below 1 or not finite, or the jitter is outside [0, 1].
[[nodiscard]] absl::Status Validate(const RestartOptions& options);

struct RestartDecision {
  bool restart = false;
  absl::Duration delay = absl::ZeroDuration();  // before the new attempt starts; 0 if none
  FailureClass failure_class = FailureClass::kCrash;
  // Restarts used before this decision (as passed in) and the limits they count against.
  int class_used = 0;
  int class_budget = 0;
  int total_used = 0;
  int total_budget = 0;
  // One sentence: "user error: no restart can fix it", "hang: restart 2 of 3 in 2s (2 of 2 hang
  // restarts used after this)" (the part in brackets when the class has a budget of its own),
  // "crash: no restarts left (3 of 3 used)", "hang: its budget of 2 restarts is used up".
  std::string reason;
};

// The backoff jitter's draws: uniform in [0, 1), from splitmix64 (Steele et al., 2014) over a
// seed. The coordinator seeds it from its clock; tests inject their own draws instead
// (SupervisorOptions::jitter_draw).
class JitterDraws {
 public:
  explicit JitterDraws(uint64_t seed) : state_(seed) {}
  double Next();

 private:
  uint64_t state_;
};

class RestartPolicy {
 public:
  // `options` should have passed Validate(); Decide() stays within the budgets regardless.
  explicit RestartPolicy(RestartOptions options) : options_(std::move(options)) {}

  // Restart iff the class is not user error, fewer than max_restarts restarts were used in all
  // (the sum of `used_by_class`) and fewer than the class's budget for this class.
  // `consecutive_failures` counts this failure (values below 1 count as 1); `jitter_draw` is
  // uniform in [0, 1) (clamped into it).
  RestartDecision Decide(FailureClass failure_class,
                         const std::map<FailureClass, int>& used_by_class, int consecutive_failures,
                         double jitter_draw) const;

  // The backoff delay alone (see the header comment).
  absl::Duration Backoff(int consecutive_failures, double jitter_draw) const;

  // The restarts `failure_class` may use: 0 for user error, else its budget or max_restarts.
  int BudgetFor(FailureClass failure_class) const;

  const RestartOptions& options() const { return options_; }

 private:
  RestartOptions options_;
};

}  // namespace trainyard::server

#endif  // TRAINYARD_SERVER_RESTART_POLICY_H_
