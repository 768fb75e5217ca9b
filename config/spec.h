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

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

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
  std::string schedule = "cosine";  // cosine | linear | constant | wsd
  // wsd (warmup-stable-decay): lr from the warmup's end until the run's last decay_steps steps
  // (required, ≥ 1), which decay to lr * min_lr_ratio in decay_shape: linear | cosine | 1-sqrt.
  int64_t decay_steps = 0;
  std::string decay_shape = "linear";
  double weight_decay = 0.1;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double grad_clip = 1.0;   // global gradient-norm limit; 0 = off
  int64_t eval_every = 50;  // steps between validation passes; 0 = never
  int eval_batches = 4;     // batches per validation pass
  int64_t log_every = 10;
  int threads = 0;  // CPU threads per rank; 0 = all cores
  // Text generated from the model while it trains (worker/sampling.h): every sample_every steps
  // and at the last one; 0 = never. Each sample continues its prompt by sample_tokens tokens,
  // drawn at sample_temperature (0: greedy) among the sample_top_k most likely (0: all), then
  // among the most likely whose probabilities first reach sample_top_p (1: all).
  int64_t sample_every = 0;
  int sample_tokens = 64;
  std::string sample_prompt;                  // text: through sample_tokenizer, else bytes
  std::vector<int32_t> sample_prompt_tokens;  // or token ids
  // A tokenizer.json (worker/data/tokenizer.h), or a directory holding one: sample_prompt's text
  // is tokenized by it, and samples print as text.
  std::string sample_tokenizer;
  double sample_temperature = 1.0;
  int sample_top_k = 0;
  double sample_top_p = 1.0;
};

// Without sample_prompt or sample_prompt_tokens, samples continue the first this many tokens of
// the validation split (fewer when seq_len is shorter).
inline constexpr int kDefaultSamplePromptTokens = 16;
// The number of tokens the samples' prompt holds; a text prompt's through a tokenizer is known
// only once tokenized (worker/data/sample_text.h), and counts here as none.
inline int SamplePromptLength(const TrainingSpec& t) {
  if (!t.sample_prompt.empty() && !t.sample_tokenizer.empty()) return 0;
  if (!t.sample_prompt.empty()) return static_cast<int>(t.sample_prompt.size());
  if (!t.sample_prompt_tokens.empty()) return static_cast<int>(t.sample_prompt_tokens.size());
  return std::min(kDefaultSamplePromptTokens, t.seq_len);
}

// The device mesh: world = dp x tp x pp ranks, tp innermost (a TP group is tp consecutive ranks,
// so it stays inside a node), then dp, then pp.
// How a pipeline's stages order their passes (worker/shape/schedule.h defines each).
enum class PipelineSchedule {
  kOneForwardOneBackward,  // "1f1b"
  kInterleaved,            // "interleaved": Megatron's interleaved 1F1B over virtual stages
  kZeroBubble,             // "zero-bubble": ZB-H1, the backward split into B and W passes
};
// "1f1b", "interleaved", "zero-bubble": the words specs write (and "auto", for the planner's
// choice: ParallelismSpec::automatic_schedule).
const char* ScheduleName(PipelineSchedule schedule);
// The schedule a word names ("auto" names none: the planner's choice); nullopt for others.
std::optional<PipelineSchedule> ScheduleFromName(std::string_view name);

struct ParallelismSpec {
  // `parallelism: auto`: dp, tp and pp below were chosen by ChooseParallelism (mesh.h) and may be
  // chosen again when the job is resized.
  bool automatic = false;
  int dp = 1;    // data-parallel replicas
  int tp = 1;    // tensor-parallel ranks per layer
  int pp = 1;    // pipeline stages
  int zero = 0;  // ZeRO stage over the dp group: 0 off, 1 optimizer state, 2 +gradients, 3 +params
  // Megatron's sequence parallelism inside tensor-parallel regions (only with tp > 1): the
  // norms' activations are split by rows across the tp group too.
  bool sequence_parallel = false;
  // The pipeline schedule (pp > 1); `parallelism: auto` and meshes chosen for an elastic resize
  // run 1F1B unless the spec's explicit mesh is kept.
  PipelineSchedule schedule = PipelineSchedule::kOneForwardOneBackward;
  // `schedule: auto`: the planner chooses schedule and virtual_stages for the mesh by predicted
  // step time within the memory a rank has (at admission, or in the standalone worker); until it
  // has, schedule is 1f1b.
  bool automatic_schedule = false;
  // Model chunks per pipeline rank (`interleaved` only; 1 otherwise): rank s holds virtual
  // stages s, s + pp, s + 2·pp, …, each model.layers / (pp · virtual_stages) layers.
  int virtual_stages = 1;
  // Context parallelism: ranks that split every sequence between them (ring attention). Rank r
  // of N holds the sequence's chunks r and 2N − 1 − r of 2N (the head-tail split, which balances
  // causal attention); the cp ranks of one data-parallel replica read the same sequences.
  int cp = 1;
  // Expert parallelism: the routed experts of every MoE layer (model.moe) split over groups of
  // `ep` data-parallel ranks (consecutive data-parallel indices); tokens reach their experts by
  // all-to-all. Drawn from dp: it does not change the world size.
  int ep = 1;

