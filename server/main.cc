// trainyard-server: the coordinator. With no flags it is the embedded default: state in
// ./trainyard-state, gRPC and /metrics on loopback (free ports, printed and written to
// <state-dir>/server.addr and metrics.addr), and a local agent offering this machine's CPU slots
// and GPUs. SIGTERM or SIGINT shut it down gracefully; running jobs keep running and a restarted
// server on the same state directory adopts them.
//
// Exit codes: 0 after a graceful shutdown; 2 bad flags or a state directory in use; 1 otherwise.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/logging.h"
#include "common/rpc.h"
#include "common/status.h"
#include "server/coordinator.h"
#include "server/token_command.h"
#if TRAINYARD_SERVER_WITH_AGENT
#include "server/agent/agent.h"
#endif

namespace trainyard::server {
namespace {

constexpr char kUsage[] = R"(usage: trainyard-server [flags]
  --listen HOST:PORT         gRPC address (default 127.0.0.1:0: a free loopback port); the CLI's
  --cluster-listen HOST:PORT the agents' and workers' gRPC address (default: --listen's host, a
                             free port; written to <state-dir>/cluster.addr): unlike --listen it
                             does not bound the memory requests hold, which thousands of agents
                             would exhaust
  --state-dir DIR            jobs, events and node records (default ./trainyard-state)
  --metrics-listen HOST:PORT Prometheus /metrics (default 127.0.0.1:0; "off" disables)
  --no-local-agent           do not run an agent in this process
  --agent-slots N            CPU slots of the local agent (default: the CPU cores)
  --agent-node-id ID         node id of the local agent (default: the hostname)
  --worker-binary PATH       trainyard-worker for the local agent (default: found beside this)
  --agent-memory-tier-dir DIR  the local agent's memory tier (default: under /dev/shm)
  --agent-memory-tier-mb N   its budget in MiB (default: a quarter of memory; 0: no tier)
  --agent-pass-env PATTERN   another variable (or PREFIX*) the local agent passes to workers
  --advertise-address H:P    address workers reach the coordinator at (default: the bound
                             --cluster-listen one)
  --tls-cert FILE --tls-key FILE [--tls-client-ca FILE]
                             serve TLS; with a client CA, clients must present certificates it
                             signed (all three are required for a non-loopback --listen)
  --stop-grace SECONDS       SIGTERM-to-SIGKILL grace when stopping workers (default 10)
  --heartbeat-timeout SECONDS  close a silent agent's stream after this long (default 10)
  --node-mtbf-hours H        prior mean time between failures of one node, for Young–Daly
                             checkpoint intervals (default 5000)
  --quarantine-failures N    cordon a node after N failures of attempts on it within the
                             window (default 3; 0 disables)
  --quarantine-window SECONDS  (default 600)
  --quarantine-cooldown SECONDS  how long a cordon lasts (default 1800)
  --tokens FILE              the token file (default <state-dir>/tokens; see
                             `trainyard-server token`); the admin token is <state-dir>/admin.token
  --max-streams-per-user N   open watch and logs streams per user (default 64)
  --max-queued-jobs-per-user N  queued jobs per user (default 256)
  --data-root DIR            confine data paths of submitted specs (repeatable)
  --checkpoint-root DIR      confine checkpoint dirs of submitted specs (repeatable)
  --log-level LEVEL          debug | info | warning | error (default info)

       trainyard-server token add|revoke|list ...   manage the token file (token --help))";

struct Flags {
  CoordinatorOptions coordinator;
  bool listen_given = false;
  bool local_agent = true;
  int agent_slots = 0;
  std::string agent_memory_tier_dir;
  std::vector<std::string> agent_pass_env;
  int64_t agent_memory_tier_mb = -1;
  std::string agent_node_id;
  std::string worker_binary;
};

absl::Status ParseSeconds(const std::string& flag, const std::string& text, absl::Duration* out) {
  double seconds = 0;
  if (!absl::SimpleAtod(text, &seconds) || !(seconds > 0) || seconds > 86400) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": expected seconds in (0, 86400], got '", text, "'"));
  }
  *out = absl::Seconds(seconds);
  return absl::OkStatus();
}

