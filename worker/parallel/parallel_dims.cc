#include "worker/parallel/parallel_dims.h"

#ifdef TRAINYARD_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif
#ifdef TRAINYARD_HAVE_NCCL
#include "worker/parallel/nccl_communicator.h"
#endif

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "config/mesh.h"
#include "worker/cuda_backend.h"
#include "worker/parallel/staging_communicator.h"
#include "worker/shape/stages.h"

#ifdef TRAINYARD_HAVE_CUDA
#include "worker/parallel/cuda_device_copier.h"
#endif

namespace trainyard::worker {

absl::StatusOr<MeshPosition> PositionOf(const config::JobSpec& spec, const RankContext& rank) {
  const config::ParallelismSpec& mesh = spec.parallelism;
  TY_RETURN_IF_ERROR(config::MeshProblemStatus(config::FindShardingProblem(mesh, spec)));
  const int world = mesh.world_size();
  if (rank.rank < 0 || rank.rank >= world) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank.rank, " outside a world of ", world, " ranks"));
  }
  if (world > 1 && rank.store == nullptr) {
    return absl::InvalidArgumentError("a multi-rank job needs a rendezvous store");
  }
  MeshPosition p;
  p.micro = config::MicroBatchPerRank(spec.training, mesh);
  p.per_rank = spec.training.batch / mesh.dp;
  const config::MeshCoordinates at = config::CoordinatesOf(mesh, rank.rank);
  p.tp_rank = at.tp;
  p.dp_rank = at.dp;
  p.pp_rank = at.pp;
  p.cp_rank = at.cp;
  p.micro_batches = p.per_rank / p.micro;
  return p;
}

namespace {

// One process group of the mesh: `index` of `size` ranks, `members` the global rank of each
// group rank (so that waits name peers as users know them). Host collectives over Gloo, NCCL on
// the device's stream, or Gloo through host staging of device buffers.
absl::StatusOr<std::unique_ptr<parallel::Communicator>> ConnectGroup(
    const RankContext& rank, RankContext::Collectives collectives, void* device_stream,
    const std::string& group, int index, int size, std::vector<int> members) {
#ifdef TRAINYARD_HAVE_CUDA
  auto* stream = static_cast<cudaStream_t>(device_stream);
#endif
  if (collectives == RankContext::Collectives::kNccl && size > 1) {
#ifdef TRAINYARD_HAVE_NCCL
    return parallel::ConnectNccl(*rank.store, group, index, size, stream, rank.gloo.timeout);
#else
    return absl::FailedPreconditionError(
        "this build has no NCCL: GPU ranks of one device share it through host staging");
#endif
  }
  std::unique_ptr<parallel::Communicator> host;
  if (size == 1) {
    host = parallel::MakeSelfCommunicator();
  } else {
    parallel::GlooOptions options = rank.gloo;
    options.members = std::move(members);
    TY_ASSIGN_OR_RETURN(host, parallel::ConnectGloo(*rank.store, group, index, size, options));
  }
  if (collectives == RankContext::Collectives::kHost) return host;
#ifdef TRAINYARD_HAVE_CUDA
  return parallel::MakeStagingCommunicator(std::move(host), parallel::MakeCudaDeviceCopier(stream));
#else
  (void)device_stream;
  return absl::FailedPreconditionError("this build has no CUDA support");
#endif
}

}  // namespace

