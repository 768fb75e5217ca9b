// CUDA device discovery, callable from code built without nvcc.
#ifndef TRAINYARD_KERNELS_CUDA_DEVICE_H_
#define TRAINYARD_KERNELS_CUDA_DEVICE_H_

#include <string>

namespace trainyard::kernels::cuda {

struct DeviceInfo {
  int count = 0;         // usable CUDA devices; 0 when none or the driver is missing
  std::string name;      // device 0's name, when count > 0
  int sm = 0;            // device 0's compute capability, e.g. 90
  std::string why_none;  // when count == 0: the runtime's explanation
};

DeviceInfo ProbeDevices();

}  // namespace trainyard::kernels::cuda

#endif  // TRAINYARD_KERNELS_CUDA_DEVICE_H_
