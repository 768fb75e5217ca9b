// Translation between the coordinator's domain types (server/types.h, server/supervisor.h) and
// the trainyard.v1 protobuf messages, and between absl::Status and grpc::Status. The gRPC
// services use nothing else to talk to the managers.
//
// Threading: plain functions.
#ifndef TRAINYARD_SERVER_CONVERT_H_
#define TRAINYARD_SERVER_CONVERT_H_

#include <chrono>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/rpc.h"
#include "grpcpp/grpcpp.h"
#include "proto/trainyard.pb.h"
#include "server/agent_registry.h"
#include "server/supervisor.h"
#include "server/types.h"

namespace trainyard::server {

namespace v1 = ::trainyard::v1;

using ::trainyard::rpc::ToGrpc;

// 0 for InfinitePast ("never").
int64_t UnixMillisOrZero(absl::Time time);
// A gRPC deadline as an absl::Time (InfiniteFuture when the call has none).
absl::Time FromDeadline(std::chrono::system_clock::time_point deadline);

v1::JobState ToProto(JobState state);
// INVALID_ARGUMENT for UNSPECIFIED or an unknown number.
[[nodiscard]] absl::StatusOr<JobState> FromProto(v1::JobState state);

void ToProto(const JobRecord& job, v1::Job* out);
void ToProto(const CheckpointInfo& checkpoint, v1::Checkpoint* out);
void ToProto(const AttemptRecord& attempt, v1::Attempt* out);
void ToProto(const EventRecord& event, v1::Event* out);
void ToProto(const NodeStatus& node, v1::Node* out);
void ToProto(const JoinInfo& info, v1::JoinReply* out);
void ToProto(const RegisteredOrder& order, v1::CoordinatorMessage* out);
void ToProto(const AgentOrder& order, v1::CoordinatorMessage* out);

NodeRecord FromProto(const v1::RegisterAgent& registration);
RunningWorker FromProto(const v1::RunningWorker& worker);
WorkerExit FromProto(const v1::WorkerExited& exited);
ProgressUpdate FromProto(const v1::ProgressReport& report);
void ToProto(const OrderReply& order, v1::ProgressReply* out);
HangUpdate FromProto(const v1::HangReport& report);

}  // namespace trainyard::server

#endif  // TRAINYARD_SERVER_CONVERT_H_
