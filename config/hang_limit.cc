#include "config/hang_limit.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace trainyard::config {

const char* HangPhaseName(HangPhase phase) {
  switch (phase) {
    case HangPhase::kStep:
      return "step";
    case HangPhase::kEvaluation:
      return "evaluation";
    case HangPhase::kSampling:
      return "sampling";
    case HangPhase::kCheckpoint:
      return "checkpoint save";
  }
  return "step";
}

double Percentile99(std::span<const double> values) {
  if (values.empty()) return 0.0;
  std::vector<double> sorted(values.begin(), values.end());
  // Nearest rank: the smallest value with at least 99% of the values at or below it.
  const size_t rank = static_cast<size_t>(std::ceil(0.99 * static_cast<double>(sorted.size())));
  const size_t index = std::max<size_t>(rank, 1) - 1;
  std::nth_element(sorted.begin(), sorted.begin() + index, sorted.end());
  return sorted[index];
}

double HangLimitSeconds(const FaultToleranceSpec& spec, std::span<const double> recent_seconds) {
  if (recent_seconds.empty()) return spec.hang_startup_s;
  return std::max(spec.hang_floor_s, spec.hang_step_multiple * Percentile99(recent_seconds));
}

}  // namespace trainyard::config
