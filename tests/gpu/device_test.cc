// GPU smoke test: the CUDA runtime sees a device of a compute capability this build targets.
// Skips, saying why, on machines without a GPU.
#include <cstdio>

#include "common/device_probe.h"
#include "gtest/gtest.h"

namespace trainyard {
namespace {

TEST(CudaDevice, IsUsable) {
  const DeviceInfo info = SystemDeviceProbe().Probe();
  if (info.count == 0) GTEST_SKIP() << "no GPU: " << info.why_none;
  std::printf("device 0: %s (sm_%d), %d device(s)\n", info.name.c_str(), info.sm, info.count);
  EXPECT_GE(info.sm, 70);
}

}  // namespace
}  // namespace trainyard
