#include "tools/cli/job_client.h"

#include <grpcpp/grpcpp.h>

#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/rpc.h"

namespace trainyard::cli {
namespace {

void SetDeadline(grpc::ClientContext* context, int seconds) {
  context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(seconds));
}

}  // namespace

JobClient::JobClient(std::string address, std::shared_ptr<grpc::Channel> channel)
    : address_(std::move(address)), stub_(v1::JobService::NewStub(std::move(channel))) {}

absl::Status JobClient::Convert(const grpc::Status& status) const {
  const absl::Status converted = rpc::FromGrpc(status);
  if (absl::IsUnavailable(converted) || absl::IsDeadlineExceeded(converted)) {
    return absl::Status(converted.code(), absl::StrCat("cannot reach the coordinator at ", address_,
                                                       ": ", converted.message()));
  }
  return converted;
}

absl::StatusOr<v1::Job> JobClient::Submit(const v1::SubmitJobRequest& request) {
  grpc::ClientContext context;
  SetDeadline(&context, 10);
  v1::SubmitJobReply reply;
  const absl::Status status = Convert(stub_->SubmitJob(&context, request, &reply));
  if (!status.ok()) return status;
  return reply.job();
}

absl::StatusOr<v1::GetJobReply> JobClient::Get(const std::string& job_id, int max_events) {
  grpc::ClientContext context;
  SetDeadline(&context, 5);
  v1::GetJobRequest request;
  request.set_job_id(job_id);
  request.set_max_events(max_events);
  v1::GetJobReply reply;
  const absl::Status status = Convert(stub_->GetJob(&context, request, &reply));
  if (!status.ok()) return status;
  return reply;
}

absl::StatusOr<std::vector<v1::Job>> JobClient::List(const std::vector<v1::JobState>& states,
                                                     int limit) {
  grpc::ClientContext context;
  SetDeadline(&context, 10);
  v1::ListJobsRequest request;
  for (v1::JobState state : states) request.add_states(state);
  request.set_limit(limit);
  v1::ListJobsReply reply;
  const absl::Status status = Convert(stub_->ListJobs(&context, request, &reply));
  if (!status.ok()) return status;
  return std::vector<v1::Job>(reply.jobs().begin(), reply.jobs().end());
}

absl::StatusOr<v1::Job> JobClient::Cancel(const std::string& job_id, const std::string& reason,
                                          const std::string& user) {
  grpc::ClientContext context;
  SetDeadline(&context, 5);
  v1::CancelJobRequest request;
  request.set_job_id(job_id);
  request.set_reason(reason);
  request.set_user(user);
  v1::CancelJobReply reply;
  const absl::Status status = Convert(stub_->CancelJob(&context, request, &reply));
  if (!status.ok()) return status;
  return reply.job();
}

absl::StatusOr<v1::Job> JobClient::Drain(const std::string& job_id, const std::string& reason,
                                         const std::string& user) {
  grpc::ClientContext context;
  SetDeadline(&context, 5);
  v1::DrainJobRequest request;
  request.set_job_id(job_id);
  request.set_reason(reason);
  request.set_user(user);
  v1::DrainJobReply reply;
  const absl::Status status = Convert(stub_->DrainJob(&context, request, &reply));
  if (!status.ok()) return status;
  return reply.job();
}

absl::StatusOr<std::vector<v1::Checkpoint>> JobClient::ListCheckpoints(const std::string& job_id) {
  grpc::ClientContext context;
  SetDeadline(&context, 5);
  v1::ListCheckpointsRequest request;
  request.set_job_id(job_id);
  v1::ListCheckpointsReply reply;
  const absl::Status status = Convert(stub_->ListCheckpoints(&context, request, &reply));
  if (!status.ok()) return status;
  return std::vector<v1::Checkpoint>(reply.checkpoints().begin(), reply.checkpoints().end());
}

absl::StatusOr<std::vector<v1::Node>> JobClient::Nodes() {
  grpc::ClientContext context;
  SetDeadline(&context, 5);
  v1::ListNodesReply reply;
  const absl::Status status = Convert(stub_->ListNodes(&context, v1::ListNodesRequest(), &reply));
  if (!status.ok()) return status;
  return std::vector<v1::Node>(reply.nodes().begin(), reply.nodes().end());
}

absl::StatusOr<v1::Node> JobClient::Uncordon(const std::string& node_id) {
  grpc::ClientContext context;
  SetDeadline(&context, 5);
  v1::UncordonNodeRequest request;
  request.set_node_id(node_id);
  v1::UncordonNodeReply reply;
  const absl::Status status = Convert(stub_->UncordonNode(&context, request, &reply));
  if (!status.ok()) return status;
  return reply.node();
}

absl::Status JobClient::Watch(const std::string& job_id,
                              const std::function<bool(const v1::JobUpdate&)>& on_update) {
  grpc::ClientContext context;
  v1::WatchJobRequest request;
  request.set_job_id(job_id);
  std::unique_ptr<grpc::ClientReader<v1::JobUpdate>> reader = stub_->WatchJob(&context, request);
  v1::JobUpdate update;
  while (reader->Read(&update)) {
    if (!on_update(update)) {
      context.TryCancel();
      while (reader->Read(&update)) {
      }
      (void)reader->Finish();
      return absl::OkStatus();
    }
  }
  return Convert(reader->Finish());
}

absl::Status JobClient::Logs(const v1::GetLogsRequest& request,
                             const std::function<void(const v1::LogChunk&)>& on_chunk) {
  grpc::ClientContext context;
  if (!request.follow()) SetDeadline(&context, 30);
  std::unique_ptr<grpc::ClientReader<v1::LogChunk>> reader = stub_->GetLogs(&context, request);
  v1::LogChunk chunk;
  while (reader->Read(&chunk)) on_chunk(chunk);
  return Convert(reader->Finish());
}

}  // namespace trainyard::cli
