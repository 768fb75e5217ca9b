// Pipeline schedules, defined once: for every stage of a pipeline, the passes it runs in one
// optimizer step and the activations and gradients it exchanges with its neighbours between them.
// The executor (worker/parallel/pipeline.h) runs exactly these steps, and the planner's simulation
// (planner/pipeline_schedule.h) times exactly these passes. Part of the shape library
// (worker/shape/): it depends on config/ only.
//
// A pipeline of `stages` ranks holds `stages · virtual_stages` model chunks; chunk c of rank s is
// virtual stage v = c · stages + s (Megatron's round-robin assignment; with one chunk per rank,
// v = s). The forward pass of a micro-batch on virtual stage v needs the output of its forward
// pass on v − 1, and its backward pass the input gradient of its backward pass on v + 1. The
// last virtual stage computes the loss: its forward pass also runs the micro-batch's backward
// (the loss's gradient is known as soon as the loss), and its backward pass only hands the input
// gradient on.
//
// Transfers are planned on a unit clock: every pass takes one tick, and a pass starts as soon as
// its stage has finished the pass before it and what it needs from another stage has arrived. A
// transfer happens at the end of the tick in which its sender's pass ran, on both sides at once:
// every stage exchanges, after each tick, all its transfers of that tick in one batch. Because
// both ends of every transfer meet at the same tick and every stage walks the ticks in order,
// blocking point-to-point operations cannot deadlock, whatever the passes really cost.
//
// Threading: plain values and functions.
#ifndef TRAINYARD_WORKER_SHAPE_SCHEDULE_H_
#define TRAINYARD_WORKER_SHAPE_SCHEDULE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "config/spec.h"

namespace trainyard::worker {

// The schedules (config::PipelineSchedule names them in specs):
//   1F1B (PipeDream-Flush, as Megatron-LM): stage s runs min(p − s − 1, m) warm-up forward
//     passes, then alternates one forward and one backward pass, then drains the backward passes.
//     Idle fraction (p − 1)/(m + p − 1) with uniform stages.
//   Interleaved 1F1B (Megatron-LM, Narayanan et al., SC 2021): each rank holds V model chunks
//     (virtual stages s, s + p, …), and runs the chunks' passes in rounds of p micro-batches:
//     (p − s − 1)·2 + (V − 1)·p warm-up forward passes, then one forward and one backward
//     alternating, then the rest of the backward passes. A chunk pass
//     is 1/V of a stage's, so the fill and drain shrink V-fold: idle fraction (p − 1)/(V·m + p − 1)
//     with uniform chunks, for V times the messages and more activations in flight: stage 0 holds
//     up to (V + 1)·p − 1 chunks' activations, each 1/V of a stage's ((1 + 1/V)·p − 1/V stages'
//     worth, against p under 1F1B). Needs m a multiple of p.
//   ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024): the backward pass split into
//     the input-gradient pass (B, on the critical path) and the weight-gradient pass (W), and
//     stage s defers s of its W passes to the end of the step, where 1F1B leaves it idle. Stage s
//     runs min(p − s − 1, m) forward passes, then s rounds of F B, then rounds of F B W while
//     forward passes remain, then B W, then the deferred W passes. With m ≥ p and every pass one
//     unit, each stage idles p − 1 units of a 3m + p − 1 step: (p − 1)(F + B − W) where 1F1B
//     idles (p − 1)(F + B). Every stage holds at most p micro-batches' activations (1F1B's first
//     stage).
using config::PipelineSchedule;
using config::ScheduleName;

// kBackward: the input gradient and, where the schedule does not split the backward, the weight
// gradients too; kWeight: the weight gradients of a split backward.
enum class PassKind { kForward, kBackward, kWeight };

// Whether `schedule` splits the backward into B and W passes.
bool SplitsBackward(PipelineSchedule schedule);

struct Pass {
  PassKind kind = PassKind::kForward;
  int micro_batch = 0;
  int chunk = 0;  // which of the rank's model chunks
  bool operator==(const Pass&) const = default;
};

std::string PassName(const Pass& pass);  // "F3", "B0", "W2", "F3.1" (micro-batch 3, chunk 1)

struct ScheduleShape {
  PipelineSchedule schedule = PipelineSchedule::kOneForwardOneBackward;
  int stages = 1;         // ≥ 1
  int micro_batches = 1;  // ≥ 1
  // Model chunks per rank: V for interleaved 1F1B, 1 for the others.
  int virtual_stages = 1;
};

// Stage `stage`'s passes in one optimizer step, in the order it runs them.
std::vector<Pass> PassOrder(const ScheduleShape& shape, int stage);

// A pass on a pipeline stage.
struct StagePass {
  int stage = 0;
  Pass pass;
};
// Where the input of `pass` on `stage` comes from: the pass of the same kind and micro-batch on
// the neighbouring virtual stage whose output it is (none for weight passes, the first virtual
// stage's forward passes and the last one's backward passes).
std::optional<StagePass> SourceOf(const ScheduleShape& shape, int stage, const Pass& pass);
// Where its output goes: the pass that takes it as input (none for weight passes, the last
// virtual stage's forward passes and the first one's backward passes).
std::optional<StagePass> ConsumerOf(const ScheduleShape& shape, int stage, const Pass& pass);

// One point-to-point transfer: on the sender, the output of `pass` (an activation after a
// forward pass, an input gradient after a backward pass); on the receiver the same data, the
// input of the receiver's pass of the same kind and micro-batch on the neighbouring virtual
// stage. Tags are unique among a step's transfers of one pair of stages.
struct Transfer {
  bool send = false;
  int peer = 0;   // the other stage
  Pass pass;      // the pass whose output this is (on the sending stage)
  Pass consumer;  // the pass that consumes it (on the receiving stage)
  uint32_t tag = 0;
};

// One tick of a stage: at most one pass (in activation slot `slot`), then the transfers of that
// tick, to be exchanged together. W passes wait for nothing but their own B pass.
struct ScheduleStep {
  bool has_pass = false;
  Pass pass;
  int slot = 0;  // the activation slot the pass's micro-batch and chunk use on this stage
  int64_t tick = 0;
  std::vector<Transfer> transfers;
};

// Every stage's steps on the unit clock (steps[s] for stage s), in order: the stages' pass
// orders, their activation slots, and their transfers. Ticks without a pass or a transfer are
// left out.
std::vector<std::vector<ScheduleStep>> PlanSchedule(const ScheduleShape& shape);

// Whether `pass` completes some of the stage's weight gradients for its micro-batch (what a
// gradient reduction waits for): the last virtual stage's forward passes (they run the loss and
// the backward, or with a split backward the final norm's and the head's gradients), and the
// backward passes of other stages, or with a split backward the weight passes.
bool ComputesWeightGradients(const ScheduleShape& shape, int stage, const Pass& pass);

// Activation slots stage `stage` needs: the most (micro-batch, chunk) pairs whose forward pass has
// run and whose last pass (W with a split backward, else B) has not, at any point of its pass
// order. The stage's chunks share the slots (a slot holds one chunk's activations).
int ActivationSlots(const ScheduleShape& shape, int stage);

}  // namespace trainyard::worker

#endif  // TRAINYARD_WORKER_SHAPE_SCHEDULE_H_
