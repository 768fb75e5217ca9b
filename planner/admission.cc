#include "planner/admission.h"

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "planner/explain.h"
#include "planner/planner.h"

namespace trainyard::planner {
namespace {

std::string Footprint(const RankMemory& m) {
  return absl::StrCat(HumanBytes(m.total()), " per rank (parameters ", HumanBytes(m.parameters),
                      ", gradients ", HumanBytes(m.gradients), ", optimizer ",
                      HumanBytes(m.optimizer), ", activations ", HumanBytes(m.activations),
                      ", other ", HumanBytes(m.other()), ")");
}

// Every mesh of the spec's resources, or with `only_spec_mesh` the spec's own mesh (under every
// schedule it can run, where the schedule is `auto`).
absl::StatusOr<Plan> PlanAll(const config::JobSpec& spec, const DeviceProfile& device,
                             const LoopOptions& loop, bool only_spec_mesh = false) {
  PlanRequest request;
  request.spec = spec;
  request.device = device;
  request.loop = loop;
  if (only_spec_mesh) request.mesh = spec.parallelism;
  return MakePlan(request);
}

}  // namespace

absl::StatusOr<config::ParallelismSpec> ChooseMesh(const config::JobSpec& spec,
                                                   const DeviceProfile& device,
                                                   const LoopOptions& loop,
                                                   const std::string& where) {
  // A fixed mesh whose schedule is `auto`: the schedule only.
  const bool schedule_only = !spec.parallelism.automatic && spec.parallelism.automatic_schedule;
  TY_ASSIGN_OR_RETURN(const Plan plan, PlanAll(spec, device, loop, schedule_only));
  if (!plan.chosen) {
    return absl::FailedPreconditionError(
        absl::StrCat(schedule_only ? "parallelism.schedule: auto: no schedule of the "
                                   : "parallelism: auto: no mesh of the ",
                     spec.resources.world_size(), " ranks fits in the ",
                     HumanBytes(plan.candidates.front().capacity), " one rank has (", where, "). ",
                     plan.explanation));
  }
  config::ParallelismSpec mesh = plan.candidates[*plan.chosen].mesh;
  mesh.automatic = !schedule_only;
  return mesh;
}

absl::Status CheckMeshFits(const config::JobSpec& spec, const DeviceProfile& device,
                           const LoopOptions& loop, const std::string& where) {
  const Candidate mine = Evaluate(spec, spec.parallelism, device, loop);
  if (mine.fits) return absl::OkStatus();
  std::string message = absl::StrCat("the job does not fit in memory: ", MeshName(spec.parallelism),
                                     " needs ", Footprint(mine.memory), ", but a rank has ",
                                     HumanBytes(mine.capacity), " (", where, ")");
  absl::StatusOr<Plan> plan = PlanAll(spec, device, loop);
  if (plan.ok() && plan->chosen) {
    const Candidate& best = plan->candidates[*plan->chosen];
    absl::StrAppend(&message, ". ", MeshName(best.mesh), " fits (", HumanBytes(best.memory.total()),
                    " per rank), and `parallelism: auto` would choose it: ", plan->explanation);
  } else if (plan.ok()) {
    absl::StrAppend(&message, ". ", plan->explanation);
  } else {
    absl::StrAppend(&message, "; no other mesh is suggested: ", plan.status().message());
  }
  return absl::FailedPreconditionError(message);
}

}  // namespace trainyard::planner
