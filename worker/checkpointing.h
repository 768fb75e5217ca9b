// Checkpointer: the training loop's side of checkpoints. It decides when a save is due, turns a
// TrainState into the records and manifest header the CheckpointWriter writes, and restores a
// TrainState from the best checkpoint every rank can load.
//
// Restoring is collective: every rank of the mesh tries the same candidates in the same order
// (checkpoint/reader.h: ResumeCandidates), and the ranks agree through `sum` (a sum over the
// world) on whether all of them loaded one, falling back to the next candidate otherwise.
//
// The memory tier comes first. With a MemoryTierClient, the Checkpointer also snapshots the
// rank's state into its node's tier every fault_tolerance.memory_every_steps (SaveToMemory, in
// the background like a checkpoint, with the tier's own format: checkpoint/writer.h's memory
// mode). The agent copies a snapshot to the peer node when the ranks agreed to (the trainer's
// per-step vote, MemoryCopyPending: no rank's agent still copies an earlier one), so every node
// copies the same steps. On restore, every rank asks its node's agent for the snapshots
// complete over the attempt's nodes (every rank of the writing attempt held by some node: its
// own ranks and the copies peers sent it), the ranks exchange their lists, and the newest
// snapshot every rank was offered wins unless a committed checkpoint is newer. Each node's agent
// fetches the ranks of it the node lacks (from three nodes up no node holds them all), and every
// rank loads it from its node. Snapshots load into any mesh, like checkpoints.
//
// Threading: the training thread's; the writer's background thread is internal.
#ifndef TRAINYARD_WORKER_CHECKPOINTING_H_
#define TRAINYARD_WORKER_CHECKPOINTING_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/clock.h"
#include "common/filesystem.h"
#include "common/memory_tier_names.h"
#include "config/spec.h"
#include "worker/checkpoint/reader.h"
#include "worker/checkpoint/writer.h"
#include "worker/memory_tier_client.h"
#include "worker/shape/parameters.h"
#include "worker/train_state.h"

namespace trainyard::worker {

// Where this rank sits, as checkpoints need it.
struct CheckpointRank {
  int rank = 0;
  int world = 1;
  int tp_rank = 0;
  int micro_batch = 0;  // per rank, for the manifest's record of the writing mesh
};

class Checkpointer {
 public:
  // `layout` and `fs`/`clock` must outlive the checkpointer. `save_token` is the same on every
  // rank of this run and new for every run. `agree` returns the sum of its argument over every
  // rank of the mesh.
  Checkpointer(FileSystem* fs, Clock* clock, const config::JobSpec& spec,
               const ParameterLayout& layout, CheckpointRank rank, std::string save_token,
               std::function<absl::Status(std::span<double>)> sum, MemoryTierClient* tier = nullptr,
               int attempt = 0);

  // Loads the newest snapshot or checkpoint every rank can load into `state` (params and step).
  // Returns its path, or nullopt when there is none (the run starts from step 0). A checkpoint
  // of another model is INVALID_ARGUMENT naming the field.
  // `from_memory` tells whether the memory tier supplied it.
  [[nodiscard]] absl::StatusOr<std::optional<std::string>> Restore(TrainState& state,
                                                                   const std::string& recorded_path,
                                                                   bool* from_memory = nullptr);
  // After a Restore that found nothing: whether this rank's state holds a checkpoint other ranks
  // could not load, or part of one it could not finish (tensors are read straight into place),
  // so the caller must initialise the parameters and zero the moments again.
  bool left_partial_state() const { return partial_state_; }

  // Whether a memory snapshot is due after `state.step`, and taking one (blocks while the state
  // is copied, and while the previous snapshot is still being written).
  // `interval`: steps between snapshots (every rank must use the same).
  bool MemoryDue(const TrainState& state, int64_t total_steps, int64_t interval) const;
  // What the newest completed snapshot cost (training blocked plus writing), 0 before one.
  double memory_cost_seconds() const { return memory_cost_seconds_; }
  // `copy`: the agent copies it to the peer node (every rank must pass the same).
  [[nodiscard]] absl::Status SaveToMemory(const TrainState& state, bool copy);
  // Whether this rank's agent may still copy one of its snapshots to the peer node (it is asked
  // while a copy is outstanding): false for a rank that takes no snapshots.
  bool MemoryCopyPending();
  // Waits for the snapshot in flight.
  void WaitForMemory();

