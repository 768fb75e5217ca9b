// A 500-step GPT-2-family run on generated data (an order-1 Markov chain of known entropy) on
// the GPU with bf16 activations reaches the validation loss of the same run on the CPU engine
// within 2%.
#include <cmath>
#include <cstdio>

#include "config/model_config.h"
#include "config/spec.h"
#include "gtest/gtest.h"
#include "tests/gpu/gpu_test_util.h"
#include "worker/backend.h"
#include "worker/cuda_backend.h"
#include "worker/trainer.h"

namespace trainyard::worker {
namespace {

TEST(ConvergenceOnGpu, FiveHundredStepsMatchTheCpuEngine) {
  TY_SKIP_WITHOUT_GPU();
  config::JobSpec spec;
  spec.name = "gpu-convergence";
  spec.model = *config::Preset("gpt2-debug");
  spec.model.vocab = 128;
  spec.data.source = "markov";
  spec.data.markov.vocab = 128;
  spec.data.markov.train_tokens = 1 << 20;
  spec.data.markov.val_tokens = 1 << 14;
  spec.training.steps = 500;
  spec.training.batch = 16;
  spec.training.seq_len = 64;
  spec.training.lr = 3e-3;
  spec.training.warmup_steps = 20;
  spec.training.eval_every = 500;
  spec.training.eval_batches = 8;

  auto cpu = MakeCpuBackend(0);
  auto cpu_result = Train(spec, *cpu, {});
  ASSERT_TRUE(cpu_result.ok()) << cpu_result.status();
  auto gpu = MakeCudaBackend({});
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  auto gpu_result = Train(spec, **gpu, {});
  ASSERT_TRUE(gpu_result.ok()) << gpu_result.status();

  ASSERT_FALSE(cpu_result->evals.empty());
  ASSERT_FALSE(gpu_result->evals.empty());
  const double cpu_val = cpu_result->evals.back().loss, gpu_val = gpu_result->evals.back().loss;
  std::printf("val loss after %lld steps: cpu %.4f, gpu (bf16) %.4f, data entropy %.4f\n",
              static_cast<long long>(spec.training.steps), cpu_val, gpu_val,
              cpu_result->entropy_nats.value_or(NAN));
  EXPECT_TRUE(std::isfinite(gpu_val));
  EXPECT_LE(std::abs(gpu_val - cpu_val) / cpu_val, 0.02);
}

}  // namespace
}  // namespace trainyard::worker
