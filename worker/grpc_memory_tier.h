// The node agent's MemoryTierService as a MemoryTierClient for one rank of one attempt.
#ifndef TRAINYARD_WORKER_GRPC_MEMORY_TIER_H_
#define TRAINYARD_WORKER_GRPC_MEMORY_TIER_H_

#include <memory>
#include <string>

#include "worker/memory_tier_client.h"

namespace trainyard::worker {

// `address`: the agent's service on this node (TRAINYARD_MEMORY_TIER).
std::unique_ptr<MemoryTierClient> MakeGrpcMemoryTierClient(const std::string& address,
                                                           std::string job_id, int attempt,
                                                           int rank, int world);

}  // namespace trainyard::worker

#endif  // TRAINYARD_WORKER_GRPC_MEMORY_TIER_H_
