// The memory equation of one rank, term by term as the engine stores its state:
//
// - parameters, gradients and AdamW's two moments are fp32 over the rank's ParameterLayout,
//   each parameter group padded to a multiple of dp · cp (the data- and context-parallel ranks
//   share the parameters); ZeRO-1 shards the moments, ZeRO-2 the gradients too, ZeRO-3 the
//   parameters too, to ⌈group / (dp · cp)⌉ elements per group (worker/parallel/sharded_params.h);
// - activations: every buffer one micro-batch's activation slot allocates (worker/model.cc) for
//   the rank's micro · seq_len / cp rows, times the slots the rank keeps (1, or under 1F1B the
//   micro-batches in flight); an MoE block's router logits, picks and experts' rows (top_k per
//   row) and the backward's MoE scratch among them (docs/planner.md, *Mixture of experts*);
//   under context parallelism, plus ring attention's buffers, once per rank
//   (worker/context_parallel.h); where the backend pads the LM head's width (CUDA: to a
//   multiple of 128), the padded head's weight and gradient copies, once per last-stage rank;
//   with bf16 activations and without ZeRO-3, the kept bf16 copies of the blocks' matmul
//   weights (KeptWeightBytes);
// - other: the largest transient working set of gathered parameter groups (ZeRO-3) and gradient
//   staging buffers (ZeRO-2/3), an MoE block's routed experts being a group of their own, plus
//   the pipeline's send and receive buffers.
//
// The first four equal the engine's accounting (TrainResult::memory) exactly, and so does the
// transient peak: the engine frees a group's gradient staging when the next group's is handed
// over, waiting for its reduction if it lags (worker/parallel/sharded_params.h).
//
// Threading: plain functions.
#ifndef TRAINYARD_PLANNER_MEMORY_MODEL_H_
#define TRAINYARD_PLANNER_MEMORY_MODEL_H_

#include <cstdint>

#include "planner/rank_shape.h"

namespace trainyard::planner {

struct RankMemory {
  int64_t parameters = 0;
  int64_t gradients = 0;
  int64_t optimizer = 0;
  int64_t activations = 0;
  int64_t transient = 0;         // gathered groups and gradient staging, at their peak
  int64_t pipeline_buffers = 0;  // 1F1B send/receive buffers
  int64_t other() const { return transient + pipeline_buffers; }
  int64_t total() const { return parameters + gradients + optimizer + activations + other(); }
};

RankMemory PredictRankMemory(const RankShape& shape, const BackendShape& backend);

// Bytes of one activation slot (one micro-batch in flight), as Model::activation_bytes counts it.
int64_t ActivationSlotBytes(const RankShape& shape, const BackendShape& backend);

// Bytes the first activation slot grows by when forward-only passes (evaluation) run through it
// MoE blocks its training passes do not, so that under expert parallelism their received rows'
// buffers grow there too; 0 when the job does not evaluate.
int64_t EvaluationSlotBytes(const RankShape& shape, const BackendShape& backend);

// Bytes of ring attention's buffers (ContextParallelOps::scratch_bytes), held once per rank and
// shared by every layer and micro-batch; 0 without context parallelism. With n = micro ·
// seq_len / cp local rows and kv = n · 2 · (kv_heads / tp) · head_dim elements of keys and
// values: five buffers of kv (in hand, arriving, two gradients, the gradient arriving) and one
// partial result of n/2 · (heads / tp) · head_dim, at the activation type, and its log-sum-exp
// of n/2 · (heads / tp) floats.
int64_t RingBufferBytes(const RankShape& shape, const BackendShape& backend);

// The width the chunked cross-entropy runs the LM head at (worker::Model's padded head): the
// rank's vocabulary, rounded up to the backend's logits_vocab_multiple without tensor
// parallelism.
int64_t PaddedHeadVocab(const RankShape& shape, const BackendShape& backend);
// Bytes of the padded head's weight and gradient copies (fp32), held once by the last stage
// when padding applies; 0 otherwise.
int64_t PaddedHeadBytes(const RankShape& shape, const BackendShape& backend);

// Bytes of the converted copies of the blocks' matmul weights a backend with bf16 activations
// keeps (Backend::KeepWeightCopy), at the activation type; 0 with fp32 activations or under
// ZeRO-3 (whose gathers reuse memory, so nothing is kept).
int64_t KeptWeightBytes(const RankShape& shape, const BackendShape& backend);

// Activation slots the rank keeps: 1 without pipelining, else what the stage's schedule
// holds at once (worker::ActivationSlots).
int ActivationSlots(const RankShape& shape);

// The peak bytes of ZeRO's transient buffers over one optimizer step.
int64_t TransientPeakBytes(const RankShape& shape);

}  // namespace trainyard::planner

#endif  // TRAINYARD_PLANNER_MEMORY_MODEL_H_
