// The Communicator's typed defaults: fp32 runs through the float overloads, other types are
// refused by name.
#include "worker/parallel/communicator.h"

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

TEST(CommunicatorTypedDefaultsTest, AbortReachesTypedOperations) {
  std::unique_ptr<Communicator> self = MakeSelfCommunicator();
  self->Abort();
  float x = 1.0f;
  EXPECT_EQ(self->AllReduce(&x, 1, DType::kF32).code(), absl::StatusCode::kAborted);
}

}  // namespace
}  // namespace trainyard::worker::parallel
