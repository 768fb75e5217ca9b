// The Gloo engine: TCP pairs between every two ranks of a group (gloo's full mesh), with the
// ring reduce-scatter and all-gather written here over gloo's unbound buffers, so that the
// reduction order, the timeouts and the byte accounting are ours.
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/status.h"
#include "worker/parallel/communicator.h"

namespace trainyard::worker::parallel {
namespace {

// gloo's rendezvous store over ours. gloo reports failures by exceptions; they stay inside this
// file (ConnectGloo catches them).
class StoreAdapter final : public gloo::rendezvous::Store {
 public:
  StoreAdapter(KeyValueStore& store, std::chrono::milliseconds timeout)
      : store_(store), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    const absl::Status s = store_.Set(key, std::string(data.begin(), data.end()));
    if (!s.ok()) throw std::runtime_error(s.ToString());
  }
  std::vector<char> get(const std::string& key) override {
    absl::StatusOr<std::string> v = store_.Get(key, timeout_);
    if (!v.ok()) throw std::runtime_error(v.status().ToString());
    return std::vector<char>(v->begin(), v->end());
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& t) override {
    const absl::Status s = store_.Wait(keys, t);
    if (!s.ok()) throw std::runtime_error(s.ToString());
  }

 private:
  KeyValueStore& store_;
  std::chrono::milliseconds timeout_;
};

// Slots for point-to-point messages live above every slot gloo hands to collectives.
constexpr uint64_t kPointToPointSlotBase = uint64_t{1} << 48;

class GlooCommunicator final : public Communicator {
 public:
  GlooCommunicator(std::shared_ptr<gloo::rendezvous::Context> context,
                   std::shared_ptr<gloo::transport::Device> device,
                   std::chrono::milliseconds timeout, WaitRegistry* waits, std::string label,
                   std::vector<int> members)
      : context_(std::move(context)),
        device_(std::move(device)),
        timeout_(timeout),
        waits_(waits),
        label_(std::move(label)),
        members_(std::move(members)) {}

  // fp32 only: bf16 reaches Gloo through the staging communicator, converted on the host.
  using Communicator::AllGather;
  using Communicator::AllReduce;
  using Communicator::Recv;
  using Communicator::ReduceScatter;
  using Communicator::Send;
  using Communicator::SendRecv;

  const char* engine() const override { return "gloo"; }
  int rank() const override { return context_->rank; }
  int size() const override { return context_->size; }

  absl::Status AllReduce(float* data, int64_t count) override {
    if (size() == 1) return absl::OkStatus();
    if (size() == 2) return PairAllReduce(data, count);
    const Chunks chunks(count, size());
    TY_RETURN_IF_ERROR(RingReduceScatter(data, chunks, CollectiveKind::kAllReduce, "all-reduce"));
    const Region whole{data, chunks};
    return RingAllGather({&whole, 1}, CollectiveKind::kAllReduce, "all-reduce");
  }

  absl::Status ReduceScatter(const float* in, float* out, int64_t count) override {
    if (size() == 1) {
      if (out != in) std::copy_n(in, count, out);
      return absl::OkStatus();
    }
    // Reduce in a scratch copy so that `in` is left untouched.
    scratch_.assign(in, in + count * size());
    TY_RETURN_IF_ERROR(RingReduceScatter(scratch_.data(), Chunks(count * size(), size()),
                                         CollectiveKind::kReduceScatter, "reduce-scatter"));
    std::copy_n(scratch_.data() + int64_t{rank()} * count, count, out);
    return absl::OkStatus();
  }

  absl::Status AllGather(const float* in, float* out, int64_t count) override {
    const GatherPart part{in, out, count};
    return AllGatherMany({&part, 1});
  }

  // Every part's exchange of a ring step is posted before any is waited for.
  absl::Status AllGatherMany(std::span<const GatherPart> parts) override {
    std::vector<Region> regions;
    regions.reserve(parts.size());
    for (const GatherPart& p : parts) {
      float* mine = p.out + int64_t{rank()} * p.count;
      if (mine != p.in) std::copy_n(p.in, p.count, mine);
      regions.push_back({p.out, Chunks(p.count * size(), size())});
    }
    if (size() == 1) return absl::OkStatus();
    return RingAllGather(regions, CollectiveKind::kAllGather, "all-gather");
  }

