// Where one rank sits in its job's mesh and how it reaches its peers: what the training loop and
// the placement of a rank share.
#ifndef TRAINYARD_WORKER_PARALLEL_RANK_CONTEXT_H_
#define TRAINYARD_WORKER_PARALLEL_RANK_CONTEXT_H_

#include <cstdint>

#include "worker/parallel/communicator.h"
#include "worker/parallel/kv_store.h"

namespace trainyard::worker {

// Where this process sits in the job's mesh (spec.parallelism) and how it reaches its peers.
struct RankContext {
  int rank = 0;
  parallel::KeyValueStore* store = nullptr;  // rendezvous space; required when world > 1
  parallel::GlooOptions gloo;
  int64_t bucket_bytes = 1 << 20;  // gradient all-reduce bucket size (ZeRO 0/1)
  // How collectives reach the backend's memory. kHost: Gloo on host memory (CPU ranks).
  // kStaged: Gloo through host staging buffers (GPU ranks sharing a device, or without NCCL).
  // kNccl: NCCL on the CUDA backend's stream (one device per rank).
  enum class Collectives { kHost, kStaged, kNccl };
  Collectives collectives = Collectives::kHost;
};

}  // namespace trainyard::worker

#endif  // TRAINYARD_WORKER_PARALLEL_RANK_CONTEXT_H_
