#include "server/goodput.h"

#include <algorithm>
#include <cmath>

namespace trainyard::server {
namespace {

using Durations = std::map<std::string, absl::Duration>;

std::map<std::string, double> ToSeconds(const Durations& durations) {
  std::map<std::string, double> seconds;
  for (const auto& [cause, duration] : durations) {
    seconds[cause] = absl::ToDoubleSeconds(duration);
  }
  return seconds;
}

absl::Duration Total(const Durations& durations) {
  absl::Duration total;
  for (const auto& [cause, duration] : durations) total += duration;
  return total;
}

}  // namespace

absl::Time GoodputAccount::Ordered(absl::Time t) {
  latest_ = std::max(latest_, t);
  return latest_;
}

bool GoodputAccount::running() const {
  return !finished_.has_value() && !attempts_.empty() && !attempts_.back().end.has_value();
}

void GoodputAccount::AttemptScheduled(absl::Time t, int64_t resume_step) {
  if (finished_.has_value()) return;
  t = Ordered(t);
  if (running()) EndRunning(t, absl::ZeroDuration(), t, kRescheduledCause);
  resume_step = std::max<int64_t>(resume_step, 0);
  if (!attempts_.empty()) {
    // Every earlier attempt has ended by failing (Finished ends the account).
    const std::string& cause = failures_[*attempts_.back().failure].cause;
    for (Attempt& attempt : attempts_) {
      if (attempt.first_step_time.has_value() && resume_step < attempt.top_step) {
        attempt.cuts.push_back(Cut{resume_step, cause, attempts_.size()});
      }
    }
  }
  Attempt attempt;
  attempt.scheduled = t;
  attempt.resume_step = resume_step;
  attempts_.push_back(std::move(attempt));
}

void GoodputAccount::Resumed(int64_t step) {
  if (finished_.has_value() || attempts_.empty() || step <= attempts_.back().resume_step) return;
  const size_t latest = attempts_.size() - 1;
  attempts_.back().resume_step = step;
  for (size_t i = 0; i < latest; ++i) {
    Attempt& attempt = attempts_[i];
    for (Cut& cut : attempt.cuts) {
      if (cut.by == latest) cut.step = std::max(cut.step, step);
    }
    std::erase_if(attempt.cuts, [&](const Cut& cut) { return cut.step >= attempt.top_step; });
  }
}

void GoodputAccount::Progress(absl::Time t, int64_t step) {
  if (!running()) return;
  t = Ordered(t);
  Attempt& attempt = attempts_.back();
  if (!attempt.first_step_time.has_value()) {
    if (step <= attempt.resume_step) return;
    attempt.first_step_time = t;
    attempt.first_step = step;
    attempt.top_step = step;
    attempt.last_report = t;
    if (attempts_.size() > 1) {
      const Attempt& previous = attempts_[attempts_.size() - 2];
      failures_[*previous.failure].next_first_step = t;
    }
    return;
  }
  const absl::Duration interval = t - attempt.last_report;
  if (step > attempt.top_step) {
    attempt.training += interval;
    attempt.top_step = step;
  } else {
    attempt.stalled += interval;
  }
  attempt.last_report = t;
}

void GoodputAccount::CheckpointBlocked(double seconds) {
  if (finished_.has_value() || attempts_.empty()) return;
  if (!std::isfinite(seconds) || seconds < 0) return;
  attempts_.back().checkpoint_blocked += absl::Seconds(seconds);
}

void GoodputAccount::Failed(absl::Time fault, absl::Time detected, const std::string& cause) {
  if (!running()) return;
  EndRunning(Ordered(fault), std::max(absl::ZeroDuration(), detected - fault), detected, cause);
}

void GoodputAccount::EndRunning(absl::Time end, absl::Duration detection, absl::Time detected,
                                const std::string& cause) {
  Attempt& attempt = attempts_.back();
  attempt.end = end;
  attempt.failure = failures_.size();
  Failure failure;
  failure.cause = cause;
  failure.detection = detection;
  failure.detected = detected;
  failures_.push_back(std::move(failure));
}

void GoodputAccount::Finished(absl::Time t) {
  if (finished_.has_value()) return;
  t = Ordered(t);
  if (running()) attempts_.back().end = t;
  finished_ = t;
}

GoodputAccount::AttemptShares GoodputAccount::Shares(const Attempt& attempt, absl::Time end,
                                                     Durations& lost) const {
  const absl::Duration nontraining = attempt.stalled + (end - attempt.last_report);
  const absl::Duration checkpoint =
      std::min(attempt.checkpoint_blocked, attempt.training + nontraining);
  const absl::Duration from_nontraining = std::min(checkpoint, nontraining);
  const absl::Duration net_training = attempt.training - (checkpoint - from_nontraining);

  absl::Duration kept = net_training;
  const int64_t measured_steps = attempt.top_step - attempt.first_step;
  int64_t top = attempt.top_step;
  for (const Cut& cut : attempt.cuts) {
    const int64_t floor = std::max(cut.step, attempt.first_step);
    if (floor >= top) continue;
    const double fraction = static_cast<double>(top - floor) / measured_steps;
    const absl::Duration redone = std::min(net_training * fraction, kept);
    lost[cut.cause] += redone;
    kept -= redone;
    top = floor;
  }
  return AttemptShares{checkpoint, kept, nontraining - from_nontraining};
}

GoodputSnapshot GoodputAccount::Snapshot(absl::Time now) const {
  GoodputSnapshot snapshot;
  snapshot.attempts = static_cast<int>(attempts_.size());
  if (attempts_.empty()) return snapshot;
  const absl::Time end = finished_.value_or(std::max(now, latest_));

  Durations restart;
  Durations lost;
  for (const Failure& failure : failures_) {
    restart[failure.cause];
    lost[failure.cause];
    ++snapshot.failures_by_cause[failure.cause];
  }
  absl::Duration startup;
  absl::Duration checkpoint;
  absl::Duration productive;
  for (size_t i = 0; i < attempts_.size(); ++i) {
    const Attempt& attempt = attempts_[i];
    const absl::Time attempt_end = attempt.end.value_or(end);
    // Until the first completed step the time belongs to start-up, or to the restart after the
    // previous attempt's failure (which ended it, at its end).
    const absl::Time waited_from = i == 0 ? attempt.scheduled : *attempts_[i - 1].end;
    const absl::Duration waited = attempt.first_step_time.value_or(attempt_end) - waited_from;
    if (i == 0) {
      startup += waited;
    } else {
      restart[failures_[*attempts_[i - 1].failure].cause] += waited;
    }
    if (!attempt.first_step_time.has_value()) continue;
    const AttemptShares shares = Shares(attempt, attempt_end, lost);
    checkpoint += shares.checkpoint;
    productive += shares.productive;
  }
  const Attempt& last = attempts_.back();
  if (last.failure.has_value()) restart[failures_[*last.failure].cause] += end - *last.end;

  const absl::Duration wall = end - attempts_.front().scheduled;
  const absl::Duration restart_total = Total(restart);
  const absl::Duration lost_total = Total(lost);
  snapshot.wall_s = absl::ToDoubleSeconds(wall);
  snapshot.productive_s = absl::ToDoubleSeconds(productive);
  snapshot.checkpoint_s = absl::ToDoubleSeconds(checkpoint);
  snapshot.startup_s = absl::ToDoubleSeconds(startup);
  snapshot.restart_s = absl::ToDoubleSeconds(restart_total);
  snapshot.lost_s = absl::ToDoubleSeconds(lost_total);
  snapshot.other_s =
      absl::ToDoubleSeconds(wall - productive - checkpoint - startup - restart_total - lost_total);
  snapshot.restart_s_by_cause = ToSeconds(restart);
  snapshot.lost_s_by_cause = ToSeconds(lost);
  snapshot.ratio = wall > absl::ZeroDuration() ? snapshot.productive_s / snapshot.wall_s : 0;

  for (const Failure& failure : failures_) {
    FailureLatency latency;
    latency.cause = failure.cause;
    latency.detection_s = absl::ToDoubleSeconds(failure.detection);
    if (failure.next_first_step.has_value()) {
      latency.restart_s = absl::ToDoubleSeconds(
          std::max(absl::ZeroDuration(), *failure.next_first_step - failure.detected));
    }
    snapshot.failures.push_back(latency);
  }
  if (!snapshot.failures.empty()) {
    snapshot.last_detection_latency_s = snapshot.failures.back().detection_s;
    snapshot.last_restart_latency_s = snapshot.failures.back().restart_s;
  }
  return snapshot;
}

}  // namespace trainyard::server
