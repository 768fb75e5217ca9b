// GPU communicators on one device.
//
// NCCL: a group of one rank, where every collective is an identity or a copy, through device
// and host buffers, in fp32 and bf16. (One GPU cannot host two ranks of one NCCL communicator
// reliably, so multi-rank GPU code is exercised through host staging instead.)
//
// Host staging: two ranks as threads sharing the device, each with its own Gloo connection and a
// CUDA copier, running every collective on device buffers against sums computed on the host.
#include "worker/parallel/nccl_communicator.h"

#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <functional>
#include <random>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/integration/test_env.h"
#include "worker/parallel/communicator.h"
#include "worker/parallel/cuda_device_copier.h"
#include "worker/parallel/kv_store.h"
#include "worker/parallel/staging_communicator.h"

namespace trainyard::worker::parallel {
namespace {

using std::chrono::milliseconds;
using testing::DeviceMemory;
using testing::Download;
using testing::RelativeError;
using testing::Tolerance;
using testing::Upload;

constexpr DType kTypes[] = {DType::kF32, DType::kBF16};
constexpr int64_t kCounts[] = {1, 37, 4099};

// Rank `rank`'s input of `count` values (bf16-representable when `dtype` is bf16), the same on
// every thread that asks.
std::vector<float> Input(int rank, int64_t count, DType dtype, int salt = 0) {
  std::mt19937 rng(1000 * rank + 7 * salt + static_cast<int>(count));
  std::vector<float> v = testing::RandomVector(count, rng);
  if (dtype == DType::kBF16) testing::RoundToBf16(v);
  return v;
}

// A stream for the calling thread's work on device 0, destroyed with the object.
class Stream {
 public:
  Stream() {
    cudaSetDevice(0);
    cudaStreamCreate(&stream_);
  }
  ~Stream() {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

class NcclSingleRankTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testenv::MakeScratchDir("nccl");
    store_ = MakeFileKeyValueStore(dir_.string());
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  std::unique_ptr<Communicator> Connect() {
    absl::StatusOr<std::unique_ptr<Communicator>> comm =
        ConnectNccl(*store_, "solo", 0, 1, stream_.get(), milliseconds(30000));
    EXPECT_TRUE(comm.ok()) << comm.status();
    return comm.ok() ? std::move(*comm) : nullptr;
  }

  std::filesystem::path dir_;
  std::unique_ptr<KeyValueStore> store_;
  Stream stream_;
};

TEST_F(NcclSingleRankTest, CollectivesOnDeviceBuffersAreIdentitiesAndCopies) {
  TY_SKIP_WITHOUT_GPU();
  std::unique_ptr<Communicator> comm = Connect();
  ASSERT_NE(comm, nullptr);
  EXPECT_EQ(comm->rank(), 0);
  EXPECT_EQ(comm->size(), 1);
  for (DType dtype : kTypes) {
    for (int64_t n : kCounts) {
      SCOPED_TRACE(std::string(DTypeName(dtype)) + " n=" + std::to_string(n));
      const std::vector<float> x = Input(0, n, dtype);
      DeviceMemory a(n * DTypeBytes(dtype)), b(n * DTypeBytes(dtype));

      a.Poison();
      Upload(x, dtype, a.get());
      ASSERT_TRUE(comm->AllReduce(a.get(), n, dtype).ok());
      EXPECT_EQ(Download(a.get(), n, dtype), x) << "all-reduce";

      b.Poison();
      ASSERT_TRUE(comm->ReduceScatter(a.get(), b.get(), n, dtype).ok());
      EXPECT_EQ(Download(b.get(), n, dtype), x) << "reduce-scatter";

      b.Poison();
      ASSERT_TRUE(comm->AllGather(a.get(), b.get(), n, dtype).ok());
      EXPECT_EQ(Download(b.get(), n, dtype), x) << "all-gather";

      b.Poison();
      ASSERT_TRUE(comm->SendRecv(a.get(), n, 0, 1, b.get(), n, 0, 1, dtype).ok());
      EXPECT_EQ(Download(b.get(), n, dtype), x) << "send-recv to itself";

      if (dtype == DType::kF32) {
        ASSERT_TRUE(comm->Broadcast(a.as<float>(), n, 0).ok());
        EXPECT_EQ(Download(a.get(), n, dtype), x) << "broadcast";
      }
    }
  }
  EXPECT_TRUE(comm->Barrier().ok());
  EXPECT_EQ(comm->stats().total(), 0) << "a group of one sends nothing";
}

// A started exchange (ring attention's hop) runs after the work its producer stream had queued
// when it started, and its Wait returns once the data has arrived.
TEST_F(NcclSingleRankTest, StartedExchangeFollowsTheProducersWork) {
  TY_SKIP_WITHOUT_GPU();
  std::unique_ptr<Communicator> comm = Connect();
  ASSERT_NE(comm, nullptr);
  ASSERT_TRUE(comm->StartsExchanges());
  DeviceMemory near(int64_t{64} << 20), far(int64_t{64} << 20);
  for (DType dtype : kTypes) {
    SCOPED_TRACE(DTypeName(dtype));
    const int64_t n = 4099, bytes = n * DTypeBytes(dtype);
    const std::vector<float> x = Input(0, n, dtype, /*salt=*/4);
    DeviceMemory source(bytes), a(bytes), b(bytes);
    Upload(x, dtype, source.get());
    a.Poison();
    b.Poison();
    // The producer writes `a` (queued, not waited for) behind some 10 ms of other copies, a
    // window in which an exchange that did not wait for it would read the poison; the exchange
    // sends `a` to itself.
    for (int i = 0; i < 100; ++i) {
      ASSERT_EQ(cudaMemcpyAsync(i % 2 ? far.get() : near.get(), i % 2 ? near.get() : far.get(),
                                far.bytes(), cudaMemcpyDeviceToDevice, stream_.get()),
                cudaSuccess);
    }
    ASSERT_EQ(
        cudaMemcpyAsync(a.get(), source.get(), bytes, cudaMemcpyDeviceToDevice, stream_.get()),
        cudaSuccess);
    auto pending = comm->StartExchange(a.get(), n, 0, 3, b.get(), n, 0, 3, dtype);
    ASSERT_TRUE(pending.ok()) << pending.status();
    ASSERT_TRUE((*pending)->Wait().ok());
    EXPECT_EQ(Download(b.get(), n, dtype), x);
  }
  EXPECT_EQ(comm->stats().total(), 0) << "an exchange with itself sends nothing";
}

TEST_F(NcclSingleRankTest, HostBuffersAreStagedThroughTheDevice) {
  TY_SKIP_WITHOUT_GPU();
  std::unique_ptr<Communicator> comm = Connect();
  ASSERT_NE(comm, nullptr);
  const std::vector<float> x = Input(0, 37, DType::kF32);
  std::vector<float> host = x;
  ASSERT_TRUE(comm->AllReduce(host.data(), 37).ok());
  EXPECT_EQ(host, x);
  // Host in, device out, and the reverse.
  DeviceMemory d(37 * sizeof(float));
  ASSERT_TRUE(comm->AllGather(x.data(), d.as<float>(), 37).ok());
  EXPECT_EQ(Download(d.get(), 37, DType::kF32), x);
  std::vector<float> back(37, -1.0f);
  ASSERT_TRUE(comm->ReduceScatter(d.as<float>(), back.data(), 37).ok());
  EXPECT_EQ(back, x);
}

TEST_F(NcclSingleRankTest, BadArgumentsAndAbort) {
  TY_SKIP_WITHOUT_GPU();
  std::unique_ptr<Communicator> comm = Connect();
  ASSERT_NE(comm, nullptr);
  DeviceMemory d(16 * sizeof(float));
  // A lone send to itself could never complete; a peer outside the group does not exist.
  EXPECT_EQ(comm->Send(d.get(), 4, DType::kF32, 0, 0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(comm->Recv(d.get(), 4, DType::kBF16, 1, 0).code(), absl::StatusCode::kInvalidArgument);
  // Refused arguments leave the communicator usable.
  EXPECT_TRUE(comm->AllReduce(d.get(), 4, DType::kF32).ok());
  comm->Abort();
  EXPECT_EQ(comm->AllReduce(d.get(), 4, DType::kF32).code(), absl::StatusCode::kAborted);
  EXPECT_EQ(comm->Barrier().code(), absl::StatusCode::kAborted);
}

TEST_F(NcclSingleRankTest, MissingUniqueIdTimesOut) {
  TY_SKIP_WITHOUT_GPU();
  // Rank 1 of 2 waits for an id that rank 0 never publishes.
  absl::StatusOr<std::unique_ptr<Communicator>> comm =
      ConnectNccl(*store_, "nobody", 1, 2, stream_.get(), milliseconds(300));
  EXPECT_EQ(comm.status().code(), absl::StatusCode::kDeadlineExceeded) << comm.status();
}

// Runs body(rank, communicator, stream) on two threads sharing device 0, each with a staging
// communicator over Gloo and a CUDA copier on its own stream. Ranks stay connected until both
// bodies have returned.
void RunStagedPair(const std::function<void(int, Communicator&)>& body) {
  constexpr int kWorld = 2;
  const std::filesystem::path dir = testenv::MakeScratchDir("staged");
  std::unique_ptr<KeyValueStore> store = MakeFileKeyValueStore(dir.string());
  std::atomic<int> finished{0};
  auto finish_and_wait = [&] {
    finished.fetch_add(1);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(1);
    while (finished.load() < kWorld && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(milliseconds(2));
    }
  };
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorld; ++r) {
    threads.emplace_back([&, r] {
      Stream stream;
      absl::StatusOr<std::unique_ptr<Communicator>> gloo =
          ConnectGloo(*store, "pair", r, kWorld, GlooOptions{});
      if (!gloo.ok()) {
        ADD_FAILURE() << "rank " << r << ": " << gloo.status();
        finish_and_wait();
        return;
      }
      std::unique_ptr<Communicator> comm =
          MakeStagingCommunicator(std::move(*gloo), MakeCudaDeviceCopier(stream.get()));
      body(r, *comm);
      finish_and_wait();
    });
  }
  for (auto& t : threads) t.join();
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

TEST(StagedGpuPairTest, CollectivesOnDeviceBuffersMatchHostSums) {
  TY_SKIP_WITHOUT_GPU();
  constexpr int kWorld = 2;
  RunStagedPair([&](int rank, Communicator& comm) {
    for (DType dtype : kTypes) {
      for (int64_t n : kCounts) {
        SCOPED_TRACE(std::string(DTypeName(dtype)) + " n=" + std::to_string(n) + " rank " +
                     std::to_string(rank));
        const int64_t elem = DTypeBytes(dtype);

        // All-reduce: the element-wise sum of both ranks' inputs.
        std::vector<float> want(n, 0.0f);
        for (int q = 0; q < kWorld; ++q) {
          const std::vector<float> x = Input(q, n, dtype);
          for (int64_t i = 0; i < n; ++i) want[i] += x[i];
        }
        DeviceMemory data(n * elem);
        data.Poison();
        Upload(Input(rank, n, dtype), dtype, data.get());
        ASSERT_TRUE(comm.AllReduce(data.get(), n, dtype).ok());
        EXPECT_LE(RelativeError(Download(data.get(), n, dtype), want), Tolerance(dtype))
            << "all-reduce";

        // Reduce-scatter: slice `rank` of the sum of both ranks' 2n inputs.
        std::vector<float> slice(n, 0.0f);
        for (int q = 0; q < kWorld; ++q) {
          const std::vector<float> x = Input(q, kWorld * n, dtype, /*salt=*/1);
          for (int64_t i = 0; i < n; ++i) slice[i] += x[rank * n + i];
        }
        DeviceMemory in(kWorld * n * elem), out(n * elem);
        in.Poison();
        out.Poison();
        Upload(Input(rank, kWorld * n, dtype, /*salt=*/1), dtype, in.get());
        ASSERT_TRUE(comm.ReduceScatter(in.get(), out.get(), n, dtype).ok());
        EXPECT_LE(RelativeError(Download(out.get(), n, dtype), slice), Tolerance(dtype))
            << "reduce-scatter";

        // All-gather: both ranks' inputs in rank order, exactly.
        std::vector<float> gathered;
        for (int q = 0; q < kWorld; ++q) {
          const std::vector<float> x = Input(q, n, dtype, /*salt=*/2);
          gathered.insert(gathered.end(), x.begin(), x.end());
        }
        DeviceMemory mine(n * elem), all(kWorld * n * elem);
        mine.Poison();
        all.Poison();
        Upload(Input(rank, n, dtype, /*salt=*/2), dtype, mine.get());
        ASSERT_TRUE(comm.AllGather(mine.get(), all.get(), n, dtype).ok());
        EXPECT_EQ(Download(all.get(), kWorld * n, dtype), gathered) << "all-gather";

        // Send-recv: each rank sends n + rank values to the other, exactly.
        const int peer = 1 - rank;
        DeviceMemory send((n + rank) * elem), recv((n + peer) * elem);
        send.Poison();
        recv.Poison();
        Upload(Input(rank, n + rank, dtype, /*salt=*/3), dtype, send.get());
        ASSERT_TRUE(
            comm.SendRecv(send.get(), n + rank, peer, 5, recv.get(), n + peer, peer, 5, dtype)
                .ok());
        EXPECT_EQ(Download(recv.get(), n + peer, dtype), Input(peer, n + peer, dtype, 3))
            << "send-recv";

        // The same as a started exchange (staged now, moved while the caller goes on, stored in
        // Wait).
        ASSERT_TRUE(comm.StartsExchanges());
        recv.Poison();
        auto pending =
            comm.StartExchange(send.get(), n + rank, peer, 6, recv.get(), n + peer, peer, 6, dtype);
        ASSERT_TRUE(pending.ok()) << pending.status();
        ASSERT_TRUE((*pending)->Wait().ok());
        EXPECT_EQ(Download(recv.get(), n + peer, dtype), Input(peer, n + peer, dtype, 3))
            << "started exchange";
      }
    }
  });
}

}  // namespace
}  // namespace trainyard::worker::parallel
