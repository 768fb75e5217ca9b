// Softmax + cross-entropy over one chunk of rows of logits, fused with the logits' gradient.
// The model calls it chunk by chunk, so no more than one chunk of probabilities ever exists.
#ifndef TRAINYARD_KERNELS_CPU_CROSS_ENTROPY_H_
#define TRAINYARD_KERNELS_CPU_CROSS_ENTROPY_H_

#include <cstdint>

namespace trainyard::kernels::cpu {

// Returns Σ_rows -log softmax(logits[r])[targets[r]] (accumulated in double). logits is scratch:
// it is overwritten, and when write_grad is set it ends holding the logits' gradient
// grad_scale · (softmax(logits) - onehot(target)).
// Targets must lie in [0, vocab).
double SoftmaxCrossEntropy(float* logits, const int32_t* targets, int64_t rows, int64_t vocab,
                           float grad_scale, bool write_grad);

}  // namespace trainyard::kernels::cpu

#endif  // TRAINYARD_KERNELS_CPU_CROSS_ENTROPY_H_
