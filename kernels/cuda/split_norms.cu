// RMSNorm over rows whose columns are split over tensor-parallel ranks (a norm over each token's
// whole query or key projection, whose heads the ranks share): each pass is two launches with
// the caller's sum over the ranks between them. These rows are the ranks' shares of q and k, a
// small part of a step's bytes, so the kernels are plain: one warp a row for the row reductions
// and the forward, one thread an element for the input gradient, and the weight gradient by the
// deterministic chunked column sums of column_partials.h.
#include <algorithm>
#include <cstdint>

#include "common/status.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/column_partials.h"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/memory_bound.cuh"
#include "kernels/cuda/norms.h"

namespace trainyard::kernels::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr unsigned int kMaxBlocks = 1u << 16;  // the kernels loop over a grid stride

unsigned int WarpBlocks(int64_t rows) { return std::min(BlocksFor(rows, kWarps), kMaxBlocks); }

__device__ __forceinline__ int64_t FirstRow() {
  return static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
}
__device__ __forceinline__ int64_t RowStride() { return static_cast<int64_t>(gridDim.x) * kWarps; }

// Lane l sums columns l, l + 32, ... in order, then WarpSum's butterfly: the order depends on c
// alone and every lane holds the same bits.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    RowSquareSumsKernel(float* sums, const T* x, int64_t rows, int64_t c) {
  for (int64_t r = FirstRow(); r < rows; r += RowStride()) {
    float s = 0.0f;
    for (int64_t j = threadIdx.x % 32; j < c; j += 32) {
      const float v = ToFloat(x[r * c + j]);
      s += v * v;
    }
    s = WarpSum(s);
    if (threadIdx.x % 32 == 0) sums[r] = s;
  }
}

