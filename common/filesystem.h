// The filesystem seam: all file access in Trainyard goes through a FileSystem, so tests can swap
// in an in-memory one (or a fault-injecting wrapper) for the real POSIX implementation.
//
// Errors: every failure names the path. A missing file or directory is NOT_FOUND; EIO is
// DATA_LOSS (the kernel may have dropped the unwritten data, so retrying the call is wrong); other
// operating-system errors keep the code that absl::ErrnoToStatus gives their errno
// (PERMISSION_DENIED, RESOURCE_EXHAUSTED for a full disk, ...).
//
// Threading: RealFileSystem() and FakeFileSystem may be used from any number of threads at once.
// Concurrent writers to the same path race as they would on a real filesystem (last rename wins).
#ifndef TRAINYARD_COMMON_FILESYSTEM_H_
#define TRAINYARD_COMMON_FILESYSTEM_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace trainyard {

// A read-only view of a whole file's bytes, valid until this object is destroyed (which unmaps
// or frees them). An empty file gives size() == 0 and a data() that must not be read.
class ReadOnlyRegion {
 public:
  virtual ~ReadOnlyRegion() = default;
  virtual const uint8_t* data() const = 0;
  virtual size_t size() const = 0;
  // A hint that bytes [offset, offset + length) are about to be read: a mapped file reads them in
  // and maps them with one call instead of a page fault per page. Changes no contents.
  virtual void WillRead(size_t offset, size_t length) const {}
  // A hint that those bytes will be read soon: a mapped file starts reading them in the
  // background and returns at once, so that the disk works while the caller computes.
  virtual void Prefetch(size_t offset, size_t length) const {}
};

// A file open for reads at any offset, for large reads straight into the caller's memory: the
// POSIX filesystems read with pread(2), from the page cache or the disk into `dst`, with no
// mapping (no page-table work) and no second copy. Holds a file descriptor while it lives.
// Thread-compatible.
class RandomAccessFile {
 public:
  virtual ~RandomAccessFile() = default;
  // Bytes [offset, offset + length) into `dst`. DATA_LOSS when the file does not hold them all;
  // other read errors keep their errno's code. Every message names the file.
  [[nodiscard]] virtual absl::Status ReadAt(uint64_t offset, size_t length, void* dst) const = 0;
};

// A file being written, from its start. Appended bytes may sit in the operating system's cache
// until Sync; a crash before Sync may lose any of them (and, for a new file, its name until the
// directory is synced: FileSystem::SyncDir). Not thread-safe: one writer at a time.
class WritableFile {
 public:
  // Closes the file if Close was not called (errors are then lost).
  virtual ~WritableFile() = default;
  [[nodiscard]] virtual absl::Status Append(std::string_view data) = 0;
  // Makes every byte appended so far durable (fsync).
  [[nodiscard]] virtual absl::Status Sync() = 0;
  [[nodiscard]] virtual absl::Status Close() = 0;
};

// Reads out of `region`, the whole of the file at `path` (FileSystem::OpenRandomAccess's base).
std::unique_ptr<RandomAccessFile> RandomAccessFromRegion(std::unique_ptr<ReadOnlyRegion> region,
                                                         std::string path);

// The alignment NewDirectWritableFile needs of memory and sizes.
inline constexpr size_t kDirectIoAlignment = 4096;

class FileSystem {
 public:
  virtual ~FileSystem() = default;

  // The whole contents of the file at `path`.
  [[nodiscard]] virtual absl::StatusOr<std::string> ReadFile(const std::string& path) = 0;

  // Replaces the file at `path` with `data` so that a crash at any moment leaves either the old
  // contents or the new ones, never a mix: writes a temporary file beside it, syncs it, renames
  // it over `path` and syncs the directory. The parent directory must exist.
  [[nodiscard]] virtual absl::Status WriteFileAtomic(const std::string& path,
                                                     std::string_view data) = 0;

  [[nodiscard]] virtual absl::StatusOr<uint64_t> FileSize(const std::string& path) = 0;

  // True when something (file or directory) exists at `path`.
  virtual bool Exists(const std::string& path) = 0;

  // Creates `path` and any missing parents; succeeds if it already is a directory.
  [[nodiscard]] virtual absl::Status CreateDirs(const std::string& path) = 0;

  // The names (not paths) of the entries in directory `path`, sorted, without "." and "..".
  [[nodiscard]] virtual absl::StatusOr<std::vector<std::string>> ListDir(
      const std::string& path) = 0;

  // Removes the file at `path` (not a directory).
  [[nodiscard]] virtual absl::Status RemoveFile(const std::string& path) = 0;

  // Atomically renames `from` to `to`, replacing a file at `to`.
  [[nodiscard]] virtual absl::Status RenameFile(const std::string& from, const std::string& to) = 0;

