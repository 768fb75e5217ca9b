#include "planner/traffic_model.h"

#include <algorithm>
#include <vector>

#include "worker/shape/schedule.h"

namespace trainyard::planner {
namespace {

constexpr int64_t kFloat = 4;

// The collectives of one group of `n` ranks, as seen from group rank `rank`.
class Group {
 public:
  Group(int n, int rank) : n_(n), rank_(rank) {}

  Collective AllReduce(int64_t count, int64_t elem_bytes, Phase phase = Phase::kExposed) const {
    return {CollectiveKind::kAllReduce, RingAllReduceElements(count, n_, rank_) * elem_bytes,
            AllReduceLatency(n_), phase};
  }
  // `count`: elements each rank ends with (reduce-scatter) or contributes (all-gather).
  Collective ReduceScatter(int64_t count, int64_t elem_bytes, Phase phase = Phase::kExposed) const {
    return {CollectiveKind::kReduceScatter, (n_ - 1) * count * elem_bytes, n_ - 1, phase};
  }
  Collective AllGather(int64_t count, int64_t elem_bytes, Phase phase = Phase::kExposed) const {
    return {CollectiveKind::kAllGather, (n_ - 1) * count * elem_bytes, n_ - 1, phase};
  }
  // The training loop's sums of doubles (two floats each).
  Collective Scalars(int values) const {
    Collective c = AllReduce(2 * int64_t{values}, kFloat);
    c.step_end = true;
    return c;
  }

 private:
  int n_, rank_;
};

Collective Times(Collective c, int64_t repeat) {
  c.repeat *= repeat;
  return c;
}

// A collective the communication thread runs: it wakes that thread, and an exposed one also wakes
// the training thread that waits for it.
Collective HandedOver(Collective c) {
  c.hand_overs = c.phase == Phase::kExposed ? 2 : 1;
  return c;
}

// The groups a rank's parameter groups are reduced over, as rank `rank` of the data-parallel
// group sees them: that group, and under expert parallelism the routed experts' (the engine's
// edp: the ranks holding the same experts, RankShape::expert_data_rank).
class DataGroups {
 public:
  DataGroups(const RankShape& s, int rank)
      : s_(s),
        dense_(s.data_ranks(), rank),
        experts_(s.expert_data_ranks(), s.expert_data_rank(rank)) {}
  const Group& of(size_t g) const { return s_.expert_data_group(g) ? experts_ : dense_; }
  const Group& dense() const { return dense_; }
  const Group& experts() const { return experts_; }

