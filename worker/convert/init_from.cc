#include "worker/convert/init_from.h"

#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <cstring>
#include <initializer_list>
#include <set>
#include <tuple>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/bf16.h"
#include "common/status.h"
#include "worker/shape/tensor_slices.h"

namespace trainyard::worker::convert {
namespace {

using config::ModelConfig;
using config::ModelFamily;

constexpr int32_t kLlmcMagic = 20240326;
constexpr int64_t kLlmcHeaderInts = 256;

std::string ShapeText(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) absl::StrAppend(&out, i ? ", " : "", shape[i]);
  return out + "]";
}

// Tensors a published file may carry that are not parameters: GPT-2's old causal-mask buffers
// and Llama's RoPE frequencies.
bool IsBuffer(const std::string& name) {
  return absl::EndsWith(name, ".attn.bias") || absl::EndsWith(name, ".attn.masked_bias") ||
         absl::EndsWith(name, "rotary_emb.inv_freq");
}

// The safetensors files of a Hugging Face directory: model.safetensors, or the shards its index
// names (each once).
absl::StatusOr<std::vector<std::string>> ShardNames(FileSystem& fs, const std::string& dir,
                                                    std::map<std::string, std::string>* wanted) {
  const std::string index = ChildPath(dir, "model.safetensors.index.json");
  if (!fs.Exists(index)) {
    if (!fs.Exists(ChildPath(dir, "model.safetensors"))) {
      return absl::InvalidArgumentError(
          absl::StrCat(dir, ": neither model.safetensors nor model.safetensors.index.json"));
    }
    return std::vector<std::string>{"model.safetensors"};
  }
  TY_ASSIGN_OR_RETURN(const std::string text, fs.ReadFile(index));
  google::protobuf::Struct parsed;
  auto map = parsed.fields().end();
  if (google::protobuf::util::JsonStringToMessage(text, &parsed).ok()) {
    map = parsed.fields().find("weight_map");
  }
  if (map == parsed.fields().end() ||
      map->second.kind_case() != google::protobuf::Value::kStructValue) {
    return absl::InvalidArgumentError(absl::StrCat(index, ": not JSON with a weight_map object"));
  }
  std::set<std::string> files;
  for (const auto& [name, file] : map->second.struct_value().fields()) {
    const std::string& f = file.string_value();
    if (file.kind_case() != google::protobuf::Value::kStringValue || f.empty() ||
        absl::StrContains(f, "/") || f == "." || f == "..") {
      return absl::InvalidArgumentError(
          absl::StrCat(index, ": tensor ", name, " maps to something other than a file name"));
    }
    files.insert(f);
    (*wanted)[name] = f;
  }
  return std::vector<std::string>(files.begin(), files.end());
}

absl::Status Differ(const std::string& field, const std::string& in_file, const std::string& source,
                    const std::string& in_spec) {
  return absl::InvalidArgumentError(absl::StrCat("model.", field, " is ", in_file, " in ", source,
                                                 ", ", in_spec, " in the spec"));
}

// The integer fields of a model, each as (name, (value in the weights, value in the spec)).
using IntFields = std::initializer_list<std::pair<const char*, std::pair<int, int>>>;

// The first of `fields` whose two values differ, named; OK when none does.
absl::Status FirstDifference(IntFields fields, const std::string& source) {
  for (const auto& [field, values] : fields) {
    if (values.first != values.second) {
      return Differ(field, absl::StrCat(values.first), source, absl::StrCat(values.second));
    }
  }
  return absl::OkStatus();
}

// A yes-or-no field, shown as `yes` or `no` (the spec's own words for it).
absl::Status SameChoice(const char* field, bool in_file, bool in_spec, const std::string& source,
                        const char* yes = "true", const char* no = "false") {
  if (in_file == in_spec) return absl::OkStatus();
  return Differ(field, in_file ? yes : no, source, in_spec ? yes : no);
}

// An MoE model's experts and router (both have experts): its shapes, and the routing the
// weights were trained with.
absl::Status CheckSameExperts(const config::MoeConfig& file, const config::MoeConfig& spec,
                              const std::string& source) {
  TY_RETURN_IF_ERROR(
      FirstDifference({{"moe.ffn", {file.ffn, spec.ffn}},
                       {"moe.top_k", {file.top_k, spec.top_k}},
                       {"moe.shared_experts", {file.shared_experts, spec.shared_experts}},
                       {"moe.every", {file.every, spec.every}},
                       {"moe.dense_first", {file.dense_first, spec.dense_first}},
                       {"moe.groups", {file.groups, spec.groups}},
                       {"moe.group_top_k", {file.kept_groups(), spec.kept_groups()}}},
                      source));
  if (file.routed_scale != spec.routed_scale) {
    return Differ("moe.routed_scale", absl::StrCat(file.routed_scale), source,
                  absl::StrCat(spec.routed_scale));
  }
  TY_RETURN_IF_ERROR(SameChoice("moe.shared_gate", file.shared_gate, spec.shared_gate, source));
  using config::MoeScore;
  TY_RETURN_IF_ERROR(SameChoice("moe.score", file.score == MoeScore::kSoftmax,
                                spec.score == MoeScore::kSoftmax, source, "softmax", "sigmoid"));
  TY_RETURN_IF_ERROR(
      SameChoice("moe.normalize_top_k", file.normalize_top_k, spec.normalize_top_k, source));
  if (file.limits_groups()) {  // what scores the groups matters only when some are left out
    using config::GroupScore;
    TY_RETURN_IF_ERROR(SameChoice("moe.group_score", file.group_score == GroupScore::kMax,
                                  spec.group_score == GroupScore::kMax, source, "max", "top2_sum"));
  }
  return SameChoice("moe.balance", file.has_bias(), spec.has_bias(), source, "bias", "aux_loss");
}

// The factors the scores, embeddings, branches and logits are scaled or capped by (Gemma 2's and
// Granite's): OK when they are the same, else names the first that differs.
absl::Status CheckSameScores(const ModelConfig& file, const ModelConfig& spec,
                             const std::string& source) {
  auto num = [](auto v) { return absl::StrCat(v); };
  if (file.attention_scale() != spec.attention_scale()) {
    const bool multiplier = file.attention_multiplier != 0 || spec.attention_multiplier != 0;
    auto text = [multiplier](const ModelConfig& m) {
      if (multiplier) return absl::StrCat(m.attention_scale());
      return absl::StrCat(m.attention_scale_dim > 0 ? m.attention_scale_dim : m.head_dim());
    };
    return Differ(multiplier ? "attention_multiplier" : "attention_scale_dim", text(file), source,
                  text(spec));
  }
  for (const auto& [field, a, b] :
       {std::tuple{"embedding_multiplier", file.embedding_multiplier, spec.embedding_multiplier},
        std::tuple{"residual_multiplier", file.residual_multiplier, spec.residual_multiplier},
        std::tuple{"logits_scaling", file.logits_scaling, spec.logits_scaling}}) {
    if (a != b) return Differ(field, num(a), source, num(b));
  }
  for (const auto& [field, a, b] :
       {std::tuple{"attention_softcap", file.attention_softcap, spec.attention_softcap},
        std::tuple{"logit_softcap", file.logit_softcap, spec.logit_softcap}}) {
    if (a != b) return Differ(field, a == 0 ? "none" : num(a), source, b == 0 ? "none" : num(b));
  }
  return absl::OkStatus();
}

// Latent attention's ranks, value heads and its latents' epsilon (both models have it).
absl::Status CheckSameLatent(const config::LatentAttention& file,
                             const config::LatentAttention& spec, const std::string& source) {
  TY_RETURN_IF_ERROR(
      FirstDifference({{"latent_attention.q_rank", {file.q_rank, spec.q_rank}},
                       {"latent_attention.kv_rank", {file.kv_rank, spec.kv_rank}},
                       {"latent_attention.value_dim", {file.value_dim, spec.value_dim}}},
                      source));
  if (file.norm_eps != spec.norm_eps) {
    return Differ("latent_attention.norm_eps", absl::StrCat(file.norm_eps), source,
                  absl::StrCat(spec.norm_eps));
  }
  return absl::OkStatus();
}

// OK when `file` (the weights' model) is `spec`'s model; else names the first field that differs.
absl::Status CheckSameModel(const ModelConfig& file, const ModelConfig& spec,
                            const std::string& source) {
  auto num = [](auto v) { return absl::StrCat(v); };
  if (file.family != spec.family) {
    return Differ("family", config::FamilyName(file.family), source,
                  config::FamilyName(spec.family));
  }
  // A model whose every block is an MoE block has no dense MLP: its ffn_hidden means nothing.
  auto all_moe = [](const ModelConfig& m) { return m.moe.MoeLayers(m.layers) == m.layers; };
  const bool dense_mlps = !all_moe(file) || !all_moe(spec);
  TY_RETURN_IF_ERROR(FirstDifference(
      {{"moe.experts", {file.moe.experts, spec.moe.experts}},
       {"layers", {file.layers, spec.layers}},
       {"width", {file.width, spec.width}},
       {"heads", {file.heads, spec.heads}},
       {"kv_heads", {file.kv_heads, spec.kv_heads}},
       {"ffn_hidden", {dense_mlps ? file.ffn_hidden : 0, dense_mlps ? spec.ffn_hidden : 0}},
       {"vocab", {file.vocab, spec.vocab}}},
      source));
  if (file.moe.enabled()) TY_RETURN_IF_ERROR(CheckSameExperts(file.moe, spec.moe, source));
  // GPT-2's learned positions are a tensor; Llama's limit is not, and may differ.
  if (file.family == ModelFamily::kGpt2 && file.max_seq != spec.max_seq) {
    return Differ("max_seq", num(file.max_seq), source, num(spec.max_seq));
  }
  TY_RETURN_IF_ERROR(
      SameChoice("tied_embeddings", file.tied_embeddings, spec.tied_embeddings, source));
  TY_RETURN_IF_ERROR(SameChoice("qkv_bias", file.qkv_bias, spec.qkv_bias, source));
  TY_RETURN_IF_ERROR(SameChoice("qk_norm", file.qk_norm, spec.qk_norm, source));
  TY_RETURN_IF_ERROR(SameChoice("qk_norm_span", file.NormsWholeProjection(),
                                spec.NormsWholeProjection(), source, "projection", "head"));
  TY_RETURN_IF_ERROR(SameChoice("post_norms", file.post_norms, spec.post_norms, source));
  TY_RETURN_IF_ERROR(SameChoice("pre_norms", file.pre_norms, spec.pre_norms, source));
  TY_RETURN_IF_ERROR(
      SameChoice("scale_embeddings", file.scale_embeddings, spec.scale_embeddings, source));
  if (file.geglu != spec.geglu) {
    auto text = [](bool geglu) { return std::string(geglu ? "geglu" : "swiglu"); };
    return Differ("activation", text(file.geglu), source, text(spec.geglu));
  }
  TY_RETURN_IF_ERROR(SameChoice("latent_attention", file.latent.enabled(), spec.latent.enabled(),
                                source, "set", "none"));
  if (file.latent.enabled()) TY_RETURN_IF_ERROR(CheckSameLatent(file.latent, spec.latent, source));
  if (file.head_dim() != spec.head_dim()) {
    return Differ("head_dim", num(file.head_dim()), source, num(spec.head_dim()));
  }
  if (file.sliding_window != spec.sliding_window) {
    auto text = [](int w) { return w == 0 ? std::string("none") : absl::StrCat(w); };
    return Differ("sliding_window", text(file.sliding_window), source, text(spec.sliding_window));
  }
  auto layer_list = [](const std::vector<int32_t>& layers) {
    return layers.empty() ? std::string("none")
                          : absl::StrCat("[", absl::StrJoin(layers, ", "), "]");
  };
  if (file.full_attention_layers != spec.full_attention_layers) {
    return Differ("full_attention_layers", layer_list(file.full_attention_layers), source,
                  layer_list(spec.full_attention_layers));
  }
  if (file.norm_eps != spec.norm_eps) {
    return Differ("norm_eps", num(file.norm_eps), source, num(spec.norm_eps));
  }
  if (file.family == ModelFamily::kLlama && file.rope_theta != spec.rope_theta) {
    return Differ("rope_theta", num(file.rope_theta), source, num(spec.rope_theta));
  }
  TY_RETURN_IF_ERROR(CheckSameScores(file, spec, source));
  if (file.rope_local_theta != spec.rope_local_theta) {
    return Differ("rope_local_theta", num(file.rope_local_theta), source,
                  num(spec.rope_local_theta));
  }
  if (file.rotary_dim() != spec.rotary_dim()) {
    return Differ("rope_dim", absl::StrCat(file.rotary_dim()), source,
                  absl::StrCat(spec.rotary_dim()));
  }
  if (file.nope_layers != spec.nope_layers) {
    return Differ("nope_layers", layer_list(file.nope_layers), source,
                  layer_list(spec.nope_layers));
  }
  if (file.rope_scaling != spec.rope_scaling) {
    auto text = [](const config::RopeScaling& r) {
      if (r.longrope) {
        return absl::StrCat("longrope (original_max_seq ", r.original_max_seq, ", short_factor [",
                            absl::StrJoin(r.short_factor, ", "), "], long_factor [",
                            absl::StrJoin(r.long_factor, ", "), "], attention_factor ",
                            r.attention_factor, ")");
      }
      if (r.yarn) {
        return absl::StrCat("yarn (factor ", r.factor, ", original_max_seq ", r.original_max_seq,
                            ", beta_fast ", r.beta_fast, ", beta_slow ", r.beta_slow,
                            r.truncate ? "" : ", untruncated", ", attention_factor ",
                            r.attention_factor, ")");
      }
      if (r.enabled() && r.linear) return absl::StrCat("linear (factor ", r.factor, ")");
      return r.enabled()
                 ? absl::StrCat("llama3 (factor ", r.factor, ", low_freq_factor ",
                                r.low_freq_factor, ", high_freq_factor ", r.high_freq_factor,
                                ", original_max_seq ", r.original_max_seq, ")")
                 : std::string("none");
    };
    return Differ("rope_scaling", text(file.rope_scaling), source, text(spec.rope_scaling));
  }
  return absl::OkStatus();
}

}  // namespace

