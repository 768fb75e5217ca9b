#include "worker/grpc_memory_tier.h"

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "proto/trainyard.grpc.pb.h"

namespace trainyard::worker {
namespace {

namespace v1 = ::trainyard::v1;

class GrpcMemoryTier final : public MemoryTierClient {
 public:
  GrpcMemoryTier(std::shared_ptr<grpc::Channel> channel, std::string job_id, int attempt, int rank,
                 int world, absl::Duration gather_deadline)
      : stub_(v1::MemoryTierService::NewStub(std::move(channel))),
        job_id_(std::move(job_id)),
        attempt_(attempt),
        rank_(rank),
        world_(world),
        gather_deadline_(gather_deadline) {}

  absl::StatusOr<std::string> Reserve(int64_t bytes) override {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::TierReserveRequest request;
    request.set_job_id(job_id_);
    request.set_attempt_id(attempt_);
    request.set_rank(rank_);
    request.set_bytes(bytes);
    v1::TierReserveReply reply;
    if (grpc::Status s = stub_->Reserve(&context, request, &reply); !s.ok())
      return rpc::FromGrpc(s);
    return reply.dir();
  }

  absl::StatusOr<bool> Committed(int64_t step, const std::string& snapshot,
                                 std::vector<std::string> files, bool copy) override {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::TierCommitted request;
    request.set_job_id(job_id_);
    request.set_attempt_id(attempt_);
    request.set_rank(rank_);
    request.set_world(world_);
    request.set_step(step);
    request.set_snapshot(snapshot);
    for (std::string& f : files) request.add_files(std::move(f));
    request.set_keep_local(!copy);
    v1::TierCommittedReply reply;
    if (grpc::Status s = stub_->Committed(&context, request, &reply); !s.ok()) {
      return rpc::FromGrpc(s);
    }
    return copy && !reply.kept_local();
  }

  absl::StatusOr<bool> CopyPending() override {
    grpc::ClientContext context;
    // On the training thread, which the other ranks wait for.
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(1));
    v1::TierCopyPendingRequest request;
    request.set_job_id(job_id_);
    request.set_rank(rank_);
    v1::TierCopyPendingReply reply;
    if (grpc::Status s = stub_->CopyPending(&context, request, &reply); !s.ok()) {
      return rpc::FromGrpc(s);
    }
    return reply.pending();
  }

  absl::StatusOr<std::vector<std::string>> Complete() override {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(15));
    v1::TierCompleteRequest request;
    request.set_job_id(job_id_);
    v1::TierCompleteReply reply;
    if (grpc::Status s = stub_->Complete(&context, request, &reply); !s.ok()) {
      return rpc::FromGrpc(s);
    }
    return std::vector<std::string>(reply.snapshots().begin(), reply.snapshots().end());
  }

  absl::Status Gather(const std::string& snapshot) override {
    grpc::ClientContext context;
    // Every rank of the snapshot this node lacks, over the network, while the other ranks wait.
    context.set_deadline(absl::ToChronoTime(absl::Now() + gather_deadline_));
    v1::TierGatherRequest request;
    request.set_job_id(job_id_);
    request.set_snapshot(snapshot);
    v1::TierGatherReply reply;
    return rpc::FromGrpc(stub_->Gather(&context, request, &reply));
  }

 private:
  std::unique_ptr<v1::MemoryTierService::Stub> stub_;
  const std::string job_id_;
  const int attempt_, rank_, world_;
  const absl::Duration gather_deadline_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<MemoryTierClient>> MakeGrpcMemoryTierClient(
    const std::string& address, const rpc::TlsFiles& tls, std::string job_id, int attempt, int rank,
    int world, absl::Duration gather_deadline) {
  // The tier admits the attempt's secret, as the coordinator does. Its agent may restart under
  // the rank (on the same port): reconnect within a second, not after gRPC's default backoff of
  // up to two minutes, so the rank's snapshots resume soon after.
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
      rpc::MakeChannel(address, tls, rpc::QuickReconnect(), rpc::AttemptSecretFromEnvironment());
  if (!channel.ok()) return channel.status();
  return std::make_unique<GrpcMemoryTier>(*std::move(channel), std::move(job_id), attempt, rank,
                                          world, gather_deadline);
}

}  // namespace trainyard::worker
