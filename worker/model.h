// The decoder-only transformer with an explicit forward and backward per layer (no autograd).
//
// One Model runs the layers its rank holds, with parameters and gradients from a ParamSource
// (group by group, in ParameterLayout order: a rank's sharded parameters, or a LocalModel's flat
// buffers, worker/local_model.h), and owns the activation memory of the micro-batches in flight.
// Not thread-safe: one training loop drives it; its Backend may parallelise inside each
// operation.
#ifndef TRAINYARD_WORKER_MODEL_H_
#define TRAINYARD_WORKER_MODEL_H_

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "config/model_config.h"
#include "worker/backend.h"
#include "worker/buffer.h"
#include "worker/context_parallel.h"
#include "worker/head_norm.h"
#include "worker/moe_routing.h"
#include "worker/parallel/communicator.h"
#include "worker/param_source.h"
#include "worker/shape/parameters.h"
#include "worker/tensor_parallel.h"

namespace trainyard::worker {

// Which of a pipeline rank's model chunks a stage pass runs, and the activation slot of its
// micro-batch (slots are the rank's, shared by its chunks: worker/shape/schedule.h).
struct StageSlot {
  int chunk = 0;
  int slot = 0;
};

// How a model is split over its rank's groups (the defaults: the whole model on one rank). The
// groups must outlive the model.
struct ModelSharding {
  // Tensor parallelism (size > 1): attention split by heads (key/value heads too), the MLP
  // column- then row-parallel, embedding and LM head split by vocabulary.
  parallel::Communicator* tp = nullptr;
  // Context parallelism (size > 1): each sequence split over the group, the head-tail way, with
  // ring attention between its shares (worker/context_parallel.h).
  parallel::Communicator* cp = nullptr;
  // Expert parallelism (size > 1): the routed experts of every MoE layer split over the group,
  // tokens carried to their experts' ranks and back by all-to-all.
  parallel::Communicator* ep = nullptr;
  // The layers this pipeline rank holds (one stage, or an interleaved schedule's model chunks,
  // all of the same number of layers; the source uses ParameterLayout(config, tp, chunks)).
  std::vector<PipelineStage> chunks = {PipelineStage{}};
  // With tp > 1, the residual stream between the tensor-parallel regions is split by rows too:
  // the norms run on n / tp rows, gathered before the column-parallel matmuls and
  // reduce-scattered after the row-parallel ones.
  bool sequence_parallel = false;
  // Zero-bubble schedules: StageBackward computes the input gradient only, and
  // StageWeightGradients the blocks' and the embedding's weight gradients later.
  bool split_backward = false;
};

class Model {
 public:
  // `backend` must outlive the model. Fails with INVALID_ARGUMENT on an inconsistent config, or
  // a split backward with config.recompute (the weight pass needs every block's activations).
  // Parameters and gradients come from `source` (which must outlive the model and use this
  // model's layout, e.g. a data-parallel sharded source).
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Model>> Create(
      const config::ModelConfig& config, Backend* backend, ParamSource* source,
      ModelSharding sharding = {});
  ~Model();

  const config::ModelConfig& config() const { return config_; }
  const ParameterLayout& layout() const { return layout_; }
  int64_t num_params() const { return layout_.total(); }
  // Bytes of activation memory held (every micro-batch slot): every buffer a slot allocates,
  // sequence parallelism's local- and full-row copies and norm scratch included, and ring
  // attention's buffers (ring_bytes); activations at the backend's activation type, statistics
  // as fp32, token ids as int32. Also, where the backend converts weights for its GEMMs (bf16
  // activations) and the source's parameters stay put (no ZeRO-3), the converted copies of the
  // blocks' matmul weights and biases it keeps (IsBlockLinearParam), at the activation type.
  int64_t activation_bytes() const;
  // Time spent in tensor-parallel collectives (all exposed: the next operation needs them).
  double tp_comm_seconds() const { return tp_.seconds(); }
  // Time spent waiting for ring attention's transfers (what the attention did not hide) and in
  // MoE routing's gathers over the context-parallel group.
  double cp_comm_seconds() const { return cp_.seconds() + cp_routing_seconds_; }
  // Time spent in expert parallelism's collectives of training passes (the counts' all-gather
  // and the rows' all-to-alls; all exposed: nothing computes beside them).
  double ep_comm_seconds() const { return ep_seconds_; }
  // Bytes of ring attention's buffers (shared by every layer and micro-batch; 0 without context
  // parallelism).
  int64_t ring_bytes() const { return cp_.scratch_bytes(); }

