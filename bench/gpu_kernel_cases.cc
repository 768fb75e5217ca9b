#include "bench/gpu_kernel_cases.h"

#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "kernels/cuda/activations.h"
#include "kernels/cuda/adamw.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/cross_entropy.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/fp8.h"
#include "kernels/cuda/gemm_args.h"
#include "kernels/cuda/norms.h"
#include "worker/shape/parameters.h"

// How work is counted (the same formulas are in bench/torch_gpu_kernels.py):
//  - attention: 4·b·h·t²·d FLOPs for the two products, halved for the causal mask, forward;
//    the backward is 2.5× the forward (five products instead of two), fwd+bwd 3.5×.
//  - GEMMs: 2·m·n·k.
//  - memory-bound kernels: the fewest bytes the operation must move, each input read once and
//    each output written once, at its storage type (activations bf16, parameters, gradients,
//    statistics fp32, ids int32). Accumulating outputs (+=) are counted as written once, not
//    read too, so both engines are held to the same count whatever their in-place habits.
//    A fwd+bwd row counts the forward and the backward pass, each with its own reads.
//  - FP8 quantization (current scaling) must see a tensor whole before it can scale it: the
//    amax pass reads it, the quantizing pass reads it again and writes the codes and their
//    transpose, 2 + 2 + 1 + 1 bytes an element of a bf16 tensor.
namespace trainyard::bench {
namespace {

using kernels::cuda::GemmEpilogue;

constexpr DType kAct = DType::kBF16;
constexpr int64_t kAb = 2;  // bytes of a bf16 activation
constexpr int64_t kFb = 4;  // bytes of an fp32 value
constexpr float kEps = 1e-5f;

absl::StatusOr<DeviceBuffer> Act(const CaseContext& ctx, int64_t n, uint64_t seed) {
  TY_ASSIGN_OR_RETURN(DeviceBuffer buffer, DeviceBuffer::Create(n * kAb));
  TY_RETURN_IF_ERROR(FillNormal(ctx.stream, kAct, buffer.get(), n, seed, 1.0f));
  return buffer;
}

absl::StatusOr<DeviceBuffer> Floats(const CaseContext& ctx, int64_t n, uint64_t seed, float scale) {
  TY_ASSIGN_OR_RETURN(DeviceBuffer buffer, DeviceBuffer::Create(n * kFb));
  if (scale > 0.0f) {
    TY_RETURN_IF_ERROR(FillNormal(ctx.stream, DType::kF32, buffer.get(), n, seed, scale));
  }
  return buffer;
}

absl::StatusOr<DeviceBuffer> Ids(const std::vector<int32_t>& host) {
  TY_ASSIGN_OR_RETURN(DeviceBuffer buffer,
                      DeviceBuffer::Create(static_cast<int64_t>(host.size() * sizeof(int32_t))));
  TY_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(buffer.get(), host.data(), host.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
  return buffer;
}

absl::Status Measure(const CaseContext& ctx, Row* row, const EventTimer::Op& op,
                     const EventTimer::Op& prepare = nullptr) {
  TY_ASSIGN_OR_RETURN(row->timing, ctx.timer->Time(ctx.stream, op, prepare));
  return absl::OkStatus();
}

enum class Pass { kForward, kBackward, kBoth };

// How the kernels are asked to run: the backward's dQ sums, the forward's query rows per warp
// (0: the default), and a soft cap on the scores (Gemma 2's 50; 0: none). The variants' rows are
// compared with the same SDPA rows as the defaults' (SDPA has no cap: that row shows what the
// cap costs).
struct AttentionVariant {
  kernels::cuda::AttentionDqSum dq_sum = kernels::cuda::AttentionDqSum::kDeterministic;
  int warp_rows = 0;
  float softcap = 0.0f;
};

absl::Status Attention(const BenchModel& m, Pass pass, AttentionVariant variant,
                       const CaseContext& ctx, Row* row) {
  const config::ModelConfig& c = m.config;
  const kernels::cuda::AttentionDims dims{.b = m.batch,
                                          .t = m.seq,
                                          .heads = c.heads,
                                          .kv_heads = c.kv_heads,
                                          .d = c.head_dim(),
                                          .softcap = variant.softcap};
  row->shape = absl::StrCat("b", m.batch, " t", m.seq, " h", c.heads, "/", c.kv_heads, " d",
                            c.head_dim(), " causal");
  const int64_t tokens = m.batch * m.seq;
  TY_ASSIGN_OR_RETURN(DeviceBuffer qkv, Act(ctx, tokens * c.qkv_width(), 1));
  TY_ASSIGN_OR_RETURN(DeviceBuffer dout, Act(ctx, tokens * c.width, 2));
  TY_ASSIGN_OR_RETURN(DeviceBuffer out, DeviceBuffer::Create(tokens * c.width * kAb));
  TY_ASSIGN_OR_RETURN(DeviceBuffer dqkv, DeviceBuffer::Create(tokens * c.qkv_width() * kAb));
  TY_ASSIGN_OR_RETURN(DeviceBuffer lse, DeviceBuffer::Create(m.batch * c.heads * m.seq * kFb));
  const size_t scratch_bytes =
      kernels::cuda::FlashAttentionBackwardScratchBytes(dims, kAct, variant.dq_sum);
  TY_ASSIGN_OR_RETURN(DeviceBuffer scratch,
                      DeviceBuffer::Create(static_cast<int64_t>(scratch_bytes)));
  auto forward = [&] {
    return kernels::cuda::FlashAttentionForward(ctx.stream, kAct, out.get(), lse.f32(), qkv.get(),
                                                dims, variant.warp_rows);
  };
  auto backward = [&] {
    return kernels::cuda::FlashAttentionBackward(ctx.stream, kAct, dqkv.get(), dout.get(),
                                                 qkv.get(), out.get(), lse.f32(), dims,
                                                 scratch.get(), scratch_bytes, variant.dq_sum);
  };
  const double forward_flop = 2.0 * m.batch * c.heads * double(m.seq) * m.seq * c.head_dim();
  switch (pass) {
    case Pass::kForward:
      row->flop = forward_flop;
      return Measure(ctx, row, forward);
    case Pass::kBackward:
      row->flop = 2.5 * forward_flop;
      TY_RETURN_IF_ERROR(forward());  // the saved output and log-sum-exp the backward reads
      return Measure(ctx, row, backward);
    case Pass::kBoth:
      row->flop = 3.5 * forward_flop;
      return Measure(ctx, row, [&]() -> absl::Status {
        TY_RETURN_IF_ERROR(forward());
        return backward();
      });
  }
  return absl::InternalError("unknown pass");
}

// Forward then backward of LayerNorm (with bias) when `layer_norm`, RMSNorm otherwise, over the
// batch's token rows.
absl::Status Norm(const BenchModel& m, bool layer_norm, const CaseContext& ctx, Row* row) {
  const int64_t rows = m.batch * m.seq, c = m.config.width;
  row->shape = absl::StrCat(rows, " x ", c);
  TY_ASSIGN_OR_RETURN(DeviceBuffer x, Act(ctx, rows * c, 3));
  TY_ASSIGN_OR_RETURN(DeviceBuffer dout, Act(ctx, rows * c, 4));
  TY_ASSIGN_OR_RETURN(DeviceBuffer out, DeviceBuffer::Create(rows * c * kAb));
  TY_ASSIGN_OR_RETURN(DeviceBuffer dx, DeviceBuffer::Create(rows * c * kAb));
  TY_ASSIGN_OR_RETURN(DeviceBuffer w, Floats(ctx, c, 5, 1.0f));
  TY_ASSIGN_OR_RETURN(DeviceBuffer b, Floats(ctx, c, 6, 1.0f));
  TY_ASSIGN_OR_RETURN(DeviceBuffer dw, Floats(ctx, c, 0, 0.0f));
  TY_ASSIGN_OR_RETURN(DeviceBuffer db, Floats(ctx, c, 0, 0.0f));
  TY_ASSIGN_OR_RETURN(DeviceBuffer mean, Floats(ctx, rows, 0, 0.0f));
  TY_ASSIGN_OR_RETURN(DeviceBuffer rstd, Floats(ctx, rows, 0, 0.0f));
  TY_ASSIGN_OR_RETURN(DeviceBuffer scratch,
                      Floats(ctx, kernels::cuda::NormBackwardScratchFloats(rows, c), 0, 0.0f));
  const int64_t params = layer_norm ? 2 : 1, stats = layer_norm ? 2 : 1;
  // forward: x, params in; out, stats out. backward: dout, x, weight, stats in; dx, params out.
  const double forward_bytes = 2.0 * rows * c * kAb + params * c * kFb + stats * rows * kFb;
  const double backward_bytes = 3.0 * rows * c * kAb + (1 + params) * c * kFb + stats * rows * kFb;
  row->bytes = forward_bytes + backward_bytes;
  auto forward = [&] {
    return layer_norm ? kernels::cuda::LayerNormForward(ctx.stream, kAct, out.get(), mean.f32(),
                                                        rstd.f32(), x.get(), w.f32(), b.f32(), rows,
                                                        c, kEps)
                      : kernels::cuda::RmsNormForward(ctx.stream, kAct, out.get(), rstd.f32(),
                                                      x.get(), w.f32(), rows, c, kEps);
  };
  auto backward = [&] {
    return layer_norm ? kernels::cuda::LayerNormBackward(
                            ctx.stream, kAct, dx.get(), dw.f32(), db.f32(), dout.get(), x.get(),
                            w.f32(), mean.f32(), rstd.f32(), rows, c, scratch.f32())
                      : kernels::cuda::RmsNormBackward(ctx.stream, kAct, dx.get(), dw.f32(),
                                                       dout.get(), x.get(), w.f32(), rstd.f32(),
                                                       rows, c, scratch.f32());
  };
  return Measure(ctx, row, [&]() -> absl::Status {
    TY_RETURN_IF_ERROR(forward());
    return backward();
  });
}

absl::Status Gelu(const BenchModel& m, const CaseContext& ctx, Row* row) {
  const int64_t rows = m.batch * m.seq, f = m.config.ffn_hidden, n = rows * f;
  row->shape = absl::StrCat(rows, " x ", f);
  TY_ASSIGN_OR_RETURN(DeviceBuffer inp, Act(ctx, n, 7));
  TY_ASSIGN_OR_RETURN(DeviceBuffer dout, Act(ctx, n, 8));
  TY_ASSIGN_OR_RETURN(DeviceBuffer out, DeviceBuffer::Create(n * kAb));
  TY_ASSIGN_OR_RETURN(DeviceBuffer dinp, DeviceBuffer::Create(n * kAb));
  // forward: inp in, out out; backward: dout and inp in, dinp out.
  row->bytes = 5.0 * n * kAb;
  return Measure(ctx, row, [&]() -> absl::Status {
    TY_RETURN_IF_ERROR(kernels::cuda::GeluForward(ctx.stream, kAct, out.get(), inp.get(), n));
    return kernels::cuda::GeluBackward(ctx.stream, kAct, dinp.get(), dout.get(), inp.get(), n);
  });
}

absl::Status Swiglu(const BenchModel& m, const CaseContext& ctx, Row* row) {
  const int64_t rows = m.batch * m.seq, f = m.config.ffn_hidden;
  row->shape = absl::StrCat(rows, " x 2*", f, " -> ", f);
  TY_ASSIGN_OR_RETURN(DeviceBuffer inp, Act(ctx, rows * 2 * f, 9));
  TY_ASSIGN_OR_RETURN(DeviceBuffer dout, Act(ctx, rows * f, 10));
  TY_ASSIGN_OR_RETURN(DeviceBuffer out, DeviceBuffer::Create(rows * f * kAb));
  TY_ASSIGN_OR_RETURN(DeviceBuffer dinp, DeviceBuffer::Create(rows * 2 * f * kAb));
  // forward: inp (2f) in, out (f) out; backward: dout (f) and inp (2f) in, dinp (2f) out.
  row->bytes = (3.0 + 5.0) * rows * f * kAb;
  return Measure(ctx, row, [&]() -> absl::Status {
    TY_RETURN_IF_ERROR(kernels::cuda::GluForward(ctx.stream, kAct, out.get(), inp.get(), rows, f,
                                                 kernels::GluGate::kSilu));
    return kernels::cuda::GluBackward(ctx.stream, kAct, dinp.get(), dout.get(), inp.get(), rows, f,
                                      kernels::GluGate::kSilu);
  });
}

// Loss and gradient of one chunk of logit rows; the gradient overwrites the logits, so each rep
// starts from a pristine copy (restored outside the timed region).
absl::Status CrossEntropy(const BenchModel& m, const CaseContext& ctx, Row* row) {
  const int64_t rows = m.ce_rows, v = m.config.vocab;
  row->shape = absl::StrCat(rows, " x ", v);
  TY_ASSIGN_OR_RETURN(DeviceBuffer pristine, Act(ctx, rows * v, 11));
  TY_ASSIGN_OR_RETURN(DeviceBuffer logits, DeviceBuffer::Create(rows * v * kAb));
  TY_ASSIGN_OR_RETURN(DeviceBuffer targets, Ids(BenchTokens(rows, v, 12)));
  TY_ASSIGN_OR_RETURN(DeviceBuffer losses, Floats(ctx, rows, 0, 0.0f));
  // logits and targets in; gradient (in place) and losses out.
  row->bytes = 2.0 * rows * v * kAb + rows * 4.0 + rows * kFb;
  auto restore = [&]() -> absl::Status {
    TY_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(logits.get(), pristine.get(), rows * v * kAb,
                                            cudaMemcpyDeviceToDevice, ctx.stream));
    return absl::OkStatus();
  };
  return Measure(
      ctx, row,
      [&] {
        return kernels::cuda::SoftmaxCrossEntropy(ctx.stream, kAct, logits.get(), targets.i32(),
                                                  rows, v, v, 1.0f / rows, /*write_grad=*/true,
                                                  losses.f32());
      },
      restore);
}

// The residual stream's update, in place: x += y over every activation of a batch.
absl::Status ResidualAdd(const BenchModel& m, const CaseContext& ctx, Row* row) {
  const int64_t rows = m.batch * m.seq, c = m.config.width, n = rows * c;
  row->shape = absl::StrCat(rows, " x ", c);
  TY_ASSIGN_OR_RETURN(DeviceBuffer x, Act(ctx, n, 17));
  TY_ASSIGN_OR_RETURN(DeviceBuffer y, Act(ctx, n, 18));
  row->bytes = 3.0 * n * kAb;  // x and y in, x out
  return Measure(
      ctx, row, [&] { return kernels::cuda::Add(ctx.stream, kAct, x.get(), x.get(), y.get(), n); });
}

// A block weight's bf16 copy for the tensor cores (the MLP's first matrix), from its fp32
// master.
absl::Status WeightConvert(const BenchModel& m, const CaseContext& ctx, Row* row) {
  const int64_t c = m.config.width, f = m.config.ffn_hidden;
  const int64_t n = c * (m.config.family == config::ModelFamily::kGpt2 ? f : 2 * f);
  row->shape = absl::StrCat(n / c, " x ", c, " fp32 -> bf16");
  TY_ASSIGN_OR_RETURN(DeviceBuffer w, Floats(ctx, n, 19, 0.02f));
  TY_ASSIGN_OR_RETURN(DeviceBuffer copy, DeviceBuffer::Create(n * kAb));
  row->bytes = 1.0 * n * (kFb + kAb);
  return Measure(ctx, row, [&] {
    return kernels::cuda::Convert(ctx.stream, kAct, copy.get(), DType::kF32, w.get(), n);
  });
}

// One AdamW step over every parameter of the model, in its own tensor sizes.
absl::Status AdamW(const BenchModel& m, const CaseContext& ctx, Row* row) {
  const worker::ParameterLayout layout(m.config);
  // Each tensor starts on a 256-byte boundary, as separately allocated tensors would.
  auto padded = [](int64_t n) { return (n + 63) / 64 * 64; };
  int64_t total = 0;
  for (const worker::ParamTensor& t : layout.tensors()) total += padded(t.numel);
  row->shape = absl::StrCat(absl::SixDigits(layout.total() / 1e6), "M params, ",
                            layout.tensors().size(), " tensors");
  TY_ASSIGN_OR_RETURN(DeviceBuffer p, Floats(ctx, total, 13, 0.02f));
  TY_ASSIGN_OR_RETURN(DeviceBuffer g, Floats(ctx, total, 14, 0.01f));
  TY_ASSIGN_OR_RETURN(DeviceBuffer mom, Floats(ctx, total, 0, 0.0f));
  TY_ASSIGN_OR_RETURN(DeviceBuffer var, Floats(ctx, total, 0, 0.0f));
  std::vector<kernels::cuda::AdamWTensor> tensors;
  int64_t offset = 0;
  for (const worker::ParamTensor& t : layout.tensors()) {
    tensors.push_back({.param = p.f32() + offset,
                       .grad = g.f32() + offset,
                       .m = mom.f32() + offset,
                       .v = var.f32() + offset,
                       .n = t.numel,
                       .weight_decay = t.decay ? 0.1f : 0.0f});
    offset += padded(t.numel);
  }
  // param, grad, m, v in; param, m, v out.
  row->bytes = 7.0 * layout.total() * kFb;
  const kernels::cuda::AdamWHyper hyper{
      .lr = 3e-4f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .step = 1, .grad_scale = 1.0f};
  return Measure(ctx, row,
                 [&] { return kernels::cuda::MultiTensorAdamW(ctx.stream, tensors, hyper); });
}

// The squares behind the global gradient norm over every tensor of the model (read once).
absl::Status GradNorm(const BenchModel& m, const CaseContext& ctx, Row* row) {
  const worker::ParameterLayout layout(m.config);
  row->shape = absl::StrCat(absl::SixDigits(layout.total() / 1e6), "M params, ",
                            layout.tensors().size(), " tensors");
  TY_ASSIGN_OR_RETURN(DeviceBuffer g, Floats(ctx, layout.total(), 14, 0.01f));
  std::vector<kernels::cuda::SquaresRange> ranges;
  for (const worker::ParamTensor& t : layout.tensors()) {
    ranges.push_back({g.f32() + t.offset, t.numel});
  }
  const int64_t k = static_cast<int64_t>(ranges.size());
  TY_ASSIGN_OR_RETURN(
      DeviceBuffer sums,
      Floats(ctx, 2 * (k + kernels::cuda::SumOfSquaresScratchDoubles(ranges)), 0, 0.0f));
  auto* results = reinterpret_cast<double*>(sums.f32());
  row->bytes = 1.0 * layout.total() * kFb;  // each gradient read once
  return Measure(ctx, row, [&] {
    return kernels::cuda::SumOfSquaresMulti(ctx.stream, ranges, results, results + k);
  });
}

// The token (and, for GPT-2, position) embedding gradient of one batch.
absl::Status EmbeddingBackward(const BenchModel& m, const CaseContext& ctx, Row* row) {
  const int64_t tokens = m.batch * m.seq, c = m.config.width, v = m.config.vocab;
  const bool positions = m.config.family == config::ModelFamily::kGpt2;
  row->shape = absl::StrCat("b", m.batch, " t", m.seq, " c", c, " V", v, positions ? " +pos" : "");
  const std::vector<int32_t> ids = BenchTokens(tokens, v, 15);
  const int64_t distinct = static_cast<int64_t>(std::set<int32_t>(ids.begin(), ids.end()).size());
  TY_ASSIGN_OR_RETURN(DeviceBuffer dout, Act(ctx, tokens * c, 16));
  TY_ASSIGN_OR_RETURN(DeviceBuffer tok, Ids(ids));
  TY_ASSIGN_OR_RETURN(DeviceBuffer dwte, Floats(ctx, v * c, 0, 0.0f));
  TY_ASSIGN_OR_RETURN(DeviceBuffer dwpe, Floats(ctx, positions ? m.seq * c : 0, 0, 0.0f));
  const size_t scratch_bytes = kernels::cuda::EmbeddingBackwardScratchBytes(tokens, v);
  TY_ASSIGN_OR_RETURN(DeviceBuffer scratch,
                      DeviceBuffer::Create(static_cast<int64_t>(scratch_bytes)));
  // dout and ids in; the rows of the distinct tokens (and the position table) out.
  row->bytes = double(tokens) * c * kAb + tokens * 4.0 + double(distinct) * c * kFb +
               (positions ? double(m.seq) * c * kFb : 0.0);
  return Measure(ctx, row, [&] {
    return kernels::cuda::EmbeddingBackward(
        ctx.stream, kAct, dwte.f32(), positions ? dwpe.f32() : nullptr, dout.get(), tok.i32(),
        m.batch, m.seq, c, v, 1.0f, scratch.get(), scratch_bytes);
  });
}

enum class GemmKind { kForward, kForwardBias, kBackwardInput, kBackwardWeight };

// out[m, n] = inp[m, k] · w[n, k]ᵀ (+ bias) and its two backward products: bf16 operands, fp32
// accumulation; the weight gradient accumulates into fp32. `ld`: the row stride of out / dout
// (0: n).
absl::Status GemmCase(int64_t m, int64_t n, int64_t k, GemmKind kind, const CaseContext& ctx,
                      Row* row, int64_t ld = 0) {
  row->shape = absl::StrCat("m", m, " n", n, " k", k, ld != 0 ? absl::StrCat(" ld", ld) : "");
  if (ld == 0) ld = n;
  row->flop = 2.0 * m * n * k;
  switch (kind) {
    case GemmKind::kForward:
    case GemmKind::kForwardBias: {
      const bool bias = kind == GemmKind::kForwardBias;
      TY_ASSIGN_OR_RETURN(DeviceBuffer inp, Act(ctx, m * k, 17));
      TY_ASSIGN_OR_RETURN(DeviceBuffer w, Act(ctx, n * k, 18));
      TY_ASSIGN_OR_RETURN(DeviceBuffer b, Act(ctx, bias ? n : 0, 19));
      TY_ASSIGN_OR_RETURN(DeviceBuffer out, DeviceBuffer::Create(m * ld * kAb));
      return Measure(ctx, row, [&] {
        return ctx.gemm->Forward(ctx.stream, kAct, out.get(), nullptr, inp.get(), w.get(),
                                 bias ? b.get() : nullptr, m, n, k,
                                 bias ? GemmEpilogue::kBias : GemmEpilogue::kNone, ld);
      });
    }
    case GemmKind::kBackwardInput: {
      TY_ASSIGN_OR_RETURN(DeviceBuffer dout, Act(ctx, m * ld, 20));
      TY_ASSIGN_OR_RETURN(DeviceBuffer w, Act(ctx, n * k, 18));
      TY_ASSIGN_OR_RETURN(DeviceBuffer dinp, DeviceBuffer::Create(m * k * kAb));
      return Measure(ctx, row, [&] {
        return ctx.gemm->BackwardInput(ctx.stream, kAct, dinp.get(), dout.get(), w.get(), m, n, k,
                                       ld);
      });
    }
    case GemmKind::kBackwardWeight: {
      TY_ASSIGN_OR_RETURN(DeviceBuffer dout, Act(ctx, m * ld, 20));
      TY_ASSIGN_OR_RETURN(DeviceBuffer inp, Act(ctx, m * k, 17));
      TY_ASSIGN_OR_RETURN(DeviceBuffer dw, Floats(ctx, n * k, 0, 0.0f));
      return Measure(ctx, row, [&] {
        return ctx.gemm->BackwardWeight(ctx.stream, kAct, dw.f32(), dout.get(), inp.get(), m, n, k);
      });
    }
  }
  return absl::InternalError("unknown GEMM kind");
}

// An activation [rows, cols] quantized as an FP8 linear layer's forward and weight gradient
// need it: its amax, then the E4M3 codes and their transpose.
absl::Status Fp8Quantize(int64_t rows, int64_t cols, const CaseContext& ctx, Row* row) {
  namespace kc = kernels::cuda;
  row->shape = absl::StrCat(rows, " x ", cols, " bf16 -> e4m3 +T");
  row->bytes = double(rows) * cols * (2 * kAb + 2);
  TY_ASSIGN_OR_RETURN(DeviceBuffer x, Act(ctx, rows * cols, 21));
  TY_ASSIGN_OR_RETURN(DeviceBuffer codes, DeviceBuffer::Create(rows * cols));
  TY_ASSIGN_OR_RETURN(DeviceBuffer codes_t, DeviceBuffer::Create(rows * cols));
  TY_ASSIGN_OR_RETURN(DeviceBuffer scalars, Floats(ctx, 2, 0, 0.0f));  // amax, scale_inv
  return Measure(ctx, row, [&]() -> absl::Status {
    TY_RETURN_IF_ERROR(kc::AbsMax(ctx.stream, kAct, x.get(), rows * cols, scalars.f32()));
    return kc::QuantizeFp8(ctx.stream, kAct, kernels::Fp8Format::kE4M3, x.get(), rows, cols,
                           scalars.f32(), codes.get(), codes_t.get(), scalars.f32() + 1);
  });
}

// out[m, n] = inp[m, k] · w[n, k]ᵀ (+ bias) from E4M3 codes of both (quantized before the timed
// runs), into bf16 with fast accumulation: an FP8 linear layer's forward product.
absl::Status Fp8GemmCase(int64_t m, int64_t n, int64_t k, bool bias, const CaseContext& ctx,
                         Row* row) {
  namespace kc = kernels::cuda;
  constexpr kernels::Fp8Format kE4M3 = kernels::Fp8Format::kE4M3;
  row->shape = absl::StrCat("m", m, " n", n, " k", k, " e4m3");
  row->flop = 2.0 * m * n * k;
  TY_ASSIGN_OR_RETURN(DeviceBuffer inp, Act(ctx, m * k, 17));
  TY_ASSIGN_OR_RETURN(DeviceBuffer w, Act(ctx, n * k, 18));
  TY_ASSIGN_OR_RETURN(DeviceBuffer b, Act(ctx, bias ? n : 0, 19));
  TY_ASSIGN_OR_RETURN(DeviceBuffer a8, DeviceBuffer::Create(m * k));
  TY_ASSIGN_OR_RETURN(DeviceBuffer w8, DeviceBuffer::Create(n * k));
  TY_ASSIGN_OR_RETURN(DeviceBuffer scalars, Floats(ctx, 4, 0, 0.0f));  // amax, scale_inv × 2
  TY_ASSIGN_OR_RETURN(DeviceBuffer out, DeviceBuffer::Create(m * n * kAb));
  float* f = scalars.f32();
  TY_RETURN_IF_ERROR(kc::AbsMax(ctx.stream, kAct, inp.get(), m * k, f));
  TY_RETURN_IF_ERROR(
      kc::QuantizeFp8(ctx.stream, kAct, kE4M3, inp.get(), m, k, f, a8.get(), nullptr, f + 1));
  TY_RETURN_IF_ERROR(kc::AbsMax(ctx.stream, kAct, w.get(), n * k, f + 2));
  TY_RETURN_IF_ERROR(
      kc::QuantizeFp8(ctx.stream, kAct, kE4M3, w.get(), n, k, f + 2, w8.get(), nullptr, f + 3));
  return Measure(ctx, row, [&] {
    return ctx.gemm->Fp8(ctx.stream, out.get(), kAct, a8.get(), kE4M3, f + 1, w8.get(), kE4M3,
                         f + 3, m, n, k, bias ? b.get() : nullptr, /*fast_accum=*/true);
  });
}

// A mixture of experts' linear over its experts' rows: 8 experts, each of `tokens` tokens routed
// to 2, the picks spread unevenly (expert j takes a share ∝ j + 1), each expert its own [n, k]
// weight; the forward product or the fp32-accumulated weight gradient. As one grouped GEMM, or
// (`one_by_one`) one GEMM per expert. The pointer arrays are uploaded before the timing.
absl::Status ExpertsGemm(int64_t tokens, int64_t n, int64_t k, bool weight_grad, bool one_by_one,
                         const CaseContext& ctx, Row* row) {
  namespace kc = kernels::cuda;
  constexpr int kExperts = 8, kTopK = 2;
  const int64_t picks = tokens * kTopK;
  std::vector<int64_t> m(kExperts);
  int64_t given = 0;
  for (int j = 0; j < kExperts; ++j)
    given += m[j] = picks * (j + 1) / (kExperts * (kExperts + 1) / 2);
  m.back() += picks - given;
  row->shape = absl::StrCat("E", kExperts, " m", picks, " n", n, " k", k);
  row->flop = 2.0 * picks * n * k;
  // Forward: out [picks, n] = x [picks, k] · w_jᵀ; weight gradient: dw_j [n, k] += dout_jᵀ · x_j.
  TY_ASSIGN_OR_RETURN(DeviceBuffer x, Act(ctx, picks * k, 21));
  TY_ASSIGN_OR_RETURN(DeviceBuffer w, Act(ctx, kExperts * n * k, 22));
  TY_ASSIGN_OR_RETURN(DeviceBuffer dout, Act(ctx, picks * n, 23));
  TY_ASSIGN_OR_RETURN(DeviceBuffer out, DeviceBuffer::Create(picks * n * kAb));
  TY_ASSIGN_OR_RETURN(DeviceBuffer dw, Floats(ctx, kExperts * n * k, 0, 0.0f));
  auto* x0 = static_cast<char*>(x.get());
  std::vector<void*> outs;
  std::vector<const void*> xs, ys;
  int64_t r0 = 0;
  for (int j = 0; j < kExperts; ++j) {
    if (weight_grad) {
      outs.push_back(dw.f32() + j * n * k);
      xs.push_back(static_cast<char*>(dout.get()) + r0 * n * kAb);
      ys.push_back(x0 + r0 * k * kAb);
    } else {
      outs.push_back(static_cast<char*>(out.get()) + r0 * n * kAb);
      xs.push_back(x0 + r0 * k * kAb);
      ys.push_back(static_cast<char*>(w.get()) + j * n * k * kAb);
    }
    r0 += m[j];
  }
  kc::GemmGroup group{.kind = weight_grad ? kc::GemmKind::kBackwardWeight : kc::GemmKind::kForward,
                      .count = kExperts,
                      .m = m.data(),
                      .out = outs.data(),
                      .x = xs.data(),
                      .y = ys.data()};
  const std::vector<const void*> words = kc::GroupPointers(group);
  TY_ASSIGN_OR_RETURN(DeviceBuffer device,
                      DeviceBuffer::Create(static_cast<int64_t>(words.size() * sizeof(void*))));
  TY_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(device.get(), words.data(), words.size() * sizeof(void*), cudaMemcpyHostToDevice));
  group.device = static_cast<const void* const*>(device.get());
  TY_RETURN_IF_ERROR(Measure(ctx, row, [&]() -> absl::Status {
    if (!one_by_one) return ctx.gemm->Grouped(ctx.stream, kAct, group, n, k);
    for (int j = 0; j < kExperts; ++j) {
      TY_RETURN_IF_ERROR(kc::gemm_args::RunOne(*ctx.gemm, ctx.stream, kAct, group, j, n, k));
    }
    return absl::OkStatus();
  }));
  // A grouped row that cuBLAS refused timed the products one by one: say so beside its shape.
  if (!one_by_one && ctx.gemm->GroupedOneByOne(group.kind, kAct)) {
    absl::StrAppend(&row->shape, " (no grouped GEMM: one by one)");
  }
  return absl::OkStatus();
}

}  // namespace

