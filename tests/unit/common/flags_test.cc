#include "common/flags.h"

#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

ABSL_FLAG(std::string, out, "", "a directory");
ABSL_FLAG(int, threads, 0, "threads");
ABSL_FLAG(double, seconds, 1.5, "seconds");
ABSL_FLAG(bool, gpus, true, "offer GPUs");
ABSL_FLAG(trainyard::FlagList, pass_env, {}, "repeatable");

namespace trainyard {
namespace {

using testing::ElementsAre;
using testing::HasSubstr;
using testing::IsEmpty;

constexpr std::string_view kAll[] = {"out", "threads", "seconds", "gpus", "pass-env"};

absl::StatusOr<CommandLine> Parse(std::vector<std::string> args,
                                  absl::Span<const std::string_view> accepted = kAll) {
  return ParseCommandLine(args, accepted, "export");
}

TEST(FlagsTest, TakesBothValueFormsAndKeepsPositionalsInOrder) {
  absl::StatusOr<CommandLine> line =
      Parse({"ckpt", "--out=dir/a", "--threads", "3", "extra", "--seconds=0.25"});
  ASSERT_TRUE(line.ok()) << line.status();
  EXPECT_THAT(line->positionals, ElementsAre("ckpt", "extra"));
  EXPECT_EQ(absl::GetFlag(FLAGS_out), "dir/a");
  EXPECT_EQ(absl::GetFlag(FLAGS_threads), 3);
  EXPECT_EQ(absl::GetFlag(FLAGS_seconds), 0.25);
  EXPECT_TRUE(line->Has("out"));
  EXPECT_FALSE(line->Has("gpus"));
  EXPECT_FALSE(line->help);
}

TEST(FlagsTest, EachParseStartsFromTheDefaults) {
  ASSERT_TRUE(Parse({"--threads", "7", "--nogpus", "--pass-env", "A"}).ok());
  absl::StatusOr<CommandLine> line = Parse({});
  ASSERT_TRUE(line.ok()) << line.status();
  EXPECT_EQ(absl::GetFlag(FLAGS_threads), 0);
  EXPECT_TRUE(absl::GetFlag(FLAGS_gpus));
  EXPECT_THAT(absl::GetFlag(FLAGS_pass_env).values, IsEmpty());
  EXPECT_THAT(line->given, IsEmpty());
}

TEST(FlagsTest, BooleansTakeNoValueUnlessWrittenWithEquals) {
  ASSERT_TRUE(Parse({"--nogpus", "ckpt"}).ok());
  EXPECT_FALSE(absl::GetFlag(FLAGS_gpus));
  ASSERT_TRUE(Parse({"--no-gpus"}).ok());
  EXPECT_FALSE(absl::GetFlag(FLAGS_gpus));
  absl::StatusOr<CommandLine> line = Parse({"--gpus", "ckpt"});
  ASSERT_TRUE(line.ok());
  EXPECT_TRUE(absl::GetFlag(FLAGS_gpus));
  EXPECT_THAT(line->positionals, ElementsAre("ckpt"));  // not the boolean's value
  ASSERT_TRUE(Parse({"--gpus=false"}).ok());
  EXPECT_FALSE(absl::GetFlag(FLAGS_gpus));
  EXPECT_FALSE(Parse({"--gpus=maybe"}).ok());
}

TEST(FlagsTest, AListRepeatsAndOtherFlagsTakeTheLastValue) {
  ASSERT_TRUE(Parse({"--pass-env", "HF_*", "--pass_env=WANDB_KEY"}).ok());
  EXPECT_THAT(absl::GetFlag(FLAGS_pass_env).values, ElementsAre("HF_*", "WANDB_KEY"));
  EXPECT_TRUE(Parse({"--pass-env", "A"})->Has("pass-env"));
  absl::StatusOr<CommandLine> twice = Parse({"--threads", "1", "--threads=2"});
  ASSERT_TRUE(twice.ok()) << twice.status();
  EXPECT_EQ(absl::GetFlag(FLAGS_threads), 2);  // the last one, as Abseil's own parser
  EXPECT_THAT(twice->values.at("threads"), ElementsAre("1", "2"));
  EXPECT_FALSE(Parse({"--pass-env="}).ok());  // an empty entry
}

TEST(FlagsTest, RefusesWhatTheCommandDoesNotTakeOrTheTypeDoesNotParse) {
  constexpr std::string_view kOnlyOut[] = {"out"};
  absl::StatusOr<CommandLine> unknown = Parse({"--threads", "2"}, kOnlyOut);
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(unknown.status().message(), "unknown flag '--threads' for export");
  EXPECT_EQ(Parse({"--undefined"}).status().message(), "unknown flag '--undefined' for export");
  absl::StatusOr<CommandLine> missing = Parse({"ckpt", "--out"});
  EXPECT_EQ(missing.status().message(), "--out needs a value");
  absl::StatusOr<CommandLine> bad = Parse({"--threads=two"});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("--threads: "));
  EXPECT_FALSE(Parse({"--nothreads"}).ok());  // "no" negates booleans only
}

TEST(FlagsTest, HelpAndTheEndOfFlags) {
  absl::StatusOr<CommandLine> line = Parse({"-h", "--", "--out", "x"});
  ASSERT_TRUE(line.ok()) << line.status();
  EXPECT_TRUE(line->help);
  EXPECT_THAT(line->positionals, ElementsAre("--out", "x"));
  EXPECT_EQ(absl::GetFlag(FLAGS_out), "");
  EXPECT_TRUE(Parse({"--help"})->help);
}

TEST(FlagsTest, ACommandWithoutPositionalsRefusesTheFirst) {
  EXPECT_TRUE(RefusePositionals(*Parse({"--threads", "2"})).ok());
  EXPECT_EQ(RefusePositionals(*Parse({"ckpt", "more"}), "calibrate").message(),
            "unexpected argument 'ckpt' for calibrate");
}

TEST(FlagsTest, AFlagTheBinaryNeverDefinedIsAnError) {
  constexpr std::string_view kMissing[] = {"not-defined-anywhere"};
  EXPECT_EQ(Parse({}, kMissing).status().code(), absl::StatusCode::kInternal);
}

}  // namespace
}  // namespace trainyard
