#include "server/commit_queue.h"

#include <algorithm>

#include "common/logging.h"

namespace trainyard::server {

uint64_t CommitQueue::Enqueue(absl::Mutex& mu, QueuedCommit commit) {
  mu.AssertHeld();
  commit.seq = ++last_seq_;
  queue_.push_back(std::move(commit));
  return last_seq_;
}

absl::Status CommitQueue::AwaitStored(absl::Mutex& mu, uint64_t seq) {
  while (true) {
    if (auto refused = refused_.find(seq); refused != refused_.end()) {
      absl::Status status = std::move(refused->second);
      refused_.erase(refused);
      return status;
    }
    if (stored_seq_ >= seq) return absl::OkStatus();
    if (failed_seq_ >= seq) return storage_error_;
    if (storing_) {
      done_.Wait(&mu);
    } else if (!queue_.empty() && queue_.front().held_back) {
      // Earlier changes are held back: this one waits behind them until RetryHeldBack.
      HoldBack(queue_.size(), storage_error_);
    } else {
      Store(mu);
    }
  }
}

void CommitQueue::RetryHeldBack(absl::Mutex& mu) {
  if (storage_error_.ok() || storing_) return;
  if (queue_.empty()) {
    storage_error_ = absl::OkStatus();  // only refused submissions failed: try the next change
    return;
  }
  Store(mu);
}

void CommitQueue::Store(absl::Mutex& mu) {
  if (queue_.empty() || storing_) return;
  storing_ = true;
  // The queue only grows at its end while `mu` is released, so these references stay valid.
  const size_t count = queue_.size();
  const uint64_t last = queue_.back().seq;
  StoreBatch merged;
  for (size_t i = 0; i < count; ++i) {
    QueuedCommit& commit = queue_[i];
    for (const JobRecord& job : commit.new_jobs) merged.new_jobs.push_back(&job);
    for (const JobRecord& job : commit.updated_jobs) merged.updated_jobs.push_back(&job);
    for (const AttemptRecord& attempt : commit.attempts) merged.attempts.push_back(&attempt);
    for (const NodeRecord& node : commit.nodes) merged.nodes.push_back(&node);
    merged.events.insert(merged.events.end(), commit.events.begin(), commit.events.end());
    merged.checkpoints.insert(merged.checkpoints.end(), commit.checkpoints.begin(),
                              commit.checkpoints.end());
    merged.cordons.insert(merged.cordons.end(), commit.cordons.begin(), commit.cordons.end());
  }
  mu.Unlock();
  const absl::Status status = store_->Commit(merged);
  mu.Lock();
  storing_ = false;
  if (status.ok()) {
    if (!storage_error_.ok()) {
      TY_LOG(INFO) << "the job store works again: the held-back changes are stored and their "
                      "orders sent";
      storage_error_ = absl::OkStatus();
    }
    std::set<std::string> touched;
    for (size_t i = 0; i < count; ++i) {
      QueuedCommit& commit = queue_.front();
      hooks_.stored(commit);
      touched.insert(commit.touched.begin(), commit.touched.end());
      queue_.pop_front();
    }
    stored_seq_ = last;
    hooks_.notify(touched, merged.events);
  } else {
    if (storage_error_.ok()) {
      TY_LOG(ERROR) << "the job store cannot store changes: " << status
                    << "; the orders that follow from them wait until it can";
    }
    storage_error_ = status;
    ++storage_failures_;
    HoldBack(count, status);
  }
  done_.SignalAll();
}

void CommitQueue::HoldBack(size_t count, const absl::Status& status) {
  if (count == 0) return;
  failed_seq_ = std::max(failed_seq_, queue_[count - 1].seq);
  size_t kept = 0;
  for (size_t i = 0; i < count; ++i) {
    QueuedCommit& commit = queue_[kept];
    if (commit.submission) {
      refused_[commit.seq] = status;
      queue_.erase(queue_.begin() + kept);
      continue;
    }
    if (!commit.held_back) {
      commit.held_back = true;
      hooks_.held_back(commit, status);
    }
    ++kept;
  }
}

int64_t CommitQueue::held_back() const {
  return std::count_if(queue_.begin(), queue_.end(),
                       [](const QueuedCommit& commit) { return commit.held_back; });
}

bool CommitQueue::HoldsBackChangeOf(const std::string& job_id) const {
  return std::any_of(queue_.begin(), queue_.end(), [&](const QueuedCommit& commit) {
    return commit.held_back &&
           std::find(commit.touched.begin(), commit.touched.end(), job_id) != commit.touched.end();
  });
}

}  // namespace trainyard::server
