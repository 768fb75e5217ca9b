#include "server/requirements.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "config/mesh.h"

namespace trainyard::server {

CheckpointSettings CheckpointSettingsFromSpec(const config::CheckpointSpec& spec) {
  CheckpointSettings policy;
  if (!spec.enabled()) return policy;
  policy.keep = spec.keep;
  policy.dir = spec.dir;
  policy.every_steps = spec.interval_steps();
  policy.interval_auto = !spec.every_steps.has_value();
  return policy;
}

Mesh MeshOf(const config::ParallelismSpec& p) {
  return Mesh{.dp = p.dp,
              .tp = p.tp,
              .pp = p.pp,
              .zero_stage = p.zero,
              .schedule = config::ScheduleName(p.schedule),
              .virtual_stages = p.virtual_stages,
              .cp = p.cp,
              .ep = p.ep};
}

absl::StatusOr<JobRequirements> RequirementsFromSpec(const config::JobSpec& spec) {
  JobRequirements req;
  req.nodes = spec.resources.nodes;
  req.ranks_per_node = spec.resources.devices_per_node;
  req.kind = spec.resources.kind == config::DeviceKind::kGpu ? DeviceKind::kGpu : DeviceKind::kCpu;
  req.mesh = MeshOf(spec.parallelism);
  req.max_restarts = spec.fault_tolerance.max_restarts;
  req.heartbeat_timeout = absl::Seconds(spec.fault_tolerance.heartbeat_timeout_s);
  req.checkpoint = CheckpointSettingsFromSpec(spec.checkpoint);
  if (req.nodes < 1 || req.ranks_per_node < 1) {
    return absl::InvalidArgumentError(
        "resources: nodes and devices_per_node must both be at least 1");
  }
  if (req.max_restarts < 0) {
    return absl::InvalidArgumentError("fault_tolerance.max_restarts: must be at least 0");
  }
  // The same rules the spec's validation applies (config/mesh.h), so a spec that reaches here
  // some other way cannot be placed on a mesh its ranks would refuse.
  TY_RETURN_IF_ERROR(config::MeshProblemStatus(config::FindMeshProblem(spec.parallelism, spec)));
  return req;
}

}  // namespace trainyard::server
