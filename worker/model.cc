#include "worker/model.h"

#include <algorithm>
#include <functional>
#include <optional>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status.h"
#include "worker/document_starts.h"
#include "worker/head_norm.h"
#include "worker/latent_attention.h"
#include "worker/model_activations.h"
#include "worker/moe_dispatch.h"
#include "worker/rope.h"

namespace trainyard::worker {

using config::ModelFamily;

namespace {

// A span of a DeviceTimer that ends when End() is called or it goes out of scope (an error
// return too), so that the timer's starts and stops stay paired.
class TimedSpan {
 public:
  explicit TimedSpan(DeviceTimer* timer) : timer_(timer) { timer_->Start(); }
  ~TimedSpan() { End(); }
  TimedSpan(const TimedSpan&) = delete;
  TimedSpan& operator=(const TimedSpan&) = delete;
  void End() {
    if (timer_ != nullptr) timer_->Stop();
    timer_ = nullptr;
  }

 private:
  DeviceTimer* timer_;
};

// Backend::HoldWeight for a scope (an error return too): the LM head over the chunks of a loss or
// of logits, which it does not change.
class HeldWeight {
 public:
  HeldWeight(Backend* backend, const float* w, int64_t count) : backend_(backend) {
    backend_->HoldWeight(w, count);
  }
  ~HeldWeight() { backend_->ReleaseWeight(); }
  HeldWeight(const HeldWeight&) = delete;
  HeldWeight& operator=(const HeldWeight&) = delete;

 private:
  Backend* backend_;
};

}  // namespace

Model::Model(const config::ModelConfig& config, Backend* backend, ParamSource* source,
             ModelSharding sharding)
    : config_(config),
      tp_(sharding.tp, sharding.sequence_parallel, backend->act_dtype()),
      cp_(sharding.cp, backend),
      ep_(sharding.ep != nullptr && sharding.ep->size() > 1 ? sharding.ep : nullptr),
      sp_(tp_.sequence_parallel()),
      split_(sharding.split_backward),
      layout_(config, tp_.rank(), tp_.size(), std::move(sharding.chunks),
              ep_ != nullptr ? ep_->rank() : 0, ep_ != nullptr ? ep_->size() : 1),
      backend_(backend),
      source_(source),
      forward_timer_(backend->NewDeviceTimer()),
      backward_timer_(backend->NewDeviceTimer()),
      train_loss_(backend->NewDeviceSum()),
      train_lse_squares_(backend->NewDeviceSum()),
      eval_loss_(backend->NewDeviceSum()) {
  const int64_t n = tp_size(), d = config.head_dim();
  dims_.heads = config.heads / n;
  dims_.kv_heads = config.kv_heads / n;
  dims_.ffn = config.ffn_hidden / n;
  dims_.vocab = config.vocab / n;
  const int64_t dv = config.value_head_dim();
  dims_.qkv_width = (dims_.heads + dims_.kv_heads) * d + dims_.kv_heads * dv;
  dims_.attn = dims_.heads * dv;
  dims_.vocab_begin = dims_.vocab * tp_rank();
  const int64_t multiple = backend->logits_vocab_multiple();
  head_.vocab = dims_.vocab;
  if (layout_.last() && n == 1 && dims_.vocab % multiple != 0) {
    head_.vocab = (dims_.vocab + multiple - 1) / multiple * multiple;
    for (Buffer<float>* b : {&head_.weight, &head_.grad}) {
      *b = backend->AllocFloat(head_.vocab * config.width);
      backend->Fill(b->data(), 0.0f, b->size());
    }
  }
  // Block weights stay in one buffer: a converting backend keeps their conversions (the source
  // registers nothing else; counted with the activations, as the padded head is).
  if (source->persistent() && backend->act_dtype() != DType::kF32) {
    kept_weight_bytes_ = BlockLinearParamElements(layout_) * backend->act_bytes();
  }
  kept_groups_.assign(layout_.groups().size(), false);
  slots_.resize(1);
  group_params_.assign(layout_.groups().size(), nullptr);
  group_grads_.assign(layout_.groups().size(), nullptr);
  hold_counts_.assign(layout_.groups().size(), 0);
  for (const PipelineStage& chunk : layout_.chunks()) {
    for (int l = chunk.first_layer; l < chunk.first_layer + chunk.num_layers; ++l) {
      if (config.moe.IsMoeLayer(l)) {
        moe_stats_.push_back({l, std::vector<int64_t>(config.moe.experts)});
      }
    }
  }
}

Model::~Model() {
  for (const float* w : kept_weights_) backend_->DropWeightCopy(w);
}

absl::StatusOr<std::unique_ptr<Model>> Model::Create(const config::ModelConfig& config,
                                                     Backend* backend, ParamSource* source,
                                                     ModelSharding sharding) {
  TY_RETURN_IF_ERROR(config::ValidateModelConfig(config));
  if (source == nullptr) return absl::InvalidArgumentError("a parameter source is required");
  const int tp = sharding.tp != nullptr ? sharding.tp->size() : 1;
  const int ep = sharding.ep != nullptr ? sharding.ep->size() : 1;
  if (ep > 1 && (!config.moe.enabled() || config.moe.experts % ep != 0)) {
    return absl::InvalidArgumentError(absl::StrCat("parallelism.ep: ", ep,
                                                   " does not split the experts of model.moe (",
                                                   config.moe.experts, ")"));
  }
  if (config.moe.enabled() && config.moe.ffn % tp != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.moe.ffn: ", config.moe.ffn, " does not split over tp ", tp));
  }
  const std::vector<PipelineStage>& chunks = sharding.chunks;
  if (chunks.empty()) return absl::InvalidArgumentError("a model needs at least one chunk");
  for (size_t c = 1; c < chunks.size(); ++c) {
    if (chunks[c].num_layers != chunks[0].num_layers) {
      // The chunks share their activation slots, so they hold equal numbers of layers.
      return absl::InvalidArgumentError("a rank's model chunks must hold equal numbers of layers");
    }
  }
  if (sharding.split_backward && config.recompute) {
    return absl::InvalidArgumentError(
        "a split backward keeps every block's activations until its weight pass; it cannot "
        "recompute them");
  }
  if (sharding.tp != nullptr && sharding.tp->size() > 1) {
    const int n = sharding.tp->size();
    for (const auto& [what, value] : {std::pair<const char*, int>{"heads", config.heads},
                                      {"kv_heads", config.kv_heads},
                                      {"ffn_hidden", config.ffn_hidden},
                                      {"vocab", config.vocab}}) {
      if (value % n != 0) {
        return absl::InvalidArgumentError(absl::StrCat("parallelism.tp: model.", what, " ", value,
                                                       " is not divisible by tp ", n));
      }
    }
  }
  return std::unique_ptr<Model>(new Model(config, backend, source, std::move(sharding)));
}

const float* Model::P(int group, int64_t offset) const {
  if (offset < 0) return nullptr;
  TY_CHECK(group_params_[group] != nullptr) << "parameter group " << group << " is not held";
  return group_params_[group] + (offset - layout_.groups()[group].begin);
}

float* Model::G(int group, int64_t offset) const {
  if (offset < 0) return nullptr;
  TY_CHECK(group_grads_[group] != nullptr) << "gradients of group " << group << " not requested";
  return group_grads_[group] + (offset - layout_.groups()[group].begin);
}

int64_t Model::activation_bytes() const {
  int64_t floats = 0, acts = 0, ints = 0;
  auto add = [&](const Buffer<float>& b) { floats += b.size(); };
  auto add_act = [&](const Buffer<Act>& b) { acts += b.size(); };
  for (const auto& slot : slots_) {
    if (!slot) continue;
    const Activations& a = *slot;
    ints += a.inputs.size() + a.targets.size() + a.local_inputs.size() + a.local_targets.size() +
            a.doc_starts.size();
    for (const auto& r : a.resid) add_act(r);
    for (const auto& la : a.layers) {
      for (const Buffer<Act>* b :
           {&la.ln1, &la.qkv, &la.qk_pre, &la.att, &la.mid, &la.ln2, &la.fc, &la.act, &la.ln1_local,
            &la.ln2_local, &la.attn_out, &la.mlp_out, &la.latent_q, &la.latent_q_normed,
            &la.latent_kv, &la.latent_kv_normed}) {
        add_act(*b);
      }
      for (const Buffer<float>* b :
           {&la.ln1_mean, &la.ln1_rstd, &la.qk_rstd, &la.lse, &la.ln2_mean, &la.ln2_rstd,
            &la.attn_post_rstd, &la.mlp_post_rstd, &la.latent_q_rstd, &la.latent_kv_rstd}) {
        add(*b);
      }
      const LayerActivations::Experts& m = la.moe;
      for (const Buffer<Act>* b :
           {&m.in, &m.fc, &m.act, &m.out, &m.expert_in, &m.expert_fc, &m.expert_act}) {
        add_act(*b);
      }
      for (const Buffer<float>* b : {&m.logits, &m.shared_gate, &m.row_weight, &m.weight}) {
        add(*b);
      }
      ints += m.source.size() + m.slot.size() + m.to_experts.size() + m.from_experts.size();
    }
    for (const Buffer<Act>* b :
         {&a.lnf, &a.tmp, &a.logits, &a.dx, &a.dln, &a.datt, &a.dqkv, &a.dfc, &a.dact, &a.dlnf,
          &a.lnf_local, &a.tmp_local, &a.dx_full, &a.dln_local, &a.dlnf_local, &a.head_norm_scratch,
          &a.dpost, &a.dscaled, &a.latent_scratch}) {
      add_act(*b);
    }
    for (const Buffer<float>* b : {&a.lnf_mean, &a.lnf_rstd, &a.ce_stats, &a.ce_gathered, &a.ce_lse,
                                   &a.norm_scratch, &a.head_norm_grads, &a.head_norm_dots}) {
      add(*b);
    }
    for (const Activations::DeferredGrads& d : a.deferred) {
      for (const Buffer<Act>* b : {&d.mlp_proj_dy, &d.fc_dy, &d.proj_dy, &d.qkv_dy}) add_act(*b);
      add(d.norms);
      add(d.head_norms);
    }
    add_act(a.embedding_dy);
    add_act(a.moe_dout);
    add_act(a.moe_din);
    add(a.moe_dweight);
    add(a.moe_dlogits);
    add_act(a.moe_dshared);
    add(a.moe_dgate);
    add_act(a.moe_exchange);
    add_act(a.moe_expert_rows);
  }
  floats += head_.weight.size() + head_.grad.size();
  return floats * static_cast<int64_t>(sizeof(float)) + acts * backend_->act_bytes() +
         ints * static_cast<int64_t>(sizeof(int32_t)) + cp_.scratch_bytes() + kept_weight_bytes_;
}

void Model::KeepWeightCopies(int group, const float* params) {
  if (kept_weight_bytes_ == 0 || kept_groups_[group]) return;
  kept_groups_[group] = true;
  const ParamGroup& g = layout_.groups()[group];
  for (const ParamTensor& t : layout_.tensors()) {
    if (t.offset < g.begin || t.offset >= g.end || !IsBlockLinearParam(t)) continue;
    // A whole tensor (the routed experts' slices of one are parts of it), so that the optimizer
    // step that updates it writes its copy too.
    const float* w = params + (t.offset - g.begin);
    if (backend_->KeepWeightCopy(w, t.numel)) kept_weights_.push_back(w);
  }
}

absl::Status Model::Prepare(const int32_t* inputs, const int32_t* targets, int b, int t) {
  if (b < 1) return absl::InvalidArgumentError(absl::StrCat("batch must be positive, got ", b));
  if (t < 1 || t > config_.max_seq) {
    return absl::InvalidArgumentError(
        absl::StrCat("sequence length ", t, " is outside [1, max_seq=", config_.max_seq, "]"));
  }
  for (const int32_t* tokens : {inputs, targets}) {
    if (tokens == nullptr) continue;
    for (int64_t i = 0; i < int64_t{b} * t; ++i) {
      if (tokens[i] < 0 || tokens[i] >= config_.vocab) {
        return absl::InvalidArgumentError(absl::StrCat("token ", tokens[i], " at position ", i,
                                                       " is outside the vocabulary [0, ",
                                                       config_.vocab, ")"));
      }
    }
  }
  if (cp_.enabled() && t % (2 * cp_.size()) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("parallelism.cp: sequence length ", t,
                                                   " does not split into 2 × cp = ", 2 * cp_.size(),
                                                   " equal chunks"));
  }
  const int local_t = t / cp_.size();
  const int64_t n = int64_t{b} * local_t;
  if (sp_ && n % tp_size() != 0) {
    return absl::InvalidArgumentError(absl::StrCat("parallelism.sequence_parallel: ", n,
                                                   " tokens per micro-batch do not split over tp ",
                                                   tp_size()));
  }
  EnsureActivations(b, local_t);
  UploadTokens(inputs, targets);
  return absl::OkStatus();
}

