// The host-staging communicator over Gloo, with ranks as threads of this process (each its own
// Gloo context over loopback TCP, meeting through a file rendezvous store). A host copier that
// calls every buffer device memory drives every staging path: copies in and out, bf16 widened
// to fp32 and rounded back. The Gloo communicator's batched all-gather and its all-to-all are
// checked bare here too.
//
// Inputs are small multiples of 1/4, so every sum is exact in fp32 and in bf16 and the expected
// results are exact: any difference is a bug, not rounding. One case checks that bf16 sums are
// accumulated in fp32 and rounded once, to nearest even.
#include "worker/parallel/staging_communicator.h"

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/bf16.h"
#include "gtest/gtest.h"
#include "tests/integration/test_env.h"
#include "worker/parallel/communicator.h"
#include "worker/parallel/kv_store.h"

namespace trainyard::worker::parallel {
namespace {

using std::chrono::milliseconds;

// Runs body(rank, communicator) on `world` threads, each holding a staging communicator over
// its own Gloo connection (or, not `staged`, the Gloo communicator itself). Every rank keeps its
// connection open until all bodies have returned (or a minute has passed), so that an early
// finisher cannot break a peer's operation.
void RunGroup(int world, const std::function<void(int, Communicator&)>& body,
              bool all_device = true, milliseconds timeout = milliseconds(30000),
              bool staged = true) {
  const std::filesystem::path dir = testenv::MakeScratchDir("staging");
  std::unique_ptr<KeyValueStore> store = MakeFileKeyValueStore(dir.string());
  std::atomic<int> finished{0};
  auto finish_and_wait = [&] {
    finished.fetch_add(1);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(1);
    while (finished.load() < world && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(milliseconds(2));
    }
  };
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      GlooOptions options;
      options.timeout = timeout;
      absl::StatusOr<std::unique_ptr<Communicator>> gloo =
          ConnectGloo(*store, "group", r, world, options);
      if (!gloo.ok()) {
        ADD_FAILURE() << "rank " << r << ": " << gloo.status();
        finish_and_wait();
        return;
      }
      std::unique_ptr<Communicator> comm =
          staged ? MakeStagingCommunicator(std::move(*gloo), MakeHostCopier(all_device))
                 : std::move(*gloo);
      body(r, *comm);
      finish_and_wait();
    });
  }
  for (auto& t : threads) t.join();
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

// Raised once by one rank thread, awaited by another (for at most a minute, so that a failed
// rank cannot hang the test).
class Flag {
 public:
  void Raise() { raised_.store(true); }
  void Await() const {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(1);
    while (!raised_.load() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(milliseconds(5));
    }
  }

 private:
  std::atomic<bool> raised_{false};
};

// Rank r's j-th input: a multiple of 1/4 below 10 in magnitude, exact in bf16, whose sums over
// three ranks stay exact in bf16 (at most 8 significant bits).
float Value(int rank, int64_t j) { return static_cast<float>(j % 17 - 8) + 0.25f * rank; }

// `count` elements of `dtype` in host memory, written and read as floats; starts as NaN.
class Tensor {
 public:
  Tensor(DType dtype, int64_t count)
      : dtype_(dtype), bytes_(count * DTypeBytes(dtype), 0xFF), count_(count) {}

  void Fill(const std::function<float(int64_t)>& value) {
    for (int64_t j = 0; j < count_; ++j) Set(j, value(j));
  }
  std::vector<float> Values() const {
    std::vector<float> out(count_);
    for (int64_t j = 0; j < count_; ++j) out[j] = Get(j);
    return out;
  }
  void* at(int64_t element) { return bytes_.data() + element * DTypeBytes(dtype_); }
  void* data() { return bytes_.data(); }

  void Set(int64_t j, float v) {
    if (dtype_ == DType::kF32) {
      std::memcpy(at(j), &v, sizeof(v));
    } else {
      const uint16_t bits = FloatToBf16Bits(v);
      std::memcpy(at(j), &bits, sizeof(bits));
    }
  }
  float Get(int64_t j) const {
    const unsigned char* p = bytes_.data() + j * DTypeBytes(dtype_);
    if (dtype_ == DType::kF32) {
      float v;
      std::memcpy(&v, p, sizeof(v));
      return v;
    }
    uint16_t bits;
    std::memcpy(&bits, p, sizeof(bits));
    return Bf16BitsToFloat(bits);
  }

