// training.sample_tokenizer (config/spec.h): the tokenizer a job's samples print through, and
// sample_prompt's ids through it. Every rank reads it before training (rank 0 keeps it); the
// coordinator reads it at submit when the file is under its data roots, so that a bad one is
// refused before the job runs.
#ifndef TRAINYARD_WORKER_DATA_SAMPLE_TEXT_H_
#define TRAINYARD_WORKER_DATA_SAMPLE_TEXT_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "common/filesystem.h"
#include "config/spec.h"
#include "worker/data/tokenizer.h"

namespace trainyard::worker::data {

struct SampleText {
  std::unique_ptr<Tokenizer> tokenizer;  // null: the job names none
  std::vector<int32_t> prompt;           // sample_prompt through it; empty without a text prompt
};

// INVALID_ARGUMENT naming the field for a tokenizer that cannot be read or has ids beyond
// model.vocab, and for a prompt that is not UTF-8 or whose tokens and sample_tokens exceed
// model.max_seq.
[[nodiscard]] absl::StatusOr<SampleText> LoadSampleText(FileSystem& fs,
                                                        const config::JobSpec& spec);

}  // namespace trainyard::worker::data

#endif  // TRAINYARD_WORKER_DATA_SAMPLE_TEXT_H_
