// `trainyard plan` in process: bad input is one line on stderr and exit code 2; the JSON object
// has the documented shape; `--calibrate` keeps the machine's calibrations and stores their
// median (with a fake calibrator); `plan` is dispatched from the CLI's entry point.
#include "tools/cli/plan_command.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "common/filesystem.h"
#include "gtest/gtest.h"
#include "planner/calibration.h"
#include "planner/device_profile.h"
#include "tools/cli/commands.h"

namespace trainyard::cli {
namespace {

constexpr char kSpec[] = R"(name: plan-test
model:
  preset: gpt2-debug
training:
  batch: 8
  seq_len: 32
)";

class PlanCommand : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) /
           ("plan." + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + "." +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string Write(const std::string& name, const std::string& text) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path) << text;
    return path;
  }
  std::string SpecWithResources() {
    return Write("spec.yaml", std::string(kSpec) + "resources: {nodes: 1, devices_per_node: 2}\n");
  }

  std::string ProfilePath() const { return (dir_ / "trainyard" / "cpu-profile.json").string(); }

  int Run(std::vector<std::string> args) {
    out_.str("");
    err_.str("");
    PlanIo io;
    io.calibrate = calibrate_;
    io.out = &out_;
    io.err = &err_;
    io.fs = RealFileSystem();
    io.cpu_profile_path = ProfilePath();
    io.scratch_dir = dir_.string();
    args.insert(args.begin(), "plan");
    return RunPlan(args, io);
  }
  // Exit code 2 and exactly one line on stderr, containing `what`.
  void ExpectBadInput(const std::vector<std::string>& args, const std::string& what) {
    EXPECT_EQ(Run(args), 2);
    const std::string err = err_.str();
    EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
    EXPECT_TRUE(absl::StrContains(err, what)) << err;
    EXPECT_EQ(out_.str(), "");
  }

  std::filesystem::path dir_;
  std::ostringstream out_, err_;
  // A fake calibrator: each call measures the next of `draws` as the pair's α of 2 ranks.
  std::vector<double> draws_;
  size_t calls_ = 0;
  std::function<absl::StatusOr<planner::Calibration>(const planner::CalibrationOptions&)>
      calibrate_ =
          [this](
              const planner::CalibrationOptions& options) -> absl::StatusOr<planner::Calibration> {
    if (calls_ >= draws_.size()) return absl::UnavailableError("no more draws");
    planner::Calibration c;
    planner::DeviceProfile& p = c.profile;
    p.name = "cpu";
    p.shared_node = p.calibrated = true;
    p.cores = 2;
    p.memory_bytes = int64_t{8} << 30;
    p.peak_flops = p.matmul_flops = 1e11;
    p.memory_bytes_per_second = 4e10;
    p.intra_node = p.inter_node = planner::Link{.alpha_seconds = 7e-5, .bytes_per_second = 1.5e9};
    p.reference = c.reference_name = planner::CalibrationReferenceName(options.reference);
    const double alpha = draws_[calls_++];
    p.shared = {{.ranks = 1, .matmul_flops = 1e11, .link = {0, 1.5e9}},
                {.ranks = 2, .matmul_flops = 5e10, .link = {alpha, 1.5e9}}};
    for (const planner::SharedRanks& e : p.shared) c.shared.push_back({.entry = e});
    return c;
  };
};

TEST_F(PlanCommand, UnknownDeviceProfile) {
  ExpectBadInput({SpecWithResources(), "--device", "a100"}, "unknown device profile 'a100'");
}

TEST_F(PlanCommand, ImpossibleMesh) {
  ExpectBadInput({SpecWithResources(), "--mesh", "dp=3,tp=1,pp=1"}, "--mesh: parallelism.dp");
  ExpectBadInput({SpecWithResources(), "--mesh", "dp=2,tp=1"}, "dp, tp and pp are all required");
  ExpectBadInput({SpecWithResources(), "--mesh=dp=two"}, "expected dp=D,tp=T,pp=P");
}

