// Pointwise activations with explicit backward: GELU (tanh approximation, as GPT-2) and the gated
// units SwiGLU and GeGLU (kernels/glu.h).
#ifndef TRAINYARD_KERNELS_CPU_ACTIVATIONS_H_
#define TRAINYARD_KERNELS_CPU_ACTIVATIONS_H_

#include <cstdint>

#include "kernels/glu.h"

namespace trainyard::kernels::cpu {

void GeluForward(float* out, const float* inp, int64_t n);
// dinp = dout · gelu'(inp) (overwritten). dinp may alias dout.
void GeluBackward(float* dinp, const float* dout, const float* inp, int64_t n);

// inp is [rows, 2f]: the gate in columns [0, f), the up projection in [f, 2f).
// out[rows, f] = g(gate) · up, g being SiLU or GELU (tanh) as `gate` says.
void GluForward(float* out, const float* inp, int64_t rows, int64_t f, GluGate gate);
// dinp[rows, 2f] (overwritten) from dout[rows, f].
void GluBackward(float* dinp, const float* dout, const float* inp, int64_t rows, int64_t f,
                 GluGate gate);

}  // namespace trainyard::kernels::cpu

#endif  // TRAINYARD_KERNELS_CPU_ACTIVATIONS_H_
