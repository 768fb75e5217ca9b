// The NCCL engine: the Communicator for GPU ranks, one rank per device (CUDA builds only).
//
// Buffers are device memory of the device that was current at ConnectNccl; host buffers (such
// as AllReduceDouble's) are staged through a device scratch buffer. `stream` passed to
// ConnectNccl is the producer: the stream whose kernels write the buffers (the backend's). Each
// operation runs on a stream the communicator owns, ordered after everything queued on the
// producer so far (an event), and is waited for: the call returns when the result is in place,
// so work the caller queues afterwards sees it. One stream per communicator keeps groups used
// from different threads from queueing behind each other's NCCL kernels. Waiting polls the stream
// and NCCL's asynchronous error state against a deadline; when the deadline passes, the
// communicator is aborted (ncclCommAbort, which also stops the stuck kernels) and the operation
// fails with DEADLINE_EXCEEDED; a peer's failure reported by NCCL fails it with UNAVAILABLE. After
// either, or after Abort(), every operation fails with ABORTED: the communicator is finished.
//
// Tags are ignored: NCCL matches point-to-point transfers by peer pair in issue order, which is
// how the pipeline uses them (each pair of stages exchanges in one agreed order). A Send or
// Recv to this rank itself is refused (it could never complete alone); SendRecv may name itself.
//
// bf16 reductions run in NCCL's bf16 arithmetic (see communicator.h). stats() counts the bytes
// this rank sends under the same ring model the Gloo engine reports.
//
// Threading: as for Communicator. Abort() never blocks: it raises a flag that the waiting
// operation sees within microseconds, and that operation aborts the NCCL communicator.
#ifndef TRAINYARD_WORKER_PARALLEL_NCCL_COMMUNICATOR_H_
#define TRAINYARD_WORKER_PARALLEL_NCCL_COMMUNICATOR_H_

#include <cuda_runtime_api.h>

#include <chrono>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "worker/parallel/communicator.h"
#include "worker/parallel/kv_store.h"

namespace trainyard::worker::parallel {

// Forms a group of `size` ranks on the current device. Rank 0 makes NCCL's unique id and
// publishes it in `store` under "<group>/nccl_id"; the others wait for it. Each member calls this
// with the same `group` (a name used once: a stale id under it would join the wrong clique) and
// its own rank. Fails with DEADLINE_EXCEEDED when the id or the peers do not arrive within
// `timeout`, which is also every later operation's limit.
[[nodiscard]] absl::StatusOr<std::unique_ptr<Communicator>> ConnectNccl(
    KeyValueStore& store, const std::string& group, int rank, int size, cudaStream_t stream,
    std::chrono::milliseconds timeout);

}  // namespace trainyard::worker::parallel

#endif  // TRAINYARD_WORKER_PARALLEL_NCCL_COMMUNICATOR_H_
