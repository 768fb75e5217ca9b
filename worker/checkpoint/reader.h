// Reading a checkpoint back into one rank of any mesh, and choosing which checkpoint to resume.
//
// Every record's checksum is verified before its bytes are used; a shard shorter or longer than
// its manifest says, a mismatch, or a tensor the checkpoint does not cover completely is
// DATA_LOSS naming the file, so the caller can fall back to an older checkpoint.
//
// Threading: plain functions; LoadRankStateInto reads on the calling thread's OpenMP threads
// (omp_get_max_threads()) and calls its sink on the calling thread only.
#ifndef TRAINYARD_WORKER_CHECKPOINT_READER_H_
#define TRAINYARD_WORKER_CHECKPOINT_READER_H_

#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <utility>
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

class ShardFiles;
class StreamingChecksum;

// Global (unsharded) tensors read one at a time from the checkpoint at `path` whose verified
// manifest is `manifest` (both must outlive the reader): what an export streams from. Each shard
// file is mapped on first use; every record's checksum is verified before its bytes are used.
class CheckpointTensors {
 public:
  CheckpointTensors(FileSystem& fs, const std::string& path, const Manifest& manifest);
  ~CheckpointTensors();

  // Global tensor `name` of `kind` ("param", "exp_avg", "exp_avg_sq") and `global_shape` into
  // the first numel elements of `global` (grown when smaller). DATA_LOSS naming the file when a
  // record is missing, damaged or the records do not cover the tensor.
  [[nodiscard]] absl::Status Read(const std::string& name, const std::string& kind,
                                  const std::vector<int64_t>& global_shape,
                                  std::vector<float>& global);

  // Checks tensor `name` of `kind` as Read does (its records cover it, each checksum matches)
  // without copying it; a later Read of it skips the checksums.
  [[nodiscard]] absl::Status Verify(const std::string& name, const std::string& kind,
                                    const std::vector<int64_t>& global_shape);

  // Starts reading tensor `name` of `kind` from disk in the background (nothing for an unknown
  // one): a reader that verifies one tensor prefetches the next, so the disk and the checksums
  // overlap.
  // At most `max_bytes` of each of its records, and only of records holding some of its
  // elements [lo, hi) (row-major; what a ReadRange of them will read).
  void Prefetch(const std::string& name, const std::string& kind,
                int64_t max_bytes = std::numeric_limits<int64_t>::max(), int64_t lo = 0,
                int64_t hi = std::numeric_limits<int64_t>::max());

  // After Verify: the tensor's values as spans of the mapped shard files (valid while the reader
  // lives) that follow one another in the tensor's row-major order and together are all of it,
  // so that a reader streams it without assembling it; empty when its records do not tile it
  // (Read assembles it then) or it was not verified.
  [[nodiscard]] absl::StatusOr<std::vector<std::span<const float>>> Runs(
      const std::string& name, const std::string& kind, const std::vector<int64_t>& global_shape);

  // After Verify: the tensor's values in the mapped shard file when they lie there whole and in
  // order (valid while the reader lives), else nullptr.
  [[nodiscard]] absl::StatusOr<const float*> WholeRecord(const std::string& name,
                                                         const std::string& kind,
                                                         const std::vector<int64_t>& global_shape);

  // Local elements [lo, hi) of tensor `name` of `kind` (in the tensor's row-major order) into
  // dst[0, hi - lo), read from the shard files with no mapping and no staging copy, each record
  // verified by its checksum as it is read; records holding none of [lo, hi) are not read. False,
  // with nothing read, when a record is not one run of the tensor (a tensor-parallel slice of a
  // matrix): Read assembles those. DATA_LOSS naming the file as Read; dst may then hold part of
  // the values.
  [[nodiscard]] absl::StatusOr<bool> ReadRange(const std::string& name, const std::string& kind,
                                               const std::vector<int64_t>& global_shape, int64_t lo,
                                               int64_t hi, float* dst);

  struct RecordRef {  // a record of a tensor, in shard `shard`
    int shard;
    const TensorRecord* record;
  };

 private:
  absl::Status ReadRecord(const RecordRef& ref, int64_t at, int64_t lo, int64_t hi, float* dst);

  const std::string path_;
  std::unique_ptr<ShardFiles> files_;
  std::map<std::pair<std::string, std::string>, std::vector<RecordRef>> index_;
  std::set<std::pair<std::string, std::string>> verified_;  // (kind, name)
  std::unique_ptr<StreamingChecksum> checksum_;             // ReadRange's
  std::vector<float> scratch_;  // ReadRange's bytes outside the wanted range
};

// Reads what `layout` (one rank's: its tensor-parallel slice and pipeline stage) needs from the
// checkpoint at `path` whose verified manifest is `manifest`.
[[nodiscard]] absl::StatusOr<RankState> LoadRankState(FileSystem& fs, const std::string& path,
                                                      const Manifest& manifest,
                                                      const ParameterLayout& layout);

// Where LoadRankStateInto puts what it reads: `kind` 0 the parameters, 1 the first moments, 2
// the second moments. `wants` says whether to read a tensor at all; `put` receives its local
// values (t.numel floats, valid during the call). `target`, when set, may name host memory for a
// tensor the rank holds whole: its local elements [lo, hi) are then read straight into `data`
// onward instead of through put (a null `data`: through put). Every target is asked for before
// anything is read.
struct StateSink {
  struct Target {
    float* data = nullptr;
    int64_t lo = 0, hi = 0;
  };
  std::function<bool(int kind, const ParamTensor& t)> wants;
  std::function<void(int kind, const ParamTensor& t, const float* local)> put;
  std::function<Target(int kind, const ParamTensor& t)> target;
};

// LoadRankState without full-size buffers: one tensor at a time, each record verified by its
// checksum before (put) or as (target) its values arrive. Tensors read straight into a target
// are read on the calling thread's OpenMP threads at once (each thread one tensor at a time,
// largest first); put runs on the calling thread, meanwhile. An error may leave some tensors
// replaced and others not: the caller restores every one from elsewhere then.
[[nodiscard]] absl::Status LoadRankStateInto(FileSystem& fs, const std::string& path,
                                             const Manifest& manifest,
                                             const ParameterLayout& layout, const StateSink& sink);

// The checkpoints a run tries to resume from, best first: checkpoint.dir's committed ones newest
// first with `recorded` (the coordinator's newest committed one, when given) before those of its
// step or older, then checkpoint.resume_from (a checkpoint, or a directory's committed ones
// newest first). A checkpoint newer than the record is one committed whose report never reached
// the coordinator (its node died first). The first that loads on every rank wins; none: the run
// starts from step 0.
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
