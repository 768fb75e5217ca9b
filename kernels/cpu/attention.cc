#include "kernels/cpu/attention.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/fast_math.h"
#include "kernels/soft_cap.h"

namespace trainyard::kernels::cpu {
namespace {

// Queries are processed in blocks of this many rows: a block's scores against every earlier key
// ([kBlock, t] floats per thread) are the largest scratch the kernels hold.
constexpr int64_t kBlock = 64;

// Offsets of one head's slices in a packed qkv row: query and key heads of d, value heads of dv.
struct Layout {
  int64_t heads, kv_heads, d, dv;
  int64_t row() const { return (heads + kv_heads) * d + kv_heads * dv; }
  int64_t q(int64_t h) const { return h * d; }
  int64_t k(int64_t g) const { return (heads + g) * d; }
  int64_t v(int64_t g) const { return (heads + kv_heads) * d + g * dv; }
};

// s[r, j] = scale · ⟨q_{i0+r}, k_j⟩ for the block's rows r and keys j < keys (one GEMM; the
// entries above the causal diagonal are computed and then ignored).
void BlockScores(float* s, const float* q0, const float* k0, int64_t rows, int64_t keys, int64_t d,
                 int64_t q_stride, int64_t k_stride, float scale) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, keys, d, scale, q0, q_stride, k0,
              k_stride, 0.0f, s, keys);
}

// Element offsets inside the operands of one attention block (see BlockDims).
struct BlockOffsets {
  const BlockDims& s;
  int64_t group_size() const { return s.heads / s.kv_heads; }
  int64_t dv() const { return s.value_dim > 0 ? s.value_dim : s.d; }
  int64_t out_stride() const { return s.heads * dv(); }
  int64_t q(int64_t bi, int64_t i, int64_t h) const {
    return (bi * s.q_len + i) * s.q_stride + h * s.d;
  }
  // Key head g's and value head g's first row.
  int64_t k(int64_t bi, int64_t g) const { return bi * s.kv_len * s.kv_stride + g * s.d; }
  int64_t v(int64_t bi, int64_t g) const { return bi * s.kv_len * s.kv_stride + g * dv(); }
  int64_t out(int64_t bi, int64_t i, int64_t h) const {
    return (bi * s.q_len + i) * out_stride() + h * dv();
  }
  int64_t lse(int64_t bi, int64_t h, int64_t i) const { return (bi * s.heads + h) * s.q_len + i; }
  // The keys query row i of batch entry bi sees: [first_key(bi, i), end_key(i)), both
  // non-decreasing in i, so a block of rows [i0, i1) reads keys [first_key(bi, i0),
  // end_key(i1 − 1)) and no others.
  int64_t first_key(int64_t bi, int64_t i) const {
    int64_t first = s.window > 0 ? i + s.offset - s.window + 1 : 0;
    if (s.doc_start != nullptr) {
      first = std::max(first, s.doc_start[bi * s.q_len + i] - s.key_position);
    }
    return std::clamp(first, int64_t{0}, s.kv_len);
  }
  int64_t end_key(int64_t i) const {
    return s.causal ? std::clamp(i + s.offset + 1, int64_t{0}, s.kv_len) : s.kv_len;
  }
  float scale() const {
    return s.rule.scale > 0.0f ? s.rule.scale : 1.0f / std::sqrt(static_cast<float>(s.d));
  }
  // 1 / the soft cap, 0 without one.
  float inv_cap() const { return InverseCap(s.rule.softcap); }
};

// The keys [k0, k1) a block of query rows [i0, i1) reads between them.
struct KeyRange {
  int64_t i0, i1, k0, k1;
  KeyRange(const BlockOffsets& o, int64_t bi, int64_t first_row)
      : i0(first_row),
        i1(std::min(o.s.q_len, first_row + kBlock)),
        k0(o.first_key(bi, first_row)),
        k1(std::max(k0, o.end_key(i1 - 1))) {}
  int64_t rows() const { return i1 - i0; }
  int64_t keys() const { return k1 - k0; }
};

