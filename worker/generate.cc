#include "worker/generate.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status.h"
#include "worker/document_starts.h"
#include "worker/latent_attention.h"
#include "worker/moe_dispatch.h"
#include "worker/moe_routing.h"
#include "worker/rope.h"

namespace trainyard::worker {
namespace {

using config::ModelFamily;

// Keeps, of `ids` and their `weight`s (unnormalised probabilities, `sum` in all), the nucleus:
// the most likely ids, in order of weight (the lower id first on ties), while the weight before
// each is below top_p of the sum; the kept ids in increasing order, and their sum.
double KeepNucleus(std::vector<int32_t>& ids, std::vector<double>& weight, double sum,
                   float top_p) {
  std::vector<int> order(ids.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) {
    return weight[a] > weight[b] || (weight[a] == weight[b] && ids[a] < ids[b]);
  });
  const double limit = static_cast<double>(top_p) * sum;
  double before = 0;
  size_t keep = 0;
  while (keep < order.size() && (keep == 0 || before < limit)) before += weight[order[keep++]];
  order.resize(keep);
  std::sort(order.begin(), order.end());  // ids ascend with their index
  std::vector<int32_t> kept_ids(keep);
  std::vector<double> kept_weight(keep);
  for (size_t i = 0; i < keep; ++i) {
    kept_ids[i] = ids[order[i]];
    kept_weight[i] = weight[order[i]];
  }
  ids = std::move(kept_ids);
  weight = std::move(kept_weight);
  return before;
}

}  // namespace

int32_t ChooseToken(const std::vector<float>& logits, const SampleOptions& o,
                    std::mt19937_64& rng) {
  const int vocab = static_cast<int>(logits.size());
  if (o.temperature <= 0.0f) {
    return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  }
  std::vector<int32_t> ids(vocab);
  std::iota(ids.begin(), ids.end(), 0);
  if (o.top_k > 0 && o.top_k < vocab) {
    std::partial_sort(ids.begin(), ids.begin() + o.top_k, ids.end(), [&](int32_t a, int32_t b) {
      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    });
    ids.resize(o.top_k);
    std::sort(ids.begin(), ids.end());
  }
  double top = -INFINITY;
  for (int32_t id : ids) top = std::max(top, static_cast<double>(logits[id]));
  std::vector<double> weight(ids.size());
  double sum = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    weight[i] = std::exp((logits[ids[i]] - top) / o.temperature);
    sum += weight[i];
  }
  if (o.top_p < 1.0f) sum = KeepNucleus(ids, weight, sum, o.top_p);
  const double u = std::uniform_real_distribution<double>(0.0, sum)(rng);
  double acc = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    acc += weight[i];
    if (u < acc) return ids[i];
  }
  return ids.back();
}

Generator::Generator(const config::ModelConfig& model, Backend* backend)
    : model_(model), backend_(backend), layout_(model) {}

absl::StatusOr<std::unique_ptr<Generator>> Generator::Create(const config::ModelConfig& model,
                                                             Backend* backend,
                                                             const float* params) {
  TY_RETURN_IF_ERROR(config::ValidateModelConfig(model));
  std::unique_ptr<Generator> g(new Generator(model, backend));
  Backend& be = *backend;
  g->params_ = be.AllocFloat(g->layout_.total());
  be.CopyFromHost(g->params_.data(), params, g->layout_.total());
  g->logits_ = be.AllocAct(model.vocab);
  g->host_logits_.resize(model.vocab);
  if (model.moe.enabled()) {
    g->routing_ = model.moe;
    g->routing_.capacity_factor = 0.0f;
    g->bias_.resize(model.layers);
    for (int l = 0; l < model.layers; ++l) {
      const int64_t at = g->layout_.block(l).router_bias;
      if (at >= 0) g->bias_[l].assign(params + at, params + at + model.moe.experts);
    }
  }
  return g;
}

