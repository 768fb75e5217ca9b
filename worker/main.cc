// trainyard-worker: one rank of a training job. For now it runs standalone:
//
//   trainyard-worker --standalone SPEC.yaml [--threads N]
//
// Exit codes: 0 trained to the end; 2 bad input (spec, data file, flags); 1 anything else.
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <new>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/filesystem.h"
#include "common/logging.h"
#include "common/status.h"
#include "config/spec.h"
#include "worker/backend.h"
#include "worker/trainer.h"

namespace trainyard::worker {
namespace {

constexpr char kUsage[] = "usage: trainyard-worker --standalone SPEC.yaml [--threads N]";

struct Flags {
  std::string spec_path;
  int threads = -1;  // -1: from the spec
};

absl::StatusOr<Flags> ParseFlags(int argc, char** argv) {
  Flags flags;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> absl::StatusOr<std::string> {
      if (i + 1 >= argc) return absl::InvalidArgumentError(absl::StrCat(arg, " needs a value"));
      return std::string(argv[++i]);
    };
    if (arg == "--standalone") {
      TY_ASSIGN_OR_RETURN(flags.spec_path, value());
    } else if (arg == "--threads") {
      TY_ASSIGN_OR_RETURN(const std::string v, value());
      if (!absl::SimpleAtoi(v, &flags.threads) || flags.threads < 1) {
        return absl::InvalidArgumentError(
            absl::StrCat("--threads must be a positive integer, got '", v, "'"));
      }
    } else if (arg == "--help" || arg == "-h") {
      std::cout << kUsage << "\n";
      std::exit(0);
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag '", arg, "'"));
    }
  }
  if (flags.spec_path.empty())
    return absl::InvalidArgumentError("--standalone SPEC.yaml is required");
  return flags;
}

absl::Status Run(int argc, char** argv) {
  absl::StatusOr<Flags> parsed = ParseFlags(argc, argv);
  if (!parsed.ok()) return Annotate(parsed.status(), kUsage);
  const Flags& flags = *parsed;
  TY_ASSIGN_OR_RETURN(config::JobSpec spec,
                      config::LoadJobSpec(*RealFileSystem(), flags.spec_path));
  SetLogContext(spec.name, 0);
  const int threads = flags.threads > 0 ? flags.threads : spec.training.threads;
  std::unique_ptr<Backend> backend = MakeCpuBackend(threads);
  std::cout << absl::StrFormat("job %s: %d steps of %d x %d tokens on %s\n", spec.name,
                               spec.training.steps, spec.training.batch, spec.training.seq_len,
                               backend->name());
  TrainOptions options;
  options.progress = &std::cout;
  TY_ASSIGN_OR_RETURN(TrainResult result, Train(spec, *backend, options));
  std::string summary = absl::StrFormat("done: %d steps | final train loss %.4f",
                                        result.train_losses.size(), result.train_losses.back());
  if (!result.evals.empty())
    absl::StrAppendFormat(&summary, " | val loss %.4f", result.evals.back().loss);
  if (result.entropy_nats)
    absl::StrAppendFormat(&summary, " | data entropy %.4f", *result.entropy_nats);
  absl::StrAppendFormat(&summary, " | %.0f tok/s", result.tokens_per_second);
  std::cout << summary << std::endl;
  return absl::OkStatus();
}

}  // namespace
}  // namespace trainyard::worker

int main(int argc, char** argv) {
  absl::Status status;
  try {
    status = trainyard::worker::Run(argc, argv);
  } catch (const std::bad_alloc&) {
    status = absl::ResourceExhaustedError("out of memory");
  }
  if (!status.ok()) {
    std::cerr << "trainyard-worker: error: " << status.message() << "\n";
  }
  return trainyard::ExitCodeForStatus(status);
}
