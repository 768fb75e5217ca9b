// KvSpace: the key-value spaces workers bootstrap their collectives from, one per live attempt,
// named by a prefix "jobs/<job_id>/attempts/<attempt_id>/". Spaces live in memory only: they
// matter while an attempt's ranks rendezvous, and an attempt whose bootstrap is interrupted by a
// coordinator restart fails its collectives' timeouts and is restarted.
//
// Get is a long poll: the callback runs once, at once when the key exists, else when it is Set,
// when the space is closed (FAILED_PRECONDITION), or when ExpireWaiters passes the deadline
// (found = false).
//
// Threading: thread-safe. Callbacks run on the thread that triggers them (Get, Set, Close,
// ExpireWaiters), after the internal mutex is released.
#ifndef TRAINYARD_SERVER_KV_SPACE_H_
#define TRAINYARD_SERVER_KV_SPACE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"

namespace trainyard::server {

class KvSpace {
 public:
  // `clock` decides whether a Get's deadline has already passed; not owned.
  explicit KvSpace(Clock* clock) : clock_(clock) {}

  static constexpr size_t kMaxKeyBytes = 512;
  static constexpr size_t kMaxValueBytes = size_t{1} << 20;
  static constexpr size_t kMaxKeysPerSpace = 4096;
  static constexpr size_t kMaxBytesPerSpace = size_t{64} << 20;

  // The value when found, nullopt when the wait ran out; an error status otherwise.
  using GetCallback = std::function<void(absl::StatusOr<std::optional<std::string>>)>;

  static std::string PrefixFor(const std::string& job_id, int attempt_id);
  // The job and attempt whose space `key` is in; INVALID_ARGUMENT for a key outside any.
  [[nodiscard]] static absl::StatusOr<std::pair<std::string, int>> AttemptOf(
      const std::string& key);

  void Open(const std::string& prefix);
  // Drops the space; its waiters get FAILED_PRECONDITION.
  void Close(const std::string& prefix) { CloseDeferred(prefix)(); }
  // Drops the space at once (every later Set and Get is refused) and returns what fails its
  // waiters, for a caller that must not run callbacks under its own lock: the attempt's end
  // becomes visible together with its space's closing, never before it.
  [[nodiscard]] std::function<void()> CloseDeferred(const std::string& prefix);

  // INVALID_ARGUMENT for a malformed or oversized key/value, FAILED_PRECONDITION when the key's
  // space is not open, RESOURCE_EXHAUSTED past the per-space limits.
  [[nodiscard]] absl::Status Set(const std::string& key, std::string value);
  void Get(const std::string& key, absl::Time deadline, GetCallback done);

  // Answers found = false to every waiter whose deadline is at or before `now`.
  void ExpireWaiters(absl::Time now);
  // Fails every waiter with `status` (shutdown).
  void FailAll(const absl::Status& status);

  size_t open_spaces() const;

 private:
  struct Waiter {
    std::string key;
    absl::Time deadline;
    GetCallback done;
  };
  struct Space {
    std::map<std::string, std::string> values;
    size_t bytes = 0;
    std::vector<Waiter> waiters;
  };
  // The space prefix of `key`, or INVALID_ARGUMENT.
  [[nodiscard]] static absl::StatusOr<std::string> PrefixOf(const std::string& key);

  Clock* const clock_;
  mutable absl::Mutex mu_;
  std::map<std::string, Space> spaces_ ABSL_GUARDED_BY(mu_);
};

}  // namespace trainyard::server

#endif  // TRAINYARD_SERVER_KV_SPACE_H_
