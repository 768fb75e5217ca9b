#include "server/requirements.h"

#include "gtest/gtest.h"

namespace trainyard::server {
namespace {

config::JobSpec Spec(int nodes, int per_node, int dp, int tp, int pp) {
  config::JobSpec spec;
  spec.resources.nodes = nodes;
  spec.resources.devices_per_node = per_node;
  spec.resources.kind = config::DeviceKind::kGpu;
  spec.parallelism.dp = dp;
  spec.parallelism.tp = tp;
  spec.parallelism.pp = pp;
  spec.parallelism.zero = 2;
  spec.model.tied_embeddings = false;  // ZeRO-2 across pipeline stages needs an untied embedding
  spec.fault_tolerance.max_restarts = 4;
  spec.fault_tolerance.heartbeat_timeout_s = 2.5;
  return spec;
}

TEST(RequirementsTest, CopiesThePlacementShape) {
  auto req = RequirementsFromSpec(Spec(2, 4, 2, 2, 2));
  ASSERT_TRUE(req.ok()) << req.status();
  EXPECT_EQ(req->world_size(), 8);
  EXPECT_EQ(req->kind, DeviceKind::kGpu);
  EXPECT_EQ(req->mesh.zero_stage, 2);
  EXPECT_EQ(req->max_restarts, 4);
  EXPECT_EQ(req->heartbeat_timeout, absl::Milliseconds(2500));
}

TEST(RequirementsTest, CarriesTheExpertParallelDegree) {
  config::JobSpec spec = Spec(1, 4, 4, 1, 1);
  spec.resources.kind = config::DeviceKind::kCpu;
  spec.model.moe = config::MoeConfig{.experts = 4, .top_k = 2, .ffn = 64};
  spec.parallelism.ep = 2;
  auto req = RequirementsFromSpec(spec);
  ASSERT_TRUE(req.ok()) << req.status();
  EXPECT_EQ(req->mesh.ep, 2);
  EXPECT_EQ(req->world_size(), 4);  // drawn from dp: the world does not change
}

TEST(RequirementsTest, CarriesTheContextParallelDegreeIntoTheWorld) {
  config::JobSpec spec = Spec(2, 4, 2, 2, 1);
  spec.resources.kind = config::DeviceKind::kCpu;
  spec.parallelism.cp = 2;
  auto req = RequirementsFromSpec(spec);
  ASSERT_TRUE(req.ok()) << req.status();
  EXPECT_EQ(req->mesh.cp, 2);
  EXPECT_EQ(req->world_size(), 8);
  // Without cp the same degrees fill half the world.
  spec.parallelism.cp = 1;
  EXPECT_EQ(RequirementsFromSpec(spec).status().code(), absl::StatusCode::kInvalidArgument);
  // On GPUs alike.
  spec.parallelism.cp = 2;
  spec.resources.kind = config::DeviceKind::kGpu;
  const auto gpu = RequirementsFromSpec(spec);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  EXPECT_EQ(gpu->mesh.cp, 2);
  EXPECT_EQ(gpu->world_size(), 8);
}

TEST(RequirementsTest, RefusesMeshesThePlacementCannotHold) {
  auto mismatch = RequirementsFromSpec(Spec(1, 2, 4, 1, 1));
  EXPECT_EQ(mismatch.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(mismatch.status().message().find("resources"), std::string::npos);
  auto split_tp = RequirementsFromSpec(Spec(2, 2, 1, 4, 1));
  EXPECT_EQ(split_tp.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(split_tp.status().message().find("parallelism.tp"), std::string::npos);
}

}  // namespace
}  // namespace trainyard::server
