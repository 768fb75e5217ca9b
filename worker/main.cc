// trainyard-worker: one rank of a training job. It runs standalone:
//
//   trainyard-worker --standalone SPEC.yaml [--threads N]
//
// Run again after a crash, it continues from the newest committed checkpoint in checkpoint.dir.
// SIGTERM drains: every rank stops at the same step boundary after a committed checkpoint, and
// the process exits 0 (what a batch system's warning signal before a time limit needs).
//
// or, started by a node agent, as one rank of a job the coordinator runs (worker/coordinated.h):
//
//   trainyard-worker --coordinator HOST:PORT --job JOB --attempt N --rank R
//
// Exit codes: 0 trained to the end; 2 bad input (spec, data file, flags); 1 anything else.
//
// or, for `trainyard plan --calibrate`, measures this machine's cpu profile (worker/calibrate.h)
// and prints it as one JSON object on stdout (planner::CalibrationToJson):
//
//   trainyard-worker calibrate --scratch DIR [--reference SPEC.yaml] [--threads N]
//                              [--seconds-per-probe S] [--seconds-per-link-probe S]
//
// Exit codes: 0 measured; 2 bad flags or reference spec; 1 the calibration failed (one line on
// stderr).
//
// or exports a checkpoint of any mesh as a Hugging Face model directory (worker/convert/):
//
//   trainyard-worker export CHECKPOINT --format hf|llmc --out DIR|FILE [--dtype fp32|bf16]
//                           [--max-shard-size SIZE]
//
// Exit codes: 0 exported; 2 bad flags or input (nothing is written); 1 anything else.
//
// or generates text from a checkpoint or published weights (worker/generate.h):
//
//   trainyard-worker sample WEIGHTS [--prompt TEXT | --prompt-tokens IDS] [--tokens N]
//                           [--temperature T] [--top-k K] [--seed S] [--device cpu|cuda]
//
// or turns text files into llm.c token shards through a tokenizer (worker/tokenize_command.h):
//
//   trainyard-worker tokenize FILE... --tokenizer PATH --out DIR [--field NAME]
//                             [--separator TEXT] [--shard-tokens N] [--threads N]
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <new>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/exit_codes.h"
#include "common/filesystem.h"
#include "common/flags.h"
#include "common/logging.h"
#include "common/status.h"
#include "config/spec.h"
#include "planner/calibration.h"
#include "planner/planner.h"
#include "worker/backend.h"
#include "worker/calibrate.h"
#include "worker/checkpoint/reader.h"
#include "worker/convert/hf_export.h"
#include "worker/convert/init_from.h"
#include "worker/convert/llmc_export.h"
#include "worker/convert/weights.h"
#include "worker/coordinated.h"
#include "worker/cuda_backend.h"
#include "worker/data/tokenizer.h"
#include "worker/flags.h"
#include "worker/generate.h"
#include "worker/launcher.h"
#include "worker/parallel/kv_store.h"
#include "worker/parallel/placement.h"
#include "worker/run_report.h"
#include "worker/tokenize_command.h"
#include "worker/trainer.h"

