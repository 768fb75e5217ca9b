// SystemDeviceProbe in a build without a CUDA toolkit: no devices, and why.
#include "common/device_probe.h"

namespace trainyard {
namespace {

class NoCudaProbe : public DeviceProbe {
 public:
  DeviceInfo Probe() const override {
    return DeviceInfo{.why_none =
                          "this build has no CUDA support: configure with a CUDA toolkit present "
                          "(TRAINYARD_CUDA=ON)"};
  }
};

}  // namespace

const DeviceProbe& SystemDeviceProbe() {
  static const NoCudaProbe probe;
  return probe;
}

}  // namespace trainyard
