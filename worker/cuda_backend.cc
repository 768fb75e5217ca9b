// The CUDA backend: forwards each Backend operation to a kernel launcher in kernels/cuda (or to
// cuBLASLt through kernels::cuda::Gemm). Launchers return a Status; the first failure is kept
// and reported by Synchronize(), so the void-returning Backend calls never lose an error.
#include "worker/cuda_backend.h"

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <deque>
#include <initializer_list>
#include <iterator>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/device_probe.h"
#include "common/logging.h"
#include "common/status.h"
#include "kernels/cuda/activations.h"
#include "kernels/cuda/adamw.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/attention_block.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/cross_entropy.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/fp8.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/moe.h"
#include "kernels/cuda/norms.h"
#include "kernels/cuda/rope.h"

namespace trainyard::worker {
namespace {

namespace kc = ::trainyard::kernels::cuda;
using ::trainyard::kernels::Fp8Format;

// Scratch buffers, one per use that can be live at the same time within one operation.
enum class Scratch { kWeight, kBias, kReduce, kAttention, kEmbedding, kGroups, kFp8, kCount };

class CudaBackend final : public Backend {
 public:
  static absl::StatusOr<std::unique_ptr<Backend>> Create(const CudaBackendOptions& options) {
    const DeviceInfo devices = SystemDeviceProbe().Probe();
    if (devices.count == 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("no usable CUDA device: ", devices.why_none));
    }
    if (options.device < 0 || options.device >= devices.count) {
      return absl::FailedPreconditionError(
          absl::StrCat("CUDA device ", options.device, " requested, ", devices.count, " present"));
    }
    std::unique_ptr<CudaBackend> be(new CudaBackend(options));
    TY_CUDA_RETURN_IF_ERROR(cudaSetDevice(options.device));
    cudaDeviceProp prop{};
    TY_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, options.device));
    be->device_name_ = prop.name;
    if (options.fp8_linear && options.act_dtype != DType::kBF16) {
      return absl::InvalidArgumentError("FP8 linear layers need bf16 activations");
    }
    if (options.fp8_linear && prop.major * 10 + prop.minor < 89) {
      return absl::FailedPreconditionError(
          absl::StrCat("FP8 linear layers need compute capability 8.9 or later; ", prop.name,
                       " has ", prop.major, ".", prop.minor));
    }
    // A blocking stream, so that stray work on the legacy default stream is ordered with it too.
    TY_CUDA_RETURN_IF_ERROR(cudaStreamCreate(&be->stream_));
    // Keep freed memory in the pool rather than returning it to the driver at each sync.
    cudaMemPool_t pool = nullptr;
    TY_CUDA_RETURN_IF_ERROR(cudaDeviceGetDefaultMemPool(&pool, options.device));
    uint64_t keep = UINT64_MAX;
    TY_CUDA_RETURN_IF_ERROR(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
    TY_ASSIGN_OR_RETURN(be->gemm_, kc::Gemm::Create());
    be->upload_ = std::make_unique<UploadRing>(be.get());
    return std::unique_ptr<Backend>(std::move(be));
  }

