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
                 int64_t stride, float scale) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, keys, d, scale, q0, stride, k0, stride,
              0.0f, s, keys);
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
                  scale);
      for (int64_t r = 0; r < rows; ++r) {
        float* pr = p.data() + r * keys;
        const int64_t visible = i0 + r + 1;
        float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
        for (int64_t j = 0; j < visible; ++j) mx = std::max(mx, pr[j]);
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int64_t j = 0; j < visible; ++j) {
          pr[j] = FastExp(pr[j] - mx);
          sum += pr[j];
        }
        const float inv = 1.0f / sum;
#pragma omp simd
        for (int64_t j = 0; j < visible; ++j) pr[j] *= inv;
        std::fill(pr + visible, pr + keys, 0.0f);
        lse[(bi * heads + h) * t + i0 + r] = mx + std::log(sum);
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
          BlockScores(p.data(), q0, base + l.k(g), rows, keys, d, stride, scale);
          // dP = dY · Vᵀ
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, keys, d, 1.0f, dy0, out_stride,
                      base + l.v(g), stride, 0.0f, ds.data(), keys);
          for (int64_t r = 0; r < rows; ++r) {
            float* pr = p.data() + r * keys;
            float* dsr = ds.data() + r * keys;
            const int64_t visible = i0 + r + 1;
            const float row_lse = lse[(bi * heads + h) * t + i0 + r];
            float delta = 0.0f;
#pragma omp simd reduction(+ : delta)
            for (int64_t c = 0; c < d; ++c)
              delta += dy0[r * out_stride + c] * y0[r * out_stride + c];
#pragma omp simd
            for (int64_t j = 0; j < visible; ++j) {
              pr[j] = FastExp(pr[j] - row_lse);
              dsr[j] = pr[j] * (dsr[j] - delta) * scale;
            }
            std::fill(pr + visible, pr + keys, 0.0f);
            std::fill(dsr + visible, dsr + keys, 0.0f);
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

}  // namespace trainyard::kernels::cpu