void Model::UploadTokens(const int32_t* inputs, const int32_t* targets) {
  Activations& a = *acts_;
  const int64_t n = int64_t{a.b} * a.t;
  std::vector<int32_t> split_inputs, split_targets;
  if (config_.document_token >= 0) {  // from the whole sequences, then this rank's share
    const int64_t t = int64_t{a.t} * cp_.size();
    std::vector<int32_t> starts(a.b * t);
    for (int64_t bi = 0; bi < a.b; ++bi) {
      DocumentStarts(inputs + bi * t, t, config_.document_token, 0, 0, starts.data() + bi * t);
    }
    if (cp_.enabled()) {
      std::vector<int32_t> split(n);
      cp_.Split(starts.data(), a.b, a.t * cp_.size(), split.data());
      starts = std::move(split);
    }
    backend_->CopyFromHost(a.doc_starts.data(), starts.data(), n);
  }
  if (cp_.enabled()) {  // this rank's share, in its row order
    split_inputs.resize(n);
    cp_.Split(inputs, a.b, a.t * cp_.size(), split_inputs.data());
    inputs = split_inputs.data();
    if (targets != nullptr) {
      split_targets.resize(n);
      cp_.Split(targets, a.b, a.t * cp_.size(), split_targets.data());
      targets = split_targets.data();
    }
  }
  backend_->CopyFromHost(a.inputs.data(), inputs, n);
  if (tp_size() > 1) {
    std::vector<int32_t> local(n);
    auto to_local = [&](const int32_t* tokens, Buffer<int32_t>& out) {
      for (int64_t i = 0; i < n; ++i) {
        const int64_t id = tokens[i] - dims_.vocab_begin;
        local[i] = id >= 0 && id < dims_.vocab ? static_cast<int32_t>(id) : -1;
      }
      backend_->CopyFromHost(out.data(), local.data(), n);
    };
    to_local(inputs, a.local_inputs);
    if (targets != nullptr) to_local(targets, a.local_targets);
  }
  if (targets != nullptr) backend_->CopyFromHost(a.targets.data(), targets, n);
}

void Model::AllocateLatent(LayerActivations& la, int64_t n) {
  Backend& be = *backend_;
  const config::LatentAttention& l = config_.latent;
  if (l.q_rank > 0) {
    la.latent_q = be.AllocAct(n * l.q_rank);
    la.latent_q_normed = be.AllocAct(n * l.q_rank);
    la.latent_q_rstd = be.AllocFloat(n);
  }
  la.latent_kv = be.AllocAct(n * l.kv_rank);
  la.latent_kv_normed = be.AllocAct(n * l.kv_rank);
  la.latent_kv_rstd = be.AllocFloat(n);
}

absl::Status Model::QkvBackward(int layer, LayerActivations& la) {
  if (config_.latent.enabled()) return LatentProject(layer, la, /*backward=*/true);
  Activations& a = *acts_;
  const int g = layout_.block_group(layer);
  const BlockOffsets& o = layout_.block(layer);
  const int64_t n = int64_t{a.b} * a.t, count = n * dims_.qkv_width;
  float *dw = nullptr, *db = nullptr;
  if (split_) {
    backend_->Copy(a.deferred[layer - stage().first_layer].qkv_dy.data(), a.dqkv.data(), count);
  } else {
    std::tie(dw, db) = std::pair(G(g, o.qkv_w), G(g, o.qkv_b));
  }
  backend_->LinearBackward(a.dln.data(), dw, db, a.dqkv.data(), AttentionInput(la, layer),
                           P(g, o.qkv_w), n, dims_.qkv_width, config_.width);
  return absl::OkStatus();
}

absl::Status Model::LatentProject(int layer, LayerActivations& la, bool backward) {
  Activations& a = *acts_;
  const int g = layout_.block_group(layer);
  const BlockOffsets& o = layout_.block(layer);
  const LatentShape shape = LatentShape::Of(config_, int64_t{a.b} * a.t, tp_size());
  const LatentWeights w{P(g, o.q_a_w),  P(g, o.q_a_norm_w),  P(g, o.q_b_w), P(g, o.q_w),
                        P(g, o.kv_a_w), P(g, o.kv_a_norm_w), P(g, o.kv_b_w)};
  const LatentSaved saved{la.latent_q.data(),         la.latent_q_normed.data(),
                          la.latent_q_rstd.data(),    la.latent_kv.data(),
                          la.latent_kv_normed.data(), la.latent_kv_rstd.data()};
  const Act* x = AttentionInput(la, layer);
  if (!backward) {
    LatentForward(*backend_, shape, w, x, saved, a.latent_scratch.data(), la.qkv.data());
    return absl::OkStatus();
  }
  const LatentGrads grads{G(g, o.q_a_w),  G(g, o.q_a_norm_w),  G(g, o.q_b_w), G(g, o.q_w),
                          G(g, o.kv_a_w), G(g, o.kv_a_norm_w), G(g, o.kv_b_w)};
  LatentGroup group;
  if (tp_size() > 1) {
    group.sum = [this](Act* data, int64_t count) { return tp_.AllReduce(data, count); };
    group.first = tp_rank() == 0;
  }
  return LatentBackward(*backend_, shape, w, grads, x, saved, a.dqkv.data(),
                        a.latent_scratch.data(), a.dln.data(), group);
}

void Model::AllocateNorms(LayerActivations& la, int64_t n, int64_t nr) {
  Backend& be = *backend_;
  const int64_t width = config_.width;
  // Without pre_norms the branches read the residual stream's rows themselves: gathered into
  // ln1 and ln2 under sequence parallelism, else read where they are (AttentionInput, MlpInput).
  if (config_.pre_norms || sp_) {
    la.ln1 = be.AllocAct(n * width);
    la.ln2 = be.AllocAct(n * width);
  }
  if (config_.pre_norms) {
    la.ln1_mean = be.AllocFloat(nr);
    la.ln1_rstd = be.AllocFloat(nr);
    la.ln2_mean = be.AllocFloat(nr);
    la.ln2_rstd = be.AllocFloat(nr);
  }
  if (sp_ && config_.pre_norms) {
    la.ln1_local = be.AllocAct(nr * width);
    la.ln2_local = be.AllocAct(nr * width);
  }
  if (config_.post_norms) {
    la.attn_out = be.AllocAct(nr * width);
    la.mlp_out = be.AllocAct(nr * width);
    la.attn_post_rstd = be.AllocFloat(nr);
    la.mlp_post_rstd = be.AllocFloat(nr);
  }
}