void Generator::Reserve(int64_t rows) {
  if (rows <= rows_) return;
  rows_ = rows;
  Backend& be = *backend_;
  const config::ModelConfig& m = model_;
  const bool gpt2 = m.family == ModelFamily::kGpt2;
  const int64_t c = m.width, kv = kv_stride();
  int64_t ffn = 0;  // the widest dense MLP (or shared experts' MLP)
  for (int l = 0; l < m.layers; ++l) ffn = std::max(ffn, layout_.block(l).mlp_ffn);
  tokens_ = be.AllocInt(rows);
  if (m.document_token >= 0) doc_starts_ = be.AllocInt(rows);
  x_ = be.AllocAct(rows * c);
  norm_ = be.AllocAct(rows * c);
  qkv_ = be.AllocAct(rows * m.qkv_width());
  attn_ = be.AllocAct(rows * m.attention_width());
  tmp_ = be.AllocAct(rows * c);
  fc_ = be.AllocAct(rows * (gpt2 ? ffn : 2 * ffn));
  act_ = be.AllocAct(rows * ffn);
  mean_ = be.AllocFloat(rows);
  rstd_ = be.AllocFloat(rows);
  lse_ = be.AllocFloat(rows * m.heads);
  if (m.qk_norm) {
    const HeadNormShape norms = HeadNormsOf(m, rows);
    head_pre_ = be.AllocAct(norms.saved());
    head_rstd_ = be.AllocFloat(norms.statistics());
    head_scratch_ = be.AllocAct(norms.scratch());
  }
  if (m.latent.enabled()) {
    const LatentShape latent = LatentShape::Of(m, rows);
    if (latent.q_rank > 0) {
      latent_q_ = be.AllocAct(rows * latent.q_rank);
      latent_q_normed_ = be.AllocAct(rows * latent.q_rank);
      latent_q_rstd_ = be.AllocFloat(rows);
    }
    latent_kv_ = be.AllocAct(rows * latent.kv_rank);
    latent_kv_normed_ = be.AllocAct(rows * latent.kv_rank);
    latent_kv_rstd_ = be.AllocFloat(rows);
    latent_scratch_ = be.AllocAct(latent.scratch());
  }
  keys_.clear();
  values_.clear();
  latents_.clear();
  for (int l = 0; l < (m.latent.enabled() ? 1 : m.layers); ++l) {
    keys_.push_back(be.AllocAct(rows * kv));
    values_.push_back(be.AllocAct(rows * kv));
  }
  if (m.latent.enabled()) {
    const LatentShape latent = LatentShape::Of(m, rows);
    for (int l = 0; l < m.layers; ++l) {
      latents_.push_back(be.AllocAct(rows * latent.latent_width()));
    }
    absorbed_q_ = be.AllocAct(latent.heads * latent.latent_width());
    absorbed_out_ = be.AllocAct(latent.heads * latent.kv_rank);
  }
  if (!m.moe.enabled()) return;
  const config::MoeConfig& moe = m.moe;
  const int64_t picks = rows * moe.top_k, fc = gpt2 ? moe.ffn : 2 * int64_t{moe.ffn};
  router_logits_ = be.AllocFloat(rows * moe.experts);
  if (moe.shared_gate) shared_gate_ = be.AllocFloat(rows);
  host_router_logits_.resize(rows * moe.experts);
  source_ = be.AllocInt(picks);
  slot_ = be.AllocInt(picks);
  pick_weight_ = be.AllocFloat(picks);
  expert_in_ = be.AllocAct(picks * c);
  expert_fc_ = be.AllocAct(picks * fc);
  expert_act_ = be.AllocAct(picks * moe.ffn);
  expert_out_ = be.AllocAct(picks * c);
}

