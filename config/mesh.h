// The rules a dp x tp x pp device mesh must satisfy for a job, and the choice made for
// `parallelism: auto`. These are the static rules (divisibility, world size, TP inside a node);
// fitting the model into device memory is the coordinator's mesh planner's concern.
//
// Threading: plain functions; no shared state.
#ifndef TRAINYARD_CONFIG_MESH_H_
#define TRAINYARD_CONFIG_MESH_H_

#include <optional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "config/spec.h"
#include "config/spec_validation.h"

namespace trainyard::config {

// The first rule `mesh` breaks for `spec` (its model, training batch and resources; the spec's
// own parallelism is ignored), or nothing. The rules, in order: every degree is at least 1 and
// zero is 0..3; dp x cp x tp x pp equals resources.nodes x resources.devices_per_node (the problem
// names the factor that, changed alone, would fit); tp divides devices_per_node (TP groups stay
// inside a node); model.moe is on CPU resources only (its layers have not run on a GPU);
// model.heads, model.kv_heads, model.ffn_hidden,
// model.vocab and model.moe.ffn are divisible by
// tp; model.layers >= pp (every pipeline stage holds a layer), and a token embedding tied across
// pipeline stages needs ZeRO 0 or 1; training.batch is divisible by
// dp x micro_batch (micro_batch 0 meaning batch / dp); training.seq_len is divisible by 2 x cp
// (the head-tail split); a schedule other than 1f1b needs pp > 1,
// no model.recompute and at least pp micro-batches per step.
std::optional<SpecProblem> FindMeshProblem(const ParallelismSpec& mesh, const JobSpec& spec);

// The rules of FindMeshProblem between the mesh and the model and batch alone, whatever the
// resources (degrees, tp dividing the sharded model sizes, pp within the layers, the batch split,
// context parallelism, sequence parallelism, the pipeline schedule): what a rank checks of the
// mesh it was handed.
std::optional<SpecProblem> FindShardingProblem(const ParallelismSpec& mesh, const JobSpec& spec);

// OK without a problem, else INVALID_ARGUMENT "path: reason".
[[nodiscard]] absl::Status MeshProblemStatus(const std::optional<SpecProblem>& problem);

// Where a global rank sits in a mesh. Ranks are laid out tensor-parallel innermost, then
// context, then data, then pipeline: rank = ((pp · dp + dp) · cp + cp) · tp + tp. Both the
// coordinator (what it tells each rank) and the rank (which groups it joins) use these two; a
// degree below 1 counts as 1.
struct MeshCoordinates {
  int dp = 0, tp = 0, pp = 0, cp = 0;
  bool operator==(const MeshCoordinates&) const = default;
};
MeshCoordinates CoordinatesOf(const ParallelismSpec& mesh, int rank);
int RankAt(const ParallelismSpec& mesh, const MeshCoordinates& at);

// For `parallelism: auto`: the valid mesh over the spec's resources with the least model
// parallelism (tp x pp), preferring tp to pp at equal size, so the largest data-parallel degree.
// Keeps spec.parallelism.zero and sets automatic. INVALID_ARGUMENT when no factorization is valid,
// naming why the pure data-parallel one is not.
[[nodiscard]] absl::StatusOr<ParallelismSpec> ChooseParallelism(const JobSpec& spec);

// Sequences one rank runs per forward/backward pass under `mesh`: training.micro_batch, or
// batch / dp when micro_batch is 0.
int MicroBatchPerRank(const TrainingSpec& training, const ParallelismSpec& mesh);

// The spec of an attempt on `nodes` nodes instead of resources.nodes (an elastic restart). The
// tensor-, pipeline- and context-parallel degrees are kept when they still fit, dp takes the rest
// (else the mesh ChooseParallelism picks for the smaller world), and the global batch stays as it
// is: each rank keeps the full-size mesh's micro-batch when it divides its larger share of the
// batch (else the largest micro-batch below it that does) and accumulates more micro-batches. The
// data order does not change (it depends on the global step only). `nodes` equal to
// resources.nodes gives the spec back; nullopt when no valid mesh exists at that size.
// With `given` (a mesh chosen for that size elsewhere: the planner's, for `parallelism: auto`),
// that mesh instead, the micro-batch fitted to it the same way; nullopt when it is not valid there.
std::optional<JobSpec> ResizedSpec(const JobSpec& spec, int nodes,
                                   const ParallelismSpec* given = nullptr);

// The spec of an attempt on `nodes` nodes above resources.nodes (an elastic job growing past its
// size, up to fault_tolerance.max_nodes): dp takes the extra ranks, every other degree is kept,
// each rank keeps its micro-batch when it divides its smaller share of the batch and
// accumulates fewer. nullopt when that mesh is not valid there (dp does not divide the batch,
// the world does not split into the model-parallel groups): growing never changes tp, pp or cp,
// and costs a few integer checks where it is refused.
std::optional<JobSpec> GrownSpec(const JobSpec& spec, int nodes);

}  // namespace trainyard::config

#endif  // TRAINYARD_CONFIG_MESH_H_
