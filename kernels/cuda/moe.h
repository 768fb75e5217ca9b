// Mixture-of-experts kernels on the GPU: tokens gathered into their experts' rows and combined
// back, per-row dot products, and the router's linear layer (fp32 weights and logits). Semantics
// match kernels/cpu/moe.h and, for the router's forward, kernels/cpu/linear.h LinearForward.
//
// Activations are `dtype` (fp32 or bf16); router weights, logits, scales, combine weights and dot
// products are fp32. Arithmetic is fp32 and deterministic: every output element is written by
// one thread (one warp for a dot product), its terms added in a fixed order, no atomics, so a
// call gives the same bits on every run. Row indices and slots are not range-checked on the
// device: they must lie within the input the caller passes.
#ifndef TRAINYARD_KERNELS_CUDA_MOE_H_
#define TRAINYARD_KERNELS_CUDA_MOE_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "common/dtype.h"

namespace trainyard::kernels::cuda {

// out row r = scale[r] · inp row rows[r] for r < count, rows of `cols` (rows null: row r; scale
// null: 1). out must not overlap inp. INVALID_ARGUMENT for a negative size or a missing pointer.
[[nodiscard]] absl::Status GatherRows(cudaStream_t stream, DType dtype, void* out, const void* inp,
                                      const int32_t* rows, const float* scale, int64_t count,
                                      int64_t cols);

// out row t (overwritten, or added to when `accumulate`) = Σ_j weights[t·k + j] · inp row
// slots[t·k + j] over j < k in order, skipping slots −1 (weights null: 1), for t < rows. The sum
// is formed in fp32 and rounded to `dtype` once. out must not overlap inp.
[[nodiscard]] absl::Status CombineRows(cudaStream_t stream, DType dtype, void* out, const void* inp,
                                       const int32_t* slots, const float* weights, int64_t rows,
                                       int64_t k, int64_t cols, bool accumulate);

// out[r] = ⟨a row a_rows[r], b row r⟩ for r < count (fp32, one warp per row).
[[nodiscard]] absl::Status RowDots(cudaStream_t stream, DType dtype, float* out, const void* a,
                                   const int32_t* a_rows, const void* b, int64_t count,
                                   int64_t cols);

// The shared experts' gate (kernels/cpu/moe.h SigmoidGateRows): gate[r] = sigmoid(logits[r]) and
// x row r ×= gate[r] (rounded once), one warp per row; gate may be logits.
[[nodiscard]] absl::Status SigmoidGateRows(cudaStream_t stream, DType dtype, float* gate,
                                           const float* logits, void* x, int64_t rows,
                                           int64_t cols);

// Its backward: dlogits[r] = (1 − gate[r]) · ⟨act row r, dact row r⟩ (fp32, one warp per row).
[[nodiscard]] absl::Status SigmoidGateBackward(cudaStream_t stream, DType dtype, float* dlogits,
                                               const float* gate, const void* act, const void* dact,
                                               int64_t rows, int64_t cols);

// The router's logits: out[m, n] = Σ_k inp[m, k] · weight[n, k] (overwritten; k = 0 gives 0).
[[nodiscard]] absl::Status RouterLinearForward(cudaStream_t stream, DType dtype, float* out,
                                               const void* inp, const float* weight, int64_t m,
                                               int64_t n, int64_t k);

// Its backward, both gradients accumulated, either skipped when null:
//   dinp[m, k] += Σ_n dout[m, n] · weight[n, k]   (dinp `dtype`, rounded once)
//   dweight[n, k] += Σ_m dout[m, n] · inp[m, k]   (fp32, rows m added in order)
[[nodiscard]] absl::Status RouterLinearBackward(cudaStream_t stream, DType dtype, void* dinp,
                                                float* dweight, const float* dout, const void* inp,
                                                const float* weight, int64_t m, int64_t n,
                                                int64_t k);

}  // namespace trainyard::kernels::cuda

#endif  // TRAINYARD_KERNELS_CUDA_MOE_H_
