#include "worker/checkpoint/format.h"

#include <xxhash.h>

#include <algorithm>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status.h"
#include "google/protobuf/util/json_util.h"

namespace trainyard::worker::checkpoint {

std::string JoinPath(const std::string& dir, const std::string& name) {
  if (dir.empty()) return std::string(name);
  if (dir.back() == '/') return absl::StrCat(dir, name);
  return absl::StrCat(dir, "/", name);
}

std::string CheckpointDirName(int64_t step, const std::string& save_token) {
  return absl::StrFormat("step-%08d-%s", step, save_token);
}

std::optional<int64_t> StepOfDirName(const std::string& name) {
  constexpr size_t kPrefix = 5;  // "step-"
  if (name.compare(0, kPrefix, "step-") != 0) return std::nullopt;
  const size_t dash = name.find('-', kPrefix);
  if (dash == std::string::npos || dash == kPrefix || dash + 1 == name.size()) return std::nullopt;
  int64_t step = 0;
  if (!absl::SimpleAtoi(name.substr(kPrefix, dash - kPrefix), &step) || step < 0) {
    return std::nullopt;
  }
  return step;
}

std::optional<int64_t> StepOfPath(const std::string& path) {
  return StepOfDirName(path.substr(path.rfind('/') + 1));  // npos + 1: the whole path
}

std::string TokenOfDirName(const std::string& name) {
  if (!StepOfDirName(name)) return "";
  return name.substr(name.find('-', 5) + 1);
}

std::string ShardFileName(int rank, int world) {
  return absl::StrFormat("shard-%05d-of-%05d.bin", rank, world);
}

std::string ShardIndexName(int rank) { return absl::StrFormat("shard-%05d.idx", rank); }

uint64_t Checksum(const void* data, size_t size) { return XXH3_64bits(data, size); }

ModelSignature SignatureOf(const config::ModelConfig& m) {
  ModelSignature s;
  s.set_family(config::FamilyName(m.family));
  s.set_layers(m.layers);
  s.set_width(m.width);
  s.set_heads(m.heads);
  s.set_kv_heads(m.kv_heads);
  s.set_ffn_hidden(m.ffn_hidden);
  s.set_vocab(m.vocab);
  s.set_max_seq(m.max_seq);
  s.set_tied_embeddings(m.tied_embeddings);
  s.set_qkv_bias(m.qkv_bias);
  s.set_head_dim(m.explicit_head_dim);
  s.set_qk_norm(m.qk_norm);
  s.set_qk_norm_projection(m.NormsWholeProjection());
  s.set_sliding_window(m.sliding_window);
  s.set_geglu(m.geglu);
  s.set_scale_embeddings(m.scale_embeddings);
  s.set_rope_local_theta(m.rope_local_theta);
  s.set_post_norms(m.post_norms);
  s.set_no_pre_norms(!m.pre_norms);
  if (m.latent.enabled()) {
    LatentSignature& latent = *s.mutable_latent();
    latent.set_q_rank(m.latent.q_rank);
    latent.set_kv_rank(m.latent.kv_rank);
    latent.set_value_dim(m.latent.value_dim);
    latent.set_norm_eps(m.latent.norm_eps);
  }
  s.set_attention_scale_dim(m.attention_scale_dim);
  s.set_attention_softcap(m.attention_softcap);
  s.set_logit_softcap(m.logit_softcap);
  s.set_rope_dim(m.rope_dim);
  s.mutable_nope_layers()->Add(m.nope_layers.begin(), m.nope_layers.end());
  s.set_embedding_multiplier(m.embedding_multiplier);
  s.set_residual_multiplier(m.residual_multiplier);
  s.set_attention_multiplier(m.attention_multiplier);
  s.set_logits_scaling(m.logits_scaling);
  s.mutable_full_attention_layers()->Add(m.full_attention_layers.begin(),
                                         m.full_attention_layers.end());
  s.set_norm_eps(m.norm_eps);
  if (m.family == config::ModelFamily::kLlama) s.set_rope_theta(m.rope_theta);
  if (const config::RopeScaling& r = m.rope_scaling; r.enabled()) {
    RopeScalingSignature& out = *s.mutable_rope_scaling();
    out.set_factor(r.factor);
    out.set_linear(r.linear);
    out.set_low_freq_factor(r.low_freq_factor);
    out.set_high_freq_factor(r.high_freq_factor);
    out.set_original_max_seq(r.original_max_seq);
    out.set_longrope(r.longrope);
    out.mutable_short_factor()->Add(r.short_factor.begin(), r.short_factor.end());
    out.mutable_long_factor()->Add(r.long_factor.begin(), r.long_factor.end());
    if (r.longrope || r.yarn) out.set_attention_factor(r.attention_factor);
    if (r.yarn) {
      out.set_yarn(true);
      out.set_beta_fast(r.beta_fast);
      out.set_beta_slow(r.beta_slow);
      out.set_untruncated(!r.truncate);
    }
  }
  if (m.moe.enabled()) {
    MoeSignature& moe = *s.mutable_moe();
    moe.set_experts(m.moe.experts);
    moe.set_ffn(m.moe.ffn);
    moe.set_shared_experts(m.moe.shared_experts);
    moe.set_shared_gate(m.moe.shared_gate);
    moe.set_every(m.moe.every);
    moe.set_dense_first(m.moe.dense_first);
    moe.set_routed_scale(m.moe.routed_scale);
    moe.set_groups(m.moe.groups);
    moe.set_group_top_k(m.moe.group_top_k);
    moe.set_group_max(m.moe.group_score == config::GroupScore::kMax);
    moe.set_router_bias(m.moe.has_bias());
    moe.set_top_k(m.moe.top_k);
    moe.set_sigmoid_score(m.moe.score == config::MoeScore::kSigmoid);
    moe.set_normalize_top_k(m.moe.normalize_top_k);
  }
  return s;
}

absl::StatusOr<config::ModelConfig> ModelFromSignature(const ModelSignature& s) {
  config::ModelConfig m;
  TY_ASSIGN_OR_RETURN(m.family, config::ParseFamily(s.family()));
  m.layers = s.layers();
  m.width = s.width();
  m.heads = s.heads();
  m.kv_heads = s.kv_heads();
  m.ffn_hidden = s.ffn_hidden();
  m.vocab = s.vocab();
  m.max_seq = s.max_seq();
  m.tied_embeddings = s.tied_embeddings();
  m.qkv_bias = s.qkv_bias();
  m.explicit_head_dim = s.head_dim();
  m.qk_norm = s.qk_norm();
  if (s.qk_norm_projection()) m.qk_norm_span = config::QkNormSpan::kProjection;
  m.sliding_window = s.sliding_window();
  m.geglu = s.geglu();
  m.scale_embeddings = s.scale_embeddings();
  m.rope_local_theta = s.rope_local_theta();
  m.post_norms = s.post_norms();
  m.pre_norms = !s.no_pre_norms();
  m.latent = {.q_rank = s.latent().q_rank(),
              .kv_rank = s.latent().kv_rank(),
              .value_dim = s.latent().value_dim()};
  m.attention_scale_dim = s.attention_scale_dim();
  m.attention_softcap = s.attention_softcap();
  m.logit_softcap = s.logit_softcap();
  m.rope_dim = s.rope_dim();
  m.nope_layers.assign(s.nope_layers().begin(), s.nope_layers().end());
  if (s.embedding_multiplier() > 0) m.embedding_multiplier = s.embedding_multiplier();
  if (s.residual_multiplier() > 0) m.residual_multiplier = s.residual_multiplier();
  m.attention_multiplier = s.attention_multiplier();
  if (s.logits_scaling() > 0) m.logits_scaling = s.logits_scaling();
  m.full_attention_layers.assign(s.full_attention_layers().begin(),
                                 s.full_attention_layers().end());
  if (s.norm_eps() > 0) m.norm_eps = s.norm_eps();
  // Before the latents' own epsilon was recorded, their norms took the model's.
  if (m.latent.enabled()) {
    m.latent.norm_eps = s.latent().norm_eps() > 0 ? s.latent().norm_eps() : m.norm_eps;
  }
  if (s.rope_theta() > 0) m.rope_theta = s.rope_theta();
  if (s.has_rope_scaling()) {
    const RopeScalingSignature& r = s.rope_scaling();
    m.rope_scaling = {.linear = r.linear(),
                      .factor = r.factor(),
                      .low_freq_factor = r.low_freq_factor(),
                      .high_freq_factor = r.high_freq_factor(),
                      .original_max_seq = r.original_max_seq(),
                      .longrope = r.longrope(),
                      .short_factor = {r.short_factor().begin(), r.short_factor().end()},
                      .long_factor = {r.long_factor().begin(), r.long_factor().end()},
                      .attention_factor = r.longrope() || r.yarn() ? r.attention_factor() : 1.0f};
    if (r.yarn()) {
      m.rope_scaling.yarn = true;
      m.rope_scaling.beta_fast = r.beta_fast();
      m.rope_scaling.beta_slow = r.beta_slow();
      m.rope_scaling.truncate = !r.untruncated();
    }
  }
  if (s.moe().experts() > 0) {
    if (s.moe().top_k() == 0) {
      return absl::InvalidArgumentError(
          "this mixture-of-experts checkpoint predates the recording of its routing (top_k, "
          "score), so its model cannot be run or exported; resume the job once and use the "
          "checkpoint it writes");
    }
    m.moe.experts = s.moe().experts();
    m.moe.ffn = s.moe().ffn();
    m.moe.shared_experts = s.moe().shared_experts();
    m.moe.shared_gate = s.moe().shared_gate();
    m.moe.every = s.moe().every();
    m.moe.dense_first = s.moe().dense_first();
    if (s.moe().routed_scale() > 0) m.moe.routed_scale = s.moe().routed_scale();
    if (s.moe().groups() > 0) m.moe.groups = s.moe().groups();
    m.moe.group_top_k = s.moe().group_top_k();
    if (s.moe().group_max()) m.moe.group_score = config::GroupScore::kMax;
    m.moe.top_k = s.moe().top_k();
    if (s.moe().sigmoid_score()) m.moe.score = config::MoeScore::kSigmoid;
    m.moe.normalize_top_k = s.moe().normalize_top_k();
    if (s.moe().router_bias()) m.moe.balance = config::MoeBalance::kBias;
  }
  TY_RETURN_IF_ERROR(config::ValidateModelConfig(m, "the checkpoint's model"));
  return m;
}

namespace {

// A dense model's signature (all zero) differs from an MoE model's in experts first.
absl::Status CheckMoeMatches(const MoeSignature& saved, const MoeSignature& want) {
  auto differ = [](const char* field, const auto& in_checkpoint, const auto& in_spec) {
    return absl::InvalidArgumentError(absl::StrCat("model.moe.", field, " is ", in_checkpoint,
                                                   " in the checkpoint, ", in_spec,
                                                   " in the spec"));
  };
  if (saved.experts() != want.experts()) return differ("experts", saved.experts(), want.experts());
  if (saved.ffn() != want.ffn()) return differ("ffn", saved.ffn(), want.ffn());
  if (saved.shared_experts() != want.shared_experts()) {
    return differ("shared_experts", saved.shared_experts(), want.shared_experts());
  }
  if (saved.shared_gate() != want.shared_gate()) {
    return differ("shared_gate", saved.shared_gate() ? "true" : "false",
                  want.shared_gate() ? "true" : "false");
  }
  if (saved.every() != want.every()) return differ("every", saved.every(), want.every());
  if (saved.dense_first() != want.dense_first()) {
    return differ("dense_first", saved.dense_first(), want.dense_first());
  }
  // The selection bias exists under balance: bias only.
  if (saved.router_bias() != want.router_bias()) {
    return differ("balance", saved.router_bias() ? "bias" : "aux_loss",
                  want.router_bias() ? "bias" : "aux_loss");
  }
  return absl::OkStatus();
}

// Latent attention's ranks, value heads and rotary part size its projections' tensors.
absl::Status CheckLatentMatches(const ModelSignature& saved, const ModelSignature& want) {
  const LatentSignature &a = saved.latent(), &b = want.latent();
  auto text = [](const ModelSignature& m) {
    const LatentSignature& l = m.latent();
    if (l.kv_rank() == 0) return std::string("none");
    return absl::StrCat("{q_rank: ", l.q_rank(), ", kv_rank: ", l.kv_rank(),
                        ", value_dim: ", l.value_dim(), "} with rope_dim ", m.rope_dim());
  };
  if (a.q_rank() != b.q_rank() || a.kv_rank() != b.kv_rank() || a.value_dim() != b.value_dim() ||
      (b.kv_rank() > 0 && saved.rope_dim() != want.rope_dim())) {
    return absl::InvalidArgumentError(absl::StrCat("model.latent_attention is ", text(saved),
                                                   " in the checkpoint, ", text(want),
                                                   " in the spec"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckModelMatches(const ModelSignature& saved, const config::ModelConfig& model) {
  const ModelSignature want = SignatureOf(model);
  auto differ = [](const char* field, const auto& in_checkpoint, const auto& in_spec) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model.", field, " is ", in_checkpoint, " in the checkpoint, ", in_spec, " in the spec"));
  };
  if (saved.family() != want.family()) return differ("family", saved.family(), want.family());
  if (saved.layers() != want.layers()) return differ("layers", saved.layers(), want.layers());
  if (saved.width() != want.width()) return differ("width", saved.width(), want.width());
  if (saved.heads() != want.heads()) return differ("heads", saved.heads(), want.heads());
  if (saved.kv_heads() != want.kv_heads()) {
    return differ("kv_heads", saved.kv_heads(), want.kv_heads());
  }
  if (saved.ffn_hidden() != want.ffn_hidden()) {
    return differ("ffn_hidden", saved.ffn_hidden(), want.ffn_hidden());
  }
  if (saved.vocab() != want.vocab()) return differ("vocab", saved.vocab(), want.vocab());
  if (saved.max_seq() != want.max_seq()) return differ("max_seq", saved.max_seq(), want.max_seq());
  if (saved.tied_embeddings() != want.tied_embeddings()) {
    return differ("tied_embeddings", saved.tied_embeddings() ? "true" : "false",
                  want.tied_embeddings() ? "true" : "false");
  }
  if (saved.qkv_bias() != want.qkv_bias()) {
    return differ("qkv_bias", saved.qkv_bias() ? "true" : "false",
                  want.qkv_bias() ? "true" : "false");
  }
  // Compared as the heads' widths: an explicit head_dim equal to width / heads is that model.
  auto head_dim = [](const ModelSignature& m) {
    return m.head_dim() > 0 ? m.head_dim() : m.width() / std::max(m.heads(), 1);
  };
  if (head_dim(saved) != head_dim(want)) {
    return differ("head_dim", head_dim(saved), head_dim(want));
  }
  if (saved.qk_norm() != want.qk_norm()) {
    return differ("qk_norm", saved.qk_norm() ? "true" : "false", want.qk_norm() ? "true" : "false");
  }
  if (saved.qk_norm_projection() != want.qk_norm_projection()) {
    return differ("qk_norm_span", saved.qk_norm_projection() ? "projection" : "head",
                  want.qk_norm_projection() ? "projection" : "head");
  }
  if (saved.post_norms() != want.post_norms()) {
    return differ("post_norms", saved.post_norms() ? "true" : "false",
                  want.post_norms() ? "true" : "false");
  }
  if (saved.no_pre_norms() != want.no_pre_norms()) {
    return differ("pre_norms", saved.no_pre_norms() ? "false" : "true",
                  want.no_pre_norms() ? "false" : "true");
  }
  TY_RETURN_IF_ERROR(CheckLatentMatches(saved, want));
  return CheckMoeMatches(saved.moe(), want.moe());
}

namespace {

std::string ToJson(const Manifest& manifest) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = true;
  std::string json;
  // Serialising a message we built cannot fail.
  (void)google::protobuf::util::MessageToJsonString(manifest, &json, options);
  return json;
}

}  // namespace

std::string SerializeManifest(Manifest manifest) {
  manifest.set_manifest_xxh3(0);
  const std::string unsigned_json = ToJson(manifest);
  manifest.set_manifest_xxh3(Checksum(unsigned_json.data(), unsigned_json.size()));
  return ToJson(manifest);
}

absl::StatusOr<Manifest> ReadManifest(FileSystem& fs, const std::string& checkpoint_dir) {
  return ReadManifestFile(fs, JoinPath(checkpoint_dir, kManifestName));
}

absl::StatusOr<Manifest> ReadManifestFile(FileSystem& fs, const std::string& path) {
  TY_ASSIGN_OR_RETURN(const std::string json, fs.ReadFile(path));
  Manifest manifest;
  const auto parsed = google::protobuf::util::JsonStringToMessage(json, &manifest);
  if (!parsed.ok()) {
    return absl::DataLossError(
        absl::StrCat(path, ": not a valid manifest (", parsed.ToString(), ")"));
  }
  const uint64_t stated = manifest.manifest_xxh3();
  manifest.set_manifest_xxh3(0);
  const std::string unsigned_json = ToJson(manifest);
  if (Checksum(unsigned_json.data(), unsigned_json.size()) != stated) {
    return absl::DataLossError(absl::StrCat(path, ": checksum mismatch"));
  }
  manifest.set_manifest_xxh3(stated);
  if (manifest.format_version() != kFormatVersion) {
    return absl::DataLossError(absl::StrCat(path, ": format version ", manifest.format_version(),
                                            ", expected ", kFormatVersion));
  }
  return manifest;
}

absl::StatusOr<std::vector<std::string>> ListCommitted(FileSystem& fs, const std::string& dir) {
  TY_ASSIGN_OR_RETURN(const std::vector<std::string> names, fs.ListDir(dir));
  std::vector<std::pair<int64_t, std::string>> found;
  for (const std::string& name : names) {
    const std::optional<int64_t> step = StepOfDirName(name);
    if (!step) continue;
    const std::string path = JoinPath(dir, name);
    if (fs.Exists(JoinPath(path, kManifestName))) found.emplace_back(*step, path);
  }
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a > b; });
  std::vector<std::string> paths;
  for (auto& [step, path] : found) paths.push_back(std::move(path));
  return paths;
}

}  // namespace trainyard::worker::checkpoint
