// The CUDA mixture-of-experts kernels against the CPU reference (kernels/cpu/moe.h, and
// LinearForward for the router's logits): gathers with and without scales, combines with
// skipped slots, with and without weights, overwriting and accumulating, per-row dot products,
// the router's fp32 linear layer and its accumulating backward, the shared experts' gate and its
// backward; run-to-run determinism; empty inputs; argument checks.
//
// Tolerances: a gather is one multiplication rounded once, so it must match the reference
// rounded to the storage type bit for bit. Outputs stored as activations (combined rows, the
// router's input gradient) round to the storage type: Tolerance(dtype). Outputs kept in fp32
// (dot products, logits, the router's weight gradient) come from the same rounded inputs as the
// reference, whatever the activations' storage type: Tolerance(kF32).
#include "kernels/cuda/moe.h"

#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/moe.h"
#include "tests/gpu/device_tensor.h"
#include "tests/gpu/gpu_test_util.h"

namespace trainyard::kernels::cuda {
namespace {

using ::trainyard::testing::DeviceInts;
using ::trainyard::testing::DeviceTensor;
using ::trainyard::testing::RandomActivation;
using ::trainyard::testing::RandomVector;
using ::trainyard::testing::RelativeError;
using ::trainyard::testing::RoundToBf16;
using ::trainyard::testing::Tolerance;

constexpr DType kDTypes[] = {DType::kF32, DType::kBF16};
constexpr DType kF32 = DType::kF32;
const double kF32Tolerance = Tolerance(DType::kF32);

bool BitsEqual(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// `n` indices drawn from [0, bound), repeats allowed (two tokens may pick the same expert row).
std::vector<int32_t> RandomIndices(int64_t n, int64_t bound, std::mt19937& rng) {
  std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(bound - 1));
  std::vector<int32_t> v(n);
  for (int32_t& x : v) x = pick(rng);
  return v;
}

// Router-like combine weights in (0, 1].
std::vector<float> RandomWeights(int64_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> w(0.05f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = w(rng);
  return v;
}

// A tensor that may be empty: no device memory and a null pointer then, as a caller with nothing
// to route would pass.
const int32_t* IntsOrNull(const std::vector<int32_t>& host, std::unique_ptr<DeviceInts>& keep) {
  if (host.empty()) return nullptr;
  keep = std::make_unique<DeviceInts>(host);
  return keep->get();
}

// Gather: `count` rows of `cols` picked from `inp_rows`. Shapes: a single element; widths that
// are not multiples of the warp (33, 100, 1030); more rows than the input holds (repeats); none.
struct GatherShape {
  int64_t count, cols, inp_rows;
};
constexpr GatherShape kGatherShapes[] = {
    {1, 1, 1}, {5, 33, 3}, {37, 100, 64}, {300, 1030, 40}, {0, 64, 8}};

// in_order: no row indices (row r of the input for output row r: the rows scaled in place).
void CheckGather(DType dtype, GatherShape s, bool with_scale, bool in_order, std::mt19937& rng) {
  if (in_order) s.inp_rows = s.count;
  const std::vector<float> inp = RandomActivation(s.inp_rows * s.cols, dtype, rng);
  const std::vector<int32_t> rows =
      in_order ? std::vector<int32_t>{} : RandomIndices(s.count, s.inp_rows, rng);
  const std::vector<float> scale = RandomWeights(s.count, rng);
  std::vector<float> want(s.count * s.cols);
  cpu::GatherRows(want.data(), inp.data(), in_order ? nullptr : rows.data(),
                  with_scale ? scale.data() : nullptr, s.count, s.cols);
  if (dtype == DType::kBF16) RoundToBf16(want);

  DeviceTensor d_inp(inp, dtype), d_scale(scale, kF32), d_out(s.count * s.cols, dtype);
  std::unique_ptr<DeviceInts> d_rows;
  const absl::Status status =
      GatherRows(nullptr, dtype, d_out.get(), d_inp.get(), IntsOrNull(rows, d_rows),
                 with_scale ? d_scale.f32() : nullptr, s.count, s.cols);
  ASSERT_TRUE(status.ok()) << status;
  TY_CUDA_ASSERT(cudaDeviceSynchronize());
  EXPECT_TRUE(BitsEqual(d_out.Read(), want));
}

TEST(CudaMoe, GatherRowsMatchesCpu) {
  TY_SKIP_WITHOUT_GPU();
  std::mt19937 rng(31);
  for (DType dtype : kDTypes) {
    for (GatherShape s : kGatherShapes) {
      for (bool with_scale : {false, true}) {
        for (bool in_order : {false, true}) {
          SCOPED_TRACE(absl::StrCat(DTypeName(dtype), " count=", s.count, " cols=", s.cols,
                                    " inp_rows=", s.inp_rows, " scale=", with_scale,
                                    " in_order=", in_order));
          CheckGather(dtype, s, with_scale, in_order, rng);
        }
      }
    }
  }
}

// Combine: `rows` tokens of `k` slots into `inp_rows` expert rows of `cols`. Shapes: one slot
// per token; top-2 and top-8 routing with widths that are not multiples of the warp; no slots
// at all (k = 0: zeros, or the old values); no tokens.
struct CombineShape {
  int64_t rows, k, cols, inp_rows;
};
constexpr CombineShape kCombineShapes[] = {{1, 1, 1, 1},     {7, 2, 100, 9}, {129, 2, 768, 200},
                                           {33, 8, 65, 260}, {4, 0, 16, 1},  {0, 2, 64, 4}};

// Slots with about one in four dropped (−1, a token over its expert's capacity), and every
// slot of token 0 dropped when there is more than one token.
std::vector<int32_t> RandomSlots(CombineShape s, std::mt19937& rng) {
  std::vector<int32_t> slots = RandomIndices(s.rows * s.k, s.inp_rows, rng);
  std::bernoulli_distribution drop(0.25);
  for (int32_t& x : slots) {
    if (drop(rng)) x = -1;
  }
  if (s.rows > 1) {
    for (int64_t j = 0; j < s.k; ++j) slots[j] = -1;
  }
  return slots;
}

void CheckCombine(DType dtype, CombineShape s, bool with_weights, bool accumulate,
                  std::mt19937& rng) {
  const std::vector<float> inp = RandomActivation(s.inp_rows * s.cols, dtype, rng);
  const std::vector<int32_t> slots = RandomSlots(s, rng);
  const std::vector<float> weights = RandomWeights(s.rows * s.k, rng);
  const std::vector<float> out0 = RandomActivation(s.rows * s.cols, dtype, rng);
  std::vector<float> want = out0;
  cpu::CombineRows(want.data(), inp.data(), slots.data(), with_weights ? weights.data() : nullptr,
                   s.rows, s.k, s.cols, accumulate);

  DeviceTensor d_inp(inp, dtype), d_weights(weights, kF32), d_out(s.rows * s.cols, dtype);
  if (accumulate) d_out.Write(out0);  // otherwise left poisoned: every element must be written
  std::unique_ptr<DeviceInts> d_slots;
  const int32_t* slots_ptr = IntsOrNull(slots, d_slots);
  auto run = [&] {
    return CombineRows(nullptr, dtype, d_out.get(), d_inp.get(), slots_ptr,
                       with_weights ? d_weights.f32() : nullptr, s.rows, s.k, s.cols, accumulate);
  };
  absl::Status status = run();
  ASSERT_TRUE(status.ok()) << status;
  TY_CUDA_ASSERT(cudaDeviceSynchronize());
  const std::vector<float> got = d_out.Read();
  EXPECT_LE(RelativeError(got, want), Tolerance(dtype));

  if (accumulate) return;
  d_out.Poison();
  status = run();
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_TRUE(BitsEqual(d_out.Read(), got)) << "differs between runs";
}

TEST(CudaMoe, CombineRowsMatchesCpu) {
  TY_SKIP_WITHOUT_GPU();
  std::mt19937 rng(32);
  for (DType dtype : kDTypes) {
    for (CombineShape s : kCombineShapes) {
      for (bool with_weights : {false, true}) {
        for (bool accumulate : {false, true}) {
          SCOPED_TRACE(absl::StrCat(DTypeName(dtype), " rows=", s.rows, " k=", s.k,
                                    " cols=", s.cols, " inp_rows=", s.inp_rows,
                                    " weights=", with_weights, " accumulate=", accumulate));
          CheckCombine(dtype, s, with_weights, accumulate, rng);
        }
      }
    }
  }
}

// Dot products: widths below, at and above the warp, not multiples of it; rows indexed with
// repeats; no rows.
struct DotShape {
  int64_t count, cols, a_rows;
};
constexpr DotShape kDotShapes[] = {{1, 1, 1},     {9, 31, 4},     {40, 32, 40},
                                   {300, 100, 7}, {70, 4100, 80}, {0, 16, 2}};

TEST(CudaMoe, RowDotsMatchCpu) {
  TY_SKIP_WITHOUT_GPU();
  std::mt19937 rng(33);
  for (DType dtype : kDTypes) {
    for (DotShape s : kDotShapes) {
      SCOPED_TRACE(absl::StrCat(DTypeName(dtype), " count=", s.count, " cols=", s.cols,
                                " a_rows=", s.a_rows));
      const std::vector<float> a = RandomActivation(s.a_rows * s.cols, dtype, rng);
      const std::vector<float> b = RandomActivation(s.count * s.cols, dtype, rng);
      const std::vector<int32_t> a_rows = RandomIndices(s.count, s.a_rows, rng);
      std::vector<float> want(s.count);
      cpu::RowDots(want.data(), a.data(), a_rows.data(), b.data(), s.count, s.cols);

      DeviceTensor d_a(a, dtype), d_b(b, dtype), d_out(s.count, kF32);
      std::unique_ptr<DeviceInts> d_a_rows;
      const absl::Status status = RowDots(nullptr, dtype, d_out.f32(), d_a.get(),
                                          IntsOrNull(a_rows, d_a_rows), d_b.get(), s.count, s.cols);
      ASSERT_TRUE(status.ok()) << status;
      TY_CUDA_ASSERT(cudaDeviceSynchronize());
      EXPECT_LE(RelativeError(d_out.Read(), want), kF32Tolerance);
    }
  }
}

// The shared experts' gate: rows of a width below, at and above the warp, not multiples of it, with
// logits from −30 to 30 (gates from 1e-13 to 1), the gate written over the logits or apart; no
// rows. The gates are the reference's within fp32 rounding, each gated row that rounding too and
// then the storage type's; the backward's logit gradients are fp32 dot products.
struct GateShape {
  int64_t rows, cols;
};
constexpr GateShape kGateShapes[] = {{1, 1}, {9, 31}, {40, 32}, {300, 100}, {70, 4100}, {0, 16}};

std::vector<float> RandomLogits(int64_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> logit(-30.0f, 30.0f);
  std::vector<float> v(n);
  for (float& x : v) x = logit(rng);
  if (n > 1) v[0] = 0.0f;  // a gate of exactly one half
  return v;
}

TEST(CudaMoe, SigmoidGateRowsMatchesCpu) {
  TY_SKIP_WITHOUT_GPU();
  std::mt19937 rng(37);
  for (DType dtype : kDTypes) {
    for (GateShape s : kGateShapes) {
      for (bool in_place : {false, true}) {
        SCOPED_TRACE(absl::StrCat(DTypeName(dtype), " rows=", s.rows, " cols=", s.cols,
                                  " in_place=", in_place));
        const std::vector<float> logits = RandomLogits(s.rows, rng);
        const std::vector<float> x = RandomActivation(s.rows * s.cols, dtype, rng);
        std::vector<float> want_gate(s.rows), want_x = x;
        cpu::SigmoidGateRows(want_gate.data(), logits.data(), want_x.data(), s.rows, s.cols);

        DeviceTensor d_logits(logits, kF32), d_gate(s.rows, kF32), d_x(x, dtype);
        float* gate = in_place ? d_logits.f32() : d_gate.f32();
        const absl::Status status =
            SigmoidGateRows(nullptr, dtype, gate, d_logits.f32(), d_x.get(), s.rows, s.cols);
        ASSERT_TRUE(status.ok()) << status;
        TY_CUDA_ASSERT(cudaDeviceSynchronize());
        const std::vector<float> got = in_place ? d_logits.Read() : d_gate.Read();
        EXPECT_LE(RelativeError(got, want_gate), kF32Tolerance);
        EXPECT_LE(RelativeError(d_x.Read(), want_x), Tolerance(dtype));
      }
    }
  }
}

TEST(CudaMoe, SigmoidGateBackwardMatchesCpu) {
  TY_SKIP_WITHOUT_GPU();
  std::mt19937 rng(38);
  for (DType dtype : kDTypes) {
    for (GateShape s : kGateShapes) {
      SCOPED_TRACE(absl::StrCat(DTypeName(dtype), " rows=", s.rows, " cols=", s.cols));
      const std::vector<float> gate = RandomWeights(s.rows, rng);
      const std::vector<float> act = RandomActivation(s.rows * s.cols, dtype, rng);
      const std::vector<float> dact = RandomActivation(s.rows * s.cols, dtype, rng);
      std::vector<float> want(s.rows);
      cpu::SigmoidGateBackward(want.data(), gate.data(), act.data(), dact.data(), s.rows, s.cols);

      DeviceTensor d_gate(gate, kF32), d_act(act, dtype), d_dact(dact, dtype), d_out(s.rows, kF32);
      auto run = [&] {
        return SigmoidGateBackward(nullptr, dtype, d_out.f32(), d_gate.f32(), d_act.get(),
                                   d_dact.get(), s.rows, s.cols);
      };
      absl::Status status = run();
      ASSERT_TRUE(status.ok()) << status;
      TY_CUDA_ASSERT(cudaDeviceSynchronize());
      const std::vector<float> got = d_out.Read();
      EXPECT_LE(RelativeError(got, want), kF32Tolerance);
      d_out.Poison();
      status = run();
      ASSERT_TRUE(status.ok()) << status;
      EXPECT_TRUE(BitsEqual(d_out.Read(), got)) << "differs between runs";
    }
  }
}

// The router: m tokens of width k, n experts. Shapes: one of each; widths that are not
// multiples of the warp; 64 and 256 experts (the widest router the contract names); no tokens.
struct RouterShape {
  int64_t m, n, k;
};
constexpr RouterShape kRouterShapes[] = {{1, 1, 1},    {37, 8, 100},  {130, 64, 256},
                                         {5, 256, 33}, {64, 16, 768}, {0, 8, 64}};

std::string Label(DType dtype, RouterShape s) {
  return absl::StrCat(DTypeName(dtype), " m=", s.m, " n=", s.n, " k=", s.k);
}

TEST(CudaMoe, RouterForwardMatchesCpu) {
  TY_SKIP_WITHOUT_GPU();
  std::mt19937 rng(34);
  for (DType dtype : kDTypes) {
    for (RouterShape s : kRouterShapes) {
      SCOPED_TRACE(Label(dtype, s));
      const std::vector<float> inp = RandomActivation(s.m * s.k, dtype, rng);
      const std::vector<float> weight = RandomVector(s.n * s.k, rng, 0.05f);
      std::vector<float> want(s.m * s.n);
      if (s.m > 0) {
        cpu::LinearForward(want.data(), inp.data(), weight.data(), nullptr, s.m, s.n, s.k);
      }

      DeviceTensor d_inp(inp, dtype), d_weight(weight, kF32), d_out(s.m * s.n, kF32);
      const absl::Status status = RouterLinearForward(nullptr, dtype, d_out.f32(), d_inp.get(),
                                                      d_weight.f32(), s.m, s.n, s.k);
      ASSERT_TRUE(status.ok()) << status;
      TY_CUDA_ASSERT(cudaDeviceSynchronize());
      EXPECT_LE(RelativeError(d_out.Read(), want), kF32Tolerance);
    }
  }
}

// An empty sum: with k = 0 every logit is 0 (the poisoned output is overwritten).
TEST(CudaMoe, RouterForwardOfZeroWidthIsZero) {
  TY_SKIP_WITHOUT_GPU();
  DeviceTensor d_out(3 * 4, kF32);
  const absl::Status status =
      RouterLinearForward(nullptr, kF32, d_out.f32(), nullptr, nullptr, 3, 4, 0);
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_TRUE(BitsEqual(d_out.Read(), std::vector<float>(3 * 4, 0.0f)));
}

// Backward from nonzero gradients (both accumulate), each gradient alone and both together; the
// weight gradient twice, requiring the same bits.
void CheckRouterBackward(DType dtype, RouterShape s, bool with_dinp, bool with_dweight,
                         std::mt19937& rng) {
  const std::vector<float> inp = RandomActivation(s.m * s.k, dtype, rng);
  const std::vector<float> weight = RandomVector(s.n * s.k, rng, 0.05f);
  const std::vector<float> dout = RandomVector(s.m * s.n, rng, 0.1f);
  const std::vector<float> dinp0 = RandomActivation(s.m * s.k, dtype, rng);
  const std::vector<float> dweight0 = RandomVector(s.n * s.k, rng);
  std::vector<float> dinp = dinp0, dweight = dweight0;
  cpu::LinearBackwardAccumulate(with_dinp ? dinp.data() : nullptr,
                                with_dweight ? dweight.data() : nullptr, dout.data(), inp.data(),
                                weight.data(), s.m, s.n, s.k);

  DeviceTensor d_inp(inp, dtype), d_weight(weight, kF32), d_dout(dout, kF32);
  DeviceTensor d_dinp(dinp0, dtype), d_dweight(dweight0, kF32);
  auto run = [&] {
    d_dinp.Write(dinp0);
    d_dweight.Write(dweight0);
    return RouterLinearBackward(nullptr, dtype, with_dinp ? d_dinp.get() : nullptr,
                                with_dweight ? d_dweight.f32() : nullptr, d_dout.f32(), d_inp.get(),
                                d_weight.f32(), s.m, s.n, s.k);
  };
  absl::Status status = run();
  ASSERT_TRUE(status.ok()) << status;
  TY_CUDA_ASSERT(cudaDeviceSynchronize());
  const std::vector<float> got_dinp = d_dinp.Read(), got_dweight = d_dweight.Read();
  EXPECT_LE(RelativeError(got_dinp, dinp), Tolerance(dtype)) << "dinp";
  EXPECT_LE(RelativeError(got_dweight, dweight), kF32Tolerance) << "dweight";
  if (!with_dinp) {
    EXPECT_TRUE(BitsEqual(got_dinp, dinp0)) << "null dinp must not be written";
  }
  if (!with_dweight) {
    EXPECT_TRUE(BitsEqual(got_dweight, dweight0)) << "null dweight must not be written";
  }

  status = run();
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_TRUE(BitsEqual(d_dweight.Read(), got_dweight)) << "dweight differs between runs";
  EXPECT_TRUE(BitsEqual(d_dinp.Read(), got_dinp)) << "dinp differs between runs";
}

TEST(CudaMoe, RouterBackwardMatchesCpu) {
  TY_SKIP_WITHOUT_GPU();
  std::mt19937 rng(35);
  for (DType dtype : kDTypes) {
    for (RouterShape s : kRouterShapes) {
      for (auto [with_dinp, with_dweight] :
           {std::pair{true, true}, std::pair{true, false}, std::pair{false, true}}) {
        SCOPED_TRACE(absl::StrCat(Label(dtype, s), " dinp=", with_dinp, " dweight=", with_dweight));
        CheckRouterBackward(dtype, s, with_dinp, with_dweight, rng);
      }
    }
  }
}

// Nothing to do is not an error, whatever the pointers.
TEST(CudaMoe, EmptyInputsLaunchNothing) {
  TY_SKIP_WITHOUT_GPU();
  for (DType dtype : kDTypes) {
    EXPECT_TRUE(GatherRows(nullptr, dtype, nullptr, nullptr, nullptr, nullptr, 0, 64).ok());
    EXPECT_TRUE(
        CombineRows(nullptr, dtype, nullptr, nullptr, nullptr, nullptr, 0, 2, 64, true).ok());
    EXPECT_TRUE(RowDots(nullptr, dtype, nullptr, nullptr, nullptr, nullptr, 0, 64).ok());
    EXPECT_TRUE(SigmoidGateRows(nullptr, dtype, nullptr, nullptr, nullptr, 0, 64).ok());
    EXPECT_TRUE(
        SigmoidGateBackward(nullptr, dtype, nullptr, nullptr, nullptr, nullptr, 0, 64).ok());
    EXPECT_TRUE(RouterLinearForward(nullptr, dtype, nullptr, nullptr, nullptr, 0, 8, 64).ok());
    EXPECT_TRUE(
        RouterLinearBackward(nullptr, dtype, nullptr, nullptr, nullptr, nullptr, nullptr, 0, 8, 64)
            .ok());
  }
  TY_CUDA_ASSERT(cudaGetLastError());
}

TEST(CudaMoe, RejectsBadArguments) {
  TY_SKIP_WITHOUT_GPU();
  constexpr auto kInvalid = absl::StatusCode::kInvalidArgument;
  DeviceTensor x(64, kF32), y(64, kF32);
  DeviceInts idx({0, 1});
  const auto bad_dtype = static_cast<DType>(7);
  EXPECT_EQ(GatherRows(nullptr, bad_dtype, x.get(), y.get(), idx.get(), nullptr, 2, 8).code(),
            kInvalid);
  EXPECT_EQ(GatherRows(nullptr, kF32, x.get(), y.get(), idx.get(), nullptr, -1, 8).code(),
            kInvalid);
  EXPECT_EQ(GatherRows(nullptr, kF32, nullptr, y.get(), idx.get(), nullptr, 2, 8).code(), kInvalid);
  EXPECT_EQ(GatherRows(nullptr, kF32, x.get(), x.get(), idx.get(), nullptr, 2, 8).code(), kInvalid);
  EXPECT_EQ(CombineRows(nullptr, kF32, x.get(), y.get(), nullptr, nullptr, 2, 1, 8, false).code(),
            kInvalid);
  EXPECT_EQ(
      CombineRows(nullptr, kF32, x.get(), y.get(), idx.get(), nullptr, 2, -1, 8, false).code(),
      kInvalid);
  EXPECT_EQ(RowDots(nullptr, kF32, x.f32(), y.get(), nullptr, y.get(), 2, 8).code(), kInvalid);
  EXPECT_EQ(SigmoidGateRows(nullptr, kF32, x.f32(), nullptr, y.get(), 2, 8).code(), kInvalid);
  EXPECT_EQ(SigmoidGateRows(nullptr, bad_dtype, x.f32(), x.f32(), y.get(), 2, 8).code(), kInvalid);
  EXPECT_EQ(SigmoidGateBackward(nullptr, kF32, x.f32(), y.f32(), nullptr, y.get(), 2, 8).code(),
            kInvalid);
  EXPECT_EQ(SigmoidGateBackward(nullptr, kF32, x.f32(), y.f32(), y.get(), y.get(), -1, 8).code(),
            kInvalid);
  EXPECT_EQ(RouterLinearForward(nullptr, kF32, x.f32(), y.get(), nullptr, 2, 4, 8).code(),
            kInvalid);
  EXPECT_EQ(
      RouterLinearBackward(nullptr, kF32, x.get(), nullptr, y.f32(), y.get(), nullptr, 2, 4, 8)
          .code(),
      kInvalid);
  EXPECT_EQ(
      RouterLinearBackward(nullptr, kF32, nullptr, x.f32(), y.f32(), nullptr, y.f32(), 2, 4, 8)
          .code(),
      kInvalid);
}

}  // namespace
}  // namespace trainyard::kernels::cuda
