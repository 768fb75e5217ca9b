// How long a step may run before its rank counts as hung: one rule, used by the worker's
// watchdog (worker/hang_watchdog.h) and by the coordinator's progress check
// (server/failure_detector.h), from the spec's fault_tolerance section.
//
//   limit = hang_startup_s                                          before the first step
//   limit = max(hang_floor_s, hang_step_multiple × p99(recent))     after it
//
// where `recent` holds the durations of the last steps (the worker: its own steps; the
// coordinator: the slowest step of each progress report). p99 is the nearest-rank percentile.
//
// The phases of an iteration that are not the step itself (evaluation, sampling, a checkpoint
// save) run rarely and take their own time: each is held to the same rule over the recent
// durations of that phase, and to hang_startup_s the first time it runs; their time is not the
// step's. So the step's limit can be short without a long evaluation or save counting as a
// hang.
#ifndef TRAINYARD_CONFIG_HANG_LIMIT_H_
#define TRAINYARD_CONFIG_HANG_LIMIT_H_

#include <span>

#include "config/spec.h"

namespace trainyard::config {

// How many recent step durations the limit looks at.
inline constexpr int kHangLimitHistory = 100;

// The parts of a training iteration with limits of their own (trainyard.v1.IterationPhase).
enum class HangPhase { kStep = 0, kEvaluation = 1, kSampling = 2, kCheckpoint = 3 };
inline constexpr int kHangPhases = 4;
// "step", "evaluation", "sampling", "checkpoint save".
const char* HangPhaseName(HangPhase phase);

double HangLimitSeconds(const FaultToleranceSpec& spec, std::span<const double> recent_seconds);

// The nearest-rank p99 of `values` (0 when empty).
double Percentile99(std::span<const double> values);

}  // namespace trainyard::config

#endif  // TRAINYARD_CONFIG_HANG_LIMIT_H_
