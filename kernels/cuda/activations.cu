#include <algorithm>

#include "common/status.h"
#include "kernels/cuda/activations.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/device_math.cuh"

namespace trainyard::kernels::cuda {
namespace {

constexpr int kThreads = 256;
// Grid-stride loops below, so any n fits a grid of at most this many blocks.
constexpr unsigned int kMaxBlocks = 1u << 16;

// The GPT-2 tanh approximation; the constants are the CPU reference's.
constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCoeff = 0.044715f;

unsigned int GridFor(int64_t n) { return std::min(BlocksFor(n, kThreads), kMaxBlocks); }

__device__ __forceinline__ int64_t FirstIndex() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t GridStride() {
  return static_cast<int64_t>(gridDim.x) * blockDim.x;
}

__device__ __forceinline__ float Sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

template <typename T>
__global__ void GeluForwardKernel(T* out, const T* inp, int64_t n) {
  for (int64_t i = FirstIndex(); i < n; i += GridStride()) {
    const float x = ToFloat(inp[i]);
    const float t = tanhf(kSqrt2OverPi * (x + kGeluCoeff * x * x * x));
    out[i] = FromFloat<T>(0.5f * x * (1.0f + t));
  }
}

// Element i is read before it is written by the same thread, so dinp may alias dout.
template <typename T>
__global__ void GeluBackwardKernel(T* dinp, const T* dout, const T* inp, int64_t n) {
  for (int64_t i = FirstIndex(); i < n; i += GridStride()) {
    const float x = ToFloat(inp[i]);
    const float t = tanhf(kSqrt2OverPi * (x + kGeluCoeff * x * x * x));
    const float dt = (1.0f - t * t) * kSqrt2OverPi * (1.0f + 3.0f * kGeluCoeff * x * x);
    dinp[i] = FromFloat<T>(ToFloat(dout[i]) * (0.5f * (1.0f + t) + 0.5f * x * dt));
  }
}

// One thread per output element (r, j): gate at inp[r, j], up at inp[r, f + j].
template <typename T>
__global__ void SwigluForwardKernel(T* out, const T* inp, int64_t rows, int64_t f) {
  const int64_t n = rows * f;
  for (int64_t i = FirstIndex(); i < n; i += GridStride()) {
    const int64_t r = i / f, j = i - r * f;
    const float gate = ToFloat(inp[r * 2 * f + j]);
    const float up = ToFloat(inp[r * 2 * f + f + j]);
    out[i] = FromFloat<T>(gate * Sigmoid(gate) * up);
  }
}

template <typename T>
__global__ void SwigluBackwardKernel(T* dinp, const T* dout, const T* inp, int64_t rows,
                                     int64_t f) {
  const int64_t n = rows * f;
  for (int64_t i = FirstIndex(); i < n; i += GridStride()) {
    const int64_t r = i / f, j = i - r * f;
    const int64_t gate_at = r * 2 * f + j, up_at = gate_at + f;
    const float gate = ToFloat(inp[gate_at]);
    const float up = ToFloat(inp[up_at]);
    const float dy = ToFloat(dout[i]);
    const float s = Sigmoid(gate);
    dinp[gate_at] = FromFloat<T>(dy * up * s * (1.0f + gate * (1.0f - s)));
    dinp[up_at] = FromFloat<T>(dy * (gate * s));
  }
}

absl::Status CheckDType(DType dtype) {
  TY_REQUIRE(dtype == DType::kF32 || dtype == DType::kBF16);
  return absl::OkStatus();
}

}  // namespace

absl::Status GeluForward(cudaStream_t stream, DType dtype, void* out, const void* inp, int64_t n) {
  TY_RETURN_IF_ERROR(CheckDType(dtype));
  TY_REQUIRE(n >= 0);
  if (n == 0) return absl::OkStatus();
  TY_REQUIRE(out != nullptr && inp != nullptr);
  TY_DISPATCH_DTYPE(dtype, T, {
    GeluForwardKernel<T>
        <<<GridFor(n), kThreads, 0, stream>>>(static_cast<T*>(out), static_cast<const T*>(inp), n);
    TY_CUDA_RETURN_IF_LAUNCH_FAILED("GeluForwardKernel");
  });
  return absl::OkStatus();
}

absl::Status GeluBackward(cudaStream_t stream, DType dtype, void* dinp, const void* dout,
                          const void* inp, int64_t n) {
  TY_RETURN_IF_ERROR(CheckDType(dtype));
  TY_REQUIRE(n >= 0);
  if (n == 0) return absl::OkStatus();
  TY_REQUIRE(dinp != nullptr && dout != nullptr && inp != nullptr);
  TY_DISPATCH_DTYPE(dtype, T, {
    GeluBackwardKernel<T><<<GridFor(n), kThreads, 0, stream>>>(
        static_cast<T*>(dinp), static_cast<const T*>(dout), static_cast<const T*>(inp), n);
    TY_CUDA_RETURN_IF_LAUNCH_FAILED("GeluBackwardKernel");
  });
  return absl::OkStatus();
}

absl::Status SwigluForward(cudaStream_t stream, DType dtype, void* out, const void* inp,
                           int64_t rows, int64_t f) {
  TY_RETURN_IF_ERROR(CheckDType(dtype));
  TY_REQUIRE(rows >= 0 && f >= 1);
  if (rows == 0) return absl::OkStatus();
  TY_REQUIRE(out != nullptr && inp != nullptr);
  TY_DISPATCH_DTYPE(dtype, T, {
    SwigluForwardKernel<T><<<GridFor(rows * f), kThreads, 0, stream>>>(
        static_cast<T*>(out), static_cast<const T*>(inp), rows, f);
    TY_CUDA_RETURN_IF_LAUNCH_FAILED("SwigluForwardKernel");
  });
  return absl::OkStatus();
}

absl::Status SwigluBackward(cudaStream_t stream, DType dtype, void* dinp, const void* dout,
                            const void* inp, int64_t rows, int64_t f) {
  TY_RETURN_IF_ERROR(CheckDType(dtype));
  TY_REQUIRE(rows >= 0 && f >= 1);
  if (rows == 0) return absl::OkStatus();
  TY_REQUIRE(dinp != nullptr && dout != nullptr && inp != nullptr);
  TY_DISPATCH_DTYPE(dtype, T, {
    SwigluBackwardKernel<T><<<GridFor(rows * f), kThreads, 0, stream>>>(
        static_cast<T*>(dinp), static_cast<const T*>(dout), static_cast<const T*>(inp), rows, f);
    TY_CUDA_RETURN_IF_LAUNCH_FAILED("SwigluBackwardKernel");
  });
  return absl::OkStatus();
}

}  // namespace trainyard::kernels::cuda
