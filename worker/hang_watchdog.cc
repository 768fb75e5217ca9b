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
      absl::StrFormat("step %d has run %.1f s (limit %.1f s)", step + 1, elapsed_s, limit_s);
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
      poll_(poll) {
  since_nanos_ = clock_->NowNanosMonotonic();
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
  // Until a step has finished, the start-up limit runs from construction.
  if (!recent_.empty() || !armed_) since_nanos_ = clock_->NowNanosMonotonic();
  armed_ = true;
}

void HangWatchdog::StepFinished(double seconds) {
  absl::MutexLock lock(&mu_);
  recent_.push_back(seconds);
  if (recent_.size() > config::kHangLimitHistory) recent_.pop_front();
  since_nanos_ = clock_->NowNanosMonotonic();
}

void HangWatchdog::Suspend() {
  absl::MutexLock lock(&mu_);
  armed_ = false;
}

double HangWatchdog::LimitSeconds() const {
  absl::MutexLock lock(&mu_);
  const std::vector<double> recent(recent_.begin(), recent_.end());
  return config::HangLimitSeconds(limits_, recent);
}

bool HangWatchdog::Poll() {
  HangDiagnosis diagnosis;
  {
    absl::MutexLock lock(&mu_);
    if (!armed_ || fired_) return false;
    const int64_t now = clock_->NowNanosMonotonic();
    const std::vector<double> recent(recent_.begin(), recent_.end());
    diagnosis.limit_s = config::HangLimitSeconds(limits_, recent);
    diagnosis.elapsed_s = (now - since_nanos_) / 1e9;
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
