// Tests of the POSIX FileSystem in a private temporary directory.
#include "common/filesystem.h"

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace trainyard {
namespace {

class RealFileSystemTest : public testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = testing::TempDir() + "/trainyard_fs_XXXXXX";
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    root_ = pattern;
  }
  void TearDown() override { std::filesystem::remove_all(root_); }

  std::string Path(const std::string& name) const { return root_ + "/" + name; }

  FileSystem* fs_ = RealFileSystem();
  std::string root_;
};

// Direct writes: aligned whole blocks, then a short last block; the file holds exactly the
// bytes appended (the padding of the last block is cut off), whether or not the filesystem
// takes O_DIRECT.
TEST_F(RealFileSystemTest, DirectWritableFileKeepsExactlyTheAppendedBytes) {
  constexpr size_t kBlock = kDirectIoAlignment;
  const size_t size = 3 * kBlock + 100;
  const size_t padded = 4 * kBlock;
  std::unique_ptr<char, decltype(&std::free)> buffer(
      static_cast<char*>(std::aligned_alloc(kBlock, padded)), &std::free);
  for (size_t i = 0; i < padded; ++i) buffer.get()[i] = static_cast<char>(i * 7 + 1);
  const std::string path = Path("direct.bin");
  absl::StatusOr<std::unique_ptr<WritableFile>> file = fs_->NewDirectWritableFile(path);
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_TRUE((*file)->Append(std::string_view(buffer.get(), 2 * kBlock)).ok());
  ASSERT_TRUE((*file)->Append(std::string_view(buffer.get() + 2 * kBlock, size - 2 * kBlock)).ok());
  ASSERT_TRUE((*file)->Sync().ok());
  ASSERT_TRUE((*file)->Close().ok());
  absl::StatusOr<std::string> read = fs_->ReadFile(path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, std::string(buffer.get(), size));
}

TEST_F(RealFileSystemTest, WriteReadRoundTripReplacesAtomically) {
  const std::string path = Path("manifest.json");
  ASSERT_TRUE(fs_->WriteFileAtomic(path, "first version").ok());
  ASSERT_TRUE(fs_->WriteFileAtomic(path, std::string("second\0binary", 13)).ok());
  absl::StatusOr<std::string> data = fs_->ReadFile(path);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(*data, std::string("second\0binary", 13));
  absl::StatusOr<uint64_t> size = fs_->FileSize(path);
  ASSERT_TRUE(size.ok());
  EXPECT_EQ(*size, 13u);
  // No temporary file is left beside the target.
  absl::StatusOr<std::vector<std::string>> names = fs_->ListDir(root_);
  ASSERT_TRUE(names.ok());
  EXPECT_EQ(*names, std::vector<std::string>{"manifest.json"});
}

TEST_F(RealFileSystemTest, LargeFileRoundTrip) {
  std::string big(3 << 20, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 131 % 251);
  ASSERT_TRUE(fs_->WriteFileAtomic(Path("big"), big).ok());
  absl::StatusOr<std::string> back = fs_->ReadFile(Path("big"));
  ASSERT_TRUE(back.ok());
  EXPECT_TRUE(*back == big);
}

TEST_F(RealFileSystemTest, FailedAtomicWriteLeavesNothingBehind) {
  absl::Status s = fs_->WriteFileAtomic(Path("missing_dir/file"), "x");
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "missing_dir/file")) << s;
  EXPECT_TRUE(fs_->ListDir(root_)->empty());
}

TEST_F(RealFileSystemTest, MissingFilesAreNotFoundAndNamed) {
  const std::string path = Path("nope.bin");
  EXPECT_FALSE(fs_->Exists(path));
  for (absl::Status s :
       {fs_->ReadFile(path).status(), fs_->FileSize(path).status(), fs_->MapReadOnly(path).status(),
        fs_->RemoveFile(path), fs_->ListDir(path).status(), fs_->RenameFile(path, Path("x"))}) {
    EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
    EXPECT_TRUE(absl::StrContains(s.message(), path)) << s;
    EXPECT_TRUE(absl::StrContains(s.message(), "No such file")) << s;
  }
}

TEST_F(RealFileSystemTest, MapReadOnlySeesFileBytes) {
  const std::string path = Path("tokens.bin");
  std::string bytes;
  for (int i = 0; i < 10000; ++i) bytes.push_back(static_cast<char>(i % 256));
  ASSERT_TRUE(fs_->WriteFileAtomic(path, bytes).ok());
  absl::StatusOr<std::unique_ptr<ReadOnlyRegion>> region = fs_->MapReadOnly(path);
  ASSERT_TRUE(region.ok()) << region.status();
  ASSERT_EQ((*region)->size(), bytes.size());
  EXPECT_EQ(std::string(reinterpret_cast<const char*>((*region)->data()), (*region)->size()),
            bytes);
  // The mapping stays valid after the file is unlinked, until the region is destroyed.
  ASSERT_TRUE(fs_->RemoveFile(path).ok());
  EXPECT_EQ((*region)->data()[9999], static_cast<uint8_t>(9999 % 256));

  ASSERT_TRUE(fs_->WriteFileAtomic(Path("empty"), "").ok());
  absl::StatusOr<std::unique_ptr<ReadOnlyRegion>> empty = fs_->MapReadOnly(Path("empty"));
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ((*empty)->size(), 0u);

  EXPECT_FALSE(fs_->MapReadOnly(root_).ok());
}

