#include <cuda_runtime.h>

#include "common/device_probe.h"

namespace trainyard {
namespace {

// The CUDA runtime's view: the devices CUDA_VISIBLE_DEVICES leaves this process.
class CudaRuntimeProbe : public DeviceProbe {
 public:
  DeviceInfo Probe() const override {
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
      info.memory_bytes = static_cast<int64_t>(prop.totalGlobalMem);
    }
    return info;
  }
};

}  // namespace

const DeviceProbe& SystemDeviceProbe() {
  static const CudaRuntimeProbe probe;
  return probe;
}

}  // namespace trainyard
