// MemoryTier over the in-memory filesystem: the budget, what is kept of a job's snapshots (the
// newest, the newest copied, the newest complete, those a copy is arriving for or a peer reads),
// peer copies queued newest only and only of the snapshots to copy, pending until they end, what
// a node says it holds, gathers and their room in the budget, and release.
#include "server/agent/memory_tier.h"

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainyard::server::agent {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr char kRoot[] = "/shm/tier";

std::string Snap(int attempt, int64_t step) { return MemorySnapshotName({attempt, step}); }

class MemoryTierTest : public ::testing::Test {
 protected:
  MemoryTierTest() : tier_(&fs_, kRoot, 1000, "node-a") { EXPECT_TRUE(tier_.Start().ok()); }

  // Writes rank `rank`'s files of a snapshot as a worker would, and commits it (to be copied to
  // the peer when `copy`).
  void Write(const std::string& snapshot, int rank, int world, bool copy = true) {
    const std::string dir = absl::StrCat(kRoot, "/j-1/", snapshot);
    ASSERT_TRUE(fs_.CreateDirs(dir).ok());
    ASSERT_TRUE(
        fs_.WriteFileAtomic(absl::StrCat(dir, "/", MemoryRankManifestName(rank)), "{}").ok());
    ASSERT_TRUE(
        tier_.Committed("j-1", rank, world, snapshot, 0, {MemoryRankManifestName(rank)}, copy)
            .ok());
  }
  // Receives rank `rank`'s copy of a snapshot from a peer.
  void Receive(const std::string& snapshot, int rank, int world) {
    ASSERT_TRUE(tier_.BeginCopy("j-1", rank, snapshot).ok());
    auto out = tier_.OpenReceived("j-1", snapshot, MemoryRankManifestName(rank));
    ASSERT_TRUE(out.ok()) << out.status();
    ASSERT_TRUE((*out)->Append("{}").ok());
    ASSERT_TRUE((*out)->Close().ok());
    tier_.EndCopy("j-1", rank, world, snapshot, RankFiles{{MemoryRankManifestName(rank)}, 2});
  }
  std::vector<std::string> Held() {
    auto names = fs_.ListDir(absl::StrCat(kRoot, "/j-1"));
    std::vector<std::string> sorted = names.ok() ? *names : std::vector<std::string>{};
    std::sort(sorted.begin(), sorted.end());
    return sorted;
  }

  FakeFileSystem fs_;
  MemoryTier tier_;
};

TEST_F(MemoryTierTest, ReservationsCountAgainstTheBudgetAndARefusalIsANotice) {
  ASSERT_TRUE(tier_.Reserve("j-1", 0, 100, false, "node-a").ok());  // 6 slots: 600
  EXPECT_EQ(tier_.reserved_bytes(), 600);
  // Reserving again for the same rank replaces the reservation (a new attempt).
  ASSERT_TRUE(tier_.Reserve("j-1", 0, 120, false, "node-a").ok());
  EXPECT_EQ(tier_.reserved_bytes(), 720);
  const absl::StatusOr<std::string> refused = tier_.Reserve("j-1", 1, 100, true, "node-b");
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.status().message(), HasSubstr("refused a copy of rank 1 from node-b"));
  const auto notices = tier_.TakeNotices();
  ASSERT_EQ(notices.size(), 1u);
  EXPECT_EQ(notices[0].first, "j-1");
  EXPECT_THAT(notices[0].second, HasSubstr("budget"));
  EXPECT_THAT(tier_.TakeNotices(), IsEmpty());
  tier_.Release("j-1");
  EXPECT_EQ(tier_.reserved_bytes(), 0);
  EXPECT_FALSE(fs_.Exists(absl::StrCat(kRoot, "/j-1")));
}