 private:
  DType dtype_;
  std::vector<unsigned char> bytes_;
  int64_t count_;
};

struct Case {
  int world;
  DType dtype;
};

std::string Describe(const Case& c) {
  return std::string(DTypeName(c.dtype)) + " on " + std::to_string(c.world) + " ranks";
}

const Case kCases[] = {{2, DType::kF32}, {2, DType::kBF16}, {3, DType::kF32}, {3, DType::kBF16}};

TEST(StagingCommunicatorTest, AllReduceSumsExactly) {
  constexpr int64_t kCount = 37;  // not a multiple of any group size: uneven ring chunks
  for (const Case& c : kCases) {
    SCOPED_TRACE(Describe(c));
    RunGroup(c.world, [&](int rank, Communicator& comm) {
      Tensor t(c.dtype, kCount);
      t.Fill([&](int64_t j) { return Value(rank, j); });
      ASSERT_TRUE(comm.AllReduce(t.data(), kCount, c.dtype).ok());
      const std::vector<float> got = t.Values();
      for (int64_t j = 0; j < kCount; ++j) {
        float want = 0.0f;
        for (int q = 0; q < c.world; ++q) want += Value(q, j);
        ASSERT_EQ(got[j], want) << "rank " << rank << " element " << j;
      }
    });
  }
}

TEST(StagingCommunicatorTest, ReduceScatterSumsThisRanksSlice) {
  constexpr int64_t kCount = 13;
  for (const Case& c : kCases) {
    for (bool in_place : {false, true}) {
      SCOPED_TRACE(Describe(c) + (in_place ? ", in place" : ""));
      RunGroup(c.world, [&](int rank, Communicator& comm) {
        Tensor in(c.dtype, kCount * c.world);
        in.Fill([&](int64_t j) { return Value(rank, j); });
        Tensor separate(c.dtype, kCount);
        void* out = in_place ? in.at(rank * kCount) : separate.data();
        ASSERT_TRUE(comm.ReduceScatter(in.data(), out, kCount, c.dtype).ok());
        const std::vector<float> all = in_place ? in.Values() : separate.Values();
        const int64_t offset = in_place ? rank * kCount : 0;
        for (int64_t i = 0; i < kCount; ++i) {
          float want = 0.0f;
          for (int q = 0; q < c.world; ++q) want += Value(q, rank * kCount + i);
          ASSERT_EQ(all[offset + i], want) << "rank " << rank << " element " << i;
        }
      });
    }
  }
}

TEST(StagingCommunicatorTest, AllGatherConcatenatesInRankOrder) {
  constexpr int64_t kCount = 11;
  for (const Case& c : kCases) {
    for (bool in_place : {false, true}) {
      SCOPED_TRACE(Describe(c) + (in_place ? ", in place" : ""));
      RunGroup(c.world, [&](int rank, Communicator& comm) {
        Tensor out(c.dtype, kCount * c.world);
        Tensor separate(c.dtype, kCount);
        Tensor& in_tensor = in_place ? out : separate;
        const int64_t offset = in_place ? rank * kCount : 0;
        // Only this rank's slice is written; the rest of `out` stays NaN until gathered.
        for (int64_t i = 0; i < kCount; ++i) in_tensor.Set(offset + i, Value(rank, i));
        ASSERT_TRUE(comm.AllGather(in_tensor.at(offset), out.data(), kCount, c.dtype).ok());
        const std::vector<float> got = out.Values();
        for (int q = 0; q < c.world; ++q) {
          for (int64_t i = 0; i < kCount; ++i) {
            ASSERT_EQ(got[q * kCount + i], Value(q, i)) << "rank " << rank << " from " << q;
          }
        }
      });
    }
  }
}

TEST(StagingCommunicatorTest, BroadcastCopiesTheRootsBuffer) {
  constexpr int64_t kCount = 9;
  for (int world : {2, 3}) {
    RunGroup(world, [&](int rank, Communicator& comm) {
      std::vector<float> data(kCount);
      for (int64_t j = 0; j < kCount; ++j) data[j] = Value(rank, j);
      ASSERT_TRUE(comm.Broadcast(data.data(), kCount, /*root=*/1).ok());
      for (int64_t j = 0; j < kCount; ++j) ASSERT_EQ(data[j], Value(1, j)) << "rank " << rank;
    });
  }
}

