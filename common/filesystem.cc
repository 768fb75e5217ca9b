// The POSIX FileSystem, and RemoveRecursively (generic over FileSystem). Every syscall error is
// converted here, once, into a Status that names the operation and the path.
#include "common/filesystem.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace trainyard {
namespace {

absl::Status PosixError(const char* operation, const std::string& path) {
  return ErrnoStatus(errno, absl::StrCat(operation, " ", path));
}

// Owns a file descriptor.
class ScopedFd {
 public:
  explicit ScopedFd(int fd) : fd_(fd) {}
  ScopedFd(const ScopedFd&) = delete;
  ScopedFd& operator=(const ScopedFd&) = delete;
  ~ScopedFd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  // Closes now and reports the error close() gives (which can be a delayed write error).
  absl::Status Close(const std::string& path) {
    int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) return PosixError("close", path);
    return absl::OkStatus();
  }

 private:
  int fd_;
};

class MappedRegion : public ReadOnlyRegion {
 public:
  MappedRegion(void* base, size_t size) : base_(base), size_(size) {}
  MappedRegion(const MappedRegion&) = delete;
  MappedRegion& operator=(const MappedRegion&) = delete;
  ~MappedRegion() override {
    if (base_ != nullptr) ::munmap(base_, size_);
  }
  const uint8_t* data() const override { return static_cast<const uint8_t*>(base_); }
  size_t size() const override { return size_; }

 private:
  void* base_;
  size_t size_;
};

absl::Status WriteAll(int fd, std::string_view data, const std::string& path) {
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return PosixError("write", path);
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

absl::Status SyncDirectory(const std::string& dir) {
  ScopedFd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd.valid()) return PosixError("open directory", dir);
  if (::fsync(fd.get()) != 0) return PosixError("fsync directory", dir);
  return fd.Close(dir);
}

// Creates one directory; an existing entry is left for the caller's final check.
absl::Status MakeDir(const std::string& path) {
  if (::mkdir(path.c_str(), 0755) != 0 && errno != EEXIST) {
    return PosixError("create directory", path);
  }
  return absl::OkStatus();
}

// fdatasync where the platform has it: it still flushes the file size, which is all a reader
// needs, without the inode timestamps.
int SyncFd(int fd) {
#if defined(__linux__)
  return ::fdatasync(fd);
#else
  return ::fsync(fd);
#endif
}

// Appends go straight to write(2): callers append multi-MiB chunks, so a user-space buffer would
// only add a copy.
class PosixWritableFile : public WritableFile {
 public:
  PosixWritableFile(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}

  absl::Status Append(std::string_view data) override {
    TY_RETURN_IF_ERROR(CheckOpen("write"));
    return WriteAll(fd_.get(), data, path_);
  }

  absl::Status Sync() override {
    TY_RETURN_IF_ERROR(CheckOpen("fsync"));
    if (SyncFd(fd_.get()) != 0) return PosixError("fsync", path_);
    return absl::OkStatus();
  }

  absl::Status Close() override {
    TY_RETURN_IF_ERROR(CheckOpen("close"));
    return fd_.Close(path_);
  }

 private:
  absl::Status CheckOpen(const char* operation) const {
    if (fd_.valid()) return absl::OkStatus();
    return absl::FailedPreconditionError(absl::StrCat(operation, " ", path_, ": file is closed"));
  }

  ScopedFd fd_;
  const std::string path_;
};

// O_DIRECT: a short last Append is written rounded up to the alignment, and the file is cut
// back to its true size before it is synced.
class PosixDirectFile : public WritableFile {
 public:
  PosixDirectFile(int fd, std::string path) : file_(fd, path), fd_(fd), path_(std::move(path)) {}

