#include "common/moe_load.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace trainyard {

ExpertLoad SummarizeExpertLoad(std::span<const int64_t> picks, int64_t tokens) {
  ExpertLoad load;
  if (picks.empty()) return load;
  const auto [lo, hi] = std::minmax_element(picks.begin(), picks.end());
  load.min = *lo;
  load.max = *hi;
  for (const int64_t p : picks) {
    // Saturating: the coordinator summarizes what workers reported.
    if (__builtin_add_overflow(load.picks, p, &load.picks)) {
      load.picks =
          p > 0 ? std::numeric_limits<int64_t>::max() : std::numeric_limits<int64_t>::min();
    }
    if (p == 0) ++load.dead;
  }
  if (load.picks > 0) {
    const double mean = static_cast<double>(load.picks) / static_cast<double>(picks.size());
    double squares = 0;
    for (const int64_t p : picks) {
      const double deviation = static_cast<double>(p) - mean;
      squares += deviation * deviation;
    }
    load.cv = std::sqrt(squares / static_cast<double>(picks.size())) / mean;
  }
  if (tokens > 0) load.max_share = static_cast<double>(load.max) / static_cast<double>(tokens);
  return load;
}

}  // namespace trainyard