  absl::Status Broadcast(float* data, int64_t count, int root) override {
    if (size() == 1) return absl::OkStatus();
    return Guard("broadcast", [&] {
      gloo::BroadcastOptions opts(context_);
      if (rank() == root) opts.setInput(data, count);
      opts.setOutput(data, count);
      opts.setRoot(root);
      opts.setTimeout(timeout_);
      WaitRegistry::Scope wait = WaitFor("broadcast", rank() == root ? Others() : Peer(root));
      gloo::broadcast(opts);
      if (rank() == root)
        stats_.Add(CollectiveKind::kBroadcast, count * sizeof(float) * (size() - 1));
    });
  }

  absl::Status Send(const float* data, int64_t count, int peer, uint32_t tag) override {
    TY_ASSIGN_OR_RETURN(std::unique_ptr<PendingTransfer> send,
                        Start(/*send=*/true, const_cast<float*>(data), count, peer, tag));
    return send->Wait();
  }

  absl::Status Recv(float* data, int64_t count, int peer, uint32_t tag) override {
    TY_ASSIGN_OR_RETURN(std::unique_ptr<PendingTransfer> recv,
                        Start(/*send=*/false, data, count, peer, tag));
    return recv->Wait();
  }

  absl::Status SendRecv(const float* send, int64_t send_count, int send_peer, uint32_t send_tag,
                        float* recv, int64_t recv_count, int recv_peer,
                        uint32_t recv_tag) override {
    return Guard("send-recv", [&] {
      auto rbuf = context_->createUnboundBuffer(recv, recv_count * sizeof(float));
      auto sbuf =
          context_->createUnboundBuffer(const_cast<float*>(send), send_count * sizeof(float));
      rbuf->recv(recv_peer, kPointToPointSlotBase + recv_tag);
      sbuf->send(send_peer, kPointToPointSlotBase + send_tag);
      Exchange("send-recv", sbuf.get(), send_peer, rbuf.get(), recv_peer);
      // A rank sending to itself moves nothing over a link.
      if (send_peer != rank()) stats_.Add(CollectiveKind::kSendRecv, send_count * sizeof(float));
    });
  }

  // Every peer's rows in flight at once, as gloo::alltoallv posts them, but over buffers this
  // communicator tracks, so that Abort() ends the wait (gloo::alltoallv's own are out of its
  // reach); the rows this rank keeps are the caller's to copy, as in the base class.
  absl::Status AllToAllV(const void* in, std::span<const int64_t> send_counts, void* out,
                         std::span<const int64_t> recv_counts, DType dtype, uint32_t tag) override {
    TY_RETURN_IF_ERROR(OnlyFloats(dtype));
    const int n = size(), me = rank();
    if (static_cast<int>(send_counts.size()) != n || static_cast<int>(recv_counts.size()) != n) {
      return absl::InvalidArgumentError("all-to-all needs one count per rank");
    }
    return Guard("all-to-all", [&] {
      std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> owned;
      Buffers sends, recvs;
      char* from = static_cast<char*>(const_cast<void*>(in));
      char* to = static_cast<char*>(out);
      int64_t sent = 0;
      for (int r = 0; r < n; ++r) {
        const int64_t send_bytes = send_counts[r] * sizeof(float);
        const int64_t recv_bytes = recv_counts[r] * sizeof(float);
        if (r != me && recv_bytes > 0) {
          owned.push_back(context_->createUnboundBuffer(to, recv_bytes));
          owned.back()->recv(r, kPointToPointSlotBase + tag);
          recvs.push_back(owned.back().get());
        }
        if (r != me && send_bytes > 0) {
          owned.push_back(context_->createUnboundBuffer(from, send_bytes));
          owned.back()->send(r, kPointToPointSlotBase + tag);
          sends.push_back(owned.back().get());
          sent += send_bytes;
        }
        from += send_bytes;
        to += recv_bytes;
      }
      ExchangeWithAll("all-to-all", sends, recvs);
      stats_.Add(CollectiveKind::kSendRecv, sent);
    });
  }

  bool StartsTransfers() const override { return true; }

  absl::StatusOr<std::unique_ptr<PendingTransfer>> StartSend(const void* data, int64_t count,
                                                             DType dtype, int peer,
                                                             uint32_t tag) override {
    TY_RETURN_IF_ERROR(OnlyFloats(dtype));
    return Start(/*send=*/true, const_cast<void*>(data), count, peer, tag);
  }
  absl::StatusOr<std::unique_ptr<PendingTransfer>> StartRecv(void* data, int64_t count, DType dtype,
                                                             int peer, uint32_t tag) override {
    TY_RETURN_IF_ERROR(OnlyFloats(dtype));
    return Start(/*send=*/false, data, count, peer, tag);
  }

