// worker/convert/: the safetensors reader and writer, the Hugging Face layouts of both families
// and config.json, llm.c model files, and the one-line refusals of bad input, all on an
// in-memory filesystem.
#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <map>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/filesystem.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/convert/hf_format.h"
#include "worker/convert/init_from.h"
#include "worker/convert/safetensors.h"
#include "worker/shape/parameters.h"

namespace trainyard::worker::convert {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string U64(uint64_t v) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((v >> (8 * i)) & 0xFF);
  return out;
}

// A safetensors file from a header's JSON and the data bytes.
std::string Raw(const std::string& json, const std::string& data) {
  return U64(json.size()) + json + data;
}

std::string Floats(std::vector<float> v) {
  return std::string(reinterpret_cast<const char*>(v.data()), 4 * v.size());
}

TEST(Safetensors, WrittenFileReadsBack) {
  FakeFileSystem fs;
  std::vector<TensorInfo> tensors = {{"a", TensorDtype::kF32, {2, 3}},
                                     {"b", TensorDtype::kBF16, {3}}};
  auto writer = SafetensorsWriter::Create(fs, "m.safetensors", tensors, {{"format", "pt"}});
  ASSERT_TRUE(writer.ok()) << writer.status();
  const float a[] = {1, 2, 3, 4, 5, 6.5f}, b[] = {0.5f, -2, 1.0f / 3};
  ASSERT_TRUE((*writer)->Write("a", a).ok());
  EXPECT_FALSE(fs.Exists("m.safetensors")) << "renamed into place only when finished";
  EXPECT_EQ((*writer)->Finish().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE((*writer)->Write("b", b).ok());
  ASSERT_TRUE((*writer)->Finish().ok());

  auto file = SafetensorsFile::Open(fs, "m.safetensors");
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->metadata().at("format"), "pt");
  ASSERT_EQ((*file)->tensors().size(), 2u);
  const TensorInfo* ta = (*file)->Find("a");
  ASSERT_NE(ta, nullptr);
  EXPECT_EQ(ta->shape, (std::vector<int64_t>{2, 3}));
  std::vector<float> got(6);
  (*file)->ReadFloats(*ta, 0, 6, got.data());
  EXPECT_EQ(got, std::vector<float>(a, a + 6));
  const TensorInfo* tb = (*file)->Find("b");
  ASSERT_NE(tb, nullptr);
  EXPECT_EQ(tb->dtype, TensorDtype::kBF16);
  (*file)->ReadFloats(*tb, 0, 3, got.data());
  EXPECT_EQ(got[0], 0.5f);
  EXPECT_EQ(got[1], -2.0f);
  EXPECT_NEAR(got[2], 1.0f / 3, 1e-3);
  // The data starts 8-byte aligned.
  auto bytes = fs.ReadFile("m.safetensors");
  uint64_t header = 0;
  std::memcpy(&header, bytes->data(), 8);
  EXPECT_EQ(header % 8, 0u);
}

TEST(Safetensors, ReadsHalfPrecision) {
  FakeFileSystem fs;
  // 1.0, -2.0, 65504 (the largest half), 2^-24 (the smallest subnormal).
  const uint16_t h[] = {0x3C00, 0xC000, 0x7BFF, 0x0001};
  ASSERT_TRUE(fs.WriteFileAtomic("h.safetensors",
                                 Raw(R"({"x":{"dtype":"F16","shape":[4],"data_offsets":[0,8]}})",
                                     std::string(reinterpret_cast<const char*>(h), 8)))
                  .ok());
  auto file = SafetensorsFile::Open(fs, "h.safetensors");
  ASSERT_TRUE(file.ok()) << file.status();
  std::vector<float> got(4);
  (*file)->ReadFloats((*file)->tensors()[0], 0, 4, got.data());
  EXPECT_EQ(got, (std::vector<float>{1.0f, -2.0f, 65504.0f, std::ldexp(1.0f, -24)}));
}

struct BadFile {
  const char* name;
  std::string bytes;
  const char* says;
};

TEST(Safetensors, BadFilesAreRefusedWithOneLineNamingTheFileAndTensor) {
  const std::string two = Floats({1, 2});
  const BadFile cases[] = {
      {"short", "abc", "truncated"},
      {"truncated_header", U64(100) + "{}", "truncated"},
      {"huge_header", U64(200'000'000) + "{}", "over the limit"},
      {"not_json", Raw("{not json", ""), "not a JSON object"},
      {"json_array", Raw("[1,2]", ""), "not a JSON object"},
      {"unknown_dtype", Raw(R"({"x":{"dtype":"F8_E9","shape":[2],"data_offsets":[0,8]}})", two),
       "tensor x: unknown dtype \"F8_E9\""},
      {"past_end", Raw(R"({"x":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", two),
       "tensor x: data_offsets [0, 16) run past"},
      {"size_mismatch", Raw(R"({"x":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", two),
       "tensor x: data_offsets hold 8 bytes"},
      {"overlap",
       Raw(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
           R"("y":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
           two),
       "tensors x and y overlap"},
      {"negative_offset", Raw(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[-8,0]}})", two),
       "tensor x: data_offsets"},
  };
  for (const BadFile& c : cases) {
    SCOPED_TRACE(c.name);
    FakeFileSystem fs;
    const std::string path = absl::StrCat(c.name, ".safetensors");
    ASSERT_TRUE(fs.WriteFileAtomic(path, c.bytes).ok());
    auto file = SafetensorsFile::Open(fs, path);
    ASSERT_FALSE(file.ok());
    EXPECT_EQ(file.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(file.status().message(), HasSubstr(path + ": "));
    EXPECT_THAT(file.status().message(), HasSubstr(c.says));
    EXPECT_EQ(std::string(file.status().message()).find('\n'), std::string::npos);
  }
}

config::ModelConfig Tiny(config::ModelFamily family) {
  config::ModelConfig m =
      *config::Preset(family == config::ModelFamily::kGpt2 ? "gpt2-debug" : "llama-debug");
  m.vocab = 48;
  m.max_seq = 16;
  return m;
}

// A Llama mixture-of-experts model of Mixtral's shape: four experts of hidden size 32, top-2
// renormalised.
config::ModelConfig TinyMixtral() {
  config::ModelConfig m = Tiny(config::ModelFamily::kLlama);
  m.moe.experts = 4;
  m.moe.top_k = 2;
  m.moe.ffn = 32;
  m.moe.normalize_top_k = true;
  return m;
}

// A Llama model with DeepSeek-V3's latent attention (heads of 16, 4 of them turned, value heads
// of 8, latents of 24 and 12) over its routing: the first block dense, four experts picked by
// biased sigmoid scores beside a shared one.
config::ModelConfig TinyDeepseek() {
  config::ModelConfig m = TinyMixtral();
  m.kv_heads = m.heads;
  m.rope_dim = 4;
  m.latent = {.q_rank = 24, .kv_rank = 12, .value_dim = 8};
  m.moe.dense_first = 1;
  m.moe.shared_experts = 1;
  m.moe.score = config::MoeScore::kSigmoid;
  m.moe.balance = config::MoeBalance::kBias;
  return m;
}

TEST(HfFormat, PiecesCoverEveryTensorOnce) {
  for (const config::ModelConfig& model :
       {Tiny(config::ModelFamily::kGpt2), Tiny(config::ModelFamily::kLlama), TinyMixtral(),
        TinyDeepseek()}) {
    const config::ModelFamily family = model.family;
    for (bool tied : {true, false}) {
      config::ModelConfig m = model;
      m.tied_embeddings = tied;
      auto maps = HfTensors(m);
      ASSERT_TRUE(maps.ok());
      const ParameterLayout layout(m, 0, 1, PipelineStage{});
      ASSERT_EQ(maps->size(), layout.tensors().size()) << config::FamilyName(family);
      for (size_t i = 0; i < maps->size(); ++i) {
        const ParamTensor& t = layout.tensors()[i];
        EXPECT_EQ((*maps)[i].name, t.name);
        EXPECT_EQ((*maps)[i].shape, t.global_shape) << t.name;
        int64_t rows = 0, numel = 0;
        for (const HfPiece& p : (*maps)[i].pieces) {
          EXPECT_EQ(p.row_begin, rows) << p.name;
          rows += p.rows;
          int64_t n = 1;
          for (int64_t d : HfShape((*maps)[i], p)) n *= d;
          numel += n;
        }
        EXPECT_EQ(rows, t.global_shape[0]) << t.name;
        EXPECT_EQ(numel, t.numel) << t.name;
      }
    }
  }
}

TEST(HfFormat, Gpt2IsConv1DTransposedAndLlamaSplitsRows) {
  auto gpt2 = HfTensors(Tiny(config::ModelFamily::kGpt2));
  ASSERT_TRUE(gpt2.ok());
  const HfTensorMap* qkv = nullptr;
  for (const HfTensorMap& t : *gpt2) {
    if (t.name == "h.0.attn.qkv.w") qkv = &t;
  }
  ASSERT_NE(qkv, nullptr);
  ASSERT_EQ(qkv->pieces.size(), 1u);
  EXPECT_EQ(qkv->pieces[0].name, "h.0.attn.c_attn.weight");
  const int64_t c = 64;
  EXPECT_EQ(HfShape(*qkv, qkv->pieces[0]), (std::vector<int64_t>{c, 3 * c}));
  std::vector<float> ours(3 * c * c), theirs(ours.size()), back(ours.size());
  std::iota(ours.begin(), ours.end(), 0.0f);
  ToHf(*qkv, qkv->pieces[0], ours.data(), theirs.data());
  EXPECT_EQ(theirs[1], ours[c]);  // theirs[0][1] = ours[1][0]
  FromHf(*qkv, qkv->pieces[0], theirs.data(), back.data());
  EXPECT_EQ(back, ours);

  auto llama = HfTensors(Tiny(config::ModelFamily::kLlama));
  ASSERT_TRUE(llama.ok());
  for (const HfTensorMap& t : *llama) {
    if (t.name == "h.1.attn.qkv.w") {
      ASSERT_EQ(t.pieces.size(), 3u);
      EXPECT_EQ(t.pieces[1].name, "model.layers.1.self_attn.k_proj.weight");
      EXPECT_EQ(t.pieces[1].row_begin, 64);  // 4 query heads of 16
      EXPECT_EQ(t.pieces[1].rows, 32);       // 2 key/value heads of 16
    }
    if (t.name == "h.1.mlp.fc.w") {
      EXPECT_EQ(t.pieces[0].name, "model.layers.1.mlp.gate_proj.weight");
      EXPECT_EQ(t.pieces[1].name, "model.layers.1.mlp.up_proj.weight");
    }
  }
}

// Mixtral: expert j's rows of fc are its w1 then w3, its [C, ffn] slab of proj is its w2; an MoE
// model of another shape is refused naming the field.
TEST(HfFormat, MixtralSplitsTheExpertsAndOtherMoeShapesAreRefused) {
  auto maps = HfTensors(TinyMixtral());
  ASSERT_TRUE(maps.ok()) << maps.status();
  const int64_t c = 64, f = 32;
  for (const HfTensorMap& t : *maps) {
    if (t.name == "h.1.moe.router.w") {
      EXPECT_EQ(t.pieces[0].name, "model.layers.1.block_sparse_moe.gate.weight");
    }
    if (t.name == "h.1.moe.experts.fc.w") {
      ASSERT_EQ(t.pieces.size(), 8u);
      EXPECT_EQ(t.pieces[2].name, "model.layers.1.block_sparse_moe.experts.1.w1.weight");
      EXPECT_EQ(t.pieces[2].row_begin, 2 * f);
      EXPECT_EQ(t.pieces[3].name, "model.layers.1.block_sparse_moe.experts.1.w3.weight");
      EXPECT_EQ(t.pieces[3].row_begin, 3 * f);
      EXPECT_EQ(HfShape(t, t.pieces[3]), (std::vector<int64_t>{f, c}));
    }
    if (t.name == "h.1.moe.experts.proj.w") {
      ASSERT_EQ(t.pieces.size(), 4u);
      const HfPiece& w2 = t.pieces[2];
      EXPECT_EQ(w2.name, "model.layers.1.block_sparse_moe.experts.2.w2.weight");
      EXPECT_EQ(HfShape(t, w2), (std::vector<int64_t>{c, f}));
      std::vector<float> ours(4 * c * f), theirs(c * f), back(ours.size());
      std::iota(ours.begin(), ours.end(), 0.0f);
      ToHf(t, w2, ours.data(), theirs.data());
      EXPECT_EQ(theirs[0], ours[2 * c * f]);
      EXPECT_EQ(theirs[c * f - 1], ours[3 * c * f - 1]);
      FromHf(t, w2, theirs.data(), back.data());
      EXPECT_TRUE(
          std::equal(back.begin() + 2 * c * f, back.begin() + 3 * c * f, ours.begin() + 2 * c * f));
    }
  }
  // A routing Mixtral's layout does not hold is refused naming the field, and the layout that
  // would hold the model: sigmoid scores are GLM-4.5's, which needs a selection bias too.
  struct Refused {
    void (*change)(config::ModelConfig&);
    const char* says;
    const char* layout = "Mixtral layout only";
  };
  const Refused refused[] = {
      {[](config::ModelConfig& m) { m.moe.every = 2; }, "model.moe.every: is 2"},
      {[](config::ModelConfig& m) { m.moe.shared_experts = 1; }, "model.moe.shared_experts: is 1"},
      {[](config::ModelConfig& m) { m.moe.score = config::MoeScore::kSigmoid; },
       "model.moe.balance: is aux_loss", "GLM-4.5's layout only"},
      {[](config::ModelConfig& m) { m.moe.normalize_top_k = false; },
       "model.moe.normalize_top_k: is false"},
      {[](config::ModelConfig& m) {
         const config::MoeConfig moe = m.moe;
         m = Tiny(config::ModelFamily::kGpt2);
         m.moe = moe;
       },
       "model.moe: a GPT-2 model has MoE blocks"},
  };
  for (const Refused& r : refused) {
    config::ModelConfig m = TinyMixtral();
    r.change(m);
    const absl::Status status = HfTensors(m).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kUnimplemented) << r.says;
    EXPECT_THAT(status.message(), HasSubstr(r.says));
    EXPECT_THAT(status.message(), HasSubstr(r.layout));
  }
  // With a selection bias, Mixtral's experts travel in ERNIE 4.5's MoE layout instead.
  config::ModelConfig biased = TinyMixtral();
  biased.moe.balance = config::MoeBalance::kBias;
  EXPECT_TRUE(HfTensors(biased).ok()) << HfTensors(biased).status();
  EXPECT_EQ(HfExportLayout(biased).experts, HfExperts::kErnieMoe);
}

// The config.json of Llama 3.2 1B as published (its keys and values, Llama 3's RoPE scaling
// among them) reads as that model; the keys Trainyard has no use for (token ids, dropout,
// pretraining_tp, use_cache) are ignored.
constexpr char kLlama32Config[] = R"({
    "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": 128001, "head_dim": 64, "hidden_act": "silu",
    "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 8192,
    "max_position_embeddings": 131072, "mlp_bias": false, "model_type": "llama",
    "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8,
    "pretraining_tp": 1, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
    "transformers_version": "4.45.0.dev0", "use_cache": true, "vocab_size": 128256})";

TEST(HfFormat, Llama32ConfigReads) {
  const std::string json = kLlama32Config;
  auto m = ModelFromHfConfig(json, "Llama-3.2-1B/config.json");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->family, config::ModelFamily::kLlama);
  EXPECT_EQ(m->layers, 16);
  EXPECT_EQ(m->width, 2048);
  EXPECT_EQ(m->heads, 32);
  EXPECT_EQ(m->kv_heads, 8);
  EXPECT_EQ(m->ffn_hidden, 8192);
  EXPECT_EQ(m->vocab, 128256);
  EXPECT_EQ(m->max_seq, 131072);
  EXPECT_TRUE(m->tied_embeddings);
  EXPECT_EQ(m->norm_eps, 1e-5f);
  EXPECT_EQ(m->rope_theta, 500000.0f);
  EXPECT_EQ(m->rope_scaling, (config::RopeScaling{.factor = 32.0f,
                                                  .low_freq_factor = 1.0f,
                                                  .high_freq_factor = 4.0f,
                                                  .original_max_seq = 8192}));
}

// Qwen3-8B's config with YaRN as its model card extends it to 131072 positions (factor 4 over the
// original 32768, max_position_embeddings raised to match): the factor, the original context, the
// default betas and the paper's attention factor, 0.1 · ln 4 + 1; written back the same. With
// max_position_embeddings left at 40960, recent transformers would take the factor as 1.25 and
// older ones as 4: refused. DeepSeek's mscale over mscale_all_dim gives the attention factor.
TEST(HfFormat, Qwen3ConfigWithYarnReads) {
  const std::string json = R"({
    "architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
    "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 12288,
    "max_position_embeddings": 131072, "max_window_layers": 36, "model_type": "qwen3",
    "num_attention_heads": 32, "num_hidden_layers": 36, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06,
    "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768},
    "rope_theta": 1000000, "sliding_window": null, "tie_word_embeddings": false,
    "torch_dtype": "bfloat16", "transformers_version": "4.51.0", "use_cache": true,
    "use_sliding_window": false, "vocab_size": 151936})";
  auto m = ModelFromHfConfig(json, "Qwen3-8B/config.json");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_TRUE(m->qk_norm);
  EXPECT_EQ(m->max_seq, 131072);
  const config::RopeScaling& r = m->rope_scaling;
  EXPECT_TRUE(r.yarn);
  EXPECT_EQ(r.factor, 4.0f);
  EXPECT_EQ(r.original_max_seq, 32768);
  EXPECT_EQ(r.beta_fast, 32.0f);
  EXPECT_EQ(r.beta_slow, 1.0f);
  EXPECT_TRUE(r.truncate);
  EXPECT_FLOAT_EQ(r.attention_factor, 1.13862944f);  // 0.1 · ln 4 + 1
  ASSERT_TRUE(config::ValidateModelConfig(*m).ok());
  const std::string written = HfConfigJson(*m, TensorDtype::kBF16);
  auto back = ModelFromHfConfig(written, "written/config.json");
  ASSERT_TRUE(back.ok()) << back.status() << "\n" << written;
  EXPECT_EQ(back->rope_scaling, r) << written;

  auto with = [&](const std::string& from, const std::string& to) {
    std::string changed = json;
    changed.replace(changed.find(from), from.size(), to);
    return ModelFromHfConfig(changed, "p/config.json");
  };
  EXPECT_EQ(with("131072", "40960").status().message(),
            "p/config.json: rope_scaling: factor is 4 but max_position_embeddings 40960 over "
            "original_max_position_embeddings 32768 is 1.25 (transformers' versions take one or "
            "the other; make them agree)");
  auto deepseek = with("\"original_max_position_embeddings\": 32768",
                       "\"original_max_position_embeddings\": 32768, \"mscale\": 1.0, "
                       "\"mscale_all_dim\": 0.5, \"beta_fast\": 0, \"truncate\": false");
  ASSERT_TRUE(deepseek.ok()) << deepseek.status();
  EXPECT_FLOAT_EQ(deepseek->rope_scaling.attention_factor,
                  static_cast<float>((0.1 * std::log(4.0) + 1) / (0.05 * std::log(4.0) + 1)));
  EXPECT_EQ(deepseek->rope_scaling.beta_fast, 32.0f);  // 0 means the default
  EXPECT_FALSE(deepseek->rope_scaling.truncate);
  // Trained at another context, it is written with max_position_embeddings factor times the
  // original context all the same; a factor that gives no whole number of positions is refused.
  config::ModelConfig shorter = *m;
  shorter.max_seq = 4096;
  ASSERT_TRUE(CheckHfWritable(shorter).ok());
  const std::string shorter_json = HfConfigJson(shorter, TensorDtype::kBF16);
  EXPECT_THAT(shorter_json, HasSubstr("\"max_position_embeddings\": 131072"));
  EXPECT_THAT(shorter_json, HasSubstr("\"original_max_position_embeddings\": 32768"));
  EXPECT_EQ(ModelFromHfConfig(shorter_json, "shorter/config.json")->rope_scaling, r);
  config::ModelConfig odd = *m;
  odd.rope_scaling.factor = 1.5f;
  odd.rope_scaling.original_max_seq = 4097;
  EXPECT_THAT(std::string(CheckHfWritable(odd).message()),
              HasSubstr("model.rope_scaling.factor: is 1.5, which over original_max_seq 4097 gives "
                        "no whole max_position_embeddings"));
}

// Mistral 7B v0.3's published config: Llama's model under another name. Its v0.1 attended
// within a 4096-token window of a 32768-position model: the model's sliding_window, written back
// as a Mistral config (a Llama one has no window).
TEST(HfFormat, MistralConfigReadsAsLlamaWithItsSlidingWindow) {
  std::string json = R"({
    "architectures": ["MistralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1,
    "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
    "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mistral",
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "sliding_window": null,
    "tie_word_embeddings": false, "torch_dtype": "bfloat16", "use_cache": true,
    "vocab_size": 32768})";
  auto m = ModelFromHfConfig(json, "Mistral-7B-v0.3/config.json");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->family, config::ModelFamily::kLlama);
  EXPECT_EQ(m->layers, 32);
  EXPECT_EQ(m->width, 4096);
  EXPECT_EQ(m->kv_heads, 8);
  EXPECT_EQ(m->ffn_hidden, 14336);
  EXPECT_EQ(m->vocab, 32768);
  EXPECT_EQ(m->max_seq, 32768);
  EXPECT_FALSE(m->tied_embeddings);
  EXPECT_EQ(m->norm_eps, 1e-5f);
  EXPECT_EQ(m->rope_theta, 1e6f);
  EXPECT_FALSE(m->moe.enabled());
  EXPECT_EQ(m->sliding_window, 0);
  EXPECT_THAT(HfConfigJson(*m, TensorDtype::kBF16), HasSubstr("\"model_type\": \"llama\""));

  json.replace(json.find("\"sliding_window\": null"), 22, "\"sliding_window\": 4096");
  m = ModelFromHfConfig(json, "Mistral-7B-v0.1/config.json");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->sliding_window, 4096);
  const std::string written = HfConfigJson(*m, TensorDtype::kBF16);
  EXPECT_THAT(written, HasSubstr("\"architectures\": [\"MistralForCausalLM\"]"));
  EXPECT_THAT(written, HasSubstr("\"model_type\": \"mistral\""));
  EXPECT_THAT(written, HasSubstr("\"sliding_window\": 4096"));
  auto back = ModelFromHfConfig(written, "config.json");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->sliding_window, 4096);
  // A window spanning every position is none.
  json.replace(json.find("\"sliding_window\": 4096"), 22, "\"sliding_window\": 32768");
  m = ModelFromHfConfig(json, "config.json");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->sliding_window, 0);
  // transformers' layer_types: the window in the layers it names sliding_attention; every layer
  // full is no window. A Mistral model with the window in some layers only travels as Ministral.
  std::string full, mixed;
  for (int i = 0; i < 32; ++i) {
    absl::StrAppend(&full, i ? ", " : "", "\"full_attention\"");
    absl::StrAppend(&mixed, i ? ", " : "", i % 2 ? "\"sliding_attention\"" : "\"full_attention\"");
  }
  auto with_types = [&](const std::string& list) {
    std::string j = json;
    j.replace(j.find("\"sliding_window\": 32768"), 23, "\"sliding_window\": 4096");
    j.replace(j.find("\"use_cache\""), 0, "\"layer_types\": [" + list + "], ");
    return ModelFromHfConfig(j, "m/config.json");
  };
  EXPECT_EQ(with_types(full)->sliding_window, 0);
  EXPECT_TRUE(with_types(full)->full_attention_layers.empty());
  m = with_types(mixed);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->sliding_window, 4096);
  ASSERT_EQ(m->full_attention_layers.size(), 16u);
  EXPECT_EQ(m->full_attention_layers[1], 2);
  EXPECT_EQ(m->WindowOf(0), 0);
  EXPECT_EQ(m->WindowOf(1), 4096);
  ASSERT_TRUE(CheckHfWritable(*m).ok());
  ASSERT_TRUE(HfTensors(*m).ok());
  const std::string ministral = HfConfigJson(*m, TensorDtype::kBF16);
  EXPECT_THAT(ministral, HasSubstr("\"architectures\": [\"MinistralForCausalLM\"]"));
  EXPECT_THAT(ministral, HasSubstr("\"layer_types\": [\"full_attention\", \"sliding_attention\""));
  auto ministral_back = ModelFromHfConfig(ministral, "config.json");
  ASSERT_TRUE(ministral_back.ok()) << ministral_back.status() << "\n" << ministral;
  EXPECT_EQ(ministral_back->sliding_window, 4096);
  EXPECT_EQ(ministral_back->full_attention_layers, m->full_attention_layers);
  // Ministral's config class: a window of 4096 in every block unless the config says otherwise.
  std::string bare = ministral;
  const std::string window_key = "\"sliding_window\": 4096,";
  bare.replace(bare.find(window_key), window_key.size(), "");
  bare.replace(bare.find("\"layer_types\""), 13, "\"layer_kinds\"");
  auto everywhere = ModelFromHfConfig(bare, "b/config.json");
  ASSERT_TRUE(everywhere.ok()) << everywhere.status() << "\n" << bare;
  EXPECT_EQ(everywhere->sliding_window, 4096);
  EXPECT_TRUE(everywhere->full_attention_layers.empty());
  config::ModelConfig sparse = *m;  // Mixtral's config has no layer_types
  sparse.moe = {.experts = 8, .top_k = 2, .ffn = 14336};
  EXPECT_THAT(CheckHfWritable(sparse).message(),
              HasSubstr("model.full_attention_layers: [0, 2, 4,"));
  EXPECT_EQ(with_types("\"full_attention\"").status().message(),
            "m/config.json: layer_types must name \"sliding_attention\" or \"full_attention\" "
            "for each of the 32 layers");
  std::string unwindowed = json;
  unwindowed.replace(unwindowed.find("\"sliding_window\": 32768"), 23, "\"sliding_window\": null");
  unwindowed.replace(unwindowed.find("\"use_cache\""), 0, "\"layer_types\": [" + mixed + "], ");
  EXPECT_THAT(ModelFromHfConfig(unwindowed, "m/config.json").status().message(),
              HasSubstr("layer_types names sliding_attention layers, but sliding_window is null"));
}

