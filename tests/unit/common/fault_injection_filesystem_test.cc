// FaultInjectionFileSystem: what survives SimulateCrash, and the faults injected by operation
// index.
#include "common/fault_injection_filesystem.h"

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace trainyard {
namespace {

using Fault = FaultInjectionFileSystem::Fault;

constexpr char kRoot[] = "/ckpt";

std::string Path(const std::string& name) { return absl::StrCat(kRoot, "/", name); }

// The names in `dir`, or the error as the only name (so that a failure reads well).
std::vector<std::string> Names(FileSystem& fs, const std::string& dir) {
  absl::StatusOr<std::vector<std::string>> names = fs.ListDir(dir);
  return names.ok() ? *names : std::vector<std::string>{names.status().ToString()};
}

class FaultInjectionFileSystemTest : public testing::Test {
 protected:
  // Creates `path` with `data` and syncs the data and the parent's entry.
  void WriteDurably(const std::string& path, const std::string& data) {
    std::unique_ptr<WritableFile> file = Open(path);
    ASSERT_TRUE(file->Append(data).ok());
    ASSERT_TRUE(file->Sync().ok());
    ASSERT_TRUE(file->Close().ok());
    ASSERT_TRUE(fs_.SyncDir(kRoot).ok());
  }

  std::unique_ptr<WritableFile> Open(const std::string& path) {
    absl::StatusOr<std::unique_ptr<WritableFile>> file = fs_.NewWritableFile(path);
    EXPECT_TRUE(file.ok()) << file.status();
    return file.ok() ? *std::move(file) : nullptr;
  }

  std::string Read(const std::string& path) {
    absl::StatusOr<std::string> data = fs_.ReadFile(path);
    return data.ok() ? *data : absl::StrCat("<", data.status().ToString(), ">");
  }

  FaultInjectionFileSystem fs_{{kRoot}};
};

TEST_F(FaultInjectionFileSystemTest, UnsyncedBytesAreLostAndSyncedBytesKept) {
  std::unique_ptr<WritableFile> file = Open(Path("shard"));
  ASSERT_TRUE(file->Append("synced;").ok());
  ASSERT_TRUE(file->Sync().ok());
  ASSERT_TRUE(file->Append("unsynced").ok());
  ASSERT_TRUE(fs_.SyncDir(kRoot).ok());
  EXPECT_EQ(Read(Path("shard")), "synced;unsynced");  // running processes see everything

  fs_.SimulateCrash();
  EXPECT_EQ(Read(Path("shard")), "synced;");
  EXPECT_EQ(fs_.FileSize(Path("shard")).value_or(0), 7u);
}

TEST_F(FaultInjectionFileSystemTest, SyncedFileWithSyncedNameSurvives) {
  WriteDurably(Path("manifest"), "step 10");
  fs_.SimulateCrash();
  EXPECT_EQ(Read(Path("manifest")), "step 10");
}

TEST_F(FaultInjectionFileSystemTest, NewFileIsLostWithoutSyncDirOfItsParent) {
  std::unique_ptr<WritableFile> file = Open(Path("shard"));
  ASSERT_TRUE(file->Append("data").ok());
  ASSERT_TRUE(file->Sync().ok());
  ASSERT_TRUE(file->Close().ok());
  fs_.SimulateCrash();
  EXPECT_FALSE(fs_.Exists(Path("shard")));
  EXPECT_EQ(Names(fs_, kRoot), std::vector<std::string>{});
}

TEST_F(FaultInjectionFileSystemTest, SyncedNameWithUnsyncedDataIsAnEmptyFile) {
  std::unique_ptr<WritableFile> file = Open(Path("shard"));
  ASSERT_TRUE(file->Append("data").ok());
  ASSERT_TRUE(fs_.SyncDir(kRoot).ok());
  fs_.SimulateCrash();
  EXPECT_EQ(Read(Path("shard")), "");
}

TEST_F(FaultInjectionFileSystemTest, TruncationIsUndoneUntilSynced) {
  WriteDurably(Path("manifest"), "old");
  std::unique_ptr<WritableFile> file = Open(Path("manifest"));
  ASSERT_TRUE(file->Append("new").ok());
  EXPECT_EQ(Read(Path("manifest")), "new");
  fs_.SimulateCrash();
  EXPECT_EQ(Read(Path("manifest")), "old");
}

TEST_F(FaultInjectionFileSystemTest, RenameWithoutSyncDirIsUndone) {
  WriteDurably(Path("a"), "A");
  WriteDurably(Path("b"), "B");
  ASSERT_TRUE(fs_.RenameFile(Path("a"), Path("b")).ok());
  EXPECT_FALSE(fs_.Exists(Path("a")));
  EXPECT_EQ(Read(Path("b")), "A");
  fs_.SimulateCrash();
  EXPECT_EQ(Read(Path("a")), "A");
  EXPECT_EQ(Read(Path("b")), "B");

  ASSERT_TRUE(fs_.RenameFile(Path("a"), Path("b")).ok());
  ASSERT_TRUE(fs_.SyncDir(kRoot).ok());
  fs_.SimulateCrash();
  EXPECT_FALSE(fs_.Exists(Path("a")));
  EXPECT_EQ(Read(Path("b")), "A");
}

TEST_F(FaultInjectionFileSystemTest, RemovalWithoutSyncDirIsUndone) {
  WriteDurably(Path("old-shard"), "x");
  ASSERT_TRUE(fs_.CreateDirs(Path("step-1")).ok());
  ASSERT_TRUE(fs_.SyncDir(kRoot).ok());
  ASSERT_TRUE(fs_.RemoveFile(Path("old-shard")).ok());
  ASSERT_TRUE(fs_.RemoveDir(Path("step-1")).ok());
  EXPECT_EQ(Names(fs_, kRoot), std::vector<std::string>{});
  fs_.SimulateCrash();
  EXPECT_EQ(Names(fs_, kRoot), (std::vector<std::string>{"old-shard", "step-1"}));

  ASSERT_TRUE(RemoveRecursively(fs_, Path("step-1")).ok());
  ASSERT_TRUE(fs_.RemoveFile(Path("old-shard")).ok());
  ASSERT_TRUE(fs_.SyncDir(kRoot).ok());
  fs_.SimulateCrash();
  EXPECT_EQ(Names(fs_, kRoot), std::vector<std::string>{});
}

TEST_F(FaultInjectionFileSystemTest, DirectoryNotDurablyCreatedVanishesWithItsContents) {
  ASSERT_TRUE(fs_.CreateDirs(Path("step-1/shards")).ok());
  std::unique_ptr<WritableFile> file = Open(Path("step-1/shards/0"));
  ASSERT_TRUE(file->Append("zero").ok());
  ASSERT_TRUE(file->Sync().ok());
  ASSERT_TRUE(fs_.SyncDir(Path("step-1/shards")).ok());
  ASSERT_TRUE(fs_.SyncDir(Path("step-1")).ok());
  fs_.SimulateCrash();  // kRoot was never synced after step-1 was created
  EXPECT_FALSE(fs_.Exists(Path("step-1")));

  ASSERT_TRUE(fs_.CreateDirs(Path("step-1/shards")).ok());
  WriteDurably(Path("step-1/shards/0"), "zero");  // syncs kRoot, not step-1
  fs_.SimulateCrash();
  EXPECT_TRUE(fs_.IsDirectory(Path("step-1")));
  EXPECT_EQ(Names(fs_, Path("step-1")), std::vector<std::string>{});
}

TEST_F(FaultInjectionFileSystemTest, RenamedDirectoryKeepsItsDurableEntries) {
  // The checkpoint pattern: fill a temporary directory, sync it, rename it into place.
  ASSERT_TRUE(fs_.CreateDirs(Path("tmp-10")).ok());
  std::unique_ptr<WritableFile> file = Open(Path("tmp-10/shard-0"));
  ASSERT_TRUE(file->Append("weights").ok());
  ASSERT_TRUE(file->Sync().ok());
  ASSERT_TRUE(file->Close().ok());
  ASSERT_TRUE(fs_.SyncDir(Path("tmp-10")).ok());
  ASSERT_TRUE(fs_.RenameFile(Path("tmp-10"), Path("step-10")).ok());
  ASSERT_TRUE(fs_.SyncDir(kRoot).ok());
  fs_.SimulateCrash();
  EXPECT_EQ(Names(fs_, kRoot), std::vector<std::string>{"step-10"});
  EXPECT_EQ(Read(Path("step-10/shard-0")), "weights");
}

TEST_F(FaultInjectionFileSystemTest, ConstructorDirectoriesAreDurable) {
  FaultInjectionFileSystem fs({"/a/b", "/c"});
  ASSERT_TRUE(fs.CreateDirs("/d").ok());
  fs.SimulateCrash();
  EXPECT_TRUE(fs.IsDirectory("/a/b"));
  EXPECT_TRUE(fs.IsDirectory("/c"));
  EXPECT_FALSE(fs.Exists("/d"));
  EXPECT_EQ(Names(fs, "/"), (std::vector<std::string>{"a", "c"}));
}

// Crashes a WriteFileAtomic of "new" over "old" (or over nothing) at each of its operations, and
// once right after it: the file must hold the old contents, or nothing if there were none, until
// the write completes, then the new contents. No temporary file survives.
void CheckAtomicWriteUnderCrashes(bool old_exists) {
  constexpr int kOpsPerAtomicWrite = 6;
  for (int crash_at = 0; crash_at <= kOpsPerAtomicWrite; ++crash_at) {
    SCOPED_TRACE(absl::StrCat("crash at op ", crash_at, old_exists ? ", old exists" : ""));
    FaultInjectionFileSystem fs({kRoot});
    if (old_exists) {
      ASSERT_TRUE(fs.WriteFileAtomic(Path("manifest"), "old").ok());
    }
    const int64_t start = fs.mutating_ops();
    fs.FailAt(start + crash_at, Fault::kCrash);
    absl::Status s = fs.WriteFileAtomic(Path("manifest"), "new");
    if (crash_at < kOpsPerAtomicWrite) {
      EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
    } else {
      ASSERT_TRUE(s.ok()) << s;
      EXPECT_EQ(fs.mutating_ops() - start, kOpsPerAtomicWrite);
      EXPECT_FALSE(fs.CreateDirs(Path("x")).ok());  // the crash comes now
    }
    fs.SimulateCrash();
    fs.ClearFaults();
    absl::StatusOr<std::string> data = fs.ReadFile(Path("manifest"));
    if (crash_at == kOpsPerAtomicWrite) {
      EXPECT_EQ(data.value_or("<missing>"), "new");
    } else if (old_exists) {
      EXPECT_EQ(data.value_or("<missing>"), "old");
    } else {
      EXPECT_EQ(data.status().code(), absl::StatusCode::kNotFound) << data.status();
    }
    std::vector<std::string> expected_names;
    if (old_exists || crash_at == kOpsPerAtomicWrite) expected_names.push_back("manifest");
    EXPECT_EQ(Names(fs, kRoot), expected_names);
  }
}

TEST(FaultInjectionAtomicWriteTest, CrashAtEveryOpLeavesOldOrNewContents) {
  CheckAtomicWriteUnderCrashes(/*old_exists=*/true);
}

TEST(FaultInjectionAtomicWriteTest, CrashAtEveryOpLeavesNothingOrNewContents) {
  CheckAtomicWriteUnderCrashes(/*old_exists=*/false);
}

TEST_F(FaultInjectionFileSystemTest, NoSpaceFailsTheChosenOpOnceWithoutEffect) {
  std::unique_ptr<WritableFile> file = Open(Path("shard"));
  ASSERT_TRUE(file->Append("a").ok());
  fs_.FailAt(fs_.mutating_ops(), Fault::kNoSpace);
  absl::Status s = file->Append("b");
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "No space left on device")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), Path("shard"))) << s;
  EXPECT_EQ(Read(Path("shard")), "a");
  ASSERT_TRUE(file->Append("c").ok());
  EXPECT_EQ(Read(Path("shard")), "ac");

  // At each op of an atomic write: the old contents stay, no temporary is left, a retry works.
  ASSERT_TRUE(fs_.WriteFileAtomic(Path("manifest"), "old").ok());
  for (int op = 0; op < 6; ++op) {
    SCOPED_TRACE(absl::StrCat("no space at op ", op));
    fs_.FailAt(fs_.mutating_ops() + op, Fault::kNoSpace);
    s = fs_.WriteFileAtomic(Path("manifest"), "new");
    EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
    EXPECT_TRUE(absl::StrContains(s.message(), kRoot)) << s;
    // A failed SyncDir (op 5) comes after the rename, which running processes already see.
    EXPECT_EQ(Read(Path("manifest")), op < 5 ? "old" : "new");
    EXPECT_EQ(Names(fs_, kRoot), (std::vector<std::string>{"manifest", "shard"}));
    ASSERT_TRUE(fs_.WriteFileAtomic(Path("manifest"), "old").ok());
  }
}

