// Qwen3's query and key norms (model.qk_norm): an RMSNorm over each query head and each key
// head of the rows of q, k and v, before RoPE, with one weight [head_dim] shared by the query
// heads and one by the key heads; or (qk_norm_span projection, OLMoE's) one RMSNorm over each
// row's whole q and one over its whole k, weights [heads·head_dim] and [kv_heads·head_dim]. The
// heads sit inside rows `qkv_stride` apart, so the norms run on contiguous copies: the backend's
// RMSNorm over rows·heads rows of head_dim, or rows rows of the whole width. Under tensor
// parallelism a rank holds some heads of each row: a per-head norm needs nothing from the other
// ranks, a whole-projection norm sums its rows' squares (and, backward, their gradient dots)
// over the group between the backend's two steps, each rank using its columns of the weights.
#ifndef TRAINYARD_WORKER_HEAD_NORM_H_
#define TRAINYARD_WORKER_HEAD_NORM_H_

#include <cstdint>
#include <functional>

#include "absl/status/status.h"
#include "config/model_config.h"
#include "worker/backend.h"

namespace trainyard::worker {

struct HeadNormShape {
  int64_t rows;        // rows of q, k and v
  int64_t heads;       // query heads in a row (this rank's)
  int64_t kv_heads;    // key heads in a row (this rank's)
  int64_t head_dim;    // D
  int64_t qkv_stride;  // elements from one row to the next; q at 0, k at heads·D
  float eps;
  bool whole = false;  // one norm over each row's q and one over its k, not one per head
  int tp = 1;          // tensor-parallel ranks sharing each row's heads, and this one's index
  int tp_rank = 0;

  int64_t q_cols() const { return heads * head_dim; }
  int64_t k_cols() const { return kv_heads * head_dim; }
  // Norms per row over q and over k.
  int64_t q_norms() const { return whole ? 1 : heads; }
  int64_t k_norms() const { return whole ? 1 : kv_heads; }
  // Elements of the saved inputs (`pre`) and floats of `rstd`.
  int64_t saved() const { return rows * (q_cols() + k_cols()); }
  int64_t statistics() const { return rows * (q_norms() + k_norms()); }
  // Elements of scratch the forward needs; the backward needs twice as many.
  int64_t scratch() const { return rows * q_cols(); }
  // Whether each norm spans columns of other ranks: then the sums go over the group, and the
  // backward needs `rows` floats of dot scratch.
  bool split() const { return whole && tp > 1; }
};

// data[0, count) ← its sum over the tensor-parallel group, in place.
using GroupSum = std::function<absl::Status(float* data, int64_t count)>;

// The norms of `rows` rows of model `m`'s q, k and v, each tensor-parallel rank (of `tp`) holding
// its share of the heads.
HeadNormShape HeadNormsOf(const config::ModelConfig& m, int64_t rows, int tp = 1, int tp_rank = 0);

// q and k of `qkv` ← their norms. Keeps what the backward reads: `pre` the inputs (q's [rows,
// heads·D], then k's [rows, kv_heads·D]) and `rstd` their statistics (q's heads, then k's).
// The weights are whole (every rank's columns); `group_sum` is needed when s.split().
[[nodiscard]] absl::Status HeadNormForward(Backend& be, Act* qkv, Act* pre, float* rstd,
                                           Act* scratch, const float* q_weight,
                                           const float* k_weight, const HeadNormShape& s,
                                           const GroupSum& group_sum = nullptr);

// The q and k columns of `dqkv` (gradients of the norms' outputs) ← gradients of their inputs;
// dq_weight and dk_weight (each its whole weight's size) += the weights' gradients from these
// rows, in this rank's columns of a split norm's weights (the group's sum makes them whole).
// When s.split(), `dots` holds s.rows floats of scratch.
[[nodiscard]] absl::Status HeadNormBackward(Backend& be, Act* dqkv, float* dq_weight,
                                            float* dk_weight, const Act* pre, const float* rstd,
                                            Act* scratch, const float* q_weight,
                                            const float* k_weight, const HeadNormShape& s,
                                            float* dots = nullptr,
                                            const GroupSum& group_sum = nullptr);

}  // namespace trainyard::worker

#endif  // TRAINYARD_WORKER_HEAD_NORM_H_