namespace trainyard::worker {
namespace {

// One line: errors start with it.
constexpr char kUsage[] =
    "usage: trainyard-worker --standalone SPEC.yaml [--threads N] [--collective-timeout-s S]";

constexpr char kHelp[] =
    "One rank of a training job.\n"
    "\n"
    "Standalone: trains SPEC.yaml without a coordinator, every rank of a multi-rank spec as a\n"
    "local child process.\n"
    "  --threads N               CPU threads per rank (default: the spec's training.threads);\n"
    "                            CPU specs only\n"
    "  --collective-timeout-s S  fail a collective that waits longer than S (default 60)\n"
    "\n"
    "       trainyard-worker --coordinator HOST:PORT --job JOB --attempt N --rank R [--threads N]\n"
    "                        [--join-timeout-s S] [--collective-timeout-s S]\n"
    "\n"
    "Coordinated: how trainyard-agent starts a rank of an attempt the coordinator placed; it "
    "joins\n"
    "the attempt's rendezvous, trains, checkpoints and reports progress. Not for direct use.\n"
    "  --coordinator HOST:PORT   the coordinator's gRPC address\n"
    "  --job JOB --attempt N --rank R   which rank of which attempt\n"
    "  --join-timeout-s S        give up joining after S (default 300)\n"
    "  The agent sets its environment: TRAINYARD_MEMORY_TIER (its memory tier), TRAINYARD_TLS_CA,\n"
    "  _CERT, _KEY (mutual TLS), TRAINYARD_GLOO_HOSTNAME (where its collectives listen),\n"
    "  TRAINYARD_PROGRESS_RELAY (the agent's relay its progress reports go through).\n"
    "\n"
    "Exit codes: 0 done; 1 an error outside the job; 2 bad flags, spec or data; 3 a collective\n"
    "timed out or a peer left; 4 the hang watchdog ended the rank; 5 out of memory.\n"
    "\n"
    "       trainyard-worker calibrate --scratch DIR [--reference SPEC.yaml] [--threads N]\n"
    "                        [--seconds-per-probe S] [--seconds-per-link-probe S]\n"
    "\n"
    "Calibrate: how `trainyard plan --calibrate` measures this machine's cpu profile; prints it\n"
    "as JSON on stdout. Exit codes: 0 measured; 2 bad flags or spec; 1 the calibration failed.\n"
    "  --scratch DIR             where the probes' ranks meet (created, then removed)\n"
    "  --reference SPEC.yaml     run the spec's model and per-rank micro-batch (default\n"
    "                            gpt2-tiny, 4 x 64 tokens)\n"
    "  --threads N               CPU backend threads of the GEMM and bandwidth probes (default:\n"
    "                            every core)\n"
    "  --seconds-per-probe S     each round of a compute probe (default 0.5)\n"
    "  --seconds-per-link-probe S  each link probe, its rounds together (default 3)\n"
    "\n"
    "       trainyard-worker export CHECKPOINT --format hf|llmc --out DIR|FILE\n"
    "                        [--dtype fp32|bf16] [--max-shard-size SIZE]\n"
    "\n"
    "Export: a checkpoint as a Hugging Face model directory or an llm.c model file (see\n"
    "`export --help`).\n"
    "\n"
    "       trainyard-worker sample WEIGHTS [--prompt TEXT | --prompt-tokens IDS] [--tokens N]\n"
    "                        [--temperature T] [--top-k K] [--seed S] [--device cpu|cuda]\n"
    "\n"
    "Sample: text generated from a checkpoint or published weights (see `sample --help`).\n";

constexpr char kCalibrateUsage[] =
    "usage: trainyard-worker calibrate --scratch DIR [--reference SPEC.yaml] [--threads N] "
    "[--seconds-per-probe S] [--seconds-per-link-probe S]";

struct Flags {
  std::string spec_path;
  int threads = -1;        // -1: from the spec (per rank)
  int rank = -1;           // set by the local launcher for each child
  std::string rendezvous;  // the launcher's shared rendezvous directory
  double collective_timeout_s = 60;
};

absl::StatusOr<Flags> ParseFlags(int argc, char** argv) {
  constexpr std::string_view kFlags[] = {"standalone", "threads", "rank", "rendezvous",
                                         "collective-timeout-s"};
  TY_ASSIGN_OR_RETURN(const CommandLine line, ParseCommandLine(argc, argv, 1, kFlags));
  if (line.help) {
    std::cout << kUsage << "\n\n" << kHelp;
    std::exit(0);
  }
  TY_RETURN_IF_ERROR(RefusePositionals(line));
  Flags flags;
  flags.spec_path = absl::GetFlag(FLAGS_standalone);
  if (line.Has("threads")) {
    flags.threads = absl::GetFlag(FLAGS_threads);
    if (flags.threads < 1) return absl::InvalidArgumentError("--threads must be positive");
  }
  if (line.Has("rank")) {
    flags.rank = absl::GetFlag(FLAGS_rank);
    if (flags.rank < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--rank must be a non-negative integer, got ", flags.rank));
    }
  }
  flags.rendezvous = absl::GetFlag(FLAGS_rendezvous);
  TY_ASSIGN_OR_RETURN(
      const absl::Duration timeout,
      PositiveSeconds("collective-timeout-s", absl::GetFlag(FLAGS_collective_timeout_s)));
  flags.collective_timeout_s = absl::ToDoubleSeconds(timeout);
  if (flags.spec_path.empty()) {
    return absl::InvalidArgumentError("--standalone SPEC.yaml is required");
  }
  if ((flags.rank >= 0) != !flags.rendezvous.empty()) {
    return absl::InvalidArgumentError("--rank and --rendezvous go together");
  }
  return flags;
}

// `trainyard-worker calibrate`'s flags; the reference is its spec's path (empty: the default).
struct CalibrateFlags {
  planner::CalibrationOptions options;
  std::string reference_path;
};

absl::StatusOr<CalibrateFlags> ParseCalibrateFlags(int argc, char** argv) {
  constexpr std::string_view kFlags[] = {"scratch", "reference", "threads", "seconds-per-probe",
                                         "seconds-per-link-probe"};
  TY_ASSIGN_OR_RETURN(const CommandLine line, ParseCommandLine(argc, argv, 2, kFlags, "calibrate"));
  if (line.help) {
    std::cout << kCalibrateUsage << "\n\n" << kHelp;
    std::exit(0);
  }
  TY_RETURN_IF_ERROR(RefusePositionals(line, "calibrate"));
  CalibrateFlags flags;
  flags.options.scratch_dir = absl::GetFlag(FLAGS_scratch);
  flags.reference_path = absl::GetFlag(FLAGS_reference);
  if (line.Has("threads")) {
    flags.options.threads = absl::GetFlag(FLAGS_threads);
    if (flags.options.threads < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("--threads must be a positive integer, got ", flags.options.threads));
    }
  }
  TY_ASSIGN_OR_RETURN(const absl::Duration probe,
                      PositiveSeconds("seconds-per-probe", absl::GetFlag(FLAGS_seconds_per_probe)));
  TY_ASSIGN_OR_RETURN(
      const absl::Duration link_probe,
      PositiveSeconds("seconds-per-link-probe", absl::GetFlag(FLAGS_seconds_per_link_probe)));
  flags.options.seconds_per_probe = absl::ToDoubleSeconds(probe);
  flags.options.seconds_per_link_probe = absl::ToDoubleSeconds(link_probe);
  if (flags.options.scratch_dir.empty()) {
    return absl::InvalidArgumentError("--scratch DIR is required");
  }
  return flags;
}

bool IsCalibrateInvocation(int argc, char** argv) {
  return argc >= 2 && std::string_view(argv[1]) == "calibrate";
}

// `trainyard-worker calibrate`: returns the exit code, having said why on stderr.
int RunCalibrate(int argc, char** argv) {
  absl::StatusOr<CalibrateFlags> flags = ParseCalibrateFlags(argc, argv);
  absl::Status bad_input = Annotate(flags.status(), kCalibrateUsage);
  if (flags.ok() && !flags->reference_path.empty()) {
    absl::StatusOr<config::JobSpec> spec =
        config::LoadJobSpec(*RealFileSystem(), flags->reference_path);
    if (spec.ok()) flags->options.reference = planner::CalibrationReference(*spec);
    bad_input = spec.status();
  }
  if (!bad_input.ok()) {
    std::cerr << "trainyard-worker: error: " << bad_input.message() << "\n";
    return kExitUserError;
  }
  // Before anything starts a thread: the link probes fork.
  absl::StatusOr<planner::Calibration> calibration = CalibrateCpu(flags->options);
  if (!calibration.ok()) {
    std::cerr << "trainyard-worker: error: " << calibration.status().message() << "\n";
    return kExitInternalError;
  }
  std::cout << planner::CalibrationToJson(*calibration) << std::flush;
  return kExitOk;
}

constexpr char kExportUsage[] =
    "usage: trainyard-worker export CHECKPOINT --format hf|llmc --out DIR|FILE "
    "[--dtype fp32|bf16] [--max-shard-size SIZE]";

constexpr char kExportHelp[] =
    "Export: writes a checkpoint (a checkpoint directory, or a checkpoint.dir whose newest\n"
    "committed checkpoint is taken) as a Hugging Face model directory that transformers loads\n"
    "as GPT2LMHeadModel, LlamaForCausalLM or MixtralForCausalLM (config.json and\n"
    "model.safetensors), or as an llm.c GPT-2 model file (gpt2_124M.bin's layout).\n"
    "  --format hf|llmc        Hugging Face's directory, or llm.c's file\n"
    "  --out DIR|FILE          hf: a new or empty directory; llmc: a new file\n"
    "  --dtype fp32|bf16       the tensors' type (default fp32; llmc: version 3 or 5)\n"
    "  --max-shard-size SIZE   hf: split into files of at most SIZE (\"2GB\", \"500MiB\") with\n"
    "                          model.safetensors.index.json (default: one file)\n";

bool IsExportInvocation(int argc, char** argv) {
  return argc >= 2 &&
         (std::string_view(argv[1]) == "export" || std::string_view(argv[1]) == "--export");
}

struct ExportFlags {
  std::string source;
  bool llmc = false;  // --format llmc, else hf
  convert::ExportOptions options;
};

absl::StatusOr<ExportFlags> ParseExportFlags(int argc, char** argv) {
  constexpr std::string_view kFlags[] = {"format", "out", "dtype", "max-shard-size"};
  TY_ASSIGN_OR_RETURN(const CommandLine line, ParseCommandLine(argc, argv, 2, kFlags, "export"));
  if (line.help) {
    std::cout << kExportUsage << "\n\n" << kExportHelp;
    std::exit(0);
  }
  if (line.positionals.size() > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("unexpected argument '", line.positionals[1], "' for export"));
  }
  convert::ExportOptions options;
  const std::string format = absl::GetFlag(FLAGS_format);
  if (line.Has("format") && format != "hf" && format != "llmc") {
    return absl::InvalidArgumentError(
        absl::StrCat("--format must be hf (Hugging Face) or llmc (llm.c), got '", format, "'"));
  }
  if (format == "llmc" && line.Has("max-shard-size")) {
    return absl::InvalidArgumentError("--max-shard-size is not used with --format llmc");
  }
  options.out_dir = absl::GetFlag(FLAGS_out);
  const std::string dtype = absl::GetFlag(FLAGS_dtype);
  if (dtype != "fp32" && dtype != "bf16") {
    return absl::InvalidArgumentError(
        absl::StrCat("--dtype must be fp32 or bf16, got '", dtype, "'"));
  }
  options.dtype = dtype == "bf16" ? convert::TensorDtype::kBF16 : convert::TensorDtype::kF32;
  if (line.Has("max-shard-size")) {
    TY_ASSIGN_OR_RETURN(options.max_shard_bytes,
                        convert::ParseByteSize(absl::GetFlag(FLAGS_max_shard_size)));
  }
  if (line.positionals.empty()) {
    return absl::InvalidArgumentError("the CHECKPOINT to export is required");
  }
  if (format.empty()) return absl::InvalidArgumentError("--format hf or --format llmc is required");
  if (options.out_dir.empty()) {
    return absl::InvalidArgumentError(format == "llmc" ? "--out FILE is required"
                                                       : "--out DIR is required");
  }
  return ExportFlags{.source = line.positionals[0], .llmc = format == "llmc", .options = options};
}

