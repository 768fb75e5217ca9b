// Predicted vs measured at the end of a run: the planner's figures for one rank of the mesh a
// job ran, beside the same figures as the engine measured them, and the relative error of each.
// The worker fills in the measured side from its TrainResult (worker/run_report.h); the CLI and
// the done line print the comparison.
//
// Threading: plain values and functions.
#ifndef TRAINYARD_PLANNER_RUN_REPORT_H_
#define TRAINYARD_PLANNER_RUN_REPORT_H_

#include <cstdint>
#include <string>

#include "config/spec.h"
#include "planner/device_profile.h"
#include "planner/traffic_model.h"

namespace trainyard::planner {

// One side of the comparison, per optimizer step, for one rank.
struct RunFigures {
  // Memory by kind. transient is ZeRO's gathered groups and gradient staging at their peak
  // (the pipeline's send and receive buffers are not in the engine's accounting, so neither
  // side counts them here).
  int64_t parameters = 0, gradients = 0, optimizer = 0, activations = 0, transient = 0;
  int64_t total() const { return parameters + gradients + optimizer + activations + transient; }
  // Sent per step on each axis; bytes_cp is ring attention's, 0 for cp 1; bytes_ep expert
  // parallelism's (the routed experts' reductions are in bytes_dp), 0 for ep 1.
  int64_t bytes_dp = 0, bytes_tp = 0, bytes_pp = 0, bytes_cp = 0, bytes_ep = 0;
  double step = 0;           // seconds = compute + communication + bubble
  double compute = 0;        // measured: the rest of the step
  double communication = 0;  // exposed collectives
  double bubble = 0;         // measured: blocked on pipeline peers (transfers included)
  double bubble_fraction = 0;
  double mfu = 0;  // NaN where the device profile has no measured peak (not calibrated)
};

struct RunComparison {
  config::ParallelismSpec mesh;
  std::string device;  // the profile's name
  int64_t steps = 0;   // optimizer steps measured
  RunFigures predicted, measured;
};

// The planner's figures for global rank `rank` of spec.parallelism on `device` (a node's
// profile, as MakePlan takes it): memory of its pipeline stage, bytes of its position on each
// axis, and the step of the mesh (the slowest stage's).
RunFigures PredictRun(const config::JobSpec& spec, const DeviceProfile& device,
                      const LoopOptions& loop, int rank);

// The MFU a measured step time gives, against the same peak the prediction used; NaN for a
// profile that is not calibrated (its peak is a placeholder), as RunFigures::mfu then is.
double MfuAt(const config::JobSpec& spec, const DeviceProfile& device, double step_seconds);

// (predicted − measured) / measured; 0 when both are 0, and infinite when only measured is.
double RelativeError(double predicted, double measured);

// A table, one row per figure: "memory  parameters  <predicted>  <measured>  <error>", then
// bytes per axis (a "bytes sent cp" row only when the mesh has cp > 1), the step and its phases,
// the bubble fraction and MFU; a header names the mesh, the device profile and the steps measured.
// Each line ends with a newline.
std::string ComparisonText(const RunComparison& comparison);

}  // namespace trainyard::planner

#endif  // TRAINYARD_PLANNER_RUN_REPORT_H_
