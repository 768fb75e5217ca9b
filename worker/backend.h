// Backend: the compute interface the model is written against. The model never touches memory
// or math directly; it asks its Backend, so the same model code runs on the CPU reference
// (fp32, OpenBLAS) and on CUDA (bf16 activations, cuBLASLt, the kernels in kernels/cuda).
//
// Two kinds of tensors cross this interface. Parameters, gradients, optimizer state and
// per-row statistics (norm mean/rstd, attention log-sum-exp) are fp32 (`float*`). Activations
// and their gradients are `Act*`: elements of the backend's act_dtype() — fp32 on the CPU, bf16
// on CUDA. Act is opaque: the model offsets such pointers only through At() and hands them back;
// arithmetic happens in fp32 inside the backend whatever the storage.
//
// Conventions: pointers are device pointers of this backend; shapes are row-major; linear
// weights are [out, in]; "accumulate" means +=, "overwrite" means =. Calls are issued from one
// thread (the training loop) and may run asynchronously on the device: results are visible to
// CopyToHost / CopyActToHost (which wait) and to later calls. A device error is sticky and
// reported by Synchronize(). A backend may parallelise inside a call.
#ifndef TRAINYARD_WORKER_BACKEND_H_
#define TRAINYARD_WORKER_BACKEND_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/dtype.h"
#include "kernels/glu.h"
#include "kernels/rope_frequencies.h"
#include "worker/buffer.h"

namespace trainyard::worker {

// Element of an activation tensor (see above). Never defined.
struct Act;

struct AttentionShape {
  int64_t batch, seq, heads, kv_heads, head_dim;
  // A sliding window of this many positions (model.sliding_window): query i sees keys
  // i − window < j <= i. 0: every earlier key.
  int64_t window = 0;
  // Scores are ⟨q, k⟩·scale (0: 1/√head_dim), then C·tanh(s / C) under a soft cap C (0: none).
  float scale = 0.0f;
  float softcap = 0.0f;
  // Documents (model.document_token): for each row [batch, seq] the position of its document's
  // first token, counted from its sequence's start; query i sees no key before it. Null: none.
  const int32_t* doc_start = nullptr;
  // The value heads' width dv (0: head_dim, which the query and key heads keep): the packed qkv
  // row is (heads + kv_heads)·head_dim + kv_heads·dv wide and the output heads·dv (multi-head
  // latent attention's value heads are narrower than its query and key heads).
  int64_t value_dim = 0;
  int64_t v_dim() const { return value_dim > 0 ? value_dim : head_dim; }
  int64_t qkv_row() const { return (heads + kv_heads) * head_dim + kv_heads * v_dim(); }
};

// One block of attention for context parallelism: the queries of one sequence chunk against the
// keys and values of one chunk (this rank's or another's). Row i of sequence bi of the queries
// starts at q + (bi·q_len + i)·q_stride, query head h at h·head_dim; keys and values likewise
// with kv_len and kv_stride, kv head g at g·head_dim (query head h reads g = h / (heads/kv_heads)).
struct AttentionBlockShape {
  int64_t batch, q_len, kv_len, heads, kv_heads, head_dim;
  int64_t q_stride, kv_stride;
  // Query row i is at position i + offset counted from key row 0. Causal: key j is visible to
  // query i iff j <= i + offset (a chunk against itself: offset 0, q_len == kv_len); otherwise
  // every key is. A window W > 0 hides keys j <= i + offset − W too; a query row that sees no
  // key of the block gets lse −∞ and a zero output row.
  bool causal;
  int64_t offset = 0;
  int64_t window = 0;
  float scale = 0.0f;  // as AttentionShape's
  float softcap = 0.0f;
  // Documents: for each query row [batch, q_len] the position of its document's first token,
  // and key_position the position of key row 0, both counted from the sequence's start (query
  // row i sees no key j < doc_start − key_position). Null: none.
  const int32_t* doc_start = nullptr;
  int64_t key_position = 0;
  // Value head g at g·dv of a value row (dv: value_dim, or head_dim when 0); outputs heads·dv.
  int64_t value_dim = 0;
};

// The routed experts' MLPs of one MoE layer on one rank, as one grouped call: expert j runs on
// rows [offsets[j], offsets[j + 1]) of every row-major activation operand, and its weights start
// j strides into each array: fc [fc_out, width] (fc_out = ffn, or 2·ffn for a gated unit's gate and
// up halves), fc_b [fc_out], proj [width, ffn], proj_b [width]; a null bias is none.
struct ExpertMlp {
  std::span<const int64_t> offsets;  // experts + 1
  int64_t width, ffn;
  bool gated;  // a gated unit over fc's [gate, up] halves; else GELU
  kernels::GluGate gate = kernels::GluGate::kSilu;  // the gated unit's (SwiGLU or GeGLU)
  const float *fc_w, *fc_b, *proj_w, *proj_b;
  int64_t experts() const { return static_cast<int64_t>(offsets.size()) - 1; }
  int64_t fc_out() const { return gated ? 2 * ffn : ffn; }
};
// Its gradients, accumulated (a null pointer is not computed).
struct ExpertMlpGrads {
  float *fc_w, *fc_b, *proj_w, *proj_b;
};

struct AdamWParams {
  float lr, beta1, beta2, eps, weight_decay;
  int64_t step;  // 1-based
  // Gradients are read as grad · grad_scale: global-norm clipping applied inside the update,
  // without a pass of its own.
  float grad_scale = 1.0f;
};

// A sum kept where the backend computes its terms (on the device for CUDA) until it is read
// once: a training step's loss, added to by every chunk of every micro-batch, is read at the
// step's end instead of after each chunk.
class DeviceSum {
 public:
  virtual ~DeviceSum() = default;
  // Adds a term the host computed (the vocabulary-parallel loss's).
  virtual void AddHost(double value) = 0;
  // The sum of everything added since the last Take, then zero; waits for the device and
  // returns its first error instead (as Synchronize does).
  [[nodiscard]] virtual absl::StatusOr<double> Take() = 0;
  // Starts the read of what was added so far without waiting: a Take with nothing added since
  // waits only for that read, which is done once the device has run the work queued before
  // it. So the sums a step reads share one wait: start the read of those queued first, then
  // Take the last one queued, then the others.
  virtual void StartRead() {}
};

// Device time of a kind of work, summed over spans Start..Stop and read once: each end is the
// moment the device gets to it (the work queued before it has run), so timing a pass does not
// make the host wait for it.
class DeviceTimer {
 public:
  virtual ~DeviceTimer() = default;
  virtual void Start() = 0;
  virtual void Stop() = 0;
  // Seconds of the spans since the last Take, then zero; waits for the last Stop.
  [[nodiscard]] virtual absl::StatusOr<double> Take() = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;

