#include "tools/cli/plan_command.h"

#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <map>
#include <optional>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/flags.h"
#include "common/status.h"
#include "config/mesh.h"
#include "config/run_sections.h"
#include "config/spec.h"
#include "config/yaml_tree.h"
#include "planner/calibration.h"
#include "planner/explain.h"
#include "planner/planner.h"
#include "tools/cli/format.h"
#include "tools/cli/plan_output.h"
#include "tools/cli/server_address.h"

// `plan`'s own flags (its --json and --device are the CLI's, commands.cc). Values are checked
// as written, below.
ABSL_DECLARE_FLAG(bool, json);
ABSL_FLAG(std::string, nodes, "", "plan: nodes instead of the spec's");
ABSL_FLAG(std::string, devices_per_node, "", "plan: devices per node instead of the spec's");
ABSL_FLAG(std::string, mesh, "", "plan: only this mesh");
ABSL_FLAG(std::string, checkpoint_seconds, "", "plan: one checkpoint's cost");
ABSL_FLAG(std::string, mtbf_hours, "", "plan: a node's mean time between failures");
ABSL_FLAG(bool, calibrate, false, "plan: measure the cpu profile");
ABSL_FLAG(bool, fresh, false, "plan: forget the earlier calibrations");

namespace trainyard::cli {
namespace {

constexpr char kPlanUsage[] =
    "usage: trainyard plan SPEC [--json] [--nodes N] [--devices-per-node G] [--device "
    "cpu|h100|h200] [--mesh dp=D,tp=T,pp=P[,zero=Z][,cp=C][,ep=E]] [--checkpoint-seconds S "
    "--mtbf-hours H] "
    "[--calibrate [--fresh]]";

// The flags of the CLI's other commands that carry a value (skipped when finding the command).
bool IsGlobalValueFlag(const std::string& arg) {
  return arg == "--server" || arg == "--tls-ca" || arg == "--tls-cert" || arg == "--tls-key" ||
         arg == "--token-file";
}

struct PlanFlags {
  std::string spec_path;
  bool json = false;
  bool calibrate = false;
  bool fresh = false;                         // --calibrate: forget the earlier calibrations
  std::map<std::string, std::string> values;  // flag name -> value
  std::optional<std::string> Get(const std::string& name) const {
    auto it = values.find(name);
    return it == values.end() ? std::nullopt : std::optional<std::string>(it->second);
  }
};

absl::StatusOr<PlanFlags> ParsePlanFlags(const std::vector<std::string>& args) {
  constexpr std::string_view kValueFlags[] = {"nodes", "devices-per-node",   "device",
                                              "mesh",  "checkpoint-seconds", "mtbf-hours"};
  // The CLI's connection flags (kConnectionFlags) are parsed only to be refused by name: plan
  // needs no coordinator.
  constexpr std::string_view kFlags[] = {
      "nodes",    "devices-per-node", "device", "mesh",   "checkpoint-seconds", "mtbf-hours",
      "json",     "calibrate",        "fresh",  "server", "token-file",         "tls-ca",
      "tls-cert", "tls-key"};
  TY_ASSIGN_OR_RETURN(const CommandLine line, ParseCommandLine(args, kFlags, "'plan'"));
  if (absl::Status refused =
          RefuseGiven(line, kConnectionFlags, " is not used (it reaches a coordinator)");
      !refused.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("plan runs locally; ", refused.message()));
  }
  PlanFlags flags;
  // positionals[0] is "plan" itself.
  if (line.positionals.size() > 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("unexpected argument '", line.positionals[2], "'"));
  }
  if (line.positionals.size() == 2) flags.spec_path = line.positionals[1];
  flags.json = absl::GetFlag(FLAGS_json);
  flags.calibrate = absl::GetFlag(FLAGS_calibrate);
  flags.fresh = absl::GetFlag(FLAGS_fresh);
  for (std::string_view name : kValueFlags) {
    auto given = line.values.find(std::string(name));
    if (given != line.values.end()) flags.values[std::string(name)] = given->second.back();
  }
  if (flags.spec_path.empty() && !flags.calibrate) {
    return absl::InvalidArgumentError("plan needs a SPEC");
  }
  if (flags.fresh && !flags.calibrate) {
    return absl::InvalidArgumentError("--fresh goes with --calibrate");
  }
  if (flags.Get("checkpoint-seconds").has_value() != flags.Get("mtbf-hours").has_value()) {
    return absl::InvalidArgumentError("--checkpoint-seconds and --mtbf-hours go together");
  }
  return flags;
}

absl::StatusOr<int> PositiveInt(const PlanFlags& flags, const std::string& name, int max) {
  int value = 0;
  if (!absl::SimpleAtoi(*flags.Get(name), &value) || value < 1 || value > max) {
    return absl::InvalidArgumentError(absl::StrCat("--", name, " must be an integer from 1 to ",
                                                   max, ", got '", *flags.Get(name), "'"));
  }
  return value;
}

