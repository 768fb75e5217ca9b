// OpenData: turns a validated DataSpec into the training and validation token streams.
//
// Sources:
//   markov  a random chain drawn from spec.markov (markov.h); spec.markov.train_tokens tokens are
//           generated with seed spec.markov.seed for training and spec.markov.val_tokens with
//           seed spec.markov.seed ^ kValidationSeedXor for validation; the entropy rate is known.
//   bin     llm.c shards (bin_shards.h); spec.path is a file or a glob.
//   text    a raw text file as bytes (text_bytes.h), vocabulary 256.
// For bin and text, validation data comes from spec.val_path (same kind as spec.path) when it is
// set; otherwise the last floor(size * spec.val_fraction) tokens are held out and training uses
// the rest. Whether each part is long enough for a sequence is checked by BatchSampler::Check
// (a job that never evaluates may have an empty validation stream, e.g. markov.val_tokens = 0).
//
// Threading: OpenData is reentrant; the returned streams are immutable (see token_stream.h).
#ifndef TRAINYARD_WORKER_DATA_DATASET_H_
#define TRAINYARD_WORKER_DATA_DATASET_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "common/filesystem.h"
#include "config/spec.h"
#include "worker/data/token_stream.h"

namespace trainyard::worker {

inline constexpr uint64_t kValidationSeedXor = 0x9E3779B97F4A7C15ull;

struct DataSplits {
  std::unique_ptr<TokenStream> train;
  std::unique_ptr<TokenStream> val;
  // Every token of both streams is below this; the model's vocabulary must be at least this big.
  int32_t vocab_bound = 0;
  // The exact entropy rate in nats per token when the source knows it (markov): the loss floor.
  std::optional<double> entropy_nats;
  // One line for logs, e.g. "bin: 2 shards matching 'data/train_*.bin', 2000000 tokens, ...".
  std::string description;
};

// Errors: INVALID_ARGUMENT naming the spec field ("data.source: unknown source 'csv' ...",
// "data.val_fraction: ...", "data.markov.order: ..."), or the open errors of the source prefixed
// with the field whose file failed ("data.path: open x.bin: ..." with NOT_FOUND for a missing one).
[[nodiscard]] absl::StatusOr<DataSplits> OpenData(const config::DataSpec& spec, FileSystem& fs);

}  // namespace trainyard::worker

#endif  // TRAINYARD_WORKER_DATA_DATASET_H_