// A config.json of Qwen2.5 0.5B's shape (Qwen2ForCausalLM's keys): Llama's model with biases on
// q, k and v, and no sliding window unless use_sliding_window, which Trainyard refuses. Written
// back, a model with qkv_bias is Qwen2 again.
TEST(HfFormat, Qwen2ConfigReadsAsLlamaWithQkvBiases) {
  std::string json = R"({
    "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
    "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 896,
    "initializer_range": 0.02, "intermediate_size": 4864, "max_position_embeddings": 32768,
    "max_window_layers": 24, "model_type": "qwen2", "num_attention_heads": 14,
    "num_hidden_layers": 24, "num_key_value_heads": 2, "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": true,
    "torch_dtype": "bfloat16", "use_cache": true, "use_sliding_window": false,
    "vocab_size": 151936})";
  auto m = ModelFromHfConfig(json, "Qwen2.5-0.5B/config.json");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->family, config::ModelFamily::kLlama);
  EXPECT_TRUE(m->qkv_bias);
  EXPECT_EQ(m->layers, 24);
  EXPECT_EQ(m->width, 896);
  EXPECT_EQ(m->heads, 14);
  EXPECT_EQ(m->kv_heads, 2);
  EXPECT_EQ(m->ffn_hidden, 4864);
  EXPECT_EQ(m->vocab, 151936);
  EXPECT_TRUE(m->tied_embeddings);
  EXPECT_EQ(m->norm_eps, 1e-6f);
  EXPECT_EQ(m->rope_theta, 1e6f);
  // 494,032,768 parameters: the model card's 0.49B (0.36B without the embedding).
  EXPECT_EQ(m->ParameterCount(), 494032768);

  const std::string written = HfConfigJson(*m, TensorDtype::kBF16);
  EXPECT_THAT(written, HasSubstr("\"architectures\": [\"Qwen2ForCausalLM\"]"));
  EXPECT_THAT(written, HasSubstr("\"use_sliding_window\": false"));
  auto back = ModelFromHfConfig(written, "config.json");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(back->qkv_bias);
  EXPECT_EQ(back->kv_heads, 2);
  // A Llama config has no q, k, v biases (and with attention_bias, o_proj's too: refused).
  config::ModelConfig llama = *m;
  llama.qkv_bias = false;
  auto plain = ModelFromHfConfig(HfConfigJson(llama, TensorDtype::kBF16), "config.json");
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_FALSE(plain->qkv_bias);

  // The window applies only with use_sliding_window, and then from layer max_window_layers on:
  // in none of the 24 here, in all of them from 0, and from layer 12 in half of them.
  json.replace(json.find("\"sliding_window\": 32768"), 23, "\"sliding_window\": 4096");
  m = ModelFromHfConfig(json, "Qwen2.5-0.5B/config.json");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->sliding_window, 0);
  json.replace(json.find("\"use_sliding_window\": false"), 27, "\"use_sliding_window\": true");
  m = ModelFromHfConfig(json, "Qwen2.5-0.5B/config.json");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->sliding_window, 0);
  json.replace(json.find("\"max_window_layers\": 24"), 23, "\"max_window_layers\": 0");
  m = ModelFromHfConfig(json, "Qwen2.5-0.5B/config.json");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->sliding_window, 4096);
  back = ModelFromHfConfig(HfConfigJson(*m, TensorDtype::kBF16), "config.json");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->sliding_window, 4096);
  EXPECT_TRUE(back->qkv_bias);
  json.replace(json.find("\"max_window_layers\": 0"), 22, "\"max_window_layers\": 12");
  m = ModelFromHfConfig(json, "Qwen2.5-0.5B/config.json");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->sliding_window, 4096);
  EXPECT_EQ(m->full_attention_layers, (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}));
  EXPECT_TRUE(CheckHfWritable(*m).ok());
  const std::string partly = HfConfigJson(*m, TensorDtype::kBF16);
  EXPECT_THAT(partly, HasSubstr("\"max_window_layers\": 12"));
  EXPECT_THAT(partly, HasSubstr("\"layer_types\": [\"full_attention\", "));
  back = ModelFromHfConfig(partly, "config.json");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->full_attention_layers, m->full_attention_layers);
  // Without use_sliding_window, layer_types must name every layer full.
  std::string off = partly;
  off.replace(off.find("\"use_sliding_window\": true"), 26, "\"use_sliding_window\": false");
  EXPECT_THAT(ModelFromHfConfig(off, "q/config.json").status().message(),
              HasSubstr("q/config.json: layer_types names sliding_attention layers, but "
                        "use_sliding_window is false"));
}

// Phi-3 mini (4k)'s published config: Mistral's model with q, k and v fused in qkv_proj and
// gate and up in gate_up_proj, and a sliding window of 2047 positions. 3,821,079,552 parameters
// by hand: embeddings and head 2 · 32064 · 3072 = 197,001,216; per layer q, k, v 3 · 3072²,
// o_proj 3072², gate_up 2 · 8192 · 3072, down 8192 · 3072 and two norms, 113,252,352, times 32;
// the final norm 3072.
TEST(HfFormat, Phi3ConfigReadsAsLlamaWithItsWindowAndFusedProjections) {
  std::string json = R"({
    "architectures": ["Phi3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": 1, "embd_pdrop": 0.0, "eos_token_id": 32000, "hidden_act": "silu",
    "hidden_size": 3072, "initializer_range": 0.02, "intermediate_size": 8192,
    "max_position_embeddings": 4096, "model_type": "phi3", "num_attention_heads": 32,
    "num_hidden_layers": 32, "num_key_value_heads": 32, "original_max_position_embeddings": 4096,
    "pad_token_id": 32000, "resid_pdrop": 0.0, "rms_norm_eps": 1e-05, "rope_scaling": null,
    "rope_theta": 10000.0, "sliding_window": 2047, "tie_word_embeddings": false,
    "torch_dtype": "bfloat16", "use_cache": true, "vocab_size": 32064})";
  HfLayout layout;
  auto m = ModelFromHfConfig(json, "Phi-3-mini-4k-instruct/config.json", &layout);
  const HfProjections projections = layout.projections;
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(projections, HfProjections::kFused);
  EXPECT_EQ(m->family, config::ModelFamily::kLlama);
  EXPECT_EQ(m->sliding_window, 2047);
  EXPECT_EQ(m->heads, 32);
  EXPECT_EQ(m->kv_heads, 32);
  EXPECT_FALSE(m->tied_embeddings);
  EXPECT_EQ(m->ParameterCount(), 3821079552);
  // The projections' tensors: one per block for the attention's and one for the MLP's inputs.
  auto maps = HfTensors(*m, layout);
  ASSERT_TRUE(maps.ok()) << maps.status();
  std::set<std::string> names;
  for (const HfTensorMap& t : *maps) {
    for (const HfPiece& piece : t.pieces) names.insert(piece.name);
  }
  EXPECT_TRUE(names.count("model.layers.0.self_attn.qkv_proj.weight"));
  EXPECT_TRUE(names.count("model.layers.31.mlp.gate_up_proj.weight"));
  EXPECT_FALSE(names.count("model.layers.0.self_attn.q_proj.weight"));
  // Written back it is Mistral's config with the window (transformers loads it as the same model).
  EXPECT_THAT(HfConfigJson(*m, TensorDtype::kBF16), HasSubstr("\"model_type\": \"mistral\""));

  // A partial_rotary_factor that turns an odd number of dimensions, or none; LongRoPE without its
  // long factors.
  auto with = [&](const std::string& from, const std::string& to) {
    std::string changed = json;
    changed.replace(changed.find(from), from.size(), to);
    return std::string(ModelFromHfConfig(changed, "p/config.json").status().message());
  };
  EXPECT_THAT(with("\"rope_theta\"", "\"partial_rotary_factor\": 0.4948, \"rope_theta\""),
              HasSubstr("p/config.json: partial_rotary_factor must be in (0, 1] and turn an even "
                        "number of each head's 96 dimensions"));
  for (const char* factor : {"0.01", "1.5", "0", "\"half\""}) {
    EXPECT_THAT(with("\"rope_theta\"",
                     absl::StrCat("\"partial_rotary_factor\": ", factor, ", \"rope_theta\"")),
                HasSubstr("partial_rotary_factor must be in (0, 1]"))
        << factor;
  }
  EXPECT_EQ(with("\"rope_scaling\": null",
                 "\"rope_scaling\": {\"type\": \"longrope\", \"short_factor\": [1.0]}"),
            "p/config.json: rope_scaling: long_factor is missing");
  EXPECT_THAT(with("\"rope_scaling\": null", "\"rope_scaling\": {\"type\": \"dynamic\"}"),
              HasSubstr("p/config.json: rope_scaling is not supported"));
  EXPECT_EQ(with("\"rope_scaling\": null", "\"rope_scaling\": {\"type\": \"yarn\"}"),
            "p/config.json: rope_scaling: factor is missing");
}

// Phi-3.5 mini's published config.json: Phi-3 mini's model with LongRoPE over each head's 96
// dimensions (48 short and 48 long factors, switching past original_max_position_embeddings
// 4096, the context 32 times longer: attention factor √(1 + ln 32 / ln 4096)).
constexpr char kPhi35MiniConfig[] = R"({
  "architectures": ["Phi3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 1, "embd_pdrop": 0.0, "eos_token_id": 32000, "hidden_act": "silu",
  "hidden_size": 3072, "initializer_range": 0.02, "intermediate_size": 8192,
  "max_position_embeddings": 131072, "model_type": "phi3", "num_attention_heads": 32,
  "num_hidden_layers": 32, "num_key_value_heads": 32, "original_max_position_embeddings": 4096,
  "pad_token_id": 32000, "resid_pdrop": 0.0, "rms_norm_eps": 1e-05,
  "rope_scaling": {
    "long_factor": [1.0800000429153442, 1.1100000143051147, 1.1399999856948853, 1.340000033378601,
      1.5899999141693115, 1.600000023841858, 1.6200000047683716, 2.620000123977661,
      3.2300000190734863, 3.2300000190734863, 4.789999961853027, 7.400000095367432,
      7.700000286102295, 9.09000015258789, 12.199999809265137, 17.670000076293945,
      24.46000099182129, 28.57000160217285, 30.420001983642578, 30.840002059936523,
      32.590003967285156, 32.93000411987305, 42.320003509521484, 44.96000289916992,
      50.340003967285156, 50.45000457763672, 57.55000305175781, 57.93000411987305,
      58.21000289916992, 60.1400032043457, 62.61000442504883, 62.62000274658203,
      62.71000289916992, 63.1400032043457, 63.1400032043457, 63.77000427246094,
      63.93000411987305, 63.96000289916992, 63.970001220703125, 64.02999877929688,
      64.06999969482422, 64.08000183105469, 64.12000274658203, 64.41000366210938,
      64.4800033569336, 64.51000213623047, 64.52999877929688, 64.83999633789062],
    "short_factor": [1.0, 1.0199999809265137, 1.0299999713897705, 1.0299999713897705,
      1.0499999523162842, 1.0499999523162842, 1.0499999523162842, 1.0499999523162842,
      1.0499999523162842, 1.0699999332427979, 1.0999999046325684, 1.1099998950958252,
      1.1599998474121094, 1.1599998474121094, 1.1699998378753662, 1.2899998426437378,
      1.339999794960022, 1.679999828338623, 1.7899998426437378, 1.8199998140335083,
      1.8499997854232788, 1.8799997568130493, 1.9099997282028198, 1.9399996995925903,
      1.9899996519088745, 2.0199997425079346, 2.0199997425079346, 2.0199997425079346,
      2.0199997425079346, 2.0199997425079346, 2.0199997425079346, 2.0299997329711914,
      2.0299997329711914, 2.0299997329711914, 2.0299997329711914, 2.0299997329711914,
      2.0299997329711914, 2.0299997329711914, 2.0299997329711914, 2.0299997329711914,
      2.0799996852874756, 2.0899996757507324, 2.189999580383301, 2.2199995517730713,
      2.5899994373321533, 2.729999542236328, 2.749999523162842, 2.8399994373321533],
    "type": "longrope"},
  "rope_theta": 10000.0, "sliding_window": 262144, "tie_word_embeddings": false,
  "torch_dtype": "bfloat16", "transformers_version": "4.46.3", "use_cache": true,
  "vocab_size": 32064})";

TEST(HfFormat, Phi35MiniConfigReadsWithLongRope) {
  HfLayout layout;
  auto m = ModelFromHfConfig(kPhi35MiniConfig, "Phi-3.5-mini-instruct/config.json", &layout);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(layout.projections, HfProjections::kFused);
  EXPECT_EQ(m->sliding_window, 0);  // 262144 spans the 131072 positions
  EXPECT_EQ(m->rope_dim, 0);
  const config::RopeScaling& r = m->rope_scaling;
  EXPECT_TRUE(r.longrope);
  EXPECT_EQ(r.original_max_seq, 4096);
  ASSERT_EQ(r.short_factor.size(), 48u);
  ASSERT_EQ(r.long_factor.size(), 48u);
  EXPECT_EQ(r.short_factor[1], 1.0199999809265137f);
  EXPECT_EQ(r.long_factor[47], 64.83999633789062f);
  EXPECT_FLOAT_EQ(r.attention_factor, std::sqrt(1.0f + std::log(32.0f) / std::log(4096.0f)));
  EXPECT_NEAR(r.attention_factor, 1.1902381, 1e-6);
  EXPECT_TRUE(config::ValidateModelConfig(*m, "model").ok());
  EXPECT_EQ(m->ParameterCount(), 3821079552);  // Phi-3 mini's
  // Written back as Phi-3: the factors, the context beside rope_scaling, no attention_factor
  // (the one max_position_embeddings implies); it reads as the same model.
  EXPECT_EQ(HfExportProjections(*m), HfProjections::kFused);
  const std::string written = HfConfigJson(*m, TensorDtype::kBF16);
  EXPECT_THAT(written, HasSubstr("\"architectures\": [\"Phi3ForCausalLM\"]"));
  EXPECT_THAT(written, HasSubstr("\"original_max_position_embeddings\": 4096"));
  EXPECT_THAT(written, HasSubstr("\"type\": \"longrope\", \"short_factor\": [1.0, 1.02, 1.03"));
  EXPECT_THAT(written, Not(HasSubstr("attention_factor")));
  EXPECT_TRUE(CheckHfWritable(*m).ok());
  HfLayout back_layout;
  auto back = ModelFromHfConfig(written, "out/config.json", &back_layout);
  ASSERT_TRUE(back.ok()) << back.status() << "\n" << written;
  EXPECT_EQ(back_layout.projections, HfProjections::kFused);
  EXPECT_EQ(back->rope_scaling, m->rope_scaling);
  EXPECT_EQ(back->ParameterCount(), m->ParameterCount());
  // Another attention factor is written out; so is rope_type su's model (Phi-3's first name).
  config::ModelConfig other = *m;
  other.rope_scaling.attention_factor = 1.5f;
  const std::string other_json = HfConfigJson(other, TensorDtype::kBF16);
  EXPECT_THAT(other_json, HasSubstr("\"attention_factor\": 1.5"));
  EXPECT_EQ(ModelFromHfConfig(other_json, "o/config.json")->rope_scaling, other.rope_scaling);
  // A context no power of two times the original: the implied factor comes out alike on both
  // sides, so it still travels implicitly.
  config::ModelConfig longer = *m;
  longer.max_seq = 100000;
  longer.rope_scaling.attention_factor = config::LongRopeAttentionFactor(100000.0 / 4096, 4096);
  const std::string longer_json = HfConfigJson(longer, TensorDtype::kBF16);
  EXPECT_THAT(longer_json, Not(HasSubstr("attention_factor")));
  EXPECT_EQ(ModelFromHfConfig(longer_json, "l/config.json")->rope_scaling, longer.rope_scaling);
  // The context beside rope_scaling wins over one in it, and with it the extension is
  // max_position_embeddings over it whatever rope_scaling's factor says (transformers' Phi-3).
  std::string inside = kPhi35MiniConfig;
  inside.replace(inside.find("\"type\": \"longrope\""), 18,
                 "\"type\": \"longrope\", \"original_max_position_embeddings\": 2048, "
                 "\"factor\": 2.0");
  auto both = ModelFromHfConfig(inside, "b/config.json");
  ASSERT_TRUE(both.ok()) << both.status();
  EXPECT_EQ(both->rope_scaling, r);
  std::string su = kPhi35MiniConfig;
  su.replace(su.find("\"longrope\""), 10, "\"su\"");
  EXPECT_EQ(ModelFromHfConfig(su, "su/config.json")->rope_scaling, r);
}

// Phi-4 mini's shape (24 heads of 128 over 8 key/value heads, tied embeddings, a vocabulary of
// 200064) turns 3/4 of each head: 96 dimensions, 48 LongRoPE pairs (Phi-3.5's factors stand in).
// 3,836,021,760 parameters by hand: embeddings 200064 · 3072 (tied); per layer q and o
// 2 · 3072², k and v 2 · 1024 · 3072, gate_up 2 · 8192 · 3072, down 8192 · 3072, two norms:
// 100,669,440, times 32; the final norm.
TEST(HfFormat, Phi4MiniConfigTurnsThreeQuartersOfEachHead) {
  std::string json = kPhi35MiniConfig;
  auto set = [&](const std::string& from, const std::string& to) {
    ASSERT_NE(json.find(from), std::string::npos) << from;
    json.replace(json.find(from), from.size(), to);
  };
  set("\"num_attention_heads\": 32", "\"num_attention_heads\": 24");
  set("\"num_key_value_heads\": 32", "\"num_key_value_heads\": 8, \"partial_rotary_factor\": 0.75");
  set("\"tie_word_embeddings\": false", "\"tie_word_embeddings\": true");
  set("\"vocab_size\": 32064", "\"vocab_size\": 200064");
  auto m = ModelFromHfConfig(json, "Phi-4-mini-instruct/config.json");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->head_dim(), 128);
  EXPECT_EQ(m->rope_dim, 96);
  EXPECT_EQ(m->rotary_dim(), 96);
  EXPECT_TRUE(config::ValidateModelConfig(*m, "model").ok());
  EXPECT_EQ(m->ParameterCount(), 3836021760);
  const std::string written = HfConfigJson(*m, TensorDtype::kBF16);
  EXPECT_THAT(written, HasSubstr("\"partial_rotary_factor\": 0.75,"));
  auto back = ModelFromHfConfig(written, "out/config.json");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->rope_dim, 96);
  EXPECT_EQ(back->rope_scaling, m->rope_scaling);
  // Partial RoPE with Qwen2's biases travels as GLM, whose layout has no LongRoPE; wider heads
  // do not travel as Phi-3.
  config::ModelConfig biased = *m;
  biased.qkv_bias = true;
  EXPECT_THAT(CheckHfWritable(biased).message(),
              HasSubstr("model.rope_scaling: is set; Trainyard writes"));
  EXPECT_THAT(CheckHfWritable(biased).message(), HasSubstr("in GLM's and GLM-4's layouts only"));
  config::ModelConfig wide = *m;
  wide.explicit_head_dim = 160;
  EXPECT_THAT(CheckHfWritable(wide).message(), HasSubstr("model.head_dim: is 160"));
  // Phi-3's config has no place for another scaling: Llama 3's with a partial rotation is refused
  // rather than dropped.
  config::ModelConfig llama3 = *m;
  llama3.rope_scaling = {.factor = 8.0f, .original_max_seq = 8192};
  EXPECT_THAT(CheckHfWritable(llama3).message(), HasSubstr("model.rope_scaling: is Llama 3's"));
  // Nor has any layout but Gemma 3's a place for the local blocks' own RoPE base.
  config::ModelConfig local = *config::Preset("llama-debug");
  local.sliding_window = 8;
  local.rope_local_theta = 1000.0f;
  EXPECT_THAT(CheckHfWritable(local).message(), HasSubstr("model.rope_local_theta is set"));
  // A rope_dim of the whole head is no partial rotation: Llama's layout.
  config::ModelConfig whole = *config::Preset("llama-debug");
  whole.rope_dim = whole.head_dim();
  EXPECT_EQ(HfExportProjections(whole), HfProjections::kSeparate);
  EXPECT_THAT(HfConfigJson(whole, TensorDtype::kF32), HasSubstr("LlamaForCausalLM"));
}

// Phi-4's published config: Phi3ForCausalLM with grouped-query attention (40 heads, 10 key/value
// heads of 128) and no window. 14,659,507,200 parameters by hand: embeddings and head
// 2 · 100352 · 5120; per layer q and o 2 · 5120², k and v 2 · 1280 · 5120, gate_up
// 2 · 17920 · 5120, down 17920 · 5120, two norms: 340,797,440, times 40; the final norm.
TEST(HfFormat, Phi4ConfigReadsAsLlama) {
  const std::string json = R"({
    "architectures": ["Phi3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": 100257, "embd_pdrop": 0.0, "eos_token_id": 100265, "hidden_act": "silu",
    "hidden_size": 5120, "initializer_range": 0.02, "intermediate_size": 17920,
    "max_position_embeddings": 16384, "model_type": "phi3", "num_attention_heads": 40,
    "num_hidden_layers": 40, "num_key_value_heads": 10, "original_max_position_embeddings": 16384,
    "pad_token_id": 100349, "resid_pdrop": 0.0, "rms_norm_eps": 1e-05, "rope_scaling": null,
    "rope_theta": 250000, "sliding_window": null, "tie_word_embeddings": false,
    "torch_dtype": "bfloat16", "use_cache": true, "vocab_size": 100352})";
  auto m = ModelFromHfConfig(json, "phi-4/config.json");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->sliding_window, 0);
  EXPECT_EQ(m->kv_heads, 10);
  EXPECT_EQ(m->head_dim(), 128);
  EXPECT_EQ(m->rope_theta, 250000.0f);
  EXPECT_EQ(m->ParameterCount(), 14659507200);
}

// A config.json of SmolLM3 3B's shape (36 layers of 2048 wide, 16 heads over 4 key/value heads,
// every fourth layer NoPE, no tie_word_embeddings key: tied by SmolLM3's default). 3,075,098,624
// parameters by hand: embeddings 128256 · 2048 (tied); per layer q and o 2 · 2048², k and v
// 2 · 512 · 2048, gate, up and down 3 · 11008 · 2048, two norms: 78,123,008, times 36; the final
// norm. Without no_rope_layers the list comes from no_rope_layer_interval; it writes back as
// SmolLM3 and reads back equal, with a window in its NoPE blocks too.
TEST(HfFormat, SmolLM3ConfigReadsAsLlamaWithNopeLayers) {
  std::string flags;
  for (int l = 0; l < 36; ++l)
    absl::StrAppend(&flags, l == 0 ? "" : ", ", (l + 1) % 4 == 0 ? 0 : 1);
  const std::string json = absl::StrCat(R"({
    "architectures": ["SmolLM3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "hidden_act": "silu", "hidden_size": 2048, "intermediate_size": 11008,
    "max_position_embeddings": 65536, "max_window_layers": 28, "mlp_bias": false,
    "model_type": "smollm3", "no_rope_layer_interval": 4, "no_rope_layers": [)",
                                        flags, R"(],
    "num_attention_heads": 16, "num_hidden_layers": 36, "num_key_value_heads": 4,
    "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 5000000.0, "sliding_window": null,
    "torch_dtype": "bfloat16", "use_sliding_window": false, "vocab_size": 128256})");
  auto m = ModelFromHfConfig(json, "SmolLM3-3B/config.json");
  ASSERT_TRUE(m.ok()) << m.status();
  std::vector<int32_t> nope;
  for (int l = 3; l < 36; l += 4) nope.push_back(l);
  EXPECT_EQ(m->nope_layers, nope);
  EXPECT_TRUE(m->tied_embeddings);
  EXPECT_EQ(m->sliding_window, 0);
  EXPECT_EQ(m->rope_theta, 5000000.0f);
  EXPECT_EQ(m->ParameterCount(), 3075098624);
  // The interval alone gives the same list; no_rope_layers wins over it.
  std::string by_interval = json;
  const size_t list = by_interval.find("\"no_rope_layers\": [");
  by_interval.replace(list, by_interval.find(']', list) + 1 - list, "\"no_rope_layers\": null");
  auto interval = ModelFromHfConfig(by_interval, "s/config.json");
  ASSERT_TRUE(interval.ok()) << interval.status();
  EXPECT_EQ(interval->nope_layers, nope);

  const std::string written = HfConfigJson(*m, TensorDtype::kBF16);
  EXPECT_THAT(written, HasSubstr("\"model_type\": \"smollm3\""));
  EXPECT_THAT(written, HasSubstr("\"no_rope_layers\": [1, 1, 1, 0, 1, 1, 1, 0,"));
  auto back = ModelFromHfConfig(written, "out/config.json");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->nope_layers, m->nope_layers);
  EXPECT_EQ(back->tied_embeddings, true);

  // use_sliding_window puts the window in the NoPE blocks; that travels back out too.
  config::ModelConfig windowed = *m;
  windowed.sliding_window = 4096;
  for (int l = 0; l < 36; ++l) {
    if (windowed.RotatesLayer(l)) windowed.full_attention_layers.push_back(l);
  }
  ASSERT_TRUE(CheckHfWritable(windowed).ok()) << CheckHfWritable(windowed);
  auto windowed_back = ModelFromHfConfig(HfConfigJson(windowed, TensorDtype::kBF16), "w.json");
  ASSERT_TRUE(windowed_back.ok()) << windowed_back.status();
  EXPECT_EQ(windowed_back->sliding_window, 4096);
  EXPECT_EQ(windowed_back->full_attention_layers, windowed.full_attention_layers);
  EXPECT_EQ(windowed_back->nope_layers, m->nope_layers);

  // NoPE blocks travel as SmolLM3 only, and SmolLM3's window only in them.
  config::ModelConfig everywhere = windowed;
  everywhere.full_attention_layers.clear();
  EXPECT_THAT(
      CheckHfWritable(everywhere).message(),
      HasSubstr("model.full_attention_layers: does not name exactly the blocks RoPE turns"));
  config::ModelConfig qwen = *m;
  qwen.qkv_bias = true;
  EXPECT_THAT(CheckHfWritable(qwen).message(), HasSubstr("SmolLM3's layout only"));
  config::ModelConfig partial = *m;
  partial.rope_dim = 64;
  EXPECT_THAT(CheckHfWritable(partial).message(), HasSubstr("model.rope_dim: is 64"));
  // A bad list is refused naming the field.
  std::string bad = json;
  bad.replace(bad.find("[1, 1, 1, 0"), 11, "[1, 1, 1, 2");
  EXPECT_THAT(ModelFromHfConfig(bad, "b/config.json").status().message(),
              HasSubstr("b/config.json: no_rope_layers must hold 1 (RoPE) or 0 (none)"));
}

