// LayerNorm and RMSNorm over the last dimension of a [rows, c] matrix, with explicit backward.
#ifndef TRAINYARD_KERNELS_CPU_NORMS_H_
#define TRAINYARD_KERNELS_CPU_NORMS_H_

#include <cstdint>

namespace trainyard::kernels::cpu {

// out = (x - mean) · rstd · w + b, with biased variance. Saves mean[rows] and rstd[rows].
void LayerNormForward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                      const float* bias, int64_t rows, int64_t c, float eps);

// Accumulates: dinp += ∂/∂x, dweight += ∂/∂w, dbias += ∂/∂b.
void LayerNormBackward(float* dinp, float* dweight, float* dbias, const float* dout,
                       const float* inp, const float* weight, const float* mean, const float* rstd,
                       int64_t rows, int64_t c);

// out = x · rstd · w with rstd = 1/sqrt(mean(x²) + eps). Saves rstd[rows].
void RmsNormForward(float* out, float* rstd, const float* inp, const float* weight, int64_t rows,
                    int64_t c, float eps);

// Accumulates: dinp += ∂/∂x, dweight += ∂/∂w.
void RmsNormBackward(float* dinp, float* dweight, const float* dout, const float* inp,
                     const float* weight, const float* rstd, int64_t rows, int64_t c);

}  // namespace trainyard::kernels::cpu

#endif  // TRAINYARD_KERNELS_CPU_NORMS_H_
