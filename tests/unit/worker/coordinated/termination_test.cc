// TerminationWatcher: each SIGTERM asks once; ORDER_DRAIN sets the drain flag and the process
// lives on, anything else (a stop, an error) ends it.
#include "worker/termination.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <thread>

#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace trainyard::worker {
namespace {

// Polls `done` for up to 10 s.
bool Eventually(const std::function<bool()>& done) {
  for (int i = 0; i < 1000; ++i) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return done();
}

TEST(TerminationWatcherTest, ADrainAnswerSetsTheDrainFlagAndTheProcessLivesOn) {
  std::atomic<bool> drain{false};
  std::atomic<int> asks{0};
  std::atomic<int> terminated{0};
  TerminationWatcher watcher(
      [&asks](absl::Duration timeout) -> absl::StatusOr<v1::Order> {
        EXPECT_EQ(timeout, kTerminationTimeout);
        ++asks;
        return v1::ORDER_DRAIN;
      },
      &drain, [&terminated] { ++terminated; });
  ASSERT_EQ(kill(getpid(), SIGTERM), 0);
  ASSERT_TRUE(Eventually([&] { return drain.load(); }));
  EXPECT_EQ(asks.load(), 1);
  // A second SIGTERM (the batch system's, after the agent's) asks again; still a drain.
  ASSERT_EQ(kill(getpid(), SIGTERM), 0);
  ASSERT_TRUE(Eventually([&] { return asks.load() == 2; }));
  EXPECT_TRUE(drain.load());
  EXPECT_EQ(terminated.load(), 0);
}

TEST(TerminationWatcherTest, AStopAnswerEndsTheProcess) {
  std::atomic<bool> drain{false};
  std::atomic<int> terminated{0};
  TerminationWatcher watcher(
      [](absl::Duration) -> absl::StatusOr<v1::Order> { return v1::ORDER_STOP; }, &drain,
      [&terminated] { ++terminated; });
  ASSERT_EQ(kill(getpid(), SIGTERM), 0);
  ASSERT_TRUE(Eventually([&] { return terminated.load() == 1; }));
  EXPECT_FALSE(drain.load());
}

TEST(TerminationWatcherTest, NoAnswerEndsTheProcess) {
  std::atomic<bool> drain{false};
  std::atomic<int> terminated{0};
  TerminationWatcher watcher(
      [](absl::Duration) -> absl::StatusOr<v1::Order> {
        return absl::UnavailableError("connection refused");
      },
      &drain, [&terminated] { ++terminated; });
  ASSERT_EQ(kill(getpid(), SIGTERM), 0);
  ASSERT_TRUE(Eventually([&] { return terminated.load() == 1; }));
  EXPECT_FALSE(drain.load());
  EXPECT_EQ(watcher.handled(), 1);
}

// The default ending is SIGTERM's own action: the process dies by the signal, as it would have
// without a watcher (its agent reports "signal 15").
TEST(TerminationWatcherDeathTest, TheDefaultEndingIsDeathBySigterm) {
  EXPECT_EXIT(
      {
        std::atomic<bool> drain{false};
        TerminationWatcher watcher(
            [](absl::Duration) -> absl::StatusOr<v1::Order> { return v1::ORDER_STOP; }, &drain);
        kill(getpid(), SIGTERM);
        std::this_thread::sleep_for(std::chrono::seconds(10));
        std::_Exit(0);
      },
      ::testing::KilledBySignal(SIGTERM), "");
}

}  // namespace
}  // namespace trainyard::worker
