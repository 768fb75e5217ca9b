// Where a GPU rank runs and how its collectives travel, decided from the number of visible
// devices alone (worker/parallel/placement.h), so the choice is tested without a GPU.
#include "worker/parallel/placement.h"

#include "gtest/gtest.h"

namespace trainyard::worker {
namespace {

using Collectives = RankContext::Collectives;

TEST(ChooseGpu, EachRankOnItsOwnDeviceUsesNccl) {
  for (int rank = 0; rank < 4; ++rank) {
    auto choice = ChooseGpu(/*visible_devices=*/4, rank, /*ranks_on_node=*/4);
    ASSERT_TRUE(choice.ok()) << choice.status();
    EXPECT_EQ(choice->device, rank);
    EXPECT_EQ(choice->collectives, Collectives::kNccl);
  }
  // The agent gives each rank one visible device: local rank 0 of 1 on device 0.
  auto own = ChooseGpu(1, 0, 1);
  ASSERT_TRUE(own.ok());
  EXPECT_EQ(own->device, 0);
  EXPECT_EQ(own->collectives, Collectives::kNccl);
  // More devices than ranks: still one each.
  EXPECT_EQ(ChooseGpu(8, 1, 2)->collectives, Collectives::kNccl);
}

TEST(ChooseGpu, RanksSharingADeviceStageThroughHostMemory) {
  // Four ranks on two devices: 0 and 2 share device 0, 1 and 3 device 1; NCCL cannot run two
  // ranks of one communicator on one device, so Gloo with host staging.
  const int expected_device[] = {0, 1, 0, 1};
  for (int rank = 0; rank < 4; ++rank) {
    auto choice = ChooseGpu(2, rank, 4);
    ASSERT_TRUE(choice.ok()) << choice.status();
    EXPECT_EQ(choice->device, expected_device[rank]);
    EXPECT_EQ(choice->collectives, Collectives::kStaged);
  }
  EXPECT_EQ(ChooseGpu(1, 1, 2)->collectives, Collectives::kStaged);
}

TEST(ChooseGpu, NoDeviceOrABadRankIsRefused) {
  EXPECT_EQ(ChooseGpu(0, 0, 1).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ChooseGpu(2, 2, 2).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ChooseGpu(2, -1, 2).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace trainyard::worker
