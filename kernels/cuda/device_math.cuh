// Device-side helpers shared by the kernels: loads and stores that convert between the storage
// type (float or bf16) and fp32 compute, and warp / block reductions. Included by .cu files only.
#ifndef TRAINYARD_KERNELS_CUDA_DEVICE_MATH_CUH_
#define TRAINYARD_KERNELS_CUDA_DEVICE_MATH_CUH_

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "common/dtype.h"

namespace trainyard::kernels::cuda {

using bf16 = __nv_bfloat16;

__device__ __forceinline__ float ToFloat(float x) { return x; }
__device__ __forceinline__ float ToFloat(bf16 x) { return __bfloat162float(x); }

template <typename T>
__device__ __forceinline__ T FromFloat(float x);
template <>
__device__ __forceinline__ float FromFloat<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ bf16 FromFloat<bf16>(float x) {
  return __float2bfloat16_rn(x);
}

__device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float WarpMax(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the block; every thread gets the result. `scratch` holds 32 floats of shared memory.
// All threads of the block must call it.
__device__ __forceinline__ float BlockSum(float v, float* scratch) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int warps = (blockDim.x + 31) / 32;
  v = WarpSum(v);
  __syncthreads();  // scratch may still be read from a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : 0.0f;
  return WarpSum(v);
}

__device__ __forceinline__ float BlockMax(float v, float* scratch) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int warps = (blockDim.x + 31) / 32;
  v = WarpMax(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : -INFINITY;
  return WarpMax(v);
}

}  // namespace trainyard::kernels::cuda

// Instantiates a launcher body for both storage types, dispatching on a runtime DType:
//   TY_DISPATCH_DTYPE(dtype, T, { Kernel<T><<<...>>>(static_cast<T*>(p), ...); })
#define TY_DISPATCH_DTYPE(dtype, T, ...)          \
  do {                                            \
    if ((dtype) == ::trainyard::DType::kBF16) {   \
      using T = ::trainyard::kernels::cuda::bf16; \
      __VA_ARGS__                                 \
    } else {                                      \
      using T = float;                            \
      __VA_ARGS__                                 \
    }                                             \
  } while (false)

#endif  // TRAINYARD_KERNELS_CUDA_DEVICE_MATH_CUH_