// Every lane reads the row's sum before lane 0 overwrites it with the row's rstd.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    RmsNormFromSumsKernel(T* out, float* rstd, const T* inp, const float* weight, int64_t rows,
                          int64_t c, int64_t n, float eps) {
  for (int64_t r = FirstRow(); r < rows; r += RowStride()) {
    const float rs = rsqrtf(rstd[r] / static_cast<float>(n) + eps);
    __syncwarp();
    if (threadIdx.x % 32 == 0) rstd[r] = rs;
    for (int64_t j = threadIdx.x % 32; j < c; j += 32) {
      out[r * c + j] = FromFloat<T>(ToFloat(inp[r * c + j]) * rs * weight[j]);
    }
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    RmsNormDotsKernel(float* dots, const T* dout, const T* inp, const float* weight,
                      const float* rstd, int64_t rows, int64_t c) {
  for (int64_t r = FirstRow(); r < rows; r += RowStride()) {
    float s = 0.0f;
    for (int64_t j = threadIdx.x % 32; j < c; j += 32) {
      s += ToFloat(dout[r * c + j]) * weight[j] * ToFloat(inp[r * c + j]) * rstd[r];
    }
    s = WarpSum(s);
    if (threadIdx.x % 32 == 0) dots[r] = s;
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    RmsNormInputGradKernel(T* dinp, const T* dout, const T* inp, const float* weight,
                           const float* rstd, const float* dots, int64_t rows, int64_t c,
                           int64_t n) {
  for (int64_t i = FirstIndex(); i < rows * c; i += GridStride()) {
    const int64_t r = i / c, j = i - r * c;
    const float rs = rstd[r], xhat = ToFloat(inp[i]) * rs;
    const float mean_dot = dots[r] / static_cast<float>(n);
    dinp[i] =
        FromFloat<T>(ToFloat(dinp[i]) + (ToFloat(dout[i]) * weight[j] - xhat * mean_dot) * rs);
  }
}

// partials[k·c + j] = Σ dout · x̂ over chunk k's rows of column j, rows in order.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    RmsNormWeightPartialsKernel(float* partials, const T* dout, const T* inp, const float* rstd,
                                int64_t rows, int64_t c, int64_t rows_per_chunk) {
  const int64_t first = static_cast<int64_t>(blockIdx.x) * rows_per_chunk;
  const int64_t last = first + rows_per_chunk < rows ? first + rows_per_chunk : rows;
  for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
    float s = 0.0f;
    for (int64_t r = first; r < last; ++r) {
      s += ToFloat(dout[r * c + j]) * ToFloat(inp[r * c + j]) * rstd[r];
    }
    partials[blockIdx.x * c + j] = s;
  }
}

absl::Status CheckShape(DType dtype, int64_t rows, int64_t c) {
  TY_REQUIRE(dtype == DType::kF32 || dtype == DType::kBF16);
  TY_REQUIRE(rows >= 0 && c >= 0);
  return absl::OkStatus();
}

}  // namespace

absl::Status RowSquareSums(cudaStream_t stream, DType dtype, float* sums, const void* x,
                           int64_t rows, int64_t c) {
  TY_RETURN_IF_ERROR(CheckShape(dtype, rows, c));
  if (rows == 0) return absl::OkStatus();
  TY_REQUIRE(sums != nullptr && (c == 0 || x != nullptr));
  TY_DISPATCH_DTYPE(dtype, T, {
    RowSquareSumsKernel<T>
        <<<WarpBlocks(rows), kThreads, 0, stream>>>(sums, static_cast<const T*>(x), rows, c);
    TY_CUDA_RETURN_IF_LAUNCH_FAILED("RowSquareSumsKernel");
  });
  return absl::OkStatus();
}

absl::Status RmsNormFromSums(cudaStream_t stream, DType dtype, void* out, float* rstd,
                             const void* inp, const float* weight, int64_t rows, int64_t c,
                             int64_t n, float eps) {
  TY_RETURN_IF_ERROR(CheckShape(dtype, rows, c));
  TY_REQUIRE(n >= c && n > 0);
  if (rows == 0) return absl::OkStatus();
  TY_REQUIRE(rstd != nullptr &&
             (c == 0 || (out != nullptr && inp != nullptr && weight != nullptr)));
  TY_DISPATCH_DTYPE(dtype, T, {
    RmsNormFromSumsKernel<T><<<WarpBlocks(rows), kThreads, 0, stream>>>(
        static_cast<T*>(out), rstd, static_cast<const T*>(inp), weight, rows, c, n, eps);
    TY_CUDA_RETURN_IF_LAUNCH_FAILED("RmsNormFromSumsKernel");
  });
  return absl::OkStatus();
}

absl::Status RmsNormDots(cudaStream_t stream, DType dtype, float* dots, const void* dout,
                         const void* inp, const float* weight, const float* rstd, int64_t rows,
                         int64_t c) {
  TY_RETURN_IF_ERROR(CheckShape(dtype, rows, c));
  if (rows == 0) return absl::OkStatus();
  TY_REQUIRE(dots != nullptr && rstd != nullptr);
  TY_REQUIRE(c == 0 || (dout != nullptr && inp != nullptr && weight != nullptr));
  TY_DISPATCH_DTYPE(dtype, T, {
    RmsNormDotsKernel<T><<<WarpBlocks(rows), kThreads, 0, stream>>>(
        dots, static_cast<const T*>(dout), static_cast<const T*>(inp), weight, rstd, rows, c);
    TY_CUDA_RETURN_IF_LAUNCH_FAILED("RmsNormDotsKernel");
  });
  return absl::OkStatus();
}

absl::Status RmsNormBackwardFromDots(cudaStream_t stream, DType dtype, void* dinp, float* dweight,
                                     const void* dout, const void* inp, const float* weight,
                                     const float* rstd, const float* dots, int64_t rows, int64_t c,
                                     int64_t n, float* scratch) {
  TY_RETURN_IF_ERROR(CheckShape(dtype, rows, c));
  TY_REQUIRE(n >= c && n > 0);
  if (rows == 0 || c == 0) return absl::OkStatus();
  TY_REQUIRE(dinp != nullptr && dweight != nullptr && dout != nullptr && inp != nullptr);
  TY_REQUIRE(weight != nullptr && rstd != nullptr && dots != nullptr && scratch != nullptr);
  const RowChunks chunks = ChunkRows(rows);
  TY_DISPATCH_DTYPE(dtype, T, {
    const auto* dy = static_cast<const T*>(dout);
    const auto* x = static_cast<const T*>(inp);
    const unsigned int blocks = std::min(BlocksFor(rows * c, kThreads), kMaxBlocks);
    RmsNormInputGradKernel<T><<<blocks, kThreads, 0, stream>>>(static_cast<T*>(dinp), dy, x, weight,
                                                               rstd, dots, rows, c, n);
    TY_CUDA_RETURN_IF_LAUNCH_FAILED("RmsNormInputGradKernel");
    RmsNormWeightPartialsKernel<T>
        <<<static_cast<unsigned int>(chunks.count), kThreads, 0, stream>>>(
            scratch, dy, x, rstd, rows, c, chunks.rows_per_chunk);
    TY_CUDA_RETURN_IF_LAUNCH_FAILED("RmsNormWeightPartialsKernel");
  });
  return AddColumnPartials(stream, dweight, scratch, chunks.count, c);
}

}  // namespace trainyard::kernels::cuda
