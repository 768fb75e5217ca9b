// The CUDA elementwise kernels against the CPU reference (or exact host arithmetic), both
// storage types; the column sums and the sum of squares also give the same bits on every run.
#include "kernels/cuda/elementwise.h"

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/cpu/linear.h"
#include "tests/gpu/device_tensor.h"
#include "tests/gpu/gpu_test_util.h"

namespace trainyard::kernels::cuda {
namespace {

using ::trainyard::testing::DeviceMemory;
using ::trainyard::testing::DeviceTensor;
using ::trainyard::testing::DeviceValues;
using ::trainyard::testing::RandomActivation;
using ::trainyard::testing::RandomVector;
using ::trainyard::testing::RelativeError;
using ::trainyard::testing::RoundToBf16;
using ::trainyard::testing::Tolerance;

constexpr DType kDTypes[] = {DType::kF32, DType::kBF16};
constexpr DType kF32 = DType::kF32;
constexpr int64_t kSizes[] = {1, 100, 4097, 300 * 1030};

struct Shape {
  int64_t m;
  int64_t n;
};
constexpr Shape kShapes[] = {{1, 64}, {7, 100}, {129, 768}, {300, 1030}, {2000, 3}};

// Exact equality, reporting the first mismatch instead of printing whole tensors.
::testing::AssertionResult Identical(const std::vector<float>& got,
                                     const std::vector<float>& want) {
  if (got.size() != want.size()) return ::testing::AssertionFailure() << "sizes differ";
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0) {
      return ::testing::AssertionFailure()
             << "element " << i << ": " << got[i] << " vs " << want[i];
    }
  }
  return ::testing::AssertionSuccess();
}

std::string Label(DType dtype, Shape s) {
  return absl::StrCat(DTypeName(dtype), " m=", s.m, " n=", s.n);
}

TEST(CudaElementwise, AddMatchesHost) {
  TY_SKIP_WITHOUT_GPU();
  std::mt19937 rng(31);
  for (DType dtype : kDTypes) {
    for (int64_t n : kSizes) {
      SCOPED_TRACE(absl::StrCat(DTypeName(dtype), " n=", n));
      const std::vector<float> a = RandomActivation(n, dtype, rng);
      const std::vector<float> b = RandomActivation(n, dtype, rng);
      std::vector<float> want(n);
      for (int64_t i = 0; i < n; ++i) want[i] = a[i] + b[i];
      if (dtype == DType::kBF16) RoundToBf16(want);

      DeviceTensor d_a(a, dtype), d_b(b, dtype), d_out(n, dtype);
      absl::Status status = Add(nullptr, dtype, d_out.get(), d_a.get(), d_b.get(), n);
      ASSERT_TRUE(status.ok()) << status;
      EXPECT_LE(RelativeError(d_out.Read(), want), Tolerance(dtype));
      // In place, as the residual stream is updated.
      status = Add(nullptr, dtype, d_a.get(), d_a.get(), d_b.get(), n);
      ASSERT_TRUE(status.ok()) << status;
      EXPECT_LE(RelativeError(d_a.Read(), want), Tolerance(dtype)) << "out aliases a";
    }
  }
}

TEST(CudaElementwise, AddBiasMatchesCpu) {
  TY_SKIP_WITHOUT_GPU();
  std::mt19937 rng(32);
  for (DType dtype : kDTypes) {
    for (Shape s : kShapes) {
      SCOPED_TRACE(Label(dtype, s));
      const std::vector<float> out0 = RandomActivation(s.m * s.n, dtype, rng);
      const std::vector<float> bias = RandomVector(s.n, rng);
      std::vector<float> want = out0;
      cpu::AddBias(want.data(), bias.data(), s.m, s.n);

      DeviceTensor d_out(out0, dtype), d_bias(bias, kF32);
      const absl::Status status = AddBias(nullptr, dtype, d_out.get(), d_bias.f32(), s.m, s.n);
      ASSERT_TRUE(status.ok()) << status;
      EXPECT_LE(RelativeError(d_out.Read(), want), Tolerance(dtype));
    }
  }
}

