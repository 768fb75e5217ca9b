// The node agent's MemoryTierService as a MemoryTierClient for one rank of one attempt.
#ifndef TRAINYARD_WORKER_GRPC_MEMORY_TIER_H_
#define TRAINYARD_WORKER_GRPC_MEMORY_TIER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/rpc.h"
#include "worker/memory_tier_client.h"

namespace trainyard::worker {

// `address`: the agent's service on this node (TRAINYARD_MEMORY_TIER), reached with `tls` (the
// agent's own files, rpc::TlsFilesFromEnvironment). A Gather that takes longer than
// `gather_deadline` fails (DEADLINE_EXCEEDED): keep it under the collective timeout, which the
// other ranks wait in meanwhile. The TLS files' errors.
[[nodiscard]] absl::StatusOr<std::unique_ptr<MemoryTierClient>> MakeGrpcMemoryTierClient(
    const std::string& address, const rpc::TlsFiles& tls, std::string job_id, int attempt, int rank,
    int world, absl::Duration gather_deadline);

}  // namespace trainyard::worker

#endif  // TRAINYARD_WORKER_GRPC_MEMORY_TIER_H_
