// The gate of a gated linear unit, shared by the CPU reference (kernels/cpu/activations.h) and the
// CUDA kernels (kernels/cuda/activations.h): out = gate_fn(gate) · up. SiLU makes SwiGLU (Llama's
// MLP), GELU with the tanh approximation makes GeGLU (Gemma's; transformers' gelu_pytorch_tanh).
#ifndef TRAINYARD_KERNELS_GLU_H_
#define TRAINYARD_KERNELS_GLU_H_

namespace trainyard::kernels {

enum class GluGate { kSilu, kGeluTanh };

// GeGLU's gate when `geglu` (a model's model.activation), else SwiGLU's.
constexpr GluGate GluGateOf(bool geglu) { return geglu ? GluGate::kGeluTanh : GluGate::kSilu; }

}  // namespace trainyard::kernels

#endif  // TRAINYARD_KERNELS_GLU_H_
