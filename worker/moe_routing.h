// The router of a mixture-of-experts layer (config::MoeConfig): which experts each token goes to,
// with what weight, in what order the experts see their rows, and the router's backward. Host
// arithmetic on the router's fp32 logits, deterministic (no ties left to chance): the model
// copies the logits here, then hands the permutation and weights to its Backend.
#ifndef TRAINYARD_WORKER_MOE_ROUTING_H_
#define TRAINYARD_WORKER_MOE_ROUTING_H_

#include <cstdint>
#include <span>
#include <vector>

#include "config/model_config.h"

namespace trainyard::worker {

// One micro-batch's routing through one MoE layer. A pick is (token t, rank j < top_k); kept
// picks are laid out expert by expert (token order within an expert): the permuted rows.
struct MoeRouting {
  int64_t tokens = 0;
  int top_k = 0;
  int experts = 0;
  std::vector<float> scores;      // [tokens, E]: softmax or sigmoid of the logits
  std::vector<int32_t> expert;    // [tokens, K]: the picks, best first
  std::vector<float> weight;      // [tokens, K]: their combine weights (dropped ones too)
  std::vector<int32_t> slot;      // [tokens, K]: the pick's permuted row, −1 if dropped
  std::vector<int32_t> source;    // [kept]: permuted row → its token
  std::vector<float> row_weight;  // [kept]: permuted row → its pick's weight
  std::vector<int64_t> offsets;  // [E + 1]: expert e's permuted rows are [offsets[e], offsets[e+1])
  std::vector<int64_t> picks;    // [E]: picks of each expert before capacity drops (its load)
  std::vector<double> score_sum;  // [E]: Σ over the tokens of the normalised scores
  // The router z-loss's pieces (z_loss_coeff > 0): Σ over the tokens of z² with z the
  // log-sum-exp of a token's logits, and ∂z²/∂logits = 2·z·softmax(logits) [tokens, E].
  double z_sum = 0;
  std::vector<float> z_grad;
  int64_t dropped = 0;  // picks over an expert's capacity
  // The whole micro-batch's (this rank's tokens' unless they are split over ranks): its tokens,
  // each expert's picks and Pᵢ, the mean normalised score; and the aux loss
  // coeff · E · Σ fᵢ·Pᵢ with fᵢ its share of the picks (0 under the bias rule); the router
  // z-loss z_loss_coeff · the micro-batch's mean z².
  int64_t batch_tokens = 0;
  std::vector<int64_t> batch_picks;
  std::vector<double> mean_score;
  double aux_loss = 0;
  double z_loss = 0;

  int64_t kept() const { return static_cast<int64_t>(source.size()); }
};

// Routes `tokens` rows of router logits [tokens, E] (`bias`: the selection bias [E], or empty):
// a whole micro-batch.
MoeRouting Route(const config::MoeConfig& moe, const float* logits, int64_t tokens,
                 std::span<const float> bias);

// Route's steps for a rank that holds only some of a micro-batch's tokens.
// Each token's scores, picks and combine weights; picks, score_sum and z_sum of these tokens.
MoeRouting SelectExperts(const config::MoeConfig& moe, const float* logits, int64_t tokens,
                         std::span<const float> bias);
// Where a rank's rows sit in the micro-batch: runs of `run_rows` consecutive rows, each
// contiguous in the micro-batch's token order, and for each run and expert the picks that the
// micro-batch's tokens before the run made ([runs, E]). The capacity counts the micro-batch's
// `batch_tokens` · top_k picks. Whole: the rank holds the micro-batch, one run with none before.
struct MoeShare {
  int64_t batch_tokens = 0;
  int64_t run_rows = 0;
  std::vector<int64_t> picks_before;

  static MoeShare Whole(int64_t tokens, int experts) {
    return {
        .batch_tokens = tokens, .run_rows = tokens, .picks_before = std::vector<int64_t>(experts)};
  }
};
// Capacity drops (a pick is kept while fewer than the capacity of its expert's picks came before
// it in the micro-batch's token order) and the permuted rows.
void KeepPicks(const config::MoeConfig& moe, MoeRouting& r, const MoeShare& share);
// The aux loss from the micro-batch's tokens, picks per expert and Σ normalised scores, and the
// router z-loss from its Σ z².
void Balance(const config::MoeConfig& moe, MoeRouting& r, int64_t batch_tokens,
             std::span<const int64_t> batch_picks, std::span<const double> batch_score_sum,
             double batch_z_sum);

// ∂objective/∂logits [tokens, E] (overwritten), given ∂objective/∂weight [tokens, K] (only kept
// picks' entries are read) and the factor `aux_grad` the micro-batch's aux loss (ignored under
// the bias rule) and router z-loss enter the objective with. Both use the micro-batch's token
// count and the aux loss its shares, so the ranks holding parts of a micro-batch give the
// gradients of its logits between them.
void RouterBackward(const config::MoeConfig& moe, const MoeRouting& routing, const float* dweight,
                    double aux_grad, float* dlogits);

// The auxiliary-loss-free rule's step for one layer: biasᵢ += rate · sign(mean load − loadᵢ),
// loads summed over the step and the data-parallel world. Returns the change per expert.
std::vector<float> BiasUpdate(const config::MoeConfig& moe, std::span<const double> load);

}  // namespace trainyard::worker

#endif  // TRAINYARD_WORKER_MOE_ROUTING_H_
