#include "worker/moe_routing.h"

#include <algorithm>
#include <cmath>

namespace trainyard::worker {
namespace {

using config::GroupScore;
using config::MoeBalance;
using config::MoeConfig;
using config::MoeScore;

// Scores of one token's logits: softmax over the experts, or each logit's sigmoid.
void Scores(MoeScore kind, const float* logits, int experts, float* out) {
  if (kind == MoeScore::kSigmoid) {
    for (int e = 0; e < experts; ++e) out[e] = 1.0f / (1.0f + std::exp(-logits[e]));
    return;
  }
  const float top = *std::max_element(logits, logits + experts);
  double sum = 0;
  for (int e = 0; e < experts; ++e) sum += std::exp(double{logits[e]} - top);
  for (int e = 0; e < experts; ++e) out[e] = static_cast<float>(std::exp(logits[e] - top) / sum);
}

// Group-limited routing (MoeConfig::groups): clears `eligible` [E] for the experts outside the
// kept groups, which are those of highest group score (the sum of the group's two best values,
// DeepSeek-V3's, or its best value, DeepSeek-V2's), an equal score going to the lower group.
// Every expert stays eligible otherwise.
// `group_score` [groups] is the caller's scratch, so a token's routing allocates nothing.
void KeepGroups(const MoeConfig& moe, const float* value, std::vector<float>& group_score,
                std::vector<char>& eligible) {
  if (!moe.limits_groups()) {
    std::fill(eligible.begin(), eligible.end(), 1);
    return;
  }
  const int size = moe.experts / moe.groups;  // at least two (ValidateMoe)
  for (int g = 0; g < moe.groups; ++g) {
    const float* v = value + g * size;
    const int best = static_cast<int>(std::max_element(v, v + size) - v);
    float second = -INFINITY;
    for (int e = 0; e < size; ++e) {
      if (e != best) second = std::max(second, v[e]);
    }
    group_score[g] = moe.group_score == GroupScore::kMax ? v[best] : v[best] + second;
  }
  std::fill(eligible.begin(), eligible.end(), 0);
  for (int j = 0; j < moe.kept_groups(); ++j) {
    const int best = static_cast<int>(std::max_element(group_score.begin(), group_score.end()) -
                                      group_score.begin());  // the first of equal scores
    std::fill_n(eligible.begin() + best * size, size, 1);
    group_score[best] = -INFINITY;  // kept: not picked again
  }
}

// The top_k of the eligible experts' values (score + bias), best first; an equal value goes to the
// lower expert index.
void Pick(const float* value, const std::vector<char>& eligible, int top_k, int32_t* out) {
  const int experts = static_cast<int>(eligible.size());
  for (int j = 0; j < top_k; ++j) {
    int best = -1;
    for (int e = 0; e < experts; ++e) {
      if (!eligible[e] || std::find(out, out + j, e) != out + j) continue;
      if (best < 0 || value[e] > value[best]) best = e;
    }
    out[j] = best;
  }
}

// One token's router z-loss pieces: z = log Σ exp(logits) adds z² to *sum, and grad becomes
// ∂z²/∂logits = 2·z·softmax(logits).
void ZLoss(const float* logits, int experts, double& sum, float* grad) {
  const double top = *std::max_element(logits, logits + experts);
  double total = 0;
  for (int e = 0; e < experts; ++e) total += std::exp(logits[e] - top);
  const double z = top + std::log(total);
  sum += z * z;
  for (int e = 0; e < experts; ++e) {
    grad[e] = static_cast<float>(2.0 * z * std::exp(logits[e] - z));
  }
}

}  // namespace

MoeRouting SelectExperts(const MoeConfig& moe, const float* logits, int64_t tokens,
                         std::span<const float> bias) {
  MoeRouting r;
  r.tokens = tokens;
  r.top_k = moe.top_k;
  r.experts = moe.experts;
  const int E = moe.experts, K = moe.top_k;
  r.scores.resize(tokens * E);
  r.expert.resize(tokens * K);
  r.weight.resize(tokens * K);
  r.slot.assign(tokens * K, -1);
  r.picks.assign(E, 0);
  r.score_sum.assign(E, 0.0);
  const bool z_loss = moe.z_loss_coeff > 0.0f;
  if (z_loss) r.z_grad.resize(tokens * E);
  std::vector<float> value(E);
  std::vector<char> eligible(E);
  std::vector<float> group_score(moe.groups);
  for (int64_t t = 0; t < tokens; ++t) {
    float* g = &r.scores[t * E];
    Scores(moe.score, logits + t * E, E, g);
    for (int e = 0; e < E; ++e) value[e] = g[e] + (bias.empty() ? 0.0f : bias[e]);
    KeepGroups(moe, value.data(), group_score, eligible);
    int32_t* picked = &r.expert[t * K];
    Pick(value.data(), eligible, K, picked);
    double norm = 0;
    for (int j = 0; j < K; ++j) norm += g[picked[j]];
    for (int j = 0; j < K; ++j) {
      const float w = moe.normalize_top_k ? static_cast<float>(g[picked[j]] / norm) : g[picked[j]];
      r.weight[t * K + j] = w * moe.routed_scale;
      ++r.picks[picked[j]];
    }
    // The aux loss's normalised scores q (q = g for softmax, g / Σg for sigmoid).
    double q_norm = 1.0;
    if (moe.score == MoeScore::kSigmoid) {
      q_norm = 0;
      for (int e = 0; e < E; ++e) q_norm += g[e];
    }
    for (int e = 0; e < E; ++e) r.score_sum[e] += g[e] / q_norm;
    if (z_loss) ZLoss(logits + t * E, E, r.z_sum, &r.z_grad[t * E]);
  }
  return r;
}

void KeepPicks(const MoeConfig& moe, MoeRouting& r, const MoeShare& share) {
  const int E = r.experts, K = r.top_k;
  const int64_t capacity = moe.CapacityPerExpert(share.batch_tokens * K);
  std::vector<int64_t> before(E);   // the micro-batch's picks of each expert before the token's
  std::vector<int64_t> kept(E, 0);  // of this rank's, those kept
  r.dropped = 0;
  for (int64_t t = 0; t < r.tokens; ++t) {
    if (t % share.run_rows == 0) {  // a run starts: its earlier picks are the micro-batch's
      std::copy_n(&share.picks_before[t / share.run_rows * E], E, before.begin());
    }
    for (int j = 0; j < K; ++j) {
      const int64_t p = t * K + j;
      const int e = r.expert[p];
      if (before[e]++ < capacity) {
        r.slot[p] = static_cast<int32_t>(kept[e]++);  // rank within the expert, for now
      } else {
        ++r.dropped;
      }
    }
  }
  // The kept picks expert by expert, each expert's in token order.
  r.offsets.assign(E + 1, 0);
  for (int e = 0; e < E; ++e) r.offsets[e + 1] = r.offsets[e] + kept[e];
  r.source.assign(r.offsets.back(), 0);
  r.row_weight.assign(r.offsets.back(), 0.0f);
  for (int64_t p = 0; p < r.tokens * K; ++p) {
    if (r.slot[p] < 0) continue;
    r.slot[p] += static_cast<int32_t>(r.offsets[r.expert[p]]);
    r.source[r.slot[p]] = static_cast<int32_t>(p / K);
    r.row_weight[r.slot[p]] = r.weight[p];
  }
}

void Balance(const MoeConfig& moe, MoeRouting& r, int64_t batch_tokens,
             std::span<const int64_t> batch_picks, std::span<const double> batch_score_sum,
             double batch_z_sum) {
  r.batch_tokens = batch_tokens;
  r.batch_picks.assign(batch_picks.begin(), batch_picks.end());
  r.mean_score.assign(r.experts, 0.0);
  double sum = 0;
  for (int e = 0; e < r.experts; ++e) {
    r.mean_score[e] = batch_score_sum[e] / static_cast<double>(batch_tokens);
    const double share =
        static_cast<double>(batch_picks[e]) / static_cast<double>(batch_tokens * r.top_k);
    sum += share * r.mean_score[e];
  }
  r.aux_loss = moe.balance == MoeBalance::kAuxLoss ? moe.aux_loss_coeff * r.experts * sum : 0.0;
  r.z_loss = moe.z_loss_coeff * batch_z_sum / static_cast<double>(batch_tokens);
}

MoeRouting Route(const MoeConfig& moe, const float* logits, int64_t tokens,
                 std::span<const float> bias) {
  MoeRouting r = SelectExperts(moe, logits, tokens, bias);
  KeepPicks(moe, r, MoeShare::Whole(tokens, moe.experts));
  Balance(moe, r, tokens, r.picks, r.score_sum, r.z_sum);
  return r;
}

void RouterBackward(const MoeConfig& moe, const MoeRouting& r, const float* dweight,
                    double aux_grad, float* dlogits) {
  const int E = r.experts, K = r.top_k;
  const bool aux = moe.balance == MoeBalance::kAuxLoss && aux_grad != 0.0;
  std::vector<double> dg(E), dq(E);
  if (aux) {
    // ∂(coeff · E · Σ fᵢ·Pᵢ)/∂q_t,i = coeff · E · fᵢ / tokens, the same for every token of the
    // micro-batch.
    const double tokens = static_cast<double>(r.batch_tokens);
    for (int e = 0; e < E; ++e) {
      const double share = static_cast<double>(r.batch_picks[e]) / (tokens * K);
      dq[e] = aux_grad * moe.aux_loss_coeff * E * share / tokens;
    }
  }
  for (int64_t t = 0; t < r.tokens; ++t) {
    const float* g = &r.scores[t * E];
    std::fill(dg.begin(), dg.end(), 0.0);
    // Through the combine weights w = s · n (a dropped pick's weight did nothing): with n the
    // normalised scores g / Σ g, ∂/∂g_e = (s · dw_e − Σ dw·w) / Σ g.
    const int32_t* picked = &r.expert[t * K];
    const double scale = moe.routed_scale;
    double norm = 0, weighted = 0;
    for (int j = 0; j < K; ++j) {
      norm += g[picked[j]];
      if (r.slot[t * K + j] >= 0) weighted += double{dweight[t * K + j]} * r.weight[t * K + j];
    }
    for (int j = 0; j < K; ++j) {
      const double dw = r.slot[t * K + j] >= 0 ? scale * dweight[t * K + j] : 0.0;
      dg[picked[j]] += moe.normalize_top_k ? (dw - weighted) / norm : dw;
    }
    // Through the aux loss's normalised scores q (q = g for softmax, g / Σg for sigmoid).
    if (aux && moe.score == MoeScore::kSoftmax) {
      for (int e = 0; e < E; ++e) dg[e] += dq[e];
    } else if (aux) {
      double sum = 0, dot = 0;
      for (int e = 0; e < E; ++e) sum += g[e];
      for (int e = 0; e < E; ++e) dot += dq[e] * g[e] / sum;
      for (int e = 0; e < E; ++e) dg[e] += (dq[e] - dot) / sum;
    }
    // Scores to logits.
    float* dl = dlogits + t * E;
    if (moe.score == MoeScore::kSigmoid) {
      for (int e = 0; e < E; ++e) dl[e] = static_cast<float>(dg[e] * g[e] * (1.0 - g[e]));
    } else {
      double dot = 0;
      for (int e = 0; e < E; ++e) dot += dg[e] * g[e];
      for (int e = 0; e < E; ++e) dl[e] = static_cast<float>(g[e] * (dg[e] - dot));
    }
    // The router z-loss, coeff · Σ z² / tokens over the micro-batch, straight on the logits.
    if (!r.z_grad.empty()) {
      const double z_factor = aux_grad * moe.z_loss_coeff / static_cast<double>(r.batch_tokens);
      for (int e = 0; e < E; ++e) dl[e] += static_cast<float>(z_factor * r.z_grad[t * E + e]);
    }
  }
}

std::vector<float> BiasUpdate(const MoeConfig& moe, std::span<const double> load) {
  double mean = 0;
  for (double l : load) mean += l;
  mean /= static_cast<double>(load.size());
  std::vector<float> delta(load.size());
  for (size_t e = 0; e < load.size(); ++e) {
    const double error = mean - load[e];
    delta[e] = error > 0 ? moe.bias_update_rate : error < 0 ? -moe.bias_update_rate : 0.0f;
  }
  return delta;
}

}  // namespace trainyard::worker