void Model::EnsureActivations(int b, int t) {
  std::unique_ptr<Activations>& held = slots_[current_slot_];
  if (held && held->b == b && held->t == t && held->layers_held == stage().num_layers) {
    acts_ = held.get();
    return;
  }
  held.reset();  // free the old shape's memory before allocating the new one
  auto a = std::make_unique<Activations>();
  const auto& c = config_;
  const int64_t n = int64_t{b} * t, width = c.width, qkv = dims_.qkv_width;
  const int64_t nr = sp_ ? n / tp_size() : n;  // rows of the residual stream held here
  const int64_t attn = dims_.attn;
  Backend& be = *backend_;
  a->b = b;
  a->t = t;
  a->layers_held = stage().num_layers;
  a->inputs = be.AllocInt(n);
  if (tp_size() > 1) {
    a->local_inputs = be.AllocInt(n);
    a->local_targets = be.AllocInt(n);
  }
  a->targets = be.AllocInt(n);
  if (c.document_token >= 0) a->doc_starts = be.AllocInt(n);
  const int local_layers = stage().num_layers;
  for (int l = 0; l <= local_layers; ++l) a->resid.push_back(be.AllocAct(nr * width));
  const int saved_layers = c.recompute ? 1 : local_layers;
  const int64_t experts = c.moe.experts, picks = n * c.moe.top_k;
  const int64_t expert_ffn = c.moe.ffn / tp_size();
  const int64_t expert_fc = c.family == ModelFamily::kGpt2 ? expert_ffn : 2 * expert_ffn;
  MlpSizes most;  // the largest of any slot, for the backward's scratch
  for (int l = 0; l < saved_layers; ++l) {
    LayerActivations la;
    AllocateNorms(la, n, nr);
    la.qkv = be.AllocAct(n * qkv);
    if (c.latent.enabled()) AllocateLatent(la, n);
    if (c.qk_norm) {
      la.qk_pre = be.AllocAct(HeadNorms(n).saved());
      la.qk_rstd = be.AllocFloat(HeadNorms(n).statistics());
    }
    la.att = be.AllocAct(n * attn);
    la.lse = be.AllocFloat(int64_t{b} * dims_.heads * t);
    la.mid = be.AllocAct(nr * width);
    const MlpSizes sizes = MlpSizesOf(l);
    la.fc = be.AllocAct(n * sizes.fc);
    la.act = be.AllocAct(n * sizes.ffn);
    if (sizes.moe) AllocateExperts(la, n);
    most.fc = std::max({most.fc, sizes.fc, sizes.moe ? c.moe.top_k * expert_fc : 0});
    most.ffn = std::max({most.ffn, sizes.ffn, sizes.moe ? c.moe.top_k * expert_ffn : 0});
    most.moe = most.moe || sizes.moe;
    a->layers.push_back(std::move(la));
  }
  a->lnf = be.AllocAct(n * width);
  a->lnf_mean = be.AllocFloat(nr);
  a->lnf_rstd = be.AllocFloat(nr);
  a->tmp = be.AllocAct(n * width);
  const int64_t chunk_rows = std::clamp<int64_t>(be.max_logits_chunk() / head_.vocab, 1, n);
  a->logits = be.AllocAct(chunk_rows * head_.vocab);
  a->ce_stats = be.AllocFloat(chunk_rows * 3);
  if (tp_size() > 1) a->ce_gathered = be.AllocFloat(chunk_rows * 3 * tp_size());
  a->ce_lse = be.AllocFloat(chunk_rows);
  a->dx = be.AllocAct(nr * width);
  if (sp_) {
    a->lnf_local = be.AllocAct(nr * width);
    a->tmp_local = be.AllocAct(nr * width);
    a->dx_full = be.AllocAct(n * width);
    a->dln_local = be.AllocAct(nr * width);
    a->dlnf_local = be.AllocAct(nr * width);
    a->norm_scratch = be.AllocFloat(NormScratch());
  }
  if (c.post_norms) a->dpost = be.AllocAct(nr * width);
  if (c.residual_multiplier != 1.0f) a->dscaled = be.AllocAct(nr * width);
  a->dln = be.AllocAct(n * width);
  a->datt = be.AllocAct(n * attn);
  a->dqkv = be.AllocAct(n * qkv);
  if (c.latent.enabled()) {
    a->latent_scratch = be.AllocAct(LatentShape::Of(c, n, tp_size()).scratch());
  }
  a->dfc = be.AllocAct(n * most.fc);
  a->dact = be.AllocAct(n * most.ffn);
  if (most.moe) {
    a->moe_dout = be.AllocAct(picks * width);
    a->moe_din = be.AllocAct(picks * width);
    a->moe_dweight = be.AllocFloat(picks);
    a->moe_dlogits = be.AllocFloat(n * experts);
    if (c.moe.shared_gate) {
      a->moe_dshared = be.AllocAct(n * width);
      a->moe_dgate = be.AllocFloat(n);
    }
  }
  a->dlnf = be.AllocAct(n * width);
  if (c.qk_norm) {
    a->head_norm_scratch = be.AllocAct(2 * HeadNorms(n).scratch());
    a->head_norm_grads = be.AllocFloat(c.q_norm_width() + c.k_norm_width());
    if (HeadNorms(n).split()) a->head_norm_dots = be.AllocFloat(n);
  }
  if (split_) AllocateDeferred(*a, n);
  held = std::move(a);
  acts_ = held.get();
}

absl::Status Model::Forward(bool keep_layer_activations, std::unique_ptr<Hold>* final_hold,
                            const Act* input_acts) {
  Activations& a = *acts_;
  const PipelineStage& stage = this->stage();
  const int64_t rows = local_rows();
  if (stage.first) {
    TY_ASSIGN_OR_RETURN(auto hold, Hold::Acquire(this, ParameterLayout::kEmbeddingGroup));
    if (stage.num_layers > 0) source_->Prefetch(layout_.block_group(stage.first_layer));
    constexpr int g = ParameterLayout::kEmbeddingGroup;
    if (tp_size() == 1) {
      EmbeddingLookup(a.resid[0].data(), a.inputs.data(), P(g, layout_.wte()), P(g, layout_.wpe()));
    } else {
      // Vocabulary-parallel: each rank looks up the tokens its shard owns (zeros elsewhere), one
      // rank adds the positions, and the sum over the group is the embedding.
      // Under sequence parallelism the sum is scattered: each rank keeps its rows.
      Act* full = sp_ ? a.tmp.data() : a.resid[0].data();
      EmbeddingLookup(full, a.local_inputs.data(), P(g, layout_.wte()),
                      tp_rank() == 0 ? P(g, layout_.wpe()) : nullptr);
      TY_RETURN_IF_ERROR(SumToLocalRows(full, a.resid[0].data(), config_.width));
    }
  } else {
    backend_->Copy(a.resid[0].data(), input_acts, rows * config_.width);
  }
  // Each block's closing residual add goes into the norm that follows it on this stage (the
  // next block's first, or the final norm); a stage whose output travels on adds its last here.
  const int end = stage.first_layer + stage.num_layers;
  PendingSum residual;
  for (int l = stage.first_layer; l < end; ++l) {
    if (l + 1 < end) {
      source_->Prefetch(layout_.block_group(l + 1));
    } else if (stage.last) {
      source_->Prefetch(layout_.final_group());
    }
    TY_RETURN_IF_ERROR(
        BlockForward(l, a.layers[keep_layer_activations ? l - stage.first_layer : 0], residual));
  }
  if (stage.last) {
    TY_ASSIGN_OR_RETURN(*final_hold, Hold::Acquire(this, layout_.final_group()));
    return FinalNorm(residual);
  }
  if (residual.pending()) {
    backend_->Add(a.resid[stage.num_layers].data(), residual.a, residual.b, rows * config_.width);
  }
  return absl::OkStatus();
}

// The backward pass through this stage's blocks, from dx = ∂loss/∂(stage output) to
// ∂loss/∂(stage input), then the embedding's gradient on the first stage.
absl::Status Model::BackwardBlocks(Act* dx) {
  Activations& a = *acts_;
  const PipelineStage& stage = this->stage();
  const bool recompute = config_.recompute;
  for (int l = stage.first_layer + stage.num_layers - 1; l >= stage.first_layer; --l) {
    LayerActivations& la = a.layers[recompute ? 0 : l - stage.first_layer];
    TY_ASSIGN_OR_RETURN(auto hold, Hold::Acquire(this, layout_.block_group(l)));
    if (l > stage.first_layer) source_->Prefetch(layout_.block_group(l - 1));
    if (recompute) {
      recomputing_ = true;
      PendingSum output;  // the forward pass put the block's output in the residual stream
      const absl::Status recomputed = BlockForward(l, la, output);
      recomputing_ = false;
      TY_RETURN_IF_ERROR(recomputed);
    }
    TY_RETURN_IF_ERROR(BlockBackward(l, la, dx));
  }
  if (!stage.first) return absl::OkStatus();
  Act* dx_full = sp_ ? a.dx_full.data() : dx;
  TY_RETURN_IF_ERROR(ToFullRows(dx, dx_full, config_.width));
  if (split_) {  // the embedding's gradient waits for the weight pass
    backend_->Copy(a.embedding_dy.data(), dx_full, int64_t{a.b} * a.t * config_.width);
    return absl::OkStatus();
  }
  return EmbeddingBackward(dx_full);
}

