#include "worker/parameters.h"

#include <cmath>
#include <numbers>

#include "absl/strings/str_cat.h"
#include "worker/random.h"

namespace trainyard::worker {

using config::ModelConfig;
using config::ModelFamily;

ParameterLayout::ParameterLayout(const ModelConfig& c) {
  const bool gpt2 = c.family == ModelFamily::kGpt2;
  const int64_t width = c.width, qkv = c.qkv_width(), attn = int64_t{c.heads} * c.head_dim();
  const int64_t ffn = c.ffn_hidden, fc_out = gpt2 ? ffn : 2 * ffn;
  // GPT-2's scheme: projections that write into the residual stream start smaller so that the
  // stream's variance does not grow with depth.
  const float residual_std = 0.02f / std::sqrt(2.0f * c.layers);

  wte_ = Add("wte", {c.vocab, width}, InitKind::kNormal);
  if (gpt2) wpe_ = Add("wpe", {c.max_seq, width}, InitKind::kNormal);
  groups_.push_back({0, total_});  // embeddings
  int64_t group_begin = total_;
  for (int l = 0; l < c.layers; ++l) {
    const std::string p = absl::StrCat("h.", l, ".");
    BlockOffsets b;
    b.ln1_w = Add(p + "ln1.w", {width}, InitKind::kOnes);
    if (gpt2) b.ln1_b = Add(p + "ln1.b", {width}, InitKind::kZeros);
    b.qkv_w = Add(p + "attn.qkv.w", {qkv, width}, InitKind::kNormal);
    if (gpt2) b.qkv_b = Add(p + "attn.qkv.b", {qkv}, InitKind::kZeros);
    b.proj_w = Add(p + "attn.proj.w", {width, attn}, InitKind::kNormal, residual_std);
    if (gpt2) b.proj_b = Add(p + "attn.proj.b", {width}, InitKind::kZeros);
    b.ln2_w = Add(p + "ln2.w", {width}, InitKind::kOnes);
    if (gpt2) b.ln2_b = Add(p + "ln2.b", {width}, InitKind::kZeros);
    b.fc_w = Add(p + "mlp.fc.w", {fc_out, width}, InitKind::kNormal);
    if (gpt2) b.fc_b = Add(p + "mlp.fc.b", {fc_out}, InitKind::kZeros);
    b.mlp_proj_w = Add(p + "mlp.proj.w", {width, ffn}, InitKind::kNormal, residual_std);
    if (gpt2) b.mlp_proj_b = Add(p + "mlp.proj.b", {width}, InitKind::kZeros);
    blocks_.push_back(b);
    groups_.push_back({group_begin, total_});
    group_begin = total_;
  }
  lnf_w_ = Add("lnf.w", {width}, InitKind::kOnes);
  if (gpt2) lnf_b_ = Add("lnf.b", {width}, InitKind::kZeros);
  lm_head_ = c.tied_embeddings ? wte_ : Add("lm_head.w", {c.vocab, width}, InitKind::kNormal);
  groups_.push_back({group_begin, total_});  // final norm (and the untied head)
}

int64_t ParameterLayout::Add(const std::string& name, std::vector<int64_t> shape, InitKind init,
                             float std) {
  ParamTensor t;
  t.name = name;
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
        NormalStream stream(seed, HashString(t.name));
        for (int64_t i = 0; i < t.numel; ++i) out[i] = t.init_std * stream.Next();
        break;
      }
    }
  }
}

}  // namespace trainyard::worker
