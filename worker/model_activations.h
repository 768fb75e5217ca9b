// The activation memory of a Model (worker/model.h): what one micro-batch keeps between its
// forward and backward passes, and the backward's scratch; and the scoped hold of a parameter
// group. Private to the model's sources.
#ifndef TRAINYARD_WORKER_MODEL_ACTIVATIONS_H_
#define TRAINYARD_WORKER_MODEL_ACTIVATIONS_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "common/status.h"
#include "worker/backend.h"
#include "worker/buffer.h"
#include "worker/model.h"
#include "worker/moe_routing.h"

namespace trainyard::worker {

// Saved activations of one transformer block for one micro-batch (N = b·t rows).
// Activations are Buffer<Act> (the backend's activation type); statistics are fp32.
struct Model::LayerActivations {
  Buffer<Act> ln1;                   // [N, C]
  Buffer<float> ln1_mean, ln1_rstd;  // [N], [N]
  Buffer<Act> qkv;                   // [N, qkv_width], after RoPE
  // qk_norm (worker/head_norm.h): q and k before their norms, and the norms' statistics.
  Buffer<Act> qk_pre;     // [N, heads·d] then [N, kv_heads·d]
  Buffer<float> qk_rstd;  // [N·heads] then [N·kv_heads]
  // latent_attention (worker/latent_attention.h): the query latent before and after its norm
  // [N, q_rank] (q_rank > 0) and the norm's statistics [N]; the key/value latent likewise.
  Buffer<Act> latent_q, latent_q_normed, latent_kv, latent_kv_normed;
  Buffer<float> latent_q_rstd, latent_kv_rstd;
  Buffer<Act> att;                   // [N, heads·dv]
  Buffer<float> lse;                 // [b, heads, t]
  Buffer<Act> mid;                   // [N, C]: the residual stream after attention
  Buffer<Act> ln2;                   // [N, C]
  Buffer<float> ln2_mean, ln2_rstd;  // [N], [N]
  // The MLP's (an MoE block's shared experts'; empty without them), ffn its hidden size here:
  Buffer<Act> fc;   // [N, ffn] (GPT-2) or [N, 2·ffn] (gate, up)
  Buffer<Act> act;  // [N, ffn]
  // Sequence parallelism: the norms' outputs on this rank's rows, before they are gathered.
  Buffer<Act> ln1_local, ln2_local;
  // post_norms: the attention's and the MLP's outputs before their norms [N / tp under sequence
  // parallelism, C], and the norms' statistics.
  Buffer<Act> attn_out, mlp_out;
  Buffer<float> attn_post_rstd, mlp_post_rstd;
  // An MoE block: the router's logits and decisions, and its experts' rows (at most N·top_k:
  // dropless), expert by expert (worker/moe_routing.h).
  struct Experts {
    Buffer<float> logits;              // [N, E], fp32
    Buffer<float> shared_gate;         // shared_gate: [N], each row's sigmoid(x · g), fp32
    MoeRouting routing;                // host
    Buffer<int32_t> source, slot;      // [N·K]: routing.source (kept rows), routing.slot
    Buffer<float> row_weight, weight;  // [N·K]: routing.row_weight, routing.weight
    Buffer<Act> in, fc, act, out;      // [N·K, C], [N·K, fc], [N·K, ffn], [N·K, C]
    // Expert parallelism: the R rows this rank's experts received, expert by expert, with their
    // hidden activations (`fc` and `act` then serve only without it), and the exchange's shape.
    Buffer<Act> expert_in, expert_fc, expert_act;  // [R, C], [R, fc], [R, ffn]
    Buffer<int32_t> to_experts, from_experts;  // [R]: expert-major ← rank-major rows, and back
    std::vector<int64_t> send_counts, recv_counts;  // rows to and from each rank of the group
    std::vector<int64_t> expert_offsets;            // [E/ep + 1]: each local expert's rows
  };
  Experts moe;
};

struct Model::Activations {
  int b = 0, t = 0;
  int layers_held = 0;  // blocks whose activations the slot holds (a chunk's)
  Buffer<int32_t> inputs, targets;
  // model.document_token: each row's document's first position in its sequence [N].
  Buffer<int32_t> doc_starts;
  // Tensor parallelism: token ids relative to this rank's vocabulary shard (−1: another shard's).
  Buffer<int32_t> local_inputs, local_targets;
  // The vocabulary-parallel loss: this rank's [chunk, 3] statistics, the group's gathered
  // [tp, chunk, 3], and the rows' log-sum-exp [chunk].
  Buffer<float> ce_stats, ce_gathered, ce_lse;
  std::vector<Buffer<Act>> resid;        // layers + 1 of [N, C]: the input of each block
  std::vector<LayerActivations> layers;  // one per block, or a single one when recomputing
  Buffer<Act> lnf;                       // final norm
  Buffer<float> lnf_mean, lnf_rstd;
  Buffer<Act> tmp;     // [N, C]: a projection's output before the residual add
  Buffer<Act> logits;  // [chunk rows, vocab]
  // Gradients flowing backward.
  Buffer<Act> dx, dln, datt, dqkv, dfc, dact, dlnf;
  // latent_attention: the projections' scratch (LatentShape::scratch()).
  Buffer<Act> latent_scratch;
  // Sequence parallelism: local-row and full-row counterparts.
  Buffer<Act> lnf_local, tmp_local, dx_full, dln_local, dlnf_local;
  // post_norms: the gradient at a branch's output, this rank's rows [N / tp, C].
  Buffer<Act> dpost;
  // residual_multiplier: a branch's output gradient, the multiplier times dx [N / tp, C].
  Buffer<Act> dscaled;
  // [4, width]: two norms' weight and bias gradients ([8, width]: four norms' with post_norms)
  Buffer<float> norm_scratch;
  // qk_norm: the head norms' scratch [2·N·heads·d] and their weights' gradients, q's then k's
  // ([2, d], or with the norms over the whole projection [(heads + kv_heads)·d]; the heads here
  // are some of the block's: summed over the tensor-parallel group).
  Buffer<Act> head_norm_scratch;
  Buffer<float> head_norm_grads;
  // Norms over the whole projection split by tensor parallelism: each row's gradient dot [N].
  Buffer<float> head_norm_dots;
  // A split backward (ZB's B and W passes): what each block's weight pass needs besides the
  // saved activations, from the input-gradient pass: the gradients at the outputs of its four
  // linears (full rows) and its norms' weight and bias gradients; on the first stage the gradient
  // at the embedding's output (full rows).
  struct DeferredGrads {
    Buffer<Act> mlp_proj_dy, fc_dy, proj_dy, qkv_dy;
    // [4, width]: ln1 weight, bias, ln2 weight, bias; with post_norms [8, width], then the
    // attention's and the MLP's post norms' weights (each followed by an unused width).
    Buffer<float> norms;
    Buffer<float> head_norms;  // qk_norm: the query and key norms' weight gradients
  };
  std::vector<DeferredGrads> deferred;
  Buffer<Act> embedding_dy;
  // MoE blocks' backward: the experts' output and input gradients [N·K, C], the combine
  // weights' gradients [N·K] and the router logits' [N, E].
  Buffer<Act> moe_dout, moe_din;
  Buffer<float> moe_dweight, moe_dlogits;
  // shared_gate: the gradient at the shared experts' (ungated) output [N, C], and the gate
  // logits' [N].
  Buffer<Act> moe_dshared;
  Buffer<float> moe_dgate;
  // Expert parallelism's scratch, [R, C] each (grown to the most rows seen): rows as exchanged
  // (rank by rank) and as the experts produce them.
  Buffer<Act> moe_exchange, moe_expert_rows;
  float grad_scale = 0;  // the micro-batch's, from StageForward (scales MoE aux losses)
};

// Holds one parameter group acquired from the source for a scope; records its pointer so that
// P() can find it.
class Model::Hold {
 public:
  static absl::StatusOr<std::unique_ptr<Hold>> Acquire(Model* model, int group) {
    TY_ASSIGN_OR_RETURN(const float* p, model->source_->Acquire(group));
    model->group_params_[group] = p;
    model->KeepWeightCopies(group, p);
    return std::unique_ptr<Hold>(new Hold(model, group));
  }
  ~Hold() {
    model_->source_->Release(group_);
    if (--model_->hold_counts_[group_] == 0) model_->group_params_[group_] = nullptr;
  }

 private:
  Hold(Model* model, int group) : model_(model), group_(group) { ++model_->hold_counts_[group]; }
  Model* model_;
  int group_;
};

}  // namespace trainyard::worker

#endif  // TRAINYARD_WORKER_MODEL_ACTIVATIONS_H_
