// How a model's layers are split into pipeline stages. Part of the shape library
// (worker/shape/): the engine builds its stages with it, and the planner predicts them with the
// same code.
//
// Threading: plain functions.
#ifndef TRAINYARD_WORKER_SHAPE_STAGES_H_
#define TRAINYARD_WORKER_SHAPE_STAGES_H_

#include <vector>

#include "config/model_config.h"
#include "worker/shape/parameters.h"

namespace trainyard::worker {

// Splits the model's layers into `stages` contiguous stages (each at least one layer) that
// minimise the most expensive stage, by a cost estimate: each block costs its matmul
// parameters plus its attention work, the last stage also the LM head. Requires
// 1 <= stages <= layers.
std::vector<PipelineStage> BalanceStages(const config::ModelConfig& config, int seq_len,
                                         int stages);

}  // namespace trainyard::worker

#endif  // TRAINYARD_WORKER_SHAPE_STAGES_H_
