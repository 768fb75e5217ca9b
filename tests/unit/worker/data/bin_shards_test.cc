#include "worker/data/bin_shards.h"

#include <sys/stat.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/filesystem.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/worker/data/data_test_util.h"

namespace trainyard::worker {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using testing_util::ScratchDir;
using testing_util::ShardBytes;
using testing_util::ShardOptions;
using testing_util::WriteBytes;

ShardOptions WithMagic(int32_t magic) {
  ShardOptions options;
  options.magic = magic;
  return options;
}

ShardOptions WithVersion(int32_t version) {
  ShardOptions options;
  options.version = version;
  return options;
}

ShardOptions WithCount(int32_t header_count) {
  ShardOptions options;
  options.header_count = header_count;
  return options;
}

ShardOptions WithTrailing(std::string bytes) {
  ShardOptions options;
  options.trailing = std::move(bytes);
  return options;
}

std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<int32_t> ReadAll(const TokenStream& stream) {
  std::vector<int32_t> out(stream.size());
  stream.Read(0, stream.size(), out.data());
  return out;
}

class BinShardsTest : public ::testing::Test {
 protected:
  // Opens a single shard written with `options` and returns the status.
  absl::Status OpenMalformed(const std::vector<uint16_t>& tokens, const ShardOptions& options) {
    const std::string path = dir_.File("bad.bin");
    WriteBytes(path, ShardBytes(tokens, options));
    return BinShardStream::Open(path, *RealFileSystem()).status();
  }

  ScratchDir dir_;
};

TEST_F(BinShardsTest, RoundTripsTokens) {
  const std::vector<uint16_t> tokens = {0, 1, 65535, 300, 7, 50256, 42};
  const std::string path = dir_.File("train.bin");
  WriteBytes(path, ShardBytes(tokens));
  auto stream = BinShardStream::Open(path, *RealFileSystem());
  ASSERT_TRUE(stream.ok()) << stream.status();
  EXPECT_EQ((*stream)->size(), 7);
  EXPECT_EQ((*stream)->vocab_bound(), 65536);
  EXPECT_THAT(ReadAll(**stream), ElementsAre(0, 1, 65535, 300, 7, 50256, 42));
  std::vector<int32_t> middle(3);
  (*stream)->Read(2, 3, middle.data());
  EXPECT_THAT(middle, ElementsAre(65535, 300, 7));
  EXPECT_THAT((*stream)->paths(), ElementsAre(path));
}

TEST_F(BinShardsTest, VocabBoundIsMaxTokenPlusOne) {
  const std::string path = dir_.File("small.bin");
  WriteBytes(path, ShardBytes({3, 9, 0, 4}));
  auto stream = BinShardStream::Open(path, *RealFileSystem());
  ASSERT_TRUE(stream.ok()) << stream.status();
  EXPECT_EQ((*stream)->vocab_bound(), 10);
}

TEST_F(BinShardsTest, ReadsThroughAFakeFileSystem) {
  FakeFileSystem fs;
  ASSERT_TRUE(fs.WriteFileAtomic("shard.bin", ShardBytes({5, 6, 7})).ok());
  auto stream = BinShardStream::Open("shard.bin", fs);
  ASSERT_TRUE(stream.ok()) << stream.status();
  EXPECT_THAT(ReadAll(**stream), ElementsAre(5, 6, 7));
}

TEST_F(BinShardsTest, RejectsWrongMagic) {
  const absl::Status status = OpenMalformed({1, 2}, WithMagic(12345));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), AllOf(HasSubstr(dir_.File("bad.bin")),
                                      HasSubstr("bad magic 12345, expected 20240520")));
}

TEST_F(BinShardsTest, RejectsUnsupportedVersion) {
  const absl::Status status = OpenMalformed({1, 2}, WithVersion(2));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr(dir_.File("bad.bin")), HasSubstr("unsupported version 2")));
}

TEST_F(BinShardsTest, RejectsTruncatedBody) {
  const absl::Status status = OpenMalformed({1, 2, 3, 4, 5, 6, 7}, WithCount(10));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), AllOf(HasSubstr(dir_.File("bad.bin")),
                                      HasSubstr("truncated: header says 10 tokens, body holds 7")));
}

TEST_F(BinShardsTest, RejectsHalfAToken) {
  const absl::Status status = OpenMalformed({1, 2, 3}, WithTrailing(std::string(1, '\x01')));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(),
              HasSubstr("truncated: header says 3 tokens, body holds 3 and a stray byte"));
}

TEST_F(BinShardsTest, RejectsBodyLongerThanHeaderSays) {
  const absl::Status status = OpenMalformed({1, 2, 3, 4, 5, 6, 7}, WithCount(5));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("header says 5 tokens, body holds 7"));
}

TEST_F(BinShardsTest, RejectsHeaderOnlyShard) {
  const absl::Status status = OpenMalformed({}, {});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr(dir_.File("bad.bin")), HasSubstr("holds zero tokens")));
}

