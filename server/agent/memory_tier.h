// MemoryTier: the node's in-memory snapshots of its workers' training state, which outlive the
// workers (the agent owns them) and, through peer copies, the node.
//
// The tier is a directory on a memory-backed filesystem (/dev/shm by default) laid out as
// common/memory_tier_names.h says. A worker reserves room for its rank before it writes
// (Reserve: kSlots snapshots of its size), writes each snapshot's files itself, then tells the
// agent (Committed); the agent prunes the job's older snapshots and queues a copy for the job's
// peer node (only the newest: a newer snapshot supersedes a queued one), which stores it through
// the same reservations (Reserve with peer_copy, then BeginCopy, OpenReceived, EndCopy).
// Reservations count against a byte budget: one that does not fit is refused with
// RESOURCE_EXHAUSTED and a notice for the job's events, and the rank runs without the tier.
// When the job ends, Release frees everything it holds.
//
// From three nodes up no node holds every rank of a snapshot: a restoring node gathers the ranks
// it lacks from the nodes of the attempt that hold them (Held, BeginRead on theirs; BeginGather,
// OpenReceived, EndGather on its own). What it gathers counts against its budget while kept: until
// a later attempt (the restored one) has kKeep snapshots of its own here.
//
// Which snapshots are copied is the ranks' decision, the same on every node: a snapshot is copied
// only when no copy of an earlier one may still be under way anywhere (the workers agree on it
// over the world, asking CopyPending), so the nodes copy the same steps and no copy is superseded
// on one node and not on another. Committed with copy false keeps a snapshot here only.
//
// What is kept of a job: its kKeep newest snapshots, its kCopiesKept newest copied ones (its own
// ranks' and the copies received), the newest one complete on this node (every rank of the
// writing attempt present, its own or copied here), and those a copy is arriving for or a peer
// is reading. When the ranks decide to copy a snapshot, the copies of the copied one before it
// have ended on every node: unless one failed, that step is held by two nodes for every rank and
// kept until the next copied step is, so a lost node's work resumes from it on any number of
// nodes.
//
// The agent wipes the tier when it starts: a restarted agent holds no reservations, and a lost
// node's memory is lost. Workers it adopts from the agent before it lose their tier: their
// reports go to the old agent's address, and they stop snapshotting when those fail.
//
// Threading: thread-safe (one internal mutex); file I/O through the FileSystem seam.
#ifndef TRAINYARD_SERVER_AGENT_MEMORY_TIER_H_
#define TRAINYARD_SERVER_AGENT_MEMORY_TIER_H_

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/filesystem.h"
#include "common/memory_tier_names.h"

namespace trainyard::server::agent {

// A rank's snapshot to copy to the job's peer node.
struct PeerCopy {
  std::string job_id;
  std::string peer_address;
  std::string snapshot;  // directory name in the job's directory
  int rank = 0;
  int world = 0;
  int64_t step = 0;
  int64_t bytes = 0;               // one snapshot of the rank, as reserved
  std::vector<std::string> files;  // the rank's manifest last
};

// A rank's files in a snapshot, as a node holds them.
struct RankFiles {
  std::vector<std::string> names;  // its manifest last
  int64_t bytes = 0;
};

// What a node holds of one snapshot: the ranks whose files are complete there.
struct HeldSnapshot {
  MemorySnapshotId id;
  int world = 0;
  std::map<int, int64_t> ranks;  // rank -> bytes of its files
};

class MemoryTier {
 public:
  static constexpr int kKeep = 3;        // newest snapshots (steps) kept per job
  static constexpr int kCopiesKept = 2;  // newest copied snapshots kept besides
  // Snapshots of one rank a reservation covers: the newest, the copied ones (one a copy is
  // arriving for is one of them) and the newest complete (one of them too, unless copies failed
  // since).
  static constexpr int kSlots = kKeep + kCopiesKept + 1;

  // `fs` must outlive the tier. `budget_bytes` > 0.
  MemoryTier(FileSystem* fs, std::string root, int64_t budget_bytes, std::string node_id);

