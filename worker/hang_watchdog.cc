#include "worker/hang_watchdog.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "config/hang_limit.h"

namespace trainyard::worker {

std::string HangDiagnosis::Describe() const {
  std::string text =
      phase == config::HangPhase::kStep
          ? absl::StrFormat("step %d has run %.1f s (limit %.1f s)", step + 1, elapsed_s, limit_s)
          : absl::StrFormat("the %s of step %d has run %.1f s (limit %.1f s)",
                            config::HangPhaseName(phase), step + 1, elapsed_s, limit_s);
  if (!wait) return absl::StrCat(text, ", not blocked in a collective");
  std::vector<std::string> peers;
  for (int r : wait->waiting_for) peers.push_back(absl::StrCat(r));
  return absl::StrFormat("%s, blocked %.1f s in %s (%s group) waiting for rank%s %s", text,
                         waiting_s, wait->operation, wait->group, peers.size() == 1 ? "" : "s",
                         absl::StrJoin(peers, ", "));
}

HangWatchdog::HangWatchdog(config::FaultToleranceSpec limits, Clock* clock,
                           const parallel::WaitRegistry* waits, OnHang on_hang, absl::Duration poll)
    : limits_(std::move(limits)),
      clock_(clock),
      waits_(waits),
      on_hang_(std::move(on_hang)),
      poll_(poll),
      created_nanos_(clock_->NowNanosMonotonic()) {
  since_nanos_ = created_nanos_;
}

HangWatchdog::~HangWatchdog() {
  stop_.Notify();
  if (poller_.joinable()) poller_.join();
}

void HangWatchdog::Start() {
  poller_ = std::thread([this] {
    while (!stop_.WaitForNotificationWithTimeout(poll_)) {
      if (Poll()) return;
    }
  });
}

void HangWatchdog::StepStarted(int64_t completed) {
  absl::MutexLock lock(&mu_);
  step_ = completed;
  phase_ = config::HangPhase::kStep;
  since_nanos_ = clock_->NowNanosMonotonic();
  step_spent_s_ = 0;
  armed_ = true;
}

void HangWatchdog::StepFinished() {
  absl::MutexLock lock(&mu_);
  const int64_t now = clock_->NowNanosMonotonic();
  std::deque<double>& steps = recent_[static_cast<int>(config::HangPhase::kStep)];
  steps.push_back(step_spent_s_ + (now - since_nanos_) / 1e9);
  if (steps.size() > config::kHangLimitHistory) steps.pop_front();
  since_nanos_ = now;
  step_spent_s_ = 0;
}

double HangWatchdog::PhaseStarted(config::HangPhase phase) {
  absl::MutexLock lock(&mu_);
  const int64_t now = clock_->NowNanosMonotonic();
  if (phase_ == config::HangPhase::kStep) step_spent_s_ += (now - since_nanos_) / 1e9;
  phase_ = phase;
  since_nanos_ = now;
  return LimitLocked(phase);
}

void HangWatchdog::PhaseFinished() {
  absl::MutexLock lock(&mu_);
  if (phase_ == config::HangPhase::kStep) return;
  const int64_t now = clock_->NowNanosMonotonic();
  std::deque<double>& durations = recent_[static_cast<int>(phase_)];
  durations.push_back((now - since_nanos_) / 1e9);
  if (durations.size() > config::kHangLimitHistory) durations.pop_front();
  phase_ = config::HangPhase::kStep;
  since_nanos_ = now;
}

void HangWatchdog::Suspend() {
  absl::MutexLock lock(&mu_);
  armed_ = false;
}

double HangWatchdog::LimitLocked(config::HangPhase phase) const {
  const std::deque<double>& durations = recent_[static_cast<int>(phase)];
  const std::vector<double> recent(durations.begin(), durations.end());
  return config::HangLimitSeconds(limits_, recent);
}

double HangWatchdog::LimitSeconds() const {
  absl::MutexLock lock(&mu_);
  return LimitLocked(config::HangPhase::kStep);
}

bool HangWatchdog::Poll() {
  HangDiagnosis diagnosis;
  {
    absl::MutexLock lock(&mu_);
    if (!armed_ || fired_) return false;
    const int64_t now = clock_->NowNanosMonotonic();
    diagnosis.phase = phase_;
    if (StartingUp()) {  // the whole first iteration, from the worker's start
      diagnosis.limit_s = limits_.hang_startup_s;
      diagnosis.elapsed_s = (now - created_nanos_) / 1e9;
    } else {
      diagnosis.limit_s = LimitLocked(phase_);
      diagnosis.elapsed_s = (now - since_nanos_) / 1e9;
      if (phase_ == config::HangPhase::kStep) diagnosis.elapsed_s += step_spent_s_;
    }
    if (diagnosis.elapsed_s <= diagnosis.limit_s) return false;
    fired_ = true;
    diagnosis.step = step_;
    if (waits_ != nullptr) {
      std::vector<parallel::CollectiveWait> waits = waits_->Snapshot();
      if (!waits.empty()) {
        diagnosis.waiting_s = (now - waits.front().since_nanos) / 1e9;
        diagnosis.wait = std::move(waits.front());
      }
    }
  }
  on_hang_(diagnosis);
  return true;
}

}  // namespace trainyard::worker