// A GraniteMoE config (32 experts, top 8, in each of 24 blocks of width 1024): Granite's
// multipliers over Mixtral's experts, intermediate_size each expert's; 1,334,628,352 parameters
// by hand (per block the attention's 4 · 1024² − 2 · 1024 · 512, the experts' 32 · 3 · 1024 · 512,
// the router's 32 · 1024 and two norms; 49155 · 1024 tied embeddings and the final norm). Its
// experts' weights are stacked, one tensor of each kind per block.
TEST(HfFormat, GraniteMoeConfigReadsAsGraniteWithExperts) {
  const std::string json = R"({
    "architectures": ["GraniteMoeForCausalLM"], "attention_bias": false,
    "attention_multiplier": 0.015625, "embedding_multiplier": 12.0, "hidden_act": "silu",
    "hidden_size": 1024, "intermediate_size": 512, "logits_scaling": 6.0,
    "max_position_embeddings": 4096, "model_type": "granitemoe", "num_attention_heads": 16,
    "num_experts_per_tok": 8, "num_hidden_layers": 24, "num_key_value_heads": 8,
    "num_local_experts": 32, "output_router_logits": false, "residual_multiplier": 0.22,
    "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 10000, "router_aux_loss_coef": 0.01,
    "tie_word_embeddings": true, "torch_dtype": "bfloat16", "vocab_size": 49155})";
  HfLayout layout;
  auto m = ModelFromHfConfig(json, "granitemoe/config.json", &layout);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(layout.model_type, "granitemoe");
  EXPECT_EQ(layout.experts, HfExperts::kGraniteMoe);
  EXPECT_EQ(HfExportLayout(*m).experts, HfExperts::kGraniteMoe);
  EXPECT_EQ(m->moe.experts, 32);
  EXPECT_EQ(m->moe.top_k, 8);
  EXPECT_EQ(m->moe.ffn, 512);
  EXPECT_EQ(m->moe.every, 1);
  EXPECT_TRUE(m->moe.normalize_top_k);
  EXPECT_EQ(m->moe.aux_loss_coeff, 0.01f);
  EXPECT_EQ(m->residual_multiplier, 0.22f);
  EXPECT_EQ(m->attention_multiplier, 0.015625f);
  const int64_t block = 2 * int64_t{1024} * 1024 + 2 * int64_t{1024} * 512 +
                        32 * 3 * int64_t{1024} * 512 + 32 * 1024 + 2 * 1024;
  EXPECT_EQ(m->ParameterCount(), 24 * block + int64_t{49155} * 1024 + 1024);
  EXPECT_EQ(m->ParameterCount(), 1334628352);

  auto maps = HfTensors(*m, layout);
  ASSERT_TRUE(maps.ok()) << maps.status();
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const HfTensorMap& t : *maps) {
    for (const HfPiece& piece : t.pieces) shapes[piece.name] = HfShape(t, piece);
  }
  const std::string moe = "model.layers.23.block_sparse_moe.";
  EXPECT_EQ(shapes[moe + "input_linear.weight"], (std::vector<int64_t>{32, 1024, 1024}));
  EXPECT_EQ(shapes[moe + "output_linear.weight"], (std::vector<int64_t>{32, 1024, 512}));
  EXPECT_EQ(shapes[moe + "router.layer.weight"], (std::vector<int64_t>{32, 1024}));
  EXPECT_EQ(shapes.count("model.layers.0.block_sparse_moe.experts.0.w1.weight"), 0u);

  const std::string written = HfConfigJson(*m, TensorDtype::kBF16);
  EXPECT_THAT(written, HasSubstr("\"architectures\": [\"GraniteMoeForCausalLM\"]"));
  EXPECT_THAT(written, HasSubstr("\"num_local_experts\": 32"));
  auto back = ModelFromHfConfig(written, "out/config.json");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->moe.experts, 32);
  EXPECT_EQ(back->moe.top_k, 8);
  EXPECT_EQ(back->moe.ffn, 512);
  EXPECT_EQ(back->moe.aux_loss_coeff, 0.01f);
  EXPECT_EQ(back->ParameterCount(), m->ParameterCount());
  EXPECT_EQ(back->logits_scaling, 6.0f);
  // GraniteMoE's experts are Mixtral's: shared experts have no place in it.
  config::ModelConfig shared = *m;
  shared.moe.shared_experts = 1;
  EXPECT_THAT(HfTensors(shared, layout).status().message(),
              HasSubstr("model.moe.shared_experts: is 1"));

  // The directory's model_type, not the multipliers, says the experts are stacked: a GraniteMoE
  // whose multipliers change nothing reads its stacked tensors, and is Mixtral's model, which it
  // exports as (one tensor per expert).
  std::string plain = json;
  for (const std::string field : {"\"embedding_multiplier\": 12.0, ", "\"logits_scaling\": 6.0,",
                                  "\"residual_multiplier\": 0.22,"}) {
    ASSERT_NE(plain.find(field), std::string::npos) << field;
    plain.erase(plain.find(field), field.size());
  }
  plain.replace(plain.find("0.015625"), 8, "0.125");  // head_dim^-1/2, the default scale
  HfLayout plain_layout;
  auto unscaled = ModelFromHfConfig(plain, "plain/config.json", &plain_layout);
  ASSERT_TRUE(unscaled.ok()) << unscaled.status();
  EXPECT_FALSE(unscaled->HasGraniteMultipliers());
  EXPECT_EQ(plain_layout.experts, HfExperts::kGraniteMoe);
  auto stacked = HfTensors(*unscaled, plain_layout);
  ASSERT_TRUE(stacked.ok()) << stacked.status();
  EXPECT_EQ(stacked->size(), maps->size());
  EXPECT_EQ(HfExportLayout(*unscaled).experts, HfExperts::kMixtral);
  EXPECT_THAT(HfConfigJson(*unscaled, TensorDtype::kBF16),
              HasSubstr("\"architectures\": [\"MixtralForCausalLM\"]"));
}

// Granite 3.1 8B's config: Llama's shape with its four multipliers, tied embeddings; 8.17B
// parameters by hand: 49155 · 4096 embeddings, and per block q and o 4096², k and v 4096 · 1024,
// the MLP 3 · 4096 · 12800 and two norms, 40 blocks, the final norm.
TEST(HfFormat, GraniteConfigReadsAsLlamaWithMultipliers) {
  const std::string json = R"({
    "architectures": ["GraniteForCausalLM"], "attention_bias": false, "attention_dropout": 0.1,
    "attention_multiplier": 0.0078125, "embedding_multiplier": 12.0, "hidden_act": "silu",
    "hidden_size": 4096, "intermediate_size": 12800, "logits_scaling": 16.0,
    "max_position_embeddings": 131072, "mlp_bias": false, "model_type": "granite",
    "num_attention_heads": 32, "num_hidden_layers": 40, "num_key_value_heads": 8,
    "residual_multiplier": 0.22, "rms_norm_eps": 1e-05, "rope_scaling": null,
    "rope_theta": 10000000.0, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
    "vocab_size": 49155})";
  auto m = ModelFromHfConfig(json, "granite-3.1-8b/config.json");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->embedding_multiplier, 12.0f);
  EXPECT_EQ(m->residual_multiplier, 0.22f);
  EXPECT_EQ(m->attention_multiplier, 0.0078125f);
  EXPECT_EQ(m->attention_scale(), 0.0078125f);
  EXPECT_EQ(m->logits_scaling, 16.0f);
  EXPECT_EQ(m->embedding_scale(), 12.0f);
  EXPECT_TRUE(m->tied_embeddings);
  EXPECT_EQ(m->ParameterCount(), int64_t{49155} * 4096 +
                                     40 * (2 * int64_t{4096} * 4096 + 2 * int64_t{4096} * 1024 +
                                           3 * int64_t{4096} * 12800 + 2 * 4096) +
                                     4096);
  EXPECT_EQ(m->ParameterCount(), 8170848256);

  const std::string written = HfConfigJson(*m, TensorDtype::kBF16);
  EXPECT_THAT(written, HasSubstr("\"model_type\": \"granite\""));
  EXPECT_THAT(written, HasSubstr("\"residual_multiplier\": 0.22"));
  auto back = ModelFromHfConfig(written, "out/config.json");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->embedding_multiplier, m->embedding_multiplier);
  EXPECT_EQ(back->residual_multiplier, m->residual_multiplier);
  EXPECT_EQ(back->attention_multiplier, m->attention_multiplier);
  EXPECT_EQ(back->logits_scaling, m->logits_scaling);

  // transformers' defaults: every multiplier 1, the scores' too (not head_dim^-1/2).
  std::string plain = json;
  for (const char* key : {"\"attention_multiplier\": 0.0078125,", "\"embedding_multiplier\": 12.0,",
                          "\"logits_scaling\": 16.0,", "\"residual_multiplier\": 0.22,"}) {
    plain.erase(plain.find(key), std::string(key).size());
  }
  auto defaults = ModelFromHfConfig(plain, "d/config.json");
  ASSERT_TRUE(defaults.ok()) << defaults.status();
  EXPECT_EQ(defaults->attention_scale(), 1.0f);
  EXPECT_EQ(defaults->embedding_multiplier, 1.0f);
  // A model without an attention multiplier writes head_dim^-1/2, which reads back as none.
  config::ModelConfig usual = *m;
  usual.attention_multiplier = 0.0f;
  auto usual_back = ModelFromHfConfig(HfConfigJson(usual, TensorDtype::kF32), "u/config.json");
  ASSERT_TRUE(usual_back.ok()) << usual_back.status();
  EXPECT_EQ(usual_back->attention_multiplier, 0.0f);

  // The multipliers travel as Granite only.
  config::ModelConfig normed = *m;
  normed.qk_norm = true;
  EXPECT_THAT(CheckHfWritable(normed).message(), HasSubstr("model.qk_norm: is true"));
  EXPECT_THAT(CheckHfWritable(normed).message(),
              HasSubstr("in Granite's and GraniteMoE's layouts only"));
  config::ModelConfig windowed = *m;
  windowed.sliding_window = 4096;
  EXPECT_THAT(CheckHfWritable(windowed).message(), HasSubstr("model.sliding_window: is 4096"));
  // A multiplier that is not a positive number is refused naming the field.
  std::string bad = json;
  bad.replace(bad.find("0.22"), 4, "-0.5");
  EXPECT_THAT(ModelFromHfConfig(bad, "b/config.json").status().message(),
              HasSubstr("b/config.json: residual_multiplier must be a positive number"));
}

// The refusal of `json` with its first `from` replaced by `to`, read as `source`.
std::string RefusalWith(std::string json, const std::string& from, const std::string& to,
                        const std::string& source) {
  json.replace(json.find(from), from.size(), to);
  return std::string(ModelFromHfConfig(json, source).status().message());
}

// A config of Granite 4.0 Micro's shape (GraniteMoeHybridForCausalLM, every one of its 40 layers
// attention, no experts, RoPE): Granite's model with the MLP as the shared one, 8192 wide. By
// hand: 40 · (q, o 2 · 2560² + k, v 2 · 512·2560 + MLP 3 · 8192·2560 + two norms 2 · 2560) + the
// tied embedding 100352·2560 + the final norm 2560 = 3,402,836,480. Without
// position_embedding_type every block is NoPE; Mamba-2 layers, experts and the defaults that mean
// them are refused.
TEST(HfFormat, GraniteHybridConfigWithAttentionOnlyReadsAsGranite) {
  std::string attention;
  for (int l = 0; l < 40; ++l) absl::StrAppend(&attention, l == 0 ? "" : ", ", "\"attention\"");
  const std::string json = absl::StrCat(R"({
    "architectures": ["GraniteMoeHybridForCausalLM"], "attention_bias": false,
    "attention_multiplier": 0.015625, "embedding_multiplier": 12, "hidden_act": "silu",
    "hidden_size": 2560, "intermediate_size": 8192, "layer_types": [)",
                                        attention, R"(], "logits_scaling": 10,
    "mamba_d_head": 64, "mamba_n_heads": 128, "max_position_embeddings": 131072,
    "model_type": "granitemoehybrid", "num_attention_heads": 40, "num_experts_per_tok": 0,
    "num_hidden_layers": 40, "num_key_value_heads": 8, "num_local_experts": 0,
    "position_embedding_type": "rope", "residual_multiplier": 0.22, "rms_norm_eps": 1e-05,
    "rope_scaling": null, "rope_theta": 10000000, "shared_intermediate_size": 8192,
    "tie_word_embeddings": true, "vocab_size": 100352})");
  HfLayout layout;
  auto m = ModelFromHfConfig(json, "granite-4.0/config.json", &layout);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(layout.projections, HfProjections::kGraniteSharedMlp);
  EXPECT_EQ(m->ffn_hidden, 8192);
  EXPECT_EQ(m->kv_heads, 8);
  EXPECT_EQ(m->embedding_multiplier, 12.0f);
  EXPECT_EQ(m->residual_multiplier, 0.22f);
  EXPECT_EQ(m->attention_multiplier, 0.015625f);
  EXPECT_EQ(m->logits_scaling, 10.0f);
  EXPECT_EQ(m->rope_theta, 1e7f);
  EXPECT_TRUE(m->nope_layers.empty());
  EXPECT_EQ(m->ParameterCount(), 3402836480);
  auto tensors = HfTensors(*m, layout);
  ASSERT_TRUE(tensors.ok()) << tensors.status();
  std::set<std::string> names;
  for (const HfTensorMap& t : *tensors) {
    for (const HfPiece& piece : t.pieces) names.insert(piece.name);
  }
  EXPECT_TRUE(names.count("model.layers.0.shared_mlp.input_linear.weight"));
  EXPECT_TRUE(names.count("model.layers.39.shared_mlp.output_linear.weight"));
  EXPECT_FALSE(names.count("model.layers.0.mlp.gate_proj.weight"));
  // It writes back as Granite (the same model in GraniteForCausalLM's layout).
  auto back = ModelFromHfConfig(HfConfigJson(*m, TensorDtype::kBF16), "config.json", &layout);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(layout.projections, HfProjections::kSeparate);
  EXPECT_EQ(back->ParameterCount(), m->ParameterCount());
  EXPECT_EQ(back->ffn_hidden, m->ffn_hidden);

  std::string unrotated = json;
  unrotated.erase(unrotated.find("\"position_embedding_type\": \"rope\", "), 35);
  auto nope = ModelFromHfConfig(unrotated, "c");
  ASSERT_TRUE(nope.ok()) << nope.status();
  EXPECT_EQ(nope->nope_layers.size(), 40u);
  auto refusal = [&](const std::string& from, const std::string& to) {
    return RefusalWith(json, from, to, "g/config.json");
  };
  EXPECT_THAT(refusal("[\"attention\", ", "[\"mamba\", "),
              HasSubstr("g/config.json: layer_types must name \"attention\" for each of the 40 "
                        "layers (Trainyard does not train Granite 4.0-H's Mamba-2 layers)"));
  EXPECT_THAT(refusal("\"layer_types\"", "\"unused\""),
              HasSubstr("g/config.json: layer_types is missing (transformers then makes every "
                        "layer Mamba-2)"));
  EXPECT_THAT(refusal("\"num_local_experts\": 0", "\"num_local_experts\": 64"),
              HasSubstr("g/config.json: num_local_experts is 64; Trainyard reads Granite 4.0's "
                        "models without experts (0)"));
  EXPECT_THAT(refusal("\"num_local_experts\": 0,", ""), HasSubstr("num_local_experts is 8"));
  EXPECT_THAT(
      refusal("\"position_embedding_type\": \"rope\"", "\"position_embedding_type\": \"alibi\""),
      HasSubstr("g/config.json: position_embedding_type must be \"rope\" or null"));
}

// A config.json of Mistral Nemo's shape: 32 heads of 128 over a width of 5120, so q and the
// output projection are 4096 wide, not 5120. head_dim is the model's and travels back out; a
// head_dim equal to hidden_size / num_attention_heads (or null) is the plain model.
TEST(HfFormat, HeadDimWiderThanTheWidthSplitIsTheModels) {
  std::string json = R"({
    "architectures": ["MistralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1,
    "eos_token_id": 2, "head_dim": 128, "hidden_act": "silu", "hidden_size": 5120,
    "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 1024000,
    "model_type": "mistral", "num_attention_heads": 32, "num_hidden_layers": 40,
    "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_theta": 1000000.0,
    "sliding_window": null, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
    "use_cache": true, "vocab_size": 131072})";
  auto m = ModelFromHfConfig(json, "Mistral-Nemo/config.json");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->width, 5120);
  EXPECT_EQ(m->head_dim(), 128);
  EXPECT_EQ(m->attention_width(), 4096);
  EXPECT_EQ(m->qkv_width(), 6144);
  // By hand: 40 · (q 4096·5120 + k, v 2 · 1024·5120 + o 5120·4096 + MLP 3 · 14336·5120 + norms
  // 2 · 5120) + untied embedding and head 2 · 131072·5120 + the final norm 5120 (the card's 12B).
  EXPECT_EQ(m->ParameterCount(), int64_t{12247782400});

  const std::string written = HfConfigJson(*m, TensorDtype::kBF16);
  EXPECT_THAT(written, HasSubstr("\"head_dim\": 128"));
  auto back = ModelFromHfConfig(written, "config.json");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->head_dim(), 128);
  EXPECT_EQ(back->ParameterCount(), m->ParameterCount());

  json.replace(json.find("\"head_dim\": 128"), 15, "\"head_dim\": 160");
  m = ModelFromHfConfig(json, "config.json");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->explicit_head_dim, 0);
  EXPECT_EQ(m->head_dim(), 160);
  json.replace(json.find("\"head_dim\": 160"), 15, "\"head_dim\": 127");
  EXPECT_THAT(ModelFromHfConfig(json, "config.json").status().message(),
              HasSubstr("head_dim: RoPE needs an even head dimension, got 127"));
}

// A config.json of Qwen3 0.6B's shape (Qwen3ForCausalLM's keys): Llama's model with heads of 128
// over a width of 1024 and norms of each query and key head. Written back, it is Qwen3 again;
// with q, k and v biases too it has no layout.
TEST(HfFormat, Qwen3ConfigReadsAsLlamaWithQueryAndKeyNorms) {
  const std::string json = R"({
    "architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
    "hidden_size": 1024, "initializer_range": 0.02, "intermediate_size": 3072,
    "max_position_embeddings": 40960, "max_window_layers": 28, "model_type": "qwen3",
    "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000, "sliding_window": null,
    "tie_word_embeddings": true, "torch_dtype": "bfloat16", "use_cache": true,
    "use_sliding_window": false, "vocab_size": 151936})";
  auto m = ModelFromHfConfig(json, "Qwen3-0.6B/config.json");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_TRUE(m->qk_norm);
  EXPECT_FALSE(m->qkv_bias);
  EXPECT_EQ(m->head_dim(), 128);
  EXPECT_EQ(m->attention_width(), 2048);
  EXPECT_TRUE(m->tied_embeddings);
  // By hand: 28 · (q 2048·1024 + k, v 2 · 1024·1024 + o 1024·2048 + MLP 3 · 3072·1024 + norms
  // 2 · 1024 + head norms 2 · 128) + the embedding 151936·1024 + the final norm 1024: the card's
  // 0.6B (0.44B without the embedding).
  EXPECT_EQ(m->ParameterCount(), 596049920);

  const std::string written = HfConfigJson(*m, TensorDtype::kBF16);
  EXPECT_THAT(written, HasSubstr("\"architectures\": [\"Qwen3ForCausalLM\"]"));
  EXPECT_THAT(written, HasSubstr("\"attention_bias\": false"));
  auto back = ModelFromHfConfig(written, "config.json");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(back->qk_norm);
  EXPECT_EQ(back->ParameterCount(), m->ParameterCount());
  auto tensors = HfTensors(*m);
  ASSERT_TRUE(tensors.ok()) << tensors.status();
  int norms = 0;
  for (const HfTensorMap& t : *tensors) {
    for (const auto& piece : t.pieces) {
      if (piece.name.find("self_attn.q_norm.weight") != std::string::npos ||
          piece.name.find("self_attn.k_norm.weight") != std::string::npos) {
        ++norms;
      }
    }
  }
  EXPECT_EQ(norms, 2 * 28);

  config::ModelConfig biased = *m;
  biased.qkv_bias = true;
  EXPECT_THAT(HfTensors(biased).status().message(), HasSubstr("model.qk_norm with model.qkv_bias"));
  // Qwen3's attention_bias also biases o_proj, which Trainyard's model has not.
  std::string with_bias = json;
  with_bias.replace(with_bias.find("\"attention_bias\": false"), 23, "\"attention_bias\": true");
  EXPECT_THAT(ModelFromHfConfig(with_bias, "config.json").status().message(),
              HasSubstr("attention_bias"));
}

// Gemma 2B's published config.json (GemmaForCausalLM): Llama's model with GeGLU, embeddings scaled
// by √2048, tied embeddings, one key/value head, and each norm's weight stored less one. Its
// hidden_act "gelu" is the tanh approximation Gemma was trained with (transformers reads it so
// without hidden_activation); an explicit exact GELU is refused.
TEST(HfFormat, GemmaConfigReadsAsLlamaWithGegluAndScaledEmbeddings) {
  const std::string json = R"({
    "architectures": ["GemmaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": 2, "eos_token_id": 1, "head_dim": 256, "hidden_act": "gelu",
    "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 16384,
    "max_position_embeddings": 8192, "model_type": "gemma", "num_attention_heads": 8,
    "num_hidden_layers": 18, "num_key_value_heads": 1, "pad_token_id": 0, "rms_norm_eps": 1e-06,
    "rope_scaling": null, "rope_theta": 10000.0, "torch_dtype": "bfloat16",
    "transformers_version": "4.38.0.dev0", "use_cache": true, "vocab_size": 256000})";
  auto m = ModelFromHfConfig(json, "gemma-2b/config.json");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->family, config::ModelFamily::kLlama);
  EXPECT_TRUE(m->geglu);
  EXPECT_TRUE(m->scale_embeddings);
  EXPECT_TRUE(m->tied_embeddings);  // Gemma's default: the config does not say
  EXPECT_EQ(m->kv_heads, 1);
  EXPECT_EQ(m->head_dim(), 256);
  EXPECT_EQ(m->norm_eps, 1e-6f);
  EXPECT_EQ(m->embedding_scale(), static_cast<float>(std::sqrt(2048.0)));
  // By hand: 18 · (q 2048·2048 + k, v 2 · 256·2048 + o 2048·2048 + MLP 3 · 16384·2048 + norms
  // 2 · 2048) + the embedding 256000·2048 + the final norm 2048: the card's 2.5B.
  EXPECT_EQ(m->ParameterCount(), 2506172416);

  const std::string written = HfConfigJson(*m, TensorDtype::kBF16);
  EXPECT_THAT(written, HasSubstr("\"architectures\": [\"GemmaForCausalLM\"]"));
  EXPECT_THAT(written, HasSubstr("\"hidden_activation\": \"gelu_pytorch_tanh\""));
  auto back = ModelFromHfConfig(written, "config.json");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(back->geglu && back->scale_embeddings && back->tied_embeddings);
  EXPECT_EQ(back->ParameterCount(), m->ParameterCount());
  // Every RMSNorm weight, and nothing else, is stored less one.
  auto tensors = HfTensors(*m);
  ASSERT_TRUE(tensors.ok()) << tensors.status();
  int shifted = 0;
  for (const HfTensorMap& t : *tensors) {
    const bool norm = t.pieces[0].name.find("norm.weight") != std::string::npos;
    EXPECT_EQ(t.shift, norm ? 1.0f : 0.0f) << t.name;
    shifted += t.shift != 0.0f;
  }
  EXPECT_EQ(shifted, 2 * 18 + 1);
  const HfTensorMap& lnf = tensors->back();
  const float ours[] = {1.5f, 0.25f}, theirs[] = {0.5f, -0.75f};
  HfTensorMap norm{lnf.name, {2}, {{lnf.pieces[0].name, 0, 2}}, 1.0f};
  float out[2];
  ToHf(norm, norm.pieces[0], ours, out);
  EXPECT_THAT(out, ::testing::ElementsAre(0.5f, -0.75f));
  FromHf(norm, norm.pieces[0], theirs, out);
  EXPECT_THAT(out, ::testing::ElementsAre(1.5f, 0.25f));

  auto with = [&](const std::string& from, const std::string& to) {
    std::string changed = json;
    changed.replace(changed.find(from), from.size(), to);
    return ModelFromHfConfig(changed, "g/config.json");
  };
  // Gemma 1.1's configs name the approximation; heads default to 256 wide.
  EXPECT_TRUE(with("\"hidden_act\": \"gelu\"",
                   "\"hidden_act\": \"gelu\", \"hidden_activation\": \"gelu_pytorch_tanh\"")
                  .ok());
  EXPECT_EQ(with("\"head_dim\": 256, ", "")->head_dim(), 256);
  EXPECT_FALSE(
      with("\"rope_theta\"", "\"tie_word_embeddings\": false, \"rope_theta\"")->tied_embeddings);
  EXPECT_THAT(
      with("\"hidden_act\": \"gelu\"", "\"hidden_act\": \"gelu\", \"hidden_activation\": \"gelu\"")
          .status()
          .message(),
      HasSubstr("g/config.json: hidden_activation must be \"gelu_pytorch_tanh\""));
  EXPECT_THAT(with("\"hidden_act\": \"gelu\"", "\"hidden_act\": \"silu\"").status().message(),
              HasSubstr("g/config.json: hidden_act must be \"gelu_pytorch_tanh\""));

  // GeGLU and scaled embeddings travel together, and with nothing of Gemma's later models.
  config::ModelConfig half = *m;
  half.scale_embeddings = false;
  EXPECT_THAT(HfTensors(half).status().message(),
              HasSubstr("model.scale_embeddings: is false with activation geglu"));
  half = *m;
  half.geglu = false;
  EXPECT_THAT(HfTensors(half).status().message(),
              HasSubstr("model.activation: is swiglu with scale_embeddings"));
  config::ModelConfig windowed = *m;
  windowed.sliding_window = 4096;
  EXPECT_EQ(HfTensors(windowed).status().code(), absl::StatusCode::kUnimplemented);
}

