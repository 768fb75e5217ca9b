// The planner at submit (planner/admission.h): `parallelism: auto` becomes the planner's choice,
// and a job whose mesh cannot fit the memory of the nodes it would run on is refused with the
// planner's explanation, before anything is stored.
//
// "The nodes it would run on" are the connected nodes of the job's kind: for a GPU job the nodes
// with GPUs, one rank per GPU, checked against the smallest GPU memory they report (the profile
// is `h200` when that GPU is one, else `h100`); for a CPU job every connected node, its ranks
// sharing the node's physical memory (the coordinator's cpu profile with the smallest node
// memory reported). Nodes that connect later may be smaller: the scheduler places a job only on
// nodes that hold RankMemoryNeed (server/scheduler.h), so it waits, saying why, rather than land
// where it cannot fit. With no such node connected (or none reporting its memory),
// the memory is unknown: the job is accepted unchecked, `auto` chooses by speed alone (memory
// unbounded), and the note says so.
//
// Threading: plain functions.
#ifndef TRAINYARD_SERVER_MESH_ADVISOR_H_
#define TRAINYARD_SERVER_MESH_ADVISOR_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "config/spec.h"
#include "planner/device_profile.h"
#include "server/agent_registry.h"

namespace trainyard::server {

struct Admission {
  config::JobSpec spec;  // with the mesh resolved
  std::string note;      // what the memory was checked against, for the submitted event
};

// The spec as it will run on `nodes` (the registry's view; disconnected ones are ignored).
// FAILED_PRECONDITION with the planner's explanation when its mesh (or, for `auto`, every mesh)
// does not fit; INVALID_ARGUMENT when the resources admit no mesh the engine can run.
[[nodiscard]] absl::StatusOr<Admission> AdmitSpec(config::JobSpec spec,
                                                  const std::vector<NodeStatus>& nodes,
                                                  const planner::DeviceProfile& cpu_profile);

// The memory one rank of `spec` needs with its mesh (the planner's prediction for the rank with
// the largest footprint), what the scheduler checks each node against at placement: for a GPU
// job on a GPU, for a CPU job shared with the job's other ranks on the node.
int64_t RankMemoryNeed(const config::JobSpec& spec, const planner::DeviceProfile& cpu_profile);

// The coordinator's cpu profile: the calibrated one of its environment ($XDG_CONFIG_HOME or
// $HOME, planner::CpuProfilePath), else the placeholder (also when the file is unreadable).
planner::DeviceProfile CoordinatorCpuProfile();

}  // namespace trainyard::server

#endif  // TRAINYARD_SERVER_MESH_ADVISOR_H_
