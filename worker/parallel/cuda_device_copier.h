// A DeviceCopier for CUDA memory, for the staging communicator (CUDA builds only).
#ifndef TRAINYARD_WORKER_PARALLEL_CUDA_DEVICE_COPIER_H_
#define TRAINYARD_WORKER_PARALLEL_CUDA_DEVICE_COPIER_H_

#include <cuda_runtime_api.h>

#include <memory>

#include "worker/parallel/staging_communicator.h"

namespace trainyard::worker::parallel {

// Copies on `stream` and waits for it, so a copy sees everything enqueued on `stream` before it
// (the kernels that produced a buffer must run on `stream` or be ordered before it). Copies run
// on the device that is current when the copier is made, whichever thread issues them. Device
// and managed memory count as device pointers; host memory, pinned or not, does not.
std::unique_ptr<DeviceCopier> MakeCudaDeviceCopier(cudaStream_t stream);

}  // namespace trainyard::worker::parallel

#endif  // TRAINYARD_WORKER_PARALLEL_CUDA_DEVICE_COPIER_H_
