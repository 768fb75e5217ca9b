// cuBLASLt GEMMs for linear layers (kernels/cuda/gemm.h) against the CPU reference
// (kernels/cpu/linear.h): forward with and without the bias epilogue, the input gradient, and the
// fp32 weight gradient accumulated onto an existing value. bf16 operands are rounded on the host
// first, so the CPU sees what the device sees; products are accumulated in fp32 on both sides.
#include "kernels/cuda/gemm.h"

#include <cstdio>
#include <memory>
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

// Grouped products (a mixture of experts' GEMMs: each expert on its own rows, weights and
// outputs) against the CPU reference product by product, for each kind, with an m of 1 and
// ones that are not multiples of any tile. The forward and input-gradient products (operands
// and output of one type) must run grouped, reading their pointers from the device copy; the
// weight gradient (fp32 output) may fall back to one product at a time where cuBLAS has no
// grouped GEMM for that mix of types, and the test says which ran.
class GroupedGemmTest : public ::testing::TestWithParam<DType> {};

TEST_P(GroupedGemmTest, MatchesCpuProductByProduct) {
  TY_SKIP_WITHOUT_GPU();
  const DType dtype = GetParam();
  const int64_t n = 40, k = 24;
  const std::vector<int64_t> ms = {17, 1, 33};
  std::mt19937 rng(9);
  auto gemm = Gemm::Create();
  ASSERT_TRUE(gemm.ok()) << gemm.status();
  struct Product {
    std::vector<float> inp, w, dout, dw0;
    DeviceTensor d_inp, d_w, d_dout, d_out, d_dinp, d_dw;
  };
  std::vector<std::unique_ptr<Product>> p;  // device tensors do not move
  for (const int64_t m : ms) {
    std::vector<float> inp = RandomActivation(m * k, dtype, rng);
    std::vector<float> w = RandomActivation(n * k, dtype, rng, 0.1f);
    std::vector<float> dout = RandomActivation(m * n, dtype, rng);
    std::vector<float> dw0 = testing::RandomVector(n * k, rng);
    p.push_back(std::unique_ptr<Product>(
        new Product{inp, w, dout, dw0, DeviceTensor(inp, dtype), DeviceTensor(w, dtype),
                    DeviceTensor(dout, dtype), DeviceTensor(m * n, dtype),
                    DeviceTensor(m * k, dtype), DeviceTensor(dw0, DType::kF32)}));
  }
  const int count = static_cast<int>(ms.size());
  // kind → (out, x, y) of product i.
  auto run = [&](GemmKind kind) {
    std::vector<void*> out;
    std::vector<const void*> x, y;
    for (const auto& q : p) {
      out.push_back(kind == GemmKind::kForward         ? q->d_out.get()
                    : kind == GemmKind::kBackwardInput ? q->d_dinp.get()
                                                       : q->d_dw.get());
      x.push_back(kind == GemmKind::kForward ? q->d_inp.get() : q->d_dout.get());
      y.push_back(kind == GemmKind::kBackwardWeight ? q->d_inp.get() : q->d_w.get());
    }
    GemmGroup group{.kind = kind,
                    .count = count,
                    .m = ms.data(),
                    .out = out.data(),
                    .x = x.data(),
                    .y = y.data()};
    const testing::DeviceValues<const void*> device(GroupPointers(group));
    group.device = device.get();
    const absl::Status status = (*gemm)->Grouped(nullptr, dtype, group, n, k);
    ASSERT_TRUE(status.ok()) << status;
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const bool one_by_one = (*gemm)->GroupedOneByOne(kind, dtype);
    if (kind == GemmKind::kBackwardWeight) {
      std::printf("grouped weight gradient, %s: %s\n", DTypeName(dtype),
                  one_by_one ? "one product at a time (cuBLAS refused the grouped GEMM)"
                             : "one grouped GEMM");
    } else {
      EXPECT_FALSE(one_by_one) << "cuBLAS refused a grouped GEMM of one type";
    }
  };
  for (const auto& q : p) {
    q->d_out.Poison();
    q->d_dinp.Poison();
  }
  run(GemmKind::kForward);
  run(GemmKind::kBackwardInput);
  run(GemmKind::kBackwardWeight);
  for (int i = 0; i < count; ++i) {
    const int64_t m = ms[i];
    const Product& q = *p[i];
    std::vector<float> out(m * n), dinp(m * k), dw = q.dw0;
    cpu::LinearForward(out.data(), q.inp.data(), q.w.data(), nullptr, m, n, k);
    cpu::LinearBackward(dinp.data(), dw.data(), nullptr, q.dout.data(), q.inp.data(), q.w.data(), m,
                        n, k);
    EXPECT_LE(RelativeError(q.d_out.Read(), out), Tolerance(dtype)) << "forward " << i;
    EXPECT_LE(RelativeError(q.d_dinp.Read(), dinp), Tolerance(dtype)) << "input gradient " << i;
    EXPECT_LE(RelativeError(q.d_dw.Read(), dw), Tolerance(dtype)) << "weight gradient " << i;
  }
  // A product with no rows is refused, as the one-product calls refuse it.
  const int64_t none = 0;
  void* out = p[0]->d_out.get();
  const void* x = p[0]->d_inp.get();
  const void* y = p[0]->d_w.get();
  const GemmGroup empty{.kind = GemmKind::kForward,
                        .count = 1,
                        .m = &none,
                        .out = &out,
                        .x = &x,
                        .y = &y,
                        .device = reinterpret_cast<const void* const*>(&x)};
  EXPECT_EQ((*gemm)->Grouped(nullptr, dtype, empty, n, k).code(),
            absl::StatusCode::kInvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(ActTypes, GroupedGemmTest, ::testing::Values(DType::kF32, DType::kBF16),
                         [](const auto& info) { return std::string(DTypeName(info.param)); });

TEST(Gemm, RejectsEmptyShapes) {
  TY_SKIP_WITHOUT_GPU();
  auto gemm = Gemm::Create();
  ASSERT_TRUE(gemm.ok());
  DeviceTensor x(16, DType::kF32);
  const absl::Status s = (*gemm)->Forward(nullptr, DType::kF32, x.get(), nullptr, x.get(), x.get(),
                                          nullptr, 0, 4, 4, GemmEpilogue::kNone);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
}

// The fused GELU epilogue stores its pre-activation with the output's row length as leading
// dimension, which cuBLASLt needs in multiples of 8: other widths are not offered (the backend
// then runs the separate GELU kernel); GPT-2's MLP width is.
TEST(Gemm, GeluEpilogueOnlyForWidthsInMultiplesOfEight) {
  TY_SKIP_WITHOUT_GPU();
  auto gemm = Gemm::Create();
  ASSERT_TRUE(gemm.ok());
  EXPECT_FALSE((*gemm)->SupportsGeluEpilogue(DType::kBF16, 64, 50, 64));
  EXPECT_TRUE((*gemm)->SupportsGeluEpilogue(DType::kBF16, 1024, 3072, 768));
}

}  // namespace
}  // namespace trainyard::kernels::cuda
