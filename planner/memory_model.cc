#include "planner/memory_model.h"

#include <algorithm>
#include <vector>

#include "worker/shape/latent_shape.h"
#include "worker/shape/schedule.h"

namespace trainyard::planner {
namespace {

// Replays the calls the model makes on its parameter source (worker/param_source.h) through
// ShardedParams' bookkeeping of transient buffers, sizes only. A reduced gradient's staging is
// freed at the next hand-over, as ShardedParams does (it waits there for a reduction that lags).
class TransientReplay {
 public:
  explicit TransientReplay(const RankShape& s)
      : s_(s),
        zero_(s.mesh.zero),
        gathered_(s.group_sizes.size(), false),
        gather_pending_(s.group_sizes.size(), false),
        holds_(s.group_sizes.size(), 0),
        staging_(s.group_sizes.size(), false) {}

  void Acquire(int g) {
    if (zero_ < 3) return;
    if (!gathered_[g]) Gather(g);
    gather_pending_[g] = false;
    ++holds_[g];
  }
  void Prefetch(int g) {
    if (zero_ < 3 || g < 0 || g >= static_cast<int>(gathered_.size())) return;
    if (!gathered_[g]) Gather(g);
  }
  void Release(int g) {
    if (zero_ < 3) return;
    if (--holds_[g] == 0 && !gather_pending_[g]) {
      gathered_[g] = false;
      Add(-Bytes(g));
    }
  }
  void Gradients(int g) {
    if (zero_ < 2 || staging_[g]) return;
    staging_[g] = true;
    Add(Bytes(g));
  }
  void Ready(int g) {
    if (zero_ < 2) return;
    FreeReduced();
    staging_[g] = false;
    pending_.push_back(Bytes(g));
  }
  // The optimizer step (ShardedParams::FinishGradients, FinishUpdate): waits for everything and
  // frees prefetched groups nobody holds.
  void FinishStep() {
    FreeReduced();
    for (size_t g = 0; g < gathered_.size(); ++g) {
      gather_pending_[g] = false;
      if (holds_[g] == 0 && gathered_[g]) {
        gathered_[g] = false;
        Add(-Bytes(static_cast<int>(g)));
      }
    }
  }
  int64_t peak() const { return peak_; }

 private:
  int64_t Bytes(int g) const { return 4 * s_.padded(g); }
  void Gather(int g) {
    gathered_[g] = true;
    gather_pending_[g] = true;
    Add(Bytes(g));
  }
  void FreeReduced() {
    for (int64_t bytes : pending_) Add(-bytes);
    pending_.clear();
  }
  void Add(int64_t delta) {
    now_ += delta;
    peak_ = std::max(peak_, now_);
  }