 private:
  const RankShape& s_;
  Group dense_, experts_;
};

// ZeRO-0/1: the gradient all-reduce in buckets of whole groups, packed in backward order (last
// group first) up to bucket_bytes, a bucket's groups all reduced over the same ranks, as
// ShardedParams::Allocate packs them.
void AddGradientBuckets(const RankShape& s, const LoopOptions& loop, const DataGroups& groups,
                        std::vector<Collective>& out) {
  struct Bucket {
    int64_t count = 0;
    size_t group = 0;  // one of its parameter groups
  };
  std::vector<Bucket> buckets;
  int64_t filled = 0;
  for (int g = static_cast<int>(s.group_sizes.size()) - 1; g >= 0; --g) {
    if (buckets.empty() || filled >= loop.bucket_bytes ||
        s.expert_data_group(buckets.back().group) != s.expert_data_group(g)) {
      buckets.push_back({0, static_cast<size_t>(g)});
      filled = 0;
    }
    buckets.back().count += s.padded(g);
    filled += kFloat * s.padded(g);
  }
  for (size_t b = 0; b < buckets.size(); ++b) {
    if (s.group_ranks(buckets[b].group) == 1) continue;  // a group of one moves nothing
    // The last bucket (holding the embeddings) is launched when the backward pass ends.
    const bool last = b + 1 == buckets.size();
    out.push_back(HandedOver(
        groups.of(buckets[b].group)
            .AllReduce(buckets[b].count, kFloat, last ? Phase::kExposed : Phase::kBackward)));
  }
}

// ZeRO-3's parameter gathers per micro-batch: every group before its forward use (an MoE
// block's routed experts prefetched as its block starts), each block again for the backward pass
// (prefetched during the block after it), each MoE block's experts again when its backward needs
// them (waited for; under model.recompute once more, prefetched for the recomputed forward and
// freed after it), and the tied LM head (in the embedding group) for the loss. A routed experts'
// group is gathered over its own ranks (none under ep = dp).
void AddParameterGathers(const RankShape& s, const DataGroups& groups,
                         std::vector<Collective>& out) {
  const int64_t m = s.micro_batches;
  auto gather = [&](size_t g, Phase phase) {
    if (s.group_ranks(g) == 1) return;
    out.push_back(Times(HandedOver(groups.of(g).AllGather(s.chunk(g), kFloat, phase)), m));
  };
  for (size_t g = 0; g < s.group_sizes.size(); ++g) {
    // The first group of a pass is waited for; the rest are prefetched behind compute.
    gather(g, g == 0 ? Phase::kExposed : Phase::kForward);
  }
  for (const worker::PipelineStage& chunk : s.chunks) {
    for (int l = chunk.first_layer; l < chunk.first_layer + chunk.num_layers; ++l) {
      gather(s.block_group(l), Phase::kBackward);
      if (s.expert_group(l) < 0) continue;
      gather(s.expert_group(l), Phase::kExposed);
      if (s.model.recompute) gather(s.expert_group(l), Phase::kBackward);
    }
  }
  if (s.tied_head_in_embedding_group()) gather(0, Phase::kExposed);
}

}  // namespace

int MoeStepValues(const config::ModelConfig& model) {
  return model.moe.enabled() ? model.layers * (model.moe.experts + 7) : 0;
}

int LossValues(const config::ModelConfig& model) { return model.z_loss_coeff > 0.0f ? 2 : 1; }

int64_t RingAllReduceElements(int64_t count, int n, int rank) {
  if (n <= 1) return 0;
  auto chunk = [&](int i) { return count * (i + 1) / n - count * i / n; };
  return 2 * count - chunk(rank) - chunk((rank + 1) % n);
}

int64_t AllReduceLatency(int n) { return n == 2 ? 1 : 2 * int64_t{n - 1}; }

KindBytes TotalByKind(const std::vector<Collective>& collectives) {
  KindBytes total{};
  for (const Collective& c : collectives) total[static_cast<int>(c.kind)] += c.bytes * c.repeat;
  return total;
}

int64_t TotalBytes(const std::vector<Collective>& collectives) {
  int64_t total = 0;
  for (const Collective& c : collectives) total += c.bytes * c.repeat;
  return total;
}

std::vector<Collective> DataParallelTraffic(const RankShape& s, const LoopOptions& loop, int rank) {
  std::vector<Collective> out;
  const int zero = s.mesh.zero;
  if (s.data_ranks() == 1) return out;  // a group of one moves nothing
  const DataGroups groups(s, rank);
  const Group& dp = groups.dense();
  if (zero <= 1) AddGradientBuckets(s, loop, groups, out);
  for (size_t g = 0; g < s.group_sizes.size(); ++g) {
    if (zero >= 2 && s.group_ranks(g) > 1) {
      out.push_back(
          Times(HandedOver(groups.of(g).ReduceScatter(s.chunk(g), kFloat, Phase::kBackward)),
                s.micro_batches));
    }
  }
  if (zero == 1 || zero == 2) {
    // The parameters gathered back after the update: every group's gather on the wire at once
    // (Communicator::AllGatherMany), one exchange per ring step for them all; the routed
    // experts' groups in one more over their own ranks.
    int64_t dense = 0, experts = 0;
    for (size_t g = 0; g < s.group_sizes.size(); ++g) {
      (s.expert_data_group(g) ? experts : dense) += s.chunk(g);
    }
    if (dense > 0) out.push_back(HandedOver(dp.AllGather(dense, kFloat)));
    if (experts > 0 && s.expert_data_ranks() > 1) {
      out.push_back(HandedOver(groups.experts().AllGather(experts, kFloat)));
    }
  }
  if (zero == 3) AddParameterGathers(s, groups, out);
  if (s.model.moe.enabled()) out.push_back(HandedOver(dp.Scalars(MoeStepValues(s.model))));
  // The step's loss (and with a z-loss the logits' Σ lse²), in one collective with the gradient
  // norm's sharded sum under ZeRO 1–3.
  out.push_back(HandedOver(dp.Scalars(LossValues(s.model) + (zero > 0 ? 1 : 0))));
  out.push_back(HandedOver(dp.Scalars(loop.agreement_values)));  // stop / checkpoint agreement
  return out;
}

std::vector<Collective> ModelTensorParallelTraffic(const RankShape& s, const BackendShape& backend,
                                                   int rank) {
  std::vector<Collective> out;
  const int64_t n = s.mesh.tp;
  if (n == 1) return out;
  const Group tp(static_cast<int>(n), rank);
  const bool sp = s.mesh.sequence_parallel;
  const int64_t a = backend.act_bytes, w = s.model.width;
  const int64_t rows = s.rows(), local = sp ? rows / n : rows;
  const int64_t layers = s.layers(), recompute = s.model.recompute ? 1 : 0;
  if (!sp) {
    if (s.first()) out.push_back(tp.AllReduce(rows * w, a));  // vocabulary-parallel embedding
    out.push_back(Times(tp.AllReduce(rows * w, a), layers * (4 + 2 * recompute)));
  } else {
    if (s.first()) {
      out.push_back(tp.ReduceScatter(local * w, a));  // embedding, to local rows
      out.push_back(tp.AllGather(local * w, a));      // its gradient, to full rows
    }
    out.push_back(Times(tp.AllGather(local * w, a), layers * (4 + 2 * recompute)));
    out.push_back(Times(tp.ReduceScatter(local * w, a), layers * (4 + 2 * recompute)));
    // The norms' weight and bias gradients: each block's norms (two, or four with post_norms
    // and pre_norms).
    out.push_back(Times(tp.AllReduce(2 * int64_t{s.model.norms_per_block()} * w, kFloat), layers));
  }
  // qk_norm: the query and key norms' gradients from this rank's heads.
  if (s.model.qk_norm) {
    const int64_t weights = s.model.q_norm_width() + s.model.k_norm_width();
    out.push_back(Times(tp.AllReduce(weights, kFloat), layers));
    // Norms over the whole projection split by heads: each row's sums of squares of q and k,
    // once a forward, then its q and its k gradient dots.
    if (s.model.NormsWholeProjection()) {
      out.push_back(Times(tp.AllReduce(2 * rows, kFloat), layers * (1 + recompute)));
      out.push_back(Times(tp.AllReduce(rows, kFloat), 2 * layers));
    }
  }
  // Latent attention: each block's backward sums the gradients at its normed latents and its
  // shared rotary key (every row's, as the attention's input is whole rows), from this rank's
  // heads.
  if (const config::LatentAttention& l = s.model.latent; l.enabled()) {
    const int64_t latents = int64_t{l.q_rank} + l.kv_rank + s.model.rope_dim;
    out.push_back(Times(tp.AllReduce(rows * latents, a), layers));
  }
  // An MoE block's combine weights' gradients, one float per pick (all N·top_k of them when
  // dropless; fewer when a capacity drops some, which this bound does not know).
  if (const int moe_blocks = s.moe_blocks(); moe_blocks > 0) {
    out.push_back(Times(tp.AllReduce(rows * s.model.moe.top_k, kFloat), moe_blocks));
    // shared_gate: each row's gate-logit gradient from this rank's share of the hidden units.
    if (s.model.moe.shared_gate) out.push_back(Times(tp.AllReduce(rows, kFloat), moe_blocks));
  }
  if (s.last()) {
    const int64_t vocab = s.model.vocab / n;
    const int64_t chunk = std::clamp<int64_t>(backend.max_logits_chunk / vocab, 1, rows);
    out.push_back(Times(tp.AllGather(3 * chunk, kFloat), (rows + chunk - 1) / chunk));
    if (!sp) {
      out.push_back(tp.AllReduce(rows * w, a));  // the loss's gradient
    } else {
      out.push_back(tp.AllGather(local * w, a));      // the final norm's output
      out.push_back(tp.ReduceScatter(local * w, a));  // the loss's gradient
      out.push_back(tp.AllReduce(2 * w, kFloat));     // the final norm's gradients
    }
  }
  return out;
}

std::vector<Collective> TensorParallelTraffic(const RankShape& s, const BackendShape& backend,
                                              const LoopOptions& loop, int rank) {
  std::vector<Collective> out;
  if (s.mesh.tp == 1) return out;
  for (Collective c : ModelTensorParallelTraffic(s, backend, rank)) {
    out.push_back(Times(c, s.micro_batches));
  }
  const Group tp(s.mesh.tp, rank);
  out.push_back(tp.Scalars(1));                      // the gradient norm
  out.push_back(tp.Scalars(loop.agreement_values));  // stop / checkpoint agreement
  return out;
}

std::vector<Collective> PipelineTraffic(const RankShape& s, const BackendShape& backend,
                                        const LoopOptions& loop, int rank) {
  std::vector<Collective> out;
  if (s.mesh.pp == 1) return out;
  const bool sp = s.mesh.sequence_parallel && s.mesh.tp > 1;
  const int64_t count = s.rows() / (sp ? s.mesh.tp : 1) * s.model.width;
  const Collective send{CollectiveKind::kSendRecv, count * backend.act_bytes, 1, Phase::kExposed};
  // The sends of this stage's steps of the schedule the executor runs: activations on to the
  // next virtual stage, gradients back to the previous one.
  int64_t onward = 0, back = 0;
  const std::vector<std::vector<worker::ScheduleStep>> plan = worker::PlanSchedule(s.schedule());
  for (const worker::ScheduleStep& step : plan[s.stage_index]) {
    for (const worker::Transfer& t : step.transfers) {
      if (t.send) ++(t.pass.kind == worker::PassKind::kForward ? onward : back);
    }
  }
  if (onward > 0) out.push_back(Times(send, onward));
  if (back > 0) out.push_back(Times(send, back));
  const Group pp(s.mesh.pp, rank);
  if (s.model.moe.enabled()) out.push_back(pp.Scalars(MoeStepValues(s.model)));
  // The gradient norm and the step's loss values, in one collective.
  out.push_back(pp.Scalars(1 + LossValues(s.model)));
  out.push_back(pp.Scalars(loop.agreement_values));
  return out;
}

int64_t ExchangedRows(const RankShape& s) {
  const int64_t picks = s.rows() * s.model.moe.top_k, ep = s.mesh.ep;
  return picks * (ep - 1) / ep;
}

std::vector<Collective> ExpertParallelTraffic(const RankShape& s, const BackendShape& backend) {
  const int ep = s.mesh.ep;
  if (ep == 1) return {};
  std::vector<Collective> out;
  const Group group(ep, 0);
  if (const int64_t blocks = s.moe_blocks(); blocks > 0) {
    // Per MoE block and micro-batch; the forward's again when the backward recomputes it.
    const int64_t forwards = s.model.recompute ? 2 : 1, m = s.micro_batches;
    out.push_back(Times(group.AllGather(s.model.moe.experts, kFloat), m * blocks * forwards));
    const Collective exchange{.kind = CollectiveKind::kSendRecv,
                              .bytes = ExchangedRows(s) * s.model.width * backend.act_bytes,
                              .latency = ep - 1};
    out.push_back(Times(exchange, m * blocks * (2 * forwards + 2)));
  }
  // ZeRO-0: the experts' share of the gradient norm, summed over the ranks holding the others.
  if (s.mesh.zero == 0) out.push_back(group.Scalars(1));
  return out;
}

int64_t RingKeyValueElements(const RankShape& s) {
  return s.rows() * (s.model.kv_heads / s.mesh.tp) *
         (s.model.head_dim() + s.model.value_head_dim());
}

std::vector<Collective> ContextParallelTraffic(const RankShape& s, const BackendShape& backend) {
  const int64_t cp = s.mesh.cp;
  if (cp == 1) return {};
  const int64_t blocks = int64_t{s.micro_batches} * s.layers();
  const int64_t bytes = RingKeyValueElements(s) * backend.act_bytes;
  auto sends = [&](int64_t per_block, Phase phase) {
    return Collective{.kind = CollectiveKind::kSendRecv,
                      .bytes = bytes,
                      .latency = 1,
                      .phase = phase,
                      .repeat = blocks * per_block};
  };
  std::vector<Collective> out = {sends(cp - 1, Phase::kForward)};
  if (s.model.recompute) out.push_back(sends(cp - 1, Phase::kBackward));  // the forward again
  out.push_back(sends(cp - 1, Phase::kBackward));                         // keys and values
  out.push_back(sends(cp, Phase::kBackward));                             // their gradients
  // MoE routing (Model::RouteTokens): per MoE block and forward pass, one all-gather.
  if (const int64_t moe_blocks = s.moe_blocks(); moe_blocks > 0) {
    const int64_t forwards = s.model.recompute ? 2 : 1;
    const Group group(static_cast<int>(cp), 0);
    out.push_back(Times(group.AllGather(RoutingGatherFloats(s), kFloat),
                        int64_t{s.micro_batches} * moe_blocks * forwards));
  }
  return out;
}

int64_t RoutingGatherFloats(const RankShape& s) {
  return (2 * int64_t{s.micro} + 2) * s.model.moe.experts + 2;
}

std::vector<Collective> TiedEmbeddingTraffic(const RankShape& s) {
  if (s.tied_copy == 0) return {};
  return {Group(2, s.first() ? 0 : 1).AllReduce(s.tied_copy, kFloat)};
}

}  // namespace trainyard::planner