// Gemma 3 1B's published config.json (Gemma3ForCausalLM, model_type gemma3_text): Gemma's model
// with query and key norms, norms of the attention's and the MLP's outputs, and every sixth block
// global: blocks 5, 11, 17 and 23 attend to every position with RoPE base 1,000,000, the others to
// 512 positions with base 10,000. By hand: 26 · (q 1024·1152 + k, v 2 · 256·1152 + o 1152·1024
// + head norms 2 · 256 + MLP 3 · 6912·1152 + four norms 4 · 1152) + the tied embedding
// 262144·1152 + the final norm 1152 = 999,885,952 (the card's 1B).
TEST(HfFormat, Gemma3ConfigReadsAsLlamaWithPostNormsAndLocalBlocks) {
  const std::string json = R"({
    "architectures": ["Gemma3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "attn_logit_softcapping": null, "bos_token_id": 2, "cache_implementation": "hybrid",
    "eos_token_id": [1, 106], "final_logit_softcapping": null, "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 1152, "initializer_range": 0.02,
    "intermediate_size": 6912, "max_position_embeddings": 32768, "model_type": "gemma3_text",
    "num_attention_heads": 4, "num_hidden_layers": 26, "num_key_value_heads": 1,
    "pad_token_id": 0, "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06,
    "rope_local_base_freq": 10000, "rope_scaling": null, "rope_theta": 1000000,
    "sliding_window": 512, "sliding_window_pattern": 6, "torch_dtype": "bfloat16",
    "transformers_version": "4.50.0.dev0", "use_cache": true, "vocab_size": 262144})";
  auto m = ModelFromHfConfig(json, "gemma-3-1b/config.json");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_TRUE(m->geglu && m->scale_embeddings && m->qk_norm && m->post_norms);
  EXPECT_TRUE(m->tied_embeddings);
  EXPECT_EQ(m->sliding_window, 512);
  EXPECT_EQ(m->full_attention_layers, (std::vector<int32_t>{5, 11, 17, 23}));
  EXPECT_EQ(m->rope_theta, 1e6f);
  EXPECT_EQ(m->rope_local_theta, 1e4f);
  EXPECT_EQ(m->ParameterCount(), 999885952);

  const std::string written = HfConfigJson(*m, TensorDtype::kBF16);
  EXPECT_THAT(written, HasSubstr("\"architectures\": [\"Gemma3ForCausalLM\"]"));
  EXPECT_THAT(written, HasSubstr("\"sliding_window_pattern\": 6"));
  EXPECT_TRUE(CheckHfWritable(*m).ok());
  auto back = ModelFromHfConfig(written, "config.json");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->full_attention_layers, m->full_attention_layers);
  EXPECT_EQ(back->rope_local_theta, m->rope_local_theta);
  EXPECT_EQ(back->ParameterCount(), m->ParameterCount());
  // The norms' names: the attention output's is post_attention_layernorm, the MLP input's
  // pre_feedforward_layernorm; every norm, the head norms too, stored less one.
  auto tensors = HfTensors(*m);
  ASSERT_TRUE(tensors.ok()) << tensors.status();
  std::map<std::string, std::string> names;
  int shifted = 0;
  for (const HfTensorMap& t : *tensors) {
    names[t.name] = t.pieces[0].name;
    shifted += t.shift == 1.0f;
  }
  EXPECT_EQ(names["h.0.attn.post_norm.w"], "model.layers.0.post_attention_layernorm.weight");
  EXPECT_EQ(names["h.0.ln2.w"], "model.layers.0.pre_feedforward_layernorm.weight");
  EXPECT_EQ(names["h.0.mlp.post_norm.w"], "model.layers.0.post_feedforward_layernorm.weight");
  EXPECT_EQ(shifted, 6 * 26 + 1);

  auto with = [&](const std::string& from, const std::string& to) {
    std::string changed = json;
    changed.replace(changed.find(from), from.size(), to);
    return ModelFromHfConfig(changed, "g/config.json");
  };
  // Gemma 3 27B's scores scale by 168^-1/2; a soft cap is read as Gemma 2's.
  auto scaled = with("\"query_pre_attn_scalar\": 256", "\"query_pre_attn_scalar\": 168");
  ASSERT_TRUE(scaled.ok()) << scaled.status();
  EXPECT_EQ(scaled->attention_scale_dim, 168);
  auto capped = with("\"final_logit_softcapping\": null", "\"final_logit_softcapping\": 30.0");
  ASSERT_TRUE(capped.ok()) << capped.status();
  EXPECT_EQ(capped->logit_softcap, 30.0f);
  EXPECT_THAT(with("\"final_logit_softcapping\": null", "\"final_logit_softcapping\": -1")
                  .status()
                  .message(),
              HasSubstr("g/config.json: final_logit_softcapping must be a positive number"));
  // Gemma 3 4B's global blocks scale RoPE linearly (the local ones turn unscaled at their own
  // base), and such a model writes it back.
  auto linear = with("\"rope_scaling\": null",
                     "\"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": 8.0}");
  ASSERT_TRUE(linear.ok()) << linear.status();
  EXPECT_TRUE(linear->rope_scaling.linear);
  EXPECT_EQ(linear->rope_scaling.factor, 8.0f);
  EXPECT_EQ(linear->rope_local_theta, 1e4f);
  const std::string linear_json = HfConfigJson(*linear, TensorDtype::kBF16);
  EXPECT_THAT(linear_json,
              HasSubstr("\"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": 8.0}"));
  EXPECT_TRUE(HfTensors(*linear).ok());
  auto linear_back = ModelFromHfConfig(linear_json, "config.json");
  ASSERT_TRUE(linear_back.ok()) << linear_back.status();
  EXPECT_EQ(linear_back->rope_scaling, linear->rope_scaling);
  // With a local base equal to the global one the local blocks stay unscaled all the same.
  std::string same = json;
  for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{
           {"\"rope_local_base_freq\": 10000", "\"rope_local_base_freq\": 1000000"},
           {"\"rope_scaling\": null",
            "\"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": 8.0}"}}) {
    same.replace(same.find(from), from.size(), to);
  }
  auto same_base = ModelFromHfConfig(same, "config.json");
  ASSERT_TRUE(same_base.ok()) << same_base.status();
  EXPECT_EQ(same_base->rope_local_theta, 1e6f);
  config::ModelConfig scaled_local = *same_base;
  scaled_local.rope_local_theta = 0.0f;
  EXPECT_THAT(HfTensors(scaled_local).status().message(),
              HasSubstr("model.rope_local_theta: is 0 with rope_scaling"));
  // A pattern Gemma 3's config cannot say is refused at export.
  config::ModelConfig odd = *m;
  odd.full_attention_layers = {5, 12};
  EXPECT_THAT(CheckHfWritable(odd).message(), HasSubstr("sliding_window_pattern"));
  // Without query and key norms it is Gemma 2, whose local blocks are the even ones.
  config::ModelConfig plain = *m;
  plain.qk_norm = false;
  EXPECT_THAT(CheckHfWritable(plain).message(), HasSubstr("Gemma 2's local and global blocks"));
}

// Gemma 3 4B's published config.json (Gemma3ForConditionalGeneration, model_type gemma3): the
// language model in text_config, which gives only what differs from Gemma3TextConfig's defaults
// (262,208 tokens, heads 8 of 256 over 4 key/value heads, every sixth block global at RoPE base
// 1,000,000 scaled linearly by 8, the others windowed to 1024 at base 10,000). By hand: 34 ·
// (q 2048·2560 + k, v 2 · 1024·2560 + o 2560·2048 + head norms 2 · 256 + MLP 3 · 10240·2560 +
// four norms 4 · 2560) + the tied embedding 262208·2560 + the final norm 2560 = 3,880,263,168
// (the language model of the card's 4B; the vision tower is not read).
TEST(HfFormat, MultimodalGemma3ConfigReadsAsItsLanguageModel) {
  const std::string json = R"({
    "architectures": ["Gemma3ForConditionalGeneration"], "boi_token_index": 255999,
    "eoi_token_index": 256000, "eos_token_id": [1, 106], "image_token_index": 262144,
    "initializer_range": 0.02, "mm_tokens_per_image": 256, "model_type": "gemma3",
    "text_config": {"hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text",
      "num_hidden_layers": 34, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
      "sliding_window": 1024},
    "torch_dtype": "bfloat16", "transformers_version": "4.50.0.dev0",
    "vision_config": {"hidden_size": 1152, "image_size": 896, "intermediate_size": 4304,
      "model_type": "siglip_vision_model", "num_attention_heads": 16, "num_hidden_layers": 27,
      "patch_size": 14, "vision_use_head": false}})";
  HfLayout layout;
  auto m = ModelFromHfConfig(json, "gemma-3-4b-it/config.json", &layout);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_TRUE(layout.multimodal);
  EXPECT_TRUE(m->geglu && m->scale_embeddings && m->qk_norm && m->post_norms);
  EXPECT_EQ(m->vocab, 262208);
  EXPECT_EQ(m->head_dim(), 256);
  EXPECT_EQ(m->kv_heads, 4);
  EXPECT_EQ(m->sliding_window, 1024);
  EXPECT_EQ(m->full_attention_layers, (std::vector<int32_t>{5, 11, 17, 23, 29}));
  EXPECT_EQ(m->rope_scaling, (config::RopeScaling{.linear = true, .factor = 8.0f}));
  EXPECT_EQ(m->rope_theta, 1e6f);
  EXPECT_EQ(m->rope_local_theta, 1e4f);
  EXPECT_EQ(m->ParameterCount(), 3880263168);
  // Written back it is the text model (Gemma3ForCausalLM), which reads as the same model.
  auto back = ModelFromHfConfig(HfConfigJson(*m, TensorDtype::kBF16), "config.json", &layout);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_FALSE(layout.multimodal);
  EXPECT_EQ(back->ParameterCount(), m->ParameterCount());
  EXPECT_EQ(back->rope_scaling, m->rope_scaling);
  EXPECT_THAT(ModelFromHfConfig(R"({"model_type": "gemma3"})", "g/config.json").status().message(),
              HasSubstr("g/config.json: text_config is missing"));

  // Its tensors: the language model's under either prefix, the vision tower's and projector's
  // not read.
  const HfLayout mm{.multimodal = true};
  const auto llama = config::ModelFamily::kLlama;
  EXPECT_EQ(HfLookupName("language_model.model.layers.0.mlp.up_proj.weight", llama, mm),
            "model.layers.0.mlp.up_proj.weight");
  EXPECT_EQ(HfLookupName("model.language_model.embed_tokens.weight", llama, mm),
            "model.embed_tokens.weight");
  EXPECT_EQ(HfLookupName("language_model.lm_head.weight", llama, mm), "lm_head.weight");
  EXPECT_EQ(HfLookupName("vision_tower.vision_model.post_layernorm.weight", llama, mm),
            std::nullopt);
  EXPECT_EQ(HfLookupName("model.multi_modal_projector.mm_soft_emb_norm.weight", llama, mm),
            std::nullopt);
  EXPECT_EQ(HfLookupName("model.vision_tower.x", llama, HfLayout{}), "model.vision_tower.x");
  EXPECT_EQ(HfLookupName("transformer.h.0.attn.c_attn.weight", config::ModelFamily::kGpt2, {}),
            "h.0.attn.c_attn.weight");
}

// Mistral Small 3.1's config.json (Mistral3ForConditionalGeneration, model_type mistral3): a
// Mistral language model in text_config (no window, 128-wide heads under a 5120 width, RoPE base
// 1e9), beside a Pixtral vision tower that is not read. By hand: 40 · (q 4096·5120 + k, v
// 2 · 1024·5120 + o 5120·4096 + MLP 3 · 32768·5120 + two norms 2 · 5120) + the embedding and the
// untied head 2 · 131072·5120 + the final norm 5120 = 23,572,403,200.
TEST(HfFormat, Mistral3ConfigReadsAsItsLanguageModel) {
  const std::string json = R"({
    "architectures": ["Mistral3ForConditionalGeneration"], "image_token_index": 10,
    "model_type": "mistral3", "multimodal_projector_bias": false, "projector_hidden_act": "gelu",
    "spatial_merge_size": 2,
    "text_config": {"attention_dropout": 0.0, "head_dim": 128, "hidden_act": "silu",
      "hidden_size": 5120, "initializer_range": 0.02, "intermediate_size": 32768,
      "max_position_embeddings": 131072, "model_type": "mistral", "num_attention_heads": 32,
      "num_hidden_layers": 40, "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
      "rope_theta": 1000000000.0, "sliding_window": null, "use_cache": true,
      "vocab_size": 131072},
    "torch_dtype": "bfloat16", "transformers_version": "4.50.0.dev0",
    "vision_config": {"head_dim": 64, "hidden_size": 1024, "model_type": "pixtral",
      "num_attention_heads": 16, "num_hidden_layers": 24, "patch_size": 14},
    "vision_feature_layer": -1})";
  HfLayout layout;
  auto m = ModelFromHfConfig(json, "mistral-small/config.json", &layout);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_TRUE(layout.multimodal);
  EXPECT_EQ(m->family, config::ModelFamily::kLlama);
  EXPECT_EQ(m->vocab, 131072);
  EXPECT_EQ(m->head_dim(), 128);
  EXPECT_EQ(m->kv_heads, 8);
  EXPECT_EQ(m->sliding_window, 0);
  EXPECT_EQ(m->rope_theta, 1e9f);
  EXPECT_EQ(m->norm_eps, 1e-5f);
  EXPECT_FALSE(m->tied_embeddings);
  EXPECT_EQ(m->ParameterCount(), 23572403200);
  // Written back it is the text model, which reads as the same model.
  auto back = ModelFromHfConfig(HfConfigJson(*m, TensorDtype::kBF16), "config.json", &layout);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_FALSE(layout.multimodal);
  EXPECT_EQ(back->ParameterCount(), m->ParameterCount());
  EXPECT_EQ(back->head_dim(), 128);

  // What a text_config leaves out is MistralConfig's: a 4096 window, RoPE base 10,000.
  auto sparse = ModelFromHfConfig(R"({"model_type": "mistral3", "text_config": {
      "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
      "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512,
      "max_position_embeddings": 8192}})",
                                  "m/config.json");
  ASSERT_TRUE(sparse.ok()) << sparse.status();
  EXPECT_EQ(sparse->sliding_window, 4096);
  EXPECT_EQ(sparse->rope_theta, 1e4f);
  EXPECT_EQ(sparse->norm_eps, 1e-6f);
  EXPECT_THAT(
      ModelFromHfConfig(R"({"model_type": "mistral3"})", "m/config.json").status().message(),
      HasSubstr("m/config.json: text_config is missing (a Mistral 3's language model is there)"));
  EXPECT_THAT(ModelFromHfConfig(R"({"model_type": "mistral3", "text_config": {
                  "model_type": "ministral3", "hidden_size": 256}})",
                                "m/config.json")
                  .status()
                  .message(),
              HasSubstr("m/config.json: text_config: model_type must be \"mistral\""));
  EXPECT_THAT(ModelFromHfConfig(R"({"model_type": "mistral3", "tie_word_embeddings": true,
                  "text_config": {"hidden_size": 256, "intermediate_size": 512,
                  "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 512}})",
                                "m/config.json")
                  .status()
                  .message(),
              HasSubstr("m/config.json: tie_word_embeddings is true but text_config's is false"));
}

// Gemma 2 2B's published config.json (Gemma2ForCausalLM): Gemma's model with norms of the
// attention's and the MLP's outputs, the even blocks windowed to 4096 positions, scores capped at
// 50 and logits at 30. By hand: 26 · (q 2048·2304 + k, v 2 · 1024·2304 + o 2304·2048 + MLP
// 3 · 9216·2304 + four norms 4 · 2304) + the tied embedding 256000·2304 + the final norm 2304 =
// 2,614,341,888 (the card's 2.6B).
TEST(HfFormat, Gemma2ConfigReadsAsLlamaWithSoftCapsAndLocalBlocks) {
  const std::string json = R"({
    "architectures": ["Gemma2ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "attn_logit_softcapping": 50.0, "bos_token_id": 2, "cache_implementation": "hybrid",
    "eos_token_id": 1, "final_logit_softcapping": 30.0, "head_dim": 256,
    "hidden_act": "gelu_pytorch_tanh", "hidden_activation": "gelu_pytorch_tanh",
    "hidden_size": 2304, "initializer_range": 0.02, "intermediate_size": 9216,
    "max_position_embeddings": 8192, "model_type": "gemma2", "num_attention_heads": 8,
    "num_hidden_layers": 26, "num_key_value_heads": 4, "pad_token_id": 0,
    "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06, "rope_theta": 10000.0,
    "sliding_window": 4096, "torch_dtype": "float32", "transformers_version": "4.42.4",
    "use_cache": true, "vocab_size": 256000})";
  auto m = ModelFromHfConfig(json, "gemma-2-2b/config.json");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_TRUE(m->geglu && m->scale_embeddings && m->post_norms && m->tied_embeddings);
  EXPECT_FALSE(m->qk_norm);
  EXPECT_EQ(m->attention_scale_dim, 0);  // 256 is the head_dim
  EXPECT_EQ(m->attention_softcap, 50.0f);
  EXPECT_EQ(m->logit_softcap, 30.0f);
  EXPECT_EQ(m->sliding_window, 4096);
  std::vector<int32_t> odd;
  for (int l = 1; l < 26; l += 2) odd.push_back(l);
  EXPECT_EQ(m->full_attention_layers, odd);
  EXPECT_EQ(m->rope_local_theta, 0.0f);
  EXPECT_EQ(m->ParameterCount(), 2614341888);

  const std::string written = HfConfigJson(*m, TensorDtype::kF32);
  EXPECT_THAT(written, HasSubstr("\"architectures\": [\"Gemma2ForCausalLM\"]"));
  EXPECT_THAT(written, HasSubstr("\"attn_logit_softcapping\": 50"));
  EXPECT_THAT(written, HasSubstr("\"final_logit_softcapping\": 30"));
  EXPECT_THAT(written, Not(HasSubstr("sliding_window_pattern")));
  EXPECT_TRUE(CheckHfWritable(*m).ok());
  auto back = ModelFromHfConfig(written, "config.json");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->full_attention_layers, m->full_attention_layers);
  EXPECT_EQ(back->attention_softcap, 50.0f);
  EXPECT_EQ(back->logit_softcap, 30.0f);
  EXPECT_FALSE(back->qk_norm);
  EXPECT_EQ(back->ParameterCount(), m->ParameterCount());
  auto tensors = HfTensors(*m);
  ASSERT_TRUE(tensors.ok()) << tensors.status();
  int shifted = 0;
  for (const HfTensorMap& t : *tensors) shifted += t.shift == 1.0f;
  EXPECT_EQ(shifted, 4 * 26 + 1);  // every norm stored less one

  auto with = [&](const std::string& from, const std::string& to) {
    std::string changed = json;
    changed.replace(changed.find(from), from.size(), to);
    return ModelFromHfConfig(changed, "g/config.json");
  };
  // Gemma 2 27B's shape: heads 128 wide, scores scaled by 144^-1/2. By hand: 46 · (q 4096·4608 +
  // k, v 2 · 2048·4608 + o 4608·4096 + MLP 3 · 36864·4608 + 4 · 4608) + 256000·4608 + 4608 =
  // 27,227,128,320.
  std::string big = json;
  for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{
           {"\"head_dim\": 256", "\"head_dim\": 128"},
           {"\"hidden_size\": 2304", "\"hidden_size\": 4608"},
           {"\"intermediate_size\": 9216", "\"intermediate_size\": 36864"},
           {"\"num_attention_heads\": 8", "\"num_attention_heads\": 32"},
           {"\"num_hidden_layers\": 26", "\"num_hidden_layers\": 46"},
           {"\"num_key_value_heads\": 4", "\"num_key_value_heads\": 16"},
           {"\"query_pre_attn_scalar\": 256", "\"query_pre_attn_scalar\": 144"}}) {
    big.replace(big.find(from), from.size(), to);
  }
  auto large = ModelFromHfConfig(big, "gemma-2-27b/config.json");
  ASSERT_TRUE(large.ok()) << large.status();
  EXPECT_EQ(large->attention_scale_dim, 144);
  EXPECT_EQ(large->attention_scale(), 1.0f / 12.0f);
  EXPECT_EQ(large->ParameterCount(), 27227128320);
  EXPECT_THAT(HfConfigJson(*large, TensorDtype::kBF16),
              HasSubstr("\"query_pre_attn_scalar\": 144"));
  // No window at all (one as long as the context): every block attends to every position.
  auto unwindowed = with("\"sliding_window\": 4096", "\"sliding_window\": 8192");
  ASSERT_TRUE(unwindowed.ok()) << unwindowed.status();
  EXPECT_EQ(unwindowed->sliding_window, 0);
  EXPECT_THAT(with("\"attn_logit_softcapping\": 50.0", "\"attn_logit_softcapping\": \"x\"")
                  .status()
                  .message(),
              HasSubstr("attn_logit_softcapping must be a positive number"));
  EXPECT_THAT(
      with("\"hidden_activation\": \"gelu_pytorch_tanh\"", "\"hidden_activation\": \"gelu\"")
          .status()
          .message(),
      HasSubstr("hidden_activation must be \"gelu_pytorch_tanh\""));
  // Local blocks Gemma 2's config cannot say, a local RoPE base, and scores or caps on a model
  // that is not Gemma 2 or 3, are refused at export.
  config::ModelConfig shifted_blocks = *m;
  shifted_blocks.full_attention_layers = {0, 2};
  EXPECT_THAT(CheckHfWritable(shifted_blocks).message(),
              HasSubstr("Gemma 2's local and global blocks"));
  config::ModelConfig local_rope = *m;
  local_rope.rope_local_theta = 500.0f;
  EXPECT_THAT(HfTensors(local_rope).status().message(),
              HasSubstr("model.rope_local_theta: is set with post_norms but without qk_norm"));
  config::ModelConfig llama = *config::Preset("llama-debug");
  llama.logit_softcap = 30.0f;
  EXPECT_THAT(HfTensors(llama).status().message(),
              HasSubstr("model.logit_softcap is set; Trainyard writes and reads scaled or "
                        "soft-capped scores in Gemma 2's and Gemma 3's layouts only"));
}

// Gemma 7B's shape: 16 heads of 256 over a width of 3072 (q 4096 wide). By hand: 28 · (q, k, v
// 3 · 4096·3072 + o 3072·4096 + MLP 3 · 24576·3072 + norms 2 · 3072) + the embedding
// 256000·3072 + the final norm 3072: the card's 8.5B.
TEST(HfFormat, Gemma7bConfigHasWideHeads) {
  const std::string json = R"({
    "architectures": ["GemmaForCausalLM"], "attention_bias": false, "bos_token_id": 2,
    "eos_token_id": 1, "head_dim": 256, "hidden_act": "gelu",
    "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 3072, "intermediate_size": 24576,
    "max_position_embeddings": 8192, "model_type": "gemma", "num_attention_heads": 16,
    "num_hidden_layers": 28, "num_key_value_heads": 16, "pad_token_id": 0, "rms_norm_eps": 1e-06,
    "rope_scaling": null, "rope_theta": 10000.0, "torch_dtype": "bfloat16", "vocab_size": 256000})";
  auto m = ModelFromHfConfig(json, "gemma-7b/config.json");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->explicit_head_dim, 256);
  EXPECT_EQ(m->attention_width(), 4096);
  EXPECT_EQ(m->ParameterCount(), 8537680896);
  auto back = ModelFromHfConfig(HfConfigJson(*m, TensorDtype::kBF16), "config.json");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->head_dim(), 256);
  EXPECT_EQ(back->ParameterCount(), m->ParameterCount());
}

// A config.json of Qwen3-30B-A3B's shape (Qwen3MoeForCausalLM's keys): Qwen3's attention and 128
// experts of 768, 8 per token, renormalised, in every block. Written back it is Qwen3-MoE again,
// also with MoE every second block and the top k as scored; blocks forced dense are refused.
TEST(HfFormat, Qwen3MoeConfigReadsAsLlamaMoeWithQueryAndKeyNorms) {
  const std::string json = R"({
    "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151645, "head_dim": 128,
    "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
    "intermediate_size": 6144, "max_position_embeddings": 40960, "max_window_layers": 48,
    "mlp_only_layers": [], "model_type": "qwen3_moe", "moe_intermediate_size": 768,
    "norm_topk_prob": true, "num_attention_heads": 32, "num_experts": 128,
    "num_experts_per_tok": 8, "num_hidden_layers": 48, "num_key_value_heads": 4,
    "output_router_logits": false, "rms_norm_eps": 1e-06, "rope_scaling": null,
    "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001, "sliding_window": null,
    "tie_word_embeddings": false, "torch_dtype": "bfloat16", "use_cache": true,
    "use_sliding_window": false, "vocab_size": 151936})";
  auto m = ModelFromHfConfig(json, "Qwen3-30B-A3B/config.json");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_TRUE(m->qk_norm);
  EXPECT_EQ(m->head_dim(), 128);
  EXPECT_EQ(m->moe.experts, 128);
  EXPECT_EQ(m->moe.top_k, 8);
  EXPECT_EQ(m->moe.ffn, 768);
  EXPECT_EQ(m->moe.every, 1);
  EXPECT_EQ(m->moe.shared_experts, 0);
  EXPECT_TRUE(m->moe.normalize_top_k);
  EXPECT_FLOAT_EQ(m->moe.aux_loss_coeff, 0.001f);
  // By hand, per block: q 4096·2048 + k, v 2 · 512·2048 + o 2048·4096 + norms 2 · 2048 + head
  // norms 2 · 128 + router 128·2048 + experts 128 · 3 · 768·2048; 48 blocks, the untied
  // embedding and head 2 · 151936·2048 and the final norm: the card's 30.5B, of which a token
  // uses 3.3B (8 experts of 128).
  EXPECT_EQ(m->ParameterCount(), int64_t{30532122624});
  EXPECT_EQ(m->ActiveParameterCount(), int64_t{3353032704});

  const std::string written = HfConfigJson(*m, TensorDtype::kBF16);
  EXPECT_THAT(written, HasSubstr("\"architectures\": [\"Qwen3MoeForCausalLM\"]"));
  EXPECT_THAT(written, HasSubstr("\"moe_intermediate_size\": 768"));
  auto back = ModelFromHfConfig(written, "config.json");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->ParameterCount(), m->ParameterCount());
  config::ModelConfig sparse = *m;
  sparse.moe.every = 2;
  sparse.moe.normalize_top_k = false;
  back = ModelFromHfConfig(HfConfigJson(sparse, TensorDtype::kBF16), "config.json");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->moe.every, 2);
  EXPECT_FALSE(back->moe.normalize_top_k);
  EXPECT_EQ(back->ffn_hidden, 6144);
  auto tensors = HfTensors(sparse);
  ASSERT_TRUE(tensors.ok()) << tensors.status();
  std::set<std::string> names;
  for (const HfTensorMap& t : *tensors) {
    for (const auto& piece : t.pieces) names.insert(piece.name);
  }
  EXPECT_TRUE(names.count("model.layers.0.mlp.gate_proj.weight"));  // a dense block
  EXPECT_TRUE(names.count("model.layers.1.mlp.gate.weight"));       // the router
  EXPECT_TRUE(names.count("model.layers.1.mlp.experts.127.down_proj.weight"));

  std::string forced = json;
  forced.replace(forced.find("\"mlp_only_layers\": []"), 21, "\"mlp_only_layers\": [0]");
  EXPECT_THAT(ModelFromHfConfig(forced, "config.json").status().message(),
              HasSubstr("mlp_only_layers must be empty"));
}

