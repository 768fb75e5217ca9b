// The NCCL engine. The communicator is non-blocking (config.blocking = 0), so no NCCL call can
// hang the calling thread: every wait is a poll of ncclCommGetAsyncError and cudaStreamQuery
// against a deadline, and a stuck operation ends in ncclCommAbort.
#include "worker/parallel/nccl_communicator.h"

#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <span>
#include <string>
#include <thread>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "kernels/cuda/check.h"
#include "worker/parallel/cuda_device_copier.h"

namespace trainyard::worker::parallel {
namespace {

using Clock = std::chrono::steady_clock;

// NCCL's failures as a Status: a peer that went away or a network error is UNAVAILABLE (the
// group is broken; restart it), a rejected argument INVALID_ARGUMENT, anything else INTERNAL.
absl::Status NcclStatus(ncclResult_t result, const char* what) {
  const std::string message =
      absl::StrCat(what, ": NCCL error ", static_cast<int>(result), " (",
                   ncclGetErrorString(result), "): ", ncclGetLastError(nullptr));
  switch (result) {
    case ncclRemoteError:
    case ncclSystemError:
      return absl::UnavailableError(message);
    case ncclInvalidArgument:
    case ncclInvalidUsage:
      return absl::InvalidArgumentError(message);
    default:
      return absl::InternalError(message);
  }
}

ncclDataType_t NcclType(DType dtype) { return dtype == DType::kBF16 ? ncclBfloat16 : ncclFloat32; }

// Elements this rank sends in a ring all-reduce of `count` elements over `n` ranks, with the
// chunks the Gloo engine uses: the reduce-scatter phase sends every chunk but this rank's own,
// the all-gather phase every chunk but the next rank's.
int64_t RingAllReduceElements(int64_t count, int n, int rank) {
  if (n == 1) return 0;
  auto chunk = [&](int i) { return count * (i + 1) / n - count * i / n; };
  return 2 * count - chunk(rank) - chunk((rank + 1) % n);
}

// Spins briefly (most collectives finish within microseconds to milliseconds), then sleeps
// between polls so a long wait does not hold a core.
void PausePoll(int polls) {
  if (polls < 2000) {
    std::this_thread::yield();
  } else {
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

// Device memory on the communicator's stream that grows on demand, in stream order: the old
// buffer is freed after the work queued on the stream, without waiting (cudaFree would wait for
// the whole device, the training thread's NCCL kernels too, which may be waiting for peers that
// wait for this communicator). Release before the stream is destroyed.
class Scratch {
 public:
  Scratch() = default;
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  absl::StatusOr<void*> Reserve(int64_t bytes, cudaStream_t stream) {
    if (bytes <= capacity_ && ptr_ != nullptr) return ptr_;
    Release(stream);
    const int64_t size = std::max<int64_t>(bytes, 256);
    TY_CUDA_RETURN_IF_ERROR(cudaMallocAsync(&ptr_, size, stream));
    capacity_ = size;
    return ptr_;
  }
  void Release(cudaStream_t stream) {
    if (ptr_ != nullptr) cudaFreeAsync(ptr_, stream);
    ptr_ = nullptr;
    capacity_ = 0;
  }

 private:
  void* ptr_ = nullptr;
  int64_t capacity_ = 0;
};

// Waits until the non-blocking `comm` has finished its pending call (initialisation, an enqueue,
// finalisation): OK, the call's error, or DEADLINE_EXCEEDED.
absl::Status WaitReady(ncclComm_t comm, Clock::time_point deadline, const char* what) {
  for (int polls = 0;; ++polls) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t queried = ncclCommGetAsyncError(comm, &state);
    if (queried != ncclSuccess) return NcclStatus(queried, what);
    if (state == ncclSuccess) return absl::OkStatus();
    if (state != ncclInProgress) return NcclStatus(state, what);
    if (Clock::now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat(what, ": not ready by the deadline"));
    }
    PausePoll(polls);
  }
}

class NcclCommunicator final : public TypedCommunicator {
 public:
  // `producer` is the stream whose work writes the buffers handed to this communicator (the
  // backend's); `stream` and `ready` belong to the communicator, which destroys them.
  NcclCommunicator(ncclComm_t comm, int rank, int size, int device, cudaStream_t producer,
                   cudaStream_t stream, cudaEvent_t ready, std::chrono::milliseconds timeout)
      : comm_(comm),
        rank_(rank),
        size_(size),
        device_(device),
        producer_(producer),
        stream_(stream),
        ready_(ready),
        timeout_(timeout),
        copier_(MakeCudaDeviceCopier(stream)) {}

