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

// RMSNorm over rows whose n columns are split over ranks, each holding c of them (and the
// weight's c entries for them): the ranks sum the per-row partial sums between the steps.
// Forward: sums[r] = Σ x² over this rank's columns; then, with rstd holding Σx² over all n
// columns on entry, rstd ← 1/sqrt(Σx²/n + eps) and out = x · rstd · w. Equal bits to
// RmsNormForward when c == n.
void RowSquareSums(float* sums, const float* x, int64_t rows, int64_t c);
void RmsNormFromSums(float* out, float* rstd, const float* inp, const float* weight, int64_t rows,
                     int64_t c, int64_t n, float eps);
// Backward: dots[r] = Σ dout · w · x · rstd over this rank's columns; then, with `dots` summed
// over all n columns, dinp += ∂/∂x and dweight += ∂/∂w for this rank's columns (accumulating,
// as RmsNormBackward, whose bits it equals when c == n).
void RmsNormDots(float* dots, const float* dout, const float* inp, const float* weight,
                 const float* rstd, int64_t rows, int64_t c);
void RmsNormBackwardFromDots(float* dinp, float* dweight, const float* dout, const float* inp,
                             const float* weight, const float* rstd, const float* dots,
                             int64_t rows, int64_t c, int64_t n);

}  // namespace trainyard::kernels::cpu

#endif  // TRAINYARD_KERNELS_CPU_NORMS_H_
