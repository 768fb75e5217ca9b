#include "server/agent/memory_tier_service.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
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

// Writes `files` of `dir` as chunks like `header` (which names the job, snapshot and rank) until
// `write` refuses one. NOT_FOUND when a file is gone (pruned meanwhile).
absl::Status StreamFiles(FileSystem& fs, const std::string& dir,
                         const std::vector<std::string>& files, const v1::TierChunk& header,
                         const std::function<bool(const v1::TierChunk&)>& write) {
  for (const std::string& file : files) {
    TY_ASSIGN_OR_RETURN(std::unique_ptr<ReadOnlyRegion> region,
                        fs.MapReadOnly(absl::StrCat(dir, "/", file)));
    const char* data = reinterpret_cast<const char*>(region->data());
    const size_t size = region->size();
    size_t at = 0;
    do {
      const size_t n = std::min(kChunkBytes, size - at);
      v1::TierChunk chunk = header;
      chunk.set_file(file);
      chunk.set_data(data + at, n);
      at += n;
      chunk.set_last(at == size);
      if (!write(chunk)) return absl::CancelledError("the receiver closed the stream");
    } while (at < size);
  }
  return absl::OkStatus();
}

// Receives one rank's files of a snapshot into the tier, from `chunk` on while `next` gives
// chunks, each under a name of its own until it is whole. `complete`: every file arrived (the
// rank's manifest last). More than `max_bytes` (when >= 0) is DATA_LOSS.
struct Received {
  RankFiles files;
  bool complete = false;
};
absl::Status ReceiveFiles(MemoryTier& tier, const std::string& job, const std::string& snapshot,
                          int rank, v1::TierChunk chunk,
                          const std::function<bool(v1::TierChunk*)>& next, int64_t max_bytes,
                          Received* got) {
  static std::atomic<uint64_t> receipts{0};
  std::unique_ptr<WritableFile> out;
  std::string part;
  // A file left unfinished goes (its name is this receipt's own).
  absl::Cleanup unfinished = [&] {
    if (out != nullptr) (void)tier.RemoveReceived(job, snapshot, part);
  };
  do {
    if (chunk.job_id() != job || chunk.snapshot() != snapshot || chunk.rank() != rank) {
      return absl::InvalidArgumentError("a copy's chunks must all name the same snapshot");
    }
    if (out == nullptr) {
      part = absl::StrCat(chunk.file(), ".part-", receipts.fetch_add(1));
      TY_ASSIGN_OR_RETURN(out, tier.OpenReceived(job, snapshot, part));
    }
    TY_RETURN_IF_ERROR(out->Append(chunk.data()));
    got->files.bytes += static_cast<int64_t>(chunk.data().size());
    if (max_bytes >= 0 && got->files.bytes > max_bytes) {
      return absl::DataLossError(absl::StrCat("rank ", rank, "'s files are over the ", max_bytes,
                                              " bytes their holder named"));
    }
    if (chunk.last()) {
      TY_RETURN_IF_ERROR(out->Close());
      out.reset();
      TY_RETURN_IF_ERROR(tier.CommitReceived(job, snapshot, part, chunk.file()));
      got->files.names.push_back(chunk.file());
      got->complete = chunk.file() == MemoryRankManifestName(rank);
    }
  } while (next(&chunk));
  if (out != nullptr) return absl::DataLossError("the copy ended inside a file");
  return absl::OkStatus();
}

// A peer call's deadline: `cap` from now, or the caller's, whichever comes first.
std::chrono::system_clock::time_point DeadlineWithin(const grpc::ServerContext& caller,
                                                     std::chrono::seconds cap) {
  return std::min(std::chrono::system_clock::now() + cap, caller.deadline());
}

