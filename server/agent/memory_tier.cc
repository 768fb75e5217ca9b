#include "server/agent/memory_tier.h"

#include <sys/vfs.h>

#include <algorithm>
#include <functional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/logging.h"
#include "common/status.h"

namespace trainyard::server::agent {
namespace {

std::string Mib(int64_t bytes) { return absl::StrFormat("%.1f MiB", bytes / 1048576.0); }

}  // namespace

MemoryTier::MemoryTier(FileSystem* fs, std::string root, int64_t budget_bytes, std::string node_id)
    : fs_(fs), root_(std::move(root)), budget_(budget_bytes), node_id_(std::move(node_id)) {}

absl::Status MemoryTier::Start() {
  if (fs_->Exists(root_)) {
    // Workers of the last agent that still run (adopted by this one) may be writing into it:
    // what cannot be removed now goes when its job ends (Release).
    if (absl::Status removed = RemoveRecursively(*fs_, root_); !removed.ok()) {
      TY_LOG(WARNING) << "memory tier " << root_
                      << " not cleared completely: " << removed.message();
    }
  }
  return Annotate(fs_->CreateDirs(root_), absl::StrCat("creating the memory tier ", root_));
}

int64_t MemoryTier::reserved_bytes() const {
  absl::MutexLock lock(&mu_);
  return UsedLocked();
}

int64_t MemoryTier::UsedLocked() const {
  int64_t total = 0;
  for (const auto& [key, bytes] : reserved_) total += bytes;
  for (const auto& [job, all] : snapshots_) {
    for (const auto& [id, s] : all) total += s.gathered_bytes;
  }
  return total;
}

// The newest attempt with a rank's snapshot complete among `all` (0: none).
int MemoryTier::NewestAttempt(const std::map<MemorySnapshotId, Snapshot>& all) {
  int newest = 0;
  for (const auto& [id, s] : all) {
    if (!s.ranks.empty()) newest = std::max(newest, id.attempt);
  }
  return newest;
}

int64_t MemoryTier::SizeOf(const std::string& job_id, const std::string& snapshot,
                           const std::vector<std::string>& files) const {
  int64_t bytes = 0;
  for (const std::string& file : files) {
    absl::StatusOr<uint64_t> size =
        fs_->FileSize(absl::StrCat(JobDir(job_id), "/", snapshot, "/", file));
    if (size.ok()) bytes += static_cast<int64_t>(*size);
  }
  return bytes;
}

std::string MemoryTier::JobDir(const std::string& job_id) const {
  return absl::StrCat(root_, "/", job_id);
}

absl::StatusOr<std::string> MemoryTier::Reserve(const std::string& job_id, int rank, int64_t bytes,
                                                bool peer_copy, const std::string& from_node) {
  if (!IsPlainTierName(job_id)) {
    return absl::InvalidArgumentError(absl::StrCat("bad job id '", job_id, "'"));
  }
  if (rank < 0 || bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad reservation: rank ", rank, ", ", bytes, " bytes"));
  }
  const std::string dir = JobDir(job_id);
  absl::MutexLock lock(&mu_);
  const Key key{job_id, rank, peer_copy};
  auto replaced = reserved_.find(key);
  const int64_t others = UsedLocked() - (replaced == reserved_.end() ? 0 : replaced->second);
  const int64_t wanted = kSlots * bytes;
  if (others + wanted > budget_) {
    const std::string what = peer_copy ? absl::StrCat("a copy of rank ", rank, " from ", from_node)
                                       : absl::StrCat("rank ", rank);
    std::string message = absl::StrCat(
        "memory tier of ", node_id_, " refused ", what, ": ", kSlots, " snapshots of ", Mib(bytes),
        " need ", Mib(wanted), ", ", Mib(std::max<int64_t>(0, budget_ - others)), " of its ",
        Mib(budget_), " budget are free (the agent's --memory-tier-mb)");
    notices_.emplace_back(job_id, message);
    return absl::ResourceExhaustedError(std::move(message));
  }
  TY_RETURN_IF_ERROR(fs_->CreateDirs(dir));
  reserved_[key] = wanted;
  return dir;
}

absl::StatusOr<bool> MemoryTier::Committed(const std::string& job_id, int rank, int world,
                                           const std::string& snapshot, int64_t step,
                                           std::vector<std::string> files, bool copy) {
  const std::optional<MemorySnapshotId> id = ParseMemorySnapshotName(snapshot);
  if (!IsPlainTierName(job_id) || !id || world < 1 || rank >= world) {
    return absl::InvalidArgumentError(absl::StrCat("bad snapshot '", job_id, "/", snapshot, "'"));
  }
  for (const std::string& file : files) {
    if (!IsPlainTierName(file)) {
      return absl::InvalidArgumentError(absl::StrCat("bad file name '", file, "'"));
    }
  }
  const int64_t bytes = SizeOf(job_id, snapshot, files);
  absl::MutexLock lock(&mu_);
  auto reservation = reserved_.find(Key{job_id, rank, false});
  if (reservation == reserved_.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("no memory tier reservation for rank ", rank, " of job ", job_id));
  }
  Snapshot& s = snapshots_[job_id][*id];
  s.world = world;
  s.ranks[rank] = {files, bytes};
  s.copied = s.copied || copy;
  PruneLocked(job_id);
  auto peer = peers_.find(job_id);
  if (!copy || peer == peers_.end() || peer->second.empty()) return false;
  // A newer snapshot of the same rank supersedes a queued one.
  std::erase_if(copies_, [&](const PeerCopy& c) { return c.job_id == job_id && c.rank == rank; });
  copies_.push_back({.job_id = job_id,
                     .peer_address = peer->second,
                     .snapshot = snapshot,
                     .rank = rank,
                     .world = world,
                     .step = step,
                     .bytes = reservation->second / kSlots,
                     .files = std::move(files)});
  return true;
}

