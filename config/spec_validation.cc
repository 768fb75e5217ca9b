#include "config/spec_validation.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "config/field_reader.h"
#include "config/run_sections.h"
#include "config/yaml_tree.h"

namespace trainyard::config {
namespace {

using Problem = std::optional<SpecProblem>;

constexpr int kMaxNameLength = 64;
// The generator keeps vocab^order contexts and vocab^(order+1) transition probabilities.
constexpr int64_t kMaxMarkovContexts = 65536;
constexpr int kMaxMarkovVocab = 1 << 16;  // tokens are stored as uint16
constexpr int64_t kMaxMarkovTransitions = int64_t{1} << 24;
constexpr int64_t kMaxMarkovTokens = int64_t{1} << 31;
constexpr int kMaxThreads = 4096;

Problem Bad(std::string path, std::string reason, std::vector<std::string> related = {}) {
  return SpecProblem{std::move(path), std::move(reason), std::move(related)};
}

// NaN fails every comparison, so each check is written as "!(good)".
Problem CheckPositive(const char* path, double value) {
  if (!(value > 0) || !std::isfinite(value))
    return Bad(path, absl::StrCat("must be positive, got ", value));
  return std::nullopt;
}

Problem CheckNonNegative(const char* path, double value) {
  if (!(value >= 0) || !std::isfinite(value)) {
    return Bad(path, absl::StrCat("must be zero or positive, got ", value));
  }
  return std::nullopt;
}

Problem CheckAtLeast(const char* path, int64_t value, int64_t min) {
  if (value < min) return Bad(path, absl::StrCat("must be at least ", min, ", got ", value));
  return std::nullopt;
}

Problem CheckName(const std::string& name) {
  if (name.empty()) return Bad("name", "must not be empty");
  if (name.size() > kMaxNameLength) {
    return Bad("name",
               absl::StrCat("must be at most ", kMaxNameLength, " characters, got ", name.size()));
  }
  for (char c : name) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.') {
      return Bad("name", absl::StrCat("may contain only letters, digits, '-', '_' and '.', got ",
                                      QuoteForMessage(name)));
    }
  }
  if (!absl::ascii_isalnum(static_cast<unsigned char>(name[0]))) {
    return Bad("name",
               absl::StrCat("must start with a letter or digit, got ", QuoteForMessage(name)));
  }
  return std::nullopt;
}

Problem CheckModel(const ModelConfig& model) {
  const absl::Status status = ValidateModelConfig(model, "model");
  if (status.ok()) return std::nullopt;
  const std::string message(status.message());
  const size_t colon = message.find(": ");
  if (colon == std::string::npos) return Bad("model", message);
  std::string path = message.substr(0, colon);
  // The divisibility rules blame heads (kv_heads) but are as often broken by width (heads).
  std::vector<std::string> related;
  if (path == "model.heads") related = {"model.width", "model.preset"};
  if (path == "model.kv_heads") related = {"model.heads", "model.preset"};
  return Bad(std::move(path), message.substr(colon + 2), std::move(related));
}

// schedule: wsd's decay: its steps after the warmup, within the run, and a shape it knows.
Problem CheckWarmupStableDecay(const TrainingSpec& t) {
  if (t.decay_steps == 0) {
    return Bad("training.decay_steps",
               "is required with schedule: wsd (the run's last steps, over which the learning "
               "rate decays to lr × min_lr_ratio)",
               {"training.schedule"});
  }
  if (Problem p = CheckAtLeast("training.decay_steps", t.decay_steps, 1)) return p;
  if (t.warmup_steps + t.decay_steps > t.steps) {
    return Bad("training.decay_steps",
               absl::StrCat("a decay of ", t.decay_steps, " steps after a warmup of ",
                            t.warmup_steps, " does not fit the run (steps ", t.steps, ")"),
               {"training.warmup_steps", "training.steps"});
  }
  if (t.decay_shape != "linear" && t.decay_shape != "cosine" && t.decay_shape != "1-sqrt") {
    std::string suggestion = ClosestMatch(t.decay_shape, {"linear", "cosine", "1-sqrt"});
    return Bad(
        "training.decay_shape",
        absl::StrCat("unknown decay shape ", QuoteForMessage(t.decay_shape),
                     suggestion.empty() ? "; expected linear, cosine or 1-sqrt"
                                        : absl::StrCat("; did you mean '", suggestion, "'?")));
  }
  return std::nullopt;
}

