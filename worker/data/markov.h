// Random order-k Markov chains over a small alphabet: synthetic training data whose entropy rate
// is known exactly, so a trained model's loss can be compared with the best achievable loss.
//
// A context is the last `order` symbols, encoded as a base-`vocab` number whose lowest digit is
// the most recent symbol; after emitting s from context c the chain moves to
// (c * vocab + s) mod vocab^order. Order 0 is an i.i.d. source with a single context.
//
// Threading: a MarkovChain is immutable after construction; all const methods may be called
// concurrently.
#ifndef TRAINYARD_WORKER_DATA_MARKOV_H_
#define TRAINYARD_WORKER_DATA_MARKOV_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "config/spec.h"

namespace trainyard::worker {

class MarkovChain {
 public:
  // Limits that keep the tables (vocab^(order+1) doubles, twice) and the power iteration small.
  static constexpr int64_t kMaxContexts = 65536;
  static constexpr int64_t kMaxTransitions = int64_t{1} << 24;  // as config/ allows
  static constexpr int kMaxVocab = 65536;                       // symbols are emitted as uint16_t

  // Draws a chain from `spec`: for each context, the next-symbol distribution is a sample of a
  // symmetric Dirichlet(spec.concentration) (normalised Gamma variates from xoshiro.h, so the chain
  // depends only on the seed, not on the platform). Small concentrations give nearly
  // deterministic chains, large ones nearly uniform chains.
  // Errors (INVALID_ARGUMENT, naming the field under `path_prefix`): vocab outside [2, 65536],
  // negative order, concentration not finite and positive, vocab^order above kMaxContexts or
  // vocab^(order+1) above kMaxTransitions, or a chain whose stationary distribution does not
  // converge (see FromTransitions).
  [[nodiscard]] static absl::StatusOr<MarkovChain> Random(
      const config::MarkovSpec& spec, const std::string& path_prefix = "markov");

  // A chain with the given transition table: transitions[c * vocab + s] = P(next = s | context c),
  // for vocab^order contexts. Each row must be non-negative and sum to 1 within 1e-9 (it is then
  // renormalised). The stationary distribution over contexts is found by power iteration of the
  // lazy chain (I + P) / 2 (aperiodic, same fixed points) until the L1 distance to the fixed
  // point, estimated from the step size and its observed geometric decay, is below 1e-12; a chain
  // that has not converged within a work budget of about 2e9 multiply-adds is INVALID_ARGUMENT.
  // For a reducible chain the result is the stationary distribution reached from the uniform
  // start.
  [[nodiscard]] static absl::StatusOr<MarkovChain> FromTransitions(int order, int vocab,
                                                                   std::vector<double> transitions);

  int order() const { return order_; }
  int vocab() const { return vocab_; }
  int64_t contexts() const { return contexts_; }

  // P(next = symbol | context). Requires context in [0, contexts()) and symbol in [0, vocab()).
  double Probability(int64_t context, int symbol) const {
    return probabilities_[context * vocab_ + symbol];
  }
  // Stationary probability of a context.
  double StationaryProbability(int64_t context) const { return stationary_[context]; }
  // The context after emitting `symbol` from `context`.
  int64_t NextContext(int64_t context, int symbol) const {
    return (context * vocab_ + symbol) % contexts_;
  }

  // The exact entropy rate in nats per symbol: sum over contexts of pi(c) * H(P(. | c)). This is
  // the lowest expected cross-entropy loss any model can reach on data from this chain.
  double EntropyRateNats() const { return entropy_nats_; }

  // n symbols of a stationary run: the initial context is drawn from the stationary distribution,
  // then symbols follow the chain. A pure function of (chain, n, seed). The generator is keyed by
  // a hash of `seed`, so passing the seed that drew the chain does not reuse its random numbers.
  // Requires n >= 0.
  std::vector<uint16_t> Generate(int64_t n, uint64_t seed) const;

 private:
  MarkovChain() = default;
  // Shared by Random and FromTransitions; errors name `prefix`.
  [[nodiscard]] static absl::StatusOr<MarkovChain> Build(int order, int vocab,
                                                         std::vector<double> transitions,
                                                         const std::string& prefix);
  [[nodiscard]] absl::Status ComputeStationary();
  void ComputeDerived();

  int order_ = 0;
  int vocab_ = 0;
  int64_t contexts_ = 0;
  std::vector<double> probabilities_;  // contexts_ x vocab_
  std::vector<double> cumulative_;     // per row; last entry of every row is exactly 1
  std::vector<double> stationary_;     // contexts_
  double entropy_nats_ = 0.0;
};

}  // namespace trainyard::worker

#endif  // TRAINYARD_WORKER_DATA_MARKOV_H_
