#include <algorithm>

#include "common/status.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/moe.h"

namespace trainyard::kernels::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarpsPerBlock = kThreads / 32;
constexpr unsigned int kMaxBlocks = 1u << 16;  // every kernel below loops over a grid stride

unsigned int GridFor(int64_t n) { return std::min(BlocksFor(n, kThreads), kMaxBlocks); }
// Blocks for one warp per item.
unsigned int WarpGridFor(int64_t items) {
  return std::min(BlocksFor(items, kWarpsPerBlock), kMaxBlocks);
}

__device__ __forceinline__ int64_t FirstIndex() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t GridStride() {
  return static_cast<int64_t>(gridDim.x) * blockDim.x;
}
__device__ __forceinline__ int64_t FirstWarp() {
  return static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
}
__device__ __forceinline__ int64_t WarpStride() {
  return static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
}

// ⟨x, y⟩ over n elements by one warp: lane l sums elements l, l + 32, ... in order, then the
// lanes' sums are combined by the butterfly of WarpSum. The order depends on n alone, and every
// lane gets the same bits (each butterfly step adds the same two values on both lanes).
template <typename A, typename B>
__device__ __forceinline__ float WarpDot(const A* x, const B* y, int64_t n) {
  float sum = 0.0f;
  for (int64_t i = threadIdx.x % 32; i < n; i += 32) sum += ToFloat(x[i]) * ToFloat(y[i]);
  return WarpSum(sum);
}

// One thread per output element.
template <typename T>
__global__ void GatherRowsKernel(T* out, const T* inp, const int32_t* rows, const float* scale,
                                 int64_t count, int64_t cols) {
  const int64_t n = count * cols;
  for (int64_t i = FirstIndex(); i < n; i += GridStride()) {
    const int64_t r = i / cols, c = i - r * cols;
    const float s = scale != nullptr ? scale[r] : 1.0f;
    const int64_t from = rows != nullptr ? static_cast<int64_t>(rows[r]) : r;
    out[i] = FromFloat<T>(s * ToFloat(inp[from * cols + c]));
  }
}

// One thread per output element, its k terms added in slot order onto the (fp32) old value or 0.
template <typename T>
__global__ void CombineRowsKernel(T* out, const T* inp, const int32_t* slots, const float* weights,
                                  int64_t rows, int64_t k, int64_t cols, bool accumulate) {
  const int64_t n = rows * cols;
  for (int64_t i = FirstIndex(); i < n; i += GridStride()) {
    const int64_t t = i / cols, c = i - t * cols;
    float sum = accumulate ? ToFloat(out[i]) : 0.0f;
    for (int64_t j = t * k; j < (t + 1) * k; ++j) {
      const int32_t slot = slots[j];
      if (slot < 0) continue;
      const float w = weights != nullptr ? weights[j] : 1.0f;
      sum += w * ToFloat(inp[static_cast<int64_t>(slot) * cols + c]);
    }
    out[i] = FromFloat<T>(sum);
  }
}

// One warp per row. The loop bound is the same on every lane of a warp, as WarpSum requires.
template <typename T>
__global__ void RowDotsKernel(float* out, const T* a, const int32_t* a_rows, const T* b,
                              int64_t count, int64_t cols) {
  for (int64_t r = FirstWarp(); r < count; r += WarpStride()) {
    const float dot = WarpDot(a + static_cast<int64_t>(a_rows[r]) * cols, b + r * cols, cols);
    if (threadIdx.x % 32 == 0) out[r] = dot;
  }
}

// One warp per row: every lane reads the logit before lane 0 writes the gate (which may be it).
template <typename T>
__global__ void SigmoidGateRowsKernel(float* gate, const float* logits, T* x, int64_t rows,
                                      int64_t cols) {
  for (int64_t r = FirstWarp(); r < rows; r += WarpStride()) {
    const float g = 1.0f / (1.0f + expf(-logits[r]));
    __syncwarp();
    if (threadIdx.x % 32 == 0) gate[r] = g;
    T* row = x + r * cols;
    for (int64_t c = threadIdx.x % 32; c < cols; c += 32)
      row[c] = FromFloat<T>(g * ToFloat(row[c]));
  }
}

// One warp per row, as RowDotsKernel.
template <typename T>
__global__ void SigmoidGateBackwardKernel(float* dlogits, const float* gate, const T* act,
                                          const T* dact, int64_t rows, int64_t cols) {
  for (int64_t r = FirstWarp(); r < rows; r += WarpStride()) {
    const float dot = WarpDot(act + r * cols, dact + r * cols, cols);
    if (threadIdx.x % 32 == 0) dlogits[r] = (1.0f - gate[r]) * dot;
  }
}