  // Maps the file at `path` read-only. The file must not be truncated while mapped.
  [[nodiscard]] virtual absl::StatusOr<std::unique_ptr<ReadOnlyRegion>> MapReadOnly(
      const std::string& path) = 0;

  // Opens the file at `path` for reads at any offset. The base version maps it and copies out of
  // the mapping (the in-memory filesystems). Defined here, so that FileSystem keeps no key
  // function and its type information stays in every translation unit that uses it (the fuzz
  // targets link a few sources only).
  [[nodiscard]] virtual absl::StatusOr<std::unique_ptr<RandomAccessFile>> OpenRandomAccess(
      const std::string& path) {
    absl::StatusOr<std::unique_ptr<ReadOnlyRegion>> region = MapReadOnly(path);
    if (!region.ok()) return region.status();
    return RandomAccessFromRegion(std::move(*region), path);
  }

  // Creates the file at `path` (truncating one that exists) for writing. The parent directory
  // must exist. The new name is durable only once the parent directory is synced.
  [[nodiscard]] virtual absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(
      const std::string& path) = 0;

  // Like NewWritableFile, for large sequential writes: where the filesystem allows it, bytes go
  // from the caller's memory to the device without a copy into the page cache (O_DIRECT). The
  // caller's contract: every Append passes memory aligned to kDirectIoAlignment, and every
  // Append but the last a multiple of it in size; the last may be shorter, but the memory after
  // it must be readable up to the next multiple. Elsewhere the same as NewWritableFile.
  [[nodiscard]] virtual absl::StatusOr<std::unique_ptr<WritableFile>> NewDirectWritableFile(
      const std::string& path) {
    return NewWritableFile(path);
  }

  // Makes the entries of directory `path` durable (fsync of the directory): files created,
  // renamed into or removed from it, and subdirectories created in it.
  [[nodiscard]] virtual absl::Status SyncDir(const std::string& path) = 0;

  // True when `path` is a directory.
  virtual bool IsDirectory(const std::string& path) = 0;

  // Removes the empty directory `path`.
  [[nodiscard]] virtual absl::Status RemoveDir(const std::string& path) = 0;
};

// Removes `path` and, for a directory, everything under it, through `fs`. NOT_FOUND when nothing
// is at `path`. A symbolic link is removed, not followed. Calls fs.RemoveFile on every entry
// first, directories included (their "is a directory" failure is expected), so a fault-injecting
// `fs` counts that call too.
[[nodiscard]] absl::Status RemoveRecursively(FileSystem& fs, const std::string& path);

// The directory part of `path`: "." for a bare name, "/" for a file in the root.
std::string Dirname(const std::string& path);
// `name` inside directory `dir` ("dir/name"; `name` alone for an empty `dir`).
std::string ChildPath(const std::string& dir, const std::string& name);

// A region that holds its own copy of `bytes` (the in-memory filesystems' MapReadOnly).
std::unique_ptr<ReadOnlyRegion> RegionHolding(std::string bytes);

// The process-wide POSIX filesystem. Never null; never deleted.
FileSystem* RealFileSystem();

// A POSIX filesystem that reaches only paths beneath `roots` (absolute, or relative to the
// working directory), following no symbolic link out of them: each access resolves the path from
// the root it lies under in the same open that uses it (openat2 RESOLVE_BENEATH; on kernels
// without it, component by component refusing every symbolic link), so a link swapped in after
// a check cannot redirect it. Anything else fails with PERMISSION_DENIED. The roots themselves
// (and their parents) are the operator's: they may be links, and are never created or removed.
// `use_openat2` false forces the component-by-component walk (for tests).
std::unique_ptr<FileSystem> NewConfinedFileSystem(const std::vector<std::string>& roots,
                                                  bool use_openat2 = true);

// An in-memory filesystem for tests. Paths are plain strings (no "." or ".." resolution);
// "", "/" and "." always exist as directories, as does the implicit parent of a path without a
// slash. MapReadOnly returns a region holding its own copy, so later writes do not change it.
// A WritableFile keeps writing to the file it opened after that file is renamed or replaced, as a
// POSIX descriptor does; it must not outlive the FakeFileSystem. SyncDir checks only that the
// directory exists.
class FakeFileSystem : public FileSystem {
 public:
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
  [[nodiscard]] absl::Status SyncDir(const std::string& path) override;  // nothing to do in memory
  bool IsDirectory(const std::string& path) override;
  [[nodiscard]] absl::Status RemoveDir(const std::string& path) override;

 private:
  bool IsDirLocked(const std::string& path) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  [[nodiscard]] absl::Status CheckParentLocked(const std::string& path) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  // Path -> contents, shared with the WritableFiles open on it (the inode).
  std::map<std::string, std::shared_ptr<std::string>> files_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> dirs_ ABSL_GUARDED_BY(mu_);
};

}  // namespace trainyard

#endif  // TRAINYARD_COMMON_FILESYSTEM_H_