TEST_F(MemoryTierTest, BadNamesAreRefused) {
  EXPECT_EQ(tier_.Reserve("../etc", 0, 1, false, "x").status().code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(tier_.Reserve("j-1", 0, 1, true, "x").ok());
  EXPECT_EQ(tier_.BeginCopy("j-1", 0, "../../x").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(tier_.OpenReceived("j-1", Snap(1, 2), "../x").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(tier_.BeginCopy("j-1", 7, Snap(1, 2)).code(), absl::StatusCode::kFailedPrecondition)
      << "a copy needs a peer reservation for its rank";
  EXPECT_EQ(tier_.Committed("j-1", 3, 4, Snap(1, 2), 2, {}).status().code(),
            absl::StatusCode::kFailedPrecondition)
      << "a commit needs a reservation";
}

TEST_F(MemoryTierTest, KeepsTheNewestTheNewestCompleteAndThoseArriving) {
  ASSERT_TRUE(tier_.Reserve("j-1", 0, 10, false, "node-a").ok());
  ASSERT_TRUE(tier_.Reserve("j-1", 1, 10, true, "node-b").ok());
  // Rank 0 runs here, rank 1's copies come from the peer; step 2 is complete.
  Write(Snap(1, 1), 0, 2);
  Write(Snap(1, 2), 0, 2);
  Receive(Snap(1, 2), 1, 2);
  // A copy of step 3 is arriving while rank 0 goes on.
  ASSERT_TRUE(tier_.BeginCopy("j-1", 1, Snap(1, 3)).ok());
  for (int step = 3; step <= 8; ++step) Write(Snap(1, step), 0, 2);
  EXPECT_THAT(Held(), ElementsAre(Snap(1, 2), Snap(1, 3), Snap(1, 6), Snap(1, 7), Snap(1, 8)));
  // The copy of step 3 completes it: step 2 is no longer needed.
  tier_.EndCopy("j-1", 1, 2, Snap(1, 3), RankFiles{{MemoryRankManifestName(1)}, 2});
  EXPECT_THAT(Held(), ElementsAre(Snap(1, 3), Snap(1, 6), Snap(1, 7), Snap(1, 8)));
  // A failed copy does not complete anything, and its snapshot goes once it is old.
  ASSERT_TRUE(tier_.BeginCopy("j-1", 1, Snap(1, 6)).ok());
  tier_.EndCopy("j-1", 1, 2, Snap(1, 6), std::nullopt);
  Write(Snap(1, 9), 0, 2);
  EXPECT_THAT(Held(), ElementsAre(Snap(1, 3), Snap(1, 7), Snap(1, 8), Snap(1, 9)));
}

TEST_F(MemoryTierTest, PeerCopiesAreQueuedNewestOnly) {
  ASSERT_TRUE(tier_.Reserve("j-1", 0, 10, false, "node-a").ok());
  Write(Snap(1, 1), 0, 2);
  EXPECT_FALSE(tier_.NextCopy().has_value()) << "no peer, no copies";
  tier_.SetPeer("j-1", "node-b:7000");
  Write(Snap(1, 2), 0, 2);
  Write(Snap(1, 3), 0, 2);
  const std::optional<PeerCopy> copy = tier_.NextCopy();
  ASSERT_TRUE(copy.has_value());
  EXPECT_EQ(copy->snapshot, Snap(1, 3));
  EXPECT_EQ(copy->peer_address, "node-b:7000");
  EXPECT_EQ(copy->world, 2);
  EXPECT_EQ(copy->bytes, 10);
  EXPECT_FALSE(tier_.NextCopy().has_value());
}

TEST_F(MemoryTierTest, OnlySnapshotsToCopyAreCopiedAndACopyIsPendingUntilItEnds) {
  ASSERT_TRUE(tier_.Reserve("j-1", 0, 10, false, "node-a").ok());
  tier_.SetPeer("j-1", "node-b:7000");
  EXPECT_FALSE(tier_.CopyPending("j-1", 0));
  Write(Snap(1, 1), 0, 3);
  EXPECT_TRUE(tier_.CopyPending("j-1", 0)) << "queued";
  // A snapshot kept here only neither queues a copy nor supersedes the queued one.
  Write(Snap(1, 2), 0, 3, /*copy=*/false);
  const std::optional<PeerCopy> copy = tier_.NextCopy();
  ASSERT_TRUE(copy.has_value());
  EXPECT_EQ(copy->snapshot, Snap(1, 1));
  EXPECT_FALSE(tier_.NextCopy().has_value());
  EXPECT_TRUE(tier_.CopyPending("j-1", 0)) << "being sent";
  EXPECT_FALSE(tier_.CopyPending("j-1", 1)) << "another rank's";
  tier_.CopyEnded(*copy);
  EXPECT_FALSE(tier_.CopyPending("j-1", 0));
}

// From three nodes up this node holds its own rank 0 and its predecessor's rank 1 of each copied
// step, never a whole snapshot: the two newest copied steps are what a lost node's work resumes
// from, however many snapshots were kept here only since.
TEST_F(MemoryTierTest, KeepsTheTwoNewestCopiedStepsBesidesTheNewest) {
  ASSERT_TRUE(tier_.Reserve("j-1", 0, 10, false, "node-a").ok());
  ASSERT_TRUE(tier_.Reserve("j-1", 1, 10, true, "node-c").ok());
  Write(Snap(1, 1), 0, 3);
  Receive(Snap(1, 1), 1, 3);
  for (int step = 2; step <= 6; ++step) Write(Snap(1, step), 0, 3, /*copy=*/false);
  EXPECT_THAT(Held(), ElementsAre(Snap(1, 1), Snap(1, 4), Snap(1, 5), Snap(1, 6)));
  Write(Snap(1, 7), 0, 3);
  Receive(Snap(1, 7), 1, 3);
  for (int step = 8; step <= 10; ++step) Write(Snap(1, step), 0, 3, /*copy=*/false);
  EXPECT_THAT(Held(), ElementsAre(Snap(1, 1), Snap(1, 7), Snap(1, 8), Snap(1, 9), Snap(1, 10)));
  // A third copied step: the first goes.
  Write(Snap(1, 11), 0, 3);
  EXPECT_THAT(Held(), ElementsAre(Snap(1, 7), Snap(1, 9), Snap(1, 10), Snap(1, 11)));
}

TEST_F(MemoryTierTest, HeldListsTheRanksCompleteHereNewestFirstWithTheirBytes) {
  ASSERT_TRUE(tier_.Reserve("j-1", 0, 10, false, "node-a").ok());
  ASSERT_TRUE(tier_.Reserve("j-1", 2, 10, true, "node-c").ok());
  Write(Snap(1, 1), 0, 3);
  Write(Snap(1, 2), 0, 3);
  Receive(Snap(1, 2), 2, 3);
  ASSERT_TRUE(tier_.BeginCopy("j-1", 2, Snap(1, 3)).ok());  // arriving: no rank complete yet
  const std::vector<HeldSnapshot> held = tier_.Held("j-1");
  ASSERT_EQ(held.size(), 2u);
  EXPECT_EQ(held[0].id, (MemorySnapshotId{1, 2}));
  EXPECT_EQ(held[0].world, 3);
  EXPECT_EQ(held[0].ranks, (std::map<int, int64_t>{{0, 2}, {2, 2}}));  // "{}" each
  EXPECT_EQ(held[1].id, (MemorySnapshotId{1, 1}));
  EXPECT_THAT(tier_.Held("j-2"), IsEmpty());
}

TEST_F(MemoryTierTest, ARankBeingReadIsKeptUntilTheReadEnds) {
  ASSERT_TRUE(tier_.Reserve("j-1", 0, 10, false, "node-a").ok());
  Write(Snap(1, 1), 0, 3);
  const absl::StatusOr<RankFiles> files = tier_.BeginRead("j-1", Snap(1, 1), 0);
  ASSERT_TRUE(files.ok()) << files.status();
  EXPECT_THAT(files->names, ElementsAre(MemoryRankManifestName(0)));
  EXPECT_EQ(files->bytes, 2);
  EXPECT_EQ(tier_.BeginRead("j-1", Snap(1, 1), 1).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(tier_.BeginRead("j-1", Snap(1, 9), 0).status().code(), absl::StatusCode::kNotFound);
  for (int step = 2; step <= 5; ++step) Write(Snap(1, step), 0, 3);
  EXPECT_THAT(Held(), ElementsAre(Snap(1, 1), Snap(1, 3), Snap(1, 4), Snap(1, 5)));
  tier_.EndRead("j-1", Snap(1, 1));
  EXPECT_THAT(Held(), ElementsAre(Snap(1, 3), Snap(1, 4), Snap(1, 5)));
}

// A gather asks for room for what it fetches, keeps what arrived counted while the snapshot is
// kept, and gives the rest back; a gathered snapshot stays while its attempt's snapshots still
// arrive, and goes once a later attempt's push it out of the newest (it does not count as the
// newest complete one, which a node keeps for a lost peer).
TEST_F(MemoryTierTest, AGatherHasRoomInTheBudgetAndItsSnapshotGoesWhenOld) {
  tier_.AdmitSecret("j-1", "attempt:j-1:2:aa");  // the restoring attempt's StartWorker
  ASSERT_TRUE(tier_.Reserve("j-1", 0, 100, false, "node-a").ok());  // 600 of 1000
  Write(Snap(1, 4), 0, 3);
  EXPECT_EQ(tier_.BeginGather("j-1", Snap(1, 4), 3, 500).code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(tier_.TakeNotices(), ElementsAre(testing::Pair("j-1", HasSubstr("gather"))));
  ASSERT_TRUE(tier_.BeginGather("j-1", Snap(1, 4), 3, 400).ok());
  EXPECT_EQ(tier_.reserved_bytes(), 1000);
  std::map<int, RankFiles> got;
  for (int rank : {1, 2}) {
    auto out = tier_.OpenReceived("j-1", Snap(1, 4), MemoryRankManifestName(rank));
    ASSERT_TRUE(out.ok()) << out.status();
    ASSERT_TRUE((*out)->Append(std::string(150, 'x')).ok());
    ASSERT_TRUE((*out)->Close().ok());
    got[rank] = {{MemoryRankManifestName(rank)}, 150};
  }
  tier_.EndGather("j-1", Snap(1, 4), 400, got);
  EXPECT_EQ(tier_.reserved_bytes(), 900);
  ASSERT_EQ(tier_.Held("j-1").size(), 1u);
  EXPECT_EQ(tier_.Held("j-1")[0].ranks.size(), 3u) << "complete here now";
  // Late snapshots of the old attempt (a copy, a rank's last write) do not push it out.
  for (int step = 5; step <= 8; ++step) Write(Snap(1, step), 0, 3);
  EXPECT_THAT(Held(), ElementsAre(Snap(1, 4), Snap(1, 6), Snap(1, 7), Snap(1, 8)));
  // The new attempt's snapshots follow; the gathered one goes after kKeep of them.
  for (int step = 9; step <= 11; ++step) Write(Snap(2, step), 0, 3);
  EXPECT_THAT(Held(), ElementsAre(Snap(2, 9), Snap(2, 10), Snap(2, 11)));
  EXPECT_EQ(tier_.reserved_bytes(), 600);
  // A gather that outlives its job does not bring it back.
  tier_.Release("j-1");
  EXPECT_EQ(tier_.BeginGather("j-1", Snap(2, 11), 3, 10).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(fs_.Exists(absl::StrCat(kRoot, "/j-1")));
}

TEST_F(MemoryTierTest, TheAttemptsTiersAreKeptPerJobUntilRelease) {
  tier_.SetPeer("j-1", "node-b:7000", {"node-a:7000", "node-b:7000", "node-c:7000"});
  EXPECT_THAT(tier_.AttemptTiers("j-1"), ElementsAre("node-a:7000", "node-b:7000", "node-c:7000"));
  EXPECT_THAT(tier_.AttemptTiers("j-2"), IsEmpty());
  tier_.Release("j-1");
  EXPECT_THAT(tier_.AttemptTiers("j-1"), IsEmpty());
}

// The tier admits, per job, only the attempt secrets this node's StartWorker orders carried.
TEST_F(MemoryTierTest, AuthAdmitsOnlyTheJobsAttemptSecrets) {
  EXPECT_EQ(tier_.CheckSecret("j-1", std::nullopt).code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(tier_.CheckSecret("j-1", "attempt:j-1:1:00").code(),
            absl::StatusCode::kPermissionDenied);
  tier_.AdmitSecret("j-1", "attempt:j-1:1:aa");
  tier_.AdmitSecret("j-2", "attempt:j-2:1:bb");
  EXPECT_TRUE(tier_.CheckSecret("j-1", "attempt:j-1:1:aa").ok());
  EXPECT_EQ(tier_.CheckSecret("j-1", "attempt:j-2:1:bb").code(),
            absl::StatusCode::kPermissionDenied);
  // A restarted attempt brings a new secret; copies carry the newest, both stay valid.
  tier_.AdmitSecret("j-1", "attempt:j-1:2:cc");
  EXPECT_TRUE(tier_.CheckSecret("j-1", "attempt:j-1:1:aa").ok());
  EXPECT_EQ(tier_.SecretFor("j-1"), "attempt:j-1:2:cc");
  tier_.Release("j-1");
  EXPECT_EQ(tier_.CheckSecret("j-1", "attempt:j-1:2:cc").code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(tier_.SecretFor("j-1"), "");
}

}  // namespace
}  // namespace trainyard::server::agent