// Each group's rows take that group's bias row: five groups over 45 rows, the second and the
// last empty, widths with and without 16-byte rows.
TEST(CudaElementwise, AddGroupedBiasMatchesCpuGroupByGroup) {
  TY_SKIP_WITHOUT_GPU();
  std::mt19937 rng(34);
  const std::vector<int64_t> offsets = {0, 7, 7, 20, 45, 45};
  const int groups = static_cast<int>(offsets.size()) - 1;
  const int64_t m = offsets.back();
  const DeviceValues<int64_t> d_offsets(offsets);
  for (DType dtype : kDTypes) {
    for (int64_t n : {24, 37}) {
      SCOPED_TRACE(absl::StrCat(DTypeName(dtype), " n=", n));
      const std::vector<float> out0 = RandomActivation(m * n, dtype, rng);
      const std::vector<float> bias = RandomVector(groups * n, rng);
      std::vector<float> want = out0;
      for (int g = 0; g < groups; ++g) {
        cpu::AddBias(want.data() + offsets[g] * n, bias.data() + g * n, offsets[g + 1] - offsets[g],
                     n);
      }
      if (dtype == DType::kBF16) RoundToBf16(want);
      DeviceTensor d_out(out0, dtype), d_bias(bias, kF32);
      const absl::Status status =
          AddGroupedBias(nullptr, dtype, d_out.get(), d_bias.f32(), d_offsets.get(), groups, m, n);
      ASSERT_TRUE(status.ok()) << status;
      EXPECT_TRUE(Identical(d_out.Read(), want)) << "one rounding of x + bias, as AddBias";
    }
  }
}

TEST(CudaElementwise, FillAndScale) {
  TY_SKIP_WITHOUT_GPU();
  std::mt19937 rng(33);
  for (DType dtype : kDTypes) {
    for (int64_t n : kSizes) {
      SCOPED_TRACE(absl::StrCat(DTypeName(dtype), " n=", n));
      std::vector<float> want(n, 0.37f);
      if (dtype == DType::kBF16) RoundToBf16(want);
      DeviceTensor d_out(n, dtype);
      const absl::Status status = Fill(nullptr, dtype, d_out.get(), 0.37f, n);
      ASSERT_TRUE(status.ok()) << status;
      EXPECT_TRUE(Identical(d_out.Read(), want));
    }
  }
  for (int64_t n : kSizes) {
    SCOPED_TRACE(absl::StrCat("Scale n=", n));
    const std::vector<float> x = RandomVector(n, rng);
    std::vector<float> want = x;
    for (float& v : want) v *= -0.3f;
    DeviceTensor d_x(x, kF32);
    const absl::Status status = Scale(nullptr, d_x.f32(), n, -0.3f);
    ASSERT_TRUE(status.ok()) << status;
    EXPECT_TRUE(Identical(d_x.Read(), want));  // one IEEE multiplication on either side
  }
}

// An activation times a factor (Granite's multipliers), rounded once to its storage type, into
// another buffer and in place.
TEST(CudaElementwise, ScaleActivationsRoundsOnce) {
  TY_SKIP_WITHOUT_GPU();
  std::mt19937 rng(36);
  for (DType dtype : kDTypes) {
    for (int64_t n : kSizes) {
      SCOPED_TRACE(absl::StrCat(DTypeName(dtype), " n=", n));
      std::vector<float> x = RandomVector(n, rng);
      if (dtype == DType::kBF16) RoundToBf16(x);
      std::vector<float> want = x;
      for (float& v : want) v *= 0.22f;
      if (dtype == DType::kBF16) RoundToBf16(want);
      DeviceTensor d_x(x, dtype), d_out(n, dtype);
      absl::Status status = Scale(nullptr, dtype, d_out.get(), d_x.get(), n, 0.22f);
      ASSERT_TRUE(status.ok()) << status;
      EXPECT_TRUE(Identical(d_out.Read(), want));
      status = Scale(nullptr, dtype, d_x.get(), d_x.get(), n, 0.22f);
      ASSERT_TRUE(status.ok()) << status;
      EXPECT_TRUE(Identical(d_x.Read(), want));
    }
  }
}

