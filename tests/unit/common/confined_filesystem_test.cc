// NewConfinedFileSystem: paths outside the roots, and symbolic links inside them that lead out
// (to a file, to a directory, swapped in after a check), are refused for every kind of access,
// with openat2 and with the component-by-component walk.
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "common/filesystem.h"
#include "gtest/gtest.h"

namespace trainyard {
namespace {

namespace fs = std::filesystem;

class AuthConfinedFileSystemTest : public testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    std::string pattern = testing::TempDir() + "/trainyard_confined_XXXXXX";
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    base_ = pattern;
    root_ = base_ + "/root";
    outside_ = base_ + "/outside";
    fs::create_directories(root_ + "/d");
    fs::create_directories(outside_);
    std::ofstream(root_ + "/a") << "inside";
    std::ofstream(outside_ + "/secret") << "secret";
    confined_ = NewConfinedFileSystem({root_}, /*use_openat2=*/GetParam());
  }
  void TearDown() override { fs::remove_all(base_); }

  static void ExpectDenied(const absl::Status& status) {
    EXPECT_EQ(status.code(), absl::StatusCode::kPermissionDenied) << status;
    EXPECT_TRUE(absl::StrContains(status.message(), "outside the allowed directories")) << status;
  }

  std::string base_, root_, outside_;
  std::unique_ptr<FileSystem> confined_;
};

TEST_P(AuthConfinedFileSystemTest, ReadsInsideTheRoot) {
  absl::StatusOr<std::string> text = confined_->ReadFile(root_ + "/a");
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text, "inside");
  EXPECT_TRUE(confined_->Exists(root_ + "/d"));
  EXPECT_TRUE(confined_->IsDirectory(root_));
}

TEST_P(AuthConfinedFileSystemTest, RefusesPathsOutsideTheRoots) {
  ExpectDenied(confined_->ReadFile(outside_ + "/secret").status());
  ExpectDenied(confined_->ReadFile(root_ + "/../outside/secret").status());
  ExpectDenied(confined_->MapReadOnly(outside_ + "/secret").status());
  ExpectDenied(confined_->NewWritableFile(outside_ + "/new").status());
  EXPECT_FALSE(confined_->Exists(outside_ + "/secret"));
  EXPECT_FALSE(fs::exists(outside_ + "/new"));
}

TEST_P(AuthConfinedFileSystemTest, RefusesALinkToAFileOutside) {
  fs::create_symlink(outside_ + "/secret", root_ + "/link");
  ExpectDenied(confined_->ReadFile(root_ + "/link").status());
  ExpectDenied(confined_->MapReadOnly(root_ + "/link").status());
  ExpectDenied(confined_->FileSize(root_ + "/link").status());
  ExpectDenied(confined_->NewWritableFile(root_ + "/link").status());
  EXPECT_FALSE(confined_->Exists(root_ + "/link"));
  std::ifstream secret(outside_ + "/secret");
  std::string text;
  secret >> text;
  EXPECT_EQ(text, "secret") << "writing through the link truncated the target";
}

TEST_P(AuthConfinedFileSystemTest, RefusesALinkToADirectoryOutside) {
  fs::create_directory_symlink(outside_, root_ + "/data");
  ExpectDenied(confined_->ReadFile(root_ + "/data/secret").status());
  ExpectDenied(confined_->ListDir(root_ + "/data").status());
  ExpectDenied(confined_->CreateDirs(root_ + "/data/ckpt/step-1"));
  ExpectDenied(confined_->NewWritableFile(root_ + "/data/new").status());
  ExpectDenied(confined_->WriteFileAtomic(root_ + "/data/manifest", "x"));
  ExpectDenied(confined_->RenameFile(root_ + "/a", root_ + "/data/a"));
  EXPECT_FALSE(fs::exists(outside_ + "/ckpt"));
  EXPECT_FALSE(fs::exists(outside_ + "/new"));
  EXPECT_FALSE(fs::exists(outside_ + "/a"));
  EXPECT_TRUE(fs::exists(root_ + "/a"));
}

TEST_P(AuthConfinedFileSystemTest, ALinkSwappedInAfterACheckIsNotFollowed) {
  std::ofstream(root_ + "/shard.bin") << "tokens";
  ASSERT_TRUE(confined_->Exists(root_ + "/shard.bin"));  // what a validation would see
  fs::remove(root_ + "/shard.bin");
  fs::create_symlink(outside_ + "/secret", root_ + "/shard.bin");
  ExpectDenied(confined_->ReadFile(root_ + "/shard.bin").status());
  ExpectDenied(confined_->MapReadOnly(root_ + "/shard.bin").status());
}

TEST_P(AuthConfinedFileSystemTest, TheRootMayBeALinkButIsNeverRemoved) {
  const std::string alias = base_ + "/alias";
  fs::create_directory_symlink(root_, alias);
  std::unique_ptr<FileSystem> through_link = NewConfinedFileSystem({alias}, GetParam());
  absl::StatusOr<std::string> text = through_link->ReadFile(alias + "/a");
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text, "inside");
  ExpectDenied(confined_->RemoveDir(root_));
  EXPECT_TRUE(confined_->CreateDirs(root_).ok());  // the root and its parents exist already
}

TEST_P(AuthConfinedFileSystemTest, LinksThatStayInsideAreFollowedOnlyWithOpenat2) {
  fs::create_symlink("a", root_ + "/alias");
  absl::StatusOr<std::string> text = confined_->ReadFile(root_ + "/alias");
  if (GetParam()) {
    ASSERT_TRUE(text.ok()) << text.status();
    EXPECT_EQ(*text, "inside");
  } else {
    ExpectDenied(text.status());  // the walk refuses every link below the root
  }
}

INSTANTIATE_TEST_SUITE_P(BothResolvers, AuthConfinedFileSystemTest, testing::Bool(),
                         [](const testing::TestParamInfo<bool>& info) {
                           return info.param ? std::string("Openat2") : std::string("Walk");
                         });

}  // namespace
}  // namespace trainyard
