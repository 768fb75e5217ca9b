// The CPU backend: forwards each operation to the reference kernels in kernels/cpu.
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>
#include <thread>

#include "common/host_memory.h"
#include "common/logging.h"
#include "kernels/cpu/activations.h"
#include "kernels/cpu/adamw.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/cross_entropy.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/moe.h"
#include "kernels/cpu/norms.h"
#include "kernels/cpu/rope.h"
#include "worker/backend.h"

extern "C" void openblas_set_num_threads(int num_threads);

namespace trainyard::worker {
namespace {

namespace k = ::trainyard::kernels::cpu;

constexpr size_t kAlignment = 64;

// `count` zeroed elements of `element_bytes` each; T may be incomplete (Act). Large ones on huge
// pages (AllocateHostMemory).
template <typename T>
Buffer<T> AllocAligned(int64_t count, size_t element_bytes) {
  if (count <= 0) return Buffer<T>();
  void* p = AllocateHostMemory(static_cast<size_t>(count) * element_bytes, kAlignment).release();
  return Buffer<T>(static_cast<T*>(p), count, FreeHostMemory());
}

// Activations are fp32 on the CPU: an Act* is a float*.
float* F(Act* p) { return reinterpret_cast<float*>(p); }
const float* F(const Act* p) { return reinterpret_cast<const float*>(p); }

class CpuBackend final : public Backend {
 public:
  CpuBackend(int threads, int64_t logits_vocab_multiple)
      : logits_vocab_multiple_(logits_vocab_multiple) {
    if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    omp_set_num_threads(threads);
    openblas_set_num_threads(threads);
  }

  std::string name() const override { return "cpu"; }
  int64_t logits_vocab_multiple() const override { return logits_vocab_multiple_; }
  DType act_dtype() const override { return DType::kF32; }

  bool host_memory() const override { return true; }
  Buffer<float> AllocFloat(int64_t count) override {
    return AllocAligned<float>(count, sizeof(float));
  }
  Buffer<Act> AllocAct(int64_t count) override { return AllocAligned<Act>(count, sizeof(float)); }
  Buffer<int32_t> AllocInt(int64_t count) override {
    return AllocAligned<int32_t>(count, sizeof(int32_t));
  }
  void CopyFromHost(float* dst, const float* src, int64_t n) override { std::copy_n(src, n, dst); }
  void CopyFromHost(int32_t* dst, const int32_t* src, int64_t n) override {
    std::copy_n(src, n, dst);
  }
  void CopyToHost(float* dst, const float* src, int64_t n) override { std::copy_n(src, n, dst); }
  // Split into 1 MiB pieces spread over the threads: a snapshot is bound by memory bandwidth,
  // which one core does not saturate.
  void CopyToHostMulti(const std::vector<HostCopy>& copies) override {
    constexpr int64_t kPiece = int64_t{1} << 18;
    std::vector<HostCopy> pieces;
    for (const HostCopy& c : copies) {
      for (int64_t at = 0; at < c.count; at += kPiece) {
        pieces.push_back({c.dst + at, c.src + at, std::min(kPiece, c.count - at)});
      }
    }
    const int64_t n = static_cast<int64_t>(pieces.size());
#pragma omp parallel for schedule(dynamic, 4)
    for (int64_t i = 0; i < n; ++i) {
      std::memcpy(pieces[i].dst, pieces[i].src, 4 * pieces[i].count);
    }
  }
  void CopyToHost(int32_t* dst, const int32_t* src, int64_t n) override {
    std::copy_n(src, n, dst);
  }
  void Copy(float* dst, const float* src, int64_t n) override { std::copy_n(src, n, dst); }
  void Fill(float* dst, float value, int64_t n) override { std::fill_n(dst, n, value); }
  void Add(float* out, const float* a, const float* b, int64_t n) override {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
  }
  void CopyActToHost(float* dst, const Act* src, int64_t n) override {
    std::copy_n(F(src), n, dst);
  }
  void CopyActFromHost(Act* dst, const float* src, int64_t n) override {
    std::copy_n(src, n, F(dst));
  }
  void Copy(Act* dst, const Act* src, int64_t n) override { std::copy_n(F(src), n, F(dst)); }
  void Fill(Act* dst, float value, int64_t n) override { std::fill_n(F(dst), n, value); }
  void Add(Act* out, const Act* a, const Act* b, int64_t n) override { Add(F(out), F(a), F(b), n); }
  void CopyRows(Act* dst, int64_t dst_stride, const Act* src, int64_t src_stride, int64_t rows,
                int64_t cols) override {
    for (int64_t r = 0; r < rows; ++r) {
      std::copy_n(F(src) + r * src_stride, cols, F(dst) + r * dst_stride);
    }
  }