void HfSource::Read(int64_t begin, int64_t count, float* out) const {
  file->ReadFloats(*info, begin, count, out);
  if (scale == nullptr) return;
  const int64_t cols = info->shape[1], scale_cols = scale->shape[1];
  std::vector<float> row(scale_cols);
  int64_t loaded = -1;  // the block row `row` holds
  for (int64_t i = 0; i < count; ++i) {
    const int64_t e = begin + i, block_row = e / cols / block[0];
    if (block_row != loaded) {
      scale_file->ReadFloats(*scale, block_row * scale_cols, scale_cols, row.data());
      loaded = block_row;
    }
    out[i] *= row[e % cols / block[1]];
  }
}

WeightSource::~WeightSource() = default;

absl::Status WeightSource::AttachFp8Scales(const std::array<int64_t, 2>& block) {
  std::set<std::string> scales;
  for (auto& [key, source] : pieces_) {
    if (source.info->dtype != TensorDtype::kF8E4M3) continue;
    auto bad = [&](const std::string& why) {
      return absl::InvalidArgumentError(
          absl::StrCat(source.file->path(), ": tensor ", source.info->name, " ", why));
    };
    if (block[0] == 0) {
      return bad(
          "is F8_E4M3, but config.json has no quantization_config with quant_method fp8 "
          "and a weight_block_size");
    }
    if (source.info->shape.size() != 2) {
      return bad(absl::StrCat("is F8_E4M3 of shape ", ShapeText(source.info->shape),
                              " (Trainyard dequantizes 2-d weights only)"));
    }
    auto scale = pieces_.find(key + "_scale_inv");
    if (scale == pieces_.end()) return bad(absl::StrCat("is F8_E4M3 without ", key, "_scale_inv"));
    const std::vector<int64_t> want = {(source.info->shape[0] + block[0] - 1) / block[0],
                                       (source.info->shape[1] + block[1] - 1) / block[1]};
    if (scale->second.info->shape != want || scale->second.info->dtype == TensorDtype::kF8E4M3) {
      return bad(absl::StrCat("has scales ", scale->second.info->name, " of shape ",
                              ShapeText(scale->second.info->shape), " and dtype ",
                              DtypeName(scale->second.info->dtype), "; blocks of ", block[0], "×",
                              block[1], " need ", ShapeText(want), " of F32, BF16 or F16"));
    }
    source.scale_file = scale->second.file;
    source.scale = scale->second.info;
    source.block = block;
    scales.insert(scale->first);
  }
  for (const std::string& key : scales) pieces_.erase(key);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<WeightSource>> WeightSource::Open(
    FileSystem& fs, const std::string& path, const config::ModelConfig* expected) {
  if (!fs.Exists(path)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": no such file or directory"));
  }
  std::unique_ptr<WeightSource> source(new WeightSource());
  TY_RETURN_IF_ERROR(fs.IsDirectory(path) ? source->OpenHf(fs, path, expected)
                                          : source->OpenLlmc(fs, path, expected));
  return source;
}