  // Storage type of activations, and pointer arithmetic on them.
  virtual DType act_dtype() const = 0;
  int64_t act_bytes() const { return DTypeBytes(act_dtype()); }
  Act* At(Act* p, int64_t index) const {
    return reinterpret_cast<Act*>(reinterpret_cast<char*>(p) + index * act_bytes());
  }
  const Act* At(const Act* p, int64_t index) const {
    return reinterpret_cast<const Act*>(reinterpret_cast<const char*>(p) + index * act_bytes());
  }
  // Largest number of logits the chunked cross-entropy should hold at once.
  virtual int64_t max_logits_chunk() const { return int64_t{1} << 20; }
  // The LM head's width is rounded up to a multiple of this inside the chunked cross-entropy
  // (zero weight rows, masked out of the softmax): cuBLASLt runs GPT-2's 50257-wide head with
  // 1-element-aligned kernels at an eighth of the speed of a 50304-wide one.
  virtual int64_t logits_vocab_multiple() const { return 1; }
  // Between HoldWeight(w, count) and ReleaseWeight(), linear operations that name `w` (with
  // `count` elements) may reuse one converted copy of it instead of converting it on every use:
  // the caller promises that w does not change meanwhile. The chunked cross-entropy holds the LM
  // head over its chunks (the CUDA backend converts it to bf16 once instead of twice a chunk).
  // Backends that convert nothing ignore both.
  virtual void HoldWeight(const float* w, int64_t count) {}
  virtual void ReleaseWeight() {}
  // Kept weight copies, for weights that stay in one buffer (a rank without ZeRO-3's gathers):
  // the conversion a linear operation makes of a weight registered with KeepWeightCopy (`count`
  // elements), or of a part of one (an expert's slice), is kept and reused (the whole weight
  // converted at once) until a weight may have changed, which the backend takes to be the next
  // AdamW, CopyFromHost into the memory the registered weights span, or WeightsChanged() (the
  // call for writes it does not see: a communicator's). Returns whether it
  // keeps the copy, of act_bytes() · count bytes (false: a backend that converts nothing); a
  // CUDA backend with FP8 linear layers keeps 2 · count bytes more, the codes of a weight that
  // its FP8 products use.
  // DropWeightCopy forgets a registration and frees its copy.
  virtual bool KeepWeightCopy(const float* w, int64_t count) { return false; }
  virtual void WeightsChanged() {}
  virtual void DropWeightCopy(const float* w) {}
  // Waits for every queued operation; returns the first device error since the last call
  // (INTERNAL), or OK. The CPU backend runs synchronously and always returns OK.
  [[nodiscard]] virtual absl::Status Synchronize() { return absl::OkStatus(); }
  // A zero sum for SoftmaxCrossEntropy, and a timer. These defaults suit a backend that runs
  // each call before returning: a host double, and the host's monotonic clock.
  virtual std::unique_ptr<DeviceSum> NewDeviceSum();
  virtual std::unique_ptr<DeviceTimer> NewDeviceTimer();

