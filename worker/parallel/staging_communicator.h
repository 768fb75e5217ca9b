// Host staging: a Communicator for device buffers over a host engine (Gloo). Several GPU ranks
// that share one device cannot form an NCCL communicator, so they exchange through the host:
// every operation copies device buffers into host staging buffers, runs the host engine on fp32,
// and copies the results back. This is how multi-rank GPU code is tested on a single GPU.
//
// bf16 buffers are widened to fp32 on the host before they reach the engine (which only moves
// fp32), so bf16 sums accumulate in fp32 and are rounded to bf16 once per result, to nearest
// even; gathers and point-to-point transfers of bf16 are exact. Host buffers (those the copier
// says are not device memory) go straight to the engine when they are fp32.
//
// Point-to-point transfers start when the inner engine starts them (StartSend, StartRecv): a
// send is staged at once and moved by the engine while the caller computes, so that ring
// attention and pipeline hand-offs overlap their transfers on a GPU rank too; a receive's
// result reaches the device in Wait.
//
// Bytes in stats() are the inner engine's: what actually crossed the wire (fp32, so a bf16
// transfer counts four bytes an element).
//
// Threading: as for Communicator; Abort() may be called from any thread and aborts the inner
// engine.
#ifndef TRAINYARD_WORKER_PARALLEL_STAGING_COMMUNICATOR_H_
#define TRAINYARD_WORKER_PARALLEL_STAGING_COMMUNICATOR_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "worker/parallel/communicator.h"

namespace trainyard::worker::parallel {

// Moves bytes between device memory and host memory. Copies are complete when they return.
// Thread-safe.
class DeviceCopier {
 public:
  virtual ~DeviceCopier() = default;
  [[nodiscard]] virtual absl::Status CopyToHost(void* host, const void* device, int64_t bytes) = 0;
  [[nodiscard]] virtual absl::Status CopyToDevice(void* device, const void* host,
                                                  int64_t bytes) = 0;
  // Whether `ptr` must be staged (device memory); false for host memory the engine can read.
  virtual bool IsDevicePointer(const void* ptr) const = 0;
};

// A copier for host memory posing as a device: memcpy both ways. With `all_device`, every
// pointer counts as device memory, so that tests on a CPU exercise every staging path; without
// it, none does and the staging communicator is a pass-through for fp32.
std::unique_ptr<DeviceCopier> MakeHostCopier(bool all_device);

// Wraps `inner`, a connected host communicator, for buffers that `copier` can reach. Takes
// ownership of both.
std::unique_ptr<Communicator> MakeStagingCommunicator(std::unique_ptr<Communicator> inner,
                                                      std::unique_ptr<DeviceCopier> copier);

}  // namespace trainyard::worker::parallel

#endif  // TRAINYARD_WORKER_PARALLEL_STAGING_COMMUNICATOR_H_
