// Multi-head latent attention's projections (model.latent_attention; config/model_config.h's
// LatentAttention): from a block's attention input to the packed qkv row that RoPE and the
// attention kernels read, and back. Everything after the packed row (RoPE, attention, context
// parallelism's ring, the output projection) is the model's ordinary path with value heads of
// value_dim.
//
// Forward, for rows x [n, width]:
//   queries: q = q_b · rms(q_a · x) (q_rank > 0), else q = q_w · x          [n, heads·d]
//   latent:  [c | k_rot] = kv_a · x,  kv = kv_b · rms(c)                    [n, heads·(nope + dv)]
//   packed:  query head h = q's head h; key head h = [k_rot | kv's first nope of head h];
//            value head h = kv's last dv of head h (d = rope + nope; rope first, as RoPE turns a
//            head's first rotary dimensions)
// The backward sums the key heads' rotary parts into k_rot's gradient, and writes the
// projections' weight gradients and the input's gradient.
#ifndef TRAINYARD_WORKER_LATENT_ATTENTION_H_
#define TRAINYARD_WORKER_LATENT_ATTENTION_H_

#include <cstdint>
#include <functional>

#include "absl/status/status.h"
#include "worker/backend.h"
#include "worker/shape/latent_shape.h"

namespace trainyard::worker {

// One block's weights (or their gradients): q_a, its norm and q_b, or q (q_rank 0), then kv_a,
// its norm and kv_b.
struct LatentWeights {
  const float *q_a = nullptr, *q_a_norm = nullptr, *q_b = nullptr, *q = nullptr;
  const float *kv_a = nullptr, *kv_a_norm = nullptr, *kv_b = nullptr;
};
struct LatentGrads {
  float *q_a = nullptr, *q_a_norm = nullptr, *q_b = nullptr, *q = nullptr;
  float *kv_a = nullptr, *kv_a_norm = nullptr, *kv_b = nullptr;
};

// What the backward needs of the forward: the query latent before and after its norm [n, q_rank]
// (q_rank > 0) with the norm's statistics [n], and the key/value latent likewise [n, kv_rank].
struct LatentSaved {
  Act *q_latent = nullptr, *q_normed = nullptr;
  float* q_rstd = nullptr;
  Act *kv_latent = nullptr, *kv_normed = nullptr;
  float* kv_rstd = nullptr;
};

// What LatentForward writes of the packed rows: all of them, or (generation's steps after the
// prompt, which attend over the cached latents in the absorbed form) the queries and key head 0's
// rotary part, the shared rotary key, leaving the rest of each row as it was and sparing kv_b's
// product, as large as the absorption itself.
enum class LatentOutput { kKeysAndValues, kLatentsOnly };

// qkv [n, s.qkv_row()] from x [n, width]; `scratch`: s.scratch() elements. The normed latents are
// in saved.kv_normed either way.
void LatentForward(Backend& be, const LatentShape& s, const LatentWeights& w, const Act* x,
                   const LatentSaved& saved, Act* scratch, Act* qkv,
                   LatentOutput output = LatentOutput::kKeysAndValues);

// Tensor parallelism (s.heads: this rank's heads): `sum` adds a span of activations over the
// group (null: one rank holds every head); `first` says this rank adds the input's gradient
// through the latents, which every rank of the group computes whole.
struct LatentGroup {
  std::function<absl::Status(Act* data, int64_t count)> sum;
  bool first = true;
};

// dx [n, width] (overwritten: this rank's part of the input's gradient, summed over the group by
// the caller) and the weights' gradients (accumulated) from dqkv, the gradient at the packed rows
// before RoPE.
[[nodiscard]] absl::Status LatentBackward(Backend& be, const LatentShape& s, const LatentWeights& w,
                                          const LatentGrads& grads, const Act* x,
                                          const LatentSaved& saved, const Act* dqkv, Act* scratch,
                                          Act* dx, const LatentGroup& group = {});

}  // namespace trainyard::worker

#endif  // TRAINYARD_WORKER_LATENT_ATTENTION_H_