  ~CudaBackend() override {
    kept_.clear();  // their buffers are freed on the stream, before it goes
    for (auto& s : scratch_) {
      if (s.ptr != nullptr) cudaFreeAsync(s.ptr, stream_);
    }
    if (stream_ != nullptr) cudaStreamSynchronize(stream_);
    gemm_.reset();
    upload_.reset();
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  std::string name() const override {
    return absl::StrCat("cuda:", options_.device, " (", device_name_, ", ",
                        DTypeName(options_.act_dtype), " activations",
                        options_.fp8_linear ? ", FP8 linear layers" : "", ")");
  }
  DType act_dtype() const override { return options_.act_dtype; }
  // 2^27 bf16 logits (256 MiB): a GPT-2 vocabulary in chunks of 2,670 rows, so the LM head
  // (and its bf16 conversion) runs a few times per micro-batch rather than hundreds.
  int64_t max_logits_chunk() const override { return int64_t{1} << 27; }
  int64_t logits_vocab_multiple() const override { return 128; }
  void HoldWeight(const float* w, int64_t count) override { held_ = {w, count, false}; }
  void ReleaseWeight() override { held_ = {}; }
  bool KeepWeightCopy(const float* w, int64_t count) override {
    if (act_dtype() == DType::kF32) return false;
    auto [it, added] = kept_.try_emplace(w);
    if (!added && it->second.count == count) return true;
    // KeptCopy finds a part of a weight by the registration starting at or before it, so the
    // registered weights must not overlap.
    TY_CHECK((it == kept_.begin() || std::prev(it)->first + std::prev(it)->second.count <= w) &&
             (std::next(it) == kept_.end() || w + count <= std::next(it)->first))
        << "a kept weight overlaps another";
    it->second = KeptWeight{.count = count};
    const auto lo = reinterpret_cast<uintptr_t>(w), hi = lo + count * sizeof(float);
    kept_lo_ = kept_.size() == 1 ? lo : std::min(kept_lo_, lo);
    kept_hi_ = kept_.size() == 1 ? hi : std::max(kept_hi_, hi);
    return true;
  }
  void WeightsChanged() override { ++weights_epoch_; }
  void DropWeightCopy(const float* w) override {
    kept_.erase(w);
    if (kept_.empty()) kept_lo_ = kept_hi_ = 0;  // else the span stays as wide: more bumps, no harm
  }
  cudaStream_t stream() const { return stream_; }

  absl::Status Synchronize() override {
    Record(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    Record(cudaGetLastError(), "cudaGetLastError");
    return status_;
  }
  std::unique_ptr<DeviceSum> NewDeviceSum() override { return std::make_unique<RowSums>(this); }
  std::unique_ptr<DeviceTimer> NewDeviceTimer() override {
    return std::make_unique<EventTimer>(this);
  }

  // Memory.
  Buffer<float> AllocFloat(int64_t count) override {
    return Buffer<float>(static_cast<float*>(Alloc(count * 4)), count, Free());
  }
  Buffer<Act> AllocAct(int64_t count) override {
    return Buffer<Act>(static_cast<Act*>(Alloc(count * act_bytes())), count, Free());
  }
  Buffer<int32_t> AllocInt(int64_t count) override {
    return Buffer<int32_t>(static_cast<int32_t*>(Alloc(count * 4)), count, Free());
  }
  void CopyFromHost(float* dst, const float* src, int64_t n) override {
    const auto lo = reinterpret_cast<uintptr_t>(dst);
    if (lo < kept_hi_ && lo + n * sizeof(float) > kept_lo_) ++weights_epoch_;  // may be a weight
    ToDevice(dst, src, n * 4);
  }
  void CopyFromHost(int32_t* dst, const int32_t* src, int64_t n) override {
    ToDevice(dst, src, n * 4);
  }
  void CopyToHost(float* dst, const float* src, int64_t n) override { ToHost(dst, src, n * 4); }
  void CopyToHost(int32_t* dst, const int32_t* src, int64_t n) override { ToHost(dst, src, n * 4); }
  void Copy(float* dst, const float* src, int64_t n) override { DeviceCopy(dst, src, n * 4); }
  void Fill(float* dst, float value, int64_t n) override {
    Run(kc::Fill(stream_, DType::kF32, dst, value, n));
  }
  void Add(float* out, const float* a, const float* b, int64_t n) override {
    Run(kc::Add(stream_, DType::kF32, out, a, b, n));
  }
  void CopyActToHost(float* dst, const Act* src, int64_t n) override {
    if (act_dtype() == DType::kF32) return ToHost(dst, src, n * 4);
    std::vector<__nv_bfloat16> tmp(n);
    ToHost(tmp.data(), src, n * 2);
    for (int64_t i = 0; i < n; ++i) dst[i] = __bfloat162float(tmp[i]);
  }
  void CopyActFromHost(Act* dst, const float* src, int64_t n) override {
    if (act_dtype() == DType::kF32) return ToDevice(dst, src, n * 4);
    std::vector<__nv_bfloat16> tmp(n);
    for (int64_t i = 0; i < n; ++i) tmp[i] = __float2bfloat16_rn(src[i]);
    ToDevice(dst, tmp.data(), n * 2);
    Record(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");  // tmp dies here
  }
  void Copy(Act* dst, const Act* src, int64_t n) override { DeviceCopy(dst, src, n * act_bytes()); }
  void CopyRows(Act* dst, int64_t dst_stride, const Act* src, int64_t src_stride, int64_t rows,
                int64_t cols) override {
    if (rows <= 0 || cols <= 0) return;
    const int64_t e = act_bytes();
    Record(cudaMemcpy2DAsync(dst, dst_stride * e, src, src_stride * e, cols * e, rows,
                             cudaMemcpyDefault, stream_),
           "cudaMemcpy2DAsync");
  }
  void Fill(Act* dst, float value, int64_t n) override {
    Run(kc::Fill(stream_, act_dtype(), dst, value, n));
  }
  void Add(Act* out, const Act* a, const Act* b, int64_t n) override {
    Run(kc::Add(stream_, act_dtype(), out, a, b, n));
  }

  // Linear layers.
  void Linear(Act* out, const Act* inp, const float* w, const float* b, int64_t m, int64_t n,
              int64_t k) override {
    if (Fp8Linear(w, m, n, k)) return Fp8Forward(out, inp, w, b, m, n, k);
    Run(gemm_->Forward(stream_, act_dtype(), out, nullptr, inp, Weight(w, n * k),
                       b ? Bias(b, n) : nullptr, m, n, k,
                       b ? kc::GemmEpilogue::kBias : kc::GemmEpilogue::kNone));
  }
  void LinearGelu(Act* out, Act* pre, const Act* inp, const float* w, const float* b, int64_t m,
                  int64_t n, int64_t k) override {
    const bool fused = options_.fused_gelu_epilogue && act_dtype() == DType::kBF16 &&
                       !Fp8Linear(w, m, n, k) && gemm_->SupportsGeluEpilogue(act_dtype(), m, n, k);
    if (!fused) return Backend::LinearGelu(out, pre, inp, w, b, m, n, k);
    Run(gemm_->Forward(stream_, act_dtype(), out, pre, inp, Weight(w, n * k),
                       b ? Bias(b, n) : nullptr, m, n, k,
                       b ? kc::GemmEpilogue::kGeluAuxBias : kc::GemmEpilogue::kGeluAux));
  }
  void LinearBackward(Act* dinp, float* dw, float* db, const Act* dout, const Act* inp,
                      const float* w, int64_t m, int64_t n, int64_t k) override {
    if (Fp8Linear(w, m, n, k)) {
      Fp8Backward(dinp, dw, dout, inp, w, m, n, k);
    } else {
      if (dinp != nullptr) {
        Run(gemm_->BackwardInput(stream_, act_dtype(), dinp, dout, Weight(w, n * k), m, n, k));
      }
      if (dw != nullptr) Run(gemm_->BackwardWeight(stream_, act_dtype(), dw, dout, inp, m, n, k));
    }
    if (db != nullptr) {
      float* scratch = ScratchFloats(Scratch::kReduce, kc::ColumnSumScratchFloats(m, n));
      Run(kc::AccumulateColumnSums(stream_, act_dtype(), db, dout, m, n, scratch));
    }
  }

  // Mixture of experts: the router's fp32 linear layer and the token movement, deterministic
  // kernels of their own (the router's few experts make too narrow a GEMM to be worth cuBLASLt).
  void LinearF32(float* out, const Act* inp, const float* w, int64_t m, int64_t n,
                 int64_t k) override {
    Run(kc::RouterLinearForward(stream_, act_dtype(), out, inp, w, m, n, k));
  }
  void LinearF32Backward(Act* dinp, float* dw, const float* dout, const Act* inp, const float* w,
                         int64_t m, int64_t n, int64_t k) override {
    Run(kc::RouterLinearBackward(stream_, act_dtype(), dinp, dw, dout, inp, w, m, n, k));
  }
  void GatherRows(Act* out, const Act* inp, const int32_t* rows, const float* scale, int64_t count,
                  int64_t cols) override {
    Run(kc::GatherRows(stream_, act_dtype(), out, inp, rows, scale, count, cols));
  }
  void CombineRows(Act* out, const Act* inp, const int32_t* slots, const float* weights,
                   int64_t rows, int64_t k, int64_t cols, bool accumulate) override {
    Run(kc::CombineRows(stream_, act_dtype(), out, inp, slots, weights, rows, k, cols, accumulate));
  }
  void RowDots(float* out, const Act* a, const int32_t* a_rows, const Act* b, int64_t count,
               int64_t cols) override {
    Run(kc::RowDots(stream_, act_dtype(), out, a, a_rows, b, count, cols));
  }
  void SigmoidGateRows(float* gate, const float* logits, Act* x, int64_t rows,
                       int64_t cols) override {
    Run(kc::SigmoidGateRows(stream_, act_dtype(), gate, logits, x, rows, cols));
  }
  void SigmoidGateBackward(float* dlogits, const float* gate, const Act* act, const Act* dact,
                           int64_t rows, int64_t cols) override {
    Run(kc::SigmoidGateBackward(stream_, act_dtype(), dlogits, gate, act, dact, rows, cols));
  }

  // The experts' MLPs with each GEMM as one grouped call over the experts (kc::Gemm::Grouped),
  // and the biases and the activation each as one launch over all the experts' rows. Where a
  // bf16 expert weight has no kept copy (ZeRO-3's gathers), the experts run one at a time as
  // the default does: converting a whole layer's experts at once would take scratch the planner
  // does not count.
  void ExpertsForward(const ExpertMlp& mlp, const Act* in, Act* hidden, Act* act,
                      Act* out) override {
    ExpertWeights w;
    if (!GroupedExperts(mlp, &w)) {
      const ExpertsInBf16 bf16(this);
      return Backend::ExpertsForward(mlp, in, hidden, act, out);
    }
    const int64_t width = mlp.width, ffn = mlp.ffn, fc = mlp.fc_out();
    const int64_t rows = mlp.offsets.back();
    const int groups = static_cast<int>(mlp.experts());
    GroupArrays up(kc::GemmKind::kForward), down(kc::GemmKind::kForward);
    for (size_t i = 0; i < w.experts.size(); ++i) {
      const int64_t r0 = mlp.offsets[w.experts[i]], m = mlp.offsets[w.experts[i] + 1] - r0;
      up.Add(m, At(hidden, r0 * fc), At(in, r0 * width), w.fc[i]);
      down.Add(m, At(out, r0 * width), At(act, r0 * ffn), w.proj[i]);
    }
    const uint64_t* device = UploadGroups(mlp.offsets, {&up, &down});
    if (device == nullptr) return;  // the error is recorded
    const auto* offsets = reinterpret_cast<const int64_t*>(device);
    RunGrouped(up, device, fc, width);
    if (mlp.fc_b != nullptr) {
      Run(kc::AddGroupedBias(stream_, act_dtype(), hidden, mlp.fc_b, offsets, groups, rows, fc));
    }
    mlp.gated ? Glu(act, hidden, rows, ffn, mlp.gate) : Gelu(act, hidden, rows * ffn);
    RunGrouped(down, device, width, ffn);
    if (mlp.proj_b != nullptr) {
      Run(kc::AddGroupedBias(stream_, act_dtype(), out, mlp.proj_b, offsets, groups, rows, width));
    }
  }
  void ExpertsBackward(const ExpertMlp& mlp, const ExpertMlpGrads& grads, const Act* dout,
                       const Act* in, const Act* hidden, const Act* act, Act* dact, Act* dhidden,
                       Act* din) override {
    ExpertWeights w;
    if (!GroupedExperts(mlp, &w)) {
      const ExpertsInBf16 bf16(this);
      return Backend::ExpertsBackward(mlp, grads, dout, in, hidden, act, dact, dhidden, din);
    }
    const int64_t width = mlp.width, ffn = mlp.ffn, fc = mlp.fc_out();
    const int64_t rows = mlp.offsets.back();
    GroupArrays proj_in(kc::GemmKind::kBackwardInput), fc_in(kc::GemmKind::kBackwardInput);
    GroupArrays proj_w(kc::GemmKind::kBackwardWeight), fc_w(kc::GemmKind::kBackwardWeight);
    for (size_t i = 0; i < w.experts.size(); ++i) {
      const int64_t j = w.experts[i], r0 = mlp.offsets[j], m = mlp.offsets[j + 1] - r0;
      proj_in.Add(m, At(dact, r0 * ffn), At(dout, r0 * width), w.proj[i]);
      fc_in.Add(m, At(din, r0 * width), At(dhidden, r0 * fc), w.fc[i]);
      if (grads.proj_w != nullptr) {
        proj_w.Add(m, grads.proj_w + j * width * ffn, At(dout, r0 * width), At(act, r0 * ffn));
      }
      if (grads.fc_w != nullptr) {
        fc_w.Add(m, grads.fc_w + j * fc * width, At(dhidden, r0 * fc), At(in, r0 * width));
      }
    }
    // The bias gradients' chunks (each expert's column sums as it would have them alone).
    const int groups = static_cast<int>(mlp.experts());
    const std::vector<int64_t> chunks = grads.fc_b != nullptr || grads.proj_b != nullptr
                                            ? kc::GroupedColumnSumTable(mlp.offsets.data(), groups)
                                            : std::vector<int64_t>();
    size_t chunks_at = 0;
    const uint64_t* device =
        UploadGroups(mlp.offsets, {&proj_in, &proj_w, &fc_in, &fc_w}, chunks, &chunks_at);
    if (device == nullptr) return;  // the error is recorded
    auto bias_grads = [&](float* db, const Act* dy, int64_t n) {
      if (db == nullptr) return;
      float* scratch = ScratchFloats(
          Scratch::kReduce, kc::GroupedColumnSumScratchFloats(mlp.offsets.data(), groups, n));
      Run(kc::AccumulateGroupedColumnSums(stream_, act_dtype(), db, dy, mlp.offsets.data(), groups,
                                          n, reinterpret_cast<const int64_t*>(device + chunks_at),
                                          scratch));
    };
    RunGrouped(proj_in, device, width, ffn);
    RunGrouped(proj_w, device, width, ffn);
    bias_grads(grads.proj_b, dout, width);
    if (mlp.gated) {
      GluBackward(dhidden, dact, hidden, rows, ffn, mlp.gate);
    } else {
      GeluBackward(dhidden, dact, hidden, rows * ffn);
    }
    RunGrouped(fc_in, device, fc, width);
    RunGrouped(fc_w, device, fc, width);
    bias_grads(grads.fc_b, dhidden, fc);
  }

  // Norms.
  void LayerNorm(Act* out, float* mean, float* rstd, const Act* inp, const float* w, const float* b,
                 int64_t rows, int64_t c, float eps) override {
    Run(kc::LayerNormForward(stream_, act_dtype(), out, mean, rstd, inp, w, b, rows, c, eps));
  }
  void AddLayerNorm(Act* sum, Act* out, float* mean, float* rstd, const Act* a, const Act* b,
                    const float* w, const float* bias, int64_t rows, int64_t c,
                    float eps) override {
    Run(kc::AddLayerNormForward(stream_, act_dtype(), sum, out, mean, rstd, a, b, w, bias, rows, c,
                                eps));
  }
  void LayerNormBackward(Act* dinp, float* dw, float* db, const Act* dout, const Act* inp,
                         const float* w, const float* mean, const float* rstd, int64_t rows,
                         int64_t c) override {
    float* scratch = ScratchFloats(Scratch::kReduce, kc::NormBackwardScratchFloats(rows, c));
    Run(kc::LayerNormBackward(stream_, act_dtype(), dinp, dw, db, dout, inp, w, mean, rstd, rows, c,
                              scratch));
  }
  void RmsNorm(Act* out, float* rstd, const Act* inp, const float* w, int64_t rows, int64_t c,
               float eps) override {
    Run(kc::RmsNormForward(stream_, act_dtype(), out, rstd, inp, w, rows, c, eps));
  }
  void AddRmsNorm(Act* sum, Act* out, float* rstd, const Act* a, const Act* b, const float* w,
                  int64_t rows, int64_t c, float eps) override {
    Run(kc::AddRmsNormForward(stream_, act_dtype(), sum, out, rstd, a, b, w, rows, c, eps));
  }
  void RmsNormBackward(Act* dinp, float* dw, const Act* dout, const Act* inp, const float* w,
                       const float* rstd, int64_t rows, int64_t c) override {
    float* scratch = ScratchFloats(Scratch::kReduce, kc::NormBackwardScratchFloats(rows, c));
    Run(kc::RmsNormBackward(stream_, act_dtype(), dinp, dw, dout, inp, w, rstd, rows, c, scratch));
  }
  void RowSquareSums(float* sums, const Act* x, int64_t rows, int64_t c) override {
    Run(kc::RowSquareSums(stream_, act_dtype(), sums, x, rows, c));
  }
  void RmsNormFromSums(Act* out, float* rstd, const Act* inp, const float* w, int64_t rows,
                       int64_t c, int64_t n, float eps) override {
    Run(kc::RmsNormFromSums(stream_, act_dtype(), out, rstd, inp, w, rows, c, n, eps));
  }
  void RmsNormDots(float* dots, const Act* dout, const Act* inp, const float* w, const float* rstd,
                   int64_t rows, int64_t c) override {
    Run(kc::RmsNormDots(stream_, act_dtype(), dots, dout, inp, w, rstd, rows, c));
  }
  void RmsNormBackwardFromDots(Act* dinp, float* dw, const Act* dout, const Act* inp,
                               const float* w, const float* rstd, const float* dots, int64_t rows,
                               int64_t c, int64_t n) override {
    float* scratch = ScratchFloats(Scratch::kReduce, kc::NormBackwardScratchFloats(rows, c));
    Run(kc::RmsNormBackwardFromDots(stream_, act_dtype(), dinp, dw, dout, inp, w, rstd, dots, rows,
                                    c, n, scratch));
  }

  // Activations.
  void Gelu(Act* out, const Act* inp, int64_t n) override {
    Run(kc::GeluForward(stream_, act_dtype(), out, inp, n));
  }
  void GeluBackward(Act* dinp, const Act* dout, const Act* inp, int64_t n) override {
    Run(kc::GeluBackward(stream_, act_dtype(), dinp, dout, inp, n));
  }
  void Glu(Act* out, const Act* inp, int64_t rows, int64_t f, kernels::GluGate gate) override {
    Run(kc::GluForward(stream_, act_dtype(), out, inp, rows, f, gate));
  }
  void GluBackward(Act* dinp, const Act* dout, const Act* inp, int64_t rows, int64_t f,
                   kernels::GluGate gate) override {
    Run(kc::GluBackward(stream_, act_dtype(), dinp, dout, inp, rows, f, gate));
  }

  // Attention.
  void Rope(Act* qkv, const AttentionShape& s, const kernels::RopeFrequencies& freq,
            int64_t first_position) override {
    if (!EqualHeads(s.value_dim, s.head_dim)) return;
    Run(kc::RopeForward(stream_, act_dtype(), qkv, s.batch, s.seq, s.heads, s.kv_heads, s.head_dim,
                        freq, first_position));
  }
  void RopeBackward(Act* dqkv, const AttentionShape& s, const kernels::RopeFrequencies& freq,
                    int64_t first_position) override {
    if (!EqualHeads(s.value_dim, s.head_dim)) return;
    Run(kc::RopeBackward(stream_, act_dtype(), dqkv, s.batch, s.seq, s.heads, s.kv_heads,
                         s.head_dim, freq, first_position));
  }
  void Attention(Act* out, float* lse, const Act* qkv, const AttentionShape& s) override {
    if (!EqualHeads(s.value_dim, s.head_dim)) return;
    Run(kc::FlashAttentionForward(stream_, act_dtype(), out, lse, qkv, Dims(s)));
  }
  void AttentionBackward(Act* dqkv, const Act* dout, const Act* qkv, const Act* out,
                         const float* lse, const AttentionShape& s) override {
    if (!EqualHeads(s.value_dim, s.head_dim)) return;
    const kc::AttentionDqSum dq_sum = options_.atomic_attention_dq
                                          ? kc::AttentionDqSum::kAtomic
                                          : kc::AttentionDqSum::kDeterministic;
    const size_t bytes = kc::FlashAttentionBackwardScratchBytes(Dims(s), act_dtype(), dq_sum);
    void* scratch = ScratchBytes(Scratch::kAttention, bytes);
    Run(kc::FlashAttentionBackward(stream_, act_dtype(), dqkv, dout, qkv, out, lse, Dims(s),
                                   scratch, bytes, dq_sum));
  }
  void AttentionBlock(Act* out, float* lse, const Act* q, const Act* key, const Act* value,
                      const AttentionBlockShape& s) override {
    if (!EqualHeads(s.value_dim, s.head_dim)) return;
    Run(kc::AttentionBlockForward(stream_, act_dtype(), out, lse, q, key, value, BlockDims(s)));
  }
  void AttentionMerge(Act* out, float* lse, const Act* part, const float* part_lse, int64_t batch,
                      int64_t q_len, int64_t heads, int64_t head_dim) override {
    Run(kc::AttentionMerge(stream_, act_dtype(), out, lse, part, part_lse, batch, q_len, heads,
                           head_dim));
  }
  void AttentionBlockBackward(Act* dq, Act* dk, Act* dv, const Act* dout, const Act* q,
                              const Act* key, const Act* value, const Act* out, const float* lse,
                              const AttentionBlockShape& s) override {
    if (!EqualHeads(s.value_dim, s.head_dim)) return;
    const kc::AttentionBlockDims dims = BlockDims(s);
    const size_t bytes = kc::AttentionBlockBackwardScratchBytes(dims);
    void* scratch = ScratchBytes(Scratch::kAttention, bytes);
    Run(kc::AttentionBlockBackward(stream_, act_dtype(), dq, dk, dv, dout, q, key, value, out, lse,
                                   dims, scratch, bytes));
  }

  // Cross-entropy, over logits soft-capped (model.logit_softcap) or not.
  void SoftCap(Act* x, int64_t rows, int64_t cols, int64_t ld, float cap) override {
    Run(kc::SoftCap(stream_, act_dtype(), x, rows, cols, ld, cap));
  }
  void SoftmaxCrossEntropy(Act* logits, const int32_t* targets, int64_t rows, int64_t vocab,
                           int64_t ld, float grad_scale, bool write_grad, float softcap,
                           float z_loss, float* lse, DeviceSum* loss) override {
    auto* sum = dynamic_cast<RowSums*>(loss);
    TY_CHECK(sum != nullptr) << "a loss sum from another backend";
    float* losses = sum->Reserve(rows);
    Run(kc::SoftmaxCrossEntropy(stream_, act_dtype(), logits, targets, rows, vocab, ld, grad_scale,
                                write_grad, losses, softcap, z_loss, lse));
  }
  void CrossEntropyShardStats(const Act* logits, const int32_t* local_targets, int64_t rows,
                              int64_t vocab, float* stats) override {
    Run(kc::CrossEntropyShardStats(stream_, act_dtype(), logits, local_targets, rows, vocab,
                                   stats));
  }
  void CrossEntropyShardGrad(Act* logits, const int32_t* local_targets, const float* lse,
                             int64_t rows, int64_t vocab, float grad_scale, float softcap,
                             float z_loss) override {
    Run(kc::CrossEntropyShardGrad(stream_, act_dtype(), logits, local_targets, lse, rows, vocab,
                                  grad_scale, softcap, z_loss));
  }
  void CrossEntropyMergeShardStats(const float* gathered, int ranks, int64_t stride, int64_t rows,
                                   float* lse, DeviceSum* loss) override {
    auto* sums = dynamic_cast<RowSums*>(loss);
    TY_CHECK(sums != nullptr) << "a device sum from another backend";
    Run(kc::CrossEntropyMergeShardStats(stream_, gathered, ranks, stride, rows, lse,
                                        sums->Reserve(rows)));
  }
  void AddBias(Act* out, const float* bias, int64_t m, int64_t n) override {
    Run(kc::AddBias(stream_, act_dtype(), out, bias, m, n));
  }

  // Embedding.
  void Embedding(Act* out, const int32_t* tokens, const float* wte, const float* wpe, int64_t b,
                 int64_t t, int64_t c, float scale) override {
    Run(kc::EmbeddingForward(stream_, act_dtype(), out, tokens, wte, wpe, b, t, c, scale));
  }
  void EmbeddingBackward(float* dwte, float* dwpe, const Act* dout, const int32_t* tokens,
                         int64_t b, int64_t t, int64_t c, int64_t vocab, float scale) override {
    const size_t bytes = kc::EmbeddingBackwardScratchBytes(b * t, vocab);
    void* scratch = ScratchBytes(Scratch::kEmbedding, bytes);
    Run(kc::EmbeddingBackward(stream_, act_dtype(), dwte, dwpe, dout, tokens, b, t, c, vocab, scale,
                              scratch, bytes));
  }

  // Optimizer.
  void AdamW(float* param, const float* grad, float* m, float* v, int64_t n,
             const AdamWParams& p) override {
    AdamWMulti({{param, grad, m, v, n, p.weight_decay}}, p);
  }
  // Every kept weight copy goes stale, but those of the tensors updated whole here: the update
  // writes them too.
  void AdamWMulti(const std::vector<AdamWTensor>& tensors, AdamWParams p) override {
    const uint64_t updated = ++weights_epoch_;
    std::vector<kc::AdamWTensor> list;
    std::vector<KeptWeight*> rewritten;
    list.reserve(tensors.size());
    for (const AdamWTensor& t : tensors) {
      if (t.n <= 0) continue;
      kc::AdamWTensor& k =
          list.emplace_back(kc::AdamWTensor{t.param, t.grad, t.m, t.v, t.n, t.weight_decay});
      auto it = kept_.find(t.param);
      if (it != kept_.end() && it->second.count == t.n && it->second.copy.size() == t.n) {
        k.bf16_copy = it->second.copy.data();
        rewritten.push_back(&it->second);
      }
    }
    if (list.empty()) return;
    Run(kc::MultiTensorAdamW(stream_, list,
                             kc::AdamWHyper{p.lr, p.beta1, p.beta2, p.eps, p.step, p.grad_scale}));
    if (!status_.ok()) return;
    for (KeptWeight* kept : rewritten) kept->epoch = updated;
  }
  double SumOfSquares(const float* x, int64_t n) override {
    auto* reduce = static_cast<double*>(
        ScratchBytes(Scratch::kReduce, (1 + kc::SumOfSquaresScratchDoubles(n)) * 8));
    if (reduce == nullptr) return 0.0;  // the allocation's error is recorded
    Run(kc::SumOfSquares(stream_, x, n, reduce, reduce + 1));
    double total = 0.0;
    ToHost(&total, reduce, 8);
    return total;
  }
  void AddSumOfSquares(const std::vector<std::pair<const float*, int64_t>>& ranges,
                       DeviceSum* sum) override {
    auto* sums = dynamic_cast<RowSums*>(sum);
    TY_CHECK(sums != nullptr) << "a device sum from another backend";
    std::vector<kc::SquaresRange> list;
    list.reserve(ranges.size());
    for (const auto& [x, n] : ranges) list.push_back({x, n});
    double* results = sums->ReserveTerms(static_cast<int64_t>(list.size()));
    auto* scratch = static_cast<double*>(
        ScratchBytes(Scratch::kReduce, kc::SumOfSquaresScratchDoubles(list) * 8));
    Run(kc::SumOfSquaresMulti(stream_, list, results, scratch));
  }
  void Scale(float* x, int64_t n, float factor) override { Run(kc::Scale(stream_, x, n, factor)); }
  void ScaleAct(Act* out, const Act* in, int64_t n, float factor) override {
    Run(kc::Scale(stream_, act_dtype(), out, in, n, factor));
  }

 private:
  explicit CudaBackend(const CudaBackendOptions& options) : options_(options) {}

  static kc::AttentionDims Dims(const AttentionShape& s) {
    return {s.batch,  s.seq,   s.heads,   s.kv_heads, s.head_dim,
            s.window, s.scale, s.softcap, s.doc_start};
  }
  static kc::AttentionBlockDims BlockDims(const AttentionBlockShape& s) {
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
            .scale = s.scale,
            .softcap = s.softcap,
            .doc_start = s.doc_start,
            .key_position = s.key_position};
  }

  // The CUDA kernels' value heads are as wide as the query and key heads: a model whose are not
  // (multi-head latent attention) is refused on GPU ranks at submit, and here by an error.
  bool EqualHeads(int64_t value_dim, int64_t head_dim) {
    if (value_dim == 0 || value_dim == head_dim) return true;
    Run(absl::UnimplementedError(
        absl::StrCat("the CUDA attention kernels take value heads as wide as the query and key "
                     "heads (",
                     head_dim, "), not ", value_dim)));
    return false;
  }

  // Keeps the first failure; later calls still run (their results are garbage, and the caller
  // learns of it at the next Synchronize()).
  void Run(absl::Status s) {
    if (s.ok() || !status_.ok()) return;
    TY_LOG(ERROR) << "CUDA backend: " << s;
    status_ = std::move(s);
  }
  void Record(cudaError_t err, const char* what) {
    if (err != cudaSuccess) Run(kc::CudaError(err, what, __FILE__, __LINE__));
  }

  // Stream-ordered allocation from the device's pool: freeing a buffer (ZeRO's transient
  // gathers and staging, activations on a shape change) neither waits for the stream nor
  // synchronises the device, and the memory is reused after the work queued before the free.
  void* Alloc(int64_t bytes) {
    if (bytes <= 0) return nullptr;
    void* p = nullptr;
    const cudaError_t err = cudaMallocAsync(&p, bytes, stream_);
    if (err != cudaSuccess) {
      Record(err, absl::StrCat("cudaMallocAsync of ", bytes, " bytes").c_str());
      return nullptr;
    }
    Record(cudaMemsetAsync(p, 0, bytes, stream_), "cudaMemsetAsync");
    return p;
  }
  std::function<void(void*)> Free() {
    cudaStream_t stream = stream_;
    return [stream](void* p) { cudaFreeAsync(p, stream); };
  }
  void ToDevice(void* dst, const void* src, int64_t bytes) {
    if (bytes <= 0) return;
    if (upload_->Upload(dst, src, bytes)) return;
    Record(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_), "H2D");
  }
  void ToHost(void* dst, const void* src, int64_t bytes) {
    if (bytes <= 0) return;
    Record(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_), "D2H");
    Record(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  }
  void DeviceCopy(void* dst, const void* src, int64_t bytes) {
    if (bytes > 0 && dst != src) {
      Record(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_), "D2D");
    }
  }

