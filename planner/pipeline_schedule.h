// One optimizer step of the engine's pipeline schedules, simulated pass by pass for stages that
// share the cores of a node.
//
// Stage s runs the passes of the schedule's one definition (worker/shape/schedule.h: PassOrder,
// which the executor runs too), then its tail (PassSeconds). A forward pass of micro-batch i on
// virtual stage v (chunk c of stage s: worker::VirtualStage) waits for the forward pass of i on v −
// 1, a backward pass for the backward pass of i on v + 1, and each waits a hand-off more after the
// pass it waits for ends (the message and the receiver's wake-up); a weight pass (ZB-H1) waits
// for nothing but the stage's passes before it. The stages' tails start together, once the last
// stage has finished its passes (the engine sums the gradient norm over the pipeline before any
// stage updates), and so share the cores with each other rather than with passes.
// Where the stages time-share cores, a pass runs faster while fewer stages run passes beside it:
// each pass is a fixed amount of work whose rate follows how many stages are running at every
// moment (processor sharing). With one duration per stage whatever runs beside it, the makespan is
// the textbook (m + p − 1)·(F + B) of uniform stages under 1F1B, m(F + B + W) + (p − 1)(F + B −
// W) under ZB-H1 (m ≥ p), and (m + (p − 1)/V)·(F + B) under interleaved 1F1B with V equal chunks
// (m a multiple of p).
//
// Threading: plain values and functions.
#ifndef TRAINYARD_PLANNER_PIPELINE_SCHEDULE_H_
#define TRAINYARD_PLANNER_PIPELINE_SCHEDULE_H_

#include <vector>

#include "worker/shape/schedule.h"

namespace trainyard::planner {

// One micro-batch's passes on one stage, their collectives included, and of those seconds the
// part spent waiting in collectives (the rest computes); `handoff`: from the end of the pass on
// a neighbouring stage that one of this stage's passes waits for to the start of that pass;
// `tail`: the stage's work after every stage's last pass (its optimizer and data-parallel
// reduction), which shares the cores with the other stages' tails.
struct PassSeconds {
  double forward = 0, backward = 0;
  double weight = 0;  // a split backward's weight pass (its backward is then the input part)
  double forward_waiting = 0, backward_waiting = 0;
  double handoff = 0;
  // A pass that hands its output to another stage moves the message's bytes: on a shared node
  // a copy, work that shares the cores like the pass's own (the hand-off is then the wake-up).
  double send = 0;
  double tail = 0, tail_waiting = 0;
  // With several model chunks per stage (interleaved), the part of forward, backward and weight
  // (and of their waiting) that chunk c's pass takes; empty: one chunk, all of it.
  std::vector<double> chunk_share;
};

// Per stage, the step's seconds by what the stage did; computing + communicating + idle equals
// the makespan for every stage (idle: waiting for another stage or a hand-off, or done before the
// last).
struct ScheduleSeconds {
  double makespan = 0;
  std::vector<double> computing, communicating, idle;
};

// `running[k − 1][s]`: stage s's passes while k stages run passes at once (k = 1 … p, p =
// running.size(); every row has p entries); a hand-off costs what it costs at the k of the moment
// the pass it follows ends. `schedule.micro_batches` ≥ 1; with schedule.virtual_stages V > 1
// every entry's chunk_share has V entries. The schedule's stages are running.size()
// (schedule.stages is not read).
ScheduleSeconds SimulateSchedule(const worker::ScheduleShape& schedule,
                                 const std::vector<std::vector<PassSeconds>>& running);

}  // namespace trainyard::planner

#endif  // TRAINYARD_PLANNER_PIPELINE_SCHEDULE_H_