  // Removes whatever an earlier agent left in the root and creates it. Call once, first.
  [[nodiscard]] absl::Status Start();

  const std::string& root() const { return root_; }
  int64_t budget_bytes() const { return budget_; }
  int64_t reserved_bytes() const;

  // Room for kSlots snapshots of `bytes` for (job, rank): the job's directory. Reserving again
  // for the same (job, rank, peer_copy) replaces the earlier reservation (a new attempt).
  // RESOURCE_EXHAUSTED over the budget (and a notice); INVALID_ARGUMENT for a bad job name.
  [[nodiscard]] absl::StatusOr<std::string> Reserve(const std::string& job_id, int rank,
                                                    int64_t bytes, bool peer_copy,
                                                    const std::string& from_node);

  // A rank's snapshot is complete: prunes the job's older snapshots and, when `copy`, queues a
  // copy for the job's peer, when it has one. Whether it queued a copy; FAILED_PRECONDITION
  // without a reservation.
  [[nodiscard]] absl::StatusOr<bool> Committed(const std::string& job_id, int rank, int world,
                                               const std::string& snapshot, int64_t step,
                                               std::vector<std::string> files, bool copy = true);
  // Whether a copy of (job, rank) to the peer is queued or being sent.
  bool CopyPending(const std::string& job_id, int rank) const;

  // A peer copy of (job, rank, snapshot) begins: the snapshot is kept until EndCopy.
  // INVALID_ARGUMENT for names that are not plain, FAILED_PRECONDITION without a peer
  // reservation for (job, rank).
  [[nodiscard]] absl::Status BeginCopy(const std::string& job_id, int rank,
                                       const std::string& snapshot);
  // A file of the copy, opened for writing in the tier.
  [[nodiscard]] absl::StatusOr<std::unique_ptr<WritableFile>> OpenReceived(
      const std::string& job_id, const std::string& snapshot, const std::string& file);
  // The copy ended; `complete`: the files that arrived (its manifest last), nullopt when not all.
  void EndCopy(const std::string& job_id, int rank, int world, const std::string& snapshot,
               std::optional<RankFiles> complete);

  // The node that keeps copies of `job_id`'s snapshots from this node ("" : none), and the tiers
  // of every node of the job's newest attempt (where a gather looks).
  void SetPeer(const std::string& job_id, const std::string& peer_address,
               std::vector<std::string> attempt_tiers = {});
  std::vector<std::string> AttemptTiers(const std::string& job_id) const;
  // SetPeer for a job whose workers the agent adopted, unless the job has a peer already. An agent
  // that kept running (the coordinator restarted, or the connection broke) has its start orders'
  // peer, while the coordinator's answer leaves out the nodes that have not reconnected yet.
  void AdoptPeer(const std::string& job_id, const std::string& peer_address,
                 std::vector<std::string> attempt_tiers);

  // The job's snapshots with at least one rank complete here, newest first.
  std::vector<HeldSnapshot> Held(const std::string& job_id) const;
  // A rank's files, kept until EndRead. NOT_FOUND when this node does not hold them whole.
  [[nodiscard]] absl::StatusOr<RankFiles> BeginRead(const std::string& job_id,
                                                    const std::string& snapshot, int rank);
  void EndRead(const std::string& job_id, const std::string& snapshot);
  // Room for `bytes` of other nodes' ranks of a snapshot of `world` ranks, fetched next
  // (OpenReceived) and kept until EndGather. RESOURCE_EXHAUSTED over the budget (and a notice).
  [[nodiscard]] absl::Status BeginGather(const std::string& job_id, const std::string& snapshot,
                                         int world, int64_t bytes);
  // The gather that asked for `requested` bytes ended with `got` (rank -> its files) complete here.
  void EndGather(const std::string& job_id, const std::string& snapshot, int64_t requested,
                 const std::map<int, RankFiles>& got);
  // A received file is whole: renames it from `part` (the name it was opened under) to `file`.
  // Files arrive under a name of their own, so that a copy and a gather of the same rank, or a
  // peer mapping the file, never see it torn.
  [[nodiscard]] absl::Status CommitReceived(const std::string& job_id, const std::string& snapshot,
                                            const std::string& part, const std::string& file);
  // Removes a received file left unfinished (`part`, the name it was opened under).
  [[nodiscard]] absl::Status RemoveReceived(const std::string& job_id, const std::string& snapshot,
                                            const std::string& part);
  // The job ended: removes its directory, reservations and secrets.
  void Release(const std::string& job_id);