  // FP8 linear layers (CudaBackendOptions::fp8_linear). A layer's operands are quantized where
  // its GEMMs need them, from the bf16 activations the model keeps and the weight's bf16 copy
  // (a kept weight's codes are kept with that copy, Fp8Weight; nothing else FP8 outlives the
  // call): the input gradient's product takes the weight transposed, the
  // weight gradient's the output gradient and the input transposed (cuBLASLt's FP8 kernels sum
  // along contiguous rows of both operands).
  bool Fp8Linear(const float* w, int64_t m, int64_t n, int64_t k) const {
    return options_.fp8_linear && !experts_in_bf16_ && w != held_.weight && m % 16 == 0 &&
           n % 16 == 0 && k % 16 == 0;
  }
  // Experts run one at a time (their weights gathered, not kept) stay in bf16 as the grouped
  // ones do, whatever their rows: routing must not decide which experts compute in FP8.
  class ExpertsInBf16 {
   public:
    explicit ExpertsInBf16(CudaBackend* be) : be_(be) { be_->experts_in_bf16_ = true; }
    ~ExpertsInBf16() { be_->experts_in_bf16_ = false; }
    ExpertsInBf16(const ExpertsInBf16&) = delete;
    ExpertsInBf16& operator=(const ExpertsInBf16&) = delete;