// The canonical snapshot name `name` stands for; INVALID_ARGUMENT for any other spelling.
absl::StatusOr<MemorySnapshotId> CanonicalSnapshot(const std::string& name) {
  const std::optional<MemorySnapshotId> id = ParseMemorySnapshotName(name);
  if (!id || MemorySnapshotName(*id) != name) {
    return absl::InvalidArgumentError(absl::StrCat("bad snapshot name '", name, "'"));
  }
  return *id;
}

// Stubs for other nodes' tiers, one per address, shared by the copier and the gathers.
class PeerStubs {
 public:
  void set_credentials(std::shared_ptr<grpc::ChannelCredentials> credentials) {
    credentials_ = std::move(credentials);
  }
  v1::MemoryTierService::Stub& For(const std::string& address) {
    absl::MutexLock lock(&mu_);
    auto& stub = stubs_[address];
    if (stub == nullptr) {
      stub = v1::MemoryTierService::NewStub(grpc::CreateChannel(address, credentials_));
    }
    return *stub;
  }

 private:
  std::shared_ptr<grpc::ChannelCredentials> credentials_;  // set before any call
  absl::Mutex mu_;
  std::map<std::string, std::unique_ptr<v1::MemoryTierService::Stub>> stubs_ ABSL_GUARDED_BY(mu_);
};

// What the nodes of a job's attempt hold of a snapshot: per rank, a node holding it and the
// bytes of its files.
struct Holder {
  std::string address;
  int64_t bytes = 0;  // the rank's files
};

struct Holders {
  int world = 0;
  std::map<int, std::vector<Holder>> ranks;  // rank -> the nodes holding it, this one first
};

class Service final : public v1::MemoryTierService::Service {
 public:
  Service(MemoryTier* tier, FileSystem* fs, PeerStubs* peers)
      : tier_(tier), fs_(fs), peers_(peers) {}

