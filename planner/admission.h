// The planner where a job is admitted: `parallelism: auto` resolved to the planner's choice, and
// a fixed mesh checked against the memory one rank has. The coordinator calls both at submit
// (server/mesh_advisor.h) with the memory of the nodes the job would run on; the standalone
// worker resolves `auto` with its machine's profile.
//
// Threading: plain functions.
#ifndef TRAINYARD_PLANNER_ADMISSION_H_
#define TRAINYARD_PLANNER_ADMISSION_H_

#include <string>

#include "absl/status/statusor.h"
#include "config/spec.h"
#include "planner/device_profile.h"
#include "planner/traffic_model.h"

namespace trainyard::planner {

// The mesh the planner chooses for `spec`'s resources on `device` (the fastest that fits; the
// ZeRO stage is chosen too, the spec's sequence_parallel kept for tp > 1), marked automatic: for
// `parallelism: auto` any mesh, else the spec's mesh with its `schedule: auto` resolved (the
// pipeline schedule and virtual stages chosen the same way). FAILED_PRECONDITION with the plan's
// explanation when nothing fits; INVALID_ARGUMENT when the resources admit no valid mesh at all.
// `where` says in messages where the memory per rank comes from ("node n1: 15.6 GiB shared by 2
// ranks").
[[nodiscard]] absl::StatusOr<config::ParallelismSpec> ChooseMesh(const config::JobSpec& spec,
                                                                 const DeviceProfile& device,
                                                                 const LoopOptions& loop,
                                                                 const std::string& where);

// OK when spec.parallelism fits `device`'s memory per rank; else FAILED_PRECONDITION naming the
// mesh's footprint by kind, the memory it was checked against (`where`), and the meshes of the
// same resources that would fit (or why none does; for a model whose meshes the planner does not
// choose, an MoE model's, why none is suggested).
[[nodiscard]] absl::Status CheckMeshFits(const config::JobSpec& spec, const DeviceProfile& device,
                                         const LoopOptions& loop, const std::string& where);

}  // namespace trainyard::planner

#endif  // TRAINYARD_PLANNER_ADMISSION_H_
