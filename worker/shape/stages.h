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

// Where the model's virtual stages (its chunks in layer order, `stages` · V of them) sit: chunk
// `chunk` of pipeline rank `stage` is virtual stage chunk · stages + stage (Megatron's
// round-robin placement; with one chunk per rank, the rank's own stage), and back. Every part of
// the engine and the planner that walks the virtual stages goes through these two.
int VirtualStage(int stages, int stage, int chunk);
struct StageChunk {
  int stage = 0;  // the pipeline rank
  int chunk = 0;  // which of its chunks
};
StageChunk StageChunkOf(int stages, int virtual_stage);

// The model chunks pipeline rank `stage` of `stages` holds, in layer order. With one virtual
// stage per rank: its BalanceStages stage. With `virtual_stages` V > 1 (interleaved 1F1B): V
// chunks, virtual stages stage, stage + stages, …, stage + (V − 1)·stages, each of the
// layers / (stages · V) consecutive layers of its virtual stage (Megatron's round-robin
// assignment); the first virtual stage holds the embeddings, the last the final norm and head.
// Requires layers divisible by stages · V when V > 1 (the mesh validator checks).
std::vector<PipelineStage> StageChunks(const config::ModelConfig& config, int seq_len, int stages,
                                       int virtual_stages, int stage);

}  // namespace trainyard::worker

#endif  // TRAINYARD_WORKER_SHAPE_STAGES_H_
