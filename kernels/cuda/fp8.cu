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

__device__ __forceinline__ float ScaleOf(float amax, float largest, float min_amax) {
  return largest / (amax != amax ? amax : fmaxf(amax, min_amax));  // NaN stays NaN
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
  const float scale = ScaleOf(*amax, largest, min_amax);
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

// The wide form, for rows and cols multiples of 8 with x 16-byte and the codes 8-byte aligned
// (every FP8 linear layer's operands): a block of 256 threads takes a 64 × 64 tile as 8-element
// row segments, one 16-byte load of bf16 each, and stores a segment's eight codes at once; the
// transpose reads eight rows of one column back from shared memory as one 8-byte store along the
// transposed row, eight lanes covering 64 contiguous bytes of it. Per thread two segments are in
// flight (32 bytes of bf16), where the 32 × 32 form has four single elements (8 bytes).
constexpr int kWide = 64, kSeg = 8, kWideThreads = 256;
constexpr int kWideLd = kWide + 4;  // bytes per shared row: 17 banks, at most 2-way conflicts

// Four codes of v[first..first + 3] · scale, the first in the lowest byte (memory order).
template <__nv_fp8_interpretation_t kFormat, typename T>
__device__ __forceinline__ uint32_t PackCodes(const Vec<T, kSeg>& v, int first, float scale) {
  const uint32_t lo = __nv_cvt_float2_to_fp8x2(
      make_float2(ToFloat(v.v[first]) * scale, ToFloat(v.v[first + 1]) * scale), __NV_SATFINITE,
      kFormat);
  const uint32_t hi = __nv_cvt_float2_to_fp8x2(
      make_float2(ToFloat(v.v[first + 2]) * scale, ToFloat(v.v[first + 3]) * scale), __NV_SATFINITE,
      kFormat);
  return lo | hi << 16;
}

template <typename T, __nv_fp8_interpretation_t kFormat, bool kTranspose>
__global__ void __launch_bounds__(kWideThreads)
    QuantizeWideKernel(const T* x, int64_t rows, int64_t cols, const float* amax, float largest,
                       float min_amax, uint8_t* out, uint8_t* out_t, float* scale_inv) {
  __shared__ __align__(16) uint8_t tile[kWide * kWideLd];
  const float scale = ScaleOf(*amax, largest, min_amax);
  if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) *scale_inv = 1.0f / scale;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kWide;
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * kWide;
  constexpr int kSegs = kWide * kWide / kSeg, kRowSegs = kWide / kSeg;
  static_assert(kSegs % kWideThreads == 0);
#pragma unroll
  for (int j = 0; j < kSegs / kWideThreads; ++j) {
    const int s = threadIdx.x + j * kWideThreads;
    const int lr = s / kRowSegs, lc = s % kRowSegs * kSeg;
    const int64_t r = r0 + lr, c = c0 + lc;
    if (r >= rows || c >= cols) continue;
    const Vec<T, kSeg> v = LoadVec<T, kSeg>(x + r * cols + c);
    const uint32_t lo = PackCodes<kFormat>(v, 0, scale), hi = PackCodes<kFormat>(v, 4, scale);
    *reinterpret_cast<uint2*>(out + r * cols + c) = make_uint2(lo, hi);
    if constexpr (kTranspose) {
      auto* words = reinterpret_cast<uint32_t*>(tile + lr * kWideLd + lc);
      words[0] = lo;
      words[1] = hi;
    }
  }
  if constexpr (!kTranspose) return;
  __syncthreads();
#pragma unroll
  for (int j = 0; j < kSegs / kWideThreads; ++j) {
    const int s = threadIdx.x + j * kWideThreads;
    const int lc = s / kRowSegs, lr = s % kRowSegs * kSeg;  // column lc, rows lr..lr + 7
    const int64_t c = c0 + lc, r = r0 + lr;
    if (r >= rows || c >= cols) continue;
    uint32_t half[2] = {0, 0};
#pragma unroll
    for (int i = 0; i < kSeg; ++i) {
      half[i / 4] |= static_cast<uint32_t>(tile[(lr + i) * kWideLd + lc]) << (8 * (i % 4));
    }
    *reinterpret_cast<uint2*>(out_t + c * rows + r) = make_uint2(half[0], half[1]);
  }
}

template <typename T, __nv_fp8_interpretation_t kFormat>
absl::Status LaunchQuantize(cudaStream_t stream, Fp8Format format, const T* x, int64_t rows,
                            int64_t cols, const float* amax, uint8_t* out, uint8_t* out_t,
                            float* scale_inv) {
  auto aligned8 = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 8 == 0; };
  const bool wide =
      rows % kSeg == 0 && cols % kSeg == 0 && Aligned16(x) && aligned8(out) && aligned8(out_t);
  const int64_t side = wide ? kWide : kTile;
  const dim3 grid(static_cast<unsigned>((cols + side - 1) / side),
                  static_cast<unsigned>((rows + side - 1) / side));
  auto launch = [&](auto kernel, dim3 block) {
    kernel<<<grid, block, 0, stream>>>(x, rows, cols, amax, Fp8Max(format), kFp8MinAmax, out, out_t,
                                       scale_inv);
  };
  if (wide) {
    out_t != nullptr ? launch(QuantizeWideKernel<T, kFormat, true>, dim3(kWideThreads))
                     : launch(QuantizeWideKernel<T, kFormat, false>, dim3(kWideThreads));
  } else {
    out_t != nullptr ? launch(QuantizeKernel<T, kFormat, true>, dim3(kTile, kTileRows))
                     : launch(QuantizeKernel<T, kFormat, false>, dim3(kTile, kTileRows));
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
