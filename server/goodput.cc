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

namespace {

int64_t Nanos(absl::Time t) { return absl::ToUnixNanos(t); }
absl::Time FromNanos(int64_t ns) { return absl::FromUnixNanos(ns); }

}  // namespace

stored::Goodput GoodputAccount::Save() const {
  stored::Goodput saved;
  for (const Attempt& a : attempts_) {
    stored::Goodput::Attempt* out = saved.add_attempts();
    out->set_scheduled_ns(Nanos(a.scheduled));
    out->set_resume_step(a.resume_step);
    if (a.first_step_time) out->set_first_step_time_ns(Nanos(*a.first_step_time));
    out->set_first_step(a.first_step);
    out->set_top_step(a.top_step);
    if (a.last_report != absl::InfinitePast()) out->set_last_report_ns(Nanos(a.last_report));
    out->set_training_ns(absl::ToInt64Nanoseconds(a.training));
    out->set_stalled_ns(absl::ToInt64Nanoseconds(a.stalled));
    out->set_checkpoint_blocked_ns(absl::ToInt64Nanoseconds(a.checkpoint_blocked));
    if (a.end) out->set_end_ns(Nanos(*a.end));
    if (a.failure) out->set_failure(*a.failure);
    for (const Cut& c : a.cuts) {
      stored::Goodput::Cut* cut = out->add_cuts();
      cut->set_step(c.step);
      cut->set_cause(c.cause);
      cut->set_by(c.by);
    }
  }
  for (const Failure& f : failures_) {
    stored::Goodput::Failure* out = saved.add_failures();
    out->set_cause(f.cause);
    out->set_detection_ns(absl::ToInt64Nanoseconds(f.detection));
    out->set_detected_ns(Nanos(f.detected));
    if (f.next_first_step) out->set_next_first_step_ns(Nanos(*f.next_first_step));
  }
  if (finished_) saved.set_finished_ns(Nanos(*finished_));
  if (latest_ != absl::InfinitePast()) saved.set_latest_ns(Nanos(latest_));
  return saved;
}

absl::Status GoodputAccount::Load(const stored::Goodput& saved) {
  std::vector<Attempt> attempts;
  for (const stored::Goodput::Attempt& in : saved.attempts()) {
    Attempt& a = attempts.emplace_back();
    a.scheduled = FromNanos(in.scheduled_ns());
    a.resume_step = in.resume_step();
    if (in.has_first_step_time_ns()) a.first_step_time = FromNanos(in.first_step_time_ns());
    a.first_step = in.first_step();
    a.top_step = in.top_step();
    a.last_report = in.has_last_report_ns() ? FromNanos(in.last_report_ns()) : absl::InfinitePast();
    a.training = absl::Nanoseconds(in.training_ns());
    a.stalled = absl::Nanoseconds(in.stalled_ns());
    a.checkpoint_blocked = absl::Nanoseconds(in.checkpoint_blocked_ns());
    if (in.has_end_ns()) a.end = FromNanos(in.end_ns());
    if (in.has_failure()) {
      if (in.failure() >= static_cast<uint64_t>(saved.failures_size())) {
        return absl::InvalidArgumentError("a stored goodput attempt names a failure it lacks");
      }
      a.failure = in.failure();
    }
    for (const stored::Goodput::Cut& c : in.cuts()) {
      if (c.by() >= static_cast<uint64_t>(saved.attempts_size())) {
        return absl::InvalidArgumentError("a stored goodput cut names an attempt it lacks");
      }
      a.cuts.push_back(Cut{c.step(), c.cause(), c.by()});
    }
  }
  // Every attempt but the latest has ended by failing: AttemptScheduled reads that failure.
  for (size_t i = 0; i + 1 < attempts.size(); ++i) {
    if (!attempts[i].failure) {
      return absl::InvalidArgumentError("a stored goodput attempt before the latest never ended");
    }
  }
  std::vector<Failure> failures;
  for (const stored::Goodput::Failure& in : saved.failures()) {
    Failure& f = failures.emplace_back();
    f.cause = in.cause();
    f.detection = absl::Nanoseconds(in.detection_ns());
    f.detected = FromNanos(in.detected_ns());
    if (in.has_next_first_step_ns()) f.next_first_step = FromNanos(in.next_first_step_ns());
  }
  attempts_ = std::move(attempts);
  failures_ = std::move(failures);
  finished_.reset();
  if (saved.has_finished_ns()) finished_ = FromNanos(saved.finished_ns());
  latest_ = saved.has_latest_ns() ? FromNanos(saved.latest_ns()) : absl::InfinitePast();
  return absl::OkStatus();
}

}  // namespace trainyard::server