  void Linear(Act* out, const Act* inp, const float* w, const float* b, int64_t m, int64_t n,
              int64_t kk) override {
    k::LinearForward(F(out), F(inp), w, b, m, n, kk);
  }
  void LinearBackward(Act* dinp, float* dw, float* db, const Act* dout, const Act* inp,
                      const float* w, int64_t m, int64_t n, int64_t kk) override {
    k::LinearBackward(F(dinp), dw, db, F(dout), F(inp), w, m, n, kk);
  }
  void LinearF32(float* out, const Act* inp, const float* w, int64_t m, int64_t n,
                 int64_t kk) override {
    k::LinearForward(out, F(inp), w, nullptr, m, n, kk);
  }
  void LinearF32Backward(Act* dinp, float* dw, const float* dout, const Act* inp, const float* w,
                         int64_t m, int64_t n, int64_t kk) override {
    k::LinearBackwardAccumulate(F(dinp), dw, dout, F(inp), w, m, n, kk);
  }
  void GatherRows(Act* out, const Act* inp, const int32_t* rows, const float* scale, int64_t count,
                  int64_t cols) override {
    k::GatherRows(F(out), F(inp), rows, scale, count, cols);
  }
  void CombineRows(Act* out, const Act* inp, const int32_t* slots, const float* weights,
                   int64_t rows, int64_t kk, int64_t cols, bool accumulate) override {
    k::CombineRows(F(out), F(inp), slots, weights, rows, kk, cols, accumulate);
  }
  void ExpertsForward(const ExpertMlp& mlp, const Act* in, Act* hidden, Act* act,
                      Act* out) override {
    k::ExpertMlpForward(Shape(mlp), Weights(mlp), F(in), F(hidden), F(act), F(out));
  }
  void ExpertsBackward(const ExpertMlp& mlp, const ExpertMlpGrads& g, const Act* dout,
                       const Act* in, const Act* hidden, const Act* act, Act* dact, Act* dhidden,
                       Act* din) override {
    k::ExpertMlpBackward(Shape(mlp), Weights(mlp), {g.fc_w, g.fc_b, g.proj_w, g.proj_b}, F(dout),
                         F(in), F(hidden), F(act), F(dact), F(dhidden), F(din));
  }
  void RowDots(float* out, const Act* a, const int32_t* a_rows, const Act* b, int64_t count,
               int64_t cols) override {
    k::RowDots(out, F(a), a_rows, F(b), count, cols);
  }
  void SigmoidGateRows(float* gate, const float* logits, Act* x, int64_t rows,
                       int64_t cols) override {
    k::SigmoidGateRows(gate, logits, F(x), rows, cols);
  }
  void SigmoidGateBackward(float* dlogits, const float* gate, const Act* act, const Act* dact,
                           int64_t rows, int64_t cols) override {
    k::SigmoidGateBackward(dlogits, gate, F(act), F(dact), rows, cols);
  }
  void LayerNorm(Act* out, float* mean, float* rstd, const Act* inp, const float* w, const float* b,
                 int64_t rows, int64_t c, float eps) override {
    k::LayerNormForward(F(out), mean, rstd, F(inp), w, b, rows, c, eps);
  }
  void LayerNormBackward(Act* dinp, float* dw, float* db, const Act* dout, const Act* inp,
                         const float* w, const float* mean, const float* rstd, int64_t rows,
                         int64_t c) override {
    k::LayerNormBackward(F(dinp), dw, db, F(dout), F(inp), w, mean, rstd, rows, c);
  }
  void RmsNorm(Act* out, float* rstd, const Act* inp, const float* w, int64_t rows, int64_t c,
               float eps) override {
    k::RmsNormForward(F(out), rstd, F(inp), w, rows, c, eps);
  }
  void RmsNormBackward(Act* dinp, float* dw, const Act* dout, const Act* inp, const float* w,
                       const float* rstd, int64_t rows, int64_t c) override {
    k::RmsNormBackward(F(dinp), dw, F(dout), F(inp), w, rstd, rows, c);
  }
  void RowSquareSums(float* sums, const Act* x, int64_t rows, int64_t c) override {
    k::RowSquareSums(sums, F(x), rows, c);
  }
  void RmsNormFromSums(Act* out, float* rstd, const Act* inp, const float* w, int64_t rows,
                       int64_t c, int64_t n, float eps) override {
    k::RmsNormFromSums(F(out), rstd, F(inp), w, rows, c, n, eps);
  }
  void RmsNormDots(float* dots, const Act* dout, const Act* inp, const float* w, const float* rstd,
                   int64_t rows, int64_t c) override {
    k::RmsNormDots(dots, F(dout), F(inp), w, rstd, rows, c);
  }
  void RmsNormBackwardFromDots(Act* dinp, float* dw, const Act* dout, const Act* inp,
                               const float* w, const float* rstd, const float* dots, int64_t rows,
                               int64_t c, int64_t n) override {
    k::RmsNormBackwardFromDots(F(dinp), dw, F(dout), F(inp), w, rstd, dots, rows, c, n);
  }
  void Gelu(Act* out, const Act* inp, int64_t n) override { k::GeluForward(F(out), F(inp), n); }
  void GeluBackward(Act* dinp, const Act* dout, const Act* inp, int64_t n) override {
    k::GeluBackward(F(dinp), F(dout), F(inp), n);
  }
  void Glu(Act* out, const Act* inp, int64_t rows, int64_t f, kernels::GluGate gate) override {
    k::GluForward(F(out), F(inp), rows, f, gate);
  }
  void GluBackward(Act* dinp, const Act* dout, const Act* inp, int64_t rows, int64_t f,
                   kernels::GluGate gate) override {
    k::GluBackward(F(dinp), F(dout), F(inp), rows, f, gate);
  }
  void Rope(Act* qkv, const AttentionShape& s, const kernels::RopeFrequencies& freq,
            int64_t first_position) override {
    k::RopeForward(F(qkv), s.batch, s.seq, s.heads, s.kv_heads, s.head_dim, freq, first_position,
                   s.value_dim);
  }
  void RopeBackward(Act* dqkv, const AttentionShape& s, const kernels::RopeFrequencies& freq,
                    int64_t first_position) override {
    k::RopeBackward(F(dqkv), s.batch, s.seq, s.heads, s.kv_heads, s.head_dim, freq, first_position,
                    s.value_dim);
  }
  void Attention(Act* out, float* lse, const Act* qkv, const AttentionShape& s) override {
    k::AttentionForward(F(out), lse, F(qkv), s.batch, s.seq, s.heads, s.kv_heads, s.head_dim,
                        s.window, {s.scale, s.softcap}, s.doc_start, s.value_dim);
  }
  void AttentionBackward(Act* dqkv, const Act* dout, const Act* qkv, const Act* out,
                         const float* lse, const AttentionShape& s) override {
    k::AttentionBackward(F(dqkv), F(dout), F(qkv), F(out), lse, s.batch, s.seq, s.heads, s.kv_heads,
                         s.head_dim, s.window, {s.scale, s.softcap}, s.doc_start, s.value_dim);
  }
  void AttentionBlock(Act* out, float* lse, const Act* q, const Act* key, const Act* value,
                      const AttentionBlockShape& s) override {
    k::AttentionBlockForward(F(out), lse, F(q), F(key), F(value), Dims(s));
  }
  void AttentionMerge(Act* out, float* lse, const Act* part, const float* part_lse, int64_t batch,
                      int64_t q_len, int64_t heads, int64_t head_dim) override {
    k::AttentionMerge(F(out), lse, F(part), part_lse, batch, q_len, heads, head_dim);
  }
  void AttentionBlockBackward(Act* dq, Act* dk, Act* dv, const Act* dout, const Act* q,
                              const Act* key, const Act* value, const Act* out, const float* lse,
                              const AttentionBlockShape& s) override {
    k::AttentionBlockBackward(F(dq), F(dk), F(dv), F(dout), F(q), F(key), F(value), F(out), lse,
                              Dims(s));
  }
  void SoftCap(Act* x, int64_t rows, int64_t cols, int64_t ld, float cap) override {
    k::SoftCap(F(x), rows, cols, ld, cap);
  }
  void SoftmaxCrossEntropy(Act* logits, const int32_t* targets, int64_t rows, int64_t vocab,
                           int64_t ld, float grad_scale, bool write_grad, float softcap,
                           float z_loss, float* lse, DeviceSum* loss) override {
    loss->AddHost(k::SoftmaxCrossEntropy(F(logits), targets, rows, vocab, ld, grad_scale,
                                         write_grad, softcap, z_loss, lse));
  }
  void CrossEntropyShardStats(const Act* logits, const int32_t* local_targets, int64_t rows,
                              int64_t vocab, float* stats) override {
    k::CrossEntropyShardStats(F(logits), local_targets, rows, vocab, stats);
  }
  void CrossEntropyShardGrad(Act* logits, const int32_t* local_targets, const float* lse,
                             int64_t rows, int64_t vocab, float grad_scale, float softcap,
                             float z_loss) override {
    k::CrossEntropyShardGrad(F(logits), local_targets, lse, rows, vocab, grad_scale, softcap,
                             z_loss);
  }
  void CrossEntropyMergeShardStats(const float* gathered, int ranks, int64_t stride, int64_t rows,
                                   float* lse, DeviceSum* loss) override {
    loss->AddHost(k::CrossEntropyMergeShardStats(gathered, ranks, stride, rows, lse, nullptr));
  }
  void AddBias(Act* out, const float* bias, int64_t m, int64_t n) override {
    k::AddBias(F(out), bias, m, n);
  }
  void Embedding(Act* out, const int32_t* tokens, const float* wte, const float* wpe, int64_t b,
                 int64_t t, int64_t c, float scale) override {
    k::EmbeddingForward(F(out), tokens, wte, wpe, b, t, c, scale);
  }
  void EmbeddingBackward(float* dwte, float* dwpe, const Act* dout, const int32_t* tokens,
                         int64_t b, int64_t t, int64_t c, int64_t /*vocab*/, float scale) override {
    k::EmbeddingBackward(dwte, dwpe, F(dout), tokens, b, t, c, scale);
  }
  void AdamW(float* param, const float* grad, float* m, float* v, int64_t n,
             const AdamWParams& p) override {
    k::AdamWUpdate(
        param, grad, m, v, n,
        k::AdamWStep{p.lr, p.beta1, p.beta2, p.eps, p.weight_decay, p.step, p.grad_scale});
  }
  double SumOfSquares(const float* x, int64_t n) override { return k::SumOfSquares(x, n); }
  void Scale(float* x, int64_t n, float factor) override { k::ScaleInPlace(x, n, factor); }
  void ScaleAct(Act* out, const Act* in, int64_t n, float factor) override {
    k::ScaleInto(F(out), F(in), n, factor);
  }

