// FaultInjectionFileSystem: see common/fault_injection_filesystem.h for the model.
#include "common/fault_injection_filesystem.h"

#include <algorithm>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "common/logging.h"
#include "common/status.h"

namespace trainyard {
namespace fault_injection_internal {

struct Node {
  explicit Node(bool directory) : is_dir(directory) {}

  const bool is_dir;
  bool unreadable = false;
  // A file's contents: what readers see, and what the last Sync made durable.
  std::string data;
  std::string durable_data;
  // A directory's entries: what lookups see, and what the last SyncDir made durable.
  std::map<std::string, std::shared_ptr<Node>> entries;
  std::map<std::string, std::shared_ptr<Node>> durable_entries;
};

// Where a path leads: `node` is null when the last component does not exist; `parent` is null
// for the root.
struct Located {
  std::shared_ptr<Node> parent;
  std::string name;
  std::shared_ptr<Node> node;
};

}  // namespace fault_injection_internal

using fault_injection_internal::Located;
using fault_injection_internal::Node;

namespace {

absl::Status Failure(absl::StatusCode code, const char* operation, const std::string& path,
                     absl::string_view reason) {
  return absl::Status(code, absl::StrCat(operation, " ", path, ": ", reason));
}

absl::Status NoSuchFile(const char* operation, const std::string& path) {
  return Failure(absl::StatusCode::kNotFound, operation, path, "No such file or directory");
}

absl::Status Precondition(const char* operation, const std::string& path, absl::string_view why) {
  return Failure(absl::StatusCode::kFailedPrecondition, operation, path, why);
}

absl::StatusOr<std::vector<std::string>> SplitPath(const char* operation, const std::string& path) {
  std::vector<std::string> parts;
  for (absl::string_view part : absl::StrSplit(path, '/')) {
    if (part.empty() || part == ".") continue;
    if (part == "..") {
      return Failure(absl::StatusCode::kInvalidArgument, operation, path, "\"..\" not supported");
    }
    parts.emplace_back(part);
  }
  return parts;
}

// "" (the root, for this filesystem) for a path without a slash.
std::string ParentPath(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return "";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

// `dir` and everything under it become durable as they are now (used at construction).
void MakeTreeDurable(Node& dir) {
  dir.durable_entries = dir.entries;
  for (auto& [name, child] : dir.entries) {
    if (child->is_dir) {
      MakeTreeDurable(*child);
    } else {
      child->durable_data = child->data;
    }
  }
}

// The crash: volatile views become the durable ones, walking durable entries. A directory that
// is durably reachable under two names (a rename synced only at its destination) keeps the first
// one walked, so the tree stays a tree.
void RestoreDurable(Node& dir, std::set<const Node*>& seen_dirs) {
  dir.entries.clear();
  for (auto& [name, child] : dir.durable_entries) {
    if (child->is_dir) {
      if (!seen_dirs.insert(child.get()).second) continue;
      RestoreDurable(*child, seen_dirs);
    } else {
      child->data = child->durable_data;
    }
    dir.entries[name] = child;
  }
  dir.durable_entries = dir.entries;
}

}  // namespace

namespace fault_injection_internal {

// A writer on one inode. Its calls are mutating operations of the filesystem, counted and faulted
// like the others.
class FaultInjectionWritableFile : public WritableFile {
 public:
  FaultInjectionWritableFile(FaultInjectionFileSystem* fs, std::shared_ptr<Node> inode,
                             std::string path, int64_t generation)
      : fs_(fs), inode_(std::move(inode)), path_(std::move(path)), generation_(generation) {}

  absl::Status Append(std::string_view data) override {
    absl::MutexLock lock(&fs_->mu_);
    TY_RETURN_IF_ERROR(StartLocked("write"));
    inode_->data.append(data);
    return absl::OkStatus();
  }

  absl::Status Sync() override {
    absl::MutexLock lock(&fs_->mu_);
    TY_RETURN_IF_ERROR(StartLocked("fsync"));
    inode_->durable_data = inode_->data;
    return absl::OkStatus();
  }

  absl::Status Close() override {
    absl::MutexLock lock(&fs_->mu_);
    TY_RETURN_IF_ERROR(StartLocked("close"));
    closed_ = true;
    return absl::OkStatus();
  }

 private:
  absl::Status StartLocked(const char* operation) ABSL_EXCLUSIVE_LOCKS_REQUIRED(fs_->mu_) {
    TY_RETURN_IF_ERROR(fs_->BeginMutatingOpLocked(operation, path_));
    if (closed_) return Precondition(operation, path_, "file is closed");
    if (generation_ != fs_->generation_) {
      return Precondition(operation, path_, "file was opened before a simulated crash");
    }
    return absl::OkStatus();
  }

