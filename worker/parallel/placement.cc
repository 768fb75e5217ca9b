#include "worker/parallel/placement.h"

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "worker/cuda_backend.h"

namespace trainyard::worker {

absl::StatusOr<Placement> PlaceRank(const config::JobSpec& spec, int local_rank, int ranks_on_node,
                                    int threads) {
  Placement placement;
  if (spec.resources.kind != config::DeviceKind::kGpu) {
    placement.backend = MakeCpuBackend(threads);
    return placement;
  }
  const int devices = CudaDeviceCount();
  if (devices == 0) {
    // The backend's own message says why (no device, or a build without CUDA).
    absl::Status why = MakeCudaBackend({}).status();
    return absl::FailedPreconditionError(
        absl::StrCat("resources.kind is gpu but this worker cannot use a GPU: ", why.message()));
  }
  TY_ASSIGN_OR_RETURN(placement.backend,
                      MakeCudaBackend({.device = local_rank % devices, .act_dtype = DType::kBF16}));
  placement.collectives = devices >= ranks_on_node ? RankContext::Collectives::kNccl
                                                   : RankContext::Collectives::kStaged;
  return placement;
}

}  // namespace trainyard::worker
