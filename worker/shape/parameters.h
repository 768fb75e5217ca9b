// The parameter layout of a model: every named tensor, its shape and its place in one flat
// buffer. Parameters, gradients and optimizer moments all share this layout, which is what
// lets the optimizer, gradient clipping and (later) bucketed all-reduce treat them as one span.
#ifndef TRAINYARD_WORKER_SHAPE_PARAMETERS_H_
#define TRAINYARD_WORKER_SHAPE_PARAMETERS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "config/model_config.h"

namespace trainyard::worker {

enum class InitKind { kNormal, kZeros, kOnes };

// How a tensor is split across the ranks of a tensor-parallel group.
enum class ShardKind {
  kReplicated,  // every rank holds all of it (norms, biases added after a reduction, positions)
  kRows,        // each of `row_sections` (global row counts) split evenly; the local tensor is
                // this rank's slice of each section, concatenated (column-parallel weights,
                // vocabulary-parallel embeddings)
  kColumns,     // the last dimension split evenly (row-parallel weights)
};

struct ParamTensor {
  std::string name;            // e.g. "h.3.attn.qkv.w"
  std::vector<int64_t> shape;  // row-major; linear weights are [out, in]
  int64_t offset = 0;          // element offset in the flat buffer
  int64_t numel = 0;
  bool decay = false;  // AdamW weight decay applies (tensors with two or more dims)
  InitKind init = InitKind::kNormal;
  float init_std = 0.02f;  // for kNormal
  ShardKind shard = ShardKind::kReplicated;
  std::vector<int64_t> global_shape;  // the tensor's shape in the unsharded model
  std::vector<int64_t> row_sections;  // kRows only
  // Trained by the optimizer (an MoE router's selection bias is not: a rule moves it).
  bool trainable = true;
  // An MoE layer's routed experts side by side along the first dimension (`experts` > 0 of them
  // in global_shape): this rank holds experts [expert_begin, expert_begin + expert_count)
  // (expert parallelism), before any tensor-parallel split within each expert.
  int experts = 0, expert_begin = 0, expert_count = 0;
};

// Offsets (into the flat buffer) of one transformer block's tensors; -1 where the family has
// no such tensor (Llama has no biases and no norm bias; pre_norms false, no ln1 and ln2). In an MoE
// block (config::MoeConfig) fc_* and mlp_proj_* are the shared experts' MLP (-1 without shared
// experts) and the moe_* offsets its router and routed experts.
struct BlockOffsets {
  int64_t ln1_w = -1, ln1_b = -1, qkv_w = -1, qkv_b = -1, proj_w = -1, proj_b = -1;
  // Latent attention (worker/latent_attention.h), in place of qkv_w: q_a [q_rank, C], its norm
  // [q_rank] and q_b [heads·D, q_rank], or q [heads·D, C]; kv_a [kv_rank + rope_dim, C], its norm
  // [kv_rank] and kv_b [heads·(D − rope_dim + value_dim), kv_rank].
  int64_t q_a_w = -1, q_a_norm_w = -1, q_b_w = -1, q_w = -1, kv_a_w = -1, kv_a_norm_w = -1,
          kv_b_w = -1;
  // qk_norm: the query heads' and key heads' norms [D] (qk_norm_span projection: [heads·D] and
  // [kv_heads·D]).
  int64_t q_norm_w = -1, k_norm_w = -1;
  // post_norms: the norms of the attention's output and of the MLP's [C].
  int64_t attn_post_w = -1, mlp_post_w = -1;
  int64_t ln2_w = -1, ln2_b = -1, fc_w = -1, fc_b = -1, mlp_proj_w = -1, mlp_proj_b = -1;
  int64_t mlp_ffn = 0;  // the (global) hidden size of fc_*/mlp_proj_*; 0 without them
  bool moe = false;
  // router [E, C]; selection bias [E] (balance: bias); experts' fc [E·fc_out, C] (expert e's rows
  // together: Llama's gate rows then up rows) and bias [E·ffn]; proj [E, C, ffn] and bias [E, C].
  int64_t router_w = -1, router_bias = -1;
  int64_t shared_gate_w = -1;  // moe.shared_gate: the shared experts' gate [1, C]
  int64_t experts_fc_w = -1, experts_fc_b = -1, experts_proj_w = -1, experts_proj_b = -1;
};

// A contiguous range [begin, end) of the flat buffer that the model uses as a unit: group 0 holds
// the embeddings, group 1 + l block l, the last group the final norm (and an untied LM head).
// Sharded parameter managers gather, reduce and free memory one group at a time.
struct ParamGroup {
  int64_t begin = 0;
  int64_t end = 0;
  // An MoE block's routed experts: reduced and sharded over the expert-data-parallel group (the
  // data-parallel ranks holding the same experts) instead of the whole data-parallel group.
  bool experts = false;
  int64_t size() const { return end - begin; }
};

// The layers one pipeline stage (or, with an interleaved schedule, one model chunk of a pipeline
// rank) holds. The first stage also holds the embeddings, the last the final norm and the LM head
// (with tied embeddings, a copy of the token embedding whose gradient is summed with the first
// stage's).
struct PipelineStage {
  int first_layer = 0;
  int num_layers = -1;  // -1: every layer from first_layer on
  bool first = true;
  bool last = true;
};

class ParameterLayout {
 public:
  // The layout of tensor-parallel rank `tp_rank` of `tp_size` (1: the whole model). Requires
  // heads, kv_heads, ffn_hidden and vocab divisible by tp_size (the mesh validator checks).
  explicit ParameterLayout(const config::ModelConfig& config, int tp_rank = 0, int tp_size = 1,
                           PipelineStage stage = {});
  // The layout of a pipeline rank that holds several model chunks (an interleaved schedule), in
  // ascending layer order: the embeddings if the first chunk is `first`, every chunk's blocks,
  // then the final norm and head if the last chunk is `last`. Each group is laid out exactly as
  // in the layout of its chunk alone, so a chunk's model can address this buffer group by group.
  // With expert parallelism (ep_size > 1) the rank holds experts [ep_rank, ep_rank + 1) ·
  // experts / ep_size of every MoE layer.
  ParameterLayout(const config::ModelConfig& config, int tp_rank, int tp_size,
                  std::vector<PipelineStage> chunks, int ep_rank = 0, int ep_size = 1);