  // Memory. Allocations are zero-filled.
  // Whether buffers live in host memory the caller may write directly (the CPU backend's), so
  // that a reader can put file contents straight into them instead of through CopyFromHost.
  virtual bool host_memory() const { return false; }
  virtual Buffer<float> AllocFloat(int64_t count) = 0;
  virtual Buffer<Act> AllocAct(int64_t count) = 0;
  virtual Buffer<int32_t> AllocInt(int64_t count) = 0;
  virtual void CopyFromHost(float* dst, const float* src, int64_t count) = 0;
  virtual void CopyFromHost(int32_t* dst, const int32_t* src, int64_t count) = 0;
  virtual void CopyToHost(int32_t* dst, const int32_t* src, int64_t count) = 0;
  virtual void CopyToHost(float* dst, const float* src, int64_t count) = 0;
  // Several copies to the host at once (a checkpoint snapshot): {host dst, src, count} each.
  struct HostCopy {
    float* dst;
    const float* src;
    int64_t count;
  };
  virtual void CopyToHostMulti(const std::vector<HostCopy>& copies) {
    for (const HostCopy& c : copies) CopyToHost(c.dst, c.src, c.count);
  }
  virtual void Copy(float* dst, const float* src, int64_t count) = 0;
  virtual void Fill(float* dst, float value, int64_t count) = 0;
  virtual void Add(float* out, const float* a, const float* b, int64_t count) = 0;
  // Activations to and from host fp32 (converting from / rounding to act_dtype()).
  virtual void CopyActToHost(float* dst, const Act* src, int64_t count) = 0;
  virtual void CopyActFromHost(Act* dst, const float* src, int64_t count) = 0;
  virtual void Copy(Act* dst, const Act* src, int64_t count) = 0;
  virtual void Fill(Act* dst, float value, int64_t count) = 0;
  virtual void Add(Act* out, const Act* a, const Act* b, int64_t count) = 0;
  // dst row r [0, cols) ← src row r [0, cols), rows `rows`, with the given row strides (elements).
  virtual void CopyRows(Act* dst, int64_t dst_stride, const Act* src, int64_t src_stride,
                        int64_t rows, int64_t cols) = 0;

  // out[m, n] = inp[m, k] · weight[n, k]ᵀ + bias[n]   (bias may be null)
  virtual void Linear(Act* out, const Act* inp, const float* weight, const float* bias, int64_t m,
                      int64_t n, int64_t k) = 0;
  // dinp overwritten, dweight and dbias accumulated; each skipped if null (a split backward runs
  // the input and the weight parts apart). weight is read only for dinp.
  virtual void LinearBackward(Act* dinp, float* dweight, float* dbias, const Act* dout,
                              const Act* inp, const float* weight, int64_t m, int64_t n,
                              int64_t k) = 0;
  // pre = inp · weightᵀ + bias, out = gelu(pre): one GEMM with a fused epilogue on CUDA.
  virtual void LinearGelu(Act* out, Act* pre, const Act* inp, const float* weight,
                          const float* bias, int64_t m, int64_t n, int64_t k) {
    Linear(pre, inp, weight, bias, m, n, k);
    Gelu(out, pre, m * n);
  }