  FaultInjectionFileSystem* const fs_;
  const std::shared_ptr<Node> inode_;  // guarded by fs_->mu_
  const std::string path_;
  const int64_t generation_;
  bool closed_ = false;
};

}  // namespace fault_injection_internal

using fault_injection_internal::FaultInjectionWritableFile;

FaultInjectionFileSystem::FaultInjectionFileSystem(const std::vector<std::string>& durable_dirs)
    : root_(std::make_shared<Node>(/*directory=*/true)) {
  absl::MutexLock lock(&mu_);
  for (const std::string& dir : durable_dirs) {
    const absl::Status created = CreateDirsLocked(dir);
    TY_CHECK(created.ok()) << created;
  }
  MakeTreeDurable(*root_);
}

FaultInjectionFileSystem::~FaultInjectionFileSystem() = default;

absl::Status FaultInjectionFileSystem::BeginMutatingOpLocked(const char* operation,
                                                             const std::string& path) {
  const int64_t index = ops_++;
  if (crashed_) return Failure(absl::StatusCode::kAborted, operation, path, "simulated crash");
  auto due = faults_.find(index);
  if (due == faults_.end()) return absl::OkStatus();
  const Fault fault = due->second;
  faults_.erase(due);
  switch (fault) {
    case Fault::kCrash:
      crashed_ = true;
      return Failure(absl::StatusCode::kAborted, operation, path, "simulated crash");
    case Fault::kNoSpace:
      return Failure(absl::StatusCode::kResourceExhausted, operation, path,
                     "No space left on device");
    case Fault::kIoError:
      return Failure(absl::StatusCode::kDataLoss, operation, path, "Input/output error");
  }
  return Failure(absl::StatusCode::kInternal, operation, path, "unknown fault");
}

absl::StatusOr<Located> FaultInjectionFileSystem::LocateLocked(const char* operation,
                                                               const std::string& path) const {
  TY_ASSIGN_OR_RETURN(std::vector<std::string> parts, SplitPath(operation, path));
  if (parts.empty()) return Located{nullptr, "", root_};
  std::shared_ptr<Node> dir = root_;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    auto entry = dir->entries.find(parts[i]);
    if (entry == dir->entries.end()) return NoSuchFile(operation, path);
    if (!entry->second->is_dir) return Precondition(operation, path, "Not a directory");
    dir = entry->second;
  }
  auto entry = dir->entries.find(parts.back());
  std::shared_ptr<Node> node = entry == dir->entries.end() ? nullptr : entry->second;
  return Located{std::move(dir), parts.back(), std::move(node)};
}

absl::StatusOr<std::shared_ptr<Node>> FaultInjectionFileSystem::FileLocked(
    const char* operation, const std::string& path) const {
  TY_ASSIGN_OR_RETURN(Located at, LocateLocked(operation, path));
  if (at.node == nullptr) return NoSuchFile(operation, path);
  if (at.node->is_dir) return Precondition(operation, path, "Is a directory");
  return at.node;
}

absl::StatusOr<std::string> FaultInjectionFileSystem::ReadFile(const std::string& path) {
  absl::MutexLock lock(&mu_);
  TY_ASSIGN_OR_RETURN(std::shared_ptr<Node> file, FileLocked("open", path));
  if (file->unreadable) {
    return Failure(absl::StatusCode::kPermissionDenied, "open", path, "Permission denied");
  }
  return file->data;
}

absl::StatusOr<std::unique_ptr<ReadOnlyRegion>> FaultInjectionFileSystem::MapReadOnly(
    const std::string& path) {
  TY_ASSIGN_OR_RETURN(std::string bytes, ReadFile(path));
  return RegionHolding(std::move(bytes));
}

absl::StatusOr<uint64_t> FaultInjectionFileSystem::FileSize(const std::string& path) {
  absl::MutexLock lock(&mu_);
  TY_ASSIGN_OR_RETURN(std::shared_ptr<Node> file, FileLocked("stat", path));
  return static_cast<uint64_t>(file->data.size());
}

bool FaultInjectionFileSystem::Exists(const std::string& path) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Located> at = LocateLocked("stat", path);
  return at.ok() && at->node != nullptr;
}

bool FaultInjectionFileSystem::IsDirectory(const std::string& path) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Located> at = LocateLocked("stat", path);
  return at.ok() && at->node != nullptr && at->node->is_dir;
}

