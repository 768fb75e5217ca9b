// The coordinator's group commit (its outbox): every change to the durable state joins this
// queue, and nothing it implies (an order to an agent, a watcher's update) happens before it is
// stored.
//
// A change is queued with copies of its records (QueuedCommit), taken under the owner's lock.
// Whichever caller of AwaitStored finds no store in progress stores everything queued in one
// transaction, the owner's lock released meanwhile, so the disk's latency holds up no other
// caller and concurrent changes share one fsync; the others wait for it. Once stored, the owner's
// hooks apply each change in queue order (its records become what is shown; its orders go out)
// and then tell the watchers. When the store fails, every queued change is held back: the owner
// adds its storage_failed events (the held_back hook) and it waits, with every later change,
// until RetryHeldBack stores them all; submissions are refused instead (nothing exists in memory
// that is not stored).
//
// Threading: the owner's mutex guards the queue; every method but the constructor requires it,
// passed as `mu` (held), and Store-ing calls release and retake it.
#ifndef TRAINYARD_SERVER_COMMIT_QUEUE_H_
#define TRAINYARD_SERVER_COMMIT_QUEUE_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "server/agent_registry.h"
#include "server/job_store.h"

namespace trainyard::server {

// A change waiting to be stored: copies of the records it stores, taken when it was queued, so
// that the store reads them without the lock.
struct QueuedCommit {
  uint64_t seq = 0;
  std::vector<JobRecord> new_jobs, updated_jobs;
  std::vector<AttemptRecord> attempts;
  std::vector<NodeRecord> nodes;
  std::vector<EventRecord> events;
  std::vector<JobCheckpoint> checkpoints;
  std::vector<StoreBatch::CordonChange> cordons;
  std::vector<std::pair<std::string, AgentOrder>> orders;
  std::vector<std::string> touched;  // job ids: watchers, storage_failed events
  bool submission = false;           // refused, not held back, when its store fails
  bool held_back = false;            // a store of it failed (its storage_failed events added)
};

class CommitQueue {
 public:
  struct Hooks {
    // A change is stored: make it what memory shows and send its orders (in queue order).
    std::function<void(QueuedCommit&)> stored;
    // After the changes of one store were applied: the jobs they touched and their events.
    std::function<void(const std::set<std::string>& job_ids,
                       const std::vector<EventRecord>& events)>
        notify;
    // A change is held back for the first time: add its storage_failed events to it.
    std::function<void(QueuedCommit&, const absl::Status&)> held_back;
  };

  CommitQueue(StateStore* store, Hooks hooks) : store_(store), hooks_(std::move(hooks)) {}

  // Queues `commit` (its seq is assigned) and returns its sequence number.
  uint64_t Enqueue(absl::Mutex& mu, QueuedCommit commit) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Waits until change `seq` is stored (OK), refused or held back (the store's error), storing
  // the queue itself when no other caller is.
  [[nodiscard]] absl::Status AwaitStored(absl::Mutex& mu, uint64_t seq)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Stores the held-back changes, if any and no store is in progress (the owner's periodic tick).
  void RetryHeldBack(absl::Mutex& mu) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Waits for the next store to end (or for Signal); for callers waiting on another's change.
  void WaitForStore(absl::Mutex& mu) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { done_.Wait(&mu); }
  void Signal() { done_.SignalAll(); }

  // What the owner shows (the owner's mutex held).
  bool empty() const { return queue_.empty(); }
  int64_t queued() const { return static_cast<int64_t>(queue_.size()); }
  int64_t held_back() const;
  // OK while the store works, else its newest error.
  const absl::Status& storage_error() const { return storage_error_; }
  int64_t storage_failures() const { return storage_failures_; }
  // Whether a held-back change touched `job_id`.
  bool HoldsBackChangeOf(const std::string& job_id) const;

 private:
  // Stores everything queued in one transaction, `mu` released during the store; then applies
  // the stored changes, or holds them back.
  void Store(absl::Mutex& mu) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Holds back the first `count` queued changes (refusing the submissions among them).
  void HoldBack(size_t count, const absl::Status& status);

  StateStore* const store_;
  const Hooks hooks_;
  // All guarded by the owner's mutex. The changes not stored yet, oldest first (sequence numbers
  // from 1); the newest stored one; the newest whose store failed (held back); refused
  // submissions' errors for their waiters; whether a caller is storing now (mutex released).
  std::deque<QueuedCommit> queue_;
  uint64_t last_seq_ = 0;
  uint64_t stored_seq_ = 0;
  uint64_t failed_seq_ = 0;
  std::map<uint64_t, absl::Status> refused_;
  bool storing_ = false;
  absl::CondVar done_;
  absl::Status storage_error_;
  int64_t storage_failures_ = 0;
};

}  // namespace trainyard::server

#endif  // TRAINYARD_SERVER_COMMIT_QUEUE_H_