  virtual void LayerNorm(Act* out, float* mean, float* rstd, const Act* inp, const float* weight,
                         const float* bias, int64_t rows, int64_t c, float eps) = 0;
  // sum = a + b, out = LayerNorm(sum): the residual add fused with the norm that follows it.
  virtual void AddLayerNorm(Act* sum, Act* out, float* mean, float* rstd, const Act* a,
                            const Act* b, const float* weight, const float* bias, int64_t rows,
                            int64_t c, float eps) {
    Add(sum, a, b, rows * c);
    LayerNorm(out, mean, rstd, sum, weight, bias, rows, c, eps);
  }
  // Accumulates into dinp, dweight, dbias.
  virtual void LayerNormBackward(Act* dinp, float* dweight, float* dbias, const Act* dout,
                                 const Act* inp, const float* weight, const float* mean,
                                 const float* rstd, int64_t rows, int64_t c) = 0;
  virtual void RmsNorm(Act* out, float* rstd, const Act* inp, const float* weight, int64_t rows,
                       int64_t c, float eps) = 0;
  virtual void AddRmsNorm(Act* sum, Act* out, float* rstd, const Act* a, const Act* b,
                          const float* weight, int64_t rows, int64_t c, float eps) {
    Add(sum, a, b, rows * c);
    RmsNorm(out, rstd, sum, weight, rows, c, eps);
  }
  // Accumulates into dinp, dweight.
  virtual void RmsNormBackward(Act* dinp, float* dweight, const Act* dout, const Act* inp,
                               const float* weight, const float* rstd, int64_t rows, int64_t c) = 0;
  // RMSNorm over rows whose n columns are split over ranks, c of them here (kernels/cpu/norms.h):
  // the caller sums `sums` (then `dots`) over the ranks between the two steps of each pass.
  virtual void RowSquareSums(float* sums, const Act* x, int64_t rows, int64_t c) = 0;
  // rstd holds the summed Σx² on entry and 1/sqrt(Σx²/n + eps) on exit.
  virtual void RmsNormFromSums(Act* out, float* rstd, const Act* inp, const float* weight,
                               int64_t rows, int64_t c, int64_t n, float eps) = 0;
  virtual void RmsNormDots(float* dots, const Act* dout, const Act* inp, const float* weight,
                           const float* rstd, int64_t rows, int64_t c) = 0;
  // Accumulates into dinp, dweight.
  virtual void RmsNormBackwardFromDots(Act* dinp, float* dweight, const Act* dout, const Act* inp,
                                       const float* weight, const float* rstd, const float* dots,
                                       int64_t rows, int64_t c, int64_t n) = 0;

  virtual void Gelu(Act* out, const Act* inp, int64_t n) = 0;
  virtual void GeluBackward(Act* dinp, const Act* dout, const Act* inp, int64_t n) = 0;
  // inp [rows, 2f] holds (gate, up) per row; out [rows, f] = g(gate) · up (kernels/glu.h).
  virtual void Glu(Act* out, const Act* inp, int64_t rows, int64_t f, kernels::GluGate gate) = 0;
  virtual void GluBackward(Act* dinp, const Act* dout, const Act* inp, int64_t rows, int64_t f,
                           kernels::GluGate gate) = 0;

  // In place on the query and key heads of a packed qkv activation; row i of each sequence has
  // position first_position + i; `freq` the model's (RopeOf).
  virtual void Rope(Act* qkv, const AttentionShape& s, const kernels::RopeFrequencies& freq,
                    int64_t first_position) = 0;
  virtual void RopeBackward(Act* dqkv, const AttentionShape& s,
                            const kernels::RopeFrequencies& freq, int64_t first_position) = 0;

  // Causal attention; out [b, t, heads·d], lse [b, heads, t]. dqkv is overwritten.
  virtual void Attention(Act* out, float* lse, const Act* qkv, const AttentionShape& s) = 0;
  virtual void AttentionBackward(Act* dqkv, const Act* dout, const Act* qkv, const Act* out,
                                 const float* lse, const AttentionShape& s) = 0;

