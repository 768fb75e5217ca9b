#include "server/coordinator.h"

#include <fcntl.h>
#include <pwd.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/filesystem.h"
#include "common/logging.h"
#include "common/status.h"
#include "config/path_confinement.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/resource_quota.h"
#include "grpcpp/security/server_credentials.h"
#include "server/agent_registry.h"
#include "server/agent_service.h"
#include "server/auth.h"
#include "server/job_service.h"
#include "server/job_store.h"
#include "server/kv_space.h"
#include "server/log_router.h"
#include "server/metrics.h"
#include "server/service_auth.h"
#include "server/supervisor.h"
#include "server/worker_service.h"

namespace trainyard::server {
namespace {

// Files go through the FileSystem seam: writes are atomic and durable (synced, then renamed).
absl::StatusOr<std::string> ReadFile(const std::string& path) {
  return RealFileSystem()->ReadFile(path);
}

absl::Status WriteFileAtomically(const std::string& path, const std::string& contents) {
  return RealFileSystem()->WriteFileAtomic(path, contents);
}

std::string JoinHostPort(const std::string& host, int port) {
  if (host.find(':') != std::string::npos) return absl::StrCat("[", host, "]:", port);
  return absl::StrCat(host, ":", port);
}

// The login name of the user this process runs as: the embedded admin token's identity.
std::string ProcessUser() {
  if (const passwd* entry = getpwuid(geteuid()); entry != nullptr) return entry->pw_name;
  return absl::StrCat("uid ", geteuid());
}

std::string Hostname() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "localhost";
  return name;
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> Credentials(
    const CoordinatorOptions& options) {
  const bool tls = !options.tls_cert_file.empty() || !options.tls_key_file.empty();
  if (!tls) {
    if (!options.tls_client_ca_file.empty()) {
      return absl::InvalidArgumentError("--tls-client-ca needs --tls-cert and --tls-key");
    }
    return grpc::InsecureServerCredentials();
  }
  if (options.tls_cert_file.empty() || options.tls_key_file.empty()) {
    return absl::InvalidArgumentError("TLS needs both --tls-cert and --tls-key");
  }
  grpc::SslServerCredentialsOptions ssl;
  grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
  TY_ASSIGN_OR_RETURN(pair.private_key, ReadFile(options.tls_key_file));
  TY_ASSIGN_OR_RETURN(pair.cert_chain, ReadFile(options.tls_cert_file));
  ssl.pem_key_cert_pairs.push_back(std::move(pair));
  if (!options.tls_client_ca_file.empty()) {
    TY_ASSIGN_OR_RETURN(ssl.pem_root_certs, ReadFile(options.tls_client_ca_file));
    ssl.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(ssl);
}

// `paths` made absolute against this process's working directory, so that confinement roots mean
// the same to the workers, which confine their own file access to them from elsewhere.
std::vector<std::string> AbsolutePaths(const std::vector<std::string>& paths) {
  std::error_code error;
  const std::string cwd = std::filesystem::current_path(error).string();
  std::vector<std::string> out;
  for (const std::string& path : paths) out.push_back(config::NormalizePath(path, cwd));
  return out;
}

// Beyond loopback the coordinator must both encrypt and authenticate (mutual TLS): anyone who
// can reach it can start processes on every node. FAILED_PRECONDITION for an address that would
// be exposed without it.
absl::Status CheckExposure(const CoordinatorOptions& options, bool tls) {
  const std::pair<const char*, const std::string*> addresses[] = {
      {"--listen", &options.listen},
      {"--cluster-listen", &options.cluster_listen},
      {"--metrics-listen", &options.metrics_listen}};
  for (const auto& [flag, address] : addresses) {
    if (address->empty()) continue;  // cluster: the listen host; metrics: off
    TY_ASSIGN_OR_RETURN_WITH(auto host, SplitHostPort(*address), flag);
    if (!IsLoopbackHost(host.first) && !tls) {
      return absl::FailedPreconditionError(absl::StrCat(
          "refusing to listen on ", *address, " (", flag,
          ") without TLS and client authentication: use a loopback address or give --tls-cert, "
          "--tls-key and --tls-client-ca"));
    }
  }
  return absl::OkStatus();
}

struct Listener {
  std::unique_ptr<grpc::Server> server;
  int port = 0;
};

// A gRPC server on `address` with `services`; `quota_bytes` > 0 bounds the memory its requests
// may hold at once (gRPC buffers a whole message before its size limit applies: without a
// quota a 100 MB request costs 100 MB before it is refused).
absl::StatusOr<Listener> Listen(const std::string& address,
                                const std::shared_ptr<grpc::ServerCredentials>& credentials,
                                const std::vector<grpc::Service*>& services, int64_t quota_bytes) {
  grpc::ServerBuilder builder;
  Listener listener;
  builder.AddListeningPort(address, credentials, &listener.port);
  for (grpc::Service* service : services) builder.RegisterService(service);
  // Agents and workers may keep idle connections alive with pings.
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  // A port another process holds is taken as unavailable, not shared (a restart prefers its
  // previous port, and two coordinators on one port would split the agents between them).
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 5000);
  builder.SetMaxReceiveMessageSize(4 << 20);
  if (quota_bytes > 0) {
    grpc::ResourceQuota quota(absl::StrCat("trainyard-", address));
    quota.Resize(static_cast<size_t>(quota_bytes));
    builder.SetResourceQuota(quota);
  }
  listener.server = builder.BuildAndStart();
  if (listener.server == nullptr || listener.port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", address));
  }
  return listener;
}

}  // namespace

bool IsLoopbackHost(const std::string& host) {
  if (host == "localhost" || host == "::1" || host == "[::1]") return true;
  return absl::StartsWith(host, "127.");
}

absl::StatusOr<std::pair<std::string, int>> SplitHostPort(const std::string& address) {
  std::string host;
  std::string port;
  if (absl::StartsWith(address, "[")) {
    const size_t close = address.find(']');
    if (close == std::string::npos || close + 1 >= address.size() || address[close + 1] != ':') {
      return absl::InvalidArgumentError(absl::StrCat("bad address '", address, "'"));
    }
    host = address.substr(1, close - 1);
    port = address.substr(close + 2);
  } else {
    const size_t colon = address.rfind(':');
    if (colon == std::string::npos || address.find(':') != colon) {
      return absl::InvalidArgumentError(
          absl::StrCat("bad address '", address, "': expected host:port"));
    }
    host = address.substr(0, colon);
    port = address.substr(colon + 1);
  }
  int number = 0;
  if (host.empty() || !absl::SimpleAtoi(port, &number) || number < 0 || number > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad address '", address, "': expected host:port"));
  }
  return std::make_pair(host, number);
}

absl::StatusOr<std::unique_ptr<Coordinator>> Coordinator::Start(const CoordinatorOptions& options) {
  std::unique_ptr<Coordinator> coordinator(new Coordinator());
  absl::Status status = coordinator->Init(options);
  if (!status.ok()) {
    coordinator->Stop(absl::ZeroDuration());
    return status;
  }
  return coordinator;
}

absl::Status Coordinator::Init(const CoordinatorOptions& options) {
  clock_ = options.clock != nullptr ? options.clock : RealClock();
  TY_ASSIGN_OR_RETURN_WITH(auto listen, SplitHostPort(options.listen), "--listen");
  TY_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> credentials, Credentials(options));
  const bool tls = !options.tls_cert_file.empty() && !options.tls_client_ca_file.empty();
  TY_RETURN_IF_ERROR(CheckExposure(options, tls));