bool MemoryTier::CopyPending(const std::string& job_id, int rank) const {
  absl::MutexLock lock(&mu_);
  return sending_.contains({job_id, rank}) ||
         std::any_of(copies_.begin(), copies_.end(),
                     [&](const PeerCopy& c) { return c.job_id == job_id && c.rank == rank; });
}

absl::Status MemoryTier::BeginCopy(const std::string& job_id, int rank,
                                   const std::string& snapshot) {
  const std::optional<MemorySnapshotId> id = ParseMemorySnapshotName(snapshot);
  if (!IsPlainTierName(job_id) || !id) {
    return absl::InvalidArgumentError(absl::StrCat("bad copy '", job_id, "/", snapshot, "'"));
  }
  absl::MutexLock lock(&mu_);
  if (!reserved_.contains(Key{job_id, rank, true})) {
    return absl::FailedPreconditionError(
        absl::StrCat("no reservation for copies of rank ", rank, " of job ", job_id));
  }
  TY_RETURN_IF_ERROR(fs_->CreateDirs(absl::StrCat(JobDir(job_id), "/", snapshot)));
  ++snapshots_[job_id][*id].pins;
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<WritableFile>> MemoryTier::OpenReceived(const std::string& job_id,
                                                                       const std::string& snapshot,
                                                                       const std::string& file) {
  if (!IsPlainTierName(job_id) || !ParseMemorySnapshotName(snapshot) || !IsPlainTierName(file)) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad copy '", job_id, "/", snapshot, "/", file, "'"));
  }
  return fs_->NewWritableFile(absl::StrCat(JobDir(job_id), "/", snapshot, "/", file));
}

void MemoryTier::EndCopy(const std::string& job_id, int rank, int world,
                         const std::string& snapshot, std::optional<RankFiles> complete) {
  absl::MutexLock lock(&mu_);
  Snapshot* s = FindLocked(job_id, snapshot);
  if (s == nullptr) return;  // released meanwhile
  if (complete && world > 0 && rank >= 0 && rank < world) {
    s->world = world;
    s->ranks[rank] = std::move(*complete);
    s->copied = true;
  }
  UnpinLocked(job_id, snapshot);
}

MemoryTier::Snapshot* MemoryTier::FindLocked(const std::string& job_id,
                                             const std::string& snapshot) {
  const std::optional<MemorySnapshotId> id = ParseMemorySnapshotName(snapshot);
  auto job = snapshots_.find(job_id);
  if (!id || job == snapshots_.end()) return nullptr;
  auto s = job->second.find(*id);
  return s == job->second.end() ? nullptr : &s->second;
}

void MemoryTier::UnpinLocked(const std::string& job_id, const std::string& snapshot) {
  Snapshot* s = FindLocked(job_id, snapshot);
  if (s == nullptr) return;
  --s->pins;
  PruneLocked(job_id);
}

std::vector<HeldSnapshot> MemoryTier::Held(const std::string& job_id) const {
  std::vector<HeldSnapshot> held;
  absl::MutexLock lock(&mu_);
  auto job = snapshots_.find(job_id);
  if (job == snapshots_.end()) return held;
  for (auto it = job->second.rbegin(); it != job->second.rend(); ++it) {
    if (it->second.ranks.empty()) continue;
    HeldSnapshot& h = held.emplace_back(HeldSnapshot{.id = it->first, .world = it->second.world});
    for (const auto& [rank, files] : it->second.ranks) h.ranks[rank] = files.bytes;
  }
  return held;
}

