#include "planner/calibration.h"

#include <algorithm>
#include <cmath>
#include <tuple>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "common/json.h"
#include "common/status.h"
#include "config/mesh.h"
#include "config/yaml_tree.h"

namespace trainyard::planner {
namespace {

// The figures of a calibration and of each shared-ranks entry, by name: CalibrationToJson and
// CalibrationFromJson read the same tables, so that every figure written is read back.
template <typename T>
using Figures = std::vector<std::pair<const char*, double& (*)(T&)>>;

const Figures<Calibration>& CalibrationFigures() {
  static const Figures<Calibration> figures = {
      {"large_gemm_flops", [](Calibration& c) -> double& { return c.large_gemm_flops; }},
      {"gemm_flops", [](Calibration& c) -> double& { return c.gemm_flops; }},
      {"add_bytes_per_second", [](Calibration& c) -> double& { return c.add_bytes_per_second; }},
      {"alpha_seconds", [](Calibration& c) -> double& { return c.alpha_seconds; }},
      {"bytes_per_second", [](Calibration& c) -> double& { return c.bytes_per_second; }},
  };
  return figures;
}

const Figures<SharedRanksCalibration>& SharedFigures() {
  using S = SharedRanksCalibration;
  static const Figures<S> figures = {
      {"matmul_flops", [](S& s) -> double& { return s.entry.matmul_flops; }},
      {"alpha_seconds", [](S& s) -> double& { return s.entry.link.alpha_seconds; }},
      {"bytes_per_second", [](S& s) -> double& { return s.entry.link.bytes_per_second; }},
      {"lockstep_alpha_seconds", [](S& s) -> double& { return s.entry.lockstep_alpha_seconds; }},
      {"background_alpha_seconds",
       [](S& s) -> double& { return s.entry.background_alpha_seconds; }},
      {"optimizer_elements_per_second",
       [](S& s) -> double& { return s.entry.optimizer_elements_per_second; }},
      {"lockstep_matmul_flops", [](S& s) -> double& { return s.entry.lockstep_matmul_flops; }},
      {"pass_seconds", [](S& s) -> double& { return s.pass_seconds; }},
      {"optimizer_step_seconds", [](S& s) -> double& { return s.optimizer_step_seconds; }},
      {"collective_seconds", [](S& s) -> double& { return s.collective_seconds; }},
      {"lockstep_collective_seconds",
       [](S& s) -> double& { return s.lockstep_collective_seconds; }},
      {"lockstep_compute_seconds", [](S& s) -> double& { return s.lockstep_compute_seconds; }},
      {"background_seconds", [](S& s) -> double& { return s.background_seconds; }},
  };
  return figures;
}

// `"name": value` for every figure of `item`, `separator` between them.
template <typename T>
std::string FiguresJson(T item, const Figures<T>& figures, const char* separator) {
  std::vector<std::string> members;
  for (const auto& [name, figure] : figures) {
    members.push_back(absl::StrCat("\"", name, "\": ", JsonNumber(figure(item))));
  }
  return absl::StrJoin(members, separator);
}

absl::StatusOr<double> NumberAt(const config::YamlNode& node, const char* name,
                                const std::string& where) {
  const config::YamlEntry* entry = node.Find(name);
  double value = 0;
  if (entry == nullptr || entry->value.kind != config::YamlNode::Kind::kScalar ||
      !absl::SimpleAtod(entry->value.value, &value) || !std::isfinite(value)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "calibration: ", where, name, entry == nullptr ? " is missing" : " is not a number"));
  }
  return value;
}

