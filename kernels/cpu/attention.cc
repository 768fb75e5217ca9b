#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace trainyard::kernels::cpu {
namespace {

inline float Dot(const float* a, const float* b, int64_t d) {
  float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
  for (int64_t i = 0; i < d; ++i) acc += a[i] * b[i];
  return acc;
}

inline void Axpy(float* y, float alpha, const float* x, int64_t d) {
#pragma omp simd
  for (int64_t i = 0; i < d; ++i) y[i] += alpha * x[i];
}

struct Layout {
  int64_t t, heads, kv_heads, d;
  int64_t row() const { return (heads + 2 * kv_heads) * d; }
  int64_t q(int64_t h) const { return h * d; }
  int64_t k(int64_t g) const { return (heads + g) * d; }
  int64_t v(int64_t g) const { return (heads + kv_heads + g) * d; }
};

}  // namespace

void AttentionForward(float* out, float* lse, const float* qkv, int64_t b, int64_t t,
                      int64_t heads, int64_t kv_heads, int64_t d) {
  const Layout l{t, heads, kv_heads, d};
  const int64_t rep = heads / kv_heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
#pragma omp parallel
  {
    std::vector<float> scores(t);
#pragma omp for schedule(static)
    for (int64_t bh = 0; bh < b * heads; ++bh) {
      const int64_t bi = bh / heads, h = bh % heads, g = h / rep;
      const float* base = qkv + bi * t * l.row();
      for (int64_t i = 0; i < t; ++i) {
        const float* q = base + i * l.row() + l.q(h);
        float mx = -INFINITY;
        for (int64_t j = 0; j <= i; ++j) {
          scores[j] = Dot(q, base + j * l.row() + l.k(g), d) * scale;
          mx = std::max(mx, scores[j]);
        }
        float sum = 0.0f;
        for (int64_t j = 0; j <= i; ++j) {
          scores[j] = std::exp(scores[j] - mx);
          sum += scores[j];
        }
        float* o = out + (bi * t + i) * heads * d + h * d;
        std::fill(o, o + d, 0.0f);
        const float inv = 1.0f / sum;
        for (int64_t j = 0; j <= i; ++j) Axpy(o, scores[j] * inv, base + j * l.row() + l.v(g), d);
        lse[(bi * heads + h) * t + i] = mx + std::log(sum);
      }
    }
  }
}

void AttentionBackward(float* dqkv, const float* dout, const float* qkv, const float* out,
                       const float* lse, int64_t b, int64_t t, int64_t heads, int64_t kv_heads,
                       int64_t d) {
  const Layout l{t, heads, kv_heads, d};
  const int64_t rep = heads / kv_heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  // One task per (batch, kv head): it owns the key/value gradients of its group and the query
  // gradients of the heads that read it, so no two tasks write the same element.
#pragma omp parallel for schedule(static)
  for (int64_t bg = 0; bg < b * kv_heads; ++bg) {
    const int64_t bi = bg / kv_heads, g = bg % kv_heads;
    const float* base = qkv + bi * t * l.row();
    float* dbase = dqkv + bi * t * l.row();
    for (int64_t i = 0; i < t; ++i) {
      std::fill_n(dbase + i * l.row() + l.k(g), d, 0.0f);
      std::fill_n(dbase + i * l.row() + l.v(g), d, 0.0f);
      for (int64_t h = g * rep; h < (g + 1) * rep; ++h) std::fill_n(dbase + i * l.row() + l.q(h), d, 0.0f);
    }
    for (int64_t h = g * rep; h < (g + 1) * rep; ++h) {
      for (int64_t i = 0; i < t; ++i) {
        const float* q = base + i * l.row() + l.q(h);
        const float* dy = dout + (bi * t + i) * heads * d + h * d;
        const float* y = out + (bi * t + i) * heads * d + h * d;
        const float row_lse = lse[(bi * heads + h) * t + i];
        const float delta = Dot(dy, y, d);
        float* dq = dbase + i * l.row() + l.q(h);
        for (int64_t j = 0; j <= i; ++j) {
          const float* k = base + j * l.row() + l.k(g);
          const float* v = base + j * l.row() + l.v(g);
          const float p = std::exp(Dot(q, k, d) * scale - row_lse);
          const float ds = p * (Dot(dy, v, d) - delta) * scale;
          Axpy(dq, ds, k, d);
          Axpy(dbase + j * l.row() + l.k(g), ds, q, d);
          Axpy(dbase + j * l.row() + l.v(g), p, dy, d);
        }
      }
    }
  }
}

}  // namespace trainyard::kernels::cpu
