// The device peaks the GPU benchmarks hold their figures against: the dense bf16 tensor-core
// rate (known devices, by CUDA's device name) and the memory bandwidth (from the device's memory
// clock and bus width). A kernel's achieved rate over the peak that bounds it is how far it is
// from its floor.
#ifndef TRAINYARD_BENCH_DEVICE_PEAKS_H_
#define TRAINYARD_BENCH_DEVICE_PEAKS_H_

#include <cuda_runtime_api.h>

#include <optional>
#include <string>

#include "absl/strings/match.h"

namespace trainyard::bench {

// Dense bf16 TFLOP/s: H100 SXM (HBM3) 989, H100 PCIe 756, H100 NVL 835, H200 989; nullopt for
// other devices.
inline std::optional<double> PeakTflops(const std::string& name) {
  if (absl::StrContains(name, "H200")) return 989.0;
  if (absl::StrContains(name, "H100")) {
    if (absl::StrContains(name, "PCIe")) return 756.0;
    if (absl::StrContains(name, "NVL")) return 835.0;
    return 989.0;  // SXM5 (HBM3)
  }
  return std::nullopt;
}

// Bytes per second the memory of `device` can move: 2 transfers a clock (double data rate) of
// the bus width; nullopt where the runtime does not report them.
inline std::optional<double> PeakBytesPerSecond(int device = 0) {
  int clock_khz = 0, bus_bits = 0;
  if (cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, device) != cudaSuccess ||
      clock_khz <= 0 || bus_bits <= 0) {
    cudaGetLastError();  // leave no error for the next launch check
    return std::nullopt;
  }
  return 2.0 * clock_khz * 1e3 * bus_bits / 8.0;
}

}  // namespace trainyard::bench

#endif  // TRAINYARD_BENCH_DEVICE_PEAKS_H_
