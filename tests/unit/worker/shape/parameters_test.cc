// A rank's random initialisation draws only the elements it holds, and they are exactly its slice
// of the whole model's: every mesh (tensor-parallel rank, expert-parallel rank, pipeline stage)
// starts from the same model, value for value.
#include "worker/shape/parameters.h"

#include <cstring>
#include <string>
#include <vector>

#include "config/model_config.h"
#include "gtest/gtest.h"

namespace trainyard::worker {
namespace {

constexpr uint64_t kSeed = 1234;

// Every tensor of `local` against the slice of the whole model's (tp 1, ep 1, one stage).
void ExpectSlicesOfTheWholeModel(const config::ModelConfig& model, const ParameterLayout& local) {
  const ParameterLayout whole(model);
  std::vector<float> all(whole.total()), mine(local.total());
  whole.Initialize(kSeed, all.data());
  local.Initialize(kSeed, mine.data());
  for (const ParamTensor& t : local.tensors()) {
    SCOPED_TRACE(t.name);
    const ParamTensor* w = whole.Find(t.name);
    ASSERT_NE(w, nullptr);
    std::vector<float> want(t.numel);
    local.Slice(t, all.data() + w->offset, want.data());
    EXPECT_EQ(std::memcmp(want.data(), mine.data() + t.offset, t.numel * sizeof(float)), 0);
  }
}

TEST(ParameterInitialisation, EveryTensorParallelRankDrawsItsSliceOfTheWholeModel) {
  for (const char* preset : {"gpt2-debug", "llama-debug"}) {
    SCOPED_TRACE(preset);
    const config::ModelConfig model = *config::Preset(preset);
    for (int tp : {1, 2}) {
      for (int rank = 0; rank < tp; ++rank) {
        SCOPED_TRACE(testing::Message() << "tp rank " << rank << " of " << tp);
        ExpectSlicesOfTheWholeModel(model, ParameterLayout(model, rank, tp));
      }
    }
  }
}

TEST(ParameterInitialisation, ExpertAndPipelineRanksDrawTheirSlices) {
  config::ModelConfig model = *config::Preset("llama-debug");
  model.layers = 4;
  model.moe.experts = 4;
  model.moe.top_k = 2;
  model.moe.shared_experts = 1;
  model.moe.every = 2;
  model.moe.ffn = 32;
  const std::vector<PipelineStage> first = {{.first_layer = 0, .num_layers = 2, .last = false}};
  const std::vector<PipelineStage> second = {{.first_layer = 2, .num_layers = 2, .first = false}};
  for (int tp : {1, 2}) {
    for (int ep : {1, 2}) {
      for (int rank = 0; rank < tp * ep; ++rank) {
        for (const auto& stage : {first, second}) {
          SCOPED_TRACE(testing::Message() << "tp " << tp << " ep " << ep << " rank " << rank
                                          << " stage from layer " << stage[0].first_layer);
          ExpectSlicesOfTheWholeModel(model,
                                      ParameterLayout(model, rank % tp, tp, stage, rank / tp, ep));
        }
      }
    }
  }
}

// A range of the flat buffer (a ZeRO-3 shard: it may start and end inside tensors) is drawn
// without the rest, with the same values as the whole layout's.
TEST(ParameterInitialisation, AnyRangeOfTheBufferIsTheWholeDrawsSlice) {
  config::ModelConfig model = *config::Preset("llama-debug");
  model.moe.experts = 4;
  model.moe.top_k = 2;
  model.moe.ffn = 32;
  for (int tp : {1, 2}) {
    const ParameterLayout layout(model, tp - 1, tp, {PipelineStage{}}, 1, 2);
    std::vector<float> whole(layout.total());
    layout.Initialize(kSeed, whole.data());
    const int64_t n = layout.total();
    const int64_t cuts[][2] = {{0, n},         {0, 1},         {n - 1, n},
                               {n / 3, n / 2}, {7, n / 5 + 3}, {n / 2 + 11, n - 17}};
    for (const auto& [lo, hi] : cuts) {
      SCOPED_TRACE(testing::Message() << "tp " << tp << " [" << lo << ", " << hi << ")");
      std::vector<float> part(hi - lo);
      layout.InitializeRange(kSeed, lo, hi, part.data());
      EXPECT_EQ(std::memcmp(part.data(), whole.data() + lo, part.size() * sizeof(float)), 0);
    }
  }
}

// The parameters a converting backend keeps converted: the blocks' attention and MLP matrices
// and their biases (dense, shared and every local routed expert), counted by hand; not the
// router, norms, embeddings or LM head.
TEST(BlockLinearParams, AreTheBlocksAttentionAndMlpMatricesAndBiases) {
  const config::ModelConfig gpt2 = *config::Preset("gpt2-debug");
  const int64_t c = gpt2.width, layers = gpt2.layers, ffn = gpt2.ffn_hidden;
  EXPECT_EQ(BlockLinearParamElements(ParameterLayout(gpt2)),
            layers * (3 * c * c + c * c + 2 * c * ffn + (3 * c + c + ffn + c)));

  config::ModelConfig llama = *config::Preset("llama-debug");
  llama.layers = 2;
  llama.moe.experts = 4;
  llama.moe.top_k = 2;
  llama.moe.shared_experts = 1;
  llama.moe.every = 2;  // layer 1
  llama.moe.ffn = 32;
  const ParameterLayout layout(llama);
  std::vector<std::string> kept;
  for (const ParamTensor& t : layout.tensors()) {
    if (IsBlockLinearParam(t)) kept.push_back(t.name);
  }
  EXPECT_EQ(kept, (std::vector<std::string>{"h.0.attn.qkv.w", "h.0.attn.proj.w", "h.0.mlp.fc.w",
                                            "h.0.mlp.proj.w", "h.1.attn.qkv.w", "h.1.attn.proj.w",
                                            "h.1.moe.shared.fc.w", "h.1.moe.shared.proj.w",
                                            "h.1.moe.experts.fc.w", "h.1.moe.experts.proj.w"}));
  const int64_t w = llama.width, d = llama.head_dim();
  const int64_t attn = (llama.heads + 2 * llama.kv_heads) * d * w + w * llama.heads * d;
  const int64_t dense = 3 * w * llama.ffn_hidden, expert = 3 * w * llama.moe.ffn;
  EXPECT_EQ(BlockLinearParamElements(layout), 2 * attn + dense + expert + 4 * expert);
  // An expert-parallel rank holds half the routed experts.
  EXPECT_EQ(BlockLinearParamElements(ParameterLayout(llama, 0, 1, {PipelineStage{}}, 0, 2)),
            2 * attn + dense + expert + 2 * expert);
}

}  // namespace
}  // namespace trainyard::worker
