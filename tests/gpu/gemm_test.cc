// cuBLASLt GEMMs for linear layers (kernels/cuda/gemm.h) against the CPU reference
// (kernels/cpu/linear.h): forward with and without the bias epilogue, the input gradient, and the
// fp32 weight gradient accumulated onto an existing value. bf16 operands are rounded on the host
// first, so the CPU sees what the device sees; products are accumulated in fp32 on both sides.
#include "kernels/cuda/gemm.h"

#include <random>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/linear.h"
#include "tests/gpu/device_tensor.h"
#include "tests/gpu/gpu_test_util.h"

namespace trainyard::kernels::cuda {
namespace {

using testing::DeviceTensor;
using testing::RandomActivation;
using testing::RelativeError;
using testing::Tolerance;

struct Shape {
  int64_t m, n, k;
};

class GemmTest : public ::testing::TestWithParam<std::tuple<Shape, DType>> {};

TEST_P(GemmTest, MatchesCpuLinear) {
  TY_SKIP_WITHOUT_GPU();
  const auto [shape, dtype] = GetParam();
  const auto [m, n, k] = shape;
  std::mt19937 rng(static_cast<unsigned>(m * 131 + n * 7 + k));
  auto gemm = Gemm::Create();
  ASSERT_TRUE(gemm.ok()) << gemm.status();
  const std::vector<float> inp = RandomActivation(m * k, dtype, rng);
  const std::vector<float> w = RandomActivation(n * k, dtype, rng, 0.1f);
  const std::vector<float> bias = RandomActivation(n, dtype, rng, 0.5f);
  const std::vector<float> dout = RandomActivation(m * n, dtype, rng);
  const std::vector<float> dw0 = testing::RandomVector(n * k, rng);  // accumulated onto

  DeviceTensor d_inp(inp, dtype), d_w(w, dtype), d_bias(bias, dtype), d_dout(dout, dtype);
  DeviceTensor d_out(m * n, dtype), d_dinp(m * k, dtype), d_dw(dw0, DType::kF32);
  for (bool with_bias : {false, true}) {
    d_out.Poison();
    ASSERT_TRUE((*gemm)
                    ->Forward(nullptr, dtype, d_out.get(), nullptr, d_inp.get(), d_w.get(),
                              with_bias ? d_bias.get() : nullptr, m, n, k,
                              with_bias ? GemmEpilogue::kBias : GemmEpilogue::kNone)
                    .ok());
    std::vector<float> want(m * n);
    cpu::LinearForward(want.data(), inp.data(), w.data(), with_bias ? bias.data() : nullptr, m, n,
                       k);
    EXPECT_LE(RelativeError(d_out.Read(), want), Tolerance(dtype)) << "forward, bias " << with_bias;
  }

  d_dinp.Poison();
  ASSERT_TRUE(
      (*gemm)->BackwardInput(nullptr, dtype, d_dinp.get(), d_dout.get(), d_w.get(), m, n, k).ok());
  ASSERT_TRUE(
      (*gemm)->BackwardWeight(nullptr, dtype, d_dw.f32(), d_dout.get(), d_inp.get(), m, n, k).ok());
  std::vector<float> want_dinp(m * k), want_dw = dw0;
  cpu::LinearBackward(want_dinp.data(), want_dw.data(), nullptr, dout.data(), inp.data(), w.data(),
                      m, n, k);
  EXPECT_LE(RelativeError(d_dinp.Read(), want_dinp), Tolerance(dtype)) << "input gradient";
  // The weight gradient is fp32 output of bf16 operands: fp32-accumulated products of the same
  // rounded values, so the fp32 bound holds loosely; bf16 uses its own bound.
  EXPECT_LE(RelativeError(d_dw.Read(), want_dw), Tolerance(dtype)) << "weight gradient";
  EXPECT_GE((*gemm)->planned_shapes(), 4);
}

INSTANTIATE_TEST_SUITE_P(Shapes, GemmTest,
                         ::testing::Combine(::testing::Values(Shape{1, 8, 16}, Shape{37, 104, 72},
                                                              Shape{300, 768, 256},
                                                              Shape{1024, 2304, 768}),
                                            ::testing::Values(DType::kF32, DType::kBF16)),
                         [](const auto& info) {
                           const Shape s = std::get<0>(info.param);
                           return std::to_string(s.m) + "x" + std::to_string(s.n) + "x" +
                                  std::to_string(s.k) + "_" + DTypeName(std::get<1>(info.param));
                         });

TEST(Gemm, RejectsEmptyShapes) {
  TY_SKIP_WITHOUT_GPU();
  auto gemm = Gemm::Create();
  ASSERT_TRUE(gemm.ok());
  DeviceTensor x(16, DType::kF32);
  const absl::Status s = (*gemm)->Forward(nullptr, DType::kF32, x.get(), nullptr, x.get(), x.get(),
                                          nullptr, 0, 4, 4, GemmEpilogue::kNone);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
}

}  // namespace
}  // namespace trainyard::kernels::cuda
