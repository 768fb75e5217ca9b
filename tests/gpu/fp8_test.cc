// The FP8 quantizers against the CPU reference (kernels/cpu/fp8.h, written from the formats'
// definitions): the largest magnitude exactly, and every code bit for bit, in both formats, both
// storage types, with and without the transpose, at sizes that are not multiples of the tile;
// outputs start poisoned, so an element the kernel forgot shows. Saturation, an all-zero tensor
// and a NaN follow the rules of kernels/fp8_format.h.
#include "kernels/cuda/fp8.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "kernels/cpu/fp8.h"
#include "kernels/cuda/gemm.h"
#include "tests/gpu/device_tensor.h"
#include "tests/gpu/gpu_test_util.h"

namespace trainyard::kernels::cuda {
namespace {

using ::trainyard::testing::DeviceMemory;
using ::trainyard::testing::DeviceTensor;
using ::trainyard::testing::RandomActivation;

constexpr DType kDTypes[] = {DType::kF32, DType::kBF16};
constexpr Fp8Format kFormats[] = {Fp8Format::kE4M3, Fp8Format::kE5M2};

struct Shape {
  int64_t rows;
  int64_t cols;
};
// Tile remainders of every kind; the last three (sides multiples of 8) take the wide kernel.
constexpr Shape kShapes[] = {{1, 1},      {7, 100}, {33, 65}, {129, 768},
                             {300, 1030}, {64, 64}, {8, 136}, {200, 776}};

std::string Name(DType dtype, Fp8Format f) {
  return absl::StrCat(DTypeName(dtype), f == Fp8Format::kE4M3 ? " e4m3" : " e5m2");
}

float DeviceFloat(const float* p) { return ::trainyard::testing::Download(p, 1, DType::kF32)[0]; }

std::vector<uint8_t> DeviceBytes(const DeviceMemory& m) {
  std::vector<uint8_t> v(m.bytes());
  EXPECT_EQ(cudaMemcpy(v.data(), m.get(), v.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  return v;
}

// Bit equality of two code arrays, naming the first difference.
::testing::AssertionResult SameCodes(const std::vector<uint8_t>& got,
                                     const std::vector<uint8_t>& want) {
  if (got.size() != want.size()) return ::testing::AssertionFailure() << "sizes differ";
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] != want[i]) {
      return ::testing::AssertionFailure()
             << absl::StrFormat("code %d: 0x%02x vs 0x%02x", i, got[i], want[i]);
    }
  }
  return ::testing::AssertionSuccess();
}

// Values spread over many binades (so that subnormal codes and rounding ties of every exponent
// occur once scaled), with one outlier that sets the amax.
std::vector<float> WideValues(int64_t n, DType dtype, std::mt19937& rng) {
  std::vector<float> v = RandomActivation(n, dtype, rng);
  std::uniform_int_distribution<int> binade(-20, 4);
  for (float& x : v) x = std::ldexp(x, binade(rng));
  if (n > 0) v[n / 3] = -37.5f;
  if (dtype == DType::kBF16) ::trainyard::testing::RoundToBf16(v);
  return v;
}

// The reference itself, against values the formats define: the largest finite values, the
// smallest subnormals and normals, E5M2's infinity; and every finite code decodes to a value
// that encodes back to it.
TEST(Fp8Reference, FollowsTheFormats) {
  using cpu::DecodeFp8;
  using cpu::EncodeFp8;
  EXPECT_EQ(DecodeFp8(0x7E, Fp8Format::kE4M3), 448.0f);
  EXPECT_EQ(DecodeFp8(0x01, Fp8Format::kE4M3), std::ldexp(1.0f, -9));
  EXPECT_EQ(DecodeFp8(0x08, Fp8Format::kE4M3), std::ldexp(1.0f, -6));
  EXPECT_TRUE(std::isnan(DecodeFp8(0x7F, Fp8Format::kE4M3)));
  EXPECT_EQ(DecodeFp8(0x7B, Fp8Format::kE5M2), 57344.0f);
  EXPECT_EQ(DecodeFp8(0x01, Fp8Format::kE5M2), std::ldexp(1.0f, -16));
  EXPECT_EQ(DecodeFp8(0x04, Fp8Format::kE5M2), std::ldexp(1.0f, -14));
  EXPECT_EQ(DecodeFp8(0xFC, Fp8Format::kE5M2), -INFINITY);
  EXPECT_EQ(EncodeFp8(INFINITY, Fp8Format::kE5M2), 0x7B);  // saturates, as finite values do
  EXPECT_EQ(EncodeFp8(NAN, Fp8Format::kE4M3), 0x7F);
  // Ties go to the even code: 1 + 1/16 lies halfway between 1 and 1 + 1/8 in E4M3.
  EXPECT_EQ(EncodeFp8(1.0625f, Fp8Format::kE4M3), EncodeFp8(1.0f, Fp8Format::kE4M3));
  EXPECT_EQ(EncodeFp8(1.1875f, Fp8Format::kE4M3), EncodeFp8(1.25f, Fp8Format::kE4M3));
  for (Fp8Format f : kFormats) {
    for (int code = 0; code < 256; ++code) {
      const float v = DecodeFp8(static_cast<uint8_t>(code), f);
      if (!std::isfinite(v)) continue;
      EXPECT_EQ(EncodeFp8(v, f), code) << "code " << code;
    }
  }
}

TEST(Fp8Kernels, AbsMaxIsExact) {
  TY_SKIP_WITHOUT_GPU();
  std::mt19937 rng(7);
  for (DType dtype : kDTypes) {
    for (int64_t n : {int64_t{1}, int64_t{100}, int64_t{4097}, int64_t{300 * 1030}}) {
      const std::vector<float> x = WideValues(n, dtype, rng);
      DeviceTensor dx(x, dtype);
      DeviceMemory amax(sizeof(float));
      ASSERT_TRUE(AbsMax(nullptr, dtype, dx.get(), n, amax.as<float>()).ok());
      EXPECT_EQ(DeviceFloat(amax.as<float>()), cpu::AbsMax(x.data(), n))
          << DTypeName(dtype) << " n=" << n;
      // From an address 4 bytes in (not 16-byte aligned): the one-element path.
      const int64_t skip = 4 / DTypeBytes(dtype), rest = std::max<int64_t>(n - skip, 0);
      ASSERT_TRUE(
          AbsMax(nullptr, dtype, static_cast<char*>(dx.get()) + 4, rest, amax.as<float>()).ok());
      EXPECT_EQ(DeviceFloat(amax.as<float>()), cpu::AbsMax(x.data() + skip, rest))
          << DTypeName(dtype) << " n=" << n << " unaligned";
    }
  }
}

TEST(Fp8Kernels, AbsMaxKeepsNaNAndIsZeroForNothing) {
  TY_SKIP_WITHOUT_GPU();
  std::mt19937 rng(8);
  for (DType dtype : kDTypes) {
    std::vector<float> x = WideValues(5000, dtype, rng);
    x[4321] = NAN;
    DeviceTensor dx(x, dtype);
    DeviceMemory amax(sizeof(float));
    ASSERT_TRUE(AbsMax(nullptr, dtype, dx.get(), 5000, amax.as<float>()).ok());
    EXPECT_TRUE(std::isnan(DeviceFloat(amax.as<float>()))) << DTypeName(dtype);
    ASSERT_TRUE(AbsMax(nullptr, dtype, dx.get(), 0, amax.as<float>()).ok());
    EXPECT_EQ(DeviceFloat(amax.as<float>()), 0.0f) << DTypeName(dtype);
  }
}

// Quantizes x with the given amax on the device and on the CPU; both forms compared bit for
// bit, and the scale's inverse exactly. x starts `offset` elements into its allocation (1: not
// 16-byte aligned, which the wide kernel needs).
void ExpectQuantizedAsReference(DType dtype, Fp8Format f, const std::vector<float>& x, Shape s,
                                float amax, const std::string& what, int64_t offset = 0) {
  std::vector<float> padded(offset, 0.0f);
  padded.insert(padded.end(), x.begin(), x.end());
  DeviceTensor dpadded(padded, dtype);
  const void* dx = static_cast<const char*>(dpadded.get()) + offset * DTypeBytes(dtype);
  DeviceTensor damax(std::vector<float>{amax}, DType::kF32);
  DeviceMemory out(s.rows * s.cols), out_t(s.rows * s.cols), scale_inv(sizeof(float));
  ASSERT_TRUE(QuantizeFp8(nullptr, dtype, f, dx, s.rows, s.cols, damax.f32(), out.get(),
                          out_t.get(), scale_inv.as<float>())
                  .ok());
  const float scale = cpu::Fp8Scale(amax, f);
  std::vector<uint8_t> want(s.rows * s.cols), want_t(s.rows * s.cols);
  cpu::QuantizeFp8(x.data(), s.rows, s.cols, scale, f, want.data(), want_t.data());
  EXPECT_TRUE(SameCodes(DeviceBytes(out), want)) << what;
  EXPECT_TRUE(SameCodes(DeviceBytes(out_t), want_t)) << what << " transposed";
  const float got_inv = DeviceFloat(scale_inv.as<float>());
  if (std::isnan(amax)) {
    EXPECT_TRUE(std::isnan(got_inv)) << what;
  } else {
    EXPECT_EQ(got_inv, 1.0f / scale) << what;
  }
  // Without the transpose: the same row-major codes, and out_t never touched.
  DeviceMemory again(s.rows * s.cols);
  ASSERT_TRUE(QuantizeFp8(nullptr, dtype, f, dx, s.rows, s.cols, damax.f32(), again.get(), nullptr,
                          scale_inv.as<float>())
                  .ok());
  EXPECT_TRUE(SameCodes(DeviceBytes(again), want)) << what << " without the transpose";
}

TEST(Fp8Kernels, QuantizeMatchesTheReferenceBitForBit) {
  TY_SKIP_WITHOUT_GPU();
  std::mt19937 rng(9);
  for (DType dtype : kDTypes) {
    for (Fp8Format f : kFormats) {
      for (Shape s : kShapes) {
        const std::vector<float> x = WideValues(s.rows * s.cols, dtype, rng);
        const std::string what = absl::StrCat(Name(dtype, f), " ", s.rows, "x", s.cols);
        const float amax = cpu::AbsMax(x.data(), s.rows * s.cols);
        ExpectQuantizedAsReference(dtype, f, x, s, amax, what);
        if (s.rows % 8 == 0 && s.cols % 8 == 0) {
          ExpectQuantizedAsReference(dtype, f, x, s, amax, what + " unaligned", /*offset=*/1);
        }
      }
    }
  }
}

// An amax below the tensor's (as a stale one would be) saturates the values beyond it to the
// format's largest of their sign; an all-zero tensor encodes as zeros with a finite scale; a
// NaN amax makes every code NaN, so a broken tensor cannot pass as a small one.
TEST(Fp8Kernels, SaturationZerosAndNaN) {
  TY_SKIP_WITHOUT_GPU();
  std::mt19937 rng(10);
  for (Shape s : {Shape{45, 70}, Shape{48, 72}}) {
    for (DType dtype : kDTypes) {
      for (Fp8Format f : kFormats) {
        const std::vector<float> x = WideValues(s.rows * s.cols, dtype, rng);
        const std::string name = absl::StrCat(Name(dtype, f), " ", s.rows, "x", s.cols);
        ExpectQuantizedAsReference(dtype, f, x, s, 0.01f, name + " saturating");
        ExpectQuantizedAsReference(dtype, f, std::vector<float>(s.rows * s.cols, 0.0f), s, 0.0f,
                                   name + " zeros");
        ExpectQuantizedAsReference(dtype, f, x, s, NAN, name + " NaN amax");
      }
    }
  }
  std::vector<uint8_t> codes(4);
  const float big[] = {1e6f, -1e6f, 0.0f, -0.0f};
  cpu::QuantizeFp8(big, 1, 4, 1.0f, Fp8Format::kE4M3, codes.data(), nullptr);
  EXPECT_EQ(cpu::DecodeFp8(codes[0], Fp8Format::kE4M3), 448.0f);
  EXPECT_EQ(cpu::DecodeFp8(codes[1], Fp8Format::kE4M3), -448.0f);
  EXPECT_EQ(codes[2], 0x00);
  EXPECT_EQ(codes[3], 0x80);
}

// An operand quantized on the device: its codes, the scale's inverse, both still on the device.
struct Quantized {
  DeviceMemory codes;
  DeviceMemory scale_inv{sizeof(float)};
  explicit Quantized(int64_t n) : codes(n) {}
};

std::unique_ptr<Quantized> QuantizeOnDevice(const std::vector<float>& x, int64_t rows, int64_t cols,
                                            Fp8Format f) {
  auto q = std::make_unique<Quantized>(rows * cols);
  DeviceTensor dx(x, DType::kBF16);
  DeviceMemory amax(sizeof(float));
  EXPECT_TRUE(AbsMax(nullptr, DType::kBF16, dx.get(), rows * cols, amax.as<float>()).ok());
  EXPECT_TRUE(QuantizeFp8(nullptr, DType::kBF16, f, dx.get(), rows, cols, amax.as<float>(),
                          q->codes.get(), nullptr, q->scale_inv.as<float>())
                  .ok());
  return q;
}

struct Fp8Case {
  int64_t m, n, k;
  Fp8Format a, b;
  DType out;  // bf16 overwritten, fp32 accumulated
  bool fast_accum;
  bool bias;  // a bf16 bias in the epilogue (bf16 out)
};

// The products of the three forms a linear layer needs (forward E4M3 × E4M3 into bf16; input
// gradient E5M2 × E4M3 into bf16; weight gradient E5M2 × E4M3 added to fp32), with and without
// the bias epilogue, against the CPU's
// product of the decoded codes (fp64 sums, times both scales). The tolerance is the output's
// rounding plus fp32 summation error relative to Σ|terms| (a hundred times more with fast
// accumulation).
TEST(Fp8Gemm, ComputesTheProductOfTheDecodedCodes) {
  TY_SKIP_WITHOUT_GPU();
  auto gemm = Gemm::Create();
  ASSERT_TRUE(gemm.ok()) << gemm.status();
  std::mt19937 rng(11);
  const Fp8Case cases[] = {
      {64, 48, 96, Fp8Format::kE4M3, Fp8Format::kE4M3, DType::kBF16, false, false},
      {64, 48, 96, Fp8Format::kE4M3, Fp8Format::kE4M3, DType::kBF16, true, true},
      {32, 80, 48, Fp8Format::kE4M3, Fp8Format::kE4M3, DType::kBF16, false, true},
      {32, 80, 48, Fp8Format::kE5M2, Fp8Format::kE4M3, DType::kBF16, false, false},
      {48, 32, 160, Fp8Format::kE5M2, Fp8Format::kE4M3, DType::kF32, false, false},
      {16, 16, 16, Fp8Format::kE4M3, Fp8Format::kE5M2, DType::kBF16, false, false},
  };
  for (const Fp8Case& c : cases) {
    const std::string what = absl::StrCat(c.m, "x", c.n, "x", c.k, " ", Name(c.out, c.a),
                                          c.b == Fp8Format::kE4M3 ? "·e4m3" : "·e5m2",
                                          c.fast_accum ? " fast" : "", c.bias ? " bias" : "");
    const std::vector<float> a = RandomActivation(c.m * c.k, DType::kBF16, rng, 3.0f);
    const std::vector<float> b = RandomActivation(c.n * c.k, DType::kBF16, rng, 0.02f);
    auto qa = QuantizeOnDevice(a, c.m, c.k, c.a), qb = QuantizeOnDevice(b, c.n, c.k, c.b);
    const std::vector<float> before = RandomActivation(c.m * c.n, DType::kF32, rng);
    const std::vector<float> bias = RandomActivation(c.n, DType::kBF16, rng);
    DeviceTensor dbias(bias, DType::kBF16);
    DeviceTensor out(c.out == DType::kF32 ? before : std::vector<float>(c.m * c.n, 0.0f), c.out);
    if (c.out == DType::kBF16) out.Poison();
    ASSERT_TRUE((*gemm)
                    ->Fp8(nullptr, out.get(), c.out, qa->codes.get(), c.a,
                          qa->scale_inv.as<float>(), qb->codes.get(), c.b,
                          qb->scale_inv.as<float>(), c.m, c.n, c.k, c.bias ? dbias.get() : nullptr,
                          c.fast_accum)
                    .ok())
        << what;
    const std::vector<float> got = out.Read();
    const std::vector<uint8_t> ca = DeviceBytes(qa->codes), cb = DeviceBytes(qb->codes);
    const double scale = static_cast<double>(DeviceFloat(qa->scale_inv.as<float>())) *
                         DeviceFloat(qb->scale_inv.as<float>());
    const double sum_error = c.fast_accum ? 1e-3 : 1e-5;
    for (int64_t i = 0; i < c.m; ++i) {
      for (int64_t j = 0; j < c.n; ++j) {
        double sum = 0.0, magnitude = 0.0;
        for (int64_t p = 0; p < c.k; ++p) {
          const double t = static_cast<double>(cpu::DecodeFp8(ca[i * c.k + p], c.a)) *
                           cpu::DecodeFp8(cb[j * c.k + p], c.b);
          sum += t;
          magnitude += std::fabs(t);
        }
        double want = scale * sum, tolerance = sum_error * scale * magnitude;
        if (c.out == DType::kF32) {
          want += before[i * c.n + j];
          tolerance += 1e-6 * std::fabs(before[i * c.n + j]);
        } else {
          if (c.bias) want += bias[j];
          tolerance += std::ldexp(std::fabs(want), -8);  // bf16's rounding
        }
        ASSERT_LE(std::fabs(got[i * c.n + j] - want), tolerance)
            << what << " at " << i << "," << j << ": " << got[i * c.n + j] << " vs " << want;
      }
    }
  }
}

TEST(Fp8Gemm, RefusesWhatCublasLtCannotRun) {
  TY_SKIP_WITHOUT_GPU();
  auto gemm = Gemm::Create();
  ASSERT_TRUE(gemm.ok()) << gemm.status();
  DeviceMemory a(64 * 64), b(64 * 64), out(64 * 64 * 4), scale(sizeof(float));
  const float* s = scale.as<float>();
  auto run = [&](Fp8Format fa, Fp8Format fb, DType out_type, int64_t m, int64_t n, int64_t k) {
    return (*gemm)->Fp8(nullptr, out.get(), out_type, a.get(), fa, s, b.get(), fb, s, m, n, k);
  };
  constexpr Fp8Format e4 = Fp8Format::kE4M3, e5 = Fp8Format::kE5M2;
  EXPECT_FALSE(run(e5, e5, DType::kBF16, 32, 32, 32).ok());  // no E5M2 × E5M2 kernels
  EXPECT_FALSE(run(e4, e4, DType::kBF16, 32, 32, 40).ok());  // k not a multiple of 16
  EXPECT_FALSE(run(e4, e4, DType::kBF16, 24, 32, 32).ok());
  EXPECT_FALSE(run(e4, e4, DType::kBF16, 32, 8, 32).ok());
  EXPECT_FALSE((*gemm)
                   ->Fp8(nullptr, static_cast<char*>(out.get()) + 8, DType::kBF16, a.get(), e4, s,
                         b.get(), e4, s, 32, 32, 32)
                   .ok());  // output not 16-byte aligned
  EXPECT_FALSE((*gemm)
                   ->Fp8(nullptr, out.get(), DType::kF32, a.get(), e4, s, b.get(), e4, s, 32, 32,
                         32, /*bias=*/b.get())
                   .ok());  // a bias only into bf16
}

}  // namespace
}  // namespace trainyard::kernels::cuda