// A config.json of Qwen1.5-MoE-A2.7B (Qwen2MoeForCausalLM's keys): Qwen2's attention (biases on
// q, k and v), 60 experts of 1408, 4 per token, unnormalised, and a gated shared expert of 5632,
// held as 4 shared experts of 1408. Written back it is Qwen2-MoE again; a shared expert that is
// not a whole number of experts, qkv_bias false or a sliding window are refused.
TEST(HfFormat, Qwen2MoeConfigReadsAsLlamaMoeWithAGatedSharedExpert) {
  const std::string json = R"({
    "architectures": ["Qwen2MoeForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
    "decoder_sparse_step": 1, "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 2048,
    "initializer_range": 0.02, "intermediate_size": 5632, "max_position_embeddings": 8192,
    "max_window_layers": 21, "model_type": "qwen2_moe", "moe_intermediate_size": 1408,
    "norm_topk_prob": false, "num_attention_heads": 16, "num_experts": 60,
    "num_experts_per_tok": 4, "num_hidden_layers": 24, "num_key_value_heads": 16,
    "output_router_logits": false, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
    "router_aux_loss_coef": 0.001, "shared_expert_intermediate_size": 5632,
    "sliding_window": 32768, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
    "use_cache": true, "use_sliding_window": false, "vocab_size": 151936})";
  HfLayout layout;
  auto m = ModelFromHfConfig(json, "Qwen1.5-MoE-A2.7B/config.json", &layout);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(layout.model_type, "qwen2_moe");
  EXPECT_TRUE(m->qkv_bias);
  EXPECT_FALSE(m->qk_norm);
  EXPECT_EQ(m->sliding_window, 0);
  EXPECT_EQ(m->moe.experts, 60);
  EXPECT_EQ(m->moe.top_k, 4);
  EXPECT_EQ(m->moe.ffn, 1408);
  EXPECT_EQ(m->moe.shared_experts, 4);
  EXPECT_TRUE(m->moe.shared_gate);
  EXPECT_FALSE(m->moe.normalize_top_k);
  EXPECT_FLOAT_EQ(m->moe.aux_loss_coeff, 0.001f);
  // By hand, per block: q, k, v 3 · 2048² and their biases 3 · 2048, o 2048², the router 60 ·
  // 2048, the experts 60 · 3 · 1408·2048, the shared expert 3 · 5632·2048 and its gate 2048, two
  // norms 2 · 2048; 24 blocks, the untied embedding and head 2 · 151936·2048 and the final norm:
  // the card's 14.3B, of which a token uses 2.7B (4 experts of 60, and the shared one).
  const int64_t block = 3 * int64_t{2048} * 2048 + 3 * 2048 + int64_t{2048} * 2048 + 60 * 2048 +
                        60 * 3 * int64_t{1408} * 2048 + 3 * int64_t{5632} * 2048 + 2048 + 2 * 2048;
  EXPECT_EQ(m->ParameterCount(), 24 * block + 2 * int64_t{151936} * 2048 + 2048);
  EXPECT_EQ(m->ParameterCount(), int64_t{14315784192});
  EXPECT_EQ(m->ActiveParameterCount(), int64_t{2689173504});

  auto tensors = HfTensors(*m, layout);
  ASSERT_TRUE(tensors.ok()) << tensors.status();
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const HfTensorMap& t : *tensors) {
    for (const HfPiece& piece : t.pieces) shapes[piece.name] = HfShape(t, piece);
  }
  const std::string mlp = "model.layers.23.mlp.";
  EXPECT_EQ(shapes[mlp + "gate.weight"], (std::vector<int64_t>{60, 2048}));
  EXPECT_EQ(shapes[mlp + "experts.59.down_proj.weight"], (std::vector<int64_t>{2048, 1408}));
  EXPECT_EQ(shapes[mlp + "shared_expert.gate_proj.weight"], (std::vector<int64_t>{5632, 2048}));
  EXPECT_EQ(shapes[mlp + "shared_expert.up_proj.weight"], (std::vector<int64_t>{5632, 2048}));
  EXPECT_EQ(shapes[mlp + "shared_expert.down_proj.weight"], (std::vector<int64_t>{2048, 5632}));
  EXPECT_EQ(shapes[mlp + "shared_expert_gate.weight"], (std::vector<int64_t>{1, 2048}));
  EXPECT_EQ(layout.experts, HfExperts::kQwen2Moe);
  EXPECT_EQ(HfExportLayout(*m).experts, HfExperts::kQwen2Moe);
  HfLayout mixtral = layout;  // gated shared experts have no names in Mixtral's layout
  mixtral.experts = HfExperts::kMixtral;
  EXPECT_EQ(HfTensors(*m, mixtral).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(shapes["model.layers.0.self_attn.q_proj.bias"], (std::vector<int64_t>{2048}));

  const std::string written = HfConfigJson(*m, TensorDtype::kBF16);
  EXPECT_THAT(written, HasSubstr("\"architectures\": [\"Qwen2MoeForCausalLM\"]"));
  EXPECT_THAT(written, HasSubstr("\"shared_expert_intermediate_size\": 5632"));
  auto back = ModelFromHfConfig(written, "config.json");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->ParameterCount(), m->ParameterCount());
  EXPECT_TRUE(back->moe.shared_gate);
  EXPECT_EQ(back->moe.shared_experts, 4);

  // Ungated shared experts, or the gate without Qwen2's biases, have no layout.
  config::ModelConfig ungated = *m;
  ungated.moe.shared_gate = false;
  EXPECT_THAT(HfTensors(ungated).status().message(),
              HasSubstr("model.moe.shared_experts: is 4 and ungated"));
  config::ModelConfig unbiased = *m;
  unbiased.qkv_bias = false;
  EXPECT_THAT(HfTensors(unbiased).status().message(),
              HasSubstr("model.moe.shared_gate: is set without model.qkv_bias"));

  auto refused = [&](const std::string& from, const std::string& to) {
    std::string bad = json;
    bad.replace(bad.find(from), from.size(), to);
    return std::string(ModelFromHfConfig(bad, "b/config.json").status().message());
  };
  EXPECT_THAT(refused("\"shared_expert_intermediate_size\": 5632",
                      "\"shared_expert_intermediate_size\": 5000"),
              HasSubstr("shared_expert_intermediate_size is 5000, not a multiple of "
                        "moe_intermediate_size 1408"));
  EXPECT_THAT(refused("\"use_sliding_window\": false", "\"use_sliding_window\": true"),
              HasSubstr("use_sliding_window is true"));
  EXPECT_THAT(refused("\"use_cache\": true", "\"qkv_bias\": false"),
              HasSubstr("qkv_bias is false"));
}

// A config.json of OLMoE-1B-7B (OlmoeForCausalLM's keys): Llama's attention with one RMSNorm over
// each token's whole q and one over its whole k, and 64 experts of 1024, 8 per token, unnormalised,
// in every block. Written back it is OLMoE again; clip_qkv, and the norms in a dense model or
// over a window, are refused.
TEST(HfFormat, OlmoeConfigReadsAsLlamaMoeWithNormsOverTheWholeProjection) {
  const std::string json = R"({
    "architectures": ["OlmoeForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "clip_qkv": null, "eos_token_id": 50279, "hidden_act": "silu", "hidden_size": 2048,
    "initializer_range": 0.02, "intermediate_size": 1024, "max_position_embeddings": 4096,
    "model_type": "olmoe", "norm_topk_prob": false, "num_attention_heads": 16,
    "num_experts": 64, "num_experts_per_tok": 8, "num_hidden_layers": 16,
    "num_key_value_heads": 16, "output_router_logits": false, "pad_token_id": 1,
    "rms_norm_eps": 1e-05, "rope_scaling": null, "rope_theta": 10000.0,
    "router_aux_loss_coef": 0.01, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
    "use_cache": true, "vocab_size": 50304})";
  HfLayout layout;
  auto m = ModelFromHfConfig(json, "OLMoE-1B-7B-0924/config.json", &layout);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(layout.model_type, "olmoe");
  EXPECT_TRUE(m->qk_norm);
  EXPECT_EQ(m->qk_norm_span, config::QkNormSpan::kProjection);
  EXPECT_EQ(m->q_norm_width(), 2048);
  EXPECT_EQ(m->k_norm_width(), 2048);
  EXPECT_EQ(m->moe.experts, 64);
  EXPECT_EQ(m->moe.top_k, 8);
  EXPECT_EQ(m->moe.ffn, 1024);
  EXPECT_EQ(m->moe.every, 1);
  EXPECT_FALSE(m->moe.normalize_top_k);
  EXPECT_FLOAT_EQ(m->moe.aux_loss_coeff, 0.01f);
  // By hand, per block: q, k, v, o 4 · 2048², the norms over q and k 2 · 2048, the router 64 ·
  // 2048, the experts 64 · 3 · 1024·2048, two norms 2 · 2048; 16 blocks, the untied embedding and
  // head 2 · 50304·2048 and the final norm: the card's 6.9B, of which a token uses 1.3B.
  const int64_t block =
      4 * int64_t{2048} * 2048 + 2 * 2048 + 64 * 2048 + 64 * 3 * int64_t{1024} * 2048 + 2 * 2048;
  EXPECT_EQ(m->ParameterCount(), 16 * block + 2 * int64_t{50304} * 2048 + 2048);
  EXPECT_EQ(m->ParameterCount(), int64_t{6919161856});
  EXPECT_EQ(m->ActiveParameterCount(), int64_t{1282017280});

  auto tensors = HfTensors(*m, layout);
  ASSERT_TRUE(tensors.ok()) << tensors.status();
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const HfTensorMap& t : *tensors) {
    for (const HfPiece& piece : t.pieces) shapes[piece.name] = HfShape(t, piece);
  }
  const std::string p = "model.layers.15.";
  EXPECT_EQ(shapes[p + "self_attn.q_norm.weight"], (std::vector<int64_t>{2048}));
  EXPECT_EQ(shapes[p + "self_attn.k_norm.weight"], (std::vector<int64_t>{2048}));
  EXPECT_EQ(shapes[p + "mlp.gate.weight"], (std::vector<int64_t>{64, 2048}));
  EXPECT_EQ(shapes[p + "mlp.experts.63.down_proj.weight"], (std::vector<int64_t>{2048, 1024}));
  EXPECT_EQ(layout.experts, HfExperts::kQwen3Moe);  // Qwen3-MoE's names
  EXPECT_EQ(HfExportLayout(*m).experts, HfExperts::kQwen3Moe);

  const std::string written = HfConfigJson(*m, TensorDtype::kBF16);
  EXPECT_THAT(written, HasSubstr("\"architectures\": [\"OlmoeForCausalLM\"]"));
  EXPECT_THAT(written, HasSubstr("\"clip_qkv\": null"));
  auto back = ModelFromHfConfig(written, "config.json");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->ParameterCount(), m->ParameterCount());
  EXPECT_TRUE(back->NormsWholeProjection());

  std::string clipped = json;
  clipped.replace(clipped.find("\"clip_qkv\": null"), 16, "\"clip_qkv\": 8.0");
  EXPECT_THAT(ModelFromHfConfig(clipped, "c/config.json").status().message(),
              HasSubstr("c/config.json: clip_qkv is set"));
  config::ModelConfig dense = *m;
  dense.moe = {};
  EXPECT_THAT(HfTensors(dense).status().message(),
              HasSubstr("model.moe: is absent, and model.pre_norms is true"));
  config::ModelConfig windowed = *m;
  windowed.sliding_window = 512;
  EXPECT_THAT(HfTensors(windowed).status().message(), HasSubstr("model.sliding_window: is 512"));
}

// OLMo-2-1124-7B's config.json (Olmo2ForCausalLM): a dense Llama model with OLMoE's norms over
// each token's whole q and k, and no norms before the attention and the MLP: each branch's output
// is normed (post_attention_layernorm, post_feedforward_layernorm) before it joins the residual
// stream. Written back it is OLMo 2 again (with a sliding window OLMo 3); a mixture of experts or
// norms before the branches have no such layout.
TEST(HfFormat, Olmo2ConfigReadsAsLlamaWithNormsAfterEachBranchOnly) {
  const std::string json = R"({
    "architectures": ["Olmo2ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "eos_token_id": 100257, "hidden_act": "silu", "hidden_size": 4096,
    "initializer_range": 0.02, "intermediate_size": 11008, "max_position_embeddings": 4096,
    "model_type": "olmo2", "num_attention_heads": 32, "num_hidden_layers": 32,
    "num_key_value_heads": 32, "pad_token_id": 100277, "rms_norm_eps": 1e-06,
    "rope_scaling": null, "rope_theta": 500000, "tie_word_embeddings": false,
    "torch_dtype": "float32", "use_cache": true, "vocab_size": 100352})";
  HfLayout layout;
  auto m = ModelFromHfConfig(json, "OLMo-2-1124-7B/config.json", &layout);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(layout.model_type, "olmo2");
  EXPECT_FALSE(m->pre_norms);
  EXPECT_TRUE(m->post_norms);
  EXPECT_TRUE(m->NormsWholeProjection());
  EXPECT_FALSE(m->moe.enabled());
  EXPECT_FLOAT_EQ(m->norm_eps, 1e-6f);
  // By hand, per block: q, k, v, o 4 · 4096², the norms over q and k 2 · 4096, the MLP 3 ·
  // 11008·4096, the branches' norms 2 · 4096; 32 blocks, the untied embedding and head 2 ·
  // 100352·4096 and the final norm: the card's 7B (7.3 billion).
  const int64_t block = 4 * int64_t{4096} * 4096 + 2 * 4096 + 3 * int64_t{11008} * 4096 + 2 * 4096;
  EXPECT_EQ(m->ParameterCount(), 32 * block + 2 * int64_t{100352} * 4096 + 4096);
  EXPECT_EQ(m->ParameterCount(), int64_t{7298617344});

  auto tensors = HfTensors(*m, layout);
  ASSERT_TRUE(tensors.ok()) << tensors.status();
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const HfTensorMap& t : *tensors) {
    for (const HfPiece& piece : t.pieces) shapes[piece.name] = HfShape(t, piece);
  }
  const std::string p = "model.layers.31.";
  EXPECT_EQ(shapes[p + "self_attn.q_norm.weight"], (std::vector<int64_t>{4096}));
  EXPECT_EQ(shapes[p + "self_attn.k_norm.weight"], (std::vector<int64_t>{4096}));
  EXPECT_EQ(shapes[p + "post_attention_layernorm.weight"], (std::vector<int64_t>{4096}));
  EXPECT_EQ(shapes[p + "post_feedforward_layernorm.weight"], (std::vector<int64_t>{4096}));
  EXPECT_EQ(shapes.count(p + "input_layernorm.weight"), 0u);
  EXPECT_EQ(shapes.count(p + "pre_feedforward_layernorm.weight"), 0u);
  EXPECT_EQ(shapes.size(), 32 * 11 + 3u);  // q, k, v, o, two norms, MLP 3, post norms 2

  const std::string written = HfConfigJson(*m, TensorDtype::kBF16);
  EXPECT_THAT(written, HasSubstr("\"architectures\": [\"Olmo2ForCausalLM\"]"));
  EXPECT_THAT(written, HasSubstr("\"model_type\": \"olmo2\""));
  auto back = ModelFromHfConfig(written, "config.json");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->ParameterCount(), m->ParameterCount());
  EXPECT_FALSE(back->pre_norms);
  EXPECT_TRUE(CheckHfWritable(*m).ok());

  config::ModelConfig sparse = *m;
  sparse.moe.experts = 8;
  sparse.moe.top_k = 2;
  sparse.moe.ffn = 1024;
  EXPECT_THAT(HfTensors(sparse).status().message(),
              HasSubstr("model.moe: has experts, and model.pre_norms is false"));
  config::ModelConfig windowed = *m;
  windowed.sliding_window = 512;
  EXPECT_TRUE(HfTensors(windowed).ok());
  EXPECT_THAT(HfConfigJson(windowed, TensorDtype::kBF16),
              HasSubstr("\"architectures\": [\"Olmo3ForCausalLM\"]"));
  config::ModelConfig per_head = *m;  // with norms over each head: EXAONE 4.0's layout
  per_head.qk_norm_span = config::QkNormSpan::kHead;
  EXPECT_TRUE(HfTensors(per_head).ok());
  EXPECT_THAT(HfConfigJson(per_head, TensorDtype::kBF16),
              HasSubstr("\"architectures\": [\"Exaone4ForCausalLM\"]"));
  config::ModelConfig unnormed = *m;  // without query and key norms: no layout
  unnormed.qk_norm = false;
  EXPECT_THAT(HfTensors(unnormed).status().message(),
              HasSubstr("model.qk_norm: is false, and model.pre_norms is false"));
  config::ModelConfig gemma = *m;  // nor with Gemma's GeGLU and scaled embeddings
  gemma.geglu = gemma.scale_embeddings = true;
  EXPECT_EQ(HfTensors(gemma).status().code(), absl::StatusCode::kUnimplemented);
}

// A config of OLMo-3-1025-7B's shape (Olmo3ForCausalLM): OLMo 2's model with three blocks of
// every four attending within a window of 4096 (layer_types), and YaRN (factor 8 over an
// original context of 8192, max_position_embeddings 65536) turning the others only: the windowed
// blocks turn unscaled at rope_theta (model.rope_local_theta). Written back it is the same
// model; YaRN in the windowed blocks too has no such layout, and a config without layer_types is
// refused.
TEST(HfFormat, Olmo3ConfigReadsWithItsWindowAndYarnInTheFullBlocks) {
  std::string types;
  for (int l = 0; l < 32; ++l) {
    absl::StrAppend(&types, l == 0 ? "" : ", ",
                    l % 4 == 3 ? "\"full_attention\"" : "\"sliding_attention\"");
  }
  const std::string json = absl::StrCat(R"({
    "architectures": ["Olmo3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "eos_token_id": 100257, "hidden_act": "silu", "hidden_size": 4096,
    "initializer_range": 0.02, "intermediate_size": 11008, "layer_types": [)",
                                        types, R"(], "max_position_embeddings": 65536,
    "model_type": "olmo3", "num_attention_heads": 32, "num_hidden_layers": 32,
    "num_key_value_heads": 32, "pad_token_id": 100277, "rms_norm_eps": 1e-06,
    "rope_scaling": {"attention_factor": 1.2079441541679836, "beta_fast": 32, "beta_slow": 1,
                     "factor": 8.0, "original_max_position_embeddings": 8192,
                     "rope_type": "yarn"},
    "rope_theta": 500000, "sliding_window": 4096, "tie_word_embeddings": false,
    "torch_dtype": "bfloat16", "use_cache": true, "vocab_size": 100278})");
  HfLayout layout;
  auto m = ModelFromHfConfig(json, "Olmo-3-1025-7B/config.json", &layout);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(layout.model_type, "olmo3");
  EXPECT_FALSE(m->pre_norms);
  EXPECT_TRUE(m->post_norms);
  EXPECT_TRUE(m->NormsWholeProjection());
  EXPECT_EQ(m->sliding_window, 4096);
  EXPECT_EQ(m->full_attention_layers, (std::vector<int32_t>{3, 7, 11, 15, 19, 23, 27, 31}));
  EXPECT_EQ(m->WindowOf(0), 4096);
  EXPECT_EQ(m->WindowOf(3), 0);
  EXPECT_EQ(m->rope_local_theta, 500000.0f);
  EXPECT_TRUE(m->rope_scaling.yarn);
  EXPECT_EQ(m->rope_scaling.factor, 8.0f);
  EXPECT_EQ(m->rope_scaling.original_max_seq, 8192);
  EXPECT_FLOAT_EQ(m->rope_scaling.attention_factor, 1.2079441541679836f);
  ASSERT_TRUE(config::ValidateModelConfig(*m).ok());
  // By hand, as OLMo 2's blocks with the untied embedding and head of 100278 rows.
  const int64_t block = 4 * int64_t{4096} * 4096 + 2 * 4096 + 3 * int64_t{11008} * 4096 + 2 * 4096;
  EXPECT_EQ(m->ParameterCount(), 32 * block + 2 * int64_t{100278} * 4096 + 4096);

  ASSERT_TRUE(CheckHfWritable(*m).ok());
  ASSERT_TRUE(HfTensors(*m, layout).ok());
  const std::string written = HfConfigJson(*m, TensorDtype::kBF16);
  EXPECT_THAT(written, HasSubstr("\"architectures\": [\"Olmo3ForCausalLM\"]"));
  auto back = ModelFromHfConfig(written, "config.json");
  ASSERT_TRUE(back.ok()) << back.status() << "\n" << written;
  EXPECT_EQ(back->sliding_window, m->sliding_window);
  EXPECT_EQ(back->full_attention_layers, m->full_attention_layers);
  EXPECT_EQ(back->rope_local_theta, m->rope_local_theta);
  EXPECT_EQ(back->rope_scaling, m->rope_scaling);

  // transformers 5's RoPE per layer type: YaRN in the full blocks, plain RoPE at the same base in
  // the windowed ones, reads as the same model; another base for those is refused.
  std::string v5 = json;
  const std::string v4_rope =
      json.substr(json.find("\"rope_scaling\""),
                  json.find(", \"sliding_window\"") - json.find("\"rope_scaling\""));
  v5.replace(v5.find(v4_rope), v4_rope.size(), R"("rope_parameters": {
      "full_attention": {"attention_factor": 1.2079441541679836, "beta_fast": 32, "beta_slow": 1,
        "factor": 8.0, "original_max_position_embeddings": 8192, "rope_type": "yarn",
        "rope_theta": 500000},
      "sliding_attention": {"rope_type": "default", "rope_theta": 500000}})");
  auto nested = ModelFromHfConfig(v5, "Olmo-3/config.json");
  ASSERT_TRUE(nested.ok()) << nested.status() << "\n" << v5;
  EXPECT_EQ(nested->rope_scaling, m->rope_scaling);
  EXPECT_EQ(nested->rope_theta, m->rope_theta);
  EXPECT_EQ(nested->rope_local_theta, m->rope_local_theta);
  v5.replace(v5.rfind("\"rope_theta\": 500000"), 20, "\"rope_theta\": 10000");
  EXPECT_THAT(ModelFromHfConfig(v5, "o/config.json").status().message(),
              HasSubstr("o/config.json: rope_theta and "
                        "rope_parameters.sliding_attention.rope_theta both give it, differently"));

  // Full-attention blocks in any pattern travel in layer_types.
  config::ModelConfig irregular = *m;
  irregular.full_attention_layers = {1, 2, 31};
  ASSERT_TRUE(CheckHfWritable(irregular).ok());
  auto irregular_back =
      ModelFromHfConfig(HfConfigJson(irregular, TensorDtype::kBF16), "irregular/config.json");
  ASSERT_TRUE(irregular_back.ok()) << irregular_back.status();
  EXPECT_EQ(irregular_back->full_attention_layers, irregular.full_attention_layers);
  // A window as long as the model: its blocks still turn unscaled.
  std::string long_window = json;
  long_window.replace(long_window.find("\"sliding_window\": 4096"), 22,
                      "\"sliding_window\": 65536");
  auto long_back = ModelFromHfConfig(long_window, "long/config.json");
  ASSERT_TRUE(long_back.ok()) << long_back.status();
  EXPECT_EQ(long_back->sliding_window, 65536);
  EXPECT_EQ(long_back->rope_local_theta, 500000.0f);

  config::ModelConfig scaled_local = *m;  // YaRN in the windowed blocks too
  scaled_local.rope_local_theta = 0.0f;
  EXPECT_THAT(HfTensors(scaled_local).status().message(),
              HasSubstr("model.rope_local_theta: is 0 (OLMo 3's windowed blocks turn unscaled at "
                        "rope_theta, 500000)"));
  std::string untyped = json;
  untyped.replace(untyped.find("\"layer_types\""), 13, "\"layer_kinds\"");
  EXPECT_EQ(ModelFromHfConfig(untyped, "p/config.json").status().message(),
            "p/config.json: layer_types is missing");
}

// A config of EXAONE 4.0 32B's shape (Exaone4ForCausalLM; the sizes its card gives): OLMo 2's
// blocks with per-head query and key norms, three windowed blocks with RoPE to one global block
// without (NoPE), Llama 3's RoPE scaling.
std::string Exaone4Config(const std::string& window, const std::string& pattern, bool typed) {
  std::string types;
  for (int l = 0; l < 64; ++l) {
    absl::StrAppend(&types, l == 0 ? "" : ", ",
                    l % 4 == 3 ? "\"full_attention\"" : "\"sliding_attention\"");
  }
  return absl::StrCat(R"({
    "architectures": ["Exaone4ForCausalLM"], "model_type": "exaone4", "vocab_size": 102400,
    "hidden_size": 5120, "intermediate_size": 27392, "num_hidden_layers": 64,
    "num_attention_heads": 40, "num_key_value_heads": 8, "head_dim": 128,
    "max_position_embeddings": 131072, "rms_norm_eps": 1e-05, "rope_theta": 1000000.0,
    "rope_scaling": {"factor": 16.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "hidden_act": "silu", "tie_word_embeddings": false, "torch_dtype": "bfloat16",
    "sliding_window": )",
                      window, ", \"sliding_window_pattern\": ", pattern,
                      typed ? absl::StrCat(", \"layer_types\": [", types, "]") : "", "}");
}

TEST(HfFormat, Exaone4ConfigReadsWithNoPEInItsGlobalBlocks) {
  HfLayout layout;
  auto m = ModelFromHfConfig(Exaone4Config("4096", "\"LLLG\"", true), "EXAONE-4.0-32B/config.json",
                             &layout);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(layout.model_type, "exaone4");
  EXPECT_FALSE(m->pre_norms);
  EXPECT_TRUE(m->post_norms && m->qk_norm);
  EXPECT_FALSE(m->NormsWholeProjection());
  EXPECT_EQ(m->sliding_window, 4096);
  std::vector<int32_t> global;
  for (int l = 3; l < 64; l += 4) global.push_back(l);
  EXPECT_EQ(m->full_attention_layers, global);
  EXPECT_EQ(m->nope_layers, global);
  EXPECT_EQ(m->WindowOf(0), 4096);
  EXPECT_TRUE(m->RotatesLayer(0));
  EXPECT_EQ(m->WindowOf(3), 0);
  EXPECT_FALSE(m->RotatesLayer(3));
  EXPECT_EQ(m->rope_local_theta, 0.0f);  // every windowed block turns with the scaled RoPE
  EXPECT_EQ(m->rope_scaling.factor, 16.0f);
  EXPECT_EQ(m->norm_eps, 1e-5f);
  // By hand: per block q and o 5120·5120, k and v 1024·5120, the two head norms of 128, the MLP
  // 3·27392·5120 and two norms: the card's 30.95B without the embeddings; with the untied
  // embedding and head of 102400 rows, 32.0B.
  const int64_t block = 2 * int64_t{5120} * 5120 + 2 * int64_t{1024} * 5120 + 2 * 128 +
                        3 * int64_t{27392} * 5120 + 2 * 5120;
  EXPECT_EQ(64 * block + 5120, int64_t{30954640384});
  EXPECT_EQ(m->ParameterCount(), 64 * block + 2 * int64_t{102400} * 5120 + 5120);

  absl::StatusOr<std::vector<HfTensorMap>> tensors = HfTensors(*m, layout);
  ASSERT_TRUE(tensors.ok()) << tensors.status();
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const HfTensorMap& t : *tensors) {
    for (const HfPiece& piece : t.pieces) shapes[piece.name] = HfShape(t, piece);
  }
  const std::string block0 = "model.layers.0.";
  EXPECT_EQ(shapes[block0 + "self_attn.q_norm.weight"], (std::vector<int64_t>{128}));
  EXPECT_EQ(shapes[block0 + "self_attn.k_norm.weight"], (std::vector<int64_t>{128}));
  EXPECT_EQ(shapes[block0 + "post_attention_layernorm.weight"], (std::vector<int64_t>{5120}));
  EXPECT_EQ(shapes[block0 + "post_feedforward_layernorm.weight"], (std::vector<int64_t>{5120}));
  EXPECT_FALSE(shapes.contains(block0 + "input_layernorm.weight"));

  // Written back as EXAONE 4.0, which reads as the same model; without layer_types, an integer
  // sliding_window_pattern says the same.
  ASSERT_TRUE(CheckHfWritable(*m).ok());
  const std::string written = HfConfigJson(*m, TensorDtype::kBF16);
  EXPECT_THAT(written, HasSubstr("\"architectures\": [\"Exaone4ForCausalLM\"]"));
  EXPECT_THAT(written, HasSubstr("\"sliding_window\": 4096"));
  for (const std::string& json : {written, Exaone4Config("4096", "4", false)}) {
    auto back = ModelFromHfConfig(json, "config.json");
    ASSERT_TRUE(back.ok()) << back.status() << "\n" << json;
    EXPECT_EQ(back->sliding_window, 4096);
    EXPECT_EQ(back->full_attention_layers, global);
    EXPECT_EQ(back->nope_layers, global);
    EXPECT_EQ(back->rope_scaling, m->rope_scaling);
    EXPECT_EQ(back->ParameterCount(), m->ParameterCount());
  }

  // EXAONE 4.0 1.2B's way: no window, every block global with RoPE.
  auto plain = ModelFromHfConfig(Exaone4Config("null", "null", false), "1.2B/config.json");
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->sliding_window, 0);
  EXPECT_TRUE(plain->nope_layers.empty());
  const std::string plain_written = HfConfigJson(*plain, TensorDtype::kBF16);
  EXPECT_THAT(plain_written, HasSubstr("\"sliding_window\": null"));
  auto plain_back = ModelFromHfConfig(plain_written, "config.json");
  ASSERT_TRUE(plain_back.ok()) << plain_back.status();
  EXPECT_TRUE(plain_back->nope_layers.empty() && plain_back->sliding_window == 0);

  // A window as long as the positions hides nothing: the NoPE blocks remain, and travel under a
  // window of max_position_embeddings.
  auto long_window = ModelFromHfConfig(Exaone4Config("131072", "4", false), "l/config.json");
  ASSERT_TRUE(long_window.ok()) << long_window.status();
  EXPECT_EQ(long_window->sliding_window, 0);
  EXPECT_EQ(long_window->nope_layers, global);
  const std::string long_written = HfConfigJson(*long_window, TensorDtype::kBF16);
  EXPECT_THAT(long_written, HasSubstr("\"sliding_window\": 131072"));
  auto long_back = ModelFromHfConfig(long_written, "config.json");
  ASSERT_TRUE(long_back.ok()) << long_back.status();
  EXPECT_EQ(long_back->nope_layers, global);
  EXPECT_EQ(long_back->sliding_window, 0);

  // What transformers cannot read, or EXAONE's layout cannot hold, is refused naming the field.
  EXPECT_THAT(ModelFromHfConfig(Exaone4Config("4096", "\"LLLG\"", false), "p/config.json")
                  .status()
                  .message(),
              HasSubstr("p/config.json: sliding_window_pattern must be a positive integer"));
  config::ModelConfig shifted = *m;  // NoPE in a windowed block
  shifted.nope_layers = {0};
  EXPECT_THAT(HfTensors(shifted).status().message(),
              HasSubstr("model.nope_layers: does not name exactly the blocks outside the window "
                        "(block 0)"));
  config::ModelConfig biased = *m;
  biased.qkv_bias = true;
  EXPECT_THAT(HfTensors(biased).status().message(), HasSubstr("model.qkv_bias: is true"));
}