TEST_F(PlanCommand, SpecWithoutResources) {
  ExpectBadInput({Write("bare.yaml", kSpec)}, "no resources section");
  // Said on the command line instead, it plans.
  EXPECT_EQ(Run({Write("bare.yaml", kSpec), "--devices-per-node", "2"}), 0) << err_.str();
}

TEST_F(PlanCommand, UnreadableOrInvalidSpec) {
  ExpectBadInput({(dir_ / "missing.yaml").string()}, "cannot read the spec");
  ExpectBadInput({Write("bad.yaml", "name: x\nmodel: {preset: nope}\n")}, "model.preset");
}

TEST_F(PlanCommand, BadFlags) {
  ExpectBadInput({SpecWithResources(), "--checkpoint-seconds", "30"}, "go together");
  ExpectBadInput({SpecWithResources(), "--nodes", "0"}, "--nodes must be an integer");
  ExpectBadInput({SpecWithResources(), "--frobnicate"}, "unknown flag '--frobnicate' for 'plan'");
  ExpectBadInput({}, "plan needs a SPEC");
  ExpectBadInput({SpecWithResources(), "--fresh"}, "--fresh goes with --calibrate");
  ExpectBadInput({"--calibrate", "--fresh=maybe"}, "--fresh: invalid value 'maybe'");
}

// plan reaches no coordinator: the CLI's connection flags are refused by name, not ignored.
TEST_F(PlanCommand, ConnectionFlagsAreRefused) {
  for (const std::string flag :
       {"--server", "--token-file", "--tls-ca", "--tls-cert", "--tls-key"}) {
    ExpectBadInput({SpecWithResources(), flag, "x"}, "plan runs locally; " + flag + " is not used");
  }
  ExpectBadInput({"--server=127.0.0.1:1", "--calibrate"},
                 "plan runs locally; --server is not used");
  // Before the command word too, as the CLI's entry point dispatches it.
  CliIo io;
  std::ostringstream out, err;
  io.out = &out;
  io.err = &err;
  io.fs = RealFileSystem();
  EXPECT_EQ(RunCli({"--server", "127.0.0.1:1", "plan", SpecWithResources()}, io), 2);
  EXPECT_TRUE(absl::StrContains(err.str(), "plan runs locally; --server is not used")) << err.str();
  EXPECT_EQ(out.str(), "");
}

TEST_F(PlanCommand, CalibrationsAreKeptAndTheProfileIsTheirMedian) {
  draws_ = {1e-3, 4e-3, 2e-3, 9e-3};
  ASSERT_EQ(Run({"--calibrate", "--json"}), 0) << err_.str();
  EXPECT_TRUE(absl::StrContains(out_.str(), "\"calibrations_kept\":1")) << out_.str();
  ASSERT_EQ(Run({"--calibrate"}), 0) << err_.str();
  EXPECT_TRUE(absl::StrContains(out_.str(), "the median of the last 2 calibrations")) << out_.str();
  ASSERT_EQ(Run({"--calibrate", "--json"}), 0) << err_.str();
  EXPECT_TRUE(absl::StrContains(out_.str(), "\"calibrations_kept\":3")) << out_.str();
  absl::StatusOr<planner::CpuProfileFile> file =
      planner::LoadCpuProfileFile(*RealFileSystem(), ProfilePath());
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_EQ(file->calibrations.size(), 3u);
  EXPECT_DOUBLE_EQ(file->profile.shared[1].link.alpha_seconds, 2e-3);  // of 1, 4 and 2 ms
  // Plans use the median.
  ASSERT_EQ(Run({SpecWithResources()}), 0) << err_.str();
  EXPECT_TRUE(absl::StrContains(out_.str(), "the median of 3 calibrations")) << out_.str();

  // --fresh forgets the earlier ones.
  ASSERT_EQ(Run({"--calibrate", "--fresh", "--json"}), 0) << err_.str();
  EXPECT_TRUE(absl::StrContains(out_.str(), "\"calibrations_kept\":1")) << out_.str();
  file = planner::LoadCpuProfileFile(*RealFileSystem(), ProfilePath());
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->calibrations.size(), 1u);
  EXPECT_DOUBLE_EQ(file->profile.shared[1].link.alpha_seconds, 9e-3);

  // A calibration that fails leaves the stored profile alone.
  EXPECT_EQ(Run({"--calibrate"}), 1);
  file = planner::LoadCpuProfileFile(*RealFileSystem(), ProfilePath());
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_DOUBLE_EQ(file->profile.shared[1].link.alpha_seconds, 9e-3);
}