  const RankShape& s_;
  const int zero_;
  std::vector<bool> gathered_, gather_pending_;
  std::vector<int> holds_;
  std::vector<bool> staging_;
  std::vector<int64_t> pending_;
  int64_t now_ = 0, peak_ = 0;
};

int FinalGroup(const RankShape& s) { return static_cast<int>(s.group_sizes.size()) - 1; }

// Model::BlockForward of MoE block `l` past its attention: its routed experts' group,
// prefetched as the block starts, held for the experts' pass (Model::MoeForward).
void ReplayExpertsForward(const RankShape& s, int l, TransientReplay& r) {
  const int experts = s.expert_group(l);
  if (experts < 0) return;
  r.Prefetch(experts);
  r.Acquire(experts);
  r.Release(experts);
}

// Model::BackwardBlocks through chunk `c`: each block held (recomputed first under
// model.recompute), its gradients handed over; with a split backward (the input-gradient pass)
// the block's are left to the weight pass, but an MoE block's are requested (its router's weight
// gradient is computed here). An MoE block's routed experts are gathered again and their
// gradients computed in this pass either way (Model::MoeBackward), and handed over here without
// a split backward, else in the weight pass.
void ReplayBackwardBlocks(const RankShape& s, int c, TransientReplay& r) {
  const bool split = s.split_backward();
  const worker::PipelineStage& chunk = s.chunks[c];
  const int first = chunk.first_layer;
  for (int l = first + chunk.num_layers - 1; l >= first; --l) {
    const int block = s.block_group(l), experts = s.expert_group(l);
    r.Acquire(block);
    if (l > first) r.Prefetch(s.block_group(l - 1));
    if (s.model.recompute) {
      r.Acquire(block);
      ReplayExpertsForward(s, l, r);
      r.Release(block);
    }
    if (!split || experts >= 0) r.Gradients(block);
    if (experts >= 0) {
      r.Acquire(experts);
      r.Gradients(experts);
      if (!split) r.Ready(experts);
      r.Release(experts);
    }
    if (!split) r.Ready(block);
    r.Release(block);
  }
  if (chunk.first && !split) {
    r.Gradients(0);
    r.Ready(0);
  }
}

// Model::StageWeightGradients of chunk `c`: the blocks' gradients (an MoE block's routed
// experts' handed over before the block's), then the embedding's; no parameters.
void ReplayWeightPass(const RankShape& s, int c, TransientReplay& r) {
  const worker::PipelineStage& chunk = s.chunks[c];
  const int first = chunk.first_layer;
  for (int l = first + chunk.num_layers - 1; l >= first; --l) {
    r.Gradients(s.block_group(l));
    if (const int experts = s.expert_group(l); experts >= 0) {
      r.Gradients(experts);
      r.Ready(experts);
    }
    r.Ready(s.block_group(l));
  }
  if (chunk.first) {
    r.Gradients(0);
    r.Ready(0);
  }
}

// Model::StageForward of chunk `c`: the forward pass, and on the last virtual stage the loss and
// the whole backward.
void ReplayStageForward(const RankShape& s, int c, TransientReplay& r) {
  const worker::PipelineStage& chunk = s.chunks[c];
  const int first = chunk.first_layer, end = first + chunk.num_layers;
  if (chunk.first) {
    r.Acquire(0);
    if (chunk.num_layers > 0) r.Prefetch(s.block_group(first));
    r.Release(0);
  }
  for (int l = first; l < end; ++l) {
    if (l + 1 < end) {
      r.Prefetch(s.block_group(l + 1));
    } else if (chunk.last) {
      r.Prefetch(FinalGroup(s));
    }
    r.Acquire(s.block_group(l));
    ReplayExpertsForward(s, l, r);
    r.Release(s.block_group(l));
  }
  if (!chunk.last) return;
  const int final_group = FinalGroup(s);
  const int head = s.tied_head_in_embedding_group() ? 0 : final_group;
  r.Acquire(final_group);
  r.Acquire(head);  // the chunked loss
  r.Gradients(head);
  r.Release(head);
  r.Gradients(final_group);  // the final norm's backward
  r.Ready(final_group);
  r.Release(final_group);
  ReplayBackwardBlocks(s, c, r);
}

}  // namespace

int ActivationSlots(const RankShape& s) {
  if (s.mesh.pp == 1) return 1;
  return worker::ActivationSlots(s.schedule(), s.stage_index);
}

namespace {

// The MLP buffers of saved block `saved_layer` of an activation slot (Model::MlpSizesOf): this
// rank's share of the dense or shared MLP's fc and hidden widths, the largest over the blocks the
// slot's i-th layer serves (each chunk's i-th block; slot 0 serves every block, when recomputing
// and in forward-only passes), and whether one of them is an MoE block. Of those MoE blocks, the
// ones the passes run through it: a training pass each chunk's i-th block (every block when
// recomputing), and forward-only passes every block of saved block 0 (`forward_only`: the slot
// evaluates). Under expert parallelism only those grow its received rows' buffers.
struct SlotMlp {
  int64_t fc = 0, ffn = 0;
  bool moe = false;
  bool trains_moe = false, runs_moe = false;
};

SlotMlp SlotMlpOf(const RankShape& s, int saved_layer, bool forward_only = false) {
  SlotMlp sizes;
  const bool gpt2 = s.model.family == config::ModelFamily::kGpt2;
  for (const worker::PipelineStage& chunk : s.chunks) {
    for (int l = chunk.first_layer; l < chunk.first_layer + chunk.num_layers; ++l) {
      const bool own = l - chunk.first_layer == saved_layer;
      if (saved_layer != 0 && !own) continue;
      const int64_t ffn = s.mlp_hidden(l) / s.mesh.tp;
      sizes.ffn = std::max(sizes.ffn, ffn);
      sizes.fc = std::max(sizes.fc, gpt2 ? ffn : 2 * ffn);
      if (!s.model.moe.IsMoeLayer(l)) continue;
      const bool trained = own || s.model.recompute;
      sizes.moe = true;
      sizes.trains_moe = sizes.trains_moe || trained;
      sizes.runs_moe = sizes.runs_moe || trained || forward_only;
    }
  }
  return sizes;
}

// Elements of an activation slot by type.
struct SlotElements {
  int64_t acts = 0, floats = 0, ints = 0;
};

// The most rows a rank's experts can receive in one exchange (0 without expert parallelism): from
// each of the ep ranks (itself included), every token's picks of this rank's E / ep experts, at
// most min(top_k, E / ep) per token, and under a capacity at most capacity rows per expert
// (MoeConfig::CapacityPerExpert, the engine's, of the whole micro-batch's picks: under context
// parallelism a rank holding the early tokens may keep all of an expert's room). With every
// token picking every expert this is exactly the balanced count.
int64_t ReceivedRowsBound(const RankShape& s) {
  const config::MoeConfig& moe = s.model.moe;
  if (s.mesh.ep <= 1) return 0;
  const int64_t n = s.rows(), local = moe.experts / s.mesh.ep;
  const int64_t per_source = std::min(n * std::min<int64_t>(moe.top_k, local),
                                      local * moe.CapacityPerExpert(n * s.mesh.cp * moe.top_k));
  return s.mesh.ep * per_source;
}

// An MoE block's buffers for a micro-batch of n rows (worker/model_activations.h): n · top_k
// picks (the dropless bound, allocated whatever the capacity), each expert's fc and hidden
// widths on this rank. Under expert parallelism the engine grows the buffers of the rows a
// rank's experts receive to the most it has received, which depends on the routing: counted
// here is the most it can receive (ReceivedRowsBound), so that a plan's memory holds however
// the router learns to route.
struct ExpertShapes {
  explicit ExpertShapes(const RankShape& s)
      : n(s.rows()),
        picks(n * s.model.moe.top_k),
        experts(s.model.moe.experts),
        ffn(s.model.moe.ffn / s.mesh.tp),
        fc(s.model.family == config::ModelFamily::kGpt2 ? ffn : 2 * ffn),
        received(ReceivedRowsBound(s)),
        gated(s.model.moe.shared_gate) {}
  // A saved block's (LayerActivations::Experts): the router's fp32 logits [n, E], the picks'
  // sources and slots (int32) and two weights (fp32), and their rows in, through fc and the
  // activation, and out; under expert parallelism, once an MoE block has run through it
  // (`routed`), the received rows in, through fc and the activation, and the orders between
  // rank-major and expert-major rows (int32); with a shared gate its fp32 values [n].
  void AddSaved(int64_t width, bool routed, SlotElements& e) const {
    const int64_t r = routed ? received : 0;
    e.floats += n * experts + 2 * picks + (gated ? n : 0);
    e.ints += 2 * picks + 2 * r;
    e.acts += picks * (2 * width + fc + ffn) + r * (width + fc + ffn);
  }
  // The backward's MoE scratch, once in a slot that holds an MoE block: the picks' output and
  // input gradients, their combine weights' gradients and the router logits' (fp32); with a
  // shared gate the shared experts' gated output gradient [n, C] and the gate logits' gradient
  // (fp32).
  void AddBackwardScratch(int64_t width, SlotElements& e) const {
    e.acts += 2 * picks * width + (gated ? n * width : 0);
    e.floats += picks + n * experts + (gated ? n : 0);
  }
  // Under expert parallelism, once an MoE block has run through the slot: the exchange's two
  // buffers of received rows.
  void AddExchange(int64_t width, SlotElements& e) const { e.acts += 2 * received * width; }
  const int64_t n, picks, experts, ffn, fc, received;
  const bool gated;
};

// Bytes of one activation slot; `forward_only`: it also runs forward-only passes (evaluation).
int64_t SlotBytes(const RankShape& s, const BackendShape& backend, bool forward_only) {
  const config::ModelConfig& c = s.model;
  const int64_t tp = s.mesh.tp;
  const bool sp = s.mesh.sequence_parallel && tp > 1;
  const int64_t n = s.rows(), nr = sp ? n / tp : n, w = c.width;
  const int64_t heads = c.heads / tp, kv = c.kv_heads / tp, d = c.head_dim();
  const int64_t dv = c.value_head_dim();
  const int64_t qkv = (heads + kv) * d + kv * dv, attn = heads * dv;
  const int64_t vocab = PaddedHeadVocab(s, backend);  // the logits' row stride
  const int64_t layers = s.chunk_layers(), saved = c.recompute ? 1 : layers;
  const int64_t chunk_rows = std::clamp<int64_t>(backend.max_logits_chunk / vocab, 1, n);
  SlotElements e;
  // Inputs and targets, their vocabulary-shard ids under tp, and with model.document_token each
  // row's document start.
  e.ints = 2 * n + (tp > 1 ? 2 * n : 0) + (c.document_token >= 0 ? n : 0);
  e.acts = (layers + 1) * nr * w;  // residual stream
  // Per block, its MLP aside: the two norms' outputs in full rows (without pre_norms the branches
  // read the residual stream's rows, gathered under sequence parallelism only), q, k and v, the
  // attention's output and the stream between the branches; the norms' local rows.
  const bool gathered = c.pre_norms || sp;
  e.acts += saved * ((gathered ? 2 * n * w : 0) + n * qkv + n * attn + nr * w);
  if (sp && c.pre_norms) e.acts += saved * 2 * nr * w;
  // The norms before the branches' statistics, attention log-sum-exp.
  e.floats = saved * ((c.pre_norms ? 4 * nr : 0) + n * heads);
  // post_norms: the branches' outputs before their norms, the norms' statistics, and the
  // backward's gradient at a branch's output.
  const int64_t norms = c.norms_per_block();
  if (c.post_norms) {
    e.acts += saved * 2 * nr * w + nr * w;
    e.floats += saved * 2 * nr;
  }
  if (c.residual_multiplier != 1.0f) e.acts += nr * w;  // a branch's scaled output gradient
  // Each saved block's MLP (or shared experts, and routed experts), and the backward's scratch
  // for the largest of them.
  const ExpertShapes experts(s);
  SlotMlp most;
  for (int i = 0; i < saved; ++i) {
    const SlotMlp mlp = SlotMlpOf(s, i, forward_only);
    e.acts += n * (mlp.fc + mlp.ffn);
    if (mlp.moe) experts.AddSaved(w, mlp.runs_moe, e);
    const int64_t k = mlp.moe ? c.moe.top_k : 0;
    most.fc = std::max({most.fc, mlp.fc, k * experts.fc});
    most.ffn = std::max({most.ffn, mlp.ffn, k * experts.ffn});
    most.moe = most.moe || mlp.moe;
    most.trains_moe = most.trains_moe || mlp.trains_moe;
    most.runs_moe = most.runs_moe || mlp.runs_moe;
  }
  e.acts += 2 * n * w + chunk_rows * vocab + nr * w;  // lnf, tmp, logits, dx
  // lnf statistics, the loss's statistics and log-sum-exp (and, split by vocabulary, the group's
  // gathered statistics)
  e.floats += 2 * nr + 4 * chunk_rows + (tp > 1 ? 3 * tp * chunk_rows : 0);
  if (sp) {
    e.acts += 4 * nr * w + n * w;  // lnf, tmp, dln and dlnf local rows; dx full rows
    e.floats += 2 * norms * w;     // norm-gradient scratch
  }
  // dln .. dlnf; the fc and activation gradients grow, under expert parallelism, to the rows an
  // MoE backward's experts receive.
  const int64_t received = most.trains_moe ? experts.received : 0;
  e.acts += n * w + n * attn + n * qkv + n * w;
  e.acts +=
      std::max(n * most.fc, received * experts.fc) + std::max(n * most.ffn, received * experts.ffn);
  if (most.moe) experts.AddBackwardScratch(w, e);
  if (most.runs_moe) experts.AddExchange(w, e);
  if (c.qk_norm) {  // the head norms' inputs and statistics, their scratch and weight gradients
    const int64_t norms = c.NormsWholeProjection() ? 2 : heads + kv;  // per row
    const int64_t weights = c.q_norm_width() + c.k_norm_width();
    e.acts += saved * n * (heads + kv) * d + 2 * n * heads * d;
    e.floats += saved * n * norms + weights + (s.split_backward() ? layers * weights : 0);
    if (c.NormsWholeProjection() && tp > 1) e.floats += n;  // each row's gradient dot
  }
  if (c.latent.enabled()) {  // latent attention's latents and statistics, and its scratch
    const worker::LatentShape latent = worker::LatentShape::Of(c, n, static_cast<int>(tp));
    e.acts += saved * latent.saved_acts() + latent.scratch();
    e.floats += saved * latent.saved_floats();
  }
  if (s.split_backward()) {  // what each block's weight pass needs from its input-gradient pass
    // (latent attention's projections have their weight gradients in the input pass)
    const int64_t qkv_dy = c.latent.enabled() ? 0 : n * qkv;
    for (int l = 0; l < layers; ++l) e.acts += 2 * n * w + n * SlotMlpOf(s, l).fc + qkv_dy;
    if (s.first()) e.acts += n * w;
    e.floats += layers * 2 * norms * w;
  }
  return e.acts * backend.act_bytes + 4 * e.floats + 4 * e.ints;
}

}  // namespace

int64_t ActivationSlotBytes(const RankShape& s, const BackendShape& backend) {
  return SlotBytes(s, backend, /*forward_only=*/false);
}

int64_t EvaluationSlotBytes(const RankShape& s, const BackendShape& backend) {
  if (!s.evaluates) return 0;
  return SlotBytes(s, backend, /*forward_only=*/true) - SlotBytes(s, backend, false);
}

int64_t PaddedHeadVocab(const RankShape& s, const BackendShape& backend) {
  const int64_t vocab = s.model.vocab / s.mesh.tp, multiple = backend.logits_vocab_multiple;
  if (s.mesh.tp > 1 || multiple <= 1) return vocab;
  return (vocab + multiple - 1) / multiple * multiple;
}

int64_t PaddedHeadBytes(const RankShape& s, const BackendShape& backend) {
  const int64_t padded = PaddedHeadVocab(s, backend);
  if (!s.last() || padded == s.model.vocab / s.mesh.tp) return 0;
  return 2 * 4 * padded * s.model.width;
}

int64_t KeptWeightBytes(const RankShape& s, const BackendShape& backend) {
  const bool converts = backend.act_bytes < 4;  // bf16 activations: weights converted for GEMMs
  return converts && s.mesh.zero < 3 ? s.block_linear_params * backend.act_bytes : 0;
}

int64_t RingBufferBytes(const RankShape& s, const BackendShape& backend) {
  if (s.mesh.cp == 1) return 0;
  const config::ModelConfig& c = s.model;
  const int64_t n = s.rows(), d = c.head_dim(), dv = c.value_head_dim();
  const int64_t heads = c.heads / s.mesh.tp, kv_heads = c.kv_heads / s.mesh.tp;
  const int64_t kv = n * kv_heads * (d + dv);
  const int64_t partial = n / 2 * heads * dv, partial_lse = n / 2 * heads;
  return (5 * kv + partial) * backend.act_bytes + 4 * partial_lse;
}

int64_t TransientPeakBytes(const RankShape& s) {
  if (s.mesh.zero < 2) return 0;
  TransientReplay r(s);
  const std::vector<worker::Pass> passes =
      s.mesh.pp == 1 ? std::vector<worker::Pass>(s.micro_batches, worker::Pass{})
                     : worker::PassOrder(s.schedule(), s.stage_index);
  for (const worker::Pass& pass : passes) {
    switch (pass.kind) {
      case worker::PassKind::kForward:
        ReplayStageForward(s, pass.chunk, r);  // the last virtual stage's backward too
        break;
      case worker::PassKind::kBackward:
        if (!s.chunks[pass.chunk].last) ReplayBackwardBlocks(s, pass.chunk, r);
        break;
      case worker::PassKind::kWeight:
        ReplayWeightPass(s, pass.chunk, r);
        break;
    }
  }
  r.FinishStep();
  return r.peak();
}

RankMemory PredictRankMemory(const RankShape& s, const BackendShape& backend) {
  int64_t padded = 0, shard = 0;
  for (size_t g = 0; g < s.group_sizes.size(); ++g) {
    padded += s.padded(g);
    shard += s.chunk(g);
  }
  const int zero = s.mesh.zero;
  RankMemory m;
  m.parameters = 4 * (zero < 3 ? padded : shard);
  m.gradients = 4 * (zero < 2 ? padded : shard);
  m.optimizer = 2 * 4 * (zero == 0 ? padded : shard);
  m.activations = ActivationSlots(s) * ActivationSlotBytes(s, backend) +
                  EvaluationSlotBytes(s, backend) + RingBufferBytes(s, backend) +
                  PaddedHeadBytes(s, backend) + KeptWeightBytes(s, backend);
  m.transient = TransientPeakBytes(s);
  if (s.mesh.pp > 1) {
    const bool sp = s.mesh.sequence_parallel && s.mesh.tp > 1;
    const int64_t count = s.rows() / (sp ? s.mesh.tp : 1) * s.model.width;
    const int64_t slots = ActivationSlots(s);
    // Several chunks per rank: every rank receives (its later chunks) and sends (its earlier ones).
    const bool receives = !s.first() || s.chunks.size() > 1;
    const bool sends = !s.last() || s.chunks.size() > 1;
    const int64_t buffers = (receives ? slots + 1 : 0) + (sends ? slots + 1 : 0);
    m.pipeline_buffers = buffers * count * backend.act_bytes;
  }
  return m;
}

}  // namespace trainyard::planner
