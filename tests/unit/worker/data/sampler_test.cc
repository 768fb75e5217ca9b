#include "worker/data/sampler.h"

#include <cstdint>
#include <numeric>
#include <set>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/data/token_stream.h"

namespace trainyard::worker {
namespace {

using ::testing::HasSubstr;

// Token i is i mod 65536, so a window's first token tells where it starts.
MemoryStream CountingStream(int64_t n) {
  std::vector<uint16_t> tokens(n);
  for (int64_t i = 0; i < n; ++i) tokens[i] = static_cast<uint16_t>(i % 65536);
  return MemoryStream(std::move(tokens), 65536);
}

struct Batch {
  std::vector<int32_t> inputs, targets;
};

Batch Train(const BatchSampler& sampler, int64_t step, int64_t first, int count) {
  Batch b{std::vector<int32_t>(count * sampler.seq_len()),
          std::vector<int32_t>(count * sampler.seq_len())};
  sampler.FillTrain(step, first, count, b.inputs.data(), b.targets.data());
  return b;
}

TEST(BatchSamplerTest, CheckRejectsStreamsThatCannotHoldOneSequence) {
  const MemoryStream stream = CountingStream(16);
  EXPECT_TRUE(BatchSampler::Check(stream, 15).ok());
  const absl::Status too_short = BatchSampler::Check(stream, 16);
  EXPECT_EQ(too_short.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(too_short.message(), HasSubstr("holds 16 tokens"));
  EXPECT_THAT(too_short.message(), HasSubstr("needs at least 17"));
  EXPECT_EQ(BatchSampler::Check(stream, 0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(BatchSampler::Check(CountingStream(0), 1).code(), absl::StatusCode::kInvalidArgument);
}

TEST(BatchSamplerTest, TargetsAreInputsShiftedByOne) {
  const MemoryStream stream = CountingStream(1000);
  const BatchSampler sampler(stream, 8, 42);
  const Batch b = Train(sampler, 3, 0, 4);
  for (int j = 0; j < 4; ++j) {
    const int64_t offset = sampler.TrainOffset(3, j);
    for (int t = 0; t < 8; ++t) {
      EXPECT_EQ(b.inputs[j * 8 + t], offset + t);
      EXPECT_EQ(b.targets[j * 8 + t], offset + t + 1);
    }
  }
}

TEST(BatchSamplerTest, SampleDependsOnlyOnSeedStepAndIndexNotOnTheSplit) {
  const MemoryStream stream = CountingStream(5000);
  const BatchSampler whole_sampler(stream, 16, 7);
  const BatchSampler other_instance(stream, 16, 7);
  const Batch whole = Train(whole_sampler, 11, 0, 8);
  // The same global batch split 3 + 5 (two micro-batches or two ranks), on another instance.
  const Batch first = Train(other_instance, 11, 0, 3);
  const Batch rest = Train(other_instance, 11, 3, 5);
  std::vector<int32_t> joined = first.inputs;
  joined.insert(joined.end(), rest.inputs.begin(), rest.inputs.end());
  EXPECT_EQ(joined, whole.inputs);
  std::vector<int32_t> joined_targets = first.targets;
  joined_targets.insert(joined_targets.end(), rest.targets.begin(), rest.targets.end());
  EXPECT_EQ(joined_targets, whole.targets);
  // Reading other steps in between changes nothing.
  Train(other_instance, 12, 0, 8);
  EXPECT_EQ(Train(other_instance, 11, 0, 8).inputs, whole.inputs);
}

TEST(BatchSamplerTest, DifferentStepsSeedsAndSamplesGiveDifferentWindows) {
  const MemoryStream stream = CountingStream(1'000'000);
  const BatchSampler a(stream, 32, 1);
  const BatchSampler b(stream, 32, 2);
  EXPECT_NE(Train(a, 0, 0, 8).inputs, Train(a, 1, 0, 8).inputs);
  EXPECT_NE(Train(a, 0, 0, 8).inputs, Train(b, 0, 0, 8).inputs);
  std::set<int64_t> offsets;
  for (int i = 0; i < 64; ++i) offsets.insert(a.TrainOffset(0, i));
  EXPECT_GT(offsets.size(), 60u);
}

TEST(BatchSamplerTest, OffsetsCoverEveryValidStartAndNoOther) {
  // 20 tokens, seq_len 4: starts 0..15 are valid (start 15 reads targets up to token 19).
  const MemoryStream stream = CountingStream(20);
  const BatchSampler sampler(stream, 4, 3);
  std::vector<int> hits(16, 0);
  for (int64_t step = 0; step < 500; ++step) {
    for (int i = 0; i < 8; ++i) {
      const int64_t offset = sampler.TrainOffset(step, i);
      ASSERT_GE(offset, 0);
      ASSERT_LT(offset, 16);
      ++hits[offset];
    }
  }
  // 4000 draws over 16 starts: 250 expected each.
  for (int start = 0; start < 16; ++start) {
    EXPECT_GT(hits[start], 150) << "start " << start;
    EXPECT_LT(hits[start], 350) << "start " << start;
  }
}

TEST(BatchSamplerTest, EvalWindowsTileTheStreamAndWrapAround) {
  // 23 tokens, seq_len 5: (23 - 1) / 5 = 4 windows at 0, 5, 10, 15.
  const MemoryStream stream = CountingStream(23);
  const BatchSampler sampler(stream, 5, 9);
  ASSERT_EQ(sampler.eval_windows(), 4);
  std::vector<int32_t> inputs(3 * 5), targets(3 * 5);
  sampler.FillEval(1, 3, inputs.data(), targets.data());  // windows 3, 4, 5 -> tiles 3, 0, 1
  const int64_t expected_starts[] = {15, 0, 5};
  for (int j = 0; j < 3; ++j) {
    for (int t = 0; t < 5; ++t) {
      EXPECT_EQ(inputs[j * 5 + t], expected_starts[j] + t);
      EXPECT_EQ(targets[j * 5 + t], expected_starts[j] + t + 1);
    }
  }
  // The eval order does not depend on the seed.
  const BatchSampler other_seed(stream, 5, 10);
  for (int64_t w = 0; w < 8; ++w) EXPECT_EQ(sampler.EvalOffset(w), other_seed.EvalOffset(w));
}

TEST(BatchSamplerTest, ShortestValidStreamHasOneWindow) {
  const MemoryStream stream = CountingStream(9);
  const BatchSampler sampler(stream, 8, 0);
  EXPECT_EQ(sampler.eval_windows(), 1);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(sampler.TrainOffset(i, i), 0);
  const Batch b = Train(sampler, 0, 0, 1);
  EXPECT_EQ(b.targets.back(), 8);
}

}  // namespace
}  // namespace trainyard::worker