// Attention alone at head dim 128: 32 query heads over 8 key/value heads, 2 × 4096 tokens.
config::ModelConfig AttentionD128() {
  config::ModelConfig c = *config::Preset("llama-1b");
  c.heads = 32;
  c.kv_heads = 8;
  c.width = 32 * 128;
  c.max_seq = 4096;
  return c;
}

std::vector<BenchModel> BenchModels() {
  return {
      BenchModel{
          .name = "gpt2-124m", .config = *config::Preset("gpt2-124m"), .batch = 16, .seq = 1024},
      BenchModel{
          .name = "llama-1b", .config = *config::Preset("llama-1b"), .batch = 4, .seq = 2048},
      BenchModel{.name = "attn-d128",
                 .config = AttentionD128(),
                 .batch = 2,
                 .seq = 4096,
                 .attention_only = true},
  };
}

std::vector<Case> CasesFor(const BenchModel& model) {
  using X = const CaseContext&;
  const BenchModel m = model;
  const bool gpt2 = m.config.family == config::ModelFamily::kGpt2;
  const int64_t rows = m.batch * m.seq, c = m.config.width, v = m.config.vocab;
  // The MLP's first linear: [f, c] for GPT-2 (with bias), [2f, c] (gate and up) for Llama.
  const int64_t fc_out = gpt2 ? m.config.ffn_hidden : 2 * int64_t{m.config.ffn_hidden};
  const GemmKind fc_forward = gpt2 ? GemmKind::kForwardBias : GemmKind::kForward;
  const std::string norm = gpt2 ? "layernorm" : "rmsnorm";
  const AttentionVariant plain, atomic{.dq_sum = kernels::cuda::AttentionDqSum::kAtomic};
  std::vector<Case> cases = {
      {"attention fwd", [=](X x, Row* r) { return Attention(m, Pass::kForward, plain, x, r); }},
      {"attention bwd", [=](X x, Row* r) { return Attention(m, Pass::kBackward, plain, x, r); }},
      {"attention fwd+bwd", [=](X x, Row* r) { return Attention(m, Pass::kBoth, plain, x, r); }},
      {"attention bwd atomic-dq",
       [=](X x, Row* r) { return Attention(m, Pass::kBackward, atomic, x, r); }},
      {"attention fwd+bwd atomic-dq",
       [=](X x, Row* r) { return Attention(m, Pass::kBoth, atomic, x, r); }},
      {"attention fwd+bwd softcap",
       [=](X x, Row* r) { return Attention(m, Pass::kBoth, {.softcap = 50.0f}, x, r); }},
  };
  if (m.config.head_dim() <= 64) {  // the default there is 32 rows per warp; 16 for comparison
    const AttentionVariant rows16{.warp_rows = 16};
    cases.push_back({"attention fwd warp-rows16",
                     [=](X x, Row* r) { return Attention(m, Pass::kForward, rows16, x, r); }});
  }
  if (m.attention_only) return cases;
  cases.push_back({norm + " fwd+bwd", [m, gpt2](X x, Row* r) { return Norm(m, gpt2, x, r); }});
  if (gpt2) {
    cases.push_back({"gelu fwd+bwd", [m](X x, Row* r) { return Gelu(m, x, r); }});
  } else {
    cases.push_back({"swiglu fwd+bwd", [m](X x, Row* r) { return Swiglu(m, x, r); }});
  }
  cases.push_back({"cross-entropy fwd+bwd", [m](X x, Row* r) { return CrossEntropy(m, x, r); }});
  cases.push_back({"residual add", [m](X x, Row* r) { return ResidualAdd(m, x, r); }});
  cases.push_back({"weight convert", [m](X x, Row* r) { return WeightConvert(m, x, r); }});
  // The optimizer over GPT-2 124M's parameters, and their gradient norm.
  if (gpt2) cases.push_back({"adamw step", [m](X x, Row* r) { return AdamW(m, x, r); }});
  if (gpt2) cases.push_back({"grad norm", [m](X x, Row* r) { return GradNorm(m, x, r); }});
  cases.push_back({"embedding bwd", [m](X x, Row* r) { return EmbeddingBackward(m, x, r); }});
  cases.push_back(
      {"gemm fc fwd", [=](X x, Row* r) { return GemmCase(rows, fc_out, c, fc_forward, x, r); }});
  cases.push_back({"gemm fc bwd-input", [=](X x, Row* r) {
                     return GemmCase(rows, fc_out, c, GemmKind::kBackwardInput, x, r);
                   }});
  cases.push_back({"gemm fc bwd-weight", [=](X x, Row* r) {
                     return GemmCase(rows, fc_out, c, GemmKind::kBackwardWeight, x, r);
                   }});
  // The same forward product in FP8 (sm_89 and later; GPT-2's bias in the epilogue), and an
  // activation of the fc layer's input quantized for it.
  cases.push_back({"gemm fc fwd fp8", [=](X x, Row* r) {
                     return Fp8GemmCase(rows, fc_out, c, fc_forward == GemmKind::kForwardBias, x,
                                        r);
                   }});
  cases.push_back({"fp8 quantize", [=](X x, Row* r) { return Fp8Quantize(rows, c, x, r); }});
  // A mixture of experts' fc layer with this model's shapes (8 experts, top 2): grouped, and one
  // GEMM per expert as a comparison (the same PyTorch row, a loop over the experts, is the peer).
  if (gpt2) {
    for (const bool weight_grad : {false, true}) {
      for (const bool one_by_one : {false, true}) {
        const std::string name = absl::StrCat("gemm experts ", weight_grad ? "bwd-weight" : "fwd",
                                              one_by_one ? " one-by-one" : "");
        cases.push_back({name, [=](X x, Row* r) {
                           return ExpertsGemm(rows, fc_out, c, weight_grad, one_by_one, x, r);
                         }});
      }
    }
  }
  // The LM head at the logical vocabulary and, where that is not a multiple of 128, rounded up
  // to one (as llm.c pads GPT-2's 50257 to 50304), and at the logical vocabulary with the
  // logits' rows padded alone (ld128, Trainyard only): what each form of padding would buy.
  const int64_t padded = (v + 127) / 128 * 128;
  struct Head {
    std::string name;
    int64_t vocab, ld;
  };
  std::vector<Head> heads = {{"gemm lm-head ", v, 0}};
  if (padded != v) {
    heads.push_back({"gemm lm-head-pad128 ", padded, 0});
    heads.push_back({"gemm lm-head-ld128 ", v, padded});
  }
  for (const Head& head : heads) {
    for (auto [kind, label] :
         {std::pair{GemmKind::kForward, "fwd"}, std::pair{GemmKind::kBackwardInput, "bwd-input"},
          std::pair{GemmKind::kBackwardWeight, "bwd-weight"}}) {
      cases.push_back({head.name + label, [=](X x, Row* r) {
                         return GemmCase(m.ce_rows, head.vocab, c, kind, x, r, head.ld);
                       }});
    }
  }
  return cases;
}

}  // namespace trainyard::bench
