// The CUDA GELU and SwiGLU kernels against the CPU reference, forward and backward, both storage
// types; outputs start poisoned because every kernel here overwrites them.
#include "kernels/cuda/activations.h"

#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/cpu/activations.h"
#include "tests/gpu/device_tensor.h"
#include "tests/gpu/gpu_test_util.h"

namespace trainyard::kernels::cuda {
namespace {

using ::trainyard::testing::DeviceTensor;
using ::trainyard::testing::RandomActivation;
using ::trainyard::testing::RelativeError;
using ::trainyard::testing::Tolerance;

constexpr DType kDTypes[] = {DType::kF32, DType::kBF16};
constexpr int64_t kSizes[] = {1, 100, 4097, 300 * 1030};

struct Shape {
  int64_t rows;
  int64_t f;
};
constexpr Shape kShapes[] = {{1, 64}, {7, 100}, {129, 768}, {300, 1030}};

// Normal inputs of standard deviation 2 plus saturated tails, where tanh and the sigmoid are ±1
// or 0/1.
std::vector<float> Inputs(int64_t n, DType dtype, std::mt19937& rng) {
  std::vector<float> v = RandomActivation(n, dtype, rng, 2.0f);
  v[0] = -12.0f;
  if (n > 1) v[n - 1] = 12.0f;
  return v;
}

TEST(CudaActivations, GeluMatchesCpu) {
  TY_SKIP_WITHOUT_GPU();
  std::mt19937 rng(11);
  for (DType dtype : kDTypes) {
    for (int64_t n : kSizes) {
      SCOPED_TRACE(absl::StrCat(DTypeName(dtype), " n=", n));
      const std::vector<float> inp = Inputs(n, dtype, rng);
      const std::vector<float> dout = RandomActivation(n, dtype, rng);
      std::vector<float> out(n), dinp(n);
      cpu::GeluForward(out.data(), inp.data(), n);
      cpu::GeluBackward(dinp.data(), dout.data(), inp.data(), n);

      DeviceTensor d_inp(inp, dtype), d_dout(dout, dtype), d_out(n, dtype), d_dinp(n, dtype);
      absl::Status status = GeluForward(nullptr, dtype, d_out.get(), d_inp.get(), n);
      ASSERT_TRUE(status.ok()) << status;
      status = GeluBackward(nullptr, dtype, d_dinp.get(), d_dout.get(), d_inp.get(), n);
      ASSERT_TRUE(status.ok()) << status;
      TY_CUDA_ASSERT(cudaDeviceSynchronize());
      EXPECT_LE(RelativeError(d_out.Read(), out), Tolerance(dtype)) << "out";
      EXPECT_LE(RelativeError(d_dinp.Read(), dinp), Tolerance(dtype)) << "dinp";

      // In place: the gradient overwrites dout.
      status = GeluBackward(nullptr, dtype, d_dout.get(), d_dout.get(), d_inp.get(), n);
      ASSERT_TRUE(status.ok()) << status;
      EXPECT_LE(RelativeError(d_dout.Read(), dinp), Tolerance(dtype)) << "dinp in place";
    }
  }
}

TEST(CudaActivations, SwigluMatchesCpu) {
  TY_SKIP_WITHOUT_GPU();
  std::mt19937 rng(12);
  for (DType dtype : kDTypes) {
    for (Shape s : kShapes) {
      SCOPED_TRACE(absl::StrCat(DTypeName(dtype), " rows=", s.rows, " f=", s.f));
      const int64_t n_in = s.rows * 2 * s.f, n_out = s.rows * s.f;
      const std::vector<float> inp = Inputs(n_in, dtype, rng);
      const std::vector<float> dout = RandomActivation(n_out, dtype, rng);
      std::vector<float> out(n_out), dinp(n_in);
      cpu::SwigluForward(out.data(), inp.data(), s.rows, s.f);
      cpu::SwigluBackward(dinp.data(), dout.data(), inp.data(), s.rows, s.f);

      DeviceTensor d_inp(inp, dtype), d_dout(dout, dtype);
      DeviceTensor d_out(n_out, dtype), d_dinp(n_in, dtype);
      absl::Status status = SwigluForward(nullptr, dtype, d_out.get(), d_inp.get(), s.rows, s.f);
      ASSERT_TRUE(status.ok()) << status;
      status = SwigluBackward(nullptr, dtype, d_dinp.get(), d_dout.get(), d_inp.get(), s.rows, s.f);
      ASSERT_TRUE(status.ok()) << status;
      TY_CUDA_ASSERT(cudaDeviceSynchronize());
      EXPECT_LE(RelativeError(d_out.Read(), out), Tolerance(dtype)) << "out";
      EXPECT_LE(RelativeError(d_dinp.Read(), dinp), Tolerance(dtype)) << "dinp";
    }
  }
}

TEST(CudaActivations, RejectsBadArguments) {
  TY_SKIP_WITHOUT_GPU();
  DeviceTensor x(64, DType::kF32);
  EXPECT_EQ(GeluForward(nullptr, DType::kF32, nullptr, x.get(), 64).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GeluForward(nullptr, DType::kF32, x.get(), x.get(), -1).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SwigluForward(nullptr, DType::kF32, x.get(), x.get(), 1, 0).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(GeluForward(nullptr, DType::kF32, x.get(), x.get(), 0).ok());
}

}  // namespace
}  // namespace trainyard::kernels::cuda
