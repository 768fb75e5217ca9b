#include "worker/head_norm.h"

#include <array>

namespace trainyard::worker {
namespace {

// One of the two parts: q (at column 0 of each row) or k (after q), `norms` per row of `width`.
struct Part {
  int64_t column, cols, norms, width;
  const float* weight;
};

std::array<Part, 2> Parts(const HeadNormShape& s, const float* q_weight, const float* k_weight) {
  return {Part{0, s.q_cols(), s.q_norms(), s.q_cols() / s.q_norms(), q_weight},
          Part{s.q_cols(), s.k_cols(), s.k_norms(), s.k_cols() / s.k_norms(), k_weight}};
}

}  // namespace

HeadNormShape HeadNormsOf(const config::ModelConfig& m, int64_t rows, int tp) {
  const int64_t heads = m.heads / tp, kv_heads = m.kv_heads / tp, d = m.head_dim();
  return {.rows = rows,
          .heads = heads,
          .kv_heads = kv_heads,
          .head_dim = d,
          .qkv_stride = (heads + 2 * kv_heads) * d,
          .eps = m.norm_eps,
          .whole = m.NormsWholeProjection()};
}

void HeadNormForward(Backend& be, Act* qkv, Act* pre, float* rstd, Act* scratch,
                     const float* q_weight, const float* k_weight, const HeadNormShape& s) {
  for (const Part& p : Parts(s, q_weight, k_weight)) {
    Act* columns = be.At(qkv, p.column);
    be.CopyRows(pre, p.cols, columns, s.qkv_stride, s.rows, p.cols);
    be.RmsNorm(scratch, rstd, pre, p.weight, s.rows * p.norms, p.width, s.eps);
    be.CopyRows(columns, s.qkv_stride, scratch, p.cols, s.rows, p.cols);
    pre = be.At(pre, s.rows * p.cols);
    rstd += s.rows * p.norms;
  }
}

void HeadNormBackward(Backend& be, Act* dqkv, float* dq_weight, float* dk_weight, const Act* pre,
                      const float* rstd, Act* scratch, const float* q_weight, const float* k_weight,
                      const HeadNormShape& s) {
  const std::array<Part, 2> parts = Parts(s, q_weight, k_weight);
  float* dweights[] = {dq_weight, dk_weight};
  Act* dy = scratch;
  Act* dx = be.At(scratch, s.scratch());
  for (int i = 0; i < 2; ++i) {
    const Part& p = parts[i];
    Act* columns = be.At(dqkv, p.column);
    be.CopyRows(dy, p.cols, columns, s.qkv_stride, s.rows, p.cols);
    be.Fill(dx, 0.0f, s.rows * p.cols);  // the backward adds to its input gradient
    be.RmsNormBackward(dx, dweights[i], dy, pre, p.weight, rstd, s.rows * p.norms, p.width);
    be.CopyRows(columns, s.qkv_stride, dx, p.cols, s.rows, p.cols);
    pre = be.At(pre, s.rows * p.cols);
    rstd += s.rows * p.norms;
  }
}

}  // namespace trainyard::worker