// `trainyard-worker export`: returns the exit code, having said why on stderr.
int RunExport(int argc, char** argv) {
  absl::StatusOr<ExportFlags> flags = ParseExportFlags(argc, argv);
  if (!flags.ok()) {
    std::cerr << "trainyard-worker: error: " << Annotate(flags.status(), kExportUsage).message()
              << "\n";
    return kExitUserError;
  }
  const convert::ExportOptions& options = flags->options;
  absl::StatusOr<convert::ExportResult> result =
      flags->llmc ? convert::ExportLlmc(*RealFileSystem(), flags->source, options)
                  : convert::ExportHf(*RealFileSystem(), flags->source, options);
  if (!result.ok()) {
    std::cerr << "trainyard-worker: error: " << result.status().message() << "\n";
    return ExitCodeForStatus(result.status());
  }
  std::cout << absl::StrFormat(
      "exported step %d of %s to %s: %d file%s, %.1f MiB of %s tensors in %.2f s (%.0f MB/s)\n",
      result->step, result->checkpoint, options.out_dir, result->files,
      result->files == 1 ? "" : "s", result->tensor_bytes / 1048576.0,
      convert::DtypeName(options.dtype), result->seconds,
      result->tensor_bytes / 1e6 / std::max(result->seconds, 1e-9));
  return kExitOk;
}