   private:
    CudaBackend* be_;
  };
  struct Fp8Operand {
    float* amax = nullptr;
    float* scale_inv = nullptr;
    uint8_t* codes = nullptr;    // rows × cols
    uint8_t* codes_t = nullptr;  // cols × rows
  };
  struct Fp8Operands {
    Fp8Operand x, w, dy;  // the input [m, k], the weight [n, k], the output gradient [m, n]
  };
  // The kFp8 scratch carved into the three operands (each code array 256-byte aligned); all
  // null when it could not be had (the error is recorded).
  Fp8Operands Fp8Scratch(int64_t m, int64_t n, int64_t k) {
    auto aligned = [](int64_t bytes) { return (bytes + 255) / 256 * 256; };
    const int64_t sizes[3] = {aligned(m * k), aligned(n * k), aligned(m * n)};
    auto* base = static_cast<uint8_t*>(
        ScratchBytes(Scratch::kFp8, 256 + 2 * (sizes[0] + sizes[1] + sizes[2])));
    if (base == nullptr) return {};
    auto* scalars = reinterpret_cast<float*>(base);  // 3 amax, then 3 scale_inv
    uint8_t* next = base + 256;
    Fp8Operand operands[3];
    for (int i = 0; i < 3; ++i) {
      operands[i] = {scalars + i, scalars + 3 + i, next, next + sizes[i]};
      next += 2 * sizes[i];
    }
    return {operands[0], operands[1], operands[2]};
  }
  // x (bf16, rows × cols) scaled by its own amax into `op`, with the transposed codes if asked.
  void Quantize(const void* x, int64_t rows, int64_t cols, Fp8Format format, const Fp8Operand& op,
                bool transpose) {
    Run(kc::AbsMax(stream_, DType::kBF16, x, rows * cols, op.amax));
    Run(kc::QuantizeFp8(stream_, DType::kBF16, format, x, rows, cols, op.amax, op.codes,
                        transpose ? op.codes_t : nullptr, op.scale_inv));
  }
  // The E4M3 form of the weight w [n, k], with its transpose if asked. A kept weight's (both
  // layouts) is made once after each change of the weight and kept beside its bf16 copy: the
  // forward and input-gradient products of every micro-batch until the next optimizer step
  // share it, where quantizing on each use reads 6 bytes a parameter per product. Any other
  // weight is quantized into `scratch`. All null if memory could not be had (recorded).
  Fp8Operand Fp8Weight(const float* w, int64_t n, int64_t k, const Fp8Operand& scratch,
                       bool transpose) {
    const auto it = kept_.find(w);
    if (it == kept_.end() || it->second.count != n * k) {
      Quantize(Weight(w, n * k), n, k, Fp8Format::kE4M3, scratch, transpose);
      return scratch;
    }
    KeptWeight& kept = it->second;
    const Act* copy = UpToDate(w, kept);
    if (kept.fp8.size() != kept.count) {
      kept.fp8 = AllocAct(kept.count);
      kept.fp8_scalars = AllocFloat(2);
    }
    if (copy == nullptr || kept.fp8.data() == nullptr || kept.fp8_scalars.data() == nullptr) {
      return {};
    }
    auto* codes = reinterpret_cast<uint8_t*>(kept.fp8.data());
    const Fp8Operand op{kept.fp8_scalars.data(), kept.fp8_scalars.data() + 1, codes,
                        codes + kept.count};
    if (kept.fp8_epoch != kept.epoch || kept.fp8_rows != n) {
      Quantize(copy, n, k, Fp8Format::kE4M3, op, /*transpose=*/true);
      kept.fp8_epoch = kept.epoch;
      kept.fp8_rows = n;
    }
    return op;
  }
  // out = inp · wᵀ + b with E4M3 operands, fast accumulation as recipes use for forward products.
  void Fp8Forward(Act* out, const Act* inp, const float* w, const float* b, int64_t m, int64_t n,
                  int64_t k) {
    const Fp8Operands s = Fp8Scratch(m, n, k);
    if (s.x.codes == nullptr) return;
    Quantize(inp, m, k, Fp8Format::kE4M3, s.x, false);
    const Fp8Operand wq = Fp8Weight(w, n, k, s.w, /*transpose=*/false);
    if (wq.codes == nullptr) return;
    Run(gemm_->Fp8(stream_, out, DType::kBF16, s.x.codes, Fp8Format::kE4M3, s.x.scale_inv, wq.codes,
                   Fp8Format::kE4M3, wq.scale_inv, m, n, k, b ? Bias(b, n) : nullptr,
                   /*fast_accum=*/true));
  }
  // dinp[m, k] = dy[m, n] · w[n, k] and dw[n, k] += dy[m, n]ᵀ · inp[m, k], dy in E5M2; either may
  // be skipped (null), as LinearBackward's split backward asks.
  void Fp8Backward(Act* dinp, float* dw, const Act* dout, const Act* inp, const float* w, int64_t m,
                   int64_t n, int64_t k) {
    if (dinp == nullptr && dw == nullptr) return;
    const Fp8Operands s = Fp8Scratch(m, n, k);
    if (s.x.codes == nullptr) return;
    Quantize(dout, m, n, Fp8Format::kE5M2, s.dy, /*transpose=*/dw != nullptr);
    if (dinp != nullptr) {
      const Fp8Operand wq = Fp8Weight(w, n, k, s.w, /*transpose=*/true);
      if (wq.codes == nullptr) return;
      Run(gemm_->Fp8(stream_, dinp, DType::kBF16, s.dy.codes, Fp8Format::kE5M2, s.dy.scale_inv,
                     wq.codes_t, Fp8Format::kE4M3, wq.scale_inv, m, k, n));
    }
    if (dw != nullptr) {
      Quantize(inp, m, k, Fp8Format::kE4M3, s.x, /*transpose=*/true);
      Run(gemm_->Fp8(stream_, dw, DType::kF32, s.dy.codes_t, Fp8Format::kE5M2, s.dy.scale_inv,
                     s.x.codes_t, Fp8Format::kE4M3, s.x.scale_inv, n, k, m));
    }
  }