TEST_F(RealFileSystemTest, DirectoriesListRenameRemove) {
  ASSERT_TRUE(fs_->CreateDirs(Path("a/b/c")).ok());
  ASSERT_TRUE(fs_->CreateDirs(Path("a/b/c")).ok());  // already there: fine
  ASSERT_TRUE(fs_->CreateDirs(Path("a/b/c/")).ok());
  EXPECT_TRUE(fs_->Exists(Path("a/b/c")));
  ASSERT_TRUE(fs_->WriteFileAtomic(Path("a/b/shard-1"), "1").ok());
  ASSERT_TRUE(fs_->WriteFileAtomic(Path("a/b/shard-0"), "0").ok());
  absl::StatusOr<std::vector<std::string>> names = fs_->ListDir(Path("a/b"));
  ASSERT_TRUE(names.ok());
  EXPECT_EQ(*names, (std::vector<std::string>{"c", "shard-0", "shard-1"}));

  ASSERT_TRUE(fs_->RenameFile(Path("a/b/shard-0"), Path("a/b/shard-1")).ok());
  EXPECT_EQ(*fs_->ReadFile(Path("a/b/shard-1")), "0");
  EXPECT_FALSE(fs_->Exists(Path("a/b/shard-0")));
  ASSERT_TRUE(fs_->RemoveFile(Path("a/b/shard-1")).ok());
  EXPECT_FALSE(fs_->Exists(Path("a/b/shard-1")));

  EXPECT_FALSE(fs_->RemoveFile(Path("a/b/c")).ok());  // a directory, not a file
  EXPECT_FALSE(fs_->FileSize(Path("a")).ok());
  EXPECT_FALSE(fs_->ReadFile(Path("a")).ok());

  ASSERT_TRUE(fs_->WriteFileAtomic(Path("plain"), "x").ok());
  absl::Status s = fs_->CreateDirs(Path("plain/sub"));
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(absl::StrContains(s.message(), "plain")) << s;
}

TEST_F(RealFileSystemTest, OtherErrnosKeepTheirCodeAndNameThePath) {
  ASSERT_TRUE(fs_->WriteFileAtomic(Path("plain"), "x").ok());
  const std::string below_file = Path("plain/child");
  absl::Status s = fs_->ReadFile(below_file).status();
  EXPECT_EQ(s.code(), absl::ErrnoToStatusCode(ENOTDIR)) << s;
  EXPECT_NE(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), below_file)) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "Not a directory")) << s;
}

TEST_F(RealFileSystemTest, PermissionErrorsKeepTheirCode) {
  if (::geteuid() == 0) GTEST_SKIP() << "root ignores file permissions";
  const std::string path = Path("secret");
  ASSERT_TRUE(fs_->WriteFileAtomic(path, "x").ok());
  ASSERT_EQ(::chmod(path.c_str(), 0), 0);
  absl::Status s = fs_->ReadFile(path).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), path)) << s;
}

TEST_F(RealFileSystemTest, FullDiskIsResourceExhaustedAndNamesThePath) {
  // Writes to /dev/full fail with ENOSPC.
  const std::string full = "/dev/full";
  if (::access(full.c_str(), W_OK) != 0) GTEST_SKIP() << "no writable " << full;
  absl::StatusOr<std::unique_ptr<WritableFile>> file = fs_->NewWritableFile(full);
  ASSERT_TRUE(file.ok()) << file.status();
  absl::Status s = (*file)->Append("checkpoint bytes");
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), full)) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "No space left on device")) << s;
}

TEST_F(RealFileSystemTest, NewWritableFileIsCreatedWithMode0644LessTheUmask) {
  const mode_t umask_now = ::umask(0);
  ::umask(umask_now);
  absl::StatusOr<std::unique_ptr<WritableFile>> file = fs_->NewWritableFile(Path("shard"));
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_TRUE((*file)->Close().ok());
  struct stat st;
  ASSERT_EQ(::stat(Path("shard").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0644 & ~umask_now);
}

TEST_F(RealFileSystemTest, WriterFollowsItsFileThroughARename) {
  absl::StatusOr<std::unique_ptr<WritableFile>> file = fs_->NewWritableFile(Path("tmp"));
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_TRUE((*file)->Append("before ").ok());
  ASSERT_TRUE(fs_->RenameFile(Path("tmp"), Path("final")).ok());
  ASSERT_TRUE((*file)->Append("after").ok());
  ASSERT_TRUE((*file)->Close().ok());
  EXPECT_EQ(*fs_->ReadFile(Path("final")), "before after");
}

TEST_F(RealFileSystemTest, RemoveRecursivelyRemovesASymlinkWithoutFollowingIt) {
  ASSERT_TRUE(fs_->CreateDirs(Path("outside")).ok());
  ASSERT_TRUE(fs_->WriteFileAtomic(Path("outside/precious"), "keep me").ok());
  ASSERT_TRUE(fs_->CreateDirs(Path("ckpt")).ok());
  ASSERT_EQ(::symlink(Path("outside").c_str(), Path("ckpt/latest").c_str()), 0);
  EXPECT_TRUE(fs_->IsDirectory(Path("ckpt/latest")));  // stat follows the link

  ASSERT_TRUE(RemoveRecursively(*fs_, Path("ckpt")).ok());
  EXPECT_FALSE(fs_->Exists(Path("ckpt")));
  EXPECT_EQ(*fs_->ReadFile(Path("outside/precious")), "keep me");
}

}  // namespace
}  // namespace trainyard
