#include "server/mesh_advisor.h"

#include <cstdlib>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/filesystem.h"
#include "common/logging.h"
#include "common/status.h"
#include "planner/admission.h"
#include "planner/explain.h"
#include "planner/planner.h"

namespace trainyard::server {
namespace {

// The device a job's ranks would get, and where its memory figure comes from.
struct Target {
  planner::DeviceProfile device;
  std::string where;
  bool known = false;  // some node of the job's kind reported its memory
};

Target GpuTarget(const std::vector<NodeStatus>& nodes) {
  Target t;
  const GpuInfo* smallest = nullptr;
  const NodeStatus* on = nullptr;
  for (const NodeStatus& node : nodes) {
    if (!node.connected) continue;
    for (const GpuInfo& gpu : node.record.gpus) {
      if (gpu.memory_bytes <= 0) continue;
      if (smallest == nullptr || gpu.memory_bytes < smallest->memory_bytes) {
        smallest = &gpu;
        on = &node;
      }
    }
  }
  const bool h200 = smallest != nullptr && absl::StrContains(smallest->name, "H200");
  t.device = *planner::PublishedProfile(h200 ? "h200" : "h100");
  if (smallest == nullptr) return t;
  t.device.memory_bytes = smallest->memory_bytes;
  t.where = absl::StrCat("GPU ", smallest->index, " (", smallest->name, ") of node ",
                         on->record.node_id, ", the smallest of the connected GPU nodes");
  t.known = true;
  return t;
}

Target CpuTarget(const std::vector<NodeStatus>& nodes, const planner::DeviceProfile& cpu,
                 int ranks_per_node) {
  Target t;
  t.device = cpu;
  const NodeStatus* smallest = nullptr;
  for (const NodeStatus& node : nodes) {
    if (!node.connected || node.record.memory_bytes <= 0) continue;
    if (smallest == nullptr || node.record.memory_bytes < smallest->record.memory_bytes) {
      smallest = &node;
    }
  }
  if (smallest == nullptr) return t;
  t.device.memory_bytes = smallest->record.memory_bytes;
  t.where = absl::StrCat("node ", smallest->record.node_id, ": ",
                         planner::HumanBytes(smallest->record.memory_bytes), " shared by ",
                         ranks_per_node, " ranks; the smallest of the connected nodes");
  t.known = true;
  return t;
}

}  // namespace

absl::StatusOr<Admission> AdmitSpec(config::JobSpec spec, const std::vector<NodeStatus>& nodes,
                                    const planner::DeviceProfile& cpu_profile) {
  const bool gpu = spec.resources.kind == config::DeviceKind::kGpu;
  const Target target =
      gpu ? GpuTarget(nodes) : CpuTarget(nodes, cpu_profile, spec.resources.devices_per_node);
  const planner::LoopOptions loop;  // a coordinated job's loop
  Admission admission;
  if (!target.known) {
    admission.note = absl::StrCat("memory not checked: no connected ", gpu ? "GPU " : "",
                                  "node reports its memory yet");
    if (spec.parallelism.automatic || spec.parallelism.automatic_schedule) {
      planner::DeviceProfile unbounded = target.device;
      unbounded.memory_bytes = int64_t{1} << 62;  // unknown: choose by speed alone
      TY_ASSIGN_OR_RETURN(spec.parallelism,
                          planner::ChooseMesh(spec, unbounded, loop, "memory unknown"));
    }
    admission.spec = std::move(spec);
    return admission;
  }
  if (spec.parallelism.automatic) {
    TY_ASSIGN_OR_RETURN(spec.parallelism,
                        planner::ChooseMesh(spec, target.device, loop, target.where));
  } else {
    TY_RETURN_IF_ERROR(planner::CheckMeshFits(spec, target.device, loop, target.where));
    if (spec.parallelism.automatic_schedule) {
      TY_ASSIGN_OR_RETURN(spec.parallelism,
                          planner::ChooseMesh(spec, target.device, loop, target.where));
    }
  }
  admission.note = absl::StrCat("fits the memory of ", target.where);
  admission.spec = std::move(spec);
  return admission;
}

int64_t RankMemoryNeed(const config::JobSpec& spec, const planner::DeviceProfile& cpu_profile) {
  const bool gpu = spec.resources.kind == config::DeviceKind::kGpu;
  const planner::DeviceProfile device = gpu ? *planner::PublishedProfile("h100") : cpu_profile;
  return planner::Evaluate(spec, spec.parallelism, device, planner::LoopOptions{}).memory.total();
}

planner::DeviceProfile CoordinatorCpuProfile() {
  const std::string path =
      planner::CpuProfilePath(std::getenv("XDG_CONFIG_HOME"), std::getenv("HOME"));
  FileSystem* fs = RealFileSystem();
  absl::StatusOr<planner::DeviceProfile> profile = planner::LoadCpuProfile(*fs, path);
  if (profile.ok()) return *profile;
  TY_LOG(WARNING) << "the cpu profile is unusable, planning with the placeholder: "
                  << profile.status();
  return *planner::LoadCpuProfile(*fs, "");
}

}  // namespace trainyard::server
