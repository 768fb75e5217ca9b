// `trainyard plan --calibrate`'s measurement, run as a child process: `trainyard-worker calibrate`
// (worker/calibrate.h) measures with the engine and prints what it measured as JSON, so that the
// CLI links no engine code.
//
// Threading: one call at a time per scratch directory; each call blocks until its child exits.
#ifndef TRAINYARD_TOOLS_CLI_WORKER_CALIBRATION_H_
#define TRAINYARD_TOOLS_CLI_WORKER_CALIBRATION_H_

#include <string>

#include "absl/status/statusor.h"
#include "planner/calibration.h"

namespace trainyard::cli {

// Runs `worker calibrate` with `options` (the reference as a spec file) and returns what it
// printed. The reference spec, the child's stdout and its stderr are files in
// options.scratch_dir (created; the caller removes it), and its rendezvous files a folder of it.
// The child shares this process's group, so that a Ctrl-C at the terminal stops it too.
// UNAVAILABLE when the worker cannot be started; INTERNAL when it fails (its last line of stderr
// in the message) or prints something CalibrationFromJson refuses.
[[nodiscard]] absl::StatusOr<planner::Calibration> CalibrateWithWorker(
    const std::string& worker, const planner::CalibrationOptions& options);

// CalibrateWithWorker with the trainyard-worker LocateWorkerBinary finds (common/process.h):
// beside this program in an installation. FAILED_PRECONDITION, "calibration needs
// trainyard-worker beside trainyard or on PATH: ...", when there is none.
[[nodiscard]] absl::StatusOr<planner::Calibration> CalibrateInWorker(
    const planner::CalibrationOptions& options);

}  // namespace trainyard::cli

#endif  // TRAINYARD_TOOLS_CLI_WORKER_CALIBRATION_H_
