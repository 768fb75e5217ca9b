// The gRPC side of the agent's progress relay (progress_relay.h): the ProgressRelay service on a
// loopback port, for this node's workers (their TRAINYARD_PROGRESS_RELAY). Plaintext: it never
// leaves the machine, and each call presents its attempt's secret.
//
// Threading: gRPC's threads call into the relay (thread-safe). The destructor stops the server.
#ifndef TRAINYARD_SERVER_AGENT_PROGRESS_RELAY_SERVICE_H_
#define TRAINYARD_SERVER_AGENT_PROGRESS_RELAY_SERVICE_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "server/agent/progress_relay.h"

namespace trainyard::server::agent {

class ProgressRelayServer {
 public:
  // Listens on 127.0.0.1:`port` (0: a free one). `relay` must outlive the server.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<ProgressRelayServer>> Start(
      ProgressRelay* relay, int port = 0);
  virtual ~ProgressRelayServer() = default;

  // 127.0.0.1:port
  virtual std::string address() const = 0;
};

}  // namespace trainyard::server::agent

#endif  // TRAINYARD_SERVER_AGENT_PROGRESS_RELAY_SERVICE_H_
