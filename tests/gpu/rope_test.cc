// The CUDA RoPE kernels against the CPU reference: query and key heads rotated in place (with
// grouped-query layouts), value heads untouched, long sequences accurate, backward the inverse,
// positions offset for a chunk of a longer sequence (context parallelism).
#include "kernels/cuda/rope.h"

#include <algorithm>
#include <cmath>
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
  double scaling = 0.0;    // Llama 3's factor over an original context of 8192 (0: none)
  bool linear = false;     // the factor is linear scaling's (position interpolation)
  int64_t rotary_dim = 0;  // the dimensions of each head that turn (0: d)
  bool longrope = false;   // LongRoPE: pair i slowed 1 + 0.7·i times, magnitude 1.19
  bool yarn = false;       // the factor is YaRN's over an original context of 4096, magnitude 1.2

  RopeFrequencies freq() const {
    RopeFrequencies f{.theta = theta,
                      .factor = scaling,
                      .linear = linear,
                      .yarn = yarn,
                      .original_max_seq = yarn ? 4096.0 : 8192.0,
                      .rotary_dim = rotary_dim};
    if (yarn) f.magnitude = 1.2;
    if (longrope) {
      f.pairs = static_cast<int>((rotary_dim > 0 ? rotary_dim : d) / 2);
      for (int i = 0; i < f.pairs; ++i) f.pair_factor[i] = 1.0f + 0.7f * static_cast<float>(i);
      f.magnitude = 1.19;
    }
    return f;
  }
};

// Head dims 16/64/128, grouped-query (kv_heads < heads) and multi-head layouts, sequence
// lengths that are not multiples of 32, up to 2047 positions (where an fp32 angle would be off);
// chunks that start past position 0, one of them ending at position 4095; Llama 3's scaling
// (whose three regimes a head of 128 at base 5e5 all has); linear scaling (Gemma 3's global
// blocks'), from position 0 and past 8000; Phi-4 mini's partial rotation (96 of 128) with and
// without LongRoPE's per-pair factors and magnitude, and LongRoPE over a whole head of 96.
constexpr Config kConfigs[] = {
    {1, 1, 1, 1, 16, 10000.0f},
    {2, 37, 4, 2, 16, 10000.0f},
    {3, 33, 8, 2, 64, 10000.0f},
    {1, 100, 4, 1, 128, 5e5f},
    {2, 700, 6, 2, 128, 10000.0f},
    {1, 2047, 2, 1, 64, 10000.0f},
    {2, 129, 4, 4, 64, 10000.0f},
    {2, 37, 4, 2, 16, 10000.0f, 37},
    {1, 96, 4, 1, 128, 5e5f, 4000},
    {2, 300, 4, 2, 128, 5e5f, 0, 32.0},
    {1, 96, 4, 1, 128, 5e5f, 8100, 8.0},
    {2, 100, 4, 2, 64, 1e6f, 0, 8.0, true},
    {1, 96, 4, 1, 128, 1e6f, 8100, 4.0, true},
    {2, 37, 4, 2, 128, 10000.0f, 0, 0.0, false, 96},
    {1, 300, 3, 1, 96, 10000.0f, 4000, 0.0, false, 0, true},
    {2, 65, 4, 2, 128, 10000.0f, 0, 0.0, false, 96, true},
    {2, 300, 4, 2, 128, 1e6f, 0, 8.0, false, 0, false, true},
    {1, 96, 4, 1, 64, 10000.0f, 30000, 4.0, false, 0, false, true},
};

std::string Label(DType dtype, const Config& c) {
  return absl::StrCat(DTypeName(dtype), " b=", c.b, " t=", c.t, " heads=", c.heads,
                      " kv_heads=", c.kv_heads, " d=", c.d, " theta=", c.theta,
                      " first_position=", c.first_position, " scaling=", c.scaling,
                      c.linear ? " linear" : "", " rotary_dim=", c.rotary_dim,
                      c.longrope ? " longrope" : "", c.yarn ? " yarn" : "");
}

int64_t Count(const Config& c) { return c.b * c.t * (c.heads + 2 * c.kv_heads) * c.d; }