absl::Status WeightSource::OpenHf(FileSystem& fs, const std::string& dir,
                                  const config::ModelConfig* expected) {
  const std::string config_path = ChildPath(dir, "config.json");
  if (!fs.Exists(config_path)) {
    return absl::InvalidArgumentError(absl::StrCat(
        dir, ": no config.json (a Hugging Face model directory, or an llm.c model file)"));
  }
  TY_ASSIGN_OR_RETURN(const std::string config_text, fs.ReadFile(config_path));
  HfLayout layout;
  TY_ASSIGN_OR_RETURN(model_, ModelFromHfConfig(config_text, config_path, &layout));
  if (expected) TY_RETURN_IF_ERROR(CheckSameModel(model_, *expected, config_path));
  std::map<std::string, std::string> wanted;  // from the index: tensor -> file
  TY_ASSIGN_OR_RETURN(const std::vector<std::string> names, ShardNames(fs, dir, &wanted));
  for (const std::string& name : names) {
    TY_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file,
                        SafetensorsFile::Open(fs, ChildPath(dir, name)));
    for (const TensorInfo& t : file->tensors()) {
      if (!wanted.empty() && (wanted.count(t.name) == 0 || wanted[t.name] != name)) {
        return absl::InvalidArgumentError(absl::StrCat(
            file->path(), ": tensor ", t.name, " is not where model.safetensors.index.json says"));
      }
      const std::optional<std::string> key = HfLookupName(t.name, model_.family, layout);
      if (!key) continue;  // a multimodal checkpoint's vision tower or projector
      if (!pieces_.emplace(*key, HfSource{file.get(), &t}).second) {
        return absl::InvalidArgumentError(
            absl::StrCat(file->path(), ": tensor ", t.name, " appears twice"));
      }
    }
    files_.push_back(std::move(file));
  }
  for (const auto& [name, file] : wanted) {
    const std::optional<std::string> key = HfLookupName(name, model_.family, layout);
    if (key && pieces_.count(*key) == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(ChildPath(dir, file), ": missing tensor ", name, " (the index lists it)"));
    }
  }
  TY_ASSIGN_OR_RETURN(const auto block, Fp8WeightBlock(config_text, config_path));
  TY_RETURN_IF_ERROR(AttachFp8Scales(block));
  TY_ASSIGN_OR_RETURN(std::vector<HfTensorMap> maps, HfTensors(model_, layout));
  std::set<std::string> claimed;
  for (HfTensorMap& m : maps) {
    for (const HfPiece& piece : m.pieces) {
      auto it = pieces_.find(piece.name);
      const std::string where = files_.size() == 1 ? files_[0]->path() : dir;
      if (it == pieces_.end()) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": missing tensor ", piece.name, " (config.json implies it)"));
      }
      const std::vector<int64_t> shape = HfShape(m, piece);
      if (it->second.info->shape != shape) {
        return absl::InvalidArgumentError(absl::StrCat(
            it->second.file->path(), ": tensor ", it->second.info->name, " has shape ",
            ShapeText(it->second.info->shape), ", config.json implies ", ShapeText(shape)));
      }
      claimed.insert(piece.name);
    }
    std::string name = m.name;
    maps_.emplace(std::move(name), std::move(m));
  }
  for (const auto& [key, where] : pieces_) {
    if (claimed.count(key) == 0 && !IsBuffer(key)) {
      return absl::InvalidArgumentError(
          absl::StrCat(where.file->path(), ": extra tensor ", where.info->name,
                       " (not part of the model config.json describes)"));
    }
  }
  description_ = absl::StrCat(
      "Hugging Face ", layout.model_type, layout.multimodal ? " (its language model)" : "", " (",
      block[0] > 0 ? absl::StrCat("FP8 in blocks of ", block[0], "×", block[1])
                   : DtypeName(files_[0]->tensors().empty() ? TensorDtype::kF32
                                                            : files_[0]->tensors()[0].dtype),
      ", ", files_.size(), files_.size() == 1 ? " file)" : " files)");
  return absl::OkStatus();
}

