// The planner beside the run: the device profile a worker predicts with, `parallelism: auto`
// resolved for a standalone run, and the predicted-vs-measured comparison a rank builds from its
// TrainResult at the end (planner/run_report.h).
//
// Threading: plain functions.
#ifndef TRAINYARD_WORKER_RUN_REPORT_H_
#define TRAINYARD_WORKER_RUN_REPORT_H_

#include "absl/status/statusor.h"
#include "config/spec.h"
#include "planner/device_profile.h"
#include "planner/run_report.h"
#include "planner/traffic_model.h"
#include "worker/trainer.h"

namespace trainyard::worker {

// The profile this machine predicts with: for CPU ranks the cpu profile `trainyard plan
// --calibrate` stored ($XDG_CONFIG_HOME or $HOME; the placeholder when there is none); for GPU
// ranks `h200` when the device is one, else `h100`. INVALID_ARGUMENT for a malformed profile file.
[[nodiscard]] absl::StatusOr<planner::DeviceProfile> LocalDeviceProfile(
    const config::JobSpec& spec);

// How the loop talks besides the model: the spec's bucket size, and 3 agreement values under a
// coordinator, else 1.
planner::LoopOptions LoopOptionsFor(bool coordinated);

// A standalone run's `parallelism: auto` and `schedule: auto`: the planner's choice on this
// machine (ChooseMesh), in place of config's least-model-parallel default and 1F1B. Nothing
// changes for a spec with a fixed mesh and schedule. FAILED_PRECONDITION with the planner's
// explanation when nothing fits.
[[nodiscard]] absl::Status ResolveAutoMesh(config::JobSpec* spec,
                                           const planner::DeviceProfile& device);

// Rank `rank`'s measured figures per step: memory from the engine's accounting, bytes per axis
// over the steps it ran, the median step with its phases in the run's proportions (exposed
// collectives, pipeline waits, the rest compute), and MFU at that step.
planner::RunFigures MeasuredFigures(const config::JobSpec& spec,
                                    const planner::DeviceProfile& device,
                                    const TrainResult& result);

// The comparison for rank `rank` (spec.parallelism is the mesh it ran).
planner::RunComparison CompareRun(const config::JobSpec& spec, const planner::DeviceProfile& device,
                                  const planner::LoopOptions& loop, const TrainResult& result,
                                  int rank);

}  // namespace trainyard::worker

#endif  // TRAINYARD_WORKER_RUN_REPORT_H_