constexpr char kSampleUsage[] =
    "usage: trainyard-worker sample WEIGHTS [--prompt TEXT | --prompt-tokens IDS] "
    "[--tokenizer PATH] [--tokens N] [--temperature T] [--top-k K] [--top-p P] [--seed S] "
    "[--eos IDS|none] [--device cpu|cuda] [--threads N]";

constexpr char kSampleHelp[] =
    "Sample: generates text from a model, with a key/value cache. WEIGHTS is a checkpoint\n"
    "directory, a checkpoint.dir (its newest committed checkpoint), a Hugging Face model\n"
    "directory or an llm.c model file.\n"
    "  --prompt TEXT          the prompt as text, tokenized by the tokenizer (a Hugging Face\n"
    "                         directory's tokenizer.json, or --tokenizer), else as bytes (a\n"
    "                         model with a 256-token vocabulary); the text is printed, then\n"
    "                         what follows it\n"
    "  --tokenizer PATH       a BPE tokenizer.json (GPT-2's, Llama's, Mistral's), or a\n"
    "                         directory holding one, for --prompt\n"
    "  --prompt-tokens IDS    the prompt as token ids (\"5 17 3\" or \"5,17,3\"); the new ids\n"
    "                         are printed on one line\n"
    "  --tokens N             new tokens (default 32; prompt + N at most the model's max_seq)\n"
    "  --temperature T        0 (the default) is greedy: the most likely token each time\n"
    "  --top-k K              draw only among the K most likely tokens (default: all; T > 0)\n"
    "  --top-p P              then only among the most likely tokens whose probabilities first\n"
    "                         add up to P, in (0, 1] (default 1: all; T > 0)\n"
    "  --seed S               the draws' seed (default 0): the same seed, the same text (T > 0)\n"
    "  --eos IDS              the token ids that end the text (\"2\" or \"128001,128009\"), or\n"
    "                         none; default: a Hugging Face directory's eos_token_id\n"
    "                         (generation_config.json, else config.json), else none\n"
    "  --device cpu|cuda      where the model runs (default cpu)\n"
    "  --threads N            CPU threads (default: every core; --device cpu)\n";

struct SampleFlags {
  std::string weights, prompt, prompt_tokens, tokenizer, device = "cpu";
  bool has_prompt = false;
  std::optional<std::vector<int32_t>> eos;  // --eos; unset: the weights' own
  SampleOptions options;
  int threads = 0;
};