TEST_F(PlanCommand, JsonHasTheDocumentedShape) {
  ASSERT_EQ(Run({SpecWithResources(), "--json", "--device", "h100", "--checkpoint-seconds", "30",
                 "--mtbf-hours", "12"}),
            0)
      << err_.str();
  const std::string json = out_.str();
  EXPECT_EQ(std::count(json.begin(), json.end(), '\n'), 1) << json;
  for (const char* key :
       {"{\"candidates\":[{\"mesh\":{\"dp\":", "\"memory_bytes\":{\"parameters\":",
        "\"gradients\":", "\"optimizer\":", "\"activations\":", "\"other\":", "\"total\":",
        "\"fits\":true", "\"step_seconds\":{\"compute\":", "\"communication\":", "\"bubble\":",
        "\"bubble_fraction\":", "\"communication_bytes\":{\"dp\":", "\"mfu\":", "\"chosen\":0",
        "\"explanation\":\"Chose ", "\"young_daly\":{\"checkpoint_seconds\":30,",
        "\"mtbf_seconds\":43200,", "\"interval_seconds\":"}) {
    EXPECT_TRUE(absl::StrContains(json, key)) << key << " in " << json;
  }
  ASSERT_EQ(Run({SpecWithResources(), "--json", "--mesh", "dp=2,tp=1,pp=1,zero=1"}), 0);
  EXPECT_TRUE(absl::StrContains(
      out_.str(),
      "\"mesh\":{\"dp\":2,\"tp\":1,\"pp\":1,\"cp\":1,\"ep\":1,\"zero\":1,\"schedule\":"
      "\"1f1b\",\"virtual_stages\":1}"));
  EXPECT_TRUE(absl::StrContains(out_.str(), "\"young_daly\":null"));
}

// A pipelined candidate runs the spec's schedule where it can (zero-bubble here), the others 1F1B.
TEST_F(PlanCommand, CandidatesShowTheirPipelineSchedule) {
  const std::string spec =
      Write("zb.yaml",
            "name: zb\nmodel:\n  preset: gpt2-debug\ntraining: {batch: 8, micro_batch: 2, "
            "seq_len: 32}\nparallelism: {pp: 2, schedule: zero-bubble}\n"
            "resources: {nodes: 1, devices_per_node: 2}\n");
  ASSERT_EQ(Run({spec, "--json", "--mesh", "dp=1,tp=1,pp=2"}), 0) << err_.str();
  EXPECT_TRUE(absl::StrContains(
      out_.str(),
      "\"pp\":2,\"cp\":1,\"ep\":1,\"zero\":0,\"schedule\":\"zero-bubble\",\"virtual_stages\":1}"))
      << out_.str();
  ASSERT_EQ(Run({spec}), 0) << err_.str();
  EXPECT_TRUE(absl::StrContains(out_.str(), "dp1 tp1 pp2 z0 zb")) << out_.str();
  EXPECT_TRUE(absl::StrContains(out_.str(), "dp2 tp1 pp1 z0 ")) << out_.str();
}

// Interleaved candidates show V; a mesh whose layers do not split into pp · V chunks runs 1F1B.
TEST_F(PlanCommand, InterleavedCandidatesShowTheirVirtualStages) {
  const std::string spec =
      Write("il.yaml",
            "name: il\nmodel:\n  preset: gpt2-debug\n  layers: 4\ntraining: {batch: 8, "
            "micro_batch: 2, seq_len: 32}\nparallelism: {dp: 2, pp: 2, schedule: interleaved, "
            "virtual_stages: 2}\nresources: {nodes: 1, devices_per_node: 4}\n");
  ASSERT_EQ(Run({spec, "--json", "--mesh", "dp=2,tp=1,pp=2"}), 0) << err_.str();
  EXPECT_TRUE(absl::StrContains(
      out_.str(),
      "\"pp\":2,\"cp\":1,\"ep\":1,\"zero\":0,\"schedule\":\"interleaved\",\"virtual_stages\":2}"))
      << out_.str();
  ASSERT_EQ(Run({spec}), 0) << err_.str();
  EXPECT_TRUE(absl::StrContains(out_.str(), "dp2 tp1 pp2 z0 i2")) << out_.str();
  EXPECT_TRUE(absl::StrContains(out_.str(), "dp1 tp1 pp4 z0 ")) << out_.str();  // 4 layers, pp 4
  EXPECT_FALSE(absl::StrContains(out_.str(), "pp4 z0 i2")) << out_.str();
}

