// The planner behind `trainyard plan` (written to serve the coordinator's mesh choice too): for
// a job spec and a device profile it enumerates every valid mesh (dp, cp, tp, pp, ZeRO stage) of
// the spec's resources, predicts for each the memory of its most loaded rank (memory_model.h),
// the bytes each axis moves (traffic_model.h) and the step time from compute, the α–β model and
// the 1F1B bubble, and chooses the fastest mesh that fits, saying why the runners-up lost.
//
// Time model, per pipeline stage and micro-batch: compute = matmul FLOPs / matmul_flops plus
// three passes over the slot's activations at the memory bandwidth (the elementwise work), with
// one rank's share of the device (PerRankProfile: on cpu, the calibrated figures for the ranks
// sharing the node); tensor- and pipeline-parallel transfers are exposed; data-parallel
// reductions hide behind the backward pass (ZeRO-3's gathers behind the forward too) and only
// what exceeds it is exposed, unless no core is spare for them (then all of it is); the
// optimizer streams its state once. Under context parallelism a rank computes its seq_len / cp
// tokens of each sequence (each attending over the whole sequence), and ring attention's
// transfers hide behind each block's attention: per ring step, what the step's transfers take
// beyond its 1/cp of the block's attention is exposed (docs/planner.md). A step is m
// micro-batches of the slowest stage plus (p−1) more of them for the 1F1B bubble (fraction
// (p−1)/(m+p−1)). MFU uses PaLM's count, 6N + 12·L·h·s FLOPs per token, against the profile's
// peak over all ranks.
//
// Threading: plain functions.
#ifndef TRAINYARD_PLANNER_PLANNER_H_
#define TRAINYARD_PLANNER_PLANNER_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "config/spec.h"
#include "planner/device_profile.h"
#include "planner/memory_model.h"
#include "planner/traffic_model.h"