// Flags that the others make no-ops are refused by name: greedy decoding (temperature 0, the
// default) draws nothing, and a CUDA model runs no CPU threads.
absl::Status RefuseUnusedSampleFlags(const CommandLine& line, const SampleFlags& flags) {
  if (flags.options.temperature == 0) {
    constexpr std::string_view kDrawFlags[] = {"top-k", "top-p", "seed"};
    TY_RETURN_IF_ERROR(RefuseGiven(
        line, kDrawFlags, " is not used when --temperature is 0 (greedy: the most likely token)"));
  }
  if (flags.device != "cuda") return absl::OkStatus();
  constexpr std::string_view kCpuFlags[] = {"threads"};
  return RefuseGiven(line, kCpuFlags, " is not used with --device cuda (CPU threads)");
}

// Token ids separated by spaces or commas ("5 17 3" or "5,17,3"), each in [0, limit), of the flag
// --`flag`: a part that is not one is refused as "--flag: 'part' `not_an_id`", no ids at all as
// "--flag holds no token ids`none_note`".
absl::StatusOr<std::vector<int32_t>> ParseTokenIds(const std::string& text, const std::string& flag,
                                                   int64_t limit, const std::string& not_an_id,
                                                   const std::string& none_note = "") {
  std::vector<int32_t> ids;
  for (absl::string_view part : absl::StrSplit(text, absl::ByAnyChar(" ,"), absl::SkipEmpty())) {
    int32_t id;
    if (!absl::SimpleAtoi(part, &id) || id < 0 || id >= limit) {
      return absl::InvalidArgumentError(absl::StrCat("--", flag, ": '", part, "' ", not_an_id));
    }
    ids.push_back(id);
  }
  if (ids.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, " holds no token ids", none_note));
  }
  return ids;
}

// --eos: "none", or token ids (checked against the vocabulary once the weights are read).
absl::StatusOr<std::vector<int32_t>> ParseEosFlag(const std::string& text) {
  if (text == "none") return std::vector<int32_t>{};
  return ParseTokenIds(text, "eos", int64_t{INT32_MAX} + 1, "is not a token id (give ids, or none)",
                       " (give ids, or none)");
}

absl::StatusOr<SampleFlags> ParseSampleFlags(int argc, char** argv) {
  constexpr std::string_view kFlags[] = {"prompt",      "prompt-tokens", "tokenizer", "tokens",
                                         "temperature", "top-k",         "top-p",     "seed",
                                         "eos",         "device",        "threads"};
  TY_ASSIGN_OR_RETURN(const CommandLine line, ParseCommandLine(argc, argv, 2, kFlags, "sample"));
  if (line.help) {
    std::cout << kSampleUsage << "\n\n" << kSampleHelp;
    std::exit(0);
  }
  if (line.positionals.size() > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("unexpected argument '", line.positionals[1], "' for sample"));
  }
  SampleFlags flags;
  flags.prompt = absl::GetFlag(FLAGS_prompt);
  flags.has_prompt = line.Has("prompt");
  flags.prompt_tokens = absl::GetFlag(FLAGS_prompt_tokens);
  flags.tokenizer = absl::GetFlag(FLAGS_tokenizer);
  flags.options.tokens = absl::GetFlag(FLAGS_tokens);
  flags.options.top_k = absl::GetFlag(FLAGS_top_k);
  flags.options.top_p = absl::GetFlag(FLAGS_top_p);
  flags.options.temperature = absl::GetFlag(FLAGS_temperature);
  flags.options.seed = absl::GetFlag(FLAGS_seed);
  flags.device = absl::GetFlag(FLAGS_device);
  if (flags.options.tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tokens must be an integer of at least 1, got ", flags.options.tokens));
  }
  if (flags.options.top_k < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--top-k must be an integer of at least 0, got ", flags.options.top_k));
  }
  if (!(flags.options.top_p > 0.0f && flags.options.top_p <= 1.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--top-p must be a number in (0, 1], got ", flags.options.top_p));
  }
  if (line.Has("eos")) {
    TY_ASSIGN_OR_RETURN(flags.eos, ParseEosFlag(absl::GetFlag(FLAGS_eos)));
  }
  if (line.Has("threads")) {
    flags.threads = absl::GetFlag(FLAGS_threads);
    if (flags.threads < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("--threads must be an integer of at least 1, got ", flags.threads));
    }
  }
  if (!(flags.options.temperature >= 0) || !std::isfinite(flags.options.temperature)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--temperature must be a number of at least 0, got ", flags.options.temperature));
  }
  if (flags.device != "cpu" && flags.device != "cuda") {
    return absl::InvalidArgumentError(
        absl::StrCat("--device must be cpu or cuda, got '", flags.device, "'"));
  }
  TY_RETURN_IF_ERROR(RefuseUnusedSampleFlags(line, flags));
  if (line.positionals.empty()) {
    return absl::InvalidArgumentError("the WEIGHTS to sample is required");
  }
  flags.weights = line.positionals[0];
  if (flags.has_prompt == !flags.prompt_tokens.empty()) {
    return absl::InvalidArgumentError("give one of --prompt TEXT and --prompt-tokens IDS");
  }
  if (flags.has_prompt && flags.prompt.empty()) {
    return absl::InvalidArgumentError("--prompt must not be empty");
  }
  if (line.Has("tokenizer") && !flags.has_prompt) {
    return absl::InvalidArgumentError(
        "--tokenizer is not used with --prompt-tokens (it tokenizes --prompt's text)");
  }
  return flags;
}