  // Who may use the tier for a job: the holders of one of its attempt secrets, which reach this
  // node with the coordinator's StartWorker orders (its workers present theirs; a peer node of
  // the same attempt presents the same secret with its copies).
  void AdmitSecret(const std::string& job_id, const std::string& secret);
  // OK for one of the job's secrets; UNAUTHENTICATED without a secret; PERMISSION_DENIED for one
  // this node was not given for the job.
  [[nodiscard]] absl::Status CheckSecret(const std::string& job_id,
                                         const std::optional<std::string>& secret) const;
  // The secret this node presents with copies of the job's snapshots (the newest; "" if none).
  std::string SecretFor(const std::string& job_id) const;

  // The next queued peer copy (the newest per (job, rank): older ones are superseded), or none;
  // being sent until CopyEnded.
  std::optional<PeerCopy> NextCopy();
  void CopyEnded(const PeerCopy& copy);
  std::string JobDir(const std::string& job_id) const;
  // Notices for the jobs' events since the last call: (job, message).
  std::vector<std::pair<std::string, std::string>> TakeNotices();
  void AddNotice(const std::string& job_id, std::string message);

 private:
  using Key = std::tuple<std::string, int, bool>;  // job, rank, peer copy
  struct Snapshot {
    int world = 0;
    std::map<int, RankFiles> ranks;  // whose files are complete here
    int pins = 0;                    // copies arriving, reads and gathers in progress
    bool copied = false;             // a step the ranks copy to their peers
    int64_t gathered_bytes = 0;      // fetched from other nodes (or room for that)
    // Gathered for a restore: kept until an attempt numbered at least this has snapshots here.
    int restored_by = 0;
  };
  void PruneLocked(const std::string& job_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Bytes held against the budget: reservations and what gathers fetched.
  int64_t UsedLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static int NewestAttempt(const std::map<MemorySnapshotId, Snapshot>& all);
  // The snapshot of a job, or null for a bad or unknown name.
  Snapshot* FindLocked(const std::string& job_id, const std::string& snapshot)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UnpinLocked(const std::string& job_id, const std::string& snapshot)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The bytes of `files` in a snapshot's directory.
  int64_t SizeOf(const std::string& job_id, const std::string& snapshot,
                 const std::vector<std::string>& files) const;

  FileSystem* const fs_;
  const std::string root_;
  const int64_t budget_;
  const std::string node_id_;

  mutable absl::Mutex mu_;
  std::map<Key, int64_t> reserved_ ABSL_GUARDED_BY(mu_);  // bytes per key
  std::map<std::string, std::string> peers_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::vector<std::string>> attempt_tiers_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::vector<std::string>> secrets_ ABSL_GUARDED_BY(mu_);  // oldest first
  std::map<std::string, std::map<MemorySnapshotId, Snapshot>> snapshots_ ABSL_GUARDED_BY(mu_);
  std::deque<PeerCopy> copies_ ABSL_GUARDED_BY(mu_);
  std::set<std::pair<std::string, int>> sending_ ABSL_GUARDED_BY(mu_);  // job, rank
  std::vector<std::pair<std::string, std::string>> notices_ ABSL_GUARDED_BY(mu_);
};

// The default tier root for an agent: a directory of /dev/shm named after the node and its work
// directory (so that agents sharing a machine do not share a tier), or <work_dir>/memory-tier
// where /dev/shm is missing.
std::string DefaultMemoryTierRoot(const std::string& node_id, const std::string& work_dir);

}  // namespace trainyard::server::agent

#endif  // TRAINYARD_SERVER_AGENT_MEMORY_TIER_H_
