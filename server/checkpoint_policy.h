// CheckpointPolicy: the checkpoint interval of one job whose spec says `checkpoint.every_steps:
// auto`, chosen by Young–Daly from what the coordinator measures about that job.
//
// Checkpointing every τ seconds of training costs δ/τ of the time in saves and, per failure,
// about τ/2 of lost work; the sum is smallest near τ = √(2δM) (Young, 1974), where δ is the time
// one save blocks training and M the job's mean time between failures. Daly's higher-order form
// (FGCS 2006), used here, stays accurate where δ is not small against M:
//
//   τ = √(2δM)·[1 + (1/3)·√(δ/(2M)) + (1/9)·δ/(2M)] − δ   for δ < 2M,   τ = M otherwise.
//
// The three inputs and how each is estimated:
//
// - δ: the median of the blocked seconds of the last `delta_window` committed saves. Saves are
//   rare (tens a day) and one slow save on a contended file system should not stretch the
//   interval for hours; a median ignores it, yet follows a lasting change (a bigger model after
//   a resize, a slower disk) within half a window.
// - Step time: the median of the last `step_time_window` reports. The first reports of an
//   attempt carry warm-up and compilation; a median drops them without a warm-up rule.
// - M: a gamma–Poisson estimate whose evidence fades, with tests for a sudden change. A counts
//   failures, B seconds of exposure, and M̂ = B / A (the inverse of the posterior mean rate).
//   Both start as the prior: A0 = `prior_failures` pseudo-failures over B0 = A0·M0 seconds,
//   where M0 = node_mtbf / nodes, so M̂ = M0 until something is observed. ObserveFailure adds 1
//   to A; ObserveRunning(t) adds t to B while A and B (prior included) decay as e^(−k·t) with
//   k = ln 2 / (h·M̂), h = `memory_mtbfs`: evidence loses half its weight every h current MTBFs,
//   whatever the rate. So
//     * with a constant rate λ the prior fades and M̂ settles at 1/λ, an average over about
//       h / ln 2 recent failures (≈ 9 for h = 6). Being a ratio over a few failures, it runs
//       10-15% high on average over time; τ ∝ √M̂ halves that, and an interval 5-7% off its
//       optimum costs 0.1-0.2% of the checkpoint and rework overhead;
//     * without failures M̂ grows about linearly with exposure (dM̂/dt = 1/A).
//   Failures come from nodes, and an elastic job does not always run on its own `nodes`: exposure
//   is counted in time at its own size, an hour on twice its nodes as two (RunOn), and M̂ is
//   given for the size it runs at now, the estimate at its own size × nodes / nodes now. So the
//   evidence gathered at one size carries over to another, and the interval follows the size.
//   Forgetting alone needs about h / ln 2 failures at a new rate before M̂ follows it, and a
//   rise is when failures cost most. So two change tests, each with a false-alarm probability
//   of α = 10⁻³, compare what came after a past failure (or reset) with M_then, the estimate
//   held at that point:
//     * rise, at each failure: if the last n failures (n = 3..8) came within an exposure E,
//       counted from the failure before them, so short that P[Poisson(E / M_then) ≥ n] < α,
//       the older evidence and the prior are dropped: A = n, B = E;
//     * fall, as exposure accrues: if the quiet time Q since the last failure has
//       e^(−Q / M_then) < α (Q > 6.9·M_then) and Q > M̂, then A = 1, B = Q: M̂ becomes the
//       quiet time so far and keeps growing with it.
//   A 16-fold rise is followed after 3-5 failures instead of 30 or more; at a constant rate
//   the tests fire rarely, and a false alarm only makes M̂ noisier for a few failures.
//
// Interval in steps: round(τ / step time), clamped to [min_every_steps, max_every_steps] (the
// spec's limits). Until a committed save has been measured δ is unknown, and the policy asks for
// an early first save, `first_checkpoint_steps` (clamped the same way) after the last one, so
// that δ is known before the first long interval is chosen; a job that fails before then loses
// only those few steps.
//
// Inputs that are not finite or are negative are ignored: one bad report must not move the
// interval. The class reads no clock; times arrive as arguments. Save and Load carry the state
// across a coordinator restart (the job's stored accounts).
//
// Threading: none; the Supervisor owns one per job under its lock.
#ifndef TRAINYARD_SERVER_CHECKPOINT_POLICY_H_
#define TRAINYARD_SERVER_CHECKPOINT_POLICY_H_

#include <cstdint>
#include <deque>
#include <limits>
#include <optional>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "proto/stored.pb.h"