// Where --prompt's tokenizer is: --tokenizer, else a Hugging Face directory's tokenizer.json;
// empty for none.
std::string PromptTokenizerPath(const SampleFlags& flags) {
  FileSystem& fs = *RealFileSystem();
  if (!flags.tokenizer.empty()) return flags.tokenizer;
  if (flags.has_prompt && fs.IsDirectory(flags.weights) &&
      fs.Exists(ChildPath(flags.weights, "tokenizer.json"))) {
    return ChildPath(flags.weights, "tokenizer.json");
  }
  return "";
}

// The tokenizer at `path` (null when empty), whose ids must lie in the model's vocabulary.
absl::StatusOr<std::unique_ptr<data::Tokenizer>> PromptTokenizer(const std::string& path,
                                                                 int vocab) {
  FileSystem& fs = *RealFileSystem();
  if (path.empty()) return nullptr;
  TY_ASSIGN_OR_RETURN(std::unique_ptr<data::Tokenizer> tokenizer, data::Tokenizer::Load(fs, path));
  if (tokenizer->size() > vocab) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": the tokenizer has ids up to ",
                                                   tokenizer->size() - 1,
                                                   ", beyond the model's vocabulary of ", vocab));
  }
  return tokenizer;
}

// The prompt's token ids: --prompt tokenized (or its bytes, for a byte-level vocabulary), or
// --prompt-tokens.
absl::StatusOr<std::vector<int32_t>> PromptTokens(const SampleFlags& flags, int vocab,
                                                  const data::Tokenizer* tokenizer) {
  if (flags.has_prompt && tokenizer != nullptr) {
    absl::StatusOr<std::vector<int32_t>> ids = tokenizer->Encode(flags.prompt);
    if (!ids.ok()) return Annotate(ids.status(), "--prompt");
    return *ids;
  }
  if (flags.has_prompt) {
    if (vocab != 256) {
      return absl::InvalidArgumentError(
          absl::StrCat("--prompt needs a tokenizer (--tokenizer PATH, or a Hugging Face "
                       "directory's tokenizer.json) or a byte-level model (vocabulary 256); "
                       "this one has ",
                       vocab, " tokens: give --tokenizer, or use --prompt-tokens"));
    }
    std::vector<int32_t> tokens;
    for (unsigned char byte : flags.prompt) tokens.push_back(byte);
    return tokens;
  }
  return ParseTokenIds(flags.prompt_tokens, "prompt-tokens", vocab,
                       absl::StrCat("is not a token id below the vocabulary of ", vocab));
}

// When a generation's prompt pass and its tokens ran, told on stderr after the text: the prompt's
// pass (with the first token drawn) and each later token, as llama.cpp's and vLLM's reports do.
class GenerationClock {
 public:
  void Token() {
    if (tokens_++ == 0) first_ = absl::Now();
  }
  std::string Report(size_t prompt_tokens) const {
    const double prompt_s = absl::ToDoubleSeconds(first_ - start_);
    const double rest_s = absl::ToDoubleSeconds(absl::Now() - first_);
    std::string out = absl::StrFormat("prompt: %d tokens in %.1f ms (%.1f tokens/s)", prompt_tokens,
                                      1e3 * prompt_s, prompt_tokens / prompt_s);
    if (tokens_ > 1) {
      absl::StrAppendFormat(&out, "; then %d tokens in %.1f ms (%.1f tokens/s)", tokens_ - 1,
                            1e3 * rest_s, (tokens_ - 1) / rest_s);
    }
    return out;
  }

 private:
  absl::Time start_ = absl::Now(), first_;
  int64_t tokens_ = 0;
};