  void set_address(const std::string& address) {
    absl::MutexLock lock(&address_mu_);
    address_ = address;
  }

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
                         v1::TierCommittedReply* reply) override {
    if (absl::Status s = tier_->CheckSecret(request->job_id(), rpc::BearerToken(*context));
        !s.ok()) {
      return ToGrpc(s);
    }
    const absl::StatusOr<bool> queued =
        tier_->Committed(request->job_id(), request->rank(), request->world(), request->snapshot(),
                         request->step(), {request->files().begin(), request->files().end()},
                         /*copy=*/!request->keep_local());
    if (!queued.ok()) return ToGrpc(queued.status());
    reply->set_kept_local(!*queued);
    return grpc::Status::OK;
  }

  grpc::Status CopyPending(grpc::ServerContext* context, const v1::TierCopyPendingRequest* request,
                           v1::TierCopyPendingReply* reply) override {
    if (absl::Status s = tier_->CheckSecret(request->job_id(), rpc::BearerToken(*context));
        !s.ok()) {
      return ToGrpc(s);
    }
    reply->set_pending(tier_->CopyPending(request->job_id(), request->rank()));
    return grpc::Status::OK;
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
    Received got;
    const absl::Status status = ReceiveFiles(
        *tier_, job, snapshot, rank, std::move(first),
        [reader](v1::TierChunk* chunk) { return reader->Read(chunk); }, -1, &got);
    tier_->EndCopy(
        job, rank, world, snapshot,
        status.ok() && got.complete ? std::optional(std::move(got.files)) : std::nullopt);
    if (!status.ok()) return ToGrpc(status);
    reply->set_bytes(got.files.bytes);
    return grpc::Status::OK;
  }

  grpc::Status Held(grpc::ServerContext* context, const v1::TierHeldRequest* request,
                    v1::TierHeldReply* reply) override {
    if (absl::Status s = tier_->CheckSecret(request->job_id(), rpc::BearerToken(*context));
        !s.ok()) {
      return ToGrpc(s);
    }
    for (const HeldSnapshot& held : tier_->Held(request->job_id())) {
      v1::TierHeld* out = reply->add_snapshots();
      out->set_snapshot(MemorySnapshotName(held.id));
      out->set_world(held.world);
      for (const auto& [rank, bytes] : held.ranks) {
        v1::TierHeldRank* r = out->add_ranks();
        r->set_rank(rank);
        r->set_bytes(bytes);
      }
    }
    return grpc::Status::OK;
  }

  grpc::Status GetSnapshot(grpc::ServerContext* context, const v1::TierGetRequest* request,
                           grpc::ServerWriter<v1::TierChunk>* writer) override {
    const std::string& job = request->job_id();
    if (absl::Status s = tier_->CheckSecret(job, rpc::BearerToken(*context)); !s.ok()) {
      return ToGrpc(s);
    }
    if (absl::StatusOr<MemorySnapshotId> id = CanonicalSnapshot(request->snapshot()); !id.ok()) {
      return ToGrpc(id.status());
    }
    absl::StatusOr<RankFiles> files = tier_->BeginRead(job, request->snapshot(), request->rank());
    if (!files.ok()) return ToGrpc(files.status());
    v1::TierChunk header;
    header.set_job_id(job);
    header.set_snapshot(request->snapshot());
    header.set_rank(request->rank());
    const absl::Status sent =
        StreamFiles(*fs_, absl::StrCat(tier_->JobDir(job), "/", request->snapshot()), files->names,
                    header, [writer](const v1::TierChunk& c) { return writer->Write(c); });
    tier_->EndRead(job, request->snapshot());
    return ToGrpc(sent);
  }

  grpc::Status Complete(grpc::ServerContext* context, const v1::TierCompleteRequest* request,
                        v1::TierCompleteReply* reply) override {
    const std::optional<std::string> secret = rpc::BearerToken(*context);
    if (absl::Status s = tier_->CheckSecret(request->job_id(), secret); !s.ok()) return ToGrpc(s);
    const std::map<MemorySnapshotId, Holders> all = HoldersOf(*context, request->job_id(), *secret);
    for (auto it = all.rbegin(); it != all.rend(); ++it) {
      if (it->second.world > 0 && static_cast<int>(it->second.ranks.size()) == it->second.world) {
        reply->add_snapshots(MemorySnapshotName(it->first));
      }
    }
    return grpc::Status::OK;
  }

  grpc::Status Gather(grpc::ServerContext* context, const v1::TierGatherRequest* request,
                      v1::TierGatherReply* reply) override {
    const std::optional<std::string> secret = rpc::BearerToken(*context);
    const std::string& job = request->job_id();
    if (absl::Status s = tier_->CheckSecret(job, secret); !s.ok()) return ToGrpc(s);
    const absl::StatusOr<MemorySnapshotId> id = CanonicalSnapshot(request->snapshot());
    if (!id.ok()) return ToGrpc(id.status());
    // The node's ranks ask for the same snapshot at once: the first fetches, the others find it
    // complete.
    absl::MutexLock lock(&gather_mu_);
    if (HeldWhole(job, *id)) return grpc::Status::OK;
    const Holders holders = HoldersOf(*context, job, *secret)[*id];
    const std::string self = address();
    if (holders.world == 0) {
      return ToGrpc(absl::FailedPreconditionError(
          absl::StrCat("no node of the attempt holds ", job, "/", request->snapshot())));
    }
    std::map<int, std::vector<Holder>> fetch;
    for (int rank = 0; rank < holders.world; ++rank) {
      auto it = holders.ranks.find(rank);
      if (it == holders.ranks.end()) {
        return ToGrpc(absl::FailedPreconditionError(absl::StrCat("rank ", rank, " of ", job, "/",
                                                                 request->snapshot(),
                                                                 " is on no node of the attempt")));
      }
      if (it->second.front().address != self) fetch.insert(*it);
    }
    return ToGrpc(Fetch(*context, job, request->snapshot(), holders.world, *secret, fetch, reply));
  }

 private:
  std::string address() const {
    absl::MutexLock lock(&address_mu_);
    return address_;
  }

  // Whether this node holds every rank of the snapshot.
  bool HeldWhole(const std::string& job, MemorySnapshotId id) const {
    for (const HeldSnapshot& h : tier_->Held(job)) {
      if (h.id == id) return h.world > 0 && static_cast<int>(h.ranks.size()) == h.world;
    }
    return false;
  }

  // Every snapshot of the job that this node or another node of its attempt holds a rank of, and
  // where each rank is (this node's ranks first). A node that does not answer (within 5 s and the
  // caller's deadline) holds nothing.
  std::map<MemorySnapshotId, Holders> HoldersOf(const grpc::ServerContext& caller,
                                                const std::string& job, const std::string& secret) {
    std::map<MemorySnapshotId, Holders> all;
    const auto add = [&all](const std::string& address, const HeldSnapshot& h) {
      Holders& holders = all[h.id];
      holders.world = h.world;
      for (const auto& [rank, bytes] : h.ranks) holders.ranks[rank].push_back({address, bytes});
    };
    const std::string self = address();
    for (const HeldSnapshot& h : tier_->Held(job)) add(self, h);
    for (const std::string& peer : tier_->AttemptTiers(job)) {
      if (peer == self || peer.empty()) continue;
      grpc::ClientContext context;
      context.set_deadline(DeadlineWithin(caller, std::chrono::seconds(5)));
      rpc::AddBearer(context, secret);
      v1::TierHeldRequest request;
      request.set_job_id(job);
      v1::TierHeldReply reply;
      if (grpc::Status s = peers_->For(peer).Held(&context, request, &reply); !s.ok()) {
        TY_LOG(WARNING) << "memory tier " << peer << " did not say what it holds of " << job << ": "
                        << s.error_message();
        continue;
      }
      for (const v1::TierHeld& held : reply.snapshots()) {
        const std::optional<MemorySnapshotId> id = ParseMemorySnapshotName(held.snapshot());
        if (!id) continue;
        HeldSnapshot h{.id = *id, .world = held.world()};
        for (const v1::TierHeldRank& r : held.ranks()) h.ranks[r.rank()] = r.bytes();
        add(peer, h);
      }
    }
    return all;
  }

  // Fetches each rank of `fetch` (rank -> the nodes holding it) into this node's tier, within the
  // caller's deadline: from the first of its holders that sends it whole.
  absl::Status Fetch(const grpc::ServerContext& caller, const std::string& job,
                     const std::string& snapshot, int world, const std::string& secret,
                     const std::map<int, std::vector<Holder>>& fetch, v1::TierGatherReply* reply) {
    int64_t bytes = 0;
    for (const auto& [rank, holders] : fetch) {
      int64_t most = 0;
      for (const Holder& h : holders) most = std::max(most, h.bytes);
      bytes += most;
    }
    if (fetch.empty()) return absl::OkStatus();
    TY_RETURN_IF_ERROR(tier_->BeginGather(job, snapshot, world, bytes));
    std::map<int, RankFiles> got;
    absl::Status status;
    for (const auto& [rank, holders] : fetch) {
      for (const Holder& holder : holders) {
        if (caller.IsCancelled()) {
          status = absl::CancelledError("the restoring rank gave up");
          break;
        }
        Received received;
        const bool others = &holder != &holders.back();
        status = FetchRank(caller, job, snapshot, rank, holder, others, secret, &received);
        if (status.ok()) {
          reply->set_bytes(reply->bytes() + received.files.bytes);
          reply->set_ranks(reply->ranks() + 1);
          got[rank] = std::move(received.files);
          break;
        }
        TY_LOG(WARNING) << status.message();
      }
      if (!status.ok()) break;
    }
    tier_->EndGather(job, snapshot, bytes, got);
    return status;
  }

  // Fetches one rank's files from one node that holds them; with `others` (holders to try
  // next), within half the time left.
  absl::Status FetchRank(const grpc::ServerContext& caller, const std::string& job,
                         const std::string& snapshot, int rank, const Holder& holder, bool others,
                         const std::string& secret, Received* received) {
    grpc::ClientContext context;
    std::chrono::system_clock::time_point deadline =
        DeadlineWithin(caller, std::chrono::seconds(60));
    if (others) {
      const auto now = std::chrono::system_clock::now();
      deadline = now + (std::max(deadline, now) - now) / 2;
    }
    context.set_deadline(deadline);
    rpc::AddBearer(context, secret);
    v1::TierGetRequest request;
    request.set_job_id(job);
    request.set_snapshot(snapshot);
    request.set_rank(rank);
    std::unique_ptr<grpc::ClientReader<v1::TierChunk>> reader =
        peers_->For(holder.address).GetSnapshot(&context, request);
    v1::TierChunk first;
    absl::Status status;
    if (reader->Read(&first)) {
      status = ReceiveFiles(
          *tier_, job, snapshot, rank, std::move(first),
          [&reader](v1::TierChunk* chunk) { return reader->Read(chunk); }, holder.bytes, received);
    }
    if (!status.ok()) context.TryCancel();
    const absl::Status finished = FromGrpc(reader->Finish());
    if (status.ok()) status = finished;
    if (status.ok() && !received->complete) {
      status = absl::DataLossError(absl::StrCat("rank ", rank, "'s files from ", holder.address,
                                                " ended without its manifest"));
    }
    return Annotate(status, absl::StrCat("fetching rank ", rank, " of ", job, "/", snapshot,
                                         " from ", holder.address));
  }

  MemoryTier* const tier_;
  FileSystem* const fs_;
  PeerStubs* const peers_;
  mutable absl::Mutex address_mu_;
  std::string address_ ABSL_GUARDED_BY(address_mu_);
  absl::Mutex gather_mu_;
};

