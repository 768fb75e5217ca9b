#include "server/checkpoint_policy.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "planner/planner.h"

namespace trainyard::server {
namespace {

double Median(const std::deque<double>& values) {
  std::vector<double> sorted(values.begin(), values.end());
  std::sort(sorted.begin(), sorted.end());
  const size_t mid = sorted.size() / 2;
  return sorted.size() % 2 == 1 ? sorted[mid] : 0.5 * (sorted[mid - 1] + sorted[mid]);
}

void PushBounded(std::deque<double>& values, double value, int capacity) {
  values.push_back(value);
  while (values.size() > static_cast<size_t>(capacity)) values.pop_front();
}

// P[N >= n] for N ~ Poisson(mean).
double PoissonTailAtLeast(int n, double mean) {
  double term = std::exp(-mean);  // P[N = 0]
  double below = 0;
  for (int k = 0; k < n; ++k) {
    below += term;
    term *= mean / (k + 1);
  }
  return std::max(0.0, 1 - below);
}

absl::Status Bad(const char* field, const std::string& reason) {
  return absl::InvalidArgumentError(absl::StrCat("checkpoint policy ", field, ": ", reason));
}

}  // namespace

absl::Status CheckpointPolicy::Validate(const CheckpointPolicyOptions& options) {
  if (options.node_mtbf <= absl::ZeroDuration() || options.node_mtbf == absl::InfiniteDuration()) {
    return Bad("node_mtbf", "must be positive and finite");
  }
  if (options.nodes < 1) {
    return Bad("nodes", absl::StrCat("must be at least 1, got ", options.nodes));
  }
  if (!(options.prior_failures > 0) || !std::isfinite(options.prior_failures)) {
    return Bad("prior_failures", "must be positive and finite");
  }
  if (!(options.memory_mtbfs > 0) || !std::isfinite(options.memory_mtbfs)) {
    return Bad("memory_mtbfs", "must be positive and finite");
  }
  if (options.delta_window < 1) return Bad("delta_window", "must be at least 1");
  if (options.step_time_window < 1) return Bad("step_time_window", "must be at least 1");
  if (options.min_every_steps < 1) return Bad("min_every_steps", "must be at least 1");
  if (options.max_every_steps < options.min_every_steps) {
    return Bad("max_every_steps",
               absl::StrCat("must be at least min_every_steps (", options.min_every_steps,
                            "), got ", options.max_every_steps));
  }
  if (options.first_checkpoint_steps < 1) {
    return Bad("first_checkpoint_steps", "must be at least 1");
  }
  return absl::OkStatus();
}

CheckpointPolicy::CheckpointPolicy(CheckpointPolicyOptions options)
    : options_(std::move(options)),
      evidence_failures_(options_.prior_failures),
      evidence_exposure_s_(options_.prior_failures * absl::ToDoubleSeconds(options_.node_mtbf) /
                           options_.nodes),
      nodes_(options_.nodes) {
  marks_.push_back({0, OwnSizeMtbf()});
}

// The planner's formulas (`trainyard plan` prints the same interval).
double CheckpointPolicy::YoungInterval(double delta_s, double mtbf_s) {
  return planner::YoungInterval(delta_s, mtbf_s);
}

double CheckpointPolicy::DalyInterval(double delta_s, double mtbf_s) {
  return planner::DalyInterval(delta_s, mtbf_s);
}

void CheckpointPolicy::ObserveCheckpoint(double blocked_seconds) {
  if (!std::isfinite(blocked_seconds) || blocked_seconds < 0) return;
  PushBounded(deltas_, blocked_seconds, options_.delta_window);
}

void CheckpointPolicy::ObserveStepTime(double seconds) {
  if (!std::isfinite(seconds) || seconds <= 0) return;
  PushBounded(step_times_, seconds, options_.step_time_window);
}

void CheckpointPolicy::ObserveRunning(absl::Duration exposure) {
  if (exposure < absl::ZeroDuration() || exposure == absl::InfiniteDuration()) return;
  exposure_ += exposure;
  const double at_own_size = absl::ToDoubleSeconds(exposure) * nodes_ / options_.nodes;
  Expose(at_own_size);
  clock_s_ += at_own_size;
  // The fall test: no failure for so long that P = e^(-quiet / M_then) < kChangeAlpha.
  const double quiet_s = clock_s_ - marks_.back().exposure_s;
  if (quiet_s > -std::log(kChangeAlpha) * marks_.back().mtbf_s && quiet_s > OwnSizeMtbf()) {
    evidence_failures_ = 1;
    evidence_exposure_s_ = quiet_s;
    marks_.clear();
    marks_.push_back({clock_s_, OwnSizeMtbf()});
  }
}

void CheckpointPolicy::ObserveFailure() {
  ++failures_;
  evidence_failures_ += 1;
  const double now_s = clock_s_;
  // marks_[i] starts the window of the last (size - i) failures, this one included.
  for (int n = kChangeMaxFailures; n >= kChangeMinFailures; --n) {
    if (static_cast<int>(marks_.size()) < n) continue;
    const Mark& start = marks_[marks_.size() - n];
    const double window_s = now_s - start.exposure_s;
    if (PoissonTailAtLeast(n, window_s / start.mtbf_s) < kChangeAlpha) {
      evidence_failures_ = n;
      evidence_exposure_s_ = std::max(window_s, 1e-3);  // failures with no exposure between
      marks_.clear();
      break;
    }
  }
  marks_.push_back({now_s, OwnSizeMtbf()});
  while (static_cast<int>(marks_.size()) > kChangeMaxFailures) marks_.pop_front();
}

void CheckpointPolicy::RunOn(int nodes) { nodes_ = std::max(nodes, 1); }

void CheckpointPolicy::Expose(double seconds) {
  // The decay rate depends on M̂, which grows while exposure accrues without failures: integrate
  // in chunks of at most a tenth of the current half-life, within which it is held constant and
  // the update is exact. Reports come every few seconds against half-lives of hours, so this is
  // one chunk but for long gaps; M̂ grows geometrically from chunk to chunk, so even those take
  // few. The 1 ms floor guarantees progress.
  double left = seconds;
  while (left > 0) {
    const double half_life = options_.memory_mtbfs * OwnSizeMtbf();
    const double chunk = std::min(left, std::max(0.1 * half_life, 1e-3));
    const double rate = std::log(2.0) / half_life;
    const double gained = -std::expm1(-rate * chunk);  // 1 - e^(-k·chunk), exact for small ones
    evidence_failures_ *= 1 - gained;
    evidence_exposure_s_ = evidence_exposure_s_ * (1 - gained) + gained / rate;
    left -= chunk;
  }
}

std::optional<int64_t> CheckpointPolicy::IntervalSteps() const {
  if (step_times_.empty()) return std::nullopt;
  double steps = static_cast<double>(options_.first_checkpoint_steps);
  if (!deltas_.empty()) {
    steps = std::round(DalyInterval(Median(deltas_), mtbf_seconds()) / Median(step_times_));
  }
  // Clamp as a double first: τ / step time can exceed what an int64_t holds.
  steps = std::clamp(steps, static_cast<double>(options_.min_every_steps),
                     static_cast<double>(options_.max_every_steps));
  if (steps >= static_cast<double>(options_.max_every_steps)) return options_.max_every_steps;
  return std::max(options_.min_every_steps, static_cast<int64_t>(steps));
}

std::optional<int64_t> CheckpointPolicy::NextCheckpointStep(int64_t reported_step,
                                                            int64_t last_checkpoint_step) const {
  const std::optional<int64_t> interval = IntervalSteps();
  if (!interval) return std::nullopt;
  const int64_t next = last_checkpoint_step > std::numeric_limits<int64_t>::max() - *interval
                           ? std::numeric_limits<int64_t>::max()
                           : last_checkpoint_step + *interval;
  if (reported_step == std::numeric_limits<int64_t>::max()) return reported_step;
  return std::max(next, reported_step + 1);
}

CheckpointPolicySnapshot CheckpointPolicy::Snapshot() const {
  CheckpointPolicySnapshot snapshot;
  if (!deltas_.empty()) snapshot.delta_s = Median(deltas_);
  if (!step_times_.empty()) snapshot.step_time_s = Median(step_times_);
  snapshot.mtbf_s = mtbf_seconds();
  if (snapshot.delta_s) snapshot.interval_s = DalyInterval(*snapshot.delta_s, snapshot.mtbf_s);
  snapshot.interval_steps = IntervalSteps();
  snapshot.failures = failures_;
  snapshot.exposure = exposure_;
  snapshot.effective_failures = evidence_failures_;
  return snapshot;
}

stored::YoungDaly CheckpointPolicy::Save() const {
  stored::YoungDaly saved;
  for (double delta : deltas_) saved.add_deltas(delta);
  for (double step_time : step_times_) saved.add_step_times(step_time);
  saved.set_evidence_failures(evidence_failures_);
  saved.set_evidence_exposure_s(evidence_exposure_s_);
  for (const Mark& mark : marks_) {
    stored::YoungDaly::Mark* m = saved.add_marks();
    m->set_exposure_s(mark.exposure_s);
    m->set_mtbf_s(mark.mtbf_s);
  }
  saved.set_failures(failures_);
  saved.set_exposure_ns(absl::ToInt64Nanoseconds(exposure_));
  saved.set_clock_s(clock_s_);
  return saved;
}

absl::Status CheckpointPolicy::Load(const stored::YoungDaly& saved) {
  const auto finite_non_negative = [](double v) { return std::isfinite(v) && v >= 0; };
  if (!(saved.evidence_failures() > 0) || !std::isfinite(saved.evidence_failures()) ||
      !(saved.evidence_exposure_s() > 0) || !std::isfinite(saved.evidence_exposure_s()) ||
      saved.failures() < 0 || saved.exposure_ns() < 0 || !(saved.clock_s() >= 0) ||
      !std::isfinite(saved.clock_s()) ||
      !std::all_of(saved.deltas().begin(), saved.deltas().end(), finite_non_negative) ||
      !std::all_of(saved.step_times().begin(), saved.step_times().end(), finite_non_negative)) {
    return absl::InvalidArgumentError("stored Young–Daly estimates out of range");
  }
  deltas_.assign(saved.deltas().begin(), saved.deltas().end());
  while (static_cast<int>(deltas_.size()) > options_.delta_window) deltas_.pop_front();
  step_times_.assign(saved.step_times().begin(), saved.step_times().end());
  while (static_cast<int>(step_times_.size()) > options_.step_time_window) step_times_.pop_front();
  evidence_failures_ = saved.evidence_failures();
  evidence_exposure_s_ = saved.evidence_exposure_s();
  marks_.clear();
  for (const stored::YoungDaly::Mark& m : saved.marks())
    marks_.push_back({m.exposure_s(), m.mtbf_s()});
  while (static_cast<int>(marks_.size()) > kChangeMaxFailures) marks_.pop_front();
  failures_ = saved.failures();
  exposure_ = absl::Nanoseconds(saved.exposure_ns());
  // Stored before the clock was: its exposure was all counted as time at the job's own size.
  clock_s_ = saved.clock_s() > 0 ? saved.clock_s() : absl::ToDoubleSeconds(exposure_);
  return absl::OkStatus();
}

}  // namespace trainyard::server
