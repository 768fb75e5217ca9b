// ContextParallelOps: a model shard's share of every sequence under context parallelism, and the
// ring attention that lets its queries see the keys of the other shares (as Megatron-Core's and
// TorchTitan's context parallelism).
//
// The head-tail split: each sequence of t tokens is cut into 2·N chunks of c = t / (2·N); rank r
// of the N-rank group holds chunks r and 2N − 1 − r, so that every rank has as much causal
// attention to do. A rank's rows are half-major: the b sequences' first chunk ([b, c] rows), then
// their second. Everything but attention (and the positions) works on rows and needs nothing
// from the other ranks.
//
// Attention: the keys and values of every rank travel once around the ring (only the key/value
// heads, [2·b·c, 2·kv_heads·d] per rank), the transfer of the next rank's overlapped with the
// attention against the one in hand. A query chunk attends to a key chunk before it in full and
// to its own causally, and ignores those after it; the partial results merge by their
// log-sum-exp. The backward sends the keys and values around the ring again, with the gradients
// of each rank's keys and values travelling behind them, added to by every rank they pass, back
// to their owner. Sums follow the ring order, so they are deterministic.
//
// Threading: the training thread only, as the group's Communicator.
#ifndef TRAINYARD_WORKER_CONTEXT_PARALLEL_H_
#define TRAINYARD_WORKER_CONTEXT_PARALLEL_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "worker/backend.h"
#include "worker/buffer.h"
#include "worker/parallel/communicator.h"

namespace trainyard::worker {

// The head-tail split of a sequence over `size` ranks: which of its 2·size chunks local half
// `half` (0 or 1) of rank `rank` holds.
inline int HeadTailChunk(int rank, int size, int half) {
  return half == 0 ? rank : 2 * size - 1 - rank;
}
// Rank `rank`'s tokens of b sequences of t (host [b, t]) in its row order:
// local[h][i][j] = full[i][HeadTailChunk(rank, size, h)·c + j], c = t / (2·size).
void SplitHeadTail(const int32_t* full, int b, int t, int rank, int size, int32_t* local);

class ContextParallelOps {
 public:
  // `group` (null, or of size 1: no context parallelism) and `backend` must outlive this.
  ContextParallelOps(parallel::Communicator* group, Backend* backend);
  ~ContextParallelOps();

  int size() const { return group_ != nullptr ? group_->size() : 1; }
  int rank() const { return group_ != nullptr ? group_->rank() : 0; }
  bool enabled() const { return size() > 1; }
  parallel::Communicator* group() const { return group_; }

  // Which of the sequence's 2·size() chunks local half `half` (0 or 1) holds.
  int ChunkOf(int half) const { return HeadTailChunk(rank(), size(), half); }
  // This rank's tokens in its row order (SplitHeadTail).
  void Split(const int32_t* full, int b, int t, int32_t* local) const {
    SplitHeadTail(full, b, t, rank(), size(), local);
  }

  // Causal attention over the whole sequences, for this rank's rows: `local` is the shape of the
  // local rows as one sequence of 2·c per batch entry (seq = 2·c). out [2·b·c, heads·d],
  // lse [2][b, heads, c] (each half's log-sum-exp block), qkv packed as the backend's Attention.
  [[nodiscard]] absl::Status Attention(Act* out, float* lse, const Act* qkv,
                                       const AttentionShape& local);
  // dqkv (overwritten) from dout, with the forward's qkv, out and lse.
  [[nodiscard]] absl::Status AttentionBackward(Act* dqkv, const Act* dout, const Act* qkv,
                                               const Act* out, const float* lse,
                                               const AttentionShape& local);

  // Bytes of the ring's buffers (held from the first attention on, shared by every layer and
  // micro-batch): keys and values in hand and arriving, their gradients going and arriving, and
  // one partial result.
  int64_t scratch_bytes() const;
  // Seconds spent waiting for ring transfers (what the attention did not hide) since
  // construction.
  double seconds() const { return seconds_; }

 private:
  struct Scratch;
  class Ring;

  int ChunkOf(int rank, int half) const { return HeadTailChunk(rank, size(), half); }
  void EnsureScratch(const AttentionShape& local);
  // Attention of this rank's query halves against the keys and values of rank `src` (packed
  // [2·b·c, 2·kv_heads·d]), merged into out and lse; `filled` says which query halves have a
  // result yet.
  void ForwardBlocks(int src, const Act* kv, Act* out, float* lse, const Act* qkv,
                     const AttentionShape& local, bool filled[2]);
  // The backward of the same blocks: dq += into dqkv's query columns, dk and dv += into dkv.
  void BackwardBlocks(int src, const Act* kv, Act* dkv, Act* dqkv, const Act* dout, const Act* qkv,
                      const Act* out, const float* lse, const AttentionShape& local);

  parallel::Communicator* group_;
  Backend* backend_;
  std::unique_ptr<Scratch> scratch_;
  double seconds_ = 0.0;
};

}  // namespace trainyard::worker

#endif  // TRAINYARD_WORKER_CONTEXT_PARALLEL_H_