  std::error_code error;
  std::filesystem::create_directories(options.state_dir, error);
  if (error) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create state directory ", options.state_dir, ": ", error.message()));
  }
  const std::string lock_path = options.state_dir + "/lock";
  lock_fd_ = open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (lock_fd_ < 0) {
    return ErrnoStatus(errno, absl::StrCat("cannot open ", lock_path));
  }
  if (flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("another coordinator is using the state directory ", options.state_dir));
  }

  TY_RETURN_IF_ERROR(InitAuth(options));
  TY_ASSIGN_OR_RETURN(store_, JobStore::Open(options.state_dir + "/coordinator.db"));
  registry_ = std::make_unique<AgentRegistry>(clock_, options.heartbeat_timeout);
  kv_ = std::make_unique<KvSpace>(clock_);
  TY_ASSIGN_OR_RETURN(supervisor_, Supervisor::Create(store_.get(), registry_.get(), kv_.get(),
                                                      clock_, SupervisorOptionsFor(options)));
  logs_ = std::make_unique<LogRouter>(registry_.get());
  executor_ = std::make_unique<CallExecutor>();
  job_service_ = std::make_unique<JobServiceImpl>(
      supervisor_.get(), logs_.get(), service_auth_.get(), streams_.get(), executor_.get());
  agent_service_ = std::make_unique<AgentServiceImpl>(supervisor_.get(), logs_.get(),
                                                      service_auth_.get(), executor_.get());
  worker_service_ = std::make_unique<WorkerServiceImpl>(supervisor_.get(), kv_.get(), clock_,
                                                        service_auth_.get(), executor_.get());

  // The main listener takes every service, its requests' memory bounded; the cluster listener
  // takes the agents' and workers' traffic, unbounded by that quota (at thousands of connections
  // their buffers alone would exhaust it).
  TY_ASSIGN_OR_RETURN(Listener main,
                      Listen(options.listen, credentials,
                             {job_service_.get(), agent_service_.get(), worker_service_.get()},
                             options.request_memory_bytes));
  server_ = std::move(main.server);
  address_ = JoinHostPort(listen.first, main.port);
  const std::string cluster_listen =
      options.cluster_listen.empty() ? JoinHostPort(listen.first, 0) : options.cluster_listen;
  TY_ASSIGN_OR_RETURN_WITH(auto cluster_host, SplitHostPort(cluster_listen), "--cluster-listen");
  if (!IsLoopbackHost(cluster_host.first) && !tls) {
    return absl::FailedPreconditionError(absl::StrCat("refusing to listen on ", cluster_listen,
                                                      " without TLS and client authentication"));
  }
  TY_ASSIGN_OR_RETURN(Listener cluster,
                      Listen(cluster_listen, credentials,
                             {agent_service_.get(), worker_service_.get()}, /*quota_bytes=*/0));
  cluster_server_ = std::move(cluster.server);
  cluster_address_ = JoinHostPort(cluster_host.first, cluster.port);
  std::string advertise = options.advertise_address;
  if (advertise.empty()) {
    const bool unspecified = cluster_host.first == "0.0.0.0" || cluster_host.first == "::";
    advertise = JoinHostPort(unspecified ? Hostname() : cluster_host.first, cluster.port);
  }
  supervisor_->SetCoordinatorAddress(advertise);

  if (!options.metrics_listen.empty()) {
    metrics_ = std::make_shared<CoordinatorMetrics>(supervisor_.get());
    TY_ASSIGN_OR_RETURN(metrics_server_, MetricsServer::Start(options.metrics_listen, metrics_));
    metrics_address_ = metrics_server_->address();
    TY_RETURN_IF_ERROR(
        WriteFileAtomically(options.state_dir + "/metrics.addr", metrics_address_ + "\n"));
  }
  TY_RETURN_IF_ERROR(
      WriteFileAtomically(options.state_dir + "/cluster.addr", cluster_address_ + "\n"));
  std::string last = absl::StrCat("grpc ", address_, "\ncluster ", cluster_address_, "\n");
  if (!metrics_address_.empty()) absl::StrAppend(&last, "metrics ", metrics_address_, "\n");
  TY_RETURN_IF_ERROR(
      WriteFileAtomically(absl::StrCat(options.state_dir, "/", kLastAddressesFile), last));
  TY_RETURN_IF_ERROR(WriteFileAtomically(options.state_dir + "/server.addr", address_ + "\n"));
  state_dir_ = options.state_dir;
  ticker_ = std::thread([this, interval = options.tick_interval] { TickLoop(interval); });
  TY_LOG(INFO) << "coordinator listening on " << address_
               << " (agents and workers: " << cluster_address_ << ")"
               << (metrics_address_.empty()
                       ? ""
                       : absl::StrCat(", metrics on http://", metrics_address_, "/metrics"))
               << ", state in " << options.state_dir;
  return absl::OkStatus();
}

