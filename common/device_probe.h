// The one place a process asks how many CUDA devices it can use. The worker's placement (which
// device, NCCL or host-staged collectives), the CUDA backend, the agent's node description and
// the GPU tests all ask a DeviceProbe, so each of those decisions is tested without a GPU by
// handing it a FakeDeviceProbe.
//
// SystemDeviceProbe() is the CUDA runtime's answer in a build with CUDA (kernels/cuda/device.cu)
// and "no devices, this build has no CUDA support" otherwise (kernels/device_probe_none.cc); the
// library trainyard_device_probe is whichever of the two the build has.
//
// Threading: Probe() may be called from any thread.
#ifndef TRAINYARD_COMMON_DEVICE_PROBE_H_
#define TRAINYARD_COMMON_DEVICE_PROBE_H_

#include <string>
#include <utility>

namespace trainyard {

struct DeviceInfo {
  int count = 0;             // usable CUDA devices; 0 when none or the driver is missing
  std::string name;          // device 0's name, when count > 0
  int sm = 0;                // device 0's compute capability, e.g. 90
  std::string why_none;      // when count == 0: why, in one line
  int64_t memory_bytes = 0;  // device 0's memory, when count > 0 (0: unknown)
};

class DeviceProbe {
 public:
  virtual ~DeviceProbe() = default;
  virtual DeviceInfo Probe() const = 0;
};

// This machine's devices, as this build can use them.
const DeviceProbe& SystemDeviceProbe();

// A machine of the test's choosing.
class FakeDeviceProbe : public DeviceProbe {
 public:
  explicit FakeDeviceProbe(DeviceInfo info) : info_(std::move(info)) {}
  static FakeDeviceProbe WithDevices(int count, std::string name = "Fake GPU", int sm = 90) {
    return FakeDeviceProbe(DeviceInfo{.count = count,
                                      .name = std::move(name),
                                      .sm = sm,
                                      .why_none = count == 0 ? "no CUDA device present" : ""});
  }
  DeviceInfo Probe() const override { return info_; }

 private:
  DeviceInfo info_;
};

}  // namespace trainyard

#endif  // TRAINYARD_COMMON_DEVICE_PROBE_H_
