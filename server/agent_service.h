// AgentService over gRPC's callback API: one bidirectional Connect stream per agent. The stream
// reads agent messages and hands them to the Supervisor (registration, heartbeats, worker
// reports) and the LogRouter (log data); orders reach the agent through an AgentChannel that
// queues them on the stream.
//
// Threading: gRPC runs each stream's reactions on its threads, one read at a time per stream.
#ifndef TRAINYARD_SERVER_AGENT_SERVICE_H_
#define TRAINYARD_SERVER_AGENT_SERVICE_H_

#include "proto/trainyard.grpc.pb.h"
#include "server/log_router.h"
#include "server/supervisor.h"

namespace trainyard::server {

class AgentServiceImpl final : public ::trainyard::v1::AgentService::CallbackService {
 public:
  // Neither is owned; both must outlive the service.
  AgentServiceImpl(Supervisor* supervisor, LogRouter* logs)
      : supervisor_(supervisor), logs_(logs) {}

  grpc::ServerBidiReactor<::trainyard::v1::AgentMessage, ::trainyard::v1::CoordinatorMessage>*
  Connect(grpc::CallbackServerContext* context) override;

 private:
  Supervisor* const supervisor_;
  LogRouter* const logs_;
};

}  // namespace trainyard::server

#endif  // TRAINYARD_SERVER_AGENT_SERVICE_H_
