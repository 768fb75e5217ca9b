// The soft cap of Gemma 2's attention scores and final logits, shared by the CPU kernels
// (kernels/cpu/attention.cc, kernels/cpu/cross_entropy.cc) and the CUDA ones
// (kernels/cuda/cross_entropy.cu): a value x becomes z = C·tanh(x / C), and a gradient g with
// respect to z goes back through the cap as g·(1 − (z / C)²). The kernels carry 1 / C, which is 0
// for no cap (then the gradient's factor is exactly 1). With it, the cross-entropy's z-loss
// factor, shared the same way.
#ifndef TRAINYARD_KERNELS_SOFT_CAP_H_
#define TRAINYARD_KERNELS_SOFT_CAP_H_

#include <cmath>

#ifdef __CUDACC__
#define TY_SOFT_CAP_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define TY_SOFT_CAP_HOST_DEVICE inline
#endif

namespace trainyard::kernels {

// 1 / cap, 0 for none (cap 0).
TY_SOFT_CAP_HOST_DEVICE float InverseCap(float cap) { return cap > 0.0f ? 1.0f / cap : 0.0f; }

// C·tanh(x / C), with inv_cap = 1 / C.
TY_SOFT_CAP_HOST_DEVICE float SoftCapped(float x, float cap, float inv_cap) {
  return cap * tanhf(x * inv_cap);
}

// The gradient g of a capped value z taken through the cap: g·(1 − (z·inv_cap)²).
TY_SOFT_CAP_HOST_DEVICE float ThroughCap(float g, float z, float inv_cap) {
  const float t = z * inv_cap;
  return g * (1.0f - t * t);
}

// PaLM's z-loss, z_loss · lse² added to a row's cross-entropy (lse its log-sum-exp), adds
// 2·z_loss·lse·softmax to the logits' gradient: the softmax term's factor 1 + 2·z_loss·lse
// (exactly 1 without it).
TY_SOFT_CAP_HOST_DEVICE float ZLossFactor(float z_loss, float lse) {
  return 1.0f + 2.0f * z_loss * lse;
}

}  // namespace trainyard::kernels

#undef TY_SOFT_CAP_HOST_DEVICE

#endif  // TRAINYARD_KERNELS_SOFT_CAP_H_
