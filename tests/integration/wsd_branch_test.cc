// Warmup-stable-decay's workflow: a run held at its peak learning rate is checkpointed, and a
// decay branched from that checkpoint later trains exactly as a run that had scheduled the same
// decay from the start (losses and parameters to the bit); during the stable phase it trains as
// a constant schedule does, and the decay changes the last steps.
#include <filesystem>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/integration/rank_threads.h"
#include "tests/integration/test_env.h"

namespace trainyard::worker {
namespace {

config::JobSpec Job(const std::string& schedule, int64_t steps) {
  config::JobSpec spec;
  spec.name = "wsd-branch";
  spec.model = *config::Preset("llama-debug");
  spec.model.max_seq = 32;
  spec.data.source = "markov";
  spec.data.markov.vocab = 64;
  spec.data.markov.train_tokens = 1 << 15;
  spec.data.markov.val_tokens = 1 << 12;
  spec.training.steps = steps;
  spec.training.batch = 4;
  spec.training.seq_len = 32;
  spec.training.warmup_steps = 2;
  spec.training.schedule = schedule;
  spec.training.min_lr_ratio = 0.0;
  spec.training.eval_every = 0;
  spec.fault_tolerance.memory_every_steps = 0;
  if (schedule == "wsd") spec.training.decay_steps = 4;
  return spec;
}

// The one rank's result and final parameters.
struct TrainedRun {
  absl::StatusOr<TrainResult> result;
  std::vector<float> params;
};
TrainedRun TrainWith(const config::JobSpec& spec) {
  testenv::RankRun run = testenv::RunRanks(spec);
  return {std::move(run.results[0]), std::move(run.final_params[0])};
}

TEST(WarmupStableDecay, DecayBranchedFromAStableCheckpointIsTheScheduledOne) {
  const std::filesystem::path scratch = testenv::MakeScratchDir("wsd-branch");
  for (const char* shape : {"linear", "1-sqrt"}) {
    SCOPED_TRACE(shape);
    config::JobSpec scheduled = Job("wsd", 12);  // the decay is steps 9 to 12
    scheduled.training.decay_shape = shape;
    const TrainedRun whole = TrainWith(scheduled);
    ASSERT_TRUE(whole.result.ok()) << whole.result.status();
    ASSERT_EQ(whole.result->train_losses.size(), 12u);

    // Held at the peak, checkpointed after step 8; the same run kept constant to step 12.
    config::JobSpec stable = Job("constant", 8);
    stable.checkpoint.dir = (scratch / shape / "stable").string();
    stable.checkpoint.every_steps = 8;
    const TrainedRun held = TrainWith(stable);
    ASSERT_TRUE(held.result.ok()) << held.result.status();
    const TrainedRun constant = TrainWith(Job("constant", 12));
    ASSERT_TRUE(constant.result.ok()) << constant.result.status();
    for (size_t i = 0; i < 8; ++i) {
      EXPECT_EQ(held.result->train_losses[i], whole.result->train_losses[i]) << "step " << i + 1;
    }

    // The decay branched from the stable checkpoint.
    config::JobSpec branch = scheduled;
    branch.checkpoint.dir = (scratch / shape / "branch").string();
    branch.checkpoint.resume_from = stable.checkpoint.dir;
    const TrainedRun decayed = TrainWith(branch);
    ASSERT_TRUE(decayed.result.ok()) << decayed.result.status();
    EXPECT_EQ(decayed.result->first_step, 8);
    ASSERT_EQ(decayed.result->train_losses.size(), 4u);
    for (size_t i = 0; i < 4; ++i) {
      EXPECT_EQ(decayed.result->train_losses[i], whole.result->train_losses[8 + i])
          << "step " << 9 + i;
    }
    EXPECT_EQ(decayed.params, whole.params);
    // Step 9 is the decay's first, at the peak: the same update as the constant run's. Its
    // lower learning rate changes the updates from there, and so the losses from step 11.
    EXPECT_EQ(whole.result->train_losses[8], constant.result->train_losses[8]);
    EXPECT_NE(whole.result->train_losses[10], constant.result->train_losses[10]);
    EXPECT_NE(whole.params, constant.params);
  }
}

}  // namespace
}  // namespace trainyard::worker
