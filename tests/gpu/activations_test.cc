// The CUDA GELU and SwiGLU kernels against the CPU reference, forward and backward, both storage
// types, with tensors at 16-byte-aligned and misaligned addresses; outputs start poisoned
// because every kernel here overwrites them.
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
// The kernels move 16 bytes (8 bf16, 4 fp32) at a time and the rest one element at a time. Sizes:
// all tail; 12 bf16 units and a tail of 4; a tail of 1; many units, no tail; and enough units
// that every thread of the grid (one wave of 8 blocks of 256 on each of the 132 multiprocessors
// the emulator reports) takes several, with a tail of 3.
constexpr int64_t kSizes[] = {1, 100, 4097, 300 * 1030, 1100 * 2048 + 3};

struct Shape {
  int64_t rows;
  int64_t f;
};
// f = 100 is a whole number of fp32 units but not of bf16 ones; 1030 of neither. The last shape
// has more units (of either type) than the grid has threads, in rows of 125 or 250 units, which
// the grid stride is not a whole number of (so the kernel's column wraps past a row's end).
constexpr Shape kShapes[] = {{1, 64}, {7, 100}, {129, 768}, {300, 1030}, {2200, 1000}};

// Which of a test's four tensors (bit 0: inp, 1: dout, 2: out, 3: dinp) start one element past
// a 16-byte boundary, where no 16-byte access may touch them: none, all, and each one alone.
constexpr unsigned kShiftMasks[] = {0b0000, 0b1111, 0b0001, 0b0010, 0b0100, 0b1000};
constexpr unsigned kInp = 1, kDout = 2, kOut = 4, kDinp = 8;
// Misaligned tensors go element by element whatever their size: the shifted layouts skip the
// largest cases, which only add time.
constexpr int64_t kMaxShiftedCount = 1 << 20;

// A device tensor seen from element `shift` of its allocation on (cudaMalloc aligns that to 256
// bytes, so shift 1 misaligns it).
class ShiftedTensor {
 public:
  ShiftedTensor(int64_t count, DType dtype, bool shift)
      : tensor_(count + (shift ? 1 : 0), dtype), shift_(shift ? 1 : 0), dtype_(dtype) {}
  ShiftedTensor(const std::vector<float>& host, DType dtype, bool shift)
      : ShiftedTensor(static_cast<int64_t>(host.size()), dtype, shift) {
    std::vector<float> padded(shift_, 0.0f);
    padded.insert(padded.end(), host.begin(), host.end());
    tensor_.Write(padded);
  }
  void* get() const { return static_cast<char*>(tensor_.get()) + shift_ * DTypeBytes(dtype_); }
  std::vector<float> Read() const {
    std::vector<float> v = tensor_.Read();
    v.erase(v.begin(), v.begin() + shift_);
    return v;
  }

 private:
  DeviceTensor tensor_;
  int64_t shift_;
  DType dtype_;
};

// Normal inputs of standard deviation 2 plus saturated tails, where tanh and the sigmoid are ±1
// or 0/1.
std::vector<float> Inputs(int64_t n, DType dtype, std::mt19937& rng) {
  std::vector<float> v = RandomActivation(n, dtype, rng, 2.0f);
  v[0] = -12.0f;
  if (n > 1) v[n - 1] = 12.0f;
  return v;
}

void CheckGelu(DType dtype, int64_t n, unsigned shifts, std::mt19937& rng) {
  const std::vector<float> inp = Inputs(n, dtype, rng);
  const std::vector<float> dout = RandomActivation(n, dtype, rng);
  std::vector<float> out(n), dinp(n);
  cpu::GeluForward(out.data(), inp.data(), n);
  cpu::GeluBackward(dinp.data(), dout.data(), inp.data(), n);

  ShiftedTensor d_inp(inp, dtype, shifts & kInp), d_dout(dout, dtype, shifts & kDout);
  ShiftedTensor d_out(n, dtype, shifts & kOut), d_dinp(n, dtype, shifts & kDinp);
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

TEST(CudaActivations, GeluMatchesCpu) {
  TY_SKIP_WITHOUT_GPU();
  std::mt19937 rng(11);
  for (DType dtype : kDTypes) {
    for (int64_t n : kSizes) {
      for (unsigned shifts : kShiftMasks) {
        if (shifts != 0 && n > kMaxShiftedCount) continue;
        SCOPED_TRACE(absl::StrCat(DTypeName(dtype), " n=", n, " shifted=", shifts));
        CheckGelu(dtype, n, shifts, rng);
      }
    }
  }
}

void CheckGlu(DType dtype, Shape s, unsigned shifts, GluGate gate, std::mt19937& rng) {
  const int64_t n_in = s.rows * 2 * s.f, n_out = s.rows * s.f;
  const std::vector<float> inp = Inputs(n_in, dtype, rng);
  const std::vector<float> dout = RandomActivation(n_out, dtype, rng);
  std::vector<float> out(n_out), dinp(n_in);
  cpu::GluForward(out.data(), inp.data(), s.rows, s.f, gate);
  cpu::GluBackward(dinp.data(), dout.data(), inp.data(), s.rows, s.f, gate);

  ShiftedTensor d_inp(inp, dtype, shifts & kInp), d_dout(dout, dtype, shifts & kDout);
  ShiftedTensor d_out(n_out, dtype, shifts & kOut), d_dinp(n_in, dtype, shifts & kDinp);
  absl::Status status = GluForward(nullptr, dtype, d_out.get(), d_inp.get(), s.rows, s.f, gate);
  ASSERT_TRUE(status.ok()) << status;
  status = GluBackward(nullptr, dtype, d_dinp.get(), d_dout.get(), d_inp.get(), s.rows, s.f, gate);
  ASSERT_TRUE(status.ok()) << status;
  TY_CUDA_ASSERT(cudaDeviceSynchronize());
  EXPECT_LE(RelativeError(d_out.Read(), out), Tolerance(dtype)) << "out";
  EXPECT_LE(RelativeError(d_dinp.Read(), dinp), Tolerance(dtype)) << "dinp";
}

// SwiGLU and GeGLU (Gemma's).
TEST(CudaActivations, GatedUnitsMatchCpu) {
  TY_SKIP_WITHOUT_GPU();
  std::mt19937 rng(12);
  for (GluGate gate : {GluGate::kSilu, GluGate::kGeluTanh}) {
    for (DType dtype : kDTypes) {
      for (Shape s : kShapes) {
        for (unsigned shifts : kShiftMasks) {
          if (shifts != 0 && s.rows * 2 * s.f > kMaxShiftedCount) continue;
          SCOPED_TRACE(absl::StrCat(gate == GluGate::kSilu ? "swiglu " : "geglu ", DTypeName(dtype),
                                    " rows=", s.rows, " f=", s.f, " shifted=", shifts));
          CheckGlu(dtype, s, shifts, gate, rng);
        }
      }
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
  EXPECT_EQ(GluForward(nullptr, DType::kF32, x.get(), x.get(), 1, 0, GluGate::kSilu).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(GeluForward(nullptr, DType::kF32, x.get(), x.get(), 0).ok());
}

}  // namespace
}  // namespace trainyard::kernels::cuda