SupervisorOptions Coordinator::SupervisorOptionsFor(const CoordinatorOptions& options) const {
  SupervisorOptions supervisor_options;
  supervisor_options.stop_grace = options.stop_grace;
  supervisor_options.node_mtbf = options.node_mtbf;
  supervisor_options.quarantine = options.quarantine;
  supervisor_options.heartbeat_interval = options.heartbeat_interval;
  supervisor_options.spec_limits.allowed_data_roots = AbsolutePaths(options.allowed_data_roots);
  supervisor_options.spec_limits.allowed_checkpoint_roots =
      AbsolutePaths(options.allowed_checkpoint_roots);
  supervisor_options.attempt_secret = [secrets = secrets_.get()](const std::string& job_id,
                                                                 int attempt_id) {
    return secrets->For(job_id, attempt_id);
  };
  supervisor_options.max_queued_jobs_per_user = options.max_queued_jobs_per_user;
  return supervisor_options;
}

absl::Status Coordinator::InitAuth(const CoordinatorOptions& options) {
  TY_ASSIGN_OR_RETURN(const std::string admin_token,
                      LoadOrCreateSecret(options.state_dir + "/admin.token", NewToken));
  TY_ASSIGN_OR_RETURN(
      const std::string attempt_key,
      LoadOrCreateSecret(options.state_dir + "/attempt.key", [] { return RandomHex(32); }));
  AuthOptions auth;
  auth.tokens_file =
      options.tokens_file.empty() ? options.state_dir + "/tokens" : options.tokens_file;
  auth.tokens_file_required = !options.tokens_file.empty();
  auth.admin_sha256 = Sha256Hex(admin_token);
  auth.admin_user = ProcessUser();
  auth.clock = clock_;
  authenticator_ = std::make_unique<Authenticator>(std::move(auth));
  TY_RETURN_IF_ERROR(authenticator_->Load());
  secrets_ = std::make_unique<AttemptSecrets>(attempt_key);
  service_auth_ = std::make_unique<ServiceAuth>(authenticator_.get(), secrets_.get());
  streams_ = std::make_unique<StreamQuota>(options.max_streams_per_user);
  return absl::OkStatus();
}

