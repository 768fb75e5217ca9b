// Lexical confinement of spec paths to allowed roots.
#include "config/path_confinement.h"

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace trainyard::config {
namespace {

TEST(NormalizePathTest, ResolvesRelativePathsAndDotDot) {
  EXPECT_EQ(NormalizePath("a/b/../c", "/srv"), "/srv/a/c");
  EXPECT_EQ(NormalizePath("/x/./y/", "/srv"), "/x/y");
  EXPECT_EQ(NormalizePath("../../..", "/srv/dir"), "/");
  EXPECT_EQ(NormalizePath("/", "/srv"), "/");
  EXPECT_EQ(NormalizePath("/a//b", "/"), "/a/b");
}

TEST(FindConfinementProblemTest, NoRootsConfinesNothing) {
  EXPECT_FALSE(FindConfinementProblem("/etc/passwd", {}, "/"));
}

TEST(FindConfinementProblemTest, ComparesWholeComponents) {
  const std::vector<std::string> roots = {"/data"};
  EXPECT_FALSE(FindConfinementProblem("/data", roots, "/"));
  EXPECT_FALSE(FindConfinementProblem("/data/", roots, "/"));
  EXPECT_FALSE(FindConfinementProblem("/data/x/y.bin", roots, "/"));
  EXPECT_TRUE(FindConfinementProblem("/database/x.bin", roots, "/"));
  EXPECT_TRUE(FindConfinementProblem("/dat", roots, "/"));
  EXPECT_TRUE(FindConfinementProblem("/", roots, "/"));
}

TEST(FindConfinementProblemTest, RelativePathsAndRootsUseTheWorkingDirectory) {
  EXPECT_FALSE(FindConfinementProblem("shards/a.bin", {"/jobs"}, "/jobs"));
  EXPECT_FALSE(FindConfinementProblem("shards/a.bin", {"."}, "/jobs"));
  EXPECT_FALSE(FindConfinementProblem("/jobs/corpus/a.bin", {"corpus"}, "/jobs"));
  std::optional<std::string> why = FindConfinementProblem("../a.bin", {"."}, "/jobs");
  ASSERT_TRUE(why);
  EXPECT_EQ(*why, "'../a.bin' ('/a.bin') is outside the allowed directories: /jobs");
}

TEST(FindConfinementProblemTest, DotDotCannotEscape) {
  const std::vector<std::string> roots = {"/data"};
  EXPECT_TRUE(FindConfinementProblem("/data/../etc/passwd", roots, "/"));
  EXPECT_TRUE(FindConfinementProblem("/data/a/../../etc", roots, "/"));
  EXPECT_FALSE(FindConfinementProblem("/data/a/../b", roots, "/"));
  EXPECT_FALSE(FindConfinementProblem("/etc/../data/b", roots, "/"));
}

TEST(FindConfinementProblemTest, GlobsThatCouldMatchDotDotAreRefused) {
  const std::vector<std::string> roots = {"/data"};
  EXPECT_FALSE(FindConfinementProblem("/data/train_*.bin", roots, "/"));
  EXPECT_FALSE(FindConfinementProblem("/data/*/x.bin", roots, "/"));  // '*' never matches "."
  for (const char* pattern : {"/data/.*/etc/passwd", "/data/.?/x", "/data/..*/x", "/data/.[.]/x"}) {
    std::optional<std::string> why = FindConfinementProblem(pattern, roots, "/");
    ASSERT_TRUE(why) << pattern;
    EXPECT_TRUE(absl::StrContains(*why, "may not contain glob characters")) << *why;
  }
}

}  // namespace
}  // namespace trainyard::config