// Scores s of a [rows, keys] block become C·tanh(s / C) under a soft cap C (none: unchanged).
void CapScores(float* s, int64_t n, float cap) {
  if (cap <= 0.0f) return;
  const float inv = InverseCap(cap);
  for (int64_t i = 0; i < n; ++i) s[i] = SoftCapped(s[i], cap, inv);
}

// Turns a row's scores of keys [from, to) (of `keys`) into probabilities (the rest become 0) and
// returns their log-sum-exp: −∞ when the row sees no key.
float SoftmaxRow(float* row, int64_t from, int64_t to, int64_t keys) {
  std::fill(row, row + from, 0.0f);
  std::fill(row + std::max(from, to), row + keys, 0.0f);
  if (to <= from) return -INFINITY;
  float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
  for (int64_t j = from; j < to; ++j) mx = std::max(mx, row[j]);
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = from; j < to; ++j) {
    row[j] = FastExp(row[j] - mx);
    sum += row[j];
  }
  const float inv = 1.0f / sum;
#pragma omp simd
  for (int64_t j = from; j < to; ++j) row[j] *= inv;
  return mx + std::log(sum);
}

// The out rows and lse of query rows [i0, min(i0 + kBlock, q_len)) of head h of batch entry bi.
// p: scratch for [kBlock, kv_len] scores.
void ForwardQueryBlock(float* p, float* out, float* lse, const float* q, const float* k,
                       const float* v, const BlockOffsets& o, int64_t bi, int64_t h, int64_t i0) {
  const BlockDims& s = o.s;
  const int64_t g = h / o.group_size();
  const KeyRange r(o, bi, i0);
  const int64_t keys = r.keys(), k0 = r.k0;
  if (keys == 0) {  // no row of the block sees a key
    for (int64_t i = r.i0; i < r.i1; ++i) {
      std::fill_n(out + o.out(bi, i, h), o.dv(), 0.0f);
      lse[o.lse(bi, h, i)] = -INFINITY;
    }
    return;
  }
  const float* k_rows = k + o.k(bi, g) + k0 * s.kv_stride;
  const float* v_rows = v + o.v(bi, g) + k0 * s.kv_stride;
  BlockScores(p, q + o.q(bi, i0, h), k_rows, r.rows(), keys, s.d, s.q_stride, s.kv_stride,
              o.scale());
  CapScores(p, r.rows() * keys, s.rule.softcap);
  for (int64_t i = r.i0; i < r.i1; ++i) {
    lse[o.lse(bi, h, i)] =
        SoftmaxRow(p + (i - i0) * keys, o.first_key(bi, i) - k0, o.end_key(i) - k0, keys);
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, r.rows(), o.dv(), keys, 1.0f, p, keys,
              v_rows, s.kv_stride, 0.0f, out + o.out(bi, i0, h), o.out_stride());
}

// The operands of a block's backward (see AttentionBlockBackward).
struct BackwardOperands {
  float *dq, *dk, *dv;
  const float *dout, *q, *k, *v, *out, *lse;
};

// A row's probabilities P = exp(Z − lse) in place of its (capped) scores Z, and
// dS = P ∘ (dP − delta) ∘ (1 − (Z / C)²) · scale in place of dP, over keys [from, to) (inv_cap
// = 1 / C, 0 without a cap); the other keys get 0 in both.
void GradientRow(float* p, float* ds, int64_t from, int64_t to, int64_t keys, float row_lse,
                 float delta, float scale, float inv_cap) {
  to = std::max(from, to);
  if (inv_cap == 0.0f) {  // uncapped scores: the training step's usual loop, with nothing added
#pragma omp simd
    for (int64_t j = from; j < to; ++j) {
      p[j] = FastExp(p[j] - row_lse);
      ds[j] = p[j] * (ds[j] - delta) * scale;
    }
  } else {
#pragma omp simd
    for (int64_t j = from; j < to; ++j) {
      const float z = p[j];
      p[j] = FastExp(z - row_lse);
      ds[j] = ThroughCap(p[j] * (ds[j] - delta), z, inv_cap) * scale;
    }
  }
  for (float* row : {p, ds}) {
    std::fill(row, row + from, 0.0f);
    std::fill(row + to, row + keys, 0.0f);
  }
}