void Generator::RoutedExperts(int layer, int64_t n) {
  Backend& be = *backend_;
  const BlockOffsets& o = layout_.block(layer);
  const bool gpt2 = model_.family == ModelFamily::kGpt2;
  const int64_t c = model_.width, experts = routing_.experts;
  be.LinearF32(router_logits_.data(), norm_.data(), P(o.router_w), n, experts, c);
  be.CopyToHost(host_router_logits_.data(), router_logits_.data(), n * experts);
  const MoeRouting r = Route(routing_, host_router_logits_.data(), n, bias_[layer]);
  Dispatch(be, r, {.source = source_.data(), .slot = slot_.data(), .weight = pick_weight_.data()},
           norm_.data(), c, expert_in_.data());
  be.ExpertsForward(ExpertMlp{.offsets = r.offsets,
                              .width = c,
                              .ffn = routing_.ffn,
                              .gated = !gpt2,
                              .gate = kernels::GluGateOf(model_.geglu),
                              .fc_w = P(o.experts_fc_w),
                              .fc_b = gpt2 ? P(o.experts_fc_b) : nullptr,
                              .proj_w = P(o.experts_proj_w),
                              .proj_b = gpt2 ? P(o.experts_proj_b) : nullptr},
                    expert_in_.data(), expert_fc_.data(), expert_act_.data(), expert_out_.data());
  be.CombineRows(tmp_.data(), expert_out_.data(), slot_.data(), pick_weight_.data(), n,
                 routing_.top_k, c, /*accumulate=*/o.mlp_ffn > 0);
}

// norm_'s n rows to the packed qkv row in qkv_ (before RoPE): block `layer`'s projection, or its
// latent attention's (after the prompt only the queries and the latents, which the absorbed
// attention reads), and its query and key norms.
void Generator::Project(int layer, int64_t n, bool prompt) {
  Backend& be = *backend_;
  const config::ModelConfig& m = model_;
  const BlockOffsets& o = layout_.block(layer);
  if (m.latent.enabled()) {
    LatentForward(be, LatentShape::Of(m, n),
                  {P(o.q_a_w), P(o.q_a_norm_w), P(o.q_b_w), P(o.q_w), P(o.kv_a_w), P(o.kv_a_norm_w),
                   P(o.kv_b_w)},
                  norm_.data(),
                  {latent_q_.data(), latent_q_normed_.data(), latent_q_rstd_.data(),
                   latent_kv_.data(), latent_kv_normed_.data(), latent_kv_rstd_.data()},
                  latent_scratch_.data(), qkv_.data(),
                  prompt ? LatentOutput::kKeysAndValues : LatentOutput::kLatentsOnly);
  } else {
    be.Linear(qkv_.data(), norm_.data(), P(o.qkv_w), o.qkv_b >= 0 ? P(o.qkv_b) : nullptr, n,
              m.qkv_width(), m.width);
  }
  if (m.qk_norm) {
    // One rank holds every head: nothing to sum over a group, nothing that can fail.
    const absl::Status normed =
        HeadNormForward(be, qkv_.data(), head_pre_.data(), head_rstd_.data(), head_scratch_.data(),
                        P(o.q_norm_w), P(o.k_norm_w), HeadNormsOf(m, n));
    TY_CHECK(normed.ok()) << normed;
  }
}

int64_t Generator::CachePerPosition() const {
  if (model_.latent.enabled()) return model_.layers * LatentShape::Of(model_, 1).latent_width();
  return model_.layers * 2 * kv_stride();
}

void Generator::CacheLatents(int layer, int64_t n, int64_t pos) {
  Backend& be = *backend_;
  const LatentShape s = LatentShape::Of(model_, n);
  const int64_t row = s.latent_width(), qkv = model_.qkv_width();
  Act* cache = be.At(latents_[layer].data(), pos * row);
  // Every key head's rotary part is the shared rotary key: key head 0's, after RoPE.
  be.CopyRows(cache, row, be.At(qkv_.data(), s.q_width()), qkv, n, s.rope);
  be.CopyRows(be.At(cache, s.rope), row, latent_kv_normed_.data(), s.kv_rank, n, s.kv_rank);
}

