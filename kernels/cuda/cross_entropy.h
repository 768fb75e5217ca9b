// Softmax cross-entropy over a chunk of logit rows on the GPU (the logits soft-capped or not),
// with the logits' gradient written in place (the logits buffer is the largest activation; it never
// has a second copy). Logits are `dtype`; every reduction is fp32 (online max / sum of
// exponentials, one block per row). Semantics match kernels/cpu/cross_entropy.h.
#ifndef TRAINYARD_KERNELS_CUDA_CROSS_ENTROPY_H_
#define TRAINYARD_KERNELS_CUDA_CROSS_ENTROPY_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "common/dtype.h"

namespace trainyard::kernels::cuda {

// losses[r] = logsumexp(logits[r]) − logits[r, targets[r]]; with write_grad the row becomes
// grad_scale · (softmax − onehot); without write_grad the logits are left unchanged. Targets
// must lie in [0, vocab); the launcher cannot check device data, so a target outside it gives
// that row a NaN loss (and no onehot term) rather than an out-of-bounds access. Row r starts at
// logits + r · ld (ld ≥ vocab); the columns [vocab, ld) of a padded row are left alone. With
// softcap C > 0 the logits are capped ones (SoftCap) and the gradient is taken through the cap,
// times 1 − (z / C)²; 0 for none. With z_loss > 0 the gradient is that of the cross-entropy plus
// z_loss · lse² (the softmax term times 1 + 2·z_loss·lse); losses stay the cross-entropy's. lse,
// when not null, receives each row's log-sum-exp.
[[nodiscard]] absl::Status SoftmaxCrossEntropy(cudaStream_t stream, DType dtype, void* logits,
                                               const int32_t* targets, int64_t rows, int64_t vocab,
                                               int64_t ld, float grad_scale, bool write_grad,
                                               float* losses, float softcap = 0.0f,
                                               float z_loss = 0.0f, float* lse = nullptr);
// The final logits' soft cap (model.logit_softcap) in place: z = cap · tanh(x / cap) over the
// first `cols` columns of each of `rows` rows ld apart. cap > 0.
[[nodiscard]] absl::Status SoftCap(cudaStream_t stream, DType dtype, void* x, int64_t rows,
                                   int64_t cols, int64_t ld, float cap);
// Vocabulary-parallel pieces: stats[r] = (max, Σ exp(x − max), target logit or 0 when the
// target (−1) is another shard's). A local target ≥ vocab (not checkable here) gives NaN.
[[nodiscard]] absl::Status CrossEntropyShardStats(cudaStream_t stream, DType dtype,
                                                  const void* logits, const int32_t* local_targets,
                                                  int64_t rows, int64_t vocab, float* stats);
// logits[r] ← grad_scale · (exp(x − lse[r]) − onehot(local target)), through the cap as above
// when softcap > 0, the softmax term times 1 + 2·z_loss·lse[r] under a z-loss.
[[nodiscard]] absl::Status CrossEntropyShardGrad(cudaStream_t stream, DType dtype, void* logits,
                                                 const int32_t* local_targets, const float* lse,
                                                 int64_t rows, int64_t vocab, float grad_scale,
                                                 float softcap = 0.0f, float z_loss = 0.0f);

// The shards' statistics merged (kernels/cpu/cross_entropy.h: CrossEntropyMergeShardStats), one
// thread per row in double: lse[r] and row_loss[r] for r < rows, from `ranks` gathered blocks of
// `stride` rows.
[[nodiscard]] absl::Status CrossEntropyMergeShardStats(cudaStream_t stream, const float* gathered,
                                                       int ranks, int64_t stride, int64_t rows,
                                                       float* lse, float* row_loss);

}  // namespace trainyard::kernels::cuda

#endif  // TRAINYARD_KERNELS_CUDA_CROSS_ENTROPY_H_
