#include "server/restart_policy.h"

#include <algorithm>
#include <cmath>
#include <csignal>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/exit_codes.h"

namespace trainyard::server {

double JitterDraws::Next() {
  state_ += 0x9e3779b97f4a7c15ull;
  uint64_t z = state_;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return static_cast<double>((z ^ (z >> 31)) >> 11) * 0x1.0p-53;
}
namespace {

constexpr FailureClass kAllClasses[] = {FailureClass::kUserError, FailureClass::kCrash,
                                        FailureClass::kHang, FailureClass::kNodeLost,
                                        FailureClass::kCollectiveTimeout};

// "collective timeout" for FailureClass::kCollectiveTimeout: the name as a sentence reads it.
std::string HumanName(FailureClass failure_class) {
  return absl::StrReplaceAll(FailureClassName(failure_class), {{"_", " "}});
}

const char* ExitCodeMeaning(int exit_code) {
  switch (exit_code) {
    case kExitOk:
      return "exited cleanly before the job ended";
    case kExitInternalError:
      return "internal error";
    case kExitUserError:
      return "bad spec, data file or flags";
    case kExitCollectiveTimeout:
      return "collective timed out";
    case kExitHang:
      return "hang watchdog";
    case kExitOutOfMemory:
      return "out of memory for the spec's sizes";
    default:
      return "unknown exit code";
  }
}

const char* SignalName(int signal) {
  switch (signal) {
    case SIGKILL:
      return "SIGKILL";
    case SIGTERM:
      return "SIGTERM";
    case SIGSEGV:
      return "SIGSEGV";
    case SIGABRT:
      return "SIGABRT";
    case SIGBUS:
      return "SIGBUS";
    case SIGFPE:
      return "SIGFPE";
    case SIGILL:
      return "SIGILL";
    case SIGINT:
      return "SIGINT";
    default:
      return nullptr;
  }
}

absl::Status CheckDuration(const char* field, absl::Duration value) {
  if (value < absl::ZeroDuration() || value == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": must be a finite duration of at least 0 (got ",
                     absl::FormatDuration(value), ")"));
  }
  return absl::OkStatus();
}

}  // namespace

const char* FailureClassName(FailureClass failure_class) {
  switch (failure_class) {
    case FailureClass::kUserError:
      return "user_error";
    case FailureClass::kCrash:
      return "crash";
    case FailureClass::kHang:
      return "hang";
    case FailureClass::kNodeLost:
      return "node_lost";
    case FailureClass::kCollectiveTimeout:
      return "collective_timeout";
  }
  return "unknown";
}

std::optional<FailureClass> ParseFailureClass(std::string_view name) {
  for (FailureClass failure_class : kAllClasses) {
    if (name == FailureClassName(failure_class)) return failure_class;
  }
  return std::nullopt;
}

FailureClass Classify(const FailureSignal& signal) {
  if (signal.node_lost) return FailureClass::kNodeLost;
  if (signal.hang_detected) return FailureClass::kHang;
  if (signal.signal != 0) return FailureClass::kCrash;
  switch (signal.exit_code) {
    case kExitUserError:
    case kExitOutOfMemory:
      return FailureClass::kUserError;
    case kExitCollectiveTimeout:
      return FailureClass::kCollectiveTimeout;
    case kExitHang:
      return FailureClass::kHang;
    default:
      return FailureClass::kCrash;
  }
}

std::string DescribeFailure(const FailureSignal& signal) {
  std::string description;
  if (signal.node_lost) {
    description = "node lost";
  } else if (signal.hang_detected) {
    description = "no progress past the hang limit";
  } else if (signal.signal != 0) {
    description = absl::StrCat("killed by signal ", signal.signal);
    if (const char* name = SignalName(signal.signal))
      absl::StrAppend(&description, " (", name, ")");
  } else {
    description =
        absl::StrCat("exit code ", signal.exit_code, " (", ExitCodeMeaning(signal.exit_code), ")");
  }
  if (!signal.message.empty()) absl::StrAppend(&description, ": ", signal.message);
  return description;
}