  // A scratch buffer of at least `bytes`, grown (never shrunk) in stream order: the old one is
  // freed after the work queued so far, without waiting for it. (cudaFree would wait for the
  // whole device, NCCL's kernels on other streams too, which may be waiting for peers that wait
  // for this thread.) Only work on this stream, or ordered after it by an event, may use it.
  void* ScratchBytes(Scratch which, size_t bytes) {
    Block& s = scratch_[static_cast<int>(which)];
    if (bytes > s.bytes) {
      if (s.ptr != nullptr) {
        Record(cudaFreeAsync(s.ptr, stream_), "cudaFreeAsync");
        s = Block{};
      }
      // The exact size: shapes repeat every step, so growth stops within the first one, and
      // rounding up could waste as much as the largest use (the LM head's weight copy).
      const size_t grown = bytes;
      if (cudaMallocAsync(&s.ptr, grown, stream_) != cudaSuccess) {
        Run(absl::ResourceExhaustedError(absl::StrCat("scratch of ", grown, " bytes")));
        s.ptr = nullptr;
        return nullptr;
      }
      s.bytes = grown;
    }
    return s.ptr;
  }
  float* ScratchFloats(Scratch which, int64_t count) {
    return static_cast<float*>(ScratchBytes(which, std::max<int64_t>(count, 1) * 4));
  }