  // Under context parallelism every call below takes whole sequences (t tokens each) and works on
  // this rank's share of them; sums (the losses) are over that share, activations ([b·t, width]
  // and the like) hold its b·t / cp rows.

  // One micro-batch of `b` sequences of `t` tokens (inputs and targets are host arrays of b·t
  // tokens). Accumulates the gradient of grad_scale · Σ cross-entropy into grads() and returns
  // Σ cross-entropy over the b·t positions, which it reads at once (a training loop that runs
  // several micro-batches calls StageForward and StageBackward, and TakeTrainingLoss once).
  // INVALID_ARGUMENT for t > max_seq or a token outside the vocabulary.
  [[nodiscard]] absl::StatusOr<double> ForwardBackward(const int32_t* inputs,
                                                       const int32_t* targets, int b, int t,
                                                       float grad_scale);
  // Σ cross-entropy without gradients.
  [[nodiscard]] absl::StatusOr<double> Loss(const int32_t* inputs, const int32_t* targets, int b,
                                            int t);
  // One model chunk's share of a micro-batch (at.chunk), keeping its activations in slot at.slot
  // (one slot per micro-batch and chunk in flight). Inputs and targets are the micro-batch's
  // tokens (host); input_acts / output_acts are [b·t, width] device buffers from / for the
  // neighbouring virtual stages (ignored on the first / last one). The last virtual stage computes
  // the loss (Σ cross-entropy, added to what TakeTrainingLoss reads) and its whole backward in
  // StageForward; StageBackward then only hands on ∂loss/∂input. No pass waits for the device.
  [[nodiscard]] absl::Status StageForward(StageSlot at, const int32_t* inputs,
                                          const int32_t* targets, int b, int t,
                                          const Act* input_acts, float grad_scale,
                                          Act* output_acts);
  // doutput: ∂loss/∂(stage output) (ignored on the last stage); dinput receives ∂loss/∂(stage
  // input) (not on the first stage). With a split backward the blocks' and the embedding's
  // weight gradients are left to StageWeightGradients (the last stage's final norm and LM head
  // still get theirs in StageForward).
  [[nodiscard]] absl::Status StageBackward(StageSlot at, const Act* doutput, Act* dinput);
  // The weight pass of a split backward for the micro-batch in `at`, after its StageBackward:
  // the blocks' weight and bias gradients and the norms', then the embedding's on the first
  // stage. Uses no parameters. FAILED_PRECONDITION without split_backward.
  [[nodiscard]] absl::Status StageWeightGradients(StageSlot at);
  // Forward only through `chunk`: the last virtual stage returns Σ cross-entropy, the others 0
  // and fill output_acts.
  [[nodiscard]] absl::StatusOr<double> StageLoss(int chunk, const int32_t* inputs,
                                                 const int32_t* targets, int b, int t,
                                                 const Act* input_acts, Act* output_acts);

  // Full logits [b, t, vocab] into a host array (tests and inference). FAILED_PRECONDITION under
  // context parallelism.
  [[nodiscard]] absl::Status Logits(const int32_t* inputs, int b, int t, float* host_logits);

  // Σ cross-entropy of the training passes (StageForward) since the last call: the step's one
  // read of its loss, which waits for the device (and returns its first error instead).
  [[nodiscard]] absl::StatusOr<double> TakeTrainingLoss() { return train_loss_->Take(); }
  // Σ lse² over the training passes' rows since the last call (lse a row's log-sum-exp of the
  // logits), with model.z_loss_coeff > 0; 0 without it. Read after TakeTrainingLoss.
  [[nodiscard]] absl::StatusOr<double> TakeLogitSquares() { return train_lse_squares_->Take(); }

