// The FileSystem contract for writable files, reads at any offset, directory sync,
// directory removal and RemoveRecursively, checked against every implementation: POSIX (in a
// private temporary directory), the confined POSIX filesystem rooted there (with openat2, and
// walking components), FakeFileSystem and FaultInjectionFileSystem.
#include <stdlib.h>

#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "common/fault_injection_filesystem.h"
#include "common/filesystem.h"
#include "gtest/gtest.h"

namespace trainyard {
namespace {

enum class Kind { kPosix, kConfined, kConfinedWalk, kFake, kFaultInjection };

std::string KindName(const testing::TestParamInfo<Kind>& info) {
  switch (info.param) {
    case Kind::kPosix:
      return "Posix";
    case Kind::kConfined:
      return "Confined";
    case Kind::kConfinedWalk:
      return "ConfinedWalk";
    case Kind::kFake:
      return "Fake";
    case Kind::kFaultInjection:
      return "FaultInjection";
  }
  return "Unknown";
}

class FileSystemContractTest : public testing::TestWithParam<Kind> {
 protected:
  void SetUp() override {
    switch (GetParam()) {
      case Kind::kPosix: {
        std::string pattern = testing::TempDir() + "/trainyard_fs_contract_XXXXXX";
        ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
        root_ = pattern;
        fs_ = RealFileSystem();
        break;
      }
      case Kind::kConfined:
      case Kind::kConfinedWalk: {
        std::string pattern = testing::TempDir() + "/trainyard_fs_contract_XXXXXX";
        ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
        root_ = pattern;
        owned_ = NewConfinedFileSystem({root_}, GetParam() == Kind::kConfined);
        fs_ = owned_.get();
        break;
      }
      case Kind::kFake:
        root_ = "/work";
        owned_ = std::make_unique<FakeFileSystem>();
        ASSERT_TRUE(owned_->CreateDirs(root_).ok());
        fs_ = owned_.get();
        break;
      case Kind::kFaultInjection:
        root_ = "/work";
        owned_ = std::make_unique<FaultInjectionFileSystem>(std::vector<std::string>{root_});
        fs_ = owned_.get();
        break;
    }
  }
  void TearDown() override {
    const bool posix = GetParam() == Kind::kPosix || GetParam() == Kind::kConfined ||
                       GetParam() == Kind::kConfinedWalk;
    if (posix && !root_.empty()) std::filesystem::remove_all(root_);
  }

  std::string Path(const std::string& name) const { return root_ + "/" + name; }

  absl::Status WriteWithWriter(const std::string& path, const std::string& data) {
    absl::StatusOr<std::unique_ptr<WritableFile>> file = fs_->NewWritableFile(path);
    if (!file.ok()) return file.status();
    if (absl::Status s = (*file)->Append(data); !s.ok()) return s;
    return (*file)->Close();
  }

  std::unique_ptr<FileSystem> owned_;
  FileSystem* fs_ = nullptr;
  std::string root_;
};

TEST_P(FileSystemContractTest, WritableFileKeepsEveryAppendedByte) {
  const std::string path = Path("shard-0");
  absl::StatusOr<std::unique_ptr<WritableFile>> file = fs_->NewWritableFile(path);
  ASSERT_TRUE(file.ok()) << file.status();
  std::string big(3 << 20, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 131 % 251);
  ASSERT_TRUE((*file)->Append("header:").ok());
  ASSERT_TRUE((*file)->Append(big).ok());
  ASSERT_TRUE((*file)->Append("").ok());
  ASSERT_TRUE((*file)->Sync().ok());
  ASSERT_TRUE((*file)->Append(std::string("\0tail", 5)).ok());
  ASSERT_TRUE((*file)->Close().ok());
  absl::StatusOr<std::string> back = fs_->ReadFile(path);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(*back == "header:" + big + std::string("\0tail", 5));
  EXPECT_EQ(*fs_->FileSize(path), 7 + big.size() + 5);
}

TEST_P(FileSystemContractTest, RandomAccessReadsAnyRangeAndRefusesOnePastTheEnd) {
  std::string data(3 * 4096 + 17, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 131 % 251);
  ASSERT_TRUE(WriteWithWriter(Path("shard"), data).ok());
  absl::StatusOr<std::unique_ptr<RandomAccessFile>> file = fs_->OpenRandomAccess(Path("shard"));
  ASSERT_TRUE(file.ok()) << file.status();
  for (const auto& [offset, length] : std::vector<std::pair<size_t, size_t>>{
           {0, data.size()}, {4095, 4098}, {data.size() - 1, 1}, {77, 0}}) {
    std::string out(length, 'x');
    ASSERT_TRUE((*file)->ReadAt(offset, length, out.data()).ok()) << offset << "+" << length;
    EXPECT_EQ(out, data.substr(offset, length)) << offset << "+" << length;
  }
  std::string out(32, 'x');
  const absl::Status past = (*file)->ReadAt(data.size() - 16, 32, out.data());
  EXPECT_EQ(past.code(), absl::StatusCode::kDataLoss) << past;
  EXPECT_TRUE(absl::StrContains(past.message(), Path("shard"))) << past;
  EXPECT_EQ(fs_->OpenRandomAccess(Path("missing")).status().code(), absl::StatusCode::kNotFound);
}

TEST_P(FileSystemContractTest, NewWritableFileTruncatesAnExistingFile) {
  const std::string path = Path("manifest");
  ASSERT_TRUE(fs_->WriteFileAtomic(path, "a rather long old manifest").ok());
  absl::StatusOr<std::unique_ptr<WritableFile>> file = fs_->NewWritableFile(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(*fs_->ReadFile(path), "");
  ASSERT_TRUE((*file)->Append("new").ok());
  ASSERT_TRUE((*file)->Close().ok());
  EXPECT_EQ(*fs_->ReadFile(path), "new");
}

TEST_P(FileSystemContractTest, CallsOnAClosedFileFail) {
  const std::string path = Path("closed");
  absl::StatusOr<std::unique_ptr<WritableFile>> file = fs_->NewWritableFile(path);
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_TRUE((*file)->Append("x").ok());
  ASSERT_TRUE((*file)->Close().ok());
  for (absl::Status s : {(*file)->Append("y"), (*file)->Sync(), (*file)->Close()}) {
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_TRUE(absl::StrContains(s.message(), path)) << s;
  }
  EXPECT_EQ(*fs_->ReadFile(path), "x");
}

TEST_P(FileSystemContractTest, NewWritableFileNeedsAParentDirectoryAndRefusesADirectory) {
  const std::string orphan = Path("missing_dir/file");
  absl::Status s = fs_->NewWritableFile(orphan).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), orphan)) << s;
  EXPECT_FALSE(fs_->Exists(Path("missing_dir")));