absl::Status Validate(const RestartOptions& options) {
  if (options.max_restarts < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_restarts: must be at least 0 (got ", options.max_restarts, ")"));
  }
  for (const auto& [failure_class, budget] : options.budget) {
    const std::string field = absl::StrCat("budget.", FailureClassName(failure_class));
    if (failure_class == FailureClass::kUserError && budget != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": must be 0, since no restart can fix a user error (got ", budget, ")"));
    }
    if (budget < 0 || budget > options.max_restarts) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": must be between 0 and max_restarts = ", options.max_restarts,
                       " (got ", budget, ")"));
    }
  }
  if (absl::Status status = CheckDuration("backoff_initial", options.backoff_initial);
      !status.ok()) {
    return status;
  }
  if (absl::Status status = CheckDuration("backoff_max", options.backoff_max); !status.ok()) {
    return status;
  }
  if (options.backoff_initial > options.backoff_max) {
    return absl::InvalidArgumentError(absl::StrCat(
        "backoff_initial: ", absl::FormatDuration(options.backoff_initial),
        " is more than backoff_max (", absl::FormatDuration(options.backoff_max), ")"));
  }
  if (!std::isfinite(options.backoff_multiplier) || options.backoff_multiplier < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("backoff_multiplier: must be a finite number of at least 1 (got ",
                     options.backoff_multiplier, ")"));
  }
  if (!(options.backoff_jitter >= 0 && options.backoff_jitter <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "backoff_jitter: must be a fraction between 0 and 1 (got ", options.backoff_jitter, ")"));
  }
  return absl::OkStatus();
}

int RestartPolicy::BudgetFor(FailureClass failure_class) const {
  if (failure_class == FailureClass::kUserError) return 0;
  const int total = std::max(options_.max_restarts, 0);
  auto it = options_.budget.find(failure_class);
  if (it == options_.budget.end()) return total;
  return std::clamp(it->second, 0, total);
}

absl::Duration RestartPolicy::Backoff(int consecutive_failures, double jitter_draw) const {
  const absl::Duration initial = options_.backoff_initial;
  if (initial <= absl::ZeroDuration()) return absl::ZeroDuration();
  const int exponent = std::max(consecutive_failures, 1) - 1;
  const double multiplier = options_.backoff_multiplier >= 1 ? options_.backoff_multiplier : 1;
  // pow() may overflow to infinity for a long run of failures; the comparison caps it.
  const double growth = std::pow(multiplier, exponent);
  absl::Duration delay = options_.backoff_max;
  if (absl::ToDoubleSeconds(initial) * growth < absl::ToDoubleSeconds(options_.backoff_max)) {
    delay = initial * growth;
  }
  const double draw = jitter_draw >= 0 ? std::min(jitter_draw, 1.0) : 0;
  const double jitter = options_.backoff_jitter >= 0 ? std::min(options_.backoff_jitter, 1.0) : 0;
  if (jitter > 0) delay *= 1 + jitter * (2 * draw - 1);
  return std::max(delay, absl::ZeroDuration());
}

RestartDecision RestartPolicy::Decide(FailureClass failure_class,
                                      const std::map<FailureClass, int>& used_by_class,
                                      int consecutive_failures, double jitter_draw) const {
  RestartDecision decision;
  decision.failure_class = failure_class;
  decision.class_budget = BudgetFor(failure_class);
  decision.total_budget = std::max(options_.max_restarts, 0);
  for (const auto& [used_class, used] : used_by_class) {
    decision.total_used += std::max(used, 0);
    if (used_class == failure_class) decision.class_used = std::max(used, 0);
  }
  const std::string name = HumanName(failure_class);
  if (failure_class == FailureClass::kUserError) {
    decision.reason = "user error: no restart can fix it";
    return decision;
  }
  if (decision.total_used >= decision.total_budget) {
    decision.reason = absl::StrCat(name, ": no restarts left (", decision.total_used, " of ",
                                   decision.total_budget, " used)");
    return decision;
  }
  if (decision.class_used >= decision.class_budget) {
    decision.reason =
        decision.class_budget == 0
            ? absl::StrCat(name, ": its budget allows no restarts")
            : absl::StrCat(name, ": its budget of ", decision.class_budget, " restarts is used up");
    return decision;
  }
  decision.restart = true;
  decision.delay = Backoff(consecutive_failures, jitter_draw);
  decision.reason =
      absl::StrCat(name, ": restart ", decision.total_used + 1, " of ", decision.total_budget);
  if (decision.delay > absl::ZeroDuration()) {
    absl::StrAppend(&decision.reason, " in ",
                    absl::FormatDuration(absl::Trunc(decision.delay, absl::Milliseconds(1))));
  }
  if (options_.budget.count(failure_class) != 0) {
    absl::StrAppend(&decision.reason, " (", decision.class_used + 1, " of ", decision.class_budget,
                    " ", name, " restarts used after this)");
  }
  return decision;
}

}  // namespace trainyard::server