absl::Status WeightSource::OpenLlmc(FileSystem& fs, const std::string& file,
                                    const config::ModelConfig* expected) {
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat(file, ": ", why));
  };
  absl::StatusOr<std::unique_ptr<ReadOnlyRegion>> region = fs.MapReadOnly(file);
  if (!region.ok()) return bad(std::string(region.status().message()));
  llmc_ = *std::move(region);
  if (llmc_->size() < 4 * kLlmcHeaderInts) return bad("truncated: shorter than llm.c's header");
  int32_t h[8];
  std::memcpy(h, llmc_->data(), sizeof(h));
  if (h[0] != kLlmcMagic) {
    return bad(absl::StrCat("not an llm.c model file (magic ", h[0], ", want ", kLlmcMagic,
                            ") nor a Hugging Face directory"));
  }
  if (h[1] != 3 && h[1] != 5) {
    return bad(absl::StrCat("llm.c version ", h[1], " (Trainyard reads 3, fp32, and 5, bf16)"));
  }
  llmc_dtype_ = h[1] == 3 ? TensorDtype::kF32 : TensorDtype::kBF16;
  const int64_t max_t = h[2], v = h[3], layers = h[4], heads = h[5], c = h[6], vp = h[7];
  if (max_t < 1 || v < 1 || layers < 1 || heads < 1 || c < 1 || vp < v) {
    return bad(absl::StrCat("header sizes out of range (max_seq ", max_t, ", vocab ", v,
                            ", padded vocab ", vp, ", layers ", layers, ", heads ", heads,
                            ", channels ", c, ")"));
  }
  model_ = ModelConfig{.family = ModelFamily::kGpt2,
                       .layers = static_cast<int>(layers),
                       .width = static_cast<int>(c),
                       .heads = static_cast<int>(heads),
                       .kv_heads = static_cast<int>(heads),
                       .ffn_hidden = static_cast<int>(4 * c),
                       .vocab = static_cast<int>(v),
                       .max_seq = static_cast<int>(max_t),
                       .tied_embeddings = true};
  if (absl::Status valid = config::ValidateModelConfig(model_, file + ":"); !valid.ok()) {
    return valid;
  }
  if (expected) TY_RETURN_IF_ERROR(CheckSameModel(model_, *expected, file));
  // llm.c's order: every layer's tensor of one kind together.
  int64_t at = 0;
  auto add = [&](const std::string& name, int64_t numel, int64_t stride = 0) {
    llmc_offsets_[name] = {at, numel};
    at += stride > 0 ? stride : numel;
  };
  add("wte", v * c, vp * c);
  add("wpe", max_t * c);
  const std::pair<const char*, int64_t> per_layer[] = {{"ln1.w", c},
                                                       {"ln1.b", c},
                                                       {"attn.qkv.w", 3 * c * c},
                                                       {"attn.qkv.b", 3 * c},
                                                       {"attn.proj.w", c * c},
                                                       {"attn.proj.b", c},
                                                       {"ln2.w", c},
                                                       {"ln2.b", c},
                                                       {"mlp.fc.w", 4 * c * c},
                                                       {"mlp.fc.b", 4 * c},
                                                       {"mlp.proj.w", 4 * c * c},
                                                       {"mlp.proj.b", c}};
  for (const auto& [suffix, numel] : per_layer) {
    for (int64_t l = 0; l < layers; ++l) add(absl::StrCat("h.", l, ".", suffix), numel);
  }
  add("lnf.w", c);
  add("lnf.b", c);
  const uint64_t want = 4 * kLlmcHeaderInts + at * DtypeBytes(llmc_dtype_);
  if (llmc_->size() != want) {
    return bad(absl::StrCat(llmc_->size() < want ? "truncated: " : "", llmc_->size(),
                            " bytes, its header implies ", want));
  }
  description_ =
      absl::StrCat("llm.c GPT-2 (version ", h[1], ", ", h[1] == 3 ? "fp32" : "bf16", ")");
  return absl::OkStatus();
}