  // fp32 master weights in the activation type: bf16 copies for the tensor cores, kept for a
  // registered weight (KeepWeightCopy) until a weight may have changed, else made on every use,
  // so that they are right whatever changed the master copy (an optimizer step, a ZeRO gather).
  const void* Weight(const float* w, int64_t n) {
    if (act_dtype() == DType::kF32) return w;
    if (held_.weight != nullptr && held_.converted && w == held_.weight && n == held_.count) {
      return scratch_[static_cast<int>(Scratch::kWeight)].ptr;
    }
    if (const std::optional<const void*> kept = KeptCopy(w, n)) return *kept;
    void* dst = ScratchBytes(Scratch::kWeight, n * 2);
    Run(kc::Convert(stream_, DType::kBF16, dst, DType::kF32, w, n));
    // The scratch now holds this weight: valid for reuse only if it is the held one.
    held_.converted = dst != nullptr && w == held_.weight && n == held_.count;
    return dst;
  }
  // A bias in the output's type (cuBLASLt's bias epilogue reads it so), kept as weights are.
  const void* Bias(const float* b, int64_t n) {
    if (act_dtype() == DType::kF32) return b;
    if (const std::optional<const void*> kept = KeptCopy(b, n)) return *kept;
    void* dst = ScratchBytes(Scratch::kBias, n * 2);
    Run(kc::Convert(stream_, DType::kBF16, dst, DType::kF32, b, n));
    return dst;
  }
  // The kept copy of `n` elements at `w`, a registered weight or a part of one (an expert's
  // slice of its layer's tensor), the whole weight converted again if a weight may have changed
  // since; none outside every registered weight (a null copy: its allocation failed, recorded).
  std::optional<const void*> KeptCopy(const float* w, int64_t n) {
    auto it = kept_.upper_bound(w);  // the first weight starting after w
    if (it == kept_.begin()) return std::nullopt;
    --it;
    const float* base = it->first;
    KeptWeight& kept = it->second;
    const int64_t at = w - base;
    if (n <= 0 || at + n > kept.count) return std::nullopt;
    Act* copy = UpToDate(base, kept);
    if (copy == nullptr) return nullptr;
    return At(copy, at);
  }
  struct KeptWeight;  // below, with the other state
  // The whole kept copy of the registered weight at `base`, converted again if a weight may have
  // changed since; null if its allocation failed (recorded).
  Act* UpToDate(const float* base, KeptWeight& kept) {
    if (kept.copy.size() != kept.count) kept.copy = AllocAct(kept.count);
    if (kept.copy.data() == nullptr) return nullptr;
    if (kept.epoch != weights_epoch_) {
      Run(kc::Convert(stream_, DType::kBF16, kept.copy.data(), DType::kF32, base, kept.count));
      kept.epoch = weights_epoch_;
    }
    return kept.copy.data();
  }

  // The experts of one MoE call that have rows, with their weights in the activation type.
  struct ExpertWeights {
    std::vector<int64_t> experts;
    std::vector<const void*> fc, proj;
  };
  // Fills `w` and returns true when the experts can run grouped: rows start at 0 and every
  // weight needed is usable in place (fp32) or has a kept copy (bf16).
  bool GroupedExperts(const ExpertMlp& mlp, ExpertWeights* w) {
    if (mlp.offsets.empty() || mlp.offsets.front() != 0 || mlp.offsets.back() == 0) return false;
    const int64_t fc = mlp.fc_out() * mlp.width, proj = mlp.width * mlp.ffn;
    for (int64_t j = 0; j < mlp.experts(); ++j) {
      if (mlp.offsets[j + 1] == mlp.offsets[j]) continue;
      const float *fc_w = mlp.fc_w + j * fc, *proj_w = mlp.proj_w + j * proj;
      w->experts.push_back(j);
      if (act_dtype() == DType::kF32) {
        w->fc.push_back(fc_w);
        w->proj.push_back(proj_w);
        continue;
      }
      const std::optional<const void*> fc_copy = KeptCopy(fc_w, fc);
      const std::optional<const void*> proj_copy = KeptCopy(proj_w, proj);
      if (!fc_copy || !proj_copy) return false;
      w->fc.push_back(*fc_copy);
      w->proj.push_back(*proj_copy);
    }
    return true;
  }
  // One grouped GEMM's operands on the host, and where UploadGroups put their device copy.
  class GroupArrays {
   public:
    explicit GroupArrays(kc::GemmKind kind) : kind_(kind) {}
    void Add(int64_t m, void* out, const void* x, const void* y) {
      m_.push_back(m);
      out_.push_back(out);
      x_.push_back(x);
      y_.push_back(y);
    }
    int count() const { return static_cast<int>(m_.size()); }
    // Appends the device layout Gemm::Grouped reads (kc::GroupPointers) to `words`.
    void Append(std::vector<uint64_t>& words) {
      first_word_ = words.size();
      for (const void* p : kc::GroupPointers(Group(nullptr))) {
        words.push_back(reinterpret_cast<uintptr_t>(p));
      }
    }
    kc::GemmGroup Group(const uint64_t* device_words) const {
      return {.kind = kind_,
              .count = count(),
              .m = m_.data(),
              .out = out_.data(),
              .x = x_.data(),
              .y = y_.data(),
              .device = device_words == nullptr
                            ? nullptr
                            : reinterpret_cast<const void* const*>(device_words + first_word_)};
    }

