// What `trainyard plan --calibrate` measures, as plain values: the options of a calibration, the
// reference it runs, and its result, with the text forms that carry them between the CLI and
// the process that measures (`trainyard-worker calibrate`, worker/calibrate.h). The measuring
// runs the engine; this header does not, so that the planner and the CLI link no engine code.
//
// Threading: plain values and functions; no shared state.
#ifndef TRAINYARD_PLANNER_CALIBRATION_H_
#define TRAINYARD_PLANNER_CALIBRATION_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "config/spec.h"
#include "planner/device_profile.h"

namespace trainyard::planner {

// The reference the shared-rank probes run: a model and one micro-batch, on one rank (dp, tp and
// pp 1). By default gpt2-tiny, 4 × 64 tokens; CalibrationReference(spec) is a spec's own model
// and per-rank micro-batch (and of a reference, the reference itself).
config::JobSpec DefaultCalibrationReference();
config::JobSpec CalibrationReference(const config::JobSpec& spec);

// The reference in words, as a calibrated profile records it (DeviceProfile::reference): the
// family, layers, width, the experts of an MoE model, and the micro-batch.
std::string CalibrationReferenceName(const config::JobSpec& reference);

// A job spec's YAML whose CalibrationReference is `reference`'s: its model with every field
// written out, and one micro-batch. What the CLI hands `trainyard-worker calibrate --reference`.
std::string CalibrationReferenceYaml(const config::JobSpec& reference);

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

// A calibration as one JSON object, and its inverse: every field reads back exactly (numbers in
// their shortest exact form; the profile as ProfileToJson writes it, so it holds what a
// calibrated cpu profile holds). CalibrationFromJson: INVALID_ARGUMENT naming the first field
// that is missing or malformed.
std::string CalibrationToJson(const Calibration& calibration);
[[nodiscard]] absl::StatusOr<Calibration> CalibrationFromJson(const std::string& json);

}  // namespace trainyard::planner

#endif  // TRAINYARD_PLANNER_CALIBRATION_H_
