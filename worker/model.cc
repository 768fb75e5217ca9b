#include "worker/model.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace trainyard::worker {

using config::ModelFamily;

namespace {
// Upper bound on the logits held at once by the chunked cross-entropy (floats): 4 MiB.
constexpr int64_t kMaxLogitsChunk = int64_t{1} << 20;
}  // namespace

// Saved activations of one transformer block for one micro-batch (N = b·t rows).
struct Model::LayerActivations {
  Buffer<float> ln1, ln1_mean, ln1_rstd;  // [N, C], [N], [N]
  Buffer<float> qkv;                      // [N, qkv_width], after RoPE
  Buffer<float> att, lse;                 // [N, heads·d], [b, heads, t]
  Buffer<float> mid;                      // [N, C]: the residual stream after attention
  Buffer<float> ln2, ln2_mean, ln2_rstd;  // [N, C], [N], [N]
  Buffer<float> fc;                       // [N, ffn] (GPT-2) or [N, 2·ffn] (gate, up)
  Buffer<float> act;                      // [N, ffn]
};

struct Model::Activations {
  int b = 0, t = 0;
  Buffer<int32_t> inputs, targets;
  std::vector<Buffer<float>> resid;       // layers + 1 of [N, C]: the input of each block
  std::vector<LayerActivations> layers;   // one per block, or a single one when recomputing
  Buffer<float> lnf, lnf_mean, lnf_rstd;  // final norm
  Buffer<float> tmp;                      // [N, C]: a projection's output before the residual add
  Buffer<float> logits;                   // [chunk rows, vocab]
  // Gradients flowing backward.
  Buffer<float> dx, dln, datt, dqkv, dfc, dact, dlnf;
};

Model::Model(const config::ModelConfig& config, Backend* backend)
    : config_(config), layout_(config), backend_(backend) {
  params_ = backend_->AllocFloat(layout_.total());
  grads_ = backend_->AllocFloat(layout_.total());
}

Model::~Model() = default;

absl::StatusOr<std::unique_ptr<Model>> Model::Create(const config::ModelConfig& config,
                                                     Backend* backend) {
  TY_RETURN_IF_ERROR(config::ValidateModelConfig(config));
  return std::unique_ptr<Model>(new Model(config, backend));
}

void Model::InitParameters(uint64_t seed) {
  std::vector<float> host(layout_.total());
  layout_.Initialize(seed, host.data());
  LoadParameters(host.data());
}

void Model::LoadParameters(const float* host) {
  backend_->CopyFromHost(params_.data(), host, layout_.total());
}

void Model::ReadParameters(float* host) const {
  backend_->CopyToHost(host, params_.data(), layout_.total());
}

void Model::ReadGradients(float* host) const {
  backend_->CopyToHost(host, grads_.data(), layout_.total());
}

void Model::ZeroGradients() { backend_->Fill(grads_.data(), 0.0f, layout_.total()); }

absl::Status Model::Prepare(const int32_t* inputs, const int32_t* targets, int b, int t) {
  if (b < 1) return absl::InvalidArgumentError(absl::StrCat("batch must be positive, got ", b));
  if (t < 1 || t > config_.max_seq) {
    return absl::InvalidArgumentError(
        absl::StrCat("sequence length ", t, " is outside [1, max_seq=", config_.max_seq, "]"));
  }
  const int64_t n = int64_t{b} * t;
  for (const int32_t* tokens : {inputs, targets}) {
    if (tokens == nullptr) continue;
    for (int64_t i = 0; i < n; ++i) {
      if (tokens[i] < 0 || tokens[i] >= config_.vocab) {
        return absl::InvalidArgumentError(absl::StrCat("token ", tokens[i], " at position ", i,
                                                       " is outside the vocabulary [0, ",
                                                       config_.vocab, ")"));
      }
    }
  }
  EnsureActivations(b, t);
  backend_->CopyFromHost(acts_->inputs.data(), inputs, n);
  if (targets != nullptr) backend_->CopyFromHost(acts_->targets.data(), targets, n);
  return absl::OkStatus();
}

