// FP8 quantization: both kernels are memory-bound. AbsMax reads the tensor once (2 bytes an
// element in bf16); QuantizeFp8 reads it again and writes one byte an element per form (two
// with the transpose): 5 bytes an element for a bf16 tensor in both forms, the floor of current
// scaling, which must see the whole tensor before it can scale any of it.
#include <cuda_fp8.h>

#include <cstdint>

#include "common/status.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/fp8.h"
#include "kernels/cuda/memory_bound.cuh"

namespace trainyard::kernels::cuda {
namespace {

// Magnitudes compare as their bit patterns once the sign is cleared, NaN above infinity, so
// an unsigned maximum is the float maximum that keeps NaN.
__device__ __forceinline__ unsigned MagnitudeBits(float x) { return __float_as_uint(fabsf(x)); }

__device__ __forceinline__ unsigned WarpMaxBits(unsigned v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Units of kVec elements in a grid-stride loop, then the tail one at a time; one atomic per
// block into amax's bits (zeroed before the launch).
template <typename T, int kVec>
__global__ void __launch_bounds__(kStrideThreads, kStrideBlocksPerSm)
    AbsMaxKernel(const T* x, int64_t n, unsigned* amax) {
  __shared__ unsigned warp_max[kStrideThreads / 32];
  unsigned m = 0;
  const int64_t in_units = n / kVec * kVec, stride = GridStride();
  for (int64_t i = FirstIndex() * kVec; i < in_units; i += stride * kVec) {
    const Vec<T, kVec> v = LoadVec<T, kVec>(x + i);
#pragma unroll
    for (int k = 0; k < kVec; ++k) m = max(m, MagnitudeBits(ToFloat(v.v[k])));
  }
  for (int64_t i = in_units + FirstIndex(); i < n; i += stride) {
    m = max(m, MagnitudeBits(ToFloat(x[i])));
  }
  m = WarpMaxBits(m);
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = m;
  __syncthreads();
  if (threadIdx.x < 32) {
    m = threadIdx.x < blockDim.x / 32 ? warp_max[threadIdx.x] : 0u;
    m = WarpMaxBits(m);
    if (threadIdx.x == 0) atomicMax(amax, m);
  }
}

// A tile of 32 × 32 elements a block of 32 × 8 threads: thread (tx, ty) takes column c0 + tx of
// rows r0 + ty + 8j. Reads and the row-major writes go along rows; the transpose goes through
// shared memory, so its writes go along the transposed rows too.
constexpr int kTile = 32, kTileRows = 8;

template <typename T, __nv_fp8_interpretation_t kFormat, bool kTranspose>
__global__ void __launch_bounds__(kTile* kTileRows)
    QuantizeKernel(const T* x, int64_t rows, int64_t cols, const float* amax, float largest,
                   float min_amax, uint8_t* out, uint8_t* out_t, float* scale_inv) {
  __shared__ uint8_t tile[kTile][kTile + 1];
  const float a = *amax;
  const float scale = largest / (a != a ? a : fmaxf(a, min_amax));  // NaN stays NaN
  if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0 && threadIdx.y == 0) {
    *scale_inv = 1.0f / scale;
  }
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kTile;
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * kTile;
  const int tx = threadIdx.x, ty = threadIdx.y;
#pragma unroll
  for (int j = 0; j < kTile / kTileRows; ++j) {
    const int64_t r = r0 + ty + j * kTileRows, c = c0 + tx;
    if (r < rows && c < cols) {
      const uint8_t v =
          __nv_cvt_float_to_fp8(ToFloat(x[r * cols + c]) * scale, __NV_SATFINITE, kFormat);
      out[r * cols + c] = v;
      if constexpr (kTranspose) tile[ty + j * kTileRows][tx] = v;
    }
  }
  if constexpr (kTranspose) {
    __syncthreads();
#pragma unroll
    for (int j = 0; j < kTile / kTileRows; ++j) {
      const int64_t c = c0 + ty + j * kTileRows, r = r0 + tx;
      if (r < rows && c < cols) out_t[c * rows + r] = tile[tx][ty + j * kTileRows];
    }
  }
}

template <typename T, __nv_fp8_interpretation_t kFormat>
absl::Status LaunchQuantize(cudaStream_t stream, Fp8Format format, const T* x, int64_t rows,
                            int64_t cols, const float* amax, uint8_t* out, uint8_t* out_t,
                            float* scale_inv) {
  const dim3 grid(static_cast<unsigned>((cols + kTile - 1) / kTile),
                  static_cast<unsigned>((rows + kTile - 1) / kTile));
  const dim3 block(kTile, kTileRows);
  if (out_t != nullptr) {
    QuantizeKernel<T, kFormat, true><<<grid, block, 0, stream>>>(
        x, rows, cols, amax, Fp8Max(format), kFp8MinAmax, out, out_t, scale_inv);
  } else {
    QuantizeKernel<T, kFormat, false><<<grid, block, 0, stream>>>(
        x, rows, cols, amax, Fp8Max(format), kFp8MinAmax, out, out_t, scale_inv);
  }
  TY_CUDA_RETURN_IF_LAUNCH_FAILED("QuantizeFp8Kernel");
  return absl::OkStatus();
}

// 16-byte units where x allows them, as memory_bound.cuh's LaunchElements chooses.
template <typename T, int kVec>
absl::Status LaunchAbsMax(cudaStream_t stream, const T* x, int64_t n, unsigned* bits) {
  TY_ASSIGN_OR_RETURN(const unsigned blocks, GridStrideBlocks(std::max(n / kVec, n % kVec),
                                                              kStrideThreads, kStrideBlocksPerSm));
  AbsMaxKernel<T, kVec><<<blocks, kStrideThreads, 0, stream>>>(x, n, bits);
  TY_CUDA_RETURN_IF_LAUNCH_FAILED("AbsMaxKernel");
  return absl::OkStatus();
}

template <typename T>
absl::Status AbsMaxAs(cudaStream_t stream, const T* x, int64_t n, unsigned* bits) {
  return Aligned16(x) ? LaunchAbsMax<T, kPackOf<T>>(stream, x, n, bits)
                      : LaunchAbsMax<T, 1>(stream, x, n, bits);
}

template <typename T>
absl::Status QuantizeAs(cudaStream_t stream, Fp8Format format, const T* x, int64_t rows,
                        int64_t cols, const float* amax, uint8_t* out, uint8_t* out_t,
                        float* scale_inv) {
  return format == Fp8Format::kE4M3 ? LaunchQuantize<T, __NV_E4M3>(stream, format, x, rows, cols,
                                                                   amax, out, out_t, scale_inv)
                                    : LaunchQuantize<T, __NV_E5M2>(stream, format, x, rows, cols,
                                                                   amax, out, out_t, scale_inv);
}

absl::Status CheckDType(DType dtype) {
  TY_REQUIRE(dtype == DType::kF32 || dtype == DType::kBF16);
  return absl::OkStatus();
}

}  // namespace

absl::Status AbsMax(cudaStream_t stream, DType dtype, const void* x, int64_t n, float* amax) {
  TY_RETURN_IF_ERROR(CheckDType(dtype));
  TY_REQUIRE(n >= 0 && amax != nullptr && (n == 0 || x != nullptr));
  TY_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(amax, 0, sizeof(float), stream));
  if (n == 0) return absl::OkStatus();
  auto* bits = reinterpret_cast<unsigned*>(amax);
  TY_DISPATCH_DTYPE(
      dtype, T, { TY_RETURN_IF_ERROR(AbsMaxAs<T>(stream, static_cast<const T*>(x), n, bits)); });
  return absl::OkStatus();
}

absl::Status QuantizeFp8(cudaStream_t stream, DType dtype, Fp8Format format, const void* x,
                         int64_t rows, int64_t cols, const float* amax, void* out, void* out_t,
                         float* scale_inv) {
  TY_RETURN_IF_ERROR(CheckDType(dtype));
  TY_REQUIRE(rows >= 0 && cols >= 0);
  TY_REQUIRE(amax != nullptr && scale_inv != nullptr && amax != scale_inv);
  TY_REQUIRE((rows + kTile - 1) / kTile <= 65535);  // the grid's y dimension
  if (rows == 0 || cols == 0) return absl::OkStatus();
  TY_REQUIRE(x != nullptr && out != nullptr);
  auto* o = static_cast<uint8_t*>(out);
  auto* ot = static_cast<uint8_t*>(out_t);
  TY_DISPATCH_DTYPE(dtype, T, {
    TY_RETURN_IF_ERROR(QuantizeAs<T>(stream, format, static_cast<const T*>(x), rows, cols, amax, o,
                                     ot, scale_inv));
  });
  return absl::OkStatus();
}

}  // namespace trainyard::kernels::cuda
