// `trainyard sample --device cuda`: generation with the key/value cache on the CUDA backend. Each
// token it chooses greedily is the CPU backend's argmax for the same prefix, recomputed without a
// cache, up to the rounding of the activations (fp32: 1e-4 of the logits' range; bf16: 3e-2);
// and a draw at a temperature repeats from the same seed. Dense models of both families in fp32 and
// bf16, and mixture-of-experts models of both (fp32: a pick that rounding moved would change more
// than the rounding).
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "config/model_config.h"
#include "gtest/gtest.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/integration/mesh_cases.h"
#include "worker/backend.h"
#include "worker/cuda_backend.h"
#include "worker/generate.h"
#include "worker/local_model.h"

namespace trainyard::worker {
namespace {

struct Case {
  const char* preset;
  DType act;
  bool moe = false;    // four experts, top-2, a shared expert in every second block
  bool gemma = false;  // llama: GeGLU experts too, and embeddings scaled by √width (Gemma's)
  // llama: Phi-4 mini's RoPE (10 of 16 dimensions turned with LongRoPE, the long factors from
  // the 5-token prompt on) and logits capped at 1.5 (Gemma 2's cap, small enough to bend them)
  bool phi = false;
  // Gemma 2's caps: the attention scores at 1 (in the prompt's pass and each cached step) and the
  // logits at 1.5
  bool capped = false;
  // llama: OLMo 2's blocks (no norms before the branches, each branch's output normed, norms over
  // each token's whole q and k)
  bool olmo2 = false;
};

config::ModelConfig ModelOf(const Case& c) {
  config::ModelConfig mc = *config::Preset(c.preset);
  mc.geglu = mc.scale_embeddings = c.gemma;
  if (c.phi) {
    testenv::PhiMiniRope(4, &mc);
    mc.logit_softcap = 1.5f;
  }
  if (c.capped) {
    mc.attention_softcap = 1.0f;
    mc.logit_softcap = 1.5f;
  }
  if (c.olmo2) {
    mc.pre_norms = false;
    mc.post_norms = mc.qk_norm = true;
    mc.qk_norm_span = config::QkNormSpan::kProjection;
  }
  if (!c.moe) return mc;
  mc.moe = {.experts = 4, .top_k = 2, .shared_experts = 1, .every = 2, .ffn = 64};
  if (mc.family == config::ModelFamily::kLlama) {  // the other router: sigmoid, selection bias
    mc.moe.score = config::MoeScore::kSigmoid;
    mc.moe.normalize_top_k = true;
    mc.moe.balance = config::MoeBalance::kBias;
  }
  return mc;
}

class GenerateOnGpu : public ::testing::TestWithParam<Case> {};

TEST_P(GenerateOnGpu, GreedyTokensAreTheCpuArgmaxAndDrawsRepeat) {
  TY_SKIP_WITHOUT_GPU();
  const Case& c = GetParam();
  const config::ModelConfig mc = ModelOf(c);
  auto cpu = MakeCpuBackend(0);
  absl::StatusOr<std::unique_ptr<LocalModel>> reference = LocalModel::Create(mc, cpu.get());
  ASSERT_TRUE(reference.ok()) << reference.status();
  LocalModel& cm = **reference;
  cm.InitParameters(5);
  std::vector<float> params(cm.num_params());
  cm.ReadParameters(params.data());

  absl::StatusOr<std::unique_ptr<Backend>> gpu = MakeCudaBackend({.act_dtype = c.act});
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  absl::StatusOr<std::unique_ptr<Generator>> generator =
      Generator::Create(mc, gpu->get(), params.data());
  ASSERT_TRUE(generator.ok()) << generator.status();
  const std::vector<int32_t> prompt = {3, 141, 59, 26, 5};
  absl::StatusOr<std::vector<int32_t>> greedy =
      (*generator)->Generate(prompt, {.tokens = 24, .temperature = 0.0f});
  ASSERT_TRUE(greedy.ok()) << greedy.status();
  ASSERT_EQ(greedy->size(), 24u);

  std::vector<int32_t> seq = prompt;
  const double tolerance = c.act == DType::kBF16 ? 3e-2 : 1e-4;
  for (size_t k = 0; k < greedy->size(); ++k) {
    const int t = static_cast<int>(seq.size());
    std::vector<float> logits(int64_t{t} * mc.vocab);
    ASSERT_TRUE(cm.Logits(seq.data(), 1, t, logits.data()).ok());
    const float* last = logits.data() + int64_t{t - 1} * mc.vocab;
    const auto [lo, hi] = std::minmax_element(last, last + mc.vocab);
    const int32_t chosen = (*greedy)[k];
    EXPECT_GE(last[chosen], *hi - tolerance * (*hi - *lo))
        << "token " << k << " (" << chosen << ") is not the CPU's argmax "
        << (std::max_element(last, last + mc.vocab) - last);
    seq.push_back(chosen);
  }

  const SampleOptions draw{.tokens = 24, .temperature = 0.8f, .top_k = 20, .seed = 9};
  absl::StatusOr<std::vector<int32_t>> first = (*generator)->Generate(prompt, draw);
  absl::StatusOr<std::vector<int32_t>> again = (*generator)->Generate(prompt, draw);
  ASSERT_TRUE(first.ok() && again.ok());
  EXPECT_EQ(*first, *again);
}

INSTANTIATE_TEST_SUITE_P(
    DebugPresets, GenerateOnGpu,
    ::testing::Values(Case{"gpt2-debug", DType::kF32}, Case{"gpt2-debug", DType::kBF16},
                      Case{"llama-debug", DType::kF32}, Case{"llama-debug", DType::kBF16},
                      Case{"gpt2-debug", DType::kF32, /*moe=*/true},
                      Case{"llama-debug", DType::kF32, /*moe=*/true},
                      Case{"llama-debug", DType::kBF16, /*moe=*/false,
                           /*gemma=*/true},
                      Case{"llama-debug", DType::kF32, /*moe=*/true,
                           /*gemma=*/true},
                      Case{"llama-debug", DType::kF32, /*moe=*/false, /*gemma=*/false,
                           /*phi=*/true},
                      Case{"llama-debug", DType::kBF16, /*moe=*/false, /*gemma=*/false,
                           /*phi=*/true},
                      Case{"llama-debug", DType::kF32, /*moe=*/false, /*gemma=*/true,
                           /*phi=*/false, /*capped=*/true},
                      Case{"llama-debug", DType::kBF16, /*moe=*/false, /*gemma=*/true,
                           /*phi=*/false, /*capped=*/true},
                      Case{"llama-debug", DType::kF32, /*moe=*/false, /*gemma=*/false,
                           /*phi=*/false, /*capped=*/false, /*olmo2=*/true},
                      Case{"llama-debug", DType::kBF16, /*moe=*/false, /*gemma=*/false,
                           /*phi=*/false, /*capped=*/false, /*olmo2=*/true}),
    [](const ::testing::TestParamInfo<Case>& info) {
      std::string name = std::string(info.param.preset) + (info.param.moe ? "_moe_" : "_") +
                         (info.param.gemma ? "gemma_" : "") + (info.param.phi ? "phi_" : "") +
                         (info.param.capped ? "capped_" : "") + (info.param.olmo2 ? "olmo2_" : "") +
                         DTypeName(info.param.act);
      std::replace(name.begin(), name.end(), '-', '_');
      return name;
    });

}  // namespace
}  // namespace trainyard::worker
