// MemoryTierServer with three in-process nodes on loopback, each holding one rank of a snapshot
// (as from three nodes up): a node lists the snapshots complete over the attempt's nodes, gathers
// the ranks it lacks byte for byte (files over a chunk included), and then holds the snapshot
// whole; a snapshot with a rank no node holds is neither listed nor gathered; copied around the
// ring, a copied step outlives a lost node; a rank comes from its other holder when the first
// fails; a node that does not answer holds nothing; every call wants one of the job's attempt
// secrets.
#include "server/agent/memory_tier_service.h"

#include <grpcpp/grpcpp.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/rpc.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/trainyard.grpc.pb.h"
#include "tests/unit/server/agent/agent_test_util.h"

namespace trainyard::server::agent {
namespace {

namespace v1 = ::trainyard::v1;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

constexpr char kJob[] = "j-1";
constexpr char kSecret[] = "attempt:j-1:2:secret";

std::string Snap(int attempt, int64_t step) { return MemorySnapshotName({attempt, step}); }

struct Node {
  std::unique_ptr<MemoryTier> tier;
  std::unique_ptr<MemoryTierServer> server;
};

class MemoryTierServiceTest : public ::testing::Test {
 protected:
  MemoryTierServiceTest() {
    for (int n = 0; n < 3; ++n) {
      Node& node = nodes_[n];
      node.tier = std::make_unique<MemoryTier>(
          RealFileSystem(), absl::StrCat(dir_.path(), "/node-", n), 64 << 20, NodeName(n));
      EXPECT_TRUE(node.tier->Start().ok());
      node.tier->AdmitSecret(kJob, kSecret);
      absl::StatusOr<std::unique_ptr<MemoryTierServer>> server = MemoryTierServer::Start(
          node.tier.get(), RealFileSystem(), "127.0.0.1:0", "127.0.0.1", NodeName(n));
      EXPECT_TRUE(server.ok()) << server.status();
      node.server = *std::move(server);
      addresses_.push_back(node.server->address());
    }
    for (Node& node : nodes_) node.tier->SetPeer(kJob, "", addresses_);
  }

  static std::string NodeName(int n) { return std::string("node-") + static_cast<char>('a' + n); }

  // Node `n` holds rank `rank` of `snapshot` (of `world` ranks), written and committed as a
  // worker does.
  void Write(int n, const std::string& snapshot, int rank, int world, size_t bytes,
             bool copy = true) {
    WriteFiles(n, snapshot, rank, world, bytes);
    const absl::StatusOr<bool> kept_local = Commit(n, snapshot, rank, world, copy);
    ASSERT_TRUE(kept_local.ok()) << kept_local.status();
  }

  // Rank `rank`'s files of `snapshot` on node `n`: a shard of `bytes` and its manifest last.
  void WriteFiles(int n, const std::string& snapshot, int rank, int world, size_t bytes) {
    MemoryTier& tier = *nodes_[n].tier;
    ASSERT_TRUE(tier.Reserve(kJob, rank, 4 << 20, false, NodeName(n)).ok());
    const std::string dir = absl::StrCat(tier.JobDir(kJob), "/", snapshot);
    const std::string shard = absl::StrCat("shard-", rank, "-of-", world, ".bin");
    std::string data(bytes, '\0');
    for (size_t i = 0; i < bytes; ++i) data[i] = static_cast<char>((i * 131 + rank) & 0xff);
    testing::WriteFile(absl::StrCat(dir, "/", shard), data);
    testing::WriteFile(absl::StrCat(dir, "/", MemoryRankManifestName(rank)),
                       absl::StrCat("{\"rank\": ", rank, "}"));
  }

