#include "worker/parallel/wait_registry.h"

#include <algorithm>
#include <utility>

namespace trainyard::worker::parallel {

WaitRegistry::Scope WaitRegistry::Begin(std::string operation, std::string group,
                                        std::vector<int> waiting_for) {
  CollectiveWait wait{std::move(operation), std::move(group), std::move(waiting_for),
                      clock_->NowNanosMonotonic()};
  absl::MutexLock lock(&mu_);
  const uint64_t id = next_id_++;
  waits_.emplace(id, std::move(wait));
  return Scope(this, id);
}

void WaitRegistry::End(uint64_t id) {
  absl::MutexLock lock(&mu_);
  waits_.erase(id);
}

std::vector<CollectiveWait> WaitRegistry::Snapshot() const {
  std::vector<CollectiveWait> waits;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, wait] : waits_) waits.push_back(wait);
  }
  std::stable_sort(waits.begin(), waits.end(),
                   [](const CollectiveWait& a, const CollectiveWait& b) {
                     return a.since_nanos < b.since_nanos;
                   });
  return waits;
}

}  // namespace trainyard::worker::parallel