absl::Status Sample(const SampleFlags& flags) {
  TY_ASSIGN_OR_RETURN(convert::LoadedWeights weights,
                      convert::LoadModelWeights(*RealFileSystem(), flags.weights));
  const std::string tokenizer_path = PromptTokenizerPath(flags);
  TY_ASSIGN_OR_RETURN(const std::unique_ptr<data::Tokenizer> tokenizer,
                      PromptTokenizer(tokenizer_path, weights.model.vocab));
  TY_ASSIGN_OR_RETURN(const std::vector<int32_t> prompt,
                      PromptTokens(flags, weights.model.vocab, tokenizer.get()));
  std::unique_ptr<Backend> backend;
  if (flags.device == "cuda" && weights.model.moe.enabled()) {
    // As for training jobs (config/mesh.cc): the MoE layers' CUDA path has not run on a device.
    return absl::InvalidArgumentError(
        "--device cuda: a mixture-of-experts model samples on the CPU for now (its expert "
        "layers have not run on a GPU yet)");
  }
  if (flags.device == "cuda" && weights.model.sliding_window != 0) {
    return absl::InvalidArgumentError(
        "--device cuda: a model with a sliding window samples on the CPU for now (the CUDA "
        "attention kernels' sliding window has not run on a GPU yet)");
  }
  if (flags.device == "cuda") {
    TY_ASSIGN_OR_RETURN(backend, MakeCudaBackend(CudaBackendOptions{}));
  } else {
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    backend = MakeCpuBackend(flags.threads > 0 ? flags.threads : cores);
  }
  SampleOptions options = flags.options;
  options.stop_ids = flags.eos.value_or(weights.eos_ids);
  for (int32_t id : options.stop_ids) {
    if (id >= weights.model.vocab) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--eos: ", id, " is not a token id below the vocabulary of ", weights.model.vocab));
    }
  }
  TY_ASSIGN_OR_RETURN(std::unique_ptr<Generator> generator,
                      Generator::Create(weights.model, backend.get(), weights.params.data()));
  TY_RETURN_IF_ERROR(generator->CheckRequest(prompt, options));
  std::cerr << "sampling " << weights.description << " on " << backend->name()
            << (tokenizer ? absl::StrCat(", text through ", tokenizer_path) : "")
            << (options.stop_ids.empty()
                    ? ""
                    : absl::StrCat(", ending at token ", absl::StrJoin(options.stop_ids, " or ")))
            << "\n";
  const bool text = flags.has_prompt;
  if (text) std::cout << flags.prompt << std::flush;
  bool first = true;
  GenerationClock clock;
  TY_ASSIGN_OR_RETURN(const std::vector<int32_t> out,
                      generator->Generate(prompt, options, [&](int32_t token) {
                        clock.Token();
                        // An end-of-sequence token ends the text and is not part of it (ids
                        // show it).
                        if (text && options.Stops(token)) return;
                        if (text && tokenizer != nullptr) {
                          std::cout << tokenizer->TokenBytes(token) << std::flush;
                        } else if (text) {
                          std::cout << static_cast<char>(token) << std::flush;
                        } else {
                          std::cout << (first ? "" : " ") << token << std::flush;
                        }
                        first = false;
                      }));
  std::cout << "\n";
  if (!out.empty() && options.Stops(out.back())) {
    std::cerr << "ended at token " << out.back() << " after " << out.size() << " of "
              << options.tokens << " tokens\n";
  }
  if (!out.empty()) std::cerr << clock.Report(prompt.size()) << "\n";
  return absl::OkStatus();
}

bool IsSampleInvocation(int argc, char** argv) {
  return argc >= 2 && std::string_view(argv[1]) == "sample";
}

int RunSample(int argc, char** argv) {
  absl::StatusOr<SampleFlags> flags = ParseSampleFlags(argc, argv);
  absl::Status status = flags.ok() ? Sample(*flags) : Annotate(flags.status(), kSampleUsage);
  if (status.ok()) return kExitOk;
  std::cerr << "trainyard-worker: error: " << status.message() << "\n";
  return ExitCodeForStatus(status);
}

void PrintSummary(const TrainResult& result) { std::cout << SummaryLine(result) << std::endl; }

std::atomic<bool> g_drain_requested{false};

void OnDrainSignal(int) { g_drain_requested.store(true); }

// A rank drains on SIGTERM. The local launcher starts ranks with SIGTERM blocked, so one that
// arrived before this point is delivered now.
void InstallDrainHandler() {
  struct sigaction drain {};
  drain.sa_handler = OnDrainSignal;
  sigaction(SIGTERM, &drain, nullptr);
  sigset_t term;
  sigemptyset(&term);
  sigaddset(&term, SIGTERM);
  sigprocmask(SIG_UNBLOCK, &term, nullptr);
}

// All ranks of a multi-rank spec as children of this process.
absl::Status LaunchRanks(const Flags& flags, const config::JobSpec& spec) {
  const int world = spec.world_size();
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int threads = flags.threads > 0           ? flags.threads
                      : spec.training.threads > 0 ? spec.training.threads
                                                  : std::max(1, cores / world);
  LaunchOptions launch;
  launch.executable = "/proc/self/exe";
  launch.world = world;
  launch.common_args = {
      "--standalone",          flags.spec_path,          "--threads",
      std::to_string(threads), "--collective-timeout-s", absl::StrCat(flags.collective_timeout_s)};
  return LaunchLocal(launch);
}