// One warp per logit (row, expert): coalesced reads of the input row and the expert's weights.
template <typename T>
__global__ void RouterForwardKernel(float* out, const T* inp, const float* weight, int64_t m,
                                    int64_t n, int64_t k) {
  for (int64_t o = FirstWarp(); o < m * n; o += WarpStride()) {
    const int64_t row = o / n, expert = o - row * n;
    const float dot = WarpDot(inp + row * k, weight + expert * k, k);
    if (threadIdx.x % 32 == 0) out[o] = dot;
  }
}

// dinp[row, col] += Σ_e dout[row, e] · weight[e, col], experts in order; one thread per element.
template <typename T>
__global__ void RouterBackwardInputKernel(T* dinp, const float* dout, const float* weight,
                                          int64_t m, int64_t n, int64_t k) {
  for (int64_t i = FirstIndex(); i < m * k; i += GridStride()) {
    const int64_t row = i / k, col = i - row * k;
    float sum = 0.0f;
    for (int64_t e = 0; e < n; ++e) sum += dout[row * n + e] * weight[e * k + col];
    dinp[i] = FromFloat<T>(ToFloat(dinp[i]) + sum);
  }
}

// dweight[e, col] += Σ_row dout[row, e] · inp[row, col], rows in order; one thread per element.
// Neighbouring threads share e and read neighbouring columns of each input row.
template <typename T>
__global__ void RouterBackwardWeightKernel(float* dweight, const float* dout, const T* inp,
                                           int64_t m, int64_t n, int64_t k) {
  for (int64_t i = FirstIndex(); i < n * k; i += GridStride()) {
    const int64_t e = i / k, col = i - e * k;
    float sum = 0.0f;
    for (int64_t row = 0; row < m; ++row) sum += dout[row * n + e] * ToFloat(inp[row * k + col]);
    dweight[i] += sum;
  }
}

absl::Status RequireActivationType(DType dtype) {
  return Require(dtype == DType::kF32 || dtype == DType::kBF16,
                 "dtype == DType::kF32 || dtype == DType::kBF16");
}

}  // namespace

absl::Status GatherRows(cudaStream_t stream, DType dtype, void* out, const void* inp,
                        const int32_t* rows, const float* scale, int64_t count, int64_t cols) {
  TY_RETURN_IF_ERROR(RequireActivationType(dtype));
  TY_REQUIRE(count >= 0 && cols >= 0);
  if (count == 0 || cols == 0) return absl::OkStatus();
  TY_REQUIRE(out != nullptr && inp != nullptr);
  TY_REQUIRE(out != inp);
  TY_DISPATCH_DTYPE(dtype, T, {
    GatherRowsKernel<T><<<GridFor(count * cols), kThreads, 0, stream>>>(
        static_cast<T*>(out), static_cast<const T*>(inp), rows, scale, count, cols);
    TY_CUDA_RETURN_IF_LAUNCH_FAILED("GatherRowsKernel");
  });
  return absl::OkStatus();
}

absl::Status CombineRows(cudaStream_t stream, DType dtype, void* out, const void* inp,
                         const int32_t* slots, const float* weights, int64_t rows, int64_t k,
                         int64_t cols, bool accumulate) {
  TY_RETURN_IF_ERROR(RequireActivationType(dtype));
  TY_REQUIRE(rows >= 0 && k >= 0 && cols >= 0);
  if (rows == 0 || cols == 0) return absl::OkStatus();
  TY_REQUIRE(out != nullptr);
  TY_REQUIRE(k == 0 || (inp != nullptr && slots != nullptr));
  TY_REQUIRE(out != inp);
  TY_DISPATCH_DTYPE(dtype, T, {
    CombineRowsKernel<T><<<GridFor(rows * cols), kThreads, 0, stream>>>(
        static_cast<T*>(out), static_cast<const T*>(inp), slots, weights, rows, k, cols,
        accumulate);
    TY_CUDA_RETURN_IF_LAUNCH_FAILED("CombineRowsKernel");
  });
  return absl::OkStatus();
}

absl::Status RowDots(cudaStream_t stream, DType dtype, float* out, const void* a,
                     const int32_t* a_rows, const void* b, int64_t count, int64_t cols) {
  TY_RETURN_IF_ERROR(RequireActivationType(dtype));
  TY_REQUIRE(count >= 0 && cols >= 0);
  if (count == 0) return absl::OkStatus();
  TY_REQUIRE(out != nullptr && a_rows != nullptr);
  TY_REQUIRE(cols == 0 || (a != nullptr && b != nullptr));
  TY_DISPATCH_DTYPE(dtype, T, {
    RowDotsKernel<T><<<WarpGridFor(count), kThreads, 0, stream>>>(
        out, static_cast<const T*>(a), a_rows, static_cast<const T*>(b), count, cols);
    TY_CUDA_RETURN_IF_LAUNCH_FAILED("RowDotsKernel");
  });
  return absl::OkStatus();
}