absl::Status Model::EmbeddingBackward(const Act* dy) {
  Activations& a = *acts_;
  constexpr int eg = ParameterLayout::kEmbeddingGroup;
  TY_ASSIGN_OR_RETURN(group_grads_[eg], source_->Gradients(eg));
  const int32_t* tokens = tp_size() > 1 ? a.local_inputs.data() : a.inputs.data();
  float* dwpe = G(eg, layout_.wpe());
  const float scale = config_.embedding_scale();
  if (!cp_.enabled()) {
    backend_->EmbeddingBackward(G(eg, layout_.wte()), dwpe, dy, tokens, a.b, a.t, config_.width,
                                dims_.vocab, scale);
  } else {
    const int64_t c = a.t / 2, rows = int64_t{a.b} * c, width = config_.width;
    for (int half = 0; half < 2; ++half) {
      backend_->EmbeddingBackward(G(eg, layout_.wte()),
                                  dwpe != nullptr ? dwpe + cp_.ChunkOf(half) * c * width : nullptr,
                                  backend_->At(dy, half * rows * width), tokens + half * rows, a.b,
                                  c, width, dims_.vocab, scale);
    }
  }
  return source_->GradientsReady(eg);
}

void Model::EmbeddingLookup(Act* out, const int32_t* tokens, const float* wte, const float* wpe) {
  const Activations& a = *acts_;
  const int64_t width = config_.width;
  const float scale = config_.embedding_scale();
  if (!cp_.enabled()) {
    backend_->Embedding(out, tokens, wte, wpe, a.b, a.t, width, scale);
    return;
  }
  // Each local half is b runs of c consecutive positions, starting at its chunk's first.
  const int64_t c = a.t / 2, rows = int64_t{a.b} * c;
  for (int half = 0; half < 2; ++half) {
    backend_->Embedding(backend_->At(out, half * rows * width), tokens + half * rows, wte,
                        wpe != nullptr ? wpe + cp_.ChunkOf(half) * c * width : nullptr, a.b, c,
                        width, scale);
  }
}

AttentionShape Model::AttentionOf(int layer) const {
  return AttentionShape{.batch = acts_->b,
                        .seq = acts_->t,
                        .heads = dims_.heads,
                        .kv_heads = dims_.kv_heads,
                        .head_dim = config_.head_dim(),
                        .window = config_.WindowOf(layer),
                        .scale = config_.attention_scale(),
                        .softcap = config_.attention_softcap,
                        .doc_start = acts_->doc_starts.empty() ? nullptr : acts_->doc_starts.data(),
                        .value_dim = config_.value_head_dim()};
}

void Model::Rotate(int layer, Act* qkv, bool backward) {
  if (!config_.RotatesLayer(layer)) return;  // a NoPE block (model.nope_layers)
  const Activations& a = *acts_;
  // Under context parallelism this rank holds two chunks of a sequence size() times as long.
  const int64_t positions = int64_t{a.t} * cp_.size();
  const kernels::RopeFrequencies freq = RopeOf(config_, layer, positions);
  const int64_t d = config_.head_dim();
  if (!cp_.enabled()) {
    AttentionShape shape{a.b, a.t, dims_.heads, dims_.kv_heads, d};
    shape.value_dim = config_.value_head_dim();
    backward ? backend_->RopeBackward(qkv, shape, freq, 0) : backend_->Rope(qkv, shape, freq, 0);
    return;
  }
  const int64_t c = a.t / 2, rows = int64_t{a.b} * c;
  AttentionShape half_shape{a.b, c, dims_.heads, dims_.kv_heads, d};
  half_shape.value_dim = config_.value_head_dim();
  for (int half = 0; half < 2; ++half) {
    Act* x = backend_->At(qkv, half * rows * dims_.qkv_width);
    const int64_t first = cp_.ChunkOf(half) * c;
    backward ? backend_->RopeBackward(x, half_shape, freq, first)
             : backend_->Rope(x, half_shape, freq, first);
  }
}

absl::Status Model::BlockForward(int layer, LayerActivations& la, PendingSum& residual) {
  const int g = layout_.block_group(layer);
  TY_ASSIGN_OR_RETURN(auto hold, Hold::Acquire(this, g));
  if (layout_.expert_group(layer) >= 0) source_->Prefetch(layout_.expert_group(layer));
  Activations& a = *acts_;
  const auto& c = config_;
  const BlockOffsets& o = layout_.block(layer);
  // n: the micro-batch's rows (the residual stream's rows on this rank are n / tp under sequence
  // parallelism).
  const int64_t n = int64_t{a.b} * a.t, width = c.width;
  const int64_t attn = dims_.attn;
  const AttentionShape shape = AttentionOf(layer);
  const bool gpt2 = c.family == ModelFamily::kGpt2;
  const int li = layer - stage().first_layer;  // the block's index on this stage
  Act* x = a.resid[li].data();
  // The norms' outputs on this rank's rows; without pre_norms the rows themselves.
  Act* ln1 = !c.pre_norms ? x : sp_ ? la.ln1_local.data() : la.ln1.data();
  Act* ln2 = !c.pre_norms ? la.mid.data() : sp_ ? la.ln2_local.data() : la.ln2.data();
  Act* proj_out = sp_ ? a.tmp_local.data() : a.tmp.data();
  Backend& be = *backend_;

  Norm(ln1, la.ln1_mean.data(), la.ln1_rstd.data(), x, residual, P(g, o.ln1_w), P(g, o.ln1_b));
  TY_RETURN_IF_ERROR(ToFullRows(ln1, la.ln1.data(), width));
  if (c.latent.enabled()) {
    TY_RETURN_IF_ERROR(LatentProject(layer, la, /*backward=*/false));
  } else {
    be.Linear(la.qkv.data(), AttentionInput(la, layer), P(g, o.qkv_w), P(g, o.qkv_b), n,
              dims_.qkv_width, width);
  }
  if (c.qk_norm) {
    TY_RETURN_IF_ERROR(HeadNormForward(be, la.qkv.data(), la.qk_pre.data(), la.qk_rstd.data(),
                                       a.head_norm_scratch.data(), P(g, o.q_norm_w),
                                       P(g, o.k_norm_w), HeadNorms(n), TpSum()));
  }
  if (!gpt2) Rotate(layer, la.qkv.data(), /*backward=*/false);
  if (cp_.enabled()) {
    TY_RETURN_IF_ERROR(cp_.Attention(la.att.data(), la.lse.data(), la.qkv.data(), shape));
  } else {
    be.Attention(la.att.data(), la.lse.data(), la.qkv.data(), shape);
  }
  be.Linear(a.tmp.data(), la.att.data(), P(g, o.proj_w), RowParallelBias(g, o.proj_b), n, width,
            attn);
  TY_RETURN_IF_ERROR(SumToLocalRows(a.tmp.data(), proj_out, width));
  PostNorm(P(g, o.attn_post_w), la.attn_out.data(), la.attn_post_rstd.data(), proj_out);
  // The residual add and the second norm in one pass.
  Norm(ln2, la.ln2_mean.data(), la.ln2_rstd.data(), la.mid.data(), PendingSum{x, proj_out},
       P(g, o.ln2_w), P(g, o.ln2_b));
  TY_RETURN_IF_ERROR(ToFullRows(ln2, la.ln2.data(), width));
  // MLP branch: the dense MLP, or an MoE block's shared and routed experts.
  if (o.mlp_ffn > 0) MlpForward(layer, la);
  if (o.shared_gate_w >= 0) {  // full rows of the input on each rank, a partial sum of the output
    GateSharedExperts(be, la.moe.shared_gate.data(), MlpInput(la), P(g, o.shared_gate_w),
                      a.tmp.data(), n, width);
  }
  if (o.moe) TY_RETURN_IF_ERROR(MoeForward(layer, la, /*accumulate=*/o.mlp_ffn > 0));
  TY_RETURN_IF_ERROR(SumToLocalRows(a.tmp.data(), proj_out, width));
  PostNorm(P(g, o.mlp_post_w), la.mlp_out.data(), la.mlp_post_rstd.data(), proj_out);
  residual = {la.mid.data(), proj_out};
  return absl::OkStatus();
}

void Model::PostNorm(const float* w, Act* saved, float* rstd, Act* branch) {
  const int64_t rows = local_rows(), width = config_.width;
  if (config_.post_norms) {
    backend_->Copy(saved, branch, rows * width);
    backend_->RmsNorm(branch, rstd, saved, w, rows, width, config_.norm_eps);
  }
  if (const float m = config_.residual_multiplier; m != 1.0f) {
    backend_->ScaleAct(branch, branch, rows * width, m);
  }
}