  // Tells node `n` that rank `rank` of `snapshot` is written (to be copied when `copy`); whether
  // the node kept it local, queueing no copy.
  absl::StatusOr<bool> Commit(int n, const std::string& snapshot, int rank, int world, bool copy) {
    grpc::ClientContext context;
    rpc::AddBearer(context, kSecret);
    v1::TierCommitted request;
    request.set_job_id(kJob);
    request.set_attempt_id(1);
    request.set_rank(rank);
    request.set_world(world);
    request.set_step(7);
    request.set_snapshot(snapshot);
    request.add_files(absl::StrCat("shard-", rank, "-of-", world, ".bin"));
    request.add_files(MemoryRankManifestName(rank));
    request.set_keep_local(!copy);
    v1::TierCommittedReply reply;
    if (grpc::Status s = Stub(n)->Committed(&context, request, &reply); !s.ok()) {
      return rpc::FromGrpc(s);
    }
    return reply.kept_local();
  }

  absl::StatusOr<bool> CopyPending(int n, int rank) {
    grpc::ClientContext context;
    rpc::AddBearer(context, kSecret);
    v1::TierCopyPendingRequest request;
    request.set_job_id(kJob);
    request.set_rank(rank);
    v1::TierCopyPendingReply reply;
    if (grpc::Status s = Stub(n)->CopyPending(&context, request, &reply); !s.ok()) {
      return rpc::FromGrpc(s);
    }
    return reply.pending();
  }

  // Waits (10 s at most) until no node copies its rank to its peer.
  bool CopiesEnded() {
    for (int tries = 0; tries < 1000; ++tries) {
      bool pending = false;
      for (int n = 0; n < 3; ++n) {
        absl::StatusOr<bool> p = CopyPending(n, n);
        pending = pending || !p.ok() || *p;
      }
      if (!pending) return true;
      absl::SleepFor(absl::Milliseconds(10));
    }
    return false;
  }

  std::unique_ptr<v1::MemoryTierService::Stub> Stub(int n) {
    return v1::MemoryTierService::NewStub(
        grpc::CreateChannel(addresses_[n], grpc::InsecureChannelCredentials()));
  }

  absl::StatusOr<std::vector<std::string>> Complete(int n, const std::string& secret = kSecret) {
    grpc::ClientContext context;
    rpc::AddBearer(context, secret);
    v1::TierCompleteRequest request;
    request.set_job_id(kJob);
    v1::TierCompleteReply reply;
    if (grpc::Status s = Stub(n)->Complete(&context, request, &reply); !s.ok()) {
      return rpc::FromGrpc(s);
    }
    return std::vector<std::string>(reply.snapshots().begin(), reply.snapshots().end());
  }

  absl::StatusOr<v1::TierGatherReply> Gather(int n, const std::string& snapshot) {
    grpc::ClientContext context;
    rpc::AddBearer(context, kSecret);
    v1::TierGatherRequest request;
    request.set_job_id(kJob);
    request.set_snapshot(snapshot);
    v1::TierGatherReply reply;
    if (grpc::Status s = Stub(n)->Gather(&context, request, &reply); !s.ok()) {
      return rpc::FromGrpc(s);
    }
    return reply;
  }

  std::string File(int n, const std::string& snapshot, const std::string& name) {
    return testing::ReadWholeFile(
        absl::StrCat(nodes_[n].tier->JobDir(kJob), "/", snapshot, "/", name));
  }