TEST_F(BinShardsTest, RejectsHeaderOnlyShardThatPromisesTokens) {
  const absl::Status status = OpenMalformed({}, WithCount(5));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("truncated: header says 5 tokens, body holds 0"));
}

TEST_F(BinShardsTest, RejectsFileShorterThanHeader) {
  const std::string path = dir_.File("short.bin");
  WriteBytes(path, ShardBytes({}).substr(0, 100));
  const absl::Status status = BinShardStream::Open(path, *RealFileSystem()).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), AllOf(HasSubstr(path), HasSubstr("100 bytes, shorter than the "
                                                                 "1024-byte header")));
}

TEST_F(BinShardsTest, MissingFileIsNotFound) {
  const std::string path = dir_.File("absent.bin");
  const absl::Status status = BinShardStream::Open(path, *RealFileSystem()).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(status.message(), HasSubstr(path));
}

TEST_F(BinShardsTest, GlobWithoutMatchesIsNotFound) {
  const std::string pattern = dir_.File("train_*.bin");
  const absl::Status status = BinShardStream::Open(pattern, *RealFileSystem()).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(status.message(), HasSubstr(pattern));
}

TEST_F(BinShardsTest, GlobConcatenatesShardsInNameOrder) {
  // Written out of order; a non-matching file and a matching directory are ignored.
  WriteBytes(dir_.File("train_002.bin"), ShardBytes({20, 21}));
  WriteBytes(dir_.File("train_000.bin"), ShardBytes({0, 1, 2}));
  WriteBytes(dir_.File("train_001.bin"), ShardBytes({10}));
  WriteBytes(dir_.File("val_000.bin"), ShardBytes({999}));
  ASSERT_EQ(::mkdir(dir_.File("train_999.bin").c_str(), 0755), 0);

  auto stream = BinShardStream::Open(dir_.File("train_*.bin"), *RealFileSystem());
  ASSERT_TRUE(stream.ok()) << stream.status();
  EXPECT_THAT((*stream)->paths(),
              ElementsAre(dir_.File("train_000.bin"), dir_.File("train_001.bin"),
                          dir_.File("train_002.bin")));
  EXPECT_EQ((*stream)->size(), 6);
  EXPECT_EQ((*stream)->vocab_bound(), 22);
  EXPECT_THAT(ReadAll(**stream), ElementsAre(0, 1, 2, 10, 20, 21));
  // A read spanning all three shards, starting inside the first.
  std::vector<int32_t> span(4);
  (*stream)->Read(2, 4, span.data());
  EXPECT_THAT(span, ElementsAre(2, 10, 20, 21));
}

TEST_F(BinShardsTest, GlobNamesTheMalformedShard) {
  WriteBytes(dir_.File("train_000.bin"), ShardBytes({1, 2}));
  WriteBytes(dir_.File("train_001.bin"), ShardBytes({1, 2}, WithMagic(7)));
  const absl::Status status =
      BinShardStream::Open(dir_.File("train_*.bin"), *RealFileSystem()).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr(dir_.File("train_001.bin")), HasSubstr("bad magic 7")));
}

// A shard in Llama 3's format, built by hand: magic 20240801, version `version`, uint32 tokens.
std::string WideShardBytes(const std::vector<uint32_t>& tokens, int32_t version = 7) {
  std::string out;
  auto put = [&](uint32_t v) {
    for (int i = 0; i < 4; ++i) out += static_cast<char>(v >> (8 * i));
  };
  put(20240801);
  put(static_cast<uint32_t>(version));
  put(static_cast<uint32_t>(tokens.size()));
  out.resize(1024, '\0');
  for (uint32_t token : tokens) put(token);
  return out;
}

TEST_F(BinShardsTest, ReadsLlama3sFormatBesideGpt2s) {
  WriteBytes(dir_.File("mix_0.bin"), ShardBytes({7, 65535}));
  WriteBytes(dir_.File("mix_1.bin"), WideShardBytes({128000, 3, 70000}));
  auto stream = BinShardStream::Open(dir_.File("mix_*.bin"), *RealFileSystem());
  ASSERT_TRUE(stream.ok()) << stream.status();
  EXPECT_THAT(ReadAll(**stream), ElementsAre(7, 65535, 128000, 3, 70000));
  EXPECT_EQ((*stream)->vocab_bound(), 128001);
  WriteBytes(dir_.File("v1.bin"), WideShardBytes({1, 2}, 1));
  const absl::Status status = BinShardStream::Open(dir_.File("v1.bin"), *RealFileSystem()).status();
  EXPECT_THAT(status.message(), HasSubstr("unsupported version 1, expected 7 with magic 20240801"));
  WriteBytes(dir_.File("half.bin"), WideShardBytes({1, 2}) + "xy");
  EXPECT_THAT(BinShardStream::Open(dir_.File("half.bin"), *RealFileSystem()).status().message(),
              HasSubstr("body holds 2 and 2 stray bytes"));
}

