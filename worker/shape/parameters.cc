#include "worker/shape/parameters.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/shape/random.h"

namespace trainyard::worker {

using config::ModelConfig;
using config::ModelFamily;

ParameterLayout::ParameterLayout(const ModelConfig& c, int tp_rank, int tp_size,
                                 PipelineStage stage)
    : ParameterLayout(c, tp_rank, tp_size, std::vector<PipelineStage>{stage}) {}

ParameterLayout::ParameterLayout(const ModelConfig& c, int tp_rank, int tp_size,
                                 std::vector<PipelineStage> chunks)
    : block_index_(c.layers, -1), tp_rank_(tp_rank), tp_size_(tp_size), chunks_(std::move(chunks)) {
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
  const int64_t width = c.width, qkv = c.qkv_width(), attn = int64_t{c.heads} * c.head_dim();
  const int64_t q_rows = attn, kv_rows = int64_t{c.kv_heads} * c.head_dim();
  constexpr auto kRows = ShardKind::kRows;
  constexpr auto kCols = ShardKind::kColumns;
  const int64_t ffn = c.ffn_hidden, fc_out = gpt2 ? ffn : 2 * ffn;
  // GPT-2's scheme: projections that write into the residual stream start smaller so that the
  // stream's variance does not grow with depth.
  const float residual_std = 0.02f / std::sqrt(2.0f * c.layers);
  const int64_t group_begin = total_;
  const std::string p = absl::StrCat("h.", layer, ".");
  BlockOffsets b;
  b.ln1_w = Add(p + "ln1.w", {width}, InitKind::kOnes);
  if (gpt2) b.ln1_b = Add(p + "ln1.b", {width}, InitKind::kZeros);
  b.qkv_w = Add(p + "attn.qkv.w", {qkv, width}, InitKind::kNormal, 0.02f, kRows,
                {q_rows, kv_rows, kv_rows});
  if (gpt2) {
    b.qkv_b =
        Add(p + "attn.qkv.b", {qkv}, InitKind::kZeros, 0.02f, kRows, {q_rows, kv_rows, kv_rows});
  }
  b.proj_w = Add(p + "attn.proj.w", {width, attn}, InitKind::kNormal, residual_std, kCols);
  if (gpt2) b.proj_b = Add(p + "attn.proj.b", {width}, InitKind::kZeros);
  b.ln2_w = Add(p + "ln2.w", {width}, InitKind::kOnes);
  if (gpt2) b.ln2_b = Add(p + "ln2.b", {width}, InitKind::kZeros);
  const std::vector<int64_t> fc_sections =
      gpt2 ? std::vector<int64_t>{ffn} : std::vector<int64_t>{ffn, ffn};  // (gate, up)
  b.fc_w = Add(p + "mlp.fc.w", {fc_out, width}, InitKind::kNormal, 0.02f, kRows, fc_sections);
  if (gpt2) b.fc_b = Add(p + "mlp.fc.b", {fc_out}, InitKind::kZeros, 0.02f, kRows, fc_sections);
  b.mlp_proj_w = Add(p + "mlp.proj.w", {width, ffn}, InitKind::kNormal, residual_std, kCols);
  if (gpt2) b.mlp_proj_b = Add(p + "mlp.proj.b", {width}, InitKind::kZeros);
  block_index_[layer] = static_cast<int>(blocks_.size());
  blocks_.push_back(b);
  groups_.push_back({group_begin, total_});
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
  for (const auto& t : tensors_) {
    float* out = host + t.offset;
    switch (t.init) {
      case InitKind::kZeros:
        for (int64_t i = 0; i < t.numel; ++i) out[i] = 0.0f;
        break;
      case InitKind::kOnes:
        for (int64_t i = 0; i < t.numel; ++i) out[i] = 1.0f;
        break;
      case InitKind::kNormal: {
        // Draw the whole (unsharded) tensor, then keep this rank's part: every mesh starts from
        // the same model.
        int64_t global = 1;
        for (int64_t d : t.global_shape) global *= d;
        std::vector<float> full(global);
        NormalStream stream(seed, HashString(t.name));
        for (int64_t i = 0; i < global; ++i) full[i] = t.init_std * stream.Next();
        Slice(t, full.data(), out);
        break;
      }
    }
  }
}

void ParameterLayout::Slice(const ParamTensor& t, const float* global, float* local) const {
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

}  // namespace trainyard::worker
