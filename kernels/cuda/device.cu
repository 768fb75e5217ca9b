#include <cuda_runtime.h>

#include "kernels/cuda/device.h"

namespace trainyard::kernels::cuda {

DeviceInfo ProbeDevices() {
  DeviceInfo info;
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    info.why_none = cudaGetErrorString(err);
    return info;
  }
  info.count = count;
  if (count == 0) {
    info.why_none = "no CUDA device present";
    return info;
  }
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess) {
    info.name = prop.name;
    info.sm = prop.major * 10 + prop.minor;
  }
  return info;
}

}  // namespace trainyard::kernels::cuda