absl::StatusOr<std::vector<std::string>> FaultInjectionFileSystem::ListDir(
    const std::string& path) {
  absl::MutexLock lock(&mu_);
  TY_ASSIGN_OR_RETURN(Located at, LocateLocked("list directory", path));
  if (at.node == nullptr) return NoSuchFile("list directory", path);
  if (!at.node->is_dir) return Precondition("list directory", path, "Not a directory");
  if (at.node->unreadable) {
    return Failure(absl::StatusCode::kPermissionDenied, "list directory", path,
                   "Permission denied");
  }
  std::vector<std::string> names;
  for (const auto& [name, unused] : at.node->entries) names.push_back(name);
  return names;
}

absl::Status FaultInjectionFileSystem::CreateDirs(const std::string& path) {
  absl::MutexLock lock(&mu_);
  TY_RETURN_IF_ERROR(BeginMutatingOpLocked("create directory", path));
  return CreateDirsLocked(path);
}

absl::Status FaultInjectionFileSystem::CreateDirsLocked(const std::string& path) {
  if (path.empty()) return absl::InvalidArgumentError("create directory: empty path");
  TY_ASSIGN_OR_RETURN(std::vector<std::string> parts, SplitPath("create directory", path));
  std::shared_ptr<Node> dir = root_;
  for (const std::string& part : parts) {
    std::shared_ptr<Node>& child = dir->entries[part];
    if (child == nullptr) child = std::make_shared<Node>(/*directory=*/true);
    if (!child->is_dir) return Precondition("create directory", path, "Not a directory");
    dir = child;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<WritableFile>> FaultInjectionFileSystem::NewWritableFile(
    const std::string& path) {
  absl::MutexLock lock(&mu_);
  TY_RETURN_IF_ERROR(BeginMutatingOpLocked("create", path));
  TY_ASSIGN_OR_RETURN(Located at, LocateLocked("create", path));
  if (at.node != nullptr && at.node->is_dir) return Precondition("create", path, "Is a directory");
  if (at.node == nullptr) {
    at.node = std::make_shared<Node>(/*directory=*/false);
    at.parent->entries[at.name] = at.node;
  } else {
    at.node->data.clear();  // O_TRUNC on the same inode; durable only at the next Sync
  }
  return std::make_unique<FaultInjectionWritableFile>(this, at.node, path, generation_);
}

absl::Status FaultInjectionFileSystem::SyncDir(const std::string& path) {
  absl::MutexLock lock(&mu_);
  TY_RETURN_IF_ERROR(BeginMutatingOpLocked("sync directory", path));
  TY_ASSIGN_OR_RETURN(Located at, LocateLocked("sync directory", path));
  if (at.node == nullptr) return NoSuchFile("sync directory", path);
  if (!at.node->is_dir) return Precondition("sync directory", path, "Not a directory");
  at.node->durable_entries = at.node->entries;
  return absl::OkStatus();
}

absl::Status FaultInjectionFileSystem::RemoveFile(const std::string& path) {
  absl::MutexLock lock(&mu_);
  TY_RETURN_IF_ERROR(BeginMutatingOpLocked("remove", path));
  TY_ASSIGN_OR_RETURN(Located at, LocateLocked("remove", path));
  if (at.node == nullptr) return NoSuchFile("remove", path);
  if (at.node->is_dir) return Precondition("remove", path, "Is a directory");
  at.parent->entries.erase(at.name);
  return absl::OkStatus();
}

absl::Status FaultInjectionFileSystem::RemoveDir(const std::string& path) {
  absl::MutexLock lock(&mu_);
  TY_RETURN_IF_ERROR(BeginMutatingOpLocked("remove directory", path));
  TY_ASSIGN_OR_RETURN(Located at, LocateLocked("remove directory", path));
  if (at.node == nullptr) return NoSuchFile("remove directory", path);
  if (!at.node->is_dir) return Precondition("remove directory", path, "Not a directory");
  if (at.parent == nullptr) return Precondition("remove directory", path, "is the root");
  if (!at.node->entries.empty())
    return Precondition("remove directory", path, "Directory not empty");
  at.parent->entries.erase(at.name);
  return absl::OkStatus();
}

absl::Status FaultInjectionFileSystem::RenameFile(const std::string& from, const std::string& to) {
  absl::MutexLock lock(&mu_);
  TY_RETURN_IF_ERROR(BeginMutatingOpLocked("rename", absl::StrCat(from, " to ", to)));
  return RenameLocked(from, to);
}

absl::Status FaultInjectionFileSystem::RenameLocked(const std::string& from,
                                                    const std::string& to) {
  const std::string what = absl::StrCat(from, " to ", to);
  TY_ASSIGN_OR_RETURN(Located src, LocateLocked("rename", from));
  TY_ASSIGN_OR_RETURN(Located dst, LocateLocked("rename", to));
  if (src.node == nullptr) return NoSuchFile("rename", what);
  if (src.parent == nullptr || dst.parent == nullptr) {
    return Precondition("rename", what, "cannot rename the root");
  }
  if (src.node == dst.node) return absl::OkStatus();  // the same file: nothing to do
  if (dst.node != nullptr) {
    if (!src.node->is_dir && dst.node->is_dir)
      return Precondition("rename", what, "Is a directory");
    if (src.node->is_dir && !dst.node->is_dir) {
      return Precondition("rename", what, "Not a directory");
    }
    if (dst.node->is_dir && !dst.node->entries.empty()) {
      return Precondition("rename", what, "Directory not empty");
    }
  }
  if (src.node->is_dir) {
    TY_ASSIGN_OR_RETURN(std::vector<std::string> src_parts, SplitPath("rename", from));
    TY_ASSIGN_OR_RETURN(std::vector<std::string> dst_parts, SplitPath("rename", to));
    if (dst_parts.size() > src_parts.size() &&
        std::equal(src_parts.begin(), src_parts.end(), dst_parts.begin())) {
      return Precondition("rename", what, "destination is inside the source");
    }
  }
  dst.parent->entries[dst.name] = src.node;
  src.parent->entries.erase(src.name);
  return absl::OkStatus();
}

absl::Status FaultInjectionFileSystem::WriteFileAtomic(const std::string& path,
                                                       std::string_view data) {
  std::string temp;
  {
    absl::MutexLock lock(&mu_);
    temp = absl::StrCat(path, ".tmp.", next_temp_++);
  }
  absl::Status status = [&]() -> absl::Status {
    TY_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, NewWritableFile(temp));
    TY_RETURN_IF_ERROR(file->Append(data));
    TY_RETURN_IF_ERROR(file->Sync());
    TY_RETURN_IF_ERROR(file->Close());
    TY_RETURN_IF_ERROR(RenameFile(temp, path));
    return SyncDir(ParentPath(path));
  }();
  // Best effort, as the POSIX version's unlink: the temporary may not exist, and the first error
  // is the one to report.
  if (!status.ok()) RemoveFile(temp).IgnoreError();
  return status;
}

void FaultInjectionFileSystem::SimulateCrash() {
  absl::MutexLock lock(&mu_);
  ++generation_;
  std::set<const Node*> seen_dirs = {root_.get()};
  RestoreDurable(*root_, seen_dirs);
}

void FaultInjectionFileSystem::FailAt(int64_t op_index, Fault fault) {
  absl::MutexLock lock(&mu_);
  faults_[op_index] = fault;
}

void FaultInjectionFileSystem::ClearFaults() {
  absl::MutexLock lock(&mu_);
  faults_.clear();
  crashed_ = false;
}

int64_t FaultInjectionFileSystem::mutating_ops() const {
  absl::MutexLock lock(&mu_);
  return ops_;
}

absl::Status FaultInjectionFileSystem::CorruptByte(const std::string& path, uint64_t offset) {
  absl::MutexLock lock(&mu_);
  TY_ASSIGN_OR_RETURN(std::shared_ptr<Node> file, FileLocked("corrupt", path));
  bool flipped = false;
  for (std::string* view : {&file->data, &file->durable_data}) {
    if (offset < view->size()) {
      (*view)[offset] = static_cast<char>((*view)[offset] ^ 1);
      flipped = true;
    }
  }
  if (flipped) return absl::OkStatus();
  return Failure(absl::StatusCode::kOutOfRange, "corrupt", path,
                 absl::StrCat("offset ", offset, " is past the end"));
}

absl::Status FaultInjectionFileSystem::Truncate(const std::string& path, uint64_t size) {
  absl::MutexLock lock(&mu_);
  TY_ASSIGN_OR_RETURN(std::shared_ptr<Node> file, FileLocked("truncate", path));
  if (size > file->data.size()) {
    return Failure(absl::StatusCode::kOutOfRange, "truncate", path,
                   absl::StrCat("file has only ", file->data.size(), " bytes, not ", size));
  }
  file->data.resize(size);
  if (file->durable_data.size() > size) file->durable_data.resize(size);
  return absl::OkStatus();
}

absl::Status FaultInjectionFileSystem::SetUnreadable(const std::string& path, bool unreadable) {
  absl::MutexLock lock(&mu_);
  TY_ASSIGN_OR_RETURN(Located at, LocateLocked("chmod", path));
  if (at.node == nullptr) return NoSuchFile("chmod", path);
  at.node->unreadable = unreadable;
  return absl::OkStatus();
}

}  // namespace trainyard
