// What hf_format.cc shares with the files that hold one family's conversion (hf_deepseek.cc):
// reading config.json's fields, the Llama family's common fields and a DeepSeek-style config's
// experts, writing numbers and RoPE scaling back, and each family's entry points. Internal to
// worker/convert; the published-format API is hf_format.h.
#ifndef TRAINYARD_WORKER_CONVERT_HF_FORMAT_INTERNAL_H_
#define TRAINYARD_WORKER_CONVERT_HF_FORMAT_INTERNAL_H_

#include <google/protobuf/struct.pb.h>

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "config/model_config.h"
#include "worker/convert/hf_format.h"

namespace trainyard::worker::convert {

// The shortest decimal of `exact` (1 to 17 significant digits) whose text `gives_back` accepts,
// or none.
template <typename Accept>
std::optional<std::string> ShortestDecimal(double exact, const Accept& gives_back) {
  for (int digits = 1; digits <= 17; ++digits) {
    std::string text = absl::StrFormat("%.*g", digits, exact);
    if (gives_back(text)) return text;
  }
  return std::nullopt;
}

// A JSON config's fields, read with the file's name in every error.
class ConfigFields {
 public:
  ConfigFields(const google::protobuf::Struct& s, std::string source)
      : fields_(s.fields()), source_(std::move(source)) {}

  bool Has(const std::string& key) const { return Get(key) != nullptr; }
  // Whether the config names `key` as null (Get treats that as absent).
  bool IsNull(const std::string& key) const {
    auto it = fields_.find(key);
    return it != fields_.end() && it->second.kind_case() == google::protobuf::Value::kNullValue;
  }
  absl::Status Int(const std::string& key, int* out, bool required = true, int minimum = 1) const {
    const google::protobuf::Value* value = Get(key);
    if (value == nullptr) return required ? Bad(key, "is missing") : absl::OkStatus();
    const double v = value->number_value();
    if (value->kind_case() != google::protobuf::Value::kNumberValue || v != std::floor(v) ||
        v < minimum || v > 1e9) {
      return Bad(key, minimum == 1 ? "must be a positive integer"
                                   : absl::StrCat("must be an integer >= ", minimum));
    }
    *out = static_cast<int>(v);
    return absl::OkStatus();
  }
  absl::Status Float(const std::string& key, float* out, bool zero_too = false) const {
    const google::protobuf::Value* value = Get(key);
    if (value == nullptr) return absl::OkStatus();
    const double v = value->number_value();
    if (value->kind_case() != google::protobuf::Value::kNumberValue ||
        !(v > 0 || (zero_too && v == 0))) {
      return Bad(key, zero_too ? "must be a number >= 0" : "must be a positive number");
    }
    *out = static_cast<float>(value->number_value());
    return absl::OkStatus();
  }
  absl::Status Bool(const std::string& key, bool* out) const {
    const google::protobuf::Value* value = Get(key);
    if (value == nullptr) return absl::OkStatus();
    if (value->kind_case() != google::protobuf::Value::kBoolValue)
      return Bad(key, "must be true or false");
    *out = value->bool_value();
    return absl::OkStatus();
  }
  // A string field that, when present, must be one of `allowed`.
  absl::Status OneOf(const std::string& key, std::initializer_list<std::string> allowed) const {
    const google::protobuf::Value* value = Get(key);
    if (value == nullptr) return absl::OkStatus();
    for (const std::string& a : allowed) {
      if (value->kind_case() == google::protobuf::Value::kStringValue &&
          value->string_value() == a) {
        return absl::OkStatus();
      }
    }
    return Bad(key, absl::StrCat("must be \"", absl::StrJoin(allowed, "\" or \""),
                                 "\" (what Trainyard trains)"));
  }
  absl::Status Bad(const std::string& key, const std::string& why) const {
    return absl::InvalidArgumentError(absl::StrCat(source_, ": ", key, " ", why));
  }
  const std::string& source() const { return source_; }
  // The field's value; nullptr when it is missing or null (Hugging Face's "use the default").
  const google::protobuf::Value* Get(const std::string& key) const {
    auto it = fields_.find(key);
    return it == fields_.end() || it->second.kind_case() == google::protobuf::Value::kNullValue
               ? nullptr
               : &it->second;
  }

