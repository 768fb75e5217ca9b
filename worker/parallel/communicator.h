// Communicator: the collectives one process group needs, over any engine (Gloo for CPU ranks;
// NCCL for GPU ranks; Gloo behind host staging for GPU ranks sharing a device). Every operation
// blocks until done, fails with DEADLINE_EXCEEDED after the communicator's timeout (a peer that
// stopped taking part), and with ABORTED once Abort() was called. Reductions are sums, in a fixed
// order: the same inputs give the same bits.
//
// Buffers are host memory for host engines, and device memory (or host memory, staged through
// the device) for GPU engines. The float overloads are the fp32 forms; the typed forms take a
// DType and a count of elements. bf16 sums accumulate in fp32 and round once per result (to
// nearest even); NCCL reduces bf16 natively instead, rounding at each of its ring steps, which
// is the same for two ranks and within a few bf16 ulps beyond.
//
// Threading: one thread at a time may issue operations (the training thread, or the
// communication thread of an AsyncCommunicator); Abort() may be called from any thread.
#ifndef TRAINYARD_WORKER_PARALLEL_COMMUNICATOR_H_
#define TRAINYARD_WORKER_PARALLEL_COMMUNICATOR_H_

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/dtype.h"
#include "worker/parallel/kv_store.h"
#include "worker/parallel/wait_registry.h"
#include "worker/shape/collectives.h"

namespace trainyard::worker::parallel {

// Bytes this rank sent, per kind of operation, since construction (or the last Reset).
class CommStats {
 public:
  void Add(CollectiveKind kind, int64_t bytes) {
    sent_[static_cast<int>(kind)].fetch_add(bytes, std::memory_order_relaxed);
  }
  int64_t bytes_sent(CollectiveKind kind) const {
    return sent_[static_cast<int>(kind)].load(std::memory_order_relaxed);
  }
  int64_t total() const;
  void Reset();

