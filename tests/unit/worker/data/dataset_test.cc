#include "worker/data/dataset.h"

#include <string>
#include <vector>

#include "common/filesystem.h"
#include "config/spec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/worker/data/data_test_util.h"
#include "worker/data/markov.h"
#include "worker/data/sampler.h"

namespace trainyard::worker {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using testing_util::ShardBytes;

std::vector<int32_t> ReadAll(const TokenStream& stream) {
  std::vector<int32_t> out(stream.size());
  stream.Read(0, stream.size(), out.data());
  return out;
}

std::vector<uint16_t> Iota(int n, int modulo) {
  std::vector<uint16_t> tokens(n);
  for (int i = 0; i < n; ++i) tokens[i] = static_cast<uint16_t>(i % modulo);
  return tokens;
}

config::DataSpec BinSpec(const std::string& path) {
  config::DataSpec spec;
  spec.source = "bin";
  spec.path = path;
  return spec;
}

TEST(OpenDataTest, MarkovSplitsHaveTheRequestedSizesAndKnownEntropy) {
  config::DataSpec spec;
  spec.markov.vocab = 16;
  spec.markov.train_tokens = 5000;
  spec.markov.val_tokens = 700;
  FakeFileSystem fs;
  absl::StatusOr<DataSplits> splits = OpenData(spec, fs);
  ASSERT_TRUE(splits.ok()) << splits.status();
  EXPECT_EQ(splits->train->size(), 5000);
  EXPECT_EQ(splits->val->size(), 700);
  EXPECT_EQ(splits->vocab_bound, 16);
  EXPECT_EQ(splits->train->vocab_bound(), 16);
  ASSERT_TRUE(splits->entropy_nats.has_value());
  EXPECT_EQ(*splits->entropy_nats, MarkovChain::Random(spec.markov)->EntropyRateNats());
  EXPECT_THAT(splits->description, HasSubstr("markov"));
  // Train and validation come from different seeds.
  std::vector<int32_t> train_head = ReadAll(*splits->train);
  train_head.resize(700);
  EXPECT_NE(train_head, ReadAll(*splits->val));
}

TEST(OpenDataTest, MarkovErrorsNameTheField) {
  FakeFileSystem fs;
  config::DataSpec spec;
  spec.markov.train_tokens = 0;
  EXPECT_THAT(OpenData(spec, fs).status().message(), HasSubstr("data.markov.train_tokens"));
  spec = config::DataSpec{};
  spec.markov.val_tokens = -1;
  EXPECT_THAT(OpenData(spec, fs).status().message(), HasSubstr("data.markov.val_tokens"));
  spec.markov.val_tokens = 0;  // allowed: a job that never evaluates
  spec.markov.train_tokens = 100;
  absl::StatusOr<DataSplits> no_val = OpenData(spec, fs);
  ASSERT_TRUE(no_val.ok()) << no_val.status();
  EXPECT_EQ(no_val->val->size(), 0);
  spec = config::DataSpec{};
  spec.markov.order = 5;  // 32^5 contexts
  const absl::Status status = OpenData(spec, fs).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("data.markov.order"));
}

TEST(OpenDataTest, BinHoldsOutTheLastValFractionOfTokens) {
  FakeFileSystem fs;
  const std::vector<uint16_t> tokens = Iota(1005, 300);
  ASSERT_TRUE(fs.WriteFileAtomic("train.bin", ShardBytes(tokens)).ok());
  config::DataSpec spec = BinSpec("train.bin");
  spec.val_fraction = 0.05;  // floor(1005 * 0.05) = 50
  absl::StatusOr<DataSplits> splits = OpenData(spec, fs);
  ASSERT_TRUE(splits.ok()) << splits.status();
  EXPECT_EQ(splits->train->size(), 955);
  EXPECT_EQ(splits->val->size(), 50);
  EXPECT_EQ(splits->vocab_bound, 300);
  EXPECT_FALSE(splits->entropy_nats.has_value());
  EXPECT_THAT(ReadAll(*splits->train), ElementsAreArray(tokens.begin(), tokens.begin() + 955));
  EXPECT_THAT(ReadAll(*splits->val), ElementsAreArray(tokens.begin() + 955, tokens.end()));
}

