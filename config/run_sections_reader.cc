// YAML → ParallelismSpec, ResourcesSpec, CheckpointSpec, FaultToleranceSpec, priority, labels.
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "config/run_sections.h"
#include "config/yaml_tree.h"

namespace trainyard::config {
namespace {

absl::Status ReadParallelism(FieldReader& top, ParallelismSpec* p) {
  std::optional<FieldReader> r = top.Child("parallelism");  // records where it was written
  if (!r) return absl::OkStatus();
  if (top.IsWord("parallelism", "auto")) {
    p->automatic = true;
    return absl::OkStatus();
  }
  if (!r->IsMapping()) return top.WrongType("parallelism", "auto or a mapping of dp, tp, pp, zero");
  TY_RETURN_IF_ERROR(r->ExpectMapWithKeys(
      {"dp", "tp", "pp", "cp", "ep", "zero", "sequence_parallel", "schedule", "virtual_stages"}));
  TY_RETURN_IF_ERROR(r->ReadInt("dp", &p->dp));
  TY_RETURN_IF_ERROR(r->ReadInt("tp", &p->tp));
  TY_RETURN_IF_ERROR(r->ReadInt("pp", &p->pp));
  TY_RETURN_IF_ERROR(r->ReadInt("cp", &p->cp));
  TY_RETURN_IF_ERROR(r->ReadInt("ep", &p->ep));
  TY_RETURN_IF_ERROR(r->ReadInt("zero", &p->zero));
  TY_RETURN_IF_ERROR(r->ReadBool("sequence_parallel", &p->sequence_parallel));
  TY_RETURN_IF_ERROR(r->ReadInt("virtual_stages", &p->virtual_stages));
  std::string schedule = ScheduleName(p->schedule);
  TY_RETURN_IF_ERROR(r->ReadString("schedule", &schedule));
  if (schedule == "auto") {
    if (p->virtual_stages != 1) {
      return r->ErrorAt("virtual_stages",
                        "with schedule: auto the planner chooses virtual_stages; write schedule: "
                        "interleaved to fix them");
    }
    p->automatic_schedule = true;
    return absl::OkStatus();
  }
  if (const std::optional<PipelineSchedule> known = ScheduleFromName(schedule)) {
    p->schedule = *known;
    return absl::OkStatus();
  }
  const std::string suggestion =
      ClosestMatch(schedule, {"1f1b", "interleaved", "zero-bubble", "auto"});
  return r->ErrorAt(
      "schedule",
      absl::StrCat("unknown pipeline schedule ", QuoteForMessage(schedule),
                   suggestion.empty() ? "; expected 1f1b, interleaved, zero-bubble or auto"
                                      : absl::StrCat("; did you mean '", suggestion, "'?")));
}

absl::Status ReadResources(FieldReader& r, ResourcesSpec* res) {
  TY_RETURN_IF_ERROR(r.ExpectMapWithKeys({"nodes", "devices_per_node", "kind"}));
  TY_RETURN_IF_ERROR(r.ReadInt("nodes", &res->nodes));
  TY_RETURN_IF_ERROR(r.ReadInt("devices_per_node", &res->devices_per_node));
  std::string kind = DeviceKindName(res->kind);
  TY_RETURN_IF_ERROR(r.ReadString("kind", &kind));
  if (kind == "cpu") {
    res->kind = DeviceKind::kCpu;
  } else if (kind == "gpu") {
    res->kind = DeviceKind::kGpu;
  } else {
    const std::string suggestion = ClosestMatch(kind, {"cpu", "gpu"});
    return r.ErrorAt("kind", absl::StrCat("unknown device kind ", QuoteForMessage(kind),
                                          suggestion.empty() ? "; expected cpu or gpu"
                                                             : absl::StrCat("; did you mean '",
                                                                            suggestion, "'?")));
  }
  return absl::OkStatus();
}

absl::Status ReadCheckpoint(FieldReader& r, CheckpointSpec* c) {
  TY_RETURN_IF_ERROR(r.ExpectMapWithKeys(
      {"dir", "every_steps", "min_every_steps", "max_every_steps", "keep", "resume_from"}));
  if (!r.Has("dir") && !r.Has("resume_from")) {
    return r.ErrorAt("dir", "required: where the job's checkpoints are written");
  }
  TY_RETURN_IF_ERROR(r.ReadString("dir", &c->dir));
  if (r.Has("dir") && c->dir.empty()) return r.ErrorAt("dir", "must not be empty");
  TY_RETURN_IF_ERROR(r.ReadString("resume_from", &c->resume_from));
  if (r.Has("resume_from") && c->resume_from.empty()) {
    return r.ErrorAt("resume_from", "must not be empty");
  }
  for (const char* field : {"every_steps", "min_every_steps", "max_every_steps", "keep"}) {
    if (!r.Has("dir") && r.Has(field)) {
      TY_RETURN_IF_ERROR(
          r.Inert(field, "needs checkpoint.dir: without it the job writes no checkpoints"));
    }
  }
  TY_RETURN_IF_ERROR(r.ReadInt64OrAuto("every_steps", &c->every_steps));
  for (const char* field : {"min_every_steps", "max_every_steps"}) {
    if (r.Has(field) && r.Has("every_steps") && !r.IsWord("every_steps", "auto")) {
      TY_RETURN_IF_ERROR(r.Inert(
          field, "bounds the interval `every_steps: auto` chooses; it needs every_steps: auto"));
    }
  }
  TY_RETURN_IF_ERROR(r.ReadInt64("min_every_steps", &c->min_every_steps));
  TY_RETURN_IF_ERROR(r.ReadInt64("max_every_steps", &c->max_every_steps));
  TY_RETURN_IF_ERROR(r.ReadInt("keep", &c->keep));
  return absl::OkStatus();
}

absl::Status ReadFaultTolerance(FieldReader& r, FaultToleranceSpec* f) {
  TY_RETURN_IF_ERROR(r.ExpectMapWithKeys(
      {"max_restarts", "max_restarts_by_cause", "min_nodes", "max_nodes", "heartbeat_timeout_s",
       "backoff_initial_s", "backoff_max_s", "backoff_multiplier", "backoff_jitter", "hang_floor_s",
       "hang_step_multiple", "hang_startup_s", "straggler_margin", "straggler_window",
       "exclude_stragglers", "resize_cooldown_s", "memory_every_steps"}));
  TY_RETURN_IF_ERROR(r.ReadInt("max_restarts", &f->max_restarts));
  if (std::optional<FieldReader> by_cause = r.Child("max_restarts_by_cause")) {
    TY_RETURN_IF_ERROR(by_cause->ExpectMapWithKeys(
        {kRestartCauses[0], kRestartCauses[1], kRestartCauses[2], kRestartCauses[3]}));
    for (const char* cause : kRestartCauses) {
      if (!by_cause->Has(cause)) continue;
      int budget = 0;
      TY_RETURN_IF_ERROR(by_cause->ReadInt(cause, &budget));
      f->max_restarts_by_cause[cause] = budget;
    }
  }
  for (auto [field, out] : std::initializer_list<std::pair<const char*, double*>>{
           {"backoff_initial_s", &f->backoff_initial_s},
           {"backoff_max_s", &f->backoff_max_s},
           {"backoff_multiplier", &f->backoff_multiplier},
           {"backoff_jitter", &f->backoff_jitter},
           {"hang_floor_s", &f->hang_floor_s},
           {"hang_step_multiple", &f->hang_step_multiple},
           {"hang_startup_s", &f->hang_startup_s},
           {"straggler_margin", &f->straggler_margin},
           {"resize_cooldown_s", &f->resize_cooldown_s}}) {
    TY_RETURN_IF_ERROR(r.ReadDouble(field, out));
  }
  TY_RETURN_IF_ERROR(r.ReadInt("straggler_window", &f->straggler_window));
  TY_RETURN_IF_ERROR(r.ReadInt64OrAuto("memory_every_steps", &f->memory_every_steps));
  TY_RETURN_IF_ERROR(r.ReadBool("exclude_stragglers", &f->exclude_stragglers));
  if (f->exclude_stragglers && f->straggler_margin == 0) {
    TY_RETURN_IF_ERROR(
        r.Inert("exclude_stragglers", "needs straggler detection (straggler_margin > 0)"));
  }
  TY_RETURN_IF_ERROR(r.ReadInt("min_nodes", &f->min_nodes));
  TY_RETURN_IF_ERROR(r.ReadInt("max_nodes", &f->max_nodes));
  TY_RETURN_IF_ERROR(r.ReadDouble("heartbeat_timeout_s", &f->heartbeat_timeout_s));
  // Written as 0 is a mistake (0 only stands for "unset" in code-built structs).
  if (r.Has("min_nodes") && f->min_nodes < 1) {
    return r.ErrorAt("min_nodes", absl::StrCat("must be at least 1, got ", f->min_nodes));
  }
  if (r.Has("max_nodes") && f->max_nodes < 1) {
    return r.ErrorAt("max_nodes", absl::StrCat("must be at least 1, got ", f->max_nodes));
  }
  return absl::OkStatus();
}

// Fault-tolerance fields that the rest of the spec makes no-ops are refused: they are mistakes.
absl::Status CheckUnusedFaultToleranceFields(const FieldReader& r, const JobSpec& spec) {
  const FaultToleranceSpec& f = spec.fault_tolerance;
  if (f.straggler_margin == 0 && r.Has("straggler_window")) {
    TY_RETURN_IF_ERROR(
        r.Inert("straggler_window",
                "only used by straggler detection, which straggler_margin: 0 turns off"));
  }
  // Only growing waits for the cool-down, and only a job with other sizes and checkpoints grows.
  const int nodes = spec.resources.nodes;
  const bool elastic = f.min_nodes < nodes || f.max_nodes > nodes;
  if (r.Has("resize_cooldown_s") && !(elastic && spec.checkpoint.enabled())) {
    TY_RETURN_IF_ERROR(r.Inert("resize_cooldown_s",
                               "only used by a job that may grow: min_nodes below or max_nodes "
                               "above resources.nodes, with checkpoint.dir"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ReadRunSections(FieldReader& top, JobSpec* spec) {
  if (std::optional<FieldReader> resources = top.Child("resources")) {
    TY_RETURN_IF_ERROR(ReadResources(*resources, &spec->resources));
  }
  TY_RETURN_IF_ERROR(ReadParallelism(top, &spec->parallelism));
  if (std::optional<FieldReader> checkpoint = top.Child("checkpoint")) {
    TY_RETURN_IF_ERROR(ReadCheckpoint(*checkpoint, &spec->checkpoint));
  }
  std::optional<FieldReader> fault_tolerance = top.Child("fault_tolerance");
  if (fault_tolerance) {
    TY_RETURN_IF_ERROR(ReadFaultTolerance(*fault_tolerance, &spec->fault_tolerance));
  }
  TY_RETURN_IF_ERROR(top.ReadInt("priority", &spec->priority));
  TY_RETURN_IF_ERROR(top.ReadStringMap("labels", &spec->labels));
  FaultToleranceSpec& f = spec->fault_tolerance;
  if (f.min_nodes == 0) f.min_nodes = spec->resources.nodes;
  if (f.max_nodes == 0) f.max_nodes = spec->resources.nodes;
  if (fault_tolerance) return CheckUnusedFaultToleranceFields(*fault_tolerance, *spec);
  return absl::OkStatus();
}

}  // namespace trainyard::config