absl::StatusOr<Act*> Model::BranchGradient(const float* w, float* dw, const Act* saved,
                                           const float* rstd, Act* dx) {
  const int64_t rows = local_rows(), width = config_.width;
  Act* dbranch = dx;
  if (const float m = config_.residual_multiplier; m != 1.0f) {
    dbranch = acts_->dscaled.data();
    backend_->ScaleAct(dbranch, dx, rows * width, m);
  }
  if (config_.post_norms) {
    Act* dnormed = dbranch;
    dbranch = acts_->dpost.data();
    backend_->Fill(dbranch, 0.0f, rows * width);
    backend_->RmsNormBackward(dbranch, dw, dnormed, saved, w, rstd, rows, width);
  }
  Act* full = sp_ ? acts_->dx_full.data() : dbranch;
  TY_RETURN_IF_ERROR(ToFullRows(dbranch, full, width));
  return full;
}

void Model::NormBackward(Act* dx, const NormGrads& grads, const Act* dout, const Act* x,
                         const float* w, const float* mean, const float* rstd) {
  const int64_t rows = local_rows(), width = config_.width;
  if (w == nullptr) {  // no norm (model.pre_norms false): the gradient passes through
    backend_->Add(dx, dx, dout, rows * width);
  } else if (config_.family == ModelFamily::kGpt2) {
    backend_->LayerNormBackward(dx, grads.weight, grads.bias, dout, x, w, mean, rstd, rows, width);
  } else {
    backend_->RmsNormBackward(dx, grads.weight, dout, x, w, rstd, rows, width);
  }
}

void Model::Norm(Act* out, float* mean, float* rstd, Act* x, const PendingSum& pending,
                 const float* w, const float* b) {
  const int64_t rows = local_rows(), width = config_.width;
  const float eps = config_.norm_eps;
  Backend& be = *backend_;
  if (w == nullptr) {  // no norm (model.pre_norms false): the branch reads x itself (out is x)
    if (pending.pending()) be.Add(x, pending.a, pending.b, rows * width);
  } else if (config_.family == ModelFamily::kGpt2) {
    if (pending.pending()) {
      be.AddLayerNorm(x, out, mean, rstd, pending.a, pending.b, w, b, rows, width, eps);
    } else {
      be.LayerNorm(out, mean, rstd, x, w, b, rows, width, eps);
    }
  } else if (pending.pending()) {
    be.AddRmsNorm(x, out, rstd, pending.a, pending.b, w, rows, width, eps);
  } else {
    be.RmsNorm(out, rstd, x, w, rows, width, eps);
  }
}

const Act* Model::AttentionInput(const LayerActivations& la, int layer) const {
  if (config_.pre_norms || sp_) return la.ln1.data();
  return acts_->resid[layer - stage().first_layer].data();
}

const Act* Model::MlpInput(const LayerActivations& la) const {
  return config_.pre_norms || sp_ ? la.ln2.data() : la.mid.data();
}

void Model::MlpForward(int layer, LayerActivations& la) {
  const int g = layout_.block_group(layer);
  const BlockOffsets& o = layout_.block(layer);
  const int64_t n = int64_t{acts_->b} * acts_->t, width = config_.width;
  const int64_t ffn = o.mlp_ffn / tp_size();
  Backend& be = *backend_;
  if (config_.family == ModelFamily::kGpt2) {
    be.LinearGelu(la.act.data(), la.fc.data(), MlpInput(la), P(g, o.fc_w), P(g, o.fc_b), n, ffn,
                  width);
  } else {
    be.Linear(la.fc.data(), MlpInput(la), P(g, o.fc_w), nullptr, n, 2 * ffn, width);
    be.Glu(la.act.data(), la.fc.data(), n, ffn, kernels::GluGateOf(config_.geglu));
  }
  be.Linear(acts_->tmp.data(), la.act.data(), P(g, o.mlp_proj_w), RowParallelBias(g, o.mlp_proj_b),
            n, width, ffn);
}

// An MoE block's routing and its experts' rows for `n` tokens (at most n · top_k picks: dropless).
void Model::AllocateExperts(LayerActivations& la, int64_t n) {
  LayerActivations::Experts& m = la.moe;
  const config::MoeConfig& moe = config_.moe;
  const int64_t picks = n * moe.top_k, width = config_.width, ffn = moe.ffn / tp_size();
  const int64_t fc = config_.family == ModelFamily::kGpt2 ? ffn : 2 * ffn;
  Backend& be = *backend_;
  m.logits = be.AllocFloat(n * moe.experts);
  if (moe.shared_gate) m.shared_gate = be.AllocFloat(n);
  m.source = be.AllocInt(picks);
  m.slot = be.AllocInt(picks);
  m.row_weight = be.AllocFloat(picks);
  m.weight = be.AllocFloat(picks);
  m.in = be.AllocAct(picks * width);
  m.fc = be.AllocAct(picks * fc);
  m.act = be.AllocAct(picks * ffn);
  m.out = be.AllocAct(picks * width);
}

Model::MlpSizes Model::MlpSizesOf(int saved_layer) const {
  MlpSizes sizes;
  for (const PipelineStage& chunk : layout_.chunks()) {
    for (int l = chunk.first_layer; l < chunk.first_layer + chunk.num_layers; ++l) {
      // Slot i serves each chunk's i-th block in a training pass; slot 0 serves every block when
      // recomputing and in forward-only passes.
      if (saved_layer != 0 && l - chunk.first_layer != saved_layer) continue;
      const BlockOffsets& o = layout_.block(l);
      const int64_t ffn = o.mlp_ffn / tp_size();
      sizes.ffn = std::max(sizes.ffn, ffn);
      sizes.fc = std::max(sizes.fc, config_.family == ModelFamily::kGpt2 ? ffn : 2 * ffn);
      sizes.moe = sizes.moe || o.moe;
    }
  }
  return sizes;
}

// On entry dx holds ∂loss/∂(block output); on return, ∂loss/∂(block input). The block's
// parameter group must be held by the caller. With a split backward, the weight gradients are
// left to BlockWeightGradients: this pass keeps what they need instead.
absl::Status Model::BlockBackward(int layer, LayerActivations& la, Act* dx) {
  const int g = layout_.block_group(layer);
  const int li = layer - stage().first_layer;
  Activations::DeferredGrads* deferred = split_ ? &acts_->deferred[li] : nullptr;
  const BlockOffsets& o = layout_.block(layer);
  // A split backward defers the weight gradients, but not an MoE block's router's or shared
  // experts' gate's, nor latent attention's projections': such a block's input pass writes to
  // the group's gradients too.
  if (!split_ || o.moe || o.shared_gate_w >= 0 || o.qkv_w < 0) {
    TY_ASSIGN_OR_RETURN(group_grads_[g], source_->Gradients(g));
  }
  Activations& a = *acts_;
  const auto& c = config_;
  const int64_t n = int64_t{a.b} * a.t, width = c.width;
  const int64_t attn = dims_.attn;
  const AttentionShape shape = AttentionOf(layer);
  const bool gpt2 = c.family == ModelFamily::kGpt2;
  const int64_t ffn = o.mlp_ffn / tp_size(), fc = gpt2 ? ffn : 2 * ffn;
  Act* dln = sp_ ? a.dln_local.data() : a.dln.data();
  Backend& be = *backend_;
  // Under sequence parallelism each rank sees only its rows of the norms: their gradients for
  // this micro-batch are collected in scratch, summed over the group, then accumulated; so are
  // they with a split backward, until the weight pass. Slots in BlockNorms' order.
  const int post = c.pre_norms ? 4 : 0;
  NormGrads ln1 = NormGradTargets(g, o.ln1_w, o.ln1_b, 0);
  NormGrads ln2 = NormGradTargets(g, o.ln2_w, o.ln2_b, 2);
  const NormGrads attn_post = NormGradTargets(g, o.attn_post_w, -1, post);
  const NormGrads mlp_post = NormGradTargets(g, o.mlp_post_w, -1, post + 2);
  // A linear's weight and bias gradients here, or (split) its output gradient saved for later.
  auto weight_grads = [&](int64_t w, int64_t b, Buffer<Act> Activations::DeferredGrads::*keep,
                          const Act* dy, int64_t count) -> std::pair<float*, float*> {
    if (!split_) return {G(g, w), G(g, b)};
    be.Copy((deferred->*keep).data(), dy, count);
    return {nullptr, nullptr};
  };

  // MLP branch: out = mid + proj(act(fc(norm2(mid)))). The gradient of the rows' reduction is
  // the gathered gradient, which also gives the (replicated) bias its whole-batch gradient.
  // With post_norms the branch's output is normed first: its gradient goes back through that.
  TY_ASSIGN_OR_RETURN(Act * dx_full,
                      BranchGradient(P(g, o.mlp_post_w), mlp_post.weight, la.mlp_out.data(),
                                     la.mlp_post_rstd.data(), dx));
  float *dw = nullptr, *db = nullptr;
  if (o.mlp_ffn > 0) {  // the dense MLP or an MoE block's shared experts
    // A gated MLP's output gradient is the gate's times the branch's.
    const bool gated = o.shared_gate_w >= 0;
    const Act* dy = dx_full;
    if (gated) {
      be.GatherRows(a.moe_dshared.data(), dx_full, nullptr, la.moe.shared_gate.data(), n, width);
      dy = a.moe_dshared.data();
    }
    std::tie(dw, db) = weight_grads(o.mlp_proj_w, o.mlp_proj_b,
                                    &Activations::DeferredGrads::mlp_proj_dy, dy, n * width);
    be.LinearBackward(a.dact.data(), dw, db, dy, la.act.data(), P(g, o.mlp_proj_w), n, width, ffn);
    if (gpt2) {
      be.GeluBackward(a.dfc.data(), a.dact.data(), la.fc.data(), n * ffn);
    } else {
      be.GluBackward(a.dfc.data(), a.dact.data(), la.fc.data(), n, ffn,
                     kernels::GluGateOf(config_.geglu));
    }
    std::tie(dw, db) =
        weight_grads(o.fc_w, o.fc_b, &Activations::DeferredGrads::fc_dy, a.dfc.data(), n * fc);
    be.LinearBackward(a.dln.data(), dw, db, a.dfc.data(), MlpInput(la), P(g, o.fc_w), n, fc, width);
    if (gated) TY_RETURN_IF_ERROR(SharedGateBackward(layer, la));
  }
  // The routed experts' and the router's weight gradients are not deferred by a split backward.
  if (o.moe) TY_RETURN_IF_ERROR(MoeBackward(layer, la, dx_full, /*accumulate=*/o.mlp_ffn > 0));
  TY_RETURN_IF_ERROR(SumToLocalRows(a.dln.data(), dln, width));  // column-parallel input's grad
  NormBackward(dx, ln2, dln, la.mid.data(), P(g, o.ln2_w), la.ln2_mean.data(), la.ln2_rstd.data());

  // Attention branch: mid = x + proj(attention(rope(qkv(norm1(x))))).
  TY_ASSIGN_OR_RETURN(dx_full, BranchGradient(P(g, o.attn_post_w), attn_post.weight,
                                              la.attn_out.data(), la.attn_post_rstd.data(), dx));
  std::tie(dw, db) =
      weight_grads(o.proj_w, o.proj_b, &Activations::DeferredGrads::proj_dy, dx_full, n * width);
  be.LinearBackward(a.datt.data(), dw, db, dx_full, la.att.data(), P(g, o.proj_w), n, width, attn);
  if (cp_.enabled()) {
    TY_RETURN_IF_ERROR(cp_.AttentionBackward(a.dqkv.data(), a.datt.data(), la.qkv.data(),
                                             la.att.data(), la.lse.data(), shape));
  } else {
    be.AttentionBackward(a.dqkv.data(), a.datt.data(), la.qkv.data(), la.att.data(), la.lse.data(),
                         shape);
  }
  if (!gpt2) Rotate(layer, a.dqkv.data(), /*backward=*/true);
  if (c.qk_norm) {
    TY_RETURN_IF_ERROR(
        HeadNormsBackward(layer, la, deferred != nullptr ? deferred->head_norms.data() : nullptr));
  }
  TY_RETURN_IF_ERROR(QkvBackward(layer, la));
  TY_RETURN_IF_ERROR(SumToLocalRows(a.dln.data(), dln, width));
  NormBackward(dx, ln1, dln, a.resid[li].data(), P(g, o.ln1_w), la.ln1_mean.data(),
               la.ln1_rstd.data());
  if (split_) return absl::OkStatus();
  if (sp_) {
    TY_RETURN_IF_ERROR(AddNormGrads(g, a.norm_scratch.data(), BlockNorms(o)));
  }
  return source_->GradientsReady(g);
}

