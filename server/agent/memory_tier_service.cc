#include "server/agent/memory_tier_service.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <set>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "common/status.h"
#include "proto/trainyard.grpc.pb.h"

namespace trainyard::server::agent {
namespace {

namespace v1 = ::trainyard::v1;

constexpr size_t kChunkBytes = size_t{1} << 20;

using rpc::FromGrpc;
using rpc::ToGrpc;

class Service final : public v1::MemoryTierService::Service {
 public:
  explicit Service(MemoryTier* tier) : tier_(tier) {}

  grpc::Status Reserve(grpc::ServerContext* context, const v1::TierReserveRequest* request,
                       v1::TierReserveReply* reply) override {
    if (absl::Status s = tier_->CheckSecret(request->job_id(), rpc::BearerToken(*context));
        !s.ok()) {
      return ToGrpc(s);
    }
    absl::StatusOr<std::string> dir =
        tier_->Reserve(request->job_id(), request->rank(), request->bytes(), request->peer_copy(),
                       request->from_node());
    if (!dir.ok()) return ToGrpc(dir.status());
    reply->set_dir(*dir);
    reply->set_keep(MemoryTier::kSlots);
    return grpc::Status::OK;
  }

  grpc::Status Committed(grpc::ServerContext* context, const v1::TierCommitted* request,
                         v1::TierCommittedReply*) override {
    if (absl::Status s = tier_->CheckSecret(request->job_id(), rpc::BearerToken(*context));
        !s.ok()) {
      return ToGrpc(s);
    }
    return ToGrpc(tier_->Committed(request->job_id(), request->rank(), request->world(),
                                   request->snapshot(), request->step(),
                                   {request->files().begin(), request->files().end()}));
  }

  grpc::Status PutSnapshot(grpc::ServerContext* context, grpc::ServerReader<v1::TierChunk>* reader,
                           v1::TierPutReply* reply) override {
    v1::TierChunk first;
    if (!reader->Read(&first)) return grpc::Status::OK;  // an empty copy
    // Every chunk belongs to the first one's copy.
    const std::string job = first.job_id(), snapshot = first.snapshot();
    if (absl::Status s = tier_->CheckSecret(job, rpc::BearerToken(*context)); !s.ok()) {
      return ToGrpc(s);
    }
    const int rank = first.rank(), world = first.world();
    if (absl::Status s = tier_->BeginCopy(job, rank, snapshot); !s.ok()) return ToGrpc(s);
    bool complete = false;
    int64_t bytes = 0;
    absl::Status status = [&]() -> absl::Status {
      std::unique_ptr<WritableFile> out;
      v1::TierChunk chunk = std::move(first);
      do {
        if (chunk.job_id() != job || chunk.snapshot() != snapshot || chunk.rank() != rank) {
          return absl::InvalidArgumentError("a copy's chunks must all name the same snapshot");
        }
        if (out == nullptr) {
          TY_ASSIGN_OR_RETURN(out, tier_->OpenReceived(job, snapshot, chunk.file()));
        }
        TY_RETURN_IF_ERROR(out->Append(chunk.data()));
        bytes += static_cast<int64_t>(chunk.data().size());
        if (chunk.last()) {
          TY_RETURN_IF_ERROR(out->Close());
          out.reset();
          complete = chunk.file().starts_with("rank-");
        }
      } while (reader->Read(&chunk));
      if (out != nullptr) return absl::DataLossError("the copy ended inside a file");
      return absl::OkStatus();
    }();
    tier_->EndCopy(job, rank, world, snapshot, status.ok() && complete);
    if (!status.ok()) return ToGrpc(status);
    reply->set_bytes(bytes);
    return grpc::Status::OK;
  }

 private:
  MemoryTier* const tier_;
};

class ServerImpl final : public MemoryTierServer {
 public:
  ServerImpl(MemoryTier* tier, FileSystem* fs, std::string node_id, rpc::TlsFiles tls)
      : tier_(tier), fs_(fs), node_id_(std::move(node_id)), tls_(std::move(tls)), service_(tier) {}

  ~ServerImpl() override {
    stop_ = true;
    if (copier_.joinable()) copier_.join();
    if (server_ != nullptr) server_->Shutdown(std::chrono::system_clock::now());
  }

  absl::Status Listen(const std::string& listen, const std::string& advertise_host) {
    grpc::ServerBuilder builder;
    int port = 0;
    TY_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> credentials,
                        rpc::ServerCredentials(tls_));
    TY_ASSIGN_OR_RETURN(peer_credentials_, rpc::ChannelCredentials(tls_));
    builder.AddListeningPort(listen, credentials, &port);
    builder.RegisterService(&service_);
    builder.SetMaxReceiveMessageSize(4 * static_cast<int>(kChunkBytes));
    server_ = builder.BuildAndStart();
    if (server_ == nullptr || port == 0) {
      return absl::UnavailableError(absl::StrCat("memory tier: cannot listen on ", listen));
    }
    address_ = absl::StrCat(advertise_host, ":", port);
    local_address_ = tls_.enabled() ? address_ : absl::StrCat("127.0.0.1:", port);
    copier_ = std::thread([this] { CopyLoop(); });
    return absl::OkStatus();
  }