Problem CheckSchedule(const TrainingSpec& t) {
  if (!(t.lr > 0) || !std::isfinite(t.lr)) {
    return Bad("training.lr", absl::StrCat("must be positive, got ", t.lr));
  }
  if (!(t.min_lr_ratio >= 0 && t.min_lr_ratio <= 1)) {
    return Bad("training.min_lr_ratio", absl::StrCat("must be in [0, 1], got ", t.min_lr_ratio));
  }
  if (Problem p = CheckAtLeast("training.warmup_steps", t.warmup_steps, 0)) return p;
  if (t.warmup_steps > t.steps) {
    return Bad("training.warmup_steps",
               absl::StrCat("warmup of ", t.warmup_steps, " steps is longer than the run (steps ",
                            t.steps, ")"),
               {"training.steps"});
  }
  if (t.schedule != "cosine" && t.schedule != "linear" && t.schedule != "constant" &&
      t.schedule != "wsd") {
    std::string suggestion = ClosestMatch(t.schedule, {"cosine", "linear", "constant", "wsd"});
    return Bad(
        "training.schedule",
        absl::StrCat("unknown schedule ", QuoteForMessage(t.schedule),
                     suggestion.empty() ? "; expected cosine, linear, constant or wsd"
                                        : absl::StrCat("; did you mean '", suggestion, "'?")));
  }
  if (t.schedule == "wsd") return CheckWarmupStableDecay(t);
  return std::nullopt;
}

Problem CheckOptimizer(const TrainingSpec& t) {
  if (Problem p = CheckNonNegative("training.weight_decay", t.weight_decay)) return p;
  if (!(t.beta1 >= 0 && t.beta1 < 1)) {
    return Bad("training.beta1", absl::StrCat("must be in [0, 1), got ", t.beta1));
  }
  if (!(t.beta2 >= 0 && t.beta2 < 1)) {
    return Bad("training.beta2", absl::StrCat("must be in [0, 1), got ", t.beta2));
  }
  if (Problem p = CheckPositive("training.eps", t.eps)) return p;
  if (Problem p = CheckNonNegative("training.grad_clip", t.grad_clip)) return p;
  return std::nullopt;
}

// training.sample_*: what the worker's samples need (worker/sampling.h).
Problem CheckSamples(const TrainingSpec& t, const ModelConfig& model) {
  if (Problem p = CheckAtLeast("training.sample_every", t.sample_every, 0)) return p;
  if (Problem p = CheckAtLeast("training.sample_tokens", t.sample_tokens, 1)) return p;
  if (Problem p = CheckAtLeast("training.sample_top_k", t.sample_top_k, 0)) return p;
  if (!(t.sample_temperature >= 0) || !std::isfinite(t.sample_temperature)) {
    return Bad("training.sample_temperature",
               absl::StrCat("must be 0 (greedy) or positive, got ", t.sample_temperature));
  }
  if (!(t.sample_top_p > 0 && t.sample_top_p <= 1)) {
    return Bad("training.sample_top_p",
               absl::StrCat("must be in (0, 1] (1: every token), got ", t.sample_top_p));
  }
  if (!t.sample_prompt.empty() && !t.sample_prompt_tokens.empty()) {
    return Bad("training.sample_prompt", "give sample_prompt or sample_prompt_tokens, not both",
               {"training.sample_prompt_tokens"});
  }
  if (!t.sample_prompt.empty() && model.vocab != 256 && t.sample_tokenizer.empty()) {
    return Bad("training.sample_prompt",
               absl::StrCat("a text prompt needs training.sample_tokenizer or a byte-level model "
                            "(model.vocab 256), this one has ",
                            model.vocab, " tokens; give sample_tokenizer or sample_prompt_tokens"),
               {"model.vocab", "training.sample_prompt_tokens", "training.sample_tokenizer"});
  }
  for (int32_t id : t.sample_prompt_tokens) {
    if (id < 0 || id >= model.vocab) {
      return Bad("training.sample_prompt_tokens",
                 absl::StrCat("token ", id, " is outside the vocabulary [0, ", model.vocab, ")"),
                 {"model.vocab"});
    }
  }
  const int64_t prompt = SamplePromptLength(t);
  if (t.sample_every > 0 && prompt + t.sample_tokens > model.max_seq) {
    return Bad("training.sample_tokens",
               absl::StrCat("a prompt of ", prompt, " tokens and ", t.sample_tokens,
                            " new ones exceed model.max_seq ", model.max_seq),
               {"model.max_seq", "training.sample_prompt"});
  }
  return std::nullopt;
}

