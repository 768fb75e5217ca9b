#include "server/agent/log_files.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/unit/server/agent/agent_test_util.h"

namespace trainyard::server::agent {
namespace {

using ::trainyard::server::agent::testing::TempDir;
using ::trainyard::server::agent::testing::WriteFile;
using Lines = std::vector<std::string>;

TEST(LogFilesTest, LastLinesWithAndWithoutFinalNewline) {
  TempDir dir;
  const std::string path = dir.path() + "/a.log";
  WriteFile(path, "one\ntwo\nthree\n");
  EXPECT_EQ(*LastLines(path, 2), (Lines{"two", "three"}));
  EXPECT_EQ(*LastLines(path, 10), (Lines{"one", "two", "three"}));
  EXPECT_EQ(*LastLines(path, 0), Lines{});
  WriteFile(path, "one\ntwo\npartial");
  EXPECT_EQ(*LastLines(path, 2), (Lines{"two", "partial"}));
  WriteFile(path, "");
  EXPECT_EQ(*LastLines(path, 5), Lines{});
}

TEST(LogFilesTest, LastLinesOfALongFileDropTheCutLine) {
  TempDir dir;
  const std::string path = dir.path() + "/long.log";
  std::string text;
  for (int i = 0; i < 20000; ++i) absl::StrAppend(&text, "line ", i, " of a long log\n");
  WriteFile(path, text);
  absl::StatusOr<Lines> all = LastLines(path, 1000000);
  ASSERT_TRUE(all.ok());
  ASSERT_FALSE(all->empty());
  EXPECT_EQ(all->back(), "line 19999 of a long log");
  EXPECT_TRUE(all->front().rfind("line ", 0) == 0) << all->front();  // no cut-off piece
  EXPECT_EQ(*LastLines(path, 1), Lines{"line 19999 of a long log"});
}

TEST(LogFilesTest, MissingFileIsNotFound) {
  TempDir dir;
  EXPECT_TRUE(absl::IsNotFound(LastLines(dir.path() + "/none", 3).status()));
  EXPECT_TRUE(absl::IsNotFound(ReadRange(dir.path() + "/none", 0, 10).status()));
  EXPECT_TRUE(absl::IsNotFound(OffsetOfLastLines(dir.path() + "/none", 3).status()));
}

TEST(LogFilesTest, OffsetsAndRanges) {
  TempDir dir;
  const std::string path = dir.path() + "/r.log";
  WriteFile(path, "ab\ncd\nef\n");
  EXPECT_EQ(*OffsetOfLastLines(path, 1), 6);
  EXPECT_EQ(*OffsetOfLastLines(path, 2), 3);
  EXPECT_EQ(*OffsetOfLastLines(path, 9), 0);
  EXPECT_EQ(*ReadRange(path, 3, 100), "cd\nef\n");
  EXPECT_EQ(*ReadRange(path, 3, 2), "cd");
  EXPECT_EQ(*ReadRange(path, 9, 10), "");
  EXPECT_EQ(*ReadRange(path, 50, 10), "");
}

}  // namespace
}  // namespace trainyard::server::agent
