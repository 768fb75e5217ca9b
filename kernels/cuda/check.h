// The one place where CUDA runtime, cuBLASLt and NCCL errors become absl::Status, with file and
// line. Host code only; includable from .cc and .cu files.
#ifndef TRAINYARD_KERNELS_CUDA_CHECK_H_
#define TRAINYARD_KERNELS_CUDA_CHECK_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"

namespace trainyard::kernels::cuda {

// INTERNAL for a launch or runtime failure, RESOURCE_EXHAUSTED for out-of-memory.
[[nodiscard]] absl::Status CudaError(cudaError_t err, const char* expr, const char* file, int line);

// The status of the last launch on this thread (cudaGetLastError), as a Status.
[[nodiscard]] absl::Status LastLaunchStatus(const char* kernel, const char* file, int line);

// INVALID_ARGUMENT naming `what` when the condition does not hold; used by every launcher to
// check shapes and pointers before launching.
[[nodiscard]] absl::Status Require(bool ok, const char* what);

// Blocks of `threads` covering n items (at least one block).
inline unsigned int BlocksFor(int64_t n, int threads) {
  const int64_t b = (n + threads - 1) / threads;
  return static_cast<unsigned int>(b < 1 ? 1 : b);
}

}  // namespace trainyard::kernels::cuda

#define TY_CUDA_RETURN_IF_ERROR(expr)                                                        \
  do {                                                                                       \
    const cudaError_t ty_cuda_err_ = (expr);                                                 \
    if (ty_cuda_err_ != cudaSuccess) {                                                       \
      return ::trainyard::kernels::cuda::CudaError(ty_cuda_err_, #expr, __FILE__, __LINE__); \
    }                                                                                        \
  } while (false)

// After a <<<...>>> launch: returns the launch error, if any.
#define TY_CUDA_RETURN_IF_LAUNCH_FAILED(kernel_name)                                   \
  do {                                                                                 \
    absl::Status ty_launch_status_ =                                                   \
        ::trainyard::kernels::cuda::LastLaunchStatus(kernel_name, __FILE__, __LINE__); \
    if (!ty_launch_status_.ok()) return ty_launch_status_;                             \
  } while (false)

#define TY_REQUIRE(cond) TY_RETURN_IF_ERROR(::trainyard::kernels::cuda::Require((cond), #cond))

#endif  // TRAINYARD_KERNELS_CUDA_CHECK_H_
