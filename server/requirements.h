// Extracts what the coordinator needs from a parsed job spec (placement shape, mesh, restart
// limit, checkpoint policy) and checks the cross-field rules placement depends on.
//
// Threading: a plain function.
#ifndef TRAINYARD_SERVER_REQUIREMENTS_H_
#define TRAINYARD_SERVER_REQUIREMENTS_H_

#include "absl/status/statusor.h"
#include "config/spec.h"
#include "server/types.h"

namespace trainyard::server {

// INVALID_ARGUMENT, "<field.path>: <reason>", when the resources cannot hold the mesh: the world
// of resources (nodes x devices_per_node) must equal dp x cp x tp x pp, and a tensor-parallel group
// (tp consecutive ranks) must fit inside one node.
[[nodiscard]] absl::StatusOr<JobRequirements> RequirementsFromSpec(const config::JobSpec& spec);

// The mesh the coordinator stores and hands to the ranks for `parallelism` (its schedule by name).
Mesh MeshOf(const config::ParallelismSpec& parallelism);

// The checkpoint section as the coordinator shows it: `every_steps: auto` becomes the fixed
// interval the workers use for it (config::kAutoCheckpointEverySteps) with interval_auto set.
// Without a checkpoint dir: an empty dir, interval 0 and keep 0.
CheckpointSettings CheckpointSettingsFromSpec(const config::CheckpointSpec& spec);

}  // namespace trainyard::server

#endif  // TRAINYARD_SERVER_REQUIREMENTS_H_