// The weight pass of a split backward for one block: the four linears' weight and bias gradients
// from the output gradients the input-gradient pass kept and the saved activations, and the
// norms' gradients it collected. Needs no parameters.
absl::Status Model::BlockWeightGradients(int layer) {
  const int g = layout_.block_group(layer);
  const int li = layer - stage().first_layer;
  Activations& a = *acts_;
  const LayerActivations& la = a.layers[li];
  Activations::DeferredGrads& d = a.deferred[li];
  TY_ASSIGN_OR_RETURN(group_grads_[g], source_->Gradients(g));
  const auto& c = config_;
  const BlockOffsets& o = layout_.block(layer);
  const int64_t n = int64_t{a.b} * a.t, width = c.width;
  const int64_t ffn = o.mlp_ffn / tp_size();
  const int64_t fc = c.family == ModelFamily::kGpt2 ? ffn : 2 * ffn;
  Backend& be = *backend_;
  if (o.mlp_ffn > 0) {
    be.LinearBackward(nullptr, G(g, o.mlp_proj_w), G(g, o.mlp_proj_b), d.mlp_proj_dy.data(),
                      la.act.data(), nullptr, n, width, ffn);
    be.LinearBackward(nullptr, G(g, o.fc_w), G(g, o.fc_b), d.fc_dy.data(), MlpInput(la), nullptr, n,
                      fc, width);
  }
  be.LinearBackward(nullptr, G(g, o.proj_w), G(g, o.proj_b), d.proj_dy.data(), la.att.data(),
                    nullptr, n, width, dims_.attn);
  if (o.qkv_w >= 0) {  // latent attention's projections had theirs in the input pass
    be.LinearBackward(nullptr, G(g, o.qkv_w), G(g, o.qkv_b), d.qkv_dy.data(),
                      AttentionInput(la, layer), nullptr, n, dims_.qkv_width, width);
  }
  TY_RETURN_IF_ERROR(AddNormGrads(g, d.norms.data(), BlockNorms(o)));
  if (c.qk_norm) AddHeadNormGrads(g, o, d.head_norms.data());
  // An MoE block's experts got their gradients in the input pass (MoeBackward), into the
  // buffer the source handed out then, which later input passes may have added to before this
  // one's weight pass: asked for again here (a fresh one once the last went off).
  if (const int eg = layout_.expert_group(layer); eg >= 0) {
    TY_RETURN_IF_ERROR(source_->Gradients(eg).status());
    TY_RETURN_IF_ERROR(source_->GradientsReady(eg));
  }
  return source_->GradientsReady(g);
}

absl::Status Model::FinalNorm(const PendingSum& residual) {
  Activations& a = *acts_;
  const int g = layout_.final_group();
  Act* out = sp_ ? a.lnf_local.data() : a.lnf.data();
  Norm(out, a.lnf_mean.data(), a.lnf_rstd.data(), a.resid[stage().num_layers].data(), residual,
       P(g, layout_.lnf_w()), P(g, layout_.lnf_b()));
  // Granite's logits_scaling divides the logits: the head's input carries it (one pass over the
  // rows' width rather than over their vocabulary).
  if (const float s = config_.logits_scaling; s != 1.0f) {
    backend_->ScaleAct(out, out, local_rows() * config_.width, 1.0f / s);
  }
  return ToFullRows(out, a.lnf.data(), config_.width);
}

absl::Status Model::FinalNormBackward(Act* dx) {
  Activations& a = *acts_;
  const int g = layout_.final_group();
  TY_ASSIGN_OR_RETURN(group_grads_[g], source_->Gradients(g));
  const int64_t nr = local_rows();
  const Act* x = a.resid[stage().num_layers].data();
  Act* dlnf = sp_ ? a.dlnf_local.data() : a.dlnf.data();
  if (const float s = config_.logits_scaling; s != 1.0f) {
    backend_->ScaleAct(dlnf, dlnf, nr * config_.width, 1.0f / s);
  }
  NormGrads lnf = NormGradTargets(g, layout_.lnf_w(), layout_.lnf_b(), 0);
  if (config_.family == ModelFamily::kGpt2) {
    backend_->LayerNormBackward(dx, lnf.weight, lnf.bias, dlnf, x, P(g, layout_.lnf_w()),
                                a.lnf_mean.data(), a.lnf_rstd.data(), nr, config_.width);
  } else {
    backend_->RmsNormBackward(dx, lnf.weight, dlnf, x, P(g, layout_.lnf_w()), a.lnf_rstd.data(), nr,
                              config_.width);
  }
  if (!sp_) return absl::OkStatus();
  return AddNormGrads(g, a.norm_scratch.data(), {{layout_.lnf_w(), layout_.lnf_b()}});
}

// Sequence parallelism moves the residual stream between "local rows" (this rank's n / tp rows)
// and "full rows" (all n, as the tensor-parallel matmuls need them). Without it every rank holds
// all rows and the two helpers reduce to tensor parallelism's all-reduce (or nothing).
absl::Status Model::ToFullRows(Act* local, Act* full, int64_t cols) {
  return tp_.ToFullRows(local, full, local_rows() * cols);
}

absl::Status Model::SumToLocalRows(Act* full, Act* local, int64_t cols) {
  return tp_.SumToLocalRows(full, local, int64_t{acts_->b} * acts_->t * cols);
}

// The shared experts' gate's backward for block `layer`, after its MLP's (a.dact holds the
// gradient at the hidden activation through the gated output, a.dln the MLP input's): this rank's
// share of the MLP's hidden units gives part of each row's logit gradient, summed over the
// tensor-parallel group; the gate's weight gradient (replicated, as the router's, and not deferred
// by a split backward either) and, on the group's rank 0, its input's follow.
absl::Status Model::SharedGateBackward(int layer, const LayerActivations& la) {
  Activations& a = *acts_;
  const int g = layout_.block_group(layer);
  const BlockOffsets& o = layout_.block(layer);
  const int64_t n = int64_t{a.b} * a.t, width = config_.width;
  float* dlogits = a.moe_dgate.data();
  backend_->SigmoidGateBackward(dlogits, la.moe.shared_gate.data(), la.act.data(), a.dact.data(), n,
                                o.mlp_ffn / tp_size());
  if (tp_size() > 1) TY_RETURN_IF_ERROR(tp_.AllReduce(dlogits, n));
  backend_->LinearF32Backward(tp_rank() == 0 ? a.dln.data() : nullptr, G(g, o.shared_gate_w),
                              dlogits, MlpInput(la), P(g, o.shared_gate_w), n, 1, width);
  return absl::OkStatus();
}

