#include "worker/parallel/staging_communicator.h"

#include <array>
#include <atomic>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/bf16.h"
#include "common/status.h"

namespace trainyard::worker::parallel {
namespace {

class HostCopier final : public DeviceCopier {
 public:
  explicit HostCopier(bool all_device) : all_device_(all_device) {}
  absl::Status CopyToHost(void* host, const void* device, int64_t bytes) override {
    if (bytes > 0) std::memcpy(host, device, bytes);
    return absl::OkStatus();
  }
  absl::Status CopyToDevice(void* device, const void* host, int64_t bytes) override {
    if (bytes > 0) std::memcpy(device, host, bytes);
    return absl::OkStatus();
  }
  bool IsDevicePointer(const void*) const override { return all_device_; }

 private:
  const bool all_device_;
};

class StagingCommunicator final : public TypedCommunicator {
 public:
  StagingCommunicator(std::unique_ptr<Communicator> inner, std::unique_ptr<DeviceCopier> copier)
      : inner_(std::move(inner)),
        copier_(std::move(copier)),
        name_(absl::StrCat(inner_->engine(), " over host staging")) {}

  const char* engine() const override { return name_.c_str(); }
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }

  absl::Status AllReduce(void* data, int64_t count, DType dtype) override {
    return Run([&]() -> absl::Status {
      TY_ASSIGN_OR_RETURN(float* host, Load(data, count, dtype, first_));
      TY_RETURN_IF_ERROR(inner_->AllReduce(host, count));
      return Store(host, data, count, dtype);
    });
  }

  absl::Status ReduceScatter(const void* in, void* out, int64_t count, DType dtype) override {
    return Run([&]() -> absl::Status {
      TY_ASSIGN_OR_RETURN(float* host_in, Load(in, count * size(), dtype, first_));
      float* host_out = Target(out, count, dtype, second_);
      TY_RETURN_IF_ERROR(inner_->ReduceScatter(host_in, host_out, count));
      return Store(host_out, out, count, dtype);
    });
  }

  absl::Status AllGather(const void* in, void* out, int64_t count, DType dtype) override {
    return Run([&]() -> absl::Status {
      TY_ASSIGN_OR_RETURN(float* host_in, Load(in, count, dtype, first_));
      float* host_out = Target(out, count * size(), dtype, second_);
      TY_RETURN_IF_ERROR(inner_->AllGather(host_in, host_out, count));
      return Store(host_out, out, count * size(), dtype);
    });
  }

  absl::Status Broadcast(float* data, int64_t count, int root) override {
    return Run([&]() -> absl::Status {
      TY_ASSIGN_OR_RETURN(float* host, Load(data, count, DType::kF32, first_));
      TY_RETURN_IF_ERROR(inner_->Broadcast(host, count, root));
      return Store(host, data, count, DType::kF32);
    });
  }

  absl::Status Send(const void* data, int64_t count, DType dtype, int peer, uint32_t tag) override {
    return Run([&]() -> absl::Status {
      TY_ASSIGN_OR_RETURN(float* host, Load(data, count, dtype, first_));
      return inner_->Send(host, count, peer, tag);
    });
  }

  absl::Status Recv(void* data, int64_t count, DType dtype, int peer, uint32_t tag) override {
    return Run([&]() -> absl::Status {
      float* host = Target(data, count, dtype, first_);
      TY_RETURN_IF_ERROR(inner_->Recv(host, count, peer, tag));
      return Store(host, data, count, dtype);
    });
  }

  absl::Status SendRecv(const void* send, int64_t send_count, int send_peer, uint32_t send_tag,
                        void* recv, int64_t recv_count, int recv_peer, uint32_t recv_tag,
                        DType dtype) override {
    return Run([&]() -> absl::Status {
      TY_ASSIGN_OR_RETURN(float* host_send, Load(send, send_count, dtype, first_));
      float* host_recv = Target(recv, recv_count, dtype, second_);
      TY_RETURN_IF_ERROR(inner_->SendRecv(host_send, send_count, send_peer, send_tag, host_recv,
                                          recv_count, recv_peer, recv_tag));
      return Store(host_recv, recv, recv_count, dtype);
    });
  }

  // Transfers are started when the engine starts them: a send's data is staged now (the copier
  // waits for the work that wrote it), the engine moves it while the caller computes, and a
  // receive's data reaches its buffer in Wait. Each transfer stages through its own buffer.
  bool StartsTransfers() const override { return inner_->StartsTransfers(); }

  absl::StatusOr<std::unique_ptr<PendingTransfer>> StartSend(const void* data, int64_t count,
                                                             DType dtype, int peer,
                                                             uint32_t tag) override {
    auto transfer = std::make_unique<Transfer>(this, nullptr, count, dtype);
    TY_RETURN_IF_ERROR(Run([&]() -> absl::Status {
      TY_ASSIGN_OR_RETURN(float* host, Load(data, count, dtype, transfer->staging));
      TY_ASSIGN_OR_RETURN(transfer->inner, inner_->StartSend(host, count, DType::kF32, peer, tag));
      return absl::OkStatus();
    }));
    return std::unique_ptr<PendingTransfer>(std::move(transfer));
  }

  absl::StatusOr<std::unique_ptr<PendingTransfer>> StartRecv(void* data, int64_t count, DType dtype,
                                                             int peer, uint32_t tag) override {
    auto transfer = std::make_unique<Transfer>(this, data, count, dtype);
    TY_RETURN_IF_ERROR(Run([&]() -> absl::Status {
      transfer->host = Target(data, count, dtype, transfer->staging);
      TY_ASSIGN_OR_RETURN(transfer->inner,
                          inner_->StartRecv(transfer->host, count, DType::kF32, peer, tag));
      return absl::OkStatus();
    }));
    return std::unique_ptr<PendingTransfer>(std::move(transfer));
  }

