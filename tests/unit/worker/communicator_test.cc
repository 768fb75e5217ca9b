// The Communicator's typed defaults: fp32 runs through the float overloads, other types are
// refused by name.
#include "worker/parallel/communicator.h"

#include <algorithm>
#include <vector>

#include "gtest/gtest.h"

namespace trainyard::worker::parallel {
namespace {

TEST(CommunicatorTypedDefaultsTest, Fp32RunsThroughTheFloatOverloads) {
  std::unique_ptr<Communicator> self = MakeSelfCommunicator();
  const std::vector<float> in = {1.0f, -2.0f, 3.5f};
  std::vector<float> out(3, 0.0f);
  ASSERT_TRUE(self->AllGather(in.data(), out.data(), 3, DType::kF32).ok());
  EXPECT_EQ(out, in);
  out.assign(3, 0.0f);
  ASSERT_TRUE(self->ReduceScatter(in.data(), out.data(), 3, DType::kF32).ok());
  EXPECT_EQ(out, in);
  EXPECT_TRUE(self->AllReduce(out.data(), 3, DType::kF32).ok());
  EXPECT_EQ(out, in);
  // The float overload's own answer comes back: a group of one has no peer.
  EXPECT_EQ(self->Send(in.data(), 3, DType::kF32, 0, 0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(self->Recv(out.data(), 3, DType::kF32, 0, 0).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(self->SendRecv(in.data(), 3, 0, 0, out.data(), 3, 0, 0, DType::kF32).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(CommunicatorTypedDefaultsTest, Bf16IsUnimplementedNamingTheEngine) {
  std::unique_ptr<Communicator> self = MakeSelfCommunicator();
  std::vector<uint16_t> buf(4, 0);
  const absl::Status s = self->AllReduce(buf.data(), 4, DType::kBF16);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(s.message().find("self"), std::string::npos) << s;
  EXPECT_NE(s.message().find("bf16"), std::string::npos) << s;
  EXPECT_EQ(self->AllGather(buf.data(), buf.data(), 4, DType::kBF16).code(),
            absl::StatusCode::kUnimplemented);
  EXPECT_EQ(self->ReduceScatter(buf.data(), buf.data(), 4, DType::kBF16).code(),
            absl::StatusCode::kUnimplemented);
  EXPECT_EQ(self->Send(buf.data(), 4, DType::kBF16, 0, 0).code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(self->Recv(buf.data(), 4, DType::kBF16, 0, 0).code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(self->SendRecv(buf.data(), 4, 0, 0, buf.data(), 4, 0, 0, DType::kBF16).code(),
            absl::StatusCode::kUnimplemented);
}

// An engine that cannot start transfers: SendRecv copies the send buffer into the receive
// buffer (a ring of one) and counts its calls.
class CopyingEngine final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  absl::Status AllReduce(float*, int64_t) override { return absl::OkStatus(); }
  absl::Status ReduceScatter(const float*, float*, int64_t) override { return absl::OkStatus(); }
  absl::Status AllGather(const float*, float*, int64_t) override { return absl::OkStatus(); }
  absl::Status Broadcast(float*, int64_t, int) override { return absl::OkStatus(); }
  absl::Status Send(const float*, int64_t, int, uint32_t) override { return absl::OkStatus(); }
  absl::Status Recv(float*, int64_t, int, uint32_t) override { return absl::OkStatus(); }
  absl::Status SendRecv(const float* send, int64_t send_count, int, uint32_t, float* recv,
                        int64_t recv_count, int, uint32_t) override {
    ++calls;
    if (send_count != recv_count) return absl::InvalidArgumentError("counts differ");
    std::copy_n(send, send_count, recv);
    return absl::OkStatus();
  }
  absl::Status Barrier() override { return absl::OkStatus(); }
  void Abort() override {}
  int calls = 0;
};

TEST(CommunicatorStartExchangeTest, AnEngineThatCannotStartExchangesAtOnce) {
  CopyingEngine engine;
  EXPECT_FALSE(engine.StartsExchanges());
  const std::vector<float> send = {1.0f, 2.0f, 3.0f};
  std::vector<float> recv(3, 0.0f);
  auto pending = engine.StartExchange(send.data(), 3, 0, 1, recv.data(), 3, 0, 1, DType::kF32);
  ASSERT_TRUE(pending.ok()) << pending.status();
  EXPECT_EQ(engine.calls, 1);
  EXPECT_EQ(recv, send);  // before Wait: the exchange is done
  EXPECT_TRUE((*pending)->Wait().ok());
  // Its error comes back from the start.
  EXPECT_EQ(
      engine.StartExchange(send.data(), 3, 0, 1, recv.data(), 2, 0, 1, DType::kF32).status().code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(engine.StartExchange(send.data(), 3, 0, 1, recv.data(), 3, 0, 1, DType::kBF16)
                .status()
                .code(),
            absl::StatusCode::kUnimplemented);
}

TEST(CommunicatorTypedDefaultsTest, AbortReachesTypedOperations) {
  std::unique_ptr<Communicator> self = MakeSelfCommunicator();
  self->Abort();
  float x = 1.0f;
  EXPECT_EQ(self->AllReduce(&x, 1, DType::kF32).code(), absl::StatusCode::kAborted);
}

}  // namespace
}  // namespace trainyard::worker::parallel