  testing::TempDir dir_;
  Node nodes_[3];
  std::vector<std::string> addresses_;
};

TEST_F(MemoryTierServiceTest, ANodeGathersTheRanksItLacksFromTheNodesThatHoldThem) {
  for (int n = 0; n < 3; ++n) Write(n, Snap(2, 40), n, 3, n == 1 ? (5 << 19) : 1000);
  Write(0, Snap(2, 41), 0, 3, 1000);  // only rank 0 of step 41 exists anywhere
  const absl::StatusOr<std::vector<std::string>> complete = Complete(0);
  ASSERT_TRUE(complete.ok()) << complete.status();
  EXPECT_THAT(*complete, ElementsAre(Snap(2, 40)));

  const absl::StatusOr<v1::TierGatherReply> gathered = Gather(0, Snap(2, 40));
  ASSERT_TRUE(gathered.ok()) << gathered.status();
  EXPECT_EQ(gathered->ranks(), 2);
  for (int rank : {1, 2}) {
    const std::string shard = absl::StrCat("shard-", rank, "-of-3.bin");
    EXPECT_EQ(File(0, Snap(2, 40), shard), File(rank, Snap(2, 40), shard)) << shard;
    EXPECT_EQ(File(0, Snap(2, 40), MemoryRankManifestName(rank)),
              absl::StrCat("{\"rank\": ", rank, "}"));
  }
  EXPECT_EQ(gathered->bytes(), (5 << 19) + 1000 + 2 * 11);  // shards and manifests
  // Files arrive under names of their own and are renamed once whole.
  for (const auto& entry : std::filesystem::directory_iterator(
           absl::StrCat(nodes_[0].tier->JobDir(kJob), "/", Snap(2, 40)))) {
    EXPECT_THAT(entry.path().filename().string(), Not(HasSubstr(".part")));
  }
  const std::vector<HeldSnapshot> held = nodes_[0].tier->Held(kJob);
  ASSERT_EQ(held.size(), 2u);
  EXPECT_EQ(held[1].ranks.size(), 3u) << "node-a holds step 40 whole now";

  // A second rank of the node asks again: nothing left to fetch.
  const absl::StatusOr<v1::TierGatherReply> again = Gather(0, Snap(2, 40));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->ranks(), 0);

