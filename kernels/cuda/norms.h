// LayerNorm and RMSNorm on the GPU, forward (optionally fused with the residual add that precedes
// the norm) and backward. Storage of activations is `dtype` (fp32 or bf16); weights, biases,
// statistics and their gradients are fp32; all arithmetic is fp32. Semantics match
// kernels/cpu/norms.h. Every launcher checks its arguments (INVALID_ARGUMENT) and returns the
// launch status; work is enqueued on `stream`.
#ifndef TRAINYARD_KERNELS_CUDA_NORMS_H_
#define TRAINYARD_KERNELS_CUDA_NORMS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "common/dtype.h"

namespace trainyard::kernels::cuda {

// out = LN(inp) · weight + bias (bias may be null); mean, rstd: [rows] fp32.
[[nodiscard]] absl::Status LayerNormForward(cudaStream_t stream, DType dtype, void* out,
                                            float* mean, float* rstd, const void* inp,
                                            const float* weight, const float* bias, int64_t rows,
                                            int64_t c, float eps);
// sum = a + b (stored as dtype), out = LN(sum) · weight + bias: the residual add and the norm in
// one pass over memory. The norm reads the stored (rounded) sum, so the result equals the
// unfused Add then LayerNormForward. `sum` may alias `a` or `b` (the residual stream updated in
// place); it must not overlap `out`.
[[nodiscard]] absl::Status AddLayerNormForward(cudaStream_t stream, DType dtype, void* sum,
                                               void* out, float* mean, float* rstd, const void* a,
                                               const void* b, const float* weight,
                                               const float* bias, int64_t rows, int64_t c,
                                               float eps);
// dinp += ∂/∂inp; dweight += ∂/∂weight; dbias += ∂/∂bias (dbias may be null). The weight and
// bias gradients are deterministic (fixed-order reduction over rows, no atomics; the order
// depends on the shape, dtype and whether the rows are 16-byte aligned): `scratch` must hold
// NormBackwardScratchFloats(rows, c) floats.
[[nodiscard]] absl::Status LayerNormBackward(cudaStream_t stream, DType dtype, void* dinp,
                                             float* dweight, float* dbias, const void* dout,
                                             const void* inp, const float* weight,
                                             const float* mean, const float* rstd, int64_t rows,
                                             int64_t c, float* scratch);

// out = inp · rstd · weight with rstd = 1 / sqrt(mean(inp²) + eps); rstd: [rows].
[[nodiscard]] absl::Status RmsNormForward(cudaStream_t stream, DType dtype, void* out, float* rstd,
                                          const void* inp, const float* weight, int64_t rows,
                                          int64_t c, float eps);
// As AddLayerNormForward, with RMSNorm.
[[nodiscard]] absl::Status AddRmsNormForward(cudaStream_t stream, DType dtype, void* sum, void* out,
                                             float* rstd, const void* a, const void* b,
                                             const float* weight, int64_t rows, int64_t c,
                                             float eps);
// dinp += ∂/∂inp; dweight += ∂/∂weight (deterministic; scratch as above).
[[nodiscard]] absl::Status RmsNormBackward(cudaStream_t stream, DType dtype, void* dinp,
                                           float* dweight, const void* dout, const void* inp,
                                           const float* weight, const float* rstd, int64_t rows,
                                           int64_t c, float* scratch);

// RMSNorm over rows whose n columns are split over ranks, c of them here (kernels/cpu/norms.h
// has the semantics; kernels/cuda/split_norms.cu): the caller sums `sums`, then `dots`, over the
// ranks between the two launches of each pass. RmsNormFromSums reads the summed Σx² from rstd and
// leaves the row's rstd there; RmsNormBackwardFromDots accumulates (deterministic; scratch as
// above).
[[nodiscard]] absl::Status RowSquareSums(cudaStream_t stream, DType dtype, float* sums,
                                         const void* x, int64_t rows, int64_t c);
[[nodiscard]] absl::Status RmsNormFromSums(cudaStream_t stream, DType dtype, void* out, float* rstd,
                                           const void* inp, const float* weight, int64_t rows,
                                           int64_t c, int64_t n, float eps);
[[nodiscard]] absl::Status RmsNormDots(cudaStream_t stream, DType dtype, float* dots,
                                       const void* dout, const void* inp, const float* weight,
                                       const float* rstd, int64_t rows, int64_t c);
[[nodiscard]] absl::Status RmsNormBackwardFromDots(cudaStream_t stream, DType dtype, void* dinp,
                                                   float* dweight, const void* dout,
                                                   const void* inp, const float* weight,
                                                   const float* rstd, const float* dots,
                                                   int64_t rows, int64_t c, int64_t n,
                                                   float* scratch);

// Floats of scratch the backward launchers need for `rows` × `c`.
int64_t NormBackwardScratchFloats(int64_t rows, int64_t c);

}  // namespace trainyard::kernels::cuda

#endif  // TRAINYARD_KERNELS_CUDA_NORMS_H_
