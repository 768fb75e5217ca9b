#include "common/clock.h"

#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace trainyard {
namespace {

TEST(FakeClockTest, MovesOnlyWhenAdvanced) {
  const absl::Time start = absl::FromUnixSeconds(1000);
  FakeClock clock(start);
  EXPECT_EQ(clock.Now(), start);
  EXPECT_EQ(clock.NowNanosMonotonic(), 0);
  EXPECT_EQ(clock.Now(), start);

  clock.Advance(absl::Milliseconds(1500));
  EXPECT_EQ(clock.Now(), start + absl::Milliseconds(1500));
  EXPECT_EQ(clock.NowNanosMonotonic(), 1'500'000'000);

  clock.Advance(-absl::Seconds(10));  // ignored: time never goes backwards
  EXPECT_EQ(clock.Now(), start + absl::Milliseconds(1500));
}

TEST(FakeClockTest, SleepAdvancesWithoutBlocking) {
  FakeClock clock(absl::FromUnixSeconds(0));
  const absl::Time wall_before = absl::Now();
  clock.SleepFor(absl::Hours(2));
  clock.SleepFor(absl::ZeroDuration());
  clock.SleepFor(-absl::Seconds(1));
  EXPECT_LT(absl::Now() - wall_before, absl::Seconds(5));
  EXPECT_EQ(clock.Now(), absl::FromUnixSeconds(7200));
  EXPECT_EQ(clock.NowNanosMonotonic(), absl::ToInt64Nanoseconds(absl::Hours(2)));
  EXPECT_EQ(clock.TotalSlept(), absl::Hours(2));
  clock.Advance(absl::Seconds(1));
  EXPECT_EQ(clock.TotalSlept(), absl::Hours(2));
}

TEST(FakeClockTest, ConcurrentAdvancesAllCount) {
  FakeClock clock(absl::FromUnixSeconds(0));
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&clock] {
      for (int i = 0; i < 1000; ++i) clock.Advance(absl::Nanoseconds(1));
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(clock.NowNanosMonotonic(), 4000);
}

TEST(RealClockTest, MonotonicReadingsDoNotGoBackwardsAndSleepWaits) {
  Clock* clock = RealClock();
  ASSERT_EQ(clock, RealClock());
  const int64_t before = clock->NowNanosMonotonic();
  clock->SleepFor(absl::Milliseconds(20));
  const int64_t after = clock->NowNanosMonotonic();
  EXPECT_GE(after - before, 20'000'000);
  EXPECT_LT(absl::AbsDuration(clock->Now() - absl::Now()), absl::Seconds(1));
}

}  // namespace
}  // namespace trainyard
