#include "worker/parallel/placement.h"

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "worker/cuda_backend.h"

namespace trainyard::worker {

absl::StatusOr<GpuChoice> ChooseGpu(const DeviceInfo& devices, int local_rank, int ranks_on_node) {
  const int visible_devices = devices.count;
  if (visible_devices <= 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("no GPU is visible", devices.why_none.empty() ? "" : ": ", devices.why_none));
  }
  if (local_rank < 0 || ranks_on_node < 1 || local_rank >= ranks_on_node) {
    return absl::InvalidArgumentError(
        absl::StrCat("local rank ", local_rank, " of ", ranks_on_node, " ranks on this node"));
  }
  return GpuChoice{.device = local_rank % visible_devices,
                   .collectives = visible_devices >= ranks_on_node
                                      ? RankContext::Collectives::kNccl
                                      : RankContext::Collectives::kStaged};
}

absl::StatusOr<Placement> PlaceRank(const config::JobSpec& spec, int local_rank, int ranks_on_node,
                                    int threads, const DeviceProbe& probe) {
  Placement placement;
  if (spec.resources.kind != config::DeviceKind::kGpu) {
    placement.backend = MakeCpuBackend(threads);
    return placement;
  }
  const DeviceInfo devices = probe.Probe();
  if (devices.count == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("resources.kind is gpu but this worker cannot use a GPU: ", devices.why_none));
  }
  TY_ASSIGN_OR_RETURN(const GpuChoice choice, ChooseGpu(devices, local_rank, ranks_on_node));
  TY_ASSIGN_OR_RETURN(placement.backend,
                      MakeCudaBackend({.device = choice.device, .act_dtype = DType::kBF16}));
  placement.collectives = choice.collectives;
  return placement;
}

}  // namespace trainyard::worker
