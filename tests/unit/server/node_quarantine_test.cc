// NodeQuarantine driven with explicit times: counting within the window, cordons, their expiry
// and lifting.
#include "server/node_quarantine.h"

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainyard::server {
namespace {

using ::testing::ElementsAre;
using ::testing::Field;

const absl::Time kStart = absl::FromUnixSeconds(1700000000);

absl::Time At(absl::Duration offset) { return kStart + offset; }

// The defaults: 3 failures within 10 minutes cordon a node for 30 minutes.
class QuarantinePolicyTest : public ::testing::Test {
 protected:
  NodeQuarantine quarantine_;
};

TEST_F(QuarantinePolicyTest, CordonsAtTheNthFailureWithinTheWindow) {
  EXPECT_FALSE(quarantine_.RecordFailure("n1", At(absl::Minutes(0)), "crash of job a"));
  EXPECT_FALSE(quarantine_.RecordFailure("n1", At(absl::Minutes(4)), "hang of job b"));
  EXPECT_FALSE(quarantine_.IsCordoned("n1", At(absl::Minutes(4))));
  EXPECT_EQ(quarantine_.RecentFailures("n1", At(absl::Minutes(4))), 2);

  EXPECT_TRUE(quarantine_.RecordFailure("n1", At(absl::Minutes(9)), "exit code 3 of job c"));
  EXPECT_TRUE(quarantine_.IsCordoned("n1", At(absl::Minutes(9))));
  const std::optional<Cordon> cordon = quarantine_.Find("n1", At(absl::Minutes(9)));
  ASSERT_TRUE(cordon.has_value());
  EXPECT_EQ(cordon->node_id, "n1");
  EXPECT_EQ(cordon->reason, "3 failures in 10m: exit code 3 of job c");
  EXPECT_EQ(cordon->since, At(absl::Minutes(9)));
  EXPECT_EQ(cordon->until, At(absl::Minutes(39)));
}

TEST_F(QuarantinePolicyTest, CountsEachNodeSeparately) {
  EXPECT_FALSE(quarantine_.RecordFailure("n1", At(absl::Minutes(0)), "a"));
  EXPECT_FALSE(quarantine_.RecordFailure("n2", At(absl::Minutes(1)), "b"));
  EXPECT_FALSE(quarantine_.RecordFailure("n1", At(absl::Minutes(2)), "c"));
  EXPECT_FALSE(quarantine_.RecordFailure("n2", At(absl::Minutes(3)), "d"));
  EXPECT_TRUE(quarantine_.RecordFailure("n2", At(absl::Minutes(4)), "e"));
  EXPECT_FALSE(quarantine_.IsCordoned("n1", At(absl::Minutes(4))));
  EXPECT_TRUE(quarantine_.IsCordoned("n2", At(absl::Minutes(4))));
  EXPECT_FALSE(quarantine_.IsCordoned("unknown", At(absl::Minutes(4))));
}

TEST_F(QuarantinePolicyTest, ForgetsFailuresOlderThanTheWindow) {
  EXPECT_FALSE(quarantine_.RecordFailure("n1", At(absl::Minutes(0)), "a"));
  EXPECT_FALSE(quarantine_.RecordFailure("n1", At(absl::Minutes(5)), "b"));
  // The first failure is now 10m 1s old: only two count.
  const absl::Time later = At(absl::Minutes(10) + absl::Seconds(1));
  EXPECT_EQ(quarantine_.RecentFailures("n1", later), 1);
  EXPECT_FALSE(quarantine_.RecordFailure("n1", later, "c"));
  EXPECT_EQ(quarantine_.RecentFailures("n1", later), 2);
  EXPECT_FALSE(quarantine_.IsCordoned("n1", later));
  // A third within ten minutes of the second does cordon.
  EXPECT_TRUE(quarantine_.RecordFailure("n1", At(absl::Minutes(14)), "d"));
}

TEST_F(QuarantinePolicyTest, AFailureExactlyAWindowOldStillCounts) {
  EXPECT_FALSE(quarantine_.RecordFailure("n1", At(absl::Minutes(0)), "a"));
  EXPECT_FALSE(quarantine_.RecordFailure("n1", At(absl::Minutes(5)), "b"));
  EXPECT_TRUE(quarantine_.RecordFailure("n1", At(absl::Minutes(10)), "c"));
}

TEST_F(QuarantinePolicyTest, ManySparseFailuresNeverCordon) {
  for (int i = 0; i < 20; ++i) {
    EXPECT_FALSE(quarantine_.RecordFailure("n1", At(absl::Minutes(6 * i)), "sparse")) << i;
  }
  EXPECT_TRUE(quarantine_.Cordoned(At(absl::Hours(3))).empty());
}

TEST_F(QuarantinePolicyTest, ExpiresAfterTheCooldown) {
  for (int i = 0; i < 3; ++i) quarantine_.RecordFailure("n1", At(absl::Minutes(i)), "x");
  const absl::Time until = At(absl::Minutes(32));
  EXPECT_TRUE(quarantine_.IsCordoned("n1", until - absl::Seconds(1)));
  EXPECT_FALSE(quarantine_.IsCordoned("n1", until));
  EXPECT_EQ(quarantine_.Find("n1", until), std::nullopt);
  EXPECT_TRUE(quarantine_.Cordoned(until).empty());
}

TEST_F(QuarantinePolicyTest, FailuresDuringTheCordonAreIgnored) {
  for (int i = 0; i < 3; ++i) quarantine_.RecordFailure("n1", At(absl::Minutes(i)), "first");
  EXPECT_FALSE(quarantine_.RecordFailure("n1", At(absl::Minutes(20)), "late report"));
  EXPECT_FALSE(quarantine_.RecordFailure("n1", At(absl::Minutes(25)), "late report"));
  const std::optional<Cordon> cordon = quarantine_.Find("n1", At(absl::Minutes(25)));
  ASSERT_TRUE(cordon.has_value());
  EXPECT_EQ(cordon->reason, "3 failures in 10m: first");
  EXPECT_EQ(cordon->until, At(absl::Minutes(32)));
}

TEST_F(QuarantinePolicyTest, AfterExpiryTheNodeStartsWithAnEmptyHistory) {
  for (int i = 0; i < 3; ++i) quarantine_.RecordFailure("n1", At(absl::Minutes(i)), "x");
  // The cordon ended at 32m; failures at 26m and 31m fell inside the cordon and are ignored.
  quarantine_.RecordFailure("n1", At(absl::Minutes(26)), "ignored");
  quarantine_.RecordFailure("n1", At(absl::Minutes(31)), "ignored");
  EXPECT_EQ(quarantine_.RecentFailures("n1", At(absl::Minutes(33))), 0);
  EXPECT_FALSE(quarantine_.RecordFailure("n1", At(absl::Minutes(33)), "a"));
  EXPECT_FALSE(quarantine_.RecordFailure("n1", At(absl::Minutes(34)), "b"));
  EXPECT_FALSE(quarantine_.IsCordoned("n1", At(absl::Minutes(34))));
  EXPECT_TRUE(quarantine_.RecordFailure("n1", At(absl::Minutes(35)), "c"));
  EXPECT_EQ(quarantine_.Find("n1", At(absl::Minutes(35)))->since, At(absl::Minutes(35)));
}

TEST_F(QuarantinePolicyTest, UncordonLiftsAndForgets) {
  EXPECT_FALSE(quarantine_.Uncordon("n1"));
  for (int i = 0; i < 3; ++i) quarantine_.RecordFailure("n1", At(absl::Minutes(i)), "x");
  EXPECT_TRUE(quarantine_.Uncordon("n1"));
  EXPECT_FALSE(quarantine_.IsCordoned("n1", At(absl::Minutes(3))));
  EXPECT_FALSE(quarantine_.Uncordon("n1"));
  // Starting over: two more failures are not enough.
  EXPECT_FALSE(quarantine_.RecordFailure("n1", At(absl::Minutes(4)), "y"));
  EXPECT_FALSE(quarantine_.RecordFailure("n1", At(absl::Minutes(5)), "y"));
  EXPECT_TRUE(quarantine_.RecordFailure("n1", At(absl::Minutes(6)), "y"));
}

TEST_F(QuarantinePolicyTest, UncordonOfANodeNotCordonedForgetsItsFailures) {
  quarantine_.RecordFailure("n1", At(absl::Minutes(0)), "a");
  quarantine_.RecordFailure("n1", At(absl::Minutes(1)), "b");
  EXPECT_FALSE(quarantine_.Uncordon("n1"));
  EXPECT_EQ(quarantine_.RecentFailures("n1", At(absl::Minutes(2))), 0);
  EXPECT_FALSE(quarantine_.RecordFailure("n1", At(absl::Minutes(2)), "c"));
  EXPECT_FALSE(quarantine_.IsCordoned("n1", At(absl::Minutes(2))));
}

TEST_F(QuarantinePolicyTest, ListsTheCordonsInForceByNode) {
  for (const char* node : {"n3", "n1", "n2"}) {
    for (int i = 0; i < 3; ++i) quarantine_.RecordFailure(node, At(absl::Minutes(i)), node);
  }
  quarantine_.Uncordon("n2");
  EXPECT_THAT(quarantine_.Cordoned(At(absl::Minutes(5))),
              ElementsAre(Field(&Cordon::node_id, "n1"), Field(&Cordon::node_id, "n3")));
}

TEST(QuarantineOptionsPolicyTest, ZeroFailuresTurnsQuarantineOff) {
  NodeQuarantine quarantine(QuarantineOptions{.failures = 0});
  for (int i = 0; i < 50; ++i) {
    EXPECT_FALSE(quarantine.RecordFailure("n1", At(absl::Seconds(i)), "x"));
  }
  EXPECT_FALSE(quarantine.IsCordoned("n1", At(absl::Minutes(1))));
  EXPECT_EQ(quarantine.RecentFailures("n1", At(absl::Minutes(1))), 0);
  EXPECT_TRUE(Validate(quarantine.options()).ok());
}

TEST(QuarantineOptionsPolicyTest, OneFailureCordonsWithASingularReason) {
  NodeQuarantine quarantine(
      QuarantineOptions{.failures = 1, .window = absl::Minutes(1), .cooldown = absl::Hours(1)});
  EXPECT_TRUE(quarantine.RecordFailure("n1", kStart, "node lost"));
  EXPECT_EQ(quarantine.Find("n1", kStart)->reason, "1 failure in 1m: node lost");
}

TEST(QuarantineOptionsPolicyTest, AnInfiniteCooldownLastsUntilUncordoned) {
  NodeQuarantine quarantine(QuarantineOptions{.failures = 1, .cooldown = absl::InfiniteDuration()});
  EXPECT_TRUE(quarantine.RecordFailure("n1", kStart, "x"));
  EXPECT_TRUE(quarantine.IsCordoned("n1", At(absl::Hours(24 * 365))));
  EXPECT_TRUE(quarantine.Uncordon("n1"));
  EXPECT_FALSE(quarantine.IsCordoned("n1", At(absl::Hours(24 * 365))));
}

TEST(QuarantineOptionsPolicyTest, ValidationNamesTheField) {
  EXPECT_TRUE(Validate(QuarantineOptions{}).ok());
  const absl::Status negative = Validate(QuarantineOptions{.failures = -1});
  EXPECT_EQ(negative.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(negative.message(), "failures: must be at least 0, 0 to turn quarantine off (got -1)");
  EXPECT_EQ(Validate(QuarantineOptions{.window = absl::ZeroDuration()}).message(),
            "window: must be a finite duration above 0 (got 0)");
  EXPECT_EQ(Validate(QuarantineOptions{.window = absl::InfiniteDuration()}).message(),
            "window: must be a finite duration above 0 (got inf)");
  EXPECT_EQ(Validate(QuarantineOptions{.cooldown = absl::Seconds(-5)}).message(),
            "cooldown: must be a duration above 0 (got -5s)");
  // With quarantine off the durations do not matter.
  EXPECT_TRUE(Validate(QuarantineOptions{.failures = 0, .window = absl::ZeroDuration()}).ok());
}

}  // namespace
}  // namespace trainyard::server
