#include "worker/parallel/communicator.h"

#include <algorithm>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace trainyard::worker::parallel {

absl::StatusOr<std::unique_ptr<PendingTransfer>> Communicator::StartSend(const void*, int64_t,
                                                                         DType, int, uint32_t) {
  return absl::UnimplementedError(absl::StrCat(engine(), " does not start transfers"));
}

absl::StatusOr<std::unique_ptr<PendingTransfer>> Communicator::StartRecv(void*, int64_t, DType, int,
                                                                         uint32_t) {
  return absl::UnimplementedError(absl::StrCat(engine(), " does not start transfers"));
}

namespace {

// A started send and receive, finished together; the receive first, as a ring's hop needs it.
class PendingPair final : public PendingTransfer {
 public:
  PendingPair(std::unique_ptr<PendingTransfer> recv, std::unique_ptr<PendingTransfer> send)
      : recv_(std::move(recv)), send_(std::move(send)) {}
  absl::Status Wait() override {
    TY_RETURN_IF_ERROR(recv_->Wait());  // on failure the send is abandoned with this transfer
    return send_->Wait();
  }

 private:
  std::unique_ptr<PendingTransfer> recv_, send_;
};

class Finished final : public PendingTransfer {
 public:
  absl::Status Wait() override { return absl::OkStatus(); }
};

}  // namespace

absl::StatusOr<std::unique_ptr<PendingTransfer>> Communicator::StartExchange(
    const void* send, int64_t send_count, int send_peer, uint32_t send_tag, void* recv,
    int64_t recv_count, int recv_peer, uint32_t recv_tag, DType dtype) {
  if (!StartsTransfers()) {
    TY_RETURN_IF_ERROR(SendRecv(send, send_count, send_peer, send_tag, recv, recv_count, recv_peer,
                                recv_tag, dtype));
    return std::unique_ptr<PendingTransfer>(std::make_unique<Finished>());
  }
  TY_ASSIGN_OR_RETURN(std::unique_ptr<PendingTransfer> received,
                      StartRecv(recv, recv_count, dtype, recv_peer, recv_tag));
  TY_ASSIGN_OR_RETURN(std::unique_ptr<PendingTransfer> sent,
                      StartSend(send, send_count, dtype, send_peer, send_tag));
  return std::unique_ptr<PendingTransfer>(
      std::make_unique<PendingPair>(std::move(received), std::move(sent)));
}

int64_t CommStats::total() const {
  int64_t t = 0;
  for (const auto& s : sent_) t += s.load(std::memory_order_relaxed);
  return t;
}

void CommStats::Reset() {
  for (auto& s : sent_) s.store(0, std::memory_order_relaxed);
}

namespace {

absl::Status UnsupportedType(const Communicator& comm, const char* op, DType dtype) {
  return absl::UnimplementedError(absl::StrCat(
      op, " of ", DTypeName(dtype), " is not supported by the ", comm.engine(), " communicator"));
}

}  // namespace

absl::Status Communicator::AllReduce(void* data, int64_t count, DType dtype) {
  if (dtype != DType::kF32) return UnsupportedType(*this, "all-reduce", dtype);
  return AllReduce(static_cast<float*>(data), count);
}

absl::Status Communicator::ReduceScatter(const void* in, void* out, int64_t count, DType dtype) {
  if (dtype != DType::kF32) return UnsupportedType(*this, "reduce-scatter", dtype);
  return ReduceScatter(static_cast<const float*>(in), static_cast<float*>(out), count);
}

absl::Status Communicator::AllGather(const void* in, void* out, int64_t count, DType dtype) {
  if (dtype != DType::kF32) return UnsupportedType(*this, "all-gather", dtype);
  return AllGather(static_cast<const float*>(in), static_cast<float*>(out), count);
}

absl::Status Communicator::AllGatherMany(std::span<const GatherPart> parts) {
  for (const GatherPart& p : parts) TY_RETURN_IF_ERROR(AllGather(p.in, p.out, p.count));
  return absl::OkStatus();
}

absl::Status Communicator::Send(const void* data, int64_t count, DType dtype, int peer,
                                uint32_t tag) {
  if (dtype != DType::kF32) return UnsupportedType(*this, "send", dtype);
  return Send(static_cast<const float*>(data), count, peer, tag);
}

absl::Status Communicator::Recv(void* data, int64_t count, DType dtype, int peer, uint32_t tag) {
  if (dtype != DType::kF32) return UnsupportedType(*this, "recv", dtype);
  return Recv(static_cast<float*>(data), count, peer, tag);
}

