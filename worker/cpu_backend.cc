// The CPU backend: forwards each operation to the reference kernels in kernels/cpu.
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>
#include <thread>

#include "kernels/cpu/activations.h"
#include "kernels/cpu/adamw.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/cross_entropy.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/norms.h"
#include "kernels/cpu/rope.h"
#include "worker/backend.h"

extern "C" void openblas_set_num_threads(int num_threads);

namespace trainyard::worker {
namespace {

namespace k = ::trainyard::kernels::cpu;

constexpr size_t kAlignment = 64;

template <typename T>
Buffer<T> AllocAligned(int64_t count) {
  if (count <= 0) return Buffer<T>();
  const size_t bytes =
      (static_cast<size_t>(count) * sizeof(T) + kAlignment - 1) / kAlignment * kAlignment;
  void* p = std::aligned_alloc(kAlignment, bytes);
  if (p == nullptr) throw std::bad_alloc();
  std::memset(p, 0, bytes);
  return Buffer<T>(static_cast<T*>(p), count, [](void* q) { std::free(q); });
}

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(int threads) {
    if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    omp_set_num_threads(threads);
    openblas_set_num_threads(threads);
  }

  std::string name() const override { return "cpu"; }

  Buffer<float> AllocFloat(int64_t count) override { return AllocAligned<float>(count); }
  Buffer<int32_t> AllocInt(int64_t count) override { return AllocAligned<int32_t>(count); }
  void CopyFromHost(float* dst, const float* src, int64_t n) override { std::copy_n(src, n, dst); }
  void CopyFromHost(int32_t* dst, const int32_t* src, int64_t n) override {
    std::copy_n(src, n, dst);
  }
  void CopyToHost(float* dst, const float* src, int64_t n) override { std::copy_n(src, n, dst); }
  void CopyToHost(int32_t* dst, const int32_t* src, int64_t n) override {
    std::copy_n(src, n, dst);
  }
  void Copy(float* dst, const float* src, int64_t n) override { std::copy_n(src, n, dst); }
  void Fill(float* dst, float value, int64_t n) override { std::fill_n(dst, n, value); }
  void Add(float* out, const float* a, const float* b, int64_t n) override {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
  }

  void Linear(float* out, const float* inp, const float* w, const float* b, int64_t m, int64_t n,
              int64_t kk) override {
    k::LinearForward(out, inp, w, b, m, n, kk);
  }
  void LinearBackward(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                      const float* w, int64_t m, int64_t n, int64_t kk) override {
    k::LinearBackward(dinp, dw, db, dout, inp, w, m, n, kk);
  }
  void LayerNorm(float* out, float* mean, float* rstd, const float* inp, const float* w,
                 const float* b, int64_t rows, int64_t c, float eps) override {
    k::LayerNormForward(out, mean, rstd, inp, w, b, rows, c, eps);
  }
  void LayerNormBackward(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                         const float* w, const float* mean, const float* rstd, int64_t rows,
                         int64_t c) override {
    k::LayerNormBackward(dinp, dw, db, dout, inp, w, mean, rstd, rows, c);
  }
  void RmsNorm(float* out, float* rstd, const float* inp, const float* w, int64_t rows, int64_t c,
               float eps) override {
    k::RmsNormForward(out, rstd, inp, w, rows, c, eps);
  }
  void RmsNormBackward(float* dinp, float* dw, const float* dout, const float* inp, const float* w,
                       const float* rstd, int64_t rows, int64_t c) override {
    k::RmsNormBackward(dinp, dw, dout, inp, w, rstd, rows, c);
  }
  void Gelu(float* out, const float* inp, int64_t n) override { k::GeluForward(out, inp, n); }
  void GeluBackward(float* dinp, const float* dout, const float* inp, int64_t n) override {
    k::GeluBackward(dinp, dout, inp, n);
  }
  void Swiglu(float* out, const float* inp, int64_t rows, int64_t f) override {
    k::SwigluForward(out, inp, rows, f);
  }
  void SwigluBackward(float* dinp, const float* dout, const float* inp, int64_t rows,
                      int64_t f) override {
    k::SwigluBackward(dinp, dout, inp, rows, f);
  }
  void Rope(float* qkv, const AttentionShape& s, float theta) override {
    k::RopeForward(qkv, s.batch, s.seq, s.heads, s.kv_heads, s.head_dim, theta);
  }
  void RopeBackward(float* dqkv, const AttentionShape& s, float theta) override {
    k::RopeBackward(dqkv, s.batch, s.seq, s.heads, s.kv_heads, s.head_dim, theta);
  }
  void Attention(float* out, float* lse, const float* qkv, const AttentionShape& s) override {
    k::AttentionForward(out, lse, qkv, s.batch, s.seq, s.heads, s.kv_heads, s.head_dim);
  }
  void AttentionBackward(float* dqkv, const float* dout, const float* qkv, const float* out,
                         const float* lse, const AttentionShape& s) override {
    k::AttentionBackward(dqkv, dout, qkv, out, lse, s.batch, s.seq, s.heads, s.kv_heads,
                         s.head_dim);
  }
  double SoftmaxCrossEntropy(float* logits, const int32_t* targets, int64_t rows, int64_t vocab,
                             float grad_scale, bool write_grad) override {
    return k::SoftmaxCrossEntropy(logits, targets, rows, vocab, grad_scale, write_grad);
  }
  void CrossEntropyShardStats(const float* logits, const int32_t* local_targets, int64_t rows,
                              int64_t vocab, float* stats) override {
    k::CrossEntropyShardStats(logits, local_targets, rows, vocab, stats);
  }
  void CrossEntropyShardGrad(float* logits, const int32_t* local_targets, const float* lse,
                             int64_t rows, int64_t vocab, float grad_scale) override {
    k::CrossEntropyShardGrad(logits, local_targets, lse, rows, vocab, grad_scale);
  }
  void AddBias(float* out, const float* bias, int64_t m, int64_t n) override {
    k::AddBias(out, bias, m, n);
  }
  void Embedding(float* out, const int32_t* tokens, const float* wte, const float* wpe, int64_t b,
                 int64_t t, int64_t c) override {
    k::EmbeddingForward(out, tokens, wte, wpe, b, t, c);
  }
  void EmbeddingBackward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                         int64_t b, int64_t t, int64_t c) override {
    k::EmbeddingBackward(dwte, dwpe, dout, tokens, b, t, c);
  }
  void AdamW(float* param, const float* grad, float* m, float* v, int64_t n,
             const AdamWParams& p) override {
    k::AdamWUpdate(param, grad, m, v, n,
                   k::AdamWStep{p.lr, p.beta1, p.beta2, p.eps, p.weight_decay, p.step});
  }
  double SumOfSquares(const float* x, int64_t n) override { return k::SumOfSquares(x, n); }
  void Scale(float* x, int64_t n, float factor) override { k::ScaleInPlace(x, n, factor); }
};

}  // namespace

std::unique_ptr<Backend> MakeCpuBackend(int threads) {
  return std::make_unique<CpuBackend>(threads);
}

}  // namespace trainyard::worker
