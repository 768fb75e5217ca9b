// The bytes one rank sends per optimizer step on each mesh axis, collective by collective, as
// the engine issues them and its communicators count them (CommStats: bytes sent by this rank).
// A ring all-reduce of c elements over n ranks sends 2c minus this rank's chunk and the next
// rank's (chunk i of the ring is [c·i/n, c·(i+1)/n)); a reduce-scatter or all-gather of c elements
// per rank sends (n−1)·c; a send sends its buffer. Sources:
//
// - dp (worker/parallel/sharded_params.cc), over the dp · cp ranks that hold the same parameters:
//   ZeRO-0/1 all-reduce the gradients once per step in buckets; ZeRO-2/3 reduce-scatter every
//   group every micro-batch; ZeRO-1/2 all-gather the updated parameters; ZeRO-3 all-gathers every
//   group for the forward pass and each block again for the backward pass (a tied head once
//   more);
// - tp (worker/model.cc): per block two all-reduces forward and two backward (recomputation
//   repeats the forward's), or under sequence parallelism all-gathers and reduce-scatters of the
//   rank's rows and the norms' gradient sums; the embedding, the final norm and the
//   vocabulary-parallel loss;
// - pp (worker/parallel/pipeline.cc): one activation forward and one gradient back per
//   micro-batch; the tied embedding's gradient sum between the first and last stages is counted
//   on this axis too (tied_bytes);
// - cp (worker/context_parallel.cc): ring attention, per block and micro-batch: the keys and
//   values sent on cp − 1 times forward (again when recomputed) and cp − 1 times backward, their
//   gradients cp times; no scalar sums;
// - every axis but cp: the training loop's scalar sums (loss, gradient norm, the stop/checkpoint
//   agreement), each a 2-float all-reduce per value;
// - ep (worker/model_moe.cc): the all-to-alls that carry tokens to their experts' ranks and back
//   (ExpertParallelTraffic); under it the routed experts' groups are reduced and sharded on the
//   dp / ep ranks holding the same experts, counted on the dp axis;
// - mixture of experts (worker/model_moe.cc, worker/trainer.cc): on tp, each MoE block's combine
//   weights' gradients, an fp32 all-reduce of micro · seq_len · top_k per micro-batch (dropless;
//   a capacity that drops picks sends less); on dp and pp, the step's routing statistics, one sum
//   of MoeStepValues per step.
//
// Tensor-, pipeline- and context-parallel activations are the rank's micro · seq_len / cp rows
// of each micro-batch (/ tp under sequence parallelism). Training steps only: evaluation
// (training.eval_every) runs forward passes on the same groups, which the figures leave out.
//
// Each collective also carries its latency steps, whether it can hide behind compute, and the
// thread hand-overs it costs, for the α–β time model (planner.h).
//
// Threading: plain functions.
#ifndef TRAINYARD_PLANNER_TRAFFIC_MODEL_H_
#define TRAINYARD_PLANNER_TRAFFIC_MODEL_H_

#include <array>
#include <cstdint>
#include <vector>

#include "planner/rank_shape.h"
#include "worker/shape/collectives.h"