HeadNormShape Model::HeadNorms(int64_t rows) const {
  return HeadNormsOf(config_, rows, tp_size(), tp_rank());
}

GroupSum Model::TpSum() {
  return [this](float* data, int64_t count) { return tp_.AllReduce(data, count); };
}

// The query and key norms' backward for block `layer` (dqkv holds the gradient at their
// outputs). This rank's heads give part of their weights' gradients: summed over the tensor-
// parallel group, then added to the block's gradients (with a split backward, kept for its
// weight pass in `deferred`).
absl::Status Model::HeadNormsBackward(int layer, const LayerActivations& la, float* deferred) {
  Activations& a = *acts_;
  const int g = layout_.block_group(layer);
  const BlockOffsets& o = layout_.block(layer);
  const int64_t q = config_.q_norm_width(), count = q + config_.k_norm_width();
  float* grads = deferred != nullptr ? deferred : a.head_norm_grads.data();
  backend_->Fill(grads, 0.0f, count);
  TY_RETURN_IF_ERROR(HeadNormBackward(
      *backend_, a.dqkv.data(), grads, grads + q, la.qk_pre.data(), la.qk_rstd.data(),
      a.head_norm_scratch.data(), P(g, o.q_norm_w), P(g, o.k_norm_w), HeadNorms(int64_t{a.b} * a.t),
      a.head_norm_dots.data(), TpSum()));
  if (tp_size() > 1) TY_RETURN_IF_ERROR(tp_.AllReduce(grads, count));
  if (deferred == nullptr) AddHeadNormGrads(g, o, grads);
  return absl::OkStatus();
}

void Model::AddHeadNormGrads(int group, const BlockOffsets& o, const float* grads) {
  const int64_t q = config_.q_norm_width(), k = config_.k_norm_width();
  backend_->Add(G(group, o.q_norm_w), G(group, o.q_norm_w), grads, q);
  backend_->Add(G(group, o.k_norm_w), G(group, o.k_norm_w), grads + q, k);
}

// A split backward's buffers from each block's input-gradient pass to its weight pass.
void Model::AllocateDeferred(Activations& a, int64_t n) {
  const auto& c = config_;
  const int64_t width = c.width;
  Backend& be = *backend_;
  for (int l = 0; l < stage().num_layers; ++l) {
    Activations::DeferredGrads d;
    d.mlp_proj_dy = be.AllocAct(n * width);
    d.fc_dy = be.AllocAct(n * MlpSizesOf(l).fc);
    d.proj_dy = be.AllocAct(n * width);
    if (!c.latent.enabled()) d.qkv_dy = be.AllocAct(n * dims_.qkv_width);
    d.norms = be.AllocFloat(NormScratch());
    if (c.qk_norm) d.head_norms = be.AllocFloat(c.q_norm_width() + c.k_norm_width());
    a.deferred.push_back(std::move(d));
  }
  // A slot serves every chunk of the rank: the embedding chunk's gradient buffer is in all.
  if (layout_.first()) a.embedding_dy = be.AllocAct(n * width);
}

// A block's norms' (weight, bias) offsets, in the order of their gradients' scratch slots.
std::vector<std::pair<int64_t, int64_t>> Model::BlockNorms(const BlockOffsets& o) {
  std::vector<std::pair<int64_t, int64_t>> norms;
  if (o.ln1_w >= 0) norms.insert(norms.end(), {{o.ln1_w, o.ln1_b}, {o.ln2_w, o.ln2_b}});
  if (o.attn_post_w >= 0) norms.insert(norms.end(), {{o.attn_post_w, -1}, {o.mlp_post_w, -1}});
  return norms;
}

Model::NormGrads Model::NormGradTargets(int group, int64_t weight, int64_t bias, int slot) {
  if (weight < 0) return {};  // a norm the block does not have
  // A block's norms under a split backward collect in the block's deferred scratch; the final
  // norm's gradients are never deferred.
  int block = -1;  // the block's index on this stage, if `group` is a block's
  for (int i = 0; i < stage().num_layers; ++i) {
    if (layout_.block_group(stage().first_layer + i) == group) block = i;
  }
  const bool deferred = split_ && block >= 0;
  if (!sp_ && !deferred) return {G(group, weight), G(group, bias)};
  float* scratch =
      (deferred ? acts_->deferred[block].norms : acts_->norm_scratch).data() + slot * config_.width;
  backend_->Fill(scratch, 0.0f, 2 * config_.width);
  return {scratch, bias >= 0 ? scratch + config_.width : nullptr};
}

absl::Status Model::AddNormGrads(int group, float* scratch,
                                 const std::vector<std::pair<int64_t, int64_t>>& norms) {
  const int64_t width = config_.width;
  if (sp_)
    TY_RETURN_IF_ERROR(tp_.AllReduce(scratch, 2 * width * static_cast<int64_t>(norms.size())));
  for (const auto& [weight, bias] : norms) {
    backend_->Add(G(group, weight), G(group, weight), scratch, width);
    if (bias >= 0) backend_->Add(G(group, bias), G(group, bias), scratch + width, width);
    scratch += 2 * width;
  }
  return absl::OkStatus();
}

int64_t Model::local_rows() const {
  const int64_t n = int64_t{acts_->b} * acts_->t;
  return tp_.LocalRows(n);
}

absl::Status Model::ChunkedLoss(float grad_scale, bool with_grad, DeviceSum* loss) {
  if (tp_size() > 1) return VocabParallelLoss(grad_scale, with_grad, loss);
  Activations& a = *acts_;
  const int hg = layout_.head_group();
  TY_ASSIGN_OR_RETURN(auto hold, Hold::Acquire(this, hg));
  if (with_grad) {
    TY_ASSIGN_OR_RETURN(group_grads_[hg], source_->Gradients(hg));
  }
  const int64_t n = int64_t{a.b} * a.t, width = config_.width, vocab = dims_.vocab;
  const int64_t padded = head_.vocab;  // the logits' row stride; columns past vocab are masked
  const float cap = config_.logit_softcap;
  const float z_loss = with_grad ? config_.z_loss_coeff : 0.0f;
  float* lse = z_loss > 0.0f ? a.ce_lse.data() : nullptr;  // the rows' log-sum-exps, for Σ lse²
  const int64_t chunk = a.logits.size() / padded;
  const float* head = P(hg, layout_.lm_head());
  float* dhead = with_grad ? G(hg, layout_.lm_head()) : nullptr;
  if (padded != vocab) PadHead(&head, with_grad ? &dhead : nullptr);
  const HeldWeight held(backend_, head, padded * width);  // unchanged until the last backward
  for (int64_t r0 = 0; r0 < n; r0 += chunk) {
    const int64_t rows = std::min(chunk, n - r0);
    const Act* h = backend_->At(a.lnf.data(), r0 * width);
    backend_->Linear(a.logits.data(), h, head, nullptr, rows, padded, width);
    if (cap > 0.0f) backend_->SoftCap(a.logits.data(), rows, vocab, padded, cap);
    backend_->SoftmaxCrossEntropy(a.logits.data(), a.targets.data() + r0, rows, vocab, padded,
                                  grad_scale, with_grad, cap, z_loss, lse, loss);
    if (lse != nullptr) backend_->AddSumOfSquares({{lse, rows}}, train_lse_squares_.get());
    if (with_grad) {
      backend_->LinearBackward(backend_->At(a.dlnf.data(), r0 * width), dhead, nullptr,
                               a.logits.data(), h, head, rows, padded, width);
    }
  }
  if (with_grad && padded != vocab) {
    backend_->Copy(G(hg, layout_.lm_head()), head_.grad.data(), vocab * width);
  }
  return absl::OkStatus();
}

void Model::PadHead(const float** head, float** dhead) {
  const int64_t count = dims_.vocab * config_.width;
  backend_->Copy(head_.weight.data(), *head, count);
  *head = head_.weight.data();
  if (dhead == nullptr) return;
  backend_->Copy(head_.grad.data(), *dhead, count);  // accumulated onto, then copied back
  *dhead = head_.grad.data();
}