// The memory tier's budget: a whole number of MiB, 0 meaning none.
absl::Status ParseMemoryTierMib(const std::string& flag, const std::string& text, int64_t* out) {
  if (!absl::SimpleAtoi(text, out) || *out < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": expected a whole number of MiB (0: no tier), got '", text, "'"));
  }
  return absl::OkStatus();
}

// A per-user limit: 1 to 1,000,000.
absl::Status ParseLimit(const std::string& flag, const std::string& text, int* out) {
  if (!absl::SimpleAtoi(text, out) || *out < 1 || *out > 1000000) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": expected 1 to 1000000, got '", text, "'"));
  }
  return absl::OkStatus();
}

// The flags of TLS, authentication, limits and path confinement; false when `arg` is another.
absl::StatusOr<bool> ParseSecurityFlag(const std::string& arg,
                                       const std::function<absl::StatusOr<std::string>()>& value,
                                       CoordinatorOptions& c) {
  std::string* file = arg == "--tls-cert"        ? &c.tls_cert_file
                      : arg == "--tls-key"       ? &c.tls_key_file
                      : arg == "--tls-client-ca" ? &c.tls_client_ca_file
                      : arg == "--tokens"        ? &c.tokens_file
                                                 : nullptr;
  if (file != nullptr) {
    TY_ASSIGN_OR_RETURN(*file, value());
  } else if (arg == "--max-streams-per-user" || arg == "--max-queued-jobs-per-user") {
    TY_ASSIGN_OR_RETURN(std::string text, value());
    TY_RETURN_IF_ERROR(ParseLimit(
        arg, text,
        arg == "--max-streams-per-user" ? &c.max_streams_per_user : &c.max_queued_jobs_per_user));
  } else if (arg == "--data-root" || arg == "--checkpoint-root") {
    TY_ASSIGN_OR_RETURN(std::string dir, value());
    (arg == "--data-root" ? c.allowed_data_roots : c.allowed_checkpoint_roots).push_back(dir);
  } else {
    return false;
  }
  return true;
}