  ~NcclCommunicator() override {
    cudaSetDevice(device_);
    if (comm_ != nullptr) {
      if (aborted_.load() || !Finalize()) {
        AbortComm("");
      } else {
        ncclCommDestroy(comm_);
      }
    }
    for (Scratch* scratch : {&first_, &second_, &barrier_}) scratch->Release(stream_);
    cudaEventDestroy(ready_);
    cudaStreamDestroy(stream_);
  }

  const char* engine() const override { return "nccl"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  absl::Status AllReduce(void* data, int64_t count, DType dtype) override {
    constexpr const char* kWhat = "nccl all-reduce";
    TY_RETURN_IF_ERROR(Begin(kWhat, count >= 0));
    const int64_t bytes = count * DTypeBytes(dtype);
    TY_ASSIGN_OR_RETURN(void* buf, StageIn(data, bytes, first_));
    TY_RETURN_IF_ERROR(
        Complete(kWhat, ncclAllReduce(buf, buf, count, NcclType(dtype), ncclSum, comm_, stream_)));
    TY_RETURN_IF_ERROR(StageOut(buf, data, bytes));
    stats_.Add(CollectiveKind::kAllReduce,
               RingAllReduceElements(count, size_, rank_) * DTypeBytes(dtype));
    return absl::OkStatus();
  }

  absl::Status ReduceScatter(const void* in, void* out, int64_t count, DType dtype) override {
    constexpr const char* kWhat = "nccl reduce-scatter";
    TY_RETURN_IF_ERROR(Begin(kWhat, count >= 0));
    const int64_t bytes = count * DTypeBytes(dtype);
    TY_ASSIGN_OR_RETURN(void* in_buf, StageIn(in, bytes * size_, first_));
    TY_ASSIGN_OR_RETURN(void* out_buf, StageTarget(out, bytes, second_));
    TY_RETURN_IF_ERROR(Complete(kWhat, ncclReduceScatter(in_buf, out_buf, count, NcclType(dtype),
                                                         ncclSum, comm_, stream_)));
    TY_RETURN_IF_ERROR(StageOut(out_buf, out, bytes));
    stats_.Add(CollectiveKind::kReduceScatter, bytes * (size_ - 1));
    return absl::OkStatus();
  }

  absl::Status AllGather(const void* in, void* out, int64_t count, DType dtype) override {
    constexpr const char* kWhat = "nccl all-gather";
    TY_RETURN_IF_ERROR(Begin(kWhat, count >= 0));
    const int64_t bytes = count * DTypeBytes(dtype);
    TY_ASSIGN_OR_RETURN(void* in_buf, StageIn(in, bytes, first_));
    TY_ASSIGN_OR_RETURN(void* out_buf, StageTarget(out, bytes * size_, second_));
    TY_RETURN_IF_ERROR(
        Complete(kWhat, ncclAllGather(in_buf, out_buf, count, NcclType(dtype), comm_, stream_)));
    TY_RETURN_IF_ERROR(StageOut(out_buf, out, bytes * size_));
    stats_.Add(CollectiveKind::kAllGather, bytes * (size_ - 1));
    return absl::OkStatus();
  }

  absl::Status Broadcast(float* data, int64_t count, int root) override {
    constexpr const char* kWhat = "nccl broadcast";
    TY_RETURN_IF_ERROR(Begin(kWhat, count >= 0 && root >= 0 && root < size_));
    const int64_t bytes = count * static_cast<int64_t>(sizeof(float));
    TY_ASSIGN_OR_RETURN(void* buf, StageIn(data, bytes, first_));
    TY_RETURN_IF_ERROR(
        Complete(kWhat, ncclBroadcast(buf, buf, count, ncclFloat32, root, comm_, stream_)));
    TY_RETURN_IF_ERROR(StageOut(buf, data, bytes));
    if (rank_ == root) stats_.Add(CollectiveKind::kBroadcast, bytes * (size_ - 1));
    return absl::OkStatus();
  }

  absl::Status Send(const void* data, int64_t count, DType dtype, int peer, uint32_t) override {
    constexpr const char* kWhat = "nccl send";
    TY_RETURN_IF_ERROR(Begin(kWhat, count >= 0 && ValidPeer(peer) && peer != rank_));
    const int64_t bytes = count * DTypeBytes(dtype);
    TY_ASSIGN_OR_RETURN(void* buf, StageIn(data, bytes, first_));
    TY_RETURN_IF_ERROR(
        Complete(kWhat, ncclSend(buf, count, NcclType(dtype), peer, comm_, stream_)));
    stats_.Add(CollectiveKind::kSendRecv, bytes);
    return absl::OkStatus();
  }

  absl::Status Recv(void* data, int64_t count, DType dtype, int peer, uint32_t) override {
    constexpr const char* kWhat = "nccl recv";
    TY_RETURN_IF_ERROR(Begin(kWhat, count >= 0 && ValidPeer(peer) && peer != rank_));
    const int64_t bytes = count * DTypeBytes(dtype);
    TY_ASSIGN_OR_RETURN(void* buf, StageTarget(data, bytes, first_));
    TY_RETURN_IF_ERROR(
        Complete(kWhat, ncclRecv(buf, count, NcclType(dtype), peer, comm_, stream_)));
    return StageOut(buf, data, bytes);
  }

  absl::Status SendRecv(const void* send, int64_t send_count, int send_peer, uint32_t, void* recv,
                        int64_t recv_count, int recv_peer, uint32_t, DType dtype) override {
    constexpr const char* kWhat = "nccl send-recv";
    TY_RETURN_IF_ERROR(Begin(
        kWhat, send_count >= 0 && recv_count >= 0 && ValidPeer(send_peer) && ValidPeer(recv_peer)));
    const int64_t send_bytes = send_count * DTypeBytes(dtype);
    const int64_t recv_bytes = recv_count * DTypeBytes(dtype);
    TY_ASSIGN_OR_RETURN(void* send_buf, StageIn(send, send_bytes, first_));
    TY_ASSIGN_OR_RETURN(void* recv_buf, StageTarget(recv, recv_bytes, second_));
    TY_RETURN_IF_ERROR(Complete(kWhat, GroupSendRecv(send_buf, send_count, send_peer, recv_buf,
                                                     recv_count, recv_peer, NcclType(dtype))));
    TY_RETURN_IF_ERROR(StageOut(recv_buf, recv, recv_bytes));
    // A rank sending to itself moves nothing over a link.
    if (send_peer != rank_) stats_.Add(CollectiveKind::kSendRecv, send_bytes);
    return absl::OkStatus();
  }

  // A hop around a ring, queued on this communicator's stream (after the producer's work, as
  // every operation) and waited for by the returned transfer: the producer's stream runs the
  // caller's next kernels meanwhile. Host buffers take the default, an exchange at once.
  bool StartsExchanges() const override { return true; }
  absl::StatusOr<std::unique_ptr<PendingTransfer>> StartExchange(
      const void* send, int64_t send_count, int send_peer, uint32_t send_tag, void* recv,
      int64_t recv_count, int recv_peer, uint32_t recv_tag, DType dtype) override {
    constexpr const char* kWhat = "nccl send-recv";
    if (!copier_->IsDevicePointer(send) || !copier_->IsDevicePointer(recv)) {
      return Communicator::StartExchange(send, send_count, send_peer, send_tag, recv, recv_count,
                                         recv_peer, recv_tag, dtype);
    }
    TY_RETURN_IF_ERROR(Begin(
        kWhat, send_count >= 0 && recv_count >= 0 && ValidPeer(send_peer) && ValidPeer(recv_peer)));
    TY_RETURN_IF_ERROR(WaitQueued(kWhat, GroupSendRecv(send, send_count, send_peer, recv,
                                                       recv_count, recv_peer, NcclType(dtype))));
    // Its own event, so that waiting for it does not wait for what is queued after it (the next
    // exchange of another ring).
    cudaEvent_t done = nullptr;
    TY_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    auto exchange = std::make_unique<Exchange>(
        this, send_peer != rank_ ? send_count * DTypeBytes(dtype) : 0, done);
    TY_CUDA_RETURN_IF_ERROR(cudaEventRecord(done, stream_));
    return std::unique_ptr<PendingTransfer>(std::move(exchange));
  }

  // Every peer's send and receive in one NCCL group (its all-to-all of variable sizes). Host
  // buffers take the pairwise default (each transfer staged).
  absl::Status AllToAllV(const void* in, std::span<const int64_t> send_counts, void* out,
                         std::span<const int64_t> recv_counts, DType dtype, uint32_t tag) override {
    constexpr const char* kWhat = "nccl all-to-all";
    if (!copier_->IsDevicePointer(in) || !copier_->IsDevicePointer(out)) {
      return Communicator::AllToAllV(in, send_counts, out, recv_counts, dtype, tag);
    }
    const bool counts_ok = static_cast<int>(send_counts.size()) == size_ &&
                           static_cast<int>(recv_counts.size()) == size_;
    TY_RETURN_IF_ERROR(Begin(kWhat, counts_ok));
    const int64_t bytes = DTypeBytes(dtype);
    const ncclDataType_t type = NcclType(dtype);
    int64_t send_at = 0, recv_at = 0, sent = 0;
    ncclResult_t result = ncclGroupStart();
    if (result != ncclSuccess) return Complete(kWhat, result);
    for (int peer = 0; peer < size_; ++peer) {
      if (peer != rank_ && send_counts[peer] > 0 && result == ncclSuccess) {
        result = ncclSend(static_cast<const char*>(in) + send_at * bytes, send_counts[peer], type,
                          peer, comm_, stream_);
        sent += send_counts[peer] * bytes;
      }
      if (peer != rank_ && recv_counts[peer] > 0 && result == ncclSuccess) {
        result = ncclRecv(static_cast<char*>(out) + recv_at * bytes, recv_counts[peer], type, peer,
                          comm_, stream_);
      }
      send_at += send_counts[peer];
      recv_at += recv_counts[peer];
    }
    const ncclResult_t ended = ncclGroupEnd();  // always closes the group
    TY_RETURN_IF_ERROR(Complete(kWhat, result != ncclSuccess ? result : ended));
    stats_.Add(CollectiveKind::kSendRecv, sent);
    return absl::OkStatus();
  }

  // NCCL has no barrier: an all-reduce of one float, which no rank finishes before every rank
  // has started it.
  absl::Status Barrier() override {
    constexpr const char* kWhat = "nccl barrier";
    TY_RETURN_IF_ERROR(Begin(kWhat, true));
    TY_ASSIGN_OR_RETURN(void* buf, barrier_.Reserve(sizeof(float), stream_));
    return Complete(kWhat, ncclAllReduce(buf, buf, 1, ncclFloat32, ncclSum, comm_, stream_));
  }

  void Abort() override { aborted_.store(true); }

 private:
  // A started exchange (StartExchange): Wait polls the event recorded after it on this
  // communicator's stream, with the blocking operations' deadline and abort.
  class Exchange final : public PendingTransfer {
   public:
    Exchange(NcclCommunicator* comm, int64_t sent_bytes, cudaEvent_t done)
        : comm_(comm), sent_bytes_(sent_bytes), done_(done) {}
    ~Exchange() override { cudaEventDestroy(done_); }
    absl::Status Wait() override {
      TY_RETURN_IF_ERROR(
          comm_->Await("nccl send-recv", ncclSuccess, [this] { return cudaEventQuery(done_); }));
      comm_->stats_.Add(CollectiveKind::kSendRecv, sent_bytes_);
      return absl::OkStatus();
    }

   private:
    NcclCommunicator* comm_;
    int64_t sent_bytes_;
    cudaEvent_t done_;  // owned
  };

  bool ValidPeer(int peer) const { return peer >= 0 && peer < size_; }

  // Refuses the operation when the communicator is finished or the arguments are bad, and makes
  // this rank's device current on the calling thread (NCCL and CUDA calls act on it).
  absl::Status Begin(const char* what, bool arguments_ok) {
    if (aborted_.load()) AbortComm("Abort()");
    if (comm_ == nullptr) {
      return absl::AbortedError(absl::StrCat(what, ": communicator aborted (", ended_by_, ")"));
    }
    if (!arguments_ok) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": bad count, root or peer for rank ", rank_, " of ", size_));
    }
    TY_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    // The operation runs on this communicator's own stream, after everything the producer stream
    // has queued so far (which includes whatever wrote its buffers). Groups issued from
    // different threads (data-parallel reductions from the communication thread, tensor- and
    // pipeline-parallel ones from the training thread) thus never queue behind each other's NCCL
    // kernels on one stream, which could deadlock across ranks that issued them in other orders.
    TY_CUDA_RETURN_IF_ERROR(cudaEventRecord(ready_, producer_));
    TY_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream_, ready_, 0));
    return absl::OkStatus();
  }

  // The device buffer NCCL reads for `ptr`: `ptr` itself, or `scratch` holding a copy of the
  // host memory at `ptr`.
  absl::StatusOr<void*> StageIn(const void* ptr, int64_t bytes, Scratch& scratch) {
    if (copier_->IsDevicePointer(ptr)) return const_cast<void*>(ptr);
    TY_ASSIGN_OR_RETURN(void* buf, scratch.Reserve(bytes, stream_));
    TY_RETURN_IF_ERROR(copier_->CopyToDevice(buf, ptr, bytes));
    return buf;
  }

  // The device buffer NCCL writes for `ptr`: `ptr` itself, or `scratch` for host memory.
  absl::StatusOr<void*> StageTarget(void* ptr, int64_t bytes, Scratch& scratch) {
    if (copier_->IsDevicePointer(ptr)) return ptr;
    return scratch.Reserve(bytes, stream_);
  }

  // Copies a result from scratch back to the host memory it stands for (nothing when `ptr` is
  // device memory NCCL wrote itself). The stream is idle by now.
  absl::Status StageOut(const void* buf, void* ptr, int64_t bytes) {
    if (buf == ptr) return absl::OkStatus();
    return copier_->CopyToHost(ptr, buf, bytes);
  }

  ncclResult_t GroupSendRecv(const void* send, int64_t send_count, int send_peer, void* recv,
                             int64_t recv_count, int recv_peer, ncclDataType_t type) {
    const ncclResult_t started = ncclGroupStart();
    if (started != ncclSuccess) return started;
    const ncclResult_t sent = ncclSend(send, send_count, type, send_peer, comm_, stream_);
    const ncclResult_t received = ncclRecv(recv, recv_count, type, recv_peer, comm_, stream_);
    const ncclResult_t ended = ncclGroupEnd();  // always closes the group
    if (sent != ncclSuccess) return sent;
    if (received != ncclSuccess) return received;
    return ended;
  }

  // Given what an enqueue call returned, waits for the operation: first until NCCL has
  // enqueued it (non-blocking calls may return ncclInProgress), then until the stream has run
  // it. Any failure, the deadline, or Abort() aborts the communicator.
  absl::Status Complete(const char* what, ncclResult_t enqueued) {
    return Await(what, enqueued, [this] { return cudaStreamQuery(stream_); });
  }
  // Only until NCCL has enqueued it: no other NCCL call may come before that.
  absl::Status WaitQueued(const char* what, ncclResult_t enqueued) {
    return Await(what, enqueued, [] { return cudaSuccess; });
  }
  // Complete's loop, with `ran` saying whether the enqueued work has run (cudaSuccess), not yet
  // (cudaErrorNotReady), or failed.
  absl::Status Await(const char* what, ncclResult_t enqueued,
                     const std::function<cudaError_t()>& ran) {
    if (comm_ == nullptr) {
      return absl::AbortedError(absl::StrCat(what, ": communicator aborted (", ended_by_, ")"));
    }
    if (enqueued != ncclSuccess && enqueued != ncclInProgress) {
      const absl::Status status = NcclStatus(enqueued, what);
      AbortComm(status.ToString());
      return status;
    }
    const Clock::time_point deadline = Clock::now() + timeout_;
    for (int polls = 0;; ++polls) {
      if (aborted_.load()) {
        AbortComm("Abort()");
        return absl::AbortedError(absl::StrCat(what, ": communicator aborted"));
      }
      ncclResult_t state = ncclSuccess;
      const ncclResult_t queried = ncclCommGetAsyncError(comm_, &state);
      if (queried != ncclSuccess) state = queried;
      if (state != ncclSuccess && state != ncclInProgress) {
        const absl::Status status = NcclStatus(state, what);
        AbortComm(status.ToString());
        return status;
      }
      if (state == ncclSuccess) {  // enqueued: now the stream (or an event on it) tells
        const cudaError_t done = ran();
        if (done == cudaSuccess) return absl::OkStatus();
        if (done != cudaErrorNotReady) {
          const absl::Status status =
              kernels::cuda::CudaError(done, "waiting for the stream", __FILE__, __LINE__);
          AbortComm(status.ToString());
          return status;
        }
      }
      if (Clock::now() > deadline) {
        AbortComm(absl::StrCat(what, " timed out"));
        return absl::DeadlineExceededError(
            absl::StrCat(what, " timed out after ", timeout_.count(),
                         " ms: a peer stopped taking part (communicator aborted)"));
      }
      PausePoll(polls);
    }
  }

  // Ends the NCCL communicator for good: stops its kernels and frees it. `why` is what later
  // operations report.
  void AbortComm(const std::string& why) {
    if (comm_ == nullptr) return;
    ncclCommAbort(comm_);
    comm_ = nullptr;
    ended_by_ = why;
  }

  // The orderly end: flush, wait (bounded by the timeout) for NCCL to quiesce.
  bool Finalize() {
    const ncclResult_t started = ncclCommFinalize(comm_);
    if (started != ncclSuccess && started != ncclInProgress) return false;
    return WaitReady(comm_, Clock::now() + timeout_, "ncclCommFinalize").ok();
  }

  ncclComm_t comm_;  // null once aborted; touched only by the issuing thread
  const int rank_, size_, device_;
  cudaStream_t producer_;  // the backend's stream: not owned
  cudaStream_t stream_;    // owned: where this communicator's NCCL kernels run
  cudaEvent_t ready_;      // owned: marks the producer's work an operation waits for
  const std::chrono::milliseconds timeout_;
  std::unique_ptr<DeviceCopier> copier_;
  std::atomic<bool> aborted_{false};  // set by Abort(), from any thread
  std::string ended_by_;
  Scratch first_, second_, barrier_;
};

