// FaultInjectionFileSystem: an in-memory FileSystem that models what survives a crash, and fails
// chosen operations, for testing checkpoint writers and readers (after LevelDB's
// db/fault_injection_test.cc).
//
// The model. Files and directories are inodes, as on POSIX: a WritableFile keeps writing to the
// inode it opened after a rename or removal, and a name can be renamed over another.
//   - A file inode has a volatile content (what every read sees) and a durable content: the
//     volatile content as of the last WritableFile::Sync on it. Opening an existing file with
//     NewWritableFile truncates the same inode, volatilely.
//   - A directory inode has volatile entries (name -> inode; what every lookup, read and listing
//     uses) and durable entries. Only SyncDir(d) changes d's durable entries: they become equal to
//     its volatile entries, so creations, removals and renames into or out of d become durable
//     together. A rename is made durable one directory at a time: syncing only the destination of
//     a cross-directory rename leaves the old name durable too (two names for a file; a directory
//     keeps only the first of its names met in a depth-first walk by name after a crash).
//   - SimulateCrash() replaces every volatile view by the durable one, walking durable entries
//     from the root: unsynced bytes are lost, names not synced into their directory vanish,
//     unsynced renames and removals are undone, and a directory whose creation was not synced
//     vanishes with everything under it. This is one outcome a real filesystem allows (the most
//     pessimistic for unsynced data); outcomes where some unsynced bytes survive are not modelled.
//     WritableFiles opened before the crash are dead afterwards: all their calls fail with
//     FAILED_PRECONDITION.
//   - The root "/" and the directories given to the constructor (and their parents) exist durably
//     from the start. Paths are split on '/'; empty and "." components are ignored, so relative
//     paths resolve from the root too; ".." is not supported (INVALID_ARGUMENT).
//   - WriteFileAtomic is made of the primitives (NewWritableFile of "<path>.tmp.<n>", Append,
//     Sync, Close, RenameFile onto `path`, SyncDir of the parent: 6 operations; a failure then
//     removes the temporary file, a 7th), so it is counted and faulted like any other writer.
//
// Faults. Every call of a mutating operation — NewWritableFile, WritableFile::Append, Sync and
// Close, SyncDir, RenameFile, RemoveFile, RemoveDir, CreateDirs — gets the next operation index
// (0, 1, 2, ...), counted before any other check, so failing calls count too. mutating_ops() is
// the number of calls so far, so FailAt(mutating_ops(), f) fails the next one. Reads (ReadFile,
// MapReadOnly, FileSize, Exists, IsDirectory, ListDir) never count and never fail by injection;
// MapReadOnly returns a copy, which later writes and crashes do not change.
//   - kCrash: that call and every later mutating call fail with ABORTED ("simulated crash") and
//     change nothing, until ClearFaults(); call SimulateCrash() first to see what survived.
//   - kNoSpace: that call fails once with RESOURCE_EXHAUSTED ("No space left on device") and
//     changes nothing.
//   - kIoError: that call fails once with DATA_LOSS ("Input/output error") and changes nothing.
// Injected messages name the operation and the path, like the POSIX filesystem's.
//
// Threading: every method may be called from any thread; one mutex guards all state. A
// WritableFile is used by one thread at a time and must not outlive its FaultInjectionFileSystem.
#ifndef TRAINYARD_COMMON_FAULT_INJECTION_FILESYSTEM_H_
#define TRAINYARD_COMMON_FAULT_INJECTION_FILESYSTEM_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/filesystem.h"

namespace trainyard {
namespace fault_injection_internal {
struct Node;
struct Located;
class FaultInjectionWritableFile;
}  // namespace fault_injection_internal

class FaultInjectionFileSystem : public FileSystem {
 public:
  enum class Fault { kCrash, kNoSpace, kIoError };

