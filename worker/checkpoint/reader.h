// Reading a checkpoint back into one rank of any mesh, and choosing which checkpoint to resume.
//
// Every record's checksum is verified before its bytes are used; a shard shorter or longer than
// its manifest says, a mismatch, or a tensor the checkpoint does not cover completely is
// DATA_LOSS naming the file, so the caller can fall back to an older checkpoint.
//
// Threading: plain functions.
#ifndef TRAINYARD_WORKER_CHECKPOINT_READER_H_
#define TRAINYARD_WORKER_CHECKPOINT_READER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/filesystem.h"
#include "config/spec.h"
#include "worker/checkpoint/format.h"
#include "worker/shape/parameters.h"

namespace trainyard::worker::checkpoint {

// One rank's state read from a checkpoint: full local tensors in `layout` order (layout.total()
// floats each).
struct RankState {
  std::unique_ptr<float[]> params;
  std::unique_ptr<float[]> first_moment;
  std::unique_ptr<float[]> second_moment;
};

// Reads what `layout` (one rank's: its tensor-parallel slice and pipeline stage) needs from the
// checkpoint at `path` whose verified manifest is `manifest`.
[[nodiscard]] absl::StatusOr<RankState> LoadRankState(FileSystem& fs, const std::string& path,
                                                      const Manifest& manifest,
                                                      const ParameterLayout& layout);

// The checkpoints a run tries to resume from, best first: `recorded` (the coordinator's newest
// committed one, when given), then checkpoint.dir's committed ones newest first, then
// checkpoint.resume_from (a checkpoint, or a directory's committed ones newest first). The first
// that loads on every rank wins; none: the run starts from step 0.
std::vector<std::string> ResumeCandidates(FileSystem& fs, const config::CheckpointSpec& spec,
                                          const std::string& recorded = "");

// Bad input in checkpoint.resume_from, found before anything is written: a missing or unreadable
// path (NOT_FOUND / PERMISSION_DENIED), a directory that is neither a checkpoint nor holds any
// (INVALID_ARGUMENT), no intact manifest (INVALID_ARGUMENT naming the file), or a checkpoint of
// another model (INVALID_ARGUMENT naming the field). Every message starts with
// "checkpoint.resume_from: ".
[[nodiscard]] absl::Status CheckResumeFrom(FileSystem& fs, const config::JobSpec& spec);

}  // namespace trainyard::worker::checkpoint

#endif  // TRAINYARD_WORKER_CHECKPOINT_READER_H_
