#include "planner/planner.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "config/mesh.h"
#include "planner/explain.h"
#include "planner/pipeline_schedule.h"
#include "worker/shape/schedule.h"

namespace trainyard::planner {
namespace {

// Seconds one rank spends in `collectives` over `link`, split by when they run.
struct PhaseSeconds {
  double exposed = 0, forward = 0, backward = 0;
  double all() const { return exposed + forward + backward; }
};

// What a collective's latency costs besides its bytes: `message` per latency step, `hand_over`
// per thread hand-over (a shared node's, where α is mostly a thread's wake-up: docs/planner.md;
// 0 elsewhere), and `sync_skew` at every exposed collective (DeviceProfile::sync_skew_seconds).
struct LatencyCosts {
  double message = 0, hand_over = 0, sync_skew = 0;
  double exposed_message = -1;  // per step of an exposed collective; < 0: `message`
  // Per step and hand-over of the step's scalar sums, which run while no rank computes; < 0: as
  // any other collective.
  double step_end = -1;
};

PhaseSeconds TimeOf(const std::vector<Collective>& collectives, const Link& link,
                    const LatencyCosts& costs) {
  PhaseSeconds t;
  for (const Collective& c : collectives) {
    const bool exposed = c.phase == Phase::kExposed;
    double message = exposed && costs.exposed_message >= 0 ? costs.exposed_message : costs.message;
    double hand_over = costs.hand_over;
    if (c.step_end && costs.step_end >= 0) {
      message = costs.step_end;
      hand_over = std::min(hand_over, costs.step_end);
    }
    const double seconds =
        c.repeat * (c.latency * message + c.hand_overs * hand_over +
                    c.bytes / link.bytes_per_second + (exposed ? costs.sync_skew : 0));
    (c.phase == Phase::kExposed   ? t.exposed
     : c.phase == Phase::kForward ? t.forward
                                  : t.backward) += seconds;
  }
  return t;
}

// Whether some block of `span` consecutive ranks, of `blocks`, spans two nodes (a node holds
// devices_per_node consecutive ranks).
bool BlockCrossesNodes(int span, int blocks, int devices_per_node) {
  for (int b = 0; b < blocks; ++b) {
    if ((b * span) / devices_per_node != ((b + 1) * span - 1) / devices_per_node) return true;
  }
  return false;
}

// Whether some group of the axis spans two nodes (ranks are laid out tp innermost, then cp,
// then dp, then pp). The data-parallel group (dp · cp ranks) lies within a stage's dp · cp · tp
// ranks, a context-parallel group within cp · tp.
bool DataParallelCrossesNodes(const config::ParallelismSpec& m, int devices_per_node) {
  return BlockCrossesNodes(m.dp * m.cp * m.tp, m.pp, devices_per_node);
}

bool ContextParallelCrossesNodes(const config::ParallelismSpec& m, int devices_per_node) {
  return m.cp > 1 && BlockCrossesNodes(m.cp * m.tp, m.dp * m.pp, devices_per_node);
}

bool ExpertParallelCrossesNodes(const config::ParallelismSpec& m, int devices_per_node) {
  // An ep group: ep consecutive data-parallel indices of one stage, cp · tp ranks apart.
  return m.ep > 1 && BlockCrossesNodes(m.ep * m.cp * m.tp, m.dp / m.ep * m.pp, devices_per_node);
}

bool PipelineCrossesNodes(const config::ParallelismSpec& m, int devices_per_node) {
  return m.pp > 1 && (m.pp - 1) * m.dp * m.cp * m.tp >= devices_per_node;
}

// Ring attention's exposed seconds per micro-batch, and MoE routing's over the cp group
// (RingExposure, beside the engine's order in
// worker/context_parallel.cc): each of a block's cp ring steps computes attention against one
// rank's keys and values while the next travel; what a step's transfers take beyond its share
// of the block's attention (1/cp: the head-tail split balances it) is exposed. Where the
// device's profile does not count on the overlap (DeviceProfile::ring_overlap false: the
// published GPU profiles), every transfer is.
struct RingSeconds {
  double forward = 0, backward = 0;
};

RingSeconds RingExposure(const RankShape& s, const DeviceProfile& device, const Link& link,
                         const BackendShape& backend) {
  const int cp = s.mesh.cp;
  if (cp == 1) return {};
  const double transfer = link.alpha_seconds + static_cast<double>(RingKeyValueElements(s)) *
                                                   backend.act_bytes / link.bytes_per_second;
  // PaLM's attention count for a block: 4·h·s per local token forward (h / tp of the
  // attention's width on this rank, s the whole sequence, or the mean of the rank's blocks'
  // spans with a sliding window), twice that backward.
  const double attention = 4.0 * s.model.attention_flop_width() / s.mesh.tp * s.attended_span() /
                           s.layers() * s.rows() / device.matmul_flops;
  const double hidden = device.ring_overlap ? 1.0 : 0.0;
  const double forward_step = hidden * attention / cp, backward_step = 2 * hidden * attention / cp;
  // Forward: cp − 1 steps with one transfer in flight.
  const double forward = (cp - 1) * std::max(0.0, transfer - forward_step);
  // Backward: the first step carries the keys and values only, the last the gradient only, those
  // between both; the gradient's last transfer (to its owner) is waited for after the last step.
  const double backward = 2 * std::max(0.0, transfer - backward_step) +
                          (cp - 2) * std::max(0.0, 2 * transfer - backward_step) + transfer;
  const double blocks = s.layers();
  // MoE routing's all-gather of counts per MoE block (ContextParallelTraffic), all exposed:
  // nothing computes beside it.
  const double gather = s.moe_blocks() * (cp - 1) *
                        (link.alpha_seconds + RoutingGatherFloats(s) * 4.0 / link.bytes_per_second);
  return {.forward = blocks * forward + gather,
          .backward = blocks * backward + (s.model.recompute ? blocks * forward + gather : 0.0)};
}

// Expert parallelism's exposed seconds per micro-batch, from its `traffic`
// (ExpertParallelTraffic): nothing
// computes beside the all-to-alls (each (ep − 1) pairwise exchanges of its share of the rows) nor
// beside the counts' all-gather, and every one of them waits for the slowest peer, as any exposed
// collective does (`costs`, the tensor-parallel ones'). The forward pass makes the all-gather and
// two all-to-alls per MoE block, the backward two (and the forward's again under
// model.recompute).
RingSeconds ExchangeExposure(const RankShape& s, const std::vector<Collective>& traffic,
                             const Link& link, const LatencyCosts& costs) {
  if (s.mesh.ep == 1 || s.moe_blocks() == 0) return {};
  double counts = 0, exchange = 0;  // one of each
  for (const Collective& c : traffic) {
    if (c.step_end) continue;  // the experts' share of the norm: the step's end, not a pass
    Collective one = c;
    one.repeat = 1;
    (c.kind == CollectiveKind::kAllGather ? counts : exchange) = TimeOf({one}, link, costs).all();
  }
  const double forward = counts + 2 * exchange, blocks = s.moe_blocks();
  return {.forward = blocks * forward,
          .backward = blocks * (2 * exchange + (s.model.recompute ? forward : 0.0))};
}

// One stage's share of a step.
struct StageTime {
  // One micro-batch's compute: with a split backward, backward is the input-gradient pass and
  // weight the weight pass; else weight is 0.
  double forward = 0, backward = 0, weight = 0;
  double optimizer = 0;
  double tp = 0, pp = 0, dp = 0, cp = 0, ep = 0;  // exposed seconds per step
  // Of cp, the ring's exposed seconds in one micro-batch's forward and backward passes; of ep,
  // the all-to-alls'.
  RingSeconds ring, exchange;
  // Of pp, one activation or gradient message (0 without pipelining) and all of them; of the
  // one, moving its bytes within the node (0 across nodes: the wire's time, not the cores').
  double pp_handoff = 0, pp_messages = 0, pp_copy = 0;
  int64_t bytes_dp = 0, bytes_tp = 0, bytes_pp = 0, bytes_cp = 0, bytes_ep = 0;
  double per_micro_batch(int m) const {
    return forward + backward + weight + (tp + pp + cp + ep) / m;
  }
  // What the pipeline's fill and drain cost per stage of the slowest micro-batch: F + B under
  // 1F1B, F + B − W under ZB-H1 (its weight passes fill the rest).
  double bubble_per_stage(int m) const { return per_micro_batch(m) - 2 * weight; }
};

// Which axes' groups span nodes (their transfers take the inter-node link).
struct Crossings {
  bool dp = false, pp = false, cp = false, ep = false;
};

StageTime TimeStage(const RankShape& s, const DeviceProfile& device, const LoopOptions& loop,
                    const Crossings& crosses) {
  const bool dp_crosses = crosses.dp, pp_crosses = crosses.pp;
  const BackendShape backend{device.act_bytes, device.max_logits_chunk,
                             device.logits_vocab_multiple};
  const MicroBatchWork work = WorkOf(s, backend);
  StageTime t;
  t.forward = work.forward_seconds(device);
  t.weight = work.weight_flops / device.matmul_flops;
  t.backward = work.backward_seconds(device) - t.weight;
  const RankMemory memory = PredictRankMemory(s, backend);
  // The moments are 8 bytes per element the rank owns. Where the step was measured (cpu), its
  // rate; else AdamW streams 7 floats per owned element (it reads parameters, gradients and both
  // moments and writes three of them) at the memory bandwidth.
  const double owned = memory.optimizer / 8.0;
  t.optimizer = device.optimizer_elements_per_second > 0
                    ? owned / device.optimizer_elements_per_second
                    : 28.0 * owned / device.memory_bytes_per_second;

  const std::vector<Collective> dp = DataParallelTraffic(s, loop, 0);
  const std::vector<Collective> tp = TensorParallelTraffic(s, backend, loop, 0);
  std::vector<Collective> pp = PipelineTraffic(s, backend, loop, s.stage_index);
  for (const Collective& tied : TiedEmbeddingTraffic(s)) pp.push_back(tied);
  t.bytes_dp = TotalBytes(dp);
  t.bytes_tp = TotalBytes(tp);
  t.bytes_pp = TotalBytes(pp);
  t.bytes_cp = TotalBytes(ContextParallelTraffic(s, backend));
  t.ring = RingExposure(s, device, crosses.cp ? device.inter_node : device.intra_node, backend);
  t.cp = s.micro_batches * (t.ring.forward + t.ring.backward);
  const std::vector<Collective> ep = ExpertParallelTraffic(s, backend);
  t.bytes_ep = TotalBytes(ep);
  const double idle = device.idle_alpha_seconds > 0 ? device.idle_alpha_seconds : -1;
  const LatencyCosts in_step{.message = device.intra_node.alpha_seconds,
                             .sync_skew = device.sync_skew_seconds,
                             .step_end = idle};
  t.tp = TimeOf(tp, device.intra_node, in_step).all();
  const Link& ep_link = crosses.ep ? device.inter_node : device.intra_node;
  t.exchange = ExchangeExposure(
      s, ep, ep_link, {.message = ep_link.alpha_seconds, .sync_skew = device.sync_skew_seconds});
  t.ep = s.micro_batches * (t.exchange.forward + t.exchange.backward);
  const Link& pp_link = pp_crosses ? device.inter_node : device.intra_node;
  t.pp = TimeOf(pp, pp_link,
                {.message = pp_link.alpha_seconds,
                 .sync_skew = device.sync_skew_seconds,
                 .step_end = idle})
             .all();
  for (const Collective& c : pp) {
    if (c.kind != CollectiveKind::kSendRecv) continue;
    const double transfer = c.bytes / pp_link.bytes_per_second;
    t.pp_handoff = c.latency * pp_link.alpha_seconds + transfer;
    t.pp_copy = pp_crosses ? 0 : transfer;
    t.pp_messages += c.repeat * t.pp_handoff;
  }
  // On a shared node the communication thread's messages cost what they cost beside compute
  // (the background α), and each hand-over a wake-up of a waiting thread (the link's α).
  const Link& dp_link = dp_crosses ? device.inter_node : device.intra_node;
  LatencyCosts dp_costs{.message = dp_link.alpha_seconds, .sync_skew = device.sync_skew_seconds};
  if (device.shared_node) {
    dp_costs.hand_over = dp_link.alpha_seconds;
    if (device.background_alpha_seconds > 0) {
      dp_costs.message = device.background_alpha_seconds;
    }
    // Without pipelining every rank waits for an exposed one: no core computes meanwhile.
    if (s.mesh.pp == 1 && device.idle_alpha_seconds > 0) {
      dp_costs.exposed_message = device.idle_alpha_seconds;
    }
    if (device.idle_alpha_seconds > 0) dp_costs.step_end = device.idle_alpha_seconds;
  }
  const PhaseSeconds d = TimeOf(dp, dp_link, dp_costs);
  // ZeRO-0/1 reduce during the last micro-batch's backward pass; ZeRO-2/3 during every one.
  const int windows = s.mesh.zero <= 1 ? 1 : s.micro_batches;
  t.dp = device.overlap
             ? d.exposed + std::max(0.0, d.backward - windows * (t.backward + t.weight)) +
                   std::max(0.0, d.forward - s.micro_batches * t.forward)
             : d.all();
  return t;
}

// `device` for a rank of `mesh`: on a shared node in lockstep, a rank of a tensor-parallel group
// computes at the rate calibrated for one (DeviceProfile::tensor_parallel_matmul_flops; the
// probe's groups are pairs). A pipeline's passes share the cores as its schedule has them
// (PassesWhileRunning), at the rates of the ranks working then.
DeviceProfile ForMesh(DeviceProfile device, const config::ParallelismSpec& mesh) {
  if (mesh.tp > 1 && device.tensor_parallel_matmul_flops > 0) {
    device.matmul_flops = device.tensor_parallel_matmul_flops;
  }
  return device;
}

// The ranks that share a shared node's cores while `active` of its g ranks work and the others
// wait. A rank's threads are fixed at max(1, cores / g) (the standalone worker's), so waiting
// neighbours only speed up ranks that time-share the cores: max(active, min(g, cores)).
int TimeSharingRanks(const DeviceProfile& node, int g, int active) {
  return std::clamp(std::max(active, std::min(g, node.cores)), 1, g);
}

// The profile a rank works at then: that many ranks' entry. Without shared_node or known cores,
// the profile of all g.
DeviceProfile ActiveProfile(const DeviceProfile& node, int g, int active) {
  if (!node.shared_node || node.cores <= 0) return PerRankProfile(node, g);
  return PerRankProfile(node, TimeSharingRanks(node, g, active));
}

// With several chunks per rank, each chunk's part of the rank's passes: its blocks' active
// matmul parameters and attention, and on the last virtual stage the LM head (WorkOf's FLOP
// count); empty for one chunk.
std::vector<double> ChunkShares(const RankShape& s) {
  if (s.chunks.size() <= 1) return {};
  const double attention = 4.0 * s.model.attention_flop_width() / s.mesh.tp;
  std::vector<double> work;
  double total = 0;
  for (size_t c = 0; c < s.chunks.size(); ++c) {
    work.push_back(2.0 * s.chunk_matmul_params[c] +
                   attention * s.attended_span(static_cast<int>(c)) +
                   (s.chunks[c].last ? 2.0 * s.head_params : 0.0));
    total += work.back();
  }
  for (double& w : work) w /= total;
  return work;
}

Crossings CrossingsOf(const Candidate& c) {
  return {.dp = c.dp_crosses_nodes,
          .pp = c.pp_crosses_nodes,
          .cp = c.cp_crosses_nodes,
          .ep = c.ep_crosses_nodes};
}

// Every stage's passes while k = 1 … p stages run passes at once (SimulateSchedule),
// on a shared node: a pass runs at the profile of the ranks working then (ActiveProfile), those
// of the k stages, as many as the node holds. A pass carries its share of the stage's exposed
// tensor-parallel seconds, half in the forward pass and half in the backward pass (each block
// all-reduces twice in each), and the ring's exposed seconds of its pass; a pipeline message is the
// hand-off between two stages' passes; the optimizer and the data-parallel reduction are the
// stage's tail.
std::vector<std::vector<PassSeconds>> PassesWhileRunning(const config::JobSpec& spec,
                                                         const config::ParallelismSpec& mesh,
                                                         const DeviceProfile& node_device,
                                                         const LoopOptions& loop,
                                                         const Candidate& c, int micro_batches) {
  const int g = spec.resources.devices_per_node;
  const int stage_ranks = mesh.dp * mesh.cp * mesh.tp;
  const int stages_per_node = std::max(1, g / stage_ranks);
  std::vector<std::vector<PassSeconds>> running(mesh.pp);
  for (int k = 1; k <= mesh.pp; ++k) {
    const int active = std::clamp(std::min(k, stages_per_node) * stage_ranks, 1, g);
    const DeviceProfile device = ActiveProfile(node_device, g, active);
    // A message's copy gets its rank's share of the cores, as the passes do.
    const double cores_share = std::max(
        1.0, static_cast<double>(TimeSharingRanks(node_device, g, active)) / node_device.cores);
    for (int s = 0; s < mesh.pp; ++s) {
      const RankShape shape = ShapeOf(spec, mesh, s);
      const StageTime t = TimeStage(shape, device, loop, CrossingsOf(c));
      const double waiting = t.tp / micro_batches / 2;
      const double forward_waiting = waiting + t.ring.forward + t.exchange.forward;
      const double backward_waiting = waiting + t.ring.backward + t.exchange.backward;
      running[k - 1].push_back({.forward = t.forward + forward_waiting,
                                .backward = t.backward + backward_waiting,
                                .weight = t.weight,
                                .forward_waiting = forward_waiting,
                                .backward_waiting = backward_waiting,
                                .handoff = t.pp_handoff - t.pp_copy,
                                .send = t.pp_copy * cores_share,
                                .tail = t.optimizer + t.dp,
                                .tail_waiting = t.dp,
                                .chunk_share = ChunkShares(shape)});
    }
  }
  return running;
}

}  // namespace

MicroBatchWork WorkOf(const RankShape& s, const BackendShape& backend) {
  const config::ModelConfig& c = s.model;
  // The rank's tokens (1/cp of each sequence), each attending over the whole sequence: the
  // head-tail split gives every context-parallel rank 1/cp of the causal attention.
  const double tokens = static_cast<double>(s.rows());
  const double attention = 4.0 * c.attention_flop_width() / s.mesh.tp * s.attended_span();
  MicroBatchWork w;
  w.forward_flops = tokens * (2.0 * (s.matmul_params + s.head_params) + attention);
  w.backward_flops = 2 * w.forward_flops;
  if (c.recompute) w.backward_flops += tokens * (2.0 * s.matmul_params + attention);
  if (s.split_backward()) {
    w.weight_flops = tokens * 2.0 * s.weight_pass_params;
  }
  w.slot_bytes = static_cast<double>(ActivationSlotBytes(s, backend));
  return w;
}

std::vector<config::ParallelismSpec> ScheduleOptions(config::ParallelismSpec mesh,
                                                     const config::JobSpec& spec) {
  const config::ParallelismSpec& wanted = spec.parallelism;
  std::vector<config::ParallelismSpec> options;
  auto add = [&](config::PipelineSchedule schedule, int virtual_stages) {
    mesh.schedule = schedule;
    mesh.virtual_stages = virtual_stages;
    if (!config::FindMeshProblem(mesh, spec)) options.push_back(mesh);
  };
  mesh.automatic_schedule = wanted.automatic_schedule;
  if (!wanted.automatic_schedule || mesh.pp == 1) {
    // The spec's schedule where the mesh can run it, else 1F1B.
    add(wanted.schedule, wanted.virtual_stages);
    if (options.empty()) add(config::PipelineSchedule::kOneForwardOneBackward, 1);
    return options;
  }
  add(config::PipelineSchedule::kOneForwardOneBackward, 1);
  add(config::PipelineSchedule::kZeroBubble, 1);
  for (int v = 2; v <= kMaxAutoVirtualStages && v * mesh.pp <= spec.model.layers; ++v) {
    add(config::PipelineSchedule::kInterleaved, v);
  }
  return options;
}

std::vector<int> ContextParallelDegrees(const config::JobSpec& spec) {
  std::vector<int> degrees = {1};
  const int world = spec.resources.world_size();
  for (int cp = 2; cp <= world; ++cp) {
    if (world % cp == 0 && spec.training.seq_len % (2 * cp) == 0) degrees.push_back(cp);
  }
  return degrees;
}

std::vector<int> ExpertParallelDegrees(const config::JobSpec& spec, int dp) {
  std::vector<int> degrees = {1};
  if (!spec.model.moe.enabled()) return degrees;
  for (int ep = 2; ep <= dp; ++ep) {
    if (dp % ep == 0 && spec.model.moe.experts % ep == 0) degrees.push_back(ep);
  }
  return degrees;
}

namespace {

// Every mesh of one dp × cp × tp × pp split: each ep of ExpertParallelDegrees (1 first: experts
// split over ranks only where that is predicted faster), each ZeRO stage (sharding over the data-
// and context-parallel ranks together), each schedule of ScheduleOptions.
void AddSplit(const config::JobSpec& spec, int dp, int cp, int tp, int pp,
              std::vector<config::ParallelismSpec>& meshes) {
  for (int ep : ExpertParallelDegrees(spec, dp)) {
    for (int zero = 0; zero <= (dp * cp > 1 ? 3 : 0); ++zero) {
      const config::ParallelismSpec mesh{
          .dp = dp,
          .tp = tp,
          .pp = pp,
          .zero = zero,
          .sequence_parallel = spec.parallelism.sequence_parallel && tp > 1,
          .cp = cp,
          .ep = ep};
      for (const config::ParallelismSpec& option : ScheduleOptions(mesh, spec)) {
        meshes.push_back(option);
      }
    }
  }
}

}  // namespace

std::vector<config::ParallelismSpec> ValidMeshes(const config::JobSpec& spec) {
  std::vector<config::ParallelismSpec> meshes;
  const int world = spec.resources.world_size();
  // cp 1 first: a cp mesh predicted as fast as one without comes after it in the choice.
  for (int cp : ContextParallelDegrees(spec)) {
    const int rest = world / cp;
    for (int tp = 1; tp <= rest; ++tp) {
      if (rest % tp != 0) continue;
      for (int pp = 1; pp <= rest / tp; ++pp) {
        if ((rest / tp) % pp == 0) AddSplit(spec, rest / tp / pp, cp, tp, pp, meshes);
      }
    }
  }
  return meshes;
}

Candidate Evaluate(const config::JobSpec& spec, const config::ParallelismSpec& mesh,
                   const DeviceProfile& node_device, const LoopOptions& loop) {
  const int g = spec.resources.devices_per_node;
  // Without pipelining a node's ranks move in step: all compute, then all exchange.
  const DeviceProfile device = ForMesh(PerRankProfile(node_device, g, mesh.pp == 1), mesh);
  const BackendShape backend{device.act_bytes, device.max_logits_chunk,
                             device.logits_vocab_multiple};
  Candidate c;
  c.mesh = mesh;
  c.dp_crosses_nodes = DataParallelCrossesNodes(mesh, g);
  c.pp_crosses_nodes = PipelineCrossesNodes(mesh, g);
  c.cp_crosses_nodes = ContextParallelCrossesNodes(mesh, g);
  c.ep_crosses_nodes = ExpertParallelCrossesNodes(mesh, g);
  c.capacity = device.memory_bytes;
  std::vector<StageTime> stages;
  double slowest_bubble = 0;  // the largest bubble_per_stage
  int micro_batches = 1;
  for (int s = 0; s < mesh.pp; ++s) {
    const RankShape shape = ShapeOf(spec, mesh, s);
    micro_batches = shape.micro_batches;
    const RankMemory memory = PredictRankMemory(shape, backend);
    if (s == 0 || memory.total() > c.memory.total()) {
      c.memory = memory;
      c.memory_stage = s;
    }
    stages.push_back(TimeStage(shape, device, loop, CrossingsOf(c)));
    // Interleaved chunks fill and drain the pipeline in passes V times shorter.
    slowest_bubble = std::max(slowest_bubble,
                              stages.back().bubble_per_stage(micro_batches) / mesh.virtual_stages);
    c.bytes_dp = std::max(c.bytes_dp, stages.back().bytes_dp);
    c.bytes_tp = std::max(c.bytes_tp, stages.back().bytes_tp);
    c.bytes_pp = std::max(c.bytes_pp, stages.back().bytes_pp);
    c.bytes_cp = std::max(c.bytes_cp, stages.back().bytes_cp);
    c.bytes_ep = std::max(c.bytes_ep, stages.back().bytes_ep);
  }
  c.fits = c.memory.total() <= c.capacity;
  const StageTime& slowest =
      *std::max_element(stages.begin(), stages.end(), [&](const StageTime& a, const StageTime& b) {
        return a.per_micro_batch(micro_batches) < b.per_micro_batch(micro_batches);
      });
  const worker::ScheduleShape schedule_shape{.schedule = mesh.schedule,
                                             .stages = mesh.pp,
                                             .micro_batches = micro_batches,
                                             .virtual_stages = mesh.virtual_stages};
  c.bubble_fraction =
      BubbleFraction(schedule_shape, slowest.forward, slowest.backward, slowest.weight);
  // On a shared node the schedule decides how many stages work at once, and so every pass's
  // rate; elsewhere a stage's passes take what they take and the fill and drain cost p − 1
  // micro-batch slots of the slowest stage.
  const bool simulate = mesh.pp > 1 && node_device.shared_node && node_device.cores > 0;
  const ScheduleSeconds schedule =
      simulate ? SimulateSchedule(schedule_shape, PassesWhileRunning(spec, mesh, node_device, loop,
                                                                     c, micro_batches))
               : ScheduleSeconds{};
  for (size_t s = 0; s < stages.size(); ++s) {
    const StageTime& t = stages[s];
    StepSeconds step;
    if (simulate) {
      step.compute = schedule.computing[s];
      // The hand-offs are in the idle time; the stage's other pipeline sums are not.
      step.communication = schedule.communicating[s] + (t.pp - t.pp_messages);
      step.bubble = schedule.idle[s];
    } else {
      step.compute = micro_batches * (t.forward + t.backward + t.weight) + t.optimizer;
      step.communication = t.tp + t.pp + t.dp + t.cp + t.ep;
      step.bubble = (mesh.pp - 1) * slowest_bubble;
    }
    step.total = step.compute + step.communication + step.bubble;
    if (step.total > c.step.total) {
      c.step = step;
      c.exposed = AxisValues{t.dp, t.tp, t.pp, t.cp, t.ep};
    }
  }
  c.model_flops = ModelFlopsPerStep(spec);
  c.tokens_per_second =
      static_cast<double>(spec.training.batch) * spec.training.seq_len / c.step.total;
  c.mfu = c.model_flops / (c.step.total * mesh.world_size() * device.peak_flops);
  return c;
}

absl::StatusOr<Plan> MakePlan(const PlanRequest& request) {
  const config::JobSpec& spec = request.spec;
  std::vector<config::ParallelismSpec> meshes;
  if (request.mesh) {
    if (auto problem = config::FindMeshProblem(*request.mesh, spec)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--mesh: ", problem->path, ": ", problem->reason));
    }
    meshes = ScheduleOptions(*request.mesh, spec);
  } else {
    meshes = ValidMeshes(spec);
    if (meshes.empty()) {
      absl::StatusOr<config::ParallelismSpec> rules = config::ChooseParallelism(spec);
      return absl::InvalidArgumentError(
          rules.ok()
              ? absl::StrCat("no mesh of the ", spec.resources.world_size(), " ranks fits the spec")
              : std::string(rules.status().message()));
    }
  }
  Plan plan;
  plan.device = request.device;
  plan.nodes = spec.resources.nodes;
  plan.devices_per_node = spec.resources.devices_per_node;
  plan.seq_len = spec.training.seq_len;
  for (const config::ParallelismSpec& mesh : meshes) {
    plan.candidates.push_back(Evaluate(spec, mesh, request.device, request.loop));
  }
  std::stable_sort(plan.candidates.begin(), plan.candidates.end(),
                   [](const Candidate& a, const Candidate& b) {
                     if (a.fits != b.fits) return a.fits;
                     if (a.fits) return a.step.total < b.step.total;
                     return a.memory.total() < b.memory.total();
                   });
  if (plan.candidates.front().fits) plan.chosen = 0;
  plan.explanation = Explain(plan);
  if (request.checkpoint_seconds && request.mtbf_hours) {
    YoungDaly y;
    y.checkpoint_seconds = *request.checkpoint_seconds;
    y.mtbf_seconds = *request.mtbf_hours * 3600.0;
    y.interval_seconds = DalyInterval(y.checkpoint_seconds, y.mtbf_seconds);
    y.young_seconds = YoungInterval(y.checkpoint_seconds, y.mtbf_seconds);
    plan.young_daly = y;
  }
  return plan;
}

int64_t MatmulParameterCount(const config::ModelConfig& model) {
  int64_t n = model.ActiveParameterCount();
  if (model.family == config::ModelFamily::kGpt2) n -= int64_t{model.max_seq} * model.width;
  if (!model.tied_embeddings) n -= int64_t{model.vocab} * model.width;  // the input table
  return n;
}

double ModelFlopsPerStep(const config::JobSpec& spec) {
  const config::ModelConfig& m = spec.model;
  const double s = spec.training.seq_len;
  const double per_token = 6.0 * MatmulParameterCount(m) +
                           12.0 * m.layers * m.attention_flop_width() * m.AttendedSpan(s);
  return per_token * spec.training.batch * s;
}

double BubbleFraction(int stages, int micro_batches) {
  return static_cast<double>(stages - 1) / (micro_batches + stages - 1);
}

double BubbleFraction(const worker::ScheduleShape& schedule, double forward, double backward,
                      double weight) {
  if (schedule.stages <= 1) return 0;
  const bool split = worker::SplitsBackward(schedule.schedule);
  const double idle = (schedule.stages - 1) * (forward + backward - (split ? weight : 0)) /
                      std::max(1, schedule.virtual_stages);
  const double busy = schedule.micro_batches * (forward + backward + weight);
  return busy + idle > 0 ? idle / (busy + idle) : 0;
}

double YoungInterval(double delta_seconds, double mtbf_seconds) {
  return std::sqrt(2 * delta_seconds * mtbf_seconds);
}

double DalyInterval(double delta_seconds, double mtbf_seconds) {
  if (delta_seconds >= 2 * mtbf_seconds) return mtbf_seconds;
  const double ratio = delta_seconds / (2 * mtbf_seconds);
  return YoungInterval(delta_seconds, mtbf_seconds) * (1 + std::sqrt(ratio) / 3 + ratio / 9) -
         delta_seconds;
}

std::string ScheduleText(const config::ParallelismSpec& mesh) {
  std::string text = config::ScheduleName(mesh.schedule);
  if (mesh.virtual_stages > 1)
    absl::StrAppend(&text, " over ", mesh.virtual_stages, " virtual stages");
  return text;
}

std::string MeshName(const config::ParallelismSpec& m) {
  return absl::StrCat("dp ", m.dp, m.ep > 1 ? absl::StrCat(" (experts over ep ", m.ep, ")") : "",
                      m.cp > 1 ? absl::StrCat(" × cp ", m.cp) : "", " × tp ", m.tp, " × pp ", m.pp,
                      ", ZeRO-", m.zero,
                      m.sequence_parallel && m.tp > 1 ? ", sequence parallel" : "",
                      m.pp > 1 ? absl::StrCat(", ", ScheduleText(m)) : "");
}

}  // namespace trainyard::planner