void Model::EnsureActivations(int b, int t) {
  if (acts_ && acts_->b == b && acts_->t == t) return;
  acts_.reset();  // free the old shape's memory before allocating the new one
  auto a = std::make_unique<Activations>();
  const auto& c = config_;
  const int64_t n = int64_t{b} * t, width = c.width, qkv = c.qkv_width();
  const int64_t attn = int64_t{c.heads} * c.head_dim();
  const int64_t fc = c.family == ModelFamily::kGpt2 ? c.ffn_hidden : 2 * int64_t{c.ffn_hidden};
  Backend& be = *backend_;
  a->b = b;
  a->t = t;
  a->inputs = be.AllocInt(n);
  a->targets = be.AllocInt(n);
  for (int l = 0; l <= c.layers; ++l) a->resid.push_back(be.AllocFloat(n * width));
  const int saved_layers = c.recompute ? 1 : c.layers;
  for (int l = 0; l < saved_layers; ++l) {
    LayerActivations la;
    la.ln1 = be.AllocFloat(n * width);
    la.ln1_mean = be.AllocFloat(n);
    la.ln1_rstd = be.AllocFloat(n);
    la.qkv = be.AllocFloat(n * qkv);
    la.att = be.AllocFloat(n * attn);
    la.lse = be.AllocFloat(int64_t{b} * c.heads * t);
    la.mid = be.AllocFloat(n * width);
    la.ln2 = be.AllocFloat(n * width);
    la.ln2_mean = be.AllocFloat(n);
    la.ln2_rstd = be.AllocFloat(n);
    la.fc = be.AllocFloat(n * fc);
    la.act = be.AllocFloat(n * c.ffn_hidden);
    a->layers.push_back(std::move(la));
  }
  a->lnf = be.AllocFloat(n * width);
  a->lnf_mean = be.AllocFloat(n);
  a->lnf_rstd = be.AllocFloat(n);
  a->tmp = be.AllocFloat(n * width);
  const int64_t chunk_rows = std::clamp<int64_t>(kMaxLogitsChunk / c.vocab, 1, n);
  a->logits = be.AllocFloat(chunk_rows * c.vocab);
  a->dx = be.AllocFloat(n * width);
  a->dln = be.AllocFloat(n * width);
  a->datt = be.AllocFloat(n * attn);
  a->dqkv = be.AllocFloat(n * qkv);
  a->dfc = be.AllocFloat(n * fc);
  a->dact = be.AllocFloat(n * c.ffn_hidden);
  a->dlnf = be.AllocFloat(n * width);
  acts_ = std::move(a);
}

void Model::Forward(bool keep_layer_activations) {
  Activations& a = *acts_;
  backend_->Embedding(a.resid[0].data(), a.inputs.data(), P(layout_.wte()), P(layout_.wpe()), a.b,
                      a.t, config_.width);
  for (int l = 0; l < config_.layers; ++l) {
    BlockForward(l, a.layers[keep_layer_activations ? l : 0]);
  }
  FinalNorm();
}

void Model::BlockForward(int layer, LayerActivations& la) {
  Activations& a = *acts_;
  const auto& c = config_;
  const BlockOffsets& o = layout_.block(layer);
  const int64_t n = int64_t{a.b} * a.t, width = c.width;
  const int64_t attn = int64_t{c.heads} * c.head_dim();
  const AttentionShape shape{a.b, a.t, c.heads, c.kv_heads, c.head_dim()};
  const bool gpt2 = c.family == ModelFamily::kGpt2;
  const float* x = a.resid[layer].data();
  Backend& be = *backend_;

  if (gpt2) {
    be.LayerNorm(la.ln1.data(), la.ln1_mean.data(), la.ln1_rstd.data(), x, P(o.ln1_w), P(o.ln1_b),
                 n, width, c.norm_eps);
  } else {
    be.RmsNorm(la.ln1.data(), la.ln1_rstd.data(), x, P(o.ln1_w), n, width, c.norm_eps);
  }
  be.Linear(la.qkv.data(), la.ln1.data(), P(o.qkv_w), P(o.qkv_b), n, c.qkv_width(), width);
  if (!gpt2) be.Rope(la.qkv.data(), shape, c.rope_theta);
  be.Attention(la.att.data(), la.lse.data(), la.qkv.data(), shape);
  be.Linear(a.tmp.data(), la.att.data(), P(o.proj_w), P(o.proj_b), n, width, attn);
  be.Add(la.mid.data(), x, a.tmp.data(), n * width);

  if (gpt2) {
    be.LayerNorm(la.ln2.data(), la.ln2_mean.data(), la.ln2_rstd.data(), la.mid.data(), P(o.ln2_w),
                 P(o.ln2_b), n, width, c.norm_eps);
    be.Linear(la.fc.data(), la.ln2.data(), P(o.fc_w), P(o.fc_b), n, c.ffn_hidden, width);
    be.Gelu(la.act.data(), la.fc.data(), n * c.ffn_hidden);
  } else {
    be.RmsNorm(la.ln2.data(), la.ln2_rstd.data(), la.mid.data(), P(o.ln2_w), n, width, c.norm_eps);
    be.Linear(la.fc.data(), la.ln2.data(), P(o.fc_w), nullptr, n, 2 * int64_t{c.ffn_hidden}, width);
    be.Swiglu(la.act.data(), la.fc.data(), n, c.ffn_hidden);
  }
  be.Linear(a.tmp.data(), la.act.data(), P(o.mlp_proj_w), P(o.mlp_proj_b), n, width, c.ffn_hidden);
  be.Add(a.resid[layer + 1].data(), la.mid.data(), a.tmp.data(), n * width);
}

