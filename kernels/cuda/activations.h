// GELU (tanh approximation, as GPT-2) and the gated units SwiGLU and GeGLU on the GPU, forward and
// backward; storage `dtype`, fp32 arithmetic. Semantics match kernels/cpu/activations.h.
#ifndef TRAINYARD_KERNELS_CUDA_ACTIVATIONS_H_
#define TRAINYARD_KERNELS_CUDA_ACTIVATIONS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "common/dtype.h"
#include "kernels/glu.h"

namespace trainyard::kernels::cuda {

[[nodiscard]] absl::Status GeluForward(cudaStream_t stream, DType dtype, void* out, const void* inp,
                                       int64_t n);
// dinp = dout · gelu'(inp) (overwritten); dinp may alias dout.
[[nodiscard]] absl::Status GeluBackward(cudaStream_t stream, DType dtype, void* dinp,
                                        const void* dout, const void* inp, int64_t n);
// inp: [rows, 2f], each row (gate[f], up[f]); out: [rows, f] = g(gate) · up, g being SiLU or
// GELU (tanh) as `gate` says.
[[nodiscard]] absl::Status GluForward(cudaStream_t stream, DType dtype, void* out, const void* inp,
                                      int64_t rows, int64_t f, GluGate gate);
// dinp: [rows, 2f] (overwritten).
[[nodiscard]] absl::Status GluBackward(cudaStream_t stream, DType dtype, void* dinp,
                                       const void* dout, const void* inp, int64_t rows, int64_t f,
                                       GluGate gate);

}  // namespace trainyard::kernels::cuda

#endif  // TRAINYARD_KERNELS_CUDA_ACTIVATIONS_H_
