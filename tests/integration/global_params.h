// The global (unsharded) tensors of a model, put back together from every rank's parameters
// after a run of any mesh (rank_threads.h): what resharding and export tests compare.
#ifndef TRAINYARD_TESTS_INTEGRATION_GLOBAL_PARAMS_H_
#define TRAINYARD_TESTS_INTEGRATION_GLOBAL_PARAMS_H_

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "config/mesh.h"
#include "tests/integration/rank_threads.h"
#include "worker/shape/parameters.h"
#include "worker/shape/stages.h"
#include "worker/shape/tensor_slices.h"

namespace trainyard::testenv {

using GlobalTensors = std::map<std::string, std::vector<float>>;

// The model's global tensors put back together from every rank's local parameters
// (run.final_params) of a run of `spec`.
inline GlobalTensors GatherGlobalParams(const config::JobSpec& spec, const RankRun& run) {
  const config::ParallelismSpec& p = spec.parallelism;
  GlobalTensors global;
  for (int rank = 0; rank < spec.world_size(); ++rank) {
    const config::MeshCoordinates at = config::CoordinatesOf(p, rank);
    const int tp_rank = at.tp;
    if (at.dp >= p.ep || at.cp != 0) continue;  // replicas (the first ep hold every expert)
    const worker::ParameterLayout local(
        spec.model, tp_rank, p.tp,
        worker::StageChunks(spec.model, spec.training.seq_len, p.pp, p.virtual_stages, at.pp),
        at.dp, p.ep);
    for (const worker::ParamTensor& t : local.tensors()) {
      if (!local.first() && t.name == "wte") continue;  // the tied copy
      int64_t numel = 1;
      for (int64_t d : t.global_shape) numel *= d;
      std::vector<float>& g = global[t.name];
      g.resize(numel);
      const float* held = run.final_params[rank].data() + t.offset;
      worker::ForEachLocalRun(t, tp_rank, p.tp, [&](int64_t at, int64_t from, int64_t n) {
        std::copy(held + from, held + from + n, g.begin() + at);
      });
    }
  }
  return global;
}

}  // namespace trainyard::testenv

#endif  // TRAINYARD_TESTS_INTEGRATION_GLOBAL_PARAMS_H_