  absl::Status Barrier() override {
    return Run([&] { return inner_->Barrier(); });
  }

  void Abort() override {
    aborted_.store(true);
    inner_->Abort();
  }

 private:
  // A started send or receive: the inner engine's transfer, the fp32 host buffer it uses, and for
  // a receive the caller's buffer that Wait stores the result into.
  class Transfer final : public PendingTransfer {
   public:
    Transfer(StagingCommunicator* comm, void* recv, int64_t count, DType dtype)
        : comm_(comm), recv_(recv), count_(count), dtype_(dtype) {}
    absl::Status Wait() override {
      return comm_->Run([&]() -> absl::Status {
        TY_RETURN_IF_ERROR(inner->Wait());
        return recv_ == nullptr ? absl::OkStatus() : comm_->Store(host, recv_, count_, dtype_);
      });
    }

    // Declared before `inner`, so that an abandoned transfer (destroyed unwaited) outlives the
    // engine's hold on it.
    std::vector<float> staging;  // where `host` points unless the buffer was used in place
    float* host = nullptr;       // a receive's fp32 target
    std::unique_ptr<PendingTransfer> inner;

   private:
    StagingCommunicator* comm_;
    void* recv_;
    int64_t count_;
    DType dtype_;
  };

  // The engine reads and writes host fp32 buffers in place; anything else goes through staging.
  bool Direct(const void* ptr, DType dtype) const {
    return dtype == DType::kF32 && !copier_->IsDevicePointer(ptr);
  }

  // An fp32 host copy of `count` elements at `ptr` (in `staging`), or `ptr` itself when Direct.
  absl::StatusOr<float*> Load(const void* ptr, int64_t count, DType dtype,
                              std::vector<float>& staging) {
    if (Direct(ptr, dtype)) return const_cast<float*>(static_cast<const float*>(ptr));
    staging.resize(count);
    if (dtype == DType::kF32) {
      TY_RETURN_IF_ERROR(copier_->CopyToHost(staging.data(), ptr, count * sizeof(float)));
      return staging.data();
    }
    const uint16_t* bits = static_cast<const uint16_t*>(ptr);
    if (copier_->IsDevicePointer(ptr)) {
      bits_.resize(count);
      TY_RETURN_IF_ERROR(copier_->CopyToHost(bits_.data(), ptr, count * sizeof(uint16_t)));
      bits = bits_.data();
    }
    for (int64_t i = 0; i < count; ++i) staging[i] = Bf16BitsToFloat(bits[i]);
    return staging.data();
  }

  // Where the engine writes `count` fp32 results meant for `ptr`: `ptr` itself when Direct.
  float* Target(void* ptr, int64_t count, DType dtype, std::vector<float>& staging) {
    if (Direct(ptr, dtype)) return static_cast<float*>(ptr);
    staging.resize(count);
    return staging.data();
  }

  // Moves results from `host` (a Load or Target buffer) to `ptr`, rounding to bf16 if need be.
  absl::Status Store(const float* host, void* ptr, int64_t count, DType dtype) {
    if (host == ptr) return absl::OkStatus();
    const bool device = copier_->IsDevicePointer(ptr);
    if (dtype == DType::kF32) {
      if (device) return copier_->CopyToDevice(ptr, host, count * sizeof(float));
      if (count > 0) std::memcpy(ptr, host, count * sizeof(float));
      return absl::OkStatus();
    }
    uint16_t* bits = static_cast<uint16_t*>(ptr);
    if (device) {
      bits_.resize(count);
      bits = bits_.data();
    }
    for (int64_t i = 0; i < count; ++i) bits[i] = FloatToBf16Bits(host[i]);
    if (device) return copier_->CopyToDevice(ptr, bits, count * sizeof(uint16_t));
    return absl::OkStatus();
  }

  // Runs one operation unless aborted, then carries the inner engine's new bytes into stats_.
  template <typename Fn>
  absl::Status Run(Fn&& op) {
    if (aborted_.load()) {
      return absl::AbortedError(absl::StrCat(name_, ": communicator aborted"));
    }
    absl::Status status = op();
    for (int k = 0; k < static_cast<int>(CollectiveKind::kCount); ++k) {
      const auto kind = static_cast<CollectiveKind>(k);
      const int64_t total = inner_->stats().bytes_sent(kind);
      stats_.Add(kind, total - carried_[k]);
      carried_[k] = total;
    }
    return status;
  }

  std::unique_ptr<Communicator> inner_;
  std::unique_ptr<DeviceCopier> copier_;
  const std::string name_;
  std::atomic<bool> aborted_{false};
  // Staging buffers, reused across operations (only the issuing thread touches them).
  std::vector<float> first_, second_;
  std::vector<uint16_t> bits_;
  // The inner engine's byte counts already added to stats_.
  std::array<int64_t, static_cast<int>(CollectiveKind::kCount)> carried_{};
};

}  // namespace

std::unique_ptr<DeviceCopier> MakeHostCopier(bool all_device) {
  return std::make_unique<HostCopier>(all_device);
}

std::unique_ptr<Communicator> MakeStagingCommunicator(std::unique_ptr<Communicator> inner,
                                                      std::unique_ptr<DeviceCopier> copier) {
  return std::make_unique<StagingCommunicator>(std::move(inner), std::move(copier));
}

}  // namespace trainyard::worker::parallel