absl::Status Run(int argc, char** argv) {
  absl::StatusOr<Flags> parsed = ParseFlags(argc, argv);
  if (!parsed.ok()) return Annotate(parsed.status(), kUsage);
  const Flags& flags = *parsed;
  TY_ASSIGN_OR_RETURN(config::JobSpec spec,
                      config::LoadJobSpec(*RealFileSystem(), flags.spec_path));
  // Threads size the CPU backend only; the parent passes its choice on to the ranks it starts.
  if (flags.rank < 0 && flags.threads > 0 && spec.resources.kind == config::DeviceKind::kGpu) {
    return absl::InvalidArgumentError(
        "--threads is not used with a GPU spec (resources.kind is gpu: its ranks run no CPU "
        "threads)");
  }
  // `parallelism: auto` is the planner's choice on this machine (every rank chooses the same).
  TY_ASSIGN_OR_RETURN(const planner::DeviceProfile device, LocalDeviceProfile(spec));
  TY_RETURN_IF_ERROR(ResolveAutoMesh(&spec, device));
  const int world = spec.world_size();
  const int rank = std::max(flags.rank, 0);
  if (flags.rank < 0) {
    TY_RETURN_IF_ERROR(checkpoint::CheckResumeFrom(*RealFileSystem(), spec));
    TY_RETURN_IF_ERROR(convert::CheckInitFrom(*RealFileSystem(), spec));
  }
  if (world == 1 || flags.rank >= 0) InstallDrainHandler();
  SetLogContext(spec.name, rank);
  if (world > 1 && flags.rank < 0) {
    std::cout << absl::StrFormat(
                     "job %s: %d steps of %d x %d tokens on %d %s ranks (%s%s)\n", spec.name,
                     spec.training.steps, spec.training.batch, spec.training.seq_len, world,
                     absl::AsciiStrToUpper(config::DeviceKindName(spec.resources.kind)),
                     planner::MeshName(spec.parallelism),
                     spec.parallelism.automatic            ? ", chosen by the planner"
                     : spec.parallelism.automatic_schedule ? ", schedule chosen by the planner"
                                                           : "")
              << std::flush;
    return LaunchRanks(flags, spec);
  }
  if (flags.rank >= world) {
    return absl::InvalidArgumentError(
        absl::StrCat("--rank ", flags.rank, " outside the spec's world of ", world));
  }
  const int threads = flags.threads > 0 ? flags.threads : spec.training.threads;
  TY_ASSIGN_OR_RETURN(Placement placement,
                      PlaceRank(spec, rank, world, threads, SystemDeviceProbe()));
  std::unique_ptr<Backend> backend = std::move(placement.backend);
  if (world == 1) {
    std::cout << absl::StrFormat("job %s: %d steps of %d x %d tokens on %s\n", spec.name,
                                 spec.training.steps, spec.training.batch, spec.training.seq_len,
                                 backend->name());
  }
  std::unique_ptr<parallel::KeyValueStore> store;
  RankContext context;
  context.rank = rank;
  context.collectives = placement.collectives;
  context.gloo.timeout =
      std::chrono::milliseconds(static_cast<int64_t>(flags.collective_timeout_s * 1000));
  if (!flags.rendezvous.empty()) {
    store = parallel::MakeFileKeyValueStore(flags.rendezvous);
    context.store = store.get();
  }
  TrainOptions options;
  options.progress = &std::cout;
  options.stop_requested = &g_drain_requested;
  TY_ASSIGN_OR_RETURN(TrainResult result, TrainRank(spec, context, *backend, options));
  if (rank == 0) {
    // The comparison first: the done line stays the log's last.
    std::cout << planner::ComparisonText(
        CompareRun(spec, device, LoopOptionsFor(/*coordinated=*/false), result, 0));
    PrintSummary(result);
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace trainyard::worker

int main(int argc, char** argv) {
  // A peer that dies mid-collective closes its sockets; a write to one must fail as EPIPE, which
  // the communicator reports, rather than kill this rank with SIGPIPE and hide the peer's death.
  signal(SIGPIPE, SIG_IGN);
  if (trainyard::worker::IsCalibrateInvocation(argc, argv)) {
    return trainyard::worker::RunCalibrate(argc, argv);
  }
  if (trainyard::worker::IsSampleInvocation(argc, argv)) {
    return trainyard::worker::RunSample(argc, argv);
  }
  if (trainyard::worker::IsTokenizeInvocation(argc, argv)) {
    return trainyard::worker::RunTokenize(argc, argv);
  }
  if (trainyard::worker::IsExportInvocation(argc, argv)) {
    return trainyard::worker::RunExport(argc, argv);
  }
  absl::Status status;
  try {
    status = trainyard::worker::IsCoordinatedInvocation(argc, argv)
                 ? trainyard::worker::RunCoordinatedFromFlags(argc, argv)
                 : trainyard::worker::Run(argc, argv);
  } catch (const std::bad_alloc&) {
    status = absl::ResourceExhaustedError("out of memory");
  }
  if (!status.ok()) {
    std::cerr << "trainyard-worker: error: " << status.message() << "\n";
  }
  // Out of memory for the spec's own sizes is the job's fault: a distinct code, so that the
  // coordinator does not restart it (common/exit_codes.h).
  const int exit_code = absl::IsResourceExhausted(status) ? trainyard::kExitOutOfMemory
                                                          : trainyard::ExitCodeForStatus(status);
  trainyard::worker::RecordExitStatus(exit_code);
  return exit_code;
}
