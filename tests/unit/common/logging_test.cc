#include "common/logging.h"

#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"

namespace trainyard {
namespace {

class LoggingTest : public testing::Test {
 protected:
  void TearDown() override {
    SetMinLogLevel(LogLevel::kInfo);
    SetLogContext("", -1);
  }
};

std::string Captured() { return testing::internal::GetCapturedStderr(); }

TEST_F(LoggingTest, WritesOneLineWithLevelContextAndLocation) {
  SetLogContext("tiny", 0);
  testing::internal::CaptureStderr();
  TY_LOG(WARNING) << "loss " << 3.5;
  std::string out = Captured();
  ASSERT_FALSE(out.empty());
  EXPECT_EQ(out.back(), '\n');
  EXPECT_EQ(out.find('\n'), out.size() - 1) << out;
  EXPECT_EQ(out[0], 'W');
  EXPECT_TRUE(absl::StrContains(out, "Z ")) << out;  // UTC timestamp
  EXPECT_TRUE(absl::StrContains(out, "[job=tiny rank=0] logging_test.cc:")) << out;
  EXPECT_TRUE(absl::EndsWith(out, "] loss 3.5\n")) << out;
}

TEST_F(LoggingTest, ContextPartsCanBeLeftOut) {
  SetLogContext("server", -1);
  testing::internal::CaptureStderr();
  TY_LOG(INFO) << "a";
  std::string out = Captured();
  EXPECT_TRUE(absl::StrContains(out, "[job=server] ")) << out;
  SetLogContext("", -1);
  testing::internal::CaptureStderr();
  TY_LOG(INFO) << "b";
  out = Captured();
  EXPECT_FALSE(absl::StrContains(out, "[")) << out;
}

TEST_F(LoggingTest, MessagesBelowMinimumAreDroppedAndNotEvaluated) {
  int evaluations = 0;
  auto count = [&evaluations] { return ++evaluations; };
  testing::internal::CaptureStderr();
  TY_LOG(DEBUG) << "hidden " << count();
  SetMinLogLevel(LogLevel::kError);
  TY_LOG(WARNING) << "hidden too " << count();
  TY_LOG(ERROR) << "shown " << count();
  std::string out = Captured();
  EXPECT_EQ(evaluations, 1);
  EXPECT_FALSE(absl::StrContains(out, "hidden")) << out;
  EXPECT_TRUE(absl::StrContains(out, "shown 1")) << out;
  SetMinLogLevel(LogLevel::kDebug);
  testing::internal::CaptureStderr();
  TY_LOG(DEBUG) << "now visible";
  out = Captured();
  EXPECT_EQ(out[0], 'D');
}

TEST_F(LoggingTest, EmbeddedNewlinesStayOnOneLine) {
  testing::internal::CaptureStderr();
  TY_LOG(INFO) << "first\nsecond\n";
  std::string out = Captured();
  EXPECT_TRUE(absl::EndsWith(out, "first\\nsecond\n")) << out;
}

TEST_F(LoggingTest, ParseLogLevel) {
  EXPECT_EQ(*ParseLogLevel("debug"), LogLevel::kDebug);
  EXPECT_EQ(*ParseLogLevel("WARNING"), LogLevel::kWarning);
  EXPECT_EQ(ParseLogLevel("loud").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(LoggingTest, CheckPassesSilentlyAndAbortsOnFailure) {
  testing::internal::CaptureStderr();
  int calls = 0;
  TY_CHECK(++calls == 1) << "never printed";
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(Captured(), "");
  testing::FLAGS_gtest_death_test_style = "threadsafe";
  EXPECT_DEATH({ TY_CHECK(calls == 2) << "calls is " << calls; },
               "Check failed: calls == 2 calls is 1");
}

}  // namespace
}  // namespace trainyard
