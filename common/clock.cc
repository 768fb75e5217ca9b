#include "common/clock.h"

#include <chrono>

#include "absl/time/clock.h"

namespace trainyard {
namespace {

class SystemClock : public Clock {
 public:
  absl::Time Now() override { return absl::Now(); }

  void SleepFor(absl::Duration duration) override {
    if (duration > absl::ZeroDuration()) absl::SleepFor(duration);
  }

  int64_t NowNanosMonotonic() override {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
};

}  // namespace

Clock* RealClock() {
  static Clock* clock = new SystemClock;
  return clock;
}

FakeClock::FakeClock(absl::Time start)
    : now_(start), elapsed_(absl::ZeroDuration()), slept_(absl::ZeroDuration()) {}

absl::Time FakeClock::Now() {
  absl::MutexLock lock(&mu_);
  return now_;
}

void FakeClock::SleepFor(absl::Duration duration) {
  if (duration <= absl::ZeroDuration()) return;
  absl::MutexLock lock(&mu_);
  now_ += duration;
  elapsed_ += duration;
  slept_ += duration;
}

int64_t FakeClock::NowNanosMonotonic() {
  absl::MutexLock lock(&mu_);
  return absl::ToInt64Nanoseconds(elapsed_);
}

void FakeClock::Advance(absl::Duration duration) {
  if (duration <= absl::ZeroDuration()) return;
  absl::MutexLock lock(&mu_);
  now_ += duration;
  elapsed_ += duration;
}

absl::Duration FakeClock::TotalSlept() {
  absl::MutexLock lock(&mu_);
  return slept_;
}

}  // namespace trainyard
