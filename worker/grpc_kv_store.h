// GrpcKeyValueStore: the rendezvous store (parallel::KeyValueStore) of a worker run by the control
// plane, backed by the coordinator's WorkerService (KvSet, and KvGet long polls). Every key is
// placed under the attempt's kv_prefix from Join, so attempts never see each other's keys.
//
// Transient coordinator outages (UNAVAILABLE: restarting, not reachable yet) are retried until
// the caller's timeout; FAILED_PRECONDITION (the attempt has ended) and other errors are
// returned at once.
//
// Threading: thread-safe (gRPC stubs are).
#ifndef TRAINYARD_WORKER_GRPC_KV_STORE_H_
#define TRAINYARD_WORKER_GRPC_KV_STORE_H_

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/rpc.h"
#include "proto/trainyard.grpc.pb.h"
#include "worker/parallel/kv_store.h"

namespace trainyard::worker {

class GrpcKeyValueStore : public parallel::KeyValueStore {
 public:
  // `stub` is shared with the caller; `clock` (not owned) paces retries.
  GrpcKeyValueStore(std::shared_ptr<trainyard::v1::WorkerService::StubInterface> stub,
                    std::string kv_prefix, Clock* clock = RealClock());

  // Deadline 10 s per call; retried on UNAVAILABLE for up to 30 s.
  [[nodiscard]] absl::Status Set(const std::string& key, const std::string& value) override;
  [[nodiscard]] absl::StatusOr<std::string> Get(const std::string& key,
                                                std::chrono::milliseconds timeout) override;
  [[nodiscard]] absl::Status Wait(const std::vector<std::string>& keys,
                                  std::chrono::milliseconds timeout) override;

 private:
  std::shared_ptr<trainyard::v1::WorkerService::StubInterface> stub_;
  std::string prefix_;
  Clock* clock_;
};

}  // namespace trainyard::worker

#endif  // TRAINYARD_WORKER_GRPC_KV_STORE_H_
