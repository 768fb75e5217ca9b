// What the agent tells the coordinator about its machine's GPUs comes from a DeviceProbe, so it is
// tested with a fake one: every device the probe sees is offered, none when it sees none.
#include "server/agent/node_info.h"

#include "gtest/gtest.h"

namespace trainyard::server::agent {
namespace {

TEST(LocalGpus, OneEntryPerDeviceTheProbeSees) {
  const std::vector<v1::GpuInfo> gpus =
      LocalGpus(FakeDeviceProbe::WithDevices(2, "NVIDIA H100 80GB HBM3"));
  ASSERT_EQ(gpus.size(), 2u);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(gpus[i].index(), i);
    EXPECT_EQ(gpus[i].name(), "NVIDIA H100 80GB HBM3");
  }
  EXPECT_TRUE(LocalGpus(FakeDeviceProbe::WithDevices(0)).empty());
}

TEST(LocalGpus, ABuildOrMachineWithoutCudaOffersNone) {
  const DeviceInfo system = SystemDeviceProbe().Probe();
  EXPECT_EQ(static_cast<int>(LocalGpus(SystemDeviceProbe()).size()), system.count);
  if (system.count == 0) EXPECT_FALSE(system.why_none.empty());
}

}  // namespace
}  // namespace trainyard::server::agent
