// QueuedWriter: the write side of a gRPC callback stream fed from other threads. Messages are
// queued and written one at a time (gRPC allows one outstanding write); Finish is sent once the
// queue has drained. After Detach (the reactor's OnDone) every call is a no-op, so producers may
// keep a shared_ptr to the writer past the reactor's life.
//
// Threading: thread-safe. Push and FinishWhenDrained never block (gRPC runs the reactions of
// non-default reactors on its own threads, never inline in StartWrite/Finish).
#ifndef TRAINYARD_SERVER_STREAM_WRITER_H_
#define TRAINYARD_SERVER_STREAM_WRITER_H_

#include <deque>
#include <optional>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/grpcpp.h"

namespace trainyard::server {

template <typename Reactor, typename Message>
class QueuedWriter {
 public:
  explicit QueuedWriter(Reactor* reactor) : reactor_(reactor) {}

  // Queues `message`. A `replaceable` message is overwritten by the next replaceable one while
  // both wait in the queue (progress snapshots: only the newest matters). Ignored once finishing.
  void Push(Message message, bool replaceable = false) {
    absl::MutexLock lock(&mu_);
    if (reactor_ == nullptr || finish_.has_value()) return;
    if (replaceable && !queue_.empty() && queue_.back().second) {
      queue_.back().first = std::move(message);
    } else {
      queue_.emplace_back(std::move(message), replaceable);
    }
    PumpLocked();
  }

  // Ends the stream with `status` after the queued messages (the first status wins).
  void FinishWhenDrained(const grpc::Status& status) {
    absl::MutexLock lock(&mu_);
    if (!finish_.has_value()) finish_ = status;
    PumpLocked();
  }

  // Ends the stream now, dropping what is queued (the client went away).
  void Abandon(const grpc::Status& status) {
    absl::MutexLock lock(&mu_);
    queue_.clear();
    if (!finish_.has_value()) finish_ = status;
    PumpLocked();
  }

  // From the reactor's OnWriteDone.
  void OnWriteDone(bool ok) {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (!ok) {
      queue_.clear();
      if (!finish_.has_value()) finish_ = grpc::Status(grpc::StatusCode::CANCELLED, "write failed");
    }
    PumpLocked();
  }

  // From the reactor's OnDone: the reactor is about to be deleted.
  void Detach() {
    absl::MutexLock lock(&mu_);
    reactor_ = nullptr;
  }

  bool finishing() {
    absl::MutexLock lock(&mu_);
    return finish_.has_value();
  }

  // Keeps Finish from being sent until the matching Release, so that work a reaction handed to
  // another thread may still start a read (a read must not follow Finish, after which the
  // reactor may be done). False, holding nothing, when Finish was sent already.
  bool Hold() {
    absl::MutexLock lock(&mu_);
    if (reactor_ == nullptr || finished_) return false;
    ++holds_;
    return true;
  }
  void Release() {
    absl::MutexLock lock(&mu_);
    --holds_;
    PumpLocked();
  }

 private:
  void PumpLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (reactor_ == nullptr || writing_ || finished_) return;
    if (!queue_.empty()) {
      current_ = std::move(queue_.front().first);
      queue_.pop_front();
      writing_ = true;
      reactor_->StartWrite(&current_);
      return;
    }
    if (finish_.has_value() && holds_ == 0) {
      finished_ = true;
      reactor_->Finish(*finish_);
    }
  }

  absl::Mutex mu_;
  Reactor* reactor_ ABSL_GUARDED_BY(mu_);
  std::deque<std::pair<Message, bool>> queue_ ABSL_GUARDED_BY(mu_);
  Message current_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  int holds_ ABSL_GUARDED_BY(mu_) = 0;
  std::optional<grpc::Status> finish_ ABSL_GUARDED_BY(mu_);
};

}  // namespace trainyard::server

#endif  // TRAINYARD_SERVER_STREAM_WRITER_H_
