// The CUDA backend's mixture-of-experts operations against the CPU backend's, through the Backend
// interface: the router's logits and their backward, tokens gathered into expert rows, combined
// back (weighted and accumulated, or plain and overwritten, with dropped slots), and per-row dot
// products, on one small routed batch. The kernels' own shapes and edge cases are in
// moe_test.cc; this checks that each operation reaches its kernel with the right arguments.
//
// Tolerances: both backends see the same inputs (rounded to bf16 when the CUDA backend stores
// activations as bf16). Outputs that the CUDA backend stores as activations are within
// Tolerance(act) of the CPU's; fp32 outputs (logits, dot products, the router's weight
// gradient) within Tolerance(kF32).
#include <cstdint>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "tests/gpu/device_tensor.h"
#include "tests/gpu/gpu_test_util.h"
#include "worker/backend.h"
#include "worker/cuda_backend.h"

#if TRAINYARD_CUDA_EMU
namespace trainyard::emu {
int64_t Launches();  // tools/cuda_emu/emu.h: the kernels the calling thread launched
}  // namespace trainyard::emu
#endif

namespace trainyard::worker {
namespace {

using ::trainyard::testing::RandomActivation;
using ::trainyard::testing::RandomVector;
using ::trainyard::testing::RelativeError;
using ::trainyard::testing::Tolerance;

// 48 tokens of width 100 (not a multiple of the warp), 8 experts, top-2 routing into 80 expert
// rows: some tokens keep both choices, some one, token 0 none.
constexpr int64_t kTokens = 48, kWidth = 100, kExperts = 8, kTopK = 2, kExpertRows = 80;

struct Inputs {
  std::vector<float> x, router_w, expert_out, residual, dy, dlogits, dx0, drouter_w0;
  std::vector<int32_t> rows, slots;  // rows: expert row → token; slots: (token, j) → expert row
  std::vector<float> gather_scale, combine_weights;
};

Inputs MakeInputs(DType act, std::mt19937& rng) {
  Inputs in;
  in.x = RandomActivation(kTokens * kWidth, act, rng);
  in.router_w = RandomVector(kExperts * kWidth, rng, 0.05f);
  in.expert_out = RandomActivation(kExpertRows * kWidth, act, rng);
  in.residual = RandomActivation(kTokens * kWidth, act, rng);
  in.dy = RandomActivation(kExpertRows * kWidth, act, rng);
  in.dlogits = RandomVector(kTokens * kExperts, rng, 0.1f);
  in.dx0 = RandomActivation(kTokens * kWidth, act, rng);
  in.drouter_w0 = RandomVector(kExperts * kWidth, rng);
  in.gather_scale = RandomVector(kExpertRows, rng, 0.5f);
  in.combine_weights = RandomVector(kTokens * kTopK, rng, 0.5f);
  in.slots.assign(kTokens * kTopK, -1);
  in.rows.assign(kExpertRows, 0);
  std::uniform_int_distribution<int64_t> slot(2, kTokens * kTopK - 1);
  for (int64_t r = 0; r < kExpertRows; ++r) {
    int64_t s = slot(rng);
    while (in.slots[s] >= 0) s = s + 1 < kTokens * kTopK ? s + 1 : 2;
    in.slots[s] = static_cast<int32_t>(r);
    in.rows[r] = static_cast<int32_t>(s / kTopK);
  }
  return in;
}

// A backend buffer's values on the host.
std::vector<float> ReadAct(Backend& be, const Buffer<Act>& b) {
  std::vector<float> host(b.size());
  be.CopyActToHost(host.data(), b.data(), b.size());
  return host;
}
std::vector<float> ReadF32(Backend& be, const Buffer<float>& b) {
  std::vector<float> host(b.size());
  be.CopyToHost(host.data(), b.data(), b.size());
  return host;
}

struct Outputs {
  std::vector<float> logits, gathered, combined, combined_plain, dots, dx, drouter_w;
};

// Every operation once on `be`, from the same host inputs.
Outputs RunAll(Backend& be, const Inputs& in) {
  auto act = [&](const std::vector<float>& host) {
    Buffer<Act> b = be.AllocAct(static_cast<int64_t>(host.size()));
    be.CopyActFromHost(b.data(), host.data(), static_cast<int64_t>(host.size()));
    return b;
  };
  auto f32 = [&](const std::vector<float>& host) {
    Buffer<float> b = be.AllocFloat(static_cast<int64_t>(host.size()));
    be.CopyFromHost(b.data(), host.data(), static_cast<int64_t>(host.size()));
    return b;
  };
  auto ints = [&](const std::vector<int32_t>& host) {
    Buffer<int32_t> b = be.AllocInt(static_cast<int64_t>(host.size()));
    be.CopyFromHost(b.data(), host.data(), static_cast<int64_t>(host.size()));
    return b;
  };

  Buffer<Act> x = act(in.x), expert_out = act(in.expert_out), dy = act(in.dy);
  Buffer<Act> combined = act(in.residual), combined_plain = act(in.residual), dx = act(in.dx0);
  Buffer<Act> gathered = be.AllocAct(kExpertRows * kWidth);
  Buffer<float> router_w = f32(in.router_w), dlogits = f32(in.dlogits);
  Buffer<float> drouter_w = f32(in.drouter_w0), scale = f32(in.gather_scale);
  Buffer<float> weights = f32(in.combine_weights);
  Buffer<float> logits = be.AllocFloat(kTokens * kExperts), dots = be.AllocFloat(kExpertRows);
  Buffer<int32_t> rows = ints(in.rows), slots = ints(in.slots);

  be.LinearF32(logits.data(), x.data(), router_w.data(), kTokens, kExperts, kWidth);
  be.GatherRows(gathered.data(), x.data(), rows.data(), scale.data(), kExpertRows, kWidth);
  be.CombineRows(combined.data(), expert_out.data(), slots.data(), weights.data(), kTokens, kTopK,
                 kWidth, /*accumulate=*/true);
  be.CombineRows(combined_plain.data(), expert_out.data(), slots.data(), nullptr, kTokens, kTopK,
                 kWidth, /*accumulate=*/false);
  // ⟨token row of x, expert row's gradient⟩: the gate's gradient in a routed layer's backward.
  be.RowDots(dots.data(), x.data(), rows.data(), dy.data(), kExpertRows, kWidth);
  be.LinearF32Backward(dx.data(), drouter_w.data(), dlogits.data(), x.data(), router_w.data(),
                       kTokens, kExperts, kWidth);
  EXPECT_TRUE(be.Synchronize().ok());

  return Outputs{ReadF32(be, logits),         ReadAct(be, gathered), ReadAct(be, combined),
                 ReadAct(be, combined_plain), ReadF32(be, dots),     ReadAct(be, dx),
                 ReadF32(be, drouter_w)};
}

class MoeBackendOnGpu : public ::testing::TestWithParam<DType> {};

TEST_P(MoeBackendOnGpu, MatchesCpuBackend) {
  TY_SKIP_WITHOUT_GPU();
  const DType act = GetParam();
  std::mt19937 rng(41);
  const Inputs in = MakeInputs(act, rng);
  auto cpu = MakeCpuBackend(0);
  auto gpu = MakeCudaBackend({.device = 0, .act_dtype = act});
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  const Outputs want = RunAll(*cpu, in);
  const Outputs got = RunAll(**gpu, in);

  const double f32_tol = Tolerance(DType::kF32), act_tol = Tolerance(act);
  EXPECT_LE(RelativeError(got.logits, want.logits), f32_tol) << "LinearF32";
  EXPECT_LE(RelativeError(got.gathered, want.gathered), act_tol) << "GatherRows";
  EXPECT_LE(RelativeError(got.combined, want.combined), act_tol) << "CombineRows, accumulate";
  EXPECT_LE(RelativeError(got.combined_plain, want.combined_plain), act_tol) << "CombineRows";
  EXPECT_LE(RelativeError(got.dots, want.dots), f32_tol) << "RowDots";
  EXPECT_LE(RelativeError(got.dx, want.dx), act_tol) << "LinearF32Backward dinp";
  EXPECT_LE(RelativeError(got.drouter_w, want.drouter_w), f32_tol) << "LinearF32Backward dweight";
}

// The experts' MLPs (Backend::ExpertsForward / ExpertsBackward): five experts over 45 rows, the
// second and the last with none, GELU experts with biases and SwiGLU ones without. The CUDA
// backend runs each GEMM as one grouped call over the experts when their weights are usable in
// place (fp32) or kept converted (bf16, `keep`); unkept bf16 weights run one expert at a time.
// Both ways match the CPU backend; the weight gradients accumulate onto existing values.
struct ExpertsCase {
  bool gated;
  bool keep;  // register the bf16 weight copies (KeepWeightCopy), as a rank without ZeRO-3 does
  bool geglu = false;  // a gated unit's gate: GELU (Gemma's), else SiLU
};

struct ExpertsRun {
  std::vector<float> hidden, act, out, din, dfc_w, dfc_b, dproj_w, dproj_b;
  int64_t forward_launches = -1, backward_launches = -1;  // on the emulated device
};

struct ExpertShape {
  std::vector<int64_t> offsets;  // each expert's first row, then the rows in all
  int64_t width, ffn;
};
const ExpertShape kExpertShape{{0, 7, 7, 20, 45, 45}, 40, 24};

ExpertsRun RunExperts(Backend& be, const ExpertsCase& c, DType act_type, bool keep,
                      const ExpertShape& shape = kExpertShape) {
  const std::vector<int64_t>& offsets = shape.offsets;
  const int64_t experts = static_cast<int64_t>(offsets.size()) - 1;
  const int64_t rows = offsets.back(), width = shape.width, ffn = shape.ffn;
  const int64_t fc = c.gated ? 2 * ffn : ffn;
  std::mt19937 rng(77);
  auto f32 = [&](int64_t n, float scale) {
    std::vector<float> host = RandomVector(n, rng, scale);
    Buffer<float> b = be.AllocFloat(n);
    be.CopyFromHost(b.data(), host.data(), n);
    return b;
  };
  auto act = [&](int64_t n) {
    std::vector<float> host = RandomActivation(n, act_type, rng);
    Buffer<Act> b = be.AllocAct(n);
    be.CopyActFromHost(b.data(), host.data(), n);
    return b;
  };
  Buffer<float> fc_w = f32(experts * fc * width, 0.2f), proj_w = f32(experts * width * ffn, 0.2f);
  Buffer<float> fc_b = f32(experts * fc, 0.5f), proj_b = f32(experts * width, 0.5f);
  Buffer<float> dfc_w = f32(experts * fc * width, 1.0f), dproj_w = f32(experts * width * ffn, 1.0f);
  Buffer<float> dfc_b = f32(experts * fc, 1.0f), dproj_b = f32(experts * width, 1.0f);
  Buffer<Act> in = act(rows * width), dout = act(rows * width);
  Buffer<Act> hidden = be.AllocAct(rows * fc), a = be.AllocAct(rows * ffn);
  Buffer<Act> out = be.AllocAct(rows * width), din = be.AllocAct(rows * width);
  Buffer<Act> dact = be.AllocAct(rows * ffn), dhidden = be.AllocAct(rows * fc);
  if (keep) {
    for (int64_t j = 0; j < experts; ++j) {
      be.KeepWeightCopy(fc_w.data() + j * fc * width, fc * width);
      be.KeepWeightCopy(proj_w.data() + j * width * ffn, width * ffn);
    }
  }
  const ExpertMlp mlp{.offsets = offsets,
                      .width = width,
                      .ffn = ffn,
                      .gated = c.gated,
                      .gate = kernels::GluGateOf(c.geglu),
                      .fc_w = fc_w.data(),
                      .fc_b = c.gated ? nullptr : fc_b.data(),
                      .proj_w = proj_w.data(),
                      .proj_b = c.gated ? nullptr : proj_b.data()};
  const ExpertMlpGrads grads{.fc_w = dfc_w.data(),
                             .fc_b = c.gated ? nullptr : dfc_b.data(),
                             .proj_w = dproj_w.data(),
                             .proj_b = c.gated ? nullptr : dproj_b.data()};
  ExpertsRun run;
  // Once to convert the kept copies (the forward overwrites its outputs), then counted.
  be.ExpertsForward(mlp, in.data(), hidden.data(), a.data(), out.data());
#if TRAINYARD_CUDA_EMU
  const int64_t before = emu::Launches();
#endif
  be.ExpertsForward(mlp, in.data(), hidden.data(), a.data(), out.data());
#if TRAINYARD_CUDA_EMU
  run.forward_launches = emu::Launches() - before;
#endif
#if TRAINYARD_CUDA_EMU
  const int64_t backward_from = emu::Launches();
#endif
  be.ExpertsBackward(mlp, grads, dout.data(), in.data(), hidden.data(), a.data(), dact.data(),
                     dhidden.data(), din.data());
#if TRAINYARD_CUDA_EMU
  run.backward_launches = emu::Launches() - backward_from;
#endif
  EXPECT_TRUE(be.Synchronize().ok());
  run.hidden = ReadAct(be, hidden);
  run.act = ReadAct(be, a);
  run.out = ReadAct(be, out);
  run.din = ReadAct(be, din);
  run.dfc_w = ReadF32(be, dfc_w);
  run.dproj_w = ReadF32(be, dproj_w);
  if (!c.gated) {
    run.dfc_b = ReadF32(be, dfc_b);
    run.dproj_b = ReadF32(be, dproj_b);
  }
  return run;
}

class ExpertsOnGpu : public ::testing::TestWithParam<std::tuple<ExpertsCase, DType>> {};

TEST_P(ExpertsOnGpu, MatchCpuBackend) {
  TY_SKIP_WITHOUT_GPU();
  const auto [c, act] = GetParam();
  auto cpu = MakeCpuBackend(0);
  auto gpu = MakeCudaBackend({.device = 0, .act_dtype = act});
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  const ExpertsRun want = RunExperts(*cpu, c, act, false);
  const ExpertsRun got = RunExperts(**gpu, c, act, c.keep);
  const double tol = Tolerance(act);
  EXPECT_LE(RelativeError(got.hidden, want.hidden), tol) << "hidden";
  EXPECT_LE(RelativeError(got.act, want.act), tol) << "activation";
  EXPECT_LE(RelativeError(got.out, want.out), tol) << "out";
  EXPECT_LE(RelativeError(got.din, want.din), 2 * tol) << "input gradient";
  EXPECT_LE(RelativeError(got.dfc_w, want.dfc_w), tol) << "fc weight gradient";
  EXPECT_LE(RelativeError(got.dproj_w, want.dproj_w), tol) << "proj weight gradient";
  EXPECT_LE(RelativeError(got.dfc_b, want.dfc_b), tol) << "fc bias gradient";
  EXPECT_LE(RelativeError(got.dproj_b, want.dproj_b), tol) << "proj bias gradient";
#if TRAINYARD_CUDA_EMU
  // Grouped, the kernels are the same few for any number of experts (GEMMs aside: the emulated
  // cuBLAS launches none): the activation and its backward, and GELU experts' two bias adds and
  // two bias-gradient sums (partials, then their sum). One expert at a time, each expert with
  // rows launches its own (3 of 5 here, and bf16 conversions).
  const bool grouped = act == DType::kF32 || c.keep;
  if (grouped) {
    EXPECT_EQ(got.forward_launches, c.gated ? 1 : 3);
    EXPECT_EQ(got.backward_launches, c.gated ? 1 : 5);
  } else {
    EXPECT_GE(got.forward_launches, 3);
  }
#endif
}

// Under FP8 linear layers (CudaBackendOptions::fp8_linear) the experts stay in bf16 both ways
// they run, grouped (kept copies) and one at a time (converted weights, through Linear): the
// bf16 backend's bits, with shapes FP8 would otherwise take (every size a multiple of 16).
TEST(ExpertsOnGpuFp8, StayInBf16) {
  TY_SKIP_WITHOUT_GPU();
  auto bf16 = MakeCudaBackend({});
  auto fp8 = MakeCudaBackend({.fp8_linear = true});
  ASSERT_TRUE(bf16.ok() && fp8.ok());
  const ExpertShape shape{{0, 16, 16, 48, 64}, 64, 32};
  for (const bool keep : {true, false}) {
    for (const bool gated : {false, true}) {
      const ExpertsCase c{gated, keep};
      const ExpertsRun want = RunExperts(**bf16, c, DType::kBF16, keep, shape);
      const ExpertsRun got = RunExperts(**fp8, c, DType::kBF16, keep, shape);
      const std::string what = std::string(gated ? "swiglu" : "gelu") + (keep ? " kept" : "");
      EXPECT_EQ(got.out, want.out) << what;
      EXPECT_EQ(got.din, want.din) << what;
      EXPECT_EQ(got.dfc_w, want.dfc_w) << what;
      EXPECT_EQ(got.dproj_w, want.dproj_w) << what;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Kinds, ExpertsOnGpu,
    ::testing::Combine(::testing::Values(ExpertsCase{false, true}, ExpertsCase{true, true},
                                         ExpertsCase{false, false}, ExpertsCase{true, false},
                                         ExpertsCase{true, true, true}),
                       ::testing::Values(DType::kF32, DType::kBF16)),
    [](const auto& info) {
      const ExpertsCase c = std::get<0>(info.param);
      return std::string(c.geglu   ? "geglu"
                         : c.gated ? "swiglu"
                                   : "gelu") +
             (c.keep ? "_kept_" : "_converted_") + DTypeName(std::get<1>(info.param));
    });

INSTANTIATE_TEST_SUITE_P(ActTypes, MoeBackendOnGpu, ::testing::Values(DType::kF32, DType::kBF16),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return std::string(DTypeName(info.param));
                         });

}  // namespace
}  // namespace trainyard::worker