TEST(CudaElementwise, ConvertRoundsToNearestEvenAndCopies) {
  TY_SKIP_WITHOUT_GPU();
  std::mt19937 rng(34);
  for (int64_t n : kSizes) {
    SCOPED_TRACE(absl::StrCat("n=", n));
    const std::vector<float> f32 = RandomVector(n, rng, 3.0f);  // not representable in bf16
    std::vector<float> rounded = f32;
    RoundToBf16(rounded);

    DeviceTensor d_f32(f32, kF32), d_bf16(n, DType::kBF16);
    absl::Status status = Convert(nullptr, DType::kBF16, d_bf16.get(), kF32, d_f32.get(), n);
    ASSERT_TRUE(status.ok()) << status;
    EXPECT_TRUE(Identical(d_bf16.Read(), rounded)) << "f32 -> bf16";

    DeviceTensor d_back(n, kF32);
    status = Convert(nullptr, kF32, d_back.get(), DType::kBF16, d_bf16.get(), n);
    ASSERT_TRUE(status.ok()) << status;
    EXPECT_TRUE(Identical(d_back.Read(), rounded)) << "bf16 -> f32";

    DeviceTensor d_copy(n, kF32), d_bf16_copy(n, DType::kBF16);
    status = Convert(nullptr, kF32, d_copy.get(), kF32, d_f32.get(), n);
    ASSERT_TRUE(status.ok()) << status;
    EXPECT_TRUE(Identical(d_copy.Read(), f32)) << "f32 -> f32";
    status = Convert(nullptr, DType::kBF16, d_bf16_copy.get(), DType::kBF16, d_bf16.get(), n);
    ASSERT_TRUE(status.ok()) << status;
    EXPECT_TRUE(Identical(d_bf16_copy.Read(), rounded)) << "bf16 -> bf16";

    status = Convert(nullptr, kF32, d_f32.get(), kF32, d_f32.get(), n);
    ASSERT_TRUE(status.ok()) << status;
    EXPECT_TRUE(Identical(d_f32.Read(), f32)) << "same buffer";
  }
}

// The pointwise kernels move 16 bytes an access where every pointer allows it and one element
// at a time otherwise: pointers one element past an allocation's start take the second path.
TEST(CudaElementwise, PointwiseKernelsTakeMisalignedPointers) {
  TY_SKIP_WITHOUT_GPU();
  std::mt19937 rng(38);
  const int64_t n = 4099;
  for (DType dtype : kDTypes) {
    SCOPED_TRACE(DTypeName(dtype));
    const int64_t bytes = DTypeBytes(dtype);
    std::vector<float> a = RandomActivation(n + 1, dtype, rng);
    std::vector<float> b = RandomActivation(n + 1, dtype, rng);
    DeviceTensor d_a(a, dtype), d_b(b, dtype), d_out(n + 1, dtype);
    auto at1 = [bytes](const DeviceTensor& t) { return static_cast<char*>(t.get()) + bytes; };
    ASSERT_TRUE(Add(nullptr, dtype, at1(d_out), at1(d_a), d_b.get(), n).ok());
    std::vector<float> want(n);
    for (int64_t i = 0; i < n; ++i) want[i] = a[i + 1] + b[i];
    if (dtype == DType::kBF16) RoundToBf16(want);
    std::vector<float> got = d_out.Read();
    EXPECT_LE(RelativeError({got.begin() + 1, got.end()}, want), Tolerance(dtype)) << "add";

    ASSERT_TRUE(Fill(nullptr, dtype, at1(d_out), 0.37f, n).ok());
    got = d_out.Read();
    std::vector<float> filled(n, 0.37f);
    if (dtype == DType::kBF16) RoundToBf16(filled);
    EXPECT_TRUE(Identical({got.begin() + 1, got.end()}, filled)) << "fill";
  }
  const std::vector<float> f32 = RandomVector(n + 1, rng, 3.0f);
  std::vector<float> rounded(f32.begin() + 1, f32.end());
  RoundToBf16(rounded);
  DeviceTensor d_f32(f32, kF32), d_bf16(n, DType::kBF16);
  ASSERT_TRUE(Convert(nullptr, DType::kBF16, d_bf16.get(), kF32, d_f32.f32() + 1, n).ok());
  EXPECT_TRUE(Identical(d_bf16.Read(), rounded)) << "f32 -> bf16";
  ASSERT_TRUE(Scale(nullptr, d_f32.f32() + 1, n, -0.5f).ok());
  std::vector<float> scaled(f32.begin() + 1, f32.end());
  for (float& v : scaled) v *= -0.5f;
  const std::vector<float> after = d_f32.Read();
  EXPECT_TRUE(Identical({after.begin() + 1, after.end()}, scaled)) << "scale";
  EXPECT_EQ(after[0], f32[0]) << "scale wrote before its range";
}

