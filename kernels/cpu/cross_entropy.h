// Softmax + cross-entropy over one chunk of rows of logits, fused with the logits' gradient.
// The model calls it chunk by chunk, so no more than one chunk of probabilities ever exists.
#ifndef TRAINYARD_KERNELS_CPU_CROSS_ENTROPY_H_
#define TRAINYARD_KERNELS_CPU_CROSS_ENTROPY_H_

#include <cstdint>

namespace trainyard::kernels::cpu {

// Returns Σ_rows -log softmax(logits[r])[targets[r]] (accumulated in double). logits is scratch:
// it is overwritten, and when write_grad is set it ends holding the logits' gradient
// grad_scale · (softmax(logits) - onehot(target)). Row r starts at logits + r · ld (ld ≥ vocab);
// the columns [vocab, ld) of a padded row are neither read nor written.
// Targets must lie in [0, vocab). With a soft cap C > 0 the logits hold capped values
// z = C·tanh(x / C) (SoftCap) and the gradient is that of x: times 1 − (z / C)². With z_loss > 0
// the gradient is that of the cross-entropy plus z_loss · lse² (PaLM's z-loss, lse the row's
// log-sum-exp; the returned sum is the cross-entropy's alone). lse, when not null, receives each
// row's log-sum-exp.
double SoftmaxCrossEntropy(float* logits, const int32_t* targets, int64_t rows, int64_t vocab,
                           int64_t ld, float grad_scale, bool write_grad, float softcap = 0.0f,
                           float z_loss = 0.0f, float* lse = nullptr);

// x ← C·tanh(x / C) over [rows, cols] with rows ld apart (Gemma 2's final logit soft cap).
void SoftCap(float* x, int64_t rows, int64_t cols, int64_t ld, float cap);

// Vocabulary-parallel pieces, for logits split by columns across ranks. Per row r of the local
// logits: stats[3r] = the row's local max m, stats[3r+1] = Σ exp(x − m), stats[3r+2] = the
// target's logit if this shard holds the target (local_targets[r] ≥ 0), else 0.
void CrossEntropyShardStats(const float* logits, const int32_t* local_targets, int64_t rows,
                            int64_t vocab, float* stats);
// logits ← grad_scale · (exp(logits − lse[r]) − onehot(local target)) in place, times
// 1 − (logits / C)² under a soft cap C > 0, the softmax term times 1 + 2·z_loss·lse[r] under a
// z-loss (as SoftmaxCrossEntropy).
void CrossEntropyShardGrad(float* logits, const int32_t* local_targets, const float* lse,
                           int64_t rows, int64_t vocab, float grad_scale, float softcap = 0.0f,
                           float z_loss = 0.0f);
// The shards' statistics merged, in double: `gathered` holds `ranks` blocks of `stride` rows of
// stats (rank k's of row r at gathered[3·(k·stride + r)]); for r < rows, lse[r] = M +
// log Σ_k s1·exp(s0 − M) with M the largest s0, and the row's loss is lse − Σ_k s2 (one shard
// holds the target). Writes row_loss[r] when row_loss is not null; returns Σ of the row losses
// (in row order, in double).
double CrossEntropyMergeShardStats(const float* gathered, int ranks, int64_t stride, int64_t rows,
                                   float* lse, float* row_loss);

}  // namespace trainyard::kernels::cpu

#endif  // TRAINYARD_KERNELS_CPU_CROSS_ENTROPY_H_
