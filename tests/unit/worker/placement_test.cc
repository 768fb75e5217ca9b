// Where a GPU rank runs and how its collectives travel, decided from what a DeviceProbe sees
// (worker/parallel/placement.h), so the choice is tested without a GPU through FakeDeviceProbe.
#include "worker/parallel/placement.h"

#include "gtest/gtest.h"
#include "worker/cuda_backend.h"

namespace trainyard::worker {
namespace {

using Collectives = RankContext::Collectives;

DeviceInfo Devices(int count) { return FakeDeviceProbe::WithDevices(count).Probe(); }

TEST(ChooseGpu, EachRankOnItsOwnDeviceUsesNccl) {
  for (int rank = 0; rank < 4; ++rank) {
    auto choice = ChooseGpu(Devices(4), rank, /*ranks_on_node=*/4);
    ASSERT_TRUE(choice.ok()) << choice.status();
    EXPECT_EQ(choice->device, rank);
    EXPECT_EQ(choice->collectives, Collectives::kNccl);
  }
  // The agent gives each rank one visible device: local rank 0 of 1 on device 0.
  auto own = ChooseGpu(Devices(1), 0, 1);
  ASSERT_TRUE(own.ok());
  EXPECT_EQ(own->device, 0);
  EXPECT_EQ(own->collectives, Collectives::kNccl);
  // More devices than ranks: still one each.
  EXPECT_EQ(ChooseGpu(Devices(8), 1, 2)->collectives, Collectives::kNccl);
}

TEST(ChooseGpu, RanksSharingADeviceStageThroughHostMemory) {
  // Four ranks on two devices: 0 and 2 share device 0, 1 and 3 device 1; NCCL cannot run two
  // ranks of one communicator on one device, so Gloo with host staging.
  const int expected_device[] = {0, 1, 0, 1};
  for (int rank = 0; rank < 4; ++rank) {
    auto choice = ChooseGpu(Devices(2), rank, 4);
    ASSERT_TRUE(choice.ok()) << choice.status();
    EXPECT_EQ(choice->device, expected_device[rank]);
    EXPECT_EQ(choice->collectives, Collectives::kStaged);
  }
  EXPECT_EQ(ChooseGpu(Devices(1), 1, 2)->collectives, Collectives::kStaged);
}

TEST(ChooseGpu, NoDeviceOrABadRankIsRefused) {
  const absl::Status none = ChooseGpu(Devices(0), 0, 1).status();
  EXPECT_EQ(none.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(none.message(), "no GPU is visible: no CUDA device present");
  EXPECT_EQ(ChooseGpu(Devices(2), 2, 2).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ChooseGpu(Devices(2), -1, 2).status().code(), absl::StatusCode::kInvalidArgument);
}

config::JobSpec GpuSpec() {
  config::JobSpec spec;
  spec.resources.kind = config::DeviceKind::kGpu;
  return spec;
}

TEST(PlaceRank, AGpuJobWhereTheProbeFindsNoDeviceSaysWhy) {
  const FakeDeviceProbe no_driver(DeviceInfo{.why_none = "CUDA driver version is insufficient"});
  absl::StatusOr<Placement> placed = PlaceRank(GpuSpec(), 0, 1, 1, no_driver);
  ASSERT_FALSE(placed.ok());
  EXPECT_EQ(placed.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(placed.status().message(),
            "resources.kind is gpu but this worker cannot use a GPU: CUDA driver version is "
            "insufficient");
}

TEST(PlaceRank, ACpuJobNeverAsksForADevice) {
  config::JobSpec spec;
  spec.resources.kind = config::DeviceKind::kCpu;
  absl::StatusOr<Placement> placed = PlaceRank(spec, 0, 1, 1, FakeDeviceProbe::WithDevices(0));
  ASSERT_TRUE(placed.ok()) << placed.status();
  EXPECT_EQ(placed->collectives, Collectives::kHost);
  EXPECT_EQ(CudaStreamOf(*placed->backend), nullptr);
}

}  // namespace
}  // namespace trainyard::worker