  ASSERT_TRUE(fs_->CreateDirs(Path("dir")).ok());
  s = fs_->NewWritableFile(Path("dir")).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_TRUE(fs_->IsDirectory(Path("dir")));
}

TEST_P(FileSystemContractTest, SyncDirNeedsAnExistingDirectory) {
  ASSERT_TRUE(fs_->CreateDirs(Path("step-1")).ok());
  EXPECT_TRUE(fs_->SyncDir(root_).ok());
  EXPECT_TRUE(fs_->SyncDir(Path("step-1")).ok());

  absl::Status s = fs_->SyncDir(Path("absent"));
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), Path("absent"))) << s;

  ASSERT_TRUE(fs_->WriteFileAtomic(Path("file"), "x").ok());
  s = fs_->SyncDir(Path("file"));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), Path("file"))) << s;
}

TEST_P(FileSystemContractTest, IsDirectoryTellsDirectoriesFromFiles) {
  ASSERT_TRUE(fs_->CreateDirs(Path("a/b")).ok());
  ASSERT_TRUE(fs_->WriteFileAtomic(Path("a/file"), "x").ok());
  EXPECT_TRUE(fs_->IsDirectory(root_));
  EXPECT_TRUE(fs_->IsDirectory(Path("a")));
  EXPECT_TRUE(fs_->IsDirectory(Path("a/b")));
  EXPECT_TRUE(fs_->IsDirectory(Path("a/b/")));
  EXPECT_FALSE(fs_->IsDirectory(Path("a/file")));
  EXPECT_FALSE(fs_->IsDirectory(Path("a/missing")));
}

TEST_P(FileSystemContractTest, RemoveDirRemovesOnlyEmptyDirectories) {
  ASSERT_TRUE(fs_->CreateDirs(Path("full/empty")).ok());
  ASSERT_TRUE(fs_->WriteFileAtomic(Path("full/f"), "x").ok());

  absl::Status s = fs_->RemoveDir(Path("full"));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), Path("full"))) << s;
  EXPECT_TRUE(fs_->IsDirectory(Path("full")));

  s = fs_->RemoveDir(Path("full/f"));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_TRUE(fs_->Exists(Path("full/f")));

  ASSERT_TRUE(fs_->RemoveDir(Path("full/empty")).ok());
  EXPECT_FALSE(fs_->Exists(Path("full/empty")));

  s = fs_->RemoveDir(Path("full/empty"));
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), Path("full/empty"))) << s;
}

TEST_P(FileSystemContractTest, RemoveRecursivelyRemovesATreeAndNothingElse) {
  ASSERT_TRUE(fs_->CreateDirs(Path("step-10/shards/empty")).ok());
  ASSERT_TRUE(fs_->WriteFileAtomic(Path("step-10/manifest"), "m").ok());
  ASSERT_TRUE(WriteWithWriter(Path("step-10/shards/0"), "zero").ok());
  ASSERT_TRUE(WriteWithWriter(Path("step-10/shards/1"), "one").ok());
  ASSERT_TRUE(fs_->CreateDirs(Path("step-100")).ok());  // shares a prefix: must stay
  ASSERT_TRUE(fs_->WriteFileAtomic(Path("step-100/manifest"), "keep").ok());

  ASSERT_TRUE(RemoveRecursively(*fs_, Path("step-10")).ok());
  EXPECT_FALSE(fs_->Exists(Path("step-10")));
  EXPECT_FALSE(fs_->Exists(Path("step-10/shards/0")));
  EXPECT_EQ(*fs_->ListDir(root_), std::vector<std::string>{"step-100"});
  EXPECT_EQ(*fs_->ReadFile(Path("step-100/manifest")), "keep");

  // A plain file, and a directory named with a trailing slash.
  ASSERT_TRUE(RemoveRecursively(*fs_, Path("step-100/manifest")).ok());
  EXPECT_TRUE(fs_->IsDirectory(Path("step-100")));
  ASSERT_TRUE(RemoveRecursively(*fs_, Path("step-100") + "/").ok());
  EXPECT_TRUE(fs_->ListDir(root_)->empty());

  absl::Status s = RemoveRecursively(*fs_, Path("step-10"));
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), Path("step-10"))) << s;
}

INSTANTIATE_TEST_SUITE_P(AllFileSystems, FileSystemContractTest,
                         testing::Values(Kind::kPosix, Kind::kConfined, Kind::kConfinedWalk,
                                         Kind::kFake, Kind::kFaultInjection),
                         KindName);

}  // namespace
}  // namespace trainyard