class ServerImpl final : public MemoryTierServer {
 public:
  ServerImpl(MemoryTier* tier, FileSystem* fs, std::string node_id, rpc::TlsFiles tls)
      : tier_(tier),
        fs_(fs),
        node_id_(std::move(node_id)),
        tls_(std::move(tls)),
        service_(tier, fs, &peers_) {}

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
    TY_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ChannelCredentials> peer_credentials,
                        rpc::ChannelCredentials(tls_));
    peers_.set_credentials(std::move(peer_credentials));
    builder.AddListeningPort(listen, credentials, &port);
    builder.RegisterService(&service_);
    builder.SetMaxReceiveMessageSize(4 * static_cast<int>(kChunkBytes));
    server_ = builder.BuildAndStart();
    if (server_ == nullptr || port == 0) {
      return absl::UnavailableError(absl::StrCat("memory tier: cannot listen on ", listen));
    }
    address_ = absl::StrCat(advertise_host, ":", port);
    service_.set_address(address_);
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
      tier_->CopyEnded(*copy);
    }
  }

  absl::Status Send(const PeerCopy& copy) {
    v1::MemoryTierService::Stub& stub = peers_.For(copy.peer_address);
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
    v1::TierChunk header;
    header.set_job_id(copy.job_id);
    header.set_snapshot(copy.snapshot);
    header.set_rank(copy.rank);
    header.set_world(copy.world);
    header.set_step(copy.step);
    const absl::Status sent =
        StreamFiles(*fs_, absl::StrCat(tier_->JobDir(copy.job_id), "/", copy.snapshot), copy.files,
                    header, [&writer](const v1::TierChunk& chunk) { return writer->Write(chunk); });
    if (!sent.ok() && !absl::IsCancelled(sent)) {
      context.TryCancel();
      (void)writer->Finish();
      // Pruned already (a newer snapshot follows): not a failure.
      return absl::IsNotFound(sent) ? absl::OkStatus() : sent;
    }
    if (sent.ok()) writer->WritesDone();
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
  PeerStubs peers_;
  Service service_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_, local_address_;
  std::atomic<bool> stop_{false};
  std::thread copier_;
  // The copier thread's own state.
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