namespace trainyard::planner {

using worker::parallel::CollectiveKind;

// When a collective runs, for the overlap model.
enum class Phase {
  kExposed,   // nothing runs beside it
  kForward,   // ZeRO-3 prefetch: hides behind the forward pass
  kBackward,  // gradient reduction: hides behind the backward pass
};

struct Collective {
  CollectiveKind kind;
  int64_t bytes = 0;    // this rank sends
  int64_t latency = 0;  // messages in sequence (ring steps): the α term's count
  Phase phase = Phase::kExposed;
  int64_t repeat = 1;  // identical calls per step
  // Thread wake-ups per call besides its messages, for collectives the communication thread runs
  // (data parallelism): 1 when it wakes that thread, 1 more when the training thread waits for it
  // and is woken; 1 for one queued behind another of a batch that is waited for once (the peer's
  // communication thread, asleep since the previous exchange, is woken).
  int64_t hand_overs = 0;
  // The training loop's scalar sums at the step's end, which every rank waits for.
  bool step_end = false;
};

// Byte totals by kind (bytes_sent in worker/trainer.h's order).
using KindBytes = std::array<int64_t, static_cast<int>(CollectiveKind::kCount)>;
KindBytes TotalByKind(const std::vector<Collective>& collectives);
int64_t TotalBytes(const std::vector<Collective>& collectives);

// How the training loop talks besides the model: engine knobs the counts depend on.
struct LoopOptions {
  int64_t bucket_bytes = int64_t{1} << 20;  // RankContext::bucket_bytes
  // Values in the per-step agreement of a multi-rank job: 1 standalone, 3 under a coordinator.
  int agreement_values = 3;
};

// One rank's collectives per optimizer step on each axis. `rank` is the rank's index in that
// axis's group (it decides which ring chunks it sends; they differ by at most an element each);
// for the data-parallel group of dp · cp ranks, DataGroupRank (rank_shape.h).
std::vector<Collective> DataParallelTraffic(const RankShape& s, const LoopOptions& loop, int rank);
std::vector<Collective> TensorParallelTraffic(const RankShape& s, const BackendShape& backend,
                                              const LoopOptions& loop, int rank);
std::vector<Collective> PipelineTraffic(const RankShape& s, const BackendShape& backend,
                                        const LoopOptions& loop, int rank);

// Ring attention's transfers per optimizer step (every rank of the ring sends as much): per
// block and micro-batch, with kv = RingKeyValueElements, cp − 1 sends of kv forward (phase
// kForward; once more in the backward pass under model.recompute, phase kBackward), cp − 1 of kv
// and cp of the keys' and values' gradients (kv each) backward (kBackward); and per MoE block and
// forward pass (exposed) an all-gather of RoutingGatherFloats, MoE routing's counts. Empty for
// cp 1.
std::vector<Collective> ContextParallelTraffic(const RankShape& s, const BackendShape& backend);
// The fp32 values each rank contributes to MoE routing's all-gather over the cp group
// (Model::RouteTokens): its picks per expert in each of its 2 · micro chunks, and its sums of
// scores and its sum of the router z-loss's z² as float pairs, (2 · micro + 2) · experts + 2.
int64_t RoutingGatherFloats(const RankShape& s);
// The elements of one rank's keys and values that travel the ring: rows · 2 · (kv_heads / tp) ·
// head_dim, for the rank's rows = micro · seq_len / cp (all of them under sequence parallelism
// too: attention works on full rows).
int64_t RingKeyValueElements(const RankShape& s);

// Expert parallelism's transfers per optimizer step over the ep group (worker/model_moe.cc), as
// if routing were balanced (each expert takes an equal share of the picks; exact when every
// token picks every expert, top_k = experts): per MoE block and micro-batch, an all-gather of
// every rank's count per expert, then four all-to-alls of rows of width activations: to the
// experts and back in the forward pass, the output gradients to the experts and the input
// gradients back in the backward pass (the forward's two and its all-gather again under
// model.recompute), each sending ExchangedRows; under ZeRO-0 the experts' share of the gradient
// norm summed over the group. Empty for ep 1.
std::vector<Collective> ExpertParallelTraffic(const RankShape& s, const BackendShape& backend);
// The rows one all-to-all sends to the other ranks under balanced routing: the micro-batch's
// rows · top_k picks (dropless), (ep − 1) / ep of them (rounded down).
int64_t ExchangedRows(const RankShape& s);

// The sum of the tied token embedding's two copies' gradients, on the group of the first and
// the last stage (its own communicator, not the pipeline's), once per step.
std::vector<Collective> TiedEmbeddingTraffic(const RankShape& s);

// The model's tensor-parallel collectives for one micro-batch (forward and backward), without
// the training loop's scalars: what a Model with a tensor-parallel group of tp ranks sends.
std::vector<Collective> ModelTensorParallelTraffic(const RankShape& s, const BackendShape& backend,
                                                   int rank);

// The values of the training loop's per-step MoE sum (RankTrainer::MoeStep): per layer of the
// whole model, each expert's picks, the drops, the aux loss, the tokens, the bias spread, the
// all-to-all's bytes and seconds and the router z-loss (layers · (experts + 7)); 0 for a dense
// model.
int MoeStepValues(const config::ModelConfig& model);

// The values of the step's loss the training loop sums over the data-parallel and pipeline ranks
// (RankTrainer::OptimizerStep): the cross-entropy, and with model.z_loss_coeff > 0 the logits'
// Σ lse².
int LossValues(const config::ModelConfig& model);

// Elements rank `rank` sends in a ring all-reduce of `count` elements over `n` ranks.
int64_t RingAllReduceElements(int64_t count, int n, int rank);
// The latency steps of an all-reduce over `n` ranks: a ring's 2(n − 1); two ranks swap their
// buffers in one step (the same bytes).
int64_t AllReduceLatency(int n);

}  // namespace trainyard::planner

#endif  // TRAINYARD_PLANNER_TRAFFIC_MODEL_H_