TEST_F(FaultInjectionFileSystemTest, IoErrorFailsTheChosenOpOnceWithDataLoss) {
  std::unique_ptr<WritableFile> file = Open(Path("shard"));
  ASSERT_TRUE(file->Append("bytes").ok());
  fs_.FailAt(fs_.mutating_ops(), Fault::kIoError);
  absl::Status s = file->Sync();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "Input/output error")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), Path("shard"))) << s;
  ASSERT_TRUE(fs_.SyncDir(kRoot).ok());
  fs_.SimulateCrash();
  EXPECT_EQ(Read(Path("shard")), "");  // the failed Sync made nothing durable

  fs_.FailAt(fs_.mutating_ops() + 1, Fault::kIoError);
  EXPECT_TRUE(fs_.CreateDirs(Path("d")).ok());
  s = fs_.RenameFile(Path("shard"), Path("shard-0"));
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_TRUE(fs_.Exists(Path("shard")));
  EXPECT_TRUE(fs_.RenameFile(Path("shard"), Path("shard-0")).ok());
}

TEST_F(FaultInjectionFileSystemTest, CrashFailsEveryLaterOpAndChangesNothing) {
  WriteDurably(Path("manifest"), "durable");
  std::unique_ptr<WritableFile> file = Open(Path("shard"));
  fs_.FailAt(fs_.mutating_ops() + 1, Fault::kCrash);
  ASSERT_TRUE(file->Append("before").ok());
  const absl::Status crash = file->Append("at");
  EXPECT_EQ(crash.code(), absl::StatusCode::kAborted) << crash;
  EXPECT_TRUE(absl::StrContains(crash.message(), "simulated crash")) << crash;
  for (absl::Status s :
       {file->Sync(), file->Close(), fs_.SyncDir(kRoot), fs_.CreateDirs(Path("d")),
        fs_.RemoveFile(Path("manifest")), fs_.RenameFile(Path("manifest"), Path("m2")),
        fs_.NewWritableFile(Path("other")).status(), fs_.WriteFileAtomic(Path("manifest"), "x"),
        fs_.RemoveDir(kRoot)}) {
    EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
  }
  // Reads still work and show the state at the crash.
  EXPECT_EQ(Read(Path("shard")), "before");
  EXPECT_EQ(Names(fs_, kRoot), (std::vector<std::string>{"manifest", "shard"}));

  fs_.SimulateCrash();
  EXPECT_EQ(Names(fs_, kRoot), std::vector<std::string>{"manifest"});
  EXPECT_EQ(fs_.CreateDirs(Path("d")).code(), absl::StatusCode::kAborted);  // until ClearFaults
  fs_.ClearFaults();
  ASSERT_TRUE(fs_.CreateDirs(Path("d")).ok());
  // A writer opened before the crash stays dead.
  EXPECT_EQ(file->Append("x").code(), absl::StatusCode::kFailedPrecondition);
  WriteDurably(Path("manifest"), "after restart");
  EXPECT_EQ(Read(Path("manifest")), "after restart");
}

