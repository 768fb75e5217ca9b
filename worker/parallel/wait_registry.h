// WaitRegistry: what a rank's threads are blocked in right now — which collective, in which
// group, waiting for which peers — so that a rank found hung (worker/hang_watchdog.h) can say
// what it waits for, and the coordinator can blame the rank the others wait for rather than the
// rank that noticed.
//
// Communicators record a wait around each blocking call (a ring step's receive from its
// predecessor, its send to its successor, a barrier): Begin() returns a scope that ends the wait
// when destroyed. Recording costs a mutex and a small allocation per blocking call, nothing
// beside the bytes moved.
//
// Threading: thread-safe; the training thread, the communication thread and the watchdog use
// one registry.
#ifndef TRAINYARD_WORKER_PARALLEL_WAIT_REGISTRY_H_
#define TRAINYARD_WORKER_PARALLEL_WAIT_REGISTRY_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"

namespace trainyard::worker::parallel {

struct CollectiveWait {
  std::string operation;         // "all-reduce", "all-gather", "send", "barrier", ...
  std::string group;             // "dp", "tp", "pp"
  std::vector<int> waiting_for;  // global ranks
  int64_t since_nanos = 0;       // monotonic (Clock::NowNanosMonotonic)
};

class WaitRegistry {
 public:
  // `clock` must outlive the registry.
  explicit WaitRegistry(Clock* clock) : clock_(clock) {}
  WaitRegistry(const WaitRegistry&) = delete;
  WaitRegistry& operator=(const WaitRegistry&) = delete;

  // Ends its wait when destroyed. Movable; a default-constructed scope records nothing.
  class Scope {
   public:
    Scope() = default;
    Scope(Scope&& other) noexcept : registry_(other.registry_), id_(other.id_) {
      other.registry_ = nullptr;
    }
    Scope& operator=(Scope&&) = delete;
    ~Scope() {
      if (registry_ != nullptr) registry_->End(id_);
    }

   private:
    friend class WaitRegistry;
    Scope(WaitRegistry* registry, uint64_t id) : registry_(registry), id_(id) {}
    WaitRegistry* registry_ = nullptr;
    uint64_t id_ = 0;
  };

  [[nodiscard]] Scope Begin(std::string operation, std::string group, std::vector<int> waiting_for);
  // The waits in progress, the longest first.
  std::vector<CollectiveWait> Snapshot() const;

 private:
  void End(uint64_t id);

  Clock* const clock_;
  mutable absl::Mutex mu_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, CollectiveWait> waits_ ABSL_GUARDED_BY(mu_);
};

}  // namespace trainyard::worker::parallel

#endif  // TRAINYARD_WORKER_PARALLEL_WAIT_REGISTRY_H_
