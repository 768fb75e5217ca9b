#include "worker/data/text_bytes.h"

#include <string>
#include <vector>

#include "common/filesystem.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/worker/data/data_test_util.h"

namespace trainyard::worker {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing_util::ScratchDir;
using testing_util::WriteBytes;

TEST(TextBytesTest, TokensAreTheFileBytes) {
  ScratchDir dir;
  // Includes bytes above 127, which must come back as 128..255, not as negative chars.
  const std::string text = std::string("ab\n") + '\xC3' + '\xA9' + '\xFF';
  WriteBytes(dir.File("corpus.txt"), text);
  auto stream = TextByteStream::Open(dir.File("corpus.txt"), *RealFileSystem());
  ASSERT_TRUE(stream.ok()) << stream.status();
  EXPECT_EQ((*stream)->size(), 6);
  EXPECT_EQ((*stream)->vocab_bound(), 256);
  std::vector<int32_t> tokens(6);
  (*stream)->Read(0, 6, tokens.data());
  EXPECT_THAT(tokens, ElementsAre('a', 'b', '\n', 0xC3, 0xA9, 0xFF));
  std::vector<int32_t> tail(2);
  (*stream)->Read(4, 2, tail.data());
  EXPECT_THAT(tail, ElementsAre(0xA9, 0xFF));
}

TEST(TextBytesTest, EmptyFileIsInvalid) {
  FakeFileSystem fs;
  ASSERT_TRUE(fs.WriteFileAtomic("empty.txt", "").ok());
  const absl::Status status = TextByteStream::Open("empty.txt", fs).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("empty.txt: text file is empty"));
}

TEST(TextBytesTest, MissingFileIsNotFound) {
  FakeFileSystem fs;
  const absl::Status status = TextByteStream::Open("nowhere.txt", fs).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(status.message(), HasSubstr("nowhere.txt"));
}

}  // namespace
}  // namespace trainyard::worker
