// Samples while training (training.sample_every, as llm.c prints them): every sample_every steps
// and at the last step, rank 0 continues a prompt with the model as it stands and prints the
// text to its log.
//
// The model is sharded over the mesh, so rank 0 first gathers it whole: every rank of data- and
// context-parallel coordinate 0 holds a distinct (tensor, pipeline) piece of it; each sends its
// piece to its tensor-parallel group's first rank, which passes it on along the pipeline group
// to rank 0, one piece at a time, so no rank but rank 0 holds more than its own piece and one
// message. Under expert parallelism the ranks of data-parallel coordinates 1 … ep − 1 hold the
// other experts: each sends its piece to its expert-parallel group's first rank (coordinate 0),
// which passes it on after its own, and rank 0 takes only the experts from it. Rank 0 then
// generates with a key/value cache (worker/generate.h) on the rank's own backend and frees the
// copy. Gathering is collective: every rank of the job calls it at the same step (a ZeRO-3 rank
// first gathers its data-parallel shards).
//
// Threading: plain functions, called from the training loop between steps.
#ifndef TRAINYARD_WORKER_SAMPLING_H_
#define TRAINYARD_WORKER_SAMPLING_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "config/spec.h"
#include "worker/backend.h"
#include "worker/data/sampler.h"
#include "worker/data/tokenizer.h"
#include "worker/generate.h"
#include "worker/parallel/parallel_dims.h"
#include "worker/parallel/sharded_params.h"
#include "worker/shape/parameters.h"

namespace trainyard::worker {

// The whole model's parameters in ParameterLayout(spec.model) order on global rank 0, an empty
// vector on every other rank. `local` is this rank's layout and `params` its parameters.
// Communication errors as they come.
[[nodiscard]] absl::StatusOr<std::vector<float>> GatherWholeModel(const config::JobSpec& spec,
                                                                  const ParallelDims& dims,
                                                                  const ParameterLayout& local,
                                                                  parallel::ShardedParams& params,
                                                                  Backend& backend);

// The prompt samples continue without a tokenizer (one tokenizes sample_prompt in
// worker/data/sample_text.h): sample_prompt's bytes, sample_prompt_tokens, or the first
// min(kDefaultSamplePromptTokens, seq_len) tokens of the validation split.
std::vector<int32_t> SamplePrompt(const config::TrainingSpec& training, const BatchSampler& val);

// How step `step` draws its sample: training's sample_* fields, seeded by training.seed and the
// step, so that the same step of the same spec draws the same text on any mesh and after a
// restart.
SampleOptions SampleOptionsAt(const config::TrainingSpec& training, int64_t step);

// The log line of a sample: "sample step S | " then, through `tokenizer` or for a byte-level
// model (vocab 256), the prompt and its continuation as C-escaped text with " → " between them;
// otherwise the ids.
std::string SampleLine(int64_t step, const std::vector<int32_t>& prompt,
                       const std::vector<int32_t>& generated, int vocab,
                       const data::Tokenizer* tokenizer = nullptr);

}  // namespace trainyard::worker

#endif  // TRAINYARD_WORKER_SAMPLING_H_
