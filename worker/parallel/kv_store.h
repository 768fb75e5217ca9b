// KeyValueStore: the rendezvous space ranks use to bootstrap their collectives (Gloo addresses,
// NCCL unique ids). Implementations: a shared directory (FileKeyValueStore, for ranks on one
// machine and the local launcher) and, in the control plane, the coordinator's WorkerService.
//
// Keys are opaque strings; values are bytes. Set is last-writer-wins and visible to every rank
// once it returns. Thread-safe.
#ifndef TRAINYARD_WORKER_PARALLEL_KV_STORE_H_
#define TRAINYARD_WORKER_PARALLEL_KV_STORE_H_

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace trainyard::worker::parallel {

class KeyValueStore {
 public:
  virtual ~KeyValueStore() = default;
  [[nodiscard]] virtual absl::Status Set(const std::string& key, const std::string& value) = 0;
  // Blocks until the key exists; DEADLINE_EXCEEDED naming the key after `timeout`.
  [[nodiscard]] virtual absl::StatusOr<std::string> Get(const std::string& key,
                                                        std::chrono::milliseconds timeout) = 0;
  // Blocks until every key exists; DEADLINE_EXCEEDED naming a missing key after `timeout`.
  [[nodiscard]] virtual absl::Status Wait(const std::vector<std::string>& keys,
                                          std::chrono::milliseconds timeout) = 0;
};

// A store in a directory shared by the ranks: one file per key, written atomically (temporary
// name, then rename), polled by readers.
std::unique_ptr<KeyValueStore> MakeFileKeyValueStore(const std::string& directory);

}  // namespace trainyard::worker::parallel

#endif  // TRAINYARD_WORKER_PARALLEL_KV_STORE_H_
