#include "kernels/cpu/attention.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/fast_math.h"

namespace trainyard::kernels::cpu {
namespace {

// Queries are processed in blocks of this many rows: a block's scores against every earlier key
// ([kBlock, t] floats per thread) are the largest scratch the kernels hold.
constexpr int64_t kBlock = 64;

// Offsets of one head's slices in a packed qkv row.
struct Layout {
  int64_t heads, kv_heads, d;
  int64_t row() const { return (heads + 2 * kv_heads) * d; }
  int64_t q(int64_t h) const { return h * d; }
  int64_t k(int64_t g) const { return (heads + g) * d; }
  int64_t v(int64_t g) const { return (heads + kv_heads + g) * d; }
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
  int64_t out_stride() const { return s.heads * s.d; }
  int64_t q(int64_t bi, int64_t i, int64_t h) const {
    return (bi * s.q_len + i) * s.q_stride + h * s.d;
  }
  int64_t kv(int64_t bi, int64_t g) const { return bi * s.kv_len * s.kv_stride + g * s.d; }
  int64_t out(int64_t bi, int64_t i, int64_t h) const {
    return (bi * s.q_len + i) * out_stride() + h * s.d;
  }
  int64_t lse(int64_t bi, int64_t h, int64_t i) const { return (bi * s.heads + h) * s.q_len + i; }
  // Keys that some query before row i1 sees: a causal block's later keys are never read.
  int64_t keys_before(int64_t i1) const { return s.causal ? i1 : s.kv_len; }
  int64_t keys_seen_by(int64_t i) const { return s.causal ? i + 1 : s.kv_len; }
  float scale() const { return 1.0f / std::sqrt(static_cast<float>(s.d)); }
};

// Turns the first `visible` of a row's `keys` scores into probabilities (the rest become 0) and
// returns their log-sum-exp.
float SoftmaxRow(float* row, int64_t visible, int64_t keys) {
  float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
  for (int64_t j = 0; j < visible; ++j) mx = std::max(mx, row[j]);
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < visible; ++j) {
    row[j] = FastExp(row[j] - mx);
    sum += row[j];
  }
  const float inv = 1.0f / sum;
#pragma omp simd
  for (int64_t j = 0; j < visible; ++j) row[j] *= inv;
  std::fill(row + visible, row + keys, 0.0f);
  return mx + std::log(sum);
}

// The out rows and lse of query rows [i0, min(i0 + kBlock, q_len)) of head h of batch entry bi.
// p: scratch for [kBlock, kv_len] scores.
void ForwardQueryBlock(float* p, float* out, float* lse, const float* q, const float* k,
                       const float* v, const BlockOffsets& o, int64_t bi, int64_t h, int64_t i0) {
  const BlockDims& s = o.s;
  const int64_t g = h / o.group_size(), i1 = std::min(s.q_len, i0 + kBlock), rows = i1 - i0;
  const int64_t keys = o.keys_before(i1);
  BlockScores(p, q + o.q(bi, i0, h), k + o.kv(bi, g), rows, keys, s.d, s.q_stride, s.kv_stride,
              o.scale());
  for (int64_t r = 0; r < rows; ++r) {
    lse[o.lse(bi, h, i0 + r)] = SoftmaxRow(p + r * keys, o.keys_seen_by(i0 + r), keys);
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, s.d, keys, 1.0f, p, keys,
              v + o.kv(bi, g), s.kv_stride, 0.0f, out + o.out(bi, i0, h), o.out_stride());
}

// The operands of a block's backward (see AttentionBlockBackward).
struct BackwardOperands {
  float *dq, *dk, *dv;
  const float *dout, *q, *k, *v, *out, *lse;
};

// A row's probabilities P = exp(S − lse) in place of its scores, and dS = P ∘ (dP − delta) · scale
// in place of dP; keys past `visible` get 0 in both.
void GradientRow(float* p, float* ds, int64_t visible, int64_t keys, float row_lse, float delta,
                 float scale) {
#pragma omp simd
  for (int64_t j = 0; j < visible; ++j) {
    p[j] = FastExp(p[j] - row_lse);
    ds[j] = p[j] * (ds[j] - delta) * scale;
  }
  std::fill(p + visible, p + keys, 0.0f);
  std::fill(ds + visible, ds + keys, 0.0f);
}

// Adds the gradients from query rows [i0, min(i0 + kBlock, q_len)) of head h of batch entry bi.
// p, ds: scratch for [kBlock, kv_len] each.
void BackwardQueryBlock(float* p, float* ds, const BackwardOperands& x, const BlockOffsets& o,
                        int64_t bi, int64_t h, int64_t i0) {
  const BlockDims& s = o.s;
  const int64_t g = h / o.group_size(), i1 = std::min(s.q_len, i0 + kBlock), rows = i1 - i0;
  const int64_t keys = o.keys_before(i1), ld = o.out_stride();
  const float* q0 = x.q + o.q(bi, i0, h);
  const float* k0 = x.k + o.kv(bi, g);
  const float* dy0 = x.dout + o.out(bi, i0, h);
  const float* y0 = x.out + o.out(bi, i0, h);
  // Recompute the block's probabilities from the merged log-sum-exp.
  BlockScores(p, q0, k0, rows, keys, s.d, s.q_stride, s.kv_stride, o.scale());
  // dP = dY · Vᵀ
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, keys, s.d, 1.0f, dy0, ld,
              x.v + o.kv(bi, g), s.kv_stride, 0.0f, ds, keys);
  for (int64_t r = 0; r < rows; ++r) {
    // rowsum(dY ∘ Y) over the whole attention's output, which is why out must be the merged one.
    float delta = 0.0f;
#pragma omp simd reduction(+ : delta)
    for (int64_t c = 0; c < s.d; ++c) delta += dy0[r * ld + c] * y0[r * ld + c];
    GradientRow(p + r * keys, ds + r * keys, o.keys_seen_by(i0 + r), keys,
                x.lse[o.lse(bi, h, i0 + r)], delta, o.scale());
  }
  // dQ += dS · K;  dK += dSᵀ · Q;  dV += Pᵀ · dY
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, s.d, keys, 1.0f, ds, keys, k0,
              s.kv_stride, 1.0f, x.dq + o.q(bi, i0, h), s.q_stride);
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, keys, s.d, rows, 1.0f, ds, keys, q0,
              s.q_stride, 1.0f, x.dk + o.kv(bi, g), s.kv_stride);
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, keys, s.d, rows, 1.0f, p, keys, dy0, ld,
              1.0f, x.dv + o.kv(bi, g), s.kv_stride);
}

}  // namespace