// Jobs are also planned with context parallelism where the sequence splits, on CPU ranks and
// GPUs alike: the table names cp and adds ring attention's bytes, the JSON has "cp" in every mesh
// and its bytes, and `--mesh` takes cp.
TEST_F(PlanCommand, ContextParallelMeshesOnCpuAndGpu) {
  ASSERT_EQ(Run({SpecWithResources()}), 0) << err_.str();
  EXPECT_TRUE(absl::StrContains(out_.str(), "dp1 cp2 tp1 pp1 z0 ")) << out_.str();
  EXPECT_TRUE(absl::StrContains(out_.str(), " cp bytes")) << out_.str();
  ASSERT_EQ(Run({SpecWithResources(), "--json", "--mesh", "dp=1,tp=1,pp=1,cp=2"}), 0) << err_.str();
  EXPECT_TRUE(absl::StrContains(out_.str(), "\"mesh\":{\"dp\":1,\"tp\":1,\"pp\":1,\"cp\":2,"))
      << out_.str();
  EXPECT_TRUE(absl::StrContains(out_.str(), "\"pp\":0,\"cp\":") &&
              !absl::StrContains(out_.str(), "\"pp\":0,\"cp\":0}"))
      << out_.str();
  EXPECT_TRUE(absl::StrContains(out_.str(), "\"explanation\":\"Chose dp 1 × cp 2 × tp 1 × pp 1"))
      << out_.str();

  const std::string gpu = Write(
      "gpu.yaml", std::string(kSpec) + "resources: {nodes: 1, devices_per_node: 2, kind: gpu}\n");
  ASSERT_EQ(Run({gpu}), 0) << err_.str();
  EXPECT_TRUE(absl::StrContains(out_.str(), "dp1 cp2 tp1 pp1 z0 ")) << out_.str();
  ASSERT_EQ(Run({gpu, "--json", "--mesh", "dp=1,tp=1,pp=1,cp=2"}), 0) << err_.str();
  EXPECT_TRUE(absl::StrContains(out_.str(), "\"mesh\":{\"dp\":1,\"tp\":1,\"pp\":1,\"cp\":2,"))
      << out_.str();
  ExpectBadInput({SpecWithResources(), "--mesh", "dp=1,tp=1,pp=1,cp=3"}, "--mesh: parallelism");
}

TEST_F(PlanCommand, MoeModelsAreSearchedOverExpertParallelism) {
  const std::string spec =
      "name: moe\nmodel:\n  preset: gpt2-debug\n  moe: {experts: 4, top_k: 2}\n"
      "training: {batch: 8, seq_len: 32}\n";
  // The plan searches every mesh, ep included, and shows the all-to-all bytes.
  const std::string mesh =
      Write("mesh.yaml", spec + "resources: {devices_per_node: 2}\nparallelism: {dp: 2}\n");
  ASSERT_EQ(Run({mesh}), 0) << err_.str();
  EXPECT_TRUE(absl::StrContains(out_.str(), "M active per token")) << out_.str();
  EXPECT_TRUE(absl::StrContains(out_.str(), "ep bytes")) << out_.str();
  EXPECT_TRUE(absl::StrContains(out_.str(), "dp2 ep2 tp1 pp1 z0")) << out_.str();
  ASSERT_EQ(Run({mesh, "--json"}), 0) << err_.str();
  EXPECT_TRUE(absl::StrContains(out_.str(), "\"cp\":1,\"ep\":2,")) << out_.str();
  // --mesh names an expert-parallel degree; one that does not divide the experts is refused.
  ASSERT_EQ(Run({mesh, "--mesh", "dp=2,tp=1,pp=1,ep=2"}), 0) << err_.str();
  EXPECT_TRUE(absl::StrContains(out_.str(), "Chose dp 2 (experts over ep 2) × tp 1 × pp 1"))
      << out_.str();
  ExpectBadInput({mesh, "--mesh", "dp=2,tp=1,pp=1,ep=3"}, "--mesh: parallelism.ep");
  // A spec without a mesh is read as `parallelism: auto`, as any other.
  const std::string unnamed = Write("auto.yaml", spec + "resources: {devices_per_node: 2}\n");
  ASSERT_EQ(Run({unnamed}), 0) << err_.str();
  EXPECT_TRUE(absl::StrContains(out_.str(), "ep bytes")) << out_.str();
}