  absl::Status Append(std::string_view data) override {
    const size_t padded =
        (data.size() + kDirectIoAlignment - 1) / kDirectIoAlignment * kDirectIoAlignment;
    if (tail_ || reinterpret_cast<uintptr_t>(data.data()) % kDirectIoAlignment != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("write ", path_, ": unaligned or after the short last write"));
    }
    tail_ = padded != data.size();
    size_ += data.size();
    return file_.Append(std::string_view(data.data(), padded));
  }
  absl::Status Sync() override {
    if (tail_ && ::ftruncate(fd_, static_cast<off_t>(size_)) != 0) {
      return PosixError("truncate", path_);
    }
    return file_.Sync();
  }
  absl::Status Close() override {
    if (tail_ && ::ftruncate(fd_, static_cast<off_t>(size_)) != 0) {
      return PosixError("truncate", path_);
    }
    return file_.Close();
  }

 private:
  PosixWritableFile file_;  // owns fd_
  const int fd_;
  const std::string path_;
  bool tail_ = false;  // the short last write happened
  uint64_t size_ = 0;
};

class PosixFileSystem : public FileSystem {
 public:
  absl::StatusOr<std::string> ReadFile(const std::string& path) override {
    ScopedFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd.valid()) return PosixError("open", path);
    struct stat st;
    if (::fstat(fd.get(), &st) != 0) return PosixError("stat", path);
    std::string contents;
    if (S_ISREG(st.st_mode)) contents.reserve(static_cast<size_t>(st.st_size));
    char buffer[1 << 16];
    while (true) {
      ssize_t n = ::read(fd.get(), buffer, sizeof(buffer));
      if (n < 0) {
        if (errno == EINTR) continue;
        return PosixError("read", path);
      }
      if (n == 0) break;
      contents.append(buffer, static_cast<size_t>(n));
    }
    return contents;
  }

  absl::Status WriteFileAtomic(const std::string& path, std::string_view data) override {
    static std::atomic<uint64_t> counter{0};
    const std::string temp = absl::StrCat(path, ".tmp.", ::getpid(), ".", counter++);
    absl::Status status = WriteAndRename(temp, path, data);
    if (!status.ok()) ::unlink(temp.c_str());
    return status;
  }

  absl::StatusOr<uint64_t> FileSize(const std::string& path) override {
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) return PosixError("stat", path);
    if (S_ISDIR(st.st_mode)) {
      return absl::FailedPreconditionError(absl::StrCat("size of ", path, ": is a directory"));
    }
    return static_cast<uint64_t>(st.st_size);
  }

  bool Exists(const std::string& path) override {
    struct stat st;
    return ::stat(path.c_str(), &st) == 0;
  }

  absl::Status CreateDirs(const std::string& path) override {
    if (path.empty()) return absl::InvalidArgumentError("create directory: empty path");
    for (size_t slash = path.find('/', 1); slash != std::string::npos;
         slash = path.find('/', slash + 1)) {
      TY_RETURN_IF_ERROR(MakeDir(path.substr(0, slash)));
    }
    TY_RETURN_IF_ERROR(MakeDir(path));
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) return PosixError("create directory", path);
    if (!S_ISDIR(st.st_mode)) {
      return absl::FailedPreconditionError(
          absl::StrCat("create directory ", path, ": exists and is not a directory"));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::vector<std::string>> ListDir(const std::string& path) override {
    DIR* dir = ::opendir(path.c_str());
    if (dir == nullptr) return PosixError("list directory", path);
    std::vector<std::string> names;
    errno = 0;
    while (struct dirent* entry = ::readdir(dir)) {
      std::string_view name(entry->d_name);
      if (name != "." && name != "..") names.emplace_back(name);
    }
    const int read_errno = errno;
    ::closedir(dir);
    if (read_errno != 0) return ErrnoStatus(read_errno, absl::StrCat("list directory ", path));
    std::sort(names.begin(), names.end());
    return names;
  }

  absl::Status RemoveFile(const std::string& path) override {
    if (::unlink(path.c_str()) != 0) return PosixError("remove", path);
    return absl::OkStatus();
  }

  absl::Status RenameFile(const std::string& from, const std::string& to) override {
    if (::rename(from.c_str(), to.c_str()) != 0) {
      return ErrnoStatus(errno, absl::StrCat("rename ", from, " to ", to));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::unique_ptr<ReadOnlyRegion>> MapReadOnly(const std::string& path) override {
    ScopedFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd.valid()) return PosixError("open", path);
    struct stat st;
    if (::fstat(fd.get(), &st) != 0) return PosixError("stat", path);
    if (!S_ISREG(st.st_mode)) {
      return absl::FailedPreconditionError(absl::StrCat("map ", path, ": not a regular file"));
    }
    const size_t size = static_cast<size_t>(st.st_size);
    if (size == 0) return std::make_unique<MappedRegion>(nullptr, 0);
    void* base = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd.get(), 0);
    if (base == MAP_FAILED) return PosixError("map", path);
    return std::make_unique<MappedRegion>(base, size);
  }

  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return PosixError("create", path);
    return std::make_unique<PosixWritableFile>(fd, path);
  }

  absl::StatusOr<std::unique_ptr<WritableFile>> NewDirectWritableFile(
      const std::string& path) override {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_DIRECT, 0644);
    if (fd < 0 && errno == EINVAL) return NewWritableFile(path);  // e.g. tmpfs
    if (fd < 0) return PosixError("create", path);
    return std::make_unique<PosixDirectFile>(fd, path);
  }

  absl::Status SyncDir(const std::string& path) override { return SyncDirectory(path); }

  bool IsDirectory(const std::string& path) override {
    struct stat st;
    return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
  }

  absl::Status RemoveDir(const std::string& path) override {
    if (::rmdir(path.c_str()) != 0) return PosixError("remove directory", path);
    return absl::OkStatus();
  }

 private:
  static absl::Status WriteAndRename(const std::string& temp, const std::string& path,
                                     std::string_view data) {
    const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) return PosixError("create", temp);
    PosixWritableFile file(fd, temp);
    TY_RETURN_IF_ERROR(file.Append(data));
    TY_RETURN_IF_ERROR(file.Sync());
    TY_RETURN_IF_ERROR(file.Close());
    if (::rename(temp.c_str(), path.c_str()) != 0) {
      return ErrnoStatus(errno, absl::StrCat("rename ", temp, " to ", path));
    }
    return SyncDirectory(Dirname(path));
  }
};

