// Pipeline parallelism: how layers are split into stages, and the 1F1B schedule one stage runs
// over the micro-batches of an optimizer step.
#ifndef TRAINYARD_WORKER_PARALLEL_PIPELINE_H_
#define TRAINYARD_WORKER_PARALLEL_PIPELINE_H_

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "config/model_config.h"
#include "worker/backend.h"
#include "worker/parallel/communicator.h"
#include "worker/parameters.h"

namespace trainyard::worker {

// Splits the model's layers into `stages` contiguous stages (each at least one layer) that
// minimise the most expensive stage, by a cost estimate: each block costs its matmul
// parameters plus its attention work, the last stage also the LM head. Requires
// 1 <= stages <= layers.
std::vector<PipelineStage> BalanceStages(const config::ModelConfig& config, int seq_len,
                                         int stages);

// The per-micro-batch work of one stage, supplied by the training loop.
struct StageWork {
  // Runs the forward (and, on the last stage, the backward) of micro-batch i with its
  // activations in `slot`; `in` is the received input (not on the first stage), `out` the
  // output to send (not on the last).
  std::function<absl::Status(int i, int slot, const Act* in, Act* out)> forward;
  // Runs the backward of micro-batch i from `dout` (not on the last stage) into `din` (not on
  // the first stage).
  std::function<absl::Status(int i, int slot, const Act* dout, Act* din)> backward;
};

struct ScheduleStats {
  double wait_seconds = 0.0;  // time blocked in sends and receives (idle plus transfer)
};

// Runs the 1F1B schedule (PipeDream-Flush, as Megatron-LM): min(p − s − 1, m) warm-up forwards,
// then alternating one forward and one backward, then the remaining backwards. Neighbouring
// stages exchange activations and their gradients (`count` elements of the backend's activation
// type each, in buffers allocated from `backend`) over `pp`, pairing each send with the opposite
// receive so that blocking transfers cannot deadlock.
[[nodiscard]] absl::Status RunOneForwardOneBackward(parallel::Communicator& pp, Backend& backend,
                                                    int micro_batches, int64_t count,
                                                    const StageWork& work, ScheduleStats* stats);

// Micro-batches a stage keeps in flight under 1F1B (activation slots it needs).
int InFlight(int stage, int stages, int micro_batches);

}  // namespace trainyard::worker

#endif  // TRAINYARD_WORKER_PARALLEL_PIPELINE_H_
