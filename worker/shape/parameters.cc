#include "worker/shape/parameters.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/shape/random.h"
#include "worker/shape/tensor_slices.h"

namespace trainyard::worker {

using config::ModelConfig;
using config::ModelFamily;

ParameterLayout::ParameterLayout(const ModelConfig& c, int tp_rank, int tp_size,
                                 PipelineStage stage)
    : ParameterLayout(c, tp_rank, tp_size, std::vector<PipelineStage>{stage}) {}

ParameterLayout::ParameterLayout(const ModelConfig& c, int tp_rank, int tp_size,
                                 std::vector<PipelineStage> chunks, int ep_rank, int ep_size)
    : block_index_(c.layers, -1),
      tp_rank_(tp_rank),
      tp_size_(tp_size),
      ep_rank_(ep_rank),
      ep_size_(ep_size),
      chunks_(std::move(chunks)) {
  for (PipelineStage& chunk : chunks_) {
    if (chunk.num_layers < 0) chunk.num_layers = c.layers - chunk.first_layer;
  }
  const bool gpt2 = c.family == ModelFamily::kGpt2;
  const int64_t width = c.width;
  if (first()) {
    wte_ = Add("wte", {c.vocab, width}, InitKind::kNormal, 0.02f, ShardKind::kRows, {c.vocab});
    if (gpt2) wpe_ = Add("wpe", {c.max_seq, width}, InitKind::kNormal);
    groups_.push_back({0, total_});  // embeddings
  }
  for (const PipelineStage& chunk : chunks_) {
    for (int l = chunk.first_layer; l < chunk.first_layer + chunk.num_layers; ++l) AddBlock(c, l);
  }
  if (last()) {
    const int64_t group_begin = total_;
    lnf_w_ = Add("lnf.w", {width}, InitKind::kOnes);
    if (gpt2) lnf_b_ = Add("lnf.b", {width}, InitKind::kZeros);
    if (!c.tied_embeddings) {
      lm_head_ =
          Add("lm_head.w", {c.vocab, width}, InitKind::kNormal, 0.02f, ShardKind::kRows, {c.vocab});
    } else if (first()) {
      lm_head_ = wte_;
    } else {
      // The tied head on a last stage that is not also the first: its own copy of the token
      // embedding, drawn from the same stream, kept equal by summing the two copies' gradients.
      lm_head_ =
          Add("wte", {c.vocab, width}, InitKind::kNormal, 0.02f, ShardKind::kRows, {c.vocab});
    }
    groups_.push_back({group_begin, total_});  // final norm (and the head)
  }
}

// Block `layer`'s tensors, as one group. Replicated tensors (norms, biases added after a
// reduction) are every tensor-parallel rank's whole.
void ParameterLayout::AddBlock(const ModelConfig& c, int layer) {
  const bool gpt2 = c.family == ModelFamily::kGpt2;
  const int64_t width = c.width, qkv = c.qkv_width(), attn = c.attention_width();
  const int64_t q_rows = int64_t{c.heads} * c.head_dim(),
                kv_rows = int64_t{c.kv_heads} * c.head_dim();
  constexpr auto kRows = ShardKind::kRows;
  constexpr auto kCols = ShardKind::kColumns;
  // GPT-2's scheme: projections that write into the residual stream start smaller so that the
  // stream's variance does not grow with depth.
  const float residual_std = 0.02f / std::sqrt(2.0f * c.layers);
  const int64_t group_begin = total_;
  const std::string p = absl::StrCat("h.", layer, ".");
  BlockOffsets b;
  int expert_group = -1;
  if (c.pre_norms) b.ln1_w = Add(p + "ln1.w", {width}, InitKind::kOnes);
  if (gpt2) b.ln1_b = Add(p + "ln1.b", {width}, InitKind::kZeros);
  if (c.latent.enabled()) {
    AddLatent(c, p, b);
  } else {
    b.qkv_w = Add(p + "attn.qkv.w", {qkv, width}, InitKind::kNormal, 0.02f, kRows,
                  {q_rows, kv_rows, kv_rows});
  }
  if (gpt2 || c.qkv_bias) {
    b.qkv_b =
        Add(p + "attn.qkv.b", {qkv}, InitKind::kZeros, 0.02f, kRows, {q_rows, kv_rows, kv_rows});
  }
  // Every tensor-parallel rank's whole: its heads' norms share them, and a norm over the whole
  // projection uses its heads' columns of them (worker/head_norm.h).
  if (c.qk_norm) {
    b.q_norm_w = Add(p + "attn.q_norm.w", {c.q_norm_width()}, InitKind::kOnes);
    b.k_norm_w = Add(p + "attn.k_norm.w", {c.k_norm_width()}, InitKind::kOnes);
  }
  b.proj_w = Add(p + "attn.proj.w", {width, attn}, InitKind::kNormal, residual_std, kCols);
  if (gpt2) b.proj_b = Add(p + "attn.proj.b", {width}, InitKind::kZeros);
  // post_norms: the norms of the attention's and the MLP's outputs, every rank's whole.
  if (c.post_norms) b.attn_post_w = Add(p + "attn.post_norm.w", {width}, InitKind::kOnes);
  if (c.pre_norms) b.ln2_w = Add(p + "ln2.w", {width}, InitKind::kOnes);
  if (gpt2) b.ln2_b = Add(p + "ln2.b", {width}, InitKind::kZeros);
  if (c.post_norms) b.mlp_post_w = Add(p + "mlp.post_norm.w", {width}, InitKind::kOnes);
  if (!c.moe.IsMoeLayer(layer)) {
    const MlpOffsets mlp = AddMlp(c, p + "mlp.", c.ffn_hidden, 0);
    std::tie(b.fc_w, b.fc_b, b.mlp_proj_w, b.mlp_proj_b) =
        std::tuple(mlp.fc_w, mlp.fc_b, mlp.proj_w, mlp.proj_b);
    b.mlp_ffn = c.ffn_hidden;
  } else {
    // The router and the shared experts in the block's group; the routed experts in a group of
    // their own.
    const config::MoeConfig& moe = c.moe;
    b.moe = true;
    b.router_w = Add(p + "moe.router.w", {moe.experts, width}, InitKind::kNormal);
    if (moe.has_bias()) {
      b.router_bias = Add(p + "moe.router.bias", {moe.experts}, InitKind::kZeros);
      tensors_.back().trainable = false;
    }
    if (moe.shared_experts > 0) {
      b.mlp_ffn = int64_t{moe.shared_experts} * moe.ffn;
      const MlpOffsets shared = AddMlp(c, p + "moe.shared.", b.mlp_ffn, 0);
      std::tie(b.fc_w, b.fc_b, b.mlp_proj_w, b.mlp_proj_b) =
          std::tuple(shared.fc_w, shared.fc_b, shared.proj_w, shared.proj_b);
    }
    // Every tensor-parallel rank's whole, as the router is.
    if (moe.shared_gate)
      b.shared_gate_w = Add(p + "moe.shared_gate.w", {1, width}, InitKind::kNormal);
    groups_.push_back({group_begin, total_});
    const int64_t experts_begin = total_;
    const MlpOffsets experts = AddMlp(c, p + "moe.experts.", moe.ffn, moe.experts);
    std::tie(b.experts_fc_w, b.experts_fc_b, b.experts_proj_w, b.experts_proj_b) =
        std::tuple(experts.fc_w, experts.fc_b, experts.proj_w, experts.proj_b);
    expert_group = static_cast<int>(groups_.size());
    groups_.push_back({experts_begin, total_, /*experts=*/true});
  }
  block_index_[layer] = static_cast<int>(blocks_.size());
  blocks_.push_back(b);
  if (expert_group < 0) {
    block_groups_.push_back(static_cast<int>(groups_.size()));
    groups_.push_back({group_begin, total_});
  } else {
    block_groups_.push_back(expert_group - 1);
  }
  expert_groups_.push_back(expert_group);
}

// Latent attention's projections: the ranks' and their norms' every rank's whole, q_b (or q)
// and kv_b split by heads.
void ParameterLayout::AddLatent(const ModelConfig& c, const std::string& p, BlockOffsets& b) {
  const config::LatentAttention& l = c.latent;
  const int64_t width = c.width, heads = c.heads, d = c.head_dim();
  constexpr auto kRows = ShardKind::kRows;
  if (l.q_rank > 0) {
    b.q_a_w = Add(p + "attn.q_a.w", {l.q_rank, width}, InitKind::kNormal);
    b.q_a_norm_w = Add(p + "attn.q_a_norm.w", {l.q_rank}, InitKind::kOnes);
    b.q_b_w =
        Add(p + "attn.q_b.w", {heads * d, l.q_rank}, InitKind::kNormal, 0.02f, kRows, {heads * d});
  } else {
    b.q_w = Add(p + "attn.q.w", {heads * d, width}, InitKind::kNormal, 0.02f, kRows, {heads * d});
  }
  b.kv_a_w = Add(p + "attn.kv_a.w", {l.kv_rank + c.rope_dim, width}, InitKind::kNormal);
  b.kv_a_norm_w = Add(p + "attn.kv_a_norm.w", {l.kv_rank}, InitKind::kOnes);
  const int64_t kv_rows = heads * (d - c.rope_dim + l.value_dim);
  b.kv_b_w =
      Add(p + "attn.kv_b.w", {kv_rows, l.kv_rank}, InitKind::kNormal, 0.02f, kRows, {kv_rows});
}

// fc [count·fc_out, C] split by rows per expert and section (Llama's gate and up), proj
// [count, C, ffn] split by columns; GPT-2's biases (proj's added after the tensor-parallel sum,
// so replicated). count 0: one MLP without the leading expert dimension.
ParameterLayout::MlpOffsets ParameterLayout::AddMlp(const ModelConfig& c, const std::string& p,
                                                    int64_t ffn, int count) {
  const bool gpt2 = c.family == ModelFamily::kGpt2;
  const int64_t width = c.width, experts = std::max(count, 1);
  const int64_t fc_out = gpt2 ? ffn : 2 * ffn;
  const float residual_std = 0.02f / std::sqrt(2.0f * c.layers);
  std::vector<int64_t> fc_sections;
  for (int64_t e = 0; e < experts; ++e) {
    fc_sections.push_back(ffn);
    if (!gpt2) fc_sections.push_back(ffn);  // (gate, up)
  }
  std::vector<int64_t> fc_bias_sections(experts, ffn);
  const std::vector<int64_t> proj_shape =
      count > 0 ? std::vector<int64_t>{count, width, ffn} : std::vector<int64_t>{width, ffn};
  std::vector<int64_t> proj_bias_shape =
      count > 0 ? std::vector<int64_t>{count, width} : std::vector<int64_t>{width};
  MlpOffsets o;
  o.fc_w = Add(p + "fc.w", {experts * fc_out, width}, InitKind::kNormal, 0.02f, ShardKind::kRows,
               fc_sections);
  HoldExperts(count);
  if (gpt2) {
    o.fc_b = Add(p + "fc.b", {experts * ffn}, InitKind::kZeros, 0.02f, ShardKind::kRows,
                 fc_bias_sections);
    HoldExperts(count);
  }
  o.proj_w = Add(p + "proj.w", proj_shape, InitKind::kNormal, residual_std, ShardKind::kColumns);
  HoldExperts(count);
  if (gpt2) {
    o.proj_b = Add(p + "proj.b", proj_bias_shape, InitKind::kZeros);
    tensors_.back().decay = false;  // a bias, even as [experts, C]
    HoldExperts(count);
  }
  return o;
}

void ParameterLayout::HoldExperts(int experts) {
  if (experts == 0) return;
  ParamTensor& t = tensors_.back();
  t.experts = experts;
  t.expert_count = experts / ep_size_;
  t.expert_begin = ep_rank_ * t.expert_count;
  total_ -= t.numel;
  t.shape[0] = t.shape[0] / experts * t.expert_count;
  t.numel = 1;
  for (int64_t d : t.shape) t.numel *= d;
  total_ += t.numel;
}

int64_t ParameterLayout::Add(const std::string& name, std::vector<int64_t> global_shape,
                             InitKind init, float std, ShardKind shard,
                             std::vector<int64_t> row_sections) {
  ParamTensor t;
  t.name = name;
  t.global_shape = global_shape;
  t.shard = tp_size_ > 1 ? shard : ShardKind::kReplicated;
  t.row_sections = std::move(row_sections);
  std::vector<int64_t> shape = std::move(global_shape);
  if (t.shard == ShardKind::kRows) shape[0] /= tp_size_;
  if (t.shard == ShardKind::kColumns) shape.back() /= tp_size_;
  t.numel = 1;
  for (int64_t d : shape) t.numel *= d;
  t.decay = shape.size() >= 2;
  t.shape = std::move(shape);
  t.offset = total_;
  t.init = init;
  t.init_std = std;
  total_ += t.numel;
  tensors_.push_back(std::move(t));
  return tensors_.back().offset;
}

const ParamTensor* ParameterLayout::Find(const std::string& name) const {
  for (const auto& t : tensors_) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

void ParameterLayout::Initialize(uint64_t seed, float* host) const {
  InitializeRange(seed, 0, total_, host);
}

void ParameterLayout::InitializeRange(uint64_t seed, int64_t lo, int64_t hi, float* out) const {
  for (const auto& t : tensors_) {
    // The tensor's elements [begin, end) that fall in [lo, hi).
    const int64_t begin = std::max<int64_t>(0, lo - t.offset);
    const int64_t end = std::min<int64_t>(t.numel, hi - t.offset);
    if (begin >= end) continue;
    float* at = out + (t.offset + begin - lo);
    switch (t.init) {
      case InitKind::kZeros:
        std::fill(at, at + (end - begin), 0.0f);
        break;
      case InitKind::kOnes:
        std::fill(at, at + (end - begin), 1.0f);
        break;
      case InitKind::kNormal:
        DrawNormal(t, seed, begin, end, at);
        break;
    }
  }
}

void ParameterLayout::DrawNormal(const ParamTensor& t, uint64_t seed, int64_t begin, int64_t end,
                                 float* out) const {
  // Value i of the tensor's stream is element i of the whole (unsharded) tensor: every mesh starts
  // from the same model. A rank draws only the elements it holds, run by run of the global
  // tensor, in blocks spread over its threads (each block a pure function of its range, so the
  // values do not depend on the number of threads).
  struct Block {
    int64_t global, local, count;
  };
  constexpr int64_t kBlock = int64_t{1} << 16;
  std::vector<Block> blocks;
  ForEachLocalRun(t, tp_rank_, tp_size_, [&](int64_t global, int64_t local, int64_t count) {
    // The part of this run within the wanted local elements [begin, end).
    const int64_t from = std::max(local, begin), to = std::min(local + count, end);
    for (int64_t b = from; b < to; b += kBlock) {
      blocks.push_back({global + (b - local), b - begin, std::min(kBlock, to - b)});
    }
  });
  const uint64_t key = HashString(t.name);
  const int64_t n = static_cast<int64_t>(blocks.size());
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const Block& b = blocks[i];
    FillNormal(seed, key, t.init_std, b.global, b.global + b.count, out + b.local);
  }
}

void ParameterLayout::Slice(const ParamTensor& t, const float* global, float* local) const {
  if (t.experts > 0 && t.expert_count < t.experts) {
    // This rank's experts, contiguous in the global tensor, then as a tensor of their own.
    ParamTensor held = t;
    int64_t numel = 1;
    for (int64_t d : t.global_shape) numel *= d;
    held.global_shape[0] = t.global_shape[0] / t.experts * t.expert_count;
    held.row_sections.resize(t.row_sections.size() / t.experts * t.expert_count);
    held.experts = 0;
    Slice(held, global + numel / t.experts * t.expert_begin, local);
    return;
  }
  switch (t.shard) {
    case ShardKind::kReplicated:
      std::copy(global, global + t.numel, local);
      return;
    case ShardKind::kRows: {
      const int64_t row = t.global_shape.size() > 1 ? t.global_shape[1] : 1;
      int64_t section_begin = 0;
      for (int64_t rows : t.row_sections) {
        const int64_t mine = rows / tp_size_;
        const float* from = global + (section_begin + tp_rank_ * mine) * row;
        local = std::copy(from, from + mine * row, local);
        section_begin += rows;
      }
      return;
    }
    case ShardKind::kColumns: {
      const int64_t cols = t.global_shape.back(), mine = cols / tp_size_;
      const int64_t rows = t.numel / mine;
      for (int64_t r = 0; r < rows; ++r) {
        const float* from = global + r * cols + tp_rank_ * mine;
        std::copy(from, from + mine, local + r * mine);
      }
      return;
    }
  }
}

bool IsBlockLinearParam(const ParamTensor& t) {
  if (!t.name.starts_with("h.")) return false;
  for (const char* suffix :
       {".attn.qkv.w", ".attn.proj.w", ".fc.w", ".proj.w", ".attn.qkv.b", ".attn.proj.b", ".fc.b",
        ".proj.b", ".attn.q_a.w", ".attn.q_b.w", ".attn.q.w", ".attn.kv_a.w", ".attn.kv_b.w"}) {
    if (t.name.ends_with(suffix)) return true;
  }
  return false;
}

int64_t BlockLinearParamElements(const ParameterLayout& layout) {
  int64_t total = 0;
  for (const ParamTensor& t : layout.tensors()) {
    if (IsBlockLinearParam(t)) total += t.numel;
  }
  return total;
}

}  // namespace trainyard::worker
