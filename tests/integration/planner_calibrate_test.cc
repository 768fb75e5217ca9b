// `trainyard plan --calibrate` as a user runs it: the `trainyard` binary execs the built
// `trainyard-worker calibrate` (the CLI links no engine code), which measures the cpu profile
// with the CPU backend and Gloo ranks over loopback; the profile is stored where
// $XDG_CONFIG_HOME points, and later plans use it. Without a worker to exec, the CLI says so.
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "common/filesystem.h"
#include "gtest/gtest.h"
#include "planner/device_profile.h"
#include "tests/integration/subprocess.h"
#include "tests/integration/test_env.h"

namespace trainyard::testenv {
namespace {

class PlannerCalibrate : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = MakeScratchDir("planner-calibrate"); }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  // Runs `binary` with `args`, its profile and scratch files in this test's folder and `env`
  // ("NAME=value" each) added to its environment.
  ProcessResult Run(const std::string& binary, const std::vector<std::string>& args,
                    double timeout_seconds, const std::vector<std::string>& env = {}) {
    std::vector<std::string> argv{"/usr/bin/env", "-u", "TRAINYARD_WORKER_BINARY",
                                  "XDG_CONFIG_HOME=" + dir_.string(), "TMPDIR=" + dir_.string()};
    argv.insert(argv.end(), env.begin(), env.end());
    argv.push_back(binary);
    argv.insert(argv.end(), args.begin(), args.end());
    return RunProcess(argv, timeout_seconds);
  }

  std::filesystem::path dir_;
};

TEST_F(PlannerCalibrate, StoresAMeasuredProfileThatPlansUse) {
  // build/tools/cli/trainyard finds build/worker/trainyard-worker (the build tree's layout).
  const std::string cli = BinaryDir() + "/tools/cli/trainyard";
  ProcessResult r = Run(cli, {"plan", "--calibrate", "--json"}, 540);
  ASSERT_FALSE(r.timed_out);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(absl::StrContains(r.out, "{\"calibration\":{\"gemm_flops\":")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "\"calibrations_kept\":1}")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "\"shared_ranks\":[{\"ranks\":1,")) << r.out;
  std::printf("calibrated: %s", r.out.c_str());

  const std::string profile_path = planner::CpuProfilePath(dir_.c_str(), nullptr);
  absl::StatusOr<planner::DeviceProfile> profile =
      planner::LoadCpuProfile(*RealFileSystem(), profile_path);
  ASSERT_TRUE(profile.ok()) << profile.status();
  EXPECT_TRUE(profile->calibrated);
  EXPECT_EQ(profile->reference, "gpt2, 4 layers, width 128, 4 × 64 tokens");
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
  // The worker's scratch files are gone.
  for (const auto& entry : std::filesystem::directory_iterator(dir_)) {
    EXPECT_FALSE(absl::StartsWith(entry.path().filename().string(), "trainyard-calibrate"))
        << entry.path();
  }

  const std::string spec = (dir_ / "spec.yaml").string();
  std::ofstream(spec) << "name: t\nmodel: {preset: gpt2-debug}\ntraining: {batch: 8, seq_len: 32}\n"
                         "resources: {nodes: 1, devices_per_node: 2, kind: cpu}\n";
  r = Run(cli, {"plan", spec}, 60);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(absl::StrContains(r.out, "CPU ranks (calibrated on this machine)")) << r.out;
  EXPECT_FALSE(absl::StrContains(r.out, "placeholder")) << r.out;
}

TEST_F(PlannerCalibrate, WithoutAWorkerSaysWhereItLooked) {
  // A trainyard alone in a folder of its own, with no worker beside it, near it or on PATH.
  const std::filesystem::path bin = dir_ / "a" / "b" / "bin";
  std::filesystem::create_directories(bin);
  std::filesystem::copy_file(BinaryDir() + "/tools/cli/trainyard", bin / "trainyard");
  ProcessResult r =
      Run((bin / "trainyard").string(), {"plan", "--calibrate"}, 60, {"PATH=" + bin.string()});
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_TRUE(
      absl::StrContains(r.err, "calibration needs trainyard-worker beside trainyard or on PATH"))
      << r.err;
  EXPECT_TRUE(absl::StrContains(r.err, (bin / "trainyard-worker").string())) << r.err;
  std::vector<std::string> lines = absl::StrSplit(r.err, '\n', absl::SkipEmpty());
  EXPECT_EQ(lines.size(), 1u) << r.err;
  EXPECT_FALSE(std::filesystem::exists(planner::CpuProfilePath(dir_.c_str(), nullptr)));
}

TEST_F(PlannerCalibrate, TheWorkerRefusesBadInput) {
  const std::string worker = BinaryDir() + "/worker/trainyard-worker";
  const std::string scratch = (dir_ / "scratch").string();
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {"calibrate"},
           {"calibrate", "--scratch", scratch, "--seconds-per-probe", "0"},
           {"calibrate", "--scratch", scratch, "--frobnicate"},
           {"calibrate", "--scratch", scratch, "--reference", (dir_ / "absent.yaml").string()}}) {
    ProcessResult r = Run(worker, args, 60);
    ASSERT_FALSE(r.timed_out);
    EXPECT_EQ(r.exit_code, 2) << args.back() << ": " << r.err;
    std::vector<std::string> lines = absl::StrSplit(r.err, '\n', absl::SkipEmpty());
    EXPECT_EQ(lines.size(), 1u) << r.err;
    EXPECT_EQ(r.out, "");
  }
}

}  // namespace
}  // namespace trainyard::testenv
