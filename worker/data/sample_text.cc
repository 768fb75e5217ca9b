#include "worker/data/sample_text.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace trainyard::worker::data {

absl::StatusOr<SampleText> LoadSampleText(FileSystem& fs, const config::JobSpec& spec) {
  const config::TrainingSpec& t = spec.training;
  SampleText text;
  if (t.sample_tokenizer.empty() || t.sample_every == 0) return text;
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = Tokenizer::Load(fs, t.sample_tokenizer);
  if (!tokenizer.ok()) return Annotate(tokenizer.status(), "training.sample_tokenizer");
  text.tokenizer = std::move(*tokenizer);
  if (text.tokenizer->size() > spec.model.vocab) {
    return absl::InvalidArgumentError(
        absl::StrCat("training.sample_tokenizer: ", t.sample_tokenizer, " has ids up to ",
                     text.tokenizer->size() - 1, ", beyond model.vocab ", spec.model.vocab));
  }
  if (t.sample_prompt.empty()) return text;
  absl::StatusOr<std::vector<int32_t>> prompt = text.tokenizer->Encode(t.sample_prompt);
  if (!prompt.ok()) return Annotate(prompt.status(), "training.sample_prompt");
  text.prompt = std::move(*prompt);
  if (static_cast<int64_t>(text.prompt.size()) + t.sample_tokens > spec.model.max_seq) {
    return absl::InvalidArgumentError(
        absl::StrCat("training.sample_tokens: a prompt of ", text.prompt.size(),
                     " tokens (sample_prompt "
                     "through sample_tokenizer) and ",
                     t.sample_tokens, " new ones exceed model.max_seq ", spec.model.max_seq));
  }
  return text;
}

}  // namespace trainyard::worker::data
