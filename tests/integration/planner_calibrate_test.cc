// `trainyard plan --calibrate`: measures the cpu profile with the CPU backend and two Gloo ranks
// over loopback, stores it where the test's profile path points, and later plans use it.
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/match.h"
#include "common/filesystem.h"
#include "gtest/gtest.h"
#include "planner/device_profile.h"
#include "tests/integration/test_env.h"
#include "tools/cli/plan_command.h"

namespace trainyard::cli {
namespace {

TEST(PlannerCalibrate, StoresAMeasuredProfileThatPlansUse) {
  const std::filesystem::path dir = testenv::MakeScratchDir("planner-calibrate");
  std::ostringstream out, err;
  PlanIo io;
  io.out = &out;
  io.err = &err;
  io.fs = RealFileSystem();
  io.cpu_profile_path = planner::CpuProfilePath(dir.c_str(), nullptr);
  io.scratch_dir = dir.string();
  ASSERT_EQ(RunPlan({"plan", "--calibrate", "--json"}, io), 0) << err.str();
  EXPECT_TRUE(absl::StrContains(out.str(), "{\"calibration\":{\"gemm_flops\":")) << out.str();
  EXPECT_TRUE(absl::StrContains(out.str(), "\"calibrations_kept\":1}")) << out.str();
  absl::StatusOr<planner::DeviceProfile> profile =
      planner::LoadCpuProfile(*RealFileSystem(), io.cpu_profile_path);
  ASSERT_TRUE(profile.ok()) << profile.status();
  EXPECT_TRUE(profile->calibrated);
  EXPECT_GT(profile->matmul_flops, 1e8);
  EXPECT_GT(profile->memory_bytes_per_second, 1e8);
  EXPECT_GT(profile->intra_node.alpha_seconds, 0);
  EXPECT_GT(profile->intra_node.bytes_per_second, 1e6);
  // Every rank count up to twice the cores (or the sparser ladder of a large machine), each with
  // an effective rate, and an α wherever a rank has a peer.
  ASSERT_GE(profile->shared.size(), 2u);
  EXPECT_EQ(profile->shared[0].ranks, 1);
  EXPECT_EQ(profile->cores, static_cast<int>(std::thread::hardware_concurrency()));
  for (const planner::SharedRanks& e : profile->shared) {
    EXPECT_GT(e.matmul_flops, 1e8) << e.ranks;
    EXPECT_GT(e.optimizer_elements_per_second, 1e6) << e.ranks;
    if (e.ranks >= 2) {
      EXPECT_GT(e.link.alpha_seconds, 0) << e.ranks;
      EXPECT_GT(e.lockstep_alpha_seconds, 0) << e.ranks;
      EXPECT_GT(e.lockstep_matmul_flops, 1e8) << e.ranks;
    }
  }
  EXPECT_TRUE(absl::StrContains(out.str(), "\"shared_ranks\":[{\"ranks\":1,")) << out.str();
  std::printf("calibrated: %s", out.str().c_str());

  const std::string spec = (dir / "spec.yaml").string();
  std::ofstream(spec) << "name: t\nmodel: {preset: gpt2-debug}\ntraining: {batch: 8, seq_len: 32}\n"
                         "resources: {nodes: 1, devices_per_node: 2, kind: cpu}\n";
  out.str("");
  ASSERT_EQ(RunPlan({"plan", spec}, io), 0) << err.str();
  EXPECT_TRUE(absl::StrContains(out.str(), "CPU ranks (calibrated on this machine)")) << out.str();
  EXPECT_FALSE(absl::StrContains(out.str(), "placeholder")) << out.str();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace trainyard::cli