void Generator::AbsorbedAttention(int layer, int64_t n, int64_t pos) {
  Backend& be = *backend_;
  const config::ModelConfig& m = model_;
  const LatentShape s = LatentShape::Of(m, 1);
  const int64_t d = s.head_dim, rope = s.rope, nope = s.nope(), dv = s.value_dim;
  const int64_t rank = s.kv_rank, row = s.latent_width(), qkv = m.qkv_width();
  // kv_b [heads · (nope + dv), kv_rank]: head h's key rows W_uk_h, then its value rows W_uv_h.
  const float* kv_b = P(layout_.block(layer).kv_b_w);
  const Act* cache = latents_[layer].data();
  for (int64_t i = 0; i < n; ++i) {
    const Act* q = be.At(qkv_.data(), i * qkv);
    be.CopyRows(absorbed_q_.data(), row, q, d, s.heads, rope);
    for (int64_t h = 0; h < s.heads; ++h) {  // q_nope_h · W_uk_h, as a linear layer's dx
      be.LinearBackward(be.At(absorbed_q_.data(), h * row + rope), nullptr, nullptr,
                        be.At(q, h * d + rope), nullptr, kv_b + h * (nope + dv) * rank, 1, nope,
                        rank);
    }
    be.AttentionBlock(
        absorbed_out_.data(), lse_.data(), absorbed_q_.data(), cache, be.At(cache, rope),
        AttentionBlockShape{.batch = 1,
                            .q_len = 1,
                            .kv_len = pos + i + 1,
                            .heads = s.heads,
                            .kv_heads = 1,
                            .head_dim = row,
                            .q_stride = s.heads * row,
                            .kv_stride = row,
                            .causal = false,
                            .offset = pos + i,
                            .window = m.WindowOf(layer),
                            .scale = m.attention_scale(),
                            .softcap = m.attention_softcap,
                            .doc_start = doc_starts_.empty() ? nullptr : doc_starts_.data() + i,
                            .value_dim = rank});
    for (int64_t h = 0; h < s.heads; ++h) {  // the head's output through W_uv_h
      be.Linear(be.At(attn_.data(), (i * s.heads + h) * dv), be.At(absorbed_out_.data(), h * rank),
                kv_b + (h * (nope + dv) + nope) * rank, nullptr, 1, dv, rank);
    }
  }
}

