// MemoryTierClient: a rank's view of its node's memory tier (server/agent/memory_tier.h), which
// keeps snapshots of the rank's state in memory the agent owns, so that they outlive the worker.
//
// Threading: implementations must allow Committed from the snapshot writer's thread while the
// training thread runs.
#ifndef TRAINYARD_WORKER_MEMORY_TIER_CLIENT_H_
#define TRAINYARD_WORKER_MEMORY_TIER_CLIENT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace trainyard::worker {

class MemoryTierClient {
 public:
  virtual ~MemoryTierClient() = default;
  // Room for the rank's snapshots of `bytes` each; the job's directory in the tier, which holds
  // the snapshots of every rank on this node and the copies peers sent here. RESOURCE_EXHAUSTED
  // when the node's budget does not allow it.
  [[nodiscard]] virtual absl::StatusOr<std::string> Reserve(int64_t bytes) = 0;
  // The rank's snapshot of `step` is written (directory `snapshot`, `files` in it, its manifest
  // last): the agent may prune older ones and, when `copy`, copies it to the peer node. Whether
  // the agent may be copying it: false when it queued no copy (the job has no peer node).
  [[nodiscard]] virtual absl::StatusOr<bool> Committed(int64_t step, const std::string& snapshot,
                                                       std::vector<std::string> files,
                                                       bool copy) = 0;
  // Whether the agent still copies one of the rank's snapshots to the peer node.
  [[nodiscard]] virtual absl::StatusOr<bool> CopyPending() = 0;
  // The snapshots (directory names) every rank of which some node of the attempt holds, newest
  // first.
  [[nodiscard]] virtual absl::StatusOr<std::vector<std::string>> Complete() = 0;
  // Makes `snapshot` complete on this node: the agent fetches the ranks it lacks.
  [[nodiscard]] virtual absl::Status Gather(const std::string& snapshot) = 0;
};

}  // namespace trainyard::worker

#endif  // TRAINYARD_WORKER_MEMORY_TIER_CLIENT_H_