TEST(StagingCommunicatorTest, SendAndRecvMoveExactValues) {
  constexpr int64_t kCount = 21;
  for (const Case& c : kCases) {
    SCOPED_TRACE(Describe(c));
    RunGroup(c.world, [&](int rank, Communicator& comm) {
      Tensor t(c.dtype, kCount);
      if (rank == 0) {
        t.Fill([&](int64_t j) { return Value(5, j); });
        ASSERT_TRUE(comm.Send(t.data(), kCount, c.dtype, /*peer=*/1, /*tag=*/7).ok());
      } else if (rank == 1) {
        ASSERT_TRUE(comm.Recv(t.data(), kCount, c.dtype, /*peer=*/0, /*tag=*/7).ok());
        const std::vector<float> got = t.Values();
        for (int64_t j = 0; j < kCount; ++j) ASSERT_EQ(got[j], Value(5, j));
      }
    });
  }
}

TEST(StagingCommunicatorTest, SendRecvAroundARing) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(Describe(c));
    RunGroup(c.world, [&](int rank, Communicator& comm) {
      // Different sizes each way: rank r sends r + 5 elements to the next rank.
      const int next = (rank + 1) % c.world, prev = (rank + c.world - 1) % c.world;
      const int64_t send_count = rank + 5, recv_count = prev + 5;
      Tensor send(c.dtype, send_count), recv(c.dtype, recv_count);
      send.Fill([&](int64_t j) { return Value(rank, j); });
      ASSERT_TRUE(comm.SendRecv(send.data(), send_count, next, /*send_tag=*/100 + rank, recv.data(),
                                recv_count, prev, /*recv_tag=*/100 + prev, c.dtype)
                      .ok());
      const std::vector<float> got = recv.Values();
      for (int64_t j = 0; j < recv_count; ++j) ASSERT_EQ(got[j], Value(prev, j));
    });
  }
}

// Started transfers (as ring attention and the pipeline use them): a receive and a send posted
// around the ring, waited for after other work, in both orders of waiting; each transfer stages
// through its own buffer, so two rounds in flight at once do not mix.
TEST(StagingCommunicatorTest, StartedTransfersAroundARing) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(Describe(c));
    RunGroup(c.world, [&](int rank, Communicator& comm) {
      ASSERT_TRUE(comm.StartsTransfers());
      const int next = (rank + 1) % c.world, prev = (rank + c.world - 1) % c.world;
      constexpr int64_t kCount = 19;
      Tensor send[2] = {Tensor(c.dtype, kCount), Tensor(c.dtype, kCount)};
      Tensor recv[2] = {Tensor(c.dtype, kCount), Tensor(c.dtype, kCount)};
      std::unique_ptr<PendingTransfer> pending[4];
      for (int round = 0; round < 2; ++round) {
        send[round].Fill([&](int64_t j) { return Value(rank, j + 3 * round); });
        auto r = comm.StartRecv(recv[round].data(), kCount, c.dtype, prev, /*tag=*/round);
        auto s = comm.StartSend(send[round].data(), kCount, c.dtype, next, /*tag=*/round);
        ASSERT_TRUE(r.ok() && s.ok()) << r.status() << s.status();
        pending[2 * round] = std::move(*r);
        pending[2 * round + 1] = std::move(*s);
      }
      for (int i : {1, 0, 3, 2}) ASSERT_TRUE(pending[i]->Wait().ok()) << i;
      for (int round = 0; round < 2; ++round) {
        const std::vector<float> got = recv[round].Values();
        for (int64_t j = 0; j < kCount; ++j) ASSERT_EQ(got[j], Value(prev, j + 3 * round));
      }
    });
  }
}

