// The CUDA LayerNorm/RMSNorm kernels against the CPU reference: forward with and without the
// fused residual add, backward with its accumulate (+=) semantics, and bit-identical weight
// gradients from run to run; RMSNorm over rows split column-wise over ranks against whole rows.
#include "kernels/cuda/norms.h"

#include <cstring>
#include <deque>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/cpu/norms.h"
#include "tests/gpu/device_tensor.h"
#include "tests/gpu/gpu_test_util.h"

namespace trainyard::kernels::cuda {
namespace {

using ::trainyard::testing::DeviceTensor;
using ::trainyard::testing::RandomActivation;
using ::trainyard::testing::RandomVector;
using ::trainyard::testing::RelativeError;
using ::trainyard::testing::Tolerance;

enum class Norm { kLayer, kRms };

struct Shape {
  int64_t rows;
  int64_t c;
};

// Row widths that are not multiples of the warp (100, 1030) and row counts that leave a block of
// warps partly empty (7, 129, 300); 8200 rows make the most row chunks for the weight gradients,
// the last ones empty; 8192 is the widest bf16 row the backward holds in registers (and takes
// more than the default 48 KB of shared memory), 9001 too wide for any register kernel.
constexpr Shape kShapes[] = {{1, 64},    {7, 100},  {129, 768}, {300, 1030},
                             {8200, 64}, {2, 8192}, {3, 9001}};
constexpr DType kDTypes[] = {DType::kF32, DType::kBF16};
constexpr float kEps = 1e-5f;
constexpr DType kF32 = DType::kF32;
// Statistics and parameter gradients are fp32 computed from the same (rounded) inputs as the CPU
// reference, whatever the activations' storage type.
const double kF32Tolerance = Tolerance(DType::kF32);

std::string Label(Norm norm, DType dtype, Shape s) {
  return absl::StrCat(norm == Norm::kLayer ? "LayerNorm" : "RMSNorm", " ", DTypeName(dtype),
                      " rows=", s.rows, " c=", s.c);
}

// Weights near 1, as after initialisation and some training.
std::vector<float> Weights(int64_t c, std::mt19937& rng) {
  std::vector<float> w = RandomVector(c, rng, 0.2f);
  for (float& x : w) x += 1.0f;
  return w;
}

// An activation tensor `shift` elements into its allocation (which is 256-byte aligned): with a
// shift of 1 no row is 16-byte aligned, so the kernels must not use 16-byte accesses even where c
// allows them.
class ShiftedTensor {
 public:
  ShiftedTensor(int64_t count, DType dtype, int64_t shift)
      : mem_(count + shift, dtype), shift_(shift), dtype_(dtype) {}
  ShiftedTensor(const std::vector<float>& host, DType dtype, int64_t shift)
      : ShiftedTensor(static_cast<int64_t>(host.size()), dtype, shift) {
    Write(host);
  }
  void* get() const { return static_cast<char*>(mem_.get()) + shift_ * DTypeBytes(dtype_); }
  void Write(const std::vector<float>& host) {
    std::vector<float> padded(shift_, 0.0f);
    padded.insert(padded.end(), host.begin(), host.end());
    mem_.Write(padded);
  }
  std::vector<float> Read() const {
    std::vector<float> v = mem_.Read();
    v.erase(v.begin(), v.begin() + shift_);
    return v;
  }

