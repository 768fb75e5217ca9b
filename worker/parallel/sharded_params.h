// ShardedParams: a ParamSource that decides where parameters, gradients and optimizer state
// live across the data-parallel group, by ZeRO stage:
//
//   stage 0  everything replicated; gradients all-reduced in buckets during the backward pass;
//   stage 1  optimizer state sharded; gradients all-reduced; parameters all-gathered after the
//            update;
//   stage 2  gradients sharded too: each group's gradient is reduce-scattered as soon as the
//            backward pass finishes it, and its full-size staging buffer freed when the next
//            group's is handed over (waiting for the reduction if it lags: at most two at once);
//   stage 3  parameters sharded too (FSDP): a group is all-gathered just before use (the next one
//            prefetched) and freed after.
//
// Each ParamGroup is split into `dp` equal chunks (the group padded to a multiple of dp); rank r
// owns chunk r of every group. With dp = 1 and stage 0 this is a plain local optimizer.
//
// Every collective runs on one communication thread in the order the training thread issued it,
// so all ranks issue the same sequence. Threading: methods are called from the training thread.
#ifndef TRAINYARD_WORKER_PARALLEL_SHARDED_PARAMS_H_
#define TRAINYARD_WORKER_PARALLEL_SHARDED_PARAMS_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "worker/backend.h"
#include "worker/optimizer.h"
#include "worker/parallel/async_runner.h"
#include "worker/parallel/communicator.h"
#include "worker/param_source.h"
#include "worker/shape/parameters.h"

namespace trainyard::worker::parallel {

struct ShardingOptions {
  int zero_stage = 0;              // 0..3
  int64_t bucket_bytes = 1 << 20;  // stages 0/1: gradient all-reduce bucket size
};

// Bytes this rank holds, split as the memory equation splits them.
struct MemoryAccount {
  int64_t params = 0;          // persistent parameter storage
  int64_t grads = 0;           // persistent gradient storage
  int64_t optimizer = 0;       // AdamW moments
  int64_t peak_transient = 0;  // largest gathered-parameter + gradient-staging footprint seen
};

// When each gradient collective of the last step finished, against the end of the backward pass
// (steady-clock nanoseconds).
struct OverlapTimeline {
  std::vector<int64_t> bucket_done_ns;  // in launch order
  int64_t backward_end_ns = 0;
};

// Expert parallelism (an MoE model with ep > 1): the groups its routed experts live on. `ep`: the
// data-parallel ranks that hold different experts (the tokens' all-to-all); `edp`: those that
// hold the same ones, over which the experts' gradients are summed and their ZeRO shards split.
// Null: no expert parallelism (the experts are data-parallel like the rest).
struct ExpertGroups {
  Communicator* ep = nullptr;
  Communicator* edp = nullptr;
};

class ShardedParams final : public ParamSource {
 public:
  // `dp` (the data-parallel group), `tp` and `pp` (the tensor- and pipeline-parallel groups, or
  // null), `backend` and `layout` (this rank's) must outlive the object. `tp` and `pp` are used
  // only for the global gradient norm, from the calling thread.
  // The layout's expert groups (ParamGroup::experts) use `experts.edp` in place of `dp`.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<ShardedParams>> Create(
      const ParameterLayout& layout, Backend* backend, Communicator* dp, Communicator* tp,
      Communicator* pp, const ShardingOptions& sharding, ExpertGroups experts = {});
  ~ShardedParams() override;

  // The model's initialisation, the same values on every mesh (ParameterLayout::Initialize):
  // under ZeRO-3 each group's own shard only, drawn without the rest; else the whole layout.
  void Initialize(uint64_t seed);
  // Loads a full parameter vector (layout order) from the host; keeps what this rank owns.
  void LoadParameters(const float* host);
  // The full parameters (gathered under stage 3), in layout order.
  [[nodiscard]] absl::Status GatherParameters(float* host);