TEST(StagingCommunicatorTest, Bf16SumsRoundOnceToNearestEven) {
  // bf16 values near 1 are 2^-7 apart.
  constexpr float kHalfUlp = 0.00390625f;  // 2^-8
  RunGroup(3, [&](int rank, Communicator& comm) {
    // Element 0: 1 + 2^-8 + 2^-8 = 1 + 2^-7 exactly in fp32, a bf16 value. Rounding after each
    // addition would lose both halves (1 + 2^-8 is a tie, which goes to the even 1).
    // Element 1: 1 + 2^-9 + 2^-9 = 1 + 2^-8, the tie between 1 (even) and 1 + 2^-7: gives 1.
    Tensor t(DType::kBF16, 2);
    t.Fill([&](int64_t j) {
      if (rank == 0) return 1.0f;
      return j == 0 ? kHalfUlp : kHalfUlp / 2;
    });
    ASSERT_TRUE(comm.AllReduce(t.data(), 2, DType::kBF16).ok());
    const std::vector<float> got = t.Values();
    EXPECT_EQ(got[0], 1.0f + 2 * kHalfUlp) << "rank " << rank;
    EXPECT_EQ(got[1], 1.0f) << "rank " << rank;
  });
  RunGroup(2, [&](int rank, Communicator& comm) {
    // (1 + 2^-7) + 2^-8 is the tie between 1 + 2^-7 (odd) and 1 + 2^-6 (even): rounds up.
    Tensor t(DType::kBF16, 1);
    t.Fill([&](int64_t) { return rank == 0 ? 1.0f + 2 * kHalfUlp : kHalfUlp; });
    ASSERT_TRUE(comm.AllReduce(t.data(), 1, DType::kBF16).ok());
    EXPECT_EQ(t.Values()[0], 1.0f + 4 * kHalfUlp) << "rank " << rank;
  });
}

TEST(StagingCommunicatorTest, CountsTheEnginesFp32Bytes) {
  constexpr int64_t kCount = 60;  // divisible by 2 and 3: equal ring chunks
  for (const Case& c : kCases) {
    SCOPED_TRACE(Describe(c));
    RunGroup(c.world, [&](int rank, Communicator& comm) {
      Tensor t(c.dtype, kCount);
      t.Fill([&](int64_t j) { return Value(rank, j); });
      ASSERT_TRUE(comm.AllReduce(t.data(), kCount, c.dtype).ok());
      // A ring all-reduce sends 2(n−1) chunks of count/n elements, as fp32 whatever the dtype.
      const int64_t want = 2 * (c.world - 1) * (kCount / c.world) * 4;
      EXPECT_EQ(comm.stats().bytes_sent(CollectiveKind::kAllReduce), want);
      if (rank == 0) {
        ASSERT_TRUE(comm.Send(t.data(), kCount, c.dtype, 1, 3).ok());
        EXPECT_EQ(comm.stats().bytes_sent(CollectiveKind::kSendRecv), kCount * 4);
      } else if (rank == 1) {
        ASSERT_TRUE(comm.Recv(t.data(), kCount, c.dtype, 0, 3).ok());
        EXPECT_EQ(comm.stats().bytes_sent(CollectiveKind::kSendRecv), 0);
      }
    });
  }
}

TEST(StagingCommunicatorTest, HostBuffersPassStraightThrough) {
  // A copier that sees no device memory: fp32 goes to the engine untouched (as from
  // AllReduceDouble); bf16 is still widened and rounded on the host.
  RunGroup(
      2,
      [&](int rank, Communicator& comm) {
        absl::StatusOr<double> sum = AllReduceDouble(comm, 1.0 / 3.0 + rank);
        ASSERT_TRUE(sum.ok()) << sum.status();
        EXPECT_NEAR(*sum, 2.0 / 3.0 + 1.0, 1e-6);
        Tensor t(DType::kBF16, 5);
        t.Fill([&](int64_t j) { return Value(rank, j); });
        ASSERT_TRUE(comm.AllReduce(t.data(), 5, DType::kBF16).ok());
        for (int64_t j = 0; j < 5; ++j) EXPECT_EQ(t.Values()[j], Value(0, j) + Value(1, j));
      },
      /*all_device=*/false);
}