  // `durable_dirs` (and their parents) exist, durably, from the start.
  explicit FaultInjectionFileSystem(const std::vector<std::string>& durable_dirs = {});
  ~FaultInjectionFileSystem() override;
  FaultInjectionFileSystem(const FaultInjectionFileSystem&) = delete;
  FaultInjectionFileSystem& operator=(const FaultInjectionFileSystem&) = delete;

  [[nodiscard]] absl::StatusOr<std::string> ReadFile(const std::string& path) override;
  [[nodiscard]] absl::Status WriteFileAtomic(const std::string& path,
                                             std::string_view data) override;
  [[nodiscard]] absl::StatusOr<uint64_t> FileSize(const std::string& path) override;
  bool Exists(const std::string& path) override;
  [[nodiscard]] absl::Status CreateDirs(const std::string& path) override;
  [[nodiscard]] absl::StatusOr<std::vector<std::string>> ListDir(const std::string& path) override;
  [[nodiscard]] absl::Status RemoveFile(const std::string& path) override;
  [[nodiscard]] absl::Status RenameFile(const std::string& from, const std::string& to) override;
  [[nodiscard]] absl::StatusOr<std::unique_ptr<ReadOnlyRegion>> MapReadOnly(
      const std::string& path) override;
  [[nodiscard]] absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(
      const std::string& path) override;
  [[nodiscard]] absl::Status SyncDir(const std::string& path) override;
  bool IsDirectory(const std::string& path) override;
  [[nodiscard]] absl::Status RemoveDir(const std::string& path) override;

  // Makes the volatile view the durable one (see the model above). Does not clear faults.
  void SimulateCrash();

  // Fails the mutating call with index `op_index` (see Faults above). An index already passed
  // never fires; a second fault at the same index replaces the first.
  void FailAt(int64_t op_index, Fault fault);
  // Forgets pending faults and leaves the crashed state; the operation count goes on.
  void ClearFaults();
  // The number of mutating calls so far (the index the next one gets).
  int64_t mutating_ops() const;

  // Test helpers; they act on both the volatile and the durable content and are not counted.
  // Flips the lowest bit of byte `offset` in each view that has it; OUT_OF_RANGE if neither has.
  [[nodiscard]] absl::Status CorruptByte(const std::string& path, uint64_t offset);
  // Keeps the first `size` bytes of each view; OUT_OF_RANGE if the file is shorter than `size`.
  [[nodiscard]] absl::Status Truncate(const std::string& path, uint64_t size);
  // While set, ReadFile, MapReadOnly and ListDir of `path` (file or directory) fail with
  // PERMISSION_DENIED. Survives SimulateCrash.
  [[nodiscard]] absl::Status SetUnreadable(const std::string& path, bool unreadable = true);

 private:
  using Node = fault_injection_internal::Node;
  using Located = fault_injection_internal::Located;
  friend class fault_injection_internal::FaultInjectionWritableFile;

  // Counts a mutating call and applies any fault due at its index.
  [[nodiscard]] absl::Status BeginMutatingOpLocked(const char* operation, const std::string& path)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  [[nodiscard]] absl::StatusOr<Located> LocateLocked(const char* operation,
                                                     const std::string& path) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  [[nodiscard]] absl::StatusOr<std::shared_ptr<Node>> FileLocked(const char* operation,
                                                                 const std::string& path) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  [[nodiscard]] absl::Status CreateDirsLocked(const std::string& path)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  [[nodiscard]] absl::Status RenameLocked(const std::string& from, const std::string& to)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  std::shared_ptr<Node> root_ ABSL_GUARDED_BY(mu_);
  int64_t ops_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<int64_t, Fault> faults_ ABSL_GUARDED_BY(mu_);
  bool crashed_ ABSL_GUARDED_BY(mu_) = false;
  // Incremented by SimulateCrash: a WritableFile from an older generation is dead.
  int64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_temp_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace trainyard

#endif  // TRAINYARD_COMMON_FAULT_INJECTION_FILESYSTEM_H_
