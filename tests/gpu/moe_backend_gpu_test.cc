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
#include <vector>

#include "gtest/gtest.h"
#include "tests/gpu/device_tensor.h"
#include "tests/gpu/gpu_test_util.h"
#include "worker/backend.h"
#include "worker/cuda_backend.h"

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
  auto read_act = [&](const Buffer<Act>& b) {
    std::vector<float> host(b.size());
    be.CopyActToHost(host.data(), b.data(), b.size());
    return host;
  };
  auto read_f32 = [&](const Buffer<float>& b) {
    std::vector<float> host(b.size());
    be.CopyToHost(host.data(), b.data(), b.size());
    return host;
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

  return Outputs{read_f32(logits), read_act(gathered), read_act(combined), read_act(combined_plain),
                 read_f32(dots),   read_act(dx),       read_f32(drouter_w)};
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

INSTANTIATE_TEST_SUITE_P(ActTypes, MoeBackendOnGpu, ::testing::Values(DType::kF32, DType::kBF16),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return std::string(DTypeName(info.param));
                         });

}  // namespace
}  // namespace trainyard::worker
