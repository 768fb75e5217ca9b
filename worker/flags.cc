#include "worker/flags.h"

#include <cmath>
#include <cstdint>
#include <string>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

ABSL_FLAG(std::string, standalone, "", "SPEC.yaml: train it without a coordinator");
ABSL_FLAG(std::string, rendezvous, "", "the local launcher's rendezvous directory (its children)");
ABSL_FLAG(std::string, coordinator, "", "the coordinator's gRPC address (HOST:PORT)");
ABSL_FLAG(std::string, job, "", "the job of the rank");
ABSL_FLAG(int, attempt, 0, "the attempt of the rank");
ABSL_FLAG(double, join_timeout_s, 300, "give up joining after this many seconds");
ABSL_FLAG(int, rank, -1, "the rank");
ABSL_FLAG(double, collective_timeout_s, 60, "fail a collective that waits longer");
ABSL_FLAG(int, threads, 0, "CPU threads");
ABSL_FLAG(std::string, scratch, "", "where the calibration's probes meet");
ABSL_FLAG(std::string, reference, "", "the calibration's reference spec");
ABSL_FLAG(double, seconds_per_probe, 0.5, "each round of a compute probe");
ABSL_FLAG(double, seconds_per_link_probe, 3, "each link probe");
ABSL_FLAG(std::string, format, "", "the export's format (hf)");
ABSL_FLAG(std::string, out, "", "the export's or the tokenized shards' directory");
ABSL_FLAG(std::string, dtype, "fp32", "the exported tensors' type (fp32, bf16)");
ABSL_FLAG(std::string, max_shard_size, "", "the largest exported file");
ABSL_FLAG(std::string, prompt, "", "the prompt as bytes");
ABSL_FLAG(std::string, prompt_tokens, "", "the prompt as token ids");
ABSL_FLAG(std::string, tokenizer, "", "a tokenizer.json, or a directory holding one");
ABSL_FLAG(std::string, separator, "", "tokenize: text put before each document");
ABSL_FLAG(int64_t, shard_tokens, 100000000, "tokenize: ids per shard");
ABSL_FLAG(std::string, field, "", "tokenize: JSON Lines' text field");
ABSL_FLAG(int, tokens, 32, "new tokens");
ABSL_FLAG(float, temperature, 0, "0: greedy");
ABSL_FLAG(int, top_k, 0, "draw among the K most likely (0: all)");
ABSL_FLAG(float, top_p, 1, "draw among the most likely tokens whose probabilities reach P");
ABSL_FLAG(std::string, eos, "", "the ids that end generation, or none");
ABSL_FLAG(uint64_t, seed, 0, "the draws' seed");
ABSL_FLAG(std::string, device, "cpu", "where the model runs (cpu, cuda)");

namespace trainyard::worker {

absl::StatusOr<absl::Duration> PositiveSeconds(std::string_view name, double seconds) {
  if (!(seconds > 0) || !std::isfinite(seconds)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--", std::string(name), " must be a positive number of seconds, got ", seconds));
  }
  return absl::Seconds(seconds);
}

}  // namespace trainyard::worker