// Rank 0 makes the unique id and publishes it; the others read it.
absl::StatusOr<ncclUniqueId> ExchangeUniqueId(KeyValueStore& store, const std::string& group,
                                              int rank, std::chrono::milliseconds timeout) {
  const std::string key = absl::StrCat(group, "/nccl_id");
  ncclUniqueId id;
  if (rank == 0) {
    const ncclResult_t made = ncclGetUniqueId(&id);
    if (made != ncclSuccess) return NcclStatus(made, "ncclGetUniqueId");
    const std::string bytes(reinterpret_cast<const char*>(&id), sizeof(id));
    TY_RETURN_IF_ERROR(store.Set(key, absl::Base64Escape(bytes)));
    return id;
  }
  TY_ASSIGN_OR_RETURN(const std::string encoded, store.Get(key, timeout));
  std::string bytes;
  if (!absl::Base64Unescape(encoded, &bytes) || bytes.size() != sizeof(id)) {
    return absl::DataLossError(
        absl::StrCat("rendezvous key '", key, "' does not hold an NCCL unique id"));
  }
  std::memcpy(&id, bytes.data(), sizeof(id));
  return id;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> ConnectNccl(KeyValueStore& store,
                                                          const std::string& group, int rank,
                                                          int size, cudaStream_t stream,
                                                          std::chrono::milliseconds timeout) {
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " outside group of ", size));
  }
  const Clock::time_point deadline = Clock::now() + timeout;
  int device = 0;
  TY_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  cudaStream_t own_stream = nullptr;
  cudaEvent_t ready = nullptr;
  TY_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&own_stream, cudaStreamNonBlocking));
  if (const cudaError_t err = cudaEventCreateWithFlags(&ready, cudaEventDisableTiming);
      err != cudaSuccess) {
    cudaStreamDestroy(own_stream);
    return kernels::cuda::CudaError(err, "cudaEventCreateWithFlags", __FILE__, __LINE__);
  }
  auto release = [&] {
    cudaEventDestroy(ready);
    cudaStreamDestroy(own_stream);
  };
  absl::StatusOr<ncclUniqueId> exchanged = ExchangeUniqueId(store, group, rank, timeout);
  if (!exchanged.ok()) {
    release();
    return exchanged.status();
  }
  const ncclUniqueId id = *exchanged;

  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  const ncclResult_t started = ncclCommInitRankConfig(&comm, size, id, rank, &config);
  absl::Status ready_status = (started == ncclSuccess || started == ncclInProgress)
                                  ? WaitReady(comm, deadline, "ncclCommInitRankConfig")
                                  : NcclStatus(started, "ncclCommInitRankConfig");
  if (!ready_status.ok()) {
    if (comm != nullptr) ncclCommAbort(comm);
    release();
    return Annotate(ready_status, absl::StrCat("connecting NCCL group '", group, "' as rank ", rank,
                                               " of ", size));
  }
  return std::unique_ptr<Communicator>(
      new NcclCommunicator(comm, rank, size, device, stream, own_stream, ready, timeout));
}

}  // namespace trainyard::worker::parallel
