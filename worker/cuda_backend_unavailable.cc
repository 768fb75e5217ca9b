// The CUDA backend's entry points in a build without a CUDA toolkit: asking for a GPU fails with
// a message that says how to get one, and no backend is a CUDA backend.
#include "worker/cuda_backend.h"

namespace trainyard::worker {

absl::StatusOr<std::unique_ptr<Backend>> MakeCudaBackend(const CudaBackendOptions&) {
  return absl::FailedPreconditionError(
      "this build has no CUDA backend: configure with a CUDA toolkit present (TRAINYARD_CUDA=ON)");
}

void* CudaStreamOf(Backend&) { return nullptr; }

}  // namespace trainyard::worker