TEST(CudaElementwise, ColumnSumsAccumulateLikeCpuAndAreDeterministic) {
  TY_SKIP_WITHOUT_GPU();
  std::mt19937 rng(35);
  for (DType dtype : kDTypes) {
    for (Shape s : kShapes) {
      SCOPED_TRACE(Label(dtype, s));
      const std::vector<float> dout = RandomActivation(s.m * s.n, dtype, rng);
      const std::vector<float> dbias0 = RandomVector(s.n, rng);
      std::vector<float> want = dbias0;
      cpu::AccumulateColumnSums(want.data(), dout.data(), s.m, s.n);

      DeviceTensor d_dout(dout, dtype), d_dbias(s.n, kF32);
      DeviceTensor d_scratch(ColumnSumScratchFloats(s.m, s.n), kF32);
      auto run = [&] {
        d_dbias.Write(dbias0);
        d_scratch.Poison();
        return AccumulateColumnSums(nullptr, dtype, d_dbias.f32(), d_dout.get(), s.m, s.n,
                                    d_scratch.f32());
      };
      absl::Status status = run();
      ASSERT_TRUE(status.ok()) << status;
      const std::vector<float> first = d_dbias.Read();
      EXPECT_LE(RelativeError(first, want), Tolerance(kF32));
      status = run();
      ASSERT_TRUE(status.ok()) << status;
      const std::vector<float> second = d_dbias.Read();
      EXPECT_EQ(std::memcmp(first.data(), second.data(), first.size() * sizeof(float)), 0)
          << "column sums differ between runs";
    }
  }
}

// Grouped column sums (an MoE layer's bias gradients, expert by expert) give each range the
// bits AccumulateColumnSums gives it alone: ranges of 5 rows, none, 1995 (many chunks) and 40.
TEST(CudaElementwise, GroupedColumnSumsEqualEachRangeAlone) {
  TY_SKIP_WITHOUT_GPU();
  std::mt19937 rng(36);
  const std::vector<int64_t> offsets = {0, 5, 5, 2000, 2040};
  const int groups = static_cast<int>(offsets.size()) - 1;
  const int64_t m = offsets.back();
  const DeviceValues<int64_t> d_table(GroupedColumnSumTable(offsets.data(), groups));
  for (DType dtype : kDTypes) {
    for (int64_t n : {24, 37}) {
      SCOPED_TRACE(absl::StrCat(DTypeName(dtype), " n=", n));
      const std::vector<float> dout = RandomActivation(m * n, dtype, rng);
      const std::vector<float> dbias0 = RandomVector(groups * n, rng);
      DeviceTensor d_dout(dout, dtype), d_grouped(dbias0, kF32), d_alone(dbias0, kF32);
      DeviceTensor d_scratch(GroupedColumnSumScratchFloats(offsets.data(), groups, n), kF32);
      d_scratch.Poison();
      absl::Status status =
          AccumulateGroupedColumnSums(nullptr, dtype, d_grouped.f32(), d_dout.get(), offsets.data(),
                                      groups, n, d_table.get(), d_scratch.f32());
      ASSERT_TRUE(status.ok()) << status;
      for (int g = 0; g < groups; ++g) {
        const int64_t rows = offsets[g + 1] - offsets[g];
        DeviceTensor scratch(std::max<int64_t>(ColumnSumScratchFloats(rows, n), 1), kF32);
        status = AccumulateColumnSums(
            nullptr, dtype, d_alone.f32() + g * n,
            static_cast<const char*>(d_dout.get()) + offsets[g] * n * DTypeBytes(dtype), rows, n,
            scratch.f32());
        ASSERT_TRUE(status.ok()) << status;
      }
      EXPECT_TRUE(Identical(d_grouped.Read(), d_alone.Read()));
      std::vector<float> want = dbias0;  // and the CPU's sums, range by range
      for (int g = 0; g < groups; ++g) {
        cpu::AccumulateColumnSums(want.data() + g * n, dout.data() + offsets[g] * n,
                                  offsets[g + 1] - offsets[g], n);
      }
      EXPECT_LE(RelativeError(d_grouped.Read(), want), Tolerance(kF32));
    }
  }
}

