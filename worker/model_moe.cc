// The mixture-of-experts blocks of a Model (config::MoeConfig): the router, the routed experts
// as one linear layer per expert over its contiguous rows, and their backward.
//
// Under tensor parallelism every rank of the group routes the same full rows the same way
// (the router is replicated); each expert's MLP is split as the dense MLP is (fc by rows, proj by
// columns), so expert outputs are partial sums until the block's reduction, which also sums the
// combine. A row-parallel bias is added by the group's rank 0 only, and so is the router's share
// of the input gradient; the combine weights' gradients are summed over the group.
//
// Under expert parallelism each rank of the ep group holds E / ep of the experts. A rank routes
// its own tokens; its kept rows, already expert by expert, are rank by rank too, so one
// all-to-all carries them to their experts' ranks (after an all-gather of every rank's count per
// expert), where they are put expert by expert, run, put back rank by rank and returned by a
// second all-to-all. The backward moves the experts' output gradients the same way and their
// input gradients back.
#include <algorithm>
#include <cmath>
#include <vector>

#include "common/clock.h"
#include "common/status.h"
#include "worker/model.h"
#include "worker/model_activations.h"
#include "worker/moe_dispatch.h"

namespace trainyard::worker {

using config::ModelFamily;

namespace {

// Grows `b` to at least `count` elements (keeping nothing).
void Reserve(Backend& be, Buffer<Act>& b, int64_t count) {
  if (b.size() < count) b = be.AllocAct(count);
}
void Reserve(Backend& be, Buffer<int32_t>& b, int64_t count) {
  if (b.size() < count) b = be.AllocInt(count);
}

constexpr uint32_t kExchangeTag = 0x4d6f4500;  // "MoE"

}  // namespace

// The routed experts this rank holds, each on its rows [offsets[j], offsets[j + 1]) of `in`,
// into the same rows of hidden, act and out.
void Model::RunExperts(int layer, std::span<const int64_t> offsets, const Act* in, Act* hidden,
                       Act* act, Act* out) {
  backend_->ExpertsForward(ExpertsOf(layer, offsets), in, hidden, act, out);
}

// The experts' backward on the rows RunExperts ran: weight gradients accumulated, ∂/∂in into din.
void Model::RunExpertsBackward(int layer, std::span<const int64_t> offsets, const Act* dout,
                               const Act* in, const Act* hidden, const Act* act, Act* din) {
  const int eg = layout_.expert_group(layer);
  const BlockOffsets& o = layout_.block(layer);
  const bool gpt2 = config_.family == ModelFamily::kGpt2;
  const ExpertMlpGrads grads{.fc_w = G(eg, o.experts_fc_w),
                             .fc_b = gpt2 ? G(eg, o.experts_fc_b) : nullptr,
                             .proj_w = G(eg, o.experts_proj_w),
                             .proj_b = gpt2 ? G(eg, o.experts_proj_b) : nullptr};
  backend_->ExpertsBackward(ExpertsOf(layer, offsets), grads, dout, in, hidden, act,
                            acts_->dact.data(), acts_->dfc.data(), din);
}

// Layer `layer`'s experts on this rank, over `offsets`. Under tensor parallelism each expert's
// MLP is split as the dense one is; proj's row-parallel bias is added by the group's rank 0.
ExpertMlp Model::ExpertsOf(int layer, std::span<const int64_t> offsets) {
  const int eg = layout_.expert_group(layer);
  const BlockOffsets& o = layout_.block(layer);
  const bool gpt2 = config_.family == ModelFamily::kGpt2;
  return {.offsets = offsets,
          .width = config_.width,
          .ffn = config_.moe.ffn / tp_size(),
          .gated = !gpt2,
          .gate = kernels::GluGateOf(config_.geglu),
          .fc_w = P(eg, o.experts_fc_w),
          .fc_b = gpt2 ? P(eg, o.experts_fc_b) : nullptr,
          .proj_w = P(eg, o.experts_proj_w),
          .proj_b = gpt2 ? RowParallelBias(eg, o.experts_proj_b) : nullptr};
}

// Under context parallelism the rank holds two chunks of each of the micro-batch's b sequences
// (ContextParallelOps, half-major rows: half h of sequence i is rows [(h·b + i)·c, +c)); the
// micro-batch's token order runs sequence by sequence, chunk by chunk, chunk k held by rank k
// (its half 0) or rank 2·cp − 1 − k (its half 1). One all-gather over the group carries every
// rank's picks per expert in each chunk (exact as floats below 2^24), its Σ scores and its Σ z²
// of the router z-loss (as float pairs), from which each rank finds the picks made before each of
// its chunks and the micro-batch's totals.
absl::StatusOr<MoeRouting> Model::RouteTokens(const float* logits, std::span<const float> bias) {
  const config::MoeConfig& moe = config_.moe;
  const int b = acts_->b;
  const int64_t n = int64_t{b} * acts_->t;
  if (!cp_.enabled()) return Route(moe, logits, n, bias);
  MoeRouting r = SelectExperts(moe, logits, n, bias);
  const int E = moe.experts, K = moe.top_k, ranks = cp_.size();
  const int64_t c = acts_->t / 2, runs = 2 * int64_t{b};
  const int64_t per_rank = runs * E + 2 * E + 2;
  std::vector<float> mine(per_rank, 0.0f), all(per_rank * ranks);
  for (int64_t p = 0; p < n * K; ++p) mine[p / K / c * E + r.expert[p]] += 1.0f;
  for (int e = 0; e < E; ++e) parallel::ToFloatPair(r.score_sum[e], &mine[runs * E + 2 * e]);
  parallel::ToFloatPair(r.z_sum, &mine[runs * E + 2 * E]);
  const int64_t started = RealClock()->NowNanosMonotonic();
  TY_RETURN_IF_ERROR(cp_.group()->AllGather(mine.data(), all.data(), per_rank));
  cp_routing_seconds_ += (RealClock()->NowNanosMonotonic() - started) / 1e9;

  MoeShare share{
      .batch_tokens = n * ranks, .run_rows = c, .picks_before = std::vector<int64_t>(runs * E)};
  std::vector<int64_t> batch_picks(E, 0);  // so far, in the micro-batch's token order
  for (int i = 0; i < b; ++i) {
    for (int chunk = 0; chunk < 2 * ranks; ++chunk) {
      const int half = chunk < ranks ? 0 : 1, owner = half == 0 ? chunk : 2 * ranks - 1 - chunk;
      const int64_t run = int64_t{half} * b + i;
      if (owner == cp_.rank()) {
        std::copy(batch_picks.begin(), batch_picks.end(), &share.picks_before[run * E]);
      }
      const float* counts = &all[owner * per_rank + run * E];
      for (int e = 0; e < E; ++e) batch_picks[e] += std::llround(counts[e]);
    }
  }
  std::vector<double> score_sum(E, 0.0);
  double z_sum = 0;
  for (int k = 0; k < ranks; ++k) {
    const float* sums = &all[k * per_rank + runs * E];
    for (int e = 0; e < E; ++e) score_sum[e] += parallel::FromFloatPair(&sums[2 * e]);
    z_sum += parallel::FromFloatPair(&sums[2 * E]);
  }
  KeepPicks(moe, r, share);
  Balance(moe, r, share.batch_tokens, batch_picks, score_sum, z_sum);
  return r;
}

// Under expert parallelism: who sends how many rows to whom, and the orders that put the rows
// this rank receives expert by expert and back. Every rank's count per expert is all-gathered.
absl::Status Model::PlanExchange(LayerActivations& la) {
  LayerActivations::Experts& m = la.moe;
  const MoeRouting& r = m.routing;
  const int ranks = ep_->size(), me = ep_->rank(), experts = config_.moe.experts;
  const int local = experts / ranks;
  std::vector<float> mine(experts), all(int64_t{experts} * ranks);
  for (int e = 0; e < experts; ++e) mine[e] = static_cast<float>(r.offsets[e + 1] - r.offsets[e]);
  const int64_t started = RealClock()->NowNanosMonotonic();
  TY_RETURN_IF_ERROR(ep_->AllGather(mine.data(), all.data(), experts));
  if (training_pass_) ep_seconds_ += (RealClock()->NowNanosMonotonic() - started) / 1e9;
  auto rows = [&](int rank, int expert) { return std::llround(all[rank * experts + expert]); };
  m.send_counts.assign(ranks, 0);
  m.recv_counts.assign(ranks, 0);
  for (int d = 0; d < ranks; ++d) {
    m.send_counts[d] = r.offsets[(d + 1) * local] - r.offsets[d * local];
    for (int j = 0; j < local; ++j) m.recv_counts[d] += rows(d, me * local + j);
  }
  // Received: rank by rank, each rank's rows expert by expert. Expert-major: expert by expert,
  // each expert's rows rank by rank.
  std::vector<int64_t> rank_start(ranks + 1, 0);
  for (int s = 0; s < ranks; ++s) rank_start[s + 1] = rank_start[s] + m.recv_counts[s];
  const int64_t received = rank_start[ranks];
  std::vector<int32_t> to_experts(received), from_experts(received);
  m.expert_offsets.assign(local + 1, 0);
  int64_t at = 0;
  for (int j = 0; j < local; ++j) {
    for (int s = 0; s < ranks; ++s) {
      int64_t from = rank_start[s];
      for (int k = 0; k < j; ++k) from += rows(s, me * local + k);
      for (int64_t i = 0; i < rows(s, me * local + j); ++i, ++at) {
        to_experts[at] = static_cast<int32_t>(from + i);
        from_experts[from + i] = static_cast<int32_t>(at);
      }
    }
    m.expert_offsets[j + 1] = at;
  }
  Backend& be = *backend_;
  Reserve(be, m.to_experts, received);
  Reserve(be, m.from_experts, received);
  be.CopyFromHost(m.to_experts.data(), to_experts.data(), received);
  be.CopyFromHost(m.from_experts.data(), from_experts.data(), received);
  return absl::OkStatus();
}

// One all-to-all of rows of `width` over the ep group: `forward` sends send_counts and receives
// recv_counts, the return trip the other way round. This rank's own rows are copied here.
absl::Status Model::ExchangeRows(int layer, const LayerActivations& la, bool forward, const Act* in,
                                 Act* out, int phase) {
  const LayerActivations::Experts& m = la.moe;
  const int ranks = ep_->size(), me = ep_->rank();
  const int64_t width = config_.width;
  std::vector<int64_t> send(ranks), recv(ranks);
  for (int d = 0; d < ranks; ++d) {
    send[d] = (forward ? m.send_counts[d] : m.recv_counts[d]) * width;
    recv[d] = (forward ? m.recv_counts[d] : m.send_counts[d]) * width;
  }
  int64_t send_at = 0, recv_at = 0, sent = 0;
  for (int d = 0; d < me; ++d) send_at += send[d], recv_at += recv[d];
  for (int d = 0; d < ranks; ++d) sent += d == me ? 0 : send[d];
  backend_->Copy(backend_->At(out, recv_at), backend_->At(in, send_at), send[me]);
  const int64_t started = RealClock()->NowNanosMonotonic();
  TY_RETURN_IF_ERROR(ep_->AllToAllV(in, send, out, recv, backend_->act_dtype(),
                                    kExchangeTag + 4 * static_cast<uint32_t>(layer) + phase));
  if (!training_pass_) return absl::OkStatus();
  const double seconds = (RealClock()->NowNanosMonotonic() - started) / 1e9;
  ep_seconds_ += seconds;
  if (MoeLayerStats* s = StatsOf(layer)) {
    s->exchange_seconds += seconds;
    s->exchange_bytes += sent * backend_->act_bytes();
  }
  return absl::OkStatus();
}

absl::Status Model::MoeForward(int layer, LayerActivations& la, bool accumulate) {
  const int g = layout_.block_group(layer);
  TY_ASSIGN_OR_RETURN(auto experts_hold, Hold::Acquire(this, layout_.expert_group(layer)));
  const BlockOffsets& o = layout_.block(layer);
  const config::MoeConfig& moe = config_.moe;
  const bool gpt2 = config_.family == ModelFamily::kGpt2;
  const int64_t n = int64_t{acts_->b} * acts_->t, width = config_.width, experts = moe.experts;
  const int64_t ffn = moe.ffn / tp_size(), fc = gpt2 ? ffn : 2 * ffn;
  Backend& be = *backend_;
  LayerActivations::Experts& m = la.moe;

  // Route on the host, from the fp32 logits (and the selection bias).
  be.LinearF32(m.logits.data(), MlpInput(la), P(g, o.router_w), n, experts, width);
  std::vector<float> logits(n * experts), bias;
  be.CopyToHost(logits.data(), m.logits.data(), n * experts);
  if (o.router_bias >= 0) {
    bias.resize(experts);
    be.CopyToHost(bias.data(), P(g, o.router_bias), experts);
  }
  TY_ASSIGN_OR_RETURN(m.routing, RouteTokens(logits.data(), bias));
  const MoeRouting& r = m.routing;
  if (training_pass_ && !recomputing_) RecordRouting(layer, r, bias);
  Dispatch(be, r,
           {.source = m.source.data(),
            .row_weight = m.row_weight.data(),
            .slot = m.slot.data(),
            .weight = m.weight.data()},
           MlpInput(la), width, m.in.data());

  if (ep_ == nullptr) {
    RunExperts(layer, r.offsets, m.in.data(), m.fc.data(), m.act.data(), m.out.data());
  } else {
    // To the experts' ranks, expert by expert, run, back rank by rank, and home.
    TY_RETURN_IF_ERROR(PlanExchange(la));
    const int64_t received = m.expert_offsets.back();
    Activations& a = *acts_;
    Reserve(be, a.moe_exchange, received * width);
    Reserve(be, a.moe_expert_rows, received * width);
    Reserve(be, m.expert_in, received * width);
    Reserve(be, m.expert_fc, received * fc);
    Reserve(be, m.expert_act, received * ffn);
    TY_RETURN_IF_ERROR(
        ExchangeRows(layer, la, /*forward=*/true, m.in.data(), a.moe_exchange.data(), 0));
    be.GatherRows(m.expert_in.data(), a.moe_exchange.data(), m.to_experts.data(), nullptr, received,
                  width);
    RunExperts(layer, m.expert_offsets, m.expert_in.data(), m.expert_fc.data(), m.expert_act.data(),
               a.moe_expert_rows.data());
    be.GatherRows(a.moe_exchange.data(), a.moe_expert_rows.data(), m.from_experts.data(), nullptr,
                  received, width);
    TY_RETURN_IF_ERROR(
        ExchangeRows(layer, la, /*forward=*/false, a.moe_exchange.data(), m.out.data(), 1));
  }
  // Back to the tokens, weighed.
  be.CombineRows(acts_->tmp.data(), m.out.data(), m.slot.data(), m.weight.data(), n, moe.top_k,
                 width, accumulate);
  return absl::OkStatus();
}

absl::Status Model::MoeBackward(int layer, LayerActivations& la, const Act* dy, bool accumulate) {
  const int g = layout_.block_group(layer), eg = layout_.expert_group(layer);
  TY_ASSIGN_OR_RETURN(auto experts_hold, Hold::Acquire(this, eg));
  TY_ASSIGN_OR_RETURN(group_grads_[eg], source_->Gradients(eg));
  const BlockOffsets& o = layout_.block(layer);
  const config::MoeConfig& moe = config_.moe;
  Activations& a = *acts_;
  const int64_t n = int64_t{a.b} * a.t, width = config_.width, experts = moe.experts;
  Backend& be = *backend_;
  const LayerActivations::Experts& m = la.moe;
  const MoeRouting& r = m.routing;
  const int64_t kept = r.kept(), picks = n * moe.top_k;

  // The combine weights' gradients ⟨dy, expert output⟩ (whole outputs: summed over the group),
  // and the experts' output gradients dy · weight.
  be.RowDots(a.moe_dweight.data(), dy, m.source.data(), m.out.data(), kept, width);
  TY_RETURN_IF_ERROR(tp_.AllReduce(a.moe_dweight.data(), kept));
  be.GatherRows(a.moe_dout.data(), dy, m.source.data(), m.row_weight.data(), kept, width);
  if (ep_ == nullptr) {
    RunExpertsBackward(layer, r.offsets, a.moe_dout.data(), m.in.data(), m.fc.data(), m.act.data(),
                       a.moe_din.data());
  } else {
    const int64_t received = m.expert_offsets.back();
    const int64_t ffn = moe.ffn / tp_size();
    Reserve(be, a.dact, received * ffn);
    Reserve(be, a.dfc, received * (config_.family == ModelFamily::kGpt2 ? ffn : 2 * ffn));
    TY_RETURN_IF_ERROR(
        ExchangeRows(layer, la, /*forward=*/true, a.moe_dout.data(), a.moe_exchange.data(), 2));
    be.GatherRows(a.moe_expert_rows.data(), a.moe_exchange.data(), m.to_experts.data(), nullptr,
                  received, width);
    // The experts' input gradients overwrite the exchange buffer, which is read no more.
    RunExpertsBackward(layer, m.expert_offsets, a.moe_expert_rows.data(), m.expert_in.data(),
                       m.expert_fc.data(), m.expert_act.data(), a.moe_exchange.data());
    be.GatherRows(a.moe_expert_rows.data(), a.moe_exchange.data(), m.from_experts.data(), nullptr,
                  received, width);
    TY_RETURN_IF_ERROR(
        ExchangeRows(layer, la, /*forward=*/false, a.moe_expert_rows.data(), a.moe_din.data(), 3));
  }
  // With a split backward the group is handed over by the weight pass, where the step's last
  // micro-batch is known to be complete.
  if (!split_) TY_RETURN_IF_ERROR(source_->GradientsReady(eg));
  be.CombineRows(a.dln.data(), a.moe_din.data(), m.slot.data(), nullptr, n, moe.top_k, width,
                 accumulate);

  // The router: the weights' gradients back to the picks, and the aux loss's and the router
  // z-loss's, whose share of the objective is the micro-batch's tokens (all of them, also those
  // of other cp ranks) times the loss scale.
  std::vector<float> row_dweight(kept), dweight(picks, 0.0f), dlogits(n * experts);
  be.CopyToHost(row_dweight.data(), a.moe_dweight.data(), kept);
  for (int64_t p = 0; p < picks; ++p) {
    if (r.slot[p] >= 0) dweight[p] = row_dweight[r.slot[p]];
  }
  RouterBackward(moe, r, dweight.data(), double{a.grad_scale} * static_cast<double>(r.batch_tokens),
                 dlogits.data());
  be.CopyFromHost(a.moe_dlogits.data(), dlogits.data(), n * experts);
  be.LinearF32Backward(tp_rank() == 0 ? a.dln.data() : nullptr, G(g, o.router_w),
                       a.moe_dlogits.data(), MlpInput(la), P(g, o.router_w), n, experts, width);
  return absl::OkStatus();
}

Model::MoeLayerStats* Model::StatsOf(int layer) {
  for (MoeLayerStats& s : moe_stats_) {
    if (s.layer == layer) return &s;
  }
  return nullptr;
}

void Model::RecordRouting(int layer, const MoeRouting& routing, std::span<const float> bias) {
  MoeLayerStats* s = StatsOf(layer);
  if (s == nullptr) return;
  if (!bias.empty()) {
    const auto [lo, hi] = std::minmax_element(bias.begin(), bias.end());
    s->bias_spread = *hi - *lo;
  }
  for (int e = 0; e < routing.experts; ++e) s->picks[e] += routing.picks[e];
  s->dropped += routing.dropped;
  s->aux_loss += routing.aux_loss * static_cast<double>(routing.tokens);
  s->z_loss += routing.z_loss * static_cast<double>(routing.tokens);
  s->tokens += routing.tokens;
}

std::vector<Model::MoeLayerStats> Model::TakeMoeStats() {
  std::vector<MoeLayerStats> taken = moe_stats_;
  for (MoeLayerStats& s : moe_stats_) {
    s = MoeLayerStats{s.layer, std::vector<int64_t>(s.picks.size())};
  }
  return taken;
}

}  // namespace trainyard::worker