  // Ring attention (context parallelism, worker/context_parallel.h): blocks of attention with
  // their log-sum-exps, merged.
  //
  // out [batch, q_len, heads·d] (overwritten, rows contiguous), lse [batch, heads, q_len]: the
  // block's own softmax-normalised output and log-sum-exp.
  virtual void AttentionBlock(Act* out, float* lse, const Act* q, const Act* k, const Act* v,
                              const AttentionBlockShape& s) = 0;
  // (out, lse) ← the attention over both key sets, from the two partial results:
  // lse' = log(e^lse + e^part_lse), out = out·e^(lse − lse') + part·e^(part_lse − lse').
  // out and part [batch, q_len, heads·d], lse and part_lse [batch, heads, q_len]. A row with
  // lse = −∞ (no keys yet) takes part's row.
  virtual void AttentionMerge(Act* out, float* lse, const Act* part, const float* part_lse,
                              int64_t batch, int64_t q_len, int64_t heads, int64_t head_dim) = 0;
  // The block's share of the backward, given the *merged* out and lse of the whole attention
  // (the FlashAttention recipe: P = exp(S − lse), dS = P ∘ (dP − rowsum(dout ∘ out))):
  // dq += (dq has q's row stride q_stride), dk += and dv += (row stride kv_stride). dout and
  // out are [batch, q_len, heads·d] rows contiguous.
  virtual void AttentionBlockBackward(Act* dq, Act* dk, Act* dv, const Act* dout, const Act* q,
                                      const Act* k, const Act* v, const Act* out, const float* lse,
                                      const AttentionBlockShape& s) = 0;

  // Mixture of experts (worker/moe_routing.h): the router's fp32 linear layer, tokens gathered
  // into their experts' rows and combined back.
  //
  // out[m, n] = inp[m, k] · weight[n, k]ᵀ in fp32 (overwritten).
  virtual void LinearF32(float* out, const Act* inp, const float* weight, int64_t m, int64_t n,
                         int64_t k) = 0;
  // Its backward with both gradients accumulated (dinp adds onto the other branches'): dinp +=
  // dout · weight, dweight += doutᵀ · inp; either skipped when null.
  virtual void LinearF32Backward(Act* dinp, float* dweight, const float* dout, const Act* inp,
                                 const float* weight, int64_t m, int64_t n, int64_t k) = 0;
  // out row r = scale[r] · inp row rows[r] (rows null: row r; scale null: 1), `count` rows of
  // `cols`.
  virtual void GatherRows(Act* out, const Act* inp, const int32_t* rows, const float* scale,
                          int64_t count, int64_t cols) = 0;
  // out row t (overwritten, or accumulated) = Σ_j weights[t·k + j] · inp row slots[t·k + j] over
  // j < k in order, skipping slots −1 (weights null: 1).
  virtual void CombineRows(Act* out, const Act* inp, const int32_t* slots, const float* weights,
                           int64_t rows, int64_t k, int64_t cols, bool accumulate) = 0;
  // The experts' MLPs: hidden = in · fc_wᵀ + fc_b, act = gelu(hidden) (or swiglu), out = act ·
  // proj_wᵀ + proj_b, expert by expert. The default runs one Linear (or LinearGelu) pair per
  // expert; a backend may run the experts as one grouped GEMM.
  virtual void ExpertsForward(const ExpertMlp& mlp, const Act* in, Act* hidden, Act* act, Act* out);
  // Its backward: weight gradients accumulated, din overwritten; dact and dhidden are scratch of
  // act's and hidden's size.
  virtual void ExpertsBackward(const ExpertMlp& mlp, const ExpertMlpGrads& grads, const Act* dout,
                               const Act* in, const Act* hidden, const Act* act, Act* dact,
                               Act* dhidden, Act* din);
  // out[r] = ⟨a row a_rows[r], b row r⟩ for r < count.
  virtual void RowDots(float* out, const Act* a, const int32_t* a_rows, const Act* b, int64_t count,
                       int64_t cols) = 0;
  // The shared experts' gate (config::MoeConfig::shared_gate; kernels/cpu/moe.h): gate[r] =
  // sigmoid(logits[r]) and x row r ×= gate[r] (gate may be logits); and its backward, dlogits[r]
  // = (1 − gate[r]) · ⟨act row r, dact row r⟩ from the gated MLP's hidden activation and its
  // gradient.
  virtual void SigmoidGateRows(float* gate, const float* logits, Act* x, int64_t rows,
                               int64_t cols) = 0;
  virtual void SigmoidGateBackward(float* dlogits, const float* gate, const Act* act,
                                   const Act* dact, int64_t rows, int64_t cols) = 0;

  // x ← C·tanh(x / C) over [rows, cols], rows ld apart: the final logits' soft cap C > 0
  // (model.logit_softcap).
  virtual void SoftCap(Act* x, int64_t rows, int64_t cols, int64_t ld, float cap) = 0;