  std::string address() const override { return address_; }
  std::string local_address() const override { return local_address_; }

 private:
  void CopyLoop() {
    while (!stop_) {
      std::optional<PeerCopy> copy = tier_->NextCopy();
      if (!copy) {
        absl::SleepFor(absl::Milliseconds(5));
        continue;
      }
      if (absl::Status sent = Send(*copy); !sent.ok()) {
        // One notice per job and peer: a peer that is gone fails every copy.
        if (failed_.insert({copy->job_id, copy->peer_address}).second) {
          tier_->AddNotice(
              copy->job_id,
              absl::StrCat("memory tier of ", node_id_, ": copy of rank ", copy->rank, " step ",
                           copy->step, " to ", copy->peer_address, " failed: ", sent.message()));
        }
        TY_LOG(WARNING) << "peer copy of " << copy->job_id << " rank " << copy->rank << " to "
                        << copy->peer_address << " failed: " << sent.message();
      } else {
        failed_.erase({copy->job_id, copy->peer_address});
      }
    }
  }

  v1::MemoryTierService::Stub& StubFor(const std::string& address) {
    auto& stub = stubs_[address];
    if (stub == nullptr) {
      stub = v1::MemoryTierService::NewStub(grpc::CreateChannel(address, peer_credentials_));
    }
    return *stub;
  }

  absl::Status Send(const PeerCopy& copy) {
    v1::MemoryTierService::Stub& stub = StubFor(copy.peer_address);
    const std::tuple<std::string, std::string, int, int64_t> reservation{
        copy.job_id, copy.peer_address, copy.rank, copy.bytes};
    // The peer runs ranks of the same attempt: it knows the secret this node presents.
    const std::string secret = tier_->SecretFor(copy.job_id);
    if (!reserved_.contains(reservation)) {
      grpc::ClientContext context;
      context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
      rpc::AddBearer(context, secret);
      v1::TierReserveRequest request;
      request.set_job_id(copy.job_id);
      request.set_rank(copy.rank);
      request.set_bytes(copy.bytes);
      request.set_peer_copy(true);
      request.set_from_node(node_id_);
      v1::TierReserveReply reply;
      const grpc::Status s = stub.Reserve(&context, request, &reply);
      if (!s.ok()) return FromGrpc(s);
      reserved_.insert(reservation);
    }
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    rpc::AddBearer(context, secret);
    v1::TierPutReply reply;
    std::unique_ptr<grpc::ClientWriter<v1::TierChunk>> writer = stub.PutSnapshot(&context, &reply);
    const std::string dir = absl::StrCat(tier_->JobDir(copy.job_id), "/", copy.snapshot);
    bool open = true;
    for (const std::string& file : copy.files) {
      absl::StatusOr<std::unique_ptr<ReadOnlyRegion>> region =
          fs_->MapReadOnly(absl::StrCat(dir, "/", file));
      if (!region.ok()) {
        context.TryCancel();
        (void)writer->Finish();
        // Pruned already (a newer snapshot follows): not a failure.
        return absl::IsNotFound(region.status()) ? absl::OkStatus() : region.status();
      }
      const char* data = reinterpret_cast<const char*>((*region)->data());
      const size_t size = (*region)->size();
      size_t at = 0;
      do {
        const size_t n = std::min(kChunkBytes, size - at);
        v1::TierChunk chunk;
        chunk.set_job_id(copy.job_id);
        chunk.set_snapshot(copy.snapshot);
        chunk.set_rank(copy.rank);
        chunk.set_world(copy.world);
        chunk.set_step(copy.step);
        chunk.set_file(file);
        chunk.set_data(data + at, n);
        at += n;
        chunk.set_last(at == size);
        if (!writer->Write(chunk)) {
          open = false;
          break;
        }
      } while (at < size);
      if (!open) break;
    }
    if (open) writer->WritesDone();
    const grpc::Status s = writer->Finish();
    if (!s.ok()) {
      // The peer may have restarted and lost its reservations: ask again next time.
      reserved_.erase(reservation);
      return FromGrpc(s);
    }
    return absl::OkStatus();
  }

  MemoryTier* const tier_;
  FileSystem* const fs_;
  const std::string node_id_;
  const rpc::TlsFiles tls_;
  std::shared_ptr<grpc::ChannelCredentials> peer_credentials_;
  Service service_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_, local_address_;
  std::atomic<bool> stop_{false};
  std::thread copier_;
  // The copier thread's own state.
  std::map<std::string, std::unique_ptr<v1::MemoryTierService::Stub>> stubs_;
  std::set<std::tuple<std::string, std::string, int, int64_t>> reserved_;
  std::set<std::pair<std::string, std::string>> failed_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<MemoryTierServer>> MemoryTierServer::Start(
    MemoryTier* tier, FileSystem* fs, const std::string& listen, const std::string& advertise_host,
    const std::string& node_id, const rpc::TlsFiles& tls) {
  auto server = std::make_unique<ServerImpl>(tier, fs, node_id, tls);
  TY_RETURN_IF_ERROR(server->Listen(listen, advertise_host));
  return std::unique_ptr<MemoryTierServer>(std::move(server));
}

}  // namespace trainyard::server::agent