  int world_size() const { return dp * cp * tp * pp; }
};

enum class DeviceKind { kCpu, kGpu };

struct ResourcesSpec {
  int nodes = 1;
  int devices_per_node = 1;  // ranks per node: CPU slots (kCpu) or GPUs (kGpu)
  DeviceKind kind = DeviceKind::kCpu;

  int world_size() const { return nodes * devices_per_node; }
};

struct CheckpointSpec {
  std::string dir;  // where checkpoints are written; empty: the job does not checkpoint
  // Steps between checkpoints; nullopt ("auto"): under a coordinator, the steps its Young–Daly
  // policy orders; standalone, kAutoCheckpointEverySteps.
  std::optional<int64_t> every_steps;
  // Bounds on the interval `auto` may choose (only with `auto`).
  int64_t min_every_steps = 10;
  int64_t max_every_steps = 10000;
  int keep = 3;  // committed checkpoints kept; older ones are deleted
  // A checkpoint (or a checkpoint dir: its newest committed one) to start from when `dir` holds
  // none yet, under any mesh.
  std::string resume_from;

  bool enabled() const { return !dir.empty(); }
  int64_t interval_steps() const;  // every_steps, or kAutoCheckpointEverySteps for auto
};

// The interval `checkpoint.every_steps: auto` stands for.
inline constexpr int64_t kAutoCheckpointEverySteps = 100;

inline int64_t CheckpointSpec::interval_steps() const {
  if (every_steps) return *every_steps;
  return std::clamp(kAutoCheckpointEverySteps, min_every_steps, max_every_steps);
}

struct FaultToleranceSpec {
  int max_restarts = 2;  // new attempts after failures before the job is FAILED
  // Elastic bounds on the node count; 0 means resources.nodes (the parser fills them in).
  int min_nodes = 0;
  int max_nodes = 0;
  double heartbeat_timeout_s = 10.0;  // an agent silent this long is lost
  // Restart budgets per failure cause ("crash", "hang", "node_lost", "collective_timeout");
  // a cause left out may use all of max_restarts. User errors are never restarted.
  std::map<std::string, int> max_restarts_by_cause;
  // Delay before the n-th consecutive restart: backoff_initial_s · backoff_multiplier^(n−1),
  // at most backoff_max_s, times a uniform factor in [1 − jitter, 1 + jitter].
  double backoff_initial_s = 1.0;
  double backoff_max_s = 60.0;
  double backoff_multiplier = 2.0;
  double backoff_jitter = 0.2;
  // A step (or a collective inside it) is hung after max(hang_floor_s, hang_step_multiple ×
  // the p99 of the recent step times); before an attempt's first step, after hang_startup_s.
  // Evaluation, sampling and checkpoint saves are held to the same rule over their own recent
  // durations, and to hang_startup_s the first time (config/hang_limit.h).
  double hang_floor_s = 10.0;
  double hang_step_multiple = 10.0;
  double hang_startup_s = 600.0;
  // A rank whose compute time per step exceeds its peers' median by more than this fraction
  // for straggler_window reports in a row is flagged a straggler; 0: off.
  double straggler_margin = 0.25;
  int straggler_window = 5;
  // Restart away from the nodes of ranks flagged as stragglers when enough other nodes are free.
  bool exclude_stragglers = false;
  // A job running on fewer nodes than it may (resources.nodes after losing some, down to
  // min_nodes; up to max_nodes when nodes are free) grows when nodes are free, by a checkpoint and
  // a restart; at most once per this many seconds after its last resize.
  double resize_cooldown_s = 120.0;
  // Under a coordinator whose agents keep a memory tier: every rank snapshots its state into its
  // node's memory (and a peer node's) after every this many steps, and a restart resumes from
  // the newest snapshot every rank has; 0: off; nullopt ("auto"): as often as costs at most
  // kMemorySnapshotBudget of the training time, every step when that is cheap.
  std::optional<int64_t> memory_every_steps;