TEST(OpenDataTest, BinUsesASeparateValidationFile) {
  FakeFileSystem fs;
  ASSERT_TRUE(fs.WriteFileAtomic("train.bin", ShardBytes(Iota(100, 50))).ok());
  ASSERT_TRUE(fs.WriteFileAtomic("val.bin", ShardBytes({70, 1, 2})).ok());
  config::DataSpec spec = BinSpec("train.bin");
  spec.val_path = "val.bin";
  absl::StatusOr<DataSplits> splits = OpenData(spec, fs);
  ASSERT_TRUE(splits.ok()) << splits.status();
  EXPECT_EQ(splits->train->size(), 100);
  EXPECT_EQ(splits->val->size(), 3);
  EXPECT_EQ(splits->vocab_bound, 71);  // the larger of the two streams' bounds
}

TEST(OpenDataTest, MissingFilesAreNotFoundAndNameTheField) {
  FakeFileSystem fs;
  absl::Status status = OpenData(BinSpec("absent.bin"), fs).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(status.message(), AllOf(HasSubstr("data.path"), HasSubstr("absent.bin")));

  ASSERT_TRUE(fs.WriteFileAtomic("train.bin", ShardBytes(Iota(100, 50))).ok());
  config::DataSpec spec = BinSpec("train.bin");
  spec.val_path = "absent_val.bin";
  status = OpenData(spec, fs).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(status.message(), AllOf(HasSubstr("data.val_path"), HasSubstr("absent_val.bin")));
}

TEST(OpenDataTest, ValFractionMustBeAProperFraction) {
  FakeFileSystem fs;
  ASSERT_TRUE(fs.WriteFileAtomic("train.bin", ShardBytes(Iota(100, 50))).ok());
  for (double bad : {0.0, 1.0, -0.1, 1.5}) {
    config::DataSpec spec = BinSpec("train.bin");
    spec.val_fraction = bad;
    const absl::Status status = OpenData(spec, fs).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(status.message(), HasSubstr("data.val_fraction")) << bad;
  }
}

TEST(OpenDataTest, TextSourceSplitsBytes) {
  FakeFileSystem fs;
  ASSERT_TRUE(fs.WriteFileAtomic("corpus.txt", "abcdefghij").ok());
  config::DataSpec spec;
  spec.source = "text";
  spec.path = "corpus.txt";
  spec.val_fraction = 0.2;
  absl::StatusOr<DataSplits> splits = OpenData(spec, fs);
  ASSERT_TRUE(splits.ok()) << splits.status();
  EXPECT_EQ(splits->vocab_bound, 256);
  const std::string train = "abcdefgh", val = "ij";
  EXPECT_THAT(ReadAll(*splits->train), ElementsAreArray(train.begin(), train.end()));
  EXPECT_THAT(ReadAll(*splits->val), ElementsAreArray(val.begin(), val.end()));
  EXPECT_THAT(splits->description, HasSubstr("text"));
}

TEST(OpenDataTest, TooSmallHeldOutPartIsCaughtByTheSampler) {
  FakeFileSystem fs;
  ASSERT_TRUE(fs.WriteFileAtomic("corpus.txt", "abcdefghij").ok());
  config::DataSpec spec;
  spec.source = "text";
  spec.path = "corpus.txt";
  spec.val_fraction = 0.05;  // floor(0.5) = 0 tokens held out
  absl::StatusOr<DataSplits> splits = OpenData(spec, fs);
  ASSERT_TRUE(splits.ok()) << splits.status();
  EXPECT_EQ(splits->val->size(), 0);
  EXPECT_TRUE(BatchSampler::Check(*splits->train, 4).ok());
  EXPECT_EQ(BatchSampler::Check(*splits->val, 4).code(), absl::StatusCode::kInvalidArgument);
}

TEST(OpenDataTest, RejectsUnknownSourceAndMissingPath) {
  FakeFileSystem fs;
  config::DataSpec spec;
  spec.source = "csv";
  absl::Status status = OpenData(spec, fs).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("data.source: unknown source 'csv'"));
  status = OpenData(BinSpec(""), fs).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("data.path"));
}

}  // namespace
}  // namespace trainyard::worker
