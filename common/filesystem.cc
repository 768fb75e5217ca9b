// The POSIX FileSystem, and RemoveRecursively (generic over FileSystem). Every syscall error is
// converted here, once, into a Status that names the operation and the path.
#include "common/filesystem.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
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
  if (errno == EXDEV) {  // a confined filesystem refused a path that leaves its roots
    return absl::PermissionDeniedError(absl::StrCat(
        operation, " ", path,
        ": outside the allowed directories (or through a symbolic link that leaves them)"));
  }
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
  void Reset(int fd) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }
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
  void WillRead(size_t offset, size_t length) const override {
    // Populating needs Linux 5.14; before it, ask for read-ahead. A failure costs only speed.
    if (!Advise(offset, length, kPopulateRead)) (void)Advise(offset, length, MADV_WILLNEED);
  }
  void Prefetch(size_t offset, size_t length) const override {
    (void)Advise(offset, length, MADV_WILLNEED);
  }

 private:
  // madvise over the whole pages holding bytes [offset, offset + length); false when it failed.
  bool Advise(size_t offset, size_t length, int advice) const {
    if (base_ == nullptr || offset >= size_) return true;
    const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
    const size_t begin = offset / page * page;
    const size_t end = std::min(size_, offset + length);
    return ::madvise(static_cast<char*>(base_) + begin, end - begin, advice) == 0;
  }

#ifdef MADV_POPULATE_READ
  static constexpr int kPopulateRead = MADV_POPULATE_READ;
#else
  static constexpr int kPopulateRead = 22;  // Linux's value, for older C library headers
#endif
  void* base_;
  size_t size_;
};

