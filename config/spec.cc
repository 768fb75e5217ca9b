// ParseJobSpec: YAML text -> JobSpec. The YAML layer (yaml_tree) enforces the size, depth and
// alias limits; FieldReader enforces types and known fields; FindSpecProblem the cross-field
// rules, whose field paths are mapped back to the line the user wrote.
#include "config/spec.h"

#include <algorithm>
#include <climits>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"
#include "common/text_check.h"
#include "config/field_reader.h"
#include "config/mesh.h"
#include "config/run_sections.h"
#include "config/spec_validation.h"
#include "config/yaml_tree.h"

namespace trainyard::config {

std::string MetricLabelName(const std::string& key) {
  std::string name = "label_";
  for (char c : key) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
    name.push_back(ok ? c : '_');
  }
  return name;
}
namespace {

constexpr int kMaxDepth = 32;

absl::Status ReadPreset(FieldReader& r, ModelConfig* model) {
  std::string name;
  TY_RETURN_IF_ERROR(r.ReadString("preset", &name));
  absl::StatusOr<ModelConfig> preset = Preset(name);
  if (!preset.ok()) {
    const std::string suggestion = ClosestMatch(name, PresetNames());
    return r.ErrorAt(
        "preset", suggestion.empty()
                      ? absl::StrCat("unknown preset ", QuoteForMessage(name),
                                     " (known: ", absl::StrJoin(PresetNames(), ", "), ")")
                      : absl::StrCat("unknown preset ", QuoteForMessage(name), "; did you mean '",
                                     suggestion, "'?"));
  }
  *model = *preset;
  if (!r.Has("family")) return absl::OkStatus();
  std::string family_name;
  TY_RETURN_IF_ERROR(r.ReadString("family", &family_name));
  absl::StatusOr<ModelFamily> family = ParseFamily(family_name);
  if (!family.ok()) return r.ErrorAt("family", std::string(family.status().message()));
  if (*family != model->family) {
    return r.ErrorAt("family", absl::StrCat("preset '", name, "' is a ", FamilyName(model->family),
                                            " model, not ", family_name));
  }
  return absl::OkStatus();
}

// Without a preset, the family and every size must be given.
absl::Status ReadFamilyAndSizes(FieldReader& r, ModelConfig* model) {
  if (!r.Has("family")) {
    return r.ErrorAt("family", absl::StrCat("required when no preset is given (presets: ",
                                            absl::StrJoin(PresetNames(), ", "), ")"));
  }
  std::string family_name;
  TY_RETURN_IF_ERROR(r.ReadString("family", &family_name));
  absl::StatusOr<ModelFamily> family = ParseFamily(family_name);
  if (!family.ok()) return r.ErrorAt("family", std::string(family.status().message()));
  for (const char* key : {"layers", "width", "heads", "ffn_hidden", "vocab", "max_seq"}) {
    if (!r.Has(key)) return r.ErrorAt(key, "required when no preset is given");
  }
  *model = ModelConfig();
  model->family = *family;
  model->tied_embeddings = *family == ModelFamily::kGpt2;
  return absl::OkStatus();
}

// Reads `key`, when present, as one of `words` into `*index`; another word is refused ("unknown
// <what> ...") with the closest of them, else the list.
absl::Status ReadChoice(FieldReader& r, std::string_view key, const char* what,
                        const std::vector<std::string>& words, size_t* index) {
  if (!r.Has(key)) return absl::OkStatus();
  std::string word;
  TY_RETURN_IF_ERROR(r.ReadString(key, &word));
  const auto known = std::find(words.begin(), words.end(), word);
  if (known != words.end()) {
    *index = known - words.begin();
    return absl::OkStatus();
  }
  const std::string suggestion = ClosestMatch(word, words);
  return r.ErrorAt(key, absl::StrCat("unknown ", what, " ", QuoteForMessage(word),
                                     suggestion.empty()
                                         ? absl::StrCat("; expected ", absl::StrJoin(words, " or "))
                                         : absl::StrCat("; did you mean '", suggestion, "'?")));
}

// model.moe: `ffn_hidden` is the model's own (after its preset and defaults), each expert's
// default. A field the chosen balance rule does not use is refused: it is a mistake.
absl::Status ReadMoe(FieldReader& r, int ffn_hidden, MoeConfig* moe) {
  TY_RETURN_IF_ERROR(r.ExpectMapWithKeys(
      {"experts", "top_k", "shared_experts", "shared_gate", "every", "dense_first", "ffn", "score",
       "normalize_top_k", "routed_scale", "groups", "group_top_k", "group_score", "balance",
       "aux_loss_coeff", "bias_update_rate", "z_loss_coeff", "capacity_factor"}));
  if (!r.Has("experts")) {
    return r.ErrorAt("experts", "required: the routed experts of each MoE block");
  }
  TY_RETURN_IF_ERROR(r.ReadInt("experts", &moe->experts));
  if (moe->experts == 0) {
    return r.ErrorAt("experts", "must be at least 1 (a dense model leaves out model.moe)");
  }
  TY_RETURN_IF_ERROR(r.ReadInt("top_k", &moe->top_k));
  TY_RETURN_IF_ERROR(r.ReadInt("shared_experts", &moe->shared_experts));
  TY_RETURN_IF_ERROR(r.ReadBool("shared_gate", &moe->shared_gate));
  TY_RETURN_IF_ERROR(r.ReadInt("every", &moe->every));
  TY_RETURN_IF_ERROR(r.ReadInt("dense_first", &moe->dense_first));
  moe->ffn = ffn_hidden;
  TY_RETURN_IF_ERROR(r.ReadInt("ffn", &moe->ffn));
  size_t score = 0;
  TY_RETURN_IF_ERROR(ReadChoice(r, "score", "router score", {"softmax", "sigmoid"}, &score));
  moe->score = score == 0 ? MoeScore::kSoftmax : MoeScore::kSigmoid;
  // Sigmoid scores do not sum to one over the experts: by default a token's picks are weighed
  // by their share of the picks' sum.
  moe->normalize_top_k = moe->score == MoeScore::kSigmoid;
  TY_RETURN_IF_ERROR(r.ReadBool("normalize_top_k", &moe->normalize_top_k));
  TY_RETURN_IF_ERROR(r.ReadFloat("routed_scale", &moe->routed_scale));
  TY_RETURN_IF_ERROR(r.ReadInt("groups", &moe->groups));
  TY_RETURN_IF_ERROR(r.ReadInt("group_top_k", &moe->group_top_k));
  if (r.Has("group_score") && !moe->limits_groups()) {
    TY_RETURN_IF_ERROR(
        r.Inert("group_score", "only scores groups when group_top_k keeps fewer than groups"));
  }
  size_t group_score = 0;
  TY_RETURN_IF_ERROR(
      ReadChoice(r, "group_score", "group score", {"top2_sum", "max"}, &group_score));
  moe->group_score = group_score == 0 ? GroupScore::kTopTwoSum : GroupScore::kMax;
  size_t balance = 0;
  TY_RETURN_IF_ERROR(ReadChoice(r, "balance", "balance rule", {"aux_loss", "bias"}, &balance));
  moe->balance = balance == 0 ? MoeBalance::kAuxLoss : MoeBalance::kBias;
  if (moe->balance == MoeBalance::kBias && r.Has("aux_loss_coeff")) {
    TY_RETURN_IF_ERROR(r.Inert("aux_loss_coeff",
                               "only used with balance: aux_loss (this model balances "
                               "its experts with a selection bias)"));
  }
  if (moe->balance == MoeBalance::kAuxLoss && r.Has("bias_update_rate")) {
    TY_RETURN_IF_ERROR(r.Inert("bias_update_rate",
                               "only used with balance: bias (this model balances its experts "
                               "with an auxiliary loss)"));
  }
  TY_RETURN_IF_ERROR(r.ReadFloat("aux_loss_coeff", &moe->aux_loss_coeff));
  TY_RETURN_IF_ERROR(r.ReadFloat("bias_update_rate", &moe->bias_update_rate));
  TY_RETURN_IF_ERROR(r.ReadFloat("z_loss_coeff", &moe->z_loss_coeff));
  TY_RETURN_IF_ERROR(r.ReadFloat("capacity_factor", &moe->capacity_factor));
  return absl::OkStatus();
}

// LongRoPE's fields; attention_factor defaults to the paper's for max_seq over original_max_seq.
absl::Status ReadLongRope(FieldReader& r, int max_seq, RopeScaling* scaling) {
  for (const char* key :
       {"factor", "low_freq_factor", "high_freq_factor", "beta_fast", "beta_slow", "truncate"}) {
    if (r.Has(key)) {
      return r.ErrorAt(key,
                       "is not longrope's (its pairs' factors are short_factor and long_factor)");
    }
  }
  for (const char* key : {"short_factor", "long_factor", "original_max_seq"}) {
    if (!r.Has(key)) {
      return r.ErrorAt(key,
                       "required by longrope (one factor per rotated pair in each list, and "
                       "the context the short factors serve)");
    }
  }
  scaling->longrope = true;
  TY_RETURN_IF_ERROR(r.ReadFloatList("short_factor", &scaling->short_factor));
  TY_RETURN_IF_ERROR(r.ReadFloatList("long_factor", &scaling->long_factor));
  TY_RETURN_IF_ERROR(r.ReadInt("original_max_seq", &scaling->original_max_seq));
  scaling->attention_factor = LongRopeAttentionFactor(
      static_cast<double>(max_seq) / scaling->original_max_seq, scaling->original_max_seq);
  return r.ReadFloat("attention_factor", &scaling->attention_factor);
}

// YaRN's fields; attention_factor defaults to the paper's for `factor`.
absl::Status ReadYarn(FieldReader& r, RopeScaling* scaling) {
  for (const char* key : {"low_freq_factor", "high_freq_factor", "short_factor", "long_factor"}) {
    if (r.Has(key)) return r.ErrorAt(key, "is not yarn's");
  }
  for (const char* key : {"factor", "original_max_seq"}) {
    if (!r.Has(key)) {
      return r.ErrorAt(key,
                       "required by yarn (how many times longer the context is than the "
                       "original one, and that original context)");
    }
  }
  scaling->yarn = true;
  TY_RETURN_IF_ERROR(r.ReadFloat("factor", &scaling->factor));
  TY_RETURN_IF_ERROR(r.ReadInt("original_max_seq", &scaling->original_max_seq));
  TY_RETURN_IF_ERROR(r.ReadFloat("beta_fast", &scaling->beta_fast));
  TY_RETURN_IF_ERROR(r.ReadFloat("beta_slow", &scaling->beta_slow));
  TY_RETURN_IF_ERROR(r.ReadBool("truncate", &scaling->truncate));
  scaling->attention_factor = YarnAttentionFactor(scaling->factor);
  return r.ReadFloat("attention_factor", &scaling->attention_factor);
}

absl::Status ReadRopeScaling(FieldReader& r, int max_seq, RopeScaling* scaling) {
  TY_RETURN_IF_ERROR(r.ExpectMapWithKeys(
      {"type", "factor", "low_freq_factor", "high_freq_factor", "original_max_seq", "short_factor",
       "long_factor", "attention_factor", "beta_fast", "beta_slow", "truncate"}));
  std::string type;
  TY_RETURN_IF_ERROR(r.ReadString("type", &type));
  if (type != "llama3" && type != "linear" && type != "longrope" && type != "yarn") {
    return r.ErrorAt("type", absl::StrCat(r.Has("type") ? "is '" + type + "'; it " : "",
                                          "must be llama3 (Llama 3's scaling), linear (position "
                                          "interpolation), longrope (Phi-3.5's) or yarn, the ones "
                                          "Trainyard computes"));
  }
  if (type == "longrope") return ReadLongRope(r, max_seq, scaling);
  if (type == "yarn") return ReadYarn(r, scaling);
  for (const char* key : {"beta_fast", "beta_slow", "truncate"}) {
    if (r.Has(key)) return r.ErrorAt(key, "is yarn's (type yarn)");
  }
  for (const char* key : {"short_factor", "long_factor"}) {
    if (r.Has(key)) return r.ErrorAt(key, "is longrope's (type longrope)");
  }
  if (r.Has("attention_factor")) {
    return r.ErrorAt("attention_factor", "is longrope's or yarn's (type longrope or yarn)");
  }
  if (!r.Has("factor")) {
    return r.ErrorAt("factor", "required: how many times longer the context is than before");
  }
  TY_RETURN_IF_ERROR(r.ReadFloat("factor", &scaling->factor));
  scaling->linear = type == "linear";
  if (scaling->linear) {
    for (const char* key : {"low_freq_factor", "high_freq_factor", "original_max_seq"}) {
      if (r.Has(key)) return r.ErrorAt(key, "is Llama 3's (type llama3); linear scaling has none");
    }
    return absl::OkStatus();
  }
  TY_RETURN_IF_ERROR(r.ReadFloat("low_freq_factor", &scaling->low_freq_factor));
  TY_RETURN_IF_ERROR(r.ReadFloat("high_freq_factor", &scaling->high_freq_factor));
  return r.ReadInt("original_max_seq", &scaling->original_max_seq);
}

// model's word-valued fields: activation, and qk_norm_span (refused as a field without effect
// unless qk_norm).
absl::Status ReadModelChoices(FieldReader& r, ModelConfig& m) {
  size_t activation = m.geglu ? 1 : 0;
  TY_RETURN_IF_ERROR(ReadChoice(r, "activation", "activation", {"swiglu", "geglu"}, &activation));
  m.geglu = activation == 1;
  size_t span = m.qk_norm_span == QkNormSpan::kProjection ? 1 : 0;
  TY_RETURN_IF_ERROR(ReadChoice(r, "qk_norm_span", "norm span", {"head", "projection"}, &span));
  m.qk_norm_span = span == 1 ? QkNormSpan::kProjection : QkNormSpan::kHead;
  if (r.Has("qk_norm_span") && !m.qk_norm) {
    TY_RETURN_IF_ERROR(r.Inert("qk_norm_span", "only spans the norms of model.qk_norm: true"));
    m.qk_norm_span = QkNormSpan::kHead;
  }
  return absl::OkStatus();
}

// model.latent_attention, read once the heads' width and rotary part are known: value heads as
// wide as the heads' other part unless given (DeepSeek-V2's and V3's are).
absl::Status ReadLatent(FieldReader& r, const ModelConfig& m, LatentAttention* latent) {
  TY_RETURN_IF_ERROR(r.ExpectMapWithKeys({"q_rank", "kv_rank", "value_dim", "norm_eps"}));
  if (!r.Has("kv_rank")) {
    return r.ErrorAt("kv_rank", "required: the rank of the latent the keys and values come from");
  }
  TY_RETURN_IF_ERROR(r.ReadInt("q_rank", &latent->q_rank));
  TY_RETURN_IF_ERROR(r.ReadInt("kv_rank", &latent->kv_rank));
  latent->value_dim = m.head_dim() - m.rope_dim;
  TY_RETURN_IF_ERROR(r.ReadInt("value_dim", &latent->value_dim));
  return r.ReadFloat("norm_eps", &latent->norm_eps);
}

// model's fields that change which keys a query sees, how its scores and the logits are
// shaped, and the objective: the sliding window and what goes with it, the documents, the
// scores' scale and caps, and the logits' z-loss.
absl::Status ReadAttentionAndLoss(FieldReader& r, ModelConfig& m) {
  TY_RETURN_IF_ERROR(r.ReadInt("sliding_window", &m.sliding_window));
  TY_RETURN_IF_ERROR(r.ReadInt32List("full_attention_layers", &m.full_attention_layers));
  TY_RETURN_IF_ERROR(r.ReadFloat("rope_local_theta", &m.rope_local_theta));
  TY_RETURN_IF_ERROR(r.ReadInt("document_token", &m.document_token));
  TY_RETURN_IF_ERROR(r.ReadInt("attention_scale_dim", &m.attention_scale_dim));
  TY_RETURN_IF_ERROR(r.ReadFloat("attention_softcap", &m.attention_softcap));
  TY_RETURN_IF_ERROR(r.ReadFloat("logit_softcap", &m.logit_softcap));
  return r.ReadFloat("z_loss_coeff", &m.z_loss_coeff);
}

absl::StatusOr<ModelConfig> ReadModel(FieldReader& r) {
  TY_RETURN_IF_ERROR(r.ExpectMapWithKeys({"preset",
                                          "family",
                                          "layers",
                                          "width",
                                          "heads",
                                          "kv_heads",
                                          "head_dim",
                                          "ffn_hidden",
                                          "vocab",
                                          "max_seq",
                                          "tied_embeddings",
                                          "qkv_bias",
                                          "qk_norm",
                                          "qk_norm_span",
                                          "sliding_window",
                                          "activation",
                                          "scale_embeddings",
                                          "norm_eps",
                                          "rope_theta",
                                          "rope_dim",
                                          "nope_layers",
                                          "rope_scaling",
                                          "recompute",
                                          "moe",
                                          "latent_attention",
                                          "init_from",
                                          "full_attention_layers",
                                          "rope_local_theta",
                                          "post_norms",
                                          "pre_norms",
                                          "attention_scale_dim",
                                          "attention_softcap",
                                          "logit_softcap",
                                          "z_loss_coeff",
                                          "document_token",
                                          "embedding_multiplier",
                                          "residual_multiplier",
                                          "attention_multiplier",
                                          "logits_scaling"}));
  ModelConfig m;
  if (r.Has("preset")) {
    TY_RETURN_IF_ERROR(ReadPreset(r, &m));
  } else {
    TY_RETURN_IF_ERROR(ReadFamilyAndSizes(r, &m));
  }
  TY_RETURN_IF_ERROR(r.ReadInt("layers", &m.layers));
  TY_RETURN_IF_ERROR(r.ReadInt("width", &m.width));
  TY_RETURN_IF_ERROR(r.ReadInt("heads", &m.heads));
  TY_RETURN_IF_ERROR(r.ReadInt("kv_heads", &m.kv_heads));
  TY_RETURN_IF_ERROR(r.ReadInt("head_dim", &m.explicit_head_dim));
  TY_RETURN_IF_ERROR(r.ReadInt("ffn_hidden", &m.ffn_hidden));
  TY_RETURN_IF_ERROR(r.ReadInt("vocab", &m.vocab));
  TY_RETURN_IF_ERROR(r.ReadInt("max_seq", &m.max_seq));
  TY_RETURN_IF_ERROR(r.ReadBool("tied_embeddings", &m.tied_embeddings));
  TY_RETURN_IF_ERROR(r.ReadBool("qkv_bias", &m.qkv_bias));
  TY_RETURN_IF_ERROR(r.ReadBool("qk_norm", &m.qk_norm));
  TY_RETURN_IF_ERROR(ReadAttentionAndLoss(r, m));
  TY_RETURN_IF_ERROR(r.ReadBool("post_norms", &m.post_norms));
  TY_RETURN_IF_ERROR(r.ReadBool("pre_norms", &m.pre_norms));
  TY_RETURN_IF_ERROR(r.ReadFloat("embedding_multiplier", &m.embedding_multiplier));
  TY_RETURN_IF_ERROR(r.ReadFloat("residual_multiplier", &m.residual_multiplier));
  TY_RETURN_IF_ERROR(r.ReadFloat("attention_multiplier", &m.attention_multiplier));
  TY_RETURN_IF_ERROR(r.ReadFloat("logits_scaling", &m.logits_scaling));
  TY_RETURN_IF_ERROR(ReadModelChoices(r, m));
  TY_RETURN_IF_ERROR(r.ReadBool("scale_embeddings", &m.scale_embeddings));
  TY_RETURN_IF_ERROR(r.ReadBool("recompute", &m.recompute));
  TY_RETURN_IF_ERROR(r.ReadFloat("norm_eps", &m.norm_eps));
  TY_RETURN_IF_ERROR(r.ReadFloat("rope_theta", &m.rope_theta));
  // Sizes that follow from others unless given: GPT-2 has one key/value head per query head and
  // a 4x MLP; without a preset, kv_heads defaults to heads for both families.
  const bool gpt2 = m.family == ModelFamily::kGpt2;
  if (!r.Has("kv_heads") && (gpt2 || !r.Has("preset"))) m.kv_heads = m.heads;
  if (gpt2 && r.Has("width") && !r.Has("ffn_hidden") && m.width > 0 && m.width <= INT_MAX / 4) {
    m.ffn_hidden = 4 * m.width;
  }
  if (gpt2 && r.Has("activation")) {
    return r.ErrorAt("activation",
                     "is for the llama family (the gpt2 family's MLP is GELU, ungated)");
  }
  for (const char* key : {"rope_theta", "rope_dim", "nope_layers", "rope_scaling"}) {
    if (gpt2 && r.Has(key)) {
      TY_RETURN_IF_ERROR(r.Inert(key, "only the llama family uses rotary position embeddings"));
    }
  }
  if (!gpt2) TY_RETURN_IF_ERROR(r.ReadInt("rope_dim", &m.rope_dim));
  if (!gpt2) TY_RETURN_IF_ERROR(r.ReadInt32List("nope_layers", &m.nope_layers));
  if (std::optional<FieldReader> scaling = r.Child("rope_scaling"); scaling && !gpt2) {
    TY_RETURN_IF_ERROR(ReadRopeScaling(*scaling, m.max_seq, &m.rope_scaling));
  }
  if (std::optional<FieldReader> moe = r.Child("moe")) {
    TY_RETURN_IF_ERROR(ReadMoe(*moe, m.ffn_hidden, &m.moe));
  }
  if (std::optional<FieldReader> latent = r.Child("latent_attention")) {
    TY_RETURN_IF_ERROR(ReadLatent(*latent, m, &m.latent));
  }
  return m;
}

absl::Status ReadMarkov(FieldReader& r, MarkovSpec* m) {
  TY_RETURN_IF_ERROR(r.ExpectMapWithKeys(
      {"order", "vocab", "concentration", "train_tokens", "val_tokens", "seed"}));
  TY_RETURN_IF_ERROR(r.ReadInt("order", &m->order));
  TY_RETURN_IF_ERROR(r.ReadInt("vocab", &m->vocab));
  TY_RETURN_IF_ERROR(r.ReadDouble("concentration", &m->concentration));
  TY_RETURN_IF_ERROR(r.ReadInt64("train_tokens", &m->train_tokens));
  TY_RETURN_IF_ERROR(r.ReadInt64("val_tokens", &m->val_tokens));
  TY_RETURN_IF_ERROR(r.ReadUint64("seed", &m->seed));
  return absl::OkStatus();
}

// Fields that the chosen source would silently ignore are refused: they are mistakes.
absl::Status CheckUnusedDataFields(FieldReader& r, const DataSpec& d) {
  if (d.source == "markov") {
    for (const char* key : {"path", "val_path", "val_fraction"}) {
      if (r.Has(key)) {
        TY_RETURN_IF_ERROR(r.Inert(key,
                                   "not used when source is markov (the chain generates its own "
                                   "validation stream, sized by markov.val_tokens)"));
      }
    }
  } else if (d.source == "bin" || d.source == "text") {
    if (r.Has("markov")) {
      TY_RETURN_IF_ERROR(r.Inert("markov", "only used when source is markov"));
    }
    if (r.Has("val_path") && r.Has("val_fraction")) {
      TY_RETURN_IF_ERROR(r.Inert("val_fraction", "not used when val_path is given"));
    }
  }
  return absl::OkStatus();
}

absl::Status ReadData(FieldReader& r, DataSpec* d) {
  TY_RETURN_IF_ERROR(r.ExpectMapWithKeys({"source", "path", "val_path", "val_fraction", "markov"}));
  TY_RETURN_IF_ERROR(r.ReadString("source", &d->source));
  TY_RETURN_IF_ERROR(r.ReadString("path", &d->path));
  TY_RETURN_IF_ERROR(r.ReadString("val_path", &d->val_path));
  TY_RETURN_IF_ERROR(r.ReadDouble("val_fraction", &d->val_fraction));
  if (std::optional<FieldReader> markov = r.Child("markov")) {
    TY_RETURN_IF_ERROR(ReadMarkov(*markov, &d->markov));
  }
  return CheckUnusedDataFields(r, *d);
}

// Fields that the rest of the training section would silently ignore are refused: they are
// mistakes. A negative sample_every or eval_every is left to FindSpecProblem, which names it.
absl::Status CheckUnusedTrainingFields(const FieldReader& r, const TrainingSpec& t) {
  if (t.sample_every == 0) {
    for (const char* key :
         {"sample_tokens", "sample_prompt", "sample_prompt_tokens", "sample_tokenizer",
          "sample_temperature", "sample_top_k", "sample_top_p"}) {
      if (r.Has(key)) {
        TY_RETURN_IF_ERROR(
            r.Inert(key, "only used when sample_every is positive (this job draws no samples)"));
      }
    }
  } else if (t.sample_temperature == 0) {
    for (const char* key : {"sample_top_k", "sample_top_p"}) {
      if (r.Has(key)) {
        TY_RETURN_IF_ERROR(r.Inert(key,
                                   "not used when sample_temperature is 0 (greedy sampling takes "
                                   "the most likely token)"));
      }
    }
  }
  if (t.eval_every == 0 && r.Has("eval_batches")) {
    TY_RETURN_IF_ERROR(r.Inert("eval_batches",
                               "only used when eval_every is positive (this job never evaluates)"));
  }
  // (An unknown schedule is left to FindSpecProblem, which suggests the closest.)
  const bool decays_from_warmup =
      t.schedule == "cosine" || t.schedule == "linear" || t.schedule == "constant";
  for (const char* key : {"decay_steps", "decay_shape"}) {
    if (decays_from_warmup && r.Has(key)) {
      TY_RETURN_IF_ERROR(
          r.Inert(key, absl::StrCat("only used with schedule: wsd (this job's ", t.schedule,
                                    " schedule runs from the warmup's end to the last step)")));
    }
  }
  if (t.schedule == "constant" && r.Has("min_lr_ratio")) {
    TY_RETURN_IF_ERROR(r.Inert("min_lr_ratio",
                               "not used with schedule: constant (the learning rate stays at lr "
                               "after warmup)"));
  }
  return absl::OkStatus();
}

absl::Status ReadTraining(FieldReader& r, TrainingSpec* t) {
  TY_RETURN_IF_ERROR(r.ExpectMapWithKeys({"steps",
                                          "batch",
                                          "micro_batch",
                                          "seq_len",
                                          "seed",
                                          "lr",
                                          "min_lr_ratio",
                                          "warmup_steps",
                                          "schedule",
                                          "decay_steps",
                                          "decay_shape",
                                          "weight_decay",
                                          "beta1",
                                          "beta2",
                                          "eps",
                                          "grad_clip",
                                          "eval_every",
                                          "eval_batches",
                                          "log_every",
                                          "threads",
                                          "sample_every",
                                          "sample_tokens",
                                          "sample_prompt",
                                          "sample_prompt_tokens",
                                          "sample_tokenizer",
                                          "sample_temperature",
                                          "sample_top_k",
                                          "sample_top_p"}));
  TY_RETURN_IF_ERROR(r.ReadInt64("steps", &t->steps));
  TY_RETURN_IF_ERROR(r.ReadInt("batch", &t->batch));
  TY_RETURN_IF_ERROR(r.ReadInt("micro_batch", &t->micro_batch));
  TY_RETURN_IF_ERROR(r.ReadInt("seq_len", &t->seq_len));
  TY_RETURN_IF_ERROR(r.ReadUint64("seed", &t->seed));
  TY_RETURN_IF_ERROR(r.ReadDouble("lr", &t->lr));
  TY_RETURN_IF_ERROR(r.ReadDouble("min_lr_ratio", &t->min_lr_ratio));
  TY_RETURN_IF_ERROR(r.ReadInt64("warmup_steps", &t->warmup_steps));
  // The default fits every run: a run shorter than it warms up over all of its steps.
  if (!r.Has("warmup_steps") && t->steps > 0) {
    t->warmup_steps = std::min(t->warmup_steps, t->steps);
  }
  TY_RETURN_IF_ERROR(r.ReadString("schedule", &t->schedule));
  TY_RETURN_IF_ERROR(r.ReadInt64("decay_steps", &t->decay_steps));
  TY_RETURN_IF_ERROR(r.ReadString("decay_shape", &t->decay_shape));
  TY_RETURN_IF_ERROR(r.ReadDouble("weight_decay", &t->weight_decay));
  TY_RETURN_IF_ERROR(r.ReadDouble("beta1", &t->beta1));
  TY_RETURN_IF_ERROR(r.ReadDouble("beta2", &t->beta2));
  TY_RETURN_IF_ERROR(r.ReadDouble("eps", &t->eps));
  TY_RETURN_IF_ERROR(r.ReadDouble("grad_clip", &t->grad_clip));
  TY_RETURN_IF_ERROR(r.ReadInt64("eval_every", &t->eval_every));
  TY_RETURN_IF_ERROR(r.ReadInt("eval_batches", &t->eval_batches));
  TY_RETURN_IF_ERROR(r.ReadInt64("log_every", &t->log_every));
  TY_RETURN_IF_ERROR(r.ReadInt("threads", &t->threads));
  TY_RETURN_IF_ERROR(r.ReadInt64("sample_every", &t->sample_every));
  TY_RETURN_IF_ERROR(r.ReadInt("sample_tokens", &t->sample_tokens));
  TY_RETURN_IF_ERROR(r.ReadString("sample_prompt", &t->sample_prompt));
  TY_RETURN_IF_ERROR(r.ReadInt32List("sample_prompt_tokens", &t->sample_prompt_tokens));
  TY_RETURN_IF_ERROR(r.ReadString("sample_tokenizer", &t->sample_tokenizer));
  if (r.Has("sample_tokenizer") && t->sample_tokenizer.empty()) {
    return r.ErrorAt("sample_tokenizer", "must not be empty");
  }
  TY_RETURN_IF_ERROR(r.ReadDouble("sample_temperature", &t->sample_temperature));
  TY_RETURN_IF_ERROR(r.ReadInt("sample_top_k", &t->sample_top_k));
  TY_RETURN_IF_ERROR(r.ReadDouble("sample_top_p", &t->sample_top_p));
  return CheckUnusedTrainingFields(r, *t);
}

absl::StatusOr<JobSpec> ReadJobSpec(FieldReader& top) {
  TY_RETURN_IF_ERROR(
      top.ExpectMapWithKeys({"name", "model", "data", "training", "parallelism", "resources",
                             "checkpoint", "fault_tolerance", "priority", "labels"}));
  JobSpec spec;
  TY_RETURN_IF_ERROR(top.Require("name"));
  TY_RETURN_IF_ERROR(top.ReadString("name", &spec.name));
  TY_RETURN_IF_ERROR(top.Require("model"));
  std::optional<FieldReader> model = top.Child("model");
  TY_ASSIGN_OR_RETURN(spec.model, ReadModel(*model));
  TY_RETURN_IF_ERROR(model->ReadString("init_from", &spec.init_from));
  if (model->Has("init_from") && spec.init_from.empty()) {
    return model->ErrorAt("init_from", "must not be empty");
  }
  if (std::optional<FieldReader> data = top.Child("data")) {
    TY_RETURN_IF_ERROR(ReadData(*data, &spec.data));
  }
  std::optional<FieldReader> training = top.Child("training");
  if (training) {
    TY_RETURN_IF_ERROR(ReadTraining(*training, &spec.training));
  }
  TY_RETURN_IF_ERROR(ReadRunSections(top, &spec));
  // Threads size the CPU backend only (worker/parallel/placement.cc): a GPU rank ignores them.
  if (training && training->Has("threads") && spec.resources.kind == DeviceKind::kGpu) {
    TY_RETURN_IF_ERROR(
        training->Inert("threads", "only used by CPU ranks (resources.kind is gpu)"));
  }
  return spec;
}

// `parallelism: auto` becomes a concrete mesh here; when none fits, FindSpecProblem explains.
void ResolveAutomaticMesh(JobSpec* spec) {
  if (!spec->parallelism.automatic) return;
  absl::StatusOr<ParallelismSpec> chosen = ChooseParallelism(*spec);
  if (chosen.ok()) spec->parallelism = *chosen;
}

// The field itself if the user wrote it, else the first related field they wrote, else the
// nearest enclosing mapping.
YamlMark LocateProblem(const SpecProblem& problem, const SpecLocations& locations) {
  if (locations.Has(problem.path)) return locations.Find(problem.path);
  for (const std::string& related : problem.related) {
    if (locations.Has(related)) return locations.Find(related);
  }
  return locations.Find(problem.path);
}

absl::StatusOr<JobSpec> Parse(std::string_view yaml_text, std::string_view source_name,
                              const SpecLimits& limits, InertFields* inert) {
  if (std::optional<TextProblem> bad = FindTextProblem(yaml_text)) {
    return LocatedError(source_name, YamlMark{bad->line, bad->column}, "", bad->what);
  }
  TY_ASSIGN_OR_RETURN(const YamlNode root,
                      ParseYamlTree(yaml_text, source_name, YamlLimits{kMaxSpecBytes, kMaxDepth}));
  SpecLocations locations;
  FieldReader top(root, "", std::string(source_name), &locations, inert);
  TY_ASSIGN_OR_RETURN(JobSpec spec, ReadJobSpec(top));
  ResolveAutomaticMesh(&spec);
  if (std::optional<SpecProblem> problem = FindSpecProblem(spec, limits)) {
    return LocatedError(source_name, LocateProblem(*problem, locations), problem->path,
                        problem->reason);
  }
  return spec;
}

}  // namespace

