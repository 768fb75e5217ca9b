// Where a rank runs: the backend for the job's device kind and how its collectives travel.
#ifndef TRAINYARD_WORKER_PARALLEL_PLACEMENT_H_
#define TRAINYARD_WORKER_PARALLEL_PLACEMENT_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/device_probe.h"
#include "config/spec.h"
#include "worker/backend.h"
#include "worker/parallel/rank_context.h"

namespace trainyard::worker {

struct Placement {
  std::unique_ptr<Backend> backend;
  RankContext::Collectives collectives = RankContext::Collectives::kHost;
};

// The device a GPU rank uses and how its collectives travel, from the devices visible to it (a
// DeviceProbe's answer): device local_rank mod devices; NCCL when every rank on this node has a
// device of its own, otherwise (several ranks sharing a GPU) Gloo with host staging.
// FAILED_PRECONDITION naming why when no device is visible.
struct GpuChoice {
  int device = 0;
  RankContext::Collectives collectives = RankContext::Collectives::kNccl;
};
[[nodiscard]] absl::StatusOr<GpuChoice> ChooseGpu(const DeviceInfo& devices, int local_rank,
                                                  int ranks_on_node);

// CPU jobs: the CPU backend with `threads` (≤ 0: every core), Gloo on host memory. GPU jobs: the
// CUDA backend with bf16 activations on the device and collectives ChooseGpu picks from what
// `probe` sees (SystemDeviceProbe() in production). FAILED_PRECONDITION when a GPU job finds no
// usable device or the build has no CUDA backend.
[[nodiscard]] absl::StatusOr<Placement> PlaceRank(const config::JobSpec& spec, int local_rank,
                                                  int ranks_on_node, int threads,
                                                  const DeviceProbe& probe);

}  // namespace trainyard::worker

#endif  // TRAINYARD_WORKER_PARALLEL_PLACEMENT_H_
