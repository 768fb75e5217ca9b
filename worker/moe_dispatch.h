// A routed layer's hand-over from the host router (worker/moe_routing.h) to the Backend: the
// routing's permutation and weights uploaded, and the tokens' rows gathered expert by expert; and
// the shared experts' gate. The training model and generation both go through it.
#ifndef TRAINYARD_WORKER_MOE_DISPATCH_H_
#define TRAINYARD_WORKER_MOE_DISPATCH_H_

#include <cstdint>

#include "worker/backend.h"
#include "worker/moe_routing.h"

namespace trainyard::worker {

// Where the Backend reads a routing: [kept] rows' tokens and (when not null) weights, and
// [tokens · top_k] picks' rows and weights (MoeRouting's fields of the same names).
struct RoutingOnDevice {
  int32_t* source = nullptr;
  float* row_weight = nullptr;
  int32_t* slot = nullptr;
  float* weight = nullptr;
};

// Uploads `r` to `d`, and gathers the kept picks' rows of `tokens` [r.tokens, width] into
// `permuted` [r.kept(), width]: expert e's rows are [r.offsets[e], r.offsets[e + 1]).
inline void Dispatch(Backend& be, const MoeRouting& r, const RoutingOnDevice& d, const Act* tokens,
                     int64_t width, Act* permuted) {
  const int64_t kept = r.kept(), picks = r.tokens * r.top_k;
  be.CopyFromHost(d.source, r.source.data(), kept);
  if (d.row_weight != nullptr) be.CopyFromHost(d.row_weight, r.row_weight.data(), kept);
  be.CopyFromHost(d.slot, r.slot.data(), picks);
  be.CopyFromHost(d.weight, r.weight.data(), picks);
  be.GatherRows(permuted, tokens, d.source, nullptr, kept, width);
}

// Gates the shared experts' output `shared` [rows, width] row by row: gate [rows] ← sigmoid(x ·
// weight) for the block's MLP input `x` and its gate's weight [1, width], and `shared` scaled by
// it (one row's factor commutes with a tensor-parallel sum, so `shared` may be a partial sum).
inline void GateSharedExperts(Backend& be, float* gate, const Act* x, const float* weight,
                              Act* shared, int64_t rows, int64_t width) {
  be.LinearF32(gate, x, weight, rows, 1, width);
  be.SigmoidGateRows(gate, gate, shared, rows, width);
}

}  // namespace trainyard::worker

#endif  // TRAINYARD_WORKER_MOE_DISPATCH_H_
