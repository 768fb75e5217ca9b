// Mixture-of-experts data movement on the CPU: tokens to their experts' rows and back, and the
// router's fp32 linear layer's backward. Deterministic: every output row is one thread's, its
// terms added in a fixed order.
#ifndef TRAINYARD_KERNELS_CPU_MOE_H_
#define TRAINYARD_KERNELS_CPU_MOE_H_

#include <cstdint>

namespace trainyard::kernels::cpu {

// out row r = scale[r] · inp row rows[r], `count` rows of `cols` (scale null: 1).
void GatherRows(float* out, const float* inp, const int32_t* rows, const float* scale,
                int64_t count, int64_t cols);

// out row t (overwritten, or accumulated) = Σ_j weights[t·k + j] · inp row slots[t·k + j] for
// j < k in order, skipping slots −1 (weights null: 1).
void CombineRows(float* out, const float* inp, const int32_t* slots, const float* weights,
                 int64_t rows, int64_t k, int64_t cols, bool accumulate);

// out[r] = ⟨a row a_rows[r], b row r⟩ for r < count.
void RowDots(float* out, const float* a, const int32_t* a_rows, const float* b, int64_t count,
             int64_t cols);

// The backward of out = inp · weightᵀ with both gradients accumulated: dinp[m, k] += dout ·
// weight, dweight[n, k] += doutᵀ · inp (either skipped when null).
void LinearBackwardAccumulate(float* dinp, float* dweight, const float* dout, const float* inp,
                              const float* weight, int64_t m, int64_t n, int64_t k);

}  // namespace trainyard::kernels::cpu

#endif  // TRAINYARD_KERNELS_CPU_MOE_H_