// The writer cuts shards of the size asked, in GPT-2's format while every id fits in 16 bits and
// Llama 3's beyond; what it writes reads back, in order, byte for byte as built by hand above.
TEST_F(BinShardsTest, WriterCutsShardsInTheFormatTheIdsNeed) {
  std::vector<int32_t> ids(10);
  for (int i = 0; i < 10; ++i) ids[i] = 1000 * i;
  BinShardWriter narrow(*RealFileSystem(), dir_.File("n"), 4, 65535);
  ASSERT_TRUE(narrow.Append(std::span<const int32_t>(ids).first(3)).ok());
  ASSERT_TRUE(narrow.Append(std::span<const int32_t>(ids).subspan(3)).ok());
  ASSERT_TRUE(narrow.Finish().ok());
  EXPECT_THAT(narrow.paths(), ElementsAre(dir_.File("n_000000.bin"), dir_.File("n_000001.bin"),
                                          dir_.File("n_000002.bin")));
  EXPECT_EQ(narrow.tokens(), 10);
  EXPECT_EQ(ReadBytes(dir_.File("n_000002.bin")), ShardBytes({8000, 9000}));
  auto stream = BinShardStream::Open(dir_.File("n_*.bin"), *RealFileSystem());
  ASSERT_TRUE(stream.ok()) << stream.status();
  EXPECT_THAT(ReadAll(**stream), ElementsAreArray(ids));

  BinShardWriter wide(*RealFileSystem(), dir_.File("w"), 100, 65536);
  ids.push_back(65536);
  ASSERT_TRUE(wide.Append(ids).ok());
  ASSERT_TRUE(wide.Finish().ok());
  ASSERT_THAT(wide.paths(), ElementsAre(dir_.File("w_000000.bin")));
  EXPECT_EQ(ReadBytes(dir_.File("w_000000.bin")),
            WideShardBytes({0, 1000, 2000, 3000, 4000, 5000, 6000, 7000, 8000, 9000, 65536}));
  BinShardWriter empty(*RealFileSystem(), dir_.File("e"), 4, 10);
  ASSERT_TRUE(empty.Finish().ok());
  EXPECT_TRUE(empty.paths().empty());
  // Past the last number the names hold (a million; two here), nothing more is written.
  BinShardWriter capped(*RealFileSystem(), dir_.File("c"), 4, 10, /*max_shards=*/2);
  ASSERT_TRUE(capped.Append(std::vector<int32_t>(9, 1)).ok());  // two shards and one pending
  const absl::Status over = capped.Finish();
  EXPECT_THAT(over.message(),
              HasSubstr("more than 2 shards of 4 tokens: give a larger shard size"));
  EXPECT_EQ(capped.paths().size(), 2u);
}

// tools/write_bin_shard.py writes shards this reader accepts.
class WriteBinShardToolTest : public BinShardsTest {
 protected:
  void SetUp() override {
    const char* source_dir = std::getenv("TRAINYARD_SOURCE_DIR");
    if (source_dir == nullptr) GTEST_SKIP() << "TRAINYARD_SOURCE_DIR is not set (run via ctest)";
    if (std::system("python3 --version > /dev/null 2>&1") != 0) GTEST_SKIP() << "no python3";
    tool_ = absl::StrCat(source_dir, "/tools/write_bin_shard.py");
  }

  int RunTool(const std::string& args) {
    return std::system(absl::StrCat("python3 '", tool_, "' ", args, " > /dev/null").c_str());
  }

  std::string tool_;
};

TEST_F(WriteBinShardToolTest, WritesTextBytesInShards) {
  const std::string text = "hello, shards\n";
  WriteBytes(dir_.File("input.txt"), text);
  ASSERT_EQ(RunTool(absl::StrCat("'", dir_.File("out.bin"), "' --text '", dir_.File("input.txt"),
                                 "' --shard-tokens 5")),
            0);
  auto stream = BinShardStream::Open(dir_.File("out_*.bin"), *RealFileSystem());
  ASSERT_TRUE(stream.ok()) << stream.status();
  EXPECT_EQ((*stream)->paths().size(), 3u);
  EXPECT_THAT(ReadAll(**stream), ElementsAreArray(text.begin(), text.end()));
}

TEST_F(WriteBinShardToolTest, WritesRandomTokensBelowVocab) {
  ASSERT_EQ(
      RunTool(absl::StrCat("'", dir_.File("rand.bin"), "' --random 5000 --vocab 300 --seed 3")), 0);
  auto stream = BinShardStream::Open(dir_.File("rand.bin"), *RealFileSystem());
  ASSERT_TRUE(stream.ok()) << stream.status();
  EXPECT_EQ((*stream)->size(), 5000);
  // 5000 uniform draws from 300 symbols hit the top symbol with overwhelming probability.
  EXPECT_EQ((*stream)->vocab_bound(), 300);
}

}  // namespace
}  // namespace trainyard::worker