absl::Status ReadFully(int fd, uint64_t offset, size_t length, void* dst, const std::string& path) {
  char* out = static_cast<char*>(dst);
  while (length > 0) {
    const ssize_t n = ::pread(fd, out, length, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return PosixError("read", path);
    if (n == 0) {
      return absl::DataLossError(
          absl::StrCat("read ", path, ": the file ends before byte ", offset + length));
    }
    out += n;
    offset += static_cast<uint64_t>(n);
    length -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

class PosixRandomAccessFile : public RandomAccessFile {
 public:
  PosixRandomAccessFile(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  absl::Status ReadAt(uint64_t offset, size_t length, void* dst) const override {
    return ReadFully(fd_.get(), offset, length, dst, path_);
  }

 private:
  ScopedFd fd_;
  const std::string path_;
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

// Where a path leads: the descriptor for opening it, and the (directory, name) pair for the
// calls that act on a name in a directory (mkdir, unlink, rename). The plain resolver uses the
// path as given; ConfinedResolver keeps every step beneath one of its roots.
class PathResolver {
 public:
  virtual ~PathResolver() = default;
  // open(2) of `path` with `flags` (O_CLOEXEC added) and `mode`: a descriptor, or -1 with errno.
  virtual int Open(const std::string& path, int flags, mode_t mode = 0) const = 0;
  // The directory holding `path`'s last component, and that component; a directory of AT_FDCWD
  // means the name is the whole path. On failure, an invalid directory with errno set.
  struct Entry {
    std::unique_ptr<ScopedFd> dir;  // null: AT_FDCWD
    std::string name;
    bool valid = true;
    bool fixed = false;  // (invalid) a confined root or one of its parents: exists, not ours
    int dirfd() const { return dir ? dir->get() : AT_FDCWD; }
  };
  virtual Entry Locate(const std::string& path) const = 0;

 protected:
  static Entry Invalid() {  // keeps errno
    Entry entry;
    entry.valid = false;
    return entry;
  }
};

class PlainResolver : public PathResolver {
 public:
  int Open(const std::string& path, int flags, mode_t mode) const override {
    return ::open(path.c_str(), flags | O_CLOEXEC, mode);
  }
  Entry Locate(const std::string& path) const override {
    Entry entry;
    entry.name = path;
    return entry;
  }
};

// The components of `path` made absolute (against the working directory) and lexically
// normalised ("." and ".." removed).
std::vector<std::string> AbsoluteComponents(const std::string& path) {
  std::filesystem::path p(path);
  if (p.is_relative()) {
    std::error_code error;
    p = std::filesystem::current_path(error) / p;
  }
  std::vector<std::string> parts;
  for (const std::filesystem::path& part : p.lexically_normal().relative_path()) {
    if (!part.empty()) parts.push_back(part.string());
  }
  return parts;
}

bool StartsWith(const std::vector<std::string>& path, const std::vector<std::string>& prefix) {
  return path.size() >= prefix.size() && std::equal(prefix.begin(), prefix.end(), path.begin());
}

// Keeps every path beneath one of its roots, also through symbolic links: the root is opened
// (it is the operator's, and may itself be a link), and the rest is resolved from there with
// openat2's RESOLVE_BENEATH, which fails a path that leaves the root by "..", an absolute link or
// a link that climbs out; on kernels without openat2 (before 5.6), by opening one component at a
// time with O_NOFOLLOW, which refuses every symbolic link below the root. Either way the check
// and the use are one open, so a link swapped in after a check cannot redirect it. A path that
// leaves its root fails with EXDEV.
class ConfinedResolver : public PathResolver {
 public:
  ConfinedResolver(const std::vector<std::string>& roots, bool use_openat2)
      : use_openat2_(use_openat2) {
    for (const std::string& root : roots) roots_.push_back(AbsoluteComponents(root));
  }

  int Open(const std::string& path, int flags, mode_t mode) const override {
    const std::vector<std::string> parts = AbsoluteComponents(path);
    const std::vector<std::string>* root = RootOf(parts);
    if (root == nullptr) {
      errno = EXDEV;
      return -1;
    }
    ScopedFd root_fd(::open(Join(*root, root->size()).c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
    if (!root_fd.valid()) return -1;
    const std::vector<std::string> rest(parts.begin() + static_cast<long>(root->size()),
                                        parts.end());
    if (use_openat2_) {
      const int fd =
          OpenBeneath(root_fd.get(), Join(rest, rest.size(), /*absolute=*/false), flags, mode);
      if (fd >= 0 || errno != ENOSYS) return fd;
    }
    return OpenByComponents(root_fd.get(), rest, flags, mode);
  }

  Entry Locate(const std::string& path) const override {
    std::vector<std::string> parts = AbsoluteComponents(path);
    const std::vector<std::string>* root = RootOf(parts);
    if (root == nullptr || parts.size() == root->size()) {
      // A root and its parents exist by the operator's doing (creating them is a no-op); they,
      // and anything else outside, may not be removed or renamed through here.
      const bool ancestor = std::any_of(roots_.begin(), roots_.end(), [&](const auto& r) {
        return r.size() > parts.size() && StartsWith(r, parts);
      });
      errno = EXDEV;
      Entry refused = Invalid();
      refused.fixed = ancestor || root != nullptr;
      return refused;
    }
    Entry entry;
    entry.name = parts.back();
    parts.pop_back();
    const int dir = Open(Join(parts, parts.size()), O_PATH | O_DIRECTORY, 0);
    if (dir < 0) return Invalid();
    entry.dir = std::make_unique<ScopedFd>(dir);
    return entry;
  }

 private:
  static std::string Join(const std::vector<std::string>& parts, size_t count,
                          bool absolute = true) {
    std::string out = absolute ? "/" : "";
    for (size_t i = 0; i < count; ++i) {
      if (i > 0) out += "/";
      out += parts[i];
    }
    return out.empty() ? "." : out;
  }

  const std::vector<std::string>* RootOf(const std::vector<std::string>& parts) const {
    for (const auto& root : roots_) {
      if (StartsWith(parts, root)) return &root;
    }
    return nullptr;
  }

  static int OpenBeneath(int root_fd, const std::string& rest, int flags, mode_t mode) {
    struct open_how how = {};
    how.flags = static_cast<uint64_t>(flags | O_CLOEXEC);
    how.mode = (flags & O_CREAT) != 0 ? mode : 0;
    how.resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS;
    return static_cast<int>(::syscall(SYS_openat2, root_fd, rest.c_str(), &how, sizeof(how)));
  }

  static int OpenByComponents(int root_fd, const std::vector<std::string>& rest, int flags,
                              mode_t mode) {
    if (rest.empty()) return ::openat(root_fd, ".", flags | O_CLOEXEC, mode);
    ScopedFd dir(::dup(root_fd));
    for (size_t i = 0; i + 1 < rest.size(); ++i) {
      const int next =
          ::openat(dir.get(), rest[i].c_str(), O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (next < 0) return Refused(dir.get(), rest[i]);
      dir.Reset(next);
    }
    const int fd = ::openat(dir.get(), rest.back().c_str(), flags | O_NOFOLLOW | O_CLOEXEC, mode);
    if (fd < 0) return Refused(dir.get(), rest.back());
    struct stat st;
    if ((flags & O_PATH) != 0 && ::fstat(fd, &st) == 0 && S_ISLNK(st.st_mode)) {
      ::close(fd);  // O_PATH | O_NOFOLLOW opens the link itself
      errno = EXDEV;
      return -1;
    }
    return fd;
  }

  // After a failed open of `name` in `dir`: a symbolic link there (O_NOFOLLOW gives ELOOP, or
  // ENOTDIR with O_DIRECTORY) becomes EXDEV; other errors keep their errno.
  static int Refused(int dir, const std::string& name) {
    const int err = errno;
    struct stat st;
    const bool link = (err == ELOOP || err == ENOTDIR) &&
                      ::fstatat(dir, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 &&
                      S_ISLNK(st.st_mode);
    errno = link ? EXDEV : err;
    return -1;
  }

  std::vector<std::vector<std::string>> roots_;
  const bool use_openat2_;
};

class PosixFileSystem : public FileSystem {
 public:
  explicit PosixFileSystem(std::unique_ptr<PathResolver> resolver)
      : resolver_(std::move(resolver)) {}

  absl::StatusOr<std::string> ReadFile(const std::string& path) override {
    ScopedFd fd(resolver_->Open(path, O_RDONLY));
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
    if (!status.ok()) RemoveFile(temp).IgnoreError();  // best effort: the error is `status`
    return status;
  }

  absl::StatusOr<uint64_t> FileSize(const std::string& path) override {
    TY_ASSIGN_OR_RETURN(const struct stat st, Stat(path));
    if (S_ISDIR(st.st_mode)) {
      return absl::FailedPreconditionError(absl::StrCat("size of ", path, ": is a directory"));
    }
    return static_cast<uint64_t>(st.st_size);
  }

  bool Exists(const std::string& path) override { return Stat(path).ok(); }

  absl::Status CreateDirs(const std::string& path) override {
    if (path.empty()) return absl::InvalidArgumentError("create directory: empty path");
    for (size_t slash = path.find('/', 1); slash != std::string::npos;
         slash = path.find('/', slash + 1)) {
      TY_RETURN_IF_ERROR(MakeDir(path.substr(0, slash)));
    }
    TY_RETURN_IF_ERROR(MakeDir(path));
    absl::StatusOr<struct stat> st = Stat(path);
    if (!st.ok()) return PosixError("create directory", path);
    if (!S_ISDIR(st->st_mode)) {
      return absl::FailedPreconditionError(
          absl::StrCat("create directory ", path, ": exists and is not a directory"));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::vector<std::string>> ListDir(const std::string& path) override {
    const int fd = resolver_->Open(path, O_RDONLY | O_DIRECTORY);
    DIR* dir = fd < 0 ? nullptr : ::fdopendir(fd);
    if (dir == nullptr) {
      const int open_errno = errno;
      if (fd >= 0) ::close(fd);
      errno = open_errno;
      return PosixError("list directory", path);
    }
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
    const PathResolver::Entry entry = resolver_->Locate(path);
    if (!entry.valid || ::unlinkat(entry.dirfd(), entry.name.c_str(), 0) != 0) {
      return PosixError("remove", path);
    }
    return absl::OkStatus();
  }

  absl::Status RenameFile(const std::string& from, const std::string& to) override {
    const PathResolver::Entry source = resolver_->Locate(from);
    if (!source.valid) return PosixError("rename", absl::StrCat(from, " to ", to));
    const PathResolver::Entry target = resolver_->Locate(to);
    if (!target.valid) return PosixError("rename", absl::StrCat(from, " to ", to));
    if (::renameat(source.dirfd(), source.name.c_str(), target.dirfd(), target.name.c_str()) != 0) {
      return ErrnoStatus(errno, absl::StrCat("rename ", from, " to ", to));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::unique_ptr<ReadOnlyRegion>> MapReadOnly(const std::string& path) override {
    ScopedFd fd(resolver_->Open(path, O_RDONLY));
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

  absl::StatusOr<std::unique_ptr<RandomAccessFile>> OpenRandomAccess(
      const std::string& path) override {
    const int fd = resolver_->Open(path, O_RDONLY);
    if (fd < 0) return PosixError("open", path);
    return std::make_unique<PosixRandomAccessFile>(fd, path);
  }

  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override {
    const int fd = resolver_->Open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) return PosixError("create", path);
    return std::make_unique<PosixWritableFile>(fd, path);
  }

  absl::StatusOr<std::unique_ptr<WritableFile>> NewDirectWritableFile(
      const std::string& path) override {
    const int fd = resolver_->Open(path, O_WRONLY | O_CREAT | O_TRUNC | O_DIRECT, 0644);
    if (fd < 0 && errno == EINVAL) return NewWritableFile(path);  // e.g. tmpfs
    if (fd < 0) return PosixError("create", path);
    return std::make_unique<PosixDirectFile>(fd, path);
  }

  absl::Status SyncDir(const std::string& path) override {
    ScopedFd fd(resolver_->Open(path, O_RDONLY | O_DIRECTORY));
    if (!fd.valid()) return PosixError("open directory", path);
    if (::fsync(fd.get()) != 0) return PosixError("fsync directory", path);
    return fd.Close(path);
  }

  bool IsDirectory(const std::string& path) override {
    absl::StatusOr<struct stat> st = Stat(path);
    return st.ok() && S_ISDIR(st->st_mode);
  }

  absl::Status RemoveDir(const std::string& path) override {
    const PathResolver::Entry entry = resolver_->Locate(path);
    if (!entry.valid || ::unlinkat(entry.dirfd(), entry.name.c_str(), AT_REMOVEDIR) != 0) {
      return PosixError("remove directory", path);
    }
    return absl::OkStatus();
  }

 private:
  // stat(2) of what `path` leads to (following a final symbolic link, as stat does).
  absl::StatusOr<struct stat> Stat(const std::string& path) const {
    ScopedFd fd(resolver_->Open(path, O_PATH));
    struct stat st;
    if (!fd.valid() || ::fstat(fd.get(), &st) != 0) return PosixError("stat", path);
    return st;
  }

  // Creates one directory; an existing entry is left for the caller's final check.
  absl::Status MakeDir(const std::string& path) const {
    const PathResolver::Entry entry = resolver_->Locate(path);
    if (!entry.valid) {
      // A missing parent is the caller's next error, and a confined root or one of its parents
      // exists already; a refused path is reported now.
      if (entry.fixed || errno == ENOENT) return absl::OkStatus();
      return PosixError("create directory", path);
    }
    if (::mkdirat(entry.dirfd(), entry.name.c_str(), 0755) != 0 && errno != EEXIST) {
      return PosixError("create directory", path);
    }
    return absl::OkStatus();
  }

  absl::Status WriteAndRename(const std::string& temp, const std::string& path,
                              std::string_view data) {
    const int fd = resolver_->Open(temp, O_WRONLY | O_CREAT | O_EXCL, 0644);
    if (fd < 0) return PosixError("create", temp);
    PosixWritableFile file(fd, temp);
    TY_RETURN_IF_ERROR(file.Append(data));
    TY_RETURN_IF_ERROR(file.Sync());
    TY_RETURN_IF_ERROR(file.Close());
    TY_RETURN_IF_ERROR(RenameFile(temp, path));
    return SyncDir(Dirname(path));
  }

  const std::unique_ptr<PathResolver> resolver_;
};

}  // namespace

std::string ChildPath(const std::string& dir, const std::string& name) {
  if (dir.empty()) return name;
  if (dir.back() == '/') return dir + name;
  return absl::StrCat(dir, "/", name);
}

std::string Dirname(const std::string& path) {
  size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::unique_ptr<RandomAccessFile> RandomAccessFromRegion(std::unique_ptr<ReadOnlyRegion> region,
                                                         std::string path) {
  class MappedFile : public RandomAccessFile {
   public:
    MappedFile(std::unique_ptr<ReadOnlyRegion> region, std::string path)
        : region_(std::move(region)), path_(std::move(path)) {}
    absl::Status ReadAt(uint64_t offset, size_t length, void* dst) const override {
      if (offset > region_->size() || length > region_->size() - offset) {
        return absl::DataLossError(
            absl::StrCat("read ", path_, ": the file ends before byte ", offset + length));
      }
      if (length > 0) std::memcpy(dst, region_->data() + offset, length);
      return absl::OkStatus();
    }

   private:
    const std::unique_ptr<ReadOnlyRegion> region_;
    const std::string path_;
  };
  return std::make_unique<MappedFile>(std::move(region), std::move(path));
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
  static FileSystem* fs = new PosixFileSystem(std::make_unique<PlainResolver>());
  return fs;
}

std::unique_ptr<FileSystem> NewConfinedFileSystem(const std::vector<std::string>& roots,
                                                  bool use_openat2) {
  return std::make_unique<PosixFileSystem>(std::make_unique<ConfinedResolver>(roots, use_openat2));
}

}  // namespace trainyard