// Cross-entropy with the LM head split by vocabulary: each rank has logits for its shard of the
// vocabulary; per row, the shards' (max, Σexp, target logit) are all-gathered and merged into the
// full log-sum-exp, and each rank writes the gradient of its own logits. No rank ever holds a
// full row of logits, and nothing leaves the backend's memory: the statistics are gathered where
// they are computed and the rows' losses stay in the loss's DeviceSum.
absl::Status Model::VocabParallelLoss(float grad_scale, bool with_grad, DeviceSum* loss) {
  Activations& a = *acts_;
  const int hg = layout_.head_group();
  TY_ASSIGN_OR_RETURN(auto hold, Hold::Acquire(this, hg));
  if (with_grad) {
    TY_ASSIGN_OR_RETURN(group_grads_[hg], source_->Gradients(hg));
  }
  const int64_t n = int64_t{a.b} * a.t, width = config_.width, vocab = dims_.vocab;
  const int64_t chunk = a.logits.size() / vocab;
  const float cap = config_.logit_softcap;
  const float* head = P(hg, layout_.lm_head());
  const HeldWeight held(backend_, head, vocab * width);
  for (int64_t r0 = 0; r0 < n; r0 += chunk) {
    const int64_t rows = std::min(chunk, n - r0);
    const Act* h = backend_->At(a.lnf.data(), r0 * width);
    backend_->Linear(a.logits.data(), h, head, nullptr, rows, vocab, width);
    if (cap > 0.0f) backend_->SoftCap(a.logits.data(), rows, vocab, vocab, cap);
    backend_->CrossEntropyShardStats(a.logits.data(), a.local_targets.data() + r0, rows, vocab,
                                     a.ce_stats.data());
    TY_RETURN_IF_ERROR(tp_.AllGather(a.ce_stats.data(), a.ce_gathered.data(), chunk * 3));
    backend_->CrossEntropyMergeShardStats(a.ce_gathered.data(), tp_size(), chunk, rows,
                                          a.ce_lse.data(), loss);
    if (with_grad) {
      const float z_loss = config_.z_loss_coeff;
      backend_->CrossEntropyShardGrad(a.logits.data(), a.local_targets.data() + r0, a.ce_lse.data(),
                                      rows, vocab, grad_scale, cap, z_loss);
      if (z_loss > 0.0f) {
        backend_->AddSumOfSquares({{a.ce_lse.data(), rows}}, train_lse_squares_.get());
      }
      backend_->LinearBackward(backend_->At(a.dlnf.data(), r0 * width), G(hg, layout_.lm_head()),
                               nullptr, a.logits.data(), h, head, rows, vocab, width);
    }
  }
  if (with_grad) {
    TY_RETURN_IF_ERROR(
        SumToLocalRows(a.dlnf.data(), sp_ ? a.dlnf_local.data() : a.dlnf.data(), width));
  }
  return absl::OkStatus();
}

absl::StatusOr<double> Model::ForwardBackward(const int32_t* inputs, const int32_t* targets, int b,
                                              int t, float grad_scale) {
  if (!layout_.first() || !layout_.last()) {
    return absl::FailedPreconditionError("ForwardBackward runs a whole model; use StageForward");
  }
  TY_RETURN_IF_ERROR(StageForward({}, inputs, targets, b, t, nullptr, grad_scale, nullptr));
  TY_RETURN_IF_ERROR(StageBackward({}, nullptr, nullptr));
  return TakeTrainingLoss();
}

absl::Status Model::StageForward(StageSlot at, const int32_t* inputs, const int32_t* targets, int b,
                                 int t, const Act* input_acts, float grad_scale, Act* output_acts) {
  SelectSlot(at);
  const PipelineStage& stage = this->stage();
  if (stage.last && targets == nullptr) return absl::InvalidArgumentError("targets are required");
  TimedSpan forward(forward_timer_.get());
  TY_RETURN_IF_ERROR(Prepare(inputs, stage.last ? targets : nullptr, b, t));
  std::fill(group_grads_.begin(), group_grads_.end(), nullptr);
  Activations& a = *acts_;
  a.grad_scale = grad_scale;
  training_pass_ = true;
  if (!stage.last) {
    std::unique_ptr<Hold> none;
    TY_RETURN_IF_ERROR(Forward(/*keep_layer_activations=*/!config_.recompute, &none, input_acts));
    backend_->Copy(output_acts, a.resid[stage.num_layers].data(), local_rows() * config_.width);
    return absl::OkStatus();
  }
  // The last stage runs its whole backward at once: the loss's gradient is known as soon as
  // the loss is.
  Act* dx = a.dx.data();
  std::optional<TimedSpan> backward;
  {
    std::unique_ptr<Hold> final_hold;
    TY_RETURN_IF_ERROR(
        Forward(/*keep_layer_activations=*/!config_.recompute, &final_hold, input_acts));
    TY_RETURN_IF_ERROR(ChunkedLoss(grad_scale, /*with_grad=*/true, train_loss_.get()));
    forward.End();
    backward.emplace(backward_timer_.get());
    backend_->Fill(dx, 0.0f, a.dx.size());
    TY_RETURN_IF_ERROR(FinalNormBackward(dx));
    // Complete now: a tied head on the first stage lives in the embedding group, finished last.
    TY_RETURN_IF_ERROR(source_->GradientsReady(layout_.final_group()));
  }
  return BackwardBlocks(dx);
}

absl::Status Model::StageBackward(StageSlot at, const Act* doutput, Act* dinput) {
  SelectSlot(at);
  const PipelineStage& stage = this->stage();
  TimedSpan backward(backward_timer_.get());
  Activations& a = *acts_;
  const int64_t rows = local_rows();
  if (!stage.last) {
    std::fill(group_grads_.begin(), group_grads_.end(), nullptr);
    backend_->Copy(a.dx.data(), doutput, rows * config_.width);
    TY_RETURN_IF_ERROR(BackwardBlocks(a.dx.data()));
  }
  if (!stage.first) backend_->Copy(dinput, a.dx.data(), rows * config_.width);
  return absl::OkStatus();
}

absl::Status Model::StageWeightGradients(StageSlot at) {
  if (!split_) return absl::FailedPreconditionError("weight passes need a split backward");
  SelectSlot(at);
  const PipelineStage& stage = this->stage();
  TimedSpan backward(backward_timer_.get());
  std::fill(group_grads_.begin(), group_grads_.end(), nullptr);
  for (int l = stage.first_layer + stage.num_layers - 1; l >= stage.first_layer; --l) {
    TY_RETURN_IF_ERROR(BlockWeightGradients(l));
  }
  if (stage.first) TY_RETURN_IF_ERROR(EmbeddingBackward(acts_->embedding_dy.data()));
  return absl::OkStatus();
}

absl::StatusOr<Model::PhaseSeconds> Model::TakePhaseSeconds() {
  PhaseSeconds seconds;
  TY_ASSIGN_OR_RETURN(seconds.forward, forward_timer_->Take());
  TY_ASSIGN_OR_RETURN(seconds.backward, backward_timer_->Take());
  return seconds;
}

absl::StatusOr<double> Model::StageLoss(int chunk, const int32_t* inputs, const int32_t* targets,
                                        int b, int t, const Act* input_acts, Act* output_acts) {
  SelectSlot({.chunk = chunk, .slot = 0});
  const PipelineStage& stage = this->stage();
  TY_RETURN_IF_ERROR(Prepare(inputs, stage.last ? targets : nullptr, b, t));
  std::unique_ptr<Hold> final_hold;
  training_pass_ = false;
  TY_RETURN_IF_ERROR(Forward(/*keep_layer_activations=*/false, &final_hold, input_acts));
  if (!stage.last) {
    backend_->Copy(output_acts, acts_->resid[stage.num_layers].data(),
                   local_rows() * config_.width);
    TY_RETURN_IF_ERROR(backend_->Synchronize());
    return 0.0;
  }
  TY_RETURN_IF_ERROR(ChunkedLoss(0.0f, /*with_grad=*/false, eval_loss_.get()));
  return eval_loss_->Take();
}

void Model::SelectSlot(StageSlot at) {
  TY_CHECK(at.chunk >= 0 && at.chunk < static_cast<int>(layout_.chunks().size()))
      << "model chunk " << at.chunk << " of " << layout_.chunks().size();
  chunk_ = at.chunk;
  if (at.slot >= static_cast<int>(slots_.size())) slots_.resize(at.slot + 1);
  current_slot_ = at.slot;
  acts_ = slots_[at.slot].get();
}

absl::StatusOr<double> Model::Loss(const int32_t* inputs, const int32_t* targets, int b, int t) {
  if (targets == nullptr) return absl::InvalidArgumentError("targets are required");
  if (!layout_.first() || !layout_.last()) {
    return absl::FailedPreconditionError("Loss runs a whole model; use StageLoss");
  }
  return StageLoss(0, inputs, targets, b, t, nullptr, nullptr);
}

absl::Status Model::Logits(const int32_t* inputs, int b, int t, float* host_logits) {
  if (tp_size() > 1 || cp_.enabled()) {
    return absl::UnimplementedError(
        "full logits are not assembled under tensor or context parallelism");
  }
  if (!layout_.first() || !layout_.last()) {
    return absl::FailedPreconditionError("Logits runs a whole model");
  }
  SelectSlot({});
  TY_RETURN_IF_ERROR(Prepare(inputs, nullptr, b, t));
  std::unique_ptr<Hold> final_hold;
  training_pass_ = false;
  TY_RETURN_IF_ERROR(Forward(/*keep_layer_activations=*/false, &final_hold, nullptr));
  TY_ASSIGN_OR_RETURN(auto head_hold, Hold::Acquire(this, layout_.head_group()));
  Activations& a = *acts_;
  const int64_t n = int64_t{b} * t, vocab = dims_.vocab;
  const int64_t chunk = a.logits.size() / vocab;
  const float* head = P(layout_.head_group(), layout_.lm_head());
  const HeldWeight held(backend_, head, vocab * config_.width);
  for (int64_t r0 = 0; r0 < n; r0 += chunk) {
    const int64_t rows = std::min(chunk, n - r0);
    backend_->Linear(a.logits.data(), backend_->At(a.lnf.data(), r0 * config_.width), head, nullptr,
                     rows, vocab, config_.width);
    if (const float cap = config_.logit_softcap; cap > 0.0f) {
      backend_->SoftCap(a.logits.data(), rows, vocab, vocab, cap);
    }
    backend_->CopyActToHost(host_logits + r0 * vocab, a.logits.data(), rows * vocab);
  }
  return absl::OkStatus();
}

}  // namespace trainyard::worker