// On entry dx holds ∂loss/∂(block output); on return, ∂loss/∂(block input).
void Model::BlockBackward(int layer, LayerActivations& la, float* dx) {
  Activations& a = *acts_;
  const auto& c = config_;
  const BlockOffsets& o = layout_.block(layer);
  const int64_t n = int64_t{a.b} * a.t, width = c.width;
  const int64_t attn = int64_t{c.heads} * c.head_dim();
  const AttentionShape shape{a.b, a.t, c.heads, c.kv_heads, c.head_dim()};
  const bool gpt2 = c.family == ModelFamily::kGpt2;
  const int64_t fc = gpt2 ? c.ffn_hidden : 2 * int64_t{c.ffn_hidden};
  Backend& be = *backend_;

  // MLP branch: out = mid + proj(act(fc(norm2(mid)))).
  be.LinearBackward(a.dact.data(), G(o.mlp_proj_w), G(o.mlp_proj_b), dx, la.act.data(),
                    P(o.mlp_proj_w), n, width, c.ffn_hidden);
  if (gpt2) {
    be.GeluBackward(a.dfc.data(), a.dact.data(), la.fc.data(), n * c.ffn_hidden);
  } else {
    be.SwigluBackward(a.dfc.data(), a.dact.data(), la.fc.data(), n, c.ffn_hidden);
  }
  be.LinearBackward(a.dln.data(), G(o.fc_w), G(o.fc_b), a.dfc.data(), la.ln2.data(), P(o.fc_w), n,
                    fc, width);
  if (gpt2) {
    be.LayerNormBackward(dx, G(o.ln2_w), G(o.ln2_b), a.dln.data(), la.mid.data(), P(o.ln2_w),
                         la.ln2_mean.data(), la.ln2_rstd.data(), n, width);
  } else {
    be.RmsNormBackward(dx, G(o.ln2_w), a.dln.data(), la.mid.data(), P(o.ln2_w), la.ln2_rstd.data(),
                       n, width);
  }

  // Attention branch: mid = x + proj(attention(rope(qkv(norm1(x))))).
  be.LinearBackward(a.datt.data(), G(o.proj_w), G(o.proj_b), dx, la.att.data(), P(o.proj_w), n,
                    width, attn);
  be.AttentionBackward(a.dqkv.data(), a.datt.data(), la.qkv.data(), la.att.data(), la.lse.data(),
                       shape);
  if (!gpt2) be.RopeBackward(a.dqkv.data(), shape, c.rope_theta);
  be.LinearBackward(a.dln.data(), G(o.qkv_w), G(o.qkv_b), a.dqkv.data(), la.ln1.data(), P(o.qkv_w),
                    n, c.qkv_width(), width);
  const float* x = a.resid[layer].data();
  if (gpt2) {
    be.LayerNormBackward(dx, G(o.ln1_w), G(o.ln1_b), a.dln.data(), x, P(o.ln1_w),
                         la.ln1_mean.data(), la.ln1_rstd.data(), n, width);
  } else {
    be.RmsNormBackward(dx, G(o.ln1_w), a.dln.data(), x, P(o.ln1_w), la.ln1_rstd.data(), n, width);
  }
}

void Model::FinalNorm() {
  Activations& a = *acts_;
  const int64_t n = int64_t{a.b} * a.t;
  const float* x = a.resid[config_.layers].data();
  if (config_.family == ModelFamily::kGpt2) {
    backend_->LayerNorm(a.lnf.data(), a.lnf_mean.data(), a.lnf_rstd.data(), x, P(layout_.lnf_w()),
                        P(layout_.lnf_b()), n, config_.width, config_.norm_eps);
  } else {
    backend_->RmsNorm(a.lnf.data(), a.lnf_rstd.data(), x, P(layout_.lnf_w()), n, config_.width,
                      config_.norm_eps);
  }
}

