// FakeFileSystem: the in-memory FileSystem declared in common/filesystem.h.
#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/filesystem.h"
#include "common/status.h"

namespace trainyard {
namespace {

std::string Normalize(const std::string& path) {
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  return p;
}

// "" stands for the current directory, the parent of a path without a slash.
std::string Parent(const std::string& path) {
  size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return "";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

// The name of `entry` inside directory `dir` if it is a direct child, else nothing.
std::optional<std::string> ChildName(const std::string& dir, const std::string& entry) {
  if (entry == dir || Parent(entry) != (dir == "." ? "" : dir)) return std::nullopt;
  size_t slash = entry.find_last_of('/');
  return slash == std::string::npos ? entry : entry.substr(slash + 1);
}

bool HasPrefixDir(const std::string& path, const std::string& dir) {
  return path.size() > dir.size() && path.compare(0, dir.size(), dir) == 0 &&
         path[dir.size()] == '/';
}

absl::Status NoSuchFile(const char* operation, const std::string& path) {
  return absl::NotFoundError(absl::StrCat(operation, " ", path, ": No such file or directory"));
}

absl::Status IsADirectory(const char* operation, const std::string& path) {
  return absl::FailedPreconditionError(absl::StrCat(operation, " ", path, ": Is a directory"));
}

absl::Status FileIsClosed(const char* operation, const std::string& path) {
  return absl::FailedPreconditionError(absl::StrCat(operation, " ", path, ": file is closed"));
}

// Writes into the file's inode under the filesystem's mutex, so it keeps writing to the same file
// after a rename, as a POSIX descriptor does.
class FakeWritableFile : public WritableFile {
 public:
  FakeWritableFile(absl::Mutex* mu, std::shared_ptr<std::string> inode, std::string path)
      : mu_(mu), inode_(std::move(inode)), path_(std::move(path)) {}

  absl::Status Append(std::string_view data) override {
    if (closed_) return FileIsClosed("write", path_);
    absl::MutexLock lock(mu_);
    inode_->append(data);
    return absl::OkStatus();
  }
  absl::Status Sync() override { return closed_ ? FileIsClosed("fsync", path_) : absl::OkStatus(); }
  absl::Status Close() override {
    if (closed_) return FileIsClosed("close", path_);
    closed_ = true;
    return absl::OkStatus();
  }

 private:
  absl::Mutex* const mu_;
  const std::shared_ptr<std::string> inode_;  // guarded by *mu_
  const std::string path_;
  bool closed_ = false;
};

}  // namespace

bool FakeFileSystem::IsDirLocked(const std::string& path) const {
  return path.empty() || path == "/" || path == "." || dirs_.count(path) > 0;
}

absl::Status FakeFileSystem::CheckParentLocked(const std::string& path) const {
  const std::string parent = Parent(path);
  if (IsDirLocked(parent)) return absl::OkStatus();
  if (files_.count(parent) > 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("write ", path, ": parent ", parent, " is not a directory"));
  }
  return NoSuchFile("write", path);
}

absl::StatusOr<std::string> FakeFileSystem::ReadFile(const std::string& path) {
  const std::string p = Normalize(path);
  absl::MutexLock lock(&mu_);
  auto it = files_.find(p);
  if (it != files_.end()) return *it->second;
  if (IsDirLocked(p)) return IsADirectory("read", path);
  return NoSuchFile("open", path);
}

absl::Status FakeFileSystem::WriteFileAtomic(const std::string& path, std::string_view data) {
  const std::string p = Normalize(path);
  absl::MutexLock lock(&mu_);
  if (IsDirLocked(p)) return IsADirectory("write", path);
  TY_RETURN_IF_ERROR(CheckParentLocked(p));
  // A new inode, as rename(2) would give: a writer still open on the old file keeps writing there.
  files_[p] = std::make_shared<std::string>(data);
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> FakeFileSystem::FileSize(const std::string& path) {
  const std::string p = Normalize(path);
  absl::MutexLock lock(&mu_);
  auto it = files_.find(p);
  if (it != files_.end()) return static_cast<uint64_t>(it->second->size());
  if (IsDirLocked(p)) return IsADirectory("size of", path);
  return NoSuchFile("stat", path);
}

bool FakeFileSystem::Exists(const std::string& path) {
  const std::string p = Normalize(path);
  absl::MutexLock lock(&mu_);
  return files_.count(p) > 0 || IsDirLocked(p);
}

absl::Status FakeFileSystem::CreateDirs(const std::string& path) {
  if (path.empty()) return absl::InvalidArgumentError("create directory: empty path");
  const std::string p = Normalize(path);
  absl::MutexLock lock(&mu_);
  for (std::string dir = p; !IsDirLocked(dir); dir = Parent(dir)) {
    if (files_.count(dir) > 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("create directory ", dir, ": exists and is not a directory"));
    }
  }
  for (std::string dir = p; !IsDirLocked(dir); dir = Parent(dir)) dirs_.insert(dir);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> FakeFileSystem::ListDir(const std::string& path) {
  const std::string p = Normalize(path);
  absl::MutexLock lock(&mu_);
  if (!IsDirLocked(p)) {
    if (files_.count(p) > 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("list directory ", path, ": Not a directory"));
    }
    return NoSuchFile("list directory", path);
  }
  std::set<std::string> names;
  for (const auto& [file, unused] : files_) {
    if (auto name = ChildName(p, file)) names.insert(*name);
  }
  for (const std::string& dir : dirs_) {
    if (auto name = ChildName(p, dir)) names.insert(*name);
  }
  return std::vector<std::string>(names.begin(), names.end());
}

absl::Status FakeFileSystem::RemoveFile(const std::string& path) {
  const std::string p = Normalize(path);
  absl::MutexLock lock(&mu_);
  if (files_.erase(p) > 0) return absl::OkStatus();
  if (IsDirLocked(p)) return IsADirectory("remove", path);
  return NoSuchFile("remove", path);
}

absl::Status FakeFileSystem::RenameFile(const std::string& from, const std::string& to) {
  const std::string src = Normalize(from);
  const std::string dst = Normalize(to);
  absl::MutexLock lock(&mu_);
  const std::string what = absl::StrCat("rename ", from, " to ", to);
  if (src == dst) return absl::OkStatus();
  if (!IsDirLocked(Parent(dst)))
    return absl::NotFoundError(absl::StrCat(what, ": no such directory"));
  auto file = files_.find(src);
  if (file != files_.end()) {
    if (IsDirLocked(dst)) return IsADirectory("rename to", to);
    std::shared_ptr<std::string> data = std::move(file->second);
    files_.erase(file);
    files_[dst] = std::move(data);
    return absl::OkStatus();
  }
  if (dirs_.count(src) == 0)
    return absl::NotFoundError(absl::StrCat(what, ": No such file or directory"));
  if (files_.count(dst) > 0 || HasPrefixDir(dst, src)) {
    return absl::FailedPreconditionError(absl::StrCat(what, ": invalid destination"));
  }
  for (const auto& [f, unused] : files_) {
    if (HasPrefixDir(f, dst))
      return absl::FailedPreconditionError(absl::StrCat(what, ": destination not empty"));
  }
  for (const std::string& d : dirs_) {
    if (HasPrefixDir(d, dst))
      return absl::FailedPreconditionError(absl::StrCat(what, ": destination not empty"));
  }
  auto moved = [&](const std::string& entry) { return dst + entry.substr(src.size()); };
  std::map<std::string, std::shared_ptr<std::string>> files;
  for (auto& [f, data] : files_) files[HasPrefixDir(f, src) ? moved(f) : f] = std::move(data);
  std::set<std::string> dirs;
  for (const std::string& d : dirs_) dirs.insert(d == src || HasPrefixDir(d, src) ? moved(d) : d);
  files_ = std::move(files);
  dirs_ = std::move(dirs);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ReadOnlyRegion>> FakeFileSystem::MapReadOnly(
    const std::string& path) {
  TY_ASSIGN_OR_RETURN(std::string bytes, ReadFile(path));
  return RegionHolding(std::move(bytes));
}

absl::StatusOr<std::unique_ptr<WritableFile>> FakeFileSystem::NewWritableFile(
    const std::string& path) {
  const std::string p = Normalize(path);
  absl::MutexLock lock(&mu_);
  if (IsDirLocked(p)) return IsADirectory("create", path);
  TY_RETURN_IF_ERROR(CheckParentLocked(p));
  std::shared_ptr<std::string>& inode = files_[p];
  // O_TRUNC keeps the inode: another writer open on it sees the truncation.
  if (inode == nullptr) {
    inode = std::make_shared<std::string>();
  } else {
    inode->clear();
  }
  return std::make_unique<FakeWritableFile>(&mu_, inode, path);
}

absl::Status FakeFileSystem::SyncDir(const std::string& path) {
  const std::string p = Normalize(path);
  absl::MutexLock lock(&mu_);
  if (IsDirLocked(p)) return absl::OkStatus();
  if (files_.count(p) > 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("sync directory ", path, ": Not a directory"));
  }
  return NoSuchFile("sync directory", path);
}

bool FakeFileSystem::IsDirectory(const std::string& path) {
  const std::string p = Normalize(path);
  absl::MutexLock lock(&mu_);
  return IsDirLocked(p);
}

absl::Status FakeFileSystem::RemoveDir(const std::string& path) {
  const std::string p = Normalize(path);
  absl::MutexLock lock(&mu_);
  if (dirs_.count(p) == 0) {
    if (IsDirLocked(p)) {
      return absl::FailedPreconditionError(
          absl::StrCat("remove directory ", path, ": cannot remove the root"));
    }
    if (files_.count(p) > 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("remove directory ", path, ": Not a directory"));
    }
    return NoSuchFile("remove directory", path);
  }
  const auto inside = [&p](const std::string& entry) { return HasPrefixDir(entry, p); };
  if (std::any_of(files_.begin(), files_.end(), [&](const auto& f) { return inside(f.first); }) ||
      std::any_of(dirs_.begin(), dirs_.end(), inside)) {
    return absl::FailedPreconditionError(
        absl::StrCat("remove directory ", path, ": Directory not empty"));
  }
  dirs_.erase(p);
  return absl::OkStatus();
}

}  // namespace trainyard
