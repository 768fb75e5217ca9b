// The mesh rules both sides share (config/mesh.h): where a rank sits, and which rules hold
// whatever the resources (what a rank checks of the mesh it was handed).
#include "config/mesh.h"

#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace trainyard::config {
namespace {

ParallelismSpec Mesh(int dp, int tp, int pp) {
  ParallelismSpec mesh;
  mesh.dp = dp;
  mesh.tp = tp;
  mesh.pp = pp;
  return mesh;
}

TEST(MeshCoordinates, TensorParallelInnermostThenDataThenPipeline) {
  const ParallelismSpec mesh = Mesh(/*dp=*/2, /*tp=*/2, /*pp=*/3);
  EXPECT_EQ(CoordinatesOf(mesh, 0), (MeshCoordinates{.dp = 0, .tp = 0, .pp = 0}));
  EXPECT_EQ(CoordinatesOf(mesh, 1), (MeshCoordinates{.dp = 0, .tp = 1, .pp = 0}));
  EXPECT_EQ(CoordinatesOf(mesh, 2), (MeshCoordinates{.dp = 1, .tp = 0, .pp = 0}));
  EXPECT_EQ(CoordinatesOf(mesh, 4), (MeshCoordinates{.dp = 0, .tp = 0, .pp = 1}));
  EXPECT_EQ(CoordinatesOf(mesh, 11), (MeshCoordinates{.dp = 1, .tp = 1, .pp = 2}));
  // A bijection between ranks and coordinates.
  std::set<int> seen;
  for (int rank = 0; rank < mesh.world_size(); ++rank) {
    EXPECT_EQ(RankAt(mesh, CoordinatesOf(mesh, rank)), rank);
    seen.insert(RankAt(mesh, CoordinatesOf(mesh, rank)));
  }
  EXPECT_EQ(seen.size(), 12u);
}

TEST(MeshCoordinates, ContextParallelBetweenTensorAndData) {
  ParallelismSpec mesh = Mesh(/*dp=*/2, /*tp=*/2, /*pp=*/2);
  mesh.cp = 3;
  EXPECT_EQ(mesh.world_size(), 24);
  EXPECT_EQ(CoordinatesOf(mesh, 1), (MeshCoordinates{.dp = 0, .tp = 1, .pp = 0, .cp = 0}));
  EXPECT_EQ(CoordinatesOf(mesh, 2), (MeshCoordinates{.dp = 0, .tp = 0, .pp = 0, .cp = 1}));
  EXPECT_EQ(CoordinatesOf(mesh, 6), (MeshCoordinates{.dp = 1, .tp = 0, .pp = 0, .cp = 0}));
  EXPECT_EQ(CoordinatesOf(mesh, 12), (MeshCoordinates{.dp = 0, .tp = 0, .pp = 1, .cp = 0}));
  EXPECT_EQ(CoordinatesOf(mesh, 23), (MeshCoordinates{.dp = 1, .tp = 1, .pp = 1, .cp = 2}));
  std::set<int> seen;
  for (int rank = 0; rank < mesh.world_size(); ++rank) {
    EXPECT_EQ(RankAt(mesh, CoordinatesOf(mesh, rank)), rank);
    seen.insert(RankAt(mesh, CoordinatesOf(mesh, rank)));
  }
  EXPECT_EQ(seen.size(), 24u);
}

TEST(MeshCoordinates, ADegreeBelowOneCountsAsOne) {
  const ParallelismSpec unset = Mesh(0, 0, 0);
  EXPECT_EQ(CoordinatesOf(unset, 3), (MeshCoordinates{.dp = 0, .tp = 0, .pp = 3}));
  EXPECT_EQ(RankAt(unset, {.pp = 3}), 3);
}

TEST(FindShardingProblem, ChecksTheModelAndBatchButNotTheResources) {
  JobSpec spec;  // one node, one device by default
  spec.model.layers = 2;
  spec.model.heads = spec.model.kv_heads = 4;
  spec.training.batch = 8;
  // Four ranks on a one-device spec: the coordinator's rule, not the rank's.
  EXPECT_FALSE(FindShardingProblem(Mesh(2, 2, 1), spec).has_value());
  EXPECT_TRUE(FindMeshProblem(Mesh(2, 2, 1), spec).has_value());

  std::optional<SpecProblem> stages = FindShardingProblem(Mesh(1, 1, 3), spec);
  ASSERT_TRUE(stages.has_value());
  EXPECT_EQ(stages->path, "parallelism.pp");
  std::optional<SpecProblem> heads = FindShardingProblem(Mesh(1, 3, 1), spec);
  ASSERT_TRUE(heads.has_value());
  EXPECT_EQ(heads->path, "parallelism.tp");
  EXPECT_EQ(MeshProblemStatus(heads).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MeshProblemStatus(heads).message().substr(0, 16), "parallelism.tp: ");
  EXPECT_TRUE(MeshProblemStatus(std::nullopt).ok());
}

// A four-rank job of the default model (2 layers, 4 heads, ffn 256) with four experts of `ffn`.
JobSpec MoeSpec(int ffn) {
  JobSpec spec;
  spec.resources.devices_per_node = 4;
  spec.model.layers = 2;
  spec.model.heads = spec.model.kv_heads = 4;
  spec.model.moe = MoeConfig{.experts = 4, .top_k = 2, .ffn = ffn};
  spec.training.batch = 8;
  spec.training.seq_len = 16;
  return spec;
}

TEST(FindMeshProblem, TensorParallelismSplitsEveryExpertsMlp) {
  const JobSpec spec = MoeSpec(/*ffn=*/96);
  EXPECT_FALSE(FindMeshProblem(Mesh(2, 2, 1), spec).has_value());
  EXPECT_FALSE(FindMeshProblem(Mesh(1, 4, 1), spec).has_value());  // 96 = 4 × 24
  const JobSpec odd = MoeSpec(/*ffn=*/90);
  std::optional<SpecProblem> tp4 = FindShardingProblem(Mesh(1, 4, 1), odd);
  ASSERT_TRUE(tp4.has_value());
  EXPECT_EQ(tp4->path, "parallelism.tp");
  EXPECT_EQ(tp4->reason,
            "model.moe.ffn 90 is not divisible by tp 4 (tensor parallelism splits every expert's "
            "MLP evenly)");
  EXPECT_EQ(tp4->related.front(), "model.moe.ffn");
  EXPECT_FALSE(FindShardingProblem(Mesh(2, 2, 1), odd).has_value());  // 90 = 2 × 45
  // A dense model's moe fields mean nothing.
  JobSpec dense = odd;
  dense.model.moe.experts = 0;
  EXPECT_FALSE(FindShardingProblem(Mesh(1, 4, 1), dense).has_value());
}

TEST(FindMeshProblem, MoeRunsWithContextAndExpertParallelism) {
  ParallelismSpec mesh = Mesh(2, 1, 1);
  mesh.cp = 2;
  mesh.ep = 2;
  JobSpec spec = MoeSpec(/*ffn=*/64);
  spec.resources.devices_per_node = 4;
  EXPECT_FALSE(FindShardingProblem(mesh, spec).has_value());
  EXPECT_FALSE(FindMeshProblem(mesh, spec).has_value());
}

TEST(FindMeshProblem, MoeNeedsCpuRanks) {
  JobSpec spec = MoeSpec(/*ffn=*/64);
  spec.resources.kind = DeviceKind::kGpu;
  std::optional<SpecProblem> gpu = FindMeshProblem(Mesh(4, 1, 1), spec);
  ASSERT_TRUE(gpu.has_value());
  EXPECT_EQ(gpu->path, "model.moe");
  EXPECT_EQ(gpu->reason,
            "needs CPU ranks: the MoE layers have not run on a GPU yet (leave out model.moe, or "
            "write resources.kind: cpu)");
  EXPECT_EQ(gpu->related, std::vector<std::string>{"resources.kind"});
  // The coordinator's rule about the resources, not one a rank checks of its mesh.
  EXPECT_FALSE(FindShardingProblem(Mesh(4, 1, 1), spec).has_value());
  // `parallelism: auto` finds no mesh either.
  EXPECT_FALSE(ChooseParallelism(spec).ok());
  spec.resources.kind = DeviceKind::kCpu;
  EXPECT_FALSE(FindMeshProblem(Mesh(4, 1, 1), spec).has_value());
}

TEST(ResizedSpecTest, AnMoeMeshIsResizedByTheStaticRules) {
  JobSpec spec = MoeSpec(/*ffn=*/64);
  spec.resources.nodes = 2;
  spec.resources.devices_per_node = 2;
  spec.parallelism = Mesh(2, 2, 1);
  ASSERT_FALSE(FindMeshProblem(spec.parallelism, spec).has_value());
  const std::optional<JobSpec> one_node = ResizedSpec(spec, 1);
  ASSERT_TRUE(one_node.has_value());
  EXPECT_EQ(one_node->parallelism.dp, 1);
  EXPECT_EQ(one_node->parallelism.tp, 2);
  EXPECT_EQ(one_node->model.moe.experts, 4);
}

}  // namespace
}  // namespace trainyard::config