// A config of dots.llm1's shape (Dots1ForCausalLM): Qwen3's attention over DeepSeek-V3's
// experts, the first of 62 blocks dense.
constexpr char kDots1Config[] = R"({
  "architectures": ["Dots1ForCausalLM"], "model_type": "dots1", "vocab_size": 152064,
  "hidden_size": 4096, "intermediate_size": 10944, "moe_intermediate_size": 1408,
  "num_hidden_layers": 62, "num_attention_heads": 32, "num_key_value_heads": 32, "head_dim": 128,
  "n_routed_experts": 128, "num_experts_per_tok": 6, "n_shared_experts": 2,
  "first_k_dense_replace": 1, "norm_topk_prob": true, "routed_scaling_factor": 2.5,
  "n_group": 1, "topk_group": 1, "max_position_embeddings": 32768, "rms_norm_eps": 1e-05,
  "rope_theta": 10000000, "sliding_window": null, "max_window_layers": 62,
  "tie_word_embeddings": false, "hidden_act": "silu", "attention_bias": false,
  "torch_dtype": "bfloat16"})";

TEST(HfFormat, Dots1ConfigReadsAsQwen3AttentionOverDeepSeekExperts) {
  HfLayout layout;
  auto m = ModelFromHfConfig(kDots1Config, "dots.llm1.base/config.json", &layout);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(layout.experts, HfExperts::kGlm4Moe);  // GLM-4.5's (DeepSeek-V3's) tensor names
  EXPECT_EQ(layout.unread_layers_from, 0);
  EXPECT_TRUE(m->qk_norm && m->pre_norms);
  EXPECT_FALSE(m->qkv_bias || m->post_norms || m->NormsWholeProjection());
  EXPECT_EQ(m->rotary_dim(), 128);
  EXPECT_EQ(m->sliding_window, 0);
  const config::MoeConfig& moe = m->moe;
  EXPECT_EQ(moe.experts, 128);
  EXPECT_EQ(moe.top_k, 6);
  EXPECT_EQ(moe.shared_experts, 2);
  EXPECT_EQ(moe.dense_first, 1);
  EXPECT_EQ(moe.score, config::MoeScore::kSigmoid);
  EXPECT_TRUE(moe.has_bias() && moe.normalize_top_k);
  EXPECT_EQ(moe.routed_scale, 2.5f);
  EXPECT_FALSE(moe.limits_groups());
  // By hand: per block q, k, v and o of 4096·4096, the head norms and two norms; block 0's dense
  // MLP 3·10944·4096; the 61 others' router 128·4096, 128 experts and 2 shared ones of
  // 3·1408·4096; the untied embedding and head of 152064 rows and the final norm: the card's 142B,
  // of which a token uses 14B (6 routed and 2 shared experts).
  const int64_t attention = 4 * int64_t{4096} * 4096 + 2 * 128 + 2 * 4096;
  const int64_t expert = 3 * int64_t{1408} * 4096;
  const int64_t dense = attention + 3 * int64_t{10944} * 4096;
  const int64_t ends = 2 * int64_t{152064} * 4096 + 4096;
  EXPECT_EQ(m->ParameterCount(), dense + 61 * (attention + 128 * 4096 + 130 * expert) + ends);
  EXPECT_EQ(m->ParameterCount(), int64_t{142774373888});
  EXPECT_EQ(m->ActiveParameterCount(), dense + 61 * (attention + 128 * 4096 + 8 * expert) + ends);
  ASSERT_TRUE(HfTensors(*m, layout).ok());

  // It writes back in GLM-4.5's layout (which holds it: partial_rotary_factor 1), reading as the
  // same model.
  ASSERT_TRUE(CheckHfWritable(*m).ok());
  const std::string written = HfConfigJson(*m, TensorDtype::kBF16);
  EXPECT_THAT(written, HasSubstr("\"architectures\": [\"Glm4MoeForCausalLM\"]"));
  auto back = ModelFromHfConfig(written, "out/config.json");
  ASSERT_TRUE(back.ok()) << back.status() << "\n" << written;
  EXPECT_EQ(back->ParameterCount(), m->ParameterCount());
  EXPECT_EQ(back->rotary_dim(), 128);
  EXPECT_EQ(back->moe.shared_experts, 2);

  // A window from max_window_layers on (Qwen's rule without use_sliding_window); the counts the
  // class leaves without defaults are required.
  auto changed = [](const std::string& from, const std::string& to) {
    std::string json = kDots1Config;
    json.replace(json.find(from), from.size(), to);
    return ModelFromHfConfig(json, "d/config.json");
  };
  auto windowed = changed("\"sliding_window\": null, \"max_window_layers\": 62",
                          "\"sliding_window\": 4096, \"max_window_layers\": 60");
  ASSERT_TRUE(windowed.ok()) << windowed.status();
  EXPECT_EQ(windowed->sliding_window, 4096);
  EXPECT_EQ(windowed->WindowOf(59), 0);
  EXPECT_EQ(windowed->WindowOf(60), 4096);
  EXPECT_EQ(changed("\"n_shared_experts\": 2,", "").status().message(),
            "d/config.json: n_shared_experts is missing");
  EXPECT_THAT(changed("\"attention_bias\": false", "\"attention_bias\": true").status().message(),
              HasSubstr("attention_bias"));
}

TEST(HfFormat, ConfigJsonReadsBackAsTheSameModel) {
  for (auto family : {config::ModelFamily::kGpt2, config::ModelFamily::kLlama}) {
    config::ModelConfig m = Tiny(family);
    m.norm_eps = 1e-6f;
    if (family == config::ModelFamily::kLlama) m.rope_theta = 500000.0f;
    auto back = ModelFromHfConfig(HfConfigJson(m, TensorDtype::kBF16), "config.json");
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->family, m.family);
    EXPECT_EQ(back->layers, m.layers);
    EXPECT_EQ(back->width, m.width);
    EXPECT_EQ(back->heads, m.heads);
    EXPECT_EQ(back->kv_heads, m.kv_heads);
    EXPECT_EQ(back->ffn_hidden, m.ffn_hidden);
    EXPECT_EQ(back->vocab, m.vocab);
    EXPECT_EQ(back->max_seq, m.max_seq);
    EXPECT_EQ(back->tied_embeddings, m.tied_embeddings);
    EXPECT_EQ(back->norm_eps, m.norm_eps);
    EXPECT_EQ(back->rope_theta, m.rope_theta);
  }
  // Llama 3's RoPE scaling both ways; "default" is none, another type is refused.
  config::ModelConfig scaled = Tiny(config::ModelFamily::kLlama);
  scaled.rope_scaling = {
      .factor = 32.0f, .low_freq_factor = 1.0f, .high_freq_factor = 4.0f, .original_max_seq = 8192};
  const std::string scaled_json = HfConfigJson(scaled, TensorDtype::kF32);
  EXPECT_THAT(scaled_json, HasSubstr("\"rope_type\": \"llama3\", \"factor\": 32.0"));
  auto scaled_back = ModelFromHfConfig(scaled_json, "config.json");
  ASSERT_TRUE(scaled_back.ok()) << scaled_back.status();
  EXPECT_EQ(scaled_back->rope_scaling, scaled.rope_scaling);
  auto rope = [&](const std::string& scaling) {
    std::string json = scaled_json;
    const size_t at = json.find("{\"rope_type\"");
    json.replace(at, json.find('}', at) + 1 - at, scaling);
    return ModelFromHfConfig(json, "r/config.json");
  };
  ASSERT_TRUE(rope(R"({"rope_type": "default"})").ok());
  EXPECT_FALSE(rope(R"({"rope_type": "default"})")->rope_scaling.enabled());
  EXPECT_EQ(rope(R"({"type": "llama3", "factor": 8})")->rope_scaling.factor, 8.0f);
  EXPECT_TRUE(rope(R"({"rope_type": "yarn", "factor": 8})")->rope_scaling.yarn);
  EXPECT_THAT(rope(R"({"rope_type": "dynamic", "factor": 8})").status().message(),
              HasSubstr("r/config.json: rope_scaling is not supported"));
  EXPECT_THAT(rope(R"({"rope_type": "llama3"})").status().message(),
              HasSubstr("r/config.json: rope_scaling: factor is missing"));

  const config::ModelConfig m = TinyMixtral();
  const std::string json = HfConfigJson(m, TensorDtype::kF32);
  EXPECT_THAT(json, HasSubstr("\"model_type\": \"mixtral\""));
  auto back = ModelFromHfConfig(json, "config.json");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->moe.experts, 4);
  EXPECT_EQ(back->moe.top_k, 2);
  EXPECT_EQ(back->moe.ffn, 32);
  EXPECT_EQ(back->moe.every, 1);
  EXPECT_EQ(back->moe.shared_experts, 0);
  EXPECT_EQ(back->moe.score, config::MoeScore::kSoftmax);
  EXPECT_TRUE(back->moe.normalize_top_k);
  EXPECT_EQ(back->moe.aux_loss_coeff, m.moe.aux_loss_coeff);
  auto with = [&](const std::string& from, const std::string& to) {
    std::string changed = json;
    changed.replace(changed.find(from), from.size(), to);
    return std::string(ModelFromHfConfig(changed, "m/config.json").status().message());
  };
  EXPECT_EQ(with("\"sliding_window\": null", "\"sliding_window\": 8"), "");
  EXPECT_THAT(with("\"sliding_window\": null", "\"sliding_window\": -8"),
              HasSubstr("m/config.json: sliding_window must be a positive integer"));
  EXPECT_THAT(with("\"num_experts_per_tok\": 2", "\"num_experts_per_tok\": 5"),
              HasSubstr("m/config.json: num_experts_per_tok is 5, more than the 4"));
  EXPECT_THAT(with("\"num_local_experts\": 4,", ""),
              HasSubstr("m/config.json: num_local_experts is missing"));
  EXPECT_THAT(ModelFromHfConfig(R"({"model_type": "falcon"})", "x/config.json").status().message(),
              HasSubstr("x/config.json: model_type is \"falcon\""));
  EXPECT_THAT(
      ModelFromHfConfig(R"({"model_type": "gpt2", "n_embd": 64})", "c.json").status().message(),
      HasSubstr("c.json: vocab_size is missing"));
}

// A Hugging Face directory of `m` with every tensor's value its index + 0.25 · element.
void WriteHfDir(FileSystem& fs, const std::string& dir, const config::ModelConfig& m,
                const std::string& drop = "", const std::string& extra = "",
                const std::string& reshape = "") {
  ASSERT_TRUE(fs.CreateDirs(dir).ok());
  ASSERT_TRUE(fs.WriteFileAtomic(dir + "/config.json", HfConfigJson(m, TensorDtype::kF32)).ok());
  std::vector<TensorInfo> tensors;
  auto maps = HfTensors(m);
  ASSERT_TRUE(maps.ok());
  for (const HfTensorMap& t : *maps) {
    for (const HfPiece& p : t.pieces) {
      if (p.name == drop) continue;
      std::vector<int64_t> shape = HfShape(t, p);
      if (p.name == reshape) shape[0] += 1;
      tensors.push_back({p.name, TensorDtype::kF32, shape});
    }
  }
  if (!extra.empty()) tensors.push_back({extra, TensorDtype::kF32, {2}});
  auto writer = SafetensorsWriter::Create(fs, dir + "/model.safetensors", tensors, {});
  ASSERT_TRUE(writer.ok());
  for (size_t i = 0; i < tensors.size(); ++i) {
    std::vector<float> v(tensors[i].numel());
    for (size_t e = 0; e < v.size(); ++e) v[e] = static_cast<float>(i) + 0.25f * e;
    ASSERT_TRUE((*writer)->Write(tensors[i].name, v.data()).ok());
  }
  ASSERT_TRUE((*writer)->Finish().ok());
}

TEST(InitFrom, HfDirectoryLoadsIntoEveryTensorParallelSlice) {
  FakeFileSystem fs;
  const config::ModelConfig m = Tiny(config::ModelFamily::kLlama);
  WriteHfDir(fs, "w", m);
  auto source = WeightSource::Open(fs, "w");
  ASSERT_TRUE(source.ok()) << source.status();
  const ParameterLayout whole(m, 0, 1, PipelineStage{});
  std::vector<float> full(whole.total());
  ASSERT_TRUE((*source)->ReadLayout(whole, full.data()).ok());
  for (int tp_rank = 0; tp_rank < 2; ++tp_rank) {
    const ParameterLayout half(m, tp_rank, 2, PipelineStage{});
    std::vector<float> mine(half.total()), want(half.total());
    ASSERT_TRUE((*source)->ReadLayout(half, mine.data()).ok());
    for (const ParamTensor& t : half.tensors()) {
      half.Slice(t, full.data() + whole.Find(t.name)->offset, want.data() + t.offset);
    }
    EXPECT_EQ(mine, want) << "tp rank " << tp_rank;
  }
}

// A Phi-3 directory is a Llama one with q_proj, k_proj, v_proj stacked in qkv_proj and
// gate_proj, up_proj in gate_up_proj: stacked here by hand from a Llama directory's tensors, it
// loads as the same parameters, whole and split over tensor-parallel ranks.
TEST(InitFrom, Phi3DirectoryLoadsAsTheLlamaOneWithItsProjectionsApart) {
  FakeFileSystem fs;
  config::ModelConfig m = Tiny(config::ModelFamily::kLlama);
  m.sliding_window = 5;
  WriteHfDir(fs, "llama", m);
  auto llama = SafetensorsFile::Open(fs, "llama/model.safetensors");
  ASSERT_TRUE(llama.ok()) << llama.status();
  std::map<std::string, std::vector<float>> values;
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const TensorInfo& t : (*llama)->tensors()) {
    std::vector<float> v(t.numel());
    (*llama)->ReadFloats(t, 0, t.numel(), v.data());
    values[t.name] = v;
    shapes[t.name] = t.shape;
  }
  auto stack = [&](const std::string& to, std::initializer_list<std::string> from) {
    std::vector<float> v;
    int64_t rows = 0;
    for (const std::string& name : from) {
      v.insert(v.end(), values[name].begin(), values[name].end());
      rows += shapes[name][0];
      values.erase(name);
      shapes[to] = {rows, shapes[name][1]};
      shapes.erase(name);
    }
    values[to] = v;
  };
  for (int l = 0; l < m.layers; ++l) {
    const std::string h = absl::StrCat("model.layers.", l, ".");
    stack(h + "self_attn.qkv_proj.weight",
          {h + "self_attn.q_proj.weight", h + "self_attn.k_proj.weight",
           h + "self_attn.v_proj.weight"});
    stack(h + "mlp.gate_up_proj.weight", {h + "mlp.gate_proj.weight", h + "mlp.up_proj.weight"});
  }
  std::string config = HfConfigJson(m, TensorDtype::kF32);
  config.replace(config.find("\"mistral\""), 9, "\"phi3\"");
  ASSERT_TRUE(fs.CreateDirs("phi3").ok());
  ASSERT_TRUE(fs.WriteFileAtomic("phi3/config.json", config).ok());
  std::vector<TensorInfo> tensors;
  for (const auto& [name, shape] : shapes) tensors.push_back({name, TensorDtype::kF32, shape});
  auto writer = SafetensorsWriter::Create(fs, "phi3/model.safetensors", tensors, {});
  ASSERT_TRUE(writer.ok());
  for (const auto& [name, v] : values) ASSERT_TRUE((*writer)->Write(name, v.data()).ok());
  ASSERT_TRUE((*writer)->Finish().ok());

  auto from_llama = WeightSource::Open(fs, "llama");
  auto from_phi3 = WeightSource::Open(fs, "phi3");
  ASSERT_TRUE(from_llama.ok()) << from_llama.status();
  ASSERT_TRUE(from_phi3.ok()) << from_phi3.status();
  EXPECT_THAT((*from_phi3)->description(), HasSubstr("Hugging Face phi3"));
  EXPECT_EQ((*from_phi3)->model().sliding_window, 5);
  for (int tp = 1; tp <= 2; ++tp) {
    for (int tp_rank = 0; tp_rank < tp; ++tp_rank) {
      const ParameterLayout layout(m, tp_rank, tp, PipelineStage{});
      std::vector<float> want(layout.total()), got(layout.total());
      ASSERT_TRUE((*from_llama)->ReadLayout(layout, want.data()).ok());
      ASSERT_TRUE((*from_phi3)->ReadLayout(layout, got.data()).ok());
      EXPECT_EQ(got, want) << "tp rank " << tp_rank << " of " << tp;
    }
  }
}

// A Mixtral directory loads into any tensor- and expert-parallel layout: each rank's experts,
// each expert's slice.
TEST(InitFrom, MixtralDirectoryLoadsIntoEveryExpertAndTensorParallelSlice) {
  FakeFileSystem fs;
  const config::ModelConfig m = TinyMixtral();
  WriteHfDir(fs, "w", m);
  auto source = WeightSource::Open(fs, "w");
  ASSERT_TRUE(source.ok()) << source.status();
  EXPECT_THAT((*source)->description(), HasSubstr("Hugging Face mixtral"));
  const ParameterLayout whole(m, 0, 1, PipelineStage{});
  std::vector<float> full(whole.total());
  ASSERT_TRUE((*source)->ReadLayout(whole, full.data()).ok());
  // Expert 3's w2 is the last tensor of layer 0's experts: its first element is at expert 3's
  // slab of proj.
  const ParamTensor* proj = whole.Find("h.0.moe.experts.proj.w");
  ASSERT_NE(proj, nullptr);
  EXPECT_NE(full[proj->offset + 3 * 64 * 32], 0.0f);
  const std::vector<PipelineStage> all = {PipelineStage{}};
  for (int tp = 1; tp <= 2; ++tp) {
    for (int ep = 1; ep <= 2; ++ep) {
      for (int tp_rank = 0; tp_rank < tp; ++tp_rank) {
        for (int ep_rank = 0; ep_rank < ep; ++ep_rank) {
          const ParameterLayout part(m, tp_rank, tp, all, ep_rank, ep);
          std::vector<float> mine(part.total()), want(part.total());
          ASSERT_TRUE((*source)->ReadLayout(part, mine.data()).ok());
          for (const ParamTensor& t : part.tensors()) {
            part.Slice(t, full.data() + whole.Find(t.name)->offset, want.data() + t.offset);
          }
          EXPECT_EQ(mine, want) << "tp " << tp_rank << "/" << tp << ", ep " << ep_rank << "/" << ep;
        }
      }
    }
  }
}

TEST(InitFrom, BadDirectoriesAreRefusedNamingTheFileAndTensor) {
  const config::ModelConfig m = Tiny(config::ModelFamily::kGpt2);
  struct Case {
    const char* drop;
    const char* extra;
    const char* reshape;
    const char* says;
  };
  const Case cases[] = {
      {"h.1.mlp.c_fc.bias", "", "", "w/model.safetensors: missing tensor h.1.mlp.c_fc.bias"},
      {"", "h.0.attn.rotary", "", "w/model.safetensors: extra tensor h.0.attn.rotary"},
      {"", "", "wpe.weight",
       "w/model.safetensors: tensor wpe.weight has shape [17, 64], config.json implies [16, 64]"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.says);
    FakeFileSystem fs;
    WriteHfDir(fs, "w", m, c.drop, c.extra, c.reshape);
    config::JobSpec spec;
    spec.model = m;
    spec.init_from = "w";
    absl::Status status = CheckInitFrom(fs, spec);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(status.message(), HasSubstr(std::string("model.init_from: ") + c.says));
  }
}

TEST(InitFrom, AnotherModelIsRefusedNamingTheFieldAndBothValues) {
  FakeFileSystem fs;
  const config::ModelConfig m = Tiny(config::ModelFamily::kLlama);
  WriteHfDir(fs, "w", m);
  config::JobSpec spec;
  spec.model = m;
  spec.model.kv_heads = 4;
  spec.init_from = "w";
  EXPECT_THAT(CheckInitFrom(fs, spec).message(),
              HasSubstr("model.init_from: model.kv_heads is 2 in w/config.json, 4 in the spec"));
  spec.model = m;
  EXPECT_TRUE(CheckInitFrom(fs, spec).ok());
  spec.model.rope_scaling.factor = 8.0f;
  EXPECT_THAT(CheckInitFrom(fs, spec).message(),
              HasSubstr("model.rope_scaling is none in w/config.json, llama3 (factor 8, "
                        "low_freq_factor 1, high_freq_factor 4, original_max_seq 8192) in the "
                        "spec"));
  spec.model = m;
  // Mixtral's weights: the spec's experts and routing must be theirs; its dense ffn_hidden,
  // which no block uses, may differ.
  WriteHfDir(fs, "x", TinyMixtral());
  spec.init_from = "x";
  spec.model = TinyMixtral();
  spec.model.ffn_hidden = 96;
  EXPECT_TRUE(CheckInitFrom(fs, spec).ok());
  spec.model.moe.top_k = 1;
  EXPECT_THAT(CheckInitFrom(fs, spec).message(),
              HasSubstr("model.init_from: model.moe.top_k is 2 in x/config.json, 1 in the spec"));
  spec.model = TinyMixtral();
  spec.model.moe.balance = config::MoeBalance::kBias;
  EXPECT_THAT(CheckInitFrom(fs, spec).message(),
              HasSubstr("model.moe.balance is aux_loss in x/config.json, bias in the spec"));
  spec.model = m;
  EXPECT_THAT(CheckInitFrom(fs, spec).message(),
              HasSubstr("model.moe.experts is 4 in x/config.json, 0 in the spec"));
  spec.init_from = "nowhere";
  EXPECT_THAT(CheckInitFrom(fs, spec).message(),
              HasSubstr("model.init_from: nowhere: no such file or directory"));
  // DeepSeek-V3's weights: the latents' ranks and their norms' epsilon must be the spec's.
  WriteHfDir(fs, "d", TinyDeepseek());
  spec.init_from = "d";
  spec.model = TinyDeepseek();
  EXPECT_TRUE(CheckInitFrom(fs, spec).ok()) << CheckInitFrom(fs, spec);
  spec.model.latent.kv_rank = 10;
  EXPECT_THAT(CheckInitFrom(fs, spec).message(),
              HasSubstr("model.latent_attention.kv_rank is 12 in d/config.json, 10 in the spec"));
  spec.model = TinyDeepseek();
  spec.model.latent.norm_eps = 1e-5f;
  EXPECT_THAT(CheckInitFrom(fs, spec).message(),
              HasSubstr("model.latent_attention.norm_eps is 1e-06 in d/config.json, 1e-05 in the "
                        "spec"));
  spec.model = TinyDeepseek();
  spec.model.latent = {};
  EXPECT_THAT(CheckInitFrom(fs, spec).message(),
              HasSubstr("model.latent_attention is set in d/config.json, none in the spec"));
  // DeepSeek-V2's groups (scored by their best): what scores them must be the spec's too.
  config::ModelConfig v2 = TinyDeepseek();
  v2.moe.score = config::MoeScore::kSoftmax;
  v2.moe.balance = config::MoeBalance::kAuxLoss;
  v2.moe.normalize_top_k = false;
  v2.moe.groups = 2;
  v2.moe.group_top_k = 1;
  v2.moe.group_score = config::GroupScore::kMax;
  WriteHfDir(fs, "v2", v2);
  spec.init_from = "v2";
  spec.model = v2;
  EXPECT_TRUE(CheckInitFrom(fs, spec).ok()) << CheckInitFrom(fs, spec);
  spec.model.moe.group_score = config::GroupScore::kTopTwoSum;
  EXPECT_THAT(CheckInitFrom(fs, spec).message(),
              HasSubstr("model.moe.group_score is max in v2/config.json, top2_sum in the spec"));
}

// llm.c's GPT-2 file: a 256-int header, then the tensors kind by kind over all layers, the
// token embedding padded to `padded` rows.
std::string LlmcFile(const config::ModelConfig& m, int padded, int version, int64_t* count) {
  std::vector<int32_t> header(256, 0);
  header[0] = 20240326;
  header[1] = version;
  header[2] = m.max_seq;
  header[3] = m.vocab;
  header[4] = m.layers;
  header[5] = m.heads;
  header[6] = m.width;
  header[7] = padded;
  const int64_t c = m.width, l = m.layers;
  *count = padded * c + m.max_seq * c +
           l * (2 * c + 3 * c * c + 3 * c + c * c + c + 2 * c + 4 * c * c + 4 * c + 4 * c * c + c) +
           2 * c;
  std::string out(reinterpret_cast<const char*>(header.data()), 1024);
  for (int64_t i = 0; i < *count; ++i) {
    const float v = 0.001f * static_cast<float>(i % 1000);
    if (version == 3) {
      out.append(reinterpret_cast<const char*>(&v), 4);
    } else {
      uint32_t bits;
      std::memcpy(&bits, &v, 4);
      const uint16_t top = static_cast<uint16_t>(bits >> 16);
      out.append(reinterpret_cast<const char*>(&top), 2);
    }
  }
  return out;
}

