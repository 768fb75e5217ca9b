// JobService over gRPC's callback API: translates requests to Supervisor and LogRouter calls and
// their results back. Unary calls answer on the gRPC thread that received them; WatchJob and
// GetLogs are server streams fed by the Supervisor (JobWatcher) and the LogRouter (LogSink).
//
// Threading: gRPC calls the methods on its own threads; the service holds no state of its own.
#ifndef TRAINYARD_SERVER_JOB_SERVICE_H_
#define TRAINYARD_SERVER_JOB_SERVICE_H_

#include "proto/trainyard.grpc.pb.h"
#include "server/log_router.h"
#include "server/supervisor.h"

namespace trainyard::server {

class JobServiceImpl final : public ::trainyard::v1::JobService::CallbackService {
 public:
  // Neither is owned; both must outlive the service.
  JobServiceImpl(Supervisor* supervisor, LogRouter* logs) : supervisor_(supervisor), logs_(logs) {}

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
  Supervisor* const supervisor_;
  LogRouter* const logs_;
};

}  // namespace trainyard::server

#endif  // TRAINYARD_SERVER_JOB_SERVICE_H_
