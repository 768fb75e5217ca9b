// Multi-tensor AdamW on the GPU: one launch updates every tensor of a list (fp32 parameters,
// gradients and moments), with the global-norm clipping factor applied to each gradient as it
// is read, so clipping costs no pass of its own, and a tensor's bf16 copy written as its
// parameter is, so keeping one costs no pass either. Semantics match kernels/cpu/adamw.h.
#ifndef TRAINYARD_KERNELS_CUDA_ADAMW_H_
#define TRAINYARD_KERNELS_CUDA_ADAMW_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "absl/status/status.h"

namespace trainyard::kernels::cuda {

struct AdamWTensor {
  float* param;
  const float* grad;
  float* m;
  float* v;
  int64_t n;
  float weight_decay;  // 0 for tensors that are not decayed
  // When set, n bf16 values: the updated parameter rounded to nearest even, written in the
  // same pass (the tensor cores' copy of a weight, without a conversion pass of its own).
  void* bf16_copy = nullptr;
};

struct AdamWHyper {
  float lr, beta1, beta2, eps;
  int64_t step;      // 1-based, for bias correction
  float grad_scale;  // the clipping factor (1 when not clipping); g = grad · grad_scale
};

// Updates every tensor in `tensors` (any number; the launcher batches them into as few launches
// as the argument space allows). Tensors may not overlap.
[[nodiscard]] absl::Status MultiTensorAdamW(cudaStream_t stream,
                                            const std::vector<AdamWTensor>& tensors,
                                            const AdamWHyper& hyper);

}  // namespace trainyard::kernels::cuda

#endif  // TRAINYARD_KERNELS_CUDA_ADAMW_H_
