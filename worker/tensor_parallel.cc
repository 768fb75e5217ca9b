#include "worker/tensor_parallel.h"

#include <algorithm>
#include <chrono>

namespace trainyard::worker {

TensorParallelOps::TensorParallelOps(parallel::Communicator* group, bool sequence_parallel,
                                     DType act_dtype)
    : group_(group),
      sp_(sequence_parallel && group != nullptr && group->size() > 1),
      act_dtype_(act_dtype) {}

absl::Status TensorParallelOps::Timed(const std::function<absl::Status()>& op) {
  const auto start = std::chrono::steady_clock::now();
  absl::Status status = op();
  seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return status;
}

absl::Status TensorParallelOps::AllReduce(float* data, int64_t count) {
  if (size() == 1) return absl::OkStatus();
  return Timed([&] { return group_->AllReduce(data, count); });
}

absl::Status TensorParallelOps::AllReduce(Act* data, int64_t count) {
  if (size() == 1) return absl::OkStatus();
  return Timed([&] { return group_->AllReduce(data, count, act_dtype_); });
}

absl::Status TensorParallelOps::ToFullRows(const Act* local, Act* full, int64_t local_count) {
  if (!sp_) return absl::OkStatus();
  return Timed([&] { return group_->AllGather(local, full, local_count, act_dtype_); });
}

absl::Status TensorParallelOps::SumToLocalRows(Act* full, Act* local, int64_t full_count) {
  if (size() == 1) return absl::OkStatus();
  if (!sp_) return AllReduce(full, full_count);
  return Timed([&] { return group_->ReduceScatter(full, local, full_count / size(), act_dtype_); });
}

absl::Status TensorParallelOps::AllGather(const float* in, float* out, int64_t count) {
  if (size() == 1) {
    std::copy(in, in + count, out);
    return absl::OkStatus();
  }
  return Timed([&] { return group_->AllGather(in, out, count); });
}

}  // namespace trainyard::worker
