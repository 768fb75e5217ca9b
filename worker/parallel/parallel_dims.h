// ParallelDims: where one rank sits in its job's mesh and every process group it belongs to,
// built once from the mesh (as TorchTitan's ParallelDims). The training loop, the model and the
// sharded parameters take their groups from here; nothing else connects a group.
//
// Threading: built on the training thread; the groups follow the Communicator's rules.
#ifndef TRAINYARD_WORKER_PARALLEL_PARALLEL_DIMS_H_
#define TRAINYARD_WORKER_PARALLEL_PARALLEL_DIMS_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "config/spec.h"
#include "worker/backend.h"
#include "worker/parallel/communicator.h"
#include "worker/parallel/rank_context.h"
#include "worker/shape/parameters.h"

namespace trainyard::worker {

// Where a rank sits in the mesh, tensor-parallel innermost, then context-parallel:
// rank = ((pp_rank · dp + dp_rank) · cp + cp_rank) · tp + tp_rank; and its share of the global
// batch (the cp ranks of a data-parallel rank share its sequences).
struct MeshPosition {
  int dp_rank = 0, tp_rank = 0, pp_rank = 0, cp_rank = 0;
  int micro = 0;          // sequences per micro-batch
  int per_rank = 0;       // sequences per step on this data-parallel rank
  int micro_batches = 0;  // per step
};

// This rank's position in spec.parallelism. INVALID_ARGUMENT when the mesh does not shard the
// spec's model and batch (config::FindShardingProblem), the rank is outside the world, or a
// multi-rank job has no rendezvous store.
[[nodiscard]] absl::StatusOr<MeshPosition> PositionOf(const config::JobSpec& spec,
                                                      const RankContext& rank);

struct ParallelDims {
  MeshPosition at;
  // This rank's layers: one stage, or an interleaved schedule's model chunks
  // (worker/shape/stages.h: StageChunks).
  std::vector<PipelineStage> chunks;
  // One process group per mesh axis: the ranks that differ from this one in that coordinate
  // only (a group of one where the degree is 1) — except `dp`, which holds the ranks that differ
  // in their data- or context-parallel coordinate: every rank with the same parameters, whose
  // gradients are summed and whose ZeRO shards split them (group rank dp_rank · cp + cp_rank).
  // With cp 1 that is the data-parallel group.
  std::unique_ptr<parallel::Communicator> dp, tp, pp, cp;
  // The first and last pipeline stage of a tied embedding (pp > 1), whose two copies' gradients
  // are summed each step; null elsewhere.
  std::unique_ptr<parallel::Communicator> tied;
  // Expert parallelism (parallelism.ep > 1; null otherwise): `ep` holds the ep consecutive data-
  // parallel ranks of this context-parallel rank whose experts differ (group rank dp_rank % ep),
  // `edp` every rank holding the same experts, their context-parallel ranks included (group rank
  // dp_rank / ep · cp + cp_rank).
  std::unique_ptr<parallel::Communicator> ep, edp;

  // Connects every group of rank `rank` of spec.parallelism, each through the rendezvous store.
  // On a GPU backend collectives reach device memory through NCCL or through Gloo with host
  // staging (the default, and the only way for ranks sharing one GPU); FAILED_PRECONDITION for
  // staged or NCCL collectives without the CUDA backend. Errors of PositionOf and of connecting
  // (UNAVAILABLE, DEADLINE_EXCEEDED) as they come.
  [[nodiscard]] static absl::StatusOr<ParallelDims> Connect(const config::JobSpec& spec,
                                                            const RankContext& rank,
                                                            Backend& backend);
};

}  // namespace trainyard::worker

#endif  // TRAINYARD_WORKER_PARALLEL_PARALLEL_DIMS_H_
