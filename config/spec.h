// The job spec: what a user submits (as YAML, documented field by field in config/README.md) and
// the typed, validated structs every other component reads.
//
// Parsing is strict: unknown fields, wrong types, anchors/aliases, tags, duplicate keys, specs over
// 1 MiB and nesting deeper than 32 levels are refused. Every error is INVALID_ARGUMENT with one
// line, "<source>:<line>:<column>: <field.path>: <reason>"; a spec that parses has also passed
// ValidateJobSpec.
//
// Threading: plain functions and values; no shared state.
#ifndef TRAINYARD_CONFIG_SPEC_H_
#define TRAINYARD_CONFIG_SPEC_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/filesystem.h"
#include "config/model_config.h"

namespace trainyard::config {

// A synthetic token stream from a random Markov chain with a known entropy rate.
struct MarkovSpec {
  int order = 1;                // tokens of context each next-token distribution depends on
  int vocab = 32;               // distinct tokens the chain emits (must be <= model.vocab)
  double concentration = 0.05;  // Dirichlet concentration of each transition row (lower: peakier)
  int64_t train_tokens = 1 << 20;
  int64_t val_tokens = 1 << 16;
  uint64_t seed = 1234;  // the chain and both streams are a pure function of this seed
};

struct DataSpec {
  std::string source = "markov";  // markov | bin | text
  std::string path;               // bin: a file or a glob of shard files (llm.c .bin); text: a file
  std::string val_path;           // optional separate validation file/glob
  double val_fraction = 0.05;     // used when val_path is empty (last fraction of tokens held out)
  MarkovSpec markov;
};

struct TrainingSpec {
  int64_t steps = 100;
  int batch = 8;  // sequences per optimizer step (global batch)
  int micro_batch =
      0;  // sequences per forward/backward; 0 = batch (no accumulation); divides batch
  int seq_len = 32;
  uint64_t seed = 1;
  double lr = 3e-3;
  double min_lr_ratio = 0.1;  // the schedule decays to lr * min_lr_ratio
  int64_t warmup_steps = 10;
  std::string schedule = "cosine";  // cosine | linear | constant
  double weight_decay = 0.1;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double grad_clip = 1.0;   // global gradient-norm limit; 0 = off
  int64_t eval_every = 50;  // steps between validation passes; 0 = never
  int eval_batches = 4;     // batches per validation pass
  int64_t log_every = 10;
  int threads = 0;  // CPU threads per rank; 0 = all cores
};

struct JobSpec {
  std::string name;
  ModelConfig model;
  DataSpec data;
  TrainingSpec training;
};

// Parses and validates a YAML spec. `source_name` (a file name) starts every error message.
absl::StatusOr<JobSpec> ParseJobSpec(std::string_view yaml_text,
                                     std::string_view source_name = "<spec>");

// Reads `path` from `fs` and parses it, naming the file in errors. A missing file is NOT_FOUND;
// a file over 1 MiB is INVALID_ARGUMENT without being read.
absl::StatusOr<JobSpec> LoadJobSpec(FileSystem& fs, const std::string& path);

// Cross-field checks on a spec however it was built. Errors are INVALID_ARGUMENT,
// "<field.path>: <reason>" (ParseJobSpec adds the source, line and column).
absl::Status ValidateJobSpec(const JobSpec& spec);

// The largest spec accepted, in bytes (1 MiB).
inline constexpr size_t kMaxSpecBytes = size_t{1} << 20;

}  // namespace trainyard::config

#endif  // TRAINYARD_CONFIG_SPEC_H_