absl::Status WeightSource::ReadRange(const std::string& name, int64_t begin, int64_t count,
                                     float* out) const {
  if (llmc_) {
    auto it = llmc_offsets_.find(name);
    if (it == llmc_offsets_.end()) {
      return absl::InternalError(absl::StrCat("llm.c file has no tensor for ", name));
    }
    const int64_t at = it->second.first + begin;
    const uint8_t* data = llmc_->data() + 4 * kLlmcHeaderInts;
    if (llmc_dtype_ == TensorDtype::kF32) {
      std::memcpy(out, data + 4 * at, 4 * count);
    } else {
      for (int64_t i = 0; i < count; ++i) {
        uint16_t bits;
        std::memcpy(&bits, data + 2 * (at + i), 2);
        out[i] = Bf16BitsToFloat(bits);
      }
    }
    return absl::OkStatus();
  }
  auto it = maps_.find(name);
  if (it == maps_.end()) return absl::InternalError(absl::StrCat("no tensor maps to ", name));
  const HfTensorMap& m = it->second;
  const int64_t cols = RowElements(m);
  std::vector<float> segment;
  for (const HfPiece& piece : m.pieces) {
    const int64_t p0 = piece.row_begin * cols, p1 = p0 + piece.rows * cols;
    const int64_t lo = std::max(begin, p0), hi = std::min(begin + count, p1);
    if (lo >= hi) continue;
    const HfSource& source = pieces_.at(piece.name);
    if (!Reorders(piece)) {
      source.Read(lo - p0, hi - lo, out + (lo - begin));
      if (m.shift != 0.0f) {
        for (int64_t e = lo; e < hi; ++e) out[e - begin] += m.shift;
      }
      continue;
    }
    if (!piece.transpose) {  // interleaved heads: each of our rows is one of theirs
      for (int64_t e = lo; e < hi;) {
        const int64_t row = (e - p0) / cols, end = std::min(hi, p0 + (row + 1) * cols);
        const int64_t at = TheirRow(piece, row) * cols + (e - p0 - row * cols);
        source.Read(at, end - e, out + (e - begin));
        for (int64_t i = e; i < end; ++i) out[i - begin] += m.shift;
        e = end;
      }
      continue;
    }
    // Theirs is [cols, rows] of ours: our rows [r_lo, r_hi) of the piece are one segment of
    // each of its rows.
    const int64_t r_lo = (lo - p0) / cols, r_hi = (hi - p0 + cols - 1) / cols;
    segment.resize(r_hi - r_lo);
    for (int64_t c = 0; c < cols; ++c) {
      source.Read(c * piece.rows + r_lo, r_hi - r_lo, segment.data());
      for (int64_t r = r_lo; r < r_hi; ++r) {
        const int64_t e = p0 + r * cols + c;
        if (e >= lo && e < hi) out[e - begin] = segment[r - r_lo] + m.shift;
      }
    }
  }
  return absl::OkStatus();
}