  bool memory_tier_enabled() const { return !memory_every_steps || *memory_every_steps > 0; }
};

// The share of training time `memory_every_steps: auto` lets snapshots take.
inline constexpr double kMemorySnapshotBudget = 0.05;

// The Prometheus label name a job label `key` becomes on /metrics: "label_" and the key with every
// character other than a letter or digit replaced by '_'. Validation refuses two keys that become
// the same name, which would make a scrape fail.
std::string MetricLabelName(const std::string& key);

struct JobSpec {
  std::string name;
  ModelConfig model;
  // model.init_from: published weights the job starts from instead of a random initialisation
  // (a Hugging Face model directory or an llm.c model file; worker/convert/init_from.h). A
  // checkpoint to resume from takes precedence.
  std::string init_from;
  DataSpec data;
  TrainingSpec training;
  ParallelismSpec parallelism;
  ResourcesSpec resources;
  CheckpointSpec checkpoint;
  FaultToleranceSpec fault_tolerance;
  int priority = 0;  // higher runs first; -1000..1000
  std::map<std::string, std::string> labels;

  int world_size() const { return parallelism.world_size(); }
  int min_nodes() const {
    return fault_tolerance.min_nodes > 0 ? fault_tolerance.min_nodes : resources.nodes;
  }
  int max_nodes() const {
    return fault_tolerance.max_nodes > 0 ? fault_tolerance.max_nodes : resources.nodes;
  }
};

// Where a spec may point. Empty root lists confine nothing (the standalone worker); a server
// passes its configured roots so that a submitted spec cannot read or write elsewhere.
struct SpecLimits {
  // data.path, data.val_path and model.init_from must lie under one of these directories.
  // Relative paths are resolved against the current working directory, and ".." is normalised
  // away, before the comparison.
  std::vector<std::string> allowed_data_roots;
  // checkpoint.dir and checkpoint.resume_from must lie under one of these (same rules).
  std::vector<std::string> allowed_checkpoint_roots;
};

// Parses and validates a YAML spec. `source_name` (a file name) starts every error message.
[[nodiscard]] absl::StatusOr<JobSpec> ParseJobSpec(std::string_view yaml_text,
                                                   std::string_view source_name = "<spec>",
                                                   const SpecLimits& limits = SpecLimits());

// A spec read back: from the job store, or by a worker from its coordinator. It was accepted when
// it was submitted, perhaps by an older build, so fields written where they have no effect (which
// ParseJobSpec refuses as mistakes) are ignored instead, each listed in `ignored` as
// "<field.path>: <reason>". Every other check holds; the roots were checked at submission.
[[nodiscard]] absl::StatusOr<JobSpec> ParseStoredJobSpec(
    std::string_view yaml_text, std::string_view source_name,
    std::vector<std::string>* ignored = nullptr);

// Reads `path` from `fs` and parses it, naming the file in errors. A missing file is NOT_FOUND;
// a file over 1 MiB is INVALID_ARGUMENT without being read.
[[nodiscard]] absl::StatusOr<JobSpec> LoadJobSpec(FileSystem& fs, const std::string& path,
                                                  const SpecLimits& limits = SpecLimits());

// Cross-field checks on a spec however it was built. Errors are INVALID_ARGUMENT,
// "<field.path>: <reason>" (ParseJobSpec adds the source, line and column).
[[nodiscard]] absl::Status ValidateJobSpec(const JobSpec& spec,
                                           const SpecLimits& limits = SpecLimits());

std::string DeviceKindName(DeviceKind kind);  // "cpu" | "gpu"

// The largest spec accepted, in bytes (1 MiB).
inline constexpr size_t kMaxSpecBytes = size_t{1} << 20;

}  // namespace trainyard::config

#endif  // TRAINYARD_CONFIG_SPEC_H_
