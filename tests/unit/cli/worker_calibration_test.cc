// `trainyard plan --calibrate`'s child process (tools/cli/worker_calibration.h), with shell
// scripts standing in for trainyard-worker: the command line carries the options and a reference
// spec that gives back the reference; what the child prints is parsed; a child that fails, or
// prints something else, or cannot be started is an error that says why.
#include "tools/cli/worker_calibration.h"

#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "config/spec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainyard::cli {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

class WorkerCalibration : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ =
        std::filesystem::path(::testing::TempDir()) /
        ("worker_calibration." + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) +
         "." + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
    options_.scratch_dir = (dir_ / "scratch").string();
    options_.threads = 3;
    options_.seconds_per_probe = 0.25;
    options_.seconds_per_link_probe = 1.5;
    options_.reference.model = *config::Preset("llama-debug");
    options_.reference.training.micro_batch = 2;
    options_.reference.training.seq_len = 48;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string Read(const std::filesystem::path& path) {
    std::ostringstream text;
    text << std::ifstream(path).rdbuf();
    return text.str();
  }

  // An executable script standing in for trainyard-worker, running `body`.
  std::string FakeWorker(const std::string& body) {
    const std::string path = (dir_ / "fake-worker").string();
    std::ofstream(path) << "#!/bin/sh\n" << body;
    chmod(path.c_str(), 0755);
    return path;
  }

  std::filesystem::path dir_;
  planner::CalibrationOptions options_;
};

TEST_F(WorkerCalibration, PassesTheOptionsAndParsesWhatTheWorkerPrints) {
  planner::Calibration measured;
  measured.gemm_flops = 1.25e10;
  measured.reference_name = "llama, 2 layers, width 64, 2 × 48 tokens";
  measured.profile.memory_bytes = 1 << 30;
  measured.profile.peak_flops = measured.profile.matmul_flops = 2e10;
  measured.profile.memory_bytes_per_second = 5e9;
  measured.profile.intra_node = measured.profile.inter_node = planner::Link{1e-4, 1e9};
  const std::string fixture = (dir_ / "calibration.json").string();
  std::ofstream(fixture) << planner::CalibrationToJson(measured);
  const std::string args = (dir_ / "args").string();
  const std::string worker =
      FakeWorker(absl::StrCat("printf '%s\\n' \"$@\" > ", args, "\ncat ", fixture, "\n"));

  absl::StatusOr<planner::Calibration> c = CalibrateWithWorker(worker, options_);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->gemm_flops, measured.gemm_flops);
  EXPECT_EQ(c->reference_name, measured.reference_name);
  EXPECT_EQ(c->profile.intra_node.alpha_seconds, 1e-4);

  const std::string reference = options_.scratch_dir + "/reference.yaml";
  std::vector<std::string> argv = absl::StrSplit(Read(args), '\n', absl::SkipEmpty());
  EXPECT_THAT(argv, ElementsAre("calibrate", "--scratch", options_.scratch_dir + "/rendezvous",
                                "--reference", reference, "--seconds-per-probe", "0.25",
                                "--seconds-per-link-probe", "1.5", "--threads", "3"));
  absl::StatusOr<config::JobSpec> spec = config::ParseJobSpec(Read(reference), reference);
  ASSERT_TRUE(spec.ok()) << spec.status();
  const config::JobSpec carried = planner::CalibrationReference(*spec);
  EXPECT_EQ(carried.model.family, config::ModelFamily::kLlama);
  EXPECT_EQ(carried.model.kv_heads, options_.reference.model.kv_heads);
  EXPECT_EQ(carried.training.micro_batch, 2);
  EXPECT_EQ(carried.training.seq_len, 48);
}

TEST_F(WorkerCalibration, AFailedWorkerSaysWhyInItsLastLine) {
  const std::string worker = FakeWorker(
      "echo 'some warning' >&2\n"
      "echo 'trainyard-worker: error: cannot connect' >&2\nexit 1\n");
  absl::StatusOr<planner::Calibration> c = CalibrateWithWorker(worker, options_);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(std::string(c.status().message()),
              HasSubstr("calibrate exited with code 1: cannot connect"));
}

TEST_F(WorkerCalibration, AKilledWorkerIsAnError) {
  absl::StatusOr<planner::Calibration> c =
      CalibrateWithWorker(FakeWorker("kill -9 $$\n"), options_);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("killed by signal 9"));
}

TEST_F(WorkerCalibration, OutputThatIsNotACalibrationIsAnError) {
  absl::StatusOr<planner::Calibration> c =
      CalibrateWithWorker(FakeWorker("echo 'job t: 10 steps'\n"), options_);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("malformed result"));
}

TEST_F(WorkerCalibration, AWorkerThatCannotRunIsAnError) {
  absl::StatusOr<planner::Calibration> c =
      CalibrateWithWorker((dir_ / "no-such-worker").string(), options_);
  EXPECT_FALSE(c.ok());
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("no-such-worker"));
}

}  // namespace
}  // namespace trainyard::cli