void Coordinator::TickLoop(absl::Duration interval) {
  while (!stopping_.WaitForNotificationWithTimeout(interval)) supervisor_->Tick();
}

void Coordinator::Stop(absl::Duration deadline) {
  if (stopped_) return;
  stopped_ = true;
  if (!stopping_.HasBeenNotified()) stopping_.Notify();
  if (ticker_.joinable()) ticker_.join();
  if (supervisor_ != nullptr) supervisor_->Shutdown();
  if (logs_ != nullptr) logs_->CloseAll(absl::UnavailableError("the coordinator is shutting down"));
  for (std::unique_ptr<grpc::Server>* server : {&server_, &cluster_server_}) {
    if (*server == nullptr) continue;
    (*server)->Shutdown(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(deadline));
    (*server)->Wait();
  }
  executor_.reset();
  metrics_server_.reset();
  if (!state_dir_.empty()) {
    std::error_code ignored;
    std::filesystem::remove(state_dir_ + "/server.addr", ignored);
    std::filesystem::remove(state_dir_ + "/cluster.addr", ignored);
    std::filesystem::remove(state_dir_ + "/metrics.addr", ignored);
  }
  if (lock_fd_ >= 0) {
    close(lock_fd_);
    lock_fd_ = -1;
  }
  TY_LOG(INFO) << "coordinator stopped";
}

Coordinator::~Coordinator() { Stop(); }

}  // namespace trainyard::server