 private:
  static k::BlockDims Dims(const AttentionBlockShape& s) {
    TY_CHECK(!s.causal || s.q_len + s.offset == s.kv_len)
        << "a causal attention block ends at its last key: q_len " << s.q_len << ", offset "
        << s.offset << ", kv_len " << s.kv_len;
    TY_CHECK(s.offset >= 0 && s.window >= 0)
        << "attention block: offset " << s.offset << ", window " << s.window;
    TY_CHECK(s.kv_len >= 1 && s.kv_heads >= 1 && s.heads % s.kv_heads == 0)
        << "attention block: kv_len " << s.kv_len << ", heads " << s.heads << ", kv_heads "
        << s.kv_heads;
    return {.b = s.batch,
            .q_len = s.q_len,
            .kv_len = s.kv_len,
            .heads = s.heads,
            .kv_heads = s.kv_heads,
            .d = s.head_dim,
            .q_stride = s.q_stride,
            .kv_stride = s.kv_stride,
            .causal = s.causal,
            .offset = s.offset,
            .window = s.window,
            .rule = {s.scale, s.softcap},
            .doc_start = s.doc_start,
            .key_position = s.key_position,
            .value_dim = s.value_dim};
  }
  static k::ExpertMlpShape Shape(const ExpertMlp& mlp) {
    return {.offsets = mlp.offsets.data(),
            .experts = mlp.experts(),
            .width = mlp.width,
            .ffn = mlp.ffn,
            .gated = mlp.gated,
            .gate = mlp.gate};
  }
  static k::ExpertMlpWeights Weights(const ExpertMlp& mlp) {
    return {mlp.fc_w, mlp.fc_b, mlp.proj_w, mlp.proj_b};
  }

 private:
  int64_t logits_vocab_multiple_;
};

}  // namespace

std::unique_ptr<Backend> MakeCpuBackend(int threads, int64_t logits_vocab_multiple) {
  return std::make_unique<CpuBackend>(threads, std::max<int64_t>(1, logits_vocab_multiple));
}

}  // namespace trainyard::worker