  const absl::StatusOr<v1::TierGatherReply> partial = Gather(1, Snap(2, 41));
  EXPECT_EQ(partial.status().code(), absl::StatusCode::kFailedPrecondition) << partial.status();
  // Another spelling of a snapshot's name would name another directory.
  EXPECT_EQ(Gather(0, "a2-step-40").status().code(), absl::StatusCode::kInvalidArgument);
}

// The nodes copy to their ring successors, only the snapshots to copy: after a node is lost,
// the two others still hold every rank of the last copied step, however many snapshots each
// kept to itself since.
TEST_F(MemoryTierServiceTest, ACopiedStepOutlivesALostNodeAfterSnapshotsKeptLocal) {
  for (int n = 0; n < 3; ++n) nodes_[n].tier->SetPeer(kJob, addresses_[(n + 1) % 3], addresses_);
  for (int n = 0; n < 3; ++n) Write(n, Snap(1, 1), n, 3, 1000);
  ASSERT_TRUE(CopiesEnded());
  for (int step = 2; step <= 8; ++step) {
    for (int n = 0; n < 3; ++n) Write(n, Snap(1, step), n, 3, 1000, /*copy=*/false);
  }
  for (int n = 0; n < 3; ++n) {
    absl::StatusOr<bool> pending = CopyPending(n, n);
    ASSERT_TRUE(pending.ok()) << pending.status();
    EXPECT_FALSE(*pending) << "node " << n << " copied a snapshot kept local";
  }
  nodes_[2].server.reset();
  const absl::StatusOr<std::vector<std::string>> complete = Complete(0);
  ASSERT_TRUE(complete.ok()) << complete.status();
  EXPECT_THAT(*complete, ElementsAre(Snap(1, 1)));
  const absl::StatusOr<v1::TierGatherReply> gathered = Gather(0, Snap(1, 1));
  ASSERT_TRUE(gathered.ok()) << gathered.status();
  EXPECT_EQ(gathered->ranks(), 1) << "rank 1 from node-b; rank 2 is the copy node-a holds";
  for (int rank : {1, 2}) {
    const std::string shard = absl::StrCat("shard-", rank, "-of-3.bin");
    EXPECT_EQ(File(0, Snap(1, 1), shard), File(rank, Snap(1, 1), shard)) << shard;
  }
}

// A node tells a rank whether it queued a copy of its snapshot: not in a job without a peer node
// (a single node's) nor when the ranks kept the snapshot local, and then the rank does not ask
// CopyPending about it.
TEST_F(MemoryTierServiceTest, ANodeSaysWhetherItQueuedACopy) {
  WriteFiles(0, Snap(1, 1), 0, 1, 100);
  EXPECT_EQ(Commit(0, Snap(1, 1), 0, 1, /*copy=*/true).value_or(false), true) << "no peer node";
  nodes_[0].tier->SetPeer(kJob, addresses_[1], addresses_);
  WriteFiles(0, Snap(1, 2), 0, 1, 100);
  EXPECT_EQ(Commit(0, Snap(1, 2), 0, 1, /*copy=*/false).value_or(false), true);
  WriteFiles(0, Snap(1, 3), 0, 1, 100);
  EXPECT_EQ(Commit(0, Snap(1, 3), 0, 1, /*copy=*/true).value_or(true), false) << "copied";
  EXPECT_TRUE(CopiesEnded());
}

// A rank on two nodes (its own and the copy its successor holds) comes from the second when the
// first cannot send it whole: its stream breaks between two files (step 9: the manifest is gone)
// or inside one (step 10: the shard is longer than the bytes the node said it holds; the
// unfinished file goes).
TEST_F(MemoryTierServiceTest, ARankComesFromItsOtherHolderWhenTheFirstFails) {
  for (int step : {9, 10}) {
    for (int n = 0; n < 3; ++n) Write(n, Snap(1, step), n, 3, 5000);
    Write(1, Snap(1, step), 2, 3, 5000);
  }
  const std::string broken = absl::StrCat(nodes_[1].tier->JobDir(kJob), "/");
  std::filesystem::remove(absl::StrCat(broken, Snap(1, 9), "/", MemoryRankManifestName(2)));
  testing::WriteFile(absl::StrCat(broken, Snap(1, 10), "/shard-2-of-3.bin"),
                     std::string(20000, 'x'));
  for (int step : {9, 10}) {
    const absl::StatusOr<v1::TierGatherReply> gathered = Gather(0, Snap(1, step));
    ASSERT_TRUE(gathered.ok()) << gathered.status();
    EXPECT_EQ(gathered->ranks(), 2);
    for (int rank : {1, 2}) {
      for (const std::string& file :
           {absl::StrCat("shard-", rank, "-of-3.bin"), MemoryRankManifestName(rank)}) {
        EXPECT_EQ(File(0, Snap(1, step), file), File(rank, Snap(1, step), file)) << file;
      }
    }
    for (const auto& entry : std::filesystem::directory_iterator(
             absl::StrCat(nodes_[0].tier->JobDir(kJob), "/", Snap(1, step)))) {
      EXPECT_THAT(entry.path().filename().string(), Not(HasSubstr(".part-")));
    }
  }
}

TEST_F(MemoryTierServiceTest, ANodeThatDoesNotAnswerHoldsNothing) {
  for (int n = 0; n < 3; ++n) Write(n, Snap(1, 9), n, 3, 100);
  nodes_[2].server.reset();
  const absl::StatusOr<std::vector<std::string>> complete = Complete(1);
  ASSERT_TRUE(complete.ok()) << complete.status();
  EXPECT_THAT(*complete, IsEmpty());
  EXPECT_EQ(Gather(1, Snap(1, 9)).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(MemoryTierServiceTest, EveryCallWantsOneOfTheJobsAttemptSecrets) {
  Write(1, Snap(1, 9), 1, 3, 100);
  EXPECT_EQ(Complete(0, "attempt:j-1:1:other").status().code(),
            absl::StatusCode::kPermissionDenied);
  grpc::ClientContext context;
  rpc::AddBearer(context, "attempt:j-1:1:other");
  v1::TierGetRequest request;
  request.set_job_id(kJob);
  request.set_snapshot(Snap(1, 9));
  request.set_rank(1);
  std::unique_ptr<grpc::ClientReader<v1::TierChunk>> reader =
      Stub(1)->GetSnapshot(&context, request);
  v1::TierChunk chunk;
  EXPECT_FALSE(reader->Read(&chunk)) << "no file leaves without the secret";
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::PERMISSION_DENIED);
}

}  // namespace
}  // namespace trainyard::server::agent