absl::StatusOr<Flags> ParseFlags(int argc, char** argv) {
  Flags flags;
  flags.coordinator.state_dir = "trainyard-state";
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    std::string inline_value;
    bool has_inline = false;
    if (const size_t eq = arg.find('='); arg.rfind("--", 0) == 0 && eq != std::string::npos) {
      inline_value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
      has_inline = true;
    }
    auto value = [&]() -> absl::StatusOr<std::string> {
      if (has_inline) return inline_value;
      if (i + 1 >= argc) return absl::InvalidArgumentError(absl::StrCat(arg, " needs a value"));
      return std::string(argv[++i]);
    };
    CoordinatorOptions& c = flags.coordinator;
    TY_ASSIGN_OR_RETURN(const bool security, ParseSecurityFlag(arg, value, c));
    if (security) continue;
    if (arg == "--listen") {
      TY_ASSIGN_OR_RETURN(c.listen, value());
      flags.listen_given = true;
    } else if (arg == "--cluster-listen") {
      TY_ASSIGN_OR_RETURN(c.cluster_listen, value());
    } else if (arg == "--state-dir") {
      TY_ASSIGN_OR_RETURN(c.state_dir, value());
    } else if (arg == "--metrics-listen") {
      TY_ASSIGN_OR_RETURN(c.metrics_listen, value());
      if (c.metrics_listen == "off") c.metrics_listen.clear();
    } else if (arg == "--no-local-agent") {
      flags.local_agent = false;
    } else if (arg == "--agent-slots") {
      TY_ASSIGN_OR_RETURN(std::string text, value());
      if (!absl::SimpleAtoi(text, &flags.agent_slots) || flags.agent_slots < 1) {
        return absl::InvalidArgumentError(
            absl::StrCat("--agent-slots: expected a positive integer, got '", text, "'"));
      }
    } else if (arg == "--agent-node-id") {
      TY_ASSIGN_OR_RETURN(flags.agent_node_id, value());
    } else if (arg == "--worker-binary") {
      TY_ASSIGN_OR_RETURN(flags.worker_binary, value());
    } else if (arg == "--agent-pass-env") {
      TY_ASSIGN_OR_RETURN(std::string pattern, value());
      flags.agent_pass_env.push_back(std::move(pattern));
    } else if (arg == "--agent-memory-tier-dir") {
      TY_ASSIGN_OR_RETURN(flags.agent_memory_tier_dir, value());
    } else if (arg == "--agent-memory-tier-mb") {
      TY_ASSIGN_OR_RETURN(const std::string text, value());
      TY_RETURN_IF_ERROR(ParseMemoryTierMib(arg, text, &flags.agent_memory_tier_mb));
    } else if (arg == "--advertise-address") {
      TY_ASSIGN_OR_RETURN(c.advertise_address, value());
    } else if (arg == "--stop-grace") {
      TY_ASSIGN_OR_RETURN(std::string text, value());
      TY_RETURN_IF_ERROR(ParseSeconds(arg, text, &c.stop_grace));
    } else if (arg == "--heartbeat-timeout") {
      TY_ASSIGN_OR_RETURN(std::string text, value());
      TY_RETURN_IF_ERROR(ParseSeconds(arg, text, &c.heartbeat_timeout));
    } else if (arg == "--node-mtbf-hours") {
      TY_ASSIGN_OR_RETURN(std::string text, value());
      double hours = 0;
      if (!absl::SimpleAtod(text, &hours) || !(hours > 0 && hours <= 1e7)) {
        return absl::InvalidArgumentError(
            absl::StrCat(arg, ": expected hours in (0, 1e7], got '", text, "'"));
      }
      c.node_mtbf = absl::Hours(hours);
    } else if (arg == "--quarantine-failures") {
      TY_ASSIGN_OR_RETURN(std::string text, value());
      if (!absl::SimpleAtoi(text, &c.quarantine.failures) || c.quarantine.failures < 0 ||
          c.quarantine.failures > 1000) {
        return absl::InvalidArgumentError(
            absl::StrCat(arg, ": expected 0 to 1000, got '", text, "'"));
      }
    } else if (arg == "--quarantine-window") {
      TY_ASSIGN_OR_RETURN(std::string text, value());
      TY_RETURN_IF_ERROR(ParseSeconds(arg, text, &c.quarantine.window));
    } else if (arg == "--quarantine-cooldown") {
      TY_ASSIGN_OR_RETURN(std::string text, value());
      TY_RETURN_IF_ERROR(ParseSeconds(arg, text, &c.quarantine.cooldown));
    } else if (arg == "--log-level") {
      TY_ASSIGN_OR_RETURN(std::string text, value());
      TY_ASSIGN_OR_RETURN(LogLevel level, ParseLogLevel(text));
      SetMinLogLevel(level);
    } else if (arg == "--help" || arg == "-h") {
      std::cout << kUsage << std::endl;
      std::exit(0);
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag '", arg, "'"));
    }
  }
  return flags;
}

// SIGTERM/SIGINT wake the main thread through a pipe; the handler does nothing else.
int signal_pipe[2] = {-1, -1};

void OnSignal(int signal_number) {
  const char byte = static_cast<char>(signal_number);
  [[maybe_unused]] ssize_t ignored = write(signal_pipe[1], &byte, 1);
}

absl::Status InstallSignalHandlers() {
  if (pipe2(signal_pipe, O_CLOEXEC) != 0) {
    return ErrnoEnvironmentError(errno, "pipe");
  }
  struct sigaction action = {};
  action.sa_handler = OnSignal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);
  signal(SIGPIPE, SIG_IGN);
  return absl::OkStatus();
}

