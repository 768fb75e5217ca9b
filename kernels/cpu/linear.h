// Linear layers on the CPU through OpenBLAS. Weights are [out, in] (row-major), as in the
// PyTorch nn.Linear convention, so y = x · Wᵀ + b.
#ifndef TRAINYARD_KERNELS_CPU_LINEAR_H_
#define TRAINYARD_KERNELS_CPU_LINEAR_H_

#include <cstdint>

namespace trainyard::kernels::cpu {

// out[m, n] = Σ_k inp[m, k] · weight[n, k] + bias[n]. `bias` may be null. One row (m = 1, as each
// generated token is) runs as a matrix-vector product: OpenBLAS's sgemm packs the whole weight
// first, and so reads it three times where sgemv reads it once (OpenBLAS 0.3.21's OpenMP build,
// which Trainyard links, two threads on the 2-core x86-64 VM: a 50257 × 768 weight 12.1–12.7 ms
// by sgemm, 3.9–4.0 ms by sgemv; 1024 × 2816 0.79–0.80 and 0.28 ms). The input's gradient of one
// row likewise.
void LinearForward(float* out, const float* inp, const float* weight, const float* bias, int64_t m,
                   int64_t n, int64_t k);

// dinp[m, k] = Σ_n dout[m, n] · weight[n, k]   (overwritten; skipped when dinp is null)
// dweight[n, k] += Σ_m dout[m, n] · inp[m, k]    (skipped when dweight is null)
// dbias[n] += Σ_m dout[m, n]                      (skipped when dbias is null)
void LinearBackward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                    const float* weight, int64_t m, int64_t n, int64_t k);

// out[m, n] += bias[n].
void AddBias(float* out, const float* bias, int64_t m, int64_t n);

// sums[n] += Σ_m x[m, n], rows visited in order (deterministic, thread-count independent).
void AccumulateColumnSums(float* sums, const float* x, int64_t m, int64_t n);

}  // namespace trainyard::kernels::cpu

#endif  // TRAINYARD_KERNELS_CPU_LINEAR_H_
