// Confinement of spec paths to allowed roots: lexical, then with symbolic links resolved.
#include "config/path_confinement.h"

#include <stdlib.h>

#include <filesystem>
#include <fstream>
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

// A scratch tree: root/ (allowed) with a file and a directory, outside/ with a secret.
class AuthSymlinkConfinementTest : public testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = testing::TempDir() + "/trainyard_confinement_XXXXXX";
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    base_ = pattern;
    root_ = base_ + "/root";
    outside_ = base_ + "/outside";
    std::filesystem::create_directories(root_ + "/shards");
    std::filesystem::create_directories(outside_);
    std::ofstream(root_ + "/shards/train_000.bin") << "x";
    std::ofstream(outside_ + "/secret") << "x";
  }
  void TearDown() override { std::filesystem::remove_all(base_); }

  void ExpectRefused(const std::string& path) {
    std::optional<std::string> why = FindConfinementProblem(path, {root_}, "/");
    ASSERT_TRUE(why) << path << " was allowed";
    EXPECT_TRUE(absl::StrContains(*why, "symbolic link")) << *why;
  }

  std::string base_, root_, outside_;
};

TEST_F(AuthSymlinkConfinementTest, ALinkedFileLeadingOutIsRefused) {
  std::filesystem::create_symlink(outside_ + "/secret", root_ + "/train.bin");
  ExpectRefused(root_ + "/train.bin");
}

TEST_F(AuthSymlinkConfinementTest, ALinkedDirectoryLeadingOutIsRefused) {
  std::filesystem::create_directory_symlink(outside_, root_ + "/data");
  ExpectRefused(root_ + "/data/secret");
  ExpectRefused(root_ + "/data/ckpt");   // a checkpoint directory not created yet
  ExpectRefused(root_ + "/data/*.bin");  // a pattern whose directory leads out
}

TEST_F(AuthSymlinkConfinementTest, AGlobMatchLeadingOutIsRefused) {
  std::filesystem::create_symlink(outside_ + "/secret", root_ + "/shards/train_001.bin");
  ExpectRefused(root_ + "/shards/train_*.bin");
  EXPECT_FALSE(FindConfinementProblem(root_ + "/shards/train_000.bin", {root_}, "/"));
}

TEST_F(AuthSymlinkConfinementTest, LinksThatStayInsideAndLinkedRootsAreAllowed) {
  std::filesystem::create_symlink("train_000.bin", root_ + "/shards/latest.bin");
  EXPECT_FALSE(FindConfinementProblem(root_ + "/shards/latest.bin", {root_}, "/"));
  const std::string alias = base_ + "/alias";
  std::filesystem::create_directory_symlink(root_, alias);
  EXPECT_FALSE(FindConfinementProblem(alias + "/shards/train_*.bin", {alias}, "/"));
  EXPECT_FALSE(FindConfinementProblem(root_ + "/not-yet/ckpt", {root_}, "/"));
}

}  // namespace
}  // namespace trainyard::config