absl::Status SigmoidGateRows(cudaStream_t stream, DType dtype, float* gate, const float* logits,
                             void* x, int64_t rows, int64_t cols) {
  TY_RETURN_IF_ERROR(RequireActivationType(dtype));
  TY_REQUIRE(rows >= 0 && cols >= 0);
  if (rows == 0) return absl::OkStatus();
  TY_REQUIRE(gate != nullptr && logits != nullptr && (cols == 0 || x != nullptr));
  TY_DISPATCH_DTYPE(dtype, T, {
    SigmoidGateRowsKernel<T>
        <<<WarpGridFor(rows), kThreads, 0, stream>>>(gate, logits, static_cast<T*>(x), rows, cols);
    TY_CUDA_RETURN_IF_LAUNCH_FAILED("SigmoidGateRowsKernel");
  });
  return absl::OkStatus();
}

absl::Status SigmoidGateBackward(cudaStream_t stream, DType dtype, float* dlogits,
                                 const float* gate, const void* act, const void* dact, int64_t rows,
                                 int64_t cols) {
  TY_RETURN_IF_ERROR(RequireActivationType(dtype));
  TY_REQUIRE(rows >= 0 && cols >= 0);
  if (rows == 0) return absl::OkStatus();
  TY_REQUIRE(dlogits != nullptr && gate != nullptr);
  TY_REQUIRE(cols == 0 || (act != nullptr && dact != nullptr));
  TY_DISPATCH_DTYPE(dtype, T, {
    SigmoidGateBackwardKernel<T><<<WarpGridFor(rows), kThreads, 0, stream>>>(
        dlogits, gate, static_cast<const T*>(act), static_cast<const T*>(dact), rows, cols);
    TY_CUDA_RETURN_IF_LAUNCH_FAILED("SigmoidGateBackwardKernel");
  });
  return absl::OkStatus();
}

absl::Status RouterLinearForward(cudaStream_t stream, DType dtype, float* out, const void* inp,
                                 const float* weight, int64_t m, int64_t n, int64_t k) {
  TY_RETURN_IF_ERROR(RequireActivationType(dtype));
  TY_REQUIRE(m >= 0 && n >= 0 && k >= 0);
  if (m == 0 || n == 0) return absl::OkStatus();
  TY_REQUIRE(out != nullptr);
  TY_REQUIRE(k == 0 || (inp != nullptr && weight != nullptr));
  TY_DISPATCH_DTYPE(dtype, T, {
    RouterForwardKernel<T><<<WarpGridFor(m * n), kThreads, 0, stream>>>(
        out, static_cast<const T*>(inp), weight, m, n, k);
    TY_CUDA_RETURN_IF_LAUNCH_FAILED("RouterForwardKernel");
  });
  return absl::OkStatus();
}

absl::Status RouterLinearBackward(cudaStream_t stream, DType dtype, void* dinp, float* dweight,
                                  const float* dout, const void* inp, const float* weight,
                                  int64_t m, int64_t n, int64_t k) {
  TY_RETURN_IF_ERROR(RequireActivationType(dtype));
  TY_REQUIRE(m >= 0 && n >= 0 && k >= 0);
  // An empty sum adds nothing: with no rows, experts or columns there is no work.
  if (m == 0 || n == 0 || k == 0) return absl::OkStatus();
  TY_REQUIRE(dout != nullptr);
  TY_REQUIRE(dinp == nullptr || weight != nullptr);
  TY_REQUIRE(dweight == nullptr || inp != nullptr);
  TY_DISPATCH_DTYPE(dtype, T, {
    if (dinp != nullptr) {
      RouterBackwardInputKernel<T>
          <<<GridFor(m * k), kThreads, 0, stream>>>(static_cast<T*>(dinp), dout, weight, m, n, k);
      TY_CUDA_RETURN_IF_LAUNCH_FAILED("RouterBackwardInputKernel");
    }
    if (dweight != nullptr) {
      RouterBackwardWeightKernel<T><<<GridFor(n * k), kThreads, 0, stream>>>(
          dweight, dout, static_cast<const T*>(inp), m, n, k);
      TY_CUDA_RETURN_IF_LAUNCH_FAILED("RouterBackwardWeightKernel");
    }
  });
  return absl::OkStatus();
}

}  // namespace trainyard::kernels::cuda