int WaitForSignal() {
  char byte = 0;
  while (read(signal_pipe[0], &byte, 1) < 0 && errno == EINTR) {
  }
  return byte;
}

// Where the previous start listened, kept in the state directory across stops (server.addr and
// metrics.addr go with a graceful stop): "grpc HOST:PORT" and "metrics HOST:PORT" lines.
constexpr char kLastAddresses[] = "last-addresses";

std::map<std::string, std::string> ReadLastAddresses(const std::string& state_dir) {
  std::map<std::string, std::string> last;
  std::ifstream in(state_dir + "/" + kLastAddresses);
  std::string kind, address;
  while (in >> kind >> address) last[kind] = address;
  return last;
}

void WriteLastAddresses(const std::string& state_dir, const Coordinator& coordinator) {
  const std::string path = state_dir + "/" + kLastAddresses;
  {
    std::ofstream out(path + ".tmp", std::ios::trunc);
    out << "grpc " << coordinator.address() << "\n";
    out << "cluster " << coordinator.cluster_address() << "\n";
    if (!coordinator.metrics_address().empty()) {
      out << "metrics " << coordinator.metrics_address() << "\n";
    }
  }
  std::error_code ignored;
  std::filesystem::rename(path + ".tmp", path, ignored);
}

// `wanted` with port 0 (any free port) becomes `previous` when that is on the same host: a
// restarted coordinator keeps its ports, so agents, workers that survived it and a fixed
// Prometheus target reach it where they did.
std::string PreferPrevious(const std::string& wanted, const std::string& previous) {
  const size_t colon = wanted.rfind(':');
  if (colon == std::string::npos || wanted.substr(colon + 1) != "0") return wanted;
  const size_t previous_colon = previous.rfind(':');
  if (previous_colon == std::string::npos ||
      previous.substr(0, previous_colon) != wanted.substr(0, colon)) {
    return wanted;
  }
  return previous;
}

// Listens where the previous start did when the flags ask for any free port; when those ports
// have been taken since, on new ones.
absl::StatusOr<std::unique_ptr<Coordinator>> StartCoordinator(const Flags& flags) {
  const std::map<std::string, std::string> last = ReadLastAddresses(flags.coordinator.state_dir);
  CoordinatorOptions options = flags.coordinator;
  if (last.count("grpc")) options.listen = PreferPrevious(options.listen, last.at("grpc"));
  // The cluster port too: agents, and workers that outlive this process, reconnect to it.
  if (last.count("cluster")) {
    const std::string wanted = options.cluster_listen.empty()
                                   ? options.listen.substr(0, options.listen.rfind(':')) + ":0"
                                   : options.cluster_listen;
    options.cluster_listen = PreferPrevious(wanted, last.at("cluster"));
  }
  if (last.count("metrics") && !options.metrics_listen.empty()) {
    options.metrics_listen = PreferPrevious(options.metrics_listen, last.at("metrics"));
  }
  absl::StatusOr<std::unique_ptr<Coordinator>> started = Coordinator::Start(options);
  if (!started.ok() && (options.listen != flags.coordinator.listen ||
                        options.cluster_listen != flags.coordinator.cluster_listen ||
                        options.metrics_listen != flags.coordinator.metrics_listen)) {
    TY_LOG(WARNING) << "the previous addresses are unavailable (" << started.status().message()
                    << "); listening on new ports";
    started = Coordinator::Start(flags.coordinator);
  }
  if (started.ok()) WriteLastAddresses(flags.coordinator.state_dir, **started);
  return started;
}

// The host of the address workers are told to reach the coordinator at (--advertise-address, else
// the bound address); "" when that is an unspecified address (the agent then uses the hostname).
std::string AdvertisedHost(const CoordinatorOptions& options, const std::string& bound) {
  const std::string address = options.advertise_address.empty() ? bound : options.advertise_address;
  absl::StatusOr<std::pair<std::string, int>> split = SplitHostPort(address);
  if (!split.ok() || split->first == "0.0.0.0" || split->first == "::") return "";
  return split->first;
}

