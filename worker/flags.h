// trainyard-worker's flags, every mode's (main.cc's file comment lists the modes), defined once
// with Abseil's flags library and parsed with ParseCommandLine (common/flags.h), each mode
// naming the flags it takes. A flag two modes share means the same in both.
//
// Threading: process-wide; parsed once, before threads start.
#ifndef TRAINYARD_WORKER_FLAGS_H_
#define TRAINYARD_WORKER_FLAGS_H_

#include <string>
#include <string_view>

#include "absl/flags/declare.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

// Standalone.
ABSL_DECLARE_FLAG(std::string, standalone);
ABSL_DECLARE_FLAG(std::string, rendezvous);
// Coordinated.
ABSL_DECLARE_FLAG(std::string, coordinator);
ABSL_DECLARE_FLAG(std::string, job);
ABSL_DECLARE_FLAG(int, attempt);
ABSL_DECLARE_FLAG(double, join_timeout_s);
// Standalone and coordinated.
ABSL_DECLARE_FLAG(int, rank);
ABSL_DECLARE_FLAG(double, collective_timeout_s);
// Every mode that computes.
ABSL_DECLARE_FLAG(int, threads);
// Calibrate.
ABSL_DECLARE_FLAG(std::string, scratch);
ABSL_DECLARE_FLAG(std::string, reference);
ABSL_DECLARE_FLAG(double, seconds_per_probe);
ABSL_DECLARE_FLAG(double, seconds_per_link_probe);
// Export.
ABSL_DECLARE_FLAG(std::string, format);
ABSL_DECLARE_FLAG(std::string, out);
ABSL_DECLARE_FLAG(std::string, dtype);
ABSL_DECLARE_FLAG(std::string, max_shard_size);
// Sample.
ABSL_DECLARE_FLAG(std::string, prompt);
ABSL_DECLARE_FLAG(std::string, prompt_tokens);
ABSL_DECLARE_FLAG(std::string, tokenizer);
ABSL_DECLARE_FLAG(int, tokens);
ABSL_DECLARE_FLAG(float, temperature);
ABSL_DECLARE_FLAG(int, top_k);
ABSL_DECLARE_FLAG(float, top_p);
ABSL_DECLARE_FLAG(std::string, eos);
ABSL_DECLARE_FLAG(uint64_t, seed);
ABSL_DECLARE_FLAG(std::string, device);
// Tokenize (and --tokenizer, --out, --threads above).
ABSL_DECLARE_FLAG(std::string, separator);
ABSL_DECLARE_FLAG(int64_t, shard_tokens);
ABSL_DECLARE_FLAG(std::string, field);

namespace trainyard::worker {

// The value of --`name`, a number of seconds, as a duration; INVALID_ARGUMENT unless it is
// positive and finite.
[[nodiscard]] absl::StatusOr<absl::Duration> PositiveSeconds(std::string_view name, double seconds);

}  // namespace trainyard::worker

#endif  // TRAINYARD_WORKER_FLAGS_H_