template <typename T>
absl::Status ReadFigures(const config::YamlNode& node, const std::string& where,
                         const Figures<T>& figures, T& item) {
  for (const auto& [name, figure] : figures) {
    TY_ASSIGN_OR_RETURN(figure(item), NumberAt(node, name, where));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<SharedRanksCalibration>> SharedFromNode(const config::YamlNode& root) {
  const config::YamlEntry* list = root.Find("shared");
  if (list == nullptr || list->value.kind != config::YamlNode::Kind::kSequence) {
    return absl::InvalidArgumentError("calibration: shared is not a list");
  }
  std::vector<SharedRanksCalibration> shared;
  for (const config::YamlNode& item : list->value.items) {
    const std::string where = absl::StrCat("shared[", shared.size(), "].");
    SharedRanksCalibration& s = shared.emplace_back();
    TY_ASSIGN_OR_RETURN(const double ranks, NumberAt(item, "ranks", where));
    if (!(ranks >= 1 && ranks <= (1 << 20)) || ranks != std::floor(ranks)) {
      return absl::InvalidArgumentError(
          absl::StrCat("calibration: ", where, "ranks is not a positive whole number"));
    }
    s.entry.ranks = static_cast<int>(ranks);
    TY_RETURN_IF_ERROR(ReadFigures(item, where, SharedFigures(), s));
  }
  return shared;
}

// model.moe with every field written out, but the one its balance rule does not use (the spec
// parser refuses it).
void AppendMoeYaml(const config::MoeConfig& moe, std::string* yaml) {
  const bool bias = moe.balance == config::MoeBalance::kBias;
  absl::StrAppendFormat(
      yaml,
      "  moe:\n    experts: %d\n    top_k: %d\n    shared_experts: %d\n    shared_gate: %s\n"
      "    every: %d\n    dense_first: %d\n    ffn: %d\n    score: %s\n    normalize_top_k: %s\n"
      "    routed_scale: %.9g\n    groups: %d\n    group_top_k: %d\n%s    balance: %s\n"
      "    %s: %.9g\n    z_loss_coeff: %.9g\n    capacity_factor: %.9g\n",
      moe.experts, moe.top_k, moe.shared_experts, moe.shared_gate ? "true" : "false", moe.every,
      moe.dense_first, moe.ffn, moe.score == config::MoeScore::kSigmoid ? "sigmoid" : "softmax",
      moe.normalize_top_k ? "true" : "false", moe.routed_scale, moe.groups, moe.group_top_k,
      moe.limits_groups() && moe.group_score == config::GroupScore::kMax ? "    group_score: max\n"
                                                                         : "",
      bias ? "bias" : "aux_loss", bias ? "bias_update_rate" : "aux_loss_coeff",
      bias ? moe.bias_update_rate : moe.aux_loss_coeff, moe.z_loss_coeff, moe.capacity_factor);
}

}  // namespace

config::JobSpec DefaultCalibrationReference() {
  config::JobSpec spec;
  spec.name = "calibration-reference";
  spec.model = *config::Preset("gpt2-tiny");
  spec.training.batch = 4;
  spec.training.micro_batch = 4;
  spec.training.seq_len = 64;
  return spec;
}

config::JobSpec CalibrationReference(const config::JobSpec& spec) {
  config::JobSpec reference;
  reference.name = "calibration-reference";
  reference.model = spec.model;
  const int dp = spec.parallelism.automatic ? 1 : std::max(spec.parallelism.dp, 1);
  const int micro = spec.training.micro_batch > 0 ? spec.training.micro_batch
                                                  : std::max(spec.training.batch / dp, 1);
  reference.training.batch = micro;
  reference.training.micro_batch = micro;
  reference.training.seq_len = spec.training.seq_len;
  return reference;
}

std::string CalibrationReferenceName(const config::JobSpec& reference) {
  const config::ModelConfig& model = reference.model;
  const int64_t rows =
      int64_t{config::MicroBatchPerRank(reference.training, reference.parallelism)} *
      reference.training.seq_len;
  const std::string experts =
      model.moe.enabled() ? absl::StrFormat(", MoE %d experts top-%d every %d", model.moe.experts,
                                            model.moe.top_k, model.moe.every)
                          : "";
  return absl::StrFormat("%s, %d layers, width %d%s, %d × %d tokens",
                         config::FamilyName(model.family), model.layers, model.width, experts,
                         rows / reference.training.seq_len, reference.training.seq_len);
}

std::string CalibrationReferenceYaml(const config::JobSpec& spec) {
  const config::JobSpec reference = CalibrationReference(spec);
  const config::ModelConfig& m = reference.model;
  std::string yaml = absl::StrFormat(
      "name: %s\nmodel:\n  family: %s\n  layers: %d\n  width: %d\n  heads: %d\n  kv_heads: %d\n"
      "  ffn_hidden: %d\n  vocab: %d\n  max_seq: %d\n  tied_embeddings: %s\n  norm_eps: %.9g\n"
      "  recompute: %s\n",
      reference.name, config::FamilyName(m.family), m.layers, m.width, m.heads, m.kv_heads,
      m.ffn_hidden, m.vocab, m.max_seq, m.tied_embeddings ? "true" : "false", m.norm_eps,
      m.recompute ? "true" : "false");
  // Only the llama family has a rotary base (the spec parser refuses one for gpt2).
  if (m.family == config::ModelFamily::kLlama) {
    absl::StrAppendFormat(&yaml, "  rope_theta: %.9g\n", m.rope_theta);
    if (m.qkv_bias) absl::StrAppend(&yaml, "  qkv_bias: true\n");
    if (m.qk_norm) absl::StrAppend(&yaml, "  qk_norm: true\n");
    if (m.NormsWholeProjection()) absl::StrAppend(&yaml, "  qk_norm_span: projection\n");
    if (m.sliding_window != 0) absl::StrAppend(&yaml, "  sliding_window: ", m.sliding_window, "\n");
    if (!m.full_attention_layers.empty()) {
      absl::StrAppend(&yaml, "  full_attention_layers: [",
                      absl::StrJoin(m.full_attention_layers, ", "), "]\n");
    }
    if (m.rope_local_theta != 0) {
      absl::StrAppendFormat(&yaml, "  rope_local_theta: %.9g\n", m.rope_local_theta);
    }
    if (m.post_norms) absl::StrAppend(&yaml, "  post_norms: true\n");
    if (!m.pre_norms) absl::StrAppend(&yaml, "  pre_norms: false\n");
    if (m.geglu) absl::StrAppend(&yaml, "  activation: geglu\n");
    if (m.scale_embeddings) absl::StrAppend(&yaml, "  scale_embeddings: true\n");
    if (m.explicit_head_dim != 0) absl::StrAppend(&yaml, "  head_dim: ", m.explicit_head_dim, "\n");
  }
  if (m.attention_scale_dim != 0) {
    absl::StrAppend(&yaml, "  attention_scale_dim: ", m.attention_scale_dim, "\n");
  }
  for (const auto& [field, cap] : {std::pair{"attention_softcap", m.attention_softcap},
                                   std::pair{"logit_softcap", m.logit_softcap}}) {
    if (cap != 0) absl::StrAppendFormat(&yaml, "  %s: %.9g\n", field, cap);
  }
  for (const auto& [field, factor, none] :
       {std::tuple{"embedding_multiplier", m.embedding_multiplier, 1.0f},
        std::tuple{"residual_multiplier", m.residual_multiplier, 1.0f},
        std::tuple{"attention_multiplier", m.attention_multiplier, 0.0f},
        std::tuple{"logits_scaling", m.logits_scaling, 1.0f}}) {
    if (factor != none) absl::StrAppendFormat(&yaml, "  %s: %.9g\n", field, factor);
  }
  if (m.rope_dim != 0) absl::StrAppend(&yaml, "  rope_dim: ", m.rope_dim, "\n");
  if (!m.nope_layers.empty()) {
    absl::StrAppend(&yaml, "  nope_layers: [", absl::StrJoin(m.nope_layers, ", "), "]\n");
  }
  auto floats = [](const std::vector<float>& v) {
    return absl::StrJoin(v, ", ",
                         [](std::string* out, float f) { absl::StrAppendFormat(out, "%.9g", f); });
  };
  if (const config::RopeScaling& r = m.rope_scaling; r.longrope) {
    absl::StrAppendFormat(&yaml,
                          "  rope_scaling: {type: longrope, original_max_seq: %d, short_factor: "
                          "[%s], long_factor: [%s], attention_factor: %.9g}\n",
                          r.original_max_seq, floats(r.short_factor), floats(r.long_factor),
                          r.attention_factor);
  } else if (r.yarn) {
    absl::StrAppendFormat(&yaml,
                          "  rope_scaling: {type: yarn, factor: %.9g, original_max_seq: %d, "
                          "beta_fast: %.9g, beta_slow: %.9g, truncate: %s, attention_factor: "
                          "%.9g}\n",
                          r.factor, r.original_max_seq, r.beta_fast, r.beta_slow,
                          r.truncate ? "true" : "false", r.attention_factor);
  } else if (r.enabled() && r.linear) {
    absl::StrAppendFormat(&yaml, "  rope_scaling: {type: linear, factor: %.9g}\n", r.factor);
  } else if (r.enabled()) {
    absl::StrAppendFormat(&yaml,
                          "  rope_scaling: {type: llama3, factor: %.9g, low_freq_factor: %.9g, "
                          "high_freq_factor: %.9g, original_max_seq: %d}\n",
                          r.factor, r.low_freq_factor, r.high_freq_factor, r.original_max_seq);
  }
  if (m.moe.enabled()) AppendMoeYaml(m.moe, &yaml);
  if (const config::LatentAttention& l = m.latent; l.enabled()) {
    absl::StrAppend(&yaml, "  latent_attention: {q_rank: ", l.q_rank, ", kv_rank: ", l.kv_rank,
                    ", value_dim: ", l.value_dim, "}\n");
  }
  // No evaluation: the default data's validation stream need not hold a window of any length.
  absl::StrAppendFormat(&yaml,
                        "training:\n  batch: %d\n  micro_batch: %d\n  seq_len: %d\n"
                        "  eval_every: 0\n",
                        reference.training.batch, reference.training.micro_batch,
                        reference.training.seq_len);
  // The default data (a Markov chain over 32 tokens) must fit a smaller vocabulary.
  const int markov_vocab = config::MarkovSpec{}.vocab;
  if (m.vocab < markov_vocab) {
    absl::StrAppendFormat(&yaml, "data:\n  markov:\n    vocab: %d\n", m.vocab);
  }
  return yaml;
}

std::string CalibrationToJson(const Calibration& c) {
  std::vector<std::string> shared;
  for (const SharedRanksCalibration& s : c.shared) {
    shared.push_back(absl::StrCat("    {\"ranks\": ", s.entry.ranks, ", ",
                                  FiguresJson(s, SharedFigures(), ", "), "}"));
  }
  std::string profile = ProfileToJson(c.profile);
  profile.pop_back();  // its final newline; its lines are indented as a member's
  return absl::StrCat(
      "{\n  ", FiguresJson(c, CalibrationFigures(), ",\n  "),
      ",\n  \"reference_name\": ", JsonString(c.reference_name), ",\n  \"shared\": [",
      shared.empty() ? "" : "\n", absl::StrJoin(shared, ",\n"), shared.empty() ? "" : "\n  ",
      "],\n  \"profile\": ", absl::StrReplaceAll(profile, {{"\n", "\n  "}}), "\n}\n");
}

absl::StatusOr<Calibration> CalibrationFromJson(const std::string& json) {
  TY_ASSIGN_OR_RETURN(const config::YamlNode root, config::ParseYamlTree(json, "calibration"));
  Calibration c;
  TY_RETURN_IF_ERROR(ReadFigures(root, "", CalibrationFigures(), c));
  const config::YamlEntry* name = root.Find("reference_name");
  if (name == nullptr || name->value.kind != config::YamlNode::Kind::kScalar) {
    return absl::InvalidArgumentError("calibration: reference_name is not a string");
  }
  c.reference_name = name->value.value;
  TY_ASSIGN_OR_RETURN(c.shared, SharedFromNode(root));
  const config::YamlEntry* profile = root.Find("profile");
  if (profile == nullptr) return absl::InvalidArgumentError("calibration: profile is missing");
  absl::StatusOr<DeviceProfile> parsed = ProfileFromNode(profile->value);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("calibration: profile: ", parsed.status().message()));
  }
  c.profile = *std::move(parsed);
  return c;
}

}  // namespace trainyard::planner
