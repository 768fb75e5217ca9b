#include "worker/parallel/cuda_device_copier.h"

#include "common/status.h"
#include "kernels/cuda/check.h"

namespace trainyard::worker::parallel {
namespace {

class CudaDeviceCopier final : public DeviceCopier {
 public:
  CudaDeviceCopier(cudaStream_t stream, int device) : stream_(stream), device_(device) {}

  absl::Status CopyToHost(void* host, const void* device, int64_t bytes) override {
    return Copy(host, device, bytes, cudaMemcpyDeviceToHost);
  }
  absl::Status CopyToDevice(void* device, const void* host, int64_t bytes) override {
    return Copy(device, host, bytes, cudaMemcpyHostToDevice);
  }

  bool IsDevicePointer(const void* ptr) const override {
    cudaPointerAttributes attributes{};
    if (cudaPointerGetAttributes(&attributes, ptr) != cudaSuccess) {
      cudaGetLastError();  // not a pointer CUDA knows: plain host memory; clear the error
      return false;
    }
    return attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged;
  }

 private:
  absl::Status Copy(void* dst, const void* src, int64_t bytes, cudaMemcpyKind kind) {
    if (bytes <= 0) return absl::OkStatus();
    TY_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    TY_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, bytes, kind, stream_));
    TY_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    return absl::OkStatus();
  }

  cudaStream_t stream_;
  int device_;
};

}  // namespace

std::unique_ptr<DeviceCopier> MakeCudaDeviceCopier(cudaStream_t stream) {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) cudaGetLastError();
  return std::make_unique<CudaDeviceCopier>(stream, device);
}

}  // namespace trainyard::worker::parallel