namespace trainyard::planner {

struct PlanRequest {
  config::JobSpec spec;  // its resources are the world planned for; its own mesh is ignored
  DeviceProfile device;
  std::optional<config::ParallelismSpec> mesh;  // plan this mesh only
  std::optional<double> checkpoint_seconds;     // with mtbf_hours: the Young–Daly interval
  std::optional<double> mtbf_hours;             // the job's mean time between failures
  LoopOptions loop;
};

struct StepSeconds {
  double compute = 0;        // the slowest stage's own work, the optimizer included
  double communication = 0;  // exposed collectives and transfers
  double bubble = 0;         // 1F1B idle time
  double total = 0;
};

struct AxisValues {
  double dp = 0, tp = 0, pp = 0, cp = 0, ep = 0;
};

struct Candidate {
  config::ParallelismSpec mesh;
  RankMemory memory;     // the rank with the largest total
  int memory_stage = 0;  // its pipeline stage
  int64_t capacity = 0;  // bytes one rank may use
  bool fits = false;
  StepSeconds step;
  double bubble_fraction = 0;
  // Per rank and step, the busiest rank; bytes_cp is ring attention's (0 for cp 1), bytes_ep
  // expert parallelism's all-to-alls (0 for ep 1; as if routing were balanced).
  int64_t bytes_dp = 0, bytes_tp = 0, bytes_pp = 0, bytes_cp = 0, bytes_ep = 0;
  AxisValues exposed;  // exposed seconds per axis, the slowest stage
  bool dp_crosses_nodes = false, pp_crosses_nodes = false, cp_crosses_nodes = false,
       ep_crosses_nodes = false;
  double model_flops = 0;  // per step, PaLM's count
  double tokens_per_second = 0;
  double mfu = 0;
};

struct YoungDaly {
  double checkpoint_seconds = 0;
  double mtbf_seconds = 0;
  double interval_seconds = 0;  // Daly's higher-order τ
  double young_seconds = 0;     // the first-order √(2δM)
};

struct Plan {
  DeviceProfile device;
  int nodes = 1, devices_per_node = 1;
  int seq_len = 0;  // the spec's training.seq_len, which context parallelism splits
  // Meshes that fit, fastest first, then those that do not, smallest footprint first.
  std::vector<Candidate> candidates;
  std::optional<int> chosen;  // index into candidates; none when nothing fits
  std::string explanation;    // the choice, then one sentence per runner-up
  std::optional<YoungDaly> young_daly;
};

// INVALID_ARGUMENT when the spec's resources admit no valid mesh, or request.mesh is not valid
// for them (naming the rule it breaks; cp > 1 on GPU resources included).
[[nodiscard]] absl::StatusOr<Plan> MakePlan(const PlanRequest& request);

// Every mesh of the spec's resources that the engine can run (config::FindMeshProblem finds
// nothing), over every cp of ContextParallelDegrees and, for an MoE model, every ep of
// ExpertParallelDegrees; ZeRO stages 1–3 only with dp · cp > 1. The spec's sequence_parallel is
// kept (for tp > 1); each dp × cp × tp × pp × ep × ZeRO split once per schedule of
// ScheduleOptions. The cp 1 and ep 1 meshes come first, so that of two meshes predicted as fast
// the one without context (or expert) parallelism is chosen.
std::vector<config::ParallelismSpec> ValidMeshes(const config::JobSpec& spec);

// The expert-parallel degrees the planner considers for `dp` data-parallel ranks: 1, and for an
// MoE model every divisor ep > 1 of dp that divides model.moe.experts.
std::vector<int> ExpertParallelDegrees(const config::JobSpec& spec, int dp);

// The context-parallel degrees the planner considers: 1, and every divisor cp > 1 of the world
// with training.seq_len divisible by 2 · cp (the head-tail split).
std::vector<int> ContextParallelDegrees(const config::JobSpec& spec);

// The most model chunks per rank `schedule: auto` tries for interleaved 1F1B.
inline constexpr int kMaxAutoVirtualStages = 4;

// The schedules `mesh` is planned with: the spec's (spec.parallelism.schedule and
// virtual_stages) where the mesh can run it, else 1F1B; under `schedule: auto` with pp > 1 every
// schedule the mesh can run (1F1B, ZB-H1, interleaved over 2 … kMaxAutoVirtualStages chunks per
// rank), each marked automatic_schedule. Empty when the mesh runs none.
std::vector<config::ParallelismSpec> ScheduleOptions(config::ParallelismSpec mesh,
                                                     const config::JobSpec& spec);

// The prediction for one valid mesh.
Candidate Evaluate(const config::JobSpec& spec, const config::ParallelismSpec& mesh,
                   const DeviceProfile& device, const LoopOptions& loop);

// PaLM's model FLOPs per optimizer step: batch · seq_len · (6N + 12·L·h·s), N the parameters
// that take part in one token's matmuls (every parameter except lookup-only tables: GPT-2's
// positions, an untied input embedding; of an MoE layer, the router, top_k routed experts and the
// shared experts: config::ModelConfig::ActiveParameterCount).
double ModelFlopsPerStep(const config::JobSpec& spec);
int64_t MatmulParameterCount(const config::ModelConfig& model);

// One micro-batch's work on one rank of a stage (its micro · seq_len / cp tokens): the FLOPs of
// its forward and backward passes (recomputation included; per token 2 per active matmul weight,
// RankShape::matmul_params, so an MoE block counts its router, top_k routed experts and shared
// experts, plus the head and PaLM's attention) and the bytes of its activation slot,
// which the elementwise work streams once forward (written) and twice backward (read, and their
// gradients written).
struct MicroBatchWork {
  double forward_flops = 0, backward_flops = 0;
  // Of backward_flops, what a split backward (a zero-bubble schedule) leaves to its weight pass:
  // the blocks' weight gradients but an MoE block's router's and routed experts'
  // (RankShape::weight_pass_params). 0 when the backward is one pass.
  double weight_flops = 0;
  double slot_bytes = 0;
  double forward_seconds(const DeviceProfile& d) const {
    return forward_flops / d.matmul_flops + slot_bytes / d.memory_bytes_per_second;
  }
  double backward_seconds(const DeviceProfile& d) const {
    return backward_flops / d.matmul_flops + 2 * slot_bytes / d.memory_bytes_per_second;
  }
};
MicroBatchWork WorkOf(const RankShape& s, const BackendShape& backend);

// The 1F1B bubble: (p − 1) / (m + p − 1).
double BubbleFraction(int stages, int micro_batches);
// The idle fraction of a stage whose passes (all its chunks together) take forward, backward
// (input gradient and, unless split, the weights') and weight (ZB-H1's weight pass; else 0)
// seconds per micro-batch: under 1F1B (p − 1)(F + B) over m(F + B) + (p − 1)(F + B); under
// interleaved 1F1B over V chunks (p − 1)(F + B)/V over m(F + B) + (p − 1)(F + B)/V; under ZB-H1
// (p − 1)(F + B − W) over m(F + B + W) + (p − 1)(F + B − W).
double BubbleFraction(const worker::ScheduleShape& schedule, double forward, double backward,
                      double weight);

// Young's τ = √(2δM), and Daly's higher-order form (the coordinator's CheckpointPolicy uses
// these):
// τ = √(2δM)·[1 + (1/3)·√(δ/(2M)) + (1/9)·δ/(2M)] − δ for δ < 2M, else M.
double YoungInterval(double delta_seconds, double mtbf_seconds);
double DalyInterval(double delta_seconds, double mtbf_seconds);

// "dp 4 × tp 2 × pp 1, ZeRO-1" ("dp 1 × cp 2 × tp 1 × pp 1, ZeRO-0" with cp > 1; and
// ", sequence parallel" where it applies).
std::string MeshName(const config::ParallelismSpec& mesh);
// The mesh's pipeline schedule in words: "1f1b", "zero-bubble", "interleaved over 2 virtual
// stages".
std::string ScheduleText(const config::ParallelismSpec& mesh);

}  // namespace trainyard::planner

#endif  // TRAINYARD_PLANNER_PLANNER_H_