absl::StatusOr<RankFiles> MemoryTier::BeginRead(const std::string& job_id,
                                                const std::string& snapshot, int rank) {
  absl::MutexLock lock(&mu_);
  Snapshot* s = FindLocked(job_id, snapshot);
  if (s == nullptr || !s->ranks.contains(rank)) {
    return absl::NotFoundError(absl::StrCat("the memory tier of ", node_id_, " holds no rank ",
                                            rank, " of ", job_id, "/", snapshot));
  }
  ++s->pins;
  return s->ranks[rank];
}

void MemoryTier::EndRead(const std::string& job_id, const std::string& snapshot) {
  absl::MutexLock lock(&mu_);
  UnpinLocked(job_id, snapshot);
}

absl::Status MemoryTier::BeginGather(const std::string& job_id, const std::string& snapshot,
                                     int world, int64_t bytes) {
  const std::optional<MemorySnapshotId> id = ParseMemorySnapshotName(snapshot);
  if (!IsPlainTierName(job_id) || !id || world < 1 || bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat("bad gather '", job_id, "/", snapshot, "'"));
  }
  absl::MutexLock lock(&mu_);
  if (!secrets_.contains(job_id)) {  // released meanwhile
    return absl::FailedPreconditionError(absl::StrCat("job ", job_id, " has ended"));
  }
  const int64_t used = UsedLocked();
  if (used + bytes > budget_) {
    std::string message = absl::StrCat(
        "memory tier of ", node_id_, " refused to gather ", snapshot, ": the ranks it lacks need ",
        Mib(bytes), ", ", Mib(std::max<int64_t>(0, budget_ - used)), " of its ", Mib(budget_),
        " budget are free (the agent's --memory-tier-mb)");
    notices_.emplace_back(job_id, message);
    return absl::ResourceExhaustedError(std::move(message));
  }
  TY_RETURN_IF_ERROR(fs_->CreateDirs(absl::StrCat(JobDir(job_id), "/", snapshot)));
  std::map<MemorySnapshotId, Snapshot>& all = snapshots_[job_id];
  const int newest_attempt = NewestAttempt(all);
  Snapshot& s = all[*id];
  s.world = world;
  ++s.pins;
  s.gathered_bytes += bytes;
  s.restored_by = std::max(s.restored_by, newest_attempt + 1);
  return absl::OkStatus();
}

void MemoryTier::EndGather(const std::string& job_id, const std::string& snapshot,
                           int64_t requested, const std::map<int, RankFiles>& got) {
  absl::MutexLock lock(&mu_);
  Snapshot* s = FindLocked(job_id, snapshot);
  if (s == nullptr) return;
  // What arrived stays counted; the room asked for and not used is given back.
  int64_t arrived = 0;
  for (const auto& [rank, files] : got) {
    if (rank < 0 || rank >= s->world) continue;
    s->ranks[rank] = files;
    arrived += files.bytes;
  }
  s->gathered_bytes = std::max<int64_t>(0, s->gathered_bytes + arrived - requested);
  UnpinLocked(job_id, snapshot);
}

absl::Status MemoryTier::CommitReceived(const std::string& job_id, const std::string& snapshot,
                                        const std::string& part, const std::string& file) {
  if (!IsPlainTierName(job_id) || !ParseMemorySnapshotName(snapshot) || !IsPlainTierName(part) ||
      !IsPlainTierName(file)) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad copy '", job_id, "/", snapshot, "/", file, "'"));
  }
  const std::string dir = absl::StrCat(JobDir(job_id), "/", snapshot, "/");
  return fs_->RenameFile(dir + part, dir + file);
}

absl::Status MemoryTier::RemoveReceived(const std::string& job_id, const std::string& snapshot,
                                        const std::string& part) {
  if (!IsPlainTierName(job_id) || !ParseMemorySnapshotName(snapshot) || !IsPlainTierName(part)) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad copy '", job_id, "/", snapshot, "/", part, "'"));
  }
  return fs_->RemoveFile(absl::StrCat(JobDir(job_id), "/", snapshot, "/", part));
}

void MemoryTier::PruneLocked(const std::string& job_id) {
  auto job = snapshots_.find(job_id);
  if (job == snapshots_.end()) return;
  std::map<MemorySnapshotId, Snapshot>& all = job->second;
  // A gathered snapshot is complete here for a restore, not for a lost peer: it is kept until the
  // attempt that restores from it snapshots (its ranks have restored then), and it keeps nothing
  // older.
  std::optional<MemorySnapshotId> newest_complete;
  for (const auto& [id, s] : all) {
    if (s.world > 0 && static_cast<int>(s.ranks.size()) == s.world && s.restored_by == 0) {
      newest_complete = id;
    }
  }
  const int newest_attempt = NewestAttempt(all);
  int newer = static_cast<int>(all.size());  // snapshots at or after this one
  int copied_newer = 0;                      // copied ones at or after it
  for (const auto& [id, s] : all) copied_newer += s.copied ? 1 : 0;
  for (auto it = all.begin(); it != all.end(); --newer) {
    const bool restoring = it->second.restored_by > newest_attempt;
    const bool copied = it->second.copied && copied_newer-- <= kCopiesKept;
    const bool keep = newer <= kKeep || it->second.pins > 0 || restoring || copied ||
                      (newest_complete && it->first == *newest_complete);
    if (keep) {
      ++it;
      continue;
    }
    (void)RemoveRecursively(*fs_, absl::StrCat(JobDir(job_id), "/", MemorySnapshotName(it->first)));
    it = all.erase(it);
  }
}

