#include "server/kv_space.h"

#include <optional>

#include "gtest/gtest.h"

namespace trainyard::server {
namespace {

using Answer = absl::StatusOr<std::optional<std::string>>;

TEST(KvSpaceTest, GetWaitsForSet) {
  FakeClock clock;
  KvSpace kv(&clock);
  const std::string prefix = KvSpace::PrefixFor("j-000001", 1);
  EXPECT_EQ(prefix, "jobs/j-000001/attempts/1/");
  kv.Open(prefix);
  std::optional<Answer> answer;
  kv.Get(prefix + "gloo/0", clock.Now() + absl::Seconds(5), [&](Answer a) { answer = a; });
  EXPECT_FALSE(answer.has_value());
  ASSERT_TRUE(kv.Set(prefix + "gloo/1", "other").ok());
  EXPECT_FALSE(answer.has_value());
  ASSERT_TRUE(kv.Set(prefix + "gloo/0", "addr").ok());
  ASSERT_TRUE(answer.has_value());
  ASSERT_TRUE(answer->ok());
  EXPECT_EQ(**answer, std::optional<std::string>("addr"));

  std::optional<Answer> immediate;
  kv.Get(prefix + "gloo/1", clock.Now(), [&](Answer a) { immediate = a; });
  ASSERT_TRUE(immediate.has_value() && immediate->ok());
  EXPECT_EQ(**immediate, std::optional<std::string>("other"));
}

TEST(KvSpaceTest, WaitRunsOutWithNotFound) {
  FakeClock clock;
  KvSpace kv(&clock);
  const std::string prefix = KvSpace::PrefixFor("j-1", 2);
  kv.Open(prefix);
  std::optional<Answer> answer;
  kv.Get(prefix + "k", clock.Now() + absl::Seconds(5), [&](Answer a) { answer = a; });
  clock.Advance(absl::Seconds(4));
  kv.ExpireWaiters(clock.Now());
  EXPECT_FALSE(answer.has_value());
  clock.Advance(absl::Seconds(1));
  kv.ExpireWaiters(clock.Now());
  ASSERT_TRUE(answer.has_value() && answer->ok());
  EXPECT_FALSE((*answer)->has_value());
}

TEST(KvSpaceTest, ClosingTheSpaceFailsWaitersAndLaterCalls) {
  FakeClock clock;
  KvSpace kv(&clock);
  const std::string prefix = KvSpace::PrefixFor("j-1", 1);
  kv.Open(prefix);
  std::optional<Answer> answer;
  kv.Get(prefix + "k", absl::InfiniteFuture(), [&](Answer a) { answer = a; });
  kv.Close(prefix);
  ASSERT_TRUE(answer.has_value());
  EXPECT_EQ(answer->status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(kv.Set(prefix + "k", "v").code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(kv.open_spaces(), 0u);
}

TEST(KvSpaceTest, RejectsMalformedAndOversizedInput) {
  FakeClock clock;
  KvSpace kv(&clock);
  const std::string prefix = KvSpace::PrefixFor("j-1", 1);
  kv.Open(prefix);
  EXPECT_EQ(kv.Set("free/form/key", "v").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(kv.Set(prefix, "v").code(), absl::StatusCode::kInvalidArgument);  // empty key part
  EXPECT_EQ(kv.Set(prefix + std::string(600, 'k'), "v").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(kv.Set(prefix + "big", std::string(KvSpace::kMaxValueBytes + 1, 'x')).code(),
            absl::StatusCode::kInvalidArgument);
  for (size_t i = 0; i < KvSpace::kMaxKeysPerSpace; ++i) {
    ASSERT_TRUE(kv.Set(prefix + std::to_string(i), "v").ok());
  }
  EXPECT_EQ(kv.Set(prefix + "one-more", "v").code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(kv.Set(prefix + "0", "overwrite").ok());  // replacing an existing key is fine
  std::optional<Answer> bad;
  kv.Get("nope", absl::InfiniteFuture(), [&](Answer a) { bad = a; });
  ASSERT_TRUE(bad.has_value());
  EXPECT_EQ(bad->status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace trainyard::server