  absl::Status Barrier() override {
    return Guard("barrier", [&] {
      gloo::BarrierOptions opts(context_);
      opts.setTimeout(timeout_);
      WaitRegistry::Scope wait = WaitFor("barrier", Others());
      gloo::barrier(opts);
    });
  }

  void Abort() override {
    aborted_.store(true);
    absl::MutexLock lock(&mu_);
    for (gloo::transport::UnboundBuffer* buf : in_flight_) {
      buf->abortWaitRecv();
      buf->abortWaitSend();
    }
  }

 private:
  // A send or receive posted on its own unbound buffer, waited for later; a send's bytes count
  // once it has finished.
  class Transfer final : public PendingTransfer {
   public:
    Transfer(GlooCommunicator* comm, std::unique_ptr<gloo::transport::UnboundBuffer> buf, bool send,
             int peer, int64_t bytes)
        : comm_(comm), buf_(std::move(buf)), send_(send), peer_(peer), bytes_(bytes) {}
    absl::Status Wait() override {
      const char* what = send_ ? "send" : "recv";
      return comm_->Guard(what, [&] {
        comm_->Track({buf_.get()});
        WaitRegistry::Scope wait = comm_->WaitFor(what, comm_->Peer(peer_));
        if (send_) {
          buf_->waitSend(comm_->timeout_);
        } else {
          buf_->waitRecv(comm_->timeout_);
        }
        comm_->Untrack();
        if (send_) comm_->stats_.Add(CollectiveKind::kSendRecv, bytes_);
      });
    }

   private:
    GlooCommunicator* comm_;
    std::unique_ptr<gloo::transport::UnboundBuffer> buf_;
    const bool send_;
    const int peer_;
    const int64_t bytes_;
  };

  static absl::Status OnlyFloats(DType dtype) {
    if (dtype == DType::kF32) return absl::OkStatus();
    return absl::UnimplementedError("gloo moves fp32 only (bf16 goes through host staging)");
  }

  // Posts a send or receive of `count` floats.
  absl::StatusOr<std::unique_ptr<PendingTransfer>> Start(bool send, void* data, int64_t count,
                                                         int peer, uint32_t tag) {
    std::unique_ptr<gloo::transport::UnboundBuffer> buf;
    TY_RETURN_IF_ERROR(Guard(send ? "send" : "recv", [&] {
      buf = context_->createUnboundBuffer(data, count * sizeof(float));
      if (send) {
        buf->send(peer, kPointToPointSlotBase + tag);
      } else {
        buf->recv(peer, kPointToPointSlotBase + tag);
      }
    }));
    return std::make_unique<Transfer>(this, std::move(buf), send, peer,
                                      count * static_cast<int64_t>(sizeof(float)));
  }

  // Boundaries of `parts` near-equal chunks of a buffer of `count` floats.
  struct Chunks {
    Chunks(int64_t count, int parts) : count(count), parts(parts) {}
    int64_t begin(int i) const { return count * i / parts; }
    int64_t size(int i) const { return begin(i + 1) - begin(i); }
    int64_t count;
    int parts;
  };
  // A buffer a ring collective works on, and its chunks.
  struct Region {
    float* data;
    Chunks chunks;
  };
  using Buffers = std::vector<gloo::transport::UnboundBuffer*>;

  int Mod(int i) const { return ((i % size()) + size()) % size(); }

  // After n−1 steps, chunk r of `data` on rank r holds the sum over ranks (in ring order
  // r+1, r+2, …, r): step s sends chunk r−s−1 to the next rank and adds chunk r−s−2 from the
  // previous one.
  absl::Status RingReduceScatter(float* data, const Chunks& chunks, CollectiveKind kind,
                                 const char* operation) {
    return Guard("reduce-scatter", [&] {
      const int n = size(), r = rank(), next = Mod(r + 1), prev = Mod(r - 1);
      int64_t max_chunk = 0;
      for (int i = 0; i < n; ++i) max_chunk = std::max(max_chunk, chunks.size(i));
      recv_.resize(std::max<int64_t>(max_chunk, 1));
      const uint64_t slot = context_->nextSlot(n);
      for (int s = 0; s < n - 1; ++s) {
        const int send_idx = Mod(r - s - 1), recv_idx = Mod(r - s - 2);
        float* send_ptr = data + chunks.begin(send_idx);
        auto sbuf = context_->createUnboundBuffer(send_ptr, chunks.size(send_idx) * sizeof(float));
        auto rbuf =
            context_->createUnboundBuffer(recv_.data(), chunks.size(recv_idx) * sizeof(float));
        rbuf->recv(prev, slot + s);
        sbuf->send(next, slot + s);
        Exchange(operation, sbuf.get(), next, rbuf.get(), prev);
        stats_.Add(kind, chunks.size(send_idx) * sizeof(float));
        float* acc = data + chunks.begin(recv_idx);
        for (int64_t i = 0; i < chunks.size(recv_idx); ++i) acc[i] = recv_[i] + acc[i];
      }
    });
  }

