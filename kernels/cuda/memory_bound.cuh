// Building blocks of memory-bound kernels: 16-byte vector accesses (8 bf16 or 4 fp32 at a time)
// with single-element fallbacks, the alignment test that chooses between them, and the grid of
// a grid-stride loop sized to the device. Included by .cu files only.
#ifndef TRAINYARD_KERNELS_CUDA_MEMORY_BOUND_CUH_
#define TRAINYARD_KERNELS_CUDA_MEMORY_BOUND_CUH_

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "absl/status/statusor.h"
#include "kernels/cuda/check.h"

namespace trainyard::kernels::cuda {

// Elements of T in one 16-byte access.
template <typename T>
inline constexpr int kPackOf = static_cast<int>(16 / sizeof(T));

// kVec consecutive elements. When kVec is a multiple of kPackOf<T> they move with 16-byte
// accesses (the address must then be 16-byte aligned); otherwise kVec is 1.
template <typename T, int kVec>
struct alignas(kVec % kPackOf<T> == 0 ? 16 : alignof(T)) Vec {
  static_assert(kVec == 1 || kVec % kPackOf<T> == 0);
  T v[kVec];
};

template <typename T, int kVec>
__device__ __forceinline__ Vec<T, kVec> LoadVec(const T* p) {
  Vec<T, kVec> x;
  if constexpr (kVec % kPackOf<T> == 0) {
#pragma unroll
    for (int k = 0; k < kVec; k += kPackOf<T>) {
      *reinterpret_cast<uint4*>(x.v + k) = *reinterpret_cast<const uint4*>(p + k);
    }
  } else {
    x.v[0] = *p;
  }
  return x;
}

template <typename T, int kVec>
__device__ __forceinline__ void StoreVec(T* p, const Vec<T, kVec>& x) {
  if constexpr (kVec % kPackOf<T> == 0) {
#pragma unroll
    for (int k = 0; k < kVec; k += kPackOf<T>) {
      *reinterpret_cast<uint4*>(p + k) = *reinterpret_cast<const uint4*>(x.v + k);
    }
  } else {
    p[0] = x.v[0];
  }
}

// Whether `p` allows 16-byte accesses.
inline bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Blocks of `threads` for a grid-stride loop over `units` work items on the current device:
// enough to cover them, but no more than `blocks_per_sm` per multiprocessor (fewer if the
// multiprocessor holds fewer threads), so that one wave fills the device and each thread then
// loops. Kernels declare __launch_bounds__(threads, blocks_per_sm) so that they all fit.
inline absl::StatusOr<unsigned int> GridStrideBlocks(int64_t units, int threads,
                                                     int blocks_per_sm) {
  int device = 0, sms = 0, threads_per_sm = 0;
  TY_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  TY_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  TY_CUDA_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&threads_per_sm, cudaDevAttrMaxThreadsPerMultiProcessor, device));
  const int resident = std::max(1, std::min(blocks_per_sm, threads_per_sm / threads));
  const int64_t wave = int64_t{std::max(sms, 1)} * resident;
  return static_cast<unsigned int>(std::min<int64_t>(BlocksFor(units, threads), wave));
}

// The grid-stride kernels below: 256 threads a block and 8 blocks a multiprocessor (2048
// threads, the most an sm_80/sm_90 multiprocessor holds, so at most 32 registers a thread).
inline constexpr int kStrideThreads = 256;
inline constexpr int kStrideBlocksPerSm = 8;

__device__ __forceinline__ int64_t FirstIndex() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t GridStride() {
  return static_cast<int64_t>(gridDim.x) * blockDim.x;
}

// An operation is a struct with `Elem` (its narrowest element type, which sets the unit: 16
// bytes of it) and Apply<kVec>(i) for flat elements, or Apply<kVec>(r, j) for rows.
// Elements [0, n): units of kVec in a grid-stride loop, then the last n mod kVec one at a time.
template <int kVec, typename Op>
__global__ void __launch_bounds__(kStrideThreads, kStrideBlocksPerSm)
    ElementsKernel(Op op, int64_t n) {
  const int64_t in_units = n / kVec * kVec, stride = GridStride();
  for (int64_t i = FirstIndex() * kVec; i < in_units; i += stride * kVec) {
    op.template Apply<kVec>(i);
  }
  for (int64_t i = in_units + FirstIndex(); i < n; i += stride) op.template Apply<1>(i);
}

// Rows × f elements (f a multiple of kVec), as units of kVec in a grid-stride loop over the
// flattened units; the (row, unit) position advances by the stride without a division a step.
template <int kVec, typename Op>
__global__ void __launch_bounds__(kStrideThreads, kStrideBlocksPerSm)
    RowsKernel(Op op, int64_t rows, int64_t f) {
  const int64_t units = f / kVec, first = FirstIndex(), stride = GridStride();
  // Both below the stride, which is below 2^31 (one wave of blocks).
  const int stride_rows = static_cast<int>(stride / units);
  const int stride_units = static_cast<int>(stride - stride_rows * units);
  int64_t r = first / units, u = first - r * units;
  while (r < rows) {
    op.template Apply<kVec>(r, u * kVec);
    r += stride_rows;
    u += stride_units;
    if (u >= units) {
      u -= units;
      ++r;
    }
  }
}

template <int kVec, typename Op>
absl::Status LaunchElements(cudaStream_t stream, const char* name, const Op& op, int64_t n) {
  TY_ASSIGN_OR_RETURN(
      const unsigned int blocks,
      GridStrideBlocks(std::max(n / kVec, n % kVec), kStrideThreads, kStrideBlocksPerSm));
  ElementsKernel<kVec, Op><<<blocks, kStrideThreads, 0, stream>>>(op, n);
  TY_CUDA_RETURN_IF_LAUNCH_FAILED(name);
  return absl::OkStatus();
}

// 16-byte units when every pointer of the operation allows them.
template <typename Op>
absl::Status LaunchElements(cudaStream_t stream, const char* name, const Op& op, int64_t n,
                            bool aligned) {
  constexpr int kPack = kPackOf<typename Op::Elem>;
  return aligned ? LaunchElements<kPack>(stream, name, op, n)
                 : LaunchElements<1>(stream, name, op, n);
}

template <int kVec, typename Op>
absl::Status LaunchRows(cudaStream_t stream, const char* name, const Op& op, int64_t rows,
                        int64_t f) {
  TY_ASSIGN_OR_RETURN(const unsigned int blocks,
                      GridStrideBlocks(rows * (f / kVec), kStrideThreads, kStrideBlocksPerSm));
  RowsKernel<kVec, Op><<<blocks, kStrideThreads, 0, stream>>>(op, rows, f);
  TY_CUDA_RETURN_IF_LAUNCH_FAILED(name);
  return absl::OkStatus();
}

// 16-byte units when every pointer allows them and rows start on 16-byte boundaries.
template <typename Op>
absl::Status LaunchRows(cudaStream_t stream, const char* name, const Op& op, int64_t rows,
                        int64_t f, bool aligned) {
  constexpr int kPack = kPackOf<typename Op::Elem>;
  return aligned && f % kPack == 0 ? LaunchRows<kPack>(stream, name, op, rows, f)
                                   : LaunchRows<1>(stream, name, op, rows, f);
}

}  // namespace trainyard::kernels::cuda

#endif  // TRAINYARD_KERNELS_CUDA_MEMORY_BOUND_CUH_
