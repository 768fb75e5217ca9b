#include "planner/rank_shape.h"

#include <string>
#include <unordered_map>

#include "config/mesh.h"
#include "worker/shape/stages.h"

namespace trainyard::planner {
namespace {

// Elements of each of a layout's tensors, by name (0 for a tensor it does not hold).
class TensorSizes {
 public:
  explicit TensorSizes(const worker::ParameterLayout& layout) {
    for (const worker::ParamTensor& t : layout.tensors()) {
      numel_.emplace(t.name, t.numel);
      if (t.expert_count > 0) per_expert_.emplace(t.name, t.numel / t.expert_count);
    }
  }
  int64_t operator()(const std::string& name) const { return Get(numel_, name); }
  // Of a tensor of routed experts side by side, one expert's elements.
  int64_t PerExpert(const std::string& name) const { return Get(per_expert_, name); }

 private:
  static int64_t Get(const std::unordered_map<std::string, int64_t>& map, const std::string& name) {
    auto it = map.find(name);
    return it != map.end() ? it->second : 0;
  }
  std::unordered_map<std::string, int64_t> numel_, per_expert_;
};

// Block `layer`'s local matmul weights one token uses (active), and of them those a split
// backward defers to its weight pass (Model::BlockWeightGradients: attention's, and the dense or
// shared MLP's; an MoE block's router and routed experts, and latent attention's projections, get
// their gradients in the input pass).
struct BlockMatmuls {
  int64_t active = 0, deferred = 0;
};

BlockMatmuls BlockMatmulsOf(const TensorSizes& numel, const config::ModelConfig& model, int layer) {
  const std::string p = "h." + std::to_string(layer) + ".";
  BlockMatmuls b;
  b.deferred = numel(p + "attn.qkv.w") + numel(p + "attn.proj.w");
  int64_t latent = 0;
  for (const char* name : {"attn.q_a.w", "attn.q_b.w", "attn.q.w", "attn.kv_a.w", "attn.kv_b.w"}) {
    latent += numel(p + name);
  }
  if (!model.moe.IsMoeLayer(layer)) {
    b.deferred += numel(p + "mlp.fc.w") + numel(p + "mlp.proj.w");
    b.active = b.deferred + latent;
    return b;
  }
  b.deferred += numel(p + "moe.shared.fc.w") + numel(p + "moe.shared.proj.w");
  // The routed experts' tensors hold the rank's experts side by side; a token runs top_k.
  const int64_t expert =
      numel.PerExpert(p + "moe.experts.fc.w") + numel.PerExpert(p + "moe.experts.proj.w");
  b.active = b.deferred + latent + numel(p + "moe.router.w") + model.moe.top_k * expert;
  return b;
}

}  // namespace

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
  s.evaluates = spec.training.eval_every > 0;
  const worker::ParameterLayout layout(spec.model, /*tp_rank=*/0, mesh.tp, s.chunks,
                                       /*ep_rank=*/0, mesh.ep);
  for (const worker::ParamGroup& g : layout.groups()) {
    s.group_sizes.push_back(g.size());
    s.group_is_experts.push_back(g.experts);
  }
  s.local_params = layout.total();
  s.block_linear_params = worker::BlockLinearParamElements(layout);
  s.layer_groups.assign(spec.model.layers, -1);
  s.expert_groups.assign(spec.model.layers, -1);
  for (const worker::PipelineStage& chunk : s.chunks) {
    for (int l = chunk.first_layer; l < chunk.first_layer + chunk.num_layers; ++l) {
      s.layer_groups[l] = layout.block_group(l);
      s.expert_groups[l] = layout.expert_group(l);
    }
  }
  const TensorSizes numel(layout);
  for (const worker::PipelineStage& chunk : s.chunks) {
    int64_t chunk_params = 0;
    for (int l = chunk.first_layer; l < chunk.first_layer + chunk.num_layers; ++l) {
      const BlockMatmuls block = BlockMatmulsOf(numel, spec.model, l);
      chunk_params += block.active;
      s.weight_pass_params += block.deferred;
    }
    s.chunk_matmul_params.push_back(chunk_params);
    s.matmul_params += chunk_params;
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
