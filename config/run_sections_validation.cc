// Cross-field checks of the run sections, and confinement of the spec's paths.
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "config/mesh.h"
#include "config/path_confinement.h"
#include "config/run_sections.h"
#include "config/yaml_tree.h"

namespace trainyard::config {
namespace {

using Problem = std::optional<SpecProblem>;

Problem Bad(std::string path, std::string reason, std::vector<std::string> related = {}) {
  return SpecProblem{std::move(path), std::move(reason), std::move(related)};
}

Problem CheckRange(const char* path, int64_t value, int64_t min, int64_t max) {
  if (value < min || value > max) {
    return Bad(path, absl::StrCat("must be between ", min, " and ", max, ", got ", value));
  }
  return std::nullopt;
}

Problem CheckResources(const ResourcesSpec& r) {
  if (Problem p = CheckRange("resources.nodes", r.nodes, 1, kMaxNodes)) return p;
  return CheckRange("resources.devices_per_node", r.devices_per_node, 1, kMaxDevicesPerNode);
}

Problem CheckParallelism(const JobSpec& spec) {
  if (!spec.parallelism.automatic) return FindMeshProblem(spec.parallelism, spec);
  if (spec.parallelism.zero < 0 || spec.parallelism.zero > 3) {
    return Bad("parallelism.zero",
               absl::StrCat("ZeRO stage must be 0, 1, 2 or 3, got ", spec.parallelism.zero));
  }
  absl::StatusOr<ParallelismSpec> chosen = ChooseParallelism(spec);
  if (!chosen.ok()) {
    return Bad("parallelism", absl::StrCat("auto: ", chosen.status().message()),
               {"resources.devices_per_node", "resources.nodes"});
  }
  return std::nullopt;
}

Problem CheckCheckpoint(const CheckpointSpec& c) {
  if (!c.enabled()) return std::nullopt;
  if (c.every_steps && *c.every_steps < 1) {
    return Bad("checkpoint.every_steps",
               absl::StrCat("must be at least 1 or auto, got ", *c.every_steps));
  }
  if (!c.every_steps) {
    if (Problem p = CheckRange("checkpoint.min_every_steps", c.min_every_steps, 1, 1'000'000'000)) {
      return p;
    }
    if (c.max_every_steps < c.min_every_steps || c.max_every_steps > 1'000'000'000) {
      return Bad("checkpoint.max_every_steps",
                 absl::StrCat("must be between min_every_steps ", c.min_every_steps,
                              " and 1000000000, got ", c.max_every_steps),
                 {"checkpoint.min_every_steps"});
    }
  }
  return CheckRange("checkpoint.keep", c.keep, 1, kMaxCheckpointsKept);
}

// A number in [min, max]; NaN never is.
Problem CheckReal(const char* path, double value, double min, double max, const char* unit = "") {
  if (!(value >= min && value <= max)) {
    return Bad(path, absl::StrCat("must be between ", min, unit, " and ", max, unit, ", got ",
                                  value, unit));
  }
  return std::nullopt;
}

// Whether some size above resources.nodes, up to max_nodes, has a valid mesh.
bool HasLargerSize(const JobSpec& spec) {
  for (int nodes = spec.resources.nodes + 1; nodes <= spec.max_nodes(); ++nodes) {
    if (GrownSpec(spec, nodes).has_value()) return true;
  }
  return false;
}

Problem CheckFaultTolerance(const FaultToleranceSpec& f, const JobSpec& spec) {
  if (Problem p = CheckRange("fault_tolerance.max_restarts", f.max_restarts, 0, kMaxRestarts)) {
    return p;
  }
  const int nodes = spec.resources.nodes;
  if (spec.min_nodes() < 1 || spec.min_nodes() > nodes) {
    return Bad(
        "fault_tolerance.min_nodes",
        absl::StrCat("must be between 1 and resources.nodes ", nodes, ", got ", spec.min_nodes()),
        {"resources.nodes"});
  }
  if (spec.max_nodes() < nodes || spec.max_nodes() > kMaxNodes) {
    return Bad("fault_tolerance.max_nodes",
               absl::StrCat("must be between resources.nodes ", nodes, " and ", kMaxNodes, ", got ",
                            spec.max_nodes()),
               {"resources.nodes"});
  }
  if (spec.max_nodes() > nodes && !HasLargerSize(spec)) {
    return Bad(
        "fault_tolerance.max_nodes",
        absl::StrCat("the job cannot grow: no size from ", nodes + 1, " to ", spec.max_nodes(),
                     " nodes has a valid mesh (the extra ranks go to dp, which must divide "
                     "training.batch ",
                     spec.training.batch, ")"),
        {"resources.nodes"});
  }
  if (!(f.heartbeat_timeout_s >= 1 && f.heartbeat_timeout_s <= kMaxHeartbeatTimeoutSeconds)) {
    return Bad(
        "fault_tolerance.heartbeat_timeout_s",
        absl::StrCat("must be between 1 and ", kMaxHeartbeatTimeoutSeconds,
                     " seconds (agents heartbeat every second), got ", f.heartbeat_timeout_s));
  }
  for (const auto& [cause, budget] : f.max_restarts_by_cause) {
    if (budget < 0 || budget > f.max_restarts) {
      return Bad(
          absl::StrCat("fault_tolerance.max_restarts_by_cause.", cause),
          absl::StrCat("must be between 0 and max_restarts ", f.max_restarts, ", got ", budget),
          {"fault_tolerance.max_restarts"});
    }
  }
  if (Problem p =
          CheckReal("fault_tolerance.backoff_initial_s", f.backoff_initial_s, 0, 3600, " s")) {
    return p;
  }
  if (Problem p = CheckReal("fault_tolerance.backoff_max_s", f.backoff_max_s, f.backoff_initial_s,
                            86400, " s")) {
    return p;
  }
  if (Problem p = CheckReal("fault_tolerance.backoff_multiplier", f.backoff_multiplier, 1, 100)) {
    return p;
  }
  if (Problem p = CheckReal("fault_tolerance.backoff_jitter", f.backoff_jitter, 0, 1)) return p;
  if (Problem p = CheckReal("fault_tolerance.hang_floor_s", f.hang_floor_s, 1, 86400, " s")) {
    return p;
  }
  if (Problem p = CheckReal("fault_tolerance.hang_step_multiple", f.hang_step_multiple, 1, 1000)) {
    return p;
  }
  if (Problem p = CheckReal("fault_tolerance.hang_startup_s", f.hang_startup_s, 1, 86400, " s")) {
    return p;
  }
  if (Problem p = CheckReal("fault_tolerance.straggler_margin", f.straggler_margin, 0, 100)) {
    return p;
  }
  if (Problem p =
          CheckReal("fault_tolerance.resize_cooldown_s", f.resize_cooldown_s, 0, 86400, " s")) {
    return p;
  }
  if (f.memory_every_steps) {
    if (Problem p = CheckRange("fault_tolerance.memory_every_steps", *f.memory_every_steps,
                               int64_t{0}, int64_t{1'000'000'000})) {
      return p;
    }
  }
  return CheckRange("fault_tolerance.straggler_window", f.straggler_window, 1, 10000);
}

bool IsLabelKey(const std::string& key) {
  if (key.empty() || key.size() > kMaxLabelKeyLength) return false;
  if (!absl::ascii_isalnum(static_cast<unsigned char>(key[0]))) return false;
  for (char c : key) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.' &&
        c != '/') {
      return false;
    }
  }
  return true;
}

Problem CheckLabels(const std::map<std::string, std::string>& labels) {
  if (labels.size() > kMaxLabels) {
    return Bad("labels",
               absl::StrCat("at most ", kMaxLabels, " labels are allowed, got ", labels.size()));
  }
  std::map<std::string, std::string> by_metric_name;  // the first key to become each name
  for (const auto& [key, value] : labels) {
    const std::string path = absl::StrCat("labels.", KeyForPath(key));
    const auto [first, inserted] = by_metric_name.emplace(MetricLabelName(key), key);
    if (!inserted) {
      return Bad(path,
                 absl::StrCat("collides with labels.", KeyForPath(first->second),
                              ": both become the metrics label ", first->first, "; rename one"));
    }
    if (!IsLabelKey(key)) {
      return Bad(path, absl::StrCat("a label key is 1-", kMaxLabelKeyLength,
                                    " letters, digits, '-', '_', '.' or '/', starting with a "
                                    "letter or digit; got ",
                                    QuoteForMessage(key)));
    }
    if (value.size() > kMaxLabelValueLength) {
      return Bad(path, absl::StrCat("a label value is at most ", kMaxLabelValueLength,
                                    " bytes, got ", value.size()));
    }
    for (char c : value) {
      if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
        return Bad(path, absl::StrCat("a label value may not contain control characters, got ",
                                      QuoteForMessage(value)));
      }
    }
  }
  return std::nullopt;
}

Problem CheckConfinement(const JobSpec& spec, const SpecLimits& limits) {
  const std::pair<const char*, const std::string*> data_paths[] = {
      {"data.path", &spec.data.path},
      {"data.val_path", &spec.data.val_path},
      {"model.init_from", &spec.init_from},
      {"training.sample_tokenizer", &spec.training.sample_tokenizer}};
  for (const auto& [field, path] : data_paths) {
    if (path->empty()) continue;
    if (std::optional<std::string> why = FindConfinementProblem(*path, limits.allowed_data_roots)) {
      return Bad(field, *why);
    }
  }
  const std::pair<const char*, const std::string*> checkpoint_paths[] = {
      {"checkpoint.dir", &spec.checkpoint.dir},
      {"checkpoint.resume_from", &spec.checkpoint.resume_from}};
  for (const auto& [field, path] : checkpoint_paths) {
    if (path->empty()) continue;
    if (std::optional<std::string> why =
            FindConfinementProblem(*path, limits.allowed_checkpoint_roots)) {
      return Bad(field, *why);
    }
  }
  return std::nullopt;
}

}  // namespace

std::optional<SpecProblem> FindRunProblem(const JobSpec& spec, const SpecLimits& limits) {
  if (Problem p = CheckResources(spec.resources)) return p;
  if (Problem p = CheckParallelism(spec)) return p;
  if (Problem p = CheckCheckpoint(spec.checkpoint)) return p;
  if (Problem p = CheckFaultTolerance(spec.fault_tolerance, spec)) return p;
  if (Problem p = CheckRange("priority", spec.priority, -kMaxPriority, kMaxPriority)) return p;
  if (Problem p = CheckLabels(spec.labels)) return p;
  return CheckConfinement(spec, limits);
}

}  // namespace trainyard::config