   private:
    kc::GemmKind kind_;
    std::vector<int64_t> m_;
    std::vector<void*> out_;
    std::vector<const void*> x_, y_;
    size_t first_word_ = 0;
  };
  // Runs one grouped GEMM (its pointer arrays uploaded at `device_words`); says once when cuBLAS
  // has no grouped GEMM for its kind and type, which then run one product at a time.
  void RunGrouped(const GroupArrays& g, const uint64_t* device_words, int64_t n, int64_t k) {
    const kc::GemmGroup group = g.Group(device_words);
    const bool before = gemm_->GroupedOneByOne(group.kind, act_dtype());
    Run(gemm_->Grouped(stream_, act_dtype(), group, n, k));
    if (!before && gemm_->GroupedOneByOne(group.kind, act_dtype())) {
      TY_LOG(WARNING) << "cuBLAS has no grouped GEMM for the experts' "
                      << (group.kind == kc::GemmKind::kForward         ? "forward"
                          : group.kind == kc::GemmKind::kBackwardInput ? "input gradient"
                                                                       : "weight gradient")
                      << " products in " << DTypeName(act_dtype()) << ": they run one by one";
    }
  }
  // Uploads the row offsets, every group's pointer arrays and `extra` (at word *extra_at) in one
  // copy (stream-ordered, into scratch that the next call may reuse once these have run);
  // returns the device words, the offsets first (null on an allocation failure, recorded).
  const uint64_t* UploadGroups(std::span<const int64_t> offsets,
                               std::initializer_list<GroupArrays*> groups,
                               std::span<const int64_t> extra = {}, size_t* extra_at = nullptr) {
    std::vector<uint64_t> words(offsets.begin(), offsets.end());
    for (GroupArrays* g : groups) g->Append(words);
    if (extra_at != nullptr) *extra_at = words.size();
    words.insert(words.end(), extra.begin(), extra.end());
    const int64_t bytes = static_cast<int64_t>(words.size() * sizeof(uint64_t));
    void* device = ScratchBytes(Scratch::kGroups, bytes);
    if (device == nullptr) return nullptr;
    ToDevice(device, words.data(), bytes);
    return static_cast<const uint64_t*>(device);
  }

  struct Block {
    void* ptr = nullptr;
    size_t bytes = 0;
  };

  // A sum on the device: the per-row losses of each SoftmaxCrossEntropy call and the per-range
  // sums of each AddSumOfSquares call since the last Take. The host sums what it reads in the
  // order the CPU backend adds: each call's rows (or terms) in order, in double, then the calls.
  // The device buffers grow in stream order and are kept from step to step, and the read goes
  // into pinned host memory behind an event, so that StartRead does not wait.
  class RowSums final : public DeviceSum {
   public:
    explicit RowSums(CudaBackend* backend) : backend_(backend), rows_(backend), terms_(backend) {}
    ~RowSums() override {
      if (read_ != nullptr) {
        cudaEventSynchronize(read_);
        cudaEventDestroy(read_);
      }
      if (pinned_ != nullptr) cudaFreeHost(pinned_);
    }
    void AddHost(double value) override { host_ += value; }
    void StartRead() override {
      const int64_t rows = rows_.used(), terms = terms_.used();
      const size_t bytes = terms * sizeof(double) + rows * sizeof(float);
      if (bytes > pinned_bytes_ && !GrowPinned(bytes)) return;  // the error is recorded
      if (read_ == nullptr) {
        backend_->Record(cudaEventCreateWithFlags(&read_, cudaEventDisableTiming),
                         "cudaEventCreate");
        if (read_ == nullptr) return;
      }
      auto* host_terms = static_cast<double*>(pinned_);
      terms_.Read(host_terms);
      rows_.Read(reinterpret_cast<float*>(host_terms + terms));
      backend_->Record(cudaEventRecord(read_, backend_->stream_), "cudaEventRecord");
      read_rows_ = rows;
      read_terms_ = terms;
    }
    absl::StatusOr<double> Take() override {
      if (read_rows_ != rows_.used() || read_terms_ != terms_.used()) StartRead();
      if (read_ != nullptr) backend_->Record(cudaEventSynchronize(read_), "cudaEventSynchronize");
      backend_->Record(cudaGetLastError(), "cudaGetLastError");
      TY_RETURN_IF_ERROR(backend_->status_);
      const auto* terms = static_cast<const double*>(pinned_);
      const double total = rows_.TakeSum(reinterpret_cast<const float*>(terms + read_terms_)) +
                           terms_.TakeSum(terms);
      read_rows_ = read_terms_ = -1;
      return total + std::exchange(host_, 0.0);
    }
    // Room for one call's `count` row losses, or its `count` terms.
    float* Reserve(int64_t count) { return rows_.Reserve(count); }
    double* ReserveTerms(int64_t count) { return terms_.Reserve(count); }

   private:
    // One kind of term: the calls' values one after another on the device, each call's end.
    template <typename T>
    class Calls {
     public:
      explicit Calls(CudaBackend* backend) : backend_(backend) {}
      int64_t used() const { return ends_.empty() ? 0 : ends_.back(); }
      T* Reserve(int64_t count) {
        const int64_t used = this->used();
        if (used + count > buffer_.size()) {
          const int64_t size = std::max(2 * buffer_.size(), used + count);
          Buffer<T> grown(static_cast<T*>(backend_->Alloc(size * sizeof(T))), size,
                          backend_->Free());
          if (grown.data() != nullptr && used > 0) {
            backend_->DeviceCopy(grown.data(), buffer_.data(), used * sizeof(T));
          }
          buffer_ = std::move(grown);  // freed in stream order, after the copy
        }
        ends_.push_back(used + count);
        return buffer_.data() == nullptr ? nullptr : buffer_.data() + used;
      }
      // Queues the copy of every value to `host` (pinned).
      void Read(T* host) const {
        if (used() == 0) return;
        backend_->Record(cudaMemcpyAsync(host, buffer_.data(), used() * sizeof(T),
                                         cudaMemcpyDeviceToHost, backend_->stream_),
                         "D2H");
      }
      // Σ over the calls of each call's values summed in order (in double), from `host` as
      // Read left it; then no calls.
      double TakeSum(const T* host) {
        double total = 0.0;
        int64_t i = 0;
        for (const int64_t end : ends_) {
          double call = 0.0;
          for (; i < end; ++i) call += host[i];
          total += call;
        }
        ends_.clear();
        return total;
      }

     private:
      CudaBackend* backend_;
      Buffer<T> buffer_;
      std::vector<int64_t> ends_;  // each call's end in buffer_
    };

    // Room for `bytes` of pinned memory, after any read into the old one is done.
    bool GrowPinned(size_t bytes) {
      const size_t size = std::max(bytes, 2 * pinned_bytes_);
      if (pinned_ != nullptr) {
        if (read_ != nullptr) cudaEventSynchronize(read_);
        cudaFreeHost(pinned_);
        pinned_ = nullptr;
        pinned_bytes_ = 0;
      }
      const cudaError_t err = cudaMallocHost(&pinned_, size);
      backend_->Record(err, "cudaMallocHost");
      if (err != cudaSuccess) {
        pinned_ = nullptr;
        return false;
      }
      pinned_bytes_ = size;
      return true;
    }

