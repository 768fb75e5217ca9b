// The CUDA RoPE kernels against the CPU reference: query and key heads rotated in place (with
// grouped-query layouts), value heads untouched, long sequences accurate, backward the inverse,
// positions offset for a chunk of a longer sequence (context parallelism).
#include "kernels/cuda/rope.h"

#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/cpu/rope.h"
#include "tests/gpu/device_tensor.h"
#include "tests/gpu/gpu_test_util.h"

namespace trainyard::kernels::cuda {
namespace {

using ::trainyard::testing::DeviceTensor;
using ::trainyard::testing::RandomActivation;
using ::trainyard::testing::RelativeError;
using ::trainyard::testing::Tolerance;

constexpr DType kDTypes[] = {DType::kF32, DType::kBF16};

struct Config {
  int64_t b, t, heads, kv_heads, d;
  float theta;
  int64_t first_position = 0;
};

// Head dims 16/64/128, grouped-query (kv_heads < heads) and multi-head layouts, sequence
// lengths that are not multiples of 32, up to 2047 positions (where an fp32 angle would be off);
// chunks that start past position 0, one of them ending at position 4095.
constexpr Config kConfigs[] = {
    {1, 1, 1, 1, 16, 10000.0f},   {2, 37, 4, 2, 16, 10000.0f},     {3, 33, 8, 2, 64, 10000.0f},
    {1, 100, 4, 1, 128, 5e5f},    {2, 700, 6, 2, 128, 10000.0f},   {1, 2047, 2, 1, 64, 10000.0f},
    {2, 129, 4, 4, 64, 10000.0f}, {2, 37, 4, 2, 16, 10000.0f, 37}, {1, 96, 4, 1, 128, 5e5f, 4000},
};

std::string Label(DType dtype, const Config& c) {
  return absl::StrCat(DTypeName(dtype), " b=", c.b, " t=", c.t, " heads=", c.heads,
                      " kv_heads=", c.kv_heads, " d=", c.d, " theta=", c.theta,
                      " first_position=", c.first_position);
}

int64_t Count(const Config& c) { return c.b * c.t * (c.heads + 2 * c.kv_heads) * c.d; }

// True when the value heads of every row are bit for bit those of `want`.
bool ValuesUntouched(const std::vector<float>& got, const std::vector<float>& want,
                     const Config& c) {
  const int64_t width = (c.heads + 2 * c.kv_heads) * c.d;
  const int64_t v0 = (c.heads + c.kv_heads) * c.d;
  for (int64_t row = 0; row < c.b * c.t; ++row) {
    for (int64_t j = v0; j < width; ++j) {
      if (got[row * width + j] != want[row * width + j]) return false;
    }
  }
  return true;
}

void CheckAgainstCpu(DType dtype, const Config& c, bool backward, std::mt19937& rng) {
  const std::vector<float> qkv = RandomActivation(Count(c), dtype, rng);
  std::vector<float> want = qkv;
  if (backward) {
    cpu::RopeBackward(want.data(), c.b, c.t, c.heads, c.kv_heads, c.d, c.theta, c.first_position);
  } else {
    cpu::RopeForward(want.data(), c.b, c.t, c.heads, c.kv_heads, c.d, c.theta, c.first_position);
  }
  DeviceTensor d_qkv(qkv, dtype);
  const absl::Status status = backward
                                  ? RopeBackward(nullptr, dtype, d_qkv.get(), c.b, c.t, c.heads,
                                                 c.kv_heads, c.d, c.theta, c.first_position)
                                  : RopeForward(nullptr, dtype, d_qkv.get(), c.b, c.t, c.heads,
                                                c.kv_heads, c.d, c.theta, c.first_position);
  ASSERT_TRUE(status.ok()) << status;
  TY_CUDA_ASSERT(cudaDeviceSynchronize());
  const std::vector<float> got = d_qkv.Read();
  EXPECT_LE(RelativeError(got, want), Tolerance(dtype));
  EXPECT_TRUE(ValuesUntouched(got, qkv, c));
}

TEST(CudaRope, ForwardMatchesCpu) {
  TY_SKIP_WITHOUT_GPU();
  std::mt19937 rng(21);
  for (DType dtype : kDTypes) {
    for (const Config& c : kConfigs) {
      SCOPED_TRACE(Label(dtype, c));
      CheckAgainstCpu(dtype, c, /*backward=*/false, rng);
    }
  }
}

TEST(CudaRope, BackwardMatchesCpu) {
  TY_SKIP_WITHOUT_GPU();
  std::mt19937 rng(22);
  for (DType dtype : kDTypes) {
    for (const Config& c : kConfigs) {
      SCOPED_TRACE(Label(dtype, c));
      CheckAgainstCpu(dtype, c, /*backward=*/true, rng);
    }
  }
}

// Backward is the transpose of a rotation, hence its inverse: forward then backward gives the
// input back (fp32 storage; bf16 would round in between).
TEST(CudaRope, BackwardUndoesForward) {
  TY_SKIP_WITHOUT_GPU();
  std::mt19937 rng(23);
  for (const Config& c : kConfigs) {
    SCOPED_TRACE(Label(DType::kF32, c));
    const std::vector<float> qkv = RandomActivation(Count(c), DType::kF32, rng);
    DeviceTensor d_qkv(qkv, DType::kF32);
    absl::Status status = RopeForward(nullptr, DType::kF32, d_qkv.get(), c.b, c.t, c.heads,
                                      c.kv_heads, c.d, c.theta, c.first_position);
    ASSERT_TRUE(status.ok()) << status;
    status = RopeBackward(nullptr, DType::kF32, d_qkv.get(), c.b, c.t, c.heads, c.kv_heads, c.d,
                          c.theta, c.first_position);
    ASSERT_TRUE(status.ok()) << status;
    EXPECT_LE(RelativeError(d_qkv.Read(), qkv), Tolerance(DType::kF32));
  }
}

TEST(CudaRope, RejectsBadArguments) {
  TY_SKIP_WITHOUT_GPU();
  DeviceTensor x(4 * 3 * 16, DType::kF32);
  EXPECT_EQ(RopeForward(nullptr, DType::kF32, x.get(), 1, 4, 1, 1, 15, 1e4f, 0).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RopeForward(nullptr, DType::kF32, nullptr, 1, 4, 1, 1, 16, 1e4f, 0).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RopeBackward(nullptr, DType::kF32, x.get(), 1, 4, 1, 0, 16, 1e4f, 0).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RopeForward(nullptr, DType::kF32, x.get(), 1, 4, 1, 1, 16, 0.0f, 0).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RopeForward(nullptr, DType::kF32, x.get(), 1, 4, 1, 1, 16, 1e4f, -1).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace trainyard::kernels::cuda
