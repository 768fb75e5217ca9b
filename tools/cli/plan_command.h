// `trainyard plan`: the planner (planner/planner.h) from the command line, with no coordinator.
//
//   trainyard plan SPEC [--json] [--nodes N] [--devices-per-node G] [--device PROFILE]
//                       [--mesh dp=D,tp=T,pp=P[,zero=Z][,cp=C][,ep=E]]
//                       [--checkpoint-seconds S --mtbf-hours H]
//   trainyard plan --calibrate [--fresh] [SPEC ...]
//
// Prints every valid mesh of the spec's resources (or only --mesh) with its memory per rank,
// step time, communication and MFU, the chosen mesh and why the others lost, and with
// --checkpoint-seconds and --mtbf-hours the Young–Daly checkpoint interval. --json prints one
// object instead (docs/planner.md). --calibrate measures the cpu profile on this machine (in
// trainyard-worker, found beside this program or on PATH) and stores it in
// $XDG_CONFIG_HOME/trainyard/cpu-profile.json (else ~/.config/trainyard/...), with the earlier
// calibrations of the same machine and reference: the profile is the median of the last
// planner::kKeptCalibrations (--fresh forgets the earlier ones).
//
// Exit codes: 0 planned (even when nothing fits: the explanation says so); 2 bad input (flags, an
// unknown profile, an impossible --mesh, a spec that cannot be read or parsed, one without
// resources and without --nodes/--devices-per-node, or a connection flag such as --server), one
// line on stderr; 1 a calibration that failed.
//
// Threading: one call at a time.
#ifndef TRAINYARD_TOOLS_CLI_PLAN_COMMAND_H_
#define TRAINYARD_TOOLS_CLI_PLAN_COMMAND_H_

#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/filesystem.h"
#include "planner/calibration.h"
#include "tools/cli/worker_calibration.h"

namespace trainyard::cli {

struct PlanIo {
  std::ostream* out = nullptr;
  std::ostream* err = nullptr;
  FileSystem* fs = nullptr;
  std::string cpu_profile_path;  // planner::CpuProfilePath of the environment
  std::string scratch_dir;       // --calibrate's rendezvous files (a fresh directory under it)
  // What --calibrate measures with: `trainyard-worker calibrate` as a child process
  // (CalibrateInWorker), or a fake in tests.
  std::function<absl::StatusOr<planner::Calibration>(const planner::CalibrationOptions&)>
      calibrate = CalibrateInWorker;
};

// The command `args` (the command line without the program name) asks for: its first word
// that is not a flag (global flags with a value are skipped with it); empty when none.
std::string CommandOf(const std::vector<std::string>& args);

// True when that command is `plan`.
bool IsPlanCommand(const std::vector<std::string>& args);

// Runs `trainyard plan` (`args` as for IsPlanCommand) and returns the exit code.
int RunPlan(const std::vector<std::string>& args, const PlanIo& io);

// The PlanIo of this process: `out`, `err` and `fs`, the profile path from $XDG_CONFIG_HOME or
// $HOME, and $TMPDIR (else /tmp) for scratch.
PlanIo PlanIoFromEnvironment(std::ostream* out, std::ostream* err, FileSystem* fs);

}  // namespace trainyard::cli

#endif  // TRAINYARD_TOOLS_CLI_PLAN_COMMAND_H_