void Generator::Block(int layer, int64_t n, int64_t pos) {
  Backend& be = *backend_;
  const config::ModelConfig& m = model_;
  const BlockOffsets& o = layout_.block(layer);
  const bool gpt2 = m.family == ModelFamily::kGpt2;
  const int64_t c = m.width, d = m.head_dim(), qkv = m.qkv_width();
  const int64_t q = int64_t{m.heads} * d, k = int64_t{m.kv_heads} * d, ffn = o.mlp_ffn;
  const int64_t v = int64_t{m.kv_heads} * m.value_head_dim(), kv = kv_stride();
  // A branch's input: the residual stream normed, or (pre_norms false) as it is.
  auto input_norm = [&](int64_t w, int64_t b) {
    if (w < 0) {
      be.Copy(norm_.data(), x_.data(), n * c);
    } else if (gpt2) {
      be.LayerNorm(norm_.data(), mean_.data(), rstd_.data(), x_.data(), P(w), P(b), n, c,
                   m.norm_eps);
    } else {
      be.RmsNorm(norm_.data(), rstd_.data(), x_.data(), P(w), n, c, m.norm_eps);
    }
  };
  input_norm(o.ln1_w, o.ln1_b);
  const bool prompt = pos == 0;
  Project(layer, n, prompt);
  const AttentionShape shape{.batch = 1,
                             .seq = n,
                             .heads = m.heads,
                             .kv_heads = m.kv_heads,
                             .head_dim = d,
                             .value_dim = m.value_head_dim()};
  if (m.RotatesLayer(layer)) be.Rope(qkv_.data(), shape, RopeOf(m, layer, pos + n), pos);
  if (m.latent.enabled()) CacheLatents(layer, n, pos);
  // This pass's keys and values join the cache (latent attention: the prompt pass's scratch);
  // the queries attend to every cached position (causally among themselves when the prompt runs
  // as one pass), or to those in their sliding window.
  Act* keys = keys_[m.latent.enabled() ? 0 : layer].data();
  Act* values = values_[m.latent.enabled() ? 0 : layer].data();
  if (m.latent.enabled() && !prompt) {
    AbsorbedAttention(layer, n, pos);
  } else {
    be.CopyRows(be.At(keys, pos * kv), kv, be.At(qkv_.data(), q), qkv, n, k);
    be.CopyRows(be.At(values, pos * kv), kv, be.At(qkv_.data(), q + k), qkv, n, v);
    be.AttentionBlock(
        attn_.data(), lse_.data(), qkv_.data(), keys, values,
        AttentionBlockShape{.batch = 1,
                            .q_len = n,
                            .kv_len = prompt ? n : pos + n,
                            .heads = m.heads,
                            .kv_heads = m.kv_heads,
                            .head_dim = d,
                            .q_stride = qkv,
                            .kv_stride = kv,
                            .causal = prompt,
                            .offset = pos,
                            .window = m.WindowOf(layer),
                            .scale = m.attention_scale(),
                            .softcap = m.attention_softcap,
                            .doc_start = doc_starts_.empty() ? nullptr : doc_starts_.data(),
                            .value_dim = m.value_head_dim()});
  }
  // A branch's output joins the residual stream, normed first with post_norms (norm_ is free:
  // its rows have been read) and times residual_multiplier.
  auto add_branch = [&](int64_t post_w) {
    Act* branch = tmp_.data();
    if (post_w >= 0) {
      be.RmsNorm(norm_.data(), rstd_.data(), tmp_.data(), P(post_w), n, c, m.norm_eps);
      branch = norm_.data();
    }
    if (m.residual_multiplier != 1.0f) be.ScaleAct(branch, branch, n * c, m.residual_multiplier);
    be.Add(x_.data(), x_.data(), branch, n * c);
  };
  be.Linear(tmp_.data(), attn_.data(), P(o.proj_w), gpt2 ? P(o.proj_b) : nullptr, n, c,
            m.attention_width());
  add_branch(o.attn_post_w);
  input_norm(o.ln2_w, o.ln2_b);
  // The dense MLP, or an MoE block's shared experts (if any) and its routed experts.
  if (ffn > 0) {
    if (gpt2) {
      be.LinearGelu(act_.data(), fc_.data(), norm_.data(), P(o.fc_w), P(o.fc_b), n, ffn, c);
    } else {
      be.Linear(fc_.data(), norm_.data(), P(o.fc_w), nullptr, n, 2 * ffn, c);
      be.Glu(act_.data(), fc_.data(), n, ffn, kernels::GluGateOf(model_.geglu));
    }
    be.Linear(tmp_.data(), act_.data(), P(o.mlp_proj_w), gpt2 ? P(o.mlp_proj_b) : nullptr, n, c,
              ffn);
  }
  if (o.shared_gate_w >= 0) {
    GateSharedExperts(be, shared_gate_.data(), norm_.data(), P(o.shared_gate_w), tmp_.data(), n, c);
  }
  if (o.moe) RoutedExperts(layer, n);
  add_branch(o.mlp_post_w);
}

