#include "planner/rank_shape.h"

#include <string>

#include "config/mesh.h"
#include "worker/shape/stages.h"

namespace trainyard::planner {

RankShape ShapeOf(const config::JobSpec& spec, const config::ParallelismSpec& mesh,
                  int stage_index) {
  RankShape s;
  s.model = spec.model;
  s.mesh = mesh;
  s.seq_len = spec.training.seq_len;
  s.local_seq = spec.training.seq_len / mesh.cp;
  s.stage_index = stage_index;
  s.chunks = worker::StageChunks(spec.model, spec.training.seq_len, mesh.pp, mesh.virtual_stages,
                                 stage_index);
  s.micro = config::MicroBatchPerRank(spec.training, mesh);
  s.micro_batches = spec.training.batch / mesh.dp / s.micro;
  const worker::ParameterLayout layout(spec.model, /*tp_rank=*/0, mesh.tp, s.chunks);
  for (const worker::ParamGroup& g : layout.groups()) s.group_sizes.push_back(g.size());
  s.local_params = layout.total();
  for (const worker::PipelineStage& chunk : s.chunks) {
    for (int l = chunk.first_layer; l < chunk.first_layer + chunk.num_layers; ++l) {
      const std::string prefix = "h." + std::to_string(l) + ".";
      for (const char* name : {"attn.qkv.w", "attn.proj.w", "mlp.fc.w", "mlp.proj.w"}) {
        s.matmul_params += layout.Find(prefix + name)->numel;
      }
    }
  }
  if (s.last()) {
    const worker::ParamTensor* head = layout.Find(spec.model.tied_embeddings ? "wte" : "lm_head.w");
    s.head_params = head != nullptr ? head->numel : 0;
  }
  if (mesh.pp > 1 && spec.model.tied_embeddings && (s.first() || s.last())) {
    s.tied_copy = layout.Find("wte")->numel;
  }
  return s;
}

}  // namespace trainyard::planner