TEST(InitFrom, LlmcFileLoadsAndItsBadHeadersAreRefused) {
  const config::ModelConfig m = Tiny(config::ModelFamily::kGpt2);
  for (int version : {3, 5}) {
    FakeFileSystem fs;
    int64_t count = 0;
    const std::string file = LlmcFile(m, 64, version, &count);
    ASSERT_TRUE(fs.WriteFileAtomic("gpt2.bin", file).ok());
    auto source = WeightSource::Open(fs, "gpt2.bin");
    ASSERT_TRUE(source.ok()) << source.status();
    EXPECT_EQ((*source)->model().vocab, 48);
    std::vector<float> wpe;
    ASSERT_TRUE((*source)->Read("wpe", wpe).ok());
    // wpe follows the 64 padded rows of wte.
    EXPECT_NEAR(wpe[0], 0.001f * ((64 * 64) % 1000), 1e-2);
    ASSERT_TRUE(fs.WriteFileAtomic("short.bin", file.substr(0, file.size() - 2)).ok());
    EXPECT_THAT(WeightSource::Open(fs, "short.bin").status().message(),
                HasSubstr("short.bin: truncated"));
    std::string bad = file;
    bad[4] = 7;  // version 7
    ASSERT_TRUE(fs.WriteFileAtomic("v7.bin", bad).ok());
    EXPECT_THAT(WeightSource::Open(fs, "v7.bin").status().message(),
                HasSubstr("v7.bin: llm.c version 7"));
  }
}

// The shape of transformers' Glm4Config (GLM-4 9B 0414's): biases on q, k and v, half of each
// 128-wide head turned in neighbouring pairs, the four norms per block, gate and up fused.
constexpr char kGlm4Config[] = R"({
  "architectures": ["Glm4ForCausalLM"], "attention_bias": true, "attention_dropout": 0.0,
  "eos_token_id": [151329, 151336, 151338], "head_dim": 128, "hidden_act": "silu",
  "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 13696,
  "max_position_embeddings": 32768, "model_type": "glm4", "num_attention_heads": 32,
  "num_hidden_layers": 40, "num_key_value_heads": 2, "pad_token_id": 151329,
  "partial_rotary_factor": 0.5, "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
  "tie_word_embeddings": false, "torch_dtype": "bfloat16", "use_cache": true,
  "vocab_size": 151552})";

TEST(HfFormat, Glm4ConfigReadsWithInterleavedRopeAndFourNorms) {
  HfLayout layout;
  auto m = ModelFromHfConfig(kGlm4Config, "GLM-4-9B-0414/config.json", &layout);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_TRUE(layout.glm && layout.interleaved_rope);
  EXPECT_EQ(layout.projections, HfProjections::kFusedMlp);
  EXPECT_TRUE(m->qkv_bias && m->post_norms && m->pre_norms);
  EXPECT_FALSE(m->geglu || m->scale_embeddings || m->qk_norm || m->tied_embeddings);
  EXPECT_EQ(m->head_dim(), 128);
  EXPECT_EQ(m->rotary_dim(), 64);
  EXPECT_EQ(m->kv_heads, 2);
  EXPECT_EQ(m->norm_eps, 1e-5f);
  ASSERT_TRUE(config::ValidateModelConfig(*m).ok());
  // By hand: q, k, v (with biases) and o; gate and up, down; four norms; the untied embedding
  // and head of 151552 rows and the final norm.
  const int64_t block = int64_t{4096} * 4096 + 2 * int64_t{256} * 4096 + (4096 + 2 * 256) +
                        int64_t{4096} * 4096 + 3 * int64_t{13696} * 4096 + 4 * 4096;
  EXPECT_EQ(block, 203969024);
  EXPECT_EQ(m->ParameterCount(), 40 * block + 2 * int64_t{151552} * 4096 + 4096);
  EXPECT_EQ(m->ParameterCount(), 9400279040);

  absl::StatusOr<std::vector<HfTensorMap>> tensors = HfTensors(*m, layout);
  ASSERT_TRUE(tensors.ok()) << tensors.status();
  std::map<std::string, HfPiece> pieces;
  for (const HfTensorMap& t : *tensors) {
    for (const HfPiece& p : t.pieces) pieces[p.name] = p;
  }
  const std::string h = "model.layers.7.";
  for (const char* name : {"self_attn.q_proj.weight", "self_attn.k_proj.weight",
                           "self_attn.q_proj.bias", "self_attn.k_proj.bias"}) {
    ASSERT_TRUE(pieces.contains(h + name)) << name;
    EXPECT_EQ(pieces[h + name].head_rows, 128) << name;
    EXPECT_EQ(pieces[h + name].rope_rows, 64) << name;
  }
  EXPECT_EQ(pieces[h + "self_attn.v_proj.weight"].head_rows, 0);  // v is not turned
  for (const char* name : {"input_layernorm.weight", "post_self_attn_layernorm.weight",
                           "post_attention_layernorm.weight", "post_mlp_layernorm.weight",
                           "mlp.gate_up_proj.weight", "mlp.down_proj.weight"}) {
    EXPECT_TRUE(pieces.contains(h + name)) << name;
  }
  EXPECT_FALSE(pieces.contains(h + "self_attn.o_proj.bias"));

  ASSERT_TRUE(CheckHfWritable(*m).ok());
  EXPECT_EQ(HfExportLayout(*m).glm, true);
  const std::string written = HfConfigJson(*m, TensorDtype::kBF16);
  EXPECT_THAT(written, HasSubstr("\"architectures\": [\"Glm4ForCausalLM\"]"));
  EXPECT_THAT(written, HasSubstr("\"partial_rotary_factor\": 0.5,"));
  EXPECT_THAT(written, HasSubstr("\"attention_bias\": true"));
  HfLayout back_layout;
  auto back = ModelFromHfConfig(written, "out/config.json", &back_layout);
  ASSERT_TRUE(back.ok()) << back.status() << "\n" << written;
  EXPECT_TRUE(back_layout.glm);
  EXPECT_EQ(back->ParameterCount(), m->ParameterCount());
  EXPECT_EQ(back->rope_dim, 64);
  EXPECT_TRUE(back->qkv_bias && back->post_norms);

  // GLM's (GLM-4 9B's first checkpoints): no norms after the branches, attention_bias and
  // partial_rotary_factor left to their defaults (true, 0.5), heads 128 wide unless head_dim says
  // otherwise.
  std::string glm = kGlm4Config;
  for (const char* key :
       {"\"attention_bias\": true, ", "\"partial_rotary_factor\": 0.5, ", "\"head_dim\": 128, "}) {
    glm.erase(glm.find(key), std::string(key).size());
  }
  glm.replace(glm.find("\"glm4\""), 6, "\"glm\"");
  glm.replace(glm.find("\"hidden_size\": 4096"), 19, "\"hidden_size\": 2048");
  auto plain = ModelFromHfConfig(glm, "glm-4-9b/config.json", &layout);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_TRUE(layout.glm);
  EXPECT_TRUE(plain->qkv_bias);
  EXPECT_FALSE(plain->post_norms);
  EXPECT_EQ(plain->head_dim(), 128);  // not 2048 / 32
  EXPECT_EQ(plain->rotary_dim(), 64);
  ASSERT_TRUE(CheckHfWritable(*plain).ok());
  EXPECT_THAT(HfConfigJson(*plain, TensorDtype::kF32), HasSubstr("\"GlmForCausalLM\""));
  // Without biases a partial rotation is Phi-3's again.
  config::ModelConfig unbiased = *plain;
  unbiased.qkv_bias = false;
  EXPECT_EQ(HfExportProjections(unbiased), HfProjections::kFused);

  // What GLM's layout does not hold is refused, naming the field.
  auto refused = [](const std::string& from, const std::string& to) {
    std::string json = kGlm4Config;
    json.replace(json.find(from), from.size(), to);
    return std::string(ModelFromHfConfig(json, "g/config.json").status().message());
  };
  EXPECT_THAT(refused("\"rope_theta\"",
                      "\"rope_scaling\": {\"rope_type\": \"linear\", "
                      "\"factor\": 2.0}, \"rope_theta\""),
              HasSubstr("g/config.json: rope_scaling must be null"));
  EXPECT_THAT(refused("\"use_cache\"", "\"mlp_bias\": true, \"use_cache\""),
              HasSubstr("mlp_bias must be false"));
  EXPECT_THAT(refused("\"partial_rotary_factor\": 0.5", "\"partial_rotary_factor\": 0.01"),
              HasSubstr("partial_rotary_factor must be in (0, 1] and turn an even number"));
  EXPECT_THAT(refused("\"hidden_act\": \"silu\"", "\"hidden_act\": \"gelu\""),
              HasSubstr("hidden_act must be \"silu\""));
  config::ModelConfig normed = *m;
  normed.qk_norm = true;
  EXPECT_THAT(CheckHfWritable(normed).message(), HasSubstr("model.qk_norm: is true"));
  config::ModelConfig windowed = *m;
  windowed.sliding_window = 4096;
  EXPECT_THAT(CheckHfWritable(windowed).message(), HasSubstr("model.sliding_window: is 4096"));
}

// ERNIE-4.5-0.3B's shape (transformers' Ernie4_5Config): Llama's model, RoPE over the whole head in
// neighbouring pairs, heads of 128 over a width of 1024, tied embeddings; its defaults
// (rope_theta 500000, tied embeddings, heads 128 wide) apply when the config leaves them out.
TEST(HfFormat, Ernie45ConfigReadsAsLlamaWithInterleavedRope) {
  const std::string json = R"({
    "architectures": ["Ernie4_5ForCausalLM"], "bos_token_id": 1, "eos_token_id": 2,
    "head_dim": 128, "hidden_act": "silu", "hidden_size": 1024, "intermediate_size": 3072,
    "max_position_embeddings": 131072, "model_type": "ernie4_5", "num_attention_heads": 16,
    "num_hidden_layers": 18, "num_key_value_heads": 2, "pad_token_id": 0, "rms_norm_eps": 1e-05,
    "rope_theta": 500000, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
    "use_bias": false, "use_cache": true, "vocab_size": 103424})";
  HfLayout layout;
  auto m = ModelFromHfConfig(json, "ERNIE-4.5-0.3B-PT/config.json", &layout);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_TRUE(layout.interleaved_rope);
  EXPECT_FALSE(layout.glm);
  EXPECT_EQ(layout.projections, HfProjections::kSeparate);
  EXPECT_EQ(m->head_dim(), 128);
  EXPECT_EQ(m->explicit_head_dim, 128);  // 16 heads of 128 over a width of 1024
  EXPECT_EQ(m->rotary_dim(), 128);
  EXPECT_EQ(m->rope_theta, 500000.0f);
  EXPECT_TRUE(m->tied_embeddings);
  EXPECT_FALSE(m->qkv_bias || m->post_norms);
  ASSERT_TRUE(config::ValidateModelConfig(*m).ok());
  // By hand: q and o of 2048 rows or columns, k and v of 256, the MLP, two norms; the tied
  // embedding of 103424 rows and the final norm.
  const int64_t block =
      2 * int64_t{2048} * 1024 + 2 * int64_t{256} * 1024 + 3 * int64_t{3072} * 1024 + 2 * 1024;
  EXPECT_EQ(m->ParameterCount(), 18 * block + int64_t{103424} * 1024 + 1024);
  EXPECT_EQ(m->ParameterCount(), 360748032);
  absl::StatusOr<std::vector<HfTensorMap>> tensors = HfTensors(*m, layout);
  ASSERT_TRUE(tensors.ok()) << tensors.status();
  for (const HfTensorMap& t : *tensors) {
    for (const HfPiece& p : t.pieces) {
      const bool turned =
          p.name.find("q_proj") != std::string::npos || p.name.find("k_proj") != std::string::npos;
      EXPECT_EQ(p.head_rows, turned ? 128 : 0) << p.name;
      EXPECT_EQ(p.rope_rows, turned ? 128 : 0) << p.name;
    }
  }
  // Trainyard writes the same model as Llama's (rotate-half pairs, rows as they are).
  ASSERT_TRUE(CheckHfWritable(*m).ok());
  EXPECT_THAT(HfConfigJson(*m, TensorDtype::kBF16), HasSubstr("\"LlamaForCausalLM\""));
  EXPECT_FALSE(HfExportLayout(*m).interleaved_rope);

  std::string defaults = json;
  for (const char* key :
       {"\"head_dim\": 128, ", "\"rope_theta\": 500000, ", "\"tie_word_embeddings\": true, "}) {
    defaults.erase(defaults.find(key), std::string(key).size());
  }
  auto d = ModelFromHfConfig(defaults, "d/config.json");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->ParameterCount(), m->ParameterCount());
  EXPECT_EQ(d->rope_theta, 500000.0f);
  std::string biased = json;
  biased.replace(biased.find("\"use_bias\": false"), 17, "\"use_bias\": true");
  EXPECT_THAT(std::string(ModelFromHfConfig(biased, "b/config.json").status().message()),
              HasSubstr("b/config.json: use_bias must be false"));
}

// Seed-OSS-36B's shape (SeedOssForCausalLM): Qwen2's model (biases on q, k and v, attention_bias
// defaulting to true) with 80 heads of 128 over a width of 5120 and 8 key/value heads; its dropout
// probabilities are accepted and not applied, a bias on o_proj is refused.
TEST(HfFormat, SeedOssConfigReadsAsQwen2) {
  const std::string json = R"({
    "architectures": ["SeedOssForCausalLM"], "attention_bias": true, "attention_dropout": 0.1,
    "attention_out_bias": false, "bos_token_id": 0, "eos_token_id": 2, "head_dim": 128,
    "hidden_act": "silu", "hidden_size": 5120, "initializer_range": 0.02,
    "intermediate_size": 27648, "max_position_embeddings": 524288, "mlp_bias": false,
    "model_type": "seed_oss", "num_attention_heads": 80, "num_hidden_layers": 64,
    "num_key_value_heads": 8, "pad_token_id": 1, "residual_dropout": 0.1, "rms_norm_eps": 1e-06,
    "rope_scaling": {"rope_type": "default"}, "rope_theta": 10000000.0,
    "tie_word_embeddings": false, "torch_dtype": "bfloat16", "use_cache": true,
    "vocab_size": 155136})";
  HfLayout layout;
  auto m = ModelFromHfConfig(json, "Seed-OSS-36B-Base/config.json", &layout);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_FALSE(layout.interleaved_rope || layout.glm);
  EXPECT_TRUE(m->qkv_bias);
  EXPECT_EQ(m->explicit_head_dim, 128);
  EXPECT_EQ(m->rope_theta, 1e7f);
  EXPECT_FALSE(m->rope_scaling.enabled());
  ASSERT_TRUE(config::ValidateModelConfig(*m).ok());
  // By hand: q and o of 10240, k and v of 1024 with q, k and v's biases, the MLP, two norms; the
  // untied embedding and head of 155136 rows and the final norm.
  const int64_t block = 2 * int64_t{10240} * 5120 + 2 * int64_t{1024} * 5120 + (10240 + 2 * 1024) +
                        3 * int64_t{27648} * 5120 + 2 * 5120;
  EXPECT_EQ(m->ParameterCount(), 64 * block + 2 * int64_t{155136} * 5120 + 5120);
  EXPECT_EQ(m->ParameterCount(), 36151104512);
  ASSERT_TRUE(HfTensors(*m, layout).ok());
  // Trainyard writes the same model as Qwen2's.
  EXPECT_THAT(HfConfigJson(*m, TensorDtype::kBF16), HasSubstr("\"Qwen2ForCausalLM\""));

  std::string unbiased = json;
  unbiased.erase(unbiased.find("\"attention_bias\": true, "), 24);
  EXPECT_TRUE(ModelFromHfConfig(unbiased, "d/config.json")->qkv_bias);  // the default
  unbiased = json;
  unbiased.replace(unbiased.find("\"attention_bias\": true"), 22, "\"attention_bias\": false");
  EXPECT_FALSE(ModelFromHfConfig(unbiased, "u/config.json")->qkv_bias);
  std::string out_bias = json;
  out_bias.replace(out_bias.find("\"attention_out_bias\": false"), 27,
                   "\"attention_out_bias\": true");
  EXPECT_THAT(std::string(ModelFromHfConfig(out_bias, "o/config.json").status().message()),
              HasSubstr("o/config.json: attention_out_bias must be false"));
}

// Helium 1 2B's shape (HeliumForCausalLM): Llama's model with RoPE in neighbouring pairs over
// heads of 128, 20 of them with as many key/value heads; transformers' defaults (rope_theta
// 100000, rms_norm_eps 1e-8, heads 128 wide, no biases) where the config is silent.
TEST(HfFormat, HeliumConfigReadsAsLlamaWithInterleavedRope) {
  const std::string json = R"({
    "architectures": ["HeliumForCausalLM"], "attention_bias": false, "bos_token_id": 1,
    "eos_token_id": 2, "head_dim": 128, "hidden_act": "silu", "hidden_size": 2560,
    "intermediate_size": 7040, "max_position_embeddings": 4096, "mlp_bias": false,
    "model_type": "helium", "num_attention_heads": 20, "num_hidden_layers": 24,
    "num_key_value_heads": 20, "pad_token_id": 3,
    "rms_norm_eps": 1e-08, "rope_theta": 100000.0, "tie_word_embeddings": false,
    "torch_dtype": "bfloat16", "vocab_size": 48000})";
  HfLayout layout;
  auto m = ModelFromHfConfig(json, "helium-1-2b/config.json", &layout);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_TRUE(layout.interleaved_rope);
  EXPECT_FALSE(m->qkv_bias);
  EXPECT_EQ(m->head_dim(), 128);
  EXPECT_EQ(m->norm_eps, 1e-8f);
  ASSERT_TRUE(config::ValidateModelConfig(*m).ok());
  // By hand: q, k, v and o of 2560 × 2560, the MLP, two norms; the untied embedding and head of
  // 48000 rows and the final norm.
  const int64_t block = 4 * int64_t{2560} * 2560 + 3 * int64_t{7040} * 2560 + 2 * 2560;
  EXPECT_EQ(m->ParameterCount(), 24 * block + 2 * int64_t{48000} * 2560 + 2560);
  EXPECT_EQ(m->ParameterCount(), 2172643840);
  ASSERT_TRUE(HfTensors(*m, layout).ok());

  std::string defaults = json;
  for (const char* key : {"\"attention_bias\": false, ", "\"head_dim\": 128, ",
                          "\"rms_norm_eps\": 1e-08, ", "\"rope_theta\": 100000.0, "}) {
    defaults.erase(defaults.find(key), std::string(key).size());
  }
  auto d = ModelFromHfConfig(defaults, "d/config.json");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_FALSE(d->qkv_bias);
  EXPECT_EQ(d->rope_theta, 100000.0f);
  EXPECT_EQ(d->norm_eps, 1e-8f);
  EXPECT_EQ(d->ParameterCount(), m->ParameterCount());
  std::string biased = json;
  biased.replace(biased.find("\"attention_bias\": false"), 23, "\"attention_bias\": true");
  EXPECT_TRUE(ModelFromHfConfig(biased, "b/config.json")->qkv_bias);
}

// GLM's interleaved rows: within each head, our row i is theirs 2i and our row R/2 + i theirs
// 2i + 1 for the R turned rows, the rest in place; ToHf and FromHf move whole rows so.
TEST(HfFormat, InterleavedHeadsMoveWholeRows) {
  const HfPiece piece{"q", 0, 12, false, {}, 6, 4};  // two heads of 6 rows, 4 turned
  const int64_t want[] = {0, 2, 1, 3, 4, 5, 6, 8, 7, 9, 10, 11};
  for (int64_t r = 0; r < 12; ++r) EXPECT_EQ(TheirRow(piece, r), want[r]) << r;
  EXPECT_TRUE(Reorders(piece));
  EXPECT_FALSE(Reorders(HfPiece{"v", 0, 12}));
  const HfTensorMap tensor{"attn.qkv.w", {12, 2}, {piece}};
  std::vector<float> ours(24), theirs(24), back(24, -1.0f);
  for (int i = 0; i < 24; ++i) ours[i] = static_cast<float>(i);
  ToHf(tensor, piece, ours.data(), theirs.data());
  for (int64_t r = 0; r < 12; ++r) {
    EXPECT_EQ(theirs[want[r] * 2], ours[r * 2]);
    EXPECT_EQ(theirs[want[r] * 2 + 1], ours[r * 2 + 1]);
  }
  FromHf(tensor, piece, theirs.data(), back.data());
  EXPECT_EQ(back, ours);
}

// GLM-4.5-Air's config.json as published (GLM-4.5's and GLM-4.6's differ in sizes and in
// use_qk_norm: true, routed_scaling_factor 2.5).
constexpr char kGlm45AirConfig[] = R"({
  "architectures": ["Glm4MoeForCausalLM"], "attention_bias": true, "attention_dropout": 0.0,
  "pad_token_id": 151329, "eos_token_id": [151329, 151336, 151338], "head_dim": 128,
  "hidden_act": "silu", "hidden_size": 4096, "partial_rotary_factor": 0.5,
  "initializer_range": 0.02, "intermediate_size": 10944, "max_position_embeddings": 131072,
  "model_type": "glm4_moe", "moe_intermediate_size": 1408, "norm_topk_prob": true,
  "num_attention_heads": 96, "n_group": 1, "topk_group": 1, "n_routed_experts": 128,
  "n_shared_experts": 1, "routed_scaling_factor": 1.0, "num_experts_per_tok": 8,
  "first_k_dense_replace": 1, "num_hidden_layers": 46, "num_key_value_heads": 8,
  "num_nextn_predict_layers": 1, "rms_norm_eps": 1e-05, "rope_scaling": null,
  "rope_theta": 1000000, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "use_cache": true, "use_qk_norm": false, "vocab_size": 151552})";

TEST(HfFormat, Glm45ConfigReadsAsDenseFirstBlocksAndBiasedSigmoidRouting) {
  HfLayout layout;
  auto m = ModelFromHfConfig(kGlm45AirConfig, "GLM-4.5-Air/config.json", &layout);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(layout.experts, HfExperts::kGlm4Moe);
  EXPECT_EQ(layout.projections, HfProjections::kSeparate);
  EXPECT_FALSE(layout.glm || layout.interleaved_rope);  // Llama's halves, not GLM's pairs
  EXPECT_EQ(layout.unread_layers_from, 46);
  EXPECT_TRUE(m->qkv_bias);
  EXPECT_FALSE(m->qk_norm || m->post_norms || m->tied_embeddings);
  EXPECT_EQ(m->head_dim(), 128);
  EXPECT_EQ(m->rotary_dim(), 64);
  EXPECT_EQ(m->norm_eps, 1e-5f);
  const config::MoeConfig& moe = m->moe;
  EXPECT_EQ(moe.experts, 128);
  EXPECT_EQ(moe.top_k, 8);
  EXPECT_EQ(moe.ffn, 1408);
  EXPECT_EQ(moe.shared_experts, 1);
  EXPECT_EQ(moe.dense_first, 1);
  EXPECT_EQ(moe.every, 1);
  EXPECT_EQ(moe.score, config::MoeScore::kSigmoid);
  EXPECT_TRUE(moe.has_bias() && moe.normalize_top_k);
  EXPECT_EQ(moe.routed_scale, 1.0f);
  EXPECT_FALSE(moe.IsMoeLayer(0));
  EXPECT_TRUE(moe.IsMoeLayer(1));
  // By hand: per block q, k, v (12288 + 2 · 1024 rows of 4096, with biases), o, two norms; block
  // 0's dense MLP 3 · 10944·4096; the 45 others' router 128·4096, 128 experts of 3 · 1408·4096
  // and the shared one; the untied embedding and head of 151552 rows and the final norm: the
  // card's 106B, of which a token uses 12B besides the embeddings.
  const int64_t attention = int64_t{14336} * 4096 + 14336 + int64_t{4096} * 12288 + 2 * 4096;
  const int64_t expert = 3 * int64_t{1408} * 4096;
  const int64_t dense = attention + 3 * int64_t{10944} * 4096;
  const int64_t sparse = attention + 128 * 4096 + 128 * expert + expert;
  const int64_t ends = 2 * int64_t{151552} * 4096 + 4096;
  EXPECT_EQ(m->ParameterCount(), dense + 45 * sparse + ends);
  EXPECT_EQ(m->ParameterCount(), int64_t{106852245504});
  EXPECT_EQ(m->ActiveParameterCount(), int64_t{13424123904});

  absl::StatusOr<std::vector<HfTensorMap>> tensors = HfTensors(*m, layout);
  ASSERT_TRUE(tensors.ok()) << tensors.status();
  std::map<std::string, std::vector<int64_t>> shapes;
  std::map<std::string, std::string> ours;
  for (const HfTensorMap& t : *tensors) {
    for (const HfPiece& piece : t.pieces) {
      shapes[piece.name] = HfShape(t, piece);
      ours[piece.name] = t.name;
    }
  }
  EXPECT_EQ(shapes["model.layers.0.mlp.gate_proj.weight"], (std::vector<int64_t>{10944, 4096}));
  EXPECT_FALSE(shapes.contains("model.layers.0.mlp.gate.weight"));
  const std::string mlp = "model.layers.45.mlp.";
  EXPECT_EQ(shapes[mlp + "gate.weight"], (std::vector<int64_t>{128, 4096}));
  EXPECT_EQ(shapes[mlp + "gate.e_score_correction_bias"], (std::vector<int64_t>{128}));
  EXPECT_EQ(ours[mlp + "gate.e_score_correction_bias"], "h.45.moe.router.bias");
  EXPECT_EQ(shapes[mlp + "experts.127.down_proj.weight"], (std::vector<int64_t>{4096, 1408}));
  EXPECT_EQ(shapes[mlp + "shared_experts.up_proj.weight"], (std::vector<int64_t>{1408, 4096}));
  EXPECT_EQ(ours[mlp + "shared_experts.down_proj.weight"], "h.45.moe.shared.proj.w");
  EXPECT_FALSE(shapes.contains(mlp + "shared_expert_gate.weight"));
  EXPECT_EQ(shapes["model.layers.45.self_attn.q_proj.bias"], (std::vector<int64_t>{12288}));
  // The multi-token prediction layer after the model is not read; the model's own layers are.
  const config::ModelFamily llama = config::ModelFamily::kLlama;
  EXPECT_EQ(HfLookupName("model.layers.46.eh_proj.weight", llama, layout), std::nullopt);
  EXPECT_EQ(HfLookupName("model.layers.46.mlp.experts.3.up_proj.weight", llama, layout),
            std::nullopt);
  EXPECT_EQ(HfLookupName("model.layers.45.mlp.gate.weight", llama, layout),
            "model.layers.45.mlp.gate.weight");
  EXPECT_EQ(HfLookupName("model.norm.weight", llama, layout), "model.norm.weight");

  // Written back: GLM-4.5's layout and config, which reads as the same model.
  ASSERT_TRUE(CheckHfWritable(*m).ok());
  EXPECT_EQ(HfExportLayout(*m).experts, HfExperts::kGlm4Moe);
  EXPECT_EQ(HfExportProjections(*m), HfProjections::kSeparate);  // not Phi-3's, for all its RoPE
  const std::string written = HfConfigJson(*m, TensorDtype::kBF16);
  EXPECT_THAT(written, HasSubstr("\"architectures\": [\"Glm4MoeForCausalLM\"]"));
  EXPECT_THAT(written, HasSubstr("\"first_k_dense_replace\": 1"));
  EXPECT_THAT(written, HasSubstr("\"num_nextn_predict_layers\": 0"));
  auto back = ModelFromHfConfig(written, "out/config.json");
  ASSERT_TRUE(back.ok()) << back.status() << "\n" << written;
  EXPECT_EQ(back->ParameterCount(), m->ParameterCount());
  EXPECT_EQ(back->moe.dense_first, 1);
  EXPECT_TRUE(back->moe.has_bias());

  // GLM-4.5's and GLM-4.6's own: per-head query and key norms with the biases, weights scaled.
  std::string full = kGlm45AirConfig;
  full.replace(full.find("\"use_qk_norm\": false"), 20, "\"use_qk_norm\": true");
  full.replace(full.find("\"routed_scaling_factor\": 1.0"), 28, "\"routed_scaling_factor\": 2.5");
  auto glm45 = ModelFromHfConfig(full, "GLM-4.5/config.json", &layout);
  ASSERT_TRUE(glm45.ok()) << glm45.status();
  EXPECT_TRUE(glm45->qk_norm && glm45->qkv_bias);
  EXPECT_EQ(glm45->moe.routed_scale, 2.5f);
  ASSERT_TRUE(HfTensors(*glm45, layout).ok());
  const std::string scaled = HfConfigJson(*glm45, TensorDtype::kBF16);
  EXPECT_THAT(scaled, HasSubstr("\"routed_scaling_factor\": 2.5"));
  EXPECT_THAT(scaled, HasSubstr("\"use_qk_norm\": true"));
  EXPECT_THAT(scaled, HasSubstr("\"n_group\": 1,\n  \"topk_group\": 1"));

  // DeepSeek-V3's group-limited routing: 8 groups of 16 experts, a token's 8 picks from the best
  // 4 groups; written back as such. Every group kept reads as no groups.
  std::string grouped_json = kGlm45AirConfig;
  grouped_json.replace(grouped_json.find("\"n_group\": 1, \"topk_group\": 1"), 29,
                       "\"n_group\": 8, \"topk_group\": 4");
  auto grouped = ModelFromHfConfig(grouped_json, "g/config.json", &layout);
  ASSERT_TRUE(grouped.ok()) << grouped.status();
  EXPECT_EQ(grouped->moe.groups, 8);
  EXPECT_EQ(grouped->moe.kept_groups(), 4);
  EXPECT_EQ(grouped->ParameterCount(), m->ParameterCount());
  EXPECT_THAT(HfConfigJson(*grouped, TensorDtype::kBF16),
              HasSubstr("\"n_group\": 8,\n  \"topk_group\": 4"));
  grouped_json.replace(grouped_json.find("\"topk_group\": 4"), 15, "\"topk_group\": 8");
  grouped = ModelFromHfConfig(grouped_json, "g/config.json", &layout);
  ASSERT_TRUE(grouped.ok()) << grouped.status();
  EXPECT_FALSE(grouped->moe.limits_groups());

  // What Trainyard does not build is refused, naming the field.
  auto refused = [](const std::string& from, const std::string& to) {
    std::string json = kGlm45AirConfig;
    json.replace(json.find(from), from.size(), to);
    return std::string(ModelFromHfConfig(json, "g/config.json").status().message());
  };
  EXPECT_THAT(refused("\"topk_group\": 1", "\"topk_group\": 2"),
              HasSubstr("g/config.json: topk_group is 2, outside 1 to n_group 1"));
  EXPECT_THAT(refused("\"n_group\": 1", "\"n_group\": 3"),
              HasSubstr("n_group is 3, which does not divide the 128 experts into groups of at "
                        "least two"));
  EXPECT_THAT(refused("\"n_group\": 1, \"topk_group\": 1", "\"n_group\": 64, \"topk_group\": 2"),
              HasSubstr("topk_group keeps 2 of n_group 64 groups of 2 experts, fewer than "
                        "num_experts_per_tok 8"));
  EXPECT_THAT(refused("\"first_k_dense_replace\": 1", "\"first_k_dense_replace\": 46"),
              HasSubstr("first_k_dense_replace is 46, which leaves no MoE block"));
  EXPECT_THAT(refused("\"num_experts_per_tok\": 8", "\"num_experts_per_tok\": 129"),
              HasSubstr("num_experts_per_tok is 129, more than the 128 of n_routed_experts"));
  EXPECT_THAT(refused("\"rope_scaling\": null",
                      "\"rope_scaling\": {\"rope_type\": \"linear\", "
                      "\"factor\": 2.0}"),
              HasSubstr("rope_scaling must be null"));
  EXPECT_THAT(refused("\"n_shared_experts\": 1", "\"n_shared_experts\": 0"),
              HasSubstr("n_shared_experts must be a positive integer"));

  // A model neither GLM-4.5's layout nor ERNIE's (softmax scores with the bias, no q, k and v
  // biases) holds is refused at export, naming the field.
  config::ModelConfig softmax = *m;
  softmax.moe.score = config::MoeScore::kSoftmax;
  EXPECT_THAT(HfTensors(softmax).status().message(), HasSubstr("model.qkv_bias: is true"));
  softmax.moe.balance = config::MoeBalance::kAuxLoss;
  EXPECT_THAT(HfTensors(softmax).status().message(), HasSubstr("model.moe.score: is softmax"));
  config::ModelConfig unbiased = *m;
  unbiased.moe.balance = config::MoeBalance::kAuxLoss;
  EXPECT_THAT(HfTensors(unbiased).status().message(), HasSubstr("model.moe.balance: is aux_loss"));
  config::ModelConfig unshared = *m;
  unshared.moe.shared_experts = 0;
  EXPECT_THAT(HfTensors(unshared).status().message(), HasSubstr("model.moe.shared_experts: is 0"));
}

