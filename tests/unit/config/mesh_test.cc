// The mesh rules both sides share (config/mesh.h): where a rank sits, and which rules hold
// whatever the resources (what a rank checks of the mesh it was handed).
#include "config/mesh.h"

#include <set>

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

}  // namespace
}  // namespace trainyard::config
