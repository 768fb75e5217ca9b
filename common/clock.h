// The clock seam: code that reads time or sleeps takes a Clock*, so tests drive time by hand.
//
// Threading: RealClock() and FakeClock are safe to use from any number of threads.
#ifndef TRAINYARD_COMMON_CLOCK_H_
#define TRAINYARD_COMMON_CLOCK_H_

#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace trainyard {

class Clock {
 public:
  virtual ~Clock() = default;

  // Wall-clock time, for timestamps shown to people and stored in records.
  virtual absl::Time Now() = 0;

  // Blocks the calling thread for `duration` (returns at once when it is not positive).
  virtual void SleepFor(absl::Duration duration) = 0;

  // Nanoseconds on a monotonic clock with an arbitrary origin, for measuring durations; never
  // goes backwards, unlike Now().
  virtual int64_t NowNanosMonotonic() = 0;
};

// The process-wide clock backed by the system clocks. Never null; never deleted.
Clock* RealClock();

// A clock that moves only when told to. SleepFor advances it instead of blocking, so code under
// test that sleeps returns at once with the time moved on.
class FakeClock : public Clock {
 public:
  // Starts at `start` (wall time) and at monotonic reading 0.
  explicit FakeClock(absl::Time start = absl::FromUnixSeconds(1'700'000'000));

  absl::Time Now() override;
  void SleepFor(absl::Duration duration) override;
  int64_t NowNanosMonotonic() override;

  // Moves both readings forward by `duration`; negative durations are ignored (time never goes
  // backwards).
  void Advance(absl::Duration duration);

  // Total time passed to SleepFor so far, so tests can check that code backed off.
  absl::Duration TotalSlept();

 private:
  absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
  absl::Duration elapsed_ ABSL_GUARDED_BY(mu_);
  absl::Duration slept_ ABSL_GUARDED_BY(mu_);
};

}  // namespace trainyard

#endif  // TRAINYARD_COMMON_CLOCK_H_
