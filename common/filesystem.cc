// The POSIX FileSystem. Every syscall error is converted here, once, into a Status that names the
// operation and the path.
#include "common/filesystem.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace trainyard {
namespace {

absl::Status PosixError(const char* operation, const std::string& path) {
  return absl::ErrnoToStatus(errno, absl::StrCat(operation, " ", path));
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

std::string Dirname(const std::string& path) {
  size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

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

absl::Status SyncDir(const std::string& dir) {
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
    if (read_errno != 0)
      return absl::ErrnoToStatus(read_errno, absl::StrCat("list directory ", path));
    std::sort(names.begin(), names.end());
    return names;
  }

  absl::Status RemoveFile(const std::string& path) override {
    if (::unlink(path.c_str()) != 0) return PosixError("remove", path);
    return absl::OkStatus();
  }

  absl::Status RenameFile(const std::string& from, const std::string& to) override {
    if (::rename(from.c_str(), to.c_str()) != 0) {
      return absl::ErrnoToStatus(errno, absl::StrCat("rename ", from, " to ", to));
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

 private:
  static absl::Status WriteAndRename(const std::string& temp, const std::string& path,
                                     std::string_view data) {
    ScopedFd fd(::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
    if (!fd.valid()) return PosixError("create", temp);
    TY_RETURN_IF_ERROR(WriteAll(fd.get(), data, temp));
    if (::fsync(fd.get()) != 0) return PosixError("fsync", temp);
    TY_RETURN_IF_ERROR(fd.Close(temp));
    if (::rename(temp.c_str(), path.c_str()) != 0) {
      return absl::ErrnoToStatus(errno, absl::StrCat("rename ", temp, " to ", path));
    }
    return SyncDir(Dirname(path));
  }
};

}  // namespace

FileSystem* RealFileSystem() {
  static FileSystem* fs = new PosixFileSystem;
  return fs;
}

}  // namespace trainyard
