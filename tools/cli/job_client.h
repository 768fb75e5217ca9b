// JobClient: the CLI's calls to the coordinator's JobService, each with the deadline the API
// documents. Errors keep the server's code and one-line message; transport failures
// (UNAVAILABLE, DEADLINE_EXCEEDED) name the address that could not be reached.
//
// Threading: one command at a time (streams are consumed on the calling thread).
#ifndef TRAINYARD_TOOLS_CLI_JOB_CLIENT_H_
#define TRAINYARD_TOOLS_CLI_JOB_CLIENT_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "grpcpp/channel.h"
#include "proto/trainyard.grpc.pb.h"

namespace trainyard::cli {

namespace v1 = ::trainyard::v1;

class JobClient {
 public:
  // `channel`: rpc::MakeChannel to `address` with the user's TLS files and token.
  JobClient(std::string address, std::shared_ptr<grpc::Channel> channel);

  const std::string& address() const { return address_; }

  [[nodiscard]] absl::StatusOr<v1::Job> Submit(const v1::SubmitJobRequest& request);
  [[nodiscard]] absl::StatusOr<v1::GetJobReply> Get(const std::string& job_id, int max_events = 0);
  [[nodiscard]] absl::StatusOr<std::vector<v1::Job>> List(const std::vector<v1::JobState>& states,
                                                          int limit);
  // `user`: who asks (recorded in the job's events).
  [[nodiscard]] absl::StatusOr<v1::Job> Cancel(const std::string& job_id, const std::string& reason,
                                               const std::string& user);
  [[nodiscard]] absl::StatusOr<v1::Job> Drain(const std::string& job_id, const std::string& reason,
                                              const std::string& user);
  [[nodiscard]] absl::StatusOr<std::vector<v1::Checkpoint>> ListCheckpoints(
      const std::string& job_id);
  [[nodiscard]] absl::StatusOr<std::vector<v1::Node>> Nodes();
  [[nodiscard]] absl::StatusOr<v1::Node> Uncordon(const std::string& node_id);

  // Streams the job's updates to `on_update` until the stream ends (OK after the final state)
  // or `on_update` returns false (OK). No deadline: it lasts as long as the job.
  [[nodiscard]] absl::Status Watch(const std::string& job_id,
                                   const std::function<bool(const v1::JobUpdate&)>& on_update);
  // Streams log chunks to `on_chunk`. Deadline 30 s without follow, none with it.
  [[nodiscard]] absl::Status Logs(const v1::GetLogsRequest& request,
                                  const std::function<void(const v1::LogChunk&)>& on_chunk);

 private:
  [[nodiscard]] absl::Status Convert(const grpc::Status& status) const;

  std::string address_;
  std::unique_ptr<v1::JobService::Stub> stub_;
};

}  // namespace trainyard::cli

#endif  // TRAINYARD_TOOLS_CLI_JOB_CLIENT_H_
