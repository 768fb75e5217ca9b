// CheckpointWriter: one rank's side of asynchronous checkpoint saves.
//
// Save() blocks training only while the rank's state is copied into a host buffer (and, when the
// previous save is still being written, until it ends: at most one save is in flight). A
// background thread then writes the rank's shard file, syncs it, and hands rank 0 the shard's
// index (a small file in the checkpoint directory, written atomically). Rank 0 waits for every
// rank's index, writes the manifest (temporary name, sync, rename, directory sync: the commit),
// and prunes: it keeps the newest `keep` committed checkpoints and removes torn directories
// (without a manifest) and stale ones (another run's, newer than the step this run resumed
// from). A failed save leaves earlier checkpoints untouched; training goes on.
//
// Every rank of a job runs one writer with the same directory, save token and world. Files go
// through the FileSystem seam only.
//
// Threading: Save, Wait and TakeOutcomes are called from the training thread; the writer's own
// thread does the I/O. The destructor waits for the save in flight.
#ifndef TRAINYARD_WORKER_CHECKPOINT_WRITER_H_
#define TRAINYARD_WORKER_CHECKPOINT_WRITER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/filesystem.h"
#include "common/host_memory.h"
#include "worker/checkpoint/format.h"
#include "worker/shape/tensor_slices.h"

namespace trainyard::worker::checkpoint {

struct WriterOptions {
  std::string dir;  // checkpoint.dir
  int keep = 3;     // committed checkpoints kept
  int rank = 0;
  int world = 1;
  // Shared by every rank of this run, different for every run: it names this run's checkpoint
  // directories (CheckpointDirName) so no save reuses a crashed run's files.
  std::string save_token;
  // The step this run resumed from (0: none); another run's checkpoints newer than it were
  // abandoned (or are corrupt) and are pruned.
  int64_t resumed_step = 0;
  // The snapshot's size in floats, when known: the writer's thread allocates and touches it as
  // soon as it starts, so that no save faults the buffer's pages in on the training thread.
  int64_t snapshot_floats = 0;
  // How long rank 0 waits for the other ranks' shards before the save fails.
  absl::Duration gather_timeout = absl::Minutes(10);
  // Asked (on rank 0, the writer's thread) just before the manifest is written; an error fails
  // the save without committing or pruning anything: the fencing of a stale attempt.
  std::function<absl::Status()> may_commit;
  // Memory tier mode: every rank commits its own snapshot, in `dir`/MemorySnapshotName({attempt,
  // step}), by writing its manifest (the header and its one shard) as
  // MemoryRankManifestName(rank) after the shard; nothing is synced, gathered or pruned (the
  // agent that owns the tier prunes), and `on_committed` (the writer's thread) tells the agent.
  bool memory_tier = false;
  int attempt = 0;
  std::function<absl::Status(int64_t step, const std::string& snapshot,
                             std::vector<std::string> files)>
      on_committed;
};

// One tensor run of a snapshot: elements [begin, end) of hyperslab `slab` of tensor `name`.
struct SnapshotRecord {
  std::string name;
  std::string kind;  // "param" | "exp_avg" | "exp_avg_sq"
  std::vector<int64_t> global_shape;
  Hyperslab slab;
  int64_t begin = 0, end = 0;
};

// How a save ended, as the rank that knows reports it: rank 0 for every save (committed or
// failed), other ranks for their own failures.
struct SaveOutcome {
  int64_t step = 0;
  std::string path;
  bool committed = false;
  int64_t bytes = 0;             // shard files and manifest (rank 0: the whole checkpoint)
  double write_seconds = 0.0;    // snapshot taken → committed
  double blocked_seconds = 0.0;  // training blocked: waiting for the previous save + snapshot
  double waited_seconds = 0.0;   // the part of it spent waiting for the previous save
  std::string message;           // failed: why
  absl::Time finished;
};

class CheckpointWriter {
 public:
  CheckpointWriter(FileSystem* fs, Clock* clock, WriterOptions options);
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // Saves the state after optimizer step `step`. `records` describe the snapshot's floats in
  // order; `fill` copies them into the host buffer it is given (called on this thread: the only
  // part of a save that blocks training besides waiting for the previous save). `header` is the
  // manifest without shards (used on rank 0). An error from `fill` fails the save at once.
  [[nodiscard]] absl::Status Save(int64_t step, Manifest header,
                                  std::vector<SnapshotRecord> records,
                                  const std::function<absl::Status(float*)>& fill);

  // Waits until no save is in flight; the last save's outcome on this rank.
  [[nodiscard]] absl::Status Wait();
  // Whether a save is in flight.
  bool Busy();

  // Saves that ended since the last call, oldest first.
  std::vector<SaveOutcome> TakeOutcomes();

 private:
  struct Job {
    int64_t step = 0;
    Manifest header;
    std::vector<SnapshotRecord> records;
    double blocked_seconds = 0.0;
    double waited_seconds = 0.0;
    int64_t started_nanos = 0;
  };
  void Loop();
  SaveOutcome Write(const Job& job);
  SaveOutcome WriteToMemory(const Job& job);
  [[nodiscard]] absl::StatusOr<ShardFile> WriteShard(const Job& job, const std::string& path);
  [[nodiscard]] absl::StatusOr<int64_t> Commit(const Job& job, const std::string& path,
                                               ShardFile own);
  [[nodiscard]] absl::StatusOr<std::vector<ShardFile>> GatherIndexes(const std::string& path,
                                                                     ShardFile own);
  void Prune(const std::string& committed_path);

  FileSystem* fs_;
  Clock* clock_;
  const WriterOptions options_;
  // The snapshot; written by Save, read by the thread while busy_. Aligned, and its size rounded
  // up, for FileSystem::NewDirectWritableFile.
  std::unique_ptr<void, FreeHostMemory> host_;
  int64_t host_floats_ = 0;
  void EnsureHost(int64_t floats);  // allocates and touches every page

  absl::Mutex mu_;
  absl::CondVar changed_;                        // any of the fields below changed
  std::optional<Job> job_ ABSL_GUARDED_BY(mu_);  // the save to write
  bool busy_ ABSL_GUARDED_BY(mu_) = false;       // a save is in flight
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status last_ ABSL_GUARDED_BY(mu_);
  std::vector<SaveOutcome> outcomes_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;  // last: started after everything it uses
};

}  // namespace trainyard::worker::checkpoint

#endif  // TRAINYARD_WORKER_CHECKPOINT_WRITER_H_
