// How long a step may run before its rank counts as hung: one rule, used by the worker's
// watchdog (worker/hang_watchdog.h) and by the coordinator's progress check
// (server/failure_detector.h), from the spec's fault_tolerance section.
//
//   limit = hang_startup_s                                          before the first step
//   limit = max(hang_floor_s, hang_step_multiple × p99(recent))     after it
//
// where `recent` holds the durations of the last steps (the worker: its own iterations; the
// coordinator: the slowest step of each progress report). p99 is the nearest-rank percentile.
#ifndef TRAINYARD_CONFIG_HANG_LIMIT_H_
#define TRAINYARD_CONFIG_HANG_LIMIT_H_

#include <span>

#include "config/spec.h"

namespace trainyard::config {

// How many recent step durations the limit looks at.
inline constexpr int kHangLimitHistory = 100;

double HangLimitSeconds(const FaultToleranceSpec& spec, std::span<const double> recent_seconds);

// The nearest-rank p99 of `values` (0 when empty).
double Percentile99(std::span<const double> values);

}  // namespace trainyard::config

#endif  // TRAINYARD_CONFIG_HANG_LIMIT_H_
