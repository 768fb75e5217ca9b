// TensorParallelOps: the communication of a tensor-parallel model shard, in one place (as
// Megatron-LM's mappings). The model calls these at the edges of its parallel regions and does
// no collective of its own:
//   - AllReduce: after a row-parallel linear (without sequence parallelism) and for a
//     column-parallel linear's input gradient; the norms' weight gradients under sequence
//     parallelism;
//   - ToFullRows / SumToLocalRows: sequence parallelism's all-gather before the column-parallel
//     linears and reduce-scatter after the row-parallel ones (the same bytes as the all-reduce
//     they replace); without it, nothing and the all-reduce;
//   - AllGather: the vocabulary-parallel loss's per-row statistics (three floats a row).
// Every operation is exposed (the next one needs its result) and timed.
//
// Threading: the training thread only, as the group's Communicator.
#ifndef TRAINYARD_WORKER_TENSOR_PARALLEL_H_
#define TRAINYARD_WORKER_TENSOR_PARALLEL_H_

#include <cstdint>
#include <functional>

#include "absl/status/status.h"
#include "common/dtype.h"
#include "worker/backend.h"
#include "worker/parallel/communicator.h"

namespace trainyard::worker {

class TensorParallelOps {
 public:
  // `group` (null, or of size 1: no tensor parallelism, every operation a no-op) must outlive
  // this; sequence parallelism applies only with a group of two or more. Activations move as
  // `act_dtype`.
  TensorParallelOps(parallel::Communicator* group, bool sequence_parallel, DType act_dtype);

  int size() const { return group_ != nullptr ? group_->size() : 1; }
  int rank() const { return group_ != nullptr ? group_->rank() : 0; }
  bool sequence_parallel() const { return sp_; }
  // Of `rows` rows of the residual stream, those this rank holds: rows / size under sequence
  // parallelism, else all.
  int64_t LocalRows(int64_t rows) const { return sp_ ? rows / size() : rows; }

  // data[0, count) ← Σ over the group, in place.
  [[nodiscard]] absl::Status AllReduce(float* data, int64_t count);
  [[nodiscard]] absl::Status AllReduce(Act* data, int64_t count);
  // Sequence parallelism: full (size · local_count) ← every rank's local rows, in rank order.
  // Otherwise nothing (the caller's full rows are its local ones).
  [[nodiscard]] absl::Status ToFullRows(const Act* local, Act* full, int64_t local_count);
  // The sum over the group of `full` (full_count elements): under sequence parallelism this
  // rank's rows of it into `local` (full_count / size); otherwise all of it, in place in `full`.
  [[nodiscard]] absl::Status SumToLocalRows(Act* full, Act* local, int64_t full_count);
  // fp32 all-gather: out[r·count, (r+1)·count) ← rank r's in.
  [[nodiscard]] absl::Status AllGather(const float* in, float* out, int64_t count);

  // Seconds spent in these operations since construction.
  double seconds() const { return seconds_; }

 private:
  [[nodiscard]] absl::Status Timed(const std::function<absl::Status()>& op);

  parallel::Communicator* group_;
  bool sp_;
  DType act_dtype_;
  double seconds_ = 0.0;
};

}  // namespace trainyard::worker

#endif  // TRAINYARD_WORKER_TENSOR_PARALLEL_H_