  // Two ranks swap their whole buffers in one step where the ring takes two: the same bytes, half
  // the latency, and on ranks sharing cores half the wake-ups. Each adds the peer's copy to its
  // own; a + b == b + a, so both hold the sums the ring would give, bit for bit.
  absl::Status PairAllReduce(float* data, int64_t count) {
    return Guard("all-reduce", [&] {
      const int peer = 1 - rank();
      recv_.resize(std::max<int64_t>(count, 1));
      const uint64_t slot = context_->nextSlot(1);
      auto sbuf = context_->createUnboundBuffer(data, count * sizeof(float));
      auto rbuf = context_->createUnboundBuffer(recv_.data(), count * sizeof(float));
      rbuf->recv(peer, slot);
      sbuf->send(peer, slot);
      Exchange("all-reduce", sbuf.get(), peer, rbuf.get(), peer);
      stats_.Add(CollectiveKind::kAllReduce, count * sizeof(float));
      for (int64_t i = 0; i < count; ++i) data[i] = recv_[i] + data[i];
    });
  }

  // Rank r starts with chunk r of each region complete; step s passes every region's chunk r−s on
  // to the next rank, all regions' exchanges in flight together.
  absl::Status RingAllGather(std::span<const Region> regions, CollectiveKind kind,
                             const char* operation) {
    return Guard("all-gather", [&] {
      const int n = size(), r = rank(), next = Mod(r + 1), prev = Mod(r - 1);
      const uint64_t slot = context_->nextSlot(static_cast<int>(regions.size()) * n);
      for (int s = 0; s < n - 1; ++s) {
        const int send_idx = Mod(r - s), recv_idx = Mod(r - s - 1);
        std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> owned;
        Buffers sends, recvs;
        for (size_t i = 0; i < regions.size(); ++i) {
          const Chunks& c = regions[i].chunks;
          float* data = regions[i].data;
          owned.push_back(context_->createUnboundBuffer(data + c.begin(recv_idx),
                                                        c.size(recv_idx) * sizeof(float)));
          recvs.push_back(owned.back().get());
          owned.push_back(context_->createUnboundBuffer(data + c.begin(send_idx),
                                                        c.size(send_idx) * sizeof(float)));
          sends.push_back(owned.back().get());
          recvs.back()->recv(prev, slot + i * n + s);
          sends.back()->send(next, slot + i * n + s);
        }
        ExchangeAll(operation, sends, next, recvs, prev);
        for (const Region& region : regions) {
          stats_.Add(kind, region.chunks.size(send_idx) * sizeof(float));
        }
      }
    });
  }

  // Waits for `recv` (from group rank `from`), then for `send` (to `to`).
  void Exchange(const char* operation, gloo::transport::UnboundBuffer* send, int to,
                gloo::transport::UnboundBuffer* recv, int from) {
    ExchangeAll(operation, {send}, to, {recv}, from);
  }

  // Waits for every receive (from group rank `from`), then for every send (to `to`).
  void ExchangeAll(const char* operation, const Buffers& sends, int to, const Buffers& recvs,
                   int from) {
    Buffers all = recvs;
    all.insert(all.end(), sends.begin(), sends.end());
    Track(std::move(all));
    {
      WaitRegistry::Scope wait = WaitFor(operation, Peer(from));
      for (gloo::transport::UnboundBuffer* b : recvs) b->waitRecv(timeout_);
    }
    {
      WaitRegistry::Scope wait = WaitFor(operation, Peer(to));
      for (gloo::transport::UnboundBuffer* b : sends) b->waitSend(timeout_);
    }
    Untrack();
  }