  // Σ cross-entropy over rows, added to *loss (a sum this backend made, NewDeviceSum); with
  // write_grad, logits become grad_scale·(softmax − onehot). Rows are `ld` apart (ld ≥ vocab): a
  // padded row's columns [vocab, ld) are left alone. softcap C > 0: the logits were capped
  // (SoftCap), and the gradient is taken through the cap (times 1 − (z / C)²); 0 for none.
  // z_loss > 0: the gradient is that of the cross-entropy plus z_loss · lse² (PaLM's z-loss, lse
  // the row's log-sum-exp), *loss still the cross-entropy's. lse, when not null, receives each
  // row's log-sum-exp (rows floats).
  virtual void SoftmaxCrossEntropy(Act* logits, const int32_t* targets, int64_t rows, int64_t vocab,
                                   int64_t ld, float grad_scale, bool write_grad, float softcap,
                                   float z_loss, float* lse, DeviceSum* loss) = 0;

  // Vocabulary-parallel cross-entropy pieces (see kernels/cpu/cross_entropy.h).
  virtual void CrossEntropyShardStats(const Act* logits, const int32_t* local_targets, int64_t rows,
                                      int64_t vocab, float* stats) = 0;
  virtual void CrossEntropyShardGrad(Act* logits, const int32_t* local_targets, const float* lse,
                                     int64_t rows, int64_t vocab, float grad_scale, float softcap,
                                     float z_loss) = 0;
  // The tensor-parallel group's gathered statistics (`ranks` blocks of `stride` rows) merged into
  // each row's log-sum-exp (lse[0, rows)), the rows' losses added to *loss (NewDeviceSum's).
  virtual void CrossEntropyMergeShardStats(const float* gathered, int ranks, int64_t stride,
                                           int64_t rows, float* lse, DeviceSum* loss) = 0;
  // out[m, n] += bias[n]
  virtual void AddBias(Act* out, const float* bias, int64_t m, int64_t n) = 0;

  // out = scale · wte[token] + wpe[position] (wpe may be null; scale 1, or Gemma's √width).
  virtual void Embedding(Act* out, const int32_t* tokens, const float* wte, const float* wpe,
                         int64_t b, int64_t t, int64_t c, float scale) = 0;
  // Accumulates into dwte [vocab, c] and dwpe (dwpe may be null); deterministic.
  virtual void EmbeddingBackward(float* dwte, float* dwpe, const Act* dout, const int32_t* tokens,
                                 int64_t b, int64_t t, int64_t c, int64_t vocab, float scale) = 0;

  virtual void AdamW(float* param, const float* grad, float* m, float* v, int64_t n,
                     const AdamWParams& p) = 0;
  // Every tensor of the list in one pass where the backend can (one launch on CUDA).
  struct AdamWTensor {
    float* param;
    const float* grad;
    float* m;
    float* v;
    int64_t n;
    float weight_decay;
  };
  virtual void AdamWMulti(const std::vector<AdamWTensor>& tensors, AdamWParams p) {
    for (const AdamWTensor& t : tensors) {
      p.weight_decay = t.weight_decay;
      AdamW(t.param, t.grad, t.m, t.v, t.n, p);
    }
  }
  virtual double SumOfSquares(const float* x, int64_t n) = 0;
  // Adds Σ x² over the ranges to `sum` (one this backend made, NewDeviceSum): each range's
  // squares summed in a fixed order, the ranges' sums added in list order, and nothing waited
  // for (on CUDA, two launches for a model's gradients and the sums kept on the device).
  virtual void AddSumOfSquares(const std::vector<std::pair<const float*, int64_t>>& ranges,
                               DeviceSum* sum) {
    double total = 0.0;
    for (const auto& [x, n] : ranges) total += SumOfSquares(x, n);
    sum->AddHost(total);
  }
  virtual void Scale(float* x, int64_t n, float factor) = 0;
  // out = factor · in over n activations (out may alias in): model.residual_multiplier on a
  // block's branch and its gradient, 1 / model.logits_scaling on the final norm's output.
  virtual void ScaleAct(Act* out, const Act* in, int64_t n, float factor) = 0;
};

// The fp32 CPU reference backend. `threads` <= 0 uses every core.
// `logits_vocab_multiple` > 1 pads the LM head as the CUDA backend does (tests of the padding).
std::unique_ptr<Backend> MakeCpuBackend(int threads, int64_t logits_vocab_multiple = 1);

}  // namespace trainyard::worker

#endif  // TRAINYARD_WORKER_BACKEND_H_
