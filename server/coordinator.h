// Coordinator: the whole control-plane server in one object — the job store in the state
// directory, the managers, the gRPC services on one listening address, the /metrics exposer and
// the ticker thread that drives timeouts and scheduling. trainyard-server is a thin main() around
// it; integration tests and the embedded default run it in process.
//
// Security: it listens on loopback unless mutual TLS is configured; a non-loopback address
// without a certificate, a key and a client CA (clients must present certificates it signed) is
// refused (FAILED_PRECONDITION). Every call is authenticated (server/auth.h): the state directory
// holds the admin token (admin.token) and the key of the workers' attempt secrets (attempt.key),
// both created on first start with mode 0600. One coordinator per state directory: a
// second one is refused (FAILED_PRECONDITION) while the first holds the directory's lock.
//
// Threading: Start and Stop from one thread; accessors are thread-safe.
#ifndef TRAINYARD_SERVER_COORDINATOR_H_
#define TRAINYARD_SERVER_COORDINATOR_H_

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "server/node_quarantine.h"
#include "server/supervisor.h"

namespace grpc {
class Server;
}

namespace trainyard::server {

class AgentRegistry;
class AgentServiceImpl;
class AttemptSecrets;
class Authenticator;
class CallExecutor;
class ServiceAuth;
class StreamQuota;
class CoordinatorMetrics;
class JobServiceImpl;
class JobStore;
class KvSpace;
class LogRouter;
class MetricsServer;
class Supervisor;
class WorkerServiceImpl;

struct CoordinatorOptions {
  std::string listen = "127.0.0.1:0";          // host:port; port 0 picks a free one
  std::string state_dir = "trainyard-state";   // created when missing
  std::string metrics_listen = "127.0.0.1:0";  // empty: no /metrics
  // The agents' and workers' listener (AgentService, WorkerService); empty: the host of `listen`,
  // any free port. The main listener serves them too, but bounds the memory requests may hold
  // (request_memory_bytes), which thousands of agents' connections would exhaust.
  std::string cluster_listen;
  int64_t request_memory_bytes = 32 << 20;
  // The address workers are told to reach the coordinator at; empty: the cluster listener's bound
  // address (with the hostname in place of an unspecified host such as 0.0.0.0).
  std::string advertise_address;
  // TLS (all three required to listen beyond loopback): PEM files. With a client CA, clients must
  // present a certificate it signed (mutual TLS).
  std::string tls_cert_file;
  std::string tls_key_file;
  std::string tls_client_ca_file;
  absl::Duration stop_grace = absl::Seconds(10);
  absl::Duration node_mtbf = absl::Hours(5000);  // Young–Daly prior per node
  QuarantineOptions quarantine;
  absl::Duration heartbeat_interval = absl::Seconds(1);
  absl::Duration heartbeat_timeout = absl::Seconds(10);
  absl::Duration tick_interval = absl::Milliseconds(100);
  std::vector<std::string> allowed_data_roots;        // empty: data may be anywhere
  std::vector<std::string> allowed_checkpoint_roots;  // empty: checkpoints may be anywhere
  // Authentication (server/auth.h): the token file (empty: <state_dir>/tokens, when it exists);
  // the embedded admin token and the attempt key live in the state directory.
  std::string tokens_file;
  int max_streams_per_user = 64;       // open WatchJob and GetLogs streams
  int max_queued_jobs_per_user = 256;  // QUEUED jobs
  Clock* clock = nullptr;              // null: RealClock()
};

// True for 127.0.0.0/8, ::1 and "localhost".
bool IsLoopbackHost(const std::string& host);
// Splits "host:port" / "[v6]:port"; INVALID_ARGUMENT when malformed.
[[nodiscard]] absl::StatusOr<std::pair<std::string, int>> SplitHostPort(const std::string& address);

// Where the last start listened, kept in the state directory across stops and crashes (server.addr
// and metrics.addr go with a graceful stop): "grpc HOST:PORT", "cluster HOST:PORT" and
// "metrics HOST:PORT" lines.
inline constexpr char kLastAddressesFile[] = "last-addresses";

class Coordinator {
 public:
  // Opens the state, restores jobs, starts serving. The bound addresses are recorded in
  // <state_dir>/last-addresses before the chosen address is written to <state_dir>/server.addr
  // (and the metrics address to <state_dir>/metrics.addr): whoever has read server.addr may kill
  // this process and find the addresses recorded for the next start.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Coordinator>> Start(
      const CoordinatorOptions& options);
  ~Coordinator();  // Stop()s

  // Graceful shutdown: refuses new work, ends streams (agents reconnect to the next
  // coordinator), waits up to `deadline` for calls in flight, persists progress. Running jobs
  // keep running and are adopted by the next coordinator on the same state directory.
  void Stop(absl::Duration deadline = absl::Seconds(5));

  const std::string& address() const { return address_; }
  // The agents' and workers' listener (also written to <state_dir>/cluster.addr).
  const std::string& cluster_address() const { return cluster_address_; }
  const std::string& metrics_address() const { return metrics_address_; }
  Supervisor* supervisor() { return supervisor_.get(); }

 private:
  Coordinator() = default;
  [[nodiscard]] absl::Status Init(const CoordinatorOptions& options);
  // The admin token and attempt key of the state directory, the token file, and the services'
  // authentication built on them.
  [[nodiscard]] absl::Status InitAuth(const CoordinatorOptions& options);
  SupervisorOptions SupervisorOptionsFor(const CoordinatorOptions& options) const;
  void TickLoop(absl::Duration interval);

  int lock_fd_ = -1;
  Clock* clock_ = nullptr;
  std::unique_ptr<JobStore> store_;
  std::unique_ptr<AgentRegistry> registry_;
  std::unique_ptr<KvSpace> kv_;
  std::unique_ptr<Authenticator> authenticator_;
  std::unique_ptr<AttemptSecrets> secrets_;
  std::unique_ptr<ServiceAuth> service_auth_;
  std::unique_ptr<StreamQuota> streams_;
  std::unique_ptr<Supervisor> supervisor_;
  std::unique_ptr<LogRouter> logs_;
  // The calls that may wait for the store run here, not on gRPC's threads; stopped after the
  // listeners, which wait for those calls' answers.
  std::unique_ptr<CallExecutor> executor_;
  std::unique_ptr<JobServiceImpl> job_service_;
  std::unique_ptr<AgentServiceImpl> agent_service_;
  std::unique_ptr<WorkerServiceImpl> worker_service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<grpc::Server> cluster_server_;
  std::shared_ptr<CoordinatorMetrics> metrics_;
  std::unique_ptr<MetricsServer> metrics_server_;
  absl::Notification stopping_;
  std::thread ticker_;
  bool stopped_ = false;
  std::string address_;
  std::string cluster_address_;
  std::string metrics_address_;
  std::string state_dir_;  // set once the address files are written
};

}  // namespace trainyard::server

#endif  // TRAINYARD_SERVER_COORDINATOR_H_