absl::Status WeightSource::Read(const std::string& name, std::vector<float>& global) {
  if (llmc_) {
    auto it = llmc_offsets_.find(name);
    if (it == llmc_offsets_.end()) {
      return absl::InternalError(absl::StrCat("llm.c file has no tensor for ", name));
    }
    if (static_cast<int64_t>(global.size()) < it->second.second) global.resize(it->second.second);
    return ReadRange(name, 0, it->second.second, global.data());
  }
  auto it = maps_.find(name);
  if (it == maps_.end()) return absl::InternalError(absl::StrCat("no tensor maps to ", name));
  const HfTensorMap& m = it->second;
  int64_t numel = 1;
  for (int64_t d : m.shape) numel *= d;
  if (static_cast<int64_t>(global.size()) < numel) global.resize(numel);
  std::vector<float> theirs;
  for (const HfPiece& piece : m.pieces) {
    const HfSource& source = pieces_.at(piece.name);
    theirs.resize(source.info->numel());
    source.Read(0, source.info->numel(), theirs.data());
    FromHf(m, piece, theirs.data(), global.data());
  }
  return absl::OkStatus();
}

const float* WeightSource::Direct(const std::string& name) const {
  if (llmc_) {
    auto it = llmc_offsets_.find(name);
    if (llmc_dtype_ != TensorDtype::kF32 || it == llmc_offsets_.end()) return nullptr;
    return reinterpret_cast<const float*>(llmc_->data() + 4 * kLlmcHeaderInts) + it->second.first;
  }
  auto it = maps_.find(name);
  if (it == maps_.end() || it->second.pieces.size() != 1 || Reorders(it->second.pieces[0]) ||
      it->second.shift != 0.0f) {
    return nullptr;
  }
  const HfSource& source = pieces_.at(it->second.pieces[0].name);
  return source.scale == nullptr ? source.file->FloatData(*source.info) : nullptr;
}

