// The optimizer's element-wise kernels: AdamW with decoupled weight decay (PyTorch's AdamW
// update order) and the pieces of global-norm clipping.
#ifndef TRAINYARD_KERNELS_CPU_ADAMW_H_
#define TRAINYARD_KERNELS_CPU_ADAMW_H_

#include <cstdint>

namespace trainyard::kernels::cpu {

struct AdamWStep {
  float lr;
  float beta1;
  float beta2;
  float eps;
  float weight_decay;       // 0 for parameters that are not decayed
  int64_t step;             // 1-based, for bias correction
  float grad_scale = 1.0f;  // gradients are read as grad · grad_scale (global-norm clipping)
};

// p ← p·(1 − lr·wd); m ← β1·m + (1−β1)·g; v ← β2·v + (1−β2)·g²;
// p ← p − (lr / (1−β1ᵗ)) · m / (√v / √(1−β2ᵗ) + ε).
void AdamWUpdate(float* param, const float* grad, float* m, float* v, int64_t n,
                 const AdamWStep& s);

// Σ x², accumulated in double in a fixed order.
double SumOfSquares(const float* x, int64_t n);

void ScaleInPlace(float* x, int64_t n, float factor);
// out[i] = in[i] · factor (out may be in).
void ScaleInto(float* out, const float* in, int64_t n, float factor);

}  // namespace trainyard::kernels::cpu

#endif  // TRAINYARD_KERNELS_CPU_ADAMW_H_