// ERNIE-4.5-21B-A3B-PT's config.json as published (its keys for Baidu's own trainer, such as
// moe_capacity and moe_gate, are not read).
constexpr char kErnie45MoeConfig[] = R"({
  "architectures": ["Ernie4_5_MoeForCausalLM"], "bos_token_id": 1, "eos_token_id": 2,
  "hidden_act": "silu", "hidden_size": 2560, "intermediate_size": 12288,
  "max_position_embeddings": 131072, "model_type": "ernie4_5_moe", "num_attention_heads": 20,
  "num_key_value_heads": 4, "num_hidden_layers": 28, "pad_token_id": 0, "rms_norm_eps": 1e-05,
  "use_cache": false, "vocab_size": 103424, "rope_theta": 500000, "use_bias": false,
  "moe_num_experts": 64, "moe_num_shared_experts": 2, "moe_layer_start_index": 1,
  "moe_intermediate_size": 1536, "moe_capacity": [64, 64, 64], "moe_gate": "topk", "moe_k": 6,
  "moe_layer_interval": 1, "moe_use_aux_free": true, "num_nextn_predict_layers": 1,
  "multi_token_pred_lambda": 0.3, "tie_word_embeddings": true, "torch_dtype": "bfloat16"})";

TEST(HfFormat, ErnieMoeConfigReadsAsBiasedSoftmaxRoutingPastADenseBlock) {
  HfLayout layout;
  auto m = ModelFromHfConfig(kErnie45MoeConfig, "ERNIE-4.5-21B-A3B-PT/config.json", &layout);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(layout.experts, HfExperts::kErnieMoe);
  EXPECT_TRUE(layout.interleaved_rope);
  EXPECT_EQ(layout.unread_prefix, "model.mtp");
  EXPECT_FALSE(m->qkv_bias || m->qk_norm || m->post_norms);
  EXPECT_TRUE(m->tied_embeddings);
  EXPECT_EQ(m->head_dim(), 128);
  EXPECT_EQ(m->rotary_dim(), 128);
  const config::MoeConfig& moe = m->moe;
  EXPECT_EQ(moe.experts, 64);
  EXPECT_EQ(moe.top_k, 6);
  EXPECT_EQ(moe.ffn, 1536);
  EXPECT_EQ(moe.shared_experts, 2);
  EXPECT_EQ(moe.dense_first, 1);
  EXPECT_EQ(moe.every, 1);
  EXPECT_EQ(moe.score, config::MoeScore::kSoftmax);
  EXPECT_TRUE(moe.has_bias() && moe.normalize_top_k);
  // By hand: per block q, k, v (2560 + 2 · 512 rows of 2560), o, two norms; block 0's dense MLP
  // 3 · 12288·2560; the 27 others' router 64·2560, 64 experts of 3 · 1536·2560 and two shared;
  // the tied embedding of 103424 rows and the final norm: the card's 21B, of which 3B per token.
  const int64_t attention = int64_t{3584} * 2560 + int64_t{2560} * 2560 + 2 * 2560;
  const int64_t expert = 3 * int64_t{1536} * 2560;
  const int64_t dense = attention + 3 * int64_t{12288} * 2560;
  const int64_t sparse = attention + 64 * 2560 + 64 * expert + 2 * expert;
  EXPECT_EQ(m->ParameterCount(), dense + 27 * sparse + int64_t{103424} * 2560 + 2560);
  EXPECT_EQ(m->ParameterCount(), int64_t{21825436160});
  EXPECT_EQ(m->ActiveParameterCount(), int64_t{3352148480});

  absl::StatusOr<std::vector<HfTensorMap>> tensors = HfTensors(*m, layout);
  ASSERT_TRUE(tensors.ok()) << tensors.status();
  std::map<std::string, HfPiece> pieces;
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const HfTensorMap& t : *tensors) {
    for (const HfPiece& piece : t.pieces) {
      pieces[piece.name] = piece;
      shapes[piece.name] = HfShape(t, piece);
    }
  }
  const std::string h = "model.layers.27.";
  EXPECT_EQ(shapes[h + "mlp.moe_statics.e_score_correction_bias"], (std::vector<int64_t>{1, 64}));
  EXPECT_EQ(shapes[h + "mlp.shared_experts.gate_proj.weight"], (std::vector<int64_t>{3072, 2560}));
  EXPECT_EQ(shapes[h + "mlp.experts.63.down_proj.weight"], (std::vector<int64_t>{2560, 1536}));
  EXPECT_EQ(shapes["model.layers.0.mlp.up_proj.weight"], (std::vector<int64_t>{12288, 2560}));
  EXPECT_EQ(pieces[h + "self_attn.k_proj.weight"].head_rows, 128);  // RoPE in neighbouring pairs
  EXPECT_EQ(pieces[h + "self_attn.k_proj.weight"].rope_rows, 128);
  const config::ModelFamily llama = config::ModelFamily::kLlama;
  EXPECT_EQ(HfLookupName("model.mtp_block.0.mlp.up_proj.weight", llama, layout), std::nullopt);
  EXPECT_EQ(HfLookupName("model.mtp_linear_proj.0.weight", llama, layout), std::nullopt);
  EXPECT_EQ(HfLookupName("model.norm.weight", llama, layout), "model.norm.weight");

  // Written back as ERNIE 4.5's MoE, which reads as the same model.
  ASSERT_TRUE(CheckHfWritable(*m).ok());
  const HfLayout written_layout = HfExportLayout(*m);
  EXPECT_EQ(written_layout.experts, HfExperts::kErnieMoe);
  EXPECT_TRUE(written_layout.interleaved_rope);
  const std::string written = HfConfigJson(*m, TensorDtype::kBF16);
  EXPECT_THAT(written, HasSubstr("\"architectures\": [\"Ernie4_5_MoeForCausalLM\"]"));
  EXPECT_THAT(written, HasSubstr("\"moe_layer_end_index\": 27"));
  auto back = ModelFromHfConfig(written, "out/config.json");
  ASSERT_TRUE(back.ok()) << back.status() << "\n" << written;
  EXPECT_EQ(back->ParameterCount(), m->ParameterCount());
  EXPECT_EQ(back->moe.dense_first, 1);
  EXPECT_EQ(back->moe.shared_experts, 2);

  auto refused = [](const std::string& from, const std::string& to) {
    std::string json = kErnie45MoeConfig;
    json.replace(json.find(from), from.size(), to);
    return std::string(ModelFromHfConfig(json, "e/config.json").status().message());
  };
  EXPECT_THAT(refused("\"moe_layer_interval\": 1",
                      "\"moe_layer_interval\": 1, "
                      "\"moe_layer_end_index\": 20"),
              HasSubstr("moe_layer_end_index must be -1 or reach the last block, 27"));
  EXPECT_THAT(refused("\"use_bias\": false", "\"use_bias\": true"),
              HasSubstr("use_bias must be false"));
  EXPECT_THAT(refused("\"moe_k\": 6", "\"moe_k\": 65"),
              HasSubstr("moe_k is 65, more than the 64 of moe_num_experts"));
  EXPECT_THAT(refused("\"moe_layer_start_index\": 1", "\"moe_layer_start_index\": 28"),
              HasSubstr("leaves no MoE block among the 28"));
  // Without shared experts (moe_num_shared_experts 0) the blocks have none.
  std::string none = kErnie45MoeConfig;
  const std::string two = "\"moe_num_shared_experts\": 2";
  none.replace(none.find(two), two.size(), "\"moe_num_shared_experts\": 0");
  auto unshared = ModelFromHfConfig(none, "e/config.json", &layout);
  ASSERT_TRUE(unshared.ok()) << unshared.status();
  EXPECT_EQ(unshared->moe.shared_experts, 0);
  auto plain = HfTensors(*unshared, layout);
  ASSERT_TRUE(plain.ok()) << plain.status();
  for (const HfTensorMap& t : *plain) EXPECT_EQ(t.name.find("moe.shared"), std::string::npos);

  // What ERNIE's layout cannot hold is refused at export, naming the field.
  config::ModelConfig partial = *m;
  partial.rope_dim = 64;
  EXPECT_THAT(HfTensors(partial).status().message(), HasSubstr("model.rope_dim: is 64"));
  config::ModelConfig scaled = *m;
  scaled.moe.routed_scale = 2.0f;
  EXPECT_THAT(HfTensors(scaled).status().message(), HasSubstr("model.moe.routed_scale: is 2"));
  config::ModelConfig grouped = *m;
  grouped.moe.groups = 8;
  grouped.moe.group_top_k = 4;
  EXPECT_THAT(HfTensors(grouped).status().message(),
              HasSubstr("model.moe.group_top_k: keeps 4 of 8 expert groups"));
  config::ModelConfig biased = *m;
  biased.qkv_bias = true;
  EXPECT_THAT(HfTensors(biased).status().message(), HasSubstr("model.qkv_bias: is true"));
}

}  // namespace
// `json` as transformers 5 saves a config: rope_theta, partial_rotary_factor and rope_scaling
// moved into one rope_parameters map (rope_type "default" without a scaling).
std::string InTransformers5Form(const std::string& json) {
  google::protobuf::Struct config;
  EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(json, &config).ok());
  auto& fields = *config.mutable_fields();
  google::protobuf::Struct parameters;
  auto& moved = *parameters.mutable_fields();
  moved["rope_type"].set_string_value("default");
  if (auto it = fields.find("rope_scaling"); it != fields.end()) {
    if (it->second.has_struct_value()) {
      for (const auto& [key, value] : it->second.struct_value().fields()) {
        moved[key == "type" ? "rope_type" : key] = value;
      }
    }
    fields.erase(it);
  }
  for (const char* key : {"rope_theta", "partial_rotary_factor"}) {
    if (auto it = fields.find(key); it != fields.end()) {
      moved[key] = it->second;
      fields.erase(it);
    }
  }
  *fields["rope_parameters"].mutable_struct_value() = parameters;
  std::string out;
  EXPECT_TRUE(google::protobuf::util::MessageToJsonString(config, &out).ok());
  return out;
}

// Configs saved by transformers 5 carry RoPE in rope_parameters: each published config here, in
// that form, reads as the same model (Llama 3's scaling, LongRoPE, partial rotation, YaRN,
// none). Gemma 3's per-layer-type maps give the global blocks' base and scaling and the local
// blocks' base. A field given both ways, differently, and the forms Trainyard does not read are
// refused.
TEST(HfFormat, Transformers5RopeParametersReadAsTheFieldsTheyReplace) {
  std::string phi4_mini = kPhi35MiniConfig;
  phi4_mini.replace(phi4_mini.find("\"num_key_value_heads\": 32"), 25,
                    "\"num_key_value_heads\": 8, \"partial_rotary_factor\": 0.75");
  phi4_mini.replace(phi4_mini.find("\"num_attention_heads\": 32"), 25,
                    "\"num_attention_heads\": 24");
  for (const std::string& json :
       {std::string(kLlama32Config), std::string(kPhi35MiniConfig), phi4_mini,
        std::string(kGlm4Config), std::string(kDots1Config), std::string(kGlm45AirConfig)}) {
    auto v4 = ModelFromHfConfig(json, "4/config.json");
    auto v5 = ModelFromHfConfig(InTransformers5Form(json), "5/config.json");
    ASSERT_TRUE(v4.ok()) << v4.status();
    ASSERT_TRUE(v5.ok()) << v5.status() << "\n" << InTransformers5Form(json);
    EXPECT_EQ(v5->rope_theta, v4->rope_theta);
    EXPECT_EQ(v5->rope_scaling, v4->rope_scaling);
    EXPECT_EQ(v5->rope_dim, v4->rope_dim);
    EXPECT_EQ(v5->ParameterCount(), v4->ParameterCount());
    EXPECT_EQ(HfConfigJson(*v5, TensorDtype::kBF16), HfConfigJson(*v4, TensorDtype::kBF16));
  }
  auto llama = ModelFromHfConfig(InTransformers5Form(kLlama32Config), "5/config.json");
  ASSERT_TRUE(llama.ok()) << llama.status();
  EXPECT_EQ(llama->rope_theta, 500000.0f);
  EXPECT_EQ(llama->rope_scaling.factor, 32.0f);

  // Gemma 3 4B's language model with its RoPE per layer type (the local base moved off its
  // default to show where it goes).
  const std::string gemma3 = R"({"model_type": "gemma3", "text_config": {
      "hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text",
      "num_hidden_layers": 34, "sliding_window": 1024, "rope_parameters": {
        "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 20000.0}}}})";
  auto g = ModelFromHfConfig(gemma3, "g/config.json");
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->rope_scaling, (config::RopeScaling{.linear = true, .factor = 8.0f}));
  EXPECT_EQ(g->rope_theta, 1e6f);
  EXPECT_EQ(g->rope_local_theta, 20000.0f);

  const std::string tiny = R"("model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
      "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 256,
      "max_position_embeddings": 64)";
  auto refusal = [](const std::string& json) {
    return std::string(ModelFromHfConfig(json, "c/config.json").status().message());
  };
  EXPECT_THAT(refusal(absl::StrCat("{", tiny, R"(, "rope_theta": 10000.0,
      "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}})")),
              HasSubstr("c/config.json: rope_theta and rope_parameters.rope_theta both give it, "
                        "differently"));
  EXPECT_THAT(refusal(absl::StrCat("{", tiny, R"(, "rope_scaling": {"rope_type": "linear",
      "factor": 2.0}, "rope_parameters": {"rope_type": "linear", "factor": 4.0}})")),
              HasSubstr("c/config.json: rope_scaling and rope_parameters both give it"));
  EXPECT_THAT(refusal(absl::StrCat("{", tiny, R"(, "rope_parameters": {"full_attention":
      {"rope_type": "default", "rope_theta": 10000.0}}})")),
              HasSubstr("rope_parameters gives RoPE per layer type, which Trainyard reads for "
                        "Gemma 3 and OLMo 3 only"));
  EXPECT_THAT(refusal(absl::StrCat("{", tiny, R"(, "rope_parameters": [1]})")),
              HasSubstr("c/config.json: rope_parameters must be a map"));
  std::string scaled_local = gemma3;
  scaled_local.replace(scaled_local.find("\"rope_type\": \"default\""), 22,
                       "\"rope_type\": \"linear\"");
  EXPECT_THAT(refusal(scaled_local),
              HasSubstr("c/config.json: text_config: rope_parameters.sliding_attention.rope_type "
                        "must be \"default\""));
}

// config.json's quantization_config: none, or DeepSeek's block-quantized FP8 (its blocks); any
// other is refused naming the field.
TEST(HfFormat, Fp8WeightBlockReadsTheBlocksAndRefusesOtherQuantizations) {
  auto block = [](const std::string& quantization) {
    return Fp8WeightBlock(absl::StrCat(R"({"model_type": "llama")", quantization, "}"), "q.json");
  };
  ASSERT_TRUE(block("").ok());
  EXPECT_EQ(*block(""), (std::array<int64_t, 2>{0, 0}));
  auto fp8 = block(R"(, "quantization_config": {"activation_scheme": "dynamic",
      "fmt": "float8_e4m3fn", "quant_method": "fp8", "weight_block_size": [128, 128]})");
  ASSERT_TRUE(fp8.ok()) << fp8.status();
  EXPECT_EQ(*fp8, (std::array<int64_t, 2>{128, 128}));
  EXPECT_THAT(
      block(R"(, "quantization_config": {"quant_method": "gptq", "bits": 4})").status().message(),
      HasSubstr("q.json: quantization_config: quant_method is \"gptq\"; Trainyard reads "
                "unquantized weights and block-quantized \"fp8\""));
  EXPECT_THAT(block(R"(, "quantization_config": {"quant_method": "fp8"})").status().message(),
              HasSubstr("weight_block_size must be [rows, cols]"));
  EXPECT_THAT(block(R"(, "quantization_config": {"quant_method": "fp8", "fmt": "float8_e5m2",
      "weight_block_size": [128, 128]})")
                  .status()
                  .message(),
              HasSubstr("quantization_config: fmt must be \"float8_e4m3fn\""));
  EXPECT_THAT(block(R"(, "quantization_config": {"quant_method": "fp8",
      "weight_block_size": [128, 0]})")
                  .status()
                  .message(),
              HasSubstr("weight_block_size must be two positive integers"));
}

// MiniMax-M2's config as published (its FP8 quantization_config and multi-token prediction keys
// beside the model's): OLMoE's norms over the whole q and k, RoPE over the first 64 of each
// head's 128 dimensions, and 256 experts of 1536 picked 8 at a time by sigmoid score plus a
// selection bias. By hand: 62 · (q, o 2 · 6144·3072 + k, v 2 · 1024·3072 + the norms 6144 + 1024
// + router 256·3072 + experts 256 · 3 · 1536·3072 + two norms 2 · 3072) + the untied embedding
// and head 2 · 200064·3072 + the final norm 3072 = 228,689,748,992 (the selection biases are the
// router's state, not parameters). It writes back as MiniMax-M2 and reads as the same model.
TEST(HfFormat, MiniMaxM2ConfigReadsAsProjectionNormsOverBiasedSigmoidExperts) {
  std::string softmax_attention;
  for (int l = 0; l < 62; ++l) absl::StrAppend(&softmax_attention, l == 0 ? "" : ", ", "1");
  const std::string json = absl::StrCat(R"({
    "architectures": ["MiniMaxM2ForCausalLM"], "attn_type_list": [)",
                                        softmax_attention, R"(], "head_dim": 128,
    "hidden_act": "silu", "hidden_size": 3072, "intermediate_size": 1536,
    "max_position_embeddings": 196608, "model_type": "minimax_m2", "mtp_transformer_layers": 1,
    "num_attention_heads": 48, "num_experts_per_tok": 8, "num_hidden_layers": 62,
    "num_key_value_heads": 8, "num_local_experts": 256, "num_mtp_modules": 3,
    "qk_norm_type": "per_layer", "quantization_config": {"activation_scheme": "dynamic",
      "fmt": "float8_e4m3fn", "quant_method": "fp8", "weight_block_size": [128, 128]},
    "rms_norm_eps": 1e-06, "rope_theta": 5000000, "rotary_dim": 64,
    "router_aux_loss_coef": 0.001, "scoring_func": "sigmoid", "shared_intermediate_size": 0,
    "sliding_window": null, "tie_word_embeddings": false, "use_mtp": true, "use_qk_norm": true,
    "use_routing_bias": true, "vocab_size": 200064})");
  HfLayout layout;
  auto m = ModelFromHfConfig(json, "MiniMax-M2/config.json", &layout);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(layout.experts, HfExperts::kMiniMaxM2);
  EXPECT_EQ(layout.unread_layers_from, 62);
  EXPECT_TRUE(m->NormsWholeProjection());
  EXPECT_EQ(m->head_dim(), 128);
  EXPECT_EQ(m->rope_dim, 64);
  EXPECT_EQ(m->rope_theta, 5e6f);
  EXPECT_EQ(m->moe.experts, 256);
  EXPECT_EQ(m->moe.top_k, 8);
  EXPECT_EQ(m->moe.ffn, 1536);
  EXPECT_EQ(m->moe.score, config::MoeScore::kSigmoid);
  EXPECT_EQ(m->moe.balance, config::MoeBalance::kBias);
  EXPECT_TRUE(m->moe.normalize_top_k);
  EXPECT_EQ(m->moe.shared_experts, 0);
  EXPECT_EQ(m->moe.dense_first, 0);
  EXPECT_EQ(m->ParameterCount(), 228689748992);
  ASSERT_TRUE(CheckHfWritable(*m).ok()) << CheckHfWritable(*m);
  const std::string written = HfConfigJson(*m, TensorDtype::kBF16);
  EXPECT_THAT(written, HasSubstr("\"architectures\": [\"MiniMaxM2ForCausalLM\"]"));
  auto back = ModelFromHfConfig(written, "config.json");
  ASSERT_TRUE(back.ok()) << back.status() << "\n" << written;
  EXPECT_EQ(back->ParameterCount(), m->ParameterCount());
  EXPECT_EQ(back->rope_dim, 64);
  EXPECT_TRUE(back->NormsWholeProjection());
  EXPECT_EQ(HfExportLayout(*back).experts, HfExperts::kMiniMaxM2);
  EXPECT_EQ(back->moe.score, config::MoeScore::kSigmoid);
  config::ModelConfig shared = *m;
  shared.moe.shared_experts = 1;
  EXPECT_THAT(HfTensors(shared).status().message(),
              HasSubstr("model.moe.shared_experts: is set; Trainyard writes sigmoid-scored experts "
                        "with norms over the whole q and k in MiniMax-M2's layout only"));
  auto tensors = HfTensors(*m, layout);
  ASSERT_TRUE(tensors.ok()) << tensors.status();
  std::set<std::string> names;
  for (const HfTensorMap& t : *tensors) {
    for (const HfPiece& piece : t.pieces) names.insert(piece.name);
  }
  for (const char* name : {"model.layers.0.block_sparse_moe.gate.weight",
                           "model.layers.0.block_sparse_moe.e_score_correction_bias",
                           "model.layers.61.block_sparse_moe.experts.255.w2.weight",
                           "model.layers.0.self_attn.q_norm.weight"}) {
    EXPECT_TRUE(names.count(name)) << name;
  }
  EXPECT_EQ(HfLookupName("model.layers.62.enorm.weight", config::ModelFamily::kLlama, layout),
            std::nullopt);

  auto with = [&](const std::string& from, const std::string& to) {
    return RefusalWith(json, from, to, "x/config.json");
  };
  EXPECT_THAT(with("\"scoring_func\": \"sigmoid\"", "\"scoring_func\": \"softmax\""),
              HasSubstr("x/config.json: scoring_func must be \"sigmoid\""));
  EXPECT_THAT(with("\"attn_type_list\": [1", "\"attn_type_list\": [0"),
              HasSubstr("attn_type_list must be all 1"));
  EXPECT_THAT(with("\"shared_intermediate_size\": 0", "\"shared_intermediate_size\": 512"),
              HasSubstr("shared_intermediate_size must be 0"));
  EXPECT_THAT(with("\"rotary_dim\": 64", "\"rotary_dim\": 63"),
              HasSubstr("rotary_dim must be even and at most head_dim 128"));
}

}  // namespace trainyard::worker::convert