 private:
  const google::protobuf::Map<std::string, google::protobuf::Value>& fields_;
  const std::string source_;
};

// What a Llama-family config class assumes for the fields a config.json may leave out (Llama's
// own unless a family says otherwise). qkv_attention_bias: attention_bias names biases on q, k
// and v (GLM's, Seed-OSS's, Helium's) defaulting to this value; without it attention_bias (like
// mlp_bias) must be false.
struct LlamaDefaults {
  int head_dim = 0;  // 0: hidden_size / num_attention_heads
  float rope_theta = 10000.0f;
  float norm_eps = 1e-6f;
  bool tied_embeddings = false;
  std::optional<bool> qkv_attention_bias;
};

// Where a DeepSeek-style config keeps its experts' counts and sizes, and the config class's
// defaults for them: experts, picks, each expert's hidden size, shared experts (at least
// `least_shared`), the dense first blocks and (ERNIE's) the MoE blocks' interval.
struct ExpertKeys {
  const char *experts, *top_k, *ffn, *shared, *dense_first, *every;
  config::MoeConfig defaults;
  int least_shared;
};

// The shortest decimal that reads back as `value` in fp32 (1e-05, not 9.99999975e-06).
std::string ShortFloat(float value);

// Our tensor `ours` of `shape` as their tensor `theirs` whole (transposed when asked).
HfTensorMap Whole(std::string ours, std::vector<int64_t> shape, std::string theirs,
                  bool transpose = false);

// A Llama-family config's sizes, norm, RoPE and embeddings, and its activation (SiLU); `defaults`
// for what it leaves out.
absl::Status ReadLlamaConfig(const ConfigFields& f, config::ModelConfig& m,
                             const LlamaDefaults& defaults = {});

// A DeepSeek-style config's experts: their counts and sizes at `keys`, the class's defaults where
// it is silent.
absl::Status ReadExpertShape(const ConfigFields& f, const ExpertKeys& keys, config::ModelConfig& m);
// Group-limited routing as GLM-4.5's and DeepSeek's configs give it: n_group (`groups` where the
// config is silent) groups, of which topk_group (`kept`) are kept; every group kept reads as none.
absl::Status ReadExpertGroups(const ConfigFields& f, config::MoeConfig& moe, int groups = 1,
                              int kept = 1);

// config.json's max_position_embeddings and rope_scaling for the model.
int64_t HfMaxPositions(const config::ModelConfig& m);
std::string RopeScalingJson(const config::ModelConfig& m);
// The experts' fields of GLM-4.5's and DeepSeek's configs.
std::string DeepseekExpertsJson(const config::MoeConfig& moe);

// DeepSeek-V2's and V3's layouts (hf_deepseek.cc): latent attention's tensors of block `p`
// (theirs under `h`), the readers of their configs, whether a model_type is theirs, whether a
// model travels as V2, the check of what their layouts hold and their config.json.
void AddLatentAttention(const config::ModelConfig& m, const std::string& p, const std::string& h,
                        const HfLayout& layout, std::vector<HfTensorMap>& out);
absl::Status ReadDeepseekV3Config(const ConfigFields& f, config::ModelConfig& m);
absl::Status ReadDeepseekV2Config(const ConfigFields& f, config::ModelConfig& m);
bool IsDeepseekType(const std::string& model_type);
bool IsDeepseekV2(const config::ModelConfig& m);
absl::Status CheckDeepseekLayout(const config::ModelConfig& m);
std::string DeepseekConfigJson(const config::ModelConfig& m, const char* tied,
                               const std::string& dtype);

}  // namespace trainyard::worker::convert

#endif  // TRAINYARD_WORKER_CONVERT_HF_FORMAT_INTERNAL_H_