namespace trainyard::server {

struct CheckpointPolicyOptions {
  // Prior mean time between infrastructure failures of one node (the server's flag). 5000 h:
  // the Llama 3 report's ~466 interruptions in 54 days on 2,048 8-GPU nodes is ≈5,700 h.
  absl::Duration node_mtbf = absl::Hours(5000);
  int nodes = 1;  // the job's own node count; its prior MTBF at that size is node_mtbf / nodes
  // Weight of the prior in pseudo-failures. Small, so that a wrong prior yields to a few real
  // failures.
  double prior_failures = 1.0;
  // Half-life of the MTBF evidence in units of the current MTBF estimate (h above). Longer is
  // steadier at a constant rate and slower to follow a fall; 6 did best of 4, 6 and 8 in
  // bench/young_daly_sim.cc.
  double memory_mtbfs = 6.0;
  int delta_window = 5;       // committed saves whose median is δ
  int step_time_window = 16;  // step-time reports whose median is the step time
  // The spec's bounds on the interval, in steps.
  int64_t min_every_steps = 1;
  int64_t max_every_steps = std::numeric_limits<int64_t>::max();
  // Steps from the last checkpoint to the first save, while δ is unknown.
  int64_t first_checkpoint_steps = 10;
};

// What the coordinator shows in `status` and `/metrics`.
struct CheckpointPolicySnapshot {
  std::optional<double> delta_s;      // δ; nullopt until a committed save was measured
  std::optional<double> step_time_s;  // nullopt until a step time was reported
  double mtbf_s = 0;                  // M̂, the job's estimated MTBF
  std::optional<double> interval_s;   // Daly's τ; nullopt while δ is unknown
  // Steps between saves (the early first save while δ is unknown); nullopt until a step time
  // was reported.
  std::optional<int64_t> interval_steps;
  int64_t failures = 0;                            // every ObserveFailure
  absl::Duration exposure = absl::ZeroDuration();  // every ObserveRunning, summed
  double effective_failures = 0;                   // A: the weight behind M̂, prior included
};

class CheckpointPolicy {
 public:
  // INVALID_ARGUMENT naming the field when `options` cannot be used: a non-positive node MTBF,
  // node count, prior weight, memory, window or step bound, or min_every_steps above
  // max_every_steps.
  [[nodiscard]] static absl::Status Validate(const CheckpointPolicyOptions& options);

  // `options` must be valid (see Validate).
  explicit CheckpointPolicy(CheckpointPolicyOptions options);

  // Young's interval √(2δM), in seconds. Both arguments in seconds, non-negative.
  static double YoungInterval(double delta_s, double mtbf_s);
  // Daly's higher-order interval (see the header comment), in seconds.
  static double DalyInterval(double delta_s, double mtbf_s);

  // The time one committed save blocked training.
  void ObserveCheckpoint(double blocked_seconds);
  // Mean seconds per optimizer step, as a progress report gives it.
  void ObserveStepTime(double seconds);
  // The job ran (held its nodes) for `exposure` more. Report the time up to a failure before
  // the failure.
  void ObserveRunning(absl::Duration exposure);
  // An infrastructure failure ended an attempt of the job.
  void ObserveFailure();
  // The job runs on `nodes` (at least 1) from now: an elastic attempt's size. Later exposure
  // counts in proportion to it, and M̂ is given at it. Until called, the job's own nodes.
  void RunOn(int nodes);

  // The step at which the ranks should next save: last_checkpoint_step + interval_steps, or
  // reported_step + 1 when that is already reached. nullopt until a step time is known.
  std::optional<int64_t> NextCheckpointStep(int64_t reported_step,
                                            int64_t last_checkpoint_step) const;

  // The current estimates; see CheckpointPolicySnapshot.
  CheckpointPolicySnapshot Snapshot() const;

  // M̂ at the size the job runs at now, in seconds.
  double mtbf_seconds() const { return OwnSizeMtbf() * options_.nodes / nodes_; }
  // Steps between saves: Daly's τ over the step time, clamped to the spec's bounds; the early
  // first save's distance while δ is unknown; nullopt until a step time is known.
  std::optional<int64_t> IntervalSteps() const;

  // The estimates, to store and to restore after a coordinator restart (Load replaces them;
  // INVALID_ARGUMENT for values no policy could hold).
  stored::YoungDaly Save() const;
  [[nodiscard]] absl::Status Load(const stored::YoungDaly& saved);

 private:
  // The change tests: windows of kChangeMinFailures to kChangeMaxFailures failures for a rise,
  // each test with a false-alarm probability of kChangeAlpha.
  static constexpr int kChangeMinFailures = 3;
  static constexpr int kChangeMaxFailures = 8;
  static constexpr double kChangeAlpha = 1e-3;
  // A point of the exposure clock where a change-test window may start (the start, a failure, a
  // reset) and the MTBF estimate then.
  struct Mark {
    double exposure_s;
    double mtbf_s;
  };

  // M̂ at the job's own size: the evidence, and every exposure below, counts time at that size.
  double OwnSizeMtbf() const { return evidence_exposure_s_ / evidence_failures_; }
  // Decays the MTBF evidence over `seconds` of exposure and adds the exposure.
  void Expose(double seconds);

  const CheckpointPolicyOptions options_;
  std::deque<double> deltas_;      // the last delta_window blocked times
  std::deque<double> step_times_;  // the last step_time_window step times
  double evidence_failures_;       // A
  double evidence_exposure_s_;     // B
  std::deque<Mark> marks_;         // the last kChangeMaxFailures window starts, oldest first
  int64_t failures_ = 0;
  int nodes_;           // the nodes the job runs on now
  double clock_s_ = 0;  // exposure so far, in seconds at the job's own size; marks_ are on it
  absl::Duration exposure_ = absl::ZeroDuration();
};

}  // namespace trainyard::server

#endif  // TRAINYARD_SERVER_CHECKPOINT_POLICY_H_
