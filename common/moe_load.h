// How evenly a mixture-of-experts layer's router spread its picks over the experts: the figures
// that progress reports, `trainyard status`, /metrics and a run's done line show.
//
// Threading: plain functions.
#ifndef TRAINYARD_COMMON_MOE_LOAD_H_
#define TRAINYARD_COMMON_MOE_LOAD_H_

#include <cstdint>
#include <span>

namespace trainyard {

struct ExpertLoad {
  int64_t picks = 0;  // over every expert: tokens × top_k
  int64_t min = 0;    // the fewest picks of one expert
  int64_t max = 0;    // the most
  // Standard deviation over mean of the picks per expert (the population's deviation): 0 when
  // even, sqrt(experts − 1) when one expert takes every pick. 0 with no picks.
  double cv = 0;
  // max / tokens: the share of the layer's tokens the busiest expert took, top_k / experts when
  // even and 1 when every token picked it (a collapsed router, whatever top_k is). 0 with no
  // tokens.
  double max_share = 0;
  int dead = 0;  // experts without a pick
};

// `picks`: per expert; `tokens`: the tokens the layer routed (each picking top_k experts).
ExpertLoad SummarizeExpertLoad(std::span<const int64_t> picks, int64_t tokens);

}  // namespace trainyard

#endif  // TRAINYARD_COMMON_MOE_LOAD_H_