  // Waits for every receive, then for every send, each with any member of the group.
  void ExchangeWithAll(const char* operation, const Buffers& sends, const Buffers& recvs) {
    Buffers all = recvs;
    all.insert(all.end(), sends.begin(), sends.end());
    Track(std::move(all));
    {
      WaitRegistry::Scope wait = WaitFor(operation, Others());
      for (gloo::transport::UnboundBuffer* b : recvs) b->waitRecv(timeout_);
      for (gloo::transport::UnboundBuffer* b : sends) b->waitSend(timeout_);
    }
    Untrack();
  }

  // Global ranks of group rank `peer`, and of every other member.
  std::vector<int> Peer(int peer) const {
    return {members_.empty() ? peer : members_[static_cast<size_t>(peer)]};
  }
  std::vector<int> Others() const {
    std::vector<int> others;
    for (int r = 0; r < size(); ++r) {
      if (r != rank()) others.push_back(Peer(r)[0]);
    }
    return others;
  }
  WaitRegistry::Scope WaitFor(const char* operation, std::vector<int> peers) {
    if (waits_ == nullptr) return {};
    return waits_->Begin(operation, label_, std::move(peers));
  }

  void Track(Buffers bufs) {
    absl::MutexLock lock(&mu_);
    in_flight_ = std::move(bufs);
    // An Abort between Guard's check and here found nothing in flight: it must still reach these
    // buffers (gloo keeps an abort until the next wait takes it), or a wait runs to its timeout.
    if (aborted_.load()) {
      for (gloo::transport::UnboundBuffer* buf : in_flight_) {
        buf->abortWaitRecv();
        buf->abortWaitSend();
      }
    }
  }
  void Untrack() {
    absl::MutexLock lock(&mu_);
    in_flight_.clear();
  }

  // Runs a gloo operation, turning its exceptions into a Status: a timeout, or a connection a
  // peer closed or reset, is DEADLINE_EXCEEDED (a peer stopped taking part: exit code 3),
  // anything else UNAVAILABLE.
  template <typename Fn>
  absl::Status Guard(const char* what, Fn&& fn) {
    if (aborted_.load()) return absl::AbortedError(absl::StrCat(what, ": communicator aborted"));
    try {
      fn();
    } catch (const std::exception& e) {
      Untrack();
      if (aborted_.load()) return absl::AbortedError(absl::StrCat(what, ": communicator aborted"));
      const std::string message = e.what();
      if (message.find("imed out") != std::string::npos) {
        return absl::DeadlineExceededError(absl::StrCat(what, " timed out after ", timeout_.count(),
                                                        " ms: a peer stopped taking part (",
                                                        message, ")"));
      }
      if (message.find("by peer") != std::string::npos ||
          message.find("Broken pipe") != std::string::npos) {
        // A peer's end went away (it died): like a timeout, the fault is on another rank.
        return absl::DeadlineExceededError(
            absl::StrCat(what, " failed: a peer left (", message, ")"));
      }
      return absl::UnavailableError(absl::StrCat(what, " failed: ", message));
    }
    if (aborted_.load()) return absl::AbortedError(absl::StrCat(what, ": communicator aborted"));
    return absl::OkStatus();
  }

  std::shared_ptr<gloo::rendezvous::Context> context_;
  std::shared_ptr<gloo::transport::Device> device_;
  std::chrono::milliseconds timeout_;
  WaitRegistry* const waits_;
  const std::string label_;         // the group's axis, as waits name it
  const std::vector<int> members_;  // global rank of each group rank; empty: unknown
  std::vector<float> recv_, scratch_;
  std::atomic<bool> aborted_{false};
  absl::Mutex mu_;
  Buffers in_flight_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> ConnectGloo(KeyValueStore& store,
                                                          const std::string& group, int rank,
                                                          int size, const GlooOptions& options) {
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " outside group of ", size));
  }
  if (!options.members.empty() && static_cast<int>(options.members.size()) != size) {
    return absl::InvalidArgumentError(absl::StrCat("group '", group, "' of ", size, " ranks given ",
                                                   options.members.size(), " member ranks"));
  }
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = options.hostname;
    std::shared_ptr<gloo::transport::Device> device = gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
    context->setTimeout(options.timeout);
    StoreAdapter adapter(store, options.timeout);
    gloo::rendezvous::PrefixStore prefixed(group, adapter);
    context->connectFullMesh(prefixed, device);
    return std::unique_ptr<Communicator>(
        new GlooCommunicator(std::move(context), std::move(device), options.timeout, options.waits,
                             group.substr(0, group.find('.')), options.members));
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("connecting group '", group, "' as rank ", rank,
                                               " of ", size, ": ", e.what()));
  }
}

}  // namespace trainyard::worker::parallel