  // Device seconds of the training passes (StageForward, StageBackward, StageWeightGradients)
  // since the last call: the loss and its gradient count as forward, everything after them as
  // backward. Each pass is timed from where the device begins it to where it ends it (events on
  // a GPU, read here, so that no pass waits for the device). Evaluations are not counted.
  struct PhaseSeconds {
    double forward = 0;
    double backward = 0;
  };
  [[nodiscard]] absl::StatusOr<PhaseSeconds> TakePhaseSeconds();

  // Routing of the MoE layers this rank holds (config::MoeConfig), summed over the training
  // passes (StageForward) since the last call: one entry per layer, in layer order.
  struct MoeLayerStats {
    int layer = 0;
    std::vector<int64_t> picks;  // per expert, before capacity drops
    int64_t dropped = 0;
    double aux_loss = 0;  // Σ over micro-batches of the layer's aux loss · its tokens
    int64_t tokens = 0;
    double bias_spread = 0;  // max − min of the selection bias it last routed with
    // Expert parallelism's all-to-alls of the layer (forward, backward and recomputation): bytes
    // this rank sent to others, and seconds it spent in them (in TrainResult::moe_routing: the
    // data-parallel ranks' mean).
    int64_t exchange_bytes = 0;
    double exchange_seconds = 0;
    double z_loss = 0;  // Σ over micro-batches of the layer's router z-loss · its tokens
  };
  std::vector<MoeLayerStats> TakeMoeStats();

 private:
  struct LayerActivations;
  struct Activations;

  class Hold;
  // Registers the block matmul weights and biases of `group` (at `params`) with the backend to
  // keep converted, once per group; nothing unless kept_weight_bytes_ > 0.
  void KeepWeightCopies(int group, const float* params);
  int64_t kept_weight_bytes_ = 0;
  std::vector<bool> kept_groups_;
  std::vector<const float*> kept_weights_;  // registered, dropped with the model

  // This rank's share of the sharded dimensions (the whole model without tensor parallelism).
  struct LocalDims {
    int64_t heads, kv_heads, ffn, vocab, qkv_width, attn;
    int64_t vocab_begin;  // first token id of this rank's vocabulary shard
  };