  // Checkpoints. The elements [lo, hi) (local flat positions) of layout tensor `tensor` that this
  // rank stores, of its parameters and of both AdamW moments. Data-parallel rank r stores chunk r
  // of every group whatever the ZeRO stage (so the bytes are spread over the group); tensor-
  // parallel ranks other than 0 skip tensors replicated over their group; a last pipeline stage
  // skips its copy of a tied embedding. Over the whole mesh, every element is stored once.
  struct SavedRange {
    int tensor;
    int64_t lo, hi;
  };
  std::vector<SavedRange> CheckpointRanges() const;
  // Copies the ranges' parameters, then their first moments, then their second moments, each in
  // range order, to `host` (3 · Σ(hi − lo) floats). Waits for queued collectives first.
  [[nodiscard]] absl::Status Snapshot(const std::vector<SavedRange>& ranges, float* host);
  // Replaces parameters and moments with full local tensors in layout order (layout.total()
  // floats each, on the host); keeps what this rank owns.
  [[nodiscard]] absl::Status RestoreState(const float* params, const float* first_moment,
                                          const float* second_moment);
  // The same one tensor at a time, straight into place (no full-size staging): `kind` 0 the
  // parameters, 1 the first moments, 2 the second; `local` the tensor's t.numel local values.
  // WantsState says whether this rank keeps any of the tensor's `kind` (a ZeRO rank keeps the
  // moments of its shard only), so that a reader may skip it. Call WaitAll first (BeginRestore)
  // and FinishRestore after.
  [[nodiscard]] absl::Status BeginRestore() { return WaitAll(); }
  bool WantsState(int kind, const ParamTensor& t) const;
  void RestoreTensor(int kind, const ParamTensor& t, const float* local);
  // Where RestoreTensor puts tensor t's `kind`: its local elements [lo, hi) go to `data`
  // onward. RestoreTarget gives it only when this rank's buffers are host memory, so that a
  // reader may write the values there itself; {nullptr, 0, 0} when the rank keeps none of them
  // or its memory is a device's.
  struct Destination {
    float* data = nullptr;
    int64_t lo = 0, hi = 0;
  };
  Destination RestoreTarget(int kind, const ParamTensor& t);
  [[nodiscard]] absl::Status FinishRestore() { return backend_->Synchronize(); }
  // AdamW's moments back to zero (a fresh start after a partial restore).
  void ZeroMoments() {
    backend_->Fill(m_.data(), 0.0f, m_.size());
    backend_->Fill(v_.data(), 0.0f, v_.size());
  }

  // Call once before an optimizer step's first micro-batch: zeroes the gradients.
  [[nodiscard]] absl::Status BeginStep();
  // Call before each micro-batch's backward pass: whether it is the step's last, the one whose
  // gradients stages 0/1 reduce.
  void SetLastMicroBatch(bool last) { last_micro_batch_ = last; }
  // The optimizer step around this object (the optimizer's arithmetic is worker/optimizer.h's):
  //   FinishGradients  after the last micro-batch: waits for the gradient collectives, and with
  //                    `tied` (pipeline stages that both hold the tied token embedding, stages
  //                    0/1 only) sums the two copies' gradients;
  //   QueueGradientSquares  after FinishGradients: the squares of the gradients this rank
  //                    counts, summed on the device with their read started, so that the wait
  //                    for a sum read after it (the step's loss) covers them too;
  //   GradientNorm     the global L2 norm of the final gradients, over the whole mesh (queuing
  //                    the squares itself unless QueueGradientSquares did); each of
  //                    `batch_sums` (e.g. the rank's loss sum) is summed in place over the
  //                    data-parallel and pipeline groups in the same collectives, so that the
  //                    step's other sums cost no synchronisation of their own;
  //   OptimizerSlices  what this rank updates: each tensor's part of the owned chunk of its
  //                    group, with its gradient and AdamW moments (all of it at stage 0);
  //   FinishUpdate     after the update: re-assembles the parameters (stages 1–2) or drops the
  //                    gathered groups nobody holds (stage 3).
  [[nodiscard]] absl::Status FinishGradients(Communicator* tied = nullptr);
  void QueueGradientSquares();
  [[nodiscard]] absl::StatusOr<double> GradientNorm(std::span<double> batch_sums = {});
  std::vector<OptimizerSlice> OptimizerSlices();
  [[nodiscard]] absl::Status FinishUpdate();
  // Σ over the data-parallel group (e.g. of per-rank loss sums), through the same ordered queue.
  [[nodiscard]] absl::StatusOr<double> SumOverRanks(double value);
  [[nodiscard]] absl::Status SumOverRanks(std::span<double> values);  // in place, one collective