 private:
  std::array<std::atomic<int64_t>, static_cast<int>(CollectiveKind::kCount)> sent_{};
};

// A point-to-point transfer started by Communicator::StartSend or StartRecv and not yet finished.
// Wait blocks until it is (the data sent, or received into the buffer), with the
// communicator's timeout; the buffer must stay valid and untouched until then. Wait once; a
// transfer destroyed unwaited is abandoned (only on the way out of an error). Waited on the
// thread that issues the communicator's operations.
class PendingTransfer {
 public:
  virtual ~PendingTransfer() = default;
  [[nodiscard]] virtual absl::Status Wait() = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // data[0, count) ← Σ over ranks (ring: each rank sends 2·(n−1)/n of the buffer).
  [[nodiscard]] virtual absl::Status AllReduce(float* data, int64_t count) = 0;
  // in holds size()·count floats; out[0, count) ← Σ over ranks of in[rank·count, (rank+1)·count).
  // in and out may not overlap, except that out may be in + rank()·count.
  [[nodiscard]] virtual absl::Status ReduceScatter(const float* in, float* out, int64_t count) = 0;
  // out[r·count, (r+1)·count) ← rank r's in[0, count). in may be out + rank()·count.
  [[nodiscard]] virtual absl::Status AllGather(const float* in, float* out, int64_t count) = 0;
  // Several fp32 all-gathers with AllGather's contract each, issued together: an engine may have
  // them all on the wire at once, paying one exchange's latency per ring step instead of one per
  // gather. The default runs them one after another.
  struct GatherPart {
    const float* in;
    float* out;
    int64_t count;
  };
  [[nodiscard]] virtual absl::Status AllGatherMany(std::span<const GatherPart> parts);
  [[nodiscard]] virtual absl::Status Broadcast(float* data, int64_t count, int root) = 0;
  // Point to point; a Send matches the Recv with the same peer pair and tag.
  [[nodiscard]] virtual absl::Status Send(const float* data, int64_t count, int peer,
                                          uint32_t tag) = 0;
  [[nodiscard]] virtual absl::Status Recv(float* data, int64_t count, int peer, uint32_t tag) = 0;
  // Starts a send and a receive (to/from possibly different peers) and waits for both: the
  // exchange two pipeline stages make at once without deadlocking.
  [[nodiscard]] virtual absl::Status SendRecv(const float* send, int64_t send_count, int send_peer,
                                              uint32_t send_tag, float* recv, int64_t recv_count,
                                              int recv_peer, uint32_t recv_tag) = 0;
  // Point to point without waiting: several transfers in flight at once, each finished by its
  // PendingTransfer's Wait, so a pipeline stage need not wait for a receiver before it computes
  // on. An engine that starts transfers says so with StartsTransfers() and overrides both; the
  // base class answers UNIMPLEMENTED, naming the engine.
  virtual bool StartsTransfers() const { return false; }
  [[nodiscard]] virtual absl::StatusOr<std::unique_ptr<PendingTransfer>> StartSend(
      const void* data, int64_t count, DType dtype, int peer, uint32_t tag);
  [[nodiscard]] virtual absl::StatusOr<std::unique_ptr<PendingTransfer>> StartRecv(
      void* data, int64_t count, DType dtype, int peer, uint32_t tag);
  // SendRecv without waiting: one send and one receive started together (a hop around a ring),
  // finished by the returned transfer's Wait, so that the caller computes while they move. An
  // engine whose sends and receives cannot be started apart (NCCL's must be in one group) starts
  // the pair this way. StartsExchanges() says whether it returns before the exchange is done;
  // the default starts both transfers where the engine starts transfers, and otherwise runs
  // SendRecv at once (the transfer it returns is finished).
  virtual bool StartsExchanges() const { return StartsTransfers(); }
  [[nodiscard]] virtual absl::StatusOr<std::unique_ptr<PendingTransfer>> StartExchange(
      const void* send, int64_t send_count, int send_peer, uint32_t send_tag, void* recv,
      int64_t recv_count, int recv_peer, uint32_t recv_tag, DType dtype);
  [[nodiscard]] virtual absl::Status Barrier() = 0;
  // Makes every pending and later operation fail with ABORTED.
  virtual void Abort() = 0;

  // Typed forms of the operations above, with the same contracts; counts are in elements of
  // `dtype`. The defaults run kF32 through the float overloads and answer UNIMPLEMENTED, naming
  // the engine, for any other type; engines that move bf16 override them. A derived class that
  // overrides only one form adds `using Communicator::AllReduce;` (etc.) to keep the other.
  [[nodiscard]] virtual absl::Status AllReduce(void* data, int64_t count, DType dtype);
  [[nodiscard]] virtual absl::Status ReduceScatter(const void* in, void* out, int64_t count,
                                                   DType dtype);
  [[nodiscard]] virtual absl::Status AllGather(const void* in, void* out, int64_t count,
                                               DType dtype);
  [[nodiscard]] virtual absl::Status Send(const void* data, int64_t count, DType dtype, int peer,
                                          uint32_t tag);
  [[nodiscard]] virtual absl::Status Recv(void* data, int64_t count, DType dtype, int peer,
                                          uint32_t tag);
  [[nodiscard]] virtual absl::Status SendRecv(const void* send, int64_t send_count, int send_peer,
                                              uint32_t send_tag, void* recv, int64_t recv_count,
                                              int recv_peer, uint32_t recv_tag, DType dtype);

  // All-to-all with a count per peer (an MoE layer's tokens to their experts and back): `in`
  // holds send_counts[0] elements for rank 0, then send_counts[1] for rank 1, …; `out` receives
  // recv_counts[r] elements from each rank r, in rank order. Counts must agree pairwise (what r
  // sends to q is what q expects from r). This rank's own part is not moved: the caller copies
  // it (device memory is the backend's). The default exchanges with one peer pair per round
  // (send to rank + k, receive from rank − k), skipping empty transfers.
  [[nodiscard]] virtual absl::Status AllToAllV(const void* in, std::span<const int64_t> send_counts,
                                               void* out, std::span<const int64_t> recv_counts,
                                               DType dtype, uint32_t tag);