TEST_F(FaultInjectionFileSystemTest, CountsEveryMutatingCallAndNoRead) {
  int64_t ops = fs_.mutating_ops();
  ASSERT_TRUE(fs_.CreateDirs(Path("d")).ok());
  EXPECT_EQ(fs_.mutating_ops(), ++ops);
  std::unique_ptr<WritableFile> file = Open(Path("d/f"));
  EXPECT_EQ(fs_.mutating_ops(), ++ops);
  ASSERT_TRUE(file->Append("x").ok());
  ASSERT_TRUE(file->Sync().ok());
  ASSERT_TRUE(file->Close().ok());
  ASSERT_TRUE(fs_.SyncDir(Path("d")).ok());
  ASSERT_TRUE(fs_.RenameFile(Path("d/f"), Path("d/g")).ok());
  ASSERT_TRUE(fs_.RemoveFile(Path("d/g")).ok());
  ASSERT_TRUE(fs_.RemoveDir(Path("d")).ok());
  ops += 7;
  EXPECT_EQ(fs_.mutating_ops(), ops);
  EXPECT_EQ(fs_.RemoveFile(Path("missing")).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(fs_.mutating_ops(), ++ops);  // a failing call counts too

  ASSERT_TRUE(fs_.WriteFileAtomic(Path("m"), "data").ok());
  ops += 6;
  EXPECT_EQ(fs_.mutating_ops(), ops);
  EXPECT_TRUE(fs_.ReadFile(Path("m")).ok());
  EXPECT_TRUE(fs_.MapReadOnly(Path("m")).ok());
  EXPECT_TRUE(fs_.FileSize(Path("m")).ok());
  EXPECT_TRUE(fs_.Exists(Path("m")));
  EXPECT_FALSE(fs_.IsDirectory(Path("m")));
  EXPECT_TRUE(fs_.ListDir(kRoot).ok());
  EXPECT_TRUE(fs_.CorruptByte(Path("m"), 0).ok());
  fs_.SimulateCrash();
  EXPECT_EQ(fs_.mutating_ops(), ops);
}

TEST_F(FaultInjectionFileSystemTest, CorruptByteAndTruncateChangeBothViews) {
  WriteDurably(Path("shard"), "abcdef");
  ASSERT_TRUE(fs_.CorruptByte(Path("shard"), 2).ok());
  const std::string corrupted = std::string("ab") + static_cast<char>('c' ^ 1) + "def";
  EXPECT_EQ(Read(Path("shard")), corrupted);
  fs_.SimulateCrash();
  EXPECT_EQ(Read(Path("shard")), corrupted);

  ASSERT_TRUE(fs_.Truncate(Path("shard"), 4).ok());
  EXPECT_EQ(Read(Path("shard")), corrupted.substr(0, 4));
  fs_.SimulateCrash();
  EXPECT_EQ(Read(Path("shard")), corrupted.substr(0, 4));
  auto region = fs_.MapReadOnly(Path("shard"));
  ASSERT_TRUE(region.ok());
  EXPECT_EQ((*region)->size(), 4u);

  EXPECT_EQ(fs_.CorruptByte(Path("shard"), 4).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(fs_.Truncate(Path("shard"), 5).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(fs_.CorruptByte(Path("missing"), 0).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(fs_.Truncate(kRoot, 0).code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(FaultInjectionFileSystemTest, UnreadablePathsArePermissionDenied) {
  WriteDurably(Path("shard"), "x");
  ASSERT_TRUE(fs_.SetUnreadable(Path("shard")).ok());
  ASSERT_TRUE(fs_.SetUnreadable(kRoot).ok());
  for (absl::Status s : {fs_.ReadFile(Path("shard")).status(),
                         fs_.MapReadOnly(Path("shard")).status(), fs_.ListDir(kRoot).status()}) {
    EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  }
  EXPECT_TRUE(absl::StrContains(fs_.ReadFile(Path("shard")).status().message(), Path("shard")));
  EXPECT_TRUE(fs_.Exists(Path("shard")));
  fs_.SimulateCrash();
  EXPECT_EQ(fs_.ReadFile(Path("shard")).status().code(), absl::StatusCode::kPermissionDenied);
  ASSERT_TRUE(fs_.SetUnreadable(Path("shard"), false).ok());
  EXPECT_EQ(Read(Path("shard")), "x");
  EXPECT_EQ(fs_.SetUnreadable(Path("missing")).code(), absl::StatusCode::kNotFound);
}

TEST_F(FaultInjectionFileSystemTest, DotDotIsRefused) {
  EXPECT_EQ(fs_.ReadFile(Path("../etc")).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(fs_.CreateDirs(Path("a/../b")).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(FaultInjectionFileSystemTest, ConcurrentWritersAllLandAndAreCounted) {
  const int64_t start = fs_.mutating_ops();
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([this, t] {
      for (int i = 0; i < 50; ++i) {
        ASSERT_TRUE(fs_.WriteFileAtomic(Path(absl::StrCat("f", t, "_", i)), "x").ok());
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(fs_.mutating_ops() - start, 4 * 50 * 6);
  fs_.SimulateCrash();
  EXPECT_EQ(Names(fs_, kRoot).size(), 200u);
}

}  // namespace
}  // namespace trainyard
