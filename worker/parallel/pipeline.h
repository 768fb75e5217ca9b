// Pipeline parallelism: the executor that runs one stage's share of a schedule
// (worker/shape/schedule.h) over the micro-batches of an optimizer step.
#ifndef TRAINYARD_WORKER_PARALLEL_PIPELINE_H_
#define TRAINYARD_WORKER_PARALLEL_PIPELINE_H_

#include <cstdint>
#include <functional>

#include "absl/status/status.h"
#include "worker/backend.h"
#include "worker/parallel/communicator.h"
#include "worker/shape/schedule.h"

namespace trainyard::worker {

// The work of one stage, supplied by the training loop: runs `pass` with the micro-batch's
// activations in `slot` (of the pass's chunk). A forward pass reads the received activation `in`
// (null on the first virtual stage) and writes the activation to send into `out` (null on the
// last virtual stage, whose forward pass also runs the micro-batch's backward); a backward pass
// reads the received gradient `in` = ∂loss/∂output (null on the last virtual stage) and writes
// ∂loss/∂input into `out` (null on the first virtual stage); a weight pass reads and writes no
// transfer (both null).
struct StageWork {
  std::function<absl::Status(const Pass& pass, int slot, const Act* in, Act* out)> run;
};

struct ScheduleStats {
  double wait_seconds = 0.0;  // time blocked in sends and receives (idle plus transfer)
};

// Runs this stage's steps of PlanSchedule(shape) (worker/shape/schedule.h), stage pp.rank() of
// shape.stages == pp.size(): its passes in order, and the transfers of each tick with the
// neighbouring stages (`count` elements of the backend's activation type each, in buffers
// allocated from `backend`). Where the engine starts transfers (StartsTransfers: Gloo), a tick's
// receives are posted at its end and waited for just before the pass that reads them, and its
// send is started at once and waited for at the end of the step, so a stage never waits for a
// receiver. Elsewhere every tick's transfers are exchanged at its end, neighbour by neighbour in
// one global order, a send and a receive with the same neighbour paired in one SendRecv. INTERNAL
// when the schedule cannot be planned; a transfer's error (DEADLINE_EXCEEDED, ABORTED) as it
// comes.
[[nodiscard]] absl::Status RunSchedule(parallel::Communicator& pp, Backend& backend,
                                       const ScheduleShape& shape, int64_t count,
                                       const StageWork& work, ScheduleStats* stats);

}  // namespace trainyard::worker

#endif  // TRAINYARD_WORKER_PARALLEL_PIPELINE_H_