absl::StatusOr<ParallelDims> ParallelDims::Connect(const config::JobSpec& spec,
                                                   const RankContext& rank, Backend& backend) {
  TY_ASSIGN_OR_RETURN(const MeshPosition at, PositionOf(spec, rank));
  void* const device_stream = CudaStreamOf(backend);
  RankContext::Collectives collectives = rank.collectives;
  if (device_stream != nullptr && collectives == RankContext::Collectives::kHost) {
    collectives = RankContext::Collectives::kStaged;
  }
  if (device_stream == nullptr && collectives != RankContext::Collectives::kHost) {
    return absl::FailedPreconditionError("staged and NCCL collectives need the CUDA backend");
  }
  auto connect = [&](const std::string& group, int index, int size, std::vector<int> members) {
    return ConnectGroup(rank, collectives, device_stream, group, index, size, std::move(members));
  };
  const config::ParallelismSpec& mesh = spec.parallelism;
  auto global = [&](int pp, int dp, int tp, int cp) {
    return config::RankAt(mesh, {.dp = dp, .tp = tp, .pp = pp, .cp = cp});
  };
  auto members = [](int size, const std::function<int(int)>& of) {
    std::vector<int> ranks(size);
    for (int i = 0; i < size; ++i) ranks[i] = of(i);
    return ranks;
  };
  ParallelDims g;
  g.at = at;
  const int cp = mesh.cp;
  // Without context parallelism (cp 1) the group names carry no cp coordinate.
  const std::string cp_at = cp == 1 ? "" : absl::StrCat(".cp", at.cp_rank);
  TY_ASSIGN_OR_RETURN(
      g.dp, connect(absl::StrCat("dp.tp", at.tp_rank, ".pp", at.pp_rank),
                    at.dp_rank * cp + at.cp_rank, mesh.dp * cp, members(mesh.dp * cp, [&](int i) {
                      return global(at.pp_rank, i / cp, at.tp_rank, i % cp);
                    })));
  TY_ASSIGN_OR_RETURN(g.tp, connect(absl::StrCat("tp.dp", at.dp_rank, ".pp", at.pp_rank, cp_at),
                                    at.tp_rank, mesh.tp, members(mesh.tp, [&](int t) {
                                      return global(at.pp_rank, at.dp_rank, t, at.cp_rank);
                                    })));
  TY_ASSIGN_OR_RETURN(g.pp, connect(absl::StrCat("pp.dp", at.dp_rank, ".tp", at.tp_rank, cp_at),
                                    at.pp_rank, mesh.pp, members(mesh.pp, [&](int p) {
                                      return global(p, at.dp_rank, at.tp_rank, at.cp_rank);
                                    })));
  TY_ASSIGN_OR_RETURN(
      g.cp, connect(absl::StrCat("cp.dp", at.dp_rank, ".tp", at.tp_rank, ".pp", at.pp_rank),
                    at.cp_rank, cp, members(cp, [&](int c) {
                      return global(at.pp_rank, at.dp_rank, at.tp_rank, c);
                    })));
  if (const int ep = mesh.ep; ep > 1) {
    const int block = at.dp_rank / ep, index = at.dp_rank % ep;
    const std::string where = absl::StrCat(".tp", at.tp_rank, ".pp", at.pp_rank, cp_at);
    TY_ASSIGN_OR_RETURN(
        g.ep, connect(absl::StrCat("ep", block, where), index, ep, members(ep, [&](int e) {
                        return global(at.pp_rank, block * ep + e, at.tp_rank, at.cp_rank);
                      })));
    // The ranks holding the same experts: one per block of ep data-parallel ranks, with every
    // context-parallel rank of each (as the dp group has them), group rank block · cp + cp_rank.
    TY_ASSIGN_OR_RETURN(
        g.edp,
        connect(absl::StrCat("edp", index, ".tp", at.tp_rank, ".pp", at.pp_rank),
                block * cp + at.cp_rank, mesh.dp / ep * cp, members(mesh.dp / ep * cp, [&](int i) {
                  return global(at.pp_rank, i / cp * ep + index, at.tp_rank, i % cp);
                })));
  }
  g.chunks =
      StageChunks(spec.model, spec.training.seq_len, mesh.pp, mesh.virtual_stages, at.pp_rank);
  const bool first = g.chunks.front().first, last = g.chunks.back().last;
  if (mesh.pp > 1 && spec.model.tied_embeddings && (first || last)) {
    TY_ASSIGN_OR_RETURN(
        g.tied,
        connect(absl::StrCat("tie.dp", at.dp_rank, ".tp", at.tp_rank, cp_at), first ? 0 : 1, 2,
                {global(0, at.dp_rank, at.tp_rank, at.cp_rank),
                 global(mesh.pp - 1, at.dp_rank, at.tp_rank, at.cp_rank)}));
  }
  return g;
}

}  // namespace trainyard::worker
