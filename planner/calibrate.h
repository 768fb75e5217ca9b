// `trainyard plan --calibrate`: measures the cpu device profile on this machine with the
// engine's own code: the CPU backend's GEMM (Backend::Linear) and elementwise add for the
// compute rates and memory bandwidth, and the Gloo communicator's α and β from the time of its
// ring all-reduce, small and large, between two ranks over loopback TCP (two threads of this
// process, meeting through a file rendezvous store, as ranks do).
//
// Threading: runs its own threads; call from one thread.
#ifndef TRAINYARD_PLANNER_CALIBRATE_H_
#define TRAINYARD_PLANNER_CALIBRATE_H_

#include <string>

#include "absl/status/statusor.h"
#include "planner/device_profile.h"

namespace trainyard::planner {

struct CalibrationOptions {
  int threads = 0;                 // CPU backend threads; 0: every core, as a rank uses
  double seconds_per_probe = 0.3;  // how long each rate is measured for
  std::string scratch_dir;         // for the rendezvous files; created, then removed
};

// What was measured, besides the profile itself, for the report.
struct Calibration {
  DeviceProfile profile;
  double large_gemm_flops = 0;  // 1024 × 1024 × 1024
  double gemm_flops = 0;        // 512 × 512 × 512
  double add_bytes_per_second = 0;
  double alpha_seconds = 0;     // per ring step (message)
  double bytes_per_second = 0;  // sent per rank, large all-reduces
};

// UNAVAILABLE when the two Gloo ranks cannot connect over loopback.
[[nodiscard]] absl::StatusOr<Calibration> CalibrateCpu(const CalibrationOptions& options);

}  // namespace trainyard::planner

#endif  // TRAINYARD_PLANNER_CALIBRATE_H_
