#include <stdlib.h>

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "common/filesystem.h"
#include "gtest/gtest.h"
#include "worker/coordinated.h"

namespace trainyard::worker {
namespace {

absl::StatusOr<CoordinatedOptions> Parse(std::vector<std::string> args) {
  args.insert(args.begin(), "trainyard-worker");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  return ParseCoordinatedFlags(static_cast<int>(argv.size()), argv.data());
}

TEST(CoordinatedFlagsTest, TheAgentsCommandLine) {
  absl::StatusOr<CoordinatedOptions> options = Parse(
      {"--coordinator", "127.0.0.1:7000", "--job", "j-000001", "--attempt", "3", "--rank", "0"});
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->coordinator, "127.0.0.1:7000");
  EXPECT_EQ(options->job_id, "j-000001");
  EXPECT_EQ(options->attempt_id, 3);
  EXPECT_EQ(options->rank, 0);
  EXPECT_EQ(options->threads, -1);
  EXPECT_EQ(options->join_timeout, absl::Minutes(5));

  options = Parse({"--coordinator", "h:1", "--job", "j", "--attempt", "1", "--rank", "5",
                   "--threads", "2", "--join-timeout-s", "30", "--collective-timeout-s", "9"});
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->threads, 2);
  EXPECT_EQ(options->join_timeout, absl::Seconds(30));
  EXPECT_EQ(options->collective_timeout, absl::Seconds(9));
}

TEST(CoordinatedFlagsTest, BadCommandLines) {
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {"--coordinator", "h:1", "--job", "j", "--attempt", "1"},
           {"--coordinator", "h:1", "--job", "j", "--attempt", "0", "--rank", "0"},
           {"--coordinator", "h:1", "--job", "j", "--attempt", "1", "--rank", "-1"},
           {"--coordinator", "h:1", "--job", "j", "--attempt", "x", "--rank", "0"},
           {"--coordinator", "h:1", "--job", "j", "--attempt", "1", "--rank", "0", "--bogus"},
           {"--coordinator"}}) {
    absl::StatusOr<CoordinatedOptions> options = Parse(args);
    EXPECT_EQ(options.status().code(), absl::StatusCode::kInvalidArgument) << args.size();
    EXPECT_TRUE(absl::StrContains(options.status().message(), "usage:")) << options.status();
  }
}

TEST(CoordinatedFlagsTest, DetectsTheMode) {
  std::string a0 = "w", a1 = "--coordinator", a2 = "--standalone";
  char* coordinated[] = {a0.data(), a1.data()};
  char* standalone[] = {a0.data(), a2.data()};
  EXPECT_TRUE(IsCoordinatedInvocation(2, coordinated));
  EXPECT_FALSE(IsCoordinatedInvocation(2, standalone));
}

TEST(RecordExitStatusTest, WritesTheFileNamedByTheEnvironment) {
  const std::string path = ::testing::TempDir() + "/trainyard_exit_status_test";
  setenv("TRAINYARD_EXIT_STATUS_FILE", path.c_str(), 1);
  RecordExitStatus(3);
  unsetenv("TRAINYARD_EXIT_STATUS_FILE");
  absl::StatusOr<std::string> text = RealFileSystem()->ReadFile(path);
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text, "3\n");
  ASSERT_TRUE(RealFileSystem()->RemoveFile(path).ok());
  RecordExitStatus(0);  // unset: nothing written
  EXPECT_FALSE(RealFileSystem()->Exists(path));
}

}  // namespace
}  // namespace trainyard::worker
