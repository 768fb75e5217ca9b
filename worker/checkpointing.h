// Checkpointer: the training loop's side of checkpoints. It decides when a save is due, turns a
// TrainState into the records and manifest header the CheckpointWriter writes, and restores a
// TrainState from the best checkpoint every rank can load.
//
// Restoring is collective: every rank of the mesh tries the same candidates in the same order
// (checkpoint/reader.h: ResumeCandidates), and the ranks agree through `agree` (a sum over the
// world) on whether all of them loaded one, falling back to the next candidate otherwise.
//
// Threading: the training thread's; the writer's background thread is internal.
#ifndef TRAINYARD_WORKER_CHECKPOINTING_H_
#define TRAINYARD_WORKER_CHECKPOINTING_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/clock.h"
#include "common/filesystem.h"
#include "config/spec.h"
#include "worker/checkpoint/writer.h"
#include "worker/parameters.h"
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
               std::function<absl::StatusOr<double>(double)> agree);

  // Loads the newest checkpoint every rank can load into `state` (params and step). Returns the
  // checkpoint's path, or nullopt when there is none (the run starts from step 0). A checkpoint of
  // another model is INVALID_ARGUMENT naming the field.
  absl::StatusOr<std::optional<std::string>> Restore(TrainState& state,
                                                     const std::string& recorded_path);

  // Whether a save is due after `state.step` (every interval, and after the last step).
  bool Due(const TrainState& state, int64_t total_steps) const;
  // Starts a save of `state`: blocks while the state is snapshotted. Without checkpoint.dir,
  // FAILED_PRECONDITION.
  absl::Status Save(const TrainState& state);
  // Waits for the save in flight (rank 0: until it is committed); its status.
  absl::Status Wait();
  // Saves that ended since the last call.
  std::vector<checkpoint::SaveOutcome> TakeOutcomes();

  bool enabled() const { return writer_ != nullptr; }

 private:
  std::vector<checkpoint::SnapshotRecord> Records(
      const std::vector<parallel::ShardedParams::SavedRange>& ranges) const;
  checkpoint::Manifest Header(const TrainState& state) const;
  // The writer starts once Restore knows the step it resumed from, allocating its snapshot buffer
  // in the background while training begins.
  void StartWriter(const TrainState& state);

  FileSystem* fs_;
  Clock* clock_;
  const config::JobSpec& spec_;
  const ParameterLayout& layout_;
  CheckpointRank rank_;
  std::string save_token_;
  std::function<absl::StatusOr<double>(double)> agree_;
  int64_t resumed_step_ = 0;
  std::unique_ptr<checkpoint::CheckpointWriter> writer_;  // with checkpoint.dir, after Restore
};

}  // namespace trainyard::worker

#endif  // TRAINYARD_WORKER_CHECKPOINTING_H_