std::string ChildPath(const std::string& dir, const std::string& name) {
  if (dir.empty()) return name;
  if (dir.back() == '/') return dir + name;
  return absl::StrCat(dir, "/", name);
}

}  // namespace

std::string Dirname(const std::string& path) {
  size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::unique_ptr<ReadOnlyRegion> RegionHolding(std::string bytes) {
  class CopiedRegion : public ReadOnlyRegion {
   public:
    explicit CopiedRegion(std::string bytes) : bytes_(std::move(bytes)) {}
    const uint8_t* data() const override { return reinterpret_cast<const uint8_t*>(bytes_.data()); }
    size_t size() const override { return bytes_.size(); }

   private:
    const std::string bytes_;
  };
  return std::make_unique<CopiedRegion>(std::move(bytes));
}

// Tries RemoveFile first, so that a symbolic link to a directory is removed, not followed (which
// would delete the contents of the directory it points to). Unlinking a directory fails with
// EISDIR (Linux) or EPERM (POSIX); any other failure is reported as it is.
absl::Status RemoveRecursively(FileSystem& fs, const std::string& path) {
  absl::Status removed = fs.RemoveFile(path);
  if (removed.ok()) return removed;
  const bool maybe_directory = removed.code() == absl::StatusCode::kFailedPrecondition ||
                               removed.code() == absl::StatusCode::kPermissionDenied;
  if (!maybe_directory || !fs.IsDirectory(path)) return removed;
  TY_ASSIGN_OR_RETURN(std::vector<std::string> names, fs.ListDir(path));
  for (const std::string& name : names) {
    absl::Status child = RemoveRecursively(fs, ChildPath(path, name));
    // Something else removed it meanwhile: the goal is reached.
    if (!child.ok() && child.code() != absl::StatusCode::kNotFound) return child;
  }
  return fs.RemoveDir(path);
}

FileSystem* RealFileSystem() {
  static FileSystem* fs = new PosixFileSystem;
  return fs;
}

}  // namespace trainyard
