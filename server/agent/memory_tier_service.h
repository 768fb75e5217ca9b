// The gRPC side of a node's memory tier: serves MemoryTierService (local workers reserve, commit,
// ask whether a copy of theirs is pending and, restoring, ask what the attempt's nodes hold and
// have the ranks their node lacks fetched; peer agents send copies, list and fetch) and sends this
// node's queued peer copies to their peers.
//
// Threading: gRPC's threads call into MemoryTier (thread-safe) and run the fetches, one gather at
// a time per node; one thread of its own sends the copies, one at a time. The destructor stops
// both.
#ifndef TRAINYARD_SERVER_AGENT_MEMORY_TIER_SERVICE_H_
#define TRAINYARD_SERVER_AGENT_MEMORY_TIER_SERVICE_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/filesystem.h"
#include "common/rpc.h"
#include "server/agent/memory_tier.h"

namespace trainyard::server::agent {

class MemoryTierServer {
 public:
  // Listens on `listen` (host:port; port 0 picks a free one). Peers are told to reach it at
  // `advertise_host` and the chosen port. With `tls` the service admits only callers presenting a
  // certificate its CA signed, and copies to peers present the same certificate. `tier` and `fs`
  // must outlive the server.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<MemoryTierServer>> Start(
      MemoryTier* tier, FileSystem* fs, const std::string& listen,
      const std::string& advertise_host, const std::string& node_id, const rpc::TlsFiles& tls = {});
  virtual ~MemoryTierServer() = default;

  // host:port for peers, and for this node's workers 127.0.0.1:port (with TLS the same as
  // address(), the name the certificate carries).
  virtual std::string address() const = 0;
  virtual std::string local_address() const = 0;
};

}  // namespace trainyard::server::agent

#endif  // TRAINYARD_SERVER_AGENT_MEMORY_TIER_SERVICE_H_
