// The training loop end to end in one process: it learns generated data down to the data's
// known entropy, and it is deterministic.
#include <cstdio>
#include <sstream>

#include "absl/strings/str_format.h"
#include "common/filesystem.h"
#include "gtest/gtest.h"
#include "tests/integration/test_env.h"
#include "worker/backend.h"
#include "worker/trainer.h"

namespace trainyard::worker {
namespace {

config::JobSpec MarkovJob(config::ModelFamily family) {
  config::JobSpec spec;
  spec.name = "learns";
  spec.model = *config::Preset(family == config::ModelFamily::kGpt2 ? "gpt2-debug" : "llama-debug");
  spec.model.vocab = 32;
  spec.model.max_seq = 32;
  spec.data.source = "markov";
  spec.data.markov.order = 1;
  spec.data.markov.vocab = 32;
  spec.data.markov.concentration = 0.1;
  spec.data.markov.train_tokens = 1 << 18;
  spec.data.markov.val_tokens = 1 << 14;
  spec.data.markov.seed = 11;
  spec.training.steps = 300;
  spec.training.batch = 16;
  spec.training.micro_batch = 16;
  spec.training.seq_len = 32;
  spec.training.seed = 5;
  spec.training.lr = 1e-2;
  spec.training.warmup_steps = 20;
  spec.training.min_lr_ratio = 0.1;
  spec.training.weight_decay = 0.0;
  spec.training.eval_every = 100;
  spec.training.eval_batches = 8;
  spec.training.log_every = 50;
  return spec;
}

// Within a bounded number of steps (300 steps of 512 tokens) the validation loss gets within 5%
// of the chain's exact entropy rate.
void ExpectLearns(config::ModelFamily family) {
  const config::JobSpec spec = MarkovJob(family);
  auto backend = MakeCpuBackend(0);
  std::ostringstream log;
  auto result = Train(spec, *backend, {.progress = &log});
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_TRUE(result->entropy_nats.has_value());
  const double h = *result->entropy_nats, loss = result->evals.back().loss;
  std::printf("%s: data entropy H = %.4f nats, validation loss after %lld steps = %.4f (%+.2f%%)\n",
              config::FamilyName(family).c_str(), h, static_cast<long long>(spec.training.steps),
              loss, 100 * (loss - h) / h);
  EXPECT_LE(loss, 1.05 * h) << log.str();
  EXPECT_GE(loss, 0.95 * h) << "below the entropy floor: the validation split leaks";
}

TEST(Training, Gpt2LearnsMarkovChainToItsEntropy) { ExpectLearns(config::ModelFamily::kGpt2); }
TEST(Training, LlamaLearnsMarkovChainToItsEntropy) { ExpectLearns(config::ModelFamily::kLlama); }

// The examples a new user runs first end near their data's floor: a family that looks broken in
// its own example is a bug report waiting to happen.
TEST(Training, ExampleSpecsLearnToNearTheirEntropy) {
  for (const char* name : {"tiny.yaml", "tiny-llama.yaml"}) {
    auto spec =
        config::LoadJobSpec(*RealFileSystem(), testenv::SourceDir() + "/config/examples/" + name);
    ASSERT_TRUE(spec.ok()) << spec.status();
    auto backend = MakeCpuBackend(0);
    std::ostringstream log;
    auto result = Train(*spec, *backend, {.progress = &log});
    ASSERT_TRUE(result.ok()) << result.status();
    ASSERT_TRUE(result->entropy_nats.has_value());
    const double h = *result->entropy_nats, loss = result->evals.back().loss;
    std::printf("%s: data entropy %.4f nats, validation loss %.4f (%+.1f%%)\n", name, h, loss,
                100 * (loss - h) / h);
    EXPECT_LE(loss, 1.06 * h) << name << "\n" << log.str();
  }
}

std::vector<double> Losses(config::JobSpec spec, int threads) {
  auto backend = MakeCpuBackend(threads);
  auto result = Train(spec, *backend, {});
  EXPECT_TRUE(result.ok()) << result.status();
  return result.ok() ? result->train_losses : std::vector<double>{};
}

config::JobSpec ShortJob(config::ModelFamily family) {
  config::JobSpec spec = MarkovJob(family);
  spec.training.steps = 6;
  spec.training.micro_batch = 8;
  spec.training.eval_every = 0;
  return spec;
}

// PaLM's z-loss on the logits joins the objective, not the reported loss: the first step (before
// any update) reports the same cross-entropy with and without it, the later steps differ (its
// gradient moved the weights), and each step line shows the term.
TEST(Training, LogitZLossShapesTheUpdatesAndShowsInTheStepLines) {
  for (auto family : {config::ModelFamily::kGpt2, config::ModelFamily::kLlama}) {
    config::JobSpec spec = ShortJob(family);
    spec.training.log_every = 1;
    auto backend = MakeCpuBackend(2);
    auto plain = Train(spec, *backend, {});
    ASSERT_TRUE(plain.ok()) << plain.status();
    EXPECT_TRUE(plain->train_z_losses.empty());
    spec.model.z_loss_coeff = 0.01f;
    std::ostringstream log;
    auto with = Train(spec, *backend, {.progress = &log});
    ASSERT_TRUE(with.ok()) << with.status();
    ASSERT_EQ(with->train_z_losses.size(), 6u);
    EXPECT_EQ(with->train_losses[0], plain->train_losses[0]);
    EXPECT_NE(with->train_losses[5], plain->train_losses[5]);
    for (double z : with->train_z_losses) EXPECT_GT(z, 0.0);
    EXPECT_NE(log.str().find(absl::StrFormat("| z-loss %.3g |", with->train_z_losses[5])),
              std::string::npos)
        << log.str();
  }
}

TEST(Determinism, SameSeedGivesBitwiseIdenticalLosses) {
  for (auto family : {config::ModelFamily::kGpt2, config::ModelFamily::kLlama}) {
    const auto a = Losses(ShortJob(family), 2), b = Losses(ShortJob(family), 2);
    ASSERT_EQ(a.size(), 6u);
    EXPECT_EQ(a, b);  // exact: bitwise equal doubles
  }
}

TEST(Determinism, RecomputationDoesNotChangeLosses) {
  for (auto family : {config::ModelFamily::kGpt2, config::ModelFamily::kLlama}) {
    config::JobSpec with = ShortJob(family);
    with.model.recompute = true;
    EXPECT_EQ(Losses(ShortJob(family), 2), Losses(with, 2));
  }
}

TEST(Determinism, DifferentSeedsDiffer) {
  config::JobSpec other = ShortJob(config::ModelFamily::kGpt2);
  other.training.seed = 6;
  EXPECT_NE(Losses(ShortJob(config::ModelFamily::kGpt2), 2), Losses(other, 2));
}

}  // namespace
}  // namespace trainyard::worker