TEST(StagingCommunicatorTest, AbortFailsAPendingOperation) {
  Flag checked;  // rank 1 stays connected until rank 0 has seen its results
  RunGroup(2, [&](int rank, Communicator& comm) {
    if (rank == 1) {
      checked.Await();
      return;
    }
    absl::Status pending = absl::UnknownError("not run");
    Tensor t(DType::kBF16, 8);
    std::atomic<int64_t> receiver_tid{0};
    std::thread receiver([&] {
      receiver_tid = testenv::ThisThreadId();
      pending = comm.Recv(t.data(), 8, DType::kBF16, 1, 42);
    });
    while (receiver_tid.load() == 0) std::this_thread::yield();
    // Abort while the receive is pending: the receiving thread sleeps in it.
    EXPECT_TRUE(testenv::WaitUntilBlocked(receiver_tid.load(), milliseconds(10000)));
    comm.Abort();
    receiver.join();
    EXPECT_EQ(pending.code(), absl::StatusCode::kAborted) << pending;
    float x = 1.0f;
    EXPECT_EQ(comm.AllReduce(&x, 1).code(), absl::StatusCode::kAborted);
    checked.Raise();
  });
}

TEST(StagingCommunicatorTest, StalledPeerGivesDeadlineExceeded) {
  Flag checked;
  RunGroup(
      2,
      [&](int rank, Communicator& comm) {
        if (rank == 1) {  // connected, but never joins the all-reduce
          checked.Await();
          return;
        }
        Tensor t(DType::kBF16, 16);
        t.Fill([](int64_t j) { return 1.0f; });
        const auto start = std::chrono::steady_clock::now();
        const absl::Status s = comm.AllReduce(t.data(), 16, DType::kBF16);
        EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
        EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
        checked.Raise();
      },
      /*all_device=*/true, /*timeout=*/milliseconds(2000));
}

// Gloo's batched all-gather: parts of different sizes, some gathered in place, on 2 to 4 ranks,
// give what one AllGather per part gives, and count the same bytes.
TEST(GlooCommunicatorTest, AllGatherManyMatchesOneGatherPerPart) {
  const std::vector<int64_t> counts = {5, 1, 13, 64};
  for (int world : {2, 3, 4}) {
    SCOPED_TRACE(std::to_string(world) + " ranks");
    RunGroup(
        world,
        [&](int rank, Communicator& comm) {
          std::vector<std::vector<float>> outs, ins;
          std::vector<Communicator::GatherPart> parts;
          for (size_t p = 0; p < counts.size(); ++p) {
            const int64_t n = counts[p];
            outs.emplace_back(n * world, std::nanf(""));
            ins.emplace_back(n);
            const bool in_place = p % 2 == 1;
            float* in = in_place ? outs.back().data() + rank * n : ins.back().data();
            for (int64_t i = 0; i < n; ++i) in[i] = Value(rank, i + 100 * p);
            parts.push_back({in, outs.back().data(), n});
          }
          ASSERT_TRUE(comm.AllGatherMany(parts).ok());
          int64_t elements = 0;
          for (size_t p = 0; p < counts.size(); ++p) {
            elements += counts[p];
            for (int q = 0; q < world; ++q) {
              for (int64_t i = 0; i < counts[p]; ++i) {
                ASSERT_EQ(outs[p][q * counts[p] + i], Value(q, i + 100 * p))
                    << "part " << p << " on rank " << rank << " from " << q;
              }
            }
          }
          EXPECT_EQ(comm.stats().bytes_sent(CollectiveKind::kAllGather),
                    (world - 1) * elements * 4);
          // The group goes on in step after a batch: a plain gather still meets its peers.
          std::vector<float> one(world);
          ASSERT_TRUE(comm.AllGather(&one[rank], one.data(), 1).ok());
        },
        /*all_device=*/false, milliseconds(30000), /*staged=*/false);
  }
}

// A batch waits on every part's buffers: Abort reaches it while it is pending, and a peer that
// never joins gives DEADLINE_EXCEEDED.
TEST(GlooCommunicatorTest, AllGatherManyIsAbortedOrTimesOut) {
  for (bool abort : {true, false}) {
    SCOPED_TRACE(abort ? "abort" : "timeout");
    Flag checked;
    RunGroup(
        2,
        [&](int rank, Communicator& comm) {
          if (rank == 1) {  // connected, but never joins the gathers
            checked.Await();
            return;
          }
          std::vector<float> a(8, 1.0f), b(6, 2.0f);
          const std::vector<Communicator::GatherPart> parts = {{a.data(), a.data(), 4},
                                                               {b.data(), b.data(), 3}};
          absl::Status pending = absl::UnknownError("not run");
          std::atomic<int64_t> tid{0};
          const auto start = std::chrono::steady_clock::now();
          std::thread gatherer([&] {
            tid = testenv::ThisThreadId();
            pending = comm.AllGatherMany(parts);
          });
          while (tid.load() == 0) std::this_thread::yield();
          if (abort) {
            EXPECT_TRUE(testenv::WaitUntilBlocked(tid.load(), milliseconds(10000)));
            comm.Abort();
          }
          gatherer.join();
          EXPECT_EQ(pending.code(),
                    abort ? absl::StatusCode::kAborted : absl::StatusCode::kDeadlineExceeded)
              << pending;
          // Aborted: long before the 30 s timeout that any part's wait left pending would hit.
          EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
          checked.Raise();
        },
        /*all_device=*/false, milliseconds(abort ? 30000 : 2000), /*staged=*/false);
  }
}

