// TrainState: exactly what a checkpoint holds for one rank, and nothing else.
//
// The parameters and AdamW's two moments live in the rank's ShardedParams (sharded as the mesh
// says); the step counts completed optimizer steps, which is also the learning-rate schedule's
// position and, with the seed, the data's: the batch of step s is a pure function of (seed, s,
// sample index), and initialisation of (seed, tensor name), so (seed, step) is the whole random
// state.
//
// Threading: the training thread's.
#ifndef TRAINYARD_WORKER_TRAIN_STATE_H_
#define TRAINYARD_WORKER_TRAIN_STATE_H_

#include <cstdint>

#include "worker/parallel/sharded_params.h"

namespace trainyard::worker {

struct TrainState {
  parallel::ShardedParams* params = nullptr;  // parameters and optimizer moments
  int64_t step = 0;                           // optimizer steps completed
  uint64_t seed = 0;                          // training.seed
  int global_batch = 0;                       // sequences per step
  int seq_len = 0;
  double last_loss = 0.0;  // the loss of step `step` (reported, not needed to continue)

  int64_t samples_consumed() const { return step * global_batch; }
};

}  // namespace trainyard::worker

#endif  // TRAINYARD_WORKER_TRAIN_STATE_H_
