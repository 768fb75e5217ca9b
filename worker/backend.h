// Backend: the compute interface the model is written against. The model never touches memory
// or math directly; it asks its Backend, so the same model code runs on the CPU reference
// (fp32, OpenBLAS) and, later, on CUDA.
//
// Conventions: pointers are device pointers of this backend; shapes are row-major; linear
// weights are [out, in]; "accumulate" means +=, "overwrite" means =. Calls are issued from one
// thread (the training loop); a backend may parallelise inside a call.
#ifndef TRAINYARD_WORKER_BACKEND_H_
#define TRAINYARD_WORKER_BACKEND_H_

#include <cstdint>
#include <memory>
#include <string>

#include "worker/buffer.h"

namespace trainyard::worker {

struct AttentionShape {
  int64_t batch, seq, heads, kv_heads, head_dim;
};

struct AdamWParams {
  float lr, beta1, beta2, eps, weight_decay;
  int64_t step;  // 1-based
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;

  // Memory. Allocations are zero-filled.
  virtual Buffer<float> AllocFloat(int64_t count) = 0;
  virtual Buffer<int32_t> AllocInt(int64_t count) = 0;
  virtual void CopyFromHost(float* dst, const float* src, int64_t count) = 0;
  virtual void CopyFromHost(int32_t* dst, const int32_t* src, int64_t count) = 0;
  virtual void CopyToHost(int32_t* dst, const int32_t* src, int64_t count) = 0;
  virtual void CopyToHost(float* dst, const float* src, int64_t count) = 0;
  virtual void Copy(float* dst, const float* src, int64_t count) = 0;
  virtual void Fill(float* dst, float value, int64_t count) = 0;
  virtual void Add(float* out, const float* a, const float* b, int64_t count) = 0;

  // out[m, n] = inp[m, k] · weight[n, k]ᵀ + bias[n]   (bias may be null)
  virtual void Linear(float* out, const float* inp, const float* weight, const float* bias,
                      int64_t m, int64_t n, int64_t k) = 0;
  // dinp overwritten (skipped if null); dweight, dbias accumulated (dbias skipped if null).
  virtual void LinearBackward(float* dinp, float* dweight, float* dbias, const float* dout,
                              const float* inp, const float* weight, int64_t m, int64_t n,
                              int64_t k) = 0;

  virtual void LayerNorm(float* out, float* mean, float* rstd, const float* inp,
                         const float* weight, const float* bias, int64_t rows, int64_t c,
                         float eps) = 0;
  // Accumulates into dinp, dweight, dbias.
  virtual void LayerNormBackward(float* dinp, float* dweight, float* dbias, const float* dout,
                                 const float* inp, const float* weight, const float* mean,
                                 const float* rstd, int64_t rows, int64_t c) = 0;
  virtual void RmsNorm(float* out, float* rstd, const float* inp, const float* weight, int64_t rows,
                       int64_t c, float eps) = 0;
  // Accumulates into dinp, dweight.
  virtual void RmsNormBackward(float* dinp, float* dweight, const float* dout, const float* inp,
                               const float* weight, const float* rstd, int64_t rows, int64_t c) = 0;

  virtual void Gelu(float* out, const float* inp, int64_t n) = 0;
  virtual void GeluBackward(float* dinp, const float* dout, const float* inp, int64_t n) = 0;
  virtual void Swiglu(float* out, const float* inp, int64_t rows, int64_t f) = 0;
  virtual void SwigluBackward(float* dinp, const float* dout, const float* inp, int64_t rows,
                              int64_t f) = 0;

  // In place on the query and key heads of a packed qkv activation.
  virtual void Rope(float* qkv, const AttentionShape& s, float theta) = 0;
  virtual void RopeBackward(float* dqkv, const AttentionShape& s, float theta) = 0;

  // Causal attention; out [b, t, heads·d], lse [b, heads, t]. dqkv is overwritten.
  virtual void Attention(float* out, float* lse, const float* qkv, const AttentionShape& s) = 0;
  virtual void AttentionBackward(float* dqkv, const float* dout, const float* qkv, const float* out,
                                 const float* lse, const AttentionShape& s) = 0;

  // Σ cross-entropy over rows; with write_grad, logits become grad_scale·(softmax − onehot).
  virtual double SoftmaxCrossEntropy(float* logits, const int32_t* targets, int64_t rows,
                                     int64_t vocab, float grad_scale, bool write_grad) = 0;

  // Vocabulary-parallel cross-entropy pieces (see kernels/cpu/cross_entropy.h).
  virtual void CrossEntropyShardStats(const float* logits, const int32_t* local_targets,
                                      int64_t rows, int64_t vocab, float* stats) = 0;
  virtual void CrossEntropyShardGrad(float* logits, const int32_t* local_targets, const float* lse,
                                     int64_t rows, int64_t vocab, float grad_scale) = 0;
  // out[m, n] += bias[n]
  virtual void AddBias(float* out, const float* bias, int64_t m, int64_t n) = 0;

  virtual void Embedding(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                         int64_t b, int64_t t, int64_t c) = 0;
  // Accumulates into dwte and dwpe (dwpe may be null); deterministic.
  virtual void EmbeddingBackward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                                 int64_t b, int64_t t, int64_t c) = 0;

  virtual void AdamW(float* param, const float* grad, float* m, float* v, int64_t n,
                     const AdamWParams& p) = 0;
  virtual double SumOfSquares(const float* x, int64_t n) = 0;
  virtual void Scale(float* x, int64_t n, float factor) = 0;
};

// The fp32 CPU reference backend. `threads` <= 0 uses every core.
std::unique_ptr<Backend> MakeCpuBackend(int threads);

}  // namespace trainyard::worker

#endif  // TRAINYARD_WORKER_BACKEND_H_