 private:
  DeviceTensor mem_;
  int64_t shift_;
  DType dtype_;
};

bool BitsEqual(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// CPU forward of `norm`; bias is ignored by RMSNorm.
void CpuForward(Norm norm, std::vector<float>& out, std::vector<float>& mean,
                std::vector<float>& rstd, const std::vector<float>& inp,
                const std::vector<float>& weight, const std::vector<float>& bias, Shape s) {
  if (norm == Norm::kLayer) {
    cpu::LayerNormForward(out.data(), mean.data(), rstd.data(), inp.data(), weight.data(),
                          bias.data(), s.rows, s.c, kEps);
  } else {
    cpu::RmsNormForward(out.data(), rstd.data(), inp.data(), weight.data(), s.rows, s.c, kEps);
  }
}

// Forward, plain (`fused` false) or with the residual add, whose sum is written over `a` when
// `sum_aliases_a` (the in-place residual stream); activations `shift` elements off alignment.
void CheckForward(Norm norm, DType dtype, Shape s, bool fused, bool sum_aliases_a, bool with_bias,
                  std::mt19937& rng, int64_t shift = 0) {
  const int64_t n = s.rows * s.c;
  const std::vector<float> a = RandomActivation(n, dtype, rng, 1.0f, 0.5f);
  const std::vector<float> b = RandomActivation(n, dtype, rng, 0.5f);
  const std::vector<float> weight = Weights(s.c, rng);
  std::vector<float> bias = RandomVector(s.c, rng, 0.2f);
  if (!with_bias) bias.assign(s.c, 0.0f);

  // The fused kernel normalises the sum as stored, i.e. rounded to the storage type.
  std::vector<float> sum = a;
  if (fused) {
    for (int64_t i = 0; i < n; ++i) sum[i] = a[i] + b[i];
    if (dtype == DType::kBF16) testing::RoundToBf16(sum);
  }
  std::vector<float> out(n), mean(s.rows), rstd(s.rows);
  CpuForward(norm, out, mean, rstd, sum, weight, bias, s);

  ShiftedTensor d_a(a, dtype, shift), d_b(b, dtype, shift), d_sum(n, dtype, shift),
      d_out(n, dtype, shift);
  DeviceTensor d_weight(weight, kF32), d_bias(bias, kF32);
  DeviceTensor d_mean(s.rows, kF32), d_rstd(s.rows, kF32);
  void* sum_ptr = sum_aliases_a ? d_a.get() : d_sum.get();
  const float* bias_ptr = with_bias ? d_bias.f32() : nullptr;
  absl::Status status;
  if (norm == Norm::kLayer && fused) {
    status = AddLayerNormForward(nullptr, dtype, sum_ptr, d_out.get(), d_mean.f32(), d_rstd.f32(),
                                 d_a.get(), d_b.get(), d_weight.f32(), bias_ptr, s.rows, s.c, kEps);
  } else if (norm == Norm::kLayer) {
    status = LayerNormForward(nullptr, dtype, d_out.get(), d_mean.f32(), d_rstd.f32(), d_a.get(),
                              d_weight.f32(), bias_ptr, s.rows, s.c, kEps);
  } else if (fused) {
    status = AddRmsNormForward(nullptr, dtype, sum_ptr, d_out.get(), d_rstd.f32(), d_a.get(),
                               d_b.get(), d_weight.f32(), s.rows, s.c, kEps);
  } else {
    status = RmsNormForward(nullptr, dtype, d_out.get(), d_rstd.f32(), d_a.get(), d_weight.f32(),
                            s.rows, s.c, kEps);
  }
  ASSERT_TRUE(status.ok()) << status;
  TY_CUDA_ASSERT(cudaDeviceSynchronize());

  EXPECT_LE(RelativeError(d_out.Read(), out), Tolerance(dtype)) << "out";
  EXPECT_LE(RelativeError(d_rstd.Read(), rstd), kF32Tolerance) << "rstd";
  if (norm == Norm::kLayer) {
    EXPECT_LE(RelativeError(d_mean.Read(), mean), kF32Tolerance) << "mean";
  }
  if (fused) {
    const std::vector<float> got_sum = sum_aliases_a ? d_a.Read() : d_sum.Read();
    EXPECT_LE(RelativeError(got_sum, sum), Tolerance(dtype)) << "sum";
  }
}

// Backward from nonzero gradients (it accumulates), twice, requiring the same bits for the
// parameter gradients; for LayerNorm a third time without a bias gradient. Activations `shift`
// elements off alignment.
void CheckBackward(Norm norm, DType dtype, Shape s, std::mt19937& rng, int64_t shift = 0) {
  const int64_t n = s.rows * s.c;
  const std::vector<float> inp = RandomActivation(n, dtype, rng, 1.0f, 0.5f);
  const std::vector<float> dout = RandomActivation(n, dtype, rng);
  const std::vector<float> weight = Weights(s.c, rng);
  const std::vector<float> bias(s.c, 0.0f);
  std::vector<float> out(n), mean(s.rows), rstd(s.rows);
  CpuForward(norm, out, mean, rstd, inp, weight, bias, s);

  const std::vector<float> dinp0 = RandomActivation(n, dtype, rng);
  const std::vector<float> dweight0 = RandomVector(s.c, rng);
  const std::vector<float> dbias0 = RandomVector(s.c, rng);
  std::vector<float> dinp = dinp0, dweight = dweight0, dbias = dbias0;
  if (norm == Norm::kLayer) {
    cpu::LayerNormBackward(dinp.data(), dweight.data(), dbias.data(), dout.data(), inp.data(),
                           weight.data(), mean.data(), rstd.data(), s.rows, s.c);
  } else {
    cpu::RmsNormBackward(dinp.data(), dweight.data(), dout.data(), inp.data(), weight.data(),
                         rstd.data(), s.rows, s.c);
  }

  ShiftedTensor d_inp(inp, dtype, shift), d_dout(dout, dtype, shift), d_dinp(n, dtype, shift);
  DeviceTensor d_weight(weight, kF32);
  DeviceTensor d_mean(mean, kF32), d_rstd(rstd, kF32);
  DeviceTensor d_dweight(s.c, kF32), d_dbias(s.c, kF32);
  DeviceTensor d_scratch(NormBackwardScratchFloats(s.rows, s.c), kF32);
  auto run = [&](bool with_bias) {
    d_dinp.Write(dinp0);
    d_dweight.Write(dweight0);
    d_dbias.Write(dbias0);
    d_scratch.Poison();
    if (norm == Norm::kRms) {
      return RmsNormBackward(nullptr, dtype, d_dinp.get(), d_dweight.f32(), d_dout.get(),
                             d_inp.get(), d_weight.f32(), d_rstd.f32(), s.rows, s.c,
                             d_scratch.f32());
    }
    return LayerNormBackward(nullptr, dtype, d_dinp.get(), d_dweight.f32(),
                             with_bias ? d_dbias.f32() : nullptr, d_dout.get(), d_inp.get(),
                             d_weight.f32(), d_mean.f32(), d_rstd.f32(), s.rows, s.c,
                             d_scratch.f32());
  };

  absl::Status status = run(true);
  ASSERT_TRUE(status.ok()) << status;
  TY_CUDA_ASSERT(cudaDeviceSynchronize());
  const std::vector<float> got_dweight = d_dweight.Read();
  const std::vector<float> got_dbias = d_dbias.Read();
  EXPECT_LE(RelativeError(d_dinp.Read(), dinp), Tolerance(dtype)) << "dinp";
  EXPECT_LE(RelativeError(got_dweight, dweight), kF32Tolerance) << "dweight";
  if (norm == Norm::kLayer) {
    EXPECT_LE(RelativeError(got_dbias, dbias), kF32Tolerance) << "dbias";
  } else {
    EXPECT_TRUE(BitsEqual(got_dbias, dbias0)) << "RMSNorm has no bias to write";
  }

  status = run(true);
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_TRUE(BitsEqual(d_dweight.Read(), got_dweight)) << "dweight differs between runs";
  EXPECT_TRUE(BitsEqual(d_dbias.Read(), got_dbias)) << "dbias differs between runs";

  if (norm == Norm::kLayer) {
    status = run(false);
    ASSERT_TRUE(status.ok()) << status;
    EXPECT_TRUE(BitsEqual(d_dweight.Read(), got_dweight)) << "dweight without a bias gradient";
    EXPECT_TRUE(BitsEqual(d_dbias.Read(), dbias0)) << "null dbias must not be written";
  }
}

TEST(CudaNorms, ForwardMatchesCpu) {
  TY_SKIP_WITHOUT_GPU();
  std::mt19937 rng(1);
  for (Norm norm : {Norm::kLayer, Norm::kRms}) {
    for (DType dtype : kDTypes) {
      for (Shape s : kShapes) {
        SCOPED_TRACE(Label(norm, dtype, s));
        CheckForward(norm, dtype, s, /*fused=*/false, /*sum_aliases_a=*/false,
                     /*with_bias=*/true, rng);
        if (norm == Norm::kLayer) {
          CheckForward(norm, dtype, s, false, false, /*with_bias=*/false, rng);
        }
      }
    }
  }
}

TEST(CudaNorms, FusedAddForwardMatchesAddThenNorm) {
  TY_SKIP_WITHOUT_GPU();
  std::mt19937 rng(2);
  for (Norm norm : {Norm::kLayer, Norm::kRms}) {
    for (DType dtype : kDTypes) {
      for (Shape s : kShapes) {
        SCOPED_TRACE(Label(norm, dtype, s));
        CheckForward(norm, dtype, s, /*fused=*/true, /*sum_aliases_a=*/false,
                     /*with_bias=*/true, rng);
        CheckForward(norm, dtype, s, /*fused=*/true, /*sum_aliases_a=*/true, /*with_bias=*/true,
                     rng);
      }
    }
  }
}

TEST(CudaNorms, BackwardAccumulatesLikeCpuAndIsDeterministic) {
  TY_SKIP_WITHOUT_GPU();
  std::mt19937 rng(3);
  for (Norm norm : {Norm::kLayer, Norm::kRms}) {
    for (DType dtype : kDTypes) {
      for (Shape s : kShapes) {
        SCOPED_TRACE(Label(norm, dtype, s));
        CheckBackward(norm, dtype, s, rng);
      }
    }
  }
}

// c = 768 allows 16-byte accesses, but rows one element off alignment must not use them.
TEST(CudaNorms, MisalignedRowsMatchCpu) {
  TY_SKIP_WITHOUT_GPU();
  std::mt19937 rng(4);
  const Shape s{129, 768};
  for (Norm norm : {Norm::kLayer, Norm::kRms}) {
    for (DType dtype : kDTypes) {
      SCOPED_TRACE(Label(norm, dtype, s));
      CheckForward(norm, dtype, s, /*fused=*/false, /*sum_aliases_a=*/false, /*with_bias=*/true,
                   rng, /*shift=*/1);
      CheckForward(norm, dtype, s, /*fused=*/true, /*sum_aliases_a=*/true, /*with_bias=*/true, rng,
                   /*shift=*/1);
      CheckBackward(norm, dtype, s, rng, /*shift=*/1);
    }
  }
}

// Columns [first, first + c) of each row of a [rows, n] matrix.
std::vector<float> Columns(const std::vector<float>& m, int64_t rows, int64_t n, int64_t first,
                           int64_t c) {
  std::vector<float> out;
  for (int64_t r = 0; r < rows; ++r) {
    out.insert(out.end(), m.begin() + r * n + first, m.begin() + r * n + first + c);
  }
  return out;
}

// RMSNorm over rows of n columns split over `ranks` ranks of c = n / ranks columns each, the
// per-row sums and dots added over the ranks on the host (as the tensor-parallel group's sum
// does), against the whole rows' norm on the CPU; the CPU's split steps too, which with one rank
// give the whole norm's bits. Outputs start NaN-poisoned; the weight gradient's bits repeat.
void CheckSplitRows(DType dtype, int64_t rows, int64_t n, int ranks, std::mt19937& rng) {
  const int64_t c = n / ranks;
  const std::vector<float> inp = RandomActivation(rows * n, dtype, rng, 1.0f, 0.5f);
  const std::vector<float> dout = RandomActivation(rows * n, dtype, rng);
  const std::vector<float> weight = Weights(n, rng);
  const std::vector<float> dinp0 = RandomActivation(rows * n, dtype, rng);
  std::vector<float> out(rows * n), rstd(rows), dinp = dinp0, dweight(n, 0.0f);
  cpu::RmsNormForward(out.data(), rstd.data(), inp.data(), weight.data(), rows, n, kEps);
  cpu::RmsNormBackward(dinp.data(), dweight.data(), dout.data(), inp.data(), weight.data(),
                       rstd.data(), rows, n);

  std::vector<float> sums(rows, 0.0f), dots(rows, 0.0f);
  std::deque<DeviceTensor> d_inp, d_dout, d_out, d_dinp, d_weight, d_dweight;  // not movable
  DeviceTensor d_part(rows, kF32), d_scratch(NormBackwardScratchFloats(rows, c), kF32);
  for (int k = 0; k < ranks; ++k) {
    d_inp.emplace_back(Columns(inp, rows, n, k * c, c), dtype);
    d_dout.emplace_back(Columns(dout, rows, n, k * c, c), dtype);
    d_dinp.emplace_back(Columns(dinp0, rows, n, k * c, c), dtype);
    d_out.emplace_back(rows * c, dtype);
    d_weight.emplace_back(std::vector<float>(weight.begin() + k * c, weight.begin() + (k + 1) * c),
                          kF32);
    d_dweight.emplace_back(std::vector<float>(c, 0.0f), kF32);
    ASSERT_TRUE(RowSquareSums(nullptr, dtype, d_part.f32(), d_inp[k].get(), rows, c).ok());
    const std::vector<float> part = d_part.Read();
    for (int64_t r = 0; r < rows; ++r) sums[r] += part[r];
  }
  DeviceTensor d_rstd(rows, kF32);
  for (int k = 0; k < ranks; ++k) {
    SCOPED_TRACE(absl::StrCat("rank ", k));
    d_rstd.Write(sums);
    ASSERT_TRUE(RmsNormFromSums(nullptr, dtype, d_out[k].get(), d_rstd.f32(), d_inp[k].get(),
                                d_weight[k].f32(), rows, c, n, kEps)
                    .ok());
    EXPECT_LE(RelativeError(d_rstd.Read(), rstd), kF32Tolerance) << "rstd";
    EXPECT_LE(RelativeError(d_out[k].Read(), Columns(out, rows, n, k * c, c)), Tolerance(dtype))
        << "out";
    ASSERT_TRUE(RmsNormDots(nullptr, dtype, d_part.f32(), d_dout[k].get(), d_inp[k].get(),
                            d_weight[k].f32(), d_rstd.f32(), rows, c)
                    .ok());
    const std::vector<float> part = d_part.Read();
    for (int64_t r = 0; r < rows; ++r) dots[r] += part[r];
  }
  DeviceTensor d_dots(dots, kF32);
  for (int k = 0; k < ranks; ++k) {
    SCOPED_TRACE(absl::StrCat("rank ", k));
    auto backward = [&] {
      d_scratch.Poison();
      return RmsNormBackwardFromDots(nullptr, dtype, d_dinp[k].get(), d_dweight[k].f32(),
                                     d_dout[k].get(), d_inp[k].get(), d_weight[k].f32(),
                                     d_rstd.f32(), d_dots.f32(), rows, c, n, d_scratch.f32());
    };
    ASSERT_TRUE(backward().ok());
    EXPECT_LE(RelativeError(d_dinp[k].Read(), Columns(dinp, rows, n, k * c, c)), Tolerance(dtype))
        << "dinp";
    const std::vector<float> got = d_dweight[k].Read();
    EXPECT_LE(RelativeError(
                  got, std::vector<float>(dweight.begin() + k * c, dweight.begin() + (k + 1) * c)),
              kF32Tolerance)
        << "dweight";
    d_dweight[k].Write(std::vector<float>(c, 0.0f));
    ASSERT_TRUE(backward().ok());
    EXPECT_TRUE(BitsEqual(d_dweight[k].Read(), got)) << "dweight differs between runs";
  }

  // The CPU's split steps on one rank give RmsNormForward's and RmsNormBackward's bits.
  std::vector<float> one_out(rows * n), one_rstd(rows), one_dots(rows), one_dinp = dinp0,
                                                                        one_dweight(n, 0.0f);
  cpu::RowSquareSums(one_rstd.data(), inp.data(), rows, n);
  cpu::RmsNormFromSums(one_out.data(), one_rstd.data(), inp.data(), weight.data(), rows, n, n,
                       kEps);
  cpu::RmsNormDots(one_dots.data(), dout.data(), inp.data(), weight.data(), one_rstd.data(), rows,
                   n);
  cpu::RmsNormBackwardFromDots(one_dinp.data(), one_dweight.data(), dout.data(), inp.data(),
                               weight.data(), one_rstd.data(), one_dots.data(), rows, n, n);
  EXPECT_TRUE(BitsEqual(one_out, out) && BitsEqual(one_rstd, rstd)) << "CPU forward";
  EXPECT_TRUE(BitsEqual(one_dinp, dinp) && BitsEqual(one_dweight, dweight)) << "CPU backward";
}

// A norm over each row's whole query projection with its heads split over tensor-parallel ranks:
// odd row counts, widths that are not multiples of the warp, one to four ranks.
TEST(CudaNorms, SplitRowsMatchWholeRows) {
  TY_SKIP_WITHOUT_GPU();
  std::mt19937 rng(5);
  for (DType dtype : kDTypes) {
    for (const auto& [rows, n, ranks] :
         {std::tuple<int64_t, int64_t, int>{7, 96, 2}, {37, 120, 3}, {300, 256, 4}, {5, 48, 1}}) {
      SCOPED_TRACE(absl::StrCat(DTypeName(dtype), " rows=", rows, " n=", n, " ranks=", ranks));
      CheckSplitRows(dtype, rows, n, ranks, rng);
    }
  }
}

TEST(CudaNorms, RejectsBadArguments) {
  TY_SKIP_WITHOUT_GPU();
  DeviceTensor x(64, kF32), w(64, kF32), stats(1, kF32), scratch(1024, kF32);
  EXPECT_EQ(LayerNormForward(nullptr, kF32, x.get(), stats.f32(), stats.f32(), x.get(), w.f32(),
                             nullptr, 1, 0, kEps)
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      RmsNormForward(nullptr, kF32, x.get(), stats.f32(), x.get(), nullptr, 1, 64, kEps).code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(AddLayerNormForward(nullptr, kF32, x.get(), x.get(), stats.f32(), stats.f32(), x.get(),
                                nullptr, w.f32(), nullptr, 1, 64, kEps)
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LayerNormBackward(nullptr, kF32, x.get(), w.f32(), nullptr, x.get(), x.get(), w.f32(),
                              stats.f32(), stats.f32(), 1, 64, /*scratch=*/nullptr)
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RmsNormFromSums(nullptr, kF32, x.get(), stats.f32(), x.get(), w.f32(), 1, 64,
                            /*n=*/32, kEps)
                .code(),
            absl::StatusCode::kInvalidArgument);  // fewer columns in all than here
  EXPECT_EQ(RmsNormBackwardFromDots(nullptr, kF32, x.get(), w.f32(), x.get(), x.get(), w.f32(),
                                    stats.f32(), stats.f32(), 1, 64, 128, /*scratch=*/nullptr)
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(NormBackwardScratchFloats(0, 64), 0);
  EXPECT_GE(NormBackwardScratchFloats(300, 1030), 2 * 1030);
}

}  // namespace
}  // namespace trainyard::kernels::cuda