// True when the value heads of every row, and the dimensions of the query and key heads past
// the rotated ones, are bit for bit those of `want`.
bool ValuesUntouched(const std::vector<float>& got, const std::vector<float>& want,
                     const Config& c) {
  const int64_t width = (c.heads + 2 * c.kv_heads) * c.d;
  const int64_t v0 = (c.heads + c.kv_heads) * c.d;
  const int64_t rotated = c.rotary_dim > 0 ? c.rotary_dim : c.d;
  for (int64_t row = 0; row < c.b * c.t; ++row) {
    for (int64_t j = 0; j < width; ++j) {
      if ((j >= v0 || j % c.d >= rotated) && got[row * width + j] != want[row * width + j]) {
        return false;
      }
    }
  }
  return true;
}

void CheckAgainstCpu(DType dtype, const Config& c, bool backward, std::mt19937& rng) {
  const std::vector<float> qkv = RandomActivation(Count(c), dtype, rng);
  std::vector<float> want = qkv;
  if (backward) {
    cpu::RopeBackward(want.data(), c.b, c.t, c.heads, c.kv_heads, c.d, c.freq(), c.first_position);
  } else {
    cpu::RopeForward(want.data(), c.b, c.t, c.heads, c.kv_heads, c.d, c.freq(), c.first_position);
  }
  DeviceTensor d_qkv(qkv, dtype);
  const absl::Status status = backward
                                  ? RopeBackward(nullptr, dtype, d_qkv.get(), c.b, c.t, c.heads,
                                                 c.kv_heads, c.d, c.freq(), c.first_position)
                                  : RopeForward(nullptr, dtype, d_qkv.get(), c.b, c.t, c.heads,
                                                c.kv_heads, c.d, c.freq(), c.first_position);
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
// input back (fp32 storage; bf16 would round in between), its rotated dimensions times the
// magnitude squared (LongRoPE's).
TEST(CudaRope, BackwardUndoesForward) {
  TY_SKIP_WITHOUT_GPU();
  std::mt19937 rng(23);
  for (const Config& c : kConfigs) {
    SCOPED_TRACE(Label(DType::kF32, c));
    const std::vector<float> qkv = RandomActivation(Count(c), DType::kF32, rng);
    std::vector<float> want = qkv;
    const double squared = c.freq().magnitude * c.freq().magnitude;
    const int64_t width = (c.heads + 2 * c.kv_heads) * c.d, rotated = RopeRotaryDim(c.freq(), c.d);
    for (int64_t j = 0; j < static_cast<int64_t>(want.size()); ++j) {
      const int64_t column = j % width;
      if (column < (c.heads + c.kv_heads) * c.d && column % c.d < rotated) {
        want[j] = static_cast<float>(want[j] * squared);
      }
    }
    DeviceTensor d_qkv(qkv, DType::kF32);
    absl::Status status = RopeForward(nullptr, DType::kF32, d_qkv.get(), c.b, c.t, c.heads,
                                      c.kv_heads, c.d, c.freq(), c.first_position);
    ASSERT_TRUE(status.ok()) << status;
    status = RopeBackward(nullptr, DType::kF32, d_qkv.get(), c.b, c.t, c.heads, c.kv_heads, c.d,
                          c.freq(), c.first_position);
    ASSERT_TRUE(status.ok()) << status;
    EXPECT_LE(RelativeError(d_qkv.Read(), want), Tolerance(DType::kF32));
  }
}

TEST(CudaRope, RejectsBadArguments) {
  TY_SKIP_WITHOUT_GPU();
  DeviceTensor x(4 * 3 * 16, DType::kF32);
  const RopeFrequencies base{.theta = 1e4};
  EXPECT_EQ(RopeForward(nullptr, DType::kF32, x.get(), 1, 4, 1, 1, 15, base, 0).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RopeForward(nullptr, DType::kF32, nullptr, 1, 4, 1, 1, 16, base, 0).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RopeBackward(nullptr, DType::kF32, x.get(), 1, 4, 1, 0, 16, base, 0).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RopeForward(nullptr, DType::kF32, x.get(), 1, 4, 1, 1, 16, {.theta = 0.0}, 0).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RopeForward(nullptr, DType::kF32, x.get(), 1, 4, 1, 1, 16, base, -1).code(),
            absl::StatusCode::kInvalidArgument);
  const RopeFrequencies shrinking{.theta = 1e4, .factor = 0.5};
  EXPECT_EQ(RopeForward(nullptr, DType::kF32, x.get(), 1, 4, 1, 1, 16, shrinking, 0).code(),
            absl::StatusCode::kInvalidArgument);
  for (const int64_t rotary : {5, 18}) {  // odd, or wider than the head
    EXPECT_EQ(RopeForward(nullptr, DType::kF32, x.get(), 1, 4, 1, 1, 16,
                          {.theta = 1e4, .rotary_dim = rotary}, 0)
                  .code(),
              absl::StatusCode::kInvalidArgument);
  }
  RopeFrequencies wrong_pairs{.theta = 1e4, .rotary_dim = 8, .pairs = 3};
  EXPECT_EQ(RopeForward(nullptr, DType::kF32, x.get(), 1, 4, 1, 1, 16, wrong_pairs, 0).code(),
            absl::StatusCode::kInvalidArgument);
  RopeFrequencies vanishing{.theta = 1e4, .magnitude = 0.0};
  EXPECT_EQ(RopeForward(nullptr, DType::kF32, x.get(), 1, 4, 1, 1, 16, vanishing, 0).code(),
            absl::StatusCode::kInvalidArgument);
}

// Llama 3's frequencies in their three regimes, worked by hand: d 8, base 10000, original
// context 64, factor 8, low 1, high 4 (wavelengths above 64 slowed 8×, below 16 kept).
TEST(RopeFrequencies, Llama3ScalingByHand) {
  const RopeFrequencies f{.theta = 10000.0, .factor = 8.0, .original_max_seq = 64.0};
  const double pi = 3.14159265358979323846;
  for (int64_t i = 0; i < 4; ++i) {
    const double inv = std::pow(10000.0, -2.0 * i / 8), wavelength = 2 * pi / inv;
    double want = inv;
    if (wavelength > 64) {
      want = inv / 8;
    } else if (wavelength >= 16) {
      const double s = (64 / wavelength - 1) / 3;
      want = (1 - s) * inv / 8 + s * inv;
    }
    EXPECT_DOUBLE_EQ(RopeInvFreq(f, i, 8), want) << "pair " << i;
    EXPECT_DOUBLE_EQ(RopeInvFreq({.theta = 10000.0}, i, 8), inv);
  }
  // Pair 0 (wavelength 6.3) is kept, pair 2 (628) and pair 3 (6283) slowed, pair 1 (62.8) blends.
  EXPECT_DOUBLE_EQ(RopeInvFreq(f, 0, 8), 1.0);
  EXPECT_DOUBLE_EQ(RopeInvFreq(f, 3, 8), std::pow(10000.0, -0.75) / 8);
  const double inv1 = 0.1, s1 = (64 / (2 * pi / inv1) - 1) / 3;
  EXPECT_GT(s1, 0.0);
  EXPECT_LT(s1, 1.0);
  EXPECT_DOUBLE_EQ(RopeInvFreq(f, 1, 8), (1 - s1) * inv1 / 8 + s1 * inv1);
}

// Linear scaling slows every pair by the factor, whatever its wavelength.
TEST(RopeFrequencies, LinearScalingByHand) {
  const RopeFrequencies f{.theta = 10000.0, .factor = 8.0, .linear = true};
  for (int64_t i = 0; i < 4; ++i) {
    EXPECT_DOUBLE_EQ(RopeInvFreq(f, i, 8), std::pow(10000.0, -2.0 * i / 8) / 8) << "pair " << i;
  }
}

// YaRN by hand, a head of 16 at base 10000 over an original context of 16: beta_fast 8 and
// beta_slow 0.25 are reached at pair indices 16 ln(16 / 16π) / (2 ln 10⁴) = −0.99 and
// 16 ln(16 / 0.5π) / (2 ln 10⁴) = 2.02, rounded out to 0 and 3: pair 0 keeps its rate, pairs 1
// and 2 go a third and two thirds of the way to 4 times slower, pairs 3 on all of it. Unrounded
// the ends are 0 (clamped) and 2.02.
TEST(RopeFrequencies, YarnByHand) {
  RopeFrequencies f{.theta = 10000.0,
                    .factor = 4.0,
                    .yarn = true,
                    .beta_fast = 8.0,
                    .beta_slow = 0.25,
                    .original_max_seq = 16.0};
  const double high = 16 * std::log(16 / (0.25 * 2 * M_PI)) / (2 * std::log(10000.0));
  for (const bool truncate : {true, false}) {
    f.truncate = truncate;
    for (int64_t i = 0; i < 8; ++i) {
      const double ramp = std::clamp(truncate ? i / 3.0 : i / high, 0.0, 1.0);
      const double inv_freq = std::pow(10000.0, -2.0 * i / 16);
      EXPECT_NEAR(RopeInvFreq(f, i, 16), ramp * inv_freq / 4 + (1 - ramp) * inv_freq,
                  1e-15 * inv_freq)
          << "pair " << i << (truncate ? "" : " untruncated");
    }
  }
}

// LongRoPE divides each pair's frequency by its own factor, over the rotated dimensions only.
TEST(RopeFrequencies, LongRopeByHand) {
  RopeFrequencies f{.theta = 10000.0, .rotary_dim = 6, .pairs = 3};
  f.pair_factor[0] = 1.0f;
  f.pair_factor[1] = 2.5f;
  f.pair_factor[2] = 40.0f;
  EXPECT_EQ(RopeRotaryDim(f, 16), 6);
  EXPECT_EQ(RopeRotaryDim({}, 16), 16);
  for (int64_t i = 0; i < 3; ++i) {
    EXPECT_DOUBLE_EQ(RopeInvFreq(f, i, 6), std::pow(10000.0, -2.0 * i / 6) / f.pair_factor[i]);
  }
}

// The CPU reference by hand: a head of 8 whose first 4 dimensions turn (pairs (0, 2) and (1, 3))
// at position 3 with LongRoPE's factors and magnitude; dimensions 4 to 7 and the value head pass.
TEST(RopeFrequencies, CpuPartialLongRopeByHand) {
  RopeFrequencies f{.theta = 100.0, .rotary_dim = 4, .pairs = 2, .magnitude = 1.5};
  f.pair_factor[0] = 2.0f;
  f.pair_factor[1] = 4.0f;
  std::vector<float> qkv(4 * 3 * 8);  // t 4, one query, key and value head of 8
  for (size_t i = 0; i < qkv.size(); ++i) qkv[i] = 0.25f * static_cast<float>(i % 13) - 1.0f;
  const std::vector<float> in = qkv;
  cpu::RopeForward(qkv.data(), 1, 4, 1, 1, 8, f, 0);
  const int64_t row = 3 * 24;  // position 3
  for (int64_t head = 0; head < 2; ++head) {
    const float* x = in.data() + row + head * 8;
    const float* y = qkv.data() + row + head * 8;
    for (int64_t i = 0; i < 2; ++i) {
      const double angle = 3.0 * std::pow(100.0, -2.0 * i / 4) / f.pair_factor[i];
      const double c = 1.5 * std::cos(angle), s = 1.5 * std::sin(angle);
      EXPECT_NEAR(y[i], x[i] * c - x[i + 2] * s, 1e-6) << "head " << head << " pair " << i;
      EXPECT_NEAR(y[i + 2], x[i + 2] * c + x[i] * s, 1e-6) << "head " << head << " pair " << i;
    }
    for (int64_t j = 4; j < 8; ++j) EXPECT_EQ(y[j], x[j]) << "head " << head << " dim " << j;
  }
  for (int64_t j = 16; j < 24; ++j) EXPECT_EQ(qkv[row + j], in[row + j]) << "value dim " << j;
}

}  // namespace
}  // namespace trainyard::kernels::cuda
