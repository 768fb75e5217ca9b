#include "worker/data/markov.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "worker/data/xoshiro.h"

namespace trainyard::worker {
namespace {

constexpr double kRowSumTolerance = 1e-9;
constexpr double kStationaryTolerance = 1e-12;  // estimated L1 distance to the fixed point
constexpr double kRoundingFloor = 1e-15;        // L1 steps this small are rounding noise
constexpr double kPowerIterationWork = 2e9;     // multiply-adds before giving up
// Separates Generate's random numbers from those that drew the chain from the same seed.
constexpr uint64_t kGenerateDomain = 0x67656E6572617465ull;  // "generate"

// vocab^exponent, or limit + 1 when it exceeds `limit`.
int64_t BoundedPower(int64_t vocab, int exponent, int64_t limit) {
  int64_t result = 1;
  for (int i = 0; i < exponent; ++i) {
    result *= vocab;
    if (result > limit) return limit + 1;
  }
  return result;
}

absl::Status CheckShape(int order, int vocab, const std::string& prefix) {
  if (vocab < 2 || vocab > MarkovChain::kMaxVocab) {
    return absl::InvalidArgumentError(
        absl::StrCat(prefix, ".vocab: ", vocab, " is outside [2, ", MarkovChain::kMaxVocab, "]"));
  }
  if (order < 0) {
    return absl::InvalidArgumentError(absl::StrCat(prefix, ".order: ", order, " is negative"));
  }
  if (BoundedPower(vocab, order, MarkovChain::kMaxContexts) > MarkovChain::kMaxContexts) {
    return absl::InvalidArgumentError(absl::StrCat(prefix, ".order: vocab^order = ", vocab, "^",
                                                   order, " contexts exceeds the limit of ",
                                                   MarkovChain::kMaxContexts));
  }
  if (BoundedPower(vocab, order + 1, MarkovChain::kMaxTransitions) > MarkovChain::kMaxTransitions) {
    return absl::InvalidArgumentError(absl::StrCat(
        prefix, ".order: vocab^(order+1) = ", vocab, "^", order + 1,
        " transition probabilities exceeds the limit of ", MarkovChain::kMaxTransitions));
  }
  return absl::OkStatus();
}

// Fills `row` with a sample of the symmetric Dirichlet(concentration), normalising in log space
// so that tiny concentrations (whose Gamma variates underflow) still give a valid distribution.
void SampleDirichlet(double concentration, Xoshiro256& rng, double* row, int n) {
  double max_log = -HUGE_VAL;
  for (int i = 0; i < n; ++i) {
    row[i] = rng.LogGamma(concentration);
    max_log = std::max(max_log, row[i]);
  }
  double sum = 0.0;
  for (int i = 0; i < n; ++i) {
    row[i] = std::exp(row[i] - max_log);
    sum += row[i];
  }
  for (int i = 0; i < n; ++i) row[i] /= sum;
}

}  // namespace

absl::StatusOr<MarkovChain> MarkovChain::Random(const config::MarkovSpec& spec,
                                                const std::string& path_prefix) {
  if (absl::Status shape = CheckShape(spec.order, spec.vocab, path_prefix); !shape.ok()) {
    return shape;
  }
  if (!std::isfinite(spec.concentration) || spec.concentration <= 0.0) {
    return absl::InvalidArgumentError(
        absl::StrCat(path_prefix, ".concentration: ", spec.concentration, " must be positive"));
  }
  const int64_t contexts = BoundedPower(spec.vocab, spec.order, kMaxContexts);
  std::vector<double> transitions(contexts * spec.vocab);
  Xoshiro256 rng(spec.seed);
  for (int64_t c = 0; c < contexts; ++c) {
    SampleDirichlet(spec.concentration, rng, &transitions[c * spec.vocab], spec.vocab);
  }
  return Build(spec.order, spec.vocab, std::move(transitions), path_prefix);
}

absl::StatusOr<MarkovChain> MarkovChain::FromTransitions(int order, int vocab,
                                                         std::vector<double> transitions) {
  return Build(order, vocab, std::move(transitions), "markov");
}

absl::StatusOr<MarkovChain> MarkovChain::Build(int order, int vocab,
                                               std::vector<double> transitions,
                                               const std::string& prefix) {
  if (absl::Status shape = CheckShape(order, vocab, prefix); !shape.ok()) return shape;
  MarkovChain chain;
  chain.order_ = order;
  chain.vocab_ = vocab;
  chain.contexts_ = BoundedPower(vocab, order, kMaxContexts);
  if (static_cast<int64_t>(transitions.size()) != chain.contexts_ * vocab) {
    return absl::InvalidArgumentError(absl::StrCat(prefix, ": transition table has ",
                                                   transitions.size(), " entries, expected ",
                                                   chain.contexts_ * vocab));
  }
  for (int64_t c = 0; c < chain.contexts_; ++c) {
    double* row = &transitions[c * vocab];
    double sum = 0.0;
    for (int s = 0; s < vocab; ++s) {
      if (!(row[s] >= 0.0) || !std::isfinite(row[s])) {
        return absl::InvalidArgumentError(absl::StrCat(prefix, ": P(", s, " | context ", c,
                                                       ") = ", row[s], " is not a probability"));
      }
      sum += row[s];
    }
    if (std::abs(sum - 1.0) > kRowSumTolerance) {
      return absl::InvalidArgumentError(
          absl::StrCat(prefix, ": probabilities of context ", c, " sum to ", sum, ", not 1"));
    }
    for (int s = 0; s < vocab; ++s) row[s] /= sum;
  }
  chain.probabilities_ = std::move(transitions);
  if (absl::Status status = chain.ComputeStationary(); !status.ok()) {
    return absl::Status(status.code(), absl::StrCat(prefix, ": ", status.message()));
  }
  chain.ComputeDerived();
  return chain;
}

absl::Status MarkovChain::ComputeStationary() {
  const int64_t transitions = contexts_ * vocab_;
  // Work per iteration: the transitions, a normalisation pass over the contexts, loop overhead.
  const double work_per_iteration = static_cast<double>(transitions + 2 * contexts_ + 64);
  const int64_t max_iterations =
      std::max<int64_t>(1000, static_cast<int64_t>(kPowerIterationWork / work_per_iteration));
  std::vector<double> current(contexts_, 1.0 / contexts_);
  std::vector<double> next(contexts_);
  double previous_change = HUGE_VAL;
  for (int64_t iteration = 0; iteration < max_iterations; ++iteration) {
    // next = current * (I + P) / 2.
    for (int64_t c = 0; c < contexts_; ++c) next[c] = 0.5 * current[c];
    for (int64_t c = 0; c < contexts_; ++c) {
      const double mass = 0.5 * current[c];
      if (mass == 0.0) continue;
      const double* row = &probabilities_[c * vocab_];
      const int64_t base = (c * vocab_) % contexts_;
      // Successors of c are base, base + 1, ..., base + vocab - 1 (mod contexts).
      for (int s = 0; s < vocab_; ++s) next[(base + s) % contexts_] += mass * row[s];
    }
    double total = 0.0;
    for (double p : next) total += p;
    double change = 0.0;
    for (int64_t c = 0; c < contexts_; ++c) {
      next[c] /= total;
      change += std::abs(next[c] - current[c]);
    }
    current.swap(next);
    // Near the fixed point the steps shrink geometrically by a ratio r, so the distance left is
    // about change * r / (1 - r): a small step alone does not mean a small error.
    const double ratio = change / previous_change;
    const bool settled = change <= kRoundingFloor ||
                         (ratio < 1.0 && change * ratio / (1.0 - ratio) < kStationaryTolerance);
    if (change < kStationaryTolerance && settled) {
      stationary_ = std::move(current);
      return absl::OkStatus();
    }
    previous_change = change;
    // Give up early once the observed decay rate says the budget cannot possibly suffice.
    if (iteration >= 200 && ratio > 0.0 && ratio < 1.0 &&
        std::log(kStationaryTolerance * (1.0 - ratio) / change) / std::log(ratio) >
            4.0 * static_cast<double>(max_iterations - iteration)) {
      break;
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat("stationary distribution does not converge to ", kStationaryTolerance,
                   " within ", max_iterations,
                   " power iterations: the chain mixes too slowly, and so would the data it "
                   "generates; raise the concentration or lower the order"));
}

void MarkovChain::ComputeDerived() {
  cumulative_.resize(probabilities_.size());
  entropy_nats_ = 0.0;
  for (int64_t c = 0; c < contexts_; ++c) {
    const double* row = &probabilities_[c * vocab_];
    double* cdf = &cumulative_[c * vocab_];
    double running = 0.0;
    double row_entropy = 0.0;
    for (int s = 0; s < vocab_; ++s) {
      running += row[s];
      cdf[s] = running;
      if (row[s] > 0.0) row_entropy -= row[s] * std::log(row[s]);
    }
    // x / x == 1 exactly, so every row ends at 1 and a uniform draw in [0, 1) always lands.
    for (int s = 0; s < vocab_; ++s) cdf[s] /= running;
    entropy_nats_ += stationary_[c] * row_entropy;
  }
}

std::vector<uint16_t> MarkovChain::Generate(int64_t n, uint64_t seed) const {
  Xoshiro256 rng(HashCounter(seed, kGenerateDomain, 0));
  std::vector<uint16_t> out(static_cast<size_t>(std::max<int64_t>(n, 0)));
  // Initial context from the stationary distribution, by inverse CDF.
  double u = rng.Uniform();
  int64_t context = -1;
  for (int64_t c = 0; c < contexts_; ++c) {
    if (stationary_[c] == 0.0) continue;
    context = c;  // the last context with mass, should rounding leave u >= 0 at the end
    u -= stationary_[c];
    if (u < 0.0) break;
  }
  for (auto& symbol_out : out) {
    const double* cdf = &cumulative_[context * vocab_];
    const int symbol = static_cast<int>(std::upper_bound(cdf, cdf + vocab_, rng.Uniform()) - cdf);
    symbol_out = static_cast<uint16_t>(symbol);
    context = NextContext(context, symbol);
  }
  return out;
}

}  // namespace trainyard::worker
