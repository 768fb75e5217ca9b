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

}  // namespace trainyard::kernels::cuda

#endif  // TRAINYARD_KERNELS_CUDA_MEMORY_BOUND_CUH_
