// What a training step reads from the device, and when: the loss of every micro-batch is summed
// where it is computed and read once (Model::TakeTrainingLoss), and the passes are timed without
// waiting for them (Model::TakePhaseSeconds over the backend's DeviceTimer). On the CPU backend:
// the sums and the timer, and a model run as a training rank runs it (micro-batches through
// StageForward and StageBackward) against the same micro-batches read one at a time.
#include <chrono>
#include <cmath>
#include <memory>
#include <thread>
#include <vector>

#include "config/model_config.h"
#include "gtest/gtest.h"
#include "tests/unit/worker/worker_test_util.h"
#include "worker/backend.h"
#include "worker/local_model.h"

namespace trainyard::worker {
namespace {

TEST(DeviceSum, AddsUntilTakenThenStartsFromZero) {
  std::unique_ptr<Backend> be = MakeCpuBackend(1);
  std::unique_ptr<DeviceSum> sum = be->NewDeviceSum();
  sum->AddHost(1.5);
  sum->AddHost(2.25);
  EXPECT_EQ(*sum->Take(), 3.75);
  EXPECT_EQ(*sum->Take(), 0.0);
}

TEST(DeviceSum, CrossEntropyAddsEachCallsRowSum) {
  std::unique_ptr<Backend> be = MakeCpuBackend(1);
  const int64_t rows = 3, vocab = 4;
  // Uniform logits: every row's loss is log(vocab).
  std::vector<float> logits(rows * vocab, 0.5f);
  const std::vector<int32_t> targets = {0, 3, 1};
  std::unique_ptr<DeviceSum> sum = be->NewDeviceSum();
  auto* acts = reinterpret_cast<Act*>(logits.data());
  be->SoftmaxCrossEntropy(acts, targets.data(), rows, vocab, vocab, 0.0f, false, 0.0f, 0.0f,
                          nullptr, sum.get());
  be->SoftmaxCrossEntropy(acts, targets.data(), 2, vocab, vocab, 0.0f, false, 0.0f, 0.0f, nullptr,
                          sum.get());
  sum->AddHost(1.0);
  EXPECT_NEAR(*sum->Take(), 5 * std::log(4.0) + 1.0, 1e-6);
}

TEST(DeviceTimer, SumsItsSpansAndNothingBetweenThem) {
  std::unique_ptr<Backend> be = MakeCpuBackend(1);
  std::unique_ptr<DeviceTimer> timer = be->NewDeviceTimer();
  timer->Start();
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  timer->Stop();
  std::this_thread::sleep_for(std::chrono::milliseconds(400));  // not timed
  timer->Start();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  timer->Stop();
  const double seconds = *timer->Take();
  EXPECT_GE(seconds, 0.05);
  EXPECT_LT(seconds, 0.35);
  EXPECT_EQ(*timer->Take(), 0.0);
}

using test_util::RandomTokens;

// Three micro-batches as a rank runs them, the loss read once, against ForwardBackward's reading
// each: the same sum (in the same order), the same accumulated gradients, and passes timed.
TEST(StepReads, MicroBatchesReadTheirLossOnceAtTheEnd) {
  for (const char* preset : {"gpt2-debug", "llama-debug"}) {
    SCOPED_TRACE(preset);
    const config::ModelConfig config = *config::Preset(preset);
    std::unique_ptr<Backend> be = MakeCpuBackend(1);
    auto once = LocalModel::Create(config, be.get());
    auto each = LocalModel::Create(config, be.get());
    ASSERT_TRUE(once.ok() && each.ok());
    (*once)->InitParameters(5);
    (*each)->InitParameters(5);
    (*once)->ZeroGradients();
    (*each)->ZeroGradients();
    const int b = 2, t = 16, micro_batches = 3;
    const float scale = 1.0f / (micro_batches * b * t);
    double summed = 0.0;
    Model& model = (*once)->model();
    for (int i = 0; i < micro_batches; ++i) {
      const auto inputs = RandomTokens(b * t, config.vocab, 2 * i + 1);
      const auto targets = RandomTokens(b * t, config.vocab, 2 * i + 2);
      ASSERT_TRUE(
          model.StageForward({}, inputs.data(), targets.data(), b, t, nullptr, scale, nullptr)
              .ok());
      ASSERT_TRUE(model.StageBackward({}, nullptr, nullptr).ok());
      auto loss = (*each)->ForwardBackward(inputs.data(), targets.data(), b, t, scale);
      ASSERT_TRUE(loss.ok()) << loss.status();
      summed += *loss;
    }
    auto loss = model.TakeTrainingLoss();
    ASSERT_TRUE(loss.ok()) << loss.status();
    EXPECT_EQ(*loss, summed);
    EXPECT_EQ(*model.TakeTrainingLoss(), 0.0);

    std::vector<float> got((*once)->num_params()), want((*each)->num_params());
    (*once)->ReadGradients(got.data());
    (*each)->ReadGradients(want.data());
    EXPECT_EQ(got, want);

    auto phases = model.TakePhaseSeconds();
    ASSERT_TRUE(phases.ok()) << phases.status();
    EXPECT_GT(phases->forward, 0.0);
    EXPECT_GT(phases->backward, 0.0);
    EXPECT_EQ(model.TakePhaseSeconds()->forward, 0.0);
    // An evaluation is read at once and leaves the training sum alone.
    const auto inputs = RandomTokens(b * t, config.vocab, 9);
    auto eval = model.Loss(inputs.data(), inputs.data(), b, t);
    ASSERT_TRUE(eval.ok()) << eval.status();
    EXPECT_GT(*eval, 0.0);
    EXPECT_EQ(*model.TakeTrainingLoss(), 0.0);
  }
}

}  // namespace
}  // namespace trainyard::worker