  Model(const config::ModelConfig& config, Backend* backend, ParamSource* source,
        ModelSharding sharding);
  // The chunk the current pass runs.
  const PipelineStage& stage() const { return layout_.chunks()[chunk_]; }
  // Rows of the residual stream this rank holds for the current micro-batch.
  int64_t local_rows() const;
  [[nodiscard]] absl::Status ToFullRows(Act* local, Act* full, int64_t cols);
  [[nodiscard]] absl::Status SumToLocalRows(Act* full, Act* local, int64_t cols);
  // Where a norm's backward writes its weight/bias gradients: straight into the gradients, or,
  // under sequence parallelism, into scratch slot `slot` (of two) to be summed over the group,
  // or with a split backward into the block's deferred scratch for its weight pass.
  struct NormGrads {
    float* weight;
    float* bias;
  };
  NormGrads NormGradTargets(int group, int64_t weight, int64_t bias, int slot);
  static std::vector<std::pair<int64_t, int64_t>> BlockNorms(const BlockOffsets& o);
  // Norm's backward over this rank's residual-stream rows: dx += the gradient at x from dout,
  // the weight's (and bias's) gradients into `grads`; without a weight (a block's input norm
  // under pre_norms false), dx += dout.
  void NormBackward(Act* dx, const NormGrads& grads, const Act* dout, const Act* x, const float* w,
                    const float* mean, const float* rstd);
  // Adds `scratch` (the listed norms' weight and bias gradients, in slot order) to their
  // gradients, summed over the tensor-parallel group first under
  // sequence parallelism.
  [[nodiscard]] absl::Status AddNormGrads(int group, float* scratch,
                                          const std::vector<std::pair<int64_t, int64_t>>& norms);
  // qk_norm: the query and key norms over `rows` rows of this rank's heads; their backward for
  // block `layer` (into `deferred`, a split backward's [2, d], else into the gradients); and the
  // addition of such weight gradients to the gradients of the block's group.
  HeadNormShape HeadNorms(int64_t rows) const;
  // A sum over the tensor-parallel group (the whole-projection norms' sums and dots).
  GroupSum TpSum();
  [[nodiscard]] absl::Status HeadNormsBackward(int layer, const LayerActivations& la,
                                               float* deferred);
  void AddHeadNormGrads(int group, const BlockOffsets& o, const float* grads);
  int tp_size() const { return tp_.size(); }
  int tp_rank() const { return tp_.rank(); }
  [[nodiscard]] absl::Status VocabParallelLoss(float grad_scale, bool with_grad, DeviceSum* loss);
  [[nodiscard]] absl::Status Prepare(const int32_t* inputs, const int32_t* targets, int b, int t);
  // The micro-batch's token ids onto the device (this rank's share of them under context
  // parallelism, in its row order), with their vocabulary-shard forms under tensor parallelism.
  void UploadTokens(const int32_t* inputs, const int32_t* targets);
  // The embedding and its weight gradients, by local half under context parallelism (each half
  // its own positions).
  void EmbeddingLookup(Act* out, const int32_t* tokens, const float* wte, const float* wpe);
  void AllocateLatent(LayerActivations& la, int64_t n);
  // model.latent_attention: block `layer`'s packed qkv from its attention input, or backward its
  // input's gradient (into acts_->dln) and its projections' weight gradients from acts_->dqkv.
  [[nodiscard]] absl::Status LatentProject(int layer, LayerActivations& la, bool backward);
  // The backward of block `layer`'s projection to the packed qkv row (acts_->dqkv holds the
  // row's gradient): its input's gradient into acts_->dln, and its weights' gradients, or with a
  // split backward the row's gradient kept for the weight pass (latent attention's are not
  // deferred).
  [[nodiscard]] absl::Status QkvBackward(int layer, LayerActivations& la);
  // RoPE on the query and key heads of `qkv` (direction: forward or its inverse).
  void Rotate(int layer, Act* qkv, bool backward);
  // The attention of block `layer` over the micro-batch's local rows.
  AttentionShape AttentionOf(int layer) const;
  void EnsureActivations(int b, int t);
  // Runs embedding and every block, then the final norm (output in acts_->lnf); on return the
  // final group stays acquired (released by the caller through `final_hold`).
  [[nodiscard]] absl::Status Forward(bool keep_layer_activations, std::unique_ptr<Hold>* final_hold,
                                     const Act* input_acts);
  [[nodiscard]] absl::Status BackwardBlocks(Act* dx);
  void SelectSlot(StageSlot at);
  // A residual-stream row block not yet added up: a + b, written by the norm that reads it (the
  // add fused into that norm's pass) instead of a pass of its own.
  struct PendingSum {
    const Act* a = nullptr;
    const Act* b = nullptr;
    bool pending() const { return a != nullptr; }
  };
  // One block forward. A pending `residual` on entry is the block's input (its first norm
  // writes it to the residual stream; else the input is there already); on return it holds the
  // block's output, pending, for the next norm (or for the caller to add).
  [[nodiscard]] absl::Status BlockForward(int layer, LayerActivations& a, PendingSum& residual);
  // The family's norm of the residual-stream rows x into out (LayerNorm's statistics in mean and
  // rstd, RMSNorm's in rstd), where a pending sum is x's value: the fused add then writes it to x.
  // Without a weight (a block's input norm under pre_norms false) only the pending sum is
  // written: the branch reads x itself, and `out` must be x.
  void Norm(Act* out, float* mean, float* rstd, Act* x, const PendingSum& pending, const float* w,
            const float* b);
  // A branch's output rows on this rank as they join the residual stream, in place: with
  // post_norms normed (weight w; the values before it and the statistics saved for the
  // backward), then times residual_multiplier. Without either, nothing.
  void PostNorm(const float* w, Act* saved, float* rstd, Act* branch);
  // Floats of a block's norm-gradient scratch: a weight and a bias gradient for each of its norms
  // (ModelConfig::norms_per_block), in BlockNorms' order.
  int64_t NormScratch() const { return 2 * int64_t{config_.norms_per_block()} * config_.width; }
  // The gradient at a branch's output, on full rows (dx's, gathered under sequence parallelism),
  // from dx, the gradient at its (normed, with post_norms) value joining the residual stream:
  // times residual_multiplier (into acts_->dscaled) and with post_norms through its norm's
  // backward into acts_->dpost, the weight's gradient accumulated into dw.
  [[nodiscard]] absl::StatusOr<Act*> BranchGradient(const float* w, float* dw, const Act* saved,
                                                    const float* rstd, Act* dx);
  // The full rows block `layer`'s attention and its MLP read: their norms' outputs (la.ln1,
  // la.ln2), or without pre_norms the residual stream's rows themselves (the block's input and
  // la.mid; la.ln1 and la.ln2 gathered from them under sequence parallelism).
  const Act* AttentionInput(const LayerActivations& la, int layer) const;
  const Act* MlpInput(const LayerActivations& la) const;
  // The dense MLP (or an MoE block's shared experts) on MlpInput, into acts_->tmp (partial sums
  // under tensor parallelism; the proj bias only without it).
  void MlpForward(int layer, LayerActivations& la);
  [[nodiscard]] absl::Status SharedGateBackward(int layer, const LayerActivations& la);
  // An MoE block's routed experts on MlpInput, added into acts_->tmp (overwritten when
  // `accumulate` is false), partial sums under tensor parallelism.
  [[nodiscard]] absl::Status MoeForward(int layer, LayerActivations& la, bool accumulate);
  // Its backward from dy = ∂loss/∂(MLP output) (full rows): the experts' and the router's weight
  // gradients, and ∂loss/∂ln2 into acts_->dln (added when `accumulate`).
  [[nodiscard]] absl::Status MoeBackward(int layer, LayerActivations& la, const Act* dy,
                                         bool accumulate);
  // The routed experts this rank holds, each on its rows [offsets[j], offsets[j + 1]) (j: the
  // rank's j-th expert), and their backward (weight gradients accumulated, din overwritten).
  void RunExperts(int layer, std::span<const int64_t> offsets, const Act* in, Act* hidden, Act* act,
                  Act* out);
  void RunExpertsBackward(int layer, std::span<const int64_t> offsets, const Act* dout,
                          const Act* in, const Act* hidden, const Act* act, Act* din);
  ExpertMlp ExpertsOf(int layer, std::span<const int64_t> offsets);
  // The routing of this rank's acts_->b · acts_->t rows of router logits [rows, E] (`bias`: the
  // selection bias, or empty). Under context parallelism the capacity's token order and the aux
  // loss are the micro-batch's, from counts gathered over the cp group.
  [[nodiscard]] absl::StatusOr<MoeRouting> RouteTokens(const float* logits,
                                                       std::span<const float> bias);
  // Expert parallelism: the exchange's counts and orders for la's routing (an all-gather of the
  // counts per expert), and one all-to-all of rows, out to the experts (`forward`) or back.
  [[nodiscard]] absl::Status PlanExchange(LayerActivations& la);
  [[nodiscard]] absl::Status ExchangeRows(int layer, const LayerActivations& la, bool forward,
                                          const Act* in, Act* out, int phase);
  // Sizes a saved-activation slot's MLP buffers for every block it serves.
  struct MlpSizes {
    int64_t fc = 0, ffn = 0;  // the dense or shared MLP's, this rank's share
    bool moe = false;
  };
  MlpSizes MlpSizesOf(int saved_layer) const;
  // A block's norms' saved outputs, inputs and statistics (n rows, nr of them this rank's).
  void AllocateNorms(LayerActivations& la, int64_t n, int64_t nr);
  void AllocateExperts(LayerActivations& la, int64_t n);
  void AllocateDeferred(Activations& a, int64_t n);
  // The routing statistics of MoE layer `layer` (null if this rank does not hold it).
  MoeLayerStats* StatsOf(int layer);
  void RecordRouting(int layer, const MoeRouting& routing, std::span<const float> bias);
  [[nodiscard]] absl::Status BlockBackward(int layer, LayerActivations& a, Act* dx);
  [[nodiscard]] absl::Status BlockWeightGradients(int layer);
  // The embedding's weight gradients from dy = ∂loss/∂(embedding output), full rows.
  [[nodiscard]] absl::Status EmbeddingBackward(const Act* dy);
  // The final norm of the stage's output (given as a pending sum when it is one).
  [[nodiscard]] absl::Status FinalNorm(const PendingSum& residual);
  [[nodiscard]] absl::Status FinalNormBackward(Act* dx);
  // Cross-entropy over the final hidden states, chunk by chunk, added to *loss; with gradients it
  // also writes d(lnf) and accumulates the LM head's weight gradient.
  [[nodiscard]] absl::Status ChunkedLoss(float grad_scale, bool with_grad, DeviceSum* loss);