void AttentionForward(float* out, float* lse, const float* qkv, int64_t b, int64_t t, int64_t heads,
                      int64_t kv_heads, int64_t d) {
  const Layout l{heads, kv_heads, d};
  const int64_t rep = heads / kv_heads, stride = l.row(), out_stride = heads * d;
  const int64_t blocks = (t + kBlock - 1) / kBlock;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
#pragma omp parallel
  {
    std::vector<float> p(kBlock * t);
#pragma omp for schedule(static)
    for (int64_t task = 0; task < b * heads * blocks; ++task) {
      const int64_t bi = task / (heads * blocks), h = task / blocks % heads, blk = task % blocks;
      const int64_t g = h / rep, i0 = blk * kBlock, i1 = std::min(t, i0 + kBlock);
      const int64_t rows = i1 - i0,
                    keys = i1;  // causal: keys beyond the block's last row are unseen
      const float* base = qkv + bi * t * stride;
      BlockScores(p.data(), base + i0 * stride + l.q(h), base + l.k(g), rows, keys, d, stride,
                  stride, scale);
      for (int64_t r = 0; r < rows; ++r) {
        lse[(bi * heads + h) * t + i0 + r] = SoftmaxRow(p.data() + r * keys, i0 + r + 1, keys);
      }
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, d, keys, 1.0f, p.data(), keys,
                  base + l.v(g), stride, 0.0f, out + (bi * t + i0) * out_stride + h * d,
                  out_stride);
    }
  }
}

void AttentionBackward(float* dqkv, const float* dout, const float* qkv, const float* out,
                       const float* lse, int64_t b, int64_t t, int64_t heads, int64_t kv_heads,
                       int64_t d) {
  const Layout l{heads, kv_heads, d};
  const int64_t rep = heads / kv_heads, stride = l.row(), out_stride = heads * d;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  // One task per (batch, kv head): it owns the key/value gradients of its group and the query
  // gradients of the heads that read it, so no two tasks write the same element, and each
  // accumulates in a fixed order.
#pragma omp parallel
  {
    std::vector<float> p(kBlock * t), ds(kBlock * t);
#pragma omp for schedule(static)
    for (int64_t bg = 0; bg < b * kv_heads; ++bg) {
      const int64_t bi = bg / kv_heads, g = bg % kv_heads;
      const float* base = qkv + bi * t * stride;
      float* dbase = dqkv + bi * t * stride;
      for (int64_t i = 0; i < t; ++i) {
        std::fill_n(dbase + i * stride + l.k(g), d, 0.0f);
        std::fill_n(dbase + i * stride + l.v(g), d, 0.0f);
      }
      for (int64_t h = g * rep; h < (g + 1) * rep; ++h) {
        for (int64_t i0 = 0; i0 < t; i0 += kBlock) {
          const int64_t i1 = std::min(t, i0 + kBlock), rows = i1 - i0, keys = i1;
          const float* q0 = base + i0 * stride + l.q(h);
          const float* dy0 = dout + (bi * t + i0) * out_stride + h * d;
          const float* y0 = out + (bi * t + i0) * out_stride + h * d;
          // Recompute the block's probabilities from the saved log-sum-exp.
          BlockScores(p.data(), q0, base + l.k(g), rows, keys, d, stride, stride, scale);
          // dP = dY · Vᵀ
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, keys, d, 1.0f, dy0, out_stride,
                      base + l.v(g), stride, 0.0f, ds.data(), keys);
          for (int64_t r = 0; r < rows; ++r) {
            float delta = 0.0f;
#pragma omp simd reduction(+ : delta)
            for (int64_t c = 0; c < d; ++c)
              delta += dy0[r * out_stride + c] * y0[r * out_stride + c];
            GradientRow(p.data() + r * keys, ds.data() + r * keys, i0 + r + 1, keys,
                        lse[(bi * heads + h) * t + i0 + r], delta, scale);
          }
          // dQ = dS · K;  dK += dSᵀ · Q;  dV += Pᵀ · dY
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, d, keys, 1.0f, ds.data(),
                      keys, base + l.k(g), stride, 0.0f, dbase + i0 * stride + l.q(h), stride);
          cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, keys, d, rows, 1.0f, ds.data(), keys,
                      q0, stride, 1.0f, dbase + l.k(g), stride);
          cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, keys, d, rows, 1.0f, p.data(), keys,
                      dy0, out_stride, 1.0f, dbase + l.v(g), stride);
        }
      }
    }
  }
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