Problem CheckTraining(const TrainingSpec& t, const ModelConfig& model) {
  if (Problem p = CheckAtLeast("training.steps", t.steps, 1)) return p;
  if (Problem p = CheckAtLeast("training.batch", t.batch, 1)) return p;
  if (Problem p = CheckAtLeast("training.micro_batch", t.micro_batch, 0)) return p;
  if (t.micro_batch > t.batch) {
    return Bad("training.micro_batch",
               absl::StrCat("micro_batch ", t.micro_batch, " is larger than batch ", t.batch),
               {"training.batch"});
  }
  if (t.micro_batch > 0 && t.batch % t.micro_batch != 0) {
    return Bad("training.micro_batch",
               absl::StrCat("batch ", t.batch, " is not divisible by micro_batch ", t.micro_batch),
               {"training.batch"});
  }
  if (Problem p = CheckAtLeast("training.seq_len", t.seq_len, 1)) return p;
  if (t.seq_len > model.max_seq) {
    return Bad("training.seq_len",
               absl::StrCat("seq_len ", t.seq_len, " exceeds model.max_seq ", model.max_seq),
               {"model.max_seq", "model.preset"});
  }
  if (Problem p = CheckSchedule(t)) return p;
  if (Problem p = CheckOptimizer(t)) return p;
  if (Problem p = CheckAtLeast("training.eval_every", t.eval_every, 0)) return p;
  if (Problem p = CheckAtLeast("training.eval_batches", t.eval_batches, 1)) return p;
  if (Problem p = CheckAtLeast("training.log_every", t.log_every, 1)) return p;
  if (Problem p = CheckAtLeast("training.threads", t.threads, 0)) return p;
  if (t.threads > kMaxThreads) {
    return Bad("training.threads",
               absl::StrCat("must be at most ", kMaxThreads, ", got ", t.threads));
  }
  return CheckSamples(t, model);
}

// base^exponent, saturating just above `limit`.
int64_t PowerUpTo(int64_t base, int exponent, int64_t limit) {
  int64_t result = 1;
  for (int i = 0; i < exponent && result <= limit; ++i) result *= base;
  return result;
}