void Model::FinalNormBackward(float* dx) {
  Activations& a = *acts_;
  const int64_t n = int64_t{a.b} * a.t;
  const float* x = a.resid[config_.layers].data();
  if (config_.family == ModelFamily::kGpt2) {
    backend_->LayerNormBackward(dx, G(layout_.lnf_w()), G(layout_.lnf_b()), a.dlnf.data(), x,
                                P(layout_.lnf_w()), a.lnf_mean.data(), a.lnf_rstd.data(), n,
                                config_.width);
  } else {
    backend_->RmsNormBackward(dx, G(layout_.lnf_w()), a.dlnf.data(), x, P(layout_.lnf_w()),
                              a.lnf_rstd.data(), n, config_.width);
  }
}

double Model::ChunkedLoss(float grad_scale, bool with_grad) {
  Activations& a = *acts_;
  const int64_t n = int64_t{a.b} * a.t, width = config_.width, vocab = config_.vocab;
  const int64_t chunk = a.logits.size() / vocab;
  const float* head = P(layout_.lm_head());
  double total = 0.0;
  for (int64_t r0 = 0; r0 < n; r0 += chunk) {
    const int64_t rows = std::min(chunk, n - r0);
    const float* h = a.lnf.data() + r0 * width;
    backend_->Linear(a.logits.data(), h, head, nullptr, rows, vocab, width);
    total += backend_->SoftmaxCrossEntropy(a.logits.data(), a.targets.data() + r0, rows, vocab,
                                           grad_scale, with_grad);
    if (with_grad) {
      backend_->LinearBackward(a.dlnf.data() + r0 * width, G(layout_.lm_head()), nullptr,
                               a.logits.data(), h, head, rows, vocab, width);
    }
  }
  return total;
}

absl::StatusOr<double> Model::ForwardBackward(const int32_t* inputs, const int32_t* targets, int b,
                                              int t, float grad_scale) {
  if (targets == nullptr) return absl::InvalidArgumentError("targets are required");
  TY_RETURN_IF_ERROR(Prepare(inputs, targets, b, t));
  const bool recompute = config_.recompute;
  Forward(/*keep_layer_activations=*/!recompute);
  const double loss = ChunkedLoss(grad_scale, /*with_grad=*/true);
  Activations& a = *acts_;
  float* dx = a.dx.data();
  backend_->Fill(dx, 0.0f, a.dx.size());
  FinalNormBackward(dx);
  for (int l = config_.layers - 1; l >= 0; --l) {
    LayerActivations& la = a.layers[recompute ? 0 : l];
    if (recompute) BlockForward(l, la);
    BlockBackward(l, la, dx);
  }
  backend_->EmbeddingBackward(G(layout_.wte()), G(layout_.wpe()), dx, a.inputs.data(), a.b, a.t,
                              config_.width);
  return loss;
}

absl::StatusOr<double> Model::Loss(const int32_t* inputs, const int32_t* targets, int b, int t) {
  if (targets == nullptr) return absl::InvalidArgumentError("targets are required");
  TY_RETURN_IF_ERROR(Prepare(inputs, targets, b, t));
  Forward(/*keep_layer_activations=*/false);
  return ChunkedLoss(0.0f, /*with_grad=*/false);
}

absl::Status Model::Logits(const int32_t* inputs, int b, int t, float* host_logits) {
  TY_RETURN_IF_ERROR(Prepare(inputs, nullptr, b, t));
  Forward(/*keep_layer_activations=*/false);
  Activations& a = *acts_;
  const int64_t n = int64_t{b} * t, vocab = config_.vocab;
  const int64_t chunk = a.logits.size() / vocab;
  for (int64_t r0 = 0; r0 < n; r0 += chunk) {
    const int64_t rows = std::min(chunk, n - r0);
    backend_->Linear(a.logits.data(), a.lnf.data() + r0 * config_.width, P(layout_.lm_head()),
                     nullptr, rows, vocab, config_.width);
    backend_->CopyToHost(host_logits + r0 * vocab, a.logits.data(), rows * vocab);
  }
  return absl::OkStatus();
}

}  // namespace trainyard::worker
