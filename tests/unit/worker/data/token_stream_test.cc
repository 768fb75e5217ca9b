#include "worker/data/token_stream.h"

#include <memory>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainyard::worker {
namespace {

using ::testing::ElementsAre;

TEST(TokenStreamTest, MemoryStreamReadsRanges) {
  const MemoryStream stream({4, 8, 15, 16, 23, 42}, 43);
  EXPECT_EQ(stream.size(), 6);
  EXPECT_EQ(stream.vocab_bound(), 43);
  std::vector<int32_t> out(3);
  stream.Read(2, 3, out.data());
  EXPECT_THAT(out, ElementsAre(15, 16, 23));
}

TEST(TokenStreamTest, SliceStreamRenumbersFromZeroAndKeepsTheBaseVocab) {
  auto base = std::make_shared<MemoryStream>(std::vector<uint16_t>{0, 1, 2, 3, 4, 5, 6, 7}, 100);
  const SliceStream slice(base, 5, 3);
  EXPECT_EQ(slice.size(), 3);
  EXPECT_EQ(slice.vocab_bound(), 100);
  std::vector<int32_t> out(3);
  slice.Read(0, 3, out.data());
  EXPECT_THAT(out, ElementsAre(5, 6, 7));
  const SliceStream empty(base, 8, 0);
  EXPECT_EQ(empty.size(), 0);
}

TEST(TokenStreamDeathTest, ReadsOutsideTheStreamAbort) {
  const MemoryStream stream({1, 2, 3}, 4);
  std::vector<int32_t> out(4);
  EXPECT_DEATH(stream.Read(1, 3, out.data()), "out of range");
  EXPECT_DEATH(stream.Read(-1, 1, out.data()), "out of range");
  auto base = std::make_shared<MemoryStream>(std::vector<uint16_t>{1, 2, 3}, 4);
  const SliceStream slice(base, 1, 2);
  EXPECT_DEATH(slice.Read(1, 2, out.data()), "out of range");
  EXPECT_DEATH(SliceStream(base, 2, 2), "out of range");
}

TEST(TokenStreamDeathTest, MemoryStreamRejectsTokensOutsideTheVocabulary) {
  EXPECT_DEATH(MemoryStream({1, 9}, 8), "outside vocabulary");
}

}  // namespace
}  // namespace trainyard::worker