void MemoryTier::SetPeer(const std::string& job_id, const std::string& peer_address,
                         std::vector<std::string> attempt_tiers) {
  absl::MutexLock lock(&mu_);
  peers_[job_id] = peer_address;
  attempt_tiers_[job_id] = std::move(attempt_tiers);
}

void MemoryTier::AdoptPeer(const std::string& job_id, const std::string& peer_address,
                           std::vector<std::string> attempt_tiers) {
  absl::MutexLock lock(&mu_);
  auto it = peers_.find(job_id);
  if (peer_address.empty() || (it != peers_.end() && !it->second.empty())) return;
  peers_[job_id] = peer_address;
  attempt_tiers_[job_id] = std::move(attempt_tiers);
}

std::vector<std::string> MemoryTier::AttemptTiers(const std::string& job_id) const {
  absl::MutexLock lock(&mu_);
  auto it = attempt_tiers_.find(job_id);
  return it == attempt_tiers_.end() ? std::vector<std::string>{} : it->second;
}

void MemoryTier::Release(const std::string& job_id) {
  if (!IsPlainTierName(job_id)) return;
  absl::MutexLock lock(&mu_);
  std::erase_if(reserved_, [&](const auto& entry) { return std::get<0>(entry.first) == job_id; });
  std::erase_if(copies_, [&](const PeerCopy& c) { return c.job_id == job_id; });
  std::erase_if(sending_, [&](const auto& sending) { return sending.first == job_id; });
  peers_.erase(job_id);
  attempt_tiers_.erase(job_id);
  secrets_.erase(job_id);
  snapshots_.erase(job_id);
  const std::string dir = JobDir(job_id);
  if (fs_->Exists(dir)) (void)RemoveRecursively(*fs_, dir);
}

void MemoryTier::AdmitSecret(const std::string& job_id, const std::string& secret) {
  if (secret.empty()) return;
  absl::MutexLock lock(&mu_);
  std::vector<std::string>& known = secrets_[job_id];
  if (std::find(known.begin(), known.end(), secret) == known.end()) known.push_back(secret);
}

absl::Status MemoryTier::CheckSecret(const std::string& job_id,
                                     const std::optional<std::string>& secret) const {
  if (!secret || secret->empty()) {
    return absl::UnauthenticatedError(
        "the memory tier admits only calls with the job's attempt secret");
  }
  absl::MutexLock lock(&mu_);
  auto it = secrets_.find(job_id);
  if (it != secrets_.end() &&
      std::find(it->second.begin(), it->second.end(), *secret) != it->second.end()) {
    return absl::OkStatus();
  }
  return absl::PermissionDeniedError(absl::StrCat(
      "the memory tier of ", node_id_, " holds no attempt of job ", job_id, " with that secret"));
}

std::string MemoryTier::SecretFor(const std::string& job_id) const {
  absl::MutexLock lock(&mu_);
  auto it = secrets_.find(job_id);
  return it == secrets_.end() || it->second.empty() ? "" : it->second.back();
}

std::optional<PeerCopy> MemoryTier::NextCopy() {
  absl::MutexLock lock(&mu_);
  if (copies_.empty()) return std::nullopt;
  PeerCopy copy = std::move(copies_.front());
  copies_.pop_front();
  sending_.insert({copy.job_id, copy.rank});
  return copy;
}

void MemoryTier::CopyEnded(const PeerCopy& copy) {
  absl::MutexLock lock(&mu_);
  sending_.erase({copy.job_id, copy.rank});
}

std::vector<std::pair<std::string, std::string>> MemoryTier::TakeNotices() {
  absl::MutexLock lock(&mu_);
  return std::exchange(notices_, {});
}

void MemoryTier::AddNotice(const std::string& job_id, std::string message) {
  absl::MutexLock lock(&mu_);
  notices_.emplace_back(job_id, std::move(message));
}

std::string DefaultMemoryTierRoot(const std::string& node_id, const std::string& work_dir) {
  struct statfs info;
  if (::statfs("/dev/shm", &info) != 0) return work_dir + "/memory-tier";
  return absl::StrFormat("/dev/shm/trainyard-%s-%08x", node_id,
                         std::hash<std::string>{}(work_dir)&0xffffffffu);
}

}  // namespace trainyard::server::agent