absl::Status WeightSource::ReadLayout(const ParameterLayout& layout, float* host) {
  return ReadEach(layout, [&](const ParamTensor& t, const float* local) {
    std::copy(local, local + t.numel, host + t.offset);
  });
}

absl::Status WeightSource::ReadEach(
    const ParameterLayout& layout,
    const std::function<void(const ParamTensor& t, const float* local)>& put) {
  std::vector<float> global, local;
  for (const ParamTensor& t : layout.tensors()) {
    int64_t numel = 1;
    for (int64_t d : t.global_shape) numel *= d;
    if (t.numel == numel) {
      // The rank holds the whole tensor: straight from the mapped file when it is stored as is.
      const float* whole = Direct(t.name);
      if (whole == nullptr) {
        TY_RETURN_IF_ERROR(Read(t.name, global));
        whole = global.data();
      }
      put(t, whole);
      continue;
    }
    // A tensor-parallel slice: only its elements are read, a contiguous run at a time.
    if (static_cast<int64_t>(local.size()) < t.numel) local.resize(t.numel);
    absl::Status read;
    ForEachLocalRun(t, layout.tp_rank(), layout.tp_size(),
                    [&](int64_t at, int64_t from, int64_t n) {
                      if (read.ok()) read = ReadRange(t.name, at, n, local.data() + from);
                    });
    TY_RETURN_IF_ERROR(read);
    put(t, local.data());
  }
  return absl::OkStatus();
}

namespace {

// spec.init_from opened and checked against the spec's model.
absl::StatusOr<std::unique_ptr<WeightSource>> OpenForSpec(FileSystem& fs,
                                                          const config::JobSpec& spec) {
  absl::StatusOr<std::unique_ptr<WeightSource>> source =
      WeightSource::Open(fs, spec.init_from, &spec.model);
  if (!source.ok()) {
    return absl::Status(source.status().code(),
                        absl::StrCat("model.init_from: ", source.status().message()));
  }
  return source;
}

}  // namespace

absl::Status CheckInitFrom(FileSystem& fs, const config::JobSpec& spec) {
  if (spec.init_from.empty()) return absl::OkStatus();
  return OpenForSpec(fs, spec).status();
}

absl::StatusOr<std::string> LoadInitFrom(
    FileSystem& fs, const config::JobSpec& spec, const ParameterLayout& layout,
    const std::function<void(const ParamTensor& t, const float* local)>& put) {
  TY_ASSIGN_OR_RETURN(std::unique_ptr<WeightSource> source, OpenForSpec(fs, spec));
  TY_RETURN_IF_ERROR(source->ReadEach(layout, put));
  return source->description();
}

}  // namespace trainyard::worker::convert