  // Parameter / gradient of the tensor at flat `offset` in `group` (null for offset -1). Valid
  // while the group is held / after Gradients(group) this pass.
  const float* P(int group, int64_t offset) const;
  // A row-parallel layer's bias at `offset`: its output is summed over the tensor-parallel group,
  // which takes the bias once, from rank 0 (null on the others, and where there is none).
  const float* RowParallelBias(int group, int64_t offset) const {
    return tp_rank() == 0 ? P(group, offset) : nullptr;
  }
  float* G(int group, int64_t offset) const;

  // The chunked cross-entropy's LM head with its width rounded up to the backend's
  // logits_vocab_multiple (a whole vocabulary only: not under tensor parallelism). The head's
  // rows are copied in above zero rows for each loss pass and its gradient accumulated there,
  // the padding's gradient staying zero (its logits are masked out of the softmax). Checkpoints,
  // reports and the planner's parameters never see it.
  struct PaddedHead {
    int64_t vocab = 0;           // the width the GEMMs run at (dims_.vocab when nothing is padded)
    Buffer<float> weight, grad;  // [vocab, width]; empty when nothing is padded
  };
  // Points `head` (and `dhead`, when not null) at the padded copies, filled from them.
  void PadHead(const float** head, float** dhead);

  config::ModelConfig config_;
  TensorParallelOps tp_;        // every collective of the tensor-parallel group
  ContextParallelOps cp_;       // the sequence split and ring attention
  parallel::Communicator* ep_;  // expert parallelism's group (null without it)
  bool sp_;                     // sequence parallelism
  bool split_;                  // a split backward (StageWeightGradients)
  ParameterLayout layout_;
  LocalDims dims_;
  Backend* backend_;
  ParamSource* source_;
  std::unique_ptr<DeviceTimer> forward_timer_, backward_timer_;  // TakePhaseSeconds
  std::unique_ptr<DeviceSum> train_loss_;                        // TakeTrainingLoss
  std::unique_ptr<DeviceSum> train_lse_squares_;                 // TakeLogitSquares
  std::unique_ptr<DeviceSum> eval_loss_;                         // Loss
  PaddedHead head_;
  std::vector<const float*> group_params_;  // per group, while held
  std::vector<float*> group_grads_;         // per group, once requested this pass
  std::vector<int> hold_counts_;            // live Holds per group
  // Activation memory per in-flight micro-batch (a pipeline stage keeps several); acts_ is the
  // one the current call uses.
  std::vector<std::unique_ptr<Activations>> slots_;
  int current_slot_ = 0;
  bool training_pass_ = false;     // StageForward's: MoE routing is counted
  double ep_seconds_ = 0;          // ep_comm_seconds()
  double cp_routing_seconds_ = 0;  // of cp_comm_seconds()
  bool recomputing_ = false;       // a recomputed forward in the backward (counted already)
  std::vector<MoeLayerStats> moe_stats_;
  int chunk_ = 0;
  Activations* acts_ = nullptr;
};

}  // namespace trainyard::worker

#endif  // TRAINYARD_WORKER_MODEL_H_
