// FP8 quantization on the GPU (the formats and the scaling rule: kernels/fp8_format.h): a
// tensor's largest magnitude, then the tensor scaled and encoded, with its transpose where a
// GEMM needs the other dimension contiguous (cuBLASLt's FP8 products take both operands with
// the summed dimension contiguous: Gemm::Fp8). The CPU reference is kernels/cpu/fp8.h; the codes
// are the same bits.
#ifndef TRAINYARD_KERNELS_CUDA_FP8_H_
#define TRAINYARD_KERNELS_CUDA_FP8_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "common/dtype.h"
#include "kernels/fp8_format.h"

namespace trainyard::kernels::cuda {

// *amax (device) = max |x[i]| over n values of the storage type `dtype` (NaN if any is NaN;
// 0 for n = 0). Exact: a maximum does not depend on the order.
[[nodiscard]] absl::Status AbsMax(cudaStream_t stream, DType dtype, const void* x, int64_t n,
                                  float* amax);

// With scale = Fp8Max(format) / max(*amax, kFp8MinAmax): out[r, c] = fp8(x[r, c] · scale) for x
// as rows × cols, out_t (may be null) the same codes as cols × rows, and *scale_inv = 1 / scale,
// the factor a GEMM multiplies back by. amax and scale_inv are device memory; nothing is written
// for an empty x.
[[nodiscard]] absl::Status QuantizeFp8(cudaStream_t stream, DType dtype, Fp8Format format,
                                       const void* x, int64_t rows, int64_t cols, const float* amax,
                                       void* out, void* out_t, float* scale_inv);

}  // namespace trainyard::kernels::cuda

#endif  // TRAINYARD_KERNELS_CUDA_FP8_H_
