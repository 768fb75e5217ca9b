// RankShape: what one rank of a mesh holds and runs, derived from the spec exactly as the engine
// derives it (worker/trainer.cc): its layers from StageChunks (one pipeline stage, or an
// interleaved schedule's model chunks), its parameter groups
// from ParameterLayout (tensor-parallel ranks hold equal shares, so rank 0's stand for all), its
// micro-batch and the micro-batches per step, and its share of each sequence under context
// parallelism (seq_len / cp tokens; every cp rank has as many, so rank 0's stand for all). The
// memory and traffic models read it. Under expert parallelism (parallelism.ep) a rank holds
// experts / ep of each MoE layer's routed experts (ep rank 0's stand for all: every rank holds as
// many), reduced and sharded over the dp / ep ranks holding the same ones.
//
// Threading: plain values and functions.
#ifndef TRAINYARD_PLANNER_RANK_SHAPE_H_
#define TRAINYARD_PLANNER_RANK_SHAPE_H_

#include <cstdint>
#include <vector>

#include "config/mesh.h"
#include "config/spec.h"
#include "worker/shape/parameters.h"
#include "worker/shape/schedule.h"

namespace trainyard::planner {

// How the engine's backend lays out activations on the target device.
struct BackendShape {
  int64_t act_bytes = 4;                        // fp32 (CPU) or bf16 (CUDA)
  int64_t max_logits_chunk = int64_t{1} << 20;  // Backend::max_logits_chunk
  int64_t logits_vocab_multiple = 1;            // Backend::logits_vocab_multiple
};

struct RankShape {
  config::ModelConfig model;
  config::ParallelismSpec mesh;
  int seq_len = 0;      // tokens of each sequence
  int local_seq = 0;    // of them, the tokens this rank holds: seq_len / cp (the head-tail split)
  int stage_index = 0;  // pipeline rank
  // The rank's model chunks, in layer order (one unless the schedule is interleaved), all of
  // chunk_layers() layers.
  std::vector<worker::PipelineStage> chunks;
  int micro = 0;          // sequences per micro-batch
  int micro_batches = 0;  // per optimizer step
  // The job evaluates (training.eval_every > 0): forward-only passes run every block of a chunk
  // through the first activation slot's first saved block.
  bool evaluates = false;
  std::vector<int64_t> group_sizes;  // this stage's parameter groups, in layout order
  // Of them, the groups of an MoE block's routed experts (ParamGroup::experts).
  std::vector<bool> group_is_experts;
  int64_t local_params = 0;  // Σ group_sizes
  // The local weights one token multiplies by in this stage's blocks: attention's two matmuls
  // and the dense MLP's two, or in an MoE block the router's (replicated: whole on every tensor-
  // parallel rank), top_k routed experts' two each and the shared experts' two. Per chunk, and
  // their sum.
  std::vector<int64_t> chunk_matmul_params;
  int64_t matmul_params = 0;
  // Of matmul_params, the weights whose gradients a split backward leaves to its weight pass:
  // all but an MoE block's router and routed experts (the input-gradient pass computes theirs).
  int64_t weight_pass_params = 0;
  int64_t head_params = 0;  // the local LM head (last stage), 0 elsewhere
  // Every block matmul weight and bias the rank holds (worker::IsBlockLinearParam: all its routed
  // experts, not top_k), which a converting backend keeps converted.
  int64_t block_linear_params = 0;
  int64_t tied_copy = 0;  // elements of the token embedding summed with the other end of the
                          // pipeline each step (first and last stage, tied, pp > 1), else 0
  // The ranks that hold the same parameters, sum their gradients and split ZeRO's shards: the
  // data- and context-parallel ranks together (the engine's dp group, worker/parallel/
  // parallel_dims.h), dp · cp.
  int data_ranks() const { return mesh.dp * mesh.cp; }
  // Under expert parallelism the routed experts' groups are reduced and sharded over the
  // expert-data-parallel group instead (the engine's edp: the dp / ep data-parallel ranks holding
  // the same experts, with their context-parallel ranks, (dp / ep) · cp).
  bool expert_data_group(size_t g) const { return mesh.ep > 1 && group_is_experts[g]; }
  int expert_data_ranks() const { return mesh.dp / mesh.ep * mesh.cp; }
  // Rank `data_rank` of the data-parallel group (dp_rank · cp + cp_rank) in the edp group
  // (dp_rank / ep · cp + cp_rank).
  int expert_data_rank(int data_rank) const {
    return data_rank / mesh.cp / mesh.ep * mesh.cp + data_rank % mesh.cp;
  }
  // The ranks group g is reduced and sharded over.
  int group_ranks(size_t g) const {
    return expert_data_group(g) ? expert_data_ranks() : data_ranks();
  }
  // The elements ZeRO gives each of them of group g: ⌈size / group_ranks(g)⌉.
  int64_t chunk(size_t g) const { return (group_sizes[g] + group_ranks(g) - 1) / group_ranks(g); }
  int64_t padded(size_t g) const { return chunk(g) * group_ranks(g); }
  // Rows of one micro-batch's activations on this rank (before sequence parallelism's split):
  // its tokens of every sequence of the micro-batch.
  int64_t rows() const { return int64_t{micro} * local_seq; }
  // The pipeline runs a split backward (ZB-H1's input-gradient and weight passes).
  bool split_backward() const { return mesh.pp > 1 && worker::SplitsBackward(mesh.schedule); }
  bool first() const { return chunks.front().first; }  // holds the embeddings
  bool last() const { return chunks.back().last; }     // holds the final norm and the head
  int chunk_layers() const { return chunks.front().num_layers; }
  int layers() const { return chunk_layers() * static_cast<int>(chunks.size()); }
  // The parameter group of model layer `layer` (ParameterLayout's order: the embeddings, every
  // chunk's blocks, each MoE block followed by a group of its routed experts, the final norm),
  // and an MoE block's experts' group (-1 for a dense block); `layer` must be the rank's.
  int block_group(int layer) const { return layer_groups[layer]; }
  int expert_group(int layer) const { return expert_groups[layer]; }
  std::vector<int> layer_groups, expert_groups;  // by model layer; -1 where not held
  bool tied_head_in_embedding_group() const { return model.tied_embeddings && first() && last(); }
  // The global hidden size of block `layer`'s dense MLP, or of an MoE block's shared experts (0
  // without them), as ParameterLayout gives it (BlockOffsets::mlp_ffn).
  int64_t mlp_hidden(int layer) const {
    if (!model.moe.IsMoeLayer(layer)) return model.ffn_hidden;
    return int64_t{model.moe.shared_experts} * model.moe.ffn;
  }
  // Σ over the rank's blocks of PaLM's attention span (ModelConfig::AttendedSpan), the blocks
  // of chunk `only` when it is given.
  double attended_span(int only = -1) const {
    double sum = 0;
    for (size_t c = 0; c < chunks.size(); ++c) {
      if (only >= 0 && static_cast<int>(c) != only) continue;
      for (int l = chunks[c].first_layer; l < chunks[c].first_layer + chunks[c].num_layers; ++l) {
        sum += model.AttendedSpan(static_cast<double>(seq_len), l);
      }
    }
    return sum;
  }
  // The MoE blocks among the rank's layers (every chunk's).
  int moe_blocks() const {
    int count = 0;
    for (const worker::PipelineStage& chunk : chunks) {
      for (int l = chunk.first_layer; l < chunk.first_layer + chunk.num_layers; ++l) {
        count += model.moe.IsMoeLayer(l) ? 1 : 0;
      }
    }
    return count;
  }
  // The schedule the rank's pipeline runs.
  worker::ScheduleShape schedule() const {
    return {.schedule = mesh.schedule,
            .stages = mesh.pp,
            .micro_batches = micro_batches,
            .virtual_stages = mesh.virtual_stages};
  }
};

// The shape of pipeline stage `stage_index` of `mesh` for `spec` (whose own parallelism is
// ignored). `mesh` must satisfy config::FindShardingProblem.
RankShape ShapeOf(const config::JobSpec& spec, const config::ParallelismSpec& mesh,
                  int stage_index);

// The index of the rank at `at` in its data-parallel group, which holds the data- and
// context-parallel ranks of its stage and tensor-parallel slice: dp_rank · cp + cp_rank, as the
// engine numbers it (worker/parallel/parallel_dims.cc).
inline int DataGroupRank(const config::ParallelismSpec& mesh, const config::MeshCoordinates& at) {
  return at.dp * mesh.cp + at.cp;
}

}  // namespace trainyard::planner

#endif  // TRAINYARD_PLANNER_RANK_SHAPE_H_
