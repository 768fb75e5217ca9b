#include "server/call_executor.h"

#include <atomic>
#include <thread>

#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace trainyard::server {
namespace {

// Calls that wait (for a store) wait side by side: as many as the pool has threads, none of
// them on the caller's thread.
TEST(CallExecutorTest, RunsWaitingWorkSideBySideOffTheCallersThread) {
  constexpr int kThreads = 8;
  CallExecutor executor(kThreads);
  absl::BlockingCounter all_waiting(kThreads);
  absl::Notification release;
  std::atomic<int> on_caller{0};
  std::atomic<int> finished{0};
  const std::thread::id caller = std::this_thread::get_id();
  for (int i = 0; i < kThreads; ++i) {
    executor.Run([&] {
      if (std::this_thread::get_id() == caller) on_caller.fetch_add(1);
      all_waiting.DecrementCount();
      release.WaitForNotification();
      finished.fetch_add(1);
    });
  }
  all_waiting.Wait();  // every one is running at once: none waits for another to end
  EXPECT_EQ(finished.load(), 0);
  release.Notify();
  while (finished.load() < kThreads) std::this_thread::yield();
  EXPECT_EQ(on_caller.load(), 0);
}

// The destructor runs everything queued before it joins (a call handed over is always answered).
TEST(CallExecutorTest, RunsWhatIsQueuedBeforeItStops) {
  std::atomic<int> ran{0};
  {
    CallExecutor executor(2);
    for (int i = 0; i < 500; ++i) executor.Run([&] { ran.fetch_add(1); });
  }
  EXPECT_EQ(ran.load(), 500);
}

}  // namespace
}  // namespace trainyard::server