void Generator::Forward(const int32_t* tokens, int64_t n, int64_t pos) {
  Backend& be = *backend_;
  const int64_t c = model_.width;
  const bool gpt2 = model_.family == ModelFamily::kGpt2;
  be.CopyFromHost(tokens_.data(), tokens, n);
  if (model_.document_token >= 0) {  // each row's document's first position, as in training
    std::vector<int32_t> starts(n);
    doc_start_ = DocumentStarts(tokens, n, model_.document_token, pos, pos == 0 ? 0 : doc_start_,
                                starts.data());
    be.CopyFromHost(doc_starts_.data(), starts.data(), n);
  }
  be.Embedding(x_.data(), tokens_.data(), P(layout_.wte()),
               gpt2 ? P(layout_.wpe()) + pos * c : nullptr, 1, n, c, model_.embedding_scale());
  for (int l = 0; l < model_.layers; ++l) Block(l, n, pos);
  const Act* last = be.At(x_.data(), (n - 1) * c);
  if (gpt2) {
    be.LayerNorm(norm_.data(), mean_.data(), rstd_.data(), last, P(layout_.lnf_w()),
                 P(layout_.lnf_b()), 1, c, model_.norm_eps);
  } else {
    be.RmsNorm(norm_.data(), rstd_.data(), last, P(layout_.lnf_w()), 1, c, model_.norm_eps);
  }
  if (model_.logits_scaling != 1.0f) {
    be.ScaleAct(norm_.data(), norm_.data(), c, 1.0f / model_.logits_scaling);
  }
  be.Linear(logits_.data(), norm_.data(), P(layout_.lm_head()), nullptr, 1, model_.vocab, c);
  if (model_.logit_softcap > 0.0f) {
    be.SoftCap(logits_.data(), 1, model_.vocab, model_.vocab, model_.logit_softcap);
  }
  be.CopyActToHost(host_logits_.data(), logits_.data(), model_.vocab);
}

absl::Status Generator::CheckRequest(const std::vector<int32_t>& prompt,
                                     const SampleOptions& options) const {
  if (prompt.empty()) return absl::InvalidArgumentError("the prompt has no tokens");
  for (int32_t t : prompt) {
    if (t < 0 || t >= model_.vocab) {
      return absl::InvalidArgumentError(
          absl::StrCat("prompt token ", t, " is outside the vocabulary of ", model_.vocab));
    }
  }
  if (!(options.top_p > 0.0f && options.top_p <= 1.0f)) {
    return absl::InvalidArgumentError(absl::StrCat("top_p must be in (0, 1], got ", options.top_p));
  }
  const int64_t total = static_cast<int64_t>(prompt.size()) + options.tokens;
  if (total > model_.max_seq) {
    return absl::InvalidArgumentError(absl::StrCat("the prompt's ", prompt.size(), " tokens and ",
                                                   options.tokens, " new ones exceed the ",
                                                   "model's max_seq of ", model_.max_seq));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int32_t>> Generator::Generate(
    const std::vector<int32_t>& prompt, const SampleOptions& options,
    const std::function<void(int32_t)>& on_token) {
  TY_RETURN_IF_ERROR(CheckRequest(prompt, options));
  Reserve(static_cast<int64_t>(prompt.size()) + options.tokens);
  std::mt19937_64 rng(options.seed);
  std::vector<int32_t> out;
  Forward(prompt.data(), static_cast<int64_t>(prompt.size()), 0);
  // LongRoPE turns with its long factors once a pass covers more than original_max_seq
  // positions: the pass that first does runs the whole sequence again, so that the cache holds
  // no key turned with the short ones (transformers' Phi-3 generation drops its cache there).
  const config::RopeScaling& scaling = model_.rope_scaling;
  const int64_t recompute_at = scaling.longrope ? scaling.original_max_seq : -1;
  for (int i = 0; i < options.tokens; ++i) {
    const int32_t next = ChooseToken(host_logits_, options, rng);
    out.push_back(next);
    if (on_token) on_token(next);
    if (options.Stops(next)) break;
    if (i + 1 < options.tokens) {
      const int64_t pos = static_cast<int64_t>(prompt.size()) + i;
      if (pos == recompute_at) {
        std::vector<int32_t> sequence = prompt;
        sequence.insert(sequence.end(), out.begin(), out.end());
        Forward(sequence.data(), pos + 1, 0);
      } else {
        Forward(&next, 1, pos);
      }
    }
  }
  TY_RETURN_IF_ERROR(backend_->Synchronize());
  return out;
}

}  // namespace trainyard::worker
