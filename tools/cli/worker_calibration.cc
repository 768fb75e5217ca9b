#include "tools/cli/worker_calibration.h"

#include <sys/wait.h>

#include <cerrno>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/filesystem.h"
#include "common/json.h"
#include "common/process.h"
#include "common/status.h"

namespace trainyard::cli {
namespace {

// The child's last line of stderr, less the program's own "trainyard-worker: error: " prefix.
std::string LastLine(const std::string& log_path) {
  absl::StatusOr<std::string> log = RealFileSystem()->ReadFile(log_path);
  if (!log.ok()) return "";
  std::vector<std::string> lines = absl::StrSplit(*log, '\n', absl::SkipWhitespace());
  if (lines.empty()) return "";
  absl::string_view last = lines.back();
  absl::ConsumePrefix(&last, "trainyard-worker: error: ");
  return std::string(last);
}

std::vector<std::string> CalibrateArgv(const std::string& worker,
                                       const planner::CalibrationOptions& options,
                                       const std::string& reference_path) {
  std::vector<std::string> argv = {worker, "calibrate", "--scratch",
                                   options.scratch_dir + "/rendezvous"};
  argv.insert(argv.end(), {"--reference", reference_path});
  argv.insert(argv.end(), {"--seconds-per-probe", JsonNumber(options.seconds_per_probe)});
  argv.insert(argv.end(), {"--seconds-per-link-probe", JsonNumber(options.seconds_per_link_probe)});
  if (options.threads > 0) argv.insert(argv.end(), {"--threads", absl::StrCat(options.threads)});
  return argv;
}

}  // namespace

absl::StatusOr<planner::Calibration> CalibrateWithWorker(
    const std::string& worker, const planner::CalibrationOptions& options) {
  FileSystem& fs = *RealFileSystem();
  TY_RETURN_IF_ERROR(fs.CreateDirs(options.scratch_dir));
  const std::string reference_path = options.scratch_dir + "/reference.yaml";
  TY_RETURN_IF_ERROR(
      fs.WriteFileAtomic(reference_path, planner::CalibrationReferenceYaml(options.reference)));
  SpawnOptions spawn;
  spawn.argv = CalibrateArgv(worker, options, reference_path);
  spawn.stdout_path = options.scratch_dir + "/calibration.json";
  spawn.stderr_path = options.scratch_dir + "/worker.log";
  spawn.new_process_group = false;
  TY_ASSIGN_OR_RETURN(const pid_t pid, Spawn(spawn));
  int wait_status = 0;
  while (waitpid(pid, &wait_status, 0) < 0 && errno == EINTR) {
  }
  const ExitStatus exit = DecodeWaitStatus(wait_status);
  if (exit.exit_code != 0) {
    const std::string how = exit.signal != 0 ? absl::StrCat("was killed by signal ", exit.signal)
                                             : absl::StrCat("exited with code ", exit.exit_code);
    const std::string why = LastLine(spawn.stderr_path);
    return absl::InternalError(
        absl::StrCat(worker, " calibrate ", how, why.empty() ? "" : ": ", why));
  }
  TY_ASSIGN_OR_RETURN(const std::string json, fs.ReadFile(spawn.stdout_path));
  absl::StatusOr<planner::Calibration> calibration = planner::CalibrationFromJson(json);
  if (!calibration.ok()) {
    return absl::InternalError(absl::StrCat(
        worker, " calibrate printed a malformed result: ", calibration.status().message()));
  }
  return calibration;
}

absl::StatusOr<planner::Calibration> CalibrateInWorker(const planner::CalibrationOptions& options) {
  absl::StatusOr<std::string> worker = LocateWorkerBinary();
  if (!worker.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("calibration needs trainyard-worker beside trainyard or on PATH: ",
                     worker.status().message()));
  }
  return CalibrateWithWorker(*worker, options);
}

}  // namespace trainyard::cli
