// `trainyard plan --calibrate`: measures the cpu device profile on this machine with the
// engine's own code: the CPU backend's GEMM (the MFU basis) and elementwise add (the memory
// bandwidth); the Gloo communicator's α and β from its all-reduce, small and large, between two
// ranks over loopback TCP; and for each count of ranks sharing the cores, with that many ranks
// running at once (each with its own backend, meeting through a file rendezvous store as ranks
// do), the engine's effective rate on a reference forward and backward pass, the α a
// tensor-parallel pair of them pays among the others, the α when all of them exchange in pairs
// in step, and the α of a communication thread's all-reduce while they all compute
// (docs/planner.md). The link probes run their ranks as processes forked from this one, the
// compute probes as threads; every probe runs in interleaved rounds and keeps its median.
//
// Threading: forks, then runs its own threads; call from one thread of a process that has
// started no other threads (a forked child inherits none of them).
#ifndef TRAINYARD_PLANNER_CALIBRATE_H_
#define TRAINYARD_PLANNER_CALIBRATE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "config/spec.h"
#include "planner/device_profile.h"

namespace trainyard::planner {

// The reference the shared-rank probes run: a model and one micro-batch, on one rank (dp, tp and
// pp 1). By default gpt2-tiny, 4 × 64 tokens; CalibrationReference(spec) is a spec's own model
// and per-rank micro-batch.
config::JobSpec DefaultCalibrationReference();
config::JobSpec CalibrationReference(const config::JobSpec& spec);

struct CalibrationOptions {
  int threads = 0;  // CPU backend threads; 0: every core, as a rank uses
  // Every probe runs in rounds, interleaved with the others, and keeps its median round
  // (docs/planner.md): a burst of outside load spoils a round, not the probe.
  double seconds_per_probe = 0.5;  // each of the three rounds of a rate
  // Each shared-core link probe, its nine rounds together. Its waits are thread wake-ups, whose
  // cost drifts over seconds on a virtual machine.
  double seconds_per_link_probe = 3.0;
  std::string scratch_dir;  // for the rendezvous files; created, then removed
  config::JobSpec reference = DefaultCalibrationReference();
};

// One SharedRanks entry and what it was derived from.
struct SharedRanksCalibration {
  SharedRanks entry;
  double pass_seconds = 0;            // per rank, one forward and backward pass of the reference
  double optimizer_step_seconds = 0;  // per rank, one optimizer step of the reference's model
  // Per pass, in the reference's collectives at tensor parallelism 2: one pair among ranks that
  // compute, and every rank in pairs at once (lockstep; 3 ranks or more).
  double collective_seconds = 0;
  double lockstep_collective_seconds = 0;
  // Per pass, the lockstep probe's time outside the collectives and the step's scalar sum (for
  // two ranks, the pair's): what gives the entry's lockstep_matmul_flops.
  double lockstep_compute_seconds = 0;
  // The median all-reduce of a communication thread while every rank computes.
  double background_seconds = 0;
};

// What was measured, besides the profile itself, for the report.
struct Calibration {
  DeviceProfile profile;
  double large_gemm_flops = 0;  // 1024 × 1024 × 1024
  double gemm_flops = 0;        // 512 × 512 × 512
  double add_bytes_per_second = 0;
  double alpha_seconds = 0;                    // per ring step (message)
  double bytes_per_second = 0;                 // sent per rank, large all-reduces
  std::vector<SharedRanksCalibration> shared;  // by rank count, ascending
  std::string reference_name;                  // the reference model and micro-batch, in words
};

// UNAVAILABLE when the two Gloo ranks cannot connect over loopback.
[[nodiscard]] absl::StatusOr<Calibration> CalibrateCpu(const CalibrationOptions& options);

}  // namespace trainyard::planner

#endif  // TRAINYARD_PLANNER_CALIBRATE_H_