  // ParamSource. Under ZeRO-3 a group is gathered into memory that other groups reuse.
  bool persistent() const override { return options_.zero_stage < 3; }
  [[nodiscard]] absl::StatusOr<const float*> Acquire(int group) override;
  void Prefetch(int group) override;
  void Release(int group) override;
  [[nodiscard]] absl::StatusOr<float*> Gradients(int group) override;
  [[nodiscard]] absl::Status GradientsReady(int group) override;

  MemoryAccount memory() const;
  OverlapTimeline timeline() const;
  int zero_stage() const { return options_.zero_stage; }
  // Time the training thread spent waiting for this object's collectives (not hidden behind
  // compute), since construction.
  double exposed_comm_seconds() const { return exposed_ns_ / 1e9; }

 private:
  struct Group;
  ShardedParams(const ParameterLayout& layout, Backend* backend, Communicator* dp, Communicator* tp,
                Communicator* pp, const ShardingOptions& sharding, ExpertGroups experts);
  void Allocate();
  const Group& GroupOf(const ParamTensor& t) const;
  // Where element `local` of group `g` (counted from the group's start) lives in this rank's
  // gradients, parameters and optimizer state at its ZeRO stage; `local` lies in the owned range
  // for the sharded ones.
  float* GradAt(const Group& g, int64_t local);
  float* ParamAt(const Group& g, int64_t local);
  int64_t StateOffset(const Group& g, int64_t local) const;
  // Where tensor t's `kind` lives in this rank's buffers (RestoreTarget's meaning, any memory).
  Destination Place(int kind, const ParamTensor& t);
  [[nodiscard]] absl::Status WaitAll();
  void LaunchReady(int group);
  void StartGather(int group);
  // Adds the finished reduce-scatters' results into the owned gradient chunks, in launch order;
  // with `wait`, waits for all of them. Training thread only.
  void AccumulateReduced(bool wait);
  // The squares of the gradients this rank counts into squares_ and expert_squares_, their
  // reads started.
  void AddGradientSquares();
  void UpdateTransient(int64_t delta);  // any thread
  size_t NewTimelineSlot();
  void MarkDone(size_t slot);  // any thread

  const ParameterLayout& layout_;
  Backend* backend_;
  Communicator* dp_;
  Communicator* tp_;
  Communicator* pp_;
  ExpertGroups experts_;
  ShardingOptions options_;
  std::vector<Group> groups_;
  Buffer<float> params_;        // stages 0–2: padded full layout
  Buffer<float> grads_;         // stages 0–1: padded full layout
  Buffer<float> shard_params_;  // stage 3: owned chunks
  Buffer<float> shard_grads_;   // stages 2–3: owned chunks
  Buffer<float> m_, v_;         // owned chunks
  std::vector<int> bucket_of_;  // stages 0–1: group → bucket
  std::vector<std::vector<int>> buckets_;
  std::vector<int> bucket_pending_;
  std::vector<AsyncRunner::Work> in_flight_;
  // Stages 2–3: a group's reduce-scatter, whose result the communication thread leaves in this
  // rank's slice of the staging buffer. The training thread adds it into the owned chunk: the
  // chunk is device memory on a GPU backend, and the Backend is used from this thread only.
  struct PendingGradient {
    AsyncRunner::Work work;
    std::shared_ptr<Buffer<float>> staging;
    float* owned;
    int64_t chunk;
    int rank;  // in the group's communicator
  };
  std::deque<PendingGradient> pending_;  // in launch order
  // QueueGradientSquares' sums (the experts' apart: summed over the expert-parallel group at
  // stage 0) until GradientNorm reads them.
  std::unique_ptr<DeviceSum> squares_, expert_squares_;
  bool squares_queued_ = false;
  bool last_micro_batch_ = true;
  int64_t exposed_ns_ = 0;
  std::atomic<int64_t> transient_{0};
  std::atomic<int64_t> peak_transient_{0};
  MemoryAccount memory_;  // persistent sizes, fixed at construction
  mutable absl::Mutex timeline_mu_;
  OverlapTimeline timeline_ ABSL_GUARDED_BY(timeline_mu_);
  std::unique_ptr<AsyncRunner> comm_;  // last: joined first on destruction
};

}  // namespace trainyard::worker::parallel

#endif  // TRAINYARD_WORKER_PARALLEL_SHARDED_PARAMS_H_
