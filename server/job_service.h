// JobService over gRPC's callback API: translates requests to Supervisor and LogRouter calls and
// their results back. Reads answer on the gRPC thread that received them; calls that change
// state (and so wait for the store) answer from the CallExecutor's threads; WatchJob and GetLogs
// are server streams fed by the Supervisor (JobWatcher) and the LogRouter (LogSink).
//
// Every call is authenticated (ServiceAuth::User); a user sees and acts on their own jobs only,
// an admin on all, and only an admin uncordons nodes. A job is recorded as submitted by the user
// the credential proves (the request's `user` field is ignored).
//
// Threading: gRPC calls the methods on its own threads; the service holds no state of its own.
#ifndef TRAINYARD_SERVER_JOB_SERVICE_H_
#define TRAINYARD_SERVER_JOB_SERVICE_H_

#include "proto/trainyard.grpc.pb.h"
#include "server/auth.h"
#include "server/call_executor.h"
#include "server/log_router.h"
#include "server/service_auth.h"
#include "server/supervisor.h"

namespace trainyard::server {

class JobServiceImpl final : public ::trainyard::v1::JobService::CallbackService {
 public:
  // None is owned; all must outlive the service.
  JobServiceImpl(Supervisor* supervisor, LogRouter* logs, const ServiceAuth* auth,
                 StreamQuota* streams, CallExecutor* executor)
      : supervisor_(supervisor), logs_(logs), auth_(auth), streams_(streams), executor_(executor) {}

  grpc::ServerUnaryReactor* SubmitJob(grpc::CallbackServerContext* context,
                                      const ::trainyard::v1::SubmitJobRequest* request,
                                      ::trainyard::v1::SubmitJobReply* reply) override;
  grpc::ServerUnaryReactor* GetJob(grpc::CallbackServerContext* context,
                                   const ::trainyard::v1::GetJobRequest* request,
                                   ::trainyard::v1::GetJobReply* reply) override;
  grpc::ServerUnaryReactor* ListJobs(grpc::CallbackServerContext* context,
                                     const ::trainyard::v1::ListJobsRequest* request,
                                     ::trainyard::v1::ListJobsReply* reply) override;
  grpc::ServerUnaryReactor* CancelJob(grpc::CallbackServerContext* context,
                                      const ::trainyard::v1::CancelJobRequest* request,
                                      ::trainyard::v1::CancelJobReply* reply) override;
  grpc::ServerUnaryReactor* ListCheckpoints(grpc::CallbackServerContext* context,
                                            const ::trainyard::v1::ListCheckpointsRequest* request,
                                            ::trainyard::v1::ListCheckpointsReply* reply) override;
  grpc::ServerUnaryReactor* DrainJob(grpc::CallbackServerContext* context,
                                     const ::trainyard::v1::DrainJobRequest* request,
                                     ::trainyard::v1::DrainJobReply* reply) override;
  grpc::ServerWriteReactor<::trainyard::v1::JobUpdate>* WatchJob(
      grpc::CallbackServerContext* context,
      const ::trainyard::v1::WatchJobRequest* request) override;
  grpc::ServerWriteReactor<::trainyard::v1::LogChunk>* GetLogs(
      grpc::CallbackServerContext* context,
      const ::trainyard::v1::GetLogsRequest* request) override;
  grpc::ServerUnaryReactor* ListNodes(grpc::CallbackServerContext* context,
                                      const ::trainyard::v1::ListNodesRequest* request,
                                      ::trainyard::v1::ListNodesReply* reply) override;
  grpc::ServerUnaryReactor* UncordonNode(grpc::CallbackServerContext* context,
                                         const ::trainyard::v1::UncordonNodeRequest* request,
                                         ::trainyard::v1::UncordonNodeReply* reply) override;

 private:
  // The caller, allowed to use the job (its owner or an admin); NOT_FOUND for an unknown job.
  [[nodiscard]] absl::StatusOr<Identity> JobCaller(const grpc::ServerContextBase& context,
                                                   const std::string& job_id) const;
  [[nodiscard]] absl::Status MayUseJob(const grpc::ServerContextBase& context,
                                       const std::string& job_id) const;
  // CancelJob and DrainJob: `stop` (Supervisor::Cancel or Drain) on the caller's job, answered
  // from the executor.
  using StopFn = absl::StatusOr<JobRecord> (Supervisor::*)(const std::string&, const std::string&,
                                                           const std::string&);
  grpc::ServerUnaryReactor* StopJob(grpc::CallbackServerContext* context, const std::string& job_id,
                                    const std::string& reason, ::trainyard::v1::Job* reply,
                                    StopFn stop);
  // JobCaller, and one of the caller's streams from the quota.
  [[nodiscard]] absl::StatusOr<StreamTicket> OpenStream(const grpc::ServerContextBase& context,
                                                        const std::string& job_id) const;

  Supervisor* const supervisor_;
  LogRouter* const logs_;
  const ServiceAuth* const auth_;
  StreamQuota* const streams_;
  CallExecutor* const executor_;
};

}  // namespace trainyard::server

#endif  // TRAINYARD_SERVER_JOB_SERVICE_H_