// Adds the gradients from query rows [i0, min(i0 + kBlock, q_len)) of head h of batch entry bi.
// p, ds: scratch for [kBlock, kv_len] each.
void BackwardQueryBlock(float* p, float* ds, const BackwardOperands& x, const BlockOffsets& o,
                        int64_t bi, int64_t h, int64_t i0) {
  const BlockDims& s = o.s;
  const int64_t g = h / o.group_size(), ld = o.out_stride(), dv = o.dv();
  const KeyRange r(o, bi, i0);
  const int64_t keys = r.keys(), rows = r.rows();
  const int64_t k_at = o.k(bi, g) + r.k0 * s.kv_stride, v_at = o.v(bi, g) + r.k0 * s.kv_stride;
  if (keys == 0) return;
  const float* q0 = x.q + o.q(bi, i0, h);
  const float* k0 = x.k + k_at;
  const float* dy0 = x.dout + o.out(bi, i0, h);
  const float* y0 = x.out + o.out(bi, i0, h);
  // Recompute the block's probabilities from the merged log-sum-exp.
  BlockScores(p, q0, k0, rows, keys, s.d, s.q_stride, s.kv_stride, o.scale());
  CapScores(p, rows * keys, s.rule.softcap);
  // dP = dY · Vᵀ
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, keys, dv, 1.0f, dy0, ld, x.v + v_at,
              s.kv_stride, 0.0f, ds, keys);
  for (int64_t i = r.i0; i < r.i1; ++i) {
    // rowsum(dY ∘ Y) over the whole attention's output, which is why out must be the merged one.
    const int64_t row = i - i0;
    float delta = 0.0f;
#pragma omp simd reduction(+ : delta)
    for (int64_t c = 0; c < dv; ++c) delta += dy0[row * ld + c] * y0[row * ld + c];
    GradientRow(p + row * keys, ds + row * keys, o.first_key(bi, i) - r.k0, o.end_key(i) - r.k0,
                keys, x.lse[o.lse(bi, h, i)], delta, o.scale(), o.inv_cap());
  }
  // dQ += dS · K;  dK += dSᵀ · Q;  dV += Pᵀ · dY
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, s.d, keys, 1.0f, ds, keys, k0,
              s.kv_stride, 1.0f, x.dq + o.q(bi, i0, h), s.q_stride);
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, keys, s.d, rows, 1.0f, ds, keys, q0,
              s.q_stride, 1.0f, x.dk + k_at, s.kv_stride);
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, keys, dv, rows, 1.0f, p, keys, dy0, ld, 1.0f,
              x.dv + v_at, s.kv_stride);
}

// The causal block of a packed qkv row (Layout l) against itself.
BlockDims SelfBlock(int64_t b, int64_t t, const Layout& l, int64_t window, ScoreRule rule,
                    const int32_t* doc_start) {
  return BlockDims{.b = b,
                   .q_len = t,
                   .kv_len = t,
                   .heads = l.heads,
                   .kv_heads = l.kv_heads,
                   .d = l.d,
                   .q_stride = l.row(),
                   .kv_stride = l.row(),
                   .causal = true,
                   .window = window,
                   .rule = rule,
                   .doc_start = doc_start,
                   .value_dim = l.dv};
}

}  // namespace

void AttentionForward(float* out, float* lse, const float* qkv, int64_t b, int64_t t, int64_t heads,
                      int64_t kv_heads, int64_t d, int64_t window, ScoreRule rule,
                      const int32_t* doc_start, int64_t value_dim) {
  const Layout l{heads, kv_heads, d, value_dim > 0 ? value_dim : d};
  AttentionBlockForward(out, lse, qkv + l.q(0), qkv + l.k(0), qkv + l.v(0),
                        SelfBlock(b, t, l, window, rule, doc_start));
}

