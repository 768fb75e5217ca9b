// `trainyard-worker calibrate`, which `trainyard plan --calibrate` runs: measures the cpu device
// profile on this machine with the engine's own code: the CPU backend's GEMM (the MFU basis) and
// elementwise add (the memory bandwidth); the Gloo communicator's α and β from its all-reduce,
// small and large, between two ranks over loopback TCP; and for each count of ranks sharing the
// cores, with that many ranks running at once (each with its own backend, meeting through a file
// rendezvous store as ranks do), the engine's effective rate on a reference forward and backward
// pass, the α a tensor-parallel pair of them pays among the others, the α when all of them
// exchange in pairs in step, and the α of a communication thread's all-reduce while they all
// compute (docs/planner.md). The link probes run their ranks as processes forked from this one,
// the compute probes as threads; every probe runs in interleaved rounds and keeps its median.
// What it measures, and the options, are the planner's plain values (planner/calibration.h).
//
// Threading: forks, then runs its own threads; call from one thread of a process that has
// started no other threads (a forked child inherits none of them).
#ifndef TRAINYARD_WORKER_CALIBRATE_H_
#define TRAINYARD_WORKER_CALIBRATE_H_

#include "absl/status/statusor.h"
#include "planner/calibration.h"

namespace trainyard::worker {

// UNAVAILABLE when the two Gloo ranks cannot connect over loopback; FAILED_PRECONDITION when
// options.scratch_dir cannot be created.
[[nodiscard]] absl::StatusOr<planner::Calibration> CalibrateCpu(
    const planner::CalibrationOptions& options);

}  // namespace trainyard::worker

#endif  // TRAINYARD_WORKER_CALIBRATE_H_