absl::Status Communicator::SendRecv(const void* send, int64_t send_count, int send_peer,
                                    uint32_t send_tag, void* recv, int64_t recv_count,
                                    int recv_peer, uint32_t recv_tag, DType dtype) {
  if (dtype != DType::kF32) return UnsupportedType(*this, "send-recv", dtype);
  return SendRecv(static_cast<const float*>(send), send_count, send_peer, send_tag,
                  static_cast<float*>(recv), recv_count, recv_peer, recv_tag);
}

absl::Status Communicator::AllToAllV(const void* in, std::span<const int64_t> send_counts,
                                     void* out, std::span<const int64_t> recv_counts, DType dtype,
                                     uint32_t tag) {
  const int n = size(), me = rank();
  if (static_cast<int>(send_counts.size()) != n || static_cast<int>(recv_counts.size()) != n) {
    return absl::InvalidArgumentError("all-to-all needs one count per rank");
  }
  const int64_t bytes = DTypeBytes(dtype);
  std::vector<int64_t> send_at(n + 1, 0), recv_at(n + 1, 0);
  for (int r = 0; r < n; ++r) {
    send_at[r + 1] = send_at[r] + send_counts[r];
    recv_at[r + 1] = recv_at[r] + recv_counts[r];
  }
  const char* from = static_cast<const char*>(in);
  char* to = static_cast<char*>(out);
  for (int k = 1; k < n; ++k) {
    const int dst = (me + k) % n, src = (me - k + n) % n;
    const int64_t send = send_counts[dst], recv = recv_counts[src];
    const void* send_data = from + send_at[dst] * bytes;
    void* recv_data = to + recv_at[src] * bytes;
    if (send > 0 && recv > 0) {
      TY_RETURN_IF_ERROR(SendRecv(send_data, send, dst, tag, recv_data, recv, src, tag, dtype));
    } else if (send > 0) {
      TY_RETURN_IF_ERROR(Send(send_data, send, dtype, dst, tag));
    } else if (recv > 0) {
      TY_RETURN_IF_ERROR(Recv(recv_data, recv, dtype, src, tag));
    }
  }
  return absl::OkStatus();
}

namespace {

class SelfCommunicator final : public Communicator {
 public:
  using Communicator::AllGather;
  using Communicator::AllReduce;
  using Communicator::Recv;
  using Communicator::ReduceScatter;
  using Communicator::Send;
  using Communicator::SendRecv;

  const char* engine() const override { return "self"; }
  int rank() const override { return 0; }
  int size() const override { return 1; }
  absl::Status AllReduce(float*, int64_t) override { return Check(); }
  absl::Status ReduceScatter(const float* in, float* out, int64_t count) override {
    if (in != out) std::copy_n(in, count, out);
    return Check();
  }
  absl::Status AllGather(const float* in, float* out, int64_t count) override {
    if (in != out) std::copy_n(in, count, out);
    return Check();
  }
  absl::Status Broadcast(float*, int64_t, int) override { return Check(); }
  absl::Status Send(const float*, int64_t, int peer, uint32_t) override {
    return absl::InvalidArgumentError(absl::StrCat("send to rank ", peer, " in a group of one"));
  }
  absl::Status Recv(float*, int64_t, int peer, uint32_t) override {
    return absl::InvalidArgumentError(absl::StrCat("recv from rank ", peer, " in a group of one"));
  }
  absl::Status SendRecv(const float*, int64_t, int peer, uint32_t, float*, int64_t, int,
                        uint32_t) override {
    return absl::InvalidArgumentError(absl::StrCat("send to rank ", peer, " in a group of one"));
  }
  absl::Status Barrier() override { return Check(); }
  void Abort() override { aborted_ = true; }

 private:
  absl::Status Check() const {
    return aborted_ ? absl::AbortedError("communicator aborted") : absl::OkStatus();
  }
  bool aborted_ = false;
};

}  // namespace

absl::StatusOr<double> AllReduceDouble(Communicator& group, double value) {
  if (group.size() == 1) return value;
  float parts[2];
  ToFloatPair(value, parts);
  if (absl::Status s = group.AllReduce(parts, 2); !s.ok()) return s;
  return FromFloatPair(parts);
}

absl::Status AllReduceDoubles(Communicator& group, std::span<double> values) {
  if (group.size() == 1 || values.empty()) return absl::OkStatus();
  std::vector<float> parts(2 * values.size());
  for (size_t i = 0; i < values.size(); ++i) ToFloatPair(values[i], &parts[2 * i]);
  TY_RETURN_IF_ERROR(group.AllReduce(parts.data(), static_cast<int64_t>(parts.size())));
  for (size_t i = 0; i < values.size(); ++i) values[i] = FromFloatPair(&parts[2 * i]);
  return absl::OkStatus();
}

std::unique_ptr<Communicator> MakeSelfCommunicator() {
  return std::make_unique<SelfCommunicator>();
}

}  // namespace trainyard::worker::parallel
