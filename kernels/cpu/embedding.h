// Token (and optional learned position) embedding lookup with a deterministic backward.
#ifndef TRAINYARD_KERNELS_CPU_EMBEDDING_H_
#define TRAINYARD_KERNELS_CPU_EMBEDDING_H_

#include <cstdint>

namespace trainyard::kernels::cpu {

// out[b·t + i] = scale · wte[tokens[b·t + i]] + wpe[i]; wpe may be null. A negative token (one
// that another vocabulary shard owns) reads as a zero row and receives no gradient. `scale` is 1,
// or Gemma's √width.
void EmbeddingForward(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                      int64_t b, int64_t t, int64_t c, float scale);

// dwte[token] += scale · dout[row]; dwpe[i] += Σ_b dout[b·t + i] (dwpe may be null). Rows are
// summed in order within column blocks, so the result does not depend on the thread count.
void EmbeddingBackward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                       int64_t b, int64_t t, int64_t c, float scale);

}  // namespace trainyard::kernels::cpu

#endif  // TRAINYARD_KERNELS_CPU_EMBEDDING_H_
