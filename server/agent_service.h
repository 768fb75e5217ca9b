// AgentService over gRPC's callback API: one bidirectional Connect stream per agent. The stream
// reads agent messages and hands them to the Supervisor (registration, heartbeats, worker
// reports) and the LogRouter (log data); orders reach the agent through an AgentChannel that
// queues them on the stream. Only agents (and admins) may connect (ServiceAuth::Agent).
//
// Threading: gRPC runs each stream's reactions on its threads, one read at a time per stream.
#ifndef TRAINYARD_SERVER_AGENT_SERVICE_H_
#define TRAINYARD_SERVER_AGENT_SERVICE_H_

#include "proto/trainyard.grpc.pb.h"
#include "server/call_executor.h"
#include "server/log_router.h"
#include "server/service_auth.h"
#include "server/supervisor.h"

namespace trainyard::server {

class AgentServiceImpl final : public ::trainyard::v1::AgentService::CallbackService {
 public:
  // None is owned; all must outlive the service.
  // `executor` handles the agents' messages that wait for the store (see AgentStream).
  AgentServiceImpl(Supervisor* supervisor, LogRouter* logs, const ServiceAuth* auth,
                   CallExecutor* executor)
      : supervisor_(supervisor), logs_(logs), auth_(auth), executor_(executor) {}

  grpc::ServerBidiReactor<::trainyard::v1::AgentMessage, ::trainyard::v1::CoordinatorMessage>*
  Connect(grpc::CallbackServerContext* context) override;

 private:
  Supervisor* const supervisor_;
  LogRouter* const logs_;
  const ServiceAuth* const auth_;
  CallExecutor* const executor_;
};

}  // namespace trainyard::server

#endif  // TRAINYARD_SERVER_AGENT_SERVICE_H_
