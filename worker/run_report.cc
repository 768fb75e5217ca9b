#include "worker/run_report.h"

#include <algorithm>
#include <cstdlib>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/device_probe.h"
#include "common/filesystem.h"
#include "common/status.h"
#include "planner/admission.h"
#include "planner/explain.h"

namespace trainyard::worker {

absl::StatusOr<planner::DeviceProfile> LocalDeviceProfile(const config::JobSpec& spec) {
  if (spec.resources.kind == config::DeviceKind::kGpu) {
    const DeviceInfo info = SystemDeviceProbe().Probe();
    return planner::PublishedProfile(absl::StrContains(info.name, "H200") ? "h200" : "h100");
  }
  const std::string path =
      planner::CpuProfilePath(std::getenv("XDG_CONFIG_HOME"), std::getenv("HOME"));
  return planner::LoadCpuProfile(*RealFileSystem(), path);
}

planner::LoopOptions LoopOptionsFor(bool coordinated) {
  planner::LoopOptions loop;
  loop.agreement_values = coordinated ? 3 : 1;
  return loop;
}

absl::Status ResolveAutoMesh(config::JobSpec* spec, const planner::DeviceProfile& device) {
  if (!spec->parallelism.automatic && !spec->parallelism.automatic_schedule) {
    return absl::OkStatus();
  }
  TY_ASSIGN_OR_RETURN(
      spec->parallelism,
      planner::ChooseMesh(*spec, device, LoopOptionsFor(false),
                          absl::StrCat("device profile ", device.name, ": ",
                                       planner::HumanBytes(device.memory_bytes),
                                       device.shared_node ? " shared by the node's ranks" : "")));
  return absl::OkStatus();
}

planner::RunFigures MeasuredFigures(const config::JobSpec& spec,
                                    const planner::DeviceProfile& device,
                                    const TrainResult& result) {
  planner::RunFigures f;
  f.parameters = result.memory.params;
  f.gradients = result.memory.grads;
  f.optimizer = result.memory.optimizer;
  f.activations = result.memory.activations;
  f.transient = result.memory.peak_transient;
  const int64_t steps = std::max<int64_t>(1, static_cast<int64_t>(result.step_seconds.size()));
  int64_t dp = 0;
  for (int64_t bytes : result.bytes_sent) dp += bytes;
  f.bytes_dp = dp / steps;
  f.bytes_tp = result.tp_bytes_sent / steps;
  f.bytes_pp = result.pp_bytes_sent / steps;
  f.bytes_cp = result.cp_bytes_sent / steps;
  f.bytes_ep = result.ep_bytes_sent / steps;
  if (result.step_seconds.empty() || !(result.train_seconds > 0)) return f;
  std::vector<double> times = result.step_seconds;
  std::nth_element(times.begin(), times.begin() + times.size() / 2, times.end());
  f.step = times[times.size() / 2];
  f.communication = f.step * result.exposed_comm_seconds / result.train_seconds;
  f.bubble = f.step * result.pipeline_wait_seconds / result.train_seconds;
  f.compute = std::max(0.0, f.step - f.communication - f.bubble);
  f.bubble_fraction = result.pipeline_wait_fraction;
  f.mfu = planner::MfuAt(spec, device, f.step);
  return f;
}

planner::RunComparison CompareRun(const config::JobSpec& spec, const planner::DeviceProfile& device,
                                  const planner::LoopOptions& loop, const TrainResult& result,
                                  int rank) {
  planner::RunComparison c;
  c.mesh = spec.parallelism;
  c.device = device.name;
  c.steps = static_cast<int64_t>(result.step_seconds.size());
  c.predicted = planner::PredictRun(spec, device, loop, rank);
  c.measured = MeasuredFigures(spec, device, result);
  return c;
}

}  // namespace trainyard::worker