absl::Status Run(int argc, char** argv) {
  absl::StatusOr<Flags> parsed = ParseFlags(argc, argv);
  if (!parsed.ok()) return Annotate(parsed.status(), kUsage);
  const Flags& flags = *parsed;
  // Debian's Abseil checks every Mutex acquisition for lock-order cycles (its debug default);
  // that bookkeeping cost about 6% of the coordinator's CPU under load (perf, 8,192 simulated
  // agents). Lock discipline is checked at build time instead (thread_safety_check).
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  TY_RETURN_IF_ERROR(InstallSignalHandlers());
  TY_ASSIGN_OR_RETURN(std::unique_ptr<Coordinator> coordinator, StartCoordinator(flags));
  std::cout << "trainyard-server listening on " << coordinator->address();
  if (!coordinator->metrics_address().empty()) {
    std::cout << " (metrics http://" << coordinator->metrics_address() << "/metrics)";
  }
  std::cout << std::endl;

  std::atomic<bool> stop_agent{false};
  std::thread agent;
  absl::Status agent_status;
  if (flags.local_agent) {
#if TRAINYARD_SERVER_WITH_AGENT
    agent::AgentOptions options;
    options.coordinator_address = coordinator->cluster_address();
    options.node_id = flags.agent_node_id;
    options.slots = flags.agent_slots;
    options.work_dir = flags.coordinator.state_dir + "/agent";
    options.worker_binary = flags.worker_binary;
    options.memory_tier_dir = flags.agent_memory_tier_dir;
    options.memory_tier_mb = flags.agent_memory_tier_mb;
    options.pass_env = flags.agent_pass_env;
    // The local agent is part of this process: it presents the embedded admin token.
    TY_ASSIGN_OR_RETURN(options.token,
                        rpc::ReadTokenFile(flags.coordinator.state_dir + "/admin.token"));
    if (!flags.coordinator.tls_client_ca_file.empty()) {
      // Mutual TLS: the local agent (and its workers) present the coordinator's own certificate.
      options.tls = rpc::TlsFiles{.ca = flags.coordinator.tls_client_ca_file,
                                  .cert = flags.coordinator.tls_cert_file,
                                  .key = flags.coordinator.tls_key_file};
      // Its memory tier is reached at the host the certificate names: the advertised one.
      options.advertise_host = AdvertisedHost(flags.coordinator, coordinator->address());
    }
    agent = std::thread([options, &stop_agent, &agent_status] {
      agent_status = agent::RunAgent(options, &stop_agent);
      if (!agent_status.ok()) {
        const char byte = 0;  // wakes main: the embedded default is useless without its agent
        [[maybe_unused]] ssize_t ignored = write(signal_pipe[1], &byte, 1);
      }
    });
#else
    return absl::FailedPreconditionError(
        "this build has no agent library; start with --no-local-agent and run trainyard-agent");
#endif
  }

  const int signal_number = WaitForSignal();
  if (signal_number != 0) {
    TY_LOG(INFO) << "received " << strsignal(signal_number) << "; shutting down";
  }
  stop_agent = true;
  if (agent.joinable()) agent.join();
  coordinator->Stop();
  return Annotate(agent_status, "local agent");
}

}  // namespace
}  // namespace trainyard::server

int main(int argc, char** argv) {
  if (argc >= 2 && std::string(argv[1]) == "token") {
    const absl::Status status = trainyard::server::RunTokenCommand(
        std::vector<std::string>(argv + 2, argv + argc), std::cout);
    if (!status.ok()) std::cerr << "trainyard-server token: " << status.message() << std::endl;
    return trainyard::ExitCodeForStatus(status);
  }
  absl::Status status = trainyard::server::Run(argc, argv);
  if (!status.ok()) {
    std::cerr << "trainyard-server: " << status.message() << std::endl;
    return trainyard::ExitCodeForStatus(status);
  }
  return 0;
}
