// WorkerService over gRPC's callback API: the rendezvous (Join), the attempt's key-value space
// and progress reports. Join and KvGet are long polls: their calls are answered from whichever
// thread completes them (another rank's Join, a KvSet, or the coordinator's ticker on timeout).
//
// Every call must carry the secret of the attempt it names (in its fields, or its key's prefix):
// a worker cannot join, report for or read the key-value space of another attempt.
//
// Threading: gRPC calls the methods on its own threads; the calls that may wait for the store
// (Join, ReportProgress, ReportHang, ConfirmAttempt) go on to the CallExecutor's. The service
// holds no state of its own.
#ifndef TRAINYARD_SERVER_WORKER_SERVICE_H_
#define TRAINYARD_SERVER_WORKER_SERVICE_H_

#include "absl/time/time.h"
#include "common/clock.h"
#include "proto/trainyard.grpc.pb.h"
#include "server/call_executor.h"
#include "server/kv_space.h"
#include "server/service_auth.h"
#include "server/supervisor.h"

namespace trainyard::server {

class WorkerServiceImpl final : public ::trainyard::v1::WorkerService::CallbackService {
 public:
  // None is owned; all must outlive the service.
  WorkerServiceImpl(Supervisor* supervisor, KvSpace* kv, Clock* clock, const ServiceAuth* auth,
                    CallExecutor* executor)
      : supervisor_(supervisor), kv_(kv), clock_(clock), auth_(auth), executor_(executor) {}

  // The longest a KvGet waits before answering found = false.
  static constexpr absl::Duration kMaxKvWait = absl::Seconds(30);

  grpc::ServerUnaryReactor* Join(grpc::CallbackServerContext* context,
                                 const ::trainyard::v1::JoinRequest* request,
                                 ::trainyard::v1::JoinReply* reply) override;
  grpc::ServerUnaryReactor* KvSet(grpc::CallbackServerContext* context,
                                  const ::trainyard::v1::KvSetRequest* request,
                                  ::trainyard::v1::KvSetReply* reply) override;
  grpc::ServerUnaryReactor* KvGet(grpc::CallbackServerContext* context,
                                  const ::trainyard::v1::KvGetRequest* request,
                                  ::trainyard::v1::KvGetReply* reply) override;
  grpc::ServerUnaryReactor* ReportProgress(grpc::CallbackServerContext* context,
                                           const ::trainyard::v1::ProgressReport* request,
                                           ::trainyard::v1::ProgressReply* reply) override;
  grpc::ServerUnaryReactor* ReportHang(grpc::CallbackServerContext* context,
                                       const v1::HangReport* request,
                                       v1::HangReply* reply) override;
  grpc::ServerUnaryReactor* ConfirmAttempt(grpc::CallbackServerContext* context,
                                           const v1::ConfirmAttemptRequest* request,
                                           v1::ConfirmAttemptReply* reply) override;

 private:
  // The caller holds the secret of the attempt whose space `key` is in.
  [[nodiscard]] absl::Status MayUseKey(const grpc::ServerContextBase& context,
                                       const std::string& key) const;

  Supervisor* const supervisor_;
  KvSpace* const kv_;
  Clock* const clock_;
  const ServiceAuth* const auth_;
  CallExecutor* const executor_;
};

}  // namespace trainyard::server

#endif  // TRAINYARD_SERVER_WORKER_SERVICE_H_