TEST(CudaElementwise, SumOfSquaresIsExactEnoughAndDeterministic) {
  TY_SKIP_WITHOUT_GPU();
  std::mt19937 rng(36);
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{100}, int64_t{4097}, int64_t{3000001}}) {
    SCOPED_TRACE(absl::StrCat("n=", n));
    const std::vector<float> x = RandomVector(n, rng, 0.01f);
    double want = 0.0;
    for (float v : x) want += static_cast<double>(v) * v;

    DeviceTensor d_x(x, kF32);
    DeviceMemory d_result(sizeof(double));
    DeviceMemory d_scratch(SumOfSquaresScratchDoubles(n) * sizeof(double));
    auto run = [&](double* out) {
      d_result.Poison();
      d_scratch.Poison();
      const absl::Status status = SumOfSquares(nullptr, n == 0 ? nullptr : d_x.f32(), n,
                                               d_result.as<double>(), d_scratch.as<double>());
      if (!status.ok()) return status;
      cudaMemcpy(out, d_result.get(), sizeof(double), cudaMemcpyDeviceToHost);
      return absl::OkStatus();
    };
    double first = NAN, second = NAN;
    absl::Status status = run(&first);
    ASSERT_TRUE(status.ok()) << status;
    status = run(&second);
    ASSERT_TRUE(status.ok()) << status;
    // Only the order of fp64 additions differs from the host's.
    EXPECT_LE(std::fabs(first - want), 1e-12 * want) << first << " vs " << want;
    EXPECT_EQ(std::memcmp(&first, &second, sizeof(double)), 0) << "differs between runs";
  }
}

// Many ranges at once (more than one launch holds, some empty, sizes around a block's share):
// each range's result has exactly the bits SumOfSquares gives it alone.
TEST(CudaElementwise, SumOfSquaresMultiGivesEachRangeItsOwnBits) {
  TY_SKIP_WITHOUT_GPU();
  std::mt19937 rng(37);
  std::vector<int64_t> sizes = {0, 1, 2047, 2048, 2049, 300001, 0, 77};
  for (int i = 0; i < 150; ++i) sizes.push_back(1 + (i * 611) % 5000);
  // The ranges lie one after another in one buffer.
  int64_t total = 0;
  for (int64_t n : sizes) total += n;
  const DeviceTensor d_x(RandomVector(total, rng, 0.01f), kF32);
  std::vector<SquaresRange> ranges;
  int64_t at = 0;
  for (int64_t n : sizes) {
    ranges.push_back({n == 0 ? nullptr : d_x.f32() + at, n});
    at += n;
  }
  const int64_t k = static_cast<int64_t>(ranges.size());
  DeviceMemory d_results(k * sizeof(double));
  DeviceMemory d_scratch(SumOfSquaresScratchDoubles(ranges) * sizeof(double));
  d_results.Poison();
  d_scratch.Poison();
  absl::Status status =
      SumOfSquaresMulti(nullptr, ranges, d_results.as<double>(), d_scratch.as<double>());
  ASSERT_TRUE(status.ok()) << status;
  std::vector<double> got(k);
  cudaMemcpy(got.data(), d_results.get(), k * sizeof(double), cudaMemcpyDeviceToHost);

  DeviceMemory d_one(sizeof(double));
  for (int64_t i = 0; i < k; ++i) {
    SCOPED_TRACE(absl::StrCat("range ", i, " of ", sizes[i]));
    DeviceMemory d_alone(SumOfSquaresScratchDoubles(sizes[i]) * sizeof(double));
    status = SumOfSquares(nullptr, ranges[i].x, sizes[i], d_one.as<double>(), d_alone.as<double>());
    ASSERT_TRUE(status.ok()) << status;
    double want = NAN;
    cudaMemcpy(&want, d_one.get(), sizeof(double), cudaMemcpyDeviceToHost);
    EXPECT_EQ(std::memcmp(&got[i], &want, sizeof(double)), 0) << got[i] << " vs " << want;
  }
  EXPECT_EQ(got[0], 0.0);
  const std::vector<SquaresRange> missing = {{nullptr, 5}};
  EXPECT_EQ(
      SumOfSquaresMulti(nullptr, missing, d_results.as<double>(), d_scratch.as<double>()).code(),
      absl::StatusCode::kInvalidArgument);
}

TEST(CudaElementwise, RejectsBadArguments) {
  TY_SKIP_WITHOUT_GPU();
  DeviceTensor x(64, kF32);
  EXPECT_EQ(Add(nullptr, kF32, x.get(), nullptr, x.get(), 64).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(AddBias(nullptr, kF32, x.get(), x.f32(), 1, 0).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Convert(nullptr, DType::kBF16, x.get(), kF32, x.get(), 32).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(AccumulateColumnSums(nullptr, kF32, x.f32(), x.get(), 2, 32, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SumOfSquares(nullptr, x.f32(), 64, nullptr, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ColumnSumScratchFloats(0, 8), 0);
  EXPECT_GE(SumOfSquaresScratchDoubles(0), 1);
}

}  // namespace
}  // namespace trainyard::kernels::cuda
