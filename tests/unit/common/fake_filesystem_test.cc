#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/filesystem.h"
#include "gtest/gtest.h"

namespace trainyard {
namespace {

TEST(FakeFileSystemTest, RoundTripAndSizes) {
  FakeFileSystem fs;
  ASSERT_TRUE(fs.CreateDirs("/ckpt/step-10").ok());
  ASSERT_TRUE(fs.WriteFileAtomic("/ckpt/step-10/shard-0", "abc").ok());
  EXPECT_EQ(*fs.ReadFile("/ckpt/step-10/shard-0"), "abc");
  EXPECT_EQ(*fs.FileSize("/ckpt/step-10/shard-0"), 3u);
  ASSERT_TRUE(fs.WriteFileAtomic("/ckpt/step-10/shard-0", "abcdef").ok());
  EXPECT_EQ(*fs.FileSize("/ckpt/step-10/shard-0"), 6u);
  EXPECT_TRUE(fs.Exists("/ckpt"));
  EXPECT_TRUE(fs.Exists("/ckpt/step-10/"));
  ASSERT_TRUE(fs.WriteFileAtomic("spec.yaml", "name: x").ok());  // relative, in "."
  EXPECT_EQ(*fs.ReadFile("spec.yaml"), "name: x");
}

TEST(FakeFileSystemTest, MissingPathsAreNotFoundAndNamed) {
  FakeFileSystem fs;
  for (absl::Status s :
       {fs.ReadFile("/a/b").status(), fs.FileSize("/a/b").status(), fs.MapReadOnly("/a/b").status(),
        fs.RemoveFile("/a/b"), fs.ListDir("/a/b").status(), fs.RenameFile("/a/b", "/c"),
        fs.WriteFileAtomic("/a/b", "data")}) {
    EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
    EXPECT_TRUE(absl::StrContains(s.message(), "/a/b")) << s;
  }
  EXPECT_FALSE(fs.Exists("/a/b"));
}

TEST(FakeFileSystemTest, ListDirShowsDirectChildrenSorted) {
  FakeFileSystem fs;
  ASSERT_TRUE(fs.CreateDirs("/r/sub/deeper").ok());
  ASSERT_TRUE(fs.WriteFileAtomic("/r/b", "").ok());
  ASSERT_TRUE(fs.WriteFileAtomic("/r/a", "").ok());
  ASSERT_TRUE(fs.WriteFileAtomic("/r/sub/x", "").ok());
  ASSERT_TRUE(fs.WriteFileAtomic("/rr", "").ok());
  EXPECT_EQ(*fs.ListDir("/r"), (std::vector<std::string>{"a", "b", "sub"}));
  EXPECT_EQ(*fs.ListDir("/r/sub"), (std::vector<std::string>{"deeper", "x"}));
  EXPECT_EQ(*fs.ListDir("/"), (std::vector<std::string>{"r", "rr"}));
  EXPECT_TRUE(fs.ListDir("/r/sub/deeper")->empty());
  EXPECT_EQ(fs.ListDir("/r/a").status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(FakeFileSystemTest, RenameFilesAndDirectories) {
  FakeFileSystem fs;
  ASSERT_TRUE(fs.CreateDirs("/ckpt/tmp-1").ok());
  ASSERT_TRUE(fs.WriteFileAtomic("/ckpt/tmp-1/shard", "s").ok());
  ASSERT_TRUE(fs.WriteFileAtomic("/ckpt/a", "A").ok());
  ASSERT_TRUE(fs.WriteFileAtomic("/ckpt/b", "B").ok());

  ASSERT_TRUE(fs.RenameFile("/ckpt/a", "/ckpt/b").ok());
  EXPECT_EQ(*fs.ReadFile("/ckpt/b"), "A");
  EXPECT_FALSE(fs.Exists("/ckpt/a"));

  ASSERT_TRUE(fs.RenameFile("/ckpt/tmp-1", "/ckpt/step-1").ok());
  EXPECT_EQ(*fs.ReadFile("/ckpt/step-1/shard"), "s");
  EXPECT_FALSE(fs.Exists("/ckpt/tmp-1"));
  EXPECT_FALSE(fs.Exists("/ckpt/tmp-1/shard"));
  EXPECT_FALSE(fs.RenameFile("/ckpt/step-1", "/ckpt/step-1/inside").ok());
  EXPECT_FALSE(fs.RenameFile("/ckpt/b", "/nowhere/b").ok());
}

TEST(FakeFileSystemTest, FilesAndDirectoriesDoNotMix) {
  FakeFileSystem fs;
  ASSERT_TRUE(fs.CreateDirs("/d").ok());
  ASSERT_TRUE(fs.WriteFileAtomic("/f", "x").ok());
  EXPECT_FALSE(fs.WriteFileAtomic("/d", "x").ok());
  EXPECT_FALSE(fs.ReadFile("/d").ok());
  EXPECT_FALSE(fs.RemoveFile("/d").ok());
  EXPECT_FALSE(fs.CreateDirs("/f/g").ok());
  EXPECT_FALSE(fs.WriteFileAtomic("/f/g", "x").ok());
  EXPECT_FALSE(fs.CreateDirs("").ok());
}

TEST(FakeFileSystemTest, MappedRegionIsASnapshot) {
  FakeFileSystem fs;
  ASSERT_TRUE(fs.WriteFileAtomic("data.bin", "0123").ok());
  auto region = fs.MapReadOnly("data.bin");
  ASSERT_TRUE(region.ok());
  ASSERT_TRUE(fs.WriteFileAtomic("data.bin", "zz").ok());
  ASSERT_TRUE(fs.RemoveFile("data.bin").ok());
  ASSERT_EQ((*region)->size(), 4u);
  EXPECT_EQ((*region)->data()[3], '3');
}

TEST(FakeFileSystemTest, ConcurrentWritersAllLand) {
  FakeFileSystem fs;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&fs, t] {
      for (int i = 0; i < 100; ++i) {
        ASSERT_TRUE(fs.WriteFileAtomic(absl::StrCat("f", t, "_", i), "x").ok());
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(fs.ListDir(".")->size(), 400u);
}

TEST(FakeFileSystemTest, WriterFollowsItsFileThroughRenameAndReplacement) {
  FakeFileSystem fs;
  absl::StatusOr<std::unique_ptr<WritableFile>> file = fs.NewWritableFile("tmp");
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_TRUE((*file)->Append("before ").ok());
  ASSERT_TRUE(fs.RenameFile("tmp", "final").ok());
  ASSERT_TRUE((*file)->Append("after").ok());
  EXPECT_EQ(*fs.ReadFile("final"), "before after");
  EXPECT_FALSE(fs.Exists("tmp"));

  // Replaced by WriteFileAtomic: the writer's bytes go to the old, now nameless, file.
  ASSERT_TRUE(fs.WriteFileAtomic("final", "replacement").ok());
  ASSERT_TRUE((*file)->Append(" lost").ok());
  ASSERT_TRUE((*file)->Close().ok());
  EXPECT_EQ(*fs.ReadFile("final"), "replacement");
}

TEST(FakeFileSystemTest, RootsCannotBeRemoved) {
  FakeFileSystem fs;
  for (const char* root : {"/", ".", ""}) {
    EXPECT_EQ(fs.RemoveDir(root).code(), absl::StatusCode::kFailedPrecondition) << root;
    EXPECT_TRUE(fs.IsDirectory(root)) << root;
    EXPECT_TRUE(fs.SyncDir(root).ok()) << root;
  }
}

}  // namespace
}  // namespace trainyard
