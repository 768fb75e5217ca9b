// `trainyard plan` in process: bad input is one line on stderr and exit code 2; the JSON object
// has the documented shape; `plan` is dispatched from the CLI's entry point.
#include "tools/cli/plan_command.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "common/filesystem.h"
#include "gtest/gtest.h"
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

  int Run(std::vector<std::string> args) {
    out_.str("");
    err_.str("");
    PlanIo io;
    io.out = &out_;
    io.err = &err_;
    io.fs = RealFileSystem();
    io.cpu_profile_path = (dir_ / "trainyard" / "cpu-profile.json").string();
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
  ExpectBadInput({SpecWithResources(), "--frobnicate"}, "unknown flag --frobnicate");
  ExpectBadInput({}, "plan needs a SPEC");
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
  EXPECT_TRUE(absl::StrContains(out_.str(), "\"mesh\":{\"dp\":2,\"tp\":1,\"pp\":1,\"zero\":1}"));
  EXPECT_TRUE(absl::StrContains(out_.str(), "\"young_daly\":null"));
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