std::string DeviceKindName(DeviceKind kind) { return kind == DeviceKind::kGpu ? "gpu" : "cpu"; }

absl::StatusOr<JobSpec> ParseJobSpec(std::string_view yaml_text, std::string_view source_name,
                                     const SpecLimits& limits) {
  InertFields refused;
  return Parse(yaml_text, source_name, limits, &refused);
}

absl::StatusOr<JobSpec> ParseStoredJobSpec(std::string_view yaml_text, std::string_view source_name,
                                           std::vector<std::string>* ignored) {
  InertFields inert{.refuse = false};
  absl::StatusOr<JobSpec> spec = Parse(yaml_text, source_name, SpecLimits(), &inert);
  if (ignored != nullptr) *ignored = std::move(inert.ignored);
  return spec;
}

absl::StatusOr<JobSpec> LoadJobSpec(FileSystem& fs, const std::string& path,
                                    const SpecLimits& limits) {
  TY_ASSIGN_OR_RETURN(const uint64_t size, fs.FileSize(path));
  if (size > kMaxSpecBytes) {
    return LocatedError(path, YamlMark{}, "",
                        absl::StrCat("the spec is ", size, " bytes; the limit is ", kMaxSpecBytes));
  }
  TY_ASSIGN_OR_RETURN(const std::string text, fs.ReadFile(path));
  return ParseJobSpec(text, path, limits);
}

}  // namespace trainyard::config
