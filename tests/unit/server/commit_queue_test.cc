#include "server/commit_queue.h"

#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainyard::server {
namespace {

using testing::ElementsAre;
using testing::IsEmpty;

// A store that records each transaction's events and fails while `failing` is set; `gate`, when
// set, holds the first Commit until it is notified (so that other changes queue behind it).
class RecordingStore final : public StateStore {
 public:
  absl::Status Commit(StoreBatch& batch) override {
    if (gate != nullptr && !gated_once_) {
      gated_once_ = true;
      entered.Notify();
      gate->WaitForNotification();
    }
    absl::MutexLock lock(&mu_);
    if (!failing.ok()) return failing;
    std::vector<std::string> causes;
    for (const EventRecord& event : batch.events) causes.push_back(event.cause);
    transactions.push_back(causes);
    return absl::OkStatus();
  }
  absl::Status CommitSoftState(const SoftStateBatch&) override { return absl::OkStatus(); }
  absl::StatusOr<StoredState> Load() override { return StoredState{}; }
  absl::StatusOr<std::vector<EventRecord>> ListEvents(const std::string&, int) override {
    return std::vector<EventRecord>{};
  }
  absl::StatusOr<std::optional<std::string>> FindJobByClientRequestId(const std::string&) override {
    return std::nullopt;
  }

  std::vector<std::vector<std::string>> Transactions() {
    absl::MutexLock lock(&mu_);
    return transactions;
  }

  absl::Status failing;  // set between calls only
  absl::Notification* gate = nullptr;
  absl::Notification entered;

 private:
  absl::Mutex mu_;
  std::vector<std::vector<std::string>> transactions ABSL_GUARDED_BY(mu_);
  bool gated_once_ = false;
};

class CommitQueueTest : public testing::Test {
 protected:
  CommitQueueTest()
      : queue_(&store_,
               CommitQueue::Hooks{
                   .stored = [this](QueuedCommit& c) { applied_.push_back(c.seq); },
                   .notify = [this](const std::set<std::string>& jobs,
                                    const std::vector<EventRecord>&) { notified_.push_back(jobs); },
                   .held_back =
                       [this](QueuedCommit& c, const absl::Status&) {
                         EventRecord failed;
                         failed.cause = "storage_failed";
                         c.events.push_back(failed);
                         held_.push_back(c.seq);
                       },
               }) {}

  static QueuedCommit Change(const std::string& job, const std::string& cause,
                             bool submission = false) {
    QueuedCommit commit;
    EventRecord event;
    event.job_id = job;
    event.cause = cause;
    commit.events.push_back(event);
    commit.touched.push_back(job);
    commit.submission = submission;
    return commit;
  }

  absl::Status Commit(QueuedCommit commit) {
    absl::MutexLock lock(&mu_);
    return queue_.AwaitStored(mu_, queue_.Enqueue(mu_, std::move(commit)));
  }

  RecordingStore store_;
  absl::Mutex mu_;
  CommitQueue queue_;
  std::vector<uint64_t> applied_, held_;
  std::vector<std::set<std::string>> notified_;
};

TEST_F(CommitQueueTest, StoresThenAppliesInOrder) {
  ASSERT_TRUE(Commit(Change("j-1", "a")).ok());
  ASSERT_TRUE(Commit(Change("j-2", "b")).ok());
  EXPECT_THAT(store_.Transactions(), ElementsAre(ElementsAre("a"), ElementsAre("b")));
  EXPECT_THAT(applied_, ElementsAre(1, 2));
  ASSERT_EQ(notified_.size(), 2u);
  EXPECT_THAT(notified_[1], ElementsAre("j-2"));
  absl::MutexLock lock(&mu_);
  EXPECT_TRUE(queue_.empty());
  EXPECT_TRUE(queue_.storage_error().ok());
}

// Changes queued while a store runs go together in the next transaction: one fsync for all.
TEST_F(CommitQueueTest, ChangesQueuedDuringAStoreShareTheNextTransaction) {
  absl::Notification gate;
  store_.gate = &gate;
  std::thread first([&] { EXPECT_TRUE(Commit(Change("j-1", "first")).ok()); });
  store_.entered.WaitForNotification();  // the first store is in progress, mu_ released
  std::vector<std::thread> others;
  for (const char* cause : {"second", "third"}) {
    others.emplace_back([&, cause] { EXPECT_TRUE(Commit(Change("j-2", cause)).ok()); });
  }
  for (;;) {  // until both are queued behind the store in progress
    absl::MutexLock lock(&mu_);
    if (queue_.queued() == 3) break;
    mu_.AwaitWithTimeout(absl::Condition::kTrue, absl::Milliseconds(1));
  }
  gate.Notify();
  first.join();
  for (std::thread& t : others) t.join();
  const std::vector<std::vector<std::string>> transactions = store_.Transactions();
  ASSERT_EQ(transactions.size(), 2u);
  EXPECT_THAT(transactions[0], ElementsAre("first"));
  EXPECT_THAT(transactions[1], testing::UnorderedElementsAre("second", "third"));
  EXPECT_THAT(applied_, ElementsAre(1, 2, 3));
}

// A failed store holds every change back (and the ones after it), refuses submissions, and the
// retry stores the held-back changes in order with their storage_failed events.
TEST_F(CommitQueueTest, AFailedStoreHoldsBackUntilTheRetryAndRefusesSubmissions) {
  store_.failing = absl::UnavailableError("disk full");
  EXPECT_EQ(Commit(Change("j-1", "changed")).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(Commit(Change("j-2", "submitted", /*submission=*/true)).code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(Commit(Change("j-3", "later")).code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(store_.Transactions(), IsEmpty());
  EXPECT_THAT(applied_, IsEmpty());
  EXPECT_THAT(held_, ElementsAre(1, 3));  // the submission is refused, not held
  {
    absl::MutexLock lock(&mu_);
    EXPECT_EQ(queue_.queued(), 2);
    EXPECT_EQ(queue_.held_back(), 2);
    EXPECT_TRUE(queue_.HoldsBackChangeOf("j-3"));
    EXPECT_FALSE(queue_.HoldsBackChangeOf("j-2"));
    EXPECT_EQ(queue_.storage_failures(), 1);
    queue_.RetryHeldBack(mu_);  // still failing
    EXPECT_EQ(queue_.storage_failures(), 2);
  }
  store_.failing = absl::OkStatus();
  {
    absl::MutexLock lock(&mu_);
    queue_.RetryHeldBack(mu_);
    EXPECT_TRUE(queue_.empty());
    EXPECT_TRUE(queue_.storage_error().ok());
  }
  ASSERT_EQ(store_.Transactions().size(), 1u);
  EXPECT_THAT(store_.Transactions()[0],
              ElementsAre("changed", "storage_failed", "later", "storage_failed"));
  EXPECT_THAT(applied_, ElementsAre(1, 3));
  EXPECT_TRUE(Commit(Change("j-4", "after")).ok());
}

}  // namespace
}  // namespace trainyard::server
