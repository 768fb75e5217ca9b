#include "worker/head_norm.h"

#include <array>

#include "common/status.h"

namespace trainyard::worker {
namespace {

// One of the two parts: q (at column 0 of each row) or k (after q), `norms` per row of `width`
// columns here; each norm spans `span` columns over the group (`width` unless split), of which
// this rank's start at `offset` in the whole weight.
struct Part {
  int64_t column, cols, norms, width, span, offset;
};

std::array<Part, 2> Parts(const HeadNormShape& s) {
  const int64_t ranks = s.split() ? s.tp : 1;
  std::array<Part, 2> parts;
  const int64_t cols[] = {s.q_cols(), s.k_cols()}, norms[] = {s.q_norms(), s.k_norms()};
  for (int i = 0; i < 2; ++i) {
    const int64_t width = cols[i] / norms[i];
    parts[i] = {.column = i == 0 ? 0 : s.q_cols(),
                .cols = cols[i],
                .norms = norms[i],
                .width = width,
                .span = width * ranks,
                .offset = s.split() ? s.tp_rank * cols[i] : 0};
  }
  return parts;
}

}  // namespace

HeadNormShape HeadNormsOf(const config::ModelConfig& m, int64_t rows, int tp, int tp_rank) {
  const int64_t heads = m.heads / tp, kv_heads = m.kv_heads / tp, d = m.head_dim();
  return {.rows = rows,
          .heads = heads,
          .kv_heads = kv_heads,
          .head_dim = d,
          .qkv_stride = (heads + 2 * kv_heads) * d,
          .eps = m.norm_eps,
          .whole = m.NormsWholeProjection(),
          .tp = tp,
          .tp_rank = tp_rank};
}

absl::Status HeadNormForward(Backend& be, Act* qkv, Act* pre, float* rstd, Act* scratch,
                             const float* q_weight, const float* k_weight, const HeadNormShape& s,
                             const GroupSum& group_sum) {
  const float* weights[] = {q_weight, k_weight};
  const std::array<Part, 2> parts = Parts(s);
  if (s.split()) {  // both parts' sums of squares in one sum over the group
    if (!group_sum) return absl::InternalError("a split head norm needs the group's sum");
    for (int i = 0; i < 2; ++i) {
      const Part& p = parts[i];
      Act* part_pre = be.At(pre, i == 0 ? 0 : s.rows * s.q_cols());
      be.CopyRows(part_pre, p.cols, be.At(qkv, p.column), s.qkv_stride, s.rows, p.cols);
      be.RowSquareSums(rstd + i * s.rows, part_pre, s.rows, p.cols);
    }
    TY_RETURN_IF_ERROR(group_sum(rstd, 2 * s.rows));
  }
  for (int i = 0; i < 2; ++i) {
    const Part& p = parts[i];
    Act* columns = be.At(qkv, p.column);
    const float* w = weights[i] + p.offset;
    if (s.split()) {
      be.RmsNormFromSums(scratch, rstd, pre, w, s.rows, p.cols, p.span, s.eps);
    } else {
      be.CopyRows(pre, p.cols, columns, s.qkv_stride, s.rows, p.cols);
      be.RmsNorm(scratch, rstd, pre, w, s.rows * p.norms, p.width, s.eps);
    }
    be.CopyRows(columns, s.qkv_stride, scratch, p.cols, s.rows, p.cols);
    pre = be.At(pre, s.rows * p.cols);
    rstd += s.rows * p.norms;
  }
  return absl::OkStatus();
}

absl::Status HeadNormBackward(Backend& be, Act* dqkv, float* dq_weight, float* dk_weight,
                              const Act* pre, const float* rstd, Act* scratch,
                              const float* q_weight, const float* k_weight, const HeadNormShape& s,
                              float* dots, const GroupSum& group_sum) {
  if (s.split() && (!group_sum || dots == nullptr)) {
    return absl::InternalError("a split head norm needs the group's sum and dot scratch");
  }
  const float* weights[] = {q_weight, k_weight};
  float* dweights[] = {dq_weight, dk_weight};
  const std::array<Part, 2> parts = Parts(s);
  Act* dy = scratch;
  Act* dx = be.At(scratch, s.scratch());
  for (int i = 0; i < 2; ++i) {
    const Part& p = parts[i];
    Act* columns = be.At(dqkv, p.column);
    const float* w = weights[i] + p.offset;
    float* dw = dweights[i] + p.offset;
    be.CopyRows(dy, p.cols, columns, s.qkv_stride, s.rows, p.cols);
    be.Fill(dx, 0.0f, s.rows * p.cols);  // the backward adds to its input gradient
    if (s.split()) {
      be.RmsNormDots(dots, dy, pre, w, rstd, s.rows, p.cols);
      TY_RETURN_IF_ERROR(group_sum(dots, s.rows));
      be.RmsNormBackwardFromDots(dx, dw, dy, pre, w, rstd, dots, s.rows, p.cols, p.span);
    } else {
      be.RmsNormBackward(dx, dw, dy, pre, w, rstd, s.rows * p.norms, p.width);
    }
    be.CopyRows(columns, s.qkv_stride, dx, p.cols, s.rows, p.cols);
    pre = be.At(pre, s.rows * p.cols);
    rstd += s.rows * p.norms;
  }
  return absl::OkStatus();
}

}  // namespace trainyard::worker