absl::StatusOr<double> PositiveNumber(const PlanFlags& flags, const std::string& name) {
  double value = 0;
  if (!absl::SimpleAtod(*flags.Get(name), &value) || !(value > 0) || !std::isfinite(value)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", name, " must be a positive number, got '", *flags.Get(name), "'"));
  }
  return value;
}

// "dp=2,tp=4,pp=1,zero=1": dp, tp and pp required, zero defaulting to the spec's, cp and ep to 1.
absl::StatusOr<config::ParallelismSpec> ParseMesh(const std::string& text,
                                                  const config::ParallelismSpec& spec_mesh) {
  config::ParallelismSpec mesh;
  mesh.zero = spec_mesh.zero;
  mesh.sequence_parallel = spec_mesh.sequence_parallel;
  mesh.schedule = spec_mesh.schedule;
  mesh.virtual_stages = spec_mesh.virtual_stages;
  mesh.automatic_schedule = spec_mesh.automatic_schedule;
  std::map<std::string, int*> fields = {{"dp", &mesh.dp},     {"tp", &mesh.tp}, {"pp", &mesh.pp},
                                        {"zero", &mesh.zero}, {"cp", &mesh.cp}, {"ep", &mesh.ep}};
  std::map<std::string, bool> seen;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    std::pair<std::string, std::string> kv = absl::StrSplit(part, absl::MaxSplits('=', 1));
    auto field = fields.find(kv.first);
    if (field == fields.end() || !absl::SimpleAtoi(kv.second, field->second) || seen[kv.first]) {
      return absl::InvalidArgumentError(
          absl::StrCat("--mesh: expected dp=D,tp=T,pp=P[,zero=Z][,cp=C][,ep=E], got '", text, "'"));
    }
    seen[kv.first] = true;
  }
  if (!seen["dp"] || !seen["tp"] || !seen["pp"]) {
    return absl::InvalidArgumentError(
        absl::StrCat("--mesh: dp, tp and pp are all required, got '", text, "'"));
  }
  mesh.sequence_parallel = mesh.sequence_parallel && mesh.tp > 1;
  return mesh;
}

// The spec with the resources planned for. Without a resources section the spec does not say
// where it runs: --nodes or --devices-per-node must.
absl::StatusOr<config::JobSpec> LoadSpec(FileSystem& fs, const PlanFlags& flags) {
  const std::string& path = flags.spec_path;
  absl::StatusOr<std::string> text = fs.ReadFile(path);
  if (!text.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot read the spec ", path, ": ", text.status().message()));
  }
  absl::StatusOr<config::YamlNode> tree = config::ParseYamlTree(*text, path);
  const bool has_parallelism = tree.ok() && tree->Find("parallelism") != nullptr;
  const bool has_resources = tree.ok() && tree->Find("resources") != nullptr;
  // The planner chooses the mesh: a spec that names none is read as `parallelism: auto`, so that
  // its default single rank is not held against its resources.
  std::string yaml = *text;
  if (tree.ok() && tree->kind == config::YamlNode::Kind::kMap && !has_parallelism &&
      !absl::StartsWith(absl::StripLeadingAsciiWhitespace(yaml), "{")) {
    absl::StrAppend(&yaml, "\nparallelism: auto\n");
  }
  absl::StatusOr<config::JobSpec> spec = config::ParseJobSpec(yaml, path);
  if (!spec.ok()) return absl::InvalidArgumentError(spec.status().message());
  const bool overridden = flags.Get("nodes") || flags.Get("devices-per-node");
  if (!has_resources && !overridden) {
    return absl::InvalidArgumentError(
        absl::StrCat(path,
                     ": the spec has no resources section: say where it runs, or pass --nodes and "
                     "--devices-per-node"));
  }
  if (flags.Get("nodes")) {
    TY_ASSIGN_OR_RETURN(spec->resources.nodes, PositiveInt(flags, "nodes", config::kMaxNodes));
  }
  if (flags.Get("devices-per-node")) {
    TY_ASSIGN_OR_RETURN(spec->resources.devices_per_node,
                        PositiveInt(flags, "devices-per-node", config::kMaxDevicesPerNode));
  }
  return *std::move(spec);
}

absl::StatusOr<planner::DeviceProfile> ChooseProfile(const config::JobSpec& spec,
                                                     const PlanFlags& flags, const PlanIo& io) {
  const std::string name = flags.Get("device").value_or(
      spec.resources.kind == config::DeviceKind::kGpu ? "h100" : "cpu");
  if (name == "cpu") return planner::LoadCpuProfile(*io.fs, io.cpu_profile_path);
  return planner::PublishedProfile(name);
}