// Rank r sends (r + d) % 3 rows of width 2 to rank d (none for some pairs, its own rows left in
// place), every peer's in flight at once: each receives exactly the rows meant for it, rank by
// rank, and counts only the bytes that left it.
TEST(GlooCommunicatorTest, AllToAllVDeliversUnevenRowsToEveryPeer) {
  constexpr int kWorld = 3, kWidth = 2;
  auto rows = [](int from, int to) { return int64_t{(from + to) % 3}; };
  auto value = [](int from, int to, int64_t i) { return 100.0f * from + 10.0f * to + i; };
  RunGroup(
      kWorld,
      [&](int rank, Communicator& comm) {
        std::vector<int64_t> send(kWorld), recv(kWorld);
        std::vector<float> in;
        int64_t sent = 0;
        for (int d = 0; d < kWorld; ++d) {
          send[d] = rows(rank, d) * kWidth;
          recv[d] = rows(d, rank) * kWidth;
          for (int64_t i = 0; i < send[d]; ++i) in.push_back(value(rank, d, i));
          if (d != rank) sent += send[d] * 4;
        }
        int64_t received = 0;
        for (int64_t n : recv) received += n;
        std::vector<float> out(received, -1.0f);
        ASSERT_TRUE(comm.AllToAllV(in.data(), send, out.data(), recv, DType::kF32, 7).ok());
        int64_t at = 0;
        for (int s = 0; s < kWorld; ++s) {
          for (int64_t i = 0; i < recv[s]; ++i, ++at) {
            // Its own rows are the caller's to copy: left as they were.
            const float want = s == rank ? -1.0f : value(s, rank, i);
            ASSERT_EQ(out[at], want) << "rank " << rank << " from " << s << " row element " << i;
          }
        }
        EXPECT_EQ(comm.stats().bytes_sent(CollectiveKind::kSendRecv), sent) << "rank " << rank;
      },
      /*all_device=*/false, milliseconds(30000), /*staged=*/false);
}

// The exchange waits on every peer's buffers: Abort reaches it while it is pending, and a peer
// that never joins gives DEADLINE_EXCEEDED.
TEST(GlooCommunicatorTest, AllToAllVIsAbortedOrTimesOut) {
  for (bool abort : {true, false}) {
    SCOPED_TRACE(abort ? "abort" : "timeout");
    Flag checked;
    RunGroup(
        3,
        [&](int rank, Communicator& comm) {
          if (rank > 0) {  // connected, but never join the exchange
            checked.Await();
            return;
          }
          const std::vector<int64_t> counts = {4, 4, 4};
          std::vector<float> in(12, 1.0f), out(12, 0.0f);
          absl::Status pending = absl::UnknownError("not run");
          std::atomic<int64_t> tid{0};
          const auto start = std::chrono::steady_clock::now();
          std::thread exchanger([&] {
            tid = testenv::ThisThreadId();
            pending = comm.AllToAllV(in.data(), counts, out.data(), counts, DType::kF32, 3);
          });
          while (tid.load() == 0) std::this_thread::yield();
          if (abort) {
            EXPECT_TRUE(testenv::WaitUntilBlocked(tid.load(), milliseconds(10000)));
            comm.Abort();
          }
          exchanger.join();
          EXPECT_EQ(pending.code(),
                    abort ? absl::StatusCode::kAborted : absl::StatusCode::kDeadlineExceeded)
              << pending;
          EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
          checked.Raise();
        },
        /*all_device=*/false, milliseconds(abort ? 30000 : 2000), /*staged=*/false);
  }
}

}  // namespace
}  // namespace trainyard::worker::parallel