void AttentionBackward(float* dqkv, const float* dout, const float* qkv, const float* out,
                       const float* lse, int64_t b, int64_t t, int64_t heads, int64_t kv_heads,
                       int64_t d, int64_t window, ScoreRule rule, const int32_t* doc_start,
                       int64_t value_dim) {
  const Layout l{heads, kv_heads, d, value_dim > 0 ? value_dim : d};
  const int64_t n = b * t * l.row();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; i += 4096) std::fill(dqkv + i, dqkv + std::min(n, i + 4096), 0.0f);
  AttentionBlockBackward(dqkv + l.q(0), dqkv + l.k(0), dqkv + l.v(0), dout, qkv + l.q(0),
                         qkv + l.k(0), qkv + l.v(0), out, lse,
                         SelfBlock(b, t, l, window, rule, doc_start));
}

void AttentionBlockForward(float* out, float* lse, const float* q, const float* k, const float* v,
                           const BlockDims& s) {
  const BlockOffsets o{s};
  const int64_t blocks = (s.q_len + kBlock - 1) / kBlock;
#pragma omp parallel
  {
    std::vector<float> p(kBlock * s.kv_len);
#pragma omp for schedule(static)
    for (int64_t task = 0; task < s.b * s.heads * blocks; ++task) {
      const int64_t bi = task / (s.heads * blocks), h = task / blocks % s.heads;
      ForwardQueryBlock(p.data(), out, lse, q, k, v, o, bi, h, task % blocks * kBlock);
    }
  }
}

void AttentionMerge(float* out, float* lse, const float* part, const float* part_lse, int64_t b,
                    int64_t q_len, int64_t heads, int64_t d) {
  const int64_t width = heads * d;
#pragma omp parallel for schedule(static)
  for (int64_t row = 0; row < b * q_len; ++row) {
    const int64_t bi = row / q_len, i = row % q_len;
    for (int64_t h = 0; h < heads; ++h) {
      float& l = lse[(bi * heads + h) * q_len + i];
      const float lp = part_lse[(bi * heads + h) * q_len + i];
      float* y = out + row * width + h * d;
      const float* yp = part + row * width + h * d;
      if (lp == -INFINITY) continue;
      if (l == -INFINITY) {
        std::copy_n(yp, d, y);
        l = lp;
        continue;
      }
      // Relative to the larger lse, so neither exponential overflows.
      const float mx = std::max(l, lp);
      const float e_out = FastExp(l - mx), e_part = FastExp(lp - mx), sum = e_out + e_part;
      const float w_out = e_out / sum, w_part = e_part / sum;
#pragma omp simd
      for (int64_t c = 0; c < d; ++c) y[c] = w_out * y[c] + w_part * yp[c];
      l = mx + std::log(sum);
    }
  }
}

void AttentionBlockBackward(float* dq, float* dk, float* dv, const float* dout, const float* q,
                            const float* k, const float* v, const float* out, const float* lse,
                            const BlockDims& s) {
  const BlockOffsets o{s};
  const BackwardOperands x{dq, dk, dv, dout, q, k, v, out, lse};
  // One task per (batch entry, kv head), as in AttentionBackward: it alone adds to its group's
  // key/value rows and to the query rows of the heads that read them, in a fixed order.
#pragma omp parallel
  {
    std::vector<float> p(kBlock * s.kv_len), ds(kBlock * s.kv_len);
#pragma omp for schedule(static)
    for (int64_t bg = 0; bg < s.b * s.kv_heads; ++bg) {
      const int64_t bi = bg / s.kv_heads, g = bg % s.kv_heads, rep = o.group_size();
      for (int64_t h = g * rep; h < (g + 1) * rep; ++h) {
        for (int64_t i0 = 0; i0 < s.q_len; i0 += kBlock) {
          BackwardQueryBlock(p.data(), ds.data(), x, o, bi, h, i0);
        }
      }
    }
  }
}

}  // namespace trainyard::kernels::cpu