// Measures the cpu profile and stores it; reports unless a plan's JSON follows.
// With a SPEC, the shared-rank probes run its model and per-rank micro-batch.
absl::StatusOr<planner::DeviceProfile> Calibrate(const PlanFlags& flags, const PlanIo& io) {
  planner::CalibrationOptions options;
  if (!flags.spec_path.empty()) {
    TY_ASSIGN_OR_RETURN(const config::JobSpec spec, LoadSpec(*io.fs, flags));
    options.reference = planner::CalibrationReference(spec);
  }
  options.scratch_dir =
      absl::StrCat(io.scratch_dir, "/trainyard-calibrate-", static_cast<int64_t>(getpid()));
  absl::StatusOr<planner::Calibration> c = io.calibrate(options);
  std::error_code ignored;
  std::filesystem::remove_all(options.scratch_dir, ignored);  // also after a failed probe
  if (!c.ok())
    return absl::InternalError(absl::StrCat("calibration failed: ", c.status().message()));
  // Earlier calibrations of this machine are kept and the profile is their median with this one;
  // a file that cannot be read is replaced.
  std::optional<planner::CpuProfileFile> earlier;
  if (!flags.fresh && !io.cpu_profile_path.empty()) {
    absl::StatusOr<planner::CpuProfileFile> loaded =
        planner::LoadCpuProfileFile(*io.fs, io.cpu_profile_path);
    if (loaded.ok()) earlier = *std::move(loaded);
  }
  const planner::CpuProfileFile file = planner::AddCalibration(earlier, c->profile);
  TY_RETURN_IF_ERROR(planner::SaveCpuProfileFile(*io.fs, io.cpu_profile_path, file));
  const int kept = static_cast<int>(file.calibrations.size());
  if (!flags.json) {
    *io.out << CalibrationText(*c, io.cpu_profile_path, kept);
  } else if (flags.spec_path.empty()) {
    *io.out << CalibrationJson(*c, io.cpu_profile_path, kept);
  }
  return file.profile;
}

absl::StatusOr<int> Plan(const PlanFlags& flags, const PlanIo& io) {
  std::optional<planner::DeviceProfile> calibrated;
  if (flags.calibrate) {
    TY_ASSIGN_OR_RETURN(calibrated, Calibrate(flags, io));
    if (flags.spec_path.empty()) return 0;
  }
  TY_ASSIGN_OR_RETURN(const config::JobSpec spec, LoadSpec(*io.fs, flags));
  planner::PlanRequest request;
  request.spec = spec;
  if (calibrated && flags.Get("device").value_or("cpu") == "cpu") {
    request.device = *calibrated;
  } else {
    TY_ASSIGN_OR_RETURN(request.device, ChooseProfile(spec, flags, io));
  }
  if (flags.Get("mesh")) {
    TY_ASSIGN_OR_RETURN(request.mesh, ParseMesh(*flags.Get("mesh"), spec.parallelism));
  }
  if (flags.Get("checkpoint-seconds")) {
    TY_ASSIGN_OR_RETURN(request.checkpoint_seconds, PositiveNumber(flags, "checkpoint-seconds"));
    TY_ASSIGN_OR_RETURN(request.mtbf_hours, PositiveNumber(flags, "mtbf-hours"));
  }
  TY_ASSIGN_OR_RETURN(const planner::Plan plan, planner::MakePlan(request));
  *io.out << (flags.json ? PlanJson(plan) : PlanText(plan, spec)) << std::flush;
  return 0;
}

}  // namespace

std::string CommandOf(const std::vector<std::string>& args) {
  for (size_t i = 0; i < args.size(); ++i) {
    if (IsGlobalValueFlag(args[i])) {
      ++i;
    } else if (!absl::StartsWith(args[i], "-")) {
      return args[i];
    }
  }
  return "";
}

bool IsPlanCommand(const std::vector<std::string>& args) { return CommandOf(args) == "plan"; }

int RunPlan(const std::vector<std::string>& args, const PlanIo& io) {
  absl::StatusOr<int> code = [&]() -> absl::StatusOr<int> {
    absl::StatusOr<PlanFlags> flags = ParsePlanFlags(args);
    if (!flags.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(flags.status().message(), " (", kPlanUsage, ")"));
    }
    return Plan(*flags, io);
  }();
  if (code.ok()) return *code;
  std::string message(code.status().message());
  for (char& c : message) {
    if (c == '\n') c = ' ';
  }
  *io.err << "trainyard: error: " << message << std::endl;
  return ExitCodeForStatus(code.status());
}

PlanIo PlanIoFromEnvironment(std::ostream* out, std::ostream* err, FileSystem* fs) {
  PlanIo io;
  io.out = out;
  io.err = err;
  io.fs = fs;
  io.cpu_profile_path =
      planner::CpuProfilePath(std::getenv("XDG_CONFIG_HOME"), std::getenv("HOME"));
  const char* tmp = std::getenv("TMPDIR");
  io.scratch_dir = tmp != nullptr && *tmp != '\0' ? tmp : "/tmp";
  return io;
}

}  // namespace trainyard::cli
