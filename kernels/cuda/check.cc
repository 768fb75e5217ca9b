#include "kernels/cuda/check.h"

#include "absl/strings/str_cat.h"

namespace trainyard::kernels::cuda {

absl::Status CudaError(cudaError_t err, const char* expr, const char* file, int line) {
  std::string message = absl::StrCat(expr, ": ", cudaGetErrorName(err), " (",
                                     cudaGetErrorString(err), ") at ", file, ":", line);
  if (err == cudaErrorMemoryAllocation) return absl::ResourceExhaustedError(message);
  return absl::InternalError(message);
}

absl::Status LastLaunchStatus(const char* kernel, const char* file, int line) {
  const cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess) return absl::OkStatus();
  return CudaError(err, kernel, file, line);
}

absl::Status Require(bool ok, const char* what) {
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("kernel argument check failed: ", what));
}

}  // namespace trainyard::kernels::cuda