  // Names the engine in error messages ("gloo", "nccl", ...).
  virtual const char* engine() const { return "unnamed"; }

  CommStats& stats() { return stats_; }

 protected:
  CommStats stats_;
};

// Base for engines whose native operations are the typed ones (NCCL, host staging): the fp32
// overloads forward to them with DType::kF32.
class TypedCommunicator : public Communicator {
 public:
  using Communicator::AllGather;
  using Communicator::AllReduce;
  using Communicator::Recv;
  using Communicator::ReduceScatter;
  using Communicator::Send;
  using Communicator::SendRecv;

  [[nodiscard]] absl::Status AllReduce(float* data, int64_t count) final {
    return AllReduce(data, count, DType::kF32);
  }
  [[nodiscard]] absl::Status ReduceScatter(const float* in, float* out, int64_t count) final {
    return ReduceScatter(in, out, count, DType::kF32);
  }
  [[nodiscard]] absl::Status AllGather(const float* in, float* out, int64_t count) final {
    return AllGather(in, out, count, DType::kF32);
  }
  [[nodiscard]] absl::Status Send(const float* data, int64_t count, int peer, uint32_t tag) final {
    return Send(data, count, DType::kF32, peer, tag);
  }
  [[nodiscard]] absl::Status Recv(float* data, int64_t count, int peer, uint32_t tag) final {
    return Recv(data, count, DType::kF32, peer, tag);
  }
  [[nodiscard]] absl::Status SendRecv(const float* send, int64_t send_count, int send_peer,
                                      uint32_t send_tag, float* recv, int64_t recv_count,
                                      int recv_peer, uint32_t recv_tag) final {
    return SendRecv(send, send_count, send_peer, send_tag, recv, recv_count, recv_peer, recv_tag,
                    DType::kF32);
  }
};

struct GlooOptions {
  std::string hostname = "127.0.0.1";  // the interface this rank listens on
  std::chrono::milliseconds timeout{30000};
  // Where blocking waits are recorded (none when null), naming peers by the global rank of each
  // group rank (`members`; empty: group ranks are named as they are).
  WaitRegistry* waits = nullptr;
  std::vector<int> members;
};

// Connects a process group of `size` ranks over TCP. Every member calls it with the same
// `group` name (keys in `store` are prefixed by it) and its own rank in the group.
[[nodiscard]] absl::StatusOr<std::unique_ptr<Communicator>> ConnectGloo(KeyValueStore& store,
                                                                        const std::string& group,
                                                                        int rank, int size,
                                                                        const GlooOptions& options);

// A double carried as two floats (its high part and the remainder), so that a float collective
// keeps about 48 bits of it: the encoding of the sums below.
inline void ToFloatPair(double value, float* pair) {
  pair[0] = static_cast<float>(value);
  pair[1] = static_cast<float>(value - static_cast<double>(pair[0]));
}
inline double FromFloatPair(const float* pair) {
  return static_cast<double>(pair[0]) + static_cast<double>(pair[1]);
}

// Σ over `group` of one double per rank, as a float pair. A group of one returns `value`.
[[nodiscard]] absl::StatusOr<double> AllReduceDouble(Communicator& group, double value);
// The same for several values in one collective, summed in place.
[[nodiscard]] absl::Status AllReduceDoubles(Communicator& group, std::span<double> values);

// A group of one: every collective is a copy (or nothing).
std::unique_ptr<Communicator> MakeSelfCommunicator();

}  // namespace trainyard::worker::parallel

#endif  // TRAINYARD_WORKER_PARALLEL_COMMUNICATOR_H_