// Planned with a profile measured on another model, an MoE spec's plan says its steps are
// predicted short and how to measure on its own model; measured on it, the note goes.
TEST_F(PlanCommand, MoeSpecsAskForACalibrationOnTheirOwnModel) {
  const std::string spec = Write("moe.yaml",
                                 "name: moe\nmodel:\n  preset: gpt2-debug\n  moe: {experts: 4, "
                                 "top_k: 2}\ntraining: {batch: 8, seq_len: 32}\n"
                                 "resources: {devices_per_node: 2}\nparallelism: {dp: 2}\n");
  draws_ = {1e-3, 1e-3};
  ASSERT_EQ(Run({"--calibrate"}), 0) << err_.str();
  ASSERT_EQ(Run({spec}), 0) << err_.str();
  EXPECT_TRUE(absl::StrContains(out_.str(), "measured on another model (gpt2, 4 layers"))
      << out_.str();
  EXPECT_TRUE(absl::StrContains(out_.str(), "`trainyard plan --calibrate SPEC`")) << out_.str();
  ASSERT_EQ(Run({"--calibrate", "--fresh", spec}), 0) << err_.str();
  EXPECT_TRUE(absl::StrContains(out_.str(), "MoE 4 experts top-2 every 1")) << out_.str();
  ASSERT_EQ(Run({spec}), 0) << err_.str();
  EXPECT_FALSE(absl::StrContains(out_.str(), "measured on another model")) << out_.str();
  // A dense spec never gets the note.
  ASSERT_EQ(Run({SpecWithResources()}), 0) << err_.str();
  EXPECT_FALSE(absl::StrContains(out_.str(), "measured on another model")) << out_.str();
}

TEST_F(PlanCommand, HumanOutputNamesTheChoice) {
  ASSERT_EQ(Run({SpecWithResources()}), 0) << err_.str();
  EXPECT_TRUE(absl::StrContains(out_.str(), "Chose dp ")) << out_.str();
  EXPECT_TRUE(absl::StrContains(out_.str(), "placeholder")) << "uncalibrated cpu profile";
}

TEST(IsPlanCommand, FindsTheCommandWord) {
  EXPECT_TRUE(IsPlanCommand({"plan", "x.yaml"}));
  EXPECT_TRUE(IsPlanCommand({"--json", "plan", "x.yaml"}));
  EXPECT_TRUE(IsPlanCommand({"--server", "host:1", "plan"}));
  EXPECT_FALSE(IsPlanCommand({"submit", "plan"}));
  EXPECT_FALSE(IsPlanCommand({"--server", "plan", "list"}));
}

TEST_F(PlanCommand, TheCliDispatchesIt) {
  CliIo io;
  std::ostringstream out, err;
  io.out = &out;
  io.err = &err;
  io.fs = RealFileSystem();
  EXPECT_EQ(RunCli({"plan", SpecWithResources(), "--device", "h200", "--json"}, io), 0)
      << err.str();
  EXPECT_TRUE(absl::StartsWith(out.str(), "{\"candidates\":")) << out.str();
  EXPECT_EQ(RunCli({"plan", SpecWithResources(), "--device", "tpu"}, io), 2);
}

}  // namespace
}  // namespace trainyard::cli