  const std::vector<ParamTensor>& tensors() const { return tensors_; }
  int64_t total() const { return total_; }
  // Returns nullptr when there is no such tensor.
  const ParamTensor* Find(const std::string& name) const;

  // `layer` is the model's (global) layer index; it must belong to this rank.
  const BlockOffsets& block(int layer) const { return blocks_[block_index_[layer]]; }
  // The rank's chunks (one unless interleaved); stage(): the first, the only one of a layout
  // built from one PipelineStage.
  const std::vector<PipelineStage>& chunks() const { return chunks_; }
  const PipelineStage& stage() const { return chunks_.front(); }
  bool first() const { return chunks_.front().first; }  // holds the embeddings
  bool last() const { return chunks_.back().last; }     // holds the final norm and the head
  int64_t wte() const { return wte_; }
  int64_t wpe() const { return wpe_; }  // -1 for Llama
  int64_t lnf_w() const { return lnf_w_; }
  int64_t lnf_b() const { return lnf_b_; }      // -1 for Llama
  int64_t lm_head() const { return lm_head_; }  // == wte() when embeddings are tied

  const std::vector<ParamGroup>& groups() const { return groups_; }
  // Group 0 is the first the forward pass uses and the last the backward pass finishes: the
  // embeddings on the first stage, else the stage's first block. An MoE block's routed experts
  // are a group of their own, right after the block's (-1 for a dense block).
  static constexpr int kEmbeddingGroup = 0;
  int block_group(int layer) const { return block_groups_[block_index_[layer]]; }
  int expert_group(int layer) const { return expert_groups_[block_index_[layer]]; }
  int final_group() const { return static_cast<int>(groups_.size()) - 1; }  // last stage only
  // The group holding the LM head's weight (the embedding group when tied).
  int head_group() const { return first() && lm_head_ == wte_ ? kEmbeddingGroup : final_group(); }

  int tp_size() const { return tp_size_; }
  int tp_rank() const { return tp_rank_; }
  int ep_size() const { return ep_size_; }
  int ep_rank() const { return ep_rank_; }
  // Copies this rank's part of `t` from the full (unsharded) tensor `global` into `local`.
  void Slice(const ParamTensor& t, const float* global, float* local) const;

  // Fills `host` (total() floats) deterministically from `seed`: each tensor draws from its own
  // counter-based stream keyed by (seed, name), so a value does not depend on which other
  // tensors exist or on how the model is later sharded.
  void Initialize(uint64_t seed, float* host) const;
  // Elements [lo, hi) of what Initialize fills, into out[0, hi − lo): the same values, drawn
  // without the rest (a ZeRO-3 rank's own shard).
  void InitializeRange(uint64_t seed, int64_t lo, int64_t hi, float* out) const;

 private:
  // Local elements [begin, end) of tensor `t`'s normal initialisation into out[0, end − begin).
  void DrawNormal(const ParamTensor& t, uint64_t seed, int64_t begin, int64_t end,
                  float* out) const;
  int64_t Add(const std::string& name, std::vector<int64_t> global_shape, InitKind init,
              float std = 0.02f, ShardKind shard = ShardKind::kReplicated,
              std::vector<int64_t> row_sections = {});

  std::vector<ParamTensor> tensors_;
  void AddBlock(const config::ModelConfig& config, int layer);
  void AddLatent(const config::ModelConfig& config, const std::string& prefix, BlockOffsets& b);
  // An MLP of the family's shape with hidden size `ffn` (× `count` experts side by side when
  // count > 0, as one tensor per kind): fc weight and bias, proj weight and bias offsets.
  struct MlpOffsets {
    int64_t fc_w = -1, fc_b = -1, proj_w = -1, proj_b = -1;
  };
  MlpOffsets AddMlp(const config::ModelConfig& config, const std::string& prefix, int64_t ffn,
                    int count);
  // Narrows the tensor just added to this rank's experts.
  void HoldExperts(int experts);

  std::vector<BlockOffsets> blocks_;
  std::vector<int> block_index_;  // per model layer: its index in blocks_, -1 if not held here
  std::vector<int> block_groups_, expert_groups_;  // per held block
  std::vector<ParamGroup> groups_;
  int tp_rank_ = 0, tp_size_ = 1, ep_rank_ = 0, ep_size_ = 1;
  std::vector<PipelineStage> chunks_;
  int64_t total_ = 0;
  int64_t wte_ = -1, wpe_ = -1, lnf_w_ = -1, lnf_b_ = -1, lm_head_ = -1;
};

// Whether the blocks' linear operations read `t` as a weight matrix or its bias: attention's qkv
// and projection, and the MLP's fc and projection (dense, shared experts, routed experts). These
// are what a backend that converts weights for its GEMMs may keep converted
// (Backend::KeepWeightCopy); not the router (run in fp32), the norms, the embeddings or the LM
// head (held over each loss pass instead).
bool IsBlockLinearParam(const ParamTensor& t);
// Σ elements of a layout's block linear parameters.
int64_t BlockLinearParamElements(const ParameterLayout& layout);

}  // namespace trainyard::worker

#endif  // TRAINYARD_WORKER_SHAPE_PARAMETERS_H_