    CudaBackend* backend_;
    Calls<float> rows_;
    Calls<double> terms_;
    double host_ = 0.0;
    void* pinned_ = nullptr;  // the last read: its terms, then its rows
    size_t pinned_bytes_ = 0;
    cudaEvent_t read_ = nullptr;  // recorded after the last read's copies
    // What the read started since the last Take covers (-1: none started).
    int64_t read_rows_ = -1, read_terms_ = -1;
  };

  // Host-to-device copies of up to kMaxBytes go through pinned memory: from pageable memory the
  // driver may synchronise with the stream before it copies, and every micro-batch's token ids
  // cross here. A copy's space in the ring is reused once the copy has run (an event each); the
  // host waits only when it is a whole ring ahead of the device.
  class UploadRing {
   public:
    static constexpr size_t kBytes = size_t{8} << 20;
    static constexpr size_t kMaxBytes = kBytes / 4;  // larger copies (weight loads) go directly

    explicit UploadRing(CudaBackend* backend) : backend_(backend) {}
    ~UploadRing() {
      for (const Region& r : in_flight_) {
        cudaEventSynchronize(r.done);
        cudaEventDestroy(r.done);
      }
      for (cudaEvent_t e : spare_) cudaEventDestroy(e);
      if (base_ != nullptr) cudaFreeHost(base_);
    }
    // Queues the copy of `bytes` from `src` to `dst` through the ring; false (nothing queued)
    // when it is too large or the ring cannot be had.
    bool Upload(void* dst, const void* src, int64_t bytes) {
      const auto size = static_cast<size_t>(bytes);
      if (size > kMaxBytes) return false;
      if (base_ == nullptr && cudaMallocHost(&base_, kBytes) != cudaSuccess) {
        base_ = nullptr;
        cudaGetLastError();  // not sticky: the copy goes directly instead
        return false;
      }
      const size_t at = head_ + size <= kBytes ? head_ : 0;
      Reclaim(at, size);
      std::memcpy(static_cast<char*>(base_) + at, src, size);
      backend_->Record(cudaMemcpyAsync(dst, static_cast<char*>(base_) + at, size,
                                       cudaMemcpyHostToDevice, backend_->stream_),
                       "H2D");
      cudaEvent_t done = nullptr;
      if (spare_.empty()) {
        backend_->Record(cudaEventCreateWithFlags(&done, cudaEventDisableTiming),
                         "cudaEventCreate");
      } else {
        done = spare_.back();
        spare_.pop_back();
      }
      if (done != nullptr) {
        backend_->Record(cudaEventRecord(done, backend_->stream_), "cudaEventRecord");
        in_flight_.push_back({at, size, done});
      }
      head_ = (at + size + 255) / 256 * 256;  // the next copy starts 256-byte aligned
      return true;
    }

   private:
    struct Region {
      size_t at, size;
      cudaEvent_t done;  // recorded after the copy that reads the region
    };

    // Frees the ring's space [at, at + size): the copies that are done give theirs back, and if
    // one still pending overlaps it, the host waits for the newest such (the stream runs them
    // in order, so every earlier one is done then too).
    void Reclaim(size_t at, size_t size) {
      while (!in_flight_.empty() && cudaEventQuery(in_flight_.front().done) == cudaSuccess) {
        Recycle();
      }
      size_t last = in_flight_.size();
      for (size_t i = 0; i < in_flight_.size(); ++i) {
        const Region& r = in_flight_[i];
        if (r.at < at + size && at < r.at + r.size) last = i;
      }
      if (last == in_flight_.size()) return;
      backend_->Record(cudaEventSynchronize(in_flight_[last].done), "cudaEventSynchronize");
      for (size_t i = 0; i <= last; ++i) Recycle();
    }
    void Recycle() {
      spare_.push_back(in_flight_.front().done);
      in_flight_.pop_front();
    }

    CudaBackend* backend_;
    void* base_ = nullptr;          // kBytes of pinned memory
    size_t head_ = 0;               // where the next copy goes, if it fits before the end
    std::deque<Region> in_flight_;  // in the order queued
    std::vector<cudaEvent_t> spare_;
  };

  // Spans timed with CUDA events on the stream, read when taken; the events are reused from
  // step to step.
  class EventTimer final : public DeviceTimer {
   public:
    explicit EventTimer(CudaBackend* backend) : backend_(backend) {}
    ~EventTimer() override {
      for (cudaEvent_t e : events_) cudaEventDestroy(e);
    }
    void Start() override { RecordNext(); }
    void Stop() override { RecordNext(); }
    absl::StatusOr<double> Take() override {
      TY_RETURN_IF_ERROR(backend_->status_);
      if (used_ % 2 != 0) return absl::FailedPreconditionError("timer read inside a span");
      TY_RETURN_IF_ERROR(Fold());
      return std::exchange(folded_ms_, 0.0) / 1e3;
    }

   private:
    // A timer nobody reads (a model driven outside a training loop) keeps at most this many
    // events: at a span's start beyond it, the spans so far are read and summed into folded_ms_.
    static constexpr size_t kMaxEvents = 1024;

    // Adds the recorded spans to folded_ms_ (waiting for the last) and reuses their events.
    absl::Status Fold() {
      if (used_ == 0) return absl::OkStatus();
      TY_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(events_[used_ - 1]));
      for (size_t i = 0; i < used_; i += 2) {
        float span = 0.0f;
        TY_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&span, events_[i], events_[i + 1]));
        folded_ms_ += span;
      }
      used_ = 0;
      return absl::OkStatus();
    }

    void RecordNext() {
      if (used_ >= kMaxEvents && used_ % 2 == 0) backend_->Run(Fold());
      if (used_ == events_.size()) {
        cudaEvent_t event = nullptr;
        const cudaError_t made = cudaEventCreate(&event);
        backend_->Record(made, "cudaEventCreate");
        if (made != cudaSuccess) return;  // the error is the backend's: Take reports it
        events_.push_back(event);
      }
      backend_->Record(cudaEventRecord(events_[used_++], backend_->stream_), "cudaEventRecord");
    }

    CudaBackend* backend_;
    std::vector<cudaEvent_t> events_;
    size_t used_ = 0;         // events recorded since the last Take or Fold: Start, Stop, ...
    double folded_ms_ = 0.0;  // spans read by Fold since the last Take
  };

  // The weight HoldWeight named, and whether the kWeight scratch holds its conversion.
  struct HeldWeight {
    const float* weight = nullptr;
    int64_t count = 0;
    bool converted = false;
  };
  HeldWeight held_;
  bool experts_in_bf16_ = false;  // set by ExpertsInBf16
  // A registered weight's kept conversion, valid while epoch is weights_epoch_; under FP8 linear
  // layers also its E4M3 codes in both layouts (count bytes each, in one buffer) with their amax
  // and scale inverse, valid while fp8_epoch is epoch and the product's rows are fp8_rows.
  struct KeptWeight {
    int64_t count = 0;
    Buffer<Act> copy;
    uint64_t epoch = 0;
    Buffer<Act> fp8;
    Buffer<float> fp8_scalars;
    uint64_t fp8_epoch = 0;
    int64_t fp8_rows = 0;
  };
  std::map<const float*, KeptWeight> kept_;  // by address: a part of a weight finds its whole
  uintptr_t kept_lo_ = 0, kept_hi_ = 0;      // the addresses the kept weights span
  uint64_t weights_epoch_ = 1;               // moved on by anything that may change a weight
  CudaBackendOptions options_;
  std::string device_name_;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<kc::Gemm> gemm_;
  std::unique_ptr<UploadRing> upload_;  // its pinned memory comes with the first copy
  std::array<Block, static_cast<int>(Scratch::kCount)> scratch_{};
  absl::Status status_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> MakeCudaBackend(const CudaBackendOptions& options) {
  return CudaBackend::Create(options);
}

void* CudaStreamOf(Backend& backend) {
  auto* cuda = dynamic_cast<CudaBackend*>(&backend);
  return cuda != nullptr ? static_cast<void*>(cuda->stream()) : nullptr;
}

}  // namespace trainyard::worker