Problem CheckMarkov(const MarkovSpec& m, const ModelConfig& model, const TrainingSpec& t) {
  if (Problem p = CheckAtLeast("data.markov.order", m.order, 0)) return p;
  if (m.vocab < 2 || m.vocab > kMaxMarkovVocab) {
    return Bad("data.markov.vocab",
               absl::StrCat("must be between 2 and ", kMaxMarkovVocab, ", got ", m.vocab));
  }
  if (m.vocab > model.vocab) {
    return Bad("data.markov.vocab",
               absl::StrCat("vocab ", m.vocab, " exceeds model.vocab ", model.vocab),
               {"model.vocab", "model.preset"});
  }
  if (PowerUpTo(m.vocab, m.order, kMaxMarkovContexts) > kMaxMarkovContexts) {
    return Bad("data.markov.order",
               absl::StrCat("an order-", m.order, " chain over ", m.vocab, " tokens has more than ",
                            kMaxMarkovContexts, " contexts (vocab^order); lower order or vocab"),
               {"data.markov.vocab"});
  }
  if (PowerUpTo(m.vocab, m.order + 1, kMaxMarkovTransitions) > kMaxMarkovTransitions) {
    return Bad("data.markov.vocab",
               absl::StrCat("an order-", m.order, " chain over ", m.vocab, " tokens has more than ",
                            kMaxMarkovTransitions,
                            " transition probabilities (vocab^(order+1)); lower order or vocab"),
               {"data.markov.order"});
  }
  if (Problem p = CheckPositive("data.markov.concentration", m.concentration)) return p;
  const int64_t window = int64_t{t.seq_len} + 1;  // inputs plus the shifted targets
  if (m.train_tokens < window || m.train_tokens > kMaxMarkovTokens) {
    return Bad("data.markov.train_tokens",
               absl::StrCat("must be between training.seq_len + 1 = ", window, " and ",
                            kMaxMarkovTokens, ", got ", m.train_tokens),
               {"training.seq_len"});
  }
  if (m.val_tokens < 0 || m.val_tokens > kMaxMarkovTokens) {
    return Bad("data.markov.val_tokens",
               absl::StrCat("must be between 0 and ", kMaxMarkovTokens, ", got ", m.val_tokens));
  }
  if (t.eval_every > 0 && m.val_tokens < window) {
    return Bad("data.markov.val_tokens",
               absl::StrCat("evaluation (training.eval_every > 0) needs at least seq_len + 1 = ",
                            window, " tokens, got ", m.val_tokens),
               {"training.eval_every", "training.seq_len"});
  }
  return std::nullopt;
}

Problem CheckData(const DataSpec& d, const ModelConfig& model, const TrainingSpec& t) {
  if (d.source != "markov" && d.source != "bin" && d.source != "text") {
    std::string suggestion = ClosestMatch(d.source, {"markov", "bin", "text"});
    return Bad("data.source", absl::StrCat("unknown source ", QuoteForMessage(d.source),
                                           suggestion.empty() ? "; expected markov, bin or text"
                                                              : absl::StrCat("; did you mean '",
                                                                             suggestion, "'?")));
  }
  if (d.source == "markov") return CheckMarkov(d.markov, model, t);
  if (d.path.empty()) {
    return Bad("data.path", absl::StrCat("required when source is ", d.source), {"data.source"});
  }
  if (d.val_path.empty() && !(d.val_fraction > 0 && d.val_fraction < 1)) {
    return Bad("data.val_fraction", absl::StrCat("must be in (0, 1), got ", d.val_fraction));
  }
  if (d.source == "text" && model.vocab < 256) {
    return Bad("model.vocab",
               absl::StrCat("text data is byte-level and needs vocab >= 256, got ", model.vocab),
               {"model.preset", "data.source"});
  }
  return std::nullopt;
}

}  // namespace

std::optional<SpecProblem> FindSpecProblem(const JobSpec& spec, const SpecLimits& limits) {
  if (Problem p = CheckName(spec.name)) return p;
  if (Problem p = CheckModel(spec.model)) return p;
  if (Problem p = CheckTraining(spec.training, spec.model)) return p;
  if (Problem p = CheckData(spec.data, spec.model, spec.training)) return p;
  return FindRunProblem(spec, limits);
}

absl::Status ValidateJobSpec(const JobSpec& spec, const SpecLimits& limits) {
  if (std::optional<SpecProblem> problem = FindSpecProblem(spec, limits)) {
    return absl::InvalidArgumentError(absl::StrCat(problem->path, ": ", problem->reason));
  }
  return absl::OkStatus();
}

}  // namespace trainyard::config