  // Whether a save is due after `state.step` (every interval, and after the last step).
  bool Due(const TrainState& state, int64_t total_steps) const;
  // Starts a save of `state`: blocks while the state is snapshotted. Without checkpoint.dir,
  // FAILED_PRECONDITION.
  [[nodiscard]] absl::Status Save(const TrainState& state);
  // Waits for the save in flight (rank 0: until it is committed); its status.
  [[nodiscard]] absl::Status Wait();
  // Saves that ended since the last call.
  std::vector<checkpoint::SaveOutcome> TakeOutcomes();

  bool enabled() const { return writer_ != nullptr; }
  // Checked before every commit (checkpoint/writer.h: WriterOptions::may_commit). Set it before
  // Restore.
  void set_commit_guard(std::function<absl::Status()> guard) { commit_guard_ = std::move(guard); }

 private:
  std::vector<checkpoint::SnapshotRecord> Records(
      const std::vector<parallel::ShardedParams::SavedRange>& ranges) const;
  checkpoint::Manifest Header(const TrainState& state) const;
  // The writer starts once Restore knows the step it resumed from, allocating its snapshot buffer
  // in the background while training begins.
  void StartWriter(const TrainState& state);
  void StartMemoryWriter(const TrainState& state);
  int64_t SnapshotFloats(const TrainState& state) const;
  // The memory tier's part of Restore: true when every rank loaded a snapshot. `disk_step`: the
  // newest committed checkpoint's step (a snapshot older than it is not used).
  [[nodiscard]] absl::StatusOr<std::optional<std::string>> RestoreFromMemory(
      TrainState& state, std::optional<int64_t> disk_step);
  [[nodiscard]] absl::StatusOr<checkpoint::RankState> LoadMemorySnapshot(
      const std::string& dir, checkpoint::Manifest* merged) const;
  // The newest few snapshots the nodes of the attempt hold every rank of, newest first.
  std::vector<MemorySnapshotId> CompleteSnapshots() const;

  FileSystem* fs_;
  Clock* clock_;
  const config::JobSpec& spec_;
  const ParameterLayout& layout_;
  CheckpointRank rank_;
  std::string save_token_;
  std::function<absl::Status(std::span<double>)> sum_;
  MemoryTierClient* tier_;
  const int attempt_;
  std::string tier_dir_;  // the job's directory in the tier, once reserved
  std::unique_ptr<checkpoint::CheckpointWriter> memory_writer_;
  std::function<absl::Status()> commit_guard_;
  // Memory snapshots in a row the agent did not take. After kMemoryFailuresTolerated the rank
  // pauses its snapshots for kMemoryPauseFirstNs, and twice as long after each pause that ends
  // in another failure (up to kMemoryPauseMostNs). An agent that restarted under the rank holds
  // no reservation for it: the rank reserves its room again when told so (MemoryCommitted).
  static constexpr int kMemoryFailuresTolerated = 3;
  static constexpr int64_t kMemoryPauseFirstNs = 5'000'000'000;
  static constexpr int64_t kMemoryPauseMostNs = 300'000'000'000;
  std::atomic<int> memory_failures_{0};
  std::atomic<int64_t> memory_paused_until_ns_{0};
  std::atomic<int64_t> memory_pause_ns_{kMemoryPauseFirstNs};
  // Tells the agent of a written snapshot (the writer's thread); `reservation`: the rank's room
  // in bytes, reserved again if the agent has none for it.
  absl::Status MemoryCommitted(int64_t reservation, int64_t step, const std::string& snapshot,
                               std::vector<std::string> files);
  // Counts a snapshot the tier did not take, and pauses the snapshots after too many.
  void MemoryFailed(const absl::Status& why);
  // Room for this rank's snapshots (and its manifest) in the tier, in bytes.
  int64_t MemoryReservation(const TrainState& state) const;
  // Steps of the newest snapshot to copy handed to the writer, and of the newest one whose commit
  // the agent was told of (or refused).
  std::atomic<int64_t> copy_step_{-1};
  std::atomic<int64_t> told_step_{-1};
  std::atomic<int64_t> uncopied_step_{-1};  // the newest of those the agent queued no copy of
  int64_t copy_ended_step_ = -1;            // the newest the agent said it no longer copies
  int copy_unanswered_ = 0;                 // CopyPending calls in a row the agent did not answer
  double memory_cost_seconds_ = 0.0;
  int64_t resumed_step_ = 0;
  bool partial_state_ = false;
  std::unique_ptr<checkpoint::CheckpointWriter> writer_;  // with checkpoint.dir, after Restore
};

}  // namespace trainyard::worker

#endif  // TRAINYARD_WORKER_CHECKPOINTING_H_
