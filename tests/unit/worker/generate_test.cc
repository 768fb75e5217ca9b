// The generator sizes its buffers by the request, not by the model's max_seq (published Llama 3
// configs say 131072; on a GPU that much cache would be committed memory): a model of max_seq 2M
// generates, and a longer request after a shorter one grows the buffers and gives what a fresh
// generator gives.
#include "worker/generate.h"

#include <memory>
#include <vector>

#include "config/model_config.h"
#include "gtest/gtest.h"
#include "worker/backend.h"
#include "worker/local_model.h"

namespace trainyard::worker {
namespace {

std::vector<float> RandomParams(const config::ModelConfig& model, Backend* backend) {
  auto local = LocalModel::Create(model, backend);
  EXPECT_TRUE(local.ok()) << local.status();
  if (!local.ok()) return {};
  (*local)->InitParameters(7);
  std::vector<float> params((*local)->num_params());
  (*local)->ReadParameters(params.data());
  return params;
}

TEST(Generator, BuffersFollowTheRequest) {
  config::ModelConfig model = *config::Preset("llama-debug");
  model.max_seq = 1 << 21;
  std::unique_ptr<Backend> backend = MakeCpuBackend(1);
  const std::vector<float> params = RandomParams(model, backend.get());
  auto generator = Generator::Create(model, backend.get(), params.data());
  ASSERT_TRUE(generator.ok()) << generator.status();
  const std::vector<int32_t> prompt = {3, 141, 59};
  auto short_run = (*generator)->Generate(prompt, {.tokens = 2});
  auto long_run = (*generator)->Generate(prompt, {.tokens = 20});
  ASSERT_TRUE(short_run.ok() && long_run.ok());
  auto fresh = Generator::Create(model, backend.get(), params.data());
  ASSERT_TRUE(fresh.ok());
  auto fresh_run = (*fresh)->Generate(prompt, {.tokens = 20});
  ASSERT_TRUE(fresh_run.ok());
  EXPECT_EQ(*long_run, *fresh_run);
  EXPECT_EQ(std::vector<int32_t>(long_run->begin(), long_run->begin() + 2), *short_run);
}

}  // namespace
}  // namespace trainyard::worker
